# The kernel's exact semantics (issue 7 section 2), one block per finding: kill against
# every wait kind (a killed task never runs again), due timers ahead of the yielder,
# handed items and tokens given back when the woken task is killed, blocking calls that
# are not yielded, uniform arguments, counting notifications, Mutex priority
# inheritance, the watchdog on the virtual clock and through its timer-callback path.
from fwtest import check, eq, done
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, Queue, Semaphore, Mutex, EventFlags, SchedError, WatchdogError, \
    TIMEOUT, OK, E_FULL, E_RANGE, E_STATE, E_STALE, DONE, FAILED, KILLED, T_BITES, T_TASKS, T_ISR_DROPPED, \
    T_ISR_REFUSED, NTOT, MAX_WAIT_US
from array import array


def new(**kw):
    return Kernel(VirtualClock(), verbose=False, **kw)


# --- (a) a task killed while blocked in wait_notify never runs again ---
k = new()
ran = []


def notified():
    ran.append("start")
    v = yield k.wait_notify()
    ran.append(("woke", v))  # must never happen


def killer_then_notifier():
    yield k.sleep_us(10)
    eq(k.kill(w), OK, "kill of a task blocked in wait_notify")
    eq(k.notify(w, 1), E_STALE, "a later notify of the killed task is refused")
    eq(k.notify_give(w), E_STALE, "so is a counting notify")
    yield


w = k.spawn("w", 2, notified())
k.spawn("kn", 1, killer_then_notifier())
eq(k.run(), 0, "run() returns 0: no task alive")
eq((w.state, ran), (KILLED, ["start"]), "the killed waiter stays KILLED and never ran again")

# kill against every wait kind: the victim never runs again, every object is left clean
k = new(max_tasks=12)
q = Queue(k, 1)
qf = Queue(k, 1)
qf.put_nowait("full")
s = Semaphore(k)
ev = EventFlags(k)
m = Mutex(k)
after = []


def victim(name, wait):
    yield wait()
    after.append(name)


def holder():
    yield m.lock()
    yield k.sleep_us(1000)
    m.unlock()


hold = k.spawn("holder", 3, holder())
sleeper = k.spawn("sleep", 1, victim("sleep", lambda: k.sleep_us(500)))
waits = [
    k.spawn("qget", 1, victim("qget", lambda: q.get())),
    k.spawn("qput", 1, victim("qput", lambda: qf.put("x", 800))),
    k.spawn("sem", 1, victim("sem", lambda: s.take(800))),
    k.spawn("event", 1, victim("event", lambda: ev.wait(1, 800))),
    k.spawn("join", 1, victim("join", lambda: k.join(sleeper))),
    k.spawn("notify", 1, victim("notify", lambda: k.wait_notify(800))),
    k.spawn("mutex", 2, victim("mutex", lambda: m.lock(800))),
    sleeper,
]


def kill_all():
    yield k.sleep_us(100)
    eq(hold.prio, 3, "holder keeps its own priority (3 > waiter 2)")
    for t in waits:
        eq(k.kill(t), OK, "kill " + t.name)
    q.put_nowait(1)
    s.give()
    ev.set(1)
    for t in waits:
        k.notify(t, 1)
    yield k.sleep_us(2000)


k.spawn("killer", 4, kill_all())
eq(k.run(), 0, "nothing left alive")
eq(after, [], "no killed waiter ever ran again")
eq([t.state for t in waits], [KILLED] * len(waits), "every one ends KILLED")
check(q.getters.head is None and qf.putters.head is None and s.waiters.head is None and ev.waiters.head is None
      and m.waiters.head is None and k.thead is None, "no killed task left on a wait list or the timer list")
eq((q.count, s.count, qf.count, m.owner), (1, 1, 1, None), "the put, the give and the lock after the kills went to the objects")
eq(k.totals[T_TASKS], 0, "live-task count exact")

# --- (b) a timer that falls due during an equal-priority slice runs before the yielder ---
k = new()
order = []


