# The application config: which tasks run beside the decode and the decode's settings,
# one JSON file flashed with the firmware as kvrtos.json (firmware_py/app.py reads it at
# boot) and the same format as the emulator's scenarios (scenarios/*.json, host/emulate.py).
# Runs on MicroPython and CPython; configuration code (allocates; not a hot path).
#
#   cfg = appcfg.load(open("kvrtos.json").read())     # validated: AppConfigError, one line
#   bw = bandwidth.Bandwidth(board, kernel=k, user_categories=appcfg.categories(cfg))
#   env = appcfg.make_env(k, bw, cfg, board)           # the DMA queue (engine spawned), tier ids
#   loads = appcfg.spawn(k, cfg, env)                  # the workloads, each with .name, .stats()
#
# The format (every key but "tasks"' kind and name optional; docs/emulator.md):
#   {"name": "voice-assistant", "title": "...", "comment": "...",
#    "decode": {"model": "model.bin", "tokenizer": "tokenizer.bin", "policy": "full",
#               "window": 0, "sinks": 4, "kv_dtype": "fp32", "tokens": 64, "prompt": "",
#               "seed": 0, "temperature": 0.0, "top_p": 1.0, "priority": 1, "piece_bytes": 0, "kv_blocks": 0,
#               "prefix": "...", "chats": [{"name": "a", "prompt": "...", "tokens": 32}]},
#    "dma": {"priority": 6, "slots": 32, "max_burst": 16384},
#    "tasks": [{"kind": "audio", "name": "mic", "priority": 7, "rate_hz": 16000, ...},
#              {"kind": "module", "name": "mine", "module": "m", "factory": "f", "args": {}}],
#    "emulate": {...}}   # the emulator's own defaults (board, cost, ...): host/emulate.py checks them
# A task's "budget_permille" reserves that share of its payload tier's bandwidth window for
# its category (bandwidth.Bandwidth.set_budget); each task's category is named after it.
import json

from firmware_py import workloads
from firmware_py.sample import SEED_MAX, TEMPERATURE_MAX
from firmware_py.kvlayout import DTYPES as KV_DTYPES, POLICIES

KINDS = ("audio", "wifi", "sensor", "wakeword", "module")
TOP_KEYS = ("name", "title", "comment", "decode", "dma", "tasks", "emulate")
MAX_TASKS = 12  # tasks a config may list

# decode keys: name -> (type, lo, hi) (lo/hi for ints and floats; None for strings)
DECODE_KEYS = {
    "model": (str, None, None), "tokenizer": (str, None, None), "policy": (str, None, None),
    "window": (int, 0, 1 << 20), "sinks": (int, 0, 64), "kv_dtype": (str, None, None),
    "tokens": (int, 1, 1 << 20), "prompt": (str, None, None), "seed": (int, 0, SEED_MAX),
    "temperature": (float, 0.0, TEMPERATURE_MAX), "top_p": (float, 0.0, 1.0), "priority": (int, 0, 7),
    "piece_bytes": (int, 0, 1 << 24), "kv_blocks": (int, 0, 1 << 20), "prefix": (str, None, None), "chats": (list, None, None),
    "slice_us": (int, 0, 10000000),
    # the emulator's deep-sleep conversation (host/emulate.py checks the turns)
    "turns": (list, None, None), "sleep_ms": (int, 0, 86400000),
    "comment": (str, None, None),
}
CHAT_KEYS = {"name": (str, None, None), "prompt": (str, None, None), "tokens": (int, 1, 1 << 20),
             "priority": (int, 0, 7), "seed": (int, 0, SEED_MAX), "comment": (str, None, None)}
OPEN_LO = ("top_p",)  # keys whose lower bound is excluded (top_p 0 keeps nothing)
DMA_KEYS = {"priority": (int, 0, 7), "slots": (int, 1, 4096), "max_burst": (int, 1, 1 << 20),
            "comment": (str, None, None)}

# per kind: its parameters -> (type, lo, hi); every kind also takes name, priority,
# budget_permille, comment. Values are checked again by the workload's own constructor
COMMON = {"kind": (str, None, None), "name": (str, None, None), "priority": (int, 0, 7),
          "budget_permille": (int, 0, 1000), "comment": (str, None, None)}
