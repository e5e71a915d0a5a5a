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
