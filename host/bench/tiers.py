# `./kv bench tiers [--json]`: one emulated scenario run twice, deterministically, on a
# VirtualClock: stories260K decoding 512 tokens on esp32s3_n8r8 through the firmware's
# own decode (firmware_py/decode.py, numpy math, time from the board's cost model via
# the bandwidth tracker) beside a 16 kHz audio capture that moves each 16 ms half of its
# I2S buffer (512 B) by DMA from internal SRAM to PSRAM with a deadline, and a Wi-Fi
# sender that moves a burst of packets from PSRAM to its TX buffers by DMA every 100 ms
# (firmware_py/workloads.py, through the firmware_py/dma.py queue). "Unaware": the
# decode moves each layer's traffic in one go, Wi-Fi submits its bursts unpaced.
# "Aware": the decode moves its traffic in pieces with a yield between them, Wi-Fi is
# paced by its budget in the tracker's window. Also: the decode alone (the floor), and a
# sweep of the aware options (which part buys what). docs/tiers.md explains the mechanism.
import os

from firmware_py import bandwidth as bwm
from firmware_py import decode, dma, workloads
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, T_FAULTS
from firmware_py.sched.stats import S_MAX_SLICE
from host import boards, paths
from host.errors import UserError
from host.bench import emit

DETERMINISTIC = True  # VirtualClock figures: the suite reruns it against docs/bench/tiers.json (tests/test_bench_fresh.py)

BOARD = "esp32s3_n8r8"
TOKENS = 512  # forwards decoded (1 prompt token, BOS, + 511 new): the model's whole context
MODEL, TOKENIZER = "stories260K.bin", "tok512.bin"  # in ../shared/models

# priorities (0 lowest .. 7): audio highest, then the DMA engine (it moves audio's bytes),
# Wi-Fi, the decode lowest (it always has work: it would starve anything below it)
P_AUDIO, P_DMA, P_WIFI, P_DECODE = 7, 6, 4, 1

# the audio stream: 16 kHz x 16-bit mono = 32,000 B/s; one half of the I2S ping-pong
# buffer per 16 ms = 512 B; deadline = the other half's fill time (16 ms): the I2S comes
# back to this half then
AUDIO = {"rate_hz": 16000, "sample_bytes": 2, "period_us": 16000, "halves": 2}

# Wi-Fi: 1,472 B packets (the largest UDP payload in a 1,500 B MTU, and a multiple of the
# GDMA's 32 B PSRAM block), 64 per burst every 100 ms (94,208 B: 7.5 Mbit/s, a fifth of
# what an ESP32-S3 sustains over TCP), into 16 TX buffers in SRAM (ESP-IDF's default count
# of static TX buffers); the first burst 5 ms after the start
WIFI = {"packet_bytes": 1472, "packets": 64, "period_us": 100000, "offset_us": 5000, "tx_bufs": 16}

QUEUE = {"slots": 32, "max_burst": 16384}  # dma.py's default ring and burst limit

# the aware configuration: Wi-Fi's budget is the source documents' I/O share (5 % of the
# PSRAM's 38.6 MB/s: 30,880 B per 16 ms window), sent 11 packets (16,192 B, one merged
# burst) at a time; audio's category gets a reserved share (1 %, 32 x what it moves) that
# nothing else may take; the decode moves its traffic in pieces of PIECE bytes
WIFI_PERMILLE = 50
AUDIO_PERMILLE = 10
WIFI_GROUP = 11
PIECE = 32768
SWEEP_PIECES = (2048, 8192, 65536, 131072)  # other piece sizes tried (paced Wi-Fi)


def model_files(d=None):
    # (checkpoint, tokenizer) in ../shared/models (or d); a UserError of one line when absent
    d = d if d is not None else paths.shared_models()
    m = d and os.path.join(d, MODEL)
    t = d and os.path.join(d, TOKENIZER)
    if not m or not os.path.exists(m) or not os.path.exists(t):
        raise UserError("bench tiers: needs %s and %s in %s (the stories260K checkpoint and its tokenizer)"
                        % (MODEL, TOKENIZER, d or os.path.join(os.path.dirname(paths.ROOT), "shared", "models")), 1)
    return m, t


