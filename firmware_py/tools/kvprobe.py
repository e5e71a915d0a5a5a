# Boot a pool + KV cache the way the firmware does and append tokens until the
# policy stops it: the check that host/budget.py's max_tokens and heap_bytes_needed
# hold on the real interpreter. Usage (key=value arguments; runs on both interpreters):
#   micropython -X heapsize=N firmware_py/kvprobe.py board=boards/esp32s3_n8r8.json \
#       model=stories260K.bin kv_dtype=fp32 [policy=full] [window=W] [tokens=T] [arena=BYTES]
# Prints one line "kvprobe: ..." and exits 0; a boot that does not fit prints one line
# saying what was needed and what there is, and exits 1 (no traceback); bad arguments 2.
#
# size=try checks the calculator without using it, one pool size per process (a board
# boots once: a second pool in the same process could find the first one's arena still
# held by a stale pointer that the conservative GC scans, and measure too little). It
# boots the decoding firmware (decode.Session: weights as llama2c.load keeps them, the
# tokenizer, the model's run state) with a pool of exactly blocks=B blocks, generates
# decode=K tokens through the kernel task (the forward pass's own garbage included),
# appends under heap_lock to FULL, then keeps allocating what decode would need next
# (one more KV block per 16 tokens) until a real MemoryError. It prints one line
# "kvprobe: tried blocks=B booted=1 tokens=T status=FULL extra_blocks=X
# memory_error_tokens=M block_bytes=S heap_free=F", or "kvprobe: tried blocks=B
# booted=0 limit=WHAT" (WHAT: the exception that refused it). host/bench/budget.py
# searches B across processes.
import gc

if hasattr(gc, "threshold"):  # MicroPython: collect the imports' garbage as it comes, so that the
    gc.threshold(16384)  # compiled code lands packed, not scattered over the free heap (decode.BOOT_GC_BYTES;
    # a decode.Session boot ends it)
import sys

from firmware_py import board, compat, kv, llama2c, pool
from firmware_py.status import E_FULL, E_NO_BLOCK



# parse key=value arguments into a dict; unknown keys are the caller's mistake
def _args(argv):
    opts = {"size": "calc", "policy": "full", "kv_dtype": "fp32", "window": "0", "tokens": "0", "arena": "0", "model": "", "board": "",
            "blocks": "0", "tokenizer": "", "decode": "8", "backend": "auto"}
    for a in argv:
        k, sep, v = a.partition("=")
        if not sep or k not in opts:
            raise ValueError("unknown argument %r (want key=value with key in %s)" % (a, ", ".join(sorted(opts))))
        opts[k] = v
    if opts["size"] not in ("calc", "try", "boot"):
        raise ValueError("size must be calc, try or boot, got %r" % opts["size"])
    if opts["size"] == "try" and (int(opts["blocks"]) < 1 or not opts["tokenizer"]):
        raise ValueError("size=try needs blocks=N (>= 1) and tokenizer=PATH")
    if not opts["board"] or not opts["model"]:
        raise ValueError("board=PATH and model=PATH are required")
    return opts


