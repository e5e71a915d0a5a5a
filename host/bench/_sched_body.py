# Scheduler benchmark body: runs unchanged under MicroPython (the unix port, heap as on
# the board) and CPython; host/bench/sched.py launches it on each and merges the output.
#   usage: _sched_body.py SWITCHES REPS LATENCY_MS
# Prints one JSON object on its last line; times in ns / µs from compat.ticks_us.
import gc
import json
import sys

import asyncio
from firmware_py import compat, sched
from firmware_py.clock import RealClock
from firmware_py.compat import ticks_us, ticks_diff, ticks_add

MPY = compat.IS_MICROPYTHON


def median(xs):
    # middle value of a small list (upper middle for even lengths)
    s = sorted(xs)
    return s[len(s) // 2]


def kernel_switches(n, locked=False):
    # our kernel: two tasks yielding to each other n times each; (ns per switch, heap bytes
    # allocated during the whole run, switches). locked: the run happens under heap_lock
    k = sched.Kernel(RealClock(), max_tasks=4)

    def spin():
        for _ in range(n):
            yield
        k.stop()

    k.spawn("a", 1, spin())
    k.spawn("b", 1, spin())
    compat.collect()
    gc.disable()
    a0 = compat.mem_alloc()
    if locked:
        compat.heap_lock()
    t0 = ticks_us()
    try:
        k.run()
    finally:
        t1 = ticks_us()
        if locked:
            compat.heap_unlock()
    a1 = compat.mem_alloc()
    gc.enable()
    sw = k.switches()
    faults = k.totals[sched.T_FAULTS]
    return ticks_diff(t1, t0) * 1000 / sw, (a1 - a0) if MPY else -1, sw, faults


def floor_switches(n):
    # the floor: a bare round-robin of two generators (list pop(0)/append, send), nothing
    # else: what any generator-based scheduler costs at least; ns per switch
    def spin():
        for _ in range(n):
            yield

    ring = [spin(), spin()]
    compat.collect()
    t0 = ticks_us()
    sw = 0
    try:
        while True:
            g = ring.pop(0)
            g.send(None)
            ring.append(g)
            sw += 1
    except StopIteration:
        pass
    t1 = ticks_us()
    return ticks_diff(t1, t0) * 1000 / sw


def asyncio_switches(n):
    # the interpreter's asyncio: two tasks ping-ponging with sleep(0) n times each
    sleep0 = asyncio.sleep_ms if MPY else asyncio.sleep  # pyright: ignore

    async def pp():
        for _ in range(n):
            await sleep0(0)

    res = [0, 0]

    async def main():
        compat.collect()
        gc.disable()
        a0 = compat.mem_alloc()
        t0 = ticks_us()
        await asyncio.gather(pp(), pp())
        t1 = ticks_us()
        a1 = compat.mem_alloc()
        gc.enable()
        res[0] = ticks_diff(t1, t0) * 1000 / (2 * n)
        res[1] = (a1 - a0) / (2 * n) if MPY else -1

    asyncio.run(main())
    return res[0], res[1]


def low_slice_us(i):
    # the work of low-priority task i between yields: 200..500 µs, fixed per task
    return 200 + (i * 37) % 301


def kernel_latency(ms):
    # 1 ms periodic task at high priority beside 100 busy low-priority tasks, for ms periods
    clock = RealClock()
    k = sched.Kernel(clock, max_tasks=104, priorities=4)
    periods = [0]

    def periodic():
        t = k.now()
        for _ in range(ms):
            t = ticks_add(t, 1000)
            yield k.sleep_until(t)
            periods[0] += 1
        k.stop()

    def low(us):
        while True:
            clock.charge(us)  # spins: real work of that length
            yield

    hi = k.spawn("periodic", 3, periodic(), -1, 1000)  # deadline: one period
    lows = [k.spawn("low%d" % i, 1, low(low_slice_us(i))) for i in range(100)]
    k.run()
    slice_max = max(t.st[sched.S_MAX_SLICE] for t in lows)
    return hi.st[sched.S_MAX_LAT], hi.st[sched.S_MISSES], periods[0], slice_max, k.stats_lines()[0]


def asyncio_latency(ms):
    # the same load on asyncio (no priorities): worst lateness of the 1 ms periodic task
    res = [0, 0, 0]
    stop = [False]

    async def periodic():
        # the pattern asyncio users write: sleep 1 ms, measure how late it came back
        for _ in range(ms):
            t = ticks_us()
            if MPY:
                await asyncio.sleep_ms(1)  # pyright: ignore
            else:
                await asyncio.sleep(0.001)
            late = ticks_diff(ticks_us(), t) - 1000
            if late > res[0]:
                res[0] = late
            if late > 1000:
                res[1] += 1
            res[2] += 1
        stop[0] = True

    async def low(us):
        while not stop[0]:
            t0 = ticks_us()
            while ticks_diff(ticks_us(), t0) < us:
                pass
            await (asyncio.sleep_ms(0) if MPY else asyncio.sleep(0))  # pyright: ignore

    async def main():
        tasks = [asyncio.create_task(low(low_slice_us(i))) for i in range(100)]
        await periodic()
        for t in tasks:
            await t

    asyncio.run(main())
    return res


def main():
    n, reps, lat_ms = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ours, theirs, floors, allocs, aallocs, sws = [], [], [], [], [], []
    for _ in range(reps):  # interleaved, so drift on a shared machine hits all alike
        ns, al, sw, _ = kernel_switches(n)
        ours.append(ns)
        allocs.append(al)
        sws.append(sw)
        ns, al = asyncio_switches(n)
        theirs.append(ns)
        aallocs.append(al)
        floors.append(floor_switches(n))
    # proof on MicroPython: the same run with the heap locked completes without a fault
    locked_ok = None
    if MPY:
        try:
            locked_ok = kernel_switches(n, True)[3] == 0
        except MemoryError:
            locked_ok = False
    lat, misses, periods, slice_max, line = kernel_latency(lat_ms)
    alat = asyncio_latency(max(lat_ms // 50, 10))  # each asyncio sleep takes ~a round of 100 tasks
    out = {
        "switch_ns": round(median(ours)),
        "switch_ns_asyncio": round(median(theirs)),
        "switch_ratio_vs_asyncio": round(median(ours) / median(theirs), 3),
        "switch_ns_floor": round(median(floors)),
        "switch_ratio_vs_floor": round(median(ours) / median(floors), 3),
        # heap bytes allocated per switch: a run's total (setup included) over its
        # switches, in bytes (a fraction, not integer-divided)
        "alloc_bytes_per_switch": round(max(allocs) / min(sws), 4) if MPY else None,
        "alloc_bytes_per_kernel_run": max(allocs) if MPY else None,
        "heap_locked_switches_ok": locked_ok,
        "alloc_bytes_per_switch_asyncio": round(median(aallocs), 1) if MPY else None,
        "latency_worst_us": lat,
        "latency_deadline_misses": misses,
        "latency_periods": periods,
        "latency_low_slice_max_us": slice_max,
        "latency_asyncio_worst_us": alat[0],
        "latency_asyncio_late_sleeps": alat[1],
        "latency_asyncio_sleeps": alat[2],
        "latency_stats_line": line,
        "interpreter": "%s %s" % (sys.implementation.name, ".".join(str(v) for v in sys.implementation.version[:3])),
        "interpreter_version": ".".join(str(v) for v in sys.implementation.version[:3]),
        "python_language_version": sys.version.split(";")[0].split()[0],
    }
    print(json.dumps(out))


main()
