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
import re
import shutil
import subprocess
import tempfile
import time

from host import paths
from host.errors import UserError

SRC_ENV = "KVRTOS_MICROPYTHON_SRC"  # a MicroPython source tree given by the user
CACHE = paths.state(".cache", "micropython32")  # built binaries, one folder per source key (a user folder when installed)
_MAKE_FLAGS = [  # the unix port's standard variant, 32-bit and static, without the parts that need libraries
    "VARIANT=standard", "CFLAGS_EXTRA=-m32", "LDFLAGS_EXTRA=-m32 -static",
    "MICROPY_PY_FFI=0", "MICROPY_PY_BTREE=0", "MICROPY_PY_SSL=0", "MICROPY_SSL_AXTLS=0", "MICROPY_SSL_MBEDTLS=0",
    "MICROPY_PY_USSL=0",  # the same switch's name before v1.21 (older tags: ./kv mp32 --ref)
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
        if cand and cand is env:  # set by the user, so meant: no quiet fall-back to ../shared
            raise UserError("$%s=%s is not a MicroPython source tree (no py/mpconfig.h)" % (SRC_ENV, cand), 2)
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


PROGRESS_S = 5  # seconds between the build's progress lines
MAKE_LIMIT_S = 900  # the longest one make (mpy-cross, the port) may run


def _make(cmd, what, say, limit=MAKE_LIMIT_S):
    # run make, its output kept (CompletedProcess-like: returncode, stdout, stderr); with
    # say, a line when it starts and one every PROGRESS_S with the files compiled so far.
    # A make past `limit` seconds (silent or not) is killed: UserError, exit 1
    import threading

    if say is None:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise UserError("32-bit MicroPython build: %s ran past %d s and was stopped" % (what, limit), 1) from None
    t0 = time.monotonic()
    say("mp32: building %s ..." % what)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)  # make's lines as they come
    reader.start()
    last = t0
    try:
        while p.poll() is None:
            time.sleep(0.1)
            now = time.monotonic()
            if now - t0 > limit:
                p.kill()
                raise UserError("32-bit MicroPython build: %s ran past %d s and was stopped" % (what, limit), 1)
            if now - last >= PROGRESS_S:
                last = now
                say("mp32: %s: %d files compiled, %.0f s" % (what, sum(x.startswith("CC ") for x in lines), now - t0))
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        reader.join(timeout=5)
    cc = sum(x.startswith("CC ") for x in lines)
    say("mp32: %s %s: %d files compiled in %.0f s" % (what, "done" if p.returncode == 0 else "failed", cc, time.monotonic() - t0))
    return subprocess.CompletedProcess(cmd, p.returncode, "".join(lines), "")


