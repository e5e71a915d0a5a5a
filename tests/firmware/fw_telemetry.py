# Telemetry frames on the board's interpreters: the CRC-32 and COBS match their
# published vectors; a decode-like run on the kernel (VirtualClock) sends a layout
# frame, periodic frames within the byte budget, event and text frames, every one a
# valid COBS run whose CRC checks; periods the task slept through and frames the link
# could not carry are skipped and counted; commands are read back; and the steady
# state (tick, the telemetry task on the kernel, counters, events, text) allocates
# nothing with the heap locked. The last line before PASS is a digest of the bytes
# sent, the same on every interpreter (tests/test_telemetry.py compares them).
from array import array

from fwtest import check, eq, no_alloc, done, two_tier_profile
from firmware_py import kv, pool, telemetry as tm
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, S_RUN_S, T_IDLE_S
from firmware_py.status import CARRY_N, E_RANGE, INT_MAX, OK

# --- the CRC and COBS against their published vectors ---
eq(tm.crc32(b"123456789"), 0xCBF43926, "CRC-32 check value of '123456789' (zlib's)")
eq(tm.crc32(b""), 0, "CRC-32 of nothing")


def cobs(data):
    out = bytearray(tm.wire_len(len(data)) + 4)
    n = tm.cobs_encode(data, len(data), out)
    return bytes(out[:n])


eq(cobs(b"\x00"), b"\x00\x01\x01\x00", "COBS of 00 (wikipedia example 1)")
eq(cobs(b"\x00\x00"), b"\x00\x01\x01\x01\x00", "COBS of 00 00")
eq(cobs(b"\x11\x22\x00\x33"), b"\x00\x03\x11\x22\x02\x33\x00", "COBS of 11 22 00 33")
eq(cobs(b"\x11\x00\x00\x00"), b"\x00\x02\x11\x01\x01\x01\x00", "COBS of 11 00 00 00")
big = bytes(range(1, 256))  # 01..FF: a full 254-byte group, then one more byte
eq(cobs(big), b"\x00\xff" + bytes(range(1, 255)) + b"\x02\xff\x00", "COBS of 01..FF")


def uncobs(run):
    # the decoded bytes of one run between delimiters, or None
    out = bytearray()
    i = 0
    while i < len(run):
        code = run[i]
        if code == 0 or i + code > len(run):
            return None
        out.extend(run[i + 1:i + code])
        i += code
        if code < 0xFF and i < len(run):
            out.append(0)
    return out


def frames(data, n):
    # [(type, seq, ms, body, wire length)] of the frames in data[:n]; every run between
    # two 0x00 bytes must be a good frame (nothing else was written)
    out = []
    i = 0
    while i < n:
        check(data[i] == 0, "a frame starts with 0x00 at %d" % i)
        j = i + 1
        while data[j] != 0:
            j += 1
        run = bytes(data[i + 1:j])
        pay = uncobs(run)
        check(pay is not None and len(pay) >= tm.HDR + 4, "valid COBS run at %d" % i)
        p = len(pay) - 4
        eq(tm.crc32(pay, 0, p), pay[p] | pay[p + 1] << 8 | pay[p + 2] << 16 | pay[p + 3] << 24, "CRC of frame at %d" % i)
        eq((pay[0], pay[1]), (tm.MAGIC, tm.PROTO), "magic and version")
        out.append((pay[2], pay[3] | pay[4] << 8, pay[5] | pay[6] << 8 | pay[7] << 16 | pay[8] << 24,
                    bytes(pay[tm.HDR:p]), j + 1 - i))
        i = j + 1
    return out


def records(body):
    out = []
    i = 0
    while i < len(body):
        rid, n = body[i], body[i + 1]
        vals = []
        j = i + 2
        while j < i + 2 + n:
            v, j = tm.get_varint(body, j)
            vals.append(v)
        out.append((rid, vals))
        i += 2 + n
    return out


# --- a capture link that allocates nothing ---
CAP = bytearray(120000)
capn = array("i", [0])


def link(buf, n):
    o = capn[0]
    if o + n <= len(CAP):
        for i in range(n):
            CAP[o + i] = buf[i]
        capn[0] = o + n


