# The forward pass on the committed kvrtos-tiny model, on every interpreter (plain
# backend; numpy too on CPython): greedy tokens against the model card's reference
# (models/kvrtos-tiny/reference.json), rope "cache" equal to "absolute" while nothing
# is evicted, int8/int4 KV rows decoding, refusals (full budget, stale handle, wrong
# position), and decode as a kernel task beside a periodic task that keeps its
# deadline on the VirtualClock (and misses it when a layer step is made too long).
import json

from fwtest import check, done, eq

from firmware_py import compat, decode, kv, llama2c, pool
from firmware_py.clock import VirtualClock
from firmware_py.model import Model, ModelError
from firmware_py.sample import argmax
from firmware_py.sched import S_MISSES, S_RUNS, Kernel
from firmware_py.status import E_FULL, E_RANGE, E_STALE

TINY = "models/kvrtos-tiny/"
N = 12  # greedy tokens checked per run here (tests/test_model.py checks whole stories)

ref = json.load(open(TINY + "reference.json"))
w = llama2c.load(TINY + "model.bin")
cfg = w.cfg


# (pool, cache, region) for the tiny model: n_blocks of the given KV dtype
def boot(dtype="fp32", n_blocks=4, h2o=False):
    lay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, dtype)
    p = pool.Pool(lay.block_bytes, n_blocks)
    c = kv.KVCache(p, lay, max_seqs=2, h2o=h2o)
    return p, c, p.add_region(n_blocks)


# greedy ids after prompt ids, n of them, with model m on sequence h
def greedy(m, h, ids, n):
    out = []
    tok = ids[0]
    pos = 0
    while len(out) < n:
        for _ in m.forward(h, tok, pos):
            pass
        check(m.status >= 0, "forward status %d at pos %d" % (m.status, pos))
        pos += 1
        if pos < len(ids):
            tok = ids[pos]
            continue
        tok = argmax(m.logits, cfg.vocab_size)
        out.append(tok)
    return out


g = ref["greedy"][0]
prompt_ids = [1, 313, 319, 261, 318]  # "Once upon a time" with BOS (tests/test_model.py re-derives it)
eq(g["ids"][:5], prompt_ids, "reference prompt ids")
want = g["ids"][5:5 + N]
backends = ["plain"] + (["numpy"] if compat.numpy() is not None else [])
for be in backends:
    p, c, r = boot()
    m = Model(w, c, backend=be)
    h = c.open(r, "full", 0)
    eq(greedy(m, h, prompt_ids, N), want, "kvrtos-tiny greedy, %s backend" % be)
    c.close(h)
    m2 = Model(w, c, backend=be, rope="cache")
    h = c.open(r, "full", 0)
    eq(greedy(m2, h, prompt_ids, N), want, "rope cache == absolute while nothing is evicted, %s" % be)
    c.close(h)

# rope "cache" ranks on the plain path: a merge sort in parts of any size (begin_part p 2),
# each slot's cos/sin row that of its rank by position (ties by slot), on every interpreter
import math  # noqa: E402

from firmware_py import kernels  # noqa: E402


class Slots:
    def __init__(self, pos):
        self.pos = pos

    def slot_pos(self, h, s):
        return self.pos[s]


p, c, r = boot(n_blocks=3)
m = Model(w, c, backend="plain", rope="cache")
k = m.k
h2 = cfg.head_dim // 2
real = k.cache
bad = 0
for n in (1, 2, 3, 5, 8, 13, 17, 31, 47):
    pos = [(7 * s * s + 3) % (2 * n + 1) + 1 for s in range(n)]  # ties too
    k.cache = Slots(pos)
    for ph in (1, 2, 3):
        ln = kernels.begin_len(n, cfg.head_dim, ph)
        s = 0
        while s < ln:
            e = s + 5 if s + 5 < ln else ln
            k.begin_part(0, n, ph, s, e)
            s = e
    order = sorted([(pos[s], s) for s in range(n)])
    for rk in range(n):
        s = order[rk][1]
        for i in range(h2):
            if abs(k.kcos[s * h2 + i] - math.cos(rk * k.inv_freq[i])) > 1e-5 or abs(k.ksin[s * h2 + i] - math.sin(rk * k.inv_freq[i])) > 1e-5:
                bad += 1
k.cache = real
eq(bad, 0, "plain rope cache: every slot turned by its rank, the sort in parts of 5")

# quantized KV rows go through the same forward pass (agreement is measured in tests/test_model.py)
for dt in ("int8", "int4"):
    p, c, r = boot(dt)
    m = Model(w, c, backend="plain")
    h = c.open(r, "full", 0)
    got = greedy(m, h, prompt_ids, 4)
    check(len(got) == 4 and min(got) >= 0, "%s KV decodes" % dt)

# refusals: a full budget stops with E_FULL, a stale handle, a position out of order
p, c, r = boot("fp32", 1)
m = Model(w, c, backend="plain")
h = c.open(r, "full", 3)
for pos in range(3):
    for _ in m.forward(h, 1, pos):
        pass
    eq(m.status >= 0, True, "token %d fits" % pos)
steps = 0
for _ in m.forward(h, 1, 3):
    steps += 1
eq((m.status, steps), (E_FULL, 0), "budget of 3 reached: E_FULL, no layer run")
for _ in m.forward(h, 1, 7):
    pass
eq(m.status, E_RANGE, "a position that is not the next one")
c.close(h)
for _ in m.forward(h, 1, 3):
    pass
eq(m.status, E_STALE, "a closed handle")
try:
    Model(w, c, backend="bogus")
    check(False, "bad backend refused")
except ModelError:
    check(True, "bad backend refused")
lay_bad = kv.Layout(cfg.n_layers + 1, cfg.n_kv_heads, cfg.head_dim, "fp32")
try:
    Model(w, kv.KVCache(pool.Pool(lay_bad.block_bytes, 1), lay_bad), backend="plain")
    check(False, "a cache of another shape refused")
except ModelError:
    check(True, "a cache of another shape refused")


# decode as a kernel task (plain backend, 6 tokens) with a 1 ms periodic task of higher
# priority beside it, deadline 400 us; each layer step charges layer_us of virtual time.
# Returns (periodic runs, periodic misses, decoded ids)
def beside(layer_us):
    s = decode.Session(TINY + "model.bin", TINY + "tokenizer.bin", backend="plain", heap=3000000)
    s.layer_us = layer_us
    k = Kernel(VirtualClock(), max_tasks=4, verbose=False)
    flag = [0]

    def dec():
        yield from s.task(k, prompt_ids, 6, lambda b: None)
        flag[0] = 1

    def periodic():
        t = k.now()
        while not flag[0]:
            t = compat.ticks_add(t, 1000)
            yield k.sleep_until(t)

    k.spawn("decode", 1, dec())
    tp = k.spawn("periodic", 5, periodic(), deadline_us=400)
    k.run()
    return tp.st[S_RUNS], tp.st[S_MISSES], list(s.tokens)


runs, misses, ids = beside(300)
eq(ids, want[:6], "decode task's greedy ids")
check(runs >= 6 * 4 * 300 // 1000 - 1, "the periodic task ran beside decode (%d runs)" % runs)
eq(misses, 0, "a 300 us layer step: the periodic task keeps its 400 us deadline")
runs, misses, _ = beside(900)
check(misses > 0, "a 900 us layer step makes it miss (%d misses): the check can fail" % misses)
done()
