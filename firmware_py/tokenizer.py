# llama2.c's tokenizer.bin on both interpreters: uint32 max_token_length, then per token
# float32 score, int32 length, that many bytes. Encoding is run.c's: an optional BOS,
# a dummy " " prefix when the text is not empty, each UTF-8 codepoint looked up (an
# unknown one becomes its bytes' fallback tokens, id = byte + 3), then the adjacent pair
# whose concatenation is a token with the best score is merged, repeatedly. Decoding
# strips the leading space of the token after BOS and turns "<0xNN>" into the byte.
# Everything here allocates (bytes, lists): it runs at boot and once per prompt or
# printed token, not inside the decode step.
import struct

from firmware_py.compat import const

BOS = const(1)  # token id of <s>, prepended by encode(bos=True)
EOS = const(2)  # token id of </s>
BYTE_FALLBACK = const(3)  # byte b encodes as token b + 3 when its codepoint is unknown
_MAX_TOKEN_LENGTH = const(1 << 16)  # sanity bound for the header field
_NO_MERGE = -1e10  # run.c's starting best score: a pair scoring below it never merges


class TokenizerError(ValueError):
    # a tokenizer file that cannot be used (or does not fit the model); str() is one line
    pass


class Tokenizer:
    # the vocabulary, its scores and the piece -> id lookup, built once from a file's bytes
    def __init__(self, data, where="<tokenizer>", vocab_size=0):
        n = len(data)
        if n < 4:
            raise TokenizerError("%s: truncated: %d B, a tokenizer starts with a 4 B max_token_length" % (where, n))
        mtl = struct.unpack_from("<I", data, 0)[0]
        if not 0 < mtl <= _MAX_TOKEN_LENGTH:
            raise TokenizerError("%s: max_token_length %d is not plausible (not a llama2.c tokenizer.bin?)" % (where, mtl))
        vocab = []
        scores = []
        pos = 4
        while pos < n and (not vocab_size or len(vocab) < vocab_size):
            i = len(vocab)
            if pos + 8 > n:
                raise TokenizerError("%s: truncated in token %d at byte %d: %d B left, a token needs 8 B before its text" % (where, i, pos, n - pos))
            score, size = struct.unpack_from("<fi", data, pos)
            if size < 0 or size > mtl:
                raise TokenizerError("%s: token %d at byte %d has length %d, outside 0..max_token_length %d (corrupt)" % (where, i, pos, size, mtl))
            if score != score or score in (float("inf"), float("-inf")):
                raise TokenizerError("%s: token %d at byte %d has score %r (corrupt)" % (where, i, pos, score))
            if pos + 8 + size > n:
                raise TokenizerError("%s: truncated in token %d at byte %d: its %d B of text run past the end (%d B)" % (where, i, pos, size, n))
            vocab.append(bytes(data[pos + 8:pos + 8 + size]))
            scores.append(score)
            pos += 8 + size
        if vocab_size and len(vocab) < vocab_size:
            raise TokenizerError("%s: holds %d tokens, the model's vocabulary is %d (wrong tokenizer for this model?)" % (where, len(vocab), vocab_size))
        if pos < n:
            raise TokenizerError("%s: %d B after the model's %d tokens: a larger vocabulary (wrong tokenizer for this model?)" % (where, n - pos, vocab_size))
        if len(vocab) <= EOS:
            raise TokenizerError("%s: %d tokens, too few for <unk>, <s>, </s>" % (where, len(vocab)))
        ids = {}
        for i in range(len(vocab)):
            if vocab[i] not in ids:  # a repeated piece encodes as its first id
                ids[vocab[i]] = i
        if b" " not in ids:
            raise TokenizerError("%s: no ' ' token (llama2.c's dummy prefix): not a llama2.c tokenizer" % where)
        raw = {}
        for i in range(len(vocab)):
            p = vocab[i]
            if len(p) == 6 and p[:3] == b"<0x" and p[5:] == b">" and _hex2(p[3:5]) >= 0:
                raw[i] = bytes((_hex2(p[3:5]),))
        self.where = where  # the file it came from
        self.vocab = vocab  # list of bytes: token id -> piece
        self.scores = scores  # list of floats (float32 values): token id -> merge score
        self.ids = ids  # dict bytes -> token id
        self.raw = raw  # dict token id -> one byte, for "<0xNN>" pieces
        self.vocab_size = len(vocab)  # tokens
        self.max_token_length = mtl  # longest piece, from the header
        self.space = ids[b" "]  # the dummy prefix token

    # token ids of text (str or UTF-8 bytes) exactly as run.c's encode; O(n^2) merges
    # over n codepoints, allocates (lists, concatenated pieces)
    def encode(self, text, bos=True, eos=False):
        if isinstance(text, str):
            text = text.encode()
        z = text.find(b"\0")
        if z >= 0:
            text = text[:z]  # run.c reads a C string
        ids = self.ids
        out = []
        if bos:
            out.append(BOS)
        n = len(text)
        if n:
            out.append(self.space)
        i = 0
        while i < n:
            # one codepoint: a byte and the continuation bytes after it, at most 4 in all
            j = i + 1
            while j < n and (text[j] & 0xC0) == 0x80 and j - i < 4:
                j += 1
            t = ids.get(text[i:j], -1)
            if t >= 0:
                out.append(t)
            else:
                for k in range(i, j):
                    b = text[k] + BYTE_FALLBACK
                    if b >= self.vocab_size:
                        raise TokenizerError("%s: byte 0x%02x has no fallback token in a %d-token vocabulary" % (self.where, text[k], self.vocab_size))
                    out.append(b)
            i = j
        # pair[k]: the token merging out[k] and out[k + 1], or -1; only the two pairs
        # beside a merge change, so each step rescans scores but rebuilds two pieces
        pair = [self._merge(out[k], out[k + 1]) for k in range(len(out) - 1)]
        scores = self.scores
        while True:
            best = _NO_MERGE
            at = -1
            for k in range(len(pair)):
                t = pair[k]
                if t >= 0 and scores[t] > best:  # strictly better: the first of equals wins, as run.c
                    best = scores[t]
                    at = k
            if at < 0:
                break
            out[at] = pair[at]
            del out[at + 1]
            del pair[at]
            if at > 0:
                pair[at - 1] = self._merge(out[at - 1], out[at])
            if at < len(pair):
                pair[at] = self._merge(out[at], out[at + 1])
        if eos:
            out.append(EOS)
        return out

    # the token whose piece is piece(a) + piece(b), or -1
    def _merge(self, a, b):
        return self.ids.get(self.vocab[a] + self.vocab[b], -1)

    # bytes of token tok printed after token prev (run.c's decode): a piece after BOS
    # loses its leading space, "<0xNN>" is the byte itself; allocates at most a slice
    def piece(self, prev, tok):
        if tok in self.raw:
            return self.raw[tok]
        p = self.vocab[tok]
        if prev == BOS and p[:1] == b" ":
            return p[1:]
        return p

    # bytes of a token sequence, each piece after the token before it; BOS prints
    # nothing (run.c starts printing after it); allocates
    def decode(self, tokens, prev=-1):
        out = []
        for t in tokens:
            if t != BOS:
                out.append(self.piece(prev, t))
            prev = t
        return b"".join(out)


# value of two ASCII hex digits (upper or lower case), or -1
def _hex2(b):
    v = 0
    for c in b:
        if 48 <= c <= 57:
            d = c - 48
        elif 65 <= c <= 70:
            d = c - 55
        elif 97 <= c <= 102:
            d = c - 87
        else:
            return -1
        v = v * 16 + d
    return v


# Tokenizer of the file at path; vocab_size (the model's, 0: unknown) must match its
# token count; the file is read once and parsed at boot
def load(path, vocab_size=0):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        raise TokenizerError("%s: cannot be read" % path) from None
    return Tokenizer(data, path, vocab_size)
