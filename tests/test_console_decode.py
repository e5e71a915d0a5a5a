# The console's stream decoder against damaged captures: frames interleaved with text
# and garbage, each frame maybe damaged (bits flipped, bytes dropped or inserted, cut
# short, text written into its middle). No damaged frame is ever accepted as good,
# every intact frame is recovered, and text between intact frames comes through as is,
# however the stream is split into reads. Also: every single-bit error of a real
# periodic frame is refused, the real encoder's output decodes, and the commands.
import os
import random
import sys
import zlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firmware_py import telemetry as tm
from host import console, dashboard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import telemetry_indep  # noqa: E402  (written from docs/telemetry.md alone)

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40)


def frame_bytes(i, ftype, body):
    # a frame with a unique sequence number and time, so each is recognised when decoded
    return console.encode_frame(console.payload(ftype, body, seq=i, ms=1000 + i))


@st.composite
def capture(draw):
    # (stream bytes, frames [(seq, type, body, intact)], texts that must come through)
    n = draw(st.integers(1, 12))
    items = []  # ("frame", bytes, key, intact) / ("text", bytes) / ("garbage", bytes)
    for i in range(n):
        if draw(st.booleans()):
            items.append(("text", draw(TEXT).encode()))
        if draw(st.integers(0, 5)) == 0:
            items.append(("garbage", draw(st.binary(min_size=1, max_size=30))))
        ftype = draw(st.sampled_from([tm.T_PERIODIC, tm.T_EVENT, tm.T_TEXT, tm.T_LAYOUT, 0x77]))
        body = draw(st.binary(max_size=draw(st.sampled_from([8, 40, 300]))))
        wire = bytearray(frame_bytes(i, ftype, body))
        op = draw(st.sampled_from(["none", "none", "flip", "drop", "insert", "truncate", "text"]))
        if op == "flip":
            for _ in range(draw(st.integers(1, 6))):
                bit = draw(st.integers(0, len(wire) * 8 - 1))
                wire[bit // 8] ^= 1 << (bit % 8)
        elif op == "drop":
            for _ in range(draw(st.integers(1, 3))):
                if len(wire) > 1:
                    del wire[draw(st.integers(0, len(wire) - 1))]
        elif op == "insert":
            pos = draw(st.integers(1, len(wire) - 1))
            wire[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "truncate":
            wire = wire[:draw(st.integers(1, len(wire) - 1))]
        elif op == "text":
            pos = draw(st.integers(1, len(wire) - 1))
            wire[pos:pos] = draw(TEXT).encode()
        intact = op == "none"
        items.append(("frame", bytes(wire), (i, ftype, bytes(body)), intact))
    if draw(st.booleans()):
        items.append(("text", draw(TEXT).encode()))
    stream = b"".join(it[1] for it in items)
    frames = [(it[2], it[3]) for it in items if it[0] == "frame"]
    # text that must come through: a text item with an intact frame (or the stream's
    # start / end) on both sides
    must = []
    for j, it in enumerate(items):
        if it[0] != "text":
            continue
        # (at the stream's start: when it reads as text, docs/telemetry.md's start rule)
        before_ok = (j == 0 and telemetry_indep.is_text(it[1])) or (j > 0 and items[j - 1][0] == "frame" and items[j - 1][3])
        after_ok = j == len(items) - 1 or (items[j + 1][0] == "frame" and items[j + 1][3])
        if before_ok and after_ok:
            must.append(it[1])
    splits = draw(st.lists(st.integers(0, len(stream)), max_size=6))
    return stream, frames, must, sorted(splits)


def decode(stream, splits=()):
    d = console.StreamDecoder(keep_raw=True)
    out = []
    last = 0
    for s in list(splits) + [len(stream)]:
        out += d.feed(stream[last:s])
        last = s
    out += d.flush()
    return d, out


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(capture())
def test_damaged_capture_no_bad_frame_accepted_every_intact_one_recovered(cap):
    stream, frames, must, splits = cap
    d, out = decode(stream, splits)
    got = []
    for kind, v in out:
        if kind == "frame":
            got.append(v)
    # the decoder keeps the raw type and body of a good frame for checks like this one
    got_keys = [(g["seq"], g["raw_type"], bytes.fromhex(g["raw_body"])) for g in got]
    originals = {k for k, _ in frames}
    intact = [k for k, ok in frames if ok]
    for k in got_keys:
        assert k in originals, "a frame that was never sent was accepted: %r" % (k,)
    for k in intact:
        assert k in got_keys, "an intact frame was lost: %r" % (k,)
    damaged_accepted = [k for k in got_keys if k not in intact]
    for k in damaged_accepted:
        # a damaged frame may only come through when its damage left its bytes whole
        # (an extra 0x00 inserted beside its delimiter, a bit flipped back, its opening
        # 0x00 lost at the stream's start, which counts as a delimiter): check it
        seq, ftype, body = k
        wire = frame_bytes(seq, ftype, body)
        assert wire in stream or stream.startswith(wire[1:]), "a damaged frame was accepted: %r" % (k,)
    text = b"".join(v for kind, v in out if kind == "text")
    pos = 0
    for t in must:
        i = text.find(t, pos)
        assert i >= 0, "text between intact frames was lost: %r in %r" % (t, text)
        pos = i + len(t)
    assert d.good == len(got) and d.corrupt == sum(1 for kind, _ in out if kind == "corrupt")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(TEXT.map(str.encode), st.tuples(st.sampled_from([2, 3, 4]), st.binary(max_size=120))), max_size=15),
       st.lists(st.integers(0, 4000), max_size=8))
