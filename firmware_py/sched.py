# The cooperative kernel: FreeRTOS cooperative-mode semantics over generators.
#   - the highest-priority ready task runs; equal priorities run round-robin;
#   - a switch happens only when the running task yields or blocks.
# A task is a generator. It yields to give up the CPU; a blocking call is written
# `x = yield k.sleep_us(500)` / `item = yield q.get(1000)`: the call only records what the
# task waits for and returns None, the bare yield hands control to the kernel, and the
# kernel resumes the generator with the result (the item, True, the bits, or TIMEOUT).
# When a call can complete at once the task continues without a switch.
#
# No allocation on the hot path (switch, sleep/wake, queue put/get, semaphore take/give,
# notify, event set/wait): tasks sit on intrusive doubly linked lists (links live in the
# Task objects), stats live in one array('i') allocated by the Kernel, time is integer
# ticks through the clock object. Per-task counters carry into a second field before
# they leave the 31-bit small-int range of the ESP32.
from array import array

from firmware_py.compat import IS_MICROPYTHON, const, micropython, ptr8, ptr32, ticks_add, ticks_diff, print_exception
from firmware_py.clock import RealClock

# task states (snapshot() puts them in field S_STATE)
READY = const(0)  # on a ready list
RUNNING = const(1)  # the current task, will be requeued when it yields
_RESUME = const(2)  # running; its blocking call completed at once: continue without a switch
BLOCKED = const(3)  # on a timer and/or a wait list
DONE = const(4)  # returned; Task.result holds the return value
FAILED = const(5)  # raised; Task.exc holds the exception
KILLED = const(6)  # killed by Kernel.kill
STATE_NAMES = ("READY", "RUNNING", "RUNNING", "BLOCKED", "DONE", "FAILED", "KILLED")

FOREVER = const(-1)  # timeout: wait without limit

# per-task stats: one array("i") row of NSTAT ints per task slot (Kernel.rows, Task.st)
S_RUNS = const(0)  # slices run, modulo _CARRY_N
S_RUNS_G = const(1)  # slices run, in units of _CARRY_N
S_RUN_US = const(2)  # run time, µs part (< 1e6)
S_RUN_S = const(3)  # run time, whole seconds
S_MAX_SLICE = const(4)  # longest slice between resume and yield, µs
S_MAX_LAT = const(5)  # worst wake-up latency: due time (timer expiry / wake call) to start, µs
S_MISSES = const(6)  # wake-ups later than the task's deadline_us
S_FAULTS = const(7)  # exceptions raised by the task (0 or 1: a faulted task ends)
S_OVERRUNS = const(8)  # slices longer than the task's budget_us (watchdog)
S_STATE = const(9)  # state constant above (filled by snapshot())
S_PRIO = const(10)  # priority
NSTAT = const(11)  # ints per task row

# kernel totals: Kernel.totals, an array('i') of NTOT ints
T_SWITCHES = const(0)  # slices run by all tasks, modulo _CARRY_N (filled by snapshot_totals())
T_SWITCHES_G = const(1)  # ... in units of _CARRY_N (filled by snapshot_totals())
T_IDLE_US = const(2)  # time in the idle path, µs part
T_IDLE_S = const(3)  # ... whole seconds
T_BUSY_US = const(4)  # time in task slices (kernel overhead included), µs part (snapshot_totals())
T_BUSY_S = const(5)  # ... whole seconds (snapshot_totals())
T_FAULTS = const(6)  # tasks that raised
T_OVERRUNS = const(7)  # watchdog budget overruns, all tasks
T_MISSES = const(8)  # deadline misses, all tasks
T_TASKS = const(9)  # live tasks (not DONE/FAILED/KILLED)
NTOT = const(10)

