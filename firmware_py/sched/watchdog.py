# The kernel's watchdog: a slice longer than watchdog_us is a hang. Caught three ways,
# all naming the task: the clock's charge() calls watch() (the emulator: a task that
# burns virtual time without yielding gets the watchdog's exception raised into it), a
# board's machine.Timer calls _wd_check (start_watchdog_timer: the culprit is named
# while it still runs and stopped at its next kernel call), and the run loop checks every
# slice's length when it ends. The bitten task ends FAILED with WatchdogError. A base
# class of Kernel; while watchdog_us is 0 the run loop skips all of it.
from firmware_py.compat import ticks_diff, periodic_timer
from firmware_py.sched.task import SchedError
from firmware_py.sched.stats import T_BITES


class Watchdog:
    # the Kernel's hang detection (Kernel.watchdog_us, wd_limit, bitten, wd_exc, wd_timer)

    # hang check of the running slice: raises the watchdog's exception into the running
    # task once its slice is past watchdog_us (the clock calls this from charge(); the
    # board's timer callback uses _wd_check). O(1), no allocation while nothing hangs
    def watch(self):
        t = self.current
        if t is None:
            return
        if self.bitten is t or ticks_diff(self.clock.now(), self.t0) > self.wd_limit:
            self._bite(t)
            raise self.wd_exc

    # name the culprit once: count it, record it, say so (allocates: the fault path)
    def _bite(self, t):
        if self.bitten is t:
            return
        self.bitten = t
        self.totals[T_BITES] += 1
        if self.verbose:
            print("watchdog: task %s ran %d us without yielding (watchdog_us %d); stopping it" % (
                t.name, ticks_diff(self.clock.now(), self.t0), self.watchdog_us))

    # timer callback (board: machine.Timer, or anything calling it periodically): if the
    # running slice is past watchdog_us, name the task; the kernel stops it at its next
    # kernel call or at the slice's end. Allocation only when it bites
    def _wd_check(self, _arg=None):
        t = self.current
        if t is not None and self.bitten is not t and ticks_diff(self.clock.now(), self.t0) > self.wd_limit:
            self._bite(t)

    # on a board: check for a hung task every period_ms with a machine.Timer (compat);
    # SchedError where the runtime has none (the unix port, CPython). Not a hot path
    def start_watchdog_timer(self, period_ms=100):
        if self.watchdog_us <= 0:
            raise SchedError("watchdog timer: the kernel has no watchdog_us")
        tm = periodic_timer(period_ms, self._wd_check)
        if tm is None:
            raise SchedError("watchdog timer: this runtime has no machine.Timer")
        self.wd_timer = tm
        return tm

    # a slice that ended past the watchdog, or whose task the timer named: report and stop
    # it (FAILED with the watchdog's exception); not a hot path
    def _stop_bitten(self, task):
        self._bite(task)
        self.bitten = None
        if task.exc is None:
            task.exc = self.wd_exc
        self._fail(task)
