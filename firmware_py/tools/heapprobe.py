# Does the decoding firmware run with only `leave` bytes of its heap free after the
# boot? The probe behind firmware_py/heapmargin.py's figures (host/heapmargin.py
# bisects `leave` across processes, one boot per process as on a board). Usage (the
# unix port; key=value arguments):
#   micropython -X heapsize=N firmware_py/tools/heapprobe.py part=decode|telemetry|tasks \
#       model=M tokenizer=T leave=X [kv_dtype=D] [tokens=K] [temperature=F] [seed=S] \
#       [board=boards/B.json] [config=scenarios/S.json] [blocks=B] [pad=P]
# part decode: decode.Session (a pool of `blocks`) and K tokens through the kernel task;
# telemetry: the same through firmware_py.serve.Server (its telemetry task sending every
# frame to a sink); tasks: Server with the config's tasks beside the decode. After the
# boot, ballast takes the whole free heap but one piece of `leave` bytes (the margin the
# boot's rule keeps in one piece). Then the part runs. One line:
#   "heapprobe: part=P leave=X ok=1 tokens=K" or "... ok=0 why=WHAT", exit 0;
# bad arguments: one line, exit 2. pad=P holds P bytes from before the firmware's imports
# to the end: it shifts the heap's layout (which pieces the GC's holes are), which moves
# the least `leave` by hundreds of bytes (a longer model path does the same); the host
# takes the most over several pads.
import gc

if hasattr(gc, "threshold"):  # MicroPython: collect the imports' garbage as it comes, so that the
    gc.threshold(16384)  # compiled code lands packed, not scattered over the free heap (decode.BOOT_GC_BYTES;
    # a decode.Session boot ends it)
import sys

from firmware_py import compat

_KEYS = {"part": "decode", "model": "", "tokenizer": "", "leave": "-1", "kv_dtype": "fp32", "tokens": "24",
         "temperature": "0", "seed": "1", "board": "", "config": "", "blocks": "4", "prompt": "Once upon a time", "trace": "0",
         "pad": "0"}


_BALLAST = 4096  # pieces of ballast at most


def _args(argv):
    o = dict(_KEYS)
    for a in argv:
        k, sep, v = a.partition("=")
        if not sep or k not in o:
            raise ValueError("unknown argument %r (want key=value, key in %s)" % (a, ", ".join(sorted(o))))
        o[k] = v
    if o["part"] not in ("decode", "telemetry", "tasks"):
        raise ValueError("part must be decode, telemetry or tasks, got %r" % o["part"])
    if not o["model"] or not o["tokenizer"] or int(o["leave"]) < 0:
        raise ValueError("model=PATH, tokenizer=PATH and leave=BYTES (>= 0) are required")
    if o["part"] == "tasks" and (not o["config"] or not o["board"]):
        raise ValueError("part=tasks needs config=PATH and board=PATH")
    return o


# leave exactly `leave` bytes free, in one piece: hold a piece of that size, eat the
# rest of the free heap with bytearrays (halving the size from the largest piece each
# time one no longer fits, down to 64 B: a failed allocation costs one collection), then
# let the held piece go. That is the worst the boot's rule allows: the margin in one
# piece after the pool, everything else taken. Returns keep
def _ballast(leave, keep):
    held = bytearray(leave) if leave else None
    free, size = compat.heap_probe(64)
    i = 0
    while size >= 64 and i < len(keep):
        try:
            keep[i] = bytearray(size - 32)  # - the piece's own GC rounding
            i += 1
        except MemoryError:
            size //= 2
    held = None  # noqa: F841 - freed: the `leave` bytes are the free heap now
    compat.collect()
    if i == len(keep) or compat.mem_free() > leave + 32768:
        raise BallastError("the free heap could not be eaten down to %d B (%d B free, %d pieces)" % (leave, compat.mem_free(), i))
    return keep


class BallastError(Exception):
    # the measurement itself failed: the host must not read it as the part failing
    pass


def _sink(buf, n=None):
    return len(buf) if n is None else n


def main(argv):
    if not compat.IS_MICROPYTHON:
        print("heapprobe: runs on MicroPython (the unix port), not CPython")
        return 2
    try:
        o = _args(argv)
        leave, k = int(o["leave"]), int(o["tokens"])
        temp, seed, blocks = float(o["temperature"]), int(o["seed"]), int(o["blocks"])
        pad = int(o["pad"])
        if pad < 0:
            raise ValueError("pad must be >= 0, got %d" % pad)
    except ValueError as e:
        print("heapprobe: %s" % e)
        return 2
    held = bytearray(pad) if pad else None  # the layout's shift, held to the end
    from firmware_py import decode  # noqa: PLC0415 - the firmware, imported as main.py would

    keep = [None] * _BALLAST  # sized first: a growing list would need the heap the ballast took
    part = o["part"]
    try:
        if part == "decode":
            s = decode.Session(o["model"], o["tokenizer"], o["kv_dtype"], blocks=blocks, temperature=temp, seed=seed)
            _ballast(leave, keep)
            ids = s.encode(o["prompt"])  # the request's own allocations are part of what runs after the boot
            kern = decode.Kernel(decode.RealClock(), max_tasks=4)
            t = kern.spawn("decode", 1, s.task(kern, ids, k, _drop))
            kern.run()
            if t.exc is not None:
                raise t.exc
            made = s.n_new
        else:
            from firmware_py import serve  # noqa: PLC0415

            app = brd = None
            if part == "tasks":
                from firmware_py import board  # noqa: PLC0415

                brd = board.load(o["board"])
                app = serve.load_config(o["config"])
                if app is None:
                    raise ValueError("%s: cannot be read" % o["config"])
            srv = serve.Server(_sink, model=o["model"], tokenizer=o["tokenizer"], max_requests=1, app=app, board=brd,
                               out=_drop_line, kv_dtype=o["kv_dtype"], kv_blocks=blocks, temperature=temp, seed=seed)
            s = srv.session_next()  # the boot, before the ballast
            _ballast(leave, keep)
            if srv.start(o["prompt"], k) != 0:
                raise RuntimeError("the request was refused")
            srv.run()
            for t in srv.k.tasks:
                if t is not None and getattr(t, "exc", None) is not None:
                    raise t.exc
            made = s.n_new
    except BallastError as e:
        keep = None
        print("heapprobe: part=%s leave=%d ok=0 why=ballast: %s" % (part, leave, e))
        return 0
    except MemoryError as e:
        keep = None
        if o.get("trace") == "1":
            sys.print_exception(e)
        print("heapprobe: part=%s leave=%d ok=0 why=MemoryError" % (part, leave))
        return 0
    except (decode.DecodeError, OSError, ValueError, RuntimeError) as e:
        keep = None
        print("heapprobe: part=%s leave=%d ok=0 why=%s: %s" % (part, leave, type(e).__name__, e))
        return 0
    free = compat.mem_free()
    keep = held = None  # noqa: F841
    ok = made == k
    print("heapprobe: part=%s leave=%d ok=%d tokens=%d free_after=%d" % (part, leave, 1 if ok else 0, made, free))
    return 0


def _drop(b):
    pass


def _drop_line(line):
    pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
