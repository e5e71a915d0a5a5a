# the board-speed factors (host/boardspeed.py): the committed points and record, the fit
# recomputed from them, the profiles' MicroPython figures tied to the record, and the
# bad-input paths of the points file and of `./kv mp32 --ref`
import copy
import json
import os
import re
import subprocess
import sys

import pytest

from host import boardspeed as bs
from host import boards, mp32
from host.errors import UserError

ROOT = os.path.join(os.path.dirname(__file__), "..")


@pytest.fixture(scope="module")
def rec():
    return bs.committed()


def test_points_load_and_every_used_point_is_sourced():
    pts = bs.load()
    used = [p for p in pts if bs.usable(p)]
    assert len(used) >= 20
    for p in used:
        assert p["url"].startswith("https://") and p["where"] and p["quote"], p["id"]
        assert p["mhz_source"] and p["micropython_version"], p["id"]
    for p in pts:
        if not bs.usable(p):
            assert p.get("excluded") or p.get("note"), p["id"]  # a point left out says why


def test_fit_recomputes_from_the_committed_points(rec):
    # the factors, bands and leave-one-out errors follow from the points' own figures
    assert bs.fit(rec["points"]) == rec["fit"]
    for p in rec["points"]:
        if "host_us" in p:
            assert p["ratio"] == round(p["published_us"] * p["mhz"] / (p["host_us"] * 1000.0), 3)
            assert p["host_us"] == sorted(p["host_runs_us"])[len(p["host_runs_us"]) // 2] or len(p["host_runs_us"]) % 2 == 0
    x = rec["fit"]["xtensa"]
    assert {"bytecode", "viper", "viper-call"} <= set(x)
    # viper_call* time a native loop calling an empty viper function: never a kernel's price
    assert all(bs.workload(p) == "viper-call" for p in rec["points"] if "viper_call" in str((p.get("code") or {}).get("path")))
    assert all(e != "viper-call" for (_, _), (terms, _) in bs.TERMS.items() for _, _, e in terms)
    for f in x.values():
        assert f["band"][0] <= f["factor"] <= f["band"][1]
        assert len(f["loo"]) == (f["points"] if f["points"] > 1 else 0)


def test_leave_one_out_is_the_median_of_the_others():
    rows = [{"id": str(i), "obtainable": True, "chip": "esp32", "emitter": "bytecode", "mhz": 100, "url": u,
             "published_us": 1000.0 * r, "host_us": 100.0} for i, (r, u) in enumerate(((1, "a"), (2, "a"), (4, "b"), (8, "c")))]
    f = bs.fit(rows)["xtensa"]["bytecode"]
    assert f["factor"] == 3.0 and f["band"] == [1.0, 8.0]  # ratios 1, 2, 4, 8
    assert [x["factor_without"] for x in f["loo"]] == [4.0, 4.0, 2.0, 2.0]
    assert f["loo"][0]["error"] == 3.0  # predicted 4,000 us against 1,000
    # leave one source out: source a's two points (1, 2) from b and c's median (6)
    assert f["sources"] == 3 and f["loso"][0] == {"source": "a", "points": 2, "factor_without": 6.0, "median_error": 3.5}


def test_the_run_time_factors_are_the_records():
    # boards/speed/fit.json (installed with the profiles) holds the record's fit and probe
    f, r = bs.factors(), bs.committed()
    assert f["fit"] == r["fit"] and f["probe_runs"] == r["probe_runs"]
    assert f["probe"] == {k: v for k, v in r["probe"].items() if k != "each_run"}


def test_profiles_follow_the_committed_record(rec):
    # every MicroPython figure the record derives is the one in the profile, and no
    # profile or page keeps the old fixed estimate
    n = 0
    for path, d in bs.profiles():
        fx = bs.profile_factors(rec["fit"], d["cpu"]["arch"])
        for (kind, param) in bs.TERMS:
            got = d["cpu"]["cost"].get(kind, {}).get(param)
            if got is None:
                continue
            want = bs.figure(kind, param, rec["probe"], fx, rec["probe_runs"])
            assert got == want, (os.path.basename(path), kind, param)
            assert set(got) == {"value", "source"}  # the firmware keeps the profile it loads: nothing more
            n += 1
        assert boards.load(os.path.basename(path)[:-5]).cpu_cost["viper"]["mac_i8_mcyc"] > 0
    assert n >= 5 * len(bs.TERMS) - 10
    for folder in ("boards", "docs", "host", "firmware_py"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for fn in files:
                if fn.endswith((".json", ".md", ".py")):
                    with open(os.path.join(dirpath, fn), encoding="utf-8") as f:
                        text = f.read()
                    assert "9 board cycles per host ns" not in text and "IPC ratio of 3" not in text, fn


def test_a_profile_without_points_of_its_own_core_says_what_it_assumes(rec):
    fx = bs.profile_factors(rec["fit"], "cortex-m33")
    if "cortex-m33" not in rec["fit"]:
        assert all(f["assumed"] for f in fx.values())
        assert fx["bytecode"]["family"] == "cortex-m4f"  # the nearest core with points
        # the M4F's viper points are all call overhead: the kernels' viper loops take xtensa's loop factor
        assert "viper" not in rec["fit"]["cortex-m4f"] and fx["viper"]["family"] == "xtensa"
        src = boards.load("rp2350_pico2").cpu_cost_source["viper"]["mac_i8_mcyc"]
        assert "assumed for this core" in src


@pytest.mark.parametrize("edit,match", [
    (lambda p: p.pop("url"), "has no 'url'"),
    (lambda p: p.update(emitter="fortran"), "emitter must be one of"),
    (lambda p: p.update(mhz=0), "mhz must be a positive number"),
    (lambda p: p["code"].update(kind="script", output="(", unit="s"), "needs output"),
    (lambda p: p["code"]["params"].update(N="100"), "whole numbers N and M"),
])
def test_a_bad_points_file_is_one_line(tmp_path, edit, match):
    pts = bs.load()
    p = copy.deepcopy([x for x in pts if bs.usable(x) and x["code"]["kind"] == "perf_bench"][0])
    edit(p)
    f = tmp_path / "points.json"
    f.write_text(json.dumps([p]))
    with pytest.raises(UserError, match=match):
        bs.load(str(f))
    f.write_text("[{")
    with pytest.raises(UserError, match="points.json"):
        bs.load(str(f))
    f.write_text(json.dumps([pts[0], pts[0]]))
    with pytest.raises(UserError, match="appears twice"):
        bs.load(str(f))


def test_a_missing_record_or_repository_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="no usable board-speed record"):
        bs.committed(str(tmp_path / "none.json"))
    monkeypatch.delenv(bs.REPO_ENV, raising=False)
    with pytest.raises(UserError, match="KVRTOS_MICROPYTHON_REPO"):
        bs.repo()
    with pytest.raises(UserError, match="no MicroPython git repository"):
        bs.repo(str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="--ref must be a tag"):
        mp32.tree_at(str(tmp_path), "a;b")
    with pytest.raises(UserError, match="no MicroPython git repository"):
        mp32.tree_at(str(tmp_path / "nowhere"), "v1.20.0")


def test_cli_boardspeed_prints_the_factors_and_refuses_bad_flags():
    kv = [sys.executable, "-m", "host.cli"]
    r = subprocess.run(kv + ["boardspeed"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "xtensa" in r.stdout and "bytecode" in r.stdout, r.stderr
    r = subprocess.run(kv + ["mp32", "--ref", "v1.20.0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--ref and --repo go together" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(not os.environ.get(bs.REPO_ENV), reason="no clone of micropython/micropython (set KVRTOS_MICROPYTHON_REPO)")
def test_the_recorded_code_is_the_repositorys(rec):
    # each timed point's program, read again from the repository, is the one that was timed
    rep = bs.repo()
    for p in rec["points"][:40]:
        if "host_us" in p and bs.mirror(rep, p["code"].get("repo")):
            assert bs.script(p, rep)[1] == p["code_sha256"], p["id"]


# --- ./kv boardtime: a user's function timed on the host, predicted on the board ---------
_LOOP = "def main():\n    s = 0\n    for i in range(3000):\n        s += i * i\n    return s\n"


def test_boardtime_predicts_with_the_emitters_factor_and_band(tmp_path, rec):
    from host import boardtime

    mp32.available()[0] or pytest.skip("no 32-bit MicroPython build")
    f = tmp_path / "loop.py"
    f.write_text(_LOOP)
    r = boardtime.predict(str(f), runs=3)
    x = rec["fit"]["xtensa"]["bytecode"]
    assert r["emitter"] == "bytecode" and r["factor"] == x["factor"] and r["band"] == x["band"] and not r["assumed"]
    assert r["host_us"] == sorted(r["host_runs_us"])[1] and r["host_us"] > 0
    assert r["board_us"] == round(r["host_us"] * 1000 * x["factor"] / 240, 3)
    assert r["band_us"][0] <= r["board_us"] <= r["band_us"][1]
    slow = boardtime.predict(str(f), runs=3, mhz=120, record=rec)  # half the clock: twice the time per host us
    assert slow["mhz"] == 120
    assert abs(slow["board_us"] / slow["host_us"] - 2 * r["board_us"] / r["host_us"]) < 0.01 * r["board_us"] / r["host_us"]
    v = tmp_path / "v.py"
    v.write_text("@micropython.viper\ndef main():\n    s: int = 0\n    for i in range(1000):\n        s += i\n")
    assert boardtime.predict(str(v), runs=1)["emitter"] == "viper"


def test_boardtime_takes_the_emitter_of_the_function_called_and_imports_its_neighbours(tmp_path):
    # the decorators right above --call's def name its emitter (a viper function elsewhere in
    # the file does not); the file's folder and firmware_py are importable from it
    from host import boardtime

    text = ("import micropython\nfrom helper import K\nfrom firmware_py import status\n\n@micropython.viper\n"
            "def v() -> int:\n    return 1\n\ndef f():\n    return K + status.OK\n\n@micropython.native\ndef n():\n"
            "    return 3\n")
    assert [boardtime.emitter_of(text, c) for c in ("f", "v", "n", None)] == ["bytecode", "viper", "native", "viper"]
    mp32.available()[0] or pytest.skip("no 32-bit MicroPython build")
    (tmp_path / "helper.py").write_text("K = 2\n")
    (tmp_path / "m.py").write_text(text)
    r = boardtime.predict(str(tmp_path / "m.py"), call="f", runs=1)
    assert r["emitter"] == r["step_emitter"] == "bytecode" and r["host_us"] > 0


def test_boardtime_times_a_short_function_over_many_calls(tmp_path):
    # a function of well under a microsecond on the host was a few ticks of the us timer
    # (0 or 1 us a run): each run now calls it as often as SPAN_US holds, less an empty loop
    from host import boardtime

    mp32.available()[0] or pytest.skip("no 32-bit MicroPython build")
    f = tmp_path / "tiny.py"
    f.write_text("def main():\n    return 1 + 2\n")
    r = boardtime.predict(str(f), runs=3)
    assert r["calls_per_run"] >= 1000, r
    assert 0 < r["host_us"] < 20 and all(t < 20 for t in r["host_runs_us"]), r
    assert r["step_us"] >= 1


@pytest.mark.parametrize("body,args,match", [
    (_LOOP, {"call": "nope"}, "has no function nope"),
    (_LOOP, {"call": "a b"}, "--call must be a function name"),
    ("def main(:\n", {}, "does not compile"),
    ("def main():\n    raise ValueError('boom')\n", {}, "ValueError: boom"),
    (_LOOP, {"board": "apple_m1_8gb"}, "does not run MicroPython"),
    (_LOOP, {"emitter": "fortran"}, "--emitter must be one of"),
    (_LOOP, {"mhz": 0}, "--freq must be"),
    (_LOOP, {"runs": 10 ** 8}, r"--runs must be a whole number in 1\.\.10000"),  # was a MemoryError blamed on main()
])
def test_boardtime_bad_input_is_one_line(tmp_path, body, args, match):
    from host import boardtime

    mp32.available()[0] or pytest.skip("no 32-bit MicroPython build")
    f = tmp_path / "u.py"
    f.write_text(body)
    with pytest.raises(UserError, match=match) as e:
        boardtime.predict(str(f), **dict({"runs": 1}, **args))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="no file"):
        boardtime.predict(str(tmp_path / "none.py"))


def test_write_keeps_figures_measured_on_a_board_and_writes_all_or_nothing(tmp_path, monkeypatch, rec):
    import shutil

    from host import paths

    b = tmp_path / "boards"
    shutil.copytree(os.path.join(ROOT, "boards"), b)
    monkeypatch.setattr(paths, "BOARDS", str(b))
    p = b / "esp32s3_n8r8.json"
    d = json.loads(p.read_text())
    d["cpu"]["cost"]["viper"]["mac_i8_mcyc"] = {"value": 30000, "source": "measured: by ./kv calibrate on /dev/ttyUSB0"}
    d["cpu"]["cost"]["bytecode"]["exp_mcyc"]["value"] += 1
    p.write_text(json.dumps(d, indent=2) + "\n")
    done, kept = bs.write_profiles(rec)
    assert done == [str(p)] and kept == ["esp32s3_n8r8.json viper.mac_i8_mcyc"]
    d = json.loads(p.read_text())
    assert d["cpu"]["cost"]["viper"]["mac_i8_mcyc"]["value"] == 30000
    assert bs.write_profiles(rec) == ([], kept)  # nothing left to write
    before = {f: (b / f).read_text() for f in os.listdir(b) if f.endswith(".json")}
    (b / "qcs6425.json").write_text("{")
    with pytest.raises(UserError, match="bad board profile"):
        bs.write_profiles(rec)
    assert all((b / f).read_text() == t for f, t in before.items() if f != "qcs6425.json")


@pytest.mark.parametrize("edit", [
    lambda r: r["fit"]["xtensa"]["bytecode"].pop("band"),
    lambda r: r["fit"]["xtensa"]["bytecode"].update(factor="12"),
    lambda r: r["probe"].pop("viper_mac_i8_ns"),
    lambda r: r.update(fit={}),
])
def test_a_damaged_record_is_one_line(tmp_path, rec, edit):
    r = copy.deepcopy(rec)
    edit(r)
    f = tmp_path / "bs.json"
    f.write_text(json.dumps({"figures": r}))
    with pytest.raises(UserError, match="no usable board-speed record"):
        bs.committed(str(f))


def test_bench_jobs_must_be_a_whole_number(monkeypatch):
    from host.bench import budget

    for bad in ("abc", "0", "-1", " 2", "\u00b2"):
        monkeypatch.setenv("KVRTOS_BENCH_JOBS", bad)
        with pytest.raises(UserError, match="KVRTOS_BENCH_JOBS"):
            budget.jobs()
    monkeypatch.setenv("KVRTOS_BENCH_JOBS", "3")
    assert budget.jobs() == 3


def test_a_tags_own_definition_is_rewritten_not_duplicated(tmp_path):
    # a -D the port's headers define already goes into the header of the build's copy
    h = tmp_path / "ports" / "unix" / "variants" / "standard"
    h.mkdir(parents=True)
    (h / "mpconfigvariant.h").write_text("#define MICROPY_PY_URANDOM_EXTRA_FUNCS          (0)\n#define OTHER (1)\n")
    left = mp32._undefined(str(tmp_path), mp32.TAG_CFLAGS)
    assert left == "-DMICROPY_PY_RANDOM_EXTRA_FUNCS=1"
    assert "#define MICROPY_PY_URANDOM_EXTRA_FUNCS (1)" in (h / "mpconfigvariant.h").read_text()


def test_a_worktree_or_a_plain_folder(tmp_path):
    # a worktree's .git is a file naming its git directory; a folder that is no repository says so
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".git").write_text("gitdir: ../real/.git/worktrees/wt\n")
    assert mp32.git_dir(str(tmp_path / "wt")) == str(tmp_path / "real" / ".git" / "worktrees" / "wt")
    with pytest.raises(UserError, match="is not a git repository"):
        mp32.tree_at(str(tmp_path), "v1.20.0")


_USER_TASK = '''from array import array

_buf = array("i", range(64))


def work():
    s = 0
    for v in _buf:
        s += (v * 3) >> 1
    return s


class Filter:
    def __init__(self, kernel, env, period_us=20000):
        self.k = kernel
        self.period_us = period_us
        self.n = 0

    def task(self):
        while True:
            work()
            self.n += 1
            yield self.k.sleep_us(self.period_us)

    def stats(self):
        return {"released": self.n}


def make(kernel, env, **args):
    return Filter(kernel, env, **args)
'''


def test_a_config_task_carries_boardtimes_cost_into_the_emulator(tmp_path):
    # ./kv boardtime prices a user's step; the module task that runs it carries "step_us";
    # the emulator charges it per step, so the task's CPU time is steps x step_us
    from host import boardtime
    from host import emulate as emu

    mp32.available()[0] or pytest.skip("no 32-bit MicroPython build")
    (tmp_path / "mytask.py").write_text(_USER_TASK)
    step = boardtime.predict(str(tmp_path / "mytask.py"), call="work", runs=3)["step_us"]
    assert step >= 1
    cfg = {"name": "filt", "title": "a user's filter", "decode": {"tokens": 4},
           "tasks": [{"kind": "module", "name": "filter", "module": "mytask", "factory": "make", "step_us": step}]}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    rep = emu.run({"scenario": str(tmp_path / "cfg.json"), "tokens": 4})
    t = rep["tasks"]["filter"]
    steps = rep["workloads"]["filter"]["released"]
    assert steps >= 2 and t["run_us"] == steps * step and t["max_slice_us"] == step, (t, steps)
    # the runs at the ends of the band scale it by its emitter's band (bytecode unless it says)
    x = bs.profile_factors(bs.factors()["fit"], "xtensa")
    for em in ("bytecode", "viper"):
        cfg["tasks"][0]["step_emitter"] = em
        (tmp_path / "cfg.json").write_text(json.dumps(cfg))
        for end, i in (("slow", 1), ("fast", 0)):
            want = max(1, int(round(step * x[em]["band"][i] / x[em]["factor"])))
            t = emu.run({"scenario": str(tmp_path / "cfg.json"), "tokens": 4, "speed": end})["tasks"]["filter"]
            assert t["max_slice_us"] == want, (em, end, t, want)
    cfg["tasks"][0]["step_emitter"] = "fortran"
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="step_emitter must be one of bytecode, native, viper"):
        emu.run({"scenario": str(tmp_path / "cfg.json"), "tokens": 4})
    cfg["tasks"][0]["step_emitter"] = "viper"
    del cfg["tasks"][0]["step_us"]
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="step_emitter says how step_us scales: give step_us too"):
        emu.run({"scenario": str(tmp_path / "cfg.json"), "tokens": 4})
    cfg["tasks"][0]["step_us"] = step
    del cfg["tasks"][0]["step_emitter"]
    del cfg["tasks"][0]["step_us"]  # without it the host's own run time of the step is not the board's: free
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    assert emu.run({"scenario": str(tmp_path / "cfg.json"), "tokens": 4})["tasks"]["filter"]["run_us"] == 0


def test_the_32_bit_build_says_how_far_it_is(monkeypatch):
    # ./kv mp32 (40 s) printed nothing until its path: make's progress now comes as a line
    # when each part starts, one every PROGRESS_S with the files compiled, and one at its end
    monkeypatch.setattr(mp32, "PROGRESS_S", 0.2)
    said = []
    r = mp32._make(["sh", "-c", "for i in 1 2 3 4; do echo CC f$i.c; sleep 0.15; done; echo LINK x"], "the part",
                   said.append)
    assert r.returncode == 0 and r.stdout.count("CC ") == 4
    assert said[0] == "mp32: building the part ..." and said[-1].startswith("mp32: the part done: 4 files compiled in")
    assert any(re.match(r"mp32: the part: [1-3] files compiled, \d+ s$", s) for s in said[1:-1]), said
    r = mp32._make(["sh", "-c", "echo CC a.c; echo 'a.c:1: error: nope'; exit 2"], "the part", said.append)
    assert r.returncode == 2 and "error: nope" in r.stdout and said[-1].startswith("mp32: the part failed: 1 files")
    # a make that hangs printing nothing is stopped at its limit (the loop read its lines only)
    import time as time_mod

    from host.errors import UserError

    t0 = time_mod.monotonic()
    for say in (said.append, None):
        with pytest.raises(UserError) as e:
            mp32._make(["sh", "-c", "sleep 30"], "the part", say, limit=1)
        assert "the part ran past 1 s and was stopped" in str(e.value) and e.value.code == 1
    assert time_mod.monotonic() - t0 < 15


def test_boardtime_on_a_function_that_never_returns_ends_at_its_timeout(tmp_path):
    # it waited out a fixed 600 s; --timeout bounds it, one line and exit 1
    mp32.available()[0] or pytest.skip("no 32-bit MicroPython build")
    import subprocess
    import sys
    import time

    f = tmp_path / "spin.py"
    f.write_text("def main():\n    while True:\n        pass\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "host.cli", "boardtime", str(f), "--timeout", "3"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and time.monotonic() - t0 < 60, r.stderr
    assert "ran past 3 s on the host (--timeout)" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = subprocess.run([sys.executable, "-m", "host.cli", "boardtime", str(f), "--timeout", "0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--timeout must be a positive number of seconds" in r.stderr, r.stderr
