# Static heap pool: O(1) alloc/free without touching the heap, regions hold their
# quotas, counters follow HeapStats_t, clear-on-free zeroes; hot-path misuse returns
# E_RANGE / E_STATE without allocating, configuration mistakes raise PoolError.
from fwtest import check, eq, raises, no_alloc, done
from firmware_py import pool, status
from firmware_py.compat import collect, mem_alloc

# bookkeeping beyond the arena: what host/budget.py charges per block and per pool
collect()
a0 = mem_alloc()
big = pool.Pool(64, 1000)
collect()
if a0 is not None:
    over = mem_alloc() - a0 - 64 * 1000
    print("pool of 1000 x 64 B: %d B of bookkeeping beyond the arena" % over)
    check(over <= 1000 * (pool.META_BYTES_PER_BLOCK + pool.VIEW_BYTES_PER_BLOCK) + pool.POOL_FIXED_BYTES,
          "bookkeeping within what the budget charges: %d B" % over)
big = None
p = pool.Pool(64, 10, clear_on_free=True)
eq(len(p.views), 10, "one view per block, made at boot")
eq(len(p.views[3]), 64, "a view spans exactly one block")
ra = p.add_region(4)
rb = p.add_region(10)

got = [p.alloc(ra) for _ in range(5)]
eq(got[4], status.E_NO_BLOCK, "region a cannot take a 5th block past its quota of 4")
eq(p.failed, 1, "the refused allocation is counted")
eq(p.region_used[ra], 4, "region a holds its quota")
eq(len(set(got[:4])), 4, "distinct blocks")
more = [p.alloc(rb) for _ in range(7)]
eq(more[6], status.E_NO_BLOCK, "pool empty after 10 blocks")
eq(p.blocks_free, 0, "no block free")
eq(p.min_free, 0, "minimum-ever free reached 0")
eq(p.high_water, 10, "high water 10")
eq(p.free(rb, got[0]), status.E_RANGE, "a region cannot free another region's block")
eq(p.ref[got[0]], 1, "the refused free changed nothing")
eq(p.alloc(7), status.E_RANGE, "alloc from a region never added")

# clear-on-free: a freed block comes back zeroed
b = got[0]
p.views[b][0] = 7
eq(p.free(ra, b), status.OK, "free of an owned block")
eq(p.views[b][0], 0, "clear_on_free zeroed the block")
eq(p.free(ra, b), status.E_STATE, "double free refused")
eq(p.unref(b), status.E_STATE, "unref of a free block refused")
eq(p.unref(99), status.E_RANGE, "unref of a block outside the pool")
eq(p.share(b), status.E_STATE, "share of a free block refused")
eq(p.share(-1), status.E_RANGE, "share of block -1 refused")
eq(p.frees, 1, "one free counted")
eq(p.allocs, 10, "ten allocations counted")

# sharing: the last reference frees
c = p.alloc(ra)
eq(c, b, "LIFO free list hands back the block just freed")
p.share(c)
p.unref(c)
eq(p.blocks_used, 10, "still held by one reference")
p.unref(c)
eq(p.blocks_used, 9, "freed by the last reference")

# heap-locked: alloc + free, and the word copy
q = pool.Pool(256, 32)
rq = q.add_region(32)


def alloc_free_all():
    for _ in range(32):
        q.alloc(rq)
    q.alloc(rq)  # refused: pool empty, still no allocation
    for i in range(32):
        q.unref(i)


no_alloc("pool alloc/free of 32 blocks (+1 refused)", alloc_free_all)
eq(q.blocks_free, 32, "all back")
eq(q.failed, 1, "refusal counted under heap lock")


def copy_words():
    pool.copy32(q.arena, 0, q.arena, 64, 64)


no_alloc("copy32 of one 256 B block", copy_words)
cz = pool.Pool(256, 4, clear_on_free=True)
rz = cz.add_region(4)
zb = cz.alloc(rz)
cz.views[zb][100] = 9


def free_cleared():
    cz.unref(zb)


no_alloc("free with clear_on_free (viper zeroing)", free_cleared)
eq(cz.views[zb][100], 0, "zeroed under the heap lock")
# a caller's arena is refused at construction unless viper can use it as uint32 words
buf = bytearray(64 + 8)
for what, ar in (("read-only bytes", bytes(64)), ("a length not a multiple of 4", bytearray(65)),
                 ("a window starting off a 4-byte boundary", memoryview(buf)[1:65])):
    e = raises(pool.PoolError, pool.Pool, 16, 4, False, True, ar)
    check("arena" in str(e), "refused: %s (%s)" % (what, e))
eq(pool.Pool(16, 4, arena=memoryview(buf)[4:68]).n_blocks, 4, "an aligned window of a bytearray is accepted")

# the event counters carry at CARRY_N (< 2**30): past it they would allocate on the 32-bit build
pc = pool.Pool(16, 2, views=False)
rc = pc.add_region(1)
pc.allocs = pc.frees = pc.failed = status.CARRY_N - 1
cres = [0, 0, 0]


