# The front door's parser: invoke's Program (tasks.py's tasks, `./kv --list`,
# `./kv TASK --help`) with its own command-line mistakes said as every task says
# a user's mistake: one line, `kv TASK: message` (`kv: message` before a task), exit 2.
# One task per command line: `./kv budget test` would otherwise run budget and then
# the whole suite; several in a row need `./kv --chain A B`.
import re
import sys

from invoke import Argument, Exit, ParseError, Program

from firmware_py import VERSION
from host import running

USAGE_EXIT = running.USAGE_EXIT  # bad input, as docs/getting-started.md promises
CHECKOUT_ONLY = ("test", "lint", "bench-docs")  # tasks over the repository's tests/, sources and docs/


# tasks whose leading bare words fill these options in order (invoke's positional
# arguments are all required: `./kv snapshot list` takes none, `pull NAME FILE` two)
OPTIONAL_POSITIONALS = {"snapshot": ("action", "what", "file")}


def fill_positionals(argv):
    # argv with the bare words right after such a task's name turned into its options
    argv = list(argv)
    for i in range(1, len(argv)):
        if argv[i] in OPTIONAL_POSITIONALS and all(a.startswith("-") and "=" not in a or "=" in a for a in argv[1:i]) \
                and (i == 1 or argv[i - 1] not in ("-f", "--config", "-r", "--search-root", "-c", "--collection")):
            names = OPTIONAL_POSITIONALS[argv[i]]
            k = 0
            j = i + 1
            while j < len(argv) and k < len(names) and not argv[j].startswith("-"):
                argv[j] = "--%s=%s" % (names[k].replace("_", "-"), argv[j])
                j += 1
                k += 1
            break
    return argv


# invoke's core flags for its shell runner and config files: refused (a traceback each before)
INVOKE_ONLY = ("command-timeout", "config", "debug", "dry", "echo", "hide", "list-depth", "list-format",
               "prompt-for-sudo-password", "pty", "warn-only", "write-pyc")


class KvProgram(Program):
    # invoke's Program with one-line, exit-2 parse errors and one task per command line
    def run(self, argv=None, exit=True):
        running.PROGRAM = self
        argv = fill_positionals(sys.argv if argv is None else argv)
        if bench_help(argv):
            return None
        return super().run(argv, exit)

    def core_args(self):
        return super().core_args() + [
            Argument(names=("chain",), kind=bool, default=False, help="Run several tasks given on one command line, in order."),
        ]

    # invoke's own core-flag parse, its mistakes as one `kv:` line; invoke's flags for running
    # shell commands and loading its own config (which ./kv's tasks do not use) refused
    def parse_core(self, argv):
        short = {"-" + a.names[1]: a.names[0] for a in super().core_args() if len(a.names) > 1}
        for tok in argv[1:]:
            if not tok.startswith("-"):
                break  # the task's name: its own flags follow
            name = short.get(tok[:2], tok[2:].split("=")[0]) if not tok.startswith("--") else tok[2:].split("=")[0]
            if name in INVOKE_ONLY:
                raise Exit("kv: %s is invoke's own option, which kvrtos's tasks do not take (./kv --list shows the "
                           "tasks, ./kv TASK --help their options)" % tok.split("=")[0], code=USAGE_EXIT)
        try:
            super().parse_core(argv)
        except ParseError as e:
            raise Exit(explain(e, self.argv), code=USAGE_EXIT) from None

    # the task and its flags; a mistake is one `kv TASK:` line; two tasks need --chain
    def parse_tasks(self):
        parser = self._make_parser()
        msg = check_flags(parser, self.core.unparsed)
        if msg:
            raise Exit(msg, code=USAGE_EXIT)
        self._kv_parser = parser  # invoke's parse uses this one: building another loses the tasks' help
        try:
            super().parse_tasks()
        except ParseError as e:
            raise Exit(explain(e, self.argv, chain=self.args.chain.value), code=USAGE_EXIT) from None
        if len(self.tasks) > 1 and not self.args.chain.value:
            names = [t.name for t in self.tasks]
            raise Exit("kv: one task per command line, got %s; run them one at a time, or ./kv --chain %s"
                       % (", ".join(names), " ".join(names)), code=USAGE_EXIT)

    # the task parser; the one parse_tasks checked, once (invoke's Task.get_arguments pops
    # each option's help as it builds a context, so a second build would have none)
    def _make_parser(self):
        parser = self.__dict__.pop("_kv_parser", None)
        return parser if parser is not None else super()._make_parser()

    # `./kv --chain` alone: nothing to chain is a mistake, not a request for help
    def no_tasks_given(self):
        if self.args.chain.value:
            raise Exit("kv: --chain needs the tasks to run, in order (e.g. ./kv --chain lint test; ./kv --list shows them)",
                       code=USAGE_EXIT)
        self.list_tasks()  # ./kv alone: what there is to run, not invoke's core flags

    # `--help NOSUCH` is a parse error raised after parsing: same one line
    def parse_cleanup(self):
        try:
            super().parse_cleanup()
        except ParseError as e:
            raise Exit(explain(e, self.argv), code=USAGE_EXIT) from None


