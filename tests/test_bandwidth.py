# The bandwidth tracker and cost model on CPython: property tests (hypothesis) against a
# plain reference of the bucketed window (window sums equal the charged bytes over any
# sequence, across the tick wrap; admission wakes a task at exactly the earliest bucket
# start where the window has room; throttled-wait stats add up), the board profiles'
# measured figures reproduced, and the decode loop charging its real traffic.
import copy
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT
from firmware_py import bandwidth as bwm
from firmware_py import board, compat, decode
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel
from firmware_py.status import E_FULL, E_RANGE, MAX_WAIT_US, OK

BOARD = board.load(os.path.join(ROOT, "boards", "esp32s3_n8r8.json"))
WIN, NB = 16000, 16
B = WIN // NB
TINY = os.path.join(ROOT, "models", "kvrtos-tiny")


class Ref:
    # the window by definition: every charge with its absolute time; the window at t holds
    # the charges whose bucket index is within NB - 1 of t's
    def __init__(self, t0):
        self.t0 = t0
        self.items = []  # (abs_time, tier, cat, n)

    def idx(self, t):
        return (t - self.t0) // B

    def window(self, now, tier, cat=None):
        c = self.idx(now)
        return sum(n for t, ti, ca, n in self.items
                   if ti == tier and (cat is None or ca == cat) and c - NB < self.idx(t) <= c)


def new(start=0, clock=None, kernel=None):
    clk = clock or VirtualClock(start)
    return clk, bwm.Bandwidth(BOARD, clk, kernel=kernel, window_us=WIN, buckets=NB)


OPS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4), st.integers(0, 50000), st.integers(0, 40000)),
               min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(OPS, st.sampled_from([0, compat.TICKS_PERIOD - 20000]))
def test_window_sums_equal_the_charged_bytes(ops, start):
    clk, bw = new(start)
    ref = Ref(0)  # absolute µs since start
    t = 0
    for tier, cat, n, dt in ops:
        clk.charge(dt)
        t += dt
        assert bw.charge(tier, cat, n) == OK
        ref.items.append((t, tier, cat, n))
        for ti in range(3):
            assert bw.window(ti) == ref.window(t, ti)
            for c in range(5):
                assert bw.window(ti, c) == ref.window(t, ti, c)
    rep = bw.report()
    for ti, name in enumerate(bw.names):
        assert rep[name]["all"]["bytes"] == sum(x[3] for x in ref.items if x[1] == ti)
        assert rep[name]["all"]["bytes"] == sum(rep[name][c]["bytes"] for c in bwm.CATEGORY_NAMES)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30000), st.integers(0, 2000)), max_size=30),
       st.integers(1, 1000), st.integers(1, 40000), st.integers(0, 3000))
def test_admission_wakes_at_exactly_the_earliest_bucket_with_room(prior, permille, n, lead):
    k = Kernel(VirtualClock(), max_tasks=4)
    clk, bw = new(clock=k.clock, kernel=k)
    ps = bw.tier_id("psram")
    budget = bw.set_budget(ps, bwm.IO, permille)
    ref = Ref(0)
    t = 0
    for m, dt in prior:  # plain charges (they are never refused by the budget)
        clk.charge(dt)
        t += dt
        bw.charge(ps, bwm.IO, m)
        ref.items.append((t, ps, bwm.IO, m))
    clk.charge(lead)
    t += lead
    got = []

    def task():
        got.append((yield bw.admit(ps, bwm.IO, n)))
        got.append(k.now())

    k.spawn("a", 1, task())
    k.run()
    if n > budget:
        assert got[0] == E_RANGE
        return
    # the reference: the first bucket start (or now) at which the window has room
    c = ref.idx(t)
    expect = None
    for g in range(c, c + NB + 1):
        if ref.window(g * B if g > c else t, ps, bwm.IO) + n <= budget:
            expect = t if g == c else g * B
            break
    if expect is None:
        assert got[0] == E_FULL
        return
    assert got[0] == OK
    assert compat.ticks_diff(got[1], 0) == expect
    ref.items.append((expect, ps, bwm.IO, n))
    assert bw.window(ps, bwm.IO) == ref.window(expect, ps, bwm.IO)
    assert bw.window(ps, bwm.IO) <= max(budget, ref.window(expect, ps, bwm.IO))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(1, 30000), st.integers(0, 5000)), min_size=1, max_size=8),
                min_size=1, max_size=4), st.integers(50, 400))