PARAMS = {
    "audio": {"rate_hz": (int, 1, 1000000), "sample_bytes": (int, 1, 8), "period_us": (int, 100, 10000000),
              "halves": (int, 2, 64), "slots": (int, 1, 4096), "deadline_us": (int, 0, 100000000),
              "src": (str, None, None), "dst": (str, None, None)},
    "wifi": {"packet_bytes": (int, 32, 4064), "packets": (int, 1, 65536), "period_us": (int, 100, 100000000),
             "offset_us": (int, 0, 100000000), "tx_bufs": (int, 1, 1024), "paced": (bool, None, None),
             "group": (int, 1, 65536), "src": (str, None, None), "dst": (str, None, None)},
    # SensorRead: every period_us read read_bytes into SRAM (by the CPU, or by the DMA
    # queue with "dma": true; bus_bytes_per_s > 0: the bus transfer's time first), then cpu_us
    "sensor": {"period_us": (int, 100, 100000000), "read_bytes": (int, 1, 4064), "cpu_us": (int, 0, 10000000),
               "deadline_us": (int, 0, 100000000), "offset_us": (int, 0, 100000000),
               "bus_bytes_per_s": (int, 0, 1000000000), "dma": (bool, None, None), "tier": (str, None, None)},
    # WakeWord: cpu_us of keyword spotting per frame; "audio": the name of an audio task
    # listed before it, whose newest frame each period reads from PSRAM (its period then)
    "wakeword": {"period_us": (int, 100, 100000000), "cpu_us": (int, 0, 10000000), "deadline_us": (int, 0, 100000000),
                 "offset_us": (int, 0, 100000000), "audio": (str, None, None)},
    # step_us: what one step of the task (its code between two yields) costs on the board,
    # e.g. ./kv boardtime's prediction for the function a step runs: the emulator charges it
    # to its virtual clock before each step; on a board the clock is real and it is not charged.
    # step_emitter: the code's emitter (bytecode, native, viper: boardtime's), whose factor's
    # band the emulator's runs at the band's ends scale step_us by (host/emulate.py checks it)
    "module": {"module": (str, None, None), "factory": (str, None, None), "args": (dict, None, None),
               "step_us": (int, 0, 10000000), "step_emitter": (str, None, None)},
}
PRIORITY = {"audio": 7, "wakeword": 5, "sensor": 5, "wifi": 4, "module": 3}  # default priorities
DECODE_PRIORITY = 1  # the decode always has work: lowest, so it never starves the others
DMA_PRIORITY = 6
# task names taken by the firmware itself (the decode, its chats' prefix, the DMA engine,
# telemetry, the thermal guard, the tracker's poller) and by the emulator (its ender)
RESERVED = ("decode", "prefix", "dma", "telemetry", "thermal", "end", "bwpoll")


class AppConfigError(ValueError):
    # a mistake in the config (one line, naming the key)
    pass


def _err(msg):
    raise AppConfigError("config: " + msg)


def _check(where, d, spec):
    # every key of d known to spec and of its type and range; returns d
    for key in d:
        if key not in spec:
            _err("%s: unknown key %r (known: %s)" % (where, key, ", ".join(sorted(spec))))
        typ, lo, hi = spec[key]
        v = d[key]
        if typ is float:
            ok = (v.__class__ is float or v.__class__ is int)
        else:
            ok = v.__class__ is typ
        if not ok:
            _err("%s: %s must be %s, got %r" % (where, key, _TYPE_NAMES[typ], v))
        if lo is not None and not lo <= v <= hi:
            _err("%s: %s must be in %s..%s, got %r" % (where, key, lo, hi, v))
        if key in OPEN_LO and v == lo:
            _err("%s: %s must be in (%s, %s], got %r" % (where, key, lo, hi, v))
    return d


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
               dict: "an object"}


