# `./kv bench quality [--model PATH --tokenizer PATH] [--prompt TEXT ...] [--json]`:
# what each KV setting costs in quality (issue 9). Per prompt, the fp32 full cache
# greedy-decodes until the model's whole context is filled; each setting (fp32, int8,
# int4 (KIVI), int4tok (per token) x full, window, sinks, h2o at 25 % and 50 % of the
# context, both RoPE modes for
# the evicting policies) replays exactly those tokens through the firmware's own
# KVCache and Model (numpy backend), and its next-token distribution is compared at
# every position with the reference's: mean KL(full || setting) in nats and top-1
# agreement, averaged over positions, then prompts; plus the KV bytes held at the end.
# The measurement is host/quality.py; this module names the figures and renders them.
import json
import os
import sys

from firmware_py import kv, llama2c, tokenizer
from host import generate, paths, quality
from host.bench import emit
from host.errors import UserError

PROMPTS = ("Once upon a time", "Lily and Tom", "The little dog", "One day, a boy named Tim", "Sara wanted to")
COMMAND = "./kv bench quality"
TINY = os.path.join(paths.MODELS, "kvrtos-tiny")


# (model path, tokenizer path, what the output calls it): the user's, else stories260K from
# ../shared/models, else the committed kvrtos-tiny
def resolve(model="", tok=""):
    if model:
        mp, tp = generate.resolve(model, tok)
        return mp, tp, _shown(mp)
    shared = paths.shared_models()
    if shared and os.path.isfile(os.path.join(shared, "stories260K.bin")):
        mp, tp = generate.resolve("stories260K", tok)
        return mp, tp, "stories260K (../shared/models, the default)"
    mp, tp = generate.resolve("", tok)
    return mp, tp, "kvrtos-tiny (models/kvrtos-tiny, the default: stories260K is not in ../shared/models)"


# a path as the JSON records it: relative to the repository when inside or beside it
def _shown(p):
    rel = os.path.relpath(p, paths.ROOT)
    return rel if not rel.startswith("../../") else p


# the flat figures: kl_/top1_/kv_bytes_<setting> plus what was measured and how
def figures(result, model_desc, mp, tp, prompts, prompt_lens, cfg, command):
    f = {"model": model_desc, "model_path": _shown(mp), "tokenizer_path": _shown(tp), "prompts": list(prompts),
         "prompt_tokens": prompt_lens, "context": result["context"], "budgets": list(quality.budgets(result["context"])),
         "rope_shipped": quality.SHIPPED_ROPE, "rope_other_suffix": quality.ROPE_SUFFIX["cache"],
         "command": command, "measure_wall_s": round(result["wall_s"], 1), "backend": "numpy",
         "positions_per_prompt": result["context"]}
    for dt in quality.DTYPES:
        lay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, dt)
        f["kv_bytes_per_token_" + dt] = lay.kv_bytes_per_token
        if lay.residual_bytes:
            f["kv_bytes_residual_" + dt] = lay.residual_bytes  # per sequence, held at any length
    for name, r in result["settings"].items():
        f["kl_" + name] = r["kl"]
        f["top1_" + name] = r["top1"]
        f["kv_bytes_" + name] = r["kv_bytes"]
    return f


# ./kv bench quality: measure, print the table (or one JSON object); returns the figures
def run(as_json=False, model="", tokenizer_path="", prompts=None, context=0, only=None):
    if prompts is not None and any(not isinstance(p, str) or not p.strip() for p in prompts):
        raise UserError("--prompt needs a text to continue, got an empty one", 2)
    mp, tp, desc = resolve(model, tokenizer_path)
    try:
        w = llama2c.load(mp)
        tok = tokenizer.load(tp, w.cfg.vocab_size)
    except (OSError, llama2c.CheckpointError, tokenizer.TokenizerError) as e:
        raise UserError(str(e), 2) from None
    prompts = list(prompts or PROMPTS)
    ctx = context or w.cfg.seq_len
    ids = [tok.encode(p, True, False) for p in prompts]
    for p, i in zip(prompts, ids, strict=True):
        if len(i) > ctx:
            raise UserError("the prompt %r is %d tokens, longer than the context (%d)" % (p, len(i), ctx), 2)
    args = ""
    if model:
        args += " --model %s" % model
    if tokenizer_path:
        args += " --tokenizer %s" % tokenizer_path
    if prompts != list(PROMPTS):
        args += "".join(" --prompt %s" % json.dumps(p) for p in prompts)
    command = COMMAND + args + (" --json" if as_json else "")
    log = (lambda s: sys.stderr.write("bench quality: %s\n" % s)) if not as_json else None
    if log:
        n = len(only or quality.settings(ctx) + quality.equal_bytes(w.cfg, ctx))
        log("model %s, %d prompt%s, context %d, %d settings" % (desc, len(prompts), "" if len(prompts) == 1 else "s", ctx, n))
    result = quality.measure(w, ids, ctx, only, log)
    f = figures(result, desc, mp, tp, prompts, [len(i) for i in ids], w.cfg, command)
    return emit(f, as_json, render)


