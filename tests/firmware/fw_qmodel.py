# The integer forward pass (firmware_py/qmodel.py) on a small random int8 model written
# here in the q8row format: decoding allocates nothing with the heap locked (step() and
# a kernel-style task driving forward()'s layers), under full, window and h2o caches
# and both RoPE modes; on MicroPython the viper kernels and their plain-Python twins
# give the same logits bit for bit over whole decodes (the 32-bit build included); the
# h2o scores are fed; misuse gets its status, configuration mistakes one line.
import os
import struct
from array import array

from fwtest import check, eq, raises, no_alloc, done, xorshift
from firmware_py import compat, kv, llama2c, pool, qmodel
from firmware_py import kernels_q as K
from firmware_py.status import E_FULL, E_RANGE, E_STALE

D, HID, NL, NH, NKV, V, S = 16, 24, 2, 4, 2, 40, 64  # head_dim 4, kv_dim 8
G = (16, 8, 16, 16, 16, 8, 12, 8)  # groups: token_embedding, wq, wk, wv, wo, w1, w2, w3
TMP = "/tmp/kvrtos_fw_qmodel_%d.bin" % struct.unpack("<I", os.urandom(4))[0]
rnd = xorshift(0x1234567)  # test inputs, the same on every interpreter


def write_model(path):
    # a q8row checkpoint of random int8 weights, scales 2**-7 .. 2**-5, gains near 1
    kvd = NKV * (D // NH)
    head = struct.pack("<II7iB3x", 0x3871766B, 1, D, HID, NL, NH, NKV, V, S, 1) + struct.pack("<9i", *(G + (0,)))
    head += bytes(256 - len(head))
    with open(path, "wb") as f:
        f.write(head)
        n = 0
        for _ in range(2 * NL + 1):
            f.write(struct.pack("<%df" % D, *[0.5 + rnd(100) / 100.0 for _ in range(D)]))
            n += 4 * D
        mats = [(V, D, G[0])]
        for (r, c), g in zip(((D, D),  # noqa: B905 - MicroPython's zip has no strict
                              (kvd, D), (kvd, D), (D, D), (HID, D), (D, HID), (HID, D)), G[1:]):
            mats += [(r, c, g)] * NL
        pos = 256 + n
        for r, c, g in mats:
            f.write(bytes((rnd(255) - 127) & 255 for _ in range(r * c)))
            pos += r * c
            pad = -pos & 3
            f.write(bytes(pad))
            pos += pad
            f.write(struct.pack("<%df" % (r * c // g), *[(1 + rnd(4)) / 128.0 for _ in range(r * c // g)]))
            pos += 4 * (r * c // g)
    return path


w = llama2c.load(write_model(TMP))
os.remove(TMP)
eq((w.dtype, w.cfg.format), ("int8", "q8row"), "the test model loads as int8 q8row")


def setup(policy="full", budget=S, h2o=False, rope="absolute", tpb=16):
    lay = kv.Layout(NL, NKV, D // NH, "int8", tokens_per_block=tpb)
    nb = (S + tpb - 1) // tpb + 1
    p = pool.Pool(lay.block_bytes, nb)
    c = kv.KVCache(p, lay, max_seqs=2, h2o=h2o)
    h = c.open(p.add_region(nb), policy, budget)
    return c, h, qmodel.QForward(w, c, rope)


def decode(m, h, n, out=None):
    # greedy decode of n tokens from BOS by step(); the ids into out (an array) when given
    tok = 1
    for i in range(n):
        st = m.step(h, tok, m.cache.length(h))
        if st < 0:
            return st
        tok = K.argmax(m.logits, V)
        if out is not None:
            out[i] = tok
    return 0


TWINS = ("matvec", "quant", "rmsnorm", "add", "rescale", "embed", "rope_row", "rope", "pack", "silu", "ranks", "attend", "argmax")


def use(kind):
    # point kernels_q's public names at the viper kernels or at their twins
    for name in TWINS:
        setattr(K, name, getattr(K, name + ("_v" if kind == "viper" else "_py")))


N = 48  # tokens per decode: past 2 blocks of 16 and past the window of 20 below
for policy, budget, h2o, rope in (("full", S, False, "absolute"), ("window", 20, False, "absolute"),
                                  ("h2o", 20, True, "absolute"), ("sinks", 20, False, "cache")):
    what = "%s/%d %s" % (policy, budget, rope)
    c, h, m = setup(policy, budget, h2o, rope)
    ids = array("i", [0] * N)
    eq(decode(m, h, 2), 0, what + ": warm-up decodes")
    no_alloc(what + ": %d decode steps" % (N - 2), lambda m=m, h=h, ids=ids: decode(m, h, N - 2, ids))
    eq(c.length(h), N, what + ": every step appended one position")
    check(len(set(ids)) > 3, what + ": the decode is not stuck on one token")
    if h2o:
        check(max(c.score(h, s) for s in range(budget)) > 0, what + ": attention scores reached the cache")
    if compat.IS_MICROPYTHON:
        ref = {}
        for kind in ("viper", "twin"):
            use(kind)
            c2, h2, m2 = setup(policy, budget, h2o, rope)
            got = array("i", [0] * N)
            eq(decode(m2, h2, N, got), 0, what + ": decode with the %s kernels" % kind)
            ref[kind] = (list(got), list(m2.logits))
        use("viper")
        eq(ref["viper"], ref["twin"], what + ": viper and twin kernels give the same tokens and logits")

# forward() as a kernel task drives it: the same logits as step(); its generator object is
# the only allocation, so a task that calls begin/layer/finish itself allocates nothing
c, h, m = setup()
c2, h2, m2 = setup()
for pos in range(5):
    m.step(h, 3 + pos, pos)
    for _ in m2.forward(h2, 3 + pos, pos):
        pass
    eq(list(m.logits), list(m2.logits), "forward() pos %d: the logits of step()" % pos)


def task(m, h, n):
    # a decode task as the kernel runs one: a layer per slice
    tok = 1
    for _ in range(n):
        if m.begin(h, tok, m.cache.length(h)) < 0:
            return
        for layer in range(NL):
            m.layer(layer)
            yield
        m.finish()
        tok = K.argmax(m.logits, V)


def drain(g):
    # run a generator to its end, as the kernel's run loop does
    for _ in g:
        pass


t = task(m, h, 10)  # the task's generator is made before the lock, as at boot
no_alloc("a task driving begin/layer/finish for 10 tokens", lambda: drain(t))
eq(c.length(h), 15, "the task decoded 10 more tokens")

# the sliced step (a Slicer whose 1 us slice is always spent: SLICE after every unit)
# allocates nothing but each token's forward generator (made before the lock here), and
# computes the logits of the whole step
from firmware_py.clock import RealClock  # noqa: E402
from firmware_py.slicer import SLICE, Slicer  # noqa: E402
from firmware_py.sched import Kernel  # noqa: E402

c5, h5, m5 = setup()
c6, h6, m6 = setup()
k5 = Kernel(RealClock(), verbose=False)
k5.t0 = k5.clock.now()
sl5 = Slicer(k5, 1)
TOKS = (1, 7, 3, 22, 9, 31)
gens5 = [m5.forward(h5, t, i, sl5) for i, t in enumerate(TOKS)]
got5 = array("i", [0] * len(TOKS))
nsl5 = array("i", [0])


def sliced():
    for i in range(len(TOKS)):
        for y in gens5[i]:
            if y == SLICE:
                nsl5[0] += 1
        got5[i] = K.argmax(m5.logits, V)


no_alloc("the sliced integer step (SLICE after every unit) for %d tokens" % len(TOKS), sliced)
want6 = []
for i, t in enumerate(TOKS):
    for _ in m6.forward(h6, t, i):
        pass
    want6.append(K.argmax(m6.logits, V))
eq(list(got5), want6, "the sliced step picks the whole step's tokens")
check(nsl5[0] > len(TOKS) * NL * 7, "it yielded inside the layers: %d slices" % nsl5[0])
eq(list(m5.logits), list(m6.logits), "and gives the same last logits")

# rope "cache": the sliced step ranks the slots in units (of slicer.RANK_CMP comparisons)
# before the layers, a look at the slice after each, under a window that evicts; nothing
# allocated, the same tokens and logits as the whole step
from firmware_py import slicer as _slicer  # noqa: E402

cr, hr, mr = setup("window", 4, rope="cache", tpb=2)
cw, hw, mw = setup("window", 4, rope="cache", tpb=2)
TOKR = TOKS + TOKS
nrank = array("i", [0])


class RankCounting(Slicer):
    def step(self, kind, a, b):
        if kind == _slicer.U_RANK:
            nrank[0] += 1
        return Slicer.step(self, kind, a, b)


slr = RankCounting(k5, 1)
gensr = [mr.forward(hr, t, i, slr) for i, t in enumerate(TOKR)]
gotr = array("i", [0] * len(TOKR))


def drive(gens, got, m):
    # run each token's step generator to its end, the greedy token of its logits into got
    for i in range(len(got)):
        for _ in gens[i]:
            pass
        got[i] = K.argmax(m.logits, V)


def ranked():
    drive(gensr, gotr, mr)


wantr = []
for i, t in enumerate(TOKR):
    for _ in mw.forward(hw, t, i):
        pass
    wantr.append(K.argmax(mw.logits, V))
no_alloc("the sliced integer step with rope cache for %d tokens" % len(TOKR), ranked)
eq(list(gotr), wantr, "rope cache: the sliced step picks the whole step's tokens")
eq(list(mr.logits), list(mw.logits), "rope cache: and gives the same last logits")
eq(nrank[0], len(TOKR), "rope cache: one ranks unit a token at these few slots")

# past att_slots slots the sliced step attends one pass of one head over ranges of blocks
# (slicer.ATTH_SLOTS; lowered here to 2 slots, blocks of 2 tokens, so that 6 tokens take 3
# ranges a pass): the same tokens and logits as the whole step, nothing allocated
c7, h7, m7 = setup(tpb=2)
m7.att_slots = 2
gens7 = [m7.forward(h7, t, i, sl5) for i, t in enumerate(TOKS)]
got7 = array("i", [0] * len(TOKS))


def ranged():
    drive(gens7, got7, m7)


no_alloc("the sliced integer step attending in ranges of blocks for %d tokens" % len(TOKS), ranged)
eq(list(got7), want6, "attending in ranges picks the whole step's tokens")
eq(list(m7.logits), list(m6.logits), "and gives the same last logits")

# a step abandoned inside the ranged attention (a request stopped: the task's generator
# closed) leaves nothing behind: a step of another sequence on the same QForward, one
# attend call per head, gives the logits a fresh QForward gives
def two_seqs():
    lay = kv.Layout(NL, NKV, D // NH, "int8", tokens_per_block=2)
    nb = S // 2 + 1
    p = pool.Pool(lay.block_bytes, 2 * nb)
    c = kv.KVCache(p, lay, max_seqs=2)
    return c, c.open(p.add_region(nb), "full", S), c.open(p.add_region(nb), "full", S), qmodel.QForward(w, c)


c8, h8, h9, m8 = two_seqs()
m8.att_slots = 2
for i, t in enumerate(TOKS[:4]):
    for _ in m8.forward(h8, t, i, sl5):
        pass
g8 = m8.forward(h8, TOKS[4], 4, sl5)
for _ in g8:
    if m8.prm[K.P_PASS] == 2:
        break
g8.close()
check(m8.prm[K.P_PASS] == 2, "the step was abandoned inside the exp pass")
sl_long = Slicer(k5, 1000000)  # a 1 s slice: one attend call per head
for _ in m8.forward(h9, 1, 0, sl_long):
    pass
c10, h10, _h11, m10 = two_seqs()
for _ in m10.forward(h10, 1, 0, sl_long):
    pass
eq(list(m8.logits), list(m10.logits), "a step after one abandoned in ranged attention: a fresh step's logits")

# misuse: statuses, nothing decoded
eq(m.step(h, 3, 0), E_RANGE, "a position that is not the next one: E_RANGE")
eq(m.step(h, V, c.length(h)), E_RANGE, "a token outside the vocabulary: E_RANGE")
eq(m.step(h + 2, 3, 0), E_STALE, "a stale handle: E_STALE")
c, h, m = setup("full", 4)
eq(decode(m, h, 6), E_FULL, "a full budget stops the decode with E_FULL")
eq(m.status, E_FULL, "... and leaves it in status")

# configuration mistakes: one line
lay32 = kv.Layout(NL, NKV, D // NH, "fp32")
cf = kv.KVCache(pool.Pool(lay32.block_bytes, 2), lay32)
e = raises(qmodel.QModelError, qmodel.QForward, w, cf)
check("int8 KV" in str(e) and "\n" not in str(e), "an fp32 cache is refused in one line")
lay = kv.Layout(NL + 1, NKV, D // NH, "int8")
e = raises(qmodel.QModelError, qmodel.QForward, w, kv.KVCache(pool.Pool(lay.block_bytes, 2), lay))
check("does not match" in str(e), "a cache of another shape is refused")
done()
