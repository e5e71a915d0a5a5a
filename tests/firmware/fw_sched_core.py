# Kernel semantics (FreeRTOS cooperative mode) on the virtual clock: priority order,
# round-robin, switches only at yield/block, sleep and drift-free periods, tick wrap,
# join/exit status, kill, and the caller mistakes that get a SchedError.
from fwtest import check, eq, raises, done
from firmware_py import compat
from firmware_py.clock import VirtualClock, RealClock
from firmware_py.sched import Kernel, SchedError, Semaphore, Queue, TIMEOUT, DONE, FAILED, KILLED, READY, OK, E_RANGE, E_STALE
from firmware_py.compat import ticks_add, ticks_diff

P = compat.TICKS_PERIOD


def new(start=0, **kw):
    return Kernel(VirtualClock(start), verbose=False, **kw)


# --- highest priority first; equal priorities round-robin ---
k = new()
log = []


def worker(name, n):
    for _ in range(n):
        log.append(name)
        yield


k.spawn("low", 1, worker("low", 2))
k.spawn("high", 3, worker("high", 2))
k.spawn("mid", 2, worker("mid", 2))
eq(k.run(), 0, "every task finished")
eq(log, ["high", "high", "mid", "mid", "low", "low"], "highest ready priority runs; lower ones wait")

k = new()
log = []
for nm in ("a", "b", "c"):
    k.spawn(nm, 1, worker(nm, 3))
k.run()
eq(log, ["a", "b", "c"] * 3, "equal priorities take turns in spawn order")

# fairness with many tasks: each gets the same number of slices within one priority
k = new(max_tasks=20)
counts = [0] * 10


def counter(i):
    while True:
        counts[i] += 1
        yield


def stop_after(n):
    for _ in range(n):
        yield
    k.stop()


for i in range(10):
    k.spawn("t%d" % i, 1, counter(i))
k.spawn("stop", 1, stop_after(100))
k.run()
eq(counts, [101] * 10, "round-robin gives every equal-priority task the same share")

# --- a switch happens only at yield/block: waking a higher task does not preempt ---
k = new()
log = []
sem = Semaphore(k)


def high():
    yield sem.take()
    log.append("high woke")


def low():
    sem.give()
    log.append("low still running after give")
    yield
    log.append("low resumed")


k.spawn("high", 3, high())
k.spawn("low", 1, low())
k.run()
eq(log, ["low still running after give", "high woke", "low resumed"], "give from a low task switches only at its yield")

# --- sleep: durations, order, time, the idle jump ---
k = new()
log = []


def sleeper(name, us):
    yield k.sleep_us(us)
    log.append((name, k.now()))


k.spawn("s300", 1, sleeper("s300", 300))
k.spawn("s100", 1, sleeper("s100", 100))
k.spawn("s200", 2, sleeper("s200", 200))
k.spawn("s100b", 1, sleeper("s100b", 100))
k.run()
eq(log, [("s100", 100), ("s100b", 100), ("s200", 200), ("s300", 300)], "sleepers wake in time order, equal times FIFO")
eq(k.clock.idle_jumps, 3, "the virtual clock jumped to each deadline while all slept")

# sleep_ms is 1000 µs per ms; sleep_us(0) is a yield
k = new()
log = []


def ms():
    yield k.sleep_ms(3)
    log.append(k.now())
    yield k.sleep_us(0)
    log.append(k.now())


k.spawn("ms", 1, ms())
k.run()
eq(log, [3000, 3000], "sleep_ms(3) wakes at 3000 µs; sleep_us(0) only yields")

# drift-free period: sleep_until with work charged in between keeps the release grid
k = new()
rel = []


def periodic():
    t = k.now()
    for i in range(5):
        k.charge(70 + 10 * i)  # work of varying length
        t = ticks_add(t, 1000)
        yield k.sleep_until(t)
        rel.append(k.now())


k.spawn("per", 1, periodic())
k.run()
eq(rel, [1000, 2000, 3000, 4000, 5000], "sleep_until releases on the grid despite work")

# --- the tick counter wraps: virtual clock started just below the period ---
start = P - 250
k = new(start)
log = []


