# The integer kernels of the int8 forward pass (firmware_py/qmodel.py), CMSIS-NN style:
# int8 weights with a fixed-point multiplier per group, activations as int32 arrays
# holding values of at most 2**14 in magnitude ("q14") with a power-of-two exponent
# kept by the caller (real = v * 2**-e), int32 accumulation, integer rmsnorm, softmax
# (exp2 table), SiLU (sigmoid table), RoPE (Q14 cos/sin table) and attention over the
# KV cache's int8 rows. No float anywhere: nothing here allocates on MicroPython.
#
# Every kernel exists twice: NAME_v, @micropython.viper (machine words: 32 bits on the
# ESP32-S3, 64 on the unix port), and NAME_py, plain Python integers, the oracle. The
# two give the same bits as long as no intermediate leaves int32, and every bound below
# is chosen so none does (tests/firmware/fw_kernels_q.py compares them on random and
# extreme inputs under the 64- and the 32-bit build, where a wrap would show). The
# twins' sums go through `reg` (i32: what a 32-bit register holds), so they wrap as the
# chip would; with reg=wide they are exact, and the tests compare the two on every
# interpreter. matvec splits any row so it cannot overflow (MV_CHUNK, mv_shift); the
# dimensions no kernel can split are refused at load (limits, QForward). The
# public NAME is the viper one on MicroPython, the twin on CPython.
#
# Viper facts used: ptr8 loads are unsigned (sign-extend int8 by (b ^ 128) - 128),
# ptr32 loads are signed words on a 32-bit port but zero-extended on a 64-bit one, so
# an int32 that may be negative is read as (w ^ M31) - M31 with M31 = 1 << 31 computed
# at run time (the literal 2**31 is not a small int on the ESP32). A linear sum of
# products of such loads is right mod 2**32 either way: it is sign-fixed once, at the
# end of a group. Shifts stay below 32 (a shift by >= 32 differs between ports).
#
# Fixed-point formats:
#   weights    int8 q, per group (m, d) packed as m | d << 16: W = q * m * 2**-(emin + d),
#              m in [2**14, 2**15) (0 for an all-zero group), d in 0..30, emin per matrix
#   x          the residual stream, int32 Q16 (X_FRAC), saturated at +-(2**30 - 1)
#   q14        |v| <= 2**14, exponent e from the caller; matvec needs its input in q14
#   scores     int32 Q12 (S_FRAC); probabilities Q15; cos/sin Q14
#   KV scales  fp32 bit patterns (kv.py's Layout), read as a 15-bit mantissa and an
#              exponent: scale = ((bits & 0x7FFFFF | 0x800000) >> 9) * 2**(E - 141)
from firmware_py import compat
from firmware_py.compat import const, micropython, ptr8, ptr16, ptr32  # noqa: F401 - viper casts

X_FRAC = const(16)  # fractional bits of the residual stream
S_FRAC = const(12)  # fractional bits of attention scores
Q14_MAX = const(16384)  # activations handed to matvec are at most this in magnitude
LOG2E_Q14 = const(23637)  # log2(e) in Q14
EXP2_BITS = const(6)  # exp2 table: 2**(i / 64) for i = 0..64, Q15
SIG_RANGE = const(16)  # sigmoid table covers -16 .. 16
SIG_STEP_BITS = const(5)  # ... in steps of 1/32: 1025 entries, Q15
SAT = const(0x3FFFFFFF)  # saturation of x and logits: stay small ints on the ESP32
D_MAX = const(30)  # largest per-group extra shift (smaller groups contribute 0)
# prm (array 'i') fields of attend(): set once at boot except where marked per call
P_T = const(0)  # tokens per block
P_LAYER = const(1)  # per call: byte offset of the layer's first row inside a block
P_LROW = const(2)  # bytes per layer row
P_VOFF = const(3)  # V data offset in a row
P_KSOFF = const(4)  # K scales offset in a row
P_VSOFF = const(5)  # V scales offset in a row
P_HEADS = const(6)  # query heads
P_REP = const(7)  # query heads per KV head
P_HD = const(8)  # head_dim
P_EQ = const(9)  # per call: exponent of q
P_NSLOT = const(10)  # per call: slots to scan (blocks x T, capped at the budget)
P_NBLK = const(11)  # per call: blocks in bases
P_H2O = const(12)  # 1: add each probability to hacc[slot]
P_ROT = const(13)  # 1 (rope="cache"): rotate each key by ranks[slot] at attention time
P_KSH = const(14)  # rope="cache": right shift of a rotated key (Q14 * int8) before the dot
P_RLEN = const(15)  # rope="cache": rows in the cos/sin table
P_H0 = const(16)  # per call: the first query head to attend (a sliced step: a unit of heads)
P_H1 = const(17)  # per call: the head after the last (0: every head, in one call)
# one pass of one head over a range of blocks (a sliced step, slicer.Slicer.att_range: one
# head's attention over very many slots would hold the CPU longer than a slice)
P_PASS = const(18)  # per call: 0: every pass of heads P_H0..P_H1 - 1; 1 scores, 2 exp, 3 values: that pass only
P_K0 = const(19)  # per call (P_PASS > 0): the first block of the range
P_K1 = const(20)  # ... the block after its last (capped at P_NBLK)
P_SMAX = const(21)  # a head's state between its passes' ranges: the largest score,
P_EVMAX = const(22)  # ... the largest V scale exponent,
P_TOT = const(23)  # ... the sum of the exp weights
PRM_LEN = const(24)


# --- tables, built at boot (floats: boot only) ---------------------------------------

# exp2 table: round(2**15 * 2**(i / 64)) for i = 0..64 (array 'i'); allocates (boot)
def exp2_table():
    from array import array

    return array("i", [int(32768.0 * 2.0 ** (i / 64.0) + 0.5) for i in range((1 << EXP2_BITS) + 1)])


