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
done()
