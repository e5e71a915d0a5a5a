# Text generation as a kernel task: boot (weights, tokenizer, pool sized by the
# budget rule, KV cache, model, sampler) once, then a decode task that prefills the
# prompt and samples new tokens, yielding between layers (Model.forward's steps) so
# other tasks keep their deadlines. The same code runs on CPython (host/generate.py),
# on the unix port (firmware_py/tools/generate.py) and on a board over the raw REPL:
#   from firmware_py import decode
#   decode.run("model.bin", "tokenizer.bin", "Once upon a time", 64)
# prints the text as it comes, then one summary line (decode.SUMMARY starts it).
import sys

from firmware_py import compat, kv, llama2c, pool, tokenizer
from firmware_py.compat import const
from firmware_py.model import Model
from firmware_py.sample import Sampler
from firmware_py.status import E_FULL, E_NO_BLOCK

# What a decoding firmware keeps besides weights, activations and the KV pool, measured
# on the unix port (docs/model.md): its modules compiled from source (113 KB live on
# 64-bit, 80 KB on 32-bit, plus the holes compiling leaves), the tokenizer (170 / 85 B
# per vocabulary token), the model's run state and the plain backend's float garbage
# between collections. kvlayout.BOOT_BYTES (128 KiB) is the reserve of a firmware that
# only boots the cache; a board profile's firmware_reserved_bytes overrides both.
FIRMWARE_BYTES = const(393216)  # modules + run state + boot transients + headroom
TOKEN_BYTES = const(192)  # tokenizer heap per vocabulary token (64-bit figure)

SUMMARY = "generate: "  # the summary line starts with this
STOP = "generate: stopped: "  # a clear stop (budget, context) starts with this


class DecodeError(ValueError):
    # a user's mistake found at boot (files, numbers, a budget too small); one line
    pass


