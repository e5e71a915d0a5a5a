# `./kv trace LOG`: pictures from the console's JSONL log (./kv monitor --jsonl).
#
#   trace.json   Chrome trace event JSON (open it in the Perfetto UI, ui.perfetto.dev, or
#                chrome://tracing): one track per task with its run time as slices (each
#                slice is the task's run time between two reports of its row, laid at the
#                start of that interval: telemetry samples, it does not log switches), a
#                track of requests (start to done), counters for tokens, tok/s, pool blocks,
#                KV per sequence, heap, bandwidth per tier, DMA depth, temperature, and every
#                event as an instant
#   kv_bytes.png KV bytes held in pool blocks against tokens cached, with the fitted
#                bytes-per-token slope beside the layout's figures: kv_bytes_per_token (the
#                published 2 x L x H x D x bytes) and token_bytes (the cache's bytes per token,
#                header and padding included: what ./kv budget calls cache_bytes_per_token)
#   pool.png     pool blocks in use and KV tokens cached over board time
#   bandwidth.png MB/s per memory tier over board time (from the tier rows' kB counters)
#
# Board time: the frames' ms. A board that restarts starts again at 0; its frames are
# laid after the previous run's (an offset per run), so one trace shows every run.
import json
import os

from host.errors import UserError

PID = 1  # the board's process in the trace
TID_REQUESTS = 1000  # the requests track
TID_EVENTS = 1001  # instants


def load(path):
    # the frames of a JSONL log, in order; UserError (one line) for a file that is not one
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise UserError("%s cannot be read: %s" % (path, e.strerror or e), 2) from None
    frames = []
    with f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
            except ValueError:
                raise UserError("%s:%d is not a JSON line (give the log ./kv monitor --jsonl writes)" % (path, i), 2) from None
            if not isinstance(d, dict) or "type" not in d or "ms" not in d:
                raise UserError("%s:%d is not a telemetry frame (no type / ms)" % (path, i), 2)
            frames.append(d)
    if not frames:
        raise UserError("%s holds no frames" % path, 2)
    return frames


def with_time(frames):
    # (t_ms, frame) with board time made monotonic across board restarts
    out = []
    offset = 0
    last = None
    for f in frames:
        ms = f.get("ms", 0)
        if last is not None and ms + offset < last - 60000:  # time went back: a new run of the board
            offset = last + 1000 - ms
        t = ms + offset
        last = max(t, last or 0)
        out.append((t, f))
    return out


def _rows(f, name):
    rows = f.get(name + "s")
    if rows is not None:
        return rows
    r = f.get(name)
    return [r] if isinstance(r, dict) else []


