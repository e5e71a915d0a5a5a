# Tiered KV placement: SRAM / PSRAM / flash for the blocks of a kv.KVCache whose pool has
# tier ranges (pool.Pool(..., tiers=(n_sram, n_psram), tier_names=("sram", "psram"))).
#
# Per sequence (opened through Tiers.open): its newest `keep_sram` blocks stay in the SRAM
# range, the next `keep_psram` in the PSRAM range, and with flash=True the older ones live
# only in a preallocated file (flashkv.FlashStore). A block changes range by a copy: through
# the DMA queue (dma.DMAQueue, chunks of 4,064 B that its engine merges into bursts) or, with
# dma=None, by the CPU at once. When the copy has completed the sequence's block-table entry
# points at the new block and the old one goes back to its range's free list.
#
# Which blocks move, and why none is written while its copy is in flight:
#   - only private blocks (pool refcount 1, checked at submission and again at completion),
#     never the block the sequence is writing (the current block, rank 0);
#   - full policy: every block before the current one is complete and never written again
#     by append/reserve/write (the only writers a tiered sequence may use; add_score is h2o's);
#   - window policy: the ring's next block (rank 1, written once the current one is full) may
#     be moved up to SRAM ahead of time; before every append the caller asks hazard(h): a
#     cookie to wait for (yield q.wait(cookie)) when the block that append will write still
#     has a copy in flight, and Tiers.append refuses E_STATE if the caller did not;
#   - sinks and h2o are refused at open (TiersError): their evictions write any block;
#   - whatever the call order (a cache.reserve/write after the DMA wait but before Tiers saw
#     the copy land, or while it was in flight), a DMA copy is compared with its live block at
#     completion and voided when they differ (raced): a write is never lost to a stale copy.
# A completed move hands the new block the old one's charge (pool.exchange: no quota asked).
# fork(h) refuses (E_STATE) while a block of h is in flash; cache.close(h) releases h's flash
# slots through cache.on_close (chained to any callback installed before).
# A flash spill drops a block from the pool only when it is complete and every one of its
# positions has been flushed to the file; the table entry becomes -1 and this module's map
# (fmap) names the flash slot. Read such a sequence through tiers.read / tiers.block, never
# kv.read: kv.read indexes the arena with the -1 entry (docs/tiers-placement.md).
#
# Flash write-back: rows of a flash sequence are written to its blocks' flash slots from the
# resident pool block (the write-back buffer is the SRAM/PSRAM block itself: nothing is
# copied twice), `batch` tokens at a time (16 by default: "flush after 16 tokens"), one
# FlashStore transaction per flush (each touched sector rewritten once; its erases counted).
# batch=1 is write-through (each token's rows as appended). A flush includes the newest token
# while it is still reserved: its flushed image is kept and compared at the next step, and a
# cache.write that changed it makes it unflushed again (reflushed) before its block may spill.
# File errors (OSError, short reads/writes) are E_STATE, counted in flash_errors, never raised:
# a failed flush leaves its positions in the pool (retried), a failed staging read is never
# served (docs/tiers-placement.md).
#
# Charging (bandwidth.py): a move is charged to `category` (default kv_write: it is the K/V
# rows being written to the tier where they will stay) on both ranges' tiers, once: by the
# DMA engine when the queue has a tracker, else here at submission. A flush is charged to
# `category` on the block's tier and the flash tier; its time (program at the flash tier's
# write rate + erases x 45 ms) is returned by step() for the caller to spend (k.charge: a
# flash write stalls the CPU). Reads of a flash block into a staging buffer are kv_read on
# flash and SRAM; their modelled time is in self.last_us after each block() call.
#
# Read-ahead: begin_pass(h), then block(h, k) for k = 0 .. blocks-1 returns a byte offset
# into self.buf (the pool's arena for a resident block, one of two staging buffers for a
# flash block) and sets self.tier (its tier id: charge the attention's reads there); for a
# flash block it has already started reading the sequence's next flash block into the other
# staging buffer. A returned staging buffer is valid until the next block() call.
#
# Hot paths (step, hazard, append, block, begin_pass, read, completion, flush) allocate
# nothing on MicroPython (tests/firmware/fw_tiers.py); configuration (Tiers, open) raises
# TiersError with one line.
from firmware_py.compat import const, misaligned, ticks_add, ticks_diff
from firmware_py.pool import T_END, T_LO, TF, copy32, filled, same32, zero32
from firmware_py.status import E_ALIGN, E_EMPTY, E_FULL, E_NO_BLOCK, E_RANGE, E_STALE, E_STATE, INT_MAX, OK

