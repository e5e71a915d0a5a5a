# kvrtos tasks: the one front door (`./kv TASK` runs `invoke TASK`; the checkout's
# tasks.py brings these in, the installed `kvrtos` command loads this module). Each task
# is thin and calls into host/; a user's mistake is one line and a non-zero exit.
import functools
import inspect
import os
import re
import sys

import invoke
from invoke import Exit

from host import options
from host.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout (or the install folder)


class KvTask(invoke.Task):
    # invoke's Task without the short flag "-" it picks for a name like top_p when the
    # letters before the dash are taken (shown as `--=STRING` in --help)
    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        opts["names"] = [n for n in opts["names"] if n != "-"]
        return opts


def task(*args, **kwargs):
    # invoke.task with KvTask; long flags only (invoke makes a short flag of each option's
    # first letter: -t was --tokens in budget, --tokenizer in emulate and --timeout in flash)
    kwargs.setdefault("klass", KvTask)
    kwargs.setdefault("auto_shortflags", False)
    return invoke.task(*args, **kwargs)


def one_line_errors(fn):
    # turn host.errors.UserError into "kv <task>: message" on stderr and its exit code
    positional = [p.name for p in list(inspect.signature(fn).parameters.values())[1:] if p.default is p.empty]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if any(a in ("-h", "--help") for a in list(args[1:]) + [kwargs.get(p) for p in positional]):
            # invoke hands a flag typed where a positional (bench NAME, trace LOG, boardtime
            # FILE) goes to the task as its value: the running program's help for the task
            from host import running

            running.print_task_help(fn.__name__.replace("_", "-"))
            return None
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            raise Exit("kv %s: %s" % (fn.__name__.replace("_", "-"), e), code=e.code)
        except KeyboardInterrupt:
            raise Exit("kv %s: interrupted" % fn.__name__.replace("_", "-"), code=130)

    return wrapper


@task(help={"k": "run only the tests whose names match this pytest -k expression (e.g. -k 'budget and not slow')",
            "x": "stop at the first failing test"})
def test(c, k="", x=False):
    """Run the whole test suite: firmware under MicroPython and CPython, host tools, the virtual board."""
    import shlex

    args = ["-q", "-rs"]
    if k:
        args += ["-k", k]
    if x:
        args.append("-x")
    c.run("%s -m pytest %s" % (shlex.quote(sys.executable), " ".join(shlex.quote(a) for a in args)), pty=False)


@task
def lint(c):
    """Ruff over the whole tree."""
    c.run("%s -m ruff check ." % sys.executable)


def _bench_names():
    from host import bench as bench_pkg  # noqa: PLC0415 - the benchmarks' package, at help time

    return bench_pkg.names()


@task(help={"name": "what to measure: %s (./kv bench NAME --help says what each measures)" % ", ".join(_bench_names()),
            "json": "print one JSON object",
            "model": "bench quality: a llama2.c checkpoint (default stories260K, else models/kvrtos-tiny)",
            "tokenizer": "bench quality: the tokenizer (default: beside the model)",
            "prompt": "bench quality: a prompt; takes a value (--prompt TEXT), repeat the option for several",
            "c_ref": "bench model: a C decoder to time side by side (llama2.c's run.c built with -O3; default $KVRTOS_C_REF)"},
      iterable=["prompt"])
@one_line_errors
def bench(c, name, json=False, model=None, tokenizer=None, prompt=None, c_ref=None):
    """Run a benchmark (host/bench/<name>.py) and print its figures; --json prints one object."""
    import importlib

    try:
        if name.startswith("_"):
            raise ModuleNotFoundError(name)  # helper scripts, not benchmarks
        mod = importlib.import_module("host.bench." + name)
    except ModuleNotFoundError:
        raise UserError("no benchmark %r (known: %s)" % (name, ", ".join(_bench_names())), 2)
    for flag, v in (("--model", model), ("--tokenizer", tokenizer)):
        if v == "":
            raise UserError("%s needs a value (./kv bench quality --help)" % flag, 2)
    extra = {k: v for k, v in (("model", model), ("tokenizer_path", tokenizer), ("prompts", prompt)) if v}
    if extra and name != "quality":
        raise UserError("--model, --tokenizer and --prompt belong to bench quality", 2)
    if c_ref is not None:
        if name != "model":
            raise UserError("--c-ref belongs to bench model", 2)
        extra["c_ref"] = c_ref
    mod.run(as_json=json, **extra)


