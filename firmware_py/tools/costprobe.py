# A MicroPython script (python -m firmware_py.tools.costprobe also runs it on CPython): the host cost of the firmware's own
# kernels on the interpreter that runs it, for the viper and bytecode cost figures of the
# board profiles. host/bench/calibration.py runs it under the 32-bit unix port (`./kv
# mp32`, the ESP32-S3's word size) several times and takes the median of each figure.
# Prints one JSON line: ns per int8 MAC of kernels_q.matvec (@viper matvec_v, 64 rows,
# group 32: the marginal cost of 192 more columns, so each MAC carries its share of the
# per-group scaling), ns per fp32 MAC of kernels.Plain.matvec (the same difference, plain
# bytecode), ns per math.exp in a bytecode loop (less the same loop without it).
import json
import math

from firmware_py import compat, kernels, kernels_q, kvkivi, kvlayout, quant
from firmware_py.compat import ticks_diff, ticks_us

ROWS = 64
GROUP = 32
NARROW, WIDE = 64, 256


class _F:
    # what Plain.matvec reads of its self
    def __init__(self, n):
        self.f32 = compat.new_array("f", n)
        for i in range(n):
            self.f32[i] = ((i * 37) % 17 - 8) * 0.125
        self.q8 = None


class _M:
    def __init__(self, rows, cols):
        self.rows, self.cols, self.off, self.soff, self.group = rows, cols, 0, -1, 0


def _best(fn, reps, *args):
    # the fastest of reps timings (µs) of fn(*args)
    best = None
    for _ in range(reps):
        compat.collect()
        t0 = ticks_us()
        fn(*args)
        d = ticks_diff(ticks_us(), t0)
        best = d if best is None or d < best else best
    return best


def _plain(fs, y, m, x, iters):
    for _ in range(iters):
        kernels.Plain.matvec_rows(fs, y, m, x, 0, m.rows)  # the plain matvec, on a stand-in self


def viper_ns(iters=40):
    t = {}
    for cols in (NARROW, WIDE):
        w, gp, x, y = _mv_buffers(ROWS, cols)
        t[cols] = _best(_viper_r, 5, y, w, ROWS, cols, gp, x, iters)
    return 1000 * (t[WIDE] - t[NARROW]) / (iters * ROWS * (WIDE - NARROW))


def bytecode_ns(iters=2):
    rows = 16
    t = {}
    for cols in (NARROW, WIDE):
        fs = _F(rows * cols)
        m = _M(rows, cols)
        x = compat.new_array("f", cols)
        for i in range(cols):
            x[i] = (i % 7) * 0.25
        y = compat.new_array("f", rows)

        t[cols] = _best(_plain, 5, fs, y, m, x, iters)
    return 1000 * (t[WIDE] - t[NARROW]) / (iters * rows * (WIDE - NARROW))


def _viper_r(y, w, rows, cols, gp, x, iters):
    for _ in range(iters):
        kernels_q.matvec(y, w, 0, rows, cols, GROUP, gp, 0, x)


