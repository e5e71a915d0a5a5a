# A decode saved and resumed across processes and interpreters (tests/test_snapshot.py runs
# it under CPython and the 64- and 32-bit MicroPython):
#   snap_run.py MODE MODEL TOK FOLDER NAME N TEMPERATURE POLICY WINDOW KV_DTYPE [CUT]
#   whole:  a fresh Session decodes N tokens after the prompt; prints TOKENS ...
#   save:   the same, then saves the sequence as NAME; prints TOKENS ... and SAVED <bytes>
#   resume: a fresh Session resumes NAME and decodes N more; prints TOKENS ...
#   cut:    as save, but the save prints CUT and sleeps once CUT bytes are written (-2: its
#           last byte; the test kills the process there: a save cut short)
# A refusal prints REFUSED <its line> and exits 0.
import sys
import time

sys.path.insert(0, ".")
from firmware_py import decode, snapshot  # noqa: E402
from firmware_py.sched import Kernel  # noqa: E402

PROMPT = "Once upon a time"
mode, model, tok, folder, name = sys.argv[1:6]
n = int(sys.argv[6])
opts = {"temperature": float(sys.argv[7]), "seed": 11, "policy": sys.argv[8], "window": int(sys.argv[9]),
        "kv_dtype": sys.argv[10], "heap": 3000000}
cut = int(sys.argv[11]) if len(sys.argv) > 11 else -1


def run(s, ids, k):
    kern = Kernel(verbose=False)
    kern.spawn("d", 1, s.task(kern, ids, k, lambda b: None))
    kern.run()
    return [s.tokens[i] for i in range(s.n_new)]


def hook(nb, total):
    if 0 <= cut <= nb or (cut == -2 and nb == total):  # -2: the file's last byte (written, not yet renamed)
        print("CUT", nb)
        time.sleep(60)


s = decode.Session(model, tok, **opts)
try:
    if mode == "resume":
        snapshot.resume(s, name, folder)
        got = run(s, snapshot.continue_ids(s), n)
    else:
        got = run(s, s.encode(PROMPT), n)
    print("TOKENS", " ".join(str(t) for t in got))
    if mode in ("save", "cut"):
        info = snapshot.save(s, name, folder, hook=hook if mode == "cut" else None)
        print("SAVED", info["bytes"])
except snapshot.SnapshotError as e:
    print("REFUSED", e)
