# The DMA descriptor queue (firmware_py/dma.py): descriptor checks and refusals that
# change nothing, merging of contiguous requests into bursts (and its limits), backpressure
# that blocks and never drops, completion by cookie (polled and waited), timeouts, kill,
# cookie wrap, counter carry and saturation (every stats field near 2**30), and the hot
# paths (submit, submit_nowait, wait, done, the engine's loop, snapshot, drain) under
# micropython.heap_lock().
from array import array

from fwtest import check, eq, raises, no_alloc, done, xorshift
from firmware_py import dma
from firmware_py.clock import VirtualClock, RealClock
from firmware_py.sched import Kernel, TIMEOUT, OK, T_FAULTS, KILLED
from firmware_py.status import E_FULL, E_RANGE, INT_MAX, CARRY_N

SRAM, PSRAM = 0, 1  # tiers without a tracker: alignment 1 and 32


def fresh(slots=4, **kw):
    k = Kernel(VirtualClock(), max_tasks=8, verbose=True)
    q = dma.DMAQueue(k, slots=slots, **kw)
    src = bytearray(8192)
    for i in range(len(src)):
        src[i] = (i * 7 + 3) & 0xFF
    dst = bytearray(8192)
    return k, q, q.add_buffer(src, SRAM), q.add_buffer(dst, PSRAM), src, dst


# --- configuration mistakes raise DMAError (a ValueError), one line ---
k = Kernel(VirtualClock())
raises(dma.DMAError, dma.DMAQueue, k, 0)
raises(dma.DMAError, dma.DMAQueue, k, 4, 0)
raises(ValueError, dma.DMAQueue, k, 4, dma.MAX_BURST_LIMIT + 1)
q = dma.DMAQueue(k, 4)
raises(dma.DMAError, q.add_buffer, bytes(64), SRAM)
raises(dma.DMAError, q.add_buffer, bytearray(0), SRAM)
raises(dma.DMAError, q.add_buffer, array("i", [0, 0]), SRAM)
raises(dma.DMAError, q.add_buffer, bytearray(64), 2)
raises(dma.DMAError, q.add_buffer, bytearray(64), SRAM, 3)
e = raises(dma.DMAError, q.add_buffer, "abc", SRAM)
check("\n" not in str(e), "one-line message")

# --- descriptor checks: E_RANGE, nothing changed ---
k, q, s, d, src, dst = fresh()
bad = (
    (5, 0, d, 0, 32, 0, "no such source buffer"),
    (s, 0, -1, 0, 32, 0, "no such destination buffer"),
    (s, 0, d, 0, 0, 0, "length 0"),
    (s, 0, d, 0, 4096, 0, "length past 4,095"),
    (s, 8192 - 31, d, 0, 32, 0, "source past its buffer"),
    (s, 0, d, 8192 - 32 + 1, 32, 0, "destination past its buffer"),
    (s, 0, d, 16, 32, 0, "PSRAM offset not a multiple of 32"),
    (s, 0, d, 0, 40, 0, "PSRAM length not a multiple of 32"),
    (s, 0, d, 0, 32, 16, "category outside 0..15"),
    (s, -1, d, 0, 32, 0, "negative offset"),
    (s, True, d, 0, 32, 0, "a bool is not an int"),
    (s, 0, d, 0, 32.0, 0, "a float length"),
    (s, 1 << 40, d, 0, 32, 0, "a big offset"),
    (s, 0, s, 16, 32, 0, "overlap within one buffer"),
)
for a, b, c, e2, n, cat, what in bad:
    eq(q.submit_nowait(a, b, c, e2, n, cat), E_RANGE, what)
