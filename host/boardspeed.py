# How much slower the board runs MicroPython than this host does, per emitter (bytecode,
# native, viper), derived from published board timings of code anyone can get.
#
# Each point (boards/speed/points.json) is a published time of a MicroPython program on
# a board: its source (URL, where on the page, the quoted line), the chip, its clock
# (stated, or the firmware's default at that version, labelled), the MicroPython version,
# the emitter and where its code is (MicroPython's tests/perf_bench at a tag, read from
# a git clone of micropython/micropython at run time: no benchmark code is kept here).
# measure() runs each obtainable point's code on the 32-bit unix port (the board's word
# size) built from the tag it was measured with, takes the median of RUNS runs, and
# gives the point's ratio in board cycles per host ns:
#     published_us x MHz / (host_us x 1000)
# fit() gives, per emitter, the factor (the median of its points), its band (the lowest
# and highest point) and a leave-one-out table: each point's board time predicted from
# the others' median, with its error. A point whose code or figure cannot be obtained
# is listed with the reason and kept out of the fit.
import hashlib
import json
import os
import re
import statistics
import subprocess
import tempfile

from host import mp32, paths
from host.errors import UserError

POINTS = os.path.join(paths.BOARDS, "speed", "points.json")
REPO_ENV = "KVRTOS_MICROPYTHON_REPO"  # a git clone of micropython/micropython (tests/perf_bench, old tags)
EMITTERS = ("bytecode", "native", "viper")
WORKLOADS = EMITTERS + ("viper-call",)  # what fit() reports: viper-call is reported, never a kernel's price
RUNS = 5
_KEYS = ("id", "url", "where", "quote", "chip", "mhz", "mhz_source", "micropython_version", "emitter", "code",
         "published_us", "covers", "obtainable")
_UNIT_US = {"s": 1e6, "ms": 1e3, "us": 1.0}
_DILATE = """import sys
import time as _time


class _Dilated:
    def __getattr__(self, name):
        return getattr(_time, name)

    def ticks_us(self):
        return _time.ticks_us() * 1000


sys.modules["time"] = _Dilated()
with open(%(path)r) as _f:
    _src = _f.read()
exec(compile(_src, "benchmark.py", "exec"), {"__name__": "__main__"})
"""
_SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/+-]{0,199}$")  # a ref, path or owner/name: never an option
_TIME = re.compile(r"^(-?\d+) (-?[\d.]+) ", re.M)  # benchrun's line: time_us norm result


def load(path=POINTS):
    # the points, checked: one UserError line naming the point and the field otherwise
    try:
        with open(path) as f:
            pts = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError("%s: %s" % (path, e), 2)
    if not isinstance(pts, list):
        raise UserError("%s: a JSON list of points is expected" % path, 2)
    seen = set()
    for i, p in enumerate(pts):
        name = p.get("id", "#%d" % i) if isinstance(p, dict) else "#%d" % i
        if not isinstance(name, str) or not name:
            raise UserError("%s: point #%d: id must be a non-empty string" % (path, i), 2)
        if not isinstance(p, dict):
            raise UserError("%s: point %s is not an object" % (path, name), 2)
        for k in (_KEYS if usable(p) else ("id", "url", "where", "obtainable")):
            if k not in p:
                raise UserError("%s: point %s has no %r" % (path, name, k), 2)
        if name in seen:
            raise UserError("%s: point id %s appears twice" % (path, name), 2)
        seen.add(name)
        if usable(p):
            if p["emitter"] not in EMITTERS:
                raise UserError("%s: point %s: emitter must be one of %s" % (path, name, ", ".join(EMITTERS)), 2)
            if isinstance(p["mhz"], bool) or not (isinstance(p["mhz"], (int, float)) and p["mhz"] > 0):
                raise UserError("%s: point %s: mhz must be a positive number" % (path, name), 2)
            if isinstance(p["published_us"], bool) or not (isinstance(p["published_us"], (int, float)) and p["published_us"] > 0):
                raise UserError("%s: point %s: published_us must be a positive number" % (path, name), 2)
            c = p["code"]
            if not isinstance(c, dict) or c.get("kind") not in ("perf_bench", "script") or not c.get("path") or not c.get("ref"):
                raise UserError("%s: point %s: code must be {kind: perf_bench or script, repo, path, ref, ...}" % (path, name), 2)
            for k in ("ref", "build_ref", "path", "repo"):
                v = c.get(k)
                if v is not None and (not isinstance(v, str) or not _SAFE.match(v) or ".." in v):
                    raise UserError("%s: point %s: code.%s must be a plain tag, commit or path, not %r" % (path, name, k, v), 2)
            if not isinstance(c.get("params", {}), dict):
                raise UserError("%s: point %s: code.params must be an object" % (path, name), 2)
            nrm, sc = c.get("params", {}).get("norm"), p.get("published_score")
            if isinstance(nrm, (int, float)) and isinstance(sc, (int, float)) and sc > 0:
                if abs(1e6 * nrm / sc - p["published_us"]) > 0.01 * p["published_us"]:
                    raise UserError("%s: point %s: published_us %s is not 1e6 x norm %s / score %s" % (
                        path, name, p["published_us"], nrm, sc), 2)
            if c["kind"] == "perf_bench":
                nm = c.get("params", {})
                if not all(isinstance(nm.get(k), int) and nm[k] > 0 for k in ("N", "M")):
                    raise UserError("%s: point %s: code.params needs whole numbers N and M" % (path, name), 2)
            else:
                try:
                    ok = re.compile(c.get("output", "")).groups == 1 and c.get("unit") in _UNIT_US
                except (re.error, TypeError):
                    ok = False
                if not ok:
                    raise UserError("%s: point %s: a script point needs output (a regex with one group) and unit (s, ms, us)"
                                    % (path, name), 2)
    return pts


