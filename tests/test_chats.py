# Chats sharing one pool and a prompt prefix (firmware_py/decode.py: Session(seqs=N),
# chat(), prefix_task(), Chat.task()) on stories260K under CPython: the pool's high-water
# of two chats with a 32-token shared prefix is less than twice one chat's, each chat's
# greedy tokens are a single Session's on the same ids, a window policy runs past its
# window in both chats, and the budget rule sizes the pool by the batch. Skipped when
# ../shared/models is absent.
import os

import pytest

from firmware_py import decode
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "models")
MODEL = os.path.join(SHARED, "stories260K.bin")
TOK = os.path.join(SHARED, "tok512.bin")
pytestmark = pytest.mark.skipif(not os.path.exists(MODEL) or not os.path.exists(TOK),
                                reason="stories260K is not in ../shared/models")
PREFIX = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends every day"
HEAP = 2000000


def run_chats(texts, n, **opts):
    s = decode.Session(MODEL, TOK, seqs=len(texts), heap=HEAP, **opts)
    s.layer_us = 50
    cs = [s.chat(t) for t in texts]
    k = Kernel(VirtualClock(), max_tasks=8)
    ids = s.encode(PREFIX)
    k.spawn("prefix", 2, s.prefix_task(k, ids))
    ts = [k.spawn(c.name, 1, c.task(k, n)) for c in cs]
    k.run()
    assert all(t.exc is None for t in ts)
    return s, cs, ids


def single(ids, n, **opts):
    s = decode.Session(MODEL, TOK, heap=HEAP, **opts)
    k = Kernel(VirtualClock(), max_tasks=4)
    k.spawn("decode", 1, s.task(k, ids, n, lambda b: None))
    k.run()
    return list(s.tokens[:s.n_new])


def test_two_chats_share_the_prefix_blocks():
    s1, (one,), ids = run_chats([""], 12)
    assert len(ids) - 1 >= 32  # a shared prefix of at least 32 cached tokens
    s2, (a, b), _ = run_chats(["", "Tom asked"], 12)
    r = s2.chats_report()
    assert r["shared_tokens"] == len(ids) - 1 and r["shared_blocks"] >= 2
    assert s2.pool.high_water < 2 * s1.pool.high_water
    assert (a.n_new, b.n_new, a.stop, b.stop) == (12, 12, "", "")
    assert list(a.tokens) == list(one.tokens) == single(ids, 12)
    own = s2.tok.encode("Tom asked", False, False)
    assert list(b.tokens) == single(ids + own, 12)
    assert b.n_prompt == len(ids) + len(own)
    assert b.t_first > s2.t_end and a.t_start == s2.t_start


def test_window_chats_run_past_the_window():
    s, cs, ids = run_chats(["", "Sue said"], 40, policy="sinks", window=48)
    assert [c.n_new for c in cs] == [40, 40] and [c.stop for c in cs] == ["", ""]
    assert all(c.cache.cached(c.h) == 48 for c in cs)  # both at their window
    assert all(c.cache.evictions(c.h) > 0 for c in cs)
    assert s.pool.n_blocks == 2 * s.cap // s.layout.tokens_per_block
    assert s.pool.high_water <= s.pool.n_blocks


def test_pool_sized_by_the_batch():
    one = decode.Session(MODEL, TOK, heap=HEAP)
    two = decode.Session(MODEL, TOK, heap=HEAP, seqs=2)
    lay = two.layout
    _, fit = decode.budget_blocks(HEAP, two.cfg, two.weights.nbytes, lay, 0, False, 2)
    assert two.fit_blocks == fit <= one.fit_blocks
    # the second chat's run state is kept out of the pool: the rule with it costs blocks
    p = decode.predict_boot(HEAP, two.cfg, two.weights.nbytes, lay, 0, False, 2)
    with_it = decode.boot_blocks(p["free"], p["largest"], p["margin"], lay, 2, False, p["model"])[0]
    without = decode.boot_blocks(p["free"], p["largest"], p["margin"], lay, 2, False, 0)[0]
    assert with_it < without
    assert two.cache.max_seqs == 2 and one.cache.max_seqs == 1


def test_mistakes_are_one_line():
    with pytest.raises(decode.DecodeError, match="seqs"):
        decode.Session(MODEL, TOK, heap=HEAP, seqs=0)
    s = decode.Session(MODEL, TOK, heap=HEAP, seqs=1)
    s.chat()
    with pytest.raises(decode.DecodeError, match="seqs=1"):
        s.chat()
    long = " ".join(["and then"] * 200)
    s = decode.Session(MODEL, TOK, heap=HEAP, seqs=2)
    s.chat(long)
    with pytest.raises(decode.DecodeError, match="chat 0's prompt"):
        s.prefix_task(Kernel(VirtualClock()), s.encode(PREFIX))
