# `./kv bench costmodel [--json]`: what the board profiles' cost model (firmware_py/
# bandwidth.py, docs/tiers.md) predicts for C-speed stories260K fp32 decoding from PSRAM
# on the ESP32-S3, beside the published 19.13 and 32.83 tok/s (docs/anchors.md): the
# memory time per token is the weights one token reads (every layer's matrices and norms,
# the classifier, the embedding row) at the PSRAM read rate, plus the K/V rows written
# and read by the attention passes at the KV length. Compute is left out: a C decoder
# that is memory bound runs at most this fast. Then the same figures from the firmware's
# own decode loop (decode.Session with a DecodeTraffic on a VirtualClock, weights and KV
# on the PSRAM tier, no compute charged): the emulated memory time per token must equal
# the prediction, token by token.
import tempfile

from firmware_py import bandwidth as bwm
from firmware_py import decode, llama2c
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel
from host import boards
from host.bench import budget as budget_bench
from host.bench import emit

DETERMINISTIC = True  # VirtualClock figures: the suite reruns it against docs/bench/costmodel.json (tests/test_bench_fresh.py)

BOARDS = ("esp32s3_n8r8", "esp32s3_n4r2")  # octal PSRAM (measured figures), quad PSRAM (estimates)
PUBLISHED = {"esp32-llm (DaveBben), ESP32-S3 with 2 MB PSRAM": 19.13,
             "esp32-llm fork (eric-humane), ESP32-S3FH4R2, PSRAM 80 MHz": 32.83}
SEQ = 512  # tokens decoded (esp32-llm preallocates the KV for all 512 positions)
EMULATED_TOKENS = 512  # tokens the emulated decode makes (1 prompt token + 511 new)


