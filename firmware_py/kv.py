# KV cache over pool blocks: per sequence a block table of pool blocks, the new
# token's K and V written in place, O(1) lookup of any cached position, and a policy
# per sequence (full / window / sinks / h2o) that decides what happens at the budget.
# Nothing here allocates after boot: sequences, block tables and the h2o position
# maps are arrays sized in __init__; rows move with viper word copies.
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
from firmware_py.compat import const, micropython, ptr32
from firmware_py.pool import META_BYTES_PER_BLOCK, POOL_FIXED_BYTES, VIEW_BYTES_PER_BLOCK, copy32, filled, get32, set32

_HDR_BYTES = const(8)  # per-slot header: position + 1, score
_SCORE_MAX = const(0x1FFFFFFF)  # scores saturate here (stay a small int on the ESP32)
_NONE = const(-1)

DTYPES = ("fp32", "fp16", "int8", "int4")
POLICIES = ("full", "window", "sinks", "h2o")
FULL = const(0)  # stop at the budget with ST_FULL
WINDOW = const(1)  # ring over the most recent `budget` tokens
SINKS = const(2)  # first `sinks` tokens + a ring of the most recent ones
H2O = const(3)  # sinks + `recent` ring + heavy hitters by accumulated score

# append()/reserve() status: >= 0 is success, a sum of these flags
ST_OK = const(0)
ST_WATERMARK = const(1)  # this token crossed the sequence's watermark (once)
ST_EVICTED = const(2)  # an older token was evicted to make room
ST_FULL = const(-1)  # budget reached under policy full: nothing written
ST_NO_BLOCK = const(-2)  # the pool or the region's quota has no block: nothing written
ST_CLOSED = const(-3)  # no such open sequence
ST_NO_SEQ = const(-4)  # open(): every sequence slot is in use


# the heap this firmware's boot keeps before the pool: live module objects plus the
# holes compiling them leaves. Measured on the unix port importing board, pool, kv,
# llama2c and kvprobe from source: 84,032 B unusable for one large block (a board
# loading .mpy files keeps less). A profile's firmware_reserved_bytes counts when larger.
BOOT_BYTES = const(98304)
KV_FIXED_BYTES = const(2048)  # KVCache object + its per-sequence arrays (measured ~1.3 KiB for 4 seqs)


@micropython.viper
def _min_row(buf, word: int, rows: int, lo: int, hi: int, limit: int) -> int:
    # the row (of `rows` slot headers from uint32 word `word`) whose position p has
    # lo <= p < hi and whose score is lowest and below limit, or -1; O(rows), no allocation
    p = ptr32(buf)
    best = -1
    r = 0
    while r < rows:
        pos1 = int(p[word + 2 * r])  # position + 1; 0 = empty slot
        if pos1 > lo and pos1 <= hi:
            sc = int(p[word + 2 * r + 1])
            if sc < limit:
                limit = sc
                best = r
        r += 1
    return best


class KVError(ValueError):
    # a caller's mistake in configuring a cache or a sequence; str() is one line
    pass


