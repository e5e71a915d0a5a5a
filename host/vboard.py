# The virtual board: MicroPython's unix port behind a pseudo-terminal, heap from the
# board profile, filesystem in a directory, speaking the raw REPL so that the real
# mpremote (and `kv flash`, `kv monitor`) work against it exactly as against a USB
# serial port. The wrapper adds what the unix port lacks: soft reset. When the
# interpreter exits (Ctrl-D at the REPL, sys.exit, a crash) it is restarted like a
# board after a soft reset: boot.py, then main.py unless the reset came from the raw
# REPL, where the board comes back in raw mode as mpremote expects.
#
#   host  <->  user pty (its path: .vboard/NAME/port)  <->  this relay  <->  child pty  <->  micropython
import argparse
import errno
import fcntl
import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import termios
import time
import tty

from host import boards, paths
from host.errors import UserError

BOOT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vboard_boot.py")
RAW_BANNER = b"raw REPL; CTRL-B to exit\r\n"  # the raw REPL's greeting
FRIENDLY_PROMPT = b">>> "  # the friendly REPL's prompt
_TAIL = 64  # bytes of recent output kept to spot prompts split across reads


def state_dir(name):
    # .vboard/NAME: the default home of a virtual board (fs/, port, vboard.pid)
    return os.path.join(paths.VBOARD_HOME, name)


def port_link(name):
    # the stable path of a virtual board's port: a symlink to its current pty
    return os.path.join(state_dir(name), "port")


def _started(pid):
    # when process pid started (clock ticks after boot, /proc/PID/stat field 22), or None
    # when it is gone or the system has no /proc
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_file(home):
    # (pid, start time) from home/vboard.pid, or None when absent or unreadable
    try:
        with open(os.path.join(home, "vboard.pid")) as f:
            parts = f.read().split()
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else None
    except (OSError, ValueError, IndexError):
        return None


def running_pid(home):
    # pid of the live virtual board whose state directory is home, or None. The pid file
    # holds the pid and its process's start time: a pid the OS has since given to
    # another program (a stale file) has another start time and is not ours.
    entry = _pid_file(home)
    if entry is None:
        return None
    pid, start = entry
    try:
        os.kill(pid, 0)
    except OSError:
        return None
    if os.path.isdir("/proc") and (start is None or _started(pid) != start):
        return None
    return pid


def forget_stale(home):
    # remove a pid file and port link that no live virtual board owns; the stale pid or None
    entry = _pid_file(home)
    if entry is None or (running_pid(home) is not None and _is_vboard(entry[0])):
        return None
    for p in (os.path.join(home, "vboard.pid"), os.path.join(home, "port")):
        try:
            os.remove(p)
        except OSError:
            pass
    return entry[0]


def stop_hint(board_arg, home=None):
    # the command that stops the virtual board started with --board board_arg (and --home)
    if home:
        return "python -m host.vboard --board %s --home %s --stop" % (shlex.quote(board_arg), shlex.quote(home))
    return "./kv vboard%s --stop" % ("" if board_arg == paths.DEFAULT_BOARD else " --board " + shlex.quote(board_arg))


# kernel filesystems: files cannot live there (or should not: /dev), so no board's either
SPECIAL_FS = ("proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
              "pstore", "bpf", "configfs", "fusectl", "mqueue", "hugetlbfs", "efivarfs", "binfmt_misc", "autofs")


def _fs_type(path):
    # the type of the filesystem path lies on (/proc/self/mounts, longest mount point), or None
    real = os.path.realpath(path)
    best, kind = "", None
    try:
        with open("/proc/self/mounts") as f:
            for ln in f:
                parts = ln.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        return None
    return kind


