# Two clocks behind one interface, so the kernel never asks the runtime for time:
#   now()          current time in ticks (µs on the wrapped tick circle, compat.TICKS_PERIOD)
#   idle(until)    wait until `until` (or a little before it); the kernel's idle path
#   charge(us)     the running task did `us` µs of work (virtual: time moves; real: spins),
#                  then clock.watch() if set (the kernel's watchdog: it may raise)
# RealClock reads compat.ticks_us and sleeps in idle; VirtualClock only moves when told
# to, so the same inputs give the same event sequence run after run. Time arithmetic
# goes through ticks_add/ticks_diff only, so both survive the tick counter wrapping.
from firmware_py.compat import ticks_us, ticks_add, ticks_diff, sleep_us, sleep_ms, const

_SLEEP_MS_ABOVE_US = const(2000)  # idle waits longer than this sleep in ms (lets the board idle)


class ClockError(ValueError):
    # a caller's mistake with a clock: negative charge or a bad start time
    pass


class RealClock:
    # wall time from ticks_us; `start` shifts the tick origin (e.g. just below the wrap)
    virtual = False  # work takes its own time here (charge busy-waits: a stand-in only)

    def __init__(self, start=None):
        self.offset = 0  # ticks added to ticks_us(): 0 = the runtime's own ticks
        # now(): the runtime's ticks_us itself when unshifted (one C call per read, the
        # kernel reads it once per switch), else the shifted reader below
        self.now = ticks_us
        if start is not None:
            self.offset = ticks_diff(start, ticks_us())
            self.now = self.shifted_now
        self.virtual = False  # charge() spins, idle() sleeps: this is real time
        self.watch = None  # fn() called after each charge (the kernel's watchdog check), or None

    # current time in ticks with the start shift applied; no allocation (small ints)
    def shifted_now(self):
        return ticks_add(ticks_us(), self.offset)

    # sleep until `until`, or part of the way (the kernel loops): ms sleeps for long waits
    # so the board can idle, sleep_us for the last stretch; no allocation
    def idle(self, until):
        d = ticks_diff(until, self.now())
        if d >= _SLEEP_MS_ABOVE_US:
            sleep_ms(d // 1000 - 1)
        elif d > 0:
            sleep_us(d)

    # busy-wait `us` µs: stands in for real work of that length; no allocation
    def charge(self, us):
        if us < 0:
            raise ClockError("charge: negative duration")
        t0 = ticks_us()
        while ticks_diff(ticks_us(), t0) < us:
            pass
        w = self.watch
        if w is not None:
            w()

    advance = charge


class VirtualClock:
    # emulated time: starts at `start` ticks and moves only through charge() and idle()
    virtual = True  # the host's own run time is not the board's: what work costs is charged

    def __init__(self, start=0):
        self.t = ticks_add(start, 0)  # current time in ticks, on the wrapped circle
        self.virtual = True  # time jumps: nothing here ever waits for real
        self.idle_jumps = 0  # idle() calls that moved time forward
        self.watch = None  # fn() called after each charge (the kernel's watchdog check), or None
        # the bound method made once here, so the kernel taking `clock.now` per run()
        # does not allocate one each time (it may run with the heap locked)
        self.now = self.read

    # current time in ticks; an attribute read
    def read(self):
        return self.t

    # jump straight to `until` when it lies ahead; O(1), no allocation
    def idle(self, until):
        if ticks_diff(until, self.t) > 0:
            self.t = until
            self.idle_jumps += 1

    # the running task did `us` µs of work: emulated time moves by that much; O(1)
    def charge(self, us):
        if us < 0:
            raise ClockError("charge: negative duration")
        self.t = ticks_add(self.t, us)
        w = self.watch
        if w is not None:
            w()  # may raise into the charging task: the emulator's hang detection

    advance = charge
