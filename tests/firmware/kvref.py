# A reference model of the KV cache written from docs/memory.md, not from kv.py: per
# sequence a dict slot -> [position, [layer rows as bytes], score, int4 keys], fork as a
# deep copy, the pool as counts of abstract block ids. Plain Python that runs on
# MicroPython and CPython, plus the random program (drive) that runs every call of the
# API against a real cache and this model, comparing every result, every counter and
# every byte read back, with guard bytes around the arena and around read() destinations.
#
# int4 (KIVI) is modelled from its specification (docs/memory.md, kvkivi.py's header),
# not from its code: a key is an exact dyadic value (num, exp) = num * 2**exp in Python
# (big) ints, the residual a dict (slot in block, layer) -> K bytes, the fold computed
# with divisions where the firmware shifts; no parameter words, no nibbles.
from firmware_py import kv, status

OK = status.OK
E_FULL = status.E_FULL
E_NO_BLOCK = status.E_NO_BLOCK
E_STALE = status.E_STALE
E_NO_SLOT = status.E_NO_SLOT
E_RANGE = status.E_RANGE
E_STATE = status.E_STATE
E_EMPTY = status.E_EMPTY
SCORE_MAX = (1 << 29) - 1
GUARD = 64  # guard bytes on each side of the arena and of read() destinations
GUARD_BYTE = 0xA5


class Rng:
    # a 31-bit LCG (same sequence on both interpreters, no allocation beyond ints)
    def __init__(self, seed):
        self.x = (seed * 2654435761 + 12345) & 0x7FFFFFFF  # state

    # an int in lo .. hi inclusive
    def int(self, lo, hi):
        self.x = (self.x * 1103515245 + 12345) & 0x7FFFFFFF
        return lo + (self.x >> 4) % (hi - lo + 1)

    # one element of seq
    def pick(self, seq):
        return seq[self.int(0, len(seq) - 1)]


class Seq:
    # the model of one open sequence
    def __init__(self, policy, cap, sinks, recent, region, wm):
        self.policy = policy  # "full" / "window" / "sinks" / "h2o"
        self.cap = cap  # budget in tokens
        self.sinks = sinks  # sink positions kept forever (sinks, h2o)
        self.recent = recent  # newest positions protected (h2o)
        self.region = region  # pool region charged
        self.wm = wm  # filled-slot count that fires the watermark
        self.wm_fired = False  # the watermark fires once
        self.n = 0  # positions appended so far
        self.evictions = 0  # positions evicted so far
        self.reserved = None  # slot write() targets, or None
        self.slots = {}  # slot -> [position, [row bytes per layer], score, int4: [layer][channel] (num, exp) or None]
        self.blocks = {}  # table index -> abstract block id
        self.cur = None  # int4: table index of the block whose new keys are residual
        self.res = []  # int4: the slots whose key is residual (all in block cur)
        self.resbuf = {}  # int4: (slot % T, layer) -> the K bytes last put there (the residual)

    # the slot holding position pos, or None
    def slot_of(self, pos):
        for s, e in self.slots.items():
            if e[0] == pos:
                return s
        return None


