# Every firmware test script (tests/firmware/fw_*.py) runs under the real MicroPython
# interpreter with the default board's heap (the 64-bit PyPI unix port, and the 32-bit
# unix port built by host/mp32.py: the ESP32-S3's word size), and under CPython.
import glob
import os

import pytest

from conftest import FIRMWARE_TESTS, mp32_or_skip, run_firmware

SCRIPTS = sorted(glob.glob(os.path.join(FIRMWARE_TESTS, "fw_*.py")))


INTERPS = [
    pytest.param("micropython", marks=pytest.mark.micropython),
    pytest.param("micropython32", marks=pytest.mark.micropython),
    pytest.param("cpython", marks=pytest.mark.cpython),
]


@pytest.mark.parametrize("interp", INTERPS)
@pytest.mark.parametrize("script", SCRIPTS, ids=[os.path.basename(s)[:-3] for s in SCRIPTS])
def test_firmware_script(script, interp, subtests):
    # the script's checks (tests/firmware/fwtest.py): each failed one a failed subtest
    # (the script goes on past it), each "SKIP" line a skipped one, so a check that could
    # not run here is counted as skipped, never as passed
    if interp == "micropython32":
        mp32_or_skip()
    r = run_firmware(script, interp)
    out = r.stdout.strip().splitlines()
    report(out, subtests)
    assert r.returncode == 0 and out and out[-1].startswith("PASS"), (
        "%s under %s exited %d\n--- stdout\n%s\n--- stderr\n%s" % (os.path.basename(script), interp, r.returncode, r.stdout, r.stderr)
    )


def report(lines, subtests):
    # a subtest per "FAIL ..." line (failed) and per "SKIP ..." line (skipped)
    for line in lines:
        if line.startswith("FAIL "):
            with subtests.test(msg=line[5:65]):
                pytest.fail(line, pytrace=False)
        elif line.startswith("SKIP "):
            with subtests.test(msg=line[5:65]):
                pytest.skip(line)


def test_a_failed_check_is_reported_and_the_script_goes_on(tmp_path, subtests):
    # a script with two failed checks and a skipped one: both failures are named, the
    # checks after them ran, done() exits 1 with the count
    src = (
        "import sys\nsys.path.insert(0, %r)\nfrom fwtest import check, eq, done\n"
        "check(1 == 2, 'first')\neq(3, 4, 'second')\nprint('SKIP no board here')\ncheck(True, 'third')\ndone()\n"
        % FIRMWARE_TESTS)
    p = tmp_path / "fw_probe.py"
    p.write_text(src)
    r = run_firmware(str(p), "cpython")
    out = r.stdout.strip().splitlines()
    assert r.returncode == 1 and out[-1] == "FAILED 2 of 3 checks", r.stdout + r.stderr
    assert [x for x in out if x.startswith("FAIL ")] == ["FAIL check failed: first", "FAIL check failed: second: got 3, want 4"]
    assert "SKIP no board here" in out
