# Synchronisation objects: Queue, Semaphore, Mutex (priority inheritance), EventFlags.
# All storage is allocated at creation. Every blocking call takes timeout_us in the same
# place (first after the object's own argument; further options are keyword-only) and
# returns BLOCK, which the task yields; its *_nowait twin returns exactly what the
# blocking call with timeout_us=0 resumes with.
#
# Direct handoff: a put to a waiting getter, a give to a waiting taker, an unlock with
# waiters hand the item / token / ownership to the woken task at once. Until that task
# runs the item still counts against the queue's capacity and the token against the
# semaphore's maximum (as in FreeRTOS, where it stays in the object until the woken task
# takes it); if the woken task is killed before it runs, it goes back (give_back).
from firmware_py.compat import const, micropython, ptr8
from firmware_py.status import OK, E_FULL, E_RANGE, E_STATE
from firmware_py.sched.notify import OP_PUT, OP_GIVE, OP_SET
from firmware_py.sched.task import DONE, W_QGET, W_QPUT, W_SEM, W_EVENT, W_MUTEX, FOREVER, TIMEOUT, \
    SchedError, TaskList

_EVENT_BITS = const(24)  # event flag bits usable (FreeRTOS: 24 on 32-bit ticks)


@micropython.viper
def _copy(dst, doff: int, src, soff: int, n: int):
    # copy n bytes src[soff:] -> dst[doff:] without a slice object; O(n), no allocation
    d = ptr8(dst)
    s = ptr8(src)
    for i in range(n):
        d[doff + i] = s[soff + i]


class Queue:
    # fixed-capacity FIFO allocated at creation. item_size 0: holds object references;
    # item_size n: each item is n bytes copied in (put(buf)) and out (get(into=buf)).
    # A waiting getter receives an item directly from put; putters wait while full.
    def __init__(self, k, capacity, item_size=0):
        if capacity < 1 or item_size < 0:
            raise SchedError("queue: capacity must be >= 1 and item_size >= 0")
        self.k = k  # owning Kernel
        self.capacity = capacity  # items it holds (handed items not yet taken included)
        self.item_size = item_size  # bytes per item, 0 = object references
        self.items = [None] * capacity if item_size == 0 else None  # ring of references
        self.buf = bytearray(capacity * item_size) if item_size else None  # ring of items, capacity x item_size bytes
        self.head = 0  # ring index of the oldest item
        self.count = 0  # items in the ring, 0..capacity - handed
        self.handed = 0  # items handed to woken getters that have not run yet
        self.getters = TaskList()  # tasks blocked in get (none while count > 0)
        self.putters = TaskList()  # tasks blocked in put (none while there is room)

    # blocking put: resumes with OK once stored (or handed to a getter), TIMEOUT, or
    # E_RANGE (copy mode: item shorter than item_size)
    def put(self, item, timeout_us=FOREVER):
        k = self.k
        t = k._cur()
        k._tick()
        r = self._offer(item)
        if r is not TIMEOUT:
            return k._done_now(t, r)
        if timeout_us == 0:
            return k._done_now(t, TIMEOUT)
        t.wval = item  # stored by the get that frees a slot
        return k._block(t, self.putters, timeout_us, W_QPUT, self)

    # put(item, 0) without a task: OK, TIMEOUT (full) or E_RANGE; from anywhere but an interrupt
    def put_nowait(self, item):
        self.k._tick()
        return self._offer(item)

    # from an interrupt handler (object queues): put_nowait(item) at the next switch; OK,
    # E_FULL (ring full), or E_STATE for a copy-mode queue (its bytes would be read at the
    # switch, later than posted: refused now, counted in k.isr.refused)
    def put_from_isr(self, item):
        if self.item_size:
            self.k.isr._count_refused()
            return E_STATE
        return self.k.isr.post(OP_PUT, self, item)

    # store item or hand it to the first waiting getter: OK, TIMEOUT when full; O(1) (+ copy)
    def _offer(self, item):
        n = self.item_size
        if n and len(item) < n:
            return E_RANGE
        if self.count + self.handed >= self.capacity:
            return TIMEOUT
        g = self.getters.head
        if g is not None:
            self._hand(g, item)
            return OK
        i = self.head + self.count
        if i >= self.capacity:
            i -= self.capacity
        if n:
            _copy(self.buf, i * n, item, 0, n)
        else:
            self.items[i] = item
        self.count += 1
        return OK

    # give item to waiting getter g: copied into its buffer (copy mode) or as its result
    def _hand(self, g, item):
        self.handed += 1
        g.hobj = self
        if self.item_size:
            into = g.wval
            _copy(into, 0, item, 0, self.item_size)
            g.hval = into
            self.k._wake(g, OK)
        else:
            self.k._wake(g, item)

    # blocking get: resumes with the item (copy mode: OK, the bytes in `into`), TIMEOUT,
    # or E_RANGE (copy mode: `into` missing or shorter than item_size)
    def get(self, timeout_us=FOREVER, *, into=None):
        k = self.k
        t = k._cur()
        k._tick()
        r = self._poll(into)
        if r is not TIMEOUT:
            return k._done_now(t, r)
        if timeout_us == 0:
            return k._done_now(t, TIMEOUT)
        t.wval = into  # the putter that hands us an item copies it here
        return k._block(t, self.getters, timeout_us, W_QGET, self)

    # get(0) without a task: the item (copy mode: OK), TIMEOUT when empty, or E_RANGE
    def get_nowait(self, *, into=None):
        self.k._tick()
        return self._poll(into)

    # the oldest item if any (see get), TIMEOUT when empty
    def _poll(self, into):
        n = self.item_size
        if n and (into is None or len(into) < n):
            return E_RANGE
        if self.count:
            return self._take(into)
        return TIMEOUT

    # remove the oldest item, then let the first waiting putter fill the slot; O(1)
    def _take(self, into):
        h = self.head
        n = self.item_size
        if n:
            _copy(into, 0, self.buf, h * n, n)
            v = OK
        else:
            v = self.items[h]
            self.items[h] = None
        h += 1
        if h == self.capacity:
            h = 0
        self.head = h
        self.count -= 1
        self._admit()
        return v

    # room was made: the first waiting putter's item goes in and it wakes with OK
    def _admit(self):
        p = self.putters.head
        if p is not None and self.count + self.handed < self.capacity:
            item = p.wval
            self._offer(item)
            self.k._wake(p, OK)

    # the getter an item was handed to has run: the item leaves the queue's capacity
    def settle(self):
        self.handed -= 1
        self._admit()

    # the getter an item was handed to was killed before it ran: the item goes to the
    # next waiting getter, else back to the front of the queue (it was the oldest)
    def give_back(self, t):
        self.handed -= 1
        n = self.item_size
        item = t.hval if n else t.rv
        g = self.getters.head
        if g is not None:
            self._hand(g, item)
            return
        h = self.head - 1
        if h < 0:
            h = self.capacity - 1
        if n:
            _copy(self.buf, h * n, item, 0, n)
        else:
            self.items[h] = item
        self.head = h
        self.count += 1


