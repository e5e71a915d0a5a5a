# The DMA descriptor queue: a kernel service modelled on the ESP32-S3's GDMA.
#
# Buffers are registered at boot (add_buffer: a bytearray, a window of one or a pool's arena,
# and the tier it lives in) and named by id afterwards, so a request allocates nothing. A request is one
# descriptor in a fixed ring of `slots` descriptors kept in one array('i'): source buffer
# and offset, destination buffer and offset, length (1..4,095 bytes, the GDMA descriptor's
# limit), payload category, the two tiers, and its completion cookie.
#
#   cookie = q.submit_nowait(src, soff, dst, doff, n, cat)   # >= 0, or E_FULL / E_RANGE
#   cookie = yield q.submit(src, soff, dst, doff, n, cat)     # blocks while the ring is full
#   rv = yield q.wait(cookie)                                 # OK once its bytes have landed
#   q.done(cookie)                                            # 1 done, 0 pending, E_RANGE
#   k.spawn("dma", 6, q.engine())                             # or q.spawn(prio)
#
# Backpressure: a full ring blocks the producer (its stall time is counted); nothing is
# ever dropped. Blocked producers are admitted in priority order, FIFO within a priority,
# and a submit never overtakes a producer that is already waiting.
#
# The engine task takes the oldest descriptor and, with merging on, every following one
# that continues it on both sides (same source and destination buffers, the next starting
# where the previous ends on both, same category) while the burst stays within max_burst
# bytes: one burst is one GDMA transaction (one setup cost), a chain of ceil(len / 4,095)
# hardware descriptors (PSRAM: of whole 32-byte lines). Its ring slots free at once (the
# burst is kept in its own record), so producers refill the ring while it is in flight.
# The burst is charged to the bandwidth tracker once, to its category, on each tier it
# touches (DMA is a transport, not a category); on the virtual clock the engine sleeps for
# the tracker's cost of the burst, then copies the bytes (viper word or byte loop, no
# slices) and completes its descriptors in submission order, waking their waiters.
# Completion is in order, so a cookie is done once the completion count has passed it:
# no per-request storage.
#
# Alignment enforced (E_RANGE otherwise): on a side whose buffer lives in PSRAM, the offset
# and the length are multiples of 32 bytes (ESP32-S3 GDMA external-memory block size), so
# the largest PSRAM descriptor is 4,064 bytes; SRAM sides take any offset. The buffer's own
# start counts as aligned (MicroPython cannot place a bytearray; the emulator models it);
# add_buffer refuses a window whose address is not a multiple of 4 (the engine's word copy
# would fault on the chip), on every interpreter.
# A descriptor whose source and destination overlap in one buffer is E_RANGE.
#
# Hot paths (submit, submit_nowait, wait, done, the engine's loop, snapshot) allocate
# nothing on MicroPython: tests/firmware/fw_dma.py runs them with the heap locked.
from array import array

from firmware_py.compat import const, micropython, misaligned, ptr8, ptr32, ticks_diff, buffer_writable
from firmware_py.status import OK, E_FULL, E_RANGE, INT_MAX, CARRY_N
from firmware_py.sched.task import FOREVER, TIMEOUT, SchedError, TaskList  # noqa: F401 - TIMEOUT re-exported

DESC_MAX = const(4095)  # bytes one GDMA descriptor moves at most (12-bit length field)
PSRAM_ALIGN = const(32)  # offset and length alignment on a PSRAM side (external-memory block)
DEFAULT_SLOTS = const(32)  # descriptors in the ring
DEFAULT_MAX_BURST = const(16384)  # bytes one merged burst may move
MAX_BURST_LIMIT = const(1048576)  # largest max_burst accepted (keeps sums far below 2**30)
MAX_BUFFERS = const(64)  # registered buffers at most
_NCAT = const(16)  # categories accepted when no tracker names them
DESC_BYTES = const(12)  # one GDMA descriptor in internal RAM: config/size/length word, buffer, next
BW_K_DMA = const(2)  # bandwidth.K_DMA (the cost model's kind for the DMA engine; fw_dma checks it)
BW_CAT_DMA = const(4)  # bandwidth.DMA (the engine's own traffic; fw_dma checks it)

