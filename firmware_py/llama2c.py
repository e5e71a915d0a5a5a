# llama2.c checkpoints on both interpreters: the header (Config), the file layout of
# every format (Layout) and the weights read into memory once (Weights). Formats
# (docs/models.md gives them byte by byte):
#   legacy  7 x int32 header (a negative vocab_size: a separate classifier), then fp32
#           token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final,
#           freq_cis (unused, skipped), wcls when not shared
#   v1      llama2.c's 256-byte "ak42" header, version 1: all fp32, norms first
#   v2      "ak42" version 2: fp32 norms, then each matrix as int8 values and fp32
#           scales, Q8_0 with one group size for every matrix (it must divide every
#           row: runq.c silently drops a row's tail when it does not; this refuses)
#   q8row   this project's int8 layout, magic "kvq8": a group size per matrix, each
#           dividing that matrix's row; int8 values padded to 4 bytes, then scales
# Weights keep two arenas, each allocated once at load: f32 (array 'f': norms, fp32
# matrices, int8 scales) and q8 (array 'b': int8 values, never expanded to fp32).
import os
import struct

from firmware_py import compat
from firmware_py.compat import const

HEADER_BYTES = const(28)  # legacy header: 7 x int32
V2_HEADER_BYTES = const(256)  # "ak42" and "kvq8" headers
V2_MAGIC = const(0x616B3432)  # b"ak42" read as a little-endian uint32
Q8ROW_MAGIC = const(0x3871766B)  # b"kvq8" read as a little-endian uint32
Q8ROW_VERSION = const(1)  # the only q8row version
_MAX_DIM = const(1 << 20)  # sanity bound for any header field
_V2_FIELDS_END = const(41)  # magic, version, 7 ints, uint8 shared, int32 group
_V1_FIELDS_END = const(37)  # magic, version, 7 ints, uint8 shared
_Q8ROW_GROUPS_AT = const(40)  # the 9 int32 group sizes start here
_Q8ROW_FIELDS_END = const(76)  # ... and end here

# matrices with a group size of their own in q8row, in header order
MATRICES = ("token_embedding", "wq", "wk", "wv", "wo", "w1", "w2", "w3", "wcls")
LAYER_MATRICES = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


class CheckpointError(ValueError):
    # a file that is not a usable llama2.c checkpoint; str() is one line
    pass


class DoesNotFit(CheckpointError):
    # a valid checkpoint whose weights do not fit the free heap; str() gives the figures
    pass