# --- a decode-like run: a task appends a KV row per token, queues its text ---
lay = kv.Layout(2, 2, 8, "int8")
p = pool.Pool(lay.block_bytes, 12)
c = kv.KVCache(p, lay, max_seqs=2)
h = c.open(p.add_region(12), "sinks", 64, 4)
clk = VirtualClock()
k = Kernel(clk, max_tasks=6, verbose=False)
t = tm.Telemetry(link, kernel=k, pool=p, cache=c, heap=False, meta={"model": "fw-test", "policy": "sinks"})
eq(t.frame_max, 115, "periodic budget: a tenth of 115,200 baud at 10 Hz")
eq(t.watch_seq(h, 64), 0, "the sequence is watched in slot 0")
row = bytearray(lay.row_bytes)
PIECE = b"tok "
state = array("i", [0, 0])  # tokens to make, stop after


def decoder(k):
    while True:
        if state[0] > 0:
            state[0] -= 1
            c.append(h, row)
            t.tokens += 1
            t.text(PIECE)
            k.charge(15000)  # a 15 ms token
        yield
        if state[1] and t.tokens >= state[1]:
            k.stop()


def idler(k):
    while True:
        yield k.sleep_us(30000)


k.spawn("telemetry", 3, t.task(k))
k.spawn("decode", 1, decoder(k))
k.spawn("idle", 2, idler(k), deadline_us=100000)
state[0] = 40
state[1] = 40
k.run(for_us=5000000)
eq(t.tokens, 40, "40 tokens made")
k.run(for_us=300000)  # the rest of the text goes out
fs = frames(CAP, capn[0])
kinds = [f[0] for f in fs]
eq(kinds[0], tm.T_LAYOUT, "the layout frame goes first")
lay_text = fs[0][3].decode()
check("task.0=telemetry" in lay_text and "task.1=decode" in lay_text, "the layout names the tasks")
check("kv.kv_bytes_per_token=%d" % lay.kv_bytes_per_token in lay_text, "the layout gives the KV bytes per token")
check("rec.6=task:slot,state,prio,run_ms" in lay_text, "the layout gives the record fields")
eq([f[1] for f in fs], list(range(len(fs))), "sequence numbers count every frame sent")
per = [f for f in fs if f[0] == tm.T_PERIODIC]
check(len(per) >= 6, "periodic frames sent: %d" % len(per))
check(max(f[4] for f in per) <= 115, "every periodic frame within 115 wire bytes (max %d)" % max(f[4] for f in per))
eq(max(f[4] for f in per), t.periodic_max, "periodic_max is the largest periodic frame sent")
text = b"".join(f[3][1:] for f in fs if f[0] == tm.T_TEXT)
eq(text, PIECE * 40, "the text frames carry every piece, in order")
last = records(per[-1][3])
core = [v for r, v in last if r == tm.R_CORE][0]
eq(core[0], 40, "core record: tokens")
seqr = [v for r, v in last if r == tm.R_SEQ][0]
eq(seqr[:4], [0, 40, 40, 64], "seq record: slot, length, cached, cap")
eq(seqr[4], c.blocks_of(h), "seq record: blocks")
seen = set()
for f in per:
    for r, v in records(f[3]):
        seen.add(r if r != tm.R_TASK else 100 + v[0])
check(tm.R_KERNEL in seen and 100 in seen and 101 in seen and 102 in seen, "kernel and every task row rotated in: %r" % sorted(seen))
times = [f[2] for f in per]
check(times == sorted(times), "board time never goes back")

# --- events: eviction (a sinks ring past its budget), deadline miss, fault ---
capn[0] = 0
state[0] = 40  # 80 tokens: past the budget of 64, the ring evicts
state[1] = 80


def hog(k):
    k.charge(450000)  # 450 ms without yielding: the idle task misses its 100 ms deadline
    yield
    raise ValueError("boom")


k.spawn("hog", 2, hog(k))
k.run(for_us=5000000)
k.run(for_us=300000)
fs = frames(CAP, capn[0])
evs = []
for f in fs:
    if f[0] == tm.T_EVENT:
        for code, v in records(f[3]):
            evs.append((code, [tm_unzig for tm_unzig in v]))
codes = [e[0] for e in evs]
check(tm.EV_EVICT in codes, "an eviction event: %r" % codes)
check(tm.EV_WATERMARK in codes, "a watermark event")
check(tm.EV_MISS in codes, "a deadline-miss event")
check(tm.EV_FAULT in codes, "a fault event")
check(any(f[0] == tm.T_LAYOUT for f in fs), "the layout is sent again when a new task appears")
check(t.skipped >= 3, "periods slept through by the hog are skipped and counted: %d" % t.skipped)
last = records([f for f in fs if f[0] == tm.T_PERIODIC][-1][3])
core = [v for r, v in last if r == tm.R_CORE][0]
eq(core[3], t.skipped, "the skipped count travels in the core record")