def sleeper_b():
    yield k.sleep_us(50)
    order.append(("sleeper", k.now()))


def worker_b():
    for _ in range(3):
        k.charge(100)  # the sleeper falls due at 50, during this slice
        order.append(("worker", k.now()))
        yield


k.spawn("sleeper", 1, sleeper_b())
k.spawn("worker", 1, worker_b())
k.run()
eq(order, [("worker", 100), ("sleeper", 100), ("worker", 200), ("worker", 300)],
   "the timer due at 50 joined the ready list before the worker was requeued at 100")

# a timeout that has passed is a timeout even if nothing switched since
k = new()
s = Semaphore(k)
res = []


def taker_b():
    res.append((yield s.take(50)))


def late_giver_b():
    yield  # the taker blocks first
    k.charge(80)  # its timeout passes during this slice
    res.append(s.give())  # the give comes after the timeout: it is counted, not handed
    yield


k.spawn("taker", 1, taker_b())
k.spawn("giver", 1, late_giver_b())
k.run()
eq(res, [OK, TIMEOUT], "the give after the timeout leaves the token; the taker resumes with TIMEOUT")
eq(s.count, 1, "the token is in the semaphore")

# --- (c) direct handoff: a woken task killed before it runs gives back what it was handed ---
k = new()
q = Queue(k, 2)
got = []


def getter_c(name):
    v = yield q.get()
    got.append((name, v))


def putter_c():
    yield k.sleep_us(10)
    q.put_nowait("a")  # handed to g1 (first waiter)
    q.put_nowait("b")  # handed to g2
    k.kill(g1)  # g1 never ran: "a" goes to the next waiter, g3
    eq(q.put_nowait("c"), TIMEOUT, "handed items still count against capacity until their getter runs")
    yield


g1 = k.spawn("g1", 1, getter_c("g1"))
g2 = k.spawn("g2", 1, getter_c("g2"))
g3 = k.spawn("g3", 1, getter_c("g3"))
k.spawn("put", 2, putter_c())
k.run()
eq(sorted(got), [("g2", "b"), ("g3", "a")], "the item handed to the killed getter went to the next getter")

k = new()
q = Queue(k, 2)
q2got = []


def getter_c2():
    q2got.append((yield q.get()))


def putter_c2():
    yield k.sleep_us(10)
    q.put_nowait("first")  # handed to the getter
    q.put_nowait("second")  # queued
    k.kill(gk)
    q2got.append(q.get_nowait())
    q2got.append(q.get_nowait())
    yield


gk = k.spawn("g", 1, getter_c2())
k.spawn("p", 2, putter_c2())
k.run()
eq(q2got, ["first", "second"], "with no getter left the item returns to the front of the queue")

k = new()
s = Semaphore(k)
sres = []


def taker_c(name):
    sres.append((name, (yield s.take(1000))))


def giver_c():
    yield k.sleep_us(10)
    eq(s.give(), OK, "give hands the token to the first taker")
    eq(s.give(), E_FULL, "a binary semaphore whose token is handed is full")
    k.kill(t1)
    yield


t1 = k.spawn("t1", 1, taker_c("t1"))
t2 = k.spawn("t2", 1, taker_c("t2"))
k.spawn("g", 2, giver_c())
k.run()
eq(sres, [("t2", OK)], "the killed taker's token went to the next taker")

k = new()
m = Mutex(k)
mres = []


def owner_c():
    yield m.lock()
    yield k.sleep_us(10)
    m.unlock()  # ownership handed to w1
    k.kill(w1)  # w1 never ran: ownership passes to w2
    yield


def locker_c(name):
    r = yield m.lock()
    mres.append((name, r, m.owner.name))
    m.unlock()


k.spawn("owner", 2, owner_c())
w1 = k.spawn("w1", 1, locker_c("w1"))
k.spawn("w2", 1, locker_c("w2"))
k.run()
eq(mres, [("w2", OK, "w2")], "the mutex handed to the killed waiter passed to the next one")
eq(m.owner, None, "and is free at the end")

