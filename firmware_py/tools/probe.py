# Board-side calibration probes for `./kv calibrate` (host/calibrate.py). Runs on the
# board (real or virtual: sent as a script over the raw REPL, the flashed firmware
# imported from firmware_py/) and under CPython and the unix port for the tests:
#   micropython -X heapsize=N firmware_py/tools/probe.py [quick]
# It measures, with the board's own clock (ticks_us / ticks_diff), medians of REPS
# samples:
#   heap    gc.mem_free() + gc.mem_alloc() after a collect (the usable GC heap, what a
#           profile's micropython_heap_bytes gives), mem_free, and the largest single
#           bytearray that can be allocated (bisection; freed again)
#   copy    bytes moved per sample between two buffers, by a viper ptr32 loop (the
#           firmware's pool.copy32) and by memoryview slice assignment (the port's
#           memmove), for small buffers, halves of a large one and both directions
#           between them; each buffer's address is reported so the host can say which
#           memory tier it landed in (MicroPython cannot choose: on an ESP32-S3 the GC
#           heap spans internal SRAM and PSRAM, and the address tells which); a case
#           reading or writing the large buffer walks all of it (WALK_MIN and more where
#           the heap allows), so its rate is the memory's, not the data cache's
#   switch  the kernel's task switch: two tasks of firmware_py.sched yielding to each
#           other, µs per sample of SWITCHES switches
#   matvec  the kernels the decode really runs: kernels_q.matvec_v (@viper, int8
#           weights, int32 activations: the int8 path) and kernels.Plain.matvec (plain
#           bytecode over array('f'): the fp32 path) at the SHAPES below (stories260K's
#           dim 64 and hidden 172 among them), µs per call
# Progress lines ("probe: ...") keep the port busy so the host can tell a live board
# from a hung one; the last line is one JSON object (integers and strings only).
import gc
import json
import sys

# the firmware's modules are imported by main() after the heap probe: their code takes
# (and fragments) heap, which a fresh board's largest block must not count
compat = kernels = kernels_q = pool = sched = RealClock = ticks_diff = ticks_us = None


def _imports():
    # bind the firmware's modules to this module's names
    global compat, kernels, kernels_q, pool, sched, RealClock, ticks_diff, ticks_us
    from firmware_py import compat, kernels, kernels_q, pool, sched  # noqa: PLC0415
    from firmware_py.clock import RealClock  # noqa: PLC0415
    from firmware_py.compat import ticks_diff, ticks_us  # noqa: PLC0415

VERSION = 2  # the format of the JSON line; host/calibrate.py checks it
REPS = 5  # samples per figure; the median is reported
SMALL = 4096  # bytes of each small buffer
LARGE_MAX = 65536  # bytes of each half of the large buffer, at most
WALK_MIN = 2 * 65536  # bytes a PSRAM case walks at least: twice the largest data cache of the supported chips (ESP32-S3: 64 KiB)
SWITCHES = 2000  # switches per kernel sample
MIN_US = 4000  # µs a sample lasts at least (iterations doubled until it does)
MAX_ITERS = 1 << 16  # iterations per sample at most
# (rows, cols, group): calls, rows, groups and MACs varied apart, so that host/calibrate.py's
# least-squares fit (ns = call + rows x row + groups x group + MACs x MAC) can tell them
# apart: 1 and 4 groups per row at the same shape, 16 to 172 rows; q8row's group for 172
# columns is 43 (stories260K's hidden), for 64 it is 64
SHAPES = ((64, 64, 64), (172, 64, 64), (64, 172, 172), (64, 172, 43), (64, 128, 32), (16, 64, 64), (32, 64, 16))