def check_fs(fs_dir):
    # fs_dir, when it is a folder we can create files in, or can become one in a folder
    # that exists (only the last level is created); else a one-line UserError
    if not fs_dir:
        return fs_dir
    if os.path.exists(fs_dir) and not os.path.isdir(fs_dir):
        raise UserError("--fs %s is a file; the board's filesystem must be a folder" % fs_dir, 2)
    where = fs_dir if os.path.isdir(fs_dir) else os.path.dirname(os.path.abspath(fs_dir))
    if not os.path.isdir(where):
        raise UserError("--fs %s: folder %s does not exist (only the last level is created)" % (fs_dir, where), 2)
    kind = _fs_type(where)
    if kind in SPECIAL_FS:
        raise UserError("--fs %s is on %s, a kernel filesystem; give a folder on a disk" % (fs_dir, kind), 2)
    if not os.access(where, os.W_OK | os.X_OK) or not _can_create(where):
        raise UserError("--fs %s: cannot create files in %s" % (fs_dir, where), 2)
    return fs_dir


def _can_create(folder):
    # True when a file can be created (and removed) in folder
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=".kvrtos-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    try:
        os.remove(probe)
    except OSError:
        pass
    return True


def _is_vboard(pid):
    # True when process pid's command line is a virtual board's (python -m host.vboard,
    # or ./kv vboard, which serves in its own process); True without /proc to read
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            args = f.read().split(b"\0")
    except FileNotFoundError:
        return not os.path.isdir("/proc")
    except OSError:
        return False
    return b"host.vboard" in args or b"vboard" in args


def running_port(name):
    # the port path of a live virtual board for this profile, or None
    link = port_link(name)
    if running_pid(state_dir(name)) is None:
        return None
    return link if os.path.exists(link) else None


def stop_running(home, timeout=5.0):
    # stop the virtual board running from state directory home; its pid, or None if none ran
    pid = running_pid(home)
    if pid is None or not _is_vboard(pid):
        return None  # pid and start time match, but the process is not a virtual board: not ours to kill
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while running_pid(home) == pid and time.monotonic() < deadline:
        time.sleep(0.05)
    if running_pid(home) == pid:
        os.kill(pid, signal.SIGKILL)
    return pid


