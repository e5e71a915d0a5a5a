# The source documents' device cases, checked: each memory breakdown or threshold that
# the seeds (shared/seeds/*.zh.txt) give for a board that has a profile in boards/ and a
# model the calculator knows (host/models.py), beside what host/budget.py computes for
# the same board and model (its functions, not the command line), the difference and
# why. Then the bytes-per-token slope of the KV cache fitted from telemetry (the
# emulator's run of the firmware's decode on a VirtualClock: host/emulate.py, its
# telemetry.jsonl decoded by host/console.py and fitted by host/trace.kv_fit) for fp32,
# int8 and int4 KV, beside kv.Layout's kv_bytes_per_token.
#   ./kv bench devicecases [--json]; docs: ./kv bench-docs --only devicecases
import tempfile

from firmware_py import decode, kv
from host import budget, emulate, models
from host.bench import emit

DETERMINISTIC = True  # VirtualClock figures: the suite reruns it against docs/bench/devicecases.json (tests/test_bench_fresh.py)

SLOPE_TOKENS = 256  # tokens of each emulated decode (stories260K's context is 512)
SLOPE_DTYPES = ("fp32", "int8", "int4")
SEED_WAR = "edge-llm-kv-cache-memory-war.zh.txt"  # the field report: every case below is from it
MIB = 1 << 20
GIB = 1 << 30


def _b(board, model, **kw):
    # host.budget.compute with the figures this page uses
    r = budget.compute(board, model, **kw)
    keep = ("board", "model", "kv_dtype", "fits", "max_tokens", "decode_tokens", "kv_bytes_per_token", "cache_bytes_per_token",
            "weights_bytes", "activations_bytes", "memory_bytes", "reserved_bytes", "kv_bytes_wanted", "note", "seq_len",
            "n_layers", "n_kv_heads", "head_dim", "n_heads", "kv_formula")
    return {k: r[k] for k in keep if k in r}


def _pct(a, total):
    return round(100.0 * a / total, 1) if total else 0.0


def rk3588():
    # "384 is the RK3588's hard line: 512 MB for the OS, weights 1.2 GB, about 2.3 GB left;
    # after activations and buffers the KV must stay under 1.1 GB, n ~ 384" (section 3.2),
    # with its worked example "n=384: 124.3 MB, n=512: 228.6 MB"
    real = _b("rk3588_4gb", "Llama-3-8B", kv_dtype="fp16", weights_dtype="int4")
    seeds = _b("rk3588_4gb", "Llama-3-8B", kv_dtype="fp16", weights_bytes=1_200_000_000, tokens=384)
    h, d = 32, 128  # the seed's h (query heads) and d
    seed_formula = [round(n * h * d * 2 * 1.15 * (1 + 0.0015 * n) / MIB, 1) for n in (384, 512)]
    return {
        "id": "rk3588", "board": "rk3588_4gb", "model": "Llama-3-8B", "seed": SEED_WAR + " 3.2",
        "claim": "hard KV limit n ~ 384 tokens (KV under 1.1 GB after 512 MB OS + 1.2 GB weights); KV 124.3 MB at n=384, 228.6 MB at n=512",
        "seed_figure": 384,
        "ours": {"int4_weights": real, "seed_weights_1_2GB": seeds},
        "seed_bytes_per_token_implied": int(1.1e9 / 384),
        "seed_formula_mib_at_384_512": seed_formula,
        "ours_kv_mib_at_384": round(384 * seeds["kv_bytes_per_token"] / MIB, 1),
        "ours_figure": seeds["max_tokens"],
        "why": [
            "Llama-3-8B's weights cannot be 1.2 GB: %.2f GiB even at int4 (4.5 bits per weight), more than the board's "
            "4 GiB less the OS's 512 MiB, so nothing fits (the calculator refuses: %s)" % (real["weights_bytes"] / GIB, real["note"]),
            "with the seed's own 1.2 GB of weights the KV has room for %d tokens of fp16 KV (the model's context, 8192, comes "
            "first): 384 is %.0fx too few" % (seeds["max_tokens"], seeds["max_tokens"] / 384.0),
            "the seed's n*h*d*2 is one layer's K (32 query heads): the KV per token is 2 x 32 layers x 8 KV heads (GQA) x 128 "
            "x 2 B = %d B; its '1.1 GB at n=384' implies %d B per token, its worked example %s MiB at n=384/512 uses "
            "%d B per token and its printed 124.3 / 228.6 MB follow from neither" % (
                seeds["kv_bytes_per_token"], int(1.1e9 / 384), seed_formula, h * d * 2),
            "the 'bandwidth decay factor' (1 + 0.0015 n) multiplies a size: bandwidth changes time, not bytes",
        ],
    }


