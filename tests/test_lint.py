# The whole tree passes ruff (pyflakes, pycodestyle, bugbear) with the project's config.
import subprocess
import sys

from conftest import ROOT


def test_ruff_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
