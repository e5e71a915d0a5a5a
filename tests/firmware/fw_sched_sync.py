# Queues, semaphores, event flags and direct notifications: values, blocking both ways,
# wait order by priority, timeouts, and the caller mistakes that get a SchedError.
from fwtest import eq, raises, done
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, Queue, Semaphore, EventFlags, SchedError, TIMEOUT, OK, E_FULL, E_RANGE


def new():
    return Kernel(VirtualClock(), verbose=False)


# --- object queue: FIFO, full put blocks until a get, empty get blocks until a put ---
k = new()
q = Queue(k, 2)
log = []


def producer():
    for i in range(5):
        r = yield q.put(i)
        log.append(("put", i, r, k.now()))


def consumer():
    yield k.sleep_us(100)
    for _ in range(5):
        v = yield q.get()
        log.append(("get", v, k.now()))
        yield k.sleep_us(10)


k.spawn("prod", 1, producer())
k.spawn("cons", 1, consumer())
k.run()
eq([e for e in log if e[0] == "get"], [("get", i, 100 + 10 * i) for i in range(5)], "items come out in order")
eq([e[3] for e in log if e[0] == "put"], [0, 0, 100, 110, 120], "puts beyond capacity wait for a free slot")
eq(q.count, 0, "queue drained")

# put timeout when full; get timeout when empty; nowait forms
k = new()
q = Queue(k, 1)
res = []


def tmo():
    res.append((yield q.put("a", 50)))
    res.append((yield q.put("b", 50)))
    res.append(k.now())
    res.append((yield q.get(0)))
    res.append((yield q.get(30)))
    res.append(k.now())


k.spawn("t", 1, tmo())
k.run()
eq(res, [OK, TIMEOUT, 50, "a", TIMEOUT, 80], "full put and empty get time out at their timeouts")
eq(q.get_nowait(), TIMEOUT, "get_nowait on empty returns what get(0) resumes with")
eq((q.put_nowait(1), q.put_nowait(2)), (OK, TIMEOUT), "put_nowait stores, then TIMEOUT when full (as put(x, 0))")
eq(q.count, 1, "the refused put changed nothing")

# getters are served highest priority first, FIFO within a priority; direct handoff
k = new()
q = Queue(k, 4)
order = []


def getter(name):
    v = yield q.get()
    order.append((name, v))


def putter():
    yield k.sleep_us(10)
    for i in range(3):
        q.put_nowait(i)
    yield


k.spawn("lowA", 1, getter("lowA"))
k.spawn("high", 3, getter("high"))
k.spawn("lowB", 1, getter("lowB"))
k.spawn("put", 2, putter())
k.run()
eq(order, [("high", 0), ("lowA", 1), ("lowB", 2)], "waiting getters served by priority then arrival")

# copy queue: items are copied in (the source can be reused at once) and out
k = new()
q = Queue(k, 2, 4)
got = []


def cprod():
    buf = bytearray(4)
    for i in range(4):
        for j in range(4):
            buf[j] = i * 10 + j
        yield q.put(buf)  # buf is rewritten right after: the queue holds a copy


def ccons():
    out = bytearray(4)
    yield k.sleep_us(5)
    for _ in range(4):
        r = yield q.get(100, into=out)
        got.append((r, bytes(out)))


k.spawn("p", 1, cprod())
k.spawn("c", 1, ccons())
k.run()
eq(got, [(OK, bytes([i * 10, i * 10 + 1, i * 10 + 2, i * 10 + 3])) for i in range(4)], "copy queue keeps each item's bytes")
raises(SchedError, Queue, k, 0)
eq(q.put_nowait(b"ab"), E_RANGE, "a copy-mode item shorter than item_size is refused with E_RANGE")
eq(q.count, 0, "and nothing was stored")
eq(q.get_nowait(), E_RANGE, "a copy-mode get without into= is E_RANGE")
eq(q.get_nowait(into=bytearray(2)), E_RANGE, "as is a short into=")