def workload(p):
    # the emitter a point prices: perf_bench's viper_call* time a native loop calling an
    # empty viper function, i.e. call overhead ("viper-call"), not emitted viper loops
    em = p.get("emitter")
    if em == "viper" and "viper_call" in str((p.get("code") or {}).get("path", "")):
        return "viper-call"
    return em


def usable(p):
    # a point that can be timed here: obtainable and not excluded (excluded says why)
    return bool(p.get("obtainable")) and not p.get("excluded")


def repo(given=None):
    # the git clone of micropython/micropython to read code and tags from, or UserError
    r = given or os.environ.get(REPO_ENV)
    if not r:
        raise UserError("the published points' code is MicroPython's tests/perf_bench: set %s to a git clone of "
                        "micropython/micropython (with jonnor/embeddedml and micropython/micropython-lib beside it)" % REPO_ENV, 2)
    r = paths.user_path(r)
    if not os.path.isdir(r):
        raise UserError("no MicroPython git repository at %s" % r, 2)
    return r


def _git(rep, *args):
    try:
        r = subprocess.run(["git", "--git-dir", mp32.git_dir(rep)] + list(args), capture_output=True, timeout=120)
    except FileNotFoundError:
        raise UserError("git is not installed; the published points' code is read with it", 1)
    except subprocess.TimeoutExpired:
        raise UserError("git %s in %s ran past 120 s" % (args[0], rep), 1)
    return r.returncode, r.stdout


def mirror(rep, name):
    # the git repository for `name` ("owner/repo"): micropython/micropython is `rep`; another
    # is looked for beside it (DIR/owner+repo/repo, DIR/owner+repo, DIR/repo) under rep's parents
    if name in (None, "micropython/micropython"):
        return rep
    owner, _, base = name.partition("/")
    top = os.path.abspath(rep)
    for _ in range(3):
        top = os.path.dirname(top)
        for cand in (os.path.join(top, owner + "+" + base, "repo"), os.path.join(top, owner + "+" + base),
                     os.path.join(top, base)):
            if os.path.isdir(cand) and _git(cand, "rev-parse", "--git-dir")[0] == 0:
                return cand
    return None


def script(point, rep):
    # the program the point's source ran, read from its repository at the point's ref:
    # perf_bench: the benchmark file, benchrun.py and bm_run(N, M), as run-perfbench.py
    # sends them; script: the file itself. (text, sha256)
    c = point["code"]
    src = mirror(rep, c.get("repo"))
    if src is None:
        raise UserError("point %s: its code is in %s: put a clone beside %s (as owner+name/repo)" % (point["id"], c["repo"], rep), 2)
    files = [c["path"]]
    if c["kind"] == "perf_bench":
        files.append(os.path.join(os.path.dirname(c["path"]), "benchrun.py"))
    parts = []
    for path in files:
        rc, out = _git(src, "show", "%s:%s" % (c["ref"], path))
        if rc != 0:
            raise UserError("point %s: %s has no %s at %s" % (point["id"], src, path, c["ref"]), 1)
        parts.append(out.decode())
    if c["kind"] == "perf_bench":
        text = "import sys\nsys.path.remove('')\n\n" + parts[0] + parts[1] + "bm_run(%d, %d)\n" % (c["params"]["N"], c["params"]["M"])
    else:
        text = parts[0]
    return text, hashlib.sha256(text.encode()).hexdigest()


def build_for(point, rep):
    # (binary, the MicroPython version it runs): the 32-bit unix port built from the tag
    # the point was measured with (code.build_ref, else code.ref)
    ref = point["code"].get("build_ref") or point["code"]["ref"]
    return mp32.build(mp32.tree_at(rep, ref), cflags=mp32.TAG_CFLAGS), ref


def host_us(binary, text, runs=RUNS, code=None):
    # the median of `runs` timings (µs) of the program, and all of them. perf_bench: fed on
    # stdin as run-perfbench.py feeds a unix build, timed by benchrun's own ticks_us;
    # script: run as a file with code.argv, its printed figure (code.output, code.unit)
    # times code.scale (published work over the host's, e.g. 500 / 20000 pystone passes)
    code = code or {"kind": "perf_bench"}
    cmd = [binary] + (["-X", "emit=" + code["emit"]] if code.get("emit") else [])
    path = None
    dilate = 1
    if code["kind"] == "script":
        fd, path = tempfile.mkstemp(suffix=".py")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if code.get("timer") == "dilate":
            # the script prints its time truncated to a millisecond, about the host's whole
            # run: run it unchanged under a time module whose ticks_us counts nanoseconds,
            # so its printed figure has a microsecond's resolution (divided back below)
            drv_fd, drv = tempfile.mkstemp(suffix=".py")
            with os.fdopen(drv_fd, "w") as f:
                f.write(_DILATE % {"path": path})
            path_script, path, dilate = path, drv, 1000
    times = []
    try:
        for _ in range(runs):
            try:
                if path:
                    r = subprocess.run(cmd + [path] + list(code.get("argv", [])), capture_output=True, text=True,
                                       timeout=600, cwd=os.path.dirname(path))
                else:
                    r = subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=600)
            except subprocess.TimeoutExpired:
                raise UserError("%s ran past 600 s" % binary, 1)
            if path:
                m = re.search(code["output"], r.stdout, re.M)
                t = float(m.group(1)) * _UNIT_US[code["unit"]] * code.get("scale", 1.0) / dilate if m else -1
            else:
                m = _TIME.search(r.stdout)
                t = int(m.group(1)) if m else -1
            if r.returncode != 0 or t <= 0:
                raise UserError("the benchmark failed on %s: %s" % (binary, (r.stdout + r.stderr).strip()[-200:] or
                                                                     "no time printed"), 1)
            times.append(t)
    finally:
        if path:
            os.unlink(path)
            if dilate != 1:
                os.unlink(path_script)
    return statistics.median(times), times


PROBE = os.path.join(paths.FIRMWARE, "tools", "costprobe.py")