class Session:
    # everything one generation needs, allocated at boot
    def __init__(self, model_path, tok_path, kv_dtype="fp32", policy="full", window=0, backend="auto",
                 rope="absolute", heap=0, temperature=0.0, top_p=1.0, seed=0, sinks=kv.SINKS, reserve=0):
        try:
            self.weights = llama2c.load(model_path)  # llama2c.Weights (read-only)
        except OSError:
            raise DecodeError("%s: cannot be read" % model_path)
        except llama2c.CheckpointError as e:
            raise DecodeError(str(e))
        cfg = self.weights.cfg
        self.cfg = cfg  # llama2c.Config
        try:
            lay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, kv_dtype)
        except kv.KVError as e:
            raise DecodeError(str(e))
        if policy not in kv.POLICIES:
            raise DecodeError("policy must be one of %s, got %r" % (", ".join(kv.POLICIES), policy))
        t = lay.tokens_per_block
        self.layout = lay  # kv.Layout
        self.policy = policy  # KV policy of the sequence
        self.heap = heap or _heap_total()  # the board's usable heap the pool is sized from (B)
        self.reserve = kv.boot_reserve(reserve or reserve_bytes(cfg))  # heap kept for the firmware (B)
        # the budget rule (kv.blocks_for: what host/budget.py computes in advance, given
        # this reserve as the board's firmware_reserved_bytes)
        avail = (self.heap - self.reserve - llama2c.read_config(model_path)[1] - cfg.activation_bytes()
                 - lay.row_bytes)
        fit = kv.blocks_for(avail, lay, 1, policy == "h2o")
        if policy == "full":
            if window:
                raise DecodeError("--window applies to the window, sinks and h2o policies, not full")
            ctx = (cfg.seq_len + t - 1) // t  # more blocks than the context would never be used
            n_blocks = fit if fit < ctx else ctx
            cap = n_blocks * t if n_blocks * t < cfg.seq_len else cfg.seq_len
            self.limit = "the KV budget (%d tokens in %d blocks of %d B)" % (cap, n_blocks, lay.block_bytes) \
                if n_blocks < ctx else "the model's context (seq_len %d)" % cfg.seq_len
        else:
            low = kv.min_budget(policy, sinks)
            if window < low:
                raise DecodeError("policy %s needs a window of at least %d token%s, got %d" % (policy, low, "" if low == 1 else "s", window))
            n_blocks = (window + t - 1) // t
            cap = window
            self.limit = ""
        if n_blocks < 1 or n_blocks > fit:
            raise DecodeError("the KV budget is too small: %d blocks of %d B fit in a heap of %d B, %s needs %d"
                              % (fit, lay.block_bytes, self.heap, "one token" if policy == "full" else "a window of %d" % window,
                                 n_blocks if n_blocks > 0 else 1))
        self.cap = cap  # tokens the sequence may cache
        compat.collect()  # the garbage of loading and compiling, before the largest allocation
        try:
            self.pool = pool.Pool(lay.block_bytes, n_blocks)  # the KV arena: n_blocks blocks
            self.cache = kv.KVCache(self.pool, lay, max_seqs=1, h2o=policy == "h2o")  # kv.KVCache
        except (pool.PoolError, MemoryError) as e:
            raise DecodeError("the KV pool of %d blocks of %d B does not fit: %s" % (n_blocks, lay.block_bytes, e))
        # the tokenizer's many small objects after the two large arenas (weights, pool)
        try:
            self.tok = tokenizer.load(tok_path, cfg.vocab_size)  # tokenizer.Tokenizer
        except tokenizer.TokenizerError as e:
            raise DecodeError(str(e))
        self.region = self.pool.add_region(n_blocks)  # the sequence's region (quota: all blocks)
        try:
            self.h = self.cache.open(self.region, policy, cap, sinks)  # sequence handle
        except kv.KVError as e:
            raise DecodeError(str(e))
        try:
            self.model = Model(self.weights, self.cache, backend, rope)  # the forward pass
            self.sampler = Sampler(cfg.vocab_size, temperature, top_p, seed)  # next-token choice
        except ValueError as e:
            raise DecodeError(str(e))
        self.tokens = None  # array('i') of the ids generated (the prompt excluded), sized by task()
        self.n_new = 0  # ids generated so far
        self.n_prompt = 0  # prompt ids (BOS included)
        self.stop = ""  # why decoding ended early ("" when it made all the tokens asked)
        self.t_start = 0  # ticks (µs) when the task started
        self.t_first = 0  # ticks when the first new token was picked
        self.t_end = 0  # ticks when the task ended
        self.layer_us = 0  # virtual µs charged per layer (VirtualClock runs; 0 on a real clock)
        self.on_token = None  # callable(session) after every new token, or None

    # prompt ids for text (BOS first); a full-policy prompt longer than the budget is refused
    def encode(self, text):
        ids = self.tok.encode(text, True, False)
        if self.policy == "full" and len(ids) > self.cap:
            # self.limit says which bound it is: the model's context or the KV budget
            fix = "shorten it" if self.limit.startswith("the model's context") else "raise the heap or use a window policy"
            raise DecodeError("the prompt is %d tokens, more than %s: %s" % (len(ids), self.limit, fix))
        return ids

    # the decode task (a generator for sched.Kernel): prefill ids, then up to n new
    # tokens, writing each piece with out(bytes) as it comes; yields between layers
    def task(self, kernel, ids, n, out):
        m = self.model
        h = self.h
        sampler = self.sampler
        tok = self.tok
        self.n_prompt = len(ids)
        self.tokens = compat.new_array("i", n)  # allocated once: nothing grows per token
        self.n_new = 0
        self.t_start = kernel.now()
        out(tok.decode(ids))
        feed = ids[0]  # the token going in at pos: the prompt's, then the last one picked
        pos = 0
        while self.n_new < n:
            for _ in m.forward(h, feed, pos):
                if self.layer_us:
                    kernel.charge(self.layer_us)
                yield
            st = m.status
            if st < 0:
                self.stop = "full" if st == E_FULL else "no_block" if st == E_NO_BLOCK else "status %d" % st
                break
            pos += 1
            if pos < len(ids):
                feed = ids[pos]
                continue
            nxt = sampler.pick(m.logits, m.logit_frac_bits)
            if not self.n_new:
                self.t_first = kernel.now()
            self.tokens[self.n_new] = nxt
            self.n_new += 1
            out(tok.piece(feed, nxt) if nxt != tokenizer.BOS else b"")  # BOS prints nothing, as decode()
            feed = nxt
            if self.on_token is not None:
                self.on_token(self)
        self.t_end = kernel.now()

    # the one summary line: tokens/s, time to first token, KV bytes, pool high-water
    def summary(self):
        p = self.pool
        n = self.n_new
        dt = compat.ticks_diff(self.t_end, self.t_first)
        rate = (n - 1) * 1e6 / dt if n > 1 and dt > 0 else 0.0
        ttft = compat.ticks_diff(self.t_first, self.t_start) / 1000.0 if n else 0.0
        cached = self.cache.cached(self.h)
        return ("%s%d tokens (%d prompt + %d new), %.1f tok/s, time to first token %.1f ms, KV %d B "
                "(%d cached x %d B, %s), pool high-water %d/%d blocks = %d B, heap free %s"
                % (SUMMARY, self.n_prompt + n, self.n_prompt, n, rate, ttft, cached * self.layout.kv_bytes_per_token,
                   cached, self.layout.kv_bytes_per_token, self.layout.dtype, p.high_water, p.n_blocks,
                   p.high_water * p.block_bytes, _free()))

    # the clear line for an early stop, or "" when decoding made every token asked
    def stop_line(self):
        if self.stop == "full":
            return "%s%s is reached after %d tokens (policy full)" % (STOP, self.limit, self.cache.length(self.h))
        if self.stop:
            return "%sthe cache refused a token (%s) after %d tokens" % (STOP, self.stop, self.cache.length(self.h))
        return ""


