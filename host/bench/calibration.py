# `./kv bench calibration [--json]`: the emulator's prediction beside each published
# decode figure (docs/calibration.md, generated from docs/bench/calibration.json by
# `./kv bench-docs --only calibration`). Each stories260K case runs the firmware's own
# decode (decode.Session, numpy math) on a VirtualClock with the board's memory cost
# (decode.traffic_for: weights and KV on their tiers) and CPU cost (cpucost.for_session,
# the published implementation's kind) charged, as the emulator does; stories15M int4
# (which the firmware cannot load) is predicted from its config with cpucost.for_config
# plus the tier cost model (bandwidth.DecodeTraffic.token_us). Per-operation figures come
# from the profiles (their sources: boards/*.json, docs/calibration.md); no case is fitted
# to its tok/s. Then the same machinery predicts kvrtos's own MicroPython decode (viper
# with int8 weights, bytecode with fp32) on every board with cost figures.
import json
import os
import tempfile

from firmware_py import bandwidth as bwm
from firmware_py import cpucost, decode, llama2c
from firmware_py import kv as kvm
from firmware_py.clock import VirtualClock
from firmware_py import board as fboard
from host import boards, boardspeed, paths
from host import emulate as emu
from host.bench import budget as budget_bench
from host.bench import emit

DETERMINISTIC = True  # VirtualClock figures: the suite reruns it against docs/bench/calibration.json (tests/test_bench_fresh.py)

STEPS = 256  # esp32-llm main.c: steps = 256 from BOS (the published tok/s is over such a run)
GOAL = 0.25  # the goal: within +-25 %

# (id, published tok/s, source, board, kind, weights tier, KV tier, note)
CASES = (
    ("esp32-llm", 19.13, "DaveBben/esp32-llm README: 19.13 tok/s, ESP32-S3FH4R2 (2 MB quad PSRAM at 80 MHz, sdkconfig "
     "CONFIG_SPIRAM_MODE_QUAD), both cores, ESP-DSP dot products (on their ae32 path: the weights are not 16-byte "
     "aligned)", "esp32s3_n4r2", "dsp", "psram", "psram"),
    ("esp32-tiny-llm-s3", 22.0, "Circuit-Digest ESP32-Tiny-LLM README: 22 tok/s on an ESP32-S3 DevKit with octal PSRAM "
     "at 80 MHz (taken as esp32-llm's code: ESP-DSP, both cores)", "esp32s3_n8r8", "dsp", "psram", "psram"),
    ("esp32-llm-fork", 32.83, "eric-humane/esp32-llm README: 32.83 tok/s, PSRAM 80 MHz, ESP-DSP with 16-byte aligned "
     "buffers, assembly float division, fast exp, one core (no task or semaphore in its source). Its README names an "
     "ESP32-S3FH4R2 (quad), its sdkconfig CONFIG_SPIRAM_MODE_OCT and 64 B data-cache lines: modelled as the sdkconfig "
     "says (what was built), the octal profile, with 64 B lines in the line read model", "esp32s3_n8r8", "asm", "psram",
     "psram"),
    ("esp32-cam", 11.0, "Circuit-Digest ESP32-Tiny-LLM README: 11 tok/s on an ESP32-CAM (quad PSRAM at 40 MHz)",
     "esp32cam_ai_thinker", "dsp", "psram", "psram"),
    ("esp32-flash", 2.32, "Circuit-Digest ESP32-Tiny-LLM README: 2.32 tok/s on a plain ESP32 reading weights from flash",
     "esp32_wroom32", "dsp", "flash", "sram"),
    ("pico-llama", 19.0, "Pico LLaMA: 19 tok/s on an RP2350 at 150 MHz with 8 MB PSRAM, KV and run state static in SRAM",
     "rp2350_pico_plus2", "c", "psram", "sram"),
)
# stories15M (published shape; not in the shared models): int4, group 32, from flash
S15 = ("stories15m-int4-flash", 1.4, "stories15M int4 (group 32) from memory-mapped flash on an ESP32-S3 N16R8: about 1.4 tok/s "
       "(issue 12's figure)", "esp32s3_n16r8", "dsp", "flash", "psram")
# the data-cache line a case's build uses, where it is not the profile's 32 B (the line read model only)
LINE_BYTES = {"esp32-llm-fork": 64}  # eric-humane/esp32-llm sdkconfig: CONFIG_ESP32S3_DATA_CACHE_LINE_64B
# cases whose KV sits in SRAM: the positions it is sized for (the firmware's decode runs STEPS positions)
KV_SRAM_POSITIONS = 256  # 512 positions of stories260K's KV need 640 KiB, more than the chips' 520 KB SRAM
OWN_BOARDS = ("esp32s3_n8r8", "esp32s3_n4r2", "esp32s3_n16r8", "esp32cam_ai_thinker", "esp32_wroom32", "rp2350_pico2",
              "rp2350_pico_plus2")


