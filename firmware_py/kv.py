# KV cache over pool blocks: per sequence a block table of pool blocks, the new
# token's K and V written in place, O(1) lookup of any cached position, and a policy
# per sequence (full / window / sinks / h2o) that decides what happens at the budget.
# Nothing here allocates after boot: sequences, block tables and the h2o position
# maps are arrays sized in __init__; rows move with viper word copies.
#
# Every hot-path call (reserve, write, append, read, locate, scores, fork, close, the
# counters) validates its handle and arguments in O(1) and returns an int: >= 0 on
# success, a negative code from firmware_py/status.py on refusal, with nothing changed
# (docs/memory.md gives the exact rules, docs/conventions.md the table). A handle packs
# the sequence slot with a generation bumped on every close, so an old handle is E_STALE.
#
# Layout (docs/memory.md has the picture). T = tokens_per_block, L = n_layers,
# H = n_kv_heads, D = head_dim, kv_dim = H * D:
#   block (block_bytes = T * token_bytes), one tier: the pool's arena
#     header  [T][2] uint32: (position + 1, 0 = empty), accumulated attention score
#     rows    [L][T] of layer_row bytes, row of (layer l, slot r) at
#             T * 8 + (l * T + r) * layer_row
#   layer_row (a multiple of 4 bytes):
#     K data  kv_dim elements (fp32 4 B, fp16 2 B, int8 1 B, int4 two per byte)
#     V data  kv_dim elements
#     pad to 4
#     K scales [H][groups] fp32 bit patterns (int8: 1 group per head; int4: D / group)
#     V scales [H][groups]
# A token row handed to append() is [L] layer_rows back to back (row_bytes).
# Keys are stored after RoPE at their absolute position (see docs/memory.md: why).
from array import array

from firmware_py.compat import const, micropython, ptr16, ptr32
from firmware_py.kvlayout import (  # noqa: F401 - re-exported: kv.Layout, kv.SINKS, kv.blocks_for ...
    BOOT_BYTES, DTYPES, GROUP, H2O_RECENT_PCT, HDR_BYTES, KV_FIXED_BYTES, POLICIES, SINKS, TOKENS_PER_BLOCK,
    WATERMARK_PCT, KVError, Layout, blocks_for, blocks_for_board, boot_reserve, bytes_per_block, heap_for,
    min_budget, policy_params)
from firmware_py.pool import copy32, filled, get32, set32, zero32
from firmware_py.status import E_EMPTY, E_FULL, E_NO_BLOCK, E_NO_SLOT, E_RANGE, E_STALE, E_STATE, OK

_SCORE_MAX = const(0x1FFFFFFF)  # scores saturate here (stay a small int on the ESP32)
_NONE = const(-1)  # table entry / reservation / map entry: nothing
_HANDLE_LIMIT = const(0x40000000)  # handles stay below 2**30: small ints on the ESP32
_MAX_SEQS = const(0x7FFF)  # a block is shared by at most max_seqs tables (array('h') refcounts)
_FULL = const(0)  # stop at the budget with E_FULL (policy numbers: POLICIES.index(name))
_WINDOW = const(1)  # ring over the most recent `budget` tokens
_SINKS = const(2)  # first `sinks` tokens + a ring of the most recent ones
_H2O = const(3)  # sinks + `recent` ring + heavy hitters by accumulated score

# reserve()/append() success: >= 0, a sum of these flags (refusals: status.E_*)
ST_OK = OK
ST_WATERMARK = const(1)  # this token crossed the sequence's watermark (once)
ST_EVICTED = const(2)  # an older token was evicted to make room
ST_FULL = E_FULL  # the old names of the refusals, kept for callers
ST_NO_BLOCK = E_NO_BLOCK


@micropython.viper
def _copy_rows(dst, dword: int, step: int, src, sword: int, w: int, rows: int):
    # rows runs of w words: dst words [dword + k * step, + w) = src words [sword + k * w, + w);
    # O(rows * w), no allocation
    d = ptr32(dst)
    s = ptr32(src)
    k = 0
    while k < rows:
        i = 0
        while i < w:
            d[dword + i] = s[sword + i]
            i += 1
        dword += step
        sword += w
        k += 1


@micropython.viper
def _zero_rows(buf, word: int, step: int, w: int, rows: int):
    # rows runs of w zero words at buf words word + k * step; O(rows * w), no allocation
    p = ptr32(buf)
    k = 0
    while k < rows:
        i = 0
        while i < w:
            p[word + i] = 0
            i += 1
        word += step
        k += 1