def scenario(model, tok, tokens=TOKENS, aware=False, piece=0, paced=False, audio=True, wifi=True,
             decode_budgets=None, engine_admit=False, board=BOARD):
    # one run: the decode beside the enabled workloads; aware sets the budgets (Wi-Fi's
    # share, audio's reserve); piece: the decode's piece bytes (0: a layer in one go);
    # paced: Wi-Fi paced by its budget; decode_budgets: {category: permille} for the
    # decode's own categories (admitted per piece); engine_admit: the DMA engine asks the
    # tracker's admission for every burst (dma.DMAQueue(admit=True)). Returns the figures
    brd = boards.load(board)
    clk = VirtualClock()
    k = Kernel(clk, max_tasks=8, verbose=False)
    bw = bwm.Bandwidth(brd, kernel=k, carry_ns=True)  # every transfer's rounded-off ns carried: exact sums
    sr, ps = bw.tier_id("sram"), bw.tier_id("psram")
    c_audio = bw.add_category("audio")
    c_wifi = bw.add_category("wifi")
    if aware:
        bw.set_budget(ps, c_audio, AUDIO_PERMILLE)
        bw.set_budget(ps, c_wifi, WIFI_PERMILLE)
    for cat, pm in (decode_budgets or {}).items():
        bw.set_budget(ps, bw.category_id(cat), pm)
    q = dma.DMAQueue(k, bw=bw, board=brd, admit=engine_admit, **QUEUE)
    s = decode.Session(model, tok, backend="auto", slice_us=0)  # the decode before any slice bound: a layer per slice unless the aware options split it
    n = min(tokens, s.cap)
    s.traffic = decode.traffic_for(s, bw, admit=bool(decode_budgets))
    s.piece_bytes = piece
    ids = s.encode("")
    a = workloads.AudioCapture(k, q, sr, ps, c_audio, **AUDIO) if audio else None
    w = workloads.WifiBurst(k, q, ps, sr, c_wifi, bw=bw, paced=paced, group=WIFI_GROUP, **WIFI) if wifi else None

    def decoder():
        yield from s.task(k, ids, n - len(ids), lambda b: None)
        k.stop()  # the co-running tasks never end: the run ends with the decode

    if a is not None:
        k.spawn("audio", P_AUDIO, a.task())
    q.spawn(P_DMA)
    if w is not None:
        k.spawn("wifi", P_WIFI, w.task())
    t = k.spawn("decode", P_DECODE, decoder())
    k.run()
    if k.totals[T_FAULTS] or t.exc is not None:
        raise UserError("bench tiers: a task failed (%s)" % (t.exc or "faults %d" % k.totals[T_FAULTS]), 1)
    if s.n_new != n - len(ids):
        raise UserError("bench tiers: the decode stopped after %d tokens (%s)" % (s.n_new, s.stop_line()), 1)
    el = s.t_end - s.t_start
    rep = bw.report()
    pr = rep["psram"]["all"]
    busy = pr["busy_us"] + s.carried_us  # the decode's pieces' carried sub-µs parts are PSRAM time too
    psb = pr["bytes"]
    r = {
        "tokens": n,
        "decode_us": el,
        "decode_ms_per_token": round(el / n / 1000, 4),
        "decode_pieces": s.pieces,
        "decode_longest_slice_us": t.st[S_MAX_SLICE],  # the decode's longest stretch without a yield
        "psram_busy_us": busy,
        "psram_utilization": round(busy / el, 4),  # busy time / run time
        "psram_bytes": psb,
        "psram_bytes_permille": round(psb * 1000 / (brd.tier("psram").bandwidth * el / 1e6), 1),
        "psram_peak_permille": pr["peak_permille"],
        "psram_stalls": pr["stalls"],
        "psram_stall_us": pr["stall_us"],
        "decode_throttled_waits": sum(rep["psram"][c]["waits"] for c in ("weights", "kv_read", "kv_write")),
        "decode_throttled_wait_us": sum(rep["psram"][c]["wait_us"] for c in ("weights", "kv_read", "kv_write")),
        "text_ids_sum": sum(s.tokens[i] for i in range(s.n_new)),  # the same tokens in every mode
    }
    qs = q.stats()
    r["dma"] = {kk: qs[kk] for kk in ("submitted", "bursts", "merged", "bytes", "max_depth", "stalls", "stall_us", "busy_us")}
    if a is not None:
        st = a.stats()
        r["audio"] = st
        n_slots, n_ok = a.check()
        if n_ok != n_slots:
            raise UserError("bench tiers: %d of %d audio slots in PSRAM do not hold their samples" % (n_slots - n_ok, n_slots), 1)
        r["audio_checked"] = n_slots
        charged = rep["psram"]["audio"]["bytes"]  # bursts are charged when they start: + the one in flight
        if charged != st["bytes"] + _pending(q, c_audio, False):
            raise UserError("bench tiers: audio bytes charged on PSRAM %d != moved %d" % (charged, st["bytes"]), 1)
    if w is not None:
        st = w.stats()
        r["wifi"] = st
        r["wifi_mbit_s"] = round(st["bytes"] * 8 / el, 3)  # bytes per µs x 8 = Mbit/s
        if rep["psram"]["wifi"]["bytes"] != st["bytes"] - _pending(q, c_wifi, True):  # submitted, less the ring's
            raise UserError("bench tiers: Wi-Fi bytes charged on PSRAM != moved", 1)
    return r