# descriptor words (one ring slot = NW ints)
F_SRC = const(0)  # source buffer id
F_SOFF = const(1)  # source byte offset
F_DST = const(2)  # destination buffer id
F_DOFF = const(3)  # destination byte offset
F_LEN = const(4)  # bytes, 1..DESC_MAX
F_CAT = const(5)  # payload category (the tracker's number)
F_TIERS = const(6)  # source tier | destination tier << 8
F_COOKIE = const(7)  # completion cookie (submission number, wraps at 2**30)
NW = const(8)
_W_T0 = const(8)  # stash rows only: tick at which the producer blocked
_W_TMO = const(9)  # stash rows only: its timeout (-1 forever): what a timed-out wait cost
_W_PEND = const(10)  # stash rows only: 1 while its wait is not yet accounted
_NSTASH = const(11)

# stats (q.st, array('i'); the field numbers are fixed: firmware_py/telemetry.py reads
# them). Every field stays a small int on the ESP32 (< 2**30, docs/conventions.md), so a
# bump never allocates: event counters carry into their _G field at CARRY_N, as the
# kernel's, and a _G field saturates at INT_MAX (its low field then stays at CARRY_N - 1:
# ~10**18 events, never reached); times carry µs into whole seconds, which saturate the
# same way (34 years); FULL and REFUSED, which have no _G field, saturate at INT_MAX
# (2**30 - 1: ~18 minutes of a producer polling a full ring at 10**6 a second); DEPTH and
# MAX_DEPTH are at most the ring's slots.
ST_SUBMITTED = const(0)  # descriptors accepted
ST_SUBMITTED_G = const(1)
ST_MERGED = const(2)  # descriptors that joined a burst behind its first one
ST_MERGED_G = const(3)
ST_BURSTS = const(4)  # transactions started (one setup cost each)
ST_BURSTS_G = const(5)
ST_BYTES = const(6)  # bytes moved (== bytes charged to the tracker, once per tier touched)
ST_BYTES_G = const(7)
ST_LINKS = const(8)  # GDMA hardware descriptors the bursts chained (<= 4,095 B each)
ST_LINKS_G = const(9)
ST_COMPLETED = const(10)  # descriptors completed (their bytes landed, waiters woken)
ST_COMPLETED_G = const(11)
ST_STALLS = const(12)  # producer waits on a full ring
ST_STALLS_G = const(13)
ST_STALL_US = const(14)  # producer stall time, µs part
ST_STALL_S = const(15)  # ... whole seconds
ST_MAX_DEPTH = const(16)  # most descriptors ever waiting in the ring
ST_DEPTH = const(17)  # descriptors in the ring now (not the burst in flight)
ST_FULL = const(18)  # submits refused with E_FULL (nowait, or timeout 0); saturates at INT_MAX
ST_REFUSED = const(19)  # submits refused with E_RANGE; saturates at INT_MAX
ST_BUSY_US = const(20)  # modelled engine busy time, µs part
ST_BUSY_S = const(21)  # ... whole seconds
NST = const(22)
STAT_NAMES = ("submitted", "submitted_g", "merged", "merged_g", "bursts", "bursts_g", "bytes", "bytes_g",
              "links", "links_g", "completed", "completed_g", "stalls", "stalls_g", "stall_us", "stall_s",
              "max_depth", "depth", "full", "refused", "busy_us", "busy_s")

_US_PER_S = const(1000000)
_HALF = const(0x20000000)  # cookies within half the 2**30 circle of the newest are comparable
W_DMA = const(9)  # Task.wkind while blocked in this module (the kernel only special-cases sleep/mutex)