@micropython.viper
def _h2o_min(arena, table, tbase: int, t: int, bw: int, cap: int, lo: int, hi: int) -> int:
    # the slot (of the cap slots whose blocks are table[tbase ...], T = t per block of
    # bw words) holding a position p with lo <= p < hi and the lowest score, ties to the
    # oldest p; -1 when none. O(cap), no allocation
    p = ptr32(arena)
    tb = ptr16(table)
    best = -1
    best_sc = 0x20000000  # above any saturated score
    best_p1 = 0x3FFFFFFF  # above any position + 1
    slot = 0
    k = 0
    while slot < cap:
        w = int(tb[tbase + k]) * bw  # ring blocks are all allocated (at open)
        r = 0
        while r < t and slot < cap:
            pos1 = int(p[w + 2 * r])  # position + 1; 0 = empty slot
            if pos1 > lo and pos1 <= hi:
                sc = int(p[w + 2 * r + 1])
                if sc < best_sc or (sc == best_sc and pos1 < best_p1):
                    best_sc = sc
                    best_p1 = pos1
                    best = slot
            r += 1
            slot += 1
        k += 1
    return best


class KVCache:
    # sequences over one shared Pool; every per-sequence array is made here, at boot
    def __init__(self, pool, layout, max_seqs=4, max_blocks_per_seq=0, h2o=False):
        if pool.block_bytes != layout.block_bytes:
            raise KVError("pool blocks are %d B, layout needs %d B" % (pool.block_bytes, layout.block_bytes))
        if max_seqs < 1 or max_seqs > _MAX_SEQS:
            raise KVError("max_seqs must be 1..%d, got %d" % (_MAX_SEQS, max_seqs))
        mb = max_blocks_per_seq or pool.n_blocks
        if mb < 1 or mb > pool.n_blocks:
            raise KVError("max_blocks_per_seq must be 1..%d, got %d" % (pool.n_blocks, mb))
        t = layout.tokens_per_block
        self.pool = pool  # the Pool every block comes from
        self.arena = pool.arena  # pool.arena, kept here to save a lookup per row
        self.ref = pool.ref  # pool.ref (references per block), for the copy-on-write test
        self.layout = layout  # Layout of every block
        self.t = t  # tokens per block
        self.block_bytes = layout.block_bytes  # bytes per block
        self.block_words = layout.block_bytes // 4  # uint32 words per block
        self.layer_row = layout.layer_row  # bytes per (layer, token) row
        self.row_words = layout.layer_row // 4  # uint32 words per (layer, token) row
        self.row_bytes = layout.row_bytes  # bytes of a whole token row (append)
        self.n_layers = layout.n_layers  # rows per token
        self.max_seqs = max_seqs  # sequence slots
        self.max_blocks = mb  # block-table entries per sequence
        self.max_slots = mb * t  # most cached tokens one sequence can hold
        self.gen_limit = _HANDLE_LIMIT // max_seqs  # generations wrap here
        self.handle_limit = self.gen_limit * max_seqs  # every handle is 0 .. handle_limit - 1
        self.table = filled("h", max_seqs * mb, _NONE)  # [seq][block] pool block or -1
        self.s_handle = filled("i", max_seqs, _NONE)  # the open handle of each slot, -1 when closed
        self.s_gen = filled("i", max_seqs, 0)  # generation of the slot's next handle (+1 per close)
        self.s_policy = filled("b", max_seqs, 0)  # _FULL / _WINDOW / _SINKS / _H2O
        self.s_region = filled("b", max_seqs, 0)  # pool region charged for new blocks
        self.s_cap = filled("i", max_seqs, 0)  # budget: slots the sequence may fill
        self.s_sinks = filled("i", max_seqs, 0)  # sink slots (sinks, h2o)
        self.s_recent = filled("i", max_seqs, 0)  # protected recent tokens (h2o)
        self.s_n = filled("i", max_seqs, 0)  # positions appended so far (next position)
        self.s_wm = filled("i", max_seqs, 0)  # filled-slot count that fires the watermark
        self.s_wm_fired = filled("b", max_seqs, 0)  # 1 once the watermark has fired
        self.s_slot = filled("i", max_seqs, _NONE)  # slot reserved for write(), -1 when none
        self.s_evictions = filled("i", max_seqs, 0)  # tokens evicted so far
        # h2o: [seq][M] slot of position p at p % M (M = 2 * max_slots > any budget, so
        # two cached positions collide only when M apart; the older one is then evicted).
        # array('i'): slots above 32,767 are valid
        self.map_size = 2 * self.max_slots if h2o else 0  # M
        self.pos_map = filled("i", max_seqs * self.map_size, _NONE) if h2o else array("i")  # see above
        self.events = 0  # watermark events emitted so far (all sequences)
        self.on_watermark = None  # callable(handle) run when a sequence crosses its watermark, or None
        self.status = OK  # result of the last reserve()/append(): flags (>= 0) or its refusal

    # open a sequence in region with a policy and a budget of `budget` cached tokens
    # (0: max_slots); ring policies reserve all their blocks now so decode never waits
    # for memory. Returns the handle (>= 0), or E_NO_SLOT / E_NO_BLOCK with nothing
    # taken; KVError for bad parameters. O(budget / T)
    def open(self, region, policy="full", budget=0, sinks=SINKS, recent=0, watermark_pct=WATERMARK_PCT):
        cap = budget or self.max_slots
        if cap < 1 or cap > self.max_slots:
            raise KVError("budget must be 1..%d tokens, got %d" % (self.max_slots, cap))
        pol, sinks, recent = policy_params(policy, cap, sinks, recent)
        if pol == _H2O and not self.map_size:
            raise KVError("h2o needs KVCache(..., h2o=True) at boot")
        if not 0 < watermark_pct <= 100:
            raise KVError("watermark_pct must be 1..100, got %d" % watermark_pct)
        if region < 0 or region >= self.pool.n_regions:
            raise KVError("no pool region %d" % region)
        i = self._free_seq()
        if i < 0:
            return E_NO_SLOT
        base = i * self.max_blocks
        if pol != _FULL:
            t = self.t
            for k in range((cap + t - 1) // t):
                b = self.pool.alloc(region)
                if b < 0:
                    for j in range(k):
                        self.pool.unref(self.table[base + j])
                        self.table[base + j] = _NONE
                    return E_NO_BLOCK
                zero32(self.arena, b * self.block_words, 2 * t)  # every slot empty
                self.table[base + k] = b
        self.s_policy[i] = pol
        self.s_region[i] = region
        self.s_cap[i] = cap
        self.s_sinks[i] = sinks
        self.s_recent[i] = recent
        self.s_n[i] = 0
        self.s_wm[i] = (cap * watermark_pct + 99) // 100
        self.s_wm_fired[i] = 0
        self.s_slot[i] = _NONE
        self.s_evictions[i] = 0
        h = self.s_gen[i] * self.max_seqs + i
        self.s_handle[i] = h
        return h

    # the lowest closed sequence slot, or -1 when all are open; O(max_seqs)
    def _free_seq(self):
        for i in range(self.max_seqs):
            if self.s_handle[i] < 0:
                return i
        return _NONE

    # the slot index of handle h, or E_STALE when h is not an open handle; O(1)
    def _idx(self, h):
        if h < 0 or h >= self.handle_limit:  # before %: a big int would allocate
            return E_STALE
        i = h % self.max_seqs
        if self.s_handle[i] != h:
            return E_STALE
        return i

    # a new sequence sharing every block of h (reference counted, copied on the first
    # write of either), with h's policy, budget, positions and scores but no
    # reservation. The new handle, or E_STALE / E_NO_SLOT; O(blocks + M), no allocation
    def fork(self, h):
        src = self._idx(h)
        if src < 0:
            return src
        i = self._free_seq()
        if i < 0:
            return E_NO_SLOT
        mb = self.max_blocks
        table = self.table
        for k in range(mb):
            b = table[src * mb + k]
            if b >= 0:
                self.pool.share(b)  # refs <= max_seqs <= 32,767: cannot refuse
            table[i * mb + k] = b
        # one array at a time: a tuple of the arrays would allocate
        self.s_policy[i] = self.s_policy[src]
        self.s_region[i] = self.s_region[src]
        self.s_cap[i] = self.s_cap[src]
        self.s_sinks[i] = self.s_sinks[src]
        self.s_recent[i] = self.s_recent[src]
        self.s_n[i] = self.s_n[src]
        self.s_wm[i] = self.s_wm[src]
        self.s_wm_fired[i] = self.s_wm_fired[src]
        self.s_evictions[i] = self.s_evictions[src]
        self.s_slot[i] = _NONE
        m = self.map_size
        pm = self.pos_map
        for k in range(m):
            pm[i * m + k] = pm[src * m + k]
        nh = self.s_gen[i] * self.max_seqs + i
        self.s_handle[i] = nh
        return nh

    # close h: drop its references to blocks, end its reservation, bump the slot's
    # generation (h and every copy of it are E_STALE from now). OK or E_STALE;
    # O(blocks + M), no allocation
    def close(self, h):
        i = self._idx(h)
        if i < 0:
            return i
        mb = self.max_blocks
        for k in range(i * mb, i * mb + mb):
            b = self.table[k]
            if b >= 0:
                self.pool.unref(b)
                self.table[k] = _NONE
        m = self.map_size
        for k in range(i * m, i * m + m):
            self.pos_map[k] = _NONE
        self.s_slot[i] = _NONE
        self.s_handle[i] = _NONE
        g = self.s_gen[i] + 1
        self.s_gen[i] = g if g < self.gen_limit else 0
        return OK

    # reserve the slot for the next position of h, evicting per its policy, and zero its
    # rows (every layer reads as zeros until write()). Returns the slot (>= 0; flags in
    # self.status) or E_STALE / E_FULL / E_NO_BLOCK with nothing changed but the earlier
    # reservation ended. O(L * row) (+ O(budget) h2o eviction scan); no allocation
    def reserve(self, h):
        if h < 0 or h >= self.handle_limit:  # before %: a big int would allocate
            return E_STALE
        i = h % self.max_seqs
        if self.s_handle[i] != h:
            return E_STALE
        slot = self._take(i)
        if slot >= 0:
            t = self.t
            w = self.row_words
            b = self.table[i * self.max_blocks + slot // t]
            _zero_rows(self.arena, b * self.block_words + 2 * t + (slot % t) * w, t * w, w, self.n_layers)
        return slot

    # reserve + write every layer from one token row (row_bytes of src from byte 0);
    # returns the flags (>= 0) or E_STALE / E_RANGE (src too short) / E_FULL /
    # E_NO_BLOCK with nothing changed but the earlier reservation ended. The appended
    # token stays reserved for write(). O(row), no allocation
    def append(self, h, src):
        if h < 0 or h >= self.handle_limit:  # before %: a big int would allocate
            return E_STALE
        i = h % self.max_seqs
        if self.s_handle[i] != h:
            return E_STALE
        if len(src) < self.row_bytes:
            self.s_slot[i] = _NONE
            self.status = E_RANGE
            return E_RANGE
        slot = self._take(i)
        if slot < 0:
            return slot
        t = self.t
        w = self.row_words
        b = self.table[i * self.max_blocks + slot // t]
        _copy_rows(self.arena, b * self.block_words + 2 * t + (slot % t) * w, t * w, src, 0, w, self.n_layers)
        return self.status

    # the common half of reserve/append for slot index i: end the reservation, pick the
    # slot by policy, make its block private (new, or a copy of a shared one), write its
    # header, count the position. The slot, or E_FULL / E_NO_BLOCK; O(1) + h2o scan
    def _take(self, i):
        self.s_slot[i] = _NONE  # every reserve/append ends the earlier reservation
        n = self.s_n[i]
        cap = self.s_cap[i]
        pol = self.s_policy[i]
        st = OK
        if n < cap:
            slot = n
        elif pol == _FULL:
            self.status = E_FULL
            return E_FULL
        else:
            st = ST_EVICTED
            if pol == _WINDOW:
                slot = n % cap
            elif pol == _SINKS:
                s = self.s_sinks[i]
                slot = s + (n - s) % (cap - s)
            else:
                slot = self._h2o_victim(i, n)
        t = self.t
        ti = i * self.max_blocks + slot // t
        b = self.table[ti]
        bw = self.block_words
        if b < 0:
            b = self.pool.alloc(self.s_region[i])
            if b < 0:
                self.status = E_NO_BLOCK
                return E_NO_BLOCK
            zero32(self.arena, b * bw, 2 * t)  # headers of a fresh block: every slot empty
            self.table[ti] = b
        elif self.ref[b] > 1:
            b = self._own(i, ti, b)
            if b < 0:
                self.status = E_NO_BLOCK
                return E_NO_BLOCK
        hw = b * bw + (slot % t) * 2  # header word of slot
        if pol == _H2O:
            m = self.map_size
            if st:
                old = get32(self.arena, hw) - 1
                j = i * m + old % m
                if old >= self.s_sinks[i] and self.pos_map[j] == slot:
                    self.pos_map[j] = _NONE
            if n >= self.s_sinks[i]:
                self.pos_map[i * m + n % m] = slot
        if st:
            self.s_evictions[i] += 1
        set32(self.arena, hw, n + 1)
        set32(self.arena, hw + 1, 0)
        self.s_n[i] = n + 1
        self.s_slot[i] = slot
        if not self.s_wm_fired[i] and (n + 1 if n < cap else cap) >= self.s_wm[i]:
            self.s_wm_fired[i] = 1
            self.events += 1
            st |= ST_WATERMARK
            if self.on_watermark is not None:
                self.on_watermark(self.s_handle[i])
        self.status = st
        return slot

    # write one layer's row (layer_row bytes of src from byte src_off, a multiple of 4)
    # into the token reserved last for h, copying a shared block first. OK, or E_STALE,
    # E_RANGE (layer, src_off or len(src)), E_STATE (nothing reserved), E_NO_BLOCK (the
    # copy found no block), with nothing changed; O(layer_row), no allocation
    def write(self, h, layer, src, src_off):
        if h < 0 or h >= self.handle_limit:  # before %: a big int would allocate
            return E_STALE
        i = h % self.max_seqs
        if self.s_handle[i] != h:
            return E_STALE
        if layer < 0 or layer >= self.n_layers or src_off < 0 or src_off & 3 or src_off + self.layer_row > len(src):
            return E_RANGE
        slot = self.s_slot[i]
        if slot < 0:
            return E_STATE
        t = self.t
        ti = i * self.max_blocks + slot // t
        b = self.table[ti]
        if self.ref[b] > 1:
            b = self._own(i, ti, b)
            if b < 0:
                return E_NO_BLOCK
        w = self.row_words
        copy32(self.arena, b * self.block_words + 2 * t + (layer * t + slot % t) * w, src, src_off >> 2, w)
        return OK

    # copy the layer row of position pos of h into dst at byte dst_off (a multiple of 4).
    # OK, or E_STALE, E_RANGE (layer, dst_off, len(dst), pos outside 0 .. length - 1),
    # E_EMPTY (pos was evicted); O(layer_row), no allocation
    def read(self, h, pos, layer, dst, dst_off):
        i = self._idx(h)
        if i < 0:
            return i
        if layer < 0 or layer >= self.n_layers or dst_off < 0 or dst_off & 3 or dst_off + self.layer_row > len(dst):
            return E_RANGE
        slot = self._locate(i, pos)
        if slot < 0:
            return slot
        t = self.t
        b = self.table[i * self.max_blocks + slot // t]
        w = self.row_words
        copy32(dst, dst_off >> 2, self.arena, b * self.block_words + 2 * t + (layer * t + slot % t) * w, w)
        return OK

    # slot holding position pos of h, or E_STALE, E_RANGE (pos outside 0 .. length - 1),
    # E_EMPTY (evicted); O(1)
    def locate(self, h, pos):
        i = self._idx(h)
        if i < 0:
            return i
        return self._locate(i, pos)

    # locate() for slot index i
    def _locate(self, i, pos):
        n = self.s_n[i]
        if pos < 0 or pos >= n:
            return E_RANGE
        cap = self.s_cap[i]
        pol = self.s_policy[i]
        if pol == _FULL:
            return pos
        if pol == _WINDOW:
            return pos % cap if pos >= n - cap else E_EMPTY
        s = self.s_sinks[i]
        if pos < s:
            return pos
        if pol == _SINKS:
            return s + (pos - s) % (cap - s) if pos >= n - (cap - s) else E_EMPTY
        slot = self.pos_map[i * self.map_size + pos % self.map_size]
        if slot < 0:
            return E_EMPTY
        t = self.t
        b = self.table[i * self.max_blocks + slot // t]
        if get32(self.arena, b * self.block_words + (slot % t) * 2) != pos + 1:
            return E_EMPTY
        return slot

    # header word of slot of slot index i, E_RANGE (slot outside 0 .. budget - 1) or
    # E_EMPTY (the slot holds no position); O(1)
    def _hdr(self, i, slot):
        if slot < 0 or slot >= self.s_cap[i]:
            return E_RANGE
        t = self.t
        b = self.table[i * self.max_blocks + slot // t]
        if b < 0:
            return E_EMPTY
        hw = b * self.block_words + (slot % t) * 2
        if get32(self.arena, hw) == 0:
            return E_EMPTY
        return hw

    # arena byte offset of the (layer, slot) row of h, for attention kernels to read
    # (the block may be shared: never write through it). E_STALE, E_RANGE, E_EMPTY; O(1)
    def row_offset(self, h, slot, layer):
        i = self._idx(h)
        if i < 0:
            return i
        if layer < 0 or layer >= self.n_layers:
            return E_RANGE
        hw = self._hdr(i, slot)
        if hw < 0:
            return hw
        t = self.t
        b = self.table[i * self.max_blocks + slot // t]
        return b * self.block_bytes + t * HDR_BYTES + (layer * t + slot % t) * self.layer_row

    # position cached in slot of h, or E_STALE, E_RANGE, E_EMPTY; O(1)
    def slot_pos(self, h, slot):
        i = self._idx(h)
        if i < 0:
            return i
        hw = self._hdr(i, slot)
        if hw < 0:
            return hw
        return get32(self.arena, hw) - 1

    # accumulated score of slot of h (>= 0), or E_STALE, E_RANGE, E_EMPTY; O(1)
    def score(self, h, slot):
        i = self._idx(h)
        if i < 0:
            return i
        hw = self._hdr(i, slot)
        if hw < 0:
            return hw
        return get32(self.arena, hw + 1)

    # add an attention score (fixed point, 0 .. 2**29 - 1) to slot of h, saturating at
    # 2**29 - 1, copying a shared block first. OK, or E_STALE, E_RANGE (slot, score),
    # E_EMPTY, E_NO_BLOCK (the copy found no block), with nothing changed; O(1)
    def add_score(self, h, slot, score):
        i = self._idx(h)
        if i < 0:
            return i
        if score < 0 or score > _SCORE_MAX:
            return E_RANGE
        hw = self._hdr(i, slot)
        if hw < 0:
            return hw
        t = self.t
        ti = i * self.max_blocks + slot // t
        b = self.table[ti]
        if self.ref[b] > 1:
            b = self._own(i, ti, b)
            if b < 0:
                return E_NO_BLOCK
            hw = b * self.block_words + (slot % t) * 2
        v = get32(self.arena, hw + 1) + score
        set32(self.arena, hw + 1, v if v < _SCORE_MAX else _SCORE_MAX)
        return OK

    # copy on write: give slot index i a private copy of shared block b at table index
    # ti; the new block, or E_NO_BLOCK when i's region has none; O(block), no allocation
    def _own(self, i, ti, b):
        pool = self.pool
        nb = pool.alloc(self.s_region[i])
        if nb < 0:
            return E_NO_BLOCK
        w = self.block_words
        copy32(self.arena, nb * w, self.arena, b * w, w)
        pool.unref(b)
        self.table[ti] = nb
        return nb

    # positions appended to h so far (the next token's position), or E_STALE; O(1)
    def length(self, h):
        i = self._idx(h)
        if i < 0:
            return i
        return self.s_n[i]

    # tokens of h in the cache now (min(length, budget)), or E_STALE; O(1)
    def cached(self, h):
        i = self._idx(h)
        if i < 0:
            return i
        n = self.s_n[i]
        cap = self.s_cap[i]
        return n if n < cap else cap

    # tokens of h evicted so far, or E_STALE; O(1)
    def evictions(self, h):
        i = self._idx(h)
        if i < 0:
            return i
        return self.s_evictions[i]

    # pool blocks in h's block table (shared ones included), or E_STALE; O(blocks)
    def blocks_of(self, h):
        i = self._idx(h)
        if i < 0:
            return i
        k = 0
        mb = self.max_blocks
        for j in range(i * mb, i * mb + mb):
            if self.table[j] >= 0:
                k += 1
        return k

    # h2o: the slot to reuse at position n of slot index i: position n - M if still
    # cached (its map entry), else the lowest-score slot that is neither a sink nor
    # among the `recent` newest, ties to the oldest position; O(budget)
    def _h2o_victim(self, i, n):
        m = self.map_size
        s = self.pos_map[i * m + n % m]
        if s >= 0:
            return s
        best = _h2o_min(self.arena, self.table, i * self.max_blocks, self.t, self.block_words, self.s_cap[i],
                        self.s_sinks[i], n - self.s_recent[i])
        assert best >= 0, "h2o: no evictable slot"
        return best
