# Model shapes for the budget: a catalog of published configurations, or the header
# of a llama2.c checkpoint on disk. Everything the KV and weight arithmetic needs is
# a firmware_py.llama2c.Config (the same object the firmware builds from a header).
import os

from firmware_py import llama2c
from host import paths
from host.errors import UserError

# name -> (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab (negative: untied
# classifier), seq_len, head_dim (None: dim / n_heads), bytes per weight as published,
# extra params not in the llama shape (biases), published parameter count, source)
CATALOG = {
    "stories260K": (64, 172, 5, 8, 4, 512, 512, None, 4, 0, 260e3,
                    "karpathy/tinyllamas stories260K (llama2.c legacy fp32 .bin; header read from the file)"),
    "stories15M": (288, 768, 6, 6, 6, 32000, 256, None, 4, 0, 15e6,
                   "karpathy/llama2.c README model table (dim 288, 6 layers, 6 heads, ctx 256)"),
    "stories42M": (512, 1376, 8, 8, 8, 32000, 1024, None, 4, 0, 42e6,
                   "karpathy/llama2.c README model table (dim 512, 8 layers, 8 heads, ctx 1024)"),
    "stories110M": (768, 2048, 12, 12, 12, 32000, 1024, None, 4, 0, 110e6,
                    "karpathy/llama2.c README model table (dim 768, 12 layers, 12 heads, ctx 1024)"),
    "TinyLlama-1.1B": (2048, 5632, 22, 32, 4, -32000, 2048, None, 2, 0, 1.1e9,
                       "TinyLlama/TinyLlama-1.1B config.json (22 layers, 32 heads, 4 KV heads, hidden 5632)"),
    "Llama-3-8B": (4096, 14336, 32, 32, 8, -128256, 8192, None, 2, 0, 8.03e9,
                   "meta-llama/Meta-Llama-3-8B config.json (32 layers, 32 heads, 8 KV heads, head_dim 128)"),
    "Qwen2.5-0.5B": (896, 4864, 24, 14, 2, 151936, 32768, None, 2, 24 * (896 + 2 * 128), 0.49e9,
                     "Qwen/Qwen2.5-0.5B config.json (24 layers, 14 heads, 2 KV heads, tied embeddings)"),
    "Qwen2.5-1.5B": (1536, 8960, 28, 12, 2, 151936, 32768, None, 2, 28 * (1536 + 2 * 256), 1.54e9,
                     "Qwen/Qwen2.5-1.5B config.json (28 layers, 12 heads, 2 KV heads, tied embeddings)"),
    "Qwen2.5-7B": (3584, 18944, 28, 28, 4, -152064, 32768, None, 2, 28 * (3584 + 2 * 512), 7.61e9,
                   "Qwen/Qwen2.5-7B config.json (28 layers, 28 heads, 4 KV heads, head_dim 128)"),
    "Phi-3-mini": (3072, 8192, 32, 32, 32, -32064, 4096, None, 2, 0, 3.82e9,
                   "microsoft/Phi-3-mini-4k-instruct config.json (32 layers, 32 heads, no GQA, head_dim 96)"),
}


class Model:
    # a model shape plus what its weights cost
    def __init__(self, name, cfg, weights_bytes, bytes_per_weight, published_params, source):
        self.name = name  # catalog name or checkpoint path
        self.cfg = cfg  # firmware_py.llama2c.Config
        self.weights_bytes = weights_bytes  # bytes the weights take as stored
        self.bytes_per_weight = bytes_per_weight  # 4 fp32 (llama2.c), 2 fp16/bf16 (published HF), ~1 int8 files
        self.published_params = published_params  # the figure the model card gives
        self.source = source  # where the shape comes from
        self.params = 0  # weight parameters (set by load)


def names():
    # catalog names, in catalog order
    return list(CATALOG)


def load(name_or_path):
    # a Model from a catalog name (case-insensitive) or a llama2.c checkpoint path
    for name, row in CATALOG.items():
        if name.lower() == name_or_path.lower():
            return _from_catalog(name, row)
    if os.path.exists(name_or_path):
        if not os.path.isdir(name_or_path):  # a folder: the loader's own line
            paths.regular_file(name_or_path, "--model")  # a FIFO blocked the read forever
        try:
            cfg, lay = llama2c.plan(name_or_path)
        except llama2c.CheckpointError as e:
            raise UserError(str(e), 2) from None
        # what the firmware's loader keeps in memory (llama2c.Weights: int8 stays int8,
        # the unused freq_cis table is skipped), not the file's size
        wbytes = lay.memory_bytes()
        params = lay.params()
        kind = "int8 (%s)" % cfg.format if cfg.groups else "fp32"
        m = Model(name_or_path, cfg, wbytes, wbytes / params, cfg.params(),
                  "llama2.c %s header of %s, %s weights" % (cfg.format, name_or_path, kind))
        m.params = params
        return m
    raise UserError("unknown model %r: not a catalog name (%s) nor a file" % (name_or_path, ", ".join(CATALOG)), 2)


def _from_catalog(name, row):
    dim, hidden, layers, heads, kv_heads, vocab, seq_len, head_dim, bpw, extra, published, source = row
    cfg = llama2c.Config(dim, hidden, layers, heads, kv_heads, vocab, seq_len, name)
    if head_dim:
        cfg.head_dim = head_dim
        cfg.kv_dim = kv_heads * head_dim
    params = _params(cfg) + extra
    # in memory: llama2.c legacy files also hold a freq_cis table, which the firmware's
    # loader skips (firmware_py/llama2c.py), so a file and its catalog row agree
    wbytes = bpw * params
    m = Model(name, cfg, wbytes, bpw, published, source)
    m.params = params
    return m


def params(m):
    # weight parameters of a loaded Model
    return m.params


def _params(cfg):
    # weight parameters of a llama-shaped model (head_dim may differ from dim / n_heads)
    d, h, n = cfg.dim, cfg.hidden_dim, cfg.n_layers
    q = cfg.n_heads * cfg.head_dim
    per_layer = d * q + 2 * d * cfg.kv_dim + q * d + 3 * d * h + 2 * d
    emb = cfg.vocab_size * d * (1 if cfg.shared_classifier else 2)
    return emb + n * per_layer + d
