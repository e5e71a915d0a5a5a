# The kernel's hot paths allocate nothing on MicroPython: each service runs many times
# under micropython.heap_lock() (a MemoryError fails the check). Each scenario runs once
# unlocked first, so one-time setup is not counted, then again locked.
from fwtest import check, eq, no_alloc, done
from array import array
from firmware_py import sched
from firmware_py.clock import RealClock, VirtualClock
from firmware_py.sched import Kernel, Queue, Semaphore, EventFlags, TIMEOUT, OK

N = 200  # iterations of each service per locked run


def no_faults(k, what):
    # a MemoryError inside a task would be caught by the kernel as a fault: none allowed
    eq(k.totals[sched.T_FAULTS], 0, "no task faulted: " + what)


def stopper(k, n):
    # stop the kernel after n of its own slices; never ends (an ending generator allocates)
    while True:
        for _ in range(n):
            yield
        k.stop()


def spinner():
    while True:
        yield


# --- switch: round-robin between yielding tasks, on both clocks ---
for name, clk in (("real", RealClock()), ("virtual", VirtualClock())):
    k = Kernel(clk, max_tasks=4)
    k.spawn("a", 1, spinner())
    k.spawn("b", 1, spinner())
    k.spawn("stop", 1, stopper(k, N))
    k.run()
    before = k.switches()
    no_alloc("task switch (%s clock)" % name, k.run)
    eq(k.switches() - before, 3 * N, "switches made under the lock (%s)" % name)
    no_faults(k, "switch")

# --- sleep / wake, timer path and idle path, on both clocks ---
for name, clk, us in (("real", RealClock(), 50), ("virtual", VirtualClock(), 1000)):
    k = Kernel(clk, max_tasks=4)
    wakes = array("i", [0])

    def sleeper(k=k, us=us, wakes=wakes):
        while True:
            yield k.sleep_us(us)
            wakes[0] += 1

    def periodic(k=k, wakes=wakes):
        t = k.now()
        while True:
            t = sched.ticks_add(t, 700)
            yield k.sleep_until(t)
            if wakes[0] >= N:
                k.stop()

    k.spawn("sleeper", 2, sleeper())
    k.spawn("periodic", 1, periodic())
    k.run()
    wakes[0] = 0
    no_alloc("sleep_us / sleep_until / timer wake / idle (%s clock)" % name, k.run)
    check(wakes[0] >= N, "sleeper woke %d times under the lock (%s)" % (wakes[0], name))
    no_faults(k, "sleep")

# --- queue put/get (object and copy modes), blocking both ways, and timeouts ---
k = Kernel(VirtualClock(), max_tasks=6)
q = Queue(k, 2)
qc = Queue(k, 3, 8)
got = array("i", [0, 0, 0])  # items, copy-mode items, timeouts
item = bytearray(8)
into = bytearray(8)


def producer():
    i = 0
    while True:
        i += 1
        yield q.put(i & 0xFF)  # small ints: references, no allocation
        item[0] = i & 0xFF
        yield qc.put(item, 10000)
        if i % 16 == 0:
            yield k.sleep_us(300)  # the consumer's get times out meanwhile


def consumer():
    while True:
        v = yield q.get(100)
        if v is TIMEOUT:
            got[2] += 1
        else:
            got[0] += 1
        r = yield qc.get(100, into=into)
        if r == OK:
            got[1] += into[0] != 255
        if got[0] >= N:
            k.stop()


k.spawn("producer", 2, producer())
k.spawn("consumer", 1, consumer())
k.run()
got[0] = got[1] = got[2] = 0
no_alloc("queue put/get, blocking, handoff and timeout", k.run)
check(got[0] >= N and got[1] >= N - 1, "items through both queues under the lock: %d %d" % (got[0], got[1]))
check(got[2] > 0, "some gets timed out under the lock")
no_faults(k, "queue")

# --- semaphore take/give, notification, event flags: ping-pong between two tasks ---
k = Kernel(VirtualClock(), max_tasks=6)
sem = Semaphore(k, 0, 1)
counting = Semaphore(k, 0, 5)
ev = EventFlags(k)
n = array("i", [0, 0, 0])


def giver(k, sem, counting, ev, n):
    while True:
        sem.give()
        counting.give()
        counting.give()
        k.notify(taker_task, 2)
        ev.set(0x3)
        yield
        n[2] += 1


def taker(k, sem, counting, ev, n):
    while True:
        ok = yield sem.take(1000)
        ok2 = yield counting.take(1000)
        ok3 = yield counting.take(0)
        bits = yield k.wait_notify(1000)
        b = yield ev.wait(0x3, 1000, wait_all=True, clear=True)
        if ok == OK and ok2 == OK and ok3 == OK and bits == 2 and b == 3:
            n[0] += 1
        if n[0] >= N:
            k.stop()


k.spawn("giver", 1, giver(k, sem, counting, ev, n))
taker_task = k.spawn("taker", 2, taker(k, sem, counting, ev, n))
k.run()
n[0] = 0
no_alloc("semaphore take/give, notify/wait_notify, event set/wait", k.run)
eq(n[0], N, "rounds where every service delivered")
no_faults(k, "sync")

# --- the telemetry task's view: snapshot and CPU share without allocating ---
row = array("i", bytes(4 * sched.NSTAT))
tot = array("i", bytes(4 * sched.NTOT))


def read_stats():
    k.snapshot(taker_task, row)
    k.snapshot_totals(tot)
    k.cpu_permille(taker_task)


no_alloc("stats snapshot / totals / cpu share", read_stats)
check(row[sched.S_RUNS] > N, "snapshot copied the run count")
check(tot[sched.T_SWITCHES] > N, "totals summed the switches")
done()
