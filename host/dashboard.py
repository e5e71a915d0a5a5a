# What the frames say, shown: the board's state as the console's frames update it
# (State: the latest figures, with the rates computed between reports), the plain
# status line, an event as text, and the dashboard (render), which fits the terminal
# it is drawn on: 80x24 shows what matters first (tok/s, the text's tail, pool and KV,
# the heap, the worst deadline, the last events, the tasks); a wider one adds the
# columns and a second column of detail (DMA, temperature, bandwidth); a taller one
# more text, events and rows. It is never taller than the terminal, so its last frame
# (drawn whole when the monitor ends) keeps the header on the screen.
import textwrap

from firmware_py import telemetry as tm
from firmware_py.sched.task import STATE_NAMES
from host.console import frame_rows

WIDE = 120  # columns from which the dashboard shows two columns


class State:
    # the latest figures from the frames seen, with rates (CPU %, MB/s, tok/s) computed
    # between successive reports of the same row, for the dashboard and the plain lines
    def __init__(self, events=12, text_chars=2000):
        self.layout = {}  # the latest layout frame's items
        self.ms = 0  # board time of the latest frame
        self.core = {}
        self.pool = {}
        self.heap = {}
        self.heap_least = None  # the least free heap reported since the console attached (bytes)
        self.kernel = {}
        self.temp = {}
        self.dma = {}
        self.seqs = {}  # slot -> row
        self.tasks = {}  # slot -> row + "name", "cpu_pct"
        self.tiers = {}  # tier -> row + "name", "mb_s"
        self.bwcats = {}  # (tier, category) -> row + "mb_s"
        self.events = []  # the last `events` events, newest last
        self.max_events = events
        self.text = ""  # generated text of the current (latest) request
        self.text_chars = text_chars
        self.request = None
        self.frames = 0
        self._prev = {}  # row key -> (ms, cumulative value)

    def _rate(self, key, ms, value, mod=None):
        # (value - previous) / (ms - previous ms) per ms, or None on the first report. A
        # field the board sends modulo mod (tm.MS_WRAP: run_ms, kb) that steps back by more
        # than half of it wrapped: its difference is taken modulo mod. A smaller step back
        # is no wrap (a task respawned in the slot, a counter that started again): None
        prev = self._prev.get(key)
        self._prev[key] = (ms, value)
        if prev is None or ms <= prev[0]:
            return None
        dv = value - prev[1]
        if dv < 0:
            if mod is None or -dv <= mod // 2:
                return None
            dv %= mod
        return dv / (ms - prev[0])

    def name(self, kind, i):
        return self.layout.get("%s.%d" % (kind, i), "%s%d" % (kind, i))

    def update(self, f):
        self.frames += 1
        ms = f.get("ms", 0)
        if f.get("restart"):
            # the board restarted (the decoder's rules: its boot layout at seq 0, its time
            # or its seq going back): its counters started again, so rates start again,
            # and the old run's rows (their rates) are gone until the new run reports them
            self._prev = {}
            for rows in (self.seqs, self.tasks, self.tiers, self.bwcats):
                rows.clear()
        self.ms = ms
        kind = f.get("type")
        if kind == "layout":
            self.layout = f.get("layout", {})
            for slot in list(self.tasks):
                if "task.%d" % slot not in self.layout:
                    del self.tasks[slot]  # the slot was released
                else:
                    self.tasks[slot]["name"] = self.name("task", slot)
                    self._prev.pop(("task", slot), None)  # maybe another task now
        elif kind == "text":
            if f.get("request") != self.request:
                self.request = f.get("request")
                self.text = ""
            self.text = (self.text + f.get("text", ""))[-self.text_chars:]
        elif kind == "event":
            for e in f.get("events", []):
                self.events.append(e)
                if e.get("event") == "start":
                    self.request = e.get("request")
                    self.text = ""
            del self.events[:-self.max_events]
        elif kind == "periodic":
            for key in ("core", "pool", "heap", "kernel", "temp", "dma"):
                if key in f:
                    setattr(self, key, f[key])
            if "heap" in f:
                fr = f["heap"].get("free", 0)
                self.heap_least = fr if self.heap_least is None else min(self.heap_least, fr)
            for row in f.get("seqs", []):
                self.seqs[row["slot"]] = row
            for row in f.get("tasks", []):
                slot = row["slot"]
                r = dict(row, name=self.name("task", slot))
                rate = self._rate(("task", slot), ms, row.get("run_ms", 0), tm.MS_WRAP)
                old = self.tasks.get(slot, {})
                r["cpu_pct"] = 100.0 * rate if rate is not None else old.get("cpu_pct")
                self.tasks[slot] = r
            for row in frame_rows(f, "tier"):
                t = row["tier"]
                r = dict(row, name=self.name("tier", t))
                rate = self._rate(("tier", t), ms, row.get("kb", 0), tm.MS_WRAP)
                r["mb_s"] = rate if rate is not None else self.tiers.get(t, {}).get("mb_s")  # kB/ms = MB/s
                self.tiers[t] = r
            for row in frame_rows(f, "bwcat"):
                key = (row["tier"], row["category"])
                r = dict(row, name="%s/%s" % (self.name("tier", key[0]), self.name("cat", key[1])))
                rate = self._rate(("bwcat",) + key, ms, row.get("kb", 0), tm.MS_WRAP)
                r["mb_s"] = rate if rate is not None else self.bwcats.get(key, {}).get("mb_s")
                self.bwcats[key] = r

    def line(self):
        # one plain status line
        c, p = self.core, self.pool
        parts = ["t=%.1fs" % (self.ms / 1000.0)]
        if c:
            parts.append("tokens %d (%.1f tok/s)" % (c.get("tokens", 0), c.get("tok_s_x10", 0) / 10.0))
        for slot, s in sorted(self.seqs.items()):
            parts.append("kv[%d] %d/%d cached, %d evicted" % (slot, s.get("cached", 0), s.get("cap", 0), s.get("evictions", 0)))
        if p:
            parts.append("pool %d/%s blocks (high %d)" % (p.get("used", 0), self.layout.get("pool.blocks", "?"), p.get("high_water", 0)))
        if self.heap:
            parts.append("heap free %d" % self.heap.get("free", 0))
        for t in sorted(self.tasks.values(), key=lambda r: r["slot"]):
            if t.get("cpu_pct") is not None:
                parts.append("%s %.0f%%" % (t["name"], t["cpu_pct"]))
        for t in sorted(self.tiers.values(), key=lambda r: r["tier"]):
            if t.get("mb_s") is not None:
                parts.append("%s %.2f MB/s" % (t["name"], t["mb_s"]))
        if self.dma:
            parts.append("dma depth %d" % self.dma.get("depth", 0))
        if self.temp:
            parts.append("%.1f C" % (self.temp.get("deci_c", 0) / 10.0))
        return " | ".join(parts)


