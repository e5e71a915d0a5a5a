# The board side end to end on CPython (VirtualClock, deterministic): firmware_py.serve
# runs kvrtos-tiny beside the telemetry task; commands go in as the console encodes them,
# the frames come out through the console's decoder; the text is decode.py's, the KV
# bytes fit the layout's slope, the dashboard renders, the trace is valid. And the
# firmware's frames are byte-identical on the three interpreters.
import io
import json
import os
import re

import pytest

from conftest import FIRMWARE_TESTS, ROOT, mp32_or_skip, run_firmware
from firmware_py import decode, serve, telemetry as tm
from firmware_py.clock import VirtualClock
from host import console, dashboard, monitor, trace

TINY = os.path.join(ROOT, "models", "kvrtos-tiny")
MODEL = os.path.join(TINY, "model.bin")
TOK = os.path.join(TINY, "tokenizer.bin")


class Board:
    # a Server on a VirtualClock whose link is a bytearray and whose input is a list of command frames
    def __init__(self, model=MODEL, tokenizer=TOK, **kw):
        self.cap = bytearray()
        self.cmds = []
        self.lines = []
        self.srv = serve.Server(self._write, self._poll, clock=VirtualClock(), model=model, tokenizer=tokenizer,
                                layer_us=2000, out=self.lines.append, **kw)

    def _write(self, buf, n):
        self.cap.extend(bytes(buf[:n]))

    def _poll(self, reader):
        while self.cmds:
            reader.feed(self.cmds.pop(0))

    def send(self, kind, **kw):
        self.cmds.append(console.command(kind, **kw))

    def run(self, us=-1):
        self.srv.run(us)

    def decoded(self):
        d = console.StreamDecoder()
        out = d.feed(bytes(self.cap)) + d.flush()
        return d, [v for k, v in out if k == "frame"]


def events(frames, name=None):
    return [e for f in frames if f["type"] == "event" for e in f["events"] if name is None or e["event"] == name]


def text_of(frames, req=None):
    return "".join(f["text"] for f in frames if f["type"] == "text" and (req is None or f["request"] == req))


@pytest.fixture(scope="module")
def full_run():
    # one request, policy full, 200 tokens (past 12 blocks of 16)
    b = Board(max_requests=1)
    b.send("prompt", text="Once upon a time", tokens=200)
    b.run()
    return b


def test_text_is_decode_pys_and_every_frame_is_good(full_run):
    d, frames = full_run.decoded()
    assert d.corrupt == 0 and d.dropped == 0 and d.good == len(frames)
    s = decode.Session(MODEL, TOK)
    ids = s.encode("Once upon a time")
    pieces = []
    k = serve.Kernel(VirtualClock())
    k.spawn("d", 1, s.task(k, ids, 200, pieces.append))
    k.run()
    want = b"".join(pieces).decode() + "\n"
    assert text_of(frames, 1) == want
    assert [e["event"] for e in events(frames) if e["event"] != "watermark"] == ["ack", "start", "done"]
    done = events(frames, "done")[0]
    assert done["tokens"] == 200 and done["reason_name"] == "done"
    per = [f for f in frames if f["type"] == "periodic"]
    assert per[-1]["core"]["tokens"] == 200
    assert full_run.srv.tm.periodic_max <= 115, full_run.srv.tm.periodic_max
    lay = [f for f in frames if f["type"] == "layout"][-1]["layout"]
    assert lay["task.0"] == "telemetry" and "decode" in lay.values() and lay["kv.dtype"] == "fp32"


def test_kv_bytes_fit_the_layouts_slope(full_run, tmp_path):
    _, frames = full_run.decoded()
    tr, series = trace.build(frames)
    fit = trace.kv_fit(series)
    lay = series["layout"]
    assert fit["points"] >= 10 and fit["tokens_max"] >= 190
    tb = int(lay["kv.token_bytes"])
    assert abs(fit["fitted_bytes_per_token"] - tb) / tb < 0.05, fit  # blocks of 16 tokens: a staircase around the line
    assert fit["kv_bytes_per_token"] == int(lay["kv.kv_bytes_per_token"]) and fit["token_bytes"] == tb
    from host import budget

    calc = budget.compute("esp32s3_n8r8", MODEL, "fp32")
    assert calc["cache_bytes_per_token"] == tb and calc["kv_bytes_per_token"] == fit["kv_bytes_per_token"]