# --- semaphores ---
k = new()
b = Semaphore(k)  # binary, empty
c = Semaphore(k, 2, 3)  # counting
eq((b.give(), b.give()), (OK, E_FULL), "binary give saturates at 1")
eq((b.take_nowait(), b.take_nowait()), (OK, TIMEOUT), "one token, then TIMEOUT (as take(0))")
eq((c.give(), c.give()), (OK, E_FULL), "counting saturates at its maximum")
eq(c.count, 3, "three tokens")
raises(SchedError, Semaphore, k, 2, 1)
raises(SchedError, Semaphore, k, 0, 0)
taken = []


def t(name):
    r = yield b.take(1000)
    taken.append((name, r, k.now()))


def g():
    for _ in range(2):
        yield k.sleep_us(100)
        b.give()


k.spawn("lo", 1, t("lo"))
k.spawn("hi", 2, t("hi"))
k.spawn("lo2", 1, t("lo2"))
k.spawn("g", 3, g())
k.run()
eq(taken, [("hi", OK, 100), ("lo", OK, 200), ("lo2", TIMEOUT, 1000)], "binary semaphore wakes by priority; the last times out")

# --- event flags: any, all, clear on exit, value seen, timeout ---
k = new()
ev = EventFlags(k)
seen = []


def any_waiter():
    seen.append(("any", (yield ev.wait(0b110)), k.now()))


def all_waiter():
    seen.append(("all", (yield ev.wait(0b011, wait_all=True, clear=True)), k.now()))


def tmo_waiter():
    seen.append(("tmo", (yield ev.wait(0b1000, 300)), k.now()))  # timeout_us is the second argument of every wait


def setter():
    yield k.sleep_us(100)
    ev.set(0b001)  # satisfies nobody
    yield k.sleep_us(100)
    ev.set(0b010)  # satisfies any(110) and all(011)
    yield


k.spawn("any", 1, any_waiter())
k.spawn("all", 1, all_waiter())
k.spawn("tmo", 1, tmo_waiter())
k.spawn("set", 2, setter())
k.run()
eq(sorted(seen), [("all", 0b011, 200), ("any", 0b011, 200), ("tmo", TIMEOUT, 300)], "any/all wake on the right set; timeout")
eq(ev.bits, 0, "the all-waiter cleared its bits on exit")
ev.set(0b101)
ev.clear(0b100)
eq(ev.bits, 0b001, "clear removes bits")
eq((ev.set(1 << 24), ev.set(-1)), (E_RANGE, E_RANGE), "bits outside the low 24 are refused")
eq(ev.bits, 0b001, "and change nothing")
eq(ev.wait_nowait(0b001), 0b001, "wait_nowait returns the bits as wait(mask, 0) would")
eq(ev.wait_nowait(0b100), TIMEOUT, "or TIMEOUT")
eq(ev.wait_nowait(0), E_RANGE, "an empty mask is E_RANGE")

# already-set bits satisfy a wait without blocking
k = new()
ev = EventFlags(k)
ev.set(0b1)
r = []


def immediate():
    r.append((yield ev.wait(0b1, clear=True)))
    r.append(k.now())


k.spawn("i", 1, immediate())
k.run()
eq(r, [1, 0], "set bits complete the wait at once")
eq(ev.bits, 0, "and are cleared on exit")

# --- direct notifications ---
k = new()
res = []


def waiter():
    res.append((yield k.wait_notify()))
    res.append((yield k.wait_notify(0)))
    res.append((yield k.wait_notify(50)))
    res.append(k.now())
    res.append((yield k.wait_notify()))


def notifier():
    yield k.sleep_us(10)
    k.notify(w, 0b01)
    k.notify(w, 0b10)  # still pending: bits accumulate until the waiter runs
    yield k.sleep_us(100)
    k.notify(w, 4)


w = k.spawn("w", 2, waiter())
k.spawn("n", 1, notifier())
k.run()
eq(res, [1, 2, TIMEOUT, 60, 4], "first notify wakes; the second accumulates and is taken at once; timeout; later value")
done()
