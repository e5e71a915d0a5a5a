# ./kv bench model --c-ref PATH: a C decoder of the user's (llama2.c's run.c built with
# -O3) timed side by side with the MicroPython decode; bad input is one line before any
# benchmark runs; without one the figures say the share of C was not measured.
import os
import stat

import pytest

from host.bench import model as bm
from host.errors import UserError
from vboard_util import kv, one_line_error


@pytest.mark.parametrize("make, says", [
    (lambda p: None, "no file"),
    (lambda p: os.mkdir(p), "folder"),
    (lambda p: open(p, "w").write("#!/bin/sh\n"), "not executable"),
])
def test_a_bad_c_ref_is_one_line_before_anything_runs(tmp_path, make, says):
    p = str(tmp_path / "run")
    make(p)
    with pytest.raises(UserError, match=says):
        bm.c_ref_path(p)
    r = kv("bench", "model", "--c-ref", p)
    assert one_line_error(r) and r.returncode == 2 and says in r.stderr, r.stderr


def test_c_ref_options_are_checked():
    r = kv("bench", "kv", "--c-ref", "/bin/true")
    assert one_line_error(r) and r.returncode == 2 and "--c-ref belongs to bench model" in r.stderr, r.stderr
    with pytest.raises(UserError, match="needs a value"):
        bm.c_ref_path("")


def test_a_program_that_is_not_a_decoder_is_refused_in_one_line(tmp_path):
    # /bin/true runs and says nothing: no "achieved tok/s" line
    with pytest.raises(UserError, match="printed no 'achieved tok/s: N' figure") as e:
        bm.c_ref_figures("/bin/true", "m.bin", "t.bin")
    assert "\n" not in str(e.value)
    crash = tmp_path / "crash"
    crash.write_text("#!/bin/sh\necho 'Error: cannot open checkpoint' >&2\nexit 1\n")
    crash.chmod(crash.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(UserError, match="exited 1: Error: cannot open checkpoint"):
        bm.c_ref_figures(str(crash), "m.bin", "t.bin")


def test_a_decoder_that_never_ends_is_stopped_with_its_children(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(bm, "C_REF_S", 1)
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 300 &\necho $! > %s\nwait\n" % (tmp_path / "child"))
    hang.chmod(hang.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(UserError, match="ran past 1 s"):
        bm.c_ref_figures(str(hang), "m.bin", "t.bin")
    child = (tmp_path / "child").read_text().strip()

    def alive():  # running (a zombie waiting for its reaper is dead)
        try:
            with open("/proc/%s/stat" % child) as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    for _ in range(20):
        if not alive():
            break
        time.sleep(0.1)
    assert not alive(), "the decoder's child sleep %s outlived the timeout" % child


def test_the_environment_variable_is_named_when_it_is_the_source(tmp_path, monkeypatch):
    monkeypatch.setenv(bm.C_REF_ENV, str(tmp_path / "missing"))
    with pytest.raises(UserError, match=r"^\$KVRTOS_C_REF: no file"):
        bm.c_ref_path()
    monkeypatch.setenv(bm.C_REF_ENV, "")
    assert bm.c_ref_path() is None  # set but empty: not set


def test_without_a_c_ref_the_share_of_c_is_said_unmeasured(monkeypatch, capsys):
    monkeypatch.delenv(bm.C_REF_ENV, raising=False)
    assert bm.c_ref_path() is None
    try:
        r = bm.run(as_json=True)
    except UserError as e:
        pytest.skip(str(e))  # no stories260K in ../shared/models
    assert "decode_tok_s_c_ref" not in r and "not measured" in r["c_ref_note"]
    assert not any("runc" in k for k in r)  # no quoted range stands in for a measurement


@pytest.mark.skipif(not os.environ.get(bm.C_REF_ENV), reason="no C decoder: set KVRTOS_C_REF to llama2.c's run.c built with -O3")
def test_run_c_is_timed_side_by_side():
    try:
        r = bm.run(as_json=True)
    except UserError as e:
        pytest.skip(str(e))
    assert r["decode_tok_s_c_ref"] > 0 and len(r["c_ref_runs_tok_s"]) == bm.C_REF_RUNS
    assert r["decode_micropython_over_c_ref"] == round(r["decode_tok_s_micropython"] / r["decode_tok_s_c_ref"], 3)
