# cpucost on MicroPython and CPython: the same integers from the same figures
import json

from firmware_py import board, cpucost, llama2c

with open("boards/esp32s3_n8r8.json") as f:
    b = board.Board(json.loads(f.read()), "esp32s3_n8r8")
cfg = llama2c.Config(64, 172, 5, 8, 4, 512, 512)
m = cpucost.for_config(b, "dsp", cfg)
a = [m.layer_us(n) for n in range(1, 65)]
assert a == sorted(a)
assert m.layer_ns(64) > m.layer_ns(1) > 0
t = [cpucost.for_config(b, k, cfg, "int8").token_ns(100) for k in cpucost.KINDS]
assert t[2] <= t[1] <= t[0] < t[3] < t[4], t
print("tokens", m.token_ns(100), m.final_us())
print("PASS fw_cpucost")
