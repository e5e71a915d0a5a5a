# `./kv boardtime FILE.py [--call NAME] [--board B] [--freq MHZ] [--emitter E] [--json]`:
# a user's MicroPython function timed on the 32-bit unix port (the board's word size) and
# its time on the board predicted with the factor of the emitter that runs it, fitted to
# published board timings (host/boardspeed.py, docs/calibration.md), with the band:
#     board us = host us x 1000 x factor (board cycles per host ns) / board MHz
# The function is called once to warm up (and timed, to size the runs), then `runs` runs,
# each of as many calls as fill SPAN_US (one for a slow function), less an empty loop's
# time; the median run's time per call is the host time (a call of a few us would be a few
# ticks of the host's us timer on its own).
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile

from firmware_py import appcfg
from host import boards, boardspeed, mp32, options, paths
from host.errors import UserError

RUNS = 7
TIMEOUT_S = 600  # the longest the host run (warm-up and every timed call) may take, by default (--timeout)
RUNS_MAX = 10000  # the driver keeps each run's time in a list on the 32-bit port's heap
STEP_US_MAX = appcfg.PARAMS["module"]["step_us"][2]  # the most a module task's step_us may say
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LINE = re.compile(r"^BOARDTIME (\S+)(?: (.*))?$", re.M)
_DRIVER = """import sys
sys.path.insert(0, %(root)r)  # firmware_py, for a task module that imports it
sys.path.insert(0, %(home)r)  # the file's own folder: its neighbours import
sys.path.insert(0, %(dir)r)
from time import ticks_us, ticks_diff
try:
    import %(mod)s as m
except SyntaxError as e:
    print("BOARDTIME syntax", e)
    raise SystemExit
f = getattr(m, %(call)r, None)
if f is None or not callable(f):
    print("BOARDTIME nofunc")
    raise SystemExit
t0 = ticks_us()
f()
w = ticks_diff(ticks_us(), t0)
reps = %(span)d // w if w > 0 else %(reps)d
reps = 1 if reps < 1 else (%(reps)d if reps > %(reps)d else reps)
t0 = ticks_us()
for _ in range(reps):
    pass
loop = ticks_diff(ticks_us(), t0)
ts = []
for _ in range(%(runs)d):
    t0 = ticks_us()
    for _ in range(reps):
        f()
    ts.append(ticks_diff(ticks_us(), t0) - loop)
print("BOARDTIME ok", reps, " ".join(str(t) for t in ts))
"""
SPAN_US = 20000  # each run times the function as many times as fill this (the host timer ticks in us)
REPS_MAX = 100000


def emitter_of(text, call=None):
    # the emitter function `call` runs under, from the decorators right above its def (the
    # whole file's when call is None or not found): viper, else native, else bytecode
    if call is not None:
        m = re.search(r"((?:^[ \t]*@[^\n]*\n)*)^[ \t]*def[ \t]+%s[ \t]*\(" % re.escape(call), text, re.M)
        if m:
            text = m.group(1)
    if re.search(r"^\s*@micropython\.viper\b", text, re.M):
        return "viper"
    if re.search(r"^\s*@micropython\.native\b", text, re.M):
        return "native"
    return "bytecode"


