# `./kv sweep`: a grid of emulations (host/emulate.py) -- boards x models x policies x
# windows x KV element types x scenarios x cost kinds x token counts x seeds -- run on a
# process pool on this machine or on a Dask distributed cluster (--scheduler tcp://...),
# each point's report cached under a hash of everything it depends on (the normalized
# spec, the bytes of its input files, the emulator's code) so a rerun or an interrupted
# sweep only runs what is missing. Output: results.csv, results.md (which settings meet
# the latency and memory target on which board, best first), results.png and
# summary.json in --out (docs/sweep.md).
import csv
import hashlib
import io
import itertools
import json
import os
import signal
import sys
import tempfile
import time

from host import paths
from host.errors import UserError

# the grid's axes: (grid-file key / CLI option without dashes, emulate spec key, parser)
AXES = (
    ("boards", "board", "str"),
    ("models", "model", "str"),
    ("policies", "policy", "str"),
    ("windows", "window", "int"),
    ("kv_dtypes", "kv_dtype", "str"),
    ("scenarios", "scenario", "scenario"),
    ("costs", "cost", "str"),
    ("tokens", "tokens", "int"),
    ("seed", "seed", "int"),
)
AXIS_SPEC = {a: s for a, s, _ in AXES}
# other grid-file keys: the targets, how to run, and fixed spec keys for every point
OPTION_KEYS = ("target_ms_per_token", "target_kv_bytes", "workers", "scheduler", "cache", "out", "spec")
GRID_KEYS = tuple(a for a, _, _ in AXES) + OPTION_KEYS
NO_WINDOW_POLICIES = ("full",)  # a window means nothing to these: one point, not one per window
METRICS = ("tokens", "tok_s", "ms_per_token", "ttft_ms", "kv_bytes", "pool_high_water", "deadline_misses")
# MicroPython costs (viper, bytecode): tok/s and deadline misses again at each end of the
# board-speed band (emulate.band), empty for the other costs
BAND = ("tok_s_slow", "deadline_misses_slow", "tok_s_fast", "deadline_misses_fast")
COLUMNS = ("board", "model", "policy", "window", "kv_dtype", "scenario", "cost", "tokens_requested", "seed") + \
    ("status",) + METRICS + BAND + ("meets_target", "why_not", "key")
CACHE_VERSION = 3  # the cached entry's layout and the key's recipe; part of every key
MAX_WINDOW = 1 << 20  # emulate's bound on --window
SCHEDULER_TIMEOUT_S = 10  # connecting to --scheduler: then one line, not a hang
CODE_DIRS = ("firmware_py", "host")  # every **/*.py there is hashed: a change there invalidates the cache


def default_cache():
    return paths.state(".kvrtos-cache", "sweep")  # a user folder when installed (host/paths.py)


def default_out():
    return paths.state("sweeps", time.strftime("%Y%m%d-%H%M%S"))


# ---------------------------------------------------------------------------- the grid


def _split(value):
    # a CLI comma list, a grid file's list, or one value -> list of stripped strings/values
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        return [v.strip() for v in value.split(",")]
    return [value]


def _parse_axis(axis, kind, raw):
    # the values of one axis; one-line UserError for an empty item or a bad number
    vals = _split(raw)
    if vals is None:
        return None
    if not vals:
        raise UserError("--%s needs at least one value" % axis.replace("_", "-"), 2)
    out = []
    for v in vals:
        if isinstance(v, str) and v == "":
            raise UserError("--%s has an empty item in %r" % (axis.replace("_", "-"), raw), 2)
        if kind == "int":
            if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str) and v.lstrip("-").isdigit())):
                raise UserError("--%s wants whole numbers, got %r" % (axis.replace("_", "-"), v), 2)
            v = int(v)
        elif kind == "scenario":
            if v is None or (isinstance(v, str) and v.lower() == "none"):
                v = None  # decode alone
            elif not isinstance(v, str):
                raise UserError("--scenarios wants names or paths, got %r" % (v,), 2)
        elif not isinstance(v, str):
            raise UserError("--%s wants names, got %r" % (axis.replace("_", "-"), v), 2)
        if v not in out:
            out.append(v)
    return out


def _number(name, v, lo=0.0):
    if v is None or v == "":
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise UserError("--%s wants a number, got %r" % (name.replace("_", "-"), v), 2)
    if not x > lo or x != x or x == float("inf"):
        raise UserError("--%s must be above %g, got %r" % (name.replace("_", "-"), lo, v), 2)
    return int(x) if x == int(x) else x


