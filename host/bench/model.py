# `./kv bench model [--json]`: decoding stories260K, one run. The integer forward pass
# (firmware_py/qmodel.QForward: viper kernels, int8 weights converted to q8row, int8 KV,
# full policy) on the MicroPython unix port with the default board's heap, through
# host/bench/_model_mp.py: time to first token (the 5-token prompt "Once upon a time"
# prefilled, then the first token), decode tokens/s over 200 greedy tokens (argmax by
# a viper kernel included), heap bytes allocated per token (gc off, gc.mem_alloc
# before and after), the same decode heap-locked, the bytes one forward() generator
# object costs, and the peak heap (live bytes after loading and decoding). CPython's
# figures come from the numpy backend (firmware_py/model.py) when it is there.
import contextlib
import io
import json
import os
import tempfile
import time

from host import boards, convert, interp, paths
from host.errors import UserError

PROMPT_IDS = (1, 403, 407, 261, 378)  # BOS + "Once upon a time" in tok512.bin
DECODE = 200  # tokens decoded after the prompt
C_RUNC_TOK_S = (5000, 9000)  # llama2.c run.c on these machines (docs/anchors.md)


def _model():
    d = paths.shared_models()
    p = d and os.path.join(d, "stories260K.bin")
    if not p or not os.path.exists(p):
        raise UserError("stories260K.bin is not in ../shared/models (docs/models.md says where to get it)", 2)
    return p


def micro_figures(q8):
    # the MicroPython run of host/bench/_model_mp.py bench; its JSON
    r = interp.run(os.path.join(paths.ROOT, "host", "bench", "_model_mp.py"), "micropython",
                   args=["bench", q8, str(DECODE)] + [str(i) for i in PROMPT_IDS])
    if r.returncode != 0:
        raise UserError("model bench failed under micropython: %s" % (r.stderr or r.stdout).strip().splitlines()[-1:], 1)
    return json.loads(r.stdout.strip().splitlines()[-1])


def cpython_figures(fp32):
    # numpy backend of firmware_py/model.py (engineer H's) on the fp32 model, or None
    try:
        from firmware_py import kv, llama2c, model, pool
    except ImportError:
        return None
    try:
        w = llama2c.load(fp32)
        cfg = w.cfg
        lay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, "fp32")
        nb = (cfg.seq_len + 15) // 16
        p = pool.Pool(lay.block_bytes, nb)
        c = kv.KVCache(p, lay, max_seqs=1)
        h = c.open(p.add_region(nb), "full", cfg.seq_len)
        m = model.Model(w, c, backend="numpy")
        np = __import__("numpy")
        t0 = time.perf_counter()
        tok = PROMPT_IDS[0]
        for pos in range(len(PROMPT_IDS)):
            for _ in m.forward(h, tok, pos):
                pass
            tok = PROMPT_IDS[pos + 1] if pos + 1 < len(PROMPT_IDS) else int(np.argmax(m.logits))
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(DECODE):
            for _ in m.forward(h, tok, len(PROMPT_IDS) + i):
                pass
            tok = int(np.argmax(m.logits))
        dt = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - the other engineer's backend may be mid-change
        return {"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
    return {"decode_tok_s": round(DECODE / dt, 1), "ttft_ms": round(ttft * 1000, 2)}


def run(as_json=False):
    # every figure in one run; prints one JSON object with as_json
    fp32 = _model()
    with tempfile.TemporaryDirectory() as d:
        q8 = os.path.join(d, "stories260K_q8row.bin")
        with contextlib.redirect_stdout(io.StringIO()):
            convert.convert(fp32, q8, "q8row")
        mp = micro_figures(q8)
    cp = cpython_figures(fp32)
    r = {
        "model": "stories260K, q8row (int8 weights, groups 64/43), int8 KV, full policy, greedy",
        "prompt_tokens": mp["prompt_tokens"],
        "decode_tokens": mp["decode_tokens"],
        "micropython_heap_bytes": boards.load(paths.DEFAULT_BOARD).mpy_heap,
        "decode_tok_s_micropython": mp["decode_tok_s"],
        "ttft_ms_micropython": mp["ttft_ms"],
        "alloc_bytes_per_token_micropython": mp["alloc_bytes_per_token"],
        "heap_locked_tokens_micropython": mp["heap_locked_tokens"],
        "forward_generator_bytes_micropython": mp["forward_generator_bytes"],
        "peak_heap_bytes_micropython": mp["peak_heap_bytes"],
        "weights_bytes_micropython": mp["weights_bytes"],
        "kv_pool_bytes_micropython": mp["kv_pool_bytes"],
        "decode_over_c_runc_low": round(mp["decode_tok_s"] / C_RUNC_TOK_S[1], 3),
        "decode_over_c_runc_high": round(mp["decode_tok_s"] / C_RUNC_TOK_S[0], 3),
    }
    if cp and "error" not in cp:
        r["decode_tok_s_cpython"] = cp["decode_tok_s"]
        r["ttft_ms_cpython"] = cp["ttft_ms"]
    else:
        r["cpython_note"] = "numpy backend not measured: %s" % (cp["error"] if cp else "firmware_py/model.py is absent")
    if as_json:
        print(json.dumps(r, sort_keys=True))
    else:
        for k in sorted(r):
            print("%s: %s" % (k, r[k]))
    return r
