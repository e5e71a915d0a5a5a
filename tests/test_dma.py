# Property tests of the DMA descriptor queue (firmware_py/dma.py) on CPython: random
# producers submit random descriptors (sizes, offsets, buffers, categories, some invalid)
# into a small ring under backpressure, with merging on and off, with and without the
# bandwidth tracker pricing each burst on the virtual clock. Pinned: every accepted
# descriptor is executed exactly once, in submission order (bursts partition the cookies
# 0..n-1 in order, each burst a legal merge), nothing is dropped, every refusal is the one
# the reference predicts, every byte lands where it was sent (the reference applies the
# copies one after another), and bytes moved == bytes charged on every tier touched.
from hypothesis import HealthCheck, given, settings, strategies as hs

from firmware_py import bandwidth as bwm
from firmware_py import dma
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, T_FAULTS
from firmware_py.status import E_RANGE, OK
from host import boards, paths

BRD = boards.load(paths.DEFAULT_BOARD)
SIZES = (512, 2048, 4096)  # the three buffers' bytes
TIERS = (0, 1, 0)  # SRAM, PSRAM, SRAM (tier numbers of the default board: sram, psram, flash)


class Recorder(dma.DMAQueue):
    # the queue, recording each burst as it lands: (first cookie, descriptors, bytes, src, soff, dst, doff, cat)
    def __init__(self, *a, **kw):
        dma.DMAQueue.__init__(self, *a, **kw)
        self.log = []

    def _land(self):
        if self.burst_n:
            b = self.burst
            self.log.append((b[dma.F_COOKIE], self.burst_n, b[dma.F_LEN], b[dma.F_SRC], b[dma.F_SOFF],
                             b[dma.F_DST], b[dma.F_DOFF], b[dma.F_CAT]))
        dma.DMAQueue._land(self)


def valid(req, align):
    # the reference's verdict on a request (src, soff, dst, doff, n, cat): True or False
    s, so, d, do, n, cat = req
    if not (1 <= n <= dma.DESC_MAX) or so < 0 or do < 0 or cat < 0 or cat >= 4:
        return False
    if so + n > SIZES[s] or do + n > SIZES[d]:
        return False
    a = max(align[TIERS[s]], align[TIERS[d]])
    if so % align[TIERS[s]] or do % align[TIERS[d]] or n % a:
        return False
    if s == d and so < do + n and do < so + n:
        return False
    return True


