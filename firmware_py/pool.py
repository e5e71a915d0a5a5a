# Static heap pool: one arena allocated once at boot, split into fixed-size blocks.
# Allocation and free are O(1) (a free list threaded through an index array), never
# touch the heap after boot, and cannot fragment it. Regions give each request a
# quota of blocks; counters follow FreeRTOS HeapStats_t and Zephyr k_mem_slab.
# Results follow firmware_py/status.py: alloc/share/unref/free are hot-path calls that
# return an int (a block, OK, or a negative code) and never raise or allocate; the
# constructor, add_region and set_quota raise PoolError (docs/conventions.md).
#
# arena (bytearray, one tier: the MicroPython GC heap = PSRAM on the ESP32-S3), or a
#   4-byte-aligned window of a caller's buffer (Pool(..., arena=memoryview(buf)[a:b]))
#   block b occupies arena[b * block_bytes : (b + 1) * block_bytes]
#   views[b] is a memoryview of exactly that block, made once here at boot
#   (slicing a memoryview later would allocate on MicroPython).
#
# Tier ranges (Pool(..., tiers=(n_sram, n_psram), tier_names=("sram", "psram"))): the blocks
# are split at boot into consecutive ranges, fastest first (the board profile's order), one
# free list per range. alloc(region, tier=-1) takes from the fastest range with a free
# block, alloc(region, t) from range t only; tier_of(b) is the range of block b. On a board
# MicroPython cannot place a bytearray in SRAM or PSRAM: the ranges are the profile's labels
# there, and the emulator (bandwidth.py's cost model) is where their costs differ
# (docs/tiers-placement.md). Without tiers= there is one range and everything is as before.
from array import array

from firmware_py.compat import buffer_address, buffer_writable, const, mem_free, micropython, ptr32
from firmware_py.status import CARRY_N, E_FULL, E_NO_BLOCK, E_RANGE, E_STATE, INT_MAX, OK

_NONE = const(-1)  # free-list end
_TAKEN = const(-2)  # next[b] of a block that is allocated
_MAX_REGIONS = const(16)  # regions are numbered 0 .. _MAX_REGIONS - 1
_MAX_BLOCKS = const(0x7FFF)  # block numbers fit array('h') (block tables, ref counts)
_MAX_REF = const(0x7FFF)  # references one block may have (array('h'))
MAX_TIERS = const(4)  # tier ranges a pool may have (sram, psram, ...: a board has at most a few)
# fields of one tier range's row in Pool.tier (TF ints per range)
T_LO = const(0)  # first block of the range
T_END = const(1)  # one past its last block
T_HEAD = const(2)  # first block of its free list, or -1
T_FREE = const(3)  # blocks on its free list now
T_USED = const(4)  # blocks of it allocated now
T_HIGH = const(5)  # most of its blocks ever allocated at once
T_MIN_FREE = const(6)  # fewest of its blocks ever free
T_FAILED = const(7)  # alloc(region, t) refused because the range was empty (saturates at 2**30 - 1)
TF = const(8)
# per-block bookkeeping bytes kept outside the arena: next (4) + ref (2) + owner (1)
META_BYTES_PER_BLOCK = const(7)
# a view per block: memoryview object + list slot, measured on the 64-bit unix port
# (32 + 8 B; the ESP32's 32-bit objects need half): tests/firmware/fw_pool.py
VIEW_BYTES_PER_BLOCK = const(40)
POOL_FIXED_BYTES = const(1024)  # the Pool object, its small arrays, GC rounding (measured ~870 B)


class PoolError(ValueError):
    # a configuration mistake (bad size or quota, no such region) or an arena that does
    # not fit in the heap at boot; str() is one line
    pass


@micropython.viper
def zero32(buf, word: int, n: int):
    # buf's uint32 words [word, word + n) = 0; O(n), no allocation
    p = ptr32(buf)
    i = word
    end = word + n
    while i < end:
        p[i] = 0
        i += 1


