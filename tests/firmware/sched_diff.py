# Random kernel programs for the differential test, shared by CPython
# (tests/test_sched_diff.py, against tests/sched_model.py) and MicroPython
# (fw_sched_diff.py, heap locked). A program is a few tasks, each a script of ops over
# one queue, one semaphore, one mutex, one event-flags word and the tasks themselves;
# drive() runs it on the real kernel and records, in preallocated int arrays, every
# switch (time, task) and every op's result (time, task, op index, result code).
# Programs come from a small LCG so both interpreters build the same ones from a seed.
from array import array

from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, Queue, Semaphore, Mutex, EventFlags, TIMEOUT

# op codes: (code, a, b, c, d)
YIELD, CHARGE, SLEEP, QPUT, QPUT_NW, QGET, QGET_NW, TAKE, GIVE, LOCK, UNLOCK, EVSET, EVWAIT, EVCLEAR, \
    NOTIFY, NGIVE, WAITN, TAKEN, KILL, JOIN = range(20)
OP_NAMES = ("yield", "charge", "sleep", "qput", "qput_nw", "qget", "qget_nw", "take", "give", "lock", "unlock",
            "evset", "evwait", "evclear", "notify", "ngive", "wait_notify", "take_notify", "kill", "join")
R_NONE = -99  # result code of an op with no result (yield, charge)
R_TIMEOUT = -100  # result code of TIMEOUT
MAX_LOG = 600  # entries per program (switches + results)
TIMEOUTS = (0, -1, 30, 120, 400, 1 << 29)  # the last: past MAX_WAIT_US, refused with E_RANGE


class Rng:
    # 31-bit LCG: the same sequence on both interpreters (no float, small ints on the ESP32 too)
    def __init__(self, seed):
        self.s = seed & 0x7FFFFFFF  # state

    # next value in 0 .. n-1
    def below(self, n):
        self.s = (self.s * 1103515245 + 12345) & 0x7FFFFFFF
        return (self.s >> 8) % n


# one random program: (prios, scripts, qcap, smax); scripts[i] is a tuple of op tuples.
# no_kill: kills become yields (the heap-locked subset: closing a generator allocates)
def program(seed, no_kill=False):
    r = Rng(seed)
    n = 2 + r.below(4)
    prios = tuple(r.below(4) for _ in range(n))
    scripts = []
    for i in range(n):
        ops = []
        for _ in range(3 + r.below(10)):
            c = r.below(20)
            j = r.below(n)
            if c == KILL and (j == i or no_kill):
                c = YIELD  # self-kill is pinned elsewhere (fw_sched_core.py)
            to = TIMEOUTS[r.below(len(TIMEOUTS))]
            ops.append((c, 10 * r.below(12), to, j, 1 + r.below(15), r.below(2), r.below(2)))
        scripts.append(tuple(ops))
    return prios, tuple(scripts), 1 + r.below(3), 1 + r.below(3)


# result of an op as an int code (items are 100 + n)
def code(v):
    if v is None:
        return R_NONE
    if v is TIMEOUT:
        return R_TIMEOUT
    return v


class Run:
    # one program on the real kernel: the objects, the task list and the log arrays.
    # park: a task whose script is done blocks forever on a semaphore nobody gives instead
    # of returning (a generator's end allocates its StopIteration)
    def __init__(self, prog, park=False):
        prios, scripts, qcap, smax = prog
        self.k = Kernel(VirtualClock(), max_tasks=len(prios), priorities=4, verbose=False)  # the kernel under test
        k = self.k
        self.q = Queue(k, qcap)  # the queue
        self.s = Semaphore(k, 0, smax)  # the semaphore
        self.m = Mutex(k)  # the mutex
        self.ev = EventFlags(k)  # the event flags
        self.park = Semaphore(k) if park else None  # where finished scripts wait forever, or None
        self.alive = array("i", [0])  # what run() returned
        self.log = array("i", bytes(4 * 4 * MAX_LOG))  # entries of 4 ints: kind/time/task/pc/result packed below
        self.n = array("i", [0])  # entries used
        self.tasks = []  # Task objects, by index
        for i in range(len(prios)):
            self.tasks.append(k.spawn("t%d" % i, prios[i], self.runner(i, scripts[i])))
        k.on_switch = self.switched

    # record one entry: (time, task index, pc or -1 for a switch, result); no allocation
    def rec(self, t, i, pc, r):
        n = self.n[0]
        if n < MAX_LOG:
            b = 4 * n
            self.log[b] = t
            self.log[b + 1] = i
            self.log[b + 2] = pc
            self.log[b + 3] = r
            self.n[0] = n + 1

    # the kernel's on_switch hook
    def switched(self, t, task):
        self.rec(t, task.id, -1, 0)

    # the task body: interpret the script, recording each op's result
    def runner(self, me, script):
        k = self.k
        q = self.q
        s = self.s
        m = self.m
        ev = self.ev
        tasks = self.tasks
        pc = 0
        for op in script:
            c = op[0]
            a = op[1]
            to = op[2]
            other = tasks[op[3]]
            bits = op[4]
            r = None
            if c == YIELD:
                yield
            elif c == CHARGE:
                k.charge(a)
            elif c == SLEEP:
                r = yield k.sleep_us(a)
            elif c == QPUT:
                r = yield q.put(100 + a, to)
            elif c == QPUT_NW:
                r = q.put_nowait(100 + a)
            elif c == QGET:
                r = yield q.get(to)
            elif c == QGET_NW:
                r = q.get_nowait()
            elif c == TAKE:
                r = yield s.take(to)
            elif c == GIVE:
                r = s.give()
            elif c == LOCK:
                r = yield m.lock(to)
            elif c == UNLOCK:
                r = m.unlock()
            elif c == EVSET:
                r = ev.set(bits)
            elif c == EVWAIT:
                r = yield ev.wait(bits, to, wait_all=op[5] == 1, clear=op[6] == 1)
            elif c == EVCLEAR:
                r = ev.clear(bits)
            elif c == NOTIFY:
                r = k.notify(other, bits)
            elif c == NGIVE:
                r = k.notify_give(other)
            elif c == WAITN:
                r = yield k.wait_notify(to)
            elif c == TAKEN:
                r = yield k.take_notify(to, clear=op[5] == 1)
            elif c == KILL:
                r = k.kill(other)
            else:
                r = yield k.join(other, to)
            self.rec(k.now(), me, pc, code(r))
            pc += 1
        if self.park is not None:
            yield self.park.take()

    # run it; no allocation (the kernel's hot paths, the recording)
    def run(self):
        self.alive[0] = self.k.run()

    # run it; the final figures: run()'s return, then per task state and nval, then
    # queue count, semaphore count, mutex owner index (-1 free), event bits
    def go(self):
        self.run()
        return self.final()

    # the final figures of go() after run(); allocates
    def final(self):
        out = [self.alive[0]]
        for t in self.tasks:
            out.append(t.state)
            out.append(t.nval)
        o = self.m.owner
        out.append(self.q.count)
        out.append(self.s.count)
        out.append(-1 if o is None else o.id)
        out.append(self.ev.bits)
        return out

    # the log as a list of 4-tuples (allocates: after the run)
    def entries(self):
        lg = self.log
        return [(lg[4 * i], lg[4 * i + 1], lg[4 * i + 2], lg[4 * i + 3]) for i in range(self.n[0])]