eq(q.count, 0, "refusals queued nothing")
eq(q.next_cookie, 0, "refusals handed out no cookie")
eq(q.st[dma.ST_REFUSED], len(bad), "refusals counted")
eq(q.submit_nowait(s, 5, s, 100, 33, 0), 0, "SRAM to SRAM: any offset and length")
eq(q.submit_nowait(s, 0, s, 32, 32, 0), 1, "adjacent, not overlapping: accepted")
eq(q.done(0), 0, "pending")
eq(q.done(2), E_RANGE, "a cookie not handed out yet")
eq(q.done(-1), E_RANGE, "negative cookie")
eq(q.done(INT_MAX + 1), E_RANGE, "cookie past 2**30 - 1")
eq(q.submit_nowait(s, 64, d, 64, 32, 0), 2, "third")
eq(q.submit_nowait(s, 96, d, 96, 32, 0), 3, "fourth: ring full now")
eq(q.submit_nowait(s, 128, d, 128, 32, 0), E_FULL, "ring full: E_FULL")
eq(q.st[dma.ST_FULL], 1, "E_FULL counted")
eq(q.st[dma.ST_MAX_DEPTH], 4, "max depth")
eq(q.drain(), 3, "drain: descriptors 2 and 3 merge, 0 and 1 do not (different buffers)")
eq((q.done(0), q.done(1), q.done(3)), (1, 1, 1), "all done")
check(dst[64:128] == src[64:128], "PSRAM bytes landed")
check(src[100:133] == bytes((i * 7 + 3) & 0xFF for i in range(5, 38)), "SRAM-to-SRAM bytes landed")
eq(q.st[dma.ST_MERGED], 1, "one merged descriptor")

# --- merging: contiguous on both sides, same category, within max_burst ---
for merge, want_bursts in ((True, 5), (False, 9)):
    k, q, s, d, src, dst = fresh(slots=16, max_burst=128, merge=merge)
    for i in range(4):  # 4 x 32 contiguous: one burst of 128
        q.submit_nowait(s, i * 32, d, i * 32, 32, 1)
    q.submit_nowait(s, 128, d, 128, 32, 1)  # contiguous, but past max_burst: a new burst
    q.submit_nowait(s, 160, d, 192, 32, 1)  # source continues, destination does not
    q.submit_nowait(s, 192, d, 224, 32, 2)  # contiguous with the last, other category
    q.submit_nowait(s, 224, d, 256, 32, 2)  # merges with the previous one
    q.submit_nowait(s, 4096, d, 4096, 4064, 2)  # alone: 4,064 > max_burst
    eq(q.drain(), want_bursts, "bursts with merge=%s" % merge)
    eq(q.st[dma.ST_BURSTS], want_bursts, "bursts counted")
    eq(q.st[dma.ST_MERGED], 9 - want_bursts, "merged counted")
    eq(q.st[dma.ST_BYTES], 8 * 32 + 4064, "bytes counted")
    eq(q.st[dma.ST_COMPLETED], 9, "completed counted")
    check(dst[0:160] == src[0:160] and dst[192:224] == src[160:192] and dst[224:288] == src[192:256], "bytes landed")
    check(dst[4096:8160] == src[4096:8160], "the 4,064-byte descriptor landed")
k, q, s, d, src, dst = fresh(slots=8, max_burst=dma.MAX_BURST_LIMIT)
for i in range(4):
    q.submit_nowait(s, i * 2016, d, i * 2016, 2016, 0)
eq(q.drain(), 1, "8,064 bytes in one burst")
eq(q.st[dma.ST_LINKS], 2, "chained as two GDMA descriptors of at most 4,064 B (PSRAM)")

# --- backpressure in the kernel: blocking submit, engine, waits, nothing dropped ---
k, q, s, d, src, dst = fresh(slots=4)
log = []


def producer(base, n, step):
    for i in range(n):
        off = base + i * step
        c = yield q.submit(s, off, d, off, 32, 0)
        log.append(c)
    r = yield q.wait(log[-1])
    log.append(("waited", r, q.done(log[-2])))


k.spawn("p1", 1, producer(0, 20, 32))
k.spawn("p2", 1, producer(2048, 20, 64))
q.spawn(2)
k.run(1000000)
eq(len(log), 42, "both producers finished")
cookies = sorted(c for c in log if c.__class__ is int)
eq(cookies, list(range(40)), "40 distinct cookies, none lost")
check(dst[0:640] == src[0:640], "producer 1's bytes")
check(all(dst[2048 + i * 64:2048 + i * 64 + 32] == src[2048 + i * 64:2048 + i * 64 + 32] for i in range(20)), "producer 2's bytes")
check(all(dst[2048 + i * 64 + 32:2048 + i * 64 + 64] == bytes(32) for i in range(20)), "nothing written between")
eq(q.st[dma.ST_COMPLETED], 40, "all completed")
check(q.st[dma.ST_STALLS] > 0, "producers stalled on the full ring")
eq(q.st[dma.ST_MAX_DEPTH], 4, "depth never past the ring")
eq(k.totals[T_FAULTS], 0, "no faults")

