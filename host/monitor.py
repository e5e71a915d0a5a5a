# `kv monitor`: the board's serial output, line by line, timestamped, echoed and
# logged; survives the port going away (board reset, USB re-enumeration, a virtual
# board restarted) by reopening it when it comes back. Nothing already received is
# dropped: a partial line is flushed to the log when the port is lost.
#
# Telemetry (docs/telemetry.md): the bytes go through host/console.StreamDecoder first;
# the board's ordinary text continues into the line log above exactly as before, every
# frame goes to the JSONL log (--jsonl), every byte to the raw capture (--capture), and
# the figures to a rich dashboard on a terminal (plain status lines once a second of
# board time otherwise). Commands go back over the same framing (send_command).
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

from firmware_py import telemetry as tm
from host import console as con
from host import dashboard
from host import link, options, paths
from host.errors import UserError

RETRY_S = 0.2  # how often a lost port is looked for again
DONE_GRACE_S = 0.5  # --until-done: read this long after the last done event (its last periodic frames)
SERVE_ANSWER_S = 5.0  # commands wait for serve's first telemetry frame this long (it sends one a period)
SERVE_BOOT_S = 60.0  # ... and after --start, this long: serve's boot (model, pool, the config's tasks) comes first
JUDGE_BYTES = 1 << 20  # --replay: the bytes judged before the replay (no capture: one line, nothing shown)
SILENT_S = 15.0  # --until-done: a serve that answered and then sends no frame this long has stopped (it sends
# one every period, 0.1 s by default, whatever the decode does: its slices are bounded)
# serve has ended on the board (its requests never will): the raw REPL's end of a run
# ("\x04" then its error text then "\x04>"), a soft reboot (sys.exit: serve's one-line error
# exits 2; a board's raw REPL then soft-resets), the raw REPL's banner
_RAW_END = b"\x04>"
_ENDED = ("soft reboot", "raw REPL; CTRL-B to exit")
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


def check_log(path, opt="--log"):
    # path, when a log can be appended there; else a one-line UserError saying why not.
    # A regular file or a character device (/dev/null, a terminal) may be a log; a FIFO
    # (opening it waits for a reader), a socket or a block device may not
    if os.path.exists(path) and not os.path.isdir(path):
        mode = os.stat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
            raise UserError("%s %s is %s; give a regular file to append to" % (opt, path, link.kind_of(os.stat(path).st_mode)), 2)
    if os.path.isdir(path):
        raise UserError("%s %s is a folder; give a file to append to" % (opt, path), 2)
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        up = paths.existing_part(folder)
        if up and os.path.exists(up) and not os.path.isdir(up):
            raise UserError("%s %s: %s is a file, not a folder" % (opt, path, up), 2)
        raise UserError("%s %s: folder %s does not exist" % (opt, path, folder), 2)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise UserError("%s %s is not writable" % (opt, path), 2)
    why = None if os.path.exists(path) else paths.cannot_write_in(folder)  # /proc, /sys: root's access() says yes
    if why:
        raise UserError("%s %s cannot be written: %s" % (opt, path, why), 2)
    return path


def open_port(port, baud=115200):
    # a pyserial port opened exclusively; UserError naming the problem when it cannot be
    link.check_port(port)
    try:
        return _open(port, baud)
    except serial.SerialException as e:
        raise link.port_error(port, e) from None


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
        raise UserError("--log %s is %s; give a regular file to append to" % (path, link.kind_of(mode)), 2)
    os.set_blocking(fd, True)
    return open(fd, "a", encoding="utf-8", errors="surrogateescape")


def _open_append(path, opt, binary):
    # a JSONL log or raw capture opened for appending; the same checks as --log
    check_log(path, opt)
    try:
        return open(path, "ab" if binary else "a", encoding=None if binary else "utf-8")
    except OSError as e:
        raise UserError("%s %s cannot be opened: %s" % (opt, path, e.strerror or e), 2) from None


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


_NOT_TEXT_B = re.compile(rb"[\x01-\x06\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]")  # console._NOT_TEXT, in bytes
EXIT_KEY = 0x1D  # Ctrl-]: leave the monitor (as idf.py monitor and miniterm)
MENU_KEY = 0x14  # Ctrl-T: the next key is a menu command
MENU_HELP = ("--- Ctrl-] leaves the monitor; Ctrl-T then: r reset the board, p pause/resume the display (the log goes on), "
             "h this help, x leave, Ctrl-T or Ctrl-] send that key itself ---")


