# Protection and run-time stats: fault isolation, the watchdog budget, deadline misses,
# wake-up latency, CPU share, the Zephyr-style stats line, and deterministic replay on
# the virtual clock (same inputs, identical event sequence and stats).
from array import array
from fwtest import check, eq, done
from firmware_py import sched
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, Queue, FAILED, DONE
from firmware_py.compat import ticks_add


# --- a task that raises fails alone; the others keep running; the fault is counted ---
k = Kernel(VirtualClock(), verbose=True)  # prints the traceback (print_exception)
steps = []


def good(name):
    for _ in range(3):
        steps.append(name)
        yield


def bad():
    yield
    raise KeyError("sensor gone")


g1 = k.spawn("good1", 1, good("g1"))
b = k.spawn("bad", 1, bad())
g2 = k.spawn("good2", 1, good("g2"))
print("(a traceback for task bad is expected below)")
eq(k.run(), 0, "no task left")
eq(steps, ["g1", "g2"] * 3, "the others ran to the end")
eq((g1.state, b.state, g2.state), (DONE, FAILED, DONE), "only the raiser failed")
check(isinstance(b.exc, KeyError), "its exception is recorded")
eq(b.st[sched.S_FAULTS], 1, "task fault counter")
eq(k.totals[sched.T_FAULTS], 1, "kernel fault counter")
eq(b.st[sched.S_RUNS], 2, "the faulting slice is accounted too")

# --- watchdog: slices longer than the budget are flagged, shorter ones are not ---
k = Kernel(VirtualClock(), verbose=False)


def worker(us, n, kern=None):
    for _ in range(n):
        (kern or k).charge(us)
        yield


hog = k.spawn("hog", 1, worker(150, 4), 100)  # budget 100 µs, runs 150 µs slices
ok = k.spawn("ok", 1, worker(90, 4), 100)
free = k.spawn("free", 1, worker(500, 2))  # no budget
k.run()
eq(hog.st[sched.S_OVERRUNS], 4, "every 150 µs slice over a 100 µs budget is flagged")
eq(ok.st[sched.S_OVERRUNS], 0, "90 µs slices are within budget")
eq(free.st[sched.S_OVERRUNS], 0, "no budget, no flag")
eq(k.totals[sched.T_OVERRUNS], 4, "kernel total")
eq(hog.st[sched.S_MAX_SLICE], 150, "max slice")
k2 = Kernel(VirtualClock(), budget_us=200, verbose=False)
t2 = k2.spawn("def", 1, worker(300, 1, k2))
k2.run()
eq(t2.st[sched.S_OVERRUNS], 1, "the kernel-wide default budget applies")

# --- deadline misses and wake-up latency of a periodic task beside a hog ---
k = Kernel(VirtualClock(), verbose=False)
lat = []


def periodic():
    t = k.now()
    for _ in range(6):
        t = ticks_add(t, 1000)
        yield k.sleep_until(t)
        lat.append(k.now() - t)


def hog_once():
    yield k.sleep_us(2500)
    k.charge(1700)  # one long slice: runs 2500..4200, over the releases at 3000 and 4000
    yield


per = k.spawn("per", 2, periodic(), -1, 100)  # deadline 100 µs after each release
k.spawn("hog", 1, hog_once())
k.run()
eq(lat, [0, 0, 1200, 200, 0, 0], "releases at 3000 and 4000 both start at 4200; the grid is kept after")
eq(per.st[sched.S_MAX_LAT], 1200, "worst wake-up latency")
eq(per.st[sched.S_MISSES], 2, "two wake-ups past their 100 µs deadline")
eq(k.totals[sched.T_MISSES], 2, "kernel total of misses")

# --- the latency scenario on the virtual clock: 1 ms task beside 100 busy tasks ---
k = Kernel(VirtualClock(), max_tasks=101, priorities=4, verbose=False)


def tick_task():
    t = k.now()
    for _ in range(200):
        t = ticks_add(t, 1000)
        yield k.sleep_until(t)
        k.charge(20)
    k.stop()