def test_throttled_wait_stats_add_up_and_admitted_traffic_stays_within_budget(tasks, permille):
    k = Kernel(VirtualClock(), max_tasks=8)
    clk, bw = new(clock=k.clock, kernel=k)
    ps = bw.tier_id("psram")
    budget = bw.set_budget(ps, bwm.KV_READ, permille)
    waits = []
    admitted = []

    def task(reqs):
        for n, work in reqs:
            t0 = k.now()
            rv = yield bw.admit(ps, bwm.KV_READ, n)
            if rv == OK:
                admitted.append(n)
                # throttled time: from the request to the grant (the timer's due time; the
                # task may run a little later, behind another task's slice)
                w = compat.ticks_diff(k.current.due, t0) if k.now() != t0 else 0
                assert compat.ticks_diff(k.now(), t0) >= w
                waits.append(w)
            else:
                assert rv in (E_RANGE, E_FULL)
                assert rv != E_RANGE or n > budget
            k.charge(work)

    for reqs in tasks:
        k.spawn("t", 1, task(reqs))
    k.run()
    r = bw.report()["psram"]
    assert r["kv_read"]["waits"] == sum(1 for w in waits if w > 0)
    assert r["kv_read"]["wait_us"] == sum(waits)
    assert r["all"]["wait_us"] == r["kv_read"]["wait_us"]
    assert r["kv_read"]["bytes"] == sum(admitted)
    assert r["kv_read"]["peak"] <= budget  # only admissions here: no window ever over the budget


def test_refusals_change_nothing_and_config_errors_are_one_line():
    clk, bw = new()
    before = bw.report()
    for args in ((0, 0, -1), (0, 99, 1), (5, 0, 1), (0, 0, 1.0), (0, 0, True), (0, 0, 2 ** 40), (None, 0, 1)):
        assert bw.charge(*args) == E_RANGE
    after = bw.report()
    for tier in bw.names:
        assert after[tier]["all"]["bytes"] == before[tier]["all"]["bytes"]
    for bad in (lambda: bw.set_budget(0, 0, -1), lambda: bw.tier_id("nope"), lambda: bw.category_id("x"),
                lambda: bwm.Bandwidth(BOARD, clk, window_us=1000, buckets=3),
                lambda: bwm.Bandwidth(BOARD, None)):
        with pytest.raises(bwm.BandwidthError) as e:
            bad()
        assert "\n" not in str(e.value)
    with pytest.raises(bwm.BandwidthError, match="admission needs the kernel"):
        bw.admit(0, 0, 1)


def test_cost_model_reproduces_the_measured_esp32s3_figures():
    c = bwm.CostModel(BOARD)
    sr, ps = 0, 1
    n = 100000  # the measurement's 100 KB copies

    def mbs(us):
        return n / us

    assert abs(mbs(c.copy_us(sr, sr, 0, n)) - 362) < 3
    assert abs(mbs(c.copy_us(ps, sr, 0, n)) - 38.6) < 0.2
    assert abs(mbs(c.copy_us(ps, sr, 1, n)) - 51) < 0.3
    assert abs(mbs(c.copy_us(sr, ps, 0, n)) - 56.7) < 0.3
    assert abs(mbs(c.copy_us(ps, ps, 0, n)) - 22.3) < 0.2
    # reads by cache line: 330 ns per line plus 147 MB/s fits 37.0 / 58.1 / 84.2 MB/s
    for lb, meas in ((16, 37.0), (32, 58.1), (64, 84.2)):
        ns = 330 + lb * 1000 / 147
        assert abs(lb * 1000 / ns - meas) / meas < 0.02
    assert c.line_bytes[ps] == 32 and abs(32 * 1000 / c.line_ns[ps] - 58.1) < 0.5
    assert c.cost_us(2, bwm.K_DMA, 100) == E_RANGE  # flash has no DMA engine here
    for kind in range(bwm.N_KINDS):  # no overflow at the largest size, on any tier that has the kind
        for tier in range(3):
            v = c.cost_us(tier, kind, bwm.CHARGE_MAX)
            assert v == E_RANGE or 0 < v < 2 ** 30


