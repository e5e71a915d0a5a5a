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
# A line that is no frame (not UTF-8, not JSON, a field of the wrong type, the last line
# cut off by a monitor stopped mid-write) is skipped and counted: every good frame is
# used, the count goes to --json (skipped_lines, cut_last_line) and one stderr line.
#
# Board time: the frames' ms (the console unwraps the board's wrap at 10**9 ms). A board
# that restarts starts again at 0; its frames are laid after the previous run's (an
# offset per run, from the console's "restart": true marks), so one trace shows every run.
import json
import math
import os
import sys

from host import paths
from host.console import frame_rows
from host.errors import UserError

PID = 1  # the board's process in the trace
TID_REQUESTS = 1000  # the requests track
TID_EVENTS = 1001  # instants


_BIG = 1 << 64  # a counter beyond this is no board's (u32 times, varint counters)
_SEQ_MAX = 0xFFFF
_ROWS = (("seq", "slot", ("cached", "length", "blocks")), ("tier", "tier", ("kb",)), ("task", "slot", ("run_ms",)))
_RECS = (("core", ("tokens", "tok_s_x10")), ("pool", ("used", "high_water")), ("heap", ("free",)), ("dma", ("depth",)),
         ("temp", ("deci_c",)))
_LAYOUT_INTS = ("pool.block_bytes", "kv.kv_bytes_per_token", "kv.token_bytes")


class BadLine(ValueError):
    # a JSONL line that is no telemetry frame trace can use (the message says why)
    pass


def _finite(text):
    # json's parse_float: a finite number (1e999 is no board's)
    v = float(text)
    if not math.isfinite(v):
        raise BadLine("a number out of range (%s)" % text)
    return v


def _constant(name):
    # json's parse_constant: NaN / Infinity are not JSON a board's log holds
    raise BadLine("%s is not a number a frame holds" % name)


def _is_int(v, lo=0, hi=_BIG):
    return v.__class__ is int and lo <= v < hi


def _is_num(v):
    return v.__class__ in (int, float) and -_BIG < v < _BIG


def _decimal(v):
    # a layout value that is a whole number: its digits as text (the console's) or an int
    return _is_int(v) or (isinstance(v, str) and v.isascii() and v.isdigit())


def _check_fields(d, fields, what):
    for k in fields:
        if k in d and not _is_num(d[k]):
            v = d[k]
            if v.__class__ in (int, float):
                raise BadLine("%s.%s is %g: out of range" % (what, k, v))
            raise BadLine("%s.%s is %s, not a number" % (what, k, _kind(v)))


def _kind(v):
    return "null" if v is None else type(v).__name__


def check_frame(d):
    # d (a JSON value) as a frame build() can read; BadLine naming the first wrong field.
    # Only the fields trace uses are checked: a later console's extra fields pass.
    if not isinstance(d, dict):
        raise BadLine("a JSON %s, not a frame object" % _kind(d))
    kind = d.get("type")
    if not isinstance(kind, str):
        raise BadLine("no frame type" if kind is None else "type is %s, not text" % _kind(kind))
    if not _is_int(d.get("ms"), 0):
        raise BadLine("no board time ms" if d.get("ms") is None else "ms is %r, not a whole number >= 0" % (d["ms"],))
    if "seq" in d and not _is_int(d["seq"], 0, _SEQ_MAX + 1):
        raise BadLine("seq is %r, not 0..%d" % (d["seq"], _SEQ_MAX))
    if kind == "layout":
        lay = d.get("layout", {})
        if not isinstance(lay, dict):
            raise BadLine("layout is %s, not an object" % _kind(lay))
        for k, v in lay.items():
            if k.startswith(("task.", "tier.")) and k.count(".") == 1:
                if not _decimal(k.split(".")[1]):
                    raise BadLine("layout key %r: not a slot number" % k)
                if not isinstance(v, str):
                    raise BadLine("layout %s is %s, not a name" % (k, _kind(v)))
            elif k in _LAYOUT_INTS and v not in ("", None) and not _decimal(v):
                raise BadLine("layout %s is %r, not a whole number" % (k, v))
            elif k in ("board", "firmware") and not isinstance(v, str):
                raise BadLine("layout %s is %s, not text" % (k, _kind(v)))
    elif kind == "periodic":
        for name, fields in _RECS:
            r = d.get(name)
            if r:  # build skips an absent or empty record
                if not isinstance(r, dict):
                    raise BadLine("%s is %s, not an object" % (name, _kind(r)))
                _check_fields(r, fields, name)
        for name, key, fields in _ROWS:
            rows = d.get(name + "s")
            if rows is None:
                rows = [d[name]] if isinstance(d.get(name), dict) else []
            if not isinstance(rows, list):
                raise BadLine("%ss is %s, not a list" % (name, _kind(rows)))
            for r in rows:
                if not isinstance(r, dict):
                    raise BadLine("a %s row is %s, not an object" % (name, _kind(r)))
                if key not in r:
                    raise BadLine("a %s row without its %s" % (name, key))
                if not _is_int(r[key]):
                    raise BadLine("a %s row's %s is %r, not a whole number >= 0" % (name, key, r[key]))
                _check_fields(r, fields, name)
    elif kind == "event":
        evs = d.get("events", [])
        if not isinstance(evs, list):
            raise BadLine("events is %s, not a list" % _kind(evs))
        for e in evs:
            if not isinstance(e, dict):
                raise BadLine("an event is %s, not an object" % _kind(e))
            if "event" in e and not isinstance(e["event"], str):
                raise BadLine("an event's name is %s, not text" % _kind(e["event"]))
            if "ms" in e and not _is_num(e["ms"]):
                raise BadLine("an event's ms is %s, not a number" % _kind(e["ms"]))
            if isinstance(e.get("request"), (list, dict)):
                raise BadLine("an event's request is %s, not a number" % _kind(e["request"]))
    return d