_CARRY_N = const(1000000000)  # counters carry at 1e9 (< 2**30, a small int on the ESP32)
_US_PER_S = const(1000000)
_DEFAULT_TASKS = const(16)  # task slots when Kernel(max_tasks=) is not given
_DEFAULT_PRIOS = const(8)  # priorities 0 (lowest) .. 7 when Kernel(priorities=) is not given
_NO_BUDGET = const(0x3FFFFFFF)  # Task.budget when no watchdog budget is set (largest small int)
_EVENT_BITS = const(24)  # event flag bits usable (FreeRTOS: 24 on 32-bit ticks)


# one slice of d µs in stats row st: runs, run time, max slice, watchdog; 1 if it overran
# budget. Counters carry before leaving the ESP32's small-int range. No allocation.
def _account_py(st, d, budget):
    v = st[S_RUNS] + 1
    if v >= _CARRY_N:
        st[S_RUNS_G] += 1
        v = 0
    st[S_RUNS] = v
    v = st[S_RUN_US] + d
    while v >= _US_PER_S:
        st[S_RUN_S] += 1
        v -= _US_PER_S
    st[S_RUN_US] = v
    if d > st[S_MAX_SLICE]:
        st[S_MAX_SLICE] = d
    if d > budget:
        st[S_OVERRUNS] += 1
        return 1
    return 0


# the same on raw int32 words: on MicroPython ~3x cheaper than the array('i') updates
# (it cut the switch by ~8 %); on CPython ptr32 would build a memoryview per call
@micropython.viper
def _account_viper(st, d: int, budget: int) -> int:
    s = ptr32(st)
    v = s[S_RUNS] + 1
    if v >= _CARRY_N:
        s[S_RUNS_G] += 1
        v = 0
    s[S_RUNS] = v
    v = s[S_RUN_US] + d
    while v >= _US_PER_S:
        s[S_RUN_S] += 1
        v -= _US_PER_S
    s[S_RUN_US] = v
    if d > s[S_MAX_SLICE]:
        s[S_MAX_SLICE] = d
    if d > budget:
        s[S_OVERRUNS] += 1
        return 1
    return 0


_account = _account_viper if IS_MICROPYTHON else _account_py  # same interface, faster where it helps


class _Timeout:
    # type of the TIMEOUT sentinel; one instance
    # prints as TIMEOUT
    def __repr__(self):
        return "TIMEOUT"


TIMEOUT = _Timeout()  # what a blocking call resumes with when its timeout expires


class SchedError(ValueError):
    # a caller's mistake: bad priority, blocking outside a task, queue full without wait ...
    pass


class _List:
    # intrusive FIFO of tasks (links are Task.next/prev/owner); push/pop/remove O(1)
    def __init__(self):
        self.head = None  # first task or None
        self.tail = None  # last task or None

    # append t at the tail; O(1), no allocation
    def push(self, t):
        t.owner = self
        t.next = None
        t.prev = self.tail
        if self.tail is None:
            self.head = t
        else:
            self.tail.next = t
        self.tail = t

    # insert t behind every task of its priority or higher (FreeRTOS wait-list order); O(n)
    def push_prio(self, t):
        p = self.tail
        while p is not None and p.prio < t.prio:
            p = p.prev
        t.owner = self
        t.prev = p
        if p is None:
            t.next = self.head
            self.head = t
        else:
            t.next = p.next
            p.next = t
        if t.next is None:
            self.tail = t
        else:
            t.next.prev = t

    # take t out of this list; O(1), no allocation
    def remove(self, t):
        if t.prev is None:
            self.head = t.next
        else:
            t.prev.next = t.next
        if t.next is None:
            self.tail = t.prev
        else:
            t.next.prev = t.prev
        t.next = t.prev = t.owner = None


