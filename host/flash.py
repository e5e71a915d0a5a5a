# `kv flash`: compile firmware_py/ with mpy-cross, hash every artifact, copy only what
# differs on the device (through mpremote's transport), verify every hash, soft-reset.
# A file is written as NAME.part, verified, then renamed into place, so a flash cut
# short by a vanishing port never leaves a half-written file under its real name:
# the next flash sees a missing or different hash and copies it again.
#
# Every exchange with the board has a deadline: the board must send a byte within
# answer_timeout seconds of the last byte either way, or the flash stops with one line
# (mpremote itself would wait forever on a board that answers the handshake, then
# falls silent). Before copying, the board's .mpy format is checked against mpy-cross's.
import ast
import contextlib
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile

import serial

from host import boardmodel, boards, link, paths, vboard
from host.errors import UserError

MANIFEST = "kvrtos_manifest.json"  # path -> sha256 of what the last good flash wrote
CONFIG = "kvrtos.json"  # the application config on the board (firmware_py/serve.py CONFIG_FILE)
CHUNK = 2048  # bytes per write through the raw REPL
ESP_MAX_SEGMENTS = 16  # an ESP image header's segment count is at most this (esptool)
MIN_IMAGE_BYTES = 64 * 1024  # a MicroPython image (bootloader, partition table, app) is far larger
FIRMWARE_SHAPE = ("__init__.py", "app.py", "main.py")  # a --src folder without these is not the firmware
# mpy native architectures by number (sys.implementation._mpy >> 10, .mpy header byte 2 >> 2)
MPY_ARCHS = ("none", "x86", "x64", "armv6", "armv6m", "armv7m", "armv7em", "armv7emsp", "armv7emdp",
             "xtensa", "xtensawin", "rv32imc", "rv64imc")

# Runs on the device: its MicroPython version and the .mpy format it loads
_MPY_PROBE = "import sys\nprint(repr((sys.implementation.version, getattr(sys.implementation, '_mpy', None))))\n"



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


def build(board, src=paths.FIRMWARE, virtual=False, march=None):
    # compile the firmware for a board; returns [Artifact] (main.py and board.json included);
    # march: mpy-cross's -march (default: the board's, "host" for a virtual board; "x86" for
    # the 32-bit unix port)
    if not os.path.isdir(src):
        raise UserError("firmware source %s is not a directory" % src, 2)
    march = march or ("host" if virtual else board.mpy_arch)
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


def check_firmware_src(src):
    # src, when it holds the kvrtos firmware; a folder without it would replace the
    # firmware on the board with something else (and remove the old files): refused
    if not os.path.isdir(src):
        raise UserError("firmware source %s is not a directory" % src, 2)
    missing = [f for f in FIRMWARE_SHAPE if not os.path.isfile(os.path.join(src, f))]
    if missing:
        raise UserError("%s is not the kvrtos firmware (no %s); give --src a copy of firmware_py/" % (src, ", ".join(missing)), 2)
    return src


def mpy_format(version, feature):
    # "v6.3 (xtensawin)" for an mpy version and its feature byte (arch << 2 | sub-version)
    arch = feature >> 2
    name = MPY_ARCHS[arch] if arch < len(MPY_ARCHS) else "arch %d" % arch
    return "v%d.%d (%s)" % (version, feature & 3, name if arch else "no native code")


def board_mpy(t, port):
    # (MicroPython version text, sys.implementation._mpy or None) of the board on t, asked
    # once (check_mpy and the virtual board's -march read it); UserError when it does not say
    out = t.exec(_MPY_PROBE).decode("utf-8", "replace").strip()
    try:
        version, mpy = ast.literal_eval(out.splitlines()[-1])
        ver = ".".join(str(v) for v in version[:3])
    except (ValueError, SyntaxError, IndexError, TypeError):
        raise UserError("the board on %s did not say which MicroPython it runs (answer %r)" % (port, out[-80:])) from None
    return ver, mpy if isinstance(mpy, int) else None


