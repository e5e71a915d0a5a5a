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
# the sequence slot with a generation bumped on every close and the cache's tag (its
# number on the pool), so an old handle, or one of another cache, is E_STALE. A handle
# or integer argument that is not an int (a float, a bool) is refused the same way.
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
#
# Speed: append and write are viper methods (reserve is append with the private _ZEROS
# source): one call reads the cache's shape and the sequence's state from one
# array('i') (meta) through ptr32, checks the handle and the arguments, and writes the
# header and the rows. What is unusual for a token (a block to take or copy, h2o, the
# watermark firing) goes to plain Python (_put_slow, _take, _own) with nothing changed
# yet. The handle and the integer arguments are compared as objects before int() (which
# truncates a big int). Every meta word viper reads is kept >= 0 (ptr32 loads are
# unsigned on 64-bit and on CPython): "none" is stored as 0, a value as value + 1.
from array import array

from firmware_py.compat import const, micropython, misaligned, ptr8, ptr16, ptr32
from firmware_py.kvlayout import (  # noqa: F401 - re-exported: kv.Layout, kv.SINKS, kv.blocks_for ...
    DTYPES, GROUP, H2O_RECENT_PCT, HDR_BYTES, KV_FIXED_BYTES, POLICIES, SINKS, TOKENS_PER_BLOCK,
    WATERMARK_PCT, KVError, Layout, blocks_for, bytes_per_block, fixed_bytes, heap_for,
    min_budget, policy_params)
from firmware_py import kvh2o, kvkivi
from firmware_py.compat import new_array
from firmware_py.kvh2o import h2o_victim
from firmware_py.pool import copy32, copy_rows, filled, get32, set32, zero32, zero_rows
from firmware_py.status import E_ALIGN, E_EMPTY, E_FULL, E_NO_BLOCK, E_NO_SLOT, E_RANGE, E_STALE, E_STATE, INT_MAX, OK

_SCORE_MAX = const(0x1FFFFFFF)  # scores saturate here, 2**29 - 1 (stay a small int on the ESP32)
_NONE = const(-1)  # table entry / map entry: nothing
_HMAX = const(0x3FFFFFFF)  # status.INT_MAX, the largest small int on the ESP32: handles + 1 stay at or below it
_POS_LIMIT = const(0x3FFFFFFE)  # positions 0 .. _POS_LIMIT - 1: at n == _POS_LIMIT append is E_FULL (n + 1 stays small)
_TAGS = const(4)  # caches one pool serves, each with its own handles (the tag is the low part of the generation)
_MAX_SEQS = const(0x7FFF)  # a block is shared by at most max_seqs tables (array('h') refcounts)
_NO_BLOCK16 = const(0xFFFF)  # a table entry of -1 as ptr16 reads it
# policy numbers as local consts (viper inlines only this module's); their home is
# kvlayout.POLICIES: the number is POLICIES.index(name), checked below
_FULL = const(0)  # stop at the budget with E_FULL
_WINDOW = const(1)  # ring over the most recent `budget` tokens
_SINKS = const(2)  # first `sinks` tokens + a ring of the most recent ones
_H2O = const(3)  # sinks + `recent` ring + heavy hitters by accumulated score
if (_HMAX, POLICIES[_FULL], POLICIES[_WINDOW], POLICIES[_SINKS], POLICIES[_H2O]) != (INT_MAX, "full", "window", "sinks", "h2o"):
    raise ImportError("kv: policy numbers or INT_MAX differ from kvlayout.POLICIES / status.py")

# the status codes again as local constants: viper inlines only this module's consts
_E_FULL = const(-1)
_E_NO_BLOCK = const(-2)
_E_STALE = const(-3)
_E_RANGE = const(-5)
_E_STATE = const(-6)
_E_ALIGN = const(-8)
if (_E_FULL, _E_NO_BLOCK, _E_STALE, _E_RANGE, _E_STATE, _E_ALIGN) != (E_FULL, E_NO_BLOCK, E_STALE, E_RANGE, E_STATE,
                                                                    E_ALIGN):
    raise ImportError("kv: status codes differ from firmware_py/status.py")
_ZERO_OBJ = 0  # 0 and _HMAX as objects: viper compares an argument with these before int()
_HMAX_OBJ = _HMAX
_INT = int  # an argument's __class__ must be this (a float or bool is refused before int(), which would raise)
_ZEROS = bytearray(0)  # reserve() = append(h, _ZEROS): zero the rows instead of copying