# The decode steps costprobe times (its round figures): random llama2c models of
# stories260K's shape with 1 and with 3 layers, fp32 (the float path) and q8row (the
# integer path), written here
PROBE_SHAPE = {"dim": 64, "hidden_dim": 172, "n_heads": 8, "n_kv_heads": 4, "vocab_size": 512, "seq_len": 256}
PROBE_LAYERS = (1, 3)
# a held-out model the figures are not derived from: its measured steps against the cost
# model's prediction from the derived figures (derive's "holdout") say how far they carry
HOLDOUT_SHAPE = {"dim": 128, "hidden_dim": 344, "n_heads": 8, "n_kv_heads": 4, "vocab_size": 512, "seq_len": 256,
                 "n_layers": 2}
PROBE_HEAP = 8000000  # -X heapsize of the round figures' run: esp32s3_n8r8's micropython_heap_bytes


def probe_models(folder):
    # write the probe's models into folder: fp32_L1.bin, fp32_L3.bin, q8_L1.bin, q8_L3.bin, and
    # the held-out fp32_X.bin, q8_X.bin
    import contextlib
    import io
    import struct

    import numpy as np

    from host import convert

    for name, s, n in [("L%d" % n, PROBE_SHAPE, n) for n in PROBE_LAYERS] + [("X", HOLDOUT_SHAPE, HOLDOUT_SHAPE["n_layers"])]:
        d, hid, h, nkv, v, seq = s["dim"], s["hidden_dim"], s["n_heads"], s["n_kv_heads"], s["vocab_size"], s["seq_len"]
        hd = d // h
        kvd = nkv * hd
        rng = np.random.default_rng(n + (100 if name == "X" else 0))

        def r(*shape, lo=-0.5, hi=0.5, rng=rng):
            return rng.uniform(lo, hi, shape).astype("<f4").tobytes()

        fp = os.path.join(folder, "fp32_%s.bin" % name)
        with open(fp, "wb") as f:
            f.write(struct.pack("<7i", d, hid, n, h, nkv, v, seq))
            for part in (r(v, d), r(n, d, lo=0.5, hi=1.5), r(n, d, d), r(n, kvd, d), r(n, kvd, d), r(n, d, d),
                         r(n, d, lo=0.5, hi=1.5), r(n, hid, d), r(n, d, hid), r(n, hid, d), r(d, lo=0.5, hi=1.5),
                         r(seq * hd)):
                f.write(part)
        with contextlib.redirect_stdout(io.StringIO()):
            convert.convert(fp, os.path.join(folder, "q8_%s.bin" % name), "q8row")


def _step_ns(kind, figs, layers, s=PROBE_SHAPE, n_kv=1):
    # ns of one decode step at n_kv cached positions of a model of shape s with `layers`
    # layers, by the cost model (firmware_py/cpucost.py) from ns figures {param: ns}
    import types

    from firmware_py import cpucost

    hd = s["dim"] // s["n_heads"]
    cfg = types.SimpleNamespace(dim=s["dim"], hidden_dim=s["hidden_dim"], n_heads=s["n_heads"],
                                n_kv_heads=s["n_kv_heads"], head_dim=hd, kv_dim=s["n_kv_heads"] * hd,
                                vocab_size=s["vocab_size"], seq_len=s["seq_len"], n_layers=layers)
    v = {p: 0 for p in cpucost.PARAMS}
    v.update({p: int(round(1000 * x)) for p, x in figs.items()})  # millicycles at 1,000 MHz: ns x 1000
    v.update(cores=1, split_permille=0)
    brd = types.SimpleNamespace(name="probe", cpu_mhz=1000, cpu_cost={kind: v},
                                cpu_cost_source={kind: {p: "fit:" for p in cpucost.PARAMS}})
    m = cpucost.CostModel(brd, kind, cfg, "int8" if kind == "viper" else "fp32", "int8" if kind == "viper" else "fp32")
    return layers * m.layer_ns(n_kv) + m.final_ns()


