# Write int8 checkpoints from an fp32 one (numpy): llama2.c's v2 ("ak42" version 2,
# one group size for every matrix) or this project's q8row ("kvq8", a group size per
# matrix, each dividing its rows). Q8_0 symmetric: scale = max|w| / 127 per group,
# q = round(w / scale). The firmware (firmware_py/llama2c.py) loads both; the layouts
# are in docs/models.md.
import math
import os
import struct
import tempfile

from firmware_py import llama2c
from host import paths
from host.errors import UserError

FORMATS = ("v2", "q8row")
Q8ROW_DEFAULT_GROUP = 64  # q8row: each matrix's group is the divisor of its row nearest this


# the largest divisor of n that is at most cap; O(cap)
def largest_divisor(n, cap):
    for g in range(min(n, cap), 0, -1):
        if n % g == 0:
            return g
    return 1


# the divisor of n nearest to target (the smaller one on a tie); O(n)
def nearest_divisor(n, target):
    best = 1
    for g in range(1, n + 1):
        if n % g == 0 and abs(g - target) < abs(best - target):
            best = g
    return best


# {matrix name: group size} for fmt ("v2" or "q8row") and the user's group (0: default)
def choose_groups(cfg, fmt, group=0):
    names = [m for m in llama2c.MATRICES if m != "wcls" or not cfg.shared_classifier]
    if fmt == "v2":
        common = math.gcd(cfg.dim, cfg.hidden_dim)  # every row is dim or hidden_dim long
        if group == 0:
            group = largest_divisor(common, 64)  # export.py's default is 64, halved until it fits
        elif group <= 0 or common % group:
            ok = [g for g in range(1, common + 1) if common % g == 0]
            raise UserError("--group %d does not divide every row (dim %d, hidden_dim %d): v2 can use %s; "
                            "--format q8row gives each matrix its own group" % (group, cfg.dim, cfg.hidden_dim,
                                                                                ", ".join(map(str, ok))), 2)
        return {m: group for m in names}
    if fmt != "q8row":
        raise UserError("--format must be one of %s, not %r" % (", ".join(FORMATS), fmt), 2)
    target = group or Q8ROW_DEFAULT_GROUP
    if target <= 0:
        raise UserError("--group must be a positive number, not %d" % group, 2)
    return {m: nearest_divisor(cfg.matrix_shape(m)[1], target) for m in names}


# (int8 values, float32 scales, max |w - q * scale|) of a (rows, cols) float32 matrix
# quantized in groups of g along each row
def quantize(w, g):
    import numpy as np

    rows, cols = w.shape
    grouped = w.reshape(rows, cols // g, g).astype(np.float32)
    scale = (np.abs(grouped).max(axis=2) / np.float32(127.0)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1.0))
    q = np.clip(np.round(grouped / safe[:, :, None]), -127, 127).astype(np.int8)
    q[scale == 0] = 0
    err = float(np.abs(q.astype(np.float32) * scale[:, :, None] - grouped).max()) if w.size else 0.0
    return q.reshape(rows, cols), scale, err


# the 256-byte header of an int8 file for cfg in fmt with groups
def header(cfg, fmt, groups):
    fields = (cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.seq_len)
    shared = 1 if cfg.shared_classifier else 0
    if fmt == "v2":
        h = struct.pack("<Ii7iBi", llama2c.V2_MAGIC, 2, *fields, shared, groups["token_embedding"])
    else:
        h = struct.pack("<Ii7iB3x", llama2c.Q8ROW_MAGIC, llama2c.Q8ROW_VERSION, *fields, shared)
        h += struct.pack("<9i", *[groups.get(m, 0) for m in llama2c.MATRICES])
    return h + bytes(llama2c.V2_HEADER_BYTES - len(h))


