# Chats sharing one pool and a prompt prefix (firmware_py/decode.py: Session(seqs=N),
# chat(), prefix_task(), Chat.task()) on the committed kvrtos-tiny model, plain backend,
# on every interpreter: the prefix fed once and forked (copy-on-write), each chat's greedy
# tokens equal a single Session's on the same ids (the shared blocks are not corrupted by
# the other chat's writes), the pool's high-water shows the sharing, the chats interleave,
# a chat that runs out of blocks stops with a reported refusal, and the API's mistakes are
# one-line DecodeErrors.
from fwtest import check, eq, raises, done
from firmware_py import compat, decode
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel

TINY = "models/kvrtos-tiny/"
M, T = TINY + "model.bin", TINY + "tokenizer.bin"
N = 5  # new tokens per chat
OPTS = {"backend": "plain", "heap": 3000000}
PREFIX = "Once upon a time there was a little cat. The cat was happy. One day the cat saw a big dog and"


def single(ids, n=N):
    # a plain single-sequence Session on ids: (tokens, pool high-water)
    s = decode.Session(M, T, **OPTS)
    k = Kernel(VirtualClock(), max_tasks=4)
    k.spawn("decode", 1, s.task(k, ids, n, lambda b: None))
    k.run()
    return list(s.tokens[:s.n_new]), s.pool.high_water


def free():
    # drop the last run's Session (its weights, pool, chats) before booting the next: the
    # unix port's heap must still have pieces large enough for the weights. What the checks
    # keep across runs (token lists) was allocated while a Session filled the heap: copied
    # after the collection it moves to the lowest free space instead of splitting the space
    # the next weights need (the 64-bit port's largest free block was within 10 KB of them)
    global s, a, b, cs, c, k, outs, order, e, kept, r, want, want_own, pre, own
    s = a = b = cs = c = k = outs = order = e = kept = r = None
    compat.collect()
    want, want_own, pre, own = list(want), list(want_own), list(pre), list(own)


def chats(texts, n=N, **kw):
    # a Session for len(texts) chats on PREFIX: (session, chats, per-chat output, the order tokens came in)
    o = dict(OPTS)
    o.update(kw)
    s = decode.Session(M, T, seqs=len(texts), **o)
    s.layer_us = 100
    order = []
    s.on_token = lambda c: order.append(c.index)
    cs = [s.chat(t) for t in texts]
    k = Kernel(VirtualClock(), max_tasks=8, verbose=True)
    outs = [[] for _ in cs]
    k.spawn("prefix", 2, s.prefix_task(k, s.encode(PREFIX)))
    ts = [k.spawn(c.name, 1, c.task(k, n, outs[i].append)) for i, c in enumerate(cs)]
    k.run()
    for t in ts:
        check(t.exc is None, "chat task ended without an exception: %r" % (t.exc,))
    return s, cs, [b"".join(x) for x in outs], order


s0 = decode.Session(M, T, **OPTS)
pre = s0.encode(PREFIX)
check(len(pre) >= 33, "the prefix is at least 32 tokens + BOS: %d" % len(pre))
own = s0.tok.encode("the dog ran", False, False)
want, hw1 = single(pre)
want_own, _ = single(pre + own)
s0 = None
compat.collect()

# --- two chats, the same prefix: each one's greedy tokens are the single Session's ---
s, (a, b), outs, order = chats(["", ""])
eq(list(a.tokens[:a.n_new]), want, "chat 0 (the prefix's own sequence): the single Session's tokens")
eq(list(b.tokens[:b.n_new]), want, "chat 1 (a fork of it): the same tokens")
eq((a.n_new, b.n_new, a.stop, b.stop), (N, N, "", ""), "both made every token")
eq((a.n_prompt, b.n_prompt), (len(pre), len(pre)), "n_prompt: the prefix (no own text)")
r = s.chats_report()
shared_blocks = r["shared_blocks"]
eq(r["shared_tokens"], len(pre) - 1, "the prefix but its last token cached once")
check(r["shared_blocks"] >= 2, "the prefix fills shared blocks: %d" % r["shared_blocks"])
hw2 = s.pool.high_water
check(hw2 < 2 * hw1, "pool high-water of 2 chats (%d) is less than twice one's (%d)" % (hw2, hw1))
eq(hw2, 2 * hw1 - (r["shared_blocks"] - 1), "the full blocks of the prefix counted once (its last, partial, copied)")
eq(a.cache.cached(a.h), len(pre) + N - 1, "chat 0 caches the prefix and its tokens")
check(a.h != b.h, "two sequences")
eq(outs[0], outs[1], "the same text")
check(a.t_first > s.t_end and b.t_first > s.t_end, "first tokens after the prefix")
eq(a.t_start, s.t_start, "a chat's time to first token counts from the prefix's start")
check(order[:4] in ([0, 1, 0, 1], [1, 0, 1, 0]), "the kernel interleaves the chats: %r" % (order,))
check(a.summary().startswith(decode.SUMMARY), "a chat's summary line")
eq(a.stop_line(), "", "no stop line")

