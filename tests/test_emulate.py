# ./kv emulate (host/emulate.py): the same spec gives the same report and the same bytes
# in its output folder; every scenario runs at a small size and its report satisfies the
# invariants (bytes moved == bytes charged, tokens emitted == asked or a reported stop,
# no task above 100 % CPU); the long generation under each policy; bad input is one line
# and a non-zero exit through ./kv.
import json
import os
import subprocess
import sys

import pytest

from host import emulate
from host.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED = ("tokens", "tok_s", "ms_per_token", "ttft_ms", "kv_bytes", "pool_high_water", "deadline_misses",
            "deadline_misses_by_task", "bandwidth", "tasks", "events", "cost", "spec", "invariants", "workloads")


def _check(rep):
    for key in REQUIRED:
        assert key in rep, key
    inv = rep["invariants"]
    assert inv["ok"], inv
    assert inv["decode_bytes_charged"]["weights_moved"] > 0
    for d in rep["tasks"].values():
        assert 0.0 <= d["cpu_share"] <= 1.0
    assert rep["tokens"] == rep["tokens_requested"] or rep["stop"]
    json.dumps(rep)  # serializable


def test_same_spec_same_bytes(tmp_path):
    spec = {"scenario": "voice-assistant", "tokens": 6, "cost": "c"}
    a, b = tmp_path / "a", tmp_path / "b"
    ra = emulate.run(spec, out_dir=str(a))
    rb = emulate.run(dict(spec), out_dir=str(b))
    assert ra == rb
    for name in ["report.json", "telemetry.jsonl", "trace.json"] + ra["files"]["plots"]:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    text = (a / "report.json").read_text() + (a / "trace.json").read_text() + (a / "telemetry.jsonl").read_text()
    assert ROOT not in text and str(tmp_path) not in text  # no machine folders inside
    _check(ra)
    assert ra["telemetry"]["frames"] > 0 and ra["telemetry"]["corrupt"] == 0
    assert ra["workloads"]["mic"]["released"] > 0


@pytest.mark.parametrize("name", ["voice-assistant", "sensor-gateway", "two-chats"])
def test_scenario_small(name):
    rep = emulate.run({"scenario": name, "tokens": 6, "cost": "c"})
    _check(rep)
    assert rep["workloads"], "the scenario's tasks ran"
    for st in rep["workloads"].values():
        assert st["released"] > 0
    if name == "two-chats":
        assert set(rep["chats"]) == {"chat_a", "chat_b"}
        assert rep["sharing"]["shared_tokens"] > 0
        one = emulate.run({"tokens": 6, "cost": "c", "prompt": ""})
        assert rep["pool_high_water"] < 2 * max(one["pool_high_water"], rep["sharing"]["shared_blocks"] + 1)


@pytest.mark.parametrize("policy", ["full", "window", "sinks", "h2o"])
def test_long_generation_each_policy(policy):
    rep = emulate.run({"scenario": "long-generation", "policy": policy, "tokens": 72, "cost": "none"})
    _check(rep)
    assert rep["kv_cap_tokens"] == 64
    if policy == "full":
        assert rep["stop_reason"] == "full" and rep["tokens"] < 72 and rep["stop"]
        assert rep["events"]["counts"].get("refused", 0) == 1 and rep["events"]["refusals"] >= 1
    else:
        assert rep["tokens"] == 72 and rep["stop"] == ""
        assert rep["events"]["evictions"] > 0 and rep["events"]["counts"].get("evict", 0) > 0
    assert rep["cost"]["cpu"]["kind"] == "none" and "memory time only" in rep["cost"]["cpu"]["note"]


