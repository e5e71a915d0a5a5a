# Co-running workloads for the memory-tier scenarios (host/bench/tiers.py, and later the
# emulator's scenarios): kernel tasks that move their data through the DMA descriptor
# queue (firmware_py/dma.py) beside a decoding model, each with its own statistics in a
# preallocated array('i'). Everything a period does (release, submit, wait, stats) is
# allocation-free on MicroPython (tests/firmware/fw_workloads.py runs the periods with the
# heap locked on the 64-bit and 32-bit unix ports and on CPython).
#
#   a = AudioCapture(k, q, sram_tier, psram_tier, cat)        # boot: buffers, ids, stats
#   k.spawn("audio", 7, a.task())
#   w = WifiBurst(k, q, psram_tier, sram_tier, cat, bw=bw, paced=True)
#   k.spawn("wifi", 4, w.task())
#
# AudioCapture: an I2S microphone (16 kHz, 16-bit mono by default) whose peripheral DMA
# fills a ping-pong buffer in internal SRAM, one half per period (512 B every 16 ms). At
# each half's end (the release) the task moves that half to a ring of slots in PSRAM by
# the DMA queue. Deadline: the move must have landed before the I2S peripheral comes
# back to write the same half, i.e. (halves - 1) periods after the release (16 ms with two
# halves): later, samples not yet moved are overwritten. A period whose move lands after
# its deadline is a miss; latency = landing time - release. A period whose half was
# already being overwritten when the task got the CPU is lost (a miss, not moved): the
# task goes on with the newest half not yet overwritten, as an I2S driver does on overrun.
#
# WifiBurst: a Wi-Fi sender that every period (100 ms) sends a burst of packets whose
# payload lives in PSRAM, each moved by the DMA queue into the driver's TX buffers in
# internal SRAM (a ring of tx_bufs buffers). Unpaced, it submits the whole burst at once
# (blocking only while the ring is full); paced, it sends `group` packets at a time, each
# group only when the tracker says the category's window has room for it
# (Bandwidth.wait_us: nothing is booked, the DMA engine charges the bytes when it moves
# them, once) and after the previous group has landed (so the window holds its bytes).
#
# SensorRead: a periodic sensor read (period, bytes into SRAM over a bus, by the CPU or the
# DMA queue, CPU µs of compute, a deadline). WakeWord: a wake-word detector, a CPU task per
# audio frame with a deadline, optionally reading each frame from an AudioCapture's ring.
#   s = SensorRead(k, bw, sram_tier, cat, period_us=10000, read_bytes=64, cpu_us=200)
#   w = WakeWord(k, audio=a)                                  # 2 ms per 16 ms frame (estimate)
# Every workload's stats() has "released" (periods released) and "deadline_misses".
from array import array

from firmware_py.bandwidth import K_READ, K_WRITE
from firmware_py.compat import const, ticks_add, ticks_diff
from firmware_py.status import CARRY_N, E_FULL, INT_MAX, OK

_US_PER_S = const(1000000)

# AudioCapture.st fields
A_PERIODS = const(0)  # periods completed (moves landed or refused)
A_MISSES = const(1)  # periods whose move landed after the deadline (or was refused)
A_WORST_US = const(2)  # worst latency: release -> the move landed, µs
A_LAT_US = const(3)  # total latency, µs part
A_LAT_S = const(4)  # ... whole seconds
A_START_WORST_US = const(5)  # worst release -> the task ran (the CPU was held by others)
A_BYTES = const(6)  # bytes moved, part below CARRY_N
A_BYTES_G = const(7)  # ... times CARRY_N
A_REFUSED = const(8)  # submits refused (a status < 0: nothing moved)
A_LAST_US = const(9)  # latency of the last period moved
A_LOST = const(10)  # periods never moved: the task ran only after their half was overwritten (misses too)
NA = const(11)
AUDIO_FIELDS = ("periods", "misses", "worst_us", "lat_us", "lat_s", "start_worst_us", "bytes", "bytes_g",
                "refused", "last_us", "lost")

