# The KV cache against a reference model of our own (tests/firmware/kvref.py: per
# sequence a dict of positions, fork as a deep copy, the pool as counts): seeded random
# programs over every call, misuse included, compare every result, every counter and
# every byte read back, with guard bytes around the arena. The heap-locked subset runs
# under MicroPython in tests/firmware/fw_kv_diff.py.
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "firmware"))
import kvref  # noqa: E402

from firmware_py import kv, pool  # noqa: E402


@pytest.mark.parametrize("seed", range(24))
def test_random_program_matches_the_reference_model(seed):
    counts = kvref.drive(seed, 500)
    assert sum(counts.values()) == 500 and len(counts) == 16, counts  # every call was exercised


@pytest.mark.parametrize("dtype", ["fp32", "int4"])
def test_random_program_other_layouts(dtype):
    kvref.drive(1000, 1500, layout=kv.Layout(3, 2, 2, dtype, tokens_per_block=2), verify_every=25)


@pytest.mark.parametrize("scores", [(0,), (0, 1), (0, 1, 2, 3)])
def test_h2o_evictions_follow_the_documented_victim_rule(scores):
    # ties are the common case (unscored tokens): lowest score, then the oldest position;
    # position n - M goes first when still cached
    layout = kv.Layout(1, 1, 4, "fp32", tokens_per_block=4)
    p = pool.Pool(layout.block_bytes, 3)
    c = kv.KVCache(p, layout, max_seqs=1, max_blocks_per_seq=3, h2o=True)
    m = kvref.RefKV(layout, 1, 3, 3, (3,))
    r = p.add_region(3)
    h = c.open(r, "h2o", 11, 2, 3)
    assert m.open(0, "h2o", 11, 2, 3) == h
    row = bytearray(layout.row_bytes)
    rnd = kvref.Rng(len(scores))
    for pos in range(200):
        row[0] = pos & 255
        assert c.append(h, row) == m.append(h, row), pos
        slot = c.locate(h, rnd.int(0, pos))
        v = rnd.pick(scores)
        assert c.add_score(h, slot, v) == m.add_score(h, slot, v) if slot >= 0 else True
        kept = [q for q in range(pos + 1) if c.locate(h, q) >= 0]
        assert kept == [q for q in range(pos + 1) if m.locate(h, q) >= 0], pos


@pytest.mark.parametrize("seed", range(4))
def test_h2o_forks_with_score_ties_match_the_reference_model(seed):
    # h2o sequences forked mid-stream (shared blocks, copied on the first write of either),
    # scores drawn from a tiny set so ties are everywhere: the victim, every position kept,
    # every byte read back and the pool's blocks agree with the model
    layout = kv.Layout(1, 1, 4, "fp32", tokens_per_block=4)
    p = pool.Pool(layout.block_bytes, 12)
    c = kv.KVCache(p, layout, max_seqs=3, max_blocks_per_seq=3, h2o=True)
    m = kvref.RefKV(layout, 3, 3, 12, (12,))
    r = p.add_region(12)
    rnd = kvref.Rng(100 + seed)
    h = c.open(r, "h2o", 11, 2, 3)
    assert m.open(0, "h2o", 11, 2, 3) == h
    live = [h]
    row = bytearray(layout.row_bytes)
    out_c = bytearray(layout.layer_row)
    forks = 0
    for step in range(400):
        s = rnd.pick(live)
        k = rnd.int(0, 19)
        if k == 0 and len(live) < 3:
            f = c.fork(s)
            assert f == m.fork(s), step
            if f >= 0:
                live.append(f)
                forks += 1
        elif k == 1 and len(live) > 1:
            assert c.close(s) == m.close(s) == 0, step
            live.remove(s)
        else:
            row[0], row[1] = step & 255, s & 255
            assert c.append(s, row) == m.append(s, row), step
            n = c.length(s)
            slot = c.locate(s, rnd.int(0, n - 1))
            v = rnd.pick((0, 1, 1, 2))
            if slot >= 0:
                assert c.add_score(s, slot, v) == m.add_score(s, slot, v), step
        for q in live:
            n = c.length(q)
            assert n == m.length(q)
            assert [c.locate(q, i) >= 0 for i in range(n)] == [m.locate(q, i) >= 0 for i in range(n)], step
            for i in range(n):
                a = c.read(q, i, 0, out_c, 0)
                b, want = m.read(q, i, 0, len(out_c), 0)
                assert a == b and (a < 0 or bytes(out_c) == bytes(want)), (step, q, i)
        assert p.blocks_used == len(m.refs), step
    assert forks >= 3, forks  # the program did fork
