# `kv demo`: the main job on the virtual board. Starts one (unless one is already
# running for the board), flashes the firmware and the default model (models/kvrtos-tiny,
# committed, so a fresh clone works) through mpremote, shows the boot report, then
# decodes on the board's MicroPython over the raw REPL (host/boardrun.py): the text
# as it comes, the board's summary line, and one line of the demo's own at the end.
import time

from firmware_py.app import REPORT_END
from host import boardmodel, boardrun, boards, flash, monitor, vboard
from host.errors import UserError

PROMPT = "Once upon a time"  # kvrtos-tiny's stories begin so
TOKENS = 96  # new tokens: a few of kvrtos-tiny's sentences in well under a minute


def run(board_name, out=print, timeout=60.0, tokens=TOKENS, prompt=PROMPT, model="", dst=None):
    # returns the flash summary; raises UserError when the boot report never ends
    b = boards.load(board_name)
    if b.kind != "mcu":
        raise UserError("board %s is a %s: the demo runs on a microcontroller profile" % (b.name, b.kind), 2)
    mp, tp = boardmodel.resolve(model)
    port = vboard.running_port(b.name)
    handle = None
    if port is None:
        handle = vboard.start(b.name)
        port = handle.port
        out("demo: virtual %s up on %s (filesystem %s/fs)" % (b.name, port, handle.home))
    else:
        out("demo: using the virtual %s already running on %s" % (b.name, port))
    t0 = time.monotonic()
    try:
        summary, ser = flash.flash(port=port, board_name=b.name, out=out, keep_open=True, model=model)
        m = monitor.Monitor(port)
        try:
            end = m.run(until=REPORT_END, timeout=timeout, ser=ser)
        finally:
            ser.close()
            m.close()
        if end is None:
            raise UserError("the board's boot report did not end within %.0f s" % timeout)
        out("demo: decoding %d tokens on the board's MicroPython (greedy, KV fp32, policy full): %r" % (tokens, prompt))
        boardrun.run(port, mp, tp, prompt, tokens, {"kv_dtype": "fp32", "policy": "full", "backend": "auto"}, out=dst,
                     board_name=b.name)
        out("demo: done in %.1f s (flash, boot, decode on the virtual %s)" % (time.monotonic() - t0, b.name))
        return summary
    finally:
        if handle is not None:
            handle.stop()
            out("demo: virtual board stopped")
