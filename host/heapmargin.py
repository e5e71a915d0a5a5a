# `./kv heapmargin [--write] [--json]`: measure the heap a decoding firmware needs free
# after its boot (firmware_py/heapmargin.py's table). For each interpreter (the 64-bit
# unix port, the 32-bit one: the ESP32-S3's word), each path (the integer one: int8
# weights and KV; the float one: fp32) and each part (decode alone; + the telemetry task
# through serve; + a shipped config's tasks), firmware_py/tools/heapprobe.py boots the
# firmware with the board's heap, leaves `leave` bytes free in one piece and runs the
# part; `leave` is bisected to LEAVE_STEP bytes, one process per try. Draws: greedy and
# temperature 0.8 sampling; layouts: heapprobe's pad=P (PADS), P bytes held from before
# the imports, which moves the heap's holes as a longer model path or another prompt does
# (the least `leave` of the 64-bit integer decode moved between 5,248 and 6,400 B over 32
# pads; the 32-bit one not at all). A part's figure is its least `leave` over the part
# before it (decode: over nothing), the most over the draws and layouts plus LAYOUT_GUARD
# (for a layout not tried), with the spread (most - least).
import concurrent.futures
import datetime
import json
import os
import re

from firmware_py.heapmargin import CONTEXTS
from host import boards, mp32, paths
from host import interp as interp_mod
from host.errors import UserError

PROBE = os.path.join(paths.FIRMWARE, "tools", "heapprobe.py")
OUT = os.path.join(paths.FIRMWARE, "heapmargin.py")
BOARD = "esp32s3_n4r2"  # the board whose heap the probe boots with (the smaller: faster, the same code)
CONFIG = os.path.join(paths.SCENARIOS, "voice-assistant.json")  # the tasks of part "tasks"
LEAVE_MAX = 131072  # bisection range of `leave` (B)
LEAVE_STEP = 256  # ... resolution
DRAWS = ((0.0, 1), (0.8, 7))  # (temperature, seed)
PADS = tuple(range(0, 1024, 128))  # the layouts (heapprobe pad=, B) of the integer path; the float one's: PLAIN_PADS
PLAIN_PADS = PADS[:2]
LAYOUT_GUARD = 512  # B added to the most measured, for the layouts not tried
PARTS = ("decode", "telemetry", "tasks")
# The float path allocates a float per operation: with only its live need free, every few
# KB of garbage is a collection of the whole heap and one token took 18 s on the unix
# port (plain, 2 MB). Its probes are that slow, so the float path measures its decode
# alone, greedy, one new token after the prompt, in a range of PLAIN_LEAVE_MAX; the
# telemetry's and the tasks' parts are the integer path's (they allocate the same
# whatever path the decode runs). The gc part is a chosen headroom, not measured
# (firmware_py/heapmargin.py GC_HEADROOM)
PLAIN_LEAVE_MAX = 32768
PLAIN_STEP = 512
_LINE = re.compile(r"heapprobe: part=(\w+) leave=(\d+) ok=(\d)")


def _models(tmp):
    from host.bench import budget as bb  # noqa: PLC0415 - stories260K or its shape, and its int8 conversion

    return {"plain": bb.model_path(tmp, "fp32")[:2], "q8": bb.model_path(tmp, "int8")[:2]}


def _ok(interp, word, path, part, model, tok, leave, temp, seed, pad):
    r = interp_mod.run(PROBE, interp, heapsize=boards.unix_heapsize(boards.load(BOARD).mpy_heap, word), args=[
        "part=" + part, "model=" + model, "tokenizer=" + tok, "kv_dtype=" + ("int8" if path == "q8" else "fp32"),
        "leave=%d" % leave, "temperature=%s" % temp, "seed=%d" % seed, "pad=%d" % pad, "tokens=%d" % (24 if path == "q8" else 1),
        "board=" + os.path.join(paths.BOARDS, BOARD + ".json"), "config=" + CONFIG], timeout=600)
    m = _LINE.search(r.stdout)
    if "why=ballast" in r.stdout:
        raise UserError("heapprobe (%s, %s, %s, leave %d): %s" % (interp, path, part, leave, r.stdout.strip()[-300:]), 1)
    if not m:
        raise UserError("heapprobe (%s, %s, %s, leave %d) failed: %s" % (interp, path, part, leave, (r.stdout + r.stderr).strip()[-300:]), 1)
    return m.group(3) == "1"