# WifiBurst.st fields
W_BURSTS = const(0)  # bursts completed (every packet landed)
W_PACKETS = const(1)  # packets submitted (accepted by the queue)
W_BYTES = const(2)  # bytes submitted, part below CARRY_N
W_BYTES_G = const(3)  # ... times CARRY_N
W_WAITS = const(4)  # throttled waits (paced: the window had no room for the next group)
W_WAIT_US = const(5)  # their total time, µs part
W_WAIT_S = const(6)  # ... whole seconds
W_WORST_US = const(7)  # worst burst duration: release -> its last packet landed
W_LATE = const(8)  # bursts not done by the next release
W_REFUSED = const(9)  # submits refused (status < 0)
NW = const(10)
WIFI_FIELDS = ("bursts", "packets", "bytes", "bytes_g", "waits", "wait_us", "wait_s", "worst_us", "late", "refused")


class WorkloadError(ValueError):
    # a configuration mistake (sizes, periods, tiers); one line
    pass


# Every st field stays a small int on the ESP32 (below 2**30): the bytes carry at CARRY_N
# into their _G field, the times carry their µs into whole seconds (_S), and those second
# fields saturate at INT_MAX (2**30 - 1; the low field then stays at its top: CARRY_N - 1,
# 999,999 µs); every event count (periods, misses, lost, refused, bursts, packets, waits,
# late) saturates at INT_MAX; the worst / last times are ticks_diff values (< 2**29).

def _inc(st, i):
    # st[i] += 1 saturating at INT_MAX; no allocation
    if st[i] < INT_MAX:
        st[i] += 1


def _add(st, i, n):
    # st[i] += n (0 <= n < CARRY_N) carrying into st[i + 1] at CARRY_N, which saturates;
    # no allocation
    v = st[i] + n
    if v >= CARRY_N:
        if st[i + 1] >= INT_MAX:
            st[i] = CARRY_N - 1
            return
        st[i + 1] += 1
        v -= CARRY_N
    st[i] = v


def _add_us(st, i, us):
    # st[i] (µs) += us (0 <= us < 2**30 - 10**6) carrying whole seconds into st[i + 1],
    # which saturates; no allocation
    v = st[i] + us
    if v >= _US_PER_S:
        q = v // _US_PER_S
        s = st[i + 1]
        if q >= INT_MAX - s:
            st[i + 1] = INT_MAX
            st[i] = _US_PER_S - 1
            return
        st[i + 1] = s + q
        v %= _US_PER_S
    st[i] = v


def _pos_int(name, v, lo=1, hi=0x3FFFFFFF):
    if v.__class__ is not int or not lo <= v <= hi:
        raise WorkloadError("%s must be an int in %d..%d, got %r" % (name, lo, hi, v))
    return v