def build(frames):
    # (trace dict, series dict) from the frames
    tf = with_time(frames)
    layout = {}
    ev = []
    names = {}  # task slot -> name (latest layout)
    prev_task = {}  # slot -> (t, run_ms)
    prev_tier = {}  # tier -> (t, kb)
    tier_names = {}
    series = {"pool": [], "seq": [], "tier": {}, "tokens": [], "layout": {}}
    open_req = {}
    for t, f in tf:
        us = t * 1000
        kind = f["type"]
        if kind == "layout":
            layout = f.get("layout", {})
            series["layout"] = layout
            for k, v in layout.items():
                if k.startswith("task.") and k.count(".") == 1:
                    slot = int(k.split(".")[1])
                    if names.get(slot) != v:
                        names[slot] = v
                        prev_task.pop(slot, None)
                        ev.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": slot, "args": {"name": v}})
                if k.startswith("tier.") and k.count(".") == 1:
                    tier_names[int(k.split(".")[1])] = v
        elif kind == "periodic":
            c = f.get("core")
            if c:
                ev.append({"ph": "C", "name": "tokens", "pid": PID, "ts": us, "args": {"tokens": c.get("tokens", 0)}})
                ev.append({"ph": "C", "name": "tok/s", "pid": PID, "ts": us, "args": {"tok/s": c.get("tok_s_x10", 0) / 10.0}})
                series["tokens"].append((t, c.get("tokens", 0), c.get("tok_s_x10", 0) / 10.0))
            p = f.get("pool")
            if p:
                ev.append({"ph": "C", "name": "pool blocks", "pid": PID, "ts": us,
                           "args": {"used": p.get("used", 0), "high_water": p.get("high_water", 0)}})
                series["pool"].append((t, p.get("used", 0), p.get("high_water", 0)))
            h = f.get("heap")
            if h:
                ev.append({"ph": "C", "name": "heap bytes", "pid": PID, "ts": us, "args": {"free": h.get("free", 0)}})
            for s in _rows(f, "seq"):
                ev.append({"ph": "C", "name": "kv seq %d" % s["slot"], "pid": PID, "ts": us,
                           "args": {"cached": s.get("cached", 0), "length": s.get("length", 0), "blocks": s.get("blocks", 0)}})
                series["seq"].append((t, s))
            for r in _rows(f, "tier"):
                tier = r["tier"]
                kb = r.get("kb", 0)
                pv = prev_tier.get(tier)
                prev_tier[tier] = (t, kb)
                if pv is not None and t > pv[0] and kb >= pv[1]:
                    mbs = (kb - pv[1]) / (t - pv[0])  # kB per ms = MB/s
                    name = tier_names.get(tier, "tier%d" % tier)
                    ev.append({"ph": "C", "name": "bandwidth MB/s", "pid": PID, "ts": us, "args": {name: round(mbs, 3)}})
                    series["tier"].setdefault(name, []).append((t, mbs))
            d = f.get("dma")
            if d:
                ev.append({"ph": "C", "name": "dma depth", "pid": PID, "ts": us, "args": {"depth": d.get("depth", 0)}})
            tp = f.get("temp")
            if tp:
                ev.append({"ph": "C", "name": "temperature C", "pid": PID, "ts": us, "args": {"C": tp.get("deci_c", 0) / 10.0}})
            for r in _rows(f, "task"):
                slot = r["slot"]
                run = r.get("run_ms", 0)
                pv = prev_task.get(slot)
                prev_task[slot] = (t, run)
                if pv is not None and t > pv[0] and run >= pv[1]:
                    d_run = run - pv[1]
                    if d_run > 0:
                        ev.append({"ph": "X", "name": "run", "pid": PID, "tid": slot, "ts": pv[0] * 1000,
                                   "dur": min(d_run, t - pv[0]) * 1000,
                                   "args": {"cpu_pct": round(100.0 * d_run / (t - pv[0]), 1), "interval_ms": t - pv[0],
                                            "note": "run time in this interval (sampled), not one slice"}})
        elif kind == "event":
            for e in f.get("events", []):
                et = t  # the frame's time; e["ms"] is the time the board queued it (same run)
                if isinstance(e.get("ms"), int) and e["ms"] <= f.get("ms", 0):
                    et = t - (f.get("ms", 0) - e["ms"])
                name = e.get("event", "event")
                ev.append({"ph": "i", "s": "g", "name": name, "pid": PID, "tid": TID_EVENTS, "ts": et * 1000,
                           "args": {k: v for k, v in e.items() if k not in ("event", "ms")}})
                if name == "start":
                    open_req[e.get("request")] = et
                elif name == "done" and e.get("request") in open_req:
                    t0 = open_req.pop(e.get("request"))
                    ev.append({"ph": "X", "name": "request %s" % e.get("request"), "pid": PID, "tid": TID_REQUESTS,
                               "ts": t0 * 1000, "dur": max(0, et - t0) * 1000,
                               "args": {"tokens": e.get("tokens"), "reason": e.get("reason_name", e.get("reason"))}})
    meta = [{"ph": "M", "name": "process_name", "pid": PID, "args": {"name": "board (%s)" % layout.get("board", "kvrtos")}},
            {"ph": "M", "name": "thread_name", "pid": PID, "tid": TID_REQUESTS, "args": {"name": "requests"}},
            {"ph": "M", "name": "thread_name", "pid": PID, "tid": TID_EVENTS, "args": {"name": "events"}}]
    trace = {"traceEvents": meta + ev, "displayTimeUnit": "ms",
             "otherData": {"source": "kvrtos telemetry (./kv monitor --jsonl)", "firmware": layout.get("firmware", "")}}
    return trace, series


def kv_fit(series):
    # the fitted bytes per token of the KV held in pool blocks, over the reports where
    # nothing was evicted yet (cached == length): {fitted, points, kv_bytes_per_token,
    # token_bytes, ratio}; None without the figures
    lay = series["layout"]
    bb = int(lay.get("pool.block_bytes", 0) or 0)
    pts = sorted({(s["cached"], s["blocks"] * bb) for _, s in series["seq"]
                  if s.get("cached") == s.get("length") and s.get("cached", 0) > 0})
    if not bb or len({x for x, _ in pts}) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    kvb = int(lay.get("kv.kv_bytes_per_token", 0) or 0)
    tb = int(lay.get("kv.token_bytes", 0) or 0)
    return {"fitted_bytes_per_token": round(slope, 2), "intercept_bytes": round(my - slope * mx, 1), "points": n,
            "tokens_max": pts[-1][0], "kv_bytes_per_token": kvb, "token_bytes": tb,
            "ratio_to_token_bytes": round(slope / tb, 4) if tb else None, "pts": pts}


