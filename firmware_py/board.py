# Board profile: boards/<name>.json on the host, board.json on the device, as a
# plain object. Loading validates every field and names the first bad one, so a
# malformed profile is one clear line, never a KeyError deep in the firmware.
import json
import sys

from firmware_py import cpucost

# On the board a profile's citations are text nobody reads there: tens of KB of heap for
# as long as the firmware runs (61 KB on the 64-bit port for esp32s3_n8r8, the raw dict
# included). LEAN (MicroPython) keeps of each source only its kind ("fit:", "estimate:"
# ...: what the firmware and the cost model test), one shared string per kind, and drops
# the dict the profile was parsed into (the host writes board.json from its own copy)
LEAN = sys.implementation.name == "micropython"
_KIND_TEXTS = ("measured:", "published:", "estimate:", "fit:")
_CITED = "cited"  # a lean source that starts with none of the kinds (a tier's citation)


# a source as the board keeps it: the text itself, or lean, the shared text of its kind
def _source(s, lean):
    if not lean:
        return s
    for k in _KIND_TEXTS:
        if s.startswith(k):
            return k
    return _CITED

# Memory tier kinds a profile may name; budget and bandwidth code key on these.
TIER_KINDS = ("sram", "psram", "dram", "flash")
BOARD_KINDS = ("mcu", "soc")
# mpy-cross -march values (mpy-cross --help); "host" and "debug" are not a board's
MPY_ARCHS = ("x86", "x64", "armv6", "armv6m", "armv7m", "armv7em", "armv7emsp", "armv7emdp",
             "xtensa", "xtensawin", "rv32imc", "rv64imc")
NAME_MAX = 64  # a board name names folders (.vboard/NAME): this many characters at most
_NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"  # what a name may hold
# The largest figure a profile may give, by unit: past these it is a typo or a broken
# profile, not a board (host/budget.py refuses sizes over 1 PiB the same way)
MAX_BYTES = 1 << 50  # 1 PiB: a tier, the heap, a reserve; also bytes/s (1 PiB/s)
MAX_NS = 10 ** 9  # 1 s: a latency
MAX_CORES = 1024
MAX_MHZ = 100000  # 100 GHz
MAX_CELSIUS = 1000
_LIMIT_TEXT = {MAX_BYTES: "2**50 (1 PiB)", MAX_NS: "10**9 (1 s)"}


class BoardError(ValueError):
    # a profile that cannot be used; str() is "<where>: <field>: <problem>"
    def __init__(self, where, field, problem):
        super().__init__("%s: %s: %s" % (where, field, problem))
        self.where = where  # file name or "<dict>"
        self.field = field  # dotted path of the offending field, e.g. "memory[1].bytes"
        self.problem = problem  # what is wrong with it


class Tier:
    # one memory tier of a board: where bytes live and what moving them costs
    def __init__(self, d, where, path, lean=False):
        self.name = _str(d, "name", where, path)  # unique within the board, e.g. "psram"
        self.kind = _choice(d, "kind", TIER_KINDS, where, path)  # one of TIER_KINDS
        self.bytes = _int(d, "bytes", where, path, 1, MAX_BYTES)  # capacity in bytes
        self.bandwidth = _int(d, "bandwidth_bytes_per_s", where, path, 1, MAX_BYTES)  # sustained bytes/s
        self.latency_ns = _int(d, "latency_ns", where, path, 0, MAX_NS)  # first-access latency, ns
        self.dma = _bool(d, "dma", where, path)  # True when a DMA engine can move it
        self.source = _source(_str(d, "source", where, path), lean)  # citation; "estimate: ..." when estimated
        self.cost = None  # TierCost: what moving bytes here costs (docs/tiers.md); None: derived from bandwidth
        if "cost" in d:
            self.cost = TierCost(d["cost"], self, where, path + "cost", lean)

    def to_dict(self):
        # the JSON form this tier was loaded from
        d = {
            "name": self.name,
            "kind": self.kind,
            "bytes": self.bytes,
            "bandwidth_bytes_per_s": self.bandwidth,
            "latency_ns": self.latency_ns,
            "dma": self.dma,
            "source": self.source,
        }
        if self.cost is not None:
            d["cost"] = self.cost.to_dict()
        return d


