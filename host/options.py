# Every command-line value of every task is parsed and refused here, with the same
# one-line message whichever command takes it (exit 2: host.errors.UserError). A value
# comes as text from the command line, or already typed from a grid or scenario file.
#   whole(v, flag, lo, hi)     a whole number in ASCII digits (an optional sign), lo..hi
#   number(v, flag, lo, hi)    a finite number in [lo, hi] ((lo, hi] with open_lo)
#   seconds(v, flag)           a finite number of seconds above 0
#   choice(v, flag, choices)   one of the given names
import math
import re

from host.errors import UserError

TOKENS_MAX = 1 << 20  # every command's --tokens: at most this many (a generation, a ring soak, a budget's ask)
WINDOW_MAX = 1 << 20  # every command's --window

# a number as typed: ASCII digits, one point, an exponent, a sign; float() alone also
# took " 5 ", "1_0", "inf" and other scripts' digits
_NUMBER = re.compile(r"[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?")


def _span(lo, hi):
    if hi is None:
        return ">= %s" % lo
    return "in %s..%s" % (lo, hi)


def whole(v, flag, lo=0, hi=None):
    # int() alone took " 5", "1_000" and full-width digits ("４"), which no other parser
    # of the project took; bool is not a number here
    if isinstance(v, bool):
        raise UserError("%s must be a whole number %s, got %r" % (flag, _span(lo, hi), v), 2)
    if isinstance(v, int):
        n = v
    else:
        text = v if isinstance(v, str) else str(v)
        if text == "":
            raise UserError("%s needs a value: a whole number %s (got an empty one)" % (flag, _span(lo, hi)), 2)
        body = text[1:] if text[:1] in "+-" else text
        if not body or not all("0" <= ch <= "9" for ch in body):
            if any(ch.isdigit() and not "0" <= ch <= "9" for ch in body):  # another script's digits
                raise UserError("%s must be a whole number %s in ASCII digits 0-9, got %r" % (flag, _span(lo, hi), v), 2)
            raise UserError("%s must be a whole number %s, got %r" % (flag, _span(lo, hi), v), 2)
        n = int(text)
    if n < lo or (hi is not None and n > hi):
        raise UserError("%s must be a whole number %s, got %d" % (flag, _span(lo, hi), n), 2)
    return n


def _nspan(lo, hi, open_lo):
    if hi is None:
        return "%s %g" % (">" if open_lo else ">=", lo)
    return "in %s%g, %g]" % ("(" if open_lo else "[", lo, hi)


def number(v, flag, lo=0.0, hi=None, open_lo=False):
    if isinstance(v, bool):
        x = float("nan")
    elif isinstance(v, (int, float)):
        x = float(v)
    else:
        text = v if isinstance(v, str) else str(v)
        if text == "":
            raise UserError("%s needs a value: a number %s (got an empty one)" % (flag, _nspan(lo, hi, open_lo)), 2)
        x = float(text) if _NUMBER.fullmatch(text) else float("nan")
    if not math.isfinite(x) or x < lo or (open_lo and x == lo) or (hi is not None and x > hi):
        raise UserError("%s must be a number %s, got %r" % (flag, _nspan(lo, hi, open_lo), v), 2)
    return x


SECONDS_MAX = 7 * 24 * 3600  # a week: the longest --timeout (far more and Python's own waits overflow)


def seconds(v, flag):
    try:
        return number(v, flag, 0.0, SECONDS_MAX, open_lo=True)
    except UserError:
        raise UserError("%s must be a positive number of seconds, at most %d (a week), got %r" % (flag, SECONDS_MAX, v),
                        2) from None


def choice(v, flag, choices):
    if v not in choices:
        raise UserError("%s must be one of %s, got %r" % (flag, ", ".join(choices), v), 2)
    return v


def snapshot_name(v, flag):
    # a KV snapshot's name (firmware_py/snapshot.py: the file NAME.kvs on the board)
    from firmware_py import snapshot  # noqa: PLC0415

    try:
        snapshot.path_of(v)
    except snapshot.SnapshotError:
        raise UserError("%s must be a snapshot name of 1..%d letters, digits, _ and -, got %r" % (
            flag, snapshot.NAME_MAX, v), 2) from None
    return v