def test_contention_a_transfer_during_a_dma_finishes_later():
    clk, bw = new()
    ps = bw.tier_id("psram")
    dma = bw.move_copy(ps, 0, 1, bwm.IO, 51000)  # ~1 ms of DMA out of PSRAM
    cpu = bw.move(ps, bwm.K_READ, bwm.WEIGHTS, 38600)  # ~1 ms of CPU reads, starting now
    assert cpu == dma + bw.cost_us(ps, bwm.K_READ, 38600)
    clk.charge(cpu)
    assert bw.move(ps, bwm.K_READ, bwm.WEIGHTS, 38600) == bw.cost_us(ps, bwm.K_READ, 38600)  # free again
    r = bw.report()["psram"]["all"]
    assert r["stalls"] == 1 and r["stall_us"] == dma


def _tiny_session(**kw):
    return decode.Session(os.path.join(TINY, "model.bin"), os.path.join(TINY, "tokenizer.bin"), backend="plain", **kw)


def _decode(s, k, n):
    out = []
    k.spawn("decode", 1, s.task(k, s.encode("Once upon a time"), n, out.append))
    k.run()
    return b"".join(out)


def test_decode_charges_its_real_traffic_and_the_clock_follows_the_cost_model():
    plain = _tiny_session()
    k0 = Kernel(VirtualClock(), max_tasks=2)
    text0 = _decode(plain, k0, 12)
    assert k0.now() == 0  # without a tracker nothing is charged: decode as before

    s = _tiny_session(slice_us=0)  # a layer's traffic in one go (no slice bound): the cost model's figure exactly
    k = Kernel(VirtualClock(), max_tasks=2)
    bw = bwm.Bandwidth(BOARD, kernel=k)
    s.traffic = decode.traffic_for(s, bw)
    text = _decode(s, k, 12)
    assert text == text0  # the same tokens
    cfg = s.cfg
    per_layer, final = decode.weight_traffic(s.weights)
    assert (per_layer, final) == decode.layout_traffic(__import__("firmware_py.llama2c", fromlist=["plan"]).plan(
        os.path.join(TINY, "model.bin"))[1])
    forwards = s.n_prompt + s.n_new - 1  # the last token picked is never fed back
    row = s.layout.store_row
    rep = bw.report()["psram"]
    assert rep["weights"]["bytes"] == forwards * (cfg.n_layers * per_layer + final)
    assert rep["kv_write"]["bytes"] == forwards * cfg.n_layers * row
    assert rep["kv_read"]["bytes"] == cfg.n_layers * row * sum(range(1, forwards + 1))
    whole = sum(s.traffic.token_us(cfg.n_layers, c) for c in range(1, forwards + 1))
    assert k.now() == whole
    # with the default slice bound the same bytes go in pieces that fit half a slice, each
    # priced on its own: the tier's access latency once per piece more, and each piece's
    # sub-ns rounding (under 0.1 us a piece), nothing else
    s2 = _tiny_session()
    k2 = Kernel(VirtualClock(), max_tasks=2)
    bw2 = bwm.Bandwidth(BOARD, kernel=k2)
    s2.traffic = decode.traffic_for(s2, bw2)
    assert _decode(s2, k2, 12) == text0 and s2.pieces > 0
    assert bw2.report()["psram"]["weights"]["bytes"] == rep["weights"]["bytes"]
    lat_us = bw2.lat[bw2.tier_id("psram")] / 1000
    extra = k2.now() - whole
    assert s2.pieces * lat_us <= extra + 1 <= s2.pieces * (lat_us + 0.1) + 1, (extra, s2.pieces, lat_us)


def test_decode_with_admission_is_throttled_by_a_weights_budget():
    s = _tiny_session()
    k = Kernel(VirtualClock(), max_tasks=2)
    bw = bwm.Bandwidth(BOARD, kernel=k)
    bw.apply_preset("psram")
    ps = bw.tier_id("psram")
    bw.set_budget(ps, bwm.WEIGHTS, 5)  # 0.5 % of PSRAM: far below what the model reads
    s.traffic = decode.traffic_for(s, bw, admit=True)
    text = _decode(s, k, 6)
    ref = _decode(_tiny_session(), Kernel(VirtualClock(), max_tasks=2), 6)
    assert text == ref
    r = bw.report()["psram"]["weights"]
    assert r["waits"] > 0 and r["peak"] <= bw.budget[ps * bw.n_cat_max + bwm.WEIGHTS]
    forwards = s.n_prompt + s.n_new - 1
    per_layer, final = decode.weight_traffic(s.weights)
    assert r["bytes"] == forwards * (s.cfg.n_layers * per_layer + final)  # split, but every byte charged once