class AudioCapture:
    # k: the Kernel; q: the dma.DMAQueue; sram_tier / psram_tier: tier numbers of the
    # queue's board (where the I2S buffer and the PSRAM ring live); cat: the payload's
    # category (a tracker category: e.g. bw.add_category("audio")). rate_hz, sample_bytes,
    # period_us: the stream (period bytes = rate x sample bytes x period, a multiple of 32:
    # the GDMA's PSRAM block). halves: the I2S ping-pong buffer's halves (>= 2). slots: PSRAM
    # ring slots. deadline_us: default (halves - 1) periods. fill: write each half's samples
    # (a pattern of the period number: what the I2S wrote) before moving it, so a reader
    # can check the bytes that landed (check_slot)
    def __init__(self, k, q, sram_tier, psram_tier, cat, rate_hz=16000, sample_bytes=2, period_us=16000,
                 halves=2, slots=16, deadline_us=0, fill=True):
        _pos_int("rate_hz", rate_hz, 1, 1000000)
        _pos_int("sample_bytes", sample_bytes, 1, 8)
        _pos_int("period_us", period_us, 100, 10000000)
        _pos_int("halves", halves, 2, 64)
        _pos_int("slots", slots, 1, 4096)
        prod = rate_hz * sample_bytes * period_us
        if prod % 1000000:
            raise WorkloadError("audio: %d Hz x %d B x %d us is not a whole number of bytes" % (rate_hz, sample_bytes, period_us))
        nb = prod // 1000000
        if nb % 32 or nb > 4064:
            raise WorkloadError("audio: a period of %d B must be a multiple of 32 B and at most 4,064 B (one PSRAM descriptor)" % nb)
        if deadline_us.__class__ is not int or deadline_us < 0:
            raise WorkloadError("audio: deadline_us must be an int >= 0, got %r" % (deadline_us,))
        self.k = k  # the Kernel
        self.q = q  # the DMA queue
        self.cat = cat  # payload category
        self.period_us = period_us  # one half fills in this long
        self.nb = nb  # bytes per period (one half)
        self.halves = halves  # halves of the I2S buffer
        self.slots = slots  # PSRAM ring slots
        self.deadline_us = deadline_us or (halves - 1) * period_us  # release -> landed, at most
        self.fill = bool(fill)
        self.i2s = bytearray(halves * nb)  # the I2S peripheral's buffer (internal SRAM)
        self.ring = bytearray(slots * nb)  # where the samples go (PSRAM)
        self.src = q.add_buffer(self.i2s, sram_tier)
        self.dst = q.add_buffer(self.ring, psram_tier)
        self.st = array("i", bytes(4 * NA))  # stats, A_*
        self.landed = array("i", [-1] * slots)  # PSRAM slot -> the period whose samples landed there last (-1: none)
        # periods released so far, modulo seq_mod: the largest multiple of halves x slots below
        # 2**30, so the half (seq % halves) and the PSRAM slot (seq % slots) go round unbroken
        self.seq_mod = INT_MAX // (halves * slots) * (halves * slots)
        self.seq = 0
        self.release = 0  # ticks of the current period's release
        self.running = False  # task() started
        self.last_landed = -1  # the newest period whose samples landed in the ring (-1: none yet): WakeWord reads it

    # the byte the I2S wrote at i of period n (a checkable pattern); no allocation
    @staticmethod
    def sample(n, i):
        return ((n & 0xFF) * 37 + i * 7 + (i >> 8)) & 0xFF  # n & 0xFF: n * 37 would pass the small ints

    def _fill(self, half, n):
        b = self.i2s
        o = half * self.nb
        i = 0
        e = self.nb
        while i < e:
            b[o + i] = ((n & 0xFF) * 37 + i * 7 + (i >> 8)) & 0xFF
            i += 1

    # (slots checked, slots that hold what the I2S wrote in the period that landed there
    # last): every landed byte is checked against its pattern (host checks; allocates)
    def check(self):
        n_ok = n = 0
        for j in range(self.slots):
            p = self.landed[j]
            if p < 0:
                continue
            n += 1
            o = j * self.nb
            if all(self.ring[o + i] == self.sample(p, i) for i in range(self.nb)):
                n_ok += 1
        return n, n_ok

    # the task's generator (spawn it at the highest priority): first release one period
    # after it starts; every release moves one half. Per period: no allocation
    def task(self):
        k = self.k
        q = self.q
        st = self.st
        nb = self.nb
        rel = ticks_add(k.now(), self.period_us)
        self.running = True
        while True:
            yield k.sleep_until(rel)
            late = ticks_diff(k.now(), rel)  # the CPU was held by another task this long
            if late > st[A_START_WORST_US]:
                st[A_START_WORST_US] = late
            while late >= self.deadline_us:  # that half is already being overwritten: its samples are lost
                self.seq = self.seq + 1 if self.seq < self.seq_mod - 1 else 0
                _inc(st, A_PERIODS)
                _inc(st, A_MISSES)
                _inc(st, A_LOST)
                rel = ticks_add(rel, self.period_us)
                late = ticks_diff(k.now(), rel)
            if late < 0:  # every period released so far was lost: wait for the next one
                continue
            self.release = rel
            n = self.seq
            self.seq = n + 1 if n < self.seq_mod - 1 else 0
            half = n % self.halves
            if self.fill:
                self._fill(half, n)
            c = yield q.submit(self.src, half * nb, self.dst, (n % self.slots) * nb, nb, self.cat)
            if c >= 0:
                rv = yield q.wait(c)
            else:
                rv = c
            lat = ticks_diff(k.now(), rel)
            _inc(st, A_PERIODS)
            st[A_LAST_US] = lat
            if rv != OK:
                _inc(st, A_REFUSED)
                _inc(st, A_MISSES)
            else:
                _add(st, A_BYTES, nb)
                self.landed[n % self.slots] = n
                self.last_landed = n
                if lat > self.deadline_us:
                    _inc(st, A_MISSES)
            if lat > st[A_WORST_US]:
                st[A_WORST_US] = lat
            _add_us(st, A_LAT_US, lat)
            rel = ticks_add(rel, self.period_us)

    # the stats as a dict (allocates: reporting only)
    def stats(self):
        st = self.st
        p = st[A_PERIODS]
        m = p - st[A_LOST]  # periods whose move was attempted
        lat = st[A_LAT_S] * _US_PER_S + st[A_LAT_US]
        return {"released": p, "deadline_misses": st[A_MISSES],
                "periods": p, "misses": st[A_MISSES], "lost": st[A_LOST], "refused": st[A_REFUSED],
                "worst_latency_us": st[A_WORST_US], "mean_latency_us": round(lat / m, 1) if m else 0.0, "worst_start_us": st[A_START_WORST_US],
                "bytes": st[A_BYTES_G] * CARRY_N + st[A_BYTES], "deadline_us": self.deadline_us,
                "period_us": self.period_us, "period_bytes": self.nb}