# --- a link too slow for the frames: skipped, counted, the run never waits ---
capn[0] = 0
slow = tm.Telemetry(link, clock=clk, link_bps=300, pool=p, cache=c, heap=False)
slow.watch_seq(h, 64)
for _ in range(200):
    clk.charge(100000)
    slow.tick()
check(slow.skipped >= 20, "a 300 B/s link cannot carry 10 frames/s: %d of 200 skipped" % slow.skipped)
check(slow.sent_bytes <= 300 * 20 + slow.credit_cap, "never more than the link carried in 20 s (+ the boot credit)")

# --- commands: hex-coded frames, read back; garbage and a bad CRC refused ---
got = []
rd = tm.CommandReader(lambda ft, body, seq: got.append((ft, body, seq)))
cmd = tm.encode_command(tm.T_CMD_PROMPT, b"\x10Once upon a time", 7)
for b in cmd:
    check(b == 0 or 0x30 <= b <= 0x66, "a command's wire bytes are 0x00 and hex digits only")
rd.feed(b"print('hi')\r\n" + cmd + b"\x00junk\x00" + tm.encode_command(tm.T_CMD_STOP, b"", 8))
rd.byte(0)
eq(got, [(tm.T_CMD_PROMPT, b"\x10Once upon a time", 7), (tm.T_CMD_STOP, b"", 8)], "two commands read back")
bad = bytearray(tm.encode_command(tm.T_CMD_STOP, b"", 9))
bad[5] = 0x30 if bad[5] != 0x30 else 0x31
rd.feed(bad)
rd.byte(0)
eq(len(got), 2, "a damaged command is refused")
check(rd.corrupt >= 1, "and counted")

# --- the steady state allocates nothing ---
capn[0] = 0
N = 50


def ticks():
    for _ in range(N):
        clk.charge(100000)
        c.append(h, row)
        t.tokens += 1
        t.text(PIECE)
        t.event(tm.EV_REFUSED, -2, 1, 3)
        t.tick()


ticks()  # once unlocked: first-time paths
capn[0] = 0
no_alloc("%d telemetry ticks (periodic, event and text frames) with counters, KV appends and text" % N, ticks)
check(capn[0] > 0, "frames were written under the lock")
for f in frames(CAP, capn[0]):
    check(f[4] <= 115 or f[0] != tm.T_PERIODIC, "periodic frame within budget under the lock")
state[0] = 1000
state[1] = t.tokens + 60
k.run(for_us=2000000)
state[1] = t.tokens + 60
capn[0] = 0
no_alloc("the telemetry task on the kernel beside a decode task (60 tokens)", lambda: k.run(for_us=5000000))
check(capn[0] > 0, "the task sent frames under the lock")
state[0] = 0

# --- bandwidth, DMA and thermal sources: tier rows every frame, categories rotated,
# throttles and thermal state changes as events ---
from firmware_py import board, bandwidth as bwm, thermal  # noqa: E402
try:
    from firmware_py import dma as dmam
except ImportError:
    dmam = None  # not in this tree yet
eq(tm.BW_FIELDS,
   (bwm.P_UTIL, bwm.P_BYTES, bwm.P_BYTES_G, bwm.P_WAITS, bwm.P_REFUSED, bwm.NSNAP), "bandwidth snapshot fields")
if dmam is not None:
    eq(tm.DMA_FIELDS,
       (dmam.ST_STALLS, dmam.ST_MAX_DEPTH, dmam.ST_DEPTH, dmam.ST_FULL, dmam.NST), "DMA stats fields")
PROFILE = two_tier_profile()
brd = board.loads(PROFILE)
clk3 = VirtualClock()
k3 = Kernel(clk3, max_tasks=6, verbose=False)
bw = bwm.Bandwidth(brd, kernel=k3, window_us=16000, buckets=16)
PS = bw.tier_id("psram")
bw.set_budget(PS, bwm.KV_READ, 100)  # kv_read may use 10 % of psram: admissions will wait
src = thermal.ModelTemp(clk3, ambient_c=60, rise_c=40, tau_us=2000000)
guard = thermal.Guard(k3, src, throttle_c=85, shrink_c=65, hysteresis_c=3, period_us=250000)
q = None
if dmam is not None:
    try:
        q = dmam.DMAQueue(k3, bw=bw, board=brd)  # dma.py is still changing: both constructors
    except TypeError:
        q = dmam.DMAQueue(k3, bw=bw)