def test_costmodel_bench_prediction_and_emulation_agree():
    from host.bench import costmodel

    r = costmodel.measure()
    e = r["emulated"]
    assert e["max_abs_diff_us_per_token"] == 0
    # the bytes the emulation charged, against a count from the model's dimensions alone
    for what in ("weights", "kv_read", "kv_write"):
        assert e["psram_%s_bytes" % what] == e["independent_%s_bytes" % what] > 0, what
    p = r["predictions"][0]
    assert p["board"] == "esp32s3_n8r8" and p["weights_bytes_per_token"] > 1000000
    assert p["weights_only_tok_s"] == round(1e6 / p["weights_only_us_per_token"], 1)


def test_a_tracker_untouched_for_more_than_half_the_tick_circle_starts_afresh():
    clk, bw = new()
    ps = bw.tier_id("psram")
    bw.charge(ps, bwm.IO, 1000)
    clk.charge(compat.TICKS_PERIOD // 2 + 5000)  # ticks_diff now reads this as the past
    assert bw.window(ps) == 0
    assert bw.charge(ps, bwm.IO, 10) == OK and bw.window(ps) == 10
    assert bw.report()["psram"]["io"]["bytes"] == 1010


# --- idle gaps (review r2 finding 1): marks are relative to the last call, the gap since
# it is read mod the tick period, and a gap of the ring's span or more clears the window


def _busy(start=0):
    k = Kernel(VirtualClock(start), max_tasks=4)
    bw = bwm.Bandwidth(BOARD, kernel=k, window_us=WIN, buckets=NB)
    ps = bw.tier_id("psram")
    bud = bw.set_budget(ps, bwm.IO, 50)
    got = []

    def m():
        got.append(bw.move(ps, bwm.K_READ, bwm.WEIGHTS, 600000))
        got.append((yield bw.admit(ps, bwm.IO, bud)))
        got.append((yield bw.admit(ps, bwm.IO, bud)))  # booked one window ahead

    k.spawn("m", 1, m())
    k.run()
    assert got[1:] == [OK, OK]
    bw.charge(ps, bwm.WEIGHTS, 0)  # the grant lies ahead of this call, the tier busy
    return k.clock, bw, ps


def _idle(clk, bw, gap, poll):
    step = (1 << 29) - 1
    while gap > 0:
        d = min(step, gap)
        clk.charge(d)
        gap -= d
        if poll:
            bw.poll()


def _expired(bw, ps):
    assert bw.window(ps) == 0
    assert bw.wait_us(ps, bwm.IO, 100) == 0
    assert bw.occupy(ps, bwm.K_READ, 100) == bw.cost_us(ps, bwm.K_READ, 100)
    assert bw.admit_nowait(ps, bwm.IO, 100) == OK
    assert bw.window(ps) == 100


P = compat.TICKS_PERIOD


@pytest.mark.parametrize("gap,poll", [
    (600000000, False),  # 10 min, untouched
    (P // 2 + 1, False),  # just past half the circle (where ticks_diff turns negative)
    (P - 1, False),  # 2**30 - 1 us, untouched
    (P, True),  # 2**30 us (17.9 min): polled
    (2 * P, True),  # 2**31 us
    (3 * P, True),  # whole tick periods
    (7 * P + 54321, True),
    (P + 5, True),
])
@pytest.mark.parametrize("start", [0, P - 3000, P // 2])
def test_an_idle_tracker_has_expired_everything_however_long_the_gap(gap, poll, start):
    clk, bw, ps = _busy(start)
    _idle(clk, bw, gap, poll)
    _expired(bw, ps)


def test_poll_task_keeps_a_kernel_idling_for_several_tick_circles_exact():
    clk, bw, ps = _busy()
    k = bw.k
    res = []

    def idler():
        for _ in range(2 * 8 + 3):  # 19 x (2**29 - 1) us: past nine tick circles
            yield k.sleep_us(MAX_WAIT_US)
        res.append((bw.window(ps), bw.occupy(ps, bwm.K_READ, 100), bw.admit_nowait(ps, bwm.IO, 100)))
        k.stop()

    k.spawn("poll", 0, bw.poll_task())
    k.spawn("idle", 1, idler())
    k.run()
    assert res == [(0, bw.cost_us(ps, bwm.K_READ, 100), OK)]
    for bad in (MAX_WAIT_US + 1, 0, 1.0, True):
        with pytest.raises(bwm.BandwidthError, match="every_us"):
            bw.poll_task(bad)  # at the call: the generator is never made
    nok = bwm.Bandwidth(BOARD, clock=bw.clock)  # no kernel
    with pytest.raises(bwm.BandwidthError):
        nok.poll_task()


def test_a_whole_period_with_no_call_at_all_reads_as_no_gap_and_stays_bounded():
    # the documented limit: the clock reads the same ticks, so nothing can tell; the marks
    # are relative, so at worst the old window counts once more (no stale far-future mark)
    clk, bw, ps = _busy()
    w0 = bw.window(ps)
    clk.charge((1 << 29) - 1)
    clk.charge((1 << 29) - 1)
    clk.charge(2)
    assert bw.window(ps) == w0  # as if no time passed (the poll rule is what closes this)
    assert 0 <= bw.wait_us(ps, bwm.IO, 100) <= 2 * WIN
    assert 0 <= bw.occupy(ps, bwm.K_READ, 100) < 100000


GAPS = st.one_of(st.integers(0, 40000), st.integers(40000, (1 << 30) - 1))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4), st.integers(0, 50000), GAPS), min_size=1, max_size=30),
       st.sampled_from([0, compat.TICKS_PERIOD - 20000]))
