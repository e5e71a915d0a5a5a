# The float kernels of the forward pass behind one interface, two backends:
#   Plain  pure Python over array('f') (both interpreters; on MicroPython every float
#          is boxed, so it allocates: the fp32 reference on the board, not the fast path)
#   Numpy  numpy float32 arrays over the same weights and the same KV arena (CPython)
# Both read the weights where llama2c.load put them (fp32 or int8 with group scales,
# dequantized on the fly: never expanded) and the K/V rows where kv.KVCache keeps
# them (fp32, int8, int4tok; int4 (KIVI): keys in fp32 from the cache's residual or
# dequantized per channel, values per token), and both compute exactly run.c's transformer.
# The integer path (int8 weights, fixed point, viper) is firmware_py/qmodel.py.
#
# Interface (model.py calls only these; `v` is a run-state vector from vec()):
#   vec(n)                         zeroed vector of n floats (boot only)
#   embed(x, token)                x = token_embedding[token]
#   matvec(out, m, x)              out[r] = sum_c W[r, c] x[c] (llama2c.Matrix m)
#   rmsnorm(out, x, off)           out = x / rms(x) * f32[off ..]  (eps 1e-5)
#   silu_mul(a, b)                 a = silu(a) * b
#   add(x, y)                      x += y
#   rope_at(pos)                   cos/sin of position pos for the next rope() calls
#   rope(v, heads)                 rotate each head's pairs (2i, 2i+1) of v
#   store(h, layer, k, v)          pack K and V into one layer row, cache.write it
#   begin(h, n)                    per token: where the n cached slots of h live
#   attention(out, q, h, layer)    out = softmax(q K^T / sqrt(D)) V over the slots, GQA
#   matvec_rows(out, m, x, r0, r1) rows r0..r1-1 of matvec (a sliced step's unit)
#   att_scores(q, layer, s0, s1, g0, g1), att_softmax(), att_values(out, layer, s0, s1, g0, g1)
#                                  attention in parts over slot ranges, or K/V heads g0..g1-1
#                                  of one slot (a sliced step's units)
#   embed_part, begin_part, store_scaled/store_group/store_part/store_end, the *_part
#                                  elementwise ops: the rest of a sliced step's units
#   end(h)                         feed this token's attention to h2o (cache.add_score)
#   logits_of(logits, x)           logits = wcls x
# rope_mode "cache" (StreamingLLM): keys are stored before RoPE and each is rotated at
# attention time by its rank among the cached positions (slot order by position); the
# query by the newest rank. "absolute": keys stored rotated at their own position.
import math
import struct

from firmware_py import quant
from firmware_py.compat import const, new_array
from firmware_py.kv import HDR_BYTES
from firmware_py.pool import copy32

SCORE_ONE = const(4096)  # h2o: a token's score grows by 4096 x (sum over layers of its mean attention over heads)
_EPS = 1e-5  # rmsnorm epsilon (run.c)
_F32_MAX = 3.4028234663852886e38  # the largest fp32 (int4 keys are clamped to it, as kvkivi.dequant)


# inverse frequencies of RoPE's head_dim / 2 pairs: 10000^(-2i / head_dim); boot only
# the merge passes that sort n slots (ceil(log2 n))
def _passes(n):
    p = 0
    while (1 << p) < n:
        p += 1
    return p


# the range of begin_part's part p for n cached slots (head_dim D): slots, merge moves, pairs
def begin_len(n, head_dim, p):
    if p == 2:
        return n * _passes(n)
    return n * (head_dim >> 1) if p == 3 else n


