# `./kv bench scenarios [--json]`: every shipped scenario (scenarios/*.json) emulated at
# its defaults, as `./kv emulate --scenario S --json` runs it (the firmware's decode on a
# VirtualClock, the board's cost model, the scenario's tasks beside it), with both ends
# of the board-speed band (docs/calibration.md); then each scenario forced onto the
# bytecode float path (fp32 weights) with no slice bound, which must fail its deadlines
# and say why. Deterministic: the suite reruns it and compares the figures with
# docs/bench/scenarios.json (tests/test_bench_fresh.py), so a changed cost figure or
# scheduler that moves a scenario's promise fails until this page is regenerated.
from host import emulate as emu
from host import paths
from host.bench import emit
from host.errors import UserError

DETERMINISTIC = True  # VirtualClock figures: the suite reruns it against docs/bench/scenarios.json (tests/test_bench_fresh.py)
FORCED = {"weights": "fp32", "slice_us": 0}  # the float path in bytecode, one layer per slice


DECODE_TASKS = ("decode", "prefix")  # and chat_*: the tasks that run the decode (two-chats: a prefix, then a chat each)


def _emulate(opts):
    # ./kv emulate --json's report: the run, then the band's two ends
    rep = emu.run(opts)
    rep["band"] = emu.band(opts, rep)
    return rep


def _kind(rep):
    # the kind of kernel the run was priced by (fp32 weights under --cost viper run the bytecode float path)
    c = rep.get("cost")
    return (c.get("cpu") or {}).get("kind", rep["spec"]["cost"]) if isinstance(c, dict) else rep["spec"]["cost"]


def _row(name, rep):
    t = rep["tasks"]
    band = rep.get("band") or {}
    dec = [x["max_slice_us"] for n, x in t.items() if n in DECODE_TASKS or n.startswith("chat_")]
    return {"scenario": name, "board": rep["board"]["name"] if isinstance(rep.get("board"), dict) else rep.get("board"),
            "cost": _kind(rep), "weights": rep["spec"]["weights"], "kv_dtype": rep["spec"]["kv_dtype"],
            "slice_us": rep["spec"]["slice_us"], "tokens": rep["tokens"], "tok_s": rep["tok_s"],
            "ttft_ms": rep["ttft_ms"], "deadline_misses": rep["deadline_misses"],
            "misses_by_task": rep["deadline_misses_by_task"],
            "decode_max_slice_us": max(dec) if dec else None,
            "longest_slice_us": max(x["max_slice_us"] for x in t.values()),
            "slow_tok_s": band.get("slow", {}).get("tok_s"), "slow_misses": band.get("slow", {}).get("deadline_misses"),
            "fast_tok_s": band.get("fast", {}).get("tok_s"), "fast_misses": band.get("fast", {}).get("deadline_misses"),
            "verdict_ok": rep["verdict"]["ok"], "verdict": rep["verdict"]["line"]}


def measure():
    if not paths.shared_models():
        raise UserError("stories260K is not in ../shared/models: the scenarios decode it", 2)
    rows, forced = [], []
    for name in emu.scenario_names():
        rows.append(_row(name, _emulate(emu.spec_from_options(scenario=name))))
        forced.append(_row(name, _emulate(emu.spec_from_options(scenario=name, **FORCED))))
    return {"scenarios": rows, "forced": forced, "forced_options": FORCED,
            "command": "./kv emulate --scenario S --json (defaults); forced: --weights fp32 --slice-us 0"}


def run(as_json=False):
    # ./kv bench scenarios [--json]: print the figures (one JSON object with --json); returns them
    return emit(measure(), as_json, render)


TITLE = "Scenarios: every shipped scenario at its defaults, at both ends of the band"


def render(r):
    L = ["Each row is `./kv emulate --scenario S --json` at the scenario's defaults (scenarios/S.json): tok/s and the "
         "deadline misses of every task beside the decode, at the fitted board speed and at both ends of the band "
         "(docs/calibration.md: the slowest and the fastest published point of each emitter); the longest slice any "
         "task held the CPU. `./kv bench scenarios` reruns them; the suite compares every figure with this record.", "",
         "| scenario | board | cost | weights | KV | slice bound, us | tokens | tok/s | deadline misses | longest decode "
         "slice, us | slow end: tok/s, misses | fast end: tok/s, misses | verdict |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in r["scenarios"]:
        L.append("| %s | %s | %s | %s | %s | %s | %d | %s | %d | %s | %s, %s | %s, %s | %s |" % (
            x["scenario"], x["board"], x["cost"], x["weights"], x["kv_dtype"], "{:,}".format(x["slice_us"]), x["tokens"],
            x["tok_s"], x["deadline_misses"], "{:,}".format(x["decode_max_slice_us"] or 0), x["slow_tok_s"],
            x["slow_misses"], x["fast_tok_s"], x["fast_misses"], "ok" if x["verdict_ok"] else "fails"))
    L += ["", "Forced onto the bytecode float path with no slice bound (`%s`): a scenario with deadlines misses them "
          "and says why in one line (`./kv emulate` exits 1); one without (long-generation) only holds the CPU "
          "long:" % "--weights fp32 --slice-us 0", ""]
    for x in r["forced"]:
        L.append("- %s: %s deadline misses, the decode held the CPU up to %s us. `%s`" % (
            x["scenario"], "{:,}".format(x["deadline_misses"]), "{:,}".format(x["decode_max_slice_us"] or 0), x["verdict"]))
    return L
