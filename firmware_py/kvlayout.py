# The KV cache's names, defaults, layout and sizing rule: everything about a cache
# that holds without one (host/budget.py, tools and firmware boot share it). Kept
# apart from kv.py so the one module the decode loop runs stays small to compile
# (a board loads .mpy; the unix port compiles source, and a big module fragments
# the heap it leaves for the pool).
from firmware_py.compat import const
from firmware_py.pool import META_BYTES_PER_BLOCK, POOL_FIXED_BYTES, VIEW_BYTES_PER_BLOCK
from firmware_py.status import INT_MAX

HDR_BYTES = const(8)  # per-slot header in a block: position + 1, score (uint32 each)

# One home for the cache's names and defaults (host/budget.py and tools import these)
# element types of cached K/V: "int4" is KIVI's layout (keys per channel over a block's
# tokens with a full-precision residual, values per token), "int4tok" the per-token one
DTYPES = ("fp32", "fp16", "int8", "int4", "int4tok")
POLICIES = ("full", "window", "sinks", "h2o")  # what a sequence does at its budget
SINKS = const(4)  # default sink tokens of the sinks and h2o policies (StreamingLLM's 4)
H2O_RECENT_PCT = const(50)  # h2o default: half the budget is the recent window (H2O's equal split)
WATERMARK_PCT = const(80)  # default watermark: fires when 80 % of the budget is filled
GROUP = const(32)  # default int4 scale group (KIVI's 32), cut to a divisor of head_dim
TOKENS_PER_BLOCK = const(16)  # default tokens per pool block (vLLM's 16)

KV_FIXED_BYTES = const(2048)  # KVCache object + its per-sequence arrays (measured ~1.3 KiB for 4 seqs)
KIVI_FIXED_BYTES = const(64)  # int4 (KIVI): the residual's two buffers' and the fold scratch's GC rounding
# int4 (KIVI) key parameters, one uint32 word per (block, layer, channel) (docs/memory.md):
# bits 0-7 E + KP_EBIAS, bits 8-19 LO + KP_LO_BIAS, bits 20-28 STEP; dequantized key =
# (LO + q * STEP) * 2**E, q = 0..15 (the unsigned nibble). Values are fixed point with
# magnitudes below 2**KP_BITS units of 2**E (E from the largest key of the channel).
KP_BITS = const(11)
KP_EBIAS = const(136)
KP_LO_BIAS = const(2048)


class KVError(ValueError):
    # a caller's mistake in configuring a cache or a sequence; str() is one line
    pass


# (policy number, sinks, recent) that open() uses for `policy` at a budget of cap
# tokens (recent 0 under h2o: the default split), or KVError naming the rule broken;
# configuration only (allocates)
def policy_params(policy, cap, sinks=SINKS, recent=0):
    if policy not in POLICIES:
        raise KVError("policy must be one of %s, got %r" % (", ".join(POLICIES), policy))
    pol = POLICIES.index(policy)
    for name, v in (("budget", cap), ("sinks", sinks), ("recent", recent)):
        if v.__class__ is not int:
            raise KVError("%s must be an int, got %r" % (name, v))
    if cap < 1:
        raise KVError("budget must be >= 1 token, got %d" % cap)
    if policy == "full" or policy == "window":
        return pol, 0, 0
    if policy == "sinks":
        if not 0 < sinks < cap:
            raise KVError("sinks must be 1..%d for a budget of %d, got %d" % (cap - 1, cap, sinks))
        return pol, sinks, cap - sinks
    if recent == 0:
        recent = cap * H2O_RECENT_PCT // 100
    if sinks < 0 or recent < 1 or sinks + recent >= cap:
        raise KVError("h2o needs sinks >= 0, recent >= 1 and sinks + recent < budget (%d), got %d + %d"
                      % (cap, sinks, recent))
    return pol, sinks, recent


# the smallest budget open() accepts for policy with `sinks` sinks and the default
# h2o split; KVError for an unknown policy; configuration only
def min_budget(policy, sinks=SINKS):
    if policy not in POLICIES:
        policy_params(policy, 1)  # the one-line error for an unknown policy
    cap = 1
    while cap < INT_MAX:
        try:
            policy_params(policy, cap, sinks)
            return cap
        except KVError:
            cap += 1
    raise KVError("no budget fits policy %s with %d sinks" % (policy, sinks))


