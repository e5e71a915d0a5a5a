# Tiered KV placement (firmware_py/tiers.py, flashkv.py) on stories260K-shaped fp32 KV: the
# per-token path (placement step, DMA submission, completion handling, the flash write-back,
# the staging read-ahead, tier-aware reads) under micropython.heap_lock(), with every
# position read back bit-identical afterwards; the file calls it relies on (seek,
# write(buf, off, n), readinto(buf, n)) measured under the heap lock on their own.
import sys

from fwtest import check, eq, raises, no_alloc, done
from firmware_py import dma, flashkv, kv, pool, tiers
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel
from firmware_py.status import E_ALIGN, E_EMPTY, E_RANGE, E_STALE, E_STATE, INT_MAX, OK

TAG = "%s%d" % (sys.implementation.name, 64 if sys.maxsize > 2 ** 32 else 32)
PATH = "/tmp/kvrtos_fw_tiers_%s.bin" % TAG
lay = kv.Layout(5, 4, 8, "fp32")  # stories260K: 20,608 B blocks of 16 tokens
LR = lay.layer_row
NROWS = 5
rows = []  # NROWS distinct token rows, made before any heap lock
for j in range(NROWS):
    r = bytearray(lay.row_bytes)
    for x in range(len(r)):
        r[x] = (x * 31 + j * 97 + 7) & 0xFF
    rows.append(r)

# --- the file calls, each under the heap lock ---
f = open(PATH, "w+b")
buf = rows[0]
rb = bytearray(256)
f.write(buf)
fres = [0, 0, 0]


def file_seek():
    f.seek(512)


def file_write_part():
    f.seek(1024)
    fres[0] = flashkv._write(f, buf, 128, 256)


def file_readinto():
    f.seek(1024)
    fres[1] = flashkv._readinto(f, rb, 256)


no_alloc("file seek", file_seek)
no_alloc("file write of 256 B from byte 128 of a preallocated buffer (write(buf, off, n))", file_write_part)
no_alloc("file readinto of 256 B (readinto(buf, n))", file_readinto)
eq((fres[0], fres[1], rb[0], rb[255]), (256, 256, buf[128], buf[383]), "what was written reads back")
f.close()

# --- configuration mistakes raise TiersError, one line ---
p1 = pool.Pool(lay.block_bytes, 4)
c1 = kv.KVCache(p1, lay)
e = raises(tiers.TiersError, tiers.Tiers, c1)
check("tier ranges" in str(e) and "\n" not in str(e), "a pool without tier ranges is refused")


def boot(n_sram, n_psram, q=None, fs=None, seqs=2):
    p = pool.Pool(lay.block_bytes, n_sram + n_psram, tiers=(n_sram, n_psram), tier_names=("sram", "psram"))
    r = p.add_region(n_sram + n_psram)
    c = kv.KVCache(p, lay, max_seqs=seqs)
    return p, r, c, tiers.Tiers(c, dma=q, flash=fs)


p, r, c, T = boot(4, 8)
for bad in (("sinks",), ("h2o",)):
    e = raises(tiers.TiersError, T.open, r, bad[0], 32)
    check("not supported" in str(e), "policy %s refused" % bad[0])
raises(tiers.TiersError, T.open, r, "full", 0, 2, 2, True)  # flash without a FlashStore
raises(tiers.TiersError, T.open, r, "full", 0, -1)

# --- SRAM + PSRAM + flash, CPU copies: 120 tokens heap-locked ---
fs = flashkv.FlashStore(PATH, 12, lay.block_bytes)
p, r, c, T = boot(4, 8, fs=fs)
h = T.open(r, "full", 0, 2, 2, True, 16)
N = 120
ids = bytearray(N + 64)
box = [0, 0]


def feed(count):
    n0 = c.length(h)
    bad = 0
    for n in range(n0, n0 + count):
        j = n % NROWS
        ids[n] = j
        if T.append(h, rows[j]) < 0:
            bad += 1
    box[0] += bad