def check_trace(tr):
    # the structure Perfetto / chrome://tracing read
    assert isinstance(tr["traceEvents"], list) and tr["traceEvents"]
    json.loads(json.dumps(tr))
    phases = set()
    for e in tr["traceEvents"]:
        assert isinstance(e["name"], str) and isinstance(e["pid"], int) and e["ph"] in ("M", "X", "C", "i")
        phases.add(e["ph"])
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and isinstance(e["args"]["name"], str)
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and e["dur"] >= 0
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values())
        if e["ph"] == "i":
            assert e["s"] in ("g", "p", "t")
    return phases


def test_trace_and_plots(full_run, tmp_path):
    log = tmp_path / "t.jsonl"
    _, frames = full_run.decoded()
    log.write_text("".join(console.jsonl_line(f) + "\n" for f in frames))
    res = trace.main(str(log), str(tmp_path / "out"), as_json=False)
    tr = json.load(open(res["trace"]))
    assert check_trace(tr) == {"M", "X", "C", "i"}
    names = {e["name"] for e in tr["traceEvents"]}
    assert {"run", "tokens", "pool blocks", "kv seq 0", "request 1", "start", "done"} <= names
    slices = [e for e in tr["traceEvents"] if e["name"] == "run"]
    threads = {e["args"]["name"]: e["tid"] for e in tr["traceEvents"] if e["name"] == "thread_name"}
    assert threads["decode"] in {e["tid"] for e in slices}  # the decode task's track has run slices
    assert all(e["dur"] <= e["args"]["interval_ms"] * 1000 for e in slices)
    for p in res["plots"]:
        assert os.path.getsize(p) > 1000 and open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def _dashboard(st, width, height, counts=None, board_text=()):
    # the dashboard's lines for a terminal of width x height, drawn on a console wider and
    # taller than that (so nothing the console itself crops hides a line that is too long)
    from rich.console import Console

    con = Console(file=io.StringIO(), width=width + 60, height=height + 60, record=True)
    con.print(dashboard.render(st, counts, board_text, width=width, height=height))
    return [ln.rstrip() for ln in con.export_text().rstrip("\n").split("\n")]


def test_dashboard_renders_from_the_frames(full_run):
    _, frames = full_run.decoded()
    st = dashboard.State()
    for f in frames:
        st.update(f)
    out = "\n".join(_dashboard(st, 160, 50, {"good": 5, "corrupt": 1, "dropped": 0, "skipped": 0}, ["board says hi"]))
    for want in ("tasks", "telemetry", "decode", "pool blocks", "KV seq 0", "generated text", "recent events",
                 "done", "Once upon a time", "board says hi", "frames good 5 corrupt 1", "deadlines",
                 "memory and bandwidth"):
        assert want in out, want


def test_the_dashboard_fits_its_terminal_with_what_matters_first(full_run):
    # 80x24 (the size): tok/s, the text's tail, pool and KV, the heap, the worst
    # deadline, the last events and the tasks, in 23 lines of at most 80 columns; at any
    # size it is never taller than the terminal less a line, so its last frame (drawn
    # whole when the monitor ends) keeps the header on the screen
    _, frames = full_run.decoded()
    st = dashboard.State()
    for f in frames:
        st.update(f)
    counts = {"good": 5, "corrupt": 0, "dropped": 0, "skipped": 0}
    small = _dashboard(st, 80, 24, counts, ["board says hi"])
    assert len(small) <= 23 and max(len(x) for x in small) <= 80, small
    text = "\n".join(small)
    assert small[0].startswith("kvrtos telemetry") and "tok/s" in small[0]
    for want in ("pool blocks", "KV seq 0", "deadlines:", "generated text", "recent events",
                 "done", "tasks", "decode"):
        assert want in text, (want, text)
    assert st.text.rstrip()[-20:].split()[-1] in text  # the newest text, not the oldest
    for w in (20, 40, 60, 79, 100, 119, 120, 160, 240):
        for h in (2, 3, 5, 8, 12, 24, 50, 80):
            lines = _dashboard(st, w, h, counts, ["a board line " * 12] * 6)
            assert len(lines) <= max(1, h - 1) and max(len(x) for x in lines) <= w, (w, h, lines)
            assert "kvrtos telemetry"[:w - 1] in lines[0], (w, h)
    # the heap (a board's: CPython's is not measured) is shown at every width, the two-column
    # layout's narrower right column too (it was cropped off between 120 and 159 columns)
    st.heap = {"free": 1234567, "alloc": 7777777 - 1234567}
    st.heap_least = 1200000
    for w in (80, 100, 120, 140, 160):
        text = "\n".join(_dashboard(st, w, 24, counts))
        assert "heap free 1,234,567 of 7,777,777 B" in text and "least free 1,200,000 B" in text, (w, text)
        assert "longest slice" in text and "deadlines:" in text, (w, text)
    # every task row shows before more of the text does: a long text no longer pushes the
    # tasks off (80x24 with the 2,000-character text buffer full)
    long = dashboard.State()
    for f in frames:
        long.update(f)
    long.text = ("Once upon a time there was a long story. " * 60)[-long.text_chars:]
    text = "\n".join(_dashboard(long, 80, 24, counts))
    assert all(t["name"] in text for t in long.tasks.values()) and "a long story" in text, text
    # before any frame: something to look at, still within the size
    empty = _dashboard(dashboard.State(), 80, 24)
    assert 1 < len(empty) <= 23 and "(no text yet)" in "\n".join(empty)


