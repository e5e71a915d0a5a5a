# Copied to the board as /main.py by `kv flash`: MicroPython runs it after boot.py.
import gc

if hasattr(gc, "threshold"):  # MicroPython: collect the imports' garbage as it comes, so that the
    gc.threshold(16384)  # compiled code lands packed, not scattered over the free heap (decode.BOOT_GC_BYTES;
    # a decode.Session boot ends it)

from firmware_py import app

app.main()
