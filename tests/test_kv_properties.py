# Property tests over random interleavings of open/append/score/fork/close on several
# sequences sharing one pool: blocks never overlap (each is referenced exactly as
# often as its refcount says), nothing leaks, quotas hold, a sequence only ever
# reads its own rows, and every position the policy keeps reads back exactly.
import random
import struct

from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from firmware_py import kv, pool, quant, status

T = 4  # tokens per block: small, so rings wrap and blocks fill often
LAYOUT = kv.Layout(3, 2, 4, "fp32", tokens_per_block=T)
N_BLOCKS = 24
MAX_SEQS = 5


def row_for(uid, pos):
    # a token row whose bytes depend on (uid, pos) only
    rnd = random.Random(uid * 100003 + pos)
    return bytearray(rnd.getrandbits(8) for _ in range(LAYOUT.row_bytes))


class KVMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pool = pool.Pool(LAYOUT.block_bytes, N_BLOCKS)
        self.cache = kv.KVCache(self.pool, LAYOUT, max_seqs=MAX_SEQS, max_blocks_per_seq=8, h2o=True)
        self.regions = [self.pool.add_region(q) for q in (6, 10, 24)]
        self.seqs = {}  # seq id -> {"uid", "policy", "cap", "sinks", "recent", "rows": {pos: uid}}
        self.next_uid = 1

    @rule(policy=st.sampled_from(kv.POLICIES), budget=st.integers(6, 32), region=st.integers(0, 2))
    def open(self, policy, budget, region):
        sinks, recent = (2, 0) if policy == "sinks" else (2, 2) if policy == "h2o" else (0, 0)
        s = self.cache.open(self.regions[region], policy, budget, sinks, recent)
        if s < 0:
            assert s in (status.E_NO_SLOT, status.E_NO_BLOCK)
            return
        assert s not in self.seqs
        self.seqs[s] = {"uid": self.next_uid, "policy": policy, "cap": budget, "sinks": sinks, "rows": {}}
        self.next_uid += 1

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), k=st.integers(1, 12))
    def append(self, data, k):
        s = data.draw(st.sampled_from(sorted(self.seqs)))
        m = self.seqs[s]
        for _ in range(k):
            pos = self.cache.length(s)
            r = self.cache.append(s, row_for(m["uid"], pos))
            if r < 0:
                assert r in (status.E_FULL, status.E_NO_BLOCK)
                assert r != status.E_FULL or (m["policy"] == "full" and pos == m["cap"])
                assert self.cache.length(s) == pos, "a refused append changes nothing"
                return
            m["rows"][pos] = m["uid"]
            if m["policy"] == "h2o":
                # score the new slot and one random cached slot (may be in a shared block)
                assert self.cache.add_score(s, self.cache.locate(s, pos), data.draw(st.integers(0, 1000))) in (status.OK, status.E_NO_BLOCK)
                other = data.draw(st.integers(0, self.cache.cached(s) - 1))
                assert self.cache.add_score(s, other, 1) in (status.OK, status.E_NO_BLOCK)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        s = data.draw(st.sampled_from(sorted(self.seqs)))
        f = self.cache.fork(s)
        if f < 0:
            assert f == status.E_NO_SLOT
            return
        src = self.seqs[s]
        self.seqs[f] = {"uid": self.next_uid, "policy": src["policy"], "cap": src["cap"], "sinks": src["sinks"],
                        "rows": dict(src["rows"])}
        self.next_uid += 1

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def close(self, data):
        s = data.draw(st.sampled_from(sorted(self.seqs)))
        self.cache.close(s)
        del self.seqs[s]

    @invariant()
    def blocks_never_overlap_and_refcounts_match(self):
        c, p = self.cache, self.pool
        refs = [0] * N_BLOCKS
        for s in self.seqs:
            for i in range(c.max_blocks):
                b = c.table[c.slot_of(s) * c.max_blocks + i]
                if b >= 0:
                    refs[b] += 1
        for b in range(N_BLOCKS):
            assert p.ref[b] == refs[b], "block %d: refcount %d, tables hold %d" % (b, p.ref[b], refs[b])
        assert p.blocks_used == sum(1 for r in refs if r) and p.blocks_free == N_BLOCKS - p.blocks_used
        # the free list holds exactly the unreferenced blocks, once each
        seen, b = set(), p.head
        while b >= 0:
            assert b not in seen and refs[b] == 0
            seen.add(b)
            b = p.next[b]
        assert len(seen) == p.blocks_free

    @invariant()
    def quotas_hold(self):
        p = self.pool
        for r in self.regions:
            held = sum(1 for b in range(N_BLOCKS) if p.ref[b] and p.owner[b] == r)
            assert held == p.region_used[r] <= p.quota[r]

    @invariant()
    def every_kept_position_reads_back_its_own_row(self):
        c = self.cache
        out = bytearray(LAYOUT.layer_row)
        for s, m in self.seqs.items():
            n = c.length(s)
            cap, pol, sk = m["cap"], m["policy"], m["sinks"]
            kept = [pos for pos in range(n) if c.locate(s, pos) >= 0]
            if pol == "full":
                want = list(range(n))
            elif pol == "window":
                want = list(range(max(0, n - cap), n))
            elif pol == "sinks":
                want = list(range(min(sk, n))) + list(range(max(sk, n - (cap - sk)), n))
            else:
                want = None
                assert len(kept) == min(n, cap)
                assert all(p in kept for p in range(min(sk, n))), "h2o keeps its sinks"
                assert all(p in kept for p in range(max(0, n - 2), n)), "h2o keeps the recent"
            if want is not None:
                assert kept == want, (pol, cap, n, kept)
            slots = [c.locate(s, pos) for pos in kept]
            assert len(set(slots)) == len(slots), "two positions in one slot"
            for pos in kept:
                want_row = row_for(m["rows"][pos], pos)
                for layer in range(LAYOUT.n_layers):
                    assert c.read(s, pos, layer, out, 0) == status.OK
                    lo = layer * LAYOUT.layer_row
                    assert out == want_row[lo:lo + LAYOUT.layer_row], "seq %d pos %d layer %d" % (s, pos, layer)

    def teardown(self):
        for s in list(self.seqs):
            self.cache.close(s)
        assert self.pool.blocks_free == N_BLOCKS, "blocks leaked"
        assert all(u == 0 for u in self.pool.region_used)


