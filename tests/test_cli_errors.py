# Bad input to the front door gets one clear line on stderr and a non-zero exit,
# never a traceback.
import json
import os

import pytest
import serial

from host import flash
from vboard_util import FakeBoard, kv, one_line_error, start


# an ESP32-S3 image header (3 segments, DIO; chip id 9 in its extended header) and a plausible size
FAKE_IMAGE = b"\xe9\x03\x02\x4f" + bytes(8) + b"\x09\x00" + bytes(64 * 1024)


def test_unknown_board():
    r = kv("flash", "--board", "esp32s3_nonexistent")
    assert one_line_error(r) and r.returncode == 2 and "unknown board 'esp32s3_nonexistent'" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.pop("memory"), "memory"),
        (lambda d: d["memory"][1].update(bytes="8M"), "memory[1].bytes"),
        (lambda d: d["cpu"].update(cores=0), "cpu.cores"),
        (lambda d: d.update(usb={"vid": "303A", "pid": "0x1001"}), "usb.vid"),
        (lambda d: d.pop("micropython_heap_bytes"), "micropython_heap_bytes"),
        (lambda d: d.update(name="../../../tmp/bjescape"), "name"),
        (lambda d: d.update(name="a\nb"), "name"),
        (lambda d: d.update(name=".hidden"), "name"),
        (lambda d: d.update(name="x" * 65), "name"),
        (lambda d: d.update(mpy_arch="pdp11"), "mpy_arch"),
        (lambda d: d.update(usb=None), "usb"),
    ],
)
def test_malformed_profile_names_file_and_field(tmp_path, mutate, field):
    from host import paths

    d = json.load(open(paths.BOARDS + "/esp32s3_n8r8.json"))
    mutate(d)
    bad = tmp_path / "bad_board.json"
    bad.write_text(json.dumps(d))
    r = kv("flash", "--board", str(bad))
    assert one_line_error(r) and r.returncode == 2, r.stderr
    assert str(bad) in r.stderr and field + ":" in r.stderr, r.stderr


def test_profile_that_is_not_json(tmp_path):
    bad = tmp_path / "b.json"
    bad.write_text("{ this is not json")
    r = kv("vboard", "--board", str(bad))
    assert one_line_error(r) and r.returncode == 2 and "not valid JSON" in r.stderr, r.stderr


def test_missing_port():
    r = kv("flash", "--port", "/dev/ttyACM99")
    assert one_line_error(r) and r.returncode == 2 and "no serial port at /dev/ttyACM99" in r.stderr, r.stderr


def test_busy_port(tmp_path):
    # the real message, not the word "busy" that pytest's temp path may hold
    with start(tmp_path) as vb:
        holder = serial.Serial(vb.port, exclusive=True)
        try:
            r = kv("flash", "--port", vb.port)
            assert one_line_error(r) and "port %s is busy: another program" % vb.port in r.stderr, r.stderr
            r = kv("monitor", "--port", vb.port, "--timeout", "2")
            assert one_line_error(r) and "port %s is busy: another program" % vb.port in r.stderr, r.stderr
        finally:
            holder.close()


def test_firmware_image_that_does_not_exist():
    r = kv("flash-firmware", "--bin", "/nonexistent/micropython.bin", "--port", "/dev/null")
    assert one_line_error(r) and r.returncode == 2 and "no such file" in r.stderr, r.stderr


def test_firmware_image_that_is_not_an_esp_image(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"PK\x03\x04 not firmware")
    r = kv("flash-firmware", "--bin", str(f), "--port", "/dev/null")
    assert one_line_error(r) and r.returncode == 2 and "not an ESP32 firmware image" in r.stderr, r.stderr


def test_vboard_refuses_a_soc_profile():
    r = kv("vboard", "--board", "rk3588_4gb")
    assert one_line_error(r) and r.returncode == 2 and "not a microcontroller" in r.stderr, r.stderr


def test_unknown_benchmark():
    r = kv("bench", "nosuch")
    assert one_line_error(r) and r.returncode == 2 and "no benchmark 'nosuch'" in r.stderr, r.stderr


def test_esptool_command_for_an_esp32s3(tmp_path):
    cmds = flash.esptool_command("fw.bin", "/dev/ttyACM0", erase=True)
    assert [c[3:] for c in cmds][0][:2] == ["--chip", "esp32s3"]
    assert cmds[0][-1] == "erase-flash"
    w = cmds[1]
    assert w[1:3] == ["-m", "esptool"] and w[w.index("--chip") + 1] == "esp32s3"
    assert w[w.index("--port") + 1] == "/dev/ttyACM0" and w[w.index("--before") + 1] == "usb-reset"
    assert w[-4:] == ["write-flash", "-z", "0x0", "fw.bin"]


def test_esptool_accepts_the_command_it_is_given(tmp_path):
    # esptool parses our argv and gets as far as talking to the port: against a port
    # with no ESP32 ROM bootloader it fails to connect, and we say so in one line
    img = tmp_path / "fw.bin"
    img.write_bytes(FAKE_IMAGE)
    with start(tmp_path) as vb:
        r = kv("flash-firmware", "--bin", str(img), "--port", vb.port, timeout=300)
    assert r.returncode == 1 and "esptool failed" in r.stderr.splitlines()[-1], r.stderr[-2000:]
    assert "write-flash" in r.stdout and "Traceback" not in r.stderr



# --- issue 7, section 4: each item, run as a user runs it -------------------------