# the validated config from JSON text (str or bytes) or a dict; AppConfigError of one line.
# Returns a new dict: every section present ("decode", "dma", "tasks"), defaults of the
# priorities filled, everything else as given (the decode's own defaults are the decode's)
def load(src):
    if isinstance(src, (str, bytes)):
        try:
            cfg = json.loads(src)
        except ValueError as e:
            _err("not valid JSON (%s)" % (str(e).split("\n")[0] or "syntax error"))
    else:
        cfg = src
    if cfg.__class__ is not dict:
        _err("the top level must be a JSON object")
    for key in cfg:
        if key not in TOP_KEYS:
            _err("unknown key %r (known: %s)" % (key, ", ".join(TOP_KEYS)))
    out = {}
    for key in ("name", "title", "comment"):
        v = cfg.get(key, "")
        if v.__class__ is not str:
            _err("%s must be a string, got %r" % (key, v))
        out[key] = v
    for key in ("decode", "dma", "emulate"):
        v = cfg.get(key, {})
        if v.__class__ is not dict:
            _err("%s must be an object, got %r" % (key, v))
    dec = dict(_check("decode", cfg.get("decode", {}), DECODE_KEYS))
    if "policy" in dec and dec["policy"] not in POLICIES:
        _err("decode: policy must be one of %s, got %r" % (", ".join(POLICIES), dec["policy"]))
    if "kv_dtype" in dec and dec["kv_dtype"] not in KV_DTYPES and dec["kv_dtype"] != "auto":
        _err("decode: kv_dtype must be one of %s or auto, got %r" % (", ".join(KV_DTYPES), dec["kv_dtype"]))
    if "chats" in dec:
        chats = []
        names = []
        if not 1 <= len(dec["chats"]) <= 8:
            _err("decode: chats lists 1..8 chats, got %d" % len(dec["chats"]))
        for i, c in enumerate(dec["chats"]):
            if c.__class__ is not dict:
                _err("decode: chats[%d] must be an object" % i)
            _check("decode: chats[%d]" % i, c, CHAT_KEYS)
            nm = c.get("name", "chat%d" % i)
            _name_ok("decode: chats[%d]" % i, nm)
            if nm in RESERVED:
                _err("decode: chats[%d]: the name %r is reserved (%s)" % (i, nm, ", ".join(RESERVED)))
            if nm in names:
                _err("decode: two chats are named %r" % nm)
            names.append(nm)
            c = dict(c)
            c["name"] = nm
            chats.append(c)
        dec["chats"] = chats
    elif "prefix" in dec:
        _err("decode: prefix is the shared start of chats: give chats too")

    dec.setdefault("priority", DECODE_PRIORITY)
    out["decode"] = dec
    dma = dict(_check("dma", cfg.get("dma", {}), DMA_KEYS))
    dma.setdefault("priority", DMA_PRIORITY)
    out["dma"] = dma
    tasks = cfg.get("tasks", [])
    if tasks.__class__ is not list:
        _err("tasks must be a list, got %r" % (tasks,))
    if len(tasks) > MAX_TASKS:
        _err("at most %d tasks, got %d" % (MAX_TASKS, len(tasks)))
    names = list(RESERVED) + [c["name"] for c in dec.get("chats", ())]
    out["tasks"] = []
    for i, t in enumerate(tasks):
        out["tasks"].append(_task(i, t, names))
    _budgets(out["tasks"])
    out["emulate"] = dict(cfg.get("emulate", {}))
    return out


def _name_ok(where, nm):
    if nm.__class__ is not str or not 1 <= len(nm) <= 15:
        _err("%s: name must be a string of 1..15 characters, got %r" % (where, nm))
    for ch in nm:
        if not (ch.isalpha() or ch.isdigit() or ch in "_-"):
            _err("%s: name %r may hold letters, digits, _ and - only" % (where, nm))


def _task(i, t, names):
    where = "tasks[%d]" % i
    if t.__class__ is not dict:
        _err("%s must be an object" % where)
    kind = t.get("kind")
    if kind not in KINDS:
        _err("%s: kind must be one of %s, got %r" % (where, ", ".join(KINDS), kind))
    if "name" not in t:
        _err("%s: a name is needed" % where)
    _name_ok(where, t["name"])
    nm = t["name"]
    where = "task %r" % nm
    if nm in RESERVED:
        _err("%s: the name is reserved (%s)" % (where, ", ".join(RESERVED)))
    if nm in names:
        _err("%s: the name is taken (by another task or a chat)" % where)
    names.append(nm)
    full = dict(COMMON)
    full.update(PARAMS[kind])
    _check(where, t, full)
    if kind == "wakeword" and "audio" in t and t["audio"] not in names:
        _err("%s: audio %r is not an audio task listed before it" % (where, t["audio"]))
    if kind in ("module", "wakeword") and "budget_permille" in t:
        _err("%s: budget_permille applies to tasks that move bytes in their own category (audio, wifi, sensor)" % where)
    if kind == "module" and ("module" not in t or "factory" not in t):
        _err("%s: a module task names its module and factory" % where)
    out = dict(t)
    out.setdefault("priority", PRIORITY[kind])
    return out