class Task:
    # one task: a generator plus its scheduling links and wait state (stats live in Kernel.stats)
    def __init__(self, k, tid, name, prio, gen, budget_us, deadline_us):
        self.k = k  # owning Kernel
        self.id = tid  # slot index: row of Kernel.stats
        self.name = name  # for stats lines and traces
        self.prio = prio  # 0 (lowest) .. Kernel.priorities - 1
        self.gen = gen  # the generator being run
        self.state = READY  # READY/RUNNING/_RESUME/BLOCKED/DONE/FAILED/KILLED
        self.budget_us = budget_us  # watchdog: a longer slice counts an overrun; 0 = none
        self.budget = budget_us if budget_us > 0 else _NO_BUDGET  # the same, as the loop compares it
        self.deadline_us = deadline_us  # a wake-up later than this after its due time is a miss; 0 = none
        self.next = None  # next task on the ready list or wait list we are on
        self.prev = None  # previous task on that list
        self.owner = None  # the _List we are on, or None
        self.tnext = None  # next task on the kernel timer list (by wake time)
        self.tprev = None  # previous task on the timer list
        self.timed = False  # True while on the timer list
        self.wake = 0  # ticks at which the timer expires
        self.due = 0  # ticks at which we were due to run (for latency), valid when woke
        self.woke = False  # made ready by a timer or a wake call, not by yielding
        self.rv = None  # value the generator is resumed with
        self.wobj = None  # the object we are blocked on (queue, semaphore, flags, task), or None
        self.wval = None  # queue item waiting to be put / buffer to receive into
        self.wbits = 0  # event bits waited for
        self.wall = False  # event wait: all bits (True) or any bit (False)
        self.wclear = False  # event wait: clear the matched bits on wake
        self.nval = 0  # pending notification bits
        self.nwait = False  # blocked in wait_notify
        self.joiners = _List()  # tasks blocked in join() on us
        self.st = None  # stats row: array('i') of NSTAT ints, set by Kernel.spawn
        self.result = None  # generator return value once DONE
        self.exc = None  # the exception once FAILED

    # <Task name prio n STATE>; allocates (debugging only)
    def __repr__(self):
        return "<Task %s prio %d %s>" % (self.name, self.prio, STATE_NAMES[self.state])

    # True once the task has returned, failed or been killed
    def finished(self):
        return self.state >= DONE