def test_window_sums_equal_the_charged_bytes_across_long_idle_gaps(ops, start):
    clk, bw = new(start)
    ref = Ref(0)
    t = 0
    for tier, cat, n, dt in ops:
        _idle(clk, bw, dt, False)  # untouched: every gap below 2**30 us
        t += dt
        assert bw.charge(tier, cat, n) == OK
        ref.items.append((t, tier, cat, n))
        for ti in range(3):
            assert bw.window(ti) == ref.window(t, ti)


# --- per-tier sums (finding 2): bounded by the tier's bucket limit, refusals change nothing


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.sampled_from([bwm.CHARGE_MAX, 1 << 22, 12345, 1]),
                          st.integers(0, 3000)), min_size=1, max_size=120))
def test_tier_sums_and_peaks_never_pass_2_30(ops):
    clk, bw = new()
    for i in range(4):
        bw.add_category("u%d" % i)
    sr = bw.tier_id("sram")
    for cat, n, dt in ops:
        clk.charge(dt)
        before = (bw.window(sr), bw.window(sr, cat), bw.report()["sram"]["all"]["bytes"])
        r = bw.charge(sr, cat, n)
        after = (bw.window(sr), bw.window(sr, cat), bw.report()["sram"]["all"]["bytes"])
        if r == OK:
            assert after == (before[0] + n, before[1] + n, before[2] + n)
        else:
            assert r == E_RANGE and after == before
        assert 0 <= bw.twin[sr] <= compat_int_max()
        rep = bw.report()["sram"]["all"]
        assert 0 <= rep["peak"] <= compat_int_max()


def compat_int_max():
    from firmware_py.status import INT_MAX
    return INT_MAX


def test_a_full_tier_bucket_refuses_every_category_and_admission():
    k = Kernel(VirtualClock(), max_tasks=4)
    bw = bwm.Bandwidth(BOARD, kernel=k, window_us=WIN, buckets=NB)
    sr = bw.tier_id("sram")
    m = bw.bucket_max
    while m > 0:
        p = min(m, bwm.CHARGE_MAX)
        assert bw.charge(sr, bwm.WEIGHTS, p) == OK
        m -= p
    assert bw.charge(sr, bwm.KV_READ, 1) == E_RANGE
    assert bw.charge_copy(sr, bw.tier_id("psram"), bwm.IO, 1) == E_RANGE
    assert bw.report()["sram"]["kv_read"]["refused"] == 1
    bw.set_budget(sr, bwm.IO, 1000)
    got = []

    def a():
        got.append((yield bw.admit(sr, bwm.IO, 10)))

    k.spawn("a", 1, a())
    k.run()
    assert got == [E_RANGE] and bw.window(sr, bwm.IO) == 0


# --- the cost model (finding 3): never above 2**30 - 1; values unchanged


