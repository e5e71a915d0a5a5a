# Direct task notifications (FreeRTOS xTaskNotify / xTaskNotifyGive), and the deferred
# path for interrupt handlers and micropython.schedule callbacks ("FromISR"): they never
# touch the task lists, they record the operation into a preallocated ring that the run
# loop applies at the next switch.
#
# A task has one notification value (Task.nval, 0 = nothing pending). notify(t, bits)
# ORs bits into it (eSetBits); notify_give(t) adds 1 (eIncrement). wait_notify() takes
# the whole value and clears it (xTaskNotifyWait clearing all bits on exit);
# take_notify(clear=True/False) takes it and clears it or subtracts 1 (ulTaskNotifyTake).
# Both block while the value is 0.
from firmware_py.compat import const
from firmware_py.status import OK, E_FULL, E_RANGE, E_STALE, CARRY_N
from firmware_py.sched.task import BLOCKED, DONE, W_NOTIFY, FOREVER, TIMEOUT, Task

_NVAL_MAX = const(0x3FFFFFFF)  # notification value limit: a small int on the ESP32

# deferred operations (Deferred.ops)
OP_NOTIFY = const(1)  # Kernel.notify(obj, val)
OP_GIVE_NOTIFY = const(2)  # Kernel.notify_give(obj)
OP_GIVE = const(3)  # Semaphore.give() on obj
OP_PUT = const(4)  # Queue.put_nowait(val) on obj (object-reference queues)
OP_SET = const(5)  # EventFlags.set(val) on obj


class Notify:
    # the Kernel's notification services (a base class of Kernel)

    # OR bits (1 .. 2**30-1) into task t's notification value and wake it if it waits.
    # OK; E_STALE when t has finished; E_RANGE for bits out of range or t not a task of
    # this kernel (another kernel's task would be made ready on lists this one never
    # runs, and wait on forever). O(1), no allocation
    def notify(self, t, bits=1):
        if not isinstance(t, Task) or t.k is not self or bits.__class__ is not int or bits <= 0 or bits > _NVAL_MAX:
            return E_RANGE
        if t.state >= DONE:
            return E_STALE
        self._tick()
        t.nval |= bits
        self._deliver(t)
        return OK

    # add 1 to task t's notification value (a counting semaphore private to t) and wake it
    # if it waits. OK; E_STALE when t has finished; E_FULL at 2**30-1; E_RANGE when t is
    # not a task of this kernel. O(1), no allocation
    def notify_give(self, t):
        if not isinstance(t, Task) or t.k is not self:
            return E_RANGE
        if t.state >= DONE:
            return E_STALE
        if t.nval >= _NVAL_MAX:
            return E_FULL
        self._tick()
        t.nval += 1
        self._deliver(t)
        return OK

    # a waiting task takes its value now: all of it (clears) or one count (decrements)
    def _deliver(self, t):
        if t.state == BLOCKED and t.wkind == W_NOTIFY:
            self._wake(t, self._take_nval(t))

    # task t's notification value as its wait returns it, cleared or decremented
    def _take_nval(self, t):
        v = t.nval
        if t.wclear:
            t.nval = 0
        else:
            t.nval = v - 1
        return v

    # wait for a notification; resumes with the value (then cleared) or TIMEOUT
    def wait_notify(self, timeout_us=FOREVER):
        return self._wait_nval(timeout_us, True)

    # FreeRTOS ulTaskNotifyTake: wait for a non-zero value; resumes with it (clear=True:
    # then 0; clear=False: then one less), or TIMEOUT
    def take_notify(self, timeout_us=FOREVER, *, clear=True):
        return self._wait_nval(timeout_us, clear)

    # the two waits above; O(1), no allocation
    def _wait_nval(self, timeout_us, clear):
        t = self._cur()
        self._tick()
        t.wclear = clear
        if t.nval:
            return self._done_now(t, self._take_nval(t))
        return self._block(t, None, timeout_us, W_NOTIFY, None)

    # from an interrupt handler: notify(t, bits) at the next switch. OK, E_FULL (ring
    # full), E_RANGE (t not a task of this kernel, bits not an int in 1..2**30-1: checked
    # now, so a bad post never reaches the run loop)
    def notify_from_isr(self, t, bits=1):
        if not isinstance(t, Task) or t.k is not self or bits.__class__ is not int or bits <= 0 or bits > _NVAL_MAX:
            return self.isr.refuse()
        return self.isr.post(OP_NOTIFY, t, bits)

    # from an interrupt handler: notify_give(t) at the next switch. OK, E_FULL (ring
    # full), E_RANGE (t not a task of this kernel)
    def notify_give_from_isr(self, t):
        if not isinstance(t, Task) or t.k is not self:
            return self.isr.refuse()
        return self.isr.post(OP_GIVE_NOTIFY, t, 1)


