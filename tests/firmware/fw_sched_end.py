# A task that ends in a slice during which other tasks' timeouts fell due: the timers are
# served first (as on the yield path), so a joiner or a mutex waiter whose timeout came
# before the end times out, and is not woken by the end or handed the mutex (issue 17,
# item 5). Every way a task can end: return, raise, kill itself, the watchdog's stop and
# the not-yielded blocking call.
from fwtest import eq, done
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, Mutex, Queue, TIMEOUT, DONE, FAILED, KILLED, E_RANGE, E_STALE


def ending(how):
    # worker holds a mutex, sleeps 1 us, then burns 26 us and ends (how); a joiner (timeout
    # 10 us) and a locker (11 us) wait for it. Returns (log, worker's end state)
    k = Kernel(VirtualClock(), verbose=False, watchdog_us=20 if how == "watchdog" else 0)
    m = Mutex(k)
    q = Queue(k, 1)
    log = []

    def worker():
        m.lock_nowait()
        yield k.sleep_us(1)
        if how == "watchdog":
            k.clock.t += 26  # burns past the watchdog with no kernel call: stopped at the slice's end
        else:
            k.charge(26)
        if how == "raise":
            raise ValueError("worker failed")
        if how == "kill":
            k.kill(k.current)
            yield
        if how == "unyielded":
            q.get()  # a blocking call not yielded, then the generator returns

    def joiner():
        r = yield k.join(w, 10)
        log.append(("join", k.now(), r))

    def locker():
        r = yield m.lock(11)
        log.append(("lock", k.now(), r))

    w = k.spawn("w", 2, worker())
    k.spawn("j", 1, joiner())
    k.spawn("l", 1, locker())
    k.run()
    return log, w.state


for how, st in (("return", DONE), ("raise", FAILED), ("kill", KILLED), ("watchdog", FAILED), ("unyielded", FAILED)):
    log, state = ending(how)
    eq(state, st, "worker ended by %s" % how)
    eq(sorted(log), [("join", 27, TIMEOUT), ("lock", 27, TIMEOUT)],
       "ended by %s: the joiner's and the locker's timeouts fell due first" % how)

# the other way round: a timeout after the end is not served early, the end wakes the joiner
k = Kernel(VirtualClock(), verbose=False)
m = Mutex(k)
log = []


def worker2():
    m.lock_nowait()
    yield k.sleep_us(1)
    k.charge(5)


def joiner2():
    r = yield k.join(w2, 10)
    log.append(("join", k.now(), r))


def locker2():
    r = yield m.lock(11)
    log.append(("lock", k.now(), r))
    m.unlock()


w2 = k.spawn("w", 2, worker2())
k.spawn("j", 1, joiner2())
k.spawn("l", 1, locker2())
k.run()
eq(sorted(log), [("join", 6, DONE), ("lock", 6, 0)], "an end before the timeouts wakes the joiner and hands on the mutex")

# a task of another kernel is refused by notify, notify_give, join and kill (E_RANGE, as
# notify_from_isr already was): nothing is marked ready on lists its kernel never runs
k1 = Kernel(VirtualClock(), verbose=False)
k2 = Kernel(VirtualClock(), verbose=False)
got = []


def waiter1():
    v = yield k1.wait_notify(50)
    got.append(("woke", k1.now(), v))


def other2():
    got.append(("join", (yield k2.join(w1, 5))))
    yield


w1 = k1.spawn("w1", 1, waiter1())
k2.spawn("o2", 1, other2())
eq(k2.notify(w1, 1), E_RANGE, "notify of another kernel's task")
eq(k2.notify_give(w1), E_RANGE, "notify_give of another kernel's task")
eq(k2.notify(None, 1), E_RANGE, "notify of something that is no task")
eq(k2.notify_from_isr(w1, 1), E_RANGE, "notify_from_isr of another kernel's task (as before)")
eq(k2.kill(w1), E_RANGE, "kill of another kernel's task")
k2.run()
eq(got, [("join", E_RANGE)], "join of another kernel's task returns E_RANGE at once")
k1.run()
eq(got[-1], ("woke", 50, TIMEOUT), "the other kernel's task was never notified: it times out on its own kernel")
eq(w1.nval, 0, "and its notification value was never touched")
eq((k1.notify(w1, 1), k1.kill(w1)), (E_STALE, E_STALE), "its own kernel still answers E_STALE once it has finished")
done()
