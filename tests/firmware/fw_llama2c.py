# Model files on this interpreter: tiny legacy, v2 and q8row checkpoints written here
# with struct (every value a function of its place in the file) load with each tensor
# at the offset the format gives it; int8 stays int8 (array 'b') with its fp32 scales;
# truncated and corrupt files are refused in one line; stories260K, when
# ../shared/models has it, loads with its known first weights.
import os
import struct

from fwtest import check, eq, raises, done
from firmware_py import llama2c

D, H, NL, NH, NKV, V, S = 6, 10, 2, 3, 1, 5, 3  # head 2, kv_dim 2; 5 x 6 = 30 B: q8row pads
KVD = NKV * (D // NH)
TMP = "/tmp/kvrtos_fw_llama2c_%d" % struct.unpack("<I", os.urandom(4))[0]
MATS = (("wq", D, D), ("wk", KVD, D), ("wv", KVD, D), ("wo", D, D), ("w1", H, D), ("w2", D, H), ("w3", H, D))


def fval(i):
    # the fp32 value stored at float index i of a file's weights (exact in float32)
    return ((i * 7919) % 201 - 100) / 128.0


def qval(i):
    # the int8 value stored at int8 index i of a tensor
    return (i * 31) % 255 - 127


def write(path, chunks):
    with open(path, "wb") as f:
        for c in chunks:
            f.write(c)
    return path


def floats(start, n):
    return struct.pack("<%df" % n, *[fval(start + k) for k in range(n)])


# ---- legacy fp32, separate classifier: check every tensor's first and last value
order = [("emb", -1, V * D), ("rms_att", 0, D), ("rms_att", 1, D)]
order += [(m, i, r * c) for m, r, c in MATS[:4] for i in range(NL)]
order += [("rms_ffn", 0, D), ("rms_ffn", 1, D)]
order += [(m, i, r * c) for m, r, c in MATS[4:] for i in range(NL)]
order += [("rms_final", -1, D), ("freq_cis", -1, S * 2), ("wcls", -1, V * D)]
total = sum(n for _, _, n in order)
p = write(TMP + "_legacy.bin", [struct.pack("<7i", D, H, NL, NH, NKV, -V, S), floats(0, total)])
w = llama2c.load(p)
eq((w.dtype, w.cfg.format, w.q8), ("fp32", "legacy", None), "legacy: fp32, no int8 arena")
eq(len(w.f32), total - S * 2, "legacy: freq_cis skipped")
at = 0
for name, layer, n in order:
    if name == "freq_cis":
        at += n
        continue
    if name in ("rms_att", "rms_ffn"):
        off = getattr(w.layers[layer], name)
    elif name == "rms_final":
        off = w.rms_final
    else:
        obj = w.token_embedding if name == "emb" else w.wcls if name == "wcls" else getattr(w.layers[layer], name)
        eq((obj.group, obj.soff), (0, -1), "fp32 matrix has no scales")
        off = obj.off
    eq(w.f32[off], fval(at), "legacy %s[%d] first value" % (name, layer))
    eq(w.f32[off + n - 1], fval(at + n - 1), "legacy %s[%d] last value" % (name, layer))
    at += n
check(w.wcls is not w.token_embedding, "separate classifier")
del w


# ---- int8: v2 (group 2) and q8row (a group per matrix, int8 blocks padded to 4 B)
def int8_file(path, fmt, groups):
    names = ("token_embedding",) + tuple(m for m, _, _ in MATS) + ("wcls",)
    if fmt == "v2":
        h = struct.pack("<Ii7iBi", 0x616B3432, 2, D, H, NL, NH, NKV, V, S, 0, groups["wq"])
    else:
        h = struct.pack("<Ii7iB3x", 0x3871766B, 1, D, H, NL, NH, NKV, V, S, 0)
        h += struct.pack("<9i", *[groups[m] for m in names])
    chunks = [h + bytes(256 - len(h)), floats(0, (2 * NL + 1) * D)]
    pos = 256 + 4 * (2 * NL + 1) * D
    mats = [("token_embedding", -1, V, D)] + [(m, i, r, c) for m, r, c in MATS for i in range(NL)] + [("wcls", -1, V, D)]
    want = []  # (name, layer, first int8 index tag, scales count)
    for k in range(len(mats)):
        name, layer, r, c = mats[k]
        n = r * c
        chunks.append(struct.pack("<%db" % n, *[qval(1000 * k + j) for j in range(n)]))
        pos += n
        if fmt == "q8row" and pos % 4:
            chunks.append(bytes(4 - pos % 4))
            pos += 4 - pos % 4
        ns = n // groups[name]
        chunks.append(struct.pack("<%df" % ns, *[(1000 * k + j + 1) / 256.0 for j in range(ns)]))
        pos += 4 * ns
        want.append((name, layer, k, n, ns))
    return write(path, chunks), want


for fmt, groups in (("v2", dict((m, 2) for m in llama2c.MATRICES)),
                    ("q8row", {"token_embedding": 3, "wq": 6, "wk": 3, "wv": 2, "wo": 6, "w1": 3, "w2": 5, "w3": 6, "wcls": 2})):
    p, want = int8_file(TMP + "_" + fmt + ".bin", fmt, groups)
    w = llama2c.load(p)
    eq((w.dtype, w.cfg.format), ("int8", fmt), fmt + ": an int8 model")
    eq(len(w.q8), sum(x[3] for x in want), fmt + ": the int8 arena holds every int8 value, one byte each")
    eq(w.f32[w.layers[1].rms_ffn], fval(3 * D), fmt + ": norms first, fp32")
    for name, layer, k, n, ns in want:
        m = getattr(w, name) if layer < 0 else getattr(w.layers[layer], name)
        eq(m.group, groups[name], "%s %s group" % (fmt, name))
        eq((w.q8[m.off], w.q8[m.off + n - 1]), (qval(1000 * k), qval(1000 * k + n - 1)), "%s %s[%d] int8 values" % (fmt, name, layer))
        eq((w.f32[m.soff], w.f32[m.soff + ns - 1]), ((1000 * k + 1) / 256.0, (1000 * k + ns) / 256.0), "%s %s[%d] scales" % (fmt, name, layer))
    eq(w.nbytes, len(w.q8) + 4 * len(w.f32), fmt + ": nbytes is both arenas")
    del w
    # refusals, one line naming the file
    data = open(p, "rb").read()
    cases = [(data[:-1], "truncated"), (data + b"\0", "more than"), (data[:100], "truncated"),
             (data[:4] + struct.pack("<i", 9) + data[8:], "version 9"),
             (data[:36] + b"\x03" + data[37:], "shared_classifier = 3")]
    if fmt == "v2":
        cases.append((data[:37] + struct.pack("<i", 4) + data[41:], "group size 4 does not divide"))
    else:
        cases.append((data[:64] + struct.pack("<i", 4) + data[68:], "group size 4 does not divide w2's rows of 10"))
    for bad, needle in cases:
        q = write(TMP + "_bad.bin", [bad])
        e = raises(llama2c.CheckpointError, llama2c.load, q)
        msg = str(e)
        check(msg.startswith(q + ": ") and needle in msg and "\n" not in msg, "%s refused in one line: %r" % (fmt, msg))

e = raises(llama2c.CheckpointError, llama2c.load, TMP + "_absent.bin")
check("cannot be read" in str(e), "absent file")
for suffix in ("_legacy.bin", "_v2.bin", "_q8row.bin", "_bad.bin"):
    os.remove(TMP + suffix)

# ---- stories260K from ../shared/models, when present
try:
    w = llama2c.load("../shared/models/stories260K.bin")
except llama2c.DoesNotFit:
    raise
except llama2c.CheckpointError:
    w = None
    print("SKIP stories260K.bin: not in ../shared/models")
if w is not None:
    c = w.cfg
    eq((c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len), (64, 172, 5, 8, 4, 512, 512), "stories260K shape")
    eq(w.nbytes, 1040128, "stories260K fp32 weights without freq_cis")
    eq(struct.pack("<f", w.f32[0]), struct.pack("<f", -0.29474878311157227), "first embedding weight")
    eq(struct.pack("<f", w.f32[w.rms_final]), struct.pack("<f", 2.4583089351654053), "first final-norm weight")
    del w
done()