def test_attaching_to_a_running_serve_asks_for_its_layout():
    # the console attached after the boot's layout went by showed task0..task5 and "pool
    # n/?": at its first good frame it now asks serve for the layout (once), and the names
    # come back
    b = Board(max_requests=0)
    b.send("prompt", text="Once upon a time", tokens=400)
    b.run(400000)  # the boot's layout, and the one the request's tasks made, went out in the first 200 ms
    cut = len(b.cap)
    b.run(400000)

    class Port:
        in_waiting = 0
        written = b""

        def write(self, data):
            self.written += data
            b.cmds.append(data)

        def flush(self):
            pass

    m = monitor.Monitor("fake", out=io.StringIO(), view="quiet")
    m.ser = Port()
    m.feed(bytes(b.cap[cut:]))
    assert "task.0" not in m.state.layout and m.state.tasks  # the boot's layout (or its first part) went by
    assert all(t["name"].startswith("task") for t in m.state.tasks.values())
    assert m.ser.written.count(b"\x00") == 2  # one command frame, the layout request
    sent = len(m.ser.written)
    cut = len(b.cap)
    b.run(400000)
    m.feed(bytes(b.cap[cut:]))
    assert len(m.ser.written) == sent  # asked once
    assert "task.0" in m.state.layout and m.state.layout.get("pool.blocks")
    names = {t["name"] for t in m.state.tasks.values()}
    assert "decode" in names and not any(n.startswith("task") and n[4:].isdigit() for n in names), names


def test_the_link_budget_is_what_the_docs_say(tmp_path, monkeypatch):
    # docs/telemetry.md's link budget: the share of a 115,200-baud link each frame type
    # took in one request of 200 tokens (deterministic: a VirtualClock), recomputed from
    # the wire bytes; the periodic frames within share_pct; all of it within the link. The
    # model and tokenizer by the names a board's filesystem gives them (the layout names
    # the model file: an absolute path made its length the checkout's). And below the
    # 64-byte floor the layout's frame_max is the floor, as the page says
    import collections
    import shutil

    shutil.copy(MODEL, tmp_path / decode.MODEL_FILE)
    shutil.copy(TOK, tmp_path / decode.TOKENIZER_FILE)
    monkeypatch.chdir(tmp_path)
    b = Board(max_requests=1, model=decode.MODEL_FILE, tokenizer=decode.TOKENIZER_FILE)
    b.send("prompt", text="Once upon a time", tokens=200)
    b.run()
    data = bytes(b.cap)
    _, frames = b.decoded()
    secs = (frames[-1]["ms"] - frames[0]["ms"]) / 1000.0
    names = {tm.T_LAYOUT: "layout", tm.T_PERIODIC: "periodic", tm.T_TEXT: "text", tm.T_EVENT: "event"}
    wire = collections.Counter()
    for run in data.split(b"\x00"):
        if run:
            wire[names[console.cobs_decode(run)[2]]] += len(run) + 2  # the frame's two delimiters
    assert sum(wire.values()) == len(data)  # nothing but frames on this link
    link = tm.DEFAULT_LINK_BPS * secs
    rows = {k: (v, "%.1f %%" % (100.0 * v / link)) for k, v in wire.items()}
    rows["all"] = (len(data), "%.1f %%" % (100.0 * len(data) / link))
    assert wire["periodic"] <= link * tm.DEFAULT_SHARE_PCT / 100 and len(data) <= link
    page = open(os.path.join(ROOT, "docs", "telemetry.md"), encoding="utf-8").read()
    table = page.split("<!-- link-budget -->")[1].split("<!-- /link-budget -->")[0]
    got = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1][:1].isdigit():
            got[cells[0].split(" (")[0]] = (int(cells[1].replace(",", "")), cells[2])
    assert got == rows, (got, rows)
    assert "(3: at boot" in table and sum(1 for f in frames if f["type"] == "layout") == 3 * 2  # 3 layouts of 2 parts
    t = tm.Telemetry(lambda b, n: None, clock=VirtualClock(), heap=False, link_bps=2000)
    assert t.frame_max == tm.MIN_FRAME == 64 and 2000 * tm.DEFAULT_SHARE_PCT // 100 // tm.DEFAULT_RATE_HZ == 20
    assert "`--link-bps 2000` and 10 Hz the layout says `frame_max=64`" in page and "640 B/s, 32 %" in page


