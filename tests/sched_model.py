# A reference model of the kernel's semantics, written independently of
# firmware_py/sched/ and as plainly as possible (lists scanned with min/max, no links):
# FreeRTOS cooperative mode with a tick that never lags.
#   - the ready task of highest (effective) priority runs; equal priorities in the order
#     they became ready; a yielder goes behind every task that became ready before its
#     slice ended, timers that fell due during the slice included;
#   - every service first makes ready the tasks whose timers are due (due-time order,
#     equal times in the order the timers were set); so does a slice's end, whether the
#     task yielded or ended (its joiners and mutex waiters whose timeouts fell due first);
#   - wait lists: highest priority first, then arrival (a priority change re-arrives);
#   - handoff: a put to a waiting getter / a give to a waiting taker / an unlock with
#     waiters goes straight to that task; it counts against capacity / maximum until the
#     task runs; if the task is killed first, it goes back;
#   - mutex priority inheritance through chains, recomputed on every change;
#   - notifications: one value per task, OR (notify) or +1 (notify_give); wait_notify
#     takes and clears, take_notify clears or decrements;
#   - a timeout longer than 2**29 - 1 us (half the ESP32's tick circle) is refused with
#     E_RANGE where the call would block, nothing registered.
# It interprets the scripts of tests/firmware/sched_diff.py and writes the same log.
import sched_diff as sd

OK, E_FULL, E_STALE, E_RANGE, E_STATE = 0, -1, -3, -5, -6
MAX_WAIT_US = (1 << 29) - 1  # written from docs/kernel.md, not imported
DONE, FAILED, KILLED = 4, 5, 6
TIMEOUT = "TIMEOUT"


class T:
    def __init__(self, i, prio, script):
        self.i, self.base, self.prio, self.script = i, prio, prio, script
        self.state = "ready"  # ready running blocked done killed
        self.pc = 0
        self.seq = 0  # ready order / wait order
        self.wait = None  # (kind, obj) while blocked on a list or notify
        self.wargs = None
        self.timer = None  # (wake, tseq)
        self.rv = None
        self.nval = 0
        self.handed = None  # "q" or "s"
        self.held = []  # mutexes, most recent first
        self.pending = False  # resumes by recording the result of op pc (rv)
        self.final = None  # DONE or KILLED once ended


