# Run-time stats: one preallocated array('i') row per task slot, the kernel totals, the
# per-slice accounting the run loop calls, the allocation-free snapshot the telemetry task
# reads with the heap locked, and the Zephyr thread-analyzer style lines (allocate).
# Counters carry into a second field before they leave the 31-bit small ints of the ESP32.
from firmware_py.compat import IS_MICROPYTHON, const, micropython, ptr32
from firmware_py import status
from firmware_py.sched.task import STATE_NAMES, RUNNING, RESUME

# per-task stats: one array("i") row of NSTAT ints per task slot (Kernel.rows, Task.st)
S_RUNS = const(0)  # slices run, modulo CARRY_N
S_RUNS_G = const(1)  # slices run, in units of CARRY_N
S_RUN_US = const(2)  # run time, µs part (< 1e6)
S_RUN_S = const(3)  # run time, whole seconds
S_MAX_SLICE = const(4)  # longest slice between resume and yield, µs
S_MAX_LAT = const(5)  # worst wake-up latency: due time (timer expiry / wake call) to start, µs
S_MISSES = const(6)  # wake-ups later than the task's deadline_us
S_FAULTS = const(7)  # exceptions raised by the task (0 or 1: a faulted task ends)
S_OVERRUNS = const(8)  # slices longer than the task's budget_us (counted, not stopped)
S_STATE = const(9)  # state constant above (filled by snapshot())
S_PRIO = const(10)  # effective priority (raised while it holds a Mutex a higher task waits for)
NSTAT = const(11)  # ints per task row

# kernel totals: Kernel.totals, an array('i') of NTOT ints
T_SWITCHES = const(0)  # slices run by all tasks, modulo CARRY_N (filled by snapshot_totals())
T_SWITCHES_G = const(1)  # ... in units of CARRY_N (filled by snapshot_totals())
T_IDLE_US = const(2)  # time in the idle path, µs part
T_IDLE_S = const(3)  # ... whole seconds
T_BUSY_US = const(4)  # time in task slices (kernel overhead included), µs part (snapshot_totals())
T_BUSY_S = const(5)  # ... whole seconds (snapshot_totals())
T_FAULTS = const(6)  # tasks that raised
T_OVERRUNS = const(7)  # budget overruns, all tasks
T_MISSES = const(8)  # deadline misses, all tasks
T_TASKS = const(9)  # live tasks (not DONE/FAILED/KILLED)
T_BITES = const(10)  # tasks stopped by the watchdog (ran past watchdog_us without yielding)
T_ISR_DROPPED = const(11)  # interrupt posts refused because the ring was full, modulo CARRY_N (snapshot_totals())
T_ISR_REFUSED = const(12)  # applied interrupt posts the target refused, modulo CARRY_N (snapshot_totals())
NTOT = const(13)

CARRY_N = const(1000000000)  # status.CARRY_N as a local const: viper inlines only this module's
if CARRY_N != status.CARRY_N:
    raise ImportError("sched.stats: CARRY_N differs from firmware_py/status.py")
US_PER_S = const(1000000)


# one slice of d µs in stats row st: runs, run time, max slice, watchdog; 1 if it overran
# budget. Counters carry before leaving the ESP32's small-int range. No allocation.
def _account_py(st, d, budget):
    v = st[S_RUNS] + 1
    if v >= CARRY_N:
        st[S_RUNS_G] += 1
        v = 0
    st[S_RUNS] = v
    v = st[S_RUN_US] + d
    while v >= US_PER_S:
        st[S_RUN_S] += 1
        v -= US_PER_S
    st[S_RUN_US] = v
    if d > st[S_MAX_SLICE]:
        st[S_MAX_SLICE] = d
    if d > budget:
        st[S_OVERRUNS] += 1
        return 1
    return 0


# the same on raw int32 words: on MicroPython ~3x cheaper than the array('i') updates
# (it cut the switch by ~8 %); on CPython ptr32 would build a memoryview per call
@micropython.viper
def _account_viper(st, d: int, budget: int) -> int:
    s = ptr32(st)
    v = s[S_RUNS] + 1
    if v >= CARRY_N:
        s[S_RUNS_G] += 1
        v = 0
    s[S_RUNS] = v
    v = s[S_RUN_US] + d
    while v >= US_PER_S:
        s[S_RUN_S] += 1
        v -= US_PER_S
    s[S_RUN_US] = v
    if d > s[S_MAX_SLICE]:
        s[S_MAX_SLICE] = d
    if d > budget:
        s[S_OVERRUNS] += 1
        return 1
    return 0


