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


def _viper(y, w, cols, gp, x, iters):
    for _ in range(iters):
        kernels_q.matvec(y, w, 0, ROWS, cols, GROUP, gp, 0, x)


def _plain(fs, y, m, x, iters):
    for _ in range(iters):
        kernels.Plain.matvec_rows(fs, y, m, x, 0, m.rows)  # the plain matvec, on a stand-in self


def viper_ns(iters=40):
    t = {}
    for cols in (NARROW, WIDE):
        w = bytearray(ROWS * cols)
        for i in range(len(w)):
            w[i] = (i * 29 + 7) & 0xFF
        gp = compat.new_array("i", ROWS * cols // GROUP)
        for i in range(len(gp)):
            gp[i] = 16384 | (4 << 16)
        x = compat.new_array("i", cols)
        for i in range(cols):
            x[i] = (i * 53) % 2001 - 1000
        y = compat.new_array("i", ROWS)

        t[cols] = _best(_viper, 5, y, w, cols, gp, x, iters)
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


def main():
    r = {"viper_mac_i8_ns": round(viper_ns(), 3), "bytecode_mac_f32_ns": round(bytecode_ns(), 1),
         "exp_ns": round(exp_ns(), 1)}
    r.update(kv_ns())
    print(json.dumps(r))


if __name__ == "__main__":
    main()