class Semaphore:
    # counting semaphore 0..maximum (maximum 1: binary); take blocks, give never does
    def __init__(self, k, initial=0, maximum=1):
        if maximum < 1 or not (0 <= initial <= maximum):
            raise SchedError("semaphore: need 0 <= initial <= maximum and maximum >= 1")
        self.k = k  # owning Kernel
        self.count = initial  # tokens available
        self.handed = 0  # tokens given to woken takers that have not run yet
        self.maximum = maximum  # give() beyond count + handed == maximum fails
        self.waiters = TaskList()  # tasks blocked in take, priority order

    # blocking take: resumes with OK, or TIMEOUT; O(1) (+ wait-list insert)
    def take(self, timeout_us=FOREVER):
        k = self.k
        t = k._cur()
        k._tick()
        if self.count:
            self.count -= 1
            return k._done_now(t, OK)
        return k._block(t, self.waiters, timeout_us, W_SEM, self)

    # take(0) without a task: OK if a token was taken, else TIMEOUT
    def take_nowait(self):
        self.k._tick()
        if self.count:
            self.count -= 1
            return OK
        return TIMEOUT

    # release one token (handed to the first waiter instead): OK, or E_FULL at maximum; O(1)
    def give(self):
        self.k._tick()
        if self.count + self.handed >= self.maximum:
            return E_FULL
        self._release()
        return OK

    # from an interrupt handler: give() at the next switch; OK or E_FULL (ring full)
    def give_from_isr(self):
        return self.k.isr.post(OP_GIVE, self, 0)

    # a token becomes free: to the first waiter, else counted
    def _release(self):
        w = self.waiters.head
        if w is not None:
            self.handed += 1
            w.hobj = self
            self.k._wake(w, OK)
        else:
            self.count += 1

    # the taker a token was handed to has run: the token is its own
    def settle(self):
        self.handed -= 1

    # the taker a token was handed to was killed before it ran: the token is released again
    def give_back(self, t):
        self.handed -= 1
        self._release()