# --- (d) a blocking call written without yield fails the task with a SchedError naming it ---
k = new()
q = Queue(k, 2)
q.put_nowait(7)
q.put_nowait(8)


def forgot_yield():
    v = q.get()  # missing `yield`: v is BLOCK, not the item
    yield
    return v


def forgot_then_called():
    q.get()  # completes at once (an item is there) but is not yielded
    yield k.sleep_us(10)  # the next kernel call notices


def forgot_then_blocked():
    k.wait_notify()  # blocks and is not yielded
    return 1
    yield


a = k.spawn("lazy", 1, forgot_yield())
b = k.spawn("caller", 1, forgot_then_called())
c = k.spawn("returner", 1, forgot_then_blocked())
k.run()
for t in (a, b, c):
    eq(t.state, FAILED, "task %s failed" % t.name)
    check(isinstance(t.exc, SchedError) and ("task %s:" % t.name) in str(t.exc), "the SchedError names it: %s" % t.exc)
eq(q.count, 0, "an unyielded get that completed at once took its item (the task fails; the item is not restored)")
k = new()
try:
    k.sleep_us(1)
    check(False, "blocking outside a task must raise")
except SchedError as e:
    check("outside a task" in str(e), "blocking outside a task: " + str(e))

# --- (e) uniform arguments: timeout_us second everywhere; nowait == blocking(0) ---
k = new()
ev = EventFlags(k)
er = []


def uniform():
    t0 = k.now()
    er.append((yield ev.wait(1, 500)))  # timeout 500, not wait_all=500
    er.append(k.now() - t0)
    er.append((yield k.join(k.current, 0)))  # joining itself: E_STATE (join has no nowait twin)


k.spawn("u", 1, uniform())
k.run()
eq(er, [TIMEOUT, 500, E_STATE], "ev.wait(1, 500) times out at 500; join(itself, 0) is E_STATE")


# nowait == blocking(0), each pair compared in the same state: two identical fresh
# setups, the blocking call with 0 in one, the nowait twin in the other
def setup(kind, k):
    # (object, blocking call with timeout 0, its nowait twin) for one state of one kind
    if kind == "get empty":
        o = Queue(k, 1)
        return o, lambda: o.get(0), o.get_nowait
    if kind == "get one":
        o = Queue(k, 1)
        o.put_nowait(5)
        return o, lambda: o.get(0), o.get_nowait
    if kind == "put room":
        o = Queue(k, 1)
        return o, lambda: o.put(1, 0), lambda: o.put_nowait(1)
    if kind == "put full":
        o = Queue(k, 1)
        o.put_nowait(9)
        return o, lambda: o.put(1, 0), lambda: o.put_nowait(1)
    if kind == "take none":
        o = Semaphore(k)
        return o, lambda: o.take(0), o.take_nowait
    if kind == "take one":
        o = Semaphore(k, 1)
        return o, lambda: o.take(0), o.take_nowait
    if kind == "wait unset":
        o = EventFlags(k)
        return o, lambda: o.wait(1, 0), lambda: o.wait_nowait(1)
    if kind == "wait set":
        o = EventFlags(k)
        o.set(3)
        return o, lambda: o.wait(1, 0, clear=True), lambda: o.wait_nowait(1, clear=True)
    if kind == "lock free":
        o = Mutex(k)
        return o, lambda: o.lock(0), o.lock_nowait
    o = Mutex(k)  # "lock own": the caller already holds it
    return o, lambda: o.lock(0), o.lock_nowait


KINDS = ("get empty", "get one", "put room", "put full", "take none", "take one", "wait unset", "wait set",
         "lock free", "lock own")
pairs = []


