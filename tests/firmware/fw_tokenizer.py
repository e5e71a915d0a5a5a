# The tokenizer on this interpreter: the synthetic vocabulary's table (merges, a score
# tie, byte fallback, multi-byte and invalid UTF-8, NUL) and, when ../shared/models has
# it, stories260K's tok512.bin table; decode; corrupt files refused in one line. The
# expected ids are checked against a naive port of run.c by tests/test_tokenizer.py.
from fwtest import check, eq, raises, done
from firmware_py import tokenizer
import tok_cases

syn = tok_cases.tokenizer_bytes(tok_cases.synthetic_pieces())
t = tokenizer.Tokenizer(syn, "syn.bin")
eq(t.vocab_size, len(tok_cases.synthetic_pieces()), "synthetic vocabulary size")
eq(t.space, tok_cases.SYNTHETIC_SPACE, "dummy prefix token")
for text, bos, eos, want in tok_cases.SYNTHETIC:
    eq(t.encode(text, bos, eos), want, "encode %r" % text)
eq(t.encode("h\u00e9llo"), [1, 274, 273], "a str encodes as its UTF-8 bytes")
eq(t.decode(t.encode("h\u00e9llo a\tb \U0001F642")), "h\u00e9llo a\tb \U0001F642".encode(), "decode inverts encode")
eq(t.piece(1, t.ids[b" ab"]), b"ab", "after BOS a piece loses its leading space")
eq(t.piece(5, t.ids[b" ab"]), b" ab", "elsewhere it keeps it")
eq(t.piece(0, 3 + 0x41), b"A", "<0x41> decodes to the byte")
eq(t.piece(0, t.ids[b"<0xZZ>"]), b"<0xZZ>", "a non-hex <0x..> piece stays text")

# corrupt and truncated files: one line naming the file
for data, n, needle in ((syn[:3], 0, "truncated"), (syn[:len(syn) - 1], t.vocab_size, "truncated"),
                        (b"\0\0\0\0" + syn[4:], 0, "max_token_length"), (syn[:8] + b"\xff\xff\xff\xff" + syn[12:], 0, "length -1"),
                        (syn, t.vocab_size + 1, "wrong tokenizer"), (syn, t.vocab_size - 1, "larger vocabulary")):
    e = raises(tokenizer.TokenizerError, tokenizer.Tokenizer, data, "bad.bin", n)
    msg = str(e)
    check(msg.startswith("bad.bin: ") and needle in msg and "\n" not in msg, "one-line error %r" % msg)

path = "../shared/models/tok512.bin"  # beside the repository (the tests run from its root)
try:
    big = tokenizer.load(path, 512)
except tokenizer.TokenizerError:
    big = None
    print("SKIP tok512.bin: not in ../shared/models")
if big is not None:
    for text, want in tok_cases.TOK512:
        eq(big.encode(text), want, "tok512 encode %r" % text)
    ids = big.encode("Once upon a time, there was a little girl named Lily.")
    eq(big.decode(ids), b"Once upon a time, there was a little girl named Lily.", "tok512 decode")
done()