class Kernel:
    # the scheduler: task slots, ready lists per priority, one timer list, stats arrays
    def __init__(self, clock=None, max_tasks=_DEFAULT_TASKS, priorities=_DEFAULT_PRIOS, budget_us=0, verbose=True):
        if max_tasks < 1 or priorities < 1:
            raise SchedError("max_tasks and priorities must be >= 1")
        self.clock = clock if clock is not None else RealClock()  # RealClock or VirtualClock
        self.priorities = priorities  # number of priority levels
        self.budget_us = budget_us  # default watchdog budget for spawn(); 0 = none
        self.verbose = verbose  # print a faulting task's traceback
        self.tasks = [None] * max_tasks  # slot -> Task or None
        self.rows = [array("i", bytes(4 * NSTAT)) for _ in range(max_tasks)]  # slot -> stats row, see S_*
        self.retired_runs = 0  # slices run by released tasks (their rows are reused)
        self.retired_us = 0  # run time of released tasks, µs part
        self.retired_s = 0  # ... whole seconds
        self.totals = array("i", bytes(4 * NTOT))  # kernel totals, see T_*
        self.ready = [_List() for _ in range(priorities)]  # FIFO per priority
        self.top = -1  # highest priority whose ready list may be non-empty; -1 = none
        self.thead = None  # timer list head (earliest wake), Task or None
        self.ttail = None  # timer list tail
        self.current = None  # the running Task (between slices of run(): the last one); None outside run()
        self.stopping = False  # stop() was called: run() returns after the current slice
        self.limited = False  # this run() has a time limit
        self.end = 0  # ticks at which a limited run() returns
        self.on_switch = None  # optional fn(ticks, task) called before each slice (tracing)

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
            self.retired_runs += t.st[S_RUNS_G] * _CARRY_N + t.st[S_RUNS]
            us = self.retired_us + t.st[S_RUN_US]
            self.retired_s += t.st[S_RUN_S] + us // _US_PER_S
            self.retired_us = us % _US_PER_S

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
        t.wobj = None
        t.nwait = False
        t.rv = rv
        t.due = self.clock.now()
        t.woke = True
        self._ready(t)

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

    # the running task; a blocking call outside a task is a caller's mistake
    def _cur(self, what):
        t = self.current
        if t is None or t.state != RUNNING:
            raise SchedError(what + ": only a running task can block (and must yield the call)")
        return t

    # block the running task on wait list wl (None: timer only) for timeout_us; rv on success
    # comes from whoever wakes it. timeout 0 completes at once with TIMEOUT. O(1) + timer insert
    def _block(self, t, wl, timeout_us):
        if timeout_us == 0:
            t.rv = TIMEOUT
            t.state = _RESUME
            return
        t.state = BLOCKED
        if wl is not None:
            wl.push_prio(t)
        if timeout_us > 0:
            self._time(t, ticks_add(self.clock.now(), timeout_us))

    # the running task continues at once, resumed with rv (no switch)
    def _done_now(self, t, rv):
        t.rv = rv
        t.state = _RESUME

    # --- services called by the running task: `yield` what they return ----------------

    # sleep for us µs (>= 0); resumes with None; no allocation
    def sleep_us(self, us):
        t = self._cur("sleep_us")
        if us < 0:
            raise SchedError("sleep_us: negative duration")
        self._sleep(t, ticks_add(self.clock.now(), us))

    # sleep for ms milliseconds; resumes with None
    def sleep_ms(self, ms):
        return self.sleep_us(ms * 1000)

    # sleep until the absolute tick `when` (drift-free periods: when = ticks_add(when, period));
    # a time already past makes the task ready at once and still counts its latency
    def sleep_until(self, when):
        self._sleep(self._cur("sleep_until"), when)

    # put the running task t on the timer list until `when`; it resumes with None
    def _sleep(self, t, when):
        t.state = BLOCKED
        t.rv = None
        self._time(t, when)

    # current time in ticks from the kernel's clock
    def now(self):
        return self.clock.now()

    # the running task did us µs of work (VirtualClock: time moves; RealClock: spins)
    def charge(self, us):
        self.clock.charge(us)

    # set notification bits of task t and wake it if it waits; callable from anywhere; O(1)
    def notify(self, t, bits=1):
        t.nval |= bits
        if t.nwait:
            v = t.nval
            t.nval = 0
            self._wake(t, v)

    # wait for a notification; resumes with the pending bits (cleared) or TIMEOUT
    def wait_notify(self, timeout_us=FOREVER):
        t = self._cur("wait_notify")
        if t.nval:
            v = t.nval
            t.nval = 0
            self._done_now(t, v)
            return
        t.nwait = True
        self._block(t, None, timeout_us)
        if t.state == _RESUME:
            t.nwait = False

    # wait until task u finishes; resumes with its final state (DONE/FAILED/KILLED) or TIMEOUT
    def join(self, u, timeout_us=FOREVER):
        t = self._cur("join")
        if u is t:
            raise SchedError("join: a task cannot join itself")
        if u.state >= DONE:
            self._done_now(t, u.state)
            return
        t.wobj = u
        self._block(t, u.joiners, timeout_us)

    # stop task u now: its generator is closed (finally blocks run); joiners wake with KILLED
    def kill(self, u):
        if u.state >= DONE:
            return
        if u is self.current:  # killing itself: the generator is executing, cannot close now
            self._unlink(u)  # it may have blocked earlier in this slice
            u.state = KILLED  # the run loop finishes it when the slice ends
            return
        self._finish(u, KILLED)

    # take u off whatever ready/wait list and timer it is on; O(1)
    def _unlink(self, u):
        if u.owner is not None:
            u.owner.remove(u)
        if u.timed:
            self._untime(u)

    # ask run() to return after the current slice
    def stop(self):
        self.stopping = True

    # end task u in state st: close the generator, wake joiners, count it
    def _finish(self, u, st):
        self._unlink(u)  # e.g. a task that blocked, then returned without yielding
        u.state = st
        self.totals[T_TASKS] -= 1
        if st == KILLED:
            try:
                u.gen.close()
            except Exception as e:  # a generator that yields in finally cannot be closed cleanly
                u.exc = e
        while u.joiners.head is not None:
            self._wake(u.joiners.head, st)

    # --- the run loop ------------------------------------------------------------------

    # run tasks until none can ever run again, stop() is called, or for_us µs have passed
    # (for_us < 0: no limit). Returns the number of tasks still alive (blocked forever or
    # cut off by the limit). One clock read per switch, no allocation per switch.
    def run(self, for_us=-1):
        self.stopping = False
        self.limited = for_us >= 0
        self.end = ticks_add(self.clock.now(), for_us)
        while self._loop():
            pass  # _loop returned after a task ended by an exception: go on
        self.current = None
        return self.totals[T_TASKS]

    # the scheduler loop proper. The try is set up once, outside the loop (a native try
    # costs a setjmp per entry): when a task's send raises, its slice is accounted here
    # and _loop returns True so run() re-enters. Every name the loop touches is a local,
    # the ready-list pop/push is inlined. Returns False when run() should return.
    @micropython.native
    def _loop(self):
        clock = self.clock
        now = clock.now  # the clock keeps this reader as an attribute: no bound method made here
        td = ticks_diff
        tot = self.totals
        ready = self.ready
        hook = self.on_switch
        limited = self.limited
        end = self.end
        t = now()
        task = None
        in_send = False  # True only around gen.send: an exception there is the task's
        try:
            while not self.stopping:
                if limited and td(t, end) >= 0:
                    break
                h = self.thead
                if h is not None and td(h.wake, t) <= 0:
                    self._expire(t)
                    h = self.thead
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
                    if h is None:
                        break  # nothing ready, nothing timed: every remaining task waits forever
                    until = h.wake
                    if limited and td(end, until) < 0:
                        until = end
                    clock.idle(until)
                    t1 = now()
                    v = tot[T_IDLE_US] + td(t1, t)
                    t = t1
                    if v >= _US_PER_S:
                        tot[T_IDLE_S] += v // _US_PER_S
                        v %= _US_PER_S
                    tot[T_IDLE_US] = v
                    continue
                nx = task.next  # pop the head (inlined _List.remove)
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
                if hook is not None:
                    hook(t, task)
                task.state = RUNNING
                self.current = task
                gen = task.gen
                rv = task.rv
                if rv is not None:
                    task.rv = None
                in_send = True
                while True:
                    gen.send(rv)
                    state = task.state
                    if state != _RESUME:
                        break
                    task.state = RUNNING  # the blocking call completed at once: go on
                    rv = task.rv
                    task.rv = None
                in_send = False
                t1 = now()
                d = td(t1, t)
                t = t1
                if _account(st, d, task.budget):  # stats row update, one viper call
                    tot[T_OVERRUNS] += 1
                if state == RUNNING:
                    # it yielded: round-robin to the tail of its priority, the list it was
                    # popped from (inlined _List.push; self.top is already this priority)
                    task.state = READY
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
                # else BLOCKED: already on its timer / wait list
            return False
        except StopIteration as e:
            if not in_send:
                raise e  # a kernel bug, not the task's (native code cannot re-raise bare)
            task.result = e.args[0] if e.args else None
            self._ended(task, t, DONE)
        except Exception as e:
            if not in_send:
                raise e
            task.exc = e
            self._ended(task, t, FAILED)
        return True

    # a task's generator returned or raised in the slice that began at t: account the
    # slice, then finish it (fault path: report and count). Not on the switch path.
    def _ended(self, task, t, state):
        if _account(task.st, ticks_diff(self.clock.now(), t), task.budget):
            self.totals[T_OVERRUNS] += 1
        if state == FAILED:
            self._fault(task)
        else:
            self._finish(task, DONE)

    # move every task whose timer expired by `t` to its ready list: timed-out waits resume
    # with TIMEOUT, sleeps with None; the due time is the timer's, for wake-up latency
    def _expire(self, t):
        h = self.thead
        while h is not None and ticks_diff(h.wake, t) <= 0:
            self._untime(h)
            if h.owner is not None:  # a wait with a timeout, not a plain sleep
                h.owner.remove(h)
                h.rv = TIMEOUT
            elif h.nwait:
                h.rv = TIMEOUT
            h.nwait = False
            h.wobj = None
            h.wval = None
            h.due = h.wake
            h.woke = True
            self._ready(h)
            h = self.thead

    # total slices run by all tasks, low part (carry in snapshot_totals); for tests and benches
    def switches(self):
        n = 0
        for t in self.tasks:
            if t is not None:
                n += t.st[S_RUNS_G] * _CARRY_N + t.st[S_RUNS]
        return n + self.retired_runs

    # a task raised: record, count, report; the others keep running
    def _fault(self, task):
        task.st[S_FAULTS] += 1
        self.totals[T_FAULTS] += 1
        if self.verbose:
            print("task %s failed:" % task.name)
            print_exception(task.exc)
        self._finish(task, FAILED)

    # --- stats -------------------------------------------------------------------------

    # copy task t's stats row into buf (array('i') of NSTAT ints); no allocation
    def snapshot(self, t, buf):
        st = t.st
        for i in range(NSTAT):
            buf[i] = st[i]
        buf[S_STATE] = RUNNING if t.state == _RESUME else t.state

    # copy the kernel totals into buf (array('i') of NTOT ints), switches summed over the
    # task rows with carry (released tasks not included); no allocation
    def snapshot_totals(self, buf):
        tot = self.totals
        lo = 0
        hi = 0
        us = self.retired_us
        s = self.retired_s
        for t in self.tasks:
            if t is not None:
                st = t.st
                lo += st[S_RUNS]
                hi += st[S_RUNS_G]
                if lo >= _CARRY_N:
                    lo -= _CARRY_N
                    hi += 1
                us += st[S_RUN_US]
                s += st[S_RUN_S]
                if us >= _US_PER_S:
                    us -= _US_PER_S
                    s += 1
        tot[T_SWITCHES] = lo
        tot[T_SWITCHES_G] = hi
        tot[T_BUSY_US] = us
        tot[T_BUSY_S] = s
        for i in range(NTOT):
            buf[i] = tot[i]

    # task t's share of the elapsed run time (busy + idle) in per mille; integer math, no allocation
    def cpu_permille(self, t):
        run_ms = t.st[S_RUN_S] * 1000 + t.st[S_RUN_US] // 1000
        tot = self.totals
        self.snapshot_totals(tot)  # busy time is summed over the task rows; O(tasks)
        el_ms = (tot[T_BUSY_S] + tot[T_IDLE_S]) * 1000 + (tot[T_BUSY_US] + tot[T_IDLE_US]) // 1000
        if el_ms <= 0:
            return 0
        if el_ms < _US_PER_S:
            return run_ms * 1000 // el_ms
        return run_ms // (el_ms // 1000)

    # one line per task in the style of Zephyr's thread analyzer, plus a kernel line; allocates
    def stats_lines(self):
        lines = []
        w = 4
        for t in self.tasks:
            if t is not None and len(t.name) > w:
                w = len(t.name)
        for t in self.tasks:
            if t is None:
                continue
            r = 0
            s = t.st
            runs = s[r + S_RUNS_G] * _CARRY_N + s[r + S_RUNS]
            run_us = s[r + S_RUN_S] * _US_PER_S + s[r + S_RUN_US]
            pm = self.cpu_permille(t)
            lines.append(
                "%s : PRIO %d %s runs %d slice avg %d max %d us; wake lat max %d us; misses %d overruns %d faults %d; CPU: %d.%d %%"
                % (
                    t.name + " " * (w - len(t.name)),
                    t.prio,
                    STATE_NAMES[t.state],
                    runs,
                    run_us // runs if runs else 0,
                    s[r + S_MAX_SLICE],
                    s[r + S_MAX_LAT],
                    s[r + S_MISSES],
                    s[r + S_OVERRUNS],
                    s[r + S_FAULTS],
                    pm // 10,
                    pm % 10,
                )
            )
        tot = self.totals
        self.snapshot_totals(tot)
        lines.append(
            "kernel : switches %d; busy %d us idle %d us; faults %d overruns %d misses %d; tasks alive %d"
            % (
                tot[T_SWITCHES_G] * _CARRY_N + tot[T_SWITCHES],
                tot[T_BUSY_S] * _US_PER_S + tot[T_BUSY_US],
                tot[T_IDLE_S] * _US_PER_S + tot[T_IDLE_US],
                tot[T_FAULTS],
                tot[T_OVERRUNS],
                tot[T_MISSES],
                tot[T_TASKS],
            )
        )
        return lines

    # print stats_lines()
    def print_stats(self):
        for line in self.stats_lines():
            print(line)


