# `./kv snapshot list|pull|push|rm`: KV snapshots (firmware_py/snapshot.py) on a board's
# filesystem, listed, copied to the host and to another board, and deleted, over the raw
# REPL (mpremote's transport, as flash uses it). Every copy is checked whole (its header,
# size, every CRC: snapshot.scan) and verified by sha256 on both sides. The format is
# word-size independent: a snapshot pulled from a 64-bit virtual board resumes on a 32-bit
# one, or on a chip.
#   ./kv snapshot list --port P
#   ./kv snapshot pull NAME FILE --port A     (FILE must not exist: nothing is overwritten)
#   ./kv snapshot push FILE [--name NAME] --port B
#   ./kv snapshot rm NAME --port P
# Connecting soft-resets the board, as flash and mpremote do: a running serve stops.
import hashlib
import io
import os

from firmware_py import kv
from firmware_py import snapshot as snap
from host import link, options, paths
from host.errors import UserError

FOLDER = snap.DIR  # on the board, relative to its current folder (the filesystem's root)
CHUNK = 1024  # bytes a raw-REPL write sends at a time
ACTIONS = ("list", "pull", "push", "rm")
_LIST = """
import os, binascii
try:
    al = os.listdir(%(d)r)
    ns = sorted(n for n in al if n.endswith('.kvs') or (n.endswith('.kvs.old') and n[:-4] not in al))
except OSError:
    ns = []
out = []
for n in ns:
    try:
        if os.stat(%(d)r + '/' + n)[0] & 0x4000:
            continue
        f = open(%(d)r + '/' + n, 'rb')
        h = f.read(%(hb)d)
        f.close()
    except OSError:
        continue
    out.append((n[:n.index('.kvs')], os.stat(%(d)r + '/' + n)[6], binascii.hexlify(h).decode()))
print(repr(out))
"""
_FREE = """
import os
try:
    os.mkdir(%(d)r)
except OSError:
    pass
try:
    v = os.statvfs(%(d)r)
    print(v[0] * v[4])
except (AttributeError, OSError):
    print(-1)
"""
_COMMIT = """
import os
def _rm(x):
    try:
        os.remove(x)
    except OSError:
        pass
try:
    os.rename(%(tmp)r, %(p)r)
except OSError:
    _rm(%(p)r + '.old')
    os.rename(%(p)r, %(p)r + '.old')
    os.rename(%(tmp)r, %(p)r)
_rm(%(p)r + '.old')
print(1)
"""
_RM = """
import os
n = 0
for p in (%(p)r, %(p)r + '.old', %(p)r + '.tmp'):
    try:
        os.remove(p)
        n += 1
    except OSError:
        pass
print(n)
"""


def _check_bytes(data, name):
    # the snapshot's header dict when data is a whole, undamaged snapshot; else UserError
    try:
        return snap.scan(io.BytesIO(data), len(data), name)
    except snap.SnapshotError as e:
        raise UserError("%s: %s" % (name, e), 1) from None


def _exec(t, code):
    from mpremote.transport import TransportError

    try:
        out = t.exec(code).decode("utf-8", "replace").strip()
    except TransportError as e:  # the board raised (a file it could not read): its last line
        last = [x for x in str(e).strip().splitlines() if x.strip()]
        raise UserError("the board refused: %s" % (last[-1] if last else type(e).__name__), 1) from None
    return out.splitlines()[-1] if out else ""


def listing(t):
    # [(name, bytes, header dict or None)] of the board's snapshots
    import ast

    raw = _exec(t, _LIST % {"d": FOLDER, "hb": snap.HDR_BYTES + 4})
    try:
        rows = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        raise UserError("the board's answer to the snapshot listing was not understood: %r" % raw[-80:], 1) from None
    out = []
    for name, size, hx in rows:
        d = None
        try:
            d = snap.header(io.BytesIO(bytes.fromhex(hx)))
        except (snap.SnapshotError, ValueError):
            pass
        out.append((name, size, d))
    return out


def _board_path(name):
    return FOLDER + "/" + name + ".kvs"


def pull(t, name, dest, out=print):
    p = _board_path(name)
    want, old = link.device_hashes(t, [p, p + ".old"])
    if want is None and old is not None:  # a save cut between its renames: the firmware resumes this one
        p, want = p + ".old", old
    if want is None:
        raise UserError("no snapshot %s on the board (./kv snapshot list shows what is there)" % name, 1)
    from mpremote.transport import TransportError

    try:
        data = t.fs_readfile(p)
    except TransportError as e:
        last = [x for x in str(e).strip().splitlines() if x.strip()]
        raise UserError("snapshot %s cannot be read on the board: %s" % (name, last[-1] if last else e), 1) from None
    if hashlib.sha256(data).hexdigest() != want:
        raise UserError("snapshot %s: the copy's sha256 differs from the board's (the link lost bytes): run it again" % name, 1)
    d = _check_bytes(data, "snapshot %s" % name)
    import tempfile

    # written whole beside it, then linked in as a new name (link never replaces: a file made
    # since the check is never overwritten, and an interrupted pull leaves no partial file)
    try:
        fd, part = tempfile.mkstemp(prefix=".kvrtos-pull-", dir=os.path.dirname(os.path.abspath(dest)))
    except OSError as e:
        raise UserError("cannot write %s: %s" % (dest, e.strerror or e), 2) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(part, 0o644)
        os.link(part, dest)
    except FileExistsError:
        raise UserError("%s exists: pull writes a new file (remove it or pick another name)" % dest, 2) from None
    except OSError as e:
        raise UserError("cannot write %s: %s" % (dest, e.strerror or e), 2) from None
    finally:
        try:
            os.remove(part)
        except OSError:
            pass
    out("snapshot: pulled %s to %s: %d B, %d positions, %d tokens, %s KV, sha256 %s verified" % (
        name, dest, len(data), d["state"][1], d["n_tokens"], d["dtype"], want[:16]))
    return d


