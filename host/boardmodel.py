# Models on the board: `kv flash --model PATH [--tokenizer PATH]` puts a llama2.c
# checkpoint and its tokenizer on the board's filesystem as model.bin and
# tokenizer.bin (decode.MODEL_FILE, decode.TOKENIZER_FILE), where the firmware's
# decode.run loads them. A model that cannot fit the board is refused before anything
# is copied, in one line with the budget calculator's figures (exit 3, as `kv budget`).
import os

from firmware_py import decode, llama2c, tokenizer
from host import budget
from host.errors import UserError

FILES = (decode.MODEL_FILE, decode.TOKENIZER_FILE)  # what a model flash writes (kept by a plain flash)
FIT_KV_DTYPES = ("fp32", "int8")  # a model fits when one of these KV element types leaves room for a block


TINY_NAME = "kvrtos-tiny"  # the committed models/kvrtos-tiny (installed with the package too)
NAMES = (TINY_NAME, "stories260K")  # model names that resolve from any folder (case-insensitive)


# (model path, tokenizer path) of a model name ("" or "kvrtos-tiny": the committed tiny
# model, next to host/ in a checkout and in an installed package; "stories260K": in
# paths.shared_models()), None when model_arg is not a name (a path). A named model
# that is not there: one line, exit 2
def named(model_arg):
    from host import paths  # noqa: PLC0415

    name = (model_arg or TINY_NAME).lower()
    if name == TINY_NAME:
        tiny = os.path.join(paths.MODELS, TINY_NAME)
        return os.path.join(tiny, "model.bin"), os.path.join(tiny, "tokenizer.bin")
    if name == "stories260k":
        shared = paths.shared_models()
        if shared is None or not os.path.isfile(os.path.join(shared, "stories260K.bin")):
            raise UserError("stories260K is not in ../shared/models (or $%s): download stories260K.bin and tok512.bin "
                            "there (docs/models.md)" % paths.SHARED_MODELS, 2)
        return os.path.join(shared, "stories260K.bin"), os.path.join(shared, "tok512.bin")
    return None


# the largest |weight| an fp32 tensor may hold (stories260K's: 4.4, kvrtos-tiny's: 1.8; a
# trained llama2.c model's stay far below), and so an int8 tensor's scale (max |w| / 127)
WEIGHT_MAX = 1e3
SCALE_MAX = WEIGHT_MAX / 127