def predict(board_name, cfg, lay, seq=SEQ, kind=bwm.K_READ):
    # the cost model's figures for one board: weights and KV bytes per token, memory µs per
    # token at KV length 1, seq/2 and seq, the mean over seq tokens, and tok/s
    b = boards.load(board_name)
    clk = VirtualClock()
    bw = bwm.Bandwidth(b, clk)
    ps = bw.tier_id("psram")
    per_layer, final = decode.layout_traffic(lay)
    row = 2 * cfg.kv_dim * 4  # fp32 K + V of one token in one layer (llama2.c's run.c layout)
    tr = bwm.DecodeTraffic(bw, per_layer, final, row, ps, ps, kv_kind=kind, w_kind=kind)
    per_token = [tr.token_us(cfg.n_layers, n) for n in range(1, seq + 1)]
    mean_us = sum(per_token) / seq
    w_only = tr.token_us(cfg.n_layers, 0) - cfg.n_layers * bw.cost_us(ps, bwm.K_WRITE, row)
    return {
        "board": board_name,
        "read_kind": bwm.KIND_NAMES[kind],
        "psram_read_bytes_per_s": b.tier("psram").cost.values()["read_bytes_per_s"],
        "weights_bytes_per_token": cfg.n_layers * per_layer + final,
        "kv_write_bytes_per_token": cfg.n_layers * row,
        "kv_read_bytes_per_token_at_seq": cfg.n_layers * row * seq,
        "weights_only_us_per_token": w_only,
        "weights_only_tok_s": round(1e6 / w_only, 1),
        "us_per_token_at_1": per_token[0],
        "us_per_token_at_half": per_token[seq // 2 - 1],
        "us_per_token_at_seq": per_token[-1],
        "mean_us_per_token": round(mean_us, 1),
        "mean_tok_s": round(1e6 / mean_us, 1),
    }


def emulate(board_name, model, tok, n_tokens=EMULATED_TOKENS):
    # the firmware's decode loop on a VirtualClock with the board's cost model charged:
    # memory µs per token as emulated, and the prediction for the same KV lengths
    s = decode.Session(model, tok, backend="auto", slice_us=0)  # a C decoder: one forward step per token, no slice bound
    if s.cap < n_tokens:
        n_tokens = s.cap
    clk = VirtualClock()
    k = Kernel(clk, max_tasks=2)
    brd = boards.load(board_name)
    bw = bwm.Bandwidth(brd, kernel=k)
    s.traffic = decode.traffic_for(s, bw)
    times = []
    last = [0]

    def on_token(sess):
        now = clk.now()
        times.append(now - last[0])
        last[0] = now

    s.on_token = on_token
    ids = s.encode("")
    k.spawn("decode", 1, s.task(k, ids, n_tokens - len(ids), lambda b: None))
    k.run()
    tr = s.traffic
    pred = [tr.token_us(s.cfg.n_layers, len(ids) + i) for i in range(len(times))]  # KV length of each forward
    rep = bw.report()["psram"]
    ind = independent_bytes(s.cfg, len(ids), len(times))
    return {
        "independent_weights_bytes": ind["weights"],
        "independent_kv_read_bytes": ind["kv_read"],
        "independent_kv_write_bytes": ind["kv_write"],
        "board": brd.name,
        "tokens": len(times),
        "emulated_mean_us_per_token": round(sum(times) / len(times), 1),
        "predicted_mean_us_per_token": round(sum(pred) / len(pred), 1),
        "max_abs_diff_us_per_token": max(abs(a - b) for a, b in zip(times, pred, strict=True)),
        "psram_weights_bytes": rep["weights"]["bytes"],
        "psram_kv_read_bytes": rep["kv_read"]["bytes"],
        "psram_kv_write_bytes": rep["kv_write"]["bytes"],
        "psram_peak_permille": rep["all"]["peak_permille"],
    }


def independent_bytes(cfg, prompt, tokens):
    # PSRAM bytes a C decoder's `tokens` forward steps move, counted from the model's
    # dimensions alone (not through DecodeTraffic, which charged the emulation): per forward
    # every layer's seven fp32 matrices and two norm vectors, the final norm, the classifier
    # and one embedding row; per layer one fp32 K and V row written, and every cached row
    # read by the attention at the forward's KV length (prompt + i for forward i)
    d, hid, kvd, L = cfg.dim, cfg.hidden_dim, cfg.kv_dim, cfg.n_layers
    layer = 4 * (2 * d * d + 2 * d * kvd + 3 * d * hid + 2 * d)
    final = 4 * (d + cfg.vocab_size * d + d)
    row = 4 * 2 * kvd
    kv_len = sum(prompt + i for i in range(tokens))
    return {"weights": tokens * (L * layer + final), "kv_write": tokens * L * row, "kv_read": L * row * kv_len}


def measure():
    with tempfile.TemporaryDirectory() as tmp:
        model, tok, desc = budget_bench.model_path(tmp)
        cfg, lay = llama2c.plan(model)
        preds = [predict(b, cfg, lay) for b in BOARDS]
        preds.append(predict(BOARDS[0], cfg, lay, kind=bwm.K_LINE))
        emu = emulate(BOARDS[0], model, tok)
    return {"model": desc, "seq": SEQ, "published_tok_s": PUBLISHED, "predictions": preds, "emulated": emu}


def run(as_json=False):
    # ./kv bench costmodel [--json]: print the figures (one JSON object with --json); returns them
    r = measure()
    return emit(r, as_json, render)


# --- the benchmark's section of docs/benchmarks.md (host/benchdoc.py calls these) ------
TITLE = "Cost model: stories260K fp32 decoding from PSRAM on the ESP32-S3"


def render(r):
    # markdown lines of the section from the figures r
    L = [
        "Model: %s. Memory time only (a memory-bound C decoder's ceiling), weights and KV in PSRAM, "
        "fp32 K/V rows of llama2.c's layout, %d tokens. The profiles' figures and their sources: "
        "docs/tiers.md." % (r["model"], r["seq"]),
        "",
        "| board | reads by | PSRAM read B/s | weights B/token | weights only tok/s | us/token at KV 1 | at %d | at %d | mean tok/s over %d |"
        % (r["seq"] // 2, r["seq"], r["seq"]),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in r["predictions"]:
        L.append("| %s | %s | {:,} | {:,} | %.1f | {:,} | {:,} | {:,} | %.1f |".format(
            p["psram_read_bytes_per_s"], p["weights_bytes_per_token"], p["us_per_token_at_1"],
            p["us_per_token_at_half"], p["us_per_token_at_seq"]) % (
            p["board"], p["read_kind"], p["weights_only_tok_s"], p["mean_tok_s"]))
    L.append("")
    L.append("Published (C, fp32, dual core): " + "; ".join("%s: %.2f tok/s" % kv for kv in sorted(r["published_tok_s"].items())) + ".")
    e = r["emulated"]
    L.append("")
    L.append("The firmware's decode loop on `%s` with the cost model charged (VirtualClock, %d tokens): "
             "%.1f us of memory time per token emulated, %.1f predicted; largest per-token difference %d us; "
             "PSRAM bytes charged: weights {:,}, KV read {:,}, KV write {:,}; counted from the model's dimensions "
             "alone (not through the tracker's DecodeTraffic): weights {:,}, KV read {:,}, KV write {:,}.".format(
                 e["psram_weights_bytes"], e["psram_kv_read_bytes"], e["psram_kv_write_bytes"],
                 e["independent_weights_bytes"], e["independent_kv_read_bytes"], e["independent_kv_write_bytes"]) % (
                 e["board"], e["tokens"], e["emulated_mean_us_per_token"], e["predicted_mean_us_per_token"],
                 e["max_abs_diff_us_per_token"]))
    return L
