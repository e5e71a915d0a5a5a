# Scheduler benchmark: our kernel's switch cost against the interpreter's own asyncio,
# heap bytes per switch, and wake-up latency of a 1 ms periodic task beside 100 busy
# low-priority tasks, on MicroPython (the unix port with the default board's heap) and
# CPython, measured in one run. The body is _sched_body.py, run once per interpreter.
import json
import os

from host import boards, paths
from host import interp as interp_mod
from host.errors import UserError

BODY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sched_body.py")
SWITCHES = 100000  # yields per task per repetition (two tasks)
REPS = 5  # repetitions; medians reported
LATENCY_MS = 1000  # periods of the 1 ms task in the latency scenario


def _body(interp, switches, reps, latency_ms):
    # run _sched_body.py under "micropython" (the default board's heap) or "cpython"; its JSON object
    r = interp_mod.run(BODY, interp, args=[str(switches), str(reps), str(latency_ms)])
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        raise UserError("sched bench on %s failed (exit %d): %s" % (interp, r.returncode, (r.stderr or r.stdout).strip()[-500:]), 1)
    return json.loads(lines[-1])


# measure on both interpreters and return one dict with _micropython / _cpython keys
def measure(switches=SWITCHES, reps=REPS, latency_ms=LATENCY_MS):
    out = {
        "switches_per_task": switches,
        "reps": reps,
        "latency_periods_requested": latency_ms,
        "board": paths.DEFAULT_BOARD,
        "micropython_heap_bytes": boards.load(paths.DEFAULT_BOARD).mpy_heap,
    }
    for interp in ("micropython", "cpython"):
        for key, v in _body(interp, switches, reps, latency_ms).items():
            out["%s_%s" % (key, interp)] = v
    for interp in ("micropython", "cpython"):
        out["switch_ratio_vs_asyncio_%s" % interp] = out.pop("switch_ratio_vs_asyncio_%s" % interp)
    return out


# ./kv bench sched [--json]: print the figures (one JSON object with --json); returns them
def run(as_json=False, switches=SWITCHES, reps=REPS, latency_ms=LATENCY_MS):
    r = measure(switches, reps, latency_ms)
    if as_json:
        print(json.dumps(r, sort_keys=True))
        return r
    print("scheduler, median of %d runs of %d switches (2 tasks)" % (reps, 2 * switches))
    for interp in ("micropython", "cpython"):

        def g(key, interp=interp):
            return r["%s_%s" % (key, interp)]

        alloc = g("alloc_bytes_per_switch")
        print("  %-11s switch %5d ns, asyncio %5d ns, ratio %.3f; alloc/switch %s" % (
            interp, g("switch_ns"), g("switch_ns_asyncio"), g("switch_ratio_vs_asyncio"),
            "n/a (no fixed heap)" if alloc is None else "%s B" % alloc))
        print("  %-11s 1 ms task beside 100 x 200-500 us tasks: worst wake-up %d us (low slice max %d us), "
              "misses %d of %d; asyncio sleep_ms(1) worst %d us late" % (
                  "", g("latency_worst_us"), g("latency_low_slice_max_us"), g("latency_deadline_misses"),
                  g("latency_periods"), g("latency_asyncio_worst_us")))
    return r
