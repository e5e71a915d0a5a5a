# llama2.c checkpoint header and shape arithmetic, on both interpreters. The legacy
# .bin is 7 x int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
# seq_len; a negative vocab_size means a separate classifier) followed by fp32
# weights; the v2 export starts with magic "ak42" and a 256-byte header. A model
# module can build on Config: the weight tensor order is in weight_shapes().
import struct

from firmware_py.compat import const

HEADER_BYTES = const(28)  # legacy header: 7 x int32
V2_HEADER_BYTES = const(256)  # version-2 export header
V2_MAGIC = const(0x616B3432)  # "ak42"
_MAX_DIM = const(1 << 20)  # sanity bound for any header field


class CheckpointError(ValueError):
    # a file that is not a usable llama2.c checkpoint; str() is one line
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


# Config from the first bytes of a checkpoint (at least 28; 256 for v2 files)
def parse_header(b, where="<header>"):
    if len(b) < HEADER_BYTES:
        raise CheckpointError("%s: truncated: %d B, a llama2.c header is %d B" % (where, len(b), HEADER_BYTES))
    magic = struct.unpack_from("<I", b, 0)[0]
    if magic == V2_MAGIC:
        if len(b) < 36:
            raise CheckpointError("%s: truncated v2 header" % where)
        version = struct.unpack_from("<i", b, 4)[0]
        f = struct.unpack_from("<7i", b, 8)
        cfg = Config(f[0], f[1], f[2], f[3], f[4], f[5], f[6], where)
        cfg.version = version
        return cfg
    f = struct.unpack_from("<7i", b, 0)
    cfg = Config(f[0], f[1], f[2], f[3], f[4], f[5], f[6], where)
    cfg.version = 0
    return cfg


# Config of the checkpoint at path, with its size checked against the header;
# returns (config, weight bytes after the header)
def read_config(path):
    try:
        with open(path, "rb") as f:
            head = f.read(V2_HEADER_BYTES)
            size = f.seek(0, 2)
    except OSError:
        raise CheckpointError("%s: cannot be read" % path) from None
    cfg = parse_header(head, path)
    if cfg.version:
        return cfg, size - V2_HEADER_BYTES
    want = cfg.weight_floats() * 4
    have = size - HEADER_BYTES
    if have < want:
        raise CheckpointError("%s: truncated: header promises %d B of fp32 weights, file has %d B" % (path, want, have))
    if have > want:
        raise CheckpointError("%s: %d B more than the header's weights (not a legacy llama2.c checkpoint?)" % (path, have - want))
    return cfg, have
