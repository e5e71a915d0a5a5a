# Boot the firmware the way a flashed board does and report what serve's boot measured:
# the board's own files in the current folder (board.json, model.bin, tokenizer.bin and,
# for the config's tasks, kvrtos.json: what `./kv flash --model [--config]` puts there),
# its .mpy modules on the path, then main.py's steps (the GC threshold, app.main's boot
# report) and serve.main with one request of decode=K tokens, as `./kv monitor --start
# --prompt` runs it. The pool serve's boot sized is then filled to FULL under heap_lock
# (the boot-sized pool really holds its blocks). `./kv heapmargin` runs it on each word
# size and path for the calculator's "serve" and "serve+tasks" footprints
# (firmware_py/heapmargin.py FOOTPRINT); usage, in the board's folder:
#   micropython -X heapsize=N serveprobe.py [decode=8] [via=main|repl]
# via=main (default): main.py's boot report, then serve (app.main(serve=True)); via=repl:
# no boot report, the host's sha256 query from repl.txt, then serve (./kv monitor --start)
# It prints serve's own output (its frames and lines), then one line
# "kvprobe: boot blocks=B free=F largest=L margin=M model_bytes=X tokens=T status=S
# decoded=K limit=WHY free0=F0 plan=P weights=W" (kvprobe.py size=boot's line), or
# "kvprobe: boot blocks=0 limit=WHY" when serve did not boot; exit 0. The fill and the line
# are servefill.py (beside it), imported after the boot: this script is kept to what a board
# holds while serve boots (the REPL keeps only the line it runs; its code is measured too).
import gc
import sys

VIA = "main"
K = 8  # the request's new tokens
for _a in sys.argv[1:]:
    if _a in ("via=main", "via=repl"):
        VIA = _a[4:]
    elif _a.startswith("decode=") and _a[7:].isdigit():
        K = int(_a[7:])
    else:
        print("serveprobe: unknown argument %r (want decode=K, via=main|repl)" % _a)
        sys.exit(2)
_a = None
if VIA == "main":
    gc.threshold(16384)  # main.py's first step, as on the board (the raw REPL's soft reset skips it)
    from firmware_py import app

    app.main()  # the boot report, as main.py runs it
elif VIA == "repl":
    # ./kv monitor --start: the raw REPL's soft reset (main.py does not run), the host's
    # queries (REPL.txt, written by the host: flash's sha256 script), each run as the REPL
    # runs a pasted block, in __main__'s globals
    _f = open("repl.txt")
    _src = _f.read()
    _f.close()
    exec(_src, globals())
    _src = _f = None


box = []
try:  # the line ./kv monitor --start sends, with one request
    exec("from firmware_py import serve\nbox.append(serve.main(prompt='Once upon a time', tokens=%d, max_requests=1))\n" % K,
         {"box": box})
except MemoryError:
    print("kvprobe: boot blocks=0 limit=MemoryError")
    sys.exit(0)
import servefill  # noqa: E402 - after the boot: its code is not in what the boot measured

sys.exit(servefill.report(box[0]))
