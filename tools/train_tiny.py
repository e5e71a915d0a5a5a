#!/usr/bin/env python3
# Trains kvrtos's embedded default model from nothing: it generates a corpus of short
# stories from a small seeded grammar (below), learns a byte-fallback BPE tokenizer on
# it, trains a tiny llama-architecture transformer with PyTorch on the CPU and writes
# llama2.c files: model.bin (legacy fp32), tokenizer.bin, reference.json (torch logits
# and greedy samples the tests replay in numpy) and README.md (the model card).
#
#   .venv/bin/pip install torch==2.13.0          # the optional extra: pip install -e .[train]
#   nice -n 19 .venv/bin/python tools/train_tiny.py --out models/kvrtos-tiny --seed 1
#
# Everything is seeded and runs on one thread, so a run on the same machine repeats
# bit for bit. The grammar, the sentence/story recognizer and the tokenizer are plain
# Python (no torch): tests/test_tiny_model.py imports them to judge the model's output.
import argparse
import hashlib
import json
import math
import os
import random
import re
import struct
import sys
import time

# --- the corpus grammar --------------------------------------------------------------
# A story is a fixed plan of sections; each section picks one of its sentence templates.
# Slots in braces are filled from the word lists; a story binds its hero (name and
# gender), companion, place, thing, animal once and every sentence reuses them.

GIRLS = ["Lily", "Mia", "Anna", "Sue", "Lucy", "Emma", "Sara", "Zoe", "Amy", "Kim"]
BOYS = ["Tom", "Ben", "Max", "Sam", "Tim", "Jack", "Leo", "Dan", "Bob", "Joe"]
WORDS = {
    "adj": ["little", "kind", "happy", "brave", "shy", "curious", "small", "funny"],
    "home": ["small house", "big town", "quiet village", "little farm", "busy city"],
    "act": ["play outside", "read books", "draw pictures", "sing songs", "dance",
            "run and jump", "look at the stars", "build with blocks", "climb trees"],
    "rel": ["mom", "dad", "friend", "sister", "brother", "grandma", "grandpa"],
    "place": ["park", "forest", "garden", "beach", "farm", "lake", "hill", "zoo"],
    "color": ["red", "blue", "green", "yellow", "pink", "big", "shiny", "tiny"],
    "thing": ["ball", "kite", "box", "hat", "book", "toy", "flower", "shell", "rock", "cup"],
    "under": ["tree", "rock", "bench", "bush"],
    "animal": ["dog", "cat", "bird", "frog", "bunny", "duck", "squirrel"],
    "feel": ["happy", "sad", "scared", "excited", "surprised", "proud"],
    "want": ["take it home", "show it to everyone", "play with it", "keep it safe"],
    "say": ["Thank you!", "I love it!", "Can you help me?", "Let's play!", "Look at this!"],
    "end": ["It was the best day ever.", "They were very happy.", "The end."],
}
KIND = {"girl": ("she", "She", "her"), "boy": ("he", "He", "his")}

# (section name, min sentences, max sentences, templates). {N} name, {P}/{Pc} pronoun,
# {H} possessive, {K} girl/boy, {R} companion, {L} place, {C} colour, {T} thing,
# {A} animal, {U} what it was under; the rest are free picks from WORDS.
PLAN = [
    ("intro", 1, 1, [
        "Once upon a time, there was a {adj} {K} named {N}.",
        "Once upon a time, in a {home}, there lived a {adj} {K} named {N}.",
    ]),
    ("likes", 1, 2, [
        "{Pc} loved to {act}.",
        "{N} liked to {act} with {H} {R}.",
        "Every day, {P} would {act}.",
    ]),
    ("trip", 1, 1, [
        "One day, {N} went to the {L} with {H} {R}.",
        "One day, {P} went to the {L}.",
        "One sunny day, {N} and {H} {R} went to the {L}.",
    ]),
    ("find", 1, 1, [
        "At the {L}, {P} saw a {C} {T}.",
        "There, {N} found a {C} {T} under a {U}.",
        "In the {L}, {N} saw a {C} {T} next to a {A}.",
    ]),
    ("feel", 1, 2, [
        "{N} was very {feel}.",
        "{Pc} felt {feel} and wanted to {want}.",
        "{N} said, \"{say}\"",
    ]),
    ("problem", 0, 1, [
        "But the {T} was stuck in a tree.",
        "Then a {A} came and took the {T}.",
        "But the {T} was too high to reach.",
    ]),
    ("help", 0, 1, [
        "{N} asked {H} {R} for help.",
        "{Pc} did not give up.",
        "The {A} said, \"I am sorry.\"",
    ]),
    ("ending", 1, 2, [
        "Together, they got the {T} back.",
        "{N} and {H} {R} played with the {T} all day.",
        "{Pc} went home {feel} and tired.",
        "{end}",
    ]),
]
_SLOT = re.compile(r"\{(\w+)\}")