WORD_OF_MARCH = {"x64": 8, "x86": 4}  # a virtual board's word size by the arch its unix port reports


def _host_march():
    # the -march "host" means for mpy-cross here (the 64-bit PyPI unix port's)
    import struct  # noqa: PLC0415

    return "x64" if struct.calcsize("P") == 8 else "x86"


def board_march(answer):
    # mpy-cross's -march for the native code of a board whose board_mpy() answer this is,
    # or None when it does not say (check_mpy then refuses what does not load)
    mpy = answer[1]
    arch = (mpy >> 10) if mpy is not None else 0
    return MPY_ARCHS[arch] if 0 < arch < len(MPY_ARCHS) else None


def check_mpy(t, arts, port, answer=None):
    # refuse (one line) when the board's MicroPython cannot load the .mpy files built:
    # same mpy version, and for files with native code the same sub-version and arch;
    # answer: board_mpy()'s, when already asked
    ver, mpy = answer or board_mpy(t, port)
    if mpy is None:
        raise UserError("the board on %s runs MicroPython %s, which does not report its .mpy format "
                        "(sys.implementation._mpy); update it: ./kv flash-firmware --bin FILE" % (port, ver))
    board_ver, board_feat = mpy & 0xFF, mpy >> 8
    for a in arts:
        if not a.dest.endswith(".mpy"):
            continue
        ver_a, feat_a = a.data[1], a.data[2]
        if ver_a != board_ver or (feat_a and feat_a != board_feat):
            raise UserError(
                "the board on %s runs MicroPython %s, which loads .mpy %s; this build (%s) is .mpy %s: "
                "install a MicroPython that matches mpy-cross (./kv flash-firmware --bin FILE)"
                % (port, ver, mpy_format(board_ver, board_feat), a.dest, mpy_format(ver_a, feat_a)))
    return ver, mpy


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
    except serial.SerialException:
        raise  # the port, not the manifest, failed
    except (OSError, ValueError):
        return []
    # a model and a config flashed before stay until another replaces them (a config's own
    # modules with it: the old manifest's other root .py files are the config's)
    keep = set(dests) | set(boardmodel.FILES) | {CONFIG}
    keep |= {p for p in old if "/" not in p and p.endswith(".py") and p != "main.py"}
    stale = sorted(p for p in old if p not in keep)
    for p in stale:
        t.exec(_REMOVE_SCRIPT % p)
        out("  rm    %s  (no longer in the firmware)" % p)
    return stale


GUARD_S = 10.0  # s a module's import or factory may take in the host check (one that never returns: one line)


class _TooLong(Exception):
    pass


@contextlib.contextmanager
def _time_guard(seconds):
    # raise _TooLong in the block after seconds (SIGALRM: the main thread of a POSIX host;
    # elsewhere no guard)
    import signal
    import threading

    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum, frame):
        raise _TooLong()

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _board_only(e, folder):
    # the name an ImportError e is about when the host cannot have it (so the module is
    # not checkable on the host), else None: a module not importable here and not beside
    # the config (machine, esp32, neopixel, network, micropython ...), or a name missing
    # from a host module that is not the user's (time.ticks_ms: MicroPython's own)
    import importlib.util

    name = getattr(e, "name", None)
    if not name:
        return None
    top = name.split(".")[0]
    if top == "firmware_py" or os.path.isfile(os.path.join(folder, top + ".py")) or os.path.isdir(os.path.join(folder, top)):
        return None  # kvrtos's own package, or the user's module beside the config: its error is theirs
    if isinstance(e, ModuleNotFoundError):
        try:
            return name if importlib.util.find_spec(top) is None else None
        except (ImportError, ValueError):
            return name
    what = getattr(e, "name_from", None) or (str(e).split("'") + ["", ""])[1]  # "cannot import name 'X' from 'M'"
    return "%s from %s" % (what, name) if what else name  # M is the host's, not MicroPython's


