# Next-token choice from logits: greedy (temperature 0), or temperature + top-p
# (nucleus) sampling driven by a seeded xorshift32, so the same seed gives the same
# tokens on CPython and on MicroPython (64- and 32-bit). Accepts float logits
# (array('f'), a list, a numpy array) and fixed-point int logits (array('i') with
# frac_bits fractional bits, qmodel's).
#
# Sampling is integer arithmetic on small ints (below 2**30, so none is a heap object on a
# 32-bit port): each token's weight is ONE x 2**-e with e = (max - logit) x log2(e) / T,
# taken from a 256-entry table of 2**(-f/256) (steps of 0.27 %) and a shift; then the
# top-p cut, the cumulative sums and the draw. Float logits are first turned into the
# same fixed point (16 fraction bits), one float step per token, so a float rounding
# difference between interpreters can only matter where it moves a logit across 2**-16
# (the per-temperature multiplier is computed once in floats: a single-precision port may
# round it one unit apart from the unix ports' doubles at some temperatures).
# Costs: greedy O(vocab); sampling O(vocab + k^2) for the k tokens above run.c's top-p
# cutoff (most tokens fall below it). Neither allocates on int logits (heap_lock-tested
# on the 32-bit port, tests/firmware/fw_sample.py); float logits allocate their floats.
from firmware_py.compat import const, new_array

_ONE = const(65536)  # weight of the most likely token
_LIMIT = const(0x3FFFFFFF)  # weights sum below this (a small int on the ESP32)
_MASK32 = const(0xFFFFFFFF)  # seed range
# the settings' ranges, which every front end (generate, emulate, the app config) checks
# with these: temperature 0 (greedy) .. TEMPERATURE_MAX, top_p in (0, 1], seed 0 .. SEED_MAX
TEMPERATURE_MAX = 1000000.0
SEED_MAX = _MASK32
_SEED0 = const(0x2545F491)  # the state for seed 0 (xorshift's state must not be 0)
_FRAC = const(16)  # fraction bits of (max - logit) as the weight step reads it
_ESH = const(25)  # fraction bits of the base-2 exponent e (e x 2**25 < 17 x 2**25 < 2**30)
_EMAX = const(570425344)  # 17 << 25: from 2**-17 of ONE on, a weight is 0
_STEP = const(1070838486)  # 2**(-1/256) x 2**30, rounded: the table's ratio
_PBITS = const(15)  # fraction bits of top_p (q = top_p x 2**15)
_LOG2E = 1.4426950408889634  # log2(e)


TABLE_BYTES = const(1024)  # the exponent table of a sampled (temperature > 0) Sampler: 256 x 4 B


class SamplerError(ValueError):
    # a bad sampler setting; one line
    pass


