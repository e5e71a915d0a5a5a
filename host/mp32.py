# The 32-bit MicroPython unix port: the interpreter whose word size is the ESP32-S3's
# (small ints stop at 2**30, viper words wrap at 32 bits, GC blocks are 16 bytes), so
# firmware that overflows or allocates on the board fails here too. The PyPI
# `micropython` is a 64-bit build and cannot show that.
#
# Built from a MicroPython source tree: $KVRTOS_MICROPYTHON_SRC, `./kv mp32 --src DIR`,
# or ../shared/micropython-src beside the repository. The build copies the tree into a
# scratch folder (the source may be read-only), runs the unix port's make with -m32
# -static, and caches the binary in .cache/micropython32/<key>/ where key hashes the
# source tree, so a second call costs a stat of the tree. Needs gcc able to build
# 32-bit code (Debian: gcc-multilib).
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile

from host import paths
from host.errors import UserError

SRC_ENV = "KVRTOS_MICROPYTHON_SRC"  # a MicroPython source tree given by the user
CACHE = paths.state(".cache", "micropython32")  # built binaries, one folder per source key (a user folder when installed)
_MAKE_FLAGS = [  # the unix port's standard variant, 32-bit and static, without the parts that need libraries
    "VARIANT=standard", "CFLAGS_EXTRA=-m32", "LDFLAGS_EXTRA=-m32 -static",
    "MICROPY_PY_FFI=0", "MICROPY_PY_BTREE=0", "MICROPY_PY_SSL=0", "MICROPY_SSL_AXTLS=0", "MICROPY_SSL_MBEDTLS=0",
]
_KEY_DIRS = ("py", "extmod", "shared", "ports/unix", "mpy-cross")  # what the binary is made of


def source(src=None):
    # the MicroPython source tree to build from, or None when there is none
    env = os.environ.get(SRC_ENV)
    env = env and paths.user_path(env)  # typed by the user too: relative to where ./kv ran
    for cand in (src, env, os.path.join(os.path.dirname(paths.ROOT), "shared", "micropython-src")):
        if cand and os.path.isfile(os.path.join(cand, "py", "mpconfig.h")):
            return os.path.abspath(cand)
        if cand and cand is src:
            raise UserError("%s is not a MicroPython source tree (no py/mpconfig.h)" % cand, 2)
    return None


def _key(src):
    # a hash of the tree's file names, sizes and mtimes (not contents: cheap, and any
    # edit changes an mtime); 16 hex digits
    h = hashlib.sha256()
    for d in _KEY_DIRS:
        top = os.path.join(src, d)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(x for x in dirnames if not x.startswith("build"))
            for fn in sorted(filenames):
                p = os.path.join(dirpath, fn)
                st = os.stat(p)
                h.update(("%s %d %d\n" % (os.path.relpath(p, src), st.st_size, int(st.st_mtime))).encode())
    return h.hexdigest()[:16]


def cached(src=None):
    # path of the built binary for the source tree when it is in the cache, else None
    s = source(src)
    if s is None:
        return None
    b = os.path.join(CACHE, _key(s), "micropython")
    return b if os.access(b, os.X_OK) else None


def build(src=None, log=None):
    # the 32-bit binary for the source tree, built once and cached; UserError when
    # there is no source tree or the build fails (the last compiler line says why)
    s = source(src)
    if s is None:
        raise UserError("no MicroPython source tree: pass --src DIR, set %s, or put one at ../shared/micropython-src" % SRC_ENV, 2)
    out_dir = os.path.join(CACHE, _key(s))
    binary = os.path.join(out_dir, "micropython")
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (tests and a user may race)
        if os.access(binary, os.X_OK):
            return binary
        with tempfile.TemporaryDirectory(prefix="kvrtos-mp32-") as tmp:
            tree = os.path.join(tmp, "src")
            shutil.copytree(s, tree, symlinks=True, ignore=shutil.ignore_patterns("build-*"))
            for dirpath, dirnames, filenames in os.walk(tree):  # a read-only source copies read-only
                for n in dirnames + filenames:
                    p = os.path.join(dirpath, n)
                    if not os.path.islink(p):
                        os.chmod(p, os.stat(p).st_mode | 0o200)
            manifest = os.path.join(tree, "extmod", "asyncio", "manifest.py")
            cmd = ["make", "-C", os.path.join(tree, "ports", "unix"), "-j%d" % (os.cpu_count() or 2)] + _MAKE_FLAGS
            if os.path.isfile(manifest):
                cmd.append("FROZEN_MANIFEST=" + manifest)
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            except FileNotFoundError:
                raise UserError("make is not installed; the 32-bit MicroPython build needs make and gcc", 1)
            if log:
                with open(log, "w") as f:
                    f.write(r.stdout + r.stderr)
            built = os.path.join(tree, "ports", "unix", "build-standard", "micropython")
            if r.returncode != 0 or not os.path.isfile(built):
                raise UserError("32-bit MicroPython build failed: %s" % _why(r.stderr or r.stdout), 1)
            os.makedirs(out_dir, exist_ok=True)
            shutil.copy2(built, binary + ".tmp")
            os.replace(binary + ".tmp", binary)
    return binary


def _why(text):
    # the line of a failed build that says why, in words a user can act on
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    for x in lines:
        if "stubs-32.h" in x or "cannot find -lgcc" in x or "skipping incompatible" in x:
            return "gcc cannot build 32-bit programs here (Debian: apt-get install gcc-multilib)"
    errs = [x for x in lines if "error" in x.lower()]
    return (errs or lines or ["no output"])[0][:300]


def available():
    # (binary, None) when the 32-bit port can be used (building it if needed), else
    # (None, why): tests skip with that reason
    try:
        return build(), None
    except UserError as e:
        return None, str(e)