def build(src=None, log=None, cflags="", say=None):
    # the 32-bit binary for the source tree, built once and cached; UserError when
    # there is no source tree or the build fails (the last compiler line says why).
    # say(line): progress lines while it builds (./kv mp32 prints them), none when cached
    s = source(src)
    if s is None:
        raise UserError("no MicroPython source tree: pass --src DIR, set %s, or put one at ../shared/micropython-src" % SRC_ENV, 2)
    # a build with cflags is keyed by them and by how they are applied (_CFLAGS_RECIPE)
    out_dir = os.path.join(CACHE, _key(s) + ("-" + hashlib.sha256((cflags + _CFLAGS_RECIPE).encode()).hexdigest()[:8]
                                             if cflags else ""))
    binary = os.path.join(out_dir, "micropython")
    if os.access(binary, os.X_OK):
        return binary  # built: no need to wait for another build's lock (a binary is moved in whole)
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (tests and a user may race)
        if os.access(binary, os.X_OK):
            return binary
        with tempfile.TemporaryDirectory(prefix="kvrtos-mp32-") as tmp:
            if say is not None:
                say("mp32: copying the source tree %s (a build takes about 40 s on 2 cores; cached after)" % s)
            tree = os.path.join(tmp, "src")
            shutil.copytree(s, tree, symlinks=True, ignore=shutil.ignore_patterns("build-*"))
            for dirpath, dirnames, filenames in os.walk(tree):  # a read-only source copies read-only
                for n in dirnames + filenames:
                    p = os.path.join(dirpath, n)
                    if not os.path.islink(p):
                        os.chmod(p, os.stat(p).st_mode | 0o200)
            manifest = os.path.join(tree, "extmod", "asyncio", "manifest.py")
            extra = _undefined(tree, cflags)
            cmd = ["make", "-C", os.path.join(tree, "ports", "unix"), "-j%d" % (os.cpu_count() or 2)] + [
                f + " " + extra if extra and f.startswith("CFLAGS_EXTRA=") else f for f in _MAKE_FLAGS]
            # freeze asyncio where the tree has it in extmod; older trees freeze from the
            # micropython-lib submodule, which an exported tag lacks: freeze nothing
            cmd.append("FROZEN_MANIFEST=" + (manifest if os.path.isfile(manifest) else ""))
            if not os.path.isfile(manifest):
                cmd.append("FROZEN_MPY_DIR=")  # before v1.12 the unix port froze upip from ports/unix/modules
            try:
                # mpy-cross first, on its own: the port's make would pass its variables
                # (the frozen manifest) down to it, which some versions reject at link time
                r = _make(["make", "-C", os.path.join(tree, "mpy-cross"), "-j%d" % (os.cpu_count() or 2)], "mpy-cross",
                          say)
                if r.returncode == 0:
                    r = _make(cmd, "the 32-bit unix port", say)
            except FileNotFoundError:
                raise UserError("make is not installed; the 32-bit MicroPython build needs make and gcc", 1)
            if log:
                with open(log, "w") as f:
                    f.write(r.stdout + r.stderr)
            built = os.path.join(tree, "ports", "unix", "build-standard", "micropython")
            if not os.path.isfile(built):  # before v1.19 the binary was written beside the Makefile
                built = os.path.join(tree, "ports", "unix", "micropython")
            if r.returncode != 0 or not os.path.isfile(built):
                raise UserError("32-bit MicroPython build failed: %s" % _why(r.stderr or r.stdout), 1)
            os.makedirs(out_dir, exist_ok=True)
            shutil.copy2(built, binary + ".tmp")
            os.replace(binary + ".tmp", binary)
    return binary


_TAG_DIRS = ("py", "extmod", "shared", "lib", "drivers", "ports/unix", "mpy-cross", "tools", "docs/conf.py")  # what a tagged build
# needs (docs/conf.py: where makeversionhdr.py read the version before v1.20)
# a tagged build as the boards' firmware had it: random's extra functions (randrange,
# choice, ...), which the unix standard variant left out before v1.19 and the perf_bench
# programs call (both names: urandom before v1.21, random after)
TAG_CFLAGS = "-DMICROPY_PY_URANDOM_EXTRA_FUNCS=1 -DMICROPY_PY_RANDOM_EXTRA_FUNCS=1"
_CFLAGS_RECIPE = "headers-rewritten-2"  # bump when _undefined changes what a -D does
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")


