# The application config on the board side and `./kv demo` end to end: the user guide's
# example (examples/user-task: a config with an audio task and a user's own module) goes
# through appcfg and through firmware_py.serve beside a real decode; `./kv flash --config`
# refuses a bad config in one line before any board is looked for; the demo runs on a
# virtual board of its own and leaves the summary, the trace and the plots.
import json
import os
import re
import sys

import pytest

from conftest import ROOT
from firmware_py import appcfg, board, serve
from firmware_py.clock import VirtualClock
from host import console, demo, flash
from host.errors import UserError
from vboard_util import kv, one_line_error

EXAMPLE = os.path.join(ROOT, "examples", "user-task")
TINY = os.path.join(ROOT, "models", "kvrtos-tiny")
BRD = board.load(os.path.join(ROOT, "boards", "esp32s3_n8r8.json"))


@pytest.fixture
def example_on_path():
    sys.path.insert(0, EXAMPLE)  # where the board has meter.py: beside main.py (flash --config copies it)
    try:
        yield
    finally:
        sys.path.remove(EXAMPLE)
        sys.modules.pop("meter", None)


def test_user_guide_example_runs_through_appcfg(example_on_path):
    with open(os.path.join(EXAMPLE, "kvrtos.json")) as f:
        cfg = appcfg.load(f.read())
    assert [t["name"] for t in cfg["tasks"]] == ["mic", "meter"]
    from firmware_py import bandwidth
    from firmware_py.sched import Kernel

    k = Kernel(VirtualClock(), max_tasks=appcfg.max_tasks(cfg))
    env = appcfg.make_env(k, bandwidth.Bandwidth(BRD, kernel=k, user_categories=appcfg.categories(cfg)), cfg, BRD)
    loads = appcfg.spawn(k, cfg, env)

    def busy():  # a CPU load in 3 ms slices, below both tasks
        while True:
            k.charge(3000)
            yield k.sleep_us(0)

    k.spawn("busy", 0, busy())
    k.run(1000000)  # one virtual second
    st = appcfg.stats(loads)
    assert st["meter"]["released"] == 49 and st["meter"]["deadline_misses"] == 0, st["meter"]  # 20 ms periods
    assert 0 <= st["meter"]["average"] < 4096
    assert st["mic"]["released"] >= 60 and st["mic"]["deadline_misses"] == 0, st["mic"]


def test_serve_runs_the_config_tasks_beside_the_decode(example_on_path):
    with open(os.path.join(EXAMPLE, "kvrtos.json")) as f:
        app = appcfg.load(f.read())
    cap = bytearray()
    lines = []
    kw = serve.config_opts(app)
    assert kw == {"policy": "sinks", "window": 64, "sinks": 4, "kv_dtype": "int8", "priority": 1}
    srv = serve.Server(lambda buf, n: cap.extend(bytes(buf[:n])), None, clock=VirtualClock(), layer_us=2000,
                       model=os.path.join(TINY, "model.bin"), tokenizer=os.path.join(TINY, "tokenizer.bin"),
                       out=lines.append, max_requests=1, app=app, board=BRD, **kw)
    assert srv.start("Once upon a time", 12) == 0
    srv.run()
    summary = [ln for ln in lines if ln.startswith("generate: ")]
    assert len(summary) == 1 and "12 new" in summary[0] and "int8" in summary[0], lines
    (wl,) = [ln for ln in lines if ln.startswith(serve.WORKLOADS)]
    st = json.loads(wl[len(serve.WORKLOADS):])
    assert set(st) == {"mic", "meter"} and st["meter"]["released"] > 0 and st["mic"]["released"] > 0
    assert all("deadline_misses" in v for v in st.values())
    # telemetry reports the tasks and the shared tracker's tiers and categories
    d = console.StreamDecoder()
    frames = [v for kind, v in d.feed(bytes(cap)) + d.flush() if kind == "frame"]
    assert d.corrupt == 0 and frames
    names = {}
    for f in frames:
        if f["type"] == "layout":
            names.update(f["layout"])
    assert {"mic", "meter", "decode"} <= {v for key, v in names.items() if key.startswith("task.")}
    assert "psram" in names.values() and "meter" not in {names.get("cat.%d" % i) for i in range(3)}
    bwcats = [r for f in frames if f["type"] == "periodic" for r in f.get("bwcats", [])]
    assert any(r["kb"] > 0 for r in bwcats)  # the decode's weights reads on the shared tracker