class Mutex:
    # a lock owned by one task, not recursive (the owner locking it again gets E_STATE).
    # Priority inheritance: while a task waits for it, its owner runs at least at that
    # task's priority (through chains of mutexes); the owner's priority falls back when it
    # unlocks or when the waiter gives up (timeout, killed). Unlocking hands ownership to
    # the highest-priority waiter. A task killed while holding it passes it on.
    def __init__(self, k):
        self.k = k  # owning Kernel
        self.owner = None  # Task holding it, or None
        self.hnext = None  # next Mutex held by the same owner (Task.held chain)
        self.waiters = TaskList()  # tasks blocked in lock, priority order

    # blocking lock: resumes with OK once owned, TIMEOUT, or E_STATE (already its owner)
    def lock(self, timeout_us=FOREVER):
        k = self.k
        t = k._cur()
        k._tick()
        r = self._poll(t)
        if r is not TIMEOUT:
            return k._done_now(t, r)
        r = k._block(t, self.waiters, timeout_us, W_MUTEX, self)
        if t.wkind == W_MUTEX:
            k._reprio(self.owner)  # the owner inherits our priority if higher
        return r

    # lock(0): OK, TIMEOUT (owned by another task) or E_STATE (already owned by the caller,
    # or no running task)
    def lock_nowait(self):
        k = self.k
        t = k.current
        if t is None or t.state >= DONE:  # no task, or a killed one (its cleanup code): it can own nothing
            return E_STATE
        k._tick()
        return self._poll(t)

    # take it if free (see lock_nowait)
    def _poll(self, t):
        o = self.owner
        if o is None:
            self._own(t)
            return OK
        if o is t:
            return E_STATE
        return TIMEOUT

    # t becomes the owner: on t's chain of held mutexes; O(1)
    def _own(self, t):
        self.owner = t
        self.hnext = t.held
        t.held = self

    # unlock by its owner: OK (ownership goes to the first waiter, who wakes), or E_STATE
    # when the caller is not the owner; the caller's inherited priority is recomputed
    def unlock(self):
        k = self.k
        t = k.current
        if t is None or self.owner is not t:
            return E_STATE
        k._tick()
        self.pass_on()
        k._reprio(t)
        return OK

    # off the owner's chain, then to the first waiter (woken with OK) or free. O(held)
    def pass_on(self):
        o = self.owner
        p = None
        m = o.held
        while m is not self:
            p = m
            m = m.hnext
        if p is None:
            o.held = self.hnext
        else:
            p.hnext = self.hnext
        self.hnext = None
        self.owner = None
        w = self.waiters.head
        if w is not None:
            self._own(w)
            self.k._wake(w, OK)
            self.k._reprio(w)  # the remaining waiters may lift the new owner


class EventFlags:
    # a word of _EVENT_BITS event bits; tasks wait for any or all of a mask
    def __init__(self, k):
        self.k = k  # owning Kernel
        self.bits = 0  # current bits
        self.waiters = TaskList()  # blocked tasks, priority order

    # set bits and wake every waiter now satisfied (each resumes with the bits as set);
    # returns the bits after the call (clear-on-exit waiters applied), or E_RANGE for bits
    # outside the low 24; O(waiters)
    def set(self, bits):
        if bits < 0 or bits >> _EVENT_BITS:
            return E_RANGE
        self.k._tick()
        b = self.bits | bits
        self.bits = b
        clear = 0
        w = self.waiters.head
        while w is not None:
            nxt = w.next
            m = b & w.wbits
            if (m == w.wbits) if w.wall else m:
                if w.wclear:
                    clear |= w.wbits
                self.k._wake(w, b)
            w = nxt
        if clear:
            self.bits &= ~clear
        return self.bits

    # from an interrupt handler: set(bits) at the next switch; OK, E_FULL (ring full), or
    # E_RANGE (bits not an int in the low 24: refused now, counted in k.isr.refused)
    def set_from_isr(self, bits):
        if bits.__class__ is not int or bits < 0 or bits >> _EVENT_BITS:
            return self.k.isr.refuse()
        return self.k.isr.post(OP_SET, self, bits)

    # clear bits (after serving the timers due by now, as every service); returns the bits
    # after the call, or E_RANGE; O(1)
    def clear(self, bits):
        if bits < 0 or bits >> _EVENT_BITS:
            return E_RANGE
        self.k._tick()
        self.bits &= ~bits
        return self.bits

    # wait for any (wait_all False) or all bits of mask; resumes with the bits seen,
    # TIMEOUT, or E_RANGE for a mask that is 0 or outside the low 24 bits; clear=True
    # clears the mask bits on success
    def wait(self, mask, timeout_us=FOREVER, *, wait_all=False, clear=False):
        k = self.k
        t = k._cur()
        k._tick()
        r = self._poll(mask, wait_all, clear)
        if r is not TIMEOUT:
            return k._done_now(t, r)
        t.wbits = mask
        t.wall = wait_all
        t.wclear = clear
        return k._block(t, self.waiters, timeout_us, W_EVENT, self)

    # wait(mask, 0, ...) without a task: the bits, TIMEOUT, or E_RANGE
    def wait_nowait(self, mask, *, wait_all=False, clear=False):
        self.k._tick()
        return self._poll(mask, wait_all, clear)

    # the bits if mask is satisfied now (clearing them if asked), else TIMEOUT
    def _poll(self, mask, wait_all, clear):
        if mask <= 0 or mask >> _EVENT_BITS:
            return E_RANGE
        b = self.bits
        m = b & mask
        if (m == mask) if wait_all else m:
            if clear:
                self.bits = b & ~mask
            return b
        return TIMEOUT
