# Thermal guard: a temperature source and a kernel task that watches it. Two
# thresholds, each with its own action, checked every period:
#   shrink_c   (default 65 °C, the source documents' "cut the KV length at 65 °C"):
#              the KV budget of the next request shrinks to shrink_pct of what was asked
#   throttle_c (the board profile's thermal.throttle_c, 85 °C on the ESP32-S3 modules):
#              decode also slows down: after each token it sleeps slow_pct of that
#              token's time (100: half the token rate, so roughly half the heat)
# Each threshold is left only when the temperature falls hysteresis_c below it, so a
# reading that hovers at a threshold does not flap. Every state change is an event
# (counted, last one kept, on_event called).
#
# Sources give milli-degrees as an int (no floats: nothing here allocates per sample):
#   BoardTemp   esp32.mcu_temperature() (whole °C) on an ESP32 board
#   ModelTemp   the host's stand-in: a first-order (RC) model of the die driven by the
#               kernel's measured load, on the kernel's clock (VirtualClock: deterministic)
# The guard measures load itself from the kernel's busy/idle totals and hands it to a
# source that takes it (ModelTemp.set_load); a board's sensor ignores it.
from array import array

from firmware_py.compat import const, ticks_diff
from firmware_py.status import E_RANGE, OK

SHRINK_C = const(65)  # source documents: shrink the KV at about 65 °C
SHRINK_PCT = const(50)  # KV budget kept above shrink_c, % of what a request asks
SLOW_PCT = const(100)  # above throttle_c: sleep this % of each token's time after it
HYSTERESIS_C = const(3)  # a threshold is left this far below it
PERIOD_US = const(1000000)  # the guard samples once a second

NORMAL = const(0)  # below shrink_c
SHRINK = const(1)  # at or above shrink_c: smaller KV budgets
SLOW = const(2)  # at or above throttle_c: smaller KV budgets and slower decode
STATE_NAMES = ("normal", "shrink", "slow")

# ModelTemp defaults, estimates (docs/thermal.md): 25 °C ambient, a die
# 45 °C above ambient at full load (an ESP32-S3 module in free air, no heat sink), and a
# 30 s time constant (a small module's copper and package)
AMBIENT_C = const(25)
RISE_C = const(45)
TAU_US = const(30000000)
_STEP_US = const(250000)  # ModelTemp integrates in steps of at most this (tau / 120)

_T_BUSY_US = const(4)  # firmware_py/sched/stats.py T_BUSY_US, T_BUSY_S, T_IDLE_US, T_IDLE_S
_T_BUSY_S = const(5)
_T_IDLE_US = const(2)
_T_IDLE_S = const(3)
_NTOT = const(13)
_INT_MAX = const(0x3FFFFFFF)  # status.INT_MAX: the largest small int on the ESP32


class ThermalError(ValueError):
    # a configuration mistake (thresholds, percentages, a source); one line
    pass


class BoardTemp:
    # the chip's own sensor: esp32.mcu_temperature(), whole °C
    def __init__(self):
        try:
            import esp32  # noqa: PLC0415 - only on an ESP32 port
            self._read = esp32.mcu_temperature
        except (ImportError, AttributeError):
            raise ThermalError("no temperature sensor on this port (esp32.mcu_temperature); use ModelTemp")

    # temperature in milli-degrees C; no allocation (a small int)
    def read_mc(self):
        return self._read() * 1000

    def set_load(self, permille):
        pass