# --- synchronisation objects ----------------------------------------------------------


@micropython.viper
def _copy(dst, doff: int, src, soff: int, n: int):
    # copy n bytes src[soff:] -> dst[doff:] without a slice object; O(n), no allocation
    d = ptr8(dst)
    s = ptr8(src)
    for i in range(n):
        d[doff + i] = s[soff + i]


class Queue:
    # fixed-capacity FIFO allocated at creation. item_size 0: holds object references;
    # item_size n: each item is n bytes copied in (put(buf)) and out (get(timeout, into=buf)).
    # A waiting getter receives an item directly from put; putters wait while full.
    def __init__(self, k, capacity, item_size=0):
        if capacity < 1 or item_size < 0:
            raise SchedError("queue: capacity must be >= 1 and item_size >= 0")
        self.k = k  # owning Kernel
        self.capacity = capacity  # items it holds
        self.item_size = item_size  # bytes per item, 0 = object references
        self.items = [None] * capacity if item_size == 0 else None  # ring of references
        self.buf = bytearray(capacity * item_size) if item_size else None  # ring of items, capacity x item_size bytes
        self.head = 0  # ring index of the oldest item
        self.count = 0  # items held, 0..capacity
        self.getters = _List()  # tasks blocked in get (none while count > 0)
        self.putters = _List()  # tasks blocked in put (none while count < capacity)

    # blocking put: resumes with True once stored (or handed to a getter), or TIMEOUT
    def put(self, item, timeout_us=FOREVER):
        k = self.k
        t = k._cur("queue put")
        if self._offer(item):
            k._done_now(t, True)
            return
        t.wval = item  # stored by the get that frees a slot
        t.wobj = self
        k._block(t, self.putters, timeout_us)

    # put without waiting, from a task or anywhere else: True if stored, False if full
    def put_nowait(self, item):
        return self._offer(item)

    # store item or hand it to the first waiting getter; False when full; O(1) (+ item_size copy)
    def _offer(self, item):
        n = self.item_size
        if n and len(item) < n:
            raise SchedError("queue put: item shorter than item_size %d" % n)
        g = self.getters.head
        if g is not None:
            if n:
                _copy(g.wval, 0, item, 0, n)
                g.wval = None
                self.k._wake(g, True)
            else:
                self.k._wake(g, item)
            return True
        if self.count == self.capacity:
            return False
        i = self.head + self.count
        if i >= self.capacity:
            i -= self.capacity
        if n:
            _copy(self.buf, i * n, item, 0, n)
        else:
            self.items[i] = item
        self.count += 1
        return True

    # blocking get: resumes with the item (copy mode: True, the bytes in `into`) or TIMEOUT
    def get(self, timeout_us=FOREVER, into=None):
        k = self.k
        t = k._cur("queue get")
        if self.item_size and (into is None or len(into) < self.item_size):
            raise SchedError("queue get: pass into=, a buffer of item_size %d bytes" % self.item_size)
        if self.count:
            k._done_now(t, self._take(into))
            return
        t.wval = into
        t.wobj = self
        k._block(t, self.getters, timeout_us)

    # get without waiting: the item (copy mode: True) or TIMEOUT when empty
    def get_nowait(self, into=None):
        if self.item_size and (into is None or len(into) < self.item_size):
            raise SchedError("queue get: pass into=, a buffer of item_size %d bytes" % self.item_size)
        if self.count:
            return self._take(into)
        return TIMEOUT

    # remove the oldest item, then let the first waiting putter fill the slot; O(1)
    def _take(self, into):
        h = self.head
        n = self.item_size
        if n:
            _copy(into, 0, self.buf, h * n, n)
            v = True
        else:
            v = self.items[h]
            self.items[h] = None
        h += 1
        if h == self.capacity:
            h = 0
        self.head = h
        self.count -= 1
        p = self.putters.head
        if p is not None:
            self._offer(p.wval)
            p.wval = None
            self.k._wake(p, True)
        return v


