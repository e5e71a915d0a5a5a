# The KV benchmark measures what it claims: the first-fit baseline allocates and
# coalesces correctly, the churn leaks nothing, and on MicroPython our append is
# allocation-free, flat in the cached length and far cheaper than concatenation.
import random

import pytest

from host.bench import kv as bench


def test_first_fit_coalesces_back_to_one_range():
    ff = bench.FirstFit(100)
    spans = []
    for n in (10, 20, 30, 40):
        spans.append((ff.alloc(n), n))
    assert ff.alloc(1) == -1
    random.Random(3).shuffle(spans)
    for s, n in spans:
        ff.release(s, n)
    assert ff.free == [(0, 100)]


def test_first_fit_grows_in_place_or_moves():
    ff = bench.FirstFit(96)
    a = ff.alloc(16)
    b = ff.alloc(16)
    assert ff.grow(b, 16, 32) == b  # free space follows b: in place
    assert ff.grow(a, 16, 32) not in (a, -1)  # b blocks a: moved
    assert ff.largest() == 16


def test_churn_pool_beats_first_fit_at_high_occupancy():
    p = bench.churn_pool(16)
    f = bench.churn_first_fit(16)
    assert p["completed"] + p["failed"] == bench.CHURN_SEQUENCES == f["completed"] + f["failed"]
    assert p["success_rate"] > f["success_rate"]


def test_pool_serves_more_in_the_same_bytes_than_flat_arrays():
    # the capacity figures come from real runs of Pool + KVCache, so each can fail
    c = bench.capacity()
    tok = bench._layout().kv_bytes_per_token
    assert c["mixed_flat_sequences"] == bench.FLAT_SEQS
    assert c["mixed_pool_sequences_min"] >= c["mixed_flat_sequences"]  # a pool never holds fewer
    assert c["mixed_pool_tokens_median"] * tok <= c["bytes"]  # and never more tokens than the bytes hold
    assert c["shared_pool_requests"] > 2 * c["shared_flat_requests"]  # the prompt is stored once
    for policy in ("window", "sinks", "h2o"):
        assert c["evict_%s_pool_refused" % policy] == 0, policy  # eviction never refuses an append
        assert c["evict_%s_pool_sequences" % policy] * bench.WINDOW * tok <= c["bytes"]


def test_served_shared_counts_forks_until_the_pool_refuses():
    # with a budget only one sequence fits, no fork can take its own GEN tokens beyond it
    n = bench.served_shared()
    p, c, region, row = bench._pool_cache(64)
    free_after_prompt = p.n_blocks - bench.PROMPT // c.t
    assert n == free_after_prompt // -(-bench.GEN // c.t)


@pytest.mark.micropython
def test_micropython_append_is_flat_allocation_free_and_beats_concat():
    d = bench.micro_figures()
    assert d["ours_alloc_bytes"] == 0 and d["ours_alloc_appends"] > 0
    assert d["heap_locked_appends"] == d["heap_locked_appends_asked"] > 0  # no MemoryError under heap_lock
    assert d["concat_alloc_bytes_at_512"] >= 512 * 1280
    assert d["ours_ns_at_512"] < 2 * d["ours_ns_at_64"]
    assert d["concat_ns_at_512"] > 20 * d["ours_ns_at_512"]
    # every design of the comparison was measured in the same run
    for key in ("flat_kv", "flat_row", "floor", "reserve"):
        assert d["%s_ns_at_512" % key] > 0, key