def wrap_sleeper(name, us):
    yield k.sleep_us(us)
    log.append((name, ticks_diff(k.now(), start)))


def wrap_periodic():
    t = k.now()
    for _ in range(6):
        t = ticks_add(t, 100)
        yield k.sleep_until(t)
        log.append(("p", ticks_diff(k.now(), start)))


k.spawn("a", 1, wrap_sleeper("a", 400))
k.spawn("b", 1, wrap_sleeper("b", 150))
k.spawn("p", 2, wrap_periodic())
k.run()
eq(log, [("p", 100), ("b", 150), ("p", 200), ("p", 300), ("p", 400), ("a", 400), ("p", 500), ("p", 600)],
   "timers order and fire correctly across the tick wrap")
check(k.now() < start, "the virtual clock really wrapped (now %d)" % k.now())

# the real clock wraps too: RealClock(start=) shifts ticks just below the period
rc = RealClock(P - 3000)
k = Kernel(rc, verbose=False)
marks = []


def real_sleeper():
    for _ in range(4):
        t0 = k.now()
        yield k.sleep_us(1000)
        marks.append(ticks_diff(k.now(), t0))


k.spawn("rs", 1, real_sleeper())
k.run()
eq(len(marks), 4, "real-clock sleeper woke 4 times")
check(min(marks) >= 1000, "each real sleep lasted at least 1000 µs: %r" % marks)
check(max(marks) < 50000, "and not absurdly long across the wrap: %r" % marks)
check(k.now() < P // 2, "the shifted real clock crossed the wrap")

# --- timeouts: 0 polls, >0 expires on time with TIMEOUT, FOREVER waits ---
k = new()
sem = Semaphore(k)
res = []


def taker():
    r = yield sem.take(0)
    res.append((r, k.now()))
    r = yield sem.take(500)
    res.append((r, k.now()))
    r = yield sem.take()
    res.append((r, k.now()))


def late_giver():
    yield k.sleep_us(2000)
    sem.give()


k.spawn("taker", 2, taker())
k.spawn("giver", 1, late_giver())
k.run()
eq(res, [(TIMEOUT, 0), (TIMEOUT, 500), (OK, 2000)], "timeout 0 polls, 500 expires at 500, forever waits for the give")

# --- join and exit status ---
k = new()
out = []


def returns():
    yield k.sleep_us(10)
    return 42


def raises_():
    yield
    raise ValueError("boom")


def forever():
    yield k.sleep_us(1000000)


def joiner(a, b, c):
    out.append((yield k.join(a)))
    out.append((yield k.join(b)))
    out.append((yield k.join(c, 100)))
    k.kill(c)
    out.append((yield k.join(c)))


ta = k.spawn("ret", 1, returns())
tb = k.spawn("raise", 1, raises_())
tc = k.spawn("forever", 1, forever())
k.spawn("joiner", 2, joiner(ta, tb, tc))
k.run()
eq(out, [DONE, FAILED, TIMEOUT, KILLED], "join resumes with DONE/FAILED/TIMEOUT/KILLED")
eq(ta.result, 42, "a returned value is the task's result")
check(isinstance(tb.exc, ValueError), "a failed task keeps its exception")
eq(k.totals[6], 1, "one fault counted")

# --- kill: ready, blocked (finally runs), and itself ---
k = new()
flags = []


def blocked():
    try:
        yield k.sleep_us(1000000)
    finally:
        flags.append("finally ran")


def self_killer():
    yield
    k.kill(k.current)
    flags.append("rest of slice runs")
    yield
    flags.append("never")


def spin():
    while True:
        k.charge(1)  # virtual time moves only when charged
        yield


tb = k.spawn("blocked", 1, blocked())
tr = k.spawn("ready", 1, spin())
ts = k.spawn("self", 2, self_killer())


def killer():
    yield k.sleep_us(10)
    k.kill(tb)
    k.kill(tr)


k.spawn("killer", 3, killer())
eq(k.run(), 0, "no task left alive")
eq(flags, ["rest of slice runs", "finally ran"], "self-kill ends at the yield; killing a sleeper runs its finally")
eq((tb.state, tr.state, ts.state), (KILLED, KILLED, KILLED), "all three killed")
check(k.thead is None, "the killed sleeper left the timer list")

# a task that registers a wait and ends (or kills itself) without yielding leaves no trace
k = new()
q2 = Queue(k, 1)


def blocks_then_returns():
    q2.get(100)  # registered as a getter and on the timer list...
    return 1  # ...then ends without yielding the call
    yield


def blocks_then_kills_itself():
    q2.get(100)
    k.kill(k.current)
    yield


def two_calls_without_yield():
    q2.put_nowait(5)
    q2.get()  # completes at once; the task must now yield it
    yield k.sleep_us(10)  # a second blocking call before that yield is a mistake


ta = k.spawn("ret", 1, blocks_then_returns())
tk = k.spawn("kill", 1, blocks_then_kills_itself())
tw = k.spawn("two", 1, two_calls_without_yield())
eq(k.run(), 0, "nothing left alive")
eq((ta.state, tk.state, tw.state), (FAILED, KILLED, FAILED), "a wait registered and not yielded fails the task; a self-kill is a kill")
check(q2.getters.head is None and k.thead is None, "no dead task left on the wait list or the timer list")
check(isinstance(tw.exc, SchedError) and "yield" in str(tw.exc) and "two" in str(tw.exc), "misuse names the task and says to yield the call: %s" % tw.exc)
check(isinstance(ta.exc, SchedError) and "task ret:" in str(ta.exc), "returning with a wait registered is the same misuse: %s" % ta.exc)
eq(k.totals[9], 0, "live-task count is exact")

# run(for_us) returns at the limit with the tasks still alive, and can be resumed
k = new()
ticks = []


def every_700():
    t = k.now()
    while True:
        t = ticks_add(t, 700)
        yield k.sleep_until(t)
        ticks.append(k.now())


k.spawn("p", 1, every_700())
eq(k.run(5000), 1, "the periodic task is still alive at the limit")
eq(k.now(), 5000, "the virtual clock idled exactly to the limit")
eq(ticks, [700 * i for i in range(1, 8)], "releases up to the limit")
k.run(1000)
eq(ticks[-1], 5600, "a second run continues the same grid")
eq(k.now(), 6000, "and stops at its own limit")

# the real clock's idle path sleeps and counts idle time
k = Kernel(RealClock(), verbose=False)


def nap():
    yield k.sleep_us(5000)


k.spawn("nap", 1, nap())
t0 = k.now()
k.run()
check(ticks_diff(k.now(), t0) >= 5000, "the run lasted the sleep")
check(k.totals[2] + 1000000 * k.totals[3] >= 4000, "most of it counted as idle: %d us" % k.totals[2])

# release frees a slot for reuse; a full kernel refuses with a SchedError
k = new(max_tasks=2)
t1 = k.spawn("one", 1, worker("x", 1))
k.spawn("two", 1, worker("y", 1))
e = raises(SchedError, k.spawn, "three", 1, worker("z", 1))
check("slots" in str(e), "full kernel says so: " + str(e))
raises(SchedError, k.release, t1)
k.run()
k.release(t1)
t3 = k.spawn("three", 1, worker("z", 1))
eq(t3.id, t1.id, "the released slot is reused")
eq(t3.state, READY, "a spawned task is ready")

# --- caller mistakes ---
k = new()
raises(SchedError, k.spawn, "bad", 99, worker("b", 1))
raises(SchedError, k.spawn, "bad", -1, worker("b", 1))
raises(SchedError, k.spawn, "notgen", 1, worker)
e = raises(SchedError, k.sleep_us, 10)
check("task" in str(e), "blocking outside a task is refused: " + str(e))
raises(SchedError, Kernel, VirtualClock(), 0)


negr = []


def neg():
    negr.append((yield k.sleep_us(-1)))
    negr.append(k.now())


t = k.spawn("neg", 1, neg())
k.run()
eq((t.state, negr), (DONE, [E_RANGE, 0]), "a negative sleep resumes at once with E_RANGE (a status, not an exception)")
eq(k.kill(t), E_STALE, "killing a finished task is E_STALE")
done()
