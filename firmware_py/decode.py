# Text generation as a kernel task: boot (weights, tokenizer, pool sized by the
# budget rule, KV cache, model, sampler) once, then a decode task that prefills the
# prompt and samples new tokens, yielding between layers (Model.forward's steps) so
# other tasks keep their deadlines. The same code runs on CPython (host/generate.py),
# on the unix port (firmware_py/tools/generate.py) and on a board over the raw REPL:
#   from firmware_py import decode
#   decode.run("model.bin", "tokenizer.bin", "Once upon a time", 64)
# prints the text as it comes, then one summary line (decode.SUMMARY starts it).
import sys

from firmware_py import bandwidth, compat, heapmargin, kv, llama2c, pool, tokenizer
from firmware_py.clock import RealClock
from firmware_py.compat import const, ticks_diff
from firmware_py import model as fw_model
from firmware_py.model import Model
from firmware_py.slicer import SAMPLE_UNIT, U_NONE, U_SAMPLE, Slicer
from firmware_py import sample as sample_mod
from firmware_py.sample import Sampler, SamplerError
from firmware_py.sched import DONE, EventFlags, Kernel  # imported before the pool takes the heap: compiling it later may not fit
from firmware_py.status import E_FULL, E_NO_BLOCK, E_RANGE, OK

# What a decoding firmware keeps besides the weights and the KV pool is measured, not
# tuned: at boot (Session sizing "boot") it probes the heap after loading everything but
# the pool; the calculator predicts that probe from firmware_py/heapmargin.py's figures
# (`./kv heapmargin`: per word size and path, the firmware's own heap, the holes the
# boot leaves and the margin what runs after the boot needs), see docs/memory.md.
WORD_BYTES = 8 if sys.maxsize > 0xFFFFFFFF else 4  # this interpreter's machine word (the ESP32-S3: 4)
TOKEN_BYTES = const(192)  # tokenizer heap per vocabulary token (the 64-bit figure, for both): scales heapmargin's measured residual to another vocabulary
PROFILE = "board.json"  # the board profile `kv flash` writes beside main.py
MODEL_FILE = "model.bin"  # where `kv flash --model` puts the checkpoint on the board
TOKENIZER_FILE = "tokenizer.bin"  # ... and its tokenizer

MAX_CHATS = const(64)  # sequences one Session may be sized for (seqs)
# The longest the decode holds the CPU in one slice (µs) by default: the step yields
# inside a layer (slicer.Slicer) whenever its slice reaches this, on every backend. 2 ms
# fits the shipped scenarios' tightest deadline (sensor-gateway's IMU read: 5 ms) with
# room for the higher-priority tasks that run first; 0: unbounded (a layer per slice)
SLICE_US = const(2000)
SLICE_MAX_US = const(10000000)  # the largest slice_us accepted (10 s)
SIZINGS = ("auto", "boot", "rule")  # Session(sizing=...)
BOOT_GC_BYTES = const(16384)  # gc.threshold during the boot (see Session.__init__)
CHAT_BYTES = const(1024)  # a Chat's own object and lists besides its model and sampler (B)
ARENA_SLACK = const(64)  # bytes of the largest free piece the arena's allocation cannot use (GC block rounding)
SUMMARY = "generate: "  # the summary line starts with this
STOP = "generate: stopped: "  # a clear stop (budget, context) starts with this


class DecodeError(ValueError):
    # a user's mistake found at boot (files, numbers, a budget too small); one line
    pass