def line(r):
    # the one stderr line of a failed command
    assert one_line_error(r), (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    return r.stderr.strip()


def test_budget_stories15m_int4_on_every_board_answers_with_figures():
    from host import boards

    for b in boards.names():
        r = kv("budget", "--board", b, "--model", "stories15M", "--kv-dtype", "int4")
        assert "Traceback" not in r.stderr and "KV per token" in r.stdout, (b, r.stderr)
        if r.returncode:  # does not fit (an MCU): exit 3 and why, in one line
            assert r.returncode == 3 and line(r).startswith("kv budget: does not fit: weights"), (b, r.stderr)


def test_budget_turns_any_kv_checkpoint_or_board_error_into_one_line(tmp_path, monkeypatch, capsys):
    # a KVError from the firmware's own sizing (here: one the layout raises) is one UserError
    from firmware_py import kv as fw_kv
    from host import budget
    from host.errors import UserError

    def refuse(*a, **k):
        raise fw_kv.KVError("int4 group 32 must divide head_dim 48")

    monkeypatch.setattr(fw_kv, "Layout", refuse)
    with pytest.raises(UserError) as e:
        budget.main(model="stories15M", kv_dtype="int4")
    assert e.value.code == 2 and "must divide head_dim 48" in str(e.value)
    # a checkpoint that is not one, a board file that is not UTF-8: one line each, exit 2
    junk = tmp_path / "model.bin"
    junk.write_bytes(b"\x00" * 10)
    r = kv("budget", "--model", str(junk))
    assert r.returncode == 2 and "truncated" in line(r), r.stderr
    bad = tmp_path / "b.json"
    bad.write_bytes(b"\xff\xfe{\x00")
    r = kv("budget", "--board", str(bad))
    assert r.returncode == 2 and "is not UTF-8 text" in line(r), r.stderr


def test_budget_that_does_not_fit_exits_3_with_the_figures():
    r = kv("budget", "--board", "esp32s3_n4r2", "--model", "stories15M")
    assert r.returncode == 3 and line(r).startswith("kv budget: does not fit: weights (57.95 MiB)"), r.stderr
    assert "weights           57.95 MiB" in r.stdout  # in-memory bytes, freq_cis skipped (d86d450)
    r = kv("budget", "--board", "esp32s3_n4r2", "--model", "stories15M", "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["fits"] is False


@pytest.mark.parametrize(
    "args, code, says",
    [
        (["--weights-bytes", "9" * 23], 2, "the weights would take 99,999"),
        (["--tokens", "9" * 17], 2, "--tokens must be a whole number in 0..1048576"),
        (["--board", "rk3588_4gb", "--model", "Llama-3-8B", "--batch", "100000000000"], 2, "the activations of --batch would take"),
        (["--model", "Llama-3-8B"], 3, "Llama-3-8B's weights (14.96 GiB) are 2,007x the 7.63 MiB of esp32s3_n8r8"),
        (["--batch", "-2"], 2, "--batch must be a whole number"),
    ],
)
def test_budget_refuses_absurd_sizes_in_one_line(args, code, says):
    r = kv("budget", *args)
    assert r.returncode == code and says in line(r) and r.stdout == "", (r.stdout, r.stderr)


def test_budget_refuses_a_profile_whose_heap_exceeds_its_ram(tmp_path):
    from host import paths

    d = json.load(open(paths.BOARDS + "/esp32s3_n8r8.json"))
    d["micropython_heap_bytes"] = 10**12
    bad = tmp_path / "big.json"
    bad.write_text(json.dumps(d))
    r = kv("budget", "--board", str(bad))
    assert r.returncode == 2 and "micropython_heap_bytes (1,000,000,000,000 B) exceeds its RAM tiers" in line(r), r.stderr


@pytest.mark.parametrize(
    "args, says",
    [
        (["--until", "("], "--until '(' is not a valid regular expression: missing )"),
        (["--log", "/nonexistent-dir/serial.log"], "--log /nonexistent-dir/serial.log: folder /nonexistent-dir does not exist"),
        (["--log", "/tmp"], "--log /tmp is a folder"),
        (["--timeout", "abc"], "--timeout must be a positive number of seconds, at most 604800 (a week), got 'abc'"),
        (["--timeout", "-1"], "--timeout must be a positive number of seconds, at most 604800 (a week), got '-1'"),
        (["--timeout", "0"], "--timeout must be a positive number of seconds, at most 604800 (a week), got '0'"),
        (["--timeout", "1e12"], "--timeout must be a positive number of seconds, at most 604800 (a week), got '1e12'"),
    ],
)
def test_monitor_refuses_bad_options_before_opening_a_port(args, says):
    # no port is given and none is running: the option is refused first, in one line
    r = kv("monitor", "--port", "/dev/no-such-port", *args)
    assert r.returncode == 2 and says in line(r), r.stderr


def test_monitor_until_that_never_matches_exits_1_after_the_timeout():
    with FakeBoard("silent") as fb:
        r = kv("monitor", "--port", fb.port, "--until", "never", "--timeout", "0.5")
    assert r.returncode == 1 and "no line matched --until 'never' within 0.5 s" in line(r), r.stderr


def test_flash_to_a_board_that_goes_silent_after_the_handshake_stops_in_one_line():
    import time

    with FakeBoard("silent") as fb:
        t0 = time.monotonic()
        r = kv("flash", "--port", fb.port, "--timeout", "1", timeout=60)
        took = time.monotonic() - t0
        assert fb.handshakes == 1  # it did answer the raw REPL
    assert r.returncode == 1 and took < 30, (r.returncode, took)
    assert "stopped answering while reading its MicroPython version: nothing for 1 s" in line(r), r.stderr


def test_flash_to_a_board_whose_port_vanishes_after_the_handshake_is_one_line():
    with FakeBoard("close") as fb:
        r = kv("flash", "--port", fb.port, "--timeout", "5", timeout=60)
        assert fb.handshakes == 1 and fb.closed
    assert r.returncode == 1 and "port %s vanished or stopped answering" % fb.port in line(r), r.stderr


def _board_reporting(version, mpy):
    # a fake board whose MicroPython says `version` and sys.implementation._mpy == mpy
    def answer(cmd):
        if b"_mpy" in cmd:
            return (b"(%r, %r)\r\n" % (version, mpy), b"")
        return (b"", b"Traceback: unexpected command\r\n")

    return FakeBoard("answer", answer)


@pytest.mark.parametrize(
    "version, mpy, says",
    [
        ((1, 22, 2), 2 << 10 | 2 << 8 | 6, "runs MicroPython 1.22.2, which loads .mpy v6.2 (x64); this build"),
        ((1, 18, 0), 2 << 10 | 5, "runs MicroPython 1.18.0, which loads .mpy v5.0 (x64)"),
        ((1, 12, 0), None, "runs MicroPython 1.12.0, which does not report its .mpy format"),
    ],
)
def test_flash_refuses_a_board_whose_micropython_cannot_load_the_build(version, mpy, says):
    with _board_reporting(version, mpy) as fb:
        r = kv("flash", "--port", fb.port, "--timeout", "5", timeout=60)
        assert len(fb.commands) == 1  # the version probe only: nothing was written
    assert r.returncode == 1 and says in line(r), r.stderr


def test_board_mpy_format_matches_what_mpy_cross_writes():
    # the check's arithmetic: the unix port's _mpy against a host build, an ESP32-S3's
    # (xtensawin) against a board build
    import subprocess

    from host import boards, paths

    mpy = int(subprocess.run([paths.tool("micropython"), "-c", "import sys; print(sys.implementation._mpy)"],
                             capture_output=True, text=True, check=True).stdout)
    host = [a for a in flash.build(boards.load(paths.DEFAULT_BOARD), virtual=True) if a.dest.endswith(".mpy") and a.data[2]]
    assert host and all(a.data[1] == mpy & 0xFF and a.data[2] == mpy >> 8 for a in host)
    board = [a for a in flash.build(boards.load(paths.DEFAULT_BOARD)) if a.dest.endswith(".mpy") and a.data[2]]
    assert flash.mpy_format(board[0].data[1], board[0].data[2]) == "v6.3 (xtensawin)"


def test_flash_refuses_a_src_that_is_not_the_firmware_before_touching_the_board(tmp_path):
    (tmp_path / "notes.py").write_text("X = 1\n")
    with FakeBoard("answer") as fb:
        r = kv("flash", "--port", fb.port, "--src", str(tmp_path))
        assert fb.handshakes == 0 and fb.commands == []  # never connected
    assert r.returncode == 2 and "%s is not the kvrtos firmware (no __init__.py, app.py, main.py)" % tmp_path in line(r), r.stderr


def test_flash_and_monitor_say_busy_for_a_port_another_program_holds():
    with FakeBoard("silent") as fb:
        holder = serial.Serial(fb.port, exclusive=True)
        try:
            for cmd in (["flash"], ["monitor", "--timeout", "2"]):
                r = kv(*cmd, "--port", fb.port)
                assert r.returncode == 1 and "port %s is busy: another program" % fb.port in line(r), (cmd, r.stderr)
        finally:
            holder.close()


def _pid_file(home, text):
    d = home / "esp32s3_n8r8"
    d.mkdir(parents=True)
    (d / "vboard.pid").write_text(text)
    return d / "vboard.pid"


def test_vboard_stop_does_not_kill_a_process_that_took_a_stale_pid(tmp_path):
    import os
    import subprocess

    other = subprocess.Popen(["sleep", "60"])
    try:
        for text in ("%d\n" % other.pid, "%d 12345\n" % other.pid):  # old format; wrong start time
            pidf = _pid_file(tmp_path / text.split()[-1], text)
            env = dict(os.environ, KVRTOS_VBOARD_HOME=str(pidf.parent.parent))
            r = kv("vboard", "--stop", env=env)
            assert r.returncode == 0 and "none was running (removed a stale pid file naming pid %d" % other.pid in r.stdout, r.stdout + r.stderr
            assert other.poll() is None and not pidf.exists()
    finally:
        other.kill()
        other.wait()


def test_vboard_already_running_hint_names_the_running_board(tmp_path):
    # a pid file naming this (live) test process with its real start time reads as a
    # running board: the hint must name that board, not the default one
    import os

    from host import vboard

    d = tmp_path / "esp32s3_n4r2"
    d.mkdir()
    (d / "vboard.pid").write_text("%d %d\n" % (os.getpid(), vboard._started(os.getpid())))
    r = kv("vboard", "--board", "esp32s3_n4r2", env=dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path)))
    assert r.returncode == 1 and "stop it with: ./kv vboard --board esp32s3_n4r2 --stop" in line(r), r.stderr