t3 = tm.Telemetry(link, kernel=k3, bw=bw, dma=q, thermal=guard, heap=False)
lay_text = t3.layout_body().decode()
check("tier.1=psram" in lay_text and "cat.0=kv_read" in lay_text, "the layout names tiers and categories")


def reader(k):
    while True:
        bw.charge(PS, bwm.WEIGHTS, 20000)
        yield bw.admit(PS, bwm.KV_READ, 30000)  # over its budget: throttled
        k.charge(5000)
        yield


def guard_task(k):
    while True:
        guard.sample()
        yield k.sleep_us(250000)


k3.spawn("telemetry", 3, t3.task(k3))
k3.spawn("reader", 1, reader(k3))
k3.spawn("thermal", 2, guard_task(k3))
capn[0] = 0
k3.run(for_us=3000000)
fs = frames(CAP, capn[0])
recs = {}
evs = []
for f in fs:
    if f[0] == tm.T_PERIODIC:
        check(f[4] <= 115, "periodic frame with sources within 115 B (%d)" % f[4])
        for r, v in records(f[3]):
            recs.setdefault(r, []).append(v)
    if f[0] == tm.T_EVENT:
        evs += [code for code, v in records(f[3])]
check(tm.R_TIER in recs and any(v[0] == PS and v[2] > 0 for v in recs[tm.R_TIER]), "psram tier row with kB moved")
cats = set((v[0], v[1]) for v in recs.get(tm.R_BWCAT, []))
check((PS, bwm.WEIGHTS) in cats and (PS, bwm.KV_READ) in cats, "category rows rotated in: %r" % sorted(cats))
check(tm.R_TEMP in recs, "temperature rows")
check(tm.EV_THROTTLE in evs, "throttle events: %r" % evs)
check(tm.EV_THERMAL in evs, "thermal state change events")
if q is not None:
    check(tm.R_DMA in recs, "DMA depth row")


def ticks3():
    for _ in range(N):
        clk3.charge(100000)
        bw.charge(PS, bwm.KV_WRITE, 1000)
        guard.sample()
        t3.tick()


ticks3()
no_alloc("%d telemetry ticks with bandwidth, DMA and thermal sources" % N, ticks3)

# --- the heap record (MicroPython: read once a second) allocates nothing either ---
th = tm.Telemetry(link, clock=clk, pool=p, heap=True)


def heap_ticks():
    for _ in range(30):
        clk.charge(100000)
        th.tick()


heap_ticks()
capn[0] = 0
no_alloc("30 ticks with the heap record", heap_ticks)
if th.heap:
    heaps = [v for f in frames(CAP, capn[0]) if f[0] == tm.T_PERIODIC for r, v in records(f[3]) if r == tm.R_HEAP]
    eq(len(heaps), 3, "the heap record once a second: 3 in 3 s")
    check(heaps[0][0] > 0 and heaps[0][1] > 0, "free and allocated heap bytes")

# --- counters at their limits (docs/conventions.md "Counters and limits"): the board time
# wraps at MS_WRAP (10**9 ms), tokens / requests / byte counts carry at CARRY_N into their _g
# field (saturating), every other count saturates at 2**30 - 1, the cumulative ms and kB in
# the records are sent modulo 10**9, event arguments are clamped to +-ARG_MAX; each preset
# near its limit and bumped with the heap locked (2**30 is a big int on the 32-bit port) ---
NEAR = INT_MAX - 1
BIG = 1 << 40  # made before the heap lock (big ints on the 32-bit port)
NBIG = -BIG
capn[0] = 0
lay3 = kv.Layout(2, 2, 8, "fp32")
p3 = pool.Pool(lay3.block_bytes, 8)
c3 = kv.KVCache(p3, lay3, max_seqs=1)
h3 = c3.open(p3.add_region(8), "window", 40)
k3 = Kernel(VirtualClock(), max_tasks=5, verbose=False)
bw3 = bwm.Bandwidth(board.load("boards/esp32s3_n8r8.json"), kernel=k3)
PS3 = bw3.tier_id("psram")
t3 = tm.Telemetry(link, kernel=k3, pool=p3, cache=c3, bw=bw3, heap=False, events=8, text_bytes=64)
t3.watch_seq(h3, 40)
row3 = bytearray(lay3.row_bytes)
res3 = [0] * 12


