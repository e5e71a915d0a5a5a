# The kernel's timer list: one list of every task with a timer (a sleep, or a wait with a
# timeout), sorted by wake time, intrusive (Task.tnext / Task.tprev), so inserting and
# removing allocate nothing. Expiry moves the due tasks to their ready lists in due-time
# order, as a tick that never lags would: timed-out waits resume with TIMEOUT, sleeps
# with OK. A base class of Kernel; the run loop inlines the "is the head due" test.
from firmware_py.compat import ticks_diff
from firmware_py.status import OK
from firmware_py.sched.task import W_NONE, W_SLEEP, W_MUTEX, TIMEOUT


class Timers:
    # the Kernel's timer list (Kernel.thead / Kernel.ttail) and leaving a wait

    # insert t into the timer list at `wake` ticks (after equal times: FIFO); O(timers)
    def _time(self, t, wake):
        t.wake = wake
        t.timed = True
        p = self.ttail
        while p is not None and ticks_diff(p.wake, wake) > 0:
            p = p.tprev
        t.tprev = p
        if p is None:
            t.tnext = self.thead
            self.thead = t
        else:
            t.tnext = p.tnext
            p.tnext = t
        if t.tnext is None:
            self.ttail = t
        else:
            t.tnext.tprev = t

    # take t off the timer list; O(1)
    def _untime(self, t):
        if t.tprev is None:
            self.thead = t.tnext
        else:
            t.tprev.tnext = t.tnext
        if t.tnext is None:
            self.ttail = t.tprev
        else:
            t.tnext.tprev = t.tprev
        t.tnext = t.tprev = None
        t.timed = False

    # serve the timers due by now (the tick that never lags); O(1) when none is due. Every
    # kernel service starts here, so this is also where a task the watchdog's timer named
    # (Kernel.bitten) is stopped: the watchdog's exception is raised into it at its next
    # kernel call (one attribute test while nothing hangs; no allocation)
    def _tick(self):
        b = self.bitten
        if b is not None and b is self.current:
            raise self.wd_exc
        h = self.thead
        if h is not None:
            now = self.clock.now()
            if ticks_diff(h.wake, now) <= 0:
                self._expire(now)

    # move every task whose timer expired by `t` to its ready list, in due-time order:
    # timed-out waits resume with TIMEOUT, sleeps with OK; the due time is the timer's
    def _expire(self, t):
        h = self.thead
        while h is not None and ticks_diff(h.wake, t) <= 0:
            self._untime(h)
            if h.wkind == W_SLEEP:
                h.rv = OK
            else:
                h.rv = TIMEOUT
            self._unwait(h)
            h.due = h.wake
            h.woke = True
            self._ready(h)
            h = self.thead

    # take a waiting task off its wait list (a mutex's owner may lose inherited priority); O(1)
    def _unwait(self, t):
        if t.owner is not None:
            t.owner.remove(t)
        if t.wkind == W_MUTEX:
            t.wkind = W_NONE
            self._reprio(t.wobj.owner)
        t.wkind = W_NONE
        t.wobj = None
        t.wval = None