def read(path):
    # (frames, skipped): the frames of a JSONL log, in order, and the lines skipped as
    # [(line number, why)] (not UTF-8, not JSON, not a frame, wrong field types; the last
    # line cut off: why starts with "cut off"). UserError (one line) when the file cannot
    # be read or holds no frame
    if os.path.exists(path):
        paths.regular_file(path, "log")  # a FIFO blocked the read forever
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UserError("%s cannot be read: %s" % (path, e.strerror or e), 2) from None
    frames = []
    skipped = []
    n = 0
    try:
        with f:
            for n, raw in enumerate(f, 1):
                cut = not raw.endswith(b"\n")  # only the last line can lack its newline
                line = raw.strip()
                if not line:
                    continue
                try:
                    d = json.loads(line.decode("utf-8"), parse_float=_finite, parse_constant=_constant)
                    frames.append(check_frame(d))
                except UnicodeDecodeError:
                    skipped.append((n, "cut off" if cut else "not UTF-8 text"))
                except BadLine as e:
                    skipped.append((n, str(e)))
                except (ValueError, RecursionError):
                    skipped.append((n, "cut off" if cut else "not a JSON line"))
    except OSError as e:
        raise UserError("%s cannot be read: %s" % (path, e.strerror or e), 2) from None
    if not frames:
        why = " (%d bad line%s skipped, line %d: %s)" % (len(skipped), "" if len(skipped) == 1 else "s", skipped[0][0],
                                                         skipped[0][1]) if skipped else ""
        raise UserError("%s holds no telemetry frames%s: give the log ./kv monitor --jsonl writes" % (path, why), 2)
    return frames, skipped


def load(path):
    # the frames of a JSONL log, in order (bad lines skipped: read() says which)
    return read(path)[0]


def skipped_note(path, skipped):
    # one line for stderr about the lines read() skipped, or None
    if not skipped:
        return None
    n, why = skipped[0]
    more = "" if len(skipped) == 1 else "; %d more" % (len(skipped) - 1)
    cut = "; the last line was cut off (a log still being written?)" if len(skipped) > 1 and skipped[-1][1] == "cut off" else ""
    return "trace: %s: skipped %d bad line%s, used every good frame (line %d: %s%s)%s" % (
        path, len(skipped), "" if len(skipped) == 1 else "s", n, why, more, cut)


def with_time(frames):
    # (t_ms, frame) with board time made monotonic across board restarts: a new time
    # segment starts at the frame the console marked "restart": true (the decoder's rules:
    # a boot layout at seq 0, the time or the seq going back; the board time's wrap at
    # 10**9 ms is no restart, and the console unwraps it), the new run's board time 0 laid
    # a second after the last frame before it; in a log without the marks (an older
    # console's), at a step back in board time of more than 60 s
    return [(t, f) for t, f, _ in _timed(frames)]


def _timed(frames):
    # (t_ms, frame, new_run) as with_time; new_run: the frame starts a new time segment
    out = []
    offset = 0
    last = None
    for f in frames:
        ms = f.get("ms", 0)
        new = last is not None and (f.get("restart") is True or ms + offset < last - 60000)
        if new and f.get("restart") is True:
            offset = last + 1000  # the new run's time 0
        elif new:  # time went back: a new run of the board
            offset = last + 1000 - ms
        t = ms + offset
        last = max(t, last or 0)
        out.append((t, f, new))
    return out


_MOD = 10 ** 9  # run_ms and kb are sent modulo 10**9 (firmware_py/telemetry.MS_WRAP)


def _delta(value, prev):
    # value - prev for a counter sent modulo 10**9: a step back by more than half of it
    # is its wrap; a smaller one (a task respawned in the slot, a counter that started
    # again) is no difference: None
    dv = value - prev
    if dv < 0:
        return dv % _MOD if -dv > _MOD // 2 else None
    return dv


