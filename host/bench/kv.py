# `./kv bench kv [--json]`: the KV cache's figures in one run.
#  - append cost of our block-table cache against the design a user would otherwise
#    write (one preallocated flat array per layer for K and V, written in place at
#    pos * kv_dim, as llama2.c and esp32-llm do, with the same viper word copy), the raw
#    copy floor and the per-token concatenation straw man, at 64, 256 and 512 tokens,
#    plus heap bytes over a count of appends and a heap-locked append loop, measured on
#    the MicroPython unix port (firmware_py/tools/kvbench.py under the default board's
#    heap) and on CPython, each design side by side in one loop;
#  - what the pool buys over the flat arrays in the same bytes (the real Pool + KVCache
#    on CPython: counts, not times): sequences of mixed lengths served at once, requests
#    sharing a prompt by fork, sequences decoding past the budget by eviction;
#  - fragmentation churn: many sequences of random lengths at high occupancy on one
#    arena, our block pool vs a first-fit variable-size allocator with coalescing
#    (FreeRTOS heap_4 style) growing each sequence's contiguous buffer by realloc.
import json
import os
import random

from firmware_py import kv, pool, status
from host import boards, paths
from host import interp as interp_mod
from host.errors import UserError
from host.bench import emit

CHURN_SEED = 4  # fixed: the churn is deterministic
CHURN_SEQUENCES = 1500  # sequences started per churn run
ARENA_BLOCKS = 256  # arena of 256 blocks x 16 tokens = 4096 tokens for both allocators
T = 16  # tokens per block (and the first-fit growth step)
MIN_LEN, MAX_LEN = 16, 512  # sequence lengths, uniform


def _kvbench(interp):
    # firmware_py/tools/kvbench.py under "micropython" (the default board's heap) or "cpython"; its JSON object
    r = interp_mod.run(os.path.join(paths.FIRMWARE, "tools", "kvbench.py"), interp)
    if r.returncode != 0:
        raise UserError("kvbench failed under %s: %s" % (interp, (r.stderr or r.stdout).strip().splitlines()[-1:]), 1)
    return json.loads(r.stdout.strip().splitlines()[-1])


def micro_figures():
    # firmware_py/tools/kvbench.py under MicroPython with the default board's heap
    d = _kvbench("micropython")
    d["heap_bytes"] = boards.load(paths.DEFAULT_BOARD).mpy_heap
    return d


def cpython_figures():
    # the same script under this CPython (viper functions run as plain Python here)
    return _kvbench("cpython")


class FirstFit:
    # variable-size first-fit allocator over [0, size) with coalescing free list
    def __init__(self, size):
        self.free = [(0, size)]  # sorted (start, length) of free ranges

    # start of a first-fit range of n units, or -1
    def alloc(self, n):
        for i, (s, ln) in enumerate(self.free):
            if ln >= n:
                if ln == n:
                    del self.free[i]
                else:
                    self.free[i] = (s + n, ln - n)
                return s
        return -1

    # return [s, s + n) and merge with its neighbours
    def release(self, s, n):
        f = self.free
        i = 0
        while i < len(f) and f[i][0] < s:
            i += 1
        f.insert(i, (s, n))
        if i + 1 < len(f) and f[i][0] + f[i][1] == f[i + 1][0]:
            f[i] = (f[i][0], f[i][1] + f[i + 1][1])
            del f[i + 1]
        if i > 0 and f[i - 1][0] + f[i - 1][1] == f[i][0]:
            f[i - 1] = (f[i - 1][0], f[i - 1][1] + f[i][1])
            del f[i]

    # grow [s, s + n) to m units: in place when the next range is free, else move
    # (alloc new, copy, free old: both live at once, as realloc does); new start or -1
    def grow(self, s, n, m):
        for i, (fs, fl) in enumerate(self.free):
            if fs == s + n and fl >= m - n:
                if fl == m - n:
                    del self.free[i]
                else:
                    self.free[i] = (fs + m - n, fl - (m - n))
                return s
        t = self.alloc(m)
        if t >= 0:
            self.release(s, n)
        return t

    def largest(self):
        return max((ln for _, ln in self.free), default=0)


def _workload(active, seed):
    # lengths of CHURN_SEQUENCES sequences, `active` of them running at once
    rnd = random.Random(seed)
    return [rnd.randint(MIN_LEN, MAX_LEN) for _ in range(CHURN_SEQUENCES)]


