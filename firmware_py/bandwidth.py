# The bandwidth tracker: a kernel service that counts the bytes every memory tier of the
# board moves, by category, in a sliding window of preallocated buckets, polices
# per-category budgets (admission: a task that asks for more than its share of the window
# sleeps until the window has room, exactly, on the kernel's clock), and prices each move
# with the board profile's cost model (integer ns / µs, no float on the hot path), with
# contention between transfers that share a tier (a busy-until time per tier).
#
# The window: `buckets` buckets of `window_us // buckets` µs each; the window at time t is
# the bucket holding t and the buckets-1 before it. Bytes are counted in the bucket of the
# time they are charged; an admission that has to wait books its bytes in the bucket that
# starts at its grant time, which can lie up to `horizon` windows ahead (the ring holds
# buckets * (1 + horizon) buckets). Admissions of one (tier, category) are FIFO: a grant
# is never earlier than the grant before it, so the room a window has only grows with
# time from there and the earliest grant is found by walking the buckets once.
#
# DMA is a transport, not a category: a transfer is charged once, to its payload's
# category, on each tier it touches (charge_copy / admit_copy / move_copy), so the bytes
# moved always equal the bytes charged. The `dma` category is for the engine's own
# traffic (descriptor fetches, setup), not for payloads.
#
# Hot-path calls (charge*, admit*, wait_us, cost_*, occupy*, move*, snapshot) allocate
# nothing and return an int >= 0 or an E_* status with nothing changed; admit / admit_copy
# return BLOCK (yield it). Configuration (constructor, add_category, set_budget,
# apply_preset, tier_id, category_id) raises BandwidthError with one line.
from array import array

from firmware_py.compat import const, ticks_add, ticks_diff, TICKS_PERIOD
from firmware_py.status import OK, E_FULL, E_RANGE, INT_MAX, CARRY_N, MAX_WAIT_US

# built-in categories (ids); add_category() appends user categories after these
KV_READ = const(0)  # attention reads of cached K/V rows
KV_WRITE = const(1)  # the new token's K/V rows written
WEIGHTS = const(2)  # model weights read
IO = const(3)  # input/output: audio, network, telemetry buffers
DMA = const(4)  # the DMA engine's own traffic (descriptors, setup), not payloads
N_BUILTIN = const(5)
CATEGORY_NAMES = ("kv_read", "kv_write", "weights", "io", "dma")

# cost kinds: how the bytes move on a tier
K_READ = const(0)  # CPU sequential read (memcpy out of the tier)
K_WRITE = const(1)  # CPU sequential write (memcpy into the tier)
K_DMA = const(2)  # the DMA engine (GDMA) reads or writes the tier
K_LINE = const(3)  # CPU reads by cache line (scattered rows: one miss per line)
K_COPY = const(4)  # CPU copy within the tier (both ends on it)
N_KINDS = const(5)
KIND_NAMES = ("read", "write", "dma", "line", "copy")

# the source documents' split of a tier's bandwidth (permille of the tier's bandwidth)
PRESET_SPLIT = ((KV_READ, 400), (KV_WRITE, 250), (WEIGHTS, 300), (IO, 50))

CHARGE_MAX = const(0x1000000)  # most bytes one call may charge or price (16 MiB)
NO_BUDGET = const(-1)  # budget of a category that admission does not police

# per (tier, category) stats row fields (Bandwidth.st, NSTAT ints per row); a tier's
# all-categories row is category index n_cat
S_BYTES = const(0)  # bytes charged (booked) since boot, part below CARRY_N
S_BYTES_G = const(1)  # ... times CARRY_N
S_PEAK = const(2)  # largest window sum seen, bytes
S_WAITS = const(3)  # admissions that had to wait (throttled)
S_WAIT_US = const(4)  # total throttled time, µs part below 10**6
S_WAIT_S = const(5)  # ... whole seconds
S_REFUSED = const(6)  # charges / admissions refused (E_RANGE, E_FULL)
S_BUSY_US = const(7)  # tier row only: time the tier was busy with priced transfers, µs part
S_BUSY_S = const(8)  # ... whole seconds
S_STALLS = const(9)  # tier row only: transfers that found the tier busy and started later
S_STALL_US = const(10)  # tier row only: total time transfers waited for the tier, µs part
S_STALL_S = const(11)  # ... whole seconds
NSTAT = const(12)

# snapshot() row fields (NSNAP ints per (tier, category) row, then the tier's total row)
P_WINDOW = const(0)  # bytes in the window now
P_UTIL = const(1)  # P_WINDOW as permille of the tier's bandwidth over the window
P_PEAK = const(2)  # largest window sum seen, bytes
P_PEAK_UTIL = const(3)  # the same, permille
P_BUDGET = const(4)  # the category's budget per window, bytes (NO_BUDGET: not policed)
P_BYTES = const(5)  # bytes since boot, part below CARRY_N
P_BYTES_G = const(6)  # ... times CARRY_N
P_WAITS = const(7)  # throttled admissions
P_WAIT_US = const(8)  # total throttled time, µs part
P_WAIT_S = const(9)  # ... seconds
P_REFUSED = const(10)  # refusals
P_BUSY_US = const(11)  # tier row: busy time, µs part
P_BUSY_S = const(12)  # ... seconds
P_STALLS = const(13)  # tier row: transfers delayed by a busy tier
P_STALL_US = const(14)  # tier row: their total delay, µs part
P_STALL_S = const(15)  # ... seconds
NSNAP = const(16)
SNAP_FIELDS = ("window", "util_permille", "peak", "peak_permille", "budget", "bytes", "bytes_g",
               "waits", "wait_us", "wait_s", "refused", "busy_us", "busy_s", "stalls", "stall_us", "stall_s")

_US_PER_S = const(1000000)
_QK_MAX = const(0x100000)  # ns per KiB at most on the fast path (tiers of ~1 MB/s and up)
_QB_MAX = const(64000)  # ns per byte at most on the slow path (tiers of 15.6 kB/s and up)
_LAT_MAX = const(10000000)  # first-access latency at most 10 ms (keeps cost_us's intermediates < 2**30)
_SPAN_MAX = const(0x10000000)  # the ring (window + horizon) spans at most 2**28 us (~4.5 min)
_HALF = TICKS_PERIOD // 2  # half the tick circle (2**29 on the ESP32: a small int)


class BandwidthError(ValueError):
    # a configuration mistake with the tracker or the cost model; str() is one line
    pass


def _is_int(x):
    return x.__class__ is int