def test_monitor_replays_a_capture_with_the_dashboard(full_run, tmp_path):
    cap = tmp_path / "c.bin"
    cap.write_bytes(bytes(full_run.cap))
    buf = io.StringIO()
    m = monitor.Monitor(str(cap), out=buf, view="dashboard", jsonl_path=str(tmp_path / "r.jsonl"))
    m.replay(str(cap))
    m.close()
    out = buf.getvalue()
    assert "tasks" in out and "generated text" in out and "Once upon a time" in out
    s = m.summary()
    assert s["frames"]["good"] > 30 and s["frames"]["corrupt"] == 0 and s["requests_done"] == 1
    assert len(open(tmp_path / "r.jsonl").read().splitlines()) == s["frames"]["good"]


def test_config_stop_refusals_and_a_second_request():
    b = Board(max_requests=0)
    b.send("config", policy="window", window=48, kv_dtype="int8")
    b.send("prompt", text="Once upon a time", tokens=500)
    b.run(2000000)  # 2 s of board time: the request is running
    b.send("prompt", text="Another", tokens=5)  # refused: one is running
    b.send("config", policy="nope")  # refused: bad value
    b.run(500000)
    b.send("stop")
    b.run(500000)
    b.send("prompt", text="The cat", tokens=30)  # the same options: the session is reused
    b.send("layout")
    b.run(5000000)
    d, frames = b.decoded()
    assert d.corrupt == 0
    acks = [(e["type"], e["status"]) for e in events(frames, "ack")]
    assert acks == [(tm.T_CMD_CONFIG, 0), (tm.T_CMD_PROMPT, 0), (tm.T_CMD_PROMPT, -6), (tm.T_CMD_CONFIG, -5),
                    (tm.T_CMD_STOP, 0), (tm.T_CMD_PROMPT, 0), (tm.T_CMD_LAYOUT, 0)]
    assert any("config refused" in ln for ln in b.lines)
    done = events(frames, "done")
    assert [(e["request"], e["reason_name"]) for e in done] == [(1, "stopped"), (2, "done")]
    assert done[1]["tokens"] == 30
    assert events(frames, "refused") and events(frames, "evict")  # the window ring evicted past 48
    lay = [f["layout"] for f in frames if f["type"] == "layout"][-1]
    assert lay["kv.dtype"] == "int8" and lay["kv.policy"] == "window"
    seqs = [r for f in frames if f["type"] == "periodic" for r in f.get("seqs", [])]
    assert max(r["cached"] for r in seqs) == 48 and max(r["cap"] for r in seqs) == 48
    assert text_of(frames, 2).startswith("The cat")