def story(rng):
    # one story from the grammar: the plan's sections in order, each sentence filled
    kind = rng.choice(["girl", "boy"])
    bound = {"K": kind, "N": rng.choice(GIRLS if kind == "girl" else BOYS),
             "P": KIND[kind][0], "Pc": KIND[kind][1], "H": KIND[kind][2],
             "R": rng.choice(WORDS["rel"]), "L": rng.choice(WORDS["place"]),
             "C": rng.choice(WORDS["color"]), "T": rng.choice(WORDS["thing"]),
             "A": rng.choice(WORDS["animal"]), "U": rng.choice(WORDS["under"])}
    out, used = [], set()
    for si, (name, lo, hi, templates) in enumerate(PLAN):
        allowed = [i for i in range(len(templates)) if _allowed(si, i, used)]
        n = rng.randint(lo, hi)
        if name == "help":
            n = 1 if any(u[0] == _PROBLEM for u in used) else 0  # a problem is always met, and only then
        for i in sorted(rng.sample(allowed, n)):
            used.add((si, i))
            out.append(_SLOT.sub(lambda m: bound[m.group(1)] if m.group(1) in bound
                                 else rng.choice(WORDS[m.group(1)]), templates[i]))
    return " ".join(out)


_PROBLEM = [n for n, *_ in PLAN].index("problem")
_HELP = [n for n, *_ in PLAN].index("help")
_ENDING = [n for n, *_ in PLAN].index("ending")


def _allowed(section, template, used):
    # whether sentence (section, template) makes sense after the sentences `used`
    problems = {i for s, i in used if s == _PROBLEM}
    if (section, template) == (_HELP, 2):
        return 1 in problems  # "The dog said, I am sorry" only after "a dog came and took"
    if section == _HELP or (section, template) == (_ENDING, 0):
        return bool(problems)  # help, and "got it back", only after a problem
    return True


def corpus(n_stories, seed):
    # n_stories stories from a seeded generator, as a list of strings
    rng = random.Random(seed)
    return [story(rng) for _ in range(n_stories)]


def split_sentences(text):
    # sentences of a text: a sentence ends at . ! or ? outside quotes, or at a closing quote
    out, cur, quoted = [], "", False
    for ch in text:
        cur += ch
        if ch == '"':
            quoted = not quoted
            if not quoted and cur.rstrip('"')[-1:] in ".!?":
                out.append(cur.strip())
                cur = ""
        elif ch in ".!?" and not quoted:
            out.append(cur.strip())
            cur = ""
    return out, cur.strip()  # (complete sentences, unfinished tail)


def _template_regex(template):
    # a template as a regex with one named group per slot occurrence
    parts, pos, seen = [], 0, {}
    free = {"K": list(KIND), "N": GIRLS + BOYS, "P": ["she", "he"], "Pc": ["She", "He"],
            "H": ["her", "his"], "R": WORDS["rel"], "L": WORDS["place"], "C": WORDS["color"],
            "T": WORDS["thing"], "A": WORDS["animal"], "U": WORDS["under"]}
    for m in _SLOT.finditer(template):
        parts.append(re.escape(template[pos:m.start()]))
        slot = m.group(1)
        choices = free.get(slot) or WORDS[slot]
        seen[slot] = seen.get(slot, 0) + 1
        group = "%s_%d" % (slot, seen[slot])
        parts.append("(?P<%s>%s)" % (group, "|".join(re.escape(c) for c in choices)))
        pos = m.end()
    parts.append(re.escape(template[pos:]))
    return re.compile("".join(parts) + r"\Z")


_RULES = [(si, ti, re.compile(r"\A" + _template_regex(t).pattern))
          for si, (_name, _lo, _hi, ts) in enumerate(PLAN) for ti, t in enumerate(ts)]


def parse_sentence(sentence):
    # (section index, template index, {slot: {words}}) for a sentence the grammar accepts, else None
    for si, ti, rx in _RULES:
        m = rx.match(sentence)
        if m:
            slots = {}
            for group, word in m.groupdict().items():
                slots.setdefault(group.rsplit("_", 1)[0], set()).add(word)
            return si, ti, slots
    return None