def test_vboard_fs_on_a_regular_file_is_one_line(tmp_path):
    f = tmp_path / "fs.img"
    f.write_text("x")
    r = kv("vboard", "--fs", str(f), env=dict(__import__("os").environ, KVRTOS_VBOARD_HOME=str(tmp_path / "vb")))
    assert r.returncode == 2 and line(r).startswith("kv vboard: --fs %s is a file" % f), r.stderr


def test_board_profile_that_is_not_utf8_is_one_line(tmp_path):
    bad = tmp_path / "latin1.json"
    bad.write_bytes('{"name": "caf\xe9"}'.encode("latin-1"))
    for cmd in ("vboard", "flash", "budget"):
        r = kv(cmd, "--board", str(bad))
        assert r.returncode == 2 and "%s: <file>: is not UTF-8 text" % bad in line(r), (cmd, r.stderr)


@pytest.mark.parametrize("task, says", [("flash-firmware", "--dry-run"), ("bench", "--json"), ("monitor", "--until"),
                                        ("boardtime", "--emitter"), ("trace", "--out")])
def test_task_help_works(task, says):
    r = kv(task, "--help")
    assert r.returncode == 0 and "Usage:" in r.stdout and says in r.stdout and r.stderr == "", r.stdout + r.stderr


def test_paths_resolve_where_kv_ran_and_esptool_commands_paste_into_a_shell(tmp_path):
    import shlex
    import subprocess

    d = tmp_path / "my dir"
    d.mkdir()
    (d / "fw 1.bin").write_bytes(FAKE_IMAGE)
    # --dry-run with no board attached: esptool's own search, the command runnable as printed
    r = kv("flash-firmware", "--bin", "fw 1.bin", "--dry-run", "--erase", cwd=str(d))
    assert r.returncode == 0, r.stdout + r.stderr
    cmds = [ln for ln in r.stdout.splitlines() if "esptool" in ln and not ln.startswith("flash-firmware:")]
    assert len(cmds) == 2
    argv = shlex.split(cmds[1])
    assert argv[-1] == str(d / "fw 1.bin") and argv[-4:-1] == ["write-flash", "-z", "0x0"], argv
    assert "--port" not in argv and shlex.split(cmds[0])[-1] == "erase-flash"
    # the printed prefix is a command a shell can run: ask that esptool its version
    v = subprocess.run(" ".join(cmds[1].split(" ")[:3]) + " version", shell=True, capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and "esptool" in v.stdout.lower(), v.stdout + v.stderr
    # a relative --log and --board resolve in the folder ./kv ran from
    r = kv("monitor", "--log", "logs/x.log", cwd=str(d))
    assert r.returncode == 2 and "folder %s does not exist" % (d / "logs") in line(r), r.stderr
    r = kv("budget", "--board", "nope.json", cwd=str(d))
    assert r.returncode == 2 and "no board profile file nope.json" in line(r), r.stderr


def test_flash_firmware_dry_run_with_a_port_that_is_not_attached():
    r = kv("flash-firmware", "--bin", __file__, "--dry-run", "--port", "/dev/ttyACM9")
    assert r.returncode == 2 and "not an ESP32 firmware image" in line(r), r.stderr
    r = kv("flash-firmware")
    assert r.returncode == 2 and "--bin FILE is required" in line(r), r.stderr


# --- a new user's second pass: each finding, run as a user runs it -----------------


@pytest.mark.parametrize(
    "args, says",
    [
        (["bench"], "kv bench: missing NAME (usage: ./kv bench NAME"),
        (["flash", "--port"], "kv flash: --port needs a value"),
        (["budget", "--nosuch"], "kv budget: no option --nosuch"),
        (["budget", "extra"], "kv budget: unexpected argument 'extra'"),
        (["bench", "sched", "kv"], "kv bench: unexpected argument 'kv'"),
        (["vboard", "--stop=1"], "kv vboard: --stop takes no value (got --stop=1"),
        (["budget", "--json=yes"], "kv budget: --json takes no value (got --json=yes"),
        (["nosuch"], "kv: no task 'nosuch'"),
        (["budget", "test"], "kv: one task per command line, got budget, test"),
    ],
)
def test_parse_errors_are_one_kv_line_with_exit_2(args, says):
    r = kv(*args)
    assert r.returncode == 2 and line(r).startswith(says), (r.returncode, r.stderr)
    assert r.stdout == ""  # budget test: neither task ran


def test_the_front_door_itself_gives_the_one_line_and_keeps_list_and_help(tmp_path):
    r = kv("budget", "--json=yes", cwd=str(tmp_path))
    assert r.returncode == 2 and line(r).startswith("kv budget: --json takes no value"), r.stderr
    r = kv("--list", cwd=str(tmp_path))
    assert r.returncode == 0 and "flash-firmware" in r.stdout and "bench-docs" in r.stdout, r.stderr
    r = kv("--chain", "budget", "budget", "--json", cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout.count("KV per token") == 1 and '"fits"' in r.stdout, r.stdout + r.stderr


def _fp32_model(tmp_path):
    # a copy of the committed fp32 model in tmp_path; its path
    import shutil

    from host import paths

    inp = tmp_path / "in.bin"
    shutil.copy(paths.ROOT + "/models/kvrtos-tiny/model.bin", inp)
    return inp


def test_convert_refuses_an_out_that_is_the_input_under_another_name(tmp_path):
    import hashlib
    import os

    inp = _fp32_model(tmp_path)
    before = hashlib.sha256(inp.read_bytes()).hexdigest()
    os.symlink("in.bin", tmp_path / "lnk.bin")
    os.link(inp, tmp_path / "hard.bin")
    (tmp_path / "sub").mkdir()
    for out in ("lnk.bin", "hard.bin", "sub/../in.bin"):
        r = kv("convert", "--model", "in.bin", "--out", out, cwd=str(tmp_path))
        assert r.returncode == 2 and "is the input file %s" % inp in line(r), (out, r.stderr)
    assert hashlib.sha256(inp.read_bytes()).hexdigest() == before
    r = kv("convert", "--model", "in.bin", "--out", "out.bin", cwd=str(tmp_path))
    assert r.returncode == 0 and "fp32 file %d B" % inp.stat().st_size in r.stdout, r.stdout + r.stderr
    assert os.listdir(tmp_path / "sub") == [] and sorted(os.listdir(tmp_path)) == ["hard.bin", "in.bin", "lnk.bin", "out.bin", "sub"]


def test_convert_cut_short_leaves_the_old_output_and_no_half_file(tmp_path):
    # a file size limit below the output's size: the write fails part way (EFBIG)
    import os
    import resource
    import subprocess

    from vboard_util import KV_INVOKE

    inp = _fp32_model(tmp_path)
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")
    env = dict(os.environ, KVRTOS_CALLER_CWD=str(tmp_path))
    r = subprocess.run(KV_INVOKE + ["convert", "--model", str(inp), "--out", str(out)], cwd=os.path.dirname(os.path.dirname(__file__)),
                       capture_output=True, text=True, timeout=120, env=env,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000)))
    assert r.returncode == 1 and "%s: cannot be written (File too large)" % out in line(r), r.stderr
    assert out.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["in.bin", "out.bin"]


