# Boot a pool + KV cache the way the firmware does and append tokens until the
# policy stops it: the check that host/budget.py's max_tokens and heap_bytes_needed
# hold on the real interpreter. Usage (key=value arguments; runs on both interpreters):
#   micropython -X heapsize=N firmware_py/kvprobe.py board=boards/esp32s3_n8r8.json \
#       model=stories260K.bin kv_dtype=fp32 [policy=full] [window=W] [tokens=T] [arena=BYTES]
# Prints one line "kvprobe: ..." and exits 0; a boot that does not fit prints one line
# saying what was needed and what there is, and exits 1 (no traceback); bad arguments 2.
#
# size=measure checks the calculator without using it: after the boot allocations
# (weights read from the file, activations, one token row) it binary-searches the
# largest block count whose real Pool + KVCache boots and then takes appends under
# heap_lock to FULL, and from there keeps allocating what decode would need next (one
# more KV block per 16 tokens) until a real MemoryError. It prints one line
# "kvprobe: measured blocks=B tokens=T status=FULL limit=E extra_blocks=X
# memory_error_tokens=M block_bytes=S heap_free=F" (limit: what refused B + 1 blocks).
import sys

from firmware_py import board, compat, kv, llama2c, pool
from firmware_py.status import E_FULL, E_NO_BLOCK



# parse key=value arguments into a dict; unknown keys are the caller's mistake
def _args(argv):
    opts = {"size": "calc", "policy": "full", "kv_dtype": "fp32", "window": "0", "tokens": "0", "arena": "0", "model": "", "board": ""}
    for a in argv:
        k, sep, v = a.partition("=")
        if not sep or k not in opts:
            raise ValueError("unknown argument %r (want key=value with key in %s)" % (a, ", ".join(sorted(opts))))
        opts[k] = v
    if opts["size"] not in ("calc", "measure"):
        raise ValueError("size must be calc or measure, got %r" % opts["size"])
    if not opts["board"] or not opts["model"]:
        raise ValueError("board=PATH and model=PATH are required")
    return opts


# boot (weights, activations, pool, cache) and append until the policy stops;
# returns the exit code
def main(argv):
    try:
        o = _args(argv)
        brd = board.load(o["board"])
        cfg, wbytes = llama2c.read_config(o["model"])
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
    if o["size"] == "measure":
        if policy != "full":
            print("kvprobe: size=measure sizes a full-policy pool")
            return 2
        return _measure(o["model"], cfg, wbytes, acts_bytes, layout)
    arena = int(o["arena"])
    if arena:
        n_blocks = arena // layout.block_bytes
    elif policy != "full":
        n_blocks = (window + layout.tokens_per_block - 1) // layout.tokens_per_block  # a ring needs no more
    else:
        # the pool takes what the board profile leaves after firmware, weights, activations
        n_blocks = kv.blocks_for_board(brd, layout, wbytes, acts_bytes, 1, h2o)
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
        weights = bytearray(wbytes)  # the fp32 weights, read into the heap as esp32-llm does
        with open(o["model"], "rb") as f:
            f.seek(llama2c.V2_HEADER_BYTES if cfg.version else llama2c.HEADER_BYTES)
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


# boot weights, activations and a row, then measure what really fits (see the top);
# the calculator (kv.blocks_for*, kv.heap_for) is not consulted; returns the exit code
def _measure(model, cfg, wbytes, acts_bytes, layout):
    try:
        weights = bytearray(wbytes)  # the fp32 weights, read into the heap as esp32-llm does
        with open(model, "rb") as f:
            f.seek(llama2c.V2_HEADER_BYTES if cfg.version else llama2c.HEADER_BYTES)
            f.readinto(weights)
        acts = bytearray(acts_bytes)  # run.c's RunState, fp32
        row = bytearray(layout.row_bytes)  # one token's K/V row, filled by the model
    except MemoryError:
        print("kvprobe: boot refused: weights and activations do not fit, heap has %s B free" % compat.mem_free())
        return 1
    box = [0, 0]  # tokens appended, last status
    lo, hi = 0, 1  # lo boots; hi is an upper bound found by doubling
    limit = ""
    while True:
        e = _boot_fill(layout, hi, row, box)
        if e:
            limit = e
            break
        lo = hi
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        e = _boot_fill(layout, mid, row, box)
        if e:
            hi, limit = mid, e
        else:
            lo = mid
    if lo < 1:
        print("kvprobe: boot refused: no pool of one %d B block boots after weights and activations (%s)" % (layout.block_bytes, limit))
        return 1
    _boot_fill(layout, lo, row, box)  # the largest again: its status and count are reported
    p = pool.Pool(layout.block_bytes, lo)  # and kept live while decode asks for more
    cache = kv.KVCache(p, layout, max_seqs=1)
    extra = []  # what decode would need next: one more block per 16 tokens
    try:
        while True:
            extra.append(bytearray(layout.block_bytes))
    except MemoryError:
        pass
    n_extra = len(extra)
    extra = None
    status = "FULL" if box[1] == E_FULL else "NO_BLOCK" if box[1] == E_NO_BLOCK else "OK"
    print("kvprobe: measured blocks=%d tokens=%d status=%s limit=%s extra_blocks=%d memory_error_tokens=%d block_bytes=%d heap_free=%s"
          % (lo, box[0], status, limit, n_extra, (lo + n_extra) * layout.tokens_per_block, layout.block_bytes, compat.mem_free()))
    del weights, acts, cache, p
    return 0


# boot a pool of n blocks + its cache and fill one full sequence under heap_lock;
# "" when it booted and stopped at FULL after n * T tokens (box = [count, status]),
# else the name of what refused it; everything is released again
def _boot_fill(layout, n, row, box):
    p = cache = None
    try:
        p = pool.Pool(layout.block_bytes, n)
        cache = kv.KVCache(p, layout, max_seqs=1)
        seq = cache.open(p.add_region(n), "full", 0)
    except MemoryError:
        return "MemoryError"
    except pool.PoolError:
        return "PoolError"
    except kv.KVError:
        return "KVError"
    finally:
        if cache is None:
            p = None
            compat.collect()
    if seq < 0:
        return "open"
    compat.heap_lock()  # the decode loop must not allocate: a MemoryError here is a bug
    try:
        _fill(cache, seq, row, n * layout.tokens_per_block + 1, box)
    except MemoryError:
        box[1] = 0
        return "MemoryError in the locked fill"
    finally:
        compat.heap_unlock()
    cache = p = None
    compat.collect()
    if box[1] != E_FULL or box[0] != n * layout.tokens_per_block:
        return "fill stopped at %d tokens" % box[0]
    return ""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