# meta, array('i'): the cache's shape (words 0 .. _CFG - 1), then one row of _NF words per
# sequence slot i at _CFG + i * _NF. Written by Python at open/fork/close, by viper per token.
_C_ST = const(0)  # status of the last reserve/append + _ST_BIAS (kept >= 0, see above)
_C_T = const(1)  # T, tokens per block
_C_BW = const(2)  # uint32 words per block
_C_RW = const(3)  # uint32 words per (layer, token) row
_C_L = const(4)  # L, layers
_C_MB = const(5)  # block-table entries per sequence
_C_RB = const(6)  # bytes of a token row (append's src)
_C_LR = const(7)  # bytes of a layer row (write's src)
_C_MS = const(8)  # sequence slots
_C_KV = const(9)  # 1: int4 (KIVI) layout: append/reserve take _put_slow, write its own branch
_CFG = const(10)  # words of shape before the first sequence row
_F_H = const(0)  # open handle + 1; 0 = closed
_F_N = const(1)  # positions appended so far (the next position)
_F_CAP = const(2)  # budget: slots the sequence may fill
_F_POL = const(3)  # _FULL / _WINDOW / _SINKS / _H2O
_F_SLOT = const(4)  # slot reserved for write() + 1; 0 = none
_F_SINKS = const(5)  # sink slots (sinks, h2o)
_F_RECENT = const(6)  # protected recent tokens (h2o)
_F_REGION = const(7)  # pool region charged for new blocks
_F_WM = const(8)  # filled-slot count that fires the watermark
_F_WMF = const(9)  # 1 once the watermark has fired
_F_EV = const(10)  # tokens evicted so far
_F_GEN = const(11)  # generation of the slot's next handle (+1 per close)
_F_CUR = const(12)  # int4 (KIVI): table index + 1 of the block holding the residual; 0 = none
_NF = const(13)  # words per sequence row
_ST_BIAS = const(16)  # meta[_C_ST] = status + _ST_BIAS (status codes are >= -16)
# kvkivi's shape words (viper inlines only this module's consts)
_KC_KD = const(2)
_KC_RW = const(4)
_KC_SRW = const(5)
_KC_VW = const(7)
if (kvkivi.KC_KD, kvkivi.KC_RW, kvkivi.KC_SRW, kvkivi.KC_VW) != (_KC_KD, _KC_RW, _KC_SRW, _KC_VW):
    raise ImportError("kv: kvkivi's shape words differ")
if (kvh2o._F_SINKS, kvh2o._F_RECENT, kvh2o._F_CAP, kvh2o._CFG, kvh2o._NF) != (_F_SINKS, _F_RECENT, _F_CAP, _CFG, _NF):
    raise ImportError("kv: the meta layout differs from kvh2o.py's")

# a sequence row's words a snapshot keeps (firmware_py/snapshot.py), by position in the row:
# policy, positions appended, budget, sinks, recent, watermark, watermark fired, evictions,
# int4's current block + 1
SEQ_FIELDS = (_F_POL, _F_N, _F_CAP, _F_SINKS, _F_RECENT, _F_WM, _F_WMF, _F_EV, _F_CUR)


