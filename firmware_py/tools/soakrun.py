# One run of the randomized soak (host/soak.py draws the runs, `./kv soak`): boot the
# decoding firmware the way a board does, with a board profile's heap, decode, and print
# what the soak checks. Runs on the 32-bit and the 64-bit MicroPython unix port (given
# -X heapsize for the board's usable heap) and on CPython. Usage (key=value arguments):
#   micropython -X heapsize=N firmware_py/tools/soakrun.py board=boards/esp32s3_n8r8.json \
#       model=M tokenizer=T kv_dtype=int8 policy=window window=64 tokens=2000 [sinks=4]
#       [batch=1] [config=scenarios/voice-assistant.json] [layer_us=2000] [seed=0]
# Three paths, as the board has them:
#   batch=1, no config: decode.run with trace_heap (the raw REPL's generate, a RealClock);
#   batch=1, config:    serve.Server with the config's tasks beside the decode (what
#                       `./kv flash --config` + serve.main run), on a VirtualClock;
#   batch>1:            decode.Session(seqs=batch) with that many chats on one shared
#                       prefix, the config's tasks spawned beside them (appcfg), telemetry.
# The free heap (after a collection) is sampled after every new token (decode.HeapTrace);
# with chats, until the first of them has made its last token or stopped (its task ends).
# Output: the firmware's own lines, then "soakrun: result {JSON}" with the tokens asked and
# made, each sequence's stop and stop line, the exceptions any task ended with (name,
# type, message) and the free-heap samples; exit 0. A boot the firmware refuses prints
# "soakrun: refused LINE" and exits 1; an exception out of the decode (a MemoryError ...)
# "soakrun: error TYPE: MESSAGE" and exits 3; bad arguments exit 2.
import gc

if hasattr(gc, "threshold"):  # MicroPython: collect the imports' garbage as it comes, so that the
    gc.threshold(16384)  # compiled code lands packed, not scattered over the free heap (decode.BOOT_GC_BYTES;
    # a decode.Session boot ends it)
import json
import sys

from firmware_py import appcfg, bandwidth, compat, decode, serve
from firmware_py import board as board_mod
from firmware_py import telemetry as tm
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel

PROMPT = "Once upon a time"
PREFIX = "Once upon a time, there was a little girl named Lily."
CHAT_TEXTS = (" She saw a big", " Her brother Tom asked", " One day", " The dog")
OPTS = {"board": "", "model": "", "tokenizer": "", "kv_dtype": "fp32", "policy": "full", "window": "0", "sinks": "4",
        "tokens": "64", "batch": "1", "config": "", "layer_us": "2000", "seed": "0", "temperature": "0"}


def _args(argv):
    o = dict(OPTS)
    for a in argv:
        k, sep, v = a.partition("=")
        if not sep or k not in o:
            raise ValueError("unknown argument %r (want key=value with key in %s)" % (a, ", ".join(sorted(o))))
        o[k] = v
    for k in ("board", "model", "tokenizer"):
        if not o[k]:
            raise ValueError("%s=PATH is required" % k)
    for k in ("window", "sinks", "tokens", "batch", "layer_us", "seed"):
        o[k] = int(o[k])
    o["temperature"] = float(o["temperature"])
    return o


def _discard(b):
    pass


def _null_write(buf, n):
    return n


def _say(line):
    print(line)


class _Trace(decode.HeapTrace):
    # decode.HeapTrace; last > 0 (chats): no more samples once one sequence has made its
    # last token, since the heap after a chat's task ended is not the heap of the same
    # tasks decoding on (its run state is let go): the samples are the steady state of
    # every chat decoding together
    def __init__(self, n, last=0, chats=()):
        decode.HeapTrace.__init__(self, n)
        self.last = last
        self.chats = chats  # a chat stopped by its cache (full, no block) ends its task too
        self.done = False
        # [sample] which chat took it (its index; 0 without chats): a chat samples while the
        # others are suspended inside their own steps, each holding its own live objects, so
        # the samples alternate between levels; the soak compares each chat's own samples
        self.who = compat.new_array("i", n + 1)

    def __call__(self, s):
        if self.done:
            return
        for c in self.chats:
            if c.stop:
                self.done = True
                return
        i = self.n
        decode.HeapTrace.__call__(self, s)
        if self.n > i:
            w = 0
            for j in range(len(self.chats)):
                if self.chats[j] is s:
                    w = j
            self.who[i] = w
        if self.last and s.n_new >= self.last:
            self.done = True


class _Server(serve.Server):
    # serve.Server whose token hook also samples the heap
    trace = None

    def _on_token(self, s):
        self.tm.tokens += 1
        if self.trace is not None:
            self.trace(s)


def _failed_tasks(k):
    out = []
    for t in k.tasks:
        if t is not None and getattr(t, "exc", None) is not None:
            out.append([t.name, type(t.exc).__name__, str(t.exc)])
    return out


def _seq(obj):
    return {"n_new": obj.n_new, "stop": obj.stop, "stop_line": obj.stop_line()}


def run_plain(o, brd, opts):
    # the raw REPL's generate: decode.run on a RealClock, nothing beside it
    s = decode.run(o["model"], o["tokenizer"], PROMPT, o["tokens"], out=_discard, trace_heap=True, **opts)
    tr = s.on_token
    return {"path": "decode.run", "seqs": [_seq(s)], "tasks_failed": [], "trace": tr}