def push(t, src, name, out=print):
    with open(src, "rb") as f:
        data = f.read()
    d = _check_bytes(data, src)
    free = int(_exec(t, _FREE % {"d": FOLDER}) or -1)
    if 0 <= free < len(data) + snap.SPACE_SLACK:
        raise UserError("no room on the board for snapshot %s: it needs %d B and leaves %d B free beside it; its "
                        "filesystem has %d B free" % (name, len(data), snap.SPACE_SLACK, free), 1)
    p = _board_path(name)
    part = p + ".tmp"
    t.fs_writefile(part, data, chunk_size=CHUNK)
    (got,) = link.device_hashes(t, [part])
    want = hashlib.sha256(data).hexdigest()
    if got != want:
        _exec(t, _RM % {"p": p[:-4] + ".kvs.tmp"})
        raise UserError("snapshot %s: the board's copy has sha256 %s, the file %s (the link lost bytes): run it again"
                        % (name, (got or "none")[:16], want[:16]), 1)
    # in place of an old one of that name, as the firmware's own save commits (snapshot._commit):
    # renamed over it, or where a rename cannot replace, the old one to NAME.kvs.old first
    _exec(t, _COMMIT % {"tmp": part, "p": p})
    out("snapshot: pushed %s as %s: %d B, %d positions, %d tokens, %s KV, sha256 %s verified" % (
        src, name, len(data), d["state"][1], d["n_tokens"], d["dtype"], want[:16]))
    return d


def rm(t, name, out=print):
    n = int(_exec(t, _RM % {"p": _board_path(name)}) or 0)
    if not n:
        raise UserError("no snapshot %s on the board (./kv snapshot list shows what is there)" % name, 1)
    out("snapshot: removed %s" % name)


def main(action, name=None, file=None, port=None, board=None, out=print):
    options.choice(action, "the action", ACTIONS)
    if action in ("pull", "rm"):
        if name is None:
            raise UserError("./kv snapshot %s needs the snapshot's NAME" % action, 2)
        options.snapshot_name(name, "NAME")
    if action in ("pull", "push") and file is None:
        raise UserError("./kv snapshot %s needs a FILE (%s)" % (
            action, "where the copy goes" if action == "pull" else "the snapshot to copy to the board"), 2)
    if action == "list" and (name is not None or file is not None):
        raise UserError("./kv snapshot list takes no NAME or FILE", 2)
    if action == "push":
        paths.regular_file(file, "FILE")
        if name is None:
            base = os.path.basename(file)
            name = base[:-4] if base.endswith(".kvs") else base
            try:
                options.snapshot_name(name, "NAME")
            except UserError:
                raise UserError("%s's name is not a snapshot name: give one with --name" % file, 2) from None
        else:
            options.snapshot_name(name, "--name")
        with open(file, "rb") as f:
            _check_bytes(f.read(), file)  # before the board is touched
    if action == "pull":
        if file.endswith(os.sep) or file.endswith("/"):
            raise UserError("FILE %s names a folder: give the new file's name" % file, 2)
        if os.path.lexists(file):
            raise UserError("%s exists: pull writes a new file (remove it or pick another name)" % file, 2)
        folder = os.path.dirname(os.path.abspath(file))
        if not os.path.isdir(folder):
            raise UserError("cannot write %s: %s is not a folder" % (file, folder), 2)
    port = link.check_port(link.port_of(port, board or paths.DEFAULT_BOARD))
    t = link.connect_twice(port, link.CONNECT_S)
    try:
        if action == "list":
            rows = listing(t)
            if not rows:
                out("snapshot: none on the board (%s/)" % FOLDER)
            for n, size, d in rows:
                if d is None:
                    out("%-32s %9d B  (not a snapshot this version reads)" % (n, size))
                else:
                    out("%-32s %9d B  %5d positions  %5d tokens  %-7s KV  %s  %s" % (
                        n, size, d["state"][1], d["n_tokens"], d["dtype"], kv.POLICIES[d["state"][0]] if d["state"][0] < len(kv.POLICIES) else "?", d["path"]))
            return rows
        if action == "pull":
            return pull(t, name, file, out)
        if action == "push":
            return push(t, file, name, out)
        return rm(t, name, out)
    finally:
        link.close(t)
