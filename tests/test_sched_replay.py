# Determinism beyond one process: the virtual-clock scenario of fw_sched_protect.py gives
# the same switch sequence and stats lines under MicroPython and CPython.
import os

from conftest import FIRMWARE_TESTS, run_firmware


def _replay_lines(interp):
    r = run_firmware(os.path.join(FIRMWARE_TESTS, "fw_sched_protect.py"), interp)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("replay ")]
    assert len(lines) == 2, r.stdout
    return lines


def test_virtual_clock_replay_is_identical_on_both_interpreters():
    mp = _replay_lines("micropython")
    cp = _replay_lines("cpython")
    assert mp[0] == cp[0], "switch sequences differ"
    assert mp[1] == cp[1], "stats lines differ"
    assert mp[0].count("(") > 80, "the scenario made enough switches to be a real check"
