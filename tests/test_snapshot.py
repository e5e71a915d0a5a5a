# KV snapshots (firmware_py/snapshot.py): a decode saved between tokens and resumed in a new
# Session (a new process, another interpreter, the other word size) gives token for token
# what the uninterrupted decode gives; every damaged or foreign snapshot is refused with
# one line and nothing loaded; a save cut short by a kill leaves the previous one valid.
import os
import signal
import struct
import subprocess

import pytest

from conftest import ROOT, mp32_or_skip
from firmware_py import decode, kv, snapshot
from firmware_py.sched import Kernel
from host import interp as interp_mod

TINY = os.path.join(ROOT, "models", "kvrtos-tiny")
MODEL, TOK = os.path.join(TINY, "model.bin"), os.path.join(TINY, "tokenizer.bin")
RUN = os.path.join(ROOT, "tests", "firmware", "snap_run.py")
N, K = 14, 18  # tokens before the save, after the resume


def _run(s, ids, n):
    k = Kernel(verbose=False)
    k.spawn("d", 1, s.task(k, ids, n, lambda b: None))
    k.run()
    return [s.tokens[i] for i in range(s.n_new)]


def _session(**kw):
    opts = {"temperature": 0.0, "seed": 11, "policy": "full", "window": 0, "kv_dtype": "fp32", "heap": 3000000}
    opts.update(kw)
    return decode.Session(opts.pop("model", MODEL), opts.pop("tok", TOK), **opts)


def _saved(tmp_path, name="a", n=N, **kw):
    s = _session(**kw)
    got = _run(s, s.encode("Once upon a time"), n)
    info = snapshot.save(s, name, str(tmp_path))
    return s, got, info


@pytest.mark.parametrize("temp,policy,window,dtype", [
    (0.0, "full", 0, "fp32"), (0.8, "full", 0, "fp16"), (0.8, "window", 16, "int8"), (0.9, "sinks", 16, "int4"),
    (0.7, "h2o", 24, "int8"), (0.0, "window", 16, "int4tok"), (0.6, "h2o", 20, "int4")])
def test_a_resumed_decode_is_the_uninterrupted_one(tmp_path, temp, policy, window, dtype):
    kw = {"temperature": temp, "policy": policy, "window": window, "kv_dtype": dtype}
    s = _session(**kw)
    whole = _run(s, s.encode("Once upon a time"), N + K)
    _, first, info = _saved(tmp_path, **kw)
    assert info["blocks"] >= 1 and info["positions"] == 5 + N - 1 and info["tokens"] == 5 + N
    r = _session(**kw)
    d = snapshot.resume(r, "a", str(tmp_path))
    assert d["pending"] == first[-1] and r.cache.length(r.h) == 5 + N - 1
    rest = _run(r, snapshot.continue_ids(r), K)
    assert first + rest == whole
    if policy != "full":
        assert r.cache.evictions(r.h) > 0  # the ring went round after the resume as before it
    # a second save of the resumed conversation keeps every id, the first request's too
    snapshot.save(r, "b", str(tmp_path))
    with open(os.path.join(str(tmp_path), "b.kvs"), "rb") as f:
        h = snapshot.header(f)
        ids = struct.unpack("<%dH" % h["n_tokens"], f.read(2 * h["n_tokens"]))
    assert list(ids) == s.encode("Once upon a time") + whole and h["pending"] == whole[-1]


def test_a_conversation_goes_on_with_new_text_after_a_resume(tmp_path):
    # save, resume, then a new turn: its text is fed after the pending token, as the same
    # turn in the session that never stopped
    s = _session(temperature=0.8)
    _run(s, s.encode("Once upon a time"), N)
    snapshot.save(s, "a", str(tmp_path))
    more = _run(s, snapshot.continue_ids(s, " the dog"), K)
    r = _session(temperature=0.8)
    snapshot.resume(r, "a", str(tmp_path))
    assert _run(r, snapshot.continue_ids(r, " the dog"), K) == more