@pytest.mark.parametrize("out, says", [("/nonexistent/x.bin", "--out /nonexistent/x.bin: folder /nonexistent does not exist"),
                                       ("/tmp", "--out /tmp is a folder")])
def test_convert_bad_out_path_is_bad_input(tmp_path, out, says):
    inp = _fp32_model(tmp_path)
    r = kv("convert", "--model", str(inp), "--out", out)
    assert r.returncode == 2 and says in line(r), r.stderr


@pytest.mark.parametrize("cmd", [["convert", "--out", "x.bin"], ["budget"]])
def test_a_model_path_that_is_a_folder_says_so(tmp_path, cmd):
    (tmp_path / "dir.bin").mkdir()
    r = kv(*cmd, "--model", "dir.bin", cwd=str(tmp_path))
    assert r.returncode == 2 and "%s: is a folder, not a checkpoint file" % (tmp_path / "dir.bin") in line(r), r.stderr


def test_monitor_log_write_error_is_one_line_exit_1():
    with FakeBoard("silent") as fb:
        r = kv("monitor", "--port", fb.port, "--log", "/dev/full", "--timeout", "2", timeout=60)
    assert r.returncode == 1 and line(r) == "kv monitor: --log /dev/full cannot be written: No space left on device", r.stderr


def test_monitor_refuses_a_fifo_log_instead_of_waiting_for_a_reader(tmp_path):
    import os

    fifo = tmp_path / "ff"
    os.mkfifo(fifo)
    with FakeBoard("silent") as fb:
        r = kv("monitor", "--port", fb.port, "--log", str(fifo), "--timeout", "2", timeout=30)  # a hang: TimeoutExpired
    assert r.returncode == 2 and "--log %s is a FIFO (named pipe); give a regular file" % fifo in line(r), r.stderr
    with FakeBoard("silent") as fb:  # a character device may be a log: /dev/null
        r = kv("monitor", "--port", fb.port, "--log", "/dev/null", "--timeout", "0.5", timeout=30)
    assert r.returncode == 0 and "connected to %s" % fb.port in r.stdout, r.stderr


@pytest.mark.parametrize("until, says", [("a{99999999999}", "the repetition number is too large"),
                                         ("(" * 5000 + ")" * 5000, "maximum recursion depth exceeded")])
def test_monitor_until_that_the_regex_compiler_cannot_take_is_one_line(until, says):
    r = kv("monitor", "--port", "/dev/no-such-port", "--until", until)
    assert r.returncode == 2 and "is not a valid regular expression: %s" % says in line(r) and len(line(r)) < 200, r.stderr[:300]


def test_a_fifo_given_as_a_port_is_called_a_fifo(tmp_path):
    import os

    fifo = tmp_path / "ff"
    os.mkfifo(fifo)
    for cmd in ("monitor", "flash"):
        r = kv(cmd, "--port", str(fifo), timeout=30)
        assert r.returncode == 2 and line(r) == "kv %s: %s is not a serial port: it is a FIFO (named pipe)" % (cmd, fifo), r.stderr


def test_monitor_escapes_control_bytes_on_the_console_and_logs_every_byte(tmp_path):
    log = tmp_path / "serial.log"
    sent = b"hi\x1b[2J\x07\xff\xfe caf\xc3\xa9\tx\r\n"
    with FakeBoard("silent") as fb:
        fb._send(sent)  # waits in the port until the monitor opens it
        r = kv("monitor", "--port", fb.port, "--log", str(log), "--until", "caf", "--timeout", "10", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].endswith("] hi\\x1b[2J\\x07\\xff\\xfe caf\u00e9\tx"), r.stdout
    assert b"] " + sent[:-2] + b"\n" in log.read_bytes()


def test_a_profile_name_cannot_take_the_virtual_board_outside_its_home(tmp_path):
    import os

    from host import paths

    d = json.load(open(paths.BOARDS + "/esp32s3_n8r8.json"))
    d["name"] = "../escaped"
    bad = tmp_path / "escape.json"
    bad.write_text(json.dumps(d))
    r = kv("vboard", "--board", str(bad), env=dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path / "home" / "vb")))
    assert r.returncode == 2 and "%s: name: '../escaped': expected 1..64 letters, digits" % bad in line(r), r.stderr
    assert not (tmp_path / "home").exists()


def test_a_deeply_nested_profile_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' + "[" * 100_000 + "]" * 100_000 + "}")
    for cmd in ("budget", "vboard"):
        r = kv(cmd, "--board", str(deep))
        assert r.returncode == 2 and line(r) == "kv %s: bad board profile %s: <json>: nested too deeply to be a board profile" % (cmd, deep), r.stderr


def test_generate_refuses_a_prompt_that_is_not_utf8():
    import os

    r = kv("generate", "--prompt", os.fsdecode(b"ab\xff\xfe"), "--tokens", "1")  # the bytes a shell would pass
    assert r.returncode == 2 and line(r) == "kv generate: --prompt is not UTF-8 text (byte 0xff at byte 2); give the prompt as UTF-8", r.stderr


def test_generate_a_prompt_past_the_models_context_names_the_context():
    r = kv("generate", "--prompt", "hello world " * 500, "--tokens", "1")
    says = line(r)
    assert r.returncode == 2 and "more than the model's context (seq_len 256): shorten it" in says and "heap" not in says, r.stderr


def test_mp32_src_resolves_where_kv_ran(tmp_path):
    r = kv("mp32", "--src", "nosuch", cwd=str(tmp_path))
    assert r.returncode == 2 and line(r) == "kv mp32: %s is not a MicroPython source tree (no py/mpconfig.h)" % (tmp_path / "nosuch"), r.stderr


@pytest.mark.parametrize("data, says", [
    (b"\xe9\x03", "is not an ESP32 firmware image (2 B, shorter than the image header)"),
    (b"\xe9\x00\x02\x4f" + bytes(8) + b"\x09\x00" + bytes(64 * 1024), "is not an ESP32 firmware image (its header says 0 segments, SPI mode 2)"),
    (b"\xe9\x03\x09\x4f" + bytes(8) + b"\x09\x00" + bytes(64 * 1024), "is not an ESP32 firmware image (its header says 3 segments, SPI mode 9)"),
    (b"\xe9\x03\x02\x4f" + bytes(8) + b"\x09\x00" + bytes(986), "is 1000 B: too small for a MicroPython image (at least 65536 B"),
])
def test_flash_firmware_checks_the_image_header_and_size(tmp_path, data, says):
    (tmp_path / "tiny.bin").write_bytes(data)
    r = kv("flash-firmware", "--bin", "tiny.bin", "--dry-run", cwd=str(tmp_path))
    assert r.returncode == 2 and line(r).startswith("kv flash-firmware: %s %s" % (tmp_path / "tiny.bin", says)), r.stderr
    assert r.stdout == ""


def test_flash_firmware_dry_run_without_a_board_says_what_the_real_run_does(tmp_path):
    (tmp_path / "fw.bin").write_bytes(FAKE_IMAGE)
    r = kv("flash-firmware", "--bin", "fw.bin", "--dry-run", cwd=str(tmp_path))
    assert r.returncode == 0 and "without one, or --port, the real run refuses" in r.stdout, r.stdout + r.stderr
    r = kv("flash-firmware", "--bin", "fw.bin", cwd=str(tmp_path))
    assert r.returncode == 1 and "no ESP32-S3 found on USB (VID 0x303A); plug one in or pass --port" in line(r), r.stderr


