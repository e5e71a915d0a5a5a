# Scheduler benchmark: our kernel's switch cost against the interpreter's own asyncio,
# heap bytes per switch, and wake-up latency of a 1 ms periodic task beside 100 busy
# low-priority tasks, on MicroPython (the unix port with the default board's heap) and
# CPython, measured in one run. The body is _sched_body.py, run once per interpreter.
import json
import os

from host import boards, paths
from host import interp as interp_mod
from host.errors import UserError

# JSON keys (stable; docs/benchmarks.md is generated from them), each with a suffix
# _micropython or _cpython:
#   switch_ns                 our kernel, ns per switch (two tasks yielding), median of reps
#   switch_ns_asyncio         the interpreter's asyncio sleep(0) ping-pong, ns per switch
#   switch_ns_floor           a bare round-robin of two generators: the floor, ns per switch
#   switch_ratio_vs_asyncio   switch_ns / switch_ns_asyncio
#   switch_ratio_vs_floor     switch_ns / switch_ns_floor
#   alloc_bytes_per_switch    heap bytes per switch, run total / switches (a fraction; None on CPython)
#   alloc_bytes_per_kernel_run  heap bytes of one whole kernel run, setup included
#   alloc_bytes_per_switch_asyncio  the same for asyncio
#   heap_locked_switches_ok   the kernel run completes with the heap locked (MicroPython)
#   latency_worst_us, latency_deadline_misses, latency_periods, latency_low_slice_max_us,
#   latency_asyncio_worst_us, latency_asyncio_late_sleeps, latency_asyncio_sleeps,
#   latency_stats_line        the 1 ms task beside 100 busy tasks, ours and asyncio's
#   interpreter, interpreter_version  what ran it
# and without suffix: switches_per_task, reps, latency_periods_requested, board,
# micropython_heap_bytes, asyncio_poll_note.

BODY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sched_body.py")
SWITCHES = 100000  # yields per task per repetition (two tasks)
REPS = 5  # repetitions; medians reported
LATENCY_MS = 1000  # periods of the 1 ms task in the latency scenario
ASYNCIO_POLL_NOTE = ("the unix port's asyncio pays a poll() system call per switch (its IO poller) "
                     "that a board's asyncio does not; our kernel makes no system call per switch")


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
        "asyncio_poll_note": ASYNCIO_POLL_NOTE,
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
        print("  %-11s switch %5d ns, asyncio %5d ns (ratio %.3f), floor %5d ns (ratio %.2f); alloc/switch %s" % (
            interp, g("switch_ns"), g("switch_ns_asyncio"), g("switch_ratio_vs_asyncio"), g("switch_ns_floor"),
            g("switch_ratio_vs_floor"), "n/a (no fixed heap)" if alloc is None else "%s B" % alloc))
        print("  %-11s 1 ms task beside 100 x 200-500 us tasks: worst wake-up %d us (low slice max %d us), "
              "misses %d of %d; asyncio sleep_ms(1) worst %d us late" % (
                  "", g("latency_worst_us"), g("latency_low_slice_max_us"), g("latency_deadline_misses"),
                  g("latency_periods"), g("latency_asyncio_worst_us")))
    print("  note: " + ASYNCIO_POLL_NOTE)
    print("  interpreters: %s; %s" % (r["interpreter_micropython"], r["interpreter_cpython"]))
    return r
