# Board profiles: every profile in boards/ loads, carries a cost block on every tier with
# a source for every figure, marks its estimates; the ESP32-S3 octal profiles hold the
# measured memorycopy figures; a malformed cost field is one line naming the field, in
# the firmware loader and on the command line.
import copy
import glob
import json
import os
import subprocess

import pytest

from conftest import ROOT
from firmware_py import bandwidth as bwm
from firmware_py import board

PROFILES = sorted(glob.glob(os.path.join(ROOT, "boards", "*.json")))
OCTAL = ("esp32s3_n8r8", "esp32s3_n16r8")


@pytest.mark.parametrize("path", PROFILES, ids=[os.path.basename(p)[:-5] for p in PROFILES])
def test_every_profile_loads_with_a_sourced_cost_block_on_every_tier(path):
    b = board.load(path)
    assert b.name == os.path.basename(path)[:-5]
    for t in b.tiers:
        assert t.cost is not None, "%s: tier %s has no cost block" % (b.name, t.name)
        for name, _ in board.COST_FIELDS:
            assert t.cost.source[name].strip(), "%s: %s.%s has no source" % (b.name, t.name, name)
        assert (t.cost.values()["dma_bytes_per_s"] > 0) == t.dma
        assert t.to_dict() == json.load(open(path))["memory"][b.tiers.index(t)]
    bwm.CostModel(b)  # the integer coefficients build for every profile
    # a figure that is not measured on this class of memory says so: only the ESP32-S3's
    # internal SRAM (the same on every S3) and octal PSRAM are measured
    if b.name not in OCTAL:
        for t in b.tiers:
            if b.name.startswith("esp32s3") and t.name == "sram":
                continue
            for name, _ in board.COST_FIELDS:
                src = t.cost.source[name]
                assert src.startswith("estimate") or src.startswith("fit") or src.startswith("the tier has no DMA"), \
                    "%s: %s.%s: %s" % (b.name, t.name, name, src)
        assert any(e.startswith("memory[*].cost") for e in b.estimates)


@pytest.mark.parametrize("name", OCTAL)
def test_the_octal_esp32s3_profiles_hold_the_measured_figures(name):
    b = board.load(os.path.join(ROOT, "boards", name + ".json"))
    sr, ps = b.tier("sram"), b.tier("psram")
    assert sr.bandwidth == 362000000 and ps.bandwidth == 38600000  # the estimates (960 / 80 MB/s) are gone
    v = ps.cost.values()
    assert (v["read_bytes_per_s"], v["write_bytes_per_s"], v["copy_bytes_per_s"], v["dma_bytes_per_s"]) == \
        (38600000, 56700000, 22300000, 51000000)
    assert (v["line_ns"], v["line_stream_bytes_per_s"]) == (330, 147000000)
    for f in ("read_bytes_per_s", "write_bytes_per_s", "copy_bytes_per_s", "dma_bytes_per_s"):
        assert "project-x51/esp32-s3-memorycopy" in ps.cost.source[f]
        assert not ps.cost.estimated(f)
    assert ps.cost.estimated("line_bytes")  # the build's cache line is an assumption
    assert all(b.tier("flash").cost.estimated(f) for f, _ in board.COST_FIELDS if f != "dma_bytes_per_s")


def _good():
    with open(os.path.join(ROOT, "boards", "esp32s3_n8r8.json")) as f:
        return json.load(f)


BAD = [
    (lambda d: d["memory"][1]["cost"].pop("write_bytes_per_s"), "memory[1].cost.write_bytes_per_s: missing"),
    (lambda d: d["memory"][1]["cost"]["read_bytes_per_s"].update(value="fast"),
     "memory[1].cost.read_bytes_per_s.value: expected an integer"),
    (lambda d: d["memory"][1]["cost"]["dma_bytes_per_s"].pop("source"), "memory[1].cost.dma_bytes_per_s.source: missing"),
    (lambda d: d["memory"][0]["cost"]["line_bytes"].update(value=24), "memory[0].cost.line_bytes.value: must be a power of two"),
    (lambda d: d["memory"][2]["cost"]["dma_bytes_per_s"].update(value=5), "memory[2].cost.dma_bytes_per_s.value: tier has dma false"),
    (lambda d: d["memory"][1]["cost"].update(burst={"value": 1, "source": "x"}), "memory[1].cost.burst: unknown cost field"),
    (lambda d: d["memory"][1].update(cost=[]), "memory[1].cost: expected an object"),
    (lambda d: d["memory"][1]["cost"].update(line_ns=330), "memory[1].cost.line_ns: expected an object"),
]


