# Telemetry over the serial link: frames the host's console (host/console.py) picks out
# of the ordinary print/REPL text on the same UART, and the kernel task that sends them.
# docs/telemetry.md is the byte-exact specification; in short:
#
#   wire      0x00, COBS(payload + CRC-32 LE), 0x00    (text never holds a 0x00 byte)
#   payload   0xFE magic, version 1, type, seq (u16 LE), board time ms (u32 LE), body
#   CRC-32    IEEE 802.3 / zlib.crc32 (reflected 0xEDB88320, init and xorout 0xFFFFFFFF)
#             over the payload; the magic makes the first encoded byte 0xFE, which
#             UTF-8 text never holds, so the host knows at once whether a 0x00 opens a frame
#   body      LAYOUT: "key=value" lines ("part=I/N" first: a long layout goes in several frames of
#             whole lines, never cut); PERIODIC and EVENT: records [id u8][len u8][len
#             bytes of LEB128 varints]; TEXT: [request varint][UTF-8 bytes of generated text]
#
# A periodic frame carries the fast-changing figures every time (core counters, pool,
# heap, the first sequence) and as many slow rows (tasks, other sequences, kernel
# totals, temperature) as fit its byte budget, taking them round robin from where the
# last frame stopped: at 10 Hz on 115,200 baud a frame stays within 115 bytes (a tenth
# of the link). The task paces every frame to the link's rate (a byte credit refilled at
# link_bps): a frame that finds the credit short, or a period the task slept through, is
# skipped and counted, and the count travels in the next frames. Nothing waits for the link.
#
# Steady state allocates nothing on MicroPython: the payload and wire buffers, the event
# ring and the text ring are made in __init__; varints, the CRC and COBS run over them
# as viper loops (plain twins on CPython); the write function is given at boot and is
# called as write(buf, n) (a MicroPython stream's write(buf, len): sys.stdout.buffer.write
# or a machine.UART's). Only the layout frame (boot, on request, when the tasks change)
# builds strings.
from array import array

from firmware_py import VERSION
from firmware_py.compat import IS_MICROPYTHON, const, mem_alloc, mem_free, micropython, ptr8, ptr32, ticks_add, \
    ticks_diff
from firmware_py.status import CARRY_N, E_FULL, E_RANGE, E_STALE, INT_MAX, OK

MAGIC = const(0xFE)  # payload byte 0: never in UTF-8 text
PROTO = const(1)  # payload byte 1: this format's version
HDR = const(9)  # payload header bytes: magic, version, type, seq u16, time u32
CRC_BYTES = const(4)
MAX_PAYLOAD = const(1024)  # largest payload (header + body) a frame may carry, either direction
MS_WRAP = const(1000000000)  # the board time (payload bytes 5..8, event records' ms) counts ms modulo
#                              10**9 (11.57 days): it stays a small int on the ESP32; a decoder unwraps
#                              it (a step back of more than half of it with the sequence going on is a wrap)
ARG_MAX = const(0x1FFFFFFF)  # event arguments are clamped to +-(2**29 - 1): their zigzag code stays a small int

# frame types (payload byte 2)
T_LAYOUT = const(1)  # board -> host: names and constants, text lines
T_PERIODIC = const(2)  # board -> host: records
T_EVENT = const(3)  # board -> host: one record per event (id = event code)
T_TEXT = const(4)  # board -> host: generated text
T_CMD_PROMPT = const(0x10)  # host -> board: [tokens varint][prompt UTF-8]
T_CMD_STOP = const(0x11)  # host -> board: stop the running request
T_CMD_CONFIG = const(0x12)  # host -> board: "key=value" lines for the next request
T_CMD_LAYOUT = const(0x13)  # host -> board: send the layout frame again
T_CMD_SAVE = const(0x14)  # host -> board: [snapshot name UTF-8]: save the conversation (when the request ends)
T_CMD_RESUME = const(0x15)  # host -> board: [snapshot name UTF-8]: the next prompts go on from it
FRAME_TYPES = {T_LAYOUT: "layout", T_PERIODIC: "periodic", T_EVENT: "event", T_TEXT: "text",
               T_CMD_PROMPT: "prompt", T_CMD_STOP: "stop", T_CMD_CONFIG: "config", T_CMD_LAYOUT: "layout_request",
               T_CMD_SAVE: "save", T_CMD_RESUME: "resume"}

# periodic records: id -> (name, fields); every field an unsigned varint unless SIGNED
R_CORE = const(1)
R_KERNEL = const(2)
R_POOL = const(3)
R_SEQ = const(4)
R_HEAP = const(5)
R_TASK = const(6)
R_TEMP = const(7)
R_TIER = const(8)
R_BWCAT = const(9)
R_DMA = const(10)
RECORDS = {
    R_CORE: ("core", ("tokens", "tok_s_x10", "requests", "skipped", "events_dropped", "text_dropped")),
    R_KERNEL: ("kernel", ("busy_ms", "idle_ms", "tasks", "misses", "faults", "overruns", "bites", "switches")),
    R_POOL: ("pool", ("used", "high_water", "failed")),
    R_SEQ: ("seq", ("slot", "length", "cached", "cap", "blocks", "evictions")),
    R_HEAP: ("heap", ("free", "alloc")),
    R_TASK: ("task", ("slot", "state", "prio", "run_ms", "runs", "max_slice_us", "max_lat_us", "misses", "overruns",
                      "faults")),
    R_TEMP: ("temp", ("deci_c", "state", "peak_deci_c")),
    R_TIER: ("tier", ("tier", "util_permille", "kb", "waits")),
    R_BWCAT: ("bwcat", ("tier", "category", "util_permille", "kb", "waits", "refused")),
    R_DMA: ("dma", ("depth", "max_depth", "in_flight", "stalls", "full")),
}
FAST = (R_CORE, R_POOL, R_HEAP, R_SEQ, R_TIER, R_DMA)  # in every periodic frame (R_SEQ: the first
# sequence; R_HEAP: once per heap_ms, default a second, as reading the heap walks all of it)
SIGNED = ("temp.deci_c", "temp.peak_deci_c")  # zigzag-encoded fields ("record.field"); every event argument too