def check_story(text):
    # why a story breaks the grammar (a list of reasons; empty: it is a story of the
    # corpus's kind): every sentence parses, sections come in plan order within their
    # counts, and the hero's name, gender and the bound nouns stay the same throughout
    sentences, tail = split_sentences(text)
    problems = []
    if tail:
        problems.append("unfinished sentence %r" % tail)
    order, binding, used = [], {}, set()
    gender = {"she": "girl", "She": "girl", "her": "girl", "he": "boy", "He": "boy", "his": "boy"}
    for s in sentences:
        p = parse_sentence(s)
        if p is None:
            problems.append("not in the grammar: %r" % s)
            continue
        si, ti, slots = p
        if not _allowed(si, ti, used):
            problems.append("%r does not follow from the story before it" % s)
        used.add((si, ti))
        order.append(si)
        for slot, words in slots.items():
            if slot in ("P", "Pc", "H", "K"):
                slot, words = "gender", {gender.get(w, w) for w in words}
            if slot in ("N", "gender", "R", "L", "T", "A", "U"):
                for w in words:
                    if binding.setdefault(slot, w) != w:
                        problems.append("%s changes from %r to %r in %r" % (slot, binding[slot], w, s))
    if "N" in binding and "gender" in binding:
        if (binding["N"] in GIRLS) != (binding["gender"] == "girl"):
            problems.append("%s is not a %s" % (binding["N"], binding["gender"]))
    if order and order != sorted(order):
        problems.append("sections out of order: %s" % [PLAN[i][0] for i in order])
    for si, (name, lo, hi, _ts) in enumerate(PLAN):
        n = order.count(si)
        if si == _HELP:
            lo = hi = order.count(_PROBLEM)  # a problem is met by one helping sentence
        if sentences and not tail and not lo <= n <= hi:
            problems.append("section %s has %d sentences (allowed %d..%d)" % (name, n, lo, hi))
    if len(set(sentences)) != len(sentences):
        problems.append("a sentence repeats")
    return problems


# --- the tokenizer ---------------------------------------------------------------------
# llama2.c layout: 0 <unk>, 1 <s>, 2 </s>, 3..258 byte tokens "<0x00>".."<0xFF>", then the
# merged tokens (score -k for the k-th merge: earlier merges win), then the single
# characters of the corpus (lowest scores; merges start from them). Encoding is
# llama2.c's: BOS, a dummy " " before non-empty text, one token per UTF-8 character
# (byte fallback byte+3), then repeatedly merge the adjacent pair whose concatenation is
# a token with the best score, leftmost on ties.

BOS, EOS, N_SPECIAL = 1, 2, 259
SPECIAL = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % b for b in range(256)]
# A chunk: optional space + letters, or optional space + other non-space characters.
# No merged token crosses a chunk boundary, so encoding chunk by chunk equals encoding
# the whole text (tokens hold a space only at their start and never mix letters with
# punctuation); check_encoder() tests that on a sample.
_CHUNK = re.compile(r" ?[A-Za-z]+| ?[^A-Za-z ]+| +")