def derive(pr):
    # the figures a decode step's timings give, beside the kernels timed one by one: per
    # (layer, head, cached position) the attention (attn_mac and attn_pos), and what a
    # step costs beyond every priced part, per layer and per token (layer, token: the
    # bytecode between the kernels, the quantization of each matvec's output, the
    # generator's resumes); ns, from the 1- and 3-layer models' steps
    need = ["steps_%s_L%d_%s_ns" % (p, n, w) for p in ("q8", "fp32") for n in PROBE_LAYERS for w in ("pos", "base")]
    need += ["viper_call_ns", "viper_row_ns", "bytecode_call_ns", "bytecode_row_ns", "viper_mac_i8_ns", "viper_silu_ns",
             "viper_norm_ns", "viper_rope_ns", "viper_add_ns", "viper_pack_i8_ns", "bytecode_mac_f32_ns", "exp_ns", "div_ns",
             "bytecode_norm_ns", "bytecode_rope_ns", "bytecode_add_ns"]
    missing = [k for k in need if k not in pr]
    if missing:
        raise UserError("the cost probe gave no %s: is firmware_py/tools/costprobe.py this version's?" % ", ".join(missing), 1)
    s = PROBE_SHAPE
    hd = s["dim"] // s["n_heads"]
    out = {}
    for kind, path in (("viper", "q8"), ("bytecode", "fp32")):
        if kind == "viper":
            figs = {"mac_i8_mcyc": pr["viper_mac_i8_ns"], "row_mcyc": pr["viper_row_ns"], "matvec_mcyc": pr["viper_call_ns"],
                    "exp_mcyc": pr["viper_silu_ns"], "div_mcyc": 0.0, "norm_el_mcyc": pr["viper_norm_ns"],
                    "rope_el_mcyc": pr["viper_rope_ns"], "elem_mcyc": pr["viper_add_ns"],
                    "kv_wr_int8_mcyc": pr["viper_pack_i8_ns"]}
            mac = pr["viper_mac_i8_ns"]
        else:
            figs = {"mac_f32_mcyc": pr["bytecode_mac_f32_ns"], "row_mcyc": pr["bytecode_row_ns"],
                    "matvec_mcyc": pr["bytecode_call_ns"], "exp_mcyc": pr["exp_ns"], "div_mcyc": pr["div_ns"],
                    "norm_el_mcyc": pr["bytecode_norm_ns"], "rope_el_mcyc": pr["bytecode_rope_ns"],
                    "elem_mcyc": pr["bytecode_add_ns"]}
            mac = pr["bytecode_mac_f32_ns"]
        # attention per layer and cached position: least squares through 0 over the layer counts
        n1, n3 = PROBE_LAYERS
        per_layer = (n1 * pr["steps_%s_L%d_pos_ns" % (path, n1)] + n3 * pr["steps_%s_L%d_pos_ns" % (path, n3)]) / (n1 * n1 + n3 * n3)
        per_head = per_layer / s["n_heads"]
        rest = per_head - figs["exp_mcyc"] - 2 * figs["div_mcyc"]
        attn_mac = mac
        attn_pos = rest - 2 * hd * mac
        if attn_pos < 0:  # attention's products cost less than a matvec's: its own MAC, no per-position extra
            attn_mac, attn_pos = max(rest, 0.0) / (2 * hd), 0.0
        figs.update(attn_mac_mcyc=attn_mac, attn_pos_mcyc=attn_pos)
        res = {n: pr["steps_%s_L%d_base_ns" % (path, n)] - _step_ns(kind, figs, n) for n in PROBE_LAYERS}
        layer = max((res[n3] - res[n1]) / (n3 - n1), 0.0)  # a layer costs at least what is priced
        token = max(res[n1] - n1 * layer, 0.0)
        out.update({"%s_attn_mac_ns" % kind: round(attn_mac, 2), "%s_attn_pos_ns" % kind: round(attn_pos, 1),
                    "%s_layer_ns" % kind: round(layer, 1), "%s_token_ns" % kind: round(token, 1),
                    "%s_step_residual_ns" % kind: {str(n): round(res[n], 1) for n in PROBE_LAYERS}})
        # the held-out model: its step at one cached position and per further position, as
        # measured and as the cost model prices it from every figure derived here
        hx = "steps_%s_X_%%s_ns" % path
        if hx % "base" in pr:
            full = dict(figs, layer_mcyc=layer, token_mcyc=token)
            L = HOLDOUT_SHAPE["n_layers"]
            b1 = _step_ns(kind, full, L, HOLDOUT_SHAPE, 1)
            slope = (_step_ns(kind, full, L, HOLDOUT_SHAPE, 101) - b1) / 100.0
            out["%s_holdout" % kind] = {
                "shape": HOLDOUT_SHAPE, "measured_base_ns": pr[hx % "base"], "predicted_base_ns": round(b1, 1),
                "base_error": round(b1 / pr[hx % "base"] - 1, 4), "measured_pos_ns": pr[hx % "pos"],
                "predicted_pos_ns": round(slope, 1), "pos_error": round(slope / pr[hx % "pos"] - 1, 4) if pr[hx % "pos"] > 0 else None}
    out["viper_div_ns"] = 0.0
    return out


def host_probe(runs=RUNS):
    # the firmware's viper/bytecode kernels' host cost on the 32-bit unix port: the median
    # of `runs` runs of firmware_py/tools/costprobe.py, and each run; the figures of the
    # decode steps derived (derive)
    exe = mp32.build()
    env = dict(os.environ, MICROPYPATH=paths.ROOT)
    rs = []
    with tempfile.TemporaryDirectory(prefix="kvrtos-costprobe-") as tmp:
        probe_models(tmp)
        for _ in range(runs):
            r = {}
            # the kernels' figures as before (the port's default heap), then the round figures
            # and the matvec shapes with the default board's heap (the models' weights in it)
            for args in ([], ["-X", "heapsize=%d" % PROBE_HEAP, PROBE, "models=" + tmp]):
                try:
                    p = subprocess.run([exe] + (args or [PROBE]), cwd=paths.ROOT, env=env, capture_output=True, text=True,
                                       timeout=600)
                except subprocess.TimeoutExpired:
                    raise UserError("%s ran past 600 s under the 32-bit port" % os.path.basename(PROBE), 1)
                if p.returncode != 0:
                    raise UserError("%s failed under the 32-bit port: %s" % (
                        os.path.basename(PROBE), (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]), 1)
                try:
                    r.update(json.loads(p.stdout.strip().splitlines()[-1]))
                except (IndexError, ValueError):
                    raise UserError("%s printed no figures under the 32-bit port: %r" % (os.path.basename(PROBE),
                                                                                        p.stdout[-200:]), 1)
            rs.append(r)
    keys = []
    for r in rs:
        keys += [k for k in r if k not in keys]
    out = {k: statistics.median(r[k] for r in rs if k in r) for k in keys}
    out.update(derive(out))
    out.update({"runs": runs, "script": "firmware_py/tools/costprobe.py", "interpreter": "./kv mp32 (32-bit unix port)",
                "each_run": rs})
    return out


def ratio(published_us, mhz, host):
    # board cycles per host ns
    return published_us * mhz / (host * 1000.0)


