# What a KV setting costs in quality (issue 9): for each prompt, greedy-decode with the
# fp32 full cache until the context is filled (prompt included; BOS does not stop it),
# then replay exactly those tokens (teacher forcing) through each setting and compare,
# at every position, its next-token distribution with the fp32 full cache's:
# KL(full || setting) in nats and top-1 agreement, averaged over positions, then over
# prompts; plus the KV bytes the setting holds after the last token (int4, KIVI: with
# the sequence's full-precision residual, which it holds at any length).
#
# Every setting is the firmware's own code: firmware_py.model.Model (numpy backend) over
# a kv.KVCache on a pool.Pool, opened with the policy and budget, so eviction,
# quantization and RoPE are what a board runs. Only the comparison is host code, in
# float64 (softmax, KL, argmax).
import time

import numpy as np

from firmware_py import kv, pool
from firmware_py.model import Model

DTYPES = ("fp32", "int8", "int4", "int4tok")  # KV element types measured (int4: KIVI; int4tok: per token)
EVICTING = ("window", "sinks", "h2o")  # policies measured at each budget
SHIPPED_ROPE = "absolute"  # the firmware's default: its keys carry no suffix
ROPE_SUFFIX = {"absolute": "", "cache": "_ropecache"}  # key suffix per Model(rope=...)


class Setting:
    # one KV configuration: dtype, policy, budget (tokens; 0 = the whole context), rope
    def __init__(self, dtype, policy, budget=0, rope=SHIPPED_ROPE):
        self.dtype = dtype  # "fp32" / "int8" / "int4" / "int4tok"
        self.policy = policy  # "full" / "window" / "sinks" / "h2o"
        self.budget = budget  # cached tokens the policy keeps; 0 under full
        self.rope = rope  # "absolute" or "cache"

    # the figure-name stem: fp32_full, int8_window128, int4_h2o256_ropecache
    @property
    def name(self):
        return "%s_%s%s%s" % (self.dtype, self.policy, self.budget or "", ROPE_SUFFIX[self.rope])


# budgets measured for a context of n positions: 25 % and 50 % (128, 256 for 512)
def budgets(context):
    return (context // 4, context // 2)


# every setting of the table for a context: per dtype, full, then each evicting policy
# at each budget under the shipped RoPE, then the same under the other one
def settings(context):
    out = []
    for rope in ("absolute", "cache"):
        for dt in DTYPES:
            if rope == SHIPPED_ROPE:
                out.append(Setting(dt, "full"))
            for pol in EVICTING:
                for b in budgets(context):
                    out.append(Setting(dt, pol, b, rope))
    return out


# fp32 window and sinks settings holding the KV bytes int8 holds at each budget and at
# the whole context (tokens x 480 / 1280 for stories260K: 48, 96, 192 of 512): the same
# memory spent on a shorter fp32 cache instead of a longer int8 one
def equal_bytes(cfg, context):
    per = {dt: kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, dt).kv_bytes_per_token for dt in ("fp32", "int8")}
    out = []
    for b in budgets(context) + (context,):
        eq = b * per["int8"] // per["fp32"]
        for pol in ("window", "sinks"):
            if eq > kv.min_budget(pol) and eq not in budgets(context):
                out.append(Setting("fp32", pol, eq))
    return out


