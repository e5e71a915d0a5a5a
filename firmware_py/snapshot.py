# KV snapshots: one sequence of a decode.Session saved to a named file on the board's
# filesystem between tokens, and resumed later (after a reset, deep sleep, or on another
# board) as a new sequence that decodes on token for token as if never interrupted.
#
#   from firmware_py import snapshot
#   info = snapshot.save(session, "chat1")        # between requests (never inside a token)
#   snapshot.resume(session, "chat1")             # the session's sequence is now the saved one
#   ids = snapshot.continue_ids(session, " and")   # the pending token + new text: session.task(k, ids, n, out)
#   snapshot.listing(); snapshot.delete("chat1")
#
# File format (docs/snapshots.md), little-endian and word-size independent, version 2:
#   header  HDR (below): magic, version, header bytes, sha256 of the model file and of the
#           tokenizer file, the KV layout (layers, KV heads, head dim, dtype, tokens per
#           block, block bytes), the forward path (float/integer) and RoPE mode, h2o's map
#           size, the sequence's kv state words (kv.SEQ_FIELDS), the blocks held, the
#           sampler (temperature, top_p, RNG state), the pending token (picked, not yet fed),
#           the tokens kept, the int4 residual's size; then the header's CRC32
#   tokens  u16 each (the conversation's ids, oldest first), CRC32
#   blocks  each: block_bytes of the pool block (headers with positions and h2o scores, the
#           rows), CRC32
#   int4    (KIVI only) the sequence's fp32 residual keys and its slot flags, CRC32
#   end     b"KVSE"
# A save writes NAME.tmp and renames it over NAME (atomic on POSIX and LittleFS; where a
# rename over a file fails, the old one is renamed to NAME.old first, and a load falls back
# to it), so a save cut short leaves the previous snapshot of that name valid. A load checks
# everything (the header, the identity, every section's CRC, the room) before it takes a
# block, and a refusal leaves the session's conversation as it was. Every refusal is
# SnapshotError, one line.
#
# Not on the hot path: save and resume allocate (a few small objects, the token list) and
# are imported only when used. Flash cost (wear): the file's sectors, each erased once per
# save on a copy-on-write filesystem (flashkv's sector model), returned in save()'s info.
import os
import struct

try:
    import binascii
    import hashlib
except ImportError:  # pragma: no cover - every port kvrtos runs on has them
    binascii = hashlib = None

from firmware_py import kv
from firmware_py.flashkv import ERASE_US, SECTOR_BYTES
from firmware_py.pool import get32
from firmware_py.status import E_RANGE, E_STATE, OK

MAGIC = b"KVSN"
END = b"KVSE"
VERSION = 2  # 2: the sampler's settings as float32
DIR = "snapshots"  # the folder on the board's filesystem (the current folder's)
NAME_MAX = 32
# magic, version, header bytes, model sha256, tokenizer sha256; layers, KV heads, head dim,
# dtype, path, rope, tokens per block, block bytes, h2o map size; the 9 state words; blocks
# held; temperature, top_p, RNG hi, RNG lo; pending, tokens kept, tokens dropped; residual
# words, flag bytes
HDR = "<4sHH32s32sHHHBBBxHII9iIffHHiIIII"
HDR_BYTES = struct.calcsize(HDR)
TOKENS_MAX = 8192  # conversation ids a snapshot keeps (the newest; the rest counted as dropped)
SPACE_SLACK = 2 * SECTOR_BYTES  # what a save leaves free on the filesystem beyond its file
_CHUNK = 512  # bytes hashed per read
PATHS = ("float", "integer")
RUNNING = -2  # Session.pending while its task runs (or after it was stopped inside a token)
ROPES = ("absolute", "cache")


_NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"


class SnapshotError(ValueError):
    # a save or a load refused; str() is one line
    pass


def _name_ok(name):
    if name.__class__ is not str or not 1 <= len(name) <= NAME_MAX:
        raise SnapshotError("a snapshot name is 1..%d characters, got %r" % (NAME_MAX, name))
    for ch in name:
        if ch not in _NAME_CHARS:
            raise SnapshotError("a snapshot name holds ASCII letters, digits, _ and - only, got %r" % name)


def path_of(name, folder=DIR):
    _name_ok(name)
    return folder + "/" + name + ".kvs"


def _exists(p):
    try:
        os.stat(p)
        return True
    except OSError:
        return False


def _size(p):
    return os.stat(p)[6]


def _remove(p):
    try:
        os.remove(p)
    except OSError:
        pass


def file_sha256(path):
    # sha256 of a file, read in small pieces (the model is megabytes: never read whole)
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    mv = memoryview(buf)
    with open(path, "rb") as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(mv[:n])
    return h.digest()


