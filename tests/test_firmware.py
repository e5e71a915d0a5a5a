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
def test_firmware_script(script, interp):
    if interp == "micropython32":
        mp32_or_skip()
    r = run_firmware(script, interp)
    out = r.stdout.strip().splitlines()
    assert r.returncode == 0 and out and out[-1].startswith("PASS"), (
        "%s under %s exited %d\n--- stdout\n%s\n--- stderr\n%s" % (os.path.basename(script), interp, r.returncode, r.stdout, r.stderr)
    )