@task(help={"render": "only re-render docs/benchmarks.md from the committed docs/bench/*.json", "only": "run just this benchmark (the others keep their JSON)"})
@one_line_errors
def bench_docs(c, render=False, only=None):
    """Run every benchmark (host/bench/*.py), write docs/bench/<name>.json and regenerate docs/benchmarks.md from them."""
    from host import benchdoc

    if only == "":
        raise UserError("--only needs a benchmark name (known: %s)" % ", ".join(benchdoc.names()), 2)
    benchdoc.main(render_only=render, only=only or "")
    print("wrote %s" % os.path.relpath(benchdoc.DOC, ROOT))


@task(
    help={
        "board": "board profile name (boards/NAME.json)",
        "model": "catalog name (stories260K, Llama-3-8B, ...) or a llama2.c checkpoint path",
        "kv_dtype": "fp32, fp16, int8, int4 (KIVI) or int4tok (int4 per token)",
        "policy": "full, window, sinks or h2o",
        "window": "tokens kept by window/sinks/h2o policies",
        "batch": "concurrent sequences sharing the memory",
        "tokens": "also report the memory for this many tokens per sequence",
        "weights_dtype": "weights element type (default: the checkpoint's or the catalog's)",
        "weights_bytes": "weights size in bytes, overriding what the model implies",
        "word_bytes": "MCU heap figures for this word size: 4 the board (default), 8 the 64-bit unix port / virtual board",
        "sram_kv_bytes": "MCU: KV bytes of internal SRAM for the tiers' sram range, or max (default: what is left after ESP-IDF and MicroPython, an estimate)",
        "flash_kv_bytes": "MCU: KV bytes of a preallocated flash file (full policy, not int4), or max (default 0)",
        "context": "MCU: what runs beside the pool: serve (default: a flashed board serving, ./kv demo and monitor --start), "
                   "serve+tasks (with a config's tasks, ./kv flash --config), decode (decode.Session by itself)",
        "json": "print one JSON object",
    }
)
@one_line_errors
def budget(c, board="esp32s3_n8r8", model="stories260K", kv_dtype="fp32", policy="full", window="0", batch="1", tokens="0", weights_dtype=None, weights_bytes="0", json=False,
           word_bytes="0", sram_kv_bytes=None, flash_kv_bytes=None, context="serve"):
    """How many KV tokens fit on a board with a model, and the heap the firmware needs."""
    from host import budget as budget_mod
    from host import models

    # an empty value is a mistake, not the default (None: the option was left out)
    for flag, v in (("--model", model), ("--weights-dtype", weights_dtype)):
        if v == "":
            raise UserError("%s needs a value (./kv budget --help)" % flag, 2)
    if model.lower() not in (n.lower() for n in models.names()):
        model = paths_user(model)  # a checkpoint path, typed relative to where ./kv ran
    whole = options.whole  # ASCII digits only
    r = budget_mod.main(
        board=board, model=model, kv_dtype=kv_dtype, policy=policy, window=window,
        batch=whole(batch, "--batch", 1), tokens=whole(tokens, "--tokens", 0, options.TOKENS_MAX), weights_dtype=weights_dtype or "",
        weights_bytes=whole(weights_bytes, "--weights-bytes"), as_json=json, word_bytes=whole(word_bytes, "--word-bytes"),
        sram_kv_bytes=sram_kv_bytes, flash_kv_bytes=flash_kv_bytes, context=context,
    )
    if not r["fits"]:
        # the figures are on stdout; exit 3 says "does not fit" (2: bad input)
        raise UserError("does not fit: %s" % r["note"], budget_mod.EXIT_DOES_NOT_FIT)
    if r.get("fits_wanted") is False:  # --tokens T that the budget does not hold
        raise UserError("does not fit: %s" % budget_mod.wanted_note(r), budget_mod.EXIT_DOES_NOT_FIT)


@task(help={"model": "fp32 llama2.c checkpoint to read", "out": "int8 checkpoint to write",
            "format": "q8row (default; kvq8, a group size per matrix) or v2 (llama2.c ak42, one group size)",
            "group": "a whole number >= 1; leave it out for the format's default. v2: the group size (default: the largest dividing every row, up to 64); q8row: each matrix takes the divisor of its row nearest this (default 64)"})
@one_line_errors
def convert(c, model="", out="", format="q8row", group=None):
    """Write an int8 checkpoint from an fp32 one and print its size, bytes per weight and worst dequantization error."""
    from host import convert as convert_mod

    if not model or not out:
        raise UserError("--model IN.bin and --out OUT.bin are required", 2)
    g = 0  # 0: the format's default
    if group is not None:  # given, even empty ("needs a value")
        numeric = re.fullmatch(r"[+-]?[0-9]+", group) is not None
        g = int(group) if numeric else options.whole(group, "--group", 1)  # not a number: options' line
        if g < 1:
            raise UserError("--group must be >= 1, or leave it out for the format's default (got %d)" % g, 2)
    r = convert_mod.convert(paths_user(model), paths_user(out), format, g)
    print(convert_mod.report(r))