def _cfg_err(appcfg, msg):
    raise appcfg.AppConfigError("config: " + msg)  # as firmware_py.appcfg words its errors


def _module_task(appcfg, k, env, t, folder):
    # a module task built as firmware_py.appcfg builds it, without running any of its code
    # that may not return: the import and the factory under a time guard, task() only when
    # it is a generator function (making the generator runs none of its body), stats() not
    # called (it reports a task that ran). Returns None when built, else the note why the
    # module is not checkable on the host (a board-only import). AppConfigError: one line
    import importlib
    import inspect

    nm, m = t["name"], t["module"]
    try:
        with _time_guard(GUARD_S):
            mod = importlib.import_module(m)
    except _TooLong:
        _cfg_err(appcfg, "task %r: its module %s (import) did not return within %.0f s on the host" % (nm, m, GUARD_S))
    except ImportError as e:
        other = _board_only(e, folder)
        if other is None:
            _cfg_err(appcfg, "task %r: its module %s (import) raised %s: %s" % (nm, m, type(e).__name__, str(e).split("\n")[0]))
        return "its module %s imports %s, which the host does not have (a board-only module or name)" % (m, other)
    except Exception as e:  # noqa: BLE001 - the user's code: any exception is its mistake
        _cfg_err(appcfg, "task %r: its module %s (import) raised %s: %s" % (nm, m, type(e).__name__, str(e).split("\n")[0]))
    f = getattr(mod, t["factory"], None)
    if f is None:
        _cfg_err(appcfg, "task %r: module %s has no %s" % (nm, m, t["factory"]))
    what = "factory %s.%s" % (m, t["factory"])
    try:
        with _time_guard(GUARD_S):
            obj = f(k, env, **t.get("args", {}))
    except _TooLong:
        _cfg_err(appcfg, "task %r: its %s did not return within %.0f s on the host" % (nm, what, GUARD_S))
    except Exception as e:  # noqa: BLE001
        _cfg_err(appcfg, "task %r: its %s raised %s: %s" % (nm, what, type(e).__name__, str(e).split("\n")[0]))
    if not hasattr(obj, "stats") or not hasattr(obj, "task"):
        _cfg_err(appcfg, "task %r: its object has no task() and stats()" % nm)
    if not inspect.isgeneratorfunction(obj.task):
        _cfg_err(appcfg, "task %r: task() must be a generator function (def task(self): ... yield ...), got %s"
                    % (nm, type(obj.task).__name__))
    if not callable(obj.stats):
        _cfg_err(appcfg, "task %r: stats() must be a method returning a dict" % nm)
    try:
        gen = obj.task()
    except Exception as e:  # noqa: BLE001 - a generator function's arguments
        _cfg_err(appcfg, "task %r: its task() raised %s: %s" % (nm, type(e).__name__, str(e).split("\n")[0]))
    try:
        k.spawn(nm, t["priority"], gen)
    except ValueError as e:
        _cfg_err(appcfg, "task %r: %s" % (nm, e))
    return None


def _dry_build(cfg, board, folder, modules):
    # every task of cfg built once on a VirtualClock with the board's profile, as ./kv
    # emulate builds them: the built-in workloads' own checks (a period, a tier), and each
    # module task's module imported from folder (beside the config, where the board has
    # it), its factory called with the config's args (unknown args are the factory's
    # TypeError), its task() checked to be a generator function (never run: _module_task).
    # The modules are on the path for this call only: the modules imported from folder are
    # dropped after, a module of the same name already imported is put back. Returns
    # [(task name, note)] for module tasks not checkable on the host (a board-only import);
    # raises AppConfigError (one line) naming the task
    from firmware_py import appcfg, bandwidth
    from firmware_py.clock import VirtualClock
    from firmware_py.sched import Kernel

    notes = []
    with paths.import_folder(folder, modules):  # an earlier import of a name (another config's) is not this one
        k = Kernel(VirtualClock(), max_tasks=appcfg.max_tasks(cfg))
        env = appcfg.make_env(k, bandwidth.Bandwidth(board, kernel=k, user_categories=appcfg.categories(cfg)), cfg, board)
        appcfg.stats(appcfg.spawn(k, dict(cfg, tasks=[t for t in cfg["tasks"] if t["kind"] != "module"]), env))
        for t in cfg["tasks"]:
            if t["kind"] == "module":
                note = _module_task(appcfg, k, env, t, folder)
                if note is not None:
                    notes.append((t["name"], note))
    return notes