def _tiers(brd, w_tier, kv_tier):
    names = [t.name for t in brd.tiers]
    return (w_tier if w_tier in names else names[0]), (kv_tier if kv_tier in names else names[0])


def spec_for(model, board_name, kind, w_tier, kv_tier, steps=STEPS):
    # the ./kv emulate spec that reproduces a case: the published C decoder's kind, its
    # weights and KV tiers, a C firmware's heap (no MicroPython reserve: --reserve 0) and,
    # with the KV in SRAM, a fixed pool of the blocks that fit the tier (at most the
    # KV_SRAM_POSITIONS the decoders size it for); steps positions from BOS
    brd = boards.load(board_name)
    wt, kt = _tiers(brd, w_tier, kv_tier)
    # a C decoder: fp32 weights and KV as published (not ./kv emulate's int8 default for the
    # MicroPython firmware), one forward step without a slice bound
    spec = {"board": board_name, "cost": kind, "weights": "fp32", "kv_dtype": "fp32", "slice_us": 0,
            "weights_tier": wt, "kv_tier": kt, "reserve": 0}
    n = steps
    if brd.tier(kt).kind == "sram":
        cfg = llama2c.plan(model)[0]
        lay = kvm.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, "fp32")
        t = lay.tokens_per_block
        spec["kv_blocks"] = min(KV_SRAM_POSITIONS // t, brd.tier(kt).bytes // lay.block_bytes)
        n = min(n, spec["kv_blocks"] * t)
    spec["tokens"] = n - 1  # after BOS
    return spec


def command(spec):
    # the ./kv emulate command line of a spec (stories260K is the default model)
    order = ("board", "cost", "weights", "kv_dtype", "slice_us", "weights_tier", "kv_tier", "kv_blocks", "reserve", "tokens")
    return "./kv emulate " + " ".join("--%s %s" % (k.replace("_", "-"), spec[k]) for k in order if k in spec)


def emulate(model, tok, board_name, kind, w_tier, kv_tier, steps=STEPS):
    # the case through host.emulate.run (./kv emulate's wiring, placement and report): µs per token
    spec = spec_for(model, board_name, kind, w_tier, kv_tier, steps)
    rep = emu.run(dict(spec, model=model, tokenizer=tok))
    us = rep["decode_ms"] * 1000 / rep["tokens"]
    mem = rep["decode_traffic"]["memory_us"]  # us/token figures: mean over every token; tok_s: the report's
    return {"tokens": rep["tokens"], "us_per_token": round(us, 1), "memory_us_per_token": round(mem / rep["tokens"], 1),
            "cpu_us_per_token": round(us - mem / rep["tokens"], 1), "tok_s": rep["tok_s"],
            "weights_tier": rep["placement"]["weights"], "kv_tier": rep["placement"]["kv"], "spec": spec,
            "command": command(spec), "pool_blocks": rep["pool_blocks"], "reserve_bytes": rep["placement"]["reserve_bytes"]}


def predict(board_name, kind, cfg, per_layer, final, row, w_tier, kv_tier, weights_dtype="fp32", steps=STEPS):
    # analytic: the tier cost model's memory µs plus the CPU model's ns, mean over steps tokens from BOS
    brd = boards.load(board_name) if isinstance(board_name, str) else board_name
    bw = bwm.Bandwidth(brd, VirtualClock())
    wt, kt = _tiers(brd, w_tier, kv_tier)
    tr = bwm.DecodeTraffic(bw, per_layer, final, row, bw.tier_id(wt), bw.tier_id(kt))
    m = cpucost.for_config(brd, kind, cfg, weights_dtype)
    mem = cpu = 0
    for n in range(1, steps + 1):
        mem += tr.token_us(cfg.n_layers, n)
        cpu += m.token_ns(n)
    total = mem + cpu / 1000
    return {"us_per_token": round(total / steps, 1), "memory_us_per_token": round(mem / steps, 1),
            "cpu_us_per_token": round(cpu / 1000 / steps, 1), "tok_s": round(1e6 * steps / total, 2),
            "weights_tier": wt, "kv_tier": kt, "figures": m.figures()}


def stories15m():
    # the published stories15M shape, int4 weights with fp32 scales per group of 32
    cfg = llama2c.Config(288, 768, 6, 6, 6, 32000, 256)
    d, h, kv = cfg.dim, cfg.hidden_dim, cfg.kv_dim
    per = d * (2 * d + 2 * kv) + 3 * d * h
    per_layer = per // 2 + 4 * (per // 32) + 2 * 4 * d  # int4 values, fp32 scales, fp32 norms
    cls = cfg.vocab_size * d
    final = 4 * d + cls // 2 + 4 * (cls // 32) + d // 2 + 4 * (d // 32)  # norm, classifier, embedding row
    row = 2 * kv * 4  # fp32 K + V per layer and token
    return cfg, per_layer, final, row


def _profile(board_name):
    with open(os.path.join(paths.ROOT, "boards", board_name + ".json")) as f:
        return json.load(f)


def _line_rate(c, line_bytes=None):
    # the line read model's bytes/s of a tier cost block: one line per miss latency + its bytes at the stream rate
    lb = line_bytes or c["line_bytes"]["value"]
    return int(lb * 1e9 / (c["line_ns"]["value"] + lb * 1e9 / c["line_stream_bytes_per_s"]["value"]))


def variant(board_name, read_model="copy", line_bytes=None, est_scale=1.0):
    # the board with its weights/KV read rate priced by read_model ("copy": the profile's
    # CPU copy-read figure; "line": the cache-line read model) and every CPU figure whose
    # source is an estimate scaled by est_scale
    d = _profile(board_name)
    if read_model == "line":
        for t in d["memory"]:
            c = t.get("cost")
            if c and t["kind"] != "sram":
                c["read_bytes_per_s"]["value"] = _line_rate(c, line_bytes)
    if est_scale != 1.0:
        for figs in d["cpu"]["cost"].values():
            for name, f in figs.items():
                if name not in ("cores", "split_permille") and f["source"].startswith("estimate:"):
                    f["value"] = int(round(f["value"] * est_scale))
    return fboard.Board(d, board_name)


SENS = (("copy read (chosen)", "copy", 1.0), ("line read", "line", 1.0), ("estimates x 0.5", "copy", 0.5),
        ("estimates x 2", "copy", 2.0))


def sensitivity(cid, pub, board, kind, args, dtype, steps):
    # the case's analytic prediction under each read model and with the CPU estimates halved/doubled
    out = {"id": cid}
    for label, rm, sc in SENS:
        p = predict(variant(board, rm, LINE_BYTES.get(cid), sc), kind, *args, weights_dtype=dtype, steps=steps)
        out[label] = {"tok_s": p["tok_s"], "diff_permille": int(round(1000 * (p["tok_s"] - pub) / pub))}
    return out


def _row(cid, pub, src, board, kind, r, extra=None):
    diff = (r["tok_s"] - pub) / pub
    d = {"id": cid, "published_tok_s": pub, "source": src, "board": board, "kind": kind,
         "predicted_tok_s": r["tok_s"], "diff_permille": int(round(1000 * diff)), "within_goal": abs(diff) <= GOAL}
    d.update({k: r[k] for k in ("us_per_token", "memory_us_per_token", "cpu_us_per_token", "weights_tier", "kv_tier")})
    if extra:
        d.update(extra)
    return d


def measure(steps=STEPS):
    out = []
    figures = {}
    sens = []
    kv_notes = []
    with tempfile.TemporaryDirectory() as tmp:
        model, tok, desc = budget_bench.model_path(tmp)
        cfg, lay = llama2c.plan(model)
        per_layer, final = decode.layout_traffic(lay)
        row = 2 * cfg.kv_dim * 4
        for cid, pub, src, board, kind, wt, kt in CASES:
            e = emulate(model, tok, board, kind, wt, kt, steps)
            p = predict(board, kind, cfg, per_layer, final, row, wt, kt, steps=steps)
            out.append(_row(cid, pub, src, board, kind, e, {"analytic_tok_s": p["tok_s"], "how": "emulated decode",
                                                            "tokens": e["tokens"], "command": e["command"],
                                                            "spec": e["spec"]}))
            sens.append(sensitivity(cid, pub, board, kind, (cfg, per_layer, final, row, wt, kt), "fp32", steps))
            if e["kv_tier"] == "sram":
                sram = [t.bytes for t in boards.load(board).tiers if t.name == "sram"][0]
                pos = e["tokens"] + 1
                kv_notes.append({"id": cid, "kv_bytes_512": 512 * row * cfg.n_layers,
                                 "kv_bytes_capped": pos * row * cfg.n_layers, "sram_bytes": sram,
                                 "positions": pos, "pool_blocks": e["pool_blocks"],
                                 "pool_bytes": e["pool_blocks"] * kvm.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim,
                                                                             "fp32").block_bytes})
            figures["%s/%s" % (board, kind)] = p["figures"]
        c15, pl, fi, rw = stories15m()
        cid, pub, src, board, kind, wt, kt = S15
        p = predict(board, kind, c15, pl, fi, rw, wt, kt, "int4", steps=steps)
        out.append(_row(cid, pub, src, board, kind, p, {"analytic_tok_s": p["tok_s"], "tokens": steps,
                                                        "how": "predicted from the config (the firmware cannot load int4)"}))
        sens.append(sensitivity(cid, pub, board, kind, (c15, pl, fi, rw, wt, kt), "int4", steps))
        figures["%s/%s" % (board, kind)] = p["figures"]
        own = []
        for b in OWN_BOARDS:
            brd = boards.load(b)
            w = "psram" if any(t.name == "psram" for t in brd.tiers) else "flash"
            for kind, dt in (("viper", "int8"), ("bytecode", "fp32")):
                if dt == "int8":
                    pl8, fi8 = _int8_traffic(cfg)
                    p = predict(b, kind, cfg, pl8, fi8, row, w, "psram" if w == "psram" else "sram", dt, steps)
                else:
                    p = predict(b, kind, cfg, per_layer, final, row, w, "psram" if w == "psram" else "sram", dt, steps)
                own.append({"board": b, "kind": kind, "weights": dt, "tok_s": p["tok_s"], "us_per_token": p["us_per_token"],
                            "memory_us_per_token": p["memory_us_per_token"], "cpu_us_per_token": p["cpu_us_per_token"],
                            "weights_tier": p["weights_tier"], "kv_tier": p["kv_tier"]})
                figures["%s/%s" % (b, kind)] = p["figures"]
    chosen = _chosen()
    return {"model": desc, "steps": steps, "goal_permille": int(GOAL * 1000), "cases": out, "own_decode": own,
            "chosen": chosen, "sensitivity": sens, "kv_sram": kv_notes,
            "boardspeed": boardspeed_summary(),
            "figures": figures}


