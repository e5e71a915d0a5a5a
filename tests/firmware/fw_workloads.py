# The co-running workloads (firmware_py/workloads.py): configuration errors, the audio
# capture's deadline accounting (on time, late by a CPU hog, lost when its half was
# overwritten, late behind a PSRAM transfer in flight), the bytes landing where they
# should, Wi-Fi bursts paced by the tracker's window, and every period of both tasks
# (release, submit, wait, stats) with the heap locked.
from fwtest import check, eq, raises, no_alloc, done
from firmware_py import board, dma, workloads, bandwidth as bwm
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, T_FAULTS
from firmware_py.status import CARRY_N, INT_MAX

brd = board.load("boards/esp32s3_n8r8.json")


def fresh(slots=32):
    k = Kernel(VirtualClock(), max_tasks=8, verbose=True)
    bw = bwm.Bandwidth(brd, kernel=k)
    q = dma.DMAQueue(k, slots=slots, bw=bw, board=brd)
    ca = bw.add_category("audio")
    cw = bw.add_category("wifi")
    return k, bw, q, bw.tier_id("sram"), bw.tier_id("psram"), ca, cw


# --- configuration mistakes: WorkloadError (a ValueError), one line ---
k, bw, q, SR, PS, CA, CW = fresh()
raises(workloads.WorkloadError, workloads.AudioCapture, k, q, SR, PS, CA, 16000, 2, 15500)  # 496 B: not 32-aligned
raises(workloads.WorkloadError, workloads.AudioCapture, k, q, SR, PS, CA, 16000, 2, 16000, 1)  # one half
raises(workloads.WorkloadError, workloads.AudioCapture, k, q, SR, PS, CA, 16000, 2.0)
raises(workloads.WorkloadError, workloads.WifiBurst, k, q, PS, SR, CW, 1460)  # not a multiple of 32
e = raises(workloads.WorkloadError, workloads.WifiBurst, k, q, PS, SR, CW, 1472, 4, 100000, 0, 4, None, True)
check("\n" not in str(e), "one-line message")

# --- audio alone: every period on time, latency = its DMA's cost, bytes land ---
k, bw, q, SR, PS, CA, CW = fresh()
a = workloads.AudioCapture(k, q, SR, PS, CA, slots=4)
eq((a.nb, a.deadline_us), (512, 16000), "16 kHz x 16 bit x 16 ms = 512 B, deadline one half's fill time")
k.spawn("audio", 7, a.task())
q.spawn(6)
k.run(16000 * 10 + 100)
eq(a.st[workloads.A_PERIODS], 10, "ten periods")
eq(a.st[workloads.A_MISSES], 0, "none missed")
want = bw.cost_us(SR, bwm.K_DMA, 2 * dma.DESC_BYTES) + bw.copy_us(SR, PS, 1, 512)
eq(a.st[workloads.A_WORST_US], want, "latency: the descriptor fetch and the copy, by the cost model")
n_ok = 0
for j in range(4):
    p = a.landed[j]
    good = p >= 0
    for i in range(512):
        if a.ring[j * 512 + i] != a.sample(p, i):
            good = False
    n_ok += good
eq(n_ok, 4, "every PSRAM slot holds the samples of the period that landed there")


# --- a task that holds the CPU: the audio starts late; past the deadline its half is lost ---
def hog(k, at, us):
    yield k.sleep_until(at)
    k.charge(us)  # cooperative: nothing else runs meanwhile
    yield


for hold, misses, lost in ((10000, 0, 0), (20000, 1, 1), (40000, 2, 2)):
    k, bw, q, SR, PS, CA, CW = fresh()
    a = workloads.AudioCapture(k, q, SR, PS, CA, slots=4)
    k.spawn("audio", 7, a.task())
    q.spawn(6)
    k.spawn("hog", 1, hog(k, 15000, hold))  # holds the CPU from 1 ms before the first release
    k.run(16000 * 6 + 100)
    eq((a.st[workloads.A_MISSES], a.st[workloads.A_LOST]), (misses, lost), "CPU held %d us: misses, lost" % hold)
    eq(a.st[workloads.A_PERIODS], 6, "every period accounted (held %d us)" % hold)
    eq(a.st[workloads.A_START_WORST_US], hold - 1000, "the start waited for the hog's yield (held %d us)" % hold)

