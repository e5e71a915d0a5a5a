# Tiered KV placement (firmware_py/tiers.py, flashkv.py) on CPython: what is read back is
# always what was written, through every tier (SRAM only, SRAM + PSRAM, SRAM + PSRAM +
# flash; CPU copies or the DMA queue; write-through or batched write-back; reads and
# read-aheads interleaved with appends, flushes and copies in flight), attention streamed
# over tiers.block() equals attention over a plain cache, and the accounting (erases, bytes
# charged) follows the model. The heap-locked half is tests/firmware/fw_tiers.py.
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from firmware_py import bandwidth as bwm, board, dma, flashkv, kv, pool, tiers
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel
from firmware_py.status import E_EMPTY, E_FULL, E_NO_BLOCK, E_STATE, OK
from host.paths import ROOT

LAY = {"fp32": kv.Layout(5, 4, 8, "fp32"), "int8": kv.Layout(5, 4, 8, "int8")}


def boot(tmp_path, lay, n_sram, n_psram, use_dma, flash_slots=0, seqs=2, bw=None):
    p = pool.Pool(lay.block_bytes, n_sram + n_psram, tiers=(n_sram, n_psram), tier_names=("sram", "psram"))
    r = p.add_region(n_sram + n_psram)
    c = kv.KVCache(p, lay, max_seqs=seqs)
    q = dma.DMAQueue(Kernel(VirtualClock(), max_tasks=4), slots=16) if use_dma else None
    fs = flashkv.FlashStore(str(tmp_path / "kv.bin"), flash_slots, lay.block_bytes) if flash_slots else None
    return p, r, c, q, fs, tiers.Tiers(c, bw=bw, dma=q, flash=fs)


def row_for(lay, pos, seed):
    # the token row appended at pos: bytes any float bit pattern may take (NaNs included)
    rng = np.random.default_rng(seed * 100003 + pos)
    return bytearray(rng.integers(0, 256, lay.row_bytes, dtype=np.uint8).tobytes())


def expect_row(lay, rows, pos, ly):
    return bytes(rows[pos][ly * lay.layer_row:(ly + 1) * lay.layer_row])