def load_grid_file(path):
    # the grid file: a JSON object with the keys of GRID_KEYS (lists or single values)
    p = paths.user_path(path)
    try:
        with open(p, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise UserError("no grid file %s" % path, 2)
    except IsADirectoryError:
        raise UserError("grid file %s is a folder" % path, 2)
    except (UnicodeDecodeError, ValueError) as e:
        raise UserError("grid file %s is not JSON: %s" % (path, str(e).splitlines()[0]), 2)
    if not isinstance(data, dict):
        raise UserError("grid file %s must hold a JSON object (keys: %s)" % (path, ", ".join(GRID_KEYS)), 2)
    bad = sorted(k for k in data if k not in GRID_KEYS and not k.startswith("_"))
    if bad:
        raise UserError("grid file %s: unknown key %s (known: %s; keys starting with _ are comments)"
                        % (path, ", ".join(bad), ", ".join(GRID_KEYS)), 2)
    for k in ("cache", "out"):
        if isinstance(data.get(k), str):  # relative to the grid file
            data[k] = os.path.normpath(os.path.join(os.path.dirname(p), data[k]))
    return {k: v for k, v in data.items() if not k.startswith("_")}


def merge(grid=None, **cli):
    # the grid file's settings with the command line's on top (None: not given)
    out = dict(load_grid_file(grid)) if grid else {}
    for k, v in cli.items():
        if k not in GRID_KEYS:
            raise TypeError("unknown sweep option %s" % k)
        if v is not None:
            out[k] = v
    return out


def _emulate():
    try:
        from host import emulate
    except ImportError as e:  # the emulator is part of the project; say what is missing
        raise UserError("the emulator (host/emulate.py) cannot be imported: %s" % e, 1)
    return emulate


def _label(v):
    return "-" if v is None else str(v)


def _min_window(norm):
    # the fewest tokens the point's policy keeps (firmware_py/kvlayout.py); 0 for policy full
    if norm.get("policy") in NO_WINDOW_POLICIES:
        return 0
    from firmware_py import kvlayout

    try:
        return kvlayout.min_budget(norm["policy"], norm.get("sinks", kvlayout.SINKS))
    except Exception:  # noqa: BLE001 - an unknown policy: normalize's and the decode's to refuse
        return 0


def expand(settings):
    # the grid's points: ([point], {reason: skipped count}). A point: {"axes": {spec key:
    # value as given}, "spec": the spec given to emulate, "norm": emulate.normalize(spec)}.
    # A combination the emulator refuses (normalize: e.g. a cost kind one board has no
    # figures for) and the second and later copies of one point (a window for policy
    # full) are skipped and counted, not a failure; a value that no combination accepts
    # (an unknown board, a missing model, a misspelt policy) is a one-line UserError
    # naming the option and the emulator's reason.
    emulate = _emulate()
    fixed = settings.get("spec") or {}
    if not isinstance(fixed, dict):
        raise UserError("the grid's \"spec\" must be an object of emulate spec keys (%s)" % ", ".join(sorted(emulate.DEFAULTS)), 2)
    for k in fixed:
        if k not in emulate.DEFAULTS:
            raise UserError("the grid's \"spec\" has an unknown key %r (emulate spec keys: %s)" % (k, ", ".join(sorted(emulate.DEFAULTS))), 2)
    axes = []
    for axis, key, kind in AXES:
        vals = _parse_axis(axis, kind, settings.get(axis))
        if vals is not None:
            axes.append((axis, key, vals))
        if axis == "windows" and vals:
            # checked here, not only by the points: policy full drops its windows, and a
            # bad one must still be an error (emulate --window refuses it too)
            for v in vals:
                if not 1 <= v <= MAX_WINDOW:
                    raise UserError("--windows wants windows of 1..%d tokens (policy full runs without one), got %d"
                                    % (MAX_WINDOW, v), 2)
    keys = [k for _, k, _ in axes]
    points, skipped, seen = [], {}, set()
    used = {}  # (axis, value) -> points it takes part in (copies count)
    first_why = {}  # (axis, value) -> the first reason normalize gave for a point with it
    for combo in itertools.product(*[vals for _, _, vals in axes]):
        given = dict(zip(keys, combo, strict=True))
        spec = dict(fixed)
        spec.update(given)
        reason = None
        policy = spec.get("policy", emulate.DEFAULTS.get("policy"))
        if policy in NO_WINDOW_POLICIES and spec.get("window") is not None:
            spec.pop("window")
            given["window"] = None
            reason = "a window for policy %s (it runs once, without one)" % policy
        tags = [(a, v) for (a, _, _), v in zip(axes, combo, strict=True)]
        try:
            norm = emulate.normalize(spec)
        except UserError as e:
            why = (str(e).splitlines() or ["refused"])[0]
            skipped[why] = skipped.get(why, 0) + 1
            for t in tags:
                first_why.setdefault(t, why)
            continue
        low = _min_window(norm)
        if low and norm.get("window", 0) < low:
            # what the decode would refuse at run time, refused here: a skip (another
            # window or policy may take it), an error when no combination does
            why = "policy %s needs a window of at least %d token%s, got %s" % (
                norm["policy"], low, "" if low == 1 else "s", norm.get("window"))
            skipped[why] = skipped.get(why, 0) + 1
            for t in tags:
                first_why.setdefault(t, why)
            continue
        for t in tags:
            used[t] = used.get(t, 0) + 1
        canon = canonical(norm)
        if canon in seen:
            why = reason or "the same point as another combination"
            skipped[why] = skipped.get(why, 0) + 1
            continue
        seen.add(canon)
        points.append({"axes": given, "spec": spec, "norm": norm})
    # a value no combination accepts is a mistake, not a skip: blame the one that fails on
    # its own (with the other keys at their defaults), else the first
    dead = [(axis, key, v) for axis, key, vals in axes for v in vals if not used.get((axis, v))]
    for axis, key, v in dead:
        alone = dict(fixed)
        alone[key] = v
        if key == "window":
            alone["policy"] = "window"
        try:
            emulate.normalize(alone)
        except UserError as e:
            raise UserError("--%s %s: %s" % (axis.replace("_", "-"), _label(v), (str(e).splitlines() or ["refused"])[0]), 2)
    if dead:
        axis, _, v = dead[0]
        raise UserError("--%s %s: %s" % (axis.replace("_", "-"), _label(v), first_why.get((axis, v), "refused")), 2)
    return points, dict(sorted(skipped.items()))


# ---------------------------------------------------------------------------- hashing


def canonical(obj):
    # the one byte form of a spec for hashing: sorted keys, no spaces, UTF-8
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


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
        _, cfg = _emulate().load_scenario(scen)
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
        _ignore_folder(self.root)
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
    # a cache entry of the shape run() writes and _row reads: {"key", "status": "ok",
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


def _ignore_folder(path):
    # the default cache and out folders sit in the repository: each top folder we make
    # there carries a .gitignore of "*" (as .pytest_cache does), so git never sees them
    for top in (paths.state(".kvrtos-cache"), paths.state("sweeps")):
        if os.path.abspath(path).startswith(top + os.sep) and os.path.isdir(top):
            gi = os.path.join(top, ".gitignore")
            if not os.path.exists(gi):
                with open(gi, "w") as f:
                    f.write("# made by ./kv sweep: nothing here is committed\n*\n")


# ---------------------------------------------------------------------------- running


def emulate_point(spec, hashes=None):
    # run one point (in a worker process, here or on a Dask worker): {"status": "ok",
    # "report"} or {"status": "failed", "error": one line} for the user's mistake (the
    # emulator's UserError of exit 2: a bad spec, a model that does not fit, a user
    # module that does not import); anything else is {"status": "error"}: an internal
    # failure (emulate.TaskFault: one of the emulator's own firmware tasks raised, another
    # UserError, any exception: a bug), reported and never cached. spec: the normalized
    # spec (absolute paths); hashes: input_hashes(spec) as the client computed them for
    # the key: a worker whose files differ refuses the point (an error, not cached). "code"
    # is this worker's code hash: a worker running other sources than the client is refused.
    out = None
    if hashes is not None:
        mine = input_hashes(spec)
        for f in sorted(set(hashes) | set(mine)):
            want, got = hashes.get(f), mine.get(f)
            if want != got:
                out = {"status": "error", "error": "the worker's %s %s (the key was made with %s)" % (
                    _short(f), "is missing" if got is None else "has sha256 %s" % got[:12],
                    "no such file" if want is None else "sha256 %s" % want[:12])}
                break
    if out is None:
        try:
            emulate = _emulate()
            fault = getattr(emulate, "TaskFault", ())
            try:
                rep = emulate.run(spec)
                rep["band"] = emulate.band(spec, rep)  # both ends of the board-speed band ({} but for MicroPython costs)
                out = {"status": "ok", "report": rep}
            except UserError as e:
                line = (str(e).splitlines() or ["failed"])[0]
                user = e.code == 2 and not (fault and isinstance(e, fault))
                out = {"status": "failed" if user else "error", "error": line}
        except Exception as e:  # noqa: BLE001 - one point's bug must not stop the sweep
            out = {"status": "error", "error": "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0])}
    out["code"] = code_sha256()
    return out


def _check_scheduler(address):
    if not isinstance(address, str) or "://" not in address or not address.split("://", 1)[1]:
        raise UserError("--scheduler wants a Dask scheduler address like tcp://HOST:8786, got %r" % (address,), 2)
    scheme = address.split("://", 1)[0]
    if scheme not in ("tcp", "tls", "inproc", "ws", "wss", "ucx"):
        raise UserError("--scheduler: unknown protocol %r in %s (tcp://HOST:PORT)" % (scheme, address), 2)


def _worker_init():
    # a pool worker ends with the sweep: on Linux, SIGTERM when its parent dies (a killed
    # sweep leaves no orphan emulating on); the parent's SIGTERM handler (main) is not
    # the worker's: TERM ends a worker at once
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _pool_results(specs, workers):
    # (index, result) as each point finishes, on a process pool of `workers`
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ex = ProcessPoolExecutor(max_workers=workers, initializer=_worker_init)
    finished = False
    try:
        futs = {ex.submit(emulate_point, s, h): i for i, s, h in specs}
        for fut in as_completed(futs):
            try:
                res = fut.result()
            except Exception as e:  # a worker that died (killed, out of memory)
                res = {"status": "error", "error": "worker died: %s" % (str(e).splitlines() or [type(e).__name__])[0]}
            yield futs[fut], res
        finished = True
    finally:
        if not finished:
            # stopped early (Ctrl-C, SIGTERM, a raise in on_result): the points still
            # running are not waited for; their results would not be stored anyway
            for proc in list((getattr(ex, "_processes", None) or {}).values()):
                try:
                    proc.terminate()
                except (OSError, AttributeError):
                    pass
        ex.shutdown(wait=True, cancel_futures=True)


def _connect(client_cls, address, limit_s=None):
    # a distributed.Client for `address`, the whole connection and handshake bounded by a
    # wall clock: a peer that is not a Dask scheduler may answer bytes the handshake
    # misreads (an HTTP server's reply read as a frame length: numpy's MemoryError) or
    # accept and say nothing (the client's own timeout does not bound that). Any failure
    # is one line naming its class; the connecting thread of a peer that never answers is
    # left behind (a daemon thread: it does not hold the process at exit)
    import threading

    limit_s = SCHEDULER_TIMEOUT_S if limit_s is None else limit_s
    box = {}

    def connect():
        try:
            box["client"] = client_cls(address, timeout="%gs" % limit_s)
        except BaseException as e:  # noqa: BLE001 - reported below in one line, whatever it is
            box["error"] = e

    t = threading.Thread(target=connect, name="kvrtos-sweep-connect", daemon=True)
    t.start()
    wall = limit_s + 2  # the client's own timeout first (a closed port: its OSError), then ours
    t.join(wall)
    if t.is_alive():
        raise UserError("cannot reach the Dask scheduler at %s: no Dask handshake within %g s (the peer accepted "
                        "the connection and answered nothing a Dask scheduler would)" % (address, wall), 1)
    e = box.get("error")
    if e is not None:
        if not isinstance(e, Exception):
            raise e  # KeyboardInterrupt, SystemExit: not the peer's doing
        text = (str(e).splitlines() or [""])[0]
        hint = "" if isinstance(e, (OSError, TimeoutError)) else \
            " (the peer answered what a Dask scheduler would not: is it one?)"
        raise UserError("cannot reach the Dask scheduler at %s: %s%s%s"
                        % (address, type(e).__name__, ": " + text if text else "", hint), 1)
    return box["client"]


def _dask_results(specs, address, keys):
    # (index, result) as each point finishes, on the Dask cluster at `address`
    import logging

    _check_scheduler(address)
    try:
        from distributed import Client, as_completed
    except ImportError as e:
        raise UserError("--scheduler needs dask[distributed] (%s); run ./kv once to install it" % e, 2)
    quiet = [logging.getLogger(n) for n in ("distributed", "distributed.client", "distributed.comm", "tornado")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.CRITICAL)
    try:
        client = _connect(Client, address)
        try:
            futs = {}
            for i, s, h in specs:
                futs[client.submit(emulate_point, s, h, key="kvrtos-sweep-%s" % keys[i], pure=False)] = i
            for fut in as_completed(list(futs)):
                try:
                    res = fut.result()
                except Exception as e:  # noqa: BLE001 - the worker's exception, or a lost worker
                    res = {"status": "error", "error": "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0])}
                yield futs[fut], res
        finally:
            client.close(timeout=SCHEDULER_TIMEOUT_S)
    finally:
        for lg, lv in zip(quiet, levels, strict=True):
            lg.setLevel(lv)


class Progress:
    # points done / cached / failed: a rich bar on a terminal's stderr, plain lines
    # (about every 10 %, and the last) otherwise
    def __init__(self, total, stream=None, live=None):
        self.total, self.ran, self.cached, self.failed = total, 0, 0, 0
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._bar = self._task = None
        self._next = 0

    def __enter__(self):
        if self.live and self.total:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self._bar = RichProgress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                                     TimeElapsedColumn(), console=Console(file=self.stream), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(self._text(), total=self.total)
        return self

    def _text(self):
        return "cached %d, ran %d, failed %d" % (self.cached, self.ran, self.failed)

    def done(self, cached=False, failed=False):
        if cached:
            self.cached += 1
        else:
            self.ran += 1
        if failed:
            self.failed += 1
        n = self.cached + self.ran
        if self._bar is not None:
            self._bar.update(self._task, completed=n, description=self._text())
        elif n >= self._next or n == self.total:
            print("sweep: %d/%d points (%s)" % (n, self.total, self._text()), file=self.stream, flush=True)
            self._next = n + max(1, self.total // 10)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()
        return False


def run(settings, progress=None, on_result=None):
    # the sweep: {"rows": [row per point, in grid order], "summary": {...}}. settings: the
    # merged grid (merge()); progress: None (Progress on stderr), False (silent) or a
    # Progress; on_result(index, row) after each point is stored (a raise there stops
    # the sweep: what finished stays cached).
    points, skipped = expand(settings)
    if not points:
        raise UserError("the grid has no point to run (%s)" % (
            "; ".join("%d skipped: %s" % (n, r) for r, n in skipped.items()) or "no axis values"), 2)
    targets = {"ms_per_token": _number("target_ms_per_token", settings.get("target_ms_per_token")),
               "kv_bytes": _number("target_kv_bytes", settings.get("target_kv_bytes"))}
    workers = settings.get("workers")
    scheduler = settings.get("scheduler") or None
    if scheduler is not None:
        _check_scheduler(scheduler)
    if workers in (None, ""):
        workers = os.cpu_count() or 1
    try:
        workers = int(workers)
    except (TypeError, ValueError):
        raise UserError("--workers wants a whole number, got %r" % (workers,), 2)
    if workers < 1:
        raise UserError("--workers must be 1 or more, got %d" % workers, 2)
    cache = Cache(paths.user_path(settings.get("cache") or default_cache()))
    code = code_sha256()
    hashes = [input_hashes(p["norm"]) for p in points]
    keys = [point_key(p["norm"], code, h) for p, h in zip(points, hashes, strict=True)]
    entries = [cache.get(k) for k in keys]
    # every executor gets the normalized spec (absolute paths: a Dask worker in another
    # folder reads the same files) and the hashes its key was made with
    todo = [(i, points[i]["norm"], hashes[i]) for i, e in enumerate(entries) if e is None]
    status = {"ran": 0, "cached": len(points) - len(todo), "failed": 0, "errors": []}
    bar = Progress(len(points)) if progress is None else progress
    if bar is False:
        bar = Progress(len(points), stream=io.StringIO(), live=False)
    with bar:
        for i, e in enumerate(entries):
            if e is not None:
                bar.done(cached=True, failed=e["status"] == "failed")
                if on_result:
                    on_result(i, _row(points[i], keys[i], e, targets))
        if todo:
            results = _dask_results(todo, scheduler, keys) if scheduler else _pool_results(todo, min(workers, len(todo)))
            try:
                for i, res in results:
                    if res.get("code") != code:
                        res = {"status": "error", "error": "the worker runs other kvrtos sources than this checkout "
                                                           "(code hash %s, here %s)" % (str(res.get("code"))[:12], code[:12])}
                    entry = {"status": res["status"], "spec": points[i]["norm"]}
                    if res["status"] == "ok":
                        entry["report"] = res["report"]
                    else:
                        entry["error"] = _no_machine_paths(str(res["error"]))
                    if res["status"] in ("ok", "failed"):
                        cache.put(keys[i], entry)
                    else:
                        status["errors"].append(entry["error"])
                    entries[i] = entry
                    status["ran"] += 1
                    status["failed"] += res["status"] != "ok"
                    bar.done(failed=res["status"] != "ok")
                    if on_result:
                        on_result(i, _row(points[i], keys[i], entry, targets))
            finally:
                close = getattr(results, "close", None)
                if close:
                    close()  # a generator stopped early shuts its pool / client down
    rows = [_row(p, k, e, targets) for p, k, e in zip(points, keys, entries, strict=True)]
    summary = {
        "points": len(points), "ran": status["ran"], "cached": status["cached"],
        "failed": sum(r["status"] != "ok" for r in rows),
        "skipped": sum(skipped.values()), "skipped_reasons": skipped,
        "meets_target": sum(bool(r["meets_target"]) for r in rows),
        "targets": targets, "executor": _executor(scheduler, min(workers, len(todo))),
        "cache": cache.root, "best": best_per_board(rows), "errors": status["errors"],
    }
    return {"rows": rows, "summary": summary}


def _executor(scheduler, workers):
    # what ran the points, in words
    if not workers:
        return "none (every point from the cache)"
    if scheduler:
        return "dask " + scheduler
    return "process pool (%d worker%s)" % (workers, "" if workers == 1 else "s")


def _total_misses(v):
    # the report's deadline misses as one integer (a number, or {"total": n, ...})
    if isinstance(v, dict):
        if "total" in v:
            return v["total"]
        return sum(x for x in v.values() if isinstance(x, int))
    return v


def _row(point, key, entry, targets):
    # one table row: the point's settings (as normalized), its metrics and the verdict
    norm = point["norm"]
    row = {c: None for c in COLUMNS}
    for c in ("board", "model", "policy", "window", "kv_dtype", "scenario", "cost", "seed"):
        v = norm.get(c)
        if c in ("model", "scenario", "board") and isinstance(v, str) and os.path.isabs(v):
            v = _short(v)
        if c == "scenario":
            v = _scenario_name(v)
        row[c] = v
    if norm.get("policy") in NO_WINDOW_POLICIES:
        row["window"] = None
    row["tokens_requested"] = norm.get("tokens")
    row["status"] = entry["status"]
    row["key"] = key[:16]
    if entry["status"] == "ok":
        rep = entry["report"]
        for m in METRICS:
            row[m] = _total_misses(rep.get(m)) if m == "deadline_misses" else rep.get(m)
        for end, b in (rep.get("band") or {}).items():
            if end in ("slow", "fast"):
                row["tok_s_" + end] = b["tok_s"]
                row["deadline_misses_" + end] = b["deadline_misses"]
        why = []
        if targets.get("ms_per_token") is not None and not (_num(row["ms_per_token"]) <= targets["ms_per_token"]):
            why.append("ms/token %s > %s" % (row["ms_per_token"], targets["ms_per_token"]))
        if targets.get("kv_bytes") is not None and not (_num(row["kv_bytes"]) <= targets["kv_bytes"]):
            why.append("KV %s B > %s B" % (row["kv_bytes"], targets["kv_bytes"]))
        if _num(row["deadline_misses"]) > 0:
            why.append("%s deadline misses" % row["deadline_misses"])
        elif (row["deadline_misses_slow"] or 0) > 0:  # the audio must still hold on a slow board
            why.append("%s deadline misses at the slow end of the board-speed band" % row["deadline_misses_slow"])
        if row["tokens"] is not None and row["tokens_requested"] is not None and row["tokens"] < row["tokens_requested"]:
            why.append("%s of %s tokens%s" % (row["tokens"], row["tokens_requested"],
                                             " (%s)" % rep["stop"] if rep.get("stop") else ""))
        inv = rep.get("invariants")
        if isinstance(inv, dict) and inv.get("ok") is False:
            # deadline misses are a result (said above), not a broken emulator
            bad = sorted(k for k, v in inv.items() if isinstance(v, dict) and v.get("ok") is False and k != "deadlines")
            if bad:
                why.append("emulator invariants not met: %s" % ", ".join(bad))
        if not _num(row["ms_per_token"]) > 0:
            why.append("no ms per token")
        row["meets_target"] = not why
        row["why_not"] = "; ".join(why)
    else:
        row["meets_target"] = False
        row["why_not"] = _no_machine_paths(str(entry.get("error", "failed")))
    return row


def _no_machine_paths(text):
    # a one-line reason as the tables show it: the repository's and ../shared's folders left out
    shared = os.path.dirname(paths.shared_models() or os.path.join(os.path.dirname(paths.ROOT), "shared", "models"))
    for base, label in ((paths.ROOT + os.sep, ""), (shared + os.sep, "shared/")):
        text = text.replace(base, label)
    return text


def _scenario_name(v):
    # a scenario as the table shows it: its name when it is scenarios/NAME.json, "none" for none
    if not v:
        return "none"
    if v.startswith("scenarios/") and v.endswith(".json") and v.count("/") == 1:
        return v[len("scenarios/"):-len(".json")]
    return v


def _num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else float("inf")


def _short(p):
    # a path as the table shows it: relative to the repository when inside it, else its name
    rel = os.path.relpath(p, paths.ROOT)
    if not rel.startswith(".."):
        return rel.replace(os.sep, "/")
    rel = os.path.relpath(p, os.path.dirname(paths.ROOT))
    return rel.replace(os.sep, "/") if not rel.startswith("..") else os.path.basename(p)


def _rank(r):
    # best first: meeting the target, then fewer ms per token, then fewer KV bytes
    return (not r["meets_target"], r["status"] != "ok", _num(r["ms_per_token"]), _num(r["kv_bytes"]), r["key"])


def best_per_board(rows):
    # {board: the best row's settings and figures}, boards in first-seen order
    out = {}
    for r in sorted(rows, key=_rank):
        if r["board"] not in out and r["status"] == "ok":
            out[r["board"]] = {c: r[c] for c in COLUMNS if c not in ("key", "board")}
    return out


# ---------------------------------------------------------------------------- writers


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "%.6g" % v
    return str(v)


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([_cell(r[c]) for c in COLUMNS])


def markdown(rows, summary, command=None):
    # results.md: the targets, per board how many settings meet them and the best, then
    # every point best first, failed ones last with their reason
    t = summary["targets"]
    lines = ["# Sweep results", ""]
    if command:
        lines += ["Made by:", "", "```sh", command, "```", ""]
    tgt = []
    if t.get("ms_per_token") is not None:
        tgt.append("at most %s ms per token" % t["ms_per_token"])
    if t.get("kv_bytes") is not None:
        tgt.append("at most %s KV bytes" % t["kv_bytes"])
    tgt.append("no deadline miss of a co-running task, every requested token emitted")
    lines += ["Target: " + ", ".join(tgt) + ". Figures are the emulator's (host/emulate.py: the board "
              "profile's cost model on a virtual clock), estimates until the profile is calibrated on a board "
              "(each report's cost figures name their sources).", ""]
    skipped = ", ".join("%d: %s" % (n, r) for r, n in summary["skipped_reasons"].items())
    lines += ["%d points: %d meet the target, %d failed; %d combinations skipped%s." % (
        summary["points"], summary["meets_target"], summary["failed"], summary["skipped"],
        " (" + skipped + ")" if skipped else ""), ""]
    boards = []
    for r in rows:
        if r["board"] not in boards:
            boards.append(r["board"])
    lines += ["## Per board", "", "| board | points | meet the target | best setting | ms/token | tok/s | KV bytes |",
              "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for b in boards:
        mine = [r for r in rows if r["board"] == b]
        best = sorted(mine, key=_rank)[0]
        if best["status"] == "ok":
            setting = _setting(best) + ("" if best["meets_target"] else " (misses: %s)" % best["why_not"])
        else:
            setting = "(every point failed: %s)" % best["why_not"]
        lines.append("| %s | %d | %d | %s | %s | %s | %s |" % (
            b, len(mine), sum(bool(r["meets_target"]) for r in mine), setting.replace("|", "\\|"),
            _cell(best["ms_per_token"]), _cell(best["tok_s"]), _cell(best["kv_bytes"])))
    cols = ("board", "model", "policy", "window", "kv_dtype", "scenario", "cost", "tokens", "ms_per_token", "tok_s",
            "ttft_ms", "kv_bytes", "pool_high_water", "deadline_misses") + BAND + ("meets_target", "why_not")
    lines += ["", "## Every point, best first", "", "| " + " | ".join(c.replace("_", " ") for c in cols) + " |",
              "| " + " | ".join("---:" if c in METRICS or c in BAND else "---" for c in cols) + " |"]
    for r in sorted(rows, key=_rank):
        lines.append("| " + " | ".join(_cell(r[c]).replace("|", "\\|") for c in cols) + " |")
    lines.append("")
    return "\n".join(lines)


def _setting(r):
    parts = [r["policy"] + ("(%s)" % r["window"] if r["window"] is not None else ""), r["kv_dtype"], r["cost"]]
    if r["scenario"] and r["scenario"] != "none":
        parts.append(str(r["scenario"]))
    if r["model"]:
        parts.insert(0, os.path.basename(str(r["model"])))
    return " ".join(str(p) for p in parts)


def plot(rows, summary, path):
    # results.png: ms per token against KV bytes, one panel per board, the targets as
    # dashed lines; colour: KV element type, marker: cost kind, hollow: misses the target
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok" and _num(r["ms_per_token"]) > 0 and _num(r["kv_bytes"]) >= 0
          and _num(r["ms_per_token"]) != float("inf") and _num(r["kv_bytes"]) != float("inf")]
    boards = []
    for r in rows:
        if r["board"] not in boards:
            boards.append(r["board"])
    n = len(boards)
    ncol = min(n, 3)
    nrow = -(-n // ncol)
    fig, axs = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.8 * nrow), squeeze=False)
    dtypes = sorted({r["kv_dtype"] for r in ok})
    costs = sorted({r["cost"] for r in ok})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^v<>ph*"
    t = summary["targets"]
    for k, b in enumerate(boards):
        ax = axs[k // ncol][k % ncol]
        mine = [r for r in ok if r["board"] == b]
        for r in mine:
            c = colors[dtypes.index(r["kv_dtype"]) % len(colors)]
            m = markers[costs.index(r["cost"]) % len(markers)]
            ax.scatter([r["kv_bytes"]], [r["ms_per_token"]], marker=m, s=36,
                       facecolors=c if r["meets_target"] else "none", edgecolors=c)
        if not mine:
            ax.text(0.5, 0.5, "no point with figures", ha="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(b, fontsize=10)
            continue
        if t.get("ms_per_token") is not None:
            ax.axhline(t["ms_per_token"], color="grey", linestyle="--", linewidth=1)
        if t.get("kv_bytes") is not None:
            ax.axvline(t["kv_bytes"], color="grey", linestyle=":", linewidth=1)
        ys = [r["ms_per_token"] for r in mine]
        if ys and min(ys) > 0 and max(ys) / min(ys) > 30:
            ax.set_yscale("log")
        ax.set_title(b, fontsize=10)
        ax.set_xlabel("KV bytes")
        ax.set_ylabel("ms per token (emulated)")
    for k in range(n, nrow * ncol):
        axs[k // ncol][k % ncol].axis("off")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", linestyle="", color=colors[i % len(colors)], label="KV " + d)
               for i, d in enumerate(dtypes)]
    handles += [Line2D([], [], marker=markers[i % len(markers)], linestyle="", color="black", label="cost " + c)
                for i, c in enumerate(costs)]
    handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="none", color="black", label="misses the target"))
    if t.get("ms_per_token") is not None:
        handles.append(Line2D([], [], color="grey", linestyle="--", label="target ms/token"))
    if t.get("kv_bytes") is not None:
        handles.append(Line2D([], [], color="grey", linestyle=":", label="target KV bytes"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    left = sum(r["status"] == "ok" for r in rows) - len(ok)
    fig.suptitle("kv sweep: ms per token against KV bytes" + (" (%d failed, %d without figures: not drawn)" % (
        sum(r["status"] != "ok" for r in rows), left) if len(ok) < len(rows) else ""), fontsize=11)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * ((len(handles) - 1) // 6), 1, 0.95))
    fig.savefig(path, dpi=90, metadata={"Software": None})  # no version stamp: same rows, same bytes
    plt.close(fig)


def write(result, out_dir, command=None):
    # results.csv, results.md, results.png and summary.json into out_dir; their paths
    os.makedirs(out_dir, exist_ok=True)
    _ignore_folder(out_dir)
    rows, summary = result["rows"], result["summary"]
    files = {n: os.path.join(out_dir, n) for n in ("results.csv", "results.md", "results.png", "summary.json")}
    write_csv(rows, files["results.csv"])
    with open(files["results.md"], "w") as f:
        f.write(markdown(rows, summary, command))
    plot(rows, summary, files["results.png"])
    doc = dict(summary, command=command, cache=None, rows=rows)  # no absolute paths in the committed files
    with open(files["summary.json"], "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    return files


class Terminated(UserError):
    # SIGTERM during `./kv sweep`: one line and exit 143 (128 + 15, as a shell reports it)
    pass


class _terminated_one_line:
    # while the sweep runs, SIGTERM raises Terminated in the main thread: the pool's
    # workers are cancelled (each ends with its parent: _worker_init), every finished point
    # is already in the cache (entries are written whole: Cache.put), so the same command
    # resumes; a half-written output file in --out is rewritten by that rerun
    def __enter__(self):
        import threading

        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second TERM ends it at once
        raise Terminated("terminated; every finished point is cached: rerun the same command to resume", 128 + 15)

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False


def main(settings, as_json=False, command=None):
    # `./kv sweep`: run, write, print where (and the summary with --json); exit 1 after
    # writing when some point raised a bug (not a UserError)
    out = paths.user_path(settings["out"]) if settings.get("out") else default_out()
    with _terminated_one_line():
        result = run(settings)
        files = write(result, out, command)
    s = result["summary"]
    if as_json:
        print(json.dumps(dict(s, out=out, files=files), sort_keys=True))
    else:
        print("sweep: %d point%s (%d ran, %d cached, %d failed, %d skipped), %d meet%s the target"
              % (s["points"], "" if s["points"] == 1 else "s", s["ran"], s["cached"], s["failed"], s["skipped"],
                 s["meets_target"], "s" if s["meets_target"] == 1 else ""))
        w = max([len(b) for b in s["best"]] or [0])
        for b, r in s["best"].items():
            print("  %-*s best: %s  %s ms/token  %s KV B%s" % (w, b, _setting(r), _cell(r["ms_per_token"]), _cell(r["kv_bytes"]),
                                                               "" if r["meets_target"] else "  (misses: %s)" % r["why_not"]))
        print("wrote %s" % out)
    if s["errors"]:
        raise UserError("%d points raised an internal error (not cached; first: %s)" % (len(s["errors"]), s["errors"][0]), 1)
    return result