# --- the benchmark's section of docs/benchmarks.md (host/benchdoc.py calls these) ------
TITLE = "KV settings: quality against the fp32 full cache"


# "0", "1.2e-05", "0.0832": KL in nats with 3 significant digits
def _kl(v):
    return "0" if v == 0 else "%.3g" % v


# markdown lines of the table from the figures f (one row per dtype/policy/budget)
def render(f):
    ctx = f["context"]
    suf = f["rope_other_suffix"]
    L = ["Model: %s; %d prompt%s (%s), each greedy-decoded by the fp32 full cache to the whole context of %d "
         "positions (prompt included), then replayed token for token through each setting (the firmware's "
         "`KVCache` + `Model`, numpy backend). KL = mean over positions, then prompts, of KL(fp32 full || "
         "setting) in nats (softmax in float64); top-1 = fraction of positions whose argmax agrees; KV bytes = "
         "cached tokens x bytes per token after the last position%s. int4 is KIVI (keys per channel over a "
         "block of tokens, the current block's keys in full precision, values per token), int4tok the per-token "
         "layout (one scale per token and group for K and V). Columns `absolute` are the RoPE mode the "
         "firmware ships (keys `kl_<dtype>_<policy><budget>`); `cache` is StreamingLLM's rotation by rank "
         "(keys with `%s`). Measured in %s s on this machine; the guide is docs/kv-quality.md."
         % (f["model"], len(f["prompts"]), "" if len(f["prompts"]) == 1 else "s", ", ".join("\"%s\"" % p for p in f["prompts"]), ctx,
            " (int4: plus the sequence's residual, %s B)" % "{:,}".format(f["kv_bytes_residual_int4"])
            if "kv_bytes_residual_int4" in f else "", suf, f["measure_wall_s"]),
         "",
         "| KV dtype | policy | budget | KV bytes | KL (absolute) | top-1 (absolute) | KL (cache) | top-1 (cache) |",
         "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for dt in quality.DTYPES:
        for pol in ("full",) + quality.EVICTING:
            for b in ((0,) if pol == "full" else quality.budgets(ctx)):
                stem = "%s_%s%s" % (dt, pol, b or "")
                if "kl_" + stem not in f:
                    continue
                other = ("| %s | %.3f" % (_kl(f["kl_" + stem + suf]), f["top1_" + stem + suf])
                         if "kl_" + stem + suf in f else "| - | -")
                L.append("| %s | %s | %s | {:,} | %s | %.3f %s |".format(f["kv_bytes_" + stem])
                         % (dt, pol, b or ctx, _kl(f["kl_" + stem]), f["top1_" + stem], other))
    return L + [""] + _equal_bytes(f)


# the same KV bytes spent two ways: int8 at a budget against fp32 at the budget
# int8's bytes buy (absolute RoPE); rows only where both were measured
def _equal_bytes(f):
    per8, per32 = f["kv_bytes_per_token_int8"], f["kv_bytes_per_token_fp32"]
    rows = []
    for b in tuple(f["budgets"]) + (f["context"],):
        eq = b * per8 // per32
        for pol in ("window", "sinks"):
            a = "int8_%s%d" % (pol, b) if b != f["context"] else "int8_full"
            o = "fp32_%s%d" % (pol, eq)
            if "kl_" + a in f and "kl_" + o in f:
                rows.append("| {:,} | `{}` | {} | {:.3f} | `{}` | {} | {:.3f} |".format(
                    f["kv_bytes_" + a], a, _kl(f["kl_" + a]), f["top1_" + a], o, _kl(f["kl_" + o]), f["top1_" + o]))
    if not rows:
        return []
    return ["The same KV bytes spent two ways: int8 over a longer cache, or fp32 over the shorter one those bytes "
            "buy (%d B against %d B per token; RoPE absolute)." % (per8, per32), "",
            "| KV bytes | int8 setting | KL | top-1 | fp32 setting | KL | top-1 |",
            "| --- | --- | --- | --- | --- | --- | --- |"] + rows
