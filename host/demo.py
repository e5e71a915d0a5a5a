# `kv demo`: the main job on the virtual board. Starts one (unless one is already
# running for the board), flashes the firmware through mpremote, then shows the
# board's output until the firmware's boot report ends.
from firmware_py.app import REPORT_END
from host import boards, flash, monitor, vboard
from host.errors import UserError


def run(board_name, out=print, timeout=60.0):
    # returns the flash summary; raises UserError when the boot report never ends
    b = boards.load(board_name)
    if b.kind != "mcu":
        raise UserError("board %s is a %s: the demo runs on a microcontroller profile" % (b.name, b.kind), 2)
    port = vboard.running_port(b.name)
    handle = None
    if port is None:
        handle = vboard.start(b.name)
        port = handle.port
        out("demo: virtual %s up on %s (filesystem %s/fs)" % (b.name, port, handle.home))
    else:
        out("demo: using the virtual %s already running on %s" % (b.name, port))
    try:
        summary, ser = flash.flash(port=port, board_name=b.name, out=out, keep_open=True)
        m = monitor.Monitor(port)
        try:
            end = m.run(until=REPORT_END, timeout=timeout, ser=ser)
        finally:
            ser.close()
            m.close()
        if end is None:
            raise UserError("the board's boot report did not end within %.0f s" % timeout)
        return summary
    finally:
        if handle is not None:
            handle.stop()
            out("demo: virtual board stopped")
