# The decode's bounded slice: the units a sliced forward step (model.Model, qmodel.QForward)
# and the sampler's pick (decode.Session.task) run between looks at the clock, and the
# Slicer that decides after each whether the slice is spent. The emulator's slicer
# (cpucost.Meter) charges each unit to the virtual clock first, at the cost model's price.
from firmware_py.compat import const, new_array, ticks_diff

# A bounded slice: with a Slicer (Model.slicer, decode.Session sets it from slice_us), the
# step does its work in units (a few rows of a matvec, a few slots of attention, a norm)
# and after each asks slicer.step(kind, a, b) whether the slice is spent; when it is, the
# step yields SLICE (the kernel runs whoever is due) and goes on where it was. A layer's
# end still yields None (the decode charges the layer's memory traffic there). The unit
# kinds (a, b: the unit's size), which the emulator's cost meter (cpucost.Meter) prices:
U_NONE = const(0)  # nothing done: only look at the clock
U_NORM = const(1)  # an rmsnorm of a elements
U_CALL = const(2)  # a matvec's dispatch; a = 1 in a layer, 0 the classifier
U_ROWS = const(3)  # a rows of a matvec of b columns
U_ROPE = const(4)  # RoPE of a elements (the query's and the key's)
U_KVW = const(5)  # the new K/V row stored (a elements; b 1: one of a quantized group's two passes, half the price)
U_ATT = const(6)  # attention over a head-slot-passes (the plain path: one pass of the query heads of some K/V heads over one slot)
U_ELEM = const(7)  # a elementwise operations (residual adds, the SwiGLU product)
U_SILU = const(8)  # SiLU of a elements (an exp and a division each); b 1: and their product (an elementwise op each)
U_SAMPLE = const(9)  # a part of the pick: a logits scanned (greedy) or weighed (a draw; its other steps are in that price)
U_RANK = const(12)  # a comparisons of the slots' positions (the integer path's rope "cache" ranks)
U_COLS = const(11)  # a columns of one matvec row (the plain path's unit where a row is more than one); b 1: the row's last
U_ATTH = const(10)  # attention over a head-slot-passes (one head: 2 x slots; one pass of a range: its slots, the exp pass 0)
N_UNITS = const(13)  # unit kinds (the largest + 1)
SLICE = const(1)  # what a step yields when its slice is spent (a layer's end yields None)
# units of the plain (bytecode) path: PLAIN_MACS multiply-adds of a matvec, PLAIN_EL
# elements, one attention slot per pass (or the query heads of as many K/V heads as
# PLAIN_ATT_MACS multiply-adds hold); of the integer path (qmodel.QForward, viper):
# Q8_UNIT_MACS multiply-adds of rows
PLAIN_MACS = const(32)  # multiply-adds of a matvec per unit (rows of cols <= 32, else 32 columns of a row)
PLAIN_EL = const(32)  # elements per unit of elementwise work (adds, SiLU; RoPE: half as many pairs; rmsnorm's two
# passes: half as many elements, about 47 us an element on an S3 in bytecode, the measured norm_el_mcyc: 0.75 ms a unit)
PLAIN_ATT_MACS = const(32)  # multiply-adds of an attention unit (half of one slot: stories260K's 8 heads of 8, 4 heads a
# unit: about 1.2 ms at the slow end with the measured attention figures; 288-wide models split a slot by heads)
# the integer path's attention unit: one query head over every slot (both passes) while
# that fits the slice bound; past it, one pass of one head over a range of blocks of what
# half the bound holds (Slicer.att_range; a head's whole attention over many slots held
# the CPU past the bound: 2.9 ms at 480 slots). ATTH_SLOTS: before any unit's time is
# known, the slots past which a head is attended in ranges, and their size
ATTH_SLOTS = const(64)
SOFTMAX_SLOTS = const(8)  # slots of every head per softmax unit (about one score unit's work: a head's D MACs per slot)
Q8_UNIT_MACS = const(2048)
RANK_CMP = const(8192)  # comparisons per unit of the integer path's rope "cache" ranks (qmodel.QForward.forward)
SAMPLE_UNIT = const(16)  # steps of the pick per unit (decode.Session.task, sample.Sampler.run): the float path's
# draw weighs a logit in about 45 us on an S3 (sample_el_mcyc), so 16 of them keep a unit near 0.7 ms


