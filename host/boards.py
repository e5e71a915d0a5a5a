# Board profiles on the host: names, paths and loading with one-line errors.
import os

from firmware_py import board as fw_board
from host import paths
from host.errors import UserError


def names():
    # every board profile in boards/, sorted
    return sorted(f[:-5] for f in os.listdir(paths.BOARDS) if f.endswith(".json"))


def path_of(name_or_path):
    # boards/<name>.json for a name; a path (it has a "/" or ends in .json) resolves
    # against the folder the user ran ./kv from
    if os.sep in name_or_path or "/" in name_or_path or name_or_path.endswith(".json"):
        p = paths.user_path(name_or_path)
        if os.path.isdir(p):
            raise UserError("board profile %s is a folder, not a JSON file" % name_or_path, 2)
        if os.path.exists(p):
            paths.regular_file(p, "board profile")  # a FIFO or /dev/null was "no board profile file"
        if not os.path.isfile(p):
            raise UserError("no board profile file %s (known boards: %s)" % (name_or_path, ", ".join(names())), 2)
        return p
    if not name_or_path:
        raise UserError("--board needs a board name (known: %s)" % ", ".join(names()), 2)
    p = os.path.join(paths.BOARDS, name_or_path + ".json")
    if not os.path.isfile(p):
        raise UserError("unknown board %r (known: %s)" % (name_or_path, ", ".join(names())), 2)
    return p


def load(name_or_path):
    # a validated Board; a malformed profile is a UserError naming file and field
    p = path_of(name_or_path)
    try:
        return fw_board.load(p)
    except fw_board.BoardError as e:
        raise UserError("bad board profile %s" % e, 2)


def unix_heapsize(usable, word_bytes=None):
    # the `micropython -X heapsize=` that gives the unix port a GC heap of `usable` bytes
    # (what gc.mem_free() + gc.mem_alloc() report, as a profile's micropython_heap_bytes
    # does for a board). The GC keeps 2 bits of allocation table and 1 bit of finaliser
    # table per block of 4 machine words (32 B on this 64-bit host, 16 B on a 32-bit
    # build: word_bytes 4), on top of the blocks themselves.
    import struct

    block = 4 * (word_bytes or struct.calcsize("P"))
    # + 16 blocks: the tables are rounded to whole blocks and the start aligned
    return -(-usable * (8 * block + 3) // (8 * block)) + 16 * block