class Layout:
    # byte layout of one token and one block for a model shape and element type
    def __init__(self, n_layers, n_kv_heads, head_dim, dtype="fp32", group=32, tokens_per_block=16):
        if dtype not in DTYPES:
            raise KVError("kv dtype must be one of %s, got %r" % (", ".join(DTYPES), dtype))
        for name, v in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                        ("group", group), ("tokens_per_block", tokens_per_block)):
            if v < 1:
                raise KVError("%s must be >= 1, got %d" % (name, v))
        self.n_layers = n_layers  # L
        self.n_kv_heads = n_kv_heads  # H
        self.head_dim = head_dim  # D
        self.kv_dim = n_kv_heads * head_dim  # elements of K (or V) per layer per token
        self.dtype = dtype  # element type name
        self.tokens_per_block = tokens_per_block  # T
        g = 0  # scale groups per head (0: no scales)
        if dtype == "int8":
            g = 1
        elif dtype == "int4":
            if head_dim % 2:
                raise KVError("int4 needs an even head_dim, got %d" % head_dim)
            group = min(group, head_dim)
            if head_dim % group:
                raise KVError("int4 group %d must divide head_dim %d" % (group, head_dim))
            g = head_dim // group
        self.group = head_dim // g if g else 0  # elements sharing one scale
        self.groups_per_head = g
        if dtype == "fp32":
            self.data_bytes = self.kv_dim * 4  # bytes of K (or V) data per layer per token
        elif dtype == "fp16":
            self.data_bytes = self.kv_dim * 2
        elif dtype == "int8":
            self.data_bytes = self.kv_dim
        else:
            self.data_bytes = self.kv_dim // 2
        self.scale_bytes = n_kv_heads * g * 4  # bytes of K (or V) scales per layer per token
        # the published figure: 2 x L x H x D x bytes, plus the scales
        self.kv_bytes_per_token = 2 * n_layers * (self.data_bytes + self.scale_bytes)
        self.v_off = self.data_bytes  # V data offset in a layer_row
        self.ks_off = _round4(2 * self.data_bytes)  # K scales offset in a layer_row
        self.vs_off = self.ks_off + self.scale_bytes  # V scales offset in a layer_row
        self.layer_row = _round4(self.vs_off + self.scale_bytes)  # bytes per (layer, token)
        self.row_bytes = n_layers * self.layer_row  # bytes of one token row for append()
        self.token_bytes = _HDR_BYTES + self.row_bytes  # pool bytes per token, header included
        self.block_bytes = tokens_per_block * self.token_bytes  # pool block size

    # byte offset of (layer, slot r) inside a block; O(1)
    def row_offset(self, layer, r):
        t = self.tokens_per_block
        return t * _HDR_BYTES + (layer * t + r) * self.layer_row

    # the layout as a dict (allocates: reporting path only)
    def to_dict(self):
        return {
            "n_layers": self.n_layers, "n_kv_heads": self.n_kv_heads, "head_dim": self.head_dim,
            "dtype": self.dtype, "group": self.group, "tokens_per_block": self.tokens_per_block,
            "kv_bytes_per_token": self.kv_bytes_per_token, "layer_row": self.layer_row,
            "token_bytes": self.token_bytes, "block_bytes": self.block_bytes,
        }


def _round4(n):
    return (n + 3) & ~3


