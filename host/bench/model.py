# `./kv bench model [--json]`: decoding stories260K, one run. The integer forward pass
# (firmware_py/qmodel.QForward: viper kernels, int8 weights converted to q8row, int8 KV,
# full policy) on the MicroPython unix port with the default board's heap, through
# host/bench/_model_mp.py: time to first token (the 5-token prompt "Once upon a time"
# prefilled, then the first token), decode tokens/s over 200 greedy tokens (argmax by
# a viper kernel included), heap bytes allocated per token (gc off, gc.mem_alloc
# before and after), the same decode heap-locked, the bytes one forward() generator
# object costs, and the peak heap (live bytes after loading and decoding). CPython's
# figures come from the numpy backend (firmware_py/model.py) when it is there.
# --c-ref PATH (or $KVRTOS_C_REF): a C decoder of the user's, llama2.c's run.c built with
# -O3, timed in the same run on the same checkpoint (fp32: run.c's own format; the
# MicroPython run decodes its int8 conversion), prompt and positions (greedy): its own
# "achieved tok/s" line, the median of C_REF_RUNS runs; the MicroPython decode's share of
# it is then a measured ratio. Without one the page says the share of C was not measured.
import contextlib
import io
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from host import boards, convert, interp, paths
from host.errors import UserError

PROMPT = "Once upon a time"
PROMPT_IDS = (1, 403, 407, 261, 378)  # BOS + "Once upon a time" in tok512.bin
DECODE = 200  # tokens decoded after the prompt
C_REF_ENV = "KVRTOS_C_REF"  # the default --c-ref: a C decoder (llama2.c's run.c built with -O3)
C_REF_RUNS = 11  # run.c times itself to the ms over a run of tens of ms: the median of many
C_REF_S = 60  # s one run of the C decoder may take
_ACHIEVED = re.compile(r"achieved tok/s:\s*([0-9]+(?:\.[0-9]*)?)")


def _model():
    d = paths.shared_models()
    p = d and os.path.join(d, "stories260K.bin")
    if not p or not os.path.exists(p):
        raise UserError("stories260K.bin is not in ../shared/models (docs/models.md says where to get it)", 2)
    return p


def micro_figures(q8):
    # the MicroPython run of host/bench/_model_mp.py bench; its JSON
    r = interp.run(os.path.join(paths.ROOT, "host", "bench", "_model_mp.py"), "micropython",
                   args=["bench", q8, str(DECODE)] + [str(i) for i in PROMPT_IDS])
    if r.returncode != 0:
        raise UserError("model bench failed under micropython: %s" % (r.stderr or r.stdout).strip().splitlines()[-1:], 1)
    return json.loads(r.stdout.strip().splitlines()[-1])


