# int4 (KIVI) in the KV cache: keys quantized per channel over a block (integer fixed
# point, firmware_py/kvkivi.py), the current block's keys exact in a per-sequence
# residual. Against the reference model of our own (tests/firmware/kvref.py, written from
# the spec with big ints): random programs with realistic float keys, every read
# bit-identical; the numpy kernel's keys are read()'s, bit for bit; the error bound of
# a fold; the sizing rule counts the residual. The heap-locked half is in fw_kv.py.
import os
import random
import struct
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "firmware"))
import kvref  # noqa: E402

from firmware_py import kernels, kv, kvlayout, llama2c, pool, quant, status  # noqa: E402
from host import paths  # noqa: E402

TINY = os.path.join(paths.ROOT, "models", "kvrtos-tiny")


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_on_int4_match_the_reference_model(seed):
    # kvref.drive with the int4 layout every time (its byte patterns make keys of every
    # exponent: zeros, subnormals, inf, NaN, signs), misuse included
    kvref.drive(200 + seed, 600, layout=kv.Layout(2, 1, 4, "int4", tokens_per_block=4))


def _float_row(layout, rnd, scale):
    # a token row with keys like a model's (channels with offsets, outliers) and values
    row = bytearray(layout.row_bytes)
    kd = layout.kv_dim
    for ly in range(layout.n_layers):
        k = [rnd.gauss(0, 1) * scale + (4 * scale if c % 7 == 3 else 0) for c in range(kd)]
        v = [rnd.gauss(0, 1) for _ in range(kd)]
        quant.pack_layer(layout, k, v, row, ly * layout.layer_row)
    return row


@pytest.mark.parametrize("seed", range(8))
def test_float_keys_every_policy_fork_and_write_match_the_reference(seed):
    rnd = random.Random(seed)
    lay = kv.Layout(2, 2, 4, "int4", tokens_per_block=rnd.choice((2, 4, 8)))
    nb = 24
    p = pool.Pool(lay.block_bytes, nb)
    r = p.add_region(nb)
    c = kv.KVCache(p, lay, max_seqs=3, max_blocks_per_seq=6, h2o=True)
    m = kvref.RefKV(lay, 3, 6, nb, (nb,))
    out = bytearray(lay.layer_row)
    for _ in range(3):
        pol = rnd.choice(kv.POLICIES)
        cap = rnd.randint(kv.min_budget(pol), 6 * lay.tokens_per_block)
        assert c.open(r, pol, cap) == m.open(0, pol, cap, kv.SINKS, 0)
    for step in range(300):
        h = rnd.choice(sorted(m.seqs))
        k = rnd.randint(0, 19)
        if k == 0:
            f = c.fork(h)
            assert f == m.fork(h), step
        elif k == 1 and len(m.seqs) > 1:
            assert c.close(h) == m.close(h), step
        elif k < 5:
            assert c.reserve(h) == m.reserve(h), step
            row = _float_row(lay, rnd, 10.0 ** rnd.randint(-3, 3))
            ly = rnd.randint(0, 1)
            assert c.write(h, ly, row, ly * lay.layer_row) == m.write(h, ly, row, ly * lay.layer_row), step
        else:
            row = _float_row(lay, rnd, 10.0 ** rnd.randint(-3, 3))
            assert c.append(h, row) == m.append(h, row), step
            slot = c.locate(h, rnd.randint(0, c.length(h) - 1))
            if slot >= 0:
                v = rnd.randint(0, 3)
                assert c.add_score(h, slot, v) == m.add_score(h, slot, v)
        if not m.seqs:
            assert c.open(r, "full", 0) == m.open(0, "full", 0, kv.SINKS, 0)
        for hh, s in m.seqs.items():
            for pos in range(s.n):
                slot = s.slot_of(pos)
                assert c.locate(hh, pos) == (status.E_EMPTY if slot is None else slot), (step, hh, pos)
                if slot is not None:
                    for ly in range(2):
                        assert c.read(hh, pos, ly, out, 0) == status.OK
                        assert bytes(out) == m.row_of(s, slot, ly), (step, hh, pos, ly)
            kb = c.current_block(hh)
            assert kb < 0 or p.ref[c.block_at(hh, kb)] == 1, "a block with residual keys is shared"
        assert p.blocks_used == len(m.refs)