KV_READ = const(0)  # bandwidth.py's category numbers (bwm.KV_READ, bwm.KV_WRITE)
KV_WRITE = const(1)
K_READ = const(0)  # bandwidth.py's cost kinds (bwm.K_READ, bwm.K_WRITE)
K_WRITE = const(1)
CHUNK = const(4064)  # bytes per DMA descriptor: <= 4,095 and a multiple of PSRAM's 32-byte alignment
SRAM = const(0)  # pool range numbers this module places into
PSRAM = const(1)
FLASH = const(2)  # "in the flash file" (not a pool range)
KEEP_SRAM = const(2)  # default newest blocks kept in SRAM per sequence
BATCH = const(16)  # default write-back batch, tokens
MAX_MOVES = const(8)  # copies in flight at once (preallocated records)
_ALL = const(0x3FFFFFFF)  # keep_psram "no limit"
_FULL = const(0)
_WINDOW = const(1)
_NONE = const(-1)
_US_CAP = const(0x3FFFFFFF - 1000000)  # largest flash µs one flush reports: flash_us (< 10**6) + it stays < 2**30
# kv.KVCache.meta: a sequence slot's row (kv.py's _CFG, _NF, _F_SLOT: underscore consts are not
# importable on MicroPython; tests/test_tiers.py checks they still match)
_KV_CFG = const(10)
_KV_NF = const(13)
_KV_SLOT = const(4)


class TiersError(ValueError):
    # a configuration mistake (pool without tier ranges, unsupported policy); one line
    pass


# point block-table entry k of tiered sequence slot i, now pool block old, at block new
# (-1: the block left the pool, its rows are in the flash file) through kv.KVCache.retarget;
# the status (OK, or E_STATE when the entry changed meanwhile / a block is shared)
def _retarget(self, i, k, old, new):
    return self.cache.retarget(self.sh[i] - 1, k, old, new)


