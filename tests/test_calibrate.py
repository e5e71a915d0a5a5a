# ./kv calibrate: the board-side probe (firmware_py/tools/probe.py) on the interpreters
# and under a small heap, the profile it writes (attribution of copies to tiers by
# address, the CPU figures, validation), against the virtual board end to end, and
# bad input (no port, no firmware, a silent or vanishing board, a garbled answer).
import datetime
import hashlib
import json
import os

import pytest

from conftest import ROOT, mp32_or_skip
from host import boards, calibrate, interp, paths
from host.errors import UserError
from vboard_util import FakeBoard, kv, one_line_error, start

PROBE = os.path.join(ROOT, "firmware_py", "tools", "probe.py")


def _today():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def _line(r):
    return r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""


@pytest.mark.micropython
@pytest.mark.parametrize("mp", ["micropython", "micropython32"])
def test_probe_runs_under_the_smallest_board_heap_and_its_line_parses(mp):
    # the RP2350 Pico 2 profile has the smallest heap of the MicroPython boards; the
    # 32-bit build has the board's word size (31-bit small ints, 16-byte GC blocks)
    if mp == "micropython32":
        mp32_or_skip()
    heap = boards.load("rp2350_pico2").mpy_heap
    r = interp.run(PROBE, mp, usable_heap=heap, args=["quick"], timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert all(ln.startswith("probe: ") for ln in lines[:-1])
    got = calibrate.parse(lines[-1])
    h = got["heap"]
    assert heap <= h["total"] <= heap + 1024 and 0 < h["largest"] <= h["free"] <= h["total"], h
    assert got["switch"]["switches"] > 0 and got["switch"]["us"] > 0
    assert len(got["copy"]) == 7 and all(c["slice_us"] > 0 and c["viper_us"] > 0 for c in got["copy"])
    assert all(m["viper_us"] > 0 and m["bytecode_us"] > 0 for m in got["matvec"])


def test_probe_runs_on_cpython_too():
    r = interp.run(PROBE, "cpython", args=["quick"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = calibrate.parse(r.stdout.strip().splitlines()[-1])
    assert got["machine"] == "cpython" and got["heap"]["total"] == 0


# a probe result as an ESP32-S3 would give it: small buffers in internal SRAM, the large
# one in PSRAM (addresses of the ESP32-S3's data bus and data cache windows)
SRAM_A, SRAM_B, PSRAM = 0x3FC90000, 0x3FC92000, 0x3C100000


def _s3_result(heap=8_100_000):
    def case(name, src, dst, n, us):
        return {"case": name, "src": src, "dst": dst, "bytes": n, "viper_iters": 4, "viper_us": us * 2,
                "slice_iters": 4, "slice_us": us}

    return {
        "probe": 1, "platform": "esp32", "machine": "Generic ESP32S3 module with Octal-SPIRAM with ESP32S3",
        "version": "micropython 1.24.1", "reps": 5,
        "heap": {"total": heap, "free": heap - 20000, "alloc": 20000, "largest": heap - 90000},
        "buffers": {"small_a": SRAM_A, "small_b": SRAM_B, "large": PSRAM, "large_bytes": 131072},
        "copy": [case("small_small", SRAM_A, SRAM_B, 4096, 50), case("small_small", SRAM_A, SRAM_B, 256, 4),
                 case("large_large", PSRAM, PSRAM + 65536, 65536, 12000), case("large_small", PSRAM, SRAM_A, 4096, 400),
                 case("small_large", SRAM_A, PSRAM, 4096, 300)],
        "switch": {"switches": 2001, "us": 40000},
        "matvec": [{"rows": 64, "cols": 64, "group": 64, "viper_iters": 8, "viper_us": 8 * 450, "bytecode_iters": 1, "bytecode_us": 40000},
                   {"rows": 172, "cols": 64, "group": 64, "viper_iters": 8, "viper_us": 8 * 1200, "bytecode_iters": 1, "bytecode_us": 108000},
                   {"rows": 64, "cols": 172, "group": 43, "viper_iters": 8, "viper_us": 8 * 1150, "bytecode_iters": 1, "bytecode_us": 106000}],
    }


def test_an_s3_result_lands_in_its_tiers_and_the_profile_validates(tmp_path):
    prof = json.load(open(boards.path_of("esp32s3_n8r8")))
    p, changed = calibrate.apply(prof, _s3_result(), "/dev/ttyACM0", date="2026-01-02")
    dest = str(tmp_path / "p.json")
    calibrate.write_profile(p, dest)
    b = boards.load(dest)  # validated
    assert b.mpy_heap == 8_100_000 and "micropython_heap_bytes" not in b.estimates
    sram, psram = b.tier("sram").cost, b.tier("psram").cost
    # SRAM to SRAM: the 4096 B case (largest) sets read, write and copy of SRAM
    for f in ("read_bytes_per_s", "write_bytes_per_s", "copy_bytes_per_s"):
        assert sram.value[f] == 4096 * 4 * 1000000 // 50 and sram.source[f].startswith("measured: by ./kv calibrate on /dev/ttyACM0 2026-01-02")
    assert psram.value["copy_bytes_per_s"] == 65536 * 4 * 1000000 // 12000
    assert psram.value["read_bytes_per_s"] == 4096 * 4 * 1000000 // 400
    assert psram.value["write_bytes_per_s"] == 4096 * 4 * 1000000 // 300
    assert "viper ptr32 loop (pool.copy32): %d B/s" % (4096 * 4 * 1000000 // 800) in psram.source["read_bytes_per_s"]
    # what was not measured keeps its figure and source
    assert psram.value["dma_bytes_per_s"] == boards.load("esp32s3_n8r8").tier("psram").cost.value["dma_bytes_per_s"]
    assert p["calibration"]["switch_ns"] == 40000 * 1000 // 2001 and p["calibration"]["date"] == "2026-01-02"
    fields = [c[0] for c in changed]
    if "viper" in b.cpu_cost:  # the profile has the CPU cost block of firmware_py/cpucost.py
        # 64x172 - 64x64: 6912 more MACs for 700 µs more; 172x64 - 64x172: 108 more rows for 50 µs
        # (ns x MHz = millicycles)
        assert b.cpu_cost["viper"]["mac_i8_mcyc"] == round(700_000 / 6912 * 240)
        assert b.cpu_cost["viper"]["row_mcyc"] == round(50_000 / 108 * 240)
        assert b.cpu_cost_source["viper"]["mac_i8_mcyc"].startswith("measured: by ./kv calibrate")
        assert b.cpu_cost["bytecode"]["mac_f32_mcyc"] == round(66_000_000 / 6912 * 240)
        assert "cpu.cost.viper.mac_i8_mcyc" in fields
    assert "memory[0].cost.read_bytes_per_s" in fields and "micropython_heap_bytes" in fields


def test_addresses_outside_every_known_range_are_not_attributed():
    r = _s3_result()
    for c in r["copy"]:
        c["src"] = c["dst"] = 0x50000000  # RTC memory: no tier of the profile
    prof = json.load(open(boards.path_of("esp32s3_n8r8")))
    p, changed = calibrate.apply(prof, r, "P", date="2026-01-02")
    assert not any(f.startswith("memory[") for f, _, _ in changed)
    assert p["memory"] == prof["memory"]


@pytest.mark.parametrize("line, says", [
    ("", "not JSON"),
    ("probe: heap 1 B", "not JSON"),
    ('{"probe": 7}', "not a probe line of version 1"),
    ('[1, 2]', "not a probe line"),
    ('{"probe": 1, "platform": "esp32"}', "a field is missing"),
])
def test_garbled_probe_lines_are_refused_in_one_line(line, says):
    with pytest.raises(UserError) as e:
        calibrate.parse(line)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_negative_figure_is_refused():
    r = _s3_result()
    r["heap"]["total"] = -5
    with pytest.raises(UserError, match="heap.total is not a whole number"):
        calibrate.parse(json.dumps(r))


def test_bad_options_are_one_line_before_any_port_is_opened(tmp_path):
    cases = [
        (["calibrate"], "--port is required"),
        (["calibrate", "--port", "/dev/no-such-port"], "no serial port at /dev/no-such-port"),
        (["calibrate", "--port", "/dev/null", "--board", "nope"], "unknown board 'nope'"),
        (["calibrate", "--port", "/dev/null", "--board", "rk3588_4gb"], "calibrate probes MicroPython boards"),
        (["calibrate", "--port", "/dev/null", "--out", str(tmp_path / "x.json"), "--write"], "--out and --write"),
        (["calibrate", "--port", "/dev/null", "--out", str(tmp_path / "no" / "x.json")], "does not exist"),
        (["calibrate", "--port", "/dev/null", "--timeout", "0"], "--timeout must be a positive number"),
    ]
    for args, says in cases:
        r = kv(*args, timeout=60)
        assert one_line_error(r) and says in _line(r), (args, r.stderr)


def _hashes(cmd):
    # a fake board's answer to the firmware check: every file present
    return (repr(["0" * 64] * len(calibrate.NEEDS)).encode() + b"\r\n", b"")


def test_a_garbled_answer_from_the_board_is_one_line():
    def answer(cmd):
        if b"_kvh" in cmd:
            return _hashes(cmd)
        return (b"probe: start\r\n{not json at all\r\n", b"")

    with FakeBoard("answer", answer) as fb:
        r = kv("calibrate", "--port", fb.port, "--out", os.devnull + ".x", timeout=60)
    assert one_line_error(r) and "the board's probe answer was not understood (not JSON)" in _line(r), r.stderr


def test_an_error_on_the_board_is_one_line_naming_it():
    def answer(cmd):
        if b"_kvh" in cmd:
            return _hashes(cmd)
        return (b"probe: start\r\n", b"Traceback (most recent call last):\r\nMemoryError: memory allocation failed\r\n")

    with FakeBoard("answer", answer) as fb:
        r = kv("calibrate", "--port", fb.port, timeout=60)
    assert one_line_error(r) and "the probe failed on the board on %s: MemoryError" % fb.port in _line(r), r.stderr


def test_a_board_without_the_firmware_is_told_to_flash_it():
    def answer(cmd):
        return (repr([None] * len(calibrate.NEEDS)).encode() + b"\r\n", b"")

    with FakeBoard("answer", answer) as fb:
        r = kv("calibrate", "--port", fb.port, timeout=60)
        assert len(fb.commands) == 1  # the check only: no probe sent
    assert r.returncode == 2 and one_line_error(r) and "run ./kv flash --port %s first" % fb.port in _line(r), r.stderr


def test_a_silent_board_and_a_vanishing_port_stop_in_one_line():
    with FakeBoard("silent") as fb:
        r = kv("calibrate", "--port", fb.port, "--timeout", "1", timeout=60)
    assert one_line_error(r) and "sent nothing for 1 s while probing" in _line(r), r.stderr
    with FakeBoard("close") as fb:
        r = kv("calibrate", "--port", fb.port, "--timeout", "5", timeout=60)
    assert one_line_error(r) and "port %s vanished or stopped answering while probing" % fb.port in _line(r), r.stderr


@pytest.mark.vboard
def test_calibrate_the_virtual_board_end_to_end(tmp_path):
    committed = boards.path_of("esp32s3_n8r8")
    before = hashlib.sha256(open(committed, "rb").read()).hexdigest()
    out = tmp_path / "profile.json"
    with start(tmp_path) as vb:
        r = kv("calibrate", "--port", vb.port, "--board", "esp32s3_n8r8", "--out", str(out), timeout=120)
        assert r.returncode == 2 and "run ./kv flash --port" in _line(r), r.stderr  # a fresh board: no firmware yet
        r = kv("flash", "--port", vb.port, timeout=300)
        assert r.returncode == 0, r.stderr
        r = kv("calibrate", "--port", vb.port, "--board", "esp32s3_n8r8", "--out", str(out), timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "written to %s" % out in r.stdout and "calibrate: probe: heap" in r.stdout
        r2 = kv("calibrate", "--port", vb.port, "--out", str(tmp_path / "again.json"), "--json", timeout=300)
    assert r2.returncode == 0, r2.stderr
    rep = json.loads(r2.stdout)
    assert rep["virtual"] is True and rep["date"] == _today() and rep["figures"]["micropython_heap_bytes"] > 0
    b = boards.load(str(out))  # the written profile loads, validated
    want = boards.load("esp32s3_n8r8").mpy_heap
    # the virtual board's heap is the profile's (its -X heapsize gives that much, at most 1 KiB more)
    assert want <= b.mpy_heap <= want + 1024 and "micropython_heap_bytes" not in b.estimates
    d = json.load(open(out))
    stamp = "measured: by ./kv calibrate on %s %s" % (vb.port, _today())
    assert stamp in d["source"]
    ps = b.tier("psram").cost  # the profile's heap tier: the unix port's heap stands for it
    for f in ("read_bytes_per_s", "write_bytes_per_s", "copy_bytes_per_s"):
        assert ps.value[f] > 0 and ps.source[f].startswith(stamp) and "virtual board" in ps.source[f]
    cal = d["calibration"]
    assert cal["date"] == _today() and cal["virtual"] and cal["switch_ns"] > 0 and cal["probe"]["probe"] == 1
    assert 0 < cal["heap_largest_block_bytes"] <= b.mpy_heap
    for kind, mac in (("viper", "mac_i8_mcyc"), ("bytecode", "mac_f32_mcyc")):
        if kind in b.cpu_cost:
            assert b.cpu_cost[kind][mac] > 0 and b.cpu_cost_source[kind][mac].startswith(stamp)
    assert hashlib.sha256(open(committed, "rb").read()).hexdigest() == before  # the committed profile is untouched


def test_default_output_is_calibrated_board_json_where_kv_ran(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.CALLER_CWD, str(tmp_path))
    assert calibrate.output_path("esp32s3_n8r8") == str(tmp_path / "calibrated" / "esp32s3_n8r8.json")
    assert calibrate.output_path("esp32s3_n8r8", write=True) == boards.path_of("esp32s3_n8r8")