def _pending(q, cat, ring):
    # bytes of cat in the DMA queue's burst in flight (ring False) or waiting in its ring (True)
    if not ring:
        return q.burst[dma.F_LEN] if q.burst_n and q.burst[dma.F_CAT] == cat else 0
    n = 0
    for j in range(q.count):
        b = ((q.head + j) % q.slots) * dma.NW
        if q.ring[b + dma.F_CAT] == cat:
            n += q.ring[b + dma.F_LEN]
    return n


def _aware(model, tok, tokens, piece=PIECE, paced=True, **kw):
    return scenario(model, tok, tokens, aware=True, piece=piece, paced=paced, **kw)


def measure(tokens=TOKENS, model_dir=None, sweep=True):
    model, tok = model_files(model_dir)
    alone = scenario(model, tok, tokens, audio=False, wifi=False)
    alone_split = scenario(model, tok, tokens, piece=PIECE, audio=False, wifi=False)
    un = scenario(model, tok, tokens)
    un_nw = scenario(model, tok, tokens, wifi=False)  # unaware, audio beside the decode only
    aw = _aware(model, tok, tokens)
    floor = alone["decode_ms_per_token"]
    r = {
        "board": BOARD, "model": MODEL, "tokens": un["tokens"],
        "priorities": {"audio": P_AUDIO, "dma_engine": P_DMA, "wifi": P_WIFI, "decode": P_DECODE},
        "audio_config": dict(AUDIO, period_bytes=un["audio"]["period_bytes"], deadline_us=un["audio"]["deadline_us"]),
        "wifi_config": dict(WIFI),
        "queue": dict(QUEUE),
        "aware_config": {"decode_piece_bytes": PIECE, "wifi_budget_permille": WIFI_PERMILLE,
                         "audio_reserve_permille": AUDIO_PERMILLE, "wifi_group_packets": WIFI_GROUP,
                         "decode_budgets": "none"},
        "audio_periods": un["audio"]["periods"],
        "audio_periods_aware": aw["audio"]["periods"],
        "decode_ms_per_token_alone": floor,
        "decode_ms_per_token_alone_pieces": alone_split["decode_ms_per_token"],
        "psram_utilization_alone": alone["psram_utilization"],
        "audio_deadline_misses_unaware_no_wifi": un_nw["audio"]["misses"],
        "audio_worst_latency_us_unaware_no_wifi": un_nw["audio"]["worst_latency_us"],
    }
    for name, d in (("unaware", un), ("aware", aw)):
        r["audio_deadline_misses_" + name] = d["audio"]["misses"]
        r["audio_worst_latency_us_" + name] = d["audio"]["worst_latency_us"]
        r["audio_mean_latency_us_" + name] = d["audio"]["mean_latency_us"]
        r["audio_worst_start_us_" + name] = d["audio"]["worst_start_us"]
        r["decode_ms_per_token_" + name] = d["decode_ms_per_token"]
        r["decode_slowdown_" + name] = round(d["decode_ms_per_token"] / floor, 4)
        # the floor with the co-runners: the decode alone plus the PSRAM time of this run's
        # DMA bursts (the tier serialises transfers and the decode always has some to make)
        r["decode_ms_per_token_shared_floor_" + name] = round((alone["decode_us"] + d["dma"]["busy_us"]) / d["tokens"] / 1000, 4)
        r["psram_utilization_" + name] = d["psram_utilization"]
        r["psram_bytes_permille_" + name] = d["psram_bytes_permille"]
        r["psram_peak_permille_" + name] = d["psram_peak_permille"]
        r["psram_stall_us_" + name] = d["psram_stall_us"]
        r["wifi_mbit_s_" + name] = d["wifi_mbit_s"]
        r["wifi_worst_burst_us_" + name] = d["wifi"]["worst_burst_us"]
        r["wifi_throttled_waits_" + name] = d["wifi"]["throttled_waits"]
        r["wifi_throttled_wait_us_" + name] = d["wifi"]["throttled_wait_us"]
        r["dma_max_depth_" + name] = d["dma"]["max_depth"]
        r["decode_longest_slice_us_" + name] = d["decode_longest_slice_us"]
        r["decode_yields_per_token_" + name] = round(d["decode_pieces"] / d["tokens"], 2)
        r["same_tokens_" + name] = d["text_ids_sum"] == alone["text_ids_sum"]
        r["audio_slots_verified_" + name] = d["audio_checked"]
    r["runs"] = {"alone": alone, "alone_pieces": alone_split, "unaware": un, "unaware_no_wifi": un_nw, "aware": aw}
    if sweep:
        rows = []
        variants = [("decode pieces only (Wi-Fi unpaced)", dict(piece=PIECE, paced=False)),
                    ("Wi-Fi paced only (decode layers in one go)", dict(piece=0, paced=True))]
        variants += [("pieces of %d B, Wi-Fi paced" % p, dict(piece=p, paced=True)) for p in SWEEP_PIECES]
        variants.append(("pieces of %d B, Wi-Fi paced by the DMA engine's admission instead (one queue)" % PIECE,
                         dict(piece=PIECE, paced=False, engine_admit=True)))
        variants.append(("pieces of %d B, Wi-Fi paced, decode budgets: the source documents' split" % PIECE,
                         dict(piece=PIECE, paced=True, decode_budgets={"weights": 300, "kv_read": 400, "kv_write": 250})))
        for label, kw in variants:
            d = _aware(model, tok, tokens, **kw)
            rows.append({"variant": label, "audio_misses": d["audio"]["misses"],
                         "audio_worst_latency_us": d["audio"]["worst_latency_us"],
                         "decode_ms_per_token": d["decode_ms_per_token"],
                         "decode_slowdown": round(d["decode_ms_per_token"] / floor, 4),
                         "wifi_mbit_s": d["wifi_mbit_s"], "psram_utilization": d["psram_utilization"]})
        r["sweep"] = rows
    return r


