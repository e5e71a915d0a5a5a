# The ./kv (or installed kvrtos) program now running, for a task that prints its own
# help: tasks.py reads it here, host/cli.py sets it. A module of its own so that tasks.py
# and host/cli.py import one way (cli -> tasks -> running), and so that it is one module
# whether host/cli.py runs as __main__ (./kv) or is imported (kvrtos)
from invoke import Exit

USAGE_EXIT = 2  # bad input, as docs/getting-started.md promises
PROGRAM = None  # the KvProgram now running, or None (a task called from elsewhere)


def print_task_help(name):
    # TASK --help of the running program (the one whose parser holds the task's flags);
    # one line and exit 2 when no program runs
    prog = PROGRAM
    parser = getattr(prog, "parser", None)
    if parser is None or name not in parser.contexts:
        raise Exit("kv %s: no running ./kv program to print its help: run ./kv %s --help" % (name, name), code=USAGE_EXIT)
    prog.print_task_help(name)