def busy(us):
    while True:
        k.charge(us)
        yield


hi = k.spawn("tick", 3, tick_task(), -1, 1000)
lows = [k.spawn("low%d" % i, 1, busy(200 + (i * 37) % 301)) for i in range(100)]
k.run()
worst_slice = max(t.st[sched.S_MAX_SLICE] for t in lows)
eq(hi.st[sched.S_RUNS], 201, "the 1 ms task ran its first slice and every one of 200 periods")
check(hi.st[sched.S_MAX_LAT] <= worst_slice, "worst wake-up %d us is bounded by one low slice (max %d us)" % (hi.st[sched.S_MAX_LAT], worst_slice))
check(hi.st[sched.S_MAX_LAT] > 0, "the load really delayed it")
eq(hi.st[sched.S_MISSES], 0, "no deadline miss at 1 ms")

# --- CPU share and the stats line ---
k = Kernel(VirtualClock(), verbose=False)


def share(us):
    for _ in range(100):
        k.charge(us)
        yield


def idler():
    yield k.sleep_us(20000)


a = k.spawn("three", 1, share(300))
c = k.spawn("one", 1, share(100))
k.spawn("idler", 1, idler())
k.run()
eq(k.cpu_permille(a), 750, "300 µs of each 400 µs round is 75.0 %")
eq(k.cpu_permille(c), 250, "the other 25.0 %")
tot = array("i", bytes(4 * sched.NTOT))
k.snapshot_totals(tot)
eq(tot[sched.T_BUSY_US] + tot[sched.T_BUSY_S] * 1000000, 40000, "busy time is the sum of the slices")
eq(tot[sched.T_IDLE_US], 0, "no idle while someone is ready")
eq(tot[sched.T_SWITCHES], 204, "switches counted: 101 + 101 + 2 (idler)")
row = array("i", bytes(4 * sched.NSTAT))
k.snapshot(a, row)
eq((row[sched.S_RUNS], row[sched.S_RUN_US], row[sched.S_STATE], row[sched.S_PRIO]), (101, 30000, DONE, 1), "snapshot row")
lines = k.stats_lines()
for line in lines:
    print(line)
eq(len(lines), 4, "one line per task plus the kernel line")
check(lines[0].startswith("three : PRIO 1 DONE runs 101") and lines[0].endswith("CPU: 75.0 %"), "Zephyr-style line: " + lines[0])
check(lines[3].startswith("kernel : switches 204"), "kernel line: " + lines[3])

# idle time is counted while everyone sleeps
k = Kernel(VirtualClock(), verbose=False)
k.spawn("s", 1, idler())
k.run()
k.snapshot_totals(tot)
eq(tot[sched.T_IDLE_US], 20000, "20 ms idle")


# --- deterministic replay: same inputs, identical event sequence and stats ---
def scenario():
    k = Kernel(VirtualClock(12345), verbose=False)
    q = Queue(k, 3)
    events = []
    k.on_switch = lambda t, task: events.append((t, task.name))

    def sensor():
        t = k.now()
        for i in range(20):
            t = ticks_add(t, 700)
            yield k.sleep_until(t)
            k.charge(30)
            q.put_nowait(i)

    def compute():
        for _ in range(20):
            v = yield q.get(5000)
            k.charge(50 + (v * 37) % 400)  # data-dependent work
            yield

    def background():
        for i in range(40):
            k.charge(120 + (i * 53) % 200)
            yield

    k.spawn("sensor", 3, sensor(), -1, 200)
    k.spawn("compute", 2, compute())
    k.spawn("background", 1, background())
    k.run()
    return events, k.stats_lines()


e1, s1 = scenario()
e2, s2 = scenario()
check(len(e1) > 80, "the scenario switched %d times" % len(e1))
eq(e1, e2, "identical switch sequence (time, task) run after run")
eq(s1, s2, "identical stats")
print("replay events:", e1)  # tests/test_sched_replay.py compares this line across interpreters
print("replay stats:", s1)
done()