# convert the fp32 checkpoint inp to out in fmt; returns a dict of figures
def convert(inp, out, fmt, group=0):
    import numpy as np

    if os.path.exists(inp) and not os.path.isdir(inp):  # a folder: the loader's own line
        paths.regular_file(inp, "--model")  # a FIFO blocked the read forever
    try:
        w = llama2c.load(inp)
    except llama2c.CheckpointError as e:
        raise UserError(str(e), 2) from None
    if w.dtype != "fp32":
        raise UserError("%s: is already int8 (%s); convert reads an fp32 checkpoint" % (inp, w.cfg.format), 2)
    check_out(inp, out)
    fp32_bytes = os.path.getsize(inp)  # now: after the write, a link would report the output
    cfg = w.cfg
    groups = choose_groups(cfg, fmt, group)
    # the output's layout: the firmware's own table, so the loader and writer agree
    ocfg = llama2c.parse_header(header(cfg, fmt, groups), out)
    lay = llama2c.Layout(ocfg)
    worst = 0.0
    matrix_weights = matrix_bytes = 0
    # written to a temporary file beside --out, renamed into place only when whole: a
    # failed or interrupted convert leaves no half file (and never touches the input)
    try:
        fd, part = tempfile.mkstemp(prefix="." + os.path.basename(out) + ".", suffix=".part", dir=os.path.dirname(out) or ".")
    except OSError as e:
        raise UserError("%s: cannot be written (%s)" % (out, e.strerror or e)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header(cfg, fmt, groups))
            for t in lay.tensors:
                src = _source(w, t)
                if not t.group:
                    _pad_to(f, t.file_off)
                    f.write(np.ascontiguousarray(src, dtype="<f4").tobytes())
                    continue
                q, s, err = quantize(src, t.group)
                worst = max(worst, err)
                _pad_to(f, t.file_off)
                f.write(q.tobytes())
                _pad_to(f, t.scales_file_off)
                f.write(s.astype("<f4").tobytes())
                matrix_weights += q.size
                matrix_bytes += q.size + 4 * s.size
            _pad_to(f, lay.file_bytes)
        os.chmod(part, 0o666 & ~_umask())  # mkstemp's 0600: give it an ordinary file's mode
        os.replace(part, out)
    except OSError as e:
        _remove(part)
        raise UserError("%s: cannot be written (%s)" % (out, e.strerror or e)) from None
    except BaseException:
        _remove(part)
        raise
    size = os.path.getsize(out)
    params = lay.params()
    return {"model": inp, "out": out, "format": fmt, "groups": groups, "file_bytes": size, "params": params,
            "bytes_per_weight": (size - ocfg.header_bytes) / params, "matrix_bytes_per_weight": matrix_bytes / matrix_weights,
            "max_abs_error": worst, "fp32_file_bytes": fp32_bytes}


# refuse an --out that is the input under another name (a symlink, a hard link, a
# path through a linked folder), a folder, or in a folder that does not exist; exit 2
def check_out(inp, out):
    if os.path.isdir(out):
        raise UserError("--out %s is a folder; give the file to write" % out, 2)
    if os.path.exists(out) and not os.path.isfile(out):  # a FIFO or a device was replaced by a regular file
        raise UserError("--out %s is %s; give a file to write" % (out, paths.kind_of(os.stat(out).st_mode)), 2)
    paths.new_file(out)  # its folder exists, is a folder, takes a file (not /proc, not a path through a file)
    same = os.path.samefile(inp, out) if os.path.exists(out) else os.path.realpath(inp) == os.path.realpath(out)
    if same:
        raise UserError("--out %s is the input file %s (the same file under another name); write to another file" % (out, inp), 2)


def _umask():
    # the process's umask (read by setting it)
    m = os.umask(0)
    os.umask(m)
    return m


def _remove(path):
    # remove a file that may not exist
    try:
        os.remove(path)
    except OSError:
        pass


# the fp32 source (numpy) of output tensor t, from the loaded fp32 weights w
def _source(w, t):
    if t.name in ("rms_att", "rms_ffn"):
        return w.np_vec(getattr(w.layers[t.layer], t.name), t.cols)
    if t.name == "rms_final":
        return w.np_vec(w.rms_final, t.cols)
    m = getattr(w, t.name) if t.layer < 0 else getattr(w.layers[t.layer], t.name)
    return w.np_dense(m)


# write zeros up to byte pos of f (q8row pads int8 blocks to 4 bytes)
def _pad_to(f, pos):
    here = f.tell()
    assert here <= pos, "layout went backwards"
    if pos > here:
        f.write(bytes(pos - here))


# one line per figure, for the CLI
def report(r):
    g = sorted(set(r["groups"].values()))
    return ("wrote %s: %s, group %s, %d B for %d weights: %.3f B/weight overall (%.3f B/weight in the int8 matrices), "
            "fp32 file %d B; max |w - dequant(w)| = %.3g" % (r["out"], r["format"], "/".join(map(str, g)), r["file_bytes"],
                                                           r["params"], r["bytes_per_weight"], r["matrix_bytes_per_weight"],
                                                           r["fp32_file_bytes"], r["max_abs_error"]))


# an int8 (q8row) copy of the fp32 checkpoint inp, converted once into the state cache
# (.kvrtos-cache/models, named by the input's sha256) and reused after; returns (path,
# True when it was converted now). What `kv flash --model` and `kv emulate` run an fp32
# file as: the integer path's format
def cached_q8row(inp):
    from host import paths  # noqa: PLC0415

    folder = paths.state(".kvrtos-cache", "models")
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, "%s-q8row.bin" % paths.sha256_file(inp)[:20])
    if os.path.isfile(out):
        return out, False
    convert(inp, out, "q8row")
    return out, True


# the note line of an on-the-fly conversion (r: convert's figures, or None: reused)
def note(inp, out, fresh):
    return "converted %s to int8 q8row (%s) for the integer path%s; ask for --weights fp32 to keep fp32" % (
        os.path.basename(inp), os.path.basename(out), "" if fresh else ", reused")
