# The deferred interrupt path: *_from_isr calls record into a preallocated ring that
# the run loop applies at the next switch, in order, allocating nothing. The unix port
# has no machine.Timer, so interrupts come from a second thread through
# micropython.schedule (compat.schedule), with the main thread's heap locked; a board
# uses machine.Timer / pin callbacks on the same calls. Also the new hot paths of the
# kernel under heap_lock: mutex with priority inheritance, counting notifications, the
# watchdog's check on every charge.
import time

from fwtest import check, eq, no_alloc, done
from array import array
from firmware_py import compat
from firmware_py.clock import RealClock, VirtualClock
from firmware_py.sched import Kernel, Queue, Semaphore, Mutex, EventFlags, OK, E_FULL, TIMEOUT, T_FAULTS
from firmware_py.status import CARRY_N

try:
    import _thread
except ImportError:
    _thread = None

# --- the ring itself: order, full, drop count, applied through the normal services ---
k = Kernel(VirtualClock(), verbose=False, isr_slots=4)
s = Semaphore(k, 0, 10)
q = Queue(k, 4)
ev = EventFlags(k)
order = []


def waiter():
    order.append(("q", (yield q.get())))
    order.append(("ev", (yield ev.wait(0b10))))
    order.append(("n", (yield k.take_notify())))


w = k.spawn("w", 1, waiter())
k.run()  # w blocks in q.get; nothing timed, no source attached: run returns
eq(k.run(), 1, "w waits")
eq((q.put_from_isr(11), ev.set_from_isr(0b10), k.notify_give_from_isr(w)), (OK, OK, OK), "three posts fit")
eq(s.give_from_isr(), E_FULL, "a ring of 4 slots holds 3 posts: the fourth is refused")
eq(k.isr.dropped, 1, "and counted as dropped")
eq((q.count, ev.bits, w.nval), (0, 0, 0), "nothing is applied before the next switch")
k.run()
eq(order, [("q", 11), ("ev", 0b10), ("n", 1)], "applied in posting order at the next switch")
eq((k.isr.applied, k.isr.refused), (3, 0), "three applied, none refused")

# --- interrupts from another thread via micropython.schedule, main heap locked ---
N = 100
if _thread is None:
    print("SKIP no _thread on this port: the ring is tested directly above")
else:
    k = Kernel(RealClock(), verbose=False)
    sem = Semaphore(k, 0, N)
    got = array("i", [0, 0])  # gives taken, timeouts
    state = array("i", [0])  # 1 once the thread has posted all

    def on_irq(_arg):
        # the "interrupt handler": runs on the main thread between bytecodes
        sem.give_from_isr()

    def irq_thread(n, sched=compat.schedule, irq=on_irq, sleep_ms=time.sleep_ms if compat.IS_MICROPYTHON else None):
        for _ in range(n):
            while True:
                try:
                    sched(irq, 0)
                    break
                except RuntimeError:  # micropython.schedule queue full: retry
                    pass
            if sleep_ms is not None:
                sleep_ms(1)
            else:
                time.sleep(0.001)
        state[0] = 1

    def consumer():
        while got[0] < N:
            r = yield sem.take(500000)
            if r == OK:
                got[0] += 1
            else:
                got[1] += 1
        k.isr.detach()

    k.spawn("consumer", 2, consumer())
    k.isr.attach()  # an interrupt source: run() idles for it instead of returning
    _thread.start_new_thread(irq_thread, (N,))
    no_alloc("gives from interrupt context (thread -> schedule -> ring -> switch)", k.run)
    eq((got[0], got[1]), (N, 0), "every give from the other thread reached the task, none timed out")
    eq(k.isr.dropped, 0, "nothing dropped")
    eq(k.totals[T_FAULTS], 0, "no task faulted")

# --- mutex with priority inheritance, counting notifications, watchdog check: no allocation ---
ROUNDS = 200
k = Kernel(VirtualClock(), verbose=False, watchdog_us=100000, max_tasks=6)
m = Mutex(k)
n = array("i", [0, 0])


def low_m():
    while True:
        yield m.lock()
        k.charge(5)  # the watchdog checks on every charge
        yield k.sleep_us(10)  # high arrives and waits: low inherits its priority
        m.unlock()
        yield


def high_m():
    while True:
        yield k.sleep_us(5)
        r = yield m.lock(1000)
        if r == OK:
            n[0] += 1
            m.unlock()
        k.notify_give(counter_t)
        k.notify_give(counter_t)


def counter_m():
    while True:
        v = yield k.take_notify(1000, clear=False)
        if v is not TIMEOUT:
            n[1] += 1
        if n[0] >= ROUNDS:
            k.stop()


k.spawn("low", 1, low_m())
k.spawn("high", 3, high_m())
counter_t = k.spawn("counter", 2, counter_m())
k.run()
n[0] = n[1] = 0
no_alloc("mutex lock/unlock with inheritance, notify_give/take_notify, watchdog check", k.run)
check(n[0] >= ROUNDS and n[1] >= ROUNDS, "rounds under the lock: %d locks, %d takes" % (n[0], n[1]))
eq(k.totals[T_FAULTS], 0, "no task faulted")
# --- the ring's counters carry at CARRY_N (< 2**30): past it they would leave the 32-bit
# build's small ints and allocate on the switch path. Each set one below, bumped heap-locked
k = Kernel(VirtualClock(), verbose=False, isr_slots=2)
sc = Semaphore(k, 1, 1)  # at maximum: the applied give is refused
k.isr.applied = k.isr.refused = k.isr.dropped = CARRY_N - 1
k.spawn("t", 1, (lambda: (yield))())
res = [0, 0]


def post_and_run():
    res[0] = sc.give_from_isr()  # recorded
    res[1] = sc.give_from_isr()  # ring of 2 full: dropped
    k.run()


no_alloc("interrupt counters crossing CARRY_N (post, drop, drain, refusal)", post_and_run)
eq((res[0], res[1]), (OK, E_FULL), "one post fits, the second is dropped")
eq((k.isr.applied, k.isr.applied_g, k.isr.refused, k.isr.refused_g, k.isr.dropped, k.isr.dropped_g), (0, 1, 0, 1, 0, 1),
   "applied, refused and dropped each carried into their _g field")
done()