def _chosen():
    # every figure that was chosen or follows a rule rather than a measurement of the case's hardware
    # (no figure is fitted to a published tok/s), with the cases that depend on it and the arithmetic
    out = [{"figure": "the weights' and KV's memory read rate: the CPU copy-read rate (read_bytes_per_s)",
            "depends": "every case", "how": "chosen over the cache-line read model (line_ns + line_bytes at "
            "line_stream_bytes_per_s per miss); the sensitivity table gives each case under both"}]
    for b, cases in (("esp32s3_n4r2", "esp32-llm"), ("esp32cam_ai_thinker", "esp32-cam")):
        c = [t for t in _profile(b)["memory"] if t["name"] == "psram"][0]["cost"]
        out.append({"figure": "%s memory[psram].cost.read_bytes_per_s (%.1f MB/s)" % (b, c["read_bytes_per_s"]["value"] / 1e6),
                    "depends": cases, "how": c["read_bytes_per_s"]["source"]})
    bs = boardspeed_summary()
    fx = ", ".join("%s %.1f (band %.1f-%.1f, %d points)" % (e, f["factor"], f["band"][0], f["band"][1], f["points"])
                   for e, f in sorted(bs["fit"].get("xtensa", {}).items()))
    out.append({"figure": "viper and bytecode per-MAC, exp and KV figures of every MicroPython profile",
                "depends": "kvrtos's own decode",
                "how": "the firmware's kernels timed on the host (costprobe.py in ./kv bench boardspeed's run) times the "
                       "board cycles per host ns of the emitter that runs them, fitted to published board timings "
                       "(xtensa: %s; see below)" % fx})
    return out


