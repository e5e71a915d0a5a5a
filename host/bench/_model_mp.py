# The integer forward pass (firmware_py/qmodel.QForward) driven from the command line
# under MicroPython (or CPython, with the plain twins): host/bench/model.py and
# tests/test_qmodel.py run it through host/interp.py and read one JSON line.
#   greedy PATH N ID...   the N greedy ids after the prompt ids   {"tokens": [...]}
#   logits PATH ID...     teacher forcing: logits (floats) after every id  {"logits": [[...]]}
#   twin PATH N ID...     viper kernels and plain twins decode N tokens: {"same": bool, ...}
#   bench PATH N ID...    prefill the ids, decode N tokens; times, heap bytes
import gc
import json
import sys
import time

from firmware_py import compat, kv, llama2c, pool, qmodel
from firmware_py import kernels_q as K


def setup(path):
    # weights, cache (full, seq_len, int8), handle, QForward
    w = llama2c.load(path)
    cfg = w.cfg
    lay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, "int8")
    nb = (cfg.seq_len + lay.tokens_per_block - 1) // lay.tokens_per_block
    p = pool.Pool(lay.block_bytes, nb)
    c = kv.KVCache(p, lay, max_seqs=1)
    h = c.open(p.add_region(nb), "full", cfg.seq_len)
    return w, c, h, qmodel.QForward(w, c)


def greedy(m, h, ids, n, out):
    # prefill ids, then n greedy tokens into out (a list); the last status
    v = m.cfg.vocab_size
    tok = ids[0]
    for pos in range(len(ids) - 1 + n):
        st = m.step(h, tok, pos)
        if st < 0:
            return st
        if pos + 1 < len(ids):
            tok = ids[pos + 1]
        else:
            tok = K.argmax(m.logits, v)
            out.append(tok)
    return 0


def ticks():
    return time.ticks_us() if compat.IS_MICROPYTHON else int(time.perf_counter() * 1e6)


def bench(path, n, ids):
    # ttft (prefill + the first token), decode tok/s over n tokens, bytes per token (gc
    # off, gc.mem_alloc before and after), the same decode heap-locked, peak heap bytes
    gc.collect()
    base = compat.mem_alloc()
    w, c, h, m = setup(path)
    v = w.cfg.vocab_size
    gc.collect()
    t0 = ticks()
    tok = ids[0]
    for pos in range(len(ids)):
        m.step(h, tok, pos)
        tok = ids[pos + 1] if pos + 1 < len(ids) else K.argmax(m.logits, v)
    ttft = time.ticks_diff(ticks(), t0) if compat.IS_MICROPYTHON else ticks() - t0
    gc.collect()
    gc.disable()
    a0 = compat.mem_alloc()
    t0 = ticks()
    pos = len(ids)
    for i in range(n):
        m.step(h, tok, pos + i)
        tok = K.argmax(m.logits, v)
    dt = time.ticks_diff(ticks(), t0) if compat.IS_MICROPYTHON else ticks() - t0
    a1 = compat.mem_alloc()
    gc.enable()
    peak = a1
    locked = 0
    if compat.HEAP_LOCK:
        c.close(h)
        h = c.open(0, "full", w.cfg.seq_len)
        m.step(h, 1, 0)
        compat.heap_lock()
        try:
            for i in range(1, n + 1):
                if m.step(h, 1, i) < 0:
                    break
                locked += 1
        except MemoryError:
            pass
        compat.heap_unlock()
    # the generator of forward() per token: bytes one call allocates
    c.close(h)
    h = c.open(0, "full", w.cfg.seq_len)
    gc.collect()
    gc.disable()
    g0 = compat.mem_alloc()
    for _ in m.forward(h, 1, 0):
        pass
    g1 = compat.mem_alloc()
    gc.enable()
    return {"decode_tokens": n, "decode_us": dt, "decode_tok_s": round(n * 1e6 / dt, 1), "ttft_ms": round(ttft / 1000.0, 2),
            "prompt_tokens": len(ids), "alloc_bytes_per_token": (a1 - a0) / n if a0 is not None else None,
            "heap_locked_tokens": locked, "forward_generator_bytes": (g1 - g0) if g0 is not None else None,
            "peak_heap_bytes": (peak - base) if base is not None else None,
            "weights_bytes": w.nbytes, "kv_pool_bytes": len(c.arena)}


def main(argv):
    mode, path = argv[0], argv[1]
    if mode == "greedy" or mode == "twin" or mode == "bench":
        n = int(argv[2])
        ids = [int(a) for a in argv[3:]]
    else:
        ids = [int(a) for a in argv[2:]]
    if mode == "bench":
        print(json.dumps(bench(path, n, ids)))
        return
    if mode == "twin":
        res = []
        for kind in ("_v", "_py"):
            for name in ("matvec", "quant", "rmsnorm", "add", "rescale", "embed", "rope_row", "rope", "pack", "silu",
                         "ranks", "attend", "argmax"):
                setattr(K, name, getattr(K, name + kind))
            w, c, h, m = setup(path)
            out = []
            greedy(m, h, ids, n, out)
            res.append((out, list(m.logits)))
        print(json.dumps({"same": res[0] == res[1], "tokens": res[0][0], "twin_tokens": res[1][0]}))
        return
    w, c, h, m = setup(path)
    if mode == "greedy":
        out = []
        st = greedy(m, h, ids, n, out)
        print(json.dumps({"tokens": out, "status": st}))
        return
    rows = []
    f = 1.0 / (1 << m.logit_frac_bits)
    for pos in range(len(ids)):
        m.step(h, ids[pos], pos)
        rows.append([x * f for x in m.logits])
    print(json.dumps({"logits": rows}))


main(sys.argv[1:])
