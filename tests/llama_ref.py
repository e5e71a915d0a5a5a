# An independent numpy reference of the llama2.c transformer, written from the format
# description (docs/models.md, llama2.c's run.c as the definition) and sharing no code
# with firmware_py/: its own file reader, its own forward pass, greedy decoding. Tests
# use it as the oracle for the firmware's forward pass and record its token ids.
#   forward: x = embedding[token]; per layer: xb = rmsnorm(x) * rms_att (eps 1e-5);
#   q, k, v = wq xb, wk xb, wv xb; RoPE on pairs (2i, 2i+1) of each head with angle
#   pos * 10000^(-2i/head_size); attention of each query head over the cached K/V of
#   its KV head (GQA: head h reads kv head h // (n_heads / n_kv_heads)), scores
#   scaled by 1/sqrt(head_size), softmax over positions 0..pos; x += wo att;
#   x += w2(silu(w1 rmsnorm(x)) * w3 rmsnorm(x)); logits = wcls rmsnorm(x).
import struct

import numpy as np


class Model:
    # shape and dense weights (numpy arrays, dtype of the caller's choice)
    def __init__(self, cfg, w):
        self.dim, self.hidden, self.n_layers, self.n_heads, self.n_kv_heads, self.vocab, self.seq_len = cfg
        self.head = self.dim // self.n_heads  # per-head width
        self.kv_dim = self.n_kv_heads * self.head  # K/V width
        self.w = w  # name -> array; per-layer tensors stacked on axis 0


# Model from a legacy fp32 llama2.c .bin (7 int32 header, then the weights in file order)
def read_legacy(path, dtype=np.float32):
    with open(path, "rb") as f:
        raw = f.read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    head = dim // n_heads
    kv_dim = n_kv * head
    floats = np.frombuffer(raw, dtype="<f4", offset=28)
    at = [0]

    def take(*shape):
        n = int(np.prod(shape))
        a = floats[at[0]:at[0] + n].reshape(shape).astype(dtype)
        assert a.size == n, "file too short"
        at[0] += n
        return a

    w = {}
    w["emb"] = take(vocab, dim)
    w["rms_att"] = take(n_layers, dim)
    w["wq"] = take(n_layers, dim, dim)
    w["wk"] = take(n_layers, kv_dim, dim)
    w["wv"] = take(n_layers, kv_dim, dim)
    w["wo"] = take(n_layers, dim, dim)
    w["rms_ffn"] = take(n_layers, dim)
    w["w1"] = take(n_layers, hidden, dim)
    w["w2"] = take(n_layers, dim, hidden)
    w["w3"] = take(n_layers, hidden, dim)
    w["rms_final"] = take(dim)
    take(seq_len * head)  # freq_cis_real and freq_cis_imag: not used
    w["wcls"] = w["emb"] if shared else take(vocab, dim)
    assert at[0] == floats.size, "file longer than its header says"
    return Model((dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len), w)


def _rmsnorm(x, g):
    return g * (x / np.sqrt(np.mean(x * x) + x.dtype.type(1e-5)))


