# The telemetry console's decoding half (docs/telemetry.md is the format): a stream
# decoder that picks frames out of the board's serial bytes, passes ordinary text
# through as is, resynchronizes after garbage at the next 0x00, rejects corrupt
# candidates (counted) and recovers every intact frame; the frames as plain dicts (for
# the JSONL log and the trace); the commands the host sends over the same framing. What
# the frames say, shown (the board's state, the dashboard, the plain lines), is
# host/dashboard.py's.
#
# Why a corrupt frame cannot pass as good except with the CRC's probability: a
# candidate is every byte run between two 0x00 delimiters whose first two bytes are a
# COBS code and the 0xFE magic. It is accepted only when (1) COBS-decodes (every code
# byte lands inside the run), (2) is at least header + CRC long, (3) has the magic and
# version 1, and (4) its last 4 bytes are the CRC-32 of the rest. A damaged candidate
# passes (1)-(3) easily, so (4) decides: CRC-32 catches every error of 1-3 bits in
# frames of this size (Hamming distance 4 up to 91,607 bits; 5+ below 2,974 bits, which
# covers a 254-byte periodic frame), every burst up to 32 bits, and any other damage but
# for 1 in 2**32. Decoding the body (records that run past the end, a varint too long)
# is a fifth check, but the guarantee is the CRC's.
import codecs
import json
import re
import time
import zlib

from firmware_py import telemetry as tm

MULTI = ("seq", "task", "tier", "bwcat")  # records that come once per slot: lists "seqs", "tasks", ...
MAX_WIRE = tm.wire_len(tm.MAX_PAYLOAD) - 2  # the longest run between delimiters a frame makes


_NOT_TEXT = re.compile("[\x01-\x06\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]")  # controls board text never holds


def looks_like_text(run):
    # True when a run the stream started with (its bytes before the first 0x00) reads as
    # the end of the board's text: valid UTF-8, no control byte but tab, LF, CR, BS, BEL
    # and ESC, and ending with LF (text before a frame ends its line). A frame's tail
    # (COBS codes, varints, the CRC) almost never does: its last byte is a CRC byte
    if not run.endswith(b"\n"):
        return False
    try:
        s = codecs.decode(bytes(run), "utf-8")
    except UnicodeDecodeError:
        return False
    return not _NOT_TEXT.search(s)


# bytes of a COBS-encoded run (no 0x00 in it), or None when it is not valid COBS
def cobs_decode(data):
    out = bytearray()
    i = 0
    n = len(data)
    while i < n:
        code = data[i]
        if code == 0:
            return None
        j = i + code
        if j > n:
            return None  # a code points past the run: cut or damaged
        out += data[i + 1:j]
        i = j
        if code < 0xFF and i < n:
            out.append(0)
    return bytes(out)


# the wire bytes of payload (a board -> host frame: tests, replays, independent checks)
def encode_frame(payload):
    crc = zlib.crc32(payload) & 0xFFFFFFFF
    data = bytes(payload) + crc.to_bytes(4, "little")
    out = bytearray([0])
    block = bytearray()
    for b in data:
        if b == 0:
            out.append(len(block) + 1)
            out += block
            block = bytearray()
        else:
            block.append(b)
            if len(block) == 254:
                out.append(255)
                out += block
                block = bytearray()
    out.append(len(block) + 1)
    out += block
    out.append(0)
    return bytes(out)


def payload(ftype, body=b"", seq=0, ms=0):
    # a payload: magic, version, type, seq, board time, body
    return bytes([tm.MAGIC, tm.PROTO, ftype, seq & 0xFF, (seq >> 8) & 0xFF]) + (ms & 0xFFFFFFFF).to_bytes(4, "little") + bytes(body)


class FrameError(ValueError):
    # a candidate that is not a good frame; str() says which check it failed
    pass


