# Helpers for end-to-end tests against a virtual board in a temporary directory.
import os
import subprocess
import sys
import time

import serial

from conftest import ROOT
from host import vboard

KV_INVOKE = [sys.executable, "-m", "invoke"]


def start(tmp_path, board="esp32s3_n8r8", **kw):
    # a virtual board whose filesystem and port link live under tmp_path
    return vboard.start(board, fs_dir=str(tmp_path / "fs"), home=str(tmp_path / "home"), **kw)


def kv(*args, timeout=120):
    # run a task the way a user does (invoke from the repo root); CompletedProcess
    return subprocess.run(KV_INVOKE + list(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def read_until(ser, marker, timeout=10.0):
    # bytes from a pyserial port up to and including marker (AssertionError on timeout)
    buf = b""
    end = time.monotonic() + timeout
    while marker not in buf:
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for %r; got %r" % (marker, buf[-500:]))
        buf += ser.read(ser.in_waiting or 1)
    return buf


def send(port, data):
    # write bytes to a port without opening it as a serial client (another may hold it)
    fd = os.open(os.path.realpath(port), os.O_WRONLY | os.O_NOCTTY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def open_serial(port):
    return serial.Serial(port, timeout=0.1)


def one_line_error(r):
    # the process failed with exactly one line on stderr and no traceback
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    return r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr + r.stdout


def wait_for(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def fs_path(tmp_path, rel):
    return os.path.join(str(tmp_path / "fs"), rel)