def identity(s):
    # (model sha256, tokenizer sha256) of session s, hashed once per session
    s = getattr(s, "session", None) or s  # a Chat: its Session's files
    ident = getattr(s, "snap_ident", None)
    if ident is None:
        try:
            ident = (file_sha256(s.model_path), file_sha256(s.tok_path))
        except OSError as e:
            raise SnapshotError("cannot hash the model or the tokenizer: %s" % e)
        s.snap_ident = ident
    return ident


# --- one sequence's state out of and into a kv.KVCache (its seq_row words, its table) ---

# the pool blocks a sequence's table holds for state st: what its slots have reached (full),
# or its whole budget (ring policies take theirs at open)
def held_blocks(st, t):
    n = st[1] if st[1] < st[2] else st[2]
    return ((n if st[0] == 0 else st[2]) + t - 1) // t


# h's state words (kv.SEQ_FIELDS), or E_STALE, or E_STATE when a block its table must hold
# has left the pool (spilled to flash)
def seq_state(c, h):
    o = c.seq_row(h)
    if o < 0:
        return o
    st = [c.meta[o + f] for f in kv.SEQ_FIELDS]
    for k in range(held_blocks(st, c.t)):
        if c.block_at(h, k) < 0:
            return kv.E_STATE
    return st


# why cache c cannot hold a sequence of state st (seq_state's words), or "": every word in
# its range and the policy's own rule (kvlayout.policy_params, as open() checks it)
def state_error(c, st):
    if len(st) != len(kv.SEQ_FIELDS):
        return "its state has %d words, not %d" % (len(st), len(kv.SEQ_FIELDS))
    pol, n, cap, sinks, recent, wm, wmf, ev, cur = st
    if not 0 <= pol < len(kv.POLICIES):
        return "its policy number %d is unknown" % pol
    if not 1 <= cap <= c.max_slots or held_blocks(st, c.t) > c.max_blocks:
        return "its budget of %d tokens is more than this cache's %d a sequence" % (cap, c.max_slots)
    if (not 1 <= wm <= cap or wmf not in (0, 1) or not 0 <= ev <= n or not 0 <= n < kv.INT_MAX - 1
            or not 0 <= cur <= held_blocks(st, c.t) or (cur and not c.kivi)):
        return "its state words are out of range (damaged)"
    try:
        if kv.policy_params(kv.POLICIES[pol], cap, sinks if pol >= 2 else kv.SINKS, recent if pol == 3 else 0) != (
                pol, sinks, recent):
            return "its policy's sinks and recent do not fit its budget (damaged)"
    except kv.KVError as e:
        return str(e)
    if pol == 3 and not c.map_size:
        return "it is an h2o sequence and this cache keeps no h2o scores"
    return ""


# a new sequence of cache c in region with state st (seq_state's): opened with its policy,
# budget, sinks and recent, its held blocks filled by fill(k, b) (table index k, pool block
# b; False, or an exception: refused), its words set, and h2o's position map made again
# from the blocks' headers as kv keeps it. The handle, or E_RANGE (a state c cannot hold:
# state_error), E_NO_SLOT, E_NO_BLOCK, E_STATE (fill refused), with nothing taken
def adopt(c, region, st, fill):
    if state_error(c, st):
        return kv.E_RANGE
    pol, n, cap, sinks, recent, wm, wmf, ev, cur = st
    held = held_blocks(st, c.t)
    try:
        h = c.open(region, kv.POLICIES[pol], cap, sinks if pol >= 2 else kv.SINKS, recent if pol == 3 else 0)
    except kv.KVError:
        return kv.E_RANGE
    if h < 0:
        return h
    o = c.seq_row(h)
    m = c.meta
    base = c.slot_of(h) * c.max_blocks
    k = 0
    while k < held:
        b = c.table[base + k]
        if b < 0:  # full: blocks come as slots fill; a ring's were taken at open
            b = c.pool.alloc(region)
            if b < 0:
                c.close(h)
                return kv.E_NO_BLOCK
            c.table[base + k] = b
        try:
            ok = fill(k, b)
        except Exception:  # a read that failed (OSError), no room for its buffer (MemoryError)
            ok = False
        if not ok:
            c.close(h)
            return kv.E_STATE
        k += 1
    for j, f in enumerate(kv.SEQ_FIELDS):
        m[o + f] = st[j]
    if pol == 3:
        mm = c.map_size
        i = base // c.max_blocks
        for slot in range(cap):
            p = _pos(c, base, slot)
            if p >= sinks:
                j = i * mm + p % mm
                q = c.pos_map[j]
                if q < 0 or p > _pos(c, base, q):
                    c.pos_map[j] = slot
    return h


