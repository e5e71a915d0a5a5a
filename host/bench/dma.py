# `./kv bench dma [--json]`: how many DMA transactions moving stories260K's KV bytes
# takes with the descriptor queue's merging and without it (firmware_py/dma.py on a
# VirtualClock kernel, each burst priced and charged by the bandwidth tracker with the
# board profile's cost model). The producer is the decode side of a tiered KV: each
# token's K and V rows (one descriptor per layer and per K/V: the unit a decoder writes)
# go into the sequence's current 16-token block in SRAM; when the block is full it is
# moved to the PSRAM pool by DMA (the spill), double-buffered (the next block fills the
# other SRAM block while the DMA runs; a block is reused once its last descriptor has
# completed). Merging turns a block's contiguous rows into bursts of up to the ring's
# worth of descriptors and max_burst bytes. Also the write-through case (each token's
# rows sent as soon as they are written), where only K and V of one layer are adjacent.
# Every byte is checked at the end against what was written. Then flash sector erases per
# 1,000 tokens with and without write-back batching, from the flash tier's model.
import os

from firmware_py import bandwidth as bwm
from firmware_py import dma, kvlayout, llama2c
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel, T_FAULTS
from host import boards, paths
from host.errors import UserError
from host.bench import emit

DETERMINISTIC = True  # VirtualClock figures: the suite reruns it against docs/bench/dma.json (tests/test_bench_fresh.py)

BOARD = paths.DEFAULT_BOARD
FALLBACK = (5, 4, 8, 512)  # stories260K: n_layers, n_kv_heads, head_dim, seq_len
SLOTS = 32  # the queue's ring (dma.DEFAULT_SLOTS)
MAX_BURST = dma.DEFAULT_MAX_BURST
SWEEP = ((8, 16384), (32, 1024), (32, 4096), (32, 16384), (64, 16384), (160, 16384), (160, 65536))


def model_shape():
    # (n_layers, n_kv_heads, head_dim, seq_len, where it came from): stories260K.bin's
    # header from ../shared/models when present, else the published shape, said so
    d = paths.shared_models()
    p = d and os.path.join(d, "stories260K.bin")
    if p and os.path.exists(p):
        try:
            cfg, _ = llama2c.read_config(p)
            return cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.seq_len, "stories260K.bin header"
        except (llama2c.CheckpointError, OSError) as e:
            raise UserError("bench dma: %s: %s" % (p, e), 1) from None
    return FALLBACK + ("stories260K's published shape (stories260K.bin not in ../shared/models)",)


class _Log(dma.DMAQueue):
    # the queue, keeping each burst's (source tier, destination tier, bytes) as it lands
    def __init__(self, *a, **kw):
        dma.DMAQueue.__init__(self, *a, **kw)
        self.sizes = []

    def _land(self):
        if self.burst_n:
            t = self.burst[dma.F_TIERS]
            self.sizes.append((t & 0xFF, t >> 8, self.burst[dma.F_LEN]))
        dma.DMAQueue._land(self)


def _row_byte(pos, layer, kv, i):
    # the byte a token's K (kv 0) or V (kv 1) row holds at i: checkable later
    return (pos * 7 + layer * 31 + kv * 101 + i) & 0xFF