def test_clean_stream_passes_text_exactly_and_every_frame(items, splits):
    stream = b""
    texts = b""
    want = []
    for it in items:
        if isinstance(it, bytes):
            stream += it
            texts += it
        else:
            stream += frame_bytes(len(want), it[0], it[1])
            want.append((len(want), it[0], it[1]))
    d, out = decode(stream, sorted(s for s in splits if s <= len(stream)))
    # the text before the first frame is dropped only when it cannot be board text (a
    # control byte: then it is taken for the tail of a frame sent before the stream began)
    first = stream.split(b"\x00")[0]
    tail = want and len(first) <= console.MAX_WIRE and not telemetry_indep.is_text(first)
    assert b"".join(v for k, v in out if k == "text") == (texts[len(first):] if tail else texts)
    assert d.partial_at_start == (1 if tail and first else 0)
    got = [(v["seq"], v["raw_type"], bytes.fromhex(v["raw_body"])) for k, v in out if k == "frame"]
    assert got == want and d.corrupt == 0 and d.dropped == 0


def normal(out):
    # a feed's results with adjacent text pieces joined (fed in pieces, a run of text may
    # come in more pieces; nothing else may differ) and frames as (type, seq, ms, body)
    res = []
    for kind, v in out:
        if kind == "text":
            if res and res[-1][0] == "text":
                res[-1] = ("text", res[-1][1] + v)
            else:
                res.append(("text", bytes(v)))
        elif kind == "frame":
            res.append(("frame", (v["raw_type"], v["seq"], v["ms"], bytes.fromhex(v["raw_body"]))))
        else:
            res.append((kind, v))
    return res


def overlong(draw, closed):
    # a run that opens like a frame (0x00, a code, 0xFE) and is longer than any frame:
    # a lost closing delimiter, line noise; lengths around the limit too
    n = draw(st.sampled_from([console.MAX_WIRE - 2, console.MAX_WIRE - 1, console.MAX_WIRE + 1 - 2,
                              console.MAX_WIRE + 5, 1100, 1500, 2400]))
    run = bytes([draw(st.integers(1, 255)), tm.MAGIC]) + draw(st.binary(min_size=n, max_size=n)).replace(b"\x00", b"\x01")
    return b"\x00" + run + (b"\x00" if closed else b"")


