# `./kv sweep`'s results: a row per point (its settings, figures and whether it meets the
# targets), the best per board, and the files in --out: results.csv, results.md (best
# first), results.png and summary.json (docs/sweep.md).
import csv
import json
import os
import time

from host import paths
from host.sweepcache import METRICS, ignore_folder
from host.sweepgrid import NO_WINDOW_POLICIES

# MicroPython costs (viper, bytecode): tok/s and deadline misses again at each end of the
# board-speed band (emulate.band), empty for the other costs
BAND = ("tok_s_slow", "deadline_misses_slow", "tok_s_fast", "deadline_misses_fast")
COLUMNS = ("board", "model", "policy", "window", "kv_dtype", "scenario", "cost", "tokens_requested", "seed") + \
    ("status",) + METRICS + BAND + ("meets_target", "why_not", "key")


def default_out():
    return paths.state("sweeps", time.strftime("%Y%m%d-%H%M%S"))


def _total_misses(v):
    # the report's deadline misses as one integer (a number, or {"total": n, ...})
    if isinstance(v, dict):
        if "total" in v:
            return v["total"]
        return sum(x for x in v.values() if isinstance(x, int))
    return v


def row_of(point, key, entry, targets):
    # one table row: the point's settings (as normalized), its metrics and the verdict
    norm = point["norm"]
    row = {c: None for c in COLUMNS}
    for c in ("board", "model", "policy", "window", "kv_dtype", "scenario", "cost", "seed"):
        v = norm.get(c)
        if c in ("model", "scenario", "board") and isinstance(v, str) and os.path.isabs(v):
            v = short_path(v)
        if c == "scenario":
            v = _scenario_name(v)
        row[c] = v
    if norm.get("policy") in NO_WINDOW_POLICIES:
        row["window"] = None
    row["tokens_requested"] = norm.get("tokens")
    row["status"] = entry["status"]
    row["key"] = key[:16]
    if entry["status"] == "ok":
        rep = entry["report"]
        for m in METRICS:
            row[m] = _total_misses(rep.get(m)) if m == "deadline_misses" else rep.get(m)
        for end, b in (rep.get("band") or {}).items():
            if end in ("slow", "fast"):
                row["tok_s_" + end] = b["tok_s"]
                row["deadline_misses_" + end] = b["deadline_misses"]
        why = []
        if targets.get("ms_per_token") is not None and not (_num(row["ms_per_token"]) <= targets["ms_per_token"]):
            why.append("ms/token %s > %s" % (row["ms_per_token"], targets["ms_per_token"]))
        if targets.get("kv_bytes") is not None and not (_num(row["kv_bytes"]) <= targets["kv_bytes"]):
            why.append("KV %s B > %s B" % (row["kv_bytes"], targets["kv_bytes"]))
        if _num(row["deadline_misses"]) > 0:
            why.append("%s deadline misses" % row["deadline_misses"])
        elif (row["deadline_misses_slow"] or 0) > 0:  # the audio must still hold on a slow board
            why.append("%s deadline misses at the slow end of the board-speed band" % row["deadline_misses_slow"])
        if row["tokens"] is not None and row["tokens_requested"] is not None and row["tokens"] < row["tokens_requested"]:
            why.append("%s of %s tokens%s" % (row["tokens"], row["tokens_requested"],
                                             " (%s)" % rep["stop"] if rep.get("stop") else ""))
        inv = rep.get("invariants")
        if isinstance(inv, dict) and inv.get("ok") is False:
            # deadline misses are a result (said above), not a broken emulator
            bad = sorted(k for k, v in inv.items() if isinstance(v, dict) and v.get("ok") is False and k != "deadlines")
            if bad:
                why.append("emulator invariants not met: %s" % ", ".join(bad))
        if not _num(row["ms_per_token"]) > 0:
            why.append("no ms per token")
        row["meets_target"] = not why
        row["why_not"] = "; ".join(why)
    else:
        row["meets_target"] = False
        row["why_not"] = no_machine_paths(str(entry.get("error", "failed")))
    return row


def no_machine_paths(text):
    # a one-line reason as the tables show it: the repository's and ../shared's folders left out
    shared = os.path.dirname(paths.shared_models() or os.path.join(os.path.dirname(paths.ROOT), "shared", "models"))
    for base, label in ((paths.ROOT + os.sep, ""), (shared + os.sep, "shared/")):
        text = text.replace(base, label)
    return text


