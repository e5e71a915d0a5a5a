# The thermal guard on the virtual clock: a ModelTemp driven by the kernel's measured
# load crosses shrink_c (KV budgets shrink) and throttle_c (decode pauses after each
# token), leaves each with hysteresis when the load stops, counts every change; the
# per-sample path does not allocate.
from fwtest import check, eq, raises, no_alloc, done
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel
from firmware_py.thermal import Guard, ModelTemp, ThermalError, NORMAL, SHRINK, SLOW

# --- the model alone: constant load converges on ambient + rise * load ---
clk = VirtualClock()
m = ModelTemp(clk, ambient_c=25, rise_c=40, tau_us=10000000)
eq(m.read_mc(), 25000, "starts at ambient")
m.set_load(500)
clk.charge(100000000)  # 10 tau
t = m.read_mc()
check(44500 <= t <= 45000, "10 tau at half load: within 0.5 C of 45 C (%d)" % t)
m.set_load(0)
clk.charge(10000000)  # 1 tau
t1 = m.read_mc()
check(31000 <= t1 <= 33000, "one tau of cooling covers ~63 %% of the way (%d)" % t1)
raises(ThermalError, ModelTemp, clk, 25, 40, 10)
raises(ThermalError, ModelTemp, clk, 25.0)
raises(ThermalError, ModelTemp, clk, 25, 40, 10000000, 1.5)  # start_c a float
raises(ThermalError, ModelTemp, clk, 25, 40, 10000000, 10 ** 7)  # start_c past the integer bound

# --- the guard in a kernel: busy 90 % -> hot -> SLOW; the load stops -> NORMAL ---
clk = VirtualClock()
k = Kernel(clock=clk, verbose=False)
src = ModelTemp(clk, ambient_c=40, rise_c=60, tau_us=5000000)  # 90 % load -> 94 C
g = Guard(k, src, throttle_c=85, shrink_c=65, hysteresis_c=3, period_us=250000)
seen = []
g.on_event = lambda st, mc: seen.append((st, mc // 1000))
busy_on = [True]


def busy():
    while busy_on[0]:
        k.charge(900)
        yield k.sleep_us(100)


def control():
    yield k.sleep_us(60000000)  # one minute hot
    hot = g.state
    busy_on[0] = False
    yield k.sleep_us(60000000)  # one minute idle
    seen.append(("hot", hot))
    k.stop()


k.spawn("busy", 1, busy())
k.spawn("guard", 3, g.task())
k.spawn("control", 2, control())
k.run()
states = [s for s, _ in seen if s != "hot"]
eq(states, [SHRINK, SLOW, SHRINK, NORMAL], "normal -> shrink -> slow, then back down in order")
eq(seen[-1], ("hot", SLOW), "hot after a busy minute")
check(seen[0][1] >= 65 and seen[1][1] >= 85, "each threshold crossed at or above it: %r" % seen)
check(seen[2][1] < 85 - 3 + 1 and seen[3][1] < 65 - 3 + 1, "left only below the hysteresis: %r" % seen)
eq(g.events, 4, "four state changes counted")
eq((g.entered[SHRINK], g.entered[SLOW]), (2, 1), "entries per state")
check(g.peak_mc >= 90000, "peak near 94 C (%d)" % g.peak_mc)
eq(g.state, NORMAL, "cool again")

# --- actions ---
g.state = SHRINK
eq(g.budget(512), 256, "shrink: half the KV budget")
eq(g.pause_us(10000), 0, "shrink does not slow decode")
g.state = SLOW
eq(g.pause_us(10000), 10000, "slow: sleep as long as the token took")
eq(g.budget(1), 1, "a budget never shrinks below one token")
eq(g.budget(0), -5, "a zero budget is E_RANGE")
eq(g.budget(3.0), -5, "a float budget is E_RANGE")
eq((g.budget(True), g.budget(2 ** 30)), (-5, -5), "a bool or a budget past 2**30 - 1 is E_RANGE")
eq(g.budget(0x3FFFFFFF), 0x3FFFFFFF // 100 * 50 + 0x3FFFFFFF % 100 * 50 // 100, "the largest budget halves without a big product")
eq((g.pause_us(1.5), g.pause_us(True), g.pause_us(None), g.pause_us(-1)), (-5,) * 4, "pause_us refuses non-ints and negatives")
eq(g.pause_us(0x3FFFFFFF), 10000000, "a very long token counts as 10 s")
g.state = NORMAL
eq(g.budget(512), 512, "normal: the budget asked for")
eq(g.pause_us(10000), 0, "normal: no pause")


def per_sample():
    g.sample()
    g.budget(512)
    g.budget(0x3FFFFFFF)
    g.pause_us(1000)
    g.pause_us(0x3FFFFFFF)
    src.read_mc()


g.on_event = None
no_alloc("guard sample, budget, pause and the model's read", per_sample)
g.samples = g.events = 0x3FFFFFFF
g.entered[SHRINK] = g.entered[NORMAL] = g.entered[SLOW] = 0x3FFFFFFF
src.t_mc = 90000


def saturated():
    g.sample()
    src.t_mc = 20000
    g.sample()


no_alloc("guard counters at 2**30 - 1 stay there", saturated)
eq((g.samples, g.events, g.entered[SLOW], g.entered[NORMAL]), (0x3FFFFFFF,) * 4, "saturated, not past 2**30 - 1")

# --- the band edges: entered at the threshold, left only at or below threshold - hysteresis ---
class Fixed:
    v = 0

    def read_mc(self):
        return self.v

    def set_load(self, p):
        pass


for sh, thr, hy in ((65, 85, 3), (65, 66, 3), (10, 11, 5), (65, 85, 0)):
    fx = Fixed()
    gg = Guard(k, fx, throttle_c=thr, shrink_c=sh, hysteresis_c=hy)
    for st in (NORMAL, SHRINK, SLOW):
        for t in list(range((sh - hy - 2) * 1000, (thr + 2) * 1000 + 1, 500)) + [(thr - hy) * 1000, (sh - hy) * 1000]:
            gg.state = st
            fx.v = t
            if t >= thr * 1000 or (st == SLOW and t > (thr - hy) * 1000):
                want = SLOW
            elif t >= sh * 1000 or (st != NORMAL and t > (sh - hy) * 1000):
                want = SHRINK
            else:
                want = NORMAL
            eq(gg.sample(), want, "shrink %d throttle %d hyst %d from %d at %d mC" % (sh, thr, hy, st, t))

# --- configuration mistakes: one-line errors ---
raises(ThermalError, Guard, k, src, 85, 90)  # shrink above throttle
raises(ThermalError, Guard, k, src, 85, 65, 3, 0)  # shrink_pct 0
raises(ThermalError, Guard, k, src, 85, 65, 3, 50, 100, 10)  # period too short
raises(ThermalError, Guard, k, src, 85.0)
done()
