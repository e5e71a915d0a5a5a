# Next-token choice from logits: greedy (temperature 0), or temperature + top-p
# (nucleus) sampling driven by a seeded xorshift32, so the same seed gives the same
# tokens on CPython and on MicroPython (64- and 32-bit). Accepts float logits
# (array('f'), a list, a numpy array) and fixed-point int logits (array('i') with
# frac_bits fractional bits, qmodel's).
#
# Sampling works in integers after one float step: each token's weight is
# floor(exp((logit - max) / T) x ONE) (ONE = 2**16, less for vocabularies over
# 16,384 so the sum stays a small int), then the top-p cut, the cumulative sums and
# the draw are integer arithmetic: a float rounding difference between interpreters
# can only matter where it moves a weight across an integer.
# Costs: greedy O(vocab), no allocation on int logits; sampling O(vocab + k^2) for the
# k tokens above run.c's top-p cutoff (most tokens fall below it), allocates floats.
import math

from firmware_py.compat import const, new_array

_ONE = const(65536)  # weight of the most likely token
_LIMIT = const(0x3FFFFFFF)  # weights sum below this (a small int on the ESP32)
_MASK32 = const(0xFFFFFFFF)  # xorshift32 state width (its arithmetic allocates on a 32-bit port: sampling only)
_SEED0 = const(0x2545F491)  # the state for seed 0 (xorshift's state must not be 0)


class SamplerError(ValueError):
    # a bad sampler setting; one line
    pass


class Sampler:
    # sampling settings, the RNG state and the integer work arrays (allocated here)
    def __init__(self, vocab_size, temperature=0.0, top_p=1.0, seed=0):
        if vocab_size < 1:
            raise SamplerError("vocab_size must be >= 1, got %d" % vocab_size)
        if not temperature >= 0.0 or temperature != temperature or temperature > 1e6:
            raise SamplerError("temperature must be a number >= 0, got %r" % temperature)
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
        self.weight = new_array("i", vocab_size)  # [token] integer weight of the current step
        self.cand = new_array("i", vocab_size)  # candidate tokens of the top-p cut, by weight descending

    # next xorshift32 output (Marsaglia 13/17/5) in 0 .. 2**30 - 1; O(1)
    def rand(self):
        x = (self.state_hi << 16) | self.state_lo
        x ^= (x << 13) & _MASK32
        x ^= x >> 17
        x ^= (x << 5) & _MASK32
        self.state_hi = x >> 16
        self.state_lo = x & 0xFFFF
        return x >> 2

    # the next token for these logits (frac_bits: int logits in fixed point); O(vocab)
    def pick(self, logits, frac_bits=None):
        if self.temperature == 0.0:
            return argmax(logits, self.vocab_size)
        return self._sample(logits, frac_bits)

    # temperature + top-p draw; O(vocab + k^2), allocates floats
    def _sample(self, logits, frac_bits):
        n = self.vocab_size
        best = argmax(logits, n)
        div = float(1 << frac_bits) if frac_bits is not None else 1.0
        inv_t = 1.0 / (self.temperature * div)
        top = float(logits[best])
        wt = self.weight
        one = self.one
        total = 0
        if hasattr(logits, "dtype"):  # numpy: one vectorized step, float64 like the loop
            np = _np_of(logits)
            w = np.floor(np.exp((logits.astype(np.float64) - top) * inv_t) * one).astype(np.int64)
            for i, v in enumerate(w.tolist()):
                wt[i] = v
            total = int(w.sum())
        else:
            for i in range(n):
                v = int(math.exp((float(logits[i]) - top) * inv_t) * one)
                wt[i] = v
                total += v
        if self.top_p >= 1.0:
            r = self.rand() % total
            for i in range(n):
                r -= wt[i]
                if r < 0:
                    return i
            return best
        # run.c's cut: a token below (1 - top_p) / (n - 1) of the mass cannot be in the nucleus
        cut = int((1.0 - self.top_p) * total / (n - 1)) if n > 1 else 0
        cand = self.cand
        k = 0
        for i in range(n):
            v = wt[i]
            if v >= cut and v > 0:
                # insertion by weight descending, ties by token id ascending
                j = k
                while j > 0 and wt[cand[j - 1]] < v:
                    cand[j] = cand[j - 1]
                    j -= 1
                cand[j] = i
                k += 1
        keep = int(self.top_p * total)
        cum = 0
        last = k - 1
        for j in range(k):
            cum += wt[cand[j]]
            if cum > keep:
                last = j
                break
        r = self.rand() % cum
        for j in range(last + 1):
            r -= wt[cand[j]]
            if r < 0:
                return cand[j]
        return cand[last]


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
