# The integer kernels (firmware_py/kernels_q.py): on MicroPython every viper kernel
# gives the same bits as its plain-Python twin, on seeded random inputs and at the
# extremes the bounds allow (|activation| = 2**14, int8 -127/127, 512-wide rows):
# under the 32-bit build a value leaving int32 would wrap in viper and not in the twin,
# so equality there is the overflow check. On every interpreter the twins are checked
# against float arithmetic within the stated error of their fixed-point formats.
import math
from array import array

from fwtest import check, eq, done, xorshift
from firmware_py import compat
from firmware_py import kernels_q as K

VIPER = compat.IS_MICROPYTHON
rnd = xorshift(0x2545F491)  # test inputs, the same on every interpreter


def ints(n, lo, hi, extreme=False):
    # array('i') of n ints in lo..hi (extreme: only lo and hi)
    if extreme:
        return array("i", [lo if rnd(2) else hi for _ in range(n)])
    return array("i", [lo + rnd(hi - lo + 1) for _ in range(n)])


def same(name, fv, fp, args_v, args_p, outs):
    # the viper kernel and its twin on copies of the same inputs: same result, same outputs
    if not VIPER:
        return fp(*args_p)
    rv = fv(*args_v)
    rp = fp(*args_p)
    eq(rv, rp, name + ": viper and twin return the same")
    for i in outs:
        eq(list(args_v[i]), list(args_p[i]), name + ": viper and twin write the same")
    return rp


def copy(a):
    # a fresh array('i') with a's values
    return array("i", a)