def config_files(path, board, out=print):
    # [(device path, bytes)] for `flash --config FILE`: the file as kvrtos.json, validated
    # first with firmware_py.appcfg.load, then every task built once on a virtual clock
    # with the board's profile, module tasks too (_dry_build: as ./kv emulate does), and
    # each module task's module (m.py beside the config) as m.py. A bad config is one
    # line, exit 2, before any board is looked for
    from firmware_py import appcfg

    if os.path.isdir(path):
        raise UserError("--config %s is a folder; give the JSON file" % path, 2)
    if os.path.exists(path):
        paths.regular_file(path, "--config")  # a FIFO blocked the read forever
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError("--config %s cannot be read: %s" % (path, e.strerror or e), 2) from None
    try:
        cfg = appcfg.load(data)
    except (ValueError, TypeError) as e:  # AppConfigError
        raise UserError("--config %s: %s" % (path, str(e).split("\n")[0]), 2) from None
    folder = os.path.dirname(os.path.abspath(path))
    files = [(CONFIG, data)]
    for t in cfg["tasks"]:
        if t["kind"] != "module":
            continue
        m = t["module"]
        if "." in m:
            raise UserError("--config %s: task %r: module %r: give a top-level module (m.py beside the config)"
                            % (path, t["name"], m), 2)
        mp = os.path.join(folder, m + ".py")
        if not os.path.isfile(mp):
            raise UserError("--config %s: task %r: its module %s.py is not beside the config (%s)"
                            % (path, t["name"], m, os.path.dirname(mp)), 2)
        with open(mp, "rb") as f:
            src = f.read()
        try:
            compile(src, mp, "exec")
        except SyntaxError as e:
            raise UserError("--config %s: %s.py line %s: %s" % (path, m, e.lineno, e.msg), 2) from None
        if (m + ".py", src) not in files:
            files.append((m + ".py", src))
    try:
        notes = _dry_build(cfg, board, folder, [t["module"] for t in cfg["tasks"] if t["kind"] == "module"])
    except (ValueError, TypeError) as e:  # AppConfigError (a module's import, factory or task()); the tracker
        raise UserError("--config %s: %s" % (path, str(e).split("\n")[0]), 2) from None
    for nm, why in notes:
        out("flash: note: task %r not built on the host: %s; the board builds it at boot" % (nm, why))
    return files


def _has_tasks(config):
    # True when the application config at path config (already checked by config_files) has tasks
    from firmware_py import appcfg  # noqa: PLC0415

    with open(config) as f:
        return bool(appcfg.load(f.read())["tasks"])


