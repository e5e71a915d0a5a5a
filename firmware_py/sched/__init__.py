# The cooperative kernel: FreeRTOS cooperative-mode semantics over generators.
#   - the highest-priority ready task runs; equal priorities run round-robin;
#   - a switch happens only when the running task yields or blocks.
# A task is a generator. It yields to give up the CPU; a blocking call is written
# `x = yield k.sleep_us(500)` / `item = yield q.get(1000)`: the call only records what the
# task waits for and returns BLOCK, the yield hands that to the kernel, and the kernel
# resumes the generator with the result (the item, OK, the bits, or TIMEOUT). When a call
# can complete at once the task continues without a switch. A blocking call that is not
# yielded is detected (next kernel call, or the slice's end) and fails the task with a
# SchedError naming it.
#
# No allocation on the hot path (switch, sleep/wake, queue put/get, semaphore take/give,
# mutex lock/unlock, notify, event set/wait, the interrupt ring): tasks sit on intrusive
# doubly linked lists (links live in the Task objects), stats live in one array('i') row
# per task slot, time is integer ticks through the clock object.
#
# One idea per file, as MicroPython's extmod/asyncio:
#   task.py    Task, TaskList (intrusive lists), states, BLOCK/TIMEOUT, SchedError
#   core.py    Kernel: spawn, the run loop, kill/join, sleep
#   timers.py  the timer list (sorted, intrusive) and its expiry
#   prio.py    priority inheritance for Mutex
#   watchdog.py hang detection: the clock's charge(), a board timer, slice ends
#   sync.py    Queue, Semaphore, Mutex (priority inheritance), EventFlags
#   notify.py  task notifications (bits and counting) and the deferred interrupt ring
#   stats.py   stats rows, totals, snapshot, the Zephyr-style lines
from firmware_py.compat import ticks_add, ticks_diff  # noqa: F401 - re-exported for tasks
from firmware_py.status import OK, E_FULL, E_RANGE, E_STALE, E_STATE, MAX_WAIT_US  # noqa: F401
from firmware_py.sched.task import (  # noqa: F401
    READY, RUNNING, RESUME, BLOCKED, DONE, FAILED, KILLED, STATE_NAMES, FOREVER, TIMEOUT, BLOCK,
    SchedError, WatchdogError, Task, TaskList,
)
from firmware_py.sched.stats import (  # noqa: F401
    S_RUNS, S_RUNS_G, S_RUN_US, S_RUN_S, S_MAX_SLICE, S_MAX_LAT, S_MISSES, S_FAULTS, S_OVERRUNS, S_STATE,
    S_PRIO, NSTAT, T_SWITCHES, T_SWITCHES_G, T_IDLE_US, T_IDLE_S, T_BUSY_US, T_BUSY_S, T_FAULTS,
    T_OVERRUNS, T_MISSES, T_TASKS, T_BITES, T_ISR_DROPPED, T_ISR_REFUSED, NTOT,
)
from firmware_py.sched.core import Kernel  # noqa: F401
from firmware_py.sched.sync import Queue, Semaphore, Mutex, EventFlags  # noqa: F401