class WifiBurst:
    # k: the Kernel; q: the DMA queue; psram_tier / sram_tier: where the payload and the
    # driver's TX buffers live; cat: the payload's category. packet_bytes (a multiple of
    # 32, <= 4,064), packets per burst, period_us between releases, offset_us: the first
    # release after the start. tx_bufs: TX buffers in SRAM (packet i goes to buffer
    # i % tx_bufs). bw + paced: send `group` packets at a time, each group when the
    # tracker's window for (psram_tier, cat) has room (its budget), after the previous one
    # landed; unpaced: the whole burst at once
    def __init__(self, k, q, psram_tier, sram_tier, cat, packet_bytes=1472, packets=64, period_us=100000,
                 offset_us=0, tx_bufs=16, bw=None, paced=False, group=11):
        _pos_int("packet_bytes", packet_bytes, 32, 4064)
        if packet_bytes % 32:
            raise WorkloadError("wifi: packet_bytes must be a multiple of 32 (the GDMA's PSRAM block), got %d" % packet_bytes)
        _pos_int("packets", packets, 1, 65536)
        _pos_int("period_us", period_us, 100, 100000000)
        _pos_int("offset_us", offset_us, 0, 100000000)
        _pos_int("tx_bufs", tx_bufs, 1, 1024)
        _pos_int("group", group, 1, 65536)
        if paced and bw is None:
            raise WorkloadError("wifi: paced needs the bandwidth tracker (bw=)")
        self.k = k
        self.q = q
        self.bw = bw  # the tracker pacing the groups (paced), or None
        self.paced = bool(paced)
        self.cat = cat
        self.ps = psram_tier
        self.pb = packet_bytes
        self.packets = packets
        self.period_us = period_us
        self.offset_us = offset_us
        self.tx_bufs = tx_bufs
        self.group = group
        if self.paced:
            most = bw.piece(psram_tier, cat)
            if most < 0:
                raise WorkloadError("wifi: tier %r or category %r is not one of the tracker's" % (psram_tier, cat))
            most //= packet_bytes
            if most < 1:
                raise WorkloadError("wifi: the category's budget is smaller than one packet")
            if most < group:
                self.group = most
        self.payload = bytearray(packets * packet_bytes)  # what is sent (PSRAM)
        for i in range(len(self.payload)):
            self.payload[i] = (i * 13 + (i >> 9)) & 0xFF
        self.tx = bytearray(tx_bufs * packet_bytes)  # the driver's TX buffers (internal SRAM)
        self.src = q.add_buffer(self.payload, psram_tier)
        self.dst = q.add_buffer(self.tx, sram_tier)
        self.st = array("i", bytes(4 * NW))  # stats, W_*

    # the task's generator. Per burst: no allocation
    def task(self):
        k = self.k
        q = self.q
        st = self.st
        pb = self.pb
        rel = ticks_add(k.now(), self.offset_us)
        while True:
            yield k.sleep_until(rel)
            i = 0
            c = -1
            total = self.packets
            while i < total:
                n = total - i
                if self.paced:
                    if n > self.group:
                        n = self.group
                    while True:  # the window's room for this group, as the tracker's admission would grant it
                        w = self.bw.wait_us(self.ps, self.cat, n * pb)
                        if w == E_FULL:
                            w = self.bw.bucket_us
                        if w <= 0:
                            break
                        _inc(st, W_WAITS)
                        _add_us(st, W_WAIT_US, w)
                        yield k.sleep_us(w)
                j = 0
                while j < n:
                    p = i + j
                    r = yield q.submit(self.src, p * pb, self.dst, (p % self.tx_bufs) * pb, pb, self.cat)
                    if r < 0:
                        _inc(st, W_REFUSED)
                    else:
                        c = r
                        _inc(st, W_PACKETS)
                        _add(st, W_BYTES, pb)
                    j += 1
                if self.paced and c >= 0:
                    yield q.wait(c)  # landed: the engine has charged it, the window holds it
                i += n
            if c >= 0:
                yield q.wait(c)
            d = ticks_diff(k.now(), rel)
            _inc(st, W_BURSTS)
            if d > st[W_WORST_US]:
                st[W_WORST_US] = d
            if d > self.period_us:
                _inc(st, W_LATE)
            rel = ticks_add(rel, self.period_us)
            if ticks_diff(k.now(), rel) > 0:  # a burst longer than the period: the next starts now
                rel = k.now()

    # the stats as a dict (allocates: reporting only)
    def stats(self):
        st = self.st
        return {"released": st[W_BURSTS], "deadline_misses": st[W_LATE],
                "bursts": st[W_BURSTS], "packets": st[W_PACKETS], "bytes": st[W_BYTES_G] * CARRY_N + st[W_BYTES],
                "throttled_waits": st[W_WAITS], "throttled_wait_us": st[W_WAIT_S] * _US_PER_S + st[W_WAIT_US],
                "worst_burst_us": st[W_WORST_US], "late_bursts": st[W_LATE], "refused": st[W_REFUSED],
                "packet_bytes": self.pb, "packets_per_burst": self.packets, "period_us": self.period_us,
                "paced": self.paced, "group": self.group if self.paced else self.packets}


