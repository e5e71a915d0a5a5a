# The two clocks behind the kernel: VirtualClock moves only when charged or idled to a
# deadline (and wraps with the tick counter); RealClock follows ticks_us, can be shifted
# just below the wrap, sleeps in idle() and spins in charge().
from fwtest import check, eq, raises, no_alloc, done
from firmware_py import compat
from firmware_py.clock import RealClock, VirtualClock, ClockError
from firmware_py.compat import ticks_diff, ticks_add, ticks_us

P = compat.TICKS_PERIOD

# --- virtual ---
v = VirtualClock(100)
eq(v.now(), 100, "starts where told")
v.charge(250)
eq(v.now(), 350, "charge moves time by the work done")
v.idle(1000)
eq(v.now(), 1000, "idle jumps to the deadline")
v.idle(500)
eq(v.now(), 1000, "idle never moves time back")
eq(v.idle_jumps, 1, "one jump counted")
v.advance(5)
eq(v.now(), 1005, "advance is charge")
raises(ClockError, v.charge, -1)
w = VirtualClock(P - 10)
w.charge(25)
eq(w.now(), 15, "virtual time wraps at the tick period")
eq(ticks_diff(w.now(), P - 10), 25, "and ticks_diff still measures 25 across it")
w.idle(ticks_add(w.now(), 1000))
eq(ticks_diff(w.now(), P - 10), 1025, "idle target across the wrap")


def virtual_ops():
    v.charge(3)
    v.now()
    v.idle(ticks_add(v.now(), 7))


no_alloc("VirtualClock now/charge/idle", virtual_ops)

# --- real ---
r = RealClock()
a = r.now()
b = ticks_us()
check(0 <= ticks_diff(b, a) < 10000, "unshifted RealClock reads ticks_us")
t0 = r.now()
r.charge(2000)
d = ticks_diff(r.now(), t0)
check(2000 <= d < 200000, "charge spins at least the time asked: %d us" % d)
t0 = r.now()
r.idle(ticks_add(t0, 3000))  # may return a little early (ms sleep); the kernel loops
r.idle(ticks_add(t0, 3000))
r.idle(ticks_add(t0, 3000))
d = ticks_diff(r.now(), t0)
check(2000 <= d < 200000, "idle waits toward the deadline: %d us" % d)
s = RealClock(P - 1500)
x = s.now()
check(ticks_diff(x, P - 1500) < 10000 and ticks_diff(x, P - 1500) >= 0, "shifted clock starts just below the wrap")
s.idle(ticks_add(x, 3000))
s.idle(ticks_add(x, 3000))
s.idle(ticks_add(x, 3000))
y = s.now()
check(y < x, "the shifted real clock wrapped (%d -> %d)" % (x, y))
check(ticks_diff(y, x) >= 2000, "and ticks_diff measures the time across the wrap: %d" % ticks_diff(y, x))
raises(ClockError, r.charge, -5)


def real_ops():
    r.now()
    s.now()
    r.charge(5)
    r.idle(ticks_add(r.now(), 20))


no_alloc("RealClock now/charge/idle", real_ops)
done()
