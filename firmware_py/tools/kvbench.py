# KV append micro-benchmark, run on the target interpreter (host/bench/kv.py runs it
# under MicroPython): our in-place block append vs the naive cache the source
# documents describe (a new, longer array per layer per token, as torch.cat does),
# at 64, 256 and 512 cached tokens, plus heap bytes allocated per append.
# Prints one JSON object. Shape: stories260K (5 layers, 4 KV heads x 8, fp32).
import json

from firmware_py import kv, pool, quant
from firmware_py.compat import collect, const, mem_alloc, ticks_diff, ticks_us

_LAYERS = const(5)
_KV_HEADS = const(4)
_HEAD_DIM = const(8)
_TIMED = const(64)  # appends timed per measurement
_REPEAT = const(5)  # measurements per point; the median is reported
POINTS = (64, 256, 512)


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


# ns per append of our cache with `at` tokens already cached (median of _REPEAT)
def ours_ns(cache, region, row, at):
    runs = []
    for _ in range(_REPEAT):
        s = cache.open(region, "full", at + _TIMED)
        for _ in range(at):
            cache.append(s, row)
        t0 = ticks_us()
        for _ in range(_TIMED):
            cache.append(s, row)
        runs.append(ticks_diff(ticks_us(), t0) * 1000 // _TIMED)
        cache.close(s)
    return _median(runs)


# heap bytes one append allocates in our cache (averaged over _TIMED appends)
def ours_alloc(cache, region, row):
    s = cache.open(region, "full", 2 * _TIMED)
    cache.append(s, row)  # first block allocated outside the measurement
    collect()
    a0 = mem_alloc()
    for _ in range(_TIMED):
        cache.append(s, row)
    a1 = mem_alloc()
    cache.close(s)
    return None if a0 is None else (a1 - a0) // _TIMED


class ConcatCache:
    # the naive cache: per layer a K and a V bytes object, rebuilt one row longer per token
    def __init__(self, layout):
        self.k = [b""] * layout.n_layers  # K rows so far, one bytes object per layer
        self.v = [b""] * layout.n_layers  # V rows so far
        self.d = layout.data_bytes  # bytes of K (or V) per layer per token

    # append one token row: O(tokens) copy and a fresh allocation per layer, K and V
    def append(self, row, layout):
        d = self.d
        for layer in range(len(self.k)):
            o = layer * layout.layer_row
            self.k[layer] = self.k[layer] + row[o:o + d]
            self.v[layer] = self.v[layer] + row[o + d:o + 2 * d]


# ns per append of the naive cache at `at` tokens, and heap bytes one append allocates
def concat_ns(layout, row, at):
    runs = []
    alloc = None
    for _ in range(3):
        c = ConcatCache(layout)
        for _ in range(at):
            c.append(row, layout)
        collect()
        a0 = mem_alloc()
        c.append(row, layout)
        a1 = mem_alloc()
        if a0 is not None:
            alloc = a1 - a0
        t0 = ticks_us()
        for _ in range(_TIMED // 4):
            c.append(row, layout)
        runs.append(ticks_diff(ticks_us(), t0) * 1000 // (_TIMED // 4))
        c = None
        collect()
    return _median(runs), alloc


def main():
    layout = kv.Layout(_LAYERS, _KV_HEADS, _HEAD_DIM, "fp32")
    n_blocks = (max(POINTS) + _TIMED) // layout.tokens_per_block + 2
    p = pool.Pool(layout.block_bytes, n_blocks)
    cache = kv.KVCache(p, layout, max_seqs=2, h2o=True)
    region = p.add_region(n_blocks)
    row = bytearray(layout.row_bytes)
    for i in range(len(row)):
        row[i] = i & 255
    out = {"layout": layout.to_dict()}
    for at in POINTS:
        out["append_ns_at_%d" % at] = ours_ns(cache, region, row, at)
    for at in POINTS:
        ns, alloc = concat_ns(layout, row, at)
        out["append_ns_concat_at_%d" % at] = ns
        out["alloc_bytes_per_append_concat_at_%d" % at] = alloc
    out["alloc_bytes_per_append"] = ours_alloc(cache, region, row)
    # ring and h2o eviction cost at a 512-token budget (steady state: every append evicts)
    for policy in ("window", "sinks", "h2o"):
        runs = []
        for _ in range(3):
            s = cache.open(region, policy, 512, 4, 256)
            for _ in range(512 + 8):
                cache.append(s, row)
            t0 = ticks_us()
            for _ in range(_TIMED // 4):
                cache.append(s, row)
            runs.append(ticks_diff(ticks_us(), t0) * 1000 // (_TIMED // 4))
            cache.close(s)
        out["append_ns_%s_evicting_at_512" % policy] = _median(runs)
    # the model side: quantizing one token's K/V to int8 uses floats, so it allocates
    lq = kv.Layout(_LAYERS, _KV_HEADS, _HEAD_DIM, "int8")
    ks = [[(i % 7 - 3) * 0.25 for i in range(lq.kv_dim)] for _ in range(_LAYERS)]
    qrow = bytearray(lq.row_bytes)
    collect()
    a0 = mem_alloc()
    quant.pack_token(lq, ks, ks, qrow)
    a1 = mem_alloc()
    out["quantize_int8_alloc_bytes_per_token"] = None if a0 is None else a1 - a0
    t0 = ticks_us()
    for _ in range(8):
        quant.pack_token(lq, ks, ks, qrow)
    out["quantize_int8_ns_per_token"] = ticks_diff(ticks_us(), t0) * 1000 // 8
    print(json.dumps(out))


if __name__ == "__main__":
    main()
