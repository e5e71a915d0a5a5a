# The flash tier of the KV cache: a file on the board's filesystem, opened once at boot and
# sized to n_slots block slots, each a whole number of 4 KiB sectors (a block image of
# block_bytes at the slot's start, the rest of its last sector unused), so two blocks
# never share a sector. tiers.py writes a sequence's rows into it (write-back, batched) and
# reads blocks back into staging buffers for the attention pass.
#
# Wear model (NOR flash under a filesystem that rewrites whole sectors): a sector is either
# erased or "holds programmed data". One transaction (begin() .. writes .. end(): one flush)
# rewrites each sector it touches once; a touched sector that already holds programmed data
# costs one erase (counted per sector), an erased one none, and afterwards every touched
# sector holds data. A file preallocated by writing it (programmed=True, the default: what
# opening a file "sized to n blocks" does on a real filesystem) starts with every sector
# programmed; programmed=False models freshly erased sectors. Each erase costs erase_us
# (45 ms) of flash time; a sector endures `endurance` erases (100,000 on this class of
# flash). On a board LittleFS does its own copy-on-write and hides erases: there the same
# file calls run, and these counters are the emulator's model (docs/tiers-placement.md).
#
# Hot paths (alloc, free, begin, write, end, spend, read_block, read_at) allocate nothing on
# MicroPython: its streams take write(buf, off, n) and readinto(buf, n) without slicing,
# and seek/write/readinto on the unix port allocate nothing (tests/firmware/fw_tiers.py
# measures it with the heap locked). On CPython a memoryview window is made per call (CPython
# is never heap-locked). Results follow status.py: an int >= 0 or E_* with nothing changed.
# Every int argument (s, off, src_off, n, us) is checked as an int (`x.__class__ is int`: a
# float, a bool or a big int is E_RANGE) and compared with its limits before any
# arithmetic, so a bad argument never reaches the file call and never raises.
#
# File errors: an OSError from the file (a full or failing filesystem) and a short read or
# write (a file truncated behind the store's back) are E_STATE, counted in self.errors, never
# raised: a failed write leaves its sectors uncounted (the transaction goes on), a failed read
# leaves dst's contents undefined (the caller must not use them). Catching an OSError
# allocates nothing here (the exception object is the raiser's).

from firmware_py.compat import IS_MICROPYTHON, const
from firmware_py.pool import filled
from firmware_py.status import E_NO_BLOCK, E_RANGE, E_STATE, INT_MAX, OK

SECTOR_BYTES = const(4096)  # erase unit of the ESP32-S3's SPI NOR flash
ERASE_US = const(45000)  # one 4 KiB sector erase, typical (45 ms)
ENDURANCE = const(100000)  # erase cycles a sector endures on this class of flash
_NONE = const(-1)


class FlashError(ValueError):
    # a configuration mistake with the flash store (bad size, a file that cannot be made);
    # str() is one line
    pass


if IS_MICROPYTHON:
    def _write(f, buf, off, n):
        # n bytes of buf from byte off to the file's position; MicroPython streams take
        # (buf, off, n): no slice, no allocation
        return f.write(buf, off, n)

    def _readinto(f, buf, n):
        return f.readinto(buf, n)
else:
    def _write(f, buf, off, n):
        return f.write(memoryview(buf)[off:off + n])

    def _readinto(f, buf, n):
        return f.readinto(memoryview(buf)[:n])