# a tier's cost figures (docs/tiers.md): each is {"value": int, "source": "..."}; a source
# starting "estimate" marks an estimate. (name, minimum value); the maximum is MAX_BYTES
# (bytes, bytes/s) unless COST_MAX says otherwise
COST_FIELDS = (
    ("read_bytes_per_s", 1),  # CPU copy out of this tier into SRAM (SRAM itself: SRAM to SRAM)
    ("write_bytes_per_s", 1),  # CPU copy from SRAM into this tier
    ("copy_bytes_per_s", 1),  # CPU copy within this tier (both ends here)
    ("dma_bytes_per_s", 0),  # the DMA engine to or from this tier; 0 when it has none (dma false)
    ("line_bytes", 4),  # cache line of scattered reads, bytes (a power of two)
    ("line_ns", 0),  # miss latency per line, ns
    ("line_stream_bytes_per_s", 1),  # rate at which a line's bytes then arrive
)
COST_MAX = {"line_ns": MAX_NS}


class TierCost:
    # the cost block of one memory tier, validated: every figure an integer with a source
    def __init__(self, d, tier, where, path, lean=False):
        if not isinstance(d, dict):
            raise BoardError(where, path, "expected an object of cost figures")
        self.value = {}  # field -> int
        self.source = {}  # field -> citation ("estimate: ..." when estimated)
        for name, lo in COST_FIELDS:
            f = _obj(d, name, where, path + ".")
            self.value[name] = _int(f, "value", where, path + "." + name + ".", lo, COST_MAX.get(name, MAX_BYTES))
            self.source[name] = _source(_str(f, "source", where, path + "." + name + "."), lean)
        for k in d:
            if k not in self.value:
                raise BoardError(where, path + "." + k, "unknown cost field (known: %s)" % ", ".join(n for n, _ in COST_FIELDS))
        lb = self.value["line_bytes"]
        if lb & (lb - 1):
            raise BoardError(where, path + ".line_bytes.value", "must be a power of two")
        if tier.dma and self.value["dma_bytes_per_s"] < 1:
            raise BoardError(where, path + ".dma_bytes_per_s.value", "tier has dma true: must be at least 1")
        if not tier.dma and self.value["dma_bytes_per_s"]:
            raise BoardError(where, path + ".dma_bytes_per_s.value", "tier has dma false: must be 0")

    def values(self):
        # the figures as {field: int}
        return self.value

    def estimated(self, name):
        # True when the figure's source says it is an estimate
        return self.source[name].startswith("estimate")

    def to_dict(self):
        # the JSON form this block was loaded from
        return {n: {"value": self.value[n], "source": self.source[n]} for n, _ in COST_FIELDS}


