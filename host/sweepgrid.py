# `./kv sweep`'s grid: its axes (boards x models x policies x windows x KV element types
# x scenarios x cost kinds x token counts x seeds), the grid file, the command line on top
# of it, and the expansion into points, each a spec that host/emulate.py normalized.
# host/sweep.py runs them (docs/sweep.md).
import itertools
import json
import os

from host import options, paths
from host.errors import UserError

# the grid's axes: (grid-file key / CLI option without dashes, emulate spec key, parser)
AXES = (
    ("boards", "board", "str"),
    ("models", "model", "str"),
    ("policies", "policy", "str"),
    ("windows", "window", "int"),
    ("kv_dtypes", "kv_dtype", "str"),
    ("scenarios", "scenario", "scenario"),
    ("costs", "cost", "str"),
    ("tokens", "tokens", "int"),
    ("seed", "seed", "int"),
)
AXIS_SPEC = {a: s for a, s, _ in AXES}
# other grid-file keys: the targets, how to run, and fixed spec keys for every point
OPTION_KEYS = ("target_ms_per_token", "target_kv_bytes", "workers", "scheduler", "cache", "out", "spec")
GRID_KEYS = tuple(a for a, _, _ in AXES) + OPTION_KEYS
NO_WINDOW_POLICIES = ("full",)  # a window means nothing to these: one point, not one per window
MAX_WINDOW = options.WINDOW_MAX  # every command's bound on --window


def _split(value):
    # a CLI comma list, a grid file's list, or one value -> list of stripped strings/values
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        return [v.strip() for v in value.split(",")]
    return [value]


def _parse_axis(axis, kind, raw):
    # the values of one axis; one-line UserError for an empty item or a bad number
    vals = _split(raw)
    if vals is None:
        return None
    if not vals:
        raise UserError("--%s needs at least one value" % axis.replace("_", "-"), 2)
    out = []
    for v in vals:
        if isinstance(v, str) and v == "":
            raise UserError("--%s has an empty item in %r" % (axis.replace("_", "-"), raw), 2)
        if kind == "int":
            v = options.whole(v, "--" + axis.replace("_", "-"))
        elif kind == "scenario":
            if v is None or (isinstance(v, str) and v.lower() == "none"):
                v = None  # decode alone
            elif not isinstance(v, str):
                raise UserError("--scenarios wants names or paths, got %r" % (v,), 2)
        elif not isinstance(v, str):
            raise UserError("--%s wants names, got %r" % (axis.replace("_", "-"), v), 2)
        if v not in out:
            out.append(v)
    return out


def number(name, v, lo=0.0):
    # a target: None when not given, else a number above lo (an int when whole)
    if v is None or v == "":
        return None
    x = options.number(v, "--" + name.replace("_", "-"), lo, None, open_lo=True)
    return int(x) if x == int(x) else x