class Runner:
    # one booted cache + Model for a setting, reused for every prompt (a sequence per prompt)
    def __init__(self, weights, setting, context):
        cfg = weights.cfg
        lay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, setting.dtype)
        cap = setting.budget or context
        t = lay.tokens_per_block
        n_blocks = (cap + t - 1) // t
        self.setting = setting  # Setting
        self.layout = lay  # kv.Layout of the rows
        self.cap = cap  # budget given to open()
        self.pool = pool.Pool(lay.block_bytes, n_blocks)  # the KV arena
        self.region = self.pool.add_region(n_blocks)  # the sequence's quota: every block
        self.cache = kv.KVCache(self.pool, lay, max_seqs=1, h2o=setting.policy == "h2o")
        self.model = Model(weights, self.cache, "numpy", setting.rope)
        self.kv_bytes = 0  # bytes of K/V held after the last replay (cached x kv_bytes_per_token + the residual)

    # feed tokens (teacher forcing) on a fresh sequence; (n, vocab) float32 logits, row p
    # the next-token logits after tokens[p]; with greedy, the tokens are extended by
    # argmax until there are `greedy` of them (the reference decode)
    def replay(self, tokens, greedy=0):
        c, m = self.cache, self.model
        h = c.open(self.region, self.setting.policy, self.cap)
        if h < 0:
            raise RuntimeError("%s: open refused (%d)" % (self.setting.name, h))
        n = greedy or len(tokens)
        tokens = list(tokens)
        out = np.empty((n, m.cfg.vocab_size), np.float32)
        try:
            for pos in range(n):
                for _ in m.forward(h, tokens[pos], pos):
                    pass
                if m.status < 0:
                    raise RuntimeError("%s: the cache refused position %d (status %d)" % (self.setting.name, pos, m.status))
                out[pos] = m.logits
                if pos + 1 == len(tokens) and pos + 1 < n:
                    tokens.append(int(np.argmax(out[pos])))  # lowest id on ties, as the sampler
            self.kv_bytes = c.cached(h) * self.layout.kv_bytes_per_token + self.layout.residual_bytes
        finally:
            c.close(h)
        return tokens, out


# log-softmax of logits rows in float64
def log_softmax(logits):
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


# KL(p || q) per row in nats, from log-probabilities, as sum p (e^d - 1 - d) with
# d = log q - log p: the same value as sum p (log p - log q) (the extra sum q - sum p
# is 0), but every term is >= 0, so small divergences do not vanish in cancellation
def kl_rows(logp, logq):
    d = logq - logp
    return (np.exp(logp) * (np.expm1(d) - d)).sum(axis=1)


# (mean KL(ref || other) in nats, top-1 agreement) over the rows of two logit arrays
def compare(ref_logits, logits):
    kl = kl_rows(log_softmax(ref_logits), log_softmax(logits))
    top1 = np.argmax(ref_logits, axis=1) == np.argmax(logits, axis=1)
    return float(kl.mean()), float(top1.mean())


# the whole measurement: weights (llama2c.Weights), prompt token lists, a context of
# n positions (<= seq_len); returns {"references": [...token lists], "settings": {name:
# {"kl", "top1", "kv_bytes", "setting"}}, "wall_s"}; `only` limits the settings (tests)
def measure(weights, prompt_ids, context=0, only=None, log=None):
    cfg = weights.cfg
    context = context or cfg.seq_len
    if not 0 < context <= cfg.seq_len:
        raise ValueError("context must be 1..%d, got %d" % (cfg.seq_len, context))
    for ids in prompt_ids:
        if not 0 < len(ids) <= context:
            raise ValueError("a prompt is %d tokens; the context is %d" % (len(ids), context))
    t0 = time.perf_counter()
    ref = Runner(weights, Setting("fp32", "full"), context)
    refs = [ref.replay(ids, greedy=context) for ids in prompt_ids]  # [(tokens, logits)] per prompt
    todo = settings(context) + equal_bytes(cfg, context) if only is None else only
    out = {}
    for s in todo:
        t1 = time.perf_counter()
        r = Runner(weights, s, context)
        kls, top1s = [], []
        for tokens, ref_logits in refs:
            _, logits = r.replay(tokens)
            kl, top1 = compare(ref_logits, logits)
            kls.append(kl)
            top1s.append(top1)
        out[s.name] = {"kl": sum(kls) / len(kls), "top1": sum(top1s) / len(top1s), "kv_bytes": r.kv_bytes,
                       "kl_per_prompt": kls, "setting": s}
        if log is not None:
            log("%-26s KL %.3g  top1 %.3f  (%.1f s)" % (s.name, out[s.name]["kl"], out[s.name]["top1"],
                                                       time.perf_counter() - t1))
    return {"references": [t for t, _ in refs], "settings": out, "wall_s": time.perf_counter() - t0,
            "context": context}
