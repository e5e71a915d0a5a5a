# `./kv bench budget [--json]`: the budget calculator (host/budget.py) checked without
# its own sizing functions. For each board, KV dtype and weights type, the interpreter
# gets the heap the calculator asks for (heap_bytes_needed, as -X heapsize) and,
# separately, the board's own usable heap; firmware_py/tools/kvprobe.py size=try then
# boots the decoding firmware (decode.Session with a fixed pool of B blocks: weights,
# tokenizer, run state), decodes 8 tokens through the kernel task, appends to FULL under
# heap_lock and keeps allocating KV blocks until a real MemoryError. One B per process
# (a board boots once; see kvprobe.py), searched from the prediction outwards: the
# largest B that boots is the same wherever the search starts. The prediction
# (max_tokens) must be <= what fits; the slack says how tight it is.
import os
import re
import subprocess
import tempfile

from firmware_py import llama2c
from host import boards, budget, mp32, paths
from host import interp as interp_mod
from host.errors import UserError
from host.bench import emit

CASES = (  # (board, KV dtype, weights: fp32 checkpoint or its q8row int8 conversion)
    ("esp32s3_n8r8", "fp32", "fp32"), ("esp32s3_n8r8", "int8", "fp32"), ("esp32s3_n8r8", "int8", "int8"),
    ("esp32s3_n4r2", "fp32", "fp32"), ("esp32s3_n4r2", "int8", "fp32"), ("esp32s3_n4r2", "int8", "int8"),
)
STORIES260K = (64, 172, 5, 8, 4, 512, 512)  # dim, hidden, layers, heads, kv_heads, vocab, seq_len
PROBE = os.path.join(paths.FIRMWARE, "tools", "kvprobe.py")
_LINE = re.compile(r"kvprobe: tried blocks=(\d+) booted=(\d)(?: limit=(\S+))?(?: tokens=(\d+) status=(\w+) decoded=(\d+) "
                   r"extra_blocks=(\d+) memory_error_tokens=(\d+) block_bytes=(\d+))?")
TINY_TOKENIZER = os.path.join(paths.MODELS, "kvrtos-tiny", "tokenizer.bin")  # 512 tokens, as tok512.bin


def model_path(tmp, weights="fp32"):
    # (checkpoint, tokenizer, words): ../shared/models/stories260K.bin and tok512.bin when
    # present, else a checkpoint of its exact shape and size (zero weights: memory does
    # not depend on their values) written into tmp with kvrtos-tiny's 512-token
    # tokenizer; weights "int8": its q8row conversion (host/convert.py) written into tmp
    d = paths.shared_models()
    p = d and os.path.join(d, "stories260K.bin")
    if p and os.path.exists(p) and os.path.exists(os.path.join(d, "tok512.bin")):
        tok, desc = os.path.join(d, "tok512.bin"), "stories260K.bin"
    else:
        cfg = llama2c.Config(*STORIES260K)
        p = os.path.join(tmp, "stories260K_shape.bin")
        with open(p, "wb") as f:
            f.write(_header(cfg))
            f.write(bytes(4 * cfg.weight_floats()))
        tok, desc = TINY_TOKENIZER, "a zero checkpoint of stories260K's shape (stories260K.bin not in ../shared/models)"
    if weights == "int8":
        from host import convert

        q = os.path.join(tmp, "stories260K_q8row.bin")
        if not os.path.exists(q):
            convert.convert(p, q, "q8row")
        return q, tok, desc + " converted to q8row int8"
    return p, tok, desc


def _header(cfg):
    import struct

    return struct.pack("<7i", cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.seq_len)


def interpreters():
    # the 64-bit PyPI unix port, and the 32-bit one (the ESP32-S3's word size) when it builds
    out = ["micropython"]
    try:
        mp32.build()
        out.append("micropython32")
    except UserError:
        pass
    return out


PROBE_S = 240  # a probe runs 2-30 s; past this its decode is collecting on every boxed float