# the tier a task's budget_permille is on (its payload's: audio dst, wifi src, sensor tier),
# by name, or its default role ("sram"/"psram")
_BUDGET_TIER = {"audio": ("dst", "psram"), "wifi": ("src", "psram"), "sensor": ("tier", "sram")}


def _budgets(tasks):
    # the budgets on one tier may not pass 1000 permille together (tiers by name, or by role:
    # the board is not known here; spawn() checks again by tier id)
    per = {}
    for t in tasks:
        if "budget_permille" in t:
            key, role = _BUDGET_TIER[t["kind"]]
            tier = t.get(key, role)
            per[tier] = per.get(tier, 0) + t["budget_permille"]
            if per[tier] > 1000:
                _err("bandwidth budgets on tier %s sum to %d permille (at most 1000)" % (tier, per[tier]))


# user categories a tracker needs for cfg's tasks (one per task: each is named after it),
# plus room for a module's own (2)
def categories(cfg):
    return len(cfg["tasks"]) + 2


# kernel task slots cfg needs beside the decode, the DMA engine, the telemetry task and
# the tracker's poller (module tasks may spawn helpers: 2 spare)
def max_tasks(cfg):
    return len(cfg["tasks"]) + len(cfg["decode"].get("chats", ())) + 6


# the environment spawn() builds tasks in: a dict with "kernel", "bw" (the tracker),
# "dma" (a dma.DMAQueue on it, its engine spawned at cfg's dma priority), "board",
# "tiers" (name -> id) and "sram" / "psram" (the ids of the internal RAM and of the
# external one; a board without PSRAM: its sram for both)
def make_env(kernel, bw, cfg, board):
    from firmware_py import dma  # noqa: PLC0415 (appcfg.load alone needs none of it)

    d = cfg["dma"]
    try:
        q = dma.DMAQueue(kernel, slots=d.get("slots", dma.DEFAULT_SLOTS), max_burst=d.get("max_burst", dma.DEFAULT_MAX_BURST),
                         bw=bw, board=board)
    except ValueError as e:
        _err("dma: %s" % e)
    q.spawn(d["priority"])
    tiers = {}
    for i, n in enumerate(bw.names):
        tiers[n] = i
    sram = -1
    psram = -1
    for i, t in enumerate(board.tiers):
        if t.kind == "sram" and sram < 0:
            sram = i
        if t.kind == "psram" and psram < 0:
            psram = i
    if sram < 0:
        sram = 0
    return {"kernel": kernel, "bw": bw, "dma": q, "board": board, "tiers": tiers, "sram": sram,
            "psram": psram if psram >= 0 else sram}


def _tier(env, t, key, dflt):
    # tier id for task t's key ("src"/"dst"; a tier name) or the env's role dflt ("sram"/"psram")
    name = t.get(key)
    if name is None:
        return env[dflt]
    if name not in env["tiers"]:
        _err("task %r: %s: the board has no tier %r (has %s)" % (t["name"], key, name, ", ".join(sorted(env["tiers"]))))
    return env["tiers"][name]


def _kw(t, skip):
    out = {}
    for key in t:
        if key not in COMMON and key not in skip:
            out[key] = t[key]
    return out


