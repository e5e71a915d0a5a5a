# The board serving requests with telemetry: the kernel runs the telemetry task
# (firmware_py/telemetry.py), an input task reading command frames from the console
# (prompt, stop, config for the next request, layout) and, per prompt, the decode task
# of firmware_py/decode.Session. Everything the board says goes out on stdout: frames
# (layout, periodic, events, the generated text) between ordinary printed lines, which
# `./kv monitor` picks apart. On a board:
#   from firmware_py import serve
#   serve.main()                              # wait for commands from ./kv monitor
#   serve.main(prompt="Once upon a time")     # or start one request at once
# `./kv monitor --start` runs serve.main over the raw REPL, then monitors.
#
# The decode side is decode.py's, unchanged: the server only polls it (Session.n_new
# through on_token, the cache and pool it booted, its bandwidth tracker or DMA queue
# when it has one) and hands its text to the telemetry task.
#
# The application config (firmware_py/appcfg.py; `./kv flash --config FILE` puts it on
# the board as kvrtos.json): serve.main reads it when present. Its "decode" section is
# the model, tokenizer and the options of every request (policy, window, sinks, kv_dtype,
# sampling), chosen at boot; a command from the console may still change them for the
# next request. Its "tasks" (audio capture, wake word, sensor reads, Wi-Fi bursts, the
# user's own module) are spawned beside the decode on one bandwidth tracker and DMA queue,
# which the decode's weight and KV traffic is charged to as well (accounting only on a
# real clock: the real reads take their own time) and which telemetry reports. After each
# request serve prints the decode's summary line and one "serve: workloads {...}" JSON
# line with each task's stats (released periods, deadline misses, ...).
import sys

from firmware_py import compat

# serve is what the raw REPL imports after its soft reset (./kv monitor --start, ./kv demo),
# which skips main.py's gc.threshold(16384): without it, the imports below scatter their
# compiled code over the heap with the garbage between collected into holes (on the 32-bit
# port, 111 KB of a 900 KB heap outside the largest piece, and a pool of 13 blocks where
# 25 fit). So serve collects its imports' garbage as it comes; decode.Session's boot, or a
# boot that fails (Server.boot), ends it. A threshold already set (main.py's) is kept
_GC_WAS = compat.gc_threshold(16384)
if _GC_WAS is not None and _GC_WAS != -1:
    compat.gc_threshold(_GC_WAS)

from firmware_py import decode, kv, telemetry as tm, thermal  # noqa: E402 - after the threshold
from firmware_py.clock import RealClock  # noqa: E402 - after the threshold
from firmware_py.sched import Kernel  # noqa: E402 - after the threshold
from firmware_py.status import E_RANGE, E_STATE, OK  # noqa: E402 - after the threshold

INPUT_US = 20000  # the input task looks for command bytes this often
CTRL_C = 3  # the console's interrupt character: ends serve (stdin_poller)
CONFIG_KEYS = ("kv_dtype", "policy", "window", "sinks", "temperature", "top_p", "seed", "backend", "rope",
               "piece_bytes", "kv_blocks", "priority", "slice_us")
BOOT_KEYS = ("kv_dtype", "policy", "window", "sinks", "backend", "rope", "temperature", "top_p", "seed", "kv_blocks",
             "slice_us")
INT_KEYS = ("window", "sinks", "seed", "piece_bytes", "kv_blocks", "priority", "slice_us")
# the KV element type when the config does not say: "auto" is int8 for an int8 model (the
# integer path `kv flash --model` puts on the board reads int8 rows), fp32 for an fp32 one
KV_DTYPE_DEFAULT = "auto"
IGNORED_KEYS = ("prefix", "chats", "turns", "sleep_ms")  # config decode keys the board does not run (./kv emulate does)
PRIO_TELEMETRY = 3  # highest: it sleeps almost always and never waits for the link
PRIO_INPUT = 2
PRIO_DECODE = 1
CONFIG_FILE = "kvrtos.json"  # the application config `./kv flash --config` writes beside main.py
WORKLOADS = "serve: workloads "  # the line after each request: JSON {task name: its stats}
SLICES = "serve: slices "  # after a request whose tasks overran the slice bound or missed deadlines: who


class ServeError(ValueError):
    # a bad configuration value (one line)
    pass