# heap a decoding firmware keeps for itself with model cfg (B): see FIRMWARE_BYTES
def reserve_bytes(cfg):
    return FIRMWARE_BYTES + TOKEN_BYTES * cfg.vocab_size


# the usable heap of this interpreter (B): free + allocated; CPython: the default board's
def _heap_total():
    free = compat.mem_free()
    if free is None:
        return DEFAULT_HEAP
    return free + compat.mem_alloc()


DEFAULT_HEAP = 8000000  # boards/esp32s3_n8r8.json micropython_heap_bytes, for CPython runs


# free heap now (after a collection), or "n/a" on CPython
def _free():
    compat.collect()
    f = compat.mem_free()
    return "n/a" if f is None else "%d B" % f


# write bytes to stdout at once (flushed: the text appears token by token)
def write_out(b):
    buf = getattr(sys.stdout, "buffer", None)
    if buf is not None:
        buf.write(b)
    else:
        sys.stdout.write(b.decode())
    fl = getattr(buf if buf is not None else sys.stdout, "flush", None)
    if fl is not None:
        fl()


# boot a Session, decode n tokens of prompt as a kernel task beside nothing else, print
# the text, the stop line if any, and the summary; returns the Session. DecodeError
# for a user's mistake (the caller prints it as one line)
def run(model_path, tok_path, prompt, n, out=write_out, clock=None, on_token=None, **opts):
    from firmware_py.clock import RealClock  # noqa: PLC0415
    from firmware_py.sched import Kernel  # noqa: PLC0415

    s = Session(model_path, tok_path, **opts)
    s.on_token = on_token
    ids = s.encode(prompt)
    k = Kernel(clock or RealClock(), max_tasks=4, verbose=True)
    t = k.spawn("decode", 1, s.task(k, ids, n, out))
    k.run()
    if t.exc is not None:
        raise t.exc
    out(b"\n")
    line = s.stop_line()
    if line:
        print(line)
    print(s.summary())
    return s