def _pos(c, base, slot):
    t = c.t
    return get32(c.arena, c.table[base + slot // t] * c.block_words + (slot % t) * 2) - 1


def _path_no(s):
    return 1 if s.model.q is not None else 0


def _crc(buf, crc=0):
    return binascii.crc32(buf, crc) & 0xFFFFFFFF


class _Writer:
    # a file written in pieces with the running CRC of the current section
    def __init__(self, f, hook, total):
        self.f = f
        self.total = total
        self.crc = 0
        self.n = 0
        self.hook = hook

    def put(self, b, nbytes=-1):
        self.crc = _crc(b, self.crc)
        self._raw(b, nbytes)

    def end_section(self):
        self._raw(struct.pack("<I", self.crc))
        self.crc = 0

    def _raw(self, b, nbytes=-1):
        n = len(b) if nbytes < 0 else nbytes  # (a view of an int array: its items are 4 B)
        w = self.f.write(b)
        if w is not None and w != n:
            raise OSError("short write (%d of %d B)" % (w, n))
        self.n += n
        if self.hook is not None:
            self.hook(self.n, self.total)


def _fsync(f):
    f.flush()
    fs = getattr(os, "fsync", None)
    if fs is not None:
        try:
            fs(f.fileno())
        except (AttributeError, OSError):
            pass


def _free_bytes(folder):
    st = getattr(os, "statvfs", None)
    if st is None:
        return -1
    try:
        v = st(folder)
    except OSError:
        return -1
    return v[0] * v[4]  # f_bsize x f_bavail


def _tokens_of(s):
    # the conversation's ids: those kept so far (a resumed snapshot's, earlier requests'), then
    # what the last request fed (its ids, then its picks) and the pending token, by its
    # positions: a request cut short by a full budget fed part of its ids only (a
    # continuation's first id is the conversation's pending token, kept already); (u16
    # bytes, dropped count)
    old = getattr(s, "snap_tokens", None) or b""
    dropped = getattr(s, "snap_dropped", 0)
    ids = list(getattr(s, "last_ids", None) or ())
    if s.tokens is not None:
        ids += [s.tokens[i] for i in range(s.n_new)]
    fed = getattr(s, "pend_pos", 0) - s.pos0
    ids = ids[:fed + 1] if fed >= 0 else []
    if old and ids:
        ids = ids[1:]
    new = bytearray(2 * len(ids))
    for i, t in enumerate(ids):
        struct.pack_into("<H", new, 2 * i, t & 0xFFFF)
    allb = bytes(old) + bytes(new)
    n = len(allb) // 2
    if n > TOKENS_MAX:
        dropped += n - TOKENS_MAX
        allb = allb[2 * (n - TOKENS_MAX):]
    return allb, dropped


# save session s's sequence (s: a decode.Session, or one of its Chats) as NAME in folder. Between tokens: refused while a request runs on it (s.running), and when there
# is no pending token (nothing decoded yet). Returns {"path", "bytes", "blocks", "tokens",
# "positions", "sectors", "erases", "flash_us"}; SnapshotError with one line, the previous
# snapshot of that name kept. hook(n, total): called after each write with the bytes
# written so far and the file's size (tests cut a save short there)
def save(s, name, folder=DIR, hook=None):
    out = {}
    g = save_steps(s, name, folder, hook, out)
    try:
        for _ in g:
            pass
    finally:
        g.close()
    return out


# save() as a task's steps (a generator for sched.Kernel: yields after each block it writes,
# so that a task beside it runs between them; serve saves inside the request's task this
# way); its info goes into out. Closed part way (the task killed), it removes its NAME.tmp:
# the previous snapshot of that name is kept
def save_steps(s, name, folder=DIR, hook=None, out=None):
    p = path_of(name, folder)
    pending = getattr(s, "pending", -1)
    if pending == RUNNING:
        raise SnapshotError("a request is running, or was stopped inside a token: save between requests")
    if pending < 0:
        raise SnapshotError("nothing to save: the sequence has no decoded token to go on from (a request that ran to its "
                            "end, or to a full budget, leaves one)")
    c = s.cache
    h = s.h
    if c.length(h) != getattr(s, "pend_pos", -1):
        raise SnapshotError("nothing to save: the sequence is not the one the last request left (%d positions, it left "
                            "%d)" % (c.length(h), getattr(s, "pend_pos", -1)))
    st = seq_state(c, h)
    if st.__class__ is int:
        raise SnapshotError("sequence %r: %s" % (h, "not open" if st == kv.E_STALE else "a block is not in the pool (spilled)"))
    lay = c.layout
    t = c.t
    held = held_blocks(st, t)
    mdl, tkn = identity(s)
    toks, dropped = _tokens_of(s)
    rw = c.n_layers * t * c.kv_dim if c.kivi else 0
    fb = t if c.kivi else 0
    sm = s.sampler
    hdr = struct.pack(HDR, MAGIC, VERSION, HDR_BYTES, mdl, tkn, lay.n_layers, lay.n_kv_heads, lay.head_dim,
                      kv.DTYPES.index(lay.dtype), _path_no(s), ROPES.index(s.model.rope), t, lay.block_bytes,
                      c.map_size, st[0], st[1], st[2], st[3], st[4], st[5], st[6], st[7], st[8], held,
                      sm.temperature, sm.top_p, sm.state_hi, sm.state_lo, pending, len(toks) // 2, dropped, rw, fb)
    total = HDR_BYTES + 4 + len(toks) + 4 + held * (lay.block_bytes + 4) + ((4 * rw + fb + 4) if rw else 0) + len(END)
    try:
        os.mkdir(folder)
    except OSError:
        pass
    free = _free_bytes(folder)
    if 0 <= free < total + SPACE_SLACK:
        raise SnapshotError("no room for snapshot %s: it needs %d B and leaves %d B free beside it; the filesystem has %d B "
                            "free" % (name, total, SPACE_SLACK, free))
    tmp = p + ".tmp"
    i = c.slot_of(h)
    try:
        with open(tmp, "wb") as f:
            w = _Writer(f, hook, total)
            w.put(hdr)
            w.end_section()
            w.put(toks)
            w.end_section()
            mv = memoryview(c.arena)
            bb = lay.block_bytes
            for k in range(held):
                b = c.block_at(h, k)
                w.put(mv[b * bb:(b + 1) * bb])
                w.end_section()
                yield
            if rw:
                w.put(memoryview(c.resid)[i * rw:(i + 1) * rw], 4 * rw)
                w.put(memoryview(c.flags)[i * t:(i + 1) * t])
                w.end_section()
            w._raw(END)
            _fsync(f)
        if w.n != total:
            raise OSError("wrote %d B of %d" % (w.n, total))
        _commit(tmp, p)
    except OSError as e:
        _remove(tmp)
        raise SnapshotError("snapshot %s not saved (%s); the previous one of that name is kept" % (name, e))
    except GeneratorExit:
        _remove(tmp)
        raise
    sectors = (total + SECTOR_BYTES - 1) // SECTOR_BYTES
    if out is not None:
        out.update({"path": p, "bytes": total, "blocks": held, "tokens": len(toks) // 2, "positions": st[1],
                    "sectors": sectors, "erases": sectors, "erase_us": sectors * ERASE_US})


def _commit(tmp, p):
    # tmp replaces p at once; where rename cannot replace a file, p goes to p.old first
    try:
        os.rename(tmp, p)
    except OSError:
        if not _exists(p):
            raise
        _remove(p + ".old")
        os.rename(p, p + ".old")
        os.rename(tmp, p)
    _remove(p + ".old")


def _open_path(name, folder):
    p = path_of(name, folder)
    if _exists(p):
        return p
    if _exists(p + ".old"):  # a save cut between its two renames (filesystems that cannot replace)
        return p + ".old"
    raise SnapshotError("no snapshot %s (in %s/)" % (name, folder))


def _read(f, n, what):
    b = f.read(n)
    if b is None or len(b) != n:
        raise SnapshotError("the snapshot is truncated (in its %s)" % what)
    return b


def _crc_ok(f, crc, what):
    if struct.unpack("<I", _read(f, 4, what))[0] != crc:
        raise SnapshotError("the snapshot's %s fails its CRC" % what)


# the header of snapshot file p as a dict (host tools and resume); SnapshotError for a
# file that is not a snapshot of this format
def header(f):
    raw = _read(f, HDR_BYTES, "header")
    if raw[:4] != MAGIC:
        raise SnapshotError("not a kvrtos snapshot (no %r at its start)" % MAGIC)
    v = struct.unpack("<H", raw[4:6])[0]
    if v != VERSION:
        raise SnapshotError("snapshot format version %d, this firmware reads version %d" % (v, VERSION))
    _crc_ok(f, _crc(raw), "header")
    x = struct.unpack(HDR, raw)
    # what a damaged or crafted header could make a reader loop over or allocate, bounded first
    if (x[2] != HDR_BYTES or x[8] >= len(kv.DTYPES) or x[9] >= len(PATHS) or x[10] >= len(ROPES) or x[11] < 1
            or x[12] < 8 * x[11] or x[12] % 4 or x[29] > TOKENS_MAX or x[23] > kv.INT_MAX // x[12] or x[32] > x[11]):
        raise SnapshotError("the snapshot's header is damaged")
    return {"model_sha256": x[3], "tokenizer_sha256": x[4], "n_layers": x[5], "n_kv_heads": x[6], "head_dim": x[7],
            "dtype": kv.DTYPES[x[8]], "path": PATHS[x[9]], "rope": ROPES[x[10]], "tokens_per_block": x[11],
            "block_bytes": x[12], "map_size": x[13], "state": list(x[14:23]), "held": x[23], "temperature": x[24],
            "top_p": x[25], "rng": (x[26], x[27]), "pending": x[28], "n_tokens": x[29], "dropped": x[30],
            "resid_words": x[31], "flag_bytes": x[32]}


def total_bytes(d):
    return (HDR_BYTES + 4 + 2 * d["n_tokens"] + 4 + d["held"] * (d["block_bytes"] + 4)
            + ((4 * d["resid_words"] + d["flag_bytes"] + 4) if d["resid_words"] else 0) + len(END))


def _f32(x):
    # x as the header keeps it (float32: a board's single-precision float and a host's double
    # of the same setting compare equal)
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _hex(b):
    return binascii.hexlify(b).decode()[:12]


# what about snapshot d (header()) session s cannot take, as one line, or "" (sampler: its
# sampler's settings compared too)
def mismatch(s, d, sampler=True):
    mdl, tkn = identity(s)
    c = s.cache
    lay = c.layout
    if d["model_sha256"] != mdl:
        return "it was made with another model (sha256 %s..., this one %s...)" % (_hex(d["model_sha256"]), _hex(mdl))
    if d["tokenizer_sha256"] != tkn:
        return "it was made with another tokenizer (sha256 %s..., this one %s...)" % (_hex(d["tokenizer_sha256"]), _hex(tkn))
    want = (lay.n_layers, lay.n_kv_heads, lay.head_dim, lay.dtype, c.t, lay.block_bytes)
    got = (d["n_layers"], d["n_kv_heads"], d["head_dim"], d["dtype"], d["tokens_per_block"], d["block_bytes"])
    if got != want:
        return "its KV layout (%s KV, %d tokens a block of %d B) is not this session's (%s KV, %d tokens a block of %d B)" % (
            d["dtype"], d["tokens_per_block"], d["block_bytes"], lay.dtype, c.t, lay.block_bytes)
    if d["path"] != PATHS[_path_no(s)] or d["rope"] != s.model.rope:
        return "it was decoded on the %s path with RoPE %s; this session runs the %s path with RoPE %s" % (
            d["path"], d["rope"], PATHS[_path_no(s)], s.model.rope)
    pol = d["state"][0]
    if pol < len(kv.POLICIES) and kv.POLICIES[pol] != s.policy:
        return "its KV policy is %s (budget %d); this session's is %s: boot it with that policy" % (
            kv.POLICIES[pol], d["state"][2], s.policy)
    if d["state"][0] == 3 and d["map_size"] != c.map_size:  # h2o: its victims follow the position map's size
        return "its h2o position map has %d entries, this cache's %d (boot with the same pool)" % (d["map_size"], c.map_size)
    sm = s.sampler
    if sampler and (d["temperature"], d["top_p"]) != (_f32(sm.temperature), _f32(sm.top_p)):
        return "it was sampled at temperature %g, top_p %g; this session samples at %g, %g" % (
            d["temperature"], d["top_p"], sm.temperature, sm.top_p)
    return ""


# resume snapshot NAME into session s: the saved sequence takes the place of s.h, the
# sampler's RNG state restored, s.pending the token to feed first (then continue_ids()).
# Everything is checked first (the header, the identity and settings, the state's words,
# the size, every section's CRC, the room in the pool), so a refusal leaves s.h and its
# conversation as they were: SnapshotError with one line, nothing loaded. Where the pool and
# the cache have room for both, the saved sequence is loaded before s.h is closed; else s.h
# gives its blocks back first, and a read that fails after the checks (the file changed
# under us) leaves s.h open again, empty, and says so. Returns the header dict
def resume(s, name, folder=DIR, prefix=False):
    # prefix: for resume_prefix (the chats sample with their own samplers: the session's is
    # neither compared nor restored)
    p = _open_path(name, folder)
    c = s.cache
    try:
        with open(p, "rb") as f:
            d = _check(s, name, p, f, prefix)
            bb = d["block_bytes"]
            mv = memoryview(c.arena)
            at = HDR_BYTES + 4 + 2 * d["n_tokens"] + 4  # the first block

            def fill(k, b):
                return f.readinto(mv[b * bb:(b + 1) * bb]) == bb and len(f.read(4)) == 4

            def load():
                f.seek(at)
                h = adopt(c, s.region, d["state"], fill)
                rw = d["resid_words"]
                if h >= 0 and rw:
                    i = c.slot_of(h)
                    t = c.t
                    try:
                        ok = (f.readinto(memoryview(c.resid)[i * rw:(i + 1) * rw]) == 4 * rw
                              and f.readinto(memoryview(c.flags)[i * t:(i + 1) * t]) == t)
                    except Exception:
                        ok = False
                    if not ok:
                        c.close(h)
                        h = kv.E_STATE
                return h

            old = s.h
            h = load()  # beside the session's own sequence, when there is room for both
            if h >= 0:
                c.close(old)
            elif h == kv.E_NO_SLOT or h == kv.E_NO_BLOCK:
                st_old = seq_state(c, old)
                c.close(old)  # its blocks first (the room was checked with them counted)
                h = load()
                if h < 0:
                    s.h = _reopen(s, st_old)
                    _forget(s)
                    raise SnapshotError("snapshot %s could not be loaded (status %d: the file changed while it was read?); "
                                        "this session's conversation was lost: its sequence is open again, empty" % (name, h))
            else:
                raise SnapshotError("snapshot %s could not be loaded (status %d); nothing changed" % (name, h))
            f.seek(HDR_BYTES + 4)
            toks = _read(f, 2 * d["n_tokens"], "tokens")
    except OSError as e:
        raise SnapshotError("snapshot %s cannot be read: %s" % (name, e))
    s.h = h
    if not prefix:
        s.sampler.state_hi, s.sampler.state_lo = d["rng"]
    s.pending = d["pending"]
    s.pos0 = s.pend_pos = c.length(h)
    s.snap_tokens = toks
    s.snap_dropped = d["dropped"]
    s.last_ids = None
    s.tokens = None
    s.n_new = 0
    return d


# session s's conversation forgotten (its sequence was reopened empty)
def _forget(s):
    s.pending = -1
    s.pos0 = s.pend_pos = 0
    s.snap_tokens = None
    s.snap_dropped = 0
    s.last_ids = None


# snapshot file p (open as f) checked for session s without loading anything: first what the
# header says (the identity and settings, the state's words, the size, the room in the pool
# once s's own sequence has given its blocks back), then every section's CRC. Its header
# dict, or SnapshotError
def _check(s, name, p, f, prefix=False):
    d = header(f)
    size = _size(p)
    if size != total_bytes(d):
        raise SnapshotError("snapshot %s is %s: %d B where its header says %d" % (
            name, "truncated" if size < total_bytes(d) else "longer than it should be", size, total_bytes(d)))
    why = mismatch(s, d, not prefix) or state_error(s.cache, d["state"])
    if why:
        raise SnapshotError("snapshot %s does not fit this session: %s" % (name, why))
    c = s.cache
    st = d["state"]
    if held_blocks(st, c.t) != d["held"]:
        raise SnapshotError("the snapshot's header is damaged (blocks held)")
    if d["resid_words"] != (c.n_layers * c.t * c.kv_dim if c.kivi else 0) or d["flag_bytes"] != (c.t if c.kivi else 0):
        raise SnapshotError("the snapshot's header is damaged (int4 residual)")
    if not 0 <= d["pending"] < s.cfg.vocab_size:
        raise SnapshotError("the snapshot's header is damaged (pending token %d)" % d["pending"])
    own = 0
    for k in range(c.max_blocks):
        b = c.block_at(s.h, k)
        if b >= 0 and c.ref[b] == 1:
            own += 1
    free = c.pool.available(s.region)
    if free + own < d["held"]:
        raise SnapshotError("snapshot %s needs %d blocks of the KV pool; %d are free with this session's own" % (
            name, d["held"], free + own))
    _sections(f, d)
    return d


# a snapshot file (open as f, `size` bytes) checked whole without a session: its header,
# its size, every section's CRC and its end mark. Its header dict, or SnapshotError. The
# host tools (./kv snapshot pull/push) check a file with it before and after a copy
def scan(f, size, name="file"):
    d = header(f)
    if size != total_bytes(d):
        raise SnapshotError("snapshot %s is %s: %d B where its header says %d" % (
            name, "truncated" if size < total_bytes(d) else "longer than it should be", size, total_bytes(d)))
    _sections(f, d)
    return d


# every section after the header (f just past it) read in small pieces against its CRC, then
# the end mark; SnapshotError naming the first that fails
def _sections(f, d):
    buf = bytearray(_CHUNK)
    mv = memoryview(buf)
    k = -1
    while k <= d["held"]:
        if k < 0:
            n = 2 * d["n_tokens"]
        elif k < d["held"]:
            n = d["block_bytes"]
        else:
            n = 4 * d["resid_words"] + d["flag_bytes"] if d["resid_words"] else -1
        k += 1
        if n < 0:
            break
        crc = 0
        while n > 0:
            m = n if n < _CHUNK else _CHUNK
            if f.readinto(mv[:m]) != m:
                raise SnapshotError("the snapshot is truncated (in its %s)" % _section_name(k - 1, d))
            crc = _crc(mv[:m], crc)
            n -= m
        _crc_ok(f, crc, _section_name(k - 1, d))
    if f.read(len(END)) != END:
        raise SnapshotError("the snapshot is damaged (no end mark)")


def _section_name(k, d):
    return "tokens" if k < 0 else ("block %d" % k if k < d["held"] else "int4 residual")


def _reopen(s, st):
    # the session's sequence again, empty, with the settings it had (policy, budget, sinks)
    try:
        return s.cache.open(s.region, kv.POLICIES[st[0]], st[2], st[3] or kv.SINKS) if st.__class__ is list else s.h
    except kv.KVError:
        return s.cache.open(s.region, s.policy, s.cap)


# the ids a request that goes on from a resumed (or finished) conversation feeds: the
# pending token, then text's (no BOS); the ids so far are kept for the next save. s.pos0
# is where they go. SnapshotError when there is nothing to go on from or no room
def continue_ids(s, text=""):
    if getattr(s, "pending", -1) < 0:
        raise SnapshotError("nothing to go on from: resume a snapshot or finish a request first")
    c = s.cache
    n = c.length(s.h)
    if n != getattr(s, "pend_pos", -1):
        raise SnapshotError("nothing to go on from: the sequence is not the one the last request left")
    more = s.tok.encode(text, False, False) if text else []
    if more and more[0] == s.tok.space:  # the tokenizer's dummy prefix: the text goes on from the conversation as typed
        more = more[1:]
    ids = [s.pending] + more
    st = seq_state(c, s.h)
    if st.__class__ is not int and st[0] == 0 and n + len(ids) > st[2]:
        raise SnapshotError("the conversation holds %d positions; %d more pass its KV budget of %d" % (n, len(ids), st[2]))
    toks, dropped = _tokens_of(s)  # what the conversation has fed so far, kept for the next save
    s.snap_tokens = toks
    s.snap_dropped = dropped
    s.tokens = None
    s.n_new = 0
    s.pos0 = n  # the pending token's position
    s.last_ids = ids
    return ids


# --- shared prefixes: one restored prefix forked by several chats ---------------------

# the task (a generator for sched.Kernel) that feeds a prefix into session s's sequence,
# all of ids (encode()'s, BOS first) but the last, which is left pending: the state a
# prefix snapshot holds (save() it after the task ends; resume_prefix() in a Session with
# chats). The same positions as Session.prefix_task feeds for its chats
def prefix_task(s, kernel, ids):
    if not ids:
        raise SnapshotError("the prefix must hold at least BOS (use encode())")
    if s.cache.length(s.h) != 0:
        raise SnapshotError("the session's sequence is not empty: a prefix starts a conversation")
    s.pos0 = 0
    if len(ids) > 1:
        yield from s.task(kernel, ids[:-1], 1, _discard, True)
    if not s.stop and s.cache.length(s.h) == len(ids) - 1:
        s.pending = ids[-1]
        s.pend_pos = len(ids) - 1
        s.last_ids = ids
        s.n_new = 0


def _discard(b):
    pass


# chats sharing a restored prefix: session s was booted for its chats (seqs=N) and they are
# made (s.chat()); in place of s.prefix_task(), snapshot NAME (a prefix_task() state, saved)
# is loaded into the first chat's sequence and every other chat forks it, sharing its blocks
# (copy on write), as the prefix task does with a prefix it fed. Each chat then feeds the
# prefix's pending token and its own text (spawn the chats' tasks as usual). Returns the
# snapshot's header dict; SnapshotError with one line and nothing changed
def resume_prefix(s, kernel, name, folder=DIR):
    from firmware_py.sched import EventFlags  # noqa: PLC0415

    if not s.chats:
        raise SnapshotError("no chats: make them with chat() before resume_prefix()")
    if s.ready is not None:
        raise SnapshotError("the chats' prefix was already made (prefix_task() or resume_prefix())")
    with open(_open_path(name, folder), "rb") as f:
        pos = header(f)["state"][1]
    for c in s.chats:
        if s.policy == "full" and pos + 1 + len(c.own) > s.cap:
            raise SnapshotError("chat %d's prompt is %d tokens (prefix %d + its own %d), more than %s" % (
                c.index, pos + 1 + len(c.own), pos + 1, len(c.own), s.limit))
    d = resume(s, name, folder, True)
    for c in s.chats:
        c.ids = [s.pending] + c.own
        c.pos0 = s.pos0
    s.ready = EventFlags(kernel)
    s.t_start = s.t_end = kernel.now()
    s.fork_chats()
    return d


# --- serve's save and resume commands (firmware_py/serve.py's Server srv; here, so that
# the board's boot does not carry their code) ----------------------------------------------

# save srv's conversation as `name`; OK, or E_RANGE with the reason printed
def serve_save(srv, name):
    st = OK
    g = serve_save_steps(srv, name)
    try:
        for x in g:
            st = x
    finally:
        g.close()
    return st


# serve_save() as the steps of the task that runs it (the request's, for a save asked during
# it: a yield after each block written, so the tasks beside it run between the flash
# writes); its last value is the status
def serve_save_steps(srv, name):
    s = srv.session
    i = {}
    try:
        if s is None:
            raise SnapshotError("no conversation to save: run a request first")
        g = save_steps(s, name, out=i)
        try:
            for _ in g:
                yield OK
        finally:
            g.close()
    except (SnapshotError, MemoryError) as e:
        srv.out("serve: save refused: %s" % e)
        yield E_RANGE
        return
    srv.out("serve: saved %s: %d B, %d positions, %d tokens, %d blocks, %d sectors" % (
        name, i["bytes"], i["positions"], i["tokens"], i["blocks"], i["sectors"]))
    yield OK


# serve's save and resume command frames (body: the snapshot's name); the status to ack
def serve_command(srv, ftype, body):
    from firmware_py import telemetry as tm  # noqa: PLC0415

    try:
        name = body.decode()
    except UnicodeError:
        name = ""
    if ftype == tm.T_CMD_RESUME:
        return serve_resume(srv, name)
    if srv.task is not None:  # saved when the running request ends (between tokens)
        if srv.save_as:
            srv.out("serve: save %s replaces the save of %s asked during this request" % (name, srv.save_as))
        srv.save_as = name
        return OK
    return serve_save(srv, name)


# the ids of a prompt that goes on from srv's resumed conversation; DecodeError (the request
# refused with its line) when it cannot, or when the resume sent before it was refused (it
# is not run as a new conversation: sent again, it is)
def serve_continue(srv, text):
    from firmware_py import decode  # noqa: PLC0415

    if srv.resume_failed:
        srv.resume_failed = False
        raise decode.DecodeError("the resume before it was refused, so it was not run (send it again to start a new "
                                 "conversation)")
    try:
        return continue_ids(srv.session, text)
    except SnapshotError as e:
        raise decode.DecodeError(str(e))


# the saves asked during request req of srv (one after another: one asked during a save is
# made after it), as steps of the request's task, each acked with its status
def serve_saves(srv, req):
    from firmware_py import telemetry as tm  # noqa: PLC0415

    while srv.save_as:
        srv.saving = srv.save_as
        srv.save_as = ""
        st = OK
        g = serve_save_steps(srv, srv.saving)
        try:
            for x in g:
                st = x
                yield
        finally:
            g.close()
        srv.saving = ""
        srv.tm.event(tm.EV_ACK, tm.T_CMD_SAVE, st, req)


# request req of srv was stopped inside its save: the previous snapshot of that name is kept
def serve_save_stopped(srv, req):
    from firmware_py import telemetry as tm  # noqa: PLC0415

    srv.out("serve: save refused: %s was stopped while it was written; the previous one of that name is kept" % srv.saving)
    srv.tm.event(tm.EV_ACK, tm.T_CMD_SAVE, E_RANGE, req)
    srv.saving = ""


# the next prompts of srv go on from snapshot `name`; OK, or E_STATE (a request runs) /
# E_RANGE with the reason printed (the conversation on the board is kept)
def serve_resume(srv, name):
    from firmware_py import decode  # noqa: PLC0415

    if srv.task is not None:
        srv.out("serve: resume refused: a request is running (stop it first)")
        return E_STATE
    try:
        s = srv.session
        if s is None or srv.boot_options() != srv.booted:  # a config sent before it: a Session booted with it
            s = srv.session_next()
        d = resume(s, name)
    except (SnapshotError, decode.DecodeError, MemoryError) as e:
        srv.out("serve: resume refused: %s" % e)
        srv.resume_failed = True  # the prompt sent after it is not run as a new conversation
        if srv.session is not None and srv.session.pending < 0:
            srv.going_on = False  # its conversation was lost (the line says so): nothing to go on from
        return E_RANGE
    srv.resume_failed = False
    srv.going_on = True
    srv.attach(s, d["state"][2])
    srv.out("serve: resumed %s: %d positions; the next prompt goes on from it" % (name, s.pos0))
    return OK


# [(name, bytes)] of the snapshots in folder, by name
def listing(folder=DIR):
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for n in sorted(names):
        if n.endswith(".kvs") or (n.endswith(".kvs.old") and n[:-4] not in names):  # .old: a save cut between renames
            out.append((n[:n.index(".kvs")], _size(folder + "/" + n)))
    return out


# delete snapshot NAME; SnapshotError when there is none
def delete(name, folder=DIR):
    p = path_of(name, folder)
    if not _exists(p) and not _exists(p + ".old"):
        raise SnapshotError("no snapshot %s (in %s/)" % (name, folder))
    _remove(p)
    _remove(p + ".old")
    _remove(p + ".tmp")