class VirtualBoard:
    # one virtual board process: owns the user pty and (re)starts the interpreter
    def __init__(self, board, fs_dir=None, home=None, vanish_after=None, quiet=False):
        self.board = board  # validated firmware_py.board.Board
        self.home = home or state_dir(board.name)  # holds port link and pid file
        self.fs_dir = os.path.abspath(fs_dir or os.path.join(self.home, "fs"))  # the board's filesystem
        self.fs_given = fs_dir is not None  # the user named the folder (else it is ours, under home)
        self.exe, word = interpreter()
        self.heap = boards.unix_heapsize(board.mpy_heap or 2 * 1024 * 1024, word)  # -X heapsize giving the profile's usable heap
        self.vanish_after = vanish_after  # fault injection: vanish after this many host bytes, or None
        self.quiet = quiet  # no status lines on stdout
        self.link = os.path.join(self.home, "port")  # stable port path for clients
        self.master = -1  # host side of the user pty (we read/write it)
        self.slave_keep = -1  # a held-open fd of the user pty's slave, so clients may come and go
        self.child = None  # subprocess.Popen of the interpreter, or None
        self.child_fd = -1  # our side of the interpreter's pty
        self.raw = False  # True while the interpreter sits in its raw REPL
        self.entering_raw = False  # after a raw soft reset: swallow the banner, send Ctrl-A
        self.sent_ctrl_a = False  # Ctrl-A already sent during entering_raw
        self.held = b""  # output held back while entering_raw
        self.tail = b""  # last _TAIL bytes of interpreter output
        self.from_host = 0  # bytes received from the host since start
        self.dropped = 0  # output bytes dropped because no host was reading and the pty was full
        self.restarts = 0  # soft resets so far
        self.stopping = False  # set by SIGTERM/SIGINT

    # open the user-facing pty and publish its path; returns the pty path
    def open_port(self):
        if not self.fs_given:
            # the default filesystem sits in our own state folder: make it (a fresh clone has none)
            try:
                os.makedirs(self.home, exist_ok=True)
            except OSError as e:
                raise UserError("cannot make the board's folder %s: %s" % (self.home, e.strerror), 2) from None
        check_fs(self.fs_dir)
        try:
            if not os.path.isdir(self.fs_dir):
                os.mkdir(self.fs_dir)  # the last level only: check_fs saw its parent
            os.makedirs(self.home, exist_ok=True)
        except OSError as e:
            raise UserError("cannot make the board's folders (%s): %s" % (e.filename, e.strerror), 2) from None
        self.master, slave = pty.openpty()
        tty.setraw(slave)
        self.slave_keep = slave
        fl = fcntl.fcntl(self.master, fcntl.F_GETFL)
        fcntl.fcntl(self.master, fcntl.F_SETFL, fl | os.O_NONBLOCK)
        path = os.ttyname(slave)
        tmp = self.link + ".new"
        if os.path.lexists(tmp):
            os.remove(tmp)
        os.symlink(path, tmp)
        os.replace(tmp, self.link)
        with open(os.path.join(self.home, "vboard.pid"), "w") as f:
            f.write("%d %d\n" % (os.getpid(), _started(os.getpid()) or 0))  # pid, start time
        return path

    # start the interpreter on a fresh pty; raw=True skips main.py and re-enters raw REPL
    def spawn(self, raw):
        master, slave = pty.openpty()
        # Raw bytes both ways, but keep ISIG: while the interpreter runs code it
        # restores these settings, so Ctrl-C becomes SIGINT -> KeyboardInterrupt,
        # as the interrupt character does on a board's UART.
        tty.setraw(slave)
        attrs = termios.tcgetattr(slave)
        attrs[3] |= termios.ISIG
        termios.tcsetattr(slave, termios.TCSANOW, attrs)

        def make_controlling_tty():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        env = dict(os.environ)
        env.pop("MICROPYPATH", None)
        cmd = [self.exe, "-X", "heapsize=%d" % self.heap, "-i", BOOT_SCRIPT]
        if raw:
            cmd.append("raw")
        self.child = subprocess.Popen(
            cmd, cwd=self.fs_dir, stdin=slave, stdout=slave, stderr=slave,
            preexec_fn=make_controlling_tty, close_fds=True, env=env,
        )
        os.close(slave)
        self.child_fd = master
        self.entering_raw = raw
        self.sent_ctrl_a = False
        self.held = b""
        self.tail = b""
        self.raw = False

    # write to the host; drops (and counts) what a full, unread pty cannot take
    def to_host(self, data):
        while data:
            try:
                n = os.write(self.master, data)
            except BlockingIOError:
                self.dropped += len(data)
                return
            data = data[n:]

    # track raw/friendly REPL state from interpreter output
    def _track(self, data):
        window = self.tail + data
        r = window.rfind(RAW_BANNER)
        f = window.rfind(FRIENDLY_PROMPT)
        if r >= 0 or f >= 0:
            self.raw = r > f
        self.tail = window[-_TAIL:]

    # interpreter output: held back while re-entering raw mode, else relayed
    def from_child(self, data):
        if not self.entering_raw:
            self._track(data)
            self.to_host(data)
            return
        self.held += data
        if not self.sent_ctrl_a and FRIENDLY_PROMPT in self.held:
            os.write(self.child_fd, b"\x01")  # ctrl-A: enter raw REPL
            self.sent_ctrl_a = True
        i = self.held.find(RAW_BANNER)
        if i >= 0:
            banner = self.held.find(b"MicroPython ")
            before = self.held[:banner] if banner >= 0 else b""  # boot.py output, if any
            rest = self.held[i:]
            self.entering_raw = False
            self.held = b""
            self._track(rest)
            self.to_host(before + rest)

    # the interpreter exited: restart it like a soft reset
    def restart(self):
        if self.child is not None:
            try:
                self.child.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()
        if self.child_fd >= 0:
            os.close(self.child_fd)
            self.child_fd = -1
        raw = self.raw
        self.restarts += 1
        self.to_host(b"soft reboot\r\n" if raw else b"MPY: soft reboot\r\n")
        self.spawn(raw)

    # relay bytes until stopped
    def serve(self):
        while not self.stopping:
            fds = [self.master, self.child_fd]
            try:
                ready, _, _ = select.select(fds, [], [], 0.5)
            except InterruptedError:
                continue
            if self.child_fd in ready:
                try:
                    data = os.read(self.child_fd, 4096)
                except OSError as e:
                    if e.errno != errno.EIO:
                        raise
                    data = b""
                if data:
                    self.from_child(data)
                else:
                    self.restart()
                    continue
            if self.master in ready:
                try:
                    data = os.read(self.master, 4096)
                except (BlockingIOError, InterruptedError):
                    data = b""
                except OSError as e:
                    if e.errno != errno.EIO:
                        raise
                    data = b""  # no host has the port open right now
                if data:
                    self.from_host += len(data)
                    if self.vanish_after is not None and self.from_host >= self.vanish_after:
                        # fault injection: the port disappears mid-transfer, like an unplugged cable
                        os.write(self.child_fd, data[: max(0, len(data) - (self.from_host - self.vanish_after))])
                        self.vanish()
                    os.write(self.child_fd, data)
            if self.child is not None and self.child.poll() is not None and self.child_fd not in ready:
                # exited without closing its pty cleanly
                self.restart()

    # close everything at once, as an unplugged board would
    def vanish(self):
        self.close()
        os._exit(3)

    # stop the interpreter and remove the port
    def close(self):
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        for fd in (self.child_fd, self.master, self.slave_keep):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.child_fd = self.master = self.slave_keep = -1
        for p in (self.link, os.path.join(self.home, "vboard.pid")):
            try:
                if os.path.islink(p) or os.path.exists(p):
                    os.remove(p)
            except OSError:
                pass

    # open the port, start the interpreter and serve until SIGTERM/SIGINT
    def run(self):
        path = self.open_port()

        def stop(signum, frame):
            self.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.spawn(raw=False)
        if not self.quiet:
            print("vboard %s: port %s (stable path %s)" % (self.board.name, path, os.path.abspath(self.link)))
            print("vboard %s: heap %d B usable (-X heapsize=%d), filesystem %s; Ctrl-C to stop"
                  % (self.board.name, self.board.mpy_heap, self.heap, self.fs_dir))
            sys.stdout.flush()
        try:
            self.serve()
        finally:
            self.close()
        if not self.quiet:
            print("vboard %s: stopped after %d soft resets; %d output bytes dropped because no host was reading"
                  % (self.board.name, self.restarts, self.dropped))


