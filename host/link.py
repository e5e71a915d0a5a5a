# The link to a board: its serial port (a USB device or the virtual board's
# pseudo-terminal), found, checked and opened, and mpremote's raw-REPL transport on it
# with every read under a deadline. The lowest layer of host/: deploy (flash, boardrun,
# calibrate) and the console (monitor) stand on it; it imports only the virtual board
# (host/vboard.py) and the errors.
#
# Every exchange with the board has a deadline: the board must send a byte within
# answer_timeout seconds of the last byte either way, or the exchange stops with one
# line (mpremote itself would wait forever on a board that answers the handshake, then
# falls silent).
import ast
import contextlib
import io
import os
import stat
import time

import serial

from host import paths, vboard
from host.errors import UserError

ANSWER_TIMEOUT = 10.0  # s the board may stay silent while an answer is due
_POLL_S = 0.05  # s one read of the port waits before the deadline is checked again
CONNECT_S = 15.0  # s for each try of connect_twice (interrupt, soft reset, banner): connect's 10 s and a margin

# Runs on the device: sha256 hex of each path in P (None when absent). Reads in
# 512-byte chunks so a large file does not need its size in RAM.
HASH_SCRIPT = """
import hashlib, binascii
def _kvh(p):
    try:
        f = open(p, 'rb')
    except OSError:
        return None
    h = hashlib.sha256()
    b = bytearray(512)
    m = memoryview(b)
    while True:
        n = f.readinto(b)
        if not n:
            break
        h.update(m[:n])
    f.close()
    return binascii.hexlify(h.digest()).decode()
print(repr([_kvh(p) for p in %r]))
"""


class BoardSilent(serial.SerialException):
    # the board sent nothing for the answer timeout while an answer was due
    pass


class Answering:
    # a pyserial port whose reads give up after `timeout` s without a byte either way
    # (mpremote reads with no deadline); OS errors become SerialException (port lost)
    def __init__(self, ser, timeout):
        ser.timeout = _POLL_S  # so a read returns to check the deadline
        self.__dict__["ser"] = ser  # the pyserial port
        self.__dict__["timeout"] = timeout  # s of silence allowed
        self.__dict__["last"] = time.monotonic()  # when a byte last went either way
        self.__dict__["until"] = None  # monotonic deadline for the whole exchange (raw-REPL entry), or None

    # forward what is not wrapped (close, rts, dtr, is_open, ...) to the port
    def __getattr__(self, name):
        return getattr(self.ser, name)

    # set attributes (rts, dtr, timeout) on the port itself, as mpremote expects
    def __setattr__(self, name, value):
        setattr(self.ser, name, value)

    # raise BoardSilent once the board has been silent too long
    def _due(self):
        if time.monotonic() - self.last > self.timeout:
            raise BoardSilent("no answer for %g s" % self.timeout)

    # give the exchange that starts now `seconds` in all (None: no overall deadline)
    def deadline(self, seconds):
        self.__dict__["until"] = None if seconds is None else time.monotonic() + seconds

    # raise BoardSilent once the whole exchange is past its deadline, even while bytes
    # keep coming (a port that streams noise never goes silent)
    def _overall(self):
        if self.until is not None and time.monotonic() > self.until:
            raise BoardSilent("no raw REPL prompt within %g s" % self.timeout)

    # the port's own call, an OS error turned into SerialException (the port is gone)
    def _call(self, fn, *args):
        try:
            return fn(*args)
        except serial.SerialException:
            raise
        except OSError as e:
            raise serial.SerialException("port failed: %s" % e) from None

    # write bytes; restarts the answer clock
    def write(self, data):
        n = self._call(self.ser.write, data)
        self.__dict__["last"] = time.monotonic()
        return n

    # n bytes, waiting at most the answer timeout between bytes
    def read(self, n=1):
        got = b""
        while len(got) < n:
            self._overall()
            chunk = self._call(self.ser.read, n - len(got))
            if chunk:
                got += chunk
                self.__dict__["last"] = time.monotonic()
            else:
                self._due()
        return got

    # bytes waiting; raises BoardSilent when none came for the answer timeout
    def inWaiting(self):  # noqa: N802 (mpremote's name)
        self._overall()
        n = self._call(lambda: self.ser.in_waiting)
        if n == 0:
            self._due()
        return n

    # pyserial's modern name for inWaiting(), under the same deadline
    @property
    def in_waiting(self):
        return self.inWaiting()


def is_virtual(port):
    # True when port is a pseudo-terminal (the virtual board), not a USB serial device
    real = os.path.realpath(port)
    return real.startswith("/dev/pts/") or real.startswith("/dev/ttyp")


def usb_port(board):
    # the first USB serial port with the profile's VID (0x303A for an ESP32-S3), or None
    from serial.tools import list_ports

    if board.usb_vid is not None:
        for p in list_ports.comports():
            if p.vid == board.usb_vid:
                return p.device
    return None


kind_of = paths.kind_of  # what a path is, in words


MEM_MAJOR = 1  # Linux's memory devices: /dev/null, /dev/zero, /dev/full, /dev/random


