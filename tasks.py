# invoke's task collection for a checkout (`./kv TASK` runs invoke TASK; a plain `invoke
# --list` here finds it too): the tasks themselves are host/tasks.py, which the installed
# `kvrtos` command loads as host.tasks (no top-level `tasks` module is installed).
import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from host.tasks import *  # noqa: E402,F401,F403 - every task, by its name
