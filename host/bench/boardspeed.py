# `./kv bench boardspeed [--json]`: how much slower a board runs MicroPython than this
# host, per core family and emitter, from published board timings (boards/speed/points.json)
# re-run here on the 32-bit unix port built from each point's own tag (host/boardspeed.py),
# with firmware_py/tools/costprobe.py timed in the same run: the profiles' MicroPython
# figures are those host figures times these factors (`./kv boardspeed --write`). Needs a
# git clone of micropython/micropython ($KVRTOS_MICROPYTHON_REPO; the points' code is its
# tests/perf_bench at each tag), with jonnor/embeddedml and micropython/micropython-lib
# beside it for the script points. Host timings: noisy, recorded as measured.
from host import boardspeed
from host.bench import emit

TITLE = "Board speed per emitter, from published board timings"


def run(as_json=False):
    r = boardspeed.measure(boardspeed.repo(), progress=None if as_json else print)
    return emit(r, as_json, render)


def render(r):
    # the factors (the full point list and the leave-one-out table are on docs/calibration.md)
    n = sum(1 for p in r["points"] if "host_us" in p)
    left = [p for p in r["points"] if "host_us" not in p]
    L = ["Published MicroPython timings on boards (%d timed here, %d listed and left out with the reason), each re-run "
         "on the 32-bit unix port built from the version it was measured with; ratio = board time x board MHz / host "
         "time, in board cycles per host ns; factor = the median over a core family's points for one emitter, band = "
         "the lowest and highest point, leave-one-out = each point's board time predicted from the others' median. "
         "The points, their sources and the leave-one-out table: [docs/calibration.md](calibration.md)." % (n, len(left)), "",
         ]
    L += boardspeed.fit_table(r["fit"], "factor (cycles per host ns)", "n/a (one point)")
    return L