def check_weights(path, lay):
    # a damaged checkpoint (bytes flipped inside it: its size and header still right) is
    # refused in one line (exit 2) when a float it holds (an fp32 weight, an int8 tensor's
    # scale) is NaN, infinite or past WEIGHT_MAX: the decode would run to garbage, numpy's
    # overflow warnings on the way. lay: llama2c.plan(path)[1]. Plausible values that are
    # wrong cannot be told from a model's own
    import numpy as np  # noqa: PLC0415

    raw = np.memmap(path, dtype=np.uint8, mode="r")  # the pages read as the tensors are, not the whole file at once
    for t in lay.tensors:
        if t.name == "freq_cis":
            continue  # legacy files' RoPE table: never read
        off, n = (t.scales_file_off, t.rows * t.cols // t.group) if t.group else (t.file_off, t.rows * t.cols)
        a = raw[off:off + 4 * n].view("<f4")
        top = SCALE_MAX if t.group else WEIGHT_MAX
        bad = ~np.isfinite(a) | (np.abs(np.nan_to_num(a)) > top)
        if bad.any():
            i = int(np.argmax(bad))
            where = "%s%s" % (t.name, "" if t.layer < 0 else " of layer %d" % t.layer)
            raise UserError("%s is damaged: %s %s holds %r at byte %d (a trained model's are below %.3g): a flipped or "
                            "overwritten byte; use an intact copy" % (path, where, "scales" if t.group else "weights",
                                                                     float(a[i]), off + 4 * i, top), 2)


# (model path, tokenizer path) for what the user typed: "" is kvrtos-tiny, "stories260K"
# is ../shared/models (named()), anything else a path (its tokenizer.bin or tok512.bin
# beside it, unless tok_arg names one); a file that is not there: one line, exit 2. The
# one resolver of model names and paths (generate, emulate, flash and the benchmarks)
def resolve(model_arg, tok_arg=""):
    from host import paths  # noqa: PLC0415

    got = named(model_arg)
    if got:
        mp, tp = got
    else:
        mp = paths.user_path(model_arg)
        tp = ""
        for name in ("tokenizer.bin", "tok512.bin"):
            cand = os.path.join(os.path.dirname(mp), name)
            if os.path.isfile(cand):
                tp = cand
                break
    if tok_arg:
        tp = paths.user_path(tok_arg)
    if os.path.exists(mp):
        paths.regular_file(mp, "model")  # a folder or a FIFO was "no model file"
    if not os.path.isfile(mp):
        raise UserError("no model file %s" % mp, 2)
    if not tp:
        raise UserError("no tokenizer.bin or tok512.bin beside %s: give --tokenizer PATH" % mp, 2)
    if os.path.exists(tp):
        paths.regular_file(tp, "tokenizer")  # a folder, a FIFO or /dev/null was "no tokenizer file"
    if not os.path.isfile(tp):
        raise UserError("no tokenizer file %s" % tp, 2)
    return mp, tp


# the budget (host/budget.compute) under which model_path runs on board_name: the first
# KV dtype of FIT_KV_DTYPES that fits; UserError (exit 3) naming the calculator's
# figures when none does. context: what runs beside the pool (budget.CONTEXT_DEFAULT:
# serve; "serve+tasks" with a config's tasks)
def check_fits(board_name, model_path, context=budget.CONTEXT_DEFAULT, out=None, word_bytes=0):
    # a model that fits decode.run (./kv generate --runtime board) but not serve beside its
    # telemetry (and the config's tasks) is flashed with a note line through out saying so;
    # word_bytes: the MicroPython's word (0: the chip's, 4; 8: the 64-bit virtual board)
    r = _first_fit(board_name, model_path, context, word_bytes)
    if r["fits"]:
        return r
    if context != "decode":
        d = _first_fit(board_name, model_path, "decode", word_bytes)
        if d["fits"]:
            if out is not None:
                out("flash: note: %s fits board %s for decode.run (./kv generate --runtime board: KV budget %d tokens, %s KV) "
                    "but not for %s (./kv monitor --start, ./kv demo): %s B of heap left for its KV, one block of %s B needed "
                    "(./kv budget --board %s --model %s --kv-dtype %s --context %s)"
                    % (os.path.basename(model_path), d["board"], d["max_tokens"], d["kv_dtype"],
                       "serve with its telemetry" + (" and the config's tasks" if context == "serve+tasks" else ""),
                       _n(r["kv_avail_bytes"]), _n(r["block_bytes"]), board_name, model_path, r["kv_dtype"],
                       context + _word_opt(word_bytes)))
            return d
        r = d  # the refusal's figures: the smallest firmware's
    # the figures of the last KV type tried, int8: the smallest block
    name = os.path.basename(model_path)
    raise UserError(
        "%s does not fit board %s: heap %s B - firmware reserve %s B (its run state included) - weights %s B leaves %s B "
        "for the KV cache, one block of %s B needed even with %s KV (./kv budget --board %s --model %s --kv-dtype %s "
        "--context decode%s)"
        % (name, r["board"], _n(r["memory_bytes"]), _n(r["reserved_bytes"]), _n(r["weights_bytes"]),
           _n(max(r["kv_avail_bytes"], 0)), _n(r["block_bytes"]), r["kv_dtype"], board_name, model_path, r["kv_dtype"],
           _word_opt(word_bytes)),
        budget.EXIT_DOES_NOT_FIT)


def _word_opt(word_bytes):
    return " --word-bytes %d" % word_bytes if word_bytes and word_bytes != budget.BOARD_WORD_BYTES else ""


def _first_fit(board_name, model_path, context, word_bytes=0):
    # the budget of the first KV dtype that fits in context, else the last one's (int8: the smallest block)
    r = None
    # an int8 model runs with int8 KV on the board (serve's default, the integer path's)
    order = ("int8",) if llama2c.plan(model_path)[1].q8_len else FIT_KV_DTYPES
    for dtype in order:
        r = budget.compute(board_name, model_path, dtype, context=context, word_bytes=word_bytes)
        if r["fits"]:
            return r
    return r


# [(device path, bytes)] of the model and tokenizer after checking both files and the
# budget; the budget dict too. Everything is refused here, before a port is opened
# weights "int8" (the default): an fp32 checkpoint goes on the board as q8row, converted
# on the fly (one note line through out), the format the integer path (int8 weights, int8
# KV: the board's default KV type for an int8 model, serve.KV_DTYPE_DEFAULT) reads and
# the one that keeps the decode's slices short; "fp32": the file as it is
def files_for(board_name, model_arg, tok_arg="", weights="int8", out=None, context=budget.CONTEXT_DEFAULT):
    mp, tp = resolve(model_arg, tok_arg)
    try:
        plan = llama2c.plan(mp)
        cfg = plan[0]
        tokenizer.load(tp, cfg.vocab_size)
    except (llama2c.CheckpointError, tokenizer.TokenizerError) as e:
        raise UserError(str(e), 2) from None
    check_weights(mp, plan[1])
    if weights == "fp32" and plan[1].q8_len:
        raise UserError("--weights fp32: %s is already int8; give its fp32 checkpoint, or leave --weights out" % model_arg, 2)
    if weights == "int8" and not plan[1].q8_len:
        from host import convert  # noqa: PLC0415

        q8, fresh = convert.cached_q8row(mp)
        if out is not None:
            out("flash: note: %s" % convert.note(mp, q8, fresh))
        mp = q8
    r = check_fits(board_name, mp, context, out)
    out = []
    for dest, path in ((decode.MODEL_FILE, mp), (decode.TOKENIZER_FILE, tp)):
        with open(path, "rb") as f:
            out.append((dest, f.read()))
    return out, r, mp


def _n(v):
    return "{:,}".format(v)