# --- a PSRAM transfer in flight delays the audio's DMA past its deadline ---
for big in (0, 1000000):
    k, bw, q, SR, PS, CA, CW = fresh()
    a = workloads.AudioCapture(k, q, SR, PS, CA, slots=4)
    k.spawn("audio", 7, a.task())
    q.spawn(6)
    end = [0]

    def master(big=big, bw=bw, k=k, end=end, PS=PS):
        yield k.sleep_until(15000)
        if big:  # another bus master's burst on PSRAM (e.g. a second GDMA channel): holds the tier, not the CPU
            end[0] = 15000 + bw.occupy(PS, bwm.K_DMA, big)

    k.spawn("master", 5, master())
    k.run(16000 + 1)
    k.run(40000)
    if big:
        check(end[0] - 16000 > 16000, "the transfer in flight ends past the first deadline")
        eq(a.st[workloads.A_MISSES], 1, "the first period missed behind the transfer in flight")
        eq(a.st[workloads.A_WORST_US], end[0] - 16000 + bw.copy_us(SR, PS, 1, 512) + bw.cost_us(SR, bwm.K_DMA, 2 * dma.DESC_BYTES),
           "latency: the tier's busy time, then the audio's own copy")
    else:
        eq(a.st[workloads.A_MISSES], 0, "without it: on time")

# --- Wi-Fi: unpaced bursts fill the ring; paced ones stay within the window's budget ---
for paced in (False, True):
    k, bw, q, SR, PS, CA, CW = fresh()
    if paced:
        bw.set_budget(PS, CW, 50)  # 30,880 B per 16 ms window
    w = workloads.WifiBurst(k, q, PS, SR, CW, 1472, 40, 100000, 0, 16, bw, paced, 11)
    k.spawn("wifi", 4, w.task())
    q.spawn(6)
    k.run(100000 * 3)
    eq(w.st[workloads.W_BURSTS], 3, "three bursts (paced %s)" % paced)
    eq(w.st[workloads.W_PACKETS], 120, "every packet (paced %s)" % paced)
    eq(w.tx[0:1472], w.payload[32 * 1472:33 * 1472], "TX buffer 0 holds the last packet sent to it")
    if paced:
        check(w.st[workloads.W_WAITS] > 0, "paced: throttled by the window")
        check(bw.report()["psram"]["wifi"]["peak"] <= 30880 + 11 * 1472, "paced: the window stays near the budget")
    else:
        eq(w.st[workloads.W_WAITS], 0, "unpaced: never throttled")

# --- every period with the heap locked: audio, Wi-Fi (paced and not), the engine, a CPU hog ---
for paced in (False, True):
    k, bw, q, SR, PS, CA, CW = fresh()
    if paced:
        bw.set_budget(PS, CW, 50)
    a = workloads.AudioCapture(k, q, SR, PS, CA, slots=4)
    w = workloads.WifiBurst(k, q, PS, SR, CW, 1472, 24, 50000, 3000, 8, bw, paced, 8)

    def busy(k=k, bw=bw, PS=PS):
        while True:  # a decode-like load: PSRAM reads of 2 ms, then a yield
            k.charge(bw.move(PS, bwm.K_READ, bwm.WEIGHTS, 77200))
            yield

    k.spawn("audio", 7, a.task())
    q.spawn(6)
    k.spawn("wifi", 4, w.task())
    k.spawn("busy", 1, busy())
    k.run(300000)  # warm-up: every path taken once
    p0, b0 = a.st[workloads.A_PERIODS], w.st[workloads.W_BURSTS]

    def go(k=k):
        k.run(400000)

    no_alloc("audio and Wi-Fi periods%s, the DMA engine, a CPU load" % (" (paced)" if paced else ""), go)
    check(a.st[workloads.A_PERIODS] - p0 >= 24, "audio periods under the lock")
    check(w.st[workloads.W_BURSTS] - b0 >= 7, "Wi-Fi bursts under the lock")
    eq(a.st[workloads.A_MISSES], 0, "the load yields every 2 ms: no audio miss")
    eq(k.totals[T_FAULTS], 0, "no task faulted")

# --- counters at their limits (docs/conventions.md "Counters and limits"): every count
# saturates at 2**30 - 1, the bytes carry at CARRY_N into a _G field that saturates (the
# low part then stays at CARRY_N - 1), the µs carry into seconds that saturate (the µs
# then stay at 999,999), the audio's period number wraps at seq_mod; each preset near its
# limit and bumped with the heap locked (2**30 is a big int on the 32-bit port) ---
NEAR = INT_MAX - 1
k, bw, q, SR, PS, CA, CW = fresh()
bw.set_budget(PS, CW, 50)
a = workloads.AudioCapture(k, q, SR, PS, CA, slots=4)
ar = workloads.AudioCapture(k, q, SR, PS, 99, slots=4)  # a category the queue refuses: every move refused
w = workloads.WifiBurst(k, q, PS, SR, CW, 1472, 64, 2000, 0, 8, bw, True, 8)  # paced: waits; longer than its period: late
wr = workloads.WifiBurst(k, q, PS, SR, 99, 1472, 4, 10000, 0, 4)  # every packet refused