def _old_cost_us(bw, tier, kind, n):
    # cost_us as it was before the overflow guards (the tiers benchmark depends on these)
    if n == 0:
        return 0
    if kind == bwm.K_LINE:
        lines = (n + bw.line_bytes[tier] - 1) // bw.line_bytes[tier]
        c = bw.line_ns[tier]
        return (lines // 1000) * c + ((lines % 1000) * c) // 1000
    i = tier * bwm.N_KINDS + kind
    q = bw.qk[i]
    if q == 0:
        return E_RANGE
    if bw.slow[i]:
        return (n // 1000) * q + ((n % 1000) * q + bw.lat[tier]) // 1000
    kib = n >> 10
    return (kib // 1000) * q + ((kib % 1000) * q + (((n & 1023) * q) >> 10) + bw.lat[tier]) // 1000


BOARDS = sorted(f for f in os.listdir(os.path.join(ROOT, "boards")) if f.endswith(".json"))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(BOARDS), st.integers(0, 10), st.integers(0, bwm.N_KINDS - 1), st.integers(0, bwm.CHARGE_MAX))
def test_cost_us_and_copy_us_values_are_unchanged(name, ti, kind, n):
    brd = board.load(os.path.join(ROOT, "boards", name))
    bw = bwm.CostModel(brd)
    tier = ti % bw.n_tiers
    old = _old_cost_us(bw, tier, kind, n)
    new_ = bw.cost_us(tier, kind, n)
    if old > 0x3FFFFFFF:
        assert new_ == E_RANGE
    else:
        assert new_ == old
    for dst in range(bw.n_tiers):
        for dma in (0, 1):
            c = bw.copy_us(tier, dst, dma, n)
            if tier == dst:
                a = _old_cost_us(bw, tier, bwm.K_DMA if dma else bwm.K_COPY, n)
                want = (2 * a if a >= 0 else a) if dma else a
            else:
                a = _old_cost_us(bw, tier, bwm.K_DMA if dma else bwm.K_READ, n)
                b = _old_cost_us(bw, dst, bwm.K_DMA if dma else bwm.K_WRITE, n)
                want = E_RANGE if a < 0 or b < 0 else max(a, b)
            assert c == (E_RANGE if want > 0x3FFFFFFF else want)


def _slow_board():
    d = json.load(open(os.path.join(ROOT, "boards", "esp32s3_n8r8.json")))
    t = copy.deepcopy(d["memory"][0])
    t.update(name="slow", kind="flash", bandwidth_bytes_per_s=15625, latency_ns=100, dma=True)
    t["cost"] = {k: {"value": v, "source": "test"} for k, v in (
        ("read_bytes_per_s", 15625), ("write_bytes_per_s", 15625), ("copy_bytes_per_s", 15625),
        ("dma_bytes_per_s", 31250), ("line_bytes", 4), ("line_ns", 999000), ("line_stream_bytes_per_s", 4000000))}
    d["memory"].append(t)
    return board.loads(json.dumps(d))


def test_cost_model_refuses_results_past_2_30_minus_1():
    cm = bwm.Bandwidth(_slow_board(), clock=VirtualClock())
    sl = cm.tier_id("slow")
    ps = cm.tier_id("psram")
    assert _old_cost_us(cm, sl, bwm.K_READ, bwm.CHARGE_MAX) == 1 << 30  # the finding
    assert cm.cost_us(sl, bwm.K_READ, bwm.CHARGE_MAX) == E_RANGE
    assert _old_cost_us(cm, sl, bwm.K_LINE, bwm.CHARGE_MAX) > 1 << 30
    assert cm.cost_us(sl, bwm.K_LINE, bwm.CHARGE_MAX) == E_RANGE
    a = cm.cost_us(sl, bwm.K_DMA, bwm.CHARGE_MAX)
    assert 0x1FFFFFFF < a <= 0x3FFFFFFF
    assert cm.copy_us(sl, sl, 1, bwm.CHARGE_MAX) == E_RANGE
    assert cm.occupy_copy(sl, sl, 1, bwm.CHARGE_MAX) == E_RANGE
    for n in range(0, bwm.CHARGE_MAX + 1, 99991):
        for kind in range(bwm.N_KINDS):
            assert cm.cost_us(sl, kind, n) <= 0x3FFFFFFF
    u = cm.occupy(sl, bwm.K_READ, bwm.CHARGE_MAX - 1000)
    assert 0 < u <= 0x3FFFFFFF
    assert cm.occupy(sl, bwm.K_READ, 1000) == E_RANGE
    assert cm.move(sl, bwm.K_READ, bwm.IO, 1000) == E_RANGE and cm.window(sl) == 0
    assert cm.move_copy(ps, sl, 0, bwm.IO, 1000) == E_RANGE and cm.window(ps) == 0
    assert cm.report()["slow"]["all"]["busy_us"] == u
    with pytest.raises(bwm.BandwidthError, match="latency_ns"):
        d = json.loads(json.dumps(json.load(open(os.path.join(ROOT, "boards", "esp32s3_n8r8.json")))))
        d["memory"][0]["latency_ns"] = 10 ** 7 + 1
        bwm.CostModel(board.loads(json.dumps(d)))
    with pytest.raises(bwm.BandwidthError, match="horizon"):
        bwm.Bandwidth(BOARD, clock=VirtualClock(), window_us=1000000, horizon=300)


# --- carry_ns (opt-in): per-tier ns remainders make many small transfers sum exactly


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 300), st.integers(0, bwm.N_KINDS - 1))
def test_carry_ns_sums_back_to_back_transfers_exactly(n, count, kind):
    bw = bwm.Bandwidth(BOARD, clock=VirtualClock(), carry_ns=True)
    plain = bwm.Bandwidth(BOARD, clock=VirtualClock())
    ps = bw.tier_id("psram")
    ns = bw.cost_ns(ps, kind, n)
    last = last_plain = 0
    for _ in range(count):
        last = bw.occupy(ps, kind, n)
        last_plain = plain.occupy(ps, kind, n)
    assert last == count * ns // 1000
    assert last_plain == count * (ns // 1000)  # the default: rounded down per call
    assert bw.cost_us(ps, kind, n) == plain.cost_us(ps, kind, n) == ns // 1000


def test_decode_traffic_never_counts_a_refused_piece():
    # a refused move used to add its E_RANGE (-5) into the µs total and count bytes never
    # charged: now a refused piece moved nothing and is counted in `refused` only
    k = Kernel(VirtualClock(), max_tasks=2)
    bw = bwm.Bandwidth(BOARD, kernel=k)
    ps = bw.tier_id("psram")
    tr = bwm.DecodeTraffic(bw, 181760, 131584, 256, ps, ps)
    assert bw.charge(ps, bwm.IO, bwm.CHARGE_MAX) == OK
    assert bw.charge(ps, bwm.IO, bw.bucket_max - bwm.CHARGE_MAX - 300) == OK  # 300 B of room left
    us = tr.layer(4)
    assert us == bw.cost_us(ps, bwm.K_WRITE, 256)  # only the K/V row moved
    assert tr.final() == 0
    assert (tr.refused, tr.bytes_w, tr.bytes_kv, tr.us, tr.s) == (3, 0, 256, us, 0)
    rep = bw.report()["psram"]
    assert (rep["weights"]["bytes"], rep["kv_write"]["bytes"], rep["kv_read"]["bytes"]) == (0, 256, 0)
    for bad in (-1, 1.0, True, None, 1 << 70, bwm.CHARGE_MAX // 256 + 1):
        assert tr.layer(bad) == E_RANGE
    assert tr.refused == 3
    # nothing refused: the same totals as before (µs of the whole layer, bytes of every piece)
    k.clock.advance(10 * bw.window_us)
    tr2 = bwm.DecodeTraffic(bw, 181760, 131584, 256, ps, ps)
    us2 = tr2.layer(10)
    assert us2 > 0 and (tr2.us, tr2.bytes_w, tr2.bytes_kv, tr2.refused) == (us2, 181760, 256 * 11, 0)


def test_charge_copy_counts_bad_arguments_like_charge():
    k = Kernel(VirtualClock(), max_tasks=2)
    bw = bwm.Bandwidth(BOARD, kernel=k)
    ps, sr = bw.tier_id("psram"), bw.tier_id("sram")
    n_t = bw.n_tiers
    assert bw.charge_copy(ps, n_t, bwm.IO, 100) == E_RANGE  # bad dst
    assert bw.charge_copy(ps, sr, bwm.IO, -1) == E_RANGE
    assert bw.charge_copy(ps, sr, bwm.IO, 2.0) == E_RANGE
    assert bw.charge_copy(ps, sr, 99, 100) == E_RANGE  # no (src, cat) row to count in
    assert bw.charge_copy(n_t, sr, bwm.IO, 100) == E_RANGE
    assert bw.charge(ps, bwm.IO, -1) == E_RANGE
    rep = bw.report()
    assert rep["psram"]["io"]["refused"] == 4 and rep["sram"]["io"]["refused"] == 0