class Semaphore:
    # counting semaphore 0..maximum (maximum 1: binary); take blocks, give never does
    def __init__(self, k, initial=0, maximum=1):
        if maximum < 1 or not (0 <= initial <= maximum):
            raise SchedError("semaphore: need 0 <= initial <= maximum and maximum >= 1")
        self.k = k  # owning Kernel
        self.count = initial  # tokens available
        self.maximum = maximum  # give() beyond this fails
        self.waiters = _List()  # tasks blocked in take, priority order

    # blocking take: resumes with True, or TIMEOUT; O(1) (+ wait-list insert)
    def take(self, timeout_us=FOREVER):
        k = self.k
        t = k._cur("semaphore take")
        if self.count:
            self.count -= 1
            k._done_now(t, True)
            return
        t.wobj = self
        k._block(t, self.waiters, timeout_us)

    # take without waiting: True if a token was taken
    def take_nowait(self):
        if self.count:
            self.count -= 1
            return True
        return False

    # release one token (wakes the first waiter instead); False when already at maximum; O(1)
    def give(self):
        w = self.waiters.head
        if w is not None:
            self.k._wake(w, True)
            return True
        if self.count >= self.maximum:
            return False
        self.count += 1
        return True


class EventFlags:
    # a word of _EVENT_BITS event bits; tasks wait for any or all of a mask
    def __init__(self, k):
        self.k = k  # owning Kernel
        self.bits = 0  # current bits
        self.waiters = _List()  # blocked tasks, priority order

    # set bits and wake every waiter now satisfied (resumes with the bits as set); O(waiters)
    def set(self, bits):
        if bits < 0 or bits >> _EVENT_BITS:
            raise SchedError("event flags: bits outside the low %d" % _EVENT_BITS)
        b = self.bits | bits
        self.bits = b
        clear = 0
        w = self.waiters.head
        while w is not None:
            nxt = w.next
            m = b & w.wbits
            if (m == w.wbits) if w.wall else m:
                if w.wclear:
                    clear |= w.wbits
                self.k._wake(w, b)
            w = nxt
        if clear:
            self.bits &= ~clear

    # clear bits; O(1)
    def clear(self, bits):
        self.bits &= ~bits

    # wait for any (wait_all False) or all bits of mask; resumes with the bits seen, or
    # TIMEOUT; clear=True clears the mask bits on success
    def wait(self, mask, wait_all=False, clear=False, timeout_us=FOREVER):
        k = self.k
        t = k._cur("event wait")
        if mask <= 0 or mask >> _EVENT_BITS:
            raise SchedError("event flags: wait mask must be non-zero within the low %d bits" % _EVENT_BITS)
        b = self.bits
        m = b & mask
        if (m == mask) if wait_all else m:
            if clear:
                self.bits = b & ~mask
            k._done_now(t, b)
            return
        t.wbits = mask
        t.wall = wait_all
        t.wclear = clear
        t.wobj = self
        k._block(t, self.waiters, timeout_us)