class Keys:
    # the terminal's keys while an interactive monitor runs (stdin a terminal): no line
    # editing, no echo, no signals (Ctrl-C goes to the board), Enter as CR; restored by close()
    def __init__(self, fd):
        import termios

        self.fd = fd
        self.old = termios.tcgetattr(fd)
        new = termios.tcgetattr(fd)
        new[0] &= ~(termios.ICRNL | termios.IXON)
        new[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)
        new[6][termios.VMIN] = 0
        new[6][termios.VTIME] = 0
        termios.tcsetattr(fd, termios.TCSANOW, new)
        self.menu = False  # Ctrl-T was the last key
        import signal

        def restore_and_end(signum, frame):  # killed (SIGTERM, a closed terminal): the terminal as it was
            self.close()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, restore_and_end)

    # the bytes typed since the last call (b"" when none), never waiting
    def read(self):
        import select

        if not select.select([self.fd], [], [], 0)[0]:
            return b""
        try:
            return os.read(self.fd, 256)
        except OSError:
            return b""

    def close(self):
        import termios

        try:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.old)
        except (termios.error, OSError):
            pass


class Monitor:
    # reads a port forever (or until a pattern/time), prints and logs each line
    def __init__(self, port, log_path=None, out=None, baud=115200, reconnect=True, timestamps=True, jsonl_path=None,
                 capture_path=None, view="auto", status_every_ms=1000):
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
        self.decoder = con.StreamDecoder()  # frames out of the byte stream
        self.state = dashboard.State()  # the board's figures as the frames update them
        self.jsonl_path = jsonl_path
        self.jsonl = _open_append(jsonl_path, "--jsonl", binary=False) if jsonl_path else None  # a line per frame
        self.capture_path = capture_path
        self.capture = _open_append(capture_path, "--capture", binary=True) if capture_path else None  # every byte
        if view == "auto":
            view = "dashboard" if getattr(self.out, "isatty", lambda: False)() else "plain"
        self.view = view  # "dashboard" (rich Live), "plain" (status lines) or "quiet" (frames only logged)
        self.status_every_ms = status_every_ms  # plain view: a status line per this much board time
        self.last_status_ms = None  # board ms of the last plain status line
        self.gen_line = ""  # plain view: generated text not yet printed (up to a newline)
        self.board_text = []  # the last lines of board text (dashboard)
        self.live = None  # rich Live while the dashboard runs
        self.last_draw = 0.0
        self.done_events = 0  # "done" events seen (a request ended)
        self.cmd_refused = []  # the save and resume commands the board refused ("save", "resume"), in order
        self.prompts_refused = 0  # prompt commands the board refused
        self.prompts_sent = 0  # prompt commands sent
        self.not_text = 0  # bytes of the text that a board's text never holds (controls: a random file)
        self.left = False  # interactive: the user left (Ctrl-])
        self.cmd_seq = 0  # sequence number of the next command sent
        self.on_frame = None  # fn(frame dict) after each frame, or None (tests, tools)
        self.quiet = False  # --until matched: what follows is still logged, no longer shown
        self.serve_ended = None  # why serve on the board has ended (its error line), once seen
        self.serve_line = None  # the last "serve: ..." line the board printed
        self.layout_asked = False  # the layout was asked for (attached to a running serve), once
        self.layout_start = False  # a layout's start (its part 1, or a whole one) was seen
        self.last_frame_t = None  # host time (monotonic) of the last good frame
        self.error_line = None  # the last line of a traceback the board printed
        self._traceback = False  # inside a traceback: its first unindented line is the error
        self.keys = None  # Keys while interactive: typed keys go to the board, its text shows as it comes
        self.col = 0  # interactive: characters of board text on the screen's current line
        self.paused = False  # interactive: the display held (Ctrl-T p); the log goes on
        self.native_usb = False  # the board's port is its own USB (CDC): a reset is a soft one

    # one line to the console and the log
    def emit(self, text, note=False, show=True):
        line = ("[%s] " % _stamp() if self.timestamps else "") + ("[monitor] " if note else "") + text
        if show and not self.quiet and not (self.paused and not note):
            if self.col:  # interactive: the board's open line ends before this one
                self.out.write("\n")
                self.col = 0
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

    # received bytes: to the capture, through the frame decoder; text into lines (see
    # feed_text), frames to the log / state / view. Returns the first text line matching
    # pattern, or None
    def feed(self, data, pattern=None):
        self.bytes += len(data)
        if self.capture:
            self.capture.write(data)
            self.capture.flush()
        return self._decoded(self.decoder.feed(data), pattern)

    # the line went quiet (a read came back empty): the start of the stream the decoder
    # held back (it might have been the tail of a frame) is text after all
    def settle(self, pattern=None):
        return self._decoded(self.decoder.settle(), pattern)

    def _decoded(self, items, pattern):
        hit = None
        for kind, v in items:
            if kind == "text":
                h = self.feed_text(v, pattern if hit is None else None)
                if hit is None:
                    hit = h
            elif kind == "frame":
                self.frame(v)
        return hit

    # one decoded frame: JSONL log, state, view
    def frame(self, f):
        self.last_frame_t = time.monotonic()
        if self.jsonl:
            try:
                self.jsonl.write(con.jsonl_line(f) + "\n")
                self.jsonl.flush()
            except OSError as e:
                self.jsonl = None
                raise UserError("--jsonl %s cannot be written: %s" % (self.jsonl_path, e.strerror or e)) from None
        self.state.update(f)
        if f.get("type") == "layout":
            part = con.layout_part(f.get("layout", {}))
            self.layout_start = self.layout_start or part is None or part[0] == 1
        if not self.layout_asked and not self.layout_start and self.ser is not None:
            # attached to a serve already running: its layout (the tasks' and tiers' names, the
            # pool's size), or its first part, went by before; a good frame says serve reads
            # commands, so ask for it again (once)
            self.layout_asked = True
            try:
                self.send_command("layout")
            except (serial.SerialException, OSError):
                pass  # the port went: the read loop sees it
        if f.get("restart"):
            self.last_status_ms = None  # a new run of the board: its first status line at once
        if f.get("type") == "event":
            for e in f.get("events", []):
                if e.get("event") == "done":
                    self.done_events += 1
                elif e.get("event") == "ack" and e.get("status", 0) < 0 and e.get("type") in (tm.T_CMD_SAVE, tm.T_CMD_RESUME):
                    self.cmd_refused.append("save" if e.get("type") == tm.T_CMD_SAVE else "resume")
                elif e.get("event") == "ack" and e.get("status", 0) < 0 and e.get("type") == tm.T_CMD_PROMPT:
                    self.prompts_refused += 1
                if self.view == "plain":
                    self._plain(dashboard.event_line(e, self.state), "event")
        elif f.get("type") == "text" and self.view == "plain":
            self.gen_line += f.get("text", "")
            while "\n" in self.gen_line:
                line, self.gen_line = self.gen_line.split("\n", 1)
                self._plain(line, "text")
        elif f.get("type") == "periodic" and self.view == "plain":
            ms = self.state.ms
            if self.last_status_ms is None or ms - self.last_status_ms >= self.status_every_ms or ms < self.last_status_ms:
                self.last_status_ms = ms
                self._plain(self.state.line(), "status")
        if self.on_frame is not None:
            self.on_frame(f)
        self.draw()

    # a plain-view line on the console (not the text log: that is the board's text)
    def _plain(self, text, what):
        if self.quiet:
            return
        line = ("[%s] " % _stamp() if self.timestamps else "") + "[%s] " % what + text
        self.out.write(console_text(line) + "\n")
        self.out.flush()

    # the generated text not yet printed (plain view), at the end of a run
    def flush_generated(self):
        if self.view == "plain" and self.gen_line:
            self._plain(self.gen_line, "text")
            self.gen_line = ""

    # redraw the dashboard (at most 5 times a second)
    def draw(self, force=False):
        if self.view != "dashboard" or (self.quiet and not force):
            return
        now = time.monotonic()
        if not force and now - self.last_draw < 0.2:
            return
        self.last_draw = now
        if self.live is None:
            from rich.console import Console
            from rich.live import Live

            self.live = Live(console=Console(file=self.out), auto_refresh=False, transient=False)
            self.live.start()
        w, h = self.live.console.size  # the terminal's, now (it may have been resized): the dashboard fits it
        self.live.update(dashboard.render(self.state, self.decoder.counts(), self.board_text[-6:], width=w, height=h),
                         refresh=True)

    # send a command frame to the board (console.command's kinds: prompt, stop, config, layout)
    def send_command(self, kind, **kw):
        data = con.command(kind, seq=self.cmd_seq, **kw)
        if kind == "prompt":
            self.prompts_sent += 1
        self.cmd_seq = (self.cmd_seq + 1) & 0xFFFF
        if self.ser is None:
            raise UserError("port %s is not open: the command %s was not sent" % (self.port, kind))
        self.ser.write(data)
        self.ser.flush()
        return data

    # the counts at the end (--json)
    def summary(self):
        c = self.decoder.counts()
        return {"port": self.port, "bytes": self.bytes, "lines": self.lines, "losses": self.losses,
                "frames": {k: c[k] for k in ("good", "corrupt", "truncated", "dropped", "skipped", "restarts", "duplicates",
                                              "body_errors", "partial_at_start", "partial_bytes")},
                "frames_by_type": c["by_type"], "rejected": c["rejected"], "text_bytes": c["text_bytes"],
                "requests_done": self.done_events, "tokens": self.state.core.get("tokens")}

    # split text bytes into lines and emit them; returns the first line matching pattern,
    # or None. The console stops at that line (self.quiet): the lines after it, already
    # received, still go to the log (and a partial line to it at the end), never dropped
    def feed_text(self, data, pattern=None):
        self.not_text += len(_NOT_TEXT_B.findall(data))
        raw = self.keys is not None and self.view == "plain"
        if raw and not self.quiet and not self.paused:
            self._show_raw(data)
        buf = self.partial + data
        hit = None
        while True:
            i = buf.find(b"\n")
            if i < 0:
                break
            text = _text(buf[:i].rstrip(b"\r"))
            buf = buf[i + 1 :]
            self.lines += 1
            self.emit(text, show=not raw)  # interactive: shown as it came (_show_raw), logged here
            self._watch(text)
            if self.view == "dashboard" and not self.quiet:
                self.board_text.append(console_text(text))
                del self.board_text[:-50]
            if hit is None and pattern is not None and pattern.search(text):
                hit = text
                self.quiet = True
        self.partial = buf
        if _RAW_END in buf and self.serve_ended is None:
            self._ended("the raw REPL came back")
        return hit

    # the board's lines that say serve has ended (or why): kept for run()'s stop_on_end
    def _watch(self, text):
        t = text.replace("\x04", "").strip()
        if "Traceback (most recent call last)" in t:
            self._traceback = True
        elif self._traceback and t and not text[:1].isspace():
            self.error_line = t
            self._traceback = False
        if t.startswith("serve: "):
            self.serve_line = t
        if self.serve_ended is None and ("\x04" in text or any(t.startswith(e) or t.endswith(e) for e in _ENDED)):
            self._ended("the raw REPL came back" if "\x04" in text else t)

    def _ended(self, how):
        self.serve_ended = how

    # the board's error line for a serve that ended: its traceback's last line or its
    # last "serve: ..." line (serve's one-line error), else how it was seen to end
    def serve_error(self):
        return self.error_line or self.serve_line or self.serve_ended

    # interactive: the board's text on the screen as it comes (the REPL's echo, its prompt,
    # a line being edited), each line begun with its timestamp
    def _show_raw(self, data):
        out = []
        for ch in _text(data):
            if self.col == 0 and ch not in "\r\n" and self.timestamps:
                out.append("[%s] " % _stamp())
            out.append(ch)
            self.col = 0 if ch == "\n" else self.col + 1
        w = "".join(out)
        b = getattr(self.out, "buffer", None)
        if b is not None:
            b.write(w.encode("utf-8", "surrogateescape"))
        else:
            self.out.write(w)
        self.out.flush()

    # interactive: what was typed goes to the board, but the exit key and the menu's; True:
    # leave the monitor
    def keys_poll(self):
        data = self.keys.read()
        send = bytearray()
        for c in data:
            if self.keys.menu:
                self.keys.menu = False
                if c in (MENU_KEY, EXIT_KEY):
                    send.append(c)
                elif c in (ord("x"), ord("q"), 0x18):
                    self._send(send)
                    return True
                elif c in (ord("r"), 0x12):
                    self._send(send)
                    send = bytearray()
                    self.reset_board()
                elif c in (ord("p"), 0x10):
                    self.paused = not self.paused
                    self.emit("display %s (the log goes on)" % ("paused" if self.paused else "resumed"), note=True)
                else:
                    self.emit(MENU_HELP, note=True)
            elif c == EXIT_KEY:
                self._send(send)
                return True
            elif c == MENU_KEY:
                self.keys.menu = True
            else:
                send.append(c)
        self._send(send)
        return False

    def _send(self, b):
        if b and self.ser is not None:
            try:
                self.ser.write(bytes(b))
                self.ser.flush()
            except (serial.SerialException, OSError):
                pass  # the read that follows sees the loss

    # the menu's reset: a USB-UART bridge's EN line (RTS, with DTR high: run, not the
    # bootloader), as esptool and idf.py monitor pulse it; a native USB port or a virtual
    # board: a soft reset (Ctrl-C twice, which ends serve, then Ctrl-D at the REPL)
    def reset_board(self):
        if self.ser is None:
            return
        if self.native_usb or link.is_virtual(self.port):
            self.emit("soft reset (Ctrl-C, Ctrl-C, Ctrl-D)", note=True)
            self._send(b"\x03\x03")
            time.sleep(0.2)
            self._send(b"\x04")
            return
        self.emit("reset: EN pulled low by RTS for 100 ms", note=True)
        try:
            self.ser.dtr = False
            self.ser.rts = True
            time.sleep(0.1)
            self.ser.rts = False
        except (serial.SerialException, OSError, ValueError):
            self.emit("the port has no RTS line: reset the board with its button", note=True)

    # flush a partial line so nothing received is lost (a frame cut by the loss is
    # counted as truncated)
    def flush_partial(self, why="port lost"):
        for kind, v in self.decoder.flush(why):
            if kind == "text":
                self.partial += v
        if self.partial:
            raw = self.keys is not None and self.view == "plain"  # shown as it came already
            self.emit(_text(self.partial.rstrip(b"\r")) + " [partial line: %s]" % why, show=not raw)
            self.partial = b""

    # reopen the port after a loss; False when deadline passed first
    def _wait_for_port(self, deadline):
        t0 = time.monotonic()
        while deadline is None or time.monotonic() < deadline:
            if self.keys is not None and self.keys_poll():  # Ctrl-] while the port is gone
                self.left = True
                return False
            if os.path.exists(self.port):
                try:
                    self.ser = _open(self.port, self.baud)
                    self.emit("reconnected to %s after %.1f s" % (self.port, time.monotonic() - t0), note=True)
                    return True
                except (serial.SerialException, OSError):
                    pass
            time.sleep(RETRY_S)
        return False

    # read until `until` (a regex, text or compiled) matches a line, `until_done`
    # requests have ended (done events), or `timeout` s pass; returns the matching line
    # (or "done") or None. on_open(monitor) runs at serve's first good telemetry frame
    # (commands), waited for answer_s; started: serve was just started (the wait's message).
    # stop_on_end: serve was started for these requests, so serve ending on the board
    # (its error line, the raw REPL or a soft reboot back, the port lost: the board's
    # process ended) stops the run at once (after DONE_GRACE_S for the rest of its error
    # text): self.serve_ended says so, serve_error() the board's line
    def run(self, until=None, timeout=None, ser=None, until_done=0, on_open=None, stop_on_end=False,
            answer_s=SERVE_ANSWER_S, started=False):
        pattern = pattern_of(until) if isinstance(until, str) else until
        deadline = time.monotonic() + timeout if timeout else None
        self.quiet = False
        self.ser = ser or open_port(self.port, self.baud)
        if ser is None:
            self.emit("connected to %s" % self.port, note=True)
        # commands go only to a serve that has answered: on_open runs at the first good frame
        # (a board at its REPL would take the frame's bytes as typed input)
        pending = on_open
        answer_s = answer_s if deadline is None else max(0.0, min(answer_s, deadline - time.monotonic()))
        answer_by = time.monotonic() + answer_s
        grace = None  # once until_done requests have ended: read until this time, then return
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
                    if stop_on_end:
                        self._ended("port %s lost: the board reset or went away" % self.port)
                        break
                    if not self.reconnect:
                        raise UserError("port %s vanished" % self.port)
                    if not self._wait_for_port(deadline):
                        break
                    if self.last_frame_t is not None:
                        self.last_frame_t = time.monotonic()  # the silence counts from the port's return
                    continue
                hit = self.feed(data, pattern) if data else self.settle(pattern)
                if self.keys is not None and self.keys_poll():
                    return "exit"
                if pending is not None:
                    if self.decoder.counts()["good"]:
                        pending(self)
                        pending = None
                    elif time.monotonic() >= answer_by and started:
                        raise UserError("serve, started on %s, sent no telemetry frame within %.3g s: its boot failed or "
                                        "is still loading; nothing was sent" % (self.port, answer_s), 1)
                    elif time.monotonic() >= answer_by:
                        raise UserError("no kvrtos serve answered on %s within %.3g s (no telemetry frame): the board is "
                                        "at its REPL or runs other code, and a command would be typed into it; "
                                        "--start runs serve first" % (self.port, answer_s), 2)
                if hit is not None:
                    return hit  # the rest of what was read is logged (feed_text); the logs flushed below
                if (until_done and grace is None and self.last_frame_t is not None and self.done_events < until_done
                        and time.monotonic() - self.last_frame_t > SILENT_S):
                    raise UserError("the board stopped answering: no telemetry frame for %g s with %d of %d requests "
                                    "not ended (a hung or stopped board, or serve killed; --start runs it again)"
                                    % (SILENT_S, until_done - self.done_events, until_done), 1)
                if data and until_done and self.done_events >= until_done and grace is None:
                    grace = time.monotonic() + DONE_GRACE_S  # the frames sent after the done event
                if data and until_done and self.cmd_refused and (self.prompts_refused or not self.prompts_sent) and grace is None:
                    grace = time.monotonic() + DONE_GRACE_S  # a refused resume, and the prompt after it refused: over
                if stop_on_end and self.serve_ended is not None and grace is None:
                    grace = time.monotonic() + DONE_GRACE_S  # the rest of the board's error text
                if grace is not None and time.monotonic() >= grace:
                    return "done" if until_done and self.done_events >= until_done else None
            return None
        finally:
            self.flush_partial("monitor stopped")
            self.flush_generated()
            if self.ser is not None and ser is None:
                self.ser.close()

    # decode a recorded capture (raw bytes, as --capture writes them) as if it came from
    # the port; the same outputs. UserError when the file cannot be read
    def replay(self, path, chunk=4096, limit=None):
        # limit: read at most this many bytes (None: the whole file)
        try:
            f = open(path, "rb")
        except OSError as e:
            raise UserError("--replay %s cannot be read: %s" % (path, e.strerror or e), 2) from None
        with f:
            if os.path.isdir(path):
                raise UserError("--replay %s is a folder" % path, 2)
            left = limit
            while left is None or left > 0:
                try:
                    data = f.read(chunk if left is None else min(chunk, left))
                except OSError as e:
                    raise UserError("--replay %s cannot be read: %s" % (path, e.strerror or e), 2) from None
                if not data:
                    break
                if left is not None:
                    left -= len(data)
                self.feed(data)
        self.settle()  # the capture ended: what the decoder held back for a frame's tail is text, as a quiet live line
        self.flush_partial("end of the capture")
        self.flush_generated()
        self.draw(force=True)

    def close(self):
        if self.live is not None:
            self.draw(force=True)
            self.live.stop()
            self.live = None
        for name in ("log", "jsonl", "capture"):
            f = getattr(self, name)
            if f:
                try:
                    f.close()
                except OSError:
                    pass
                setattr(self, name, None)


