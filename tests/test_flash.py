# kv flash end to end against the virtual board: copies only what changed, verifies
# by sha256 on the device, and converges after a port that vanishes mid-copy.
import hashlib
import os
import shutil

import pytest

from host import boards, flash, link, paths
from host.errors import UserError
from vboard_util import fs_path, kv, one_line_error, start

pytestmark = pytest.mark.vboard
BOARD = boards.load(paths.DEFAULT_BOARD)


def quiet(*a):
    pass


def on_disk(tmp_path, dest):
    p = fs_path(tmp_path, dest)
    if not os.path.exists(p):
        return None
    with open(p, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_first_flash_copies_all_second_nothing_changed_file_only(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(paths.FIRMWARE, src, ignore=shutil.ignore_patterns("__pycache__"))
    arts = flash.build(BOARD, str(src), virtual=True)
    with start(tmp_path) as vb:
        s1 = flash.flash(port=vb.port, src=str(src), out=quiet, reset=False)
        assert s1["copied"] == len(arts) and s1["skipped"] == 0
        # the device's own sha256 of every file matches the build, and so do the bytes on its filesystem
        t = link.connect(vb.port)
        try:
            assert link.device_hashes(t, [a.dest for a in arts]) == [a.sha256 for a in arts]
        finally:
            t.close()
        for a in arts:
            assert on_disk(tmp_path, a.dest) == a.sha256, a.dest
        assert os.path.exists(fs_path(tmp_path, flash.MANIFEST))

        s2 = flash.flash(port=vb.port, src=str(src), out=quiet, reset=False)
        assert s2["copied"] == 0 and s2["skipped"] == len(arts)

        with open(src / "board.py", "a") as f:
            f.write("\n# a change\nCHANGED = 1\n")
        lines = []
        s3 = flash.flash(port=vb.port, src=str(src), out=lines.append, reset=False)
        assert s3["copied"] == 1, lines
        assert any("copy  firmware_py/board.mpy" in ln for ln in lines), lines


def test_port_vanishing_mid_flash_is_reported_and_next_flash_repairs(tmp_path):
    arts = flash.build(BOARD, paths.FIRMWARE, virtual=True)
    total = sum(len(a.data) for a in arts)
    # the port disappears after the host has sent about a third of the bytes
    vb = start(tmp_path, vanish_after=total // 3)
    r = kv("flash", "--port", vb.port)
    vb.stop()
    assert one_line_error(r), (r.returncode, r.stdout, r.stderr)
    assert "vanished" in r.stderr and "run flash again" in r.stderr, r.stderr
    # no file under its real name is half-written: each is absent or complete
    present = [a for a in arts if on_disk(tmp_path, a.dest) is not None]
    assert len(present) < len(arts)
    for a in present:
        assert on_disk(tmp_path, a.dest) == a.sha256, a.dest
    with start(tmp_path) as vb2:
        s = flash.flash(port=vb2.port, out=quiet, reset=False)
        assert s["copied"] == len(arts) - len(present) and s["skipped"] == len(present)
        again = flash.flash(port=vb2.port, out=quiet, reset=False)
        assert again["copied"] == 0
    for a in arts:
        assert on_disk(tmp_path, a.dest) == a.sha256


def test_flash_then_soft_reset_shows_the_boot_report(tmp_path):
    from firmware_py.app import REPORT_END
    from vboard_util import read_until

    with start(tmp_path) as vb:
        summary, ser = flash.flash(port=vb.port, out=quiet, keep_open=True)
        try:
            out = read_until(ser, REPORT_END.encode())
        finally:
            ser.close()
    text = out.decode()
    assert "board        esp32s3_n8r8" in text
    assert "heap         free" in text and "micropython  1." in text
    # the unix port has no machine.freq: the clock is said to be unknown, with the profile's
    assert "cpu          clock n/a on this port (profile: 240 MHz)" in text


def test_build_targets_the_profiles_architecture(tmp_path):
    import platform

    (tmp_path / "fast.py").write_text(
        "from firmware_py.compat import micropython\n@micropython.viper\ndef f(x: int) -> int:\n    return x + 1\n"
    )
    (tmp_path / "main.py").write_text("import fast\n")
    # mpy header byte 2 holds the native architecture in its top 6 bits: 10 = xtensawin, 2 = x64
    board = flash.build(BOARD, str(tmp_path), virtual=False)
    assert [a.dest for a in board] == ["firmware_py/fast.mpy", "main.py", "board.json"]
    assert board[0].data[0] == ord("M") and board[0].data[2] >> 2 == 10
    if platform.machine() == "x86_64":
        host = flash.build(BOARD, str(tmp_path), virtual=True)
        assert host[0].data[2] >> 2 == 2


def test_flash_refuses_a_soc_board():
    with pytest.raises(UserError):
        flash.flash(port="/dev/null", board_name="rk3588_4gb", out=quiet)


def test_files_dropped_from_the_firmware_are_removed(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(paths.FIRMWARE, src, ignore=shutil.ignore_patterns("__pycache__"))
    (src / "extra.py").write_text("X = 1\n")
    with start(tmp_path) as vb:
        flash.flash(port=vb.port, src=str(src), out=quiet, reset=False)
        assert on_disk(tmp_path, "firmware_py/extra.mpy") is not None
        (src / "extra.py").unlink()
        s = flash.flash(port=vb.port, src=str(src), out=quiet, reset=False)
        assert s["removed"] == ["firmware_py/extra.mpy"] and s["copied"] == 0
        assert on_disk(tmp_path, "firmware_py/extra.mpy") is None


def test_flash_without_port_starts_then_reuses_a_virtual_board(tmp_path, monkeypatch):
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    env = dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path / "vb"))
    run = lambda: subprocess.run([sys.executable, "-m", "invoke", "flash"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # noqa: E731
    try:
        r1 = run()
        assert r1.returncode == 0 and "starting one" in r1.stdout, r1.stdout + r1.stderr
        assert "keeps running on" in r1.stdout and "./kv vboard --board esp32s3_n8r8 --stop stops it" in r1.stdout, r1.stdout
        r2 = run()
        assert r2.returncode == 0 and "starting one" not in r2.stdout and " 0 copied" in r2.stdout, r2.stdout + r2.stderr
    finally:
        pidfile = tmp_path / "vb" / paths.DEFAULT_BOARD / "vboard.pid"
        if pidfile.exists():
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)  # "pid start-time"


def test_a_board_error_is_reported_as_the_boards_answer(tmp_path):
    # a directory where flash wants to write a file: the device's own OSError comes back
    os.makedirs(fs_path(tmp_path, "firmware_py/board.mpy.part"))
    with start(tmp_path) as vb:
        r = kv("flash", "--port", vb.port)
    assert one_line_error(r), r.stderr
    assert "the board refused while writing firmware_py/board.mpy: IsADirectoryError" in r.stderr, r.stderr
    assert "vanished" not in r.stderr


# a user's module task, beside its config: the factory raises on boom=1, takes period_us
BOOM = """
class T:
    def __init__(self, k):
        self.k = k
    def task(self):
        while True:
            yield self.k.sleep_us(10000)
    def stats(self):
        return {"ok": 1}
def make(kernel, env, period_us=10000, boom=0):
    if boom:
        raise ValueError("boom in factory")
    return T(kernel)
"""


def _boom_config(tmp_path, args):
    import json

    (tmp_path / "boom.py").write_text(BOOM)
    p = tmp_path / "kvrtos.json"
    p.write_text(json.dumps({"name": "b", "tasks": [{"kind": "module", "name": "meter", "module": "boom",
                                                      "factory": "make", "args": args}]}))
    return p


@pytest.mark.parametrize("args, words", [
    ({"boom": 1}, ("task 'meter'", "factory boom.make raised ValueError: boom in factory")),
    ({"bogus": 1}, ("task 'meter'", "factory boom.make raised TypeError", "bogus")),
])
def test_flash_config_builds_module_tasks_on_the_host_first(tmp_path, args, words):
    # review r5 item 4: a factory that raises or an argument it does not take is one line,
    # exit 2, before any board is looked for (nothing started, nothing flashed)
    p = _boom_config(tmp_path, args)
    env = dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path / "home"))
    r = kv("flash", "--config", str(p), env=env)
    assert one_line_error(r) and r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("kv flash: --config %s: " % p) and all(w in r.stderr for w in words), r.stderr
    assert not (tmp_path / "home").exists()


def test_flash_config_module_check_leaves_the_host_path_as_it_was(tmp_path):
    import sys

    p = _boom_config(tmp_path, {"period_us": 20000})
    path = list(sys.path)
    assert [d for d, _ in flash.config_files(str(p), BOARD)] == ["kvrtos.json", "boom.py"]
    assert sys.path == path and "boom" not in sys.modules
    other = tmp_path / "other"
    other.mkdir()
    p2 = _boom_config(other, {"period_us": 20000})
    (other / "boom.py").write_text(BOOM.replace("if boom:", "if True:").replace("boom in factory", "the other boom.py"))
    with pytest.raises(UserError) as e:
        flash.config_files(str(p2), BOARD)  # the other folder's boom.py, not the one imported before
    assert e.value.code == 2 and "the other boom.py" in str(e.value) and "\n" not in str(e.value)
    assert sys.path == path and "boom" not in sys.modules


def _user_task(tmp_path, prepend="", append="", factory="make"):
    # examples/user-task copied to tmp_path, its meter.py with lines before / after
    import json

    d = tmp_path / "c"
    shutil.copytree(os.path.join(paths.ROOT, "examples", "user-task"), d)
    src = (d / "meter.py").read_text()
    (d / "meter.py").write_text(prepend + src + append)
    cfg = json.loads((d / "kvrtos.json").read_text())
    for t in cfg["tasks"]:
        if t["kind"] == "module":
            t["factory"] = factory
    (d / "kvrtos.json").write_text(json.dumps(cfg))
    return d / "kvrtos.json"


@pytest.mark.parametrize("line, name", [
    ("from machine import Pin\n", "machine"),
    ("import esp32, neopixel\n", "esp32"),
    ("from time import ticks_ms\n", "ticks_ms"),  # MicroPython's name in a module the host has
])
def test_flash_config_board_only_import_is_a_note_not_a_refusal(tmp_path, capsys, line, name):
    # review r6 item 1: a module importing a board-only library at the top is not
    # checkable on the host: flashed all the same, with one note line naming the task and why
    p = _user_task(tmp_path, prepend=line)
    assert [d for d, _ in flash.config_files(str(p), BOARD)] == ["kvrtos.json", "meter.py"]
    notes = capsys.readouterr().out.splitlines()
    assert len(notes) == 1 and "task 'meter' not built on the host" in notes[0] and name in notes[0], notes


@pytest.mark.parametrize("line, words", [
    ("x = undefined_name\n", "NameError"),
    ("from firmware_py.compat import no_such_name\n", "ImportError"),  # kvrtos's own package: on the board too
])
def test_flash_config_other_import_errors_stay_one_line(tmp_path, line, words):
    p = _user_task(tmp_path, prepend=line)
    with pytest.raises(UserError) as e:
        flash.config_files(str(p), BOARD)
    assert e.value.code == 2 and "\n" not in str(e.value) and words in str(e.value) and "meter" in str(e.value)


SPIN = """

class Spin:
    def task(self):
        while True:
            pass
    def stats(self):
        while True:
            pass
def spin(kernel, env, **kw):
    return Spin()
"""


def test_flash_config_task_that_never_yields_is_one_line_not_a_hang(tmp_path):
    # review r6 item 4: task() a plain function that loops: refused (not a generator
    # function) without being called; the dry build never runs task() or stats()
    p = _user_task(tmp_path, append=SPIN, factory="spin")
    env = dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path / "home"))
    r = kv("flash", "--config", str(p), env=env, timeout=60)
    assert one_line_error(r) and r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "task 'meter'" in r.stderr and "task() must be a generator function" in r.stderr, r.stderr
    assert not (tmp_path / "home").exists()