@task(help={"model": "llama2.c checkpoint path, or stories260K (../shared/models); default models/kvrtos-tiny",
            "prompt": "text to continue", "tokens": "new tokens to generate", "tokenizer": "tokenizer.bin (default: beside the model)",
            "temperature": "0 = greedy", "top_p": "nucleus mass kept, (0, 1]", "seed": "sampling seed (same seed, same tokens)",
            "kv_dtype": "auto (int8 beside int8 weights: the integer path; else fp32), fp32, fp16, int8, int4 (KIVI) or int4tok (int4 per token)", "policy": "full, window, sinks or h2o", "window": "tokens kept by window/sinks/h2o",
            "backend": "auto, numpy, plain or q8", "runtime": "cpython, micropython (the unix port, default board heap) or board",
            "rope": "absolute (keys at their own position) or cache (StreamingLLM: rank in the cache)",
            "port": "--runtime board: serial port (default: ESP32-S3 by USB VID, else the virtual board)"})
@one_line_errors
def generate(c, model=None, prompt="", tokens="64", tokenizer=None, temperature="0", top_p="1", seed="0", kv_dtype="auto",
             policy="full", window="0", backend="auto", runtime="cpython", rope="absolute", port=None):
    """Generate text with a llama2.c model as a kernel task: the text token by token, then one summary line."""
    from host import generate as gen

    not_empty(model=model, tokenizer=tokenizer, port=port)
    model, tokenizer = model or "", tokenizer or ""

    gen.main(model=model, prompt=prompt, tokens=tokens, tokenizer_path=tokenizer, temperature=temperature, top_p=top_p,
             seed=seed, kv_dtype=kv_dtype, policy=policy, window=window, backend=backend, runtime=runtime, rope=rope,
             port=port and paths_user(port))


def not_empty(required=(), **given):
    # a flag typed with an empty value is refused, not taken as "not given" (which ran the
    # default: another model, another port); None means not given. required: the task's
    # positionals (no default to leave them out for)
    for name, v in given.items():
        if v == "":
            raise UserError("--%s needs a value%s" % (name.replace("_", "-"), "" if name in required else
                                                        " (leave it out for its default)"), 2)


def paths_user(p):
    # a path the user typed, resolved against the folder they ran ./kv from
    from host import paths

    return paths.user_path(p)


@task(help={"port": "serial port (default: ESP32-S3 by USB VID, else the running virtual board)",
            "board": "board profile name (to find the port; default esp32s3_n8r8)"})
@one_line_errors
def repl(c, port=None, board="esp32s3_n8r8"):
    """Open the board's MicroPython REPL (mpremote's) on the port the other commands find; Ctrl-] leaves it."""
    from host import link

    not_empty(port=port)
    p = link.check_port(link.port_of(port and paths_user(port), board))
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError("./kv repl is interactive: run it in a terminal (to run code on the board without one: "
                        "mpremote connect %s exec '...', as .venv/bin/mpremote)" % p, 2)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "mpremote", "connect", p, "repl"])


@task(help={"board": "board profile name", "fs": "filesystem directory (default .vboard/NAME/fs)", "stop": "stop the one running for this board (e.g. started in the background by flash)"})
@one_line_errors
def vboard(c, board="esp32s3_n8r8", fs=None, stop=False):
    """Run a virtual board (MicroPython unix port on a pty) until Ctrl-C; prints its port."""
    from host import vboard as vb

    if fs == "":
        raise UserError("--fs needs a value: a folder (leave it out for .vboard/%s/fs)" % board, 2)
    code = vb.main(["--board", board] + (["--fs", paths_user(fs)] if fs else []) + (["--stop"] if stop else []), prog="kv vboard")
    if code:
        raise Exit(code=code)


@task(help={"port": "serial port (default: ESP32-S3 by USB VID, else the virtual board)", "board": "board profile name", "src": "firmware source directory (a copy of firmware_py/)",
            "timeout": "seconds the board may stay silent in any exchange (default 10)",
            "model": "also copy this llama2.c checkpoint (kvrtos-tiny: models/kvrtos-tiny/model.bin; stories260K: ../shared/models) as model.bin, refused first when it cannot fit",
            "tokenizer": "its tokenizer.bin (default: beside the model)",
            "weights": "int8 (default: an fp32 checkpoint goes on as int8 q8row, converted on the fly, the integer path's format, with int8 KV) or fp32 (the file as it is: the float path, bytecode on the board)",
            "config": "an application config (JSON, docs/user-guide.md) put on the board as kvrtos.json, with the modules of its module tasks (m.py beside it); checked first: a bad one is one line, nothing flashed"})
