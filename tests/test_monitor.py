# kv monitor keeps logging, in order and with nothing lost, across soft resets of the
# board and a restart of the virtual board (its port disappears and comes back): the
# text log, and the telemetry frames (JSONL log, raw capture, counts) the board's real
# encoder streams between its text lines.
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from vboard_util import fs_path, kv, one_line_error, send, start, wait_for

vboard = pytest.mark.vboard

# main.py counts its boots in a file and soft-resets itself (sys.exit) twice
MAIN = """
import sys
try:
    n = int(open('boots').read())
except OSError:
    n = 0
n += 1
f = open('boots', 'w'); f.write(str(n)); f.close()
print('boot %d' % n)
print('partial-no-newline-' + str(n), end='')
if n % 3:
    sys.exit()
"""


def mpremote_exec(port, code):
    from host import paths

    subprocess.run([paths.tool("mpremote"), "connect", port, "exec", code], check=True, capture_output=True, timeout=60)


def read_log(p):
    return open(p).read() if os.path.exists(p) else ""


@vboard
def test_monitor_logs_across_soft_reset_and_board_restart(tmp_path):
    log = tmp_path / "serial.log"
    vb = start(tmp_path)
    mpremote_exec(vb.port, "pass")  # the board has booted (without a main.py)
    with open(fs_path(tmp_path, "main.py"), "w") as f:
        f.write(MAIN)
    mon = subprocess.Popen(
        [sys.executable, "-m", "invoke", "monitor", "--port", vb.port, "--log", str(log)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert wait_for(lambda: "connected to" in read_log(log), 20), read_log(log)
        # soft reset at the REPL: boots 1..3 (two of them reset themselves)
        send(vb.port, b"\r\x04")  # ctrl-D at the friendly REPL
        assert wait_for(lambda: "boot 3" in read_log(log), 20), read_log(log)
        # the virtual board goes away and comes back on the same port path
        vb.stop()
        assert wait_for(lambda: "lost" in read_log(log), 10), read_log(log)
        # it boots (4, 5, 6) while the monitor is still finding it: nothing printed is lost
        vb = start(tmp_path)
        assert wait_for(lambda: "reconnected" in read_log(log), 20), read_log(log)
        assert wait_for(lambda: "boot 6" in read_log(log), 20), read_log(log)
    finally:
        mon.terminate()
        mon.wait(timeout=10)
        vb.stop()
    text = read_log(log)
    # every boot line, in order, each timestamped
    idx = [text.index("boot %d" % i) for i in range(1, 7)]
    assert idx == sorted(idx), text
    assert text.index("lost") < idx[3] and text.index("lost") < text.index("reconnected")
    for line in text.splitlines():
        assert line.startswith("[") and line[13] == "]", line
    # the partial line printed before each reset was not lost
    for i in range(1, 7):
        assert "partial-no-newline-%d" % i in text, text


@vboard
def test_monitor_until_stops_at_the_line(tmp_path):
    log = tmp_path / "m.log"
    with start(tmp_path) as vb:
        mpremote_exec(vb.port, "pass")
        with open(fs_path(tmp_path, "main.py"), "w") as f:
            f.write("print('hello from main')\nprint('after hello')\n")
        mon = subprocess.Popen(
            [sys.executable, "-m", "invoke", "monitor", "--port", vb.port, "--log", str(log), "--until", "hello from", "--timeout", "30"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert wait_for(lambda: "connected to" in read_log(log), 20), read_log(log)
        send(vb.port, b"\r\x02\x04")
        out, err = mon.communicate(timeout=30)
    assert mon.returncode == 0 and "hello from main" in out, out + err
    assert "after hello" not in out


@vboard
def test_monitor_started_after_flash_sees_the_boot_report(tmp_path):
    from firmware_py.app import REPORT_END

    with start(tmp_path) as vb:
        r = kv("flash", "--port", vb.port)
        assert r.returncode == 0, r.stderr
        r = kv("monitor", "--port", vb.port, "--until", REPORT_END, "--timeout", "20")
    assert r.returncode == 0 and "kvrtos: boot report" in r.stdout and REPORT_END in r.stdout, r.stdout + r.stderr


@vboard
def test_monitor_missing_port_is_one_line():
    r = kv("monitor", "--port", "/dev/no-such-port")
    assert one_line_error(r) and r.returncode == 2 and "no serial port" in r.stderr, r.stderr


@vboard
def test_telemetry_end_to_end_on_the_virtual_board(tmp_path):
    # the virtual board flashed with the firmware and kvrtos-tiny: `monitor --start`
    # runs firmware_py.serve on it, sends a prompt; the frames stream while the model
    # generates, the console decodes them (no corrupt frame), the text is what CPython
    # generates, the capture replays to the same frames, the trace is valid and the KV
    # bytes fit the layout's bytes per token
    import json

    from test_telemetry import check_trace

    model = os.path.join(ROOT, "models", "kvrtos-tiny", "model.bin")
    jl, cap, out = tmp_path / "t.jsonl", tmp_path / "c.bin", tmp_path / "trace"
    with start(tmp_path) as vb:
        # fp32 as the host's generate below decodes it (flash --model would put int8 there)
        r = kv("flash", "--port", vb.port, "--model", model, "--weights", "fp32", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        r = kv("monitor", "--port", vb.port, "--start", "--prompt", "Once upon a time", "--tokens", "80", "--until-done", "1",
               "--timeout", "240", "--jsonl", str(jl), "--capture", str(cap), "--json", "--link-bps", "200000", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(r.stdout)
    f = s["frames"]
    assert f["good"] > 20 and f["corrupt"] == 0 and f["dropped"] == 0 and s["requests_done"] == 1, s
    assert s["frames_by_type"]["periodic"] > 5 and s["frames_by_type"]["text"] > 0 and s["tokens"] == 80, s
    frames = [json.loads(ln) for ln in open(jl)]
    assert len(frames) == f["good"]
    text = "".join(fr["text"] for fr in frames if fr["type"] == "text")
    host = kv("generate", "--model", model, "--prompt", "Once upon a time", "--tokens", "80")
    assert host.returncode == 0 and text.strip() == host.stdout.splitlines()[0].strip(), (text, host.stdout)
    lay = [fr["layout"] for fr in frames if fr["type"] == "layout"][-1]
    assert lay["task.0"] == "telemetry" and "heap" in {k for fr in frames for k in fr}, lay
    assert lay["cpu.mhz"] == "n/a", lay  # the clock the board runs at: the unix port has no machine.freq
    rep = kv("monitor", "--replay", str(cap), "--json")
    assert rep.returncode == 0 and json.loads(rep.stdout)["frames"]["good"] == f["good"], rep.stdout + rep.stderr
    tr = kv("trace", str(jl), "--out", str(out), "--json")
    assert tr.returncode == 0, tr.stdout + tr.stderr
    res = json.loads(tr.stdout)
    check_trace(json.load(open(res["trace"])))
    fit = res["kv_fit"]
    assert fit and abs(fit["fitted_bytes_per_token"] - fit["token_bytes"]) / fit["token_bytes"] < 0.08, fit
    assert fit["token_bytes"] == int(lay["kv.token_bytes"])


@vboard
def test_monitor_and_trace_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text("not json\n")
    for args, code in ((("monitor", "--replay", str(tmp_path / "none.bin")), 2),
                       (("monitor", "--replay", str(bad), "--port", "/dev/null"), 2),
                       (("monitor", "--port", "/dev/null", "--policy", "nope"), 2),
                       (("monitor", "--port", "/dev/null", "--tokens", "0"), 2),
                       (("monitor", "--port", "/dev/null", "--jsonl", str(tmp_path)), 2),
                       (("trace", str(tmp_path / "none.jsonl")), 2),
                       (("trace", str(bad)), 2),
                       (("trace", str(bad), "--out", str(bad)), 2)):
        r = kv(*args)
        assert one_line_error(r) and r.returncode == code, (args, r.returncode, r.stderr)


# main.py for the frame test: the firmware's own telemetry encoder (firmware_py.telemetry
# on the board's MicroPython) streams, every 20 ms, a text frame "bN tI" and a periodic
# frame, then prints the text line "bN line I seq S" (S: the last frame written; the
# first tick also sends the boot layout, seq 0, which names the boot). Boots 1 and 2
# stream until stopped; boot 3 stops after 40 ticks and prints "b3 end".
MAIN_FRAMES = """
import sys
import time
from firmware_py import telemetry as tm
from firmware_py.clock import RealClock
try:
    n = int(open('boots').read())
except OSError:
    n = 0
n += 1
f = open('boots', 'w'); f.write(str(n)); f.close()
print('boot %d' % n)
t = tm.Telemetry(tm.stream_writer(sys.stdout.buffer), clock=RealClock(), link_bps=1000000, rate_hz=50, meta={'boot': n})
t.request = n
i = 0
while n < 3 or i < 40:
    t.text(('b%d t%d\\n' % (n, i)).encode())
    t.tick()
    print('b%d line %d seq %d' % (n, i, t.seq - 1))
    i += 1
    time.sleep_ms(20)
print('b%d end' % n)
"""
_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\.\d{3}\] (.*)$")
_PARTIAL = re.compile(r" \[partial line: [^\]]*\]$")


def board_text(log_text):
    # the board's text as the text log holds it: timestamps and the monitor's own notes
    # taken out, a partial line (flushed at a port loss) joined to what followed it
    out = []
    for line in log_text.splitlines():
        m = _LINE.match(line)
        assert m, line  # every line timestamped
        body = m.group(1)
        if body.startswith("[monitor] "):
            continue
        p = _PARTIAL.search(body)
        out.append(body[:p.start()] if p else body + "\n")
    return "".join(out)


def capture_items(data):
    # the capture split the way docs/telemetry.md says (tests/telemetry_indep.py's
    # rules): [("frame", (type, seq, ms)) | ("bad", why)] in stream order
    import telemetry_indep as ind

    runs = data.split(b"\x00")
    items = []
    for k, run in enumerate(runs[1:], 1):
        if len(run) >= 2 and run[1] == ind.MAGIC:
            why, f = ind.check(run) if k < len(runs) - 1 else ("truncated", None)
            items.append(("bad", why) if f is None else ("frame", f[:3]))
    return items


def is_subsequence(small, big):
    it = iter(big)
    return all(c in it for c in small)


@vboard
def test_monitor_frames_survive_soft_reset_and_port_return(tmp_path):
    # the board streams frames and text; the monitor (--log, --jsonl, --capture, --json)
    # sees a soft reset mid-stream (Ctrl-C, Ctrl-D) and the board's port vanish and
    # return (the virtual board stopped and started again on the same path). Every frame
    # received is in the JSONL log, in order; each boot's frames are all there from its
    # layout (seq 0) to the last one sent (none missing before a text line that names
    # it); a candidate refused can only be a frame cut by a reset (the last candidate
    # before a boot layout); the counts: no frame dropped, 2 restarts; the capture
    # replays to the same frames and counts; the text log holds every text line
    from firmware_py import telemetry as tm

    log, jl, cap, jl2 = tmp_path / "serial.log", tmp_path / "f.jsonl", tmp_path / "cap.bin", tmp_path / "replay.jsonl"
    vb = start(tmp_path)
    mpremote_exec(vb.port, "pass")  # booted, without a main.py yet
    os.makedirs(fs_path(tmp_path, "firmware_py"))
    for name in ("__init__.py", "compat.py", "status.py", "clock.py", "telemetry.py"):  # the encoder, as source
        shutil.copy(os.path.join(ROOT, "firmware_py", name), fs_path(tmp_path, "firmware_py/" + name))
    with open(fs_path(tmp_path, "main.py"), "w") as f:
        f.write(MAIN_FRAMES)
    mon = subprocess.Popen(
        [sys.executable, "-m", "invoke", "monitor", "--port", vb.port, "--log", str(log), "--jsonl", str(jl),
         "--capture", str(cap), "--json", "--until", "^b3 end$", "--timeout", "120"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert wait_for(lambda: "connected to" in read_log(log), 20), read_log(log)
        send(vb.port, b"\r\x02\x04")  # soft reset at the REPL: boot 1 streams
        assert wait_for(lambda: "b1 line 25 " in read_log(log), 20), read_log(log)
        # (1) soft reset mid-stream: Ctrl-C stops main.py, Ctrl-D at the REPL resets: boot 2
        send(vb.port, b"\x03")
        wait_for(lambda: "KeyboardInterrupt" in read_log(log), 5)  # (a frame cut by Ctrl-C may swallow it)
        send(vb.port, b"\x04")
        assert wait_for(lambda: "b2 line 25 " in read_log(log), 20), read_log(log)
        # (2) the port vanishes mid-stream and returns: boot 3 streams while the monitor finds it
        vb.stop()
        assert wait_for(lambda: "lost" in read_log(log), 10), read_log(log)
        vb = start(tmp_path)
        out, err = mon.communicate(timeout=120)
    finally:
        if mon.poll() is None:
            mon.terminate()
            mon.wait(timeout=10)
        vb.stop()
    assert mon.returncode == 0, out + err
    s = json.loads(out)
    counts = s["frames"]
    frames = [json.loads(ln) for ln in open(jl)]
    text = read_log(log)
    assert counts["good"] == len(frames) and s["losses"] == 1, s
    assert text.index("lost") < text.index("reconnected") < text.index("b3 line 0 "), text

    # the frames, run by run: each boot from its layout at seq 0, every seq, in order
    runs = []
    for fr in frames:
        if fr["type"] == "layout" and fr["seq"] == 0:
            runs.append([])
        assert runs, fr  # the first frame logged is boot 1's layout
        runs[-1].append(fr)
    assert [r[0]["layout"]["boot"] for r in runs] == ["1", "2", "3"], [r[0] for r in runs]
    lines = {}  # boot -> [(i, seq)] of its complete text lines
    for m in re.finditer(r"^\[[^]]*\] b(\d) line (\d+) seq (\d+)$", text, re.M):
        lines.setdefault(int(m.group(1)), []).append((int(m.group(2)), int(m.group(3))))
    for b, run in enumerate(runs, 1):
        texts = [fr for fr in run if fr["type"] == "text"]
        assert [fr["seq"] for fr in run] == list(range(len(run))), (b, [fr["seq"] for fr in run])
        assert [fr["type"] for fr in run] == (["layout"] + ["text", "periodic"] * len(texts))[:len(run)], b
        assert all(fr["request"] == b for fr in texts), b
        assert "".join(fr["text"] for fr in texts) == "".join("b%d t%d\n" % (b, i) for i in range(len(texts))), b
        assert all("error" not in fr for fr in run) and [fr["ms"] for fr in run] == sorted(fr["ms"] for fr in run), b
        # every frame a received text line names was written before it: it is here; beyond
        # the last line, at most one tick's frames (written just before the reset)
        got = lines[b]
        assert got == [(i, 2 * i + 2) for i in range(len(got))], (b, got)
        assert got[-1][1] <= len(run) - 1 <= got[-1][1] + 2, (b, got[-1], len(run))
    assert len(lines[3]) == 40 and len(runs[2]) == 81 and re.search(r"\] b3 end$", text, re.M), (lines[3], len(runs[2]))

    # the capture: the frames decoded from it by the specification's rules are the log's;
    # a refused candidate is only ever a frame cut by a reset (next comes a boot layout)
    data = open(cap, "rb").read()
    items = capture_items(data)
    code = {name: t for t, name in tm.FRAME_TYPES.items()}
    assert [v for k, v in items if k == "frame"] == [(code[fr["type"]], fr["seq"], fr["ms"]) for fr in frames]
    bad = [j for j, (k, _) in enumerate(items) if k == "bad"]
    for j in bad:
        nxt = items[j + 1][1]
        assert nxt[0] == tm.T_LAYOUT and nxt[1] == 0, (items[j], nxt)
    # the counts: nothing dropped (a restart at the boot layout is not a gap), two restarts,
    # nothing skipped; refused = the cut frames (at most one per reset), one of them
    # truncated when the port loss cut it
    assert counts["dropped"] == 0 and counts["restarts"] == 2 and counts["skipped"] == 0, counts
    assert counts["corrupt"] == len(bad) <= 2 and counts["truncated"] == s["rejected"].get("port lost", 0) <= 1, s
    assert counts["body_errors"] == 0, counts

    # the replay: the same frames and counts (a frame cut by the port loss is, in the
    # capture, refused at the next delimiter instead of at the loss: not "truncated")
    rep = kv("monitor", "--replay", str(cap), "--json", "--jsonl", str(jl2))
    assert rep.returncode == 0, rep.stdout + rep.stderr
    rc = json.loads(rep.stdout)["frames"]
    assert {k: v for k, v in rc.items() if k != "truncated"} == {k: v for k, v in counts.items() if k != "truncated"}, (rc, counts)
    assert rc["truncated"] == 0, rc

    def strip(fr):
        return {k: v for k, v in fr.items() if k != "host_t"}

    assert [strip(json.loads(ln)) for ln in open(jl2)] == [strip(fr) for fr in frames]

    # the text log: every byte of the board's text, up to "b3 end" (where the monitor
    # stopped), as the capture holds it; a frame cut by the port loss swallows, in the
    # capture, the text up to the next delimiter, which the live log kept
    import telemetry_indep as ind

    want = re.sub(r"\r+\n", "\n", ind.decode(data)[0].decode("utf-8", "surrogateescape"))
    have = board_text(text)
    end = "b3 end\n"
    want, have = want[:want.index(end) + len(end)], have[:have.index(end) + len(end)]
    assert have == want if counts["truncated"] == 0 else is_subsequence(want, have), (have[-300:], want[-300:])


def test_a_board_restart_is_not_counted_as_dropped_frames():
    # a board that ran long (seq past 32,768) resets: its boot layout at seq 0 restarts the
    # count (the old "a jump back of more than half the circle" rule took 40,001 -> 0 as
    # 25,534 frames dropped); a restart whose layout was lost is seen by its time going
    # back, and the frames of the new run before the first received are dropped; a wrap of
    # the sequence (65,535 -> 0, time going on) is no restart; skipped sums each run's count
    import io

    from firmware_py import telemetry as tm
    from host import console
    from host.monitor import Monitor

    def core(skipped):
        return bytes([tm.R_CORE, 6, 0, 0, 0, skipped, 0, 0])

    def fr(ftype, seq, ms, body=b""):
        return console.encode_frame(console.payload(ftype, body, seq=seq, ms=ms))

    run1 = fr(tm.T_PERIODIC, 40000, 4000000, core(3)) + b"text\n" + fr(tm.T_PERIODIC, 40001, 4000100, core(4))
    run2 = b"MPY: soft reboot\r\n" + fr(tm.T_LAYOUT, 0, 0, b"proto=1") + fr(tm.T_PERIODIC, 1, 0, core(0)) + \
        fr(tm.T_PERIODIC, 3, 200, core(1))  # seq 2 lost: one dropped
    run3 = fr(tm.T_PERIODIC, 5, 50, core(2))  # the layout and seqs 0..4 lost: five dropped
    wrap = fr(tm.T_PERIODIC, 65535, 10 ** 6, core(2)) + fr(tm.T_PERIODIC, 0, 10 ** 6 + 100, core(2))
    d = console.StreamDecoder()
    d.feed(run1 + run2)
    c = d.counts()
    assert c["good"] == 5 and c["dropped"] == 1 and c["restarts"] == 1 and c["skipped"] == 4 + 1, c
    d.feed(run3)
    c = d.counts()
    assert c["dropped"] == 6 and c["restarts"] == 2 and c["skipped"] == 4 + 1 + 2, c
    d2 = console.StreamDecoder()
    d2.feed(wrap)
    assert d2.counts()["dropped"] == 0 and d2.counts()["restarts"] == 0
    # the monitor's summary carries the restarts; split into reads of any size, the same
    for n in (1, 7, 4096):
        m = Monitor("capture", out=io.StringIO(), view="plain")
        data = run1 + run2 + run3
        for i in range(0, len(data), n):
            m.feed(data[i:i + n])
        f = m.summary()["frames"]
        assert (f["good"], f["dropped"], f["restarts"], f["skipped"], f["corrupt"]) == (6, 6, 2, 7, 0), (n, f)


class FakePort:
    # a pyserial stand-in: reads hand out the chunks given (b"" when there is nothing:
    # a read that timed out), then raise an OSError (the port vanished) if told to
    def __init__(self, chunks, lose_at_end=False):
        self.chunks = list(chunks)
        self.lose_at_end = lose_at_end
        self.in_waiting = 0
        self.written = b""

    def read(self, n):
        if self.chunks:
            return self.chunks.pop(0)
        if self.lose_at_end:
            raise OSError("gone")
        return b""

    def write(self, data):
        self.written += data

    def flush(self):
        pass

    def close(self):
        pass


def _mon(tmp_path, **kw):
    import io

    from host.monitor import Monitor

    out = io.StringIO()
    tmp_path.mkdir(parents=True, exist_ok=True)
    m = Monitor("fake", out=out, log_path=str(tmp_path / "l.txt"), jsonl_path=str(tmp_path / "f.jsonl"),
                capture_path=str(tmp_path / "c.bin"), view="plain", timestamps=False, reconnect=False, **kw)
    return m, out


def _frame(ftype, seq, ms, body=b""):
    from host import console

    return console.encode_frame(console.payload(ftype, body, seq=seq, ms=ms))


def test_connecting_mid_frame_shows_and_logs_none_of_its_tail(tmp_path):
    # the new-user finding: monitor connecting to a board already streaming showed the
    # tail of the frame being sent as text (binary bytes, split at an 0x0a inside it) on
    # the console and in --log. Now the tail is dropped (counted; it stays in --capture),
    # the text and frames after it come through, in reads of any size
    from firmware_py import telemetry as tm

    wire = _frame(tm.T_TEXT, 7, 500, b"\x01upon\n a time")
    rest = b"b1 line 3\n" + _frame(tm.T_PERIODIC, 8, 600, bytes([tm.R_CORE, 1, 5])) + b"b1 line 4\n"
    for n in (1, 4, 1000):
        data = wire[5:] + rest
        m, out = _mon(tmp_path / str(n))
        hit = m.run(until="line 4", timeout=10, ser=FakePort([data[i:i + n] for i in range(0, len(data), n)]))
        m.close()
        log = open(tmp_path / str(n) / "l.txt", encoding="utf-8", errors="surrogateescape").read()
        assert hit == "b1 line 4" and log == "b1 line 3\nb1 line 4\n", (n, log)
        assert "upon" not in out.getvalue() and "\\x" not in out.getvalue(), out.getvalue()
        f = m.summary()["frames"]
        assert (f["good"], f["corrupt"], f["partial_at_start"], f["partial_bytes"]) == (1, 0, 1, len(wire) - 6), f
        assert open(tmp_path / str(n) / "c.bin", "rb").read() == data  # every byte received, in the capture


def test_text_at_the_start_is_not_held_back(tmp_path):
    # the board's first text (a boot report, the REPL) with no frame after it: held back
    # only until a read comes back empty, then shown (--until sees it)
    m, out = _mon(tmp_path)
    hit = m.run(until="report end", timeout=10, ser=FakePort([b"kvrtos: boot report\n", b"report end\n>>> ", b""]))
    m.close()
    assert hit == "report end" and out.getvalue().splitlines()[:2] == ["kvrtos: boot report", "report end"], out.getvalue()


def test_until_logs_what_follows_the_matching_line(tmp_path):
    # --until stops the console at the matching line, but nothing received is lost from
    # the logs: the rest of the read (lines, a partial line, frames) is in --log, --jsonl
    # and --capture
    from firmware_py import telemetry as tm

    data = b"hello\n" + _frame(tm.T_LAYOUT, 0, 0, b"proto=1") + b"the line\nafter 1\n" + \
        _frame(tm.T_PERIODIC, 1, 10, bytes([tm.R_CORE, 1, 9])) + b"after 2\npartial"
    m, out = _mon(tmp_path)
    hit = m.run(until="the line", timeout=10, ser=FakePort([data]))
    m.close()
    shown = out.getvalue()
    assert hit == "the line" and "the line" in shown and "after" not in shown and "partial" not in shown, shown
    log = open(tmp_path / "l.txt").read()
    assert log == "hello\nthe line\nafter 1\nafter 2\npartial [partial line: monitor stopped]\n", log
    assert [json.loads(ln)["seq"] for ln in open(tmp_path / "f.jsonl")] == [0, 1]
    assert open(tmp_path / "c.bin", "rb").read() == data


def test_a_reconnect_starts_a_new_stream(tmp_path):
    # after the port is lost the next bytes may again start inside a frame: the decoder
    # is told (flush), the tail is dropped, not shown
    from firmware_py import telemetry as tm

    m, out = _mon(tmp_path)
    m.feed(b"before\n" + _frame(tm.T_PERIODIC, 1, 10) + b"cut li")
    m.flush_partial("port lost")
    m.feed(_frame(tm.T_PERIODIC, 9, 900, bytes([tm.R_CORE, 1, 3]))[4:] + b"back\n" + _frame(tm.T_PERIODIC, 10, 1000))
    m.close()
    assert open(tmp_path / "l.txt").read() == "before\ncut li [partial line: port lost]\nback\n"
    assert m.decoder.partial_at_start == 1 and m.decoder.good == 2


def test_the_dashboard_rates_start_again_at_every_restart_the_decoder_sees():
    # State.update resets its rates on the decoder's restart signal (the frame's
    # "restart"), not only when board time goes back by more than 60 s: here the board
    # rebooted while the port was away for 90 s, its seq went back (100 -> 50) and its
    # time forward; the old rule computed the task's CPU % across the two runs
    from firmware_py import telemetry as tm
    from host import console, dashboard

    def task_row(run_ms):
        vals = bytes([0, 1, 1]) + console._varint(run_ms) + bytes([1, 0, 0, 0, 0, 0])
        return bytes([tm.R_TASK, len(vals)]) + vals

    d = console.StreamDecoder()
    st = dashboard.State()
    frames = []
    for seq, ms, run_ms in ((99, 1000, 500), (100, 2000, 1000), (50, 90000, 80000), (51, 91000, 80100)):
        for _kind, f in d.feed(_frame(tm.T_PERIODIC, seq, ms, task_row(run_ms))):
            frames.append(f)
            st.update(f)
            if seq == 100:
                assert st.tasks[0]["cpu_pct"] == 50.0
            if seq == 50:
                assert f.get("restart") is True and st.tasks[0]["cpu_pct"] is None  # not (80000-1000)/88000
    assert st.tasks[0]["cpu_pct"] == 10.0 and d.restarts == 1
    assert [("restart" in f) for f in frames] == [False, False, True, False]


def test_options_that_need_another_are_refused():
    # an option that only matters with another one is refused (one line, exit 2) instead
    # of silently ignored
    for args, needs in ((("--tokens", "5"), "--tokens needs --prompt"),
                        (("--tokens", "64"), "--tokens needs --prompt"),  # the default typed: refused alike
                        (("--tokens", ""), "--tokens needs --prompt"),
                        (("--port", "/dev/null", "--board", "esp32s3_n8r8"), "--board only picks the port"),
                        (("--replay", "x.bin", "--board", "esp32s3_n8r8"), "--board only picks the port"),
                        (("--port", "/dev/null", "--link-bps", "100"), "--link-bps needs --start"),
                        (("--replay", "x.bin", "--until", "boot"), "--until needs a port"),
                        (("--replay", "x.bin", "--until-done", "1"), "--until-done needs a port"),
                        (("--replay", "x.bin", "--timeout", "5"), "--timeout needs a port"),
                        (("--port", "/dev/null", "--board", "esp32s3_devkitc"), "--board only picks the port")):
        r = kv("monitor", *args)
        assert one_line_error(r) and r.returncode == 2 and needs in r.stderr, (args, r.returncode, r.stderr)


@pytest.mark.parametrize("args", [("--prompt", "hi", "--tokens", "abc"), ("--prompt", "hi", "--tokens", "1.5"),
                                  ("--prompt", "hi", "--tokens", "0"), ("--prompt", "hi", "--tokens", ""),
                                  ("--timeout", ""), ("--timeout", "0"), ("--until-done", "x"), ("--until-done", "-1"),
                                  ("--until-done", "1.5"), ("--start", "--link-bps", "abc"), ("--start", "--link-bps", "50")])
def test_monitor_number_options_are_checked_by_the_task(args):
    # text options checked by monitor itself: one line, exit 2 (invoke used to convert
    # int defaults first and crash with a ValueError traceback)
    r = kv("monitor", "--port", "/dev/null", *args)
    flag = [a for a in args if a in ("--tokens", "--until-done", "--link-bps", "--timeout")][0]
    assert one_line_error(r) and r.returncode == 2, (args, r.stderr)
    assert r.stderr.startswith(("kv monitor: %s must be" % flag, "kv monitor: %s needs a value" % flag)), (args, r.stderr)


def test_an_empty_board_name_is_one_line():
    r = kv("monitor", "--board", "")
    assert one_line_error(r) and r.returncode == 2 and "--board needs a board name" in r.stderr, r.stderr


def test_start_on_a_board_that_does_not_answer_says_to_reset_it(monkeypatch):
    # monitor --start on a port where nothing answers the raw REPL (a board that ignores
    # Ctrl-C): one line that says to reset the board, not flash's "(--timeout)" hint
    # (monitor's --timeout is how long to watch)
    import pty

    from host import link
    from host.errors import UserError
    from host.monitor import start_serve

    monkeypatch.setattr(link, "CONNECT_S", 0.3)
    master, slave = pty.openpty()
    try:
        with pytest.raises(UserError) as e:
            start_serve(os.ttyname(slave))
    finally:
        os.close(master)
        os.close(slave)
    msg = str(e.value)
    assert "\n" not in msg and "--timeout" not in msg and "reset it" in msg and "twice" in msg, msg


# a user's module task whose factory raises: serve on the board prints its one-line
# error and exits (review r5 item 3)
BOOM = """
def make(kernel, env, **args):
    raise ValueError("boom in factory")
"""
BOOM_CONFIG = {"name": "b", "tasks": [{"kind": "module", "name": "meter", "module": "boom", "factory": "make"}]}


@vboard
@pytest.mark.parametrize("timeout", [None, "60"])
def test_until_done_stops_at_once_when_serve_ends_on_the_board(tmp_path, timeout):
    # the config is put on the board's filesystem directly (./kv flash --config refuses
    # it on the host): monitor --start --until-done returns with serve's own error line
    # and a non-zero exit, neither waiting for --timeout nor, without one, forever (the
    # subprocess timeout below is far under 60 s)
    with start(tmp_path) as vb:
        r = kv("flash", "--port", vb.port)
        assert r.returncode == 0, r.stdout + r.stderr
        with open(fs_path(tmp_path, "kvrtos.json"), "w") as f:
            json.dump(BOOM_CONFIG, f)
        with open(fs_path(tmp_path, "boom.py"), "w") as f:
            f.write(BOOM)
        args = ["monitor", "--port", vb.port, "--start", "--prompt", "Once", "--tokens", "4", "--until-done", "1", "--plain"]
        r = kv(*args + (["--timeout", timeout] if timeout else []), timeout=40)
    assert one_line_error(r) and r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr)
    assert r.stderr.startswith("kv monitor: serve ended on the board after 0 of 1 requests: serve: kvrtos.json: config: "
                               "task 'meter': its factory boom.make raised ValueError: boom in factory"), r.stderr
    assert "boom in factory" in r.stdout  # the board's line, shown as it came


@vboard
def test_a_command_is_not_typed_into_a_board_at_its_repl(tmp_path):
    # nothing flashed or serving: the board sits at its REPL, where a command frame's
    # bytes would be taken as typed input. monitor --prompt waits for serve's first
    # telemetry frame, then says in one line that none answered, and types nothing
    with start(tmp_path) as vb:
        r = kv("monitor", "--port", vb.port, "--prompt", "Once upon", "--tokens", "4", "--timeout", "20", "--plain", timeout=60)
    assert one_line_error(r) and r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr)
    assert r.stderr.startswith("kv monitor: no kvrtos serve answered on %s within 5 s" % vb.port), r.stderr
    # a command frame goes out hex-encoded: the REPL would have echoed its bytes
    from host import console as con

    frame = con.command("prompt", text="Once upon", tokens=4).strip(b"\x00").decode("ascii")
    assert frame[:8] not in r.stdout and "4f6e6365" not in r.stdout, r.stdout[-2000:]


@pytest.mark.parametrize("capture, lines", [(b"hi\nthere\n", ["hi", "there"]),
                                            (b"".join(b"boot line %d\r\n" % i for i in range(20)), ["boot line %d" % i for i in range(20)])])
def test_a_text_only_capture_replays_line_by_line(tmp_path, capture, lines):
    # no frame delimiter in it: the decoder held all of it back as a possible frame's tail
    # and the replay printed it as one partial line ("lines": 0); live, a quiet line settles it
    cap = tmp_path / "t.bin"
    cap.write_bytes(capture)
    r = kv("monitor", "--replay", str(cap), "--plain", "--log", str(tmp_path / "t.log"))
    assert r.returncode == 0, r.stderr
    shown = [ln.split("] ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("[")]
    assert shown == lines, r.stdout
    rep = json.loads(kv("monitor", "--replay", str(cap), "--json").stdout)
    assert rep["lines"] == len(lines), rep


# --- the interactive monitor (a terminal on stdin: keys go to the board) ---------------------------

def _pty_monitor(*args):
    # ./kv monitor ARGS with a pseudo-terminal as its terminal: (process, master fd)
    import pty as pty_mod

    master, slave = pty_mod.openpty()
    env = dict(os.environ)
    env.pop("KVRTOS_CALLER_CWD", None)
    def controlling():  # the pty is its terminal, and it runs in that terminal's foreground
        import fcntl
        import termios

        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    p = subprocess.Popen([sys.executable, "-m", "host.cli", "monitor", *args], cwd=ROOT, stdin=slave, stdout=slave,
                         stderr=slave, env=env, preexec_fn=controlling)
    os.close(slave)
    return p, master


def _read_until(fd, want, seen, timeout=30.0):
    import select as sel

    end = time.monotonic() + timeout
    while want not in seen[0]:
        if time.monotonic() > end:
            raise AssertionError("no %r within %g s; got %r" % (want, timeout, seen[0][-800:]))
        r, _, _ = sel.select([fd], [], [], 0.2)
        if r:
            try:
                seen[0] += os.read(fd, 4096).decode("utf-8", "replace")
            except OSError:
                break
    return seen[0]


def test_the_interactive_monitor_types_into_the_repl_resets_and_leaves_with_ctrl_bracket(tmp_path):
    # at a terminal, keys go to the board: a line typed at the REPL comes back echoed and
    # answered; Ctrl-T r soft-resets the virtual board; Ctrl-] leaves with exit 0
    with start(tmp_path) as vb:
        p, fd = _pty_monitor("--port", vb.port, "--timeout", "60")
        seen = [""]
        try:
            _read_until(fd, "Ctrl-] leaves", seen)
            os.write(fd, b"\r")
            _read_until(fd, ">>> ", seen)
            os.write(fd, b"6*7\r")
            _read_until(fd, "42", seen)
            assert "6*7" in seen[0]  # the board's echo of the keys, as they came
            os.write(fd, b"\x14r")  # Ctrl-T r
            _read_until(fd, "soft reboot", seen)
            os.write(fd, b"\x14h")
            _read_until(fd, "r reset the board", seen)
            os.write(fd, b"\x1d")  # Ctrl-]
            assert p.wait(timeout=20) == 0, seen[0][-800:]
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            os.close(fd)


def test_the_interactive_monitor_decodes_frames_while_keys_are_typed(tmp_path):
    # serve started on the board: its frames are decoded (status lines, the done event) while
    # keys typed go to it (serve reads only command frames: they are ignored there)
    with start(tmp_path) as vb:
        r = kv("flash", "--port", vb.port, "--model", os.path.join(ROOT, "models", "kvrtos-tiny", "model.bin"), timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        p, fd = _pty_monitor("--port", vb.port, "--start", "--prompt", "Once upon a time", "--tokens", "40",
                             "--timeout", "200")
        seen = [""]
        try:
            _read_until(fd, "Ctrl-] leaves", seen, 60)
            _read_until(fd, "tok", seen, 120)  # a status line from the periodic frames
            os.write(fd, b"hello")
            _read_until(fd, "done", seen, 120)  # the request's done event, decoded
            assert "Once upon a time" in seen[0]  # the generated text, shown
            os.write(fd, b"\x1d")
            assert p.wait(timeout=30) == 0, seen[0][-800:]
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            os.close(fd)


def test_an_empty_or_random_capture_is_one_line_and_exit_1(tmp_path):
    # were exit 0 with thousands of escaped lines; a text-only capture (a serial log) stays fine
    import random

    (tmp_path / "e.bin").write_bytes(b"")
    rnd = random.Random(1)
    (tmp_path / "r.bin").write_bytes(bytes(rnd.randrange(256) for _ in range(20000)))
    (tmp_path / "t.bin").write_bytes(b"boot\r\n" * 20)
    r = kv("monitor", "--replay", str(tmp_path / "e.bin"), "--plain")
    assert r.returncode == 1 and one_line_error(r) and "is empty" in r.stderr, r.stderr
    r = kv("monitor", "--replay", str(tmp_path / "r.bin"), "--plain")
    assert r.returncode == 1 and one_line_error(r) and "not a capture of a kvrtos board" in r.stderr, r.stderr
    r = kv("monitor", "--replay", str(tmp_path / "t.bin"), "--plain", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["lines"] == 20, r.stdout + r.stderr


def test_replays_exit_status_is_what_the_telemetry_page_says(tmp_path):
    # docs/telemetry.md, "--replay's exit status": 0 for a capture (good frames, damaged ones
    # among them; text a board could print), 1 for an empty file, random bytes, or only
    # damaged frames; 2 for what is not a regular file
    from firmware_py import telemetry as tm
    from host import console as con

    good = con.encode_frame(con.payload(tm.T_PERIODIC, bytes([tm.R_CORE, 1, 5]), seq=1, ms=10))
    damaged = bytearray(con.encode_frame(con.payload(tm.T_PERIODIC, bytes([tm.R_CORE, 1, 6]), seq=2, ms=20)))
    damaged[5] ^= 0x40
    rnd = random.Random(7)
    cases = [(b"boot\n" + good + bytes(damaged) + b"more\n", 0), (b"hi\nthere\n", 0), (b"", 1),
             (bytes(rnd.randrange(256) for _ in range(5000)), 1), (bytes(damaged) * 3, 1)]
    for i, (data, code) in enumerate(cases):
        p = tmp_path / ("c%d.bin" % i)
        p.write_bytes(data)
        log = tmp_path / ("c%d.log" % i)
        r = kv("monitor", "--replay", str(p), "--json", "--log", str(log))
        assert r.returncode == code, (i, r.returncode, r.stderr)
        assert code == 0 or (one_line_error(r) and not log.exists()), (i, r.stderr)  # no escaped lines, no empty log
    r = kv("monitor", "--replay", str(tmp_path))
    assert r.returncode == 2 and one_line_error(r) and "not a file" in r.stderr, r.stderr


def test_until_done_ends_when_the_board_stops_answering(tmp_path, monkeypatch):
    # a board that answered and then went silent (SIGSTOP, a hang) held `monitor --prompt hi
    # --until-done 1` forever: silence past SILENT_S after serve answered is one line, exit 1
    import time as time_mod

    from firmware_py import telemetry as tm
    from host import monitor as mon

    monkeypatch.setattr(mon, "SILENT_S", 0.5)
    m, _ = _mon(tmp_path)
    port = FakePort([_frame(tm.T_PERIODIC, 1, 100, bytes([tm.R_CORE, 1, 5]))])  # then silence: reads give b""
    t0 = time_mod.monotonic()
    with pytest.raises(mon.UserError) as e:
        m.run(until_done=1, timeout=30, ser=port)
    m.close()
    assert "the board stopped answering: no telemetry frame for 0.5 s with 1 of 1 requests not ended" in str(e.value)
    assert e.value.code == 1 and time_mod.monotonic() - t0 < 10
    # without --until-done a quiet board is only watched (no error), up to --timeout
    m, _ = _mon(tmp_path / "b")
    port = FakePort([_frame(tm.T_PERIODIC, 1, 100, bytes([tm.R_CORE, 1, 5]))])  # then silence: reads give b""
    assert m.run(timeout=1.0, ser=port) is None
    m.close()