# build and spawn every task of cfg on kernel in env (make_env); returns the workload
# objects in cfg's order, each with .name (the task's), .kind, .task_obj (its kernel Task)
# and .stats(). AppConfigError (one line) when one cannot be built
def spawn(kernel, cfg, env):
    bw = env["bw"]
    q = env["dma"]
    out = []
    by_name = {}
    budget = {}  # tier id -> permille reserved so far
    for t in cfg["tasks"]:
        kind = t["kind"]
        nm = t["name"]
        try:
            if kind == "module":
                obj = _module(kernel, env, t)
            elif kind == "wakeword":
                kw = _kw(t, ("audio",))
                a = by_name.get(t.get("audio", ""))
                if "audio" in t and (a is None or getattr(a, "kind", "") != "audio"):
                    _err("task %r: audio %r is not an audio task listed before it" % (nm, t["audio"]))
                obj = workloads.WakeWord(kernel, audio=a, **kw)
            else:
                cat = bw.add_category(nm)
                if kind == "audio":
                    src = _tier(env, t, "src", "sram")
                    tier = dst = _tier(env, t, "dst", "psram")
                    obj = workloads.AudioCapture(kernel, q, src, dst, cat, **_kw(t, ("src", "dst")))
                elif kind == "wifi":
                    tier = src = _tier(env, t, "src", "psram")
                    dst = _tier(env, t, "dst", "sram")
                    obj = workloads.WifiBurst(kernel, q, src, dst, cat, bw=bw, **_kw(t, ("src", "dst")))
                else:  # sensor
                    tier = _tier(env, t, "tier", "sram")
                    kw = _kw(t, ("tier", "dma"))
                    obj = workloads.SensorRead(kernel, bw, tier, cat, q=q if t.get("dma") else None, **kw)
                if "budget_permille" in t:
                    budget[tier] = budget.get(tier, 0) + t["budget_permille"]
                    if budget[tier] > 1000:
                        _err("bandwidth budgets on tier %s sum to %d permille (at most 1000)" % (
                            bw.names[tier], budget[tier]))
                    bw.set_budget(tier, cat, t["budget_permille"])
        except AppConfigError:
            raise
        except (ValueError, TypeError) as e:
            _err("task %r: %s" % (nm, str(e).split("\n")[0]))
        try:
            obj.name = nm
            obj.kind = kind
        except AttributeError:
            pass
        if not hasattr(obj, "stats") or not hasattr(obj, "task"):
            _err("task %r: its object has no task() and stats()" % nm)
        gen = _user(nm, "task()", obj.task) if kind == "module" else obj.task()
        if not hasattr(gen, "send"):
            _err("task %r: task() must return a generator" % nm)
        if kind == "module" and t.get("step_us", 0) > 0 and getattr(kernel.clock, "virtual", False):
            gen = _priced(kernel, gen, t["step_us"])
        try:
            obj.task_obj = kernel.spawn(nm, t["priority"], gen)
        except ValueError as e:
            _err("task %r: %s" % (nm, e))
        out.append(obj)
        by_name[nm] = obj
    return out


# a module task's generator with `us` charged to the (virtual) clock before each of its
# steps: what its step_us says the board spends there, where the emulator's clock would
# otherwise see a step of Python on the host as free. Closing it closes the task's own
def _priced(kernel, gen, us):
    rv = None
    try:
        while True:
            kernel.charge(us)
            try:
                y = gen.send(rv)
            except StopIteration as e:
                return getattr(e, "value", None)
            rv = yield y
    finally:
        gen.close()


def _user(nm, what, fn, *args, **kw):
    # fn(*args, **kw) of a user's module: whatever it raises (any class: an import's
    # SyntaxError, a factory's KeyError) is one line naming the task
    try:
        return fn(*args, **kw)
    except AppConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code: any exception is its mistake
        _err("task %r: its %s raised %s: %s" % (nm, what, type(e).__name__, (str(e).split("\n") or [""])[0]))


def _module(kernel, env, t):
    # {"kind": "module", "module": "m", "factory": "f", "args": {...}}: m.f(kernel, env, **args)
    nm = t["name"]
    m = _user(nm, "module %s (import)" % t["module"], __import__, t["module"])
    for part in t["module"].split(".")[1:]:
        m = getattr(m, part, None)
        if m is None:
            _err("task %r: no module %s" % (nm, t["module"]))
    f = getattr(m, t["factory"], None)
    if f is None:
        _err("task %r: module %s has no %s" % (nm, t["module"], t["factory"]))
    return _user(nm, "factory %s.%s" % (t["module"], t["factory"]), f, kernel, env, **t.get("args", {}))


# the workloads' stats by name, each with "deadline_misses" and "released" (reporting);
# a module's stats() that raises or returns no dict: AppConfigError, one line
def stats(loads):
    out = {}
    for w in loads:
        if getattr(w, "kind", "") == "module":
            s = _user(w.name, "stats()", w.stats)
            if s.__class__ is not dict:
                _err("task %r: stats() must return a dict, got %s" % (w.name, type(s).__name__))
            s = dict(s)
        else:
            s = dict(w.stats())
        if "deadline_misses" not in s:
            s["deadline_misses"] = s.get("misses", s.get("late_bursts", 0))
        if "released" not in s:
            s["released"] = s.get("periods", s.get("bursts", 0))
        out[w.name] = s
    return out
