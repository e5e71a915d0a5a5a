# The CPU cost model: the compute time of one decode step, per kind of kernel, from a
# board profile's "cpu": {"cost": {KIND: {PARAM: {"value": int, "source": "..."}}}}
# block (validated by firmware_py/board.py; docs/calibration.md says where each figure
# comes from). Memory time is not in here: the bandwidth tracker (bandwidth.DecodeTraffic)
# charges it, and the two add (an in-order core stalls on its cache misses).
#
#   m = cpucost.for_session(board, "dsp", session)    # or for_config(board, kind, cfg)
#   session.cpu = m        # decode.Session charges m.layer_us(n_kv) and m.final_us()
#
# Every result is an integer; the parameters are millicycles (_mcyc) at the board's clock,
# so cycles / MHz is µs and millicycles / MHz is ns. layer_us and final_us carry the ns
# each call rounds off into the next call, so N calls sum exactly to the ns total // 1000.
# Runs on MicroPython too (integer arithmetic only; big ints only at construction).

KINDS = ("c", "dsp", "asm", "viper", "bytecode")
KIND_TITLES = {
    "c": "scalar C (compiled loops, the FPU's madd)",
    "dsp": "C with ESP-DSP dot products (both cores where the board has two)",
    "asm": "hand-written assembly (ESP-DSP dot products, fast division and exp)",
    "viper": "MicroPython @viper kernels",
    "bytecode": "plain MicroPython bytecode",
}
# the parameters every kind of a profile gives (docs/calibration.md has their meaning)
PARAMS = ("mac_f32_mcyc", "mac_i8_mcyc", "row_mcyc", "matvec_mcyc", "attn_mac_mcyc", "attn_pos_mcyc",
          "exp_mcyc", "div_mcyc", "norm_el_mcyc", "rope_el_mcyc", "elem_mcyc", "sample_el_mcyc",
          "layer_mcyc", "token_mcyc", "cores", "split_permille",
          "kv_rd_fp16_mcyc", "kv_rd_int8_mcyc", "kv_rd_int4_mcyc", "kv_rd_int4tok_mcyc",
          "kv_wr_fp16_mcyc", "kv_wr_int8_mcyc", "kv_wr_int4_mcyc", "kv_wr_int4tok_mcyc")
SOURCE_KINDS = ("measured", "published", "estimate", "fit")  # a source starts with one of these and ":"
WEIGHT_DTYPES = ("fp32", "int8", "int4")
# KV element types (kvlayout.DTYPES): each but fp32 adds kv_rd_<type>_mcyc per K/V element
# read (dequantized) and kv_wr_<type>_mcyc per K/V element written (quantized), over the
# fp32 copy the other figures already price
KV_DTYPES = ("fp32", "fp16", "int8", "int4", "int4tok")
PARAM_MAX = 10 ** 12  # millicycles (1,000 s at 1 MHz): past it a figure is a typo


class CostError(ValueError):
    # a cost model that cannot be built (unknown kind, a board without its figures); one line
    pass


# the figure kind of a source text: "measured", "published", "estimate" or "fit"; "" if none
def source_kind(src):
    for k in SOURCE_KINDS:
        if src.startswith(k + ":"):
            return k
    return ""


