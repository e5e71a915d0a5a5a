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
# "kvprobe: boot blocks=0 limit=WHY" when serve did not boot; exit 0.
import gc
import sys

VIA = "main"
for _a in sys.argv[1:]:
    if _a.startswith("via="):
        VIA = _a[4:]
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


def main(argv):
    k = 8
    for a in argv:
        key, _, v = a.partition("=")
        if key == "via" and v in ("main", "repl"):
            continue
        if key != "decode":
            print("serveprobe: unknown argument %r (want decode=K, via=main|repl)" % a)
            return 2
        k = int(v)
    box = []
    try:  # the line ./kv monitor --start sends, with one request
        exec("from firmware_py import serve\nbox.append(serve.main(prompt='Once upon a time', tokens=%d, max_requests=1))\n" % k,
             {"box": box})
    except MemoryError:
        print("kvprobe: boot blocks=0 limit=MemoryError")
        return 0
    from firmware_py import compat  # noqa: PLC0415
    from firmware_py.status import E_FULL, E_NO_BLOCK  # noqa: PLC0415

    s = box[0].session
    if s is None:
        print("kvprobe: boot blocks=0 limit=serve_did_not_boot")
        return 0
    lay = s.cache.layout
    row = bytearray(lay.row_bytes)
    n = 0
    st = 0
    room = s.pool.n_blocks * lay.tokens_per_block + 1 - s.cache.length(s.h)
    compat.heap_lock()
    try:
        while n < room:
            st = s.cache.append(s.h, row)
            if st < 0:
                break
            n += 1
    except MemoryError:
        compat.heap_unlock()
        print("kvprobe: boot blocks=0 limit=MemoryError_in_the_locked_fill")
        return 0
    compat.heap_unlock()
    status = "FULL" if st == E_FULL else "NO_BLOCK" if st == E_NO_BLOCK else "OK"
    print("kvprobe: boot blocks=%d free=%d largest=%d margin=%d model_bytes=%d tokens=%d status=%s decoded=%d limit=%s "
          "free0=%d plan=%d weights=%d" % (s.pool.n_blocks, s.heap_free, s.heap_largest, s.margin, s.model_bytes,
                                           s.cache.length(s.h), status, s.n_new, s.boot_limit.replace(" ", "_"),
                                           s.heap_free0, s.plan_blocks, s.weights.nbytes))
    return 0


sys.exit(main(sys.argv[1:]))