def flash(port=None, board_name=paths.DEFAULT_BOARD, src=paths.FIRMWARE, out=print, reset=True, keep_open=False,
          answer_timeout=link.ANSWER_TIMEOUT, model=None, tokenizer="", config=None, weights="int8"):
    # flash the firmware (and with model, a checkpoint and its tokenizer: host/boardmodel.py;
    # with config, an application config as kvrtos.json and its modules: config_files);
    # returns a summary dict (and the open serial port when keep_open)
    from mpremote.transport import TransportError, TransportExecError

    board = boards.load(board_name)
    if board.kind != "mcu":
        raise UserError("board %s is a %s: kvrtos flashes microcontrollers only" % (board.name, board.kind), 2)
    check_firmware_src(src)
    extra = config_files(config, board, out=out) if config is not None else []  # checked before any board is looked for
    model_files = []
    if model is not None:
        # checked (files, then the budget) before a board is even looked for: a model
        # that cannot fit is refused with the calculator's figures, nothing copied
        # the budget of what the board will run: serve, with the config's tasks when it has some
        ctx = "serve+tasks" if config is not None and _has_tasks(config) else "serve"
        model_files, fit, model_path = boardmodel.files_for(board_name, model, tokenizer, weights, out, ctx)
        out("flash: model %s fits %s: KV budget %d tokens (%s KV), generation stops at %d (%s)"
            % (os.path.relpath(model_path, paths.ROOT) if model_path.startswith(paths.ROOT) else model_path, board.name,
               fit["max_tokens"], fit["kv_dtype"], fit["decode_tokens"],
               "the model's context" if fit["limited_by"] == "context" else "the KV budget"))
    if port is None:
        port = link.find_port(board)
        if port is None:
            out("flash: no ESP32-S3 on USB and no virtual board running; starting one")
            h = vboard.start(board_name, detach=True)  # a profile path starts that profile
            port = h.port
            out("flash: the virtual %s keeps running on %s (./kv vboard --board %s --stop stops it)"
                % (board.name, port, board_name))
    virtual = link.is_virtual(port)
    # built before the port is opened (a virtual board just started finishes its main.py meanwhile)
    arts = build(board, src, virtual=virtual) + [Artifact(dest, data) for dest, data in model_files + extra]
    t = link.connect(port, answer_timeout)
    copied = skipped = 0
    copied_bytes = skipped_bytes = 0
    current = None
    todo = []
    try:
        current = "while reading its MicroPython version"
        answer = board_mpy(t, port)
        march = board_march(answer) if virtual else None
        if march and march != _host_march():
            # a virtual board running another unix port (the 32-bit one: x86): its native code for that
            arts = build(board, src, virtual=virtual, march=march) + [Artifact(dest, data) for dest, data in model_files + extra]
        word = WORD_OF_MARCH.get(march, 4)
        if virtual and model is not None and word != 4:
            # the fit was checked for the chip's 32-bit word; the 64-bit port of a virtual board keeps more
            vfit = boardmodel.check_fits(board_name, model_path, ctx, out, word)
            out("flash: this virtual board runs the %d-bit unix port: KV budget %d tokens there (%s KV)"
                % (8 * word, vfit["max_tokens"], vfit["kv_dtype"]))
        check_mpy(t, arts, port, answer)
        current = "while hashing its files"
        have = link.device_hashes(t, [a.dest for a in arts])
        todo = [a for a, h in zip(arts, have, strict=True) if h != a.sha256]
        for a, h in zip(arts, have, strict=True):
            if h == a.sha256:
                skipped += 1
                skipped_bytes += len(a.data)
                out("  skip  %-34s %7d B  unchanged" % (a.dest, len(a.data)))
        current = "while making folders"
        _ensure_dirs(t, [a.dest for a in todo])
        for a in todo:
            current = "while writing %s" % a.dest
            part = a.dest + ".part"
            t.fs_writefile(part, a.data, chunk_size=CHUNK)
            (got,) = link.device_hashes(t, [part])
            if got != a.sha256:
                raise UserError("verify failed for %s: device has %s, expected %s" % (a.dest, got, a.sha256))
            t.exec(_REMOVE_SCRIPT % a.dest + "os.rename(%r, %r)\n" % (part, a.dest))  # install the verified file
            copied += 1
            copied_bytes += len(a.data)
            out("  copy  %-34s %7d B" % (a.dest, len(a.data)))
        current = "while verifying"
        final = link.device_hashes(t, [a.dest for a in arts])
        bad = [a.dest for a, h in zip(arts, final, strict=True) if h != a.sha256]
        if bad:
            raise UserError("verify failed after copying: %s" % ", ".join(bad))
        current = "while removing old files"
        removed = _remove_stale(t, [a.dest for a in arts], out)
        manifest = json.dumps({a.dest: a.sha256 for a in arts}, sort_keys=True).encode()
        current = "while writing %s" % MANIFEST
        t.fs_writefile(MANIFEST, manifest, chunk_size=CHUNK)
        out(
            "flash: %s on %s: %d copied (%d B), %d unchanged (%d B), %d verified by sha256"
            % (board.name, port, copied, copied_bytes, skipped, skipped_bytes, len(arts))
        )
        ser = None
        if reset:
            current = "while soft-resetting it"
            t.exit_raw_repl()
            t.read_until(1, b">>> ", timeout=2)  # the friendly REPL's banner: not firmware output
            t.serial.write(b"\x04")  # ctrl-D at the friendly REPL: soft reset, main.py runs
            out("flash: soft reset")
        if keep_open:
            ser = t.serial.ser
        else:
            t.close()
    except (TransportError, serial.SerialException, OSError, UserError) as e:
        link.close(t)
        if isinstance(e, UserError):
            raise
        where = current or "during the flash"
        done = " (%d of %d changed files written)" % (copied, len(todo)) if todo else ""
        if isinstance(e, link.BoardSilent) and os.path.exists(port):
            raise UserError("the board on %s stopped answering %s: nothing for %g s%s; reset it and run flash again"
                            % (port, where, answer_timeout, done)) from None
        if isinstance(e, TransportExecError) or (isinstance(e, OSError) and not isinstance(e, serial.SerialException)):
            # the board answered with an error of its own (a full filesystem, say);
            # mpremote turns filesystem errors into OSError, port failures are SerialException
            if isinstance(e, TransportExecError):
                why = (e.error_output.strip().splitlines() or ["?"])[-1]
            else:
                why = "%s (%s)" % (type(e).__name__, os.strerror(e.errno) if e.errno else e)
            raise UserError("the board refused %s: %s%s" % (where, why, done)) from None
        raise UserError(
            "port %s vanished or stopped answering %s%s; run flash again to finish [%s]"
            % (port, where, done, type(e).__name__)
        ) from None
    summary = {
        "removed": removed,
        "board": board.name, "port": port, "virtual": virtual, "copied": copied, "copied_bytes": copied_bytes,
        "skipped": skipped, "skipped_bytes": skipped_bytes, "files": len(arts),
    }
    return (summary, ser) if keep_open else summary


