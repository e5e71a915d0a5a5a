# `./kv bench kv [--json]`: the KV cache's figures in one run.
#  - append cost of our in-place cache vs a cache that concatenates a new array per
#    token, at 64, 256 and 512 tokens, and heap bytes per append, measured on the
#    MicroPython unix port (firmware_py/tools/kvbench.py under -X heapsize of the default
#    board) and, for reference, on CPython;
#  - fragmentation churn: many sequences of random lengths at high occupancy on one
#    arena, our block pool (the real firmware_py Pool + KVCache) vs a first-fit
#    variable-size allocator with coalescing (FreeRTOS heap_4 style) growing each
#    sequence's contiguous buffer by realloc.
import json
import os
import random

from firmware_py import kv, pool
from host import boards, paths
from host import interp as interp_mod
from host.errors import UserError

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
    # our pool: each sequence appends one token per round; ST_NO_BLOCK fails it
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
            if st == kv.ST_NO_BLOCK:
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


def run(as_json=False):
    # every figure in one run; prints one JSON object with as_json
    mp = micro_figures()
    cp = cpython_figures()
    ch = churn()
    hi = ch[3]  # 16 active: peak demand about the whole arena, mean occupancy ~70 %
    r = {
        "interpreter": "micropython unix port, -X heapsize=%d" % mp["heap_bytes"],
        "shape": "stories260K KV: 5 layers x 4 KV heads x 8, fp32, 1280 B/token",
        "append_ns_at_64": mp["append_ns_at_64"],
        "append_ns_at_256": mp["append_ns_at_256"],
        "append_ns_at_512": mp["append_ns_at_512"],
        "append_ns_concat_at_64": mp["append_ns_concat_at_64"],
        "append_ns_concat_at_256": mp["append_ns_concat_at_256"],
        "append_ns_concat_at_512": mp["append_ns_concat_at_512"],
        "concat_over_ours_at_512": round(mp["append_ns_concat_at_512"] / mp["append_ns_at_512"], 1),
        "flatness_512_over_64": round(mp["append_ns_at_512"] / mp["append_ns_at_64"], 3),
        "alloc_bytes_per_append_micropython": mp["alloc_bytes_per_append"],
        "alloc_bytes_per_append_concat_at_512_micropython": mp["alloc_bytes_per_append_concat_at_512"],
        "append_ns_window_evicting_at_512": mp["append_ns_window_evicting_at_512"],
        "append_ns_sinks_evicting_at_512": mp["append_ns_sinks_evicting_at_512"],
        "append_ns_h2o_evicting_at_512": mp["append_ns_h2o_evicting_at_512"],
        "quantize_int8_alloc_bytes_per_token_micropython": mp["quantize_int8_alloc_bytes_per_token"],
        "quantize_int8_ns_per_token": mp["quantize_int8_ns_per_token"],
        "cpython_append_ns_at_512": cp["append_ns_at_512"],
        "cpython_append_ns_concat_at_512": cp["append_ns_concat_at_512"],
        "churn_active": hi["active"],
        "churn_pool_success_rate": hi["pool"]["success_rate"],
        "churn_first_fit_success_rate": hi["first_fit"]["success_rate"],
        "churn": ch,
        "churn_setup": "%d sequences, lengths uniform %d..%d tokens, arena %d tokens, seed %d; one token per sequence per round"
                       % (CHURN_SEQUENCES, MIN_LEN, MAX_LEN, ARENA_BLOCKS * T, CHURN_SEED),
    }
    if as_json:
        print(json.dumps(r, sort_keys=True))
        return r
    print("KV append, %s (%s)" % (r["shape"], r["interpreter"]))
    for at in (64, 256, 512):
        print("  at %3d tokens: ours %8d ns   concat %10d ns" % (at, r["append_ns_at_%d" % at], r["append_ns_concat_at_%d" % at]))
    print("  concat / ours at 512: %sx   ours 512/64: %s" % (r["concat_over_ours_at_512"], r["flatness_512_over_64"]))
    print("  heap bytes per append: ours %s, concat at 512 %s" % (r["alloc_bytes_per_append_micropython"],
                                                               r["alloc_bytes_per_append_concat_at_512_micropython"]))
    print("  evicting at a 512 budget: window %d ns, sinks %d ns, h2o %d ns" % (
        r["append_ns_window_evicting_at_512"], r["append_ns_sinks_evicting_at_512"], r["append_ns_h2o_evicting_at_512"]))
    print("  int8 quantization (model side): %s B and %d ns per token" % (
        r["quantize_int8_alloc_bytes_per_token_micropython"], r["quantize_int8_ns_per_token"]))
    print("Fragmentation churn: %s" % r["churn_setup"])
    for c in ch:
        print("  %2d active (demand %.2f x arena): pool %.1f %% ok (occupancy %.2f)   first-fit %.1f %% ok (occupancy %.2f, ext. frag %.2f)" % (
            c["active"], c["demand_vs_arena"], 100 * c["pool"]["success_rate"], c["pool"]["mean_occupancy"],
            100 * c["first_fit"]["success_rate"], c["first_fit"]["mean_occupancy"], c["first_fit"]["mean_external_fragmentation"]))
    return r
