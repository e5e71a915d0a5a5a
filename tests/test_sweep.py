# `./kv sweep` (host/sweep.py) over the real emulator (host/emulate.py) at a tiny size:
# grid expansion and skipping, the cache (a rerun emulates nothing), resuming after an
# interruption, the process pool and a real local Dask cluster giving the same table,
# the output files, and bad input as one line.
import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from host import sweep, sweepcache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENS = 3
TINY = os.path.join(ROOT, "models", "kvrtos-tiny", "model.bin")  # small and committed: fast points


def grid(**kw):
    base = dict(boards="esp32s3_n8r8", models=TINY, tokens=TOKENS)
    base.update(kw)
    return sweep.merge(**base)


def run_quiet(settings, **kw):
    return sweep.run(settings, progress=False, **kw)


def kv(*args, timeout=120):
    return subprocess.run([os.path.join(ROOT, "kv"), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_expand_product_and_skips():
    pts, skipped = sweep.expand(grid(policies="full,window", windows="16,24", kv_dtypes="fp32,int8"))
    # full runs once per dtype (not once per window), window twice per dtype
    got = sorted((p["axes"]["policy"], p["axes"]["window"], p["axes"]["kv_dtype"]) for p in pts)
    assert got == sorted([("full", None, "fp32"), ("full", None, "int8"), ("window", 16, "fp32"), ("window", 16, "int8"),
                          ("window", 24, "fp32"), ("window", 24, "int8")])
    assert sum(skipped.values()) == 2 and all("policy full" in r for r in skipped)
    # every point's spec normalizes to a different dict, and has its own cache key
    keys = {sweep.point_key(p["norm"]) for p in pts}
    assert len(keys) == len(pts)


def test_expand_counts_refused_combinations():
    # the Pico 2 has no ESP-DSP figures: that combination is skipped with the emulator's reason
    pts, skipped = sweep.expand(grid(boards="esp32s3_n8r8,rp2350_pico2", costs="c,dsp"))
    assert sorted((p["axes"]["board"], p["axes"]["cost"]) for p in pts) == [
        ("esp32s3_n8r8", "c"), ("esp32s3_n8r8", "dsp"), ("rp2350_pico2", "c")]
    assert list(skipped.values()) == [1] and "rp2350_pico2 has no dsp" in list(skipped)[0]
    # a value no combination accepts is the user's mistake: one line naming the option
    with pytest.raises(sweep.UserError, match="--costs asm: board rp2350_pico2 has no asm"):
        sweep.expand(grid(boards="rp2350_pico2", costs="c,asm"))


def test_failed_point_is_recorded_and_cached(tmp_path):
    # kvrtos-tiny leaves no KV block on a plain ESP32 without PSRAM: emulate's one-line
    # refusal is that point's result, cached like a success, and the sweep goes on
    s = grid(boards="esp32s3_n8r8,esp32_wroom32", cache=str(tmp_path / "cache"), workers=2)
    first = run_quiet(s)
    by = {r["board"]: r for r in first["rows"]}
    assert by["esp32s3_n8r8"]["status"] == "ok" and by["esp32s3_n8r8"]["meets_target"]
    bad = by["esp32_wroom32"]
    assert bad["status"] == "failed" and not bad["meets_target"] and "KV budget is too small" in bad["why_not"]
    assert first["summary"]["failed"] == 1 and first["summary"]["errors"] == []
    again = run_quiet(s)
    assert again["summary"]["ran"] == 0 and again["summary"]["cached"] == 2 and again["rows"] == first["rows"]
    md = sweep.markdown(again["rows"], again["summary"])
    assert "KV budget is too small" in md and md.index("esp32s3_n8r8 |") < md.index("esp32_wroom32 | models")


def test_grid_file_and_command_line_over_it(tmp_path):
    g = tmp_path / "grid.json"
    g.write_text(json.dumps({"_": "a comment", "boards": ["esp32s3_n8r8"], "models": TINY, "kv_dtypes": ["fp32", "int8"],
                             "tokens": TOKENS, "target_ms_per_token": 10**6, "cache": "c", "spec": {"prompt": "Once"}}))
    s = sweep.merge(str(g), kv_dtypes="int4")
    assert s["cache"] == str(tmp_path / "c")  # relative to the grid file
    pts, _ = sweep.expand(s)
    assert [(p["norm"]["kv_dtype"], p["norm"]["prompt"]) for p in pts] == [("int4", "Once")]
    r = kv("sweep", "--grid", str(g), "--out", str(tmp_path / "out"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["points"] == 2 and doc["ran"] == 2 and doc["meets_target"] == 2 and doc["out"] == str(tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == ["results.csv", "results.md", "results.png", "summary.json"]


def test_key_follows_inputs(tmp_path):
    pts, _ = sweep.expand(grid())
    k1 = sweep.point_key(pts[0]["norm"])
    assert k1 == sweep.point_key(pts[0]["norm"])
    assert k1 != sweep.point_key(pts[0]["norm"], code="0" * 64)  # another emulator source: another key
    # the same spec with a copy of the model that differs in one byte: another key
    src = open(TINY, "rb").read()
    m = tmp_path / "model.bin"
    m.write_bytes(src)
    tok = os.path.join(os.path.dirname(TINY), "tokenizer.bin")
    (tmp_path / "tokenizer.bin").write_bytes(open(tok, "rb").read())
    a = sweep.point_key(sweep.expand(grid(models=str(m)))[0][0]["norm"])
    m.write_bytes(src[:-1] + bytes([src[-1] ^ 1]))
    b = sweep.point_key(sweep.expand(grid(models=str(m)))[0][0]["norm"])
    assert a != b


def test_cache_hit_and_outputs(tmp_path):
    s = grid(kv_dtypes="fp32,int8", cache=str(tmp_path / "cache"), workers=2, target_ms_per_token=10**6)
    first = run_quiet(s)
    assert first["summary"]["ran"] == 2 and first["summary"]["cached"] == 0
    assert all(r["status"] == "ok" and r["tokens"] == TOKENS for r in first["rows"]), first["rows"]
    files = sorted(str(p) for p in (tmp_path / "cache").rglob("*.json"))
    assert len(files) == 2
    mtimes = [os.stat(f).st_mtime_ns for f in files]
    again = run_quiet(s)
    assert again["summary"]["ran"] == 0 and again["summary"]["cached"] == 2  # nothing emulated
    assert again["rows"] == first["rows"]
    assert [os.stat(f).st_mtime_ns for f in files] == mtimes
    out = sweep.write(again, str(tmp_path / "out"), command="./kv sweep (test)")
    with open(out["results.csv"]) as f:
        rows = list(csv.DictReader(f))
    assert [r["kv_dtype"] for r in rows] == ["fp32", "int8"]
    assert all(r["meets_target"] == "yes" for r in rows)
    md = open(out["results.md"]).read()
    assert "./kv sweep (test)" in md and "esp32s3_n8r8" in md
    assert open(out["results.png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    doc = json.load(open(out["summary.json"]))
    assert doc["points"] == 2 and len(doc["rows"]) == 2
    # the same rows write the same bytes
    out2 = sweep.write(again, str(tmp_path / "out2"), command="./kv sweep (test)")
    for n in out:
        assert open(out[n], "rb").read() == open(out2[n], "rb").read(), n


def test_resume_after_interrupt(tmp_path):
    s = grid(kv_dtypes="fp32,int8,int4", cache=str(tmp_path / "cache"), workers=1)
    seen = []

    def stop(i, row):
        seen.append(i)
        raise KeyboardInterrupt  # as Ctrl-C after the first point

    with pytest.raises(KeyboardInterrupt):
        run_quiet(s, on_result=stop)
    done = len(list((tmp_path / "cache").rglob("*.json")))
    assert done == 1 and len(seen) == 1
    assert not list((tmp_path / "cache").rglob(".tmp-*"))  # no half-written entry left
    rest = run_quiet(s)
    assert rest["summary"]["cached"] == 1 and rest["summary"]["ran"] == 2
    whole = run_quiet(grid(kv_dtypes="fp32,int8,int4", cache=str(tmp_path / "fresh"), workers=1))
    assert rest["rows"] == whole["rows"]


def test_resume_after_kill(tmp_path):
    # a real ./kv sweep killed (SIGKILL) once some points are cached: the rerun runs the rest
    cache = tmp_path / "cache"
    args = ["sweep", "--boards", "esp32s3_n8r8", "--models", TINY, "--tokens", str(TOKENS), "--kv-dtypes",
            "fp32,int8,int4,int4tok", "--workers", "1", "--cache", str(cache), "--out", str(tmp_path / "out"), "--json"]
    p = subprocess.Popen([os.path.join(ROOT, "kv"), *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    while not list(cache.rglob("*.json")) and p.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.02)
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the sweep and its pool's workers, as a lost machine would
    except ProcessLookupError:
        pass
    p.wait(timeout=30)
    done = len(list(cache.rglob("*.json")))
    if p.returncode == 0:
        pytest.skip("the sweep finished before it could be killed")
    assert 1 <= done < 4
    r = kv(*args)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["cached"] == done and s["ran"] == 4 - done and s["points"] == 4


def test_process_pool_equals_dask_local_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    s = dict(kv_dtypes="fp32,int8", costs="c,viper")
    pool = run_quiet(grid(cache=str(tmp_path / "pool"), workers=2, **s))
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster:
        dask = run_quiet(grid(cache=str(tmp_path / "dask"), scheduler=cluster.scheduler_address, **s))
    assert dask["summary"]["ran"] == 4 and dask["summary"]["executor"].startswith("dask ")
    assert dask["rows"] == pool["rows"]
    assert sorted(os.listdir(tmp_path / "pool")) == sorted(os.listdir(tmp_path / "dask"))


MODULE = """
class Busy:
    def __init__(self, kernel, env, period_us=20000, cpu_us=100):
        self.k, self.period_us, self.cpu_us, self.n = kernel, period_us, cpu_us, 0

    def task(self):
        while True:
            yield self.k.sleep_us(self.period_us)
            self.k.charge(self.cpu_us)
            self.n += 1

    def stats(self):
        return {"released": self.n, "deadline_misses": 0}


def make(kernel, env, **args):
    return Busy(kernel, env, **args)
"""


def _module_scenario(folder, cpu_us=100):
    # a scenario of one user module task, its module beside it (as a board's kvrtos.json)
    folder.mkdir(exist_ok=True)
    (folder / "busy.json").write_text(json.dumps({"name": "busy", "tasks": [
        {"kind": "module", "name": "busy", "module": "swf_busy_mod", "factory": "make", "args": {"cpu_us": cpu_us}}]}))
    return str(folder / "busy.json")


def test_key_covers_module_source_and_every_host_module(tmp_path):
    scen = _module_scenario(tmp_path / "scen")
    mod = tmp_path / "scen" / "swf_busy_mod.py"
    s = grid(scenarios=scen, cache=str(tmp_path / "cache"), workers=1)
    # the module is missing: the user's mistake, a failed point, cached under a key that
    # counts the module file as absent
    first = run_quiet(s)
    assert first["rows"][0]["status"] == "failed" and "swf_busy_mod" in first["rows"][0]["why_not"], first["rows"]
    assert run_quiet(s)["summary"]["cached"] == 1
    # the user adds the module: another key, the point runs (not the cached failure)
    mod.write_text(MODULE)
    second = run_quiet(s)
    assert second["summary"]["ran"] == 1 and second["rows"][0]["status"] == "ok", second["rows"]
    assert second["rows"][0]["key"] != first["rows"][0]["key"]
    assert run_quiet(s)["summary"]["cached"] == 1
    # the module's cpu_us changed in its source: another key, run again
    mod.write_text(MODULE.replace("cpu_us=100", "cpu_us=900").replace('"cpu_us": cpu_us', ""))
    third = run_quiet(s)
    assert third["summary"]["ran"] == 1 and third["rows"][0]["key"] != second["rows"][0]["key"]
    # the code hash covers every host module the emulator imports, not only host/emulate.py
    files = {os.path.relpath(f, ROOT) for f in sweep.code_files()}
    for f in ("host/emulate.py", "host/console.py", "host/generate.py", "host/trace.py", "host/boards.py",
              "firmware_py/decode.py", "firmware_py/sched/__init__.py"):
        assert f in files, f
    for sub in ("host", "firmware_py"):
        (tmp_path / "root" / sub).mkdir(parents=True)
        (tmp_path / "root" / sub / "m.py").write_text("x = 1\n")
    a = sweep.code_sha256(str(tmp_path / "root"))
    sweepcache._CODE.clear()
    (tmp_path / "root" / "host" / "m.py").write_text("x = 2\n")
    assert sweep.code_sha256(str(tmp_path / "root")) != a
    sweepcache._CODE.clear()


def test_cache_entry_of_another_shape_is_a_miss(tmp_path):
    s = grid(cache=str(tmp_path / "cache"), workers=1)
    first = run_quiet(s)
    [path] = list((tmp_path / "cache").rglob("*.json"))
    good = json.loads(path.read_text())
    for bad in ({"status": "ok"}, {"status": "ok", "report": {"tokens": "x"}}, {"status": "ok", "report": []},
                {"status": "ok", "report": {"deadline_misses": {"a": "b"}}}, {"status": "failed"},
                {"status": "error", "error": "boom"}, {"status": "ok", "report": {"stop": 3}}):
        path.write_text(json.dumps(dict(bad, key=good["key"])))
        again = run_quiet(s)
        assert again["summary"]["ran"] == 1 and again["rows"] == first["rows"], bad
        assert json.loads(path.read_text()) == good  # rewritten whole


def test_internal_failure_is_an_error_never_cached(tmp_path, monkeypatch, capsys):
    # one of the emulator's own tasks raising (a bug, here a broken traffic counter) is
    # "error": not cached, and ./kv sweep exits 1 after writing what it has
    from firmware_py import bandwidth

    def broken(self, *a):
        raise RuntimeError("broken counter")

    # the counter every traffic path (a layer at once, or in pieces) goes through
    monkeypatch.setattr(bandwidth.DecodeTraffic, "_count", broken)  # the pool's workers are forked: they have it
    s = grid(kv_dtypes="fp32,int8", cache=str(tmp_path / "cache"), workers=1, out=str(tmp_path / "out"))
    with pytest.raises(sweep.UserError) as e:
        sweep.main(s)
    assert e.value.code == 1 and "internal error" in str(e.value) and "broken counter" in str(e.value)
    assert not list((tmp_path / "cache").rglob("*.json"))
    rows = list(csv.DictReader(open(tmp_path / "out" / "results.csv")))
    assert [r["status"] for r in rows] == ["error", "error"] and "decode" in rows[0]["why_not"]
    # a user's mistake stays a cacheable "failed"; an internal one is an "error"
    pt = sweep.expand(grid())[0][0]["norm"]
    assert sweep.emulate_point(dict(pt, kv_dtype="int8"))["status"] == "error"
    monkeypatch.undo()
    assert sweep.emulate_point(dict(pt, board="esp32_wroom32"))["status"] == "failed"


def test_worker_refuses_files_that_differ(tmp_path):
    norm = sweep.expand(grid())[0][0]["norm"]
    hashes = sweep.input_hashes(norm)
    assert norm["model"] in hashes and all(os.path.isabs(f) for f in hashes)
    res = sweep.emulate_point(norm, dict(hashes, **{norm["model"]: "0" * 64}))
    assert res["status"] == "error" and "models/kvrtos-tiny/model.bin" in res["error"] and "000000000000" in res["error"]
    res = sweep.emulate_point(norm, dict(hashes, **{str(tmp_path / "gone.py"): "1" * 64}))
    assert res["status"] == "error" and "is missing" in res["error"]
    assert sweep.emulate_point(norm, hashes)["status"] == "ok"


def _start(args, cwd, env, log):
    return subprocess.Popen([os.path.join(ROOT, ".venv", "bin", "dask"), *args], cwd=cwd, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_dask_worker_in_another_folder(tmp_path, monkeypatch):
    # a real `dask worker` started in another folder (and told the user ran from there):
    # the points it gets carry absolute paths, so a relative --models is the same file, and
    # it gives the process pool's table; a worker whose input file differs from the key's
    # refuses the point, which is not cached
    pytest.importorskip("distributed")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, KVRTOS_CALLER_CWD=str(elsewhere), PYTHONPATH=ROOT)
    sched_file = tmp_path / "scheduler.json"
    log = open(tmp_path / "dask.log", "wb")
    procs = [_start(["scheduler", "--scheduler-file", str(sched_file), "--port", "0", "--no-dashboard"],
                    str(tmp_path), env, log)]
    try:
        t0 = time.monotonic()
        while not sched_file.exists() and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        procs.append(_start(["worker", address, "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
                             "--local-directory", str(elsewhere)], str(elsewhere), env, log))
        from distributed import Client

        with Client(address, timeout="30s") as c:
            c.wait_for_workers(1, timeout=60)
            assert c.run(os.getcwd) and set(c.run(os.getcwd).values()) == {str(elsewhere)}
        monkeypatch.setenv("KVRTOS_CALLER_CWD", ROOT)
        rel = os.path.relpath(TINY, ROOT)  # models/kvrtos-tiny/model.bin: not there in `elsewhere`
        s = dict(models=rel, kv_dtypes="fp32,int8")
        pool = run_quiet(grid(cache=str(tmp_path / "pool"), workers=2, **s))
        dask = run_quiet(grid(cache=str(tmp_path / "dask"), scheduler=address, **s))
        assert dask["summary"]["ran"] == 2 and dask["summary"]["executor"] == "dask " + address
        assert all(r["status"] == "ok" for r in dask["rows"]), dask["rows"]
        assert dask["rows"] == pool["rows"]
        out = sweep.write(dask, str(tmp_path / "out"), command="./kv sweep (test)")
        for n in ("results.md", "results.csv", "summary.json"):
            text = open(out[n]).read()
            assert ROOT not in text and str(tmp_path) not in text, n
        # the client's key made with another model hash than the worker's file: refused, not cached
        real = sweep.input_hashes
        monkeypatch.setattr(sweep, "input_hashes", lambda norm: {f: ("0" * 64 if f.endswith("model.bin") else h)
                                                                 for f, h in real(norm).items()})
        bad = run_quiet(grid(cache=str(tmp_path / "bad"), scheduler=address, **s))
        assert [r["status"] for r in bad["rows"]] == ["error", "error"], bad["rows"]
        assert "model.bin has sha256" in bad["rows"][0]["why_not"] and len(bad["summary"]["errors"]) == 2
        assert not list((tmp_path / "bad").rglob("*.json"))
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        log.close()


@pytest.mark.parametrize("args, code, words", [
    (["--boards", "nosuch_board"], 2, "unknown board"),
    (["--policies", "fifo"], 2, "--policies"),
    (["--windows", "x"], 2, "--windows must be a whole number >= 0, got 'x'"),
    (["--windows", "1.5"], 2, "--windows must be a whole number >= 0, got '1.5'"),
    (["--windows", "-1"], 2, "--windows must be a whole number >= 0, got -1"),  # policy full alone (the default) ignores windows
    (["--policies", "full", "--windows", "0"], 2, "--windows wants windows of 1.."),
    (["--policies", "sinks", "--windows", "3"], 2, "policy sinks needs a window of at least 5 tokens, got 3"),
    (["--policies", "window"], 2, "policy window needs a window of at least 1 token, got 0"),
    (["--grid", "/nonexistent/grid.json"], 2, "no grid file"),
    (["--scheduler", "localhost"], 2, "tcp://"),
    (["--target-ms-per-token", "-1"], 2, "--target-ms-per-token must be a number > 0, got '-1'"),
])
def test_bad_input_one_line(args, code, words):
    r = kv("sweep", "--models", TINY, "--tokens", "2", "--cache", "/tmp/kvrtos-sweep-test-unused", *args)
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kv sweep:") and words in lines[0], r.stderr


def test_bad_grid_file(tmp_path):
    g = tmp_path / "g.json"
    g.write_text('{"boards": ["esp32s3_n8r8"], "colour": 1}')
    r = kv("sweep", "--grid", str(g))
    assert r.returncode == 2 and "unknown key colour" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    g.write_text("{not json")
    r = kv("sweep", "--grid", str(g))
    assert r.returncode == 2 and "not JSON" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_window_below_the_policy_minimum_is_skipped():
    # sinks keeps 4 sinks + 1: window 2 is refused for it (skipped, with the decode's reason), kept for window
    pts, skipped = sweep.expand(grid(policies="window,sinks", windows="2,8"))
    assert sorted((p["axes"]["policy"], p["axes"]["window"]) for p in pts) == [("sinks", 8), ("window", 2), ("window", 8)]
    assert skipped == {"policy sinks needs a window of at least 5 tokens, got 2": 1}


class _Peer:
    # a local TCP server that is not a Dask scheduler: "garbage" answers every connection
    # with an HTTP error reply, "silent" accepts and never says a byte
    def __init__(self, mode):
        import socket
        import threading

        self.mode, self.conns = mode, []
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.address = "tcp://127.0.0.1:%d" % self.srv.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.conns.append(c)
            if self.mode == "garbage":
                try:
                    c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    def close(self):
        self.srv.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("peer", ["closed", "garbage", "silent"])
def test_scheduler_that_is_not_dask_one_line(tmp_path, peer):
    # a closed port, a peer answering HTTP bytes (read as a frame length they asked numpy for
    # exabytes), a peer that accepts and stays silent (it hung): one line, exit 1, bounded
    # by the promised ~10 s (the subprocess timeout catches a hang), nothing written
    server = None if peer == "closed" else _Peer(peer)
    try:
        address = server.address if server else "tcp://127.0.0.1:9"
        r = kv("sweep", "--models", TINY, "--tokens", "2", "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "o"),
               "--scheduler", address, timeout=60)
    finally:
        if server:
            server.close()
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kv sweep: cannot reach the Dask scheduler at " + address), r.stderr
    if peer == "silent":
        assert "no Dask handshake" in lines[0]
    if peer == "garbage":
        assert "MemoryError" in lines[0] and "is it one?" in lines[0]
    assert not os.path.exists(tmp_path / "o") and not list((tmp_path / "c").rglob("*.json"))


def test_sigterm_one_line_then_resume(tmp_path):
    # SIGTERM to a real ./kv sweep once a point is cached: one line, exit 143, a consistent
    # cache (whole entries, no temp file), and the same command runs only the rest
    cache = tmp_path / "cache"
    args = ["sweep", "--boards", "esp32s3_n8r8", "--models", TINY, "--tokens", str(TOKENS), "--kv-dtypes",
            "fp32,int8,int4,int4tok", "--workers", "1", "--cache", str(cache), "--out", str(tmp_path / "out"), "--json"]
    err = tmp_path / "stderr.txt"
    with open(err, "w") as ef:
        p = subprocess.Popen([os.path.join(ROOT, "kv"), *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=ef)
        t0 = time.monotonic()
        while not list(cache.rglob("*.json")) and p.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.02)
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)  # ./kv execs Python: this is the sweep itself
        p.wait(timeout=60)
    text = err.read_text()
    if p.returncode == 0:
        pytest.skip("the sweep finished before it could be terminated")
    assert p.returncode == 143, text
    assert "Traceback" not in text
    assert text.strip().splitlines()[-1] == \
        "kv sweep: terminated; every finished point is cached: rerun the same command to resume", text
    assert not list(cache.rglob(".tmp-*"))
    entries = list(cache.rglob("*.json"))
    for f in entries:
        assert json.loads(f.read_text())["status"] == "ok"
    done = len(entries)
    assert 1 <= done < 4
    r = kv(*args)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["cached"] == done and s["ran"] == 4 - done and s["points"] == 4


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_points_show_both_ends_of_the_board_speed_band(tmp_path):
    # a MicroPython cost's point carries tok/s and deadline misses at the slow and the fast
    # end of the band (emulate.band), in the rows, the CSV and the table; a C cost's none
    s = grid(costs="viper,c", scenarios="voice-assistant", cache=str(tmp_path / "cache"), workers=1)
    res = run_quiet(s)
    rows = {r["cost"]: r for r in res["rows"]}
    v, c = rows["viper"], rows["c"]
    assert v["status"] == "ok" and v["tok_s_slow"] > 0 and v["tok_s_fast"] >= v["tok_s_slow"], v
    assert v["deadline_misses_slow"] == 0 == v["deadline_misses_fast"], v
    assert c["tok_s_slow"] is None and c["deadline_misses_fast"] is None, c
    out = sweep.write(res, str(tmp_path / "out"), command="./kv sweep (test)")
    with open(out["results.csv"]) as f:
        got = {r["cost"]: r for r in csv.DictReader(f)}
    assert float(got["viper"]["tok_s_slow"]) == v["tok_s_slow"] and got["c"]["tok_s_slow"] == ""
    assert "tok s slow" in open(out["results.md"]).read()
    # a point that holds at the fitted speed but misses at the slow end does not meet the target
    rep = dict({m: 1 for m in sweep.METRICS}, deadline_misses=0, band={
        "slow": {"tok_s": 0.5, "deadline_misses": 7}, "fast": {"tok_s": 2.0, "deadline_misses": 0}})
    row = sweep.row_of({"norm": {"board": "esp32s3_n8r8", "policy": "full", "tokens": 1}}, "k" * 64,
                     {"status": "ok", "report": rep}, {})
    assert row["meets_target"] is False and "7 deadline misses at the slow end" in row["why_not"], row