def tree_at(repo, ref):
    # a source tree of MicroPython at `ref` (a tag such as v1.20.0, or a commit) exported
    # from `repo` (a git clone or bare mirror of micropython/micropython) into the cache,
    # once; UserError when repo or ref is not there
    if not _REF.match(ref or "") or ".." in ref:
        raise UserError("--ref must be a tag or commit such as v1.20.0, not %r" % ref, 2)
    if not repo or not os.path.isdir(repo):
        raise UserError("no MicroPython git repository at %s (pass --repo DIR: a clone of micropython/micropython)" % repo, 2)
    def git(*a, **kw):
        try:
            return subprocess.run(["git", "--git-dir", git_dir(repo)] + list(a), capture_output=True, timeout=300, **kw)
        except FileNotFoundError:
            raise UserError("git is not installed; building a tagged MicroPython needs it", 1)
    if git("rev-parse", "--git-dir").returncode != 0:
        raise UserError("%s is not a git repository (a clone of micropython/micropython is needed)" % repo, 2)
    r = git("rev-parse", "--verify", "--quiet", ref + "^{commit}")
    if r.returncode != 0:
        raise UserError("%s has no tag or commit %s" % (repo, ref), 2)
    commit = r.stdout.decode().strip()
    # the folder names what was exported (the commit and _TAG_DIRS), so an export made with
    # another list of folders is never taken for this one
    tag = hashlib.sha256(repr(_TAG_DIRS).encode()).hexdigest()[:6]
    out = os.path.join(paths.state(".cache", "micropython-src"), commit[:16] + "-" + tag)
    if os.path.isfile(os.path.join(out, "py", "mpconfig.h")):
        return out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="tree-", dir=os.path.dirname(out))
    try:
        tar = git("archive", "--format=tar", commit, *[d for d in _TAG_DIRS if _has(git, commit, d)])
        if tar.returncode != 0:
            raise UserError("git archive of %s failed: %s" % (ref, tar.stderr.decode(errors="replace").strip()[:200]), 1)
        try:
            x = subprocess.run(["tar", "-x", "-C", tmp], input=tar.stdout, capture_output=True, timeout=300)
        except (FileNotFoundError, subprocess.TimeoutExpired) as e:
            raise UserError("unpacking %s failed: %s" % (ref, e), 1)
        if x.returncode != 0:
            raise UserError("unpacking %s failed: %s" % (ref, x.stderr.decode(errors="replace").strip()[:200]), 1)
        if not os.path.isfile(os.path.join(tmp, "py", "mpconfig.h")):
            raise UserError("%s at %s is not a MicroPython source tree (no py/mpconfig.h)" % (repo, ref), 2)
        lib = os.path.join(tmp, "lib", "micropython-lib")
        if os.path.isdir(lib) and not os.listdir(lib):  # a submodule git archive leaves empty; the
            with open(os.path.join(lib, "README.md"), "w") as f:  # build checks for this file before freezing
                f.write("placeholder: the exported tag has no micropython-lib submodule; nothing is frozen from it\n")
        try:
            os.replace(tmp, out)
        except OSError:  # another process exported it first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def git_dir(repo):
    # the git directory of a clone (repo/.git: a folder, or a file naming it in a worktree or
    # submodule) or of a bare mirror (repo itself)
    g = os.path.join(repo, ".git")
    if os.path.isfile(g):
        try:
            with open(g) as f:
                line = f.read().strip()
        except OSError:
            return g
        if line.startswith("gitdir:"):
            d = line[len("gitdir:"):].strip()
            return d if os.path.isabs(d) else os.path.normpath(os.path.join(repo, d))
    return g if os.path.isdir(g) else repo


def _has(git, commit, d):
    return git("cat-file", "-e", "%s:%s" % (commit, d)).returncode == 0


def _undefined(tree, cflags):
    # cflags for the make line: a -DNAME=V whose NAME the unix port's own headers define
    # already (a second definition is an error under -Werror) is written into that header
    # of the build's copy instead, so the build gets V either way
    keep = []
    for f in cflags.split():
        if not f.startswith("-D") or "=" not in f:
            keep.append(f)
            continue
        name, val = f[2:].split("=", 1)
        hit = False
        for h in ("ports/unix/mpconfigport.h", "ports/unix/variants/standard/mpconfigvariant.h",
                  "ports/unix/variants/mpconfigvariant_common.h"):
            p = os.path.join(tree, h)
            try:
                with open(p) as fh:
                    text = fh.read()
            except OSError:
                continue
            new, n = re.subn(r"(#define\s+%s\b)[^\n]*" % re.escape(name), r"\g<1> (%s)" % val, text)
            if n:
                hit = True
                with open(p, "w") as fh:
                    fh.write(new)
        if not hit:
            keep.append(f)
    return " ".join(keep)


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