class Layout:
    # byte layout of one token and one block for a model shape and element type
    def __init__(self, n_layers, n_kv_heads, head_dim, dtype="fp32", group=GROUP, tokens_per_block=TOKENS_PER_BLOCK):
        if dtype not in DTYPES:
            raise KVError("kv dtype must be one of %s, got %r" % (", ".join(DTYPES), dtype))
        for name, v in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                        ("group", group), ("tokens_per_block", tokens_per_block)):
            if v < 1:
                raise KVError("%s must be >= 1, got %d" % (name, v))
        self.n_layers = n_layers  # L
        self.n_kv_heads = n_kv_heads  # H
        self.head_dim = head_dim  # D
        self.kv_dim = kv_dim = n_kv_heads * head_dim  # elements of K (or V) per layer per token
        self.dtype = dtype  # element type name
        self.tokens_per_block = t = tokens_per_block  # T
        self.kivi = kivi = dtype == "int4"  # KIVI: per-channel keys per block, fp32 residual
        g = 0  # scale groups per head (0: fp32/fp16)
        if dtype == "int8":
            g = 1
        elif dtype == "int4" or dtype == "int4tok":
            if head_dim % 2:
                raise KVError("%s needs an even head_dim, got %d" % (dtype, head_dim))
            # the largest divisor of head_dim not above the requested group (48 -> 24)
            group = min(group, head_dim)
            while head_dim % group:
                group -= 1
            g = head_dim // group
        self.group = head_dim // g if g else 0  # elements sharing one scale (int4: divides D; KIVI: V only)
        self.groups_per_head = g  # scales per head per token (0: fp32/fp16)
        if dtype == "fp32":
            self.data_bytes = kv_dim * 4  # bytes of K (or V) data per layer per token (as stored)
        elif dtype == "fp16":
            self.data_bytes = kv_dim * 2
        elif dtype == "int8":
            self.data_bytes = kv_dim
        else:
            self.data_bytes = kv_dim // 2
        self.scale_bytes = n_kv_heads * g * 4  # bytes of V (and, but for KIVI, K) scales per layer per token
        if kivi:
            # the caller's layer row (write/append source, read destination): K fp32, V int4
            self.v_off = kv_dim * 4  # V data offset in a layer_row
            self.vs_off = self.v_off + _round4(kv_dim // 2)  # V scales offset in a layer_row
            self.ks_off = self.vs_off  # no per-token K scales (kept for the other layouts' code)
            self.layer_row = self.vs_off + self.scale_bytes  # bytes per (layer, token) of the caller's row
            # the row stored in a block: [V data][pad][V scales][K nibbles][pad]; the V part
            # is the caller's row from v_off on, the same words
            self.v_words = (_round4(kv_dim // 2) + self.scale_bytes) // 4  # words of the V part
            self.kq_off = self.v_words * 4  # K nibbles (unsigned 0..15) offset in a stored row
            self.store_row = self.kq_off + _round4(kv_dim // 2)  # bytes per (layer, slot) in a block
            self.kp_bytes = n_layers * kv_dim * 4  # K parameters per block: [L][kv_dim] words
            # published figure: data + V scales per token, the block's K parameters over its T tokens
            self.kv_bytes_per_token = n_layers * (2 * self.data_bytes + self.scale_bytes) + (self.kp_bytes + t - 1) // t
            # per sequence: K of the current block's tokens in fp32 ([L][T][kv_dim]) + a flag per slot
            self.residual_bytes = n_layers * t * kv_dim * 4 + t
        else:
            # the published figure: 2 x L x H x D x bytes, plus the scales
            self.kv_bytes_per_token = 2 * n_layers * (self.data_bytes + self.scale_bytes)
            self.v_off = self.data_bytes  # V data offset in a layer_row
            self.ks_off = _round4(2 * self.data_bytes)  # K scales offset in a layer_row
            self.vs_off = self.ks_off + self.scale_bytes  # V scales offset in a layer_row
            self.layer_row = _round4(self.vs_off + self.scale_bytes)  # bytes per (layer, token)
            self.store_row = self.layer_row  # stored as given
            self.v_words = 0
            self.kq_off = 0
            self.kp_bytes = 0
            self.residual_bytes = 0
        self.row_bytes = n_layers * self.layer_row  # bytes of one token row for append()
        self.kp_off = t * HDR_BYTES  # K parameters' offset in a block (KIVI; 0 bytes otherwise)
        self.rows_off = self.kp_off + self.kp_bytes  # first stored row's offset in a block
        self.token_bytes = HDR_BYTES + n_layers * self.store_row  # pool bytes per token, header included
        self.block_bytes = t * self.token_bytes + self.kp_bytes  # pool block size

    # byte offset of (layer, slot r) inside a block; O(1)
    def row_offset(self, layer, r):
        return self.rows_off + (layer * self.tokens_per_block + r) * self.store_row

    # the layout as a dict (allocates: reporting path only)
    def to_dict(self):
        return {
            "n_layers": self.n_layers, "n_kv_heads": self.n_kv_heads, "head_dim": self.head_dim,
            "dtype": self.dtype, "group": self.group, "tokens_per_block": self.tokens_per_block,
            "kv_bytes_per_token": self.kv_bytes_per_token, "layer_row": self.layer_row,
            "token_bytes": self.token_bytes, "block_bytes": self.block_bytes, "store_row": self.store_row,
            "kp_bytes": self.kp_bytes, "residual_bytes": self.residual_bytes,
        }


# n rounded up to a multiple of 4
def _round4(n):
    return (n + 3) & ~3


# The sizing rule host/budget.py and firmware boot share: heap bytes one pool block
# costs with its bookkeeping (free-list/refcount/owner, its view, a block-table entry
# per sequence, and the h2o position map)
def bytes_per_block(layout, max_seqs=1, h2o=False):
    per_seq = 2 + (8 * layout.tokens_per_block if h2o else 0)  # table 'h'; pos_map 'i', 2 per slot
    return layout.block_bytes + META_BYTES_PER_BLOCK + VIEW_BYTES_PER_BLOCK + max_seqs * per_seq


# heap bytes a cache of max_seqs sequences costs besides its blocks: the object and its
# arrays, plus (int4, KIVI) every sequence's residual and the fold's scratch
def fixed_bytes(layout, max_seqs=1):
    if not layout.kivi:
        return KV_FIXED_BYTES
    return KV_FIXED_BYTES + KIVI_FIXED_BYTES + max_seqs * layout.residual_bytes + 4 * layout.tokens_per_block


# blocks a heap of avail free bytes can hold as one pool + cache
def blocks_for(avail, layout, max_seqs=1, h2o=False):
    n = (avail - POOL_FIXED_BYTES - fixed_bytes(layout, max_seqs)) // bytes_per_block(layout, max_seqs, h2o)
    return n if n > 0 else 0


# heap bytes a pool of n_blocks + its cache needs
def heap_for(n_blocks, layout, max_seqs=1, h2o=False):
    return POOL_FIXED_BYTES + fixed_bytes(layout, max_seqs) + n_blocks * bytes_per_block(layout, max_seqs, h2o)