def probe(interp, heapsize, board, model, tok, dtype, blocks):
    # one kvprobe size=try run with a pool of `blocks`: its figures as a dict (booted
    # False: what refused it); UserError when the probe itself fails. A pool that leaves
    # the bytecode decode too little heap does not fault: every float it boxes starts a
    # collection of the whole heap and the decode crawls. That pool does not fit either
    try:
        r = interp_mod.run(PROBE, interp, heapsize=heapsize, timeout=PROBE_S, args=[
            "board=" + os.path.join(paths.BOARDS, board + ".json"), "model=" + model, "tokenizer=" + tok,
            "kv_dtype=" + dtype, "size=try", "blocks=%d" % blocks])
    except subprocess.TimeoutExpired:
        return {"booted": False, "limit": "GCThrash"}
    m = _LINE.search(r.stdout)
    if r.returncode != 0 or not m:
        raise UserError("kvprobe on %s (%s, %s, %d blocks) failed: %s" % (interp, board, dtype, blocks, (r.stdout + r.stderr).strip()[-300:]), 1)
    n, booted, limit, tokens, status, decoded, extra, me_tokens, block_bytes = m.groups()
    if booted == "0":
        return {"booted": False, "limit": limit}
    return {"booted": True, "tokens": int(tokens), "status": status, "decoded": int(decoded),
            "memory_error_tokens": int(me_tokens), "block_bytes": int(block_bytes)}


