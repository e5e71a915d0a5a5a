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


class Model:
    # a forward pass over weights with its K/V in cache; all run state allocated here
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
        self.backend = backend  # "numpy", "plain" or "q8"
        self.rope = rope  # "absolute" or "cache"
        self.q = None  # qmodel.QForward doing the work for backend "q8", else None
        self._status = OK  # last forward: the cache's reserve flags (>= 0) or a refusal (< 0)
        self.logit_frac_bits = None  # fixed-point logits: fractional bits (q8); None: floats
        if backend == "q8":
            qm = _qmodel()
            if qm is None:
                raise ModelError("backend q8 needs firmware_py/qmodel.py (QForward), which is not in this firmware yet")
            self.q = qm.QForward(weights, cache, rope)
            self.forward = self.q.forward  # its generator, unwrapped: no extra object per token
            self.logits = self.q.logits  # array('i') of vocab_size fixed-point logits
            self.logit_frac_bits = self.q.logit_frac_bits
            return
        if backend == "numpy":
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

    # status of the last forward: reserve's flags (>= 0) or the refusal that stopped it
    # (E_FULL: a full-policy budget is used up; E_NO_BLOCK; E_STALE; E_RANGE: pos is not
    # the sequence's next position; E_STATE: a write was refused)
    @property
    def status(self):
        return self.q.status if self.q is not None else self._status

    # one token through the model, one layer per step (a generator: `yield` between
    # layers); on success self.logits holds the next-token logits; a refusal ends it
    # early with self.status < 0. O(params + n_cached x dim) per token
    def forward(self, h, token, pos):
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
