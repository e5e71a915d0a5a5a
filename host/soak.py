# `./kv soak`: the board's memory promise tested the way a board would break it. Each run
# is drawn (seeded) across interpreters (the 32-bit MicroPython unix port, the ESP32-S3's
# word size, and the 64-bit one), boards (the microcontroller profiles whose heap holds a
# model), models (stories260K from ../shared/models when there, kvrtos-tiny; fp32 and
# their int8 q8row conversions), KV element types, policies, windows, batch sizes (chats
# sharing one pool) and the tasks of an application config running beside the decode
# (scenarios/*.json, examples/user-task). It boots the real decoding firmware under that
# interpreter with the board's usable heap (firmware_py/tools/soakrun.py: decode.run, the
# serve.Server a board runs with a config, or a Session of chats) and decodes: a full
# policy past its budget, a ring policy (window, sinks, h2o) at least 2,000 tokens (a
# batch of chats shares them: each chat decodes 2,000 / batch, still many windows past its
# budget). Every run must hold:
#   - no MemoryError (nor any other exception) and no refused boot where the budget rule
#     says the pool fits;
#   - full stops with its one line (decode.STOP ...), a ring decodes every token asked;
#   - the free heap does not grow with tokens: after the 100th new token it is within one
#     GC block (16 B on 32-bit, 32 B on 64-bit) of its value after the last (the samples:
#     decode.HeapTrace, the free heap after a collection after every token; chats: while
#     every chat decodes, up to the first one's last token); the spread of
#     the samples from the 100th token on is reported beside it.
# Run i of --seed K is drawn from seed K + i alone, so `--seed K+i --runs 1` (same
# filters) replays it; a failing run prints that command.
import concurrent.futures
import json
import os
import random
import subprocess
import sys
import time

from firmware_py import decode, kv, llama2c
from host import boards, mp32, paths
from host import interp as interp_mod
from host.errors import UserError

SCRIPT = os.path.join(paths.FIRMWARE, "tools", "soakrun.py")
CACHE = paths.state(".cache", "soak")  # int8 conversions of the models
RING_TOKENS = 2000  # tokens per sequence a ring policy decodes (at least)
FULL_EXTRA = 64  # a full policy is asked for its model's context + this: it must stop
DRIFT_FROM = 100  # heap samples from this new token on are held to the last one
INTERPS = ("micropython32", "micropython")
WEIGHTS = ("fp32", "int8")
WINDOWS = (16, 24, 32, 48, 64, 96, 128)
BATCH_WEIGHTS = {1: 6, 2: 3, 3: 1}  # batch sizes (chats sharing one pool) and how often each is drawn
TEMPERATURES = (0.0, 0.8)
LAYER_US = 2000  # virtual µs charged per layer where a VirtualClock runs (serve, chats)
RUN_TIMEOUT_S = 3600
TASK_CONFIGS = {  # application configs whose tasks run beside the decode ("none": decode alone)
    "none": None,
    "voice-assistant": os.path.join(paths.SCENARIOS, "voice-assistant.json"),
    "sensor-gateway": os.path.join(paths.SCENARIOS, "sensor-gateway.json"),
    "two-chats": os.path.join(paths.SCENARIOS, "two-chats.json"),
    "user-task": os.path.join(paths.ROOT, "examples", "user-task", "kvrtos.json"),
}
TINY = os.path.join(paths.MODELS, "kvrtos-tiny")


def models():
    # {name: (fp32 checkpoint, tokenizer)}: stories260K when ../shared/models has it, kvrtos-tiny
    out = {}
    d = paths.shared_models()
    if d and os.path.isfile(os.path.join(d, "stories260K.bin")) and os.path.isfile(os.path.join(d, "tok512.bin")):
        out["stories260K"] = (os.path.join(d, "stories260K.bin"), os.path.join(d, "tok512.bin"))
    out["kvrtos-tiny"] = (os.path.join(TINY, "model.bin"), os.path.join(TINY, "tokenizer.bin"))
    return out


def checkpoint(model, weights):
    # the checkpoint file for model (a models() name) with weights fp32 or int8 (q8row,
    # converted once into .cache/soak)
    src = models()[model][0]
    if weights == "fp32":
        return src
    from host import convert

    os.makedirs(CACHE, exist_ok=True)
    st = os.stat(src)
    q = os.path.join(CACHE, "%s-%d-%d.q8row.bin" % (model, st.st_size, int(st.st_mtime)))
    if not os.path.isfile(q):
        tmp = q + ".%d.tmp" % os.getpid()
        convert.convert(src, tmp, "q8row", 0)
        os.replace(tmp, q)
    return q


