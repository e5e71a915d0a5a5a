# Runs inside the virtual board's MicroPython (unix port) at every (re)start, like
# the firmware's start-up on a real board: boot.py, then main.py unless the
# restart came from the raw REPL, then the REPL (the interpreter runs with -i).
# cwd is the board's filesystem directory.
import sys

sys.path[:] = ["", ".frozen", "lib"]  # the ESP32 port's search path, relative to the fs dir


def _vboard_run(name):
    # exec a start-up file in __main__'s globals, as the board's pyexec_file does
    try:
        f = open(name)
    except OSError:
        return
    src = f.read()
    f.close()
    try:
        exec(src, globals())
    except SystemExit:
        # sys.exit() in main.py soft-resets a board; the unix port would drop to the
        # REPL instead, so end this interpreter and let the vboard relay restart it
        import os

        os.system("kill -TERM $PPID")
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
    except Exception as e:  # a crashing main.py leaves the board at the REPL
        sys.print_exception(e)  # pyright: ignore[reportAttributeAccessIssue]


_vboard_run("boot.py")
if "raw" not in sys.argv:
    _vboard_run("main.py")
del _vboard_run