def hogger(k=k):
    while True:  # holds the CPU 40 ms every 100 ms: the audio's halves are overwritten (lost, missed)
        yield k.sleep_us(100000)
        k.charge(40000)
        yield


k.spawn("audio", 7, a.task())
k.spawn("audio_r", 7, ar.task())
q.spawn(6)
k.spawn("wifi", 4, w.task())
k.spawn("wifi_r", 4, wr.task())
k.spawn("hog", 1, hogger())
k.run(300000)  # warm-up: every path once
A_COUNTS = (workloads.A_PERIODS, workloads.A_MISSES, workloads.A_LOST, workloads.A_REFUSED)
W_COUNTS = (workloads.W_BURSTS, workloads.W_PACKETS, workloads.W_WAITS, workloads.W_LATE, workloads.W_REFUSED)
for st in (a.st, ar.st):
    for i in A_COUNTS:
        st[i] = NEAR
    st[workloads.A_BYTES] = CARRY_N - 1
    st[workloads.A_BYTES_G] = NEAR
    st[workloads.A_LAT_US] = 999999
    st[workloads.A_LAT_S] = NEAR
for st in (w.st, wr.st):
    for i in W_COUNTS:
        st[i] = NEAR
    st[workloads.W_BYTES] = CARRY_N - 1
    st[workloads.W_BYTES_G] = NEAR
    st[workloads.W_WAIT_US] = 999999
    st[workloads.W_WAIT_S] = NEAR
a.seq = a.seq_mod - 2  # wraps to 0 in the run


def limits(k=k):
    k.run(400000)


no_alloc("audio and Wi-Fi periods with every stat one below its limit", limits)
for i in A_COUNTS:
    eq(a.st[i] if i != workloads.A_REFUSED else ar.st[i], INT_MAX, "audio stat %d saturated at 2**30 - 1" % i)
for i in W_COUNTS:
    eq(w.st[i] if i != workloads.W_REFUSED else wr.st[i], INT_MAX, "Wi-Fi stat %d saturated at 2**30 - 1" % i)
eq((a.st[workloads.A_BYTES_G], a.st[workloads.A_BYTES] < CARRY_N), (INT_MAX, True), "audio bytes carried into A_BYTES_G")
eq((w.st[workloads.W_BYTES_G], w.st[workloads.W_BYTES] < CARRY_N), (INT_MAX, True), "Wi-Fi bytes carried into W_BYTES_G")
eq((a.st[workloads.A_LAT_S], a.st[workloads.A_LAT_US]), (INT_MAX, 999999), "audio latency seconds saturated")
eq((w.st[workloads.W_WAIT_S], w.st[workloads.W_WAIT_US]), (INT_MAX, 999999), "Wi-Fi wait seconds saturated")
check(a.seq < 100, "the audio's period number wrapped at seq_mod: %d" % a.seq)
n_chk, n_ok = a.check()
check(n_chk > 0 and n_ok == n_chk, "every landed slot holds its period's samples across the wrap: %d of %d" % (n_ok, n_chk))
a.st[workloads.A_BYTES] = CARRY_N - 1
w.st[workloads.W_BYTES] = CARRY_N - 1
no_alloc("audio and Wi-Fi bytes past a saturated _G field", limits)
eq((a.st[workloads.A_BYTES_G], a.st[workloads.A_BYTES]), (INT_MAX, CARRY_N - 1), "audio bytes saturated")
eq((w.st[workloads.W_BYTES_G], w.st[workloads.W_BYTES]), (INT_MAX, CARRY_N - 1), "Wi-Fi bytes saturated")
eq(k.totals[T_FAULTS], 0, "no task faulted")

# --- WifiBurst's configuration errors name the mistake ---
k, bw, q, SR, PS, CA, CW = fresh()
e = raises(workloads.WorkloadError, workloads.WifiBurst, k, q, PS, SR, 99, 1472, 4, 100000, 0, 4, bw, True)
check("category" in str(e) and "budget" not in str(e) and "\n" not in str(e), "a bad category: %s" % e)
e = raises(workloads.WorkloadError, workloads.WifiBurst, k, q, 9, SR, CW, 1472, 4, 100000, 0, 4, bw, True)
check("tier" in str(e) and "budget" not in str(e), "a bad tier: %s" % e)
bw.set_budget(PS, CW, 0)
e = raises(workloads.WorkloadError, workloads.WifiBurst, k, q, PS, SR, CW, 1472, 4, 100000, 0, 4, bw, True)
check("budget" in str(e), "a zero budget: %s" % e)
done()