def build(frames):
    # (trace dict, series dict) from the frames
    tf = _timed(frames)
    layout = {}
    ev = []
    names = {}  # task slot -> name (latest layout)
    prev_task = {}  # slot -> (t, run_ms)
    prev_tier = {}  # tier -> (t, kb)
    tier_names = {}
    series = {"pool": [], "seq": [], "tier": {}, "tokens": [], "layout": {}}
    open_req = {}
    for t, f, new_run in tf:
        if new_run:  # the board's counters started again: no rate across the restart
            prev_task.clear()
            prev_tier.clear()
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
            for s in frame_rows(f, "seq"):
                ev.append({"ph": "C", "name": "kv seq %d" % s["slot"], "pid": PID, "ts": us,
                           "args": {"cached": s.get("cached", 0), "length": s.get("length", 0), "blocks": s.get("blocks", 0)}})
                series["seq"].append((t, s))
            for r in frame_rows(f, "tier"):
                tier = r["tier"]
                kb = r.get("kb", 0)
                pv = prev_tier.get(tier)
                prev_tier[tier] = (t, kb)
                dkb = _delta(kb, pv[1]) if pv is not None else None
                if dkb is not None and t > pv[0]:
                    mbs = dkb / (t - pv[0])  # kB per ms = MB/s
                    name = tier_names.get(tier, "tier%d" % tier)
                    ev.append({"ph": "C", "name": "bandwidth MB/s", "pid": PID, "ts": us, "args": {name: round(mbs, 3)}})
                    series["tier"].setdefault(name, []).append((t, mbs))
            d = f.get("dma")
            if d:
                ev.append({"ph": "C", "name": "dma depth", "pid": PID, "ts": us, "args": {"depth": d.get("depth", 0)}})
            tp = f.get("temp")
            if tp:
                ev.append({"ph": "C", "name": "temperature C", "pid": PID, "ts": us, "args": {"C": tp.get("deci_c", 0) / 10.0}})
            for r in frame_rows(f, "task"):
                slot = r["slot"]
                run = r.get("run_ms", 0)
                pv = prev_task.get(slot)
                prev_task[slot] = (t, run)
                d_run = _delta(run, pv[1]) if pv is not None else None
                if d_run is not None and t > pv[0]:
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
                  if "blocks" in s and s.get("cached") == s.get("length") and s.get("cached", 0) > 0})
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

    def finish(fig, ax, name, xlabel, ylabel, title):
        # label the axes, write the figure to out_dir/name and close it
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        written.append(_save(fig, out_dir, name))
        plt.close(fig)

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
    finish(fig, ax, "kv_bytes.png", "tokens cached", "bytes", "KV bytes against tokens")

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
    if series["pool"]:
        ax.legend(loc="upper left")
    elif not series["seq"]:
        ax.text(0.5, 0.5, "no pool or KV rows in this log", ha="center", transform=ax.transAxes)
    finish(fig, ax, "pool.png", "board time (s)", "blocks", "pool occupancy")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in sorted(series["tier"].items()):
        ax.plot([t / 1000.0 for t, _ in pts], [v for _, v in pts], label=name)
    if series["tier"]:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no bandwidth rows in this log (no tracker on the board)", ha="center", transform=ax.transAxes)
    finish(fig, ax, "bandwidth.png", "board time (s)", "MB/s", "bandwidth per tier")
    return written


def _save(fig, out_dir, name):
    p = os.path.join(out_dir, name)
    try:
        fig.savefig(p, dpi=90)
    except OSError as e:
        raise UserError("%s cannot be written: %s" % (p, e.strerror or e), 2) from None
    return p


OUT_FILES = ("trace.json", "kv_bytes.png", "pool.png", "bandwidth.png")  # what main writes into out_dir


def _ours(path):
    # True when path is a trace.json this module wrote (its otherData source), which may be
    # written again; a user's own file (or anything unreadable) is not
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and str((d.get("otherData") or {}).get("source", "")).startswith("kvrtos telemetry")


def main(log, out_dir=None, as_json=False, err=None):
    out_dir = out_dir or (os.path.dirname(os.path.abspath(log)))
    for name in OUT_FILES:  # a log named trace.json (or pool.png) was overwritten by its own trace
        p = os.path.join(out_dir, name)
        if os.path.exists(log) and os.path.exists(p) and os.path.samefile(p, log):
            raise UserError("the log %s would be overwritten by the %s written beside it: rename it or give --out DIR" % (log, name), 2)
    tp = os.path.join(out_dir, "trace.json")
    if os.path.exists(tp) and not _ours(tp):
        raise UserError("%s holds a trace.json that ./kv trace did not write: give --out DIR (it is kept)" % out_dir, 2)
    frames, skipped = read(log)
    paths.out_folder(out_dir)
    note = skipped_note(log, skipped)
    if note:
        print(note, file=err or sys.stderr)
    trace, series = build(frames)
    try:
        with open(tp, "w") as f:
            json.dump(trace, f)
    except OSError as e:
        raise UserError("%s cannot be written: %s" % (tp, e.strerror or e), 2) from None
    fit = kv_fit(series)
    pngs = plots(series, fit, out_dir)
    res = {"frames": len(frames), "trace": tp, "trace_events": len(trace["traceEvents"]), "plots": pngs,
           "skipped_lines": len(skipped), "cut_last_line": bool(skipped) and skipped[-1][1] == "cut off",
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
