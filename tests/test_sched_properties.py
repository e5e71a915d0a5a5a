# Property tests of the kernel on CPython (hypothesis): timer order across the tick wrap,
# queue FIFO under random timing, and replay determinism for random workloads.
from hypothesis import given, settings
from hypothesis import strategies as st

from firmware_py import compat
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, Queue, TIMEOUT, OK

P = compat.TICKS_PERIOD


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=20), st.integers(0, 6000))
def test_sleepers_wake_in_time_order_across_the_wrap(durations, before_wrap):
    start = (P - before_wrap) % P
    k = Kernel(VirtualClock(start), max_tasks=len(durations), verbose=False)
    woke = []

    def sleeper(i, us):
        yield k.sleep_us(us)
        woke.append((compat.ticks_diff(k.now(), start), i))

    for i, us in enumerate(durations):
        k.spawn("s%d" % i, 1, sleeper(i, us))
    k.run()
    assert woke == sorted((us, i) for i, us in enumerate(durations))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=30), st.lists(st.integers(0, 300), min_size=1, max_size=30),
       st.integers(1, 4))
def test_queue_delivers_every_item_once_in_order(put_gaps, get_gaps, cap):
    k = Kernel(VirtualClock(), verbose=False)
    q = Queue(k, cap)
    n = len(put_gaps)
    got = []

    def producer():
        for i, gap in enumerate(put_gaps):
            yield k.sleep_us(gap)
            assert (yield q.put(i)) == OK

    def consumer():
        j = 0
        while len(got) < n:
            v = yield q.get(10000)
            assert v is not TIMEOUT
            got.append(v)
            yield k.sleep_us(get_gaps[j % len(get_gaps)])
            j += 1

    p = k.spawn("p", 1, producer())
    c = k.spawn("c", 2, consumer())
    k.run()
    assert p.exc is None and c.exc is None
    assert got == list(range(n))


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 400), st.integers(0, 2000)), min_size=1, max_size=12))
def test_same_inputs_same_event_sequence(spec):
    def once():
        k = Kernel(VirtualClock(777), max_tasks=len(spec), priorities=4, verbose=False)
        ev = []
        k.on_switch = lambda t, task: ev.append((t, task.name))

        def work(charge, sleep):
            for _ in range(3):
                k.charge(charge)
                yield k.sleep_us(sleep)

        for i, (prio, charge, sleep) in enumerate(spec):
            k.spawn("t%d" % i, prio, work(charge, sleep))
        k.run()
        return ev, k.stats_lines()

    assert once() == once()