def dec3(k):
    while True:
        c3.append(h3, row3)
        t3.tokens += 1
        t3.text(b"abcdefghijklmnopqrstuvwxyz")  # more than the link carries: text dropped
        bw3.charge(PS3, bwm.WEIGHTS, 1000)
        k.charge(20000)
        yield


def hog3(k):
    while True:  # sleeps through telemetry periods: skipped
        yield k.sleep_us(2000000)
        k.charge(350000)
        yield


tt3 = k3.spawn("telemetry", 3, t3.task(k3))
k3.spawn("decode", 1, dec3(k3))
k3.spawn("hog", 2, hog3(k3))
k3.run(for_us=1000000)  # warm-up
for name in ("skipped", "events_dropped", "text_dropped", "sent", "periodic_sent", "write_errors", "layouts",
             "tokens_g", "requests_g", "sent_bytes_g", "periodic_bytes_g"):
    setattr(t3, name, NEAR)
dms3 = tm.MS_WRAP - 500 - t3.ms  # the board time wraps half a second from now
dtok3 = CARRY_N - 3 - t3.tokens  # the tokens carry after 3 more
for i in range(len(t3.ms_hist)):  # the tok/s history, as if the board had run that long
    t3.ms_hist[i] = (t3.ms_hist[i] + dms3) % tm.MS_WRAP
    t3.tok_hist[i] += dtok3
t3.ms += dms3
t3.tokens += dtok3
t3.requests = CARRY_N - 1
t3.sent_bytes = CARRY_N - 1
t3.periodic_bytes = CARRY_N - 1
o3 = (PS3 * (bw3.n_cat_max + 1) + bw3.n_cat_max) * bwm.NSTAT  # psram's all-categories row
bw3.st[o3 + bwm.S_BYTES_G] = NEAR  # 1.07 * 10**18 B: kB would pass the small ints
bw3.st[PS3 * (bw3.n_cat_max + 1) * bwm.NSTAT + bwm.S_BYTES_G] = NEAR  # the weights row
tt3.st[S_RUN_S] = 1 << 29  # 17 years: run_ms and busy_ms would pass the small ints
k3.totals[T_IDLE_S] = 1 << 29


def limits3():
    t3.requests += 1  # what serve does at a request's start
    k3.run(for_us=700000)  # the tokens carry at once, the board time wraps after 500 ms
    res3[11] = t3.tok_s_x10
    k3.run(for_us=1300000)
    for j in range(12):
        t3.event(tm.EV_EVICT, j, 0, 0)  # a ring of 8: 4 or more dropped
    res3[0] = t3.event(tm.EV_LAST + 1, 0, 0, 0)  # not a defined event type
    res3[1] = t3.event(255, 0, 0, 0)
    res3[2] = t3.event(0, 0, 0, 0)
    res3[3] = t3.event(tm.EV_EVICT, 1.5, 0, 0)
    res3[4] = t3.event(tm.EV_EVICT, 0, True, 0)
    res3[5] = t3.event(tm.EV_EVICT, 0, 0, None)
    res3[6] = t3.watch_seq(1.5, 0)
    res3[7] = t3.watch_seq(h3, 1.0)
    k3.run(for_us=1000000)  # the ring drains
    res3[8] = t3.event(tm.EV_EVICT, BIG, NBIG, INT_MAX)  # clamped to +-ARG_MAX
    res3[9] = t3.ev[((t3.ev_head + t3.ev_n - 1) % t3.ev_cap) * 5 + 2]
    res3[10] = t3.ev[((t3.ev_head + t3.ev_n - 1) % t3.ev_cap) * 5 + 3]
    k3.run(for_us=500000)


no_alloc("ticks, frames, events, text with every telemetry counter at its limit, the board time wrapping", limits3)
eq(res3[:8], [E_RANGE] * 8, "undefined event codes, non-int arguments, a bad watch_seq: E_RANGE")
eq((res3[8], res3[9], res3[10]), (OK, tm.ARG_MAX, -tm.ARG_MAX), "event arguments past +-ARG_MAX are clamped")
for name in ("skipped", "events_dropped", "text_dropped", "sent", "periodic_sent", "sent_bytes_g", "periodic_bytes_g",
             "tokens_g", "requests_g"):
    eq(getattr(t3, name), INT_MAX, "Telemetry.%s saturated at 2**30 - 1" % name)