# boot (weights, activations, pool, cache) and append until the policy stops;
# returns the exit code
def main(argv):
    try:
        o = _args(argv)
        brd = board.load(o["board"])
        cfg, lay = llama2c.plan(o["model"])
        wbytes = lay.memory_bytes()  # what the firmware's loader keeps (freq_cis skipped, int8 as int8)
        layout = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, o["kv_dtype"])
        policy = o["policy"]
        window = int(o["window"])
    except (ValueError, board.BoardError, llama2c.CheckpointError) as e:
        print("kvprobe: %s" % e)
        return 2
    if brd.kind != "mcu":
        print("kvprobe: %s is not a MicroPython board" % brd.name)
        return 2
    h2o = policy == "h2o"
    acts_bytes = cfg.activation_bytes()
    if o["size"] in ("try", "boot"):
        if policy != "full":
            print("kvprobe: size=%s sizes a full-policy pool" % o["size"])
            return 2
        if o["size"] == "boot":
            if not o["tokenizer"]:
                print("kvprobe: size=boot needs tokenizer=PATH")
                return 2
            return _boot(o, layout)
        return _try(o, layout)
    arena = int(o["arena"])
    if arena:
        n_blocks = arena // layout.block_bytes
    elif policy != "full":
        n_blocks = (window + layout.tokens_per_block - 1) // layout.tokens_per_block  # a ring needs no more
    else:
        # the pool takes what the board profile leaves after the decoding firmware's
        # reserve, weights, activations: the rule host/budget.py computes in advance
        from firmware_py import decode  # noqa: PLC0415

        n_blocks = decode.budget_blocks(brd.mpy_heap, cfg, wbytes, layout, brd.firmware_bytes, h2o)[1]
    if n_blocks < 1:
        print("kvprobe: boot refused: board %s leaves no room for one KV block of %d B" % (brd.name, layout.block_bytes))
        return 1
    need = wbytes + acts_bytes + layout.row_bytes + kv.heap_for(n_blocks, layout, 1, h2o)
    compat.collect()
    free = compat.mem_free()
    if free is not None and need > free:
        print("kvprobe: boot refused: needs %d B (weights %d, activations %d, KV pool of %d x %d B blocks + bookkeeping %d), heap has %d B free"
              % (need, wbytes, acts_bytes + layout.row_bytes, n_blocks, layout.block_bytes,
                 kv.heap_for(n_blocks, layout, 1, h2o) - n_blocks * layout.block_bytes, free))
        return 1
    # largest first, while the heap is least fragmented: arena, then weights
    try:
        p = pool.Pool(layout.block_bytes, n_blocks)
    except pool.PoolError as e:
        print("kvprobe: boot refused: %s" % e)
        return 1
    try:
        weights = bytearray(wbytes)  # the weights' bytes, read into the heap as esp32-llm does
        with open(o["model"], "rb") as f:
            f.seek(cfg.header_bytes)
            f.readinto(weights)
        acts = bytearray(acts_bytes)  # run.c's RunState, fp32
        row = bytearray(layout.row_bytes)  # one token's K/V row, filled by the model
        cache = kv.KVCache(p, layout, max_seqs=1, h2o=h2o)
    except MemoryError:
        print("kvprobe: boot refused: weights, activations and cache bookkeeping need %d B more, heap has %s B free"
              % (wbytes + acts_bytes + layout.row_bytes, compat.mem_free()))
        return 1
    region = p.add_region(n_blocks)
    budget = window if policy != "full" else 0
    try:
        seq = cache.open(region, policy, budget, kv.SINKS)  # h2o: the default recent split
    except kv.KVError as e:
        print("kvprobe: %s" % e)
        return 2
    if seq < 0:
        print("kvprobe: boot refused: %d blocks cannot hold a %s window of %d" % (n_blocks, policy, window))
        return 1
    limit = int(o["tokens"]) or (cache.max_slots + 1 if policy == "full" else 2 * window)
    box = [0, 0]  # tokens appended, last status
    compat.heap_lock()  # the decode loop must not allocate: a MemoryError here is a bug
    try:
        _fill(cache, seq, row, limit, box)
    finally:
        compat.heap_unlock()
    del weights, acts
    st = box[1]
    status = "FULL" if st == E_FULL else "NO_BLOCK" if st == E_NO_BLOCK else "OK"
    print("kvprobe: %d tokens appended, status %s, cached %d, pool %d/%d blocks of %d B, watermark events %d, heap free %s B"
          % (box[0], status, cache.cached(seq), p.blocks_used, p.n_blocks, p.block_bytes, cache.events, compat.mem_free()))
    return 0


# append row to seq until limit tokens or a negative status; box = [count, status]
def _fill(cache, seq, row, limit, box):
    n = 0
    st = 0
    while n < limit:
        st = cache.append(seq, row)
        if st < 0:
            break
        n += 1
    box[0] = n
    box[1] = st