def check_port(port):
    # port, when it names a character device; else a one-line UserError (code 2)
    if not os.path.exists(port):
        raise UserError("no serial port at %s" % port, 2)
    st = os.stat(port)
    mode = st.st_mode
    if not stat.S_ISCHR(mode):
        raise UserError("%s is not a serial port: it is %s" % (port, kind_of(mode)), 2)
    if os.major(st.st_rdev) == MEM_MAJOR:  # not opened: opening a real port can reset the board (DTR)
        raise UserError("%s is not a serial port: it is a memory device (/dev/null, /dev/zero, ...)" % port, 2)
    return port


def port_error(port, e, who="flash? mpremote? a monitor?"):
    # the UserError for a port pyserial could not open: busy (another program holds its
    # lock) or the OS's own reason
    msg = str(e)
    if "lock" in msg.lower():
        return UserError("port %s is busy: another program (%s) has it open" % (port, who))
    why = getattr(e, "strerror", None) or msg.strip().splitlines()[-1] if msg.strip() else type(e).__name__
    return UserError("cannot open port %s: %s" % (port, why))


def find_port(board):
    # the board on USB, else the running virtual board, else None
    return usb_port(board) or vboard.running_port(board.name)


def connect(port, answer_timeout=ANSWER_TIMEOUT):
    # an mpremote SerialTransport in raw REPL on port, every read under the answer
    # timeout; UserError when the port is missing, busy or has no MicroPython on it
    from mpremote.transport import TransportError
    from mpremote.transport_serial import SerialTransport

    check_port(port)
    try:
        t = SerialTransport(port, baudrate=115200)
    except (TransportError, serial.SerialException, OSError) as e:
        # mpremote says only "failed to access": ask pyserial why (busy: another holds its lock)
        try:
            serial.Serial(port, exclusive=True).close()
        except (serial.SerialException, OSError) as why:
            raise port_error(port, why, who="a monitor? mpremote?") from None
        raise UserError("cannot open port %s: %s" % (port, str(e).strip() or type(e).__name__)) from None
    t.serial = Answering(t.serial, answer_timeout)
    try:
        # soft reset on the way in, as mpremote does: a running firmware (and the KV arena
        # it allocated) is gone, so the copy has the whole heap to work in; mpremote
        # prints what it got on failure: our one line says it instead
        # the whole entry (interrupt, soft reset, banner) within the answer timeout
        # (mpremote checks its own timeouts only while nothing arrives: noise never ends it)
        t.serial.deadline(answer_timeout)
        with contextlib.redirect_stdout(io.StringIO()):
            t.enter_raw_repl(soft_reset=True, timeout_overall=answer_timeout)
        t.serial.deadline(None)
    except (TransportError, serial.SerialException, OSError) as e:
        close(t)
        if not os.path.exists(port):
            raise UserError("port %s vanished while entering the raw REPL" % port) from None
        if isinstance(e, BoardSilent) or "could not enter raw repl" in str(e):
            raise UserError("no MicroPython raw REPL on %s: no prompt within %g s (--timeout)" % (port, answer_timeout)) from None
        raise UserError("no MicroPython raw REPL on %s (%s)" % (port, str(e).strip() or type(e).__name__)) from None
    return t


def close(t):
    # close a transport whose port may already be gone
    try:
        t.close()
    except Exception:
        pass


def device_hashes(t, dests):
    # sha256 hex (or None) of each device path, computed on the device
    out = t.exec(HASH_SCRIPT % (list(dests),)).decode("utf-8", "replace").strip()
    try:
        got = ast.literal_eval(out.splitlines()[-1])
    except (ValueError, SyntaxError, IndexError):
        got = None
    if not isinstance(got, list) or len(got) != len(dests):
        raise UserError("the board's answer to the sha256 query was not understood: %r" % out[-80:])
    return got


# the raw REPL on port (connect: Ctrl-C, soft reset, banner), tried twice: a board
# still rebooting (right after `kv flash` soft-reset it) can drop the interrupt that
# starts the raw REPL. A board that answers neither try runs something Ctrl-C does not
# stop, or is no MicroPython: the error says what to do (generate and monitor --start have no --timeout)
def connect_twice(port, seconds):
    try:
        return connect(port, seconds)
    except UserError as e:
        if "raw REPL" not in str(e):
            raise
    try:
        return connect(port, seconds)
    except UserError as e:
        if "no prompt within" not in str(e):
            raise
        raise UserError("no MicroPython raw REPL on %s: no prompt within %g s, twice (the board ignores Ctrl-C "
                        "or runs no MicroPython): reset it (its reset button; a virtual board: ./kv vboard --stop, "
                        "then start it again) and run this again" % (port, seconds)) from None


# the port of the board: the one given, else an ESP32-S3 on USB, else the running virtual board
def port_of(port, board_name=paths.DEFAULT_BOARD):
    if port:
        return port
    from host import boards  # noqa: PLC0415

    b = boards.load(board_name)
    p = find_port(b)
    if p is not None:
        return p
    # a virtual board of another profile (./kv flash --board B started it)
    up = [(n, vboard.running_port(n)) for n in boards.names()]
    up = [(n, q) for n, q in up if q]
    if len(up) == 1:
        return up[0][1]
    if up:
        raise UserError("several virtual boards are running (%s): say which with --port" % ", ".join(
            "%s on %s" % nq for nq in up), 2)
    raise UserError("no ESP32-S3 on USB and no virtual board running: start one (./kv vboard) and "
                    "./kv flash --model PATH, or give --port", 2)
