# What telemetry costs the decode, measured on the interpreter that runs this (the
# MicroPython unix port for ./kv bench telemetry): one decode.Session boots once; then
# pairs of runs, side by side, each decoding `reps` requests of `n` tokens on the
# kernel with the real clock: without telemetry, and with the telemetry task at 10 Hz
# on a 115,200-baud link (frames written to /dev/null through a real stream write,
# the decode's text and token counts handed to it as serve.py does). The order
# alternates within pairs. Also the cost of one tick by itself. Prints one JSON line.
#   _telemetry_mp.py MODEL TOKENIZER N REPS PAIRS
import json
import sys
import time

from firmware_py import compat, decode, telemetry as tm
from firmware_py.clock import RealClock
from firmware_py.sched import Kernel


def us():
    return time.ticks_us() if compat.IS_MICROPYTHON else int(time.perf_counter() * 1e6)


def cpu_ms():
    # this process's CPU time (user + system) in ms from /proc/self/stat (10 ms ticks on
    # Linux): contention from the shared machine's other work does not stretch it as it
    # stretches the wall clock; None where there is no /proc
    try:
        f = open("/proc/self/stat")
        st = f.read()
        f.close()
    except OSError:
        return None
    parts = st[st.rindex(")") + 2:].split()
    return (int(parts[11]) + int(parts[12])) * 10  # utime, stime in USER_HZ = 100 ticks


def diff(a, b):
    return time.ticks_diff(a, b) if compat.IS_MICROPYTHON else a - b


def decode_runs(s, ids, n, reps, k, out, on_token, on_open):
    # reps requests of n tokens, one after another, in one kernel task
    s.on_token = on_token
    for _ in range(reps):
        s.cache.close(s.h)
        s.h = s.cache.open(s.region, s.policy, s.cap)
        on_open(s.h)
        yield from s.task(k, ids, n, out)


def one(s, ids, n, reps, t, with_tm):
    # one run on a fresh kernel; with_tm: the telemetry task t beside the decode (t is one
    # object for every run: its layout went out once, its counters go on)
    k = Kernel(RealClock(), max_tasks=4, verbose=True)
    if with_tm:
        t.kernel = k
        t.clock = k.clock
        t.last = k.clock.now()
        k.spawn("telemetry", 3, t.task(k))

        def out(b):
            t.text(b)

        def tok(_s):
            t.tokens += 1

        def opened(h):
            t.unwatch_seq(t.seqs[0])
            t.watch_seq(h, s.cap)
    else:
        def out(b):
            pass

        def tok(_s):
            pass

        def opened(h):
            pass

    def body():
        yield from decode_runs(s, ids, n, reps, k, out, tok, opened)
        k.stop()

    k.spawn("decode", 1, body())
    if with_tm:
        for i in range(len(k.tasks)):
            t.seen_tasks[i] = k.tasks[i]  # the same task names every run: no layout again
    compat.collect()
    c0 = cpu_ms()
    t0 = us()
    k.run()
    dt = diff(us(), t0)
    c1 = cpu_ms()
    if with_tm:  # the kernel's own accounting of this run: the telemetry task's and the decode's run time
        for task in k.tasks:
            if task is not None and task.name in SHARE:
                SHARE[task.name] += task.st[3] * 1000000 + task.st[2]  # S_RUN_S, S_RUN_US
    return dt, (c1 - c0 if c0 is not None else None)


SHARE = {"telemetry": 0, "decode": 0}  # run µs of each task over the runs with telemetry


def tick_cost(s, sink):
    # µs one telemetry tick takes by itself (no decode), over 200 ticks
    from firmware_py.clock import VirtualClock

    clk = VirtualClock()
    k = Kernel(clk, max_tasks=4)
    k.spawn("idle", 1, _idle(k))
    t = tm.Telemetry(sink, kernel=k, pool=s.pool, cache=s.cache)
    t.watch_seq(s.h, s.cap)
    t.tick()
    t0 = us()
    for _ in range(200):
        clk.charge(100000)
        t.tokens += 1
        t.text(b"tok ")
        t.tick()
    return diff(us(), t0) / 200


def token_cost(s, sink):
    # µs the decode side spends per token on telemetry (its text into the ring, the count)
    from firmware_py.clock import VirtualClock

    t = tm.Telemetry(sink, clock=VirtualClock(), text_bytes=1024)
    piece = b"tok "
    t0 = us()
    for _ in range(5000):
        t.text(piece)
        t.tokens += 1
        if t.txt_n > 900:
            t.txt_n = 0  # as if sent
    return diff(us(), t0) / 5000


def _idle(k):
    while True:
        yield k.sleep_us(50000)


def main():
    model, tok, n, reps, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    s = decode.Session(model, tok, kv_dtype="int8")
    ids = s.encode("Once upon a time")
    f = open("/dev/null", "wb")
    sink = tm.stream_writer(f)
    off, on = [], []
    off_cpu, on_cpu = [], []
    t = tm.Telemetry(sink, kernel=Kernel(RealClock(), max_tasks=4), pool=s.pool, cache=s.cache,
                     link_bps=tm.DEFAULT_LINK_BPS, rate_hz=10)
    t.tick()  # the layout frame, once
    p0, b0, s0 = t.periodic_sent, t.periodic_bytes, t.sent_bytes
    on_us = 0
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        for w in order:
            dt, cpu = one(s, ids, n, reps, t, w)
            (on if w else off).append(dt)
            (on_cpu if w else off_cpu).append(cpu)
            if w:
                on_us += dt
    periodic = t.periodic_sent - p0
    frame_mean = t.periodic_bytes - b0
    frame_max = t.periodic_max
    skipped = t.skipped
    sent_bytes = t.sent_bytes - s0
    res = {"interp": sys.implementation.name, "backend": s.model.backend if hasattr(s.model, "backend") else "?",
           "tokens_per_run": n * reps, "off_us": off, "on_us": on, "telemetry_run_us": SHARE["telemetry"], "decode_run_us": SHARE["decode"], "off_cpu_ms": off_cpu, "on_cpu_ms": on_cpu, "periodic_frames": periodic,
           "frame_bytes_mean": frame_mean / periodic if periodic else 0, "frame_bytes_max": frame_max,
           "skipped": skipped, "sent_bytes": sent_bytes, "on_seconds": on_us / 1e6,
           "tick_us": tick_cost(s, sink), "token_us": token_cost(s, sink)}
    print(json.dumps(res))


main()