def load_grid_file(path):
    # the grid file: a JSON object with the keys of GRID_KEYS (lists or single values)
    p = paths.user_path(path)
    if os.path.exists(p) and not os.path.isdir(p):
        paths.regular_file(p, "grid file")  # a FIFO blocked the read forever
    try:
        with open(p, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a path through a file
        raise UserError("no grid file %s" % path, 2)
    except IsADirectoryError:
        raise UserError("grid file %s is a folder" % path, 2)
    except (UnicodeDecodeError, ValueError) as e:
        raise UserError("grid file %s is not JSON: %s" % (path, str(e).splitlines()[0]), 2)
    if not isinstance(data, dict):
        raise UserError("grid file %s must hold a JSON object (keys: %s)" % (path, ", ".join(GRID_KEYS)), 2)
    bad = sorted(k for k in data if k not in GRID_KEYS and not k.startswith("_"))
    if bad:
        raise UserError("grid file %s: unknown key %s (known: %s; keys starting with _ are comments)"
                        % (path, ", ".join(bad), ", ".join(GRID_KEYS)), 2)
    for k in ("cache", "out"):
        if isinstance(data.get(k), str):  # relative to the grid file
            data[k] = os.path.normpath(os.path.join(os.path.dirname(p), data[k]))
    return {k: v for k, v in data.items() if not k.startswith("_")}


def merge(grid=None, **cli):
    # the grid file's settings with the command line's on top (None: not given)
    out = dict(load_grid_file(grid)) if grid else {}
    for k, v in cli.items():
        if k not in GRID_KEYS:
            raise TypeError("unknown sweep option %s" % k)
        if v is not None:
            out[k] = v
    return out


def emulator():
    try:
        from host import emulate
    except ImportError as e:  # the emulator is part of the project; say what is missing
        raise UserError("the emulator (host/emulate.py) cannot be imported: %s" % e, 1)
    return emulate


def _label(v):
    return "-" if v is None else str(v)


def _min_window(norm):
    # the fewest tokens the point's policy keeps (firmware_py/kvlayout.py); 0 for policy full
    if norm.get("policy") in NO_WINDOW_POLICIES:
        return 0
    from firmware_py import kvlayout

    try:
        return kvlayout.min_budget(norm["policy"], norm.get("sinks", kvlayout.SINKS))
    except Exception:  # noqa: BLE001 - an unknown policy: normalize's and the decode's to refuse
        return 0


def expand(settings):
    # the grid's points: ([point], {reason: skipped count}). A point: {"axes": {spec key:
    # value as given}, "spec": the spec given to emulate, "norm": emulate.normalize(spec)}.
    # A combination the emulator refuses (normalize: e.g. a cost kind one board has no
    # figures for) and the second and later copies of one point (a window for policy
    # full) are skipped and counted, not a failure; a value that no combination accepts
    # (an unknown board, a missing model, a misspelt policy) is a one-line UserError
    # naming the option and the emulator's reason.
    emulate = emulator()
    fixed = settings.get("spec") or {}
    if not isinstance(fixed, dict):
        raise UserError("the grid's \"spec\" must be an object of emulate spec keys (%s)" % ", ".join(sorted(emulate.DEFAULTS)), 2)
    for k in fixed:
        if k not in emulate.DEFAULTS:
            raise UserError("the grid's \"spec\" has an unknown key %r (emulate spec keys: %s)" % (k, ", ".join(sorted(emulate.DEFAULTS))), 2)
    axes = []
    for axis, key, kind in AXES:
        vals = _parse_axis(axis, kind, settings.get(axis))
        if vals is not None:
            axes.append((axis, key, vals))
        if axis == "windows" and vals:
            # checked here, not only by the points: policy full drops its windows, and a
            # bad one must still be an error (emulate --window refuses it too)
            for v in vals:
                if not 1 <= v <= MAX_WINDOW:
                    raise UserError("--windows wants windows of 1..%d tokens (policy full runs without one), got %d"
                                    % (MAX_WINDOW, v), 2)
    keys = [k for _, k, _ in axes]
    points, skipped, seen = [], {}, set()
    used = {}  # (axis, value) -> points it takes part in (copies count)
    first_why = {}  # (axis, value) -> the first reason normalize gave for a point with it
    for combo in itertools.product(*[vals for _, _, vals in axes]):
        given = dict(zip(keys, combo, strict=True))
        spec = dict(fixed)
        spec.update(given)
        reason = None
        policy = spec.get("policy", emulate.DEFAULTS.get("policy"))
        if policy in NO_WINDOW_POLICIES and spec.get("window") is not None:
            spec.pop("window")
            given["window"] = None
            reason = "a window for policy %s (it runs once, without one)" % policy
        if spec.get("policy") is not None and spec["policy"] not in emulate.SINK_POLICIES:
            spec.pop("sinks", None)  # the grid's sinks are for its sinks and h2o points
        tags = [(a, v) for (a, _, _), v in zip(axes, combo, strict=True)]
        try:
            norm = emulate.normalize(spec)
        except UserError as e:
            why = (str(e).splitlines() or ["refused"])[0]
            skipped[why] = skipped.get(why, 0) + 1
            for t in tags:
                first_why.setdefault(t, why)
            continue
        low = _min_window(norm)
        if low and norm.get("window", 0) < low:
            # what the decode would refuse at run time, refused here: a skip (another
            # window or policy may take it), an error when no combination does
            why = "policy %s needs a window of at least %d token%s, got %s" % (
                norm["policy"], low, "" if low == 1 else "s", norm.get("window"))
            skipped[why] = skipped.get(why, 0) + 1
            for t in tags:
                first_why.setdefault(t, why)
            continue
        for t in tags:
            used[t] = used.get(t, 0) + 1
        canon = canonical(norm)
        if canon in seen:
            why = reason or "the same point as another combination"
            skipped[why] = skipped.get(why, 0) + 1
            continue
        seen.add(canon)
        points.append({"axes": given, "spec": spec, "norm": norm})
    # a value no combination accepts is a mistake, not a skip: blame the one that fails on
    # its own (with the other keys at their defaults), else the first
    dead = [(axis, key, v) for axis, key, vals in axes for v in vals if not used.get((axis, v))]
    for axis, key, v in dead:
        alone = dict(fixed)
        alone[key] = v
        if key == "window":
            alone["policy"] = "window"
        try:
            emulate.normalize(alone)
        except UserError as e:
            raise UserError("--%s %s: %s" % (axis.replace("_", "-"), _label(v), (str(e).splitlines() or ["refused"])[0]), 2)
    if dead:
        axis, _, v = dead[0]
        raise UserError("--%s %s: %s" % (axis.replace("_", "-"), _label(v), first_why.get((axis, v), "refused")), 2)
    return points, dict(sorted(skipped.items()))

def canonical(obj):
    # the one byte form of a spec for hashing: sorted keys, no spaces, UTF-8
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