# ---- matvec: groups of 64, 43 and 4, up to 512-wide rows, random and extreme inputs
for rows, cols, group, extreme in ((8, 64, 64, False), (5, 172, 43, False), (3, 16, 4, False),
                                   (4, 512, 64, True), (4, 172, 172, True)):
    w = array("b", [rnd(255) - 127 if not extreme else (127 if rnd(2) else -127) for _ in range(rows * cols)])
    ng = rows * cols // group
    gp = array("i", [(16384 + rnd(16384)) | (rnd(4) << 16) for _ in range(ng)])
    if extreme:
        gp = array("i", [32767] * ng)  # the largest multiplier, no extra shift
    x = ints(cols, -16384, 16384, extreme)
    ov, op = array("i", [0] * rows), array("i", [0] * rows)
    same("matvec %dx%d/%d" % (rows, cols, group), K.matvec_v, K.matvec_py,
         (ov, w, 0, rows, cols, group, gp, 0, x), (op, w, 0, rows, cols, group, gp, 0, x), (0,))
    for r in range(rows):
        want = 0.0
        for g in range(cols // group):
            gv = gp[r * cols // group + g]
            want += sum(w[r * cols + g * group + c] * x[g * group + c] for c in range(group)) * (gv & 0xFFFF) / 2.0 ** (16 + (gv >> 16))
        check(abs(op[r] - want) <= cols // group, "matvec row %d within one unit per group of the exact sum" % r)
        check(abs(op[r]) < 1 << 30, "matvec row %d inside the stated bound (2**30)" % r)

# ---- matvec on wide rows (llama2.c hidden_dim 4096, a group longer than MV_CHUNK): saturated
# inputs (int8 127 or -127 everywhere, |x| = 2**14, the largest multiplier) whose exact sum is
# ~2**32 (e.g. 4,261,282,816). The twin computes as a 32-bit word (kernels_q.i32) and must equal
# the wide (exact) twin; the viper kernel must equal both on the 64- and the 32-bit build; the
# result is the exact sum / 2**mv_shift(cols), inside 2**30 (what quant / add take)
eq([K.mv_shift(c) for c in (64, 1024, 1025, 2048, 4096, 5632)], [0, 0, 1, 1, 2, 3], "mv_shift")
for rows, cols, group, ws, xs in ((2, 4096, 64, 127, 16384), (2, 4096, 64, -127, 16384), (2, 4096, 4096, 127, -16384),
                                  (1, 2048, 2048, -127, -16384), (3, 1376, 43, 127, 16384), (2, 1024, 1024, 127, 16384)):
    w = array("b", [ws] * (rows * cols))
    ng = rows * cols // group
    gp = array("i", [32767] * ng)
    x = array("i", [xs] * cols)
    ov, op = array("i", [0] * rows), array("i", [0] * rows)
    same("matvec %dx%d/%d saturated" % (rows, cols, group), K.matvec_v, K.matvec_py,
         (ov, w, 0, rows, cols, group, gp, 0, x), (op, w, 0, rows, cols, group, gp, 0, x), (0,))
    wide = [0] * rows
    K.matvec_py(wide, w, 0, rows, cols, group, gp, 0, x, K.wide)
    eq(list(op), wide, "matvec %dx%d/%d: the 32-bit twin equals the wide one (no overflow)" % (rows, cols, group))
    s = K.mv_shift(cols)
    exact = ws * xs * cols * 32767 / 2.0 ** (16 + s)
    for r in range(rows):
        check(abs(op[r] - exact) <= 1 + cols // min(group, K.MV_CHUNK), "matvec %d cols: the exact sum / 2**%d" % (cols, s))
        check(abs(op[r]) < 1 << 30, "matvec %d cols: inside 2**30" % cols)
check(K.i32(4261282816) == -33684480 and K.i32(-2 ** 31) == -2 ** 31 and K.i32(2 ** 31) == -2 ** 31,
      "i32 wraps as a 32-bit word (the issue's example: 4,261,282,816 reads -33,684,480)")

# ---- quant: to |v| <= 2**14 with rounding, both directions
# (the stated input bound is |src| <= 2**30: at 2**31 - 1 the rounding add wraps on
# the 32-bit build, which this test found; every caller stays below 2**30)
for lo, hi in ((-2 ** 30 + 1, 2 ** 30 - 1), (-2 ** 30, 2 ** 30), (-100, 100), (-16384, 16384), (0, 0)):
    src = ints(40, lo, hi, lo == -2 ** 30)
    dv, dp = array("i", [0] * 40), array("i", [0] * 40)
    sh = same("quant %d..%d" % (lo, hi), K.quant_v, K.quant_py, (dv, src, 40), (dp, src, 40), (0,))
    check(max(abs(e) for e in dp) <= 16384, "quant keeps |v| <= 2**14")
    for i in range(40):
        check(abs(dp[i] * 2.0 ** sh - src[i]) <= (2.0 ** sh) / 2 + 1e-9, "quant error at most half a step")
    if hi:
        check(max(abs(e) for e in dp) >= 8192, "quant uses the top bit")

# ---- rmsnorm against float math
for n, xlo in ((64, 2 ** 21), (172, 2 ** 26), (64, 300), (16, 2 ** 30 - 1)):
    x = ints(n, -xlo, xlo, n == 16)
    g = ints(n, -32767, 32767)
    b = min(15, (30 - K.bitlen(n - 1)) // 2)
    eps0 = int(n * 1e-5 * 4294967296.0 + 0.5)
    sn = int(math.sqrt(n) * 4096 + 0.5)
    dv, dp = array("i", [0] * n), array("i", [0] * n)
    e = same("rmsnorm n=%d" % n, K.rmsnorm_v, K.rmsnorm_py, (dv, x, n, g, 0, b, eps0, sn, 15),
             (dp, x, n, g, 0, b, eps0, sn, 15), (0,))
    dw = array("i", [0] * n)
    eq((K.rmsnorm_py(dw, x, n, g, 0, b, eps0, sn, 15, K.wide), list(dw)), (e, list(dp)),
       "rmsnorm n=%d: the 32-bit twin equals the wide one" % n)
    xs = [v / 65536.0 for v in x]
    r = math.sqrt(sum(v * v for v in xs) / n + 1e-5)
    want = [xs[i] / r * g[i] / 32768.0 for i in range(n)]
    top = max(abs(v) for v in want)
    err = max(abs(dp[i] * 2.0 ** -e - want[i]) for i in range(n))
    check(err <= top * 2e-3, "rmsnorm n=%d within 0.2 %% of the largest output (%.2g)" % (n, err / top))
    check(max(abs(v) for v in dp) <= 16384, "rmsnorm output is q14")

# ---- residual add and rescale (saturating)
for sh in (-3, 0, 5, 20):
    x = ints(30, -2 ** 29, 2 ** 29)
    y = ints(30, -2 ** 30, 2 ** 30)
    xv, xp = copy(x), copy(x)
    same("add sh=%d" % sh, K.add_v, K.add_py, (xv, y, 30, sh), (xp, y, 30, sh), (0,))
    dv, dp = array("i", [0] * 30), array("i", [0] * 30)
    same("rescale sh=%d" % sh, K.rescale_v, K.rescale_py, (dv, y, 30, sh), (dp, y, 30, sh), (0,))
    check(max(abs(v) for v in xp + dp) <= K.SAT, "add and rescale saturate at 2**30 - 1")

# ---- embed, RoPE rows and rotation
w = array("b", [rnd(255) - 127 for _ in range(64)])
gp = array("i", [(16384 + rnd(16384)) | (rnd(3) << 16) for _ in range(4)])
xv, xp = array("i", [0] * 64), array("i", [0] * 64)
same("embed", K.embed_v, K.embed_py, (xv, w, 0, 64, 16, gp, 0, 21), (xp, w, 0, 64, 16, gp, 0, 21), (0,))
for c in range(64):
    gv = gp[c // 16]
    check(abs(xp[c] - w[c] * (gv & 0xFFFF) * 2.0 ** (16 - 21 - (gv >> 16))) < 1, "embed dequantizes to Q16")
seq, hd = 32, 8
lo, hi = K.rope_table(seq, hd), K.rope_table(4, hd, seq)
for pos, scale in ((0, 32768), (5, 32768), (77, 11585), (127, 32768), (128, 32768)):
    cv, cp = array("i", [0] * hd), array("i", [0] * hd)
    st = same("rope_row pos %d" % pos, K.rope_row_v, K.rope_row_py, (cv, lo, hi, 4, pos, seq, hd // 2, scale),
              (cp, lo, hi, 4, pos, seq, hd // 2, scale), (0,))
    if pos >= 4 * seq:
        eq(st, -1, "rope_row refuses a position beyond its tables")
        continue
    for i in range(hd // 2):
        a = pos * math.pow(10000.0, -2.0 * i / hd)
        check(abs(cp[2 * i] - 16384 * math.cos(a) * scale / 32768) <= 2 and abs(cp[2 * i + 1] - 16384 * math.sin(a) * scale / 32768) <= 2,
              "rope_row pos %d pair %d is cos/sin in Q14" % (pos, i))
    v = ints(16, -16384, 16384, pos == 127)
    vv, vp = copy(v), copy(v)
    same("rope pos %d" % pos, K.rope_v, K.rope_py, (vv, 16, hd, cp), (vp, 16, hd, cp), (0,))
    for j in range(0, 16, 2):
        i = (j % hd) // 2
        a = pos * math.pow(10000.0, -2.0 * i / hd)
        c, s = math.cos(a) * scale / 32768, math.sin(a) * scale / 32768
        check(abs(vp[j] - (v[j] * c - v[j + 1] * s)) <= 4 and abs(vp[j + 1] - (v[j] * s + v[j + 1] * c)) <= 4,
              "rope turns the pair")

# ---- SiLU gate
sig = K.sigmoid_table()
for sh in (-4, 0, 4):
    a = ints(50, -16384, 16384, sh == 0)
    bb = ints(50, -16384, 16384)
    ov, op = array("i", [0] * 50), array("i", [0] * 50)
    same("silu sh=%d" % sh, K.silu_v, K.silu_py, (ov, a, bb, 50, sh, sig), (op, a, bb, 50, sh, sig), (0,))
    for i in range(50):
        xr = a[i] * 2.0 ** -(sh + 10)
        want = xr / (1 + math.exp(-xr)) * bb[i] * 2.0 ** (sh + 10)
        check(abs(op[i] - want) <= abs(bb[i]) * (2.0 + abs(a[i]) * 1e-3), "silu within the table's error")


# ---- pack (int8 and int4) and attention over a hand-made block
def f32bits(buf, o):
    return buf[o] | buf[o + 1] << 8 | buf[o + 2] << 16 | buf[o + 3] << 24


def f32(bits):
    return 0.0 if not bits else math.ldexp(((bits & 0x7FFFFF) | 0x800000) / 8388608.0, ((bits >> 23) & 0xFF) - 127)


for qmax, group in ((127, 8), (7, 4)):
    v = ints(16, -23170, 23170, qmax == 7)
    rv, rp = bytearray(40), bytearray(40)
    same("pack qmax %d" % qmax, K.pack_v, K.pack_py, (rv, 0, 16, v, 16, group, 14, qmax), (rp, 0, 16, v, 16, group, 14, qmax), (0,))
    for i in range(16):
        s = f32(f32bits(rp, 16 + 4 * (i // group)))
        q = rp[i] if qmax == 127 else (rp[i // 2] >> (4 * (i & 1))) & 15
        q = q - 256 if qmax == 127 and q > 127 else q - 16 if qmax == 7 and q > 7 else q
        check(abs(q * s - v[i] / 16384.0) <= s / 2 * 1.0001 + 1e-9, "pack qmax %d: |x - q s| <= s / 2" % qmax)

# one block of T = 4 slots (3 filled, slot 2 empty), layout: 2 KV heads x hd 4, int8
T, NKV, HD, NH = 4, 2, 4, 4
KVD = NKV * HD
LROW = 2 * KVD + 4 * 2 * NKV  # K, V, K scales, V scales
arena = bytearray(T * 8 + T * LROW + 64)
bases = array("i", [0])
keys, vals = {}, {}
for r in (0, 1, 3):
    arena[8 * r] = r + 1  # position + 1
    kk, vv = ints(KVD, -16384, 16384), ints(KVD, -16384, 16384)
    row = bytearray(LROW)
    K.pack_py(row, 0, 2 * KVD, kk, KVD, HD, 14, 127)
    K.pack_py(row, KVD, 2 * KVD + 4 * NKV, vv, KVD, HD, 14 - r, 127)  # V scales differ per slot
    arena[T * 8 + r * LROW:T * 8 + (r + 1) * LROW] = row
    keys[r] = [kk[i] / 16384.0 for i in range(KVD)]
    vals[r] = [vv[i] / 2.0 ** (14 - r) for i in range(KVD)]
prm = array("i", [0] * K.PRM_LEN)
for i, val in ((K.P_T, T), (K.P_LAYER, T * 8), (K.P_LROW, LROW), (K.P_VOFF, KVD), (K.P_KSOFF, 2 * KVD),
               (K.P_VSOFF, 2 * KVD + 4 * NKV), (K.P_HEADS, NH), (K.P_REP, NH // NKV), (K.P_HD, HD), (K.P_EQ, 12),
               (K.P_NSLOT, T), (K.P_NBLK, 1), (K.P_H2O, 1), (K.P_RLEN, 1)):
    prm[i] = val
q = ints(NH * HD, -8192, 8192)
e2t = K.exp2_table()
outs = []
for impl in ((K.attend_v,) if VIPER else ()) + (K.attend_py,):
    out, sc, hacc, hexp = array("i", [0] * (NH * HD)), array("i", [0] * T), array("i", [0] * T), array("i", [0] * NH)
    e = impl(out, q, arena, bases, prm, sc, hacc, e2t, hexp, array("i", [0] * T), array("h", [0] * 4))
    outs.append((e, list(out), list(hacc)))
out, sc, hacc, hexp = array("i", [0] * (NH * HD)), array("i", [0] * T), array("i", [0] * T), array("i", [0] * NH)
e = K.attend_py(out, q, arena, bases, prm, sc, hacc, e2t, hexp, array("i", [0] * T), array("h", [0] * 4), K.wide)
eq((e, list(out), list(hacc)), outs[-1], "attend: the 32-bit twin equals the wide one")
if VIPER:
    eq(outs[0], outs[1], "attend: viper and twin give the same output, exponent and h2o scores")
e, out, hacc = outs[-1]
eq(hacc[2], 0, "attend: the empty slot gets no probability")
check(abs(sum(hacc) - NH * 32768) <= NH * 4, "attend: each head's probabilities sum to 1 (Q15)")
for h in range(NH):
    kvh = h // (NH // NKV)
    qh = [q[h * HD + d] / 2.0 ** 12 for d in range(HD)]
    sc = {r: sum(qh[d] * keys[r][kvh * HD + d] for d in range(HD)) for r in keys}
    mx = max(sc.values())
    z = sum(math.exp(s - mx) for s in sc.values())
    for d in range(HD):
        want = sum(math.exp(sc[r] - mx) / z * vals[r][kvh * HD + d] for r in keys)
        top = max(abs(vals[r][kvh * HD + j]) for r in keys for j in range(HD))
        check(abs(out[h * HD + d] * 2.0 ** -e - want) <= top * 0.02, "attend head %d dim %d near the float softmax" % (h, d))

# ---- attention in ranges (P_PASS): each pass of each head over ranges of blocks, the
# head's state kept in prm between the calls, gives the whole call's bits (5 blocks of
# T slots, holes, the last block part-filled; scores all negative in one run: the kept
# maximum is a negative int32 read back on the 64-bit port)
NB = 5
NS = NB * T - 2
bases5 = array("i", [b * (T * 8 + T * LROW) for b in range(NB)])
kfix = ints(KVD, 4096, 16384)  # all positive: with q = -k every score is negative
for neg in (False, True):
    arena5 = bytearray(NB * (T * 8 + T * LROW) + 64)
    for j in range(NS):
        if j % 7 == 3:
            continue  # an empty slot
        b, r = j // T, j % T
        arena5[bases5[b] + 8 * r] = j + 1
        row = bytearray(LROW)
        K.pack_py(row, 0, 2 * KVD, kfix if neg else ints(KVD, -16384, 16384), KVD, HD, 14, 127)
        K.pack_py(row, KVD, 2 * KVD + 4 * NKV, ints(KVD, -16384, 16384), KVD, HD, 14 - (j % 5), 127)
        o = bases5[b] + T * 8 + r * LROW
        arena5[o:o + LROW] = row
    q5 = array("i", [-2048] * (NH * HD)) if neg else ints(NH * HD, -8192, 8192)
    p5 = array("i", prm)
    p5[K.P_NSLOT] = NS
    p5[K.P_NBLK] = NB
    for impl in ((K.attend_v,) if VIPER else ()) + (K.attend_py,):
        runs = []
        for ranged in (False, True):
            out, sc, hacc, hexp = array("i", [0] * (NH * HD)), array("i", [0] * NS), array("i", [0] * NS), array("i", [0] * NH)
            rk = array("i", [0] * NS)
            if not ranged:
                e = impl(out, q5, arena5, bases5, p5, sc, hacc, e2t, hexp, rk, array("h", [0] * 4))
            else:
                for h in range(NH):
                    p5[K.P_H0], p5[K.P_H1] = h, h + 1
                    for pas in (1, 2, 3):
                        p5[K.P_PASS] = pas
                        for k0 in range(0, NB, 2):
                            p5[K.P_K0], p5[K.P_K1] = k0, k0 + 2
                            e = impl(out, q5, arena5, bases5, p5, sc, hacc, e2t, hexp, rk, array("h", [0] * 4))
                            if not (h == NH - 1 and pas == 3 and k0 + 2 >= NB):
                                eq(e, 0, "attend in ranges: only the last call returns the exponent")
                        if neg and pas == 1:
                            check(p5[K.P_SMAX] < 0, "attend in ranges: (neg) the kept maximum score is negative")
                p5[K.P_PASS], p5[K.P_H0], p5[K.P_H1] = 0, 0, 0
            runs.append((e, list(out), list(hacc)))
        eq(runs[1], runs[0], "attend in ranges (neg=%s) equals the whole call" % neg)
        check(any(runs[0][1]), "attend in ranges: a nonzero output")

v = ints(40, -2 ** 30, 2 ** 30)
eq(K.argmax(v, 40), max(range(40), key=lambda i: (v[i], -i)), "argmax: the first largest")
done()