def boardspeed_summary():
    # the committed board-speed fit (docs/bench/boardspeed.json) as this page shows it
    rec = boardspeed.committed()
    keep = ("id", "url", "where", "chip", "board", "mhz", "mhz_source", "micropython_version", "emitter", "published_us",
            "host_us", "host_build", "ratio", "covers")
    used = [dict({k: p.get(k) for k in keep}, workload=boardspeed.workload(p)) for p in rec["points"] if "host_us" in p]
    left = [{"id": p["id"], "url": p.get("url"), "why": p.get("excluded") or p.get("note") or "not obtainable"}
            for p in rec["points"] if "host_us" not in p]
    probe = {k: rec["probe"][k] for k in ("viper_mac_i8_ns", "bytecode_mac_f32_ns", "exp_ns")}
    return {"fit": rec["fit"], "points": used, "left_out": left, "runs": rec["runs"], "probe": probe}


def _int8_traffic(cfg):
    # stories260K as int8 (q8row, one fp32 scale per group of 32 per row): bytes per layer and final
    d, h, kv = cfg.dim, cfg.hidden_dim, cfg.kv_dim
    per = d * (2 * d + 2 * kv) + 3 * d * h
    cls = cfg.vocab_size * d
    return per + 4 * (per // 32) + 2 * 4 * d, 4 * d + cls + 4 * (cls // 32) + d + 4 * (d // 32)


def boardspeed_tables(b):
    # the board-speed section: the factor per core and emitter, each point with its
    # leave-one-out error, the points left out and why
    L = ["", "## How much slower the board runs MicroPython: a factor per emitter", "",
         "Published timings of MicroPython programs on boards, each re-run here on the 32-bit unix port built from "
         "the MicroPython version it was measured with (`./kv mp32 --ref TAG --repo DIR`; %d runs, median). Ratio = published "
         "time x the board's clock / host time, in board cycles per host ns; the factor of a core family and emitter "
         "is the median of its points, its band the lowest and highest point; leave-one-out predicts each point's "
         "board time from the median of the others. A clock marked *assumed* is the firmware's default at that "
         "version (the source does not state it). Command: `./kv bench boardspeed` (needs a clone of "
         "micropython/micropython: `KVRTOS_MICROPYTHON_REPO`)." % b["runs"], "",
         ]
    L += boardspeed.fit_table(b["fit"])
    L += ["", "What the factors can and cannot say:", ""]
    for fam in sorted(b["fit"]):
        vp = [p for p in b["points"] if p["emitter"] == "viper" and boardspeed.family(p["chip"]) == fam]
        calls = [p for p in vp if p["workload"] == "viper-call"]
        loops = [p for p in vp if p not in calls]
        if calls and loops:
            L.append("- %s viper: %d of its %d points are perf_bench's viper_call* (a native loop calling a viper "
                     "function: call overhead), %d %s a viper loop (%s); kvrtos's viper kernels are loops (matvec_v's "
                     "inner product), so their board time may sit toward the loop point%s rather than the median." % (
                         fam, len(calls), len(vp), len(loops), "is" if len(loops) == 1 else "are",
                         ", ".join("%s at %.1f" % (p["id"], p["ratio"]) for p in loops),
                         "" if len(loops) > 1 else ", the top of the band"))
    clocks = sorted({(p["chip"], p["mhz"]) for p in b["points"] if p["chip"] in ("esp32", "esp32s3")})
    L.append("- Clock: the xtensa points ran at %s; the profiles run their cores at 240 MHz. A ratio in cycles holds "
             "across clocks only where the code runs from cache; the esp32 commit behind most points says only bm_fft, "
             "bm_pidigits and misc_aes scaled with the CPU clock on its firmware, so at 240 MHz the others may take "
             "more cycles than here." % ", ".join("%s %d MHz" % c for c in clocks))
    L.append("- Versions: each point's host time is its own version's; kvrtos's kernels are timed on the build it "
             "runs (`./kv mp32`, v1.29 preview). The factor assumes the board/host ratio does not depend on the "
             "version; esp32 points older than commit 549448e8bb (the VM moved to IRAM) are left out for that reason.")
    L += ["", "The points (board time as published; host time measured here):", "",
          "| point | chip | MHz | MicroPython | emitter | board us | host us | ratio | leave-one-out error |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in b["points"]:
        f = b["fit"].get(boardspeed.family(p["chip"]), {}).get(p["workload"], {})
        e = [x["error"] for x in f.get("loo", []) if x["id"] == p["id"]]
        clk = "%d%s" % (p["mhz"], " (assumed)" if str(p["mhz_source"]).startswith(("assumed", "not stated", "inferred")) else "")
        L.append("| [%s](%s) | %s | %s | %s | %s | {:,} | {:,} | %.1f | %s |".format(int(p["published_us"]), int(p["host_us"]))
                 % (p["id"], p["url"], p["chip"], clk, p["micropython_version"].split(" (")[0], p["emitter"],
                    p["ratio"], "%+.0f %%" % (100 * e[0]) if e else "n/a"))
    L += ["", "Left out of the fit:", ""]
    for p in b["left_out"]:
        L.append("- [%s](%s): %s" % (p["id"], p["url"], " ".join(str(p["why"]).split())[:300]))
    return L


def run(as_json=False):
    # ./kv bench calibration [--json]: the detailed tables (docs/calibration.md's) on stdout
    return emit(measure(), as_json, tables)


TITLE = "Calibration: predicted against published decode figures"
PAGE = "calibration.md"  # docs/calibration.md, written by ./kv bench-docs from the same record (render_page)


def _diff(c):
    return "%+.1f %%%s" % (c["diff_permille"] / 10, "" if c["within_goal"] else " (outside)")


def render(r):
    # the short section of docs/benchmarks.md: published beside predicted, the rest on docs/calibration.md
    L = ["Each published decode figure beside the emulator's prediction for it: model %s, %d tokens from BOS, memory "
         "and CPU cost charged from the board profile, no case fitted to its tok/s; goal: within +-%d %%. How each "
         "case is priced, the sources of the published figures and of every CPU figure, why each difference, and "
         "kvrtos's own decode predicted per board (estimates): [docs/calibration.md](calibration.md)."
         % (r["model"], r["steps"], r["goal_permille"] // 10), "",
         "| case | board | kind | published tok/s | predicted tok/s | difference |",
         "| --- | --- | --- | --- | --- | --- |"]
    for c in r["cases"]:
        L.append("| %s | %s | %s | %.2f | %.2f | %s |" % (c["id"], c["board"], c["kind"], c["published_tok_s"],
                                                          c["predicted_tok_s"], _diff(c)))
    return L


def tables(r):
    # the cases with their memory and CPU split, the sources, the fitted figure, kvrtos's own decode
    ntok = sorted({c["tokens"] for c in r["cases"] if c["how"] == "emulated decode"})
    L = ["Model: %s. What runs: the emulated cases generate %s tokens after BOS (%d positions: esp32-llm's steps = %d; "
         "the tok/s is over those tokens), the analytic figures average KV lengths 1..%d. Emulated: the firmware's "
         "decode on a VirtualClock with the board's memory cost (tier cost model) and CPU cost "
         "(firmware_py/cpucost.py) charged; memory and CPU time add. Goal: within +-%d %%. Command: "
         "`./kv bench calibration`."
         % (r["model"], "/".join(str(n) for n in ntok), r["steps"], r["steps"], r["steps"], r["goal_permille"] // 10), "",
         "| case | board | kind | published tok/s | predicted tok/s | difference | memory us/token | CPU us/token | how |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in r["cases"]:
        L.append("| %s | %s | %s | %.2f | %.2f | %s | {:,} | {:,} | %s |".format(
            int(c["memory_us_per_token"]), int(c["cpu_us_per_token"])) % (
            c["id"], c["board"], c["kind"], c["published_tok_s"], c["predicted_tok_s"], _diff(c), c["how"]))
    L += ["", "Each emulated case is a `./kv emulate` run (host/emulate.py: the same wiring, placement and report); "
          "this command reproduces its predicted tok/s (the C decoders carry no MicroPython reserve: `--reserve 0`; "
          "a KV in SRAM is a fixed pool of the blocks that fit the tier: `--kv-blocks`):", ""]
    for c in r["cases"]:
        if c.get("command"):
            L.append("- %s: `%s`" % (c["id"], c["command"]))
    L += ["", "Sources: " + "; ".join("%s: %s" % (c["id"], c["source"]) for c in r["cases"]) + ".", "",
          "No figure is fitted to a published tok/s. Chosen figures and figures from a rule (and the cases that "
          "depend on them):", ""]
    for f in r["chosen"]:
        L.append("- %s; depends: %s; %s." % (f["figure"], f["depends"], f["how"]))
    L += ["", "Sensitivity (analytic predictions, tok/s and difference): the weights' and KV's read rate by the CPU "
          "copy-read figure (chosen) or by the cache-line read model (%s), and every CPU figure whose source is an "
          "estimate halved or doubled (copy read):" % ", ".join("%s: %d B lines" % (k, v) for k, v in
                                                               sorted(LINE_BYTES.items())), "",
          "| case | " + " | ".join(lbl for lbl, _, _ in SENS) + " |", "| --- |" + " --- |" * len(SENS)]
    for c in r["sensitivity"]:
        L.append("| %s | " % c["id"] + " | ".join("%.2f (%+.1f %%)" % (c[lbl]["tok_s"], c[lbl]["diff_permille"] / 10)
                                                  for lbl, _, _ in SENS) + " |")
    L += boardspeed_tables(r["boardspeed"]) if "boardspeed" in r else []
    bp = r.get("boardspeed", {}).get("probe")
    if bp:
        L += ["", "The profiles' viper/bytecode figures are the probe's figures in the board-speed run (`firmware_py/tools/"
              "costprobe.py` under the 32-bit port, in the same run as the points, so this host's speed cancels) times "
              "each emitter's factor: %.3f ns per int8 MAC (viper matvec_v), %.1f ns per fp32 MAC (bytecode "
              "Plain.matvec), %.1f ns per math.exp, and the rest as the table below says; `./kv boardspeed --write` "
              "rewrites them from that record (a figure measured on a board by `./kv calibrate` is kept)." % (
                  bp["viper_mac_i8_ns"], bp["bytecode_mac_f32_ns"], bp["exp_ns"])]
    for key in ("esp32s3_n8r8/viper", "esp32s3_n8r8/bytecode"):
        figs = r["figures"].get(key)
        if not figs:
            continue
        L += ["", "Every %s figure of esp32s3_n8r8 (cycles at %d MHz; `fit:` a host timing of the firmware's own code "
              "times its emitter's factor, as its source says):" % (key.split("/")[1], figs["mhz"]["value"]), "",
              "| parameter | cycles | source |", "| --- | --- | --- |"]
        for name in sorted(figs):
            if name == "mhz":
                continue
            f = figs[name]
            L.append("| `%s` | %s | %s |" % (name, "{:,.1f}".format(f["value"] / 1000), f["source"].replace("|", "\\|")))
    L += ["",
          "kvrtos's own MicroPython decode (estimates: nobody has published these):", "",
          "| board | kind | weights | tok/s | memory us/token | CPU us/token |", "| --- | --- | --- | --- | --- | --- |"]
    for o in r["own_decode"]:
        L.append("| %s | %s | %s | %.2f | {:,} | {:,} |".format(int(o["memory_us_per_token"]), int(o["cpu_us_per_token"]))
                 % (o["board"], o["kind"], o["weights"], o["tok_s"]))
    return L


def _fig(r, key, name):
    return r["figures"][key][name]["value"]


def _tier(board, name, field):
    return [t for t in _profile(board)["memory"] if t["name"] == name][0]["cost"][field]["value"]


def why_texts(r):
    # why each difference: every figure quoted from the record or the profiles
    cs = {c["id"]: c for c in r["cases"]}
    sn = {c["id"]: c for c in r["sensitivity"]}

    def line(cid):
        return "%+.1f %%" % (sn[cid]["line read"]["diff_permille"] / 10)
    f = cs["esp32-flash"]
    fl = _tier("esp32_wroom32", "flash", "read_bytes_per_s")
    mem_pub = 1e6 / f["published_tok_s"] - f["cpu_us_per_token"]
    implied = fl * f["memory_us_per_token"] / mem_pub
    i8 = _fig(r, "esp32s3_n16r8/dsp", "mac_i8_mcyc") / 1000
    return {
        "esp32-llm": "the quad PSRAM read figure comes from the stated rule (%.1f MB/s), not a measurement; under the "
                     "line read model the case is %s; dot products on ESP-DSP's ae32 path (%.2f cycles/MAC: the "
                     "weights are not 16-byte aligned)" % (_tier("esp32s3_n4r2", "psram", "read_bytes_per_s") / 1e6,
                                                           line("esp32-llm"), _fig(r, "esp32s3_n4r2/dsp",
                                                                                   "mac_f32_mcyc") / 1000),
        "esp32-tiny-llm-s3": "the code it ran is not published; taken as esp32-llm's (ae32 dot products, both cores). "
                             "Memory is the measured octal copy-read rate; under the line read model it is %s"
                             % line("esp32-tiny-llm-s3"),
        "esp32-llm-fork": "one core (%d), so memory time (%s us of %s) sets the figure; the copy-read rate includes "
                          "store instructions a matvec does not issue, and 64 B lines read faster: under the line "
                          "read model it is %s. The two octal S3 results (22 and 32.83 tok/s) differ more than the "
                          "model's CPU difference explains" % (
                              _fig(r, "esp32s3_n8r8/asm", "cores"), "{:,}".format(int(cs["esp32-llm-fork"]["memory_us_per_token"])),
                              "{:,}".format(int(cs["esp32-llm-fork"]["us_per_token"])), line("esp32-llm-fork")),
        "esp32-cam": "the quad-40 MHz read figure comes from the stated rule (%.1f MB/s); the ESP32's PSRAM cache "
                     "workarounds (memw) are not modelled; under the line read model it is %s"
                     % (_tier("esp32cam_ai_thinker", "psram", "read_bytes_per_s") / 1e6, line("esp32-cam")),
        "esp32-flash": "memory-mapped DIO-40 flash reads %.1f MB/s through the cache (the profile's figure); the "
                       "published %.2f tok/s implies about %.1f MB/s, so that firmware most likely reads weights "
                       "through the flash driver or a file system per token, not memory-mapped: not fitted"
                       % (fl / 1e6, f["published_tok_s"], implied / 1e6),
        "pico-llama": "the RP2350's QSPI PSRAM read rate through the XIP cache is an estimate (%.1f MB/s, half the "
                      "bus), and Pico LLaMA may keep part of the weights in flash or SRAM; its RoPE and exp costs are "
                      "estimates" % (_tier("rp2350_pico_plus2", "psram", "read_bytes_per_s") / 1e6),
        "stories15m-int4-flash": "predicted from the config: the int4 dequantizing MAC (%g cycles, estimate) dominates "
                                 "the CPU part, the S3's flash read figure (%.0f MB/s, an estimate) the memory part"
                                 % (i8, _tier("esp32s3_n16r8", "flash", "read_bytes_per_s") / 1e6),
    }


def render_page(r):
    # the whole of docs/calibration.md (benchdoc adds the closing provenance line)
    L = ["# Calibration against published figures", "",
         "Generated by `./kv bench-docs --only calibration` from `docs/bench/calibration.json` "
         "(`./kv bench calibration --json` prints the same figures). Do not edit by hand.", "",
         "How the emulator prices a token: memory time from each tier's cost block (docs/tiers.md) for the weights "
         "and KV bytes the decode moves, plus CPU time from the board's `cpu.cost` block for the kind of kernel "
         "(`firmware_py/cpucost.py`: per-MAC, per-row, per-matvec, per attention position, exp, division, norm, "
         "RoPE, sampling, per-layer and per-token costs, cores and the split share). The two add: an in-order core "
         "(Xtensa LX6/LX7, Cortex-M33) stalls on every PSRAM or flash cache miss. Where that is wrong: a dual-core "
         "decoder overlaps one core's compute with the other's misses. Memory time is most of every C case's token, "
         "so the read rate of the weights is the model's main choice: it is priced at the CPU copy-read rate (a "
         "chosen parameter: copies issue stores a matvec does not, the cache-line model has none), and the "
         "sensitivity table below gives every case under the cache-line read model too.", ""]
    L += tables(r)
    L += ["", "## Rule for unmeasured PSRAM", "",
          "No copy measurement of quad PSRAM exists. A quad tier's copy-read figure is the measured octal figure "
          "(38.6 MB/s, project-x51/esp32-s3-memorycopy) times the ratio of the two tiers' cache-line read rates by the "
          "line model (the octal fit's miss latency, each tier's bus stream rate); the arithmetic is in each figure's "
          "source (Chosen figures above). No decode figure enters it.", ""]
    for k in r["kv_sram"]:
        L.append("KV in SRAM (%s): stories260K's fp32 KV for 512 positions is {:,} bytes, more than the profile's SRAM "
                 "tier ({:,} bytes); as Pico LLaMA caps MAX_SEQ_LEN at 256 for this reason, the case is taken with the "
                 "KV pool the emulator places in the tier: %d blocks ({:,} bytes with their headers, within the tier), %d "
                 "positions ({:,} bytes of K and V); the decode runs %d positions."
                 .format(k["kv_bytes_512"], k["sram_bytes"], k["pool_bytes"], k["kv_bytes_capped"])
                 % (k["id"], k["pool_blocks"], k["positions"], k["positions"]))
    L += ["", "## Why each difference", ""]
    why = why_texts(r)
    for c in r["cases"]:
        L.append("- **%s** (%+.1f %%%s): %s." % (c["id"], c["diff_permille"] / 10,
                                                "" if c["within_goal"] else ", outside the goal", why.get(c["id"], "")))
    L += ["", "## Every CPU figure and its source", "",
          "Each figure is in the profile (`boards/NAME.json`, `cpu.cost.KIND`) with its source; a source starting "
          "`estimate:` is one. Per board and kind used above:", ""]
    for key in sorted(r["figures"]):
        L.append("### %s" % key)
        L.append("")
        L.append("| parameter | value | kind | source |")
        L.append("| --- | --- | --- | --- |")
        for p, f in sorted(r["figures"][key].items()):
            L.append("| %s | {:,} | %s | %s |".format(f["value"]) % (p, f["kind"], f["source"].replace("|", "/")))
        L.append("")
    return L

