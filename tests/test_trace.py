# ./kv trace on logs as they come: cut off by a monitor that was stopped mid-write,
# with lines that are not UTF-8, not JSON, or JSON whose fields have the wrong types. Every
# good frame is used, every bad line skipped and counted (--json and one stderr line); a
# log with no good frame, and an --out that cannot be made, are one line with exit 2.
import json
import os

import pytest

from host import console, trace
from host.errors import UserError
from test_telemetry import Board, check_trace
from vboard_util import kv, one_line_error


@pytest.fixture(scope="module")
def log_lines():
    # the JSONL lines of one request on the CPython board (more than 50 kB of log)
    b = Board(max_requests=1)
    b.send("prompt", text="Once upon a time", tokens=160)
    b.run()
    _, frames = b.decoded()
    lines = [console.jsonl_line(f) + "\n" for f in frames]
    assert len(lines) > 30
    return lines


def write(p, data):
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


def test_a_good_log_has_nothing_skipped(log_lines, tmp_path):
    res = trace.main(write(tmp_path / "run.jsonl", "".join(log_lines)), str(tmp_path / "out"), as_json=True)
    assert res["frames"] == len(log_lines) and res["skipped_lines"] == 0 and not res["cut_last_line"]
    check_trace(json.load(open(res["trace"])))


def test_a_cut_off_log_uses_every_good_frame(log_lines, tmp_path, capsys):
    # what `head -c 50000 run.jsonl` makes: the last line cut in the middle
    whole = "".join(log_lines).encode()
    cut = whole[:50000] if len(whole) > 50000 else whole[: len(whole) - 7]
    assert not cut.endswith(b"\n")
    good = cut.count(b"\n")
    res = trace.main(write(tmp_path / "trunc.jsonl", cut), str(tmp_path / "out"), as_json=True)
    out, err = capsys.readouterr()
    assert res["frames"] == good and res["skipped_lines"] == 1 and res["cut_last_line"], res
    assert json.loads(out)["skipped_lines"] == 1
    assert err.splitlines() == ["trace: %s: skipped 1 bad line, used every good frame (line %d: cut off)"
                                % (tmp_path / "trunc.jsonl", good + 1)], err
    check_trace(json.load(open(res["trace"])))
    # cut inside a multi-byte character: still a cut-off last line, not a "not UTF-8" error
    res = trace.main(write(tmp_path / "t2.jsonl", "".join(log_lines[:5]).encode() + "{\"type\":\"é".encode()[:-1]),
                     str(tmp_path / "out2"))
    assert res["frames"] == 5 and res["cut_last_line"]


BAD_LINES = [
    b"\xff\xfe not utf-8\n",
    b"not json\n",
    b"[1, 2]\n",
    b'{"type":"periodic","seq":"x","ms":"y","core":7}\n',
    b'{"type":"periodic","ms":null,"pool":{"used":"a"}}\n',
    b'{"type":"periodic","ms":5,"core":7}\n',
    b'{"type":"periodic","ms":5,"pool":{"used":"a"}}\n',
    b'{"type":"periodic","ms":5,"seqs":[{"slot":"a","cached":1}]}\n',
    b'{"type":"periodic","ms":5,"seqs":[{"cached":1,"length":1,"blocks":1}]}\n',
    b'{"type":"periodic","ms":5,"seqs":{"slot":0}}\n',
    b'{"type":"periodic","ms":5,"tiers":[{"tier":0,"kb":"9"}]}\n',
    b'{"type":"periodic","ms":5,"tasks":[7]}\n',
    b'{"type":"periodic","ms":5,"core":{"tokens":NaN}}\n',
    b'{"type":"periodic","ms":5,"core":{"tok_s_x10":1e999}}\n',
    b'{"type":"periodic","ms":5,"heap":{"free":true}}\n',
    b'{"type":"periodic","ms":5,"core":{"tokens":' + b"9" * 30 + b"}}\n",
    b'{"type":"periodic","ms":-1}\n',
    b'{"type":"periodic","ms":1.5}\n',
    b'{"type":7,"ms":5}\n',
    b'{"ms":5}\n',
    b'{"type":"layout","ms":0,"layout":[1]}\n',
    b'{"type":"layout","ms":0,"layout":{"task.x":"decode"}}\n',
    b'{"type":"layout","ms":0,"layout":{"task.0":3}}\n',
    b'{"type":"layout","ms":0,"layout":{"pool.block_bytes":"abc"}}\n',
    b'{"type":"event","ms":5,"events":{"event":"start"}}\n',
    b'{"type":"event","ms":5,"events":[{"event":"start","request":[1]}]}\n',
    b'{"type":"event","ms":5,"events":[{"event":5}]}\n',
    b'{"type":"event","ms":5,"events":[{"event":"done","ms":"x"}]}\n',
    b"[" * 100000 + b"\n",
]


@pytest.mark.parametrize("line", BAD_LINES, ids=range(len(BAD_LINES)))
def test_a_bad_line_is_skipped_and_counted(line, log_lines, tmp_path, capsys):
    half = len(log_lines) // 2
    data = "".join(log_lines[:half]).encode() + line + "".join(log_lines[half:]).encode()
    res = trace.main(write(tmp_path / "mixed.jsonl", data), str(tmp_path / "out"), as_json=True)
    err = capsys.readouterr().err.splitlines()
    assert res["frames"] == len(log_lines) and res["skipped_lines"] == 1 and not res["cut_last_line"], res
    assert len(err) == 1 and "skipped 1 bad line, used every good frame (line %d: " % (half + 1) in err[0], err
    check_trace(json.load(open(res["trace"])))