def _rope(v, pos, head):
    # rotate each head's pairs (v[2i], v[2i+1]) by pos * 10000^(-2i/head)
    pairs = v.reshape(-1, head // 2, 2)
    i = np.arange(head // 2, dtype=np.float64)
    ang = pos * np.power(10000.0, -2.0 * i / head)
    c, s = np.cos(ang).astype(v.dtype), np.sin(ang).astype(v.dtype)
    a, b = pairs[..., 0], pairs[..., 1]
    return np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(v.shape)


class Session:
    # one sequence: the K/V of every position so far
    def __init__(self, m):
        self.m = m  # Model
        dt = m.w["emb"].dtype
        self.k = np.zeros((m.n_layers, m.seq_len, m.kv_dim), dt)  # keys after RoPE
        self.v = np.zeros((m.n_layers, m.seq_len, m.kv_dim), dt)  # values
        self.pos = 0  # next position

    # logits (vocab) after feeding token at the next position
    def step(self, token):
        m, w, pos = self.m, self.m.w, self.pos
        hd, group = m.head, m.n_heads // m.n_kv_heads
        x = w["emb"][token].copy()
        for layer in range(m.n_layers):
            xb = _rmsnorm(x, w["rms_att"][layer])
            q = _rope(w["wq"][layer] @ xb, pos, hd)
            self.k[layer, pos] = _rope(w["wk"][layer] @ xb, pos, hd)
            self.v[layer, pos] = w["wv"][layer] @ xb
            keys = self.k[layer, :pos + 1].reshape(pos + 1, m.n_kv_heads, hd)
            vals = self.v[layer, :pos + 1].reshape(pos + 1, m.n_kv_heads, hd)
            att = np.empty(m.dim, x.dtype)
            for h in range(m.n_heads):
                kvh = h // group
                qh = q[h * hd:(h + 1) * hd]
                sc = keys[:, kvh, :] @ qh / np.sqrt(x.dtype.type(hd))
                sc = np.exp(sc - sc.max())
                sc /= sc.sum()
                att[h * hd:(h + 1) * hd] = sc @ vals[:, kvh, :]
            x = x + w["wo"][layer] @ att
            xb = _rmsnorm(x, w["rms_ffn"][layer])
            h1 = w["w1"][layer] @ xb
            h1 = h1 / (1 + np.exp(-h1))  # SiLU
            x = x + w["w2"][layer] @ (h1 * (w["w3"][layer] @ xb))
        self.pos += 1
        return w["wcls"] @ _rmsnorm(x, w["rms_final"])


# greedy continuation: (n token ids after the prompt, smallest top-1 minus top-2 logit
# gap seen while choosing them); argmax at every step, BOS does not stop it
def greedy(m, prompt_ids, n):
    s = Session(m)
    for t in prompt_ids[:-1]:
        s.step(t)
    tok = prompt_ids[-1]
    out = []
    margin = float("inf")
    for _ in range(n):
        logits = s.step(tok)
        top = np.argsort(logits)[-2:]
        margin = min(margin, float(logits[top[1]] - logits[top[0]]))
        tok = int(top[1])
        out.append(tok)
    return out, margin


# Greedy continuations of stories260K (fp32, /work/shared/models/stories260K.bin, sha256
# b0a507e7...2696) by this reference: (prompt, its ids with BOS from tok512.bin, the
# next 128 argmax ids, smallest top-1 minus top-2 logit gap over those steps). Plain
# argmax at every step (BOS, id 1, does not stop it; run.c would stop there). The same
# ids come out in float64, and no step is closer than the gap shown, so a correct
# fp32 forward pass (the firmware's, or run.c's) must reproduce them exactly.
GREEDY_STORIES260K = [
    ('Once upon a time', [1, 403, 407, 261, 378], [
        432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
        410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394,
        261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312, 432,
        398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310, 439, 419, 357, 336,
        432, 313, 438, 310, 432, 278, 316, 439, 419, 298, 414, 267, 265, 282, 295, 433,
        426, 436, 317, 286, 296, 418, 269, 279, 292, 416, 439, 413, 409, 416, 327, 263,
        415, 294, 267, 400, 426, 338, 336, 432, 313, 442, 391, 267, 337, 335, 364, 420,
        268, 388, 432, 398, 359, 280, 303, 439, 413, 272, 417, 264, 312, 426, 436, 13,
    ], 0.0423),
    ('', [1], [
        403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
        401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
        328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267,
        337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310,
        439, 419, 357, 336, 432, 313, 438, 310, 432, 278, 316, 439, 419, 298, 414, 267,
        265, 282, 295, 433, 426, 436, 317, 286, 296, 418, 269, 279, 292, 416, 439, 413,
        409, 416, 327, 263, 415, 294, 267, 400, 426, 338, 336, 432, 313, 442, 391, 267,
        337, 335, 364, 420, 268, 388, 432, 398, 359, 280, 303, 439, 413, 272, 417, 264,
    ], 0.0423),
    ('Lily and Tom', [1, 317, 269, 274, 287], [
        382, 276, 337, 299, 322, 265, 282, 295, 433, 426, 342, 397, 355, 267, 337, 335,
        265, 315, 267, 422, 419, 269, 352, 379, 261, 420, 277, 264, 265, 282, 295, 433,
        426, 342, 394, 261, 370, 268, 414, 444, 335, 261, 370, 268, 414, 444, 426, 342,
        391, 266, 267, 337, 335, 265, 268, 414, 444, 426, 13, 436, 438, 347, 433, 432,
        392, 287, 443, 436, 317, 336, 426, 313, 438, 316, 439, 419, 298, 414, 267, 265,
        282, 295, 433, 426, 436, 13, 436, 438, 316, 439, 419, 298, 414, 267, 265, 282,
        295, 433, 432, 436, 274, 287, 336, 426, 313, 438, 316, 439, 419, 298, 414, 267,
        265, 282, 295, 433, 426, 436, 13, 436, 441, 462, 432, 317, 432, 436, 317, 336,
    ], 0.0279),
    ('The little dog was sad because', [1, 291, 376, 400, 428, 286, 296, 418, 329, 429, 412, 425, 372], [
        281, 401, 396, 267, 337, 335, 345, 267, 422, 419, 426, 385, 328, 432, 281, 394,
        261, 370, 268, 414, 444, 322, 265, 298, 420, 277, 264, 426, 291, 268, 414, 444,
        286, 399, 262, 429, 295, 266, 269, 279, 292, 416, 439, 413, 409, 416, 327, 263,
        415, 294, 267, 400, 426, 13, 434, 260, 268, 414, 422, 336, 432, 313, 455, 289,
        439, 413, 263, 304, 420, 422, 432, 376, 268, 414, 422, 426, 359, 263, 290, 421,
        281, 421, 427, 364, 426, 436, 291, 268, 414, 422, 336, 432, 313, 442, 263, 290,
        421, 281, 421, 427, 364, 272, 417, 264, 312, 426, 436, 291, 268, 414, 422, 286,
        393, 267, 281, 421, 427, 265, 268, 414, 422, 426, 13, 434, 260, 268, 414, 422,
    ], 0.0177),
    ('One day, a big bear', [1, 385, 328, 432, 261, 370, 329, 295], [
        395, 368, 302, 263, 377, 267, 265, 329, 412, 402, 335, 345, 357, 426, 342, 394,
        261, 370, 432, 352, 266, 268, 388, 426, 291, 268, 388, 286, 399, 262, 415, 271,
        422, 269, 262, 415, 271, 422, 426, 368, 302, 391, 266, 267, 337, 335, 265, 268,
        388, 426, 346, 391, 266, 267, 337, 335, 265, 268, 388, 426, 13, 445, 302, 336,
        432, 313, 446, 287, 432, 278, 316, 439, 419, 298, 414, 267, 265, 329, 412, 402,
        426, 436, 368, 302, 336, 432, 313, 452, 406, 432, 359, 280, 303, 337, 335, 364,
        426, 436, 342, 337, 266, 267, 428, 316, 386, 269, 381, 272, 379, 426, 368, 323,
        265, 416, 432, 262, 287, 316, 415, 299, 318, 416, 411, 444, 427, 411, 429, 413,
    ], 0.0122),
]