check(t3.ms < 10000, "the board time wrapped at MS_WRAP: %d ms" % t3.ms)
check(t3.tokens < 1000 and t3.requests == 0, "tokens and requests carried: %d, %d" % (t3.tokens, t3.requests))
check(t3.sent_bytes < CARRY_N and t3.periodic_bytes < CARRY_N, "the byte counts carried")
check(0 < res3[11] <= 500, "tok/s over a second holding the tokens' carry and the board time's wrap: %d" % res3[11])
t3.write_errors = NEAR
t3.layouts = NEAR
t3.request_layout()
ERR3 = OSError(5)


def link_fails(buf, n):
    raise ERR3


t3.write = link_fails
t3.tick()  # the layout frame allocates: not locked
eq((t3.write_errors, t3.layouts), (INT_MAX, NEAR), "write_errors saturated; a layout the link refused is not counted sent")
t3.write = link
t3.clock.t += 1000000  # a second later: the credit refilled
t3.tick()  # the layout goes now
eq((t3.write_errors, t3.layouts), (INT_MAX, INT_MAX), "write_errors and layouts saturated")
# the frames: every header time below MS_WRAP and wrapping once; every record value a small int
fr3 = frames(CAP, capn[0])
ms3 = [f[2] for f in fr3]
check(all(m < tm.MS_WRAP for m in ms3), "every frame's board time is below MS_WRAP")
eq(sum(1 for i in range(1, len(ms3)) if ms3[i] < ms3[i - 1]), 1, "the board time went back once: the wrap")
big3 = 0
kinds3 = {}
for fr in fr3:
    ftype, body = fr[0], fr[3]
    if ftype not in (tm.T_PERIODIC, tm.T_EVENT):
        continue
    for rid, vals in records(body):
        kinds3[rid] = 1
        for v in vals:
            if v > INT_MAX:
                big3 += 1
eq(big3, 0, "every record value is a small int on the ESP32")
check(tm.R_TIER in kinds3 and tm.R_KERNEL in kinds3 and tm.R_TASK in kinds3, "tier, kernel and task rows sent: %r" % sorted(kinds3))
rd3 = tm.CommandReader(lambda ft, body, seq: None)
rd3.good = rd3.corrupt = rd3.ignored = NEAR
CMD3 = bytearray(tm.encode_command(tm.T_CMD_STOP, b"", 1))
BAD3 = bytearray(b"\x00fe01zz\x00")
SHORT3 = bytearray(b"\x00" + b"ab" * 8 + b"\x00")


def reader3():
    rd3.feed(b"hello")  # outside any frame: ignored
    rd3.feed(BAD3)  # a non-hex byte inside a candidate: corrupt
    rd3.feed(SHORT3)  # too short for a frame: corrupt


no_alloc("command reader counts at their limits (ignored bytes, corrupt candidates)", reader3)
rd3.feed(CMD3)
rd3.feed(CMD3)
eq((rd3.good, rd3.corrupt, rd3.ignored), (INT_MAX, INT_MAX, INT_MAX), "CommandReader counts saturated")

# --- a layout longer than one frame: whole lines in parts "part=I/N", the parts a short
# credit held back sent at the next ticks without allocating ---
capn[0] = 0
clk4 = VirtualClock()
meta4 = {}
for i in range(30):
    meta4["m.%02d" % i] = "v" * 70
t4 = tm.Telemetry(link, clock=clk4, heap=False, link_bps=1200, meta=meta4)
body4 = t4.layout_body()
check(len(body4) > 2 * tm.MAX_PAYLOAD, "a layout of %d bytes: three frames or more" % len(body4))
t4.credit = tm.wire_len(tm.MAX_PAYLOAD)  # room for one part now
t4.want_layout = False
check(t4.send_layout() > 0, "part 1 sent at once")
eq(t4.lay_part, 1, "one part sent, the rest held back by the credit")
check(t4.lay_parts >= 3, "parts: %d" % t4.lay_parts)


def ticks4():
    for _ in range(80):
        clk4.charge(100000)
        t4.tick()