class KVCache:
    # sequences over one shared Pool; every per-sequence array is made here, at boot
    def __init__(self, pool, layout, max_seqs=4, max_blocks_per_seq=0, h2o=False):
        if pool.block_bytes != layout.block_bytes:
            raise KVError("pool blocks are %d B, layout needs %d B" % (pool.block_bytes, layout.block_bytes))
        if max_seqs < 1:
            raise KVError("max_seqs must be >= 1")
        mb = max_blocks_per_seq or pool.n_blocks
        t = layout.tokens_per_block
        self.pool = pool  # the Pool every block comes from
        self.arena = pool.arena  # pool.arena, kept here to save a lookup per row
        self.layout = layout  # Layout of every block
        self.t = t  # tokens per block
        self.block_bytes = layout.block_bytes  # bytes per block
        self.row_words = layout.layer_row // 4  # uint32 words per (layer, token) row
        self.n_layers = layout.n_layers  # rows per token
        self.max_seqs = max_seqs  # sequence slots
        self.max_blocks = mb  # block-table entries per sequence
        self.max_slots = mb * t  # most cached tokens one sequence can hold
        self.table = filled("h", max_seqs * mb, _NONE)  # [seq][block] pool block or -1
        self.s_open = filled("b", max_seqs, 0)  # 1 while the sequence is open
        self.s_policy = filled("b", max_seqs, 0)  # FULL / WINDOW / SINKS / H2O
        self.s_region = filled("b", max_seqs, 0)  # pool region charged for new blocks
        self.s_cap = filled("i", max_seqs, 0)  # budget: slots the sequence may fill
        self.s_sinks = filled("i", max_seqs, 0)  # sink slots (sinks, h2o)
        self.s_recent = filled("i", max_seqs, 0)  # protected recent tokens (h2o)
        self.s_n = filled("i", max_seqs, 0)  # positions appended so far (next position)
        self.s_wm = filled("i", max_seqs, 0)  # filled-slot count that fires the watermark
        self.s_wm_fired = filled("b", max_seqs, 0)  # 1 once the watermark has fired
        self.s_slot = filled("i", max_seqs, _NONE)  # slot reserved for the current token
        self.s_evictions = filled("i", max_seqs, 0)  # tokens evicted so far
        # h2o: [seq][M] slot of position p at p % M (M = 2 * max_slots > any budget, so
        # only heavy hitters older than M positions can collide; the older one is evicted)
        self.map_size = 2 * self.max_slots if h2o else 0  # M
        self.pos_map = filled("h", max_seqs * self.map_size, _NONE)  # see above
        self.events = 0  # watermark events emitted so far (all sequences)
        self.on_watermark = None  # callable(seq) run when a sequence crosses its watermark, or None
        self.status = ST_OK  # flags of the last reserve()

    # open a sequence in region with a policy and a budget of `budget` cached tokens;
    # ring policies reserve all their blocks now so decode never waits for memory.
    # Returns the sequence id, or ST_NO_SEQ / ST_NO_BLOCK; O(budget / T)
    def open(self, region, policy="full", budget=0, sinks=4, recent=0, watermark_pct=80):
        if policy not in POLICIES:
            raise KVError("policy must be one of %s, got %r" % (", ".join(POLICIES), policy))
        pol = POLICIES.index(policy)
        cap = budget or self.max_slots
        if cap < 1 or cap > self.max_slots:
            raise KVError("budget must be 1..%d tokens, got %d" % (self.max_slots, cap))
        if pol == WINDOW or pol == FULL:
            sinks = 0
            recent = 0
        elif pol == SINKS:
            if not 0 < sinks < cap:
                raise KVError("sinks must be 1..%d for a budget of %d, got %d" % (cap - 1, cap, sinks))
            recent = cap - sinks
        else:
            if not self.map_size:
                raise KVError("h2o needs KVCache(..., h2o=True) at boot")
            if sinks < 0 or recent < 1 or sinks + recent >= cap:
                raise KVError("h2o needs sinks >= 0, recent >= 1 and sinks + recent < budget (%d)" % cap)
        if not 0 < watermark_pct <= 100:
            raise KVError("watermark_pct must be 1..100, got %d" % watermark_pct)
        seq = self._free_seq()
        if seq < 0:
            return ST_NO_SEQ
        base = seq * self.max_blocks
        if pol != FULL:
            nb = (cap + self.t - 1) // self.t
            for i in range(nb):
                b = self.pool.alloc(region)
                if b < 0:
                    for j in range(i):
                        self.pool.unref(self.table[base + j])
                        self.table[base + j] = _NONE
                    return ST_NO_BLOCK
                self.table[base + i] = b
        self.s_open[seq] = 1
        self.s_policy[seq] = pol
        self.s_region[seq] = region
        self.s_cap[seq] = cap
        self.s_sinks[seq] = sinks
        self.s_recent[seq] = recent
        self.s_n[seq] = 0
        self.s_wm[seq] = (cap * watermark_pct + 99) // 100
        self.s_wm_fired[seq] = 0
        self.s_slot[seq] = _NONE
        self.s_evictions[seq] = 0
        return seq

    # the lowest closed sequence slot, or -1 when all are open; O(max_seqs)
    def _free_seq(self):
        for i in range(self.max_seqs):
            if not self.s_open[i]:
                return i
        return _NONE

    # a new sequence sharing every block of src (reference counted, copied on the
    # first write), with src's policy, budget and positions; O(blocks) or ST_NO_SEQ
    def fork(self, src):
        self._check(src)
        seq = self._free_seq()
        if seq < 0:
            return ST_NO_SEQ
        mb = self.max_blocks
        for i in range(mb):
            b = self.table[src * mb + i]
            if b >= 0:
                self.pool.share(b)
            self.table[seq * mb + i] = b
        for a in (self.s_open, self.s_policy, self.s_region, self.s_cap, self.s_sinks, self.s_recent,
                  self.s_n, self.s_wm, self.s_wm_fired, self.s_evictions):
            a[seq] = a[src]
        self.s_slot[seq] = _NONE
        m = self.map_size
        for i in range(m):
            self.pos_map[seq * m + i] = self.pos_map[src * m + i]
        return seq

    # close a sequence and drop its references to blocks; O(blocks), no allocation
    def close(self, seq):
        self._check(seq)
        mb = self.max_blocks
        for i in range(seq * mb, seq * mb + mb):
            b = self.table[i]
            if b >= 0:
                self.pool.unref(b)
                self.table[i] = _NONE
        m = self.map_size
        for i in range(seq * m, seq * m + m):
            self.pos_map[i] = _NONE
        self.s_open[seq] = 0

    # reserve the slot for the next position of seq, evicting per its policy; returns
    # the slot (>= 0; flags in self.status) or ST_FULL / ST_NO_BLOCK / ST_CLOSED with
    # nothing changed. O(1) except h2o eviction (O(budget) header scan); no allocation
    def reserve(self, seq):
        if seq < 0 or seq >= self.max_seqs or not self.s_open[seq]:
            return ST_CLOSED
        n = self.s_n[seq]
        cap = self.s_cap[seq]
        pol = self.s_policy[seq]
        st = ST_OK
        if n < cap:
            slot = n
        elif pol == FULL:
            return ST_FULL
        else:
            st = ST_EVICTED
            if pol == WINDOW:
                slot = n % cap
            elif pol == SINKS:
                s = self.s_sinks[seq]
                slot = s + (n - s) % (cap - s)
            else:
                slot = self._h2o_victim(seq, n)
        t = self.t
        i = seq * self.max_blocks + slot // t
        b = self.table[i]
        pool = self.pool
        if b < 0:
            b = pool.alloc(self.s_region[seq])
            if b < 0:
                return ST_NO_BLOCK
            self.table[i] = b
        elif pool.ref[b] > 1:
            b = self._own(seq, i, b)
            if b < 0:
                return ST_NO_BLOCK
        hw = (b * self.block_bytes + (slot % t) * _HDR_BYTES) // 4  # header word of slot
        if st:
            self.s_evictions[seq] += 1
            if pol == H2O:
                old = get32(self.arena, hw) - 1
                m = self.map_size
                j = seq * m + old % m
                if old >= self.s_sinks[seq] and self.pos_map[j] == slot:
                    self.pos_map[j] = _NONE
        if pol == H2O and n >= self.s_sinks[seq]:
            self.pos_map[seq * self.map_size + n % self.map_size] = slot
        set32(self.arena, hw, n + 1)
        set32(self.arena, hw + 1, 0)
        self.s_n[seq] = n + 1
        self.s_slot[seq] = slot
        if not self.s_wm_fired[seq] and (n + 1 if n < cap else cap) >= self.s_wm[seq]:
            self.s_wm_fired[seq] = 1
            self.events += 1
            st |= ST_WATERMARK
            if self.on_watermark is not None:
                self.on_watermark(seq)
        self.status = st
        return slot

    # write one layer's row (layer_row bytes of src from byte src_off, a multiple of 4)
    # into the token reserved last for seq; O(layer_row), no allocation
    def write(self, seq, layer, src, src_off):
        slot = self.s_slot[seq]
        if slot < 0:
            return  # nothing reserved (reserve() failed or was not called)
        t = self.t
        b = self.table[seq * self.max_blocks + slot // t]
        w = self.row_words
        copy32(self.arena, (b * self.block_bytes + t * _HDR_BYTES) // 4 + (layer * t + slot % t) * w, src, src_off // 4, w)

    # reserve + write every layer from one token row (row_bytes of src); returns
    # reserve()'s status flags (>= 0) or its negative status; O(row), no allocation
    def append(self, seq, src):
        slot = self.reserve(seq)
        if slot < 0:
            return slot
        t = self.t
        b = self.table[seq * self.max_blocks + slot // t]
        w = self.row_words
        d = (b * self.block_bytes + t * _HDR_BYTES) // 4 + (slot % t) * w
        step = t * w
        s = 0
        for _ in range(self.n_layers):
            copy32(self.arena, d, src, s, w)
            d += step
            s += w
        return self.status

    # slot holding position pos of seq, or -1 when pos is not cached; O(1)
    def locate(self, seq, pos):
        n = self.s_n[seq]
        if pos < 0 or pos >= n or not self.s_open[seq]:
            return _NONE
        cap = self.s_cap[seq]
        pol = self.s_policy[seq]
        if pol == FULL:
            return pos
        if pol == WINDOW:
            return pos % cap if pos >= n - cap else _NONE
        s = self.s_sinks[seq]
        if pos < s:
            return pos
        if pol == SINKS:
            return s + (pos - s) % (cap - s) if pos >= n - (cap - s) else _NONE
        slot = self.pos_map[seq * self.map_size + pos % self.map_size]
        if slot < 0 or self.slot_pos(seq, slot) != pos:
            return _NONE
        return slot

    # arena byte offset of the (layer, slot) row of seq, for attention kernels; O(1)
    def row_offset(self, seq, slot, layer):
        t = self.t
        b = self.table[seq * self.max_blocks + slot // t]
        return b * self.block_bytes + t * _HDR_BYTES + (layer * t + slot % t) * self.row_words * 4

    # copy the (layer) row of position pos into dst at byte dst_off; True when cached;
    # O(row), no allocation
    def read(self, seq, pos, layer, dst, dst_off):
        slot = self.locate(seq, pos)
        if slot < 0:
            return False
        t = self.t
        b = self.table[seq * self.max_blocks + slot // t]
        w = self.row_words
        copy32(dst, dst_off // 4, self.arena, (b * self.block_bytes + t * _HDR_BYTES) // 4 + (layer * t + slot % t) * w, w)
        return True

    # position cached in slot of seq, or -1 when the slot is empty; O(1)
    def slot_pos(self, seq, slot):
        t = self.t
        b = self.table[seq * self.max_blocks + slot // t]
        if b < 0:
            return _NONE
        return get32(self.arena, (b * self.block_bytes + (slot % t) * _HDR_BYTES) // 4) - 1

    # add an attention score (fixed point, >= 0) to slot of seq, saturating; O(1)
    # (a shared block is first copied, as for a write). ST_OK, or ST_NO_BLOCK when that
    # copy finds no block (the score is then dropped)
    def add_score(self, seq, slot, score):
        t = self.t
        i = seq * self.max_blocks + slot // t
        b = self.table[i]
        if self.pool.ref[b] > 1:
            b = self._own(seq, i, b)
            if b < 0:
                return ST_NO_BLOCK
        w = (b * self.block_bytes + (slot % t) * _HDR_BYTES) // 4 + 1
        v = get32(self.arena, w) + score
        set32(self.arena, w, v if v < _SCORE_MAX else _SCORE_MAX)
        return ST_OK

    # copy on write: give seq a private copy of shared block b at table index i;
    # the new block, or -1 when seq's region has none; O(block), no allocation
    def _own(self, seq, i, b):
        pool = self.pool
        nb = pool.alloc(self.s_region[seq])
        if nb < 0:
            return _NONE
        w = self.block_bytes // 4
        copy32(self.arena, nb * w, self.arena, b * w, w)
        pool.unref(b)
        self.table[i] = nb
        return nb

    # accumulated score of slot of seq; O(1)
    def score(self, seq, slot):
        t = self.t
        b = self.table[seq * self.max_blocks + slot // t]
        return get32(self.arena, (b * self.block_bytes + (slot % t) * _HDR_BYTES) // 4 + 1)

    # positions appended to seq so far (the next token's position); O(1)
    def length(self, seq):
        return self.s_n[seq]

    # tokens of seq in the cache now; O(1)
    def cached(self, seq):
        n = self.s_n[seq]
        cap = self.s_cap[seq]
        return n if n < cap else cap

    # pool blocks in seq's block table (shared ones included); O(blocks)
    def blocks_of(self, seq):
        k = 0
        mb = self.max_blocks
        for i in range(seq * mb, seq * mb + mb):
            if self.table[i] >= 0:
                k += 1
        return k

    # h2o: the slot to reuse at position n: an older heavy hitter colliding in the
    # position map, else the lowest-score slot that is neither a sink nor among the
    # `recent` newest; O(budget)
    def _h2o_victim(self, seq, n):
        m = self.map_size
        s = self.pos_map[seq * m + n % m]
        if s >= 0:
            return s
        cap = self.s_cap[seq]
        cutoff = n - self.s_recent[seq]  # positions >= cutoff are protected
        sinks = self.s_sinks[seq]
        t = self.t
        base = seq * self.max_blocks
        best = _NONE
        best_score = _SCORE_MAX + 1
        for i in range((cap + t - 1) // t):
            b = self.table[base + i]
            rows = cap - i * t
            w = b * self.block_bytes // 4
            r = _min_row(self.arena, w, rows if rows < t else t, sinks, cutoff, best_score)
            if r >= 0:
                best = i * t + r
                best_score = get32(self.arena, w + 2 * r + 1)
        assert best >= 0, "h2o: no evictable slot"
        return best

    def _check(self, seq):
        if seq < 0 or seq >= self.max_seqs or not self.s_open[seq]:
            raise KVError("sequence %d is not open" % seq)


# The sizing rule host/budget.py and firmware boot share: heap bytes one pool block
# costs with its bookkeeping (free-list/refcount/owner, its view, a block-table entry
# per sequence, and the h2o position map)
def bytes_per_block(layout, max_seqs=1, h2o=False):
    per_seq = 2 + (4 * layout.tokens_per_block if h2o else 0)
    return layout.block_bytes + META_BYTES_PER_BLOCK + VIEW_BYTES_PER_BLOCK + max_seqs * per_seq


# heap bytes kept before the pool on a board whose profile reserves firmware_bytes
def boot_reserve(firmware_bytes):
    return firmware_bytes if firmware_bytes > BOOT_BYTES else BOOT_BYTES


# blocks the pool gets on an MCU board profile (brd: firmware_py.board.Board) after the
# boot reserve, the weights, the activations and one token row: boot-time sizing
def blocks_for_board(brd, layout, weights_bytes, activations_bytes, max_seqs=1, h2o=False):
    avail = brd.mpy_heap - boot_reserve(brd.firmware_bytes) - weights_bytes - activations_bytes - layout.row_bytes
    return blocks_for(avail, layout, max_seqs, h2o)


# blocks a heap of avail free bytes can hold as one pool + cache
def blocks_for(avail, layout, max_seqs=1, h2o=False):
    n = (avail - POOL_FIXED_BYTES - KV_FIXED_BYTES) // bytes_per_block(layout, max_seqs, h2o)
    return n if n > 0 else 0


# heap bytes a pool of n_blocks + its cache needs
def heap_for(n_blocks, layout, max_seqs=1, h2o=False):
    return POOL_FIXED_BYTES + KV_FIXED_BYTES + n_blocks * bytes_per_block(layout, max_seqs, h2o)