def bench_help(argv):
    # `./kv bench NAME --help` (or -h): that benchmark's own help (what it measures, its
    # options), not the generic one; True when it was printed. No such name: one line, exit 2
    words = argv[1:]
    if len(words) < 3 or words[0] != "bench" or words[1].startswith("-") or not {"--help", "-h"} & set(words[2:]):
        return False
    from host import bench

    text = bench.describe(words[1])
    if text is None:
        print("kv bench: no benchmark %r (known: %s)" % (words[1], ", ".join(bench.names())), file=sys.stderr)
        raise SystemExit(USAGE_EXIT)
    print(text)
    return True


def needs_checkout(name, task, binary):
    # a task that only a checkout of the repository can run, as installed: the same name,
    # flags and help (functools.wraps: invoke reads the wrapped signature), its body one
    # line and exit 2
    import functools

    from invoke import Task

    @functools.wraps(task.body)
    def body(c, *args, **kwargs):
        raise Exit("%s %s: needs a checkout of the repository (git clone it, then ./kv %s there)"
                   % (binary, name, name), code=USAGE_EXIT)

    return Task(body, name=task.name, help=dict(task.help), iterable=task.iterable, positional=task.positional)


def check_flags(parser, argv):
    # what invoke lets by, walked the way its parser does (a context's flags first, then a
    # pending value, a positional, a task name): a flag given twice (invoke keeps the first
    # value, then calls the second "an unexpected argument") and a repeatable (list) flag
    # with no value (invoke runs its default) as one `kv TASK: ...` line; None when neither.
    # What it does not know (an unknown word or flag) is left to invoke's own error.
    ctx = None  # the current task's ParserContext
    seen = set()  # its flags given so far (Argument names)
    want = None  # the flag (Argument) waiting for its value
    posargs = 0  # its positional arguments still to come
    for tok in argv:
        if tok == "--":
            break
        name = tok.split("=", 1)[0] if tok.startswith("-") else None
        glued = False  # -t5: a short flag with its value in the same word
        if ctx is not None and name and name[:2] != "--" and len(name) > 2 and name[:2] in ctx.flags:
            name, glued = name[:2], ctx.flags[name[:2]].takes_value
            if not glued:  # -jq: several boolean short flags, left to invoke
                name = tok
        arg = None
        if ctx is not None and name is not None:
            # flags and inverse_flags are invoke Lexicons: aliases (-t) answer [] and `in`, not get()
            if name in ctx.flags:
                arg = ctx.flags[name]
            elif name in ctx.inverse_flags:
                arg = ctx.flags[ctx.inverse_flags[name]]
        if want is not None:
            if arg is None:  # the pending flag's value
                want = None
                continue
            if want.kind is list:
                return _needs_value(ctx, want)
            want = None  # invoke says "needs a value" itself
        if arg is not None:
            if arg.kind is not list:
                if arg.name in seen:
                    return "kv %s: %s given twice: give it once (./kv %s --help)" % (ctx.name, _flag(arg.name), ctx.name)
                seen.add(arg.name)
            if arg in ctx.positional_args:
                posargs -= 1
            if arg.takes_value and "=" not in tok and not glued:
                want = arg
            continue
        if ctx is not None and posargs > 0:
            posargs -= 1
            continue
        if ctx is not None and name is not None and name in parser.initial.flags:
            continue  # a core flag (--help) inside a task's flags
        if name is None and tok in parser.contexts:
            ctx = parser.contexts[tok]  # a task's name or alias
            seen = set()
            posargs = len(ctx.positional_args)
            continue
        return None  # unknown: invoke's error says it
    if want is not None and want.kind is list:
        return _needs_value(ctx, want)
    return None