CHATS_CFG = {"decode": {"prompt": "Once", "tokens": 3, "piece_bytes": 4096, "kv_blocks": 6, "priority": 3,
                        "prefix": "Once upon", "chats": [{"prompt": "Tom"}, {"prompt": "Sue"}]},
             "tasks": [{"kind": "sensor", "name": "imu", "period_us": 10000, "read_bytes": 64}]}


def test_serve_applies_the_decode_keys_the_board_honours():
    # piece_bytes, kv_blocks and the decode's priority go into the request's Session and
    # task; prefix and chats are the ones the board does not run (named at boot by main)
    app = appcfg.load(json.dumps(CHATS_CFG))
    kw = serve.config_opts(app)
    assert {k: kw[k] for k in ("piece_bytes", "kv_blocks", "priority")} == {"piece_bytes": 4096, "kv_blocks": 6,
                                                                             "priority": 3}
    assert serve.config_ignored(app) == ["prefix", "chats"]
    lines = []
    srv = serve.Server(lambda buf, n: None, None, clock=VirtualClock(), layer_us=2000,
                       model=os.path.join(TINY, "model.bin"), tokenizer=os.path.join(TINY, "tokenizer.bin"),
                       out=lines.append, max_requests=1, app=app, board=BRD, **kw)
    assert srv.start("Once upon a time", 4) == 0
    assert srv.task.prio == 3
    srv.run()
    s = srv.session
    assert s.pool.n_blocks == 6 and s.piece_bytes == 4096 and s.pieces > 0, (s.pool.n_blocks, s.pieces)
    assert s.n_new == 4 and not s.stop
    with pytest.raises(serve.ServeError) as e:
        serve.Server(lambda buf, n: None, None, clock=VirtualClock(), priority=9)
    assert "priority" in str(e.value) and "\n" not in str(e.value)


def _main_in(tmp_path, monkeypatch, cfg):
    # serve.main in tmp_path with cfg as its kvrtos.json, the tiny model, one request
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kvrtos.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    monkeypatch.setattr(serve, "stdin_poller", lambda: None)
    monkeypatch.setattr(serve, "_guard", None)
    monkeypatch.setattr(serve, "_PROFILE", [BRD])  # the board.json ./kv flash writes beside main.py
    return serve.main(model=os.path.join(TINY, "model.bin"), tokenizer=os.path.join(TINY, "tokenizer.bin"),
                      max_requests=1)


def test_serve_main_names_the_decode_keys_the_board_ignores(tmp_path, monkeypatch, capsysbinary):
    srv = _main_in(tmp_path, monkeypatch, {"decode": dict(CHATS_CFG["decode"], kv_blocks=0)})
    out = capsysbinary.readouterr().out  # printed lines between telemetry frames
    ign = [ln for ln in out.split(b"\n") if b"ignores" in ln]
    assert ign == [b"serve: config kvrtos.json: the board ignores decode prefix, chats (shared-prefix chats run in "
                   b"./kv emulate only)"], out
    assert srv.session.n_new == 3 and srv.task is None


