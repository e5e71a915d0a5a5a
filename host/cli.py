# The front door's parser: invoke's Program (tasks.py's tasks, `./kv --list`,
# `./kv TASK --help`) with its own command-line mistakes said as every task says
# a user's mistake: one line, `kv TASK: message` (`kv: message` before a task), exit 2.
# One task per command line: `./kv budget test` would otherwise run budget and then
# the whole suite; several in a row need `./kv --chain A B`.
import re
import sys

from invoke import Argument, Exit, ParseError, Program

USAGE_EXIT = 2  # bad input, as docs/getting-started.md promises


class KvProgram(Program):
    # invoke's Program with one-line, exit-2 parse errors and one task per command line
    def core_args(self):
        return super().core_args() + [
            Argument(names=("chain",), kind=bool, default=False, help="Run several tasks given on one command line, in order."),
        ]

    # invoke's own core-flag parse, its mistakes as one `kv:` line
    def parse_core(self, argv):
        try:
            super().parse_core(argv)
        except ParseError as e:
            raise Exit(explain(e, self.argv), code=USAGE_EXIT) from None

    # the task and its flags; a mistake is one `kv TASK:` line; two tasks need --chain
    def parse_tasks(self):
        try:
            super().parse_tasks()
        except ParseError as e:
            raise Exit(explain(e, self.argv, chain=self.args.chain.value), code=USAGE_EXIT) from None
        if len(self.tasks) > 1 and not self.args.chain.value:
            names = [t.name for t in self.tasks]
            raise Exit("kv: one task per command line, got %s; run them one at a time, or ./kv --chain %s"
                       % (", ".join(names), " ".join(names)), code=USAGE_EXIT)

    # `./kv --chain` alone: nothing to chain is a mistake, not a request for help
    def no_tasks_given(self):
        if self.args.chain.value:
            raise Exit("kv: --chain needs the tasks to run, in order (e.g. ./kv --chain lint test; ./kv --list shows them)",
                       code=USAGE_EXIT)
        super().no_tasks_given()

    # `--help NOSUCH` is a parse error raised after parsing: same one line
    def parse_cleanup(self):
        try:
            super().parse_cleanup()
        except ParseError as e:
            raise Exit(explain(e, self.argv), code=USAGE_EXIT) from None


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


program = KvProgram(name="kv", binary="./kv", binary_names=["kv"], version="0.1.0")


def main(argv=None):
    # ./kv's entry: run the program on argv (default sys.argv); output into a closed
    # pipe (`./kv --list | head`) ends quietly, as other command-line tools do
    try:
        program.run(argv)
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