def run(as_json=False):
    # ./kv bench tiers [--json]: print the figures (one JSON object with --json); returns them
    r = measure()
    return emit(r, as_json, render)


# --- the benchmark's section of docs/benchmarks.md (host/benchdoc.py calls these) ------
TITLE = "Tiers: audio deadlines beside a decode, bandwidth-aware and not"


def render(r):
    # markdown lines of the section from the figures r
    a, wcfg, ac = r["audio_config"], r["wifi_config"], r["aware_config"]
    L = [
        "`%s` decoding %d tokens on `%s` (the firmware's decode, time from the cost model on a VirtualClock) beside "
        "a %d Hz x %d B audio capture (%d B per %d us half of a ping-pong I2S buffer, moved SRAM to PSRAM by the DMA "
        "queue, deadline %d us) and Wi-Fi bursts of %d x %d B from PSRAM every %d us. Unaware: each decode layer's "
        "traffic in one go, Wi-Fi unpaced. Aware: decode pieces of %d B with a yield between them, Wi-Fi paced to "
        "%d permille of PSRAM in groups of %d packets, audio's %d permille reserved. Mechanism: docs/tiers.md "
        "(Bandwidth-aware scheduling)." % (
            r["model"], r["tokens"], r["board"], a["rate_hz"], a["sample_bytes"], a["period_bytes"], a["period_us"],
            a["deadline_us"], wcfg["packets"], wcfg["packet_bytes"], wcfg["period_us"], ac["decode_piece_bytes"],
            ac["wifi_budget_permille"], ac["wifi_group_packets"], ac["audio_reserve_permille"]),
        "",
        "| figure | unaware | aware |",
        "| --- | --- | --- |",
    ]
    for key, label in (("audio_deadline_misses", "audio deadline misses"),
                       ("audio_worst_latency_us", "audio worst latency, us"),
                       ("audio_mean_latency_us", "audio mean latency, us"),
                       ("audio_worst_start_us", "audio worst start delay (CPU held), us"),
                       ("decode_ms_per_token", "decode ms per token"),
                       ("decode_slowdown", "decode slowdown vs alone"),
                       ("decode_ms_per_token_shared_floor", "floor: alone + this run's DMA time on PSRAM, ms per token"),
                       ("decode_yields_per_token", "decode pieces per token"),
                       ("decode_longest_slice_us", "decode's longest stretch without a yield, us"),
                       ("psram_utilization", "PSRAM busy fraction"),
                       ("psram_bytes_permille", "PSRAM bytes, permille of 38.6 MB/s"),
                       ("psram_peak_permille", "PSRAM peak window, permille"),
                       ("wifi_mbit_s", "Wi-Fi Mbit/s"),
                       ("wifi_worst_burst_us", "Wi-Fi worst burst, us"),
                       ("wifi_throttled_waits", "Wi-Fi throttled waits"),
                       ("dma_max_depth", "DMA ring max depth")):
        L.append("| %s | %s | %s |" % (label, _f(r[key + "_unaware"]), _f(r[key + "_aware"])))
    L += ["",
          "Audio periods: %d (unaware), %d (aware). Unaware without Wi-Fi (the audio beside the decode only): %s misses, "
          "worst latency %s us. Floor (the decode alone, layers in one go): %s ms per token; alone in pieces of %d B: "
          "%s ms per token; PSRAM busy fraction alone %s." % (
              r["audio_periods"], r["audio_periods_aware"], _f(r["audio_deadline_misses_unaware_no_wifi"]),
              _f(r["audio_worst_latency_us_unaware_no_wifi"]), _f(r["decode_ms_per_token_alone"]),
              ac["decode_piece_bytes"], _f(r["decode_ms_per_token_alone_pieces"]), _f(r["psram_utilization_alone"])),
          ""]
    if r.get("sweep"):
        L += ["| aware variant | audio misses | audio worst us | decode ms/token | slowdown | Wi-Fi Mbit/s |",
              "| --- | --- | --- | --- | --- | --- |"]
        for row in r["sweep"]:
            L.append("| %s | %s | %s | %s | %s | %s |" % (
                row["variant"], _f(row["audio_misses"]), _f(row["audio_worst_latency_us"]),
                _f(row["decode_ms_per_token"]), _f(row["decode_slowdown"]), _f(row["wifi_mbit_s"])))
    return L


def _f(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return "{:,}".format(v)
    if isinstance(v, float):
        return "{:,.0f}".format(v) if abs(v) >= 1000 else "%.4g" % v
    return str(v)
