# The periodic CPU workloads (firmware_py/workloads.py): SensorRead and WakeWord. Their
# configuration errors, the deadline accounting (on time, late behind a CPU hog, releases
# skipped when the task is more than a period late), the bytes charged to the tracker by
# the CPU path and by the DMA queue, the wake-word detector consuming the audio's frames
# from its PSRAM ring, the "released"/"deadline_misses" keys of every workload's stats,
# and every period of all of them with the heap locked.
from fwtest import check, eq, raises, no_alloc, done
from firmware_py import appcfg, board, dma, workloads, bandwidth as bwm
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, T_FAULTS

brd = board.load("boards/esp32s3_n8r8.json")


def fresh():
    k = Kernel(VirtualClock(), max_tasks=10, verbose=True)
    bw = bwm.Bandwidth(brd, kernel=k)
    q = dma.DMAQueue(k, slots=32, bw=bw, board=brd)
    cs = bw.add_category("sensor")
    ca = bw.add_category("audio")
    return k, bw, q, bw.tier_id("sram"), bw.tier_id("psram"), cs, ca


W = workloads
# --- configuration mistakes: one line, WorkloadError ---
k, bw, q, SR, PS, CS, CA = fresh()
raises(W.WorkloadError, W.SensorRead, k, bw, SR, CS, 50)  # period under 100 us
raises(W.WorkloadError, W.SensorRead, k, bw, SR, CS, 10000, 0)  # no bytes
raises(W.WorkloadError, W.SensorRead, k, bw, SR, CS, 10000, 64, -1)
raises(W.WorkloadError, W.SensorRead, k, bw, SR, CS, 10000.0)
e = raises(W.WorkloadError, W.SensorRead, k, bw, SR, 99)
check("category" in str(e) and "\n" not in str(e), "a bad category is named: %s" % e)
raises(W.WorkloadError, W.SensorRead, k, None, SR, CS)
# a bus time longer than the period (4,064 B at 5 B/s: 812.8 s a read) is refused, one line,
# also by the config loader (the same line after "config: task 's': ")
e = raises(W.WorkloadError, W.SensorRead, k, bw, SR, CS, 100000000, 4064, 0, 0, 0, 5)
line = "sensor: a read of 4064 B at 5 B/s takes 812800000 us on the bus, longer than its period of 100000000 us"
eq(str(e), line, "a bus time above the period: one line")
e = raises(W.WorkloadError, W.SensorRead, k, bw, SR, CS, 1000, 64, 0, 0, 0, 50000)
check("1280 us on the bus" in str(e) and "period of 1000 us" in str(e), "1,280 us of bus in a 1 ms period: %s" % e)
eq(W.SensorRead(k, bw, SR, CS, 1280, 64, 0, 0, 0, 50000).bus_us, 1280, "a bus time of exactly the period is taken")
cfg = appcfg.load('{"tasks": [{"kind": "sensor", "name": "s", "read_bytes": 4064, "bus_bytes_per_s": 5, '
                  '"period_us": 1000}]}')
k2 = Kernel(VirtualClock(), max_tasks=10)
bw2 = bwm.Bandwidth(brd, kernel=k2, user_categories=appcfg.categories(cfg))
env = appcfg.make_env(k2, bw2, cfg, brd)
e = raises(appcfg.AppConfigError, appcfg.spawn, k2, cfg, env)
eq(str(e), "config: task 's': sensor: a read of 4064 B at 5 B/s takes 812800000 us on the bus, longer than its "
   "period of 1000 us", "the config loader gives the same line")
raises(W.WorkloadError, W.WakeWord, k, 50)
raises(W.WorkloadError, W.WakeWord, k, 16000, -5)
e = raises(W.WorkloadError, W.WakeWord, k, 0, 2000, 0, 0, "mic")
check("AudioCapture" in str(e), "audio must be an AudioCapture: %s" % e)

# --- a sensor alone, CPU path: every period on time; latency = the copy + the compute ---
k, bw, q, SR, PS, CS, CA = fresh()
s = W.SensorRead(k, bw, SR, CS, period_us=10000, read_bytes=64, cpu_us=300)
k.spawn("sensor", 5, s.task())
k.run(10000 * 10 + 50)
st = s.stats()
eq((st["released"], st["deadline_misses"], st["skipped"]), (10, 0, 0), "ten periods, none missed")
copy = bw.cost_us(SR, bwm.K_WRITE, 64)
eq(st["worst_latency_us"], copy + 300, "latency: the SRAM write priced by the tracker + the compute")
eq(st["bytes"], 640, "64 B a period")
eq(bw.report()["sram"]["sensor"]["bytes"], 640, "every byte charged to the sensor's category on SRAM")
eq(st["cpu_us"], 10 * (copy + 300), "the CPU time charged")
eq([s.buf[i] for i in range(4)], [s.sample(9, i) for i in range(4)], "the buffer holds the last reading")

