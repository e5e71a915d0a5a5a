# `kv monitor`: the board's serial output, line by line, timestamped, echoed and
# logged; survives the port going away (board reset, USB re-enumeration, a virtual
# board restarted) by reopening it when it comes back. Nothing already received is
# dropped: a partial line is flushed to the log when the port is lost. Telemetry
# frame decoding sits on top of this transport (a later issue).
#
# Bytes that are not UTF-8 text reach the log exactly as the board sent them (decoded
# with surrogateescape, written back the same way), so the log is lossless; on the
# console, control and non-printable characters (other than tab) are shown as \xNN
# (\uNNNN above U+00FF), so a stray byte cannot move the cursor or change the terminal.
import os
import re
import stat
import sys
import time

import serial

from host.errors import UserError

RETRY_S = 0.2  # how often a lost port is looked for again
_UNSAFE = re.compile(r"[^\t\x20-\x7e]")  # what may need escaping on the console (ASCII printable and tab pass)


def _stamp():
    # wall-clock timestamp with milliseconds: 12:04:05.123
    t = time.time()
    return time.strftime("%H:%M:%S", time.localtime(t)) + ".%03d" % int((t % 1) * 1000)


class _KeepInput(serial.Serial):
    # pyserial flushes the OS input buffer when it opens a port; a monitor wants what the
    # board printed just before (a boot report after `kv flash`, lines printed while the
    # port was being reopened), so this port never flushes its input
    def _reset_input_buffer(self):
        pass


def _open(port, baud):
    # the port, opened exclusively, input kept
    return _KeepInput(port, baudrate=baud, timeout=0.1, exclusive=True)


def pattern_of(until):
    # the compiled --until regex (None when not given); a bad one is a one-line UserError
    if until is None or until == "":
        return None
    try:
        return re.compile(until)
    except (re.error, OverflowError, RecursionError, ValueError, MemoryError) as e:
        # OverflowError: a repeat count past the engine's limit (a{99999999999});
        # RecursionError: nesting too deep for the compiler; ValueError: NUL and the like
        shown = repr(until) if len(until) <= 60 else repr(until[:60]) + "..."  # a long one, shortened
        raise UserError("--until %s is not a valid regular expression: %s" % (shown, e), 2) from None


def kind_of(mode):
    # what a path with this st_mode is, in words: "a FIFO (named pipe)", "a folder", ...
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a file"


def check_log(path):
    # path, when a log can be appended there; else a one-line UserError saying why not.
    # A regular file or a character device (/dev/null, a terminal) may be a log; a FIFO
    # (opening it waits for a reader), a socket or a block device may not
    if os.path.exists(path) and not os.path.isdir(path):
        mode = os.stat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
            raise UserError("--log %s is %s; give a regular file to append to" % (path, kind_of(os.stat(path).st_mode)), 2)
    if os.path.isdir(path):
        raise UserError("--log %s is a folder; give a file to append to" % path, 2)
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise UserError("--log %s: folder %s does not exist" % (path, folder), 2)
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UserError("--log %s is not writable" % path, 2)
    return path


def check_port(port):
    # port, when it names a character device; else a one-line UserError (code 2)
    if not os.path.exists(port):
        raise UserError("no serial port at %s" % port, 2)
    mode = os.stat(port).st_mode
    if not stat.S_ISCHR(mode):
        raise UserError("%s is not a serial port: it is %s" % (port, kind_of(mode)), 2)
    return port


def port_error(port, e, who="flash? mpremote? a monitor?"):
    # the UserError for a port pyserial could not open: busy (another program holds its
    # lock) or the OS's own reason
    msg = str(e)
    if "lock" in msg.lower():
        return UserError("port %s is busy: another program (%s) has it open" % (port, who))
    why = getattr(e, "strerror", None) or msg.strip().splitlines()[-1] if msg.strip() else type(e).__name__
    return UserError("cannot open port %s: %s" % (port, why))


def open_port(port, baud=115200):
    # a pyserial port opened exclusively; UserError naming the problem when it cannot be
    check_port(port)
    try:
        return _open(port, baud)
    except serial.SerialException as e:
        raise port_error(port, e) from None


def _open_log(path):
    # the log file opened for appending (undecodable bytes written back as they came);
    # UserError when it cannot be. O_NONBLOCK: a FIFO put in its place after the check
    # fails at once (ENXIO) instead of waiting for a reader; fstat refuses what it is
    check_log(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY, 0o666)
    except OSError as e:
        raise UserError("--log %s cannot be opened: %s" % (path, e.strerror or e), 2) from None
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
        os.close(fd)
        raise UserError("--log %s is %s; give a regular file to append to" % (path, kind_of(mode)), 2)
    os.set_blocking(fd, True)
    return open(fd, "a", encoding="utf-8", errors="surrogateescape")


