import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from host import boards, paths  # noqa: E402
from host import interp as interp_mod  # noqa: E402

FIRMWARE_TESTS = os.path.join(ROOT, "tests", "firmware")
DEFAULT_HEAP = boards.load(paths.DEFAULT_BOARD).mpy_heap


def run_firmware(script, interp, heap=DEFAULT_HEAP, timeout=240, args=(), heapsize=None):
    # run a firmware script under "micropython" (usable heap `heap`, or exactly
    # -X heapsize=heapsize) or "cpython"; CompletedProcess
    return interp_mod.run(script, interp, usable_heap=heap, heapsize=heapsize, args=args, timeout=timeout)


_ran = {"micropython": [0, 0], "cpython": [0, 0]}  # interp -> [passed, failed]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    interp = getattr(item, "callspec", None) and item.callspec.params.get("interp")
    if rep.when == "call" and interp in _ran:
        _ran[interp][0 if rep.passed else 1] += 1


def pytest_terminal_summary(terminalreporter):
    mp, cp = _ran["micropython"], _ran["cpython"]
    if mp[0] + mp[1] + cp[0] + cp[1]:
        terminalreporter.write_line(
            "firmware tests: micropython (usable heap %d B as board %s): %d passed, %d failed; "
            "cpython: %d passed, %d failed" % (DEFAULT_HEAP, paths.DEFAULT_BOARD, mp[0], mp[1], cp[0], cp[1])
        )
