# Tokenizer cases shared by fw_tokenizer.py (run under MicroPython and CPython) and
# tests/test_tokenizer.py (which checks every expected id list against an independent
# naive port of run.c's encode, so the tables cannot drift). Runs on both interpreters.
import struct


# bytes of a llama2.c tokenizer.bin from (piece bytes, score) pairs
def tokenizer_bytes(pieces, max_len=0):
    out = [struct.pack("<I", max_len or max(len(p) for p, _ in pieces))]
    for p, s in pieces:
        out.append(struct.pack("<fi", s, len(p)))
        out.append(p)
    return b"".join(out)


# a small vocabulary with run.c's shape: <unk>, BOS, EOS, the 256 byte tokens, then
# pieces chosen to exercise merges, a tie of scores and multi-byte codepoints
def synthetic_pieces():
    out = [(b"<unk>", 0.0), (b"\n<s>\n", 0.0), (b"\n</s>\n", 0.0)]
    for b in range(256):
        out.append((b"<0x%02X>" % b, 0.0))
    extra = [(" ", -1.0), ("a", -2.0), ("b", -3.0), ("c", -4.0), ("ab", -5.0), ("bc", -5.0), ("abc", -6.0),
             (" ab", -7.0), ("é", -8.0), ("h", -9.0), ("hé", -2.5), ("l", -11.0), ("ll", -10.0), ("o", -12.0),
             ("llo", -1.5), (" hé", -3.5), ("<0xZZ>", -20.0), (" b", -30.0), ("€", -40.0)]
    for p, s in extra:
        out.append((p.encode(), s))
    return out


SYNTHETIC_SPACE = 259  # id of " " in synthetic_pieces()

# (text as UTF-8 bytes, bos, eos, expected ids) for the synthetic vocabulary
SYNTHETIC = [
    (b"", True, False, [1]),
    (b"", False, False, []),
    (b"a", True, False, [1, 259, 260]),
    (b"ab", True, False, [1, 266]),
    (b"abc", True, False, [1, 259, 265]),
    (b"bcab", False, True, [259, 264, 263, 2]),
    (b"ababab", True, False, [1, 266, 263, 263]),
    (b"h\xc3\xa9llo", True, False, [1, 274, 273]),
    (b"\xe2\x82\xac \xf0\x9f\x99\x82", True, False, [1, 259, 277, 259, 243, 162, 156, 133]),
    (b"a\tb", True, False, [1, 259, 260, 12, 261]),
    (b"\xff\xfe", True, False, [1, 259, 258, 257]),
    (b"\x80\x80\x80\x80\x80\x80", False, False, [259, 131, 131, 131, 131, 131, 131]),
    (b"<0xZZ>", True, False, [1, 259, 63, 51, 123, 93, 93, 65]),
    (b"ab\x00cd", True, False, [1, 266]),
]

# (text, expected ids with BOS) for stories260K's tok512.bin
TOK512 = [
    (b"Once upon a time", [1, 403, 407, 261, 378]),
    (b"", [1]),
    (b"Lily and Tom\n\nplay.", [1, 317, 269, 274, 287, 13, 13, 427, 421, 283, 426]),
    (b"h\xc3\xa9llo w\xc3\xb6rld \xf0\x9f\x99\x82", [1, 270, 485, 306, 414, 263, 198, 185, 420, 341, 410, 243, 162, 156, 133]),
]