def request(draw):
    # a request, mostly valid: PSRAM sides on 32-byte lines, sometimes off them or out of range
    s = draw(hs.integers(0, 2))
    d = draw(hs.integers(0, 2))
    line = draw(hs.sampled_from((32, 32, 32, 4, 1)))
    n = draw(hs.integers(1, 24)) * line
    if draw(hs.integers(0, 19)) == 0:
        n = draw(hs.sampled_from((0, 4096, 4095, 4064)))
    so = draw(hs.integers(0, max(0, (SIZES[s] - n) // line))) * line
    do = draw(hs.integers(0, max(0, (SIZES[d] - n) // line))) * line
    if draw(hs.integers(0, 19)) == 0:
        do += draw(hs.sampled_from((1, 16, SIZES[d])))
    cat = draw(hs.sampled_from((bwm.KV_WRITE, bwm.KV_WRITE, bwm.KV_READ, bwm.IO)))
    return (s, so, d, do, n, cat)


@hs.composite
def runs_of(draw):
    # a run of contiguous rows, as a KV spill submits them, or one random request
    if draw(hs.booleans()):
        s = draw(hs.sampled_from((0, 2)))
        d = 1
        row = draw(hs.sampled_from((32, 64, 128, 256)))
        k = draw(hs.integers(1, min(12, SIZES[s] // row, SIZES[d] // row)))
        so = draw(hs.integers(0, (SIZES[s] - row * k) // 32)) * 32
        do = draw(hs.integers(0, (SIZES[d] - row * k) // 32)) * 32
        return [(s, so + i * row, d, do + i * row, row, bwm.KV_WRITE) for i in range(k)]
    return [request(draw)]


@hs.composite
def scenarios(draw):
    producers = []
    for _ in range(draw(hs.integers(1, 3))):
        reqs = []
        for run in draw(hs.lists(runs_of(), min_size=1, max_size=8)):
            reqs += run
        pauses = [draw(hs.sampled_from((0, 0, 0, 1, 7, 40))) for _ in reqs]
        producers.append((draw(hs.integers(1, 3)), reqs, pauses, draw(hs.booleans())))
    return {
        "slots": draw(hs.integers(1, 8)),
        "max_burst": draw(hs.sampled_from((32, 256, 1024, 4096, 16384))),
        "merge": draw(hs.booleans()),
        "tracker": draw(hs.booleans()),
        "engine_prio": draw(hs.integers(0, 4)),
        "producers": producers,
        "seed": draw(hs.integers(0, 2**16)),
    }


def fill(seed):
    bufs = []
    x = seed * 2654435761 + 1
    for n in SIZES:
        b = bytearray(n)
        for i in range(n):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            b[i] = x >> 16 & 0xFF
        bufs.append(b)
    return bufs


def charged(bw, tier, cat):
    o = (tier * (bw.n_cat_max + 1) + cat) * bwm.NSTAT
    return bw.st[o + bwm.S_BYTES_G] * 10**9 + bw.st[o + bwm.S_BYTES]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_ring_never_loses_duplicates_or_reorders_and_bytes_land(sc):
    k = Kernel(VirtualClock(), max_tasks=8, verbose=False)
    bw = bwm.Bandwidth(BRD, kernel=k) if sc["tracker"] else None
    q = Recorder(k, slots=sc["slots"], max_burst=sc["max_burst"], merge=sc["merge"], bw=bw,
                 board=BRD if bw is not None else None)
    bufs = fill(sc["seed"])
    ref = [bytearray(b) for b in bufs]
    ids = [q.add_buffer(b, t) for b, t in zip(bufs, TIERS, strict=True)]
    align = {0: 1, 1: 32}
    results = []  # (producer, request index, result) in the order the producers saw them
    accepted = {}  # cookie -> request

    def producer(p, reqs, pauses, nowait):
        last = None
        for i, (req, pause) in enumerate(zip(reqs, pauses, strict=True)):
            s, so, d, do, n, cat = req
            if nowait:
                while True:
                    r = q.submit_nowait(ids[s], so, ids[d], do, n, cat)
                    if r != dma.E_FULL:
                        break
                    yield k.sleep_us(3)  # full: retry, the producer's choice (nothing is dropped by the queue)
            else:
                r = yield q.submit(ids[s], so, ids[d], do, n, cat)
            results.append((p, i, r))
            if r >= 0:
                accepted[r] = req
                last = r
            if pause:
                yield k.sleep_us(pause)
        if last is not None:
            rv = yield q.wait(last)
            assert rv == OK and q.done(last) == 1

    for p, (prio, reqs, pauses, nowait) in enumerate(sc["producers"]):
        k.spawn("p%d" % p, prio, producer(p, reqs, pauses, nowait))
    q.spawn(sc["engine_prio"])
    k.run(10**7)
    assert k.totals[T_FAULTS] == 0
    # every producer got a verdict for every request, and the verdict is the reference's
    seen = {}
    for p, i, r in results:
        seen.setdefault(p, []).append(i)
        req = sc["producers"][p][1][i]
        assert (r >= 0) == valid(req, align), (req, r)
        if r < 0:
            assert r == E_RANGE
    for p, (_, reqs, _, _) in enumerate(sc["producers"]):
        assert seen.get(p, []) == list(range(len(reqs)))
    n = len(accepted)
    assert sorted(accepted) == list(range(n)), "cookies are 0..n-1, each once"
    # bursts partition the cookies in order: nothing lost, duplicated or reordered
    nxt = 0
    for first, cnt, nbytes, s, so, d, do, cat in q.log:
        assert first == nxt
        reqs = [accepted[c] for c in range(first, first + cnt)]
        assert sum(r[4] for r in reqs) == nbytes
        assert (reqs[0][1], reqs[0][3]) == (so, do), "a burst starts where its first descriptor does"
        assert nbytes <= sc["max_burst"] or cnt == 1
        if not sc["merge"]:
            assert cnt == 1
        for j, (rs, rso, rd, rdo, _rn, rcat) in enumerate(reqs):
            assert (ids[rs], ids[rd], rcat) == (s, d, cat)
            if j:
                prev = reqs[j - 1]
                assert rso == prev[1] + prev[4] and rdo == prev[3] + prev[4], "merged only when contiguous on both sides"
        nxt += cnt
    assert nxt == n, "every accepted descriptor executed"
    st = q.stats()
    assert (st["submitted"], st["completed"], st["bursts"], st["merged"]) == (n, n, len(q.log), n - len(q.log))
    assert st["max_depth"] <= sc["slots"] and st["depth"] == 0 and st["in_flight"] == 0
    # the reference: the accepted copies applied one after another in cookie order
    for c in range(n):
        s, so, d, do, ln, _ = accepted[c]
        ref[d][do:do + ln] = ref[s][so:so + ln]
    for b, r in zip(bufs, ref, strict=True):
        assert b == r
    moved = sum(accepted[c][4] for c in range(n))
    assert st["bytes"] == moved
    if bw is not None:
        # bytes moved == bytes charged: each descriptor once on each tier it touches, to its category
        for tier in (0, 1):
            for cat in (bwm.KV_WRITE, bwm.KV_READ, bwm.IO):
                want = 0
                for c in range(n):
                    s, _, d, _, ln, rc = accepted[c]
                    if rc == cat:
                        want += ln * ((TIERS[s] == tier) + (TIERS[d] == tier))
                assert charged(bw, tier, cat) == want
        assert charged(bw, 0, bwm.DMA) == dma.DESC_BYTES * st["links"]


@settings(max_examples=60, deadline=None)
@given(hs.integers(1, 6), hs.lists(hs.integers(1, 40), min_size=1, max_size=60), hs.booleans())
def test_backpressure_blocks_and_counts_stall(slots, rows, merge):
    # one producer streaming 32-byte-multiple rows into a small ring, the engine priced by
    # the tracker: the producer blocks (stalls counted, with time) and nothing is dropped
    k = Kernel(VirtualClock(), max_tasks=4, verbose=False)
    bw = bwm.Bandwidth(BRD, kernel=k)
    q = dma.DMAQueue(k, slots=slots, merge=merge, bw=bw, board=BRD)
    total = sum(rows) * 32
    src = bytearray((i * 31 + 7) & 0xFF for i in range(total))
    dst = bytearray(total)
    s = q.add_buffer(src, 0)
    d = q.add_buffer(dst, 1)
    got = []

    def prod():
        off = 0
        for r in rows:
            c = yield q.submit(s, off, d, off, r * 32, bwm.KV_WRITE)
            got.append(c)
            off += r * 32
        assert (yield q.wait(got[-1])) == OK

    k.spawn("p", 1, prod())
    q.spawn(2)
    k.run(10**7)
    assert got == list(range(len(rows)))
    assert dst == src
    st = q.stats()
    if len(rows) > slots + 1:
        assert st["stalls"] > 0
    assert st["max_depth"] <= slots


def test_constants_match_the_tracker():
    assert (dma.BW_K_DMA, dma.BW_CAT_DMA) == (bwm.K_DMA, bwm.DMA)
