# `kv calibrate --port P`: run the board-side probes (firmware_py/tools/probe.py) on a
# board, real or virtual, and write what they measured into a copy of its profile, each
# figure marked measured with the port and the UTC date, so the emulator, the budget
# and the sweeps use the user's own board instead of the estimates.
#
# The probe is sent as a script over the raw REPL (host/link.connect: mpremote's
# transport, every read under a deadline); it imports the flashed firmware (the kernels
# it times are the firmware's own), so a board without it is refused with the
# `./kv flash` command to run. The board's last line is one JSON object; anything else
# is refused in one line. What is written (docs/calibrate.md):
#   micropython_heap_bytes     gc.mem_free() + gc.mem_alloc() after a collect
#   memory[i].cost.*_bytes_per_s   copy rates of the tiers the probe's buffers landed in
#                              (by address on an ESP32 / ESP32-S3 / RP2; on the virtual
#                              board, the unix port's heap in host RAM stands for the
#                              profile's heap tier); memmove (memoryview slice copy) rates,
#                              the viper ptr32 loop's beside them in the source text
#   cpu.cost.viper.{mac_i8_mcyc,row_mcyc,matvec_mcyc}      from kernels_q.matvec_v timings
#   cpu.cost.bytecode.{mac_f32_mcyc,row_mcyc,matvec_mcyc}  from kernels.Plain.matvec timings
#   calibration                everything measured (switch cost, largest block, the raw probe)
# Where to: --out FILE; --write replaces boards/B.json itself; neither: calibrated/B.json
# under the folder ./kv ran from. The profile written is validated as board.load does.
import copy
import datetime
import json
import os

from firmware_py import board as fw_board
from firmware_py import cpucost
from host import boards, link, paths
from host.errors import UserError

PROBE = os.path.join(paths.FIRMWARE, "tools", "probe.py")
PROBE_VERSION = 2  # probe.VERSION this host understands
WALK_MIN = 2 * 65536  # bytes of PSRAM a copy case must walk to stand for PSRAM: twice the largest data cache of the
# supported chips (ESP32-S3: up to 64 KiB); probe.WALK_MIN
MAX_RESIDUAL = 0.15  # largest relative residual of a matvec fit that is written
GROUP = 64  # host/convert.py Q8ROW_DEFAULT_GROUP: the int8 group width the per-group cost is spread over
ANSWER_S = 30.0  # s the board may stay silent while the probe runs (it prints a line per stage)
CONNECT_S = 10.0  # s to reach the raw REPL
DEFAULT_DIR = "calibrated"  # default output folder, under where ./kv ran
NEEDS = ("firmware_py/compat.mpy", "firmware_py/pool.mpy", "firmware_py/kernels.mpy", "firmware_py/kernels_q.mpy",
         "firmware_py/sched/core.mpy", "firmware_py/clock.mpy")  # what the probe imports from the flashed firmware
_MAIN = 'if __name__ == "__main__":\n    main(sys.argv[1:])\n'  # probe.py's last lines, replaced by the call

# where a buffer lands, by address: (platform, substring of the machine name or "", [(lo, hi, tier kind)])
# ESP32-S3 TRM 4.3 (internal SRAM on the data bus 0x3FC88000.., external memory through
# the data cache 0x3C000000..0x3DFFFFFF); ESP32 TRM 1.3 (internal DRAM 0x3FFAE000..
# 0x3FFFFFFF, external SRAM 0x3F800000..0x3FBFFFFF); RP2350 datasheet 2.2 (SRAM
# 0x20000000.., QMI chip-select 1 XIP window 0x11000000.. cached / 0x15000000.. uncached)
ADDRESS_MAPS = (
    ("esp32", "ESP32S3", ((0x3FC88000, 0x3FD00000, "sram"), (0x3C000000, 0x3E000000, "psram"))),
    ("esp32", "", ((0x3FFAE000, 0x40000000, "sram"), (0x3F800000, 0x3FC00000, "psram"))),
    ("rp2", "", ((0x20000000, 0x20082000, "sram"), (0x11000000, 0x12000000, "psram"), (0x15000000, 0x16000000, "psram"))),
)