class FlashStore:
    # path: the file (made or overwritten at boot); n_slots: blocks it holds; block_bytes: the
    # pool's block size (a multiple of 4). sector: erase unit; erase_us, endurance: the wear
    # model's figures; programmed: every sector holds data at boot (see above)
    def __init__(self, path, n_slots, block_bytes, sector=SECTOR_BYTES, erase_us=ERASE_US, endurance=ENDURANCE,
                 programmed=True):
        for name, v, lo in (("n_slots", n_slots, 1), ("block_bytes", block_bytes, 4), ("sector", sector, 256),
                            ("erase_us", erase_us, 0), ("endurance", endurance, 1)):
            if v.__class__ is not int or v < lo:
                raise FlashError("flash: %s must be an int >= %d, got %r" % (name, lo, v))
        if block_bytes % 4 or sector % 256:
            raise FlashError("flash: block_bytes must be a multiple of 4 and sector of 256, got %d, %d" % (block_bytes, sector))
        spb = (block_bytes + sector - 1) // sector  # sectors per slot
        if n_slots > 0x7FFF or n_slots * spb * sector > INT_MAX:
            raise FlashError("flash: %d slots of %d B do not fit a 2**30 B file" % (n_slots, spb * sector))
        self.path = path  # the file
        self.n_slots = n_slots  # block slots
        self.block_bytes = block_bytes  # bytes of a block image
        self.sector = sector  # bytes per sector (erase unit)
        self.sectors_per_slot = spb
        self.slot_bytes = spb * sector  # bytes per slot (whole sectors)
        self.n_sectors = n_slots * spb
        self.erase_us = erase_us  # µs one erase costs
        self.endurance = endurance  # erases a sector endures
        self.writes = filled("i", self.n_sectors, 0)  # [sector] times rewritten (saturate at 2**30 - 1)
        self.erases = filled("i", self.n_sectors, 0)  # [sector] erases (saturate at 2**30 - 1)
        self.prog = bytearray(self.n_sectors)  # [sector] 1: holds programmed data
        self.touched = bytearray(self.n_sectors)  # [sector] 1: touched by the open transaction
        self.tlist = filled("i", self.n_sectors, 0)  # sectors touched by the open transaction, in order
        self.nt = 0  # entries of tlist in use
        self.next = filled("h", n_slots, _NONE)  # free list of slots
        for s in range(n_slots - 1):
            self.next[s] = s + 1
        self.head = 0  # first free slot, or -1
        self.used = 0  # slots taken
        # the byte and erase counts carry at 10**9 into their _g field, which saturates at
        # 2**30 - 1 (the low part then stays at 10**9 - 1); busy_s saturates (busy_us stays at 999,999)
        self.bytes_written = 0  # bytes programmed, modulo 10**9 (bytes_written_g carries)
        self.bytes_written_g = 0
        self.bytes_read = 0  # bytes read back, modulo 10**9
        self.bytes_read_g = 0
        self.total_erases = 0  # all sectors' erases, modulo 10**9
        self.total_erases_g = 0
        self.transactions = 0  # end() calls that touched a sector (saturates)
        self.busy_us = 0  # modelled flash time (programs + erases), µs part below 10**6
        self.busy_s = 0  # ... whole seconds
        self.errors = 0  # file calls that raised OSError or moved fewer bytes than asked (saturates)
        zero = bytearray(sector)
        try:
            f = open(path, "w+b")
        except OSError as e:
            raise FlashError("flash: cannot create %s (%s)" % (path, e)) from None
        try:
            for _ in range(self.n_sectors):
                f.write(zero)  # the preallocation: every sector written once
            f.flush()
        except OSError as e:
            f.close()
            raise FlashError("flash: cannot size %s to %d B (%s)" % (path, self.n_sectors * sector, e)) from None
        self.f = f  # the open file, kept for the whole run
        if programmed:
            for s in range(self.n_sectors):
                self.prog[s] = 1

    # a free slot (>= 0) or E_NO_BLOCK; O(1), no allocation
    def alloc(self):
        s = self.head
        if s < 0:
            return E_NO_BLOCK
        self.head = self.next[s]
        self.next[s] = -2
        self.used += 1
        return s

    # return slot s to the free list: OK, E_RANGE, E_STATE (slot free); O(1), no allocation
    def free(self, s):
        if s.__class__ is not int or s < 0 or s >= self.n_slots:
            return E_RANGE
        if self.next[s] != -2:
            return E_STATE
        self.next[s] = self.head
        self.head = s
        self.used -= 1
        return OK

    # open a transaction (one flush): sectors touched until end() count one rewrite each
    def begin(self):
        self.nt = 0

    # write n bytes of src from byte src_off at byte off of slot s; OK, E_RANGE (nothing
    # written: s, off, src_off or n not an int, outside the slot or past src's end) or
    # E_STATE (the file refused: OSError or a short write; the bytes at off are undefined,
    # the sectors not counted). The touched sectors are counted at end(); no allocation
    def write(self, s, off, src, src_off, n):
        if (self._bad_span(s, off, n) or src_off.__class__ is not int or src_off < 0 or src is None
                or src_off > len(src) or n > len(src) - src_off):
            return E_RANGE
        pos = s * self.slot_bytes + off
        f = self.f
        if f is None:
            return self._error()
        try:
            f.seek(pos)
            w = _write(f, src, src_off, n)
        except OSError:
            return self._error()
        if w != n:
            return self._error()
        sec = self.sector
        a = pos // sec
        e = (pos + n - 1) // sec
        t = self.touched
        while a <= e:
            if not t[a]:
                t[a] = 1
                self.tlist[self.nt] = a
                self.nt += 1
            a += 1
        v = self.bytes_written + n
        if v >= 1000000000:
            if self.bytes_written_g < INT_MAX:
                self.bytes_written_g += 1
                v -= 1000000000
            else:
                v = 999999999  # saturated: the low part stays at its top
        self.bytes_written = v
        return OK

    # close the transaction: each touched sector is rewritten once (an erase when it held
    # programmed data); returns the erases it cost (>= 0); O(sectors touched), no allocation
    def end(self):
        er = 0
        t = self.touched
        for j in range(self.nt):
            a = self.tlist[j]
            t[a] = 0
            if self.writes[a] < INT_MAX:
                self.writes[a] += 1
            if self.prog[a]:
                if self.erases[a] < INT_MAX:
                    self.erases[a] += 1
                er += 1
            self.prog[a] = 1
        if self.nt and self.transactions < INT_MAX:
            self.transactions += 1
        self.nt = 0
        v = self.total_erases + er
        if v >= 1000000000:
            if self.total_erases_g < INT_MAX:
                self.total_erases_g += 1
                v -= 1000000000
            else:
                v = 999999999  # saturated: the low part stays at its top
        self.total_erases = v
        return er

    # modelled flash time spent: add us (an int 0..2**30 - 1); OK, or E_RANGE (nothing
    # added); the whole seconds saturate at 2**30 - 1; no allocation
    def spend(self, us):
        if us.__class__ is not int or us < 0 or us > INT_MAX:
            return E_RANGE
        # busy_us + us could pass 2**30 on the ESP32: add the µs below a second and the
        # whole seconds apart
        q = us // 1000000
        v = self.busy_us + us % 1000000
        if v >= 1000000:
            q += 1
            v -= 1000000
        sec = self.busy_s
        if q >= INT_MAX - sec:  # saturated: the µs stay at their top
            self.busy_s = INT_MAX
            self.busy_us = 999999
        else:
            self.busy_s = sec + q
            self.busy_us = v
        return OK

    # read slot s's block image into dst (a buffer of at least block_bytes); OK, E_RANGE
    # (s not an int slot, dst None or too short), E_STATE (OSError or a short read: dst's
    # contents undefined); no allocation
    def read_block(self, s, dst):
        if s.__class__ is not int or s < 0 or s >= self.n_slots or dst is None or len(dst) < self.block_bytes:
            return E_RANGE
        return self._read(s * self.slot_bytes, dst, self.block_bytes)

    # read n bytes at byte off of slot s into dst (a buffer of exactly n bytes, or more:
    # its first n); OK, E_RANGE (s, off or n not an int or out of the slot, dst None or
    # shorter than n), E_STATE (as read_block); no allocation
    def read_at(self, s, off, dst, n):
        if self._bad_span(s, off, n) or dst is None or len(dst) < n:
            return E_RANGE
        return self._read(s * self.slot_bytes + off, dst, n)

    # True when s, off or n is not an int, or n bytes at byte off are not inside a slot s
    # (write's and read_at's checks); no allocation
    def _bad_span(self, s, off, n):
        bb = self.block_bytes
        return (s.__class__ is not int or off.__class__ is not int or n.__class__ is not int or s < 0
                or s >= self.n_slots or off < 0 or off > bb or n < 1 or n > bb - off)

    def _read(self, pos, dst, n):
        f = self.f
        if f is None:
            return self._error()
        try:
            f.seek(pos)
            got = _readinto(f, dst, n)
        except OSError:
            return self._error()
        if got != n:
            return self._error()
        self._count_read(n)
        return OK

    # a refused file call: counted, E_STATE
    def _error(self):
        if self.errors < INT_MAX:
            self.errors += 1
        return E_STATE

    def _count_read(self, n):
        v = self.bytes_read + n
        if v >= 1000000000:
            if self.bytes_read_g < INT_MAX:
                self.bytes_read_g += 1
                v -= 1000000000
            else:
                v = 999999999  # saturated: the low part stays at its top
        self.bytes_read = v

    # wear figures (allocates: reporting only). tokens: tokens appended while these erases
    # happened (for rates and the projection); tok_per_s: decode rate for a lifetime in hours
    def wear(self, tokens=0, tok_per_s=0):
        er = [self.erases[s] for s in range(self.n_sectors)]
        mx = max(er) if er else 0
        total = self.total_erases_g * 1000000000 + self.total_erases
        out = {
            "sectors": self.n_sectors,
            "sector_bytes": self.sector,
            "erases": total,
            "max_erases_per_sector": mx,
            "mean_erases_per_sector": total / self.n_sectors if self.n_sectors else 0.0,
            "sector_writes": sum(self.writes[s] for s in range(self.n_sectors)),
            "bytes_written": self.bytes_written_g * 1000000000 + self.bytes_written,
            "bytes_read": self.bytes_read_g * 1000000000 + self.bytes_read,
            "erase_us_each": self.erase_us,
            "endurance": self.endurance,
            "busy_us": self.busy_s * 1000000 + self.busy_us,
            "errors": self.errors,
        }
        if tokens:
            out["tokens"] = tokens
            out["erases_per_1000_tokens"] = total * 1000 / tokens
            # no wear levelling: the hottest sector wears out first
            out["lifetime_tokens"] = (self.endurance * tokens // mx) if mx else None
            # an ideal wear-levelling layer spreading the same erases over every sector
            out["lifetime_tokens_levelled"] = (self.endurance * self.n_sectors * tokens // total) if total else None
            if tok_per_s and mx:
                out["lifetime_hours"] = self.endurance * tokens / mx / tok_per_s / 3600
        return out

    def close(self):
        if self.f is not None:
            self.f.close()
            self.f = None
