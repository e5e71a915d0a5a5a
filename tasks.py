# kvrtos tasks: the one front door (`./kv TASK` runs `invoke TASK`). Each task is
# thin and calls into host/; a user's mistake is one line and a non-zero exit.
import functools
import os
import sys

from invoke import Exit, task

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from host.errors import UserError  # noqa: E402


def one_line_errors(fn):
    # turn host.errors.UserError into "kv <task>: message" on stderr and its exit code
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            raise Exit("kv %s: %s" % (fn.__name__.replace("_", "-"), e), code=e.code)
        except KeyboardInterrupt:
            raise Exit("kv %s: interrupted" % fn.__name__.replace("_", "-"), code=130)

    return wrapper


@task
def test(c, k="", x=False):
    """Run the whole test suite: firmware under MicroPython and CPython, host tools, the virtual board."""
    args = ["-q", "-rs"]
    if k:
        args += ["-k", k]
    if x:
        args.append("-x")
    c.run("%s -m pytest %s" % (sys.executable, " ".join(args)), pty=False)


@task
def lint(c):
    """Ruff over the whole tree."""
    c.run("%s -m ruff check ." % sys.executable)


@task(help={"name": "what to measure: sched, kv, ...", "json": "print one JSON object"})
@one_line_errors
def bench(c, name, json=False):
    """Run a benchmark (host/bench/<name>.py) and print its figures; --json prints one object."""
    import importlib

    try:
        mod = importlib.import_module("host.bench." + name)
    except ModuleNotFoundError:
        import pkgutil

        import host.bench

        known = sorted(m.name for m in pkgutil.iter_modules(host.bench.__path__))
        raise UserError("no benchmark %r (known: %s)" % (name, ", ".join(known)), 2)
    mod.run(as_json=json)


@task(
    help={
        "board": "board profile name (boards/NAME.json)",
        "model": "catalog name (stories260K, Llama-3-8B, ...) or a llama2.c checkpoint path",
        "kv_dtype": "fp32, fp16, int8 or int4",
        "policy": "full, window, sinks or h2o",
        "window": "tokens kept by window/sinks/h2o policies",
        "json": "print one JSON object",
    }
)
@one_line_errors
def budget(c, board="esp32s3_n8r8", model="stories260K", kv_dtype="fp32", policy="full", window=0, json=False):
    """How many KV tokens fit on a board with a model, and the heap the firmware needs."""
    from host import budget as budget_mod

    budget_mod.main(board=board, model=model, kv_dtype=kv_dtype, policy=policy, window=window, as_json=json)