DEFAULT_BOARD = "esp32s3_n8r8"
DEFAULT_TOKENS = 64
NATIVE_USB_VID = 0x303A  # Espressif's own USB (the S3's USB-Serial-JTAG and CDC): no EN line to pulse


def _is_tty(f):
    try:
        return f.isatty()
    except (AttributeError, ValueError):
        return False


def _foreground():
    # this process runs in the terminal's foreground (a background job that set the terminal's
    # modes would be stopped by SIGTTOU)
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except OSError:
        return False


def _board_of(port, board):
    # the profile of the board on `port`: the one whose USB vendor id the port has (a given
    # --port: its USB-UART bridge or native USB decides the reset and the baud), else `board`'s
    from host import boards  # noqa: PLC0415

    if port and not link.is_virtual(port):
        try:
            from serial.tools import list_ports

            real = os.path.realpath(port)
            vid = next((p.vid for p in list_ports.comports() if os.path.realpath(p.device) == real), None)
        except Exception:  # noqa: BLE001 - no port listing on this host: the named profile
            vid = None
        if vid is not None:
            for name in boards.names():
                try:
                    b = boards.load(name)
                except UserError:
                    continue
                if b.usb_vid == vid:
                    return b
    return boards.load(board)


def _given(v, *defaults):
    # an option the user typed: not None / "" and not its default (tasks.py hands the
    # defaults over as they are, int or text)
    return v not in (None, "") and str(v) not in {str(d) for d in defaults}