# --- periodic CPU tasks: SensorRead and WakeWord -------------------------------------------
#
# Both release every period_us (the first at offset_us after the task starts, or one period
# when offset_us is 0), do their work, and must be done within deadline_us of the release
# (default: one period). Latency = done - release; a period done later than its deadline is
# a deadline miss. A task so late that one or more further releases have passed when it gets
# the CPU (another task held it) skips them: each skipped release counts as released and
# missed (P_SKIPPED too), and the task serves the newest release, as a periodic timer whose
# callback overran does. Per period: no allocation (tests/firmware/fw_workloads2.py).

# SensorRead.st / WakeWord.st fields (the same layout for both)
P_RELEASED = const(0)  # periods released (served or skipped)
P_MISSES = const(1)  # periods done past their deadline, skipped, or whose read was refused
P_SKIPPED = const(2)  # releases skipped: a later one had passed when the task got the CPU (misses too)
P_WORST_US = const(3)  # worst latency: release -> done
P_LAT_US = const(4)  # total latency of the periods served, µs part
P_LAT_S = const(5)  # ... whole seconds
P_START_WORST_US = const(6)  # worst release -> the task ran
P_BYTES = const(7)  # bytes read, part below CARRY_N
P_BYTES_G = const(8)  # ... times CARRY_N
P_REFUSED = const(9)  # reads the tracker or the DMA queue refused (status < 0: nothing moved)
P_LAST_US = const(10)  # latency of the last period served
P_CPU_US = const(11)  # CPU µs charged (compute and CPU copies), µs part
P_CPU_S = const(12)  # ... whole seconds
P_STALE = const(13)  # WakeWord: periods with no new audio frame (the audio had not landed one since)
NP = const(14)
PERIODIC_FIELDS = ("released", "misses", "skipped", "worst_us", "lat_us", "lat_s", "start_worst_us", "bytes",
                   "bytes_g", "refused", "last_us", "cpu_us", "cpu_s", "stale")