@micropython.viper
def copy32(dst, dword: int, src, sword: int, n: int):
    # dst words [dword, dword + n) = src words [sword, sword + n), 8 words per turn;
    # O(n), no allocation
    d = ptr32(dst)
    s = ptr32(src)
    e8 = dword + n - 7
    end = dword + n
    while dword < e8:
        d[dword] = s[sword]
        d[dword + 1] = s[sword + 1]
        d[dword + 2] = s[sword + 2]
        d[dword + 3] = s[sword + 3]
        d[dword + 4] = s[sword + 4]
        d[dword + 5] = s[sword + 5]
        d[dword + 6] = s[sword + 6]
        d[dword + 7] = s[sword + 7]
        dword += 8
        sword += 8
    while dword < end:
        d[dword] = s[sword]
        dword += 1
        sword += 1


@micropython.viper
def same32(a, aword: int, b, bword: int, n: int) -> int:
    # 1 when a's uint32 words [aword, aword + n) equal b's [bword, bword + n), else 0;
    # O(n), stops at the first difference, no allocation
    pa = ptr32(a)
    pb = ptr32(b)
    i = aword
    j = bword
    end = aword + n
    while i < end:
        if pa[i] != pb[j]:
            return 0
        i += 1
        j += 1
    return 1


@micropython.viper
def copy_rows(dst, dword: int, step: int, src, sword: int, w: int, rows: int):
    # rows runs of w words: dst words [dword + k * step, + w) = src words [sword + k * w, + w),
    # 8 words per turn (the same loop as append's); O(rows * w), no allocation
    d = ptr32(dst)
    s = ptr32(src)
    k = 0
    while k < rows:
        i = dword
        j = sword
        e8 = i + w - 7
        end = i + w
        while i < e8:
            d[i] = s[j]
            d[i + 1] = s[j + 1]
            d[i + 2] = s[j + 2]
            d[i + 3] = s[j + 3]
            d[i + 4] = s[j + 4]
            d[i + 5] = s[j + 5]
            d[i + 6] = s[j + 6]
            d[i + 7] = s[j + 7]
            i += 8
            j += 8
        while i < end:
            d[i] = s[j]
            i += 1
            j += 1
        dword += step
        sword += w
        k += 1


@micropython.viper
def zero_rows(buf, word: int, step: int, w: int, rows: int):
    # rows runs of w zero words at buf words word + k * step, 8 per turn; O(rows * w), no allocation
    p = ptr32(buf)
    k = 0
    while k < rows:
        i = word
        e8 = i + w - 7
        end = i + w
        while i < e8:
            p[i] = 0
            p[i + 1] = 0
            p[i + 2] = 0
            p[i + 3] = 0
            p[i + 4] = 0
            p[i + 5] = 0
            p[i + 6] = 0
            p[i + 7] = 0
            i += 8
        while i < end:
            p[i] = 0
            i += 1
        word += step
        k += 1


