# package.json for MicroPython's mip: every module the firmware needs on a board
# (firmware_py/*.py and its packages, not the board-side probes in firmware_py/tools/),
# with urls relative to the package.json, so both of these work:
#   mpremote mip install github:OWNER/kvrtos            (the repository's package.json)
#   mpremote mip install path/to/kvrtos/package.json    (a local checkout)
# mip puts the files under the board's lib/ (or --target DIR): firmware_py/... there.
# `python -m host.mip` rewrites package.json from the tree; tests/test_packaging.py
# fails when the committed one is out of date.
import json
import os
import sys

from host import paths

PACKAGE_JSON = os.path.join(paths.ROOT, "package.json")
SKIP_DIRS = ("tools", "__pycache__")  # board-side probes and benchmarks: flashed only when asked


def modules(src=paths.FIRMWARE):
    # the firmware's .py files, relative to the repository root, sorted ("firmware_py/app.py", ...)
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for fn in filenames:
            if fn.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, fn), os.path.dirname(src)).replace(os.sep, "/"))
    return sorted(out)


def package(version=None):
    # the package.json dict: {"urls": [[dest, url], ...], "deps": [], "version": ...}
    if version is None:
        from firmware_py import VERSION

        version = VERSION
    return {"urls": [[m, m] for m in modules()], "deps": [], "version": version}


def text():
    # package.json's exact text (2-space indent, one url pair per line, trailing newline)
    p = package()
    pairs = ",\n".join("    %s" % json.dumps(u) for u in p["urls"])
    return '{\n  "urls": [\n%s\n  ],\n  "deps": [],\n  "version": %s\n}\n' % (pairs, json.dumps(p["version"]))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not paths.CHECKOUT:
        # package.json belongs to the repository; an installed package has none to check or write
        print("python -m host.mip: needs a checkout of the repository (package.json is written there)", file=sys.stderr)
        return 2
    t = text()
    if argv == ["--check"]:
        with open(PACKAGE_JSON) as f:
            ok = f.read() == t
        print("package.json is %s" % ("up to date" if ok else "out of date: run python -m host.mip"))
        return 0 if ok else 1
    with open(PACKAGE_JSON, "w") as f:
        f.write(t)
    print("wrote %s (%d modules)" % (os.path.relpath(PACKAGE_JSON, paths.ROOT), len(json.loads(t)["urls"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
