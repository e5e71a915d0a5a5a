# The differential programs of sched_diff.py on this interpreter, each run with the heap
# locked: the kernel and the recording allocate nothing (the subset without kills and
# with finished scripts parked, since a generator's end and close allocate). Prints one
# line per seed that tests/test_sched_diff.py compares with the reference model, and
# checks itself that two runs of a program give the same log.
from fwtest import check, eq, no_alloc, done
import sched_diff as sd

SEEDS = range(1, 41)

for seed in SEEDS:
    r = sd.Run(sd.program(seed, no_kill=True), park=True)
    r.k.run(0)  # a zero-length run first: the loop's one-time setup is outside the lock
    no_alloc("differential program %d" % seed, r.run)
    log = r.entries()
    final = r.final()
    check(len(log) < sd.MAX_LOG, "log fits")
    r2 = sd.Run(sd.program(seed, no_kill=True), park=True)
    final2 = r2.go()
    eq((r2.entries(), final2), (log, final), "seed %d: same log run after run" % seed)
    print("diff %d %s" % (seed, repr((log, final)).replace(" ", "")))
done()