def test_flash_to_a_port_that_streams_noise_stops_at_the_timeout():
    # bytes never stop coming, so no gap ever ends mpremote's wait for the raw REPL
    # banner: the whole entry is under --timeout
    import os
    import pty
    import select
    import threading
    import time
    import tty

    master, slave = pty.openpty()
    tty.setraw(slave)
    stop = []

    def noise():
        while not stop:
            r, w, _ = select.select([master], [master], [], 0.05)
            if r:
                os.read(master, 4096)
            if w:
                os.write(master, os.urandom(64))
            time.sleep(0.01)

    port = os.ttyname(slave)
    th = threading.Thread(target=noise, daemon=True)
    th.start()
    try:
        t0 = time.monotonic()
        r = kv("flash", "--port", port, "--timeout", "3", timeout=90)
        took = time.monotonic() - t0
    finally:
        stop.append(1)
        th.join(2)
        os.close(master)
        os.close(slave)
    assert r.returncode == 1 and "no MicroPython raw REPL on %s: no prompt within 3 s (--timeout)" % port in line(r), r.stderr
    assert took < 3 + 15, took  # the build before it, and a loaded machine


@pytest.mark.parametrize("cmd, says", [(["budget"], "kv budget: --policy window needs --window of at least 1 token, got 0"),
                                       (["generate", "--tokens", "1"], "kv generate: policy window needs a window of at least 1 token, got 0")])
def test_the_window_floor_is_said_in_the_singular(cmd, says):
    r = kv(*cmd, "--policy", "window")
    assert r.returncode == 2 and line(r) == says, r.stderr


@pytest.mark.parametrize("fs, says", [
    ("/nonexistent/dir/x", "--fs /nonexistent/dir/x: folder /nonexistent/dir does not exist (only the last level is created)"),
    ("/proc/self", "--fs /proc/self is on proc, a kernel filesystem"),
    ("/sys/kvrtos-fs", "--fs /sys/kvrtos-fs is on sysfs, a kernel filesystem"),
])
def test_vboard_fs_must_be_a_folder_we_can_create_files_in(tmp_path, fs, says):
    import os

    r = kv("vboard", "--fs", fs, env=dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path / "vb")))
    assert r.returncode == 2 and line(r).startswith("kv vboard: " + says), r.stderr
    assert not os.path.exists("/nonexistent")


def test_vboard_stop_does_not_kill_a_process_that_is_not_a_virtual_board(tmp_path):
    # pid and start time both match (a pid file written for this very process), but its
    # command line is `sleep`: not ours to kill, and the file is removed as stale
    import os
    import subprocess

    from host import vboard

    other = subprocess.Popen(["sleep", "60"])
    try:
        pidf = _pid_file(tmp_path, "%d %d\n" % (other.pid, vboard._started(other.pid)))
        r = kv("vboard", "--stop", env=dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path)))
        assert r.returncode == 0 and "none was running (removed a stale pid file naming pid %d" % other.pid in r.stdout, r.stdout + r.stderr
        assert other.poll() is None and not pidf.exists()
    finally:
        other.kill()
        other.wait()


def test_vboard_prints_absolute_paths_when_run_from_another_folder(tmp_path):
    import os
    import signal
    import subprocess

    from conftest import ROOT

    home = tmp_path / "vb"
    env = dict(os.environ, KVRTOS_VBOARD_HOME=str(home))
    env.pop("KVRTOS_CALLER_CWD", None)
    p = subprocess.Popen([os.path.join(ROOT, "kv"), "vboard", "--fs", "relfs"], cwd=str(tmp_path), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first, second = p.stdout.readline(), p.stdout.readline()
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)
    assert "(stable path %s)" % (home / "esp32s3_n8r8" / "port") in first, first + p.stderr.read()
    assert "filesystem %s;" % (tmp_path / "relfs") in second, second


def test_readme_lists_every_task_every_budget_option_and_every_benchmark():
    import pkgutil
    import re

    import host.bench
    from host import paths

    readme = open(paths.ROOT + "/README.md").read()
    tasks = re.findall(r"^  (\S+)\s", kv("--list").stdout, re.M)
    assert "flash-firmware" in tasks and "mp32" in tasks
    assert [t for t in tasks if "`./kv %s" % t not in readme] == []
    row = next(ln for ln in readme.splitlines() if ln.startswith("| `./kv budget"))
    flags = re.findall(r"^  (--[\w-]+)", kv("budget", "--help").stdout, re.M)
    assert "--weights-bytes" in flags and [f for f in flags if f not in row] == []
    row = next(ln for ln in readme.splitlines() if ln.startswith("| `./kv bench sched"))
    names = [m.name for m in pkgutil.iter_modules(host.bench.__path__) if not m.name.startswith("_") and m.name != "quality"]
    assert [n for n in names if n not in row] == []  # quality has its own row


# --- issue: silently accepted flags and muddled messages -------------------------


def test_flash_tokenizer_without_model_is_refused():
    r = kv("flash", "--tokenizer", "models/kvrtos-tiny/tokenizer.bin", "--port", "/dev/null")
    assert r.returncode == 2 and line(r).startswith("kv flash: --tokenizer needs --model"), r.stderr


@pytest.mark.parametrize("runtime", ["cpython", "micropython"])
def test_generate_port_needs_runtime_board(runtime):
    r = kv("generate", "--port", "/dev/null", "--tokens", "5", "--runtime", runtime)
    assert r.returncode == 2 and line(r) == "kv generate: --port applies to --runtime board, not %s" % runtime, r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("cmd", [["generate", "--tokens", "5"], ["budget", "--model", "models/kvrtos-tiny/model.bin"]])
def test_a_window_past_the_models_context_is_refused(cmd):
    r = kv(*cmd, "--policy", "window", "--window", "300")
    says = "kv %s: --window 300 is more than the model's context: it must be at most seq_len 256" % cmd[0]
    assert r.returncode == 2 and line(r) == says and r.stdout == "", r.stderr


@pytest.mark.parametrize("group, says", [("0", "--group must be >= 1, or leave it out for the format's default (got 0)"),
                                         ("-4", "--group must be >= 1, or leave it out for the format's default (got -4)"),
                                         ("x", "--group must be a whole number >= 1, got 'x'")])
def test_convert_group_must_be_at_least_one(tmp_path, group, says):
    r = kv("convert", "--model", "models/kvrtos-tiny/model.bin", "--out", str(tmp_path / "o.bin"), "--group", group)
    assert r.returncode == 2 and line(r) == "kv convert: " + says, r.stderr
    assert not (tmp_path / "o.bin").exists()
    h = " ".join(kv("convert", "--help").stdout.split())
    assert "leave it out for the format's default" in h and "q8row (default" in h, h


@pytest.mark.parametrize("args, says", [(["--chain", "budget", "nosuch"], "kv: no task 'nosuch'"),
                                        (["--chain"], "kv: --chain needs the tasks to run")])
def test_chain_with_an_unknown_or_no_task_is_one_line(args, says):
    r = kv(*args)
    assert r.returncode == 2 and line(r).startswith(says) and r.stdout == "", (r.stdout, r.stderr)


@pytest.mark.parametrize("args, says", [(["--word-bytes", "-8"], "--word-bytes must be a whole number >= 0, got -8"),
                                        (["--tokens", "-5"], "--tokens must be a whole number in 0..1048576, got -5"),
                                        (["--weights-bytes", "-1"], "--weights-bytes must be a whole number >= 0, got -1"),
                                        (["--batch", "0"], "--batch must be a whole number >= 1, got 0")])
