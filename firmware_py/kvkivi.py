# KIVI int4 keys for the KV cache (kv.py, dtype "int4"): the fold that quantizes a
# block's keys per channel, and the dequantization a read() returns. Integer-only viper
# (no float is ever made: fp32 keys are read and written as 16-bit halves, so nothing
# here depends on the word size or allocates), exactly specified so that a reference
# (tests/firmware/kvref.py) reproduces every bit. docs/memory.md has the layout.
#
# Per (block, layer, channel) one uint32 parameter word (kvlayout.KP_*):
#   bits 0-7 E + 136, bits 8-19 LO + 2048, bits 20-28 STEP; key = (LO + q * STEP) * 2**E
# with q the slot's unsigned nibble (0..15). The fold of one channel over the block's
# live slots (header != 0), residual ones from their fp32 K, the others from their
# current (LO + q * STEP) * 2**E:
#   1. each value's top: the least t with |v| < 2**t (fp32 with exponent field e: e - 126;
#      e == 0 (zero, subnormal) is 0; e == 255 is read as 254; old: E + bitlen(|N|))
#   2. E = max top - 11, at least -136 (no nonzero value: E = -136, LO = STEP = 0, q = 0)
#   3. X = |v| / 2**E rounded half away from zero, signed, then min(X, 2047)
#   4. LO = min X, STEP = ceil((max X - LO) / 15), q = (2 (X - LO) + STEP) // (2 STEP) (0 when STEP is 0)
# Dequantized to fp32 (read): N = LO + q * STEP has at most 13 bits, so N * 2**E is exact
# unless it is below 2**-126 (then +0) or above the largest fp32 (then that, signed).
from firmware_py.compat import const, micropython, ptr8, ptr16, ptr32

# kc, the cache's array('i') of KIVI shape words (then KC_N - _KC_X words of scratch)
KC_T = const(0)  # T, tokens per block
KC_L = const(1)  # L, layers
KC_KD = const(2)  # kv_dim, channels per layer
KC_BW = const(3)  # words per block
KC_RW = const(4)  # first stored row's word in a block (after headers and K parameters)
KC_SRW = const(5)  # words per stored (layer, slot) row
KC_KQ = const(6)  # byte offset of the K nibbles in a stored row
KC_VW = const(7)  # words of a row's V part (V data, pad, V scales)
_KC_X = const(8)  # fold scratch: X + 4096 per slot
_NOTOP = const(-1000)


# the kc array for a kvlayout.Layout (int4); boot only
def shape(layout, new_array):
    t = layout.tokens_per_block
    kc = new_array("i", _KC_X + t)
    for k in range(len(kc)):
        kc[k] = 0
    kc[KC_T] = t
    kc[KC_L] = layout.n_layers
    kc[KC_KD] = layout.kv_dim
    kc[KC_BW] = layout.block_bytes // 4
    kc[KC_RW] = layout.rows_off // 4
    kc[KC_SRW] = layout.store_row // 4
    kc[KC_KQ] = layout.kq_off
    kc[KC_VW] = layout.v_words
    return kc


# quantize the keys of block b (sequence slot i's residual and flags) per channel, as
# specified above, and clear i's flags; O(L x kv_dim x T), no allocation
@micropython.viper
def fold(arena, res, flags, kc, b: int, i: int):
    a = ptr32(arena)
    a8 = ptr8(arena)
    r16 = ptr16(res)
    fl = ptr8(flags)
    k = ptr32(kc)
    t = int(k[KC_T])
    nl = int(k[KC_L])
    kd = int(k[KC_KD])
    hb = b * int(k[KC_BW])  # the block's header words
    rw = hb + int(k[KC_RW])  # its first stored row
    srw = int(k[KC_SRW])
    kq = int(k[KC_KQ])
    rbase = i * nl * t * kd  # sequence i's residual words
    fb = i * t  # its flags
    ly = 0
    while ly < nl:
        c = 0
        while c < kd:
            pw = hb + 2 * t + ly * kd + c
            old = int(a[pw])
            eo = (old & 255) - 136
            lo_o = ((old >> 8) & 4095) - 2048
            st_o = (old >> 20) & 511
            cb = c >> 1  # the channel's byte in a row's K nibbles
            cs = (c & 1) << 2  # and its shift
            top = _NOTOP
            r = 0
            while r < t:  # 1: the largest top
                if int(a[hb + 2 * r]) != 0:
                    if int(fl[fb + r]) != 0:
                        e = (int(r16[2 * (rbase + (ly * t + r) * kd + c) + 1]) >> 7) & 255
                        if e != 0:
                            if e == 255:
                                e = 254
                            if e - 126 > top:
                                top = e - 126
                    else:
                        q = (int(a8[(rw + (ly * t + r) * srw) * 4 + kq + cb]) >> cs) & 15
                        n = lo_o + q * st_o
                        if n < 0:
                            n = 0 - n
                        tp = eo
                        while n != 0:
                            tp += 1
                            n = n >> 1
                        if tp != eo and tp > top:
                            top = tp
                r += 1
            en = -136
            lo = 0
            step = 0
            if top != _NOTOP:
                en = top - 11
                if en < -136:
                    en = -136
                lo = 4096
                hi = -4096
                r = 0
                while r < t:  # 2: X of every live slot, its min and max
                    if int(a[hb + 2 * r]) != 0:
                        x = 0
                        if int(fl[fb + r]) != 0:
                            w = 2 * (rbase + (ly * t + r) * kd + c)
                            h16 = int(r16[w + 1])
                            e = (h16 >> 7) & 255
                            if e != 0:
                                if e == 255:
                                    e = 254
                                kk = en - e + 150  # >= 13
                                if kk <= 25:
                                    m = ((h16 & 127) << 16) | int(r16[w]) | 0x800000
                                    x = (m + (1 << (kk - 1))) >> kk
                                    if h16 >> 15:
                                        x = 0 - x
                        else:
                            q = (int(a8[(rw + (ly * t + r) * srw) * 4 + kq + cb]) >> cs) & 15
                            n = lo_o + q * st_o
                            neg = 0
                            if n < 0:
                                n = 0 - n
                                neg = 1
                            d = eo - en
                            if d >= 0:
                                x = n << d
                            elif d >= -14:
                                x = (n + (1 << (0 - d - 1))) >> (0 - d)
                            if neg:
                                x = 0 - x
                        if x > 2047:
                            x = 2047
                        k[_KC_X + r] = x + 4096
                        if x < lo:
                            lo = x
                        if x > hi:
                            hi = x
                    r += 1
                step = (hi - lo + 14) // 15
            r = 0
            while r < t:  # 3: every live slot's nibble
                if int(a[hb + 2 * r]) != 0:
                    q = 0
                    if step != 0:
                        q = (2 * (int(k[_KC_X + r]) - 4096 - lo) + step) // (2 * step)
                    qb = (rw + (ly * t + r) * srw) * 4 + kq + cb
                    if cs:
                        a8[qb] = (int(a8[qb]) & 15) | (q << 4)
                    else:
                        a8[qb] = (int(a8[qb]) & 0xF0) | q
                r += 1
            a[pw] = (en + 136) | ((lo + 2048) << 8) | (step << 20)
            c += 1
        ly += 1
    r = 0
    while r < t:
        fl[fb + r] = 0
        r += 1