def measure(rep, points=None, runs=RUNS, progress=None):
    # every point with its host time and ratio (obtainable ones), then the fit
    pts = load() if points is None else points
    mp32.build()  # the probe's interpreter, before minutes of points: a missing source tree says so now
    for name in sorted({(p["code"] or {}).get("repo") or "micropython/micropython" for p in pts if usable(p)}):
        if mirror(rep, name) is None:
            raise UserError("the points' code is in %s too: put a clone of it beside %s (as DIR/owner+name/repo, "
                            "DIR/owner+name or DIR/name)" % (name, rep), 2)
    out = []
    for p in pts:
        row = dict(p)
        if usable(p):
            binary, ref = build_for(p, rep)
            try:
                text, sha = script(p, rep)
                med, times = host_us(binary, text, runs, p["code"])
            except UserError as e:  # counted and reported: the point is left out, the run goes on
                why = " ".join(str(e).replace(binary, "the %s build" % ref).split())
                row["excluded"] = "failed on the host build of %s: %s" % (ref, why[-200:])
                if progress:
                    progress("%s: left out: %s" % (p["id"], row["excluded"]))
                out.append(row)
                continue
            row.update({"host_us": med, "host_runs_us": times, "host_build": ref, "code_sha256": sha,
                        "ratio": round(ratio(p["published_us"], p["mhz"], med), 3)})
            if progress:
                progress("%s: host %d us, board %.0f us at %d MHz: %.1f cycles per host ns" % (
                    p["id"], med, p["published_us"], p["mhz"], row["ratio"]))
        out.append(row)
    probe = host_probe(runs)
    return {"points": out, "fit": fit(out), "runs": runs, "probe": probe, "probe_runs": runs,
            "interpreter": "micropython32 (the 32-bit unix port, built from each point's tag; the probe on ./kv mp32's)"}


def fit(rows):
    # {core family: {emitter: factor (median ratio), band (lowest, highest), points,
    # leave-one-out}} over the obtainable points that were timed
    out = {}
    for fam in sorted({family(r["chip"]) for r in rows if usable(r) and "host_us" in r}):
        out[fam] = {}
        for em in WORKLOADS:
            pts = [r for r in rows if usable(r) and "host_us" in r and workload(r) == em and family(r["chip"]) == fam]
            if pts:
                out[fam][em] = fit_one(pts)
        v, c = out[fam].get("viper"), out[fam].get("viper-call")
        if v and c and v["points"] == 1 and c["factor"] < v["factor"]:
            # one viper loop point has no spread of its own: the call-overhead median (the same
            # emitter, less of the emitted code whose in-order cost the loop shows) is its fast end
            v["band"] = [c["factor"], v["band"][1]]
            v["band_note"] = "fast end: the viper-call median (a lower bound for loops); slow end: the one loop point"
    return out


def fit_one(pts):
    rs = [ratio(r["published_us"], r["mhz"], r["host_us"]) for r in pts]
    loo = []
    for i, r in enumerate(pts):
        others = rs[:i] + rs[i + 1:]
        if not others:
            continue
        f = statistics.median(others)
        pred = r["host_us"] * f * 1000.0 / r["mhz"]
        loo.append({"id": r["id"], "factor_without": round(f, 3), "predicted_us": round(pred, 1),
                    "published_us": r["published_us"], "error": round(pred / r["published_us"] - 1, 4)})
    # leave one source out: every point of one source (its URL) predicted from the others'
    # median, so that two runs of one comparison do not vouch for each other
    loso = []
    for url in sorted({r["url"] for r in pts}):
        others = [x for x, r in zip(rs, pts, strict=True) if r["url"] != url]
        if not others:
            continue
        f = statistics.median(others)
        errs = [r["host_us"] * f * 1000.0 / r["mhz"] / r["published_us"] - 1 for r in pts if r["url"] == url]
        loso.append({"source": url, "points": len(errs), "factor_without": round(f, 3),
                     "median_error": round(statistics.median(errs), 4)})
    return {"points": len(pts), "factor": round(statistics.median(rs), 3), "band": [round(min(rs), 3), round(max(rs), 3)],
            "sources": len({r["url"] for r in pts}), "loso": loso,
            "loo": loo,
            "loo_median_abs_error": round(statistics.median(abs(x["error"]) for x in loo), 4) if loo else None,
            "loo_max_abs_error": round(max(abs(x["error"]) for x in loo), 4) if loo else None}


# --- the profiles' MicroPython figures: host timings of the firmware's own kernels -------
# (firmware_py/tools/costprobe.py on the same interpreter, in the same run as the points,
# so the host's own speed cancels) times the factor of the emitter that runs them.
# (kind, parameter) -> ([(probe figure, weight, emitter)], what the probe times)
_PLAIN_MAC = "ns per fp32 MAC of kernels.Plain.matvec (the marginal cost of 192 more columns)"
_KV_TEXT = {
    "rd_fp16": "ns per K/V element over fp32's copy, kernels.Plain._vec's IEEE half decode (_half: bit fields, ldexp)",
    "rd_int8": "ns per K/V element over fp32's copy, kernels.Plain._vec's int8 sign fix and group scale multiply",
    "rd_int4tok": "ns per K/V element over fp32's copy, kernels.Plain._vec's nibble unpack, sign fix and group scale multiply",
    "rd_int4": "ns per K/V element: V's nibble unpack in kernels.Plain._vec (K read as fp32) plus half of kvkivi.dequant's "
               "per K element (viper, per-channel keys of a folded block), averaged over K and V",
    "wr_fp16": "ns per K/V element over fp32's copy, quant.pack_layer's struct '<e' pack",
    "wr_int8": "ns per K/V element over fp32's copy, quant.pack_layer's per-group max|x|, scale and round",
    "wr_int4tok": "ns per K/V element over fp32's copy, quant.pack_layer's per-group max|x|, scale, round and nibble pack",
    "wr_int4": "ns per element of quant.pack_layer (K packed as fp32, V quantized per token) plus kvkivi.fold per K "
               "element taken as 3 x kvkivi.dequant (viper; three passes over the block: not measured), averaged over K and V",
}


def _kv_terms(key):
    t = [("bytecode_%s_ns" % key, 1.0, "bytecode")]
    if key == "rd_int4":
        t.append(("viper_kivi_deq_ns", 0.5, "viper"))
    if key == "wr_int4":
        t.append(("viper_kivi_deq_ns", 1.5, "viper"))
    return t