class Pool:
    # fixed-size block allocator over one preallocated arena, with regions (quotas)
    n_tiers = 1  # tier ranges (set per pool by tiers=)
    tier_names = ("all",)  # range names: the board profile's tier names (tiers=, tier_names=)
    tier = None  # array('i') of TF ints per range (tiers= only)

    def __init__(self, block_bytes, n_blocks, clear_on_free=False, views=True, arena=None, tiers=None, tier_names=None):
        if block_bytes < 4 or block_bytes % 4:
            raise PoolError("block_bytes must be a positive multiple of 4, got %d" % block_bytes)
        if n_blocks < 1 or n_blocks > _MAX_BLOCKS:
            raise PoolError("n_blocks must be 1..%d, got %d" % (_MAX_BLOCKS, n_blocks))
        counts = _tier_counts(n_blocks, tiers, tier_names)
        need = block_bytes * n_blocks
        if arena is not None:
            # viper reads and writes the arena as uint32 words: it must be writable, whole
            # words long and start on a 4-byte boundary (unaligned 32-bit access faults on Xtensa)
            if not buffer_writable(arena):
                raise PoolError("arena must be a writable buffer (a bytearray or a window of one), got %s" % type(arena).__name__)
            if len(arena) % 4:
                raise PoolError("arena must be a byte buffer whose length is a multiple of 4, got %d B" % len(arena))
            if buffer_address(arena) % 4:
                raise PoolError("arena must start on a 4-byte boundary (a window memoryview(buf)[a:b] needs a % 4 == 0)")
            if len(arena) < need:
                raise PoolError("arena of %d B is smaller than %d blocks of %d B" % (len(arena), n_blocks, block_bytes))
            need = 0  # the caller's buffer: nothing to allocate here
        total = need + n_blocks * (META_BYTES_PER_BLOCK + (VIEW_BYTES_PER_BLOCK if views else 0)) + POOL_FIXED_BYTES
        free = mem_free()  # None on CPython: not measurable, just try
        if free is not None and total > free:
            raise PoolError("arena needs %d B (%d blocks of %d B + bookkeeping), heap has %d B free"
                            % (total, n_blocks, block_bytes, free))
        if arena is None:
            try:
                arena = bytearray(need)
            except MemoryError:
                # mem_free() counts all free bytes; the arena needs them in one piece
                raise PoolError("arena needs %d B in one piece, heap has %s B free but fragmented" % (need, mem_free())) from None
        self.arena = arena  # bytearray (or aligned window) of n_blocks * block_bytes, the only KV memory
        self.block_bytes = block_bytes  # bytes per block, multiple of 4
        self.block_words = block_bytes // 4  # uint32 words per block
        self.n_blocks = n_blocks  # blocks in the arena
        self.clear_on_free = clear_on_free  # zero a block when it returns to the free list
        self.next = array("i", range(1, n_blocks + 1))  # free-list link; _TAKEN when allocated
        self.next[n_blocks - 1] = _NONE
        self.head = 0  # first free block of tier 0 (the only list without tiers=), or _NONE
        # tier ranges: row t of self.tier (TF ints, fields T_*) describes range t: blocks
        # T_LO .. T_END - 1, its free list and counters. Without tiers= the class defaults
        # stand (n_tiers 1, tier None: the pool's own head and counters are tier 0's)
        if tiers is not None:
            nt = len(counts)
            self.n_tiers = nt  # tier ranges
            self.tier_names = tuple(tier_names) if tier_names is not None else tuple("t%d" % t for t in range(nt))
            self.tier = filled("i", nt * TF, 0)  # [t * TF + T_*] see T_* above
            tr = self.tier
            lo = 0
            for t in range(nt):
                c = counts[t]
                o = t * TF
                tr[o + T_LO] = lo
                tr[o + T_END] = lo + c
                tr[o + T_FREE] = c
                tr[o + T_MIN_FREE] = c
                tr[o + T_HEAD] = lo if c else _NONE
                if c:
                    self.next[lo + c - 1] = _NONE
                lo += c
            self.head = tr[T_HEAD]
        self.ref = filled("h", n_blocks, 0)  # references to each block (0 = free)
        self.owner = filled("b", n_blocks, _NONE)  # region charged for each block, _NONE when free
        self.quota = filled("i", _MAX_REGIONS, 0)  # blocks each region may hold; 0 = closed
        self.region_used = filled("i", _MAX_REGIONS, 0)  # blocks each region holds now
        self.n_regions = 0  # regions handed out so far
        # counters in the style of FreeRTOS HeapStats_t / Zephyr k_mem_slab; the three
        # event counts are kept modulo CARRY_N with a carry field (name_g, units of
        # CARRY_N), so they stay small ints on the ESP32 however long it runs
        self.blocks_free = n_blocks  # blocks on the free list now
        self.blocks_used = 0  # blocks allocated now
        self.high_water = 0  # most blocks ever allocated at once (Zephyr max_used)
        self.min_free = n_blocks  # fewest blocks ever free (xMinimumEverFreeBytesRemaining)
        self.allocs = 0  # successful allocations, modulo CARRY_N
        self.allocs_g = 0  # ... in units of CARRY_N
        self.frees = 0  # blocks returned to the free list, modulo CARRY_N
        self.frees_g = 0  # ... in units of CARRY_N
        self.failed = 0  # allocations refused with E_NO_BLOCK (pool empty or quota reached), modulo CARRY_N
        self.failed_g = 0  # ... in units of CARRY_N
        self.n_caches = 0  # KVCaches made over this pool (each tags its handles with its number)
        self.views = None  # [memoryview] of each block, made once at boot, or None
        if views:
            mv = memoryview(arena)
            try:
                views = [None] * n_blocks  # sized once: a growing list would over-allocate
                for i in range(n_blocks):
                    views[i] = mv[i * block_bytes:(i + 1) * block_bytes]
            except MemoryError:
                self.arena = None
                raise PoolError("block views need %d B more, heap has %s B free" % (n_blocks * VIEW_BYTES_PER_BLOCK, mem_free())) from None
            self.views = views

    # open a region that may hold at most quota blocks; returns its id; boot/admission time
    def add_region(self, quota):
        if self.n_regions >= _MAX_REGIONS:
            raise PoolError("no more than %d regions" % _MAX_REGIONS)
        if quota.__class__ is not int or quota < 0 or quota > INT_MAX:
            raise PoolError("quota must be an int 0 .. 2**30 - 1, got %r" % (quota,))
        r = self.n_regions
        self.n_regions = r + 1
        self.quota[r] = quota
        return r

    # change a region's quota (a lower quota keeps blocks already held); O(1)
    def set_quota(self, region, quota):
        if region.__class__ is not int or region < 0 or region >= self.n_regions:
            raise PoolError("no region %r" % (region,))
        if quota.__class__ is not int or quota < 0 or quota > INT_MAX:
            raise PoolError("quota must be an int 0 .. 2**30 - 1, got %r" % (quota,))
        self.quota[region] = quota

    # one free block charged to region, from tier range `tier` (-1: the fastest range with a
    # free block); E_RANGE for a region never added or a tier not 0 .. n_tiers - 1 (or -1),
    # E_NO_BLOCK (counted in .failed, and in tier_failed for a given tier) when the pool or
    # that range is empty or the quota is reached; O(n_tiers) (<= 4), no allocation. Every
    # int argument is checked to be an int (x.__class__ is int) before any use: a float, a
    # bool or a big int is E_RANGE (here and in every hot-path call below)
    def alloc(self, region, tier=-1):
        if region.__class__ is not int or region < 0 or region >= self.n_regions:
            return E_RANGE
        if tier.__class__ is not int or tier < -1 or tier >= self.n_tiers:
            return E_RANGE
        tr = self.tier
        if tr is None:
            return self._alloc1(region)
        if tier < 0:
            o = 0
            last = (self.n_tiers - 1) * TF
            while o < last and tr[o + T_HEAD] < 0:
                o += TF
        else:
            o = tier * TF
        b = tr[o + T_HEAD]
        if b < 0 or self.region_used[region] >= self.quota[region]:
            if b < 0 and tier >= 0 and tr[o + T_FAILED] < INT_MAX:
                tr[o + T_FAILED] += 1
            self.count_failed()
            return E_NO_BLOCK
        nb = self.next[b]
        tr[o + T_HEAD] = nb
        if o == 0:
            self.head = nb
        self._take(b, region)
        tu = tr[o + T_USED] + 1
        tr[o + T_USED] = tu
        tf = tr[o + T_FREE] - 1
        tr[o + T_FREE] = tf
        if tu > tr[o + T_HIGH]:
            tr[o + T_HIGH] = tu
        if tf < tr[o + T_MIN_FREE]:
            tr[o + T_MIN_FREE] = tf
        return b

    # the one-range pool's alloc (no tiers=): exactly the pool before tier ranges; O(1)
    def _alloc1(self, region):
        b = self.head
        if b < 0 or self.region_used[region] >= self.quota[region]:
            self.count_failed()
            return E_NO_BLOCK
        self.head = self.next[b]
        self._take(b, region)
        return b

    # the bookkeeping of a block b just unlinked from its free list and given to region
    # (both alloc paths); allocation-free
    def _take(self, b, region):
        self.next[b] = _TAKEN
        self.ref[b] = 1
        self.owner[b] = region
        self.region_used[region] += 1
        v = self.allocs + 1
        if v >= CARRY_N:
            self.allocs_g += 1
            v = 0
        self.allocs = v
        used = self.blocks_used + 1
        self.blocks_used = used
        self.blocks_free -= 1
        if used > self.high_water:
            self.high_water = used
        if self.blocks_free < self.min_free:
            self.min_free = self.blocks_free

    # tier range of block b (0 .. n_tiers - 1), or E_RANGE for no such block; O(n_tiers)
    def tier_of(self, b):
        if b.__class__ is not int or b < 0 or b >= self.n_blocks:
            return E_RANGE
        tr = self.tier
        if tr is None:
            return 0
        o = 0
        while b >= tr[o + T_END]:
            o += TF
        return o // TF

    # blocks of range tier t free now, or E_RANGE; O(1)
    def tier_free(self, t):
        if t.__class__ is not int or t < 0 or t >= self.n_tiers:
            return E_RANGE
        return self.blocks_free if self.tier is None else self.tier[t * TF + T_FREE]

    # blocks of range `tier` region could take now (min of the range's free blocks and the
    # quota left); 0 for no such region or tier; E_RANGE for an argument that is not an int;
    # O(1), no allocation
    def available_in(self, region, tier):
        if region.__class__ is not int or tier.__class__ is not int:
            return E_RANGE
        if region < 0 or region >= self.n_regions or tier < 0 or tier >= self.n_tiers:
            return 0
        q = self.quota[region] - self.region_used[region]
        if q <= 0:
            return 0  # over its quota (set_quota lowered it, exchange moved blocks in): none, not a status
        f = self.blocks_free if self.tier is None else self.tier[tier * TF + T_FREE]
        return q if q < f else f

    # hand allocated block b (one reference) to region (its quota is charged, the old
    # owner's freed): a block moved between tiers keeps its sequence's quota. OK, E_RANGE (no
    # such block or region), E_STATE (free or shared block), E_NO_BLOCK (region's quota full);
    # O(1), no allocation
    def transfer(self, b, region):
        if b.__class__ is not int or b < 0 or b >= self.n_blocks or region.__class__ is not int \
                or region < 0 or region >= self.n_regions:
            return E_RANGE
        if self.ref[b] != 1:
            return E_STATE
        old = self.owner[b]
        if old == region:
            return OK
        if self.region_used[region] >= self.quota[region]:
            return E_NO_BLOCK
        self.region_used[old] -= 1
        self.region_used[region] += 1
        self.owner[b] = region
        return OK

    # swap the regions charged for allocated blocks a and b (one reference each): a block that
    # replaces another (a copy in another tier range) takes over its charge, whatever the
    # quotas are now (no region's count changes: set_quota may have lowered one below what
    # it holds). OK, E_RANGE (no such block), E_STATE (a free or shared block); O(1), no
    # allocation
    def exchange(self, a, b):
        if a.__class__ is not int or a < 0 or a >= self.n_blocks or b.__class__ is not int or b < 0 \
                or b >= self.n_blocks:
            return E_RANGE
        if self.ref[a] != 1 or self.ref[b] != 1:
            return E_STATE
        o = self.owner[a]
        self.owner[a] = self.owner[b]
        self.owner[b] = o
        return OK

    # a refused allocation: failed + 1 with its carry (alloc, and callers that refuse
    # before asking, as KVCache.open); O(1), no allocation
    def count_failed(self):
        v = self.failed + 1
        if v >= CARRY_N:
            self.failed_g += 1
            v = 0
        self.failed = v

    # blocks region could take now: the smaller of the free blocks and what is left of
    # its quota (0 for a region never added; E_RANGE for a region that is not an int); O(1),
    # no allocation
    def available(self, region):
        if region.__class__ is not int:
            return E_RANGE
        if region < 0 or region >= self.n_regions:
            return 0
        q = self.quota[region] - self.region_used[region]
        if q <= 0:
            return 0  # over its quota (set_quota lowered it, exchange moved blocks in): none, not a status
        f = self.blocks_free
        return q if q < f else f

    # one more reference to an allocated block (prefix sharing): OK, E_RANGE (no such
    # block), E_STATE (block is free), E_FULL (32,767 references); O(1), no allocation
    def share(self, b):
        if b.__class__ is not int or b < 0 or b >= self.n_blocks:
            return E_RANGE
        r = self.ref[b]
        if r <= 0:
            return E_STATE
        if r >= _MAX_REF:
            return E_FULL
        self.ref[b] = r + 1
        return OK

    # drop one reference; the last one returns the block to the free list and its
    # region's quota. OK, E_RANGE (no such block), E_STATE (block is free: a double
    # free); O(1) (O(block) with clear_on_free), no allocation
    def unref(self, b):
        if b.__class__ is not int or b < 0 or b >= self.n_blocks:
            return E_RANGE
        r = self.ref[b] - 1
        if r < 0:
            return E_STATE
        self.ref[b] = r
        if r:
            return OK
        self.region_used[self.owner[b]] -= 1
        self.owner[b] = _NONE
        tr = self.tier
        if tr is None:
            self.next[b] = self.head
            self.head = b
        else:
            o = 0
            while b >= tr[o + T_END]:
                o += TF
            self.next[b] = tr[o + T_HEAD]
            tr[o + T_HEAD] = b
            if o == 0:
                self.head = b
            tr[o + T_USED] -= 1
            tr[o + T_FREE] += 1
        v = self.frees + 1
        if v >= CARRY_N:
            self.frees_g += 1
            v = 0
        self.frees = v
        self.blocks_used -= 1
        self.blocks_free += 1
        if self.clear_on_free:
            zero32(self.arena, b * self.block_words, self.block_words)
        return OK

    # unref block b on behalf of region (isolation: a region cannot free another's
    # block): OK, E_RANGE (no such block, or b belongs to another region), E_STATE
    # (block is free); O(1), no allocation
    def free(self, region, b):
        if b.__class__ is not int or b < 0 or b >= self.n_blocks or region.__class__ is not int:
            return E_RANGE
        if self.ref[b] <= 0:
            return E_STATE
        if self.owner[b] != region:
            return E_RANGE
        return self.unref(b)

    # counters as a dict (allocates: reporting path only)
    def stats(self):
        return {
            "block_bytes": self.block_bytes,
            "blocks": self.n_blocks,
            "blocks_free": self.blocks_free,
            "blocks_used": self.blocks_used,
            "high_water": self.high_water,
            "min_free": self.min_free,
            "allocs": self.allocs_g * CARRY_N + self.allocs,
            "frees": self.frees_g * CARRY_N + self.frees,
            "failed": self.failed_g * CARRY_N + self.failed,
        }


    # per-tier counters as a dict keyed by range name (allocates: reporting path only)
    def tier_stats(self):
        out = {}
        tr = self.tier
        if tr is None:
            return {"all": {"first": 0, "blocks": self.n_blocks, "blocks_free": self.blocks_free,
                            "blocks_used": self.blocks_used, "high_water": self.high_water,
                            "min_free": self.min_free, "failed": 0}}
        for t in range(self.n_tiers):
            o = t * TF
            out[self.tier_names[t]] = {
                "first": tr[o + T_LO],
                "blocks": tr[o + T_END] - tr[o + T_LO],
                "blocks_free": tr[o + T_FREE],
                "blocks_used": tr[o + T_USED],
                "high_water": tr[o + T_HIGH],
                "min_free": tr[o + T_MIN_FREE],
                "failed": tr[o + T_FAILED],
            }
        return out