@one_line_errors
def flash(c, port=None, board="esp32s3_n8r8", src=None, timeout="10", model=None, tokenizer=None, config=None, weights=None):
    """Compile firmware_py/ with mpy-cross and copy what changed to the board (mpremote), verify, soft-reset; --model puts a model there too, --config an application config."""
    from host import flash as fl
    from host import paths

    if tokenizer and not model:
        raise UserError("--tokenizer needs --model (the tokenizer is flashed with its model)", 2)
    if config == "":
        raise UserError("--config needs a file (./kv flash --help)", 2)
    not_empty(model=model, src=src, port=port, tokenizer=tokenizer)  # it flashed without a model, or to the port found
    tokenizer = tokenizer or ""
    if weights is not None and not model:
        raise UserError("--weights needs --model (it says how the model goes on the board)", 2)
    weights = weights or "int8"
    if weights not in ("int8", "fp32"):
        raise UserError("--weights must be int8 (the integer path: an fp32 model is converted to q8row on the fly) "
                        "or fp32, got %r" % weights, 2)
    fl.flash(port=port and paths_user(port), board_name=board, src=paths_user(src) if src else paths.FIRMWARE,
             answer_timeout=options.seconds(timeout, "--timeout"), model=model, tokenizer=tokenizer,
             config=paths_user(config) if config else None, weights=weights)


@task(help={"bin": "MicroPython firmware image for the board's chip (.bin: ESP32_GENERIC_S3 for an S3, ESP32_GENERIC for a classic ESP32)",
            "port": "serial port", "board": "board profile name: its chip, flash offset and USB VID (default esp32s3_n8r8)",
            "erase": "erase the whole flash first", "dry_run": "print the esptool commands only (no board needed)"})
@one_line_errors
def flash_firmware(c, bin="", port=None, board="esp32s3_n8r8", erase=False, dry_run=False):
    """Write a MicroPython firmware image to the board's ESP32 with esptool (an S3 at 0x0, a classic ESP32 at 0x1000)."""
    from host import flash as fl

    if not bin:
        raise UserError("--bin FILE is required: the MicroPython .bin for the board's chip (micropython.org/download/ESP32_GENERIC_S3 "
                        "for an ESP32-S3)", 2)
    fl.flash_firmware(paths_user(bin), port=port and paths_user(port), erase=erase, board_name=board, dry_run=dry_run)


@task(help={"port": "serial port (default: ESP32-S3 by USB VID, else the virtual board)", "board": "board profile name (to find the port; default esp32s3_n8r8)",
            "log": "append every text line to this file", "until": "stop at the first text line matching this regex",
            "timeout": "stop after this many seconds", "jsonl": "append every telemetry frame to this JSONL file",
            "capture": "append every byte received to this raw capture file", "replay": "decode a recorded capture instead of a port",
            "json": "print a JSON summary at the end (good, corrupt, dropped, skipped frames)",
            "plain": "plain lines even on a terminal (no dashboard)", "start": "start the telemetry firmware (firmware_py.serve) over the raw REPL first",
            "prompt": "send this prompt (the board generates and streams the text)", "tokens": "tokens for --prompt (a whole number >= 1, default 64)",
            "policy": "KV policy for the next request", "window": "window for window/sinks/h2o", "kv_dtype": "KV element type for the next request",
            "stop": "send a stop command", "until_done": "return once this many requests have ended (serve goes on running on the board until Ctrl-C or the next flash / monitor --start / generate --runtime board)",
            "link_bps": "with --start: the link's bytes/s the board paces telemetry to (100..1000000; default 0: the firmware's)",
            "save": "save the conversation on the board as this KV snapshot (when the --prompt's request ends)",
            "resume": "resume this KV snapshot on the board: the --prompt goes on from it",
            "baud": "the port's bits/s (default: the board profile's console rate, 115200; a native USB port ignores it)"})
@one_line_errors
def monitor(c, port=None, board=None, log=None, until=None, timeout=None, jsonl=None, capture=None, replay=None,
            json=False, plain=False, start=False, prompt=None, tokens=None, policy=None, window=None, kv_dtype=None, stop=False,
            until_done="0", link_bps="0", save=None, resume=None, baud=None):
    """Serial console: text timestamped, telemetry frames decoded, log, reconnect; at a terminal keys go to the board (Ctrl-] leaves, Ctrl-T h: menu)."""
    from host import monitor as mon

    not_empty(port=port, log=log, jsonl=jsonl, capture=capture, replay=replay, until=until, save=save, resume=resume, baud=baud)
    mon.main(port=port and paths_user(port), board=board, log=log and paths_user(log), until=until,
             timeout=options.seconds(timeout, "--timeout") if timeout is not None else None, jsonl=jsonl and paths_user(jsonl),
             capture=capture and paths_user(capture), replay=replay and paths_user(replay), as_json=json, plain=plain,
             start=start, prompt=prompt, tokens=tokens, policy=policy, window=window, kv_dtype=kv_dtype, stop=stop,
             until_done=until_done, link_bps=link_bps, save=save, resume=resume, baud=baud)