# the chips esptool flashes, by the board profile's cpu.arch: (esptool's --chip, the
# flash offset a MicroPython .bin from micropython.org is written at, the chip id in an
# image's extended header, what resets it for the ROM bootloader). The classic ESP32's
# image starts with its second-stage bootloader at 0x1000; the S3's at 0x0. A classic
# ESP32 sits behind a USB-serial bridge (DTR/RTS: default-reset), the S3 on native USB
ESP_CHIPS = {"xtensa-lx7": ("esp32s3", "0x0", 9, "usb-reset"), "xtensa-lx6": ("esp32", "0x1000", 0, "default-reset")}
IMAGE_CHIP_IDS = {0: "esp32", 2: "esp32s2", 5: "esp32c3", 9: "esp32s3", 12: "esp32c2", 13: "esp32c6", 16: "esp32h2",
                  18: "esp32p4"}  # esptool's chip ids (an image's extended header, bytes 12-13)


def esp_chip(board):
    # (chip, offset, chip id, reset) for a board esptool can flash; UserError (exit 2) for
    # one it cannot (an RP2350, a Linux board)
    chip = ESP_CHIPS.get(board.cpu_arch)
    if chip is None:
        how = ("flash its MicroPython with its own tool (an RP2350: copy the .uf2 to its BOOTSEL drive, or picotool)"
               if board.kind == "mcu" else "it is a Linux board: it runs the host tools, not a MicroPython image")
        raise UserError("board %s (%s) is not an ESP32: esptool cannot flash it; %s" % (board.name, board.cpu_arch, how), 2)
    return chip


