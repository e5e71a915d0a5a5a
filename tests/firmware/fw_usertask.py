# The user guide's example config (examples/user-task/kvrtos.json) on the firmware's own
# interpreters: appcfg builds its audio task and the user's module task (meter.py) beside
# a CPU load; every task meets its deadlines and the periods run with the heap locked.
import sys

sys.path.append("examples/user-task")  # where flash --config puts meter.py on a board: beside main.py

from fwtest import check, eq, no_alloc, done
from firmware_py import appcfg, board, bandwidth as bwm
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, T_FAULTS

brd = board.load("boards/esp32s3_n8r8.json")
f = open("examples/user-task/kvrtos.json")
cfg = appcfg.load(f.read())
f.close()
eq([t["name"] for t in cfg["tasks"]], ["mic", "meter"], "the example's tasks")
k = Kernel(VirtualClock(), max_tasks=appcfg.max_tasks(cfg) + 1, verbose=True)
bw = bwm.Bandwidth(brd, kernel=k, user_categories=appcfg.categories(cfg))
env = appcfg.make_env(k, bw, cfg, brd)
loads = appcfg.spawn(k, cfg, env)


def load_task(k):
    # a CPU load yielding every 3 ms, as a decode between layers
    while True:
        k.charge(3000)
        yield


k.spawn("load", 0, load_task(k))
k.run(1000000)
st = appcfg.stats(loads)
eq(st["meter"]["released"], 49, "meter: a reading per 20 ms")
eq(st["meter"]["deadline_misses"], 0, "meter on time")
check(0 <= st["meter"]["average"] < 4096, "meter average in range: %r" % st["meter"])
check(st["mic"]["released"] >= 60 and st["mic"]["deadline_misses"] == 0, "audio on time: %r" % st["mic"])


def go():
    k.run(500000)


no_alloc("the example's audio and meter periods, the DMA engine, a CPU load", go)
eq(appcfg.stats(loads)["meter"]["released"], 75, "meter periods under the lock")
eq(k.totals[T_FAULTS], 0, "no task faulted")
done()
