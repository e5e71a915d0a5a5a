# Boot: the board profile flashed beside the firmware -> boot report (board, heap, the
# model flashed beside it) -> generation runs over the raw REPL (decode.run) -> (later issues)
# pool, KV cache, model and tasks -> kernel.run().
import gc
import sys

from firmware_py import VERSION, compat
from firmware_py import board as board_mod

PROFILE = "board.json"  # written next to main.py by `kv flash`
REPORT_END = "kvrtos: boot report end"  # the host waits for this line
MODEL_FILE = "model.bin"  # where `kv flash --model` puts a checkpoint (decode.MODEL_FILE)


def _port_sizes():
    # (flash bytes, PSRAM bytes) as the chip reports them, or None where the port cannot say
    flash = psram = None
    try:
        import esp  # ESP32 ports only

        flash = esp.flash_size()
    except (ImportError, AttributeError):
        pass
    try:
        import esp32  # ESP32 ports only

        # Internal RAM is 512 KiB on the S3: a larger IDF data heap or GC heap means
        # the rest sits in PSRAM, which MicroPython hands to its GC heap.
        idf = 0
        for region in esp32.idf_heap_info(esp32.HEAP_DATA):
            idf += region[0]
        gc_total = gc.mem_free() + gc.mem_alloc()
        seen = idf + gc_total
        psram = seen - 512 * 1024 if seen > 512 * 1024 else 0
    except (ImportError, AttributeError):
        pass
    return flash, psram


def boot_report(out=print):
    # print what this board is and what memory it has; returns the Board or None
    gc.collect()
    free = compat.mem_free()
    used = compat.mem_alloc()
    try:
        b = board_mod.load(PROFILE)
    except board_mod.BoardError as e:
        b = None
        out("kvrtos: no usable board profile (%s)" % e)
    impl = sys.implementation
    out("kvrtos: boot report")
    out("  firmware     kvrtos %s" % VERSION)
    if b is not None:
        out("  board        %s (%s)" % (b.name, b.title))
    out("  micropython  %s on %s" % (".".join(str(v) for v in impl.version[:3]), sys.platform))
    if free is None:
        out("  heap         not measurable on %s" % impl.name)
    else:
        out("  heap         free %d B, used %d B, total %d B" % (free, used, free + used))
    flash, psram = _port_sizes()
    if b is not None:
        want_flash = b.total_bytes("flash")
        want_psram = b.total_bytes("psram")
        out("  flash        %s (profile: %d B)" % (_seen(flash), want_flash))
        out("  psram        %s (profile: %d B)" % (_seen(psram), want_psram))
    _model_report(out)
    out(REPORT_END)
    return b


def _model_report(out):
    # one line on the model `kv flash --model` put here (decode.MODEL_FILE), header only
    from firmware_py import llama2c  # noqa: PLC0415 - small; decode itself loads on demand

    try:
        cfg, lay = llama2c.plan(MODEL_FILE)
    except llama2c.CheckpointError as e:
        msg = str(e)
        out("  model        %s" % ("none (./kv flash --model PATH puts one here)" if "cannot be read" in msg else msg))
        return
    out("  model        %s: %s, dim %d, %d layers, vocab %d, context %d, %d B of weights in memory"
        % (MODEL_FILE, "int8 " + cfg.format if cfg.groups else "fp32", cfg.dim, cfg.n_layers, cfg.vocab_size,
           cfg.seq_len, lay.memory_bytes()))


def _seen(n):
    # a size the chip reported, or why there is none
    return "n/a on this port" if n is None else "%d B seen" % n


def main():
    # the firmware's entry point, run by main.py
    boot_report()
