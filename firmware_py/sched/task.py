# Tasks and the intrusive lists they sit on (ready lists, wait lists), the task states,
# what a task can wait for, and the two values every blocking call deals in: BLOCK (what
# the call returns and the task must yield) and TIMEOUT (what it resumes with when the
# timeout expires). Links live in the Task objects, so moving a task between lists
# allocates nothing.
from firmware_py.compat import const

# task states (snapshot() puts them in field S_STATE)
READY = const(0)  # on a ready list
RUNNING = const(1)  # the current task, will be requeued when it yields
RESUME = const(2)  # running; its blocking call completed at once: continue without a switch
BLOCKED = const(3)  # on a timer and/or a wait list
DONE = const(4)  # returned; Task.result holds the return value
FAILED = const(5)  # raised (or was stopped for misuse / by the watchdog); Task.exc holds why
KILLED = const(6)  # killed by Kernel.kill
STATE_NAMES = ("READY", "RUNNING", "RUNNING", "BLOCKED", "DONE", "FAILED", "KILLED")

# what a blocked task waits for (Task.wkind)
W_NONE = const(0)  # not waiting
W_SLEEP = const(1)  # timer only: sleep_us / sleep_until
W_QGET = const(2)  # Queue.get: on queue.getters
W_QPUT = const(3)  # Queue.put: on queue.putters, the item in Task.wval
W_SEM = const(4)  # Semaphore.take: on sem.waiters
W_EVENT = const(5)  # EventFlags.wait: on flags.waiters, mask in Task.wbits
W_JOIN = const(6)  # Kernel.join: on the other task's joiners
W_NOTIFY = const(7)  # wait_notify / take_notify: on no list, woken by notify
W_MUTEX = const(8)  # Mutex.lock: on mutex.waiters (its owner inherits our priority)

FOREVER = const(-1)  # timeout: wait without limit (any negative timeout means this)
NO_BUDGET = const(0x3FFFFFFF)  # a budget that no slice reaches (largest small int on the ESP32)


class _Marker:
    # type of the BLOCK and TIMEOUT sentinels; prints as its name (allocates, debugging only)
    def __init__(self, name):
        self.name = name  # "BLOCK" or "TIMEOUT"

    def __repr__(self):
        return self.name


TIMEOUT = _Marker("TIMEOUT")  # what a blocking call resumes with when its timeout expires
BLOCK = _Marker("BLOCK")  # what a blocking call returns: `yield` it (the kernel checks)


class SchedError(ValueError):
    # a caller's mistake with the kernel: bad configuration, or a blocking call made
    # outside a task or not yielded. str() is one line.
    pass


class WatchdogError(SchedError):
    # a task ran longer than the kernel's watchdog_us without yielding; one preallocated
    # instance per kernel is raised into the culprit (Kernel.bitten names it)
    pass


class TaskList:
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
    # one task: a generator plus its scheduling links and wait state (stats in Kernel.rows)
    def __init__(self, k, tid, name, prio, gen, budget_us, deadline_us):
        self.k = k  # owning Kernel
        self.id = tid  # slot index: row of Kernel.rows
        self.name = name  # for stats lines, traces and error messages
        self.base = prio  # priority given at spawn: 0 (lowest) .. Kernel.priorities - 1
        self.prio = prio  # effective priority: base, or higher while it holds a Mutex a higher task wants
        self.gen = gen  # the generator being run
        self.state = READY  # READY/RUNNING/RESUME/BLOCKED/DONE/FAILED/KILLED
        self.budget_us = budget_us  # a longer slice counts an overrun (S_OVERRUNS); 0 = none
        self.budget = budget_us if budget_us > 0 else NO_BUDGET  # the same, as the loop compares it
        self.deadline_us = deadline_us  # a wake-up later than this after its due time is a miss; 0 = none
        self.next = None  # next task on the ready list or wait list we are on
        self.prev = None  # previous task on that list
        self.owner = None  # the TaskList we are on, or None
        self.tnext = None  # next task on the kernel timer list (by wake time)
        self.tprev = None  # previous task on the timer list
        self.timed = False  # True while on the timer list
        self.wake = 0  # ticks at which the timer expires
        self.due = 0  # ticks at which we were due to run (for latency), valid when woke
        self.woke = False  # made ready by a timer or a wake call, not by yielding
        self.rv = None  # value the generator is resumed with
        self.wkind = W_NONE  # what we are blocked on: W_*
        self.wobj = None  # the object we are blocked on (queue, semaphore, flags, mutex, task), or None
        self.wval = None  # queue item waiting to be put / buffer to receive into
        self.wbits = 0  # event bits waited for
        self.wall = False  # event wait: all bits (True) or any bit (False)
        self.wclear = False  # event wait: clear the matched bits on wake; take_notify: clear (else decrement)
        self.hobj = None  # Queue/Semaphore whose item or token was handed to us on wake, until we run
        self.hval = None  # copy-mode queue: the buffer the handed item was copied into
        self.held = None  # first Mutex we own (chained through Mutex.hnext), or None
        self.nval = 0  # notification value: bits (notify) or count (notify_give), 0 = none pending
        self.joiners = TaskList()  # tasks blocked in join() on us
        self.st = None  # stats row: array('i') of NSTAT ints, set by Kernel.spawn
        self.result = None  # generator return value once DONE
        self.exc = None  # the exception once FAILED

    # <Task name prio n STATE>; allocates (debugging only)
    def __repr__(self):
        return "<Task %s prio %d %s>" % (self.name, self.prio, STATE_NAMES[self.state])

    # True once the task has returned, failed or been killed
    def finished(self):
        return self.state >= DONE