def test_serve_main_boots_before_the_tasks_run(tmp_path, monkeypatch, capsysbinary):
    # the boot (the model read, the heap collected and sized) happens before the kernel runs
    # the config's tasks, also when serve waits for a command (as under ./kv demo and
    # monitor --start): done at the first request, inside the input task, it held the CPU
    # for 150-490 ms on the virtual board while the 16 kHz microphone (48 ms deadline) waited
    at_run = []
    monkeypatch.setattr(serve.Server, "run", lambda self, for_us=-1: at_run.append(self.session))
    cfg = {"decode": {"kv_dtype": "int8"},  # no prompt: serve waits for commands
           "tasks": [{"kind": "audio", "name": "mic", "rate_hz": 16000, "sample_bytes": 2, "period_us": 16000, "halves": 4}]}
    srv = _main_in(tmp_path, monkeypatch, cfg)
    assert len(at_run) == 1 and at_run[0] is not None and at_run[0] is srv.session
    assert b"boot: " in capsysbinary.readouterr().out
    # the first request with the same options runs on that session: no second boot
    s = srv.session
    assert srv.start("Once", 2) == 0 and srv.session is s


def test_serve_boot_that_fails_is_one_line_and_the_request_says_it_again(tmp_path, monkeypatch, capsysbinary):
    monkeypatch.chdir(tmp_path)
    lines = []
    srv = serve.Server(lambda buf, n: None, None, clock=VirtualClock(), model=str(tmp_path / "none.bin"),
                       tokenizer=os.path.join(TINY, "tokenizer.bin"), out=lines.append)
    assert srv.boot() is False and srv.session is None
    assert len(lines) == 1 and lines[0].startswith("serve: boot deferred to the first request: ") and "none.bin" in lines[0]
    assert srv.start("Once", 2) != 0  # refused with the same reason, serve still up
    assert lines[-1].startswith("serve: request refused: ") and "none.bin" in lines[-1], lines


@pytest.mark.parametrize("cfg, word", [
    ('{"tasks": [{"kind": "sensor", "name": "x", "period_us": 5}]}', "period_us must be in 100..100000000, got 5"),
    ('{"decode": {"policy": "lru"}', "not valid JSON"),
    ({"tasks": [{"kind": "sensor", "name": "s", "read_bytes": 4064, "bus_bytes_per_s": 5, "period_us": 1000}]},
     "longer than its period"),
])
def test_a_bad_config_is_one_line_and_a_non_zero_exit(tmp_path, monkeypatch, capsys, cfg, word):
    with pytest.raises(SystemExit) as e:
        _main_in(tmp_path, monkeypatch, cfg)
    assert e.value.code == 2
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("serve: kvrtos.json: config: ") and word in lines[0], out
    assert "Traceback" not in out.out + out.err
    # the board's own entry point: the boot report says it, then the same line and exit
    from firmware_py import app

    with pytest.raises(SystemExit) as e:
        app.main(serve=True)
    assert e.value.code == 2
    out = capsys.readouterr().out
    assert "kvrtos.json refused: config: " in out or "longer than its period" in word, out
    assert out.splitlines()[-1] == lines[0]


def test_serve_main_config_file_and_its_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert serve.load_config("kvrtos.json") is None  # none: serve as before
    (tmp_path / "kvrtos.json").write_text('{"decode": {"policy": "lru"}}')
    with pytest.raises(appcfg.AppConfigError) as e:
        serve.load_config("kvrtos.json")
    assert "policy" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, word", [
    ("{", "not valid JSON"),
    ('{"decode": {"kv_dtype": "int3"}}', "kv_dtype"),
    ('{"tasks": [{"kind": "audio", "name": "mic", "period_us": 15500}]}', "multiple of 32"),
    ('{"tasks": [{"kind": "module", "name": "m", "module": "nowhere", "factory": "make"}]}', "nowhere.py"),
])
def test_flash_config_refuses_a_bad_config_before_any_board(tmp_path, text, word):
    p = tmp_path / "bad.json"
    p.write_text(text)
    env = dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path / "home"))  # no board is running there
    r = kv("flash", "--config", str(p), env=env)
    assert one_line_error(r) and r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("kv flash: --config") and word in r.stderr, r.stderr
    assert not (tmp_path / "home").exists()  # nothing started, nothing flashed