TERMS = {
    ("viper", "mac_i8_mcyc"): ([("viper_mac_i8_ns", 1.0, "viper")], "ns per int8 MAC of kernels_q.matvec_v (@viper, 64 "
                               "rows, group 32: the marginal cost of 192 more columns, its share of the per-group scaling included)"),
    ("viper", "attn_mac_mcyc"): ([("viper_mac_i8_ns", 1.0, "viper")], "ns per int8 MAC of kernels_q.matvec_v, taken for "
                                 "the integer attention kernels (viper like matvec_v; not measured separately)"),
    ("viper", "mac_f32_mcyc"): ([("bytecode_mac_f32_ns", 1.0, "bytecode")], _PLAIN_MAC + "; the firmware has no fp32 viper matvec"),
    ("viper", "kv_wr_int8_mcyc"): ([("viper_pack_i8_ns", 1.0, "viper")], "ns per element of kernels_q.pack_v (viper: per-head "
                                   "max, scale, round to int8)"),
    ("bytecode", "mac_f32_mcyc"): ([("bytecode_mac_f32_ns", 1.0, "bytecode")], _PLAIN_MAC),
    ("bytecode", "mac_i8_mcyc"): ([("bytecode_mac_f32_ns", 1.0, "bytecode")], _PLAIN_MAC + ", taken for int8 too (the "
                                  "bytecode kernels box every product; not measured separately)"),
    ("bytecode", "attn_mac_mcyc"): ([("bytecode_mac_f32_ns", 1.0, "bytecode")], _PLAIN_MAC + ", taken for the plain "
                                    "attention loops (the same bytecode; not measured separately)"),
    ("bytecode", "exp_mcyc"): ([("exp_ns", 1.0, "bytecode")], "ns per math.exp in a bytecode loop (less the same loop without it)"),
}
# the figures that were round guesses (docs/calibration.md): host timings of the firmware's
# own code from costprobe's second run (models=; derive() for the decode steps' figures)
ROUND_TERMS = {}
_FIT = ("the %s term of the MAC figure's model (call + rows x row + MACs x MAC): %s")
_FIT_V = ("rows 64 -> 256 at 64 columns less their MACs", "calls of one row of 32 columns from a bytecode loop less its row "
          "and MACs")
_FIT_B = ("rows 16 -> 64 at 8 columns less their MACs", "calls of one row of 8 columns less its row and MACs")
_STEPS = ("decode steps of random %s models of stories260K's shape with 1 and 3 layers (%s, %d positions, the least of 3 "
          "decodes per position, medians of two windows)")
_Q8_STEPS = _STEPS % ("q8row", "qmodel.QForward.step", 96)
_FP_STEPS = _STEPS % ("fp32", "model.Model.forward, kernels.Plain", 48)
_RESID_L = ("ns per layer of %s that no other figure prices (the bytecode between the kernels%s): the 3-layer model's "
            "step at one cached position less the 1-layer one's, less what the other figures price, over 2 layers (at "
            "least 0)")
_RESID_T = "ns per token of %s that no other figure prices: the 1-layer model's step less its priced parts and one layer"
_PER_EL = "ns per element of %s (the marginal cost from a quarter of the elements to all of them)"
for _kind, _pre, _steps, _mac, _glue in (
        ("viper", "viper", _Q8_STEPS, "kernels_q.matvec_v's int8 MAC", ", the quantization of each matvec's output"),
        ("bytecode", "bytecode", _FP_STEPS, "kernels.Plain.matvec's fp32 MAC", ", the generator's resumes")):
    _f = _FIT_V if _kind == "viper" else _FIT_B
    ROUND_TERMS[(_kind, "row_mcyc")] = ([("%s_row_ns" % _pre, 1.0, _kind)], "ns per row beyond its MACs of %s: %s" % (
        "kernels_q.matvec_v" if _kind == "viper" else "kernels.Plain.matvec", _FIT % ("row", _f[0])))
    ROUND_TERMS[(_kind, "matvec_mcyc")] = ([("%s_call_ns" % _pre, 1.0, "bytecode")], "ns per call of %s from a bytecode loop: "
                                           "%s (the caller's bytecode: the bytecode factor)" % (
                                               "kernels_q.matvec_v" if _kind == "viper" else "kernels.Plain.matvec",
                                               _FIT % ("call", _f[1])))
    ROUND_TERMS[(_kind, "attn_mac_mcyc")] = ([("%s_attn_mac_ns" % _pre, 1.0, _kind)], "ns per attention product: %s, or, where "
                                       "the %s give attention less per cached position, that over its 2 x head_dim products"
                                       % (_mac, _steps))
    ROUND_TERMS[(_kind, "attn_pos_mcyc")] = ([("%s_attn_pos_ns" % _pre, 1.0, _kind)], "ns per (layer, head, cached position) of "
                                       "%s beyond its 2 x head_dim products, the exp and the divisions" % _steps)
    ROUND_TERMS[(_kind, "layer_mcyc")] = ([("%s_layer_ns" % _pre, 1.0, "bytecode")], _RESID_L % (_steps, _glue))
    ROUND_TERMS[(_kind, "token_mcyc")] = ([("%s_token_ns" % _pre, 1.0, "bytecode")], _RESID_T % _steps)
