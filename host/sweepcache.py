# `./kv sweep`'s result cache: each point's report under a key that hashes everything it
# depends on (the normalized spec, the bytes of its input files, the emulator's code), one
# JSON file per point written whole, so a rerun or an interrupted sweep runs only what is
# missing (docs/sweep.md).
import hashlib
import json
import os
import tempfile

from host import paths
from host.errors import UserError
from host.sweepgrid import canonical, emulator

METRICS = ("tokens", "tok_s", "ms_per_token", "ttft_ms", "kv_bytes", "pool_high_water", "deadline_misses")
CACHE_VERSION = 3  # the cached entry's layout and the key's recipe; part of every key
CODE_DIRS = ("firmware_py", "host")  # every **/*.py there is hashed: a change there invalidates the cache


def default_cache():
    return paths.state(".kvrtos-cache", "sweep")  # a user folder when installed (host/paths.py)


# ---------------------------------------------------------------------------- hashing




_FILES = {}


def file_sha256(path, _memo=_FILES):
    # SHA-256 of a file's bytes (memoized per process by path, size and mtime)
    st = os.stat(path)
    k = (path, st.st_size, st.st_mtime_ns)
    if k not in _memo:
        _memo[k] = paths.sha256_file(path)
    return _memo[k]


_CODE = {}


def code_files(root=None):
    # the sources the emulator runs: every firmware_py/**/*.py and host/**/*.py (the
    # emulator and every host module it imports: console, generate, trace, boards, ...)
    root = root or paths.ROOT
    files = []
    for top in CODE_DIRS:
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.startswith("."))
            files += [os.path.join(d, n) for n in names if n.endswith(".py")]
    return sorted(files)


def code_sha256(root=None):
    # SHA-256 over the emulator's sources (code_files: path and bytes, sorted), computed
    # once per process
    root = root or paths.ROOT
    if root in _CODE:
        return _CODE[root]
    h = hashlib.sha256()
    for f in code_files(root):
        h.update(os.path.relpath(f, root).replace(os.sep, "/").encode() + b"\0")
        with open(f, "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    _CODE[root] = h.hexdigest()
    return _CODE[root]


def module_files(norm):
    # a scenario's module tasks import from the scenario's folder (host/emulate.py): the
    # files there that each named module may load, present or not (a file the user adds
    # later changes the key too): M.py or every .py of the package M/, and the __init__.py
    # of each package on a dotted name's way
    scen = norm.get("scenario")
    if not isinstance(scen, str) or not scen or not os.path.isfile(scen):
        return []
    try:
        _, cfg = emulator().load_scenario(scen)
    except UserError:
        return []
    folder = os.path.dirname(scen)
    out = set()
    for t in cfg.get("tasks") or []:
        name = t.get("module") if isinstance(t, dict) and t.get("kind") == "module" else None
        if not isinstance(name, str) or not name:
            continue
        parts = name.split(".")
        for i in range(1, len(parts)):
            out.add(os.path.join(folder, *parts[:i], "__init__.py"))
        base = os.path.join(folder, *parts)
        out.add(base + ".py")
        out.add(os.path.join(base, "__init__.py"))
        if os.path.isdir(base):
            for d, dirs, names in os.walk(base):
                dirs[:] = sorted(x for x in dirs if x != "__pycache__")
                out.update(os.path.join(d, n) for n in names if n.endswith(".py"))
    return sorted(out)


def input_files(norm):
    # the files a normalized spec reads: every value that is an existing file path, and
    # the board profile (a name there is boards/NAME.json)
    from host import boards

    out = set()

    def walk(v):
        if isinstance(v, str):
            if os.path.isabs(v) and os.path.isfile(v):
                out.add(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(norm)
    b = norm.get("board")
    if isinstance(b, str) and not os.path.isfile(b):
        try:
            out.add(boards.path_of(b))
        except UserError:
            pass
    return sorted(out)


def input_hashes(norm):
    # {path: SHA-256 of its bytes, or None when absent}: the spec's input files and the
    # scenario's module files; what the key covers and what a worker checks
    out = {}
    for f in sorted(set(input_files(norm)) | set(module_files(norm))):
        out[f] = file_sha256(f) if os.path.isfile(f) else None
    return out


def point_key(norm, code=None, hashes=None):
    # the cache key: SHA-256 of the canonical normalized spec, each input file's SHA-256
    # (input_hashes: module files that are absent count as absent) and the code hash
    h = hashlib.sha256()
    h.update(b"kvrtos-sweep %d\n" % CACHE_VERSION)
    h.update(hashlib.sha256(canonical(norm)).digest())
    for f, sha in sorted((input_hashes(norm) if hashes is None else hashes).items()):
        h.update(f.encode("utf-8") + b"\0" + (sha or "absent").encode() + b"\n")
    h.update((code or code_sha256()).encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------- the cache


class Cache:
    # one JSON file per point, DIR/ab/abcdef....json, written atomically (temp + rename)
    def __init__(self, root):
        self.root = root

    def path(self, key):
        return os.path.join(self.root, key[:2], key + ".json")

    def get(self, key):
        try:
            with open(self.path(key), "rb") as f:
                entry = json.loads(f.read().decode("utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return None  # absent, or unreadable: run it again
        return entry if _entry_ok(entry, key) else None  # another shape: a miss, run it again

    def put(self, key, entry):
        d = os.path.dirname(self.path(key))
        os.makedirs(d, exist_ok=True)
        ignore_folder(self.root)
        data = json.dumps(dict(entry, key=key), sort_keys=True).encode("utf-8")
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(key))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def keys(self):
        out = []
        if os.path.isdir(self.root):
            for d in sorted(os.listdir(self.root)):
                sub = os.path.join(self.root, d)
                if len(d) == 2 and os.path.isdir(sub):
                    out += sorted(n[:-5] for n in os.listdir(sub) if n.endswith(".json") and not n.startswith("."))
        return out


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _entry_ok(entry, key):
    # a cache entry of the shape run() writes and row_of reads: {"key", "status": "ok",
    # "report": {metrics: numbers (or None), ...}} or {"key", "status": "failed", "error": str}
    if not isinstance(entry, dict) or entry.get("key") != key:
        return False
    if entry.get("status") == "failed":
        return isinstance(entry.get("error"), str)
    if entry.get("status") != "ok":
        return False
    rep = entry.get("report")
    if not isinstance(rep, dict):
        return False
    for m in METRICS:
        v = rep.get(m)
        if m == "deadline_misses" and isinstance(v, dict):
            if not all(isinstance(k, str) and _is_num(x) for k, x in v.items()):
                return False
        elif v is not None and not _is_num(v):
            return False
    if not isinstance(rep.get("stop", ""), str):
        return False
    band = rep.get("band", {})
    if not isinstance(band, dict) or not all(
            isinstance(b, dict) and _is_num(b.get("tok_s")) and _is_num(b.get("deadline_misses")) for b in band.values()):
        return False
    inv = rep.get("invariants", {})
    return isinstance(inv, dict) and all(isinstance(k, str) for k in inv)


def ignore_folder(path):
    # the default cache and out folders sit in the repository: each top folder we make
    # there carries a .gitignore of "*" (as .pytest_cache does), so git never sees them
    for top in (paths.state(".kvrtos-cache"), paths.state("sweeps")):
        if os.path.abspath(path).startswith(top + os.sep) and os.path.isdir(top):
            gi = os.path.join(top, ".gitignore")
            if not os.path.exists(gi):
                with open(gi, "w") as f:
                    f.write("# made by ./kv sweep: nothing here is committed\n*\n")