# The wake-word detector's default compute per 16 ms frame: Espressif's ESP-SR benchmark
# lists "Quantised WakeNet9 @ 2 channel" on the ESP32-S3 at 4 ms average running time per
# 32 ms frame (esp-sr docs/benchmark, WakeNet resource occupancy); half of that per 16 ms
# frame. An estimate: a different network (microWakeWord, a DS-CNN) or one channel differs.
WAKEWORD_CPU_US = const(2000)
WAKEWORD_SOURCE = ("estimate: ESP-SR benchmark, Quantised WakeNet9 @ 2 channel on ESP32-S3, 4 ms per 32 ms frame, "
                   "scaled to 2 ms per 16 ms frame")


# the start of a period: the task resumed at now for the release rel; skipped releases
# (every one at or before now - period) are counted; returns the release to serve. No allocation
def _catch_up(st, rel, period, now):
    late = ticks_diff(now, rel)
    if late > st[P_START_WORST_US]:
        st[P_START_WORST_US] = late
    while late >= period:
        _inc(st, P_RELEASED)
        _inc(st, P_MISSES)
        _inc(st, P_SKIPPED)
        rel = ticks_add(rel, period)
        late -= period
    _inc(st, P_RELEASED)
    return rel


# the end of a served period released at rel: latency, worst, misses; no allocation
def _finish(st, rel, now, deadline, ok):
    lat = ticks_diff(now, rel)
    st[P_LAST_US] = lat
    if lat > st[P_WORST_US]:
        st[P_WORST_US] = lat
    _add_us(st, P_LAT_US, lat)
    if not ok or lat > deadline:
        _inc(st, P_MISSES)


# the common part of the two stats dicts (allocates: reporting only)
def _periodic_stats(self, unserved=0):
    # unserved: releases not skipped that served nothing either (a wake word's stale periods):
    # out of the mean latency's count, as they are out of its sum
    st = self.st
    served = st[P_RELEASED] - st[P_SKIPPED] - unserved
    lat = st[P_LAT_S] * _US_PER_S + st[P_LAT_US]
    return {"released": st[P_RELEASED], "deadline_misses": st[P_MISSES], "skipped": st[P_SKIPPED],
            "refused": st[P_REFUSED], "worst_latency_us": st[P_WORST_US],
            "mean_latency_us": round(lat / served, 1) if served > 0 else 0.0, "worst_start_us": st[P_START_WORST_US],
            "bytes": st[P_BYTES_G] * CARRY_N + st[P_BYTES], "cpu_us": st[P_CPU_S] * _US_PER_S + st[P_CPU_US],
            "deadline_us": self.deadline_us, "period_us": self.period_us}