def check_needs(board=None, until=None, timeout=None, replay=None, port=None, start=False, prompt=None, tokens=None,
                until_done=None, link_bps=None):
    # options that only matter with another one: one UserError (code 2) naming what the
    # first such option needs, instead of ignoring it. --tokens and --board are None
    # unless typed (main fills in their defaults), so any value typed counts: 64, '' too
    if tokens is not None and prompt is None:
        raise UserError("--tokens needs --prompt: it is how many tokens the prompt asks for", 2)
    if _given(link_bps, 0) and not start:
        raise UserError("--link-bps needs --start: it is the rate the started firmware_py.serve paces telemetry to", 2)
    if replay is not None:
        for v, opt in ((until, "--until"), (until_done, "--until-done"), (timeout, "--timeout")):
            if _given(v, 0) if opt == "--until-done" else _given(v):
                raise UserError("%s needs a port: --replay decodes the whole capture" % opt, 2)
    if board is not None and (port is not None or replay is not None):
        raise UserError("--board only picks the port to find: it is not used with %s" % ("--port" if port is not None else "--replay"), 2)


def _judge_capture(m, path):
    # a replayed file that was no capture of a board: empty, or neither frames nor text
    # (random bytes: controls board text never holds) is one line and exit 1, after the lines
    if m.bytes == 0:
        raise UserError("--replay %s is empty: nothing was decoded" % path, 1)
    c = m.decoder.counts()
    if c["good"] == 0 and (c["corrupt"] > 0 or m.not_text * 10 > max(1, c["text_bytes"])):
        raise UserError("--replay %s holds no good telemetry frame (%d corrupt) and is not text (%d of its %d text bytes are "
                        "controls a board's text never holds): not a capture of a kvrtos board" % (
                            path, c["corrupt"], m.not_text, c["text_bytes"]), 1)