def churn_at_carry():
    cres[0] = pc.alloc(rc)
    cres[1] = pc.alloc(rc)  # quota 1: refused
    cres[2] = pc.free(rc, cres[0])


no_alloc("alloc / refused alloc / free crossing CARRY_N", churn_at_carry)
eq((cres[1], pc.allocs, pc.allocs_g, pc.failed, pc.failed_g, pc.frees, pc.frees_g), (status.E_NO_BLOCK, 0, 1, 0, 1, 0, 1),
   "allocs, failed and frees carried")
eq((pc.stats()["allocs"], pc.available(rc), pc.available(5)), (status.CARRY_N, 1, 0), "stats() joins the carry; available()")
raises(pool.PoolError, pool.Pool, 6, 4)
raises(pool.PoolError, p.set_quota, 9, 1)
raises(pool.PoolError, pool.Pool, 64, 4, False, True, bytearray(100))  # arena too small

# misuse under the heap lock: statuses, no exception objects, and a caller-given arena
# window (guard bytes around it) is never written outside
big = bytearray(64 * 4 + 128)
for i in range(len(big)):
    big[i] = 0xA5
g = pool.Pool(64, 4, True, False, memoryview(big)[64:64 + 256])
rg = g.add_region(2)
box = [0]


def misuse():
    k = g.alloc(rg)
    g.alloc(rg)
    box[0] = g.alloc(rg) + g.alloc(5) + g.unref(-3) + g.unref(4) + g.share(3) + g.free(rg, 3)
    g.unref(k)
    box[0] += g.unref(k) + g.free(rg, k)


no_alloc("pool misuse returns statuses", misuse)
eq(box[0], status.E_NO_BLOCK + 3 * status.E_RANGE + status.E_STATE * 4, "each misuse gave its status")
check(all(big[i] == 0xA5 for i in list(range(64)) + list(range(320, 384))), "guard bytes around the arena intact")
raises(pool.PoolError, pool.Pool, 64, 0)

# tier ranges: consecutive ranges fastest first, one free list each; alloc(region) takes the
# fastest range with a free block, alloc(region, t) range t only; without tiers= tier 0 is all
eq((p.n_tiers, p.tier_names, p.tier_of(3), p.tier_free(0), p.alloc(rb, 1), p.alloc(rb, -2), p.alloc(rb, True)),
   (1, ("all",), 0, p.blocks_free, status.E_RANGE, status.E_RANGE, status.E_RANGE), "an untiered pool is one range")
tp = pool.Pool(32, 7, tiers=(2, 0, 5), tier_names=("sram", "iram", "psram"))
rt = tp.add_region(7)
eq((tp.n_tiers, tp.tier_names, [tp.tier_of(b) for b in range(7)], tp.tier_of(7)),
   (3, ("sram", "iram", "psram"), [0, 0, 2, 2, 2, 2, 2], status.E_RANGE), "ranges: blocks 0-1 sram, none iram, 2-6 psram")
eq([tp.alloc(rt) for _ in range(3)], [0, 1, 2], "alloc(region) takes the fastest range first, then the next one with a block")
eq((tp.alloc(rt, 0), tp.alloc(rt, 1), tp.tier[0 * pool.TF + pool.T_FAILED], tp.tier[1 * pool.TF + pool.T_FAILED]),
   (status.E_NO_BLOCK, status.E_NO_BLOCK, 1, 1), "an empty range refuses a request for it (counted per range)")
eq(tp.unref(0), status.OK, "free an sram block")
eq((tp.alloc(rt, 2), tp.alloc(rt)), (3, 0), "a given range; then the freed sram block is the fastest free")
st = tp.tier_stats()
eq((st["sram"]["blocks_used"], st["sram"]["high_water"], st["psram"]["blocks_used"], st["psram"]["blocks_free"],
    st["psram"]["min_free"], tp.blocks_used), (2, 2, 2, 3, 3, 4), "per-range counters")
eq((tp.available_in(rt, 2), tp.available_in(rt, 0), tp.available_in(rt, 9)), (3, 0, 0), "available_in by range")
rq2 = tp.add_region(1)
eq((tp.transfer(3, rq2), tp.region_used[rt], tp.region_used[rq2], tp.transfer(2, rq2), tp.transfer(5, rq2)),
   (status.OK, 3, 1, status.E_NO_BLOCK, status.E_STATE), "transfer hands a block's quota to another region")
for what, args in (("counts not adding up", (32, 7, False, True, None, (2, 4))), ("a negative count", (32, 2, False, True, None, (3, -1))),
                   ("names of another length", (32, 2, False, True, None, (1, 1), ("a",))), ("names without tiers", (32, 2, False, True, None, None, ("a",))),
                   ("too many ranges", (32, 5, False, True, None, (1, 1, 1, 1, 1)))):
    e = raises(pool.PoolError, pool.Pool, *args)
    check("tier" in str(e), "refused: %s (%s)" % (what, e))
tq = pool.Pool(16, 8, tiers=(3, 5))
rtq = tq.add_region(8)
tres = [0]