def today():
    # the UTC date, YYYY-MM-DD
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def probe_script(quick=False):
    # the probe as one raw-REPL command: probe.py with its __main__ block replaced by main([...])
    with open(PROBE) as f:
        text = f.read()
    if not text.endswith(_MAIN):
        raise UserError("%s does not end with its __main__ block; the probe cannot be sent" % PROBE)
    return text[: -len(_MAIN)] + "main(%r)\n" % (["quick"] if quick else [])


def _connect(port, seconds):
    # the raw REPL on port; the messages of link.connect, with calibrate's own hint
    try:
        return link.connect(port, seconds)
    except UserError as e:
        if "no prompt within" in str(e):
            raise UserError("no MicroPython raw REPL on %s: no prompt within %g s (the board ignores Ctrl-C or runs no "
                            "MicroPython): reset it and run this again" % (port, seconds)) from None
        raise


def run_probe(port, quick=False, out=None, answer_s=ANSWER_S):
    # run the probe on the board at port; (result dict, its last line). out(line) gets
    # each progress line the board prints
    from mpremote.transport import TransportError

    import serial

    t = _connect(port, min(CONNECT_S, answer_s))
    t.serial.__dict__["timeout"] = answer_s  # the probe's stages may take longer than the handshake's deadline
    lines = []
    buf = [b""]

    def consume(b):
        buf[0] += b.replace(b"\x04", b"")
        while b"\n" in buf[0]:
            ln, buf[0] = buf[0].split(b"\n", 1)
            text = ln.decode("utf-8", "replace").rstrip("\r")
            lines.append(text)
            if out and text.startswith("probe: "):
                out(text)

    try:
        have = link.device_hashes(t, list(NEEDS))
        missing = [p for p, h in zip(NEEDS, have, strict=True) if h is None]
        if missing:
            raise UserError("the board on %s has no kvrtos firmware (no %s): the probe times the firmware's own kernels; "
                            "run ./kv flash --port %s first" % (port, missing[0], port), 2)
        _, err = t.exec_raw(probe_script(quick), timeout=None, data_consumer=consume)
    except (TransportError, serial.SerialException, OSError) as e:
        link.close(t)
        if isinstance(e, link.BoardSilent) and os.path.exists(port):
            raise UserError("the board on %s sent nothing for %g s while probing: reset it and run this again" % (port, answer_s)) from None
        raise UserError("port %s vanished or stopped answering while probing [%s]" % (port, type(e).__name__)) from None
    except BaseException:
        link.close(t)
        raise
    link.close(t)
    if buf[0]:
        lines.append(buf[0].decode("utf-8", "replace").rstrip("\r"))
    err = err.decode("utf-8", "replace").strip()
    if err:
        raise UserError("the probe failed on the board on %s: %s" % (port, err.splitlines()[-1]))
    last = next((ln for ln in reversed(lines) if ln.strip()), "")
    return parse(last), last


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def parse(line):
    # the probe's JSON line as a checked dict; UserError (one line) when it is anything else
    def bad(why):
        shown = line if len(line) <= 80 else line[:77] + "..."
        return UserError("the board's probe answer was not understood (%s): %r" % (why, shown))

    try:
        r = json.loads(line)
    except ValueError:
        raise bad("not JSON") from None
    if not isinstance(r, dict) or r.get("probe") != PROBE_VERSION:
        raise bad("not a probe line of version %d" % PROBE_VERSION)
    try:
        for k in ("platform", "machine", "version"):
            if not isinstance(r[k], str):
                raise bad("%s is not text" % k)
        h = r["heap"]
        for k in ("total", "free", "alloc", "largest"):
            if not _is_int(h[k]) or h[k] < 0:
                raise bad("heap.%s is not a whole number" % k)
        for c in r["copy"]:
            for k in ("src", "dst", "bytes", "walk", "viper_iters", "viper_us", "slice_iters", "slice_us"):
                if not _is_int(c[k]) or c[k] < 0:
                    raise bad("copy.%s is not a whole number" % k)
            if not isinstance(c["case"], str):
                raise bad("copy.case is not text")
        hz = r.get("cpu_hz")
        if hz is not None and not (_is_int(hz) and 10 ** 6 <= hz <= 10 ** 11):
            raise bad("cpu_hz is not a clock in Hz (1 MHz or more)")
        sw = r["switch"]
        if not (_is_int(sw["switches"]) and _is_int(sw["us"]) and sw["switches"] > 0 and sw["us"] >= 0):
            raise bad("switch is not whole numbers")
        for m in r["matvec"]:
            for k in ("rows", "cols", "group", "viper_iters", "viper_us", "bytecode_iters", "bytecode_us"):
                if not _is_int(m[k]):
                    raise bad("matvec.%s is not a whole number" % k)
    except (KeyError, TypeError):
        raise bad("a field is missing") from None
    return r