class Server:
    # one board: kernel, telemetry, input, and the request running now (if any).
    # write: fn(buf, n) for frames; poll_input: fn(reader) feeding the command bytes
    # available now to reader.byte (or None: no input); clock: the kernel's clock
    def __init__(self, write, poll_input=None, clock=None, model=decode.MODEL_FILE, tokenizer=decode.TOKENIZER_FILE,
                 link_bps=tm.DEFAULT_LINK_BPS, rate_hz=tm.DEFAULT_RATE_HZ, max_requests=0, layer_us=0, heap=0,
                 out=print, guard=None, app=None, board=None, **opts):
        # app: a loaded application config (appcfg.load) whose tasks run beside the decode,
        # or None; board: the firmware_py.board.Board they run on (default: board.json)
        from firmware_py import appcfg  # noqa: PLC0415 - configuration code, once

        self.app = app
        self.k = Kernel(clock or RealClock(), max_tasks=8 + (appcfg.max_tasks(app) if app is not None else 0),
                        verbose=True)
        # the thermal guard: guard(kernel) -> thermal.Guard, made once the kernel exists (None: no guard)
        self.guard = guard(self.k) if guard is not None else None
        self.model_path = model
        self.tok_path = tokenizer
        self.opts = {}  # the configuration of the next request (decode.Session options)
        self.set_config(opts)
        self.heap = heap  # usable heap the Session sizes its pool from (0: the board's)
        self.layer_us = layer_us  # VirtualClock runs: µs charged per layer
        self.out = out  # where plain lines go (print: the same stdout as the frames)
        self.session = None  # decode.Session of the last request, kept while the options do not change
        self.booted = None  # the options that session was booted with
        self.task = None  # the running request's Task, or None
        self.tasks = []  # request tasks spawned, released once finished (their slots are reused)
        self.req = 0  # requests started
        self.done = 0  # requests ended
        self.max_requests = max_requests  # stop the kernel after this many requests (0: never)
        self.stopping = False  # a stop command is ending the running request
        self.going_on = False  # True after a resume: prompts go on from the conversation
        self.resume_failed = False  # the last resume was refused: the next prompt is too
        self.save_as = ""  # a save asked while a request ran: made when it ends
        self.saving = ""  # the save the request's task is writing now
        self.tm = tm.Telemetry(write, kernel=self.k, link_bps=link_bps, rate_hz=rate_hz, thermal=self.guard,
                               meta={"model": model, "board": _board_name(), "cpu.mhz": _cpu_mhz()})
        self.bw = None  # the bandwidth tracker the config's tasks and the decode's traffic share, or None
        self.dma = None  # their DMA queue, or None
        self.loads = []  # the config's workloads (appcfg.spawn), in its order
        if app is not None and app["tasks"]:
            self._spawn_app(app, board if board is not None else _profile())
        self.reader = tm.CommandReader(self.command)
        self.poll_input = poll_input
        self.k.spawn("telemetry", PRIO_TELEMETRY, self.tm.task(self.k))
        if self.guard is not None:
            self.k.spawn("thermal", PRIO_TELEMETRY, self.guard.task())
        if poll_input is not None:
            self.k.spawn("input", PRIO_INPUT, self._input(self.k))
        self._tok = self._on_token  # one bound method for Session.on_token

    # the config's tasks on one tracker and DMA queue beside the decode (ServeError: one line)
    def _spawn_app(self, app, brd):
        from firmware_py import appcfg, bandwidth  # noqa: PLC0415

        if brd is None:
            raise ServeError("the config's tasks need the board profile %s (./kv flash writes it)" % decode.PROFILE)
        try:
            self.bw = bandwidth.Bandwidth(brd, kernel=self.k, user_categories=appcfg.categories(app))
            env = appcfg.make_env(self.k, self.bw, app, brd)
            self.dma = env["dma"]
            self.loads = appcfg.spawn(self.k, app, env)
        except ValueError as e:  # AppConfigError, BandwidthError, a workload's own check
            raise ServeError(str(e))
        self.tm.attach(bw=self.bw, dma=self.dma)

    # {task name: stats} of the config's workloads ({} without a config's tasks)
    def workload_stats(self):
        from firmware_py import appcfg  # noqa: PLC0415

        return appcfg.stats(self.loads) if self.loads else {}

    # the options of the next request from {key: value} (text or values); ServeError
    def set_config(self, opts):
        new = dict(self.opts)
        for key, v in opts.items():
            if key not in CONFIG_KEYS:
                raise ServeError("unknown option %r (known: %s)" % (key, ", ".join(CONFIG_KEYS)))
            try:
                if key in INT_KEYS:
                    v = int(v)
                elif key in ("temperature", "top_p"):
                    v = float(v)
            except ValueError:
                raise ServeError("%s must be a number, got %r" % (key, v))
            if key == "kv_dtype" and v not in kv.DTYPES and v != "auto":
                raise ServeError("kv_dtype must be one of %s or auto, got %r" % (", ".join(kv.DTYPES), v))
            if key == "slice_us" and not 0 <= v <= decode.SLICE_MAX_US:
                raise ServeError("slice_us must be in 0..%d (0: unbounded), got %d" % (decode.SLICE_MAX_US, v))
            if key == "policy" and v not in kv.POLICIES:
                raise ServeError("policy must be one of %s, got %r" % (", ".join(kv.POLICIES), v))
            if key == "priority" and not 0 <= v < self.k.priorities:
                raise ServeError("priority must be in 0..%d, got %d" % (self.k.priorities - 1, v))
            if key in ("piece_bytes", "kv_blocks") and not 0 <= v <= 1 << 24:
                raise ServeError("%s must be in 0..%d, got %d" % (key, 1 << 24, v))
            new[key] = v
        if new.get("policy", "full") == "full":
            new.pop("window", None)
        self.opts = new
        self.going_on = False  # new settings: the next prompt starts a new conversation
        self.resume_failed = False

    # --- commands (the CommandReader calls this with each good frame; may allocate) -----

    def command(self, ftype, body, seq):
        st = OK
        if ftype != tm.T_CMD_PROMPT and ftype != tm.T_CMD_RESUME and ftype != tm.T_CMD_LAYOUT:
            self.resume_failed = False  # it holds only for the prompt sent right after the resume (a layout ask reads)
        if ftype == tm.T_CMD_PROMPT:
            try:
                n, off = tm.get_varint(body, 0)
                text = body[off:].decode()
            except (ValueError, UnicodeError):
                st = E_RANGE
            else:
                st = self.start(text, n)
        elif ftype == tm.T_CMD_STOP:
            st = self.stop()
        elif ftype == tm.T_CMD_CONFIG:
            try:
                items = {}
                for line in body.decode().split("\n"):
                    if line:
                        key, _, v = line.partition("=")
                        items[key] = v
                self.set_config(items)
            except (ServeError, UnicodeError) as e:
                self.out("serve: config refused: %s" % e)
                st = E_RANGE
        elif ftype == tm.T_CMD_LAYOUT:
            self.tm.request_layout()
        elif ftype == tm.T_CMD_SAVE or ftype == tm.T_CMD_RESUME:
            from firmware_py import snapshot  # noqa: PLC0415 - only when asked

            st = snapshot.serve_command(self, ftype, body)
        else:
            st = E_RANGE
        self.tm.event(tm.EV_ACK, ftype, st, self.req)
        return st

    # --- snapshots: the commands' code is firmware_py/snapshot.py's, imported only when used ---

    # save the conversation as `name`; OK, or E_RANGE with the reason printed
    def save(self, name):
        from firmware_py import snapshot  # noqa: PLC0415 - only when asked

        return snapshot.serve_save(self, name)

    # the next prompts go on from snapshot `name`; OK, or E_STATE / E_RANGE with the reason printed
    def resume(self, name):
        from firmware_py import snapshot  # noqa: PLC0415 - only when asked

        return snapshot.serve_resume(self, name)

    # start a request: prompt text, n new tokens. OK, or E_STATE (one is running) /
    # E_RANGE (refused: the reason is printed as one line), with a refused event
    def start(self, text, n):
        if self.task is not None:
            self.tm.event(tm.EV_REFUSED, E_STATE, 1, self.req)
            return E_STATE
        if n.__class__ is not int or n < 1 or n > 100000:
            self.tm.event(tm.EV_REFUSED, E_RANGE, 1, self.req)
            return E_RANGE
        try:
            if self.going_on or self.resume_failed:  # after a resume: the conversation goes on (snapshot.py)
                from firmware_py import snapshot  # noqa: PLC0415 - resumed: it is in already

                s = self.session
                ids = snapshot.serve_continue(self, text)
            else:
                s = self.session
                if s is not None and self.boot_options() == self.booted:
                    ids = s.encode(text)  # before its sequence is reopened: a refused prompt keeps the conversation
                    s = self.session_next()
                else:
                    s = self.session_next()
                    ids = s.encode(text)
            s.piece_bytes = self.opts.get("piece_bytes", 0)  # weights read in pieces of this size (with traffic)
        except (decode.DecodeError, MemoryError) as e:
            self.out("serve: request refused: %s" % e)
            self.tm.event(tm.EV_REFUSED, E_RANGE, 1, self.req)
            return E_RANGE
        self.req = self.req + 1 if self.req < 0x3FFFFFFF else 1  # request numbers wrap below 2**30 (a small int)
        self._release()
        self.task = self.k.spawn("decode", self.opts.get("priority", PRIO_DECODE), self._request(s, ids, n, self.req))
        self.tasks.append(self.task)
        return OK

    # boot the decode now (model, tokenizer, the pool sized from the heap that is free) with
    # the options the next request would use, before the kernel runs the config's tasks:
    # the boot reads the whole model and collects the heap (hundreds of ms on a board), and
    # done at the first request it would hold the CPU inside the input task while the
    # real-time tasks wait. True when booted; a boot that fails prints its one line and
    # the first request boots again (and refuses with that line)
    def boot(self):
        try:
            self.session_next()
        except (decode.DecodeError, MemoryError) as e:
            was = compat.gc_threshold(-1)  # the import threshold ends here, as the boot would have ended it
            if was is not None and was != -1 and was != decode.BOOT_GC_BYTES:
                compat.gc_threshold(was)  # a caller's own threshold stays
            self.out("serve: boot deferred to the first request: %s" % e)
            return False
        return True

    # give the slots of finished request tasks back to the kernel
    def _release(self):
        keep = []
        for t in self.tasks:
            if t.finished():
                self.k.release(t)
            else:
                keep.append(t)
        self.tasks = keep

    # stop the running request; OK, or E_STATE when none runs
    def stop(self):
        t = self.task
        if t is None:
            return E_STATE
        self.stopping = True
        self.k.kill(t)
        if self.task is t:  # killed before its first slice: its finally never ran
            self._ended(self.req, 0, tm.DONE_STOP)
        return OK

    # the Session for the next request: the last one when its options still hold (its
    # sequence reopened), else a new one (the old one freed first)
    def session_next(self):
        s = self.session
        boot = self.boot_options()
        if s is not None and boot == self.booted:
            s.cache.close(s.h)
            cap = self._budget(s.cap, s.policy)
            s.h = s.cache.open(s.region, s.policy, cap, boot.get("sinks", kv.SINKS))
            # a new conversation: nothing of the last one goes on (snapshot.py's fields)
            s.pos0 = s.pend_pos = 0
            s.pending = -1
            s.last_ids = s.snap_tokens = None
            s.snap_dropped = 0
            self.attach(s, cap)
            return s
        self.session = None
        self.tm.attach()  # let go of the old pool and cache before a new one is made
        s = None
        compat.collect()
        kw = dict(boot)
        kw.setdefault("kv_dtype", KV_DTYPE_DEFAULT)
        if "kv_blocks" in kw:  # the pool's size in blocks (0: what the heap fits)
            kw["blocks"] = kw.pop("kv_blocks")
        # the boot keeps free what runs beside the decode: the telemetry task and the config's tasks
        kw["margin_for"] = ("decode", "telemetry", "tasks") if self.loads else ("decode", "telemetry")
        s = decode.Session(self.model_path, self.tok_path, heap=self.heap, **kw)
        self.out(s.boot_line())
        s.layer_us = self.layer_us
        s.on_token = self._tok
        if self.bw is not None:  # the decode's weights and KV traffic on the tasks' tracker
            s.traffic = decode.traffic_for(s, self.bw, charge_time=self.k.clock.virtual)
        s.thermal = self.guard
        cap = self._budget(s.cap, s.policy)
        if cap != s.cap:  # hot at boot: the sequence opens with the guard's smaller budget
            s.cache.close(s.h)
            s.h = s.cache.open(s.region, s.policy, cap, boot.get("sinks", kv.SINKS))
        self.session = s
        self.booted = boot
        self.attach(s, cap)
        return s

    # the options a Session is booted with (the next request's)
    def boot_options(self):
        return {k: self.opts[k] for k in BOOT_KEYS if k in self.opts}

    # the KV budget a request opens with: cap, or the thermal guard's share of it when hot
    # (its last reading: the guard samples once at boot, then every period)
    def _budget(self, cap, policy):
        g = self.guard
        if g is None:
            return cap
        b = g.budget(cap)
        if b < 1:
            return cap
        low = kv.min_budget(policy)
        return b if b >= low else low

    # telemetry watches session s's sequence, opened with a budget of cap tokens
    def attach(self, s, cap):
        self.tm.attach(pool=s.pool, cache=s.cache, bw=getattr(s, "bw", None) or self.bw,
                       dma=getattr(s, "dma", None) or self.dma)
        self.tm.watch_seq(s.h, cap)
        self.tm.meta["kv.policy"] = s.policy
        self.tm.meta["model.layers"] = s.cfg.n_layers
        self.tm.meta["model.seq_len"] = s.cfg.seq_len
        self.tm.meta["model.dim"] = s.cfg.dim

    # Session.on_token: a token was made (counters only: no allocation)
    def _on_token(self, s):
        self.tm.tokens += 1

    # the request's task: decode.Session.task with the text into telemetry, then the
    # done event (reason: done, stopped, full, error)
    def _request(self, s, ids, n, req):
        t = self.tm
        t.requests += 1
        t.request = req
        t.event(tm.EV_START, req, len(ids), n)
        reason = tm.DONE_ERROR
        try:
            yield from s.task(self.k, ids, n, t.text)
            reason = tm.DONE_OK if not s.stop else (tm.DONE_FULL if s.stop == "full" else tm.DONE_ERROR)
            self.report(s)
            if self.save_as:  # asked during the request: saved now, in its task, before its done event
                from firmware_py import snapshot  # noqa: PLC0415 - only when asked

                g = snapshot.serve_saves(self, req)
                try:
                    yield from g
                finally:
                    g.close()  # (MicroPython closes no generator a loop leaves: its file and .tmp go now)
        finally:
            if self.saving:  # stopped inside its save
                from firmware_py import snapshot  # noqa: PLC0415 - it is in already

                snapshot.serve_save_stopped(self, req)
            self._ended(req, s.n_new, reason)

    # after a request: the decode's summary line and, with a config's tasks, their stats
    def report(self, s):
        stop = s.stop_line()  # why the request ended early (the KV budget, a non-finite logit), as decode.run says it
        if stop:
            self.out(stop)
        self.out(s.summary())
        line = self.slice_line(s.slice_us)
        if line:
            self.out(line)
        if self.loads:
            import json  # noqa: PLC0415

            self.out(WORKLOADS + json.dumps(self.workload_stats()))

    # "serve: slices ..." naming every task whose longest slice passed the decode's slice
    # bound (its stats row's max slice), or "" when none did (allocates: reporting only)
    def slice_line(self, bound):
        if bound <= 0:
            return ""
        from firmware_py.sched import S_MAX_SLICE, S_MISSES  # noqa: PLC0415

        over = []
        for t in self.k.tasks:
            if t is not None and t.st[S_MAX_SLICE] > bound:
                over.append("%s %d us" % (t.name, t.st[S_MAX_SLICE]))
        missed = [t.name for t in self.k.tasks if t is not None and t.st[S_MISSES]]
        for nm, st in self.workload_stats().items():
            if st.get("deadline_misses") and nm not in missed:
                missed.append(nm)
        if not over and not missed:
            return ""
        return "%sbound %d us; over it: %s; deadline misses: %s" % (
            SLICES, bound, ", ".join(over) or "none", ", ".join(missed) or "none")

    # a request ended (made, stopped, refused by the cache, failed): its done event
    def _ended(self, req, made, reason):
        if self.stopping:
            reason = tm.DONE_STOP
            self.stopping = False
        t = self.tm
        self.task = None
        if self.save_as:  # asked during a request that was stopped: nothing to save
            self.out("serve: save refused: the request was stopped inside a token: save %s between requests" % self.save_as)
            t.event(tm.EV_ACK, tm.T_CMD_SAVE, E_RANGE, req)
            self.save_as = ""
        s = self.session
        if self.going_on and s is not None and s.pending < 0:  # stopped inside a token: nothing to go on from
            self.going_on = False
            self.out("serve: the conversation cannot go on: the next prompt starts a new one")
        t.event(tm.EV_DONE, req, made, reason)
        t.text(b"\n")
        self.done += 1
        if self.max_requests and self.done >= self.max_requests:
            self.k.spawn("finish", PRIO_INPUT, self._finish(self.k))

    # after the last request: two telemetry periods for its last frames, then stop
    def _finish(self, k):
        yield k.sleep_us(2 * self.tm.period_us + 1000)
        k.stop()

    def _input(self, k):
        rd = self.reader
        poll = self.poll_input
        while True:
            poll(rd)
            yield k.sleep_us(INPUT_US)

    # run the kernel (for_us < 0: until stopped)
    def run(self, for_us=-1):
        return self.k.run(for_us)