# --- timeout: the wait expires, nothing queued, its time counted as stall ---
k, q, s, d, src, dst = fresh(slots=1, max_burst=32)
got = []


def filler():
    got.append((yield q.submit(s, 0, d, 0, 32, 0)))
    got.append((yield q.submit(s, 32, d, 32, 32, 0, 500)))
    got.append((yield q.submit(s, 64, d, 64, 32, 0, 0)))
    got.append(q.count)


k.spawn("f", 1, filler())
k.run()
eq(got, [0, TIMEOUT, E_FULL, 1], "OK, TIMEOUT after 500 us, E_FULL for timeout 0; one queued (no engine)")
st = array("i", bytes(4 * dma.NST))
eq(q.snapshot(st), OK, "snapshot")
eq(st[dma.ST_STALL_US], 500, "the timed-out wait counted as 500 us of stall")
eq(q.snapshot(array("i", [0])), E_RANGE, "short snapshot buffer")

# --- kill a blocked producer: its descriptor was never queued, the others go on ---
k, q, s, d, src, dst = fresh(slots=1)
res = []


def blocked():
    res.append((yield q.submit(s, 32, d, 32, 32, 0)))


def other():
    res.append((yield q.submit(s, 64, d, 64, 32, 0)))


q.submit_nowait(s, 0, d, 0, 32, 0)
vb = k.spawn("blocked", 1, blocked())
k.spawn("other", 1, other())
k.run()
eq(k.kill(vb), OK, "killed while blocked in submit")
eq(vb.state, KILLED, "killed")
q.spawn(2)
k.run()
eq(res, [1], "the other producer's descriptor got cookie 1, the killed one none")
check(dst[32:64] == bytes(32) and dst[64:96] == src[64:96], "only queued bytes landed")

# --- cookie wrap at 2**30 and counter carry at 10**9 ---
k, q, s, d, src, dst = fresh(slots=4)
q.next_cookie = q.done_upto = INT_MAX - 1
q.st[dma.ST_BYTES] = CARRY_N - 10
c1 = q.submit_nowait(s, 0, d, 0, 32, 0)
c2 = q.submit_nowait(s, 32, d, 32, 32, 0)
c3 = q.submit_nowait(s, 64, d, 64, 32, 0)
eq((c1, c2, c3), (INT_MAX - 1, INT_MAX, 0), "cookies wrap to 0")
eq((q.done(c1), q.done(c3), q.done(1)), (0, 0, E_RANGE), "pending across the wrap; 1 not handed out")
no_alloc("drain across the cookie wrap and the bytes carry", q.drain)
eq((q.done(c1), q.done(c2), q.done(c3)), (1, 1, 1), "done across the wrap")
eq((q.st[dma.ST_BYTES], q.st[dma.ST_BYTES_G]), (86, 1), "bytes carried into bytes_g")
eq(q.stats()["bytes"], CARRY_N + 86, "stats() folds the carry in")

# --- heap-locked: the steady state of producers, the engine and waiters ---
k = Kernel(VirtualClock(), max_tasks=8)
q = dma.DMAQueue(k, slots=8, max_burst=256)
src = bytearray(4096)
dst = bytearray(4096)
s = q.add_buffer(src, SRAM)
d = q.add_buffer(dst, PSRAM)
rng = xorshift(12345)
for i in range(4096):
    src[i] = rng(256)
N = 300
cnt = array("i", [0, 0, 0])  # submitted, waited OK, nowait refusals/acceptances


def stream(base, step):
    # submit rows forever (blocking), waiting for every 8th; never ends (an ending
    # generator allocates its StopIteration)
    i = 0
    while True:
        off = base + (i & 31) * step
        c = yield q.submit(s, off, d, off, 32, 0)
        cnt[0] += 1
        if i & 7 == 7:
            r = yield q.wait(c, 100000)
            if r == OK and q.done(c) == 1:
                cnt[1] += 1
        i += 1


def poller():
    while True:
        c = q.submit_nowait(s, 3072, d, 3072, 64, 1)
        if c >= 0 or c == E_FULL:
            cnt[2] += 1
        yield


def stopper():
    while True:
        if cnt[0] >= N:
            k.stop()
        yield