def test_budget_negative_numbers_say_the_floor(args, says):
    r = kv("budget", *args)
    assert r.returncode == 2 and line(r) == "kv budget: " + says, r.stderr


def test_budget_window_note_does_not_double_the_word():
    r = kv("budget", "--policy", "window", "--window", "250", "--model", "models/kvrtos-tiny/model.bin", "--board", "esp32s3_n4r2")
    r2 = kv("budget", "--board", "esp32s3_n4r2", "--policy", "window", "--window", "512", "--batch", "4")
    for x in (r, r2):
        assert "window window" not in x.stdout + x.stderr, x.stdout + x.stderr
    assert r2.returncode == 3 and "does not fit: a window of 512 tokens needs 128 blocks" in line(r2), r2.stderr


def test_generate_help_has_no_broken_short_flag():
    h = kv("generate", "--help").stdout
    assert "--=" not in h and "--top-p=STRING" in h, h


def test_generate_q8_with_fp32_kv_suggests_int8_kv():
    r = kv("generate", "--backend", "q8", "--kv-dtype", "fp32", "--tokens", "1")
    assert r.returncode == 2 and line(r) == "kv generate: --backend q8 reads int8 KV rows, not fp32: add --kv-dtype int8", r.stderr
    # the default KV type (auto: int8 beside int8 weights) with an fp32 model: the model is what to change
    r = kv("generate", "--backend", "q8", "--tokens", "1")
    assert r.returncode == 2 and "the integer path needs an int8 model (./kv convert --format q8row)" in line(r), r.stderr


def _task_contexts():
    # the parser ./kv builds for tasks.py, and every task's context in it
    import copy

    import tasks
    from invoke import Collection
    from invoke.parser import Parser

    from host.cli import program

    # a copy: building contexts pops the tasks' option help (invoke's Task.get_arguments)
    parser = Parser(initial=program.initial_context, contexts=copy.deepcopy(Collection.from_module(tasks)).to_contexts())
    return parser, [parser.contexts[n] for n in sorted(parser.contexts)]


def test_every_tasks_repeated_option_says_given_twice():
    # invoke keeps the first value of a repeated option and calls the second one "an
    # unexpected argument": the front door says which option came twice, for every task
    from host.cli import check_flags

    parser, contexts = _task_contexts()
    checked = 0
    for ctx in contexts:
        pos = ["P"] * len(ctx.positional_args)
        for name in sorted(n for n in ctx.flags if n.startswith("--")):
            arg = ctx.flags[name]
            if arg.kind is list or arg in ctx.positional_args:
                continue
            once = [name, "1"] if arg.takes_value else [name]
            assert check_flags(parser, [ctx.name] + pos + once) is None, (ctx.name, name)
            msg = check_flags(parser, [ctx.name] + pos + once + once)
            assert msg == "kv %s: %s given twice: give it once (./kv %s --help)" % (ctx.name, name, ctx.name), msg
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("args, says", [
    (["budget", "--tokens", "10", "--tokens", "20"], "kv budget: --tokens given twice: give it once (./kv budget --help)"),
    (["budget", "--tokens=10", "--tokens=20"], "kv budget: --tokens given twice"),
    # long flags only: invoke's automatic short flags meant a different option in each task
    (["budget", "-t", "20"], "kv budget: no option -t (./kv budget --help)"),
    (["emulate", "-t", "100"], "kv emulate: no option -t (./kv emulate --help)"),
    (["flash", "-t", "5"], "kv flash: no option -t (./kv flash --help)"),
    (["bench", "quality", "--prompt"], "kv bench: --prompt needs a value (./kv bench --help)"),
    (["bench", "quality", "--prompt", "--json"], "kv bench: --prompt needs a value"),
    (["bench", "quality", "--prompt", ""], "kv bench: --prompt needs a text to continue, got an empty one"),
    (["bench", "quality", "--model", ""], "kv bench: --model needs a value"),
    (["bench-docs", "--only", "dma", "--render"], "kv bench-docs: --render only re-renders docs/benchmarks.md"),
    (["bench-docs", "--render", "--only", "dma"], "kv bench-docs: --render only re-renders docs/benchmarks.md"),
    (["bench-docs", "--only", ""], "kv bench-docs: --only needs a benchmark name (known: "),
    (["budget", "--sram-kv-bytes", ""], "kv budget: --sram-kv-bytes needs a value"),
    (["budget", "--flash-kv-bytes", ""], "kv budget: --flash-kv-bytes needs a value"),
    (["budget", "--sram-kv-bytes", "\u0661\u0660\u0660"], "kv budget: --sram-kv-bytes must be a whole number >= 0 in ASCII digits 0-9"),
    # typed empty is not the default: each of these ran (emulate without its scenario, flash
    # without a model, a vboard in its default folder, mp32 from the shared tree)
    (["emulate", "--scenario", ""], "kv emulate: --scenario needs a value"),
    (["emulate", "--cost", ""], "kv emulate: --cost needs a value"),
    (["flash", "--model", ""], "kv flash: --model needs a value"),
    (["flash", "--src", ""], "kv flash: --src needs a value"),
    (["vboard", "--fs", ""], "kv vboard: --fs needs a value"),
    (["mp32", "--src", ""], "kv mp32: --src needs a value"),
    (["monitor", "--until", ""], "kv monitor: --until needs a value"),
    # MicroPython's options on a board without it changed nothing and were taken
    (["budget", "--board", "jetson_orin_nano_8gb", "--context", "decode"], "kv budget: --context applies to MicroPython boards"),
    (["budget", "--board", "rk3588_4gb", "--word-bytes", "8"], "kv budget: --word-bytes applies to MicroPython boards"),
    (["convert", "--model", "m.bin", "--out", "o.bin", "--group", ""], "kv convert: --group needs a value"),
])
def test_empty_repeated_and_contradictory_options_are_one_line_exit_2(args, says):
    r = kv(*args)
    assert one_line_error(r) and r.returncode == 2 and r.stderr.strip().startswith(says), r.stderr
    assert "bench quality: " not in r.stderr  # nothing was run


def test_repeatable_prompt_still_repeats():
    from host.cli import check_flags

    parser, _ = _task_contexts()
    assert check_flags(parser, ["bench", "quality", "--prompt", "a", "--prompt", "b", "--json"]) is None
    assert check_flags(parser, ["bench", "--prompt", "a", "quality"]) is None


@pytest.mark.parametrize("args, says", [
    (["trace", "{fifo}"], "kv trace: log {fifo} is a FIFO (named pipe), not a file"),
    (["budget", "--model", "{fifo}"], "kv budget: --model {fifo} is a FIFO (named pipe), not a file"),
    (["sweep", "--grid", "{fifo}"], "kv sweep: grid file {fifo} is a FIFO (named pipe), not a file"),
    (["flash", "--config", "{fifo}"], "kv flash: --config {fifo} is a FIFO (named pipe), not a file"),
    (["convert", "--model", "{fifo}", "--out", "{tmp}/o.bin"], "kv convert: --model {fifo} is a FIFO (named pipe), not a file"),
    (["emulate", "--model", "{fifo}"], "kv emulate: model {fifo} is a FIFO (named pipe), not a file"),
    (["monitor", "--replay", "{fifo}"], "kv monitor: --replay {fifo} is a FIFO (named pipe), not a file"),
    (["monitor", "--replay", "/dev/null"], "kv monitor: --replay /dev/null is a character device, not a file"),
    (["emulate", "--board", "{fifo}"], "kv emulate: board profile {fifo} is a FIFO (named pipe), not a file"),
    (["emulate", "--scenario", "{fifo}"], "kv emulate: scenario {fifo} is a FIFO (named pipe), not a file"),
    (["emulate", "--tokenizer", "{fifo}"], "kv emulate: tokenizer {fifo} is a FIFO (named pipe), not a file"),
    (["boardtime", "{tmp}"], "kv boardtime: source file {tmp} is a folder, not a file"),
    (["boardtime", ""], "kv boardtime: --file needs a value"),
    (["trace", ""], "kv trace: --log needs a value"),
    (["emulate", "--model", "{tmp}"], "kv emulate: model {tmp} is a folder, not a file"),
])
def test_a_fifo_folder_or_device_given_as_an_input_file_is_one_line_not_a_hang(tmp_path, args, says):
    # each of the FIFO cases blocked in open() or read() until killed
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    fill = {"fifo": str(fifo), "tmp": str(tmp_path)}
    r = kv(*[a.format(**fill) for a in args], timeout=60)
    assert one_line_error(r) and r.returncode == 2 and r.stderr.strip() == says.format(**fill), r.stderr
    assert fifo.exists() and not fifo.is_file()