@task(help={"action": "list, pull NAME FILE, push FILE, or rm NAME (the first word after snapshot)",
            "what": "pull/rm: the snapshot's NAME on the board; push: the FILE to copy to it",
            "file": "pull: the new file the snapshot is copied to", "name": "push: the name on the board (default: FILE's, less .kvs)",
            "port": "serial port (default: ESP32-S3 by USB VID, else the virtual board)", "board": "board profile name (to find the port)"})
@one_line_errors
def snapshot(c, action=None, what=None, file=None, name=None, port=None, board=None):
    """KV snapshots on a board: ./kv snapshot list | pull NAME FILE | push FILE [--name N] | rm NAME [--port P]; copies verified by sha256 and CRC."""
    from host import snapshots

    for v, what_is in ((what, "NAME" if action in ("pull", "rm") else "FILE"), (file, "FILE")):
        if v == "":
            raise UserError("./kv snapshot %s: %s is empty" % (action, what_is), 2)
    not_empty(action=action, name=name, port=port, board=board)
    if action is None:
        raise UserError("./kv snapshot needs an action: list, pull NAME FILE, push FILE or rm NAME (./kv snapshot --help)", 2)
    if action == "push":
        if file is not None:
            raise UserError("./kv snapshot push takes one FILE (the board's name for it: --name)", 2)
        snapshots.main("push", name=name, file=what and paths_user(what), port=port and paths_user(port), board=board)
        return
    if name is not None:
        raise UserError("--name is push's (pull and rm name the snapshot first: ./kv snapshot %s NAME ...)" % action, 2)
    if action == "pull" and file and file.endswith("/"):
        raise UserError("./kv snapshot pull: FILE %s names a folder: give the new file's name" % file, 2)
    if action == "rm" and file is not None:
        raise UserError("./kv snapshot rm takes one NAME, got %s and %s (one at a time)" % (what, file), 2)
    snapshots.main(action, name=what, file=file and paths_user(file), port=port and paths_user(port), board=board)


@task(help={"log": "the console's JSONL log (./kv monitor --jsonl)", "out": "folder for trace.json and the PNG plots (default: beside LOG)",
            "json": "print the figures as one JSON object"})
@one_line_errors
def trace(c, log, out=None, json=False):
    """Chrome trace JSON (Perfetto) and PNG plots from a telemetry JSONL log: KV bytes vs tokens with the fitted slope, pool, bandwidth."""
    from host import trace as trace_mod

    not_empty(("log",), log=log, out=out)

    trace_mod.main(paths_user(log), paths_user(out) if out else None, as_json=json)


@task(help={"board": "board profile name or path (default esp32s3_n8r8)",
            "model": "llama2.c checkpoint path, or stories260K (default: stories260K from ../shared/models when there, else models/kvrtos-tiny)",
            "tokenizer": "tokenizer.bin (default: beside the model)", "policy": "full, window, sinks or h2o",
            "window": "tokens kept by window/sinks/h2o",
            "kv_dtype": "auto (int8 beside int8 weights, else fp32), fp32, fp16, int8, int4 or int4tok",
            "weights": "int8 (default: an fp32 file runs as q8row, converted on the fly, as kv flash --model puts it) or fp32",
            "slice_us": "the longest the decode holds the CPU in one slice, us (default 2000; 0: unbounded)",
            "tokens": "new tokens to generate (default 64)", "scenario": "a scenario name (scenarios/) or a config file path",
            "seed": "sampling seed", "cost": "CPU cost kind: c, dsp, asm, viper, bytecode or none (default viper when the board has it)",
            "prompt": "prompt text", "sinks": "attention sinks of sinks/h2o", "temperature": "0 = greedy",
            "piece_bytes": "decode moves its traffic in pieces of this many bytes (0: a layer at a time)",
            "weights_tier": "auto, or the tier the weights are read from (e.g. flash)",
            "kv_tier": "auto (the heap's RAM tier), or the RAM tier the KV cache lives in (e.g. sram)",
            "kv_blocks": "a fixed KV pool of this many blocks instead of the budget rule (0: the rule)",
            "reserve": "heap bytes kept from the KV budget (-1: the MicroPython firmware's reserve; 0 or more: "
                       "e.g. a C firmware's)",
            "out": "folder for report.json, telemetry.jsonl, trace.json and the plots", "json": "print the report as one JSON object",
            "max_ms": "board-time limit of the run in ms (default 1800000 = 30 min, at most 36000000)",
            "speed": "the MicroPython cost at the fitted board-speed factor (fit, the default; the report adds both "
                     "ends of its band) or at one end of the band: slow or fast (docs/calibration.md)"},
      auto_shortflags=False)  # long flags only: an automatic -h (--weights) shadowed --help, -t was the tokenizer