# --- the DMA path and the bus time: the engine charges the bytes (read and written on SRAM) ---
k, bw, q, SR, PS, CS, CA = fresh()
s = W.SensorRead(k, bw, SR, CS, period_us=5000, read_bytes=96, cpu_us=100, bus_bytes_per_s=50000, q=q)
eq(s.bus_us, 1920, "96 B at 50,000 B/s: 1,920 us on the bus")
k.spawn("sensor", 5, s.task())
q.spawn(6)
k.run(5000 * 8 + 3000)
st = s.stats()
eq((st["released"], st["deadline_misses"]), (8, 0), "eight periods on time by DMA")
eq(bw.report()["sram"]["sensor"]["bytes"], 2 * 96 * 8, "the GDMA read and wrote SRAM: 2 x 96 B a period")
want = 1920 + bw.cost_us(SR, bwm.K_DMA, 2 * dma.DESC_BYTES) + bw.copy_us(SR, SR, 1, 96) + 100
eq(st["worst_latency_us"], want, "latency: bus + the DMA's descriptor fetch and copy + compute")
eq([s.buf[i] for i in range(4)], [s.sample(7, i) for i in range(4)], "the DMA landed the last reading")

# --- a CPU hog: late (a miss), then more than a period late (releases skipped) ---
def hog(k, at, us):
    yield k.sleep_until(at)
    k.charge(us)
    yield


for hold, misses, skipped in ((2000, 0, 0), (9000, 1, 0), (25000, 2, 2), (29000, 3, 2)):
    k, bw, q, SR, PS, CS, CA = fresh()
    s = W.SensorRead(k, bw, SR, CS, period_us=10000, read_bytes=16, cpu_us=500, deadline_us=8000)
    k.spawn("sensor", 5, s.task())
    k.spawn("hog", 1, hog(k, 9500, hold))  # holds the CPU from 0.5 ms before the first release
    k.run(10000 * 6 + 50)
    st = s.stats()
    eq((st["deadline_misses"], st["skipped"]), (misses, skipped), "hog %d us: misses, skipped" % hold)
    eq(st["released"], 6, "every release counted (hog %d us)" % hold)
    eq(st["worst_start_us"], hold - 500, "the start waited for the hog (hog %d us)" % hold)

# --- the wake-word detector alone: its compute per frame, the default figure's source ---
k, bw, q, SR, PS, CS, CA = fresh()
w = W.WakeWord(k)
eq((w.period_us, w.cpu_us, w.deadline_us), (16000, 2000, 16000), "16 ms frames, 2 ms each (estimate)")
check("estimate" in w.stats()["cpu_source"], "the default figure says it is an estimate")
k.spawn("wakeword", 6, w.task())
k.run(20000 + 16000 * 4 + 50)
st = w.stats()
eq((st["released"], st["deadline_misses"], st["worst_latency_us"], st["cpu_us"]), (5, 0, 2000, 10000),
   "five frames of 2 ms, on time")

# --- beside the audio capture: it reads each landed frame from the PSRAM ring ---
k, bw, q, SR, PS, CS, CA = fresh()
a = W.AudioCapture(k, q, SR, PS, CA, slots=4)
w = W.WakeWord(k, audio=a)
eq((w.period_us, w.nb, w.tier, w.cat), (16000, 512, PS, CA), "the audio's period, frame, tier and category")
k.spawn("audio", 7, a.task())
q.spawn(6)
k.spawn("wakeword", 5, w.task())
k.run(20000 + 16000 * 9 + 50)
st = w.stats()
eq((st["released"], st["deadline_misses"], st["stale"]), (10, 0, 0), "ten frames, each a new one, on time")
eq(st["bytes"], 10 * 512, "512 B read per frame")
eq(w.consumed, a.last_landed, "it read the newest frame")
want = 0
for n in range(10):
    for i in range(512):
        want += a.sample(n, i)
eq(w.acc, want & 0xFFFFFF, "the bytes read are the audio's samples of periods 0..9")
eq(bw.report()["psram"]["audio"]["bytes"], 2 * 10 * 512, "PSRAM: the audio's DMA writes + the detector's reads")
read = bw.cost_us(PS, bwm.K_READ, 512)
eq(st["worst_latency_us"], read + 2000, "latency: the frame's read priced on PSRAM + the network")
eq(a.stats()["released"], a.stats()["periods"], "AudioCapture stats: released = periods")
eq(a.stats()["deadline_misses"], a.stats()["misses"], "AudioCapture stats: deadline_misses = misses")