@pytest.mark.parametrize("mutate,says", BAD, ids=[s.split(": ")[0] for _, s in BAD])
def test_a_malformed_cost_field_is_one_line_naming_it(mutate, says):
    d = copy.deepcopy(_good())
    mutate(d)
    with pytest.raises(board.BoardError) as e:
        board.loads(json.dumps(d), "x.json")
    assert str(e.value).startswith("x.json: " + says), str(e.value)
    assert "\n" not in str(e.value)


def test_a_malformed_cost_field_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    d = _good()
    d["memory"][1]["cost"]["copy_bytes_per_s"]["value"] = -3
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    r = subprocess.run([os.path.join(ROOT, "kv"), "budget", "--board", str(p), "--model", "stories260K"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "memory[1].cost.copy_bytes_per_s.value: must be 1..2**50 (1 PiB), got -3" in err[0], r.stderr
    assert "Traceback" not in r.stderr


def test_a_profile_without_cost_blocks_still_loads_and_prices_from_its_bandwidth():
    d = _good()
    for t in d["memory"]:
        del t["cost"]
    b = board.loads(json.dumps(d))
    c = bwm.CostModel(b)
    assert c.cost_us(1, bwm.K_READ, 38600) == 1000 + 0  # 38.6 MB/s headline: 1 ms (+ latency under 1 us)


SIZES = [
    (lambda d: d["memory"][2].update(bytes=10 ** 30), "memory[2].bytes: must be 1..2**50 (1 PiB), got a 31-digit number"),
    (lambda d: d["memory"][0].update(bytes=2 ** 50 + 1), "memory[0].bytes: must be 1..2**50 (1 PiB), got %d" % (2 ** 50 + 1)),
    (lambda d: d["memory"][1].update(bandwidth_bytes_per_s=10 ** 18), "memory[1].bandwidth_bytes_per_s: must be 1..2**50 (1 PiB)"),
    (lambda d: d["memory"][1].update(latency_ns=10 ** 10), "memory[1].latency_ns: must be 0..10**9 (1 s), got 10000000000"),
    (lambda d: d["memory"][1]["cost"]["line_ns"].update(value=10 ** 12), "memory[1].cost.line_ns.value: must be 0..10**9 (1 s)"),
    (lambda d: d["memory"][1]["cost"]["read_bytes_per_s"].update(value=2 ** 60), "memory[1].cost.read_bytes_per_s.value: must be 1..2**50"),
    (lambda d: d.update(micropython_heap_bytes=2 ** 51), "micropython_heap_bytes: must be 1024..2**50 (1 PiB)"),
    (lambda d: d.update(firmware_reserved_bytes=-1), "firmware_reserved_bytes: must be 0..2**50 (1 PiB), got -1"),
    (lambda d: d["cpu"].update(mhz=10 ** 9), "cpu.mhz: must be 1..100000, got 1000000000"),
    (lambda d: d["cpu"].update(cores=5000), "cpu.cores: must be 1..1024, got 5000"),
    (lambda d: d["thermal"].update(throttle_c=10 ** 6), "thermal.throttle_c: must be 1..1000, got 1000000"),
]


@pytest.mark.parametrize("mutate,says", SIZES, ids=[s.split(": ")[0] for _, s in SIZES])
def test_an_impossible_size_is_one_line_naming_the_field(mutate, says):
    # a figure no board has (a 10**30-byte flash tier) is refused where the profile loads,
    # never turned into 40-digit block counts downstream
    d = copy.deepcopy(_good())
    mutate(d)
    with pytest.raises(board.BoardError) as e:
        board.loads(json.dumps(d), "x.json")
    assert str(e.value).startswith("x.json: " + says), str(e.value)
    assert "\n" not in str(e.value)


def test_every_profile_is_inside_the_limits():
    # the limits refuse typos, not boards: every shipped profile's figures are well inside
    for path in PROFILES:
        b = board.load(path)
        assert all(t.bytes <= board.MAX_BYTES // 1024 for t in b.tiers), b.name


def test_an_impossible_tier_size_on_the_command_line_is_exit_2(tmp_path):
    d = _good()
    d["memory"][2]["bytes"] = 10 ** 30
    p = tmp_path / "huge.json"
    p.write_text(json.dumps(d))
    r = subprocess.run([os.path.join(ROOT, "kv"), "budget", "--board", str(p)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "memory[2].bytes: must be 1..2**50 (1 PiB)" in err[0] and "Traceback" not in r.stderr, r.stderr