def scenario(shape, tokens, merge, slots=SLOTS, max_burst=MAX_BURST, mode="spill", board=BOARD):
    # decode `tokens` tokens of fp32 K/V rows, moving them to PSRAM by DMA (mode "spill":
    # a full block at a time; "write-through": each token's rows at once); the counts
    L, H, D = shape[:3]
    lay = kvlayout.Layout(L, H, D, "fp32")
    T = lay.tokens_per_block
    n_blocks = (tokens + T - 1) // T
    brd = boards.load(board)
    k = Kernel(VirtualClock(), max_tasks=4, verbose=False)
    bw = bwm.Bandwidth(brd, kernel=k)
    sr, ps = bw.tier_id("sram"), bw.tier_id("psram")
    q = _Log(k, slots=slots, max_burst=max_burst, merge=merge, bw=bw, board=brd)
    sram = [bytearray(lay.block_bytes), bytearray(lay.block_bytes)]  # the two current blocks
    psram = bytearray(lay.block_bytes * n_blocks)  # the PSRAM pool the blocks move to
    ids = [q.add_buffer(b, sr) for b in sram]
    pid = q.add_buffer(psram, ps)
    n = lay.data_bytes  # one K (or V) row of one layer: the descriptor
    last = [None, None]  # per SRAM block: the cookie of its last descriptor

    def rows_of(r):
        # (layer, kv, byte offset in a block) of slot r's rows, token order
        for layer in range(L):
            off = lay.row_offset(layer, r)
            yield layer, 0, off
            yield layer, 1, off + lay.v_off

    def decoder():
        for pos in range(tokens):
            b, r = divmod(pos, T)
            sb = b & 1
            if r == 0 and last[sb] is not None:  # reuse the block only once its move completed
                assert (yield q.wait(last[sb])) == dma.OK
            blk = sram[sb]
            for layer, kv, off in rows_of(r):
                for i in range(n):
                    blk[off + i] = _row_byte(pos, layer, kv, i)
            if mode == "write-through":
                for _layer, _kv, off in rows_of(r):
                    last[sb] = yield q.submit(ids[sb], off, pid, b * lay.block_bytes + off, n, bwm.KV_WRITE)
            elif r == T - 1 or pos == tokens - 1:  # block full (or the last one): move it, memory order
                for layer in range(L):
                    for rr in range(r + 1):
                        off = lay.row_offset(layer, rr)
                        for o in (off, off + lay.v_off):
                            last[sb] = yield q.submit(ids[sb], o, pid, b * lay.block_bytes + o, n, bwm.KV_WRITE)
            yield  # the next token's compute: the engine may run
        for c in last:
            if c is not None:
                assert (yield q.wait(c)) == dma.OK

    k.spawn("decode", 1, decoder())
    q.spawn(2)
    k.run()
    if k.totals[T_FAULTS] or q.stats()["completed"] != q.stats()["submitted"]:
        raise UserError("bench dma: the scenario did not finish (faults %d)" % k.totals[T_FAULTS], 1)
    for pos in range(tokens):  # every byte landed where it was sent
        b, r = divmod(pos, T)
        for layer in range(L):
            off = b * lay.block_bytes + lay.row_offset(layer, r)
            for kv, o in ((0, off), (1, off + lay.v_off)):
                if any(psram[o + i] != _row_byte(pos, layer, kv, i) for i in range(n)):
                    raise UserError("bench dma: token %d layer %d landed wrong" % (pos, layer), 1)
    st = q.stats()
    busy_ns = sum(max(bw.cost_ns(s, bwm.K_DMA, m), bw.cost_ns(d, bwm.K_DMA, m)) for s, d, m in q.sizes)
    o = (sr * (bw.n_cat_max + 1) + bwm.KV_WRITE) * bwm.NSTAT
    p = (ps * (bw.n_cat_max + 1) + bwm.KV_WRITE) * bwm.NSTAT
    return {
        "descriptors": st["submitted"], "transactions": st["bursts"], "gdma_descriptors": st["links"],
        "bytes": st["bytes"], "max_depth": st["max_depth"], "producer_stalls": st["stalls"],
        "producer_stall_us": st["stall_us"], "dma_busy_us_rounded": st["busy_us"],
        "dma_busy_ns": busy_ns,
        "charged_kv_write_sram": bw.st[o + bwm.S_BYTES_G] * 10**9 + bw.st[o + bwm.S_BYTES],
        "charged_kv_write_psram": bw.st[p + bwm.S_BYTES_G] * 10**9 + bw.st[p + bwm.S_BYTES],
        "virtual_us": k.now(),
    }