def parse(run):
    # a good frame from the COBS-encoded run between two delimiters: (type, seq, ms,
    # body bytes); FrameError naming the failed check otherwise
    data = cobs_decode(run)
    if data is None:
        raise FrameError("not COBS")
    if len(data) < tm.HDR + tm.CRC_BYTES:
        raise FrameError("short")
    pay, crc = data[:-4], int.from_bytes(data[-4:], "little")
    if zlib.crc32(pay) & 0xFFFFFFFF != crc:
        raise FrameError("CRC")
    if pay[0] != tm.MAGIC or pay[1] != tm.PROTO:
        raise FrameError("magic/version")
    if len(pay) > tm.MAX_PAYLOAD:
        raise FrameError("too long")
    return pay[2], pay[3] | pay[4] << 8, int.from_bytes(pay[5:9], "little"), pay[tm.HDR:]


def unzigzag(v):
    return (v >> 1) ^ -(v & 1)


def records(body):
    # [(id, [values])] of a record body; FrameError when a record runs past the end
    out = []
    i = 0
    while i < len(body):
        if i + 2 > len(body):
            raise FrameError("record header cut")
        rid, n = body[i], body[i + 1]
        end = i + 2 + n
        if end > len(body):
            raise FrameError("record runs past the end")
        vals = []
        j = i + 2
        while j < end:
            try:
                v, j = tm.get_varint(body[:end], j)
            except ValueError as e:
                raise FrameError(str(e)) from None
            vals.append(v)
        out.append((rid, vals))
        i = end
    return out


def layout_items(body):
    # {key: value} of a layout body (text lines key=value)
    out = {}
    for line in body.decode("utf-8", "replace").split("\n"):
        k, sep, v = line.partition("=")
        if sep:
            out[k] = v
    return out


def layout_part(items):
    # (I, N) of a layout frame's "part=I/N" line (part I of the N frames one layout takes),
    # or None (no such line: an older board's layout, whole in one frame)
    i, sep, n = items.get("part", "").partition("/")
    if sep and i.isdigit() and n.isdigit() and 1 <= int(i) <= int(n):
        return int(i), int(n)
    return None


def merge_layout(layout, items):
    # the layout after a layout frame's items: part 1 (or a frame without a part line)
    # starts a new layout, a later part adds its lines to the one being assembled
    part = layout_part(items)
    if part is None or part[0] == 1 or not layout:
        return dict(items)
    merged = dict(layout)
    merged.update(items)
    return merged


def _named(fields, vals, signed=()):
    # {field: value}; extra values (a later version's) as field_N; signed fields unzigzagged
    d = {}
    for i, v in enumerate(vals):
        name = fields[i] if i < len(fields) else "field_%d" % i
        d[name] = unzigzag(v) if name in signed else v
    return d


def _fields_from_layout(layout, key, default):
    # (name, fields) for record/event id from the layout's rec.N / ev.N line, else the built-in table
    spec = layout.get(key) if layout else None
    if spec and ":" in spec:
        name, _, f = spec.partition(":")
        return name, tuple(x for x in f.split(",") if x)
    return default