class DMAError(SchedError):
    # a configuration mistake with the DMA queue; str() is one line
    pass


@micropython.viper
def _copy8(dst, doff: int, src, soff: int, n: int):
    # dst[doff:doff+n] = src[soff:soff+n] forward, byte by byte; no allocation
    d = ptr8(dst)
    s = ptr8(src)
    i = 0
    while i < n:
        d[doff + i] = s[soff + i]
        i += 1


@micropython.viper
def _copy32(dst, dword: int, src, sword: int, n: int):
    # dst words [dword, dword + n) = src words [sword, ...), forward, 4 per turn; no allocation
    d = ptr32(dst)
    s = ptr32(src)
    e4 = dword + n - 3
    end = dword + n
    while dword < e4:
        d[dword] = s[sword]
        d[dword + 1] = s[sword + 1]
        d[dword + 2] = s[sword + 2]
        d[dword + 3] = s[sword + 3]
        dword += 4
        sword += 4
    while dword < end:
        d[dword] = s[sword]
        dword += 1
        sword += 1


# bytes src[soff:] -> dst[doff:], words when all three and both buffers' addresses are
# multiples of 4 (a word access at an unaligned address faults on the chip: a window at an
# odd offset is copied byte by byte), forward (the same result as copying the merged
# descriptors one after another); no allocation
def copy_bytes(dst, doff, src, soff, n):
    if (doff | soff | n) & 3 or misaligned(dst, 3) or misaligned(src, 3):
        _copy8(dst, doff, src, soff, n)
    else:
        _copy32(dst, doff >> 2, src, soff >> 2, n >> 2)


# cookie c + n on the 2**30 circle, never leaving the ESP32's small ints (c + n itself
# may not fit); no allocation
def _after(c, n):
    if c > INT_MAX - n:
        return c - INT_MAX - 1 + n
    return c + n


# st[i] += n (0 <= n < 2**30 - CARRY_N) carrying into st[i + 1] at CARRY_N; st[i + 1]
# saturates at INT_MAX (st[i] then stays at CARRY_N - 1); no allocation
def _add(st, i, n):
    v = st[i] + n
    if v >= CARRY_N:
        c = v // CARRY_N
        v %= CARRY_N
        g = st[i + 1]
        if g > INT_MAX - c:
            st[i + 1] = INT_MAX
            v = CARRY_N - 1
        else:
            st[i + 1] = g + c
    st[i] = v


# st[i] (µs) += us (0 <= us < 2**30 - 10**6) carrying whole seconds into st[i + 1],
# which saturates at INT_MAX (st[i] then stays at 999,999); no allocation
def _add_us(st, i, us):
    v = st[i] + us
    if v >= _US_PER_S:
        c = v // _US_PER_S
        v %= _US_PER_S
        g = st[i + 1]
        if g > INT_MAX - c:
            st[i + 1] = INT_MAX
            v = _US_PER_S - 1
        else:
            st[i + 1] = g + c
    st[i] = v


# st[i] += 1 saturating at INT_MAX (a counter with no carry field); no allocation
def _bump(st, i):
    if st[i] < INT_MAX:
        st[i] += 1


