# `./kv bench snapshot [--json]`: what a KV snapshot (firmware_py/snapshot.py) costs, per KV
# element type: stories260K decodes to POSITIONS positions (greedy, CPython: the same
# firmware code), the sequence is saved and resumed for real, and the figures are
#   - the file's bytes, and bytes per saved position;
#   - save and restore time on the default board's flash model (its profile's flash tier:
#     write_bytes_per_s for the program, one 45 ms erase per 4 KiB sector a copy-on-write
#     filesystem writes, two reads at read_bytes_per_s for the restore: the check, the
#     load), and the erases per save;
#   - against re-prefilling the same ids at the board's predicted speed: the emulator's
#     time to first token (`./kv emulate`, the board's cost model on a VirtualClock) for
#     a prompt of those ids, with the weights the path needs (int8 weights run the viper
#     integer path with int8 KV; every other KV type runs the bytecode float path).
# Deterministic (file bytes, profile figures, VirtualClock): the suite reruns it and
# compares with docs/bench/snapshot.json (tests/test_bench_fresh.py).
import os
import tempfile

from firmware_py import decode, kv
from firmware_py import snapshot as snap
from firmware_py.flashkv import ERASE_US, SECTOR_BYTES
from firmware_py.sched import Kernel
from host import boards, paths
from host import emulate as emu
from host.bench import emit
from host.errors import UserError

DETERMINISTIC = True
POSITIONS = 256  # the conversation's cached positions when it is saved
BOARD = paths.DEFAULT_BOARD
PROMPT = "Once upon a time"


def _flash(brd):
    for t in brd.tiers:
        if t.kind == "flash":
            return t
    raise UserError("board %s has no flash tier" % brd.name, 2)


def _decoded(model, tok, dtype, folder):
    # a Session decoded greedily to POSITIONS cached positions, saved; (info, ids, resumed length)
    s = decode.Session(model, tok, kv_dtype=dtype, heap=8000000, backend="plain" if dtype == "int4tok" else "auto")
    ids = s.encode(PROMPT)
    k = Kernel(verbose=False)
    k.spawn("d", 1, s.task(k, ids, POSITIONS - len(ids) + 1, lambda b: None))
    k.run()
    if s.cache.length(s.h) != POSITIONS:
        raise UserError("the decode stopped at %d positions (%s)" % (s.cache.length(s.h), s.stop or "?"), 1)
    info = snap.save(s, "bench", folder)
    r = decode.Session(model, tok, kv_dtype=dtype, heap=8000000, backend="plain" if dtype == "int4tok" else "auto")
    snap.resume(r, "bench", folder)
    return info, ids + [s.tokens[i] for i in range(s.n_new)], r.cache.length(r.h)


def _prefill_ms(model, tok_path, dtype, ids):
    # the emulator's time to first token for a prompt of these ids on the default board:
    # every id fed once (the re-prefill a resume saves), then one token sampled;
    # (ms, prompt tokens it fed)
    from firmware_py import tokenizer

    text = tokenizer.load(tok_path, 512).decode(ids).decode("utf-8", "replace")
    rep = emu.run(emu.spec_from_options(board=BOARD, model=model, tokenizer=tok_path, prompt=text, tokens=1, kv_dtype=dtype,
                                        weights="int8" if dtype == "int8" else "fp32", cost="viper",
                                        max_ms=emu.MAX_MS))
    if not rep["tokens"]:
        raise UserError("the emulated re-prefill (%s KV) made no token within %d ms of board time" % (dtype, emu.MAX_MS), 1)
    return rep["ttft_ms"], rep["prompt_tokens"]


def measure():
    models = paths.shared_models()
    model = os.path.join(models or "", "stories260K.bin")
    tok = os.path.join(models or "", "tok512.bin")
    if not os.path.isfile(model):
        raise UserError("stories260K is not in ../shared/models: the benchmark decodes it", 2)
    brd = boards.load(BOARD)
    fl = _flash(brd)
    wr, rd = fl.cost.value["write_bytes_per_s"], fl.cost.value["read_bytes_per_s"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvrtos-bench-snapshot-") as d:
        for dt in kv.DTYPES:
            info, ids, back = _decoded(model, tok, dt, d)
            sectors = -(-info["bytes"] // SECTOR_BYTES)
            save_ms = info["bytes"] * 1000.0 / wr + sectors * ERASE_US / 1000.0
            restore_ms = 2 * info["bytes"] * 1000.0 / rd  # read twice: every CRC checked, then loaded
            ttft, fed = _prefill_ms(model, tok, dt, ids[:POSITIONS])
            rows.append({"kv_dtype": dt, "positions": info["positions"], "resumed_positions": back, "bytes": info["bytes"],
                         "bytes_per_position": round(info["bytes"] / info["positions"], 1), "blocks": info["blocks"],
                         "sectors": sectors, "erases_per_save": info["erases"], "save_ms": round(save_ms, 1),
                         "restore_ms": round(restore_ms, 2), "reprefill_ms": ttft, "reprefill_tokens": fed,
                         "reprefill_path": "viper integer (int8 weights)" if dt == "int8" else "bytecode float (fp32 weights)",
                         "restore_vs_reprefill": round(ttft / restore_ms, 1) if restore_ms else None})
    return {"board": BOARD, "model": "stories260K", "positions": POSITIONS, "rows": rows,
            "flash": {"write_bytes_per_s": wr, "read_bytes_per_s": rd, "erase_us": ERASE_US, "sector_bytes": SECTOR_BYTES},
            "command": "./kv bench snapshot"}


def run(as_json=False):
    return emit(measure(), as_json, render)


TITLE = "KV snapshots: bytes per saved position, save and restore time, against re-prefilling"


def render(r):
    f = r["flash"]
    L = ["stories260K decoded greedily to %d positions, saved (firmware_py/snapshot.py) and resumed for real, per KV "
         "element type; times on the %s's flash model: the save programs at %s B/s plus one %d ms erase per %d B sector a "
         "copy-on-write filesystem writes, the restore reads the file twice at %s B/s (every CRC checked before a block is "
         "taken, then the load; profile estimates, boards/%s.json). Re-prefill: "
         "`./kv emulate`'s time to first token for a prompt of the same ids on that board (int8 KV with int8 weights "
         "runs the viper integer path; every other KV type the bytecode float path). The CRC32 arithmetic (in C) and the "
         "filesystem's own overhead are not in these times." % (
             r["positions"], r["board"], "{:,}".format(f["write_bytes_per_s"]), f["erase_us"] // 1000, f["sector_bytes"],
             "{:,}".format(f["read_bytes_per_s"]), r["board"]), "",
         "| KV | positions | file, B | B per position | sectors (erases per save) | save, s | restore, ms | re-prefill, s "
         "(path) | restore is faster by |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in r["rows"]:
        L.append("| %s | %d | %s | %s | %d | %.2f | %s | %s (%s) | %sx |" % (
            x["kv_dtype"], x["positions"], "{:,}".format(x["bytes"]), x["bytes_per_position"], x["sectors"],
            x["save_ms"] / 1000.0, x["restore_ms"], "{:,.1f}".format(x["reprefill_ms"] / 1000.0), x["reprefill_path"],
            "{:,}".format(round(x["restore_vs_reprefill"]))))
    return L
