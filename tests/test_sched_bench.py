# `./kv bench sched --json` prints one JSON object with the figures the issue asks for,
# measured on both interpreters in one run (small counts here to stay fast).
import json
import os
import subprocess
import sys

from conftest import ROOT
from host.bench import sched as bench

REQUIRED = [
    "switch_ns_micropython",
    "switch_ns_asyncio_micropython",
    "switch_ratio_vs_asyncio_micropython",
    "alloc_bytes_per_switch_micropython",
    "switch_ns_cpython",
    "switch_ns_asyncio_cpython",
    "switch_ratio_vs_asyncio_cpython",
    "switch_ns_floor_micropython",
    "switch_ns_floor_cpython",
    "switch_ratio_vs_floor_micropython",
    "switch_ratio_vs_floor_cpython",
    "latency_worst_us_micropython",
    "latency_deadline_misses_micropython",
    "latency_worst_us_cpython",
    "latency_deadline_misses_cpython",
]


def test_bench_sched_measures_both_interpreters(capsys):
    r = bench.run(as_json=True, switches=2000, reps=3, latency_ms=30)  # medians of 3: one hiccup on a busy host is not a figure
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == r
    for key in REQUIRED:
        assert isinstance(r[key], (int, float)), key
    for interp in ("micropython", "cpython"):
        assert r["switch_ns_%s" % interp] > 0 and r["switch_ns_asyncio_%s" % interp] > 0
        assert r["latency_periods_%s" % interp] == 30, "every period of the 1 ms task ran"
        assert r["switch_ns_floor_%s" % interp] > 0, "the floor was measured"
        assert r["switch_ns_floor_%s" % interp] < r["switch_ns_%s" % interp], "a bare round-robin is cheaper than the kernel"
        assert r["interpreter_%s" % interp].startswith(interp)
    # the switches allocate 0 B: the same kernel run completes with the heap locked (any
    # allocation there is a MemoryError, so this pins zero, not a small number)
    assert r["heap_locked_switches_ok_micropython"] is True
    assert "poll()" in r["asyncio_poll_note"]


def test_kv_bench_knows_sched():
    # the ./kv bench front door finds this benchmark by module name
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    r = subprocess.run([os.path.join(ROOT, "kv"), "bench", "nosuchbench"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "sched" in r.stderr, r.stderr
