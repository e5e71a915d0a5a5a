# Board profiles load and validate on the firmware interpreter; compat's ticks obey
# MicroPython's wrap-around rules on both interpreters.
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