def event_line(e, state=None):
    # one event as text
    name = e.get("event", "?")
    args = ", ".join("%s %s" % (k, v) for k, v in e.items() if k not in ("event", "ms") and not k.startswith("_"))
    if state is not None and name in ("fault", "deadline_miss", "watchdog") and isinstance(e.get("task"), int):
        args = "%s (%s)" % (args, state.name("task", e["task"]))
    return "t=%.1fs %s: %s" % (e.get("ms", 0) / 1000.0, name, args)


def render(state, counts=None, board_text=(), title="kvrtos telemetry", width=80, height=24):
    # the dashboard as a rich renderable of at most height - 1 lines of width columns
    from rich.console import Group
    from rich.table import Table

    width = max(1, int(width))
    avail = max(1, int(height) - 1)  # the line under it: the cursor's (and the monitor's last newline)
    head = _crop(_header(state, counts, title), width, "bold")
    if avail < 2:
        return Group(head)  # a terminal of two lines or fewer: the header alone
    if width < WIDE:
        return Group(head, *_column(_sections(state, board_text, width, detail=False), avail - 1))
    lw = (width - 3) // 2
    rw = width - 3 - lw
    left = _column(_left(state, board_text, lw), avail - 1)
    right = _column(_right(state, rw), avail - 1)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=lw, no_wrap=True)
    grid.add_column(width=1, no_wrap=True)
    grid.add_column(width=rw, no_wrap=True)
    grid.add_row(Group(*left), Group(*(_txt("│") for _ in range(max(len(left), len(right))))), Group(*right))
    return Group(head, grid)


# --- the sections: (name, lines, least, keep): the lines in full; least: shown at all only
# with that many; keep "head" shows the first lines when cropped, "tail" the last (text,
# events: the newest). Their order is their priority
def _sections(state, board_text, width, detail):
    out = [("vitals", [_crop(s, width) for s in _vitals(state, width)], 1, "head"),
           ("text", _text_lines(state, width), 3, "tail"),
           ("events", _event_lines(state, width), 3, "tail"),
           ("tasks", _task_lines(state, width), 3, "head")]
    if detail:
        out.append(("detail", _detail_lines(state, width), 2, "head"))
    if board_text:
        out.append(("board", [_rule("board text", width)] + [_crop(s, width) for s in board_text], 2, "tail"))
    return out


def _left(state, board_text, width):
    out = [("text", _text_lines(state, width), 3, "tail"), ("events", _event_lines(state, width), 3, "tail")]
    if board_text:
        out.append(("board", [_rule("board text", width)] + [_crop(s, width) for s in board_text], 2, "tail"))
    return out