@one_line_errors
def emulate(c, board=None, model=None, tokenizer=None, policy=None, window=None, kv_dtype=None, tokens=None, scenario=None,
            seed=None, cost=None, prompt=None, sinks=None, temperature=None, piece_bytes=None, weights_tier=None, out=None,
            json=False, max_ms=None, kv_tier=None, kv_blocks=None, reserve=None, weights=None, slice_us=None, speed=None):
    """Run the firmware on the host with a board's cost model: tok/s, latency, memory, bandwidth, deadlines (docs/emulator.md)."""
    from host import emulate as emu

    spec = emu.spec_from_options(board=board, model=model, tokenizer=tokenizer, policy=policy, window=window,
                                 kv_dtype=kv_dtype, tokens=tokens, scenario=scenario, seed=seed, cost=cost, prompt=prompt,
                                 sinks=sinks, temperature=temperature, piece_bytes=piece_bytes, weights_tier=weights_tier,
                                 max_ms=max_ms, kv_tier=kv_tier, kv_blocks=kv_blocks, reserve=reserve, weights=weights,
                                 slice_us=slice_us, speed=speed)
    if out == "":
        raise UserError("--out needs a folder", 2)
    emu.main(spec, out=paths_user(out) if out else None, as_json=json)


@task(help={"src": "MicroPython source tree (default: $KVRTOS_MICROPYTHON_SRC or ../shared/micropython-src)",
            "ref": "a tagged MicroPython version to build instead (v1.20.0, a commit), exported from --repo",
            "repo": "a git clone (or mirror) of micropython/micropython, for --ref"})
@one_line_errors
def mp32(c, src=None, ref=None, repo=None):
    """Build (once, cached in .cache/) the 32-bit MicroPython unix port, the board's word size; print its path."""
    from host import mp32 as mp32_mod

    if src == "":
        raise UserError("--src needs a value: a MicroPython source tree (leave it out for ../shared/micropython-src)", 2)
    if ref is not None or repo is not None:
        if src:
            raise UserError("give --src DIR or --ref TAG --repo DIR, not both (./kv mp32 --help)", 2)
        if ref == "" or repo == "":
            raise UserError("%s needs a value (./kv mp32 --help)" % ("--ref" if ref == "" else "--repo"), 2)
        if not ref or not repo:
            raise UserError("--ref and --repo go together: --ref v1.20.0 --repo DIR (a clone of micropython/micropython)", 2)
        src = mp32_mod.tree_at(paths_user(repo), ref)
        print(mp32_mod.build(src, cflags=mp32_mod.TAG_CFLAGS, say=_progress))
        return
    print(mp32_mod.build(paths_user(src) if src else None, say=_progress))


def _progress(line):
    # a progress line on stderr (stdout keeps the command's answer: a path, a JSON)
    print(line, file=sys.stderr, flush=True)


@task(help={"board": "board profile name (a microcontroller)",
            "tokens": "new tokens to decode (a whole number >= 1, default 96)",
            "out": "folder for the telemetry log, the trace, the plots and summary.json (default: a fresh out/demo-* folder)",
            "plain": "plain status lines instead of the live dashboard (the default when stdout is not a terminal)"})
@one_line_errors
def demo(c, board="esp32s3_n8r8", tokens="96", out=None, plain=False):
    """The main job: flash the virtual board with the firmware, kvrtos-tiny and an audio task; decode beside it under the live dashboard; summary, trace and plots."""
    from host import demo as demo_mod

    if out == "":
        raise UserError("--out needs a folder (./kv demo --help)", 2)
    demo_mod.run(board, tokens=options.whole(tokens, "--tokens", 1, options.TOKENS_MAX), out_dir=paths_user(out) if out else None, plain=plain)