# this board's profile (board.json beside main.py), read once: a Board, or None when
# there is none or it does not load
def _profile():
    if not _PROFILE:
        try:
            from firmware_py import board  # noqa: PLC0415 - only when serving
            _PROFILE.append(board.load(decode.PROFILE))
        except (OSError, ValueError, ImportError):
            _PROFILE.append(None)
    return _PROFILE[0]


_PROFILE = []  # _profile()'s one reading


def _cpu_mhz():
    # the clock the board runs at (main.py's boot set the profile's), for the layout frame
    hz = compat.cpu_clock()[0]
    return "n/a" if hz is None else hz // 1000000


def _board_name():
    brd = _profile()
    return brd.name if brd is not None else "unknown"


# fn(reader) feeding the bytes waiting on stdin to reader.byte, or None where stdin
# cannot be polled (MicroPython: select.poll on sys.stdin; allocates a little per call,
# it runs every INPUT_US, never in the frame path).
# Ctrl-C (0x03) stops serve: poll raises KeyboardInterrupt when it reads one, before
# any byte after it, which stays for the REPL (mpremote's \r\x03 ... \r\x01). On a
# board's UART or USB-CDC the port's driver takes the interrupt character itself
# (micropython.kbd_intr(3), which main() keeps) and raises KeyboardInterrupt: stdin
# never holds a 0x03 there. Where the interrupt character does reach stdin (the unix
# port's raw REPL runs code with its terminal's ISIG off, as on the virtual board, or a
# board whose kbd_intr was switched off) the poller is what sees it, and a command
# frame never holds a 0x03 (commands are hex digits between 0x00 bytes).
def stdin_poller():
    try:
        import select  # noqa: PLC0415

        p = select.poll()
        p.register(sys.stdin, select.POLLIN)
    except (ImportError, OSError, AttributeError, TypeError, ValueError):
        return None
    src = getattr(sys.stdin, "buffer", sys.stdin)
    # CPython: the unbuffered stream, so read(1) takes one byte off the fd and poll()
    # still sees the rest (a BufferedReader would swallow them into its buffer)
    src = getattr(src, "raw", None) or src

    def poll(reader):
        for _ in range(512):
            ev = p.poll(0)
            if not ev or not ev[0][1] & select.POLLIN:
                return
            b = src.read(1)
            if not b:
                return
            c = b[0] if isinstance(b[0], int) else ord(b[0])
            if c == CTRL_C:
                raise KeyboardInterrupt
            reader.byte(c)

    return poll