account = _account_viper if IS_MICROPYTHON else _account_py  # same interface, faster where it helps


class Stats:
    # the Kernel's stats methods (a base class of Kernel); they read Kernel.rows/totals/tasks

    # total slices run by all tasks, low part (carry in snapshot_totals); for tests and benches
    def switches(self):
        n = 0
        for t in self.tasks:
            if t is not None:
                n += t.st[S_RUNS_G] * CARRY_N + t.st[S_RUNS]
        return n + self.retired_runs

    # copy task t's stats row into buf (array('i') of NSTAT ints); no allocation
    def snapshot(self, t, buf):
        st = t.st
        for i in range(NSTAT):
            buf[i] = st[i]
        buf[S_STATE] = RUNNING if t.state == RESUME else t.state

    # copy the kernel totals into buf (array('i') of NTOT ints), switches summed over the
    # task rows with carry (released tasks not included); no allocation
    def snapshot_totals(self, buf):
        tot = self.totals
        lo = 0
        hi = 0
        us = self.retired_us
        s = self.retired_s
        for t in self.tasks:
            if t is not None:
                st = t.st
                lo += st[S_RUNS]
                hi += st[S_RUNS_G]
                if lo >= CARRY_N:
                    lo -= CARRY_N
                    hi += 1
                us += st[S_RUN_US]
                s += st[S_RUN_S]
                if us >= US_PER_S:
                    us -= US_PER_S
                    s += 1
        tot[T_SWITCHES] = lo
        tot[T_SWITCHES_G] = hi
        tot[T_BUSY_US] = us
        tot[T_BUSY_S] = s
        tot[T_ISR_DROPPED] = self.isr.dropped
        tot[T_ISR_REFUSED] = self.isr.refused
        for i in range(NTOT):
            buf[i] = tot[i]

    # task t's share of the elapsed run time (busy + idle) in per mille; integer math, no allocation
    def cpu_permille(self, t):
        run_ms = t.st[S_RUN_S] * 1000 + t.st[S_RUN_US] // 1000
        tot = self.totals
        self.snapshot_totals(tot)  # busy time is summed over the task rows; O(tasks)
        el_ms = (tot[T_BUSY_S] + tot[T_IDLE_S]) * 1000 + (tot[T_BUSY_US] + tot[T_IDLE_US]) // 1000
        if el_ms <= 0:
            return 0
        if el_ms < US_PER_S:
            return run_ms * 1000 // el_ms
        return run_ms // (el_ms // 1000)

    # one line per task in the style of Zephyr's thread analyzer, plus a kernel line; allocates
    def stats_lines(self):
        lines = []
        w = 4
        for t in self.tasks:
            if t is not None and len(t.name) > w:
                w = len(t.name)
        for t in self.tasks:
            if t is None:
                continue
            r = 0
            s = t.st
            runs = s[r + S_RUNS_G] * CARRY_N + s[r + S_RUNS]
            run_us = s[r + S_RUN_S] * US_PER_S + s[r + S_RUN_US]
            pm = self.cpu_permille(t)
            lines.append(
                "%s : PRIO %d %s runs %d slice avg %d max %d us; wake lat max %d us; misses %d overruns %d faults %d; CPU: %d.%d %%"
                % (
                    t.name + " " * (w - len(t.name)),
                    t.prio,
                    STATE_NAMES[t.state],
                    runs,
                    run_us // runs if runs else 0,
                    s[r + S_MAX_SLICE],
                    s[r + S_MAX_LAT],
                    s[r + S_MISSES],
                    s[r + S_OVERRUNS],
                    s[r + S_FAULTS],
                    pm // 10,
                    pm % 10,
                )
            )
        tot = self.totals
        self.snapshot_totals(tot)
        lines.append(
            "kernel : switches %d; busy %d us idle %d us; faults %d overruns %d misses %d; tasks alive %d; "
            "isr applied %d refused %d dropped %d"
            % (
                tot[T_SWITCHES_G] * CARRY_N + tot[T_SWITCHES],
                tot[T_BUSY_S] * US_PER_S + tot[T_BUSY_US],
                tot[T_IDLE_S] * US_PER_S + tot[T_IDLE_US],
                tot[T_FAULTS],
                tot[T_OVERRUNS],
                tot[T_MISSES],
                tot[T_TASKS],
                self.isr.applied_g * CARRY_N + self.isr.applied,
                self.isr.refused_g * CARRY_N + self.isr.refused,
                self.isr.dropped_g * CARRY_N + self.isr.dropped,
            )
        )
        return lines

    # print stats_lines()
    def print_stats(self):
        for line in self.stats_lines():
            print(line)
