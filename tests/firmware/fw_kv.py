# KV cache over the pool: append writes in place, lookup is O(1), every policy evicts
# (or stops with E_FULL) without allocating, watermark fires once at 80 %, forked
# prefixes are shared and copied on write, regions isolate sequences.
from fwtest import check, eq, raises, no_alloc, done, xorshift
import kvref
from firmware_py import kv, pool, quant, status
from firmware_py.compat import collect, mem_alloc

# stories260K's shape: 5 layers, 4 KV heads x 8; tiny blocks so rings wrap quickly
L = kv.Layout(5, 4, 8, "fp32", tokens_per_block=4)
eq(L.kv_bytes_per_token, 1280, "stories260K fp32 KV is 1280 B/token")
eq(L.token_bytes, 1288, "plus an 8 B slot header")
p = pool.Pool(L.block_bytes, 24)
c = kv.KVCache(p, L, max_seqs=4, max_blocks_per_seq=8, h2o=True)
r0 = p.add_region(24)

# token rows: every word of token i's row carries (i + 1) in its first word and
# (layer) in its second, so a read-back proves which token and layer it came from
N = 40
rows = []
for i in range(N):
    b = bytearray(L.row_bytes)
    for layer in range(5):
        pool.set32(b, layer * L.layer_row // 4, i + 1)
        pool.set32(b, layer * L.layer_row // 4 + 1, layer)
    rows.append(b)
out = bytearray(L.layer_row)


def token_at(seq, pos, layer):
    # token number stored at pos (or -1 when not cached), checking the layer tag
    if c.read(seq, pos, layer, out, 0) != status.OK:
        return -1
    assert pool.get32(out, 1) == layer
    return pool.get32(out, 0) - 1


# --- full: appends to the budget, then E_FULL with nothing written
s = c.open(r0, "full", 10)
st = [0]
k = [0]
wm_seen = [0]


def on_wm(seq):
    # the watermark hook: must not allocate either (it runs inside append)
    wm_seen[0] = seq + 1


c.on_watermark = on_wm


def append_next():
    st[0] = c.append(s, rows[k[0]])
    k[0] += 1


for _ in range(7):
    append_next()
eq(st[0], 0, "7 of 10: below the watermark")
no_alloc("full: append token 8 (crosses the 80 % watermark)", append_next)
eq(st[0], kv.ST_WATERMARK, "watermark fires at 8 of 10")
eq(wm_seen[0], s + 1, "the watermark hook ran for this sequence (its handle)")
eq(c.events, 1, "one watermark event counted")
append_next()
eq(st[0], 0, "watermark fires once")
append_next()
no_alloc("full: append past the budget returns E_FULL", append_next)
eq(st[0], status.E_FULL, "budget reached: E_FULL, not an exception")
eq(c.length(s), 10, "nothing written past the budget")
eq(token_at(s, 9, 4), 9, "last token reads back")
got = [0]


def lookup():
    got[0] = c.locate(s, 5)


no_alloc("locate a cached position", lookup)
eq(got[0], 5, "full: slot = position")


def read_row():
    c.read(s, 3, 2, out, 0)


no_alloc("read one layer row", read_row)
eq(pool.get32(out, 0), 4, "row of token 3 read back")
eq(c.blocks_of(s), 3, "10 tokens in blocks of 4 take 3 blocks (allocated on demand)")
c.close(s)
eq(p.blocks_used, 0, "close returns every block")


# --- window / sinks / h2o: append 40 tokens under the heap lock, check what is kept
def run(policy, budget, sinks=4, recent=0):
    seq = c.open(r0, policy, budget, sinks, recent)
    check(seq >= 0, "open %s" % policy)
    k[0] = 0
    box = [seq]

    def go():
        sq = box[0]
        for i in range(N):
            c.append(sq, rows[i])
            if policy == "h2o":
                # tokens divisible by 5 attract attention: they must survive as heavy hitters
                c.add_score(sq, c.locate(sq, i), 1000 if i % 5 == 0 else 1)

    no_alloc("%s: %d appends with eviction" % (policy, N), go)
    kept = [pos for pos in range(N) if token_at(seq, pos, 0) == pos]
    return seq, kept


s, kept = run("window", 10)
eq(kept, list(range(30, 40)), "window keeps the newest 10")
eq(c.locate(s, 29), status.E_EMPTY, "evicted position is not found")
eq(c.evictions(s), 30, "30 evictions")
c.close(s)

s, kept = run("sinks", 10, 4)
eq(kept, [0, 1, 2, 3] + list(range(34, 40)), "sinks keeps the first 4 and the newest 6")
c.close(s)

s, kept = run("h2o", 12, 2, 4)
print("h2o kept:", kept)
check(kept[:2] == [0, 1], "h2o keeps the sinks")
check(kept[-4:] == [36, 37, 38, 39], "h2o keeps the newest 4")
heavy = kept[2:-4]
eq(len(heavy), 6, "h2o fills the rest with heavy hitters")
check(all(x % 5 == 0 for x in heavy), "heavy hitters are the high-score tokens")
c.close(s)

# --- fork: a shared prefix is read by both, written copy-on-write
a = c.open(r0, "full", 16)
for i in range(6):
    c.append(a, rows[i])
used = p.blocks_used
b2 = c.fork(a)
eq(p.blocks_used, used, "fork shares blocks: no new block")
eq(token_at(b2, 5, 3), 5, "fork reads the shared prefix")
c.append(a, rows[20])
c.append(b2, rows[30])
eq(token_at(a, 6, 0), 20, "a's token 6 is its own")
eq(token_at(b2, 6, 0), 30, "b's token 6 is its own: the shared block was copied on write")
eq(token_at(a, 4, 1), 4, "a still reads the prefix")
eq(p.blocks_used, used + 1, "one block copied")
c.close(a)
eq(token_at(b2, 2, 2), 2, "prefix survives the other sequence closing")
c.close(b2)
eq(p.blocks_used, 0, "every block back after both close")

# --- h2o scores are per sequence: scoring a forked (shared) slot copies the block first
h = c.open(r0, "h2o", 8, 1, 2)
for i in range(3):
    c.append(h, rows[i])
hf = c.fork(h)
before = p.blocks_used
eq(c.add_score(hf, 1, 500), status.OK, "score on a shared slot")
eq(c.score(hf, 1), 500, "the fork sees its score")
eq(c.score(h, 1), 0, "the original's score is untouched")
eq(p.blocks_used, before + 1, "the shared block was copied for the score")
c.close(h)
c.close(hf)

# --- regions: a sequence in a small region stops with E_NO_BLOCK at its quota
rs = p.add_region(1)
s = c.open(rs, "full", 32)
for i in range(4):
    eq(c.append(s, rows[i]), 0, "fits in one block")
eq(c.append(s, rows[4]), status.E_NO_BLOCK, "region quota reached: E_NO_BLOCK")
eq(p.region_used[rs], 1, "the region holds exactly its quota")
eq(c.open(rs, "window", 8), status.E_NO_BLOCK, "a ring that cannot reserve its blocks is refused at open")
c.close(s)
raises(kv.KVError, c.open, r0, "lru", 8)
raises(kv.KVError, c.open, r0, "sinks", 8, 8)
raises(kv.KVError, kv.Layout, 5, 4, 8, "bf16")
eq(kv.Layout(6, 6, 48, "int4").group, 24, "int4: group 32 does not divide head_dim 48, so 24 (largest divisor <= 32)")
eq(kv.Layout(1, 1, 8, "int4", group=3).group, 2, "int4: group 3 on head_dim 8 becomes 2")

# --- section 1 findings, one check each (all under the heap lock where they are hot paths)
fa = c.open(r0, "full", 4)
for i in range(4):
    c.append(fa, rows[i])
res = [0, 0, 0]


def write_after_refusal():
    res[0] = c.reserve(fa)  # E_FULL: budget reached
    res[1] = c.write(fa, 0, rows[30], 0)  # must not overwrite token 3


no_alloc("refused reserve then write", write_after_refusal)
eq(res[0], status.E_FULL, "reserve at the budget is refused")
eq(res[1], status.E_STATE, "write after a refused reserve finds no reservation")
eq(token_at(fa, 3, 0), 3, "the previous token is untouched")
c.close(fa)

fb = c.open(r0, "full", 16)
for i in range(2):
    c.append(fb, rows[i])
c.reserve(fb)  # position 2 reserved, then forked
fc = c.fork(fb)
eq(c.write(fb, 0, rows[25], 0), status.OK, "write into the reserved slot after a fork")
eq(token_at(fb, 2, 0), 25, "the writer sees its row")
eq(pool.get32(out, 0) if c.read(fc, 2, 0, out, 0) == status.OK else -9, 0, "the fork's reserved position still reads zeros: copy on write at write time")
eq(c.write(fc, 0, rows[26], 0), status.E_STATE, "a fork has no reservation")
big_h = [0]


def misuse_kv():
    big_h[0] = (c.write(fb, 5, rows[0], 0) + c.write(fb, -1, rows[0], 0) + c.write(fb, 0, rows[0], L.row_bytes)
                + c.write(fb, 0, rows[0], 2) + c.add_score(fb, 16, 1) + c.add_score(fb, -1, 1)
                + c.add_score(fb, 3, 1) + c.score(fb, 9) + c.slot_pos(fb, 99) + c.read(fb, 7, 0, out, 0)
                + c.row_offset(fb, 0, 5))


no_alloc("out-of-range slot, layer, length and empty slots are refused", misuse_kv)
eq(big_h[0], 5 * status.E_RANGE + status.E_RANGE + status.E_EMPTY + status.E_EMPTY + status.E_RANGE + status.E_RANGE + status.E_RANGE,
   "layer 5, layer -1, src too short, odd offset, slot 16 (budget), slot -1, empty slot 3, empty slot 9, slot 99, pos 7, layer 5")
used = p.blocks_used
c.close(fb)
stale = [0]


def closed_calls():
    stale[0] = (c.write(fb, 0, rows[0], 0) + c.add_score(fb, 0, 1) + c.score(fb, 0) + c.slot_pos(fb, 0)
                + c.read(fb, 0, 0, out, 0) + c.locate(fb, 0) + c.row_offset(fb, 0, 0) + c.reserve(fb)
                + c.append(fb, rows[0]) + c.fork(fb) + c.close(fb) + c.length(fb))


no_alloc("calls on a closed sequence", closed_calls)
eq(stale[0], 12 * status.E_STALE, "every call on a closed handle is E_STALE")
check(p.blocks_used < used, "close returned the blocks (no leak from add_score)")
fd = c.open(r0, "full", 8)
eq(c.slot_of(fd), c.slot_of(fb), "the new sequence reuses the closed slot")
check(fd != fb, "with a new generation: a different handle")
eq(c.length(fb), status.E_STALE, "the old handle does not alias the new sequence")
eq(c.slot_pos(fd, 0), status.E_EMPTY, "an empty slot reads E_EMPTY, not a previous owner's position")
eq(c.score(fd, 0), status.E_EMPTY, "nor its score")
c.append(fd, rows[0])
eq(c.score(fd, 0), 0, "a new token starts at score 0")
fe = [0]


def fork_locked():
    fe[0] = c.fork(fd)


no_alloc("fork", fork_locked)
check(fe[0] >= 0, "fork under the heap lock")
c.close(fe[0])
c.close(fd)
c.close(fc)

# pos_map holds slots above 32,767 (array('i'))
lb = kv.Layout(1, 1, 1, "int8", tokens_per_block=64)
pb = pool.Pool(lb.block_bytes, 520, views=False)
cb = kv.KVCache(pb, lb, max_seqs=1, h2o=True)
hb = cb.open(pb.add_region(520), "h2o", 33000, 4, 100)
one = bytearray(lb.row_bytes)
for _ in range(33100):
    cb.append(hb, one)
eq(cb.slot_pos(hb, 32999), 32999, "slot 32,999 holds position 32,999")
check(cb.locate(hb, 33099) >= 0 and cb.locate(hb, 32999) == 32999, "positions above 32,767 are found")

# --- int8 / int4tok / int4 rows: packed by the model side (int4: its keys quantized by
# the cache, the newest block's kept exact in the residual)
for dt in ("int8", "int4tok", "int4"):
    lq = kv.Layout(5, 4, 8, dt, tokens_per_block=4)
    pq = pool.Pool(lq.block_bytes, 4)
    cq = kv.KVCache(pq, lq, max_seqs=1)
    sq = cq.open(pq.add_region(4), "window", 6)
    ks = [[((i * 7 + ly * 3) % 17 - 8) / 8.0 for i in range(32)] for ly in range(5)]
    vs = [[((i * 5 + ly) % 13 - 6) / 6.0 for i in range(32)] for ly in range(5)]
    tok = bytearray(lq.row_bytes)
    collect()
    a0 = mem_alloc()
    quant.pack_token(lq, ks, vs, tok)
    if a0 is not None:
        print("%s quantize one token (model side): %d B allocated" % (dt, mem_alloc() - a0))
    box = [cq, sq, tok]

    def app(box=box):
        for _ in range(9):
            box[0].append(box[1], box[2])

    no_alloc("%s: 9 appends into a ring of 6" % dt, app)
    row = bytearray(lq.layer_row)
    eq(cq.read(sq, 8, 3, row, 0), status.OK, "%s newest cached" % dt)
    kk = quant.unpack_layer(lq, row, 0, 0)
    vv = quant.unpack_layer(lq, row, 0, 1)
    err = max(max(abs(kk[i] - ks[3][i]) for i in range(32)), max(abs(vv[i] - vs[3][i]) for i in range(32)))
    bound = max(quant.error_bound(lq, ks[3]), quant.error_bound(lq, vs[3]))
    check(err <= bound, "%s error %f within bound %f" % (dt, err, bound))
# --- int4 (KIVI): reserve/write/append/read/fork/close heap-locked, every read
# bit-identical to the reference model (kvref.py, from the spec, big ints), a block
# holding residual keys never shared, extreme fp32 keys (signs, 0, -0, subnormal, inf,
# NaN, the largest) through the 32-bit build's integer path

lk = kv.Layout(5, 4, 8, "int4", tokens_per_block=4)
eq((lk.layer_row, lk.store_row, lk.block_bytes, lk.kv_bytes_per_token, lk.residual_bytes), (160, 48, 1632, 400, 2564),
   "int4 (KIVI) layout of stories260K's shape with 4-token blocks")
pk = pool.Pool(lk.block_bytes, 16)
rk = pk.add_region(16)
collect()
a0 = mem_alloc()
ck = kv.KVCache(pk, lk, max_seqs=3, h2o=True)
if a0 is not None:  # the sizing rule's fixed bytes (the residual of 3 sequences included) hold the cache
    collect()  # what stays live: the boot's temporaries are garbage
    a1 = mem_alloc() - a0
    pm_bytes = 4 * ck.map_size * 3  # h2o's position maps: kv.bytes_per_block charges them per block
    print("int4 KVCache(max_seqs=3): %d B allocated (+ %d B h2o map), fixed_bytes %d" % (a1 - pm_bytes, pm_bytes, kv.fixed_bytes(lk, 3)))
    check(a1 - pm_bytes <= kv.fixed_bytes(lk, 3), "int4: the cache fits kvlayout.fixed_bytes")
mk = kvref.RefKV(lk, 3, 16, 16, (16,))
krng = xorshift(7)
EXTREME = (0.0, -0.0, 1e-40, -1e-40, 3.4e38, -3.4e38, float("inf"), float("-inf"), float("nan"), 1.5, -2.25, 1e-30)
krows = []
for n in range(24):
    b = bytearray(lk.row_bytes)
    for ly in range(5):
        k = [((krng(2001) - 1000) / 250.0) + (3.0 if c % 5 == 1 else 0.0) for c in range(32)]
        if n == 5:
            k = [EXTREME[c % len(EXTREME)] for c in range(32)]
        v = [(krng(201) - 100) / 50.0 for c in range(32)]
        quant.pack_layer(lk, k, v, b, ly * lk.layer_row)
    krows.append(b)
KB = [0, 0, 0, 0, 0]  # handles / results for the locked closures
kout = bytearray(lk.layer_row)


def kivi_same(what):
    # every cached position of every open sequence reads as the reference's, and no
    # block holding residual keys is shared
    for hh, sq in mk.seqs.items():
        for pos in range(sq.n):
            slot = sq.slot_of(pos)
            eq(ck.locate(hh, pos), kvref.E_EMPTY if slot is None else slot, "%s: locate %d" % (what, pos))
            if slot is None:
                continue
            for ly in range(5):
                eq(ck.read(hh, pos, ly, kout, 0), status.OK, what)
                check(bytes(kout) == mk.row_of(sq, slot, ly), "%s: seq %d pos %d layer %d bit-identical" % (what, hh, pos, ly))
        kb = ck.current_block(hh)
        check(kb < 0 or pk.ref[ck.block_at(hh, kb)] == 1, "%s: the block with residual keys is private" % what)


def k_append9():
    for n in range(9):
        KB[1] = ck.append(KB[0], krows[n])


KB[0] = ck.open(rk, "full", 0)
eq(mk.open(0, "full", 0, 4, 0), KB[0], "int4 open")
no_alloc("int4: 9 appends (two folds)", k_append9)
for n in range(9):
    mk.append(KB[0], krows[n])
eq(ck.current_block(KB[0]), 2, "int4: the residual follows block 2")
check(ck.residual_word(KB[0], 8, 0) >= 0 and ck.residual_word(KB[0], 3, 0) == status.E_EMPTY, "int4: slot 8 residual, 3 folded")
kivi_same("int4 full after folds")


def k_reserve_write():
    KB[1] = ck.reserve(KB[0])
    for ly in range(5):
        KB[2] = ck.write(KB[0], ly, krows[9], ly * lk.layer_row)


no_alloc("int4: reserve then write every layer", k_reserve_write)
mk.reserve(KB[0])
for ly in range(5):
    mk.write(KB[0], ly, krows[9], ly * lk.layer_row)
eq((KB[1], KB[2]), (9, status.OK), "int4 reserve + write")
kivi_same("int4 after write")


def k_fork():
    KB[3] = ck.fork(KB[0])  # folds the source's residual first
    KB[2] = ck.write(KB[0], 1, krows[10], lk.layer_row)  # the source's reservation: its block copied, residual again
    KB[4] = ck.append(KB[3], krows[11])


no_alloc("int4: fork, write after fork, append to the fork", k_fork)
eq(mk.fork(KB[0]), KB[3], "int4 fork")
eq((KB[2], KB[4]), (mk.write(KB[0], 1, krows[10], lk.layer_row), mk.append(KB[3], krows[11])), "int4 write/append after fork")
kivi_same("int4 after fork")

# rings refill blocks partly (old quantized slots requantized with the new); h2o folds per token
for pol, cap in (("window", 6), ("sinks", 7), ("h2o", 10)):
    KB[0] = ck.open(rk, pol, cap, 2 if pol == "h2o" else 4, 3 if pol == "h2o" else 0)
    eq(mk.open(0, pol, cap, 2 if pol == "h2o" else 4, 3 if pol == "h2o" else 0), KB[0], "int4 open " + pol)

    def k_ring():
        for n in range(20):
            KB[1] = ck.append(KB[0], krows[n])
            KB[2] = ck.add_score(KB[0], ck.locate(KB[0], n // 2), n % 3)

    no_alloc("int4: 20 appends into %s %d" % (pol, cap), k_ring)
    for n in range(20):
        mk.append(KB[0], krows[n])
        mk.add_score(KB[0], mk.locate(KB[0], n // 2), n % 3)
    kivi_same("int4 " + pol)
    h_close = KB[0]

    def k_close():
        KB[1] = ck.close(KB[0])

    no_alloc("int4: close %s" % pol, k_close)
    mk.close(h_close)
for hh in list(mk.seqs):
    eq(ck.close(hh), mk.close(hh), "int4 close")
eq(pk.blocks_used, 0, "int4: every block back")

# --- misuse found by review: every int argument compared before arithmetic, non-ints
# refused, never an exception or an allocation, same answer on every interpreter
lm = kv.Layout(2, 1, 4, "fp32", tokens_per_block=4)
gm = bytearray(b"\xa5" * (64 + lm.block_bytes * 8 + 64))
pm = pool.Pool(lm.block_bytes, 8, arena=memoryview(gm)[64:64 + lm.block_bytes * 8])
rm = pm.add_region(8)
cm = kv.KVCache(pm, lm, max_seqs=4, h2o=True)
hm = cm.open(rm)
hb = cm.open(rm)
eq(cm.reserve(hm), 0, "reserve")
cm.append(hb, bytearray(lm.row_bytes))
lrow = bytearray(lm.layer_row)
odd = bytearray(lm.layer_row + 1)
oddrow = bytearray(lm.row_bytes + 1)
huge = 1 << 70
fl = 0.0
half = 0.5
MR = [0] * 16


def misuse_calls():
    MR[0] = cm.write(hm, 0, lrow, huge)
    MR[1] = cm.read(hm, 0, 0, lrow, huge)
    MR[2] = cm.read(hm, 0, 0, lrow, (1 << 30) + 4)
    MR[3] = cm.write(hm, 0, odd, 0)  # a length that is not a multiple of 4 is fine
    MR[4] = cm.read(hm, 0, 0, odd, 0)
    MR[5] = cm.length(fl)
    MR[6] = cm.slot_pos(hm, fl)
    MR[7] = cm.locate(hm, half)
    MR[8] = cm.read(hm, 0, 0, None, 0)
    MR[9] = cm.write(hm, fl, lrow, 0)
    MR[10] = cm.write(hm, 0, lrow, fl)
    MR[11] = cm.append(fl, lrow)
    MR[12] = cm.read(hm, 0, 0, pm.arena, cm.row_offset(hb, 0, 0))  # the arena as dst: another sequence's row
    MR[13] = cm.write(True, 0, lrow, 0)
    MR[14] = cm.add_score(hm, 0, half)
    MR[15] = cm.block_at(hm, fl)


no_alloc("huge offsets, odd lengths, floats, a None dst, the arena as dst", misuse_calls)
eq(MR, [status.E_RANGE, status.E_RANGE, status.E_RANGE, status.OK, status.OK, status.E_STALE, status.E_RANGE,
        status.E_RANGE, status.E_RANGE, status.E_RANGE, status.E_RANGE, status.E_STALE, status.E_RANGE, status.E_STALE,
        status.E_RANGE, status.E_RANGE], "each refused with its status (odd lengths accepted: whole words used)")
check(gm[:64] == b"\xa5" * 64 and gm[-64:] == b"\xa5" * 64, "guards intact")
eq(cm.append(hm, oddrow), 0, "an odd-length token row appends (its whole words)")
# an immutable destination (bytes, str) is refused without a write: on MicroPython viper
# would copy into it (a str literal in the code would change)
lit = "abcdefgh" * (lm.layer_row // 8 + 1)
imm = bytes(lm.layer_row)


def immutable_dsts():
    MR[0] = cm.read(hb, 0, 0, imm, 0)
    MR[1] = cm.read(hb, 0, 0, lit, 0)


no_alloc("read into bytes or str", immutable_dsts)
eq(MR[:2], [status.E_RANGE, status.E_RANGE], "read into bytes or str: E_RANGE")
check(imm == bytes(lm.layer_row) and lit == "abcdefgh" * (lm.layer_row // 8 + 1), "the immutable destinations are unchanged")
# a src that is not a buffer is the caller's contract: TypeError on every interpreter
raises(TypeError, cm.append, hm, None)
raises(TypeError, cm.append, hm, [0] * lm.row_bytes)

# reserve on a stale handle leaves E_STALE in cache.status, as every refusal
cm.reserve(hm)
eq((cm.reserve(hm + 4 * 4), cm.status), (status.E_STALE, status.E_STALE), "reserve(stale): E_STALE in status")

# open() checks every parameter before taking a block: KVError and nothing taken
free0 = pm.blocks_free
for kw in ({"watermark_pct": 50.5}, {"sinks": 2.5}, {"budget": 8.0}, {"recent": 1.5}):
    pol = "sinks" if "sinks" in kw else "h2o" if "recent" in kw else "window"
    raises(kv.KVError, lambda pol=pol, kw=kw: cm.open(rm, pol, **dict({"budget": 8}, **kw)))
eq(pm.blocks_free, free0, "refused opens took no block")
st0 = pm.stats()
pn = pool.Pool(lm.block_bytes, 4)
rn = pn.add_region(4)
cn = kv.KVCache(pn, lm, max_seqs=2)
hn = cn.open(rn, "full", 4)
cn.append(hn, bytearray(lm.row_bytes))
s0 = pn.stats()
eq(cn.open(rn, "window", 16), status.E_NO_BLOCK, "a ring needing 4 blocks with 3 free")
s1 = pn.stats()
eq(dict((k, (s0[k], s1[k])) for k in s0 if s0[k] != s1[k]), {"failed": (0, 1)}, "only failed moved")

# a handle of another cache on the same pool is E_STALE (each cache tags its handles)
c2 = kv.KVCache(pn, lm, max_seqs=2)
x2 = c2.open(rn, "full", 4)
eq((c2.length(hn), c2.append(hn, bytearray(lm.row_bytes)), c2.length(x2)), (status.E_STALE, status.E_STALE, 0),
   "cache 1's handle refused by cache 2")
check(hn != x2, "the two caches' first handles differ")
eq(c2.gen_limit, (2 ** 30 - 1) // (2 * 4), "generations per slot before a handle repeats")

# fork: a block at 32,767 references refuses the fork with E_FULL, shares rolled back
hf = cn.fork(hn)
eq(pn.ref[cn.block_at(hn, 0)], 2, "fork shares")
cn.close(hf)
pn.ref[cn.block_at(hn, 0)] = 0x7FFF
eq(cn.fork(hn), status.E_FULL, "fork refused at the reference limit")
eq(pn.ref[cn.block_at(hn, 0)], 0x7FFF, "nothing shared")
pn.ref[cn.block_at(hn, 0)] = 1

# positions stop at 2**30 - 2 with E_FULL (n + 1 stays a small int); events saturate
hw = cm.open(rm, "window", 4)
for _ in range(5):
    cm.append(hw, lrow + lrow)
hi = cm.slot_of(hw)  # the slot (handle = (gen * max_seqs + slot) * 4 + tag)
cm.meta[10 + hi * 13 + 1] = 0x3FFFFFFE - 1  # _CFG + slot * _NF + _F_N: one position left
cm.events = 0x3FFFFFFF
PR = [0, 0, 0]
row2 = lrow + lrow


def at_position_limit():
    PR[0] = cm.append(hw, row2)
    PR[1] = cm.append(hw, row2)
    PR[2] = cm.length(hw)


no_alloc("append at the position limit", at_position_limit)
eq(PR, [kv.ST_EVICTED, status.E_FULL, 0x3FFFFFFE], "the last position appends, the next is E_FULL")
h8 = cm.open(rm, "full", 1)
cm.append(h8, row2)
eq(cm.events, 0x3FFFFFFF, "events saturate")
# --- retarget: a block-table entry moves to a copy in the pool, or leaves it (-1) ---
pr = pool.Pool(L.block_bytes, 6)
rr = pr.add_region(6)
cr = kv.KVCache(pr, L, max_seqs=2)
hr = cr.open(rr, "full", 12)
for i in range(10):
    cr.append(hr, rows[i])
b0 = cr.block_at(hr, 0)
nb = pr.alloc(rr)
pool.copy32(pr.arena, nb * cr.block_words, pr.arena, b0 * cr.block_words, cr.block_words)
RT = [0] * 8


def retargets():
    RT[0] = cr.retarget(hr, 0, b0 + 1, nb)  # the entry is not b0 + 1
    RT[1] = cr.retarget(hr, 99, b0, nb)  # no such entry
    RT[2] = cr.retarget(hr, 0, b0, 6)  # not a block of the pool
    RT[3] = cr.retarget(hr + 1, 0, b0, nb)  # stale handle
    RT[4] = cr.retarget(hr, 2, cr.block_at(hr, 2), -1)  # the block holding the reservation... (slot 9 is block 2)
    RT[5] = cr.retarget(hr, 0, b0, nb)
    RT[6] = cr.read(hr, 1, 2, out, 0)
    RT[7] = cr.retarget(hr, 1, cr.block_at(hr, 1), -1)


no_alloc("retarget and reads through a retargeted entry", retargets)
eq(RT[:5], [status.E_STATE, status.E_RANGE, status.E_RANGE, status.E_STALE, status.E_STATE], "retarget refusals")
eq((RT[5], RT[6]), (status.OK, status.OK), "moved to the copy; reads from it")
eq((pool.get32(out, 0), pool.get32(out, 1)), (2, 2), "position 1's layer 2 row, read from the copy")
eq(RT[7], status.OK, "a block away from the reservation may leave the pool")
pr.unref(b0)
eq((cr.read(hr, 5, 0, out, 0), cr.block_at(hr, 1), cr.row_offset(hr, 5, 0)), (status.E_EMPTY,) * 3,
   "a position whose block left the pool reads E_EMPTY on every path")
eq(cr.read(hr, 9, 0, out, 0), status.OK, "the others still read")
eq(cr.append(hr, rows[10]), status.OK, "and appending goes on")
# retarget refusals the review found: new already in a table; -1 for an h2o sequence; fork of
# a sequence whose block left the pool; on_close runs before the sequence is dropped
hq = cr.open(rr, "full", 8)
cr.append(hq, rows[0])
bq = cr.block_at(hq, 0)
nb2 = pr.alloc(rr)
eq(cr.retarget(hr, 2, cr.block_at(hr, 2), bq), status.E_STATE, "new is another sequence's block: refused")
pr.unref(nb2)
closed = []
cr.on_close = closed.append
eq(cr.close(hq), status.OK, "close")
eq(closed, [hq], "on_close got the handle")
cr.on_close = None
eq(cr.fork(hr), status.E_STATE, "fork of a sequence with a block out of the pool is refused")
ph = pool.Pool(L.block_bytes, 8)
rh = ph.add_region(8)
ch = kv.KVCache(ph, L, max_seqs=2, h2o=True)
hh = ch.open(rh, "h2o", 12, sinks=1, recent=4)
for i in range(6):
    ch.append(hh, rows[i])
eq(ch.retarget(hh, 0, ch.block_at(hh, 0), -1), status.E_STATE, "h2o: a block may not leave the pool (its victim scan reads them all)")

# issue 17: handles of two caches on one pool never coincide, whatever their max_seqs (the
# tag is the handle's low part), and a handle that is not an int is E_STALE in every call,
# append and reserve included (the type is checked before any compare: None < 0 raises)
lay = kv.Layout(1, 1, 4, "fp32", tokens_per_block=2)
P = pool.Pool(lay.block_bytes, 8)
r = P.add_region(8)
ca = kv.KVCache(P, lay, max_seqs=5)
cb = kv.KVCache(P, lay, max_seqs=2)
ha = [ca.open(r) for _ in range(3)]
hb = cb.open(r)
eq(cb.append(hb, bytearray(lay.row_bytes)), 0, "b appends")
eq((ca.length(hb), cb.length(ha[2])), (status.E_STALE, status.E_STALE), "each cache's handle is E_STALE in the other")
check(hb not in ha, "no handle of b is one of a's: %r %r" % (ha, hb))
seen = set()
for c, n in ((ca, 5), (cb, 2)):
    hs = [c.open(r) for _ in range(n)]
    for h in hs:
        if h >= 0:
            c.close(h)
    for h in [c.open(r) for _ in range(n)]:
        if h >= 0:
            seen.add((h, c.tag))
eq(len(set(h for h, _ in seen)), len(seen), "after closes and reopens, still no handle of one cache is another's")
eq((cb.slot_of(hb), ca.slot_of(hb), cb.slot_of(None)), (0, status.E_STALE, status.E_STALE), "slot_of: the slot, or E_STALE for another cache's handle or a non-int")
for bad in (None, 1.0, True, "0", -1, 2 ** 40):
    eq(cb.append(bad, bytearray(lay.row_bytes)), status.E_STALE, "append(%r, row)" % (bad,))
    eq(cb.reserve(bad), status.E_STALE, "reserve(%r)" % (bad,))
    eq(cb.write(bad, 0, bytearray(lay.row_bytes), 0), status.E_STALE, "write(%r, ...)" % (bad,))
    eq(cb.length(bad), status.E_STALE, "length(%r)" % (bad,))
done()
