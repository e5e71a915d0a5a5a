# KV append micro-benchmark, run on the target interpreter (host/bench/kv.py runs it
# under MicroPython and CPython). Every design is timed side by side in one loop, the
# median of _REPEAT runs of _TIMED appends each, at 64, 256 and 512 cached tokens:
#   ours      KVCache.append: handle check, block table, slot header, then one strided
#             viper copy of every layer's row (pool.copy_rows)
#   flat_kv   what a user writes without a pool (llama2.c run.c, esp32-llm): one K and
#             one V array [L][max_len][kv_dim] preallocated at boot, token pos written
#             in place at l * max_len * kv_dim + pos * kv_dim: two strided copies with
#             the same primitive, from the model's K and V vectors ([L][kv_dim] each)
#   flat_row  the same flat design in our row format ([L][max_len][layer_row], one
#             strided copy), so ours / flat_row is the cost of the block table alone
#   floor     one copy32 of the whole token row, no bookkeeping at all
#   concat    the straw man: a new, longer bytes object per layer per token (torch.cat)
# plus heap bytes (total over a count of appends), a heap-locked append loop,
# reserve() alone (bookkeeping and zeroing the reserved rows, no copy), eviction at a 512 budget and int8 quantization.
# Prints one JSON object. Shape: stories260K (5 layers, 4 KV heads x 8, fp32).
import json

from firmware_py import compat, kv, pool, quant
from firmware_py.compat import collect, const, mem_alloc, ticks_diff, ticks_us
from firmware_py.pool import copy_rows as _copy_rows  # the copy our cache uses: flat designs get the same
from firmware_py.pool import copy32

_LAYERS = const(5)
_KV_HEADS = const(4)
_HEAD_DIM = const(8)
_TIMED = const(128)  # appends timed per measurement
_REPEAT = const(9)  # measurements per point; the median is reported
_MAX_LEN = const(640)  # flat designs' max_len: the largest point + _TIMED
_LOCKED = const(512)  # appends run with the heap locked
POINTS = (64, 256, 512)


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


class FlatKV:
    # llama2.c's cache: one K and one V bytearray[L][max_len][kv_dim elements], made at boot
    def __init__(self, layout, max_len):
        self.n_layers = layout.n_layers  # L
        self.k = bytearray(layout.n_layers * max_len * layout.data_bytes)  # [L][max_len][kv_dim]
        self.v = bytearray(layout.n_layers * max_len * layout.data_bytes)  # [L][max_len][kv_dim]
        self.dw = layout.data_bytes // 4  # uint32 words of K (or V) per layer per token
        self.step = max_len * self.dw  # words from one layer's plane to the next
        self.max_len = max_len  # positions each plane holds
        self.n = 0  # positions written (the next position)

    # write the model's K and V vectors of every layer (ksrc, vsrc: [L][kv_dim]) at the
    # next position; -1 past max_len, else the position; O(row), no allocation
    def append(self, ksrc, vsrc):
        n = self.n
        if n >= self.max_len:
            return -1
        dw = self.dw
        _copy_rows(self.k, n * dw, self.step, ksrc, 0, dw, self.n_layers)
        _copy_rows(self.v, n * dw, self.step, vsrc, 0, dw, self.n_layers)
        self.n = n + 1
        return n


class FlatRow:
    # the flat design in our row format: one bytearray[L][max_len][layer_row]
    def __init__(self, layout, max_len):
        self.n_layers = layout.n_layers  # L
        self.rows = bytearray(layout.n_layers * max_len * layout.layer_row)  # [L][max_len][layer_row]
        self.lw = layout.layer_row // 4  # words per layer row
        self.step = max_len * self.lw  # words from one layer's plane to the next
        self.max_len = max_len  # positions each plane holds
        self.n = 0  # positions written

    # write token row src at the next position, one strided copy; -1 past max_len; O(row)
    def append(self, src, _unused=None):
        n = self.n
        if n >= self.max_len:
            return -1
        w = self.lw
        _copy_rows(self.rows, n * w, self.step, src, 0, w, self.n_layers)
        self.n = n + 1
        return n


class ConcatCache:
    # the naive cache: per layer a K and a V bytes object, rebuilt one row longer per token
    def __init__(self, layout):
        self.k = [b""] * layout.n_layers  # K rows so far, one bytes object per layer
        self.v = [b""] * layout.n_layers  # V rows so far
        self.d = layout.data_bytes  # bytes of K (or V) per layer per token
        self.lr = layout.layer_row  # bytes per source layer row

    # append one token row: O(tokens) copy and a fresh allocation per layer, K and V
    def append(self, row):
        d = self.d
        for layer in range(len(self.k)):
            o = layer * self.lr
            self.k[layer] = self.k[layer] + row[o:o + d]
            self.v[layer] = self.v[layer] + row[o + d:o + 2 * d]


# ns per append of ours with `at` tokens cached (one run of _TIMED appends)
def _ours_once(cache, region, row, at):
    s = cache.open(region, "full", at + _TIMED)
    for _ in range(at):
        cache.append(s, row)
    t0 = ticks_us()
    for _ in range(_TIMED):
        cache.append(s, row)
    dt = ticks_diff(ticks_us(), t0)
    cache.close(s)
    return dt * 1000 // _TIMED


# ns per reserve() alone at `at` tokens: the bookkeeping part of ours, no copy
def _reserve_once(cache, region, at):
    s = cache.open(region, "full", at + _TIMED)
    for _ in range(at):
        cache.reserve(s)
    t0 = ticks_us()
    for _ in range(_TIMED):
        cache.reserve(s)
    dt = ticks_diff(ticks_us(), t0)
    cache.close(s)
    return dt * 1000 // _TIMED


