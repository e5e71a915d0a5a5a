# An independent telemetry stream decoder, written from docs/telemetry.md alone (its Wire,
# Payload and CRC sections: the delimiters, the frame-or-text rule, COBS, the checks, the
# largest payload and so the longest run a frame makes; the console section's rule for
# the stream's start, which may be the middle of a frame), not from host/console.py; it
# imports nothing from host/ or firmware_py/ on purpose. tests/test_console_decode.py
# checks the console's StreamDecoder against it on random damaged captures, so a change
# that makes the decoder and the specification disagree fails there. Change this file
# only when docs/telemetry.md changes, never to match the decoder's code.
import zlib

MAGIC, PROTO, HDR, MAX_PAYLOAD = 0xFE, 1, 9, 1024
MAX_RUN = (MAX_PAYLOAD + 4) + 1 + (MAX_PAYLOAD + 4) // 254  # longest COBS run a frame makes


def cobs(run):
    out, i = bytearray(), 0
    while i < len(run):
        c = run[i]
        if c == 0 or i + c > len(run):
            return None
        out += run[i + 1:i + c]
        i += c
        if c < 0xFF and i < len(run):
            out.append(0)
    return bytes(out)


def check(run):
    if len(run) > MAX_RUN:
        return "too long", None
    d = cobs(run)
    if d is None:
        return "not COBS", None
    if len(d) < HDR + 4:
        return "short", None
    pay = d[:-4]
    if zlib.crc32(pay).to_bytes(4, "little") != d[-4:]:
        return "CRC", None
    if pay[0] != MAGIC or pay[1] != PROTO:
        return "magic/version", None
    return None, (pay[2], pay[3] | pay[4] << 8, int.from_bytes(pay[5:9], "little"), pay[HDR:])


# the control bytes board text never holds (all but tab, LF, CR, BS, BEL, ESC)
CONTROLS = set(range(0x01, 0x07)) | {0x0B, 0x0C} | set(range(0x0E, 0x1B)) | set(range(0x1C, 0x20)) | {0x7F}


def is_text(run):
    # a start run is text: it ends with LF, it is valid UTF-8 and holds none of CONTROLS
    try:
        s = run.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return run.endswith(b"\n") and not any(ord(c) in CONTROLS for c in s)


def decode(stream):
    # -> (text bytes, [(type, seq, ms, body)], [reasons], [lengths of start runs dropped
    # as a frame's tail]) for a whole capture
    runs = stream.split(b"\x00")
    text, frames, bad, partial = bytearray(), [], [], []
    first = runs[0]  # the start run: maybe the tail of a frame whose opening 0x00 was not captured
    opens = len(first) >= 2 and first[1] == MAGIC  # as if it followed a 0x00
    if len(runs) == 1 or len(first) > MAX_RUN:  # no 0x00 follows it, or longer than any frame: no tail
        if opens:
            bad.append("truncated" if len(runs) == 1 else "too long")
        else:
            text += first
    elif opens:
        why, f = check(first)
        if f is None:
            partial.append(len(first))
        else:
            frames.append(f)
    elif is_text(first):
        text += first
    elif first:
        partial.append(len(first))
    for k, run in enumerate(runs[1:], 1):
        last = k == len(runs) - 1  # no closing 0x00: the capture ended inside it
        if len(run) >= 2 and run[1] == MAGIC:
            if last:
                bad.append("truncated")
                continue
            why, f = check(run)
            if f is None:
                bad.append(why)
            else:
                frames.append(f)
        else:
            text += run
    return bytes(text), frames, bad, partial


def layouts(frames):
    # the layouts a list of good frames [(type, seq, ms, body)] carries, from the page's
    # "A layout in several frames": [(complete, {key: value})], one per layout begun (a
    # frame of type 1 with part=1/N or no part line), later parts adding their lines
    out = []
    for ftype, _seq, _ms, body in frames:
        if ftype != 1:
            continue
        items = {}
        for line in body.decode("utf-8").split("\n"):
            k, sep, v = line.partition("=")
            if sep:
                items[k] = v
        i, sep, n = items.get("part", "1/1").partition("/")
        i, n = int(i), int(n)
        if i == 1 or not out:
            out.append([i == n, items])
        else:
            out[-1][1].update(items)
            out[-1][0] = i == n
    return [(done, lay) for done, lay in out]
