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
    big = got["buffers"]["large_bytes"]
    # a case reading or writing the large buffer walks all of it, not one cached 4 KiB
    assert [c["walk"] for c in got["copy"] if c["case"] != "small_small"] == [big] * 4, got["copy"]
    assert all(m["viper_us"] > 0 and m["bytecode_us"] > 0 for m in got["matvec"])
    assert len(got["matvec"]) == 7 and len({m["rows"] * m["cols"] // m["group"] // m["rows"] for m in got["matvec"]}) > 1


@pytest.mark.micropython
def test_on_a_large_heap_the_probe_walks_twice_the_largest_data_cache():
    # the ESP32-S3 profile's 8 MB heap: the large buffer is 2 x 64 KiB, twice the S3's
    # largest data cache (64 KiB), and each PSRAM case walks all of it
    r = interp.run(PROBE, "micropython", usable_heap=boards.load("esp32s3_n8r8").mpy_heap, args=["quick"], timeout=200)
    assert r.returncode == 0, r.stderr[-2000:]
    got = calibrate.parse(r.stdout.strip().splitlines()[-1])
    assert got["buffers"]["large_bytes"] == calibrate.WALK_MIN == 2 * 65536
    for c in got["copy"]:
        if c["case"] in ("large_small", "small_large", "large_large"):
            assert c["walk"] == calibrate.WALK_MIN, c


def test_probe_runs_on_cpython_too():
    r = interp.run(PROBE, "cpython", args=["quick"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = calibrate.parse(r.stdout.strip().splitlines()[-1])
    assert got["machine"] == "cpython" and got["heap"]["total"] == 0


# a probe result as an ESP32-S3 would give it: small buffers in internal SRAM, the large
# one in PSRAM (addresses of the ESP32-S3's data bus and data cache windows)
SRAM_A, SRAM_B, PSRAM = 0x3FC90000, 0x3FC92000, 0x3C100000


SHAPES = ((64, 64, 64), (172, 64, 64), (64, 172, 172), (64, 172, 43), (64, 128, 32), (16, 64, 64), (32, 64, 16))
# exact timings of a known kernel: ns = call + rows x row + groups x group + MACs x MAC
VIPER = {"call": 20_000.0, "row": 500.0, "group": 120.0, "mac": 45.0}
PLAIN = {"call": 9_000.0, "row": 3_000.0, "mac": 15_000.0}


def _ns(terms, rows, cols, group):
    return terms["call"] + rows * terms["row"] + rows * cols // group * terms.get("group", 0) + rows * cols * terms["mac"]


def _mv(rows, cols, group, viper=VIPER, plain=PLAIN):
    # a probe matvec record: 8 (viper) or 1 (bytecode) calls at the exact figures above
    return {"rows": rows, "cols": cols, "group": group, "viper_iters": 8,
            "viper_us": round(8 * _ns(viper, rows, cols, group) / 1000), "bytecode_iters": 1,
            "bytecode_us": round(_ns(plain, rows, cols, group) / 1000)}


def _s3_result(heap=8_100_000):
    def case(name, src, dst, n, us):
        return {"case": name, "src": src, "dst": dst, "bytes": n, "walk": 0 if name == "small_small" else 131072,
                "viper_iters": 4, "viper_us": us * 2, "slice_iters": 4, "slice_us": us}

    return {
        "probe": 2, "platform": "esp32", "machine": "Generic ESP32S3 module with Octal-SPIRAM with ESP32S3",
        "version": "micropython 1.24.1", "reps": 5,
        "heap": {"total": heap, "free": heap - 20000, "alloc": 20000, "largest": heap - 90000},
        "buffers": {"small_a": SRAM_A, "small_b": SRAM_B, "large": PSRAM, "large_bytes": 131072},
        "copy": [case("small_small", SRAM_A, SRAM_B, 4096, 50), case("small_small", SRAM_A, SRAM_B, 256, 4),
                 case("large_large", PSRAM, PSRAM + 65536, 65536, 12000), case("large_small", PSRAM, SRAM_A, 4096, 400),
                 case("small_large", SRAM_A, PSRAM, 4096, 300)],
        "switch": {"switches": 2001, "us": 40000},
        "matvec": [_mv(rows, cols, group) for rows, cols, group in SHAPES],
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
        # the least-squares fit recovers the figures (to the µs rounding); ns x MHz = millicycles;
        # the per-group cost is spread over the int8 group width of ./kv convert
        v, c = b.cpu_cost["viper"], b.cpu_cost["bytecode"]
        assert v["mac_i8_mcyc"] == pytest.approx((45 + 120 / 64) * 240, rel=0.01)
        assert v["row_mcyc"] == pytest.approx(500 * 240, rel=0.05) and v["matvec_mcyc"] == pytest.approx(20_000 * 240, rel=0.05)
        assert b.cpu_cost_source["viper"]["mac_i8_mcyc"].startswith("measured: by ./kv calibrate")
        assert c["mac_f32_mcyc"] == pytest.approx(15_000 * 240, rel=0.01)
        # one measurement, one figure: Plain.matvec's MAC is also viper's fp32 MAC and bytecode's int8 MAC
        assert v["mac_f32_mcyc"] == c["mac_f32_mcyc"] == c["mac_i8_mcyc"]
        assert b.cpu_cost_source["viper"]["mac_f32_mcyc"].startswith("measured: by ./kv calibrate")
        assert b.cpu_cost_source["bytecode"]["mac_i8_mcyc"].startswith("measured: by ./kv calibrate")
        assert "cpu.cost.viper.mac_i8_mcyc" in fields and p["calibration"]["refused"] == []
    assert "memory[0].cost.read_bytes_per_s" in fields and "micropython_heap_bytes" in fields


def test_every_cpu_figure_calibrate_writes_is_a_parameter_of_the_cost_model():
    from firmware_py import cpucost

    figs = calibrate.cpu_figures(_s3_result(), 240, "measured: x", "m", [])
    names = {(k, n) for k, n, _, _ in figs}
    assert {n for _, n in names} <= set(cpucost.PARAMS)
    assert names == {("viper", "mac_i8_mcyc"), ("viper", "mac_f32_mcyc"), ("viper", "row_mcyc"), ("viper", "matvec_mcyc"),
                     ("bytecode", "mac_f32_mcyc"), ("bytecode", "mac_i8_mcyc"), ("bytecode", "row_mcyc"),
                     ("bytecode", "matvec_mcyc")}
    from host import convert

    assert calibrate.GROUP == convert.Q8ROW_DEFAULT_GROUP


def test_a_fit_with_a_negative_term_or_a_large_residual_is_refused_not_clamped():
    prof = json.load(open(boards.path_of("esp32s3_n8r8")))
    r = _s3_result()
    # the old three-shape trap: a 64x64 call dearer per MAC than the wide shapes give a negative call term
    r["matvec"] = [_mv(*s, viper={"call": 0.0, "row": 0.0, "group": 0.0, "mac": 10.0}) for s in SHAPES]
    r["matvec"][0]["viper_us"] *= 3
    p, changed = calibrate.apply(prof, r, "P", date="2026-01-02")
    why = [w for w in p["calibration"]["refused"] if w.startswith("viper")]
    assert len(why) == 1 and "\n" not in why[0] and ("negative" in why[0] or "residual" in why[0]), why
    assert not any(f.startswith("cpu.cost.viper.mac_i8") for f, _, _ in changed)
    assert p["cpu"]["cost"]["viper"]["mac_i8_mcyc"] == prof["cpu"]["cost"]["viper"]["mac_i8_mcyc"]  # kept, not 0
    got, res, why = calibrate.fit([(64, 64, 64), (172, 64, 64), (64, 172, 43)], [25_500, 56_000, 95_700],
                                  ("call", "row", "group", "mac"))
    assert got is None and "cannot separate" in why  # the review's three timings: too few shapes for four terms
    noisy = [_ns(VIPER, *s) * (1.5 if i % 2 else 0.6) for i, s in enumerate(SHAPES)]
    got, res, why = calibrate.fit(SHAPES, noisy, ("call", "row", "group", "mac"))
    assert got is None and res > calibrate.MAX_RESIDUAL and ("residual" in why or "negative" in why), why


def test_a_psram_copy_walking_less_than_twice_the_cache_is_not_written():
    prof = json.load(open(boards.path_of("esp32s3_n8r8")))
    r = _s3_result()
    for c in r["copy"]:
        if c["case"] == "large_small":
            c["walk"] = 4096  # the old probe: one cached 4 KiB
    p, changed = calibrate.apply(prof, r, "P", date="2026-01-02")
    fields = {f for f, _, _ in changed}
    assert "memory[1].cost.read_bytes_per_s" not in fields and "memory[1].cost.write_bytes_per_s" in fields
    assert p["memory"][1]["cost"]["read_bytes_per_s"] == prof["memory"][1]["cost"]["read_bytes_per_s"]
    assert "not written" in p["calibration"]["tiers"]


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
    ('{"probe": 7}', "not a probe line of version 2"),
    ('{"probe": 1}', "not a probe line of version 2"),
    ('[1, 2]', "not a probe line"),
    ('{"probe": 2, "platform": "esp32"}', "a field is missing"),
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
        # --write from a virtual board would replace the committed profile's figures with the host's
        r3 = kv("calibrate", "--port", vb.port, "--board", "esp32s3_n8r8", "--write", "--json", timeout=300)
    assert r3.returncode == 2 and "is a virtual board" in _line(r3) and "Nothing written" in _line(r3), r3.stdout + r3.stderr
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
    assert cal["date"] == _today() and cal["virtual"] and cal["switch_ns"] > 0 and cal["probe"]["probe"] == 2
    assert 0 < cal["heap_largest_block_bytes"] <= b.mpy_heap
    for kind, mac in (("viper", "mac_i8_mcyc"), ("bytecode", "mac_f32_mcyc")):
        if kind in b.cpu_cost:
            # written from a fit that holds, or refused in one named line (a busy host's timings) and kept
            why = [w for w in cal["refused"] if w.startswith(kind + " matvec figures not written: ")]
            if why:
                assert "calibrate: " + why[0] in r.stdout and b.cpu_cost_source[kind][mac] == boards.load(
                    "esp32s3_n8r8").cpu_cost_source[kind][mac]
            else:
                assert b.cpu_cost[kind][mac] > 0 and b.cpu_cost_source[kind][mac].startswith(stamp)
    assert hashlib.sha256(open(committed, "rb").read()).hexdigest() == before  # the committed profile is untouched


def test_default_output_is_calibrated_board_json_where_kv_ran(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.CALLER_CWD, str(tmp_path))
    assert calibrate.output_path("esp32s3_n8r8") == str(tmp_path / "calibrated" / "esp32s3_n8r8.json")
    assert calibrate.output_path("esp32s3_n8r8", write=True) == boards.path_of("esp32s3_n8r8")


def test_cycles_are_counted_at_the_clock_the_board_reported():
    # the probe's ns become cycles at machine.freq()'s clock when the port gives one (an
    # ESP32-S3 left at 160 MHz counts 2/3 the cycles of the profile's 240 MHz), else the profile's
    prof = json.load(open(boards.path_of("esp32s3_n8r8")))
    at = {}
    for hz in (None, 160_000_000, 240_000_000):
        r = dict(_s3_result(), cpu_hz=hz)
        p, _ = calibrate.apply(prof, calibrate.parse(json.dumps(r)), "/dev/ttyACM0", date="2026-01-02")
        at[hz] = p
    mac = {hz: p["cpu"]["cost"]["viper"]["mac_i8_mcyc"]["value"] for hz, p in at.items()}
    assert mac[None] == mac[240_000_000] == pytest.approx(mac[160_000_000] * 1.5, rel=0.01)
    assert at[160_000_000]["calibration"]["cpu_mhz"] == 160
    assert "x 160 MHz (the board's clock, machine.freq(); the profile says 240 MHz)" in \
        at[160_000_000]["cpu"]["cost"]["viper"]["mac_i8_mcyc"]["source"]
    assert "(the profile's clock: this port has no machine.freq)" in at[None]["cpu"]["cost"]["viper"]["row_mcyc"]["source"]
    with pytest.raises(UserError, match="cpu_hz is not a clock"):
        calibrate.parse(json.dumps(dict(_s3_result(), cpu_hz="fast")))


@pytest.mark.parametrize("freq, want, line", [
    (None, 240, "clock n/a on this port (profile: 240 MHz)"),
    ([160_000_000, 240_000_000], 240, "240 MHz (set at boot: the profile's clock)"),
    ([240_000_000], 240, "240 MHz"),
    ([160_000_000, "refuse"], 240, "160 MHz (the profile's 240 MHz was refused"),
])
def test_the_boot_sets_the_profiles_clock_and_reports_it(monkeypatch, freq, want, line):
    # firmware_py.app's cpu line over a stand-in machine.freq: set when it differs, kept, refused
    import sys
    import types

    from firmware_py import app

    if freq is None:
        monkeypatch.setitem(sys.modules, "machine", types.ModuleType("machine"))
    else:
        state = {"hz": freq[0]}

        def f(hz=None):
            if hz is None:
                return state["hz"]
            if freq[-1] == "refuse":
                raise ValueError("frequency must be 20MHz, 40MHz, 80Mhz, 160MHz or 240MHz")
            state["hz"] = hz

        m = types.ModuleType("machine")
        m.freq = f
        monkeypatch.setitem(sys.modules, "machine", m)

    class B:
        cpu_mhz = want

    assert app._clock(B()).startswith(line)


def test_out_refuses_a_file_calibrate_did_not_write(tmp_path):
    mine = tmp_path / "notes.json"
    mine.write_text("my notes\n")
    with pytest.raises(UserError, match="not a profile ./kv calibrate wrote"):
        calibrate.output_path("esp32s3_n8r8", out=str(mine))
    assert mine.read_text() == "my notes\n"
    prof = json.load(open(boards.path_of("esp32s3_n8r8")))
    p, _ = calibrate.apply(prof, _s3_result(), "/dev/ttyACM0", date="2026-01-02")
    calibrate.write_profile(p, str(tmp_path / "cal.json"))
    assert calibrate.output_path("esp32s3_n8r8", out=str(tmp_path / "cal.json")) == str(tmp_path / "cal.json")  # ours: again