# events: code -> (name, argument names); an event record is [code][len][ms][a][b][c],
# ms unsigned (board time), a, b, c zigzag-signed
EV_EVICT = const(1)  # a sequence evicted tokens: slot, evicted in this tick, evicted in all
EV_WATERMARK = const(2)  # a sequence crossed its watermark: slot, cached, cap
EV_THROTTLE = const(3)  # the bandwidth tracker held a transfer back: tier, category, count
EV_FAULT = const(4)  # a task raised: task slot, faults of the kernel, 0
EV_MISS = const(5)  # a task woke past its deadline: task slot, its misses, its worst latency µs
EV_WATCHDOG = const(6)  # the watchdog stopped a task: task slot, bites of the kernel, 0
EV_REFUSED = const(7)  # a request or an allocation was refused: status code, count, request
EV_THERMAL = const(8)  # the thermal guard changed state: deci °C, state (thermal.NORMAL/SHRINK/SLOW), its events
EV_START = const(9)  # a request started: request, prompt tokens, tokens asked
EV_DONE = const(10)  # a request ended: request, tokens made, reason (DONE_*)
EV_ACK = const(11)  # a command was read: frame type, status (0 ok, < 0 refused), request
EV_LAST = const(11)  # the highest defined code: event() refuses codes outside 1..EV_LAST
EVENTS = {
    EV_EVICT: ("evict", ("slot", "evicted", "total")),
    EV_WATERMARK: ("watermark", ("slot", "cached", "cap")),
    EV_THROTTLE: ("throttle", ("tier", "category", "count")),
    EV_FAULT: ("fault", ("task", "faults", "_")),
    EV_MISS: ("deadline_miss", ("task", "misses", "max_lat_us")),
    EV_WATCHDOG: ("watchdog", ("task", "bites", "_")),
    EV_REFUSED: ("refused", ("status", "count", "request")),
    EV_THERMAL: ("thermal", ("deci_c", "state", "events")),
    EV_START: ("start", ("request", "prompt_tokens", "tokens")),
    EV_DONE: ("done", ("request", "tokens", "reason")),
    EV_ACK: ("ack", ("type", "status", "request")),
}
DONE_OK = const(0)  # EV_DONE reasons: made every token asked
DONE_STOP = const(1)  # a stop command
DONE_FULL = const(2)  # the KV budget is reached (policy full)
DONE_ERROR = const(3)  # the cache refused a token, or the task failed
DONE_REASONS = ("done", "stopped", "full", "error")

DEFAULT_RATE_HZ = const(10)
DEFAULT_LINK_BPS = const(11520)  # bytes/s of 115,200 baud, 8N1
DEFAULT_SHARE_PCT = const(10)  # periodic frames use this share of the link
MIN_FRAME = const(64)  # smallest periodic frame budget (wire bytes)
WIRE_OVER = const(7)  # wire bytes beyond the payload for a payload < 254 B: CRC 4 + COBS 1 + delimiters 2
_EV_WORDS = const(5)  # event ring entry: code, ms, a, b, c
_NO_SEQ = const(-1)
_REC_MAX = const(52)  # bytes of the largest record: id, length, 10 varints of at most 5 bytes
PART_LINE = const(17)  # the longest "part=I/N\n" line opening a layout frame (I, N < 10**5)
LAYOUT_ROOM = const(998)  # MAX_PAYLOAD - HDR - PART_LINE: bytes of whole "key=value" lines per layout frame
_PART = b"part="

# stats row / totals indices of firmware_py/sched/stats.py, as local consts
_S_RUNS = const(0)
_S_RUN_US = const(2)
_S_RUN_S = const(3)
_S_MAX_SLICE = const(4)
_S_MAX_LAT = const(5)
_S_MISSES = const(6)
_S_FAULTS = const(7)
_S_OVERRUNS = const(8)
_S_STATE = const(9)
_S_PRIO = const(10)
_T_SWITCHES = const(0)
_T_IDLE_US = const(2)
_T_IDLE_S = const(3)
_T_BUSY_US = const(4)
_T_BUSY_S = const(5)
_T_FAULTS = const(6)
_T_OVERRUNS = const(7)
_T_MISSES = const(8)
_T_TASKS = const(9)
_T_BITES = const(10)
# bandwidth.py snapshot fields (P_*, NSNAP) and dma.py stats (ST_*, NST), as local consts
# (tests/firmware/fw_telemetry.py checks them against those modules)
_P_UTIL = const(1)
_P_BYTES = const(5)
_P_BYTES_G = const(6)
_P_WAITS = const(7)
_P_REFUSED = const(10)
_NSNAP = const(16)
_ST_STALLS = const(12)
_ST_MAX_DEPTH = const(16)
_ST_DEPTH = const(17)
_ST_FULL = const(18)
_NST = const(22)
BW_FIELDS = (_P_UTIL, _P_BYTES, _P_BYTES_G, _P_WAITS, _P_REFUSED, _NSNAP)  # the same, for that check
DMA_FIELDS = (_ST_STALLS, _ST_MAX_DEPTH, _ST_DEPTH, _ST_FULL, _NST)


class TelemetryError(ValueError):
    # a configuration mistake (rate, link, buffer sizes); one line
    pass


# --- the CRC-32 and COBS over preallocated buffers ---------------------------------------

def _crc_table():
    # the 256-entry table of the reflected polynomial 0xEDB88320 (zlib's CRC-32); boot only
    t = array("I", bytes(1024))
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[i] = c
    return t


CRC_TABLE = _crc_table()


# CRC-32 of buf[start:start + n], written little-endian at buf[start + n:start + n + 4];
# no allocation (the crc never leaves the viper locals: a 32-bit value is a big int on the ESP32)
@micropython.viper
def _crc_put_v(buf, start: int, n: int, tab) -> int:
    p = ptr8(buf)
    t = ptr32(tab)
    c = -1
    i = start
    end = start + n
    while i < end:
        c = t[(c ^ p[i]) & 0xFF] ^ ((c >> 8) & 0xFFFFFF)
        i += 1
    c = ~c
    p[end] = c & 0xFF
    p[end + 1] = (c >> 8) & 0xFF
    p[end + 2] = (c >> 16) & 0xFF
    p[end + 3] = (c >> 24) & 0xFF
    return 0