def _least(args):
    # the least `leave` (to LEAVE_STEP) with which the part runs
    def ok(leave):
        return _ok(*args[:6], leave, *args[6:])
    plain = args[2] == "plain"
    lo, hi = 0, PLAIN_LEAVE_MAX if plain else LEAVE_MAX  # lo fails (or is 0), hi runs
    step = PLAIN_STEP if plain else LEAVE_STEP
    if not ok(hi):
        raise UserError("heapprobe: %s %s %s does not run with %d B free" % (args[0], args[2], args[3], hi), 1)
    if ok(0):
        return 0
    while hi - lo > step:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


KVPROBE = os.path.join(paths.FIRMWARE, "tools", "kvprobe.py")
_BOOT = re.compile(r"kvprobe: boot blocks=(\d+) free=(\d+) largest=(\d+) margin=(\d+) model_bytes=(\d+) tokens=\d+ "
                   r"status=(\w+) decoded=\d+ limit=\S+ free0=(\d+) plan=(\d+) weights=(\d+)")
FOOT_BOARDS = ("esp32s3_n4r2", "esp32s3_n8r8")  # the heaps the footprint is measured at


def _boot(interp, word, path, model, tok, board):
    # one kvprobe size=boot on the board's heap: {"residual", "holes", "model_extra"} (B)
    heap = boards.load(board).mpy_heap
    kvd = "int8" if path == "q8" else "fp32"
    r = interp_mod.run(KVPROBE, interp, heapsize=boards.unix_heapsize(heap, word), args=[
        "board=" + os.path.join(paths.BOARDS, board + ".json"), "model=" + model, "tokenizer=" + tok,
        "kv_dtype=" + kvd, "size=boot"], timeout=600)
    return _boot_figures(r.stdout + r.stderr, heap, interp, word, path, board, model, "kvprobe size=boot")


def _boot_figures(out, heap, interp, word, path, where, model, probe):
    # {"residual", "holes", "model_extra", "blocks", ...} from a probe's "kvprobe: boot" line
    from firmware_py import decode, kv, llama2c  # noqa: PLC0415
    from firmware_py import model as fw_model  # noqa: PLC0415

    kvd = "int8" if path == "q8" else "fp32"
    m = _BOOT.search(out)
    if not m:
        raise UserError("%s (%s, %s, %s) failed: %s" % (probe, interp, path, where, out.strip()[-300:]), 1)
    blocks, free, largest, margin, model_bytes, status, free0, plan, weights = m.groups()
    if status != "FULL":
        raise UserError("%s (%s, %s, %s): the boot-sized pool did not fill (%s)" % (probe, interp, path, where, status), 1)
    cfg = llama2c.plan(model)[0]
    lay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, kvd)
    q8 = path == "q8"
    shapes = fw_model.run_state_fixed_bytes(cfg, lay.layer_row, q8, word) + int(plan) * (
        lay.tokens_per_block * fw_model.run_state_slot_bytes(cfg, q8) + fw_model.run_state_block_bytes(q8))
    return {"residual": heap - int(free0) - int(weights), "holes": int(free) - int(largest),
            "model_extra": int(model_bytes) - shapes, "blocks": int(blocks), "decode_token_bytes": decode.TOKEN_BYTES}


SERVEPROBE = os.path.join(paths.FIRMWARE, "tools", "serveprobe.py")
SERVEFILL = os.path.join(paths.FIRMWARE, "tools", "servefill.py")  # its second half, imported after the boot
MARCH = {8: "x64", 4: "x86"}  # mpy-cross -march of the 64- and 32-bit unix ports (this host)
# the contexts measured by a board's own boot (firmware_py/tools/serveprobe.py: its files
# in one folder, its .mpy modules, main.py's boot report, serve.main), and the config
# whose tasks each spawns (None: no kvrtos.json)
SERVE_CONTEXTS = {"serve": None, "serve+tasks": CONFIG}
VIAS = ("main", "repl")  # serveprobe's ways into serve: main.py's app.main, monitor --start's raw REPL