@pytest.mark.parametrize("line", BAD_LINES, ids=range(len(BAD_LINES)))
def test_a_log_of_bad_lines_only_is_one_line_exit_2(line, tmp_path):
    with pytest.raises(UserError) as e:
        trace.main(write(tmp_path / "bad.jsonl", line * 2), str(tmp_path / "out"))
    assert e.value.code == 2 and "holds no telemetry frames (2 bad lines skipped, line 1: " in str(e.value)
    assert "\n" not in str(e.value)


def test_what_a_later_console_adds_passes(log_lines, tmp_path):
    # fields and records trace does not use, frame types it does not know, empty records
    extra = ['{"type":"periodic","ms":5,"seq":3,"kernel":{"busy_ms":"x"},"core":{},"pool":null,"future":[1]}\n',
             '{"type":"type_99","ms":6,"body_hex":"00"}\n',
             '{"type":"text","ms":7,"request":1,"text":"\\udcff"}\n',
             '{"type":"layout","ms":0,"layout":{"task.0":"telemetry","pool.block_bytes":"16512","rec.99":"x:a"}}\n']
    res = trace.main(write(tmp_path / "x.jsonl", "".join(log_lines) + "".join(extra)), str(tmp_path / "out"))
    assert res["frames"] == len(log_lines) + len(extra) and res["skipped_lines"] == 0


def test_the_cli_says_one_line(log_lines, tmp_path):
    # through ./kv: the brief's cases, each one line on stderr and exit 2; a cut log exit 0
    good = write(tmp_path / "run.jsonl", "".join(log_lines))
    cases = [(write(tmp_path / "bin.jsonl", b"\x80\x81\x82\n\xff"),),
             (write(tmp_path / "t1.jsonl", BAD_LINES[3]),),
             (write(tmp_path / "t2.jsonl", BAD_LINES[4]),),
             (good, "--out", "/proc/x"),
             (good, "--out", os.path.join(good, "through", "a file")),
             (good, "--out", good)]
    for args in cases:
        r = kv("trace", *args)
        assert one_line_error(r) and r.returncode == 2 and r.stderr.startswith("kv trace: "), (args, r.returncode, r.stderr)
    # missing parent folders are made (as mkdir -p)
    r = kv("trace", write(tmp_path / "cut.jsonl", "".join(log_lines)[:-20]), "--out", str(tmp_path / "o" / "p" / "q"), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    res = json.loads(r.stdout)
    assert res["frames"] == len(log_lines) - 1 and res["skipped_lines"] == 1 and res["cut_last_line"], res
    assert len(r.stderr.splitlines()) == 1 and "cut off" in r.stderr, r.stderr
    assert os.path.isfile(res["trace"])


def test_a_restart_mark_starts_a_new_time_segment():
    # the console marks the first frame of a new run of the board "restart": true; trace
    # starts a new time segment there even when the board time went back by less than 60 s
    # (here 30 s) or went on (a reboot while the port was away); without marks (an older
    # console's log) a step back of more than 60 s still does
    def per(ms, run_ms, **kw):
        return dict({"type": "periodic", "ms": ms, "tasks": [{"slot": 0, "run_ms": run_ms}]}, **kw)

    frames = [per(10000, 100), per(30000, 200), per(0, 0, restart=True), per(5000, 2500),
              per(90000, 10, restart=True), per(91000, 510)]
    ts = [t for t, _ in trace.with_time(frames)]
    assert ts == [10000, 30000, 31000, 36000, 36000 + 1000 + 90000, 36000 + 1000 + 91000], ts
    trace_d, _ = trace.build(frames)
    runs = [(e["ts"] // 1000, e["args"]["cpu_pct"]) for e in trace_d["traceEvents"] if e.get("name") == "run"]
    assert runs == [(10000, 0.5), (31000, 50.0), (127000, 50.0)], runs  # none across a restart
    old = [per(100000, 100), per(130000, 200), per(0, 0), per(5000, 2500)]  # no marks: time back 130 s
    assert [t for t, _ in trace.with_time(old)] == [100000, 130000, 131000, 136000]
    assert [t for t, _ in trace.with_time([per(50000, 0), per(20000, 0)])] == [50000, 20000]  # the fallback: 60 s
    # no rate across a restart, even when the new run's counter is above the old one's
    trace_d, _ = trace.build([per(1000, 100), per(2000, 600), per(3000, 900, restart=True), per(4000, 1400)])
    runs = [(e["ts"] // 1000, e["args"]["cpu_pct"]) for e in trace_d["traceEvents"] if e.get("name") == "run"]
    assert runs == [(1000, 50.0), (2000 + 1000 + 3000, 50.0)], runs


def test_counters_sent_modulo_10_9_wrap_and_the_time_is_the_consoles():
    # run_ms and kb are sent modulo 10**9: a step back by more than half of it is their
    # wrap, the rate goes on; a smaller step back (a task respawned in its slot) gives none
    W = 10 ** 9

    def per(ms, run_ms, kb):
        return {"type": "periodic", "ms": ms, "tasks": [{"slot": 0, "run_ms": run_ms}], "tiers": [{"tier": 0, "kb": kb}]}

    frames = [per(W - 100, W - 60, W - 200), per(W + 100, 40, 200), per(W + 300, 10, 600)]
    trace_d, series = trace.build(frames)
    runs = [(e["ts"] // 1000, e["args"]["cpu_pct"]) for e in trace_d["traceEvents"] if e.get("name") == "run"]
    assert runs == [(W - 100, 50.0)], runs
    assert series["tier"]["tier0"] == [(W + 100, 2.0), (W + 300, 2.0)]