def test_flash_config_files_are_the_config_and_its_modules():
    files = flash.config_files(os.path.join(EXAMPLE, "kvrtos.json"), BRD)
    assert [d for d, _ in files] == ["kvrtos.json", "meter.py"]
    with open(os.path.join(EXAMPLE, "meter.py"), "rb") as f:
        assert files[1][1] == f.read()


def test_demo_out_folder_used_before_a_folder_in_the_way_is_one_line(tmp_path):
    (tmp_path / demo.MARKER).write_text("")
    (tmp_path / "trace.json").mkdir()
    env = dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path / "home"))
    r = kv("demo", "--tokens", "2", "--out", str(tmp_path), env=env)
    assert one_line_error(r) and r.returncode == 2 and "trace.json is a folder" in r.stderr, r.stderr
    assert not (tmp_path / "home").exists()  # refused before a board was started


def test_demo_out_never_touches_a_users_own_files(tmp_path):
    # review r6 item 2: a folder holding a file named like an output (a user's app config
    # kvrtos.json) that no demo made is refused in one line before a board starts, untouched
    app = tmp_path / "app"
    app.mkdir()
    (app / "kvrtos.json").write_text('{"name": "mine"}')
    env = dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path / "home"))
    r = kv("demo", "--tokens", "2", "--plain", "--out", str(app), env=env)
    assert one_line_error(r) and r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "holds kvrtos.json (not from a demo): choose an empty or new folder" in r.stderr, r.stderr
    assert (app / "kvrtos.json").read_text() == '{"name": "mine"}' and sorted(os.listdir(app)) == ["kvrtos.json"]
    assert not (tmp_path / "home").exists()


