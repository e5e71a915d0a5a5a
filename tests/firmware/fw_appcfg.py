# The application config (firmware_py/appcfg.py): load() validates the JSON (one-line
# AppConfigError naming the key), fills the priorities; make_env + spawn build the audio,
# Wi-Fi and a user's own module task on a VirtualClock beside a CPU load, they run, their
# stats carry "released" and "deadline_misses"; the periods of the spawned tasks run with
# the heap locked (nothing appcfg adds allocates per period).
from fwtest import check, eq, raises, no_alloc, done
from firmware_py import appcfg, board, bandwidth as bwm
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, T_FAULTS
from firmware_py.sched.stats import S_RUN_S, S_RUN_US, S_RUNS

brd = board.load("boards/esp32s3_n8r8.json")

TEXT = """{"name": "t", "title": "test config",
 "decode": {"policy": "window", "window": 64, "tokens": 16, "kv_dtype": "int8"},
 "tasks": [
  {"kind": "audio", "name": "mic", "rate_hz": 16000, "period_us": 16000, "slots": 4},
  {"kind": "wifi", "name": "up", "packets": 8, "period_us": 50000, "paced": true, "budget_permille": 50},
  {"kind": "wakeword", "name": "kws", "audio": "mic", "cpu_us": 1500},
  {"kind": "sensor", "name": "imu", "period_us": 10000, "read_bytes": 64, "cpu_us": 150},
  {"kind": "sensor", "name": "adc", "period_us": 20000, "read_bytes": 128, "cpu_us": 50, "dma": true},
  {"kind": "module", "name": "blink", "module": "appcfg_user", "factory": "blinker",
   "args": {"period_us": 10000, "cpu_us": 200, "nbytes": 256}}]}"""

cfg = appcfg.load(TEXT)
eq(cfg["decode"]["priority"], appcfg.DECODE_PRIORITY, "decode priority default")
eq(cfg["dma"]["priority"], appcfg.DMA_PRIORITY, "dma priority default")
eq([t["priority"] for t in cfg["tasks"]], [7, 4, 5, 5, 5, 3], "task priority defaults by kind")
eq(cfg["decode"]["window"], 64, "decode keys kept")
eq(appcfg.load(cfg), cfg, "a loaded config loads to itself")

# --- mistakes: one line, naming the key ---
BAD = [
    ("[1]", "top level"),
    ("{", "JSON"),
    ('{"tasks": 3}', "tasks"),
    ('{"bogus": 1}', "bogus"),
    ('{"decode": {"policy": "lru"}}', "policy"),
    ('{"decode": {"kv_dtype": "int3"}}', "kv_dtype"),
    ('{"decode": {"tokens": 0}}', "tokens"),
    ('{"decode": {"tokens": 1.5}}', "tokens"),
    ('{"decode": {"window": true}}', "window"),
    ('{"decode": {"prefix": "x"}}', "prefix"),
    ('{"tasks": [{"kind": "radio", "name": "r"}]}', "kind"),
    ('{"tasks": [{"kind": "audio"}]}', "name"),
    ('{"tasks": [{"kind": "audio", "name": "decode"}]}', "reserved"),
    ('{"tasks": [{"kind": "sensor", "name": "end"}]}', "reserved"),
    ('{"decode": {"chats": [{"name": "thermal"}]}}', "reserved"),
    ('{"tasks": [{"kind": "wifi", "name": "a", "budget_permille": 700}, {"kind": "wifi", "name": "b", "budget_permille": 700}]}', "tier psram"),
    ('{"tasks": [{"kind": "audio", "name": "a b"}]}', "name"),
    ('{"tasks": [{"kind": "audio", "name": "a", "rate": 1}]}', "rate"),
    ('{"tasks": [{"kind": "audio", "name": "a", "priority": 9}]}', "priority"),
    ('{"tasks": [{"kind": "wifi", "name": "w", "paced": 1}]}', "paced"),
    ('{"tasks": [{"kind": "module", "name": "m", "module": "x"}]}', "factory"),
    ('{"tasks": [{"kind": "audio", "name": "a"}, {"kind": "wifi", "name": "a"}]}', "taken"),
    ('{"tasks": [{"kind": "wakeword", "name": "k", "audio": "mic"}]}', "mic"),
    ('{"tasks": [{"kind": "wakeword", "name": "k", "budget_permille": 5}]}', "budget_permille"),
    ('{"tasks": [{"kind": "sensor", "name": "s", "read_bytes": 5000}]}', "read_bytes"),
    ('{"tasks": [{"kind": "sensor", "name": "s", "dma": "yes"}]}', "dma"),
]
for text, word in BAD:
    e = raises(appcfg.AppConfigError, appcfg.load, text)
    m = str(e)
    check("\n" not in m and word in m, "%s: %s" % (text, m))