@st.composite
def long_capture(draw):
    # a damaged capture (above) with over-long runs and text put in at random places
    # (inside frames too, or unclosed at the end), and split points for the reads
    stream = draw(capture())[0]
    for _ in range(draw(st.integers(0, 3))):
        pos = draw(st.integers(0, len(stream)))
        piece = overlong(draw, True) if draw(st.booleans()) else draw(TEXT).encode()
        stream = stream[:pos] + piece + stream[pos:]
    if draw(st.integers(0, 3)) == 0:
        stream += overlong(draw, draw(st.booleans()))
    # the stream may start anywhere: inside a frame (the monitor connected to a board
    # already streaming), at a frame's first byte after its missed 0x00, inside text
    start = draw(st.sampled_from(["whole", "whole", "cut", "tail", "text tail", "frame"]))
    if start == "cut":
        stream = stream[draw(st.integers(0, len(stream))):]
    elif start in ("tail", "text tail", "frame"):
        body = draw(TEXT).encode() + b"\n" + draw(TEXT).encode() if start == "text tail" else draw(st.binary(max_size=60))
        wire = frame_bytes(900, tm.T_TEXT if start == "text tail" else tm.T_PERIODIC, body)
        stream = wire[draw(st.integers(1, len(wire) - 1)) if start != "frame" else 1:] + stream
    how = draw(st.sampled_from(["random", "random", "every", "fixed"]))
    if how == "every":  # one byte per read
        splits = list(range(1, len(stream)))
    elif how == "fixed":  # the same size every read, as a serial port with a timeout
        k = draw(st.sampled_from([2, 7, 64, 1000]))
        splits = list(range(k, len(stream), k))
    else:
        splits = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    return stream, splits


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(long_capture())
def test_decoding_does_not_depend_on_the_reads_and_agrees_with_the_independent_decoder(cap):
    stream, splits = cap
    whole, out_whole = decode(stream)
    split, out_split = decode(stream, splits)
    # fed whole or in any reads: the same frames, refusals, text and counts, in the same order
    assert normal(out_split) == normal(out_whole)
    assert split.counts() == whole.counts()
    # and the same as a decoder written from docs/telemetry.md alone
    text, frames, bad, partial = telemetry_indep.decode(stream)
    assert b"".join(v for k, v in out_whole if k == "text") == text
    assert [v for k, v in normal(out_whole) if k == "frame"] == frames
    assert [v for k, v in out_whole if k == "corrupt"] == bad
    assert [v for k, v in out_whole if k == "partial"] == partial
    assert whole.text_bytes == len(text) and whole.good == len(frames) and whole.corrupt == len(bad)
    assert whole.truncated == bad.count("truncated") and whole.partial_at_start == len(partial)


def test_an_over_long_candidate_is_dropped_to_the_next_delimiter_in_any_reads():
    # the review's case: 00 05 FE, 1,100 bytes, TAIL, 00, a good frame; the candidate is
    # refused as too long and none of its bytes pass as text, fed whole or in small reads
    good = console.encode_frame(console.payload(2, b"", seq=1))
    s = b"hi\n\x00\x05\xfe" + b"q" * 1100 + b"TAIL\x00" + good + b"bye"
    for k in (len(s), 1, 7, 64, 1000):
        d, out = decode(s, range(k, len(s), k))
        assert [x for x in normal(out) if x[0] != "frame"] == [("text", b"hi\n"), ("corrupt", "too long"), ("text", b"bye")]
        assert d.good == 1 and d.why == {"too long": 1} and d.text_bytes == 6
    # unclosed at the end of the capture: truncated, whatever its length
    for k in (len(s), 1, 64):
        cut = s[:s.index(b"TAIL")]
        d, out = decode(cut, range(k, len(cut), k))
        assert normal(out) == [("text", b"hi\n"), ("corrupt", "truncated")] and d.truncated == 1
    # exactly the longest run a frame makes is still a candidate (refused here by COBS,
    # not by length); one byte more is too long
    for n, why in ((console.MAX_WIRE, "not COBS"), (console.MAX_WIRE + 1, "too long")):
        run = b"\xff\xfe" + b"q" * (n - 2)
        d, out = decode(b"\x00" + run + b"\x00", range(1, n + 2))
        assert normal(out) == [("corrupt", why)]


