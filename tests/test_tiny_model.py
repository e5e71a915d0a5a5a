# The embedded default model (models/kvrtos-tiny): its files are the llama2.c formats
# they claim to be, the card's hashes are theirs, an independent numpy forward pass of
# model.bin reproduces the logits and greedy tokens torch produced at export, and the
# greedy text is stories the corpus grammar accepts. The training script's grammar and
# tokenizer are plain Python; the training itself is run tiny when torch is installed.
import hashlib
import importlib.util
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

MODEL_DIR = os.path.join(ROOT, "models", "kvrtos-tiny")
SCRIPT = os.path.join(ROOT, "tools", "train_tiny.py")
FILES = ("model.bin", "tokenizer.bin", "reference.json")
BUDGET_BYTES = 1_000_000  # model + tokenizer, the "at most 1 MB"


def _load_script():
    # tools/train_tiny.py as a module (its grammar and tokenizer need no torch)
    spec = importlib.util.spec_from_file_location("train_tiny", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tt = _load_script()


def _path(name, where=None):
    return os.path.join(where or MODEL_DIR, name)


def _reference(where=None):
    with open(_path("reference.json", where)) as f:
        return json.load(f)


# --- an independent reader and forward pass, from the llama2.c format description ------

def read_checkpoint(path):
    # (config dict, weights dict of float64 arrays) of a llama2.c legacy fp32 file; asserts its size
    with open(path, "rb") as f:
        data = f.read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack_from("<7i", data, 0)
    assert vocab > 0, "the tiny model shares its classifier (positive vocab_size)"
    hs = dim // n_heads
    kv_dim = n_kv * hs
    shapes = [("emb", (vocab, dim)), ("rms_att", (n_layers, dim)), ("wq", (n_layers, dim, dim)),
              ("wk", (n_layers, kv_dim, dim)), ("wv", (n_layers, kv_dim, dim)), ("wo", (n_layers, dim, dim)),
              ("rms_ffn", (n_layers, dim)), ("w1", (n_layers, hidden, dim)), ("w2", (n_layers, dim, hidden)),
              ("w3", (n_layers, hidden, dim)), ("rms_final", (dim,)),
              ("freq_cos", (seq_len, hs // 2)), ("freq_sin", (seq_len, hs // 2))]
    floats = np.frombuffer(data, dtype="<f4", offset=28)
    w, off = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        w[name] = floats[off:off + n].reshape(shape).astype(np.float64)
        off += n
    assert off == floats.size, "file holds %d floats, the header implies %d" % (floats.size, off)
    cfg = {"dim": dim, "hidden_dim": hidden, "n_layers": n_layers, "n_heads": n_heads,
           "n_kv_heads": n_kv, "vocab_size": vocab, "seq_len": seq_len}
    return cfg, w


def _rmsnorm(x, g):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g


def _rope(x, pos, hs):
    # x (T, H, hs): pair (2i, 2i+1) of each head turned by pos * 10000^(-2i/hs)
    ang = pos[:, None] * (10000.0 ** (-np.arange(0, hs, 2) / hs))[None, :]  # (T, hs/2)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    re_, im = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = re_ * c - im * s
    out[..., 1::2] = re_ * s + im * c
    return out


def forward(cfg, w, ids):
    # logits (T, vocab) for every position of ids, causal attention, float64, no KV cache
    T, dim, nh, nkv = len(ids), cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"]
    hs = dim // nh
    pos = np.arange(T, dtype=np.float64)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    x = w["emb"][ids]
    for layer in range(cfg["n_layers"]):
        h = _rmsnorm(x, w["rms_att"][layer])
        q = _rope((h @ w["wq"][layer].T).reshape(T, nh, hs), pos, hs)
        k = _rope((h @ w["wk"][layer].T).reshape(T, nkv, hs), pos, hs)
        v = (h @ w["wv"][layer].T).reshape(T, nkv, hs)
        att = np.empty((T, nh, hs))
        for head in range(nh):
            kvh = head // (nh // nkv)  # GQA: consecutive query heads share a KV head
            s = q[:, head] @ k[:, kvh].T / np.sqrt(hs) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            att[:, head] = (p / p.sum(-1, keepdims=True)) @ v[:, kvh]
        x = x + att.reshape(T, dim) @ w["wo"][layer].T
        h = _rmsnorm(x, w["rms_ffn"][layer])
        a, b = h @ w["w1"][layer].T, h @ w["w3"][layer].T
        x = x + (a / (1 + np.exp(-a)) * b) @ w["w2"][layer].T
    return _rmsnorm(x, w["rms_final"]) @ w["emb"].T


def read_tokenizer(path, vocab_size):
    # (max_token_length, [bytes], [score]) of a tokenizer.bin holding vocab_size tokens
    with open(path, "rb") as f:
        data = f.read()
    (max_len,) = struct.unpack_from("<I", data, 0)
    toks, scores, off = [], [], 4
    for _ in range(vocab_size):
        s, n = struct.unpack_from("<fi", data, off)
        toks.append(data[off + 8:off + 8 + n])
        scores.append(s)
        off += 8 + n
    assert off == len(data), "tokenizer.bin has %d bytes after its %d tokens" % (len(data) - off, vocab_size)
    return max_len, toks, scores


def encode(toks, scores, text):
    # llama2.c encode: BOS, dummy " ", per-character lookup with byte fallback, best-score merges
    ids = {t: i for i, t in enumerate(toks)}
    out = [ids[b" "]] if text else []
    for ch in text:
        b = ch.encode("utf-8")
        out += [ids[b]] if b in ids else [x + 3 for x in b]
    while True:
        best, at = None, -1
        for i in range(len(out) - 1):
            j = ids.get(toks[out[i]] + toks[out[i + 1]])
            if j is not None and (best is None or scores[j] > scores[best]):
                best, at = j, i
        if best is None:
            return [1] + out
        out[at:at + 2] = [best]


def decode(toks, ids):
    # run.c's decoding: BOS skipped, the space after it dropped, <0xXX> as that byte
    out, prev = b"", 1
    for i in ids:
        if i != 1:
            t = toks[i]
            m = re.fullmatch(rb"<0x([0-9A-F]{2})>", t)
            t = bytes([int(m.group(1), 16)]) if m else t
            out += t[1:] if prev == 1 and t.startswith(b" ") else t
        prev = i
    return out.decode("utf-8", "replace")


def greedy_agrees(cfg, w, ids, n_prompt):
    # whether ids[n_prompt:] is the greedy continuation of ids[:n_prompt] that stops at BOS
    # (or at seq_len) as run.c's loop does. The model is causal, so one forward pass over
    # ids gives the logits each greedy step would have seen; (position, expected, argmax)
    # of the first disagreement, or None
    logits = forward(cfg, w, ids)
    want = list(ids[n_prompt:]) + ([1] if len(ids) < cfg["seq_len"] else [])
    for pos, nxt in zip(range(n_prompt - 1, len(ids)), want, strict=False):
        got = int(np.argmax(logits[pos]))
        if got != nxt:
            return pos, nxt, got
    return None


@pytest.fixture(scope="module")
def model():
    return read_checkpoint(_path("model.bin"))


@pytest.fixture(scope="module")
def tokenizer(model):
    return read_tokenizer(_path("tokenizer.bin"), model[0]["vocab_size"])


# --- the committed files ---------------------------------------------------------------

def test_model_and_tokenizer_fit_one_megabyte():
    sizes = {n: os.path.getsize(_path(n)) for n in FILES}
    assert sizes["model.bin"] + sizes["tokenizer.bin"] <= BUDGET_BYTES, sizes


def test_header_is_a_small_gqa_llama_with_shared_classifier(model):
    cfg, w = model
    assert cfg == _reference()["config"]
    assert cfg["n_heads"] % cfg["n_kv_heads"] == 0 and cfg["n_kv_heads"] < cfg["n_heads"]  # GQA exercised
    assert 256 + 3 <= cfg["vocab_size"] <= 512
    assert cfg["hidden_dim"] % 64 != 0  # like stories260K's 172: int8 groups must handle a tail
    assert cfg["seq_len"] >= 128


def test_freq_cis_holds_the_real_rope_table(model):
    cfg, w = model
    hs = cfg["dim"] // cfg["n_heads"]
    ang = np.arange(cfg["seq_len"])[:, None] * (10000.0 ** (-np.arange(0, hs, 2) / hs))[None, :]
    assert np.abs(w["freq_cos"] - np.cos(ang)).max() < 1e-6
    assert np.abs(w["freq_sin"] - np.sin(ang)).max() < 1e-6


def test_card_gives_each_file_its_sha256():
    with open(_path("README.md")) as f:
        card = f.read()
    for name in FILES:
        with open(_path(name), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        m = re.search(r"`%s`[^\n]*?\b([0-9a-f]{64})\b" % re.escape(name), card)
        assert m, "the card has no sha256 line for %s" % name
        assert m.group(1) == digest, "%s: card says %s, file is %s" % (name, m.group(1), digest)


def test_tokenizer_is_llama2c_layout(model, tokenizer):
    max_len, toks, scores = tokenizer
    assert toks[:3] == [b"<unk>", b"\n<s>\n", b"\n</s>\n"]
    assert toks[3:259] == [b"<0x%02X>" % i for i in range(256)]
    assert max_len == max(len(t) for t in toks)
    assert len(set(toks)) == len(toks)
    assert b" " in toks  # llama2.c's dummy prefix must be a token
    merged = scores[259:]
    assert merged == sorted(merged, reverse=True) and len(set(merged)) == len(merged)  # one merge order
    for t in toks[259:]:
        assert b" " not in t[1:], "a token may hold a space only at its start: %r" % t


def test_tokenizer_reproduces_the_training_segmentation(tokenizer):
    # the ids the model was trained on came from the script's encoder; llama2.c's
    # algorithm, written here from the format alone, must give the same ids
    _max_len, toks, scores = tokenizer
    ref = _reference()
    ids = [i for text in ref["texts"] for i in encode(toks, scores, text)]
    assert ids[:len(ref["ids"])] == ref["ids"]
    assert [decode(toks, encode(toks, scores, t)) for t in ref["texts"]] == ref["texts"]
    odd = "Zoe said, \u00e9!"  # not in the corpus: the e-acute goes by byte fallback
    e = encode(toks, scores, odd)
    assert 0xC3 + 3 in e and 0xA9 + 3 in e and decode(toks, e) == odd


def test_numpy_logits_match_torch_at_export(model):
    cfg, w = model
    ref = _reference()
    logits = forward(cfg, w, ref["ids"])
    assert len(ref["logits"]) >= 4
    for pos, want in ref["logits"].items():
        diff = np.abs(logits[int(pos)] - np.array(want)).max()
        assert diff < 1e-4, "position %s: numpy and torch logits differ by %.2e" % (pos, diff)


def test_greedy_text_is_stories_of_the_grammar(model, tokenizer):
    # numpy greedy from each prompt gives torch's tokens, then BOS, and the text is a whole story the
    # grammar accepts: every sentence a template of its section, sections in the plan's
    # order and counts, one hero (name, gender), companion, place and thing throughout
    cfg, w = model
    _max_len, toks, scores = tokenizer
    samples = _reference()["greedy"]
    assert len(samples) >= 3
    for s in samples:
        prompt_ids = encode(toks, scores, s["prompt"])
        assert s["ids"][:len(prompt_ids)] == prompt_ids
        ids = s["ids"]
        assert greedy_agrees(cfg, w, ids, len(prompt_ids)) is None, "numpy greedy leaves torch's path"
        text = decode(toks, ids)
        assert text.startswith(s["prompt"]) and text == s["text"]
        assert len(ids) < cfg["seq_len"], "no end of story within the context: %r" % text
        sentences, tail = tt.split_sentences(text)
        assert len(sentences) >= 5 and not tail, text
        assert tt.check_story(text) == [], text


# --- the grammar judge can fail --------------------------------------------------------

def test_grammar_accepts_its_corpus_and_rejects_broken_stories():
    stories = tt.corpus(300, seed=7)
    assert all(tt.check_story(s) == [] for s in stories)
    s = stories[0]
    name = re.search(r"named (\w+)\.", s).group(1)
    other = next(n for n in tt.GIRLS + tt.BOYS if n != name and (n in tt.GIRLS) == (name in tt.GIRLS))
    sentences, _ = tt.split_sentences(s)
    girl = next(g for g in stories if re.search(r"named (%s)\." % "|".join(tt.GIRLS), g)
                and re.search(r"\b(she|She|her)\b", g))
    broken = {
        "name changes": s.replace(name, other, 1),
        "gender flips": re.sub(r"\b(she|She|her)\b", lambda m: {"she": "he", "She": "He", "her": "his"}[m.group(1)],
                               girl),
        "sections swapped": " ".join([sentences[1], sentences[0]] + sentences[2:]),
        "unknown word": s.replace(" went ", " flew "),
        "cut short": s[:-5],
        "repeated sentence": " ".join(sentences[:2] + sentences[1:]),
        "no intro": " ".join(sentences[1:]),
        "back without loss": "Once upon a time, there was a kind girl named Mia. She loved to dance. "
                             "One day, she went to the park. At the park, she saw a red ball. "
                             "Mia was very happy. Together, they got the ball back.",
    }
    for why, text in broken.items():
        assert text not in (s, girl) and tt.check_story(text), "the judge accepted a story with: %s" % why


# --- the training script -----------------------------------------------------------------

def test_train_script_help_runs_without_torch():
    r = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--out" in r.stdout and "--seed" in r.stdout, r.stderr


def test_train_script_without_torch_says_so_in_one_line(tmp_path):
    hide_torch = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
                  "runpy.run_path(sys.argv[0], run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", hide_torch, SCRIPT, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "torch==2.13.0" in r.stderr, r.stderr


TINY = ["--dim", "16", "--hidden-dim", "40", "--layers", "1", "--heads", "4", "--kv-heads", "2",
        "--seq-len", "32", "--vocab", "330", "--stories", "300", "--steps", "4", "--batch", "2",
        "--warmup", "2", "--eval-batches", "1", "--seed", "3"]


def test_tiny_training_run_exports_a_file_numpy_agrees_with(tmp_path):
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("torch is not installed (optional extra: pip install -e .[train]); training not run")
    outs = []
    for run in ("a", "b"):
        out = tmp_path / run
        r = subprocess.run([sys.executable, SCRIPT, "--out", str(out)] + TINY,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        outs.append(out)
    cfg, w = read_checkpoint(str(outs[0] / "model.bin"))
    assert (cfg["dim"], cfg["n_layers"], cfg["n_kv_heads"], cfg["seq_len"]) == (16, 1, 2, 32)
    ref = _reference(str(outs[0]))
    logits = forward(cfg, w, ref["ids"])
    for pos, want in ref["logits"].items():
        assert np.abs(logits[int(pos)] - np.array(want)).max() < 1e-4, pos
    _m, toks, _s = read_tokenizer(str(outs[0] / "tokenizer.bin"), cfg["vocab_size"])
    for s in ref["greedy"]:
        assert greedy_agrees(cfg, w, s["ids"], len(encode(toks, _s, s["prompt"]))) is None, s["prompt"]
    for name in FILES:  # seeded, one thread: a second run is the same bytes
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    card = (outs[0] / "README.md").read_text()
    assert "val loss" in card.lower() and tt.sha256(str(outs[0] / "model.bin")) in card