k.spawn("rows", 1, stream(0, 32))
k.spawn("strided", 1, stream(1024, 64))
k.spawn("poll", 1, poller())
k.spawn("stop", 1, stopper())
q.spawn(2)
k.run()
check(cnt[0] >= N and cnt[1] > 0, "warm-up ran")
cnt[0] = cnt[1] = cnt[2] = 0
b0 = q.st[dma.ST_BURSTS]
no_alloc("submit (blocking) / submit_nowait / wait / done / engine bursts in the kernel", k.run)
check(cnt[0] >= N, "submits under the lock: %d" % cnt[0])
check(cnt[1] > 0, "waits completed under the lock: %d" % cnt[1])
check(cnt[2] > 0, "nowait submits under the lock")
check(q.st[dma.ST_BURSTS] > b0, "bursts under the lock")
check(q.st[dma.ST_MERGED] > 0, "contiguous rows merged")
eq(k.totals[T_FAULTS], 0, "no task faulted under the lock")
for _ in range(3):  # let everything queued land, then every byte sent is where it was sent
    q.drain()
check(dst[0:1024] == src[0:1024], "contiguous stream landed")
check(dst[3072:3136] == src[3072:3136], "nowait rows landed")
snap = array("i", bytes(4 * dma.NST))
no_alloc("snapshot", lambda: q.snapshot(snap))
eq(snap[dma.ST_SUBMITTED], q.st[dma.ST_SUBMITTED], "snapshot copies the stats")
BIG = 1 << 40


def refusals():
    q.submit_nowait(s, 1, d, 1, 32, 0)
    q.submit_nowait(s, BIG, d, 0, 32, 0)
    q.done(BIG)
    q.done(0)


r0 = q.st[dma.ST_REFUSED]
no_alloc("refusals (E_RANGE) and done()", refusals)
eq(q.st[dma.ST_REFUSED], r0 + 2, "both refusals counted")

# --- with the bandwidth tracker: charged once per tier, priced by the cost model ---
from firmware_py import board, bandwidth as bwm  # noqa: E402

eq((dma.BW_K_DMA, dma.BW_CAT_DMA), (bwm.K_DMA, bwm.DMA), "dma's copies of the tracker's constants")
brd = board.load("boards/esp32s3_n8r8.json")
k = Kernel(VirtualClock(), max_tasks=8)
bw = bwm.Bandwidth(brd, kernel=k)
SR, PS, FL = bw.tier_id("sram"), bw.tier_id("psram"), bw.tier_id("flash")
raises(dma.DMAError, dma.DMAQueue, k, 4, 4096, True, bw)  # a tracker without its board
q = dma.DMAQueue(k, slots=32, bw=bw, board=brd)
eq((q.tier_align[SR], q.tier_align[PS], q.desc_tier), (1, 32, SR), "alignment and descriptor tier from the profile")
raises(dma.DMAError, q.add_buffer, bytearray(64), FL)  # flash: dma false
src = bytearray(8192)
dst = bytearray(8192)
for i in range(8192):
    src[i] = (i * 13 + 1) & 0xFF
s = q.add_buffer(src, SR)
d = q.add_buffer(dst, PS)
eq(q.submit_nowait(s, 0, d, 0, 32, bw.n_cat), E_RANGE, "a category the tracker does not have")
ref = bwm.Bandwidth(brd, clock=VirtualClock())  # prices the same burst on an idle tracker
want_us = ref.cost_us(SR, bwm.K_DMA, 2 * dma.DESC_BYTES) + ref.copy_us(SR, PS, 1, 4096)
t_done = array("i", [0, 0])


def writer():
    c = 0
    for i in range(32):  # 32 rows of 128 B, contiguous on both sides: one burst of 4,096 B
        c = yield q.submit(s, i * 128, d, i * 128, 128, bwm.KV_WRITE)
    t_done[0] = k.now()
    r = yield q.wait(c)
    t_done[1] = k.now() if r == OK else -1


k.spawn("w", 1, writer())
q.spawn(2)
k.run()
eq(q.st[dma.ST_BURSTS], 1, "one burst")
eq(q.st[dma.ST_LINKS], 2, "4,096 B chained as two GDMA descriptors")
eq(t_done[1] - t_done[0], want_us, "the burst took the cost model's time on the virtual clock")
check(want_us > 0, "it takes time: %d us" % want_us)
eq(q.st[dma.ST_BUSY_US], want_us, "engine busy time")
check(dst[:4096] == src[:4096], "the bytes landed")


