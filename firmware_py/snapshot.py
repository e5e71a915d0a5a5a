# KV snapshots: one sequence of a decode.Session saved to a named file on the board's
# filesystem between tokens, and resumed later (after a reset, deep sleep, or on another
# board) as a new sequence that decodes on token for token as if never interrupted.
#
#   from firmware_py import snapshot
#   info = snapshot.save(session, "chat1")        # between requests (never inside a token)
#   snapshot.resume(session, "chat1")             # the session's sequence is now the saved one
#   ids = session.continue_ids(" and then")       # the pending token + new text: session.task(k, ids, n, out)
#   snapshot.listing(); snapshot.delete("chat1")
#
# File format (docs/snapshots.md), little-endian and word-size independent, version 1:
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
# everything before it takes a block, each block's CRC as it reads it, and gives every block
# back when anything fails: nothing is loaded. Every refusal is SnapshotError, one line.
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

MAGIC = b"KVSN"
END = b"KVSE"
VERSION = 1
DIR = "snapshots"  # the folder on the board's filesystem (the current folder's)
NAME_MAX = 32
# magic, version, header bytes, model sha256, tokenizer sha256; layers, KV heads, head dim,
# dtype, path, rope, tokens per block, block bytes, h2o map size; the 9 state words; blocks
# held; temperature, top_p, RNG hi, RNG lo; pending, tokens kept, tokens dropped; residual
# words, flag bytes
HDR = "<4sHH32s32sHHHBBBxHII9iIddHHiIIII"
HDR_BYTES = struct.calcsize(HDR)
TOKENS_MAX = 8192  # conversation ids a snapshot keeps (the newest; the rest counted as dropped)
SPACE_SLACK = 2 * SECTOR_BYTES  # what a save leaves free on the filesystem beyond its file
_CHUNK = 512  # bytes hashed per read
PATHS = ("float", "integer")
RUNNING = -2  # Session.pending while its task runs (or after it was stopped inside a token)
ROPES = ("absolute", "cache")


class SnapshotError(ValueError):
    # a save or a load refused; str() is one line
    pass


def _name_ok(name):
    if name.__class__ is not str or not 1 <= len(name) <= NAME_MAX:
        raise SnapshotError("a snapshot name is 1..%d characters, got %r" % (NAME_MAX, name))
    for ch in name:
        if not (ch.isalpha() or ch.isdigit() or ch in "_-"):
            raise SnapshotError("a snapshot name holds letters, digits, _ and - only, got %r" % name)


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


# a new sequence of cache c in region with state st (seq_state's): opened with its policy,
# budget, sinks and recent, its held blocks filled by fill(k, b) (table index k, pool block
# b; False: refused), its words set, and h2o's position map made again from the blocks'
# headers as kv keeps it. The handle, or E_RANGE (a state c cannot hold), E_NO_SLOT,
# E_NO_BLOCK, E_STATE (fill refused), with nothing taken
def adopt(c, region, st, fill):
    if len(st) != len(kv.SEQ_FIELDS):
        return kv.E_RANGE
    pol, n, cap, sinks, recent, wm, wmf, ev, cur = st
    held = held_blocks(st, c.t)
    if (not 0 <= pol < len(kv.POLICIES) or not 1 <= wm <= cap or wmf not in (0, 1) or not 0 <= ev <= n
            or not 0 <= n < kv.INT_MAX - 1 or held > c.max_blocks or not 0 <= cur <= held or (cur and not c.kivi)):
        return kv.E_RANGE
    try:
        h = c.open(region, kv.POLICIES[pol], cap, sinks if pol >= 2 else kv.SINKS, recent if pol == 3 else 0)
    except kv.KVError:
        return kv.E_RANGE
    if h < 0:
        return h
    o = c.seq_row(h)
    m = c.meta
    if [m[o + f] for f in kv.SEQ_FIELDS[2:5]] != [cap, sinks, recent]:
        c.close(h)
        return kv.E_RANGE
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
        if not fill(k, b):
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
    # the last request's ids (a continuation's first is the pending token, kept already) and
    # its picks (the pending one last); (u16 bytes, dropped count)
    old = getattr(s, "snap_tokens", None) or b""
    dropped = getattr(s, "snap_dropped", 0)
    ids = list(getattr(s, "last_ids", None) or ())
    if old and ids:
        ids = ids[1:]
    if s.tokens is not None:
        ids += [s.tokens[i] for i in range(s.n_new)]
    new = bytearray(2 * len(ids))
    for i, t in enumerate(ids):
        struct.pack_into("<H", new, 2 * i, t & 0xFFFF)
    allb = bytes(old) + bytes(new)
    n = len(allb) // 2
    if n > TOKENS_MAX:
        dropped += n - TOKENS_MAX
        allb = allb[2 * (n - TOKENS_MAX):]
    return allb, dropped


