# Differential test of the kernel against an independent reference model
# (tests/sched_model.py): thousands of random ops over every service (sleep, queue
# put/get blocking and not, semaphore, mutex with inheritance, event flags, bit and
# counting notifications, kill, join, timeouts) must give the same switch order, the
# same result of every op at the same time, and the same final state. The MicroPython
# half (fw_sched_diff.py) runs a subset with the heap locked and is compared here too.
import os
import sys

from conftest import FIRMWARE_TESTS, run_firmware

sys.path.insert(0, FIRMWARE_TESTS)
import sched_diff as sd  # noqa: E402
from sched_model import Model  # noqa: E402

SEEDS = range(1, 1201)
MP_SEEDS = range(1, 41)  # fw_sched_diff.py runs these under MicroPython


def _real(seed):
    r = sd.Run(sd.program(seed))
    final = r.go()
    return r.entries(), final


def _model(seed):
    m = Model(sd.program(seed))
    final = m.run()
    return m.log, final


def test_kernel_matches_the_reference_model_on_random_programs():
    ops = 0
    kinds = set()
    for seed in SEEDS:
        prog = sd.program(seed)
        log, final = _real(seed)
        mlog, mfinal = _model(seed)
        assert len(log) < sd.MAX_LOG, "seed %d: log overflow" % seed
        for i, (a, b) in enumerate(zip(log, mlog, strict=False)):  # lengths compared below
            assert a == b, "seed %d: entry %d differs: kernel %r, model %r\nprogram %r\nkernel %r\nmodel %r" % (
                seed, i, a, b, prog, log[: i + 2], mlog[: i + 2])
        assert len(log) == len(mlog), "seed %d: kernel %d entries, model %d" % (seed, len(log), len(mlog))
        assert final == mfinal, "seed %d: final state kernel %r, model %r" % (seed, final, mfinal)
        for e in log:
            if e[2] >= 0:
                ops += 1
                kinds.add(prog[1][e[1]][e[2]][0])
    assert ops > 5000, "only %d ops ran" % ops
    assert kinds == set(range(20)), "op kinds never run: %r" % sorted(set(range(20)) - kinds)


def test_the_model_is_not_trivially_equal():
    # the comparison above can fail: the model told that yielders go first differs
    changed = 0
    for seed in range(1, 200):
        m = Model(sd.program(seed))
        orig = m.make_ready
        m.make_ready = lambda t, orig=orig, m=m: (orig(t), setattr(t, "seq", -m.tick_seq() if t.state == "ready" and t.pc else t.seq))
        try:
            m.run()
        except Exception:
            changed += 1
            continue
        changed += m.log != _real(seed)[0]
    assert changed > 20


def test_parked_programs_match_the_model_on_cpython():
    for seed in SEEDS:
        r = sd.Run(sd.program(seed, no_kill=True), park=True)
        final = r.go()
        m = Model(sd.program(seed, no_kill=True), park=True)
        mfinal = m.run()
        assert (r.entries(), final) == (m.log, mfinal), "seed %d: parked program differs" % seed


def test_heap_locked_micropython_run_matches_the_model():
    r = run_firmware(os.path.join(FIRMWARE_TESTS, "fw_sched_diff.py"), "micropython")
    assert r.returncode == 0, r.stdout + r.stderr
    got = {}
    for line in r.stdout.splitlines():
        if line.startswith("diff "):
            _, seed, rest = line.split(" ", 2)
            got[int(seed)] = rest
    assert sorted(got) == list(MP_SEEDS), r.stdout[-2000:]
    for seed in MP_SEEDS:
        m = Model(sd.program(seed, no_kill=True), park=True)
        mfinal = m.run()
        mlog = m.log
        assert got[seed] == repr((mlog, mfinal)).replace(" ", ""), "seed %d differs under MicroPython" % seed