def tier_kind(r, addr):
    # the tier kind ("sram", "psram") a buffer at addr lands in on the probed board, "host"
    # for the unix port (the virtual board: host RAM), None when the address says nothing
    if r["platform"] in ("linux", "darwin") or r["machine"] == "cpython":
        return "host"
    for plat, mach, ranges in ADDRESS_MAPS:
        if r["platform"] == plat and mach in r["machine"]:
            for lo, hi, kind in ranges:
                if lo <= addr < hi:
                    return kind
            return None
    return None


def heap_tier(prof):
    # the profile's tier holding the MicroPython heap: PSRAM (or DRAM) when it has one, else SRAM
    for kind in ("psram", "dram", "sram"):
        for t in prof["memory"]:
            if t["kind"] == kind:
                return t
    return prof["memory"][0]


def _rate(c, how):
    # bytes/s of one copy case by "slice" or "viper" (0 when the tick saw nothing)
    us = c[how + "_us"]
    return c["bytes"] * c[how + "_iters"] * 1000000 // us if us > 0 else 0


def copy_figures(r, prof):
    # {tier name: {field: (rate, case)}} for the cost fields the probe's copies attribute
    # (largest case wins), and the note on where the buffers landed
    tiers = {t["kind"]: t["name"] for t in reversed(prof["memory"])}  # first tier of each kind
    virtual = tier_kind(r, 0) == "host"
    ht = heap_tier(prof)["name"]
    slow = {ht} if virtual else {t["name"] for t in prof["memory"] if t["kind"] != "sram"}  # behind a data cache
    out = {}
    short = []  # walks too short to stand for PSRAM

    def put(tier, field, c):
        if tier in slow and c["walk"] < WALK_MIN:
            short.append(c["walk"])
            return
        old = out.setdefault(tier, {}).get(field)
        if old is None or c["bytes"] > old[1]["bytes"]:
            out[tier][field] = (_rate(c, "slice"), c)

    for c in r["copy"]:
        if virtual:
            if c["case"] == "small_small":
                continue  # two small buffers in a data cache: no figure of the heap's tier (it is behind one)
            field = {"large_small": "read_bytes_per_s", "small_large": "write_bytes_per_s"}.get(c["case"], "copy_bytes_per_s")
            put(ht, field, c)
            continue
        s, d = tier_kind(r, c["src"]), tier_kind(r, c["dst"])
        if s is None or d is None or s not in tiers or d not in tiers:
            continue
        if s == d:
            put(tiers[s], "copy_bytes_per_s", c)
            if s == "sram":  # SRAM's read and write figures are SRAM to SRAM (board.py)
                put(tiers[s], "read_bytes_per_s", c)
                put(tiers[s], "write_bytes_per_s", c)
        elif d == "sram":
            put(tiers[s], "read_bytes_per_s", c)
        elif s == "sram":
            put(tiers[d], "write_bytes_per_s", c)
    if virtual:
        note = "virtual board: the unix port's heap in host RAM stands for the profile's %s heap" % ht
    else:
        kinds = sorted({k for c in r["copy"] for k in (tier_kind(r, c["src"]), tier_kind(r, c["dst"])) if k})
        note = "buffers landed in %s (by address)" % (", ".join(kinds) or "no tier the address map knows")
    if short:
        note += ("; copies walking %d B of the large buffer (less than %d B, twice the data cache: the heap had no room) "
                 "not written" % (max(short), WALK_MIN))
    return out, note