def to_dict(ftype, seq, ms, body, layout=None):
    # a good frame as a plain dict (the JSONL log's line, without the host time);
    # FrameError when the body does not decode
    kind = tm.FRAME_TYPES.get(ftype, "type_%d" % ftype)
    d = {"type": kind, "seq": seq, "ms": ms}
    if ftype == tm.T_LAYOUT:
        d["layout"] = layout_items(body)
        part = layout_part(d["layout"])
        if part:
            d["part"] = list(part)
    elif ftype == tm.T_TEXT:
        req, off = tm.get_varint(body, 0) if body else (0, 0)
        d["request"] = req
        d["text"] = body[off:].decode("utf-8", "surrogateescape")
    elif ftype == tm.T_PERIODIC:
        recs = {}
        for rid, vals in records(body):
            name, fields = _fields_from_layout(layout, "rec.%d" % rid, tm.RECORDS.get(rid, ("rec_%d" % rid, ())))
            row = _named(fields, vals, {f.split(".", 1)[1] for f in tm.SIGNED if f.startswith(name + ".")})
            if name in MULTI:
                recs.setdefault(name + "s", []).append(row)  # one row per slot / tier / category
            else:
                recs[name] = row
        d.update(recs)
    elif ftype == tm.T_EVENT:
        evs = []
        for code, vals in records(body):
            name, args = _fields_from_layout(layout, "ev.%d" % code, tm.EVENTS.get(code, ("event_%d" % code, ())))
            e = {"event": name, "ms": vals[0] if vals else 0}
            for i, v in enumerate(vals[1:]):
                e[args[i] if i < len(args) else "arg_%d" % i] = unzigzag(v)
            if name == "done" and isinstance(e.get("reason"), int) and 0 <= e["reason"] < len(tm.DONE_REASONS):
                e["reason_name"] = tm.DONE_REASONS[e["reason"]]
            evs.append(e)
        d["events"] = evs
    else:
        d["body_hex"] = body.hex()
    return d