def test_flash_config_generator_task_is_not_run_on_the_host(tmp_path):
    # a generator task() whose body loops without yielding is fine to check: making the
    # generator runs none of it (the board's scheduler would; that is the user's design)
    p = _user_task(tmp_path, append=SPIN.replace("            pass\n    def stats", "            pass\n        yield\n    def stats"),
                   factory="spin")
    assert [d for d, _ in flash.config_files(str(p), BOARD)] == ["kvrtos.json", "meter.py"]


def test_flash_config_import_that_never_returns_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(flash, "GUARD_S", 0.5)
    p = _user_task(tmp_path, prepend="while True:\n    pass\n")
    with pytest.raises(UserError) as e:
        flash.config_files(str(p), BOARD)
    assert e.value.code == 2 and "did not return within" in str(e.value) and "\n" not in str(e.value)


def test_model_goes_on_the_board_as_int8_unless_asked(tmp_path):
    # kv flash --model: an fp32 checkpoint is put on the board as q8row (the integer
    # path's format, int8 KV fits checked), converted on the fly with one note line;
    # --weights fp32 keeps the file as it is
    from firmware_py import llama2c
    from host import boardmodel, paths

    tiny = os.path.join(paths.ROOT, "models", "kvrtos-tiny", "model.bin")
    notes = []
    files, fit, mp = boardmodel.files_for("esp32s3_n8r8", tiny, "", "int8", notes.append)
    data = dict(files)["model.bin"]
    assert data[:4] == llama2c.Q8ROW_MAGIC.to_bytes(4, "little") and fit["kv_dtype"] == "int8"
    assert len(notes) == 1 and "to int8 q8row" in notes[0] and "--weights fp32" in notes[0] and "\n" not in notes[0]
    files, fit, mp = boardmodel.files_for("esp32s3_n8r8", tiny, "", "fp32", notes.append)
    assert dict(files)["model.bin"] == open(tiny, "rb").read() and mp == tiny and len(notes) == 1
    # --weights fp32 with a file that is already int8 is refused in one line (it went on as int8)
    q8 = str(tmp_path / "q8.bin")
    shutil.copy(boardmodel.files_for("esp32s3_n8r8", tiny, "", "int8")[2], q8)
    with pytest.raises(UserError) as e:
        boardmodel.files_for("esp32s3_n8r8", q8, os.path.join(os.path.dirname(tiny), "tokenizer.bin"), "fp32")
    assert e.value.code == 2 and "already int8" in str(e.value) and "\n" not in str(e.value)
