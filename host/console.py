# The telemetry console's decoding half (docs/telemetry.md is the format): a stream
# decoder that picks frames out of the board's serial bytes, passes ordinary text
# through as is, resynchronizes after garbage at the next 0x00, rejects corrupt
# candidates (counted) and recovers every intact frame; the frames as plain dicts (for
# the JSONL log and the trace); the board's state as the frames update it (for the
# dashboard); the dashboard itself (rich) and the plain-line form; the commands the
# host sends over the same framing.
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
import json
import time
import zlib

from firmware_py import telemetry as tm

MAX_WIRE = tm.wire_len(tm.MAX_PAYLOAD) - 2  # the longest run between delimiters a frame makes


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
    elif ftype == tm.T_TEXT:
        req, off = tm.get_varint(body, 0) if body else (0, 0)
        d["request"] = req
        d["text"] = body[off:].decode("utf-8", "surrogateescape")
    elif ftype == tm.T_PERIODIC:
        recs = {}
        for rid, vals in records(body):
            name, fields = _fields_from_layout(layout, "rec.%d" % rid, tm.RECORDS.get(rid, ("rec_%d" % rid, ())))
            row = _named(fields, vals, {f.split(".", 1)[1] for f in tm.SIGNED if f.startswith(name + ".")})
            if name in ("seq", "task"):
                recs.setdefault(name + "s", []).append(row)  # one row per slot
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
    # skipped (what the board says it skipped), text bytes.
    def __init__(self, max_frame=MAX_WIRE, keep_raw=False):
        self.max_frame = max_frame  # a candidate longer than this is not a frame
        self.keep_raw = keep_raw  # frames also carry raw_type and raw_body (hex): checks
        self.state = "text"  # "text", "open" (after a 0x00: deciding), "frame" (collecting)
        self.cand = bytearray()  # bytes since the last 0x00 while deciding / collecting
        self.good = 0
        self.corrupt = 0
        self.truncated = 0  # candidates cut by the end of the stream (counted in corrupt too)
        self.dropped = 0
        self.skipped = 0  # the board's own count of frames it skipped (the latest core record)
        self.text_bytes = 0
        self.body_errors = 0  # good frames whose body did not decode (kept, with "error")
        self.by_type = {}  # kind -> good frames
        self.why = {}  # rejection reason -> count
        self.last_seq = None  # seq of the last good frame
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

    def _candidate(self, out):
        # the run in self.cand ended at a 0x00: a frame or a rejection
        run = bytes(self.cand)
        self.cand = bytearray()
        try:
            ftype, seq, ms, body = parse(run)
        except FrameError as e:
            self._reject(out, str(e))
            return
        try:
            d = to_dict(ftype, seq, ms, body, self.layout)
        except (FrameError, ValueError) as e:
            # the CRC says the board sent exactly this: a body this decoder cannot read
            # (another version, a bug) is a good frame with an error, not a corrupt one
            d = {"type": tm.FRAME_TYPES.get(ftype, "type_%d" % ftype), "seq": seq, "ms": ms,
                 "error": str(e) or "body", "body_hex": body.hex()}
            self.body_errors += 1
        if self.keep_raw:
            d["raw_type"] = ftype
            d["raw_body"] = body.hex()
        self.good += 1
        self.by_type[d["type"]] = self.by_type.get(d["type"], 0) + 1
        if self.last_seq is not None:
            gap = (seq - self.last_seq - 1) & 0xFFFF
            if gap < 0x8000:  # a larger "gap" is a board reset (the count starts again)
                self.dropped += gap
        self.last_seq = seq
        if ftype == tm.T_LAYOUT:
            self.layout = d["layout"]
        core = d.get("core")
        if core and "skipped" in core:
            self.skipped = core["skipped"]
        out.append(("frame", d))

    def feed(self, data):
        out = []
        i = 0
        n = len(data)
        while i < n:
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
            # collecting a frame up to the next 0x00
            j = data.find(b"\x00", i)
            take = data[i:] if j < 0 else data[i:j]
            self.cand += take
            i = n if j < 0 else j
            if len(self.cand) > self.max_frame:
                self._reject(out, "too long")  # not a frame after all: what follows is unknown
                self.cand = bytearray()
                self.state = "text" if j < 0 else "open"
                if j >= 0:
                    i = j + 1
        return out

    def flush(self, why="truncated"):
        # the end of the stream (or a lost port): a partial frame is a rejection, a byte
        # after a 0x00 is text
        out = []
        if self.state == "frame" and self.cand:
            self.truncated += 1
            self._reject(out, why)
        elif self.cand:
            self._text(out, bytes(self.cand))
        self.cand = bytearray()
        self.state = "text"
        return out

    def counts(self):
        return {"good": self.good, "corrupt": self.corrupt, "truncated": self.truncated, "dropped": self.dropped,
                "skipped": self.skipped, "body_errors": self.body_errors, "text_bytes": self.text_bytes, "by_type": dict(sorted(self.by_type.items())),
                "rejected": dict(sorted(self.why.items()))}


def command(kind, seq=0, **kw):
    # the wire bytes of a host -> board command: prompt (text, tokens), stop, config
    # (policy, window, kv_dtype, ...), layout
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
    raise ValueError("unknown command %r" % kind)


def _varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def jsonl_line(frame, host_time=None):
    # one JSONL log line for a decoded frame
    d = {"host_t": round(time.time() if host_time is None else host_time, 3)}
    d.update(frame)
    return json.dumps(d, sort_keys=False, separators=(",", ":"))
