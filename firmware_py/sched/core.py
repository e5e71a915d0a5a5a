# The kernel proper: task slots, ready lists per priority, the run loop (switch, idle,
# timer expiry, the interrupt ring), kill/join. Its other parts are base classes, one
# idea per file: the timer list (timers.py), priority inheritance (prio.py), the
# watchdog (watchdog.py), notifications and the interrupt ring (notify.py), stats (stats.py).
# Semantics are FreeRTOS cooperative mode (configUSE_PREEMPTION=0) on a tick that never
# lags: a timer that falls due joins its ready list at its due time, in due-time order,
# ahead of anything made ready later (the yielder requeued at a slice's end included).
# Every kernel service first expires the timers due by now (_tick), so a timeout that has
# passed is served as a timeout even if nothing switched since.
from array import array

from firmware_py.compat import const, micropython, ticks_add, ticks_diff, print_exception
from firmware_py.clock import RealClock
from firmware_py.status import OK, E_RANGE, E_STALE, E_STATE, MAX_WAIT_US
from firmware_py.sched.task import (
    READY, RUNNING, RESUME, BLOCKED, DONE, FAILED, KILLED, W_NONE, W_SLEEP, W_JOIN,
    NO_BUDGET, FOREVER, TIMEOUT, BLOCK, SchedError, WatchdogError, TaskList, Task,
)
from firmware_py.sched.stats import NSTAT, NTOT, S_PRIO, S_FAULTS, S_MAX_LAT, S_MISSES, S_RUNS, S_RUNS_G, \
    S_RUN_US, S_RUN_S, T_IDLE_US, T_IDLE_S, T_FAULTS, T_OVERRUNS, T_MISSES, T_TASKS, CARRY_N, \
    US_PER_S, Stats, account
from firmware_py.sched.notify import Notify, Deferred
from firmware_py.sched.prio import Priorities
from firmware_py.sched.timers import Timers
from firmware_py.sched.watchdog import Watchdog

_DEFAULT_TASKS = const(16)  # task slots when Kernel(max_tasks=) is not given
_DEFAULT_PRIOS = const(8)  # priorities 0 (lowest) .. 7 when Kernel(priorities=) is not given
_DEFAULT_ISR_SLOTS = const(16)  # deferred interrupt-side operations held before the next switch
_ISR_POLL_US = const(1000)  # idle step while interrupt sources are attached and nothing is timed


