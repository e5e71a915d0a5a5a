# Board profiles load and validate on the firmware interpreter; compat's ticks obey
# MicroPython's wrap-around rules on both interpreters.
import gc
import json

from fwtest import check, eq, raises, no_alloc, done
from firmware_py import board, compat
from firmware_py.compat import micropython, ptr8

b = board.loads('{"name":"x","title":"t","kind":"mcu","cpu":{"arch":"a","cores":2,"mhz":240},'
                '"micropython_heap_bytes":300000,"mpy_arch":"xtensawin","firmware_reserved_bytes":0,'
                '"memory":[{"name":"sram","kind":"sram","bytes":524288,"bandwidth_bytes_per_s":1,'
                '"latency_ns":1,"dma":true,"source":"s"}],"thermal":{"throttle_c":85},'
                '"usb":{"vid":"0x303A","pid":"0x1001"},"source":"s"}')
eq(b.usb_vid, 0x303A, "usb vid parsed from hex")
eq(b.tier("sram").bytes, 524288, "tier lookup by name")
eq(b.total_bytes("psram"), 0, "no psram tier counts zero")
e = raises(board.BoardError, board.loads, '{"name":"x"}', "bad.json")
check("bad.json" in str(e) and "title" in str(e), "error names file and field: " + str(e))
e = raises(board.BoardError, board.loads, "{not json", "bad.json")
check("<json>" in str(e), "malformed JSON is a BoardError")
GOOD = ('{"name":"%s","title":"t","kind":"mcu","cpu":{"arch":"a","cores":2,"mhz":240},'
        '"micropython_heap_bytes":300000,"mpy_arch":"%s","firmware_reserved_bytes":0,'
        '"memory":[{"name":"sram","kind":"sram","bytes":524288,"bandwidth_bytes_per_s":1,'
        '"latency_ns":1,"dma":true,"source":"s"}],"thermal":{"throttle_c":85},"source":"s"}')
eq(board.loads(GOOD % ("esp32s3_n8r8-v1.2", "xtensawin")).name, "esp32s3_n8r8-v1.2", "a name of letters, digits, _ . -")
for bad in ("../x", "a/b", "a\\nb", ".x", "x" * 65):
    e = raises(board.BoardError, board.loads, GOOD % (bad, "xtensawin"), "n.json")
    check("n.json: name: " in str(e), "name %r refused: %s" % (bad, e))
e = raises(board.BoardError, board.loads, GOOD % ("x", "pdp11"), "a.json")
check("mpy_arch: expected one of" in str(e), "mpy_arch not an mpy-cross -march value: " + str(e))
e = raises(board.BoardError, board.loads, '{"a":' + "[" * 20000 + "]" * 20000 + "}", "deep.json")
# CPython's parser recurses (RecursionError: "nested too deeply"), MicroPython's does not
# (the object then lacks "name"): a BoardError on both, never a crash
check("deep.json: <json>: nested too deeply" in str(e) or "deep.json: name: missing" in str(e), "deep nesting is a BoardError: " + str(e))

# lean profiles: a board keeps each source's kind only (one shared string per kind) and no
# raw dict; the host keeps the whole text. Both validate alike and keep every figure
full = board.Board(json.loads(open("boards/esp32s3_n8r8.json").read()), "f.json", lean=False)
lean = board.loads(json.dumps(full.raw), "l.json", lean=True)
check(lean.raw is None and full.raw is not None, "lean: no raw dict; full: the dict as loaded")
eq(lean.cpu_cost, full.cpu_cost, "lean keeps every cost figure")
for kind in full.cpu_cost_source:
    for p in full.cpu_cost_source[kind]:
        f, ln = full.cpu_cost_source[kind][p], lean.cpu_cost_source[kind][p]
        check(f.startswith(ln) and ln[-1] == ":", "lean source is the kind of %s.%s: %r" % (kind, p, ln))
for t, u in zip(full.tiers, lean.tiers):  # noqa: B905 - MicroPython's zip has no strict
    if t.cost is not None:
        for n in t.cost.source:
            eq(u.cost.estimated(n), t.cost.estimated(n), "estimate flag kept for %s.%s" % (t.name, n))
eq(board.LEAN, compat.IS_MICROPYTHON, "lean by default on MicroPython only")
# the thermal guard takes thermal.shrink_c from the Board (a lean board has no raw dict)
from firmware_py import thermal  # noqa: E402
from firmware_py.clock import VirtualClock  # noqa: E402
from firmware_py.sched import Kernel  # noqa: E402

raw = json.loads(open("boards/esp32s3_n8r8.json").read())
raw["thermal"]["shrink_c"] = 55
for ln in (True, False):
    g = thermal.for_board(Kernel(VirtualClock(), verbose=False), board.Board(raw, "t.json", lean=ln),
                          source=thermal.ModelTemp(VirtualClock()))
    eq(g.shrink_mc, 55000, "shrink_c from the profile (lean %s)" % ln)
raw["thermal"]["shrink_c"] = "hot"
e = raises(board.BoardError, board.Board, raw, "t.json")
check("thermal.shrink_c" in str(e), "a shrink_c that is not an integer is refused at load: %s" % e)
if compat.IS_MICROPYTHON:
    gc.collect()
    f0 = gc.mem_free()
    kept = board.load("boards/esp32s3_n8r8.json")
    gc.collect()
    used = f0 - gc.mem_free()
    print("a loaded esp32s3_n8r8 profile keeps %d B of heap" % used)
    check(used < 12000, "the board keeps its profile in under 12 KB (it kept 44 KB on the 32-bit port): %d" % used)
    kept = None

# the clock: (Hz, how) with machine.freq where the port has it; never raises
hz, how = compat.cpu_clock()
check(how in ("kept", "n/a"), "reading the clock changes nothing: " + how)
check((hz is None) == (how == "n/a"), "no Hz exactly when the port cannot say")
hz2, how2 = compat.cpu_clock(240)
check(how2 in ("set", "kept", "refused", "n/a"), "setting the profile's clock: " + how2)

# ticks arithmetic wraps at compat.TICKS_PERIOD (2**30 on the ESP32)
P = compat.TICKS_PERIOD
print('ticks period 2**%d' % (len(bin(P)) - 3))
eq(compat.ticks_diff(compat.ticks_add(P - 5, 10), P - 5), 10, "ticks_add wraps forward")
eq(compat.ticks_diff(3, P - 2), 5, "ticks_diff across the wrap is small and positive")
eq(compat.ticks_diff(P - 2, 3), -5, "ticks_diff backwards across the wrap is negative")
t0 = compat.ticks_us()
check(0 <= t0 < P, "ticks_us within the tick period")


def tick_math():
    compat.ticks_diff(compat.ticks_add(t0, 1000), t0)
    compat.ticks_us()


no_alloc("ticks_us/ticks_add/ticks_diff", tick_math)


@micropython.viper
def sum_bytes(buf, n: int) -> int:
    p = ptr8(buf)
    s = 0
    for i in range(n):
        s += p[i]
    return s


eq(sum_bytes(bytearray(b"\x01\x02\x03"), 3), 6, "viper function with ptr8 runs on both")
done()