def measure():
    L, H, D, seq, where = model_shape()
    shape = (L, H, D)
    lay = kvlayout.Layout(L, H, D, "fp32")
    tokens = seq
    r = {"model_shape": {"n_layers": L, "n_kv_heads": H, "head_dim": D, "seq_len": seq, "from": where},
         "board": BOARD, "tokens": tokens, "kv_bytes_per_token": lay.kv_bytes_per_token,
         "descriptor_bytes": lay.data_bytes, "descriptors_per_token": 2 * L,
         "slots": SLOTS, "max_burst": MAX_BURST, "tokens_per_block": lay.tokens_per_block}
    for mode, pre in (("spill", ""), ("write-through", "writethrough_")):
        un = scenario(shape, tokens, False, mode=mode)
        me = scenario(shape, tokens, True, mode=mode)
        for name, d in (("unmerged", un), ("merged", me)):
            if d["charged_kv_write_psram"] != d["bytes"] or d["charged_kv_write_sram"] != d["bytes"]:
                raise UserError("bench dma: bytes moved != bytes charged (%s %s)" % (mode, name), 1)
            r[pre + "dma_transactions_" + name] = d["transactions"]
            r[pre + "transactions_per_token_" + name] = round(d["transactions"] / tokens, 4)
            r[pre + "dma_busy_us_per_token_" + name] = round(d["dma_busy_ns"] / tokens / 1000, 2)
            r[pre + "producer_stall_us_" + name] = d["producer_stall_us"]
            if not pre:
                r["gdma_descriptors_" + name] = d["gdma_descriptors"]
                r["max_depth_" + name] = d["max_depth"]
                r["bytes_moved_" + name] = d["bytes"]
                r["bytes_charged_psram_" + name] = d["charged_kv_write_psram"]
        r[pre + "dma_transactions_ratio"] = round(un["transactions"] / me["transactions"], 2)
    sweep = []
    for slots, mb in SWEEP:
        d = scenario(shape, tokens, True, slots=slots, max_burst=mb)
        sweep.append({"slots": slots, "max_burst": mb, "transactions": d["transactions"],
                      "transactions_per_token": round(d["transactions"] / tokens, 4),
                      "ratio": round(r["dma_transactions_unmerged"] / d["transactions"], 2),
                      "dma_busy_us_per_token": round(d["dma_busy_ns"] / tokens / 1000, 2),
                      "producer_stall_us": d["producer_stall_us"]})
    r["sweep"] = sweep
    r["bytes_verified"] = True
    r.update(flash_figures())
    return r


FLASH_BATCH = 16  # tokens per write-back flush (the source documents' default)


def flash_figures():
    # flash sector erases per 1,000 tokens through the flash tier, write-through and with
    # write-back batching: measured by the flash tier's own model (firmware_py/tiers.py +
    # flashkv.py through host/bench/_flash.py, the tiers engineer's helper for this
    # benchmark); the keys are left out, and said so, where that tier is absent
    try:
        from host.bench import _flash
    except ImportError as e:
        return {"flash_writeback": "not measured: the flash tier is not importable here (%s)" % e}
    wt = _flash.erases_per_1000_tokens(1)
    wb = _flash.erases_per_1000_tokens(FLASH_BATCH)
    return {
        "flash_erases_per_1000_tokens_writethrough": wt["erases_per_1000_tokens"],
        "flash_erases_per_1000_tokens_writeback": wb["erases_per_1000_tokens"],
        "flash_erase_ratio": round(wt["erases_per_1000_tokens"] / wb["erases_per_1000_tokens"], 2),
        "flash_writeback_batch_tokens": FLASH_BATCH,
        "flash": {"writethrough": wt, "writeback": wb,
                  "source": "host/bench/_flash.py: firmware_py/tiers.py + flashkv.py erase model (deterministic counts)"},
    }


def run(as_json=False):
    # ./kv bench dma [--json]: print the figures (one JSON object with --json); returns them
    r = measure()
    return emit(r, as_json, render)


# --- the benchmark's section of docs/benchmarks.md (host/benchdoc.py calls these) ------
TITLE = "DMA descriptor queue: transactions for stories260K's KV, merged and not"