class Deferred:
    # a ring of isr_slots operations posted from interrupt context (machine.Timer or pin
    # callbacks, micropython.schedule callbacks, another thread through micropython.schedule)
    # and applied by the run loop at the next switch. One producer context at a time (on
    # MicroPython soft callbacks never preempt each other) and one consumer (the loop): the
    # producer only writes a free slot, then moves `tail`; the loop only reads slots up to
    # `tail`, then moves `head`. Posting and applying allocate nothing.
    def __init__(self, k, size):
        self.k = k  # owning Kernel
        self.size = size  # slots; one is kept empty to tell full from empty
        self.ops = bytearray(size)  # slot -> OP_* code
        self.objs = [None] * size  # slot -> target (Task, Semaphore, Queue, EventFlags)
        self.vals = [0] * size  # slot -> argument (bits, or the queue item reference)
        self.head = 0  # next slot the loop applies
        self.tail = 0  # next slot a producer fills
        # counters modulo CARRY_N, each with its carry (name_g: units of CARRY_N), so they
        # stay small ints on the ESP32 however long the board runs
        self.dropped = 0  # posts refused because the ring was full
        self.dropped_g = 0
        self.refused = 0  # posts refused: at post time (bad argument, copy-mode queue) or by the target when applied (queue full, ...)
        self.refused_g = 0
        self.applied = 0  # operations applied
        self.applied_g = 0
        self.sources = 0  # attached interrupt sources: while > 0, run() idles instead of returning

    # record op(obj, val) for the next switch; OK, or E_FULL with nothing recorded. O(1)
    def post(self, op, obj, val):
        tl = self.tail
        nx = tl + 1
        if nx == self.size:
            nx = 0
        if nx == self.head:
            v = self.dropped + 1
            if v >= CARRY_N:
                self.dropped_g += 1
                v = 0
            self.dropped = v
            return E_FULL
        self.ops[tl] = op
        self.objs[tl] = obj
        self.vals[tl] = val
        self.tail = nx  # published after the slot: the loop never sees a half-written one
        self.k.alert = 1  # after tail: the loop clears alert before it reads tail
        return OK

    # a post refused at post time: counted in refused; returns E_RANGE. O(1), no allocation
    def refuse(self):
        self._count_refused()
        return E_RANGE

    # refused + 1 with its carry
    def _count_refused(self):
        v = self.refused + 1
        if v >= CARRY_N:
            self.refused_g += 1
            v = 0
        self.refused = v

    # an interrupt source (a timer, a pin) is attached: run() keeps idling for its posts
    def attach(self):
        self.sources += 1

    # the source is gone: run() may return once nothing is ready or timed
    def detach(self):
        if self.sources > 0:
            self.sources -= 1

    # apply every posted operation in order through the normal services (the run loop
    # calls this between slices); O(posted), no allocation
    def drain(self):
        k = self.k
        h = self.head
        while h != self.tail:
            op = self.ops[h]
            obj = self.objs[h]
            v = self.vals[h]
            self.objs[h] = None  # drop the references now
            self.vals[h] = 0
            if op == OP_NOTIFY:
                r = k.notify(obj, v)
            elif op == OP_GIVE_NOTIFY:
                r = k.notify_give(obj)
            elif op == OP_GIVE:
                r = obj.give()
            elif op == OP_PUT:
                r = obj.put_nowait(v)
            else:
                r = obj.set(v)
            if r is TIMEOUT or r < 0:
                self._count_refused()
            a = self.applied + 1
            if a >= CARRY_N:
                self.applied_g += 1
                a = 0
            self.applied = a
            h += 1
            if h == self.size:
                h = 0
            self.head = h