ROUND_TERMS.update({
    ("viper", "exp_mcyc"): ([("viper_silu_ns", 1.0, "viper")], _PER_EL % "kernels_q.silu_v (the sigmoid table and the "
                            "product: SiLU's exp and division together, the division priced at 0)"),
    ("viper", "div_mcyc"): ([("viper_div_ns", 1.0, "viper")], "ns: 0: the integer path divides only inside "
                            "kernels_q.silu_v (exp_mcyc carries it) and kernels_q.attend_v (attn_pos carries it)"),
    ("viper", "norm_el_mcyc"): ([("viper_norm_ns", 1.0, "viper")], _PER_EL % "kernels_q.rmsnorm_v"),
    ("viper", "rope_el_mcyc"): ([("viper_rope_ns", 1.0, "viper")], _PER_EL % "kernels_q.rope_v"),
    ("viper", "elem_mcyc"): ([("viper_add_ns", 1.0, "viper")], _PER_EL % "kernels_q.add_v (the residual add)"),
    ("viper", "sample_el_mcyc"): ([("sample_int_ns", 1.0, "bytecode")], "ns per logit of sample.Sampler.pick at "
                                  "temperature 0.8 on Q16 int logits (bytecode; the marginal cost of 384 more logits)"),
    ("bytecode", "div_mcyc"): ([("div_ns", 1.0, "bytecode")], "ns per float division in a bytecode loop (less the same "
                               "loop without it)"),
    ("bytecode", "norm_el_mcyc"): ([("bytecode_norm_ns", 1.0, "bytecode")], _PER_EL % "kernels.Plain.rmsnorm_part's "
                                   "two passes (the sum of squares, the scaled write)"),
    ("bytecode", "rope_el_mcyc"): ([("bytecode_rope_ns", 1.0, "bytecode")], _PER_EL % "kernels.Plain.rope_part"),
    ("bytecode", "elem_mcyc"): ([("bytecode_add_ns", 1.0, "bytecode")], _PER_EL % "kernels.Plain.add_part"),
    ("bytecode", "sample_el_mcyc"): ([("sample_float_ns", 1.0, "bytecode")], "ns per logit of sample.Sampler.pick at "
                                     "temperature 0.8 on float logits (bytecode; the marginal cost of 384 more logits)"),
})
del _kind, _pre, _steps, _mac, _glue, _f
TERMS.update(ROUND_TERMS)
for _k, _txt in _KV_TEXT.items():
    TERMS[("bytecode", "kv_%s_mcyc" % _k)] = (_kv_terms(_k), _txt)
    # viper's int8 KV: written by pack_v (above) and read as it is by kernels_q.attend_v (no
    # dequantization, priced by attn_mac: the profiles' 0); the other types run kernels.Plain
    if _k not in ("wr_int8", "rd_int8"):
        TERMS[("viper", "kv_%s_mcyc" % _k)] = (_kv_terms(_k), _txt + "; the integer path (qmodel) reads int8 KV "
                                               "only, so with this type attention runs kernels.Plain in bytecode")
del _k, _txt

FAMILIES = {"esp32": "xtensa", "esp32s3": "xtensa", "xtensa-lx6": "xtensa", "xtensa-lx7": "xtensa", "esp32c3": "riscv",
            "rp2040": "cortex-m0+", "rp2350": "cortex-m33", "stm32f405": "cortex-m4f"}


def family(chip_or_arch):
    # the core family a chip or profile arch belongs to ("xtensa", "cortex-m33", ...), or the name itself
    return FAMILIES.get(str(chip_or_arch).lower(), str(chip_or_arch).lower())


def figure(kind, param, probe, factors, runs):
    # {"value": millicycles, "source": ..., "derived": ...} for one TERMS entry, from the
    # host figures `probe` and factors {emitter: {"factor", "band", "points", "family", "assumed"}}
    terms, what = TERMS[(kind, param)]
    missing = sorted({e for _, _, e in terms if e not in factors})
    if missing:
        raise UserError("no %s factor for %s.%s: the record has no such points for this core or a nearest one"
                        % (", ".join(missing), kind, param), 1)
    ns = sum(w * probe[k] for k, w, _ in terms)
    cyc = sum(w * probe[k] * factors[e]["factor"] for k, w, e in terms)
    ems = []
    for _, _, e in terms:
        if e not in ems:
            ems.append(e)
    fx = "; ".join("x %.1f board cycles per host ns, the %s factor (%d published points on %s, band %.1f-%.1f%s)" % (
        factors[e]["factor"], e, factors[e]["points"], factors[e]["family"], factors[e]["band"][0], factors[e]["band"][1],
        "; assumed for this core: it has no points of its own" if factors[e]["assumed"] else "") for e in ems)
    src = ("fit: firmware_py/tools/costprobe.py on the 32-bit MicroPython unix port, median of %d runs (./kv bench "
           "boardspeed, docs/calibration.md): %.2f %s; %s; so %d cycles" % (runs, ns, what, fx, round(cyc)))
    # (the terms stay out of the profile: the firmware keeps the whole profile it loads, so
    # every byte here is a byte of the board's heap; band_costs recomputes them from TERMS)
    return {"value": int(round(cyc * 1000)), "source": src}


# a core with no published points takes the nearest one's factors, labelled assumed:
# the RP2350's Cortex-M33 runs the same Thumb-2 code as the STM32F405's Cortex-M4F
NEAREST = {"cortex-m33": "cortex-m4f"}


def profile_factors(fits, arch):
    # the factors a profile of this arch takes: its own family's where it has points, else
    # the nearest core's (NEAREST, else xtensa's), labelled assumed
    fam = family(arch)
    near = NEAREST.get(fam, "xtensa")
    out = {}
    for e in EMITTERS:
        for src in (fam, near, "xtensa"):  # its own core, the nearest one, else xtensa's (the best covered)
            use = fits.get(src, {}).get(e)
            if use and use["factor"]:
                out[e] = {"factor": use["factor"], "band": use["band"], "points": use["points"],
                          "family": src, "assumed": src != fam}
                break
    return out


def profiles():
    # the board profiles that carry MicroPython cost figures: [(path, parsed JSON)]
    import glob

    out = []
    for p in sorted(glob.glob(os.path.join(paths.BOARDS, "*.json"))):
        try:
            with open(p) as f:
                d = json.load(f)
            cost = d.get("cpu", {}).get("cost", {})
            mp = any(k in cost for k in ("viper", "bytecode"))
            if mp and not all(isinstance(cost[k], dict) for k in ("viper", "bytecode") if k in cost):
                raise ValueError("cpu.cost.viper/bytecode must be objects")
        except (OSError, ValueError, AttributeError, TypeError) as e:
            raise UserError("bad board profile %s: %s" % (os.path.relpath(p, paths.ROOT), e), 2)
        if mp:
            out.append((p, d))
    return out


