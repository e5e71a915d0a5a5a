# A user's own task for tests/firmware/fw_appcfg.py: what a {"kind": "module", "module":
# "appcfg_user", "factory": "blinker", "args": {...}} config entry builds. Every period it
# charges cpu_us of compute and moves `bytes` from SRAM to PSRAM through the DMA queue in
# its own tracker category; stats() counts periods and late ones. No allocation per period.
from array import array

from firmware_py.compat import ticks_add, ticks_diff


class Blinker:
    def __init__(self, kernel, env, period_us=10000, cpu_us=100, nbytes=256):
        self.k = kernel
        self.q = env["dma"]
        self.cat = env["bw"].add_category("blink_io")
        self.period_us = period_us
        self.cpu_us = cpu_us
        self.nbytes = nbytes
        self.src = self.q.add_buffer(bytearray(nbytes), env["sram"])
        self.dst = self.q.add_buffer(bytearray(nbytes), env["psram"])
        self.st = array("i", [0, 0, 0])  # released, late, bytes

    def task(self):
        k = self.k
        st = self.st
        rel = ticks_add(k.now(), self.period_us)
        while True:
            yield k.sleep_until(rel)
            st[0] += 1
            k.charge(self.cpu_us)
            c = yield self.q.submit(self.src, 0, self.dst, 0, self.nbytes, self.cat)
            if c >= 0:
                yield self.q.wait(c)
                st[2] += self.nbytes
            if ticks_diff(k.now(), rel) > self.period_us:
                st[1] += 1
            rel = ticks_add(rel, self.period_us)

    def stats(self):
        return {"released": self.st[0], "deadline_misses": self.st[1], "bytes": self.st[2]}


def blinker(kernel, env, **args):
    return Blinker(kernel, env, **args)