class Tiers:
    # cache: a kv.KVCache over a pool with >= 2 tier ranges (SRAM first). bw: a
    # bandwidth.Bandwidth (or None: nothing charged, no time modelled). dma: a dma.DMAQueue
    # (None: CPU copies, complete at once). flash: a flashkv.FlashStore (None: no flash
    # tier). category: the bandwidth category moves and flushes are charged to.
    def __init__(self, cache, bw=None, dma=None, flash=None, category=KV_WRITE, max_moves=MAX_MOVES,
                 sram="sram", psram="psram", flash_tier="flash"):
        pool = cache.pool
        if pool.n_tiers < 2:
            raise TiersError("tiers: the pool has no tier ranges (Pool(..., tiers=(n_sram, n_psram)))")
        lay = cache.layout
        self.cache = cache
        self.pool = pool
        self.arena = pool.arena
        self.t = cache.t  # tokens per block
        self.bb = cache.block_bytes  # bytes per block
        self.bw_words = cache.block_words
        self.n_layers = cache.n_layers
        self.rows_off = lay.rows_off  # first stored row in a block
        self.store_row = lay.store_row  # bytes per stored (layer, slot) row
        self.layer_row = cache.layer_row  # bytes read() copies per row
        self.kivi = cache.kivi
        self.bw = bw
        self.q = dma
        self.fs = flash
        self.cat = category
        self.mb = cache.max_blocks
        ms = cache.max_seqs
        self.ms = ms
        # bandwidth tier ids of the pool's ranges (their names are the profile's), and flash's
        self.tid = filled("i", pool.n_tiers, 0)
        for r in range(pool.n_tiers):
            self.tid[r] = bw.tier_id(pool.tier_names[r]) if bw is not None else r
        self.ftid = bw.tier_id(flash_tier) if (bw is not None and flash is not None) else FLASH
        if flash is not None and flash.block_bytes != self.bb:
            raise TiersError("tiers: flash slots hold %d B blocks, the cache's are %d B" % (flash.block_bytes, self.bb))
        self.region = pool.add_region(max_moves)  # destination blocks while their copy is in flight
        # per sequence slot
        self.sh = filled("i", ms, 0)  # handle + 1 of the tiered sequence in slot i, 0 none
        self.spol = filled("i", ms, 0)  # _FULL / _WINDOW
        self.scap = filled("i", ms, 0)  # budget (slots)
        self.skeep_s = filled("i", ms, 0)  # newest blocks kept in SRAM
        self.skeep_p = filled("i", ms, 0)  # next blocks kept in PSRAM (_ALL: no limit)
        self.sfl = bytearray(ms)  # 1: flash tier on
        self.sbatch = filled("i", ms, 1)  # write-back batch, tokens
        self.swb = filled("i", ms, 0)  # first position not yet flushed
        self.scur = filled("i", ms, _NONE)  # current block at the last scan
        self.spend = bytearray(ms)  # 1: a placement was deferred (retry next step)
        self.swp = filled("i", ms, _NONE)  # position flushed while still reserved (its image in wimg), -1 none
        self.img_words = (8 + self.n_layers * self.store_row) >> 2  # one token's header + rows, words
        self.wimg = bytearray(ms * self.img_words * 4)  # [seq] the flushed image of position swp
        self.fmap = filled("h", ms * self.mb, _NONE)  # [seq][block] flash slot or -1
        self.infl = bytearray(ms * self.mb)  # [seq][block] move record + 1 while its copy is in flight
        # moves in flight
        self.nm = max_moves
        self.mv_on = bytearray(max_moves)
        self.mv_h = filled("i", max_moves, 0)
        self.mv_i = filled("i", max_moves, 0)
        self.mv_k = filled("i", max_moves, 0)
        self.mv_old = filled("i", max_moves, 0)
        self.mv_new = filled("i", max_moves, 0)
        self.mv_ck = filled("i", max_moves, 0)  # cookie of the move's last descriptor
        self.n_inflight = 0
        self.ndesc = (self.bb + CHUNK - 1) // CHUNK  # descriptors per block
        self.dbuf = filled("i", pool.n_tiers, _NONE)  # DMA buffer id of each range's window of the arena
        self.charge_moves = bw is not None and (dma is None or dma.bw is None)  # else the engine charges
        if dma is not None:
            if self.bb % 32:
                raise TiersError("tiers: %d B blocks are not whole 32-byte PSRAM lines: GDMA cannot move them (dma=None: CPU copies)"
                                 % self.bb)
            if self.ndesc > dma.slots:
                raise TiersError("tiers: a block is %d descriptors, the DMA ring has %d slots" % (self.ndesc, dma.slots))
            mv = memoryview(pool.arena)
            for r in range(pool.n_tiers):
                lo = pool.tier[r * TF + T_LO]
                hi = pool.tier[r * TF + T_END]
                if hi > lo:
                    self.dbuf[r] = dma.add_buffer(mv[lo * self.bb:hi * self.bb], self.tid[r])
        # read-ahead: two staging buffers (block images), which (seq slot, block) each holds
        self.stage = (bytearray(self.bb), bytearray(self.bb)) if flash is not None else (bytearray(4), bytearray(4))
        self.st_i = filled("i", 2, _NONE)
        self.st_k = filled("i", 2, _NONE)
        self.st_ready = filled("i", 2, 0)  # clock tick at which the staged read has landed (modelled)
        self.rowbuf = bytearray(self.layer_row)  # one row read from flash (read())
        self.buf = self.arena  # block(): the buffer its offset is into
        self.tier = 0  # block(): tier id of that buffer
        self.last_us = 0  # block(): modelled µs the caller waited for the flash read (charge it)
        # counters: every count saturates at INT_MAX (2**30 - 1: only "many" matters), the
        # flash time carries its µs into whole seconds (which saturate)
        self.moves = 0  # copies started
        self.completed = 0  # copies that retargeted a table entry
        self.voided = 0  # copies whose sequence changed meanwhile (destination freed)
        self.deferred = 0  # placements put off: no free block, ring or record (saturates)
        self.spills = 0  # blocks dropped to flash
        self.flushes = 0  # write-back transactions
        self.flash_erases = 0  # erases the flushes cost (saturates)
        self.flash_us = 0  # modelled flash write time, µs part below 10**6
        self.flash_s = 0  # ... whole seconds
        self.stage_hits = 0  # block() found its flash block already staged (read ahead)
        self.stage_misses = 0  # block() had to read its flash block now
        self.hazard_refused = 0  # appends refused: a copy of the target block was in flight
        self.step_us = 0  # flash µs of the last step (append()'s included)
        self.step_err = OK  # OK, or E_STATE when the last step's flush failed (a file error)
        self.raced = 0  # DMA copies voided at completion: the block was written after the copy
        self.reflushed = 0  # flushed positions written again while reserved (flushed once more)
        self.flash_errors = 0  # flushes, staging reads and row reads a file error refused
        self.fork_refused = 0  # fork() refused: a block of the sequence is in flash
        # cache.close(h) of a tiered sequence (not only Tiers.close) gives its flash slots back
        # at once; a callback already installed is still called after ours
        self.chain_close = cache.on_close
        cache.on_close = self._closed

    # --- configuration --------------------------------------------------------------

    # open a tiered sequence: cache.open(region, policy, budget) plus its placement: keep_sram
    # newest blocks in SRAM, keep_psram next ones in PSRAM (-1: no limit), flash (full policy
    # only, not int4) older ones in the flash file, flushed every `batch` tokens. Returns the
    # handle, or cache.open's refusal; TiersError for unsupported parameters
    def open(self, region, policy="full", budget=0, keep_sram=KEEP_SRAM, keep_psram=-1, flash=False, batch=BATCH):
        if policy not in ("full", "window"):
            raise TiersError("tiers: policy %r is not supported (full and window: their writes go to known blocks)" % (policy,))
        for name, v, lo in (("keep_sram", keep_sram, 0), ("keep_psram", keep_psram, -1), ("batch", batch, 1)):
            if v.__class__ is not int or v < lo:
                raise TiersError("tiers: %s must be an int >= %d, got %r" % (name, lo, v))
        if flash:
            if self.fs is None:
                raise TiersError("tiers: flash=True needs Tiers(..., flash=FlashStore(...)) at boot")
            if policy != "full":
                raise TiersError("tiers: the flash tier is for full-policy sequences (a window's blocks are rewritten)")
            if self.kivi:
                raise TiersError("tiers: the flash tier does not take int4 (KIVI) blocks (their keys are folded after the block fills)")
            if keep_psram < 0:
                raise TiersError("tiers: flash=True needs keep_psram >= 0 (blocks past it go to flash)")
        h = self.cache.open(region, policy, budget)
        if h < 0:
            return h
        i = self.cache._idx(h)
        self._forget(i)
        self.sh[i] = h + 1
        self.spol[i] = _FULL if policy == "full" else _WINDOW
        self.scap[i] = budget or self.cache.max_slots
        self.skeep_s[i] = keep_sram
        self.skeep_p[i] = _ALL if keep_psram < 0 else keep_psram
        self.sfl[i] = 1 if flash else 0
        self.sbatch[i] = batch
        self.swb[i] = 0
        self.swp[i] = _NONE
        self.scur[i] = _NONE
        self.spend[i] = 0
        return h

    # close h: its flash slots freed, moves in flight voided at completion, cache.close(h).
    # OK or E_STALE. cache.close(h) does the same (through cache.on_close)
    def close(self, h):
        i = self._slot(h)
        if i < 0:
            return i
        self._forget(i)
        return self.cache.close(h)

    # cache.on_close: a tiered sequence closed through the cache releases its flash slots and
    # staging tags now (its copies in flight are voided at completion); then the callback that
    # was installed before this Tiers, if any. No allocation
    def _closed(self, h):
        i = self.cache._idx(h)
        if i >= 0 and self.sh[i] == h + 1:
            self._forget(i)
        if self.chain_close is not None:
            self.chain_close(h)

    # cache.fork(h) for a tiered sequence, refused with E_STATE (counted in fork_refused,
    # nothing changed) while any of its blocks is in the flash file: the child could not read
    # it. The child is a plain (untiered) sequence of the cache: read it with cache.read; the
    # blocks it shares stay where they are (only private blocks move or spill) until one of
    # the two lets go of them. Returns the child's handle or cache.fork's refusal; no allocation
    def fork(self, h):
        i = self._slot(h)
        if i < 0:
            return i
        if self.fs is not None:
            base = i * self.mb
            table = self.cache.table
            for k in range(base, base + self.mb):
                if self.fmap[k] >= 0 and table[k] < 0:
                    self._fork_refused()
                    return E_STATE
        f = self.cache.fork(h)
        if f == E_STATE:
            self._fork_refused()
        return f

    def _fork_refused(self):
        if self.fork_refused < INT_MAX:
            self.fork_refused += 1

    # release what slot i held here (flash slots, staging tags); the moves in flight of it are
    # voided when they complete (their handle no longer matches)
    def _forget(self, i):
        base = i * self.mb
        fs = self.fs
        for k in range(base, base + self.mb):
            s = self.fmap[k]
            if s >= 0:
                fs.free(s)
                self.fmap[k] = _NONE
        for j in range(2):
            if self.st_i[j] == i:
                self.st_i[j] = _NONE
        self.sh[i] = 0

    # --- hot path -------------------------------------------------------------------

    # slot index of tiered handle h, or E_STALE (closed, not tiered, or closed behind our
    # back: then its flash slots are released now); O(1)
    def _slot(self, h):
        i = self.cache._idx(h)
        if i < 0:
            j = self.cache.slot_of(h)
            if j >= 0:
                if self.sh[j] == h + 1:
                    self._forget(j)
            return E_STALE
        if self.sh[i] != h + 1:
            return E_STALE
        return i

    # the block index and the slot the next append of slot i writes (-1 none: full budget)
    def _next_block(self, i, n):
        cap = self.scap[i]
        if n < cap:
            return n // self.t
        if self.spol[i] == _FULL:
            return _NONE
        return (n % cap) // self.t

    # cookie (>= 0) of the copy in flight of the block h's next append (or reserve) writes:
    # yield dma.wait(cookie), then call hazard(h) again (it completes the landed copy) or go
    # through append/reserve here; E_EMPTY when there is none; E_STALE. O(1)
    def hazard(self, h):
        i = self._slot(h)
        if i < 0:
            return i
        self._complete()
        k = self._next_block(i, self.cache.length(h))
        if k < 0:
            return E_EMPTY
        j = self.infl[i * self.mb + k]
        if j == 0:
            return E_EMPTY
        return self.mv_ck[j - 1]

    # True (counted in hazard_refused) when the block the next append/reserve of slot i
    # writes has a copy in flight, after completing the copies that have landed
    def _busy(self, i, h):
        self._complete()
        k = self._next_block(i, self.cache.length(h))
        if k >= 0 and self.infl[i * self.mb + k]:
            if self.hazard_refused < INT_MAX:
                self.hazard_refused += 1
            return True
        return False

    # cache.append(h, src) for a tiered sequence, refused with E_STATE (nothing changed) while
    # the block it would write has a copy in flight (see hazard); then the placement step.
    # Returns append's result (flags >= 0 or E_*); the step's flash µs are in self.step_us,
    # its flush status in self.step_err (OK, or E_STATE: a file error; the token is appended
    # and stays in the pool, its flush is retried at the next step)
    def append(self, h, src):
        i = self._slot(h)
        if i < 0:
            return i
        if self._busy(i, h):
            return E_STATE
        rv = self.cache.append(h, src)
        if rv < 0:
            return rv
        self.step(h)
        return rv

    # cache.reserve(h) for a tiered sequence, refused with E_STATE (nothing changed) while the
    # block it would write has a copy in flight (as append); then cache.write each layer and
    # T.step(h). The slot (>= 0) or E_*
    def reserve(self, h):
        i = self._slot(h)
        if i < 0:
            return i
        if self._busy(i, h):
            return E_STATE
        return self.cache.reserve(h)

    # the placement step for h, after its newest token's rows are all written (append, or
    # reserve + every layer's write): completes copies that have landed, flushes the
    # write-back batch when it is full, moves blocks whose rank changed. Returns the µs of
    # flash time the caller spends (k.charge(us); also in self.step_us), E_STATE when the
    # flush met a file error (self.step_err; counted in flash_errors: nothing is lost, the
    # positions stay unflushed in the pool and are flushed again at the next step), or
    # E_STALE. O(1) per token (+ O(row) for a flush); O(blocks of h) once per block boundary
    # or after a deferred move; no allocation
    def step(self, h):
        i = self._slot(h)
        if i < 0:
            return i
        self._complete()
        n = self.cache.length(h)
        us = 0
        err = OK
        flushed = False
        if self.swp[i] >= 0:
            self._recheck(i)
        if self.sfl[i] and n - self.swb[i] >= self.sbatch[i]:
            us = self._flush(i, n)
            if us < 0:
                err = us
                us = 0
            flushed = True
        if n:
            c = ((n - 1) if self.spol[i] == _FULL else (n - 1) % self.scap[i]) // self.t
            if self.spend[i] or flushed or c != self.scur[i]:
                self.scur[i] = c
                self._place(i, n)
        self.step_us = us
        self.step_err = err
        return err if err < 0 else us

    # the slot reserved for write() in slot i (full policy: its position), or -1
    def _reserved(self, i):
        return self.cache.meta[_KV_CFG + i * _KV_NF + _KV_SLOT] - 1

    # copy (keep=1) position p's slot header (8 B) and its stored row of every layer from its
    # pool block into slot i's image, or compare them with it (keep=0): 1 when equal. O(row),
    # no allocation
    def _image(self, i, p, keep):
        t = self.t
        k = p // t
        b = self.cache.table[i * self.mb + k]
        if b < 0:
            return 1
        a = p - k * t
        bw = b * self.bw_words
        w = i * self.img_words
        sw = self.store_row >> 2
        arena = self.arena
        img = self.wimg
        if keep:
            copy32(img, w, arena, bw + 2 * a, 2)
        elif not same32(img, w, arena, bw + 2 * a, 2):
            return 0
        w += 2
        ro = self.rows_off >> 2
        for ly in range(self.n_layers):
            o = bw + ro + (ly * t + a) * sw
            if keep:
                copy32(img, w, arena, o, sw)
            elif not same32(img, w, arena, o, sw):
                return 0
            w += sw
        return 1

    # slot i flushed position swp while it was still reserved (kv.write may still change it):
    # when its rows differ from what was flushed it is unflushed again (flushed at the next
    # flush, its block kept in the pool until then); once its reservation has ended it is final
    def _recheck(self, i):
        p = self.swp[i]
        if not self._image(i, p, 0):
            if self.swb[i] > p:
                self.swb[i] = p
            if self.reflushed < INT_MAX:
                self.reflushed += 1
            self.swp[i] = _NONE
        elif self._reserved(i) != p:
            self.swp[i] = _NONE

    # write positions swb .. n - 1 of slot i to its flash slots (one transaction); the µs it
    # costs (program + erases), or E_STATE (a file error: positions from the failed block on
    # stay unflushed, retried at the next step; the time spent is still in flash_us). A flash
    # store without a free slot stops it (deferred)
    def _flush(self, i, n):
        fs = self.fs
        t = self.t
        base = i * self.mb
        table = self.cache.table
        arena = self.arena
        bb = self.bb
        L = self.n_layers
        sr = self.store_row
        ro = self.rows_off
        p0 = self.swb[i]
        p = p0
        nbytes = 0
        err = OK
        fs.begin()
        while p < n:
            k = p // t
            a = p - k * t
            e = n - k * t
            if e > t:
                e = t
            b = table[base + k]
            if b < 0:
                break  # cannot happen: a block is dropped only once flushed
            s = self.fmap[base + k]
            if s < 0:
                s = fs.alloc()
                if s < 0:
                    self._defer(i)
                    break
                self.fmap[base + k] = s
            src = b * bb
            m = e - a
            if fs.write(s, 8 * a, arena, src + 8 * a, 8 * m) != OK:
                err = E_STATE
                break
            for ly in range(L):
                off = ro + (ly * t + a) * sr
                if fs.write(s, off, arena, src + off, m * sr) != OK:
                    err = E_STATE
                    break
            if err:
                break
            nb = m * (8 + L * sr)
            nbytes += nb
            if self.bw is not None:
                self.bw.charge_copy(self.tid[self.pool.tier_of(b)], self.ftid, self.cat, nb)
            p = k * t + e
        er = fs.end()
        self.swb[i] = p
        r = self._reserved(i)
        if p0 <= r < p:  # flushed while still writable: keep what was flushed, to compare later
            self._image(i, r, 1)
            self.swp[i] = r
        if self.flushes < INT_MAX:
            self.flushes += 1
        v = self.flash_erases
        self.flash_erases = v + er if er < INT_MAX - v else INT_MAX  # v + er could pass 2**30
        eu = fs.erase_us
        us = er * eu if er <= _US_CAP // (eu if eu > 0 else 1) else _US_CAP  # flash_us + us stays < 2**30
        if self.bw is not None and nbytes:
            c = self.bw.cost_us(self.ftid, K_WRITE, nbytes)
            if c > 0:
                us = us + c if c < _US_CAP - us else _US_CAP
        fs.spend(us)
        v = self.flash_us + us
        if v >= 1000000:
            q = v // 1000000
            sec = self.flash_s
            if q >= INT_MAX - sec:  # saturated: the µs stay at their top
                self.flash_s = INT_MAX
                v = 999999
            else:
                self.flash_s = sec + q
                v %= 1000000
        self.flash_us = v
        if err:
            self._flash_error()
            return err
        return us

    def _flash_error(self):
        if self.flash_errors < INT_MAX:
            self.flash_errors += 1

    def _defer(self, i):
        self.spend[i] = 1
        if self.deferred < INT_MAX:
            self.deferred += 1

    # rank of block k of slot i (0: the current block; window: 1 the ring's next), given the
    # current block c, the ring's next nxt (-1 none) and the blocks nb
    # (inlined in _place)

    # move the blocks of slot i whose rank wants another range; n = length (>= 1)
    def _place(self, i, n):
        t = self.t
        cap = self.scap[i]
        if self.spol[i] == _FULL:
            c = (n - 1) // t
            nb = c + 1
            nxt = _NONE
        else:
            nb = (cap + t - 1) // t
            c = ((n - 1) % cap) // t
            nxt = c + 1 if c + 1 < nb else 0
            if nxt == c:
                nxt = _NONE
        ks = self.skeep_s[i]
        kp = self.skeep_p[i]
        fl = self.sfl[i]
        base = i * self.mb
        table = self.cache.table
        ref = self.pool.ref
        pool = self.pool
        self.spend[i] = 0
        for k in range(nb):
            if k == c:
                continue
            b = table[base + k]
            if b < 0 or self.infl[base + k]:
                continue
            if k == nxt:
                rank = 1
            elif nxt < 0:
                rank = c - k if c >= k else c - k + nb
            else:
                rank = (c - k if c >= k else c - k + nb) + 1
            if rank < ks:
                want = SRAM
            elif kp >= _ALL or rank < ks + kp or not fl:
                want = PSRAM
            else:
                want = FLASH
            if ref[b] != 1:
                continue
            if want == FLASH:
                if self.swb[i] >= (k + 1) * t and self.fmap[base + k] >= 0 and _retarget(self, i, k, b, _NONE) == OK:
                    pool.unref(b)
                    if self.spills < INT_MAX:
                        self.spills += 1
                else:
                    self.spend[i] = 1  # not flushed yet: retried at the next step
                continue
            if pool.tier_of(b) != want:
                if n <= k * t:  # a ring block never written yet: nothing to copy
                    if self._swap_empty(i, k, b, want) < 0:
                        self._defer(i)
                elif self._start(i, k, b, want) < 0:
                    self._defer(i)

    # block b (table index k of slot i) holds no position yet (a window's ring block before the
    # ring reached it): give the entry an empty block of range dst at once, no copy. OK or
    # E_NO_BLOCK
    def _swap_empty(self, i, k, b, dst):
        pool = self.pool
        nb = pool.alloc(self.region, dst)
        if nb < 0:
            return E_NO_BLOCK
        zero32(self.arena, nb * self.bw_words, 2 * self.t)  # every slot empty, as kv.open leaves a ring block
        if _retarget(self, i, k, b, nb) != OK:
            pool.unref(nb)
            return E_NO_BLOCK
        pool.exchange(b, nb)  # nb takes b's charge (whatever its region's quota is now), b ours
        pool.unref(b)
        return OK

    # copy block b (table index k of slot i) to range dst: DMA descriptors, or a CPU copy
    # completed now. OK, E_FULL (ring or move records), E_NO_BLOCK (range full)
    def _start(self, i, k, b, dst):
        pool = self.pool
        q = self.q
        src = pool.tier_of(b)
        bb = self.bb
        if q is None:
            nb = pool.alloc(self.region, dst)
            if nb < 0:
                return E_NO_BLOCK
            w = self.bw_words
            copy32(self.arena, nb * w, self.arena, b * w, w)
            if self.charge_moves:
                self.bw.charge_copy(self.tid[src], self.tid[dst], self.cat, bb)
            if self.moves < INT_MAX:
                self.moves += 1
            self._finish(i, k, b, nb, self.sh[i] - 1, False)
            return OK
        if q.slots - q.count < self.ndesc or q.putters.head is not None:
            return E_FULL
        j = 0
        while j < self.nm and self.mv_on[j]:
            j += 1
        if j >= self.nm:
            return E_FULL
        nb = pool.alloc(self.region, dst)
        if nb < 0:
            return E_NO_BLOCK
        tr = pool.tier
        soff = (b - tr[src * TF + T_LO]) * bb
        doff = (nb - tr[dst * TF + T_LO]) * bb
        sid = self.dbuf[src]
        did = self.dbuf[dst]
        off = 0
        ck = 0
        while off < bb:
            m = bb - off
            if m > CHUNK:
                m = CHUNK
            ck = q.submit_nowait(sid, soff + off, did, doff + off, m, self.cat)
            off += m
        if self.charge_moves:
            self.bw.charge_copy(self.tid[src], self.tid[dst], self.cat, bb)
        self.mv_on[j] = 1
        self.mv_h[j] = self.sh[i] - 1
        self.mv_i[j] = i
        self.mv_k[j] = k
        self.mv_old[j] = b
        self.mv_new[j] = nb
        self.mv_ck[j] = ck
        self.infl[i * self.mb + k] = j + 1
        self.n_inflight += 1
        if self.moves < INT_MAX:
            self.moves += 1
        return OK

    # every copy whose last descriptor has completed: retarget or void; O(max_moves)
    def _complete(self):
        if self.n_inflight == 0:
            return
        q = self.q
        for j in range(self.nm):
            if self.mv_on[j] and q.done(self.mv_ck[j]) == 1:
                self.mv_on[j] = 0
                self.n_inflight -= 1
                i = self.mv_i[j]
                k = self.mv_k[j]
                self.infl[i * self.mb + k] = 0
                self._finish(i, k, self.mv_old[j], self.mv_new[j], self.mv_h[j], True)

    # the copy of old (table index k of slot i, sequence handle h) into new has landed: the
    # entry points at new, old is freed, new takes old's charge (pool.exchange: no quota is
    # asked again, so a region whose quota was lowered meanwhile keeps its blocks); void (new
    # freed) when the sequence was closed, the entry changed or old became shared meanwhile,
    # and, for a DMA copy (dma=True), when old's words differ from the copy's: old was written
    # after its bytes were copied (a reserve/write before Tiers saw the copy land), and the
    # live block stays where it is (counted in raced). O(block) for the compare, no allocation
    def _finish(self, i, k, old, new, h, dma):
        pool = self.pool
        w = self.bw_words
        if dma and self.sh[i] == h + 1 and not same32(self.arena, old * w, self.arena, new * w, w):
            if self.raced < INT_MAX:
                self.raced += 1
        elif self.sh[i] == h + 1 and self.cache.retarget(h, k, old, new) == OK:
            pool.exchange(old, new)  # both private (retarget checked): cannot fail
            pool.unref(old)
            if self.completed < INT_MAX:
                self.completed += 1
            return
        pool.unref(new)
        if self.voided < INT_MAX:
            self.voided += 1
        self.spend[i] = 1  # placement retried at the next step

    # --- reading --------------------------------------------------------------------

    # start an attention pass over h: stage its first flash block (read-ahead). OK, E_STALE,
    # E_STATE (the file refused the read: counted in flash_errors; block() reads it again)
    def begin_pass(self, h):
        i = self._slot(h)
        if i < 0:
            return i
        self._complete()
        self.last_us = 0
        k = self._next_flash(i, 0)
        if k >= 0 and self._stage(i, k, 0) < 0:
            return E_STATE
        return OK

    # the first block index >= k of slot i that lives in flash, or -1
    def _next_flash(self, i, k):
        if self.fs is None:
            return _NONE
        base = i * self.mb
        while k < self.mb:
            if self.fmap[base + k] >= 0 and self.cache.table[base + k] < 0:
                return k
            if self.cache.table[base + k] < 0 and self.fmap[base + k] < 0:
                return _NONE  # past the sequence's blocks
            k += 1
        return _NONE

    # read flash block k of slot i into staging buffer j (modelled: it lands after the flash
    # read time, from when the flash tier is free). j, or E_STATE when the file refused the
    # read (counted in flash_errors; the buffer then holds no block: its tag is cleared)
    def _stage(self, i, k, j):
        s = self.fmap[i * self.mb + k]
        self.st_i[j] = _NONE  # the buffer is being overwritten: no block until the read is whole
        self.st_k[j] = _NONE
        if self.fs.read_block(s, self.stage[j]) != OK:
            self._flash_error()
            return E_STATE
        self.st_i[j] = i
        self.st_k[j] = k
        bw = self.bw
        if bw is not None:
            bw.charge_copy(self.ftid, self.tid[SRAM], KV_READ, self.bb)
            us = bw.occupy(self.ftid, K_READ, self.bb)
            self.st_ready[j] = ticks_add(bw.clock.now(), us if us > 0 else 0)
        return j

    # byte offset of block k of h in self.buf (self.tier: its tier id; self.last_us: µs
    # waited for a flash read); for a flash block the next flash block is read ahead first.
    # E_STALE, E_RANGE (k), E_EMPTY (no such block), E_STATE (the file refused the block's
    # read: never another block's bytes; a refused read-ahead is only counted, and read again
    # when its block is asked for); O(1) + one block read; no allocation
    def block(self, h, k):
        i = self._slot(h)
        if i < 0:
            return i
        if k.__class__ is not int or k < 0 or k >= self.mb:
            return E_RANGE
        self.last_us = 0
        b = self.cache.table[i * self.mb + k]
        if b >= 0:
            self.buf = self.arena
            self.tier = self.tid[self.pool.tier_of(b)]
            return b * self.bb
        if self.fs is None or self.fmap[i * self.mb + k] < 0:
            return E_EMPTY
        if self.st_i[0] == i and self.st_k[0] == k:
            j = 0
            if self.stage_hits < INT_MAX:
                self.stage_hits += 1
        elif self.st_i[1] == i and self.st_k[1] == k:
            j = 1
            if self.stage_hits < INT_MAX:
                self.stage_hits += 1
        else:
            j = 0
            if self.stage_misses < INT_MAX:
                self.stage_misses += 1
            if self._stage(i, k, 0) < 0:
                return E_STATE
        if self.bw is not None:
            w = ticks_diff(self.st_ready[j], self.bw.clock.now())
            self.last_us = w if w > 0 else 0
        nk = self._next_flash(i, k + 1)
        if nk >= 0 and not (self.st_i[1 - j] == i and self.st_k[1 - j] == nk):
            self._stage(i, nk, 1 - j)  # read ahead into the other buffer
        self.buf = self.stage[j]
        self.tier = self.tid[SRAM]
        return 0

    # cache.read(h, pos, layer, dst, dst_off) for a tiered sequence: a position whose block is
    # in flash is read from the file (one row). Same results as kv.read
    def read(self, h, pos, layer, dst, dst_off):
        i = self._slot(h)
        if i < 0:
            return i
        slot = self.cache.locate(h, pos)
        if slot < 0:
            return slot
        t = self.t
        k = slot // t
        if self.cache.table[i * self.mb + k] >= 0 or self.fs is None:
            return self.cache.read(h, pos, layer, dst, dst_off)
        s = self.fmap[i * self.mb + k]
        if s < 0:
            return E_EMPTY
        if self.cache.bad_dst(layer, dst, dst_off):  # the cache's own rule (its arena is this pool's)
            return E_RANGE
        if misaligned(dst, 3):  # as kv.read: words to an unaligned address fault on the chip
            return E_ALIGN
        n = self.layer_row
        rv = self.fs.read_at(s, self.rows_off + (layer * t + slot - k * t) * self.store_row, self.rowbuf, n)
        if rv < 0:
            self._flash_error()
            return rv
        copy32(dst, dst_off >> 2, self.rowbuf, 0, n >> 2)
        return OK

    # where block k of h lives: SRAM / PSRAM (pool range), FLASH, or E_EMPTY / E_STALE / E_RANGE
    def where(self, h, k):
        i = self._slot(h)
        if i < 0:
            return i
        if k.__class__ is not int or k < 0 or k >= self.mb:
            return E_RANGE
        b = self.cache.table[i * self.mb + k]
        if b >= 0:
            return self.pool.tier_of(b)
        if self.fs is not None and self.fmap[i * self.mb + k] >= 0:
            return FLASH
        return E_EMPTY

    # counters as a dict (allocates: reporting only)
    def stats(self):
        return {
            "moves": self.moves, "completed": self.completed, "voided": self.voided, "in_flight": self.n_inflight,
            "deferred": self.deferred, "spills": self.spills, "flushes": self.flushes,
            "flash_erases": self.flash_erases, "flash_us": self.flash_s * 1000000 + self.flash_us,
            "stage_hits": self.stage_hits, "stage_misses": self.stage_misses, "hazard_refused": self.hazard_refused,
            "raced": self.raced, "reflushed": self.reflushed, "flash_errors": self.flash_errors,
            "fork_refused": self.fork_refused,
            "pool": self.pool.tier_stats(),
        }

