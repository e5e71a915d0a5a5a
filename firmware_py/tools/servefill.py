# serveprobe.py's second half, imported after serve's boot so that its code is not part
# of the heap the boot measured (a board's raw REPL holds only the line it runs): fill
# the pool serve's boot sized to FULL under heap_lock and print kvprobe's boot line
from firmware_py import compat
from firmware_py.status import E_FULL, E_NO_BLOCK


def report(srv):
    s = srv.session
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
