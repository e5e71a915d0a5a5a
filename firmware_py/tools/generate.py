# The unix port's (and a board's) command line for decode.run: generate text from a
# llama2.c model as a kernel task, printing it token by token, then one summary line.
#   micropython -X heapsize=N firmware_py/tools/generate.py --model M --tokenizer T \
#       --prompt TEXT --tokens N [--temperature T --top-p P --seed S --kv-dtype D
#       --policy P --window W --backend B --rope R --heap BYTES --reserve BYTES --trace-heap]
# --heap: the usable heap the calculator's rule sizes the pool from (default: none, the
# boot measures this interpreter's heap and sizes the pool from it, as a board does);
# --reserve: a floor for the firmware's own share in that rule (a board profile's
# firmware_reserved_bytes, so host/budget.py computes the same pool)
# host/generate.py runs this for `./kv generate --runtime micropython`. A mistake is one
# line "generate: ..." on stderr and exit status 2. --trace-heap collects the heap after every
# new token and prints "heap: ..." (free heap and pool use, min and max) at the end.
import gc

if hasattr(gc, "threshold"):  # MicroPython: collect the imports' garbage as it comes, so that the
    gc.threshold(16384)  # compiled code lands packed, not scattered over the free heap (decode.BOOT_GC_BYTES;
    # a decode.Session boot ends it)
import sys

from firmware_py import decode

_OPTS = {"--model": "", "--tokenizer": "", "--prompt": "", "--tokens": "32", "--temperature": "0",
         "--top-p": "1", "--seed": "0", "--kv-dtype": "auto", "--policy": "full", "--window": "0",
         "--backend": "auto", "--rope": "absolute", "--heap": "0", "--reserve": "0"}


# the options as a dict (flag -> text) plus the --trace-heap switch; ValueError on a bad one
def parse(argv):
    o = dict(_OPTS)
    o["--trace-heap"] = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--trace-heap":
            o[a] = True
            i += 1
            continue
        if a not in _OPTS or i + 1 >= len(argv):
            raise ValueError("unknown option or missing value: %r (options: %s)" % (a, " ".join(sorted(_OPTS))))
        o[a] = argv[i + 1]
        i += 2
    if not o["--model"] or not o["--tokenizer"]:
        raise ValueError("--model and --tokenizer are required")
    return o


# a number from an option's text, or ValueError naming the option
def _num(o, flag, kind):
    try:
        return kind(o[flag])
    except ValueError:
        raise ValueError("%s must be a number, got %r" % (flag, o[flag]))


# one line on stderr (the host reads the reason there; the text stays on stdout)
def _err(line):
    sys.stderr.write(line + "\n")


# run from argv; returns the exit status
def main(argv):
    try:
        o = parse(argv)
        n = _num(o, "--tokens", int)
        if n < 1:
            raise ValueError("--tokens must be >= 1, got %d" % n)
        opts = {"kv_dtype": o["--kv-dtype"], "policy": o["--policy"], "window": _num(o, "--window", int),
                "backend": o["--backend"], "rope": o["--rope"], "heap": _num(o, "--heap", int),
                "reserve": _num(o, "--reserve", int),
                "temperature": _num(o, "--temperature", float), "top_p": _num(o, "--top-p", float),
                "seed": _num(o, "--seed", int)}
    except ValueError as e:
        _err("generate: %s" % e)
        return 2
    try:
        decode.run(o["--model"], o["--tokenizer"], o["--prompt"], n, trace_heap=o["--trace-heap"], **opts)
    except decode.DecodeError as e:
        _err("generate: %s" % e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
