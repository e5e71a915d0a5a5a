# The tokenizer (firmware_py/tokenizer.py) encodes exactly as llama2.c's run.c: checked
# against an independent naive port of run.c's encode (written here, sharing nothing
# with the firmware) on fixed tables (tests/firmware/tok_cases.py, which the firmware
# script checks under MicroPython too) and on random text; decode follows run.c; a
# truncated, corrupt or mismatched tokenizer.bin is refused in one line.
import os
import struct
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIRMWARE_TESTS
from firmware_py import tokenizer
from host import paths

sys.path.insert(0, FIRMWARE_TESTS)
import tok_cases  # noqa: E402


class NaiveTokenizer:
    # run.c's Tokenizer, read and encoded the straightforward way (full rescan, string
    # concatenation every pass), for comparison only
    def __init__(self, data):
        (self.max_len,) = struct.unpack_from("<I", data, 0)
        self.pieces, self.scores, pos = [], [], 4
        while pos < len(data):
            score, n = struct.unpack_from("<fi", data, pos)
            self.pieces.append(data[pos + 8:pos + 8 + n])
            self.scores.append(score)
            pos += 8 + n
        self.lookup = {}
        for i, p in enumerate(self.pieces):
            self.lookup.setdefault(p, i)

    def encode(self, text, bos, eos):
        text = text.split(b"\0")[0]
        toks = [1] if bos else []
        if text:
            toks.append(self.lookup[b" "])
        buf = b""
        for i, c in enumerate(text):
            if c & 0xC0 != 0x80:
                buf = b""
            buf += bytes([c])
            if i + 1 < len(text) and text[i + 1] & 0xC0 == 0x80 and len(buf) < 4:
                continue
            if buf in self.lookup:
                toks.append(self.lookup[buf])
            else:
                toks.extend(b + 3 for b in buf)
            buf = b""
        while True:
            best, best_id, best_idx = -1e10, -1, -1
            for i in range(len(toks) - 1):
                j = self.lookup.get(self.pieces[toks[i]] + self.pieces[toks[i + 1]], -1)
                if j != -1 and self.scores[j] > best:
                    best, best_id, best_idx = self.scores[j], j, i
            if best_idx == -1:
                break
            toks[best_idx:best_idx + 2] = [best_id]
        if eos:
            toks.append(2)
        return toks


def tok512_path():
    d = paths.shared_models()
    p = d and os.path.join(d, "tok512.bin")
    if not p or not os.path.exists(p):
        pytest.skip("tok512.bin not in ../shared/models (the project never commits it)")
    return p


SYN = tok_cases.tokenizer_bytes(tok_cases.synthetic_pieces())


def test_synthetic_table_matches_the_naive_port():
    ref = NaiveTokenizer(SYN)
    for text, bos, eos, want in tok_cases.SYNTHETIC:
        assert ref.encode(text, bos, eos) == want, text


def test_synthetic_table_matches_the_firmware():
    t = tokenizer.Tokenizer(SYN, "syn")
    assert t.space == tok_cases.SYNTHETIC_SPACE
    for text, bos, eos, want in tok_cases.SYNTHETIC:
        assert t.encode(text, bos, eos) == want, text


def test_tok512_table_matches_the_naive_port_and_the_firmware():
    p = tok512_path()
    with open(p, "rb") as f:
        data = f.read()
    ref = NaiveTokenizer(data)
    t = tokenizer.load(p, 512)
    for text, want in tok_cases.TOK512:
        assert ref.encode(text, True, False) == want, text
        assert t.encode(text) == want, text


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40), st.booleans(), st.booleans())
def test_random_text_encodes_as_the_naive_port_synthetic(text, bos, eos):
    b = text.encode()
    assert tokenizer.Tokenizer(SYN, "syn").encode(b, bos, eos) == NaiveTokenizer(SYN).encode(b, bos, eos)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=24))
def test_random_bytes_encode_as_the_naive_port_synthetic(b):
    assert tokenizer.Tokenizer(SYN, "syn").encode(b) == NaiveTokenizer(SYN).encode(b, True, False)


_T512 = {}