# the fp32 bit patterns of slot r's dequantized keys of layer ly in block b into dst
# from word dw (kv_dim words); O(kv_dim), no allocation
@micropython.viper
def dequant(arena, kc, dst, b: int, r: int, ly: int, dw: int):
    a = ptr32(arena)
    a8 = ptr8(arena)
    d16 = ptr16(dst)
    k = ptr32(kc)
    t = int(k[KC_T])
    kd = int(k[KC_KD])
    hb = b * int(k[KC_BW])
    pw = hb + 2 * t + ly * kd
    qb = (hb + int(k[KC_RW]) + (ly * t + r) * int(k[KC_SRW])) * 4 + int(k[KC_KQ])
    c = 0
    while c < kd:
        w = int(a[pw + c])
        q = (int(a8[qb + (c >> 1)]) >> ((c & 1) << 2)) & 15
        n = ((w >> 8) & 4095) - 2048 + q * ((w >> 20) & 511)
        o = 2 * (dw + c)
        lo16 = 0
        hi16 = 0
        if n != 0:
            s = 0
            if n < 0:
                s = 1
                n = 0 - n
            bl = 0
            x = n
            while x != 0:
                bl += 1
                x = x >> 1
            m = n << (24 - bl)  # the 24-bit significand, bit 23 set
            be = (w & 255) - 136 + bl - 1 + 127  # biased exponent of n * 2**E
            if be > 0:
                if be > 254:
                    be = 254
                    m = 0xFFFFFF
                lo16 = m & 0xFFFF
                hi16 = (s << 15) | (be << 7) | ((m >> 16) & 127)
        d16[o] = lo16
        d16[o + 1] = hi16
        c += 1


# slot r (block b, sequence slot i) takes a token: every layer's K words of src (the
# caller's rows, from word 0, layer_row words apart) go to i's residual, its V words to
# the stored row, its K nibbles are zeroed; zero != 0 (reserve): all of it zeroed.
# O(row), no allocation
@micropython.viper
def put(arena, res, kc, src, b: int, i: int, r: int, lrw: int, zero: int):
    a = ptr32(arena)
    rs = ptr32(res)
    s = ptr32(src)
    k = ptr32(kc)
    t = int(k[KC_T])
    nl = int(k[KC_L])
    kd = int(k[KC_KD])
    srw = int(k[KC_SRW])
    vw = int(k[KC_VW])
    row = b * int(k[KC_BW]) + int(k[KC_RW]) + r * srw  # layer 0's stored row
    rr = (i * nl * t + r) * kd  # layer 0's residual row
    sw = 0
    ly = 0
    while ly < nl:
        j = 0
        if zero:
            while j < kd:
                rs[rr + j] = 0
                j += 1
            j = 0
            while j < srw:
                a[row + j] = 0
                j += 1
        else:
            while j < kd:
                rs[rr + j] = s[sw + j]
                j += 1
            j = 0
            while j < vw:
                a[row + j] = s[sw + kd + j]
                j += 1
            while j < srw:
                a[row + j] = 0
                j += 1
        row += t * srw
        rr += t * kd
        sw += lrw
        ly += 1