def test_demo_clear_outputs_checks_every_name_before_removing_any(tmp_path):
    # review r6 item 3: a previous demo folder with one output in the way: refused with
    # nothing removed; without it, the earlier run's files go and the others stay
    (tmp_path / demo.MARKER).write_text("")
    for name in ("kvrtos.json", "serial.log", "notes.txt"):
        (tmp_path / name).write_text(name)
    (tmp_path / "trace.json").mkdir()
    with pytest.raises(UserError) as e:
        demo.clear_outputs(str(tmp_path))
    assert e.value.code == 2 and "trace.json is a folder" in str(e.value)
    assert sorted(os.listdir(tmp_path)) == sorted([demo.MARKER, "kvrtos.json", "serial.log", "notes.txt", "trace.json"])
    (tmp_path / "trace.json").rmdir()
    demo.clear_outputs(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([demo.MARKER, "notes.txt"])
    new = tmp_path / "new"
    new.mkdir()
    (new / "mine.txt").write_text("x")  # no output's name: used as it is, marked
    demo.clear_outputs(str(new))
    assert sorted(os.listdir(new)) == sorted([demo.MARKER, "mine.txt"])


def test_demo_mistakes_are_one_line():
    for args, word in ((["--tokens", "0"], "--tokens"), (["--tokens", "x"], "--tokens"),
                       (["--board", "rpi4b_4gb"], "microcontroller"), (["--out", ""], "--out")):
        r = kv("demo", *args)
        assert one_line_error(r) and r.returncode == 2 and word in r.stderr, (args, r.stderr)


@pytest.mark.vboard
def test_demo_end_to_end_on_a_virtual_board(tmp_path):
    out = tmp_path / "out"
    # a folder used before (review r5 item 1): an earlier run's files are replaced, not
    # appended to; the user's own file there is left alone
    out.mkdir()
    stale = {"telemetry.jsonl": '{"type": "event", "events": [{"event": "done"}], "stale": 1}\n',
             "serial.log": "[00:00:00.000] STALE-EARLIER-RUN\n", "capture.bin": "STALE-EARLIER-RUN\n",
             "bandwidth.png": "STALE", "summary.json": "{}", "notes.txt": "mine", demo.MARKER: ""}
    for name, text in stale.items():
        (out / name).write_text(text)
    env = dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path / "home"))  # a virtual board of its own
    r = kv("demo", "--tokens", "8", "--plain", "--out", str(out), env=env, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert (out / "notes.txt").read_text() == "mine"
    for name in ("telemetry.jsonl", "serial.log", "capture.bin"):
        assert b"stale" not in (out / name).read_bytes().lower(), name
    assert (out / "serial.log").read_text().count("[monitor] connected to") == 1
    assert not (out / "bandwidth.png").exists() or (out / "bandwidth.png").read_bytes()[:4] == b"\x89PNG"
    rep = kv("monitor", "--replay", str(out / "capture.bin"), "--json")
    assert rep.returncode == 0 and json.loads(rep.stdout)["requests_done"] == 1, rep.stdout + rep.stderr
    m = re.search(r"^demo: summary: 8 tokens, ([\d.]+) tok/s on this host \(the virtual board runs at the host's speed; "
                  r"the real board's prediction follows\), time to first token ([\d.]+) ms, KV (\d+) B, "
                  r"pool high-water (\d+)/(\d+) blocks \((\d+) B\), audio deadline misses (\d+) of (\d+) periods$",
                  r.stdout, re.M)
    assert m, r.stdout[-3000:]
    assert float(m.group(1)) > 0 and int(m.group(3)) > 0 and int(m.group(4)) >= 1 and int(m.group(8)) > 0
    assert "demo: output in %s" % out in r.stdout
    assert "config       kvrtos.json 'demo'" in r.stdout  # the boot report names the flashed config
    for name in ("trace.json", "kv_bytes.png", "pool.png", "bandwidth.png", "telemetry.jsonl", "serial.log",
                 "summary.json", "kvrtos.json"):
        assert (out / name).stat().st_size > 0, name
    with open(out / "trace.json") as f:
        assert json.load(f)["traceEvents"]
    with open(out / "summary.json") as f:
        s = json.load(f)
    assert s["tokens"] == 8 and s["workloads"]["mic"]["released"] == s["audio_periods"]
    assert {"tok_s", "ttft_ms", "kv_bytes", "pool_high_water", "audio_deadline_misses"} <= set(s)
    # the real board's prediction (the emulator, same model, config and request) with the band;
    # the virtual board ran the integer path (int8 KV beside the int8 weights flash put there)
    p = s["board_prediction"]
    assert p["cost"] == "viper" and p["tok_s"] > 0 and p["deadline_misses"] == 0, p
    assert set(p["band"]) == {"slow", "fast"} and p["band"]["slow"]["deadline_misses"] == 0, p
    assert re.search(r"^demo: on a real board \(emulated, viper cost: \./kv emulate --board esp32s3_n8r8 --scenario .*kvrtos\.json "
                     r"--tokens 8 --prompt 'Once upon a time' --model kvrtos-tiny\): [\d.]+ tok/s, deadline misses 0 \(slow end of the board-speed band", r.stdout, re.M), r.stdout[-2000:]
    assert "int8 weights and KV" in r.stdout


def test_user_guide_quotes_the_generated_quality_rows_and_the_example():
    with open(os.path.join(ROOT, "docs", "user-guide.md")) as f:
        guide = f.read()
    with open(os.path.join(ROOT, "docs", "kv-quality.md")) as f:
        quality = f.read()
    sec = guide[guide.index("## 7."):guide.index("## 8.")]
    rows = [ln for ln in sec.splitlines() if ln.startswith("| ") and not ln.startswith("| KV dtype") and "---" not in ln]
    assert len(rows) == 3 and all(r in quality.splitlines() for r in rows), rows
    with open(os.path.join(EXAMPLE, "kvrtos.json")) as f:
        example = f.read().strip()
    assert "```json\n%s\n```" % example in guide