def _scenario_name(v):
    # a scenario as the table shows it: its name when it is scenarios/NAME.json, "none" for none
    if not v:
        return "none"
    if v.startswith("scenarios/") and v.endswith(".json") and v.count("/") == 1:
        return v[len("scenarios/"):-len(".json")]
    return v


def _num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else float("inf")


def short_path(p):
    # a path as the table shows it: relative to the repository when inside it, else its name
    rel = os.path.relpath(p, paths.ROOT)
    if not rel.startswith(".."):
        return rel.replace(os.sep, "/")
    rel = os.path.relpath(p, os.path.dirname(paths.ROOT))
    return rel.replace(os.sep, "/") if not rel.startswith("..") else os.path.basename(p)


def _rank(r):
    # best first: meeting the target, then fewer ms per token, then fewer KV bytes
    return (not r["meets_target"], r["status"] != "ok", _num(r["ms_per_token"]), _num(r["kv_bytes"]), r["key"])


def best_per_board(rows):
    # {board: the best row's settings and figures}, boards in first-seen order
    out = {}
    for r in sorted(rows, key=_rank):
        if r["board"] not in out and r["status"] == "ok":
            out[r["board"]] = {c: r[c] for c in COLUMNS if c not in ("key", "board")}
    return out


# ---------------------------------------------------------------------------- writers


def cell(v):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "%.6g" % v
    return str(v)


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([cell(r[c]) for c in COLUMNS])