def mcu_boards():
    # every microcontroller profile (kind mcu) whose heap holds the smallest run (kvrtos-tiny
    # in int8, int4 KV, one sequence) by the budget rule on the board's 32-bit word
    out = []
    for name in boards.names():
        b = boards.load(name)
        if b.kind != "mcu" or not b.mpy_heap:
            continue
        c = {"board": name, "model": "kvrtos-tiny", "weights": "int8", "kv_dtype": "int4", "interp": "micropython32",
             "policy": "window", "window": 16, "batch": 1}
        n, need, _ = fits(c)
        if n >= need:
            out.append(name)
    return out


def interpreters():
    # the interpreters that run here: the 32-bit port when it builds, the 64-bit one
    out = []
    for i in INTERPS:
        if i == "micropython32":
            try:
                mp32.build()
            except UserError:
                continue
        out.append(i)
    return out


def space(interps=None, boards_=None, models_=None, weights=None, kv_dtypes=None, policies=None, batches=None,
          tasks=None, temperatures=None):
    # the values each dimension is drawn from, each filter checked (UserError, exit 2)
    def pick(flag, given, known):
        if not given:
            return list(known)
        for v in given:
            if v not in known:
                raise UserError("%s: unknown %r (known: %s)" % (flag, v, ", ".join(str(k) for k in known)), 2)
        return list(dict.fromkeys(given))

    have = interpreters()
    sp = {
        "interp": pick("--interps", interps, INTERPS),
        "board": pick("--boards", boards_, mcu_boards()),
        "model": pick("--models", models_, list(models())),
        "weights": pick("--weights", weights, WEIGHTS),
        "kv_dtype": pick("--kv-dtypes", kv_dtypes, kv.DTYPES),
        "policy": pick("--policies", policies, kv.POLICIES),
        "batch": pick("--batch", [int(b) for b in batches] if batches else None, sorted(BATCH_WEIGHTS)),
        "tasks": pick("--tasks", tasks, list(TASK_CONFIGS)),
        "temperature": pick("--temperatures", [float(t) for t in temperatures] if temperatures else None, TEMPERATURES),
    }
    missing = [i for i in sp["interp"] if i not in have]
    if missing and interps:
        raise UserError("--interps: %s cannot run here (the 32-bit port needs ./kv mp32 to build)" % ", ".join(missing), 1)
    sp["interp"] = [i for i in sp["interp"] if i in have]
    if not sp["interp"]:
        raise UserError("no MicroPython interpreter to run the firmware under", 1)
    return sp