def _needs_value(ctx, arg):
    return "kv %s: %s needs a value (./kv %s --help)" % (ctx.name, _flag(arg.name), ctx.name)


def _flag(name):
    # "--weights-bytes" for invoke's argument name "weights_bytes"
    return ("-" if len(name) == 1 else "--") + name.replace("_", "-")


# one line for an invoke ParseError; argv: the whole command line (to spot --flag=VALUE);
# chain: under --chain, where a bare word after a task names the next task
def explain(e, argv, chain=False):
    ctx = getattr(e, "context", None)
    task = getattr(ctx, "name", None)
    who = "kv %s" % task if task else "kv"
    helper = "./kv %s --help" % task if task else "./kv --list"
    msg = str(e)
    m = re.match(r"'(.+)' did not receive required positional arguments: (.+)$", msg)
    if m:
        wanted = " ".join(a.strip("' ").upper() for a in m.group(2).split(","))
        return "%s: missing %s (usage: ./kv %s %s; %s)" % (who, wanted, m.group(1), wanted, helper)
    m = re.match(r"Flag <Argument: ([\w-]+)", msg)
    if m and "needed value" in msg:
        return "%s: %s needs a value (%s)" % (who, _flag(m.group(1)), helper)
    if m and "doesn't take any value" in msg:
        return "%s: %s takes no value (%s)" % (who, _flag(m.group(1)), helper)
    m = re.match(r"No idea what '(.*)' is!$", msg)
    if m:
        word = m.group(1)
        if word.startswith("-"):
            return "%s: no option %s (%s)" % (who, word, helper)
        glued = [a for a in (argv or []) if a.startswith("-") and "=" in a and a.split("=", 1)[1] == word]
        if glued:
            return "%s: %s takes no value (got %s; %s)" % (who, glued[0].split("=", 1)[0], glued[0], helper)
        if task and not chain:
            return "%s: unexpected argument %r (%s)" % (who, word, helper)
        return "kv: no task %r (./kv --list shows them)" % word
    return "%s: %s" % (who, msg.rstrip("!"))


program = KvProgram(name="kv", binary="./kv", binary_names=["kv"], version=VERSION)


def main(argv=None):
    # ./kv's entry: run the program on argv (default sys.argv); output into a closed
    # pipe (`./kv --list | head`) ends quietly, as other command-line tools do
    try:
        program.run(argv)
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


def kvrtos(argv=None):
    # `kvrtos`, the command `pip install .` makes: the same tasks as ./kv, from the
    # installed tasks module (invoke's Program given the collection, not a tasks.py
    # looked for from the current folder). Paths the user types resolve against the
    # folder it runs in (no KVRTOS_CALLER_CWD: it does not cd like ./kv does).
    import os

    from invoke import Collection

    from host import paths

    os.environ.pop("KVRTOS_CALLER_CWD", None)
    from host import tasks

    ns = Collection.from_module(tasks)
    if not paths.CHECKOUT:
        # test, lint and bench-docs work on the repository (tests/, its sources, docs/),
        # which an installed package does not carry: one line, exit 2, the same names in --list
        for name in CHECKOUT_ONLY:
            if name in ns.tasks:
                ns.tasks[name] = needs_checkout(name, ns.tasks[name], "kvrtos")
    prog = KvProgram(name="kvrtos", binary="kvrtos", binary_names=["kvrtos"], version=VERSION,
                     namespace=ns)
    try:
        prog.run(argv)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
