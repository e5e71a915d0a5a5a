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