def search(interp, heapsize, board, model, tok, dtype, start):
    # (largest pool that boots and fills to FULL, its probe, what refused one block more),
    # galloping from `start` outwards and bisecting; one process per size tried
    def ok(b):
        if b < 1:
            return True, None
        r = probe(interp, heapsize, board, model, tok, dtype, b)
        good = r["booted"] and r["status"] == "FULL" and r["tokens"] == 16 * b
        if r["booted"] and not good:
            r["limit"] = "fill stopped at %d tokens (%s)" % (r["tokens"], r["status"])
        return good, r
    start = max(start, 1)
    tried = {}

    def test(b):
        # ok(b), recorded in tried; whether it fit
        tried[b] = ok(b)
        return tried[b][0]
    step = 1
    if test(start):
        lo, hi = start, None
        while hi is None:
            if test(lo + step):
                lo += step
                step *= 2
            else:
                hi = lo + step
    else:
        hi, lo = start, None
        while lo is None:
            b = max(hi - step, 0)
            if test(b):
                lo = b
            else:
                hi = b
                step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if test(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried.get(lo, (True, None))[1], tried[hi][1].get("limit", "?"), len(tried)


_BOOT = re.compile(r"kvprobe: boot blocks=(\d+) free=(\d+) largest=(\d+) margin=(\d+) model_bytes=(\d+) tokens=(\d+) "
                   r"status=(\w+) decoded=(\d+) limit=(\S+)")


def boot(interp, heapsize, board, model, tok, dtype):
    # the firmware's own boot-time sizing (kvprobe size=boot): {"blocks", "free", "largest",
    # "margin", "status" (FULL: its pool decoded and filled), "limit"}; blocks 0 when it
    # did not boot or run (limit says why)
    try:
        r = interp_mod.run(PROBE, interp, heapsize=heapsize, timeout=PROBE_S, args=[
            "board=" + os.path.join(paths.BOARDS, board + ".json"), "model=" + model, "tokenizer=" + tok,
            "kv_dtype=" + dtype, "size=boot"])
    except subprocess.TimeoutExpired:  # the boot's own pool leaves the measured margin: this is a failure
        raise UserError("kvprobe size=boot on %s (%s, %s) ran past %d s" % (interp, board, dtype, PROBE_S), 1) from None
    m = _BOOT.search(r.stdout)
    if r.returncode != 0 or not m:
        f = re.search(r"kvprobe: boot blocks=0 limit=(.*)", r.stdout)
        if f:
            return {"blocks": 0, "free": 0, "largest": 0, "margin": 0, "status": "none", "limit": f.group(1).strip()}
        raise UserError("kvprobe size=boot on %s (%s, %s) failed: %s" % (interp, board, dtype, (r.stdout + r.stderr).strip()[-300:]), 1)
    b, free, largest, margin, _, _, status, _, limit = m.groups()
    return {"blocks": int(b), "free": int(free), "largest": int(largest), "margin": int(margin), "status": status,
            "limit": limit.replace("_", " ")}


def measure_case(interp, board, dtype, weights, model, tok, heap_from):
    # one row: prediction against measurement at the calculator's or the board's heap
    word = 4 if interp == "micropython32" else 8
    d = budget.compute(board, model, dtype, word_bytes=word, context="decode")  # this build's word size; kvprobe boots decode.Session by itself
    heapsize = d["heap_bytes_needed"] if heap_from == "calculator" else boards.unix_heapsize(boards.load(board).mpy_heap, word)
    fit, r, limit, runs = search(interp, heapsize, board, model, tok, dtype, d["pool_blocks"])
    t = d["tokens_per_block"]
    row = {"interp": interp, "word_bytes": word, "board": board, "kv_dtype": dtype, "weights": weights, "weights_bytes": d["weights_bytes"],
           "heap_from": heap_from, "heapsize": heapsize, "predicted_blocks": d["pool_blocks"],
           "predicted_tokens": d["max_tokens"], "fit_blocks": fit, "fit_tokens": fit * t,
           "fill_status": r["status"] if r else "none", "fit_limited_by": limit, "probe_runs": runs,
           "memory_error_tokens": r["memory_error_tokens"] if r else 0, "block_bytes": d["block_bytes"]}
    per_token = d["block_bytes"] / t
    row["slack_tokens"] = row["fit_tokens"] - d["max_tokens"]
    row["slack_bytes"] = int(row["slack_tokens"] * per_token)
    row["predicted_over_fit"] = round(d["max_tokens"] / row["fit_tokens"], 4) if fit else 0.0
    row["memory_error_slack_tokens"] = row["memory_error_tokens"] - d["max_tokens"]
    b = boot(interp, heapsize, board, model, tok, dtype)
    row["boot_blocks"] = b["blocks"]
    row["boot_tokens"] = b["blocks"] * t
    row["boot_status"] = b["status"]
    row["boot_limited_by"] = b["limit"]
    row["boot_free"] = b["free"]
    row["boot_largest"] = b["largest"]
    row["margin_bytes"] = b["margin"]
    pb = d["pool_blocks"]
    row["calc_le_boot"] = pb <= b["blocks"]
    row["boot_le_fit"] = b["blocks"] <= fit and b["status"] == "FULL"
    row["boot_within_one_block"] = b["blocks"] <= pb + 1
    slack = (fit - b["blocks"]) * d["block_bytes"]
    row["boot_slack_bytes"] = slack
    allowed = max(int(0.03 * heapsize), 2 * d["block_bytes"])
    row["boot_slack_ok"] = slack <= allowed
    row["why"] = "" if row["boot_slack_ok"] else "the margin (%d B) and what the boot's probe leaves outside the largest piece" % b["margin"]
    row["ok"] = row["calc_le_boot"] and row["boot_le_fit"] and row["boot_within_one_block"]
    return row


def jobs():
    # rows measured at once: KVRTOS_BENCH_JOBS, else one per core (each row is a chain of
    # interpreter processes; memory figures do not depend on timing, so rows run side by side)
    v = os.environ.get("KVRTOS_BENCH_JOBS", "")
    if v:
        try:
            n = int(v) if v.isascii() and v.strip() == v else 0
        except ValueError:
            n = 0
        if n < 1:
            raise UserError("KVRTOS_BENCH_JOBS must be a whole number >= 1, not %r" % v, 2)
        return n
    return max(1, os.cpu_count() or 1)


def measure():
    # every case on every interpreter, at both heaps; rows in the order listed whatever
    # order they finish in
    from concurrent.futures import ThreadPoolExecutor

    with tempfile.TemporaryDirectory() as tmp:
        work = []
        for i in interpreters():
            for b, dt, w in CASES:
                model, tok, desc = model_path(tmp, w)  # converted once, before any row runs
                for h in ("calculator", "board"):
                    work.append((i, b, dt, w, model, tok, h))
        with ThreadPoolExecutor(max_workers=jobs()) as ex:
            rows = list(ex.map(lambda a: measure_case(*a), work))
        desc = model_path(tmp)[2]
    return {"model": desc, "policy": "full", "rows": rows, "interpreters": interpreters(),
            "safe": all(r["slack_tokens"] >= 0 and r["ok"] for r in rows),
            "boot_slack_within_3_percent": all(r["boot_slack_ok"] for r in rows),
            "max_boot_slack_fraction_of_heap": round(max(r["boot_slack_bytes"] / r["heapsize"] for r in rows), 4),
            "max_slack_fraction_of_heap": round(max(r["slack_bytes"] / r["heapsize"] for r in rows), 4),
            "min_slack_fraction_of_heap": round(min(r["slack_bytes"] / r["heapsize"] for r in rows), 4)}


def run(as_json=False):
    # ./kv bench budget [--json]: print the figures (one JSON object with --json); returns them
    r = measure()
    return emit(r, as_json, render)


# --- the benchmark's section of docs/benchmarks.md (host/benchdoc.py calls these) ------
TITLE = "Budget calculator against the real interpreter"


def render(r):
    # markdown lines of the section from the figures r
    boot = all("boot_blocks" in x for x in r["rows"])
    L = [
        "Model: %s, policy full. The decoding firmware's boot is measured, one pool size per process "
        "(`firmware_py/tools/kvprobe.py size=try`): `decode.Session` with a fixed pool (weights as the loader keeps "
        "them, tokenizer, run state), 8 tokens decoded through the kernel task, then appends under `heap_lock()` to "
        "`FULL`; no calculator function is used. `word` is the build's word size and the calculator's figures are "
        "asked for it (`micropython32`: the 32-bit unix port, the ESP32-S3's word; `micropython`: the 64-bit PyPI "
        "port, which the virtual board runs). `heap` is the `-X heapsize` given: `calculator` = that word size's "
        "`heap_bytes_needed`, `board` = the board's usable heap. `fit` = the largest pool that boots, decodes and "
        "fills; `limited by` = what refused one block more (`GCThrash`: "
        "the probe ran past %d s, its 8-token decode crawling: a pool that leaves the bytecode decode a few KB collects the "
        "whole heap for every float it boxes; a time limit, so on a busier machine a row may end a block sooner); `MemoryError at` = tokens when decode keeps asking for "
        "blocks after the fill until a real `MemoryError`." % (r["model"], PROBE_S),
        "",
    ]
    if boot:
        L[0] += (" `boot` = the pool the firmware sizes itself at boot from the heap it measures (`kvprobe.py size=boot`: "
                 "free heap, largest block, the measured margin; its pool then decodes and fills to `FULL`), `calculator` = "
                 "`./kv budget`'s prediction of it. The promise: calculator <= boot <= fit, boot at most one block above the "
                 "calculator.")
        L += ["| interpreter | word | board | KV | weights | heap | `-X heapsize` | calculator (tokens) | boot (tokens) | boot limited by | fit (tokens) | fit limited by | boot slack | calc <= boot <= fit | boot <= calc + 1 block |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for x in r["rows"]:
            L.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s B (%.1f %%) | %s | %s |" % (
                x["interp"], x["word_bytes"], x["board"], x["kv_dtype"], x["weights"], x["heap_from"], "{:,}".format(x["heapsize"]),
                "{:,}".format(x["predicted_tokens"]), "{:,}".format(x["boot_tokens"]), x["boot_limited_by"],
                "{:,}".format(x["fit_tokens"]), x["fit_limited_by"], "{:,}".format(x["boot_slack_bytes"]),
                100.0 * x["boot_slack_bytes"] / x["heapsize"], "yes" if x["calc_le_boot"] and x["boot_le_fit"] else "**no**",
                "yes" if x["boot_within_one_block"] else "**no**"))
        L.append("")
        L.append("Every row keeps the promise: %s; the boot's slack (what fits beyond the boot's pool) is at most %.1f %% of the "
                 "heap, %s." % ("yes" if r["safe"] else "**NO**", 100 * r["max_boot_slack_fraction_of_heap"],
                                "within 3 % (or two blocks) in every row" if r["boot_slack_within_3_percent"] else
                                "**more than 3 % in some rows** (the `why` field of the JSON says what the margin needs)"))
        return L
    L[0] += (" This run predates the firmware's boot-time sizing (it has no boot column): its predictions are the "
             "reserve rule that sizing replaced; rerun the benchmark for the boot's figures.")
    L += [
        "| interpreter | word | board | KV | weights | heap | `-X heapsize` | predicted `max_tokens` | fit (tokens) | limited by | MemoryError at | slack tokens | slack bytes | predicted / fit | probe runs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for x in r["rows"]:
        L.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.3f | %d |" % (
            x["interp"], x["word_bytes"], x["board"], x["kv_dtype"], x["weights"], x["heap_from"], "{:,}".format(x["heapsize"]),
            "{:,}".format(x["predicted_tokens"]), "{:,}".format(x["fit_tokens"]), x["fit_limited_by"],
            "{:,}".format(x["memory_error_tokens"]), x["slack_tokens"], "{:,}".format(x["slack_bytes"]),
            x["predicted_over_fit"], x["probe_runs"]))
    L.append("")
    L.append("The prediction is a safe bound in every row: %s; the slack is %.1f-%.1f %% of the heap." % (
        "yes" if r["safe"] else "**NO**", 100 * r["min_slack_fraction_of_heap"], 100 * r["max_slack_fraction_of_heap"]))
    return L