def pair_task(kind, blocking, k):
    o, blk, nw = setup(kind, k)
    if kind == "lock own":
        o.lock_nowait()
    if blocking:
        r = yield blk()
    else:
        r = nw()
        yield
    pairs.append((kind, blocking, r, repr(getattr(o, "count", getattr(o, "bits", None)))))


for kind in KINDS:
    res = []
    for blocking in (True, False):
        k = new()
        k.spawn("p", 1, pair_task(kind, blocking, k))
        k.run()
        res.append(pairs.pop()[2:])
    eq(res[0], res[1], "%s: the nowait twin returns what the blocking call with 0 resumes with, same state after" % kind)

# --- (f) counting notifications: give increments, take clears or decrements ---
k = new()
nres = []


def counter_f():
    nres.append((yield k.take_notify(clear=False)))  # 3 pending: returns 3, leaves 2
    nres.append((yield k.take_notify(0, clear=False)))  # 2 -> 1
    nres.append((yield k.take_notify()))  # 1 -> cleared
    nres.append((yield k.take_notify(100)))  # nothing: TIMEOUT
    nres.append((yield k.take_notify()))  # blocks until the next give


def giver_f():
    for _ in range(3):
        k.notify_give(cf)
    yield k.sleep_us(500)
    k.notify_give(cf)


cf = k.spawn("counter", 1, counter_f())
k.spawn("giver", 2, giver_f())
k.run()
eq(nres, [3, 2, 1, TIMEOUT, 1], "ulTaskNotifyTake semantics: value before the decrement/clear")

# --- (f) mutex with priority inheritance (not recursive) ---
k = new()
m = Mutex(k)
log = []


def low_f():
    yield m.lock()
    log.append(("low locked", low.prio))
    yield k.sleep_us(100)  # high arrives meanwhile and waits for m
    log.append(("low holds, runs at", low.prio))
    k.charge(50)
    yield  # with mid ready, low still runs first: it inherited 3
    log.append(("low before unlock", low.prio))
    m.unlock()
    log.append(("low after unlock", low.prio))
    yield
    log.append(("low end", low.prio))


def mid_f():
    yield k.sleep_us(120)
    for _ in range(2):
        log.append(("mid", k.now()))
        k.charge(10)
        yield


def high_f():
    yield k.sleep_us(50)
    r = yield m.lock()
    log.append(("high locked", r, k.now()))
    m.unlock()


low = k.spawn("low", 1, low_f())
k.spawn("mid", 2, mid_f())
k.spawn("high", 3, high_f())
k.run()
eq(log, [("low locked", 1), ("low holds, runs at", 3), ("low before unlock", 3), ("low after unlock", 1),
         ("high locked", OK, 150), ("mid", 150), ("mid", 160), ("low end", 1)],
   "low inherits high's priority while it holds m (mid cannot run in between), falls back on unlock")

# the inherited priority falls back when the waiter gives up (timeout)
k = new()
m = Mutex(k)
seen = []


def owner_t():
    yield m.lock()
    yield k.sleep_us(100)
    seen.append(own.prio)  # high waited with timeout 50: gone by now
    m.unlock()


def high_t():
    yield k.sleep_us(10)  # the owner has locked m by now
    seen.append(own.prio)
    seen.append((yield m.lock(50)))
    seen.append(own.prio)


def observer_t():
    yield k.sleep_us(30)
    seen.append(own.prio)  # while high waits: inherited


own = k.spawn("owner", 1, owner_t())
k.spawn("high", 3, high_t())
k.spawn("observer", 0, observer_t())
k.run()
eq(seen, [1, 3, TIMEOUT, 1, 1], "after the waiter's timeout the owner is back at its own priority")

# --- (h) watchdog: a task that never yields is stopped and named, on the virtual clock ---
k = Kernel(VirtualClock(), verbose=True, watchdog_us=1000)
beats = []


def hog_h():
    while True:
        k.charge(100)  # never yields
    yield  # (makes this a generator)


def fine_h():
    for _ in range(3):
        k.charge(900)
        beats.append(k.now())
        yield