def jetson():
    # "a 7B model on the Jetson Orin Nano with 4-bit quantization: KV 63 % of memory,
    # weights 28 %, activations 9 %" (section 2.1)
    r = _b("jetson_orin_nano_8gb", "Qwen2.5-7B", kv_dtype="fp16", weights_dtype="int4")
    n = r["decode_tokens"]  # the most tokens the model can use (its context), within the KV budget here
    kvb = n * r["kv_bytes_per_token"]
    tot = kvb + r["weights_bytes"] + r["activations_bytes"]
    need_kv = r["weights_bytes"] * 63 // 28  # KV 63 % beside weights 28 %
    q = _b("jetson_orin_nano_8gb", "Qwen2.5-7B", kv_dtype="int4tok", weights_dtype="int4")  # "4-bit" read as the KV's
    qkv = n * q["kv_bytes_per_token"]
    qtot = qkv + q["weights_bytes"] + q["activations_bytes"]
    return {
        "id": "jetson", "board": "jetson_orin_nano_8gb", "model": "Qwen2.5-7B", "seed": SEED_WAR + " 2.1",
        "claim": "KV 63 % / weights 28 % / activations 9 % (a 7B model, 4-bit weights)",
        "seed_figure": [63, 28, 9],
        "ours": r,
        "ours_tokens": n,
        "ours_figure": [_pct(kvb, tot), _pct(r["weights_bytes"], tot), _pct(r["activations_bytes"], tot)],
        "kv_bytes_for_63pct": need_kv,
        "tokens_for_63pct": need_kv // r["kv_bytes_per_token"],
        "why": [
            "at the model's whole context (%d tokens, fp16 KV, GQA) the KV is %.2f GiB beside %.2f GiB of int4 weights: "
            "KV %.1f %%, weights %.1f %%, activations %.2f %%" % (n, kvb / GIB, r["weights_bytes"] / GIB, _pct(kvb, tot),
                                                               _pct(r["weights_bytes"], tot), _pct(r["activations_bytes"], tot)),
            "KV 63 %% beside weights 28 %% needs %.1f GiB of KV (%d tokens): more than the board's 8 GiB altogether, and "
            "%.1fx the model's context" % (need_kv / GIB, need_kv // r["kv_bytes_per_token"],
                                          need_kv / r["kv_bytes_per_token"] / r["seq_len"]),
            "activations of one decoding sequence are a few MiB (%.1f MiB: the run state of one token), not 9 %% of memory" % (
                r["activations_bytes"] / MIB),
            "the model is the project's assumption, not the seed's: the seed says only 'a 7B model', and Qwen2.5-7B is the "
            "catalog's 7B (Llama-3-8B gives the same picture: 128 KiB per token)",
            "the seed's 'even with 4-bit quantization' may mean the KV cache rather than the weights: with int4 KV (and "
            "int4 weights) the whole context's KV is %.2f GiB, KV %.1f %% and weights %.1f %%, still not 63 / 28" % (
                qkv / GIB, _pct(qkv, qtot), _pct(q["weights_bytes"], qtot)),
        ],
    }


