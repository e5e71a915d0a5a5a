# The heap-locked half of the KV differential test: random programs over every hot-path
# call (reserve/write/append/read/locate/scores/fork/close/counters, misuse included:
# stale handles, out-of-range slot/layer/length/offset, write without a reservation)
# run on the real cache with the heap locked, each result checked against the reference
# model (kvref.py) outside the lock, and the guard bytes around the arena and around
# read() destinations checked after every call: no write escapes, nothing allocates.
from fwtest import check, done
from firmware_py import compat
import kvref

locked = [0]  # calls that ran with the heap locked


# run fn() with the heap locked (MicroPython): an allocation raises MemoryError
def run_locked(fn):
    if not compat.HEAP_LOCK:
        fn()
        return
    compat.heap_lock()
    try:
        fn()
    finally:
        compat.heap_unlock()
    locked[0] += 1


steps = 0
for seed in range(6):
    counts = kvref.drive(seed, 300, run_locked, verify_every=16)
    steps += sum(counts.values())
    check(len(counts) == 16, "seed %d exercised every call" % seed)
print("%d random steps, %d of them heap-locked calls" % (steps, locked[0]))
if compat.HEAP_LOCK:
    check(locked[0] > 1000, "over a thousand hot-path calls ran with the heap locked")
else:
    print("SKIP heap_lock on CPython: the calls ran unlocked")
done()