def cpython_figures(fp32):
    # numpy backend of firmware_py/model.py (engineer H's) on the fp32 model, or None
    try:
        from firmware_py import kv, llama2c, model, pool
    except ImportError:
        return None
    try:
        w = llama2c.load(fp32)
        cfg = w.cfg
        lay = kv.Layout(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, "fp32")
        nb = (cfg.seq_len + 15) // 16
        p = pool.Pool(lay.block_bytes, nb)
        c = kv.KVCache(p, lay, max_seqs=1)
        h = c.open(p.add_region(nb), "full", cfg.seq_len)
        m = model.Model(w, c, backend="numpy")
        np = __import__("numpy")
        t0 = time.perf_counter()
        tok = PROMPT_IDS[0]
        for pos in range(len(PROMPT_IDS)):
            for _ in m.forward(h, tok, pos):
                pass
            tok = PROMPT_IDS[pos + 1] if pos + 1 < len(PROMPT_IDS) else int(np.argmax(m.logits))
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(DECODE):
            for _ in m.forward(h, tok, len(PROMPT_IDS) + i):
                pass
            tok = int(np.argmax(m.logits))
        dt = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - the other engineer's backend may be mid-change
        return {"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
    return {"decode_tok_s": round(DECODE / dt, 1), "ttft_ms": round(ttft * 1000, 2)}


def c_ref_path(given=None):
    # the C decoder to time (--c-ref, else $KVRTOS_C_REF, empty: unset), checked; None when
    # neither is given. Messages name where the path came from
    flag = "--c-ref"
    path = given
    if path is None:
        path = os.environ.get(C_REF_ENV) or None
        flag = "$" + C_REF_ENV
    if path is None:
        return None
    if path == "":
        raise UserError("--c-ref needs a value: the path of a C decoder (llama2.c's run.c built with -O3)", 2)
    path = paths.user_path(path)
    if not os.path.exists(path):
        raise UserError("%s: no file %s (build llama2.c's run.c: gcc -O3 -o run run.c -lm)" % (flag, path), 2)
    try:
        paths.regular_file(path, "C decoder")
    except UserError as e:
        raise UserError("%s: %s" % (flag, e), 2) from None
    if not os.access(path, os.X_OK):
        raise UserError("%s: %s is not executable (build llama2.c's run.c: gcc -O3 -o run run.c -lm)" % (flag, path), 2)
    return path


def _run_c(cmd, path):
    # one run of the C decoder in its own process group (a timeout ends all of it); its output
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        raise UserError("--c-ref: %s does not run: %s" % (path, e.strerror or e), 2) from None
    try:
        out, err = p.communicate(timeout=C_REF_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise UserError("--c-ref: %s ran past %d s on stories260K (llama2.c's run.c takes well under a second)" % (
            path, C_REF_S), 1) from None
    return p.returncode, (out + err).decode("utf-8", "replace")


def c_ref_figures(path, model, tok):
    # {"decode_tok_s", "runs_tok_s", "command"}: llama2.c's run.c on the fp32 checkpoint,
    # the prompt and the positions of the MicroPython run (greedy: -t 0), its "achieved
    # tok/s" line, the median of C_REF_RUNS runs
    steps = len(PROMPT_IDS) + DECODE
    cmd = [path, model, "-z", tok, "-t", "0", "-n", str(steps), "-i", PROMPT]
    print("bench model: timing the C decoder %s (%d runs) ..." % (os.path.basename(path), C_REF_RUNS), file=sys.stderr)
    runs = []
    for _ in range(C_REF_RUNS):
        rc, out = _run_c(cmd, path)
        last = [x for x in out.strip().splitlines() if x.strip()][-1:] or [""]
        if rc != 0:
            raise UserError("--c-ref: %s exited %d: %s" % (path, rc, last[0][:200] or "no output"), 1)
        m = _ACHIEVED.search(out)
        if not m or float(m.group(1)) <= 0:
            raise UserError("--c-ref: %s printed no 'achieved tok/s: N' figure (is it llama2.c's run.c?): %s" % (
                path, last[0][:200] or "no output"), 1)
        runs.append(float(m.group(1)))
    return {"decode_tok_s": round(statistics.median(runs), 1), "runs_tok_s": runs,
            "command": "%s stories260K.bin -z tok512.bin -t 0 -n %d -i %r" % (os.path.basename(path), steps, PROMPT)}


def run(as_json=False, c_ref=None):
    # every figure in one run; prints one JSON object with as_json
    cref = c_ref_path(c_ref)
    fp32 = _model()
    with tempfile.TemporaryDirectory() as d:
        q8 = os.path.join(d, "stories260K_q8row.bin")
        with contextlib.redirect_stdout(io.StringIO()):
            convert.convert(fp32, q8, "q8row")
        mp = micro_figures(q8)
    cp = cpython_figures(fp32)
    r = {
        "model": "stories260K, q8row (int8 weights, groups 64/43), int8 KV, full policy, greedy",
        "prompt_tokens": mp["prompt_tokens"],
        "decode_tokens": mp["decode_tokens"],
        "micropython_heap_bytes": boards.load(paths.DEFAULT_BOARD).mpy_heap,
        "decode_tok_s_micropython": mp["decode_tok_s"],
        "ttft_ms_micropython": mp["ttft_ms"],
        "alloc_bytes_per_token_micropython": mp["alloc_bytes_per_token"],
        "heap_locked_tokens_micropython": mp["heap_locked_tokens"],
        "forward_generator_bytes_micropython": mp["forward_generator_bytes"],
        "peak_heap_bytes_micropython": mp["peak_heap_bytes"],
        "weights_bytes_micropython": mp["weights_bytes"],
        "kv_pool_bytes_micropython": mp["kv_pool_bytes"],
    }
    if cref:
        c = c_ref_figures(cref, fp32, os.path.join(os.path.dirname(fp32), "tok512.bin"))
        r["decode_tok_s_c_ref"] = c["decode_tok_s"]
        r["c_ref_runs_tok_s"] = c["runs_tok_s"]
        r["c_ref_command"] = c["command"] + (" (median of %d runs, its own achieved tok/s over all %d positions, timed "
                                             "to the ms; the fp32 checkpoint, where the MicroPython figure is its int8 "
                                             "conversion on the integer path)" % (C_REF_RUNS, len(PROMPT_IDS) + DECODE))
        r["decode_micropython_over_c_ref"] = round(mp["decode_tok_s"] / c["decode_tok_s"], 3)
    else:
        r["c_ref_note"] = ("the share of C was not measured: ./kv bench model --c-ref PATH (or $%s) times a C decoder "
                           "of yours, llama2.c's run.c built with -O3, in the same run" % C_REF_ENV)
    if cp and "error" not in cp:
        r["decode_tok_s_cpython"] = cp["decode_tok_s"]
        r["ttft_ms_cpython"] = cp["ttft_ms"]
    else:
        r["cpython_note"] = "numpy backend not measured: %s" % (cp["error"] if cp else "firmware_py/model.py is absent")
    if as_json:
        print(json.dumps(r, sort_keys=True))
    else:
        for k in sorted(r):
            print("%s: %s" % (k, r[k]))
    return r