# save session s's sequence (h: one of its chats' handles; None: its own) as NAME in
# folder. Between tokens: refused while a request runs on it (s.running), and when there
# is no pending token (nothing decoded yet). Returns {"path", "bytes", "blocks", "tokens",
# "positions", "sectors", "erases", "flash_us"}; SnapshotError with one line, the previous
# snapshot of that name kept. hook(n, total): called after each write with the bytes
# written so far and the file's size (tests cut a save short there)
def save(s, name, folder=DIR, h=None, hook=None):
    p = path_of(name, folder)
    pending = getattr(s, "pending", -1)
    if pending == RUNNING:
        raise SnapshotError("a request is running, or was stopped inside a token: save between requests")
    if pending < 0:
        raise SnapshotError("nothing to save: the sequence has no decoded token to go on from (a request that ran to its "
                            "end, or to a full budget, leaves one)")
    c = s.cache
    h = s.h if h is None else h
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
        raise SnapshotError("no room for snapshot %s: it needs %d B, the filesystem has %d B free" % (name, total, free))
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
    sectors = (total + SECTOR_BYTES - 1) // SECTOR_BYTES
    return {"path": p, "bytes": total, "blocks": held, "tokens": len(toks) // 2, "positions": st[1],
            "sectors": sectors, "erases": sectors, "erase_us": sectors * ERASE_US}


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
    if x[2] != HDR_BYTES or x[8] >= len(kv.DTYPES) or x[9] >= len(PATHS) or x[10] >= len(ROPES):
        raise SnapshotError("the snapshot's header is damaged")
    return {"model_sha256": x[3], "tokenizer_sha256": x[4], "n_layers": x[5], "n_kv_heads": x[6], "head_dim": x[7],
            "dtype": kv.DTYPES[x[8]], "path": PATHS[x[9]], "rope": ROPES[x[10]], "tokens_per_block": x[11],
            "block_bytes": x[12], "map_size": x[13], "state": list(x[14:23]), "held": x[23], "temperature": x[24],
            "top_p": x[25], "rng": (x[26], x[27]), "pending": x[28], "n_tokens": x[29], "dropped": x[30],
            "resid_words": x[31], "flag_bytes": x[32]}


def total_bytes(d):
    return (HDR_BYTES + 4 + 2 * d["n_tokens"] + 4 + d["held"] * (d["block_bytes"] + 4)
            + ((4 * d["resid_words"] + d["flag_bytes"] + 4) if d["resid_words"] else 0) + len(END))


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
    if d["state"][0] == 3 and d["map_size"] != c.map_size:  # h2o: its victims follow the position map's size
        return "its h2o position map has %d entries, this cache's %d (boot with the same pool)" % (d["map_size"], c.map_size)
    sm = s.sampler
    if sampler and (d["temperature"], d["top_p"]) != (sm.temperature, sm.top_p):
        return "it was sampled at temperature %g, top_p %g; this session samples at %g, %g" % (
            d["temperature"], d["top_p"], sm.temperature, sm.top_p)
    return ""


# resume snapshot NAME into session s: its sequence (s.h) is closed and the saved one takes
# its place, the sampler's RNG state restored, s.pending the token to feed first (then
# continue_ids()). Everything is checked first (the header, the identity, the size, every
# section's CRC, the room in the pool), so a refusal leaves s.h as it was: SnapshotError
# with one line, nothing loaded. Returns the header dict
def resume(s, name, folder=DIR, prefix=False):
    # prefix: for resume_prefix (the chats sample with their own samplers: the session's is
    # neither compared nor restored)
    if getattr(s, "pending", -1) == RUNNING:
        raise SnapshotError("a request is running: resume between requests")
    p = _open_path(name, folder)
    c = s.cache
    try:
        with open(p, "rb") as f:
            d = _check(s, name, p, f, prefix)
            f.seek(HDR_BYTES + 4)
            toks = _read(f, 2 * d["n_tokens"], "tokens")
            f.read(4)
            bb = d["block_bytes"]
            mv = memoryview(c.arena)

            def fill(k, b):
                return f.readinto(mv[b * bb:(b + 1) * bb]) == bb and len(f.read(4)) == 4

            old = s.h
            st_old = seq_state(c, old)
            c.close(old)  # its blocks first: the pool may hold only one of the two (checked above)
            h = adopt(c, s.region, d["state"], fill)
            if h >= 0 and d["resid_words"]:
                rw = d["resid_words"]
                i = c.slot_of(h)
                t = c.t
                if (f.readinto(memoryview(c.resid)[i * rw:(i + 1) * rw]) != 4 * rw
                        or f.readinto(memoryview(c.flags)[i * t:(i + 1) * t]) != t):
                    c.close(h)
                    h = kv.E_STATE
            if h < 0:  # a read that failed after the checks (the file changed under us)
                s.h = _reopen(s, st_old)
                raise SnapshotError("snapshot %s could not be loaded (status %d); this session's conversation was "
                                    "lost: its sequence is open again, empty" % (name, h))
    except OSError as e:
        raise SnapshotError("snapshot %s cannot be read: %s" % (name, e))
    s.h = h
    if not prefix:
        s.sampler.state_hi, s.sampler.state_lo = d["rng"]
    s.pending = d["pending"]
    s.pos0 = c.length(h)
    s.snap_tokens = toks
    s.snap_dropped = d["dropped"]
    s.last_ids = None
    s.tokens = None
    s.n_new = 0
    return d