class DMAQueue:
    # k: the Kernel. slots: ring size. max_burst: bytes a merged burst may move. merge:
    # False executes every descriptor as its own burst. bw: the bandwidth tracker
    # (firmware_py/bandwidth.Bandwidth) or None (nothing charged, no time modelled; tier
    # numbers are then 0 = SRAM, 1 = PSRAM). board: the board profile (firmware_py/board.py)
    # whose tiers the tier numbers index, as the tracker's do: it gives each tier's
    # alignment (32 for kind psram, else 1), which tiers have DMA, and where descriptors
    # live (the first sram tier). admit: the engine asks the tracker's admission for each
    # burst (it waits while the category's budget on either tier is spent) instead of
    # charging it at once. model_time: the engine sleeps for each burst's modelled cost
    # (default: on a virtual clock; on a real clock the CPU copy takes its own time)
    def __init__(self, k, slots=DEFAULT_SLOTS, max_burst=DEFAULT_MAX_BURST, merge=True, bw=None, board=None,
                 admit=False, model_time=None, tier_align=None):
        for name, v, lo, hi in (("slots", slots, 1, 4096), ("max_burst", max_burst, 1, MAX_BURST_LIMIT)):
            if v.__class__ is not int or not lo <= v <= hi:
                raise DMAError("dma: %s must be an int in %d..%d, got %r" % (name, lo, hi, v))
        self.k = k  # owning Kernel
        self.slots = slots  # ring capacity, descriptors
        self.max_burst = max_burst  # bytes per merged burst at most
        self.merge = bool(merge)  # merge contiguous descriptors into bursts
        self.bw = bw  # bandwidth tracker, or None
        if bw is not None and board is None:
            raise DMAError("dma: a tracker needs its board (DMAQueue(k, bw=bw, board=board))")
        if board is not None and bw is not None and len(board.tiers) != bw.n_tiers:
            raise DMAError("dma: the board has %d tiers, the tracker %d" % (len(board.tiers), bw.n_tiers))
        if tier_align is None:
            tier_align = (1, PSRAM_ALIGN) if board is None else \
                tuple(PSRAM_ALIGN if t.kind == "psram" else 1 for t in board.tiers)
        self.tier_align = tuple(tier_align)  # tier number -> alignment in bytes (1 = any)
        self.tier_dma = tuple(True for _ in self.tier_align) if board is None else tuple(t.dma for t in board.tiers)
        self.desc_tier = 0  # tier the hardware descriptors are fetched from (internal RAM)
        if board is not None:
            for i, t in enumerate(board.tiers):
                if t.kind == "sram":
                    self.desc_tier = i
                    break
        self.admit = bool(admit)  # bursts go through the tracker's admission
        if self.admit and (bw is None or bw.k is not k):
            raise DMAError("dma: admit needs a tracker on this kernel (Bandwidth(board, kernel=k))")
        for a in self.tier_align:
            if a.__class__ is not int or a < 1 or a & (a - 1):
                raise DMAError("dma: tier alignments must be powers of two, got %r" % (self.tier_align,))
        if model_time is None:
            model_time = bool(getattr(k.clock, "virtual", False))
        self.model_time = bool(model_time)  # sleep each burst's cost (virtual clock)
        self.ncat = _NCAT  # categories accepted without a tracker (0..15); with one: its categories
        self.ring = array("i", bytes(4 * NW * slots))  # the descriptors
        self.head = 0  # ring index of the oldest descriptor
        self.count = 0  # descriptors in the ring
        self.next_cookie = 0  # cookie the next accepted descriptor gets
        self.done_upto = 0  # cookie of the oldest descriptor not completed (all before it are done)
        self.burst = array("i", bytes(4 * NW))  # the burst in flight: F_* words, F_COOKIE = first cookie
        self.burst_n = 0  # descriptors in the burst in flight (0: none)
        self.burst_links = 0  # GDMA hardware descriptors chained for it
        self.st = array("i", bytes(4 * NST))  # stats, ST_*
        self.bufs = []  # buffer id -> the buffer object
        self.buf_len = array("i", bytes(4 * MAX_BUFFERS))  # buffer id -> usable bytes
        self.buf_tier = bytearray(MAX_BUFFERS)  # buffer id -> tier number
        self.buf_align = array("i", bytes(4 * MAX_BUFFERS))  # buffer id -> alignment
        self.putters = TaskList()  # producers blocked on a full ring (priority order)
        self.waiters = TaskList()  # tasks blocked in wait(cookie)
        self.idle = TaskList()  # the engine while the ring is empty
        self.stash = [array("i", bytes(4 * _NSTASH)) for _ in range(len(k.tasks))]  # task slot -> its pending request
        self.task = None  # the engine's Task once q.spawn made it

    # --- configuration -------------------------------------------------------------

    # register buf (a bytearray, a memoryview window of one, a pool's arena) as living in tier
    # number `tier`; returns its id. align: overrides the tier's alignment. DMAError on a
    # read-only, empty or non-byte buffer (an array: register a bytearray view instead), a window that does not start on
    # a 4-byte boundary, a bad tier, or more than MAX_BUFFERS buffers
    def add_buffer(self, buf, tier, align=None):
        if len(self.bufs) >= MAX_BUFFERS:
            raise DMAError("dma: at most %d buffers" % MAX_BUFFERS)
        if tier.__class__ is not int or not 0 <= tier < len(self.tier_align):
            raise DMAError("dma: tier must be 0..%d, got %r" % (len(self.tier_align) - 1, tier))
        if not self.tier_dma[tier]:
            raise DMAError("dma: tier %d has no DMA (the board profile says dma: false)" % tier)
        if isinstance(buf, array) or not buffer_writable(buf) or getattr(memoryview(buf), "itemsize", 1) != 1:
            raise DMAError("dma: a buffer must be a writable byte buffer (a bytearray or a memoryview of one)")
        n = len(buf)
        if n < 1:
            raise DMAError("dma: a buffer must not be empty")
        if misaligned(buf, 3):  # the engine moves whole words: an unaligned word access faults on the chip
            raise DMAError("dma: a buffer must start on a 4-byte boundary (a window memoryview(buf)[a:b] needs "
                           "a %% 4 == 0), this one is %d B past one" % misaligned(buf, 3))
        if n > INT_MAX:
            raise DMAError("dma: buffer larger than %d bytes" % INT_MAX)
        a = self.tier_align[tier] if align is None else align
        if a.__class__ is not int or a < 1 or a & (a - 1):
            raise DMAError("dma: align must be a power of two, got %r" % (a,))
        i = len(self.bufs)
        self.bufs.append(buf)
        self.buf_len[i] = n
        self.buf_tier[i] = tier
        self.buf_align[i] = a
        return i

    # spawn the engine as a kernel task at priority prio; returns the Task
    def spawn(self, prio, name="dma"):
        if self.task is not None and not self.task.finished():
            raise DMAError("dma: the engine is already running")
        self.task = self.k.spawn(name, prio, self.engine())
        return self.task

    # --- submitting ----------------------------------------------------------------

    # the descriptor's checks: OK, or E_RANGE (ids, offsets, length, alignment, category,
    # overlap); every int compared as an object first; no allocation
    def _check(self, src, soff, dst, doff, n, cat):
        nb = len(self.bufs)
        bw = self.bw
        nc = self.ncat if bw is None else bw.n_cat
        if src.__class__ is not int or dst.__class__ is not int or soff.__class__ is not int or \
                doff.__class__ is not int or n.__class__ is not int or cat.__class__ is not int:
            return E_RANGE
        if src < 0 or src >= nb or dst < 0 or dst >= nb or n < 1 or n > DESC_MAX or cat < 0 or cat >= nc:
            return E_RANGE
        if soff < 0 or soff > INT_MAX or doff < 0 or doff > INT_MAX:
            return E_RANGE
        if soff > self.buf_len[src] - n or doff > self.buf_len[dst] - n:
            return E_RANGE
        sa = self.buf_align[src]
        da = self.buf_align[dst]
        if soff & (sa - 1) or doff & (da - 1) or n & (sa - 1) or n & (da - 1):
            return E_RANGE
        if src == dst and soff < doff + n and doff < soff + n:
            return E_RANGE
        return OK

    # store the descriptor at the ring's tail: its cookie; the engine wakes if idle. O(1)
    def _put(self, src, soff, dst, doff, n, cat):
        i = self.head + self.count
        if i >= self.slots:
            i -= self.slots
        r = self.ring
        b = i * NW
        r[b + F_SRC] = src
        r[b + F_SOFF] = soff
        r[b + F_DST] = dst
        r[b + F_DOFF] = doff
        r[b + F_LEN] = n
        r[b + F_CAT] = cat
        r[b + F_TIERS] = self.buf_tier[src] | (self.buf_tier[dst] << 8)
        c = self.next_cookie
        r[b + F_COOKIE] = c
        self.next_cookie = _after(c, 1)
        self.count += 1
        st = self.st
        st[ST_DEPTH] = self.count
        if self.count > st[ST_MAX_DEPTH]:
            st[ST_MAX_DEPTH] = self.count
        _add(st, ST_SUBMITTED, 1)
        e = self.idle.head
        if e is not None:
            self.k._wake(e, OK)
        return c

    # queue a descriptor without blocking: its cookie (>= 0), E_FULL (ring full, or
    # producers already wait for room), E_RANGE (see _check); nothing changed on a refusal
    def submit_nowait(self, src, soff, dst, doff, n, cat):
        self.k._tick()
        r = self._check(src, soff, dst, doff, n, cat)
        if r < 0:
            _bump(self.st, ST_REFUSED)
            return r
        if self.count >= self.slots or self.putters.head is not None:
            _bump(self.st, ST_FULL)
            return E_FULL
        return self._put(src, soff, dst, doff, n, cat)

    # queue a descriptor, blocking while the ring is full: resumes with its cookie (>= 0),
    # E_RANGE (nothing queued), TIMEOUT (the wait expired, nothing queued; timeout_us 0:
    # E_FULL, as submit_nowait). Stall time from blocking to admission is counted
    def submit(self, src, soff, dst, doff, n, cat, timeout_us=FOREVER):
        k = self.k
        t = k._cur()
        k._tick()
        self._settle(t)
        r = self._check(src, soff, dst, doff, n, cat)
        if r < 0:
            _bump(self.st, ST_REFUSED)
            return k._done_now(t, r)
        if self.count < self.slots and self.putters.head is None:
            return k._done_now(t, self._put(src, soff, dst, doff, n, cat))
        if timeout_us == 0:
            _bump(self.st, ST_FULL)
            return k._done_now(t, E_FULL)
        w = self.stash[t.id]
        w[F_SRC] = src
        w[F_SOFF] = soff
        w[F_DST] = dst
        w[F_DOFF] = doff
        w[F_LEN] = n
        w[F_CAT] = cat
        w[_W_T0] = k.clock.now()
        w[_W_TMO] = timeout_us if timeout_us > 0 else -1
        rv = k._block(t, self.putters, timeout_us, W_DMA, self)
        if t.wkind == W_DMA:  # really waiting (not refused for a timeout past MAX_WAIT_US)
            t.wval = w
            w[_W_PEND] = 1
            _add(self.st, ST_STALLS, 1)
        return rv

    # a wait of producer t that ended without admission (it timed out) is counted as its
    # timeout, the time it lasted; O(1)
    def _settle(self, t):
        w = self.stash[t.id]
        if w[_W_PEND] and t.wobj is not self:
            w[_W_PEND] = 0
            if w[_W_TMO] > 0:
                _add_us(self.st, ST_STALL_US, w[_W_TMO])

    # room was made: blocked producers' descriptors go in, in wait-list order; each wakes
    # with its cookie and its stall time is counted
    def _admit(self):
        k = self.k
        while self.count < self.slots:
            p = self.putters.head
            if p is None:
                return
            w = p.wval
            w[_W_PEND] = 0
            _add_us(self.st, ST_STALL_US, ticks_diff(k.clock.now(), w[_W_T0]))
            c = self._put(w[F_SRC], w[F_SOFF], w[F_DST], w[F_DOFF], w[F_LEN], w[F_CAT])
            k._wake(p, c)

    # --- completion ----------------------------------------------------------------

    # 1 when descriptor `cookie` has completed, 0 while it is pending, E_RANGE for a
    # cookie never handed out; O(1), no allocation
    def done(self, cookie):
        if cookie.__class__ is not int or cookie < 0 or cookie > INT_MAX:
            return E_RANGE
        ahead = (self.next_cookie - cookie) & INT_MAX  # descriptors issued from cookie on
        if ahead == 0 or ahead > _HALF:
            return E_RANGE
        d = (self.done_upto - cookie) & INT_MAX
        if d == 0 or d > _HALF:
            return 0
        return 1

    # wait until descriptor `cookie` has completed: resumes with OK, TIMEOUT, or E_RANGE
    # (never handed out)
    def wait(self, cookie, timeout_us=FOREVER):
        k = self.k
        t = k._cur()
        k._tick()
        d = self.done(cookie)
        if d != 0:
            return k._done_now(t, OK if d == 1 else d)
        rv = k._block(t, self.waiters, timeout_us, W_DMA, self)
        if t.wkind == W_DMA:
            t.wval = cookie
        return rv

    # --- the engine ----------------------------------------------------------------

    # the engine task's generator: spawn it once (k.spawn("dma", prio, q.engine()) or
    # q.spawn(prio)). Per burst: gather, charge, sleep its modelled time, copy, complete.
    def engine(self):
        k = self.k
        self._land()  # a burst left in flight by an engine that was killed lands first
        while True:
            if self.count == 0:
                t = k._cur()
                yield k._block(t, self.idle, FOREVER, W_DMA, self)
                continue
            n = self._gather()
            if self.admit:  # wait for room in the category's window on both tiers: it is charged then
                tiers = self.burst[F_TIERS]
                rv = yield self.bw.admit_copy(tiers & 0xFF, tiers >> 8, self.burst[F_CAT], n)
                while rv == E_FULL:  # booked past the tracker's horizon by others: try a bucket later
                    yield k.sleep_us(self.bw.bucket_us)
                    rv = yield self.bw.admit_copy(tiers & 0xFF, tiers >> 8, self.burst[F_CAT], n)
                us = self._charge(n, rv != OK)
            else:
                us = self._charge(n, True)
            if us > 0:
                _add_us(self.st, ST_BUSY_US, us)
                if self.model_time:
                    yield k.sleep_us(us)
                else:
                    yield
            else:
                yield  # cooperative: one burst per slice
            self._land()

    # take the oldest descriptor and (merging) those that continue it into the burst
    # record; frees their slots (admitting waiting producers); the burst's bytes. O(n)
    def _gather(self):
        r = self.ring
        slots = self.slots
        i = self.head
        b = i * NW
        bu = self.burst
        for j in range(NW):
            bu[j] = r[b + j]
        src = bu[F_SRC]
        dst = bu[F_DST]
        cat = bu[F_CAT]
        total = bu[F_LEN]
        cnt = 1
        if self.merge:
            se = bu[F_SOFF]
            de = bu[F_DOFF]
            lim = self.max_burst
            avail = self.count
            while cnt < avail:
                j = i + cnt
                if j >= slots:
                    j -= slots
                c = j * NW
                m = r[c + F_LEN]
                if r[c + F_SRC] != src or r[c + F_DST] != dst or r[c + F_CAT] != cat or \
                        r[c + F_SOFF] != se + total or r[c + F_DOFF] != de + total or total + m > lim:
                    break
                total += m
                cnt += 1
        bu[F_LEN] = total
        self.burst_n = cnt
        i += cnt
        if i >= slots:
            i -= slots
        self.head = i
        self.count -= cnt
        st = self.st
        st[ST_DEPTH] = self.count
        _add(st, ST_BURSTS, 1)
        if cnt > 1:
            _add(st, ST_MERGED, cnt - 1)
        _add(st, ST_BYTES, total)
        a = self.buf_align[src]
        da = self.buf_align[dst]
        if da > a:
            a = da
        per = DESC_MAX - (DESC_MAX & (a - 1))  # bytes per hardware descriptor at this alignment
        links = (total + per - 1) // per
        self.burst_links = links
        _add(st, ST_LINKS, links)
        self._admit()
        return total

    # charge the burst in flight (n bytes) to the tracker and price it; the µs from now
    # until it completes (0 without a tracker). The payload is charged once, to its
    # category, on each tier it touches (charge: False when admission already did; an
    # admission refused with E_RANGE, a burst over the category's whole budget, is charged
    # here unpoliced and counted in the tracker's refusals; E_FULL is retried a bucket later). The setup, per burst: the GDMA descriptors'
    # bytes fetched from internal RAM, charged to the engine's own category (dma), and
    # the first-access latency of each tier the cost model adds per transfer.
    # The two tiers are held busy until it ends (contention with other traffic)
    def _charge(self, n, charge):
        bw = self.bw
        if bw is None:
            return 0
        bu = self.burst
        tiers = bu[F_TIERS]
        s = tiers & 0xFF
        d = tiers >> 8
        if charge:
            bw.charge_copy(s, d, bu[F_CAT], n)
        us = bw.move(self.desc_tier, BW_K_DMA, BW_CAT_DMA, DESC_BYTES * self.burst_links)
        if us < 0:
            us = 0
        u = bw.occupy_copy(s, d, 1, n)
        if u > 0:
            us += u
        return us

    # the burst in flight lands: its bytes are copied, its descriptors complete in
    # submission order and their waiters wake. O(bytes + waiters)
    def _land(self):
        bu = self.burst
        n = self.burst_n
        if n == 0:
            return
        bufs = self.bufs
        copy_bytes(bufs[bu[F_DST]], bu[F_DOFF], bufs[bu[F_SRC]], bu[F_SOFF], bu[F_LEN])
        self.burst_n = 0
        self.done_upto = _after(bu[F_COOKIE], n)
        _add(self.st, ST_COMPLETED, n)
        k = self.k
        w = self.waiters.head
        while w is not None:
            nx = w.next
            if self.done(w.wval) == 1:
                k._wake(w, OK)
            w = nx

    # execute everything queued now, without a task and without modelled time (a board
    # without an engine task, or a test); bursts executed
    def drain(self):
        n = 0
        while self.count:
            self._charge(self._gather(), True)
            self._land()
            n += 1
        return n

    # --- stats ---------------------------------------------------------------------

    # copy the stats into buf (array('i') of at least NST ints); OK or E_RANGE; no allocation
    def snapshot(self, buf):
        if len(buf) < NST:
            return E_RANGE
        self._settle_all()
        st = self.st
        for i in range(NST):
            buf[i] = st[i]
        return OK

    # count the stall of producers whose waits timed out since; O(task slots)
    def _settle_all(self):
        for t in self.k.tasks:
            if t is not None:
                self._settle(t)

    # the stats as a dict with carried counters folded in (allocates: reporting only)
    def stats(self):
        self._settle_all()
        st = self.st
        out = {}
        for i in range(0, ST_MAX_DEPTH, 2):
            if STAT_NAMES[i] == "stall_us":
                out["stall_us"] = st[ST_STALL_S] * _US_PER_S + st[ST_STALL_US]
            else:
                out[STAT_NAMES[i]] = st[i + 1] * CARRY_N + st[i]
        out["max_depth"] = st[ST_MAX_DEPTH]
        out["depth"] = st[ST_DEPTH]
        out["full"] = st[ST_FULL]
        out["refused"] = st[ST_REFUSED]
        out["busy_us"] = st[ST_BUSY_S] * _US_PER_S + st[ST_BUSY_US]
        out["in_flight"] = self.burst_n
        return out