def boot(c):
    k = Kernel(VirtualClock(), max_tasks=appcfg.max_tasks(c), verbose=True)
    bw = bwm.Bandwidth(brd, kernel=k, user_categories=appcfg.categories(c))
    env = appcfg.make_env(k, bw, c, brd)
    return k, bw, env


# mistakes found when building: a workload's own check, a tier, a module
for text, word in [
    ('{"tasks": [{"kind": "audio", "name": "a", "period_us": 15500}]}', "multiple of 32"),
    ('{"tasks": [{"kind": "audio", "name": "a", "dst": "flash9"}]}', "flash9"),
    ('{"tasks": [{"kind": "module", "name": "m", "module": "appcfg_user", "factory": "nope"}]}', "nope"),
    ('{"tasks": [{"kind": "module", "name": "m", "module": "no_such_mod", "factory": "f"}]}', "no_such_mod"),
]:
    c = appcfg.load(text)
    k, bw, env = boot(c)
    e = raises(appcfg.AppConfigError, appcfg.spawn, k, c, env)
    check("\n" not in str(e) and word in str(e), "%s: %s" % (text, e))

# --- spawn and run ---
k, bw, env = boot(cfg)
eq(env["sram"], bw.tier_id("sram"), "env sram id")
eq(env["psram"], bw.tier_id("psram"), "env psram id")
loads = appcfg.spawn(k, cfg, env)
eq([w.name for w in loads], ["mic", "up", "kws", "imu", "adc", "blink"], "workloads in config order, named")
eq([w.kind for w in loads], ["audio", "wifi", "wakeword", "sensor", "sensor", "module"], "their kinds")
eq(bw.budget[env["psram"] * bw.n_cat_max + bw.category_id("up")], bw.cap[env["psram"]] * 50 // 1000,
   "budget_permille set on the payload tier")


def load_task(k):
    # a CPU load that yields every 2 ms (as a decode would between layers)
    while True:
        k.charge(2000)
        yield


k.spawn("load", 1, load_task(k))
k.run(200000)
st = appcfg.stats(loads)
check(st["mic"]["released"] >= 11 and st["mic"]["deadline_misses"] == 0, "audio ran on time: %r" % st["mic"])
check(st["up"]["released"] >= 3, "wifi bursts: %r" % st["up"])
check(st["kws"]["released"] >= 10 and st["kws"]["deadline_misses"] == 0, "wake word on time: %r" % st["kws"])
check(st["imu"]["released"] >= 19 and st["imu"]["bytes"] >= 19 * 64, "sensor reads: %r" % st["imu"])
check(st["adc"]["released"] >= 9 and st["adc"]["dma"], "sensor by DMA: %r" % st["adc"])
check(st["blink"]["released"] >= 19 and st["blink"]["bytes"] > 0, "the module task ran: %r" % st["blink"])
eq(k.totals[T_FAULTS], 0, "no task faulted")


def go():
    k.run(200000)


# a module task's step_us: what one step costs on the board (./kv boardtime), charged to
# the virtual clock before each step; 0 (or none) charges nothing beyond the task's own
def blink_run_us(step_us):
    text = ('{"tasks": [{"kind": "module", "name": "blink", "module": "appcfg_user", "factory": "blinker", '
            '"args": {"period_us": 10000, "cpu_us": 0, "nbytes": 64}%s}]}' % (', "step_us": %d' % step_us if step_us else ""))
    c = appcfg.load(text)
    kk, bb, ee = boot(c)
    ws = appcfg.spawn(kk, c, ee)
    kk.run(100000)
    row = ws[0].task_obj.st
    return row[S_RUN_S] * 1000000 + row[S_RUN_US], row[S_RUNS], appcfg.stats(ws)["blink"]["released"]


free_us, free_runs, free_rel = blink_run_us(0)
paid_us, paid_runs, paid_rel = blink_run_us(700)
check(free_us < 50 * free_runs, "a module task without step_us costs what it charges itself: %d us in %d slices" % (free_us, free_runs))
check(paid_us >= 700 * paid_runs and paid_rel >= 9, "step_us is charged per step: %d us in %d slices, %d periods"
      % (paid_us, paid_runs, paid_rel))
e = raises(appcfg.AppConfigError, appcfg.load, '{"tasks": [{"kind": "module", "name": "m", "module": "x", "factory": "f", '
           '"step_us": -1}]}')
check("step_us" in str(e), "a negative step_us is refused: %s" % e)

r0 = st["mic"]["released"]
no_alloc("every spawned task's periods (audio, paced Wi-Fi, wake word, sensors by CPU and DMA, a module task), the DMA engine, a CPU load", go)
check(appcfg.stats(loads)["mic"]["released"] > r0 + 10, "audio periods under the lock")
eq(k.totals[T_FAULTS], 0, "no task faulted under the lock")

done()