feed(8)  # warm: every path once before the lock
no_alloc("append + placement step + write-back flush + spill to flash, 112 tokens (CPU copies)", lambda: feed(N - 8))
eq(box[0], 0, "every tiered append succeeded")
where = [T.where(h, k) for k in range(8)]
eq(where, [tiers.FLASH] * 4 + [tiers.PSRAM] * 2 + [tiers.SRAM] * 2, "blocks 0-3 in flash, 4-5 PSRAM, 6-7 SRAM (newest)")
check(T.spills == 4 and T.flushes == N // 16 and fs.total_erases == 6 * (N // 16), "spills, flushes, erases: %r" % (T.stats(),))
dst = bytearray(LR)


def check_all(hh, lo, hi):
    bad = 0
    for pos in range(lo, hi):
        j = ids[pos]
        for ly in range(lay.n_layers):
            if T.read(hh, pos, ly, dst, 0) != OK:
                bad += 1000
                continue
            src = rows[j]
            o = ly * LR
            for x in range(0, LR, 4):
                if dst[x] != src[o + x] or dst[x + 3] != src[o + x + 3]:
                    bad += 1
                    break
    box[1] = bad


no_alloc("tier-aware read of every row (flash rows through the row buffer)", lambda: check_all(h, 0, N))
eq(box[1], 0, "every cached position reads back as written, across SRAM, PSRAM and flash")

# --- the staging read-ahead over the blocks ---
offs = [0] * 8
got = bytearray(8)


def stream():
    T.begin_pass(h)
    for k in range(8):
        o = T.block(h, k)
        offs[k] = o
        b = T.buf
        # slot 0 of layer 0: its first byte, compared with what was appended
        got[k] = b[o + lay.rows_off]


no_alloc("begin_pass + block(k) over 8 blocks (4 from flash, read ahead)", stream)
eq([got[k] for k in range(8)], [rows[ids[16 * k]][0] for k in range(8)], "every block's first row seen through block()")
eq((T.stage_hits, T.stage_misses), (4, 0), "every flash block was already staged (read ahead) when asked for")
eq((T.block(h, 9), T.block(h, -1) < 0, T.block(h + 1, 0)), (E_EMPTY, True, E_STALE), "block() refusals")

# kv.read on a position whose block went to flash: E_EMPTY (the entry is -1), dst untouched
for j in range(LR):
    dst[j] = 0x5A
eq(c.read(h, 0, 0, dst, 0), E_EMPTY, "kv.read of a spilled position is E_EMPTY")
eq(c.locate(h, 0), 0, "locate still names its slot (block_at / row_offset say E_EMPTY)")
check(all(dst[j] == 0x5A for j in range(LR)), "... with nothing written to dst")
# the tier-aware read of that flash row into a window at an odd offset: E_ALIGN (the row
# buffer's word copy into it would fault on the chip), nothing written
odd = bytearray(LR + 4)
eq(T.read(h, 0, 0, memoryview(odd)[1:], 0), E_ALIGN, "T.read into a window 1 B past a word boundary is E_ALIGN")
check(all(odd[j] == 0 for j in range(LR + 4)), "... with nothing written to it")
eq(T.read(h, 0, 0, memoryview(odd)[4:], 0), OK, "... and into one on a word boundary it reads")
eq(T.close(h), OK, "close")
eq((fs.used, p.blocks_used), (0, 0), "close released the flash slots and every block")

# --- DMA moves: submission and completion heap-locked, window policy (promote / demote) ---
k = Kernel(VirtualClock(), max_tasks=4)
q = dma.DMAQueue(k, slots=16)
p, r, c, T = boot(4, 8, q=q)
h = T.open(r, "window", 80, 2)
hz = [0]


def feed_dma(count):
    n0 = c.length(h)
    bad = 0
    for n in range(n0, n0 + count):
        j = n % NROWS
        ids[n % 80] = j
        if T.hazard(h) >= 0:
            q.drain()  # no engine task here: the queue's own synchronous path
            hz[0] += 1
        if T.append(h, rows[j]) < 0:
            bad += 1
        if n % 4 == 3:
            q.drain()
    box[0] += bad


box[0] = 0
feed_dma(20)
no_alloc("window: append + step + DMA submit + completion (retarget, free, transfer), 180 tokens", lambda: feed_dma(180))
eq(box[0], 0, "every append succeeded")
check(T.moves > 20 and T.completed == T.moves - T.n_inflight and T.voided == 0, "moves completed: %r" % (T.stats(),))
cur = ((c.length(h) - 1) % 80) // 16
eq((T.where(h, cur), T.where(h, (cur + 1) % 5)), (tiers.SRAM, tiers.SRAM), "the current and the ring's next block are in SRAM")
q.drain()
T.step(h)
eq(sorted(T.where(h, x) for x in range(5)), [0, 0, 1, 1, 1], "the three older ring blocks in PSRAM")


def ring_ids():
    n = c.length(h)
    for pos in range(n - 80, n):
        ids[pos - (n - 80)] = pos % NROWS


ring_ids()
lo = c.length(h) - 80
bad = 0
for pos in range(lo, c.length(h)):
    for ly in range(lay.n_layers):
        T.read(h, pos, ly, dst, 0)
        if dst != rows[pos % NROWS][ly * LR:(ly + 1) * LR]:
            bad += 1
eq(bad, 0, "the window reads back as written after DMA moves")

# a copy in flight of the block the next append writes: hazard names it, append refuses it
T.close(h)
p, r, c, T = boot(4, 8, q=q)
h2 = T.open(r, "window", 32, 1)  # 2 ring blocks, 1 kept in SRAM: block 0 is demoted once block 1 starts
eq(T.append(h2, rows[0]) >= 0, True, "token 0")
eq((T.n_inflight, T.where(h2, 1)), (0, tiers.PSRAM), "the empty next block went to PSRAM at once (nothing to copy)")
for n in range(1, 17):
    eq(T.append(h2, rows[0]) >= 0, True, "token %d" % n)
eq(T.n_inflight, 1, "block 0's copy to PSRAM is in flight (no engine ran)")
for _ in range(15):
    T.append(h2, rows[1])  # block 1: not the block being copied
ck = T.hazard(h2)
check(ck >= 0, "the 33rd token wraps into block 0: hazard gives the copy's cookie (%d)" % ck)
eq((T.append(h2, rows[2]), T.hazard_refused, c.length(h2)), (E_STATE, 1, 32), "append refused, nothing changed")
q.drain()
eq(T.hazard(h2), E_EMPTY, "nothing in flight once the copy landed")
check(T.append(h2, rows[2]) >= 0 and T.where(h2, 0) == tiers.PSRAM, "the append lands in the moved block (PSRAM)")

# --- review r1: the orders and failures that lost rows (small layouts) ---
sl = kv.Layout(1, 1, 8, "fp32", tokens_per_block=4)  # 320 B blocks: whole 32-byte lines (DMA)
SLR = sl.layer_row
srows = []
for j in range(40):
    srows.append(bytearray(bytes([(j * 7 + 1) & 255]) * sl.row_bytes))
s5a = bytearray(b"\x5A" * SLR)
s99 = bytearray(b"\x99" * SLR)
sd = bytearray(SLR)
res = [0] * 12


def small(n_sram, n_psram, q=None, fs=None, seqs=2, quota=0):
    sp = pool.Pool(sl.block_bytes, n_sram + n_psram, tiers=(n_sram, n_psram), tier_names=("sram", "psram"))
    sr = sp.add_region(quota or n_sram + n_psram)
    sc = kv.KVCache(sp, sl, max_seqs=seqs)
    return sp, sr, sc, tiers.Tiers(sc, dma=q, flash=fs)


# finding 2: hazard -> wait -> cache.reserve/write -> step (the documented reserve/write path,
# without Tiers seeing the copy land first): the copy is compared with the live block at
# completion and voided, the write is kept
q = dma.DMAQueue(Kernel(VirtualClock(), max_tasks=4), slots=16)
sp, sr, sc, T = small(2, 4, q=q)
h = T.open(sr, "window", 12, 2, -1)  # ring of 3 blocks: SRAM, SRAM, PSRAM
n = 0
while T.hazard(h) < 0 and n < 40:
    T.append(h, srows[n])
    n += 1
check(T.hazard(h) >= 0, "a copy of the block the next append writes is in flight after %d appends" % n)


def reserve_write_after_wait():
    res[0] = T.append(h, srows[0])  # refused: the copy is in flight
    q.drain()  # = yield q.wait(cookie): the copy has landed, Tiers has not seen it
    res[1] = sc.reserve(h)
    res[2] = sc.write(h, 0, s5a, 0)
    res[3] = T.step(h)
    res[4] = T.step(h)
    res[5] = T.read(h, n, 0, sd, 0)


no_alloc("window: hazard, wait, cache.reserve + write, then T.step (the copy voided at completion)", reserve_write_after_wait)
eq((res[0], res[1] >= 0, res[2], res[3], res[4], res[5], sd[0], sd[SLR - 1]), (E_STATE, True, OK, 0, 0, OK, 0x5A, 0x5A),
   "the write after the wait is kept: position %d reads 5a" % n)
eq((T.raced, T.voided, T.where(h, (n % 12) // 4)), (1, 1, tiers.SRAM), "the copy (its demotion to PSRAM) taken before the write was voided (raced): the written block stays")
bad = 0
for pos in range(n - 8, n):
    T.read(h, pos, 0, sd, 0)
    if sd[0] != srows[pos][0]:
        bad += 1
eq(bad, 0, "the older window positions still read back")
T.close(h)
# the same through T.reserve: refused while in flight, then it completes the copy first
sp, sr, sc, T = small(2, 4, q=q)
h = T.open(sr, "window", 12, 2, -1)
n = 0
while T.hazard(h) < 0 and n < 40:
    T.append(h, srows[n])
    n += 1


def tiers_reserve():
    res[0] = T.reserve(h)
    q.drain()
    res[1] = T.reserve(h)
    res[2] = sc.write(h, 0, s5a, 0)
    res[3] = T.step(h)
    res[5] = T.read(h, n, 0, sd, 0)


no_alloc("window: T.reserve refused while the copy is in flight, then after the wait", tiers_reserve)
eq((res[0], res[1] >= 0, res[2], res[3], res[5], sd[0]), (E_STATE, True, OK, 0, OK, 0x5A), "T.reserve path")
eq((T.raced, T.completed >= 1, T.hazard_refused), (0, True, 1), "the landed copy completed before the reserve (no race)")
T.close(h)

# finding 4: batch=1 (write-through) flushes the appended token while it is still reserved; a
# later cache.write to it is seen at the next step and flushed again before its block spills
PATH2 = PATH + ".2"
fs2 = flashkv.FlashStore(PATH2, 8, sl.block_bytes)
sp, sr, sc, T = small(2, 6, fs=fs2)


def late_write():
    T.append(h, srows[0])
    if batch == 4:
        for j in range(1, 4):
            T.append(h, srows[j])  # position 3 flushed at the batch boundary, still reserved
    res[0] = sc.write(h, 0, s99, 0)
    for j in range(4, 14):
        T.append(h, srows[j])
    res[1] = T.where(h, 0)
    res[2] = T.read(h, 0 if batch == 1 else 3, 0, sd, 0)


for batch in (1, 4):
    h = T.open(sr, "full", 0, 0, 0, True, batch)
    no_alloc("flash batch=%d: cache.write to the reserved token after its flush, then spill" % batch, late_write)
    eq((res[0], res[1], res[2], sd[0], sd[SLR - 1], T.reflushed), (OK, tiers.FLASH, OK, 0x99, 0x99, 1 if batch == 1 else 2),  # reflushed: cumulative
       "batch=%d: the spilled image holds the last write" % batch)
    T.close(h)
eq(fs2.used, 0, "slots released")

# finding 9: cache.close (not Tiers.close) of a tiered flash sequence releases its flash slots
# at once, and still calls an on_close callback installed before Tiers
seen = [0]


def prev_cb(hh):
    seen[0] += 1


sp = pool.Pool(sl.block_bytes, 8, tiers=(2, 6), tier_names=("sram", "psram"))
sr = sp.add_region(8)
sc = kv.KVCache(sp, sl, max_seqs=1)
sc.on_close = prev_cb
T = tiers.Tiers(sc, flash=fs2)
h = T.open(sr, "full", 0, 0, 0, True, 1)
for j in range(14):
    T.append(h, srows[j])
check(fs2.used >= 2 and T.spills >= 2, "blocks spilled (%d slots)" % fs2.used)


def cache_close():
    res[0] = sc.close(h)


no_alloc("cache.close of a tiered flash sequence (on_close releases its slots)", cache_close)
eq((res[0], fs2.used, sp.blocks_used, seen[0], T.sh[0]), (OK, 0, 0, 1, 0), "slots and blocks released, the earlier callback called")

# finding 7: fork of a tiered sequence: refused (E_STATE) once a block is in flash, else a
# plain child sharing the resident blocks
h = T.open(sr, "full", 0, 0, 0, True, 1)
for j in range(3):
    T.append(h, srows[j])
eq(T.where(h, 0), tiers.SRAM, "block 0 is current: in the pool")
T.close(h)
sp, sr, sc, T = small(2, 6, fs=fs2)
h = T.open(sr, "full", 0, 1, 1, True, 1)
for j in range(6):
    T.append(h, srows[j])
f = T.fork(h)
check(f >= 0 and f != h, "fork while every block is in the pool: a child (%d)" % f)
eq((sc.read(f, 5, 0, sd, 0), sd[0], T.read(f, 0, 0, sd, 0)), (OK, srows[5][0], E_STALE), "the child is a plain sequence: cache.read")
eq(sc.close(f), OK, "close the child")
for j in range(6, 20):
    T.append(h, srows[j])
eq(T.where(h, 0), tiers.FLASH, "block 0 spilled")


def fork_spilled():
    res[0] = T.fork(h)
    res[1] = sc.fork(h)


no_alloc("fork of a sequence with a block in flash (refused)", fork_spilled)
eq((res[0], res[1], T.fork_refused, T.read(h, 0, 0, sd, 0), sd[0]), (E_STATE, E_STATE, 1, OK, srows[0][0]), "fork refused; the parent unchanged")
T.close(h)

# finding 5: file errors are statuses, never stale bytes, never a traceback
IS_MP = sys.implementation.name == "micropython"


class FailFile:
    # the store's file, failing on demand: writes raise OSError (a full filesystem: ENOSPC,
    # preallocated so the heap-locked path raises without allocating), or are short
    def __init__(self, f):
        self.f = f
        self.mode = 0  # 0 pass, 1 raise, 2 short write
        self.exc = OSError(28)

    def seek(self, pos):
        return self.f.seek(pos)

    def write(self, buf, off=0, n=-1):
        if self.mode == 1:
            raise self.exc
        if self.mode == 2:
            return 0
        return self.f.write(buf, off, n) if IS_MP else self.f.write(buf)

    def readinto(self, buf, n=-1):
        return self.f.readinto(buf, n) if IS_MP else self.f.readinto(buf)

    def flush(self):
        return self.f.flush()

    def close(self):
        return self.f.close()


sp, sr, sc, T = small(2, 6, fs=fs2)
ff = FailFile(fs2.f)
fs2.f = ff
h = T.open(sr, "full", 0, 0, 0, True, 1)
T.append(h, srows[0])


def failing_flushes():
    bad = 0
    for j in range(1, 9):
        if T.append(h, srows[j]) < 0 or T.step_err != E_STATE:
            bad += 1
    res[0] = bad
    res[1] = T.step(h)


for mode in (1, 2):
    ff.mode = mode
    e0 = T.flash_errors
    no_alloc("flushes whose file writes %s" % ("raise OSError" if mode == 1 else "are short"), failing_flushes)
    eq((res[0], res[1], T.flash_errors - e0 >= 9, T.where(h, 0) < tiers.FLASH, T.where(h, 1) < tiers.FLASH, T.spills),
       (0, E_STATE, True, True, True, 0),
       "mode %d: appends succeed, every flush reports E_STATE, nothing spills" % mode)
    T.close(h)
    h = T.open(sr, "full", 0, 0, 0, True, 1)
    T.append(h, srows[0])
ff.mode = 0
for j in range(1, 14):
    T.append(h, srows[j])
eq((T.step_err, T.where(h, 0)), (OK, tiers.FLASH), "the file works again: flushed and spilled")
bad = 0
for pos in range(14):
    if T.read(h, pos, 0, sd, 0) != OK or sd[0] != srows[pos][0]:
        bad += 1
eq(bad, 0, "every position reads back after the failures")
# a truncated file: the staging read is E_STATE, never the previous staged block
h2 = T.open(sr, "full", 0, 0, 0, True, 1)
for j in range(14):
    T.append(h2, srows[39 - j])
eq((T.begin_pass(h), T.block(h, 0) >= 0, T.buf[T.block(h, 0) + sl.rows_off]), (OK, True, srows[0][0]), "h's block 0 staged")
open(PATH2, "wb").close()  # the file truncated behind the store (its open handle now reads short)


def truncated():
    res[0] = T.block(h2, 0)
    res[1] = T.begin_pass(h2)
    res[2] = T.read(h2, 0, 0, sd, 0)
    res[3] = T.block(h2, 3)  # resident: the pool, no file


no_alloc("block / begin_pass / read of a truncated flash file", truncated)
i2 = sc._idx(h2)
eq((res[0], res[1], res[2], res[3] >= 0, T.st_i[0] == i2, T.st_i[1] == i2), (E_STATE, E_STATE, E_STATE, True, False, False),
   "every flash read refused E_STATE, no staging buffer names h2's blocks")
T.close(h)
T.close(h2)
fs2.close()

# finding 8: a region whose quota was lowered below what it holds keeps its blocks charged
# to it when they move (pool.exchange; pool.transfer would refuse and strand them in Tiers')


def lowered():
    for j in range(30):
        if qq is not None and T.hazard(h) >= 0:
            qq.drain()
        T.append(h, srows[j])
    if qq is not None:
        qq.drain()
    T.step(h)


for qq in (None, dma.DMAQueue(Kernel(VirtualClock(), max_tasks=4), slots=16)):
    sp, sr, sc, T = small(6, 6, q=qq)
    h = T.open(sr, "window", 16, 1, -1)  # 4 ring blocks, all taken at open
    sp.set_quota(sr, 0)
    no_alloc("moves after set_quota lowered the sequence's region (%s)" % ("DMA" if qq else "CPU copies"), lowered)
    eq((sp.region_used[sr], sp.region_used[T.region], T.completed > 0, T.completed + T.voided, T.moves),
       (4, 0, True, T.moves, T.moves), "every block charged to the sequence's region; nothing left in Tiers' (%r)" % (T.stats(),))
    T.close(h)
fs.close()

# --- counters at their limits (docs/conventions.md "Counters and limits"): every Tiers count
# saturates at 2**30 - 1, the flash time carries its µs into whole seconds, which saturate;
# each preset one below its limit, then bumped with the heap locked (2**30 would be a big
# int on the 32-bit port: an allocation) ---
NEAR = INT_MAX - 1
CNT = ("moves", "completed", "voided", "deferred", "spills", "flushes", "flash_erases", "stage_hits", "stage_misses",
       "hazard_refused", "raced", "reflushed", "flash_errors", "fork_refused", "flash_s")


def preset(TT):
    for name in CNT:
        setattr(TT, name, NEAR)
    TT.flash_us = 999999


def saturated(TT):
    # the counters that reached the limit; every one at most INT_MAX
    out = []
    for name in CNT:
        v = getattr(TT, name)
        check(v.__class__ is int and v <= INT_MAX, "%s stays a small int: %r" % (name, v))
        if v == INT_MAX:
            out.append(name)
    check(0 <= TT.flash_us < 1000000, "flash_us below a second: %d" % TT.flash_us)
    return out


fs = flashkv.FlashStore(PATH, 12, lay.block_bytes)
p, r, c, T = boot(4, 8, fs=fs)
h = T.open(r, "full", 0, 2, 2, True, 16)
feed(8)
preset(T)
fs.errors = NEAR
fs.busy_s = NEAR
fs.busy_us = 999999
fs.bytes_written = 1000000000 - 1
fs.bytes_written_g = INT_MAX
box[0] = 0
no_alloc("append + step + flush + spill with every counter one below its limit", lambda: feed(N - 8))
eq(box[0], 0, "every append succeeded at the limits")
eq(T.where(h, 0), tiers.FLASH, "block 0 spilled")


def limits_read():
    T.begin_pass(h)
    T.block(h, 0)  # staged by begin_pass: a hit
    T.block(h, 3)  # not staged: a miss
    T.block(h, 1)
    res[0] = T.fork(h)  # a block in flash: refused


no_alloc("stage hits and misses, a refused fork, at the limits", limits_read)
eq(res[0], E_STATE, "fork refused")
fs.f, keep = None, fs.f  # every file call fails now


def limits_errors():
    for j in range(32):
        T.append(h, rows[j % NROWS])


no_alloc("flushes refused by the file at the limits", limits_errors)
fs.f = keep
got = saturated(T)
for name in ("moves", "completed", "spills", "flushes", "flash_erases", "flash_s", "stage_hits", "stage_misses",
             "fork_refused", "flash_errors"):
    check(name in got, "%s saturated at 2**30 - 1 (%r)" % (name, got))
eq((fs.errors, fs.busy_s, fs.busy_us, fs.bytes_written_g, fs.bytes_written),
   (INT_MAX, INT_MAX, 999999, INT_MAX, 999999999), "the flash store's counts saturate too")
T.close(h)
fs.close()

# the DMA path: a copy voided because its block was written after it (raced, voided), an
# append refused while the copy is in flight (hazard_refused)
q = dma.DMAQueue(Kernel(VirtualClock(), max_tasks=4), slots=16)
sp, sr, sc, T = small(2, 4, q=q)
h = T.open(sr, "window", 12, 2, -1)
n = 0
while T.hazard(h) < 0 and n < 40:
    T.append(h, srows[n])
    n += 1
preset(T)
no_alloc("a raced copy voided, an append refused in flight, at the limits", reserve_write_after_wait)
eq(res[0], E_STATE, "append refused while the copy is in flight")
got = saturated(T)
for name in ("raced", "voided", "hazard_refused"):
    check(name in got, "%s saturated at 2**30 - 1 (%r)" % (name, got))
T.close(h)

# --- FlashStore's int arguments: checked as ints before any arithmetic (a float, a bool, a
# big int is E_RANGE, never a raise from the file call), nothing written, read or counted ---
BIG = 1 << 40  # made before the heap lock (a big int on the 32-bit port)
fs = flashkv.FlashStore(PATH, 2, lay.block_bytes)
fsd = bytearray(lay.block_bytes)
fres = [0] * 14


def flash_bad_args():
    fs.begin()
    fres[0] = fs.write(0.0, 0, rows[0], 0, 16)
    fres[1] = fs.write(0, 0.5, rows[0], 0, 16)
    fres[2] = fs.write(0, 0, rows[0], 1.0, 16)
    fres[3] = fs.write(0, 0, rows[0], 0, 16.0)
    fres[4] = fs.write(True, 0, rows[0], 0, 16)
    fres[5] = fs.write(0, BIG, rows[0], 0, 16)
    fres[6] = fs.write(0, 0, rows[0], len(rows[0]) - 8, 16)  # past src's end
    fres[7] = fs.read_block(1.0, fsd)
    fres[8] = fs.read_at(0, 0.0, fsd, 16)
    fres[9] = fs.read_at(0, 0, fsd, 16.0)
    fres[10] = fs.read_at(BIG, 0, fsd, 16)
    fres[11] = fs.spend(1.5)
    fres[12] = fs.spend(-1)
    fres[13] = fs.end()


no_alloc("FlashStore write / read_block / read_at / spend with non-int and big-int arguments", flash_bad_args)
eq(fres, [E_RANGE] * 13 + [0], "every bad argument is E_RANGE, the transaction touched nothing")
eq((fs.bytes_written, fs.bytes_read, fs.errors, fs.busy_us), (0, 0, 0, 0), "nothing written, read or counted")
fs.close()
done()
