# The integer forward pass of an int8 llama2.c model (backend "q8" of model.Model):
# QForward.forward(h, token, pos) is a generator that runs one layer per step and
# yields between layers; every step's math is in firmware_py/kernels_q.py (viper on
# MicroPython, their plain-Python twins on CPython), in int32 fixed point, so a decode
# step allocates nothing on MicroPython (tests/firmware/fw_qmodel.py runs it with the
# heap locked on the 64- and the 32-bit build). As run.c: the config (cfg), the
# read-only weights (llama2c.Weights: int8 values and fp32 scales, whose scales become
# fixed-point multipliers once, here) and the run state (below, allocated once).
#
# K and V go through the sequence's KV cache (kv.KVCache: reserve, then write per
# layer, int8 rows with fp32 scale bits as kv.Layout stores them); attention reads the
# cached rows in place from the pool's arena (row offsets from cache.row_offset, slot
# headers as docs/memory.md gives them), so every cached slot of h takes part, in slot
# order (attention does not depend on the order), and the probabilities feed h2o's
# scores (cache.add_score) when the cache keeps them.
# RoPE: "absolute" stores keys after RoPE at their own position (kv.py's convention);
# "cache" stores them before RoPE and turns each by its rank among the cached
# positions at attention time, the query at the newest rank (StreamingLLM).
from array import array

from firmware_py import kernels_q as K
from firmware_py.compat import const, new_array
from firmware_py.slicer import ATTH_SLOTS, Q8_UNIT_MACS, RANK_CMP, SLICE, U_ATTH, U_CALL, U_ELEM, U_KVW, U_NORM, U_RANK, U_ROPE, U_ROWS, U_SILU
from firmware_py.status import E_EMPTY, E_RANGE, OK

LOGIT_FRAC = const(16)  # fractional bits of QForward.logits
ROPE_HI = const(64)  # RoPE tables reach positions below ROPE_HI x seq_len
_EPS = 1e-5  # rmsnorm epsilon (llama2.c)


class QModelError(ValueError):
    # a configuration mistake: not an int8 model, a KV layout that does not fit; one line
    pass


MV_START = const(-1)  # QForward._mv: nothing done yet
MV_DISPATCH = const(-3)  # ... the dispatch next, without asking the slicer ahead again
MV_LAST = const(-4)  # ... the last unit ran and the slice is spent: done once the caller yielded
MV_DONE = const(-5)  # ... the matrix is done


class QMat:
    # one int8 matrix: where its values and its fixed-point group multipliers are
    def __init__(self, m, goff, emin):
        self.off = m.off  # element offset of W[0, 0] in Weights.q8
        self.rows = m.rows  # outputs
        self.cols = m.cols  # inputs
        self.group = m.group  # int8 values per scale along a row
        self.goff = goff  # offset of its first group in QForward.gp
        self.emin = emin  # W = q * m * 2**-(emin + d) (kernels_q: weights)
        self.shift = K.mv_shift(m.cols)  # matvec's output is the sum shifted right by this (wide rows)
        self.unit = 0  # rows of a sliced forward's matvec unit (QForward._windows)
        self.views = None  # views of its output at each unit's first row


# zero-filled array('i') of n ints (boot only)
def _zeros(n):
    # n zero int32s in one allocation, with no temporary of their size (a temporary freed
    # between the boot's lasting arrays leaves a hole the KV arena cannot use)
    a = new_array("i", n)
    for i in range(n):
        a[i] = 0
    return a


