# Run a script the way the firmware runs: under MicroPython's unix port with a board's
# heap, or under CPython, with the repository importable. One place for tests and
# benchmarks, so both interpreters always get the same environment.
import os
import subprocess
import sys

from host import boards, mp32, paths


def command(script, interp, usable_heap=None, heapsize=None, args=()):
    # (argv, env) for script under "micropython" (the 64-bit PyPI unix port),
    # "micropython32" (the 32-bit unix port host/mp32.py builds: the board's word size)
    # or "cpython". MicroPython gets -X heapsize=heapsize when given, else the size
    # whose usable GC heap is usable_heap (default: the default board's micropython_heap_bytes)
    env = dict(os.environ)
    if interp in ("micropython", "micropython32"):
        word = 4 if interp == "micropython32" else None
        if heapsize is None:
            heapsize = boards.unix_heapsize(usable_heap or boards.load(paths.DEFAULT_BOARD).mpy_heap, word)
        env["MICROPYPATH"] = paths.ROOT + ":.frozen"
        exe = mp32.build() if word else paths.tool("micropython")
        return [exe, "-X", "heapsize=%d" % heapsize, script, *args], env
    if interp != "cpython":
        raise ValueError("interp must be micropython, micropython32 or cpython, not %r" % interp)
    env["PYTHONPATH"] = paths.ROOT
    return [sys.executable, script, *args], env


def run(script, interp, usable_heap=None, heapsize=None, args=(), timeout=600):
    # run it from the repository root; subprocess.CompletedProcess with text output
    cmd, env = command(script, interp, usable_heap, heapsize, args)
    return subprocess.run(cmd, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=timeout)