class Kernel(Timers, Priorities, Watchdog, Notify, Stats):
    # the scheduler: task slots, ready lists per priority, one timer list, stats arrays
    def __init__(self, clock=None, max_tasks=_DEFAULT_TASKS, priorities=_DEFAULT_PRIOS, budget_us=0, verbose=True,
                 watchdog_us=0, isr_slots=_DEFAULT_ISR_SLOTS):
        if max_tasks < 1 or priorities < 1 or isr_slots < 2 or watchdog_us < 0:
            raise SchedError("kernel: max_tasks and priorities must be >= 1, isr_slots >= 2, watchdog_us >= 0")
        self.clock = clock if clock is not None else RealClock()  # RealClock or VirtualClock
        self.priorities = priorities  # number of priority levels
        self.budget_us = budget_us  # default overrun budget for spawn(); 0 = none
        self.verbose = verbose  # print a faulting task's traceback and watchdog reports
        self.tasks = [None] * max_tasks  # slot -> Task or None
        self.rows = [array("i", bytes(4 * NSTAT)) for _ in range(max_tasks)]  # slot -> stats row, see S_*
        self.retired_runs = 0  # slices run by released tasks (their rows are reused)
        self.retired_us = 0  # run time of released tasks, µs part
        self.retired_s = 0  # ... whole seconds
        self.totals = array("i", bytes(4 * NTOT))  # kernel totals, see T_*
        self.ready = [TaskList() for _ in range(priorities)]  # FIFO per priority
        self.top = -1  # highest priority whose ready list may be non-empty; -1 = none
        self.thead = None  # timer list head (earliest wake), Task or None
        self.ttail = None  # timer list tail
        self.current = None  # the task whose slice is running, else None
        self.t0 = 0  # ticks at which the current (or the last) slice began
        self.stopping = False  # stop() was called: run() returns after the current slice
        self.alert = 0  # non-zero: stop() was called or the interrupt ring was posted to (the loop reads one word)
        self.limited = False  # this run() has a time limit
        self.end = 0  # ticks at which a limited run() returns
        self.on_switch = None  # optional fn(ticks, task) called before each slice (tracing)
        self.isr = Deferred(self, isr_slots)  # the ring interrupt handlers post into (notify.py)
        self.watchdog_us = watchdog_us  # a slice longer than this is a hang: reported, task stopped; 0 = off
        self.wd_limit = watchdog_us if watchdog_us > 0 else NO_BUDGET  # the same, as the loop compares it
        self.bitten = None  # the task the watchdog caught (it names the culprit), or None
        self.wd_exc = WatchdogError("watchdog: a task ran past watchdog_us without yielding")  # raised into it; made now
        self.misuse_exc = SchedError("a blocking call was not yielded")  # fallback when the heap is locked
        self.wd_timer = None  # the machine.Timer checking for hangs on a board (start_watchdog_timer)
        if watchdog_us > 0:
            self.clock.watch = self.watch  # clock.charge() checks the slice: the emulator's hang detection

    # --- tasks ---------------------------------------------------------------------

    # start a task: gen is a generator object; allocates its Task (not a hot path)
    def spawn(self, name, prio, gen, budget_us=-1, deadline_us=0):
        if not (0 <= prio < self.priorities):
            raise SchedError("priority %r outside 0..%d" % (prio, self.priorities - 1))
        if not hasattr(gen, "send"):
            raise SchedError("spawn %s: a generator object is needed (call the function)" % name)
        tid = -1
        for i in range(len(self.tasks)):
            if self.tasks[i] is None:
                tid = i
                break
        if tid < 0:
            raise SchedError("spawn %s: all %d task slots in use (Kernel(max_tasks=))" % (name, len(self.tasks)))
        self._tick()
        t = Task(self, tid, name, prio, gen, self.budget_us if budget_us < 0 else budget_us, deadline_us)
        self.tasks[tid] = t
        st = self.rows[tid]
        for i in range(NSTAT):
            st[i] = 0
        st[S_PRIO] = prio
        t.st = st
        self.totals[T_TASKS] += 1
        self._ready(t)
        return t

    # free the slot (and stats row) of a finished task so spawn can reuse it
    def release(self, t):
        if not t.finished():
            raise SchedError("release %s: task still running" % t.name)
        if self.tasks[t.id] is t:
            self.tasks[t.id] = None
            self.retired_runs += t.st[S_RUNS_G] * CARRY_N + t.st[S_RUNS]
            us = self.retired_us + t.st[S_RUN_US]
            self.retired_s += t.st[S_RUN_S] + us // US_PER_S
            self.retired_us = us % US_PER_S

    # put t on the tail of its priority's ready list; O(1), no allocation
    def _ready(self, t):
        t.state = READY
        self.ready[t.prio].push(t)
        if t.prio > self.top:
            self.top = t.prio

    # make a blocked task ready with result rv, off its wait list and timer; O(1)
    def _wake(self, t, rv):
        if t.owner is not None:
            t.owner.remove(t)
        if t.timed:
            self._untime(t)
        t.wkind = W_NONE
        t.wobj = None
        t.wval = None
        t.rv = rv
        t.due = self.clock.now()
        t.woke = True
        self._ready(t)

    # the running task; a blocking call outside a task, or after an earlier blocking call
    # of the same slice that was not yielded, is a misuse of the kernel: SchedError. So is
    # one by a killed task (its finally code while kill() closes it, or after it killed
    # itself): it raises into that task, never blocks whoever called kill()
    def _cur(self):
        t = self.current
        if t is None:
            raise SchedError("blocking call outside a task (only a running task can block)")
        if t.state != RUNNING:
            if t.state >= DONE:
                raise SchedError("task %s was killed: it cannot block (a blocking call in its cleanup)" % t.name)
            raise self._misuse(t)
        return t

    # the SchedError naming task t that did not yield a blocking call; allocates its message
    # (the preallocated one when the heap is locked)
    def _misuse(self, t):
        try:
            return SchedError("task %s: a blocking call must be yielded (v = yield q.get())" % t.name)
        except MemoryError:
            return self.misuse_exc

    # block the running task on wait list wl (None: timer only) for timeout_us as kind; rv
    # on success comes from whoever wakes it. timeout 0 completes at once with TIMEOUT.
    # Returns BLOCK, which the task yields. O(1) + timer insert
    def _block(self, t, wl, timeout_us, kind, obj):
        if timeout_us > MAX_WAIT_US:  # past half the tick circle: refused before anything is registered
            t.wval = None
            return self._done_now(t, E_RANGE)
        if timeout_us == 0:
            t.rv = TIMEOUT
            t.state = RESUME
            return BLOCK
        t.state = BLOCKED
        t.wkind = kind
        t.wobj = obj
        if wl is not None:
            wl.push_prio(t)
        if timeout_us > 0:
            self._time(t, ticks_add(self.clock.now(), timeout_us))
        return BLOCK

    # the running task continues at once, resumed with rv (no switch); returns BLOCK
    def _done_now(self, t, rv):
        t.rv = rv
        t.state = RESUME
        return BLOCK

    # --- services called by the running task: `yield` what they return ----------------

    # sleep for us µs (0 .. MAX_WAIT_US); resumes with OK (E_RANGE for a negative or longer
    # duration: nothing registered); no allocation
    def sleep_us(self, us):
        t = self._cur()
        if us < 0 or us > MAX_WAIT_US:
            return self._done_now(t, E_RANGE)
        return self._sleep(t, ticks_add(self.clock.now(), us))

    # sleep for ms milliseconds (0 .. MAX_WAIT_US // 1000); resumes with OK, or E_RANGE
    def sleep_ms(self, ms):
        if ms < 0 or ms > MAX_WAIT_US // 1000:  # before * 1000: a big int would allocate
            return self.sleep_us(-1)
        return self.sleep_us(ms * 1000)

    # sleep until the absolute tick `when` (drift-free periods: when = ticks_add(when, period));
    # a time already past makes the task ready at once and still counts its latency
    def sleep_until(self, when):
        return self._sleep(self._cur(), when)

    # put the running task t on the timer list until `when`; it resumes with OK
    def _sleep(self, t, when):
        self._tick()
        t.state = BLOCKED
        t.wkind = W_SLEEP
        self._time(t, when)
        return BLOCK

    # current time in ticks from the kernel's clock
    def now(self):
        return self.clock.now()

    # the running task did us µs of work (VirtualClock: time moves; RealClock: spins); the
    # clock then calls watch() when the watchdog is on
    def charge(self, us):
        self.clock.charge(us)

    # wait until task u finishes; resumes with its final state (DONE/FAILED/KILLED) or
    # TIMEOUT; E_STATE when u is the caller itself; E_RANGE when u is not a task of this
    # kernel (its end would wake the caller on the other kernel's lists)
    def join(self, u, timeout_us=FOREVER):
        t = self._cur()
        self._tick()
        if not isinstance(u, Task) or u.k is not self:
            return self._done_now(t, E_RANGE)
        if u is t:
            return self._done_now(t, E_STATE)
        if u.state >= DONE:
            return self._done_now(t, u.state)
        return self._block(t, u.joiners, timeout_us, W_JOIN, u)

    # stop task u now: its generator is closed (finally blocks run), an item or token it was
    # handed goes back, mutexes it holds pass on, joiners wake with KILLED. OK, or E_STALE
    # when u had already finished, E_RANGE when u is not a task of this kernel. A task
    # killing itself ends at its next yield.
    def kill(self, u):
        if not isinstance(u, Task) or u.k is not self:
            return E_RANGE
        if u.state >= DONE:
            return E_STALE
        self._tick()
        if u is self.current:  # killing itself: the generator is executing, cannot close now
            self._detach(u)  # it may have blocked earlier in this slice
            u.state = KILLED  # the run loop finishes it when the slice ends
            return OK
        self._finish(u, KILLED)
        return OK

    # take u off every list and give back what it holds: wait and ready lists, the timer,
    # a handed item or token, its mutexes (each passes to its next waiter)
    def _detach(self, u):
        if u.timed:
            self._untime(u)
        if u.state == READY and u.owner is not None:
            u.owner.remove(u)
        else:
            self._unwait(u)
        h = u.hobj
        if h is not None:
            u.hobj = None
            h.give_back(u)
        u.hval = None
        m = u.held
        while m is not None:
            nxt = m.hnext
            m.pass_on()
            m = nxt
        u.held = None

    # ask run() to return after the current slice
    def stop(self):
        self.stopping = True
        self.alert = 1

    # end task u in state st: off every list, close the generator, wake joiners, count it.
    # The generator closes as u itself (current = u, already ended): its finally code
    # runs as the victim, not as the task that called kill(); a blocking call there
    # raises into u (see _cur), lock_nowait returns E_STATE, so u can own nothing again
    def _finish(self, u, st):
        self._detach(u)
        u.state = st
        u.rv = None
        self.totals[T_TASKS] -= 1
        if st != DONE:
            caller = self.current
            self.current = u
            try:
                u.gen.close()
            except Exception as e:  # a generator that yields or blocks in finally cannot be closed cleanly
                if u.exc is None:
                    u.exc = e
            self.current = caller
        while u.joiners.head is not None:
            self._wake(u.joiners.head, st)
    # --- the run loop ------------------------------------------------------------------

    # run tasks until none can ever run again, stop() is called, or for_us µs have passed
    # (for_us < 0: no limit). Returns the number of tasks still alive (blocked forever or
    # cut off by the limit). One clock read per switch, no allocation per switch.
    def run(self, for_us=-1):
        if for_us > MAX_WAIT_US:
            raise SchedError("run: for_us must be at most %d (half the tick circle), got %d" % (MAX_WAIT_US, for_us))
        self.stopping = False
        self.limited = for_us >= 0
        self.end = ticks_add(self.clock.now(), for_us)
        while self._loop():
            pass  # _loop returned after a task ended by an exception: go on
        self.current = None
        return self.totals[T_TASKS]

    # the scheduler loop proper. The try is set up once, outside the loop (a native try
    # costs a setjmp per entry): when a task's send raises, its slice is accounted here
    # and _loop returns True so run() re-enters. Every name the loop touches is a local
    # (the state constants too: another module's names are global lookups here), the
    # ready-list pop/push is inlined. What the common switch does not need costs one
    # compare each: stop() and the interrupt ring share one word (Kernel.alert), the
    # watchdog is a local flag, the timer check is done once per switch (before the
    # yielder is requeued, or at the top for every other path). Returns False when run()
    # should return.
    @micropython.native
    def _loop(self):
        clock = self.clock
        now = clock.now  # the clock keeps this reader as an attribute: no bound method made here
        td = ticks_diff
        acct = account
        tot = self.totals
        ready = self.ready
        hook = self.on_switch
        limited = self.limited
        end = self.end
        isr = self.isr
        seen = isr.head  # ring slots up to here are applied; isr.tail != seen: posts to apply
        self.alert = 1  # look at the ring (and stopping) before the first pick
        wd = self.wd_limit
        wdon = self.watchdog_us > 0  # False: no slice can be bitten
        running = RUNNING
        resume = RESUME
        ready_st = READY
        blocked = BLOCKED
        block = BLOCK
        t = now()
        task = None
        timed = False  # True when the timers due by t were just served (the yield path)
        in_send = False  # True only around gen.send: an exception there is the task's
        try:
            while True:
                if self.alert:  # stop() was called or an interrupt handler posted: one read per switch
                    self.alert = 0  # cleared before the ring is read: a later post sets it again
                    if self.stopping:
                        break
                    if isr.tail != seen:
                        isr.drain()  # what interrupt handlers posted since the last switch
                        seen = isr.head
                if limited and td(t, end) >= 0:
                    break
                if timed:
                    timed = False  # served before the yielder was requeued, at this same t
                else:
                    h = self.thead
                    if h is not None and td(h.wake, t) <= 0:
                        self._expire(t)
                # pick the head of the highest non-empty ready list
                p = self.top
                task = None
                lst = None
                while p >= 0:
                    lst = ready[p]
                    task = lst.head
                    if task is not None:
                        break
                    p -= 1
                self.top = p
                if task is None:
                    h = self.thead
                    if h is None:
                        if isr.sources <= 0:
                            break  # nothing ready, nothing timed: every remaining task waits forever
                        until = ticks_add(t, _ISR_POLL_US)  # an interrupt may still post
                    else:
                        until = h.wake
                        if isr.sources > 0 and td(until, t) > _ISR_POLL_US:
                            until = ticks_add(t, _ISR_POLL_US)
                    if limited and td(end, until) < 0:
                        until = end
                    clock.idle(until)
                    t1 = now()
                    v = tot[T_IDLE_US] + td(t1, t)
                    t = t1
                    if v >= US_PER_S:
                        tot[T_IDLE_S] += v // US_PER_S
                        v %= US_PER_S
                    tot[T_IDLE_US] = v
                    continue
                nx = task.next  # pop the head (inlined TaskList.remove)
                lst.head = nx
                if nx is None:
                    lst.tail = None
                else:
                    nx.prev = None
                task.next = None
                task.owner = None
                st = task.st
                if task.woke:
                    task.woke = False
                    lat = td(t, task.due)
                    if lat > st[S_MAX_LAT]:
                        st[S_MAX_LAT] = lat
                    if task.deadline_us and lat > task.deadline_us:
                        st[S_MISSES] += 1
                        tot[T_MISSES] += 1
                    ho = task.hobj
                    if ho is not None:  # it runs: the item or token handed to it is its own now
                        task.hobj = None
                        task.hval = None
                        ho.settle()
                if hook is not None:
                    hook(t, task)
                task.state = running
                self.current = task
                self.t0 = t  # the slice's start: the watchdog's and a sliced decode's (slicer.Slicer)
                gen = task.gen
                rv = task.rv
                if rv is not None:
                    task.rv = None
                in_send = True
                while True:
                    y = gen.send(rv)
                    state = task.state
                    if state != resume or y is not block:
                        break
                    task.state = running  # the blocking call completed at once: go on
                    rv = task.rv
                    task.rv = None
                in_send = False
                self.current = None
                t1 = now()
                d = td(t1, t)
                t = t1
                if acct(st, d, task.budget):  # stats row update, one viper call
                    tot[T_OVERRUNS] += 1
                # Timers that fell due during the slice are served first, whatever ended
                # it (the tick came before the yield, the return or the watchdog's stop):
                # a joiner or a mutex waiter whose timeout fell due in that slice times out
                # before the task's end can wake it or hand it the mutex
                h = self.thead
                if h is not None and td(h.wake, t) <= 0:
                    self._expire(t)
                timed = True
                if wdon and (d > wd or self.bitten is task):
                    self._stop_bitten(task)  # hung past the watchdog: reported by name, stopped
                elif state == running:
                    # it yielded: to the tail of its priority (inlined TaskList.push)
                    q = task.prio
                    if q != p:  # its priority changed in its slice (inheritance)
                        lst = ready[q]
                        if q > self.top:
                            self.top = q
                    task.state = ready_st
                    task.owner = lst
                    tl = lst.tail
                    task.prev = tl
                    if tl is None:
                        lst.head = task
                    else:
                        tl.next = task
                    lst.tail = task
                elif state == KILLED:
                    self._finish(task, KILLED)  # killed itself (or by a task it woke) during the slice
                elif y is not block or state != blocked:
                    self._misused(task)  # registered a wait but went on running: see _misused
                # else BLOCKED: already on its timer / wait list
            return False
        except StopIteration as e:
            if not in_send:
                raise e  # a kernel bug, not the task's (native code cannot re-raise bare)
            in_send = False
            task.result = e.args[0] if e.args else None
            self._ended(task, t, DONE)
        except Exception as e:
            if not in_send:
                raise e
            in_send = False
            if task.exc is None:
                task.exc = e
            self._ended(task, t, FAILED)
        return True

    # a task's generator returned or raised in the slice that began at t: account the
    # slice, then finish it (a fault is reported and counted). Not on the switch path.
    def _ended(self, task, t, state):
        self.current = None
        t1 = self.clock.now()
        d = ticks_diff(t1, t)
        if account(task.st, d, task.budget):
            self.totals[T_OVERRUNS] += 1
        h = self.thead
        if h is not None and ticks_diff(h.wake, t1) <= 0:
            self._expire(t1)  # the timers due in its last slice first, as on the yield path
        if task.state == KILLED:
            self._finish(task, KILLED)
        elif d > self.wd_limit or self.bitten is task:
            self._stop_bitten(task)
        elif task.state != RUNNING:
            self._misused(task)  # returned or raised with a wait registered and not yielded
        elif state == FAILED:
            self._fail(task)
        else:
            self._finish(task, DONE)

    # task yielded (or ended) with a blocking call registered but not yielded: it fails
    # with a SchedError naming it; what it was handed goes back. An exception the task
    # raised itself stays task.exc (the real cause); the misuse is then only printed
    def _misused(self, task):
        if task.exc is None:
            task.exc = self._misuse(task)
        elif self.verbose:
            print("task %s: also left a blocking call unyielded" % task.name)
        self._fail(task)

    # a task failed (task.exc says why): record, count, report; the others keep running
    def _fail(self, task):
        task.st[S_FAULTS] += 1
        self.totals[T_FAULTS] += 1
        if self.verbose:
            print("task %s failed:" % task.name)
            print_exception(task.exc)
        self._finish(task, FAILED)
