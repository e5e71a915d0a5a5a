# Priority inheritance for Mutex (FreeRTOS's): while a task holds a mutex that a
# higher-priority task waits for, it runs at that priority; the raise passes along a
# chain of mutexes and falls back when the waiter leaves (lock, timeout, kill). A base
# class of Kernel; sync.Mutex calls _reprio when its waiters or its owner change.
from firmware_py.sched.task import READY, DONE, W_MUTEX
from firmware_py.sched.stats import S_PRIO


class Priorities:
    # the Kernel's effective-priority bookkeeping (Task.prio vs Task.base)

    # set task t's effective priority to p, moving it within its ready or wait list (to the
    # tail of its new priority, as FreeRTOS does) and passing a raise on along a chain of
    # mutexes. O(list length)
    def _set_prio(self, t, p):
        while t is not None and t.prio != p:
            lst = t.owner
            if lst is not None:
                lst.remove(t)
            t.prio = p
            t.st[S_PRIO] = p
            if lst is None:
                return
            if t.state == READY:
                self._ready(t)
                return
            lst.push_prio(t)
            if t.wkind != W_MUTEX:
                return
            t = t.wobj.owner  # t waits for a mutex: its owner's priority follows
            p = self._inherited(t)

    # the priority task t should run at: its base, or the highest waiter of a mutex it holds
    def _inherited(self, t):
        p = t.base
        m = t.held
        while m is not None:
            w = m.waiters.head
            if w is not None and w.prio > p:
                p = w.prio
            m = m.hnext
        return p

    # recompute task t's inherited priority after a change of its mutexes or their waiters
    def _reprio(self, t):
        if t is not None and t.state < DONE:
            self._set_prio(t, self._inherited(t))