def _mv_buffers(rows, cols):
    w = bytearray(rows * cols)
    for i in range(len(w)):
        w[i] = (i * 29 + 7) & 0xFF
    gp = compat.new_array("i", rows * cols // GROUP)
    for i in range(len(gp)):
        gp[i] = 16384 | (4 << 16)
    x = compat.new_array("i", cols)
    for i in range(cols):
        x[i] = (i * 53) % 2001 - 1000
    return w, gp, x, compat.new_array("i", rows)


def viper_row_call_ns(mac, iters=40, calls=4000):
    # (ns per row beyond its MACs, ns per call) of kernels_q.matvec_v, the same linear model
    # as the MAC figure (call + rows x row + MACs x MAC): rows 64 -> 256 at 64 columns, then
    # calls of one row of GROUP columns from a bytecode loop
    w, gp, x, y = _mv_buffers(256, 64)
    t64 = _best(_viper_r, 5, y, w, 64, 64, gp, x, iters)
    t256 = _best(_viper_r, 5, y, w, 256, 64, gp, x, iters)
    row = 1000.0 * (t256 - t64) / (iters * 192) - 64 * mac
    t1 = _best(_viper_r, 5, y, w, 1, GROUP, gp, x, calls)
    return row, 1000.0 * t1 / calls - row - GROUP * mac


def bytecode_row_call_ns(mac, iters=4, calls=400):
    # the same for kernels.Plain.matvec (fp32, bytecode): rows 16 -> 64 at 8 columns, then
    # calls of one row of 8 columns
    cols = 8
    fs = _F(64 * cols)
    x = compat.new_array("f", cols)
    for i in range(cols):
        x[i] = (i % 7) * 0.25
    y = compat.new_array("f", 64)
    t16 = _best(_plain, 5, fs, y, _M(16, cols), x, iters)
    t64 = _best(_plain, 5, fs, y, _M(64, cols), x, iters)
    row = 1000.0 * (t64 - t16) / (iters * 48) - cols * mac
    t1 = _best(_plain, 5, fs, y, _M(1, cols), x, calls)
    return row, 1000.0 * t1 / calls - row - cols * mac


def exp_ns(n=2000):
    xs = [-(i % 50) * 0.1 for i in range(n)]
    e = math.exp

    def with_exp():
        s = 0.0
        for v in xs:
            s += e(v)

    def without():
        s = 0.0
        for v in xs:
            s += v
    return 1000 * (_best(with_exp, 5) - _best(without, 5)) / n


class _V:
    # what Plain._vec and Plain.store's fp32 loop read of their self, for one dtype
    def __init__(self, dtype, heads=4, hd=16):
        self.lay = lay = kvlayout.Layout(1, heads, hd, dtype)
        self.kv_dim = kd = lay.kv_dim
        self.kf = compat.new_array("f", kd)
        self.rowf = compat.new_array("f", lay.layer_row // 4 + 1)
        for i in range(len(self.rowf)):
            self.rowf[i] = 0.5 + (i % 5) * 0.125
        self.rowb = bytearray(lay.layer_row)
        for i in range(len(self.rowb)):
            self.rowb[i] = (i * 37 + 11) & 0x3B  # finite halves, mixed nibbles
        self.k = compat.new_array("f", kd)
        self.v = compat.new_array("f", kd)
        for i in range(kd):
            self.k[i] = ((i * 13) % 23 - 11) * 0.0625
            self.v[i] = ((i * 7) % 19 - 9) * 0.125


def _reads(o, iters):
    for _ in range(iters):
        kernels.Plain._vec(o, 0, 0, o.kv_dim)
        kernels.Plain._vec(o, 1, 0, o.kv_dim)


def _packs(o, iters):
    for _ in range(iters):
        quant.pack_layer(o.lay, o.k, o.v, o.rowb, 0)


def _copies(o, iters):
    # Plain.store_part's fp32 branch: K and V copied element by element into the float row
    rf = o.rowf
    kd = o.kv_dim
    for _ in range(iters):
        for i in range(kd):
            rf[i] = o.k[i]
            rf[kd + i] = o.v[i]


def _kivi_deq(arena, kc, dst, iters):
    for _ in range(iters):
        kvkivi.dequant(arena, kc, dst, 0, 0, 0, 0)


def _pack_v(row, q, kd, hd, iters):
    for _ in range(iters):
        kernels_q.pack(row, 0, kd, q, kd, hd, 0, 127)


def kv_ns(iters=20):
    # ns per K/V element (2 x kv_dim per row) of each KV type's read and write in bytecode,
    # over fp32's; KIVI's key dequantization and the int8 viper pack per element
    out = {}
    base = None
    for dt in kvlayout.DTYPES:
        o = _V(dt)
        n = iters * 2 * o.kv_dim
        rd = _best(_reads, 5, o, iters) * 1000 / n
        wr = (_best(_copies, 5, o, iters) if dt == "fp32" else _best(_packs, 5, o, iters)) * 1000 / n
        if base is None:
            base = (rd, wr)
        out["bytecode_rd_" + dt + "_ns"] = round(rd - base[0], 1)
        out["bytecode_wr_" + dt + "_ns"] = round(wr - base[1], 1)
    lay = kvlayout.Layout(1, 4, 16, "int4")
    kc = kvkivi.shape(lay, compat.new_array)
    arena = bytearray(lay.block_bytes)
    for i in range(len(arena)):
        arena[i] = (i * 29 + 3) & 0x7F
    dst = bytearray(4 * lay.kv_dim)
    out["viper_kivi_deq_ns"] = round(_best(_kivi_deq, 5, arena, kc, dst, 50 * iters) * 1000
                                     / (50 * iters * lay.kv_dim), 2)
    lay8 = kvlayout.Layout(1, 4, 16, "int8")
    q = compat.new_array("i", lay8.kv_dim)
    for i in range(len(q)):
        q[i] = (i * 331) % 4001 - 2000
    row = bytearray(lay8.layer_row)
    out["viper_pack_i8_ns"] = round(_best(_pack_v, 5, row, q, lay8.kv_dim, 16, 50 * iters) * 1000
                                    / (50 * iters * lay8.kv_dim), 2)
    return out


# --- the figures that were round guesses: a matvec's rows and calls, the per-element
# kernels, the sampler, and whole decode steps (attention per position; the rest of a
# step, per layer and per token, beyond what the other figures price). Each is a host
# time of the firmware's own code; host/boardspeed.py derives the cost figures from them.

def _marg(fn, n0, n1, iters, *args):
    # ns per element of fn(n, iters, *args): the marginal cost of n1 - n0 more elements
    t0 = _best(fn, 5, n0, iters, *args)
    t1 = _best(fn, 5, n1, iters, *args)
    return 1000.0 * (t1 - t0) / (iters * (n1 - n0))


def _ints(n, seed, lo, hi):
    a = compat.new_array("i", n)
    for i in range(n):
        a[i] = lo + (i * seed + 7) % (hi - lo)
    return a


def _floats(n, seed):
    a = compat.new_array("f", n)
    for i in range(n):
        a[i] = ((i * seed) % 17 - 8) * 0.0625
    return a


def _v_norm(n, iters, f, x, xq):
    for _ in range(iters):
        kernels_q.rmsnorm(xq, x, n, f.gains, 0, f.nb, f.eps0, f.sn, f.eg)


def _v_rope(n, iters, f, v):
    for _ in range(iters):
        kernels_q.rope(v, n, f.cfg.head_dim, f.cs_q)


def _v_add(n, iters, x, y):
    for _ in range(iters):
        kernels_q.add(x, y, n, 12)


def _v_silu(n, iters, f, a, b):
    for _ in range(iters):
        kernels_q.silu(a, a, b, n, 14, f.sig)


def _p_norm(n, iters, pl, out, x):
    for _ in range(iters):
        pl.rmsnorm_part(out, x, 0, 0, 0, n)
        pl.rmsnorm_part(out, x, 0, 1, 0, n)


def _p_rope(n, iters, pl, v):
    for _ in range(iters):
        pl.rope_part(v, 0, n // 2)


def _p_add(n, iters, pl, x, y):
    for _ in range(iters):
        pl.add_part(x, y, 0, n)


def _p_silu(n, iters, pl, a, b):
    for _ in range(iters):
        pl.silu_mul_part(a, b, 0, n)


def _pick(n, iters, sm, logits, fb):
    for _ in range(iters):
        sm[n].pick(logits[n], fb)


def div_ns(n=2000):
    # ns per float division in a bytecode loop, less the same loop without it
    xs = [1.0 + (i % 50) * 0.1 for i in range(n)]

    def with_div():
        s = 0.0
        for v in xs:
            s += 1.0 / v

    def without():
        s = 0.0
        for v in xs:
            s += v
    return 1000 * (_best(with_div, 5) - _best(without, 5)) / n


def sample_ns(q8):
    # ns per logit of a temperature-0.8 pick (sample.Sampler: bytecode on both paths),
    # int logits in Q16 as QForward's (q8) or floats as Model's
    from firmware_py import sample  # noqa: PLC0415

    sm, lg = {}, {}
    for v in (128, 512):
        sm[v] = sample.Sampler(v, temperature=0.8, seed=1)
        lg[v] = _ints(v, 37, -300000, 300000) if q8 else _floats(v, 37)
    return _marg(_pick, 128, 512, 4, sm, lg, 16 if q8 else None)


def _open(path, q8, positions):
    # (forward, cache, handle, weights) of the model at path on a full KV of `positions`
    from firmware_py import kv, llama2c, model, pool, qmodel  # noqa: PLC0415

    w = llama2c.load(path)
    c = w.cfg
    lay = kv.Layout(c.n_layers, c.n_kv_heads, c.head_dim, "int8" if q8 else "fp32")
    nb = (positions + lay.tokens_per_block - 1) // lay.tokens_per_block + 1
    pl = pool.Pool(lay.block_bytes, nb)
    cache = kv.KVCache(pl, lay, max_seqs=1)
    h = cache.open(pl.add_region(nb), "full", 0)
    fwd = qmodel.QForward(w, cache) if q8 else model.Model(w, cache, backend="plain")
    return fwd, cache, h, w


def _median(xs):
    s = sorted(xs)
    return s[len(s) // 2]


def steps_ns(path, q8, positions, reps=3):
    # decodes of `positions` tokens: (the forward, ns per cached position, ns of a step at
    # one cached position), from the medians of two windows of steps, each step's time the
    # least of `reps` decodes (what another process on the host took is not the step's); a
    # collection before each step, outside its time (one step's garbage is not the next's)
    ts = None
    fwd = None
    for _ in range(reps):
        fwd = h = None  # the last decode's weights and cache go before the next one's are read
        compat.collect()
        fwd, _, h, _ = _open(path, q8, positions)
        one = []
        for pos in range(positions):
            compat.collect()
            t0 = ticks_us()
            if q8:
                fwd.step(h, 1 + pos % 7, pos)
            else:
                for _ in fwd.forward(h, 1 + pos % 7, pos):
                    pass
            one.append(ticks_diff(ticks_us(), t0))
            if fwd.status < 0:
                raise ValueError("the probe's decode stopped at position %d (status %d)" % (pos, fwd.status))
        ts = one if ts is None else [a if a < b else b for a, b in zip(ts, one)]  # noqa: B905
    win = min(12, (positions - 4) // 2)  # two windows that do not overlap
    a0, b0 = 4, positions - win
    ma, mb = _median(ts[a0:a0 + win]), _median(ts[b0:b0 + win])
    pa, pb = a0 + (win - 1) / 2.0, b0 + (win - 1) / 2.0
    slope = (mb - ma) / (pb - pa)
    return fwd, 1000.0 * slope, 1000.0 * (ma - slope * pa)


def round_ns(models, quick=False):
    # the figures of the round guesses; models: {"q8_L1", "q8_L3", "fp32_L1", "fp32_L3": path}, and
    # the held-out q8_X, fp32_X (another shape: host/boardspeed.py checks the figures on it)
    out = {}
    for key in ("fp32_X", "q8_X", "fp32_L3", "q8_L3", "fp32_L1", "q8_L1"):  # the largest first: least fragmented
        q8 = key.startswith("q8")
        fwd, pos, base = steps_ns(models[key], q8, (32 if q8 else 20) if quick else (96 if q8 else 48), 1 if quick else 3)
        out["steps_%s_pos_ns" % key] = round(pos, 1)
        out["steps_%s_base_ns" % key] = round(base, 1)
        if key == "q8_L1":
            c = fwd.cfg
            d, hid = c.dim, c.hidden_dim
            x, xq = _ints(d, 29, -200000, 200000), _ints(d, 1, 0, 1)
            out["viper_norm_ns"] = round(_marg(_v_norm, d // 4, d, 400, fwd, x, xq), 2)
            v = _ints(d, 31, -8000, 8000)
            out["viper_rope_ns"] = round(_marg(_v_rope, d // 4, d, 400, fwd, v), 2)
            y = _ints(d, 17, -4000, 4000)
            out["viper_add_ns"] = round(_marg(_v_add, d // 4, d, 400, x, y), 2)
            a, b = _ints(hid, 13, -30000, 30000), _ints(hid, 11, -16000, 16000)
            out["viper_silu_ns"] = round(_marg(_v_silu, hid // 4, hid, 400, fwd, a, b), 2)
        if key == "fp32_L1":
            pl = fwd.k
            c = fwd.cfg
            d, hid = c.dim, c.hidden_dim
            x, o = _floats(2 * d, 29), compat.new_array("f", 2 * d)  # longer than n: no count takes the sqrt
            out["bytecode_norm_ns"] = round(_marg(_p_norm, d // 4, d, 20, pl, o, x), 1)
            v = _floats(d, 31)
            out["bytecode_rope_ns"] = round(_marg(_p_rope, d // 4, d, 20, pl, v), 1)
            y = _floats(d, 17)
            out["bytecode_add_ns"] = round(_marg(_p_add, d // 4, d, 20, pl, x, y), 1)
            a, b = _floats(hid, 13), _floats(hid, 11)
            for i in range(hid):
                b[i] = 0.5 + 0.25 * b[i]  # |a| shrinks towards 0 call after call, never overflows
            out["bytecode_silu_ns"] = round(_marg(_p_silu, hid // 4, hid, 20, pl, a, b), 1)
        fwd = None
        compat.collect()
    out["div_ns"] = round(div_ns(), 1)
    out["sample_int_ns"] = round(sample_ns(True), 1)
    out["sample_float_ns"] = round(sample_ns(False), 1)
    return out


def main(argv=()):
    # no argv: the MAC, exp and KV figures; models=DIR (q8_L1.bin, q8_L3.bin, q8_X.bin, fp32_L1.bin,
    # fp32_L3.bin, fp32_X.bin: host/boardspeed.py writes them; a run with a board's heap, -X heapsize)
    # instead: the round figures ("quick" too: one decode of fewer positions per model, the tests')
    for a in argv:
        if a.startswith("models="):
            d = a[len("models="):]
            r = round_ns({k: d + "/" + k + ".bin" for k in ("q8_L1", "q8_L3", "q8_X", "fp32_L1", "fp32_L3", "fp32_X")},
                         "quick" in argv)
            print(json.dumps(r))
            return
    r = {"viper_mac_i8_ns": round(viper_ns(), 3), "bytecode_mac_f32_ns": round(bytecode_ns(), 1),
         "exp_ns": round(exp_ns(), 1)}
    row, call = viper_row_call_ns(r["viper_mac_i8_ns"])
    r["viper_row_ns"], r["viper_call_ns"] = round(row, 2), round(call, 1)
    row, call = bytecode_row_call_ns(r["bytecode_mac_f32_ns"])
    r["bytecode_row_ns"], r["bytecode_call_ns"] = round(row, 1), round(call, 1)
    r.update(kv_ns())
    print(json.dumps(r))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