# keep Ctrl-C the interrupt character of the board's console (a main.py may have
# switched it off with micropython.kbd_intr(-1)): serve ends on Ctrl-C, as mpremote,
# ./kv flash and ./kv monitor --start expect. Nothing on CPython.
def _keep_ctrl_c():
    f = getattr(compat.micropython, "kbd_intr", None) if compat.IS_MICROPYTHON else None
    if f is not None:
        try:
            f(CTRL_C)
        except (OSError, ValueError, TypeError):
            pass


# the thermal guard for this board: its profile's thresholds (board.json beside main.py)
# when there is one, else the defaults; BoardTemp where the port has the sensor, else
# ModelTemp on the kernel's clock
def _guard(k):
    brd = _profile()  # None: no readable profile here, the defaults (85 C throttle, 65 C shrink)
    if brd is not None:
        try:
            return thermal.for_board(k, brd)
        except thermal.ThermalError as e:  # a profile whose thresholds do not make sense: say so, serve without
            print("serve: thermal guard off: %s" % e)
            return None
    try:
        src = thermal.BoardTemp()
    except thermal.ThermalError:
        src = thermal.ModelTemp(k.clock)
    return thermal.Guard(k, src)


# the application config at path (kvrtos.json beside main.py): appcfg.load's validated
# dict, or None when there is no such file; a bad one raises appcfg.AppConfigError (one line)
def load_config(path=CONFIG_FILE):
    try:
        f = open(path)
    except OSError:
        return None
    try:
        text = f.read()
    finally:
        f.close()
    from firmware_py import appcfg  # noqa: PLC0415

    return appcfg.load(text)