class RefKV:
    # the whole cache: sequences by handle, block ids with reference counts and owners
    def __init__(self, layout, max_seqs, max_blocks, n_blocks, quotas):
        self.L = layout.n_layers  # layers per token
        self.row = layout.layer_row  # bytes per layer row
        self.kivi = layout.kivi  # int4: keys per channel per block, residual
        self.kd = layout.kv_dim  # channels per layer
        self.t = layout.tokens_per_block  # tokens per block
        self.max_seqs = max_seqs  # sequence slots
        self.max_slots = max_blocks * self.t  # most slots one sequence holds
        self.M = 2 * self.max_slots  # h2o: position n - M collides with n
        self.n_blocks = n_blocks  # pool size
        self.quota = list(quotas)  # blocks each region may hold
        self.refs = {}  # block id -> references
        self.owner = {}  # block id -> region
        self.next_id = 0  # next abstract block id
        self.seqs = {}  # handle -> Seq
        self.gen = [0] * max_seqs  # generation of each slot's next handle
        self.tag = 0  # the cache's number on its pool (the first cache: 0); docs: handles of
        # two caches on one pool differ in it. handle = (gen * max_seqs + slot) * 4 + tag
        self.gen_limit = (2 ** 30 - 1) // (max_seqs * 4)  # generations wrap here (docs/memory.md)
        self.open_idx = [None] * max_seqs  # handle open in each slot

    # blocks region r holds now
    def used(self, r):
        k = 0
        for b in self.owner:
            if self.owner[b] == r:
                k += 1
        return k

    # a block may be taken for region r now
    def can_alloc(self, r):
        return len(self.refs) < self.n_blocks and self.used(r) < self.quota[r]

    # take a fresh block id for region r
    def alloc(self, r):
        b = self.next_id
        self.next_id += 1
        self.refs[b] = 1
        self.owner[b] = r
        return b

    # drop one reference to block id b
    def unref(self, b):
        self.refs[b] -= 1
        if not self.refs[b]:
            del self.refs[b]
            del self.owner[b]

    # the block behind table index ti of s needs a copy before a write
    def shared(self, s, ti):
        return ti in s.blocks and self.refs[s.blocks[ti]] > 1

    # give s a private copy of table index ti (the data already is private in the model)
    def own(self, s, ti):
        old = s.blocks[ti]
        s.blocks[ti] = self.alloc(s.region)
        self.unref(old)

    def open(self, region, policy, cap, sinks, recent, wm_pct=80):
        # the handle or a status; KVError for a configuration the docs refuse
        if cap == 0:
            cap = self.max_slots
        if policy not in ("full", "window", "sinks", "h2o") or cap < 1 or cap > self.max_slots:
            raise kv.KVError("bad policy or budget")
        if policy in ("full", "window"):
            sinks, recent = 0, 0
        elif policy == "sinks":
            if not 0 < sinks < cap:
                raise kv.KVError("bad sinks")
            recent = cap - sinks
        else:
            if recent == 0:
                recent = cap // 2
            if sinks < 0 or recent < 1 or sinks + recent >= cap:
                raise kv.KVError("bad h2o split")
        idx = None
        for i in range(self.max_seqs):
            if self.open_idx[i] is None:
                idx = i
                break
        if idx is None:
            return E_NO_SLOT
        s = Seq(policy, cap, sinks, recent, region, (cap * wm_pct + 99) // 100)
        if policy != "full":
            nb = (cap + self.t - 1) // self.t
            if self.n_blocks - len(self.refs) < nb or self.quota[region] - self.used(region) < nb:
                return E_NO_BLOCK
            for ti in range(nb):
                s.blocks[ti] = self.alloc(region)
        h = (self.gen[idx] * self.max_seqs + idx) * 4 + self.tag
        self.open_idx[idx] = h
        self.seqs[h] = s
        return h

    def fork(self, h):
        if h.__class__ is not int or h not in self.seqs:  # docs: a non-int handle is E_STALE
            return E_STALE
        src = self.seqs[h]
        idx = None
        for i in range(self.max_seqs):
            if self.open_idx[i] is None:
                idx = i
                break
        if idx is None:
            return E_NO_SLOT
        if src.cur is not None:  # int4: the source's residual is quantized first (docs)
            self._fold(src)
        s = Seq(src.policy, src.cap, src.sinks, src.recent, src.region, src.wm)
        s.wm_fired, s.n, s.evictions = src.wm_fired, src.n, src.evictions
        for slot, e in src.slots.items():
            s.slots[slot] = [e[0], list(e[1]), e[2], None if e[3] is None else [list(k) for k in e[3]]]
        for ti, b in src.blocks.items():
            s.blocks[ti] = b
            self.refs[b] += 1
        nh = (self.gen[idx] * self.max_seqs + idx) * 4 + self.tag
        self.open_idx[idx] = nh
        self.seqs[nh] = s
        return nh

    def close(self, h):
        if h.__class__ is not int or h not in self.seqs:  # docs: a non-int handle is E_STALE
            return E_STALE
        s = self.seqs.pop(h)
        for b in s.blocks.values():
            self.unref(b)
        idx = (h // 4) % self.max_seqs
        self.open_idx[idx] = None
        self.gen[idx] = (self.gen[idx] + 1) % self.gen_limit
        return OK

    # the slot position n of s goes to (None under full at the budget), evicting the
    # docs' victim: ring arithmetic, or h2o's n - M / lowest score, ties to the oldest
    def _slot_for(self, s):
        n = s.n
        if n < s.cap:
            return n
        if s.policy == "full":
            return None
        if s.policy == "window":
            return n % s.cap
        if s.policy == "sinks":
            return s.sinks + (n - s.sinks) % (s.cap - s.sinks)
        if n - self.M >= s.sinks:
            old = s.slot_of(n - self.M)
            if old is not None:
                return old
        best = None
        for slot, e in s.slots.items():
            p = e[0]
            if s.sinks <= p < n - s.recent:
                if best is None or (e[2], p) < (s.slots[best][2], s.slots[best][0]):
                    best = slot
        return best

    # reserve (rows None: zero rows) or append (rows: the token's layer rows)
    def _take(self, h, rows):
        s = self.seqs[h]
        s.reserved = None
        slot = self._slot_for(s)
        if slot is None:
            return E_FULL
        ti = slot // self.t
        if ti not in s.blocks or self.shared(s, ti):
            if not self.can_alloc(s.region):
                return E_NO_BLOCK
            if ti in s.blocks:
                self.own(s, ti)
            else:
                s.blocks[ti] = self.alloc(s.region)
        flags = 0
        if s.n >= s.cap:
            flags |= kv.ST_EVICTED
            s.evictions += 1
        if self.kivi:  # a take in another block ends the residual of the current one
            if s.cur != ti:
                if s.cur is not None:
                    self._fold(s)
                s.cur = ti
            if slot not in s.res:
                s.res.append(slot)
            for layer in range(self.L):
                s.resbuf[(slot % self.t, layer)] = rows[layer][:4 * self.kd] if rows else bytes(4 * self.kd)
        s.slots[slot] = [s.n, rows or [bytes(self.row)] * self.L, 0, None]
        s.n += 1
        s.reserved = slot
        if not s.wm_fired and min(s.n, s.cap) >= s.wm:
            s.wm_fired = True
            flags |= kv.ST_WATERMARK
        return slot, flags

    def reserve(self, h):
        if h.__class__ is not int or h not in self.seqs:  # docs: a non-int handle is E_STALE
            return E_STALE
        r = self._take(h, None)
        return r if isinstance(r, int) else r[0]

    def append(self, h, src):
        if h.__class__ is not int or h not in self.seqs:  # docs: a non-int handle is E_STALE
            return E_STALE
        if len(src) < self.L * self.row:
            self.seqs[h].reserved = None
            return E_RANGE
        rows = [bytes(src[k * self.row:(k + 1) * self.row]) for k in range(self.L)]
        r = self._take(h, rows)
        return r if isinstance(r, int) else r[1]

    def write(self, h, layer, src, off):
        if h.__class__ is not int or h not in self.seqs:  # docs: a non-int handle is E_STALE
            return E_STALE
        if not 0 <= layer < self.L or off < 0 or off % 4 or off + self.row > len(src):
            return E_RANGE
        s = self.seqs[h]
        if s.reserved is None:
            return E_STATE
        ti = s.reserved // self.t
        if self.shared(s, ti):
            if not self.can_alloc(s.region):
                return E_NO_BLOCK
            self.own(s, ti)
        row = bytes(src[off:off + self.row])
        if self.kivi:
            if s.reserved not in s.res:  # folded by a fork: residual again, with what was put there
                if s.cur is not None and s.cur != ti:
                    self._fold(s)
                s.cur = ti
                s.res.append(s.reserved)
            s.resbuf[(s.reserved % self.t, layer)] = row[:4 * self.kd]
        s.slots[s.reserved][1][layer] = row
        return OK

    # the layer row read() gives for slot of s: as written; int4: K from the residual
    # or the dyadic keys as fp32, V as written
    def row_of(self, s, slot, layer):
        e = s.slots[slot]
        if not self.kivi:
            return e[1][layer]
        if slot in s.res:
            k = s.resbuf[(slot % self.t, layer)]
        else:
            k = b"".join(_u32_bytes(_dyadic_f32(v[0], v[1])) for v in e[3][layer])
        return k + e[1][layer][4 * self.kd:]

    # int4: quantize every live key of s's current block per channel (the spec's fold)
    def _fold(self, s):
        t = self.t
        live = sorted([sl for sl in s.slots if sl // t == s.cur])
        for sl in live:
            if s.slots[sl][3] is None:
                s.slots[sl][3] = [[(0, 0)] * self.kd for _ in range(self.L)]
        for layer in range(self.L):
            for c in range(self.kd):
                vals = []
                for sl in live:
                    if sl in s.res:
                        vals.append(_f32_dyadic(_bytes_u32(s.resbuf[(sl % t, layer)], 4 * c)))
                    else:
                        vals.append(s.slots[sl][3][layer][c])
                new = kivi_quantize(vals)
                for j in range(len(live)):
                    s.slots[live[j]][3][layer][c] = new[j]
        s.res = []
        s.cur = None

    # the slot of pos or a status, for locate and read
    def locate(self, h, pos):
        if h.__class__ is not int or h not in self.seqs:  # docs: a non-int handle is E_STALE
            return E_STALE
        s = self.seqs[h]
        if not 0 <= pos < s.n:
            return E_RANGE
        slot = s.slot_of(pos)
        return E_EMPTY if slot is None else slot

    # (status, row bytes or None) of read(h, pos, layer, dst of dst_len, off)
    def read(self, h, pos, layer, dst_len, off):
        if h.__class__ is not int or h not in self.seqs:  # docs: a non-int handle is E_STALE
            return E_STALE, None
        if not 0 <= layer < self.L or off < 0 or off % 4 or off + self.row > dst_len:
            return E_RANGE, None
        slot = self.locate(h, pos)
        if slot < 0:
            return slot, None
        return OK, self.row_of(self.seqs[h], slot, layer)

    # the entry of slot or a status
    def _entry(self, h, slot):
        if h.__class__ is not int or h not in self.seqs:  # docs: a non-int handle is E_STALE
            return E_STALE
        s = self.seqs[h]
        if not 0 <= slot < s.cap:
            return E_RANGE
        if slot not in s.slots:
            return E_EMPTY
        return s.slots[slot]

    def slot_pos(self, h, slot):
        e = self._entry(h, slot)
        return e if isinstance(e, int) else e[0]

    def score(self, h, slot):
        e = self._entry(h, slot)
        return e if isinstance(e, int) else e[2]

    def add_score(self, h, slot, v):
        if h.__class__ is int and h in self.seqs and not 0 <= v <= SCORE_MAX:
            return E_RANGE
        e = self._entry(h, slot)
        if isinstance(e, int):
            return e
        s = self.seqs[h]
        if self.shared(s, slot // self.t):
            if not self.can_alloc(s.region):
                return E_NO_BLOCK
            self.own(s, slot // self.t)
        e[2] = min(e[2] + v, SCORE_MAX)
        return OK

    # (status or None, row bytes or None) of row_offset: None when an offset is due
    def row_offset(self, h, slot, layer):
        if h.__class__ is not int or h not in self.seqs:  # docs: a non-int handle is E_STALE
            return E_STALE, None
        if not 0 <= layer < self.L:
            return E_RANGE, None
        e = self._entry(h, slot)
        if isinstance(e, int):
            return e, None
        if self.kivi:  # the stored row begins with the V part of the row as written
            return None, e[1][layer][4 * self.kd:]
        return None, e[1][layer]

    def length(self, h):
        return self.seqs[h].n if h.__class__ is int and h in self.seqs else E_STALE

    def cached(self, h):
        return min(self.seqs[h].n, self.seqs[h].cap) if h.__class__ is int and h in self.seqs else E_STALE

    def evictions(self, h):
        return self.seqs[h].evictions if h.__class__ is int and h in self.seqs else E_STALE

    def blocks_of(self, h):
        return len(self.seqs[h].blocks) if h.__class__ is int and h in self.seqs else E_STALE


# --- int4 (KIVI) from its specification -------------------------------------------

# the least n with |a| < 2**n (a an int)
def _bitlen(a):
    a = abs(a)
    n = 0
    while a:
        a //= 2
        n += 1
    return n


# the uint32 at byte o of b (little-endian)
def _bytes_u32(b, o):
    return b[o] + 256 * (b[o + 1] + 256 * (b[o + 2] + 256 * b[o + 3]))


def _u32_bytes(u):
    return bytes([u % 256, u // 256 % 256, u // 65536 % 256, u // 16777216])


# an fp32 bit pattern as the fold reads it, (num, exp): value num * 2**exp; exponent
# field 0 (zero, subnormal) is 0, 255 (inf, NaN) is read as 254
def _f32_dyadic(u):
    e = u // 8388608 % 256
    if e == 0:
        return (0, 0)
    if e == 255:
        e = 254
    num = u % 8388608 + 8388608
    return (-num if u >= 2147483648 else num, e - 150)


# the fp32 bit pattern of num * 2**exp (num has at most 24 bits): exact; +0 below 2**-126,
# the largest fp32 above it
def _dyadic_f32(num, exp):
    if num == 0:
        return 0
    sign = 2147483648 if num < 0 else 0
    a = abs(num)
    while a < 8388608:
        a *= 2
        exp -= 1
    be = exp + 150
    if be <= 0:
        return 0
    if be >= 255:
        return sign + 0x7F7FFFFF
    return sign + be * 8388608 + (a - 8388608)


# the fold of one channel: the values (num, exp) of a block's live slots -> their
# quantized values, as docs/memory.md specifies (E from the largest, X rounded half away
# from zero, at most 2047, LO = min X, STEP = ceil(range / 15), q to the nearest step)
def kivi_quantize(vals):
    tops = [exp + _bitlen(num) for num, exp in vals if num != 0]
    if not tops:
        return [(0, 0)] * len(vals)
    E = max(max(tops) - 11, -136)
    xs = []
    for num, exp in vals:
        if exp >= E:
            x = abs(num) * 2 ** (exp - E)
        else:
            x = (2 * abs(num) + 2 ** (E - exp)) // 2 ** (E - exp + 1)  # floor(|v| / 2**E + 1/2)
        xs.append(min(-x if num < 0 else x, 2047))
    lo = min(xs)
    step = -((lo - max(xs)) // 15)  # ceil((max - lo) / 15)
    assert 0 <= E + 136 <= 255 and -2048 <= lo <= 2047 and step < 512, "kivi parameters out of their fields"
    out = []
    for x in xs:
        q = 0 if step == 0 else (2 * (x - lo) + step) // (2 * step)
        assert 0 <= q <= 15
        out.append((lo + q * step, E))
    return out


def _guard_ok(buf, lo, hi):
    # every byte of buf[lo:hi] is the guard pattern
    for i in range(lo, hi):
        if buf[i] != GUARD_BYTE:
            return False
    return True


# Run `steps` random calls (every call of the API, misuse included) on a fresh cache
# and the model, checking each result; call(fn) runs a no-argument closure (the
# firmware test heap-locks it). Returns a dict of counts per call name. Raises
# AssertionError at the first difference.
def drive(seed, steps, call=None, layout=None, verify_every=8):
    from firmware_py import pool

    rnd = Rng(seed)
    if layout is None:
        layout = kv.Layout(2, 1, 4, rnd.pick(("fp32", "int8", "int4")), tokens_per_block=4)
    max_seqs, max_blocks, n_blocks = 4, 3, 10
    quotas = (4, 10)
    arena_bytes = layout.block_bytes * n_blocks
    big = bytearray(arena_bytes + 2 * GUARD)
    for i in range(len(big)):
        big[i] = GUARD_BYTE
    p = pool.Pool(layout.block_bytes, n_blocks, views=False, arena=memoryview(big)[GUARD:GUARD + arena_bytes])
    regions = [p.add_region(q) for q in quotas]
    c = kv.KVCache(p, layout, max_seqs=max_seqs, max_blocks_per_seq=max_blocks, h2o=True)
    m = RefKV(layout, max_seqs, max_blocks, n_blocks, quotas)
    row, lrow = layout.row_bytes, layout.layer_row
    src = bytearray(row + 8)  # a token row (+ slack so a short length can be tried)
    dbig = bytearray(lrow + 8 + 2 * GUARD)  # read() destination with guards
    A = [0, 0, 0, 0]  # arguments of the next call
    B = [None, None]  # buffer arguments of the next call
    R = [0]  # its result
    # one no-argument closure per call (a heap-locked caller cannot build argument tuples)
    def f_reserve():
        R[0] = c.reserve(A[0])

    def f_append():
        R[0] = c.append(A[0], B[0])

    def f_write():
        R[0] = c.write(A[0], A[1], B[0], A[2])

    def f_read():
        R[0] = c.read(A[0], A[1], A[2], B[1], A[3])

    def f_locate():
        R[0] = c.locate(A[0], A[1])

    def f_slot_pos():
        R[0] = c.slot_pos(A[0], A[1])

    def f_score():
        R[0] = c.score(A[0], A[1])

    def f_add_score():
        R[0] = c.add_score(A[0], A[1], A[2])

    def f_row_offset():
        R[0] = c.row_offset(A[0], A[1], A[2])

    def f_length():
        R[0] = c.length(A[0])

    def f_cached():
        R[0] = c.cached(A[0])

    def f_evictions():
        R[0] = c.evictions(A[0])

    def f_blocks_of():
        R[0] = c.blocks_of(A[0])

    def f_fork():
        R[0] = c.fork(A[0])

    def f_close():
        R[0] = c.close(A[0])

    fns = {"reserve": f_reserve, "append": f_append, "write": f_write, "read": f_read, "locate": f_locate,
           "slot_pos": f_slot_pos, "score": f_score, "add_score": f_add_score, "row_offset": f_row_offset,
           "length": f_length, "cached": f_cached, "evictions": f_evictions, "blocks_of": f_blocks_of,
           "fork": f_fork, "close": f_close}
    names = ("open", "open", "fork", "close", "reserve", "reserve", "write", "write", "write", "append",
             "append", "append", "read", "read", "locate", "slot_pos", "score", "add_score", "add_score",
             "row_offset", "length", "cached", "evictions", "blocks_of")
    stale = []  # handles closed so far
    counts = {}
    tag = [0]

    def handle():
        # an open handle mostly; sometimes a stale one or garbage
        k = rnd.int(0, 19)
        if m.seqs and k < 16:
            return rnd.pick(sorted(m.seqs))
        if stale and k < 19:
            return rnd.pick(stale)
        return rnd.pick((-1, -7, 3, 10 ** 6, (1 << 30) + 1, 1 << 70, 0.0, 1.0, True))

    def fill(n):
        # src's first n bytes = a fresh pattern
        tag[0] += 1
        for i in range(n):
            src[i] = (tag[0] * 31 + i * 7) & 255

    for step in range(steps):
        name = rnd.pick(names)
        counts[name] = counts.get(name, 0) + 1
        h = handle()
        A[0] = h
        want = None
        snap = bytes(big)
        if name == "open":
            pol = rnd.pick(kv.POLICIES)
            cap = rnd.int(0, 13)
            sinks = rnd.int(0, 4)
            recent = rnd.int(0, 5) if pol == "h2o" else 0
            r = rnd.int(0, 1)
            try:
                want = m.open(r, pol, cap, sinks, recent)
            except kv.KVError:
                want = "KVError"
            try:
                got = c.open(regions[r], pol, cap, sinks, recent)
            except kv.KVError:
                got = "KVError"
            assert got == want, "step %d open(%d, %s, %d, %d, %d): got %r, want %r" % (step, r, pol, cap, sinks, recent, got, want)
        else:
            if name == "append":
                n = row if rnd.int(0, 9) else rnd.int(0, row - 1)
                fill(row)
                B[0] = memoryview(src)[0:n]
                want = m.append(h, B[0])
            elif name == "write":
                A[1] = rnd.int(-1, layout.n_layers) if rnd.int(0, 5) == 0 else rnd.int(0, layout.n_layers - 1)
                A[2] = rnd.pick((0, 4, 2, -4, row - lrow + 4)) if rnd.int(0, 5) == 0 else rnd.int(0, layout.n_layers - 1) * lrow
                fill(row)
                B[0] = src if rnd.int(0, 7) else memoryview(src)[0:lrow - 4]
                want = m.write(h, A[1], B[0], A[2])
            elif name in ("read", "locate"):
                hi = m.seqs[h].n if h in m.seqs else 4
                A[1] = rnd.int(-2, hi + 1) if rnd.int(0, 5) == 0 else rnd.int(0, max(hi - 1, 0))
                A[2] = rnd.int(-1, layout.n_layers) if rnd.int(0, 7) == 0 else rnd.int(0, layout.n_layers - 1)
                A[3] = rnd.pick((0, 4, 8, 2, -4)) if rnd.int(0, 7) == 0 else 0
                for i in range(len(dbig)):
                    dbig[i] = GUARD_BYTE
                dlen = lrow + 8 if rnd.int(0, 7) else lrow - 4
                B[1] = memoryview(dbig)[GUARD:GUARD + dlen]
                if name == "read":
                    want = m.read(h, A[1], A[2], dlen, A[3])
                else:
                    want = m.locate(h, A[1])
            elif name in ("slot_pos", "score", "add_score", "row_offset"):
                cap = m.seqs[h].cap if h in m.seqs else 4
                A[1] = rnd.int(-2, cap + 2) if rnd.int(0, 5) == 0 else rnd.int(0, cap - 1)
                if name == "add_score":
                    A[2] = rnd.pick((-1, SCORE_MAX, SCORE_MAX + 1)) if rnd.int(0, 9) == 0 else rnd.int(0, 3)
                    want = m.add_score(h, A[1], A[2])
                elif name == "row_offset":
                    A[2] = rnd.int(-1, layout.n_layers) if rnd.int(0, 7) == 0 else rnd.int(0, layout.n_layers - 1)
                    want = m.row_offset(h, A[1], A[2])
                else:
                    want = getattr(m, name)(h, A[1])
            else:
                want = getattr(m, name)(h)
            if call is None:
                fns[name]()
            else:
                call(fns[name])
            got = R[0]
            if name == "read":
                st, data = want
                assert got == st, "step %d read: got %d, want %d" % (step, got, st)
                if st == OK:
                    o = GUARD + A[3]
                    assert bytes(dbig[o:o + lrow]) == data, "step %d read: bytes differ" % step
                    assert _guard_ok(dbig, 0, o) and _guard_ok(dbig, o + lrow, len(dbig)), "step %d read wrote outside its row" % step
                else:
                    assert _guard_ok(dbig, 0, len(dbig)), "step %d refused read wrote into dst" % step
            elif name == "row_offset":
                st, data = want
                if st is None:
                    assert got >= 0, "step %d row_offset: got %d" % (step, got)
                    assert bytes(big[GUARD + got:GUARD + got + len(data)]) == data, "step %d row_offset: bytes differ" % step
                else:
                    assert got == st, "step %d row_offset: got %d, want %d" % (step, got, st)
            else:
                assert got == want, "step %d %s(%r, %r, %r): got %r, want %r" % (step, name, h, A[1], A[2], got, want)
            if name == "close" and got == OK:
                stale.append(h)
            if got < 0:
                assert bytes(big) == snap, "step %d: refused %s changed the arena" % (step, name)
        # guards, pool counts, and (every few steps) every cached byte of every sequence
        assert _guard_ok(big, 0, GUARD) and _guard_ok(big, GUARD + arena_bytes, len(big)), "step %d %s wrote outside the arena" % (step, name)
        assert p.blocks_used == len(m.refs), "step %d pool: %d used, model %d" % (step, p.blocks_used, len(m.refs))
        for k in range(len(regions)):
            assert p.region_used[regions[k]] == m.used(k), "step %d region %d" % (step, k)
        if layout.kivi:  # the fold never copies: a block holding residual keys is private
            for hh, s in m.seqs.items():
                k = c.current_block(hh)
                assert (k if k >= 0 else None) == s.cur, "step %d current block of %d" % (step, hh)
                assert k < 0 or p.ref[c.block_at(hh, k)] == 1, "step %d: a block with residual keys is shared" % step
        if step % verify_every == 0:
            out = bytearray(lrow)
            for hh, s in m.seqs.items():
                assert c.length(hh) == s.n and c.cached(hh) == min(s.n, s.cap)
                for pos in range(s.n):
                    slot = s.slot_of(pos)
                    assert c.locate(hh, pos) == (E_EMPTY if slot is None else slot), "step %d locate(%d, %d)" % (step, hh, pos)
                    if slot is not None:
                        for layer in range(layout.n_layers):
                            assert c.read(hh, pos, layer, out, 0) == OK
                            assert bytes(out) == m.row_of(s, slot, layer), "step %d seq %d pos %d layer %d bytes" % (step, hh, pos, layer)
    for hh in list(m.seqs):
        assert c.close(hh) == OK
        m.close(hh)
    assert p.blocks_used == 0 and p.blocks_free == n_blocks, "blocks leaked"
    return counts
