# .ci/run sets KVRTOS_REQUIRE_MP32: then a 32-bit MicroPython build that cannot be made
# fails the firmware tests instead of skipping them (issue 17), so CI cannot pass without
# having run every firmware test on the ESP32-S3's word size.
import os
import subprocess

import pytest

import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _with_missing_build(monkeypatch, value):
    monkeypatch.setattr(conftest, "_mp32", [(None, "no 32-bit gcc (a test's stand-in)")])
    if value is None:
        monkeypatch.delenv(conftest.REQUIRE_MP32, raising=False)
    else:
        monkeypatch.setenv(conftest.REQUIRE_MP32, value)


def test_a_missing_32_bit_build_skips_by_default(monkeypatch):
    _with_missing_build(monkeypatch, None)
    with pytest.raises(pytest.skip.Exception):
        conftest.mp32_or_skip()


def test_a_missing_32_bit_build_fails_when_required(monkeypatch):
    _with_missing_build(monkeypatch, "1")
    with pytest.raises(pytest.fail.Exception, match="KVRTOS_REQUIRE_MP32"):
        conftest.mp32_or_skip()


def test_ci_requires_the_32_bit_build():
    text = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "export KVRTOS_REQUIRE_MP32=1" in text
    assert "|| echo" not in text  # a failed gcc-multilib install is no longer tolerated
    r = subprocess.run(["bash", "-n", os.path.join(ROOT, ".ci", "run")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