# Server keyword arguments from a config's decode section: the model and tokenizer files
# and the request options serve knows (CONFIG_KEYS: the sampling and cache settings,
# piece_bytes, kv_blocks, the decode's priority); tokens and prompt are main()'s
def config_opts(app):
    d = app["decode"]
    out = {}
    for key in ("model", "tokenizer") + CONFIG_KEYS:
        if key in d:
            out[key] = d[key]
    return out


# the decode keys of a config the board does not run (IGNORED_KEYS present in it), in order
def config_ignored(app):
    d = app["decode"]
    return [key for key in IGNORED_KEYS if key in d]


# a configuration serve cannot start with: one line, then exit status 2 (SystemExit)
def _fail(msg):
    print("serve: %s" % msg)
    sys.exit(2)


# serve on this board: frames on stdout, commands from stdin. prompt: start one request
# at once; max_requests: return after that many (0: serve until Ctrl-C,
# which prints one line and raises KeyboardInterrupt on to the caller or the REPL)
# config: the application config's path (kvrtos.json; None or "" for none): its decode
# settings are the defaults (arguments given here win), its tasks run beside the decode,
# and its decode prompt (with its tokens) starts at once when main is given no prompt
def main(prompt=None, tokens=None, model=None, tokenizer=None,
         link_bps=tm.DEFAULT_LINK_BPS, rate_hz=tm.DEFAULT_RATE_HZ, max_requests=0, config=CONFIG_FILE, **opts):
    try:
        app = load_config(config) if config else None
    except ValueError as e:  # appcfg.AppConfigError: one line, a non-zero exit, no traceback
        _fail("%s: %s" % (config, e))
    kw = config_opts(app) if app is not None else {}
    kw.update(opts)
    if model is not None:
        kw["model"] = model
    if tokenizer is not None:
        kw["tokenizer"] = tokenizer
    kw.setdefault("model", decode.MODEL_FILE)
    kw.setdefault("tokenizer", decode.TOKENIZER_FILE)
    if app is not None:
        d = app["decode"]
        if prompt is None and d.get("prompt"):
            prompt = d["prompt"]
        if tokens is None and "tokens" in d:
            tokens = d["tokens"]
    tokens = 64 if tokens is None else tokens
    out = getattr(sys.stdout, "buffer", sys.stdout)
    try:
        srv = Server(tm.stream_writer(out), stdin_poller(), link_bps=link_bps,
                     rate_hz=rate_hz, max_requests=max_requests, guard=_guard, app=app, **kw)
    except ValueError as e:  # ServeError: a config task that cannot be built, a bad option
        _fail(("%s: %s" % (config, e)) if app is not None else str(e))
    if app is not None:
        names = ", ".join("%s (%s)" % (t["name"], t["kind"]) for t in app["tasks"]) or "none"
        print("serve: config %s %r: tasks beside decode: %s" % (config, app["name"], names))
        ign = config_ignored(app)
        if ign:
            print("serve: config %s: the board ignores decode %s (shared-prefix chats run in ./kv emulate only)"
                  % (config, ", ".join(ign)))
    print("serve: telemetry at %d Hz on a %d B/s link; waiting for commands (Ctrl-C ends)" % (rate_hz, link_bps))
    _keep_ctrl_c()
    try:
        srv.boot()  # before the kernel runs the tasks beside the decode (Server.boot)
        if prompt is not None:
            if srv.start(prompt, tokens) != OK:
                print("serve: the prompt was refused")
        srv.run()
    except KeyboardInterrupt:
        # Ctrl-C: one line, then the interrupt goes on to the REPL (or main.py's caller)
        print("\nserve: stopped by Ctrl-C after %d requests" % srv.req)
        raise
    return srv