def predict(path, call="main", board="esp32s3_n8r8", mhz=None, emitter=None, runs=RUNS, timeout=TIMEOUT_S, record=None):
    # {"host_us", "board_us", "band_us", "factor", ...} for one function of a file
    if os.path.exists(path):
        paths.regular_file(path, "source file")  # a folder, a FIFO or /dev/null was "no file"
    if not os.path.isfile(path):
        raise UserError("no file %s" % path, 2)
    if not path.endswith(".py"):
        raise UserError("%s: a MicroPython source file (.py) is expected" % path, 2)
    if not _NAME.match(call or ""):
        raise UserError("--call must be a function name, not %r" % call, 2)
    if emitter is not None and emitter not in boardspeed.EMITTERS:
        raise UserError("--emitter must be one of %s, not %r" % (", ".join(boardspeed.EMITTERS), emitter), 2)
    runs = options.whole(runs, "--runs", 1, RUNS_MAX)
    b = boards.load(board)
    if not any(k in b.cpu_cost for k in ("viper", "bytecode")):
        raise UserError("%s does not run MicroPython in kvrtos's profiles (no viper or bytecode cost figures): pick a "
                        "microcontroller such as esp32s3_n8r8" % board, 2)
    clock = b.cpu_mhz if mhz is None else options.number(mhz, "--freq", 1.0, 10000.0)  # MHz
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError("%s: %s" % (path, e), 2)
    em = emitter or emitter_of(text, call)
    rec = record or boardspeed.factors()
    fx = boardspeed.profile_factors(rec["fit"], b.cpu_arch).get(em)
    if fx is None:
        raise UserError("no %s factor for %s's core (%s)" % (em, board, b.cpu_arch), 1)
    exe = mp32.build()
    with tempfile.TemporaryDirectory(prefix="kvrtos-boardtime-") as tmp:
        mod = "kvrtos_user_code"
        shutil.copyfile(path, os.path.join(tmp, mod + ".py"))
        drv = os.path.join(tmp, "drive.py")
        with open(drv, "w") as f:
            f.write(_DRIVER % {"dir": tmp, "mod": mod, "call": call, "runs": runs, "span": SPAN_US, "reps": REPS_MAX,
                               "home": os.path.dirname(os.path.abspath(path)), "root": paths.ROOT})
        try:
            r = subprocess.run([exe, drv], cwd=tmp, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise UserError("%s:%s() ran past %g s on the host (--timeout): a function that does not return, or give it "
                            "longer" % (path, call, timeout), 1)
    m = _LINE.search(r.stdout)
    if not m or m.group(1) != "ok":
        if m and m.group(1) == "nofunc":
            raise UserError("%s has no function %s(): name the one to time with --call" % (path, call), 2)
        if m and m.group(1) == "syntax":
            raise UserError("%s does not compile under MicroPython: %s" % (path, m.group(2)), 2)
        err = [x for x in (r.stdout + "\n" + r.stderr).strip().splitlines() if x.strip() and not x.startswith("BOARDTIME")]
        raise UserError("%s:%s() failed under the 32-bit MicroPython: %s" % (path, call, err[-1] if err else "exit %d" % r.returncode), 1)
    reps, *tot = [int(x) for x in m.group(2).split()]
    ts = [round(max(0, t) / reps, 3) for t in tot]  # per call (an empty loop's time taken off)
    host = statistics.median(ts)

    def on_board(f):
        return host * 1000.0 * f / clock
    return {"file": path, "call": call, "emitter": em, "emitter_from": "--emitter" if emitter else "the file's decorators",
            "host_us": host, "host_runs_us": ts, "calls_per_run": reps,
            "interpreter": "./kv mp32 (32-bit unix port)", "board": board,
            "mhz": clock, "factor": fx["factor"], "band": fx["band"], "points": fx["points"], "family": fx["family"],
            "assumed": fx["assumed"], "board_us": round(on_board(fx["factor"]), 3),
            "band_us": [round(on_board(fx["band"][0]), 3), round(on_board(fx["band"][1]), 3)],
            # what an application config's module task that runs this once per step carries
            # for the emulator to charge (appcfg "step_us"): the prediction, whole µs, at least 1
            "step_us": max(1, round(on_board(fx["factor"]))), "step_emitter": em}


def _us(v):
    return "{:,}".format(round(v)) if v >= 100 else "%.3g" % v


def main(path, call="main", board="esp32s3_n8r8", mhz=None, emitter=None, runs=RUNS, as_json=False, timeout=None):
    r = predict(path, call, board, mhz, emitter, runs, timeout=TIMEOUT_S if timeout is None else timeout)
    if as_json:
        print(json.dumps(r, sort_keys=True))
        return r
    n = len(r["host_runs_us"])
    print("%s:%s()  %s, host %s us (%s%s on the 32-bit unix port)" % (
        os.path.basename(path), call, r["emitter"], _us(r["host_us"]), "one run" if n == 1 else "median of %d runs" % n,
        "" if r["calls_per_run"] == 1 else " of %s calls each" % "{:,}".format(r["calls_per_run"])))
    print("on %s at %g MHz: %s us predicted, band %s-%s us (the %s factor %.1f board cycles per host ns, band "
          "%.1f-%.1f, %d published points on %s%s; docs/calibration.md)" % (
              r["board"], r["mhz"], _us(r["board_us"]), _us(r["band_us"][0]), _us(r["band_us"][1]), r["emitter"], r["factor"], r["band"][0], r["band"][1], r["points"],
              r["family"], ", assumed for this core" if r["assumed"] else ""))
    if r["step_us"] > STEP_US_MAX:
        print("for the emulator: %s us is more than a module task's step_us may say (%s): a step that long holds the "
              "CPU from every other task; split it over several yields" % ("{:,}".format(r["step_us"]),
                                                                          "{:,}".format(STEP_US_MAX)))
    else:
        print("for the emulator: \"step_us\": %d%s in an application config's module task whose step runs it once "
              "(the band's slow end: %d; the emulator's runs at the band's ends scale it)" % (
                  r["step_us"], "" if r["emitter"] == "bytecode" else ", \"step_emitter\": \"%s\"" % r["emitter"],
                  max(1, round(r["band_us"][1]))))
    return r
