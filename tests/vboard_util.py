# Helpers for end-to-end tests against a virtual board in a temporary directory.
import os
import pty
import select
import subprocess
import sys
import threading
import time
import tty

import serial

from conftest import ROOT
from host import vboard

KV_INVOKE = [sys.executable, "-m", "host.cli"]  # what ./kv runs after its bootstrap


def start(tmp_path, board="esp32s3_n8r8", **kw):
    # a virtual board whose filesystem and port link live under tmp_path
    return vboard.start(board, fs_dir=str(tmp_path / "fs"), home=str(tmp_path / "home"), **kw)


def kv(*args, timeout=120, cwd=None, env=None):
    # run a task the way a user does; CompletedProcess. cwd=None: invoke from the repo
    # root; cwd=DIR: the ./kv front door typed in DIR (paths resolve there)
    env = dict(os.environ if env is None else env)
    env.pop("KVRTOS_CALLER_CWD", None)  # set by ./kv when the suite itself runs under it
    cmd = KV_INVOKE + list(args) if cwd is None else [os.path.join(ROOT, "kv")] + list(args)
    return subprocess.run(cmd, cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout, env=env)


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


class FakeBoard:
    # a pretend MicroPython board on a pty, for what a real one does only when broken:
    # it answers the raw-REPL handshake and soft reset, then, by `after`,
    #   "silent": never sends another byte;  "close": closes the port at the next byte
    #   it receives;  "answer": answers each raw-REPL command with answer(cmd) -> (out, err)
    def __init__(self, after="silent", answer=None):
        self.after = after  # what it does once the handshake is done
        self.answer = answer  # command bytes -> (stdout bytes, stderr bytes), for "answer"
        self.master, self.slave = pty.openpty()  # our side; a held slave fd keeps the port up
        tty.setraw(self.slave)
        self.port = os.ttyname(self.slave)  # /dev/pts/N
        self.handshakes = 0  # soft resets answered in the raw REPL
        self.commands = []  # raw-REPL commands received (bytes)
        self.closed = False  # True once the port is gone
        self.stop_flag = False  # set by stop()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    # bytes to the host, as the board's UART would send them
    def _send(self, data):
        os.write(self.master, data)

    # the raw REPL, byte by byte: enough of MicroPython's for mpremote
    def _serve(self):
        raw = False
        cmd = b""
        skip = 0
        silent = False
        while not self.stop_flag and not self.closed:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if not ready:
                continue
            try:
                data = os.read(self.master, 4096)
            except OSError:
                continue
            for b in data:
                c = bytes([b])
                if silent:
                    continue
                if self.handshakes and self.after == "close":
                    self.close()
                    return
                if skip:
                    skip -= 1
                elif c == b"\x01":  # ctrl-A: raw REPL
                    raw, cmd = True, b""
                    self._send(b"\r\nraw REPL; CTRL-B to exit\r\n>")
                elif c == b"\x02":  # ctrl-B: friendly REPL
                    raw = False
                    self._send(b"\r\n>>> ")
                elif c == b"\x03":  # ctrl-C
                    cmd = b""
                elif raw and c == b"\x05" and not cmd:  # raw-paste request: "A\x01" follows
                    skip = 2
                    self._send(b"R\x00")  # understood, not supported: plain raw REPL
                elif raw and c == b"\x04" and not cmd:  # ctrl-D, empty command: soft reset
                    self._send(b"OK\r\nMPY: soft reboot\r\nraw REPL; CTRL-B to exit\r\n>")
                    self.handshakes += 1
                    silent = self.after == "silent"
                elif raw and c == b"\x04":  # end of a command: run it
                    self.commands.append(cmd)
                    out, err = self.answer(cmd) if self.answer else (b"", b"NotImplementedError\r\n")
                    self._send(b"OK" + out + b"\x04" + err + b"\x04>")
                    cmd = b""
                elif raw:
                    cmd += c

    # the port disappears, as an unplugged board's does
    def close(self):
        if not self.closed:
            self.closed = True
            for fd in (self.master, self.slave):
                try:
                    os.close(fd)
                except OSError:
                    pass

    # end the serving thread and remove the port
    def stop(self):
        self.stop_flag = True
        self.thread.join(timeout=2)
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
