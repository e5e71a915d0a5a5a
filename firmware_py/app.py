# Boot: the board profile flashed beside the firmware -> boot report (board, heap, the
# model flashed beside it, the application config kvrtos.json when there is one: its
# decode settings and the tasks that run beside the decode) -> generation over the raw
# REPL (decode.run) or serving with telemetry (firmware_py/serve.py: `./kv monitor
# --start`, or main(serve=True)), which spawns the config's tasks beside the decode.
import gc
import sys

from firmware_py import VERSION, compat
from firmware_py import board as board_mod

PROFILE = "board.json"  # written next to main.py by `kv flash`
REPORT_END = "kvrtos: boot report end"  # the host waits for this line
MODEL_FILE = "model.bin"  # where `kv flash --model` puts a checkpoint (decode.MODEL_FILE)
CONFIG_FILE = "kvrtos.json"  # where `kv flash --config` puts the application config (serve.CONFIG_FILE)


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
    out("  cpu          %s" % _clock(b))
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
    _config_report(out)
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


def _config_report(out):
    # the application config `kv flash --config` put here: its name, decode settings and
    # tasks, or why it does not load (one line); nothing when there is none
    from firmware_py import appcfg  # noqa: PLC0415 - small, configuration only

    try:
        f = open(CONFIG_FILE)
    except OSError:
        return
    try:
        text = f.read()
    finally:
        f.close()
    try:
        cfg = appcfg.load(text)
    except appcfg.AppConfigError as e:
        out("  config       %s refused: %s" % (CONFIG_FILE, e))
        return
    d = cfg["decode"]
    keys = ("model", "policy", "window", "kv_dtype", "tokens")
    dec = ", ".join("%s %s" % (k, d[k]) for k in keys if k in d) or "the firmware's defaults"
    tasks = ", ".join("%s (%s, priority %d)" % (t["name"], t["kind"], t["priority"]) for t in cfg["tasks"]) or "none"
    out("  config       %s %r: decode %s; tasks beside decode: %s" % (CONFIG_FILE, cfg["name"], dec, tasks))


def _clock(b):
    # the boot report's cpu line: the clock, set to the profile's where the port can
    want = b.cpu_mhz if b is not None else 0
    hz, how = compat.cpu_clock(want)
    if hz is None:
        return "clock n/a on this port" + (" (profile: %d MHz)" % want if want else "")
    mhz = hz // 1000000
    if how == "set":
        return "%d MHz (set at boot: the profile's clock)" % mhz
    if how == "refused":
        return "%d MHz (the profile's %d MHz was refused: the cost figures, counted at %d MHz, overstate this board)" % (
            mhz, want, want)
    return "%d MHz" % mhz


def _seen(n):
    # a size the chip reported, or why there is none
    return "n/a on this port" if n is None else "%d B seen" % n


def main(serve=False):
    # the firmware's entry point, run by main.py: the boot report; serve=True then serves
    # (firmware_py/serve.py) with the config's tasks beside the decode until Ctrl-C, for a
    # board that runs on its own (a main.py of `app.main(serve=True)`)
    boot_report()
    if serve:
        from firmware_py import serve as serve_mod  # noqa: PLC0415

        serve_mod.main()