def test_normalize_and_progress():
    n = emulate.normalize({"tokens": 3})
    assert set(n) == set(emulate.DEFAULTS)
    assert os.path.isabs(n["model"]) and os.path.isabs(n["tokenizer"])
    assert emulate.normalize({"tokens": 3}) == n
    seen = []
    emulate.run({"tokens": 3, "cost": "c"}, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (3, 3) and len(seen) == 3
    for bad, word in (({"bogus": 1}, "bogus"), ({"tokens": 0}, "tokens"), ({"policy": "lru"}, "policy"),
                      ({"board": "nope"}, "nope"), ({"cost": "fpga"}, "cost"), ({"window": 8}, "window")):
        with pytest.raises(UserError) as e:
            emulate.normalize(bad)
        assert word in str(e.value) and "\n" not in str(e.value) and e.value.code == 2


def _kv(*args, cwd=ROOT):
    return subprocess.run([os.path.join(ROOT, "kv"), "emulate"] + list(args), capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_cli_json_and_bad_input(tmp_path):
    r = _kv("--tokens", "3", "--cost", "c", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    for key in REQUIRED:
        assert key in rep
    bad = tmp_path / "bad.json"
    bad.write_text('{"tasks": [{"kind": "audio", "name": "mic", "period_us": 15500}]}')
    broken = tmp_path / "broken.json"
    broken.write_text('{"tasks": [')
    for args, word in ((["--board", "nope"], "unknown board"),
                       (["--model", str(tmp_path / "missing.bin")], "no model file"),
                       (["--scenario", str(broken)], "not valid JSON"),
                       (["--scenario", str(bad), "--tokens", "2"], "multiple of 32"),
                       (["--policy", "sinks", "--window", "3"], "window of at least"),
                       (["--tokens", "x"], "--tokens")):
        r = _kv(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and word in lines[0] and "Traceback" not in r.stderr, (args, r.stderr)
        assert lines[0].startswith("kv emulate: ")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_every_kind_of_task_keeps_the_byte_invariants(tmp_path):
    # a wake word reading the audio's frames, a sensor read by the CPU and one by DMA: each
    # mover's bytes equal the tracker's, and a tampered report would not pass
    cfg = tmp_path / "mix.json"
    cfg.write_text(json.dumps({"decode": {"tokens": 4, "piece_bytes": 32768}, "tasks": [
        {"kind": "audio", "name": "mic"}, {"kind": "wakeword", "name": "kws", "audio": "mic"},
        {"kind": "sensor", "name": "imu"}, {"kind": "sensor", "name": "adc", "dma": True, "read_bytes": 128}]}))
    rep = emulate.run({"scenario": str(cfg), "cost": "c"})
    _check(rep)
    inv = rep["invariants"]
    assert inv["dma_bytes_charged"]["wakeword_reads"] > 0 and inv["cpu_reads_charged"]["moved"] > 0
    assert inv["dma_bytes_charged"]["moved_x2"] > 0


def test_board_time_limit_and_long_runs():
    # a run cut by max_ms says so, its figures cover what was made (nothing negative); a
    # run longer than half the 2**30 us tick circle (and than a whole one) is timed exactly
    cut = emulate.run({"board": "rp2350_pico_plus2", "cost": "viper", "tokens": 96, "max_ms": 500000})
    assert 0 < cut["tokens"] < 96 and cut["stop_reason"] == "time_limit"
    assert "board-time limit of 500 s" in cut["stop"] and "--max-ms" in cut["stop"] and "\n" not in cut["stop"]
    assert cut["invariants"]["ok"], cut["invariants"]
    for rep in (cut, emulate.run({"board": "rp2350_pico_plus2", "cost": "bytecode", "tokens": 150})):
        assert rep["tok_s"] > 0 and rep["ms_per_token"] > 0 and rep["decode_ms"] > 0 and rep["ttft_ms"] > 0
        assert abs(rep["tok_s"] * rep["ms_per_token"] / 1000 - 1) < 0.01
        assert rep["decode_ms"] <= rep["elapsed_ms"] <= rep["spec"]["max_ms"] + 60000
    long = rep
    assert long["tokens"] == 150 and long["stop"] == "" and long["elapsed_ms"] > (1 << 30) / 1000  # past a wrap
    assert long["decode_ms"] >= 149 * long["ms_per_token"] and long["invariants"]["ok"]
    with pytest.raises(UserError):
        emulate.normalize({"max_ms": emulate.MAX_MS + 1})


def test_kv_fp16():
    # fp16 KV on the numpy kernel (the emulator's) and the plain one: the text of fp32 KV
    tiny = os.path.join(ROOT, "models", "kvrtos-tiny", "model.bin")
    a = emulate.run({"model": tiny, "kv_dtype": "fp16", "tokens": 6, "cost": "c"})
    b = emulate.run({"model": tiny, "kv_dtype": "fp32", "tokens": 6, "cost": "c"})
    _check(a)
    assert a["tokens"] == 6 and a["text"] == b["text"] and a["kv_bytes_per_token"] * 2 == b["kv_bytes_per_token"]
    r = subprocess.run([os.path.join(ROOT, "kv"), "generate", "--model", tiny, "--kv-dtype", "fp16", "--tokens", "6",
                        "--backend", "plain"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "fp16" in r.stdout, r.stderr
    assert r.stdout.startswith(b["text"].strip()[:20])


def _user_scenario(tmp_path, body):
    (tmp_path / "usermod_f1.py").write_text(body)
    cfg = tmp_path / "kvrtos.json"
    cfg.write_text(json.dumps({"decode": {"tokens": 3}, "tasks": [
        {"kind": "module", "name": "mine", "module": "usermod_f1", "factory": "make", "args": {}}]}))
    return str(cfg)


def test_module_task_from_the_scenario_folder(tmp_path):
    path = list(sys.path)
    rep = emulate.run({"scenario": os.path.join(ROOT, "examples", "user-task", "kvrtos.json"), "tokens": 4, "cost": "c"})
    _check(rep)
    assert rep["workloads"]["meter"]["released"] > 0 and "meter" not in sys.modules and sys.path == path
    r = _kv("--scenario", "examples/user-task/kvrtos.json", "--tokens", "3", "--cost", "c")
    assert r.returncode == 0 and "meter" in r.stdout, r.stderr
    ok_task = "class M:\n    def __init__(s, k):\n        s.k = k\n    def stats(s):\n        return {}\n"
    for body, word in (("import nonexistent_f1_mod\n", "nonexistent_f1_mod"),
                       ("def make(k, env):\n    raise RuntimeError('boom in factory')\n", "boom in factory"),
                       ("def make(k, env:\n", "SyntaxError"),
                       (ok_task + "    def task(s):\n        yield s.k.sleep_us(10)\n        raise ZeroDivisionError('boom in task')\n"
                        "def make(k, env):\n    return M(k)\n", "boom in task")):
        d = tmp_path / ("s%d" % len(word))
        d.mkdir()
        r = _kv("--scenario", _user_scenario(d, body), "--cost", "c")
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and word in lines[0] and "Traceback" not in r.stderr, (body, r.stderr)
        assert "usermod_f1" not in sys.modules and sys.path == path