def _coef(bps, what):
    # (coefficient, slow) for bps bytes/s: ns per KiB, rounded (slow 0), or for tiers
    # under ~1 MB/s ns per byte (slow 1); configuration time (big ints allowed)
    if not _is_int(bps) or bps < 1:
        raise BandwidthError("%s: bytes per second must be a positive integer, got %r" % (what, bps))
    q = (1024 * 1000000000 + bps // 2) // bps
    if q <= _QK_MAX:
        return max(q, 1), 0
    q = (1000000000 + bps // 2) // bps
    if q > _QB_MAX:
        raise BandwidthError("%s: %d bytes/s is below the 15.6 kB/s the cost model supports" % (what, bps))
    return q, 1


class CostModel:
    # integer cost of moving bytes on each tier of a board, from the profile's cost
    # figures (board.Tier.cost, docs/tiers.md); coefficients are computed here, once
    def __init__(self, board):
        tiers = board.tiers
        nt = len(tiers)
        self.n_tiers = nt
        self.names = [t.name for t in tiers]  # tier id -> name
        self.qk = array("i", bytes(4 * nt * N_KINDS))  # [tier * N_KINDS + kind] ns per KiB, or per byte when slow
        self.slow = array("i", bytes(4 * nt * N_KINDS))  # [tier * N_KINDS + kind] 1: qk is ns per byte (a slow figure)
        self.lat = array("i", bytes(4 * nt))  # first-access latency per transfer, ns
        self.line_bytes = array("i", bytes(4 * nt))  # cache line, bytes
        self.line_ns = array("i", bytes(4 * nt))  # one line read: miss latency + its bytes at the stream rate, ns
        self.has_dma = array("i", bytes(4 * nt))  # 1 when a DMA engine can move the tier
        for i, t in enumerate(tiers):
            c = _tier_costs(t)
            where = "board %s: tier %s" % (board.name, t.name)
            for kind, field in ((K_READ, "read_bytes_per_s"), (K_WRITE, "write_bytes_per_s"),
                                (K_COPY, "copy_bytes_per_s"), (K_DMA, "dma_bytes_per_s")):
                v = c[field]
                if kind == K_DMA and not v:
                    continue  # no DMA engine: qk stays 0, cost_* refuse K_DMA
                q, slow = _coef(v, where + ": " + field)
                self.qk[i * N_KINDS + kind] = q
                self.slow[i * N_KINDS + kind] = slow
            self.has_dma[i] = 1 if c["dma_bytes_per_s"] else 0
            lb = c["line_bytes"]
            if not _is_int(lb) or lb < 1:
                raise BandwidthError("%s: line_bytes must be a positive integer, got %r" % (where, lb))
            if not _is_int(c["latency_ns"]) or not 0 <= c["latency_ns"] <= _LAT_MAX:
                raise BandwidthError("%s: latency_ns %r outside 0..10**7" % (where, c["latency_ns"]))
            self.line_bytes[i] = lb
            # one line: its miss latency plus its bytes at the stream rate (config time: big ints allowed)
            self.line_ns[i] = c["line_ns"] + (lb * 1000000000 + c["line_stream_bytes_per_s"] // 2) // c["line_stream_bytes_per_s"]
            self.lat[i] = c["latency_ns"]
            if self.line_ns[i] < 1 or self.line_ns[i] > 1000000:
                raise BandwidthError("%s: a cache line costs %d ns: outside 1..10**6" % (where, self.line_ns[i]))
        self.frac = 0  # ns below the whole µs the last _cost() rounded off (0..999)
        self.frac_tier = 0  # the tier whose cost set the pace of the last _copy_cost()

    # ns to move n bytes on tier by kind (K_*): latency + n at the kind's rate (K_LINE:
    # whole lines); 0 for n == 0; E_RANGE for a bad argument, a kind the tier has not (DMA
    # on a tier without it), or a result of 2**30 ns or more (use cost_us)
    def cost_ns(self, tier, kind, n):
        if not (_is_int(tier) and _is_int(kind) and _is_int(n)):
            return E_RANGE
        if tier < 0 or tier >= self.n_tiers or kind < 0 or kind >= N_KINDS or n < 0 or n > CHARGE_MAX:
            return E_RANGE
        if n == 0:
            return 0
        if kind == K_LINE:
            lines = (n + self.line_bytes[tier] - 1) // self.line_bytes[tier]
            c = self.line_ns[tier]
            if lines > (INT_MAX >> 1) // c:
                return E_RANGE
            return lines * c
        i = tier * N_KINDS + kind
        q = self.qk[i]
        if q == 0:
            return E_RANGE
        if self.slow[i]:
            if n > (INT_MAX >> 1) // q:
                return E_RANGE
            return n * q + self.lat[tier]
        kib = n >> 10
        if kib > (INT_MAX >> 1) // q:
            return E_RANGE
        return kib * q + (((n & 1023) * q) >> 10) + self.lat[tier]

    # µs (rounded down) to move n bytes on tier by kind; any n up to CHARGE_MAX; E_RANGE
    # as cost_ns, and for a result over 2**30 - 1 µs (a very slow tier). No intermediate
    # reaches 2**30 (31-bit small ints on the ESP32)
    def cost_us(self, tier, kind, n):
        return self._cost(tier, kind, n)

    # cost_us, and the ns it rounded off (0..999) left in self.frac (a remainder-carrying
    # caller adds them up: occupy with Bandwidth(carry_ns=True)); no allocation
    def _cost(self, tier, kind, n):
        if not (_is_int(tier) and _is_int(kind) and _is_int(n)):
            return E_RANGE
        if tier < 0 or tier >= self.n_tiers or kind < 0 or kind >= N_KINDS or n < 0 or n > CHARGE_MAX:
            return E_RANGE
        if n == 0:
            self.frac = 0
            return 0
        if kind == K_LINE:
            # lines * c ns = (lines // 1000) * c µs + (lines % 1000) * c ns; c <= 10**6
            lines = (n + self.line_bytes[tier] - 1) // self.line_bytes[tier]
            c = self.line_ns[tier]
            hi = lines // 1000
            if hi > INT_MAX // c:
                return E_RANGE
            hi *= c
            x = (lines % 1000) * c  # < 999 * 10**6 + ... < 2**30
        else:
            i = tier * N_KINDS + kind
            q = self.qk[i]
            if q == 0:
                return E_RANGE
            if self.slow[i]:  # q ns per byte, <= 64,000: (n // 1000) * q < 2**30 for n <= CHARGE_MAX
                hi = (n // 1000) * q
                x = (n % 1000) * q + self.lat[tier]
            else:  # q ns per KiB, <= 2**20: x <= 1000 * 2**20 + 10**7 < 2**30
                kib = n >> 10
                hi = (kib // 1000) * q
                x = (kib % 1000) * q + (((n & 1023) * q) >> 10) + self.lat[tier]
        lo = x // 1000
        if lo > INT_MAX - hi:
            return E_RANGE
        self.frac = x - lo * 1000
        return hi + lo

    # µs to copy n bytes from tier src to tier dst, by the CPU (dma=0) or by DMA (dma=1).
    # Two tiers: the slower side sets the pace (the profile's read figure of the source
    # and write figure of the destination are each measured as copies from / to SRAM;
    # by DMA, each tier's DMA figure). One tier: its copy figure (CPU), or its DMA cost
    # twice (DMA: read and write share the tier). E_RANGE as cost_us (and for a result
    # over 2**30 - 1 µs)
    def copy_us(self, src, dst, dma, n):
        return self._copy_cost(src, dst, dma, n)

    # copy_us, and the ns rounded off the side that sets the pace in self.frac (same-tier
    # DMA: twice its DMA cost's, 0..1998), its tier in self.frac_tier
    def _copy_cost(self, src, dst, dma, n):
        if dma.__class__ is not int and dma.__class__ is not bool:
            return E_RANGE
        self.frac_tier = src
        if src == dst and _is_int(src):
            if dma:
                a = self._cost(src, K_DMA, n)
                if a < 0:
                    return a
                if a > INT_MAX >> 1:
                    return E_RANGE
                self.frac *= 2
                return 2 * a
            return self._cost(src, K_COPY, n)
        if dma:
            b = self._cost(dst, K_DMA, n)
            fb = self.frac
            a = self._cost(src, K_DMA, n)
        else:
            b = self._cost(dst, K_WRITE, n)
            fb = self.frac
            a = self._cost(src, K_READ, n)
        if a < 0 or b < 0:
            return E_RANGE
        if b > a or (b == a and fb > self.frac):
            self.frac = fb
            self.frac_tier = dst
            return b
        return a


def _tier_costs(t):
    # a tier's cost figures as plain ints: the profile's cost block (board.py parses and
    # sources it), else derived from its bandwidth and latency (profiles without one)
    c = getattr(t, "cost", None)
    if c is not None:
        d = dict(c.values())
    else:
        bw = t.bandwidth
        d = {"read_bytes_per_s": bw, "write_bytes_per_s": bw, "copy_bytes_per_s": max(1, bw // 2),
             "dma_bytes_per_s": bw if t.dma else 0, "line_bytes": 32, "line_ns": t.latency_ns,
             "line_stream_bytes_per_s": bw}
    d["latency_ns"] = t.latency_ns
    return d


class Bandwidth(CostModel):
    # the tracker for one board: every tier of board.memory, N_BUILTIN + user_categories
    # categories. clock: the kernel's clock (now()); kernel: needed by admit/admit_copy.
    # window_us: the sliding window; buckets: its resolution; horizon: how many windows
    # ahead an admission may be booked (waits longer than that are refused E_FULL);
    # carry_ns: occupy / move carry each tier's rounded-off ns into its next transfer
    # (many small transfers then sum to their exact time; cost_us itself is unchanged)
    def __init__(self, board, clock=None, kernel=None, window_us=16000, buckets=16, horizon=1, user_categories=4,
                 carry_ns=False):
        CostModel.__init__(self, board)
        if kernel is not None and clock is None:
            clock = kernel.clock
        if clock is None:
            raise BandwidthError("bandwidth: a clock (or a kernel) is needed")
        for name, v, lo in (("window_us", window_us, 1), ("buckets", buckets, 1), ("horizon", horizon, 0),
                            ("user_categories", user_categories, 0)):
            if not _is_int(v) or v < lo:
                raise BandwidthError("bandwidth: %s must be an integer >= %d, got %r" % (name, lo, v))
        if window_us % buckets or window_us > 1000000:
            raise BandwidthError("bandwidth: window_us (%d) must be a multiple of buckets (%d) and at most 1 s"
                                 % (window_us, buckets))
        if window_us * (1 + horizon) > _SPAN_MAX:
            raise BandwidthError("bandwidth: window_us * (1 + horizon) = %d us: over 2**28 (choose a smaller horizon)"
                                 % (window_us * (1 + horizon)))
        self.clock = clock
        self.k = kernel  # the Kernel admissions block on, or None (admit refuses)
        self.window_us = window_us
        self.nb = buckets  # buckets in the window
        self.nr = buckets * (1 + horizon)  # buckets in the ring: the window + the booking horizon
        self.nf = buckets * horizon  # future buckets an admission may book into
        self.bucket_us = window_us // buckets
        self.n_cat_max = N_BUILTIN + user_categories  # category slots (rows per tier)
        self.n_cat = N_BUILTIN  # categories in use
        self.cat_names = list(CATEGORY_NAMES)  # category id -> name
        nt = self.n_tiers
        nrow = nt * self.n_cat_max
        # one tier's bucket, all categories together, holds at most this: every window sum,
        # a tier's all-categories one and its peak included, stays < 2**30
        self.bucket_max = INT_MAX // self.nr
        self.tb = array("i", bytes(4 * nt * self.nr))  # [tier * nr + slot] bytes per bucket, all categories
        self.b = array("i", bytes(4 * nrow * self.nr))  # [row * nr + slot] bytes per bucket
        self.win = array("i", bytes(4 * nrow))  # [row] bytes in the window (buckets up to now)
        self.twin = array("i", bytes(4 * nt))  # [tier] bytes in the window, all categories
        self.budget = array("i", [NO_BUDGET] * nrow)  # [row] admission budget per window, bytes
        self.lg = array("i", bytes(4 * nrow))  # [row] buckets from the current one to the last booked grant (0: none ahead)
        self.st = array("i", bytes(4 * nt * (self.n_cat_max + 1) * NSTAT))  # stats rows, see S_*
        self.busy = array("i", bytes(4 * nt))  # [tier] µs from `seen` until the tier is free (0: free)
        self.carry_ns = bool(carry_ns)  # occupy carries rounded-off ns per tier (opt-in)
        self.rem = array("i", bytes(4 * nt))  # [tier] ns carried into the tier's next transfer (carry_ns)
        self._pt = -1  # tier whose rem the pending transfer sets (-1: none), and to what
        self._pr = 0
        self.cap = array("i", bytes(4 * nt))  # [tier] bytes the tier moves in one window at its bandwidth
        self.unit = array("i", bytes(4 * nt))  # [tier] bytes per permille of cap (>= 1)
        self.bw = [t.bandwidth for t in board.tiers]  # [tier] bandwidth, bytes/s
        for i, t in enumerate(board.tiers):
            c = t.bandwidth * window_us // 1000000
            if c < 1 or c > INT_MAX:
                raise BandwidthError("bandwidth: tier %s moves %d bytes per %d us window: outside 1..2**30-1 "
                                     "(choose another window_us)" % (t.name, c, window_us))
            self.cap[i] = c
            self.unit[i] = max(1, c // 1000)
        self.slot = 0  # ring slot of the current bucket
        self.base = clock.now()  # ticks at which the current bucket began
        self.seen = self.base  # ticks of the last _advance (every mark above is relative to it)

    # --- configuration ---------------------------------------------------------------

    # tier id of the tier called name (BandwidthError when the board has none)
    def tier_id(self, name):
        for i, n in enumerate(self.names):
            if n == name:
                return i
        raise BandwidthError("bandwidth: board has no memory tier %r (has %s)" % (name, ", ".join(self.names)))

    # category id of name (BandwidthError when unknown)
    def category_id(self, name):
        for i in range(self.n_cat):
            if self.cat_names[i] == name:
                return i
        raise BandwidthError("bandwidth: no category %r (has %s)" % (name, ", ".join(self.cat_names)))

    # register a task's own category at boot; returns its id (BandwidthError when the
    # name is taken or every slot of user_categories is used)
    def add_category(self, name):
        if not isinstance(name, str) or not name:
            raise BandwidthError("bandwidth: a category name must be a non-empty string")
        if name in self.cat_names:
            raise BandwidthError("bandwidth: category %r exists" % name)
        if self.n_cat >= self.n_cat_max:
            raise BandwidthError("bandwidth: all %d user categories in use (Bandwidth(user_categories=))"
                                 % (self.n_cat_max - N_BUILTIN))
        self.cat_names.append(name)
        self.n_cat += 1
        return self.n_cat - 1

    # budget of (tier, cat) as permille of the tier's bandwidth over the window; None
    # removes it (admission then never waits). Returns the budget in bytes per window
    def set_budget(self, tier, cat, permille):
        self._check_tc(tier, cat)
        r = tier * self.n_cat_max + cat
        if permille is None:
            self.budget[r] = NO_BUDGET
            return NO_BUDGET
        if not _is_int(permille) or not 0 <= permille <= 1000:
            raise BandwidthError("bandwidth: a budget is 0..1000 permille, got %r" % (permille,))
        b = self.cap[tier] * permille // 1000
        self.budget[r] = b
        return b

    # set the budgets of a preset ((cat, permille), ...) on tier (name or id); the
    # default is the source documents' split (KV read 40 %, KV write 25 %, weights 30 %, I/O 5 %)
    def apply_preset(self, tier, preset=PRESET_SPLIT):
        if isinstance(tier, str):
            tier = self.tier_id(tier)
        for cat, pm in preset:
            self.set_budget(tier, cat, pm)

    def _check_tc(self, tier, cat):
        if not _is_int(tier) or not 0 <= tier < self.n_tiers:
            raise BandwidthError("bandwidth: no tier id %r (0..%d)" % (tier, self.n_tiers - 1))
        if not _is_int(cat) or not 0 <= cat < self.n_cat:
            raise BandwidthError("bandwidth: no category id %r (0..%d)" % (cat, self.n_cat - 1))

    # --- the window -------------------------------------------------------------------

    # move the window to now: buckets that left it are taken out of the sums and cleared
    # (they become the farthest future buckets), booked buckets that came due join the
    # sums, the grant and busy marks count down. O(rows) per bucket passed, at most the
    # ring's length; no allocation.
    # Idle gaps: the time since the last call is read as (now - seen) mod the tick
    # period (time only moves forward), exact for any gap below 2**30 µs (17.9 min); a
    # gap of at least the ring's span clears the window. Every mark is relative (µs or
    # buckets from `seen`), so none can ever read as lying ahead after the circle turns.
    # A gap of a whole multiple of the tick period with no call at all reads the same
    # ticks as no gap: poll() (or poll_task()) at least once per MAX_WAIT_US closes that
    def _advance(self):
        now = self.clock.now()
        e = ticks_diff(now, self.seen)
        if e == 0:
            return now
        if e < 0:  # more than half the circle: the gap is e mod the period
            e = (e + _HALF) + _HALF
        o = ticks_diff(self.seen, self.base)  # 0 .. bucket_us - 1: where the last call fell in its bucket
        self.seen = now
        busy = self.busy
        for tier in range(self.n_tiers):
            v = busy[tier]
            if v:
                busy[tier] = v - e if v > e else 0
        bu = self.bucket_us
        nr = self.nr
        if e >= nr * bu:  # everything in the ring has left: as if the ring's span passed
            d = nr * bu + (o + e % bu) % bu  # ... and the buckets stay on their grid
            self.base = ticks_add(now, -d)
        else:  # base <= the last call < now: d < span + one bucket
            d = ticks_diff(now, self.base)
        if d < bu:
            return now
        steps = d // bu
        self.base = ticks_add(self.base, steps * bu)
        nb = self.nb
        ncm = self.n_cat_max
        ncat = self.n_cat
        b = self.b
        tb = self.tb
        win = self.win
        twin = self.twin
        st = self.st
        slot = self.slot
        n = steps if steps < nr else nr
        for _ in range(n):
            slot += 1
            if slot == nr:
                slot = 0
            leave = slot - nb
            if leave < 0:
                leave += nr
            for tier in range(self.n_tiers):
                tw = twin[tier]
                r0 = tier * ncm
                tb[tier * nr + leave] = 0
                for c in range(ncat):
                    i = (r0 + c) * nr
                    v = b[i + leave]
                    if v:
                        win[r0 + c] -= v
                        tw -= v
                        b[i + leave] = 0
                    v = b[i + slot]
                    if v:
                        w = win[r0 + c] + v
                        win[r0 + c] = w
                        tw += v
                        s = ((tier * (ncm + 1)) + c) * NSTAT + S_PEAK
                        if w > st[s]:
                            st[s] = w
                twin[tier] = tw
                s = (tier * (ncm + 1) + ncm) * NSTAT + S_PEAK
                if tw > st[s]:
                    st[s] = tw
        if steps > nr:
            slot = (slot + (steps - nr) % nr) % nr
        self.slot = slot
        lg = self.lg
        for r in range(self.n_tiers * ncm):
            v = lg[r]
            if v:
                lg[r] = v - steps if v > steps else 0
        return now

    # advance the window and count down the marks now; OK. Cheap (O(tiers) unless a
    # bucket passed). Call it at least once per MAX_WAIT_US (~8.9 min) on a board that may
    # idle longer (the telemetry task, or spawn poll_task()); no allocation
    def poll(self):
        self._advance()
        return OK

    # a kernel task that polls the tracker every `every_us` µs (at most MAX_WAIT_US):
    # k.spawn("bwpoll", 0, bw.poll_task()); never ends (allocates once: the generator).
    # Configuration: BandwidthError at the call (every_us not an int 1..MAX_WAIT_US, no
    # kernel), before the generator is made
    def poll_task(self, every_us=MAX_WAIT_US):
        if not _is_int(every_us) or not 1 <= every_us <= MAX_WAIT_US:
            raise BandwidthError("bandwidth: poll_task every_us must be 1..%d, got %r" % (MAX_WAIT_US, every_us))
        return self._poll_gen(self._kernel(), every_us)

    def _poll_gen(self, k, every_us):
        while True:
            yield k.sleep_us(every_us)
            self._advance()

    # add n bytes to row r's bucket `off` buckets from now (0: the current one); the
    # caller checked room. Totals and peaks follow
    def _add(self, tier, c, off, n):
        ncm = self.n_cat_max
        r = tier * ncm + c
        slot = self.slot + off
        if slot >= self.nr:
            slot -= self.nr
        self.b[r * self.nr + slot] += n
        self.tb[tier * self.nr + slot] += n
        st = self.st
        s = (tier * (ncm + 1) + c) * NSTAT
        ts = (tier * (ncm + 1) + ncm) * NSTAT
        _carry(st, s + S_BYTES, s + S_BYTES_G, n)
        _carry(st, ts + S_BYTES, ts + S_BYTES_G, n)
        if off == 0:
            w = self.win[r] + n
            self.win[r] = w
            if w > st[s + S_PEAK]:
                st[s + S_PEAK] = w
            tw = self.twin[tier] + n
            self.twin[tier] = tw
            if tw > st[ts + S_PEAK]:
                st[ts + S_PEAK] = tw

    # True when n more bytes fit in tier's bucket `off` ahead: its all-categories sum stays
    # within bucket_max (so does every row's: it is part of that sum)
    def _fits(self, tier, off, n):
        slot = self.slot + off
        if slot >= self.nr:
            slot -= self.nr
        return self.tb[tier * self.nr + slot] + n <= self.bucket_max

    def _refuse(self, tier, c, code):
        s = (tier * (self.n_cat_max + 1) + c) * NSTAT + S_REFUSED
        if self.st[s] < INT_MAX:
            self.st[s] += 1
        return code

    def _ok_args(self, tier, c, n):
        return (_is_int(tier) and _is_int(c) and _is_int(n) and 0 <= tier < self.n_tiers
                and 0 <= c < self.n_cat and 0 <= n <= CHARGE_MAX)

    # --- charging: counts now, never blocks ----------------------------------------------

    # count n bytes of category cat on tier now; OK, or E_RANGE (bad tier/cat/n, or a
    # bucket would pass bucket_max) with nothing changed but the refusal count. O(1)
    # amortized (the window moves a bucket at a time), no allocation
    def charge(self, tier, cat, n):
        if not self._ok_args(tier, cat, n):
            if _is_int(tier) and _is_int(cat) and 0 <= tier < self.n_tiers and 0 <= cat < self.n_cat:
                return self._refuse(tier, cat, E_RANGE)
            return E_RANGE
        self._advance()
        if not self._fits(tier, 0, n):
            return self._refuse(tier, cat, E_RANGE)
        if n:
            self._add(tier, cat, 0, n)
        return OK

    # count a copy of n bytes of category cat from tier src to tier dst: n on each tier
    # (2n on one tier when src == dst: it is read and written); OK or E_RANGE, nothing changed
    # but the refusal count: as charge, counted in the (src, cat) row once src and cat are valid
    def charge_copy(self, src, dst, cat, n):
        if not (self._ok_args(src, cat, n) and self._ok_args(dst, cat, n)):
            if _is_int(src) and _is_int(cat) and 0 <= src < self.n_tiers and 0 <= cat < self.n_cat:
                return self._refuse(src, cat, E_RANGE)
            return E_RANGE
        self._advance()
        m = 2 * n if src == dst else n
        if not (self._fits(src, 0, m) and self._fits(dst, 0, m)):
            return self._refuse(src, cat, E_RANGE)
        if n:
            self._add(src, cat, 0, n)
            self._add(dst, cat, 0, n)
        return OK

    # --- admission: blocks until the window has room --------------------------------------

    # earliest bucket offset (0 = now) at which row r's window has room for n more bytes
    # under budget bud, not before its last booked grant; -1 when that lies past the
    # horizon. O(buckets), no allocation
    def _room(self, r, n, bud):
        s0 = self.lg[r]
        if s0 > self.nf:
            return -1
        s = self.win[r]
        if s0 == 0 and s + n <= bud:
            return 0
        b = self.b
        nr = self.nr
        nb = self.nb
        i0 = r * nr
        slot = self.slot
        for off in range(1, self.nf + 1):
            j = slot + off  # the bucket that joins the window ending off buckets ahead
            if j >= nr:
                j -= nr
            lv = j - nb  # the bucket that leaves it
            if lv < 0:
                lv += nr
            s += b[i0 + j] - b[i0 + lv]
            if off >= s0 and s + n <= bud:
                return off
        return -1

    # the offset at which (tier, cat) could take n bytes: >= 0, or E_RANGE (bad args, or
    # n over the whole budget: split it) / E_FULL (past the horizon)
    def _grant_off(self, tier, cat, n):
        if not self._ok_args(tier, cat, n):
            return E_RANGE
        r = tier * self.n_cat_max + cat
        bud = self.budget[r]
        if bud < 0:
            return 0
        if n > bud:
            return E_RANGE
        off = self._room(r, n, bud)
        return E_FULL if off < 0 else off

    # the largest admission (tier, cat) can take at once: its budget per window, or
    # CHARGE_MAX when it is not policed; callers split bigger moves into pieces this size
    def piece(self, tier, cat):
        if not (_is_int(tier) and _is_int(cat)) or not 0 <= tier < self.n_tiers or not 0 <= cat < self.n_cat:
            return E_RANGE
        b = self.budget[tier * self.n_cat_max + cat]
        return CHARGE_MAX if b < 0 or b > CHARGE_MAX else b

    # µs the calling task would wait now to be admitted n bytes of cat on tier: 0 (room
    # now), > 0, E_FULL (past the horizon) or E_RANGE; nothing changes
    def wait_us(self, tier, cat, n):
        now = self._advance()
        off = self._grant_off(tier, cat, n)
        if off <= 0:
            return off
        return ticks_diff(ticks_add(self.base, off * self.bucket_us), now)

    # admit n bytes of cat on tier if the window has room now: OK (charged), E_FULL (no
    # room now: nothing changed), E_RANGE (bad args, n over the budget)
    def admit_nowait(self, tier, cat, n):
        self._advance()
        off = self._grant_off(tier, cat, n)
        if off == 0:
            return self.charge(tier, cat, n)
        if off == E_RANGE and self._ok_args(tier, cat, 0):
            return self._refuse(tier, cat, E_RANGE)
        return E_FULL if off >= 0 or off == E_FULL else off

    # blocking admission (yield it): the task resumes with OK once n bytes of cat on tier
    # are admitted and charged: at once when the window has room, else at exactly the
    # start of the first bucket at which it has (the bytes are booked there now, so later
    # admissions queue behind: FIFO per (tier, cat)). E_RANGE: bad args, or n bigger than
    # the whole budget (split it). E_FULL: the grant would lie past the horizon (the
    # category is booked a whole window ahead); nothing changed on either refusal
    def admit(self, tier, cat, n):
        k = self._kernel()
        t = k._cur()
        now = self._advance()
        off = self._grant_off(tier, cat, n)
        if off >= 0 and not self._fits(tier, off, n):
            off = E_RANGE
        if off < 0:
            if self._ok_args(tier, cat, 0):
                self._refuse(tier, cat, off)
            return k._done_now(t, off)
        if n:
            self._add(tier, cat, off, n)
        if off == 0:
            return k._done_now(t, OK)
        when = self._book(tier, cat, off, now)
        return k.sleep_until(when)

    # admission of a copy of n bytes of cat from src to dst: booked on both tiers at the
    # first bucket where both windows have room; resumes with OK, E_RANGE or E_FULL as admit
    def admit_copy(self, src, dst, cat, n):
        k = self._kernel()
        t = k._cur()
        now = self._advance()
        m = 2 * n if src == dst else n
        a = self._grant_off(src, cat, m)
        b = self._grant_off(dst, cat, m)
        if a < 0 or b < 0:
            code = a if a < 0 else b
            if self._ok_args(src, cat, 0):
                self._refuse(src, cat, code)
            return k._done_now(t, code)
        off = a if a > b else b
        if not (self._fits(src, off, m) and self._fits(dst, off, m)):
            return k._done_now(t, self._refuse(src, cat, E_RANGE))
        if n:
            self._add(src, cat, off, n)
            self._add(dst, cat, off, n)
        if off == 0:
            return k._done_now(t, OK)
        when = self._book(src, cat, off, now)
        if dst != src:
            self._book(dst, cat, off, now)
        return k.sleep_until(when)

    def _kernel(self):
        k = self.k
        if k is None:
            raise BandwidthError("bandwidth: admission needs the kernel: Bandwidth(board, kernel=k)")
        return k

    # record a grant `off` buckets ahead for (tier, cat): last grant, throttled-wait stats;
    # returns the grant's ticks
    def _book(self, tier, cat, off, now):
        ncm = self.n_cat_max
        r = tier * ncm + cat
        when = ticks_add(self.base, off * self.bucket_us)
        self.lg[r] = off
        w = ticks_diff(when, now)
        st = self.st
        s = (tier * (ncm + 1) + cat) * NSTAT
        if st[s + S_WAITS] < INT_MAX:
            st[s + S_WAITS] += 1
        _add_us(st, s + S_WAIT_US, s + S_WAIT_S, w)
        s = (tier * (ncm + 1) + ncm) * NSTAT
        if st[s + S_WAITS] < INT_MAX:
            st[s + S_WAITS] += 1
        _add_us(st, s + S_WAIT_US, s + S_WAIT_S, w)
        return when

    # --- pricing with contention ----------------------------------------------------------

    # µs from now (self.seen: call _advance first) at which a transfer of `us` µs on tier
    # that cannot start before `after` ends: when the tier is free or at `after`, plus us.
    # E_RANGE when that lies past 2**30 - 1 µs. Changes nothing
    def _end(self, tier, us, after):
        b = self.busy[tier]
        start = b if b > after else after
        if us > INT_MAX - start:
            return E_RANGE
        return start + us

    # the tier is used for `us` µs by a transfer that may start `after` µs from now: it
    # starts then, or when the tier is free (after another transfer in flight), and ends
    # `us` later. Returns the µs from now to its end; marks the tier busy until then. The
    # caller checked _end() and called _advance()
    def _occupy(self, tier, us, after=0):
        ts = (tier * (self.n_cat_max + 1) + self.n_cat_max) * NSTAT
        st = self.st
        start = after
        b = self.busy[tier]
        if b > after:
            start = b
            if st[ts + S_STALLS] < INT_MAX:
                st[ts + S_STALLS] += 1
            _add_us(st, ts + S_STALL_US, ts + S_STALL_S, b - after)
        end = start + us
        if us > 0:
            self.busy[tier] = end
            _add_us(st, ts + S_BUSY_US, ts + S_BUSY_S, us)
        return end

    # the µs a transfer occupies its tier: cost_us, or with carry_ns that plus the tier's
    # carried ns; the new remainder waits in _pt/_pr until _commit(). E_RANGE as cost_us
    def _price(self, tier, kind, n):
        us = self._cost(tier, kind, n)
        self._pt = -1
        if us < 0 or not self.carry_ns:
            return us
        return self._carry_ns(tier, us)

    # the same for a copy (copy_us)
    def _price_copy(self, src, dst, dma, n):
        us = self._copy_cost(src, dst, dma, n)
        self._pt = -1
        if us < 0 or not self.carry_ns:
            return us
        return self._carry_ns(self.frac_tier, us)

    def _carry_ns(self, tier, us):
        v = self.rem[tier] + self.frac  # < 3,000
        c = v // 1000
        if c > INT_MAX - us:
            return E_RANGE
        self._pt = tier
        self._pr = v - c * 1000
        return us + c

    # the priced transfer goes ahead: its tier keeps the ns it rounded off
    def _commit(self):
        if self._pt >= 0:
            self.rem[self._pt] = self._pr
            self._pt = -1

    # µs from now until a transfer of n bytes on tier by kind completes, waiting for the
    # tier if another transfer holds it (contention); marks the tier busy. after: it
    # cannot start before that many µs from now (the caller's previous transfer, not yet
    # charged to the clock). E_RANGE as cost_us, or when it would end 2**30 µs or more
    # from now (nothing changed)
    def occupy(self, tier, kind, n, after=0):
        us = self._price(tier, kind, n)
        if us < 0 or not _is_int(after) or after < 0 or after > INT_MAX >> 2:
            return us if us < 0 else E_RANGE
        self._advance()
        if self._end(tier, us, after) < 0:
            return E_RANGE
        self._commit()
        return self._occupy(tier, us, after)

    # the same for a copy src -> dst (dma 0: CPU, 1: DMA): it starts when both tiers are
    # free and holds both until it ends
    def occupy_copy(self, src, dst, dma, n):
        us = self._price_copy(src, dst, dma, n)
        if us < 0:
            return us
        self._advance()
        if self._copy_end(src, dst, us) < 0:
            return E_RANGE
        self._commit()
        return self._occupy_copy(src, dst, us)

    # the tier that frees later decides the start of a copy (src on a tie)
    def _copy_lead(self, src, dst):
        return dst if self.busy[dst] > self.busy[src] else src

    def _copy_end(self, src, dst, us):
        return self._end(self._copy_lead(src, dst), us, 0)

    def _occupy_copy(self, src, dst, us):
        lead = self._copy_lead(src, dst)
        end = self._occupy(lead, us)
        if src != dst:
            self._hold(dst if lead == src else src, end)
        return end

    # hold tier busy until `end` µs from now (the other side of a copy): its busy time
    # counts from when it was free
    def _hold(self, tier, end):
        d = end - self.busy[tier]
        if d > 0:
            ts = (tier * (self.n_cat_max + 1) + self.n_cat_max) * NSTAT
            _add_us(self.st, ts + S_BUSY_US, ts + S_BUSY_S, d)
            self.busy[tier] = end

    # charge + occupy: count n bytes of cat on tier and return the µs until the transfer
    # (by kind) completes; the caller spends them (k.charge(us) for CPU work, sleep for
    # DMA). after: as occupy. E_RANGE with nothing changed
    def move(self, tier, kind, cat, n, after=0):
        us = self._price(tier, kind, n)
        if us < 0 or not _is_int(after) or after < 0 or after > INT_MAX >> 2:
            return us if us < 0 else E_RANGE
        self._advance()
        if self._end(tier, us, after) < 0:
            return E_RANGE
        r = self.charge(tier, cat, n)
        if r < 0:
            return r
        self._commit()
        return self._occupy(tier, us, after)

    # charge_copy + occupy_copy: the µs until the copy completes; E_RANGE, nothing changed
    def move_copy(self, src, dst, dma, cat, n):
        us = self._price_copy(src, dst, dma, n)
        if us < 0:
            return us
        self._advance()
        if self._copy_end(src, dst, us) < 0:
            return E_RANGE
        r = self.charge_copy(src, dst, cat, n)
        if r < 0:
            return r
        self._commit()
        return self._occupy_copy(src, dst, us)

    # --- stats ----------------------------------------------------------------------------

    # bytes of cat on tier in the window now (cat == -1: all categories); E_RANGE
    def window(self, tier, cat=-1):
        if not (_is_int(tier) and _is_int(cat)) or not 0 <= tier < self.n_tiers or not -1 <= cat < self.n_cat:
            return E_RANGE
        self._advance()
        if cat < 0:
            return self.twin[tier]
        return self.win[tier * self.n_cat_max + cat]

    # bytes as permille of tier's bandwidth over the window (no allocation)
    def permille(self, tier, nbytes):
        c = self.cap[tier]
        if nbytes < 1000000:
            return nbytes * 1000 // c
        return nbytes // self.unit[tier]

    # utilization of (tier, cat) now, permille of the tier's bandwidth; cat -1: all
    def utilization(self, tier, cat=-1):
        w = self.window(tier, cat)
        return w if w < 0 else self.permille(tier, w)

    # rows in a snapshot: per tier, n_cat category rows then one all-categories row
    def snapshot_rows(self):
        return self.n_tiers * (self.n_cat + 1)

    # fill out (array('i') of at least snapshot_rows() * NSNAP ints) with P_* rows; returns
    # the number of rows, or E_RANGE when out is too short. No allocation
    def snapshot(self, out):
        rows = self.snapshot_rows()
        if len(out) < rows * NSNAP:
            return E_RANGE
        self._advance()
        ncm = self.n_cat_max
        st = self.st
        o = 0
        for tier in range(self.n_tiers):
            for c in range(self.n_cat + 1):
                s = (tier * (ncm + 1) + (c if c < self.n_cat else ncm)) * NSTAT
                if c < self.n_cat:
                    w = self.win[tier * ncm + c]
                    out[o + P_BUDGET] = self.budget[tier * ncm + c]
                else:
                    w = self.twin[tier]
                    out[o + P_BUDGET] = NO_BUDGET
                out[o + P_WINDOW] = w
                out[o + P_UTIL] = self.permille(tier, w)
                out[o + P_PEAK] = st[s + S_PEAK]
                out[o + P_PEAK_UTIL] = self.permille(tier, st[s + S_PEAK])
                out[o + P_BYTES] = st[s + S_BYTES]
                out[o + P_BYTES_G] = st[s + S_BYTES_G]
                out[o + P_WAITS] = st[s + S_WAITS]
                out[o + P_WAIT_US] = st[s + S_WAIT_US]
                out[o + P_WAIT_S] = st[s + S_WAIT_S]
                out[o + P_REFUSED] = st[s + S_REFUSED]
                out[o + P_BUSY_US] = st[s + S_BUSY_US]
                out[o + P_BUSY_S] = st[s + S_BUSY_S]
                out[o + P_STALLS] = st[s + S_STALLS]
                out[o + P_STALL_US] = st[s + S_STALL_US]
                out[o + P_STALL_S] = st[s + S_STALL_S]
                o += NSNAP
        return rows

    # a new array sized for snapshot() (allocates: make it at boot)
    def new_snapshot(self):
        return array("i", bytes(4 * self.snapshot_rows() * NSNAP))

    # {tier: {category or "all": {field: int}}} with bytes / wait / busy / stall folded into
    # plain totals (allocates: hosts, reports)
    def report(self):
        out = self.new_snapshot()
        self.snapshot(out)
        rep = {}
        o = 0
        for tier in range(self.n_tiers):
            d = {}
            for c in range(self.n_cat + 1):
                name = self.cat_names[c] if c < self.n_cat else "all"
                row = {}
                row["window"] = out[o + P_WINDOW]
                row["util_permille"] = out[o + P_UTIL]
                row["peak"] = out[o + P_PEAK]
                row["peak_permille"] = out[o + P_PEAK_UTIL]
                row["budget"] = out[o + P_BUDGET]
                row["bytes"] = out[o + P_BYTES_G] * CARRY_N + out[o + P_BYTES]
                row["waits"] = out[o + P_WAITS]
                row["wait_us"] = out[o + P_WAIT_S] * _US_PER_S + out[o + P_WAIT_US]
                row["refused"] = out[o + P_REFUSED]
                if c == self.n_cat:
                    row["busy_us"] = out[o + P_BUSY_S] * _US_PER_S + out[o + P_BUSY_US]
                    row["stalls"] = out[o + P_STALLS]
                    row["stall_us"] = out[o + P_STALL_S] * _US_PER_S + out[o + P_STALL_US]
                d[name] = row
                o += NSNAP
            rep[self.names[tier]] = d
        return rep

    # report() as text lines, one per tier and category that moved anything (allocates)
    def lines(self):
        rep = self.report()
        res = []
        for tier in self.names:
            for name, row in rep[tier].items():
                if name != "all" and row["bytes"] == 0 and row["refused"] == 0:
                    continue
                s = "bw %s %-8s bytes %d window %d util %d.%d%% peak %d.%d%% waits %d wait_us %d" % (
                    tier, name, row["bytes"], row["window"], row["util_permille"] // 10, row["util_permille"] % 10,
                    row["peak_permille"] // 10, row["peak_permille"] % 10, row["waits"], row["wait_us"])
                if row["budget"] >= 0:
                    s += " budget %d" % row["budget"]
                if row["refused"]:
                    s += " refused %d" % row["refused"]
                if name == "all":
                    s += " busy_us %d stalls %d stall_us %d" % (row["busy_us"], row["stalls"], row["stall_us"])
                res.append(s)
        return res


def _carry(st, ilo, ihi, n):
    # add n (< 2**29) to the counter pair (lo below CARRY_N, hi) at st[ilo], st[ihi]; hi
    # saturates at INT_MAX (lo then stays at CARRY_N - 1)
    v = st[ilo] + n
    if v >= CARRY_N:
        if st[ihi] >= INT_MAX:
            st[ilo] = CARRY_N - 1
            return
        st[ihi] += 1  # n < CARRY_N: one carry at most
        v -= CARRY_N
    st[ilo] = v


def _add_us(st, iu, isec, us):
    # add us (0 .. 2**30 - 1) to the (µs, s) pair at st[iu], st[isec]; no allocation (the
    # whole seconds go first, so no sum passes 2**30); the seconds saturate at INT_MAX
    # (the µs then stay at 999,999)
    q = us // _US_PER_S
    v = st[iu] + us % _US_PER_S
    if v >= _US_PER_S:
        q += 1
        v -= _US_PER_S
    if q:
        s = st[isec]
        if q >= INT_MAX - s:
            st[isec] = INT_MAX
            st[iu] = _US_PER_S - 1
            return
        st[isec] = s + q
    st[iu] = v


class DecodeTraffic:
    # the byte traffic of one model decode step, charged to a tracker layer by layer
    # (docs/tiers.md): per layer its weights read from w_tier (WEIGHTS), the new token's
    # K/V row written (KV_WRITE) and every cached row read by the attention pass (KV_READ)
    # on kv_tier; after the last layer the final norm, the classifier and the embedding
    # row (WEIGHTS). Each call returns the µs the move takes by the cost model (with
    # contention: a DMA in flight on the tier delays it), which the decode task charges
    # to the clock when charge_time is set. admit: the decode task asks admission for
    # each piece first (Session.task), so a budget throttles the decode. No allocation
    def __init__(self, bw, layer_weight_bytes, final_weight_bytes, kv_row_bytes, w_tier, kv_tier,
                 kv_kind=K_READ, w_kind=K_READ, charge_time=True, admit=False):
        for name, v in (("layer_weight_bytes", layer_weight_bytes), ("final_weight_bytes", final_weight_bytes),
                        ("kv_row_bytes", kv_row_bytes)):
            if not _is_int(v) or v < 0:
                raise BandwidthError("decode traffic: %s must be an integer >= 0, got %r" % (name, v))
        if kv_kind not in (K_READ, K_LINE) or w_kind not in (K_READ, K_LINE):
            raise BandwidthError("decode traffic: reads are K_READ or K_LINE")
        self.bw = bw  # the Bandwidth tracker
        self.w_tier = w_tier if _is_int(w_tier) else bw.tier_id(w_tier)  # where the weights live
        self.kv_tier = kv_tier if _is_int(kv_tier) else bw.tier_id(kv_tier)  # where the KV blocks live
        self.layer_w = layer_weight_bytes  # weights read per layer, bytes
        self.final_w = final_weight_bytes  # weights read after the layers (norm, classifier, embedding row)
        self.row = kv_row_bytes  # K + V bytes of one token in one layer (as stored)
        self.kv_kind = kv_kind  # how the attention pass reads the cached rows
        self.w_kind = w_kind  # how the matvecs read the weights
        self.charge_time = charge_time  # the decode task charges the returned µs to its clock
        self.admit = admit  # the decode task asks admission before each piece
        self.us = 0  # µs of memory time charged so far, part below 10**6
        self.s = 0  # ... seconds
        self.bytes_w = 0  # weights bytes charged, part below CARRY_N
        self.bytes_w_g = 0  # ... times CARRY_N
        self.bytes_kv = 0  # KV bytes charged (read + write), part below CARRY_N
        self.bytes_kv_g = 0  # ... times CARRY_N
        self.refused = 0  # pieces the tracker refused (moved nothing, counted nowhere else here; saturates)

    # charge one layer with n cached tokens (the new one included): its weights, the new
    # K/V row, the attention pass's read of n rows, one after the other (one CPU: each
    # piece starts when the previous one ends). Returns the µs of the pieces moved (>= 0),
    # or E_RANGE with nothing charged for n not an int 0..CHARGE_MAX // row (the read
    # piece would pass CHARGE_MAX). Accounting of a refused piece: a piece the tracker
    # refuses (move/occupy returns E_RANGE: a bucket would pass bucket_max, a piece over
    # CHARGE_MAX, an end past 2**30 µs) moved nothing: it is counted in self.refused only,
    # adds no µs, and the next piece starts where the last moved one ended; bytes_w /
    # bytes_kv count the bytes charged, i.e. the moved pieces' bytes (charged=False), or,
    # with charged=True (the caller's admission already charged them, this call only books
    # the time), every piece's bytes as given. So a refusal never puts a status into the
    # totals, and the result is always what the caller should charge to its clock
    def layer(self, n, charged=False):
        row = self.row
        if not _is_int(n) or n < 0 or n > CHARGE_MAX or (row > 0 and n > CHARGE_MAX // row):
            return E_RANGE
        r = n * row
        us = self._piece(self.w_tier, self.w_kind, WEIGHTS, self.layer_w, 0, charged, True)
        us = self._piece(self.kv_tier, K_WRITE, KV_WRITE, row, us, charged, False)
        return self._piece(self.kv_tier, self.kv_kind, KV_READ, r, us, charged, False)

    # charge the step's end (final norm, classifier, embedding row); returns its µs (>= 0:
    # 0 when the tracker refused it, counted in self.refused, as in layer())
    def final(self, charged=False):
        return self._piece(self.w_tier, self.w_kind, WEIGHTS, self.final_w, 0, charged, True)

    # one piece of n bytes starting `after` µs from now (the previous piece's end); the
    # µs from now to its end (after itself when refused). w: weights (else KV) bytes
    def _piece(self, tier, kind, cat, n, after, charged, w):
        bw = self.bw
        if charged:
            end = bw.occupy(tier, kind, n, after)
        else:
            end = bw.move(tier, kind, cat, n, after)
        if end < 0:
            if self.refused < INT_MAX:
                self.refused += 1
            if not charged:
                return after  # nothing charged, nothing counted
            end = after  # bytes charged by the caller: counted below, no time
        if w:
            self._count(n, 0, end - after)
        else:
            self._count(0, n, end - after)
        return end

    # add w weights bytes, kvb KV bytes (each 0..CHARGE_MAX) and us µs (0..2**30 - 1; a
    # negative value counts as 0) to the totals: the bytes carry at CARRY_N into their _g
    # field, which saturates (the low part then stays at CARRY_N - 1), the µs carry into
    # seconds, which saturate (the µs then stay at 999,999). decode.Session's piecewise
    # charging (piece_bytes) calls it too; no allocation
    def _count(self, w, kvb, us):
        if w > 0:
            v = self.bytes_w + w
            if v >= CARRY_N:
                if self.bytes_w_g < INT_MAX:
                    self.bytes_w_g += 1
                    v -= CARRY_N
                else:
                    v = CARRY_N - 1
            self.bytes_w = v
        if kvb > 0:
            v = self.bytes_kv + kvb
            if v >= CARRY_N:
                if self.bytes_kv_g < INT_MAX:
                    self.bytes_kv_g += 1
                    v -= CARRY_N
                else:
                    v = CARRY_N - 1
            self.bytes_kv = v
        if us > 0:
            q = us // _US_PER_S
            v = self.us + us % _US_PER_S
            if v >= _US_PER_S:
                q += 1
                v -= _US_PER_S
            sec = self.s
            if q >= INT_MAX - sec:
                self.s = INT_MAX
                v = _US_PER_S - 1
            else:
                self.s = sec + q
            self.us = v

    # µs of memory time the model says one token takes at n cached tokens (no charging:
    # the prediction, docs/tiers.md), n_layers layers
    def token_us(self, n_layers, n):
        bw = self.bw
        us = n_layers * (bw.cost_us(self.w_tier, self.w_kind, self.layer_w) + bw.cost_us(self.kv_tier, K_WRITE, self.row)
                         + bw.cost_us(self.kv_tier, self.kv_kind, n * self.row))
        return us + bw.cost_us(self.w_tier, self.w_kind, self.final_w)