class Config:
    # model shape read from a header (static config, as run.c's Config)
    def __init__(self, dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len, where="<header>"):
        shared = vocab_size > 0
        vocab_size = abs(vocab_size)
        for name, v in (("dim", dim), ("hidden_dim", hidden_dim), ("n_layers", n_layers), ("n_heads", n_heads),
                        ("n_kv_heads", n_kv_heads), ("vocab_size", vocab_size), ("seq_len", seq_len)):
            if not 0 < v <= _MAX_DIM:
                raise CheckpointError("%s: header field %s = %d is not a plausible size (not a llama2.c checkpoint?)" % (where, name, v))
        if dim % n_heads:
            raise CheckpointError("%s: dim %d is not a multiple of n_heads %d" % (where, dim, n_heads))
        if n_heads % n_kv_heads:
            raise CheckpointError("%s: n_heads %d is not a multiple of n_kv_heads %d" % (where, n_heads, n_kv_heads))
        if (dim // n_heads) % 2:
            raise CheckpointError("%s: head size %d is odd (RoPE rotates pairs)" % (where, dim // n_heads))
        self.dim = dim  # transformer width
        self.hidden_dim = hidden_dim  # FFN width
        self.n_layers = n_layers  # transformer blocks
        self.n_heads = n_heads  # query heads
        self.n_kv_heads = n_kv_heads  # key/value heads (GQA when < n_heads)
        self.vocab_size = vocab_size  # tokens
        self.seq_len = seq_len  # trained context length
        self.shared_classifier = shared  # True: the classifier is the token embedding
        self.head_dim = dim // n_heads  # per-head width
        self.kv_dim = n_kv_heads * self.head_dim  # K (or V) width per layer
        self.version = 0  # 0 legacy, else the header's version field (1, 2; 1 for q8row)
        self.format = "legacy"  # "legacy", "v1", "v2" or "q8row"
        self.header_bytes = HEADER_BYTES  # bytes before the first weight
        self.groups = None  # int8 formats: {matrix name: group size along a row}

    # (name, floats) of every fp32 tensor in a legacy file, in file order; allocates
    def weight_shapes(self):
        d, h, n, kv, v, hd = self.dim, self.hidden_dim, self.n_layers, self.kv_dim, self.vocab_size, self.head_dim
        out = [("token_embedding", v * d), ("rms_att", n * d), ("wq", n * d * d), ("wk", n * d * kv),
               ("wv", n * d * kv), ("wo", n * d * d), ("rms_ffn", n * d), ("w1", n * d * h), ("w2", n * h * d),
               ("w3", n * d * h), ("rms_final", d), ("freq_cis", self.seq_len * hd)]
        if not self.shared_classifier:
            out.append(("wcls", v * d))
        return out

    # floats after the legacy header
    def weight_floats(self):
        return sum(s for _, s in self.weight_shapes())

    # parameters that are weights (the unused freq_cis table excluded)
    def params(self):
        return sum(s for name, s in self.weight_shapes() if name != "freq_cis")

    # fp32 run-state bytes of run.c's RunState (x, xb, xb2, q: dim; hb, hb2: hidden;
    # att: n_heads x seq_len; logits: vocab), the activations a decode step holds
    def activation_bytes(self):
        return 4 * (4 * self.dim + 2 * self.hidden_dim + self.n_heads * self.seq_len + self.vocab_size)

    # (rows, cols) of a matrix: W @ x maps cols inputs to rows outputs (run.c's matmul)
    def matrix_shape(self, name):
        d, h = self.dim, self.hidden_dim
        return {"token_embedding": (self.vocab_size, d), "wcls": (self.vocab_size, d), "wq": (d, d),
                "wk": (self.kv_dim, d), "wv": (self.kv_dim, d), "wo": (d, d), "w1": (h, d), "w2": (d, h),
                "w3": (h, d)}[name]


# Config from the first bytes of a checkpoint (at least 28; 256 for "ak42"/"kvq8")
def parse_header(b, where="<header>"):
    if len(b) < HEADER_BYTES:
        raise CheckpointError("%s: truncated: %d B, a llama2.c header is %d B" % (where, len(b), HEADER_BYTES))
    magic = struct.unpack_from("<I", b, 0)[0]
    if magic != V2_MAGIC and magic != Q8ROW_MAGIC:
        f = struct.unpack_from("<7i", b, 0)
        return Config(f[0], f[1], f[2], f[3], f[4], f[5], f[6], where)
    name = "ak42" if magic == V2_MAGIC else "kvq8"
    if len(b) < V2_HEADER_BYTES:
        raise CheckpointError("%s: truncated: %d B, an %s header is %d B" % (where, len(b), name, V2_HEADER_BYTES))
    version = struct.unpack_from("<i", b, 4)[0]
    if magic == V2_MAGIC and version not in (1, 2):
        raise CheckpointError("%s: ak42 version %d is not supported (1: fp32, 2: int8)" % (where, version))
    if magic == Q8ROW_MAGIC and version != Q8ROW_VERSION:
        raise CheckpointError("%s: kvq8 version %d is not supported (%d)" % (where, version, Q8ROW_VERSION))
    f = struct.unpack_from("<7i", b, 8)
    if f[5] <= 0:
        raise CheckpointError("%s: header field vocab_size = %d is not a plausible size" % (where, f[5]))
    shared = b[36]
    if shared > 1:
        raise CheckpointError("%s: header field shared_classifier = %d (want 0 or 1)" % (where, shared))
    cfg = Config(f[0], f[1], f[2], f[3], f[4], f[5] if shared else -f[5], f[6], where)
    cfg.version = version
    cfg.header_bytes = V2_HEADER_BYTES
    if magic == Q8ROW_MAGIC:
        cfg.format = "q8row"
        _zero(b, 37, _Q8ROW_GROUPS_AT, where)
        _zero(b, _Q8ROW_FIELDS_END, V2_HEADER_BYTES, where)
        gs = struct.unpack_from("<9i", b, _Q8ROW_GROUPS_AT)
        cfg.groups = {}
        for i in range(len(MATRICES)):
            m = MATRICES[i]
            if m == "wcls" and shared:
                if gs[i]:
                    raise CheckpointError("%s: group size of wcls = %d, want 0 (the classifier is shared)" % (where, gs[i]))
                continue
            _check_group(cfg, m, gs[i], where)
            cfg.groups[m] = gs[i]
    elif version == 2:
        cfg.format = "v2"
        _zero(b, _V2_FIELDS_END, V2_HEADER_BYTES, where)
        g = struct.unpack_from("<i", b, 37)[0]
        cfg.groups = {}
        for m in MATRICES:
            if m != "wcls" or not shared:
                _check_group(cfg, m, g, where)
                cfg.groups[m] = g
    else:
        cfg.format = "v1"
        _zero(b, _V1_FIELDS_END, V2_HEADER_BYTES, where)
    return cfg


# refuse a header whose reserved bytes b[a:z] are not zero (unknown fields)
def _zero(b, a, z, where):
    for i in range(a, z):
        if b[i]:
            raise CheckpointError("%s: header byte %d is %d, reserved bytes %d..%d must be 0 (unknown field or corrupt)" % (where, i, b[i], a, z - 1))


# refuse an int8 group size that is not positive or does not divide the matrix's rows
def _check_group(cfg, m, g, where):
    cols = cfg.matrix_shape(m)[1]
    if g <= 0 or g > _MAX_DIM:
        raise CheckpointError("%s: group size of %s = %d is not a plausible size" % (where, m, g))
    if cols % g:
        raise CheckpointError("%s: group size %d does not divide %s's rows of %d weights (runq.c would drop the tail; "
                              "convert with --format q8row or a --group dividing %d)" % (where, g, m, cols, cols))


class Tensor:
    # one tensor as the file stores it and where it lives in memory
    def __init__(self, name, layer, rows, cols, group):
        self.name = name  # "wq", "rms_att", ...
        self.layer = layer  # layer index, -1 for model-wide tensors
        self.rows = rows  # output rows (1 for a norm vector)
        self.cols = cols  # inputs per row
        self.group = group  # int8 weights per fp32 scale along a row; 0: fp32
        self.file_off = 0  # byte offset of the values in the file
        self.scales_file_off = 0  # byte offset of the scales in the file (int8 only)
        self.off = 0  # element offset of the values: in Weights.f32 (fp32) or Weights.q8 (int8)
        self.soff = -1  # element offset of the scales in Weights.f32 (int8 only), else -1


class Layout:
    # every tensor of a checkpoint with its file and memory offsets; built from a Config
    # (allocates at load only)
    def __init__(self, cfg):
        self.cfg = cfg  # the header it was built from
        self.tensors = []  # Tensor list, in file order
        self.file_bytes = 0  # the exact size the file must have
        self.f32_len = 0  # floats in the f32 arena
        self.q8_len = 0  # int8 values in the q8 arena
        n = cfg.n_layers
        t = self.tensors
        if cfg.format == "legacy":
            t.append(self._t("token_embedding", -1))
            t.extend(Tensor("rms_att", i, 1, cfg.dim, 0) for i in range(n))
            for m in ("wq", "wk", "wv", "wo"):
                t.extend(self._t(m, i) for i in range(n))
            t.extend(Tensor("rms_ffn", i, 1, cfg.dim, 0) for i in range(n))
            for m in ("w1", "w2", "w3"):
                t.extend(self._t(m, i) for i in range(n))
            t.append(Tensor("rms_final", -1, 1, cfg.dim, 0))
            t.append(Tensor("freq_cis", -1, 1, cfg.seq_len * cfg.head_dim, 0))  # unused: skipped at load
        else:
            t.extend(Tensor("rms_att", i, 1, cfg.dim, 0) for i in range(n))
            t.extend(Tensor("rms_ffn", i, 1, cfg.dim, 0) for i in range(n))
            t.append(Tensor("rms_final", -1, 1, cfg.dim, 0))
            t.append(self._t("token_embedding", -1))
            for m in LAYER_MATRICES:
                t.extend(self._t(m, i) for i in range(n))
        if not cfg.shared_classifier:
            t.append(self._t("wcls", -1))
        pad = cfg.format == "q8row"  # q8row aligns each scale block to 4 bytes
        pos = cfg.header_bytes
        for x in t:
            x.file_off = pos
            count = x.rows * x.cols
            if x.group:
                pos += count
                if pad:
                    pos = (pos + 3) & ~3
                x.scales_file_off = pos
                pos += 4 * (count // x.group)
                x.off = self.q8_len
                self.q8_len += count
                x.soff = self.f32_len
                self.f32_len += count // x.group
            else:
                pos += 4 * count
                if x.name != "freq_cis":
                    x.off = self.f32_len
                    self.f32_len += count
        self.file_bytes = pos

    def _t(self, name, layer):
        # a matrix tensor, int8 when the format gives it a group size
        rows, cols = self.cfg.matrix_shape(name)
        g = self.cfg.groups[name] if self.cfg.groups else 0
        return Tensor(name, layer, rows, cols, g)

    # bytes the weights take in memory: the two arenas
    def memory_bytes(self):
        return 4 * self.f32_len + self.q8_len

    # weights in the matrices and norms (the unused freq_cis excluded)
    def params(self):
        return sum(x.rows * x.cols for x in self.tensors if x.name != "freq_cis")


# (Config, Layout) of the checkpoint at path, its size checked against the header
def plan(path):
    try:
        with open(path, "rb") as f:
            head = f.read(V2_HEADER_BYTES)
        size = os.stat(path)[6]
    except OSError as e:
        raise CheckpointError("%s: %s" % (path, "is a folder, not a checkpoint file" if e.errno == 21 else "cannot be read")) from None  # 21: EISDIR
    cfg = parse_header(head, path)
    lay = Layout(cfg)
    want, have = lay.file_bytes - cfg.header_bytes, size - cfg.header_bytes
    what = "fp32" if not cfg.groups else "int8"
    if have < want:
        raise CheckpointError("%s: truncated: the %s header promises %d B of %s weights, file has %d B" % (path, cfg.format, want, what, have))
    if have > want:
        raise CheckpointError("%s: %d B more than the %s header's weights (not a %s llama2.c checkpoint?)" % (path, have - want, cfg.format, cfg.format))
    return cfg, lay


# Config of the checkpoint at path, with its size checked against the header;
# returns (config, weight bytes after the header)
def read_config(path):
    cfg, lay = plan(path)
    return cfg, lay.file_bytes - cfg.header_bytes


class Matrix:
    # one weight matrix (rows x cols) inside the arenas of Weights
    def __init__(self, t):
        self.rows = t.rows  # outputs
        self.cols = t.cols  # inputs: y[r] = sum_c W[r, c] * x[c]
        self.off = t.off  # element offset of W[0, 0]: in Weights.f32 (fp32) or Weights.q8 (int8)
        self.soff = t.soff  # int8: element offset in Weights.f32 of scale[0, 0]; fp32: -1
        self.group = t.group  # int8: W[r, c] = q8[off + r*cols + c] * f32[soff + (r*cols + c) // group]; fp32: 0


class Layer:
    # one transformer block: offsets of its norms and its seven matrices
    def __init__(self):
        self.rms_att = 0  # f32 offset of the attention rmsnorm weights (dim)
        self.rms_ffn = 0  # f32 offset of the FFN rmsnorm weights (dim)
        self.wq = None  # Matrix (n_heads*head_dim, dim)
        self.wk = None  # Matrix (kv_dim, dim)
        self.wv = None  # Matrix (kv_dim, dim)
        self.wo = None  # Matrix (dim, n_heads*head_dim)
        self.w1 = None  # Matrix (hidden_dim, dim)
        self.w2 = None  # Matrix (dim, hidden_dim)
        self.w3 = None  # Matrix (hidden_dim, dim)


class Weights:
    # read-only weights of a loaded checkpoint (run.c's TransformerWeights): two arenas
    # allocated once, every tensor an offset into them
    def __init__(self, cfg, lay, path):
        self.cfg = cfg  # Config
        self.path = path  # the file they came from
        self.dtype = "int8" if lay.q8_len else "fp32"  # element type of the matrices
        self.nbytes = lay.memory_bytes()  # bytes of both arenas
        self.f32 = None  # array('f', f32_len): norms, fp32 matrices, int8 scales
        self.q8 = None  # array('b', q8_len): int8 matrix values; None for fp32 models
        self.token_embedding = None  # Matrix (vocab_size, dim)
        self.wcls = None  # Matrix (vocab_size, dim); the token_embedding object when shared
        self.rms_final = 0  # f32 offset of the final rmsnorm weights (dim)
        self.layers = [Layer() for _ in range(cfg.n_layers)]  # Layer per block
        self.np_f32 = None  # numpy float32 view of f32 (CPython with numpy), else None
        self.np_q8 = None  # numpy int8 view of q8 (CPython with numpy), else None
        for t in lay.tensors:
            if t.name == "freq_cis":
                continue
            if t.name in ("rms_att", "rms_ffn"):
                setattr(self.layers[t.layer], t.name, t.off)
            elif t.name == "rms_final":
                self.rms_final = t.off
            elif t.layer < 0:
                setattr(self, t.name, Matrix(t))
            else:
                setattr(self.layers[t.layer], t.name, Matrix(t))
        if cfg.shared_classifier:
            self.wcls = self.token_embedding

    # numpy (values, scales) views of matrix m: values (rows, cols) float32 or int8,
    # scales (rows, cols // group) float32 or None; no copy; CPython with numpy only
    def np_matrix(self, m):
        n = m.rows * m.cols
        if not m.group:
            return self.np_f32[m.off:m.off + n].reshape(m.rows, m.cols), None
        q = self.np_q8[m.off:m.off + n].reshape(m.rows, m.cols)
        return q, self.np_f32[m.soff:m.soff + n // m.group].reshape(m.rows, m.cols // m.group)

    # matrix m as a float32 numpy array (a view for fp32, a dequantized copy for int8);
    # CPython with numpy only (the board never expands int8)
    def np_dense(self, m):
        q, s = self.np_matrix(m)
        if s is None:
            return q
        np = compat.numpy()
        return (q.reshape(m.rows, -1, m.group).astype(np.float32) * s[:, :, None]).reshape(m.rows, m.cols)

    # numpy float32 view of n floats of f32 at off (a norm vector); CPython with numpy only
    def np_vec(self, off, n):
        return self.np_f32[off:off + n]


# Weights of the checkpoint at path, read into two arenas sized from the header; the
# bytes needed are checked against the free heap before anything is allocated
def load(path):
    cfg, lay = plan(path)
    need = lay.memory_bytes()
    compat.collect()
    free = compat.mem_free()
    if free is not None and need > free:
        raise DoesNotFit("%s: the weights need %d B (fp32 %d B + int8 %d B), the heap has %d B free"
                         % (path, need, 4 * lay.f32_len, lay.q8_len, free))
    w = Weights(cfg, lay, path)
    try:
        # the larger arena first, while the heap is least fragmented
        if lay.q8_len >= 4 * lay.f32_len:
            w.q8 = compat.new_array("b", lay.q8_len)
            w.f32 = compat.new_array("f", lay.f32_len)
        else:
            w.f32 = compat.new_array("f", lay.f32_len)
            w.q8 = compat.new_array("b", lay.q8_len) if lay.q8_len else None
    except MemoryError:
        w.f32 = w.q8 = None
        compat.collect()
        raise DoesNotFit("%s: the weights need %d B (fp32 %d B + int8 %d B) in two blocks, the heap has %s B free "
                         "but not in blocks that large" % (path, need, 4 * lay.f32_len, lay.q8_len, compat.mem_free())) from None
    f32 = memoryview(w.f32)
    q8 = memoryview(w.q8) if w.q8 is not None else None
    with open(path, "rb") as f:
        for t in lay.tensors:
            if t.name == "freq_cis":
                continue
            count = t.rows * t.cols
            if t.group:
                _read(f, t.file_off, q8, t.off, count, 1, path)
                _read(f, t.scales_file_off, f32, t.soff, count // t.group, 4, path)
            else:
                _read(f, t.file_off, f32, t.off, count, 4, path)
    np = compat.numpy()
    if np is not None:
        w.np_f32 = np.frombuffer(w.f32, dtype=np.float32)
        if w.q8 is not None:
            w.np_q8 = np.frombuffer(w.q8, dtype=np.int8)
    return w


# read n elements of size `size` B into arena view mv at element off, from byte pos of f
def _read(f, pos, mv, off, n, size, path):
    if f.tell() != pos:
        f.seek(pos)
    got = f.readinto(mv[off:off + n])  # one small view object per tensor, at load only
    if got != n * size:
        raise CheckpointError("%s: short read at byte %d: %s of %d B (file changed while loading?)" % (path, pos, got, n * size))
