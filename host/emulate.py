# `./kv emulate`: the firmware's own modules on CPython with a VirtualClock and a board's
# cost model -> a report that answers "will this run on my board?" (docs/emulator.md).
#
#   rep = emulate.run({"board": "esp32s3_n8r8", "scenario": "voice-assistant", "tokens": 32},
#                     out_dir="out")      # report.json, telemetry.jsonl, trace.json, PNGs
#
# One run: the board profile (host/boards.py) -> VirtualClock + Kernel -> the bandwidth
# tracker (every tier, carry_ns) and the DMA queue with its engine (firmware_py/appcfg.
# make_env) -> decode.Session sized by the board's heap (the budget rule), its memory
# traffic charged on the tier the weights and the KV live in (decode.traffic_for) and its
# compute from the board's CPU cost model (firmware_py/cpucost.py, by kind) -> the thermal
# guard (thermal.for_board over a ModelTemp on the virtual clock) -> the scenario's tasks
# (appcfg.spawn) -> the telemetry task writing frames into a buffer, decoded by the
# console's StreamDecoder into telemetry.jsonl, from which host/trace.py makes trace.json
# and the plots, as `./kv monitor --jsonl` + `./kv trace` do for a board.
#
# Deterministic: everything runs on the virtual clock, the report holds no wall-clock
# time and no absolute path; the same spec gives the same bytes.
import json
import os
import sys

from firmware_py import appcfg, decode, llama2c, sample
from firmware_py import bandwidth as bwm
from firmware_py import telemetry as tm
from firmware_py import thermal as thm
from firmware_py.clock import VirtualClock
from firmware_py.compat import ticks_diff
from firmware_py.sched import Kernel, T_FAULTS
from firmware_py.sched.task import WatchdogError
from firmware_py.sched.stats import S_MAX_LAT, S_MAX_SLICE, S_MISSES, S_RUN_S, S_RUN_US
from firmware_py.status import CARRY_N
from host import boards, options, paths
from host.errors import UserError

SCENARIOS = paths.SCENARIOS
COST_KINDS = ("c", "dsp", "asm", "viper", "bytecode")  # firmware_py/cpucost.KINDS
REPORT_VERSION = 1
# board time: the kernel runs in chunks of at most CHUNK_US (below half the 2**30 us tick
# circle, so every ticks_diff inside a chunk is exact) and _BoardTime adds them up, so a
# run may be longer than the tick circle; MAX_MS caps it at 10 hours of board time
CHUNK_US = 100000000
MAX_MS = 36000000
STOP_TIME_LIMIT = "time_limit"

# every spec key with its default ("" model: stories260K from ../shared/models when
# present, else the committed models/kvrtos-tiny; "" cost: viper when the board has
# figures for it, else "none": memory time only)
DEFAULTS = {
    "board": "esp32s3_n8r8",
    "model": "",
    "tokenizer": "",
    "policy": "full",
    "window": 0,
    "sinks": 4,
    "kv_dtype": "auto",
    "weights": "int8",
    "slice_us": decode.SLICE_US,
    "tokens": 64,
    "prompt": "",
    "scenario": "",
    "seed": 0,
    "temperature": 0.0,
    "top_p": 1.0,
    "cost": "",
    "piece_bytes": 0,
    "kv_blocks": 0,
    "weights_tier": "auto",
    "kv_tier": "auto",
    "reserve": -1,
    "link_bps": tm.DEFAULT_LINK_BPS,
    "rate_hz": tm.DEFAULT_RATE_HZ,
    "ambient_c": thm.AMBIENT_C,
    "max_ms": 1800000,
    "speed": "fit",  # the MicroPython cost at the fitted factor, or at the slow or fast end of its band
}
_INT_KEYS = {"window": (0, options.WINDOW_MAX), "sinks": (0, 64), "tokens": (1, options.TOKENS_MAX), "seed": (0, sample.SEED_MAX),
             "piece_bytes": (0, 1 << 24), "kv_blocks": (0, 1 << 20), "reserve": (-1, 1 << 30), "link_bps": (100, 1000000), "rate_hz": (1, 1000), "ambient_c": (-40, 120),
             "max_ms": (1, MAX_MS), "slice_us": (0, decode.SLICE_MAX_US)}
PIECE_MIN = 64  # the smallest piece_bytes but 0 (decode.Session's own floor when it sizes pieces to a slice)
_FLOAT_KEYS = {"temperature": (0.0, sample.TEMPERATURE_MAX), "top_p": (0.0, 1.0)}  # top_p: above 0 (appcfg.OPEN_LO)
_STR_KEYS = ("board", "model", "tokenizer", "policy", "kv_dtype", "prompt", "scenario", "cost", "weights_tier",
             "kv_tier", "weights", "speed")
SPEEDS = ("fit", "slow", "fast")
WEIGHTS = ("int8", "fp32")  # int8: an fp32 file runs as q8row, converted on the fly (as kv flash --model puts it)
DECODE_SPEC_KEYS = ("model", "tokenizer", "policy", "window", "sinks", "kv_dtype", "tokens", "prompt", "seed",
                    "temperature", "top_p", "piece_bytes", "kv_blocks", "slice_us")  # what a scenario's "decode" section may set
EMULATE_SPEC_KEYS = ("board", "cost", "weights_tier", "kv_tier", "reserve", "link_bps", "rate_hz", "ambient_c", "max_ms")  # its "emulate" section


SINK_POLICIES = ("sinks", "h2o")  # the policies that keep sinks


def _bad(msg):
    raise UserError(msg, 2)


class TaskFault(UserError):
    # an internal failure: one of the emulator's own firmware tasks (decode, a chat, prefix,
    # telemetry, thermal, the DMA engine) raised, or a built-in workload could not be built
    # for a reason that is not its config. Exit 1, one line; not the user's mistake (a sweep
    # must not cache it). A user's module task that raises is named in the report instead
    def __init__(self, task, exc):
        self.task = task
        self.error = "%s: %s" % (type(exc).__name__, (str(exc).split("\n") or [""])[0])
        super().__init__("emulate: internal failure of the %s task: %s" % (task, self.error), 1)


def scenario_names():
    # the scenarios in scenarios/, sorted
    if not os.path.isdir(SCENARIOS):
        return []
    return sorted(f[:-5] for f in os.listdir(SCENARIOS) if f.endswith(".json"))


def scenario_path(name):
    # scenarios/NAME.json for a name; a path (has a "/" or ends in .json) as the user typed it
    if "/" in name or os.sep in name or name.endswith(".json"):
        p = paths.user_path(name)
        if os.path.exists(p):
            paths.regular_file(p, "scenario")  # a folder, a FIFO or /dev/null was "no scenario file"
        if not os.path.isfile(p):
            _bad("no scenario file %s (known scenarios: %s)" % (name, ", ".join(scenario_names())))
        return p
    p = os.path.join(SCENARIOS, name + ".json")
    if not os.path.isfile(p):
        _bad("unknown scenario %r (known: %s)" % (name, ", ".join(scenario_names())))
    return p


def load_scenario(name):
    # (path, validated config) of a scenario name or path; UserError of one line
    p = scenario_path(name)
    try:
        with open(p, "rb") as f:
            text = f.read()
    except OSError as e:
        _bad("scenario %s cannot be read: %s" % (name, e.strerror or e))
    try:
        cfg = appcfg.load(text)
    except appcfg.AppConfigError as e:
        _bad("scenario %s: %s" % (os.path.basename(p), e))
    for key in cfg["emulate"]:
        if key not in EMULATE_SPEC_KEYS:
            _bad("scenario %s: emulate: unknown key %r (known: %s)" % (os.path.basename(p), key, ", ".join(EMULATE_SPEC_KEYS)))
    return p, cfg


def _default_model():
    shared = paths.shared_models()
    if shared and os.path.isfile(os.path.join(shared, "stories260K.bin")):
        return "stories260K"
    return ""


def _display(p):
    # a path without the machine's folders, as typed from the repository: relative to it, or ../shared/models/...
    shared = paths.shared_models()
    for base, label in ((paths.ROOT, ""), (shared, "../shared/models/")):
        if base and os.path.abspath(p).startswith(os.path.abspath(base) + os.sep):
            return label + os.path.relpath(os.path.abspath(p), os.path.abspath(base))
    return os.path.basename(p)