def start_serve(port, link_bps=0, out=print, opts=None):
    # run firmware_py.serve.main() on the board at port over the raw REPL and leave it
    # running (the port is closed again for the monitor); UserError when it cannot be.
    # The raw REPL as generate --runtime board enters it: two tries (a board still
    # rebooting after ./kv flash may drop the first Ctrl-C), then a line that says to
    # reset the board (link.connect's own hint names flash's --timeout, and monitor's
    # --timeout is how long to watch, not how long the board may stay silent)
    t = link.connect_twice(port, link.CONNECT_S)
    try:
        have = link.device_hashes(t, ["firmware_py/serve.mpy", "firmware_py/telemetry.mpy"])
        if None in have:
            raise UserError("the board on %s has no telemetry firmware (firmware_py/serve): run ./kv flash first" % port, 2)
        # the decode options go to serve.main itself, so that its boot (before the kernel
        # runs the config's tasks) is made with them: a config command after it would boot
        # again, inside the input task
        kw = dict(opts or {})
        if link_bps:
            kw["link_bps"] = link_bps
        args = ", ".join("%s=%r" % (k, kw[k]) for k in sorted(kw))
        t.exec_raw_no_follow("from firmware_py import serve\nserve.main(%s)\n" % args)
    finally:
        link.close(t)
    out("monitor: started firmware_py.serve on %s" % port)


