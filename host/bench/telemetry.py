# `./kv bench telemetry [--json]`: what the telemetry link costs.
#  - frame_bytes: wire bytes of the periodic frames (mean, max) in a decode on the
#    MicroPython unix port (kvrtos-tiny converted to int8 q8row, int8 KV, the q8 path,
#    one sequence, heap record once a second), and on CPython with every source a board
#    can have attached (bandwidth tracker over the default board's tiers with traffic in
#    every tier and category, a DMA queue, the thermal guard, 8 task slots);
#  - link_utilization: periodic frames at the default 10 Hz as a share of 115,200 baud
#    (11,520 B/s), from the frame sizes measured (mean; max: every frame at its largest);
#  - decode_slowdown: decode with the telemetry task beside it against decode alone, side
#    by side in one MicroPython process (host/bench/_telemetry_mp.py: 15 pairs of runs of
#    8 requests x 200 tokens on the real clock, the order alternating, frames written to
#    /dev/null by a real stream write); the median of the pairs' ratios of the process's
#    CPU time (/proc/self/stat, 10 ms ticks: the shared machine's other work stretches the
#    wall clock by tens of percent, the CPU time by a few) - 1; beside it the same from
#    the wall clock, the share the kernel itself accounts to the telemetry task in those
#    runs (+ the token hooks), and the model figure from the measured costs of one tick
#    and of one token's hooks.
import json
import os
import statistics
import tempfile

from firmware_py import telemetry as tm
from host import convert, interp, paths
from host.errors import UserError

TITLE = "telemetry: frame size, link share, decode cost"
N, REPS, PAIRS = 200, 8, 15  # tokens per request, requests per run, side-by-side pairs
LINK_BPS = tm.DEFAULT_LINK_BPS  # 115,200 baud, 8N1
RATE = tm.DEFAULT_RATE_HZ


def micro_figures():
    # _telemetry_mp.py under MicroPython on kvrtos-tiny converted to q8row; its JSON
    tiny = os.path.join(paths.MODELS, "kvrtos-tiny")
    with tempfile.TemporaryDirectory() as d:
        q8 = os.path.join(d, "model.bin")
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            convert.convert(os.path.join(tiny, "model.bin"), q8, "q8row")
        r = interp.run(os.path.join(paths.ROOT, "host", "bench", "_telemetry_mp.py"), "micropython",
                       args=[q8, os.path.join(tiny, "tokenizer.bin"), str(N), str(REPS), str(PAIRS)], timeout=900)
    if r.returncode != 0:
        raise UserError("telemetry bench failed under micropython: %s" % (r.stderr or r.stdout).strip().splitlines()[-1:], 1)
    return json.loads(r.stdout.strip().splitlines()[-1])


def all_sources_frames(seconds=20):
    # (mean, max, frames) of periodic frames with every source attached, on CPython
    from firmware_py import bandwidth as bwm, board, kv, pool, thermal
    from firmware_py.clock import VirtualClock
    from firmware_py.sched import Kernel

    brd = board.load(os.path.join(paths.BOARDS, paths.DEFAULT_BOARD + ".json"))
    clk = VirtualClock()
    k = Kernel(clk, max_tasks=8, verbose=False)
    bw = bwm.Bandwidth(brd, kernel=k)
    q = None
    try:
        from firmware_py import dma as dmam

        try:
            q = dmam.DMAQueue(k, bw=bw, board=brd)
        except TypeError:
            q = dmam.DMAQueue(k, bw=bw)
    except (ImportError, ValueError):
        q = None
    guard = thermal.Guard(k, thermal.ModelTemp(clk))
    lay = kv.Layout(4, 4, 8, "int8")
    p = pool.Pool(lay.block_bytes, 32)
    c = kv.KVCache(p, lay, max_seqs=2)
    h = c.open(p.add_region(32), "window", 256)
    sizes = []

    def sink(b, n):
        if _ptype(b, n) == tm.T_PERIODIC:
            sizes.append(n)

    t = tm.Telemetry(sink, kernel=k, pool=p, cache=c, bw=bw, dma=q, thermal=guard, heap=False)
    t.watch_seq(h, 256)
    row = bytearray(lay.row_bytes)

    def worker(k, i):
        while True:
            for tier in range(bw.n_tiers):
                for cat in range(bw.n_cat):
                    bw.charge(tier, cat, 1000 * (i + 1) + 37 * tier + cat)
            c.append(h, row)
            t.tokens += 1
            k.charge(7000)
            yield k.sleep_us(3000)

    k.spawn("telemetry", 3, t.task(k))
    for i in range(5):
        k.spawn("worker%d" % i, 1, worker(k, i))
    k.spawn("thermal", 2, guard.task())
    k.run(for_us=seconds * 1000000)
    return statistics.mean(sizes), max(sizes), len(sizes)


