# kv monitor keeps logging, in order and with nothing lost, across soft resets of the
# board and a restart of the virtual board (its port disappears and comes back).
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from vboard_util import fs_path, kv, one_line_error, send, start, wait_for

pytestmark = pytest.mark.vboard

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


def test_monitor_started_after_flash_sees_the_boot_report(tmp_path):
    from firmware_py.app import REPORT_END

    with start(tmp_path) as vb:
        r = kv("flash", "--port", vb.port)
        assert r.returncode == 0, r.stderr
        r = kv("monitor", "--port", vb.port, "--until", REPORT_END, "--timeout", "20")
    assert r.returncode == 0 and "kvrtos: boot report" in r.stdout and REPORT_END in r.stdout, r.stdout + r.stderr


def test_monitor_missing_port_is_one_line():
    r = kv("monitor", "--port", "/dev/no-such-port")
    assert one_line_error(r) and r.returncode == 2 and "no serial port" in r.stderr, r.stderr


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
        r = kv("flash", "--port", vb.port, "--model", model, timeout=300)
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
    rep = kv("monitor", "--replay", str(cap), "--json")
    assert rep.returncode == 0 and json.loads(rep.stdout)["frames"]["good"] == f["good"], rep.stdout + rep.stderr
    tr = kv("trace", str(jl), "--out", str(out), "--json")
    assert tr.returncode == 0, tr.stdout + tr.stderr
    res = json.loads(tr.stdout)
    check_trace(json.load(open(res["trace"])))
    fit = res["kv_fit"]
    assert fit and abs(fit["fitted_bytes_per_token"] - fit["token_bytes"]) / fit["token_bytes"] < 0.08, fit
    assert fit["token_bytes"] == int(lay["kv.token_bytes"])


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
