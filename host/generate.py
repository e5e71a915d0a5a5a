# `./kv generate`: decode text from a llama2.c model as a kernel task, on CPython (this
# process, numpy or plain kernels) or on the MicroPython unix port with the default
# board's heap (firmware_py/tools/generate.py, output streamed as it comes). Both run
# firmware_py/decode.py: the same boot, budget rule, model and sampler as the board.
# Inputs are checked here first, so a mistake is one line and exit status 2 whatever
# the runtime.
import os
import subprocess
import sys

from firmware_py import decode, kv, llama2c, sample, tokenizer
from firmware_py import model as fw_model
from host import boardmodel, boards, interp, options, paths
from host.errors import UserError

TINY = os.path.join(paths.MODELS, "kvrtos-tiny")  # the committed default model
RUNTIMES = ("cpython", "micropython", "board")
ENTRY = os.path.join("firmware_py", "tools", "generate.py")  # the board-side entry (unix port)


# (model path, tokenizer path) for what the user typed: host/boardmodel.resolve
resolve = boardmodel.resolve


# refuse a --prompt that is not UTF-8 (the shell passes bytes; Python keeps the ones
# that do not decode as surrogates, which the tokenizer cannot encode): exit 2
def _check_text(prompt):
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        at = len(prompt[: e.start].encode("utf-8", "surrogateescape"))  # offset in the bytes typed
        c = ord(prompt[e.start])
        what = "byte 0x%02x" % (c - 0xDC00) if 0xDC80 <= c <= 0xDCFF else "U+%04X" % c
        raise UserError("--prompt is not UTF-8 text (%s at byte %d); give the prompt as UTF-8" % (what, at), 2) from None


# check everything, then generate on the chosen runtime; the Session (cpython) or None
def main(model="", prompt="", tokens="64", tokenizer_path="", temperature="0", top_p="1", seed="0", kv_dtype="auto",
         policy="full", window="0", backend="auto", runtime="cpython", rope="absolute", out=None, port=None):
    if runtime not in RUNTIMES:
        raise UserError("--runtime must be one of %s, got %r" % (", ".join(RUNTIMES), runtime), 2)
    n = options.whole(tokens, "--tokens", 1, options.TOKENS_MAX)
    t = options.number(temperature, "--temperature", 0.0, sample.TEMPERATURE_MAX)
    p = options.number(top_p, "--top-p", 0.0, 1.0, open_lo=True)
    s = options.whole(seed, "--seed", 0, sample.SEED_MAX)
    w = options.whole(window, "--window", 0, options.WINDOW_MAX)
    if kv_dtype not in kv.DTYPES and kv_dtype != "auto":  # auto: int8 beside int8 weights, else fp32
        raise UserError("--kv-dtype must be one of %s or auto, got %r" % (", ".join(kv.DTYPES), kv_dtype), 2)
    if policy not in kv.POLICIES:
        raise UserError("--policy must be one of %s, got %r" % (", ".join(kv.POLICIES), policy), 2)
    if backend not in fw_model.BACKENDS:
        raise UserError("--backend must be one of %s, got %r" % (", ".join(fw_model.BACKENDS), backend), 2)
    if rope not in fw_model.ROPE_MODES:
        raise UserError("--rope must be one of %s, got %r" % (", ".join(fw_model.ROPE_MODES), rope), 2)
    if port and runtime != "board":
        raise UserError("--port applies to --runtime board, not %s" % runtime, 2)
    if backend == "q8" and kv_dtype not in ("int8", "auto"):
        raise UserError("--backend q8 reads int8 KV rows, not %s: add --kv-dtype int8" % kv_dtype, 2)
    _check_text(prompt)
    mp, tp = resolve(model, tokenizer_path)
    try:
        cfg, lay = llama2c.plan(mp)[:2]
        tokenizer.load(tp, cfg.vocab_size)
    except (llama2c.CheckpointError, tokenizer.TokenizerError) as e:
        raise UserError(str(e), 2)
    boardmodel.check_weights(mp, lay)
    if policy != "full" and w > cfg.seq_len:
        raise UserError("--window %d is more than the model's context: it must be at most seq_len %d" % (w, cfg.seq_len), 2)
    if runtime == "board" and backend == "numpy":
        raise UserError("--backend numpy needs CPython: the board runs plain, q8 or auto", 2)
    if backend == "numpy" and runtime == "micropython":
        raise UserError("--backend numpy needs CPython: use --runtime cpython, or plain/q8/auto on micropython", 2)
    opts = {"kv_dtype": kv_dtype, "policy": policy, "window": w, "backend": backend, "rope": rope,
            "temperature": t, "top_p": p, "seed": s}
    if runtime == "board":
        from host import boardrun  # noqa: PLC0415 - the serial side, only for this runtime

        boardrun.run(port, mp, tp, prompt, n, opts, out)
        return None
    heap = boards.load(paths.DEFAULT_BOARD).mpy_heap
    if runtime == "cpython":
        import numpy as np  # noqa: PLC0415 - the CPython kernels' own

        try:
            # the kernels' numpy floats may overflow in an exp or a product where the board's
            # do too (to inf, a softmax's 0): what the decode makes of it is the answer, not a warning
            with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
                return decode.run(mp, tp, prompt, n, heap=heap, **opts)
        except decode.DecodeError as e:
            raise UserError(str(e), 2)
    args = ["--model", mp, "--tokenizer", tp, "--prompt", prompt, "--tokens", str(n), "--temperature", repr(t),
            "--top-p", repr(p), "--seed", str(s), "--kv-dtype", kv_dtype, "--policy", policy, "--window", str(w),
            "--backend", backend, "--rope", rope]
    stream(ENTRY, args, heap, out)
    return None


# run the entry under the unix port with the board's usable heap, copying its stdout
# here as it arrives; a failure is a UserError with the entry's own one line
def stream(script, args, heap, out=None):
    cmd, env = interp.command(script, "micropython", usable_heap=heap, args=args)
    dst = out or sys.stdout.buffer
    proc = subprocess.Popen(cmd, cwd=paths.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        while True:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            dst.write(chunk)
            dst.flush()
        err = proc.stderr.read().decode("utf-8", "replace").strip().splitlines()
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc:
        last = err[-1] if err else "exited %d" % rc
        if last.startswith("generate: "):
            last = last[len("generate: "):]
        raise UserError("micropython: %s" % last, 2 if rc == 2 else 1)