def _crc_put_py(buf, start, n, tab):
    c = 0xFFFFFFFF
    for i in range(start, start + n):
        c = tab[(c ^ buf[i]) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    end = start + n
    buf[end] = c & 0xFF
    buf[end + 1] = (c >> 8) & 0xFF
    buf[end + 2] = (c >> 16) & 0xFF
    buf[end + 3] = (c >> 24) & 0xFF
    return 0


# COBS of src[0:n] into dst as a whole wire frame: 0x00, the encoded bytes, 0x00;
# returns the wire length (n + 3 + n // 254 at most); no allocation
@micropython.viper
def _cobs_v(src, n: int, dst) -> int:
    s = ptr8(src)
    d = ptr8(dst)
    d[0] = 0
    ci = 1
    o = 2
    code = 1
    i = 0
    while i < n:
        b = s[i]
        if b == 0:
            d[ci] = code
            ci = o
            o += 1
            code = 1
        else:
            d[o] = b
            o += 1
            code += 1
            if code == 0xFF:
                d[ci] = code
                ci = o
                o += 1
                code = 1
        i += 1
    d[ci] = code
    d[o] = 0
    return o + 1


def _cobs_py(src, n, dst):
    dst[0] = 0
    ci, o, code = 1, 2, 1
    for i in range(n):
        b = src[i]
        if b == 0:
            dst[ci] = code
            ci, o, code = o, o + 1, 1
        else:
            dst[o] = b
            o += 1
            code += 1
            if code == 0xFF:
                dst[ci] = code
                ci, o, code = o, o + 1, 1
    dst[ci] = code
    dst[o] = 0
    return o + 1


# unsigned LEB128 of v (an int >= 0, a small int) at buf[off]; the offset after it
@micropython.viper
def _varint_v(buf, off: int, v: int) -> int:
    p = ptr8(buf)
    while v >= 0x80:
        p[off] = (v & 0x7F) | 0x80
        v = v >> 7
        off += 1
    p[off] = v
    return off + 1


def _varint_py(buf, off, v):
    while v >= 0x80:
        buf[off] = (v & 0x7F) | 0x80
        v >>= 7
        off += 1
    buf[off] = v
    return off + 1


crc_put = _crc_put_v if IS_MICROPYTHON else _crc_put_py
cobs_encode = _cobs_v if IS_MICROPYTHON else _cobs_py
put_varint = _varint_v if IS_MICROPYTHON else _varint_py


# the decimal digits of v (an int >= 0, a small int) at buf[off]; the offset after them;
# no allocation
def _put_dec(buf, off, v):
    d = 1
    while d * 10 <= v:
        d *= 10
    while d:
        buf[off] = 48 + v // d % 10
        off += 1
        d //= 10
    return off


# v as a zigzag-coded unsigned int (0, -1, 1, -2 ... -> 0, 1, 2, 3 ...); small ints only
def zigzag(v):
    return v + v if v >= 0 else -v - v - 1


# CRC-32 of the bytes in buf[start:start + n] as an int (allocates on a 32-bit port: tests
# and the command reader only)
def crc32(buf, start=0, n=-1):
    if n < 0:
        n = len(buf) - start
    tmp = bytearray(n + 4)
    for i in range(n):
        tmp[i] = buf[start + i]
    crc_put(tmp, 0, n, CRC_TABLE)
    return tmp[n] | tmp[n + 1] << 8 | tmp[n + 2] << 16 | tmp[n + 3] << 24


# wire bytes of a frame whose payload is n bytes
def wire_len(n):
    m = n + CRC_BYTES
    return m + 3 + m // 254


# --- host -> board commands -----------------------------------------------------------
#
# Commands use the same payload and CRC-32 with the same 0x00 delimiters, but the
# payload + CRC travel as lowercase hex digits instead of COBS: the board's input must
# never see a control byte (0x03 is Ctrl-C to MicroPython and SIGINT on the virtual
# board's pty, 0x1A / 0x1C suspend or quit it there), and commands are rare.

class CommandReader:
    # assembles command frames from the bytes the board reads; allocation-free per byte,
    # a complete frame is handed to on_frame(ftype, body bytes, seq) (which may allocate)
    def __init__(self, on_frame, max_payload=MAX_PAYLOAD):
        self.on_frame = on_frame  # fn(ftype, body: bytes, seq)
        self.buf = bytearray(max_payload + CRC_BYTES)  # decoded payload + CRC
        self.n = 0  # bytes decoded into buf
        self.hi = -1  # a pending high nibble, or -1
        self.inside = False  # after a 0x00: collecting hex digits
        self.good = 0  # frames accepted (the three counts saturate at 2**30 - 1)
        self.corrupt = 0  # candidates refused (bad hex, CRC, magic, version, length)
        self.ignored = 0  # bytes outside any frame

    # feed one byte (an int 0..255)
    def byte(self, b):
        if b == 0:
            if self.inside and (self.n or self.hi >= 0):
                self._end()
            self.inside = True
            self.n = 0
            self.hi = -1
            return
        if not self.inside:
            if self.ignored < INT_MAX:
                self.ignored += 1
            return
        if 48 <= b <= 57:
            d = b - 48
        elif 97 <= b <= 102:
            d = b - 87
        elif 65 <= b <= 70:
            d = b - 55
        else:
            self.inside = False  # not a command: text typed at the board, or noise
            if self.n:
                self._corrupt()
            if self.ignored < INT_MAX:
                self.ignored += 1
            return
        if self.hi < 0:
            self.hi = d
            return
        if self.n >= len(self.buf):
            self.inside = False
            self._corrupt()
            return
        self.buf[self.n] = (self.hi << 4) | d
        self.n += 1
        self.hi = -1

    def _corrupt(self):
        if self.corrupt < INT_MAX:
            self.corrupt += 1

    # feed bytes (a buffer) of length n (all when n < 0)
    def feed(self, data, n=-1):
        if n < 0:
            n = len(data)
        for i in range(n):
            self.byte(data[i])

    def _end(self):
        n = self.n
        buf = self.buf
        self.inside = False
        if self.hi >= 0 or n < HDR + CRC_BYTES or buf[0] != MAGIC or buf[1] != PROTO:
            self._corrupt()
            return
        p = n - CRC_BYTES
        got = buf[p] | buf[p + 1] << 8 | buf[p + 2] << 16 | buf[p + 3] << 24
        if crc32(buf, 0, p) != got:
            self._corrupt()
            return
        if self.good < INT_MAX:
            self.good += 1
        self.on_frame(buf[2], bytes(buf[HDR:p]), buf[3] | buf[4] << 8)


# the wire bytes of a host -> board command (used by host/console.py; allocates)
def encode_command(ftype, body=b"", seq=0):
    pay = bytearray(HDR + len(body) + CRC_BYTES)
    pay[0] = MAGIC
    pay[1] = PROTO
    pay[2] = ftype
    pay[3] = seq & 0xFF
    pay[4] = (seq >> 8) & 0xFF
    for i in range(len(body)):
        pay[HDR + i] = body[i]
    crc_put(pay, 0, HDR + len(body), CRC_TABLE)
    hexd = b"0123456789abcdef"
    out = bytearray(2 * len(pay) + 2)
    for i in range(len(pay)):
        out[1 + 2 * i] = hexd[pay[i] >> 4]
        out[2 + 2 * i] = hexd[pay[i] & 15]
    return bytes(out)


# (value, offset after it) of the LEB128 varint at body[off] (host and command side)
def get_varint(body, off):
    v = 0
    shift = 0
    while True:
        if off >= len(body):
            raise ValueError("varint runs past the end")
        b = body[off]
        off += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, off
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


# --- the telemetry encoder and task ---------------------------------------------------

class Telemetry:
    # frames for one link. Sources are optional objects polled at each tick:
    #   kernel  sched.Kernel (task rows, totals, faults/misses/watchdog events)
    #   pool    pool.Pool (blocks, high water, refused allocations)
    #   cache   kv.KVCache with the handles given to watch_seq() (length, blocks, evictions)
    #   bw      bandwidth.Bandwidth (per tier every frame, per category rotated, throttles)
    #   dma     dma.DMAQueue (queue depth every frame)
    #   thermal thermal.Guard (temperature and state rotated, its state changes as events),
    #           or a bare source with read_mc() (thermal.BoardTemp / ModelTemp)
    #   heap    True: free/allocated heap from compat (absent on CPython)
    # meta: {key: value} pairs added to the layout frame (model, dtype, policy ...).
    def __init__(self, write, clock=None, link_bps=DEFAULT_LINK_BPS, rate_hz=DEFAULT_RATE_HZ,
                 share_pct=DEFAULT_SHARE_PCT, frame_bytes=0, kernel=None, pool=None, cache=None, bw=None,
                 dma=None, thermal=None, heap=True, meta=None, text_bytes=1024, events=32, max_seqs=4,
                 heap_ms=1000):
        for name, v, lo in (("link_bps", link_bps, 100), ("rate_hz", rate_hz, 1), ("share_pct", share_pct, 1),
                            ("text_bytes", text_bytes, 16), ("events", events, 1), ("max_seqs", max_seqs, 1),
                            ("heap_ms", heap_ms, 1)):
            if v.__class__ is not int or v < lo:
                raise TelemetryError("telemetry: %s must be an int >= %d, got %r" % (name, lo, v))
        if rate_hz > 1000 or share_pct > 100 or link_bps > 1000000 or heap_ms > 3600000:
            # link_bps <= 10**6: the credit's arithmetic stays a small int on the ESP32
            raise TelemetryError("telemetry: rate_hz <= 1000, share_pct <= 100, link_bps <= 1000000 and heap_ms <= 3600000")
        self.write = write  # fn(buf, n): the link (a MicroPython stream's write(buf, len))
        self.clock = clock if clock is not None else (kernel.clock if kernel is not None else None)
        if self.clock is None:
            raise TelemetryError("telemetry: give a clock or a kernel")
        self.link_bps = link_bps  # bytes per second the link carries
        self.rate_hz = rate_hz  # periodic frames per second
        self.period_us = 1000000 // rate_hz
        fb = frame_bytes or link_bps * share_pct // 100 // rate_hz
        self.frame_max = fb if fb >= MIN_FRAME else MIN_FRAME  # wire bytes a periodic frame may take
        if self.frame_max > MAX_PAYLOAD:
            self.frame_max = MAX_PAYLOAD
        self.kernel = kernel
        self.pool = pool
        self.cache = cache
        self.bw = bw
        self.dma = dma
        self.thermal = thermal
        self.guard = thermal is not None and hasattr(thermal, "sample")  # a Guard (else a bare source)
        self.heap = heap and mem_free() is not None
        # gc.mem_free() walks the whole allocation table (~0.9 ms on an 8 MB heap of the
        # unix port): the heap is read once per heap_ms, one call, alloc = total - free
        self.heap_total = mem_free() + mem_alloc() if self.heap else 0
        self.heap_ms = heap_ms
        self.heap_at = -heap_ms  # board ms of the last reading
        self.heap_free = 0
        self.heap_new = False  # a reading not yet sent
        self.meta = meta or {}
        self.pay = bytearray(MAX_PAYLOAD + _REC_MAX)  # the payload being built (+ room for one record past the end)
        self.wire = bytearray(wire_len(MAX_PAYLOAD) + 1)  # its wire form
        self.n = 0  # payload bytes built
        self.seq = 0  # sequence number of the next frame sent (u16)
        self.ms = 0  # board time in ms since start, modulo MS_WRAP (advanced by tick())
        self.us_rem = 0  # µs not yet counted in ms
        self.last = self.clock.now()  # ticks of the last tick()
        # link bytes we may send now: a quarter second of the link, or one largest frame
        self.credit_cap = link_bps // 4 if link_bps // 4 > wire_len(MAX_PAYLOAD) else wire_len(MAX_PAYLOAD)
        self.credit = self.credit_cap  # full at boot: the layout frame goes at once
        self.credit_rem = 0  # credit fraction (bytes x 1000)
        # counters (the first five travel in the core record). Every one stays a small int
        # on the ESP32: tokens, requests and the byte counts carry at CARRY_N into a _g
        # field (the decode side bumps tokens / requests by 1; tick() carries them, so they
        # stay below CARRY_N + the tokens of one period; the core record sends the part
        # below CARRY_N: the count modulo 10**9); the other counts saturate at INT_MAX
        self.tokens = 0  # tokens generated (the decode side bumps it), part below CARRY_N
        self.tokens_g = 0  # ... times CARRY_N
        self.requests = 0  # requests started, part below CARRY_N
        self.requests_g = 0  # ... times CARRY_N
        self.request = 0  # the running request's number (its text frames carry it)
        self.skipped = 0  # periodic frames skipped (behind, or the link credit short)
        self.events_dropped = 0  # events lost because the ring was full
        self.text_dropped = 0  # text bytes lost because the ring was full
        self.sent = 0  # frames sent
        self.sent_bytes = 0  # wire bytes sent, part below CARRY_N
        self.sent_bytes_g = 0  # ... times CARRY_N
        self.periodic_sent = 0  # periodic frames sent
        self.periodic_bytes = 0  # their wire bytes, part below CARRY_N
        self.periodic_bytes_g = 0  # ... times CARRY_N
        self.periodic_max = 0  # the largest one
        self.write_errors = 0  # write() raised OSError
        self.short_writes = 0  # frames write() took only part of (or none, or raised): not sent, counted here
        # tok/s over about one second: tokens and ms at each of the last rate_hz ticks
        self.tok_hist = array("i", bytes(4 * (rate_hz + 1)))
        self.ms_hist = array("i", bytes(4 * (rate_hz + 1)))
        self.hist_i = 0  # next sample slot
        self.hist_n = 0  # samples taken, up to rate_hz + 1
        self.tok_s_x10 = 0
        # events: a ring of (code, ms, a, b, c)
        self.ev = array("i", bytes(4 * _EV_WORDS * events))
        self.ev_cap = events
        self.ev_head = 0  # next to send
        self.ev_n = 0  # queued
        # generated text: a ring of bytes
        self.txt = bytearray(text_bytes)
        self.txt_head = 0
        self.txt_n = 0
        # sequences watched: handles (or -1) and what was seen of them
        self.seqs = array("i", [_NO_SEQ] * max_seqs)
        self.seq_ev = array("i", bytes(4 * max_seqs))  # evictions seen
        self.seq_cap = array("i", bytes(4 * max_seqs))  # budget (tokens) each was opened with
        # kernel rows seen (fault / miss events), per task slot
        nt = len(kernel.tasks) if kernel is not None else 0
        self.row = array("i", bytes(4 * 11))  # snapshot buffer (NSTAT ints)
        self.tot = array("i", bytes(4 * 13))  # totals buffer (NTOT ints)
        self.seen_faults = array("i", bytes(4 * (nt or 1)))
        self.seen_misses = array("i", bytes(4 * (nt or 1)))
        self.seen_tasks = [None] * nt  # the Task in each slot when the layout was made
        self.seen_bites = 0
        self.seen_failed = pool.failed if pool is not None else 0
        self._wm_hook = self.on_watermark  # one bound method: the cache calls it, attach() recognises it
        if cache is not None and cache.on_watermark is None:
            cache.on_watermark = self._wm_hook  # the cache names the sequence that crossed
        self.seen_thermal = thermal.events if self.guard else 0
        # bandwidth: one snapshot buffer, the waits seen per row (throttle events)
        if bw is not None:
            self.bw_snap = bw.new_snapshot()
            self.bw_rows = bw.snapshot_rows()
            self.bw_ncat = bw.n_cat + 1  # rows per tier (categories, then the tier's total)
            self.bw_waits = array("i", bytes(4 * self.bw_rows))
        else:
            self.bw_snap = None
            self.bw_rows = 0
            self.bw_ncat = 1
        self.dma_st = array("i", bytes(4 * _NST)) if dma is not None else None
        # rotation over the slow rows: 0 kernel, 1 temperature, then the sequences beyond
        # the first, the task slots, the bandwidth (tier, category) rows
        self.rot_seq = 2
        self.rot_task = 2 + max_seqs
        self.rot_bw = self.rot_task + nt
        self.rot_n = self.rot_bw + self.bw_rows
        self.rot = 0
        self.starved = False  # the last frame had no room for a slow row: the next one starts with them
        self.want_layout = True  # send the layout frame at the next tick
        self.layout = b""  # the layout body last built ("key=value" lines)
        self.lay_parts = 0  # the layout frames it takes (part=I/N: N)
        self.lay_part = 0  # those sent (the next one is part lay_part + 1)
        self.lay_off = 0  # where the next part's lines start in self.layout
        self.layouts = 0  # layout frames sent (saturates)

    # (re)bind the pool, cache, bandwidth and DMA sources (a request booted a new cache);
    # the watched sequences are forgotten and the layout goes out again. Allocates
    # (configuration, not the steady state)
    def attach(self, pool=None, cache=None, bw=None, dma=None):
        if self.cache is not None and self.cache.on_watermark is self._wm_hook:
            self.cache.on_watermark = None
        self.pool = pool
        self.cache = cache
        self.seen_failed = pool.failed if pool is not None else 0
        if cache is not None and cache.on_watermark is None:
            cache.on_watermark = self._wm_hook
        for i in range(len(self.seqs)):
            self.seqs[i] = _NO_SEQ
        if bw is not self.bw:
            self.bw = bw
            if bw is not None:
                self.bw_snap = bw.new_snapshot()
                self.bw_rows = bw.snapshot_rows()
                self.bw_ncat = bw.n_cat + 1
                self.bw_waits = array("i", bytes(4 * self.bw_rows))
            else:
                self.bw_snap = None
                self.bw_rows = 0
                self.bw_ncat = 1
            self.rot_n = self.rot_bw + self.bw_rows
            self.rot = 0
        if dma is not self.dma:
            self.dma = dma
            self.dma_st = array("i", bytes(4 * _NST)) if dma is not None else None
        self.want_layout = True

    # --- what other code calls (no allocation) ---------------------------------------

    # watch sequence handle h of the cache, opened with a budget of cap tokens (its row in
    # periodic frames, its events); the slot (>= 0), E_FULL when every slot is taken, or
    # E_RANGE (h or cap not an int 0..2**30 - 1)
    def watch_seq(self, h, cap=0):
        if h.__class__ is not int or cap.__class__ is not int or h < 0 or h > INT_MAX or cap < 0 or cap > INT_MAX:
            return E_RANGE
        for i in range(len(self.seqs)):
            if self.seqs[i] == h:
                return i
        for i in range(len(self.seqs)):
            if self.seqs[i] == _NO_SEQ:
                self.seqs[i] = h
                self.seq_ev[i] = 0
                self.seq_cap[i] = cap
                if self.cache is not None:
                    e = self.cache.evictions(h)
                    self.seq_ev[i] = e if e > 0 else 0
                return i
        return E_FULL

    # stop watching h; OK or E_STALE
    def unwatch_seq(self, h):
        for i in range(len(self.seqs)):
            if self.seqs[i] == h:
                self.seqs[i] = _NO_SEQ
                return OK
        return E_STALE

    # queue event code (one of the EV_* codes, 1..EV_LAST) with arguments a, b, c (ints;
    # one beyond +-ARG_MAX is sent as +-ARG_MAX: its zigzag code must stay a small int);
    # OK, E_FULL (counted in events_dropped) when the ring is full, E_RANGE (nothing
    # queued) for a code that is not a defined event type or an argument that is not an int
    def event(self, code, a=0, b=0, c=0):
        if (code.__class__ is not int or code < 1 or code > EV_LAST or a.__class__ is not int
                or b.__class__ is not int or c.__class__ is not int):
            return E_RANGE
        if self.ev_n >= self.ev_cap:
            if self.events_dropped < INT_MAX:
                self.events_dropped += 1
            return E_FULL
        i = (self.ev_head + self.ev_n) % self.ev_cap * _EV_WORDS
        ev = self.ev
        ev[i] = code
        ev[i + 1] = self.ms
        ev[i + 2] = a if -ARG_MAX <= a <= ARG_MAX else (ARG_MAX if a > 0 else -ARG_MAX)
        ev[i + 3] = b if -ARG_MAX <= b <= ARG_MAX else (ARG_MAX if b > 0 else -ARG_MAX)
        ev[i + 4] = c if -ARG_MAX <= c <= ARG_MAX else (ARG_MAX if c > 0 else -ARG_MAX)
        self.ev_n += 1
        return OK

    # queue generated text (a bytes-like object); the bytes queued (the rest is dropped and
    # counted); no allocation
    def text(self, data):
        n = len(data)
        cap = len(self.txt)
        room = cap - self.txt_n
        k = n if n <= room else room
        j = (self.txt_head + self.txt_n) % cap
        t = self.txt
        for i in range(k):
            t[j] = data[i]
            j += 1
            if j == cap:
                j = 0
        self.txt_n += k
        if k < n:
            d = n - k
            v = self.text_dropped
            self.text_dropped = v + d if d < INT_MAX - v else INT_MAX
        return k

    # the cache's watermark hook: sequence handle h crossed its watermark
    def on_watermark(self, h):
        for i in range(len(self.seqs)):
            if self.seqs[i] == h:
                c = self.cache
                self.event(EV_WATERMARK, i, c.cached(h), self.seq_cap[i])
                return
        self.event(EV_WATERMARK, -1, 0, 0)

    # ask for the layout frame at the next tick
    def request_layout(self):
        self.want_layout = True

    # --- the task -----------------------------------------------------------------------

    # the telemetry task (a generator for sched.Kernel): a tick every period, on a grid
    # (sleep_until), periods slept through skipped and counted
    def task(self, k):
        period = self.period_us
        nxt = k.now()
        while True:
            now = k.now()
            late = ticks_diff(now, nxt)
            if late >= period:
                miss = late // period
                s = self.skipped
                self.skipped = s + miss if miss < INT_MAX - s else INT_MAX
                nxt = ticks_add(nxt, miss * period)
            self.tick()
            nxt = ticks_add(nxt, period)
            yield k.sleep_until(nxt)

    # one tick: time, link credit, events found by polling, then the layout (when due),
    # events, text and the periodic frame, each only when the link credit covers it
    def tick(self):
        now = self.clock.now()
        d = ticks_diff(now, self.last)
        self.last = now
        if d < 0:
            d = 0
        if d > 1000000:
            d = 1000000  # a long gap: at most a second of credit and time in one step
        us = self.us_rem + d
        m = self.ms + us // 1000  # < MS_WRAP + 1001: a small int
        self.ms = m - MS_WRAP if m >= MS_WRAP else m
        self.us_rem = us % 1000
        if self.tokens >= CARRY_N:  # the decode side bumps tokens and requests: carry them here
            self.tokens -= CARRY_N
            self.tokens_g = self.tokens_g + 1 if self.tokens_g < INT_MAX else INT_MAX
        if self.requests >= CARRY_N:
            self.requests -= CARRY_N
            self.requests_g = self.requests_g + 1 if self.requests_g < INT_MAX else INT_MAX
        c = self.credit_rem + (d // 1000) * self.link_bps + (d % 1000) * self.link_bps // 1000
        self.credit += c // 1000
        self.credit_rem = c % 1000
        if self.credit > self.credit_cap:
            self.credit = self.credit_cap
        self._rate()
        self._poll()
        if self.want_layout or self._tasks_changed():
            self.want_layout = False
            self.send_layout()
        elif self.lay_part < self.lay_parts:
            self._send_layout_parts()  # the rest of a layout the credit cut short
        self.send_events()
        self.send_text()
        if self.build_periodic() < 0 and self.skipped < INT_MAX:
            self.skipped += 1
        return OK

    # tokens per second x 10 over the last second of ticks (the oldest of rate_hz + 1)
    def _rate(self):
        h = self.hist_i
        n = len(self.tok_hist)
        self.tok_hist[h] = self.tokens
        self.ms_hist[h] = self.ms
        h += 1
        if h == n:
            h = 0
        self.hist_i = h
        if self.hist_n < n:
            self.hist_n += 1
        o = h if self.hist_n == n else 0  # the oldest sample
        dt = self.ms - self.ms_hist[o]
        if dt < 0:
            dt += MS_WRAP  # the board time wrapped
        dn = self.tokens - self.tok_hist[o]
        if dn < 0:
            dn += CARRY_N  # tokens carried into tokens_g
        if dt > 0 and dn >= 0:
            self.tok_s_x10 = dn * 10000 // dt if dn < 100000 else dn // dt * 10000
        elif dt > 0:
            self.tok_s_x10 = 0

    # events found by comparing counters with what was seen at the last tick
    def _poll(self):
        c = self.cache
        if c is not None:
            for i in range(len(self.seqs)):
                h = self.seqs[i]
                if h == _NO_SEQ:
                    continue
                e = c.evictions(h)
                if e < 0:
                    self.seqs[i] = _NO_SEQ  # closed
                    continue
                if e > self.seq_ev[i]:
                    self.event(EV_EVICT, i, e - self.seq_ev[i], e)
                    self.seq_ev[i] = e
                elif e < self.seq_ev[i]:
                    self.seq_ev[i] = e
        p = self.pool
        if p is not None and p.failed != self.seen_failed:
            f = p.failed - self.seen_failed
            self.seen_failed = p.failed
            self.event(EV_REFUSED, -2, f if f > 0 else 1, self.request)  # E_NO_BLOCK
        k = self.kernel
        if k is not None:
            tot = k.totals
            if tot[_T_FAULTS] or tot[_T_MISSES]:
                ts = k.tasks
                for i in range(len(ts)):
                    t = ts[i]
                    if t is None:
                        continue
                    st = t.st
                    if st[_S_FAULTS] > self.seen_faults[i]:
                        self.seen_faults[i] = st[_S_FAULTS]
                        self.event(EV_FAULT, i, tot[_T_FAULTS], 0)
                    if st[_S_MISSES] > self.seen_misses[i]:
                        self.seen_misses[i] = st[_S_MISSES]
                        self.event(EV_MISS, i, st[_S_MISSES], st[_S_MAX_LAT])
            if tot[_T_BITES] != self.seen_bites:
                self.seen_bites = tot[_T_BITES]
                b = k.bitten
                self.event(EV_WATCHDOG, b.id if b is not None else -1, tot[_T_BITES], 0)
        g = self.thermal
        if self.guard and g.events != self.seen_thermal:
            self.seen_thermal = g.events
            self.event(EV_THERMAL, g.last_event_mc // 100, g.last_event, g.events)
        bw = self.bw
        if bw is not None:
            snap = self.bw_snap
            bw.snapshot(snap)
            nc = self.bw_ncat
            for r in range(self.bw_rows):
                w = snap[r * _NSNAP + _P_WAITS]
                if w != self.bw_waits[r]:
                    if r % nc != nc - 1:  # a category row (the tier's total row repeats them)
                        self.event(EV_THROTTLE, r // nc, r % nc, w - self.bw_waits[r])
                    self.bw_waits[r] = w

    # True when a task slot holds another task than the layout named (allocation-free)
    def _tasks_changed(self):
        k = self.kernel
        if k is None:
            return False
        ts = k.tasks
        seen = self.seen_tasks
        for i in range(len(ts)):
            t = ts[i]
            if t is not seen[i]:
                if t is None:
                    seen[i] = None  # a slot freed: nothing new to name
                    continue
                return True
        return False

    # --- frames ---------------------------------------------------------------------------

    # start a payload of type ftype; the body goes from HDR on
    def _begin(self, ftype):
        p = self.pay
        p[0] = MAGIC
        p[1] = PROTO
        p[2] = ftype
        s = self.seq
        p[3] = s & 0xFF
        p[4] = (s >> 8) & 0xFF
        m = self.ms
        p[5] = m & 0xFF
        p[6] = (m >> 8) & 0xFF
        p[7] = (m >> 16) & 0xFF
        p[8] = (m >> 24) & 0xFF
        self.n = HDR

    # CRC, COBS and write the payload built: the wire bytes sent, or E_FULL when the
    # link credit does not cover them, or when the write was short or failed (nothing
    # counted as sent, the sequence number not used: the caller keeps the frame's
    # events and text for a later frame, and counts a periodic frame skipped). write()
    # returns the bytes it wrote (a MicroPython stream's write: a UART or USB-CDC may
    # write fewer; None from stream_writer's streams means none) or None when it does
    # not say (then all of them). The bytes of a cut frame that did go out are charged
    # to the credit; the receiver drops them as one corrupt frame and finds the next at
    # its opening 0x00. A write that took all but the closing 0x00 is a frame sent: the
    # receiver ends it at the next frame's opening 0x00 and decodes it whole
    def _send(self):
        n = self.n
        wl = wire_len(n)
        if wl > self.credit:
            return E_FULL
        crc_put(self.pay, 0, n, CRC_TABLE)
        wl = cobs_encode(self.pay, n + CRC_BYTES, self.wire)
        try:
            r = self.write(self.wire, wl)
        except OSError:
            r = 0
            if self.write_errors < INT_MAX:
                self.write_errors += 1
        if r is not None and r.__class__ is int and r < wl - 1:  # wl - 1: all but the closing 0x00, which the next frame's opening 0x00 stands in for: sent
            if r > 0:
                self.credit -= r
            if self.short_writes < INT_MAX:
                self.short_writes += 1
            return E_FULL
        self.credit -= wl
        self.seq = (self.seq + 1) & 0xFFFF
        if self.sent < INT_MAX:
            self.sent += 1
        v = self.sent_bytes + wl
        if v >= CARRY_N:
            if self.sent_bytes_g < INT_MAX:
                self.sent_bytes_g += 1
                v -= CARRY_N
            else:
                v = CARRY_N - 1
        self.sent_bytes = v
        return wl

    # one record id with the values given at the payload's end (values of -1 end the
    # record: every field is >= 0, signed ones come zigzagged); False, with nothing
    # added, when it would pass `limit` payload bytes. Written in place, then kept or not
    # (the buffer has room for a whole record past MAX_PAYLOAD)
    def _rec(self, rid, limit, a, b=-1, c=-1, d=-1, e=-1, f=-1, g=-1, h=-1, i=-1, j=-1):
        n0 = self.n
        p = self.pay
        p[n0] = rid
        o = put_varint(p, n0 + 2, a)
        if b < 0:
            return self._end_rec(n0, o, limit)
        o = put_varint(p, o, b)
        if c < 0:
            return self._end_rec(n0, o, limit)
        o = put_varint(p, o, c)
        if d < 0:
            return self._end_rec(n0, o, limit)
        o = put_varint(p, o, d)
        if e < 0:
            return self._end_rec(n0, o, limit)
        o = put_varint(p, o, e)
        if f < 0:
            return self._end_rec(n0, o, limit)
        o = put_varint(p, o, f)
        if g < 0:
            return self._end_rec(n0, o, limit)
        o = put_varint(p, o, g)
        if h < 0:
            return self._end_rec(n0, o, limit)
        o = put_varint(p, o, h)
        if i < 0:
            return self._end_rec(n0, o, limit)
        o = put_varint(p, o, i)
        if j < 0:
            return self._end_rec(n0, o, limit)
        o = put_varint(p, o, j)
        return self._end_rec(n0, o, limit)

    # end the record begun at n0 whose values end at o: kept (its length byte set, True)
    # unless it passes `limit` payload bytes (False, nothing added); no allocation
    def _end_rec(self, n0, o, limit):
        if o > limit:
            return False
        self.pay[n0 + 1] = o - n0 - 2
        self.n = o
        return True

    # the periodic frame: fast records, then slow rows round robin while they fit; the
    # wire bytes sent, or E_FULL (skipped: the link credit is short)
    def build_periodic(self):
        limit = self.frame_max - WIRE_OVER  # payload bytes (frames under 254 B)
        if self.frame_max >= 254:
            limit = self.frame_max - WIRE_OVER - self.frame_max // 254
        self._begin(T_PERIODIC)
        first = self._first_seq()
        if self.starved:
            added = self._slow_rows(first, limit)  # slow rows first this time: they always progress
            self._fast(first, limit)
        else:
            self._fast(first, limit)
            added = self._slow_rows(first, limit)
        self.starved = added == 0 and self.rot_n > 0
        wl = self._send()
        if wl > 0:
            if self.periodic_sent < INT_MAX:
                self.periodic_sent += 1
            v = self.periodic_bytes + wl
            if v >= CARRY_N:
                if self.periodic_bytes_g < INT_MAX:
                    self.periodic_bytes_g += 1
                    v -= CARRY_N
                else:
                    v = CARRY_N - 1
            self.periodic_bytes = v
            if wl > self.periodic_max:
                self.periodic_max = wl
        return wl

    # the records of every frame: core, pool, heap, the first sequence, tiers, DMA
    def _fast(self, first, limit):
        self._rec(R_CORE, limit, self.tokens, self.tok_s_x10, self.requests, self.skipped, self.events_dropped,
                  self.text_dropped)
        p = self.pool
        if p is not None:
            self._rec(R_POOL, limit, p.blocks_used, p.high_water, p.failed)
        if self.heap:
            dm = self.ms - self.heap_at
            if dm < 0:
                dm += MS_WRAP  # the board time wrapped
            if dm >= self.heap_ms:
                self.heap_at = self.ms
                self.heap_free = mem_free()
                self.heap_new = True
            if self.heap_new:
                fr = self.heap_free
                al = self.heap_total - fr
                if self._rec(R_HEAP, limit, fr if fr > 0 else 0, al if al > 0 else 0):
                    self.heap_new = False
        if first >= 0:
            self._seq_rec(first, limit)
        bw = self.bw
        if bw is not None:
            snap = self.bw_snap
            bw.snapshot(snap)
            nc = self.bw_ncat
            for tier in range(self.bw_rows // nc):
                o = (tier * nc + nc - 1) * _NSNAP  # the tier's all-categories row
                if snap[o + _P_BYTES] or snap[o + _P_BYTES_G] or snap[o + _P_WAITS]:  # it moved something
                    self._rec(R_TIER, limit, tier, snap[o + _P_UTIL],
                              snap[o + _P_BYTES_G] % 1000 * 1000000 + snap[o + _P_BYTES] // 1000, snap[o + _P_WAITS])
        q = self.dma
        if q is not None:
            st = self.dma_st
            q.snapshot(st)
            self._rec(R_DMA, limit, st[_ST_DEPTH], st[_ST_MAX_DEPTH], q.burst_n, st[_ST_STALLS], st[_ST_FULL])

    # slow rows round robin from self.rot while they fit; the number added
    def _slow_rows(self, first, limit):
        rn = self.rot_n
        r = self.rot
        added = 0
        for _ in range(rn):
            ok = self._slow(r, first, limit)
            if ok == 0:
                break  # did not fit: first in line next frame
            if ok == 2:
                added += 1
            r += 1
            if r >= rn:
                r = 0
        self.rot = r
        return added

    # the first watched sequence's slot, or -1
    def _first_seq(self):
        for i in range(len(self.seqs)):
            if self.seqs[i] != _NO_SEQ:
                return i
        return -1

    # sequence slot i's record; True when added (or nothing to add)
    def _seq_rec(self, i, limit):
        c = self.cache
        h = self.seqs[i]
        if c is None or h == _NO_SEQ:
            return True
        n = c.length(h)
        if n < 0:
            return True
        return self._rec(R_SEQ, limit, i, n, c.cached(h), self.seq_cap[i], c.blocks_of(h), c.evictions(h))

    # slow row r: 2 added, 1 nothing to add, 0 did not fit
    def _slow(self, r, first, limit):
        if r == 0:
            k = self.kernel
            if k is None:
                return 1
            tot = self.tot
            k.snapshot_totals(tot)
            return 2 if self._rec(R_KERNEL, limit, tot[_T_BUSY_S] % 1000000 * 1000 + tot[_T_BUSY_US] // 1000,
                                  tot[_T_IDLE_S] % 1000000 * 1000 + tot[_T_IDLE_US] // 1000, tot[_T_TASKS], tot[_T_MISSES],
                                  tot[_T_FAULTS], tot[_T_OVERRUNS], tot[_T_BITES], tot[_T_SWITCHES]) else 0
        if r == 1:
            g = self.thermal
            if g is None:
                return 1
            if self.guard:
                return 2 if self._rec(R_TEMP, limit, zigzag(g.temp_mc // 100), g.state, zigzag(g.peak_mc // 100)) else 0
            return 2 if self._rec(R_TEMP, limit, zigzag(g.read_mc() // 100), 0, 0) else 0
        if r < self.rot_task:
            i = r - self.rot_seq
            if i == first or self.seqs[i] == _NO_SEQ:
                return 1
            return 2 if self._seq_rec(i, limit) else 0
        if r < self.rot_bw:
            k = self.kernel
            i = r - self.rot_task
            t = k.tasks[i]
            if t is None:
                return 1
            row = self.row
            k.snapshot(t, row)
            return 2 if self._rec(R_TASK, limit, i, row[_S_STATE], row[_S_PRIO],
                                  row[_S_RUN_S] % 1000000 * 1000 + row[_S_RUN_US] // 1000, row[_S_RUNS], row[_S_MAX_SLICE],
                                  row[_S_MAX_LAT], row[_S_MISSES], row[_S_OVERRUNS], row[_S_FAULTS]) else 0
        i = r - self.rot_bw
        nc = self.bw_ncat
        c = i % nc
        if c == nc - 1:
            return 1  # the tier's total: in every frame already
        o = i * _NSNAP
        snap = self.bw_snap  # as the fast part of this frame (or the poll) left it
        if not (snap[o + _P_BYTES] or snap[o + _P_BYTES_G] or snap[o + _P_WAITS] or snap[o + _P_REFUSED]):
            return 1  # nothing moved in this category, nothing throttled or refused
        return 2 if self._rec(R_BWCAT, limit, i // nc, c, snap[o + _P_UTIL],
                              snap[o + _P_BYTES_G] % 1000 * 1000000 + snap[o + _P_BYTES] // 1000, snap[o + _P_WAITS],
                              snap[o + _P_REFUSED]) else 0

    # event frames for the events queued, as many per frame as fit; events the credit
    # does not cover wait for the next tick
    def send_events(self):
        while self.ev_n:
            self._begin(T_EVENT)
            limit = 200
            added = 0
            while self.ev_n:
                i = self.ev_head * _EV_WORDS
                ev = self.ev
                if not self._rec(ev[i], limit, ev[i + 1], zigzag(ev[i + 2]), zigzag(ev[i + 3]), zigzag(ev[i + 4])):
                    break
                added += 1
                self.ev_head = (self.ev_head + 1) % self.ev_cap
                self.ev_n -= 1
            if self._send() < 0:
                # not sent: put them back (the ring still holds them, ahead of the head)
                self.ev_head = (self.ev_head - added) % self.ev_cap
                self.ev_n += added
                return E_FULL
        return OK

    # text frames for the text queued (up to 200 bytes each) while the credit covers them
    def send_text(self):
        t = self.txt
        cap = len(t)
        while self.txt_n:
            self._begin(T_TEXT)
            o = put_varint(self.pay, HDR, self.request)
            k = self.txt_n if self.txt_n < 200 else 200
            j = self.txt_head
            p = self.pay
            for _ in range(k):
                p[o] = t[j]
                o += 1
                j += 1
                if j == cap:
                    j = 0
            self.n = o
            if self._send() < 0:
                return E_FULL
            self.txt_head = j
            self.txt_n -= k
        return OK

    # the layout: its text built afresh (allocates), then sent as layout frames of whole
    # lines, each opened by a "part=I/N" line (_send_layout_parts); the wire bytes of the
    # frames sent now, or E_FULL when the link credit covered none (the rest goes at the
    # next ticks, before anything else)
    def send_layout(self):
        self.layout = self.layout_body()
        n = 0
        o = 0
        while o < len(self.layout):
            o = self._layout_end(o) + 1
            n += 1
        self.lay_parts = n if n > 0 else 1
        self.lay_part = 0
        self.lay_off = 0
        return self._send_layout_parts()

    # the layout parts not sent yet, while the link credit covers them; no allocation (a
    # layout left unfinished by a short credit goes on at the next tick, heap-locked or not)
    def _send_layout_parts(self):
        body = self.layout
        total = 0
        while self.lay_part < self.lay_parts:
            o = self.lay_off
            end = self._layout_end(o)
            self._begin(T_LAYOUT)
            p = self.pay
            i = HDR
            for j in range(5):
                p[i + j] = _PART[j]
            i = _put_dec(p, i + 5, self.lay_part + 1)
            p[i] = 47  # "/"
            i = _put_dec(p, i + 1, self.lay_parts)
            if end > o:
                p[i] = 10  # "\n"
                i += 1
            for j in range(o, end):
                p[i] = body[j]
                i += 1
            self.n = i
            wl = self._send()
            if wl < 0:
                return E_FULL if total == 0 else total
            total += wl
            self.lay_part += 1
            self.lay_off = end + 1
            if self.layouts < INT_MAX:
                self.layouts += 1
        return total

    # where the layout part starting at body offset o ends (exclusive; at a line's end):
    # as many whole lines as one frame carries (layout_body makes every line fit one)
    def _layout_end(self, o):
        body = self.layout
        end = o + LAYOUT_ROOM
        if end >= len(body):
            return len(body)
        while end > o and body[end] != 10:
            end -= 1
        return end if end > o else o + LAYOUT_ROOM  # (a line longer than a frame: never made)

    # the layout frame's body: "key=value" lines (names, constants, the records' fields)
    def layout_body(self):
        lines = ["proto=%d" % PROTO, "firmware=kvrtos %s" % VERSION, "rate_hz=%d" % self.rate_hz,
                 "link_bps=%d" % self.link_bps, "frame_max=%d" % self.frame_max]
        p = self.pool
        if p is not None:
            lines.append("pool.blocks=%d" % p.n_blocks)
            lines.append("pool.block_bytes=%d" % p.block_bytes)
        c = self.cache
        if c is not None:
            lay = c.layout
            lines.append("kv.dtype=%s" % lay.dtype)
            lines.append("kv.kv_bytes_per_token=%d" % lay.kv_bytes_per_token)
            lines.append("kv.token_bytes=%d" % lay.token_bytes)
            lines.append("kv.tokens_per_block=%d" % lay.tokens_per_block)
            lines.append("kv.max_slots=%d" % c.max_slots)
        for key in sorted(self.meta):
            lines.append("%s=%s" % (key, self.meta[key]))
        k = self.kernel
        if k is not None:
            for i in range(len(k.tasks)):
                t = k.tasks[i]
                self.seen_tasks[i] = t
                if t is not None:
                    lines.append("task.%d=%s" % (i, t.name))
        bw = self.bw
        if bw is not None:
            for i in range(bw.n_tiers):
                lines.append("tier.%d=%s" % (i, bw.names[i]))
                lines.append("tier.%d.bytes_per_s=%d" % (i, bw.bw[i]))
            for i in range(bw.n_cat):
                lines.append("cat.%d=%s" % (i, bw.cat_names[i]))
            lines.append("bw.window_us=%d" % bw.window_us)
        q = self.dma
        if q is not None:
            lines.append("dma.slots=%d" % q.slots)
        for rid in sorted(RECORDS):
            name, fields = RECORDS[rid]
            lines.append("rec.%d=%s:%s" % (rid, name, ",".join(fields)))
        for code in sorted(EVENTS):
            name, args = EVENTS[code]
            lines.append("ev.%d=%s:%s" % (code, name, ",".join(args)))
        out = []
        omitted = 0
        for ln in lines:
            b = ln.encode()
            if len(b) > LAYOUT_ROOM or b"\n" in b:  # a value longer than a frame, or holding a newline
                omitted += 1
            else:
                out.append(b)
        if omitted:
            out.append(("omitted=%d" % omitted).encode())
        return b"\n".join(out)

    # figures about this link (allocates: reports)
    def stats(self):
        return {"sent": self.sent, "sent_bytes": self.sent_bytes_g * CARRY_N + self.sent_bytes,
                "periodic": self.periodic_sent, "periodic_bytes": self.periodic_bytes_g * CARRY_N + self.periodic_bytes,
                "periodic_max": self.periodic_max, "skipped": self.skipped, "tokens": self.tokens_g * CARRY_N + self.tokens,
                "requests": self.requests_g * CARRY_N + self.requests,
                "events_dropped": self.events_dropped, "text_dropped": self.text_dropped, "layouts": self.layouts,
                "frame_max": self.frame_max, "write_errors": self.write_errors, "short_writes": self.short_writes}


# a write(buf, n) for a stream, returning the bytes written: on MicroPython the stream's
# own write (it takes the length; a UART's returns None on a timeout: 0 here), made once
# (no allocation per call); on CPython a wrapper that writes the first n bytes and
# flushes (allocates: host side)
def stream_writer(stream):
    if IS_MICROPYTHON:
        sw = stream.write

        def write(buf, n):
            r = sw(buf, n)
            return 0 if r is None else r

        return write

    def write(buf, n):
        r = stream.write(bytes(buf[:n]))
        fl = getattr(stream, "flush", None)
        if fl is not None:
            fl()
        return 0 if r is None else r

    return write