def _median(xs):
    # middle value (upper middle for an even count); sorts a copy
    s = sorted(xs)
    return s[len(s) // 2]


def _say(what):
    # a progress line, flushed on ports that buffer
    print("probe: " + what)


def _addr(buf):
    # address of buf's first byte, or 0 where it cannot be known
    try:
        return compat.buffer_address(buf)
    except Exception:  # noqa: BLE001 - a port without uctypes: unknown address
        return 0


def heap():
    # {"total", "free", "alloc", "largest"}: bytes; "largest" by compat.heap_probe (the
    # same probe decode's boot sizes the KV pool with)
    if not hasattr(gc, "mem_free"):  # CPython: no fixed heap
        return {"total": 0, "free": 0, "alloc": 0, "largest": 0}
    from firmware_py.compat import heap_probe  # noqa: PLC0415 - compat alone: a few KB, before the rest

    free, largest = heap_probe()
    alloc = gc.mem_alloc()
    return {"total": free + alloc, "free": free, "alloc": alloc, "largest": largest}


def _time_copy32(pairs, words, iters):
    # µs for iters copies of words 32-bit words by the firmware's viper loop, the k-th
    # copy from/to the (k mod len(pairs))-th (dst, dst word, src, src word) of pairs
    cp = pool.copy32
    n = len(pairs)
    k = 0
    t0 = ticks_us()
    for _ in range(iters):
        dst, dw, src, sw = pairs[k]
        cp(dst, dw, src, sw, words)
        k += 1
        if k == n:
            k = 0
    return ticks_diff(ticks_us(), t0)


def _time_slice(views, iters):
    # µs for iters memoryview slice assignments dv[:] = sv (memmove in C), the k-th from
    # the (k mod len(views))-th (dv, sv) of views
    n = len(views)
    k = 0
    t0 = ticks_us()
    for _ in range(iters):
        dv, sv = views[k]
        dv[:] = sv
        k += 1
        if k == n:
            k = 0
    return ticks_diff(ticks_us(), t0)


def _samples(quick, run, *args):
    # REPS samples of run(*args, iters) -> µs, iters doubled first until one sample
    # lasts MIN_US (the tick is 1 µs; a board's slow copy needs few, the host's fast one
    # many); (median µs, iters)
    iters = 1
    goal = MIN_US // 4 if quick else MIN_US
    while iters < MAX_ITERS and run(*args, iters) < goal:
        iters *= 2
    us = [run(*args, iters) for _ in range(REPS)]
    return _median(us), iters


def copies(largest, quick=False):
    # copy speed per buffer pair; [{"case", "src", "dst", "bytes", "walk", "viper_iters",
    # "viper_us", "slice_iters", "slice_us"}] (µs for iters copies of bytes, medians), and
    # the buffers' addresses and the large one's size. A case that reads or writes the
    # large buffer walks through it, `walk` bytes of it (all of it for large to small and
    # small to large, a half each way within it), one chunk after the other, so a PSRAM
    # rate is not a cache-hit rate: the walk is at least WALK_MIN where the heap allows
    half = LARGE_MAX
    while half > SMALL and 2 * half > largest // 4:
        half //= 2
    a = bytearray(SMALL)
    b = bytearray(SMALL)
    big = bytearray(2 * half)
    mb = memoryview(big)
    ma = memoryview(a)
    mbb = memoryview(b)
    # (name, src view, src offsets, dst view, dst offsets, bytes, walk)
    cases = [("small_small", ma, (0,), mbb, (0,), n, 0) for n in (256, 1024, SMALL)]
    lo = tuple(range(0, half, SMALL))  # SMALL chunks of the first half
    hi = tuple(half + o for o in lo)  # and of the second
    whole = lo + hi  # of the whole large buffer
    cases += [("large_large", mb, lo, mb, hi, SMALL, 2 * half), ("large_large", mb, (0,), mb, (half,), half, 2 * half)]
    cases += [("large_small", mb, whole, ma, (0,) * len(whole), SMALL, 2 * half),
              ("small_large", ma, (0,) * len(whole), mb, whole, SMALL, 2 * half)]
    out = []
    for name, sv, so, dv, do, n, walk in cases:
        pairs = [(dv, do[i] // 4, sv, so[i] // 4) for i in range(len(so))]
        views = [(dv[do[i]:do[i] + n], sv[so[i]:so[i] + n]) for i in range(len(so))]
        v_us, v_it = _samples(quick, _time_copy32, pairs, n // 4)
        s_us, s_it = _samples(quick, _time_slice, views)
        out.append({"case": name, "src": _addr(views[0][1]), "dst": _addr(views[0][0]), "bytes": n, "walk": walk,
                    "viper_iters": v_it, "viper_us": v_us, "slice_iters": s_it, "slice_us": s_us})
        pairs = views = None
    return out, _addr(a), _addr(b), _addr(big), 2 * half


def _spin(k, n):
    # a task yielding n times, then stopping the kernel
    for _ in range(n):
        yield
    k.stop()


def switch(quick=False):
    # {"switches", "us"}: the median µs of a run of two tasks yielding to each other
    n = SWITCHES // 4 if quick else SWITCHES
    us = []
    sw = 0
    for _ in range(REPS):
        k = sched.Kernel(RealClock(), max_tasks=4, verbose=False)
        k.spawn("a", 1, _spin(k, n // 2))
        k.spawn("b", 1, _spin(k, n // 2))
        compat.collect()
        t0 = ticks_us()
        k.run()
        us.append(ticks_diff(ticks_us(), t0))
        sw = k.switches()
    return {"switches": sw, "us": _median(us)}


class _Fp32:
    # what kernels.Plain.matvec reads of its self: the fp32 arena
    def __init__(self, n):
        self.f32 = compat.new_array("f", n)
        for i in range(n):
            self.f32[i] = ((i * 37) % 17 - 8) * 0.125
        self.q8 = None


class _Mat:
    # a llama2c.Matrix-shaped fp32 matrix at offset 0
    def __init__(self, rows, cols):
        self.rows = rows
        self.cols = cols
        self.off = 0
        self.soff = -1
        self.group = 0


def _viper_matvec(rows, cols, group, quick):
    # (median µs, iters) of kernels_q.matvec_v on a rows x cols int8 matrix
    w = bytearray(rows * cols)
    for i in range(len(w)):
        w[i] = (i * 29 + 7) & 0xFF
    gp = compat.new_array("i", rows * cols // group)
    for i in range(len(gp)):
        gp[i] = 16384 | (4 << 16)  # m = 2**14, d = 4
    x = compat.new_array("i", cols)
    for i in range(cols):
        x[i] = (i * 53) % 2001 - 1000
    y = compat.new_array("i", rows)
    return _samples(quick, _time_matvec, y, w, rows, cols, group, gp, x)


def _time_matvec(y, w, rows, cols, group, gp, x, iters):
    # µs for iters calls of kernels_q.matvec: matvec_v (@viper) on MicroPython, its integer twin on CPython
    mv = kernels_q.matvec
    t0 = ticks_us()
    for _ in range(iters):
        mv(y, w, 0, rows, cols, group, gp, 0, x)
    return ticks_diff(ticks_us(), t0)


def _bytecode_matvec(rows, cols, quick):
    # (median µs, iters) of kernels.Plain.matvec (fp32, plain bytecode) on rows x cols
    fs = _Fp32(rows * cols)
    m = _Mat(rows, cols)
    xf = compat.new_array("f", cols)
    for i in range(cols):
        xf[i] = (i % 7) * 0.25
    yf = compat.new_array("f", rows)
    return _samples(quick, _time_plain, fs, yf, m, xf)


def _time_plain(fs, yf, m, xf, iters):
    # µs for iters calls of kernels.Plain.matvec after a collect (its floats are garbage)
    compat.collect()
    t0 = ticks_us()
    for _ in range(iters):
        kernels.Plain.matvec(fs, yf, m, xf)
    return ticks_diff(ticks_us(), t0)


def matvecs(quick=False):
    # [{"rows", "cols", "group", "viper_iters", "viper_us", "bytecode_iters", "bytecode_us"}]:
    # medians, µs for so many calls; -1 (and 0 calls) where the heap had no room for the
    # matrix. Plain.matvec has no groups: a shape it already timed (same rows and columns)
    # repeats that figure
    out = []
    plain = {}
    for rows, cols, group in SHAPES:
        compat.collect()
        try:
            v_us, v_it = _viper_matvec(rows, cols, group, quick)
        except MemoryError:
            v_us, v_it = -1, 0
        compat.collect()
        if (rows, cols) not in plain:
            try:
                plain[(rows, cols)] = _bytecode_matvec(rows, cols, quick)
            except MemoryError:
                plain[(rows, cols)] = (-1, 0)
        b_us, b_it = plain[(rows, cols)]
        compat.collect()
        out.append({"rows": rows, "cols": cols, "group": group, "viper_iters": v_it, "viper_us": v_us,
                    "bytecode_iters": b_it, "bytecode_us": b_us})
        _say("matvec %dx%d group %d: viper %d us per %d calls, bytecode fp32 %d us per %d"
             % (rows, cols, group, v_us, v_it, b_us, b_it))
    return out


def machine():
    # (platform, machine description, MicroPython version) of this interpreter
    impl = sys.implementation
    ver = ".".join(str(v) for v in impl.version[:3])
    return sys.platform, getattr(impl, "_machine", impl.name), "%s %s" % (impl.name, ver)


def cpu_hz():
    # the clock the probes run at (machine.freq()), or None where the port has none
    try:
        import machine as m  # noqa: PLC0415 - probing the port

        hz = m.freq()
    except (ImportError, AttributeError, OSError, ValueError, TypeError):
        return None
    hz = hz[0] if isinstance(hz, tuple) else hz
    return hz if isinstance(hz, int) and hz > 0 else None


def main(argv=()):
    # run every probe, print progress and the JSON line; returns the result dict
    quick = "quick" in argv
    plat, mach, ver = machine()
    _say("start on %s (%s)" % (mach, ver))
    h = heap()  # first: before the firmware's code and the probes' buffers fragment the heap
    _say("heap %d B usable, largest block %d B" % (h["total"], h["largest"]))
    _imports()
    cp, a_small, b_small, a_big, big_bytes = copies(h["largest"] or 4 * 4 * LARGE_MAX, quick)
    _say("copies: %d cases" % len(cp))
    sw = switch(quick)
    _say("switch: %d switches in %d us" % (sw["switches"], sw["us"]))
    mv = matvecs(quick)
    r = {"probe": VERSION, "platform": plat, "machine": mach, "version": ver, "cpu_hz": cpu_hz(),
         "reps": REPS, "heap": h, "buffers": {"small_a": a_small, "small_b": b_small, "large": a_big, "large_bytes": big_bytes},
         "copy": cp, "switch": sw, "matvec": mv}
    print(json.dumps(r))
    return r


if __name__ == "__main__":
    main(sys.argv[1:])