def sa8155p():
    # "Qwen-1.5B on the SA8155P: pmap showed the KV at 2.1 GB of 6 GB; optimal n=448;
    # entropy cropping + group int4 KV brought it to 1.3 GB" (the closing case)
    fp16 = _b("sa8155p", "Qwen2.5-1.5B", kv_dtype="fp16", tokens=448)
    int4 = _b("sa8155p", "Qwen2.5-1.5B", kv_dtype="int4tok", tokens=448)
    return {
        "id": "sa8155p", "board": "sa8155p", "model": "Qwen2.5-1.5B", "seed": SEED_WAR + " closing case",
        "claim": "KV 2.1 GB at the start, n=448 'optimal', 1.3 GB with int4 KV",
        "seed_figure": [2.1e9, 448, 1.3e9],
        "ours": {"fp16": fp16, "int4": int4},
        "ours_figure": [fp16["kv_bytes_wanted"], 448, int4["kv_bytes_wanted"]],
        "tokens_for_2_1GB": int(2.1e9 // fp16["kv_bytes_per_token"]),
        "why": [
            "448 tokens of Qwen2.5-1.5B's KV are %.1f MiB in fp16 (2 x 28 layers x 2 KV heads x 128 x 2 B = %d B per token), "
            "%.1f MiB in int4 with its scales: the seed's GB figures are %.0fx and %.0fx too large" % (
                fp16["kv_bytes_wanted"] / MIB, fp16["kv_bytes_per_token"], int4["kv_bytes_wanted"] / MIB,
                2.1e9 / fp16["kv_bytes_wanted"], 1.3e9 / int4["kv_bytes_wanted"]),
            "2.1 GB of fp16 KV would be %d tokens, past the model's 32,768-token context" % int(2.1e9 // fp16["kv_bytes_per_token"]),
            "int4 KV is %.1fx smaller than fp16 (scales included), not the 1.6x of 2.1 -> 1.3 GB" % (
                fp16["kv_bytes_per_token"] / int4["kv_bytes_per_token"]),
            "the memory is not the limit here: %d tokens of fp16 KV fit beside the weights (the calculator's budget)" % fp16["max_tokens"],
            "the model is the project's assumption: the seed says 'Qwen-1.5B', read here as Qwen2.5-1.5B (the catalog's "
            "1.5B Qwen); whichever model was meant, 2.1 GB for 448 tokens is %.1f MiB per token, %dx Qwen2.5-1.5B's" % (
                2.1e9 / 448 / MIB, int(2.1e9 / 448 // fp16["kv_bytes_per_token"])),
        ],
    }


def rpi4b():
    # "Llama-3-8B-Q4_K_M on a Raspberry Pi 4B (4 GB): the framework says 1.8 GB; the KV's
    # anonymous mapping grew from 16 MB at round 1 to 1.1 GB at round 128, exactly n x
    # 8192 bytes" (section 3.1)
    r = _b("rpi4b_4gb", "Llama-3-8B", kv_dtype="fp16", weights_dtype="int4", tokens=128)
    return {
        "id": "rpi4b", "board": "rpi4b_4gb", "model": "Llama-3-8B", "seed": SEED_WAR + " 3.1",
        "claim": "KV region 16 MB at round 1, 1.1 GB at round 128, growth 'exactly n x 8192 bytes'",
        "seed_figure": [16e6, 1.1e9, 8192],
        "ours": r,
        "ours_figure": [r["kv_bytes_per_token"], r["kv_bytes_wanted"], r["kv_bytes_per_token"]],
        "why": [
            "the KV of Llama-3-8B is %d B per token in fp16 (GQA: 8 KV heads of 32): 128 tokens are %.0f MiB, which is the "
            "seed's '16 MB at round 1' (a 128-token prompt, not one token), not its 1.1 GB at round 128" % (
                r["kv_bytes_per_token"], r["kv_bytes_wanted"] / MIB),
            "n x 8192 B is one layer's K for 32 query heads (32 x 128 x 2 B): %dx too little per token; and 1.1 GB over "
            "128 rounds would be %.1f MB per token, %.0fx its own slope" % (r["kv_bytes_per_token"] // 8192, 1.1e9 / 128 / 1e6,
                                                                           1.1e9 / 128 / 8192),
            "Q4_K_M weights of an 8B model are about 4.9 GB (int4 with scales: %.2f GiB here), more than the board's 4 GiB: "
            "the calculator refuses (%s); the seed's run could only page weights from the SD card through mmap" % (
                r["weights_bytes"] / GIB, r["note"]),
        ],
    }


def esp32s3():
    # "TinyLlama with -c 512 on an ESP32-S3: round 513 tripped the watchdog" (lesson 1) and
    # the RTOS heap rule "heap_size = base_heap + max_n * h * d * 2 * 1.2" (lesson 9)
    tiny = _b("esp32s3_n8r8", "TinyLlama-1.1B", kv_dtype="fp16", tokens=512)
    s = _b("esp32s3_n8r8", "stories260K", kv_dtype="fp32", tokens=512)
    m = models.load("stories260K")
    cfg = m.cfg
    lay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, "fp32")
    q8 = decode.uses_q8("auto", False, "fp32")
    blocks = -(-512 // lay.tokens_per_block)
    pool512 = decode.pool_heap(blocks, cfg, lay, 1, False, q8, budget.BOARD_WORD_BYTES)
    seed_kv = int(512 * cfg.n_heads * cfg.head_dim * 2 * 1.2)
    return {
        "id": "esp32s3", "board": "esp32s3_n8r8", "model": "TinyLlama-1.1B / stories260K", "seed": SEED_WAR + " lessons 1 and 9",
        "claim": "TinyLlama at -c 512 ran to round 513 on an ESP32-S3; RTOS heap = base + max_n x h x d x 2 x 1.2",
        "seed_figure": [512, seed_kv],
        "ours": {"tinyllama": tiny, "stories260K": s},
        "ours_figure": [tiny["max_tokens"], pool512],
        "stories260K_heap_512": {"reserve": s["reserved_bytes"], "weights": s["weights_bytes"], "activations": s["activations_bytes"],
                                 "kv_pool": pool512, "kv_bytes": 512 * lay.kv_bytes_per_token,
                                 "total": s["reserved_bytes"] + s["weights_bytes"] + s["activations_bytes"] + pool512},
        "why": [
            "TinyLlama-1.1B cannot run on an ESP32-S3 at all: %.2f GiB of fp16 weights (int4: about 0.6 GiB) against an "
            "8 MiB PSRAM heap (%s)" % (tiny["weights_bytes"] / GIB, tiny["note"]),
            "the heap rule drops the layer count and uses query heads: for stories260K at 512 tokens it gives %d B of KV; "
            "the real KV is %d B (2 x 5 layers x 4 KV heads x 8 x 4 B x 512) and the pool that holds it, block headers and "
            "bookkeeping included, %d B" % (seed_kv, 512 * lay.kv_bytes_per_token, pool512),
            "the x1.2 padding: the pool's overhead over the raw KV is %.1f %% (one 8-byte header per 16-token block and "
            "the block table), measured, not a fixed 20 %%" % (100.0 * (pool512 - 512 * lay.kv_bytes_per_token) / (512 * lay.kv_bytes_per_token)),
        ],
    }


def slopes(tokens=SLOPE_TOKENS, dtypes=SLOPE_DTYPES):
    # the KV bytes-per-token slope fitted from the emulator's telemetry, per KV element type
    out = []
    for d in dtypes:
        with tempfile.TemporaryDirectory() as tmp:
            rep = emulate.run({"kv_dtype": d, "tokens": tokens, "board": "esp32s3_n8r8"}, out_dir=tmp)
        fit = rep["kv_fit"] or {}
        m = rep["model"]
        lay = kv.Layout(m["layers"], m["kv_heads"], m["dim"] // m["heads"], d)
        out.append({"kv_dtype": d, "model": rep["spec"]["model"], "tokens": rep["tokens"], "points": fit.get("points", 0),
                    "fitted_bytes_per_token": fit.get("fitted_bytes_per_token"), "intercept_bytes": fit.get("intercept_bytes"),
                    "layout_kv_bytes_per_token": lay.kv_bytes_per_token, "token_bytes": fit.get("token_bytes"),
                    "block_bytes": lay.block_bytes, "tokens_per_block": lay.tokens_per_block,
                    "block_bytes_per_token": lay.block_bytes / lay.tokens_per_block,
                    "ratio_to_layout": round(fit["fitted_bytes_per_token"] / lay.kv_bytes_per_token, 4) if fit else None})
    return out


def measure():
    return {"cases": [rk3588(), jetson(), sa8155p(), rpi4b(), esp32s3()], "slopes": slopes(),
            "slope_seed": {"claim": "fit a line through the RSS at n = 64, 128, 256, 512; a slope clearly above n x 8192 B "
                                    "means allocator or framework overhead (" + SEED_WAR + " 3.1)", "seed_bytes_per_token": 8192}}


def run(as_json=False):
    # ./kv bench devicecases [--json]: print the figures (one JSON object with --json); returns them
    return emit(measure(), as_json, render)


# --- the benchmark's section of docs/benchmarks.md (host/benchdoc.py calls these) ------
TITLE = "Device cases of the source documents, and the KV bytes-per-token slope from telemetry"


def _fig(v):
    # a figure as the table shows it
    if isinstance(v, list):
        return " / ".join(_fig(x) for x in v)
    if isinstance(v, float) and v >= 1e6:
        return "%.2f GB" % (v / 1e9)
    if isinstance(v, int) and v >= 1 << 20:
        return "%.1f MiB" % (v / MIB)
    if isinstance(v, float):
        return "%g" % v
    return "{:,}".format(v)


def render(r):
    L = [
        "Each case is a figure the source documents (`shared/seeds/%s`, Chinese) give for a board with a profile in "
        "`boards/` and a model of `host/models.py`, beside what `host/budget.py` computes for it (`./kv budget --board B "
        "--model M ...` gives the same numbers), and why they differ." % SEED_WAR,
        "",
        "| case | seed claims | seed figure | computed | why (first reason) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in r["cases"]:
        L.append("| %s (`%s`, %s) | %s | %s | %s | %s |" % (c["id"], c["board"], c["model"], c["claim"], _fig(c["seed_figure"]),
                                                         _fig(c["ours_figure"]), c["why"][0]))
    L.append("")
    for c in r["cases"]:
        L.append("**%s** (%s):" % (c["id"], c["seed"]))
        L.append("")
        for w in c["why"]:
            L.append("- " + w)
        L.append("")
    L += [
        "KV bytes per token fitted from telemetry: the firmware's decode on the emulator (`host.emulate.run`, "
        "esp32s3_n8r8, VirtualClock), its telemetry decoded by the console's decoder and fitted as `./kv trace` does "
        "(`host/trace.kv_fit`: pool blocks x block bytes against tokens cached, least squares), beside `kv.Layout`'s "
        "kv_bytes_per_token (2 x L x H x D x bytes, + scales). The seed's slope for Llama-3-8B, %s B per token, is one "
        "layer's K; the layout's figure for that model is 131,072 B (fp16)." % "{:,}".format(r["slope_seed"]["seed_bytes_per_token"]),
        "",
        "| KV type | model | tokens | fitted B/token | layout B/token | block bytes / 16 tokens | fitted / layout |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in r["slopes"]:
        L.append("| %s | %s | %d | %s | {:,} | %.1f | %s |".format(s["layout_kv_bytes_per_token"]) % (
            s["kv_dtype"], s["model"], s["tokens"], s["fitted_bytes_per_token"], s["block_bytes_per_token"], s["ratio_to_layout"]))
    L += [
        "",
        "The fit sees whole pool blocks: memory is taken 16 tokens at a time, so the points are a staircase whose slope "
        "is the block's bytes per token (the layout's bytes plus an 8-byte header per block; int4 (KIVI) also keeps each "
        "block's per-channel key parameters), slightly under it over a short run (the last block is part-filled). The "
        "emulator runs the same firmware modules as the board, so this is the slope a board's telemetry shows "
        "(`./kv monitor --jsonl` then `./kv trace`).",
    ]
    return L