class QForward:
    # the integer forward pass over int8 weights and an int8 KV cache; all state made here
    def __init__(self, weights, cache, rope="absolute"):
        cfg = weights.cfg
        lay = cache.layout
        if weights.dtype != "int8" or weights.q8 is None:
            raise QModelError("%s: the integer path needs an int8 model (./kv convert --format q8row)" % weights.path)
        if rope not in ("absolute", "cache"):
            raise QModelError("rope must be absolute or cache, got %r" % (rope,))
        if (lay.n_layers, lay.n_kv_heads, lay.head_dim) != (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim):
            raise QModelError("the KV layout (%d layers, %d kv heads, head_dim %d) does not match the model (%d, %d, %d)"
                              % (lay.n_layers, lay.n_kv_heads, lay.head_dim, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim))
        if lay.dtype != "int8":
            raise QModelError("the integer path reads int8 KV rows, this cache holds %s: give --kv-dtype int8" % lay.dtype)
        d, hid, kvd, hd = cfg.dim, cfg.hidden_dim, cfg.kv_dim, cfg.head_dim
        why = K.limits(d, hd, cache.max_slots)
        if why is not None:  # a dimension whose sums would leave a 32-bit word on the chip
            raise QModelError("%s: %s" % (weights.path, why))
        self.cfg = cfg  # llama2c.Config (static)
        self.weights = weights  # llama2c.Weights (read-only)
        self.cache = cache  # kv.KVCache written and read
        self.rope = rope  # "absolute" or "cache"
        self.status = OK  # last forward: reserve's flags (>= 0) or the refusal that stopped it
        self.logit_frac_bits = LOGIT_FRAC  # fractional bits of logits
        # fixed-point weights, converted once: per group m | d << 16 (kernels_q: weights)
        groups = 0
        mats = [weights.token_embedding] + ([] if cfg.shared_classifier else [weights.wcls])
        for ly in weights.layers:
            mats += [ly.wq, ly.wk, ly.wv, ly.wo, ly.w1, ly.w2, ly.w3]
        for m in mats:
            groups += m.rows * m.cols // m.group
        self.gp = _zeros(groups)  # (total groups,) packed multipliers of every matrix
        self._goff = 0
        self.emb = self._qmat(weights.token_embedding)  # QMat (vocab, dim)
        self.wcls = self.emb if cfg.shared_classifier else self._qmat(weights.wcls)  # QMat (vocab, dim)
        self.layers = []  # per layer: (wq, wk, wv, wo, w1, w2, w3) QMat
        for ly in weights.layers:
            self.layers.append(tuple(self._qmat(m) for m in (ly.wq, ly.wk, ly.wv, ly.wo, ly.w1, ly.w2, ly.w3)))
        # norm gains as Q(eg) ints: one exponent for all, max |g| * 2**eg < 2**15
        offs = [ly.rms_att for ly in weights.layers] + [ly.rms_ffn for ly in weights.layers] + [weights.rms_final]
        f32 = weights.f32
        gmax = max(abs(f32[o + i]) for o in offs for i in range(d)) or 1.0
        eg = 0
        while gmax * (1 << (eg + 1)) < 32767 and eg < 24:
            eg += 1
        self.eg = eg  # exponent of the gains
        self.gains = _zeros(len(offs) * d)  # (2 L + 1, dim) rms_att[l], rms_ffn[l], rms_final
        for j, o in enumerate(offs):
            for i in range(d):
                self.gains[j * d + i] = int(round(f32[o + i] * (1 << eg)))
        L = cfg.n_layers
        self.n_layers = L  # transformer blocks
        self.g_att = [j * d for j in range(L)]  # gains offset of rms_att[l]
        self.g_ffn = [(L + j) * d for j in range(L)]  # gains offset of rms_ffn[l]
        self.g_fin = 2 * L * d  # gains offset of rms_final
        self.nb = min(15, (30 - K.bitlen(d - 1)) // 2)  # bits per element in rmsnorm's sum of squares
        self.eps0 = int(d * _EPS * 4294967296.0 + 0.5)  # n * eps * 2**32
        self.sn = int(d ** 0.5 * 4096.0 + 0.5)  # sqrt(dim) * 2**12
        # tables (Q14 cos/sin, exp2, sigmoid)
        self.rope_lo = K.rope_table(cfg.seq_len, hd)  # (seq_len, hd/2, 2) cos, sin Q14
        self.rope_hi = K.rope_table(ROPE_HI, hd, cfg.seq_len)  # (ROPE_HI, hd/2, 2) at multiples of seq_len
        self.e2t = K.exp2_table()  # (65,) 2**(i/64) Q15
        self.sig = K.sigmoid_table()  # (1025,) sigmoid Q15 over -16..16
        self.q_scale = int(32768.0 / hd ** 0.5 + 0.5)  # 1/sqrt(head_dim) Q15, folded into the query's RoPE
        # run state (run.c's RunState), int32 unless said
        self.x = _zeros(d)  # (dim,) residual stream, Q16
        self.xq = _zeros(d)  # (dim,) normed x, q14
        self.q = _zeros(d)  # (dim,) query, q14 (after RoPE: <= 2**13)
        self.k = _zeros(kvd)  # (kv_dim,) key, q14
        self.v = _zeros(kvd)  # (kv_dim,) value, q14
        self.att = _zeros(d)  # (dim,) attention output, then q14
        self.o = _zeros(d)  # (dim,) wo / w2 output, before the residual add
        self.h1 = _zeros(hid)  # (hidden,) w1 x, then silu(w1 x) * w3 x
        self.h3 = _zeros(hid)  # (hidden,) w3 x
        self.l32 = _zeros(cfg.vocab_size)  # (vocab,) classifier output before rescaling
        self.logits = _zeros(cfg.vocab_size)  # (vocab,) next-token logits, Q(LOGIT_FRAC)
        self.cs_q = _zeros(hd)  # (hd/2, 2) the query's cos/sin, times 1/sqrt(hd)
        self.cs_k = _zeros(hd)  # (hd/2, 2) the key's cos/sin
        self.row = bytearray(lay.layer_row)  # one packed int8 K/V layer row for cache.write
        t = lay.tokens_per_block
        self.t = t  # tokens per block
        slots = cache.max_slots
        self.sc = _zeros(slots)  # (max_slots,) scores, then exp; positions for ranks
        self.hacc = _zeros(slots)  # (max_slots,) probabilities summed over heads and layers (h2o)
        self.ranks = _zeros(slots)  # (max_slots,) rope "cache": rank of each slot's position
        self.bases = _zeros(cache.max_blocks)  # (max_blocks,) arena byte offset of each block of h
        self.hexp = _zeros(cfg.n_heads)  # (n_heads,) V scale exponent per head (attend scratch)
        self.h2o = cache.map_size > 0  # the cache keeps h2o scores: feed them
        self.rot = K.rope_table(slots, hd) if rope == "cache" else array("h", [0, 0])  # (max_slots, hd/2, 2) rank cos/sin
        self.prm = _zeros(K.PRM_LEN)  # attend() parameters (kernels_q: P_*)
        p = self.prm
        p[K.P_T] = t
        p[K.P_LROW] = lay.layer_row
        p[K.P_VOFF] = lay.v_off
        p[K.P_KSOFF] = lay.ks_off
        p[K.P_VSOFF] = lay.vs_off
        p[K.P_HEADS] = cfg.n_heads
        p[K.P_REP] = cfg.n_heads // cfg.n_kv_heads
        p[K.P_HD] = hd
        p[K.P_H2O] = 1 if self.h2o else 0
        p[K.P_ROT] = 1 if rope == "cache" else 0
        p[K.P_KSH] = K.bitlen(hd) + 5  # keeps hd * 2**13 * |rotated key| below 2**30
        p[K.P_RLEN] = slots
        self.layer_off = [t * 8 + layer * t * lay.layer_row for layer in range(L)]  # row of (layer, slot 0) in a block
        self.h = -1  # sequence of the step under way
        self.slot = -1  # its reserved slot
        self.nslot = 0  # slots attention scans this step
        self.att_slots = ATTH_SLOTS  # before any unit's time is known: ranges of this many slots past it (slicer.Slicer.att_range)

        self.model = None  # the model.Model running this (its slicer bounds forward's slices), or None
        # a sliced forward's matvec units: each matrix's views of its output array at every
        # unit's first row, made once here (no allocation per step)
        win = {}
        outs = (self.q, self.k, self.v, self.o, self.h1, self.o, self.h3)  # of wq, wk, wv, wo, w1, w2, w3
        for ws in self.layers:
            for i in range(7):
                self._windows(ws[i], outs[i], win)
        self._windows(self.wcls, self.l32, win)

    # rows of a matvec unit with cols columns (slicer.Q8_UNIT_MACS multiply-adds; at least one)
    @staticmethod
    def unit_rows(cols):
        u = Q8_UNIT_MACS // cols
        return u if u > 0 else 1

    # QMat m's unit rows and views of out at each unit's first row (boot; shared by shape)
    def _windows(self, m, out, win):
        key = (id(out), m.cols)
        if key not in win:
            u = self.unit_rows(m.cols)
            mv = memoryview(out)
            win[key] = (u, [mv[r:] for r in range(0, len(out), u)])
        m.unit, m.views = win[key]

    # the QMat of matrix m, its group multipliers written into self.gp (boot; floats)
    def _qmat(self, m):
        f32 = self.weights.f32
        n = m.rows * m.cols // m.group
        me = [K.float_me(abs(f32[m.soff + g])) for g in range(n)]
        emin = min([e for mm, e in me if mm] or [0])
        goff = self._goff
        for g in range(n):
            mm, e = me[g]
            dd = e - emin
            self.gp[goff + g] = (mm | dd << 16) if mm and dd <= K.D_MAX else 0
        self._goff += n
        return QMat(m, goff, emin)

    # start a step: check, reserve the slot, the embedding, the RoPE rows, the block
    # offsets. The status (>= 0), or a refusal with self.status set. O(dim + blocks)
    def begin(self, h, token, pos, later=False):
        c = self.cache
        n = c.length(h)
        if n < 0:
            self.status = n
            return n
        if pos != n or token < 0 or token >= self.cfg.vocab_size:
            self.status = E_RANGE
            return E_RANGE
        p = self.prm  # every head, every pass: a step abandoned inside ranged attention left its own
        p[K.P_PASS] = 0
        p[K.P_H0] = 0
        p[K.P_H1] = 0
        slot = c.reserve(h)
        if slot < 0:
            self.status = slot
            return slot
        self.status = c.status
        self.h = h
        self.slot = slot
        cfg = self.cfg
        e = self.emb
        K.embed(self.x, self.weights.q8, e.off + token * e.cols, e.cols, e.group, self.gp,
                e.goff + token * e.cols // e.group, e.emin)
        nslot = c.cached(h)
        t = self.t
        nblk = (nslot + t - 1) // t
        self.nslot = nslot
        self.prm[K.P_NSLOT] = nslot
        self.prm[K.P_NBLK] = nblk
        for b in range(nblk):
            if self._base(b) < 0:
                self.status = E_EMPTY
                return E_EMPTY
        hd2 = cfg.head_dim // 2
        if K.rope_row(self.cs_k, self.rope_lo, self.rope_hi, ROPE_HI, pos, cfg.seq_len, hd2, 32768) < 0:
            self.status = E_RANGE
            return E_RANGE
        if self.rope != "cache":
            if self.qrope(pos) < 0:
                return E_RANGE
        elif not later:  # the slots' ranks by position; the query at the newest (a sliced step: in units, forward)
            if self.qrope(K.ranks(self.ranks, self.sc, c.arena, self.bases, nblk, t, nslot, 0, nslot) - 1) < 0:
                return E_RANGE
        if self.h2o:
            hacc = self.hacc
            for j in range(nslot):
                hacc[j] = 0
        return self.status

    # bases[b] = arena byte offset of block b of the step's sequence, from the first
    # filled slot in it; 0, or E_EMPTY when none is filled. O(T)
    def _base(self, b):
        c = self.cache
        t = self.t
        s = b * t
        while s < (b + 1) * t and s < self.nslot:
            ro = c.row_offset(self.h, s, 0)
            if ro >= 0:
                self.bases[b] = ro - t * 8 - (s - b * t) * c.layer_row
                return OK
            s += 1
        return E_EMPTY

    # one transformer block of the step begun; OK or a refusal (self.status set).
    # O(layer params + n_cached x dim), no allocation
    def layer(self, layer):
        cfg = self.cfg
        q8 = self.weights.q8
        gp = self.gp
        # one name per line: a tuple assignment of more than 3 names builds a tuple (allocates)
        x = self.x
        xq = self.xq
        q = self.q
        k = self.k
        v = self.v
        o = self.o
        d = cfg.dim
        kvd = cfg.kv_dim
        hd = cfg.head_dim
        hid = cfg.hidden_dim
        ws = self.layers[layer]  # (wq, wk, wv, wo, w1, w2, w3)
        wq = ws[0]
        wk = ws[1]
        wv = ws[2]
        wo = ws[3]
        w1 = ws[4]
        w2 = ws[5]
        w3 = ws[6]
        ex = K.rmsnorm(xq, x, d, self.gains, self.g_att[layer], self.nb, self.eps0, self.sn, self.eg)
        K.matvec(q, q8, wq.off, wq.rows, wq.cols, wq.group, gp, wq.goff, xq)
        eq = ex + wq.emin - 16 - wq.shift - K.quant(q, q, d)
        K.matvec(k, q8, wk.off, wk.rows, wk.cols, wk.group, gp, wk.goff, xq)
        ek = ex + wk.emin - 16 - wk.shift - K.quant(k, k, kvd)
        K.matvec(v, q8, wv.off, wv.rows, wv.cols, wv.group, gp, wv.goff, xq)
        ev = ex + wv.emin - 16 - wv.shift - K.quant(v, v, kvd)
        K.rope(q, d, hd, self.cs_q)
        if self.rope == "absolute":
            K.rope(k, kvd, hd, self.cs_k)
        lay = self.cache.layout
        row = self.row
        K.pack(row, 0, lay.ks_off, k, kvd, hd, ek, 127)
        K.pack(row, lay.v_off, lay.vs_off, v, kvd, hd, ev, 127)
        st = self.cache.write(self.h, layer, row, 0)
        if st < 0:
            self.status = st
            return st
        self._base(self.slot // self.t)  # a copy on write may have moved this block
        p = self.prm
        p[K.P_LAYER] = self.layer_off[layer]
        p[K.P_EQ] = eq
        att = self.att
        ea = K.attend(att, q, self.cache.arena, self.bases, p, self.sc, self.hacc, self.e2t, self.hexp, self.ranks, self.rot)
        ea -= K.quant(att, att, d)
        K.matvec(o, q8, wo.off, wo.rows, wo.cols, wo.group, gp, wo.goff, att)
        K.add(x, o, d, ea + wo.emin - 32 - wo.shift)
        ex = K.rmsnorm(xq, x, d, self.gains, self.g_ffn[layer], self.nb, self.eps0, self.sn, self.eg)
        h1, h3 = self.h1, self.h3
        K.matvec(h1, q8, w1.off, w1.rows, w1.cols, w1.group, gp, w1.goff, xq)
        e1 = ex + w1.emin - 16 - w1.shift - K.quant(h1, h1, hid)
        K.matvec(h3, q8, w3.off, w3.rows, w3.cols, w3.group, gp, w3.goff, xq)
        e3 = ex + w3.emin - 16 - w3.shift - K.quant(h3, h3, hid)
        K.silu(h1, h1, h3, hid, e1 - 10, self.sig)
        eh = e1 + e3 - K.quant(h1, h1, hid)
        K.matvec(o, q8, w2.off, w2.rows, w2.cols, w2.group, gp, w2.goff, h1)
        K.add(x, o, d, eh + w2.emin - 32 - w2.shift)
        return OK

    # end the step: final norm, classifier, logits (Q16); feeds h2o scores. O(vocab x dim)
    def finish(self):
        cfg = self.cfg
        w = self.wcls
        ex = K.rmsnorm(self.xq, self.x, cfg.dim, self.gains, self.g_fin, self.nb, self.eps0, self.sn, self.eg)
        K.matvec(self.l32, self.weights.q8, w.off, w.rows, w.cols, w.group, self.gp, w.goff, self.xq)
        K.rescale(self.logits, self.l32, cfg.vocab_size, ex + w.emin - 16 - w.shift - LOGIT_FRAC)
        if self.h2o:
            c = self.cache
            h = self.h
            hacc = self.hacc
            div = cfg.n_heads * self.n_layers
            for j in range(self.nslot):
                s = hacc[j] // div  # the mean probability per head and layer, Q15
                if s > 0:
                    c.add_score(h, j, s)
        return self.status

    # the query's RoPE row at position (rank) qpos; E_RANGE (self.status set) past the tables
    def qrope(self, qpos):
        if K.rope_row(self.cs_q, self.rope_lo, self.rope_hi, ROPE_HI, qpos, self.cfg.seq_len, self.cfg.head_dim // 2,
                      self.q_scale) < 0:
            self.status = E_RANGE
            return E_RANGE
        return 0

    # the whole step without yielding: begin, every layer, finish; the status. No allocation
    def step(self, h, token, pos):
        if self.begin(h, token, pos) < 0:
            return self.status
        for layer in range(self.n_layers):
            if self.layer(layer) < 0:
                return self.status
        return self.finish()

    # one token through the model as a cooperative step: a generator yielding after each
    # layer; then self.logits holds the next-token logits (Q16), or self.status < 0
    # says what refused. The generator object itself is the only allocation per call.
    # sl: a slicer.Slicer: the step runs in units and yields slicer.SLICE whenever the slice
    # is spent (no allocation either: the matvec units write through views made at boot)
    def forward(self, h, token, pos, sl=None):
        later = sl is not None and self.rope == "cache"
        if self.begin(h, token, pos, later) < 0:
            return
        if later:  # rope "cache": the ranks in units of about RANK_CMP comparisons (O(slots**2) in one: ms at 1,000 slots)
            ns = self.nslot
            u = RANK_CMP // ns if ns < RANK_CMP else 1
            j = 0
            nf = 0
            while j < ns:
                e = j + u if j + u < ns else ns
                nf = K.ranks(self.ranks, self.sc, self.cache.arena, self.bases, self.prm[K.P_NBLK], self.t, ns, j, e)
                if sl.step(U_RANK, (e - j) * ns, 0):
                    yield SLICE
                j = e
            if self.qrope(nf - 1) < 0:
                return
        for layer in range(self.n_layers):
            if sl is None:
                if self.layer(layer) < 0:
                    return
                yield
                continue
            # layer(), in units (the same calls in the same order)
            cfg = self.cfg
            x = self.x
            xq = self.xq
            q = self.q
            k = self.k
            v = self.v
            o = self.o
            d = cfg.dim
            kvd = cfg.kv_dim
            hd = cfg.head_dim
            hid = cfg.hidden_dim
            ws = self.layers[layer]
            ex = K.rmsnorm(xq, x, d, self.gains, self.g_att[layer], self.nb, self.eps0, self.sn, self.eg)
            if sl.step(U_NORM, d, 0):
                yield SLICE
            r = MV_START
            while True:  # the matvec in units, resumed after each SLICE (no generator made)
                r = self._mv(r, q, ws[0], xq, sl, 1)
                if r == MV_DONE:
                    break
                yield SLICE
            eq = ex + ws[0].emin - 16 - ws[0].shift - K.quant(q, q, d)
            r = MV_START
            while True:  # the matvec in units, resumed after each SLICE (no generator made)
                r = self._mv(r, k, ws[1], xq, sl, 1)
                if r == MV_DONE:
                    break
                yield SLICE
            ek = ex + ws[1].emin - 16 - ws[1].shift - K.quant(k, k, kvd)
            r = MV_START
            while True:  # the matvec in units, resumed after each SLICE (no generator made)
                r = self._mv(r, v, ws[2], xq, sl, 1)
                if r == MV_DONE:
                    break
                yield SLICE
            ev = ex + ws[2].emin - 16 - ws[2].shift - K.quant(v, v, kvd)
            K.rope(q, d, hd, self.cs_q)
            if self.rope == "absolute":
                K.rope(k, kvd, hd, self.cs_k)
            if sl.step(U_ROPE, d + kvd, 0):
                yield SLICE
            lay = self.cache.layout
            row = self.row
            K.pack(row, 0, lay.ks_off, k, kvd, hd, ek, 127)
            K.pack(row, lay.v_off, lay.vs_off, v, kvd, hd, ev, 127)
            st = self.cache.write(self.h, layer, row, 0)
            if st < 0:
                self.status = st
                return
            self._base(self.slot // self.t)
            if sl.step(U_KVW, 2 * kvd, 0):
                yield SLICE
            p = self.prm
            p[K.P_LAYER] = self.layer_off[layer]
            p[K.P_EQ] = eq
            att = self.att
            # attention in units of one query head (both passes over the slots each), the
            # exponent from the last: the same sums as one call over every head
            nh = cfg.n_heads
            ns = self.nslot
            hs = 2 * ns  # head-slot-passes of one head
            hh = 0
            rs = sl.att_range(ns, self.att_slots)  # 0: a unit per head; else slots per range of one pass
            while hh < nh and not rs:
                if sl.ahead_h(hs):
                    yield SLICE
                p[K.P_H0] = hh
                p[K.P_H1] = hh + 1
                ea = K.attend(att, q, self.cache.arena, self.bases, p, self.sc, self.hacc, self.e2t, self.hexp, self.ranks, self.rot)
                hh += 1
                if sl.step(U_ATTH, hs, 0):
                    yield SLICE
            # else each pass of each head over ranges of cb blocks (the emulator's units are
            # model.Model._att's, the same)
            t = self.t
            cb = rs // t if rs > t else 1
            while hh < nh:
                p[K.P_H0] = hh
                p[K.P_H1] = hh + 1
                pas = 1
                while pas <= 3:
                    p[K.P_PASS] = pas
                    k0 = 0
                    while k0 * t < ns:
                        e = (k0 + cb) * t
                        if e > ns:
                            e = ns
                        a = 0 if pas == 2 else e - k0 * t  # the exp pass is priced within the other two
                        if sl.ahead_r(a, pas):
                            yield SLICE
                        p[K.P_K0] = k0
                        p[K.P_K1] = k0 + cb
                        ea = K.attend(att, q, self.cache.arena, self.bases, p, self.sc, self.hacc, self.e2t, self.hexp, self.ranks, self.rot)
                        if sl.step(U_ATTH, a, pas):
                            yield SLICE
                        k0 += cb
                    pas += 1
                hh += 1
            p[K.P_PASS] = 0
            p[K.P_H0] = 0
            p[K.P_H1] = 0  # layer() attends over every head in one call
            ea -= K.quant(att, att, d)
            r = MV_START
            while True:  # the matvec in units, resumed after each SLICE (no generator made)
                r = self._mv(r, o, ws[3], att, sl, 1)
                if r == MV_DONE:
                    break
                yield SLICE
            K.add(x, o, d, ea + ws[3].emin - 32 - ws[3].shift)
            ex = K.rmsnorm(xq, x, d, self.gains, self.g_ffn[layer], self.nb, self.eps0, self.sn, self.eg)
            if sl.step(U_NORM, d, 0) | sl.step(U_ELEM, d, 0):
                yield SLICE
            h1 = self.h1
            h3 = self.h3
            r = MV_START
            while True:  # the matvec in units, resumed after each SLICE (no generator made)
                r = self._mv(r, h1, ws[4], xq, sl, 1)
                if r == MV_DONE:
                    break
                yield SLICE
            e1 = ex + ws[4].emin - 16 - ws[4].shift - K.quant(h1, h1, hid)
            r = MV_START
            while True:  # the matvec in units, resumed after each SLICE (no generator made)
                r = self._mv(r, h3, ws[6], xq, sl, 1)
                if r == MV_DONE:
                    break
                yield SLICE
            e3 = ex + ws[6].emin - 16 - ws[6].shift - K.quant(h3, h3, hid)
            K.silu(h1, h1, h3, hid, e1 - 10, self.sig)
            eh = e1 + e3 - K.quant(h1, h1, hid)
            if sl.step(U_SILU, hid, 0) | sl.step(U_ELEM, hid, 0):
                yield SLICE
            r = MV_START
            while True:  # the matvec in units, resumed after each SLICE (no generator made)
                r = self._mv(r, o, ws[5], h1, sl, 1)
                if r == MV_DONE:
                    break
                yield SLICE
            K.add(x, o, d, eh + ws[5].emin - 32 - ws[5].shift)
            if sl.step(U_ELEM, d, 0):
                yield SLICE
            yield
        if sl is None:
            self.finish()
            return
        cfg = self.cfg
        w = self.wcls
        ex = K.rmsnorm(self.xq, self.x, cfg.dim, self.gains, self.g_fin, self.nb, self.eps0, self.sn, self.eg)
        if sl.step(U_NORM, cfg.dim, 0):
            yield SLICE
        r = MV_START
        while True:  # the matvec in units, resumed after each SLICE (no generator made)
            r = self._mv(r, self.l32, w, self.xq, sl, 0)
            if r == MV_DONE:
                break
            yield SLICE
        K.rescale(self.logits, self.l32, cfg.vocab_size, ex + w.emin - 16 - w.shift - LOGIT_FRAC)
        if self.h2o:
            c = self.cache
            hacc = self.hacc
            div = cfg.n_heads * self.n_layers
            for j in range(self.nslot):
                s = hacc[j] // div
                if s > 0:
                    c.add_score(h, j, s)

    # out = the int8 matrix m times x in units of rows through the views made at boot, as
    # far as the slice allows: r is where it stands (MV_START, MV_DISPATCH, MV_LAST, else
    # the next row); returns MV_DONE when the matrix is
    # done, or where to resume after the caller yields SLICE (kinds: slicer.U_CALL, U_ROWS).
    # A plain function the step loops on, so slicing makes no generator per matvec
    def _mv(self, r, out, m, x, sl, in_layer):
        u = m.unit
        rows = m.rows
        cols = m.cols
        if r == MV_LAST:
            return MV_DONE
        if r == MV_START:
            if sl.ahead_call():
                return MV_DISPATCH  # yield first; then the dispatch without asking again
            r = MV_DISPATCH
        if r == MV_DISPATCH:
            if sl.step(U_CALL, in_layer, (u if u < rows else rows) * cols):
                return 0
            r = 0
        per = cols // m.group
        views = m.views
        while r < rows:
            n = u if r + u < rows else rows - r
            K.matvec(views[r // u], self.weights.q8, m.off + r * cols, n, cols, m.group, self.gp, m.goff + r * per, x)
            r += n
            if sl.step(U_ROWS, n, cols):
                return r if r < rows else MV_LAST
        return MV_DONE