class CostModel:
    # one board's figures for one kind of kernel, applied to one model shape
    def meter(self, kernel, slice_us):
        # the metered slicer (Meter) a decode on kernel charges its units through
        return Meter(self, kernel, slice_us)

    def __init__(self, board, kind, cfg, weights_dtype="fp32", kv_dtype="fp32"):
        if kind not in KINDS:
            raise CostError("cpu cost kind must be one of %s, got %r" % (", ".join(KINDS), kind))
        if weights_dtype not in WEIGHT_DTYPES:
            raise CostError("weights dtype must be one of %s, got %r" % (", ".join(WEIGHT_DTYPES), weights_dtype))
        if kv_dtype not in KV_DTYPES:
            raise CostError("kv dtype must be one of %s, got %r" % (", ".join(KV_DTYPES), kv_dtype))
        costs = getattr(board, "cpu_cost", None) or {}
        if not costs:
            raise CostError("board %s has no cpu cost figures (its profile has no cpu.cost block)" % board.name)
        if kind not in costs:
            raise CostError("board %s has no cpu cost figures for kind %s (it has: %s)"
                            % (board.name, kind, ", ".join(k for k in KINDS if k in costs)))
        self.kind = kind
        self.board_name = board.name
        self.mhz = board.cpu_mhz
        self.v = costs[kind]  # {param: int}
        self.src = board.cpu_cost_source[kind]  # {param: source}
        self.weights_dtype = weights_dtype
        self.kv_dtype = kv_dtype
        self.cfg = cfg
        v = self.v
        d, hd, kvd, h = cfg.dim, cfg.hidden_dim, cfg.kv_dim, cfg.n_heads
        mac = v["mac_f32_mcyc"] if weights_dtype == "fp32" else v["mac_i8_mcyc"]
        kv_rd = v["kv_rd_%s_mcyc" % kv_dtype] if kv_dtype != "fp32" else 0
        kv_wr = v["kv_wr_%s_mcyc" % kv_dtype] if kv_dtype != "fp32" else 0
        cores = v["cores"]
        sp = v["split_permille"]
        # parallel work is scaled by ((1000 - sp) * cores + sp) / (1000 * cores)
        self._pnum = (1000 - sp) * cores + sp
        self._pden = 1000 * cores
        # one layer: seven matvecs (wq, wk, wv, wo, w1, w3, w2)
        macs = d * (2 * d + 2 * kvd + 3 * hd)
        rows = 3 * d + 2 * kvd + 2 * hd
        self._layer_par = macs * mac + rows * v["row_mcyc"]  # split over the cores
        # serial: two rmsnorms, RoPE on q and k, residual adds + SwiGLU product, SiLU's
        # exp and division per hidden element, the dispatch of 7 matvecs, the layer's fixed
        # cost, and the new token's K and V row quantized into the KV element type
        self._layer_ser = (2 * d * v["norm_el_mcyc"] + (d + kvd) * v["rope_el_mcyc"]
                           + (2 * d + hd) * v["elem_mcyc"] + hd * (v["exp_mcyc"] + v["div_mcyc"])
                           + 7 * v["matvec_mcyc"] + v["layer_mcyc"] + 2 * kvd * kv_wr)
        # attention per cached position (all heads): q.k and the weighted sum of V, the
        # per-position work, one exp and two divisions (score scale, softmax normalize),
        # and the position's K and V row dequantized once (kv_dim elements each)
        self._pos_par = (h * (2 * cfg.head_dim * v["attn_mac_mcyc"] + v["attn_pos_mcyc"]
                              + v["exp_mcyc"] + 2 * v["div_mcyc"]) + 2 * kvd * kv_rd)
        # final: rmsnorm, the classifier (vocab rows of dim), sampling over the vocabulary
        self._final_par = cfg.vocab_size * (d * mac + v["row_mcyc"])
        self._final_ser = (d * v["norm_el_mcyc"] + cfg.vocab_size * v["sample_el_mcyc"]
                           + v["matvec_mcyc"] + v["token_mcyc"])
        # precomputed once (big ints allowed here): one layer at n_kv cached tokens is
        # base + n_kv * pos, each held as whole µs plus ns below a µs, so the hot calls
        # (layer_us, final_us) add and multiply small ints only (no allocation on a 32-bit
        # port, where small ints stop at 2**30); the per-position part is rounded to a ns
        pn, pd, mhz = self._pnum, self._pden, self.mhz
        base = (self._layer_par * pn // pd + self._layer_ser) // mhz
        pos = self._pos_par * pn // (pd * mhz)
        fin = (self._final_par * pn // pd + self._final_ser) // mhz
        self._base_us, self._base_ns = base // 1000, base % 1000
        self._pos_us, self._pos_ns = pos // 1000, pos % 1000
        self._fin_us, self._fin_ns = fin // 1000, fin % 1000
        self._rem_l = 0  # ns below a µs carried from the previous layer_us
        self._rem_f = 0  # ... from the previous final_us

    def layer_ns(self, n_kv):
        # ns of one layer's compute with n_kv cached tokens (the new one included); no carry
        if n_kv < 0:
            n_kv = 0
        return (self._base_us + n_kv * self._pos_us) * 1000 + self._base_ns + n_kv * self._pos_ns

    def final_ns(self):
        # ns of the final norm, the classifier and the sampling; no carry
        return self._fin_us * 1000 + self._fin_ns

    def token_ns(self, n_kv):
        # ns of one whole token's compute at KV length n_kv
        return self.cfg.n_layers * self.layer_ns(n_kv) + self.final_ns()

    def layer_us(self, n_kv):
        # µs of one layer (decode.Session.cpu); the sub-µs remainder carries to the next call;
        # small ints only (n_kv * pos_us and n_kv * 999 stay far below 2**30)
        if n_kv < 0:
            n_kv = 0
        t = self._base_ns + n_kv * self._pos_ns + self._rem_l
        c = t // 1000
        self._rem_l = t - c * 1000
        return self._base_us + n_kv * self._pos_us + c

    def final_us(self):
        # µs of the final step (decode.Session.cpu); remainder carried; small ints only
        t = self._fin_ns + self._rem_f
        c = t // 1000
        self._rem_f = t - c * 1000
        return self._fin_us + c

    def figures(self):
        # every parameter used: {name: {"value", "source", "kind"}}, plus the board clock
        # (the kv_rd/kv_wr figures of every KV type: the model uses its kv_dtype's, fp32 none)
        out = {}
        for p in PARAMS:
            s = self.src[p]
            out[p] = {"value": self.v[p], "source": s, "kind": source_kind(s)}
        out["mhz"] = {"value": self.mhz, "source": "published: board %s profile cpu.mhz" % self.board_name,
                      "kind": "published"}
        return out


def for_config(board, kind, cfg, weights_dtype="fp32", kv_dtype="fp32"):
    # the cost model of a model shape cfg (llama2c.Config) with weights_dtype weights and
    # a KV cache of kv_dtype elements
    return CostModel(board, kind, cfg, weights_dtype, kv_dtype)


def for_session(board, kind, session):
    # the cost model of a loaded decode.Session (its shape, weight type and KV element type)
    # under "viper": kvrtos's own firmware has viper kernels on its integer path only
    # (qmodel.QForward: int8 weights with int8 KV); any other pair runs the float path
    # (kernels.Plain, quant), all of it bytecode, so it is priced by the bytecode figures
    w = session.weights
    dt = "int8" if getattr(w, "dtype", "fp32") == "int8" else "fp32"
    lay = getattr(session, "layout", None)
    kvd = lay.dtype if lay is not None else "fp32"
    if kind == "viper" and not (dt == "int8" and kvd == "int8") and "bytecode" in (getattr(board, "cpu_cost", None) or {}):
        kind = "bytecode"
    return CostModel(board, kind, session.cfg, dt, kvd)


class Meter:
    # the emulator's slicer (slicer.Slicer's interface): each unit of a sliced decode step
    # (slicer.U_*) is charged to the kernel's virtual clock at this cost model's price when
    # the step reports it, then the slicer looks at the clock, so the slices the kernel
    # sees are the ones the board's clock would give. What one token's units add up to is
    # token_ns at its KV length: every figure of layer_ns and final_ns, each charged where
    # the step does that work; the fixed costs (layers x layer_mcyc + token_mcyc: what a
    # step costs beyond its priced parts, glue spread through the code) spread evenly over
    # the step's multiply-adds, so no unit carries a lump the board does not have. Sampling
    # (vocab x sample_el_mcyc) is charged only for a token that is sampled. On top of
    # token_ns (it has no figure for them), with rope "cache": the slots' ranks (U_RANK,
    # both paths) at the elementwise figure, and the plain path's table of rotations (its
    # step's U_ROPE units before the first layer) at RoPE's. Runs on
    # CPython (big ints): the emulator's; a board slices by its own clock
    def __init__(self, cost, kernel, slice_us):
        from firmware_py.slicer import Slicer  # noqa: PLC0415 - the emulator's only

        self.cost = cost
        self.k = kernel
        self.sl = Slicer(kernel, slice_us)
        v = cost.v
        cfg = cost.cfg
        pn, pd = cost._pnum, cost._pden
        # prices in units of 1 / (2 x pd x mhz x 1000) µs: parallel work x pn, serial x pd,
        # the x 2 so that each of attention's two passes takes half of a position's price
        # and x macs (the step's multiply-adds), so that the fixed costs' share of one is whole
        d, kvd, hd = cfg.dim, cfg.kv_dim, cfg.hidden_dim
        macs = cfg.n_layers * d * (2 * d + 2 * kvd + 3 * hd) + cfg.vocab_size * d
        self.den = 2 * pd * cost.mhz * 1000 * macs
        mac = v["mac_f32_mcyc"] if cost.weights_dtype == "fp32" else v["mac_i8_mcyc"]
        kv_wr = v["kv_wr_%s_mcyc" % cost.kv_dtype] if cost.kv_dtype != "fp32" else 0
        glue = 2 * pd * (cfg.n_layers * v["layer_mcyc"] + v["token_mcyc"])  # per multiply-add, serial
        self.p_mac = 2 * pn * mac * macs + glue
        self.p_row = 2 * pn * v["row_mcyc"] * macs
        self.p_call = (2 * pd * v["matvec_mcyc"] * macs,) * 2  # [in a layer, the classifier]
        self.p_norm = 2 * pd * v["norm_el_mcyc"] * macs
        self.p_rope = 2 * pd * v["rope_el_mcyc"] * macs
        self.p_kvw = 2 * pd * kv_wr * macs
        self.p_elem = 2 * pd * v["elem_mcyc"] * macs
        self.p_silu = 2 * pd * (v["exp_mcyc"] + v["div_mcyc"]) * macs
        self.p_sample = 2 * pd * v["sample_el_mcyc"] * macs
        # a sliced integer step attends one query head at a time (U_ATTH): every price and
        # the unit x n_heads, so that one head's share of a slot-pass is a whole number
        nh = cfg.n_heads
        self.den *= nh
        self.p_atth = pn * cost._pos_par * macs  # one head's pass over one slot: its share of half a position
        for name in ("p_mac", "p_row", "p_norm", "p_rope", "p_kvw", "p_elem", "p_silu", "p_sample"):
            setattr(self, name, nh * getattr(self, name))
        self.p_call = (nh * self.p_call[0], nh * self.p_call[1])
        self.rem = 0  # what the charges so far rounded off (below one µs), carried
        self.charged_us = 0  # µs charged in all

    @property
    def us(self):
        return self.sl.us

    @property
    def yields(self):
        return self.sl.yields

    # the price of a unit (kind, a, b), in self.den-ths of a µs
    def price(self, kind, a, b):
        if kind == 3:  # U_ROWS: a rows of b columns
            return a * (b * self.p_mac + self.p_row)
        if kind == 11:  # U_COLS: a columns of a row; b 1: its last (the row's price)
            return a * self.p_mac + b * self.p_row
        if kind == 6 or kind == 10:  # U_ATT (the plain path's units), U_ATTH (one head): a head-slot-passes, one price each
            return a * self.p_atth
        if kind == 2:  # U_CALL
            return self.p_call[0 if a else 1]
        if kind == 1:
            return a * self.p_norm
        if kind == 4:
            return a * self.p_rope
        if kind == 5:  # U_KVW: a elements; b 1: one of a quantized group's two passes (half each)
            return a * self.p_kvw >> b
        if kind == 7:
            return a * self.p_elem
        if kind == 8:
            return a * (self.p_silu + b * self.p_elem)
        if kind == 9:
            return a * self.p_sample
        if kind == 12:  # U_RANK: a comparisons, at an elementwise op's price (no figure of their own)
            return a * self.p_elem
        return 0

    def ahead(self, n):
        return self.sl.ahead(n)

    def ahead_us(self, us):
        return self.sl.ahead_us(us)

    def ahead_call(self):
        return self.sl.ahead_call()

    def ahead_h(self, n):
        return self.sl.ahead_h(n)

    def ahead_unit(self, kind):
        return self.sl.ahead_unit(kind)

    def att_range(self, n, least):
        return self.sl.att_range(n, least)

    def ahead_r(self, n, pas):
        return self.sl.ahead_r(n, pas)

    def step(self, kind, a, b):
        t = self.rem + self.price(kind, a, b)
        us = t // self.den
        self.rem = t - us * self.den
        if us > 0:
            self.charged_us += us
            self.k.charge(us)
        return self.sl.step(kind, a, b)