def charged(tier, cat):
    o = (tier * (bw.n_cat_max + 1) + cat) * bwm.NSTAT
    return bw.st[o + bwm.S_BYTES_G] * CARRY_N + bw.st[o + bwm.S_BYTES]


eq((charged(SR, bwm.KV_WRITE), charged(PS, bwm.KV_WRITE)), (4096, 4096), "payload charged once on each tier, to its category")
eq(charged(SR, bwm.DMA), 2 * dma.DESC_BYTES, "the engine's own traffic: its two descriptors")
eq(charged(PS, bwm.DMA), 0, "nothing of the engine's own on PSRAM")

# heap-locked with the tracker, and with admission under a budget
for admit in (False, True):
    k = Kernel(VirtualClock(), max_tasks=8)
    bw = bwm.Bandwidth(brd, kernel=k)
    if admit:
        bw.set_budget(PS, bwm.KV_WRITE, 10)  # 1 % of PSRAM: 6,176 B per 16 ms window
    q = dma.DMAQueue(k, slots=8, max_burst=1024, bw=bw, board=brd, admit=admit)
    s = q.add_buffer(src, SR)
    d = q.add_buffer(dst, PS)
    cnt = array("i", [0, 0])

    def rows(q=q, s=s, d=d, cnt=cnt):
        i = 0
        while True:
            off = (i & 63) * 128
            c = yield q.submit(s, off, d, off, 128, bwm.KV_WRITE)
            cnt[0] += 1
            if i & 15 == 15:
                if (yield q.wait(c)) == OK:
                    cnt[1] += 1
            i += 1

    def stop_at(k=k, cnt=cnt):
        while True:
            if cnt[0] >= 200:
                k.stop()
            yield k.sleep_us(50)

    k.spawn("rows", 1, rows())
    k.spawn("stop", 1, stop_at())
    q.spawn(2)
    k.run()
    cnt[0] = 0
    o = (PS * (bw.n_cat_max + 1) + bwm.KV_WRITE) * bwm.NSTAT
    w0 = bw.st[o + bwm.S_WAITS]
    no_alloc("submit / engine / charge%s / wait with the tracker" % (" / admission" if admit else ""), k.run)
    check(cnt[0] >= 200 and cnt[1] > 0, "rows moved under the lock")
    eq(k.totals[T_FAULTS], 0, "no task faulted")
    moved = q.stats()["bytes"]
    eq((charged(SR, bwm.KV_WRITE), charged(PS, bwm.KV_WRITE)), (moved, moved), "bytes moved == bytes charged, each tier")
    if admit:
        check(bw.st[o + bwm.S_WAITS] > w0, "admission throttled the engine under the lock")
    else:
        eq(bw.st[o + bwm.S_WAITS], 0, "no admission, no waits")

# --- every stats counter near its limit, bumped under the lock: event counters carry
# into their _G field (which saturates at INT_MAX, its low field then at CARRY_N - 1), the
# µs fields carry into whole seconds (saturating the same way), FULL and REFUSED saturate
# at INT_MAX; nothing leaves the 31-bit small ints (micropython32 would allocate) ---
PAIRS = ((dma.ST_SUBMITTED, CARRY_N), (dma.ST_MERGED, CARRY_N), (dma.ST_BURSTS, CARRY_N), (dma.ST_BYTES, CARRY_N),
         (dma.ST_LINKS, CARRY_N), (dma.ST_COMPLETED, CARRY_N), (dma.ST_STALLS, CARRY_N),
         (dma.ST_STALL_US, 1000000), (dma.ST_BUSY_US, 1000000))
SAT = (dma.ST_FULL, dma.ST_REFUSED)
eq(sorted([i for i, _ in PAIRS] + [i + 1 for i, _ in PAIRS] + list(SAT) + [dma.ST_MAX_DEPTH, dma.ST_DEPTH]),
   list(range(dma.NST)), "every stats field is checked here")