def fit(shapes, ns, terms):
    # least squares of ns (per call) over shapes [(rows, cols, group)] with the named terms
    # of "call", "row", "group", "mac" (ns each; groups = rows x cols / group); (ns per
    # term {name: ns}, largest relative residual, None) or (None, residual, why not) when
    # the fit is refused: too few shapes, a term < 0 (noise larger than the term, or a
    # model that does not hold) or a residual above MAX_RESIDUAL. Never clamped.
    import numpy as np

    cols = {"call": lambda r, c, g: 1.0, "row": lambda r, c, g: float(r), "group": lambda r, c, g: float(r * c // g),
            "mac": lambda r, c, g: float(r * c)}
    a = np.array([[cols[t](*s) for t in terms] for s in shapes])
    y = np.array(ns, dtype=float)
    if len(shapes) <= len(terms) or np.linalg.matrix_rank(a) < len(terms):
        return None, 0.0, "%d shapes cannot separate %d terms" % (len(shapes), len(terms))
    x = np.linalg.lstsq(a, y, rcond=None)[0]
    res = float(np.max(np.abs(a @ x - y) / y))
    got = {t: float(v) for t, v in zip(terms, x, strict=True)}
    neg = [t for t in terms if got[t] < 0]
    if neg:
        return None, res, "the %s term came out negative (%.1f ns)" % (neg[0], got[neg[0]])
    if res > MAX_RESIDUAL:
        return None, res, "a residual of %.0f%% (more than %.0f%%: the timings are noisy or the model does not hold)" % (
            100 * res, 100 * MAX_RESIDUAL)
    return got, res, None


def matvec_figures(r):
    # {kind: (ns per term, residual, why refused or None, shapes used)} for "viper"
    # (terms call, row, group, mac) and "bytecode" (call, row, mac: Plain.matvec has no
    # groups; each rows x cols once) from the shapes the probe timed
    out = {}
    for kind, terms in (("viper", ("call", "row", "group", "mac")), ("bytecode", ("call", "row", "mac"))):
        shapes, ns, seen = [], [], set()
        for m in r["matvec"]:
            if m[kind + "_us"] <= 0 or m[kind + "_iters"] <= 0 or m["group"] <= 0:
                continue
            key = (m["rows"], m["cols"]) if kind == "bytecode" else (m["rows"], m["cols"], m["group"])
            if key in seen:
                continue
            seen.add(key)
            shapes.append((m["rows"], m["cols"], m["group"]))
            ns.append(m[kind + "_us"] * 1000.0 / m[kind + "_iters"])
        got, res, why = fit(shapes, ns, terms)
        out[kind] = (got, res, why, shapes)
    return out


KERNEL = {"viper": "kernels_q.matvec_v (@viper, int8 weights, int32 activations)",
          "bytecode": "kernels.Plain.matvec (fp32, plain bytecode)"}


def cpu_figures(r, mhz, by, where, refused, clock="the profile's clock"):
    # [(kind, parameter, millicycles, source)] from the matvec fits; a refused fit adds
    # "KIND matvec figures not written: why" to refused and writes nothing of that kind.
    # Figures of one measurement go together: Plain.matvec's MAC is bytecode.mac_f32_mcyc,
    # viper.mac_f32_mcyc (fp32 weights under viper run it: the firmware has no fp32 viper
    # matvec) and bytecode.mac_i8_mcyc (the bytecode path boxes every product alike)
    out = []
    for kind, (got, res, why, shapes) in sorted(matvec_figures(r).items()):
        if got is None:
            refused.append("%s matvec figures not written: %s" % (kind, why))
            continue
        shown = ", ".join("%dx%d" % s[:2] + (" g%d" % s[2] if kind == "viper" else "") for s in shapes)
        model = ("call + rows x row + groups x group + MACs x MAC" if kind == "viper" else "call + rows x row + MACs x MAC")
        fit_src = ("%s: %s at %s on %s, medians of %d; ns per call = %s by least squares (largest residual %.1f%%), "
                   "x %d MHz (%s)" % (by, KERNEL[kind], shown, where, r["reps"], model, 100 * res, mhz, clock))

        def mc(ns):
            return int(round(ns * mhz))  # ns x MHz = millicycles

        if kind == "viper":
            mac = got["mac"] + got["group"] / GROUP
            out.append(("viper", "mac_i8_mcyc", mc(mac), "%s: %.2f ns per MAC + %.1f ns per group / %d (the int8 group "
                        "width of ./kv convert) = %.2f ns" % (fit_src, got["mac"], got["group"], GROUP, mac)))
        else:
            src = "%s: %.2f ns" % (fit_src, got["mac"])
            out.append(("bytecode", "mac_f32_mcyc", mc(got["mac"]), src))
            out.append(("viper", "mac_f32_mcyc", mc(got["mac"]), src + " (fp32 weights under viper run this kernel)"))
            out.append(("bytecode", "mac_i8_mcyc", mc(got["mac"]), src + " (taken for int8 too: the bytecode kernels box "
                        "every product)"))
        out.append((kind, "row_mcyc", mc(got["row"]), "%s: %.2f ns" % (fit_src, got["row"])))
        out.append((kind, "matvec_mcyc", mc(got["call"]), "%s: %.2f ns" % (fit_src, got["call"])))
    return out


def clock_mhz(r, profile_mhz):
    # (MHz, how it is known) the probe's ns are turned into cycles at: the clock the board
    # reported (machine.freq()) while it ran them, else the profile's
    hz = r.get("cpu_hz")
    if not hz:
        return profile_mhz, "the profile's clock: this port has no machine.freq"
    mhz = (hz + 500000) // 1000000
    if mhz == profile_mhz:
        return mhz, "the board's clock, machine.freq(), as the profile's"
    return mhz, "the board's clock, machine.freq(); the profile says %d MHz" % profile_mhz


def apply(prof, r, port, date=None):
    # a new profile dict: prof with r's figures written in, and the list of what changed
    # [(field path, value, source)]
    date = date or today()
    p = copy.deepcopy(prof)
    by = "measured: by ./kv calibrate on %s %s" % (port, date)
    virtual = tier_kind(r, 0) == "host"
    where = "%s, %s" % (r["machine"], r["version"]) + (" (a virtual board)" if virtual else "")
    changed = []
    est = [e for e in p.get("estimates", [])]

    def unestimate(name):
        if name in est:
            est.remove(name)

    # the heap
    h = r["heap"]
    if p.get("kind") == "mcu" and h["total"] >= 1024:
        p["micropython_heap_bytes"] = h["total"]
        src = "%s: gc.mem_free() + gc.mem_alloc() after gc.collect() on %s (largest block %d B)" % (by, where, h["largest"])
        p["source"] = p["source"] + "; micropython_heap_bytes " + src
        unestimate("micropython_heap_bytes")
        changed.append(("micropython_heap_bytes", h["total"], src))
    # the tiers' copy rates
    figs, note = copy_figures(r, p)
    for i, t in enumerate(p["memory"]):
        for field, (rate, c) in sorted(figs.get(t["name"], {}).items()):
            if rate < 1:
                continue
            src = ("%s: %s copy of %d B by memoryview slice assignment (memmove), median of %d: %d B/s; the viper ptr32 loop "
                   "(pool.copy32): %d B/s; %s; %s" % (by, c["case"].replace("_", " to "), c["bytes"], r["reps"], rate,
                                                       _rate(c, "viper"), note, where))
            if "cost" in t:
                t["cost"][field] = {"value": rate, "source": src}
                changed.append(("memory[%d].cost.%s" % (i, field), rate, src))
            elif field == "read_bytes_per_s":
                t["bandwidth_bytes_per_s"] = rate
                t["source"] = t["source"] + "; bandwidth_bytes_per_s " + src
                unestimate("memory[%d].bandwidth_bytes_per_s" % i)
                changed.append(("memory[%d].bandwidth_bytes_per_s" % i, rate, src))
    # the CPU cost figures of the viper and bytecode kinds
    mhz, clock = clock_mhz(r, p["cpu"]["mhz"])
    cost = p["cpu"].get("cost", {})
    refused = []
    for kind, name, v, src in cpu_figures(r, mhz, by, where, refused, clock):
        if kind in cost and name in cpucost.PARAMS:
            cost[kind][name] = {"value": v, "source": src}
            changed.append(("cpu.cost.%s.%s" % (kind, name), v, src))
    if "estimates" in p or est:
        p["estimates"] = est
    sw = r["switch"]
    p["calibration"] = {
        "tool": "./kv calibrate", "port": port, "date": date, "machine": r["machine"], "version": r["version"],
        "virtual": virtual, "tiers": note, "cpu_mhz": mhz, "clock": clock,
        "switch_ns": sw["us"] * 1000 // sw["switches"],
        "heap_largest_block_bytes": h["largest"],
        "fields": [c[0] for c in changed],
        "refused": refused,
        "probe": r,
    }
    return p, changed


def _read_profile(path):
    # the profile's dict as stored (key order kept) and its validated Board
    with open(path) as f:
        text = f.read()
    b = boards.load(path)
    return json.loads(text), b


def output_path(board_name, out=None, write=False):
    # where the calibrated profile goes (see the top)
    if out and write:
        raise UserError("--out and --write are two different places: give one", 2)
    if out == "":
        raise UserError("--out needs a file name", 2)
    if write:
        return boards.path_of(board_name)
    if out:
        p = paths.user_path(out)
        if os.path.isdir(p):
            raise UserError("--out %s is a folder; give the profile's file name" % out, 2)
        parent = os.path.dirname(p)
        if not os.path.isdir(parent):
            raise UserError("--out %s: folder %s does not exist" % (out, parent), 2)
        if os.path.lexists(p) and not _ours(p):
            raise UserError("--out %s exists and is not a profile ./kv calibrate wrote: choose a new name (nothing "
                            "written)" % out, 2)
        return p
    return paths.user_path(os.path.join(DEFAULT_DIR, os.path.basename(boards.path_of(board_name))))


def _ours(path):
    # True when path holds a profile an earlier ./kv calibrate wrote (its "calibration" block)
    try:
        paths.regular_file(path, "--out")
        with open(path) as f:
            d = json.load(f)
        return isinstance(d, dict) and isinstance(d.get("calibration"), dict) and \
            d["calibration"].get("tool") == "./kv calibrate"
    except (OSError, ValueError, UserError):
        return False


def write_profile(p, dest):
    # validate p as board.load does, then write it (atomically) to dest
    text = json.dumps(p, indent=2) + "\n"
    try:
        fw_board.loads(text, dest)
    except fw_board.BoardError as e:
        raise UserError("the calibrated profile would not load (%s): nothing written" % e)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = dest + ".part"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, dest)
    except OSError as e:
        raise UserError("cannot write %s: %s" % (dest, e.strerror or e)) from None


