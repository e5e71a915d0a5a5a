# The randomized soak (host/soak.py, `./kv soak`): its checker flags what breaks the
# promise (a MemoryError, a full policy without its stop line, a ring stopped early, the
# free heap drifting more than one GC block), its draws are reproducible from one seed and
# always fit the board, bad options are one line, and a short soak of the real firmware on
# both MicroPython word sizes holds.
import os
import pytest

import conftest

from host import soak
from vboard_util import kv, one_line_error

RING = {"policy": "window", "window": 16, "batch": 1}
FULL = {"policy": "full", "window": 0, "batch": 1}


def record(config, free=None, seqs=None, tasks_failed=(), asked=2000, gc_block=16, rc=0, error="", who=None):
    # a run_one() record as soakrun's result would make it
    res = None
    if rc == 0:
        res = {"seqs": seqs if seqs is not None else [{"n_new": asked, "stop": "", "stop_line": ""}],
               "tasks_failed": list(tasks_failed), "free": free if free is not None else [1000] * asked,
               "asked": asked, "gc_block": gc_block, "word_bytes": gc_block // 4}
        if who is not None:
            res["who"] = who
    return {"config": config, "rc": rc, "wall_s": 1.0, "result": res, "error": error, "tail": []}


def test_a_steady_run_holds():
    bad, figs = soak.check(record(RING))
    assert bad == [] and figs["drift_bytes"] == 0 and figs["tokens"] == 2000 and figs["memory_errors"] == 0


def test_heap_drift_over_one_gc_block_is_flagged():
    free = [5000] * 99 + [5000] * 1000 + [4968] * 901  # 32 B less free after the last token than after the 100th
    bad, figs = soak.check(record(RING, free=free))
    assert figs["drift_bytes"] == 32 and len(bad) == 1 and "drifted 32 B" in bad[0] and "16 B GC block" in bad[0]
    assert figs["floor_drop_bytes"] == 32
    # within one block: held (16 B on 32-bit; the 64-bit port's block is 32 B)
    assert soak.check(record(RING, free=[5000] * 1000 + [4984] * 1000))[0] == []
    assert soak.check(record(RING, free=free, gc_block=32))[0] == []
    # the first 100 tokens do not count; a run of fewer tokens cannot tell
    assert soak.check(record(RING, free=[9000] * 99 + [5000] * 1901))[0] == []
    assert soak.drift([1, 2, 3]) == (None, None, None)


def test_two_chats_are_each_compared_with_their_own_samples():
    # seed 18 (two chats, the 32-bit port): the samples alternate between two levels 304 B
    # apart, as each chat samples while the other is suspended inside its own step holding
    # its own live objects; the run's first and last samples were taken by different chats,
    # which read as a 304 B drift with no growth at all. Each chat's own samples: no drift
    free = ([3261968, 3261664] * 1000)[:1997]  # 1,997 samples, as the run took
    who = ([0, 1] * 1000)[:1997]
    assert soak.drift(free) == (304, 304, 0)
    assert soak.drift(free, who) == (0, 0, 0)
    bad, figs = soak.check(record(RING, free=free, who=who))
    assert bad == [] and figs["drift_bytes"] == 0
    # a chat whose own heap use grows is still caught, whoever samples last
    grow = [3261968 - (32 * i // 1000 if i % 2 else 0) for i in range(1997)]
    assert soak.drift(grow, who)[0] == 60 and soak.check(record(RING, free=grow, who=who))[0]


def test_a_memory_error_is_flagged_and_counted():
    bad, figs = soak.check(record(RING, rc=3, error="error MemoryError: memory allocation failed, allocating 4096 bytes"))
    assert figs["memory_errors"] == 1 and bad == ["MemoryError: memory allocation failed, allocating 4096 bytes"]
    # in a task beside the decode (serve's request task, a chat)
    bad, figs = soak.check(record(RING, tasks_failed=[["decode", "MemoryError", "memory allocation failed"]]))
    assert figs["memory_errors"] == 1 and "decode ended with MemoryError" in bad[0]


def test_full_must_stop_with_its_line_and_a_ring_must_not_stop():
    line = "generate: stopped: the model's context (seq_len 256) is reached after 256 tokens (policy full)"
    ok = record(FULL, seqs=[{"n_new": 251, "stop": "full", "stop_line": line}], asked=320, free=[7] * 251)
    assert soak.check(ok)[0] == []
    silent = record(FULL, seqs=[{"n_new": 320, "stop": "", "stop_line": ""}], asked=320, free=[7] * 320)
    assert "full did not stop with its one line" in soak.check(silent)[0][0]
    stopped = record(RING, seqs=[{"n_new": 700, "stop": "no_block", "stop_line": "generate: stopped: ..."}], free=[7] * 700)
    assert "window stopped at 700 of 2000 tokens" in soak.check(stopped)[0][0]


def test_a_refused_boot_or_a_hang_is_flagged():
    assert "boot refused" in soak.check(record(RING, rc=1, error="refused the KV pool of 9 blocks does not fit"))[0][0]
    assert "timed out" in soak.check(record(RING, rc="timeout"))[0][0]


def test_draws_are_reproducible_fit_and_cover_the_space():
    sp = soak.space()
    assert "esp32s3_n8r8" in sp["board"] and "esp32s3_n4r2" in sp["board"] and "esp32_wroom32" not in sp["board"]
    a = [soak.draw(7 + i, sp) for i in range(30)]
    assert a == [soak.draw(7 + i, sp) for i in range(30)]  # run i of seed 7 is seed 7 + i alone
    for c in a:
        n, need, cfg = soak.fits(c)
        assert n >= need
        if c["policy"] == "full":
            assert c["tokens"] > cfg.seq_len  # asked past the context: it must stop
        else:
            assert c["tokens"] * c["batch"] >= soak.RING_TOKENS and c["tokens"] > c["window"]
    for key in ("interp", "policy", "weights", "kv_dtype", "tasks", "batch"):
        assert len({c[key] for c in a}) > 1, key
    assert len({soak.config_key(c) for c in a}) > 20


@pytest.mark.parametrize("args, words", [
    (["--runs", "0"], "--runs must be a whole number >= 1"),
    (["--kv-dtypes", "int3"], "--kv-dtypes: unknown 'int3'"),
    (["--tokens", "100"], "--tokens must be at least 2000"),
    (["--batch", "9"], "--batch: unknown 9"),
    (["--policies", ""], "--policies needs a comma-separated list"),
    (["--temperatures", "hot"], "--temperatures must be a number in [0, "),
])
def test_bad_options_are_one_line(args, words):
    r = kv("soak", *args)
    assert r.returncode == 2 and one_line_error(r) and words in r.stderr, r.stderr


def test_a_short_soak_of_the_real_firmware_holds():
    # the integer path (int8 weights and KV: the board's fast path), one sequence, decode
    # alone and beside a config's tasks, on both word sizes, greedy: every run's promise.
    # (Sampling at a temperature is not here: its floats, garbage the conservative GC
    # keeps or not, move the 32-bit free heap by 2 blocks; ./kv soak reports it.)
    interps = soak.interpreters()
    # seed 3: its three draws cover both word sizes (32-bit, 32-bit, 64-bit)
    r = soak.soak(seed=3, runs=3, weights=["int8"], kv_dtypes=["int8"], batches=["1"], tasks=["none", "user-task"],
                  temperatures=["0"])
    assert r["runs"] == 3 and r["memory_errors"] == 0
    assert r["ok"], [(x["config"], x["failures"], x["repro"]) for x in r["rows"]]
    assert r["tokens"] >= 2000 and r["max_drift_bytes"] is not None
    assert set(r["covered"]["interp"]) <= set(interps)
    if os.environ.get(conftest.REQUIRE_MP32, "") not in ("", "0"):
        assert "micropython32" in interps, "KVRTOS_REQUIRE_MP32 is set and the 32-bit port is not among the soak's interpreters"
        assert {"micropython", "micropython32"} <= set(r["covered"]["interp"]), r["covered"]