def periodic_frame():
    # a real periodic frame from the firmware's encoder (CPython twin)
    from firmware_py.clock import VirtualClock

    cap = bytearray()
    t = tm.Telemetry(lambda b, n: cap.extend(bytes(b[:n])), clock=VirtualClock(), heap=False)
    t.tokens = 123456
    t.send_layout()
    del cap[:]
    t.build_periodic()
    return bytes(cap)


def test_every_single_bit_error_of_a_periodic_frame_is_refused():
    wire = periodic_frame()
    assert 20 < len(wire) <= 115
    for bit in range(len(wire) * 8):
        bad = bytearray(wire)
        bad[bit // 8] ^= 1 << (bit % 8)
        d, out = decode(bytes(bad))
        assert d.good == 0, "bit %d flipped was accepted" % bit
    d, out = decode(wire)
    assert d.good == 1 and out[0][1]["core"]["tokens"] == 123456


def test_random_bursts_and_the_crc_is_zlibs():
    rnd = random.Random(11)
    wire = periodic_frame()
    run = wire[1:-1]
    data = console.cobs_decode(run)
    assert zlib.crc32(data[:-4]) == int.from_bytes(data[-4:], "little")  # CRC-32/ISO-HDLC, as zlib
    for _ in range(3000):
        bad = bytearray(wire)
        start = rnd.randrange(1, len(bad) - 1)
        for j in range(start, min(len(bad) - 1, start + rnd.randint(1, 8))):
            bad[j] = rnd.randrange(256)
        if bytes(bad) == wire:
            continue
        d, _ = decode(bytes(bad))
        assert d.good == 0


def test_sequence_gaps_are_counted_as_dropped_and_a_reset_is_not():
    s = frame_bytes(0, 2, b"") + frame_bytes(1, 2, b"") + frame_bytes(5, 2, b"") + frame_bytes(0, 2, b"") + frame_bytes(1, 2, b"")
    d, _ = decode(s)
    assert d.good == 5 and d.dropped == 3


def test_truncated_frame_at_the_end_is_counted():
    w = frame_bytes(0, 2, b"abc")
    d, out = decode(b"hello\n" + w[:-3])
    assert d.truncated == 1 and d.corrupt == 1 and out[0] == ("text", b"hello\n")


def test_commands_round_trip_through_the_board_reader():
    got = []
    rd = tm.CommandReader(lambda ft, body, seq: got.append((ft, body, seq)))
    rd.feed(console.command("config", seq=1, policy="window", window=64, kv_dtype="int8"))
    rd.feed(console.command("prompt", seq=2, text="Once upon a time", tokens=300))
    rd.feed(console.command("stop", seq=3))
    rd.byte(0)
    assert [g[0] for g in got] == [tm.T_CMD_CONFIG, tm.T_CMD_PROMPT, tm.T_CMD_STOP]
    assert got[0][1] == b"kv_dtype=int8\npolicy=window\nwindow=64"
    assert tm.get_varint(got[1][1], 0) == (300, 2) and got[1][1][2:] == b"Once upon a time"


def test_a_stream_that_starts_inside_a_frame_shows_none_of_it_as_text():
    # the new-user finding: `monitor` connecting to a board already streaming showed the
    # tail of the frame being sent (binary, split at an 0x0a inside it) as board text.
    # Started at every byte of a text frame holding a newline and of a real periodic frame,
    # in any reads: the tail is dropped and counted (or, when it happens to read as text,
    # passes as text: the documented rule), the frames and the text after it are whole
    text_frame = frame_bytes(7, tm.T_TEXT, b"\x01Once upon\na time")
    after = b"b1 line 3\n" + frame_bytes(8, tm.T_PERIODIC, b"\x01\x01\x05") + b"bye\n"
    leaks = 0
    for wire in (text_frame, periodic_frame()):
        for k in range(1, len(wire)):
            tail = wire[k:-1]
            s = wire[k:] + after
            for n in (len(s), 1, 5):
                d, out = decode(s, range(n, len(s), n))
                text = b"".join(v for kind, v in out if kind == "text")
                frames = [v["seq"] for kind, v in out if kind == "frame"]
                if k == 1:  # the frame's first byte after the missed 0x00: the frame itself
                    assert frames[0] != 8 and text == b"b1 line 3\nbye\n" and d.partial_at_start == 0, k
                elif telemetry_indep.is_text(tail):
                    assert text == tail + b"b1 line 3\nbye\n" and d.partial_at_start == 0, (k, tail)
                else:
                    assert text == b"b1 line 3\nbye\n", (k, text)
                    assert d.partial_at_start == (1 if tail else 0) and d.partial_bytes == len(tail), k
                    assert not tail or normal(out)[0] == ("partial", len(tail)), k
                assert frames[-1] == 8 and d.corrupt == 0, (k, out)
            leaks += k > 1 and telemetry_indep.is_text(tail)
    assert leaks == 0, leaks  # (a tail ending in a CRC byte 0x0a could: 1 in 256)


def test_text_at_the_stream_start_still_passes():
    # a boot message, the REPL, a character cut by the connection, ESC/BS/BEL: text,
    # before a frame or at the end; a start run longer than any frame is text whatever
    # it holds; one that opens like a frame but is refused is a tail, not corrupt
    good = frame_bytes(1, tm.T_PERIODIC, b"")
    for start in (b"MPY: soft reboot\r\nkvrtos boot\r\n", b"caf\xc3\xa9 \x1b[0m\x08 \x08\x07>>> x\n", b"\n", b""):
        for n in (1, 3, 1000):
            s = start + good + b"after\n"
            d, out = decode(s, range(n, len(s), n))
            assert b"".join(v for k, v in out if k == "text") == start + b"after\n" and d.good == 1 and d.partial_at_start == 0
    d, out = decode(b">>> ")  # no 0x00 at all: text at the end
    assert normal(out) == [("text", b">>> ")]
    noise = bytes(range(1, 32)) * 40  # 1,240 control bytes, no 0x00: longer than any frame
    d, out = decode(noise + good, range(1, 2000, 100))
    assert normal(out)[0] == ("text", noise) and d.good == 1 and d.partial_at_start == 0
    d, out = decode(b"ne 3 seq 8 (no newline)" + good)  # text not ending its line: taken for a tail
    assert normal(out)[0] == ("partial", 23) and d.good == 1
    d, out = decode(b"\x09\xfe\x01\x02junk" + good)  # opens like a frame, refused: a tail
    assert normal(out)[0] == ("partial", 8) and d.corrupt == 0 and d.good == 1
    d, out = decode(b"\x09\xfe\x01\x02junk")  # ... cut by the end: truncated, like any candidate
    assert normal(out) == [("corrupt", "truncated")]


def test_a_reconnect_starts_a_new_stream_and_settle_lets_held_text_through():
    # flush() (the monitor: the port was lost) makes the next bytes a new stream, whose
    # start may again be inside a frame; settle() (a read came back empty) lets a held
    # start run through as text, unless it opens like a frame
    wire = frame_bytes(3, tm.T_PERIODIC, b"\x01\x02\x03\x04")
    d = console.StreamDecoder()
    assert d.feed(b">>> ") == [] and d.settle() == [("text", b">>> ")]
    assert d.feed(b"more") == [("text", b"more")]
    d.flush()
    out = d.feed(wire[6:] + b"hi\n" + wire)
    assert [k for k, _ in out] == ["partial", "text", "frame"] and out[1] == ("text", b"hi\n")
    d.flush()
    assert d.feed(wire[1:5]) == [] and d.settle() == []  # opens like a frame: still held
    assert d.flush("port lost") == [("corrupt", "port lost")] and d.truncated == 1


def test_the_board_time_wrap_is_no_restart_and_is_unwrapped():
    # the board time counts ms modulo tm.MS_WRAP (10**9, 11.57 days): a step back by more
    # than half of it with the sequence going on is its wrap (0 restarts, 0 dropped, the
    # frames' and events' ms unwrapped, the dashboard's rates over fields sent modulo
    # 10**9 go on); a restart right after (or right before) a wrap is still one
    W = tm.MS_WRAP

    def task_row(run_ms):
        vals = bytes([0, 1, 1]) + console._varint(run_ms) + bytes([1, 0, 0, 0, 0, 0])
        return bytes([tm.R_TASK, len(vals)]) + vals

    def tier_row(kb):
        vals = bytes([0, 5]) + console._varint(kb) + bytes([0])
        return bytes([tm.R_TIER, len(vals)]) + vals

    def ev(code, ms, *args):
        vals = console._varint(ms) + b"".join(console._varint(2 * a) for a in args)
        return bytes([code, len(vals)]) + vals

    def fr(seq, ms, body, ftype=tm.T_PERIODIC):
        return console.encode_frame(console.payload(ftype, body, seq=seq, ms=ms))

    # seq 100..107, 100 ms apart, across the wrap; run_ms (50 % CPU) and kb (2 MB/s) wrap too
    times = [W - 300, W - 200, W - 100, 0, 100, 200]
    runs = [W - 140, W - 90, W - 40, 10, 60, 110]
    kbs = [W - 500, W - 300, W - 100, 100, 300, 500]
    s = b"".join(fr(100 + i, t, task_row(r) + tier_row(k)) + b"line %d\n" % i for i, (t, r, k) in enumerate(zip(times, runs, kbs, strict=True)))
    s += fr(106, 250, ev(tm.EV_EVICT, W - 50, 1, 2, 3) + ev(tm.EV_START, 240, 7, 4, 8), tm.T_EVENT)  # queued before / after
    s += fr(107, 300, b"")
    for n in (len(s), 1, 9):
        d, out = decode(s, range(n, len(s), n))
        frames = [v for k, v in out if k == "frame"]
        assert d.restarts == 0 and d.dropped == 0 and d.corrupt == 0 and d.good == 8, d.counts()
        assert [f["ms"] for f in frames] == [W - 300, W - 200, W - 100, W, W + 100, W + 200, W + 250, W + 300]
        assert [e["ms"] for e in frames[6]["events"]] == [W - 50, W + 240]
        assert not any(f.get("restart") for f in frames)
        assert b"".join(v for k, v in out if k == "text") == b"".join(b"line %d\n" % i for i in range(6))
        st = dashboard.State()
        cpu, mbs = [], []
        for f in frames[:6]:
            st.update(f)
            cpu.append(st.tasks[0]["cpu_pct"])
            mbs.append(st.tiers[0]["mb_s"])
        assert cpu == [None, 50.0, 50.0, 50.0, 50.0, 50.0] and mbs == [None, 2.0, 2.0, 2.0, 2.0, 2.0], (cpu, mbs)
    # what the independent decoder (the raw wire) sees: the same frames, the time as sent
    _, raw, _, _ = telemetry_indep.decode(s)
    assert [f[2] for f in raw] == [t % W for t in times] + [250, 300]

    # a restart right after the wrap: the boot layout at seq 0 (time back by 300 ms) ...
    after = fr(0, 0, b"proto=1", tm.T_LAYOUT) + fr(1, 100, task_row(5)) + fr(2, 200, task_row(55))
    d, out = decode(s + after)
    frames = [v for k, v in out if k == "frame"]
    assert d.restarts == 1 and d.dropped == 0, d.counts()
    assert [f["ms"] for f in frames[-3:]] == [0, 100, 200] and frames[-3].get("restart") is True
    st = dashboard.State()
    for f in frames:
        st.update(f)
    assert st.tasks[0]["cpu_pct"] == 50.0  # over the new run's rows only
    # ... or its layout lost: the seq went back (frames 0..2 of the new run dropped)
    d, out = decode(s + fr(3, 400, b""))
    assert d.restarts == 1 and d.dropped == 3 and [v for k, v in out if k == "frame"][-1]["ms"] == 400
    # ... a restart just before the wrap (time back by nearly all of it, at a boot layout)
    before = fr(100, W - 200, b"") + fr(101, W - 100, b"") + fr(0, 0, b"proto=1", tm.T_LAYOUT) + fr(1, 100, b"")
    d, out = decode(before)
    assert d.restarts == 1 and d.dropped == 0 and [v["ms"] for k, v in out if k == "frame"] == [W - 200, W - 100, 0, 100]
    # ... and with its layout lost (the seq went back): a restart, not a wrap
    d, out = decode(fr(100, W - 200, b"") + fr(101, W - 100, b"") + fr(2, 200, b""))
    assert d.restarts == 1 and d.dropped == 2 and [v["ms"] for k, v in out if k == "frame"][-1] == 200


def test_the_firmware_encoder_across_its_time_wrap():
    # the board's own encoder (CPython twin) streaming across MS_WRAP: every frame decoded,
    # no restart, nothing dropped, the time going on past 10**9
    from firmware_py.clock import VirtualClock

    cap = bytearray()
    clock = VirtualClock()
    t = tm.Telemetry(lambda b, n: cap.extend(bytes(b[:n])), clock=clock, heap=False)
    t.tick()  # the layout
    t.ms = tm.MS_WRAP - 1000
    for i in range(30):
        clock.advance(100000)
        t.tokens += 3
        if i % 7 == 0:
            t.event(tm.EV_WATERMARK, 0, i, 64)
        t.tick()
    d, out = decode(bytes(cap))
    frames = [v for k, v in out if k == "frame"]
    ms = [f["ms"] for f in frames]
    assert d.restarts == 0 and d.dropped == 0 and d.corrupt == 0 and len(frames) > 30
    assert ms == sorted(ms) and ms[-1] == tm.MS_WRAP + 2000, ms
    evs = [e["ms"] for f in frames for e in f.get("events", [])]
    assert evs == sorted(evs) and len(evs) == 5 and evs[-1] > tm.MS_WRAP


def test_a_duplicated_frame_is_a_duplicate_not_a_restart():
    # frames 0, 1, 1, 2 (the second 1 a byte-for-byte repeat): one duplicate, dropped; no
    # restart, no frame counted lost, and its text not shown twice
    f = [frame_bytes(i, 4, b"\x01" + t) for i, t in ((0, b"a"), (1, b"b"), (1, b"b"), (2, b"c"))]
    d, out = decode(b"".join(f))
    frames = [v for k, v in out if k == "frame"]
    assert (d.good, d.duplicates, d.restarts, d.dropped) == (3, 1, 0, 0)
    assert "".join(fr["text"] for fr in frames) == "abc"
    assert d.counts()["duplicates"] == 1


def test_text_split_inside_a_character_is_joined_before_decoding():
    # the telemetry spec's vector: "caf" + 0xC3 in one frame, 0xA9 + "!" in the next
    wire = bytes.fromhex("0004fe010401020501010a01636166c33458178b000005fe010401020501010801a921f2c2216900")
    d, out = decode(wire)
    frames = [v for k, v in out if k == "frame"]
    assert "".join(fr["text"] for fr in frames) == "café!" and d.good == 2
    # bytes that are not UTF-8 become U+FFFD (the JSONL never holds lone surrogates)
    d, out = decode(frame_bytes(0, 4, b"\x01ab\xff\xfecd"))
    text = [v for k, v in out if k == "frame"][0]["text"]
    assert text == "ab\ufffd\ufffdcd" and text.encode("utf-8")


def test_the_reason_counted_and_the_jsonl_keys_are_the_pages():
    # docs/telemetry.md: the checks' order (a candidate whose magic and CRC are both wrong
    # counts as CRC; a good CRC over a wrong magic as magic/version), and the JSONL keys of
    # the kernel, heap, temp, dma and bwcat records and of the events' arguments
    def rec(rid, *vals):
        body = b"".join(console._varint(v) for v in vals)
        return bytes([rid, len(body)]) + body

    pay = console.payload(tm.T_PERIODIC, rec(tm.R_CORE, 1), seq=1, ms=5)
    ver = bytes([tm.MAGIC, tm.PROTO + 1]) + pay[2:]  # another version
    both = bytearray(console.encode_frame(ver))
    both[-2] ^= 0x01  # and a CRC byte flipped: both wrong
    nomagic = bytearray(console.encode_frame(pay))
    nomagic[2] = 0xFC  # the magic (the run's second byte) wrong: no candidate, text
    for run, why in ((bytes(both), {"CRC": 1}), (console.encode_frame(ver), {"magic/version": 1}), (bytes(nomagic), {})):
        d = console.StreamDecoder()
        out = d.feed(b"x\n" + run) + d.flush()
        assert d.counts()["rejected"] == why and d.counts()["corrupt"] == sum(why.values()), (why, out)
    assert d.counts()["text_bytes"] == 2 + len(nomagic) - 2  # "x\n" and the run between its two 0x00, as text
    body = (rec(tm.R_KERNEL, 1, 2, 3, 4, 5, 6, 7, 8) + rec(tm.R_HEAP, 100, 200) + rec(tm.R_TEMP, 2 * 455, 1, 2 * 500 + 1)
            + rec(tm.R_DMA, 1, 2, 3, 4, 5) + rec(tm.R_BWCAT, 0, 1, 2, 3, 4, 5) + rec(tm.R_BWCAT, 1, 0, 0, 0, 0, 0))
    f = console.to_dict(tm.T_PERIODIC, 1, 5, body)
    assert f["kernel"] == {"busy_ms": 1, "idle_ms": 2, "tasks": 3, "misses": 4, "faults": 5, "overruns": 6, "bites": 7,
                           "switches": 8}
    assert f["heap"] == {"free": 100, "alloc": 200}
    assert f["temp"] == {"deci_c": 455, "state": 1, "peak_deci_c": -501}
    assert f["dma"] == {"depth": 1, "max_depth": 2, "in_flight": 3, "stalls": 4, "full": 5}
    assert f["bwcats"][0] == {"tier": 0, "category": 1, "util_permille": 2, "kb": 3, "waits": 4, "refused": 5}
    assert len(f["bwcats"]) == 2 and "bwcat" not in f
    e = console.to_dict(tm.T_EVENT, 1, 5, bytes([tm.EV_FAULT, 4]) + bytes([9, 4, 6, 0]))["events"][0]
    assert e == {"event": "fault", "ms": 9, "task": 2, "faults": 3, "_": 0}
    e = console.to_dict(tm.T_EVENT, 1, 5, bytes([tm.EV_DONE, 4]) + bytes([9, 2, 8, 4]))["events"][0]
    assert e == {"event": "done", "ms": 9, "request": 1, "tokens": 4, "reason": 2, "reason_name": "full"}
    e = console.to_dict(tm.T_EVENT, 1, 5, bytes([99, 4]) + bytes([9, 2, 8, 4]))["events"][0]
    assert e == {"event": "event_99", "ms": 9, "arg_0": 1, "arg_1": 4, "arg_2": 2}