class Handle:
    # a virtual board running as a child process of this one (tests, demo, flash)
    def __init__(self, proc, link, home):
        self.proc = proc  # subprocess.Popen of `python -m host.vboard`
        self.port = link  # stable port path
        self.home = home  # state directory

    # stop it (SIGTERM, then SIGKILL)
    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


INTERP_ENV = "KVRTOS_VBOARD_MICROPYTHON"  # another unix-port MicroPython for the board (./kv mp32's: the chip's 32-bit word)


def interpreter():
    # (the unix port the virtual board runs, its word bytes): $KVRTOS_VBOARD_MICROPYTHON when
    # set (a path; the word size from the name's "32" or asked), else the 64-bit PyPI one
    exe = os.environ.get(INTERP_ENV)
    if not exe:
        return paths.tool("micropython"), 8
    if not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        raise UserError("%s=%s is not an executable MicroPython" % (INTERP_ENV, exe), 2)
    exe = os.path.abspath(exe)  # the board runs in its filesystem folder
    try:
        r = subprocess.run([exe, "-c", "import sys\nprint(sys.maxsize > 2**32)"], capture_output=True, text=True, timeout=20)
    except (subprocess.TimeoutExpired, OSError) as e:
        raise UserError("%s=%s did not run as a MicroPython (%s)" % (INTERP_ENV, exe, e), 2) from None
    if r.returncode != 0 or r.stdout.strip() not in ("True", "False"):
        raise UserError("%s=%s did not run as a MicroPython (%s)" % (INTERP_ENV, exe, (r.stderr.strip() or "no answer")[-120:]), 2)
    return exe, 8 if r.stdout.strip() == "True" else 4