@task(help={
    "grid": "a grid file (JSON object with the keys below, lists or single values); options given here override it",
    "boards": "board profiles, comma-separated (boards/NAME.json)",
    "models": "models, comma-separated (stories260K, a llama2.c checkpoint path, ...)",
    "policies": "KV policies: full, window, sinks, h2o",
    "windows": "windows for window/sinks/h2o (policy full runs once, without one)",
    "kv_dtypes": "KV element types: fp32, fp16, int8, int4, int4tok",
    "scenarios": "scenarios (scenarios/NAME.json or a path; none: decode alone)",
    "costs": "CPU cost kinds: c, dsp, asm, viper, bytecode",
    "tokens": "tokens per emulation (a comma list sweeps it too)",
    "seed": "seed(s)",
    "target_ms_per_token": "latency target: at most this many ms per token",
    "target_kv_bytes": "memory target: at most this many KV bytes",
    "workers": "worker processes on this machine (default: the CPU count)",
    "scheduler": "a Dask scheduler address (tcp://HOST:PORT): run the points on that cluster",
    "cache": "result cache folder (default .kvrtos-cache/sweep)",
    "out": "output folder (default sweeps/<timestamp>)",
    "json": "print the summary as one JSON object",
}, auto_shortflags=False)  # long flags only: an automatic -h would shadow --help
@one_line_errors
def sweep(c, grid=None, boards=None, models=None, policies=None, windows=None, kv_dtypes=None, scenarios=None,
          costs=None, tokens=None, seed=None, target_ms_per_token=None, target_kv_bytes=None, workers=None,
          scheduler=None, cache=None, out=None, json=False):
    """A grid of emulations (boards x models x policies x windows x KV types x scenarios x costs): cached, on a process pool or a Dask cluster; writes results.csv/.md/.png."""
    import shlex

    from host import sweep as sweep_mod

    given = dict(boards=boards, models=models, policies=policies, windows=windows, kv_dtypes=kv_dtypes,
                 scenarios=scenarios, costs=costs, tokens=tokens, seed=seed, target_ms_per_token=target_ms_per_token,
                 target_kv_bytes=target_kv_bytes, workers=workers, scheduler=scheduler, cache=cache, out=out)
    for k, v in given.items():
        if v == "":
            raise UserError("--%s needs a value (./kv sweep --help)" % k.replace("_", "-"), 2)
    if grid == "":
        raise UserError("--grid needs a grid file (./kv sweep --help)", 2)
    settings = sweep_mod.merge(paths_user(grid) if grid else None, **given)
    sweep_mod.main(settings, as_json=json, command="./kv " + shlex.join(sys.argv[1:]))


@task(help={"file": "a MicroPython source file (.py) holding the function to time",
            "call": "the function to time, called with no arguments (default main)",
            "board": "the board profile to predict for (default esp32s3_n8r8)",
            "freq": "the board's CPU clock in MHz (default: the profile's)",
            "emitter": "bytecode, native or viper (default: from the file's decorators)",
            "runs": "timed calls after one warm-up (default 7; the median is taken)",
            "timeout": "seconds the host run may take, warm-up and every timed call (default 600)",
            "json": "print one JSON object"})
@one_line_errors
def boardtime(c, file, call="main", board="esp32s3_n8r8", freq=None, emitter=None, runs="7", timeout=None, json=False):
    """Time a MicroPython function on the 32-bit host build and predict its time on the board, with the band (docs/calibration.md)."""
    from host import boardtime as bt

    not_empty(("file",), file=file, call=call, board=board, freq=freq, emitter=emitter, timeout=timeout)

    mhz = None if freq is None else options.number(freq, "--freq", 1.0, 10000.0)  # MHz
    bt.main(paths_user(file), call=call, board=board, mhz=mhz, emitter=emitter, runs=options.whole(runs, "--runs", 1, bt.RUNS_MAX),
            as_json=json, timeout=None if timeout is None else options.seconds(timeout, "--timeout"))


@task(help={"write": "rewrite the MicroPython cost figures of every board profile from docs/bench/boardspeed.json",
            "json": "print the factors as one JSON object"})
@one_line_errors
def boardspeed(c, write=False, json=False):
    """The board-speed factors per core and emitter, fitted to published board timings (docs/bench/boardspeed.json; ./kv bench-docs --only boardspeed remeasures it)."""
    from host import boardspeed as bs

    rec = bs.committed() if write else bs.factors()
    if write:
        done, kept = bs.write_profiles(rec)
        for p in done:
            print("boardspeed: wrote %s" % os.path.relpath(p, ROOT))
        for k in kept:
            print("boardspeed: kept %s (measured on a board)" % k)
        if not done:
            print("boardspeed: every profile is up to date with docs/bench/boardspeed.json")
        return
    bs.show(rec, as_json=json)


@task(help={"port": "the board's serial port (a virtual board's: ./kv vboard prints it)", "board": "the profile to start from (boards/NAME.json or a path; default esp32s3_n8r8)",
            "out": "write the calibrated profile here (default: calibrated/BOARD.json where ./kv ran)",
            "write": "replace boards/BOARD.json itself with the calibrated profile", "json": "print the measured figures as one JSON object",
            "timeout": "seconds the board may stay silent while probing (default 30)"})