def esptool_command(bin_path, port, erase=False, baud=460800, chip=ESP_CHIPS["xtensa-lx7"]):
    # the esptool invocations that write a MicroPython image to the chip (esp_chip(board):
    # an ESP32-S3 by default), as argv lists (port None: esptool looks for the chip on
    # every serial port)
    py = sys.executable
    where = ["--port", port] if port else []
    name, offset, _, before = chip
    base = [py, "-m", "esptool", "--chip", name] + where + ["--baud", str(baud), "--before", before, "--after", "hard-reset"]
    cmds = []
    if erase:
        cmds.append(base + ["erase-flash"])
    cmds.append(base + ["write-flash", "-z", offset, bin_path])
    return cmds


# refuse (one line, exit 2) a file that cannot be an ESP32 firmware image: its header
# (magic 0xE9, 1..16 segments, SPI mode 0..5: esptool's image format) and its size
def check_esp_image(bin_path, chip=None, board_name=""):
    # chip: esp_chip(board): the image's chip id must be that chip's (board_name: for the message)
    with open(bin_path, "rb") as f:
        head = f.read(16)
    size = os.path.getsize(bin_path)
    if head[:1] != b"\xe9":  # ESP image magic byte
        raise UserError("%s is not an ESP32 firmware image (first byte is not 0xE9)" % bin_path, 2)
    if len(head) < 16:
        raise UserError("%s is not an ESP32 firmware image (%d B, shorter than the image header)" % (bin_path, size), 2)
    if not 1 <= head[1] <= ESP_MAX_SEGMENTS or head[2] > 5:
        raise UserError("%s is not an ESP32 firmware image (its header says %d segments, SPI mode %d)"
                        % (bin_path, head[1], head[2]), 2)
    if size < MIN_IMAGE_BYTES:
        raise UserError("%s is %d B: too small for a MicroPython image (at least %d B; a real one is about 1.5 MiB)"
                        % (bin_path, size, MIN_IMAGE_BYTES), 2)
    cid = head[12] | head[13] << 8
    if chip is not None and cid != chip[2]:
        raise UserError("%s is an image for %s (its header's chip id %d), not for the board's %s (--board %s): download "
                        "the %s build, or name the board it is for with --board" % (
                            bin_path, IMAGE_CHIP_IDS.get(cid, "another chip"), cid, chip[0], board_name,
                            {"esp32s3": "ESP32_GENERIC_S3", "esp32": "ESP32_GENERIC"}.get(chip[0], chip[0].upper())), 2)


def flash_firmware(bin_path, port=None, erase=False, board_name=paths.DEFAULT_BOARD, dry_run=False, out=print):
    # write a MicroPython firmware image to an ESP32-S3 with esptool; returns the commands
    if os.path.isdir(bin_path):
        raise UserError("firmware image %s is a folder; give the .bin file" % bin_path, 2)
    paths.regular_file(bin_path, "firmware image")  # a FIFO, /dev/null: what it is, not "does not exist"
    board = boards.load(board_name)
    chip = esp_chip(board)
    check_esp_image(bin_path, chip, board.name)
    label = chip[0].upper().replace("ESP32S3", "ESP32-S3")
    if port is None:
        port = link.usb_port(board)
        if port is None and not dry_run:
            raise UserError("no %s found on USB (VID 0x%04X); plug one in or pass --port" % (label, board.usb_vid or 0))
    elif not dry_run and not os.path.exists(port):
        raise UserError("no serial port at %s" % port, 2)
    cmds = esptool_command(bin_path, port, erase=erase, chip=chip)
    if dry_run:
        out("flash-firmware: would run%s:" % ("" if port else " (no %s on USB now: without one, or --port, the real run"
                                               " refuses; pasted as printed, esptool searches every serial port)" % label))
    for cmd in cmds:
        out(shlex.join(cmd))  # a whole shell command: pasteable as printed
        if not dry_run:
            r = subprocess.run(cmd)
            if r.returncode != 0:
                raise UserError("esptool failed (exit %d); see its output above" % r.returncode)
    return cmds
