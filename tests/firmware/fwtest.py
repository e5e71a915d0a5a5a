# Minimal check helpers for firmware test scripts. A script imports these, runs its
# checks and calls done(); it runs unchanged under MicroPython and CPython, and
# tests/test_firmware.py runs it under both. A failed check prints "FAIL <what>" and the
# script goes on (every failed check is reported, not only the first; a check whose
# failure leaves nothing sound to go on with raises in the code after it, which ends the
# script with a traceback). done() prints the closing "PASS n checks", or "FAILED k of n
# checks" and exits 1. A check that cannot run here prints "SKIP <why>" (reported as a
# skipped subtest).
import sys

from firmware_py import compat

_n = 0  # checks passed so far
_failed = 0  # checks failed so far


def _fail(msg):
    global _failed
    _failed += 1
    print("FAIL " + msg)
    return False


def check(cond, what):
    # one named check; False (and a FAIL line) when cond is false
    global _n
    if not cond:
        return _fail("check failed: " + what)
    _n += 1
    return True


def eq(got, want, what):
    # got == want, with both shown when not
    global _n
    if got != want:
        return _fail("check failed: %s: got %r, want %r" % (what, got, want))
    _n += 1
    return True


def raises(exc_type, fn, *args):
    # fn(*args) raises exc_type; returns the exception (None, and a FAIL line, when it did not)
    global _n
    try:
        fn(*args)
    except exc_type as e:
        _n += 1
        return e
    _fail("check failed: %r did not raise %s" % (fn, exc_type.__name__))
    return None


def no_alloc(what, fn):
    # fn() runs with the heap locked on MicroPython: any allocation raises
    # MemoryError and fails the check. On CPython it only runs fn and says so.
    # (fn takes no arguments: a *args call would itself allocate.)
    global _n
    if not compat.HEAP_LOCK:
        fn()
        print("SKIP heap_lock on CPython:", what)
        return
    compat.heap_lock()
    try:
        fn()
    except MemoryError:
        compat.heap_unlock()
        _fail("check failed: %s allocated with the heap locked" % what)
        return
    finally:
        compat.heap_unlock()
    _n += 1
    print("no-alloc ok:", what)


def done():
    # the closing line that tests/test_firmware.py looks for; exit 1 after any failed check
    if _failed:
        print("FAILED %d of %d checks" % (_failed, _failed + _n))
        sys.exit(1)
    print("PASS %d checks" % _n)


# a seeded xorshift32 for test inputs: rng(n) is an int in 0..n-1, the same sequence on
# every interpreter for the same seed
def xorshift(seed):
    state = [seed]

    def rng(n):
        x = state[0]
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        state[0] = x
        return x % n

    return rng


# a tier's cost block (JSON text, %d for read, write, copy, DMA B/s, line bytes, line ns,
# line stream B/s), every source a placeholder
COST_JSON = ('{"read_bytes_per_s":{"value":%d,"source":"m"},"write_bytes_per_s":{"value":%d,"source":"m"},'
             '"copy_bytes_per_s":{"value":%d,"source":"m"},"dma_bytes_per_s":{"value":%d,"source":"m"},'
             '"line_bytes":{"value":%d,"source":"m"},"line_ns":{"value":%d,"source":"fit"},'
             '"line_stream_bytes_per_s":{"value":%d,"source":"fit"}}')


# a two-tier board profile (JSON text: SRAM and octal PSRAM with the measured ESP32-S3
# figures of docs/tiers.md) for the tracker's and telemetry's tests
def two_tier_profile():
    tier = ('{"name":"%s","kind":"%s","bytes":%d,"bandwidth_bytes_per_s":%d,"latency_ns":%d,"dma":true,'
            '"source":"s","cost":%s}')
    sram = tier % ("sram", "sram", 524288, 362000000, 4,
                   COST_JSON % (362000000, 362000000, 362000000, 362000000, 4, 4, 362000000))
    psram = tier % ("psram", "psram", 8388608, 38600000, 330,
                    COST_JSON % (38600000, 56700000, 22300000, 51000000, 32, 330, 147000000))
    return ('{"name":"t","title":"t","kind":"mcu","cpu":{"arch":"a","cores":2,"mhz":240},'
            '"micropython_heap_bytes":300000,"mpy_arch":"xtensawin","firmware_reserved_bytes":0,'
            '"memory":[%s,%s],"thermal":{"throttle_c":85},"source":"s"}' % (sram, psram))