def inv_freqs(head_dim):
    return [math.pow(10000.0, -2.0 * i / head_dim) for i in range(head_dim // 2)]


# array of n zeros of typecode tc in one allocation (no temporary list); boot only
def _half(b):
    # the float of IEEE half bits b (0..65535; a KV fp16 element, as quant packs "<e")
    e = (b >> 10) & 31
    m = b & 1023
    if e == 31:
        x = math.inf if not m else math.nan
    elif e:
        x = math.ldexp(m + 1024, e - 25)
    else:
        x = math.ldexp(m, -24)
    return -x if b & 0x8000 else x


def _zeros(tc, n):
    a = new_array(tc, n)
    for i in range(n):
        a[i] = 0
    return a


class Plain:
    # pure-Python kernels over array('f'); every call allocates floats on MicroPython
    def __init__(self, weights, cache, rope_mode):
        cfg = weights.cfg
        lay = cache.layout
        self.w = weights  # llama2c.Weights (read-only)
        self.f32 = weights.f32  # array('f'): norms, fp32 matrices, int8 scales
        self.q8 = weights.q8  # array('b'): int8 matrix values, or None
        self.cache = cache  # kv.KVCache holding this model's K/V
        self.lay = lay  # kv.Layout of the rows
        self.dim = cfg.dim  # model width
        self.n_heads = cfg.n_heads  # query heads
        self.n_kv = cfg.n_kv_heads  # K/V heads
        self.hd = cfg.head_dim  # D
        self.kv_dim = cfg.kv_dim  # H x D
        self.rep = cfg.n_heads // cfg.n_kv_heads  # query heads per K/V head (GQA)
        self.inv_freq = inv_freqs(cfg.head_dim)  # D/2 floats
        self.rope_cache = rope_mode == "cache"  # keys pre-RoPE, rotated by cache rank
        self.h2o = cache.map_size > 0  # a cache booted for h2o: feed the scores
        self.t = lay.tokens_per_block  # T
        self.lr = lay.layer_row  # bytes per (layer, token) row
        self.cs = _zeros("f", (cfg.head_dim // 2))  # cos at the current position (D/2)
        self.sn = _zeros("f", (cfg.head_dim // 2))  # sin at the current position (D/2)
        self.row = bytearray(lay.layer_row)  # one packed layer row (K, V[, scales]) for cache.write
        self.rowf = _zeros("f", (lay.layer_row // 4))  # a cached row read back as floats
        self.rowb = bytearray(lay.layer_row)  # the same row as bytes (int8/int4 data)
        self.kf = _zeros("f", cfg.kv_dim)  # a cached key, dequantized (kv_dim)
        ms = cache.max_slots
        self.off0 = _zeros("i", ms)  # [slot] arena byte offset of its layer-0 row
        self.step = lay.tokens_per_block * lay.layer_row  # bytes from layer l's row to layer l+1's
        self.ms = ms  # slots per head row of att
        self.att = _zeros("f", (cfg.n_heads * ms))  # [head][slot] attention (n_heads x max_slots)
        h2 = cfg.head_dim // 2
        self.kcos = _zeros("f", (ms * h2 if self.rope_cache else 0))  # [slot][D/2] cos of its rank (rope "cache")
        self.ksin = _zeros("f", (ms * h2 if self.rope_cache else 0))  # [slot][D/2] sin of its rank
        self.acc = _zeros("f", ms)  # [slot] this token's summed mean attention (h2o)
        self.smax = _zeros("d", cfg.n_heads)  # [head] the softmax's running max (att_softmax_part)
        self.ssum = _zeros("d", cfg.n_heads)  # [head] its running sum ('d': the float att_softmax keeps)
        self.n = 0  # cached slots of the current token
        self.spos = _zeros("i", (ms if self.rope_cache else 0))  # [slot] its position (rope "cache"; begin_part)
        self.rslot = _zeros("i", (ms if self.rope_cache else 0))  # [rank] the slot that holds it
        self.rtmp = _zeros("i", (ms if self.rope_cache else 0))  # the merge sort's other buffer
        self.mi = 0  # the merge's two run heads between parts (begin_part p 2)
        self.mj = 0
        self.h = -1  # the sequence of the current token (int4: rows are read through the cache)
        self.mv_s = 0.0  # a part's running sum (matvec_cols' row, rmsnorm_part's squares)
        self.mv_a = 0.0  # matvec_cols' group sum; rmsnorm_part's scale
        self.st_a = 0.0  # store_part: the group's max |x| so far
        self.st_sc = 0.0  # ... and its stored scale

    # zeroed array('f') of n floats; boot only
    def vec(self, n):
        return _zeros("f", n)

    # x = embedding row of token (dequantized for int8); O(dim)
    def embed(self, x, token):
        self.embed_part(x, token, 0, self.dim)

    # ... its elements i0 .. i1 - 1 (a sliced step's unit)
    def embed_part(self, x, token, i0, i1):
        m = self.w.token_embedding
        d = self.dim
        o = m.off + token * d
        if not m.group:
            f = self.f32
            for i in range(i0, i1):
                x[i] = f[o + i]
            return
        q = self.q8
        f = self.f32
        g = m.group
        s = m.soff + token * d // g
        for i in range(i0, i1):
            x[i] = q[o + i] * f[s + i // g]

    # out = W x for Matrix m (fp32, or int8 values times their group scale); O(rows x cols)
    def matvec(self, out, m, x):
        Plain.matvec_rows(self, out, m, x, 0, m.rows)  # by the class: a probe times it on a stand-in self (tools/probe.py)

    # rows r0 .. r1 - 1 of out = W x: the unit a sliced forward step runs between two
    # looks at its slice (slicer.Slicer); the same sums as matvec. O((r1 - r0) x cols)
    def matvec_rows(self, out, m, x, r0, r1):
        cols = m.cols
        f = self.f32
        i = m.off + r0 * cols
        if not m.group:
            for r in range(r0, r1):
                s = 0.0
                for c in range(cols):
                    s += f[i + c] * x[c]
                out[r] = s
                i += cols
            return
        q = self.q8
        g = m.group
        si = m.soff + r0 * (cols // g)
        for r in range(r0, r1):
            s = 0.0
            c = 0
            while c < cols:
                a = 0.0
                for j in range(c, c + g):
                    a += q[i + j] * x[j]
                s += a * f[si]
                si += 1
                c += g
            out[r] = s
            i += cols

    # columns c0 .. c1 - 1 of row r of out = W x: a sliced step's unit where one row is more
    # than a unit's work (the bytecode float path: a row of 172 MACs is ~2.4 ms on the
    # board). The row's sums run on across parts in self.mv_s / self.mv_a (the group's
    # partial sum) in matvec_rows' order, so the floats are the whole row's; out[r] is
    # written at c1 == cols. The parts of a row are called in order from c0 == 0. O(c1 - c0)
    def matvec_cols(self, out, m, x, r, c0, c1):
        cols = m.cols
        f = self.f32
        i = m.off + r * cols
        s = 0.0 if c0 == 0 else self.mv_s
        if not m.group:
            for c in range(c0, c1):
                s += f[i + c] * x[c]
        else:
            q = self.q8
            g = m.group
            a = self.mv_a if c0 % g else 0.0
            si = m.soff + r * (cols // g) + c0 // g
            c = c0
            while c < c1:
                ge = c - c % g + g  # the end of c's group
                e = ge if ge < c1 else c1
                for j in range(c, e):
                    a += q[i + j] * x[j]
                if e == ge:
                    s += a * f[si]
                    si += 1
                    a = 0.0
                c = e
            self.mv_a = a
        self.mv_s = s
        if c1 == cols:
            out[r] = s

    # rmsnorm in parts (a sliced step's units, the same floats as rmsnorm): p 0 sums the
    # squares of x[i0 .. i1 - 1] (from i0 == 0, in order), p 1 writes out[i0 .. i1 - 1]; O(i1 - i0)
    def rmsnorm_part(self, out, x, off, p, i0, i1):
        if p == 0:
            ss = 0.0 if i0 == 0 else self.mv_s
            for i in range(i0, i1):
                ss += x[i] * x[i]
            self.mv_s = ss
            if i1 == len(x):
                self.mv_a = 1.0 / math.sqrt(ss / len(x) + _EPS)
            return
        sc = self.mv_a
        f = self.f32
        for i in range(i0, i1):
            out[i] = f[off + i] * (sc * x[i])

    # silu_mul and add over elements i0 .. i1 - 1 (a sliced step's units); O(i1 - i0)
    def silu_mul_part(self, a, b, i0, i1):
        for i in range(i0, i1):
            z = a[i]
            a[i] = z / (1.0 + math.exp(-z)) * b[i]

    def add_part(self, x, y, i0, i1):
        for i in range(i0, i1):
            x[i] += y[i]

    # rope over pairs p0 .. p1 - 1 of v's heads (pair p: head p // (D/2), index p % (D/2));
    # a sliced step's units, the same floats as rope(); O(p1 - p0)
    def rope_part(self, v, p0, p1):
        cs = self.cs
        sn = self.sn
        h2 = self.hd >> 1
        for p in range(p0, p1):
            i = p % h2
            b = 2 * p  # (p // h2) * hd + 2 * i
            a = v[b]
            c = v[b + 1]
            v[b] = a * cs[i] - c * sn[i]
            v[b + 1] = a * sn[i] + c * cs[i]

    # out = x / sqrt(mean(x^2) + eps) * f32[off ..]; O(dim)
    def rmsnorm(self, out, x, off):
        n = len(x)
        ss = 0.0
        for i in range(n):
            ss += x[i] * x[i]
        sc = 1.0 / math.sqrt(ss / n + _EPS)
        f = self.f32
        for i in range(n):
            out[i] = f[off + i] * (sc * x[i])

    # a = silu(a) * b elementwise (silu(z) = z / (1 + e^-z)); O(n)
    def silu_mul(self, a, b):
        for i in range(len(a)):
            z = a[i]
            a[i] = z / (1.0 + math.exp(-z)) * b[i]

    # x += y; O(n)
    def add(self, x, y):
        for i in range(len(x)):
            x[i] += y[i]

    # cos/sin of position pos for each pair, for the next rope() calls; O(D)
    def rope_at(self, pos):
        for i in range(len(self.cs)):
            a = pos * self.inv_freq[i]
            self.cs[i] = math.cos(a)
            self.sn[i] = math.sin(a)

    # rotate the pairs (2i, 2i+1) of each of `heads` heads of v by rope_at's angles; O(heads x D)
    def rope(self, v, heads):
        cs = self.cs
        sn = self.sn
        hd = self.hd
        for h in range(heads):
            b = h * hd
            for i in range(hd // 2):
                a = v[b + 2 * i]
                c = v[b + 2 * i + 1]
                v[b + 2 * i] = a * cs[i] - c * sn[i]
                v[b + 2 * i + 1] = a * sn[i] + c * cs[i]

    # pack k, v (kv_dim floats each) into the cache's layer-row format and write it to
    # the token reserved for h; the cache's status (OK or negative); O(kv_dim)
    def store(self, h, layer, k, v):
        kd = self.kv_dim
        for which in (0, 1):
            x = v if which else k
            g = self.store_group(which)
            for j in range(0, kd, g):
                if self.store_scaled(which):
                    self.store_part(x, which, 0, j, j + g)
                self.store_part(x, which, 1, j, j + g)
        return self.store_end(h, layer)

    # the new K/V row in parts, a sliced step's units (the same bytes as a whole store):
    # store_scaled(which): K (which 0) or V (1) is quantized; store_group(which): the
    # elements sharing one scale, kv_dim where there is none. store_part(x, which, p, i0, i1), i0 .. i1 within one group and
    # each group's parts in order: p 0 (quantized only) its max |x| so far, the scale
    # stored at the group's end; p 1 its elements packed. store_end writes the row
    def store_scaled(self, which):
        lay = self.lay
        return lay.dtype == "int8" or lay.dtype == "int4tok" or (lay.kivi and which)

    def store_group(self, which):
        return self.lay.group if self.store_scaled(which) else self.kv_dim

    def store_part(self, x, which, p, i0, i1):
        lay = self.lay
        kd = self.kv_dim
        if p == 0 and not self.store_scaled(which):
            return
        if lay.dtype == "fp32":
            rf = self.rowf
            o = kd if which else 0
            for i in range(i0, i1):
                rf[o + i] = x[i]
            return
        row = self.row
        if lay.kivi and not which:  # K in fp32: the cache quantizes it per channel
            struct.pack_into("<%df" % (i1 - i0), row, 4 * i0, *x[i0:i1])
            return
        d = lay.v_off if which else 0
        so = lay.vs_off if which else lay.ks_off
        g = lay.group
        if p == 0:
            a = quant.group_max(x, i0, i1, 0.0 if i0 % g == 0 else self.st_a)
            self.st_a = a
            if i1 % g == 0:
                self.st_sc = quant.put_scale(lay, row, so, i0, a)
            return
        quant.pack_range(lay, x, row, d, self.st_sc, i0, i1)

    def store_end(self, h, layer):
        if self.lay.dtype == "fp32":
            copy32(self.row, 0, self.rowf, 0, self.lr >> 2)  # write() measures src in bytes
        return self.cache.write(h, layer, self.row, 0)

    # per token, after the first layer's write (a copy on write has happened by then):
    # the arena offset of every cached slot's layer-0 row and, for rope "cache", each
    # slot's rank by position; O(n)
    def begin(self, h, n):
        for p in range(4 if self.rope_cache else 1):
            self.begin_part(h, n, p, 0, begin_len(n, self.hd, p))

    # ... in parts (a sliced step's units, in order, each p over its whole range, begin_len):
    # p 0 slots s0 .. s1 - 1's offsets (and h2o sums zeroed); rope "cache": p 1 their
    # positions gathered, p 2 moves s0 .. s1 - 1 of a bottom-up merge sort of the slots by
    # position (n a pass, ties by slot), p 3 the cos and sin of pairs s0 .. s1 - 1 of the
    # n x D/2 (rank c // (D/2)). No allocation but the floats; each part's work is bounded by
    # s1 - s0 whatever n is (the sort was one list.sort of n tuples: n log n in one call)
    def begin_part(self, h, n, p, s0, s1):
        c = self.cache
        if p == 0:
            t = self.t
            self.h = h
            self.n = n
            if not self.lay.kivi:
                bb = c.block_bytes
                lr = self.lr
                base = 0
                for s in range(s0, s1):
                    r = s % t
                    if r == 0 or s == s0:
                        base = c.block_at(h, s // t) * bb + t * HDR_BYTES
                    self.off0[s] = base + r * lr
            if self.h2o:
                for s in range(s0, s1):
                    self.acc[s] = 0.0
        elif p == 1:
            sp = self.spos
            rs = self.rslot
            for s in range(s0, s1):
                sp[s] = c.slot_pos(h, s)
                rs[s] = s
        elif p == 2:
            sp = self.spos
            i = self.mi
            j = self.mj
            x = s0
            while x < s1:
                ps = x // n
                k = x - ps * n
                w = 1 << ps
                src = self.rtmp if ps & 1 else self.rslot
                dst = self.rslot if ps & 1 else self.rtmp
                lo = k - (k & ((w << 1) - 1))
                mid = lo + w if lo + w < n else n
                hi = lo + (w << 1) if lo + (w << 1) < n else n
                if k == lo:
                    i = lo
                    j = mid
                e = hi if hi - k < s1 - x else k + s1 - x
                x += e - k
                while k < e:
                    if i < mid and (j >= hi or sp[src[i]] <= sp[src[j]]):
                        dst[k] = src[i]
                        i += 1
                    else:
                        dst[k] = src[j]
                        j += 1
                    k += 1
            self.mi = i
            self.mj = j
        else:
            h2 = self.hd >> 1
            rs = self.rtmp if _passes(n) & 1 else self.rslot
            fr = self.inv_freq
            kc = self.kcos
            ks = self.ksin
            r = s0 // h2
            i = s0 - r * h2
            x = s0
            while x < s1:
                e = i + s1 - x if i + s1 - x < h2 else h2
                b = rs[r] * h2
                for m in range(i, e):
                    a = r * fr[m]
                    kc[b + m] = math.cos(a)
                    ks[b + m] = math.sin(a)
                x += e - i
                r += 1
                i = 0

    # slot s's cached row of `layer` read into rowf (and rowb for quantized rows); O(row)
    def _row(self, s, layer):
        if self.lay.kivi:  # K in fp32 (residual, or dequantized by the cache), V as stored
            self.cache.read_slot(self.h, s, layer, self.rowb, 0)
            copy32(self.rowf, 0, self.rowb, 0, self.lr >> 2)
            return
        w = (self.off0[s] + layer * self.step) >> 2
        copy32(self.rowf, 0, self.cache.arena, w, self.lr >> 2)
        if self.lay.dtype != "fp32":
            copy32(self.rowb, 0, self.cache.arena, w, self.lr >> 2)

    # which = 0: the key, 1: the value of the row just read, as floats in kf: elements
    # e0 .. e1 - 1 (whole heads) of kv_dim; O(e1 - e0)
    def _vec(self, which, e0, e1):
        lay = self.lay
        kd = self.kv_dim
        out = self.kf
        if lay.dtype == "fp32" or (lay.kivi and not which):
            rf = self.rowf
            o = kd if which and not lay.kivi else 0
            for i in range(e0, e1):
                out[i] = rf[o + i]
            return out
        rb = self.rowb
        rf = self.rowf
        d = lay.v_off if which else 0
        so = (lay.vs_off if which else lay.ks_off) >> 2
        g = lay.group
        if lay.dtype == "fp16":
            for i in range(e0, e1):
                out[i] = _half(rb[d + 2 * i] | (rb[d + 2 * i + 1] << 8))
        elif lay.dtype == "int8":
            for i in range(e0, e1):
                b = rb[d + i]
                out[i] = (b - 256 if b > 127 else b) * rf[so + i // g]
        else:
            for i in range(e0, e1):
                b = (rb[d + (i >> 1)] >> ((i & 1) << 2)) & 15
                out[i] = (b - 16 if b > 7 else b) * rf[so + i // g]
        return out

    # rotate key kf's elements e0 .. e1 - 1 (whole heads) by the angle of slot s's rank
    # (rope "cache"); O(e1 - e0)
    def _rot(self, kf, s, e0, e1):
        hd = self.hd
        h2 = hd // 2
        kc = self.kcos
        ks = self.ksin
        for i in range(h2):
            cs = kc[s * h2 + i]
            sn = ks[s * h2 + i]
            for b in range(e0, e1, hd):
                x = kf[b + 2 * i]
                y = kf[b + 2 * i + 1]
                kf[b + 2 * i] = x * cs - y * sn
                kf[b + 2 * i + 1] = x * sn + y * cs

    # out (n_heads x D) = attention of q over the n cached slots of h in `layer`:
    # per query head, softmax over slots of q.K / sqrt(D), then the weighted sum of V
    # (query head j reads K/V head j // rep). Each row is read twice (K pass, V pass).
    # O(n x (dim + kv_dim)); the slot order does not matter
    def attention(self, out, q, h, layer):
        n = self.n
        self.att_scores(q, layer, 0, n)
        self.att_softmax()
        self.att_values(out, layer, 0, n)

    # attention in parts, the units a sliced forward step runs between looks at its slice
    # (the same operations in the same order as attention()): the scores of slots s0 .. s1 - 1
    # for the query heads of K/V heads g0 .. g1 - 1 (None: all); a slot's row is read at its
    # first part (g0 == 0), the parts of a slot in order
    def att_scores(self, q, layer, s0, s1, g0=0, g1=None):
        hd = self.hd
        rep = self.rep
        ms = self.ms
        inv = 1.0 / math.sqrt(hd)
        att = self.att
        if g1 is None:
            g1 = self.n_kv
        for s in range(s0, s1):
            if g0 == 0:
                self._row(s, layer)
            kf = self._vec(0, g0 * hd, g1 * hd)
            if self.rope_cache:
                self._rot(kf, s, g0 * hd, g1 * hd)
            for j in range(g0 * rep, g1 * rep):
                kb = (j // rep) * hd
                qb = j * hd
                a = 0.0
                for i in range(hd):
                    a += q[qb + i] * kf[kb + i]
                att[j * ms + s] = a * inv

    # ... the softmax of every head's scores over the n slots
    def att_softmax(self):
        n = self.n
        ms = self.ms
        att = self.att
        for j in range(self.n_heads):
            b = j * ms
            best = att[b]
            for s in range(1, n):
                if att[b + s] > best:
                    best = att[b + s]
            tot = 0.0
            for s in range(n):
                e = math.exp(att[b + s] - best)
                att[b + s] = e
                tot += e
            for s in range(n):
                att[b + s] /= tot

    # ... the softmax in parts, pass p over slots s0 .. s1 - 1 of every head, the passes in
    # order, each from s0 == 0 to n (a sliced step's units: the same operations in the same
    # order as att_softmax, so the same floats): p 0 the max, p 1 exp and the sum, p 2 the
    # division by the sum
    def att_softmax_part(self, p, s0, s1):
        ms = self.ms
        att = self.att
        if p == 0:
            mx = self.smax
            for j in range(self.n_heads):
                b = j * ms
                if s0 == 0:
                    best = att[b]
                    s = 1
                else:
                    best = mx[j]
                    s = s0
                while s < s1:
                    if att[b + s] > best:
                        best = att[b + s]
                    s += 1
                mx[j] = best
        elif p == 1:
            mx = self.smax
            sm = self.ssum
            for j in range(self.n_heads):
                b = j * ms
                best = mx[j]
                tot = 0.0 if s0 == 0 else sm[j]
                for s in range(s0, s1):
                    e = math.exp(att[b + s] - best)
                    att[b + s] = e
                    tot += e
                sm[j] = tot
        else:
            sm = self.ssum
            for j in range(self.n_heads):
                b = j * ms
                tot = sm[j]
                for s in range(s0, s1):
                    att[b + s] /= tot

    # ... the weighted sum of the values of slots s0 .. s1 - 1 into out (zeroed at the
    # first part), for the query heads of K/V heads g0 .. g1 - 1 (None: all), as att_scores
    def att_values(self, out, layer, s0, s1, g0=0, g1=None):
        hd = self.hd
        rep = self.rep
        nh = self.n_heads
        ms = self.ms
        att = self.att
        if g1 is None:
            g1 = self.n_kv
        if s0 == 0 and g0 == 0:
            for i in range(self.dim):
                out[i] = 0.0
        for s in range(s0, s1):
            if g0 == 0:
                self._row(s, layer)
            vf = self._vec(1, g0 * hd, g1 * hd)
            for j in range(g0 * rep, g1 * rep):
                p = att[j * ms + s]
                if self.h2o:
                    self.acc[s] += p / nh
                kb = (j // rep) * hd
                qb = j * hd
                for i in range(hd):
                    out[qb + i] += p * vf[kb + i]

    # feed the token's attention to the cache's h2o scores: slot s gets
    # round(SCORE_ONE x acc[s]); O(n)
    def end(self, h):
        if not self.h2o:
            return
        c = self.cache
        for s in range(self.n):
            v = int(self.acc[s] * SCORE_ONE + 0.5)
            if v > 0:
                c.add_score(h, s, v)

    # logits = wcls x; O(vocab x dim)
    def logits_of(self, logits, x):
        self.matvec(logits, self.w.wcls, x)


class Numpy:
    # numpy float32 kernels: the same math, vectorized; CPython only
    def __init__(self, weights, cache, rope_mode, np):
        cfg = weights.cfg
        lay = cache.layout
        self.np = np  # the numpy module
        self.w = weights  # llama2c.Weights (read-only)
        self.cache = cache  # kv.KVCache holding this model's K/V
        self.lay = lay  # kv.Layout of the rows
        self.dim = cfg.dim
        self.n_heads = cfg.n_heads
        self.n_kv = cfg.n_kv_heads
        self.hd = cfg.head_dim
        self.kv_dim = cfg.kv_dim
        self.rep = cfg.n_heads // cfg.n_kv_heads
        self.rope_cache = rope_mode == "cache"
        self.h2o = cache.map_size > 0
        self.t = lay.tokens_per_block
        self.inv_freq = np.array(inv_freqs(cfg.head_dim), np.float64)  # (D/2,)
        self.cs = np.ones(cfg.head_dim // 2, np.float32)  # cos at the current position (D/2,)
        self.sn = np.zeros(cfg.head_dim // 2, np.float32)  # sin at the current position (D/2,)
        self.mats = {}  # id(Matrix) -> (values (rows, cols), scales (rows, cols/g, 1) or None), views
        self.row = bytearray(lay.layer_row)  # one packed layer row for cache.write
        self.row_f = np.frombuffer(self.row, np.float32)  # the row as float32 words (layer_row / 4,)
        self.row_b = np.frombuffer(self.row, np.uint8)  # the row as bytes (layer_row,)
        self.arena_b = np.frombuffer(cache.arena, np.uint8)  # the whole KV arena as bytes
        self.arena_w = np.frombuffer(cache.arena, np.float32)  # ... as float32 words
        self.arena_u = np.frombuffer(cache.arena, np.uint32)  # ... as uint32 words (slot headers)
        self.step = lay.tokens_per_block * lay.store_row  # bytes from layer l's rows to l+1's
        self.idx = None  # (n, row words or bytes) arena indices of layer 0's cached rows, per token
        # int4 (KIVI): the residual as float32, per token the K parameters' word indices
        # of layer 0 (n, kv_dim) and the residual slots with their layer-0 word
        self.res_f = np.frombuffer(cache.resid, np.float32) if lay.kivi else None
        self.kp_idx = None  # (n, kv_dim) arena word of each slot's block's parameter per channel, layer 0
        self.res_slots = None  # (k,) slots whose K is in the residual
        self.res_idx = None  # (k, kv_dim) their residual words, layer 0
        self.n = 0  # cached slots of the current token
        self._q = None  # the query att_scores was given (att_values computes the attention)
        self.kcos = self.ksin = None  # (n, 1, D/2) key rotation by rank (rope "cache")
        self.acc = None  # (n,) float64: this token's summed mean attention per slot (h2o)
        for lw in weights.layers:
            for m in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w1, lw.w2, lw.w3):
                self._views(m)
        self._views(weights.wcls)
        self._views(weights.token_embedding)

    # remember the numpy views of Matrix m; boot only
    def _views(self, m):
        q, s = self.w.np_matrix(m)
        if s is not None:
            s = s.reshape(m.rows, m.cols // m.group, 1)
            q = q.reshape(m.rows, m.cols // m.group, m.group)
        self.mats[id(m)] = (q, s)

    # zeroed float32 vector; boot only
    def vec(self, n):
        return self.np.zeros(n, self.np.float32)

    # x = embedding row of token; O(dim)
    def embed(self, x, token):
        q, s = self.mats[id(self.w.token_embedding)]
        if s is None:
            x[:] = q[token]
        else:
            x[:] = (q[token] * s[token]).reshape(-1)

    # rows r0 .. r1 - 1 of out = W x (a sliced step's unit): the whole product at r0 == 0,
    # nothing after, so the float sums are matvec's own (the host's stand-in: the time is
    # the cost model's, charged per unit by the slicer)
    def matvec_rows(self, out, m, x, r0, r1):
        if r0 == 0:
            self.matvec(out, m, x)

    # the other parts (Plain's interface): the whole operation at the first part, nothing after
    def matvec_cols(self, out, m, x, r, c0, c1):
        if r == 0 and c0 == 0:
            self.matvec(out, m, x)

    def rmsnorm_part(self, out, x, off, p, i0, i1):
        if p == 1 and i0 == 0:
            self.rmsnorm(out, x, off)

    def silu_mul_part(self, a, b, i0, i1):
        if i0 == 0:
            self.silu_mul(a, b)

    def add_part(self, x, y, i0, i1):
        if i0 == 0:
            self.add(x, y)

    def rope_part(self, v, p0, p1):
        if p0 == 0:
            self.rope(v, v.shape[0] // self.hd)

    # attention in parts (Plain's interface): the whole attention at the values' first part
    def att_scores(self, q, layer, s0, s1, g0=0, g1=None):
        if s0 == 0 and g0 == 0:
            self._q = q

    def att_softmax(self):
        pass

    def att_softmax_part(self, p, s0, s1):
        pass

    def att_values(self, out, layer, s0, s1, g0=0, g1=None):
        if s0 == 0 and g0 == 0:
            self.attention(out, self._q, -1, layer)

    # the row in parts (Plain's interface): the whole row stored at the end
    def store_scaled(self, which):
        return Plain.store_scaled(self, which)

    def store_group(self, which):
        return Plain.store_group(self, which)

    def store_part(self, x, which, p, i0, i1):
        if which:
            self._sv = x
        else:
            self._sk = x

    def store_end(self, h, layer):
        return self.store(h, layer, self._sk, self._sv)

    def begin_part(self, h, n, p, s0, s1):
        if p == 0 and s0 == 0:
            self.begin(h, n)

    def embed_part(self, x, token, i0, i1):
        if i0 == 0:
            self.embed(x, token)

    # out = W x; int8: per group sums of q * x, times the group's scale; O(rows x cols)
    def matvec(self, out, m, x):
        q, s = self.mats[id(m)]
        if s is None:
            self.np.dot(q, x, out=out)
        else:
            xg = x.reshape(1, q.shape[1], q.shape[2])
            out[:] = ((q * xg).sum(axis=2, keepdims=True) * s).sum(axis=(1, 2))

    # out = x / sqrt(mean(x^2) + eps) * f32[off ..]; O(dim)
    def rmsnorm(self, out, x, off):
        np = self.np
        g = self.w.np_f32[off:off + x.shape[0]]
        out[:] = g * (x / np.sqrt(np.dot(x, x) / np.float32(x.shape[0]) + np.float32(_EPS)))

    # a = silu(a) * b; O(n)
    def silu_mul(self, a, b):
        a *= b / (1.0 + self.np.exp(-a))

    # x += y; O(n)
    def add(self, x, y):
        x += y

    # cos/sin of position pos for the next rope() calls; O(D)
    def rope_at(self, pos):
        a = pos * self.inv_freq
        self.cs[:] = self.np.cos(a)
        self.sn[:] = self.np.sin(a)

    # rotate pairs (2i, 2i+1) of each head of v in place; O(heads x D)
    def rope(self, v, heads):
        p = v.reshape(heads, -1, 2)
        a = p[:, :, 0].copy()
        b = p[:, :, 1]
        p[:, :, 0] = a * self.cs - b * self.sn
        p[:, :, 1] = a * self.sn + b * self.cs

    # pack k, v into one layer row (fp32 words, or int8/int4 exactly as quant.py does:
    # scale = max|x| / qmax stored as fp32, q = round-half-even(x / stored scale)) and
    # write it to the token reserved for h; the cache's status; O(kv_dim)
    def store(self, h, layer, k, v):
        np = self.np
        lay = self.lay
        kd = self.kv_dim
        if lay.dtype == "fp32":
            self.row_f[:kd] = k
            self.row_f[kd:2 * kd] = v
        elif lay.dtype == "fp16":  # IEEE half, little-endian, as quant.pack_layer packs it ("<e")
            self.row_b[:2 * kd] = k.astype("<f2").view(np.uint8)
            self.row_b[lay.v_off:lay.v_off + 2 * kd] = v.astype("<f2").view(np.uint8)
        elif lay.kivi:  # K in fp32 (the cache quantizes it per channel), V per token
            self.row_f[:kd] = k
            self._quant(v, lay.v_off, lay.vs_off)
        else:
            self._quant(k, 0, lay.ks_off)
            self._quant(v, lay.v_off, lay.vs_off)
        return self.cache.write(h, layer, self.row, 0)

    # quantize x (kv_dim) into the row: data at byte d, scales at byte s; O(kv_dim)
    def _quant(self, x, d, s):
        np = self.np
        lay = self.lay
        g = lay.group
        qmax = 127 if lay.dtype == "int8" else 7
        xg = x.astype(np.float64).reshape(-1, g)
        sc = (np.abs(xg).max(axis=1) / qmax).astype(np.float32)
        ng = sc.shape[0]
        self.row_f[s // 4:s // 4 + ng] = sc
        scd = sc.astype(np.float64)[:, None]
        safe = np.where(scd > 0, scd, 1.0)
        q = np.clip(np.rint(xg / safe), -qmax, qmax).astype(np.int64) * (scd > 0)
        q = q.reshape(-1)
        if lay.dtype == "int8":
            self.row_b[d:d + q.shape[0]] = (q & 255).astype(np.uint8)
        else:
            u = (q & 15).astype(np.uint8)
            self.row_b[d:d + q.shape[0] // 2] = u[0::2] | (u[1::2] << 4)

    # per token: arena indices of the n cached slots' layer-0 rows and, for rope
    # "cache", the rotation of each slot by its rank; O(n)
    def begin(self, h, n):
        np = self.np
        c = self.cache
        t = self.t
        lay = self.lay
        nb = (n + t - 1) // t
        blocks = np.array([c.block_at(h, k) for k in range(nb)], np.int64)
        slots = np.arange(n)
        bs = blocks[slots // t]
        off = bs * c.block_bytes + lay.rows_off + (slots % t) * lay.store_row  # bytes
        if lay.dtype == "fp32":
            self.idx = (off // 4)[:, None] + np.arange(2 * self.kv_dim)[None, :]
        else:
            self.idx = off[:, None] + np.arange(lay.store_row)[None, :]
        if lay.kivi:
            kd = self.kv_dim
            self.kp_idx = ((bs * c.block_bytes + lay.kp_off) // 4)[:, None] + np.arange(kd)[None, :]
            cur = c.current_block(h)
            rs = [s for s in range(cur * t, min(cur * t + t, n)) if c.residual_word(h, s, 0) >= 0] if cur >= 0 else []
            self.res_slots = np.array(rs, np.int64)
            self.res_idx = np.array([c.residual_word(h, s, 0) for s in rs], np.int64)[:, None] + np.arange(kd)[None, :]
        self.n = n
        if self.h2o:
            self.acc = np.zeros(n, np.float64)
        if self.rope_cache:
            pos = self.arena_u[bs * (c.block_bytes // 4) + (slots % t) * 2].astype(np.int64) - 1
            ranks = np.empty(n, np.int64)
            ranks[np.argsort(pos, kind="stable")] = slots
            a = ranks[:, None] * self.inv_freq[None, :]
            self.kcos = np.cos(a).astype(np.float32)[:, None, :]
            self.ksin = np.sin(a).astype(np.float32)[:, None, :]

    # (K, V) of the cached slots of layer as (n, H, D) float32 arrays; O(n x kv_dim)
    def _kv(self, layer):
        np = self.np
        lay = self.lay
        n = self.n
        kd = self.kv_dim
        H = self.n_kv
        D = self.hd
        if lay.dtype == "fp32":
            r = self.arena_w[self.idx + layer * (self.step // 4)]
            return r[:, :kd].reshape(n, H, D), r[:, kd:].reshape(n, H, D)
        r = self.arena_b[self.idx + layer * self.step]
        if lay.dtype == "fp16":
            k = r[:, :2 * kd].copy().view("<f2").astype(np.float32)
            v = r[:, lay.v_off:lay.v_off + 2 * kd].copy().view("<f2").astype(np.float32)
            return k.reshape(n, H, D), v.reshape(n, H, D)
        gph = lay.groups_per_head
        if lay.kivi:
            return self._kivi_k(r, layer), self._kivi_v(r)
        ks = r[:, lay.ks_off:lay.ks_off + 4 * H * gph].copy().view(np.float32).reshape(n, H, gph, 1)
        vs = r[:, lay.vs_off:lay.vs_off + 4 * H * gph].copy().view(np.float32).reshape(n, H, gph, 1)
        if lay.dtype == "int8":
            kq = r[:, :kd].view(np.int8)
            vq = r[:, lay.v_off:lay.v_off + kd].view(np.int8)
        else:
            kq = self._nibbles(r[:, :kd // 2])
            vq = self._nibbles(r[:, lay.v_off:lay.v_off + kd // 2])
        k = (kq.reshape(n, H, gph, -1).astype(np.float32) * ks).reshape(n, H, D)
        v = (vq.reshape(n, H, gph, -1).astype(np.float32) * vs).reshape(n, H, D)
        return k, v

    # int4 (KIVI): the keys of the cached slots of layer from their stored rows r (n,
    # store_row) bytes, the blocks' parameters and the residual, as (n, H, D) float32:
    # (LO + q * STEP) * 2**E exactly as kvkivi.dequant makes it (flushed below 2**-126)
    def _kivi_k(self, r, layer):
        np = self.np
        lay = self.lay
        n, kd = self.n, self.kv_dim
        b = r[:, lay.kq_off:lay.kq_off + kd // 2]
        q = np.stack([b & 15, b >> 4], axis=-1).reshape(n, kd).astype(np.int64)
        w = self.arena_u[self.kp_idx + layer * kd].astype(np.int64)
        nn = ((w >> 8) & 4095) - 2048 + q * ((w >> 20) & 511)
        k = np.ldexp(nn.astype(np.float64), ((w & 255) - 136).astype(np.int32))
        k = np.where(np.abs(k) < 2.0 ** -126, 0.0, np.clip(k, -_F32_MAX, _F32_MAX)).astype(np.float32)
        if self.res_slots.shape[0]:
            k[self.res_slots] = self.res_f[self.res_idx + layer * self.t * kd]
        return k.reshape(n, self.n_kv, self.hd)

    # int4 (KIVI): the values of the stored rows r (n, store_row) as (n, H, D) float32
    def _kivi_v(self, r):
        np = self.np
        lay = self.lay
        n, kd, gph = self.n, self.kv_dim, lay.groups_per_head
        so = lay.kq_off - lay.scale_bytes
        vs = r[:, so:so + lay.scale_bytes].copy().view(np.float32).reshape(n, self.n_kv, gph, 1)
        vq = self._nibbles(r[:, :kd // 2])
        return (vq.reshape(n, self.n_kv, gph, -1).astype(np.float32) * vs).reshape(n, self.n_kv, self.hd)

    # signed int4 values (low nibble first) of packed bytes b (n, m) -> (n, 2m) int8
    def _nibbles(self, b):
        np = self.np
        lo = (b & 15).astype(np.int8)
        hi = (b >> 4).astype(np.int8)
        out = np.stack([lo, hi], axis=-1).reshape(b.shape[0], -1)
        return np.where(out > 7, out - 16, out).astype(np.int8)

    # out = attention of q over the cached slots of h in layer (GQA); O(n x dim)
    def attention(self, out, q, h, layer):
        np = self.np
        k, v = self._kv(layer)
        if self.rope_cache:
            p = k.reshape(self.n, self.n_kv, -1, 2)
            a = p[..., 0] * self.kcos - p[..., 1] * self.ksin
            b = p[..., 0] * self.ksin + p[..., 1] * self.kcos
            k = np.stack([a, b], axis=-1).reshape(k.shape)
        qg = q.reshape(self.n_kv, self.rep, self.hd)
        sc = np.einsum("grd,ngd->grn", qg, k) * np.float32(1.0 / math.sqrt(self.hd))
        sc = np.exp(sc - sc.max(axis=2, keepdims=True))
        sc /= sc.sum(axis=2, keepdims=True)
        if self.h2o:
            self.acc += sc.sum(axis=(0, 1)) / self.n_heads
        out[:] = np.einsum("grn,ngd->grd", sc, v).reshape(-1)

    # feed h2o: slot s gets round(SCORE_ONE x acc[s]); O(n)
    def end(self, h):
        if not self.h2o:
            return
        add = self.cache.add_score
        vals = (self.acc * SCORE_ONE + 0.5).astype(self.np.int64).tolist()
        for s in range(self.n):
            if vals[s] > 0:
                add(h, s, vals[s])

    # logits = wcls x; O(vocab x dim)
    def logits_of(self, logits, x):
        self.matvec(logits, self.w.wcls, x)