class Tokenizer:
    # a vocabulary (list of bytes) with scores, llama2.c's encode and decode
    def __init__(self, vocab, scores):
        self.vocab = vocab  # id -> token bytes
        self.scores = scores  # id -> float merge priority (higher merges first)
        self.ids = {t: i for i, t in enumerate(vocab)}  # token bytes -> id (unique)
        self._cache = {}  # chunk -> ids, for the training data's repeated words
        self.n_merges = 0  # merged tokens after the byte tokens (set by train_tokenizer)

    def encode_reference(self, text, bos=True):
        # llama2.c encode on the whole text, as written in run.c (O(n^2); for checks)
        toks = [self.ids[b" "]] if text else []  # the dummy prefix
        return ([BOS] if bos else []) + self._merge(toks + self._chars(text))

    def encode(self, text, bos=True):
        # the same ids as encode_reference, chunk by chunk with a cache (fast)
        out = [BOS] if bos else []
        for chunk in _CHUNK.findall(" " + text if text else ""):
            ids = self._cache.get(chunk)
            if ids is None:
                ids = self._cache[chunk] = self._merge(self._chars(chunk))
            out += ids
        return out

    def _chars(self, text):
        # one id per character, unknown ones by their UTF-8 bytes (+3)
        out = []
        for ch in text:
            b = ch.encode("utf-8")
            if b in self.ids:
                out.append(self.ids[b])
            else:
                out += [x + 3 for x in b]
        return out

    def _merge(self, toks):
        # best-first pair merging over a list of ids, in place of a copy
        toks = list(toks)
        while True:
            best, at = -1e30, -1
            for i in range(len(toks) - 1):
                j = self.ids.get(self.vocab[toks[i]] + self.vocab[toks[i + 1]])
                if j is not None and self.scores[j] > best:
                    best, at = self.scores[j], i
            if at < 0:
                return toks
            toks[at:at + 2] = [self.ids[self.vocab[toks[at]] + self.vocab[toks[at + 1]]]]

    def decode(self, ids):
        # text of ids as run.c prints it: the space after BOS dropped, byte tokens as bytes
        out, prev = b"", BOS
        for i in ids:
            if i == BOS:
                prev = i
                continue
            t = self.vocab[i]
            if prev == BOS and t.startswith(b" "):
                t = t[1:]
            if 3 <= i < N_SPECIAL:
                t = bytes([i - 3])
            out += t
            prev = i
        return out.decode("utf-8", "replace")

    def write(self, path):
        # tokenizer.bin: uint32 max_token_length, then per token float32 score, int32 len, bytes
        with open(path, "wb") as f:
            f.write(struct.pack("<I", max(len(t) for t in self.vocab)))
            for t, s in zip(self.vocab, self.scores, strict=True):
                f.write(struct.pack("<fi", s, len(t)) + t)

    @classmethod
    def read(cls, path):
        # a Tokenizer from a tokenizer.bin (vocabulary size from the file itself)
        with open(path, "rb") as f:
            data = f.read()
        vocab, scores, off = [], [], 4
        while off < len(data):
            s, n = struct.unpack_from("<fi", data, off)
            vocab.append(data[off + 8:off + 8 + n])
            scores.append(s)
            off += 8 + n
        return cls(vocab, scores)