# the validated spec: defaults filled (the scenario's decode/emulate sections over the
# defaults, the spec's own keys over those), files resolved to absolute paths, the cost
# kind settled; UserError (one line, exit 2) on bad input. Same inputs, same dict
def normalize(spec):
    if not isinstance(spec, dict):
        _bad("an emulation spec is a dict, got %r" % (spec,))
    for key in spec:
        if key not in DEFAULTS:
            _bad("unknown spec key %r (known: %s)" % (key, ", ".join(sorted(DEFAULTS))))
    out = dict(DEFAULTS)
    given = {k: v for k, v in spec.items() if v is not None}
    sc = given.get("scenario", "")
    if not isinstance(sc, str):
        _bad("scenario must be a name or a path, got %r" % (sc,))
    cfg = None
    path = ""

    def name(key):
        # where a refused value came from: the flag that gave it, or the scenario file's key
        if key in given or not cfg:
            return "--" + key.replace("_", "-")
        if key in cfg["decode"] and key in DECODE_SPEC_KEYS:
            return "%s: decode.%s" % (_display(path), key)
        if key in cfg["emulate"]:
            return "%s: emulate.%s" % (_display(path), key)
        return "--" + key.replace("_", "-")
    if sc:
        path, cfg = load_scenario(sc)
        for key in DECODE_SPEC_KEYS:
            if key in cfg["decode"]:
                out[key] = cfg["decode"][key]
        for key, v in cfg["emulate"].items():
            out[key] = v
        out["scenario"] = path
    for key, v in given.items():
        if key != "scenario":
            out[key] = v
    if out["policy"] == "full" and "window" not in given and "policy" in given:
        out["window"] = 0  # the scenario's window was for its own policy: full keeps none
    for key in _STR_KEYS:
        if not isinstance(out[key], str):
            _bad("%s must be a string, got %r" % (name(key), out[key]))
    for key, (lo, hi) in _INT_KEYS.items():
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            _bad("%s must be a whole number in %d..%d, got %r" % (name(key), lo, hi, v))
    if 0 < out["piece_bytes"] < PIECE_MIN:
        _bad("%s must be 0 (a layer's traffic at a time) or at least %d B, got %d: the decode charges and may yield per "
             "piece, so a piece of a few bytes makes millions per token (the decode sizes its own pieces to at least %d B)"
             % (name("piece_bytes"), PIECE_MIN, out["piece_bytes"], PIECE_MIN))
    for key, (lo, hi) in _FLOAT_KEYS.items():
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
            _bad("%s must be a number in %s%g, %g], got %r" % (name(key), "(" if key in appcfg.OPEN_LO else "[", lo, hi, v))
        if key in appcfg.OPEN_LO and v == lo:
            _bad("%s must be a number in (%g, %g], got %r" % (name(key), lo, hi, v))
        out[key] = float(v)
    if out["policy"] not in appcfg.POLICIES:
        _bad("%s must be one of %s, got %r" % (name("policy"), ", ".join(appcfg.POLICIES), out["policy"]))
    if out["kv_dtype"] not in appcfg.KV_DTYPES and out["kv_dtype"] != "auto":
        _bad("%s must be one of %s or auto, got %r" % (name("kv_dtype"), ", ".join(appcfg.KV_DTYPES), out["kv_dtype"]))
    if out["weights"] not in WEIGHTS:
        _bad("%s must be one of %s, got %r" % (name("weights"), ", ".join(WEIGHTS), out["weights"]))
    if out["speed"] not in SPEEDS:
        _bad("%s must be one of %s, got %r" % (name("speed"), ", ".join(SPEEDS), out["speed"]))
    if cfg and cfg["decode"].get("chats") and given.get("prompt"):  # it ran with the chats' prompts, --prompt unused
        _bad("--prompt: scenario %s's chats each have their own prompt (decode.chats[].prompt)" % _display(path))
    if given.get("sinks", DEFAULTS["sinks"]) != DEFAULTS["sinks"] and out["policy"] not in SINK_POLICIES:
        _bad("%s applies to the sinks and h2o policies, not %s" % (name("sinks"), out["policy"]))
    if out["policy"] == "full":
        if out["window"]:
            _bad("%s applies to the window, sinks and h2o policies, not full" % name("window"))
    brd = boards.load(out["board"])
    out["board"] = brd.name if not ("/" in out["board"] or out["board"].endswith(".json")) else boards.path_of(out["board"])
    model = out["model"] or _default_model()
    from host import generate  # noqa: PLC0415 - the one resolver of model names and paths

    mp, tp = generate.resolve(model, out["tokenizer"])
    out["model"], out["tokenizer"] = os.path.abspath(mp), os.path.abspath(tp)
    fdt = _file_dtype(out["model"])  # an fp32 file with weights int8 runs converted (_run: _model_file)
    seq_len = llama2c.plan(out["model"])[0].seq_len
    if out["policy"] != "full" and out["window"] > seq_len:  # as generate and the board refuse it
        _bad("%s %d is more than the model's context: it must be at most seq_len %d" % (name("window"), out["window"], seq_len))
    if out["weights"] == "fp32" and fdt != "fp32":
        _bad("--weights fp32: %s is already int8; give its fp32 checkpoint" % _display(out["model"]))
    if out["kv_dtype"] == "auto":  # what the weights' fastest path reads: int8 KV beside int8 weights
        out["kv_dtype"] = "int8" if out["weights"] == "int8" else "fp32"
    cost = out["cost"]
    have = getattr(brd, "cpu_cost", None) or {}
    if cost == "":
        cost = "viper" if "viper" in have else "none"
    elif cost != "none" and cost not in COST_KINDS:
        _bad("%s must be one of %s or none, got %r" % (name("cost"), ", ".join(COST_KINDS), cost))
    elif cost != "none" and cost not in have:
        _bad("board %s has no %s cost figures (it has: %s)" % (brd.name, cost, ", ".join(sorted(have)) or "none"))
    out["cost"] = cost
    if out["speed"] != "fit" and cost not in ("viper", "bytecode"):
        _bad("--speed %s applies to the MicroPython costs (viper, bytecode), not %s: its figures have no board-speed band"
             % (out["speed"], cost))
    wt = out["weights_tier"]
    if wt != "auto" and wt not in [t.name for t in brd.tiers]:
        _bad("%s: board %s has no tier %r (has %s)" % (name("weights_tier"), brd.name, wt, ", ".join(t.name for t in brd.tiers)))
    kt = out["kv_tier"]
    if kt != "auto" and kt not in [t.name for t in brd.tiers]:
        _bad("%s: board %s has no tier %r (has %s)" % (name("kv_tier"), brd.name, kt, ", ".join(t.name for t in brd.tiers)))
    if kt != "auto" and brd.tier(kt).kind == "flash":
        _bad("%s: %s is %s's flash: the KV is written every token, it lives in RAM" % (name("kv_tier"), kt, brd.name))
    return out


def _model_file(n):
    # the checkpoint a run loads: the spec's, or for weights int8 and an fp32 file its
    # q8row copy, converted once into .kvrtos-cache/models (as kv flash --model does on
    # the fly); each process (a sweep's workers too) converts from the spec's own file. A
    # damaged file (a float past any trained model's) is refused first, in one line
    from host import boardmodel  # noqa: PLC0415 - the model catalog, beside the emulator

    try:
        lay = llama2c.plan(n["model"])[1]  # read once: the check and the element type both use it
    except (llama2c.CheckpointError, OSError) as e:
        _bad("%s: %s" % (_display(n["model"]), e))
    boardmodel.check_weights(n["model"], lay)
    if n["weights"] == "int8" and not lay.q8_len:
        from host import convert as conv  # noqa: PLC0415

        return conv.cached_q8row(n["model"])[0]
    return n["model"]


def _file_dtype(p):
    # "fp32" or "int8": the element type of a checkpoint's matrices (its header)
    try:
        return "int8" if llama2c.plan(p)[1].q8_len else "fp32"
    except (llama2c.CheckpointError, OSError) as e:
        _bad("%s: %s" % (_display(p), e))