def churn_pool(active, seed=CHURN_SEED):
    # our pool: each sequence appends one token per round; E_NO_BLOCK fails it
    lengths = _workload(active, seed)
    layout = kv.Layout(1, 1, 4, "int8", tokens_per_block=T)
    p = pool.Pool(layout.block_bytes, ARENA_BLOCKS, views=False)
    c = kv.KVCache(p, layout, max_seqs=active, max_blocks_per_seq=MAX_LEN // T)
    region = p.add_region(ARENA_BLOCKS)
    row = bytearray(layout.row_bytes)
    nxt, ok, failed, occ = 0, 0, 0, []
    running = {}  # seq -> target length
    while nxt < len(lengths) or running:
        while len(running) < active and nxt < len(lengths):
            s = c.open(region, "full", lengths[nxt])
            assert s >= 0
            running[s] = lengths[nxt]
            nxt += 1
        for s in list(running):
            st = c.append(s, row)
            if st == status.E_NO_BLOCK:
                failed += 1
                c.close(s)
                del running[s]
            elif c.length(s) == running[s]:
                ok += 1
                c.close(s)
                del running[s]
        occ.append(p.blocks_used / ARENA_BLOCKS)
    return {"completed": ok, "failed": failed, "success_rate": round(ok / (ok + failed), 4),
            "mean_occupancy": round(sum(occ) / len(occ), 3), "failed_allocs": p.failed}


def churn_first_fit(active, seed=CHURN_SEED):
    # the same workload on FirstFit, in token units, growing by T tokens at a time
    lengths = _workload(active, seed)
    ff = FirstFit(ARENA_BLOCKS * T)
    nxt, ok, failed, occ, frag = 0, 0, 0, [], []
    running = {}  # id -> [start, capacity, length, target]
    sid = 0
    while nxt < len(lengths) or running:
        while len(running) < active and nxt < len(lengths):
            running[sid] = [-1, 0, 0, lengths[nxt]]
            sid += 1
            nxt += 1
        for k in list(running):
            r = running[k]
            if r[2] == r[1]:
                ns = ff.alloc(T) if r[0] < 0 else ff.grow(r[0], r[1], r[1] + T)
                if ns < 0:
                    failed += 1
                    if r[0] >= 0:
                        ff.release(r[0], r[1])
                    del running[k]
                    continue
                r[0], r[1] = ns, r[1] + T
            r[2] += 1
            if r[2] == r[3]:
                ok += 1
                ff.release(r[0], r[1])
                del running[k]
        used = sum(r[1] for r in running.values())
        occ.append(used / (ARENA_BLOCKS * T))
        free = ARENA_BLOCKS * T - used
        if free:
            frag.append(1 - ff.largest() / free)
    return {"completed": ok, "failed": failed, "success_rate": round(ok / (ok + failed), 4),
            "mean_occupancy": round(sum(occ) / len(occ), 3), "mean_external_fragmentation": round(sum(frag) / max(len(frag), 1), 3)}


def churn(active_levels=(10, 12, 14, 16, 20)):
    # both allocators at several concurrency levels (mean demand ~ active x 264 tokens)
    out = []
    for a in active_levels:
        out.append({"active": a, "demand_vs_arena": round(a * (MIN_LEN + MAX_LEN) / 2 / (ARENA_BLOCKS * T), 2),
                    "pool": churn_pool(a), "first_fit": churn_first_fit(a)})
    return out



# --- what the pool buys over flat arrays, in the same bytes ----------------------------
SHAPE = (5, 4, 8, "fp32")  # stories260K KV: layers, KV heads, head_dim, dtype
FLAT_MAX_LEN = 512  # positions a flat design reserves per sequence (stories260K's seq_len)
FLAT_SEQS = 4  # the byte budget: what flat arrays need for this many sequences
MIX_SEEDS = 20  # draws of the mixed-length workload
PROMPT, GEN = 256, 64  # sharing: a common prompt, then each request's own tokens
DECODE, WINDOW = 2048, 256  # eviction: tokens decoded per sequence, tokens kept


def _layout():
    return kv.Layout(*SHAPE)


def same_bytes():
    # the byte budget of every capacity comparison: FLAT_SEQS flat sequences of FLAT_MAX_LEN
    return FLAT_SEQS * FLAT_MAX_LEN * _layout().kv_bytes_per_token


def _pool_cache(max_seqs, h2o=False):
    # the real Pool + KVCache holding as many blocks as same_bytes() pays for, with
    # every per-block cost of ours charged (slot headers, free list, views, tables)
    layout = _layout()
    n = kv.blocks_for(same_bytes(), layout, max_seqs, h2o)
    p = pool.Pool(layout.block_bytes, n, views=False)
    return p, kv.KVCache(p, layout, max_seqs=max_seqs, h2o=h2o), p.add_region(n), bytearray(layout.row_bytes)


def served_mixed(seed, max_seqs=64):
    # requests of uniform MIN_LEN..MAX_LEN tokens, opened and filled in order until the
    # pool refuses one: (requests held at once, tokens held); a flat design holds
    # same_bytes() // (FLAT_MAX_LEN x token) whatever their lengths
    rnd = random.Random(seed)
    p, c, region, row = _pool_cache(max_seqs)
    held = tokens = 0
    while held < max_seqs:
        want = rnd.randint(MIN_LEN, MAX_LEN)
        s = c.open(region, "full", want)
        if s < 0:
            break
        for _ in range(want):
            if c.append(s, row) < 0:
                return held, tokens
        held += 1
        tokens += want
    return held, tokens


def served_shared(max_seqs=64):
    # one PROMPT-token sequence forked for requests that each add GEN tokens, until
    # the pool refuses: requests served at once (each sees PROMPT + GEN tokens)
    p, c, region, row = _pool_cache(max_seqs)
    base = c.open(region, "full", PROMPT + GEN)
    for _ in range(PROMPT):
        c.append(base, row)
    served = 0
    while served < max_seqs - 1:
        f = c.fork(base)
        if f < 0:
            break
        for _ in range(GEN):
            if c.append(f, row) < 0:
                return served
        served += 1
    return served


def served_evicting(policy, max_seqs=64):
    # sequences with a WINDOW-token budget opened until the pool refuses, each then
    # decoding DECODE tokens: (sequences, tokens decoded, appends refused: must be 0)
    h2o = policy == "h2o"
    p, c, region, row = _pool_cache(max_seqs, h2o)
    seqs = []
    while len(seqs) < max_seqs:
        s = c.open(region, policy, WINDOW, 4, WINDOW // 10 if h2o else 0)
        if s < 0:
            break
        seqs.append(s)
    refused = 0
    for s in seqs:
        for _ in range(DECODE):
            if c.append(s, row) < 0:
                refused += 1
    return len(seqs), len(seqs) * DECODE, refused


def capacity():
    # every capacity figure, pool against the flat design, in same_bytes()
    tok = _layout().kv_bytes_per_token
    b = same_bytes()
    mixed = [served_mixed(s) for s in range(MIX_SEEDS)]
    held = sorted(m[0] for m in mixed)
    out = {
        "bytes": b,
        "flat_bytes_per_sequence": FLAT_MAX_LEN * tok,
        "mixed_lengths": "uniform %d..%d tokens, %d draws (seeds 0..%d)" % (MIN_LEN, MAX_LEN, MIX_SEEDS, MIX_SEEDS - 1),
        "mixed_flat_sequences": b // (FLAT_MAX_LEN * tok),
        "mixed_pool_sequences_median": held[len(held) // 2],
        "mixed_pool_sequences_min": held[0],
        "mixed_pool_tokens_median": sorted(m[1] for m in mixed)[len(mixed) // 2],
        "shared_prompt_tokens": PROMPT,
        "shared_gen_tokens": GEN,
        "shared_flat_requests": b // ((PROMPT + GEN) * tok),  # flat sized exactly to prompt + gen, its best case
        "shared_pool_requests": served_shared(),
        "evict_window_tokens": WINDOW,
        "evict_decode_tokens": DECODE,
        "evict_flat_sequences": b // (DECODE * tok),  # no eviction: every decoded token stays
    }
    for policy in ("window", "sinks", "h2o"):
        n, toks, refused = served_evicting(policy)
        out["evict_%s_pool_sequences" % policy] = n
        out["evict_%s_pool_refused" % policy] = refused
    return out


def run(as_json=False):
    # every figure in one run; prints one JSON object with as_json
    mp = micro_figures()
    cp = cpython_figures()
    ch = churn()
    hi = ch[3]  # 16 active: peak demand about the whole arena, mean occupancy ~70 %
    r = {
        "micropython_heap_bytes": mp["heap_bytes"],
        "shape": "stories260K KV: 5 layers x 4 KV heads x 8, fp32, 1280 B/token",
        "timed_appends": mp["timed_appends"],
        "repeats": mp["repeats"],
        "capacity": capacity(),
        "churn": ch,
        "churn_active": hi["active"],
        "churn_pool_success_rate": hi["pool"]["success_rate"],
        "churn_first_fit_success_rate": hi["first_fit"]["success_rate"],
        "churn_setup": "%d sequences, lengths uniform %d..%d tokens, arena %d tokens, seed %d; one token per sequence per round"
                       % (CHURN_SEQUENCES, MIN_LEN, MAX_LEN, ARENA_BLOCKS * T, CHURN_SEED),
    }
    for interp, d in (("micropython", mp), ("cpython", cp)):
        for k, v in d.items():
            if k not in ("layout", "heap_bytes", "timed_appends", "repeats", "flat_max_len"):
                r["%s_%s" % (k, interp)] = v
        for at in (64, 256, 512):
            r["ours_over_flat_kv_at_%d_%s" % (at, interp)] = round(d["ours_ns_at_%d" % at] / d["flat_kv_ns_at_%d" % at], 3)
            r["ours_over_flat_row_at_%d_%s" % (at, interp)] = round(d["ours_ns_at_%d" % at] / d["flat_row_ns_at_%d" % at], 3)
        r["concat_over_ours_at_512_%s" % interp] = round(d["concat_ns_at_512"] / d["ours_ns_at_512"], 1)
        r["ours_flatness_512_over_64_%s" % interp] = round(d["ours_ns_at_512"] / d["ours_ns_at_64"], 3)
    return emit(r, as_json, render)


# --- the benchmark's section of docs/benchmarks.md (host/benchdoc.py calls these) ------
TITLE = "KV cache and pool"


def _fx(v):
    # a figure for a table: thousands separators, None as n/a
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return "%.3g" % v if v < 100 else "{:,.0f}".format(v)
    return "{:,}".format(v) if isinstance(v, int) and not isinstance(v, bool) else str(v)


def render(r):
    # markdown lines of the section from the figures r (the JSON's "figures")
    def g(key, interp):
        return r.get("%s_%s" % (key, interp))

    L = []
    w = L.append
    w("Append of one token (%s), median of %d runs of %d appends, every design timed side by side in one loop "
      "(`firmware_py/tools/kvbench.py`; MicroPython with the default board's usable heap of %s B). "
      "**ours**: `KVCache.append` (handle check, block table, slot header, then one strided viper copy of every "
      "layer's row, `pool.copy_rows`). **flat K,V**: what llama2.c `run.c` and esp32-llm do: one K and one V array "
      "[layers][max_len][kv_dim], preallocated, token pos written in place at l x max_len x kv_dim + pos x kv_dim by "
      "the same copy primitive (two strided copies, from the model's K and V vectors). **flat row**: the same flat "
      "design in our row format (one strided copy: exactly the copy ours makes), so ours / flat row is the block "
      "table alone. **floor**: one `copy32` of the whole 1,280 B row, no bookkeeping. **concat**: a new, longer "
      "bytes object per layer per token."
      % (r["shape"], r["repeats"], r["timed_appends"], _fx(r["micropython_heap_bytes"])))
    w("")
    w("| ns per append | MicroPython at 64 | at 256 | at 512 | CPython at 64 | at 256 | at 512 |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    for key, label in (("ours", "ours (block table)"), ("flat_kv", "flat K,V (llama2.c)"), ("flat_row", "flat row"),
                       ("floor", "floor: raw copy"), ("reserve", "ours, reserve() alone (bookkeeping + zeroing the reserved rows, no copy)"),
                       ("concat", "concat per token")):
        w("| %s | %s |" % (label, " | ".join(_fx(g("%s_ns_at_%d" % (key, at), i)) for i in ("micropython", "cpython")
                                             for at in (64, 256, 512))))
    for key, label in (("ours_over_flat_kv", "**ratio ours / flat K,V** (goal <= 1.5)"),
                       ("ours_over_flat_row", "ratio ours / flat row (block table alone)")):
        w("| %s | %s |" % (label, " | ".join(_fx(g("%s_at_%d" % (key, at), i)) for i in ("micropython", "cpython")
                                             for at in (64, 256, 512))))
    w("")
    w("Flatness (ours at 512 / at 64): MicroPython %s, CPython %s; concat / ours at 512: MicroPython %sx, CPython %sx."
      % tuple(_fx(g(k, i)) for k in ("ours_flatness_512_over_64", "concat_over_ours_at_512") for i in ("micropython", "cpython")))
    w("")
    w("| heap bytes (total over a count) | MicroPython | CPython |")
    w("| --- | --- | --- |")
    for label, b, n in (("ours", "ours_alloc_bytes", "ours_alloc_appends"),
                        ("flat K,V", "flat_kv_alloc_bytes", "flat_kv_alloc_appends"),
                        ("concat at 512", "concat_alloc_bytes_at_512", "concat_alloc_appends_at_512"),
                        ("int8 quantization of a token (model side, floats)", "quantize_int8_alloc_bytes", "quantize_int8_alloc_tokens")):
        w("| %s | %s |" % (label, " | ".join("%s B over %s" % (_fx(g(b, i)), _fx(g(n, i))) if g(b, i) is not None else "n/a (no fixed heap)"
                                             for i in ("micropython", "cpython"))))
    w("| ours, appends completed with the heap locked | %s of %s | n/a |" % (
        _fx(g("heap_locked_appends", "micropython")), _fx(g("heap_locked_appends_asked", "micropython"))))
    w("")
    w("Append while evicting at a 512-token budget (MicroPython): window %s ns, sinks %s ns, h2o %s ns "
      "(h2o scans the budget's slot headers). int8 quantization of one token: %s ns." % tuple(
          _fx(g(k, "micropython")) for k in ("window_evicting_ns_at_512", "sinks_evicting_ns_at_512", "h2o_evicting_ns_at_512",
                                             "quantize_int8_ns_per_token")))
    c = r["capacity"]
    w("")
    w("What the pool buys over the flat design, in the same %s B (what flat arrays reserve for %d sequences of %d "
      "positions); the real `Pool` + `KVCache` on CPython, every per-block cost of ours charged (counts, not times):"
      % (_fx(c["bytes"]), FLAT_SEQS, FLAT_MAX_LEN))
    w("")
    w("| workload | flat arrays | our pool |")
    w("| --- | --- | --- |")
    w("| sequences of mixed lengths held at once (%s) | %s | **%s** median, %s worst (%s tokens) |" % (
        c["mixed_lengths"], c["mixed_flat_sequences"], c["mixed_pool_sequences_median"], c["mixed_pool_sequences_min"],
        _fx(c["mixed_pool_tokens_median"])))
    w("| requests sharing a %d-token prompt, %d tokens each after it (flat sized to exactly %d) | %s | **%s** (fork) |" % (
        c["shared_prompt_tokens"], c["shared_gen_tokens"], c["shared_prompt_tokens"] + c["shared_gen_tokens"],
        c["shared_flat_requests"], c["shared_pool_requests"]))
    for policy in ("window", "sinks", "h2o"):
        w("| sequences decoding %s tokens, %s policy keeping %d (appends refused: %d) | %s | **%s** |" % (
            _fx(c["evict_decode_tokens"]), policy, c["evict_window_tokens"], c["evict_%s_pool_refused" % policy],
            c["evict_flat_sequences"], c["evict_%s_pool_sequences" % policy]))
    w("")
    w("A flat array written as a ring would match the window row; the pool's gain is that rings, "
      "shared prompts and mixed lengths all draw on one arena.")
    w("")
    w("Fragmentation churn (`churn` in the JSON): %s. Our pool (`full` policy, blocks on demand) against a first-fit "
      "variable-size allocator with coalescing (FreeRTOS heap_4 style) that grows each sequence's contiguous buffer 16 "
      "tokens at a time (in place when the next range is free, else move). A sequence fails when an allocation is "
      "refused; peak demand = active x mean length / arena." % r["churn_setup"])
    w("")
    w("| active | peak demand | pool ok | pool mean occupancy | first-fit ok | first-fit mean occupancy | first-fit external fragmentation |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    for x in r["churn"]:
        w("| %d | %.2f | %.1f %% | %.2f | %.1f %% | %.2f | %.2f |" % (
            x["active"], x["demand_vs_arena"], 100 * x["pool"]["success_rate"], x["pool"]["mean_occupancy"],
            100 * x["first_fit"]["success_rate"], x["first_fit"]["mean_occupancy"], x["first_fit"]["mean_external_fragmentation"]))
    return L