no_alloc("the layout's remaining parts sent at later ticks (1,200 B/s link)", ticks4)
eq(t4.lay_part, t4.lay_parts, "every part sent")
fs4 = frames(CAP, capn[0])
parts4 = [f[3] for f in fs4 if f[0] == tm.T_LAYOUT]
eq(len(parts4), t4.lay_parts, "one layout frame per part")
check(all(tm.HDR + len(b) <= tm.MAX_PAYLOAD for b in parts4), "every part within MAX_PAYLOAD")
lines4 = []
for i in range(len(parts4)):
    ls = parts4[i].split(b"\n")
    eq(ls[0], ("part=%d/%d" % (i + 1, len(parts4))).encode(), "part %d opens with its part line" % (i + 1))
    lines4.extend(ls[1:])
eq(b"\n".join(lines4), body4, "the parts' lines are the layout's, whole, in order")
check(any(f[0] == tm.T_PERIODIC for f in fs4[:-1]), "periodic frames went on between the parts")

# --- a short write (a UART or USB-CDC taking part of a frame) is not a frame sent ---
SW = array("i", [0, 0])  # [bytes each write may take (-1: all), writes cut short]


def short_link(buf, n):
    m = SW[0]
    if m < 0 or m >= n:
        link(buf, n)
        return n
    link(buf, m)
    SW[1] += 1
    return m


capn[0] = 0
clk5 = VirtualClock()
t5 = tm.Telemetry(short_link, clock=clk5, heap=False)
t5.tick()  # the layout (allocates)
sent0, seq0, short0 = t5.sent, t5.seq, t5.short_writes
SW[0] = 7
t5.event(tm.EV_EVICT, 3, 0, 0)
R5 = array("i", [0, 0])


def short_tick():
    clk5.t += 100000
    R5[0] = t5.tick()
    R5[1] = t5.ev_n


no_alloc("a tick whose frames the link cuts short", short_tick)
eq((R5[0], t5.sent, t5.seq), (OK, sent0, seq0), "cut frames are not counted sent, their sequence numbers not used")
check(t5.short_writes - short0 >= 2, "the cut event and periodic frames counted as short writes: %d" % (t5.short_writes - short0))
eq(R5[1], 1, "the event stays queued for the next frame")
check(t5.skipped >= 1, "the periodic frame counted skipped")
SW[0] = -1
clk5.t += 100000
t5.tick()
eq(t5.ev_n, 0, "the link takes whole frames again: the event sent")
check(t5.sent - sent0 >= 2 and t5.seq - seq0 == t5.sent - sent0, "frames sent again, sequence numbers without a gap")
sent1 = t5.sent
SW[0] = 0
clk5.t += 100000
t5.tick()  # a write that takes nothing at all (a UART's timeout: None from stream_writer, 0 here)
eq(t5.sent, sent1, "a write of 0 bytes is not a frame sent")
eq(t5.stats()["short_writes"], t5.short_writes, "short_writes in stats()")
# all but the closing 0x00: the frame is whole on the wire (the next frame's opening 0x00
# ends it), so it counts as sent and is not sent again
SW[0] = -1
t5.event(tm.EV_EVICT, 4, 0, 0)
sent2, short2 = t5.sent, t5.short_writes


def all_but_last(buf, n):
    link(buf, n - 1)
    return n - 1


t5.write = all_but_last
clk5.t += 100000
t5.tick()
t5.write = short_link
eq((t5.ev_n, t5.short_writes), (0, short2), "a write missing only the closing 0x00 is a frame sent: the event is not kept")
check(t5.sent > sent2, "frames counted sent")

# --- the same bytes on every interpreter: a fresh deterministic run ---
capn[0] = 0
lay2 = kv.Layout(2, 2, 8, "fp32")
p2 = pool.Pool(lay2.block_bytes, 8)
c2 = kv.KVCache(p2, lay2, max_seqs=1)
h2 = c2.open(p2.add_region(8), "window", 40)
clk2 = VirtualClock()
k2 = Kernel(clk2, max_tasks=4, verbose=False)
t2 = tm.Telemetry(link, kernel=k2, pool=p2, cache=c2, heap=False, meta={"model": "digest"})
t2.watch_seq(h2, 40)
row2 = bytearray(lay2.row_bytes)


def dec2(k):
    for _ in range(60):
        c2.append(h2, row2)
        t2.tokens += 1
        t2.text(b"ab")
        k.charge(20000)
        yield


k2.spawn("telemetry", 2, t2.task(k2))
k2.spawn("decode", 1, dec2(k2))
k2.run(for_us=2000000)
print("digest %08x %d" % (tm.crc32(CAP, 0, capn[0]), capn[0]))
done()