# reserve()/append() success: >= 0, a sum of these flags (refusals: status.E_*)
ST_WATERMARK = const(1)  # this token crossed the sequence's watermark (once)
ST_EVICTED = const(2)  # an older token was evicted to make room


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
        tag = pool.n_caches
        if tag >= _TAGS:
            raise KVError("a pool serves at most %d caches (each tags its handles), this would be cache %d" % (_TAGS, tag + 1))
        pool.n_caches = tag + 1
        self.tag = tag  # this cache's number on the pool: every generation of its handles is = tag mod _TAGS
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
        # a handle is (generation * max_seqs + slot) * _TAGS + tag: its low part is the cache's
        # tag, so handles of two caches on one pool never coincide whatever their max_seqs;
        # one slot's handles repeat after gen_limit closes. The slot's _F_GEN word holds its
        # next handle's base, generation * max_seqs * _TAGS + tag (the handle: + slot * _TAGS)
        self.gen_limit = _HMAX // (max_seqs * _TAGS)  # generations per slot before they wrap
        self.handle_limit = self.gen_limit * _TAGS * max_seqs  # every handle is 0 .. handle_limit - 1
        self.table = filled("h", max_seqs * mb, _NONE)  # [seq][block] pool block or -1
        # the shape, then per sequence slot the row of _F_* words (see _C_* / _F_* above)
        self.meta = filled("i", _CFG + max_seqs * _NF, 0)
        m = self.meta
        m[_C_ST] = OK + _ST_BIAS
        m[_C_T] = t
        m[_C_BW] = self.block_words
        m[_C_RW] = self.row_words
        m[_C_L] = layout.n_layers
        m[_C_MB] = mb
        m[_C_RB] = layout.row_bytes
        m[_C_LR] = layout.layer_row
        m[_C_MS] = max_seqs
        m[_C_KV] = 1 if layout.kivi else 0
        # int4 (KIVI): per sequence slot the fp32 K of its current block's tokens
        # ([seq][L][T][kv_dim] words), a flag per slot of that block (1: its K is in the
        # residual), and the fold's shape + scratch (firmware_py/kvkivi.py)
        self.kivi = layout.kivi  # True for the int4 (KIVI) layout
        self.kv_dim = layout.kv_dim  # channels per layer
        self.store_row = layout.store_row  # bytes per stored (layer, slot) row in a block
        self.rows_word = layout.rows_off // 4  # first stored row's word in a block
        nres = max_seqs * layout.n_layers * t * layout.kv_dim if layout.kivi else 0
        self.resid = new_array("i", nres)  # the residual (fp32 bit patterns; array('i'): one piece, word aligned)
        for k in range(nres):
            self.resid[k] = 0
        self.flags = bytearray(max_seqs * t if layout.kivi else 0)  # [seq][T] 1: slot r's K is residual
        self.kc = kvkivi.shape(layout, new_array) if layout.kivi else new_array("i", 0)  # kvkivi's shape words
        for i in range(max_seqs):
            m[_CFG + i * _NF + _F_GEN] = tag  # generation 0's base, tagged
        # h2o: [seq][M] slot of position p at p % M (M = 2 * max_slots > any budget, so
        # two cached positions collide only when M apart; the older one is then evicted).
        # array('i'): slots above 32,767 are valid
        self.map_size = 2 * self.max_slots if h2o else 0  # M
        self.pos_map = filled("i", max_seqs * self.map_size, _NONE) if h2o else array("i")  # see above
        self.events = 0  # watermark events emitted so far (all sequences), saturating at 2**30 - 1
        self.on_watermark = None  # callable(handle) run when a sequence crosses its watermark, or None
        self.on_close = None  # callable(handle) run by close() before the sequence is dropped, or None

    # result of the last reserve()/append(): its flags (>= 0) or its refusal; O(1)
    @property
    def status(self):
        return self.meta[_C_ST] - _ST_BIAS

    # open a sequence in region with a policy and a budget of `budget` cached tokens
    # (0: max_slots); ring policies reserve all their blocks now so decode never waits
    # for memory. Returns the handle (>= 0), or E_NO_SLOT / E_NO_BLOCK with nothing
    # taken; KVError for bad parameters. O(budget / T)
    def open(self, region, policy="full", budget=0, sinks=SINKS, recent=0, watermark_pct=WATERMARK_PCT):
        # every parameter is checked (type and range) before anything is taken
        for name, v in (("region", region), ("budget", budget), ("sinks", sinks), ("recent", recent),
                        ("watermark_pct", watermark_pct)):
            if v.__class__ is not int:
                raise KVError("%s must be an int, got %r" % (name, v))
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
            need = (cap + t - 1) // t
            if self.pool.available(region) < need:  # asked first: a refusal moves no counter but `failed`
                self.pool.count_failed()
                return E_NO_BLOCK
            k = 0
            try:
                while k < need:
                    b = self.pool.alloc(region)
                    if b < 0:
                        raise MemoryError  # cannot happen after available(): rolled back below
                    zero32(self.arena, b * self.block_words, 2 * t)  # every slot empty
                    self.table[base + k] = b
                    k += 1
            except Exception:
                for j in range(k):  # any failure after allocating: give every block back
                    self.pool.unref(self.table[base + j])
                    self.table[base + j] = _NONE
                return E_NO_BLOCK
        m = self.meta
        o = _CFG + i * _NF
        m[o + _F_POL] = pol
        m[o + _F_REGION] = region
        m[o + _F_CAP] = cap
        m[o + _F_SINKS] = sinks
        m[o + _F_RECENT] = recent
        m[o + _F_N] = 0
        m[o + _F_WM] = (cap * watermark_pct + 99) // 100
        m[o + _F_WMF] = 0
        m[o + _F_SLOT] = 0
        m[o + _F_EV] = 0
        h = m[o + _F_GEN] + i * _TAGS
        m[o + _F_H] = h + 1
        return h

    # the lowest closed sequence slot, or -1 when all are open; O(max_seqs)
    def _free_seq(self):
        m = self.meta
        for i in range(self.max_seqs):
            if m[_CFG + i * _NF + _F_H] == 0:
                return i
        return _NONE

    # the sequence slot handle h names, open or closed (a handle of this cache's range and
    # tag), or E_STALE (not an int, out of range, another cache's tag); O(1)
    def slot_of(self, h):
        if h.__class__ is not int or h < 0 or h >= self.handle_limit or h % _TAGS != self.tag:
            return E_STALE
        return (h // _TAGS) % self.max_seqs

    # the slot index of handle h, or E_STALE when h is not an open handle of this cache
    # (a non-int included); O(1)
    def _idx(self, h):
        if h.__class__ is not int or h < 0 or h >= self.handle_limit:  # before %: a big int would allocate
            return E_STALE
        i = (h // _TAGS) % self.max_seqs
        if self.meta[_CFG + i * _NF + _F_H] - 1 != h:
            return E_STALE
        return i

    # a new sequence sharing every block of h (reference counted, copied on the first
    # write of either), with h's policy, budget, positions and scores but no
    # reservation. The new handle, or E_STALE / E_NO_SLOT / E_FULL (a block at its
    # reference limit) / E_STATE (a block of h left the pool: retarget to -1); O(blocks + M),
    # no allocation
    def fork(self, h):
        src = self._idx(h)
        if src < 0:
            return src
        i = self._free_seq()
        if i < 0:
            return E_NO_SLOT
        mb = self.max_blocks
        table = self.table
        so = _CFG + src * _NF
        m = self.meta
        n = m[so + _F_N]
        cap = m[so + _F_CAP]
        t = self.t
        held = (n if n < cap else cap) if m[so + _F_POL] == _FULL else cap  # slots the table must hold
        for k in range((held + t - 1) // t):
            if table[src * mb + k] < 0:  # a block that left the pool (retarget to -1): the child could not read it
                return E_STATE
        for k in range(mb):
            b = table[src * mb + k]
            if b >= 0 and self.pool.share(b) < 0:  # E_FULL: the block has 32,767 references
                for j in range(k):  # undo the shares made so far
                    b = table[i * mb + j]
                    if b >= 0:
                        self.pool.unref(b)
                    table[i * mb + j] = _NONE
                return E_FULL
            table[i * mb + k] = b
        o = _CFG + i * _NF
        if m[so + _F_CUR]:  # int4 (KIVI): the source's residual is quantized into its (now shared) block
            self._fold(src)
        for f in range(_NF):  # the whole row, then what is the new slot's own
            if f != _F_GEN:
                m[o + f] = m[so + f]
        m[o + _F_SLOT] = 0
        m[o + _F_CUR] = 0
        mm = self.map_size
        pm = self.pos_map
        for k in range(mm):
            pm[i * mm + k] = pm[src * mm + k]
        nh = m[o + _F_GEN] + i * _TAGS
        m[o + _F_H] = nh + 1
        return nh

    # close h: drop its references to blocks, end its reservation, bump the slot's
    # generation (h and every copy of it are E_STALE from now). OK or E_STALE;
    # O(blocks + M), no allocation
    def close(self, h):
        i = self._idx(h)
        if i < 0:
            return i
        if self.on_close is not None:
            self.on_close(h)  # h is still open here (e.g. tiers.py gives back its flash slots)
        mb = self.max_blocks
        for k in range(i * mb, i * mb + mb):
            b = self.table[k]
            if b >= 0:
                self.pool.unref(b)
                self.table[k] = _NONE
        mm = self.map_size
        for k in range(i * mm, i * mm + mm):
            self.pos_map[k] = _NONE
        m = self.meta
        o = _CFG + i * _NF
        m[o + _F_SLOT] = 0
        m[o + _F_H] = 0
        m[o + _F_CUR] = 0
        for k in range(i * self.t, i * self.t + len(self.flags) // self.max_seqs):
            self.flags[k] = 0
        g = m[o + _F_GEN] + self.max_seqs * _TAGS  # the next generation's base, same tag
        m[o + _F_GEN] = g if g < self.handle_limit else self.tag
        return OK

    # reserve the slot for the next position of h, evicting per its policy, and zero its
    # rows (every layer reads as zeros until write()). Returns the slot (>= 0; flags in
    # self.status) or E_STALE / E_FULL / E_NO_BLOCK with nothing changed but the earlier
    # reservation ended. O(L * row) (+ O(budget) h2o eviction scan); no allocation
    def reserve(self, h):
        return self.append(h, _ZEROS)

    # reserve + write every layer from one token row (row_bytes of src from byte 0);
    # returns the flags (>= 0) or E_STALE / E_RANGE (src too short) / E_FULL /
    # E_NO_BLOCK with nothing changed but the earlier reservation ended. The appended
    # token stays reserved for write(). O(row), no allocation. Written as one viper
    # method (the hot half of _take inlined); anything unusual goes to _put_slow
    @micropython.viper
    def append(self, h, src) -> int:
        m = ptr32(self.meta)
        # as objects first, the type before any compare (None < 0 raises): int() would
        # truncate a big int and raise for a float
        if h.__class__ is not _INT or h < _ZERO_OBJ or h > _HMAX_OBJ:
            m[_C_ST] = _E_STALE + _ST_BIAS
            return _E_STALE
        hi = int(h)
        i = (hi // _TAGS) % int(m[_C_MS])
        o = _CFG + i * _NF
        if int(m[o + _F_H]) != hi + 1:
            m[_C_ST] = _E_STALE + _ST_BIAS
            return _E_STALE
        zero = src is _ZEROS  # reserve(): zero the rows
        if not zero and int(len(src)) < int(m[_C_RB]):
            m[o + _F_SLOT] = 0  # a refusal ends the earlier reservation
            m[_C_ST] = _E_RANGE + _ST_BIAS
            return _E_RANGE
        if not zero and int(misaligned(src, 3)) != 0:  # words from an unaligned address fault on the chip
            m[o + _F_SLOT] = 0
            m[_C_ST] = _E_ALIGN + _ST_BIAS
            return _E_ALIGN
        pol = int(m[o + _F_POL])
        if pol == _H2O or int(m[_C_KV]) != 0:
            return int(self._put_slow(i, src))  # the position map and the victim scan; int4's residual
        n = int(m[o + _F_N])
        cap = int(m[o + _F_CAP])
        st = 0
        if n < cap:
            slot = n
            filled = n + 1
        else:
            if pol == _FULL or n >= _POS_LIMIT:  # the budget, or the last position a small int holds
                m[o + _F_SLOT] = 0
                m[_C_ST] = _E_FULL + _ST_BIAS
                return _E_FULL
            if pol == _WINDOW:
                slot = n % cap
            else:
                s = int(m[o + _F_SINKS])
                slot = s + (n - s) % (cap - s)
            st = ST_EVICTED
            filled = cap
        if int(m[o + _F_WMF]) == 0 and filled >= int(m[o + _F_WM]):
            return int(self._put_slow(i, src))  # the watermark fires: its counter and hook
        t = int(m[_C_T])
        q = slot // t
        r = slot - q * t
        tb = ptr16(self.table)
        b = int(tb[i * int(m[_C_MB]) + q])
        if b == _NO_BLOCK16 or int(ptr16(self.ref)[b]) > 1:
            return int(self._put_slow(i, src))  # a fresh block, or copy on write
        a = ptr32(self.arena)
        w = int(m[_C_RW])
        hw = b * int(m[_C_BW]) + 2 * r  # header words of slot: position + 1, score
        a[hw] = n + 1
        a[hw + 1] = 0
        if st:
            m[o + _F_EV] = int(m[o + _F_EV]) + 1
        m[o + _F_N] = n + 1
        m[o + _F_SLOT] = slot + 1
        m[_C_ST] = st + _ST_BIAS
        d = hw - 2 * r + 2 * t + r * w  # word of layer 0's row of slot
        step = t * w - w  # words from the end of one layer's row of slot to the next one
        rows = int(m[_C_L])
        k = 0
        if zero:
            while k < rows:  # layer k's row of slot = 0, 8 words per turn
                e8 = d + w - 7
                end = d + w
                while d < e8:
                    a[d] = 0
                    a[d + 1] = 0
                    a[d + 2] = 0
                    a[d + 3] = 0
                    a[d + 4] = 0
                    a[d + 5] = 0
                    a[d + 6] = 0
                    a[d + 7] = 0
                    d += 8
                while d < end:
                    a[d] = 0
                    d += 1
                d += step
                k += 1
            return slot
        s32 = ptr32(src)
        sw = 0
        while k < rows:  # row k of src to layer k's row, 8 words per turn
            e8 = d + w - 7
            end = d + w
            while d < e8:
                a[d] = s32[sw]
                a[d + 1] = s32[sw + 1]
                a[d + 2] = s32[sw + 2]
                a[d + 3] = s32[sw + 3]
                a[d + 4] = s32[sw + 4]
                a[d + 5] = s32[sw + 5]
                a[d + 6] = s32[sw + 6]
                a[d + 7] = s32[sw + 7]
                d += 8
                sw += 8
            while d < end:
                a[d] = s32[sw]
                d += 1
                sw += 1
            d += step
            k += 1
        return st

    # reserve (src is _ZEROS) or append for slot index i when the viper path could not:
    # _take, then zero or copy the rows. The slot (reserve) or the flags (append), or
    # E_FULL / E_NO_BLOCK
    def _put_slow(self, i, src):
        slot = self._take(i)
        if slot < 0:
            return slot
        t = self.t
        w = self.row_words
        b = self.table[i * self.max_blocks + slot // t]
        if self.kivi:
            kvkivi.put(self.arena, self.resid, self.kc, src, b, i, slot % t, w, 1 if src is _ZEROS else 0)
            return slot if src is _ZEROS else self.meta[_C_ST] - _ST_BIAS
        d = b * self.block_words + 2 * t + (slot % t) * w
        if src is _ZEROS:
            zero_rows(self.arena, d, t * w, w, self.n_layers)
            return slot
        copy_rows(self.arena, d, t * w, src, 0, w, self.n_layers)
        return self.meta[_C_ST] - _ST_BIAS

    # the common half of reserve/append for slot index i: end the reservation, pick the
    # slot by policy, make its block private (new, or a copy of a shared one), write its
    # header, count the position. The slot, or E_FULL / E_NO_BLOCK; O(1) + h2o scan
    def _take(self, i):
        m = self.meta
        o = _CFG + i * _NF
        m[o + _F_SLOT] = 0  # every reserve/append ends the earlier reservation
        n = m[o + _F_N]
        cap = m[o + _F_CAP]
        pol = m[o + _F_POL]
        st = OK
        if n < cap:
            slot = n
        elif pol == _FULL or n >= _POS_LIMIT:
            m[_C_ST] = E_FULL + _ST_BIAS
            return E_FULL
        else:
            st = ST_EVICTED
            if pol == _WINDOW:
                slot = n % cap
            elif pol == _SINKS:
                s = m[o + _F_SINKS]
                slot = s + (n - s) % (cap - s)
            else:
                slot = h2o_victim(self, i, n)
        t = self.t
        ti = i * self.max_blocks + slot // t
        b = self.table[ti]
        bw = self.block_words
        if b < 0:
            b = self.pool.alloc(m[o + _F_REGION])
            if b < 0:
                m[_C_ST] = E_NO_BLOCK + _ST_BIAS
                return E_NO_BLOCK
            zero32(self.arena, b * bw, 2 * t)  # headers of a fresh block: every slot empty
            self.table[ti] = b
        elif self.ref[b] > 1:
            b = self._own(i, ti, b)
            if b < 0:
                m[_C_ST] = E_NO_BLOCK + _ST_BIAS
                return E_NO_BLOCK
        if self.kivi:  # the take has succeeded: the residual follows the current block
            cur = m[o + _F_CUR] - 1
            if cur != slot // t:
                if cur >= 0:
                    self._fold(i)
                m[o + _F_CUR] = slot // t + 1
            self.flags[i * t + slot % t] = 1
        hw = b * bw + (slot % t) * 2  # header word of slot
        if pol == _H2O:
            mm = self.map_size
            sinks = m[o + _F_SINKS]
            if st:
                old = get32(self.arena, hw) - 1
                j = i * mm + old % mm
                if old >= sinks and self.pos_map[j] == slot:
                    self.pos_map[j] = _NONE
            if n >= sinks:
                self.pos_map[i * mm + n % mm] = slot
        if st:
            m[o + _F_EV] += 1
        set32(self.arena, hw, n + 1)
        set32(self.arena, hw + 1, 0)
        m[o + _F_N] = n + 1
        m[o + _F_SLOT] = slot + 1
        if not m[o + _F_WMF] and (n + 1 if n < cap else cap) >= m[o + _F_WM]:
            m[o + _F_WMF] = 1
            if self.events < _HMAX:
                self.events += 1
            st |= ST_WATERMARK
            if self.on_watermark is not None:
                self.on_watermark(m[o + _F_H] - 1)
        m[_C_ST] = st + _ST_BIAS
        return slot

    # write one layer's row (layer_row bytes of src from byte src_off, a multiple of 4)
    # into the token reserved last for h, copying a shared block first. OK, or E_STALE,
    # E_RANGE (layer, src_off or len(src)), E_STATE (nothing reserved), E_NO_BLOCK (the
    # copy found no block), with nothing changed; O(layer_row), no allocation. One viper
    # method (called L times per token): only a shared block leaves it (_own)
    @micropython.viper
    def write(self, h, layer, src, src_off) -> int:
        c = h.__class__  # as objects first: int() would truncate a big int and raise for a float
        if c is not _INT or h < _ZERO_OBJ or h > _HMAX_OBJ:
            return _E_STALE
        m = ptr32(self.meta)
        hi = int(h)
        i = (hi // _TAGS) % int(m[_C_MS])
        o = _CFG + i * _NF
        if int(m[o + _F_H]) != hi + 1:
            return _E_STALE
        if layer.__class__ is not c or src_off.__class__ is not c:  # c is int (checked above)
            return _E_RANGE
        if layer < _ZERO_OBJ or layer > _HMAX_OBJ or src_off < _ZERO_OBJ or src_off > _HMAX_OBJ:
            return _E_RANGE
        ly = int(layer)
        off = int(src_off)
        if ly >= int(m[_C_L]) or (off & 3) != 0 or off + int(m[_C_LR]) > int(len(src)):
            return _E_RANGE
        if int(misaligned(src, 3)) != 0:  # words from an unaligned address fault on the chip
            return _E_ALIGN
        slot = int(m[o + _F_SLOT]) - 1
        if slot < 0:
            return _E_STATE
        t = int(m[_C_T])
        q = slot // t
        ti = i * int(m[_C_MB]) + q
        tb = ptr16(self.table)
        b = int(tb[ti])
        if b == _NO_BLOCK16:
            return _E_STATE  # cannot happen (a reservation has its block): never index with -1
        a = ptr32(self.arena)
        s32 = ptr32(src)
        sw = off >> 2
        if int(m[_C_KV]) != 0:  # int4 (KIVI): K to the residual, V to the stored row
            r = slot - q * t
            if int(m[o + _F_CUR]) != q + 1 or int(ptr8(self.flags)[i * t + r]) == 0 or int(ptr16(self.ref)[b]) > 1:
                b = int(self._reopen(i, slot))  # after a fork: the slot's block private and current again
                if b < 0:
                    return _E_NO_BLOCK
            kp = ptr32(self.kc)
            kd = int(kp[_KC_KD])
            rs = ptr32(self.resid)
            d = ((i * int(m[_C_L]) + ly) * t + r) * kd
            end = d + kd
            while d < end:
                rs[d] = s32[sw]
                d += 1
                sw += 1
            d = b * int(m[_C_BW]) + int(kp[_KC_RW]) + (ly * t + r) * int(kp[_KC_SRW])
            end = d + int(kp[_KC_VW])
            while d < end:
                a[d] = s32[sw]
                d += 1
                sw += 1
            return 0
        if int(ptr16(self.ref)[b]) > 1:
            b = int(self._own(i, ti, b))  # copy on write
            if b < 0:
                return _E_NO_BLOCK
        w = int(m[_C_RW])
        d = b * int(m[_C_BW]) + 2 * t + (ly * t + slot - q * t) * w
        e8 = d + w - 7
        end = d + w
        while d < e8:  # 8 words per turn
            a[d] = s32[sw]
            a[d + 1] = s32[sw + 1]
            a[d + 2] = s32[sw + 2]
            a[d + 3] = s32[sw + 3]
            a[d + 4] = s32[sw + 4]
            a[d + 5] = s32[sw + 5]
            a[d + 6] = s32[sw + 6]
            a[d + 7] = s32[sw + 7]
            d += 8
            sw += 8
        while d < end:
            a[d] = s32[sw]
            d += 1
            sw += 1
        return 0

    # copy the layer row of position pos of h into dst at byte dst_off (a multiple of 4).
    # OK, or E_STALE, E_RANGE (layer, dst_off, len(dst), pos outside 0 .. length - 1),
    # E_EMPTY (pos was evicted, or its block left the pool); O(layer_row), no allocation
    def read(self, h, pos, layer, dst, dst_off):
        i = self._idx(h)
        if i < 0:
            return i
        if self.bad_dst(layer, dst, dst_off):
            return E_RANGE
        if misaligned(dst, 3):  # words to an unaligned address fault on the chip
            return E_ALIGN
        slot = self._locate(i, pos)
        if slot < 0:
            return slot
        if self.table[i * self.max_blocks + slot // self.t] < 0:  # the block left the pool (retarget to -1)
            return E_EMPTY
        self._read(i, slot, layer, dst, dst_off >> 2)
        return OK

    # the layer row of slot of h into dst at byte dst_off, as read() (int4: K in fp32,
    # from the residual or dequantized): for attention kernels that walk slots. OK, or
    # E_STALE, E_RANGE (slot, layer, dst_off, len(dst)), E_EMPTY; O(layer_row), no allocation
    def read_slot(self, h, slot, layer, dst, dst_off):
        i = self._idx(h)
        if i < 0:
            return i
        if self.bad_dst(layer, dst, dst_off):
            return E_RANGE
        if misaligned(dst, 3):  # words to an unaligned address fault on the chip
            return E_ALIGN
        hw = self._hdr(i, slot)
        if hw < 0:
            return hw
        self._read(i, slot, layer, dst, dst_off >> 2)
        return OK

    # True when (layer, dst, dst_off) cannot take one layer row: layer not a layer, dst_off
    # not a multiple of 4 in range, dst too short, None, the arena itself (that would
    # write another sequence's rows), or an immutable bytes or str (viper would write into
    # it on MicroPython: a literal in the code). Every int compared as an object before
    # any arithmetic (a big int would allocate); O(1), no allocation
    def bad_dst(self, layer, dst, dst_off):
        if (layer.__class__ is not int or layer < 0 or layer >= self.n_layers or dst_off.__class__ is not int
                or dst_off < 0 or dst_off > _HMAX or dst is None or dst is self.arena
                or dst.__class__ is bytes or dst.__class__ is str):
            return True
        return (dst_off & 3) != 0 or dst_off + self.layer_row > len(dst)

    # read's copy for slot index i (arguments checked); no allocation
    def _read(self, i, slot, layer, dst, dw):
        t = self.t
        b = self.table[i * self.max_blocks + slot // t]
        w = self.row_words
        if not self.kivi:
            copy32(dst, dw, self.arena, b * self.block_words + 2 * t + (layer * t + slot % t) * w, w)
            return
        r = slot % t
        kd = self.kv_dim
        if self.meta[_CFG + i * _NF + _F_CUR] == slot // t + 1 and self.flags[i * t + r]:
            copy32(dst, dw, self.resid, ((i * self.n_layers + layer) * t + r) * kd, kd)
        else:
            kvkivi.dequant(self.arena, self.kc, dst, b, r, layer, dw)
        copy32(dst, dw + kd, self.arena, b * self.block_words + self.rows_word + (layer * t + r) * (self.store_row >> 2),
               w - kd)

    # slot holding position pos of h, or E_STALE, E_RANGE (pos outside 0 .. length - 1),
    # E_EMPTY (evicted); O(1). The slot's block may have left the pool (retarget to -1):
    # block_at / row_offset / read say E_EMPTY for it
    def locate(self, h, pos):
        i = self._idx(h)
        if i < 0:
            return i
        return self._locate(i, pos)

    # locate() for slot index i
    def _locate(self, i, pos):
        n = self.meta[_CFG + i * _NF + _F_N]
        if pos.__class__ is not int or pos < 0 or pos >= n:
            return E_RANGE
        cap = self.meta[_CFG + i * _NF + _F_CAP]
        pol = self.meta[_CFG + i * _NF + _F_POL]
        if pol == _FULL:
            slot = pos
        elif pol == _WINDOW:
            if pos < n - cap:
                return E_EMPTY
            slot = pos % cap
        else:
            s = self.meta[_CFG + i * _NF + _F_SINKS]
            if pos < s:
                slot = pos
            elif pol == _SINKS:
                if pos < n - (cap - s):
                    return E_EMPTY
                slot = s + (pos - s) % (cap - s)
            else:
                slot = self.pos_map[i * self.map_size + pos % self.map_size]
                if slot < 0:
                    return E_EMPTY
        if pol != _H2O:
            return slot
        t = self.t
        b = self.table[i * self.max_blocks + slot // t]
        if b < 0 or get32(self.arena, b * self.block_words + (slot % t) * 2) != pos + 1:
            return E_EMPTY
        return slot

    # header word of slot of slot index i, E_RANGE (slot outside 0 .. budget - 1) or
    # E_EMPTY (the slot holds no position); O(1)
    def _hdr(self, i, slot):
        if slot.__class__ is not int or slot < 0 or slot >= self.meta[_CFG + i * _NF + _F_CAP]:
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
        i = self._row_idx(h, slot, layer)
        if i < 0:
            return i
        t = self.t
        b = self.table[i * self.max_blocks + slot // t]
        return b * self.block_bytes + (self.rows_word << 2) + (layer * t + slot % t) * self.store_row

    # slot index of h when (slot, layer) names a filled row of it, else E_STALE, E_RANGE
    # or E_EMPTY (row_offset's and residual_word's checks); O(1), no allocation
    def _row_idx(self, h, slot, layer):
        i = self._idx(h)
        if i < 0:
            return i
        if layer.__class__ is not int or layer < 0 or layer >= self.n_layers:
            return E_RANGE
        hw = self._hdr(i, slot)
        if hw < 0:
            return hw
        return i

    # int4 (KIVI): table index of h's block whose newest keys are in the residual (the
    # current block), or E_EMPTY when none (nothing taken since open, fork or a fold);
    # E_STALE; O(1)
    def current_block(self, h):
        i = self._idx(h)
        if i < 0:
            return i
        k = self.meta[_CFG + i * _NF + _F_CUR] - 1
        return k if k >= 0 else E_EMPTY

    # int4 (KIVI): word of self.resid where slot's fp32 K of `layer` is (layer l + 1's
    # is T x kv_dim words on), when slot's key is in the residual; else E_EMPTY (its key
    # is in the block: the parameters at kvlayout's kp_off, the nibbles at kq_off of its
    # stored row). E_STALE, E_RANGE; O(1)
    def residual_word(self, h, slot, layer):
        i = self._row_idx(h, slot, layer)
        if i < 0:
            return i
        t = self.t
        if not self.kivi or self.meta[_CFG + i * _NF + _F_CUR] != slot // t + 1 or not self.flags[i * t + slot % t]:
            return E_EMPTY
        return ((i * self.n_layers + layer) * t + slot % t) * self.kv_dim

    # int4 (KIVI): quantize the residual of slot index i into its current block and end
    # it (kvkivi.fold); O(L x kv_dim x T), no allocation
    def _fold(self, i):
        o = _CFG + i * _NF
        b = self.table[i * self.max_blocks + self.meta[o + _F_CUR] - 1]
        kvkivi.fold(self.arena, self.resid, self.flags, self.kc, b, i)
        self.meta[o + _F_CUR] = 0

    # int4 (KIVI): write() to a reserved slot that is not in the residual (a fork has
    # folded it, and may share its block): copy the block when shared, fold any other
    # current block, make slot's block current with slot residual again (its residual
    # rows still hold the fp32 K written since its reserve). The block, or E_NO_BLOCK
    # with nothing changed; O(block), no allocation
    def _reopen(self, i, slot):
        t = self.t
        q = slot // t
        ti = i * self.max_blocks + q
        b = self.table[ti]
        if self.ref[b] > 1:
            b = self._own(i, ti, b)
            if b < 0:
                return E_NO_BLOCK
        o = _CFG + i * _NF
        if self.meta[o + _F_CUR] != q + 1:
            if self.meta[o + _F_CUR]:
                self._fold(i)
            self.meta[o + _F_CUR] = q + 1
        self.flags[i * t + slot % t] = 1
        return b

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
        if score.__class__ is not int or score < 0 or score > _SCORE_MAX:
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
        nb = pool.alloc(self.meta[_CFG + i * _NF + _F_REGION])
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
        return self.meta[_CFG + i * _NF + _F_N]

    # tokens of h in the cache now (min(length, budget)), or E_STALE; O(1)
    def cached(self, h):
        i = self._idx(h)
        if i < 0:
            return i
        n = self.meta[_CFG + i * _NF + _F_N]
        cap = self.meta[_CFG + i * _NF + _F_CAP]
        return n if n < cap else cap

    # tokens of h evicted so far, or E_STALE; O(1)
    def evictions(self, h):
        i = self._idx(h)
        if i < 0:
            return i
        return self.meta[_CFG + i * _NF + _F_EV]

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

    # point block-table entry k of h, now `old`, at block `new` (a private pool block
    # holding the same bytes, e.g. a copy in another tier range of the pool), or at -1 (the
    # block left the pool, e.g. spilled to flash: its positions then read E_EMPTY here).
    # The caller gives `old` back to the pool. OK, or E_STALE, E_RANGE (k, or new not a
    # block of the pool), E_STATE (the entry is not `old`; old or new is shared; new is -1
    # for the block holding a reservation or int4 residual keys, or for an h2o sequence;
    # new already in one of this cache's tables), with nothing changed. O(table entries)
    # (the scan that proves new is in no table of this cache; a block of another cache
    # on the same pool is the caller's to rule out), no allocation
    def retarget(self, h, k, old, new):
        i = self._idx(h)
        if i < 0:
            return i
        if (k.__class__ is not int or k < 0 or k >= self.max_blocks or old.__class__ is not int
                or new.__class__ is not int or new < _NONE or new >= self.pool.n_blocks):
            return E_RANGE
        ti = i * self.max_blocks + k
        if old < 0 or self.table[ti] != old or self.ref[old] != 1 or (new >= 0 and self.ref[new] != 1):
            return E_STATE
        o = _CFG + i * _NF
        if new < 0:
            slot = self.meta[o + _F_SLOT] - 1
            if (self.meta[o + _F_POL] == _H2O or (slot >= 0 and slot // self.t == k)
                    or self.meta[o + _F_CUR] == k + 1):
                return E_STATE  # h2o's victim scan reads every ring block; the open row and residual need theirs
        else:
            table = self.table
            j = 0
            end = len(table)
            while j < end:  # new must not be in any table of this cache (another sequence's, or this one's)
                if table[j] == new:
                    return E_STATE
                j += 1
        self.table[ti] = new
        return OK

    # the index in self.meta of open handle h's row (its words: SEQ_FIELDS), or E_STALE: for
    # snapshot.py, which saves a sequence's words and sets them on a sequence it opens; O(1)
    def seq_row(self, h):
        i = self._idx(h)
        return i if i < 0 else _CFG + i * _NF

    # pool block at block-table index k of h (slots k*T .. k*T + T - 1; layer l's T rows
    # are contiguous in it), for attention kernels to read: never write through it
    # (it may be shared). E_STALE, E_RANGE (k outside 0 .. max_blocks - 1), E_EMPTY; O(1)
    def block_at(self, h, k):
        i = self._idx(h)
        if i < 0:
            return i
        if k.__class__ is not int or k < 0 or k >= self.max_blocks:
            return E_RANGE
        b = self.table[i * self.max_blocks + k]
        return b if b >= 0 else E_EMPTY