def render(r):
    # markdown lines of the section from the figures r
    m = r["model_shape"]
    L = [
        "Shape: %d layers x %d KV heads x %d (%s), fp32: %s B of K/V per token, one descriptor per "
        "layer and K/V (%d B), %d per token; %d tokens on `%s`, ring of %d descriptors, bursts of at "
        "most {:,} B. Spill: a full 16-token SRAM block moved to PSRAM in memory order (double-buffered); "
        "write-through: each token's rows sent as written. Every byte checked; bytes charged to "
        "kv_write on each tier equal bytes moved. DMA time: the cost model's ns per burst (each "
        "tier's first-access latency is the per-burst setup), summed.".format(r["max_burst"]) % (
            m["n_layers"], m["n_kv_heads"], m["head_dim"], m["from"], "{:,}".format(r["kv_bytes_per_token"]),
            r["descriptor_bytes"], r["descriptors_per_token"], r["tokens"], r["board"], r["slots"]),
        "",
        "| case | transactions unmerged | merged | ratio | per token unmerged | merged | DMA us/token unmerged | merged |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, pre in (("spill (block moves)", ""), ("write-through", "writethrough_")):
        L.append("| %s | {:,} | {:,} | %.2f | %.4g | %.4g | %.2f | %.2f |".format(
            r[pre + "dma_transactions_unmerged"], r[pre + "dma_transactions_merged"]) % (
            name, r[pre + "dma_transactions_ratio"], r[pre + "transactions_per_token_unmerged"],
            r[pre + "transactions_per_token_merged"], r[pre + "dma_busy_us_per_token_unmerged"],
            r[pre + "dma_busy_us_per_token_merged"]))
    L += ["", "Spill, merged, by ring size and burst limit:", "",
          "| slots | max burst B | transactions | per token | ratio to unmerged | DMA us/token | producer stall us |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in r["sweep"]:
        L.append("| %d | {:,} | {:,} | %.4g | %.2f | %.2f | {:,} |".format(s["max_burst"], s["transactions"], s["producer_stall_us"]) % (
            s["slots"], s["transactions_per_token"], s["ratio"], s["dma_busy_us_per_token"]))
    if "flash" in r:
        f = r["flash"]
        L += ["", "Flash sector erases per 1,000 tokens of the same KV through the flash tier (%s; "
              "blocks past the newest SRAM and PSRAM ones live in a preallocated file of 4 KiB sectors):" % f["source"], "",
              "| mode | erases per 1,000 tokens | max erases per sector | flash ms per token | sector lifetime, tokens (one slot, the worst case) |",
              "| --- | --- | --- | --- | --- |"]
        for name, d in (("write-through", f["writethrough"]), ("write-back, %d tokens" % r["flash_writeback_batch_tokens"], f["writeback"])):
            L.append("| %s | {:,} | {:,} | %.3f | {:,} |".format(d["erases_per_1000_tokens"], d["max_erases_per_sector"],
                                                               d["lifetime_tokens_one_slot"]) % (name, d["flash_ms_per_token"]))
        L += ["", "The lifetime to trust is the worst case, `lifetime_tokens_one_slot`: a %s-erase sector of one slot "
              "taking every spilled block (`FlashStore`'s free list hands out the last freed slot first and nothing levels "
              "the wear), the same definition and figure as `./kv budget --flash-kv-bytes max` "
              "(`host/budget.py: lifetime_tokens_one_slot`; `tests/test_dma_bench.py` checks they agree). Extrapolating this "
              "run's hottest sector instead would say more, since in %s tokens no slot is reused; the erases spread evenly over "
              "this run's %s slots (`lifetime_tokens_levelled` in the JSON: %s tokens write-back) are a ceiling, not a promise."
              % ("{:,}".format(f["writeback"]["endurance_erases"]), "{:,}".format(f["writeback"]["tokens"]), f["writeback"]["flash_slots"],
                 "{:,}".format(f["writeback"]["lifetime_tokens_levelled"] or 0))]
    else:
        L += ["", "Flash sector erases per 1,000 tokens: %s." % r["flash_writeback"]]
    return L
