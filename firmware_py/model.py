# The llama2.c transformer's forward pass as a cooperative step: Model.forward(h,
# token, pos) is a generator that runs one layer per step and yields between layers,
# so a kernel task (firmware_py/sched) can decode beside other tasks. K and V of every
# layer go into the sequence's KV cache (kv.KVCache: reserve, then write per layer) and
# attention reads every cached slot of the sequence back from it, so the cache's
# policy (full, window, sinks, h2o) and element type (fp32, int8, int4) are what the
# model sees. The three parts of run.c stay apart: cfg (static), weights (read-only,
# llama2c.Weights), and the run state below, allocated once in __init__.
#
# Backends (firmware_py/kernels.py): "numpy" (CPython), "plain" (pure Python, both
# interpreters: the fp32 reference on the board, allocates floats), "q8" (the integer
# path, firmware_py/qmodel.QForward: int8 weights and int8 KV), "auto" (numpy on
# CPython; q8 for an int8 model with int8 KV on MicroPython; else plain).
# RoPE with evicted tokens (docs/model.md says why "absolute" is the default):
#   "absolute": keys stored after RoPE at their own position, the query at pos
#   "cache":    keys stored before RoPE, rotated at attention time by their rank among
#               the cached positions; the query at the newest rank (StreamingLLM)
from firmware_py import compat, kernels
from firmware_py.slicer import (ATTH_SLOTS, PLAIN_ATT_MACS, PLAIN_EL, PLAIN_MACS, Q8_UNIT_MACS, RANK_CMP, SLICE,
                                 SOFTMAX_SLOTS, U_ATT, U_ATTH, U_CALL, U_COLS, U_ELEM, U_KVW, U_NONE, U_NORM, U_RANK,
                                 U_ROPE, U_ROWS, U_SILU)
from firmware_py.status import E_RANGE, E_STATE, OK

BACKENDS = ("auto", "numpy", "plain", "q8")  # what Model(backend=...) accepts
ROPE_MODES = ("absolute", "cache")  # what Model(rope=...) accepts


class ModelError(ValueError):
    # a configuration mistake (backend, rope mode, a cache that does not fit the model); one line
    pass


# the backend "auto" means here for weights and a cache of KV dtype kv_dtype (numpy /
# q8 / plain: the integer path needs int8 weights and int8 KV rows); boot only
def auto_backend(weights, kv_dtype="int8"):
    if compat.numpy() is not None:
        return "numpy"
    if weights.dtype == "int8" and kv_dtype == "int8" and compat.IS_MICROPYTHON and _qmodel() is not None:
        return "q8"
    return "plain"


# firmware_py.qmodel, or None while it does not exist (imported lazily: it is engineer
# I's integer path and the float backends do not need it)
def _qmodel():
    try:
        from firmware_py import qmodel  # noqa: PLC0415 - optional backend
    except ImportError:
        return None
    return qmodel


class CacheShape:
    # what a Model sizes its run state by, before the cache it will read exists: the
    # layout, the slots and blocks one sequence may hold, and whether h2o scores are kept.
    # decode.Session's boot builds the model on one of these, measures the heap that is
    # left, makes the pool and the cache from that figure, then bind()s the model to them
    def __init__(self, layout, max_slots, max_blocks, h2o=False):
        self.layout = layout  # kv.Layout of the rows
        self.max_slots = max_slots  # most cached tokens one sequence may hold
        self.max_blocks = max_blocks  # block-table entries per sequence
        self.map_size = 2 * max_slots if h2o else 0  # > 0: h2o scores kept (as KVCache.map_size)


# heap bytes of a Model's run state per cache slot (what grows with CacheShape.max_slots):
# the integer path's scores, head sums and ranks (int32; rope "cache": + the rank's cos/sin,
# 2 x head_dim int16), the float path's row offsets, n_heads attention floats and h2o sums
# (rope "cache": + head_dim floats of cos and sin)
def run_state_slot_bytes(cfg, q8, rope="absolute"):
    if q8:
        return 12 + (2 * cfg.head_dim if rope == "cache" else 0)
    return 8 + 4 * cfg.n_heads + (4 * cfg.head_dim + 12 if rope == "cache" else 0)


