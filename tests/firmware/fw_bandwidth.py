# The bandwidth tracker on the firmware interpreters: charge / charge_copy / move count
# into the sliding window and the stats with the heap locked; admission blocks a task
# under a VirtualClock kernel and wakes it at exactly the start of the bucket where the
# window has room; counters carry on the 32-bit build; the cost model's integer figures.
from array import array
from fwtest import check, eq, raises, no_alloc, done, two_tier_profile, COST_JSON as COST
from firmware_py import board, bandwidth as bwm, compat
from firmware_py.bandwidth import KV_READ, KV_WRITE, WEIGHTS, IO, K_READ, K_WRITE, K_DMA, K_LINE
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel
from firmware_py.status import OK, E_RANGE, E_FULL, CARRY_N, INT_MAX, MAX_WAIT_US

# a two-tier board with the measured ESP32-S3 figures (docs/tiers.md)
PROFILE = two_tier_profile()
b = board.loads(PROFILE)
eq(b.tier("psram").cost.values()["write_bytes_per_s"], 56700000, "cost block parsed")
e = raises(board.BoardError, board.loads, PROFILE.replace('"line_bytes":{"value":32', '"line_bytes":{"value":33'), "c.json")
check("c.json: memory[1].cost.line_bytes.value: must be a power of two" == str(e), "one line naming the field: " + str(e))
e = raises(board.BoardError, board.loads, PROFILE.replace('"copy_bytes_per_s":{"value":22300000,"source":"m"}',
                                                          '"copy_bytes_per_s":{"value":22300000}'), "c.json")
