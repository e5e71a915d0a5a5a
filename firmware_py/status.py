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
E_ALIGN = const(-8)  # a buffer a viper kernel reads or writes as 32-bit (16-bit) words does not start on a
#                      4-byte (2-byte) boundary (a memoryview window at such an offset): the chip would fault


# Integer limits shared by every module: values a hot path stores or returns stay small
# ints on the ESP32 (31-bit), so reading or bumping them never allocates.
INT_MAX = const(0x3FFFFFFF)  # largest small int on the ESP32 (2**30 - 1)
CARRY_N = const(1000000000)  # a counter carries into its second field (name_g) here, < 2**30
MAX_WAIT_US = const(0x1FFFFFFF)  # longest timeout / sleep / run limit (2**29 - 1 us, ~8.9 min):
#                                  half the ESP32's 2**30 tick circle, where ticks_diff stops being exact