class SensorRead:
    # A periodic sensor read (an IMU, an environment sensor over I2C/SPI): every period_us
    # it reads read_bytes from the peripheral into a buffer in internal SRAM, then spends
    # cpu_us of compute (filtering, packing: kernel.charge), and must be done within
    # deadline_us of the release (default one period).
    # k: the Kernel; bw: the bandwidth tracker; sram_tier: the tracker's tier number of
    # internal SRAM; cat: the reading's category (e.g. bw.add_category("sensor"), or
    # bandwidth.IO). bus_bytes_per_s: the peripheral bus's payload rate (e.g. 50,000 B/s
    # for I2C at 400 kHz): the transfer takes read_bytes / rate, during which the task
    # sleeps (interrupt-driven: the CPU is free); 0: no bus time. q: the DMA queue, or None:
    # with q the bytes go from the peripheral's FIFO (a buffer on the SRAM tier) into the
    # SRAM buffer by a GDMA descriptor (charged by the engine: read and written on SRAM),
    # without q the CPU copies them (charged here as an SRAM write of read_bytes, its
    # priced µs charged to the clock as CPU time)
    def __init__(self, k, bw, sram_tier, cat, period_us=10000, read_bytes=64, cpu_us=200, deadline_us=0,
                 offset_us=0, bus_bytes_per_s=0, q=None):
        _pos_int("period_us", period_us, 100, 100000000)
        _pos_int("read_bytes", read_bytes, 1, 4064)
        _pos_int("cpu_us", cpu_us, 0, 10000000)
        _pos_int("deadline_us", deadline_us, 0, 100000000)
        _pos_int("offset_us", offset_us, 0, 100000000)
        _pos_int("bus_bytes_per_s", bus_bytes_per_s, 0, 1000000000)
        if bw is None:
            raise WorkloadError("sensor: needs the bandwidth tracker (bw)")
        if bw.piece(sram_tier, cat) < 0:
            raise WorkloadError("sensor: tier %r or category %r is not one of the tracker's" % (sram_tier, cat))
        self.k = k
        self.bw = bw
        self.q = q
        self.tier = sram_tier
        self.cat = cat
        self.period_us = period_us
        self.nb = read_bytes
        self.cpu_us = cpu_us
        self.deadline_us = deadline_us or period_us
        self.offset_us = offset_us or period_us
        self.bus_bytes_per_s = bus_bytes_per_s
        self.bus_us = (read_bytes * _US_PER_S + bus_bytes_per_s - 1) // bus_bytes_per_s if bus_bytes_per_s else 0
        if self.bus_us > period_us:  # (period_us <= 1e8 < sched MAX_WAIT_US: one sleep takes it)
            raise WorkloadError("sensor: a read of %d B at %d B/s takes %d us on the bus, longer than its period of %d us"
                                % (read_bytes, bus_bytes_per_s, self.bus_us, period_us))
        self.buf = bytearray(read_bytes)  # the reading in internal SRAM
        self.fifo = bytearray(read_bytes)  # the peripheral's FIFO (what the sensor returned)
        if q is not None:
            self.src = q.add_buffer(self.fifo, sram_tier)
            self.dst = q.add_buffer(self.buf, sram_tier)
        self.st = array("i", bytes(4 * NP))  # stats, P_*
        self.seq = 0  # periods served, mod 2**16 (the FIFO's pattern)

    # the byte the sensor returns at i of reading n (a checkable pattern); no allocation
    @staticmethod
    def sample(n, i):
        return ((n & 0xFF) * 29 + i * 11 + 5) & 0xFF

    # the task's generator. Per period: no allocation
    def task(self):
        k = self.k
        st = self.st
        nb = self.nb
        fifo = self.fifo
        rel = ticks_add(k.now(), self.offset_us)
        while True:
            yield k.sleep_until(rel)
            rel = _catch_up(st, rel, self.period_us, k.now())
            n = self.seq & 0xFF
            i = 0
            while i < nb:  # what the sensor put in its FIFO
                fifo[i] = (n * 29 + i * 11 + 5) & 0xFF
                i += 1
            ok = True
            if self.bus_us:
                rv = yield k.sleep_us(self.bus_us)  # the bus transfer (the CPU is free)
                ok = rv >= 0  # (bus_us <= period_us: the kernel takes it; a refusal is a miss)
            if ok and self.q is not None:
                c = yield self.q.submit(self.src, 0, self.dst, 0, nb, self.cat)
                rv = (yield self.q.wait(c)) if c >= 0 else c
                ok = rv == OK
            elif ok:
                us = self.bw.move(self.tier, K_WRITE, self.cat, nb)  # the CPU writes SRAM
                if us < 0:
                    ok = False
                else:
                    i = 0
                    buf = self.buf
                    while i < nb:
                        buf[i] = fifo[i]
                        i += 1
                    if us > 0:
                        k.charge(us)
                        _add_us(st, P_CPU_US, us)
            if ok:
                _add(st, P_BYTES, nb)
            else:
                _inc(st, P_REFUSED)
            if self.cpu_us:
                k.charge(self.cpu_us)
                _add_us(st, P_CPU_US, self.cpu_us)
            _finish(st, rel, k.now(), self.deadline_us, ok)
            self.seq = (self.seq + 1) & 0xFFFF
            rel = ticks_add(rel, self.period_us)

    # the stats as a dict (allocates: reporting only)
    def stats(self):
        d = _periodic_stats(self)
        d["read_bytes"] = self.nb
        d["cpu_us_per_period"] = self.cpu_us
        d["bus_us"] = self.bus_us
        d["dma"] = self.q is not None
        return d


