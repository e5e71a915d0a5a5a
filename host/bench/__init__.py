# Benchmarks: one module per subject (host/bench/<name>.py) with
# run(as_json: bool) -> dict that measures in one run and prints its figures.


import json


# what every bench module's run() ends with: r as one JSON object (--json) or as the
# lines render(r) makes; returns r
def emit(r, as_json, render):
    if as_json:
        print(json.dumps(r, sort_keys=True))
    else:
        for line in render(r):
            print(line)
    return r


# options of `./kv bench` that only some benchmarks take: name -> [(flag, what)]
OWN_OPTIONS = {
    "quality": [("--model=PATH", "a llama2.c checkpoint (default stories260K, else models/kvrtos-tiny)"),
                ("--tokenizer=PATH", "the tokenizer (default: beside the model)"),
                ("--prompt=TEXT", "a prompt (repeat the option for several)")],
    "model": [("--c-ref=PATH", "a C decoder to time side by side (llama2.c's run.c built with -O3; default $KVRTOS_C_REF)")],
}


def names():
    # the benchmarks: host/bench/<name>.py, helpers (a leading _) left out
    import pkgutil

    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def describe(name):
    # `./kv bench NAME --help`: what NAME measures (its module's opening comment) and the
    # options it takes; None for no such benchmark
    import os

    if name not in names():
        return None
    path = os.path.join(os.path.dirname(__file__), name + ".py")
    about = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                break
            about.append(line[1:].strip())
    opts = [("--json", "print one JSON object (the figures docs/benchmarks.md is made from)")] + OWN_OPTIONS.get(name, [])
    width = max(len(o) for o, _ in opts)
    lines = ["Usage: ./kv bench %s [--json]%s" % (name, "".join(" [%s]" % o for o, _ in opts[1:])), ""]
    lines += ["  " + a for a in about] + ["", "Options:"] + ["  %-*s  %s" % (width, o, w) for o, w in opts]
    return "\n".join(lines)
