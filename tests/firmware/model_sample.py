# Prints the tokens the sampler picks from fixed logits under several settings, one
# line each: tests/test_model.py runs it under MicroPython (64- and 32-bit) and CPython
# and requires identical output (same seed, same tokens on every interpreter).
from array import array

from firmware_py.sample import Sampler

V = 512
f = array("f", [((i * 7919) % 1000 - 500) / 100.0 for i in range(V)])  # float logits in -5 .. 5
q = array("i", [((i * 7919) % 1000 - 500) * 256 // 100 for i in range(V)])  # the same, fixed point, 8 fraction bits
for temp, top_p, seed in ((0.0, 1.0, 0), (1.0, 1.0, 7), (0.8, 0.9, 7), (0.8, 0.9, 8), (1.5, 0.5, 123456789), (1.0, 0.95, 4294967295)):
    s = Sampler(V, temp, top_p, seed)
    a = [s.pick(f) for _ in range(40)]
    s = Sampler(V, temp, top_p, seed)
    b = [s.pick(q, 8) for _ in range(40)]
    print("T=%s p=%s seed=%d float %s" % (temp, top_p, seed, " ".join(str(t) for t in a)))
    print("T=%s p=%s seed=%d fixed %s" % (temp, top_p, seed, " ".join(str(t) for t in b)))