def plots(series, fit, out_dir):
    # the PNG files written (matplotlib, Agg)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if fit:
        xs = [x for x, _ in fit["pts"]]
        ys = [y for _, y in fit["pts"]]
        ax.plot(xs, ys, ".", label="KV in pool blocks (measured)")
        top = max(xs)
        ax.plot([0, top], [fit["intercept_bytes"], fit["intercept_bytes"] + fit["fitted_bytes_per_token"] * top], "-",
                label="fit: %.1f B/token" % fit["fitted_bytes_per_token"])
        if fit["token_bytes"]:
            ax.plot([0, top], [0, fit["token_bytes"] * top], "--", label="token_bytes (budget): %d B/token" % fit["token_bytes"])
        if fit["kv_bytes_per_token"]:
            ax.plot([0, top], [0, fit["kv_bytes_per_token"] * top], ":",
                    label="kv_bytes_per_token (2LHDb): %d B/token" % fit["kv_bytes_per_token"])
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no KV rows before eviction in this log", ha="center", transform=ax.transAxes)
    ax.set_xlabel("tokens cached")
    ax.set_ylabel("bytes")
    ax.set_title("KV bytes against tokens")
    written.append(_save(fig, out_dir, "kv_bytes.png"))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if series["pool"]:
        ts = [t / 1000.0 for t, _, _ in series["pool"]]
        ax.plot(ts, [u for _, u, _ in series["pool"]], label="pool blocks used")
        ax.plot(ts, [h for _, _, h in series["pool"]], "--", label="high water")
    if series["seq"]:
        ax2 = ax.twinx()
        ax2.plot([t / 1000.0 for t, _ in series["seq"]], [s.get("cached", 0) for _, s in series["seq"]], "g:",
                 label="KV tokens cached")
        ax2.set_ylabel("tokens")
        ax2.legend(loc="lower right")
    ax.set_xlabel("board time (s)")
    ax.set_ylabel("blocks")
    ax.set_title("pool occupancy")
    ax.legend(loc="upper left")
    written.append(_save(fig, out_dir, "pool.png"))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in sorted(series["tier"].items()):
        ax.plot([t / 1000.0 for t, _ in pts], [v for _, v in pts], label=name)
    if series["tier"]:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no bandwidth rows in this log (no tracker on the board)", ha="center", transform=ax.transAxes)
    ax.set_xlabel("board time (s)")
    ax.set_ylabel("MB/s")
    ax.set_title("bandwidth per tier")
    written.append(_save(fig, out_dir, "bandwidth.png"))
    plt.close(fig)
    return written


def _save(fig, out_dir, name):
    p = os.path.join(out_dir, name)
    try:
        fig.savefig(p, dpi=90)
    except OSError as e:
        raise UserError("%s cannot be written: %s" % (p, e.strerror or e)) from None
    return p


def main(log, out_dir=None, as_json=False):
    frames = load(log)
    out_dir = out_dir or (os.path.dirname(os.path.abspath(log)))
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError("--out %s is not a folder" % out_dir, 2)
    if not os.path.isdir(out_dir):
        parent = os.path.dirname(os.path.abspath(out_dir))
        if not os.path.isdir(parent):
            raise UserError("--out %s: folder %s does not exist" % (out_dir, parent), 2)
        os.mkdir(out_dir)
    trace, series = build(frames)
    tp = os.path.join(out_dir, "trace.json")
    try:
        with open(tp, "w") as f:
            json.dump(trace, f)
    except OSError as e:
        raise UserError("%s cannot be written: %s" % (tp, e.strerror or e)) from None
    fit = kv_fit(series)
    pngs = plots(series, fit, out_dir)
    res = {"frames": len(frames), "trace": tp, "trace_events": len(trace["traceEvents"]), "plots": pngs,
           "kv_fit": {k: v for k, v in fit.items() if k != "pts"} if fit else None}
    if as_json:
        print(json.dumps(res, indent=1, sort_keys=True))
    else:
        print("trace: %d frames -> %s (%d events; open it in ui.perfetto.dev)" % (len(frames), tp, res["trace_events"]))
        for p in pngs:
            print("plot:  %s" % p)
        if fit:
            print("kv:    fitted %.1f B/token over %d reports up to %d tokens; token_bytes %d (budget's cache_bytes_per_token), "
                  "kv_bytes_per_token %d" % (fit["fitted_bytes_per_token"], fit["points"], fit["tokens_max"],
                                             fit["token_bytes"], fit["kv_bytes_per_token"]))
    return res