def _right(state, width):
    return [("vitals", [_crop(s, width) for s in _vitals(state, width)], 1, "head"),
            ("tasks", _task_lines(state, width), 3, "head"),
            ("detail", _detail_lines(state, width), 2, "head")]


# the lines of the sections that fit `avail` lines: each section in priority order gets
# its least (or is left out), then the room left goes first to the text and events (up to
# FIRST lines each, their titles in), then to each other section in order, in full, and
# what is left to the text
FIRST = {"text": 7, "events": 5}


def _column(sections, avail):
    got = {}
    left = avail
    for name, lines, least, _ in sections:
        n = min(len(lines), least)
        if n and n <= left:
            got[name] = n
            left -= n
    order = [x for x in sections if x[0] != "text"] + [x for x in sections if x[0] == "text"]
    for first in (True, False):
        for name, lines, _, _ in sections if first else order:  # the rest: the text last (it takes what is left)
            if name not in got or (first and name not in FIRST):
                continue
            want = min(len(lines), FIRST[name]) if first else len(lines)
            more = min(left, want - got[name])
            if more > 0:
                got[name] += more
                left -= more
    out = []
    for name, lines, _, keep in sections:
        n = got.get(name, 0)
        if not n:
            continue
        if n >= len(lines):
            out += lines
        elif keep == "tail":
            out += [lines[0]] + lines[len(lines) - n + 1:]  # the rule, then the newest
        else:
            out += lines[:n]
    return out


def _header(state, counts, title):
    c = state.core
    parts = [title, "t=%.1f s" % (state.ms / 1000.0)]
    if c:
        parts.append("%.1f tok/s" % (c.get("tok_s_x10", 0) / 10.0))
        parts.append("tokens %d" % c.get("tokens", 0))
        parts.append("requests %d" % c.get("requests", 0))
    if counts:
        parts.append("frames good %d corrupt %d dropped %d skipped %d" % (
            counts.get("good", 0), counts.get("corrupt", 0), counts.get("dropped", 0), counts.get("skipped", 0)))
    return "  ".join(parts)


def _vitals(state, width):
    # pool and heap, the KV sequences, the worst deadline, the longest slice: what a glance
    # needs, each an item of its own, packed into lines of at most width columns (an item
    # wider than that is cropped on a line of its own), so a narrow column loses none
    items = []
    p, h = state.pool, state.heap
    if p:
        total = int(state.layout.get("pool.blocks", 0) or 0)
        items.append("pool blocks %s %d/%s, high %d, refused %d" % (
            _bar(p.get("used", 0), total, 10), p.get("used", 0), total or "?", p.get("high_water", 0), p.get("failed", 0)))
    if h:
        items.append("heap free %s of %s B" % (_n(h.get("free", 0)), _n(h.get("free", 0) + h.get("alloc", 0))))
        if state.heap_least is not None:
            items.append("least free %s B" % _n(state.heap_least))
    items += ["KV seq %d %d/%d (evicted %d)" % (slot, s.get("cached", 0), s.get("cap", 0), s.get("evictions", 0))
              for slot, s in sorted(state.seqs.items())]
    tasks = list(state.tasks.values())
    if tasks:
        worst = max(tasks, key=lambda t: (t.get("misses", 0), t.get("max_lat_us", 0)))
        slice_ = max(tasks, key=lambda t: t.get("max_slice_us", 0))
        misses = sum(t.get("misses", 0) for t in tasks)
        if misses:
            items.append("deadlines: %d missed, worst %s (%d, latency up to %s us)" % (
                misses, worst["name"], worst.get("misses", 0), _n(worst.get("max_lat_us", 0))))
        else:
            items.append("deadlines: none missed (latency up to %s us: %s)" % (_n(worst.get("max_lat_us", 0)), worst["name"]))
        items.append("longest slice %s us: %s" % (_n(slice_.get("max_slice_us", 0)), slice_["name"]))
    out = []
    for it in items:
        if out and len(out[-1]) + 2 + len(it) <= width:
            out[-1] += "  " + it
        else:
            out.append(it)
    return out


def _text_lines(state, width):
    rows = []
    for para in (state.text.rstrip("\n") or "(no text yet)").split("\n"):
        rows += textwrap.wrap(para, width, replace_whitespace=False, drop_whitespace=False) or [""]
    return [_rule("generated text (request %s)" % state.request, width)] + [_txt(r[:width]) for r in rows]


def _event_lines(state, width):
    ev = [_crop(event_line(e, state), width) for e in state.events] or [_txt("(none)")]
    return [_rule("recent events", width)] + ev