class StreamDecoder:
    # feed(bytes) -> [(kind, value)]: ("text", bytes) as it comes, ("frame", dict) for
    # every good frame, ("corrupt", why) for every rejected candidate. A 0x00 always ends
    # what came before it; after it the next two bytes say frame (a code, then 0xFE) or
    # text. Counts: good, corrupt, dropped (sequence numbers missing between good frames),
    # skipped (what the board says it skipped), restarts (the board's count started again:
    # its boot layout at seq 0, its time or its seq going back, not the time's wrap), text bytes.
    # The result does not depend on how the stream is split into feed() calls: the same
    # frames, corrupt reasons and counts in the same order, and the same text bytes (a
    # run of text may come in more pieces when fed in pieces). A candidate that grows
    # past max_frame stays a candidate: its bytes are dropped (not kept, not text) up to
    # the next 0x00, where it is refused as "too long" (or "truncated" at the end).
    # The stream's start (and the start after flush(): a reconnect) may be the middle of
    # a frame whose opening 0x00 was never received: the bytes before the first 0x00 (the
    # start run) are held back, up to max_frame of them, and decided whole. A start run
    # that opens like a frame (a code, then 0xFE: as if it followed a delimiter) is a
    # candidate; a good frame is a frame, a refused one a frame's tail. Any other start
    # run is text when it looks like text (looks_like_text) or when it grows past
    # max_frame (no frame's tail is that long), a frame's tail otherwise. A tail is
    # dropped (an item ("partial", bytes), counted in partial_at_start), never text.
    # settle() decides a held start run as text at once (the line went quiet: a frame's
    # tail would have ended); only the monitor calls it, when a read comes back empty.
    # The first good frame of a new run of the board (a restart, below) carries
    # "restart": True. The board time wraps at tm.MS_WRAP (10**9 ms, 11.57 days): a step
    # back by more than half of it while the sequence goes on (not at a boot layout at
    # seq 0) is that wrap, no restart; the frames' ms (and their events') are unwrapped:
    # ms since the board's telemetry task started, counted again from 0 at a restart (a
    # decoder that joined after a wrap counts only the wraps it saw).
    def __init__(self, max_frame=MAX_WIRE, keep_raw=False):
        self.max_frame = max_frame  # a candidate longer than this is not a frame
        self.keep_raw = keep_raw  # frames also carry raw_type and raw_body (hex): checks
        self.last_run = b""  # the last good frame's bytes (a repeat of it is a duplicate)
        self.duplicates = 0  # frames dropped as byte-for-byte repeats of the one before
        self.utf8_req = None  # the request whose text frames self.utf8 decodes
        self.utf8 = None  # its incremental UTF-8 decoder (a character split over two frames)
        self.state = "start"  # "start" (before the first 0x00), "text", "open" (after a 0x00: deciding), "frame" (collecting)
        self.at_start = False  # the candidate being collected is the start run (refused: a frame's tail)
        self.partial_at_start = 0  # start runs dropped as the tail of a frame sent before the stream started
        self.partial_bytes = 0  # their bytes
        self.cand = bytearray()  # bytes since the last 0x00 while deciding / collecting
        self.over = False  # the candidate being collected passed max_frame: dropping to the next 0x00
        self.good = 0
        self.corrupt = 0
        self.truncated = 0  # candidates cut by the end of the stream (counted in corrupt too)
        self.dropped = 0
        self.skipped = 0  # the board's own count of frames it skipped (the latest core record of each run, summed)
        self.skipped_run = 0  # the latest core record's count, this run of the board
        self.skipped_before = 0  # the counts of the runs before (board restarts)
        self.restarts = 0  # board restarts seen: the sequence (and board time) started again
        self.text_bytes = 0
        self.body_errors = 0  # good frames whose body did not decode (kept, with "error")
        self.by_type = {}  # kind -> good frames
        self.why = {}  # rejection reason -> count
        self.last_seq = None  # seq of the last good frame
        self.last_ms = 0  # its board time (as sent: modulo tm.MS_WRAP)
        self.ms_epoch = 0  # times the board time wrapped at tm.MS_WRAP in this run of the board
        self.layout = {}  # the latest layout frame's items

    def _text(self, out, data):
        if data:
            self.text_bytes += len(data)
            if out and out[-1][0] == "text":
                out[-1] = ("text", out[-1][1] + data)
            else:
                out.append(("text", bytes(data)))

    def _reject(self, out, why):
        self.corrupt += 1
        self.why[why] = self.why.get(why, 0) + 1
        out.append(("corrupt", why))

    def _partial(self, out, n):
        self.partial_at_start += 1
        self.partial_bytes += n
        out.append(("partial", n))

    def _candidate(self, out):
        # the run in self.cand ended at a 0x00: a frame or a rejection (at the stream's
        # start: a frame's tail)
        run = bytes(self.cand)
        self.cand = bytearray()
        at_start, self.at_start = self.at_start, False
        try:
            ftype, seq, ms, body = parse(run)
        except FrameError as e:
            if at_start:
                self._partial(out, len(run))
            else:
                self._reject(out, str(e))
            return
        if run == self.last_run and self.last_seq == seq:
            # the same frame again, byte for byte (a link or a capture that repeated it):
            # counted as a duplicate and dropped, neither a restart nor frames lost
            self.duplicates += 1
            out.append(("duplicate", seq))
            return
        self.last_run = run
        try:
            d = to_dict(ftype, seq, ms, body, self.layout)
        except (FrameError, ValueError) as e:
            # the CRC says the board sent exactly this: a body this decoder cannot read
            # (another version, a bug) is a good frame with an error, not a corrupt one
            d = {"type": tm.FRAME_TYPES.get(ftype, "type_%d" % ftype), "seq": seq, "ms": ms,
                 "error": str(e) or "body", "body_hex": body.hex()}
            self.body_errors += 1
        if ftype == tm.T_TEXT and "error" not in d:
            # a request's text is one UTF-8 stream cut into frames anywhere: decoded as one
            # (a character split over two frames comes whole with the second; bytes that are
            # not UTF-8 become U+FFFD, never lone surrogates in the JSONL)
            req = d["request"]
            if self.utf8_req != req:
                self.utf8_req = req
                self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")
            d["text"] = self.utf8.decode(body[tm.get_varint(body, 0)[1]:] if body else b"")
        if self.keep_raw:
            d["raw_type"] = ftype
            d["raw_body"] = body.hex()
        self.good += 1
        self.by_type[d["type"]] = self.by_type.get(d["type"], 0) + 1
        if self.last_seq is not None:
            gap = (seq - self.last_seq - 1) & 0xFFFF
            # the board time counts ms modulo tm.MS_WRAP (10**9, 11.57 days): a step back by
            # more than half of it while the sequence goes on is the wrap, not a restart
            wrap = (ms < self.last_ms and self.last_ms - ms > tm.MS_WRAP // 2 and gap < 0x8000
                    and not (ftype == tm.T_LAYOUT and seq == 0))
            back = not wrap and (ms - self.last_ms) & 0xFFFFFFFF >= 0x80000000  # board time went back
            if back or (ftype == tm.T_LAYOUT and seq == 0 and gap) or gap >= 0x8000:
                # the board restarted (reset, power cycle, re-enumerated and rebooted):
                # its count starts again at 0, so the frames missing are the new run's
                # before this one (none when this is its boot layout), not the gap
                self.restarts += 1
                d["restart"] = True  # for the dashboard's rates and the trace's time line
                self.dropped += seq
                self.skipped_before += self.skipped_run
                self.skipped_run = 0
                self.ms_epoch = 0
            else:
                self.dropped += gap
                if wrap:
                    self.ms_epoch += 1
        self.last_seq = seq
        self.last_ms = ms
        if self.ms_epoch:  # the board time unwrapped: ms since the board's telemetry task started
            base = self.ms_epoch * tm.MS_WRAP
            d["ms"] = ms + base
            for e in d.get("events", ()):
                if isinstance(e.get("ms"), int):  # queued before this frame: in the epoch before when above its time
                    e["ms"] += base - tm.MS_WRAP if e["ms"] > ms else base
        if ftype == tm.T_LAYOUT and "layout" in d:
            # a layout may take several frames (part=I/N): the frame carries the layout as
            # assembled so far, so whoever keeps the latest layout frame keeps all of it
            self.layout = d["layout"] = merge_layout(self.layout, d["layout"])
        core = d.get("core")
        if core and "skipped" in core:
            self.skipped_run = core["skipped"]
            self.skipped = self.skipped_before + self.skipped_run
        out.append(("frame", d))

    def feed(self, data):
        out = []
        i = 0
        n = len(data)
        while i < n:
            if self.state == "start":
                i = self._start(out, data, i)
                continue
            if self.state == "text":
                j = data.find(b"\x00", i)
                if j < 0:
                    self._text(out, data[i:])
                    return out
                self._text(out, data[i:j])
                i = j + 1
                self.state = "open"
                self.cand = bytearray()
                continue
            b = data[i]
            if b == 0:
                if self.state == "frame":
                    if self.over:
                        self.over = False
                        self._reject(out, "too long")
                    else:
                        self._candidate(out)
                else:
                    self._text(out, bytes(self.cand))  # one byte after a 0x00, then another: text
                    self.cand = bytearray()
                self.state = "open"
                i += 1
                continue
            if self.state == "open":
                self.cand.append(b)
                i += 1
                if len(self.cand) == 2:
                    if self.cand[1] == tm.MAGIC:
                        self.state = "frame"
                    else:
                        self._text(out, bytes(self.cand))  # text after a frame (or after a stray 0x00)
                        self.cand = bytearray()
                        self.state = "text"
                continue
            # collecting a frame up to the next 0x00 (the 0x00 itself is handled above)
            j = data.find(b"\x00", i)
            if j < 0:
                j = n
            if not self.over:
                self.cand += data[i:j]
                if len(self.cand) > self.max_frame:
                    # not a frame (no frame is this long): drop it up to the next 0x00,
                    # in whatever reads it comes, and refuse it there as "too long"
                    self.over = True
                    self.cand = bytearray()
            i = j
        return out

    def _start(self, out, data, i):
        # state "start": hold the start run up to the first 0x00 (at most max_frame
        # bytes), then decide it whole; returns where to go on in data
        n = len(data)
        j = data.find(b"\x00", i)
        end = n if j < 0 else j
        if len(self.cand) + end - i > self.max_frame:
            # longer than any frame's run: not a tail
            self.cand += data[i:end]
            if self.cand[1] == tm.MAGIC:  # a candidate: over-long, dropped to the next 0x00
                self.state, self.over = "frame", True
            else:
                self._text(out, bytes(self.cand))
                self.state = "text"
            self.cand = bytearray()
            return end
        self.cand += data[i:end]
        if j < 0:
            return n
        if len(self.cand) >= 2 and self.cand[1] == tm.MAGIC:  # opens like a frame
            self.at_start = True
            self._candidate(out)
        elif self.cand and looks_like_text(self.cand):
            self._text(out, bytes(self.cand))
        elif self.cand:
            self._partial(out, len(self.cand))
        self.cand = bytearray()
        self.state = "open"
        return j + 1

    def settle(self):
        # the line went quiet: a start run held back that does not open like a frame is
        # text (a frame's tail would have reached its 0x00); the monitor calls this when a
        # read times out, so the board's first text (a REPL prompt) is not held back
        out = []
        if self.state == "start" and self.cand and not (len(self.cand) >= 2 and self.cand[1] == tm.MAGIC):
            self._text(out, bytes(self.cand))
            self.cand = bytearray()
            self.state = "text"
        return out

    def flush(self, why="truncated"):
        # the end of the stream (or a lost port): a partial frame is a rejection, a byte
        # after a 0x00 or a start run held back is text; what comes next is a new stream
        # (its start may be the middle of a frame)
        out = []
        if self.state == "frame" or (self.state == "start" and len(self.cand) >= 2 and self.cand[1] == tm.MAGIC):
            self.truncated += 1
            self._reject(out, why)
        elif self.cand:
            self._text(out, bytes(self.cand))
        self.cand = bytearray()
        self.over = False
        self.at_start = False
        self.state = "start"
        return out

    def counts(self):
        return {"good": self.good, "corrupt": self.corrupt, "truncated": self.truncated, "dropped": self.dropped,
                "skipped": self.skipped, "restarts": self.restarts, "duplicates": self.duplicates,
                "body_errors": self.body_errors, "partial_at_start": self.partial_at_start,
                "partial_bytes": self.partial_bytes, "text_bytes": self.text_bytes, "by_type": dict(sorted(self.by_type.items())),
                "rejected": dict(sorted(self.why.items()))}