def _ptype(wire, n):
    # the frame type of a wire frame (decodes it: CPython, bench only)
    from host import console

    data = console.cobs_decode(bytes(wire[1:n - 1]))
    return data[2] if data else None


def measure():
    m = micro_figures()
    wall = [a / b for a, b in zip(m["on_us"], m["off_us"], strict=True)]
    if None in m["on_cpu_ms"] or 0 in m["off_cpu_ms"]:
        ratios = wall  # no /proc: the wall clock only
    else:
        ratios = [a / b for a, b in zip(m["on_cpu_ms"], m["off_cpu_ms"], strict=True)]
    slowdown = statistics.median(ratios) - 1
    slowdown_wall = statistics.median(wall) - 1
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    tokens_on = m["tokens_per_run"] * len(m["on_us"])
    share = (m["telemetry_run_us"] + m["token_us"] * tokens_on) / m["decode_run_us"] if m["decode_run_us"] else None
    tokens = m["tokens_per_run"]
    tok_s_off = tokens * 1e6 / statistics.median(m["off_us"])
    model = (m["tick_us"] * RATE + m["token_us"] * tok_s_off) / 1e6  # share of each second telemetry takes
    a_mean, a_max, a_n = all_sources_frames()
    link = LINK_BPS
    return {
        "frame_bytes": {"mean": round(m["frame_bytes_mean"], 1), "max": m["frame_bytes_max"],
                        "frames": m["periodic_frames"], "budget": tm.DEFAULT_LINK_BPS * tm.DEFAULT_SHARE_PCT // 100 // RATE},
        "frame_bytes_all_sources": {"mean": round(a_mean, 1), "max": a_max, "frames": a_n},
        "link_utilization": round(m["frame_bytes_mean"] * RATE / link, 4),
        "link_utilization_max": round(max(m["frame_bytes_max"], a_max) * RATE / link, 4),
        "link_utilization_all_sources": round(a_mean * RATE / link, 4),
        "link_baud": 115200, "rate_hz": RATE,
        "decode_slowdown": round(slowdown, 4),
        "decode_slowdown_pairs": [round(r - 1, 4) for r in ratios],
        "decode_slowdown_wall": round(slowdown_wall, 4),
        "decode_slowdown_iqr": [round(q[0] - 1, 4), round(q[2] - 1, 4)],
        "decode_slowdown_kernel_share": round(share, 5) if share is not None else None,
        "decode_slowdown_clock": "cpu" if ratios is not wall else "wall",
        "decode_slowdown_model": round(model, 5),
        "tick_us": round(m["tick_us"], 1), "token_hook_us": round(m["token_us"], 2),
        "decode_tok_s": round(tok_s_off, 1), "tokens_per_run": tokens, "pairs": len(ratios),
        "skipped_frames": m["skipped"], "backend": m["backend"],
        "text_link_bytes_per_s": round((m["sent_bytes"] - m["frame_bytes_mean"] * m["periodic_frames"]) / m["on_seconds"]),
        "goals": {"link_utilization": 0.10, "decode_slowdown": 0.02},
    }


def run(as_json=False):
    r = measure()
    if as_json:
        print(json.dumps(r, sort_keys=True))
        return r
    fb, fa = r["frame_bytes"], r["frame_bytes_all_sources"]
    print("telemetry at %d Hz on %d baud" % (r["rate_hz"], r["link_baud"]))
    print("  periodic frame: mean %.1f B, max %d B over %d frames (budget %d B); with every source: mean %.1f, max %d B"
          % (fb["mean"], fb["max"], fb["frames"], fb["budget"], fa["mean"], fa["max"]))
    print("  link utilization: %.4f (max %.4f, every source %.4f; goal < 0.10)" % (
        r["link_utilization"], r["link_utilization_max"], r["link_utilization_all_sources"]))
    print("  decode slowdown: %.4f median of %d pairs, %s time, IQR %s (wall %.4f; kernel share %.5f; model %.5f: tick "
          "%.1f us x %d Hz + %.2f us x %.0f tok/s; goal < 0.02)" % (
              r["decode_slowdown"], r["pairs"], r["decode_slowdown_clock"], r["decode_slowdown_iqr"],
              r["decode_slowdown_wall"], r["decode_slowdown_kernel_share"],
                                        r["decode_slowdown_model"], r["tick_us"], r["rate_hz"], r["token_hook_us"],
                                        r["decode_tok_s"]))
    return r


def render(r):
    # markdown lines of the section from the figures r
    fb, fa = r["frame_bytes"], r["frame_bytes_all_sources"]
    return [
        "Periodic frames at %d Hz on %s baud (a tenth of the link is %d B per frame). Decode: kvrtos-tiny as int8 "
        "q8row, int8 KV, the `%s` path on the MicroPython unix port, %d tokens per run (%.0f tok/s alone). "
        "`decode_slowdown` is the median over %d side-by-side pairs of (CPU time with the telemetry task) / (CPU time without) - 1; "
        "the model figure is one tick's cost x the rate + the per-token hooks x tok/s. Frames with every source: "
        "CPython, the default board's tiers with traffic in every category, a DMA queue, the thermal guard, 7 tasks." % (
            r["rate_hz"], "{:,}".format(r["link_baud"]), fb["budget"], r["backend"], r["tokens_per_run"], r["decode_tok_s"],
            r["pairs"]),
        "",
        "| figure | value | goal |",
        "| --- | --- | --- |",
        "| `frame_bytes` mean / max (decode) | %.1f / %d B | <= %d B |" % (fb["mean"], fb["max"], fb["budget"]),
        "| `frame_bytes` mean / max (every source) | %.1f / %d B | <= %d B |" % (fa["mean"], fa["max"], fb["budget"]),
        "| `link_utilization` (mean frame; largest frame; every source) | %.4f; %.4f; %.4f | < 0.10 |" % (
            r["link_utilization"], r["link_utilization_max"], r["link_utilization_all_sources"]),
        "| `decode_slowdown` (%s time, median of the pairs) | %.4f | < 0.02 |" % (r["decode_slowdown_clock"].upper(), r["decode_slowdown"]),
        "| `decode_slowdown` per pair | %s | |" % ", ".join("%.4f" % x for x in r["decode_slowdown_pairs"]),
        "| the pairs' interquartile range (CPU time) | %.4f .. %.4f | |" % tuple(r["decode_slowdown_iqr"]),
        "| `decode_slowdown` (wall clock, median of the pairs) | %.4f | |" % r["decode_slowdown_wall"],
        "| telemetry task's run time + token hooks / decode's run time (the kernel's accounting, same runs) | %.5f | |" % r["decode_slowdown_kernel_share"],
        "| `decode_slowdown` (model) | %.5f | |" % r["decode_slowdown_model"],
        "| one tick (µs), token hooks (µs/token) | %.1f, %.2f | |" % (r["tick_us"], r["token_hook_us"]),
        "| frames skipped in the runs | %d | |" % r["skipped_frames"],
        "| generated text on the link at %.0f tok/s | %d B/s | |" % (r["decode_tok_s"], r["text_link_bytes_per_s"]),
    ]