class ModelTemp:
    # dT/dt = (ambient + rise * load - T) / tau, integrated in integer milli-degrees on
    # clock (any object with now()); load in per mille, set by the guard each period
    def __init__(self, clock, ambient_c=AMBIENT_C, rise_c=RISE_C, tau_us=TAU_US, start_c=None):
        if start_c is None:
            start_c = ambient_c
        for name, v in (("ambient_c", ambient_c), ("rise_c", rise_c), ("tau_us", tau_us), ("start_c", start_c)):
            if v.__class__ is not int:
                raise ThermalError("%s must be an int, got %r" % (name, v))
        if (not -40 <= ambient_c <= 125 or not 0 <= rise_c <= 150 or not _STEP_US <= tau_us <= 1000000000
                or not -40 <= start_c <= 200):
            raise ThermalError("ModelTemp needs ambient_c -40..125, rise_c 0..150, start_c -40..200, tau_us %d..1e9"
                               % _STEP_US)
        self.clock = clock  # time source
        self.ambient_mc = ambient_c * 1000  # ambient, milli-°C
        self.rise_mc = rise_c * 1000  # rise at full load, milli-°C
        self.tau_us = tau_us  # time constant
        self.t_mc = start_c * 1000  # die temperature now
        self.load = 0  # load driving it, per mille
        self.last = clock.now()  # ticks at which t_mc was last brought up to date

    # the load from now on, per mille (0..1000); the model is first brought up to now
    def set_load(self, permille):
        self.read_mc()
        self.load = 0 if permille < 0 else (1000 if permille > 1000 else permille)

    # temperature now, milli-°C: Euler steps of <= _STEP_US since the last read; no allocation
    def read_mc(self):
        now = self.clock.now()
        dt = ticks_diff(now, self.last)
        self.last = now
        if dt <= 0:
            return self.t_mc
        target = self.ambient_mc + self.rise_mc * self.load // 1000
        t = self.t_mc
        tau = self.tau_us
        while dt > 0:
            s = dt if dt < _STEP_US else _STEP_US
            # |target - t| < 200,000 m°C and s // 1000 <= 250: the product stays below 2**30
            d = target - t
            t += d * (s // 1000) // (tau // 1000)
            dt -= s
        self.t_mc = t
        return t


class Guard:
    # watches source every period_us as a kernel task (guard.task()); thresholds in °C
    def __init__(self, kernel, source, throttle_c=85, shrink_c=SHRINK_C, hysteresis_c=HYSTERESIS_C,
                 shrink_pct=SHRINK_PCT, slow_pct=SLOW_PCT, period_us=PERIOD_US):
        for name, v in (("throttle_c", throttle_c), ("shrink_c", shrink_c), ("hysteresis_c", hysteresis_c),
                        ("shrink_pct", shrink_pct), ("slow_pct", slow_pct), ("period_us", period_us)):
            if v.__class__ is not int:
                raise ThermalError("%s must be an int, got %r" % (name, v))
        if not 0 < shrink_c < throttle_c <= 150:
            raise ThermalError("thresholds need 0 < shrink_c (%d) < throttle_c (%d) <= 150" % (shrink_c, throttle_c))
        if not 0 <= hysteresis_c < shrink_c:
            raise ThermalError("hysteresis_c must be 0..%d, got %d" % (shrink_c - 1, hysteresis_c))
        if not 1 <= shrink_pct <= 100 or not 0 <= slow_pct <= 1000:
            raise ThermalError("shrink_pct must be 1..100 and slow_pct 0..1000, got %d and %d" % (shrink_pct, slow_pct))
        if not 1000 <= period_us <= 60000000:
            raise ThermalError("period_us must be 1000..60000000, got %d" % period_us)
        self.k = kernel  # the Kernel whose load drives a ModelTemp and which runs the task
        self.source = source  # BoardTemp or ModelTemp (anything with read_mc() and set_load())
        self.shrink_mc = shrink_c * 1000  # thresholds and hysteresis, milli-°C
        self.throttle_mc = throttle_c * 1000
        self.hyst_mc = hysteresis_c * 1000
        self.shrink_pct = shrink_pct  # KV budget kept in SHRINK and SLOW, %
        self.slow_pct = slow_pct  # sleep after a token in SLOW, % of its time
        self.period_us = period_us  # sampling period
        self.state = NORMAL  # NORMAL, SHRINK or SLOW
        self.temp_mc = source.read_mc()  # last reading, milli-°C
        self.peak_mc = self.temp_mc  # highest reading
        self.events = 0  # state changes so far (saturates at 2**30 - 1)
        self.entered = array("i", [0, 0, 0])  # times each state was entered (NORMAL .. SLOW)
        self.last_event = -1  # state entered by the last event, -1 = none yet
        self.last_event_mc = 0  # the reading that caused it
        self.on_event = None  # fn(state, temp_mc) called on every state change, or None
        self.samples = 0  # readings taken by sample() (saturates at 2**30 - 1, as events and entered[] do)
        self._tot = array("i", bytes(4 * _NTOT))  # kernel totals snapshot (preallocated)
        self._busy = 0  # kernel busy µs at the last sample (mod CARRY-free delta below)
        self._idle = 0  # kernel idle µs at the last sample
        self._db = 0  # busy µs between the last two samples
        self._di = 0  # idle µs between the last two samples
        self._loads()  # baseline
        self.sample()  # the state of the first reading: a board that boots hot starts in its band (an event)

    # kernel busy and idle µs since the last call into self._db / self._di (a tuple
    # would allocate), from the kernel totals; no allocation
    def _loads(self):
        tot = self._tot
        self.k.snapshot_totals(tot)
        busy = (tot[_T_BUSY_S] % 1000) * 1000000 + tot[_T_BUSY_US]  # mod 1000 s: stays a small int
        idle = (tot[_T_IDLE_S] % 1000) * 1000000 + tot[_T_IDLE_US]
        db = busy - self._busy
        di = idle - self._idle
        if db < 0:
            db += 1000000000
        if di < 0:
            di += 1000000000
        self._busy = busy
        self._idle = idle
        self._db = db
        self._di = di

    # one reading: measure the load since the last one, feed it to the source, read the
    # temperature and move between states. The state now; no allocation
    def sample(self):
        self._loads()
        db = self._db
        el = db + self._di
        if el > 0:
            self.source.set_load(db * 1000 // el if el < 1000000 else db // (el // 1000))
        t = self.source.read_mc()
        self.temp_mc = t
        if t > self.peak_mc:
            self.peak_mc = t
        if self.samples < _INT_MAX:  # saturates at 2**30 - 1 (a small int on the ESP32)
            self.samples += 1
        st = self.state
        # each band is entered at its threshold and left only at or below threshold - hysteresis
        if t >= self.throttle_mc or (st == SLOW and t > self.throttle_mc - self.hyst_mc):
            new = SLOW
        elif t >= self.shrink_mc or (st != NORMAL and t > self.shrink_mc - self.hyst_mc):
            new = SHRINK
        else:
            new = NORMAL
        if new != st:
            self.state = new
            if self.entered[new] < _INT_MAX:
                self.entered[new] += 1
            if self.events < 0x3FFFFFFF:
                self.events += 1
            self.last_event = new
            self.last_event_mc = t
            if self.on_event is not None:
                self.on_event(new, t)
        return new

    # the KV budget to open a request with when it asks for `tokens` (1 .. 2**30 - 1), or
    # E_RANGE (not an int, or out of range); O(1), no allocation
    def budget(self, tokens):
        if tokens.__class__ is not int or tokens < 1 or tokens > _INT_MAX:
            return E_RANGE
        if self.state == NORMAL:
            return tokens
        p = self.shrink_pct
        b = (tokens // 100) * p + (tokens % 100) * p // 100  # tokens * p / 100 without a product past 2**30
        return b if b > 0 else 1

    # µs to sleep after a token that took token_us (0 .. 2**30 - 1; longer ones count as
    # 10 s), 0 unless SLOW; E_RANGE for a negative or non-int token_us; O(1), no allocation
    def pause_us(self, token_us):
        if token_us.__class__ is not int or token_us < 0 or token_us > _INT_MAX:
            return E_RANGE
        if self.state != SLOW:
            return 0
        if token_us > 10000000:
            token_us = 10000000
        return token_us * self.slow_pct // 100

    # the guard as a kernel task: k.spawn("thermal", prio, guard.task()); samples every
    # period until killed
    def task(self):
        k = self.k
        while True:
            self.sample()
            yield k.sleep_us(self.period_us)

    # the guard's figures as a dict (allocates: reporting path only)
    def report(self):
        return {"state": STATE_NAMES[self.state], "temp_c": self.temp_mc / 1000, "peak_c": self.peak_mc / 1000,
                "events": self.events, "shrink_entered": self.entered[SHRINK], "slow_entered": self.entered[SLOW],
                "shrink_c": self.shrink_mc // 1000, "throttle_c": self.throttle_mc // 1000}


# a Guard for board profile brd (firmware_py.board.Board): its throttle point, and its
# thermal.shrink_c when the profile gives one; ModelTemp on clock unless a sensor exists
def for_board(kernel, brd, source=None, **opts):
    if source is None:
        try:
            source = BoardTemp()
        except ThermalError:
            source = ModelTemp(kernel.clock)
    shrink = getattr(brd, "shrink_c", None)  # validated by board.Board (a lean board keeps no raw dict)
    opts.setdefault("shrink_c", SHRINK_C if shrink is None else shrink)
    return Guard(kernel, source, throttle_c=brd.throttle_c, **opts)


if OK != 0:  # the status convention this module returns (E_RANGE) rests on
    raise ImportError("thermal: status.OK is not 0")