TestKVMachine = KVMachine.TestCase
TestKVMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from(["int8", "int4", "int4tok"]), data=st.data())
def test_quantized_rows_read_back_within_the_bound(dtype, data):
    layout = kv.Layout(2, 2, 8, dtype, group=4, tokens_per_block=2)
    p = pool.Pool(layout.block_bytes, 2)
    c = kv.KVCache(p, layout, max_seqs=1)
    s = c.open(p.add_region(2), "window", 3)
    fl = st.floats(-100, 100, allow_nan=False, width=32)
    ks = [data.draw(st.lists(fl, min_size=16, max_size=16)) for _ in range(2)]
    vs = [data.draw(st.lists(fl, min_size=16, max_size=16)) for _ in range(2)]
    row = bytearray(layout.row_bytes)
    quant.pack_token(layout, ks, vs, row)
    for _ in range(data.draw(st.integers(1, 7))):
        assert c.append(s, row) >= 0
    out = bytearray(layout.layer_row)
    for layer in range(2):
        assert c.read(s, c.length(s) - 1, layer, out, 0) == status.OK
        for which, src in ((0, ks[layer]), (1, vs[layer])):
            got = quant.unpack_layer(layout, out, 0, which)
            if layout.kivi and which == 0:  # per channel over the block: every slot holds this row
                for a, b in zip(got, src, strict=True):
                    assert abs(a - b) <= quant.kivi_bound([b])
                continue
            for j in range(0, 16, 8):  # per KV head
                head = src[j:j + 8]
                bound = quant.error_bound(layout, head)
                assert max(abs(a - b) for a, b in zip(got[j:j + 8], head, strict=True)) <= bound


@settings(max_examples=100, deadline=None)
@given(xs=st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=8, max_size=8))
def test_fp32_rows_read_back_exactly(xs):
    layout = kv.Layout(1, 1, 8, "fp32", tokens_per_block=1)
    p = pool.Pool(layout.block_bytes, 1)
    c = kv.KVCache(p, layout, max_seqs=1)
    s = c.open(p.add_region(1), "full", 1)
    row = bytearray(layout.row_bytes)
    quant.pack_token(layout, [xs], [xs[::-1]], row)
    assert c.append(s, row) >= 0
    out = bytearray(layout.layer_row)
    assert c.read(s, 0, 0, out, 0) == status.OK
    assert quant.unpack_layer(layout, out, 0, 0) == xs and quant.unpack_layer(layout, out, 0, 1) == xs[::-1]
    assert struct.unpack_from("<8f", out, 0) == tuple(xs)
