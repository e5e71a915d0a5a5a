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
from firmware_py.status import E_EMPTY, E_STALE, E_STATE, OK

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
fs.close()
done()