class Sampler:
    # sampling settings, the RNG state and the integer work arrays (allocated here)
    def __init__(self, vocab_size, temperature=0.0, top_p=1.0, seed=0):
        if vocab_size < 1:
            raise SamplerError("vocab_size must be >= 1, got %d" % vocab_size)
        if not temperature >= 0.0 or temperature != temperature or temperature > TEMPERATURE_MAX:
            raise SamplerError("temperature must be a number in 0..%g, got %r" % (TEMPERATURE_MAX, temperature))
        if not 0.0 < top_p <= 1.0:
            raise SamplerError("top_p must be in (0, 1], got %r" % top_p)
        if seed < 0 or seed > _MASK32:
            raise SamplerError("seed must be 0..%d, got %d" % (_MASK32, seed))
        self.vocab_size = vocab_size  # tokens
        self.temperature = temperature  # 0: greedy
        self.top_p = top_p  # nucleus mass kept (1: all tokens)
        x = (seed & _MASK32) or _SEED0  # xorshift32 state, 1 .. 2**32 - 1, kept as two 16-bit halves:
        self.state_hi = x >> 16  # small ints on a 32-bit port, where a state of 2**30 or more would be a
        self.state_lo = x & 0xFFFF  # heap int held between tokens (the free heap would swing by 32 B)
        one = _LIMIT // vocab_size
        self.one = one if one < _ONE else _ONE  # integer weight of probability "the most likely"
        self.q_p = int(top_p * (1 << _PBITS) + 0.5)  # top_p in 1/2**15 (2**15: keep all)
        self.weight = new_array("i", vocab_size)  # [token] integer weight of the current step
        self.cand = new_array("i", vocab_size)  # candidate tokens of the top-p cut, by weight descending
        # the exponent: e x 2**25 = (d >> r) x mul for d = (max - logit) in 1/2**16; r drops
        # the low bits a high temperature cannot see, so mul keeps 12 or more significant bits
        self.r = 0  # right shift of d
        self.mul = 1  # exponent per unit of (d >> r), in 1/2**25
        self.dmax = 1  # (d >> r) from which a weight is 0
        self.table = None  # [f] ONE x 2**(-f/256), integers (1 KB; greedy has none)
        self.start((0,))  # the state of a pick in parts, made here: start() then only rebinds it (no allocation)
        if temperature > 0.0:
            self.table = new_array("i", 256)
            x = _LOG2E * (1 << _ESH) / (temperature * (1 << _FRAC))
            r = 0
            while r < 28 and x * (1 << r) < 4096.0:
                r += 1
            m = x * (1 << r)
            m = _EMAX if m >= _EMAX else int(m + 0.5)
            self.r = r
            self.mul = m if m > 0 else 1
            self.dmax = (_EMAX + self.mul - 1) // self.mul
            v = 1 << 30  # 2**(-f/256) in 1/2**30, stepped in integers: the same table everywhere
            for f in range(256):
                self.table[f] = (v * self.one + (1 << 29)) >> 30
                v = (v * _STEP + (1 << 29)) >> 30

    # next xorshift32 output (Marsaglia 13/17/5) in 0 .. 2**30 - 1, on the 16-bit halves; O(1)
    def rand(self):
        hi = self.state_hi
        lo = self.state_lo
        hi ^= ((hi << 13) | (lo >> 3)) & 0xFFFF  # x ^= x << 13
        lo ^= (lo << 13) & 0xFFFF
        lo ^= hi >> 1  # x ^= x >> 17
        hi ^= ((hi << 5) | (lo >> 11)) & 0xFFFF  # x ^= x << 5
        lo ^= (lo << 5) & 0xFFFF
        self.state_hi = hi
        self.state_lo = lo
        return (hi << 14) | (lo >> 2)

    # the next token for these logits (frac_bits: int logits in fixed point); O(vocab)
    def pick(self, logits, frac_bits=None):
        self.start(logits)
        t = self.run(logits, frac_bits, 0x3FFFFFFF)
        while t < 0:  # a pick needs at most one run of that size; a guard, never taken
            t = self.run(logits, frac_bits, 0x3FFFFFFF)
        return t

    # begin a pick that run() does in parts (the decode's sliced step: one part per unit of
    # its slice); O(1), no allocation on int logits
    def start(self, logits):
        self.ph = 0  # phase: 0 argmax, 1 weights, 2 the draw or the top-p candidates, 3 their sum, 4 the draw among them
        self.i = 0  # next index of the phase's scan
        self.j = -1  # phase 2 with top-p: the slot a candidate is being inserted at (-1: none)
        self.best = 0  # the most likely token (phase 0's result)
        self.bv = logits[0]  # its logit
        self.tot = 0  # sum of the weights (phase 1)
        self.k = 0  # candidates kept (phase 2, top-p)
        self.rem = 0  # the draw's remainder
        self.lim = 0  # phase 2: cut; phase 3: the mass kept (top-p)
        self.cum = 0  # phase 3: cumulative weight of the first candidates
        self.last = 0  # phase 4: the last candidate the draw may reach
        self.el = 0  # logits of the vocabulary the last run() weighed or scanned (what the emulator prices)

    # up to about `most` steps of the pick start() began (a step: one logit scanned or
    # weighed, or one candidate moved); the token once the pick is done, else -1. The same
    # token as one whole pick whatever the parts. No allocation on int logits
    def run(self, logits, fb, most):
        n = self.vocab_size
        self.el = 0
        if most < 1:  # at least one step: a part always makes progress
            most = 1
        if self.ph == 0:
            i = self.i
            e = i + most if most < n - i else n
            best = self.best
            bv = self.bv
            if hasattr(logits, "argmax"):  # numpy (CPython): the part's first maximum
                j = int(logits[i:e].argmax())
                v = logits[i + j]
                if v > bv or (v != v and bv == bv):  # a NaN is the part's argmax: kept, as numpy's argmax would
                    bv = v
                    best = i + j
            else:
                for j in range(i, e):
                    if logits[j] > bv:
                        bv = logits[j]
                        best = j
            self.best = best
            self.bv = bv
            most -= e - i
            if self.temperature == 0.0:
                self.el = e - i
            self.i = e
            if e < n:
                return -1
            if self.temperature == 0.0:
                return best
            if fb is None:
                _finite(float(logits[best]), best)
            self.ph = 1
            self.i = 0
            if most <= 0:
                return -1
        if self.ph == 1:
            i = self.i
            if i < n:
                e = i + most if most < n - i else n
                if hasattr(logits, "dtype"):
                    self.tot += self._weights_np(logits, self.best, fb, i, e)
                elif fb is None:
                    self.tot += self._weights_float(logits, self.best, i, e)
                else:
                    self.tot += self._weights_int(logits, self.best, fb, i, e)
                self.el += e - i
                most -= e - i
                self.i = e
                if e < n:
                    return -1
            self.ph = 2
            self.i = 0
            total = self.tot
            if self.q_p >= (1 << _PBITS):
                self.rem = self.rand() % total
            else:  # run.c's cut: a token below (1 - top_p) / (n - 1) of the mass cannot be in the nucleus
                self.lim = _mulfrac(total, (1 << _PBITS) - self.q_p) // (n - 1) if n > 1 else 0
            if most <= 0:
                return -1
        wt = self.weight
        if self.ph == 2:
            i = self.i
            if self.q_p >= (1 << _PBITS):  # keep all: the draw over the vocabulary
                e = i + most if most < n - i else n
                r = self.rem
                for t in range(i, e):
                    r -= wt[t]
                    if r < 0:
                        return t
                self.rem = r
                self.i = e
                return -1 if e < n else self.best
            cand = self.cand
            cut = self.lim
            best = self.best
            k = self.k
            j = self.j
            while i < n:
                v = wt[i]
                if j < 0:
                    if (v >= cut and v > 0) or i == best:  # the most likely token is always a candidate
                        j = k  # insertion by weight descending, ties by token id ascending
                    else:
                        i += 1
                        most -= 1
                        if most <= 0:
                            break
                        continue
                while j > 0 and wt[cand[j - 1]] < v and most > 0:
                    cand[j] = cand[j - 1]
                    j -= 1
                    most -= 1
                if j > 0 and wt[cand[j - 1]] < v:  # out of steps mid-insertion: go on from j
                    break
                cand[j] = i
                k += 1
                j = -1
                i += 1
                most -= 1
                if most <= 0:
                    break
            self.i = i
            self.j = j
            self.k = k
            if i < n:
                return -1
            self.ph = 3
            self.i = 0
            self.lim = _mulfrac(self.tot, self.q_p)
            self.cum = 0
            self.last = k - 1
            if most <= 0:
                return -1
        cand = self.cand
        if self.ph == 3:
            i = self.i
            k = self.k
            e = i + most if most < k - i else k
            cum = self.cum
            keep = self.lim
            done = e == k
            while i < e:
                cum += wt[cand[i]]
                i += 1
                if cum > keep:
                    self.last = i - 1
                    done = True
                    break
            most -= i - self.i
            self.cum = cum
            self.i = i
            if not done:
                return -1
            self.ph = 4
            self.i = 0
            self.rem = self.rand() % cum
            if most <= 0:
                return -1
        i = self.i
        last = self.last
        e = i + most if most <= last - i else last + 1
        r = self.rem
        for t in range(i, e):
            r -= wt[cand[t]]
            if r < 0:
                return cand[t]
        self.rem = r
        self.i = e
        return -1 if e <= last else cand[last]

    # fixed-point logits (fb fraction bits) into self.weight; returns their sum. The weight
    # step (dmax test, multiply, table, shift) is written out in each loop, here and in
    # _weights_float, on purpose: a helper call per token of the vocabulary is the loop's cost
    # again in bytecode on the board
    def _weights_int(self, logits, best, fb, i0, i1):
        wt = self.weight
        tab = self.table
        mul = self.mul
        dmax = self.dmax
        top = logits[best]
        total = 0
        sh = _FRAC - fb - self.r  # d >> r = (max - logit) << sh
        if sh >= 0:
            lim = ((dmax - 1) >> sh) + 1  # (max - logit) from which a weight is 0, unshifted
            for i in range(i0, i1):
                a = top - logits[i]
                if a >= lim:
                    v = 0
                else:
                    e = (a << sh) * mul
                    v = tab[(e >> 17) & 255] >> (e >> _ESH)
                wt[i] = v
                total += v
        else:
            sh = -sh
            for i in range(i0, i1):
                a = (top - logits[i]) >> sh
                if a >= dmax:
                    v = 0
                else:
                    e = a * mul
                    v = tab[(e >> 17) & 255] >> (e >> _ESH)
                wt[i] = v
                total += v
        return total

    # float logits: each (max - logit) to 1/2**16 first, then as _weights_int
    def _weights_float(self, logits, best, i0, i1):
        wt = self.weight
        tab = self.table
        mul = self.mul
        dmax = self.dmax
        r = self.r
        top = float(logits[best])
        total = 0
        for i in range(i0, i1):
            d = (top - float(logits[i])) * 65536.0
            a = int(d) >> r if d < 1e15 else dmax  # d >= 0; 1e15: beyond any weight, and no huge int
            if a >= dmax:
                v = 0
            else:
                e = a * mul
                v = tab[(e >> 17) & 255] >> (e >> _ESH)
            wt[i] = v
            total += v
        return total

    # numpy logits (CPython): the same integers, vectorized, for tokens i0 .. i1 - 1
    def _weights_np(self, logits, best, fb, i0, i1):
        np = _np_of(logits)
        if fb is None:
            top = float(logits[best])
            d = np.nan_to_num((top - logits[i0:i1].astype(np.float64)) * 65536.0, nan=1e15)
            a = np.minimum(d, 1e15).astype(np.int64) >> self.r
        else:
            a = int(logits[best]) - logits[i0:i1].astype(np.int64)
            sh = _FRAC - fb - self.r
            a = np.minimum(a, 1 << 40) << sh if sh >= 0 else a >> -sh
        a = np.minimum(a, self.dmax)
        e = a * self.mul
        tab = np.array(self.table, np.int64)
        w = np.where(a >= self.dmax, 0, tab[(e >> 17) & 255] >> np.minimum(e >> _ESH, 62))
        for i, v in enumerate(w.tolist()):
            self.weight[i0 + i] = v
        return int(w.sum())


# SamplerError unless the top logit is a finite number (NaN or inf: a broken model or input)
def _finite(top, best):
    if top != top or top == float("inf") or top == float("-inf"):
        raise SamplerError("logit %d is %r: the model produced a non-finite value" % (best, top))


# floor(x * q / 2**15) for 0 <= x < 2**30, 0 <= q <= 2**15, in small ints; O(1)
def _mulfrac(x, q):
    return (x >> _PBITS) * q + (((x & 0x7FFF) * q) >> _PBITS)


# index of the largest of the first n logits, the lowest index on ties; O(n)
def argmax(logits, n):
    if hasattr(logits, "argmax"):
        return int(logits[:n].argmax())
    best = 0
    bv = logits[0]
    for i in range(1, n):
        if logits[i] > bv:
            bv = logits[i]
            best = i
    return best


# the numpy module of array a (CPython only)
def _np_of(a):
    from firmware_py import compat  # noqa: PLC0415

    return compat.numpy()