# ./kv monitor: a port (or --replay FILE) through the Monitor, commands sent once serve
# has answered (its first telemetry frame), a summary at the end
def main(port=None, board=None, log=None, until=None, timeout=None, jsonl=None, capture=None, replay=None,
         as_json=False, plain=False, start=False, prompt=None, tokens=None, policy=None, window=None, kv_dtype=None,
         stop=False, until_done=0, link_bps=0, out=None, save=None, resume=None, baud=None, keys=None):
    # keys: an interactive monitor (typed keys to the board, Ctrl-] leaves, Ctrl-T the menu);
    # None: when stdin is a terminal (and not --replay or --json)
    import json

    from firmware_py import kv

    check_needs(board=board, until=until, timeout=timeout, replay=replay, port=port, start=start, prompt=prompt,
                tokens=tokens, until_done=until_done, link_bps=link_bps)
    board = DEFAULT_BOARD if board is None else board  # '' is refused by boards.load, below
    tokens = DEFAULT_TOKENS if tokens is None else tokens  # '' is refused by options.whole, below
    pattern = pattern_of(until)  # a bad regex is refused before the port is opened
    for path, opt in ((log, "--log"), (jsonl, "--jsonl"), (capture, "--capture")):
        if path is not None:
            check_log(path, opt)
    tokens = options.whole(tokens, "--tokens", 1, options.TOKENS_MAX)
    until_done = options.whole(until_done, "--until-done", 0)
    link_bps = options.whole(link_bps, "--link-bps", 0)
    if link_bps and not 100 <= link_bps <= 1000000:
        raise UserError("--link-bps must be 100..1000000 bytes/s, got %d" % link_bps, 2)
    if policy is not None and policy not in kv.POLICIES:
        raise UserError("--policy must be one of %s, got %r" % (", ".join(kv.POLICIES), policy), 2)
    if kv_dtype is not None and kv_dtype not in kv.DTYPES:
        raise UserError("--kv-dtype must be one of %s, got %r" % (", ".join(kv.DTYPES), kv_dtype), 2)
    if window is not None:
        window = options.whole(window, "--window", 1, options.WINDOW_MAX)
    for v, opt in ((save, "--save"), (resume, "--resume")):
        if v is not None:
            options.snapshot_name(v, opt)
    sends = (policy is not None or kv_dtype is not None or window is not None or prompt is not None or stop
             or save is not None or resume is not None)
    if replay is not None:
        if port is not None or start or sends:
            raise UserError("--replay decodes a file: --port, --start and commands need a board", 2)
        paths.regular_file(replay, "--replay")  # a folder, a FIFO or /dev/null: not "no such file"
        for path, opt in ((log, "--log"), (jsonl, "--jsonl"), (capture, "--capture")):
            if path is not None and os.path.exists(path) and os.path.samefile(path, replay):
                # --capture appended the bytes it read to the file it read: it never ended
                raise UserError("%s %s is the --replay file; write to another file" % (opt, path), 2)
        # judged first, with nothing shown or written: a file that is no capture of a board
        # (empty, random bytes) is one line, not its bytes escaped line by line, nor empty logs
        with open(os.devnull, "w") as sink:
            pre = Monitor(replay, out=sink, view="quiet", timestamps=False)
            pre.replay(replay, limit=JUDGE_BYTES)  # its first MiB: a capture shows frames or text long before that
            _judge_capture(pre, replay)
    elif port is None:
        port = link.port_of(None, board)
    if replay is None:
        link.check_port(port)
    out = out if out is not None else sys.stdout
    if keys is None:
        keys = replay is None and not as_json and _is_tty(sys.stdin) and _is_tty(out) and _foreground()
    brd = _board_of(port, board)
    baud = brd.console_baud if baud is None else options.whole(baud, "--baud", 1200, 4000000)
    view = "plain" if plain or as_json or keys else "auto"
    m = Monitor(port or replay, log_path=log, out=out if not as_json else sys.stderr, jsonl_path=jsonl,
                capture_path=capture, view=view, baud=baud)
    m.native_usb = brd.usb_vid == NATIVE_USB_VID
    hit = None
    try:
        if replay is not None:
            m.replay(replay)
        else:
            cfg = {k: v for k, v in (("policy", policy), ("window", window), ("kv_dtype", kv_dtype)) if v is not None}
            if start:
                start_serve(port, link_bps, out=lambda s: m.emit(s, note=True), opts=cfg)
                cfg = {}  # serve booted with them

            def commands(mon):
                # a config starts a new conversation on the board: before the resume. A save sent
                # while the prompt's request runs is made when it ends
                if cfg:
                    mon.send_command("config", **cfg)
                if resume is not None:
                    mon.send_command("resume", name=resume)
                if prompt is not None:
                    mon.send_command("prompt", text=prompt, tokens=tokens)
                if save is not None:
                    mon.send_command("save", name=save)
                if stop:
                    mon.send_command("stop")

            # serve started here, or a prompt sent: serve ending on the board ends the wait. Commands
            # wait for serve's first frame (after --start, its boot), and only when any is left to send
            left = bool(cfg) or prompt is not None or stop or save is not None or resume is not None
            if keys:
                m.keys = Keys(sys.stdin.fileno())
                m.emit("interactive: what you type goes to the board; Ctrl-] leaves, Ctrl-T h shows the menu", note=True)
            hit = m.run(until=pattern, timeout=timeout, until_done=until_done, on_open=commands if left else None,
                        stop_on_end=bool(until_done) and (start or prompt is not None),
                        answer_s=SERVE_BOOT_S if start else SERVE_ANSWER_S, started=start)
    finally:
        if m.keys is not None:
            m.keys.close()
        m.close()
    if hit == "exit" or m.left:  # left with Ctrl-]
        return m
    if as_json:
        print(json.dumps(m.summary(), indent=1, sort_keys=True))
    if pattern is not None and hit is None and replay is None:
        raise UserError("no line matched --until %r within %g s" % (until, timeout or 0))
    if replay is not None:
        _judge_capture(m, replay)
    if m.cmd_refused and replay is None:  # its line ("serve: resume refused: ...") was shown above
        raise UserError("the board refused the %s (its reason is the serve line above)" % " and the ".join(m.cmd_refused), 1)
    if until_done and m.done_events < until_done and replay is None and m.serve_ended is not None:
        raise UserError("serve ended on the board after %d of %d requests: %s" % (m.done_events, until_done, m.serve_error()))
    if until_done and m.done_events < until_done and replay is None:
        raise UserError("%d of %d requests ended within %g s" % (m.done_events, until_done, timeout or 0))
    return m
