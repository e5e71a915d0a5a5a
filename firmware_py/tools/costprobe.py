# A MicroPython script (python -m firmware_py.tools.costprobe also runs it on CPython): the host cost of the firmware's own
# kernels on the interpreter that runs it, for the viper and bytecode cost figures of the
# board profiles. host/bench/calibration.py runs it under the 32-bit unix port (`./kv
# mp32`, the ESP32-S3's word size) several times and takes the median of each figure.
# Prints one JSON line: ns per int8 MAC of kernels_q.matvec (@viper matvec_v, 64 rows,
# group 32: the marginal cost of 192 more columns, so each MAC carries its share of the
# per-group scaling), ns per fp32 MAC of kernels.Plain.matvec (the same difference, plain
# bytecode), ns per math.exp in a bytecode loop (less the same loop without it).
import json
import math

from firmware_py import compat, kernels, kernels_q
from firmware_py.compat import ticks_diff, ticks_us

ROWS = 64
GROUP = 32
NARROW, WIDE = 64, 256


class _F:
    # what Plain.matvec reads of its self
    def __init__(self, n):
        self.f32 = compat.new_array("f", n)
        for i in range(n):
            self.f32[i] = ((i * 37) % 17 - 8) * 0.125
        self.q8 = None


class _M:
    def __init__(self, rows, cols):
        self.rows, self.cols, self.off, self.soff, self.group = rows, cols, 0, -1, 0


def _best(fn, reps, *args):
    # the fastest of reps timings (µs) of fn(*args)
    best = None
    for _ in range(reps):
        compat.collect()
        t0 = ticks_us()
        fn(*args)
        d = ticks_diff(ticks_us(), t0)
        best = d if best is None or d < best else best
    return best


def _viper(y, w, cols, gp, x, iters):
    for _ in range(iters):
        kernels_q.matvec(y, w, 0, ROWS, cols, GROUP, gp, 0, x)


def _plain(fs, y, m, x, iters):
    for _ in range(iters):
        kernels.Plain.matvec(fs, y, m, x)


def viper_ns(iters=40):
    t = {}
    for cols in (NARROW, WIDE):
        w = bytearray(ROWS * cols)
        for i in range(len(w)):
            w[i] = (i * 29 + 7) & 0xFF
        gp = compat.new_array("i", ROWS * cols // GROUP)
        for i in range(len(gp)):
            gp[i] = 16384 | (4 << 16)
        x = compat.new_array("i", cols)
        for i in range(cols):
            x[i] = (i * 53) % 2001 - 1000
        y = compat.new_array("i", ROWS)

        t[cols] = _best(_viper, 5, y, w, cols, gp, x, iters)
    return 1000 * (t[WIDE] - t[NARROW]) / (iters * ROWS * (WIDE - NARROW))


def bytecode_ns(iters=2):
    rows = 16
    t = {}
    for cols in (NARROW, WIDE):
        fs = _F(rows * cols)
        m = _M(rows, cols)
        x = compat.new_array("f", cols)
        for i in range(cols):
            x[i] = (i % 7) * 0.25
        y = compat.new_array("f", rows)

        t[cols] = _best(_plain, 5, fs, y, m, x, iters)
    return 1000 * (t[WIDE] - t[NARROW]) / (iters * rows * (WIDE - NARROW))


def exp_ns(n=2000):
    xs = [-(i % 50) * 0.1 for i in range(n)]
    e = math.exp

    def with_exp():
        s = 0.0
        for v in xs:
            s += e(v)

    def without():
        s = 0.0
        for v in xs:
            s += v
    return 1000 * (_best(with_exp, 5) - _best(without, 5)) / n


def main():
    print(json.dumps({"viper_mac_i8_ns": round(viper_ns(), 3), "bytecode_mac_f32_ns": round(bytecode_ns(), 1),
                  "exp_ns": round(exp_ns(), 1)}))


if __name__ == "__main__":
    main()
