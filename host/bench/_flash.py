# Flash sector erases per 1,000 tokens of stories260K-shaped KV (Layout(5, 4, 8, dtype)) through
# the flash tier (firmware_py/tiers.py + flashkv.py), with write-back batching (batch_tokens
# rows flushed at once) or write-through (batch_tokens=1: each token's rows as appended).
# Not a benchmark module of its own: `./kv bench dma` (host/bench/dma.py) calls
# erases_per_1000_tokens() for its flash figures. Deterministic: the erase model counts, no
# timing is measured (the µs are the model's: erases x 45 ms + the flash tier's write rate).
import os
import tempfile

from firmware_py import bandwidth as bwm, board, flashkv, kv, pool, tiers
from firmware_py.clock import VirtualClock
from host import budget
from host.paths import BOARDS

_BOARD = "esp32s3_n8r8"


# flash figures for `tokens` tokens of one full-policy sequence whose blocks beyond the newest
# keep_sram (SRAM) + keep_psram (PSRAM) live only in the flash file, written batch_tokens at a
# time. programmed=True: the file was preallocated by writing it (every sector holds data, the
# steady state of a file in use); False: freshly erased sectors. Returns a dict (JSON-ready)
def erases_per_1000_tokens(batch_tokens, dtype="fp32", tokens=1000, keep_sram=2, keep_psram=2, programmed=True):
    if batch_tokens.__class__ is not int or batch_tokens < 1:
        raise ValueError("batch_tokens must be an int >= 1, got %r" % (batch_tokens,))
    if tokens.__class__ is not int or tokens < 1:
        raise ValueError("tokens must be an int >= 1, got %r" % (tokens,))
    lay = kv.Layout(5, 4, 8, dtype)
    t = lay.tokens_per_block
    nblk = (tokens + t - 1) // t
    n_sram = keep_sram + 2
    # kv.KVCache takes at most pool.n_blocks table entries per sequence, so the PSRAM range is
    # sized to the whole sequence (the placement keeps only keep_psram blocks there)
    n_psram = max(keep_psram + 2, nblk - n_sram)
    p = pool.Pool(lay.block_bytes, n_sram + n_psram, views=False, tiers=(n_sram, n_psram), tier_names=("sram", "psram"))
    r = p.add_region(n_sram + n_psram)
    c = kv.KVCache(p, lay, max_seqs=1, max_blocks_per_seq=nblk)
    bd = board.load(os.path.join(BOARDS, _BOARD + ".json"))
    bw = bwm.Bandwidth(bd, clock=VirtualClock())
    with tempfile.TemporaryDirectory() as d:
        fs = flashkv.FlashStore(os.path.join(d, "kv.bin"), nblk, lay.block_bytes, programmed=programmed)
        T = tiers.Tiers(c, bw=bw, flash=fs)
        h = T.open(r, "full", 0, keep_sram, keep_psram, True, batch_tokens)
        row = bytearray(lay.row_bytes)
        flash_us = 0
        for n in range(tokens):
            row[0] = n & 0xFF
            rv = T.append(h, row)
            if rv < 0:
                raise RuntimeError("tiered append refused at token %d: %d" % (n, rv))
            flash_us += T.step_us
        w = fs.wear(tokens)
        fs.close()
    return {
        "board": _BOARD,
        "layout": "Layout(5, 4, 8, %r)" % dtype,
        "block_bytes": lay.block_bytes,
        "sectors_per_block": fs.sectors_per_slot,
        "batch_tokens": batch_tokens,
        "mode": "write-through" if batch_tokens == 1 else "write-back",
        "tokens": tokens,
        "programmed_at_boot": programmed,
        "flushes": T.flushes,
        "erases": w["erases"],
        "erases_per_1000_tokens": round(w["erases"] * 1000 / tokens, 1),
        "max_erases_per_sector": w["max_erases_per_sector"],
        "mean_erases_per_sector": round(w["mean_erases_per_sector"], 3),
        "bytes_written": w["bytes_written"],
        "flash_ms_per_token": round(flash_us / tokens / 1000, 3),
        "erase_ms_each": fs.erase_us / 1000,
        "endurance_erases": fs.endurance,
        # the sector lifetime by ./kv budget's definition (host/budget.py): the worst case, one
        # slot taking every block, is the figure to trust; each slot here holds one block, so
        # the run's hottest sector is the per-block figure. Not the run's own extrapolation
        # (endurance x tokens / hottest sector): in 1,000 tokens no slot is reused
        "flash_slots": nblk,
        "lifetime_tokens_one_slot": budget.lifetime_tokens_one_slot(t, w["max_erases_per_sector"], fs.endurance),
        "lifetime_tokens_levelled": budget.lifetime_tokens_levelled(fs.n_sectors, w["erases"], tokens, fs.endurance),
        "spilled_blocks": T.spills,
    }
