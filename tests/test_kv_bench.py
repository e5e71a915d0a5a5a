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


@pytest.mark.micropython
def test_micropython_append_is_flat_allocation_free_and_beats_concat():
    d = bench.micro_figures()
    assert d["alloc_bytes_per_append"] == 0
    assert d["alloc_bytes_per_append_concat_at_512"] >= 512 * 1280
    assert d["append_ns_at_512"] < 2 * d["append_ns_at_64"]
    assert d["append_ns_concat_at_512"] > 20 * d["append_ns_at_512"]