@one_line_errors
def calibrate(c, port=None, board="esp32s3_n8r8", out=None, write=False, json=False, timeout="30"):
    """Run probes on a board (heap, copy speed, task switch, viper matvec) and write them into its profile, each marked measured with its date."""
    from host import calibrate as cal

    cal.main(port=port and paths_user(port), board=board, out=out, write=write, as_json=json, answer_s=options.seconds(timeout, "--timeout"))


@task(help={"write": "write the figures into firmware_py/heapmargin.py (the boot's margin and the calculator's footprints)",
            "json": "print every measurement as one JSON object",
            "workers": "probes in parallel, one process each (default 2)"},
      auto_shortflags=False)
@one_line_errors
def heapmargin(c, write=False, json=False, workers="2"):
    """Measure what the decoding firmware needs free after its boot (decode, telemetry, a config's tasks) and what its boot leaves, on the 32- and 64-bit MicroPython, int8 and fp32 paths (--write: into firmware_py/heapmargin.py)."""
    from host import heapmargin as hm

    hm.run(write, json, options.whole(workers, "--workers", 1))


@task(help={"seed": "the first run's seed (run i is drawn from seed + i alone: --seed K+i --runs 1 replays it; default 1)",
            "runs": "runs to draw (a whole number >= 1, default 8)",
            "workers": "runs in parallel, one process each (default: 2, or 1 on a 1-core machine)",
            "tokens": "tokens each sequence of a ring policy (window, sinks, h2o) decodes (at least 2000, the default)",
            "json": "print the summary as one JSON object (each run's settings and findings in rows)",
            "interps": "draw only these interpreters: micropython32 (the board's 32-bit word), micropython (64-bit)",
            "boards": "draw only these board profiles (microcontrollers whose heap holds a model)",
            "models": "draw only these models: stories260K (../shared/models), kvrtos-tiny",
            "weights": "draw only these weights: fp32, int8 (the model's q8row conversion)",
            "kv_dtypes": "draw only these KV element types: fp32, fp16, int8, int4, int4tok",
            "policies": "draw only these KV policies: full, window, sinks, h2o",
            "batch": "draw only these batch sizes (chats sharing one pool): 1, 2, 3",
            "tasks": "draw only these tasks beside the decode: none, voice-assistant, sensor-gateway, two-chats, user-task",
            "temperatures": "draw only these sampling temperatures: 0 (greedy), 0.8"},
      auto_shortflags=False)
@one_line_errors
def soak(c, seed="1", runs="8", workers="0", tokens="2000", json=False, interps=None, boards=None, models=None,
         weights=None, kv_dtypes=None, policies=None, batch=None, tasks=None, temperatures=None):
    """Randomized soak: boot the decoding firmware under the 32- and 64-bit MicroPython with a board's heap, drawn across boards, models, KV types, policies, batch sizes and tasks; no MemoryError, full stops with its line, no heap drift (exit 1 on a failed run, with the command that replays it)."""
    from host import soak as soak_mod

    lists = {}
    filters = ""
    for flag, v in (("interps", interps), ("boards", boards), ("models", models), ("weights", weights),
                    ("kv_dtypes", kv_dtypes), ("policies", policies), ("batch", batch), ("tasks", tasks),
                    ("temperatures", temperatures)):
        if v is None:
            continue
        items = [x.strip() for x in v.split(",") if x.strip()]
        if not items:
            raise UserError("--%s needs a comma-separated list (./kv soak --help)" % flag.replace("_", "-"), 2)
        if flag == "batch":
            items = [str(options.whole(x, "--batch", 1)) for x in items]
        if flag == "temperatures":
            from firmware_py import sample

            items = [str(options.number(x, "--temperatures", 0.0, sample.TEMPERATURE_MAX)) for x in items]
        lists[flag] = items
        filters += " --%s %s" % (flag.replace("_", "-"), ",".join(items))
    ring = options.whole(tokens, "--tokens", 1, options.TOKENS_MAX)
    if ring < soak_mod.RING_TOKENS:
        raise UserError("--tokens must be at least %d (a ring policy decodes past its budget), got %d" % (soak_mod.RING_TOKENS, ring), 2)
    if ring != soak_mod.RING_TOKENS:
        filters += " --tokens %d" % ring
    soak_mod.main(seed=options.whole(seed, "--seed"), runs=options.whole(runs, "--runs", 1), workers=options.whole(workers, "--workers"),
                  ring_tokens=ring, as_json=json, filters=filters,
                  interps=lists.get("interps"), boards_=lists.get("boards"), models_=lists.get("models"),
                  weights=lists.get("weights"), kv_dtypes=lists.get("kv_dtypes"), policies=lists.get("policies"),
                  batches=lists.get("batch"), tasks=lists.get("tasks"), temperatures=lists.get("temperatures"))