class Board:
    # a validated board profile; see docs/boards.md for every field. lean (None: LEAN, i.e.
    # on MicroPython): sources kept as their kind only, and no raw dict
    def __init__(self, d, where="<dict>", lean=None):
        if lean is None:
            lean = LEAN
        if not isinstance(d, dict):
            raise BoardError(where, "<top>", "expected a JSON object")
        self.where = where  # where the profile came from (for messages)
        self.name = _name(d, where)  # identifier, same as the file stem; [A-Za-z0-9_.-], no leading dot
        self.title = _str(d, "title", where, "")  # human description
        self.kind = _choice(d, "kind", BOARD_KINDS, where, "")  # "mcu" or "soc"
        cpu = _obj(d, "cpu", where, "")
        self.cpu_arch = _str(cpu, "arch", where, "cpu.")  # e.g. "xtensa-lx7"
        self.cores = _int(cpu, "cores", where, "cpu.", 1, MAX_CORES)  # CPU cores
        self.cpu_mhz = _int(cpu, "mhz", where, "cpu.", 1, MAX_MHZ)  # max clock, MHz
        # the CPU cost model's figures (firmware_py/cpucost.py): {kind: {param: int}} and
        # {kind: {param: source}}; {} when the profile has no cpu.cost block
        self.cpu_cost, self.cpu_cost_source = _cpu_cost(cpu, self.cores, where, lean)
        tiers = _list(d, "memory", where, "")
        if not tiers:
            raise BoardError(where, "memory", "needs at least one tier")
        self.tiers = []  # [Tier], fastest first as listed
        seen = {}
        for i, t in enumerate(tiers):
            path = "memory[%d]." % i
            if not isinstance(t, dict):
                raise BoardError(where, path[:-1], "expected a JSON object")
            tier = Tier(t, where, path, lean)
            if tier.name in seen:
                raise BoardError(where, path + "name", "duplicate tier name %r" % tier.name)
            seen[tier.name] = tier
            self.tiers.append(tier)
        thermal = _obj(d, "thermal", where, "")
        self.throttle_c = _int(thermal, "throttle_c", where, "thermal.", 1, MAX_CELSIUS)  # throttles from here, °C
        # the KV budget shrinks from here, °C (thermal.shrink_c), or None: the guard's default
        self.shrink_c = _int(thermal, "shrink_c", where, "thermal.", 1, MAX_CELSIUS) if "shrink_c" in thermal else None
        self.usb_vid = None  # USB vendor id (int) of the board's serial port, or None
        self.usb_pid = None  # USB product id (int), or None
        usb = d.get("usb")
        if usb is None and "usb" in d and self.kind == "mcu":
            # an MCU is found by its USB ids; null would silently send flash to a virtual board
            raise BoardError(where, "usb", "expected an object with vid and pid (null only for a soc; leave it out if the board has no USB serial port)")
        if usb is not None:
            if not isinstance(usb, dict):
                raise BoardError(where, "usb", "expected an object with vid and pid (or null for a soc)")
            self.usb_vid = _hex16(usb, "vid", where, "usb.")
            self.usb_pid = _hex16(usb, "pid", where, "usb.")
        # the console's bits/s: a USB-UART bridge's (usb.baud; MicroPython's UART REPL default);
        # a native USB CDC port ignores it
        self.console_baud = _int(usb, "baud", where, "usb.", 1200, 4000000) if usb and "baud" in usb else 115200
        self.source = _source(_str(d, "source", where, ""), lean)  # citation for cpu/thermal/usb figures
        est = d.get("estimates", [])
        if not isinstance(est, list) or not all(isinstance(e, str) for e in est):
            raise BoardError(where, "estimates", "expected a list of field names")
        self.estimates = est  # fields whose figures are estimates, not datasheet values
        if self.kind == "mcu":
            self.mpy_heap = _int(d, "micropython_heap_bytes", where, "", 1024, MAX_BYTES)  # usable GC heap
            self.mpy_arch = _choice(d, "mpy_arch", MPY_ARCHS, where, "")  # mpy-cross -march value
            self.firmware_bytes = _int(d, "firmware_reserved_bytes", where, "", 0, MAX_BYTES)  # heap the firmware itself keeps
        else:
            self.mpy_heap = None
            self.mpy_arch = None
            self.firmware_bytes = _int(d, "os_reserved_bytes", where, "", 0, MAX_BYTES)  # RAM the OS keeps
        self.raw = None if lean else d  # the dict as loaded, for writing to the device (host only)

    def tier(self, name):
        # the tier called name; KeyError names the board when absent
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError("board %s has no memory tier %r" % (self.name, name))

    def total_bytes(self, kind):
        # bytes in all tiers of a kind
        n = 0
        for t in self.tiers:
            if t.kind == kind:
                n += t.bytes
        return n