print("(a watchdog report for task hog is expected below)")
hog = k.spawn("hog", 1, hog_h())
fine = k.spawn("fine", 1, fine_h())
k.run()
eq((hog.state, fine.state), (FAILED, DONE), "the hog is stopped, the other task runs to the end")
check(isinstance(hog.exc, WatchdogError), "with the watchdog's exception: %r" % hog.exc)
eq(k.totals[T_BITES], 1, "one bite counted")
eq(beats, [2000, 2900, 3800], "the hog was stopped at its first charge past 1000 us")


def swallow_h():
    while True:
        try:
            k.charge(600)
        except WatchdogError:
            yield  # even caught, the slice ends past the watchdog: stopped


k = Kernel(VirtualClock(), verbose=False, watchdog_us=1000)
sw = k.spawn("swallow", 1, swallow_h())
k.run()
eq(sw.state, FAILED, "a task catching the watchdog's exception is stopped at the slice's end")

# the timer-callback path (machine.Timer on a board) names the culprit mid-slice
k = Kernel(VirtualClock(), verbose=False, watchdog_us=1000)
named = []


def spinner_h():
    k.clock.t += 1500  # time passes with no kernel call (a pure-Python loop)
    k._wd_check(None)  # what the board's timer callback does
    named.append(k.bitten.name if k.bitten is not None else None)
    yield


sp = k.spawn("spinner", 1, spinner_h())
k.run()
eq((named, sp.state), (["spinner"], FAILED), "the timer check names the running task; the kernel stops it")


# ...and handled: its next kernel call raises the watchdog's exception into it, so the
# hog stops there instead of running on to the slice's end
k = Kernel(VirtualClock(), verbose=False, watchdog_us=1000)
sem = Semaphore(k, 0, 10)
hlog = []


def hog_h():
    k.clock.t += 1500
    k._wd_check(None)
    try:
        sem.give()  # a kernel call after the bite
        hlog.append("gave")
    except WatchdogError:
        hlog.append("stopped at its next kernel call")
        raise
    yield


hg = k.spawn("hog", 1, hog_h())
k.run()
eq((hlog, hg.state, sem.count, k.bitten), (["stopped at its next kernel call"], FAILED, 0, None),
   "the named hog is stopped at its next kernel call, which does nothing")
check(isinstance(hg.exc, WatchdogError), "it ends with the watchdog's exception: %r" % hg.exc)

# --- (i) a killed task's finally runs as the victim: it cannot lock or block for the killer ---
k = new()
m = Mutex(k)
klog = []


def victim_i():
    try:
        yield k.sleep_ms(100)
    finally:
        klog.append(("victim lock_nowait", m.lock_nowait()))
        klog.append(("current in finally is the victim", k.current is vi))
        yield k.sleep_us(10)  # a blocking call in cleanup: raises into the victim


def killer_i():
    yield
    klog.append(("kill", k.kill(vi)))
    klog.append(("killer owns m", m.owner is ki))
    klog.append(("m owner", m.owner))
    yield
    klog.append("killer runs again")


vi = k.spawn("victim", 1, victim_i())
ki = k.spawn("killer", 1, killer_i())
eq(k.run(), 0, "both end")
eq(klog, [("victim lock_nowait", E_STATE), ("current in finally is the victim", True), ("kill", OK),
          ("killer owns m", False), ("m owner", None), "killer runs again"],
   "the victim's cleanup cannot take the mutex; the killer owns nothing and keeps running")
eq((vi.state, ki.state, ki.exc), (KILLED, DONE, None), "victim KILLED, killer DONE without an exception")
check(isinstance(vi.exc, SchedError) and "victim" in str(vi.exc), "the cleanup's blocking call is the victim's error: %r" % vi.exc)
eq(k.current, None, "current restored after the close")

# --- (j) waits beyond MAX_WAIT_US (2**29 - 1 us) are refused with E_RANGE, never wrap ---
k = new()
wres = []


