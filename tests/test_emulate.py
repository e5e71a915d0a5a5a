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