# boot the decoding firmware with exactly n blocks, decode k tokens, fill to FULL,
# then find where a MemoryError starts (see the top); the calculator is not consulted
# (blocks= bypasses decode's sizing rule); returns the exit code
def _try(o, layout):
    from firmware_py import decode  # noqa: PLC0415 - the decoding firmware's boot

    n = int(o["blocks"])
    k = int(o["decode"])
    box = [0, 0]  # tokens appended, last status
    s = None
    try:
        s = decode.Session(o["model"], o["tokenizer"], o["kv_dtype"], "full", backend=o["backend"], blocks=n)
        ids = s.encode("Once upon a time")
        if k:
            _decode(s, ids, k)
        row = bytearray(layout.row_bytes)  # the rest of the fill: a zero K/V row per token
    except MemoryError:
        return _refused(n, "MemoryError", s)
    except decode.DecodeError as e:
        why = str(e)
        return _refused(n, "PoolError" if "PoolError" in why else "MemoryError" if "MemoryError" in why or "ran out" in why
                        else "DoesNotFit" if "need" in why else "DecodeError", s)
    compat.heap_lock()  # appends must not allocate: a MemoryError here is a bug
    try:
        _fill(s.cache, s.h, row, n * layout.tokens_per_block + 1 - s.cache.length(s.h), box)
    except MemoryError:
        compat.heap_unlock()
        return _refused(n, "MemoryError_in_the_locked_fill", s)
    compat.heap_unlock()
    tokens = s.cache.length(s.h)
    status = "FULL" if box[1] == E_FULL else "NO_BLOCK" if box[1] == E_NO_BLOCK else "OK"
    extra = []  # what decode would need next: one more block per 16 tokens
    try:
        while True:
            extra.append(bytearray(layout.block_bytes))
    except MemoryError:
        pass
    n_extra = len(extra)
    extra = None
    print("kvprobe: tried blocks=%d booted=1 tokens=%d status=%s decoded=%d extra_blocks=%d memory_error_tokens=%d block_bytes=%d heap_free=%s"
          % (n, tokens, status, s.n_new, n_extra, (n + n_extra) * layout.tokens_per_block, layout.block_bytes, compat.mem_free()))
    return 0


# size=boot: the decoding firmware sizes its own pool from the heap it measures after
# loading (decode.Session's sizing "boot", by memory alone: past the model's context),
# decodes k tokens, appends under heap_lock to FULL. One line "kvprobe: boot blocks=B
# free=F largest=L margin=M model_bytes=X tokens=T status=S decoded=D limit=WHY free0=F0
# plan=P weights=W" (F0: free before the model's run state, P: blocks it was made for), or "kvprobe: boot
# blocks=0 limit=WHAT" when it does not boot or run; exit 0 (a measurement)
def _boot(o, layout):
    from firmware_py import decode  # noqa: PLC0415

    k = int(o["decode"])
    box = [0, 0]
    try:
        s = decode.Session(o["model"], o["tokenizer"], o["kv_dtype"], "full", backend=o["backend"], cap_context=False)
        ids = s.encode("Once upon a time")
        if k:
            _decode(s, ids, k)
        row = bytearray(layout.row_bytes)
    except MemoryError:
        print("kvprobe: boot blocks=0 limit=MemoryError")
        return 0
    except decode.DecodeError as e:
        print("kvprobe: boot blocks=0 limit=DecodeError: %s" % e)
        return 0
    n = s.pool.n_blocks
    compat.heap_lock()
    try:
        _fill(s.cache, s.h, row, n * layout.tokens_per_block + 1 - s.cache.length(s.h), box)
    except MemoryError:
        compat.heap_unlock()
        print("kvprobe: boot blocks=0 limit=MemoryError_in_the_locked_fill")
        return 0
    compat.heap_unlock()
    status = "FULL" if box[1] == E_FULL else "NO_BLOCK" if box[1] == E_NO_BLOCK else "OK"
    print(s.boot_line())
    print("kvprobe: boot blocks=%d free=%d largest=%d margin=%d model_bytes=%d tokens=%d status=%s decoded=%d limit=%s "
          "free0=%d plan=%d weights=%d" % (n, s.heap_free, s.heap_largest, s.margin, s.model_bytes, s.cache.length(s.h), status,
                                           s.n_new, s.boot_limit.replace(" ", "_"), s.heap_free0, s.plan_blocks, s.weights.nbytes))
    return 0


# generate k tokens of ids through the decode kernel task (as decode.run, silently)
def _decode(s, ids, k):
    from firmware_py import decode  # noqa: PLC0415 - imported by _try before the boot

    kern = decode.Kernel(decode.RealClock(), max_tasks=4)
    t = kern.spawn("decode", 1, s.task(kern, ids, k, _drop))
    kern.run()
    if t.exc is not None:
        raise t.exc


# discard decoded text (the probe prints one line)
def _drop(b):
    pass


# the one line of a pool size that does not boot; exit 0 (a measurement, not a failure)
def _refused(n, what, s):
    print("kvprobe: tried blocks=%d booted=0 limit=%s" % (n, what))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
