# cpucost on MicroPython and CPython: the same integers from the same figures, and the
# hot calls (layer_us, final_us: charged by decode.Session every layer and token) do
# not allocate, on the 32-bit build too (small ints stop at 2**30 there)
import json

from firmware_py import board, cpucost, llama2c
from fwtest import check, eq, no_alloc, done

with open("boards/esp32s3_n8r8.json") as f:
    b = board.Board(json.loads(f.read()), "esp32s3_n8r8")
cfg = llama2c.Config(64, 172, 5, 8, 4, 512, 512)  # stories260K
c15 = llama2c.Config(288, 768, 6, 6, 6, 32000, 256)  # stories15M
m = cpucost.for_config(b, "dsp", cfg)
a = [m.layer_us(n) for n in range(1, 65)]
eq(a, sorted(a), "layer_us grows with the KV length")
check(m.layer_ns(64) > m.layer_ns(1) > 0, "layer_ns grows")
t = [cpucost.for_config(b, k, cfg, "int8").token_ns(100) for k in cpucost.KINDS]
check(t[2] <= t[0] and t[1] <= t[0] < t[3] < t[4], "kind order asm, dsp <= c < viper < bytecode: %r" % (t,))
# the carry: N calls sum to the ns total // 1000
m2 = cpucost.for_config(b, "bytecode", c15)
s = 0
for _ in range(100):
    s += m2.layer_us(200)
eq(s, 100 * m2.layer_ns(200) // 1000, "100 layer_us calls == their ns total")

# the KV element type's dequantization (per cached position) and quantization (per layer)
for kind in cpucost.KINDS:
    k32 = cpucost.for_config(b, kind, cfg, "int8", "fp32")
    for kvd in cpucost.KV_DTYPES[1:]:
        mk = cpucost.for_config(b, kind, cfg, "int8", kvd)
        check(mk.layer_ns(100) >= k32.layer_ns(100), "%s %s: no cheaper than fp32 KV" % (kind, kvd))
        check(mk.layer_ns(100) - mk.layer_ns(99) >= k32.layer_ns(100) - k32.layer_ns(99), "%s %s per position" % (kind, kvd))
    eq(k32.layer_ns(50), cpucost.for_config(b, kind, cfg, "int8").layer_ns(50), "fp32 KV is the default")
check(cpucost.for_config(b, "c", cfg, "fp32", "fp16").layer_ns(100) > cpucost.for_config(b, "c", cfg).layer_ns(100),
      "fp16 KV costs more than fp32 in C")

models = []
for shape in (cfg, c15):
    for kind in cpucost.KINDS:
        for dt in ("fp32", "int8"):
            for kvd in cpucost.KV_DTYPES:
                models.append(cpucost.for_config(b, kind, shape, dt, kvd))
out = [0]


def hot():
    # every model: a token's layers at KV lengths 1..shape's seq_len and the final step
    for mm in models:
        n = 1
        top = mm.cfg.seq_len
        acc = 0
        while n <= top:
            acc += mm.layer_us(n) & 0xFFFF
            n += 37
        acc += mm.final_us() & 0xFFFF
        out[0] = acc


no_alloc("layer_us / final_us, stories260K and stories15M, every kind, fp32 and int8 weights, every KV type", hot)
print("tokens", m.token_ns(100), m.final_us())
done()