def run_serve(o, brd, app, opts):
    # the board serving one request with the config's tasks beside it (serve.main's Server)
    kw = serve.config_opts(app)
    for key in ("model", "tokenizer", "kv_blocks"):  # the soak's model; the pool from the board's heap
        kw.pop(key, None)
    for key in ("kv_dtype", "policy", "window", "sinks", "seed", "temperature", "top_p"):
        kw.pop(key, None)
    for key in ("kv_dtype", "policy", "sinks", "seed", "temperature"):
        kw[key] = opts[key]
    if opts["policy"] != "full":
        kw["window"] = opts["window"]
    lines = []
    srv = _Server(_null_write, None, clock=VirtualClock(), model=o["model"], tokenizer=o["tokenizer"],
                  layer_us=o["layer_us"], heap=0, out=lines.append, max_requests=1, app=app, board=brd, **kw)  # heap 0: the boot measures
    tr = _Trace(o["tokens"])
    srv.trace = tr
    st = srv.start(PROMPT, o["tokens"])
    for ln in lines:
        print(ln)
    if st != 0:
        raise decode.DecodeError("serve refused the request (status %d): %s" % (st, " / ".join(lines)))
    del lines[:]
    srv.run()
    for ln in lines:
        print(ln)
    s = srv.session
    return {"path": "serve", "seqs": [_seq(s)], "tasks_failed": _failed_tasks(srv.k), "trace": tr}


def run_chats(o, brd, app, opts):
    # batch chats on one Session (seqs=batch) sharing a prefix, the config's tasks beside them
    n = o["batch"]
    # the kernel, the tracker, the config's tasks and the telemetry are made after the boot
    s = decode.Session(o["model"], o["tokenizer"], seqs=n, margin_for=("decode", "telemetry", "tasks"), **opts)
    s.layer_us = o["layer_us"]
    cs = [s.chat(CHAT_TEXTS[i % len(CHAT_TEXTS)], seed=o["seed"] + i) for i in range(n)]
    tr = _Trace(n * o["tokens"], o["tokens"], cs)
    s.on_token = tr
    cfg = app if app is not None else appcfg.load({})
    k = Kernel(VirtualClock(), max_tasks=appcfg.max_tasks(cfg) + n + 4, verbose=True)
    bw = bandwidth.Bandwidth(brd, kernel=k, user_categories=appcfg.categories(cfg))
    env = appcfg.make_env(k, bw, cfg, brd)
    appcfg.spawn(k, cfg, env)
    s.traffic = decode.traffic_for(s, bw, charge_time=True)
    tel = tm.Telemetry(_null_write, kernel=k, pool=s.pool, cache=s.cache, bw=bw, dma=env["dma"], max_seqs=n + 1)
    k.spawn("telemetry", 3, tel.task(k))
    k.spawn("prefix", 2, s.prefix_task(k, s.encode(PREFIX)))
    ts = [k.spawn(c.name, 1, c.task(k, o["tokens"])) for c in cs]

    def ender():
        for t in ts:
            yield k.join(t)
        k.stop()

    k.spawn("end", 0, ender())
    k.run()
    for c in cs:
        print(c.summary())
        if c.stop_line():
            print(c.stop_line())
    return {"path": "chats", "seqs": [_seq(c) for c in cs], "tasks_failed": _failed_tasks(k), "trace": tr}


def main(argv):
    try:
        o = _args(argv)
        brd = board_mod.load(o["board"])
        app = None
        if o["config"]:
            with open(o["config"]) as f:
                app = appcfg.load(f.read())
            if not app["tasks"]:
                app = None
    except (ValueError, OSError) as e:  # BoardError and AppConfigError are ValueErrors
        print("soakrun: %s" % e)
        return 2
    # the board's boot: it sizes the pool from the heap it measures (decode.Session sizing
    # "boot"; heap and reserve: the profile's figures, for its messages and the
    # calculator's figure beside it)
    opts = {"kv_dtype": o["kv_dtype"], "policy": o["policy"], "window": o["window"] if o["policy"] != "full" else 0,
            "sinks": o["sinks"], "seed": o["seed"], "temperature": o["temperature"], "heap": brd.mpy_heap, "reserve": brd.firmware_bytes,
            "sizing": "boot"}
    compat.collect()
    try:
        if o["batch"] > 1:
            r = run_chats(o, brd, app, opts)
        elif app is not None:
            r = run_serve(o, brd, app, opts)
        else:
            r = run_plain(o, brd, opts)
    except decode.DecodeError as e:
        print("soakrun: refused %s" % e)
        return 1
    except serve.ServeError as e:
        print("soakrun: refused %s" % e)
        return 1
    except Exception as e:  # noqa: BLE001 - a MemoryError (or any fault) out of the decode: the soak's finding
        print("soakrun: error %s: %s" % (type(e).__name__, e))
        return 3
    tr = r.pop("trace")
    r["free"] = list(tr.free[:tr.n])
    r["who"] = list(tr.who[:tr.n]) if isinstance(tr, _Trace) else [0] * tr.n  # the sequence that took each sample
    r["used_max"] = max(tr.used[:tr.n]) if tr.n else 0  # pool blocks in use, at most
    r["asked"] = o["tokens"]
    r["word_bytes"] = decode.WORD_BYTES
    r["gc_block"] = 4 * decode.WORD_BYTES  # the GC's allocation unit: 4 machine words
    r["heap_total"] = decode._heap_total()
    print("soakrun: result " + json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