check("c.json: memory[1].cost.copy_bytes_per_s.source: missing" == str(e), "a figure without a source: " + str(e))
clk = VirtualClock()
k = Kernel(clk, max_tasks=4)
bw = bwm.Bandwidth(b, kernel=k, window_us=16000, buckets=16)
SR = bw.tier_id("sram")
PS = bw.tier_id("psram")
eq(bw.cap[PS], 38600000 * 16000 // 1000000, "psram moves 617,600 B per 16 ms window")
audio = bw.add_category("audio")
eq(audio, 5, "a user category follows the five built-ins")
raises(bwm.BandwidthError, bw.add_category, "audio")
raises(bwm.BandwidthError, bw.tier_id, "hbm")
raises(bwm.BandwidthError, bw.set_budget, PS, KV_READ, 1001)
bw.apply_preset("psram")
eq(bw.budget[PS * bw.n_cat_max + KV_READ], 617600 * 400 // 1000, "preset: KV read 40 %")
eq(bw.budget[PS * bw.n_cat_max + IO], 617600 * 50 // 1000, "preset: I/O 5 %")
bw.set_budget(PS, audio, 100)

# --- charge: counts now, refusals change nothing ---
eq(bw.charge(PS, WEIGHTS, 1000), OK, "charge")
eq(bw.window(PS, WEIGHTS), 1000, "in the window")
eq(bw.charge(PS, 99, 1), E_RANGE, "no such category")
eq(bw.charge(7, WEIGHTS, 1), E_RANGE, "no such tier")
eq(bw.charge(PS, WEIGHTS, -1), E_RANGE, "negative bytes")
eq(bw.charge(PS, WEIGHTS, 1.5), E_RANGE, "a float is refused")
eq(bw.charge(PS, WEIGHTS, bwm.CHARGE_MAX + 1), E_RANGE, "over CHARGE_MAX")
eq(bw.window(PS), 1000, "refusals changed nothing")
eq(bw.charge_copy(PS, SR, KV_READ, 512), OK, "a copy is charged on both tiers")
eq(bw.window(PS, KV_READ) + bw.window(SR, KV_READ), 1024, "512 on each tier")
clk.charge(16000)
eq(bw.window(PS), 0, "a window later everything has left it")
eq(bw.report()["psram"]["all"]["bytes"], 1512, "totals keep it")

# --- heap-locked: charge, charge_copy, move, wait_us, snapshot over many buckets ---
snap = bw.new_snapshot()


def charges():
    for _ in range(300):
        bw.charge(PS, WEIGHTS, 1024)
        bw.charge_copy(PS, SR, KV_WRITE, 64)
        bw.charge(PS, 99, 1)  # refused, still no allocation
        bw.move(PS, K_READ, KV_READ, 256)
        bw.move_copy(PS, SR, 1, IO, 32)
        bw.wait_us(PS, IO, 100)
        bw.cost_us(PS, K_LINE, 4096)
        bw.cost_ns(SR, K_WRITE, 64)
        bw.utilization(PS)
        clk.charge(37)
    bw.snapshot(snap)


charges()
no_alloc("300 x charge / charge_copy / move / move_copy / wait_us / cost / snapshot", charges)
rep = bw.report()
eq(rep["psram"]["weights"]["bytes"], 1000 + 600 * 1024, "every weights byte counted")
eq(rep["psram"]["all"]["bytes"], rep["psram"]["weights"]["bytes"] + rep["psram"]["kv_write"]["bytes"]
   + rep["psram"]["kv_read"]["bytes"] + rep["psram"]["io"]["bytes"], "tier total is the sum of its categories")
eq(rep["sram"]["kv_write"]["bytes"], rep["psram"]["kv_write"]["bytes"], "copies count on both tiers")
eq(rep["psram"]["kv_read"]["refused"], 0, "nothing refused in the loop")
eq(rep["psram"]["weights"]["refused"], 3, "the three refused weights charges above are counted (-1, 1.5, too big)")
check(rep["psram"]["all"]["busy_us"] > 0, "priced transfers keep the tier busy")
o = (PS * (bw.n_cat + 1) + WEIGHTS) * bwm.NSNAP
eq(snap[o + bwm.P_WINDOW], bw.window(PS, WEIGHTS), "snapshot row: window")
eq(snap[o + bwm.P_BUDGET], bw.budget[PS * bw.n_cat_max + WEIGHTS], "snapshot row: budget")
check(len(bw.lines()) >= 3, "report lines")

# --- admission: a task over its budget sleeps until the window has room, exactly ---
k2 = Kernel(VirtualClock(), max_tasks=4)
bw2 = bwm.Bandwidth(b, kernel=k2, window_us=16000, buckets=16)
bud = bw2.set_budget(PS, IO, 50)  # 30,880 B per window
log = array("i", bytes(4 * 16))
n_log = array("i", [0])


def mover(n, rounds):
    for _ in range(rounds):
        rv = yield bw2.admit(PS, IO, n)
        i = n_log[0]
        log[i] = k2.now()
        log[i + 1] = rv
        n_log[0] = i + 2


k2.spawn("io", 1, mover(20000, 3))
k2.run()
eq(n_log[0], 6, "three admissions")
eq(log[0], 0, "the first fits at once")
eq(log[2], 16000, "the second waits until the first bucket leaves the window")
eq(log[4], 32000, "the third one window later")
eq(log[1] + log[3] + log[5], 0, "each resumes with OK")
r = bw2.report()["psram"]["io"]
eq(r["waits"], 2, "two throttled waits")
eq(r["wait_us"], 32000, "throttled time adds up")


def refused():
    rv = yield bw2.admit(PS, IO, bud + 1)
    log[0] = rv
    rv = yield bw2.admit(PS, 99, 1)
    log[1] = rv


k2.spawn("big", 1, refused())
k2.run()
eq(log[0], E_RANGE, "a request over the whole budget is refused (the caller splits it)")
eq(log[1], E_RANGE, "no such category")

# heap-locked admission: two tasks contend for one category, clocked by the kernel
k3 = Kernel(VirtualClock(), max_tasks=4)
bw3 = bwm.Bandwidth(b, kernel=k3, window_us=16000, buckets=16)
bw3.set_budget(PS, KV_READ, 10)  # 6,176 B per window
done_n = array("i", [0])


def reader(n):
    while True:
        rv = yield bw3.admit(PS, KV_READ, n)
        if rv == OK:
            done_n[0] += 1
        k3.charge(100)


def stopper(n):
    while True:
        for _ in range(n):
            yield k3.sleep_us(1000)
        k3.stop()


k3.spawn("r1", 1, reader(3000))
k3.spawn("r2", 1, reader(2000))
k3.spawn("stop", 2, stopper(200))
k3.run()
no_alloc("admission blocking and waking (2 readers, 200 ms)", k3.run)
r = bw3.report()["psram"]["kv_read"]
check(r["waits"] > 0, "readers were throttled: %d waits" % r["waits"])
check(r["peak"] <= bw3.budget[PS * bw3.n_cat_max + KV_READ], "admitted traffic never exceeds the budget in a window")
eq(done_n[0], 50, "one 3,000 + 2,000 B pair per 16 ms window of 6,176 B: 25 windows in 400 ms")

# --- E_FULL past the horizon: a category booked a whole window ahead ---
k4 = Kernel(VirtualClock(), max_tasks=8)
bw4 = bwm.Bandwidth(b, kernel=k4, window_us=16000, buckets=16, horizon=1)
bw4.set_budget(PS, IO, 50)
got = []


def hog(n):
    got.append((yield bw4.admit(PS, IO, n)))


for _ in range(4):
    k4.spawn("h", 1, hog(30000))
k4.run()
eq(sorted(got), [E_FULL, E_FULL, OK, OK], "two fit (now, one window on), two are past the horizon")

# --- counters carry on the 32-bit build ---
k5 = Kernel(VirtualClock(), max_tasks=2)
bw5 = bwm.Bandwidth(b, kernel=k5, window_us=16000, buckets=16)
for _ in range(70):
    bw5.charge(SR, WEIGHTS, bwm.CHARGE_MAX)
    k5.clock.charge(16000)
s = (SR * (bw5.n_cat_max + 1) + WEIGHTS) * bwm.NSTAT
eq(bw5.st[s + bwm.S_BYTES_G] * CARRY_N + bw5.st[s + bwm.S_BYTES], 70 * bwm.CHARGE_MAX, "bytes carry past 2**30")
check(bw5.st[s + bwm.S_BYTES] < CARRY_N, "low part below CARRY_N")

# --- cost model: integer figures from the profile ---


def near(got, want, what):
    # within 1 us: the coefficients are whole ns per KiB
    check(abs(got - want) <= 1, "%s: got %r, want %r" % (what, got, want))


near(bw.cost_us(PS, K_READ, 100000), 100000 * 1000000 // 38600000, "100 KB from PSRAM at 38.6 MB/s: 2,590 us")
eq(bw.cost_us(SR, K_READ, 0), 0, "nothing costs nothing")
eq(bw.cost_us(PS, 9, 10), E_RANGE, "no such kind")
eq(bw.copy_us(PS, SR, 0, 100000), bw.cost_us(PS, K_READ, 100000), "PSRAM to SRAM: the PSRAM side sets the pace")
near(bw.copy_us(PS, PS, 0, 100000), 100000 * 1000000 // 22300000, "PSRAM to PSRAM: the tier's copy figure, 22.3 MB/s")
near(bw.copy_us(PS, SR, 1, 100000), 100000 * 1000000 // 51000000, "PSRAM to SRAM by DMA: 51 MB/s")
near(bw.copy_us(SR, PS, 0, 100000), 100000 * 1000000 // 56700000, "SRAM to PSRAM: 56.7 MB/s")
eq(bw.cost_ns(PS, K_LINE, 64), 2 * (330 + (32 * 1000000000 + 73500000) // 147000000), "two 32 B lines at 330 ns + 147 MB/s")
eq(bw.cost_us(2, K_READ, 10), E_RANGE, "no third tier")
check(bw.cost_us(PS, K_DMA, bwm.CHARGE_MAX) > 0, "the largest transfer prices without overflow")

# --- contention: a transfer that starts while the tier is busy finishes later ---
k6 = Kernel(VirtualClock(), max_tasks=2)
bw6 = bwm.Bandwidth(b, kernel=k6)
a = bw6.occupy(PS, K_DMA, 51000)
c = bw6.occupy(PS, K_READ, 3860)
eq(c, a + bw6.cost_us(PS, K_READ, 3860), "the CPU read waits for the DMA in flight")
eq(bw6.report()["psram"]["all"]["stalls"], 1, "one stall counted")

# --- the decode's traffic: per layer and per token, heap-locked ---
k7 = Kernel(VirtualClock(), max_tasks=2)
bw7 = bwm.Bandwidth(b, kernel=k7)
tr = bwm.DecodeTraffic(bw7, 181760, 131584, 256, "psram", "psram")


def token_steps():
    for n in range(1, 41):
        for _ in range(5):
            us = tr.layer(n)
            k7.clock.charge(us)
        k7.clock.charge(tr.final())


token_steps()
no_alloc("DecodeTraffic: 40 tokens x 5 layers charged and priced", token_steps)
w = bw7.report()["psram"]
eq(w["weights"]["bytes"], 80 * (5 * 181760 + 131584), "weights bytes per token x tokens")
eq(w["kv_write"]["bytes"], 80 * 5 * 256, "one K/V row per layer per token")
eq(w["kv_read"]["bytes"], 2 * 5 * 256 * (40 * 41 // 2), "every cached row read by each attention pass")
eq(tr.layer(bwm.CHARGE_MAX), E_RANGE, "an attention pass over CHARGE_MAX bytes is refused, nothing charged")
eq(bw7.report()["psram"]["weights"]["bytes"], w["weights"]["bytes"], "... nothing")
# --- idle gaps: however long the tracker sits untouched, everything old has expired ---
CHUNK = (1 << 29) - 1  # the longest single clock step (half the ESP32's tick circle, less one)


def busy_tracker():
    # a tracker with a booked grant ahead (lg), the tier busy (busy) and a window full
    kk = Kernel(VirtualClock(), max_tasks=4)
    t = bwm.Bandwidth(b, kernel=kk, window_us=16000, buckets=16)
    bd = t.set_budget(PS, IO, 50)
    got = []

    def m():
        got.append(t.move(PS, K_READ, WEIGHTS, 600000))  # psram busy ~15.5 ms ahead
        got.append((yield t.admit(PS, IO, bd)))  # now
        got.append((yield t.admit(PS, IO, bd)))  # one window on: books a grant ahead

    kk.spawn("m", 1, m())
    kk.run()
    eq(got[1:], [OK, OK], "both admitted")
    t.charge(PS, IO, 0)  # the second admission booked: its grant lies ahead of this call
    return kk.clock, t


def idle(clk, t, gap, poll):
    # the clock moves `gap` us in steps of at most CHUNK; poll: t.poll() after each step
    idle_steps(clk, t, gap // CHUNK, gap % CHUNK, poll)


def idle_steps(clk, t, n, rest, poll):
    # n steps of CHUNK then one of rest (small ints only: runs with the heap locked)
    for _ in range(n):
        clk.charge(CHUNK)
        if poll:
            t.poll()
    clk.charge(rest)
    if poll:
        t.poll()


def expired(t, what):
    eq(t.window(PS), 0, what + ": the old window has left")
    eq(t.wait_us(PS, IO, 100), 0, what + ": wait_us 0")
    eq(t.occupy(PS, K_READ, 100), t.cost_us(PS, K_READ, 100), what + ": the tier is idle (no stale busy mark)")
    eq(t.admit_nowait(PS, IO, 100), OK, what + ": admitted now (no stale grant)")
    eq(t.window(PS), 100, what + ": only the new bytes in the window")


# untouched in between: any gap below 2**30 us is read exactly
for gap, what in ((600000000, "10 min untouched"), ((1 << 29) + 5000, "just past half the circle, untouched"),
                  ((1 << 30) - 1, "2**30 - 1 us untouched")):
    clk_i, t_i = busy_tracker()
    idle(clk_i, t_i, gap, False)
    expired(t_i, what)
# polled (at least once per 2**30 us): any gap at all, whole tick periods included
PERIOD = compat.TICKS_PERIOD if compat.TICKS_PERIOD <= 1 << 30 else 1 << 30  # 2**62 on the 64-bit port
for gap, what in ((1 << 30, "2**30 us (17.9 min) polled"), (1 << 31, "2**31 us polled"),
                  (3 * PERIOD, "three tick periods polled"), (5 * PERIOD + 12345, "five periods and a bit, polled")):
    clk_i, t_i = busy_tracker()
    idle(clk_i, t_i, gap, True)
    expired(t_i, what)
# the same through the kernel: poll_task keeps a board that idles for 2.5 tick circles exact
k8 = Kernel(VirtualClock(), max_tasks=4)
bw8 = bwm.Bandwidth(b, kernel=k8, window_us=16000, buckets=16)
bw8.set_budget(PS, IO, 50)
res8 = array("i", bytes(4 * 4))


def idler():
    bw8.move(PS, K_READ, WEIGHTS, 600000)
    bw8.charge(PS, IO, 30000)
    for _ in range(5):
        yield k8.sleep_us(MAX_WAIT_US)
    res8[0] = bw8.window(PS)
    res8[1] = bw8.occupy(PS, K_READ, 100)
    res8[2] = bw8.admit_nowait(PS, IO, 30000)
    k8.stop()


k8.spawn("poll", 0, bw8.poll_task())
k8.spawn("idle", 1, idler())
k8.run()
eq(res8[0], 0, "poll_task: the window is empty after 5 x MAX_WAIT_US idle")
eq(res8[1], bw8.cost_us(PS, K_READ, 100), "poll_task: the tier is idle")
eq(res8[2], OK, "poll_task: admitted at once")
raises(bwm.BandwidthError, bw8.poll_task, 0)  # at the call, not when the task first runs
clk_l, t_l = busy_tracker()
L_N, L_REST = (1 << 31) // CHUNK, (1 << 31) % CHUNK  # 2**31 is a boxed int on the 32-bit build


def long_idle():
    idle_steps(clk_l, t_l, L_N, L_REST, True)
    t_l.admit_nowait(PS, IO, 100)
    t_l.occupy(PS, K_READ, 100)


no_alloc("2**31 us idle with polls, then admit_nowait / occupy", long_idle)
eq(t_l.window(PS), 100, "... and it read the gap right")

# --- per-tier sums: nine categories at their bucket limit never push the tier past 2**30 ---
k9 = Kernel(VirtualClock(), max_tasks=2)
bw9 = bwm.Bandwidth(b, kernel=k9, window_us=16000, buckets=16, user_categories=4)
for i in range(4):
    bw9.add_category("u%d" % i)
M = bw9.bucket_max
refused9 = array("i", [0])


def fill9():
    for _ in range(16):
        k9.clock.charge(bw9.bucket_us)
        for cat in range(bw9.n_cat):
            if bw9.charge(SR, cat, bwm.CHARGE_MAX) < 0:
                refused9[0] += 1
            if bw9.charge(SR, cat, M - bwm.CHARGE_MAX) < 0:
                refused9[0] += 1
    bw9.charge_copy(SR, SR, KV_READ, bwm.CHARGE_MAX)  # refused: the bucket is full


fill9()
no_alloc("charges at the tier's bucket limit (refused E_RANGE)", fill9)
tw = bw9.twin[SR]
check(0 <= tw <= INT_MAX, "the tier's window sum stays a small int: %d" % tw)
r9 = bw9.report()["sram"]["all"]
check(0 <= r9["peak"] <= INT_MAX and r9["peak"] == 16 * M, "the tier's peak: 16 buckets at bucket_max: %d" % r9["peak"])
check(refused9[0] > 0, "charges past the tier's bucket limit are refused")
eq(bw9.charge(SR, 5, 1), E_RANGE, "one byte more in a full bucket: E_RANGE")
eq(bw9.twin[SR], tw, "... nothing changed")

# --- the cost model never returns more than 2**30 - 1 ---
SLOW = ('{"name":"slow","kind":"flash","bytes":1048576,"bandwidth_bytes_per_s":15625,"latency_ns":100,'
        '"dma":true,"source":"s","cost":%s}'
        % (COST % (15625, 15625, 15625, 31250, 4, 999000, 4000000)))
bs = board.loads(PROFILE.replace('],"thermal"', ',' + SLOW + '],"thermal"'))
cs = bwm.Bandwidth(bs, clock=VirtualClock())
SL = cs.tier_id("slow")
eq(cs.cost_us(SL, K_READ, bwm.CHARGE_MAX), E_RANGE, "16 MiB at 15.6 kB/s: 2**30 us, over the limit: E_RANGE")
u = cs.cost_us(SL, K_READ, bwm.CHARGE_MAX - 1000)
check(0 < u <= INT_MAX, "just under: priced (%d us)" % u)
eq(cs.cost_us(SL, K_LINE, bwm.CHARGE_MAX), E_RANGE, "4 B lines at ~1 ms each: E_RANGE, not a boxed int")
check(0 < cs.cost_us(SL, K_LINE, 4000) <= INT_MAX, "a few lines price")
check(0 < cs.cost_us(SL, K_DMA, bwm.CHARGE_MAX) <= INT_MAX, "16 MiB by DMA at 31.25 kB/s prices")
eq(cs.copy_us(SL, SL, 1, bwm.CHARGE_MAX), E_RANGE, "twice that on one tier: over the limit, E_RANGE")
eq(cs.occupy(SL, K_READ, bwm.CHARGE_MAX - 1000), u, "the tier busy ~17.9 min")
eq(cs.occupy(SL, K_READ, 1000), E_RANGE, "a transfer ending 2**30 us or more from now is refused")
eq(cs.move(SL, K_READ, WEIGHTS, 1000), E_RANGE, "move: refused before it charges")
eq(cs.window(SL), 0, "... nothing charged")
eq(cs.move_copy(SL, PS, 0, WEIGHTS, 1000), E_RANGE, "move_copy: the same")
eq(cs.window(PS), 0, "... nothing charged")
cs.clock.charge(CHUNK)
check(cs.occupy(SL, K_READ, 1000) > 0, "half a circle later the tier frees sooner: priced")

# --- carry_ns (opt-in): many small transfers sum to their exact time ---
ns = bw.cost_ns(PS, K_DMA, 128)
eq(ns, 2839, "a 128 B DMA burst on PSRAM: 2,839 ns")
eq(bw.cost_us(PS, K_DMA, 128), 2, "cost_us rounds it down to 2 us (unchanged)")
cur = [None]  # the tracker bursts() drives
last = array("i", [0])


def bursts():
    t = cur[0]
    for _ in range(1000):
        last[0] = t.occupy(PS, K_DMA, 128)


for flag, want in ((False, 1000 * 2), (True, 1000 * ns // 1000)):
    bc = bwm.Bandwidth(b, clock=VirtualClock(), carry_ns=flag)
    cur[0] = bc
    no_alloc("1000 x occupy, carry_ns=%s" % flag, bursts)
    eq(last[0], want, "1000 back-to-back 128 B bursts end at %d us (carry_ns=%s)" % (want, flag))
    eq(bc.cost_us(PS, K_DMA, 128), 2, "cost_us unchanged with carry_ns=%s" % flag)
bc = bwm.Bandwidth(b, clock=VirtualClock(), carry_ns=True)
tot = 0
for _ in range(500):
    tot = bc.move_copy(PS, SR, 1, IO, 100)
eq(tot, 500 * bc.cost_ns(PS, K_DMA, 100) // 1000, "copies carry on the tier that sets their pace")

# --- DecodeTraffic: a piece the tracker refuses moved nothing and is counted in refused only:
# no status in the totals, the µs returned are the moved pieces' ---
k9 = Kernel(VirtualClock(), max_tasks=2)
bw9 = bwm.Bandwidth(b, kernel=k9)
tr9 = bwm.DecodeTraffic(bw9, 181760, 131584, 256, "psram", "psram")
eq(bw9.charge(PS, IO, bwm.CHARGE_MAX), OK, "half the bucket")
eq(bw9.charge(PS, IO, bw9.bucket_max - bwm.CHARGE_MAX - 300), OK, "the bucket 300 B short of bucket_max")
r9 = [0] * 8


def refused_layer():
    r9[0] = tr9.layer(4)  # weights (181,760 B) and the read (1,024 B) refused, the 256 B row fits
    r9[1] = tr9.final()  # refused
    r9[2] = tr9.layer(1.0)
    r9[3] = tr9.layer(bwm.CHARGE_MAX // 256 + 1)


no_alloc("DecodeTraffic layer / final with pieces the tracker refuses", refused_layer)
want9 = bw9.cost_us(PS, K_WRITE, 256)
eq((r9[0], r9[1], r9[2], r9[3]), (want9, 0, E_RANGE, E_RANGE), "the moved row's µs; 0 for the refused final; bad n")
eq((tr9.refused, tr9.bytes_w, tr9.bytes_kv, tr9.us, tr9.s), (3, 0, 256, want9, 0),
   "refused pieces counted in refused only: no bytes, no µs, no status in the totals")
eq(bw9.report()["psram"]["kv_write"]["bytes"], 256, "the tracker holds the row's bytes only")
k9.clock.advance(10 * bw9.window_us)  # the window empties
tr9.refused = INT_MAX - 1
tr9.bytes_w = CARRY_N - 1
tr9.bytes_w_g = INT_MAX
tr9.bytes_kv = CARRY_N - 1
tr9.bytes_kv_g = INT_MAX - 1
tr9.us = 999999
tr9.s = INT_MAX - 1


def traffic_limits():
    r9[4] = tr9.layer(4)
    r9[5] = tr9.layer(CHARGE_MAX // 256)  # the read piece itself refused (bucket)
    r9[6] = tr9.layer(bwm.CHARGE_MAX // 256)


CHARGE_MAX = bwm.CHARGE_MAX
no_alloc("DecodeTraffic totals at their limits", traffic_limits)
check(r9[4] > 0 and r9[5] >= 0 and r9[6] >= 0, "moved pieces' µs: %r" % r9[4:7])
eq((tr9.bytes_w_g, tr9.bytes_w, tr9.bytes_kv_g, tr9.bytes_kv < CARRY_N, tr9.s, tr9.us, tr9.refused),
   (INT_MAX, CARRY_N - 1, INT_MAX, True, INT_MAX, 999999, INT_MAX), "bytes carry then saturate, seconds and refusals saturate")

# charged=True (the caller's admission charged the bytes): a refused occupy books no time,
# the bytes are counted as given
k10 = Kernel(VirtualClock(), max_tasks=2)
bw10 = bwm.Bandwidth(b, kernel=k10)
tr10 = bwm.DecodeTraffic(bw10, 1000, 0, 256, "psram", "psram")
bw10.busy[PS] = INT_MAX - 2  # the tier busy so long that every occupy ends past 2**30 µs
eq((tr10.layer(2, True), tr10.refused, tr10.bytes_w, tr10.bytes_kv, tr10.us), (0, 3, 1000, 768, 0),
   "charged: refused occupies add no time, the admitted bytes are counted")

# --- charge_copy refusals for bad arguments are counted like charge's (the (src, cat) row) ---
k11 = Kernel(VirtualClock(), max_tasks=2)
bw11 = bwm.Bandwidth(b, kernel=k11)
r11 = [0] * 6


def copy_refusals():
    r11[0] = bw11.charge_copy(PS, 9, IO, 100)  # bad dst: counted (src and cat valid)
    r11[1] = bw11.charge_copy(PS, SR, IO, -1)  # bad n: counted
    r11[2] = bw11.charge_copy(PS, SR, IO, 1.0)  # a float n: counted
    r11[3] = bw11.charge_copy(PS, SR, 99, 100)  # bad category: no row to count in
    r11[4] = bw11.charge_copy(1.0, SR, IO, 100)  # bad src: no row
    r11[5] = bw11.charge(PS, IO, -1)  # charge: counted the same way


no_alloc("charge_copy refusals", copy_refusals)
eq(r11, [E_RANGE] * 6, "all E_RANGE")
rep11 = bw11.report()
eq((rep11["psram"]["io"]["refused"], rep11["sram"]["io"]["refused"]), (4, 0), "counted in (src, cat) as charge's")

# --- the tracker's carries and µs totals at their limits ---
k12 = Kernel(VirtualClock(), max_tasks=2)
bw12 = bwm.Bandwidth(b, kernel=k12)
row12 = (PS * (bw12.n_cat_max + 1) + IO) * bwm.NSTAT
tot12 = (PS * (bw12.n_cat_max + 1) + bw12.n_cat_max) * bwm.NSTAT
bw12.st[row12 + bwm.S_BYTES] = CARRY_N - 1
bw12.st[row12 + bwm.S_BYTES_G] = INT_MAX
bw12.st[tot12 + bwm.S_BYTES] = CARRY_N - 1
bw12.st[tot12 + bwm.S_BYTES_G] = INT_MAX - 1
bw12.st[tot12 + bwm.S_BUSY_US] = 999999
bw12.st[tot12 + bwm.S_BUSY_S] = INT_MAX - 1


def tracker_limits():
    bw12.move(PS, K_READ, IO, 100000)
    bw12.move(PS, K_READ, IO, 100000)


no_alloc("tracker bytes and busy time at their limits", tracker_limits)
st12 = bw12.st
eq((st12[row12 + bwm.S_BYTES_G], st12[row12 + bwm.S_BYTES]), (INT_MAX, CARRY_N - 1), "a saturated row stays at its top")
eq(st12[tot12 + bwm.S_BYTES_G], INT_MAX, "the tier's row carried into its last _g value")
eq((st12[tot12 + bwm.S_BUSY_S], st12[tot12 + bwm.S_BUSY_US]), (INT_MAX, 999999), "busy seconds saturated")
done()