def tier_churn():
    a = tq.alloc(rtq)
    b = tq.alloc(rtq, 1)
    c = tq.alloc(rtq, 0)
    t = tq.tier_of(a) + tq.tier_of(b) * 2 + tq.tier_of(c) * 4
    tq.unref(a)
    tq.unref(b)
    tq.unref(c)
    tres[0] = t + tq.alloc(rtq, 5) + tq.tier_of(-1)


no_alloc("tiered alloc / alloc(tier) / tier_of / unref", tier_churn)
eq((tres[0], tq.blocks_free, tq.tier_free(0), tq.tier_free(1)), (2 + 2 * status.E_RANGE, 8, 3, 5), "tiered churn under the heap lock")

# every hot-path call checks that its int arguments are ints before any use (docs/conventions.md):
# a float, a bool or a big int is E_RANGE, never a TypeError, never read as 0/1, nothing changed
fp = pool.Pool(16, 6, tiers=(2, 4))
rf = fp.add_region(6)
rf2 = fp.add_region(6)
fb = fp.alloc(rf)  # block 0, region rf
fb2 = fp.alloc(rf2)  # block 1, region rf2
BIG = 2 ** 40  # a big int on every build (made before the lock)
bads = (0.0, 1.0, True, False, BIG, -BIG, None)
fres = bytearray(len(bads) * 16)


def put(j, v):
    # E_RANGE; available / available_in answer 0 for an int region out of range (big ints too)
    fres[j] = 1 if v == status.E_RANGE or (v == 0 and 6 <= j % 15 <= 8 and bads[j // 15].__class__ is int) else 0


def float_args():
    j = 0
    for x in bads:  # one call per line: a tuple of results would allocate
        put(j, fp.alloc(x))
        put(j + 1, fp.alloc(rf, x))
        put(j + 2, fp.share(x))
        put(j + 3, fp.unref(x))
        put(j + 4, fp.free(x, fb))
        put(j + 5, fp.free(rf, x))
        put(j + 6, fp.available(x))
        put(j + 7, fp.available_in(x, 0))
        put(j + 8, fp.available_in(rf, x))
        put(j + 9, fp.tier_of(x))
        put(j + 10, fp.tier_free(x))
        put(j + 11, fp.transfer(x, rf2))
        put(j + 12, fp.transfer(fb, x))
        put(j + 13, fp.exchange(x, fb2))
        put(j + 14, fp.exchange(fb, x))
        j += 15


before = (fp.blocks_used, fp.ref[0], fp.ref[1], fp.owner[0], fp.owner[1], fp.region_used[rf], fp.allocs, fp.frees, fp.failed)
no_alloc("float / bool / big-int / None arguments to every pool hot-path call", float_args)
eq(sum(fres), len(bads) * 15, "every one refused with E_RANGE")
eq((fp.blocks_used, fp.ref[0], fp.ref[1], fp.owner[0], fp.owner[1], fp.region_used[rf], fp.allocs, fp.frees, fp.failed), before,
   "nothing changed (free(0.0, b) and unref(True) freed nothing)")
for bad in (1.5, True, None):
    raises(pool.PoolError, fp.add_region, bad)
    raises(pool.PoolError, fp.set_quota, rf, bad)
    raises(pool.PoolError, fp.set_quota, bad, 1)

# exchange: two private blocks swap the regions charged for them; no region's count changes, so
# a quota lowered below what a region holds does not matter
xres = [0, 0, 0]
fp.set_quota(rf, 0)


def swap_owners():
    xres[0] = fp.exchange(fb, fb2)
    xres[1] = fp.transfer(fb, rf)  # transfer asks the quota (rf: 0, holds 1): refused
    fp.share(fb)
    xres[2] = fp.exchange(fb, fb2)  # a shared block: refused
    fp.unref(fb)


no_alloc("exchange of two blocks' owners (and its refusals)", swap_owners)
eq((xres[0], fp.owner[fb], fp.owner[fb2], fp.region_used[rf], fp.region_used[rf2]), (status.OK, rf2, rf, 1, 1), "owners swapped")
eq((xres[1], xres[2]), (status.E_NO_BLOCK, status.E_STATE), "transfer over a lowered quota and exchange of a shared block refused")

# available() is never negative (issue 17): a region holding more blocks than its quota
# (set_quota lowered it, or exchange moved blocks in) has 0 available, never a figure
# that reads as a status code
P = pool.Pool(16, 4)
r = P.add_region(4)
P.alloc(r)
P.alloc(r)
P.alloc(r)
P.set_quota(r, 0)  # quota lowered below what the region holds
eq(P.available(r), 0, "available after set_quota below the held blocks")
eq(P.available_in(r, 0), 0, "available_in likewise")
eq(P.alloc(r), status.E_NO_BLOCK, "and an allocation is refused")
P = pool.Pool(16, 4)
r1 = P.add_region(1)
r2 = P.add_region(3)
b1 = P.alloc(r1)
b2 = P.alloc(r2)
b3 = P.alloc(r2)
P.set_quota(r2, 1)  # r2 holds 2
eq(P.available(r2), 0, "over quota: 0")
eq(P.exchange(b1, b2), status.OK, "exchange")
eq((P.available(r1), P.available(r2)), (0, 0), "after exchange neither goes negative")
done()