def long_waits():
    t0 = k.now()
    wres.append((yield k.sleep_ms(600000)))  # 10 min
    wres.append((yield k.sleep_us(MAX_WAIT_US + 1)))
    wres.append((yield Queue(k, 1).get(600000000)))
    wres.append((yield Semaphore(k).take(MAX_WAIT_US + 1)))
    wres.append((yield k.wait_notify(1 << 40)))
    wres.append(k.now() - t0)  # all refused at once
    wres.append((yield k.sleep_us(MAX_WAIT_US)))  # the longest sleep works
    wres.append(k.now() - t0)


k.spawn("lw", 1, long_waits())
k.run()
eq(wres, [E_RANGE, E_RANGE, E_RANGE, E_RANGE, E_RANGE, 0, OK, MAX_WAIT_US],
   "sleeps and timeouts past MAX_WAIT_US resume with E_RANGE at once; MAX_WAIT_US itself sleeps exactly")
k = new()
e = None
try:
    k.run(600000000)
except SchedError as x:
    e = x
check(e is not None and "for_us" in str(e), "run(600 s) is refused with a one-line SchedError: %r" % e)

# --- (k) bad interrupt posts are refused when posted, never raise out of run() ---
k = new()
qc = Queue(k, 2, item_size=4)
evk = EventFlags(k)
tk = k.spawn("t", 1, (lambda: (yield))())
eq((qc.put_from_isr(bytearray(4)), k.notify_from_isr(None, 1), k.notify_from_isr(tk, 0), k.notify_give_from_isr(7),
    evk.set_from_isr(1 << 30), k.notify_from_isr(tk, 1.5)),
   (E_STATE, E_RANGE, E_RANGE, E_RANGE, E_RANGE, E_RANGE), "copy-mode queue, bad targets and bits refused at post time")
eq(k.isr.tail, k.isr.head, "nothing recorded")
eq(k.run(), 0, "run() returns normally")
eq(k.isr.refused, 6, "each refusal counted")

# --- (l) drops and refusals are reported: snapshot_totals and the kernel's stats line ---
k = Kernel(VirtualClock(), verbose=False, isr_slots=2)
sl = Semaphore(k, 0, 1)
eq([sl.give_from_isr() for _ in range(2)], [OK, E_FULL], "a ring of 2 holds 1 post")
k.spawn("t", 1, (lambda: (yield))())
sl.count = 1  # the applied give will be refused (at maximum)
k.run()
tot = array("i", bytes(4 * NTOT))
k.snapshot_totals(tot)
eq((tot[T_ISR_DROPPED], tot[T_ISR_REFUSED]), (1, 1), "snapshot_totals: one drop, one refusal")
check("isr applied 1 refused 1 dropped 1" in k.stats_lines()[-1], "the kernel line reports them: %s" % k.stats_lines()[-1])

cl = []
# --- (m) a task's own exception is kept when it also left a blocking call unyielded ---
k = new()
sz = Semaphore(k, 1)


def raiser():
    sz.take()  # not yielded, completes at once
    cl.append(1 // 0)  # the task's own exception
    yield


rz = k.spawn("rz", 1, raiser())
k.run()
eq((rz.state, type(rz.exc).__name__), (FAILED, "ZeroDivisionError"), "the real exception, not the misuse message")

# --- (n) EventFlags.clear serves the timers due by now, as every service ---
k = new()
evn = EventFlags(k)
cl = []


def timed_waiter():
    cl.append((yield evn.wait(1, 100)))


def clearer():
    k.charge(200)  # the waiter's timeout passes during this slice
    evn.clear(1)
    cl.append(("waiter served", tw.state != 3))  # BLOCKED is 3
    yield


tw = k.spawn("tw", 2, timed_waiter())
k.spawn("cl", 1, clearer())
k.run()
eq(cl, [("waiter served", True), TIMEOUT], "clear() served the due timeout before returning")
done()