# ns per append of a flat cache (FlatKV(ka, va) or FlatRow(row)) at position `at`
def _flat_once(flat, a, b, at):
    flat.n = at
    t0 = ticks_us()
    for _ in range(_TIMED):
        flat.append(a, b)
    return ticks_diff(ticks_us(), t0) * 1000 // _TIMED


# ns per raw copy of one token row into the arena: the floor, no bookkeeping
def _floor_once(arena, row, words):
    t0 = ticks_us()
    for i in range(_TIMED):
        copy32(arena, i * words, row, 0, words)
    return ticks_diff(ticks_us(), t0) * 1000 // _TIMED


# side-by-side medians at every point: {design: {at: ns}}
def append_ns(cache, region, row, layout):
    fk = FlatKV(layout, _MAX_LEN)
    fr = FlatRow(layout, _MAX_LEN)
    words = layout.row_bytes // 4
    ksrc = bytearray(layout.n_layers * layout.data_bytes)  # the model's K vectors [L][kv_dim]
    vsrc = bytearray(layout.n_layers * layout.data_bytes)  # and V vectors
    runs = {}
    for at in POINTS:
        for name in ("ours", "reserve", "flat_kv", "flat_row", "floor"):
            runs[(name, at)] = []
    for _ in range(_REPEAT):
        for at in POINTS:
            runs[("ours", at)].append(_ours_once(cache, region, row, at))
            runs[("flat_kv", at)].append(_flat_once(fk, ksrc, vsrc, at))
            runs[("flat_row", at)].append(_flat_once(fr, row, None, at))
            runs[("floor", at)].append(_floor_once(cache.arena, row, words))
            runs[("reserve", at)].append(_reserve_once(cache, region, at))
    out = {}
    for (name, at), xs in runs.items():
        out.setdefault(name, {})[at] = _median(xs)
    return out


# (heap bytes, appends) for n appends of append_fn after a collect; bytes None on CPython
def _alloc(append_fn, n):
    collect()
    a0 = mem_alloc()
    for _ in range(n):
        append_fn()
    a1 = mem_alloc()
    return (None if a0 is None else a1 - a0), n


# appends that complete with the heap locked (_LOCKED asked); None where the heap cannot be locked
def _locked_appends(cache, region, row):
    if not compat.HEAP_LOCK:
        return None
    s = cache.open(region, "full", _LOCKED)
    box = [0]  # made before the lock: the loop itself must not allocate
    compat.heap_lock()
    try:
        _fill(cache, s, row, box)
    except MemoryError:
        pass
    finally:
        compat.heap_unlock()
    cache.close(s)
    return box[0]


# append row to s _LOCKED times, counting successes in box[0]
def _fill(cache, s, row, box):
    for _ in range(_LOCKED):
        if cache.append(s, row) < 0:
            return
        box[0] += 1


# ns per append of the naive cache at `at` tokens, and (bytes, appends) of one append
def concat_ns(layout, row, at):
    runs = []
    alloc = (None, 1)
    for _ in range(3):
        c = ConcatCache(layout)
        for _ in range(at):
            c.append(row)
        collect()
        a0 = mem_alloc()
        c.append(row)
        a1 = mem_alloc()
        if a0 is not None:
            alloc = (a1 - a0, 1)
        t0 = ticks_us()
        for _ in range(_TIMED // 8):
            c.append(row)
        runs.append(ticks_diff(ticks_us(), t0) * 1000 // (_TIMED // 8))
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
    out = {"layout": layout.to_dict(), "timed_appends": _TIMED, "repeats": _REPEAT, "flat_max_len": _MAX_LEN}
    ns = append_ns(cache, region, row, layout)
    for name, by_at in ns.items():
        for at, v in by_at.items():
            out["%s_ns_at_%d" % (name, at)] = v
    for at in POINTS:
        c_ns, (c_bytes, c_n) = concat_ns(layout, row, at)
        out["concat_ns_at_%d" % at] = c_ns
        out["concat_alloc_bytes_at_%d" % at] = c_bytes
        out["concat_alloc_appends_at_%d" % at] = c_n
    # heap bytes over 2 * _TIMED appends (the first block is taken before counting)
    s = cache.open(region, "full", 2 * _TIMED + 1)
    cache.append(s, row)
    out["ours_alloc_bytes"], out["ours_alloc_appends"] = _alloc(lambda: cache.append(s, row), 2 * _TIMED)
    cache.close(s)
    fk = FlatKV(layout, _MAX_LEN)
    kv_src = bytearray(layout.n_layers * layout.data_bytes)
    out["flat_kv_alloc_bytes"], out["flat_kv_alloc_appends"] = _alloc(lambda: fk.append(kv_src, kv_src), 2 * _TIMED)
    out["heap_locked_appends_asked"] = _LOCKED
    out["heap_locked_appends"] = _locked_appends(cache, region, row)
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
        out["%s_evicting_ns_at_512" % policy] = _median(runs)
    # the model side: quantizing one token's K/V to int8 uses floats, so it allocates
    lq = kv.Layout(_LAYERS, _KV_HEADS, _HEAD_DIM, "int8")
    ks = [[(i % 7 - 3) * 0.25 for i in range(lq.kv_dim)] for _ in range(_LAYERS)]
    qrow = bytearray(lq.row_bytes)
    out["quantize_int8_alloc_bytes"], out["quantize_int8_alloc_tokens"] = _alloc(lambda: quant.pack_token(lq, ks, ks, qrow), 1)
    t0 = ticks_us()
    for _ in range(8):
        quant.pack_token(lq, ks, ks, qrow)
    out["quantize_int8_ns_per_token"] = ticks_diff(ticks_us(), t0) * 1000 // 8
    print(json.dumps(out))


if __name__ == "__main__":
    main()