def _cpu_cost(cpu, cores, where, lean=False):
    # validate cpu.cost: {kind: {param: {"value": int, "source": "<kind>: ..."}}}
    if "cost" not in cpu:
        return {}, {}
    d = cpu["cost"]
    if not isinstance(d, dict) or not d:
        raise BoardError(where, "cpu.cost", "expected an object of kinds (%s)" % ", ".join(cpucost.KINDS))
    vals, srcs = {}, {}
    for kind in d:
        path = "cpu.cost." + kind
        if kind not in cpucost.KINDS:
            raise BoardError(where, path, "unknown kind (known: %s)" % ", ".join(cpucost.KINDS))
        block = d[kind]
        if not isinstance(block, dict):
            raise BoardError(where, path, "expected an object of cost figures")
        for k in block:
            if k not in cpucost.PARAMS:
                raise BoardError(where, path + "." + k, "unknown cost parameter (known: %s)" % ", ".join(cpucost.PARAMS))
        v, s = {}, {}
        for p in cpucost.PARAMS:
            f = _obj(block, p, where, path + ".")
            lo, hi = 0, cpucost.PARAM_MAX
            if p == "cores":
                lo, hi = 1, cores
            elif p == "split_permille":
                hi = 1000
            v[p] = _int(f, "value", where, path + "." + p + ".", lo, hi)
            s[p] = _str(f, "source", where, path + "." + p + ".")
            if not cpucost.source_kind(s[p]):
                raise BoardError(where, path + "." + p + ".source", "must start with one of %s"
                                 % ", ".join(k + ":" for k in cpucost.SOURCE_KINDS))
            s[p] = _source(s[p], lean)
        vals[kind] = v
        srcs[kind] = s
    return vals, srcs


def loads(text, where="<string>", lean=None):
    # parse and validate a profile from JSON text (lean: Board's)
    try:
        d = json.loads(text)
    except ValueError as e:
        raise BoardError(where, "<json>", "not valid JSON (%s)" % e)
    except RuntimeError:  # RecursionError on CPython, RuntimeError on MicroPython
        raise BoardError(where, "<json>", "nested too deeply to be a board profile")
    return Board(d, where, lean)


def load(path):
    # read and validate the profile at path (boards/x.json on the host, board.json on a device)
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        raise BoardError(path, "<file>", "cannot be read")
    except UnicodeError:  # CPython decodes on read; MicroPython leaves it to json
        raise BoardError(path, "<file>", "is not UTF-8 text (not a board profile?)")
    return loads(text, path)


def _get(d, key, where, path):
    if key not in d:
        raise BoardError(where, path + key, "missing")
    return d[key]


def _str(d, key, where, path):
    v = _get(d, key, where, path)
    if not isinstance(v, str) or not v:
        raise BoardError(where, path + key, "expected a non-empty string")
    return v


def _name(d, where):
    # the profile's name: it names folders, so 1..NAME_MAX of _NAME_CHARS, not starting with "."
    v = _str(d, "name", where, "")
    if len(v) > NAME_MAX or v[0] == "." or not all(c in _NAME_CHARS for c in v):
        raise BoardError(where, "name", "%r: expected 1..%d letters, digits, '_', '.' or '-', not starting with '.'" % (v[:NAME_MAX + 1], NAME_MAX))
    return v


def _int(d, key, where, path, minimum, maximum):
    # an integer field within minimum..maximum (the profile's units: bytes, ns, ...)
    v = _get(d, key, where, path)
    if isinstance(v, bool) or not isinstance(v, int):
        raise BoardError(where, path + key, "expected an integer")
    if v < minimum or v > maximum:
        got = ("%d" % v) if -10 ** 20 < v < 10 ** 20 else "a %d-digit number" % len("%d" % abs(v))
        raise BoardError(where, path + key, "must be %d..%s, got %s" % (minimum, _LIMIT_TEXT.get(maximum, "%d" % maximum), got))
    return v


def _bool(d, key, where, path):
    v = _get(d, key, where, path)
    if not isinstance(v, bool):
        raise BoardError(where, path + key, "expected true or false")
    return v


def _obj(d, key, where, path):
    v = _get(d, key, where, path)
    if not isinstance(v, dict):
        raise BoardError(where, path + key, "expected an object")
    return v


def _list(d, key, where, path):
    v = _get(d, key, where, path)
    if not isinstance(v, list):
        raise BoardError(where, path + key, "expected a list")
    return v


def _choice(d, key, choices, where, path):
    v = _str(d, key, where, path)
    if v not in choices:
        raise BoardError(where, path + key, "expected one of %s" % ", ".join(choices))
    return v


def _hex16(d, key, where, path):
    v = _str(d, key, where, path)
    try:
        n = int(v, 16)
    except ValueError:
        n = -1
    if not v.startswith("0x") or not 0 <= n <= 0xFFFF:
        raise BoardError(where, path + key, "expected a hex string like \"0x303A\"")
    return n