def _damage(tmp_path, fn):
    p = os.path.join(str(tmp_path), "a.kvs")
    b = bytearray(open(p, "rb").read())
    b = fn(b)
    open(p, "wb").write(b)


def _refix_header(b):
    crc = snapshot._crc(bytes(b[:snapshot.HDR_BYTES]))
    b[snapshot.HDR_BYTES:snapshot.HDR_BYTES + 4] = struct.pack("<I", crc)
    return b


def _flip(off):
    def f(b):
        b[off] ^= 0x40
        return b
    return f


def _version(b):
    b[4:6] = struct.pack("<H", 99)
    return _refix_header(b)


@pytest.mark.parametrize("damage,match", [
    (lambda b: b[:len(b) // 2], "is truncated: .* where its header says"),
    (lambda b: b[:snapshot.HDR_BYTES - 3], r"is truncated \(in its header\)"),
    (lambda b: b + b"x", "is longer than it should be"),
    (_flip(snapshot.HDR_BYTES + 8 + 2 * 19 + 100), "block 0 fails its CRC"),
    (_flip(-10), r"block \d+ fails its CRC"),
    (_flip(snapshot.HDR_BYTES + 9), "tokens fails its CRC"),
    (_flip(40), "header fails its CRC"),
    (_version, "format version 99, this firmware reads version 2"),
    (lambda b: b"XXXX" + b[4:], "not a kvrtos snapshot"),
    (lambda b: b"", r"is truncated \(in its header\)"),
])
def test_a_damaged_snapshot_is_refused_and_nothing_is_loaded(tmp_path, damage, match):
    _saved(tmp_path)
    _damage(tmp_path, damage)
    r = _session()
    r_tokens = _run(r, r.encode("Once upon a time"), 3)
    h, length, free = r.h, r.cache.length(r.h), r.pool.available(r.region)
    with pytest.raises(snapshot.SnapshotError, match=match) as e:
        snapshot.resume(r, "a", str(tmp_path))
    assert "\n" not in str(e.value)
    assert (r.h, r.cache.length(r.h), r.pool.available(r.region)) == (h, length, free)  # nothing loaded, nothing lost
    assert r.pending == r_tokens[-1]


@pytest.mark.parametrize("other,match", [
    ({"kv_dtype": "int8"}, r"its KV layout \(fp32 KV, 16 tokens a block of \d+ B\) is not this session's \(int8 KV"),
    ({"temperature": 0.5}, "sampled at temperature 0, top_p 1; this session samples at 0.5, 1"),
    ({"rope": "cache"}, "RoPE absolute; this session runs the float path with RoPE cache"),
    ({"blocks": 1}, "its budget of 256 tokens is more than this cache.s 16 a sequence"),
    ({"policy": "window", "window": 16}, r"its KV policy is full \(budget 256\); this session.s is window"),
])
def test_a_snapshot_of_another_setting_is_refused(tmp_path, other, match):
    _saved(tmp_path)
    r = _session(**other)
    h = r.h
    with pytest.raises(snapshot.SnapshotError, match=match):
        snapshot.resume(r, "a", str(tmp_path))
    assert r.h == h and r.cache.length(h) == 0


def test_a_snapshot_of_another_model_or_tokenizer_is_refused(tmp_path):
    # the same shape, other bytes: the model's and the tokenizer's sha256 name them
    _saved(tmp_path)
    m2 = tmp_path / "model.bin"
    b = bytearray(open(MODEL, "rb").read())
    b[-1] ^= 1
    m2.write_bytes(bytes(b))
    with pytest.raises(snapshot.SnapshotError, match=r"made with another model \(sha256 [0-9a-f]{12}\.\.\., this one"):
        snapshot.resume(_session(model=str(m2)), "a", str(tmp_path))
    t2 = tmp_path / "tok.bin"
    b = bytearray(open(TOK, "rb").read())
    b[-1] ^= 1  # the last token's last character
    t2.write_bytes(bytes(b))
    with pytest.raises(snapshot.SnapshotError, match="made with another tokenizer"):
        snapshot.resume(_session(tok=str(t2)), "a", str(tmp_path))


def test_h2o_refuses_a_cache_of_another_map_size(tmp_path):
    # h2o's victims follow its position map's size (2 x the cache's slots): another size
    # would decode on differently
    _saved(tmp_path, policy="h2o", window=24, kv_dtype="int8")
    r = _session(policy="h2o", window=40, kv_dtype="int8")
    with pytest.raises(snapshot.SnapshotError, match="h2o position map has"):
        snapshot.resume(r, "a", str(tmp_path))


def test_save_refuses_before_a_decode_while_running_and_without_room(tmp_path, monkeypatch):
    s = _session()
    with pytest.raises(snapshot.SnapshotError, match="nothing to save"):
        snapshot.save(s, "a", str(tmp_path))
    k = Kernel(verbose=False)
    g = s.task(k, s.encode("Once"), 4, lambda b: None)
    next(g)  # inside its first token
    with pytest.raises(snapshot.SnapshotError, match="a request is running"):
        snapshot.save(s, "a", str(tmp_path))
    g.close()
    with pytest.raises(snapshot.SnapshotError, match="stopped inside a token"):
        snapshot.save(s, "a", str(tmp_path))
    for bad in ("", "a/b", "x" * 40, "../up", None):
        with pytest.raises(snapshot.SnapshotError, match="snapshot name"):
            snapshot.path_of(bad)
    s, _, info = _saved(tmp_path)
    monkeypatch.setattr(snapshot, "_free_bytes", lambda folder: info["bytes"])
    with pytest.raises(snapshot.SnapshotError, match=r"no room for snapshot b: it needs \d+ B and leaves 8192 B free beside it; the filesystem has \d+ B free"):
        snapshot.save(s, "b", str(tmp_path))
    assert not os.path.exists(os.path.join(str(tmp_path), "b.kvs"))


def test_list_and_delete(tmp_path):
    assert snapshot.listing(str(tmp_path / "none")) == []
    _, _, info = _saved(tmp_path, "one")
    _saved(tmp_path, "two")
    assert snapshot.listing(str(tmp_path)) == [("one", info["bytes"]), ("two", info["bytes"])]
    snapshot.delete("one", str(tmp_path))
    assert [n for n, _ in snapshot.listing(str(tmp_path))] == ["two"]
    with pytest.raises(snapshot.SnapshotError, match="no snapshot one"):
        snapshot.delete("one", str(tmp_path))
    with pytest.raises(snapshot.SnapshotError, match="no snapshot one"):
        snapshot.resume(_session(), "one", str(tmp_path))


def test_the_file_is_what_the_format_says(tmp_path):
    # bytes per saved token: the header, the ids and one CRC a section, then whole blocks
    s, _, info = _saved(tmp_path)
    lay = s.cache.layout
    want = snapshot.HDR_BYTES + 4 + 2 * info["tokens"] + 4 + info["blocks"] * (lay.block_bytes + 4) + 4
    assert info["bytes"] == want == os.path.getsize(info["path"])
    assert info["blocks"] == -(-info["positions"] // lay.tokens_per_block)
    assert info["sectors"] == info["erases"] == -(-want // 4096)


# --- across processes and interpreters ------------------------------------------------------

INTERPS = ["cpython", "micropython", "micropython32"]


def _proc(interp, *args, model=MODEL, tok=TOK):
    if interp == "micropython32":
        mp32_or_skip()
    r = interp_mod.run(RUN, interp, usable_heap=8000000, args=[args[0], model, tok, *[str(a) for a in args[1:]]],
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = dict(x.split(" ", 1) if " " in x else (x, "") for x in r.stdout.splitlines())
    return lines


def _tokens(lines):
    return [int(x) for x in lines["TOKENS"].split()]


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory):
    # the tiny model in int8 q8row: on MicroPython it runs the integer (viper) path
    from host import convert

    out = str(tmp_path_factory.mktemp("q8") / "tiny_q8.bin")
    convert.convert(MODEL, out, "q8row", 0)
    return out


@pytest.mark.parametrize("interp", INTERPS)
@pytest.mark.parametrize("weights,temp,policy,window,dtype", [
    ("fp32", 0.0, "full", 0, "fp32"), ("fp32", 0.8, "window", 16, "int4"), ("int8", 0.8, "window", 16, "int8"),
    ("int8", 0.0, "h2o", 24, "int8")])
def test_resume_in_a_new_process_on_each_interpreter(tmp_path, q8_model, interp, weights, temp, policy, window, dtype):
    m = q8_model if weights == "int8" else MODEL
    opt = (temp, policy, window, dtype)
    whole = _tokens(_proc(interp, "whole", tmp_path, "a", N + K, *opt, model=m))
    first = _proc(interp, "save", tmp_path, "a", N, *opt, model=m)
    rest = _proc(interp, "resume", tmp_path, "a", K, *opt, model=m)
    assert "REFUSED" not in rest, rest
    assert _tokens(first) + _tokens(rest) == whole


@pytest.mark.parametrize("src,dst", [("micropython", "micropython32"), ("micropython32", "micropython"),
                                     ("cpython", "micropython32")])
def test_a_snapshot_moves_between_word_sizes(tmp_path, q8_model, src, dst):
    # saved on one interpreter, resumed on the other: the format is little-endian and fixed
    # width; the integer path is exact on both, so the tokens are the other's own
    opt = (0.8, "window", 16, "int8")
    if "cpython" in (src, dst):  # CPython runs the float path (numpy or plain): fp32 weights, same on both
        m, opt = MODEL, (0.8, "full", 0, "fp32")
    else:
        m = q8_model
    whole = _tokens(_proc(dst, "whole", tmp_path, "a", N + K, *opt, model=m))
    first = _proc(src, "save", tmp_path, "a", N, *opt, model=m)
    rest = _proc(dst, "resume", tmp_path, "a", K, *opt, model=m)
    assert "REFUSED" not in rest, rest
    assert _tokens(first) + _tokens(rest) == whole


@pytest.mark.parametrize("interp", ["cpython", "micropython32"])
def test_a_save_killed_part_way_leaves_the_previous_snapshot(tmp_path, interp):
    # snapshot "a" after N tokens; then a longer decode saves "a" again and is killed
    # (SIGKILL) at several points of the write: the header, inside a block, the last byte
    # (the new file complete, not yet renamed over the old). A resume after each gives the
    # first snapshot's continuation, and a stray .tmp is not listed
    if interp == "micropython32":
        mp32_or_skip()
    opt = ("0.8", "window", "16", "int8")
    whole = _tokens(_proc(interp, "whole", tmp_path, "a", N + K, *opt))
    first = _tokens(_proc(interp, "save", tmp_path, "a", N, *opt))
    size = os.path.getsize(tmp_path / "a.kvs")
    cuts = 0
    for cut in (10, snapshot.HDR_BYTES + 40, size // 2, -2, size + 9000):
        argv, env = interp_mod.command(RUN, interp, usable_heap=8000000,
                                       args=["cut", MODEL, TOK, str(tmp_path), "a", str(N + 7), *opt, str(cut)])
        p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        try:
            line = ""
            while not line.startswith("CUT") and not line.startswith("SAVED"):
                line = p.stdout.readline()
                assert line, "the saving process ended without reaching its cut"
            if line.startswith("CUT"):
                os.kill(p.pid, signal.SIGKILL)
        finally:
            p.kill()
            p.wait()
        if line.startswith("SAVED"):  # past the file's end: the save went through (the new snapshot)
            continue
        cuts += 1
        assert [n for n, _ in snapshot.listing(str(tmp_path))] == ["a"]
        assert os.path.getsize(tmp_path / "a.kvs") == size, cut  # the old one, whole
        rest = _proc(interp, "resume", tmp_path, "a", K, *opt)
        assert first + _tokens(rest) == whole, cut
    assert cuts == 4

def test_the_kv_cache_refuses_a_state_it_cannot_hold(tmp_path):
    # adopt() checks every word before it opens a sequence: nothing is taken on a refusal
    s, _, _ = _saved(tmp_path)
    st = snapshot.seq_state(s.cache, s.h)
    free = s.pool.available(s.region)
    for bad in ([9] + st[1:], st[:2] + [0] + st[3:], st[:6] + [2] + st[7:], st[:7] + [st[1] + 1] + st[8:], st[:8] + [1],
                st[:5] + [st[2] + 1] + st[6:], st[:1] + [-1] + st[2:], st[:-1]):
        assert snapshot.adopt(s.cache, s.region, bad, lambda k, b: True) == kv.E_RANGE, bad
    assert s.pool.available(s.region) == free
    assert snapshot.adopt(s.cache, s.region, st, lambda k, b: True) == kv.E_NO_SLOT  # the one sequence is open
    assert snapshot.seq_state(s.cache, 12345) == kv.E_STALE


# --- on the virtual boards: serve's save/resume, ./kv monitor --save/--resume, ./kv snapshot -------

def _text(jl):
    import json

    return "".join(fr["text"] for fr in (json.loads(ln) for ln in open(jl)) if fr["type"] == "text")


def test_a_conversation_saved_on_one_virtual_board_resumes_on_another_of_the_other_word_size(tmp_path, monkeypatch):
    # the 64-bit virtual board decodes 10 tokens and saves (monitor --save) at the request's
    # end; the snapshot outlives the board (stopped: its RAM is gone), is pulled to a file,
    # pushed to a 32-bit virtual board and resumed there (monitor --resume): its 10 tokens
    # follow on as that board's own 20-token decode has them (int8 weights: the integer path)
    import vboard_util as vb

    mp32 = mp32_or_skip()
    kw = {"timeout": 300}
    mon = ["--plain", "--timeout", "240", "--until-done", "1"]
    monkeypatch.delenv("KVRTOS_VBOARD_MICROPYTHON", raising=False)
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    with vb.start(a_dir) as a:
        r = vb.kv("flash", "--port", a.port, "--model", MODEL, **kw)
        assert r.returncode == 0, r.stdout + r.stderr
        r = vb.kv("monitor", "--port", a.port, "--start", "--prompt", "Once upon a time", "--tokens", "10", "--save", "s1",
                  "--jsonl", str(tmp_path / "a.jsonl"), *mon, **kw)
        assert r.returncode == 0 and "serve: saved s1: " in r.stdout, r.stdout + r.stderr
    with vb.start(a_dir) as a:  # the same board started again: its filesystem kept the snapshot
        r = vb.kv("snapshot", "list", "--port", a.port, **kw)
        assert r.returncode == 0 and r.stdout.split()[0] == "s1" and "int8" in r.stdout, r.stdout + r.stderr
        r = vb.kv("snapshot", "pull", "s1", str(tmp_path / "s1.kvs"), "--port", a.port, **kw)
        assert r.returncode == 0 and "sha256" in r.stdout, r.stdout + r.stderr
        again = vb.kv("snapshot", "pull", "s1", str(tmp_path / "s1.kvs"), "--port", a.port, **kw)
        assert vb.one_line_error(again) and "exists" in again.stderr  # never overwritten
    monkeypatch.setenv("KVRTOS_VBOARD_MICROPYTHON", mp32)
    with vb.start(b_dir) as b:
        r = vb.kv("flash", "--port", b.port, "--model", MODEL, **kw)
        assert r.returncode == 0, r.stdout + r.stderr
        r = vb.kv("snapshot", "push", str(tmp_path / "s1.kvs"), "--port", b.port, **kw)
        assert r.returncode == 0 and "pushed" in r.stdout, r.stdout + r.stderr
        r = vb.kv("monitor", "--port", b.port, "--start", "--resume", "s1", "--prompt", "", "--tokens", "10",
                  "--jsonl", str(tmp_path / "b.jsonl"), *mon, **kw)
        assert r.returncode == 0 and "serve: resumed s1: 14 positions" in r.stdout, r.stdout + r.stderr
        r = vb.kv("monitor", "--port", b.port, "--start", "--resume", "nosuch", "--prompt", "x", "--tokens", "2",
                  *mon, **kw)
        assert "serve: resume refused: no snapshot nosuch" in r.stdout, r.stdout + r.stderr
        assert "the resume before it was refused" in r.stdout  # the prompt is not run as a new conversation
        assert vb.one_line_error(r) and "the board refused the resume" in r.stderr, r.stdout + r.stderr
        r = vb.kv("monitor", "--port", b.port, "--start", "--prompt", "Once upon a time", "--tokens", "20",
                  "--jsonl", str(tmp_path / "c.jsonl"), *mon, **kw)
        assert r.returncode == 0, r.stdout + r.stderr
        r = vb.kv("snapshot", "rm", "s1", "--port", b.port, **kw)
        assert r.returncode == 0, r.stdout + r.stderr
        r = vb.kv("snapshot", "rm", "s1", "--port", b.port, **kw)
        assert vb.one_line_error(r) and "no snapshot s1" in r.stderr, r.stdout + r.stderr
    first, rest, whole = _text(tmp_path / "a.jsonl"), _text(tmp_path / "b.jsonl"), _text(tmp_path / "c.jsonl")
    assert first.endswith("\n") and len(rest) > 5
    assert first[:-1] + rest == whole, (first, rest, whole)


def test_chats_fork_one_restored_prefix_as_they_fork_a_fed_one(tmp_path):
    # a system prompt fed once and saved (snapshot.prefix_task, save); a Session booted for
    # three chats restores it (resume_prefix) and the chats fork it: each chat's tokens are
    # those of the same chats over a prefix the prefix task fed, and the blocks are shared
    prefix = "Once upon a time there was a little"
    texts = [" dog", " cat named", ""]

    def chats(restore):
        s = _session(seqs=3, policy="full", temperature=0.8)
        cs = [s.chat(t, seed=i + 1) for i, t in enumerate(texts)]
        k = Kernel(verbose=False)
        if restore:
            snapshot.resume_prefix(s, k, "sys", str(tmp_path))
        else:
            k.spawn("prefix", 2, s.prefix_task(k, s.encode(prefix)))
        for i, c in enumerate(cs):
            k.spawn("chat%d" % i, 1, c.task(k, 12, lambda b: None))
        k.run()
        if restore:  # a chat's own conversation saves as one sequence and resumes in a Session of one
            info = snapshot.save(cs[1], "chat1", str(tmp_path))
            r = _session(temperature=0.8)
            snapshot.resume(r, "chat1", str(tmp_path))
            assert r.cache.length(r.h) == cs[1].cache.length(cs[1].h) == info["positions"]
            assert len(_run(r, snapshot.continue_ids(r), 4)) == 4
        return [[c.tokens[i] for i in range(c.n_new)] for c in cs], s.chats_report()

    p = _session()
    k = Kernel(verbose=False)
    k.spawn("p", 1, snapshot.prefix_task(p, k, p.encode(prefix)))
    k.run()
    info = snapshot.save(p, "sys", str(tmp_path))
    assert info["positions"] == len(p.encode(prefix)) - 1 and info["tokens"] == len(p.encode(prefix))
    fed, rep_fed = chats(False)
    back, rep_back = chats(True)
    assert back == fed and all(len(t) == 12 for t in back)
    assert (rep_back["shared_tokens"], rep_back["shared_blocks"]) == (rep_fed["shared_tokens"], rep_fed["shared_blocks"])
    assert rep_back["pool_high_water"] == rep_fed["pool_high_water"]
    s = _session(seqs=3)
    with pytest.raises(snapshot.SnapshotError, match="no chats"):
        snapshot.resume_prefix(s, Kernel(verbose=False), "sys", str(tmp_path))


# --- serve's save/resume, and what the review found (tests/test_snapshot.py runs serve on a VirtualClock) ---

def _server(lines, **kw):
    from firmware_py import serve
    from firmware_py.clock import VirtualClock

    return serve.Server(lambda buf, n: None, None, clock=VirtualClock(), layer_us=2000, model=MODEL, tokenizer=TOK,
                        out=lines.append, **kw)


def _request(srv, text, n):
    assert srv.start(text, n) == 0, "refused"
    while srv.task is not None:
        srv.run(200000)
    return [srv.session.tokens[i] for i in range(srv.session.n_new)]


def test_serve_saves_at_a_requests_end_and_goes_on_from_a_resume(tmp_path, monkeypatch):
    from firmware_py import telemetry as tm

    monkeypatch.chdir(tmp_path)
    lines = []
    srv = _server(lines, temperature=0.8, seed=3)
    s = _session(temperature=0.8, seed=3)
    whole = _run(s, s.encode("Once upon a time"), 2 * N)
    assert srv.start("Once upon a time", N) == 0
    assert srv.command(tm.T_CMD_SAVE, b"c1", 1) == 0  # asked during the request: made at its end
    assert srv.command(tm.T_CMD_SAVE, b"c2", 2) == 0  # ... a second one replaces it, and says so
    while srv.task is not None:
        srv.run(200000)
    first = [srv.session.tokens[i] for i in range(srv.session.n_new)]
    assert any("save c2 replaces the save of c1" in x for x in lines), lines
    assert any(x.startswith("serve: saved c2: ") for x in lines) and not os.path.exists("snapshots/c1.kvs"), lines
    # a prompt refused as too long leaves the conversation as it was (it was reopened first)
    assert srv.start("x " * 300, 4) != 0
    assert srv.save("c3") == 0 and os.path.getsize("snapshots/c3.kvs") == os.path.getsize("snapshots/c2.kvs")
    # another board (a new Server): resume, then the prompt goes on
    lines2 = []
    srv2 = _server(lines2, temperature=0.8, seed=3)
    assert srv2.resume("c2") == 0, lines2
    rest = _request(srv2, "", N)
    assert first + rest == whole
    # a config command starts a new conversation: a fresh prompt decodes from position 0
    srv2.set_config({"priority": "1"})
    fresh = _request(srv2, "Once upon a time", 4)
    assert len(fresh) == 4 and srv2.session.pos0 == 0 and not srv2.session.stop
    # a resumed conversation stopped inside a token cannot go on: the next prompt starts anew
    assert srv2.resume("c2") == 0
    assert srv2.start("", N) == 0
    srv2.run(3000)
    assert srv2.stop() == 0
    srv2.run(200000)
    assert any("cannot go on" in x for x in lines2), lines2
    assert srv2.save("c4") != 0 and any("stopped inside a token" in x for x in lines2)
    assert len(_request(srv2, "Once upon a time", 3)) == 3
    assert srv2.resume("c2") == 0 and srv2.resume("nosuch") != 0 and srv2.session.pending == first[-1]


def _crafted(tmp_path, edit):
    # the saved file with its header changed by edit(fields) and its CRC made good again
    p = os.path.join(str(tmp_path), "a.kvs")
    b = bytearray(open(p, "rb").read())
    x = list(struct.unpack(snapshot.HDR, bytes(b[:snapshot.HDR_BYTES])))
    edit(x)
    b[:snapshot.HDR_BYTES] = struct.pack(snapshot.HDR, *x)
    open(p, "wb").write(bytes(_refix_header(b)))


@pytest.mark.parametrize("edit,match", [
    (lambda x: x.__setitem__(19, 0), r"state words are out of range"),  # watermark 0
    (lambda x: x.__setitem__(21, 10 ** 6), r"state words are out of range"),  # more evictions than positions
    (lambda x: x.__setitem__(14, 7), "policy number 7 is unknown"),
    (lambda x: x.__setitem__(28, 5000), r"pending token 5000"),
    (lambda x: x.__setitem__(12, 0), "header is damaged"),  # block bytes 0: no loop over a crafted count
    (lambda x: x.__setitem__(29, 10 ** 6), "header is damaged"),  # more ids than a snapshot keeps
    (lambda x: x.__setitem__(32, 99), "header is damaged"),  # more int4 flag bytes than slots in a block
])
def test_a_consistent_looking_but_impossible_state_is_refused_before_anything_changes(tmp_path, edit, match):
    first = _saved(tmp_path)[1]
    _crafted(tmp_path, edit)
    r = _session()
    mine = _run(r, r.encode("Once upon a time"), 3)
    h, n = r.h, r.cache.length(r.h)
    with pytest.raises(snapshot.SnapshotError, match=match):
        snapshot.resume(r, "a", str(tmp_path))
    assert (r.h, r.cache.length(r.h), r.pending) == (h, n, mine[-1]) and first


def test_a_failing_read_inside_the_load_takes_nothing(tmp_path):
    s, _, _ = _saved(tmp_path)
    st = snapshot.seq_state(s.cache, s.h)
    s.cache.close(s.h)
    free = s.pool.available(s.region)

    def boom(k, b):
        raise OSError(5, "I/O error")
    assert snapshot.adopt(s.cache, s.region, st, boom) == kv.E_STATE
    assert s.pool.available(s.region) == free
    h = s.cache.open(s.region)  # the one sequence slot is free again
    assert h >= 0


def test_a_refused_turn_leaves_the_conversations_ids_as_they_were(tmp_path):
    s, first, _ = _saved(tmp_path)
    before = snapshot._tokens_of(s)
    with pytest.raises(snapshot.SnapshotError, match="pass its KV budget"):
        snapshot.continue_ids(s, " word" * 400)
    assert snapshot._tokens_of(s) == before
    snapshot.save(s, "b", str(tmp_path))
    with open(os.path.join(str(tmp_path), "b.kvs"), "rb") as f:
        assert snapshot.header(f)["n_tokens"] == 5 + N


def test_names_are_ascii_on_every_interpreter():
    for bad in ("chät", "ß", "a b"):
        with pytest.raises(snapshot.SnapshotError, match="ASCII letters"):
            snapshot.path_of(bad)


def test_a_stop_inside_the_end_of_request_save_keeps_the_previous_snapshot_and_says_so(tmp_path, monkeypatch):
    from firmware_py import telemetry as tm

    monkeypatch.chdir(tmp_path)
    lines = []
    srv = _server(lines)
    _request(srv, "Once upon a time", 4)
    assert srv.save("c") == 0
    size = os.path.getsize("snapshots/c.kvs")
    # the request's task driven by hand to inside its save (the save takes no board time in
    # this run), then closed as the kernel's kill closes it
    s = srv.session_next()
    srv.save_as = "c"
    g = srv._request(s, s.encode("Once upon a time"), 40, 9)  # 44 positions: 3 blocks
    while not srv.saving:
        next(g)  # (its first block is written when the save is first seen)
    assert os.path.exists("snapshots/c.kvs.tmp")
    g.close()
    assert any("c was stopped while it was written; the previous one of that name is kept" in x for x in lines), lines
    assert os.path.getsize("snapshots/c.kvs") == size and not os.path.exists("snapshots/c.kvs.tmp")
    assert srv.saving == "" and tm


def test_a_layout_ask_between_a_refused_resume_and_its_prompt_keeps_the_prompt_refused(tmp_path, monkeypatch):
    # the console asks for the layout when it attaches; a refused resume makes the prompt sent
    # with it refused (not run as a new conversation), and a layout ask (it only reads) between
    # them must not clear that; any other command does
    from firmware_py import telemetry as tm

    monkeypatch.chdir(tmp_path)
    lines = []
    srv = _server(lines)
    assert srv.command(tm.T_CMD_RESUME, b"nosuch", 1) != 0
    assert srv.command(tm.T_CMD_LAYOUT, b"", 2) == 0
    prompt = bytes([4]) + b"hi"  # [tokens varint][text]
    assert srv.command(tm.T_CMD_PROMPT, prompt, 3) != 0
    assert any("the resume before it was refused" in x for x in lines), lines
    assert srv.command(tm.T_CMD_RESUME, b"nosuch", 4) != 0
    srv.command(tm.T_CMD_STOP, b"", 5)  # another command between them (nothing runs: its own status aside)
    assert srv.command(tm.T_CMD_PROMPT, prompt, 6) == 0  # the prompt is no longer the resume's: a new request