# the tier ranges' block counts, checked (configuration: raises PoolError); (n_blocks,)
# without tiers
def _tier_counts(n_blocks, tiers, names):
    if tiers is None:
        if names is not None:
            raise PoolError("tier_names needs tiers=")
        return (n_blocks,)
    try:
        counts = tuple(tiers)
    except TypeError:
        raise PoolError("tiers must be a tuple of block counts, got %r" % (tiers,)) from None
    if not 1 <= len(counts) <= MAX_TIERS:
        raise PoolError("tiers must name 1..%d ranges, got %d" % (MAX_TIERS, len(counts)))
    for c in counts:
        if c.__class__ is not int or c < 0:
            raise PoolError("tier block counts must be ints >= 0, got %r" % (counts,))
    if sum(counts) != n_blocks:
        raise PoolError("tier block counts %r add up to %d, the pool has %d blocks" % (counts, sum(counts), n_blocks))
    if names is not None:
        names = tuple(names)
        if len(names) != len(counts):
            raise PoolError("tier_names has %d names for %d tiers" % (len(names), len(counts)))
        for nm in names:
            if nm.__class__ is not str or not nm:
                raise PoolError("tier names must be non-empty strings, got %r" % (names,))
    return counts


# array of n elements of typecode, all v, built by doubling (array(tc, bytes) means
# raw bytes on MicroPython but one element per byte on CPython); boot time only
def filled(typecode, n, v):
    a = array(typecode, [v])
    while len(a) < n:
        a.extend(a[:n - len(a)])
    return a if n else array(typecode)


@micropython.viper
def get32(buf, word: int) -> int:
    # buf's uint32 word at index word (values kept < 2**30: a small int); O(1)
    p = ptr32(buf)
    return int(p[word])


@micropython.viper
def set32(buf, word: int, v: int):
    # buf's uint32 word at index word = v; O(1), no allocation
    p = ptr32(buf)
    p[word] = v