def markdown(rows, summary, command=None):
    # results.md: the targets, per board how many settings meet them and the best, then
    # every point best first, failed ones last with their reason
    t = summary["targets"]
    lines = ["# Sweep results", ""]
    if command:
        lines += ["Made by:", "", "```sh", command, "```", ""]
    tgt = []
    if t.get("ms_per_token") is not None:
        tgt.append("at most %s ms per token" % t["ms_per_token"])
    if t.get("kv_bytes") is not None:
        tgt.append("at most %s KV bytes" % t["kv_bytes"])
    tgt.append("no deadline miss of a co-running task, every requested token emitted")
    lines += ["Target: " + ", ".join(tgt) + ". Figures are the emulator's (host/emulate.py: the board "
              "profile's cost model on a virtual clock), estimates until the profile is calibrated on a board "
              "(each report's cost figures name their sources).", ""]
    skipped = ", ".join("%d: %s" % (n, r) for r, n in summary["skipped_reasons"].items())
    lines += ["%d points: %d meet the target, %d failed; %d combinations skipped%s." % (
        summary["points"], summary["meets_target"], summary["failed"], summary["skipped"],
        " (" + skipped + ")" if skipped else ""), ""]
    boards = []
    for r in rows:
        if r["board"] not in boards:
            boards.append(r["board"])
    lines += ["## Per board", "", "| board | points | meet the target | best setting | ms/token | tok/s | KV bytes |",
              "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for b in boards:
        mine = [r for r in rows if r["board"] == b]
        best = sorted(mine, key=_rank)[0]
        if best["status"] == "ok":
            setting = setting_text(best) + ("" if best["meets_target"] else " (misses: %s)" % best["why_not"])
        else:
            setting = "(every point failed: %s)" % best["why_not"]
        lines.append("| %s | %d | %d | %s | %s | %s | %s |" % (
            b, len(mine), sum(bool(r["meets_target"]) for r in mine), setting.replace("|", "\\|"),
            cell(best["ms_per_token"]), cell(best["tok_s"]), cell(best["kv_bytes"])))
    cols = ("board", "model", "policy", "window", "kv_dtype", "scenario", "cost", "tokens", "ms_per_token", "tok_s",
            "ttft_ms", "kv_bytes", "pool_high_water", "deadline_misses") + BAND + ("meets_target", "why_not")
    lines += ["", "## Every point, best first", "", "| " + " | ".join(c.replace("_", " ") for c in cols) + " |",
              "| " + " | ".join("---:" if c in METRICS or c in BAND else "---" for c in cols) + " |"]
    for r in sorted(rows, key=_rank):
        lines.append("| " + " | ".join(cell(r[c]).replace("|", "\\|") for c in cols) + " |")
    lines.append("")
    return "\n".join(lines)


def setting_text(r):
    parts = [r["policy"] + ("(%s)" % r["window"] if r["window"] is not None else ""), r["kv_dtype"], r["cost"]]
    if r["scenario"] and r["scenario"] != "none":
        parts.append(str(r["scenario"]))
    if r["model"]:
        parts.insert(0, os.path.basename(str(r["model"])))
    return " ".join(str(p) for p in parts)


def plot(rows, summary, path):
    # results.png: ms per token against KV bytes, one panel per board, the targets as
    # dashed lines; colour: KV element type, marker: cost kind, hollow: misses the target
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok" and _num(r["ms_per_token"]) > 0 and _num(r["kv_bytes"]) >= 0
          and _num(r["ms_per_token"]) != float("inf") and _num(r["kv_bytes"]) != float("inf")]
    boards = []
    for r in rows:
        if r["board"] not in boards:
            boards.append(r["board"])
    n = len(boards)
    ncol = min(n, 3)
    nrow = -(-n // ncol)
    fig, axs = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.8 * nrow), squeeze=False)
    dtypes = sorted({r["kv_dtype"] for r in ok})
    costs = sorted({r["cost"] for r in ok})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^v<>ph*"
    t = summary["targets"]
    for k, b in enumerate(boards):
        ax = axs[k // ncol][k % ncol]
        mine = [r for r in ok if r["board"] == b]
        for r in mine:
            c = colors[dtypes.index(r["kv_dtype"]) % len(colors)]
            m = markers[costs.index(r["cost"]) % len(markers)]
            ax.scatter([r["kv_bytes"]], [r["ms_per_token"]], marker=m, s=36,
                       facecolors=c if r["meets_target"] else "none", edgecolors=c)
        if not mine:
            ax.text(0.5, 0.5, "no point with figures", ha="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(b, fontsize=10)
            continue
        if t.get("ms_per_token") is not None:
            ax.axhline(t["ms_per_token"], color="grey", linestyle="--", linewidth=1)
        if t.get("kv_bytes") is not None:
            ax.axvline(t["kv_bytes"], color="grey", linestyle=":", linewidth=1)
        ys = [r["ms_per_token"] for r in mine]
        if ys and min(ys) > 0 and max(ys) / min(ys) > 30:
            ax.set_yscale("log")
        ax.set_title(b, fontsize=10)
        ax.set_xlabel("KV bytes")
        ax.set_ylabel("ms per token (emulated)")
    for k in range(n, nrow * ncol):
        axs[k // ncol][k % ncol].axis("off")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", linestyle="", color=colors[i % len(colors)], label="KV " + d)
               for i, d in enumerate(dtypes)]
    handles += [Line2D([], [], marker=markers[i % len(markers)], linestyle="", color="black", label="cost " + c)
                for i, c in enumerate(costs)]
    handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="none", color="black", label="misses the target"))
    if t.get("ms_per_token") is not None:
        handles.append(Line2D([], [], color="grey", linestyle="--", label="target ms/token"))
    if t.get("kv_bytes") is not None:
        handles.append(Line2D([], [], color="grey", linestyle=":", label="target KV bytes"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    left = sum(r["status"] == "ok" for r in rows) - len(ok)
    fig.suptitle("kv sweep: ms per token against KV bytes" + (" (%d failed, %d without figures: not drawn)" % (
        sum(r["status"] != "ok" for r in rows), left) if len(ok) < len(rows) else ""), fontsize=11)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * ((len(handles) - 1) // 6), 1, 0.95))
    fig.savefig(path, dpi=90, metadata={"Software": None})  # no version stamp: same rows, same bytes
    plt.close(fig)


def write(result, out_dir, command=None):
    # results.csv, results.md, results.png and summary.json into out_dir; their paths
    os.makedirs(out_dir, exist_ok=True)
    ignore_folder(out_dir)
    rows, summary = result["rows"], result["summary"]
    files = {n: os.path.join(out_dir, n) for n in ("results.csv", "results.md", "results.png", "summary.json")}
    write_csv(rows, files["results.csv"])
    with open(files["results.md"], "w") as f:
        f.write(markdown(rows, summary, command))
    plot(rows, summary, files["results.png"])
    doc = dict(summary, command=command, cache=None, rows=rows)  # no absolute paths in the committed files
    with open(files["summary.json"], "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    return files