def _window_us(brd, want=16000, buckets=16):
    # the tracker's window: 16 ms, shorter on a board whose fastest tier would move 2**30 B
    # or more in it (a SoC's DRAM: the tracker counts a window's bytes in a small int)
    fastest = max(t.bandwidth for t in brd.tiers)
    w = min(want, (bwm.INT_MAX * 1000000 // fastest) // buckets * buckets)
    if w < buckets:
        _bad("board %s: tier bandwidth %d B/s is too high for the bandwidth tracker" % (brd.name, fastest))
    return w


def _ram_tier(brd):
    # the tier a decode's heap lives in: external RAM (psram / dram) when the board has it, else sram
    for kind in ("psram", "dram", "sram"):
        for t in brd.tiers:
            if t.kind == kind:
                return t
    return brd.tiers[0]


def _heap(brd):
    # usable heap the firmware's pool is sized from: the profile's MicroPython heap (an
    # MCU), or the RAM less the OS's share (a SoC profile), at most 256 MB
    if brd.kind == "mcu" and brd.mpy_heap:
        return brd.mpy_heap, brd.firmware_bytes
    ram = _ram_tier(brd)
    return min(ram.bytes - brd.firmware_bytes, 1 << 28), 0


def _placement(brd, n, cfg, lay):
    # (weights tier, kv tier, heap, reserve, why): the weights in the heap's RAM tier when
    # they fit beside a KV block, else memory-mapped from flash (the heap then does not hold them)
    heap, reserve = _heap(brd)
    ram = _ram_tier(brd)
    wbytes = lay.memory_bytes()
    wt = n["weights_tier"]
    flash = [t for t in brd.tiers if t.kind == "flash"]
    if wt == "auto":
        blocks = n["kv_blocks"] or _budget(heap, cfg, wbytes, n, reserve)[1]
        if blocks >= 1 or not flash:
            wt = ram.name
            why = "in the heap (%s)" % ram.name
        else:
            wt = flash[0].name
            why = "memory-mapped from %s: they do not fit the heap beside a KV block" % wt
    else:
        why = "as the spec says (weights_tier %s)" % wt
    t = brd.tier(wt)
    if t.kind == "flash":
        if wbytes > t.bytes:
            _bad("the weights (%d B) do not fit %s's %s (%d B)" % (wbytes, brd.name, wt, t.bytes))
        heap += wbytes  # memory-mapped: the budget rule's weights are not on the heap
    kt = ram.name if n["kv_tier"] == "auto" else n["kv_tier"]
    return wt, kt, heap, reserve, why


def _context(cfg_app):
    # the board the emulator stands for serves: its firmware's footprint with the config's tasks when it has some
    return "serve+tasks" if cfg_app and cfg_app.get("tasks") else "serve"


def _budget(heap, cfg, wbytes, n, fw_reserve, seqs=1, context="serve"):
    # (reserve B, KV blocks) by the firmware's budget rule (decode.budget_blocks: MicroPython's
    # run-state reserve, at least the profile's firmware bytes), or with --reserve R >= 0 the
    # same rule with a heap reserve of exactly R B (a C firmware's: no interpreter to keep)
    lay = _kv_layout(cfg, n)
    h2o = n["policy"] == "h2o"
    if n["reserve"] < 0:
        # the board's serve: its boot keeps the telemetry's margin too; the integer path's
        # figures when the board would run it (int8 weights with int8 KV)
        q8 = decode.uses_q8("auto", cfg.groups is not None, lay.dtype)
        return decode.budget_blocks(heap, cfg, wbytes, lay, fw_reserve, h2o, seqs, 4, q8, context)
    from firmware_py import kv, pool  # noqa: PLC0415

    avail = heap - n["reserve"] - wbytes - seqs * (cfg.activation_bytes() + lay.row_bytes)
    b = (avail - pool.POOL_FIXED_BYTES - kv.fixed_bytes(lay, seqs)) // decode.block_cost(cfg, lay, seqs, h2o, False, 4)
    return n["reserve"], b if b > 0 else 0


def _kv_layout(cfg, n):
    from firmware_py import kv  # noqa: PLC0415

    try:
        return kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, n["kv_dtype"])
    except kv.KVError as e:
        _bad(str(e))


def _cost_model(brd, kind, s, speed="fit"):
    if kind in ("viper", "bytecode") and speed != "fit":
        # the same profile with its MicroPython figures at one end of the band (host/boardspeed.py)
        import copy  # noqa: PLC0415

        from host import boardspeed  # noqa: PLC0415

        # (both MicroPython kinds: under viper a session off the integer path is priced by
        # the bytecode figures, cpucost.for_session)
        band = {k: boardspeed.band_costs(brd, k, speed) for k in ("viper", "bytecode") if k in brd.cpu_cost}
        brd = copy.copy(brd)
        brd.cpu_cost = dict(brd.cpu_cost, **band)
    if kind == "none":
        return None, {"kind": "none", "note": "memory time only: no CPU cost figures used (compute not charged)"}
    try:
        from firmware_py import cpucost  # noqa: PLC0415 - by "cost"; absent: memory time only
    except ImportError:
        return None, {"kind": kind, "note": "memory time only: firmware_py/cpucost.py is not in this tree"}
    try:
        m = cpucost.for_session(brd, kind, s)
    except cpucost.CostError as e:
        _bad(str(e))
    return m, {"kind": m.kind, "speed": speed, "figures": m.figures()}


def _memory_figures(brd):
    # the tiers' cost figures and their sources (docs/tiers.md)
    out = {}
    for t in brd.tiers:
        d = {"bytes": t.bytes, "bandwidth_bytes_per_s": t.bandwidth, "latency_ns": t.latency_ns, "dma": t.dma,
             "source": t.source}
        if t.cost is not None:
            d["cost"] = dict(t.cost.values())
        out[t.name] = d
    return out


class _Reads:
    # what the model must read, counted apart from the traffic code: each forward pass's
    # layers (counted as the pass hands each to the decode, which charges it at once) with the
    # cache length then, and each pass that completed (status >= 0: its final pieces). Weights
    # per layer / after the layers from the checkpoint's layout (decode.layout_traffic), the
    # K/V row from the KV layout: forwards x (layers x per layer + final) and rows x row
    def __init__(self, mlay, kvlay, cache):
        self.per_layer, self.final = decode.layout_traffic(mlay)
        self.row = getattr(kvlay, "store_row", kvlay.layer_row)
        self.cache = cache
        self.layers = 0
        self.finals = 0
        self.rows = 0  # cached rows read by the attention passes (the new one included)

    def watch(self, model):
        inner = model.forward
        cache = self.cache

        def forward(h, token, pos):
            for x in inner(h, token, pos):
                if x is None:  # a layer's end (a spent slice inside a layer yields SLICE)
                    self.layers += 1
                    self.rows += cache.cached(h)
                yield x
            if model.status >= 0:
                self.finals += 1

        model.forward = forward

    def expected(self):
        return {"weights": self.layers * self.per_layer + self.finals * self.final,
                "kv": self.layers * self.row + self.rows * self.row, "layers": self.layers, "forwards": self.finals,
                "kv_rows_read": self.rows, "weights_per_layer": self.per_layer, "weights_final": self.final,
                "kv_row_bytes": self.row}


class _BoardTime:
    # µs of board time since the run began, across tick wraps: each now() adds the ticks
    # since the last one (read at least once per kernel chunk, so each step is < half the circle)
    def __init__(self, clk):
        self.clk = clk
        self.tick = clk.now()
        self.us = 0

    def now(self):
        t = self.clk.now()
        self.us += ticks_diff(t, self.tick)
        self.tick = t
        return self.us

    def at(self, anchor, tick):
        # the board time of tick `tick`, near the anchor (board µs, tick) it is unwrapped from
        return anchor[0] + ticks_diff(tick, anchor[1])


class _Sink:
    # the telemetry link: frames written into a bytearray (write(buf, n) as a stream's)
    def __init__(self):
        self.buf = bytearray()

    def write(self, b, n):
        self.buf += bytes(b[:n])
        return n


# run one emulation; returns the report dict (deterministic). out_dir: write report.json,
# telemetry.jsonl, trace.json and the PNG plots there. progress: None or fn(done, total)
# called after every token
def run(spec, out_dir=None, progress=None):
    n = normalize(spec)
    # a scenario's module tasks import from the scenario's folder (as a board's kvrtos.json
    # beside its modules): on the path for this run only, the modules it brought in dropped after
    folder = os.path.dirname(n["scenario"]) if n["scenario"] else ""
    import numpy as np  # noqa: PLC0415 - the firmware's CPython kernels use it

    # a float that overflows in the kernels (an exp to inf: a softmax's 0) is the decode's
    # to answer, as on the board, not a numpy warning on the user's terminal
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        if not folder:
            return _run(n, out_dir, progress)
        with paths.import_folder(folder):
            return _run(n, out_dir, progress)


OUT_FILES = ("report.json", "telemetry.jsonl", "trace.json", "kv_bytes.png", "pool.png", "bandwidth.png")
OUT_MARKER = ".kvrtos-emulate"  # in an --out folder emulate wrote: its files may be replaced


def _out_ready(out_dir):
    # --out: a folder emulate wrote before (its marker there) is written again; one holding
    # a file of ours by name without the marker (a user's report.json) is refused before
    # anything runs, as the demo refuses it
    paths.out_folder(out_dir)
    paths.claim_out(out_dir, OUT_FILES, OUT_MARKER, "emulate", "files written by ./kv emulate: %s\n" % ", ".join(OUT_FILES))


def _run(n, out_dir, progress):
    if out_dir is not None:
        _out_ready(out_dir)
    em = _Emulation(n, progress)
    em.drive()
    rep = em.report()
    if em.cfg_app["decode"].get("turns"):
        _turns(n, em, rep, progress)
    frames_jsonl = _frames(em.sink.buf, rep)
    if out_dir is not None:
        _write(out_dir, rep, frames_jsonl)
    return rep


SNAPSHOT = "conversation"  # the deep-sleep turns' snapshot name (in a folder of the run's own)


# a scenario's deep-sleep turns (its decode "turns", "sleep_ms"): after the first request the
# board saves the conversation's KV snapshot (firmware_py/snapshot.py, for real, into a
# folder of its own) with its audio stopped, deep-sleeps (nothing runs; RAM is lost), wakes,
# reads the snapshot back before its tasks start, and answers the turn going on from it: each
# turn is a new run of the same board. The flash time is the board's flash model (its flash
# tier's write and read rates, a 45 ms erase per 4 KiB sector a copy-on-write filesystem
# writes). rep gets "sleep": the timeline and each turn's figures; a turn whose deadlines
# fail makes the verdict fail
def _turns(n, em, rep, progress):
    import tempfile  # noqa: PLC0415

    from firmware_py import snapshot  # noqa: PLC0415
    from firmware_py.flashkv import ERASE_US  # noqa: PLC0415

    fl = [t for t in em.brd.tiers if t.kind == "flash"]
    if not fl:
        _bad("board %s has no flash tier: the deep-sleep turns save to flash" % em.brd.name)
    wr, rd = fl[0].cost.value["write_bytes_per_s"], fl[0].cost.value["read_bytes_per_s"]
    dec = em.cfg_app["decode"]
    sleep_ms = dec.get("sleep_ms", 0)
    out = {"sleep_ms": sleep_ms, "turns": [], "flash": {"write_bytes_per_s": wr, "read_bytes_per_s": rd}}
    # a wake boots the board again: the weights read into RAM again (unless read from flash
    # in place), the model and the tokenizer hashed for the snapshot's identity check (the
    # hashes were in the RAM that was lost), the snapshot read back
    wbytes = em.mlay.memory_bytes() if em.w_tier != fl[0].name else 0
    hbytes = os.path.getsize(em.mfile) + os.path.getsize(n["tokenizer"])
    load_ms, hash_ms = wbytes * 1000.0 / rd, hbytes * 1000.0 / rd
    out.update({"weights_load_ms": round(load_ms, 2), "hash_ms": round(hash_ms, 2)})
    with tempfile.TemporaryDirectory(prefix="kvrtos-emulate-sleep-") as d:
        prev = em
        timeline_ms = rep["decode_ms"]  # to the first answer's last token
        for i, t in enumerate(dec["turns"]):
            try:
                info = snapshot.save(prev.s, SNAPSHOT, d)
            except snapshot.SnapshotError as e:
                out["error"] = "turn %d: the conversation could not be saved before the sleep: %s" % (i + 1, e)
                break
            save_ms = info["bytes"] * 1000.0 / wr + info["erases"] * ERASE_US / 1000.0
            restore_ms = 2 * info["bytes"] * 1000.0 / rd  # read twice: the check, then the load
            wake_ms = load_ms + hash_ms + restore_ms
            n2 = dict(n, prompt=t.get("prompt", ""), tokens=min(t.get("tokens", n["tokens"]), n["tokens"]))  # as a chat's
            try:
                em2 = _Emulation(n2, progress, resume=(d, SNAPSHOT))
            except UserError as e:  # the resume refused (e.g. the conversation passes its budget)
                out["error"] = "turn %d: %s" % (i + 1, e)
                break
            em2.drive()
            r2 = em2.report()
            timeline_ms += save_ms + sleep_ms + wake_ms + r2["decode_ms"]
            out["turns"].append({
                "turn": i + 1, "prompt": n2["prompt"], "tokens": r2["tokens"], "tokens_requested": n2["tokens"],
                "stop_reason": r2["stop_reason"], "stop": r2["stop"],
                "resumed_positions": em2.resumed, "snapshot_bytes": info["bytes"], "erases": info["erases"],
                "save_ms": round(save_ms, 1), "restore_ms": round(restore_ms, 2), "wake_ms": round(wake_ms, 2),
                "tok_s": r2["tok_s"], "ttft_ms": r2["ttft_ms"], "wake_to_first_token_ms": round(wake_ms + r2["ttft_ms"], 2),
                "deadline_misses": r2["deadline_misses"], "verdict_ok": r2["verdict"]["ok"],
                "verdict_line": r2["verdict"].get("line", ""), "text": r2.get("text", "")})
            out["turns"][-1]["invariants_ok"] = r2["invariants"]["ok"]
            if not r2["invariants"]["ok"]:  # a turn's own checks fail the run's
                rep["invariants"]["ok"] = False
                rep["invariants"]["turn_%d" % (i + 1)] = {"ok": False, "failed": {
                    k: v for k, v in r2["invariants"].items() if isinstance(v, dict) and not v.get("ok", True)}}
            if not r2["verdict"]["ok"] and rep["verdict"]["ok"]:
                rep["verdict"] = dict(r2["verdict"], line="turn %d: %s" % (i + 1, r2["verdict"].get("line", "")))
            if r2["stop_reason"] == STOP_TIME_LIMIT:  # cut as a first request would be: the run says so
                out["error"] = "turn %d: %s" % (i + 1, r2["stop"])
                break
            prev = em2
    out["timeline_ms"] = round(timeline_ms, 1)  # first answer, then per turn: save, sleep, wake, the answer
    out["erases"] = sum(x["erases"] for x in out["turns"])
    out["deadline_misses"] = rep["deadline_misses"] + sum(x["deadline_misses"] for x in out["turns"])
    rep["sleep"] = out
    if out.get("error") and rep["verdict"]["ok"]:
        rep["verdict"] = dict(rep["verdict"], ok=False, line=out["error"])


class _Emulation:
    # one run, in the order it happens: the board and the model's placement, the decode's
    # Session (or its chats), the tasks beside it (the scenario's, telemetry, the thermal
    # guard), the requests, then the kernel driven on the virtual clock until they end.
    # resume: (folder, name) of a KV snapshot the Session goes on from (a deep-sleep turn)
    def __init__(self, n, progress, resume=None):
        self.resume = resume
        self.resumed = 0  # positions the Session resumed
        self.n = n
        self.progress = progress
        self.brd = boards.load(n["board"])
        self.cfg_app = _band_steps(_app_config(n), self.brd, n.get("speed", "fit"))
        self.mfile = _model_file(n)
        try:
            self.mcfg, self.mlay = llama2c.plan(self.mfile)
        except (llama2c.CheckpointError, OSError) as e:
            _bad("%s: %s" % (_display(n["model"]), e))
        self.w_tier, self.kv_tier, heap, reserve, self.why = _placement(self.brd, n, self.mcfg, self.mlay)
        self.clk = VirtualClock()
        self.k = Kernel(self.clk, max_tasks=appcfg.max_tasks(self.cfg_app) + 3, verbose=False)
        self.bw = bwm.Bandwidth(self.brd, kernel=self.k, carry_ns=True, user_categories=appcfg.categories(self.cfg_app),
                                window_us=_window_us(self.brd))
        self._session(heap, reserve)
        self._beside()
        self._requests()

    # the decode: one Session, or one per chat on a shared prefix; runs: (name, the object
    # that decodes, tokens asked, priority)
    def _session(self, heap, reserve):
        n, brd, cfg_app, mcfg, mlay = self.n, self.brd, self.cfg_app, self.mcfg, self.mlay
        chats = cfg_app["decode"].get("chats") or []
        blocks = n["kv_blocks"]
        if n["reserve"] >= 0:
            reserve = n["reserve"]
            if not blocks:  # the budget rule with this reserve: the pool's blocks, given to the Session
                blocks = _budget(heap, mcfg, mlay.memory_bytes(), n, reserve, max(1, len(chats)))[1]
                if blocks < 1:
                    _bad("the KV budget is too small: 0 blocks fit in a heap of %d B with --reserve %d (weights %d B on %s)"
                         % (heap, reserve, mlay.memory_bytes(), self.w_tier))
        try:
            s = decode.Session(self.mfile, n["tokenizer"], kv_dtype=n["kv_dtype"], policy=n["policy"], window=n["window"],
                               backend="auto", heap=heap, reserve=reserve, temperature=n["temperature"], top_p=n["top_p"],
                               seed=n["seed"], sinks=n["sinks"], word_bytes=4, blocks=blocks, slice_us=n["slice_us"],
                               context=_context(cfg_app), **({"seqs": len(chats)} if chats else {}))
            prefix = cfg_app["decode"].get("prefix", n["prompt"])
            if self.resume is not None:  # a deep-sleep turn: the conversation read back from flash goes on
                from firmware_py import snapshot  # noqa: PLC0415

                try:
                    snapshot.resume(s, self.resume[1], self.resume[0])
                    self.resumed = s.cache.length(s.h)
                    self.ids = snapshot.continue_ids(s, n["prompt"])
                except snapshot.SnapshotError as e:
                    _bad("the turn's resume on %s: %s" % (brd.name, e))
            else:
                self.ids = s.encode(prefix if chats else n["prompt"])
            runs = []
            if chats:
                for c in chats:
                    ch = s.chat(c.get("prompt", ""), seed=c.get("seed"))
                    runs.append((c["name"], ch, min(c.get("tokens", n["tokens"]), n["tokens"]),
                                 c.get("priority", cfg_app["decode"]["priority"])))
            else:
                runs.append(("decode", s, n["tokens"], cfg_app["decode"]["priority"]))
        except decode.DecodeError as e:
            _bad("%s on %s: %s" % (os.path.basename(n["model"]), brd.name, e))
        kt = brd.tier(self.kv_tier)
        if n["kv_tier"] != "auto" and s.pool.n_blocks * s.layout.block_bytes > kt.bytes:
            _bad("the KV pool (%d blocks of %d B) does not fit %s's %s (%d B): give fewer --kv-blocks"
                 % (s.pool.n_blocks, s.layout.block_bytes, brd.name, self.kv_tier, kt.bytes))
        s.traffic = decode.traffic_for(s, self.bw, w_tier=self.w_tier, kv_tier=self.kv_tier)
        self.reads = _Reads(mlay, _kv_layout(mcfg, n), s.cache)
        for obj in {id(r[1].model): r[1].model for r in runs}.values():
            self.reads.watch(obj)
        s.piece_bytes = n["piece_bytes"]
        s.cpu, self.cost = _cost_model(brd, n["cost"], s, n["speed"])
        self.s, self.runs = s, runs

    # the tasks beside the decode: the scenario's (appcfg), the thermal guard and telemetry
    # into an in-memory sink
    def _beside(self):
        n, k, brd, s = self.n, self.k, self.brd, self.s
        try:
            self.env = appcfg.make_env(k, self.bw, self.cfg_app, brd)
            self.loads = appcfg.spawn(k, self.cfg_app, self.env)
        except appcfg.AppConfigError as e:
            _bad("scenario %s: %s" % (os.path.basename(n["scenario"]) or "-", e))
        except Exception as e:  # noqa: BLE001 - a built-in workload failed for no config reason: internal
            raise TaskFault("setup", e) from None
        src = thm.ModelTemp(self.clk, ambient_c=n["ambient_c"])
        self.guard = thm.for_board(k, brd, source=src)
        s.thermal = self.guard
        self.sink = _Sink()
        self.tel = tm.Telemetry(self.sink.write, kernel=k, link_bps=n["link_bps"], rate_hz=n["rate_hz"], pool=s.pool,
                                cache=s.cache, bw=self.bw, dma=self.env["dma"], thermal=self.guard, heap=False,
                                max_seqs=max(4, len(self.runs)),
                                meta={"model": os.path.basename(n["model"]), "board": brd.name, "kv.policy": s.policy,
                                      "model.layers": s.cfg.n_layers, "model.seq_len": s.cfg.seq_len,
                                      "model.dim": s.cfg.dim, "emulator": "kv emulate",
                                      "cpu.mhz": brd.cpu_mhz})  # the clock the cycle figures are counted at
        k.spawn("telemetry", 2, self.tel.task(k))
        k.spawn("thermal", 2, self.guard.task())

    # one task per request (its start event, the decode with its text into telemetry, its
    # done event) and the ender, which stops the kernel once they are done and the last
    # frames are out
    def _requests(self):
        k, s, tel, runs = self.k, self.s, self.tel, self.runs
        self.total = sum(r[2] for r in runs)
        self.made = 0
        self.reasons = {}
        self.bt = _BoardTime(self.clk)
        self.marks = {}  # id(Session or Chat) -> {"begin": (board us, tick) at its task's start, "first", "last": at its tokens}
        self.seen = {}  # id(Session or Chat) -> on_token calls: the emulator's own count of tokens
        s.on_token = self._on_token
        tasks = []
        if self.cfg_app["decode"].get("chats"):
            k.spawn("prefix", max(r[3] for r in runs), s.prefix_task(k, self.ids))
        for i, (name, obj, n_tok, prio) in enumerate(runs):
            tasks.append(k.spawn(name, prio, self._one(i + 1, name, obj, n_tok)))
            tel.watch_seq(obj.h, s.cap)
        self.ended = False

        def ender():
            for t in tasks:
                yield k.join(t)
            yield k.sleep_us(2 * tel.period_us + 1000)  # the last frames go out
            self.ended = True
            k.stop()

        k.spawn("end", 0, ender())

    def _on_token(self, sess):
        self.tel.tokens += 1
        self.made += 1
        self.seen[id(sess)] = self.seen.get(id(sess), 0) + 1
        m = self.marks.setdefault(id(sess), {})
        m["last"] = (self.bt.now(), self.clk.now())
        m.setdefault("first", m["last"])
        if self.progress is not None:
            self.progress(self.made, self.total)

    def _one(self, req, name, obj, n_tok):
        tel, s, bt, clk, reasons = self.tel, self.s, self.bt, self.clk, self.reasons
        tel.requests += 1
        tel.request = req
        tel.event(tm.EV_START, req, obj.n_prompt if obj is not s else len(self.ids), n_tok)
        reasons[name] = tm.DONE_ERROR
        self.marks.setdefault(id(obj), {})["begin"] = (bt.now(), clk.now())
        try:
            if obj is s:
                yield from s.task(self.k, self.ids, n_tok, tel.text)
            else:
                yield from obj.task(self.k, n_tok, tel.text)
            reasons[name] = tm.DONE_OK if not obj.stop else (tm.DONE_FULL if obj.stop == "full" else tm.DONE_ERROR)
            self.marks[id(obj)]["end"] = (bt.now(), clk.now())
            if obj.stop:
                tel.event(tm.EV_REFUSED, -1, 1, req)
        finally:
            tel.event(tm.EV_DONE, req, obj.n_new, reasons[name])

    # the kernel on the virtual clock, in chunks, until the ender stops it or --max-ms;
    # a fault in one of the emulator's own tasks is raised (a user's module task is reported)
    def drive(self):
        k, bt = self.k, self.bt
        limit = self.n["max_ms"] * 1000
        while not self.ended:
            left = limit - bt.now()
            if left <= 0:
                break
            k.run(min(left, CHUNK_US))
        self.elapsed = bt.now()
        user = {id(w.task_obj) for w in self.loads if getattr(w, "kind", "") == "module"}
        for t in k.tasks:
            if t is not None and getattr(t, "exc", None) is not None and id(t) not in user:
                raise TaskFault(t.name, t.exc)

    def report(self):
        return _report(self.n, self.brd, self.k, self.bw, self.s, self.env, self.loads, self.guard, self.tel, self.sink,
                       self.cost, self.w_tier, self.kv_tier, self.why, len(self.ids), self.runs, self.reasons, self.bt,
                       self.marks, self.elapsed, self.reads, self.seen, self.made, self.mfile)


EMITTERS = ("bytecode", "native", "viper")  # a module task's step_emitter
TURN_KEYS = {"prompt": (str, None, None), "tokens": (int, 1, 1 << 20), "comment": (str, None, None)}


def _app_config(n):
    # the scenario's config (appcfg), or an empty one: the decode alone; with the checks of
    # what only the emulator runs (the board ignores them): deep-sleep turns, step_emitter
    if not n["scenario"]:
        return appcfg.load({})
    cfg = load_scenario(n["scenario"])[1]
    where = "scenario %s" % os.path.basename(n["scenario"])
    dec = cfg["decode"]
    if "turns" in dec:
        if "chats" in dec:
            _bad("%s: decode: turns are one conversation's: not with chats" % where)
        if not 1 <= len(dec["turns"]) <= 16:
            _bad("%s: decode: turns lists 1..16 turns, got %d" % (where, len(dec["turns"])))
        for i, c in enumerate(dec["turns"]):
            if c.__class__ is not dict:
                _bad("%s: decode: turns[%d] must be an object" % (where, i))
            for key, v in c.items():
                if key not in TURN_KEYS:
                    _bad("%s: decode: turns[%d]: unknown key %r (known: %s)" % (where, i, key, ", ".join(sorted(TURN_KEYS))))
                typ, lo, hi = TURN_KEYS[key]
                if v.__class__ is not typ or (lo is not None and not lo <= v <= hi):
                    _bad("%s: decode: turns[%d]: %s must be %s, got %r" % (
                        where, i, key, "a string" if typ is str else "a whole number in %d..%d" % (lo, hi), v))
    elif "sleep_ms" in dec:
        _bad("%s: decode: sleep_ms is the sleep between turns: give turns too" % where)
    for t in cfg["tasks"]:
        if t.get("step_emitter", "bytecode") not in EMITTERS:
            _bad("%s: task %r: step_emitter must be one of %s, got %r" % (where, t["name"], ", ".join(EMITTERS),
                                                                           t["step_emitter"]))
        if "step_emitter" in t and not t.get("step_us"):
            _bad("%s: task %r: step_emitter says how step_us scales: give step_us too" % (where, t["name"]))
    return cfg


def _band_steps(cfg, brd, speed):
    # at one end of the board-speed band, a module task's step_us (boardtime's prediction at
    # the fitted factor) scales by that end of its emitter's band, as the decode's figures do
    if speed == "fit" or not any(t.get("step_us") for t in cfg["tasks"]):
        return cfg
    from host import boardspeed  # noqa: PLC0415

    fx = boardspeed.profile_factors(boardspeed.factors()["fit"], brd.cpu_arch)
    i = 1 if speed == "slow" else 0
    tasks = []
    for t in cfg["tasks"]:
        if t.get("step_us"):
            f = fx.get(t.get("step_emitter", "bytecode")) or fx.get("bytecode")
            if f:
                t = dict(t, step_us=max(1, int(round(t["step_us"] * f["band"][i] / f["factor"]))))
        tasks.append(t)
    return dict(cfg, tasks=tasks)


def _run_us(t):
    return t.st[S_RUN_S] * 1000000 + t.st[S_RUN_US]


def _stamps(obj, bt, m, el):
    # (start, first token, end) of a Session or a Chat in board µs since the run began,
    # each tick stamp unwrapped near a mark taken at that moment (_BoardTime.at); a task
    # cut by the board-time limit ends at its last token (or at the cut when it made none)
    begin = m.get("begin", (0, 0))
    start = max(0, bt.at(begin, obj.t_start))  # a chat's may be its prefix's start, just before
    if "first" in m:
        first = m["first"][0]
        end = bt.at(m["end"], obj.t_end) if "end" in m else m["last"][0]
    else:
        first = start
        end = bt.at(m["end"], obj.t_end) if "end" in m else el
    return start, first, max(end, first)


def _rates(made, first, last):
    # (tok/s, ms per token) from the first new token to the last: nothing negative
    ft = last - first
    tok_s = round((made - 1) * 1e6 / ft, 3) if made > 1 and ft > 0 else 0.0
    ms_tok = round(ft / (made - 1) / 1000, 4) if made > 1 and ft > 0 else 0.0
    return tok_s, ms_tok


def _timing(obj, bt, m, el):
    # (tokens made, tok/s, ms per token, time to first token ms, decode ms) of a Session or a Chat
    made = obj.n_new
    start, first, end = _stamps(obj, bt, m, el)
    tok_s, ms_tok = _rates(made, first, end)
    if made <= 1:
        ms_tok = round((end - start) / 1000, 4)
    ttft = round((first - start) / 1000, 3) if made else 0.0
    return made, tok_s, ms_tok, ttft, round((end - start) / 1000, 3)


def _cut_line(n, made, asked):
    return "board-time limit of %s s reached after %d of %d tokens: raise --max-ms (at most %d) or lower --tokens" % (
        "%g" % (n["max_ms"] / 1000), made, asked, MAX_MS)


def _report(n, brd, k, bw, s, env, loads, guard, tel, sink, cost, w_tier, kv_tier, why, n_prompt, runs, reasons,
            bt, marks, el, reads, seen, n_seen, mfile=None):
    # el: the run's length in board µs (it started at 0; _BoardTime: exact across tick wraps)
    tr = s.traffic
    q = env["dma"]
    per = {}
    spans = []
    for name, obj, n_tok, _ in runs:
        mk = marks.get(id(obj), {})
        m, ts, mt, tt, dm = _timing(obj, bt, mk, el)
        spans.append(_stamps(obj, bt, mk, el) + (m,))
        stop, reason = obj.stop_line(), tm.DONE_REASONS[reasons.get(name, tm.DONE_ERROR)]
        if "end" not in mk:  # still decoding when the board-time limit came
            stop, reason = _cut_line(n, m, n_tok), STOP_TIME_LIMIT
        per[name] = {"tokens": m, "tokens_requested": n_tok, "prompt_tokens": obj.n_prompt if obj is not s else n_prompt,
                     "tok_s": ts, "ms_per_token": mt, "ttft_ms": tt, "decode_ms": dm, "stop": stop,
                     "stop_reason": reason, "kv_cached_tokens": s.cache.cached(obj.h),
                     "text": s.tok.decode(list(obj.tokens[:m])).decode("utf-8", "replace") if m else ""}
    made = sum(p["tokens"] for p in per.values())
    t0 = min(sp[0] for sp in spans)
    first = min(sp[1] for sp in spans if sp[3]) if made else t0
    last = max(sp[2] for sp in spans)
    # all runs together: tokens after the first one over the time from the first token to the last
    tok_s, ms_tok = _rates(made, first, last)
    if made <= 1:
        ms_tok = round((last - t0) / 1000, 4)
    lay = s.layout
    shared = 0
    if len(runs) > 1 and hasattr(s, "chats_report"):
        cr = s.chats_report()
        shared = cr.get("shared_tokens", 0)
    cached = sum(p["kv_cached_tokens"] for p in per.values()) - (len(runs) - 1) * shared  # the shared prefix once
    stop = "; ".join("%s: %s" % (nm, p["stop"]) if len(per) > 1 else p["stop"] for nm, p in per.items() if p["stop"])
    first_reason = [p["stop_reason"] for p in per.values() if p["stop_reason"] != "done"]
    bwr = bw.report()
    tiers = {}
    for name, d in bwr.items():
        a = d["all"]
        cats = {c: {"bytes": r["bytes"], "waits": r["waits"], "wait_us": r["wait_us"], "refused": r["refused"],
                    "peak_permille": r["peak_permille"], "budget": r["budget"]}
                for c, r in d.items() if c != "all" and (r["bytes"] or r["refused"] or r["waits"])}
        tiers[name] = {"bytes": a["bytes"], "busy_us": a["busy_us"],
                       "utilization": round(a["busy_us"] / el, 4) if el else 0.0,
                       "bytes_per_s": round(a["bytes"] * 1e6 / el, 1) if el else 0.0,
                       "bytes_permille_of_bandwidth": round(a["bytes"] * 1000 / (bw.bw[bw.tier_id(name)] * el / 1e6), 2) if el else 0.0,
                       "peak_permille": a["peak_permille"], "stalls": a["stalls"], "stall_us": a["stall_us"],
                       "waits": a["waits"], "refused": a["refused"], "categories": cats}
    tasks = {}
    total_run = 0
    for t in k.tasks:
        if t is None:
            continue
        ru = _run_us(t)
        total_run += ru
        tasks[t.name] = {"priority": t.st[10], "run_us": ru, "cpu_share": round(ru / el, 4) if el else 0.0,
                         "max_slice_us": t.st[S_MAX_SLICE], "max_wake_latency_us": t.st[S_MAX_LAT],
                         "kernel_misses": t.st[S_MISSES], "watchdog": isinstance(getattr(t, "exc", None), WatchdogError)}
    try:
        wl = appcfg.stats(loads)
    except appcfg.AppConfigError as e:
        _bad("scenario %s: %s" % (os.path.basename(n["scenario"]) or "-", e))
    misses = {name: st["deadline_misses"] for name, st in wl.items()}
    for name, d in tasks.items():
        d["deadline_misses"] = misses.get(name, d["kernel_misses"])
    dec, dec_counts = _decode_frames(sink.buf)
    ev_counts = {}
    ev_log = []
    for f in dec:
        for e in f.get("events", ()):
            ev_counts[e["event"]] = ev_counts.get(e["event"], 0) + 1
            if len(ev_log) < 200:
                ev_log.append(e)
    qs = q.stats()
    rep = {
        "version": REPORT_VERSION,
        "spec": _spec_view(n),
        "board": brd.name,
        "model": {"file": _display(n["model"]), "sha256": paths.sha256_file(mfile or n["model"]),
                  "converted": "int8 q8row, converted on the fly from the fp32 file" if mfile and mfile != n["model"] else "",
                  "dim": s.cfg.dim, "layers": s.cfg.n_layers,
                  "heads": s.cfg.n_heads, "kv_heads": s.cfg.n_kv_heads, "vocab": s.cfg.vocab_size,
                  "seq_len": s.cfg.seq_len, "weights_dtype": s.weights.dtype, "weights_bytes": s.weights.nbytes},
        "placement": {"weights": w_tier, "kv": kv_tier, "why": why, "heap_bytes": s.heap,
                      "reserve_bytes": s.reserve if n["reserve"] < 0 else n["reserve"]},
        "tokens": made,
        "tokens_requested": sum(p["tokens_requested"] for p in per.values()),
        "prompt_tokens": n_prompt,
        "stop": stop,
        "stop_reason": first_reason[0] if first_reason else "done",
        "tok_s": tok_s,
        "ms_per_token": ms_tok,
        "ttft_ms": round((first - t0) / 1000, 3) if made else 0.0,
        "decode_ms": round((last - t0) / 1000, 3),
        "elapsed_ms": round(el / 1000, 3),
        "kv_bytes": cached * lay.kv_bytes_per_token,
        "kv_cached_tokens": cached,
        "kv_bytes_per_token": lay.kv_bytes_per_token,
        "kv_cap_tokens": s.cap,
        "pool_blocks": s.pool.n_blocks,
        "pool_block_bytes": s.pool.block_bytes,
        "pool_high_water": s.pool.high_water,
        "pool_high_water_bytes": s.pool.high_water * s.pool.block_bytes,
        "deadline_misses": sum(misses.values()),
        "deadline_misses_by_task": misses,
        "bandwidth": tiers,
        "tasks": tasks,
        "cpu_busy_share": round(total_run / el, 4) if el else 0.0,
        "workloads": wl,
        "dma": qs,
        "decode_traffic": {"weights_bytes": tr.bytes_w_g * CARRY_N + tr.bytes_w, "kv_bytes": tr.bytes_kv_g * CARRY_N + tr.bytes_kv,
                           "memory_us": tr.s * 1000000 + tr.us, "refused_pieces": tr.refused, "pieces": s.pieces,
                           "carried_us": s.carried_us},
        "events": {"counts": ev_counts, "evictions": max(s.cache.evictions(s.h), 0),
                   "throttled_waits": sum(d["waits"] for d in tiers.values()),
                   "refusals": sum(d["refused"] for d in tiers.values()) + qs["refused"] + len(first_reason),
                   "thermal_events": guard.events, "thermal_pauses": s.thermal_pauses,
                   "thermal_pause_us": s.thermal_pause_us, "log": ev_log},
        "thermal": guard.report(),
        "cost": {"cpu": cost, "memory": _memory_figures(brd)},
        "telemetry": dict(dec_counts, wire_bytes=len(sink.buf)),
        "text": per[runs[0][0]]["text"],
    }
    if len(runs) > 1:
        rep["chats"] = per
        rep["sharing"] = s.chats_report()
    counted = {"tokens_seen": n_seen, "by_run": {nm: seen.get(id(obj), 0) for nm, obj, _, _ in runs},
               "model_reads": reads.expected(), "cut": any(p["stop_reason"] == STOP_TIME_LIMIT for p in per.values())}
    rep["slices"] = _slices(n, runs)
    rep["verdict"] = _verdict(rep, n)
    rep["invariants"] = _invariants(rep, bwr, q, k, w_tier, kv_tier, loads, counted)
    return rep


def _slices(n, runs):
    # the decode's slice bound and what its slicers saw: {"slice_us", "yields"} (per run when chats)
    out = {"slice_us": n["slice_us"], "yields": 0}
    for _name, obj, _, _ in runs:
        sl = getattr(obj, "slicer", None)
        if sl is not None:
            out["yields"] += sl.yields
    return out


def _path_words(rep):
    # (the decode's matvec path, weights) in words: the figures the cost model priced it by
    # (under viper cost, off the integer path: bytecode, cpucost.for_session)
    wd = rep["model"]["weights_dtype"]
    cost = rep["spec"]["cost"]
    kind = rep.get("cost", {}).get("cpu", {}).get("kind", cost) if cost == "viper" else cost
    return "%s matvec" % kind, "%s weights" % wd


# the run's verdict: {"ok", "line", "tasks": {name: {"missed", "released"}}, "holder",
# "holder_max_slice_us"}; ok False when a co-running task missed deadlines or a task
# was stopped by the watchdog. The line names the worst task, its misses, who held the
# CPU how long, on which path and setting, and what to change
def _verdict(rep, n):
    wl = rep["workloads"]
    tasks = rep["tasks"]
    bad = {}
    for name, d in tasks.items():
        m = d.get("deadline_misses", 0)
        if m > 0:
            bad[name] = {"missed": m, "released": wl.get(name, {}).get("released", m)}
    wd_stopped = sorted(name for name, d in tasks.items() if d.get("watchdog"))
    out = {"ok": not bad and not wd_stopped, "line": "", "tasks": bad, "watchdog": wd_stopped}
    others = [(d["max_slice_us"], name) for name, d in tasks.items() if name not in bad]
    hold, holder = max(others) if others else (0, "")
    out["holder"] = holder
    out["holder_max_slice_us"] = hold
    # tasks that held the CPU longer than the slice bound, by name (the decode passes it only
    # by a unit it cannot split: the float path's attention slot, a bound below a unit's time)
    over = {name: d["max_slice_us"] for name, d in tasks.items() if n["slice_us"] and d["max_slice_us"] > n["slice_us"]}
    out["overran"] = over
    decoders = {"decode", "prefix"} | set(rep.get("chats") or ())  # the tasks that run decode steps
    if out["ok"]:
        out["line"] = "every deadline met: the longest slice %s us (%s), slice bound %s" % (
            "{:,}".format(hold), holder or "-", "%d us" % n["slice_us"] if n["slice_us"] else "none")
        if over:
            out["line"] += "; over the bound: %s" % ", ".join(
                "%s %s us" % (nm, "{:,}".format(us)) for nm, us in sorted(over.items(), key=lambda x: (-x[1], x[0])))
            if any(nm in over for nm in decoders):
                out["line"] += " (a decode unit that cannot be split is longer than the bound: it is not kept)"
        return out
    path, weights = _path_words(rep)
    bound = "slice unbounded" if not n["slice_us"] else "slice %d us" % n["slice_us"]
    sp = rep["spec"]
    # the options that put the decode on the integer path's viper kernels, where it is not
    faster = []
    if sp["cost"] == "bytecode":
        faster.append("--cost viper")
    if sp["cost"] in ("viper", "bytecode"):
        if rep["model"]["weights_dtype"] != "int8":
            faster.append("--weights int8")
        if sp["kv_dtype"] != "int8":
            faster.append("--kv-dtype int8")
    faster = " ".join(faster)
    if holder not in decoders:
        # another task holds the CPU between its yields: no decode setting shortens that
        fix = "%s itself runs %s ms between yields: make it yield more often" % (
            holder, "{:,.1f}".format(hold / 1000))
    elif not n["slice_us"]:
        fix = "set a slice bound (--slice-us %d)" % decode.SLICE_US
        if faster:  # bounded, a bytecode path's units can still pass a slice
            fix += " and run the integer path's viper kernels (%s)" % faster
    elif holder in over:
        # the decode passed the bound by a unit it cannot split: a shorter slice does not help
        if faster:
            fix = "its units on this path take longer than the slice: run the integer path's viper kernels (%s)" % faster
        else:
            fix = "one of its units took %s us, longer than the slice, and it cannot be split" % "{:,}".format(hold)
    else:
        fix = "use a shorter slice (--slice-us %d)" % (decode.SLICE_US if n["slice_us"] > decode.SLICE_US else max(1, n["slice_us"] // 2))
    if bad:
        worst = sorted(bad, key=lambda nm: (-bad[nm]["missed"], nm))
        w = worst[0]
        also = "".join(", %s: %s of %s" % (nm, "{:,}".format(bad[nm]["missed"]), "{:,}".format(bad[nm]["released"]))
                       for nm in worst[1:])
        head = "%s: %s of %s deadlines missed%s" % (w, "{:,}".format(bad[w]["missed"]), "{:,}".format(bad[w]["released"]), also)
    else:
        head = "%s: stopped by the watchdog" % ", ".join(wd_stopped)
    what = " (%s, %s, %s)" % (path, weights, bound) if holder in decoders else ""
    out["line"] = "%s: %s held the CPU %s ms%s; %s" % (
        head, holder, "{:,.0f}".format(hold / 1000) if hold >= 10000 else "%.1f" % (hold / 1000), what, fix)
    return out


def _spec_view(n):
    # the normalized spec without the machine's folders (the report stays the same on every checkout)
    v = dict(n)
    for key in ("model", "tokenizer", "scenario"):
        if v[key]:
            v[key] = _display(v[key])
    if v["board"].endswith(".json"):
        v["board"] = _display(v["board"])
    return v


def _invariants(rep, bwr, q, k, w_tier, kv_tier, loads, counted):
    # each figure against an independent count: the decode's bytes against what the model
    # must read (_Reads), the DMA's against what the workloads submitted (their own
    # counters), the tokens against the emulator's own on_token count
    out = {}
    dt = rep["decode_traffic"]
    w_charged = bwr[w_tier]["weights"]["bytes"]
    kv_charged = bwr[kv_tier]["kv_read"]["bytes"] + bwr[kv_tier]["kv_write"]["bytes"]
    ex = counted["model_reads"]
    ok = dt["weights_bytes"] == w_charged == ex["weights"] and dt["kv_bytes"] == kv_charged == ex["kv"]
    if not ok and counted["cut"] and rep["spec"]["piece_bytes"]:
        # cut by the board-time limit inside a layer's or a final's pieces (counted whole when
        # the pass handed it over): at most that one layer and final not yet charged
        step_w, step_kv = ex["weights_per_layer"] + ex["weights_final"], ex["kv_row_bytes"] * (rep["kv_cap_tokens"] + 2)
        ok = (dt["weights_bytes"] == w_charged and dt["kv_bytes"] == kv_charged and
              0 <= ex["weights"] - w_charged <= step_w and 0 <= ex["kv"] - kv_charged <= step_kv)
    out["decode_bytes_charged"] = {"ok": ok, "weights_model": ex["weights"], "weights_moved": dt["weights_bytes"],
                                   "weights_charged": w_charged, "kv_model": ex["kv"], "kv_moved": dt["kv_bytes"],
                                   "kv_charged": kv_charged, "forwards": ex["forwards"], "layers": ex["layers"],
                                   "kv_rows_read": ex["kv_rows_read"]}
    # the DMA engine charges every burst to its category on both tiers it touches, and its
    # descriptors' bytes to "dma" on the descriptor tier; a wake-word task that reads its
    # audio task's frames charges them in the audio's category (its stats' bytes); a sensor
    # read by the CPU charges its bytes itself. Each DMA mover's own byte counter (what it
    # submitted and saw done) against the engine's and the tracker's
    wl = rep["workloads"]
    movers = [w.name for w in loads if getattr(w, "kind", "") in ("audio", "wifi") or
              (getattr(w, "kind", "") == "sensor" and wl[w.name].get("dma"))]
    charged = sum(bwr[t][c]["bytes"] for t in bwr for c in movers if c in bwr[t])
    reads = sum(wl[w.name].get("bytes", 0) for w in loads if getattr(w, "kind", "") == "wakeword")
    submitted = sum(wl[nm]["bytes"] for nm in movers)
    qs = rep["dma"]
    from firmware_py import dma as dma_mod  # noqa: PLC0415

    desc = bwr[q.bw.names[q.desc_tier]]["dma"]["bytes"]
    # where the run ends (its requests done, or the board-time limit), the engine may have
    # finished a transfer whose mover has not run since to count it: at most one of each
    # mover's own, whole (an audio period's bytes, a Wi-Fi packet, a sensor read), so the
    # difference must be a sum of such transfers, one per mover at most
    seen = submitted
    sums = {0}
    for nm in movers:
        u = max(wl[nm].get("period_bytes", 0), wl[nm].get("packet_bytes", 0), wl[nm].get("read_bytes", 0))
        if u > 0:
            sums |= {x + u for x in sums}
    if qs["bytes"] - submitted in sums:
        seen = qs["bytes"]
    out["dma_bytes_charged"] = {"ok": seen == qs["bytes"] and charged - reads == 2 * seen and
                                desc == qs["links"] * dma_mod.DESC_BYTES,
                                "submitted": submitted, "engine_moved": qs["bytes"], "moved_x2": 2 * qs["bytes"],
                                "charged": charged - reads, "wakeword_reads": reads,
                                "descriptor_bytes": desc, "descriptors_x12": qs["links"] * dma_mod.DESC_BYTES}
    direct = [w.name for w in loads if getattr(w, "kind", "") == "sensor" and not wl[w.name].get("dma")]
    d_moved = sum(wl[nm]["bytes"] for nm in direct)
    d_charged = sum(bwr[t][nm]["bytes"] for t in bwr for nm in direct if nm in bwr[t])
    out["cpu_reads_charged"] = {"ok": d_moved == d_charged, "moved": d_moved, "charged": d_charged}
    made = rep["tokens"]
    by_run = counted["by_run"]
    # one run (the decode, or a scenario's only chat, under its own name): the report is its
    per = rep.get("chats") or {(list(by_run) or ["decode"])[0]: rep}
    out["tokens"] = {"ok": made == counted["tokens_seen"] == sum(by_run.values()) and
                     all(p["tokens"] == by_run.get(nm, -1) and (p["tokens"] == p["tokens_requested"] or bool(p["stop"]))
                         for nm, p in per.items()),
                     "emitted": made, "seen": counted["tokens_seen"], "requested": rep["tokens_requested"],
                     "stop": rep["stop"]}
    worst = max((d["cpu_share"] for d in rep["tasks"].values()), default=0.0)
    out["cpu_share"] = {"ok": worst <= 1.0 and rep["cpu_busy_share"] <= 1.0, "largest_task": worst,
                        "all_tasks": rep["cpu_busy_share"]}
    failed = {t.name: "%s: %s" % (type(t.exc).__name__, str(t.exc).split("\n")[0])
              for t in k.tasks if t is not None and getattr(t, "exc", None) is not None}
    out["no_faults"] = {"ok": k.totals[T_FAULTS] == 0, "faults": k.totals[T_FAULTS], "failed_tasks": failed}
    v = rep["verdict"]
    out["deadlines"] = {"ok": v["ok"], "misses": rep["deadline_misses"], "by_task": {nm: d["missed"] for nm, d in v["tasks"].items()},
                        "watchdog": v["watchdog"], "longest_slice_us": v["holder_max_slice_us"], "holder": v["holder"]}
    out["ok"] = all(v["ok"] for v in out.values())
    return out


def _decode_frames(buf):
    # the console's decoder over the telemetry bytes: (frames, counts)
    from host import console  # noqa: PLC0415

    d = console.StreamDecoder()
    items = d.feed(bytes(buf))
    items += d.flush()
    frames = [v for kind, v in items if kind == "frame"]
    return frames, {"frames": d.good, "corrupt": d.corrupt, "dropped": d.dropped, "skipped": d.skipped,
                    "text_bytes": d.text_bytes}


def _frames(buf, rep):
    # telemetry.jsonl lines: the console's log format, host_t = the board time (virtual)
    from host import console  # noqa: PLC0415

    frames, _ = _decode_frames(buf)
    return [console.jsonl_line(f, host_time=f.get("ms", 0) / 1000.0) for f in frames]


def _write(out_dir, rep, lines):
    from host import trace  # noqa: PLC0415 - the same code ./kv trace runs

    files = {}
    lp = os.path.join(out_dir, "telemetry.jsonl")
    _put(lp, "".join(line + "\n" for line in lines))
    files["telemetry"] = "telemetry.jsonl"
    frames, _ = trace.read(lp)
    tr, series = trace.build(frames)
    _put(os.path.join(out_dir, "trace.json"), json.dumps(tr, sort_keys=True))
    files["trace"] = "trace.json"
    fit = trace.kv_fit(series)
    files["plots"] = [os.path.basename(p) for p in trace.plots(series, fit, out_dir)]
    rep["files"] = files
    rep["kv_fit"] = {k: v for k, v in fit.items() if k != "pts"} if fit else None
    _put(os.path.join(out_dir, "report.json"), json.dumps(rep, sort_keys=True, indent=1) + "\n")


def _put(p, text):
    try:
        with open(p, "w") as f:
            f.write(text)
    except OSError as e:
        _bad("%s cannot be written: %s" % (p, e.strerror or e))


# --- the command ------------------------------------------------------------------------

def _progress_fn(err):
    # a progress callable for the command line: a rich bar when stderr is a terminal,
    # else a line at every 10 % once the run has taken more than 3 s (wall time: only
    # what is shown depends on it, never the report)
    import time  # noqa: PLC0415

    t0 = time.monotonic()
    if err.isatty():
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn  # noqa: PLC0415

        state = {}

        def bar(done, total):
            if "p" not in state:
                if time.monotonic() - t0 < 1.0:
                    return
                p = Progress(TextColumn("emulate"), BarColumn(), TextColumn("{task.completed}/{task.total} tokens"),
                             TimeRemainingColumn(), transient=True, console=None)
                p.start()
                state["p"] = p
                state["t"] = p.add_task("emulate", total=total)
            state["p"].update(state["t"], completed=done)
            if done >= total:
                state["p"].stop()

        def close():
            if "p" in state:
                state["p"].stop()

        bar.close = close
        return bar
    last = [0]

    def lines(done, total):
        step = done * 10 // total
        if step > last[0] and time.monotonic() - t0 > 3.0:
            last[0] = step
            print("emulate: %d/%d tokens (%d %%)" % (done, total, step * 10), file=err, flush=True)

    lines.close = lambda: None
    return lines


def summary(rep):
    # the readable summary lines of a report
    inv = rep["invariants"]
    conv = rep["model"].get("converted")
    c = rep["cost"]["cpu"]
    float_path = not c.get("note") and c["kind"] != rep["spec"]["cost"]  # viper off the integer path
    cost = "%s (the float path: %s)" % (rep["spec"]["cost"], c["kind"]) if float_path else rep["spec"]["cost"]
    L = ["emulate: %s on %s, %s KV %s%s, cost %s%s" % (
        "%s (%s)" % (rep["model"]["file"], conv) if conv else rep["model"]["file"], rep["board"], rep["spec"]["policy"], rep["spec"]["kv_dtype"],
        " window %d" % rep["spec"]["window"] if rep["spec"]["window"] else "", cost,
        ", scenario %s" % rep["spec"]["scenario"] if rep["spec"]["scenario"] else ""),
        "  tokens      %d of %d (prompt %d)%s" % (rep["tokens"], rep["tokens_requested"], rep["prompt_tokens"],
                                                   "; " + rep["stop"] if rep["stop"] else ""),
        "  speed       %.2f tok/s, %.2f ms/token, time to first token %.1f ms%s" % (
            rep["tok_s"], rep["ms_per_token"], rep["ttft_ms"],
            " (MicroPython at the %s end of the board-speed band)" % rep["spec"]["speed"] if rep["spec"].get("speed", "fit") != "fit" else ""),
        "  memory      KV %s B (%d tokens cached), pool high-water %d/%d blocks = %s B; weights in %s, KV in %s" % (
            "{:,}".format(rep["kv_bytes"]), rep["kv_cached_tokens"], rep["pool_high_water"], rep["pool_blocks"],
            "{:,}".format(rep["pool_high_water_bytes"]), rep["placement"]["weights"], rep["placement"]["kv"])]
    if float_path:
        L.insert(1, "  note        %s weights with %s KV run the float path on the board: bytecode, no viper kernel "
                    "(the integer path needs int8 weights and int8 KV)" % (rep["model"]["weights_dtype"], rep["spec"]["kv_dtype"]))
    for name, d in sorted(rep["bandwidth"].items()):
        if d["bytes"]:
            L.append("  bandwidth   %-6s busy %.1f %%, %s B moved, peak window %d permille, waits %d" % (
                name, 100 * d["utilization"], "{:,}".format(d["bytes"]), d["peak_permille"], d["waits"]))
    failed = inv.get("no_faults", {}).get("failed_tasks") or {}
    for name, d in rep["tasks"].items():
        L.append("  task        %-10s prio %d  cpu %5.1f %%  deadline misses %d  worst wake latency %d us%s" % (
            name, d["priority"], 100 * d["cpu_share"], d["deadline_misses"], d["max_wake_latency_us"],
            "  FAILED: " + failed[name] if name in failed else ""))
    for name in sorted(n for n in failed if n not in rep["tasks"]):  # a task the table does not list
        L.append("  task        %-10s FAILED: %s" % (name, failed[name]))
    ev = rep["events"]
    L.append("  events      evictions %d, throttled waits %d, refusals %d, thermal changes %d; telemetry %s" % (
        ev["evictions"], ev["throttled_waits"], ev["refusals"], ev["thermal_events"],
        ", ".join("%s %d" % kv for kv in sorted(ev["counts"].items())) or "none"))
    sl = rep.get("sleep")
    if sl:
        L.append("  sleep       %d turn%s after the first request, each: save the KV snapshot (audio stopped), deep-sleep "
                 "%s ms, wake, read it back, answer; %d flash erases in all, %s ms from the first prompt to the last "
                 "answer%s" % (len(sl["turns"]), "" if len(sl["turns"]) == 1 else "s", "{:,}".format(sl["sleep_ms"]),
                               sl["erases"], "{:,}".format(round(sl["timeline_ms"])),
                               "; " + sl["error"] if sl.get("error") else ""))
        L.append("  wake        each wake: the weights read again %.1f ms, the model and tokenizer hashed %.1f ms, then "
                 "the snapshot read back" % (sl["weights_load_ms"], sl["hash_ms"]))
        for x in sl["turns"]:
            L.append("  turn %-6d %d positions resumed (%s B: save %.0f ms, %d erases; read back %.2f ms), %d of %d tokens "
                     "at %.2f tok/s%s, wake to first token %.0f ms, deadline misses %d" % (
                         x["turn"], x["resumed_positions"], "{:,}".format(x["snapshot_bytes"]), x["save_ms"], x["erases"],
                         x["restore_ms"], x["tokens"], x["tokens_requested"], x["tok_s"],
                         "" if x["stop_reason"] == "done" else " (%s)" % x["stop_reason"], x["wake_to_first_token_ms"],
                         x["deadline_misses"]))
    for end, b in sorted(rep.get("band", {}).items(), reverse=True):
        L.append("  band        %-4s end (board-speed factor %s): %.2f tok/s, deadline misses %d%s" % (
            end, ", ".join("%s %.1f" % kv for kv in sorted(b["factors"].items())), b["tok_s"], b["deadline_misses"],
            "" if b["verdict_ok"] else ": " + b["verdict_line"]))
    why = ""
    if float_path:
        why = " (the float path: %s weights with %s KV run no viper kernel)" % (rep["model"]["weights_dtype"], rep["spec"]["kv_dtype"])
    L.append("  cpu cost    %s" % (c.get("note") or "%s figures%s: %s" % (c["kind"], why, ", ".join(
        "%s=%s (%s)" % (k, v["value"], v.get("kind", "")) for k, v in sorted(c["figures"].items())))))
    L.append("  slices      bound %s, %d yields inside a step; %s" % (
        "%d us" % rep["slices"]["slice_us"] if rep["slices"]["slice_us"] else "none", rep["slices"]["yields"],
        rep["verdict"]["line"]))
    L.append("  invariants  %s" % ("all hold" if inv["ok"] else "FAILED: " + ", ".join(k for k, v in inv.items() if k != "ok" and not v["ok"])))
    if rep.get("files"):
        L.append("  files       report.json, telemetry.jsonl, trace.json, %s" % ", ".join(rep["files"]["plots"]))
    return L


# ./kv emulate: the spec from the options (None: not given), the summary or the JSON
def band(opts, rep):
    # {"slow": ..., "fast": ...}: the same run with the MicroPython cost at each end of the
    # board-speed band (tok/s, deadline misses, the verdict); {} when the cost is not MicroPython's
    kind = rep["spec"]["cost"]
    if kind not in ("viper", "bytecode") or rep["spec"].get("speed", "fit") != "fit":
        return {}
    from host import boardspeed  # noqa: PLC0415

    fx = boardspeed.profile_factors(boardspeed.factors()["fit"], boards.load(normalize(opts)["board"]).cpu_arch)
    out = {}
    for end, i in (("slow", 1), ("fast", 0)):
        r = run(dict(opts, speed=end))
        # (a deep-sleep scenario: its turns' misses too)
        out[end] = {"tok_s": r["tok_s"], "deadline_misses": r.get("sleep", {}).get("deadline_misses", r["deadline_misses"]),
                    "verdict_ok": r["verdict"]["ok"],
                    "verdict_line": r["verdict"].get("line", ""), "factors": {e: f["band"][i] for e, f in fx.items()}}
    return out


def main(opts, out=None, as_json=False, err=None):
    err = err or sys.stderr
    prog = _progress_fn(err)
    earlier = bool(out) and os.path.isfile(os.path.join(out, OUT_MARKER)) and any(
        os.path.exists(os.path.join(out, n)) for n in OUT_FILES)
    try:
        rep = run(opts, out_dir=out, progress=prog)
    finally:
        prog.close()
    if earlier:
        print("emulate: note: %s held an earlier ./kv emulate run's files; this run's replaced them" % out, file=err)
    rep["band"] = band(opts, rep)
    if as_json:
        print(json.dumps(rep, sort_keys=True))
    else:
        for line in summary(rep):
            print(line)
        if out:
            print("  out         %s" % out)
    if not rep["verdict"]["ok"]:
        raise UserError(rep["verdict"]["line"], 1)
    if not rep["invariants"]["ok"]:
        failed = rep["invariants"]["no_faults"].get("failed_tasks") or {}
        raise UserError("an invariant does not hold: %s%s" % (", ".join(
            k for k, v in rep["invariants"].items() if k != "ok" and not v["ok"]),
            "".join("; task %s failed: %s" % kv for kv in sorted(failed.items()))), 1)
    return rep


# the spec from ./kv emulate's options (strings, None: not given): whole numbers and
# numbers checked here (one line naming the flag), the rest by normalize()
def spec_from_options(**opts):
    spec = {}
    for key, v in opts.items():
        if v is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key in _INT_KEYS:
            v = options.whole(v, flag, *_INT_KEYS[key])
        elif key in _FLOAT_KEYS:
            v = options.number(v, flag, *_FLOAT_KEYS[key], open_lo=key in appcfg.OPEN_LO)
        elif key == "model" and v == "":
            _bad("--model needs a value (a path, or stories260K)")
        elif v == "" and key != "prompt":  # typed empty: not the default (--scenario '' ran without one, --cost '' with the board's)
            _bad("%s needs a value (leave the option out for its default)" % flag)
        spec[key] = v
    return spec