class Session:
    # everything one generation needs, allocated at boot (seqs > 1: the pool and the cache
    # for that many chats sharing one prompt prefix: see chat() and prefix_task())
    pos0 = 0  # the position the task's ids start at (a Chat: after the shared prefix)

    def __init__(self, model_path, tok_path, kv_dtype="fp32", policy="full", window=0, backend="auto",
                 rope="absolute", heap=0, temperature=0.0, top_p=1.0, seed=0, sinks=kv.SINKS, reserve=0, blocks=0,
                 word_bytes=0, seqs=1, slice_us=SLICE_US, sizing="auto", margin_for=("decode",),
                 cap_context=True, context="decode"):
        # heap: the usable heap the pool is sized from (0: the board profile's, else this
        # interpreter's); reserve: the profile's firmware_reserved_bytes (0: the profile's
        # or none); blocks: a fixed pool size that bypasses the rule (measurements only);
        # word_bytes: the word size the rule assumes (0: this interpreter's); seqs: the
        # sequences (chats) the pool and the cache are sized for (the budget rule's batch);
        # sizing: "boot" measures the heap after loading everything but the pool (MicroPython),
        # "rule" uses the calculator's rule, "auto": boot on MicroPython unless heap= or
        # blocks= is given; margin_for: what runs beside the decode after the boot, whose
        # measured allocations the boot keeps free (heapmargin.PARTS); cap_context False:
        # a full policy's pool is sized by memory alone, past the model's context; context:
        # the firmware whose footprint the calculator's rule takes (heapmargin.CONTEXTS; the
        # emulator's serving board: "serve" or "serve+tasks")
        # (measurements: tools/kvprobe.py size=boot)
        # the boot's garbage is collected every BOOT_GC_BYTES allocated, so that it never
        # spreads over the free heap and the lasting arrays land packed, not scattered
        # through it (measured: the integer path's tables left a 2 MB heap with 1.45 MB
        # free in pieces of 0.37 MB at most; at 16 KB the largest piece is within 17 KB of free)
        gc_was = compat.gc_threshold(BOOT_GC_BYTES)
        try:
            try:
                self.weights = llama2c.load(model_path)  # llama2c.Weights (read-only)
            except OSError:
                raise DecodeError("%s: cannot be read" % model_path)
            except llama2c.CheckpointError as e:
                raise DecodeError(str(e))
            cfg = self.weights.cfg
            self.cfg = cfg  # llama2c.Config
            if kv_dtype == "auto":  # what the weights' fastest path reads: int8 KV for int8 weights
                kv_dtype = "int8" if self.weights.dtype == "int8" else "fp32"
            if slice_us.__class__ is not int or not 0 <= slice_us <= SLICE_MAX_US:
                raise DecodeError("slice_us must be a whole number of µs in 0..%d (0: unbounded), got %r" % (SLICE_MAX_US, slice_us))
            self.slice_us = slice_us  # the longest slice the decode holds the CPU (µs; 0: unbounded)
            try:
                lay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, kv_dtype)
            except kv.KVError as e:
                raise DecodeError(str(e))
            if policy not in kv.POLICIES:
                raise DecodeError("policy must be one of %s, got %r" % (", ".join(kv.POLICIES), policy))
            t = lay.tokens_per_block
            self.layout = lay  # kv.Layout
            self.policy = policy  # KV policy of the sequence
            self.heap, fw = board_heap(heap, reserve)  # usable heap the pool is sized from (B), profile's reserve
            # the calculator's rule (budget_blocks: what host/budget.py computes in advance)
            q8 = compat.IS_MICROPYTHON and uses_q8(backend, self.weights.dtype == "int8", kv_dtype)
            if seqs.__class__ is not int or not 1 <= seqs <= MAX_CHATS:
                raise DecodeError("seqs must be an int in 1..%d, got %r" % (MAX_CHATS, seqs))
            if sizing not in SIZINGS:
                raise DecodeError("sizing must be one of %s, got %r" % (", ".join(SIZINGS), sizing))
            self.seqs = seqs  # sequences the pool and the cache are sized for
            word = word_bytes or WORD_BYTES
            if context not in heapmargin.CONTEXTS:
                raise DecodeError("context must be one of %s, got %r" % (", ".join(heapmargin.CONTEXTS), context))
            self.reserve, fit = budget_blocks(self.heap, cfg, self.weights.nbytes, lay, fw, policy == "h2o", seqs, word, q8,
                                              context, rope)
            self.fit_blocks = fit  # KV blocks the calculator's rule gives this heap (its pool_blocks)
            if sizing == "auto":
                sizing = "boot" if not blocks and not heap else "rule"
            if sizing == "boot" and not compat.IS_MICROPYTHON:
                sizing = "rule"  # CPython has no fixed heap to measure: the calculator's figure
            if blocks:
                sizing = "fixed"
            self.sizing = sizing  # "boot": measured after loading; "rule": the calculator's; "fixed": blocks=
            self.cap_context = cap_context  # a full policy's pool stops at the model's context
            h2o = policy == "h2o"
            ctx = (cfg.seq_len + t - 1) // t  # more blocks than the context would never be used (per sequence)
            if policy == "full":
                if window:
                    raise DecodeError("--window applies to the window, sinks and h2o policies, not full")
            else:
                low = kv.min_budget(policy, sinks)
                if window < low:
                    raise DecodeError("policy %s needs a window of at least %d token%s, got %d" % (policy, low, "" if low == 1 else "s", window))
            if backend == "q8" or (backend == "auto" and fw_model.auto_backend(self.weights, kv_dtype) == "q8"):
                fw_model._qmodel()  # compile the integer path now: its code is part of what the boot measures
            # everything but the pool, the cache and the other chats' run state, before the
            # heap is measured: the tokenizer's many small objects, the sampler, the model's
            # run state (on a CacheShape; its tables' transients are collected before the probe)
            try:
                self.tok = tokenizer.load(tok_path, cfg.vocab_size)  # tokenizer.Tokenizer
                compat.collect()
                a0 = compat.mem_alloc()
                self.sampler = Sampler(cfg.vocab_size, temperature, top_p, seed)  # next-token choice
                self.sampler_bytes = compat.mem_alloc() - a0 if a0 is not None else 0  # each chat makes one (B)
            except tokenizer.TokenizerError as e:
                raise DecodeError(str(e))
            except ValueError as e:
                raise DecodeError(str(e))
            except MemoryError:
                raise DecodeError("the heap ran out loading the tokenizer (%d B free): the heap of %d B is too small for this model"
                                  % (compat.mem_free() or 0, self.heap))
            self.margin = 0  # heap kept free for what runs after the boot (B; sizing "boot")
            self.margin_parts = ()  # ((part, bytes, spread), ...) it is made of
            self.heap_free = self.heap_largest = self.heap_free0 = -1  # the boot probe's figures (B; -1: not measured)
            if sizing == "boot":
                try:  # the interpreter measured is this one: its own word size's figures
                    self.margin, self.margin_parts = heapmargin.margin(WORD_BYTES, q8, margin_for)
                except ValueError as e:
                    raise DecodeError(str(e))
                compat.collect()
                self.heap_free0 = compat.mem_free()  # free before the model's run state (B)
                plan = self._blocks(policy, window, seqs, ctx, t, (self.heap_free0 - self.margin) // plan_bytes(cfg, lay, seqs, h2o, q8, rope))
            else:
                plan = self._blocks(policy, window, seqs, ctx, t, fit if not blocks else blocks)
            n_blocks, per_seq, _ = plan
            self.plan_blocks = n_blocks  # blocks the run state is made for
            if n_blocks < 1 or (sizing != "boot" and n_blocks > (fit if not blocks else blocks)):
                self._too_small(fit, lay, policy, window, n_blocks)
            compat.collect()
            alloc0 = compat.mem_alloc()
            # the run state sized for the planned pool (the boot pool is at most that), before
            # the pool; numpy (CPython only) views the arena, so it is made after
            late = (backend if backend != "auto" else fw_model.auto_backend(self.weights, kv_dtype)) == "numpy"
            self.model = None if late else self._model(fw_model.CacheShape(lay, per_seq * t, per_seq, h2o), backend, rope)
            compat.collect()
            self.model_bytes = (compat.mem_alloc() - alloc0) if alloc0 is not None else 0  # its run state, measured (B)
            if sizing == "boot":
                free, largest = compat.heap_probe()
                self.heap_free, self.heap_largest = free, largest
                # KV blocks the measured heap gives, and what limits them (boot_blocks)
                self.boot_fit, self.boot_limit = boot_blocks(free, largest, self.margin, lay, seqs, h2o,
                                                             (seqs - 1) * (self.model_bytes + self.sampler_bytes + CHAT_BYTES))
                if self.boot_fit > n_blocks and policy == "full":  # the run state was made for the plan
                    self.boot_fit = n_blocks
                    self.boot_limit = "the model's context" if n_blocks == seqs * ctx and cap_context else "the planned run state"
                if policy != "full":
                    self.boot_limit = "the window (the heap holds %d blocks)" % self.boot_fit
                got = self._blocks(policy, window, seqs, ctx, t, self.boot_fit if self.boot_fit > 0 else 0)
                if got[0] < 1 or got[0] > self.boot_fit or got[1] > per_seq:
                    self._too_small(self.boot_fit, lay, policy, window, got[0] if got[0] < n_blocks else n_blocks)
                n_blocks, per_seq, _ = got
            else:
                self.boot_fit = -1
                self.boot_limit = ""
            n_blocks, per_seq, cap = self._blocks(policy, window, seqs, ctx, t, n_blocks, fixed=True)
            self.limit = ("the KV budget (%d tokens in %d blocks of %d B)" % (cap, per_seq, lay.block_bytes)
                          if per_seq * t < cfg.seq_len or not cap_context else "the model's context (seq_len %d)" % cfg.seq_len) \
                if policy == "full" else ""
            self.cap = cap  # tokens the sequence may cache
            try:
                self.pool = pool.Pool(lay.block_bytes, n_blocks)  # the KV arena: n_blocks blocks
                # one sequence per chat; each table holds at most per_seq blocks (seqs 1: all)
                self.cache = kv.KVCache(self.pool, lay, max_seqs=seqs, max_blocks_per_seq=per_seq, h2o=h2o)
            except (pool.PoolError, MemoryError) as e:
                raise DecodeError("the KV pool of %d blocks of %d B does not fit (%s: %s)" % (n_blocks, lay.block_bytes, type(e).__name__, e))
            if self.model is None:
                self.model = self._model(self.cache, backend, rope)
            else:
                try:
                    self.model.bind(self.cache)
                except ValueError as e:
                    raise DecodeError(str(e))
            compat.collect()
            self.region = self.pool.add_region(n_blocks)  # the sequence's region (quota: all blocks)
            try:
                self.h = self.cache.open(self.region, policy, cap, sinks)  # sequence handle
            except kv.KVError as e:
                raise DecodeError(str(e))
        finally:
            # back to what it was; an entry script's own boot setting (main.py and the tools
            # collect their imports' garbage the same way) ends with the boot: a threshold
            # left on would collect the whole heap every 16 KB of a float decode's garbage
            compat.gc_threshold(-1 if gc_was == BOOT_GC_BYTES else gc_was)
        self.tokens = None  # array('i') of the ids generated (the prompt excluded), sized by task()
        self.n_new = 0  # ids generated so far
        self.n_prompt = 0  # prompt ids (BOS included)
        # snapshots (firmware_py/snapshot.py): the token to feed next (-1: none, -2: a task runs),
        # the last request's ids, the conversation's earlier ids (u16 bytes) and how many it dropped
        self.pending = -1
        self.pend_pos = 0  # the position the pending token goes to (the sequence's length then)
        self.last_ids = None
        self.snap_tokens = None
        self.snap_dropped = 0
        self.model_path = model_path
        self.tok_path = tok_path
        self.stop = ""  # why decoding ended early ("" when it made all the tokens asked)
        self.stop_why = ""  # the sampler's one line when stop is "sampler"
        self.stop_n = 0  # stop "tokens": the tokens the request asked for
        self.t_start = 0  # ticks (µs) when the task started
        self.t_first = 0  # ticks when the first new token was picked
        self.t_end = 0  # ticks when the task ended
        self.layer_us = 0  # virtual µs charged per layer (VirtualClock runs; 0 on a real clock)
        self.on_token = None  # callable(session) after every new token, or None
        self.traffic = None  # bandwidth.DecodeTraffic charged per layer (traffic_for), or None: none
        # the compute charged to the clock (VirtualClock runs), or None: an object with
        # layer_us(n_kv) (µs of one layer's compute with n_kv cached tokens, the new one
        # included) and final_us() (the final norm, classifier and sampling), both ints;
        # host/emulate.py sets it from the board's CPU cost model (firmware_py/cpucost.py)
        self.cpu = None
        # bandwidth-aware option (with a traffic): > 0 moves each layer's traffic (and the
        # final's) in pieces of at most this many bytes, admitted per piece when the
        # traffic admits, each priced and charged to the clock on its own, with a yield
        # between pieces, so that higher-priority tasks (audio, the DMA engine) run within
        # one piece's time instead of one layer's; 0: each layer's traffic in one go
        self.piece_bytes = 0
        self._pb = 0  # the piece size task() moves the traffic in (piece_bytes, or one that fits half a slice)
        self.slicer = None  # the slicer.Slicer (or cpucost.Meter) of the running task, or None
        self.pieces = 0  # pieces moved so far (piece_bytes > 0)
        self._ns = 0  # sub-µs remainder of the pieces' priced ns, carried to the next piece
        self.carried_us = 0  # µs the carried remainders added to the pieces' time (the tier's own busy time lacks them)
        self.thermal = None  # thermal.Guard: after each new token the task sleeps guard.pause_us(its time), or None
        self.thermal_pauses = 0  # tokens after which the guard made the task sleep
        self.thermal_pause_us = 0  # µs slept for the guard in all (saturates at 2**30 - 1)
        # chats (seqs > 1, or one chat on seqs 1): see chat() and prefix_task()
        self.backend = backend  # each chat's Model is made with these
        self.rope = rope
        self.opts = (temperature, top_p, seed)  # a chat's sampler defaults
        self.chats = []  # Chat objects, in the order chat() made them
        self.ready = None  # sched.EventFlags set (bit 1) when the prefix is in and the chats forked
        self.prefix_gen = None  # the generator prefix_task() returned
        self.prefix_done = False  # the prefix task has ended (the chats may go on)
        self.n_shared = 0  # prefix tokens cached once and shared by every chat
        self.shared_blocks = 0  # pool blocks the prefix filled (shared by every chat)

    # the forward pass (chat 0's too) over cache (a kv.KVCache or a model.CacheShape)
    def _model(self, cache, backend, rope):
        try:
            return Model(self.weights, cache, backend, rope)
        except ValueError as e:
            raise DecodeError(str(e))
        except MemoryError:
            raise DecodeError("the heap ran out building the model's run state (%d B free): the heap of %d B is too small for "
                              "this model and interpreter" % (compat.mem_free() or 0, self.heap))

    # (blocks of the pool, blocks one sequence may hold, tokens it may cache) for a pool of
    # at most `avail` blocks: a full policy takes what is there up to every chat's context
    # (fixed: exactly avail), a ring its window per chat (each may come to own its whole
    # ring: copy-on-write)
    def _blocks(self, policy, window, seqs, ctx, t, avail, fixed=False):
        seq_len = self.cfg.seq_len
        if policy == "full":
            n = avail if fixed or avail < seqs * ctx or self.sizing == "fixed" or not self.cap_context else seqs * ctx
            per_seq = n if seqs == 1 or n < ctx else ctx  # all of them with one sequence, else at most its context
            cap = per_seq * t if per_seq * t < seq_len or self.sizing == "fixed" or not self.cap_context else seq_len
            return n, per_seq, cap
        per_seq = (window + t - 1) // t
        return seqs * per_seq, per_seq, window

    def _too_small(self, fit, lay, policy, window, need):
        if self.sizing == "boot" and self.heap_free >= 0:
            raise DecodeError("the KV budget is too small: %d blocks of %d B fit in the heap measured at boot (%d B free, largest "
                              "block %d B, margin %d B), %s needs %d block%s"
                              % (fit if fit > 0 else 0, lay.block_bytes, self.heap_free, self.heap_largest, self.margin,
                                 "one token" if policy == "full" else "a window of %d" % window, need if need > 0 else 1,
                                 "s" if need > 1 else ""))
        raise DecodeError("the KV budget is too small: %d blocks of %d B fit in a heap of %d B (weights %d, reserve %d), %s needs %d"
                          " block%s"
                          % (fit if fit > 0 else 0, lay.block_bytes, self.heap, self.weights.nbytes,
                             self.margin if self.sizing == "boot" else self.reserve,
                             "one token" if policy == "full" else "a window of %d" % window, need if need > 0 else 1,
                             "s" if need > 1 else ""))

    # the boot report's sizing line: how the pool was sized and from what
    def boot_line(self):
        p = self.pool
        t = self.layout.tokens_per_block
        if self.sizing == "boot":
            parts = ", ".join("%s %d +- %d" % x for x in self.margin_parts)
            idf = compat.idf_heap()  # on a board: ESP-IDF's heap outside the GC heap, which MicroPython may grow into
            return ("boot: heap free %d B, largest block %d B, margin %d B (%s), pool %d blocks of %d B = %d tokens (limited by %s)%s"
                    % (self.heap_free, self.heap_largest, self.margin, parts, p.n_blocks, p.block_bytes, p.n_blocks * t,
                       self.boot_limit, "; ESP-IDF heap free %d B, largest %d B (not counted)" % (idf[1], idf[2]) if idf else ""))
        return ("boot: pool %d blocks of %d B = %d tokens (%s)" % (p.n_blocks, p.block_bytes, p.n_blocks * t,
                "blocks=%d given" % p.n_blocks if self.sizing == "fixed" else
                "the calculator's rule: heap %d B, reserve %d B" % (self.heap, self.reserve)))

    # prompt ids for text (BOS first); a full-policy prompt longer than the budget is refused
    def encode(self, text):
        ids = self.tok.encode(text, True, False)
        if self.policy == "full" and len(ids) > self.cap:
            # self.limit says which bound it is: the model's context or the KV budget
            fix = "shorten it" if self.limit.startswith("the model's context") else "raise the heap or use a window policy"
            raise DecodeError("the prompt is %d tokens, more than %s: %s" % (len(ids), self.limit, fix))
        return ids

    # --- chats sharing this Session's pool, cache, weights and tokenizer --------------------
    #   s = Session(model, tok, seqs=2)                      # pool and cache for two chats
    #   a = s.chat(" Tom asked", seed=1); b = s.chat(" Sue said", seed=2)
    #   p = k.spawn("prefix", 2, s.prefix_task(k, s.encode("Once upon a time")))
    #   k.spawn("chat0", 1, a.task(k, 32, out)); k.spawn("chat1", 1, b.task(k, 32, out))
    # The prefix is fed once into the first chat's sequence; every other chat forks it
    # (kv fork: the prefix's blocks shared, reference counted, copied on a chat's first
    # write into one), then each feeds its own text and samples its own tokens with its own
    # Model run state and Sampler, interleaved by the kernel between layers.

    # a new chat (boot: its Model and Sampler are allocated here) whose own text follows the
    # shared prefix (tokenized without BOS; "" for none); temperature / top_p / seed: its
    # sampler's (None: the Session's). DecodeError past seqs chats or once the prefix task
    # was made
    def chat(self, text="", temperature=None, top_p=None, seed=None):
        if len(self.chats) >= self.seqs:
            raise DecodeError("the Session was sized for %d chat%s (seqs=%d): boot it with more" % (self.seqs, "" if self.seqs == 1 else "s", self.seqs))
        if self.ready is not None:
            raise DecodeError("chats must be made before prefix_task()")
        c = Chat(self, len(self.chats), text, self.opts[0] if temperature is None else temperature,
                 self.opts[1] if top_p is None else top_p, self.opts[2] if seed is None else seed)
        self.chats.append(c)
        return c

    # the prefix task (a generator for sched.Kernel; spawn it before or beside the chats,
    # at a priority at least theirs): feeds ids (self.encode(prefix): BOS first) but the
    # last into the first chat's sequence, forks that sequence for every other chat, then
    # lets the chats go on; each chat feeds the prefix's last token and its own text
    # itself (so a chat with no text of its own still has logits to sample from). out:
    # callable(bytes) for the prefix's text, or None. DecodeError (at the call) without
    # chats, or a chat whose prompt would pass a full policy's budget
    def prefix_task(self, kernel, ids, out=None):
        if not self.chats:
            raise DecodeError("no chats: make them with chat() before prefix_task()")
        if self.ready is not None:
            raise DecodeError("prefix_task() was already made")
        if not ids:
            raise DecodeError("the prefix must hold at least BOS (use encode())")
        for c in self.chats:
            n = len(ids) + len(c.own)
            if self.policy == "full" and n > self.cap:
                raise DecodeError("chat %d's prompt is %d tokens (prefix %d + its own %d), more than %s"
                                  % (c.index, n, len(ids), len(c.own), self.limit))
            c.ids = ids[-1:] + c.own
            c.pos0 = len(ids) - 1
        self.ready = EventFlags(kernel)
        self.prefix_gen = self._prefix(kernel, ids, out if out is not None else _discard)
        return self.prefix_gen

    # the prefix task runs (or will) on kernel: its generator is a live task there
    def prefix_spawned(self, kernel):
        for t in kernel.tasks:
            if t is not None and t.gen is self.prefix_gen:
                return t.state < DONE
        return False

    def _prefix(self, kernel, ids, out):
        if len(ids) > 1:
            yield from self.task(kernel, ids[:-1], 1, out, True)
        else:
            self.t_start = self.t_end = kernel.now()
        self.fork_chats()

    # the prefix is in self.h (fed by the prefix task, or restored: snapshot.resume_prefix):
    # chat 0 goes on in it, every other chat forks it; then the chats go on
    def fork_chats(self):
        self.n_shared = self.cache.length(self.h) if not self.stop else 0
        self.shared_blocks = self.pool.blocks_used
        for c in self.chats:
            if self.stop:  # the prefix itself did not fit: every chat stops with its reason
                c.stop = self.stop
            elif c.index == 0:
                c.h = self.h
            else:
                h = self.cache.fork(self.h)
                if h < 0:
                    c.stop = "fork %d" % h
                else:
                    c.h = h
        self.prefix_done = True
        self.ready.set(1)

    # what the chats share and what they used (allocates: reporting only)
    def chats_report(self):
        p = self.pool
        return {"chats": len(self.chats), "shared_tokens": self.n_shared, "shared_blocks": self.shared_blocks,
                "prefix_us": compat.ticks_diff(self.t_end, self.t_start) if self.prefix_done else 0,
                "pool_blocks": p.n_blocks, "pool_high_water": p.high_water,
                "pool_high_water_bytes": p.high_water * p.block_bytes, "blocks_used": p.blocks_used,
                "stop": self.stop}

    # the decode task (a generator for sched.Kernel): prefill ids, then up to n new
    # tokens, writing each piece with out(bytes) as it comes; yields between layers.
    # prefill: only feed ids (no token picked: the shared prefix of chats)
    def task(self, kernel, ids, n, out, prefill=False):
        m = self.model
        h = self.h
        sampler = self.sampler
        tok = self.tok
        pos0 = self.pos0
        self.n_prompt = pos0 + len(ids)
        self.n_new = 0
        was = getattr(self, "pending", -1)  # (a Chat has none before its first task)
        self.pending = -2  # running (snapshot.RUNNING) until the loop ends
        self.stop = ""  # a Session serve reuses: the last request's stop is not this one's
        self.stop_why = ""
        self.t_start = kernel.now()
        # the request's token array is made now, after the boot: it must leave the margin free
        compat.collect()  # mem_free() counts garbage as taken until a collection
        free = compat.mem_free()
        if free is not None and free - 4 * n - 64 < self.margin:
            self.pending = was  # nothing fed: the sequence is as it was
            self.tokens = compat.new_array("i", 0)
            self.stop = "tokens"
            self.stop_n = n
            self.t_first = self.t_end = self.t_start
            return
        self.tokens = compat.new_array("i", n)  # allocated once: nothing grows per token
        self.last_ids = ids  # what this request feeds (snapshot.py keeps the conversation's ids)
        if not pos0:
            self.snap_tokens = None  # a new conversation
        out(tok.decode(ids) if not pos0 else tok.decode(ids[1:], ids[0]))  # a chat: ids[0] is the prefix's, printed there
        feed = ids[0]  # the token going in at pos: the prompt's, then the last one picked
        pos = pos0
        tr = self.traffic
        cpu = self.cpu
        cache = self.cache
        t_tok = self.t_start  # when the token being made began (the thermal guard's pause is a share of its time)
        # the slice bound: with a cost model (the emulator) its metered slicer, which charges
        # each unit of the step to the virtual clock; else a Slicer on the kernel's clock
        sl = None
        if cpu is not None:
            sl = cpu.meter(kernel, self.slice_us)
        elif self.slice_us > 0:
            sl = Slicer(kernel, self.slice_us)
        self.slicer = sl
        m.slicer = sl
        pb = self.piece_bytes
        if sl is not None and sl.us > 0 and tr is not None and tr.charge_time:
            # the memory time charged to a virtual clock in pieces that fit half a slice
            most = tr.bw.bw[tr.w_tier] * (sl.us // 2) // 1000000
            if most < 64:
                most = 64
            if pb <= 0 or pb > most:
                pb = most
        self._pb = pb
        while self.n_new < n:
            for y in m.forward(h, feed, pos):
                if y:  # the slice is spent inside the layer: let whoever is due run
                    yield
                    continue
                if self.layer_us:
                    kernel.charge(self.layer_us)
                if sl is not None and sl.step(U_NONE, 0, 0):
                    yield  # before the layer's memory traffic: the slice is spent
                if tr is not None and pb > 0:
                    c = cache.cached(h)  # the new token's row included
                    for i in range(3):
                        if i == 0:
                            tier, cat, kind, left = tr.w_tier, bandwidth.WEIGHTS, tr.w_kind, tr.layer_w
                        elif i == 1:
                            tier, cat, kind, left = tr.kv_tier, bandwidth.KV_WRITE, bandwidth.K_WRITE, tr.row
                        else:
                            tier, cat, kind, left = tr.kv_tier, bandwidth.KV_READ, tr.kv_kind, c * tr.row
                        while left > 0:
                            p = self._piece_size(tr, tier, cat, left, tr.row if i == 2 else 1)
                            rv = E_RANGE
                            if tr.admit:
                                rv = yield tr.bw.admit(tier, cat, p)
                                if rv == E_FULL:  # booked a whole window ahead by others: try again after it
                                    yield kernel.sleep_us(tr.bw.window_us)
                                    continue
                            if sl is not None and tr.charge_time and sl.ahead_us(tr.bw.cost_us(tier, kind, p)):
                                yield  # the piece would pass the slice bound: after whoever is due
                            us = self._move_piece(tr, tier, cat, kind, p, rv == OK)
                            if tr.charge_time and us > 0:
                                kernel.charge(us)
                            if sl is not None:
                                sl.step(U_NONE, 0, 0)  # the piece is a unit the slicer sees
                            left -= p
                            if left > 0 or i < 2:
                                yield  # between pieces: whoever is due runs now
                elif tr is not None:
                    c = cache.cached(h)  # the new token's row included
                    if tr.admit:  # each piece waits for its category's room first
                        for i in range(3):
                            if i == 0:
                                tier, cat, left = tr.w_tier, bandwidth.WEIGHTS, tr.layer_w
                            elif i == 1:
                                tier, cat, left = tr.kv_tier, bandwidth.KV_WRITE, tr.row
                            else:
                                tier, cat, left = tr.kv_tier, bandwidth.KV_READ, c * tr.row
                            most = tr.bw.piece(tier, cat)
                            while left > 0:
                                p = left if left < most else most
                                rv = (yield tr.bw.admit(tier, cat, p)) if p > 0 else E_RANGE
                                if rv == E_FULL:  # booked a whole window ahead by others: try again after it
                                    yield kernel.sleep_us(tr.bw.window_us)
                                    continue
                                if rv < 0:  # not admissible (a zero budget): counted without admission
                                    tr.bw.charge(tier, cat, left)
                                    left = 0
                                else:
                                    left -= p
                    us = tr.layer(c, tr.admit)
                    if tr.charge_time and us > 0:
                        kernel.charge(us)
                yield
            st = m.status
            if st < 0:
                self.stop = "full" if st == E_FULL else "no_block" if st == E_NO_BLOCK else "status %d" % st
                break
            if sl is not None and sl.step(U_NONE, 0, 0):
                yield  # before the final's memory traffic: the slice is spent
            if tr is not None and pb > 0:
                left = tr.final_w
                while left > 0:
                    p = self._piece_size(tr, tr.w_tier, bandwidth.WEIGHTS, left, 1)
                    rv = E_RANGE
                    if tr.admit:
                        rv = yield tr.bw.admit(tr.w_tier, bandwidth.WEIGHTS, p)
                        if rv == E_FULL:
                            yield kernel.sleep_us(tr.bw.window_us)
                            continue
                    if sl is not None and tr.charge_time and sl.ahead_us(tr.bw.cost_us(tr.w_tier, tr.w_kind, p)):
                        yield  # the piece would pass the slice bound: after whoever is due
                    us = self._move_piece(tr, tr.w_tier, bandwidth.WEIGHTS, tr.w_kind, p, rv == OK, True)
                    if tr.charge_time and us > 0:
                        kernel.charge(us)
                    left -= p
                    if left > 0:
                        yield
                    elif sl is not None and sl.step(U_NONE, 0, 0):  # the last piece: a unit the slicer sees
                        yield
            elif tr is not None:
                if tr.admit:
                    left = tr.final_w
                    most = tr.bw.piece(tr.w_tier, bandwidth.WEIGHTS)
                    while left > 0:
                        p = left if left < most else most
                        rv = (yield tr.bw.admit(tr.w_tier, bandwidth.WEIGHTS, p)) if p > 0 else E_RANGE
                        if rv == E_FULL:
                            yield kernel.sleep_us(tr.bw.window_us)
                            continue
                        if rv < 0:
                            tr.bw.charge(tr.w_tier, bandwidth.WEIGHTS, left)
                            left = 0
                        else:
                            left -= p
                us = tr.final(tr.admit)
                if tr.charge_time and us > 0:
                    kernel.charge(us)
            pos += 1
            if pos - pos0 < len(ids):
                feed = ids[pos - pos0]
                continue
            if prefill:
                break
            if sl is None:
                try:
                    nxt = sampler.pick(m.logits, m.logit_frac_bits)
                except SamplerError as e:  # a non-finite logit: the decode stops with one line
                    self.stop = "sampler"
                    self.stop_why = str(e)
                    break
            else:  # the pick in units of SAMPLE_UNIT steps, the slice looked at after each
                lg = m.logits
                fb = m.logit_frac_bits
                sampler.start(lg)
                nxt = -1
                while True:
                    if sl.ahead_unit(U_SAMPLE):  # the next part would pass the slice: yield first
                        yield
                    try:
                        nxt = sampler.run(lg, fb, SAMPLE_UNIT)
                    except SamplerError as e:  # a non-finite logit: the decode stops with one line
                        self.stop = "sampler"
                        self.stop_why = str(e)
                        break
                    if sl.step(U_SAMPLE, sampler.el, 0):
                        yield
                    if nxt >= 0:
                        break
                if nxt < 0:
                    break
            if not self.n_new:
                self.t_first = kernel.now()
            self.tokens[self.n_new] = nxt
            self.n_new += 1
            out(tok.piece(feed, nxt) if nxt != tokenizer.BOS else b"")  # BOS prints nothing, as decode()
            feed = nxt
            if self.on_token is not None:
                self.on_token(self)
            g = self.thermal
            if g is not None:
                now = kernel.now()
                d = g.pause_us(ticks_diff(now, t_tok))
                if d > 0:  # hot: slow down by sleeping a share of the token's time (the CPU idles)
                    self.thermal_pauses += 1
                    us = self.thermal_pause_us + d
                    self.thermal_pause_us = us if us < 0x3FFFFFFF else 0x3FFFFFFF
                    yield kernel.sleep_us(d)
                t_tok = kernel.now()
        # the token the sequence goes on with (snapshot.py): the last pick, or the one a
        # refused step could not take; -1 when the sequence has taken it already
        self.pending = feed if cache.length(h) == pos and not prefill and self.stop != "sampler" else -1
        self.pend_pos = pos
        self.t_end = kernel.now()

    # bytes of the next piece of a move with `left` bytes to go on (tier, cat): at most
    # piece_bytes and (admitting) the category's largest admission, in whole units of
    # `unit` bytes (K/V rows) when that leaves at least one; no allocation
    def _piece_size(self, tr, tier, cat, left, unit):
        p = self._pb
        if tr.admit:
            most = tr.bw.piece(tier, cat)
            if 0 < most < p:
                p = most
        if p >= left:
            return left
        if unit > 1 and p >= unit:
            p -= p % unit
        return p

    # move one piece of p bytes of cat on tier by kind: charge it (unless admission did),
    # hold the tier for its priced time (after a transfer in flight: contention) and
    # return the µs until it ends. Each piece is a transfer of its own (its first-access
    # latency included); the sub-µs parts of the pieces' ns are carried (here, or by the
    # tracker itself when it was made with carry_ns), so the pieces of a move cost the sum
    # of their ns, not that sum less a rounding per piece. Counted in the
    # traffic's totals (weights: final True or cat WEIGHTS). A piece the tracker refuses
    # moves nothing: 0 µs, counted in tr.refused only (as DecodeTraffic.layer does). No allocation
    def _move_piece(self, tr, tier, cat, kind, p, charged, final=False):
        bw = tr.bw
        if not charged and bw.charge(tier, cat, p) < 0:  # refused (a bucket at its bound): moved nothing
            if tr.refused < 0x3FFFFFFF:
                tr.refused += 1
            return 0
        us = bw.occupy(tier, kind, p)
        if us < 0:
            if tr.refused < 0x3FFFFFFF:
                tr.refused += 1
            return 0
        if not bw.carry_ns:  # a tracker that carries the rounded-off ns itself (carry_ns) needs none here
            ns = bw.cost_ns(tier, kind, p)
            r = self._ns + (ns % 1000 if ns > 0 else 0)
            if r >= 1000:
                r -= 1000
                us += 1
                self.carried_us += 1
            self._ns = r
        self.pieces += 1
        if cat == bandwidth.WEIGHTS or final:
            tr._count(p, 0, us)
        else:
            tr._count(0, p, us)
        return us

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
        if self.stop == "tokens":
            compat.collect()
            room = (compat.mem_free() or 0) - self.margin - 64
            return ("%sa request of %d tokens needs a %d B token array and the heap keeps %d B free beyond the boot's margin: "
                    "ask for at most %d" % (STOP, self.stop_n, 4 * self.stop_n, room if room > 0 else 0, room // 4 if room > 0 else 0))
        if self.stop == "full":
            return "%s%s is reached after %d tokens (policy full)" % (STOP, self.limit, self.cache.length(self.h))
        if self.stop == "sampler":
            return "%sthe next token could not be drawn after %d new tokens: %s" % (STOP, self.n_new, self.stop_why)
        if self.stop:
            return "%sthe cache refused a token (%s) after %d tokens" % (STOP, self.stop, self.cache.length(self.h))
        return ""


def _discard(b):
    pass


class Chat(Session):
    # one chat of a Session booted for seqs chats: the Session's weights, tokenizer, pool and
    # cache, its own sequence (the first chat: the one the prefix went into; the others:
    # forks of it), Model run state and Sampler; Session.chat() makes it. After its task it
    # reports what a Session does: n_prompt (prefix + its own), n_new, tokens, t_start
    # (when its task or the prefix task started, the earlier: the shared prefill is part
    # of its time to first token), t_first, t_end,
    # stop, summary(), stop_line()
    def __init__(self, s, index, text, temperature, top_p, seed):
        self.session = s  # the Session it shares
        self.index = index  # its number (0: the prefix went into its sequence)
        self.name = "chat%d" % index
        for a in ("weights", "cfg", "layout", "policy", "limit", "cap", "pool", "cache", "region", "tok", "heap",
                  "reserve", "fit_blocks", "seqs", "sizing", "margin", "margin_parts", "heap_free", "heap_largest", "boot_limit"):
            setattr(self, a, getattr(s, a))
        self.text = text
        self.stop_n = 0
        try:
            self.own = s.tok.encode(text, False, False) if text else []  # its own prompt ids (no BOS)
            self.model = s.model if index == 0 else Model(s.weights, s.cache, s.backend, s.rope)
            self.sampler = Sampler(s.cfg.vocab_size, temperature, top_p, seed)
        except ValueError as e:
            raise DecodeError(str(e))
        except MemoryError:
            raise DecodeError("the heap ran out making chat %d's run state (%d B free): the Session was booted for %d chats"
                              % (index, compat.mem_free() or 0, s.seqs))
        self.ids = None  # what its task feeds (the prefix's last token + its own), set by prefix_task()
        self.h = -1  # its sequence handle, set when the prefix is in
        self.tokens = None
        self.n_new = 0
        self.n_prompt = 0
        self.stop = ""
        self.t_start = self.t_first = self.t_end = 0
        self.t_ready = 0  # ticks when the prefix was in and it went on
        self.started = False  # its task() was made (once only)
        # None / 0: the Session's at the task's start (host/emulate.py sets those once)
        self.layer_us = 0
        self.on_token = None
        self.traffic = None
        self.cpu = None
        self.piece_bytes = 0
        self.slice_us = 0
        self._pb = 0
        self.slicer = None
        self.thermal = None
        self.pieces = 0
        self._ns = 0
        self.carried_us = 0
        self.thermal_pauses = 0
        self.thermal_pause_us = 0

    # the chat's task (a generator for sched.Kernel): waits for the prefix, then feeds its
    # ids and makes up to n new tokens, writing each piece with out(bytes)
    # (DecodeError at the call, nothing changed: the Session's prefix_task() not made yet,
    # or made but not a live task on kernel while the prefix is not in (it would wait
    # forever: spawn the prefix task first), or this chat's task made already: a chat runs
    # once, its tokens stay)
    def task(self, kernel, n, out=None, prefill=False):
        s = self.session
        if s.ready is None:
            raise DecodeError("%s: make the Session's prefix_task() first" % self.name)
        if self.started:
            raise DecodeError("%s: its task was already made (a chat runs once)" % self.name)
        if not s.prefix_done and not s.prefix_spawned(kernel):
            raise DecodeError("%s: the prefix task is not running on this kernel: spawn prefix_task()'s generator "
                              "before the chats' tasks" % self.name)
        self.started = True
        return self._chat(kernel, n, out if out is not None else _discard)

    def _chat(self, kernel, n, out):
        s = self.session
        t0 = kernel.now()
        if not s.prefix_done:
            yield s.ready.wait(1)
        self.t_ready = kernel.now()
        for a in ("layer_us", "on_token", "traffic", "cpu", "piece_bytes", "thermal", "slice_us"):
            if not getattr(self, a):
                setattr(self, a, getattr(s, a))
        if self.h < 0:  # the prefix did not fit, or the fork was refused
            self.tokens = compat.new_array("i", n)
            self.n_prompt = self.pos0 + len(self.ids)
            self.t_start = self.t_first = self.t_end = t0
            return
        yield from Session.task(self, kernel, self.ids, n, out)
        # the request came with the prefix: its time to first token counts from the earlier start
        self.t_start = s.t_start if compat.ticks_diff(t0, s.t_start) > 0 else t0

    def chats_report(self):
        return self.session.chats_report()


# (weights bytes read per layer, weights bytes read after the layers) by one decode
# step of weights (llama2c.Weights): a layer's seven matrices (int8: values + fp32
# scales) and two norms; then the final norm, the classifier and the embedding row
def weight_traffic(weights):
    cfg = weights.cfg

    def mbytes(m):
        n = m.rows * m.cols
        return n + 4 * (n // m.group) if m.group else 4 * n

    lw = weights.layers[0]
    per_layer = 2 * 4 * cfg.dim
    for name in llama2c.LAYER_MATRICES:
        per_layer += mbytes(getattr(lw, name))
    emb = weights.token_embedding
    row = cfg.dim + 4 * (cfg.dim // emb.group) if emb.group else 4 * cfg.dim
    return per_layer, 4 * cfg.dim + mbytes(weights.wcls) + row


# the same from a checkpoint's llama2c.Layout (no weights loaded: predictions)
def layout_traffic(lay):
    cfg = lay.cfg
    per_layer = 0
    final = 0
    emb_row = 4 * cfg.dim
    for t in lay.tensors:
        if t.name == "freq_cis":
            continue
        n = t.rows * t.cols
        b = n + 4 * (n // t.group) if t.group else 4 * n
        if t.layer == 0:
            per_layer += b
        elif t.name == "rms_final" or t.name == "wcls":
            final += b
        elif t.name == "token_embedding":
            emb_row = cfg.dim + 4 * (cfg.dim // t.group) if t.group else 4 * cfg.dim
            if cfg.shared_classifier:
                final += b
    return per_layer, final + emb_row


# a bandwidth.DecodeTraffic for session s on tracker bw: weights on w_tier, KV blocks on
# kv_tier (names or ids; default: the board's psram tier when it has one, else its first),
# K/V rows as the layout stores them; options as DecodeTraffic's
def traffic_for(s, bw, w_tier=None, kv_tier=None, **opts):
    dflt = 0
    for i, name in enumerate(bw.names):
        if name == "psram":
            dflt = i
    per_layer, final = weight_traffic(s.weights)
    lay = s.layout
    row = getattr(lay, "store_row", lay.layer_row)  # bytes of one (layer, token) row as stored
    return bandwidth.DecodeTraffic(bw, per_layer, final, row, dflt if w_tier is None else w_tier,
                                   dflt if kv_tier is None else kv_tier, **opts)


# True when backend runs the integer path for int8 weights (weights_int8) and KV kv_dtype
# on MicroPython (model.auto_backend's choice, without loading anything)
def uses_q8(backend, weights_int8, kv_dtype):
    return backend == "q8" or (backend == "auto" and weights_int8 and kv_dtype == "int8")


# The boot's rule (Session sizing "boot"; budget_blocks predicts it): KV blocks for a
# heap measured after everything but the pool was made, `free` bytes free and `largest`
# in its largest piece: what is made after the probe (the pool object and its blocks'
# bookkeeping, the cache's fixed arrays, `others` B of the other chats' run state) and
# the margin go in the largest piece (the margin stays whole there) and within free.
# (blocks, what limits them)
def boot_blocks(free, largest, margin, lay, seqs=1, h2o=False, others=0):
    rest = pool.POOL_FIXED_BYTES + kv.fixed_bytes(lay, seqs) + others + margin
    per = kv.bytes_per_block(lay, seqs, h2o)
    by_free = (free - rest) // per
    by_piece = (largest - ARENA_SLACK - rest) // per
    n, why = (by_free, "free heap") if by_free < by_piece else (by_piece, "largest free block")
    return (n if n > 0 else 0), why


# the run state's bytes per pool block planned (slots and block offsets; model.py)
def plan_bytes(cfg, lay, seqs=1, h2o=False, q8=False, rope="absolute"):
    return kv.bytes_per_block(lay, seqs, h2o) + lay.tokens_per_block * fw_model.run_state_slot_bytes(cfg, q8, rope) \
        + fw_model.run_state_block_bytes(q8)


# What the calculator predicts the boot measures, from heapmargin's figures (measured by
# `./kv heapmargin` on each word size and path): {"free0": free heap before the model's
# run state, "plan": blocks the run state is made for, "model": its bytes, "free",
# "largest": the probe's figures, "margin", "residual": the firmware's own heap
# (modules, tokenizer, objects) besides weights and run state}
def predict_boot(heap, cfg, weights_bytes, lay, firmware_bytes=0, h2o=False, batch=1, word_bytes=WORD_BYTES, q8=False,
                 context="decode", rope="absolute"):
    fp = heapmargin.footprint(word_bytes, q8, context)
    more = cfg.vocab_size - fp["vocab"]
    residual = fp["residual"] + (TOKEN_BYTES * more if more > 0 else 0)  # a smaller tokenizer: not counted as less
    # the footprints are measured greedy, whose sampler has no exponent table: a sampled
    # request's (sample.TABLE_BYTES and its array object, one GC block) is counted for every boot
    table = sample_mod.TABLE_BYTES + 4 * word_bytes
    residual += table
    if residual < firmware_bytes:
        residual = firmware_bytes  # the profile's own figure, when larger
    margin = heapmargin.margin(word_bytes, q8, heapmargin.CONTEXTS[context])[0]
    free0 = heap - residual - weights_bytes
    plan = (free0 - margin) // plan_bytes(cfg, lay, batch, h2o, q8, rope)
    plan = plan if plan > 0 else 0
    t = lay.tokens_per_block
    ctx = (cfg.seq_len + t - 1) // t
    if batch > 1 and plan > batch * ctx:  # Session._blocks: chats' pools stop at their contexts
        plan = batch * ctx
    per_seq = plan if batch == 1 or plan < ctx else ctx  # as Session._blocks: the run state is made for one sequence's blocks
    model = fw_model.run_state_fixed_bytes(cfg, lay.layer_row, q8, word_bytes) + fp["model_extra"] \
        + per_seq * t * fw_model.run_state_slot_bytes(cfg, q8, rope) + per_seq * fw_model.run_state_block_bytes(q8)
    free = free0 - model - heapmargin.ALLOWANCE
    return {"free0": free0, "plan": plan, "model": model, "free": free, "largest": free - fp["holes"] - heapmargin.ALLOWANCE,
            "margin": margin, "residual": residual, "chat": model + 8 * cfg.vocab_size + table + CHAT_BYTES}


# The one sizing rule of a decoding firmware, which host/budget.py computes in advance:
# (reserve B, KV blocks) for a usable heap of `heap` B, model cfg whose weights take
# weights_bytes in memory (llama2c.Layout.memory_bytes), cache layout lay, `batch`
# sequences, on an interpreter of word_bytes words (the calculator asks for the board's
# 4) running the integer path when q8: the boot's rule (boot_blocks) on the figures the
# boot is predicted to measure (predict_boot), a lower bound of what it measures. The
# reserve is every byte of the heap not in the weights or the pool's blocks
def budget_blocks(heap, cfg, weights_bytes, lay, firmware_bytes=0, h2o=False, batch=1, word_bytes=WORD_BYTES, q8=False,
                  context="decode", rope="absolute"):
    p = predict_boot(heap, cfg, weights_bytes, lay, firmware_bytes, h2o, batch, word_bytes, q8, context, rope)
    n, _ = boot_blocks(p["free"], p["largest"], p["margin"], lay, batch, h2o, (batch - 1) * p["chat"])
    if n > p["plan"]:
        n = p["plan"]
    if n > 0:
        return heap - weights_bytes - n * lay.block_bytes, n
    # nothing fits: what the firmware keeps besides the weights before its first block
    return (p["residual"] + p["model"] + (p["free"] - p["largest"]) + 2 * heapmargin.ALLOWANCE + p["margin"]
            + pool.POOL_FIXED_BYTES + kv.fixed_bytes(lay, batch)), 0


# heap bytes one KV block costs a decoding firmware: the block, its bookkeeping
# (kv.bytes_per_block) and the run state of its slots
def block_cost(cfg, lay, batch=1, h2o=False, q8=False, word_bytes=WORD_BYTES):
    return plan_bytes(cfg, lay, batch, h2o, q8)


# the least usable heap for which budget_blocks gives at least n_blocks (its inverse, by
# bisection: the rule only grows with the heap)
def heap_for_blocks(n_blocks, cfg, weights_bytes, lay, firmware_bytes=0, h2o=False, batch=1, word_bytes=WORD_BYTES, q8=False,
                    context="decode"):
    lo, hi = weights_bytes, weights_bytes + 4096
    while budget_blocks(hi, cfg, weights_bytes, lay, firmware_bytes, h2o, batch, word_bytes, q8, context)[1] < n_blocks:
        lo, hi = hi, 2 * hi
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if budget_blocks(mid, cfg, weights_bytes, lay, firmware_bytes, h2o, batch, word_bytes, q8, context)[1] >= n_blocks:
            hi = mid
        else:
            lo = mid
    return hi


# heap bytes a pool of n_blocks + its cache + its slots' run state needs
def pool_heap(n_blocks, cfg, lay, batch=1, h2o=False, q8=False, word_bytes=WORD_BYTES):
    return pool.POOL_FIXED_BYTES + kv.fixed_bytes(lay, batch) + n_blocks * block_cost(cfg, lay, batch, h2o, q8, word_bytes)


# (usable heap B, profile's firmware_reserved_bytes) a decode boot sizes from: `heap`
# when given, else the board profile's (board.json beside main.py) when this
# interpreter really has that much, else this interpreter's own total; `reserve` when
# given, else the profile's (0 without one)
def board_heap(heap=0, reserve=0):
    brd = None
    if not heap or not reserve:
        try:
            from firmware_py import board  # noqa: PLC0415

            brd = board.load(PROFILE)
        except (OSError, ValueError):
            brd = None  # no profile beside the firmware (the host, a bare unix port)
    if not heap:
        heap = _heap_total()
        if brd is not None and brd.kind == "mcu" and brd.mpy_heap and brd.mpy_heap <= heap:
            heap = brd.mpy_heap  # the calculator's figure: the same blocks as `kv budget`
    if not reserve and brd is not None and brd.kind == "mcu":
        reserve = brd.firmware_bytes
    return heap, reserve


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


class HeapTrace:
    # free heap (after a collection) and pool blocks in use, sampled after every token
    def __init__(self, n):
        self.free = compat.new_array("i", n + 1)  # [token] free heap bytes
        self.used = compat.new_array("i", n + 1)  # [token] pool blocks in use
        self.n = 0  # samples taken

    # sample now (called by the decode task after each new token)
    def __call__(self, s):
        if self.n < len(self.free):
            compat.collect()
            self.free[self.n] = compat.mem_free() or 0
            self.used[self.n] = s.pool.blocks_used
            self.n += 1

    # "heap: ..." line: samples, free min/max, pool used min/max
    def line(self):
        if not self.n:
            return "heap: no samples"
        f = self.free[:self.n]
        u = self.used[:self.n]
        return "heap: %d samples, free min %d max %d B, pool used min %d max %d blocks" % (
            self.n, min(f), max(f), min(u), max(u))


# boot a Session, decode n tokens of prompt as a kernel task beside nothing else, print
# the text, the stop line if any, and the summary (trace_heap: then the "heap: ..."
# line of a HeapTrace sampled after every token; traffic: see below); returns the Session. DecodeError
# for a user's mistake (the caller prints it as one line)
def run(model_path, tok_path, prompt, n, out=write_out, clock=None, on_token=None, trace_heap=False, traffic=None, **opts):
    s = Session(model_path, tok_path, **opts)
    trace = HeapTrace(n) if trace_heap else None
    s.on_token = trace if trace is not None else on_token
    ids = s.encode(prompt)
    k = Kernel(clock or RealClock(), max_tasks=4, verbose=True)
    if traffic is not None:  # callable(session, kernel) -> DecodeTraffic (e.g. over a Bandwidth on k)
        s.traffic = traffic(s, k)
    t = k.spawn("decode", 1, s.task(k, ids, n, out))
    k.run()
    if t.exc is not None:
        raise t.exc
    out(b"\n")
    line = s.stop_line()
    if line:
        print(line)
    print(s.summary())
    if trace is not None:
        print(trace.line())
    return s