class Model:
    def __init__(self, prog, park=False):
        prios, scripts, qcap, smax = prog
        self.park = park  # a finished script blocks forever instead of ending (sched_diff.Run(park=True))
        self.now = 0
        self.counter = 0
        self.tasks = [T(i, p, s) for i, (p, s) in enumerate(zip(prios, scripts, strict=True))]
        self.qcap, self.q, self.qhanded = qcap, [], 0
        self.smax, self.scount, self.shanded = smax, 0, 0
        self.owner = None
        self.bits = 0
        self.log = []
        for t in self.tasks:
            self.make_ready(t)

    def tick_seq(self):
        self.counter += 1
        return self.counter

    def make_ready(self, t):
        t.state = "ready"
        t.seq = self.tick_seq()

    def alive(self, t):
        return t.state not in ("done", "killed")

    def waiters(self, obj):
        ws = [t for t in self.tasks if t.state == "blocked" and t.wait and t.wait[1] == obj]
        return sorted(ws, key=lambda t: (-t.prio, t.seq))

    def block(self, t, kind, obj, to, args=None):
        t.state = "blocked"
        t.wait = (kind, obj)
        t.wargs = args
        t.seq = self.tick_seq()
        if to > 0:
            t.timer = (self.now + to, self.tick_seq())

    def wake(self, t, rv):
        t.wait = t.wargs = None
        t.timer = None
        t.rv = rv
        self.make_ready(t)

    def expire(self):
        while True:
            due = [t for t in self.tasks if t.timer and t.timer[0] <= self.now]
            if not due:
                return
            h = min(due, key=lambda t: t.timer)
            h.timer = None
            h.rv = OK if h.wait[0] == "sleep" else TIMEOUT
            kind, obj = h.wait
            h.wait = None
            if kind == "mutex":
                self.reprio(self.owner)
            self.make_ready(h)

    # --- priorities ---
    def inherited(self, t):
        p = t.base
        if "m" in t.held:
            ws = self.waiters("mutex")
            if ws:
                p = max(p, ws[0].prio)
        return p

    def reprio(self, t):
        if t is None or not self.alive(t):
            return
        p = self.inherited(t)
        while t is not None and t.prio != p:
            t.prio = p
            if t.state == "ready":
                t.seq = self.tick_seq()
                return
            if t.state == "blocked" and t.wait and t.wait[0] in ("q_get", "q_put", "sem", "event", "join", "mutex"):
                t.seq = self.tick_seq()
                if t.wait[0] == "mutex":
                    t = self.owner
                    p = self.inherited(t)
                    continue
            return

    # --- objects ---
    def q_offer(self, item):
        if len(self.q) + self.qhanded >= self.qcap:
            return TIMEOUT
        ws = self.waiters("q_get")
        if ws:
            self.q_hand(ws[0], item)
        else:
            self.q.append(item)
        return OK

    def q_hand(self, g, item):
        self.qhanded += 1
        g.handed = "q"
        self.wake(g, item)

    def q_admit(self):
        ps = self.waiters("q_put")
        if ps and len(self.q) + self.qhanded < self.qcap:
            p = ps[0]
            self.q_offer(p.wargs)
            self.wake(p, OK)

    def q_take(self):
        v = self.q.pop(0)
        self.q_admit()
        return v

    def s_release(self):
        ws = self.waiters("sem")
        if ws:
            self.shanded += 1
            ws[0].handed = "s"
            self.wake(ws[0], OK)
        else:
            self.scount += 1

    def m_pass_on(self):
        o = self.owner
        o.held.remove("m")
        self.owner = None
        ws = self.waiters("mutex")
        if ws:
            w = ws[0]
            self.owner = w
            w.held.insert(0, "m")
            self.wake(w, OK)
            self.reprio(w)

    def ev_ok(self, mask, wall):
        m = self.bits & mask
        return m == mask if wall else m != 0

    def deliver(self, t):
        if t.state == "blocked" and t.wait and t.wait[0] == "notify":
            self.wake(t, self.take_nval(t, t.wargs))

    def take_nval(self, t, clear):
        v = t.nval
        t.nval = 0 if clear else v - 1
        return v

    def finish(self, u, st):
        u.timer = None
        if u.state == "blocked" and u.wait:
            kind = u.wait[0]
            u.wait = None
            if kind == "mutex":
                self.reprio(self.owner)
        u.wait = None
        if u.handed == "q":
            self.qhanded -= 1
            item = u.rv
            ws = self.waiters("q_get")
            if ws:
                self.q_hand(ws[0], item)
            else:
                self.q.insert(0, item)
        elif u.handed == "s":
            self.shanded -= 1
            self.s_release()
        u.handed = None
        for _ in list(u.held):
            self.m_pass_on()
        u.state = "done" if st == DONE else "killed"
        u.final = st
        for j in self.waiters(("join", u.i)):
            self.wake(j, st)

    # --- one op of the running task t; returns ("go", result) or ("block",) or ("yield",) ---
    def op(self, t, op):
        c, a, to, j, bits, f5, f6 = op
        other = self.tasks[j]
        if c not in (sd.YIELD, sd.CHARGE):
            if c == sd.NOTIFY and not self.alive(other):
                return "go", E_STALE
            if c == sd.NGIVE and not self.alive(other):
                return "go", E_STALE
            if c == sd.KILL and not self.alive(other):
                return "go", E_STALE
            if c == sd.UNLOCK and self.owner is not t:
                return "go", E_STATE
            self.expire()
        if c == sd.YIELD:
            return ("yield",)
        if c == sd.CHARGE:
            self.now += a
            return "go", None
        if c == sd.SLEEP:
            self.block(t, "sleep", None, -1)
            t.timer = (self.now + a, self.tick_seq())
            return ("block",)
        if c in (sd.QPUT, sd.QPUT_NW):
            r = self.q_offer(100 + a)
            if r is TIMEOUT and c == sd.QPUT and to != 0:
                if to > MAX_WAIT_US:
                    return "go", E_RANGE  # refused before anything is registered
                self.block(t, "q_put", "q_put", to, 100 + a)
                return ("block",)
            return "go", r
        if c in (sd.QGET, sd.QGET_NW):
            if self.q:
                return "go", self.q_take()
            if c == sd.QGET and to != 0:
                if to > MAX_WAIT_US:
                    return "go", E_RANGE  # refused before anything is registered
                self.block(t, "q_get", "q_get", to)
                return ("block",)
            return "go", TIMEOUT
        if c == sd.TAKE:
            if self.scount:
                self.scount -= 1
                return "go", OK
            if to == 0:
                return "go", TIMEOUT
            if to > MAX_WAIT_US:
                return "go", E_RANGE  # refused before anything is registered
            self.block(t, "sem", "sem", to)
            return ("block",)
        if c == sd.GIVE:
            if self.scount + self.shanded >= self.smax:
                return "go", E_FULL
            self.s_release()
            return "go", OK
        if c == sd.LOCK:
            if self.owner is None:
                self.owner = t
                t.held.insert(0, "m")
                return "go", OK
            if self.owner is t:
                return "go", E_STATE
            if to == 0:
                return "go", TIMEOUT
            if to > MAX_WAIT_US:
                return "go", E_RANGE  # refused before anything is registered
            self.block(t, "mutex", "mutex", to)
            self.reprio(self.owner)
            return ("block",)
        if c == sd.UNLOCK:
            self.m_pass_on()
            self.reprio(t)
            return "go", OK
        if c == sd.EVSET:
            self.bits |= bits
            clear = 0
            for w in self.waiters("event"):
                mask, wall, wclear = w.wargs
                if self.ev_ok(mask, wall):
                    if wclear:
                        clear |= mask
                    self.wake(w, self.bits)
            self.bits &= ~clear
            return "go", self.bits
        if c == sd.EVCLEAR:
            self.bits &= ~bits
            return "go", self.bits
        if c == sd.EVWAIT:
            if self.ev_ok(bits, f5 == 1):
                b = self.bits
                if f6 == 1:
                    self.bits &= ~bits
                return "go", b
            if to == 0:
                return "go", TIMEOUT
            if to > MAX_WAIT_US:
                return "go", E_RANGE  # refused before anything is registered
            self.block(t, "event", "event", to, (bits, f5 == 1, f6 == 1))
            return ("block",)
        if c == sd.NOTIFY:
            other.nval |= bits
            self.deliver(other)
            return "go", OK
        if c == sd.NGIVE:
            other.nval += 1
            self.deliver(other)
            return "go", OK
        if c in (sd.WAITN, sd.TAKEN):
            clear = c == sd.WAITN or f5 == 1
            if t.nval:
                return "go", self.take_nval(t, clear)
            if to == 0:
                return "go", TIMEOUT
            if to > MAX_WAIT_US:
                return "go", E_RANGE  # refused before anything is registered
            self.block(t, "notify", "notify-%d" % t.i, to, clear)
            return ("block",)
        if c == sd.KILL:
            self.finish(other, KILLED)
            return "go", OK
        # JOIN
        if other is t:
            return "go", E_STATE
        if not self.alive(other):
            return "go", other.final
        if to == 0:
            return "go", TIMEOUT
        if to > MAX_WAIT_US:
            return "go", E_RANGE  # refused before anything is registered
        self.block(t, "join", ("join", other.i), to)
        return ("block",)

    def rec(self, t, pc, r):
        self.log.append((self.now, t.i, pc, sd.R_TIMEOUT if r is TIMEOUT else sd.R_NONE if r is None else r))

    # --- the scheduler ---
    def run(self):
        while True:
            self.expire()
            ready = [t for t in self.tasks if t.state == "ready"]
            if not ready:
                timers = [t.timer for t in self.tasks if t.timer]
                if not timers:
                    break
                self.now = max(self.now, min(timers)[0])
                continue
            t = min(ready, key=lambda t: (-t.prio, t.seq))
            if t.handed == "q":
                t.handed = None
                self.qhanded -= 1
                self.q_admit()
            elif t.handed == "s":
                t.handed = None
                self.shanded -= 1
            self.log.append((self.now, t.i, -1, 0))
            t.state = "running"
            if t.pending:
                t.pending = False
                self.rec(t, t.pc, t.rv)
                t.rv = None
                t.pc += 1
            end = None
            while t.pc < len(t.script):
                r = self.op(t, t.script[t.pc])
                if r[0] == "go":
                    self.rec(t, t.pc, r[1])
                    t.pc += 1
                    continue
                t.pending = True  # resumes by recording this op's result
                if r[0] == "yield":
                    t.rv = None
                    self.expire()
                    self.make_ready(t)
                end = r[0]
                break
            if end is None:
                self.expire()  # an ending task's due timers first, as a yielder's (docs/kernel.md)
                if self.park:
                    self.block(t, "park", "park", -1)
                else:
                    self.finish(t, DONE)
        out = [sum(1 for t in self.tasks if self.alive(t))]
        for t in self.tasks:
            out.append({"ready": 0, "blocked": 3, "done": DONE, "killed": KILLED}[t.state])
            out.append(t.nval)
        out.append(len(self.q))
        out.append(self.scount)
        out.append(-1 if self.owner is None else self.owner.i)
        out.append(self.bits)
        return out