# --- a detector that starts before any frame landed: stale periods, no compute ---
k, bw, q, SR, PS, CS, CA = fresh()
a = W.AudioCapture(k, q, SR, PS, CA, slots=4)
w = W.WakeWord(k, audio=a, offset_us=1000)
k.spawn("audio", 7, a.task())
q.spawn(6)
k.spawn("wakeword", 5, w.task())
k.run(1000 + 16000 * 3 + 50)
st = w.stats()
eq(st["stale"], 1, "the first frame had not landed yet")
eq(st["released"], 4, "four releases")

# --- a detector at twice the audio's rate: every other period is stale, and the stale ones are
# out of the latency mean and the served count (each served one reads a frame + 2 ms) ---
k, bw, q, SR, PS, CS, CA = fresh()
a = W.AudioCapture(k, q, SR, PS, CA, slots=4)
w = W.WakeWord(k, period_us=a.period_us // 2, audio=a)
k.spawn("audio", 7, a.task())
q.spawn(6)
k.spawn("wakeword", 5, w.task())
k.run(20000 + 16000 * 19 + 50)
st = w.stats()
check(st["stale"] >= 15 and st["released"] - st["stale"] >= 15, "about half stale: %r" % st)
served = st["released"] - st["skipped"] - st["stale"]
eq(st["bytes"], served * 512, "a frame read in every served period")
eq(st["cpu_us"], served * (bw.cost_us(PS, bwm.K_READ, 512) + 2000), "the CPU of the served periods")
eq(st["mean_latency_us"], float(st["worst_latency_us"]), "the mean is over the served periods (all alike)")
eq(st["worst_latency_us"], bw.cost_us(PS, bwm.K_READ, 512) + 2000, "each served period: the read + the network")
eq(st["deadline_misses"], 0, "no stale period counted as a miss")

# --- WifiBurst's stats carry the keys too ---
k, bw, q, SR, PS, CS, CA = fresh()
wf = W.WifiBurst(k, q, PS, SR, CA, 1472, 4, 10000)
k.spawn("wifi", 4, wf.task())
q.spawn(6)
k.run(35000)
d = wf.stats()
eq((d["released"], d["deadline_misses"]), (d["bursts"], d["late_bursts"]), "WifiBurst stats: released, deadline_misses")

# --- every period of every workload with the heap locked (and a decode-like load) ---
for use_dma in (False, True):
    k, bw, q, SR, PS, CS, CA = fresh()
    a = W.AudioCapture(k, q, SR, PS, CA, slots=4)
    w = W.WakeWord(k, audio=a)
    w2 = W.WakeWord(k, 10000, 1500)  # no audio
    s = W.SensorRead(k, bw, SR, CS, 5000, 48, 250, 0, 0, 100000 if use_dma else 0, q if use_dma else None)
    s2 = W.SensorRead(k, bw, SR, CS, 7000, 32, 20000, 6000)  # longer than its period: skips and misses

    def busy(k=k, bw=bw, PS=PS):
        while True:
            k.charge(bw.move(PS, bwm.K_READ, bwm.WEIGHTS, 77200))
            yield

    k.spawn("audio", 7, a.task())
    q.spawn(6)
    k.spawn("wake", 5, w.task())
    k.spawn("wake2", 5, w2.task())
    k.spawn("sensor", 4, s.task())
    k.spawn("sensor2", 3, s2.task())
    k.spawn("busy", 1, busy())
    k.run(300000)
    r0 = (s.st[W.P_RELEASED], w.st[W.P_RELEASED], s2.st[W.P_SKIPPED])

    def go(k=k):
        k.run(400000)

    no_alloc("sensor (%s), wake-word (with and without audio), audio, DMA, a CPU load" % ("DMA" if use_dma else "CPU"), go)
    check(s.st[W.P_RELEASED] - r0[0] >= 70, "sensor periods under the lock")
    check(w.st[W.P_RELEASED] - r0[1] >= 20, "wake-word frames under the lock")
    check(s2.st[W.P_SKIPPED] > r0[2], "the overrunning sensor skipped releases under the lock")
    eq(k.totals[T_FAULTS], 0, "no task faulted")
    check(s2.stats()["deadline_misses"] > 0, "the overrunning sensor misses")
done()
