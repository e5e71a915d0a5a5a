import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from host import boards, paths  # noqa: E402
from host import interp as interp_mod  # noqa: E402

# the virtual boards the tests start run the 64-bit PyPI port (their figures are asked for
# word 8); tests/test_serve_budget.py sets the 32-bit one for itself
os.environ.pop("KVRTOS_VBOARD_MICROPYTHON", None)

# no test reads the terminal: with ./kv test typed at one, the commands the tests run (./kv
# monitor, which takes keys from a terminal) would see it on their stdin. /dev/null instead,
# for this process and every one it starts (the pty tests give their own)
if os.isatty(0):
    _null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(_null, 0)
    os.close(_null)

FIRMWARE_TESTS = os.path.join(ROOT, "tests", "firmware")
DEFAULT_HEAP = boards.load(paths.DEFAULT_BOARD).mpy_heap


def run_firmware(script, interp, heap=DEFAULT_HEAP, timeout=240, args=(), heapsize=None):
    # run a firmware script under "micropython" (usable heap `heap`, or exactly
    # -X heapsize=heapsize) or "cpython"; CompletedProcess
    return interp_mod.run(script, interp, usable_heap=heap, heapsize=heapsize, args=args, timeout=timeout)


_ran = {"micropython": [0, 0], "micropython32": [0, 0], "cpython": [0, 0]}  # interp -> [passed, failed]
_mp32 = []  # [(binary or None, why)] once host/mp32.py has been asked


REQUIRE_MP32 = "KVRTOS_REQUIRE_MP32"  # set (to 1) by .ci/run: a missing 32-bit build fails, never skips


def mp32_or_skip():
    # the 32-bit MicroPython unix port (built once, cached), or skip saying why it is absent
    # (fail instead when $KVRTOS_REQUIRE_MP32 is set: CI must run every firmware test on it)
    from host import mp32

    if not _mp32:
        _mp32.append(mp32.available())
    binary, why = _mp32[0]
    if binary is None:
        if os.environ.get(REQUIRE_MP32, "") not in ("", "0"):
            pytest.fail("32-bit MicroPython unavailable and %s is set: %s" % (REQUIRE_MP32, why), pytrace=False)
        pytest.skip("32-bit MicroPython unavailable: %s" % why)
    return binary


_INTERP_ID = re.compile(r"[\[-](micropython32|micropython|cpython)\]$")  # a test id's interp parameter


def pytest_runtest_logreport(report):
    # the tests run under each interpreter, counted from their reports (a script's own, not
    # its subtests': tests/test_firmware.py reports each failed or skipped check as one)
    m = _INTERP_ID.search(report.nodeid)
    if report.when == "call" and m and type(report).__name__ != "SubtestReport" and not report.skipped:
        _ran[m.group(1)][0 if report.passed else 1] += 1  # a skip is neither


def pytest_terminal_summary(terminalreporter):
    mp, m32, cp = _ran["micropython"], _ran["micropython32"], _ran["cpython"]
    if sum(mp + m32 + cp):
        if _mp32 and _mp32[0][0] is None:
            m32_text = "SKIPPED (%s)" % _mp32[0][1]
        else:
            m32_text = "%d passed, %d failed" % (m32[0], m32[1])
        terminalreporter.write_line(
            "firmware tests: micropython 64-bit (usable heap %d B as board %s): %d passed, %d failed; "
            "micropython 32-bit: %s; cpython: %d passed, %d failed"
            % (DEFAULT_HEAP, paths.DEFAULT_BOARD, mp[0], mp[1], m32_text, cp[0], cp[1])
        )