def test_a_folded_key_is_within_the_bound_of_its_block():
    # full policy, one fold per block: each key is off by at most half a step of its
    # channel's range over the block (+ the fixed point's rounding), the residual exact
    lay = kv.Layout(1, 2, 4, "int4", tokens_per_block=8)
    p = pool.Pool(lay.block_bytes, 4)
    c = kv.KVCache(p, lay, max_seqs=1)
    h = c.open(p.add_region(4), "full", 0)
    rnd = random.Random(3)
    keys = []
    for _ in range(27):
        k = [rnd.gauss(0, 1) * 10.0 ** rnd.randint(-2, 2) + (5.0 if j == 2 else 0.0) for j in range(8)]
        k = list(struct.unpack("<8f", struct.pack("<8f", *k)))  # as fp32
        keys.append(k)
        row = bytearray(lay.row_bytes)
        quant.pack_layer(lay, k, [0.0] * 8, row, 0)
        assert c.append(h, row) >= 0
    out = bytearray(lay.layer_row)
    for n in range(27):
        assert c.read(h, n, 0, out, 0) == status.OK
        got = quant.unpack_layer(lay, out, 0, 0)
        if n >= 24:  # the current block: exact
            assert got == keys[n]
            continue
        blk = keys[n - n % 8:n - n % 8 + 8]
        for j in range(8):
            assert abs(got[j] - keys[n][j]) <= quant.kivi_bound([b[j] for b in blk]), (n, j)


@pytest.mark.parametrize("policy", ["full", "window", "h2o"])
def test_numpy_kernel_keys_are_reads_bit_for_bit(policy):
    # the numpy backend reads the arena and the residual itself: its keys (folded and
    # residual) equal what cache.read gives, bit for bit
    w = llama2c.load(os.path.join(TINY, "model.bin"))
    cfg = w.cfg
    lay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, "int4")
    p = pool.Pool(lay.block_bytes, 4)
    c = kv.KVCache(p, lay, max_seqs=1, h2o=policy == "h2o")
    h = c.open(p.add_region(4), policy, 0 if policy == "full" else 40)
    k = kernels.Numpy(w, c, "absolute", np)
    rnd = random.Random(5)
    out = bytearray(lay.layer_row)
    for n in range(60 if policy != "full" else 50):
        assert c.append(h, _float_row(lay, rnd, 10.0 ** rnd.randint(-2, 2))) >= 0
        if n % 7 and n != 49:
            continue
        cached = c.cached(h)
        k.begin(h, cached)
        for ly in range(cfg.n_layers):
            kk, _ = k._kv(ly)
            kk = kk.reshape(cached, -1)
            for s in range(cached):
                assert c.read_slot(h, s, ly, out, 0) == status.OK
                want = np.frombuffer(bytes(out[:4 * lay.kv_dim]), np.uint32)
                assert (kk[s].view(np.uint32) == want).all(), (n, ly, s)


def test_sizing_counts_every_sequences_residual():
    lay = kv.Layout(5, 4, 8, "int4")
    assert lay.residual_bytes == 5 * 16 * 32 * 4 + 16
    for seqs in (1, 4):
        assert kvlayout.fixed_bytes(lay, seqs) == kv.KV_FIXED_BYTES + kvlayout.KIVI_FIXED_BYTES + seqs * lay.residual_bytes + 64
        for n in (1, 10, 300):
            need = kv.heap_for(n, lay, seqs)
            assert kv.blocks_for(need, lay, seqs) == n and kv.blocks_for(need - 1, lay, seqs) == n - 1
    for dt in ("fp32", "int8", "int4tok"):  # the other layouts keep their sizes
        o = kv.Layout(5, 4, 8, dt)
        assert kvlayout.fixed_bytes(o, 4) == kv.KV_FIXED_BYTES and o.residual_bytes == 0
        assert o.block_bytes == 16 * o.token_bytes and o.store_row == o.layer_row
    assert (kv.Layout(5, 4, 8, "int4tok").block_bytes, kv.Layout(5, 4, 8, "int8").block_bytes) == (5248, 7808)


def test_dtype_names_and_refusals():
    assert kv.DTYPES == ("fp32", "fp16", "int8", "int4", "int4tok")
    for dt in ("int4", "int4tok"):
        with pytest.raises(kv.KVError, match="even head_dim"):
            kv.Layout(1, 1, 3, dt)
    with pytest.raises(kv.KVError, match="int4tok"):
        kv.Layout(1, 1, 4, "int2")
