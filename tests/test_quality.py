# The KV quality measurement itself (host/quality.py, ./kv bench quality), pinned on the
# project's own committed model (models/kvrtos-tiny) at short contexts: the reference
# is the fp32 full cache's own greedy decode, a setting's KL against itself is 0, fp32
# full replayed is exactly the reference, a cache that never evicts equals full, every
# figure the issue names is in the JSON, KL is never negative and agrees with the
# textbook formula, and a setting that really evicts moves the distribution.
import json
import os
import subprocess

import numpy as np
import pytest

from firmware_py import kv, llama2c, tokenizer
from host import paths, quality
from host.bench import quality as bench

TINY = os.path.join(paths.ROOT, "models", "kvrtos-tiny")
CTX = 48  # positions per prompt in these tests (the CLI test uses the model's 256)
PROMPTS = ("Once upon a time", "Lily and Tom")
S = quality.Setting

_cache = {}


def tiny():
    # (weights, prompt id lists) of kvrtos-tiny, loaded once
    if not _cache:
        w = llama2c.load(os.path.join(TINY, "model.bin"))
        tok = tokenizer.load(os.path.join(TINY, "tokenizer.bin"), w.cfg.vocab_size)
        _cache["w"] = w
        _cache["ids"] = [tok.encode(p, True, False) for p in PROMPTS]
    return _cache["w"], _cache["ids"]


def per_token(w, dtype):
    # KV bytes per cached token of w's shape in dtype
    c = w.cfg
    return kv.Layout(c.n_layers, c.n_kv_heads, c.head_dim, dtype).kv_bytes_per_token


def residual(w, dtype):
    # KV bytes a sequence holds at any length (int4, KIVI: its residual; else 0)
    c = w.cfg
    return kv.Layout(c.n_layers, c.n_kv_heads, c.head_dim, dtype).residual_bytes


def test_reference_is_the_fp32_full_greedy_decode_filling_the_context():
    w, ids = tiny()
    r = quality.Runner(w, S("fp32", "full"), CTX)
    tokens, logits = r.replay(ids[0], greedy=CTX)
    assert len(tokens) == CTX and tokens[:len(ids[0])] == ids[0]
    # every token after the prompt is the argmax of the logits at the position before it
    assert [int(np.argmax(logits[p])) for p in range(len(ids[0]) - 1, CTX - 1)] == tokens[len(ids[0]):]
    assert r.kv_bytes == CTX * r.layout.kv_bytes_per_token


