# kvrtos firmware: runs unchanged on MicroPython (the board) and CPython (the emulator).
VERSION = "0.1.0"

# MicroPython: collect the imports' garbage as it comes (every 16 KB allocated), whatever
# the entry point (main.py, the raw REPL's `from firmware_py import serve` that ./kv
# monitor --start sends after a soft reset, which skips main.py, a user's own script), so
# that the compiled code lands packed at the bottom of the heap instead of scattered over
# it with holes between (the pool must be one piece: on the 32-bit port, serve imported
# without it left 111 KB of a 900 KB heap outside the largest block). A threshold already
# set is kept; decode.Session's boot ends it (decode.BOOT_GC_BYTES)
try:
    import gc as _gc

    if _gc.threshold() == -1:
        _gc.threshold(16384)
    del _gc
except (ImportError, AttributeError, TypeError):  # CPython: gc has no threshold()
    pass