def main(port, board=paths.DEFAULT_BOARD, out=None, write=False, as_json=False, quick=False, echo=print, answer_s=ANSWER_S):
    # ./kv calibrate: probe, write the profile, print what was measured; returns the report
    if not port:
        raise UserError("--port is required: the board's serial port (a virtual board's: ./kv vboard prints it)", 2)
    src = boards.path_of(board)
    prof, b = _read_profile(src)
    if b.kind != "mcu":
        raise UserError("board %s is a %s: calibrate probes MicroPython boards" % (b.name, b.kind), 2)
    dest = output_path(board, out, write)
    r, _ = run_probe(port, quick=quick, out=None if as_json else (lambda ln: echo("calibrate: " + ln)), answer_s=answer_s)
    if write and tier_kind(r, 0) == "host":
        # a virtual board's figures are the host's (PSRAM at tens of GB/s): written into the
        # committed profile they made every emulation of that board 40x too fast
        raise UserError("--write: %s is a virtual board (the unix port in host RAM); its figures would replace %s's "
                        "measured ones. Nothing written; --out FILE keeps them apart" % (port, b.name), 2)
    p, changed = apply(prof, r, port)
    write_profile(p, dest)
    report = {"board": b.name, "port": port, "date": p["calibration"]["date"], "profile": dest, "from": src,
              "virtual": p["calibration"]["virtual"], "tiers": p["calibration"]["tiers"],
              "switch_ns": p["calibration"]["switch_ns"], "heap_largest_block_bytes": r["heap"]["largest"],
              "cpu_mhz": p["calibration"]["cpu_mhz"], "clock": p["calibration"]["clock"],
              "figures": {f: v for f, v, _ in changed}, "refused": p["calibration"]["refused"]}
    if as_json:
        echo(json.dumps(report, sort_keys=True))
        return report
    for f, v, _ in changed:
        echo("  %-40s %d" % (f, v))
    for why in p["calibration"]["refused"]:
        echo("calibrate: " + why)
    echo("  %-40s %d ns (not a profile field: kept under calibration)" % ("task switch", report["switch_ns"]))
    echo("  %-40s %d MHz (%s)" % ("cpu clock the cycles are counted at", report["cpu_mhz"], report["clock"]))
    echo("calibrate: %d figures of %s measured on %s (%s), written to %s" % (len(changed), b.name, port, report["tiers"], _shown(dest)))
    return report


def _shown(p):
    # a path as the user would type it (relative to the repository when inside it)
    return os.path.relpath(p, paths.ROOT) if p.startswith(paths.ROOT + os.sep) else p