free()
# --- a chat with its own text: the single Session's tokens on prefix + its ids ---
s, (a, b), outs, order = chats(["", "the dog ran"])
eq(list(a.tokens[:a.n_new]), want, "chat 0 unchanged by the other chat's text")
eq(list(b.tokens[:b.n_new]), want_own, "chat 1: the single Session's tokens on prefix + its own ids")
eq(b.n_prompt, len(pre) + len(own), "n_prompt: prefix + its own")
check(outs[1].startswith(b" the dog ran"), "chat 1's output starts with its own text: %r" % (outs[1][:20],))

free()
# --- three chats share the same prefix blocks ---
s, cs, outs, order = chats(["", "the dog ran", "the cat"])
eq([c.n_new for c in cs], [N, N, N], "three chats, every token")
check(s.pool.high_water < 3 * hw1, "three chats: high-water %d < 3 x %d" % (s.pool.high_water, 3 * hw1))
# a chat's task made again (after it ended, or twice): one line, its tokens and stop kept
kept = (list(cs[1].tokens[:cs[1].n_new]), cs[1].n_new, cs[1].stop)
e = raises(decode.DecodeError, cs[1].task, Kernel(VirtualClock(), max_tasks=4), N)
eq(str(e), "chat1: its task was already made (a chat runs once)", "a second task of a chat: one line")
eq((list(cs[1].tokens[:cs[1].n_new]), cs[1].n_new, cs[1].stop), kept, "its tokens stay")

free()
# --- a pool too small for both: a chat stops with a reported refusal, never an exception ---
s, (a, b), outs, order = chats(["", ""], n=40, blocks=shared_blocks + 2)
check("no_block" in (a.stop, b.stop), "a chat ran out of blocks: %r %r" % (a.stop, b.stop))
check(a.n_new < 40 or b.n_new < 40, "it stopped early")
check("refused" in (a.stop_line() + b.stop_line()), "its stop line says so")

free()
# --- the API's mistakes: one-line DecodeErrors ---
e = raises(decode.DecodeError, decode.Session, M, T, "fp32", "full", 0, "plain", "absolute", 3000000, 0.0, 1.0, 0, 4,
           0, 0, 0, 0)
check("seqs" in str(e) and "\n" not in str(e), "seqs=0 refused: %s" % e)
s = decode.Session(M, T, seqs=2, **OPTS)
k = Kernel(VirtualClock(), max_tasks=4)
c = s.chat()
raises(decode.DecodeError, c.task, k, 3)  # before prefix_task
raises(decode.DecodeError, s.prefix_task, k, [])
s.chat()
e = raises(decode.DecodeError, s.chat)
check("seqs=2" in str(e), "a third chat on seqs=2: %s" % e)
g = s.prefix_task(k, s.encode("Once"))
raises(decode.DecodeError, s.prefix_task, k, s.encode("Once"))
# the prefix task made but not spawned: a chat's task would wait forever; refused, nothing changed
e = raises(decode.DecodeError, c.task, k, 3)
check("prefix task is not running" in str(e) and "\n" not in str(e), "no prefix task running: %s" % e)
k.spawn("prefix", 2, g)
t = k.spawn(c.name, 1, c.task(k, 3))
raises(decode.DecodeError, c.task, k, 3)  # twice, while the first is live
k.run()
eq((t.exc, c.n_new, c.stop), (None, 3, ""), "with the prefix spawned the chat runs")
free()
s = decode.Session(M, T, seqs=2, **OPTS)
raises(decode.DecodeError, s.prefix_task, decode.Kernel(VirtualClock()), s.encode("Once"))  # no chats
done()