def test_convert_does_not_replace_a_fifo_given_as_its_output(tmp_path):
    fifo = tmp_path / "out.bin"
    os.mkfifo(fifo)
    model = os.path.join(os.path.dirname(__file__), "..", "models", "kvrtos-tiny", "model.bin")
    r = kv("convert", "--model", model, "--out", str(fifo), timeout=60)
    assert one_line_error(r) and r.returncode == 2 and "is a FIFO (named pipe); give a file to write" in r.stderr, r.stderr
    assert not fifo.is_file()


def test_an_output_that_is_the_input_is_refused_before_it_is_written(tmp_path):
    cap = tmp_path / "cap.txt"
    cap.write_bytes(b"hi\n")
    for opt in ("--capture", "--log", "--jsonl"):
        # --capture appended what it read to the file it read: it grew to 51 MB, never ending
        r = kv("monitor", "--replay", str(cap), opt, str(cap), timeout=60)
        assert one_line_error(r) and r.returncode == 2 and "is the --replay file" in r.stderr, (opt, r.stderr)
    assert cap.read_bytes() == b"hi\n"
    log = tmp_path / "trace.json"  # a JSONL log under the name of the trace written beside it
    log.write_text('{"type": "status"}\n')
    r = kv("trace", str(log), timeout=60)
    assert one_line_error(r) and r.returncode == 2 and "would be overwritten by the trace.json" in r.stderr, r.stderr
    assert log.read_text() == '{"type": "status"}\n'


@pytest.mark.parametrize("opt", ["--out", "--cache"])
def test_sweep_refuses_an_output_folder_that_is_a_file_before_any_point_runs(tmp_path, opt):
    f = tmp_path / "afile"
    f.write_text("x")
    for where, says in ((f, "is not a folder"), (f / "x", "is a file, not a folder")):
        r = kv("sweep", "--tokens", "2", "--workers", "1", opt, str(where), timeout=120)
        assert one_line_error(r) and r.returncode == 2 and says in r.stderr, r.stderr  # was a traceback after the run
    assert f.read_text() == "x"


@pytest.mark.parametrize("cmd", [["monitor"], ["flash"], ["generate", "--runtime", "board", "--tokens", "2"], ["repl"]])
def test_dev_null_as_a_port_is_refused_as_not_a_serial_port(cmd):
    # it was exit 1 "cannot open port /dev/null: Could not configure port: (25, ...)"
    r = kv(*cmd, "--port", "/dev/null", timeout=60)
    assert one_line_error(r) and r.returncode == 2 and "/dev/null is not a serial port" in r.stderr, r.stderr


@pytest.mark.parametrize("args,flag", [(["-f", "/nonexist", "demo"], "-f"), (["--hide=xx", "lint"], "--hide"),
                                       (["-T", "abc", "lint"], "-T"), (["--pty", "lint"], "--pty"),
                                       (["--command-timeout=5", "lint"], "--command-timeout")])
def test_invokes_own_core_flags_are_one_line(args, flag):
    # invoke's flags for its shell runner and its config files gave a traceback each
    r = kv(*args)
    assert r.returncode == 2 and line(r) == ("kv: %s is invoke's own option, which kvrtos's tasks do not take (./kv "
                                             "--list shows the tasks, ./kv TASK --help their options)" % flag), r.stderr


def test_kv_alone_lists_the_tasks():
    r = kv()
    assert r.returncode == 0 and "Available tasks:" in r.stdout and "emulate" in r.stdout, r.stdout + r.stderr
    assert "--prompt-for-sudo-password" not in r.stdout and "--write-pyc" not in r.stdout


def test_bench_name_help_is_that_benchmarks_and_every_option_says_what_it_takes():
    # `./kv bench NAME --help` showed the generic help; bench --help showed --prompt as a
    # flag and the names as "sched, kv, ..."; test --help had no descriptions
    r = kv("bench", "sched", "--help")
    assert r.returncode == 0 and r.stdout.startswith("Usage: ./kv bench sched [--json]"), r.stdout + r.stderr
    assert "switch cost" in r.stdout and "--json" in r.stdout
    r = kv("bench", "quality", "-h")
    assert r.returncode == 0 and "--prompt=TEXT" in r.stdout and "--model=PATH" in r.stdout, r.stdout
    r = kv("bench", "nosuch", "--help")
    assert r.returncode == 2 and one_line_error(r) and "no benchmark 'nosuch' (known: boardspeed" in r.stderr, r.stderr
    r = kv("bench", "--help")
    assert r.returncode == 0 and "takes a value (--prompt TEXT)" in r.stdout and "soak, telemetry, tiers" in r.stdout
    r = kv("test", "--help")
    assert r.returncode == 0 and "-k expression" in r.stdout and "stop at the first failing test" in r.stdout, r.stdout