def _escape_char(m):
    # one console-unsafe character as \xNN / \uNNNN (a byte that was not UTF-8 as \xNN)
    c = m.group()
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:  # surrogateescape's stand-in for an undecodable byte
        return "\\x%02x" % (n - 0xDC00)
    if c.isprintable():
        return c
    return "\\x%02x" % n if n < 0x100 else "\\u%04x" % n


def console_text(text):
    # text safe to print on a terminal: control and non-printable characters escaped
    return _UNSAFE.sub(_escape_char, text)


def _text(data):
    # a line's bytes as text, undecodable bytes kept (surrogateescape) for the log
    return data.decode("utf-8", "surrogateescape")


class Monitor:
    # reads a port forever (or until a pattern/time), prints and logs each line
    def __init__(self, port, log_path=None, out=None, baud=115200, reconnect=True, timestamps=True):
        self.port = port  # device path (a stable symlink works for the virtual board)
        self.baud = baud  # bits/s; ignored by USB CDC and ptys
        self.out = out if out is not None else sys.stdout  # where lines are echoed
        self.log_path = log_path  # the --log path, for messages
        self.log = _open_log(log_path) if log_path else None  # log file or None
        self.reconnect = reconnect  # wait for a lost port to come back instead of exiting
        self.timestamps = timestamps  # prefix lines with wall-clock time
        self.partial = b""  # bytes after the last newline
        self.lines = 0  # complete lines received
        self.bytes = 0  # bytes received
        self.losses = 0  # times the port went away
        self.ser = None  # the open pyserial port, or None while lost

    # one line to the console and the log
    def emit(self, text, note=False):
        line = ("[%s] " % _stamp() if self.timestamps else "") + ("[monitor] " if note else "") + text
        self.out.write(console_text(line) + "\n")
        self.out.flush()
        if self.log:
            try:
                self.log.write(line + "\n")
                self.log.flush()
            except OSError as e:
                log, self.log = self.log, None
                try:
                    log.close()
                except OSError:
                    pass  # the same error again, from the buffered rest
                raise UserError("--log %s cannot be written: %s" % (self.log_path, e.strerror or e)) from None

    # split received bytes into lines and emit them; returns the first line matching
    # pattern (what follows it stays unread in self.partial), or None
    def feed(self, data, pattern=None):
        self.bytes += len(data)
        buf = self.partial + data
        while True:
            i = buf.find(b"\n")
            if i < 0:
                break
            text = _text(buf[:i].rstrip(b"\r"))
            buf = buf[i + 1 :]
            self.lines += 1
            self.emit(text)
            if pattern is not None and pattern.search(text):
                self.partial = b""  # the rest is after the line we waited for
                return text
        self.partial = buf
        return None

    # flush a partial line so nothing received is lost
    def flush_partial(self, why="port lost"):
        if self.partial:
            self.emit(_text(self.partial.rstrip(b"\r")) + " [partial line: %s]" % why)
            self.partial = b""

    # reopen the port after a loss; False when deadline passed first
    def _wait_for_port(self, deadline):
        t0 = time.monotonic()
        while deadline is None or time.monotonic() < deadline:
            if os.path.exists(self.port):
                try:
                    self.ser = _open(self.port, self.baud)
                    self.emit("reconnected to %s after %.1f s" % (self.port, time.monotonic() - t0), note=True)
                    return True
                except (serial.SerialException, OSError):
                    pass
            time.sleep(RETRY_S)
        return False

    # read until `until` (a regex, text or compiled) matches a line or `timeout` s pass;
    # returns the matching line or None
    def run(self, until=None, timeout=None, ser=None):
        pattern = pattern_of(until) if isinstance(until, str) else until
        deadline = time.monotonic() + timeout if timeout else None
        self.ser = ser or open_port(self.port, self.baud)
        if ser is None:
            self.emit("connected to %s" % self.port, note=True)
        try:
            while deadline is None or time.monotonic() < deadline:
                try:
                    data = self.ser.read(self.ser.in_waiting or 1)
                except (serial.SerialException, OSError) as e:
                    self.losses += 1
                    self.flush_partial()
                    self.emit("port %s lost (%s); waiting for it to come back" % (self.port, type(e).__name__), note=True)
                    try:
                        self.ser.close()
                    except Exception:
                        pass
                    self.ser = None
                    if not self.reconnect:
                        raise UserError("port %s vanished" % self.port)
                    if not self._wait_for_port(deadline):
                        break
                    continue
                if data:
                    hit = self.feed(data, pattern)
                    if hit is not None:
                        return hit
            return None
        finally:
            self.flush_partial("monitor stopped")
            if self.ser is not None and ser is None:
                self.ser.close()

    def close(self):
        if self.log:
            self.log.close()
            self.log = None