def test_kl_of_a_setting_against_itself_is_zero():
    w, ids = tiny()
    tokens, _ = quality.Runner(w, S("fp32", "full"), CTX).replay(ids[0], greedy=CTX)
    s = S("int4", "h2o", CTX // 4, "cache")
    r = quality.Runner(w, s, CTX)
    _, a = r.replay(tokens)
    _, b = r.replay(tokens)  # the same Runner reused (as across prompts)
    _, c = quality.Runner(w, s, CTX).replay(tokens)  # and a fresh one
    assert quality.compare(a, a) == (0.0, 1.0)
    assert quality.compare(a, b) == (0.0, 1.0)
    assert quality.compare(a, c) == (0.0, 1.0)


def test_fp32_full_against_the_reference_is_exactly_zero():
    w, ids = tiny()
    r = quality.measure(w, ids, CTX, [S("fp32", "full")])["settings"]["fp32_full"]
    assert r["kl"] == 0.0 and r["top1"] == 1.0
    assert r["kl_per_prompt"] == [0.0] * len(PROMPTS)


@pytest.mark.parametrize("rope", ["absolute", "cache"])
def test_a_cache_at_least_as_long_as_the_context_equals_full(rope):
    w, ids = tiny()
    only = [S("fp32", pol, b, rope) for pol in quality.EVICTING for b in (CTX, CTX + 16)]
    res = quality.measure(w, ids, CTX, only)["settings"]
    for name, r in res.items():
        assert (r["kl"], r["top1"]) == (0.0, 1.0), name
        assert r["kv_bytes"] == CTX * per_token(w, "fp32"), name


def test_a_setting_that_evicts_has_positive_kl():
    w, ids = tiny()
    res = quality.measure(w, ids, CTX, [S("fp32", "window", 8), S("fp32", "sinks", 8, "cache")])["settings"]
    for name, r in res.items():
        assert r["kl"] > 1e-4, name
        assert all(k > 0 for k in r["kl_per_prompt"]), name
        assert r["kv_bytes"] == 8 * per_token(w, "fp32"), name


def test_kl_is_never_negative_and_is_the_textbook_formula():
    w, ids = tiny()
    tokens, ref = quality.Runner(w, S("fp32", "full"), CTX).replay(ids[0], greedy=CTX)
    for s in (S("int8", "full"), S("int4", "window", 8), S("fp32", "h2o", 12)):
        _, lg = quality.Runner(w, s, CTX).replay(tokens)
        lp, lq = quality.log_softmax(ref), quality.log_softmax(lg)
        rows = quality.kl_rows(lp, lq)
        assert (rows >= 0).all(), s.name
        naive = (np.exp(lp) * (lp - lq)).sum(axis=1)  # sum p (log p - log q)
        assert np.allclose(rows, naive, rtol=1e-9, atol=1e-13), s.name
        assert rows.max() > 0, s.name


def test_json_has_every_figure_the_issue_names():
    w, _ = tiny()
    f = bench.run(as_json=False, model=os.path.join(TINY, "model.bin"), prompts=list(PROMPTS), context=CTX)
    for k in ("model", "prompts", "context", "command"):
        assert k in f, k
    assert f["context"] == CTX and f["prompts"] == list(PROMPTS)
    per = {dt: per_token(w, dt) for dt in quality.DTYPES}
    for dt in quality.DTYPES:
        names = [(dt + "_full", CTX)] + [("%s_%s%d%s" % (dt, pol, b, suf), b) for pol in quality.EVICTING
                                         for b in (CTX // 4, CTX // 2) for suf in ("", "_ropecache")]
        for name, held in names:
            assert 0 <= f["kl_" + name] < 50, name
            assert 0 <= f["top1_" + name] <= 1, name
            assert f["kv_bytes_" + name] == held * per[dt] + residual(w, dt), name
    assert f["kl_fp32_full"] == 0.0 and f["top1_fp32_full"] == 1.0
    # the equal-bytes comparison: fp32 windows holding no more than int8's bytes, within one token
    for b, int8_name in ((CTX // 4, "int8_window%d" % (CTX // 4)), (CTX // 2, "int8_window%d" % (CTX // 2)),
                         (CTX, "int8_full")):
        eq = b * per["int8"] // per["fp32"]
        held = f["kv_bytes_" + int8_name]
        assert held - per["fp32"] < f["kv_bytes_fp32_window%d" % eq] <= held, b
    assert "kl_int8_full_ropecache" not in f  # full never evicts: one RoPE mode
    assert f["kl_int4_full"] > f["kl_int8_full"] > 0  # both quantize
    assert f["kl_int4tok_full"] > f["kl_int4_full"]  # KIVI's per-channel keys beat one scale per token
    assert f["kv_bytes_residual_int4"] == residual(w, "int4") > 0 and "kv_bytes_residual_int8" not in f


def test_cli_json_is_one_object_with_the_models_whole_context():
    r = subprocess.run([os.path.join(paths.ROOT, "kv"), "bench", "quality", "--model", os.path.join(TINY, "model.bin"),
                        "--prompt", "Once upon a time", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    f = json.loads(r.stdout)
    assert f["context"] == 256 and f["budgets"] == [64, 128]
    assert f["kl_fp32_full"] == 0.0
    assert f["kv_bytes_fp32_window64"] == 64 * f["kv_bytes_per_token_fp32"]
    assert "--prompt" in f["command"] and f["command"].startswith("./kv bench quality")


def test_cli_bad_input_is_one_line():
    r = subprocess.run([os.path.join(paths.ROOT, "kv"), "bench", "quality", "--model", "/nonexistent/m.bin"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no model file" in r.stderr
    r = subprocess.run([os.path.join(paths.ROOT, "kv"), "bench", "quality", "--model", os.path.join(TINY, "model.bin"),
                        "--prompt", "Once upon a time " * 100], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "longer than the context" in r.stderr


def test_the_guide_quotes_the_committed_table():
    # docs/kv-quality.md holds every table row bench quality renders from docs/bench/quality.json
    with open(os.path.join(paths.ROOT, "docs", "bench", "quality.json")) as fh:
        f = json.load(fh)["figures"]
    with open(os.path.join(paths.ROOT, "docs", "kv-quality.md")) as fh:
        guide = fh.read().splitlines()
    rows = [line for line in bench.render(f) if line.startswith("|")]
    assert len(rows) > 20
    missing = [r for r in rows if r not in guide]
    assert not missing, missing[:3]