# sigmoid table: round(2**15 * sigmoid(x)) for x = -16 .. 16 step 1/32 (array 'i'); allocates (boot)
def sigmoid_table():
    import math

    from firmware_py.compat import new_array

    n = 2 * SIG_RANGE << SIG_STEP_BITS
    out = new_array("i", n + 1)  # every element written below
    for i in range(n + 1):
        x = (i - n // 2) / float(1 << SIG_STEP_BITS)
        out[i] = int(32768.0 / (1.0 + math.exp(-x)) + 0.5)
    return out


# cos/sin rows in Q14 (array 'h', [rows][hd/2][2]) for positions p0, p0 + step, ...;
# theta_i = 10000**(-2i/hd) as llama2.c; allocates (boot)
def rope_table(rows, hd, step=1):
    import math

    from firmware_py.compat import new_array

    hd2 = hd // 2
    out = new_array("h", rows * hd2 * 2)  # every element written below; no temporary list of its length
    for p in range(rows):
        for i in range(hd2):
            a = p * step * math.pow(10000.0, -2.0 * i / hd)
            out[(p * hd2 + i) * 2] = int(math.floor(16384.0 * math.cos(a) + 0.5))
            out[(p * hd2 + i) * 2 + 1] = int(math.floor(16384.0 * math.sin(a) + 0.5))
    return out


# (m, e) of a positive float: f ~ m * 2**-e, m in [2**14, 2**15), from its fp32 bits;
# (0, 0) for zero or a denormal; allocates (boot)
def float_me(f):
    import struct

    bits = struct.unpack("<I", struct.pack("<f", f))[0] & 0x7FFFFFFF
    ex = bits >> 23
    if ex == 0:
        return 0, 0
    mant = (bits & 0x7FFFFF) | 0x800000
    m = (mant + 256) >> 9  # rounded to 15 bits
    e = 141 - ex
    if m >= 32768:
        m >>= 1
        e -= 1
    return m, e


# --- matvec ---------------------------------------------------------------------------

# columns of one group summed into one int32 (a longer group is summed in chunks of this
# many): 512 x 128 x 2**14 = 2**30, so no int8 x q14 sum of a chunk leaves int32
MV_CHUNK = const(512)
MV_COLS = const(1024)  # columns matvec sums at full scale: |out| < MV_COLS x 2**20 = 2**30
HD_MAX = const(1023)  # head_dim: hd x 128 x 2**14 < 2**31 (attend's dot of int8 keys and q14 queries)
DIM_MAX = const(24999)  # dim: dim x 1e-5 x 2**32 < 2**30 (rmsnorm's eps0, a small int on the ESP32)
SLOTS_MAX = const(65535)  # cached slots: slots x 2**15 < 2**31 (attend's sum of exp weights, Q15 each)


# the right shift matvec applies to a row of `cols` columns so that |out| < 2**30 (what
# quant, add and rescale take) whatever the inputs: 0 up to MV_COLS columns, then one bit
# per doubling; the caller's exponent drops by it. O(log cols)
def mv_shift(cols):
    s = 0
    while cols > (MV_COLS << s):
        s += 1
    return s


@micropython.viper
def matvec_v(out, w, woff: int, rows: int, cols: int, group: int, gp, goff: int, x):
    # out[r] = sum over groups g, chunks k of floor(acc_gk * m_g / 2**(16 + d_g + s)),
    # acc_gk = chunk k (MV_CHUNK columns at most) of group g of the int8 row of w at woff
    # . x (q14 int32), s = mv_shift(cols); |out| < 2**30 at any cols: no sum leaves int32
    # on a 32-bit word. O(rows * cols), no allocation
    o = ptr32(out)
    px = ptr32(x)
    pg = ptr32(gp)
    wb = uint(ptr8(w))  # noqa: F821 - viper's uint cast: the buffer's address
    one = 1
    m31 = one << 31
    msk = (m31 << 1) - 1
    ng = cols // group
    ch = group  # columns per int32 sum
    if ch > MV_CHUNK:
        ch = MV_CHUNK
    s = 0  # mv_shift(cols)
    while cols > (MV_COLS << s):
        s += 1
    gi = goff
    r = 0
    base = woff
    while r < rows:
        tot = 0
        g = 0
        c0 = 0
        while g < ng:
            pw = ptr8(wb + base + c0)
            gv = int(pg[gi])
            m = gv & 0xFFFF
            sft = (gv >> 16) + s
            if sft > 31:
                sft = 31  # a shift by >= 32 differs between ports; |floor(acc * m / 2**16)| < 2**30 is 0 or -1 by then
            cs = 0
            while cs < group:
                ce = cs + ch
                if ce > group:
                    ce = group
                e4 = ce - 3
                acc = 0
                c = cs
                while c < e4:
                    xc = c0 + c
                    acc += ((int(pw[c]) ^ 128) - 128) * int(px[xc])
                    acc += ((int(pw[c + 1]) ^ 128) - 128) * int(px[xc + 1])
                    acc += ((int(pw[c + 2]) ^ 128) - 128) * int(px[xc + 2])
                    acc += ((int(pw[c + 3]) ^ 128) - 128) * int(px[xc + 3])
                    c += 4
                while c < ce:
                    acc += ((int(pw[c]) ^ 128) - 128) * int(px[c0 + c])
                    c += 1
                acc = ((acc & msk) ^ m31) - m31  # the int32 the sum is mod 2**32
                tot += ((acc >> 16) * m + (((acc & 0xFFFF) * m) >> 16)) >> sft
                cs = ce
            gi += 1
            c0 += group
            g += 1
        o[r] = tot
        base += cols
        r += 1


# None when a model of this dim, head_dim and cache slots runs with no sum leaving a
# 32-bit word on the chip (matvec splits any row: mv_shift), else one line naming the
# dimension and its limit; QForward refuses such a model at load. O(1)
def limits(dim, head_dim, slots):
    if head_dim > HD_MAX:
        return "head_dim %d is above %d: attention's int8 key x q14 query dot would leave a 32-bit word" % (
            head_dim, HD_MAX)
    if dim > DIM_MAX:
        return "dim %d is above %d: rmsnorm's eps term (dim x eps x 2**32) would leave a small int" % (dim, DIM_MAX)
    if slots > SLOTS_MAX:
        return "the cache holds %d slots per sequence, above %d: attention's sum of Q15 weights would leave a " \
               "32-bit word" % (slots, SLOTS_MAX)
    return None


# a value as a 32-bit register holds it: v mod 2**32, signed (the twins' default `reg`)
def i32(v):
    return ((v + 0x80000000) & 0xFFFFFFFF) - 0x80000000


# the wide (exact) result: a twin given reg=wide computes in unbounded integers, and
# tests compare it with the 32-bit twin, so an overflow fails on the host
def wide(v):
    return v


# twin of matvec_v in plain Python integers, each int32 sum through reg (i32: wrapped
# as a 32-bit word, as viper's; wide: exact); O(rows * cols)
def matvec_py(out, w, woff, rows, cols, group, gp, goff, x, reg=i32):
    ng = cols // group
    ch = min(group, MV_CHUNK)
    s = mv_shift(cols)
    gi = goff
    base = woff
    for r in range(rows):
        tot = 0
        for g in range(ng):
            gv = gp[gi]
            m = gv & 0xFFFF
            sft = 16 + (gv >> 16) + s
            b = base + g * group
            xb = g * group
            for cs in range(0, group, ch):
                acc = 0
                for c in range(cs, min(cs + ch, group)):
                    acc += w[b + c] * x[xb + c]
                tot += (reg(acc) * m) >> sft
            gi += 1
        out[r] = reg(tot)
        base += cols


# --- quantize to q14 --------------------------------------------------------------------

@micropython.viper
def quant_v(dst, src, n: int) -> int:
    # dst = src (|src| <= 2**30: the rounding add must not leave int32) shifted right by
    # sh with rounding (left when sh < 0) so that |dst| <= 2**14; returns sh (0 when all
    # zero). O(n), no allocation
    d = ptr32(dst)
    s = ptr32(src)
    one = 1
    m31 = one << 31
    mx = 0
    i = 0
    while i < n:
        v = (int(s[i]) ^ m31) - m31
        if v < 0:
            v = -v
        if v > mx:
            mx = v
        i += 1
    bl = 0
    while mx:
        mx >>= 1
        bl += 1
    if bl == 0:
        sh = 0
    else:
        sh = bl - 14
    i = 0
    if sh > 0:
        half = 1 << (sh - 1)
        while i < n:
            d[i] = (((int(s[i]) ^ m31) - m31) + half) >> sh
            i += 1
    else:
        ls = 0 - sh
        while i < n:
            d[i] = ((int(s[i]) ^ m31) - m31) << ls
            i += 1
    return sh


# twin of quant_v; O(n)
def quant_py(dst, src, n):
    mx = 0
    for i in range(n):
        v = abs(src[i])
        if v > mx:
            mx = v
    bl = 0
    while mx:
        mx >>= 1
        bl += 1
    sh = bl - 14 if bl else 0
    for i in range(n):
        dst[i] = (src[i] + (1 << (sh - 1))) >> sh if sh > 0 else src[i] << -sh
    return sh


# --- rmsnorm ------------------------------------------------------------------------------

@micropython.viper
def rmsnorm_v(dst, x, n: int, g, goff: int, b: int, eps0: int, sn: int, eg: int) -> int:
    # dst (q14) = x (Q16) / sqrt(mean(x**2) + eps) * g[goff..] (gains Q(eg)); returns the
    # exponent of dst. b: bits kept per element for the sum of squares (n * 4**b <= 2**30);
    # eps0 = round(n * eps * 2**32); sn = round(sqrt(n) * 2**12). O(n), no allocation
    d = ptr32(dst)
    px = ptr32(x)
    pg = ptr32(g)
    one = 1
    m31 = one << 31
    mx = 0
    i = 0
    while i < n:
        v = (int(px[i]) ^ m31) - m31
        if v < 0:
            v = -v
        if v > mx:
            mx = v
        i += 1
    bl = 0
    while mx:
        mx >>= 1
        bl += 1
    k = bl - b
    if k < 0:
        k = 0
    ss = 0
    i = 0
    while i < n:
        v = ((int(px[i]) ^ m31) - m31) >> k
        ss += v * v
        i += 1
    k2 = k + k
    if k2 > 31:
        k2 = 31
    v = ss + (eps0 >> k2)
    if v < 1:
        v = 1
    # r = floor(sqrt(v)) by Newton from a power of two above it
    bl = 0
    t = v
    while t:
        t >>= 1
        bl += 1
    r = 1 << ((bl + 1) >> 1)
    while True:
        y = (r + v // r) >> 1
        if y >= r:
            break
        r = y
    bl = 0
    t = r
    while t:
        t >>= 1
        bl += 1
    bs = 0
    t = sn
    while t:
        t >>= 1
        bs += 1
    p = bl + 14 - bs
    if p >= 0:
        c = (sn << p) // r
    else:
        c = (sn >> (0 - p)) // r
    mx = 0
    i = 0
    while i < n:
        t = (((int(px[i]) ^ m31) - m31) >> k) * ((int(pg[goff + i]) ^ m31) - m31)
        u = (t >> 16) * c + (((t & 0xFFFF) * c) >> 16)
        d[i] = u
        if u < 0:
            u = -u
        if u > mx:
            mx = u
        i += 1
    bl = 0
    while mx:
        mx >>= 1
        bl += 1
    sh = bl - 14
    if bl == 0:
        sh = 0
    i = 0
    if sh > 0:
        half = 1 << (sh - 1)
        while i < n:
            d[i] = (((int(d[i]) ^ m31) - m31) + half) >> sh
            i += 1
    elif sh < 0:
        ls = 0 - sh
        while i < n:
            d[i] = ((int(d[i]) ^ m31) - m31) << ls
            i += 1
    return p - 4 + eg - sh


# twin of rmsnorm_v; the sum of squares through reg (i32 as the 32-bit word, wide: exact); O(n)
def rmsnorm_py(dst, x, n, g, goff, b, eps0, sn, eg, reg=i32):
    mx = max(abs(x[i]) for i in range(n))
    k = max(bitlen(mx) - b, 0)
    ss = 0
    for i in range(n):
        v = x[i] >> k
        ss += v * v
    v = max(reg(ss + (eps0 >> min(2 * k, 31))), 1)
    r = _isqrt(v)
    p = bitlen(r) + 14 - bitlen(sn)
    c = (sn << p) // r if p >= 0 else (sn >> -p) // r
    u = [((x[i] >> k) * g[goff + i] * c) >> 16 for i in range(n)]
    bl = bitlen(max(abs(e) for e in u))
    sh = bl - 14 if bl else 0
    for i in range(n):
        dst[i] = (u[i] + (1 << (sh - 1))) >> sh if sh > 0 else u[i] << -sh
    return p - 4 + eg - sh


# bits of a non-negative int (0 for 0); O(bits)
def bitlen(v):
    n = 0
    while v:
        v >>= 1
        n += 1
    return n


# floor(sqrt(v)) for v >= 1, Newton from a power of two above it (as rmsnorm_v); O(log v)
def _isqrt(v):
    r = 1 << ((bitlen(v) + 1) >> 1)
    while True:
        y = (r + v // r) >> 1
        if y >= r:
            return r
        r = y


# --- residual add, rescale ------------------------------------------------------------

@micropython.viper
def add_v(x, y, n: int, sh: int):
    # x += y (|x|, |y| <= 2**30) shifted right by sh with rounding (left when sh < 0,
    # saturating first), the sum saturated at +-(2**30 - 1); O(n), no allocation
    px = ptr32(x)
    py = ptr32(y)
    one = 1
    m31 = one << 31
    hi = 0x3FFFFFFF
    lo = 0 - hi
    half = 0
    if sh > 0:
        half = 1 << (sh - 1)
    i = 0
    while i < n:
        v = (int(py[i]) ^ m31) - m31
        if sh > 0:
            v = (v + half) >> sh
        elif sh < 0:
            # saturate before the shift can leave int32
            lim = hi >> (0 - sh)
            if v > lim:
                v = hi
            elif v < 0 - lim:
                v = lo
            else:
                v = v << (0 - sh)
        v += (int(px[i]) ^ m31) - m31
        if v > hi:
            v = hi
        elif v < lo:
            v = lo
        px[i] = v
        i += 1


# twin of add_v; O(n)
def add_py(x, y, n, sh):
    for i in range(n):
        v = y[i]
        if sh > 0:
            v = (v + (1 << (sh - 1))) >> sh
        elif sh < 0:
            lim = SAT >> -sh
            v = SAT if v > lim else -SAT if v < -lim else v << -sh
        x[i] = max(-SAT, min(SAT, x[i] + v))


@micropython.viper
def rescale_v(dst, src, n: int, sh: int):
    # dst = src shifted right by sh with rounding (left when sh < 0), saturated at
    # +-(2**30 - 1); O(n), no allocation
    d = ptr32(dst)
    s = ptr32(src)
    one = 1
    m31 = one << 31
    hi = 0x3FFFFFFF
    lo = 0 - hi
    half = 0
    if sh > 0:
        half = 1 << (sh - 1)
    i = 0
    while i < n:
        v = (int(s[i]) ^ m31) - m31
        if sh > 0:
            v = (v + half) >> sh
        elif sh < 0:
            # saturate before the shift can leave int32
            lim = hi >> (0 - sh)
            if v > lim:
                v = hi
            elif v < 0 - lim:
                v = lo
            else:
                v = v << (0 - sh)
        if v > hi:
            v = hi
        elif v < lo:
            v = lo
        d[i] = v
        i += 1


# twin of rescale_v; O(n)
def rescale_py(dst, src, n, sh):
    for i in range(n):
        v = src[i]
        if sh > 0:
            v = (v + (1 << (sh - 1))) >> sh
        elif sh < 0:
            lim = SAT >> -sh
            v = SAT if v > lim else -SAT if v < -lim else v << -sh
        dst[i] = max(-SAT, min(SAT, v))


# --- embedding row ------------------------------------------------------------------------

@micropython.viper
def embed_v(x, w, off: int, cols: int, group: int, gp, goff: int, emin: int):
    # x (Q16) = row of int8 w at off times its group scales: floor(q * m * 2**(16 - e));
    # O(cols), no allocation
    px = ptr32(x)
    pw = ptr8(w)
    pg = ptr32(gp)
    c = 0
    gi = goff
    while c < cols:
        gv = int(pg[gi])
        m = gv & 0xFFFF
        s = emin + (gv >> 16) - 16
        j = 0
        while j < group:
            q = ((int(pw[off + c]) ^ 128) - 128) * m
            if s >= 0:
                px[c] = q >> s
            else:
                px[c] = q << (0 - s)
            c += 1
            j += 1
        gi += 1


# twin of embed_v; O(cols)
def embed_py(x, w, off, cols, group, gp, goff, emin):
    for c in range(cols):
        gv = gp[goff + c // group]
        s = emin + (gv >> 16) - 16
        q = w[off + c] * (gv & 0xFFFF)
        x[c] = q >> s if s >= 0 else q << -s


# --- RoPE ---------------------------------------------------------------------------------

@micropython.viper
def rope_row_v(cs, lo, hi, nhi: int, pos: int, seq: int, hd2: int, scale: int) -> int:
    # cs = (cos, sin) of pos * theta_i, Q14 times scale / 2**15, from lo (positions
    # 0..seq-1) and hi (nhi rows: multiples of seq) by the angle sum; 0, or -1 when pos
    # is beyond the tables (pos >= nhi * seq). O(hd2), no allocation
    pc = ptr32(cs)
    pl = ptr16(lo)
    ph = ptr16(hi)
    if pos < 0:
        return -1
    a = pos % seq
    b = pos // seq
    if b >= nhi:
        return -1
    i = 0
    while i < hd2:
        c2 = (int(pl[(a * hd2 + i) * 2]) ^ 0x8000) - 0x8000
        s2 = (int(pl[(a * hd2 + i) * 2 + 1]) ^ 0x8000) - 0x8000
        c1 = (int(ph[(b * hd2 + i) * 2]) ^ 0x8000) - 0x8000
        s1 = (int(ph[(b * hd2 + i) * 2 + 1]) ^ 0x8000) - 0x8000
        c = (c1 * c2 - s1 * s2 + 8192) >> 14
        s = (s1 * c2 + c1 * s2 + 8192) >> 14
        pc[2 * i] = (c * scale + 16384) >> 15
        pc[2 * i + 1] = (s * scale + 16384) >> 15
        i += 1
    return 0


# twin of rope_row_v; O(hd2)
def rope_row_py(cs, lo, hi, nhi, pos, seq, hd2, scale):
    if pos < 0:
        return -1
    a, b = pos % seq, pos // seq
    if b >= nhi:
        return -1
    for i in range(hd2):
        c2, s2 = lo[(a * hd2 + i) * 2], lo[(a * hd2 + i) * 2 + 1]
        c1, s1 = hi[(b * hd2 + i) * 2], hi[(b * hd2 + i) * 2 + 1]
        c = (c1 * c2 - s1 * s2 + 8192) >> 14
        s = (s1 * c2 + c1 * s2 + 8192) >> 14
        cs[2 * i] = (c * scale + 16384) >> 15
        cs[2 * i + 1] = (s * scale + 16384) >> 15
    return 0


@micropython.viper
def rope_v(v, n: int, hd: int, cs):
    # rotate the pairs (v[2i], v[2i+1]) of each head of v (n values, q14) by cs (Q14);
    # results stay within 2**14 * sqrt(2) * |cs|. O(n), no allocation
    p = ptr32(v)
    pc = ptr32(cs)
    one = 1
    m31 = one << 31
    hd2 = hd >> 1
    j = 0
    while j < n:
        i = 0
        while i < hd2:
            c = (int(pc[2 * i]) ^ m31) - m31
            s = (int(pc[2 * i + 1]) ^ m31) - m31
            a = (int(p[j]) ^ m31) - m31
            b = (int(p[j + 1]) ^ m31) - m31
            p[j] = (a * c - b * s + 8192) >> 14
            p[j + 1] = (a * s + b * c + 8192) >> 14
            j += 2
            i += 1


# twin of rope_v; O(n)
def rope_py(v, n, hd, cs):
    for j in range(0, n, 2):
        i = (j % hd) >> 1
        c, s = cs[2 * i], cs[2 * i + 1]
        a, b = v[j], v[j + 1]
        v[j] = (a * c - b * s + 8192) >> 14
        v[j + 1] = (a * s + b * c + 8192) >> 14


# --- KV rows ----------------------------------------------------------------------------

@micropython.viper
def pack_v(row, doff: int, soff: int, v, n: int, group: int, ex: int, qmax: int):
    # quantize v (n values, |v| <= 2**15, exponent ex) into row: groups of `group`
    # values, scale = max|v| / qmax as fp32 bits at byte soff (one per group), values
    # round(v * qmax / max) at byte doff as int8 (qmax 127) or int4 pairs, low nibble
    # first (qmax 7). O(n), no allocation
    pd = ptr8(row)
    ps = ptr32(row)
    pv = ptr32(v)
    one = 1
    m31 = one << 31
    g = 0
    j = 0
    while j < n:
        amax = 0
        i = 0
        while i < group:
            a = (int(pv[j + i]) ^ m31) - m31
            if a < 0:
                a = -a
            if a > amax:
                amax = a
            i += 1
        bits = 0
        if amax > 0:
            bl = 0
            t = amax
            while t:
                t >>= 1
                bl += 1
            s = 31 - bl
            mant = (amax << s) // qmax
            while mant >= 0x1000000:
                mant >>= 1
                s -= 1
            e = 150 - s - ex
            if e > 0 and e < 255:
                bits = (e << 23) | (mant & 0x7FFFFF)
        ps[(soff >> 2) + g] = bits
        i = 0
        while i < group:
            a = (int(pv[j + i]) ^ m31) - m31
            q = 0
            if bits:
                if a >= 0:
                    q = (a * 2 * qmax + amax) // (2 * amax)
                else:
                    q = 0 - (((0 - a) * 2 * qmax + amax) // (2 * amax))
            k = j + i
            if qmax == 127:
                pd[doff + k] = q & 0xFF
            elif k & 1:
                pd[doff + (k >> 1)] = (int(pd[doff + (k >> 1)]) & 0x0F) | ((q & 15) << 4)
            else:
                pd[doff + (k >> 1)] = (int(pd[doff + (k >> 1)]) & 0xF0) | (q & 15)
            i += 1
        j += group
        g += 1


# twin of pack_v; O(n)
def pack_py(row, doff, soff, v, n, group, ex, qmax):
    for g in range(n // group):
        j = g * group
        amax = max(abs(v[j + i]) for i in range(group))
        bits = 0
        if amax > 0:
            s = 31 - bitlen(amax)
            mant = (amax << s) // qmax
            while mant >= 0x1000000:
                mant >>= 1
                s -= 1
            e = 150 - s - ex
            if 0 < e < 255:
                bits = (e << 23) | (mant & 0x7FFFFF)
        row[soff + 4 * g:soff + 4 * g + 4] = bytes((bits & 255, (bits >> 8) & 255, (bits >> 16) & 255, bits >> 24))
        for i in range(group):
            a = v[j + i]
            q = 0
            if bits:
                q = (a * 2 * qmax + amax) // (2 * amax) if a >= 0 else -((-a * 2 * qmax + amax) // (2 * amax))
            k = j + i
            if qmax == 127:
                row[doff + k] = q & 0xFF
            elif k & 1:
                row[doff + (k >> 1)] = (row[doff + (k >> 1)] & 0x0F) | ((q & 15) << 4)
            else:
                row[doff + (k >> 1)] = (row[doff + (k >> 1)] & 0xF0) | (q & 15)


# --- SiLU gate ------------------------------------------------------------------------------

@micropython.viper
def silu_v(out, a, b, n: int, sh: int, sig):
    # out = silu(a) * b: a, b q14 (a's exponent minus 10 = sh), sigmoid from the Q15
    # table sig by linear interpolation; |out| <= 2**28, exponent ea + eb. O(n), no allocation
    po = ptr32(out)
    pa = ptr32(a)
    pb = ptr32(b)
    ps = ptr32(sig)
    one = 1
    m31 = one << 31
    i = 0
    while i < n:
        x = (int(pa[i]) ^ m31) - m31
        if sh >= 0:
            t = x >> sh
        elif x > (16384 >> (0 - sh)):
            t = 16383
        elif x < 0 - (16384 >> (0 - sh)):
            t = -16384
        else:
            t = x << (0 - sh)
        if t > 16383:
            t = 16383
        elif t < -16384:
            t = -16384
        u = t + 16384
        k = u >> 5
        s0 = int(ps[k])
        sg = s0 + (((int(ps[k + 1]) - s0) * (u & 31)) >> 5)
        po[i] = ((x * sg) >> 15) * ((int(pb[i]) ^ m31) - m31)
        i += 1


# twin of silu_v; O(n)
def silu_py(out, a, b, n, sh, sig):
    for i in range(n):
        x = a[i]
        if sh >= 0:
            t = x >> sh
        else:
            lim = 16384 >> -sh
            t = 16383 if x > lim else -16384 if x < -lim else x << -sh
        t = max(-16384, min(16383, t))
        u = t + 16384
        k = u >> 5
        sg = sig[k] + (((sig[k + 1] - sig[k]) * (u & 31)) >> 5)
        out[i] = ((x * sg) >> 15) * b[i]


# --- attention over the cache's rows -----------------------------------------------------

@micropython.viper
def ranks_v(ranks, pos, arena, bases, nblk: int, t: int, nslot: int, j0: int, j1: int) -> int:
    # for every filled slot j (header != 0) in j0 .. j1 - 1 of the nblk blocks at byte
    # offsets bases: ranks[j] = how many filled slots hold an older position (pos: one int
    # per slot, the slots' positions, gathered when j0 == 0: a step's parts run j0 = 0
    # first); returns the filled slots of all nslot at the last part (j1 == nslot), else 0.
    # O(nslot x (j1 - j0)), plus O(nslot) in the first and the last part; no allocation
    pr = ptr32(ranks)
    pp = ptr32(pos)
    pa = ptr32(arena)
    pb = ptr32(bases)
    j = 0
    if j0 == 0:
        k = 0
        while k < nblk:
            w = int(pb[k]) >> 2
            r = 0
            while r < t and j < nslot:
                pp[j] = pa[w + 2 * r]
                j += 1
                r += 1
            k += 1
    n = 0
    if j1 == nslot:  # the last part counts the filled slots (the others return 0)
        j = 0
        while j < nslot:
            if int(pp[j]) != 0:
                n += 1
            j += 1
    j = j0
    while j < j1:
        pj = int(pp[j])
        if pj != 0:
            c = 0
            i = 0
            while i < nslot:
                pi = int(pp[i])
                if pi != 0 and pi < pj:
                    c += 1
                i += 1
            pr[j] = c
        j += 1
    return n


# twin of ranks_v
def ranks_py(ranks, pos, arena, bases, nblk, t, nslot, j0, j1):
    if j0 == 0:
        j = 0
        for k in range(nblk):
            for r in range(t):
                if j < nslot:
                    o = bases[k] + 8 * r
                    pos[j] = int.from_bytes(bytes(arena[o:o + 4]), "little")
                    j += 1
    hdr = [pos[j] & 0xFFFFFFFF for j in range(nslot)]
    for j in range(j0, j1):
        if hdr[j]:
            ranks[j] = sum(1 for p in hdr if p and p < hdr[j])
    return sum(1 for p in hdr if p) if j1 == nslot else 0


@micropython.viper
def attend_v(out, q, arena, bases, prm, sc, hacc, e2t, hexp, ranks, cs) -> int:
    # attention of every query head (q: q14 rows, exponent prm[P_EQ], 1/sqrt(hd) folded
    # in) over the int8 K/V rows of layer prm[P_LAYER] in the filled slots of the blocks
    # at byte offsets bases: scores Q12 (in sc), softmax by the exp2 table (probabilities
    # Q15, added to hacc[slot] when prm[P_H2O]), V summed with the probability times its
    # scale; out (n_heads * hd int32, |out| < 2**22) with the exponent returned.
    # prm[P_ROT]: keys are pre-RoPE, turned by cs row ranks[slot] first. prm[P_H0],
    # prm[P_H1] (P_H1 0: every head): only those heads, so a sliced step attends in units of
    # heads; out's other rows are left as they are and the exponent (0 until then) is
    # returned by the call whose heads end at n_heads, which rescales every head's row to
    # it. prm[P_PASS] 1, 2, 3 (a sliced step, slicer.Slicer.att_range): one pass of head P_H0
    # over blocks P_K0 .. P_K1 - 1, the head's state kept in prm between the calls (the
    # passes in order, each over the ranges in order: the same sums as one call); the call
    # ending pass 3 of the last head returns the exponent. O(slots * dim), no allocation
    pp = ptr32(prm)
    tpb = int(pp[0])
    loff = int(pp[1])
    lrow = int(pp[2])
    voff = int(pp[3])
    ksoff = int(pp[4])
    vsoff = int(pp[5])
    nh = int(pp[6])
    rep = int(pp[7])
    hd = int(pp[8])
    eq = int(pp[9])
    nslot = int(pp[10])
    nblk = int(pp[11])
    h2o = int(pp[12])
    rot = int(pp[13])
    ksh = int(pp[14])
    rlen = int(pp[15])
    h = int(pp[16])
    h1 = int(pp[17])
    pas = int(pp[18])
    kb0 = 0
    kb1 = nblk
    if pas:
        kb0 = int(pp[19])
        kb1 = int(pp[20])
        if kb1 > nblk:
            kb1 = nblk
    if h1 <= 0 or h1 > nh:
        h1 = nh
    pa8 = ptr8(arena)
    pa = ptr32(arena)
    pb = ptr32(bases)
    pq = ptr32(q)
    po = ptr32(out)
    ps = ptr32(sc)
    ph = ptr32(hacc)
    pe = ptr32(e2t)
    px = ptr32(hexp)
    pr = ptr32(ranks)
    pc = ptr16(cs)
    one = 1
    m31 = one << 31
    msk = (m31 << 1) - 1
    kadj = 0
    if rot:
        kadj = 14 - ksh
    while h < h1:
        kvh = h // rep
        qo = h * hd
        kcol = kvh * hd
        smax = 0 - 0x3FFFFFFF
        evmax = 0
        tot = 0
        if pas and kb0 > 0:  # a later range of a pass: the head's state so far
            smax = (int(pp[21]) ^ m31) - m31
            evmax = int(pp[22])
            tot = int(pp[23])
        elif pas > 1:  # the first range of pass 2 or 3: pass 1's result
            smax = (int(pp[21]) ^ m31) - m31
            evmax = int(pp[22])
            if pas == 3:
                tot = int(pp[23])
        # pass 1: scores, their maximum, the largest V scale exponent
        j = kb0 * tpb
        k = kb0
        while k < kb1 and (pas == 0 or pas == 1):
            bb = int(pb[k])
            r = 0
            while r < tpb and j < nslot:
                if int(pa[(bb >> 2) + 2 * r]) != 0:
                    ro = bb + loff + r * lrow
                    kp = ro + kcol
                    dot = 0
                    if rot:
                        rk = int(pr[j])
                        if rk >= rlen:
                            rk = rlen - 1
                        cb = rk * hd
                        d = 0
                        while d < hd:
                            c = (int(pc[cb + d]) ^ 0x8000) - 0x8000
                            s = (int(pc[cb + d + 1]) ^ 0x8000) - 0x8000
                            k0 = (int(pa8[kp + d]) ^ 128) - 128
                            k1 = (int(pa8[kp + d + 1]) ^ 128) - 128
                            dot += ((k0 * c - k1 * s) >> ksh) * int(pq[qo + d])
                            dot += ((k0 * s + k1 * c) >> ksh) * int(pq[qo + d + 1])
                            d += 2
                    else:
                        d = 0
                        while d < hd:
                            dot += ((int(pa8[kp + d]) ^ 128) - 128) * int(pq[qo + d])
                            d += 1
                    dot = ((dot & msk) ^ m31) - m31
                    kb = int(pa[((ro + ksoff) >> 2) + kvh])
                    e = (kb >> 23) & 0xFF
                    sco = 0
                    if e:
                        m = ((kb & 0x7FFFFF) | 0x800000) >> 9
                        sh = 141 + eq - 12 - e + kadj
                        ah = dot >> 16
                        al = dot & 0xFFFF
                        if sh >= 16:
                            t = sh - 16
                            if t > 31:
                                t = 31
                            sco = (ah * m + ((al * m) >> 16)) >> t
                        elif sh >= 0:
                            sco = ((ah * m) << (16 - sh)) + ((al * m) >> sh)
                        else:
                            sco = ((ah * m) << (16 - sh)) + ((al * m) << (0 - sh))
                    ps[j] = sco
                    if sco > smax:
                        smax = sco
                    ev = (int(pa[((ro + vsoff) >> 2) + kvh]) >> 23) & 0xFF
                    if ev > evmax:
                        evmax = ev
                j += 1
                r += 1
            k += 1
        if pas == 1:
            pp[21] = smax
            pp[22] = evmax
            return 0
        # pass 2: exp(score - max) by the exp2 table, Q15; their sum
        j = kb0 * tpb
        k = kb0
        while k < kb1 and pas != 3:
            bb = int(pb[k])
            r = 0
            while r < tpb and j < nslot:
                if int(pa[(bb >> 2) + 2 * r]) != 0:
                    t = ((int(ps[j]) ^ m31) - m31) - smax
                    ex = 0
                    if t > -163840:
                        y = (((t >> 16) * 23637) << 2) + (((t & 0xFFFF) * 23637) >> 14)
                        f = y & 4095
                        i = f >> 6
                        e0 = int(pe[i])
                        v = e0 + (((int(pe[i + 1]) - e0) * (f & 63)) >> 6)
                        sft = 0 - (y >> 12)
                        if sft < 31:
                            ex = v >> sft
                    ps[j] = ex
                    tot += ex
                j += 1
                r += 1
            k += 1
        if pas == 2:
            pp[23] = tot
            return 0
        # pass 3: probabilities, V weighted by probability x scale
        inv = 0
        if tot > 0:
            inv = (one << 30) // tot
        d = 0
        while d < hd and kb0 == 0:
            po[qo + d] = 0
            d += 1
        j = kb0 * tpb
        k = kb0
        while k < kb1:
            bb = int(pb[k])
            r = 0
            while r < tpb and j < nslot:
                if int(pa[(bb >> 2) + 2 * r]) != 0:
                    p = (int(ps[j]) * inv) >> 15
                    if h2o:
                        ph[j] = int(ph[j]) + p
                    ro = bb + loff + r * lrow
                    vb = int(pa[((ro + vsoff) >> 2) + kvh])
                    ev = (vb >> 23) & 0xFF
                    if ev and p:
                        sft = 15 + evmax - ev
                        if sft > 31:
                            sft = 31
                        w = (p * (((vb & 0x7FFFFF) | 0x800000) >> 9)) >> sft
                        vp = ro + voff + kcol
                        d = 0
                        while d < hd:
                            po[qo + d] = int(po[qo + d]) + w * ((int(pa8[vp + d]) ^ 128) - 128)
                            d += 1
                j += 1
                r += 1
            k += 1
        if kb1 < nblk:
            return 0  # pass 3 over a range of the blocks, more to come
        px[h] = evmax
        h += 1
    if h1 < nh:
        return 0  # heads h0..h1 - 1 of a sliced step: the exponent comes with the last heads
    # one exponent for all heads: the largest V scale's
    emax = 0
    h = 0
    while h < nh:
        if int(px[h]) > emax:
            emax = int(px[h])
        h += 1
    h = 0
    while h < nh:
        sft = emax - int(px[h])
        if sft > 0:
            if sft > 31:
                sft = 31
            half = one << (sft - 1)
            d = h * hd
            while d < h * hd + hd:
                po[d] = (((int(po[d]) ^ m31) - m31) + half) >> sft
                d += 1
        h += 1
    return 141 - emax


# fp32 bits of the little-endian word at byte o of buf (twin helper); O(1)
def _word(buf, o):
    return buf[o] | buf[o + 1] << 8 | buf[o + 2] << 16 | buf[o + 3] << 24


# twin of attend_v; each dot and sum of exp weights through reg (i32 as the 32-bit word,
# wide: exact); O(slots * dim)
def attend_py(out, q, arena, bases, prm, sc, hacc, e2t, hexp, ranks, cs, reg=i32):
    tpb, loff, lrow, voff, ksoff, vsoff, nh, rep, hd, eq, nslot, nblk, h2o, rot, ksh, rlen, h0, h1 = prm[:P_PASS]
    pas = prm[P_PASS]
    kb0, kb1 = (prm[P_K0], min(prm[P_K1], nblk)) if pas else (0, nblk)
    if h1 <= 0 or h1 > nh:
        h1 = nh
    kadj = 14 - ksh if rot else 0
    slots = []  # (j, row byte offset) of the filled slots
    j = kb0 * tpb
    for k in range(kb0, kb1):
        for r in range(tpb):
            if j < nslot:
                if _word(arena, bases[k] + 8 * r):
                    slots.append((j, bases[k] + loff + r * lrow))
                j += 1
    s8 = _s8
    for h in range(h0, h1):
        kvh = h // rep
        qo = h * hd
        kcol = kvh * hd
        smax, evmax, tot = -SAT, 0, 0
        if pas and (kb0 > 0 or pas > 1):  # the head's state from its earlier ranges or passes
            smax, evmax, tot = prm[P_SMAX], prm[P_EVMAX], prm[P_TOT] if (kb0 > 0 or pas == 3) else 0
        for j, ro in (slots if pas in (0, 1) else ()):
            kp = ro + kcol
            dot = 0
            if rot:
                cb = min(ranks[j], rlen - 1) * hd
                for d in range(0, hd, 2):
                    c, s = cs[cb + d], cs[cb + d + 1]
                    k0, k1 = s8(arena[kp + d]), s8(arena[kp + d + 1])
                    dot += ((k0 * c - k1 * s) >> ksh) * q[qo + d] + ((k0 * s + k1 * c) >> ksh) * q[qo + d + 1]
            else:
                for d in range(hd):
                    dot += s8(arena[kp + d]) * q[qo + d]
            dot = reg(dot)
            kb = _word(arena, ro + ksoff + 4 * kvh)
            e = (kb >> 23) & 0xFF
            sco = 0
            if e:
                m = ((kb & 0x7FFFFF) | 0x800000) >> 9
                sh = 141 + eq - 12 - e + kadj
                sco = (dot * m) >> sh if sh >= 0 else (dot * m) << -sh
            sc[j] = sco
            smax = max(smax, sco)
            evmax = max(evmax, (_word(arena, ro + vsoff + 4 * kvh) >> 23) & 0xFF)
        if pas == 1:
            prm[P_SMAX], prm[P_EVMAX] = smax, evmax
            return 0
        for j, _ro in (slots if pas in (0, 2) else ()):
            t = sc[j] - smax
            ex = 0
            if t > -163840:
                y = (t * LOG2E_Q14) >> 14
                f = y & 4095
                i = f >> 6
                v = e2t[i] + (((e2t[i + 1] - e2t[i]) * (f & 63)) >> 6)
                if -(y >> 12) < 31:
                    ex = v >> -(y >> 12)
            sc[j] = ex
            tot += ex
        tot = reg(tot)
        if pas == 2:
            prm[P_TOT] = tot
            return 0
        inv = (1 << 30) // tot if tot > 0 else 0
        for d in range(hd if kb0 == 0 else 0):
            out[qo + d] = 0
        for j, ro in slots:
            p = (sc[j] * inv) >> 15
            if h2o:
                hacc[j] += p
            vb = _word(arena, ro + vsoff + 4 * kvh)
            ev = (vb >> 23) & 0xFF
            if ev and p:
                w = (p * (((vb & 0x7FFFFF) | 0x800000) >> 9)) >> min(15 + evmax - ev, 31)
                for d in range(hd):
                    out[qo + d] += w * s8(arena[ro + voff + kcol + d])
        if kb1 < nblk:
            return 0  # pass 3 over a range of the blocks, more to come
        hexp[h] = evmax
    if h1 < nh:
        return 0  # a sliced step's heads h0..h1 - 1: the exponent comes with the last ones
    emax = max(hexp[h] for h in range(nh))
    for h in range(nh):
        sft = min(emax - hexp[h], 31)
        if sft > 0:
            for d in range(h * hd, h * hd + hd):
                out[d] = (out[d] + (1 << (sft - 1))) >> sft
    return 141 - emax


# an unsigned byte as int8; O(1)
def _s8(b):
    return b - 256 if b > 127 else b


# the public names: viper on MicroPython, the plain twins elsewhere (CPython)
if compat.IS_MICROPYTHON:
    matvec, quant, rmsnorm, add, rescale, embed = matvec_v, quant_v, rmsnorm_v, add_v, rescale_v, embed_v
    rope_row, rope, pack, silu, ranks, attend = rope_row_v, rope_v, pack_v, silu_v, ranks_v, attend_v
else:
    matvec, quant, rmsnorm, add, rescale, embed = matvec_py, quant_py, rmsnorm_py, add_py, rescale_py, embed_py
    rope_row, rope, pack, silu, ranks, attend = rope_row_py, rope_py, pack_py, silu_py, ranks_py, attend_py


@micropython.viper
def argmax_v(v, n: int) -> int:
    # index of the largest of n int32 values (the first of equals); O(n), no allocation
    p = ptr32(v)
    one = 1
    m31 = one << 31
    best = 0
    bv = (int(p[0]) ^ m31) - m31
    i = 1
    while i < n:
        x = (int(p[i]) ^ m31) - m31
        if x > bv:
            bv = x
            best = i
        i += 1
    return best


# twin of argmax_v; O(n)
def argmax_py(v, n):
    best = 0
    for i in range(1, n):
        if v[i] > v[best]:
            best = i
    return best


argmax = argmax_v if compat.IS_MICROPYTHON else argmax_py