def command(kind, seq=0, **kw):
    # the wire bytes of a host -> board command: prompt (text, tokens), stop, config
    # (policy, window, kv_dtype, ...), layout, save and resume (name: a snapshot's)
    if kind == "prompt":
        body = _varint(int(kw.get("tokens", 64))) + kw["text"].encode()
        return tm.encode_command(tm.T_CMD_PROMPT, body, seq)
    if kind == "stop":
        return tm.encode_command(tm.T_CMD_STOP, b"", seq)
    if kind == "config":
        body = "\n".join("%s=%s" % (k, v) for k, v in sorted(kw.items()) if v not in (None, "")).encode()
        return tm.encode_command(tm.T_CMD_CONFIG, body, seq)
    if kind == "layout":
        return tm.encode_command(tm.T_CMD_LAYOUT, b"", seq)
    if kind in ("save", "resume"):
        return tm.encode_command(tm.T_CMD_SAVE if kind == "save" else tm.T_CMD_RESUME, kw["name"].encode(), seq)
    raise ValueError("unknown command %r" % kind)


def _varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def frame_rows(f, name):
    # the rows of a record that may appear once (a dict) or several times (a list under name + "s")
    rows = f.get(name + "s")
    if rows is not None:
        return rows
    r = f.get(name)
    return [r] if isinstance(r, dict) else []


def jsonl_line(frame, host_time=None):
    # one JSONL log line for a decoded frame
    d = {"host_t": round(time.time() if host_time is None else host_time, 3)}
    d.update(frame)
    return json.dumps(d, sort_keys=False, separators=(",", ":"))