def fits(c):
    # (KV blocks the budget rule gives run c on its board and interpreter, blocks it needs):
    # the rule decode.Session itself applies at boot, computed here without booting
    brd = boards.load(c["board"])
    cfg, lay = llama2c.plan(checkpoint(c["model"], c["weights"]))
    wbytes = lay.memory_bytes()  # what the firmware's loader keeps
    klay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, c["kv_dtype"])
    word = 4 if c["interp"] == "micropython32" else 8
    q8 = decode.uses_q8("auto", c["weights"] == "int8", c["kv_dtype"])
    n = decode.budget_blocks(brd.mpy_heap, cfg, wbytes, klay, brd.firmware_bytes, c["policy"] == "h2o", c["batch"],
                             word, q8)[1]
    t = klay.tokens_per_block
    if c["policy"] == "full":
        need = c["batch"] * 4  # the prompt (and the prefix of chats) with room to decode
    else:
        need = c["batch"] * ((c["window"] + t - 1) // t)
    return n, need, cfg


def draw(seed, sp, ring_tokens=RING_TOKENS):
    # the run drawn from seed alone over space sp: a dict of its settings (redrawn until
    # the budget rule gives the pool it needs; UserError when nothing in sp fits)
    rng = random.Random(seed)
    for _ in range(200):
        c = {k: rng.choice(sp[k]) for k in ("interp", "board", "model", "weights", "kv_dtype", "policy", "tasks")}
        c["batch"] = rng.choice([b for b in sp["batch"] for _ in range(BATCH_WEIGHTS.get(b, 1))])
        c["window"] = 0
        c["sinks"] = kv.SINKS
        if c["policy"] != "full":
            low = kv.min_budget(c["policy"], c["sinks"])
            c["window"] = rng.choice([w for w in WINDOWS if w >= low] or [low])
        c["temperature"] = rng.choice(sp["temperature"])
        c["sample_seed"] = rng.randrange(1 << 20)
        n, need, cfg = fits(c)
        if n < need:
            continue
        # tokens per sequence: a full policy past its context; a ring policy ring_tokens
        # in all (chats share them: each still decodes far past its window)
        c["tokens"] = cfg.seq_len + FULL_EXTRA if c["policy"] == "full" else -(-ring_tokens // c["batch"])
        c["seed"] = seed
        return c
    raise UserError("no run drawn from seed %d fits its board (every draw's KV budget too small): widen the filters" % seed, 2)


def describe(c):
    # one line naming the run's settings
    pol = c["policy"] if c["policy"] == "full" else "%s %d" % (c["policy"], c["window"])
    return "%s %s %s %s weights, KV %s, policy %s, batch %d, tasks %s, %d tokens%s%s" % (
        c["interp"], c["board"], c["model"], c["weights"], c["kv_dtype"], pol, c["batch"], c["tasks"], c["tokens"],
        " per chat" if c["batch"] > 1 else "",
        ", temperature %g" % c["temperature"] if c["temperature"] else "")


def config_key(c):
    # what makes two runs the same configuration (not their seeds)
    return (c["interp"], c["board"], c["model"], c["weights"], c["kv_dtype"], c["policy"], c["window"], c["batch"],
            c["tasks"])


def command_for(c, args):
    # (argv, env) that runs c under its interpreter with its board's usable heap
    brd = boards.load(c["board"])
    a = ["board=" + boards.path_of(c["board"]), "model=" + checkpoint(c["model"], c["weights"]),
         "tokenizer=" + models()[c["model"]][1], "kv_dtype=" + c["kv_dtype"], "policy=" + c["policy"],
         "window=%d" % c["window"], "sinks=%d" % c["sinks"], "tokens=%d" % c["tokens"], "batch=%d" % c["batch"],
         "layer_us=%d" % LAYER_US, "seed=%d" % c["sample_seed"], "temperature=%r" % c["temperature"]]
    cfgp = TASK_CONFIGS[c["tasks"]]
    if cfgp:
        a.append("config=" + cfgp)
    cmd, env = interp_mod.command(SCRIPT, c["interp"], usable_heap=brd.mpy_heap, args=a + list(args))
    if cfgp:  # a config's module tasks import from its folder (as a board's kvrtos.json beside them)
        env["MICROPYPATH"] = env["MICROPYPATH"] + ":" + os.path.dirname(cfgp)
    return cmd, env


RESULT = "soakrun: result "


def run_one(c, timeout=RUN_TIMEOUT_S):
    # boot and decode run c; {"config": c, "rc", "wall_s", "result" (soakrun's JSON or
    # None), "error" (soakrun's error/refused line), "tail" (its last output)}
    cmd, env = command_for(c, ())
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    res, err = None, ""
    for line in out.splitlines():
        if line.startswith(RESULT):
            res = json.loads(line[len(RESULT):])
        elif line.startswith("soakrun: "):
            err = line[len("soakrun: "):]
    return {"config": c, "rc": rc, "wall_s": round(time.time() - t0, 1), "result": res, "error": err,
            "tail": out.strip().splitlines()[-3:] if res is None else []}


def drift(free, who=None):
    # (|free heap after the DRIFT_FROM-th new token - free heap after the last|, the spread
    # max - min of the samples from that token on, the floor's drop: the least free heap in
    # the first half of those samples less the least in the second half, > 0 when the heap
    # in use grew): free[i] is the sample after new token i + 1; (None, None, None) when
    # the run made too few tokens to tell. who[i]: the sequence that took sample i (chats
    # on one Session: each samples while the others are suspended inside their own steps,
    # each holding its own live objects, so a run of two chats alternates between two
    # levels); each sequence's own samples are compared, and the largest of each figure
    # over the sequences is the run's
    if len(free) <= DRIFT_FROM:
        return None, None, None
    tail = free[DRIFT_FROM - 1:]
    tw = (who or [0] * len(free))[DRIFT_FROM - 1:]
    out = None
    for w in sorted(set(tw)):
        own = [v for v, x in zip(tail, tw, strict=True) if x == w]
        h = len(own) // 2
        fig = (abs(own[0] - own[-1]), max(own) - min(own), min(own[:h]) - min(own[h:]) if h else 0)
        out = fig if out is None else tuple(max(a, b) for a, b in zip(out, fig, strict=True))
    return out


def check(r):
    # what run r (run_one's record) broke: a list of one-line findings ([] when it held),
    # and its figures (tokens made, heap drift, MemoryErrors)
    c = r["config"]
    bad = []
    figs = {"tokens": 0, "drift_bytes": None, "spread_bytes": None, "floor_drop_bytes": None, "memory_errors": 0,
            "gc_block": None}
    res = r["result"]
    if res is None:
        if r["rc"] == "timeout":
            bad.append("timed out after %s s" % r["wall_s"])
        elif r["error"].startswith("error MemoryError"):
            figs["memory_errors"] += 1
            bad.append("MemoryError: %s" % r["error"][len("error MemoryError"):].lstrip(": "))
        elif r["error"].startswith("refused "):
            bad.append("boot refused where the budget rule fits the pool: %s" % r["error"][len("refused "):])
        else:
            bad.append("no result (exit %s): %s" % (r["rc"], r["error"] or " / ".join(r["tail"]) or "no output"))
        return bad, figs
    block = res["gc_block"]
    figs["gc_block"] = block
    for name, typ, msg in res["tasks_failed"]:
        if typ == "MemoryError":
            figs["memory_errors"] += 1
        bad.append("task %s ended with %s: %s" % (name, typ, msg))
    for i, s in enumerate(res["seqs"]):
        figs["tokens"] += s["n_new"]
        who = "" if len(res["seqs"]) == 1 else "chat %d: " % i
        if c["policy"] == "full":
            line = s["stop_line"]
            if not (s["stop"] and line.startswith(decode.STOP) and "\n" not in line):
                bad.append("%sfull did not stop with its one line (stop %r, %d of %d tokens, line %r)"
                           % (who, s["stop"], s["n_new"], res["asked"], line))
        elif s["stop"] or s["n_new"] != res["asked"]:
            bad.append("%s%s stopped at %d of %d tokens (%s)" % (who, c["policy"], s["n_new"], res["asked"], s["stop_line"] or s["stop"]))
    d, spread, drop = drift(res["free"], res.get("who"))
    figs["drift_bytes"] = d
    figs["spread_bytes"] = spread
    figs["floor_drop_bytes"] = drop
    if d is not None and d > block:
        f = res["free"]
        bad.append("free heap drifted %d B (> one %d B GC block) between a sequence's sample after token %d and its last "
                   "(all samples: %d B free after token %d, %d B after the last (%d)); from token %d on a sequence's samples "
                   "range over %d B (all: %d to %d), its floor dropped %d B from the first half to the second"
                   % (d, block, DRIFT_FROM, f[DRIFT_FROM - 1], DRIFT_FROM, f[-1], len(f), DRIFT_FROM, spread,
                      min(f[DRIFT_FROM - 1:]), max(f[DRIFT_FROM - 1:]), drop))
    return bad, figs


def repro(c, filters):
    # the command that replays run c alone
    return "./kv soak --seed %d --runs 1%s" % (c["seed"], filters)


def soak(seed=1, runs=8, workers=0, ring_tokens=RING_TOKENS, filters="", progress=None, timeout=RUN_TIMEOUT_S, **dims):
    # draw and run `runs` runs from seed over the space dims gives (space()'s keywords);
    # the summary dict (see summary())
    sp = space(**dims)
    confs = [draw(seed + i, sp, ring_tokens) for i in range(runs)]
    for c in confs:  # conversions once, before the runs share them
        checkpoint(c["model"], c["weights"])
    workers = workers or default_workers()
    t0 = time.time()
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as ex:
        futs = {ex.submit(run_one, c, timeout): c for c in confs}
        for f in concurrent.futures.as_completed(futs):
            r = f.result()
            bad, figs = check(r)
            row = {"seed": r["config"]["seed"], "config": describe(r["config"]), "settings": r["config"],
                   "wall_s": r["wall_s"], "failures": bad, "repro": repro(r["config"], filters)}
            row.update(figs)
            rows.append(row)
            if progress is not None:
                progress(row)
    rows.sort(key=lambda x: x["seed"])
    return summary(rows, seed, runs, workers, ring_tokens, round(time.time() - t0, 1), sp)


def summary(rows, seed, runs, workers, ring_tokens, wall_s, sp):
    drifts = [(x["drift_bytes"], x) for x in rows if x["drift_bytes"] is not None]
    worst = max(drifts, key=lambda d: d[0]) if drifts else (None, None)
    failed = [x for x in rows if x["failures"]]
    by_interp = {}
    for x in rows:
        i = x["settings"]["interp"]
        d = by_interp.setdefault(i, {"runs": 0, "tokens": 0, "max_drift_bytes": 0, "gc_block": 16 if i == "micropython32" else 32})
        d["runs"] += 1
        d["tokens"] += x["tokens"]
        if x["drift_bytes"] is not None and x["drift_bytes"] > d["max_drift_bytes"]:
            d["max_drift_bytes"] = x["drift_bytes"]
        if x["spread_bytes"] is not None and x["spread_bytes"] > d.setdefault("max_spread_bytes", 0):
            d["max_spread_bytes"] = x["spread_bytes"]
    cover = {k: sorted({str(x["settings"][k]) for x in rows}) for k in ("interp", "board", "model", "weights",
                                                                          "kv_dtype", "policy", "batch", "tasks")}
    return {
        "seed": seed, "runs": len(rows), "ring_tokens": ring_tokens, "workers": workers, "wall_s": wall_s,
        "tokens": sum(x["tokens"] for x in rows),
        "configurations": len({config_key(x["settings"]) for x in rows}),
        "memory_errors": sum(x["memory_errors"] for x in rows),
        "failed_runs": len(failed),
        "max_drift_bytes": worst[0],
        "max_drift_run": worst[1]["config"] if worst[1] else None,
        "max_spread_bytes": max([x["spread_bytes"] for x in rows if x["spread_bytes"] is not None] or [None]) if drifts else None,
        "drift_checked_runs": len(drifts),
        "by_interp": by_interp, "covered": cover,
        "space": {k: [str(v) for v in vals] for k, vals in sp.items()},
        "rows": [{k: v for k, v in x.items() if k != "settings"} for x in rows],
        "ok": not failed,
    }


def default_workers():
    # parallel runs: one per core, at most 2 (a run is one process; a 2-core machine runs two)
    return max(1, min(2, os.cpu_count() or 1))


def report_lines(r):
    # the summary as text lines
    L = ["soak: seed %d, %d runs (%d configurations), %s new tokens, %d MemoryErrors, %d failed; %s s on %d workers"
         % (r["seed"], r["runs"], r["configurations"], "{:,}".format(r["tokens"]), r["memory_errors"], r["failed_runs"],
            r["wall_s"], r["workers"])]
    if r["max_drift_bytes"] is not None:
        L.append("soak: largest heap drift after token %d: %d B (%s); GC block 16 B on 32-bit, 32 B on 64-bit"
                 % (DRIFT_FROM, r["max_drift_bytes"], r["max_drift_run"]))
    for x in r["rows"]:
        if x["failures"]:
            L.append("soak: FAILED seed %d: %s: %s; reproduce: %s" % (x["seed"], x["config"], "; ".join(x["failures"]), x["repro"]))
    return L


def main(seed=1, runs=8, workers=0, ring_tokens=RING_TOKENS, as_json=False, filters="", **dims):
    # ./kv soak: print each run as it ends (not with --json), then the summary; UserError
    # (exit 1) when a run failed
    def progress(row):
        if as_json:
            return
        st = "FAILED: " + "; ".join(row["failures"]) if row["failures"] else "ok"
        dr = "n/a" if row["drift_bytes"] is None else "%d B" % row["drift_bytes"]
        print("soak: seed %d: %s: %s tokens, drift %s, %s s: %s" % (row["seed"], row["config"], row["tokens"], dr,
                                                                   row["wall_s"], st))
        if row["failures"]:
            print("soak: reproduce: %s" % row["repro"])
        sys.stdout.flush()

    r = soak(seed=seed, runs=runs, workers=workers, ring_tokens=ring_tokens, filters=filters, progress=progress, **dims)
    if as_json:
        print(json.dumps(r, sort_keys=True))
    else:
        for line in report_lines(r):
            print(line)
    if not r["ok"]:
        raise UserError("%d of %d runs failed (each printed with the command that replays it)" % (r["failed_runs"], r["runs"]), 1)
    return r