class Slicer:
    # the decode's slice bound on one kernel: step() after each unit of work is True once
    # the running slice (from kernel.t0, when the kernel resumed the task) would last
    # slice_us or more after one more unit, foreseen as long as the longest recent one (or,
    # at a matvec's start, as its rows at the last matvec unit's time per MAC). slice_us
    # 0: unbounded (never True). By the kernel's clock: ticks_us on a board, the virtual
    # clock in the emulator (where cpucost.Meter charges each unit first). No allocation
    def __init__(self, kernel, slice_us):
        self.k = kernel
        self.now = kernel.clock.now
        self.us = slice_us  # the bound (µs); 0: none
        self.t0 = 0  # the slice the last unit ran in (kernel.t0 then)
        self.prev = 0  # ticks at the end of the last unit
        self.yields = 0  # slices given away (saturates below 2**30)
        self.row_us = 0  # time of the last matvec unit (µs)
        self.row_macs = 0  # its multiply-adds
        self.att_q = 0  # the last U_ATT unit's time per head-slot-pass, in 1/64 µs (rounded up)
        self.call_us = 0  # the last matvec dispatch's time (µs): foreseen before the next (ahead_call)
        self.atth_q = 0  # the last whole-head U_ATTH unit's time per head-slot-pass, in 1/64 µs (rounded up)
        self.atr_q1 = 0  # the last ranged unit's time per slot of pass 1 (scores: the heaviest), 1/64 µs
        self.atr_q3 = 0  # ... of pass 3 (values: slots of probability 0 are skipped, so often lighter)
        self.big = 0  # the longest recent unit (µs), decaying
        self.kind_us = new_array("i", N_UNITS)  # [kind] its longest recent unit (µs), decaying (ahead_unit)
        for i in range(N_UNITS):
            self.kind_us[i] = 0

    # before a matvec's dispatch: True when the slice, already under way, would pass the
    # bound with a dispatch and one unit of rows as long as the last ones; the caller
    # yields first. No allocation
    def ahead_call(self):
        if self.us <= 0:
            return False
        d = ticks_diff(self.now(), self.k.t0)
        if not self.row_macs:  # no matvec unit timed yet: the first one starts a slice
            return d > 0
        return d > 0 and d + self.call_us + self.row_us >= self.us

    # before a U_ATT unit of n head-slot-passes: True when the slice would be spent by it
    # (as long per head-slot-pass as the last one); the caller yields first. No allocation
    def ahead(self, n):
        if self.us <= 0:
            return False
        t0 = self.k.t0
        if t0 != self.t0:
            return False  # a fresh slice: the unit runs in it
        if not self.att_q:  # no attention unit timed yet: the first one starts a slice
            return ticks_diff(self.now(), t0) > 0
        return ticks_diff(self.now(), t0) + (self.att_q * n >> 6) >= self.us

    # before a piece of work whose time is known up front (us: the emulator's price of a
    # memory piece): True when the slice, already under way, would pass the bound with it;
    # the caller yields first. A fresh slice takes it (nothing would be gained). No allocation
    def ahead_us(self, us):
        if self.us <= 0 or us <= 0:
            return False
        d = ticks_diff(self.now(), self.k.t0)
        return d > 0 and d + us >= self.us

    # slots per unit of one attention pass of one head over n slots (the integer path's
    # sliced step, asked once per layer): 0, one unit per head, when both its passes fit the
    # bound (or there is no bound), at the larger of two estimates: the whole-head units'
    # time per head-slot-pass, and the ranged units' times per slot of pass 1 and pass 3
    # (kept apart: a layer's last unit is a light pass 3, and a head priced by it alone
    # looked short enough for one unit, which then overran); else what half the bound
    # holds at the heaviest pass's time per slot (pass 1's; a whole head's mean x 2 before
    # one ran), at least one slot (the caller rounds to whole blocks). Before any time is
    # known: 0 up to `least` slots, ranges of `least` past them. Small ints only
    def att_range(self, n, least):
        us = self.us
        if us <= 0:
            return 0
        q = self.atth_q
        q1 = self.atr_q1
        if not q and not q1:
            return least if n > least else 0
        est = q * 2 * n
        e2 = (q1 + self.atr_q3) * n
        if e2 > est:
            est = e2
        if est >> 6 <= us:
            return 0
        r = ((us >> 1) << 6) // (q1 if q1 else 2 * q)
        return r if r > 0 else 1

    # before a ranged attention unit: pass pas (1, 2, 3) of one head over n slots; True when
    # the slice, already under way, would pass the bound with it at that pass's last time
    # per slot (pass 3 unknown yet: pass 1's; pass 2, the exponentials, is priced within
    # the other two: n is 0). No allocation
    def ahead_r(self, n, pas):
        if self.us <= 0 or n <= 0:
            return False
        q = self.atr_q3 if pas == 3 else self.atr_q1
        if not q:
            q = self.atr_q1 if self.atr_q1 else 2 * self.atth_q
        if not q:
            return False
        t0 = self.k.t0
        if t0 != self.t0:
            return False  # a fresh slice: the unit runs in it
        return ticks_diff(self.now(), t0) + (q * n >> 6) >= self.us

    # before the first unit of a piece of work whose units are of one kind (the plain
    # path's elementwise ops, its store, its slot table): True when the slice, already under
    # way, would pass the bound with a unit as long as that kind's longest recent one (the
    # one before could be of any kind: a SiLU unit after a matvec's was 1.7x longer than
    # foreseen); the first unit of a kind never timed starts a slice. No allocation
    def ahead_unit(self, kind):
        if self.us <= 0:
            return False
        t0 = self.k.t0
        if t0 != self.t0:
            return False  # a fresh slice: the unit runs in it
        d = ticks_diff(self.now(), t0)
        g = self.kind_us[kind]
        return d > 0 and (not g or d + g >= self.us)

    # before a unit of attention heads of n head-slot-passes (U_ATTH): as ahead(). No allocation
    def ahead_h(self, n):
        if self.us <= 0 or not self.atth_q:
            return False
        t0 = self.k.t0
        if t0 != self.t0:
            return False  # a fresh slice: the unit runs in it
        return ticks_diff(self.now(), t0) + (self.atth_q * n >> 6) >= self.us

    def step(self, kind, a, b):
        us = self.us
        if us <= 0:
            return False
        t = self.now()
        t0 = self.k.t0
        if t0 != self.t0:  # a new slice since the last unit
            self.t0 = t0
            self.prev = t0
        d = ticks_diff(t, t0)
        u = ticks_diff(t, self.prev)  # the last unit's time (the first: the slice so far)
        self.prev = t
        nxt = u  # the next unit's time, foreseen: as long as this one, but at a matvec's start
        if kind == U_ROWS:  # its rows' time, to foresee the next matvec's units (b: their MACs)
            self.row_us = u
            self.row_macs = a * b
        elif kind == U_COLS and b == 0:  # a row's columns, not its last (that one has the row's own work too): as rows
            self.row_us = u
            self.row_macs = a
        elif kind == U_ATT and a > 0:  # an attention unit's time per head-slot-pass, to foresee the next (ahead)
            self.att_q = ((u + 1) << 6) // a + 1
        elif kind == U_ATTH and a > 0:  # u + 1: a tick count may fall up to 1 us short (a short last range of slots)
            q = ((u + 1) << 6) // a + 1
            if b == 0:  # one head, both passes
                self.atth_q = q
            elif b == 1:  # a range of pass 1
                self.atr_q1 = q
            else:  # a range of pass 3
                self.atr_q3 = q
        elif kind == U_CALL and b > 0:
            self.call_us = u
            m = self.row_macs
            if m > 0:
                nxt = self.row_us * ((b + m - 1) // m) if b > m else self.row_us
        if kind < N_UNITS:  # the kind's longest recent unit (decays by a 32nd a unit of it)
            g = self.kind_us[kind]
            g -= g >> 5
            self.kind_us[kind] = u if u > g else g
        g = self.big  # the longest recent unit (decays by an eighth a unit): the next may be one like it
        g -= g >> 3
        if u > g:
            g = u
        self.big = g
        if nxt < g:
            nxt = g
        if d + nxt >= us:
            if self.yields < 0x3FFFFFFF:
                self.yields += 1
            return True
        return False
