# One convention for results across the pool, the KV cache and the kernel
# (docs/conventions.md lists which call returns what):
#   - a hot-path call (anything the decode loop or a task switch may run) never raises
#     for a caller's mistake and never allocates: it returns an int, >= 0 for success
#     (a value, or a sum of flags) and one of the negative codes below for failure, with
#     nothing changed;
#   - a configuration call (constructors, open/add_region/spawn with bad parameters) raises
#     the module's error class (PoolError, KVError, SchedError: all ValueError), whose
#     str() is one line;
#   - a kernel blocking call resumes the task with its result, or TIMEOUT; the same call
#     with timeout_us=0 (its *_nowait twin) returns exactly what the blocking call would
#     resume with.
# Codes are small negative ints so a status fits any int array and compares in O(1).
from firmware_py.compat import const

OK = const(0)  # success, nothing to report
E_FULL = const(-1)  # a budget is reached (KV policy full, queue full): nothing changed
E_NO_BLOCK = const(-2)  # the pool or the region's quota has no free block: nothing changed
E_STALE = const(-3)  # the handle is not open, or names an earlier occupant of its slot
E_NO_SLOT = const(-4)  # every slot (sequence, task) is in use
E_RANGE = const(-5)  # an argument is outside its range (slot, layer, length, block, bits)
E_STATE = const(-6)  # not valid in the current state (write without a reservation, double free)
E_EMPTY = const(-7)  # the slot or position holds nothing now (never filled, or evicted)

NAMES = ("OK", "E_FULL", "E_NO_BLOCK", "E_STALE", "E_NO_SLOT", "E_RANGE", "E_STATE", "E_EMPTY")


# the name of status code st (a flag sum >= 0 reads as "OK"); allocates nothing
def name(st):
    if st >= 0:
        return "OK"
    if -st < len(NAMES):
        return NAMES[-st]
    return "E_?"
