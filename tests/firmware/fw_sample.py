# The sampler's xorshift32 state (firmware_py/sample.py): the same draws on every
# interpreter, and a state that never sits on the heap between tokens. On a 32-bit port an
# int of 2**30 or more is a heap object; a state held as one would make the free heap
# after a collection swing by two GC blocks from token to token (the soak's drift).
import gc

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

done()
