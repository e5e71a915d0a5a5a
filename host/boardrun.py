# `kv generate --runtime board`: generation on the (virtual or real) board over its
# serial port. The host enters the raw REPL (host/link.connect: mpremote's transport,
# every read under a deadline), checks that the board holds the firmware and the
# model asked for (sha256 of model.bin and tokenizer.bin against the local files: a
# board without them is refused in one line naming the `kv flash --model` command),
# then runs firmware_py.decode.run over the raw REPL and copies the board's output
# here as it arrives: the text token by token, then the same summary line as the
# other runtimes (decode.run prints it on the board).
import os
import sys

from firmware_py import decode
from host import link, paths
from host.errors import UserError

SILENCE_S = 60.0  # s the board may stay silent: its boot (weights, tokenizer) and one token
CONNECT_S = link.CONNECT_S  # s for each try at the raw REPL (link.connect_twice)
_ERR = "DecodeError: "  # the board's one-line mistake, last line of its traceback


# the Python the board runs: decode.run over model.bin / tokenizer.bin with the options
def command(prompt, n, opts):
    args = ", ".join("%s=%r" % (k, opts[k]) for k in sorted(opts))
    # the raw REPL's soft reset skipped main.py: its import-time GC threshold first, so the
    # decode's modules land packed (firmware_py/serve.py says why); the boot ends it
    return ("import gc\ngc.threshold(%d)\nfrom firmware_py import decode\n"
            "decode.run(%r, %r, %r, %d, %s)\n" % (decode.BOOT_GC_BYTES, decode.MODEL_FILE, decode.TOKENIZER_FILE, prompt, n, args))


# run generation on the board at port with the local model files (mp, tp) and the
# decode options; the board's output is written to out (bytes) as it comes
def run(port, mp, tp, prompt, n, opts, out=None, silence_s=SILENCE_S, board_name=paths.DEFAULT_BOARD):
    from mpremote.transport import TransportError

    import serial

    dst = out or sys.stdout.buffer
    port = link.port_of(port, board_name)
    t = link.connect_twice(port, CONNECT_S)
    try:
        have = link.device_hashes(t, ["firmware_py/decode.mpy", decode.MODEL_FILE, decode.TOKENIZER_FILE])
        if have[0] is None:
            raise UserError("the board on %s has no kvrtos firmware: run ./kv flash --model %s first" % (port, _shown(mp)), 2)
        model_differs, tok_differs = have[1] != paths.sha256_file(mp), have[2] != paths.sha256_file(tp)
        if model_differs and have[1] is not None:  # flash --model put an fp32 file there as its q8row copy
            from firmware_py import llama2c  # noqa: PLC0415
            from host import convert  # noqa: PLC0415

            try:
                if not llama2c.plan(mp)[1].q8_len:
                    model_differs = have[1] != paths.sha256_file(convert.cached_q8row(mp)[0])
            except (llama2c.CheckpointError, OSError):
                pass
        if model_differs or tok_differs:
            fix = "./kv flash --port %s --model %s" % (port, _shown(mp))
            if tok_differs:
                fix += " --tokenizer %s" % _shown(tp)
            if have[1] is None:
                what = "no model, not %s" % os.path.basename(mp)
            elif model_differs:  # both are model.bin on the board: name the local file asked for
                what = "another model, not %s (--model)" % _shown(mp)
            elif have[2] is None:
                what = "no tokenizer, not %s" % _shown(tp)
            else:
                what = "another tokenizer, not %s (its model matches)" % _shown(tp)
            raise UserError("the board on %s has %s: run %s first" % (port, what, fix), 2)

        def consume(b):
            b = b.replace(b"\x04", b"")  # the raw REPL's end-of-output marker comes through here too
            if b:
                dst.write(b)
                dst.flush()

        _, err = t.exec_raw(command(prompt, n, opts), timeout=None, data_consumer=consume)
    except (TransportError, serial.SerialException, OSError) as e:
        link.close(t)
        if isinstance(e, link.BoardSilent):
            raise UserError("the board on %s sent nothing for %g s while generating" % (port, silence_s)) from None
        raise UserError("port %s vanished or stopped answering while generating [%s]" % (port, type(e).__name__)) from None
    except BaseException:
        link.close(t)
        raise
    link.close(t)
    err = err.decode("utf-8", "replace").strip()
    if err:
        last = err.splitlines()[-1]
        if last.startswith(_ERR):
            raise UserError("board: %s" % last[len(_ERR):], 2)
        raise UserError("the board failed while generating: %s" % last)


# a model path as the user would type it again (relative to the repository when inside it)
def _shown(mp):
    return os.path.relpath(mp, paths.ROOT) if mp.startswith(paths.ROOT + os.sep) else mp