def _task_lines(state, width):
    # tasks, those that missed first, then the busiest (now, then in all): name, state, CPU %, misses, and as the
    # width allows latency, slice, prio, faults
    # the columns that fit, in this order (the name, state, CPU % and misses always)
    cols = [("task", 12, "<"), ("state", 8, "<"), ("CPU %", 6, ">"), ("misses", 7, ">")]
    for extra in (("lat us", 8, ">"), ("slice us", 9, ">"), ("prio", 5, ">"), ("faults", 7, ">")):
        if sum(w + 1 for _, w, _ in cols) + extra[1] <= width:
            cols.append(extra)
    out = [_rule("tasks", width), _crop(" ".join(_cell(n, w, a) for n, w, a in cols), width, "bold")]
    rows = sorted(state.tasks.values(), key=lambda t: (-t.get("misses", 0), -(t.get("cpu_pct") or 0), -t.get("run_ms", 0), t["slot"]))
    for t in rows:
        st = t.get("state", 0)
        every = {"task": t["name"], "state": STATE_NAMES[st] if 0 <= st < len(STATE_NAMES) else str(st),
                 "CPU %": "-" if t.get("cpu_pct") is None else "%.1f" % t["cpu_pct"], "misses": str(t.get("misses", 0)),
                 "lat us": _n(t.get("max_lat_us", 0)), "slice us": _n(t.get("max_slice_us", 0)),
                 "prio": str(t.get("prio", "")), "faults": str(t.get("faults", 0))}
        vals = [every[n] for n, _, _ in cols]
        out.append(_crop(" ".join(_cell(v, w, a) for v, (_, w, a) in zip(vals, cols, strict=True)), width,
                         "red" if t.get("misses", 0) else None))
    return out


def _detail_lines(state, width):
    # the rest: DMA, temperature, the memory tiers' bandwidth and its categories
    out = [_rule("memory and bandwidth", width)]
    kvb = int(state.layout.get("kv.kv_bytes_per_token", 0) or 0)
    bb = int(state.layout.get("pool.block_bytes", 0) or 0)
    for slot, s in sorted(state.seqs.items()):
        out.append(_crop("KV seq %d: length %d, %d blocks = %s B (KV %s B)" % (
            slot, s.get("length", 0), s.get("blocks", 0), _n(s.get("blocks", 0) * bb), _n(s.get("cached", 0) * kvb)),
            width))
    if state.dma:
        d = state.dma
        out.append(_crop("DMA queue %d/%s, max %d, in flight %d, stalls %d" % (
            d.get("depth", 0), state.layout.get("dma.slots", "?"), d.get("max_depth", 0), d.get("in_flight", 0),
            d.get("stalls", 0)), width))
    if state.temp:
        tp = state.temp
        out.append(_crop("temperature %.1f C, %s, peak %.1f C" % (
            tp.get("deci_c", 0) / 10.0, _thermal_name(tp.get("state", 0)), tp.get("peak_deci_c", 0) / 10.0), width))
    for t in sorted(state.tiers.values(), key=lambda r: r["tier"]):
        out.append(_crop("%s %s MB/s, util %.1f %%, %.1f MB, waits %d" % (
            t["name"], "-" if t.get("mb_s") is None else "%.2f" % t["mb_s"], t.get("util_permille", 0) / 10.0,
            t.get("kb", 0) / 1000.0, t.get("waits", 0)), width))
    for key in sorted(state.bwcats):
        r = state.bwcats[key]
        out.append(_crop("  %s %s MB/s, util %.1f %%, %.1f MB, waits %d" % (
            r["name"], "-" if r.get("mb_s") is None else "%.2f" % r["mb_s"], r.get("util_permille", 0) / 10.0,
            r.get("kb", 0) / 1000.0, r.get("waits", 0)), width))
    return out if len(out) > 1 else []


def _cell(v, w, align):
    return v[:w].ljust(w) if align == "<" else v[:w].rjust(w)


def _txt(s, style=None):
    from rich.text import Text

    return Text(s, style=style or "", no_wrap=True, overflow="crop")


def _crop(s, width, style=None):
    # one line of at most width cells ("..." where cut)
    t = _txt(s, style)
    t.truncate(width, overflow="ellipsis")
    return t


def _rule(title, width):
    s = "── %s " % title
    return _txt((s + "─" * max(0, width - len(s)))[:width], "dim")


def _n(v):
    return "{:,}".format(v) if isinstance(v, int) else str(v)


def _thermal_name(st):
    return ("normal", "shrink", "slow")[st] if 0 <= st < 3 else str(st)


def _bar(n, total, width=20):
    if not total:
        return ""
    k = max(0, min(width, round(width * n / total)))
    return "[" + "#" * k + "." * (width - k) + "]"