class WakeWord:
    # A wake-word detector: every audio frame (period_us, 16 ms at 16 kHz by default) it
    # runs cpu_us of a small keyword-spotting network (default WAKEWORD_CPU_US, an estimate:
    # see WAKEWORD_SOURCE) and must be done within deadline_us of the frame's release
    # (default one frame). audio: an AudioCapture, or None. With one, the detector consumes
    # the audio's newest frame that has landed in its PSRAM ring: the CPU reads it (its
    # bytes charged on the ring's tier in the audio's category, a kv-free read, and the
    # priced µs charged as CPU time), and the period, when not given, is the audio's; a
    # period in which no new frame has landed since the last one is stale (counted, no
    # compute: nothing to detect in). offset_us: the first release after the task starts
    # (default: one period and a quarter, when the audio's first frame has landed)
    def __init__(self, k, period_us=0, cpu_us=WAKEWORD_CPU_US, deadline_us=0, offset_us=0, audio=None):
        _pos_int("period_us", period_us, 0, 100000000)
        _pos_int("cpu_us", cpu_us, 0, 10000000)
        _pos_int("deadline_us", deadline_us, 0, 100000000)
        _pos_int("offset_us", offset_us, 0, 100000000)
        if audio is not None and not isinstance(audio, AudioCapture):
            raise WorkloadError("wakeword: audio must be an AudioCapture, got %r" % (audio,))
        if not period_us:
            period_us = audio.period_us if audio is not None else 16000
        if period_us < 100:
            raise WorkloadError("wakeword: period_us must be at least 100, got %d" % period_us)
        self.k = k
        self.audio = audio
        self.period_us = period_us
        self.cpu_us = cpu_us
        self.deadline_us = deadline_us or period_us
        self.offset_us = offset_us or period_us + period_us // 4
        self.bw = None
        self.tier = -1
        self.cat = -1
        self.nb = 0
        if audio is not None:
            self.bw = audio.q.bw
            if self.bw is None:
                raise WorkloadError("wakeword: the audio's DMA queue has no bandwidth tracker to charge the frame reads to")
            self.tier = audio.q.buf_tier[audio.dst]
            self.cat = audio.cat
            self.nb = audio.nb
        self.st = array("i", bytes(4 * NP))  # stats, P_*
        self.consumed = -1  # the audio period read last (-1: none)
        self.acc = 0  # a sum over the frames' bytes (the read is real: the host can check it)

    # the task's generator. Per period: no allocation
    def task(self):
        k = self.k
        st = self.st
        a = self.audio
        rel = ticks_add(k.now(), self.offset_us)
        while True:
            yield k.sleep_until(rel)
            rel = _catch_up(st, rel, self.period_us, k.now())
            ok = True
            run = True
            if a is not None:
                n = a.last_landed
                if n < 0 or n == self.consumed:
                    _inc(st, P_STALE)
                    run = False
                else:
                    us = self.bw.move(self.tier, K_READ, self.cat, self.nb)  # the CPU reads the ring
                    if us < 0:
                        ok = False
                        _inc(st, P_REFUSED)
                    else:
                        ring = a.ring
                        o = (n % a.slots) * self.nb
                        e = o + self.nb
                        s = 0
                        while o < e:
                            s += ring[o]
                            o += 1
                        self.acc = (self.acc + s) & 0xFFFFFF
                        self.consumed = n
                        _add(st, P_BYTES, self.nb)
                        if us > 0:
                            k.charge(us)
                            _add_us(st, P_CPU_US, us)
            if run and ok and self.cpu_us:
                k.charge(self.cpu_us)
                _add_us(st, P_CPU_US, self.cpu_us)
            if run:  # a stale period served nothing: not in the latencies nor the misses
                _finish(st, rel, k.now(), self.deadline_us, ok)
            rel = ticks_add(rel, self.period_us)

    # the stats as a dict (allocates: reporting only)
    def stats(self):
        d = _periodic_stats(self, self.st[P_STALE])
        d["stale"] = self.st[P_STALE]
        d["frame_bytes"] = self.nb
        d["cpu_us_per_frame"] = self.cpu_us
        d["cpu_source"] = WAKEWORD_SOURCE
        return d
