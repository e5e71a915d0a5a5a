# A user's own task beside the decode: what the {"kind": "module", "module": "meter",
# "factory": "make", "args": {...}} entry of kvrtos.json builds (firmware_py/appcfg.py
# calls make(kernel, env, **args)). Every period it takes a reading (an ADC pin on a board
# when `pin` is given and the port has machine.ADC, else a synthetic one), keeps an
# integer moving average, spends cpu_us of compute (charged to the kernel's clock, so the
# emulator and the dashboard see it), and counts the periods it ran late. Runs on
# MicroPython and CPython; nothing in a period allocates (small ints, array('i')).
from array import array

from firmware_py.compat import ticks_add, ticks_diff

READINGS, LATE, AVG, LAST = 0, 1, 2, 3  # slots of Meter.st


class Meter:
    def __init__(self, kernel, env, period_us=20000, cpu_us=300, pin=-1):
        if period_us < 1000 or cpu_us < 0 or cpu_us >= period_us:
            raise ValueError("meter: period_us >= 1000 and 0 <= cpu_us < period_us, got %r, %r" % (period_us, cpu_us))
        self.k = kernel
        self.period_us = period_us
        self.cpu_us = cpu_us
        self.adc = None
        if pin >= 0:
            try:
                import machine

                self.adc = machine.ADC(machine.Pin(pin))
            except (ImportError, AttributeError, ValueError):
                self.adc = None  # no ADC here (the emulator, the unix port): synthetic readings
        self.seed = 12345
        self.st = array("i", [0, 0, 0, 0])  # readings, late periods, moving average x16, last reading

    def _read(self):
        if self.adc is not None:
            return self.adc.read_u16() >> 4
        self.seed = (self.seed * 1103 + 12345) & 0xFFFF  # a 16-bit LCG: 0..4095 after the shift
        return self.seed >> 4

    def task(self):
        k = self.k
        st = self.st
        rel = ticks_add(k.now(), self.period_us)
        while True:
            yield k.sleep_until(rel)
            v = self._read()
            st[LAST] = v
            st[AVG] += v - (st[AVG] >> 4)  # average x16 over ~16 readings: stays below 2**16
            k.charge(self.cpu_us)
            st[READINGS] += 1
            if ticks_diff(k.now(), rel) > self.period_us:
                st[LATE] += 1
            rel = ticks_add(rel, self.period_us)

    def stats(self):
        return {"released": self.st[READINGS], "deadline_misses": self.st[LATE], "average": self.st[AVG] >> 4,
                "last": self.st[LAST], "period_us": self.period_us, "cpu_us": self.cpu_us}


def make(kernel, env, **args):
    return Meter(kernel, env, **args)