def write_profiles(record):
    # rewrite every TERMS figure of every MicroPython profile from a measure() record
    # ({"probe": host figures, "fit": ..., "probe_runs": n}); the files written
    # a figure measured on a board (./kv calibrate: "measured: ...") is kept, and listed;
    # every profile is computed before any is written, so a bad one leaves them all as they were
    todo, kept = [], []
    for p, d in profiles():
        fx = profile_factors(record["fit"], d["cpu"].get("arch", ""))
        cost = d["cpu"]["cost"]
        for (kind, param) in TERMS:
            if kind in cost and param in cost[kind]:
                cur = cost[kind][param]
                if isinstance(cur, dict) and str(cur.get("source", "")).startswith("measured:"):
                    kept.append("%s %s.%s" % (os.path.basename(p), kind, param))
                    continue
                cost[kind][param] = figure(kind, param, record["probe"], fx, record["probe_runs"])
        text = json.dumps(d, indent=2) + "\n"
        with open(p) as f:
            if f.read() != text:
                todo.append((p, text))
    fit = json.dumps({"fit": record["fit"], "probe": {k: v for k, v in record["probe"].items() if k != "each_run"},
                      "probe_runs": record["probe_runs"],
                      "from": "docs/bench/boardspeed.json (./kv bench-docs --only boardspeed); ./kv boardspeed --write"},
                     indent=1, sort_keys=True) + "\n"
    try:
        with open(FIT) as f:
            if f.read() != fit:
                todo.append((FIT, fit))
    except OSError:
        todo.append((FIT, fit))
    for p, text in todo:
        with open(p + ".tmp", "w") as f:
            f.write(text)
        os.replace(p + ".tmp", p)
    return [p for p, _ in todo], kept


RECORD = os.path.join(paths.ROOT, "docs", "bench", "boardspeed.json")  # the whole measurement (a checkout's)
FIT = os.path.join(paths.BOARDS, "speed", "fit.json")  # what the commands read at run time (installed too)


def factors(path=FIT):
    # the run-time figures ({"fit", "probe", "probe_runs"}: boards/speed/fit.json, written
    # with the profiles by `./kv boardspeed --write`), checked as committed() checks them
    return committed(path)


def committed(path=RECORD):
    # the committed measurement (docs/bench/boardspeed.json's figures), or UserError
    try:
        with open(path) as f:
            rec = json.load(f)
        rec = rec["figures"] if "figures" in rec else rec
        ok = isinstance(rec["fit"], dict) and rec["fit"] and isinstance(rec["probe"], dict) and rec["probe_runs"] >= 1
        for fam in rec["fit"].values():
            for f in fam.values():
                ok = ok and isinstance(f["factor"], (int, float)) and f["factor"] > 0 and len(f["band"]) == 2 \
                    and all(isinstance(x, (int, float)) and x > 0 for x in f["band"]) and isinstance(f["points"], int)
        for (_, _), (terms, _) in TERMS.items():
            for k, _, _ in terms:
                ok = ok and isinstance(rec["probe"][k], (int, float))
        if not ok:
            raise ValueError("a factor, band or probe figure is missing or not a number")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError("%s: no usable board-speed record (%s); ./kv bench-docs --only boardspeed makes it" % (path, e), 2)
    return rec


def fit_table(fit, factor_head="factor", one_point="n/a"):
    # markdown lines: the factor per core family and emitter, its band and leave-one-out errors
    L = ["| core | emitter | points | %s | band | leave-one-out median error | worst |" % factor_head,
         "| --- | --- | --- | --- | --- | --- | --- |"]
    for fam in sorted(fit):
        for em, f in sorted(fit[fam].items()):
            L.append("| %s | %s | %d | %.1f | %.1f-%.1f | %s | %s |" % (
                fam, em, f["points"], f["factor"], f["band"][0], f["band"][1],
                "%.0f %%" % (100 * f["loo_median_abs_error"]) if f["loo_median_abs_error"] is not None else one_point,
                "%.0f %%" % (100 * f["loo_max_abs_error"]) if f["loo_max_abs_error"] is not None else "n/a"))
    return L


def show(rec, as_json=False):
    # the factors, one line per core family and emitter
    if as_json:
        print(json.dumps(rec["fit"], sort_keys=True))
        return
    for fam in sorted(rec["fit"]):
        for em, f in sorted(rec["fit"][fam].items()):
            print("%-11s %-10s factor %5.1f board cycles per host ns, band %.1f-%.1f over %d point%s%s" % (
                fam, em, f["factor"], f["band"][0], f["band"][1], f["points"], "" if f["points"] == 1 else "s",
                ", leave-one-out median error %.0f %%" % (100 * f["loo_median_abs_error"]) if f["loo_median_abs_error"] is not None else ""))


def band_costs(brd, kind, end, record=None):
    # {parameter: millicycles} of a loaded profile's MicroPython kind at one end of the band
    # ("slow": each emitter's highest point, "fast": its lowest): a figure derived from
    # host timings is recomputed with that end's factor of each of its emitters; a figure
    # that is not (a per-call or per-layer estimate) scales by the kind's own emitter's
    # end over its factor; cores, split and zero figures stay
    if end not in ("slow", "fast"):
        raise UserError("speed must be fit, slow or fast, not %r" % end, 2)
    rec = record or factors()
    fx = profile_factors(rec["fit"], brd.cpu_arch)
    i = 1 if end == "slow" else 0
    own = fx.get(kind if kind in EMITTERS else "bytecode") or fx.get("bytecode")
    out = {}
    for p, v in brd.cpu_cost[kind].items():
        if p in ("cores", "split_permille") or not v:
            out[p] = v
        elif (kind, p) in TERMS and brd.cpu_cost_source[kind][p].startswith("fit:"):  # a host timing x factor: recomputed
            out[p] = int(round(1000 * sum(w * rec["probe"][k] * fx[e]["band"][i] for k, w, e in TERMS[(kind, p)][0])))
        else:
            out[p] = int(round(v * own["band"][i] / own["factor"]))
    return out
