# The sampler's xorshift32 state (firmware_py/sample.py): the same draws on every
# interpreter, and a state that never sits on the heap between tokens. On a 32-bit port an
# int of 2**30 or more is a heap object; a state held as one would make the free heap
# after a collection swing by two GC blocks from token to token (the soak's drift).
# A sampled pick from int logits allocates nothing (checked under heap_lock): a float or
# big int made while sampling could be kept alive by a stale word in a task's frame and
# move the free heap from token to token beside another task (the soak's seed-3 failure).
import gc
from array import array

from fwtest import check, eq, done
from firmware_py import compat
from firmware_py.sample import Sampler

s = Sampler(10, 0.5, 1.0, 7)
eq([s.rand() for _ in range(4)], [473145, 117597313, 970551376, 767497361], "seed 7's first draws")
s = Sampler(10, 0.5, 1.0, 2 ** 32 - 1)
eq([s.rand() for _ in range(3)], [63495, 1057095551, 489612816], "the largest seed's first draws")
check(all(0 <= s.rand() < 2 ** 30 for _ in range(1000)), "draws are small ints (below 2**30)")

if hasattr(gc, "mem_free"):  # MicroPython: the heap after each draw, collected
    s = Sampler(512, 0.8, 0.9, 7)
    free = compat.new_array("i", 64)
    for i in range(len(free)):
        s.rand()
        gc.collect()
        free[i] = gc.mem_free()
    lo = hi = free[2]
    for i in range(2, len(free)):
        v = free[i]
        lo = v if v < lo else lo
        hi = v if v > hi else hi
    eq(hi - lo, 0, "the free heap after a draw does not move with the state's value")


# sampled picks from fixed-point logits with the heap locked, all three branches
V = 512
q = array("i", [((i * 7919) % 1000 - 500) * 65536 // 100 for i in range(V)])  # qmodel's 16 fraction bits
q8 = array("i", [((i * 7919) % 1000 - 500) * 256 // 100 for i in range(V)])
picks = array("i", [0] * 60)
for temp, top_p, seed, lg, fb in ((0.8, 0.9, 7, q, 16), (1.0, 1.0, 3, q, 16), (0.8, 0.9, 9, q8, 8),
                                  (300.0, 0.95, 5, q, 16), (0.01, 0.9, 11, q, 16)):
    s = Sampler(V, temp, top_p, seed)
    ok = True
    if compat.HEAP_LOCK:
        compat.heap_lock()
    try:
        for i in range(len(picks)):
            picks[i] = s.pick(lg, fb)
    except MemoryError:
        ok = False
    finally:
        if compat.HEAP_LOCK:
            compat.heap_unlock()
    check(ok, "T=%s p=%s: a sampled pick from int logits allocates nothing" % (temp, top_p))
    check(all(0 <= t < V for t in picks), "T=%s p=%s: picks are tokens" % (temp, top_p))
    if temp >= 300.0:
        check(len(set(picks)) > 30, "a high temperature spreads the picks (%d distinct)" % len(set(picks)))
    if temp <= 0.01:
        check(len(set(picks)) == 1, "a low temperature picks the most likely token only")

# the decode's sliced pick: start, then parts of a few steps (greedy and sampled), with the
# heap locked, the same tokens as whole picks from a twin sampler
for temp, top_p, most in ((0.8, 0.9, 64), (1.0, 1.0, 5), (0.0, 1.0, 64), (300.0, 0.95, 3)):
    s = Sampler(V, temp, top_p, 13)
    twin = Sampler(V, temp, top_p, 13)
    ok = True
    parts = 0
    if compat.HEAP_LOCK:
        compat.heap_lock()
    try:
        for i in range(len(picks)):
            s.start(q)
            t = -1
            while t < 0:
                t = s.run(q, 16, most)
                parts += 1
            picks[i] = t
    except MemoryError:
        ok = False
    finally:
        if compat.HEAP_LOCK:
            compat.heap_unlock()
    check(ok, "T=%s p=%s: a pick in parts of %d steps allocates nothing" % (temp, top_p, most))
    eq(list(picks), [twin.pick(q, 16) for _ in range(len(picks))], "T=%s p=%s: parts pick the whole picks' tokens" % (temp, top_p))
    check(parts >= len(picks) * (V // most), "T=%s: the picks ran in parts (%d)" % (temp, parts))
if not compat.HEAP_LOCK:
    print("SKIP heap_lock on CPython: the picks ran unlocked")

done()