def _tok512():
    if not _T512:
        p = tok512_path()
        with open(p, "rb") as f:
            data = f.read()
        _T512["fw"], _T512["ref"] = tokenizer.Tokenizer(data, p, 512), NaiveTokenizer(data)
    return _T512["fw"], _T512["ref"]


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyz ABC.,!?'\"\n\t0123456789éü€🙂"), max_size=60))
def test_random_text_encodes_as_the_naive_port_tok512(text):
    fw, ref = _tok512()
    b = text.encode()
    ids = fw.encode(b)
    assert ids == ref.encode(b, True, False)
    assert fw.decode(ids) == b  # this vocabulary covers every byte: decode inverts encode


def test_decode_follows_run_c():
    t = tokenizer.Tokenizer(SYN, "syn")
    ab_sp = t.ids[b" ab"]
    assert t.piece(1, ab_sp) == b"ab"  # after BOS the leading space goes
    assert t.piece(260, ab_sp) == b" ab"
    assert t.piece(0, 3 + 0x41) == b"A"  # "<0x41>" is the byte itself
    assert t.piece(0, t.ids[b"<0xZZ>"]) == b"<0xZZ>"  # not hex: printed as it is
    assert t.decode([1, 274, 273]) == b"h\xc3\xa9llo"  # " hé" after BOS, then "llo"
    assert t.decode(t.encode("h\u00e9llo a\tb")) == "h\u00e9llo a\tb".encode()


def _bad(data, vocab_size=0):
    with pytest.raises(tokenizer.TokenizerError) as e:
        tokenizer.Tokenizer(data, "tok.bin", vocab_size)
    msg = str(e.value)
    assert msg.startswith("tok.bin: ") and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("cut", [1, 2, 5, 8, 9, 100, len(SYN) - 7, len(SYN) - 1])
def test_truncated_tokenizer_is_one_line(cut):
    data = SYN[:cut]
    msg = _bad(data, len(tok_cases.synthetic_pieces()))
    assert "truncated" in msg or "holds" in msg


def test_each_corrupt_field_is_one_line():
    n = len(tok_cases.synthetic_pieces())
    assert "max_token_length" in _bad(struct.pack("<I", 0) + SYN[4:])
    assert "max_token_length" in _bad(struct.pack("<I", 1 << 30) + SYN[4:])
    # the first token's length field (bytes 8..11): negative, beyond max_token_length, beyond the file
    assert "length -1" in _bad(SYN[:8] + struct.pack("<i", -1) + SYN[12:])
    assert "outside" in _bad(SYN[:8] + struct.pack("<i", 99) + SYN[12:])
    assert "past the end" in _bad(SYN[:8] + struct.pack("<i", 6) + SYN[12:16])
    # the first token's score: NaN, inf
    assert "score" in _bad(SYN[:4] + struct.pack("<f", float("nan")) + SYN[8:])
    assert "score" in _bad(SYN[:4] + struct.pack("<f", float("inf")) + SYN[8:])
    # no " " token: not a llama2.c tokenizer
    no_space = tok_cases.tokenizer_bytes([p for p in tok_cases.synthetic_pieces() if p[0] != b" "])
    assert "dummy prefix" in _bad(no_space)
    # vocabulary mismatch against a model: fewer or more tokens than its vocab_size
    assert "holds %d tokens, the model's vocabulary is %d" % (n, n + 5) in _bad(SYN, n + 5)
    assert "after the model's %d tokens" % (n - 4) in _bad(SYN, n - 4)
    assert "too few" in _bad(tok_cases.tokenizer_bytes([(b" ", 0.0), (b"a", 0.0)]))


def test_load_checks_the_models_vocabulary(tmp_path):
    p = str(tmp_path / "tok.bin")
    with open(p, "wb") as f:
        f.write(SYN)
    n = len(tok_cases.synthetic_pieces())
    assert tokenizer.load(p).vocab_size == n
    assert tokenizer.load(p, n).vocab_size == n
    with pytest.raises(tokenizer.TokenizerError, match="wrong tokenizer"):
        tokenizer.load(p, 512)
    with pytest.raises(tokenizer.TokenizerError, match="cannot be read"):
        tokenizer.load(str(tmp_path / "absent.bin"))


def test_byte_without_a_fallback_token_is_refused():
    t = tokenizer.Tokenizer(tok_cases.tokenizer_bytes([(b"<unk>", 0.0), (b"<s>", 0.0), (b"</s>", 0.0), (b" ", 0.0)]), "tiny")
    assert t.encode("") == [1]
    with pytest.raises(tokenizer.TokenizerError, match="no fallback token"):
        t.encode("a")
