# `./kv repl`: the board's MicroPython REPL on the port every command finds (mpremote is
# installed in .venv, not on the user's PATH: getting-started's `mpremote connect ... repl`
# was "command not found"). Against the virtual board, in a terminal: a line typed runs on
# the board, Ctrl-] leaves it. Without a terminal or a board: one line, exit 2.
import os
import pty
import select
import subprocess
import time

from conftest import ROOT
from vboard_util import kv, one_line_error, start


def _read_until(fd, marker, timeout=20.0):
    buf = b""
    end = time.monotonic() + timeout
    while marker not in buf:
        left = end - time.monotonic()
        assert left > 0, "timed out waiting for %r; got %r" % (marker, buf[-400:])
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
    assert marker in buf, (marker, buf[-400:])
    return buf


def test_repl_runs_a_line_on_the_virtual_board_and_ctrl_close_bracket_leaves(tmp_path):
    h = start(tmp_path)
    main, sub = pty.openpty()
    try:
        p = subprocess.Popen([os.path.join(ROOT, "kv"), "repl", "--port", h.port], stdin=sub, stdout=sub, stderr=sub,
                             cwd=ROOT, close_fds=True)
        os.close(sub)
        _read_until(main, b"Use Ctrl-] or Ctrl-x to exit")
        os.write(main, b"\r")
        _read_until(main, b">>> ")
        os.write(main, b"print(6 * 7)\r")
        _read_until(main, b"42")
        os.write(main, b"\x1d")  # Ctrl-]
        assert p.wait(timeout=20) == 0
    finally:
        os.close(main)
        h.stop()


def test_repl_without_a_terminal_or_a_board_is_one_line(tmp_path):
    h = start(tmp_path)
    try:
        r = kv("repl", "--port", h.port)  # stdin and stdout are pipes here
        assert one_line_error(r) and r.returncode == 2 and "run it in a terminal" in r.stderr, r.stderr
    finally:
        h.stop()
    r = kv("repl", "--port", str(tmp_path / "nope"))
    assert one_line_error(r) and r.returncode == 2 and "no serial port at" in r.stderr, r.stderr