configs = st.sampled_from(["sram", "sram+psram", "sram+psram+flash"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=configs, dtype=st.sampled_from(["fp32", "int8"]), use_dma=st.booleans(),
       batch=st.sampled_from([1, 3, 16, 20]), keep_sram=st.integers(0, 3), keep_psram=st.integers(0, 3),
       n=st.integers(1, 130), seed=st.integers(0, 10 ** 6), actions=st.lists(st.integers(0, 9), max_size=140))
def test_read_back_through_every_tier(tmp_path, mode, dtype, use_dma, batch, keep_sram, keep_psram, n, seed, actions):
    lay = LAY[dtype]
    flash = mode.endswith("flash")
    p, r, c, q, fs, T = boot(tmp_path, lay, 4, 10, use_dma, flash_slots=12 if flash else 0)
    if mode == "sram":
        keep_sram, keep_psram = 64, -1  # nothing ever leaves SRAM (the pool's SRAM range is full first)
    elif mode == "sram+psram":
        keep_psram = -1
    h = T.open(r, "full", 0, keep_sram, keep_psram, flash, batch)
    assert h >= 0
    rows = []
    for pos in range(n):
        a = actions[pos] if pos < len(actions) else 0
        if q is not None:
            ck = T.hazard(h)
            if ck >= 0 or a == 1:
                q.drain()
        row = row_for(lay, pos, seed)
        rv = T.append(h, row)
        if rv < 0:
            # only a full pool may refuse (the test's arena is small): everything before reads back
            assert p.blocks_free == 0 or p.available(r) == 0
            break
        rows.append(row)
        if a == 2:  # a read-ahead pass in the middle of the appends
            T.begin_pass(h)
            for k in range((len(rows) + lay.tokens_per_block - 1) // lay.tokens_per_block):
                assert T.block(h, k) >= 0
        if a == 3:  # an isolated read of an old position
            d = bytearray(lay.layer_row)
            old = (pos * 7) % len(rows)
            assert T.read(h, old, pos % lay.n_layers, d, 0) == OK
            assert bytes(d) == expect_row(lay, rows, old, pos % lay.n_layers)
    if q is not None and actions[-1:] == [9]:
        q.drain()
        T.step(h)
    d = bytearray(lay.layer_row)
    for pos in range(len(rows)):
        for ly in range(lay.n_layers):
            assert T.read(h, pos, ly, d, 0) == OK
            assert bytes(d) == expect_row(lay, rows, pos, ly), (pos, ly, [T.where(h, k) for k in range(9)])
    # the same through the block stream: every block image's rows (and header positions)
    t = lay.tokens_per_block
    T.begin_pass(h)
    for k in range((len(rows) + t - 1) // t):
        off = T.block(h, k)
        assert off >= 0
        b = T.buf
        for rr in range(min(t, len(rows) - k * t)):
            pos = k * t + rr
            assert int.from_bytes(b[off + 8 * rr:off + 8 * rr + 4], "little") == pos + 1
            for ly in range(lay.n_layers):
                o = off + lay.row_offset(ly, rr)
                assert bytes(b[o:o + lay.layer_row]) == expect_row(lay, rows, pos, ly)
    if flash and not use_dma and len(rows) >= (keep_sram + keep_psram + 2) * t and batch <= t:
        assert T.spills > 0 and T.where(h, 0) == tiers.FLASH
    assert T.close(h) == OK
    if q is not None:
        q.drain()
        T._complete()
    assert p.blocks_used == 0, p.tier_stats()
    if fs is not None:
        assert fs.used == 0
        fs.close()


def attention(qv, K, V):
    s = K @ qv / np.float32(np.sqrt(K.shape[1]))
    s = np.exp(s - s.max())
    return (s / s.sum()) @ V


def test_attention_streamed_over_tiers_equals_plain_cache(tmp_path):
    lay = LAY["fp32"]
    t, L, kvd = lay.tokens_per_block, lay.n_layers, lay.kv_dim
    p, r, c, q, fs, T = boot(tmp_path, lay, 3, 8, True, flash_slots=10)
    h = T.open(r, "full", 0, 1, 2, True, 16)
    plain = pool.Pool(lay.block_bytes, 12)
    pc = kv.KVCache(plain, lay)
    ph = pc.open(plain.add_region(12), "full", 0)
    rng = np.random.default_rng(5)
    n = 150
    for pos in range(n):
        row = bytearray(rng.standard_normal(lay.row_bytes // 4).astype(np.float32).tobytes())
        if T.hazard(h) >= 0:
            q.drain()
        assert T.append(h, row) >= 0 and pc.append(ph, row) >= 0
        if pos % 5 == 0:
            q.drain()
    assert [T.where(h, k) for k in range(10)].count(tiers.FLASH) >= 5
    for ly in range(L):
        qv = rng.standard_normal(kvd).astype(np.float32)
        # plain: rows through kv.read
        K = np.zeros((n, kvd), np.float32)
        V = np.zeros((n, kvd), np.float32)
        d = bytearray(lay.layer_row)
        for pos in range(n):
            assert pc.read(ph, pos, ly, d, 0) == OK
            v = np.frombuffer(bytes(d), np.float32)
            K[pos], V[pos] = v[:kvd], v[kvd:2 * kvd]
        # streamed: block by block through tiers.block() (flash blocks from the staging buffers)
        Ks, Vs = [], []
        T.begin_pass(h)
        for k in range((n + t - 1) // t):
            off = T.block(h, k)
            assert off >= 0
            m = min(t, n - k * t)
            o = off + lay.row_offset(ly, 0)
            blk = np.frombuffer(bytes(T.buf[o:o + m * lay.store_row]), np.float32).reshape(m, -1)
            Ks.append(blk[:, :kvd])
            Vs.append(blk[:, kvd:2 * kvd])
        Ks, Vs = np.concatenate(Ks), np.concatenate(Vs)
        assert np.array_equal(Ks, K) and np.array_equal(Vs, V)
        a, b = attention(qv, K, V), attention(qv, Ks, Vs)
        assert np.array_equal(a, b), np.abs(a - b).max()
    assert T.stage_misses == 0 and T.stage_hits > 0  # every flash block was read ahead
    fs.close()


def test_kv_reads_a_spilled_entry_as_empty(tmp_path):
    # a block that left the pool (retargeted to -1, its rows in the flash file) is E_EMPTY
    # through every kv.py read path; tiers.read serves it from the flash file
    lay = LAY["fp32"]
    p, r, c, q, fs, T = boot(tmp_path, lay, 2, 4, False, flash_slots=8)
    h = T.open(r, "full", 0, 1, 1, True, 16)
    rows = [row_for(lay, pos, 1) for pos in range(64)]
    for row in rows:
        assert T.append(h, row) >= 0
    assert T.where(h, 0) == tiers.FLASH
    d = bytearray(lay.layer_row)
    assert c.read(h, 0, 0, d, 0) == E_EMPTY
    assert bytes(d) == bytes(lay.layer_row)  # nothing written
    assert c.locate(h, 0) == 0  # the slot; its block is what is missing
    assert (c.row_offset(h, 0, 0), c.block_at(h, 0), c.slot_pos(h, 0)) == (E_EMPTY, E_EMPTY, E_EMPTY)
    assert T.read(h, 0, 0, d, 0) == OK and bytes(d) == expect_row(lay, rows, 0, 0)
    fs.close()


def test_erase_model_and_charging(tmp_path):
    # a transaction rewrites each sector it touches once: write-through costs an erase per
    # sector per token, a 16-token flush one per sector per block; bytes are charged on the
    # block's tier and on flash, moves on both ranges
    lay = LAY["fp32"]
    bd = board.load(os.path.join(ROOT, "boards", "esp32s3_n8r8.json"))
    bw = bwm.Bandwidth(bd, clock=VirtualClock())
    res = {}
    for batch in (1, 16):
        p, r, c, q, fs, T = boot(tmp_path, lay, 4, 8, False, flash_slots=16, bw=bw)
        h = T.open(r, "full", 0, 2, 2, True, batch)
        for pos in range(64):
            assert T.append(h, row_for(lay, pos, 2)) >= 0
        res[batch] = (fs.total_erases, T.flushes, fs.wear(64))
        fs.close()
    er1, fl1, w1 = res[1]
    er16, fl16, w16 = res[16]
    assert fl1 == 64 and fl16 == 4
    assert er16 == 4 * 6  # 4 blocks x 6 sectors (20,608 B in 4 KiB sectors), each held data (preallocated)
    assert er1 > 10 * er16  # every token rewrites the 5-6 sectors its rows touch
    assert w16["max_erases_per_sector"] == 1 and w16["lifetime_tokens"] == 100000 * 64
    rep = bw.report()
    assert rep["flash"]["kv_write"]["bytes"] == w1["bytes_written"] + w16["bytes_written"]
    assert rep["psram"]["kv_write"]["bytes"] > 0 and rep["sram"]["kv_write"]["bytes"] > 0


def test_configuration_errors(tmp_path):
    lay = LAY["fp32"]
    with pytest.raises(tiers.TiersError, match="tier ranges"):
        tiers.Tiers(kv.KVCache(pool.Pool(lay.block_bytes, 4), lay))
    p, r, c, q, fs, T = boot(tmp_path, lay, 2, 2, False)
    for args, msg in (((r, "sinks", 32), "not supported"), ((r, "full", 0, 2, 2, True), "FlashStore"),
                      ((r, "full", 0, 2, -2), "keep_psram")):
        with pytest.raises(tiers.TiersError, match=msg):
            T.open(*args)
    with pytest.raises(flashkv.FlashError, match="cannot create"):
        flashkv.FlashStore(str(tmp_path / "no" / "such" / "dir.bin"), 2, lay.block_bytes)
    with pytest.raises(tiers.TiersError, match="32-byte"):
        odd = kv.Layout(1, 1, 2, "fp32")  # 16 x (8 + 16) B = 384 B: fine; make an odd one below
        bad = pool.Pool(odd.block_bytes + 0, 4, tiers=(2, 2))
        if odd.block_bytes % 32 == 0:
            raise tiers.TiersError("tiers: 32-byte (layout happens to be aligned)")
        tiers.Tiers(kv.KVCache(bad, odd), dma=dma.DMAQueue(Kernel(VirtualClock()), slots=8))


def test_two_copies_queued_then_drained(tmp_path):
    # two block copies queued back to back (SRAM blocks 0 and 1 to non-adjacent PSRAM blocks),
    # landed by one drain: each must arrive at its own destination (the engine may merge only
    # descriptors that continue both the source and the destination)
    lay = LAY["fp32"]
    p, r, c, q, fs, T = boot(tmp_path, lay, 4, 10, True)
    h = T.open(r, "full", 0, 3, -1, False, 1)
    rows = []
    for pos in range(65):
        assert T.hazard(h) == E_EMPTY
        rows.append(row_for(lay, pos, 0))
        assert T.append(h, rows[-1]) >= 0
    assert T.n_inflight == 2
    q.drain()
    T.step(h)
    assert T.completed == 2
    d = bytearray(lay.layer_row)
    for pos in range(65):
        for ly in range(lay.n_layers):
            assert T.read(h, pos, ly, d, 0) == OK
            assert bytes(d) == expect_row(lay, rows, pos, ly), (pos, ly)


# --- review r1: call orders and file failures that lost rows ----------------------------------

def test_kv_meta_constants_match():
    # tiers.py reads a sequence's reservation from kv.KVCache.meta with its own copies of kv.py's
    # underscore consts (not importable on MicroPython)
    assert (tiers._KV_CFG, tiers._KV_NF, tiers._KV_SLOT) == (kv._CFG, kv._NF, kv._F_SLOT)


SMALL = kv.Layout(1, 2, 8, "fp32", tokens_per_block=4)  # 2 layers, 4-token blocks of whole 32 B lines


class FailFile:
    # FlashStore's file, failing on demand: 1 writes raise OSError (ENOSPC), 2 writes are short,
    # 3 reads raise OSError
    def __init__(self, f):
        self.f = f
        self.mode = 0

    def seek(self, pos):
        return self.f.seek(pos)

    def write(self, buf):
        if self.mode == 1:
            raise OSError(28, "No space left on device")
        if self.mode == 2:
            return 0
        return self.f.write(buf)

    def readinto(self, buf):
        if self.mode == 3:
            raise OSError(5, "I/O error")
        return self.f.readinto(buf)

    def flush(self):
        return self.f.flush()

    def close(self):
        return self.f.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=st.sampled_from(["full", "window"]), use_dma=st.booleans(), batch=st.sampled_from([1, 2, 4, 5]),
       keep_sram=st.integers(0, 2), keep_psram=st.integers(0, 2), seed=st.integers(0, 10 ** 6),
       actions=st.lists(st.sampled_from([0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 11]), min_size=20, max_size=90))
def test_any_call_order_reads_the_last_write(tmp_path, policy, use_dma, batch, keep_sram, keep_psram, seed, actions):
    run_orders(tmp_path, policy, use_dma, batch, keep_sram, keep_psram, seed, actions)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10 ** 6),
       actions=st.lists(st.sampled_from([0, 0, 0, 2, 2, 4, 6, 6, 7, 11, 11]), min_size=20, max_size=90))
def test_window_writes_racing_dma_copies(tmp_path, seed, actions):
    # the window's next block prefetched to SRAM by DMA (keep_sram=2), written while its copy is
    # in flight or after it landed unseen: the copy is voided at completion (raced), never kept
    run_orders(tmp_path, "window", True, 1, 2, -1, seed, actions)


def run_orders(tmp_path, policy, use_dma, batch, keep_sram, keep_psram, seed, actions):
    # every documented path and the undocumented orders: T.append; hazard -> wait ->
    # cache.reserve/write -> step (Tiers not told the copy landed); T.reserve; cache.write to
    # the reserved token after its step (after its flush); a drain with no step; failing file
    # writes and reads. Whatever the order, every position reads back its last write, or the
    # call said it did not happen
    lay = SMALL
    flash = policy == "full"
    p = pool.Pool(lay.block_bytes, 12, tiers=(3, 9), tier_names=("sram", "psram"))
    r = p.add_region(12)
    c = kv.KVCache(p, lay, max_seqs=2)
    q = dma.DMAQueue(Kernel(VirtualClock(), max_tasks=4), slots=16) if use_dma else None
    fs = flashkv.FlashStore(str(tmp_path / "kv.bin"), 16, lay.block_bytes) if flash else None
    ff = None
    if fs is not None:
        ff = FailFile(fs.f)
        fs.f = ff
    T = tiers.Tiers(c, dma=q, flash=fs)
    budget = 0 if flash else 16
    h = T.open(r, policy, budget, keep_sram, keep_psram if flash else -1, flash, batch)
    assert h >= 0
    rng = np.random.default_rng(seed)
    exp = {}  # position -> bytearray(row_bytes): what each layer's row should read
    LR = lay.layer_row

    def new_row():
        return bytearray(rng.integers(0, 256, lay.row_bytes, dtype=np.uint8).tobytes())

    for a in actions:
        n = c.length(h)
        if ff is not None:
            ff.mode = 1 if a == 9 else 2 if a == 10 else 0
        if a in (0, 9, 10) or (a == 11 and (q is None or T.hazard(h) < 0)):
            if q is not None and T.hazard(h) >= 0:
                q.drain()
            row = new_row()
            rv = T.append(h, row)
            if rv >= 0:
                exp[n] = row
                if a in (9, 10) and fs is not None:
                    assert T.step_err in (OK, E_STATE)
            else:
                assert rv in (E_STATE, E_NO_BLOCK, E_FULL) and c.length(h) == n
        elif a == 1:  # hazard -> wait -> cache.reserve/write -> step, Tiers told nothing
            if q is not None:
                q.drain()
            if c.reserve(h) >= 0:
                row = new_row()
                for ly in range(lay.n_layers):
                    assert c.write(h, ly, row, ly * LR) == OK
                exp[n] = row
                T.step(h)
        elif a == 2 or (a == 11 and q is not None and T.hazard(h) >= 0):
            # cache.reserve/write while a copy of the block is (maybe) in flight: it lands later
            if c.reserve(h) >= 0:
                row = new_row()
                for ly in range(lay.n_layers):
                    c.write(h, ly, row, ly * LR)
                exp[n] = row
                T.step(h)  # a copy of this block may still be in flight: it lands later
        elif a == 3:  # T.reserve (refused while in flight)
            if q is not None and T.hazard(h) >= 0:
                assert T.reserve(h) == E_STATE
                q.drain()
            if T.reserve(h) >= 0:
                row = new_row()
                for ly in range(lay.n_layers):
                    c.write(h, ly, row, ly * LR)
                exp[n] = row
                T.step(h)
        elif a in (4, 5) and n:  # a late write to the reserved token, after its step (and flush)
            ly = a - 4
            src = bytearray(rng.integers(0, 256, LR, dtype=np.uint8).tobytes())
            if c.write(h, ly, src, 0) == OK:
                exp[n - 1][ly * LR:(ly + 1) * LR] = src
        elif a == 6 and q is not None:
            q.drain()  # a copy lands with no Tiers call after it
        elif a == 7:
            T.step(h)
        elif a == 8 and ff is not None:
            ff.mode = 3  # reads fail: refused, never stale bytes
            d = bytearray(LR)
            for pos in list(exp)[:3]:
                rv = T.read(h, pos, 0, d, 0)
                assert rv in (OK, E_STATE, E_EMPTY)
                if rv == OK:
                    assert bytes(d) == bytes(exp[pos][:LR])
            T.begin_pass(h)
            for k in range(4):
                off = T.block(h, k)
                assert off >= 0 or off in (E_STATE, E_EMPTY)
                if off >= 0 and k * 4 in exp and c.length(h) > k * 4:
                    o = off + lay.row_offset(0, 0)
                    if policy == "full":
                        assert bytes(T.buf[o:o + LR]) == bytes(exp[k * 4][:LR])
            ff.mode = 0
    if ff is not None:
        ff.mode = 0
    if q is not None:
        q.drain()
    T.step(h)
    n = c.length(h)
    lo = 0 if flash else max(0, n - 16)
    d = bytearray(LR)
    for pos in range(lo, n):
        for ly in range(lay.n_layers):
            assert T.read(h, pos, ly, d, 0) == OK, (pos, ly)
            assert bytes(d) == bytes(exp[pos][ly * LR:(ly + 1) * LR]), (pos, ly, T.stats())
    assert p.region_used[T.region] == T.n_inflight
    assert T.close(h) == OK
    if q is not None:
        q.drain()
        T._complete()
    assert p.blocks_used == 0 and p.region_used[r] == 0 and p.region_used[T.region] == 0
    if fs is not None:
        assert fs.used == 0
        fs.close()


def test_reproducer_06_reserve_write_after_dma_wait():
    # the exact sequence of review r1's 06: hazard, the wait, cache.reserve/write, T.step twice
    lay = kv.Layout(1, 1, 8, "fp32", tokens_per_block=4)
    p = pool.Pool(lay.block_bytes, 6, tiers=(2, 4), tier_names=("sram", "psram"))
    r = p.add_region(6)
    c = kv.KVCache(p, lay, max_seqs=2)
    q = dma.DMAQueue(Kernel(VirtualClock(), max_tasks=4), slots=16)
    T = tiers.Tiers(c, dma=q)
    h = T.open(r, "window", 12, 2, -1)
    pos = 0
    while T.hazard(h) < 0 and pos < 40:
        assert T.append(h, bytearray(bytes([(pos * 7 + 1) & 255]) * lay.row_bytes)) >= 0
        pos += 1
    assert T.hazard(h) >= 0 and T.append(h, bytearray(lay.row_bytes)) == E_STATE
    q.drain()
    assert c.reserve(h) >= 0 and c.write(h, 0, bytearray(b"\x5A" * lay.layer_row), 0) == OK
    assert T.step(h) == 0 and T.step(h) == 0
    d = bytearray(lay.layer_row)
    assert T.read(h, pos, 0, d, 0) == OK and bytes(d) == b"\x5A" * lay.layer_row
    assert T.raced == 1


def test_flush_and_stage_errors_are_statuses(tmp_path):
    # a truncated file (review r1's 03): block() of another sequence's flash block is E_STATE,
    # never the previous staged block; writes that raise OSError: the append succeeds, the step
    # says E_STATE, nothing spills; once the file works every position reads back
    lay = kv.Layout(1, 1, 4, "fp32", tokens_per_block=2)
    p = pool.Pool(lay.block_bytes, 8, tiers=(2, 6), tier_names=("sram", "psram"))
    r = p.add_region(8)
    c = kv.KVCache(p, lay, max_seqs=2)
    path = str(tmp_path / "kv.bin")
    fs = flashkv.FlashStore(path, 8, lay.block_bytes)
    T = tiers.Tiers(c, flash=fs)
    A = T.open(r, "full", 0, 0, 0, True, 1)
    B = T.open(r, "full", 0, 0, 0, True, 1)
    for _ in range(6):
        T.append(A, bytearray(b"\xAA" * lay.row_bytes))
        T.append(B, bytearray(b"\xBB" * lay.row_bytes))
    assert T.where(A, 0) == T.where(B, 0) == tiers.FLASH
    assert T.begin_pass(A) == OK and T.block(A, 0) == 0
    open(path, "wb").close()
    e0 = T.flash_errors
    assert T.block(B, 0) == E_STATE
    assert T.read(B, 0, 0, bytearray(lay.layer_row), 0) == E_STATE
    assert T.begin_pass(B) == E_STATE
    assert T.flash_errors - e0 == 3 and fs.errors >= 3 and T.stats()["flash_errors"] == T.flash_errors
    fs.close()
    fs = flashkv.FlashStore(path, 8, lay.block_bytes)
    ff = FailFile(fs.f)
    fs.f = ff
    c2 = kv.KVCache(p, lay, max_seqs=1)
    T = tiers.Tiers(c2, flash=fs)
    h = T.open(r, "full", 0, 0, 0, True, 1)
    rows = [bytearray(bytes([j + 1]) * lay.row_bytes) for j in range(10)]
    ff.mode = 1
    for j in range(5):
        assert T.append(h, rows[j]) >= 0 and T.step_err == E_STATE
    assert T.step(h) == E_STATE and T.spills == 0 and fs.errors > 0
    ff.mode = 0
    for j in range(5, 10):
        assert T.append(h, rows[j]) >= 0 and T.step_err == OK
    assert T.where(h, 0) == tiers.FLASH
    d = bytearray(lay.layer_row)
    for j in range(10):
        assert T.read(h, j, 0, d, 0) == OK and bytes(d) == bytes(rows[j][:lay.layer_row])
    fs.close()


BIG = 1 << 70


@pytest.mark.parametrize("bad", [0.0, 1.5, True, BIG, -BIG, None, "0"])
def test_flash_store_refuses_bad_int_arguments_with_e_range(tmp_path, bad):
    # every int argument of write / read_block / read_at / spend is checked as an int before
    # any arithmetic: a float, a bool, a big int or any other object is E_RANGE, never a
    # raise from the file call, and nothing is written, read or counted
    from firmware_py.status import E_RANGE
    lay = kv.Layout(1, 1, 8, "fp32", tokens_per_block=4)
    fs = flashkv.FlashStore(str(tmp_path / "kv.bin"), 2, lay.block_bytes)
    src = bytearray(range(64))
    dst = bytearray(lay.block_bytes)
    fs.begin()
    assert [fs.write(bad, 0, src, 0, 16), fs.write(0, bad, src, 0, 16), fs.write(0, 0, src, bad, 16),
            fs.write(0, 0, src, 0, bad)] == [E_RANGE] * 4
    assert [fs.read_block(bad, dst), fs.read_at(bad, 0, dst, 16), fs.read_at(0, bad, dst, 16),
            fs.read_at(0, 0, dst, bad), fs.spend(bad)] == [E_RANGE] * 5
    assert fs.end() == 0
    assert (fs.bytes_written, fs.bytes_read, fs.errors, fs.transactions, fs.busy_us, fs.busy_s) == (0, 0, 0, 0, 0, 0)
    fs.close()


def test_flash_store_range_checks_and_good_calls(tmp_path):
    from firmware_py.status import E_RANGE
    lay = kv.Layout(1, 1, 8, "fp32", tokens_per_block=4)
    bb = lay.block_bytes
    fs = flashkv.FlashStore(str(tmp_path / "kv.bin"), 2, bb)
    src = bytearray(range(64))
    dst = bytearray(bb)
    fs.begin()
    assert fs.write(0, 0, src, 60, 8) == E_RANGE  # past src's end: nothing written
    assert fs.write(0, 0, None, 0, 8) == E_RANGE
    assert fs.write(0, bb - 4, src, 0, 8) == E_RANGE  # past the block
    assert fs.write(2, 0, src, 0, 8) == E_RANGE  # no such slot
    assert fs.read_block(0, None) == E_RANGE and fs.read_at(0, 0, None, 4) == E_RANGE
    assert fs.read_at(0, 0, bytearray(3), 4) == E_RANGE
    assert fs.bytes_written == 0 and fs.errors == 0
    assert fs.write(1, 8, src, 56, 8) == OK
    fs.end()
    assert fs.read_at(1, 8, dst, 8) == OK and bytes(dst[:8]) == bytes(src[56:64])
    assert fs.spend(2500000) == OK and (fs.busy_s, fs.busy_us) == (2, 500000)
    fs.busy_s = 2 ** 30 - 2
    assert fs.spend(1600000) == OK and (fs.busy_s, fs.busy_us) == (2 ** 30 - 1, 999999)  # saturated
    assert fs.spend(1) == OK and (fs.busy_s, fs.busy_us) == (2 ** 30 - 1, 999999)
    fs.close()