def start(board_name, fs_dir=None, home=None, vanish_after=None, detach=False, timeout=20.0):
    # start a virtual board in the background; returns a Handle once its port is up
    b = boards.load(board_name)
    check_fs(fs_dir)
    interpreter()  # a bad KVRTOS_VBOARD_MICROPYTHON is one line here, not a child that exits at start
    home = os.path.abspath(home or state_dir(b.name))
    pid = running_pid(home)
    if pid is not None:
        raise UserError("a virtual %s is already running from %s (pid %d); stop it with: %s" % (b.name, home, pid, stop_hint(board_name)))
    link = os.path.join(home, "port")
    if os.path.lexists(link):
        os.remove(link)
    cmd = [sys.executable, "-m", "host.vboard", "--board", boards.path_of(board_name), "--home", home, "--quiet"]
    if fs_dir:
        cmd += ["--fs", os.path.abspath(fs_dir)]
    if vanish_after is not None:
        cmd += ["--vanish-after-bytes", str(vanish_after)]
    os.makedirs(home, exist_ok=True)
    log = open(os.path.join(home, "vboard.log"), "ab")
    proc = subprocess.Popen(
        cmd, cwd=paths.ROOT, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        start_new_session=detach, env=dict(os.environ, PYTHONPATH=paths.ROOT),
    )
    log.close()
    deadline = time.monotonic() + timeout
    while not os.path.exists(link):
        if proc.poll() is not None:
            raise UserError("virtual board %s exited at start (log: %s)" % (b.name, os.path.join(home, "vboard.log")))
        if time.monotonic() > deadline:
            proc.kill()
            raise UserError("virtual board %s did not come up within %.0f s" % (b.name, timeout))
        time.sleep(0.05)
    return Handle(proc, link, home)


def main(argv=None, prog="vboard"):
    # the vboard command (python -m host.vboard, or `kv vboard` with prog="kv vboard"); its exit status
    ap = argparse.ArgumentParser(prog=prog, description="MicroPython unix port behind a pty, as a virtual board")
    ap.add_argument("--board", default=paths.DEFAULT_BOARD)
    ap.add_argument("--fs", default=None, help="filesystem directory (default .vboard/NAME/fs)")
    ap.add_argument("--home", default=None, help="state directory for port link and pid (default .vboard/NAME)")
    ap.add_argument("--vanish-after-bytes", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--stop", action="store_true", help="stop the virtual board running for this profile")
    a = ap.parse_args(argv)
    try:
        b = boards.load(a.board)
        if b.kind != "mcu":
            raise UserError("board %s is a %s, not a microcontroller: no virtual board for it" % (b.name, b.kind), 2)
        home = a.home or state_dir(b.name)
        if a.stop:
            pid = stop_running(home)
            stale = None if pid else forget_stale(home)
            print("vboard %s: %s" % (b.name, "stopped (pid %d)" % pid if pid else "none was running"
                                     + (" (removed a stale pid file naming pid %d, not a virtual board now)" % stale if stale else "")))
            return 0
        check_fs(a.fs)
        pid = running_pid(home)
        if pid is not None:
            raise UserError("a virtual %s is already running (pid %d, port %s); stop it with: %s"
                            % (b.name, pid, os.path.join(home, "port"), stop_hint(a.board, a.home)))
        VirtualBoard(b, fs_dir=a.fs, home=a.home, vanish_after=a.vanish_after_bytes, quiet=a.quiet).run()
    except UserError as e:
        print("%s: %s" % (prog, e), file=sys.stderr)
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
