# The virtual board speaks the raw REPL so the real mpremote works against it, takes
# its heap from the board profile, and soft-resets like a board (boot.py/main.py).
import hashlib
import os
import signal
import subprocess
import time

import pytest

from conftest import ROOT
from host import paths
from vboard_util import fs_path, open_serial, read_until, start

pytestmark = pytest.mark.vboard


def mpremote(port, *args):
    r = subprocess.run([paths.tool("mpremote"), "connect", port, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_real_mpremote_exec_copy_hash_and_soft_reset(tmp_path):
    with start(tmp_path) as vb:
        assert mpremote(vb.port, "exec", "print(6 * 7)").strip() == "42"
        src = tmp_path / "data.bin"
        src.write_bytes(bytes(range(256)) * 40)
        out = mpremote(vb.port, "fs", "cp", str(src), ":data.bin", "+", "fs", "sha256sum", ":data.bin")
        assert hashlib.sha256(src.read_bytes()).hexdigest() in out
        with open(fs_path(tmp_path, "data.bin"), "rb") as f:
            assert f.read() == src.read_bytes()
        # mpremote's soft-reset goes through the raw REPL: the board must come back in it
        out = mpremote(vb.port, "exec", "x = 5", "soft-reset", "exec", "print('x' in dir())")
        assert out.strip().endswith("False"), out


def test_soft_reset_at_friendly_repl_runs_boot_and_main(tmp_path):
    with start(tmp_path) as vb:
        with open(fs_path(tmp_path, "boot.py"), "w") as f:
            f.write("print('boot.py ran')\n")
        with open(fs_path(tmp_path, "main.py"), "w") as f:
            f.write("print('main.py ran')\n")
        s = open_serial(vb.port)
        s.write(b"\r\x02")  # ctrl-B: make sure we are at the friendly REPL
        read_until(s, b">>> ")
        s.write(b"\x04")  # ctrl-D: soft reset
        out = read_until(s, b"main.py ran")
        assert b"MPY: soft reboot" in out and out.index(b"boot.py ran") < out.index(b"main.py ran")
        s.close()


def test_ctrl_c_interrupts_a_running_main(tmp_path):
    with start(tmp_path) as vb:
        with open(fs_path(tmp_path, "main.py"), "w") as f:
            f.write("import time\nprint('looping')\nwhile True:\n    time.sleep_ms(5)\n")
        s = open_serial(vb.port)
        s.write(b"\r\x02\x04")
        read_until(s, b"looping")
        s.write(b"\x03")  # ctrl-C: KeyboardInterrupt, back to the REPL
        read_until(s, b"KeyboardInterrupt")
        s.close()
        assert mpremote(vb.port, "exec", "print(1)").strip() == "1"


@pytest.mark.parametrize("board", ["esp32s3_n8r8", "esp32s3_n4r2", "rp2350_pico2"])
def test_heap_comes_from_the_profile(tmp_path, board):
    from host import boards

    want = boards.load(board).mpy_heap
    with start(tmp_path, board=board) as vb:
        total = int(mpremote(vb.port, "exec", "import gc; print(gc.mem_free() + gc.mem_alloc())").strip())
    # the profile gives the usable heap (gc.mem_free() + gc.mem_alloc() on a board): the
    # virtual board sizes -X heapsize so its GC reports at least that, and at most 1 KiB more
    assert want <= total <= want + 1024, (total, want)


def test_second_vboard_for_the_same_board_is_refused_and_stop_stops_it(tmp_path):
    import os
    import sys

    from conftest import ROOT

    home = str(tmp_path / "home")
    env = dict(os.environ, PYTHONPATH=ROOT)
    with start(tmp_path) as vb:
        r = subprocess.run([sys.executable, "-m", "host.vboard", "--home", home], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "already running" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert os.path.exists(vb.port)  # the running one keeps its port
        r = subprocess.run([sys.executable, "-m", "host.vboard", "--home", home, "--stop"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "stopped (pid" in r.stdout, r.stdout + r.stderr
        vb.proc.wait(timeout=10)
        assert not os.path.exists(vb.port)


def test_vboard_starts_with_no_state_folder_yet(tmp_path):
    # a fresh clone has no .vboard/: `./kv vboard` makes its own folders and starts
    home = tmp_path / "fresh" / ".vboard"
    env = dict(os.environ, KVRTOS_VBOARD_HOME=str(home))
    env.pop("KVRTOS_CALLER_CWD", None)
    p = subprocess.Popen([os.path.join(ROOT, "kv"), "vboard"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = home / "esp32s3_n8r8" / "port"
        end = time.monotonic() + 60
        while not port.exists() and p.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        assert port.exists(), "no port appeared; stderr: %s" % (p.stderr.read() if p.poll() is not None else "")
        assert (home / "esp32s3_n8r8" / "fs").is_dir()
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