def near_limit(hi):
    # (queue, [rounds, E_FULL, E_RANGE, waits OK]) after a heap-locked run that started
    # with every carry field at hi, its low field one bump short of carrying, and FULL
    # and REFUSED at INT_MAX - 1
    k = Kernel(VirtualClock(), max_tasks=8)
    bw = bwm.Bandwidth(brd, kernel=k)
    q = dma.DMAQueue(k, slots=2, max_burst=1024, bw=bw, board=brd)
    s = q.add_buffer(src, SR)
    d = q.add_buffer(dst, PS)
    cnt = array("i", [0, 0, 0, 0])

    def prod():
        while True:
            i = 0
            c = 0
            # 8 contiguous rows into 2 slots: they merge, and the later ones block while a
            # burst is in flight (stalls that last)
            while i < 8:
                c = yield q.submit(s, i * 64, d, i * 64, 64, bwm.KV_WRITE)
                i += 1
            while True:  # fill the ring without waiting: ends with an E_FULL
                r = q.submit_nowait(s, 4096 + i * 64, d, 4096 + i * 64, 64, bwm.KV_WRITE)
                if r < 0:
                    break
                i += 1
            if r == E_FULL:
                cnt[1] += 1
            r = yield q.submit(s, 0, d, 0, 64, bwm.KV_WRITE, 0)  # timeout 0 on a full ring
            if r == E_FULL:
                cnt[1] += 1
            if q.submit_nowait(s, 1, d, 1, 32, 0) == E_RANGE:  # PSRAM offset not aligned
                cnt[2] += 1
            r = yield q.submit(s, 0, d, 0, 40, 0)  # PSRAM length not a multiple of 32
            if r == E_RANGE:
                cnt[2] += 1
            r = yield q.wait(c)
            if r == OK:
                cnt[3] += 1
            cnt[0] += 1

    def stop_at():
        while True:
            if cnt[0] >= 3:
                k.stop()
            yield k.sleep_us(50)

    k.spawn("prod", 1, prod())
    k.spawn("stop", 1, stop_at())
    q.spawn(2)
    k.run()  # warm-up, unlocked
    for i, unit in PAIRS:
        q.st[i] = unit - 1
        q.st[i + 1] = hi
    for i in SAT:
        q.st[i] = INT_MAX - 1
    for j in range(4):
        cnt[j] = 0
    no_alloc("every dma counter bumped from near its limit (high words at %d)" % hi, k.run)
    eq(k.totals[T_FAULTS], 0, "no task faulted")
    for i in range(dma.NST):
        check(0 <= q.st[i] <= INT_MAX, "stats field %d (%s) stays a small int: %d" % (i, dma.STAT_NAMES[i], q.st[i]))
    return q, cnt


q, cnt = near_limit(INT_MAX - 1)
check(cnt[0] >= 3 and cnt[1] >= 2 and cnt[2] >= 2 and cnt[3] >= 3, "every path ran under the lock: %r" % list(cnt))
for i, unit in PAIRS:  # each bumped, carried into its high word, which reached INT_MAX
    eq(q.st[i + 1], INT_MAX, "%s carried into %s" % (dma.STAT_NAMES[i], dma.STAT_NAMES[i + 1]))
    check(q.st[i] < unit, "%s below its unit" % dma.STAT_NAMES[i])
for i in SAT:
    eq(q.st[i], INT_MAX, "%s saturated at INT_MAX" % dma.STAT_NAMES[i])
q, cnt = near_limit(INT_MAX)
check(cnt[0] >= 3 and cnt[1] >= 2 and cnt[2] >= 2, "every path ran under the lock: %r" % list(cnt))
for i, unit in PAIRS:  # the high word saturated: the whole counter stays at its largest
    eq((q.st[i], q.st[i + 1]), (unit - 1, INT_MAX), "%s saturated" % dma.STAT_NAMES[i])
for i in SAT:
    eq(q.st[i], INT_MAX, "%s stays at INT_MAX" % dma.STAT_NAMES[i])
st = q.stats()
eq((st["full"], st["refused"], st["bytes"]), (INT_MAX, INT_MAX, INT_MAX * CARRY_N + CARRY_N - 1), "stats() reports the saturated values")

# --- on a real clock nothing is modelled: bursts are CPU copies taking their own time ---
k = Kernel(RealClock(), max_tasks=4)
q = dma.DMAQueue(k, slots=4)
eq(q.model_time, False, "real clock: no modelled time")
done()