def test_the_firmware_frames_are_the_same_bytes_on_every_interpreter():
    script = os.path.join(FIRMWARE_TESTS, "fw_telemetry.py")
    digests = {}
    interps = ["micropython", "cpython"]
    try:
        mp32_or_skip()
        interps.append("micropython32")
    except pytest.skip.Exception:
        pass
    for interp in interps:
        r = run_firmware(script, interp)
        assert r.returncode == 0, r.stdout + r.stderr
        digests[interp] = re.search(r"^digest (\w+ \d+)$", r.stdout, re.M).group(1)
    assert len(set(digests.values())) == 1, digests


def test_bench_pieces_run_small(tmp_path):
    # ./kv bench telemetry's parts at a small size: the MicroPython side-by-side runs (a
    # q8row copy of kvrtos-tiny), frames with every source within the budget, the section renders
    from host import convert, interp, paths
    from host.bench import telemetry as bt

    q8 = tmp_path / "model.bin"
    convert.convert(MODEL, str(q8), "q8row")
    r = interp.run(os.path.join(paths.ROOT, "host", "bench", "_telemetry_mp.py"), "micropython",
                   args=[str(q8), TOK, "20", "1", "2"], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    assert m["backend"] == "q8" and len(m["on_us"]) == len(m["off_us"]) == 2 and m["tick_us"] > 0
    assert m["frame_bytes_max"] <= 115 and m["decode_run_us"] > 0
    mean, mx, n = bt.all_sources_frames(seconds=3)
    assert n >= 25 and mx <= 115 and mean > 60



def test_a_hot_board_shrinks_the_next_budget_and_slows_decode():
    # the thermal guard in serve: a die that starts at 90 C (above both thresholds) makes the
    # request open with half its window, decode sleep as long as each token took, and the
    # state change travel as a thermal event; a cool board changes nothing
    from firmware_py import thermal

    def hot(k):
        return thermal.Guard(k, thermal.ModelTemp(k.clock, ambient_c=25, rise_c=0, tau_us=10 ** 9, start_c=90),
                             period_us=100000)

    runs = {}
    for name, guard in (("cool", None), ("hot", hot)):
        b = Board(max_requests=1, guard=guard)
        b.send("config", policy="window", window=48)
        b.send("prompt", text="Once upon a time", tokens=40)
        b.run()
        d, frames = b.decoded()
        assert d.corrupt == 0
        s = b.srv.session
        runs[name] = (s, frames, s.t_end - s.t_start)
    cool, hot_ = runs["cool"], runs["hot"]
    assert cool[0].cache.layout and cool[0].thermal is None and cool[0].thermal_pauses == 0
    caps = [r["cap"] for f in hot_[1] if f["type"] == "periodic" for r in f.get("seqs", [])]
    assert caps and max(caps) == 24, "the window of 48 opened as 24 on the hot board"
    assert hot_[0].thermal_pauses == 40 and hot_[0].thermal_pause_us > 0
    assert hot_[2] > 1.8 * cool[2], "every token's time slept again: about twice as long"
    temps = [f["temp"] for f in hot_[1] if f["type"] == "periodic" and "temp" in f]
    assert temps and all(t["state"] == thermal.SLOW and t["deci_c"] >= 850 for t in temps), "the frames say hot"
    assert text_of(hot_[1], 1)[:16] == text_of(cool[1], 1)[:16] == "Once upon a time"


# --- Ctrl-C ends serve --------------------------------------------------------------------

def test_the_stdin_poller_feeds_commands_and_raises_keyboardinterrupt_at_ctrl_c(monkeypatch):
    # the bytes before a 0x03 reach the command reader; the 0x03 raises KeyboardInterrupt;
    # the bytes after it stay on stdin (for the REPL: mpremote's \r\x03 ... \r\x01)
    import sys

    r, w = os.pipe()
    stdin = os.fdopen(r, "r")
    monkeypatch.setattr(sys, "stdin", stdin)
    try:
        got = []
        reader = tm.CommandReader(lambda ftype, body, seq: got.append((ftype, seq)))
        poll = serve.stdin_poller()
        assert poll is not None
        os.write(w, console.command("layout", seq=7) + console.command("stop", seq=8))
        poll(reader)
        assert got == [(tm.T_CMD_LAYOUT, 7), (tm.T_CMD_STOP, 8)]  # every byte read, none held in a buffer
        os.write(w, console.command("layout", seq=9) + b"\r\x03\r\x01")
        with pytest.raises(KeyboardInterrupt):
            poll(reader)
        assert got[-1] == (tm.T_CMD_LAYOUT, 9)
        assert os.read(r, 16) == b"\r\x01"
    finally:
        os.close(w)
        stdin.close()


def test_no_command_frame_holds_a_ctrl_c():
    # the framing serve reads: hex digits between 0x00 bytes, whatever the body
    for kind, kw in (("prompt", {"text": "\x03\x03 Once", "tokens": 3}), ("stop", {}), ("layout", {}),
                     ("config", {"policy": "window", "window": 3, "kv_dtype": "int4tok"})):
        for seq in (3, 0x0303, 0xFFFF):
            assert b"\x03" not in console.command(kind, seq=seq, **kw), (kind, seq)


@pytest.mark.parametrize("interp", ["micropython", "cpython"])
def test_serve_main_answers_commands_then_ends_on_ctrl_c(interp, tmp_path):
    # serve.main() as a board runs it (stdin: the console, stdout: frames and lines) acks a
    # command, then a 0x03 ends it within a poll: one line, KeyboardInterrupt to the caller
    import subprocess
    import threading
    import time

    from host import interp as interp_mod

    script = tmp_path / "serve_main.py"
    script.write_text("from firmware_py import serve\nserve.main()\n")
    cmd, env = interp_mod.command(str(script), interp)
    env["PYTHONUNBUFFERED"] = "1"
    p = subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    out = bytearray()
    th = threading.Thread(target=lambda: [out.extend(c) for c in iter(lambda: os.read(p.stdout.fileno(), 4096), b"")],
                          daemon=True)
    th.start()

    def wait(pred, s=30):
        end = time.monotonic() + s
        while not pred() and time.monotonic() < end:
            time.sleep(0.05)
        return pred()

    def acks():
        d = console.StreamDecoder()
        frames = [v for k, v in d.feed(bytes(out)) if k == "frame"]
        return events(frames, "ack")

    try:
        assert wait(lambda: b"waiting for commands" in out), bytes(out)[-500:]
        p.stdin.write(console.command("layout", seq=1))
        p.stdin.flush()
        assert wait(lambda: acks()), bytes(out)[-500:]
        t0 = time.monotonic()
        p.stdin.write(b"\r\x03")
        p.stdin.flush()
        p.wait(timeout=20)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        th.join(5)
    text = bytes(out).decode("utf-8", "replace")
    assert acks()[0]["type"] == tm.T_CMD_LAYOUT and acks()[0]["status"] == 0, acks()
    assert "serve: stopped by Ctrl-C after 0 requests" in text and "KeyboardInterrupt" in text, text[-500:]
    assert p.returncode != 0 and took < 10, (p.returncode, took)


@pytest.mark.vboard
def test_flash_monitor_start_and_generate_work_right_after_a_serve_session(tmp_path):
    # `monitor --start ... --until-done 1` leaves serve running on the virtual board; each
    # tool that needs the raw REPL interrupts it with Ctrl-C and works at once (before the
    # fix serve read the 0x03 as a command byte: flash said "no raw REPL prompt")
    import time

    from vboard_util import kv, start

    with start(tmp_path) as vb:
        r = kv("flash", "--port", vb.port, "--model", MODEL, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        mon = ("monitor", "--port", vb.port, "--start", "--prompt", "hi", "--tokens", "10", "--until-done", "1", "--plain",
               "--timeout", "120")
        r = kv(*mon, timeout=180)
        assert r.returncode == 0 and "started firmware_py.serve" in r.stdout, r.stdout + r.stderr
        t0 = time.monotonic()
        r = kv("flash", "--port", vb.port, timeout=120)
        assert r.returncode == 0 and "flash: soft reset" in r.stdout, r.stdout + r.stderr
        assert time.monotonic() - t0 < 60
        r = kv(*mon, timeout=180)  # serve again, then again over the one left running
        assert r.returncode == 0, r.stdout + r.stderr
        r = kv(*mon, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        r = kv("generate", "--runtime", "board", "--port", vb.port, "--tokens", "5", timeout=180)
        assert r.returncode == 0 and r.stdout.startswith("Once upon a time"), r.stdout + r.stderr
        assert "\n" + decode.SUMMARY in r.stdout and "(1 prompt + 5 new)" in r.stdout, r.stdout


def test_generate_on_a_board_that_ignores_ctrl_c_says_what_to_do(monkeypatch):
    # a port where nothing answers the raw REPL's Ctrl-C / Ctrl-A (a firmware that ignores
    # the interrupt): two short tries, then one line that names a fix that exists (generate
    # has no --timeout option)
    import pty
    import threading
    import time
    import tty

    from host import boardrun
    from host.errors import UserError

    master, slave = pty.openpty()
    tty.setraw(slave)
    stop = []

    def drain():
        import select

        while not stop:
            if select.select([master], [], [], 0.05)[0]:
                try:
                    os.read(master, 4096)
                except OSError:
                    return

    th = threading.Thread(target=drain, daemon=True)
    th.start()
    monkeypatch.setattr(boardrun, "CONNECT_S", 1.0)
    port = os.ttyname(slave)
    t0 = time.monotonic()
    try:
        with pytest.raises(UserError) as e:
            boardrun.run(port, MODEL, TOK, "hi", 1, {}, out=io.BytesIO())
    finally:
        stop.append(1)
        th.join(2)
        os.close(master)
        os.close(slave)
    msg = str(e.value)
    assert "--timeout" not in msg and "\n" not in msg, msg
    assert msg.startswith("no MicroPython raw REPL on %s: no prompt within 1 s, twice" % port), msg
    assert "reset it" in msg and "./kv vboard --stop" in msg, msg
    assert time.monotonic() - t0 < 15


# --- a layout longer than one frame -----------------------------------------------------

EXAMPLE = os.path.join(ROOT, "examples", "user-task")


def named_everywhere(frames):
    # every record row and event of the frames decodes with the firmware's field names
    # (a layout line cut mid-way named them field_2, field_3 ... or "uti")
    kinds = set()
    for f in frames:
        if f["type"] == "periodic":
            for key, val in f.items():
                rows = val if isinstance(val, list) else [val] if isinstance(val, dict) else []
                for row in rows:
                    name = key[:-1] if isinstance(val, list) else key
                    want = dict(tm.RECORDS.values())[name]
                    assert tuple(row) == want[:len(row)] and len(row) == len(want), (name, row)
                    kinds.add(name)
        if f["type"] == "event":
            for e in f["events"]:
                assert not any(k.startswith("arg_") for k in e), e
    return kinds


def test_a_layout_with_every_record_is_sent_whole_in_parts_and_decoded_with_every_field_named():
    # serve with the user guide's config: its tasks, the bandwidth tracker (three tiers, six
    # categories), DMA, the thermal guard, a pool and a KV cache: a layout of ~1.5 kB
    import sys

    import telemetry_indep as indep
    from firmware_py import appcfg, board, thermal

    def guard(k):  # a die at 70 C: the guard's "shrink" state, rows every few frames
        return thermal.Guard(k, thermal.ModelTemp(k.clock, ambient_c=25, rise_c=0, tau_us=10 ** 9, start_c=70),
                             period_us=100000)

    with open(os.path.join(EXAMPLE, "kvrtos.json")) as f:
        app = appcfg.load(f.read())
    sys.path.insert(0, EXAMPLE)
    try:
        cap = bytearray()
        srv = serve.Server(lambda buf, n: cap.extend(bytes(buf[:n])), None, clock=VirtualClock(), model=MODEL,
                           tokenizer=TOK, layer_us=2000, out=lambda s: None, app=app, max_requests=1, guard=guard,
                           board=board.load(os.path.join(ROOT, "boards", "esp32s3_n8r8.json")), **serve.config_opts(app))
        assert srv.start("Once upon a time", 24) == 0
        srv.run()
    finally:
        sys.path.remove(EXAMPLE)
        sys.modules.pop("meter", None)
    body = srv.tm.layout_body()
    assert len(body) > tm.MAX_PAYLOAD  # the case that was cut at 1,024 bytes
    want = console.layout_items(body)
    assert "omitted" not in want and want["rec.8"] == "tier:tier,util_permille,kb,waits"
    assert {"task.0", "tier.2", "cat.5", "dma.slots", "pool.blocks", "kv.dtype", "rec.10", "ev.11"} <= set(want)
    d = console.StreamDecoder(keep_raw=True)
    out = d.feed(bytes(cap)) + d.flush()
    frames = [v for k, v in out if k == "frame"]
    assert d.corrupt == 0 and d.dropped == 0 and d.body_errors == 0
    kinds = named_everywhere(frames)
    assert {"core", "pool", "seq", "task", "tier", "bwcat", "dma", "temp", "kernel"} <= kinds, kinds
    lays = [f for f in frames if f["type"] == "layout"]
    assert all(len(bytes.fromhex(f["raw_body"])) <= tm.MAX_PAYLOAD - tm.HDR for f in lays)
    last = lays[-1]
    n = last["part"][1]
    assert n >= 2 and last["part"] == [n, n]
    # the parts hold whole lines: together exactly the layout's lines, each once
    parts = [bytes.fromhex(f["raw_body"]).split(b"\n") for f in lays[-n:]]
    assert [p[0] for p in parts] == [b"part=%d/%d" % (i + 1, n) for i in range(n)]
    assert b"\n".join(ln for p in parts for ln in p[1:]) == body
    assert {k: v for k, v in last["layout"].items() if k != "part"} == want  # assembled whole
    assert d.layout == last["layout"]
    tiers = [r for f in frames if f["type"] == "periodic" for r in f.get("tiers", ())]
    assert tiers and max(r["kb"] for r in tiers) > 0
    # the dashboard's state shows tier MB/s from the named rows, and names every task
    st = dashboard.State()
    for f in frames:
        st.update(f)
    assert {st.name("task", i) for i in range(8)} >= {"telemetry", "decode", "mic", "meter", "thermal"}
    # the spec-only decoder assembles the same layout from the same stream
    text, iframes, bad, _ = indep.decode(bytes(cap))
    done, ilay = indep.layouts(iframes)[-1]
    assert done and not bad and ilay == last["layout"]


def test_layout_parts_wait_for_the_link_credit_and_come_whole_between_other_frames():
    # a slow link: the credit covers one part per tick at most; the parts go out in order
    # at the next ticks, a new layout starts again at part 1, nothing is ever cut
    cap = bytearray()
    clk = VirtualClock()
    meta = {"m.%02d" % i: "v" * 60 for i in range(40)}  # ~2.7 kB of meta lines: 3 parts or more
    t = tm.Telemetry(lambda b, n: cap.extend(bytes(b[:n])), clock=clk, heap=False, link_bps=1200, meta=meta)
    for _ in range(60):
        clk.charge(100000)
        t.tick()
    t.request_layout()
    for _ in range(60):
        clk.charge(100000)
        t.tick()
    d = console.StreamDecoder()
    frames = [v for k, v in d.feed(bytes(cap)) + d.flush() if k == "frame"]
    assert d.corrupt == 0 and d.dropped == 0
    types = [f["type"] for f in frames]
    lays = [f for f in frames if f["type"] == "layout"]
    n = t.lay_parts
    assert n >= 3 and [f["part"] for f in lays] == [[i + 1, n] for i in range(n)] * 2
    first_done = types.index("layout", types.index("layout", types.index("layout") + 1) + 1)
    assert "periodic" in types[types.index("layout"):first_done]  # other frames came between the parts
    want = console.layout_items(t.layout_body())
    for f in (lays[n - 1], lays[-1]):
        assert {k: v for k, v in f["layout"].items() if k != "part"} == want
    assert t.layouts == 2 * n


def test_a_layout_line_too_long_for_any_frame_is_left_out_and_counted_never_cut():
    cap = bytearray()
    t = tm.Telemetry(lambda b, n: cap.extend(bytes(b[:n])), clock=VirtualClock(), heap=False,
                     meta={"big": "x" * 2000, "two": "a\nb", "small": "ok"})
    t.send_layout()
    d = console.StreamDecoder()
    frames = [v for k, v in d.feed(bytes(cap)) + d.flush() if k == "frame"]
    lay = frames[-1]["layout"]
    assert lay["omitted"] == "2" and lay["small"] == "ok" and "big" not in lay and "two" not in lay
    assert lay["rec.10"] == "dma:depth,max_depth,in_flight,stalls,full"
    assert tm.LAYOUT_ROOM == tm.MAX_PAYLOAD - tm.HDR - tm.PART_LINE
    assert len("part=%d/%d\n" % (99999, 99999)) == tm.PART_LINE
