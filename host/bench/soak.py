# `./kv bench soak [--json]`: the randomized soak (host/soak.py, `./kv soak`) at a fixed
# seed and run count, its counts for docs/benchmarks.md: runs, new tokens, distinct
# configurations, MemoryErrors, the largest heap drift (free heap after the 100th new
# token against after the last) and each failed run with the command that replays it.
from host import soak
from host.bench import emit

SEED = 1
RUNS = 24
WORKERS = 2
# the integer path (int8 weights and int8 KV: what `kv flash --model` puts on a board):
# the bytecode path decodes 4-10 tokens/s on the unix port, so a 2,000-token ring of it
# takes minutes a run; `./kv soak` without filters draws every path
FILTERS = {"weights": ["int8"], "kv_dtypes": ["int8"]}


def command():
    # the ./kv soak command that draws and runs the same runs
    return "./kv soak --seed %d --runs %d --workers %d%s" % (
        SEED, RUNS, WORKERS, "".join(" --%s %s" % (k.replace("_", "-"), ",".join(v)) for k, v in FILTERS.items()))


def run(as_json=False):
    r = soak.soak(seed=SEED, runs=RUNS, workers=WORKERS, filters=command()[len("./kv soak --seed %d --runs %d --workers %d" % (SEED, RUNS, WORKERS)):],
                  **FILTERS)
    r["command"] = command()
    return emit(r, as_json, render)


# --- the benchmark's section of docs/benchmarks.md (host/benchdoc.py calls these) ------
TITLE = "Randomized soak: the memory promise on the 32- and 64-bit MicroPython"


def _n(v):
    return "n/a" if v is None else "{:,}".format(v)


def _b(v):
    return "n/a" if v is None else "%s B" % "{:,}".format(v)


def render(r):
    # markdown lines of the section from the figures r
    L = [
        "The same runs as `%s` (`./kv soak`, docs/memory.md): each run boots the decoding firmware "
        "(`firmware_py/tools/soakrun.py`: `decode.run`, the `serve.Server` a board runs with an application config's "
        "tasks beside the decode, or a `Session` of chats sharing one pool) under the 32-bit or the 64-bit MicroPython "
        "unix port with the board's usable heap, drawn from its seed across boards, models, weights, KV types, "
        "policies, batch sizes and co-running tasks. A full policy is asked for more than its context and must stop "
        "with its one line; a ring policy decodes %s tokens. Drift = |free heap after the %dth new token - free heap "
        "after the last| (after a collection, `decode.HeapTrace`; with chats, each chat's own samples, the largest "
        "over the chats); the promise is at most one GC block (16 B on "
        "32-bit, 32 B on 64-bit). Spread = max - min of the free heap from that token on." % (
            r["command"], "{:,}".format(r["ring_tokens"]), soak.DRIFT_FROM),
        "",
        "| runs | new tokens | configurations | MemoryErrors | failed runs | largest heap drift | largest spread | wall |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        "| %d | %s | %d | %d | %d | %s B | %s B | %s s on %d workers |" % (
            r["runs"], _n(r["tokens"]), r["configurations"], r["memory_errors"], r["failed_runs"],
            _n(r["max_drift_bytes"]), _n(r["max_spread_bytes"]), r["wall_s"], r["workers"]),
        "",
        "| interpreter | runs | new tokens | GC block | largest drift | largest spread |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in sorted(r["by_interp"]):
        d = r["by_interp"][name]
        L.append("| %s | %d | %s | %d B | %s B | %s B |" % (name, d["runs"], _n(d["tokens"]), d["gc_block"],
                                                             _n(d["max_drift_bytes"]), _n(d.get("max_spread_bytes"))))
    L += ["", "Floor drop = the least free heap in the first half of those samples less the least in the second half "
          "(> 0: the heap in use grew).", "",
          "| seed | run | new tokens | drift | spread | floor drop | wall | result |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in r["rows"]:
        res = "ok" if not x["failures"] else "**failed**: %s (replay: `%s`)" % ("; ".join(x["failures"]), x["repro"])
        L.append("| %d | %s | %s | %s | %s | %s | %s s | %s |" % (
            x["seed"], x["config"], _n(x["tokens"]), _b(x["drift_bytes"]), _b(x["spread_bytes"]),
            _b(x.get("floor_drop_bytes")), x["wall_s"], res.replace("|", "\\|")))
    L.append("")
    L.append("Every run held the promise: %s." % ("yes" if r["ok"] else "**NO** (%d of %d runs failed)" % (r["failed_runs"], r["runs"])))
    return L