def train_tokenizer(texts, vocab_size):
    # byte-fallback BPE: count chunks, merge the most frequent pair (ties: smallest pair)
    counts = {}
    for text in texts:
        for chunk in _CHUNK.findall(" " + text):
            counts[chunk] = counts.get(chunk, 0) + 1
    chars = sorted({c for chunk in counts for c in chunk})
    n_merges = vocab_size - N_SPECIAL - len(chars)
    if n_merges < 0:
        raise SystemExit("train_tiny: --vocab %d is too small: %d special + %d characters"
                         % (vocab_size, N_SPECIAL, len(chars)))
    words = [[tuple(c.encode() for c in chunk), n] for chunk, n in counts.items()]
    merged, known = [], set(c.encode() for c in chars)
    while len(merged) < n_merges:
        pairs = {}
        for toks, n in words:
            for a, b in zip(toks, toks[1:], strict=False):
                pairs[(a, b)] = pairs.get((a, b), 0) + n
        if not pairs:
            break  # every chunk is one token: the vocabulary is smaller than asked
        a, b = min(pairs, key=lambda p: (-pairs[p], p))
        for w in words:
            toks, out, i = w[0], [], 0
            while i < len(toks):
                if i + 1 < len(toks) and toks[i] == a and toks[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(toks[i])
                    i += 1
            w[0] = tuple(out)
        if a + b not in known:
            known.add(a + b)
            merged.append(a + b)
    vocab = SPECIAL + merged + [c.encode() for c in chars]
    scores = [0.0] * N_SPECIAL + [-float(k) for k in range(len(merged) + len(chars))]
    tok = Tokenizer(vocab, scores)
    tok.n_merges = len(merged)
    return tok


def check_encoder(tok, texts):
    # the fast encoder against the whole-text llama2.c algorithm; raises on a difference
    for t in texts:
        fast, ref = tok.encode(t), tok.encode_reference(t)
        if fast != ref:
            raise AssertionError("encoders disagree on %r: %s vs %s" % (t, fast, ref))
        if tok.decode(ref) != t:
            raise AssertionError("decode(encode(%r)) = %r" % (t, tok.decode(ref)))


# --- the model (torch is imported only here) --------------------------------------------

def build_model(torch, cfg):
    # a llama-architecture transformer: RMSNorm, RoPE (consecutive pairs), GQA, SwiGLU, tied
    nn = torch.nn
    F = torch.nn.functional
    dim, hidden, n_layers = cfg["dim"], cfg["hidden_dim"], cfg["n_layers"]
    n_heads, n_kv = cfg["n_heads"], cfg["n_kv_heads"]
    hs = dim // n_heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

    def rope(x, cos, sin):
        # x (B, T, H, hs): rotate (x[2i], x[2i+1]) by pos * 10000^(-2i/hs)
        xr, xi = x[..., 0::2], x[..., 1::2]
        return torch.stack((xr * cos - xi * sin, xr * sin + xi * cos), dim=-1).flatten(-2)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()
            self.wq = nn.Linear(dim, n_heads * hs, bias=False)
            self.wk = nn.Linear(dim, n_kv * hs, bias=False)
            self.wv = nn.Linear(dim, n_kv * hs, bias=False)
            self.wo = nn.Linear(n_heads * hs, dim, bias=False)
            self.w1 = nn.Linear(dim, hidden, bias=False)
            self.w2 = nn.Linear(hidden, dim, bias=False)
            self.w3 = nn.Linear(dim, hidden, bias=False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            h = self.attention_norm(x)
            q = rope(self.wq(h).view(B, T, n_heads, hs), cos, sin)
            k = rope(self.wk(h).view(B, T, n_kv, hs), cos, sin)
            v = self.wv(h).view(B, T, n_kv, hs)
            k = k.repeat_interleave(n_heads // n_kv, dim=2)  # query head j reads KV head j // group
            v = v.repeat_interleave(n_heads // n_kv, dim=2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            x = x + self.wo(a.transpose(1, 2).reshape(B, T, dim))
            h = self.ffn_norm(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(cfg["vocab_size"], dim)
            self.layers = nn.ModuleList(Block() for _ in range(n_layers))
            self.norm = RMSNorm()
            freqs = 1.0 / (10000.0 ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
            ang = torch.outer(torch.arange(cfg["seq_len"], dtype=torch.float64), freqs)
            self.register_buffer("cos", ang.cos().float(), persistent=False)  # (seq_len, hs/2)
            self.register_buffer("sin", ang.sin().float(), persistent=False)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx):
            T = idx.shape[1]
            cos, sin = self.cos[:T, None, :], self.sin[:T, None, :]
            x = self.tok_embeddings(idx)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return self.norm(x) @ self.tok_embeddings.weight.t()  # tied classifier

    return Transformer()


def export(model, cfg, path):
    # llama2.c legacy fp32 .bin: 7 int32 header (vocab positive: shared classifier), then
    # token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis
    import numpy as np

    L = model.layers
    tensors = [model.tok_embeddings.weight]
    for name in ("attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3"):
        tensors += [getattr(layer, name).weight for layer in L]
    tensors += [model.norm.weight, model.cos, model.sin]
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", cfg["dim"], cfg["hidden_dim"], cfg["n_layers"], cfg["n_heads"],
                            cfg["n_kv_heads"], cfg["vocab_size"], cfg["seq_len"]))
        for t in tensors:
            f.write(t.detach().cpu().numpy().astype("<f4").tobytes())  # (out, in) row-major
    return sum(int(np.prod(t.shape)) for t in tensors[:-2])


def _batches(torch, data, n, batch, seq_len, gen):
    # n batches of random windows (x, y) of the token stream `data`, from generator `gen`
    for _ in range(n):
        ix = torch.randint(len(data) - seq_len - 1, (batch,), generator=gen)
        w = torch.stack([data[i:i + seq_len + 1] for i in ix.tolist()])
        yield w[:, :-1], w[:, 1:]


def evaluate(torch, model, data, args, seed):
    # mean cross-entropy (nats/token) over args.eval_batches fixed windows of `data`
    F = torch.nn.functional
    gen = torch.Generator().manual_seed(seed)
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in _batches(torch, data, args.eval_batches, args.batch, args.seq_len, gen):
            total += F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    model.train()
    return total / args.eval_batches


def greedy(torch, model, tok, prompt, max_tokens):
    # greedy continuation ids of prompt, stopping at BOS (as run.c does) or max_tokens
    ids = tok.encode(prompt)
    with torch.no_grad():
        while len(ids) < max_tokens:
            nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
            if nxt == BOS:
                break
            ids.append(nxt)
    return ids


PROMPTS = ["Once upon a time", "Once upon a time, there was a little boy named",
           "Once upon a time, in a quiet village, there lived a shy girl named"]


def main(argv=None):
    ap = argparse.ArgumentParser(description="Train kvrtos's tiny default model (corpus, tokenizer, llama2.c files).",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (model.bin, tokenizer.bin, reference.json, README.md)")
    ap.add_argument("--seed", type=int, default=1, help="seed for the corpus, the init and the batches")
    ap.add_argument("--stories", type=int, default=30000, help="stories generated (5%% held out for validation)")
    ap.add_argument("--vocab", type=int, default=512, help="tokenizer size")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--hidden-dim", type=int, default=172)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    ap.add_argument("--batch", type=int, default=16, help="windows of seq_len tokens per step")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (linear warmup, cosine to lr/10)")
    ap.add_argument("--warmup", type=int, default=50, help="warmup steps")
    ap.add_argument("--eval-batches", type=int, default=8, help="batches per loss measurement")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("train_tiny: PyTorch is not installed: .venv/bin/pip install torch==2.13.0 "
              "(or pip install -e .[train])", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()

    stories = corpus(args.stories, args.seed)
    n_val = max(1, len(stories) // 20)
    train_s, val_s = stories[:-n_val], stories[-n_val:]
    tok = train_tokenizer(train_s, args.vocab)
    check_encoder(tok, stories[:50] + ['"Odd" text: \u00e9\u00e8 {x}.'])
    vocab_size = len(tok.vocab)
    train_ids = [i for s in train_s for i in tok.encode(s)]
    val_ids = [i for s in val_s for i in tok.encode(s)]
    train_data, val_data = torch.tensor(train_ids), torch.tensor(val_ids)
    sent_train = {x for s in train_s for x in split_sentences(s)[0]}
    sent_val = {x for s in val_s for x in split_sentences(s)[0]}
    t_data = time.time() - t0
    print("corpus: %d stories, %d distinct sentences, %d train + %d val tokens, vocab %d (%.1f s)"
          % (len(stories), len(sent_train | sent_val), len(train_ids), len(val_ids), vocab_size, t_data))

    cfg = {"dim": args.dim, "hidden_dim": args.hidden_dim, "n_layers": args.layers, "n_heads": args.heads,
           "n_kv_heads": args.kv_heads, "vocab_size": vocab_size, "seq_len": args.seq_len}
    model = build_model(torch, cfg)
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    F = torch.nn.functional
    history = []
    t1 = time.time()
    for step, (x, y) in enumerate(_batches(torch, train_data, args.steps, args.batch, args.seq_len, gen)):
        if step < args.warmup:
            lr = args.lr * (step + 1) / args.warmup
        else:
            frac = (step - args.warmup) / max(1, args.steps - args.warmup)
            lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            history.append((step, round(loss.item(), 4)))
            print("step %d/%d loss %.4f lr %.2e (%.0f s)" % (step, args.steps, loss.item(), lr, time.time() - t1),
                  flush=True)
    t_train = time.time() - t1

    train_loss = evaluate(torch, model, train_data, args, args.seed + 1)
    val_loss = evaluate(torch, model, val_data, args, args.seed + 2)
    print("train loss %.4f  val loss %.4f (nats/token)" % (train_loss, val_loss))

    model_path = os.path.join(args.out, "model.bin")
    tok_path = os.path.join(args.out, "tokenizer.bin")
    n_params = export(model, cfg, model_path)
    tok.write(tok_path)

    # what the numpy test replays: the ids and torch's logits of one validation window
    ref_ids = val_ids[:args.seq_len]
    with torch.no_grad():
        logits = model(torch.tensor([ref_ids]))[0]
    positions = sorted({0, 1, 7, len(ref_ids) // 3, len(ref_ids) - 1})
    samples = []
    for prompt in PROMPTS:
        ids = greedy(torch, model, tok, prompt, args.seq_len)
        text = tok.decode(ids)
        samples.append({"prompt": prompt, "ids": ids, "text": text, "problems": check_story(text)})
        print("greedy %r -> %r %s" % (prompt, text, samples[-1]["problems"][:3] or "(a story of the grammar)"))
    covering, n = [], 0
    for story_text in val_s:
        if n >= len(ref_ids):
            break
        covering.append(story_text)
        n += len(tok.encode(story_text))
    ref = {"config": cfg, "seed": args.seed, "ids": ref_ids, "texts": covering,
           "logits": {str(p): [round(float(v), 6) for v in logits[p]] for p in positions},
           "greedy": samples}
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    wall = time.time() - t0

    stats = {"params": n_params, "train_tokens": len(train_ids), "val_tokens": len(val_ids),
             "stories_train": len(train_s), "stories_val": len(val_s),
             "sentences_distinct": len(sent_train | sent_val), "sentences_val": len(sent_val),
             "sentences_val_unseen": len(sent_val - sent_train), "chars": len(tok.vocab) - N_SPECIAL - tok.n_merges,
             "merges": tok.n_merges, "train_loss": train_loss, "val_loss": val_loss, "history": history,
             "wall_s": wall, "train_s": t_train, "data_s": t_data, "torch": torch.__version__,
             "machine": _machine(), "argv": argv if argv is not None else sys.argv[1:]}
    write_card(args, cfg, stats, samples)
    print("wrote %s (%d params, %d B), %s (%d B) in %.0f s"
          % (model_path, n_params, os.path.getsize(model_path), tok_path, os.path.getsize(tok_path), wall))
    return 0


def write_card(args, cfg, st, samples):
    # README.md: the model card, every figure from this run
    out = args.out
    hs = cfg["dim"] // cfg["n_heads"]
    tokens_seen = args.steps * args.batch * args.seq_len
    eval_tokens = args.eval_batches * args.batch * args.seq_len
    argv = st["argv"]
    with open(os.path.join(out, "reference.json")) as f:
        ref = json.load(f)
    rows = "\n".join("| `%s` | %d | %s |" % (n, os.path.getsize(os.path.join(out, n)), sha256(os.path.join(out, n)))
                     for n in ("model.bin", "tokenizer.bin", "reference.json"))
    hist = ", ".join("%d: %.3f" % (a, b) for a, b in st["history"])
    sample_md = "\n\n".join("Prompt `%s`:\n\n> %s\n\n(grammar check: %s)" % (
        s["prompt"], s["text"], "; ".join(s["problems"][:3]) or "a whole story of the grammar") for s in samples)
    card = f"""# kvrtos-tiny: the embedded default model

A {st["params"]:,}-parameter llama-architecture model and its tokenizer, trained by
`tools/train_tiny.py` on stories that script generates from a small grammar, so that a
fresh clone of kvrtos has a model to decode (stories260K is downloaded separately). Its
greedy output is whole stories of that grammar.

| file | bytes | sha256 |
| --- | --- | --- |
{rows}

`model.bin` is llama2.c's legacy fp32 checkpoint, `tokenizer.bin` llama2.c's tokenizer;
`reference.json` holds what the tests replay: one validation window of token ids (and the
stories it comes from), torch's logits at positions {", ".join(sorted(ref["logits"], key=int))} of it,
and torch's greedy tokens from {len(samples)} prompts.

## Architecture

| field | value |
| --- | --- |
| dim | {cfg["dim"]} |
| hidden_dim | {cfg["hidden_dim"]} (SiLU-gated FFN: w2(silu(w1 x) * w3 x)) |
| n_layers | {cfg["n_layers"]} |
| n_heads / n_kv_heads | {cfg["n_heads"]} / {cfg["n_kv_heads"]} (GQA: query head h reads KV head h // {cfg["n_heads"] // cfg["n_kv_heads"]}), head size {hs} |
| vocab_size | {cfg["vocab_size"]} (positive in the header: classifier shared with the embedding) |
| seq_len | {cfg["seq_len"]} |
| norm | RMSNorm, eps 1e-5, before attention, before the FFN and at the end |
| RoPE | llama2.c convention: pairs (x[2i], x[2i+1]) of each head turned by pos * 10000^(-2i/{hs}) |
| parameters | {st["params"]:,} (fp32: {4 * st["params"]:,} B, plus {2 * cfg["seq_len"] * hs // 2:,} freq_cis floats) |

Layout after the 7 x int32 header (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
vocab_size, seq_len), all fp32, matrices (out, in) row-major: token_embedding
({cfg["vocab_size"]}, {cfg["dim"]}), rms_att ({cfg["n_layers"]}, {cfg["dim"]}), wq ({cfg["n_layers"]}, {cfg["dim"]}, {cfg["dim"]}),
wk and wv ({cfg["n_layers"]}, {cfg["n_kv_heads"] * hs}, {cfg["dim"]}), wo ({cfg["n_layers"]}, {cfg["dim"]}, {cfg["dim"]}), rms_ffn ({cfg["n_layers"]}, {cfg["dim"]}),
w1 and w3 ({cfg["n_layers"]}, {cfg["hidden_dim"]}, {cfg["dim"]}), w2 ({cfg["n_layers"]}, {cfg["dim"]}, {cfg["hidden_dim"]}), rms_final ({cfg["dim"]}), then
freq_cis cos and sin ({cfg["seq_len"]}, {hs // 2}) each (real values; run.c skips them), no wcls.
hidden_dim {cfg["hidden_dim"]} is not a multiple of 64, as in stories260K.

## Corpus

Generated, not downloaded: `corpus()` in `tools/train_tiny.py` draws {args.stories:,} stories
with `random.Random({args.seed})` from a grammar of {len(PLAN)} sections (intro, likes, trip,
find, feel, problem, help, ending), each with 3-4 sentence templates whose slots take words from
fixed lists (20 names with their gender, 7 companions, 8 places, 10 things, 8 colours, 7
animals, ...). A story binds its hero, companion, place, thing and animal once, so later
sentences must agree with earlier ones; help comes only after a problem. Example:

> {ref["texts"][0]}

- {st["stories_train"]:,} training stories, {st["train_tokens"]:,} tokens; {st["stories_val"]:,} validation stories (the last 5 %),
  {st["val_tokens"]:,} tokens (each story is BOS + its encoding, concatenated).
- {st["sentences_distinct"]:,} distinct sentences; {st["sentences_val_unseen"]:,} of the {st["sentences_val"]:,} distinct
  validation sentences never occur in training.

`check_story()` in the same script is the judge: every sentence must match a template of
its section, sections come in the plan's order and counts, and the bound words stay the same.

## Tokenizer

Byte-fallback BPE trained by the script on the training stories: ids 0 `<unk>`, 1 `<s>`,
2 `</s>` (written `\\n<s>\\n`, `\\n</s>\\n` as llama2.c's export does), 3..258 the byte tokens
`<0x00>`..`<0xFF>`, then {st["merges"]} merged tokens (score -k for the k-th merge), then the
{st["chars"]} single characters of the corpus. Merges never cross a word or punctuation
boundary (a token holds a space only at its start). The training ids come from the script's
own implementation of llama2.c's encode (BOS, dummy " ", per-character lookup with byte
fallback, best-score adjacent merges, leftmost on ties); the script checks its fast
chunked encoder against the whole-text algorithm on 50 stories, and the tests re-derive
the reference ids from `tokenizer.bin` alone.

## Training

PyTorch {st["torch"]} on the CPU, {args.threads} thread, `nice -n 19`, on {st["machine"]} (shared
with other work). {args.steps} AdamW steps (betas 0.9/0.95, weight decay 0.1 on matrices, gradient
clip 1.0) of {args.batch} random windows x {args.seq_len} tokens = {tokens_seen:,} tokens
({tokens_seen / st["train_tokens"]:.1f} epochs); learning rate {args.lr:g} after {args.warmup} linear warmup steps,
cosine to {args.lr / 10:g}. Init normal(0, 0.02), wo and w2 scaled by 1/sqrt(2 n_layers). Seed {args.seed}.
Wall time {st["wall_s"]:.0f} s in all ({st["data_s"]:.0f} s corpus and tokenizer, {st["train_s"]:.0f} s training).

Training loss (batch, every 100 steps): {hist}.

| loss (nats/token) | value |
| --- | --- |
| train | {st["train_loss"]:.4f} |
| validation | {st["val_loss"]:.4f} |

Each is the mean cross-entropy of the final model over {args.eval_batches} seeded batches of
{args.batch} x {args.seq_len} windows ({eval_tokens:,} tokens) of that split, measured by the training
run itself (`evaluate()`; the command below prints it as `train loss ... val loss ...`).

## Greedy samples

run.c-style greedy decoding (argmax, stop at BOS) of `model.bin`; the tests replay these
token for token with an independent numpy forward pass.

{sample_md}

## Reproduce

```
.venv/bin/pip install torch==2.13.0     # or: .venv/bin/pip install -e .[train]
nice -n 19 .venv/bin/python tools/train_tiny.py {" ".join(argv)}
```

Seeded and single-threaded: on this machine a rerun writes byte-identical `model.bin`,
`tokenizer.bin` and `reference.json` (the tests check this on a tiny configuration); only
the wall time in this card changes. `tests/test_tiny_model.py` checks the files, the
hashes above, the numpy forward pass against torch's logits (1e-4) and the greedy stories
against the grammar.
"""
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(card)


def _machine():
    # one line naming this machine's CPU and core count
    name = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%s, %d cores" % (name, os.cpu_count() or 0)


def sha256(path):
    # hex sha256 of a file
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


if __name__ == "__main__":
    sys.exit(main())