# snapshot file p (open as f) checked for session s without loading anything: the header,
# the identity, the size, every section's CRC, and that the pool can hold its blocks once
# s's own sequence has given its blocks back. Its header dict, or SnapshotError
def _check(s, name, p, f, prefix=False):
    d = scan(f, _size(p), name)
    why = mismatch(s, d, not prefix)
    if why:
        raise SnapshotError("snapshot %s does not fit this session: %s" % (name, why))
    c = s.cache
    st = d["state"]
    if held_blocks(st, c.t) != d["held"]:
        raise SnapshotError("the snapshot's header is damaged (blocks held)")
    if d["resid_words"] and (d["resid_words"] != c.n_layers * c.t * c.kv_dim or d["flag_bytes"] != c.t):
        raise SnapshotError("the snapshot's header is damaged (int4 residual)")
    # room: the saved sequence's blocks, from the free ones and those s's sequence holds alone
    if st[2] > c.max_slots or d["held"] > c.max_blocks:
        raise SnapshotError("snapshot %s holds a budget of %d tokens in %d blocks; this cache holds %d tokens in %d blocks a "
                            "sequence" % (name, st[2], d["held"], c.max_slots, c.max_blocks))
    own = 0
    for k in range(c.max_blocks):
        b = c.block_at(s.h, k)
        if b >= 0 and c.ref[b] == 1:
            own += 1
    free = c.pool.available(s.region)
    if free + own < d["held"]:
        raise SnapshotError("snapshot %s needs %d blocks of the KV pool; %d are free with this session's own" % (
            name, d["held"], free + own))
    return d


# a snapshot file (open as f, `size` bytes) checked whole without a session: its header,
# its size, every section's CRC and its end mark. Its header dict, or SnapshotError. The
# host tools (./kv snapshot pull/push) check a file with it before and after a copy
def scan(f, size, name="file"):
    d = header(f)
    if size != total_bytes(d):
        raise SnapshotError("snapshot %s is %s: %d B where its header says %d" % (
            name, "truncated" if size < total_bytes(d) else "longer than it should be", size, total_bytes(d)))
    buf = bytearray(_CHUNK)
    secs = [("tokens", 2 * d["n_tokens"])] + [("block %d" % k, d["block_bytes"]) for k in range(d["held"])]
    if d["resid_words"]:
        secs.append(("int4 residual", 4 * d["resid_words"] + d["flag_bytes"]))
    for what, n in secs:
        crc = 0
        while n > 0:
            m = n if n < _CHUNK else _CHUNK
            if f.readinto(memoryview(buf)[:m]) != m:
                raise SnapshotError("the snapshot is truncated (in its %s)" % what)
            crc = _crc(memoryview(buf)[:m], crc)
            n -= m
        _crc_ok(f, crc, what)
    if f.read(len(END)) != END:
        raise SnapshotError("the snapshot is damaged (no end mark)")
    return d


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
    s.pos0 = s.cache.length(s.h)  # the pending token's position
    toks, dropped = _tokens_of(s)
    s.snap_tokens = toks
    s.snap_dropped = dropped
    s.tokens = None
    s.n_new = 0
    ids = [s.pending] + (s.tok.encode(text, False, False) if text else [])
    s.last_ids = ids
    if s.policy == "full" and s.pos0 + len(ids) > s.cap:
        raise SnapshotError("the conversation holds %d positions; %d more pass the KV budget of %d" % (
            s.pos0, len(ids), s.cap))
    return ids


# --- shared prefixes: one restored prefix forked by several chats ---------------------

# the task (a generator for sched.Kernel) that feeds a prefix into session s's sequence,
# all of ids (encode()'s, BOS first) but the last, which is left pending: the state a
# prefix snapshot holds (save() it after the task ends; resume_prefix() in a Session with
# chats). The same positions as Session.prefix_task feeds for its chats
def prefix_task(s, kernel, ids):
    if not ids:
        raise SnapshotError("the prefix must hold at least BOS (use encode())")
    if len(ids) > 1:
        yield from s.task(kernel, ids[:-1], 1, _discard, True)
    if not s.stop and s.cache.length(s.h) == len(ids) - 1:
        s.pending = ids[-1]
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
    s.n_shared = s.cache.length(s.h)
    s.shared_blocks = s.pool.blocks_used
    for c in s.chats:
        if c.index == 0:
            c.h = s.h
        else:
            h = s.cache.fork(s.h)
            if h < 0:
                c.stop = "fork %d" % h
            else:
                c.h = h
    s.prefix_done = True
    s.ready.set(1)
    return d


# [(name, bytes)] of the snapshots in folder, by name
def listing(folder=DIR):
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for n in sorted(names):
        if n.endswith(".kvs"):
            out.append((n[:-4], _size(folder + "/" + n)))
    return out


# delete snapshot NAME; SnapshotError when there is none
def delete(name, folder=DIR):
    p = path_of(name, folder)
    if not _exists(p) and not _exists(p + ".old"):
        raise SnapshotError("no snapshot %s (in %s/)" % (name, folder))
    _remove(p)
    _remove(p + ".old")
    _remove(p + ".tmp")