def test_flash_firmware_writes_each_chip_at_its_own_offset_and_refuses_what_esptool_cannot_flash(tmp_path):
    # every board got `--chip esp32s3 ... write-flash 0x0`: a classic ESP32 needs --chip
    # esp32 at 0x1000 behind its USB-serial bridge (default-reset); an RP2350 or a Linux
    # board is refused; an image for another chip (its header's chip id) is refused
    esp32 = b"\xe9\x03\x02\x20" + bytes(8) + b"\x00\x00" + bytes(70000)
    (tmp_path / "s3.bin").write_bytes(FAKE_IMAGE)
    (tmp_path / "esp32.bin").write_bytes(esp32)
    r = kv("flash-firmware", "--bin", "esp32.bin", "--board", "esp32_wroom32", "--dry-run", "--port", "/dev/ttyUSB0",
           cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    cmd = r.stdout.splitlines()[-1]
    assert "--chip esp32 " in cmd and "write-flash -z 0x1000 " in cmd and "--before default-reset" in cmd, cmd
    r = kv("flash-firmware", "--bin", "s3.bin", "--dry-run", "--port", "/dev/ttyACM0", cwd=str(tmp_path))
    assert r.returncode == 0 and "--chip esp32s3 " in r.stdout and "write-flash -z 0x0 " in r.stdout, r.stdout
    for board in ("rp2350_pico2", "apple_m1_8gb"):
        r = kv("flash-firmware", "--bin", "s3.bin", "--board", board, "--dry-run", cwd=str(tmp_path))
        assert r.returncode == 2 and one_line_error(r) and "is not an ESP32: esptool cannot flash it" in r.stderr, r.stderr
        assert r.stdout == ""
    r = kv("flash-firmware", "--bin", "esp32.bin", "--dry-run", cwd=str(tmp_path))  # an ESP32 image, an S3 board
    assert r.returncode == 2 and "is an image for esp32 (its header's chip id 0), not for the board's esp32s3" in r.stderr
    assert "download the ESP32_GENERIC_S3 build" in r.stderr
    os.mkfifo(tmp_path / "fifo")
    for p, what in ((str(tmp_path / "fifo"), "is a FIFO (named pipe), not a file"), ("/dev/null", "is a character device, not a file")):
        r = kv("flash-firmware", "--bin", p, "--dry-run", timeout=30)
        assert r.returncode == 2 and one_line_error(r) and what in r.stderr, r.stderr


def test_unwritable_outputs_are_one_line_before_any_work(tmp_path):
    # convert --out /proc/x.bin gave a traceback, a path through a file "folder does not
    # exist"; sweep --out/--cache in /proc ran every point, then a traceback. CI runs as
    # root: /proc and /sys refuse new files whatever the modes, a regular file refuses children
    from host import paths

    model = os.path.join(paths.shared_models(), "stories260K.bin")
    if not os.path.isfile(model):
        model = os.path.join(paths.ROOT, "models", "kvrtos-tiny", "model.bin")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, says in (("/proc/x.bin", "cannot be written"), ("/sys/x.bin", "cannot be written"),
                      (str(afile / "x.bin"), "%s is a file, not a folder" % afile),
                      (str(afile / "sub" / "x.bin"), "%s is a file, not a folder" % afile)):
        r = kv("convert", "--model", model, "--out", out)
        assert r.returncode == 2 and one_line_error(r) and says in r.stderr, (out, r.stderr)
    for args in (("--out", "/proc/sw"), ("--cache", "/proc/c"), ("--out", "/sys/sw"), ("--cache", str(afile / "c"))):
        r = kv("sweep", "--boards", "esp32s3_n8r8", "--tokens", "4", *args, timeout=60)
        assert r.returncode == 2 and one_line_error(r) and r.stdout == "", (args, r.stdout, r.stderr)


def test_emulate_refuses_pieces_too_small_to_finish():
    # --piece-bytes 1 ran 15-45x slower (64 tokens of stories260K past 150 s): refused below
    # the decode's own floor, 64 B, whose runs take seconds
    from host import emulate

    for v in ("1", "63"):
        r = kv("emulate", "--piece-bytes", v, "--tokens", "2", timeout=60)
        assert r.returncode == 2 and one_line_error(r) and "at least %d B, got %s" % (emulate.PIECE_MIN, v) in r.stderr, r.stderr
    r = kv("emulate", "--piece-bytes", str(emulate.PIECE_MIN), "--tokens", "2", timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_damaged_model_is_refused_and_no_library_warning_leaks(tmp_path):
    # a byte-flipped stories260K ran to garbage with numpy's overflow RuntimeWarnings on the
    # terminal (generate, emulate, exit 0); ./kv trace on a one-line log leaked matplotlib's
    # "No artists with labels" UserWarning
    import shutil

    from host import paths

    shared = paths.shared_models()
    src = os.path.join(shared or "", "stories260K.bin")
    if not os.path.isfile(src):
        src = os.path.join(paths.ROOT, "models", "kvrtos-tiny", "model.bin")
        tok = os.path.join(paths.ROOT, "models", "kvrtos-tiny", "tokenizer.bin")
    else:
        tok = os.path.join(shared, "tok512.bin")
    bad = tmp_path / "model.bin"
    data = bytearray(open(src, "rb").read())
    mid = len(data) // 2
    for i in range(mid, mid + 4000):
        data[i] ^= 0x5A
    bad.write_bytes(bytes(data))
    shutil.copy(tok, tmp_path / "tokenizer.bin")
    for args in (("generate", "--tokens", "4"), ("emulate", "--tokens", "4"), ("emulate", "--tokens", "4", "--weights", "fp32"),
                 ("flash", "--port", "/dev/null")):
        r = kv(*args, "--model", str(bad), timeout=120)
        assert r.returncode == 2 and one_line_error(r) and "is damaged:" in r.stderr and "Warning" not in r.stderr, (args, r.stderr)
    # an int8 file's damage reaches its scales (max |w| / 127: a trained model's are far below 1)
    from host import convert

    q8, _ = convert.cached_q8row(src)
    data = bytearray(open(q8, "rb").read())
    for i in range(len(data) - 4000, len(data)):
        data[i] ^= 0x5A
    (tmp_path / "q8").mkdir()
    (tmp_path / "q8" / "model.bin").write_bytes(bytes(data))
    shutil.copy(tok, tmp_path / "q8" / "tokenizer.bin")
    r = kv("generate", "--tokens", "4", "--model", str(tmp_path / "q8" / "model.bin"), timeout=120)
    assert r.returncode == 2 and one_line_error(r) and "scales holds" in r.stderr, r.stderr
    log = tmp_path / "one.jsonl"
    log.write_text('{"host_t":1.0,"type":"periodic","seq":1,"ms":10,"core":{"tokens":1}}\n')
    r = kv("trace", str(log), "--out", str(tmp_path / "t"))
    assert r.returncode == 0 and "Warning" not in r.stderr, r.stderr


def test_more_bad_input_found_by_a_new_user(tmp_path):
    # monitor --log through a regular file said "folder ... does not exist"; a wrong
    # $KVRTOS_MICROPYTHON_SRC fell back to ../shared without a word; flash-firmware gave a
    # Linux board the RP2350's advice, and an image for another chip did not name the board
    afile = tmp_path / "afile"
    afile.write_text("x")
    cap = tmp_path / "t.bin"
    cap.write_bytes(b"hi\nthere\n")
    r = kv("monitor", "--replay", str(cap), "--log", str(afile / "x.log"))
    assert r.returncode == 2 and one_line_error(r) and "%s is a file, not a folder" % afile in r.stderr, r.stderr
    r = kv("mp32", env=dict(os.environ, KVRTOS_MICROPYTHON_SRC=str(tmp_path / "nope")))
    assert r.returncode == 2 and one_line_error(r) and "KVRTOS_MICROPYTHON_SRC" in r.stderr and "nope" in r.stderr, r.stderr
    (tmp_path / "fw.bin").write_bytes(FAKE_IMAGE)
    r = kv("flash-firmware", "--bin", str(tmp_path / "fw.bin"), "--board", "apple_m1_8gb", "--dry-run")
    assert r.returncode == 2 and "Linux board" in r.stderr and "RP2350" not in r.stderr, r.stderr
    r = kv("flash-firmware", "--bin", str(tmp_path / "fw.bin"), "--board", "esp32_wroom32", "--dry-run")
    assert r.returncode == 2 and "not for the board's esp32 (--board esp32_wroom32)" in r.stderr, r.stderr


def test_trace_keeps_a_users_own_trace_json(tmp_path):
    # ./kv trace LOG wrote trace.json beside the log over a user's own file, silently
    log = tmp_path / "one.jsonl"
    log.write_text('{"host_t":1.0,"type":"periodic","seq":1,"ms":10,"core":{"tokens":1}}\n')
    (tmp_path / "trace.json").write_text('{"mine": 1}')
    r = kv("trace", str(log))
    assert r.returncode == 2 and one_line_error(r) and "did not write" in r.stderr, r.stderr
    assert (tmp_path / "trace.json").read_text() == '{"mine": 1}'
    r = kv("trace", str(log), "--out", str(tmp_path / "t"))
    assert r.returncode == 0, r.stderr
    r = kv("trace", str(log), "--out", str(tmp_path / "t"))  # its own: written again
    assert r.returncode == 0, r.stderr