# heap bytes of a Model's run state per pool block (the integer path's block offsets)
def run_state_block_bytes(q8):
    return 4 if q8 else 0


# heap bytes of a Model's run state that do not grow with the cache, from the shapes of
# its arrays (the objects' own headers not counted: heapmargin's measured correction
# covers them for the model it was measured with). Integer path: the packed group
# multipliers, the norm gains, the RoPE tables, exp2 and sigmoid tables, the int32 vectors;
# float path: the vectors, the kernels' row buffers
def run_state_fixed_bytes(cfg, layer_row, q8, word_bytes=4):
    d, hid, kvd, hd, v = cfg.dim, cfg.hidden_dim, cfg.kv_dim, cfg.head_dim, cfg.vocab_size
    if not q8:  # + the sliced softmax's per-head max and sum (kernels.Plain smax, ssum: 'd' arrays)
        return 4 * (4 * d + 2 * hid + 3 * kvd + v + 2 * hd) + 3 * layer_row + 2 * 8 * cfg.n_heads
    # the sliced matvec's views of each output at every unit's first row (qmodel.QForward._windows):
    # a memoryview object (4 words) and its list slot each
    ud = Q8_UNIT_MACS // d or 1
    uh = Q8_UNIT_MACS // hid or 1
    views = -(-d // ud) * 3 + -(-kvd // ud) * 2 + -(-hid // ud) * 2 + -(-d // uh) + -(-v // ud)
    groups = 0
    for name in ("token_embedding", "wcls") + ("wq", "wk", "wv", "wo", "w1", "w2", "w3"):
        if name == "wcls" and cfg.shared_classifier:
            continue
        rows, cols = cfg.matrix_shape(name)
        g = cfg.groups.get(name, cols) if cfg.groups else cols  # q8row: one group per row
        groups += (rows * cols // g) * (1 if name in ("token_embedding", "wcls") else cfg.n_layers)
    tables = 4 * (2 * cfg.n_layers + 1) * d + 2 * hd * (cfg.seq_len + 64) + 4 * (65 + 1025)
    return 4 * groups + tables + 4 * (5 * d + 2 * kvd + 2 * hid + 2 * v + 2 * hd) + layer_row + views * 5 * word_bytes


class Model:
    # a forward pass over weights with its K/V in cache (a kv.KVCache, or a CacheShape to
    # bind() a cache to later); all run state allocated here
    def __init__(self, weights, cache, backend="auto", rope="absolute"):
        cfg = weights.cfg
        lay = cache.layout
        if backend not in BACKENDS:
            raise ModelError("backend must be one of %s, got %r" % (", ".join(BACKENDS), backend))
        if rope not in ROPE_MODES:
            raise ModelError("rope must be one of %s, got %r" % (", ".join(ROPE_MODES), rope))
        if (lay.n_layers, lay.n_kv_heads, lay.head_dim) != (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim):
            raise ModelError("the KV layout (%d layers, %d kv heads, head_dim %d) does not match the model (%d, %d, %d)"
                             % (lay.n_layers, lay.n_kv_heads, lay.head_dim, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim))
        if backend == "auto":
            backend = auto_backend(weights, lay.dtype)
        self.cfg = cfg  # llama2c.Config (static)
        self.weights = weights  # llama2c.Weights (read-only)
        self.cache = cache  # kv.KVCache this model writes and reads
        self.shape = cache  # what the run state was made for (bind() takes any cache within it)
        self.backend = backend  # "numpy", "plain" or "q8"
        self.rope = rope  # "absolute" or "cache"
        self.q = None  # qmodel.QForward doing the work for backend "q8", else None
        self._status = OK  # last forward: the cache's reserve flags (>= 0) or a refusal (< 0)
        self.slicer = None  # Slicer bounding each slice of forward (decode.Session.task sets it), or None
        # the units of a sliced step: the integer path's (an int8 model with int8 KV: the
        # board runs qmodel.QForward), else the plain path's; the host's numpy backend
        # takes the units of the path the board would run, so the emulator slices as it does
        q8_units = backend == "q8" or (weights.dtype == "int8" and lay.dtype == "int8")
        self.unit_macs = Q8_UNIT_MACS if q8_units else 0  # 0: PLAIN_MACS a unit (_rows)
        # the plain path's attention unit: the query heads of att_kv K/V heads over one slot
        # (all of them while their MACs fit PLAIN_ATT_MACS); 0: the integer path's units
        rq = cfg.n_heads // cfg.n_kv_heads * cfg.head_dim
        self.att_kv = 0 if q8_units else max(1, min(cfg.n_kv_heads, PLAIN_ATT_MACS // rq))
        self.logit_frac_bits = None  # fixed-point logits: fractional bits (q8); None: floats
        if backend == "q8":
            qm = _qmodel()
            if qm is None:
                raise ModelError("backend q8 needs firmware_py/qmodel.py (QForward), which is not in this firmware yet")
            self.q = qm.QForward(weights, cache, rope)
            self.q.model = self  # its forward reads the slicer from here
            self.logits = self.q.logits  # array('i') of vocab_size fixed-point logits
            self.logit_frac_bits = self.q.logit_frac_bits
            return
        if backend == "numpy":
            if cache.__class__ is CacheShape:
                raise ModelError("backend numpy reads the arena at construction: give it the cache, not a CacheShape")
            np = compat.numpy()
            if np is None:
                raise ModelError("backend numpy needs numpy (CPython only)")
            self.k = kernels.Numpy(weights, cache, rope, np)  # the float kernels
        else:
            self.k = kernels.Plain(weights, cache, rope)
        kk = self.k
        d, hid, kvd = cfg.dim, cfg.hidden_dim, cfg.kv_dim
        # run state (run.c's RunState), floats of the backend (array('f') or numpy float32)
        self.x = kk.vec(d)  # (dim,) the residual stream
        self.xb = kk.vec(d)  # (dim,) normed input of attention / FFN; attention output
        self.xb2 = kk.vec(d)  # (dim,) wo / w2 output before the residual add
        self.hb = kk.vec(hid)  # (hidden_dim,) w1 x, then silu(w1 x) * w3 x
        self.hb2 = kk.vec(hid)  # (hidden_dim,) w3 x
        self.qv = kk.vec(d)  # (dim,) the query of every head
        self.kv = kk.vec(kvd)  # (kv_dim,) this token's key
        self.vv = kk.vec(kvd)  # (kv_dim,) this token's value
        self.logits = kk.vec(cfg.vocab_size)  # (vocab_size,) next-token logits (floats)
        # the attention scores (n_heads x max_slots) and the packed layer row live in
        # the kernels object (kernels.Plain.att / .row): they depend on the cache's layout

    # read and write cache from now on: the model was built on a CacheShape (or another
    # cache) that cache does not outgrow (same layout, no more slots or blocks per
    # sequence, h2o scores kept alike); ModelError otherwise, and nothing changes
    def bind(self, cache):
        was = self.shape
        lay, wl = cache.layout, was.layout
        if (lay.n_layers, lay.n_kv_heads, lay.head_dim, lay.dtype, lay.tokens_per_block) != \
                (wl.n_layers, wl.n_kv_heads, wl.head_dim, wl.dtype, wl.tokens_per_block):
            raise ModelError("bind: the cache's layout differs from the one the model was built for")
        if (cache.map_size > 0) != (was.map_size > 0):
            raise ModelError("bind: the cache %s h2o scores and the run state was built %s them" % (
                "keeps" if cache.map_size > 0 else "keeps no", "for" if was.map_size > 0 else "without"))
        if cache.max_slots > was.max_slots or cache.max_blocks > was.max_blocks:
            raise ModelError("bind: the cache (%d slots, %d blocks per sequence) outgrows the run state built for %d slots, %d blocks"
                             % (cache.max_slots, cache.max_blocks, was.max_slots, was.max_blocks))
        if self.backend == "numpy":
            raise ModelError("bind: backend numpy cannot be rebound (it views the arena it was built on)")
        self.cache = cache
        if self.q is not None:
            self.q.cache = cache
        else:
            self.k.cache = cache

    # status of the last forward: reserve's flags (>= 0) or the refusal that stopped it
    # (E_FULL: a full-policy budget is used up; E_NO_BLOCK; E_STALE; E_RANGE: pos is not
    # the sequence's next position; E_STATE: a write was refused)
    @property
    def status(self):
        return self.q.status if self.q is not None else self._status

    # one token through the model, one layer per step (a generator: `yield` between
    # layers; with a slicer, SLICE too inside a layer whenever the slice is spent); on
    # success self.logits holds the next-token logits; a refusal ends it early with
    # self.status < 0. O(params + n_cached x dim) per token
    def forward(self, h, token, pos):
        if self.q is not None:
            return self.q.forward(h, token, pos, self.slicer)
        if self.slicer is None:
            return self._whole(h, token, pos)
        return self._sliced(h, token, pos, self.slicer)

    def _whole(self, h, token, pos):
        c = self.cache
        k = self.k
        cfg = self.cfg
        w = self.weights
        if pos != c.length(h) or token < 0 or token >= cfg.vocab_size:
            self._status = E_RANGE if c.length(h) >= 0 else c.length(h)
            return
        slot = c.reserve(h)
        if slot < 0:
            self._status = slot
            return
        self._status = c.status
        n = c.cached(h)
        x, xb, xb2, hb, hb2, q, kv, vv = self.x, self.xb, self.xb2, self.hb, self.hb2, self.qv, self.kv, self.vv
        absolute = self.rope == "absolute"
        k.embed(x, token)
        k.rope_at(pos if absolute else n - 1)  # the query's angle: its position, or the newest rank
        for layer in range(cfg.n_layers):
            lw = w.layers[layer]
            k.rmsnorm(xb, x, lw.rms_att)
            k.matvec(q, lw.wq, xb)
            k.matvec(kv, lw.wk, xb)
            k.matvec(vv, lw.wv, xb)
            k.rope(q, cfg.n_heads)
            if absolute:
                k.rope(kv, cfg.n_kv_heads)  # stored rotated at its own position
            st = k.store(h, layer, kv, vv)
            if st != OK:
                self._status = st if st < 0 else E_STATE
                return
            if layer == 0:
                k.begin(h, n)  # after the first write: a copy on write has moved the block by now
            k.attention(xb, q, h, layer)
            k.matvec(xb2, lw.wo, xb)
            k.add(x, xb2)
            k.rmsnorm(xb, x, lw.rms_ffn)
            k.matvec(hb, lw.w1, xb)
            k.matvec(hb2, lw.w3, xb)
            k.silu_mul(hb, hb2)
            k.matvec(xb2, lw.w2, hb)
            k.add(x, xb2)
            yield
        k.end(h)
        k.rmsnorm(xb, x, w.rms_final)
        k.logits_of(self.logits, xb)

    # rows of a matvec per unit; 0: a row is more than a unit (the plain path: PLAIN_MACS
    # columns of one row a unit)
    def _rows(self, cols):
        if not self.unit_macs:
            return PLAIN_MACS // cols
        r = self.unit_macs // cols
        return r if r > 0 else 1

    # out = W x in units of rows (or of columns of a row), a look at the slice after each
    # (SLICE yielded when spent)
    def _mv(self, out, m, x, sl, in_layer):
        k = self.k
        rows = m.rows
        cols = m.cols
        n = self._rows(cols)
        if sl.ahead_call():
            yield SLICE
        if sl.step(U_CALL, in_layer, (n if n < rows else rows) * cols if n else PLAIN_MACS):  # b: its units' MACs, to foresee them
            yield SLICE
        if not n:
            for r in range(rows):
                c = 0
                while c < cols:
                    e = c + PLAIN_MACS if c + PLAIN_MACS < cols else cols
                    k.matvec_cols(out, m, x, r, c, e)
                    if sl.step(U_COLS, e - c, 1 if e == cols else 0):
                        yield SLICE
                    c = e
            return
        r = 0
        while r < rows:
            e = r + n if r + n < rows else rows
            k.matvec_rows(out, m, x, r, e)
            if sl.step(U_ROWS, e - r, cols):
                yield SLICE
            r = e

    # elementwise work in units of PLAIN_EL elements, rmsnorm's of half (the plain path; the integer path's
    # are one unit each): op 0 rmsnorm(out, x, off), 1 add(out, x), 2 silu_mul(out, x),
    # 3 rope of heads pairs of out; unit kind and count as the whole op's steps
    def _el(self, op, out, x, off, sl):
        k = self.k
        n = len(out) >> 1 if op == 3 else len(out)
        un = PLAIN_EL >> 1 if op == 3 or op == 0 else PLAIN_EL  # RoPE: pairs; rmsnorm: half (its element costs most)
        kind = U_NORM if op == 0 else (U_ELEM if op == 1 else (U_SILU if op == 2 else U_ROPE))
        for p in range(2 if op == 0 else 1):
            if (p == 1 or op != 0) and sl.ahead_unit(kind):
                yield SLICE
            i = 0
            while i < n:
                e = i + un if i + un < n else n
                if op == 0:
                    k.rmsnorm_part(out, x, off, p, i, e)
                elif op == 1:
                    k.add_part(out, x, i, e)
                elif op == 2:
                    k.silu_mul_part(out, x, i, e)
                else:
                    k.rope_part(out, i, e)
                if op == 0:
                    u = sl.step(U_NORM, e - i if p else 0, 0) if p else sl.step(U_NONE, 0, 0)
                elif op == 2:  # b 1: with the product (one step: the slicer sees the unit's whole time)
                    u = sl.step(U_SILU, e - i, 1)
                else:
                    u = sl.step(U_ROPE if op == 3 else U_ELEM, 2 * (e - i) if op == 3 else e - i, 0)
                if u:
                    yield SLICE
                i = e

    # attention in units of slots: the scores, the softmax, the values
    def _att(self, out, q, h, layer, n, sl):
        k = self.k
        if not self.att_kv:  # as the integer path's sliced step (qmodel.QForward.forward)
            k.att_scores(q, layer, 0, n)
            k.att_softmax()
            k.att_values(out, layer, 0, n)
            rs = sl.att_range(n, ATTH_SLOTS)
            if not rs:  # one attend call per query head: both passes over the slots
                hs = 2 * n
                for _ in range(self.cfg.n_heads):
                    if sl.ahead_h(hs):
                        yield SLICE
                    if sl.step(U_ATTH, hs, 0):
                        yield SLICE
                return
            t = self.cache.layout.tokens_per_block
            cb = rs // t if rs > t else 1  # blocks per range
            for _ in range(self.cfg.n_heads):  # each pass of each head over ranges of blocks
                for pas in (1, 2, 3):
                    k0 = 0
                    while k0 * t < n:
                        e = (k0 + cb) * t if (k0 + cb) * t < n else n
                        a = 0 if pas == 2 else e - k0 * t  # the exp pass is priced within the other two
                        if sl.ahead_r(a, pas):
                            yield SLICE
                        if sl.step(U_ATTH, a, pas):
                            yield SLICE
                        k0 += cb
            return
        gk = self.att_kv
        nkv = self.cfg.n_kv_heads
        rep = self.cfg.n_heads // nkv
        if sl.ahead(rep * (gk if gk < nkv else nkv)):
            yield SLICE
        for p in range(2):
            if p == 1:  # the softmax in units of SOFTMAX_SLOTS slots per pass (its time is in U_ATT's price)
                for sp in range(3):
                    s = 0
                    while s < n:
                        e = s + SOFTMAX_SLOTS if s + SOFTMAX_SLOTS < n else n
                        k.att_softmax_part(sp, s, e)
                        if sl.step(U_ATT, 0, 1):
                            yield SLICE
                        s = e
            for s in range(n):  # a slot's K/V heads in groups of gk, in order
                g = 0
                while g < nkv:
                    e = g + gk if g + gk < nkv else nkv
                    if p == 0:
                        k.att_scores(q, layer, s, s + 1, g, e)
                    else:
                        k.att_values(out, layer, s, s + 1, g, e)
                    if sl.step(U_ATT, (e - g) * rep, p):
                        yield SLICE
                    g = e

    # the plain path's store, embedding and per-token slot table in units (kernels.Plain's
    # *_part): PLAIN_EL elements (a quantized row group by group, its max pass then its
    # packing, each half the store's price), PLAIN_EL slots
    def _store(self, h, layer, sl):
        k = self.k
        kd = self.cfg.kv_dim
        both = k.store_scaled(0) and k.store_scaled(1)
        for which in (0, 1):
            x = self.vv if which else self.kv
            g = k.store_group(which)
            q = k.store_scaled(which)
            # the price: per element of K and V, each pass half of it; KIVI (V alone
            # quantized here, K copied for the cache's fold): V's passes all of it, K none
            f = 1 if both else (2 if q or not k.store_scaled(1 - which) else 0)
            for j in range(0, kd, g):
                for p in range(0 if q else 1, 2):
                    i = j
                    while i < j + g:
                        e = i + PLAIN_EL if i + PLAIN_EL < j + g else j + g
                        if i == 0 and sl.ahead_unit(U_KVW):
                            yield SLICE
                        k.store_part(x, which, p, i, e)
                        if sl.step(U_KVW, e - i if f else 0, 1 if f == 1 else 0):
                            yield SLICE
                        i = e
        return k.store_end(h, layer)

    def _begin(self, h, n, sl):
        k = self.k
        for p in range(4 if self.rope == "cache" else 1):
            # units: p 0 and 1 PLAIN_EL slots, p 2 PLAIN_EL merge moves, p 3 PLAIN_EL / 2 pairs
            u = PLAIN_EL >> 1 if p == 3 else PLAIN_EL
            kind = U_NONE if p == 0 else (U_RANK if p < 3 else U_ROPE)
            if p and sl.ahead_unit(kind):  # p 0 starts the step: nothing of its own to foresee (U_NONE's history is the memory pieces')
                yield SLICE
            m = kernels.begin_len(n, self.cfg.head_dim, p)
            s = 0
            while s < m or s == 0:
                e = s + u if s + u < m else m
                k.begin_part(h, n, p, s, e)
                # p 0 within the token's fixed price; p 1 a position read each, p 2 a comparison
                # each (at an elementwise op's price); p 3 a cos and a sin per pair
                if sl.step(kind, 0 if p == 0 else (e - s if p < 3 else 2 * (e - s)), 0):
                    yield SLICE
                if e >= m:
                    break
                s = e

    # forward with a slicer: the same operations as _whole, in units
    def _sliced(self, h, token, pos, sl):
        c = self.cache
        k = self.k
        cfg = self.cfg
        w = self.weights
        if pos != c.length(h) or token < 0 or token >= cfg.vocab_size:
            self._status = E_RANGE if c.length(h) >= 0 else c.length(h)
            return
        slot = c.reserve(h)
        if slot < 0:
            self._status = slot
            return
        self._status = c.status
        n = c.cached(h)
        x, xb, xb2, hb, hb2, q, kv, vv = self.x, self.xb, self.xb2, self.hb, self.hb2, self.qv, self.kv, self.vv
        absolute = self.rope == "absolute"
        d = cfg.dim
        hid = cfg.hidden_dim
        kvd = cfg.kv_dim
        plain = not self.unit_macs  # the plain path's elementwise work in units of PLAIN_EL (_el)
        if plain:
            i = 0
            while i < d:
                e = i + PLAIN_EL if i + PLAIN_EL < d else d
                k.embed_part(x, token, i, e)
                if sl.step(U_NONE, 0, 0):  # within the token's fixed price (it was unpriced whole)
                    yield SLICE
                i = e
        else:
            k.embed(x, token)
        k.rope_at(pos if absolute else n - 1)
        if not plain and not absolute:  # the integer path's rope "cache" ranks, in qmodel.QForward.forward's units
            u = RANK_CMP // n if n < RANK_CMP else 1
            j = 0
            while j < n:
                e = j + u if j + u < n else n
                if sl.step(U_RANK, (e - j) * n, 0):
                    yield SLICE
                j = e
        for layer in range(cfg.n_layers):
            lw = w.layers[layer]
            if plain:
                yield from self._el(0, xb, x, lw.rms_att, sl)
            else:
                k.rmsnorm(xb, x, lw.rms_att)
                if sl.step(U_NORM, d, 0):
                    yield SLICE
            yield from self._mv(q, lw.wq, xb, sl, 1)
            yield from self._mv(kv, lw.wk, xb, sl, 1)
            yield from self._mv(vv, lw.wv, xb, sl, 1)
            if plain:
                yield from self._el(3, q, None, 0, sl)
                if absolute:
                    yield from self._el(3, kv, None, 0, sl)
                else:  # rope "cache": the key's turn is at attention; priced here, as before, in PLAIN_EL units
                    i = 0
                    while i < kvd:
                        e = i + PLAIN_EL if i + PLAIN_EL < kvd else kvd
                        if sl.step(U_ROPE, e - i, 0):
                            yield SLICE
                        i = e
            else:
                k.rope(q, cfg.n_heads)
                if absolute:
                    k.rope(kv, cfg.n_kv_heads)
                if sl.step(U_ROPE, d + kvd, 0):
                    yield SLICE
            if plain:
                st = yield from self._store(h, layer, sl)
            else:
                st = k.store(h, layer, kv, vv)
            if st != OK:
                self._status = st if st < 0 else E_STATE
                return
            if plain:
                if layer == 0:
                    yield from self._begin(h, n, sl)
            else:
                if layer == 0:
                    k.begin(h, n)
                if sl.step(U_KVW, 2 * kvd, 0):
                    yield SLICE
            yield from self._att(xb, q, h, layer, n, sl)
            yield from self._mv(xb2, lw.wo, xb, sl, 1)
            if plain:
                yield from self._el(1, x, xb2, 0, sl)
                yield from self._el(0, xb, x, lw.rms_ffn, sl)
            else:
                k.add(x, xb2)
                k.rmsnorm(xb, x, lw.rms_ffn)
                if sl.step(U_NORM, d, 0) | sl.step(U_ELEM, d, 0):
                    yield SLICE
            yield from self._mv(hb, lw.w1, xb, sl, 1)
            yield from self._mv(hb2, lw.w3, xb, sl, 1)
            if plain:
                yield from self._el(2, hb, hb2, 0, sl)
            else:
                k.silu_mul(hb, hb2)
                if sl.step(U_SILU, hid, 0) | sl.step(U_ELEM, hid, 0):
                    yield SLICE
            yield from self._mv(xb2, lw.w2, hb, sl, 1)
            if plain:
                yield from self._el(1, x, xb2, 0, sl)
            else:
                k.add(x, xb2)
                if sl.step(U_ELEM, d, 0):
                    yield SLICE
            yield
        k.end(h)
        if plain:
            yield from self._el(0, xb, x, w.rms_final, sl)
        else:
            k.rmsnorm(xb, x, w.rms_final)
            if sl.step(U_NORM, d, 0):
                yield SLICE
        yield from self._mv(self.logits, w.wcls, xb, sl, 0)