def _serve_boot(interp, word, path, model, tok, board, context):
    # one serve boot as a flashed board does it, on the board's heap: {"residual", "holes",
    # "model_extra"} (B), as _boot's
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from host import flash, link  # noqa: PLC0415

    brd = boards.load(board)
    heap = brd.mpy_heap
    with tempfile.TemporaryDirectory() as d:
        for a in flash.build(brd, march=MARCH[word]):
            dest = os.path.join(d, *a.dest.split("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(a.data)
        shutil.copyfile(model, os.path.join(d, "model.bin"))
        shutil.copyfile(tok, os.path.join(d, "tokenizer.bin"))
        if SERVE_CONTEXTS[context]:  # the config's tasks (its decode section is the probe's: one request)
            with open(SERVE_CONTEXTS[context]) as f:
                app = json.load(f)
            cfg = {k: app[k] for k in ("name", "tasks", "dma") if k in app}
            with open(os.path.join(d, "kvrtos.json"), "w") as f:
                json.dump(cfg, f)
        # no config: serve's KV is "auto", int8 for the int8 model (the integer path), fp32 for fp32
        exe = mp32.build() if word == 4 else paths.tool("micropython")
        shutil.copyfile(SERVEPROBE, os.path.join(d, "serveprobe.py"))
        shutil.copyfile(SERVEFILL, os.path.join(d, "servefill.py"))
        with open(os.path.join(d, "repl.txt"), "w") as f:  # what ./kv monitor --start asks before it starts serve
            f.write(link.HASH_SCRIPT % (["firmware_py/serve.mpy", "firmware_py/telemetry.mpy"],))
        figs = []
        for via in VIAS:
            where = "%s %s via %s" % (board, context, via)
            try:
                r = subprocess.run([exe, "-X", "heapsize=%d" % boards.unix_heapsize(heap, word), "serveprobe.py", "via=" + via],
                                   cwd=d, env=dict(os.environ, MICROPYPATH=d), capture_output=True, timeout=600,
                                   stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                raise UserError("serveprobe (%s, %s, %s) ran past 600 s" % (interp, path, where), 1) from None
            figs.append(_boot_figures((r.stdout + r.stderr).decode("latin-1"), heap, interp, word, path, where, model,
                                      "serveprobe"))
    # the board's two ways into serve: each figure the larger (the fewer blocks)
    return {k: max(f[k] for f in figs) if k != "blocks" else min(f[k] for f in figs) for k in figs[0]}


def measure(workers=2):
    import tempfile  # noqa: PLC0415

    interps = [("micropython", 8)]
    try:
        mp32.build()
        interps.append(("micropython32", 4))
    except UserError as e:
        raise UserError("heapmargin: the 32-bit build is needed (%s)" % e, 1)
    with tempfile.TemporaryDirectory() as tmp:
        models = _models(tmp)
        jobs = {}
        with concurrent.futures.ThreadPoolExecutor(workers) as ex:
            for interp, word in interps:
                for path in ("plain", "q8"):  # the slow ones first
                    model, tok = models[path]
                    for part in (PARTS if path == "q8" else ("decode",)):
                        for temp, seed in (DRAWS if path == "q8" else DRAWS[:1]):
                            for pad in (PADS if path == "q8" else PLAIN_PADS):
                                jobs[(word, path, part, temp, pad)] = ex.submit(
                                    _least, (interp, word, path, part, model, tok, temp, seed, pad))
            boots = {}
            for interp, word in interps:
                for path in ("q8", "plain"):
                    model, tok = models[path]
                    for board in FOOT_BOARDS:
                        boots[(word, path, board, "decode")] = ex.submit(_boot, interp, word, path, model, tok, board)
                        for ctx in SERVE_CONTEXTS:
                            boots[(word, path, board, ctx)] = ex.submit(_serve_boot, interp, word, path, model, tok, board, ctx)
            least = {k: f.result() for k, f in jobs.items()}
            boots = {k: f.result() for k, f in boots.items()}
    table = {}
    foot = {}
    for _, word in interps:
        for path in ("q8", "plain"):
            row = {}
            for i, part in enumerate(PARTS):
                vals = []
                src = path if (word, path, part, DRAWS[0][0], 0) in least else "q8"  # plain: telemetry, tasks as q8's
                for temp, _ in DRAWS:
                    for pad in PADS:
                        if (word, src, part, temp, pad) not in least:
                            continue
                        v = least[(word, src, part, temp, pad)]
                        if i:  # over the part before it, in the same layout
                            v -= least[(word, src, PARTS[i - 1], temp, pad)]
                        vals.append(v if v > 0 else 0)
                row[part] = (max(vals) + LAYOUT_GUARD, max(vals) - min(vals))
            table["%d,%s" % (word, path)] = row
            fp = {}
            for ctx in CONTEXTS:
                fp[ctx] = {}
                for f in ("residual", "holes", "model_extra"):
                    vals = [boots[(word, path, b, ctx)][f] for b in FOOT_BOARDS]
                    fp[ctx][f] = (max(vals), max(vals) - min(vals))
            foot["%d,%s" % (word, path)] = fp
    return {"footprint": foot, "boots": {"%d,%s,%s,%s" % k: v for k, v in sorted(boots.items())}, "board": BOARD, "draws": [list(d) for d in DRAWS], "leave_step": LEAVE_STEP, "pads": list(PADS),
        "layout_guard": LAYOUT_GUARD, "least": {"%d,%s,%s,%s,%d" % k: v for k, v in sorted(least.items())}, "table": table,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


def write(r, path=OUT):
    # rewrite the TABLE and SOURCE lines of firmware_py/heapmargin.py from r
    with open(path) as f:
        text = f.read()
    text = _sub_table(text, "TABLE", r["table"], _items)
    text = _sub_table(text, "FOOTPRINT", r["footprint"], lambda row: ", ".join('"%s": {%s}' % (c, _items(v)) for c, v in row.items()))
    src = ('SOURCE = "./kv heapmargin --write on %s (%s heap, draws %s, %d layouts; the float path: its decode greedy, '
           '%d layouts, the other parts the integer path\'s; + %d B for the layouts not tried)"  # the command and date of the figures\n') % (
        r["date"], r["board"], ", ".join("t=%s" % d[0] for d in r["draws"]), len(PADS), len(PLAIN_PADS), r["layout_guard"])
    text = re.sub(r"SOURCE = .*\n", lambda m: src, text)
    with open(path, "w") as f:
        f.write(text)


def _items(row):
    # '"key": (most, spread), ...' of {key: (most, spread)}
    return ", ".join('"%s": (%d, %d)' % (k, v[0], v[1]) for k, v in row.items())


def _sub_table(text, name, figures, row_fmt):
    # text with its `NAME = {...}` dict rewritten from figures {"W,PATH": row}, each row
    # written by row_fmt(row)
    rows = []
    for key in ("4,q8", "4,plain", "8,q8", "8,plain"):
        w, p = key.split(",")
        rows.append('    (%s, "%s"): {%s},' % (w, p, row_fmt(figures[key])))
    table = name + " = {\n" + "\n".join(rows) + "\n}\n"
    return re.sub(name + r" = \{\n.*?\n\}\n", lambda m: table, text, flags=re.S)


def run(write_table=False, as_json=False, workers=2):
    r = measure(workers)
    if write_table:
        write(r)
    if as_json:
        print(json.dumps(r, indent=1, sort_keys=True))
    else:
        for key, rows in r["footprint"].items():
            for ctx, row in rows.items():
                print("heapmargin %s boot (%s): %s" % (key, ctx, ", ".join("%s %d B (spread %d)" % (k, v[0], v[1]) for k, v in row.items())))
        for key, row in r["table"].items():
            print("heapmargin %s: %s" % (key, ", ".join("%s %d B (spread %d)" % (k, v[0], v[1]) for k, v in row.items())))
        if write_table:
            print("heapmargin: wrote %s" % os.path.relpath(OUT, paths.ROOT))
    return r


if __name__ == "__main__":
    import sys

    run("--write" in sys.argv, "--json" in sys.argv)
