# `kv demo`: the main job on the virtual board, end to end. Starts a virtual ESP32-S3
# (unless one is already running for the board), flashes the firmware, the default model
# (models/kvrtos-tiny, committed, so a fresh clone works) and an application config that
# runs a 16 kHz audio capture task beside the decode (DEMO_CONFIG, as kvrtos.json: the
# same mechanism a user's own tasks use, docs/user-guide.md), shows the boot report, then
# runs firmware_py.serve on the board (what `./kv monitor --start` does) and sends it one
# prompt. While the board decodes, the live console dashboard (host/monitor.py: tasks,
# pool, KV, bandwidth, tok/s, text, events) runs on a terminal, plain status lines
# otherwise (--plain, or stdout not a terminal: CI). At the end: the summary (tok/s, time
# to first token, KV bytes, pool high-water, audio deadline misses: the board's own
# figures) and, in the output folder whose path it prints, the telemetry log, the raw
# capture, the serial log, the Chrome trace and the plots (host/trace.py, as ./kv trace).
import json
import os
import re
import shlex
import time

from firmware_py.app import REPORT_END
from host import boardmodel, boards, flash, monitor, paths, trace, vboard
from host.errors import UserError

PROMPT = "Once upon a time"  # kvrtos-tiny's stories begin so
TOKENS = 96  # new tokens: a few of kvrtos-tiny's sentences in well under a minute
OUT_BASE = paths.state("out")  # the repository's ignored area (/out/ in .gitignore); a user folder when installed
DECODE_S = 240.0  # s the decode may take at most (the board streams all along)
# the application config flashed with the demo: decode settings chosen at boot, and the
# audio task (firmware_py/workloads.AudioCapture: 16 kHz, 16-bit, a 16 ms DMA period into
# a PSRAM ring) beside the decode. The I2S buffer has 4 periods (ESP-IDF's I2S driver
# keeps 6 DMA descriptors by default), so a period must land within the 3 periods
# (48 ms) the others take to fill: the decode yields between layers, and one layer of
# kvrtos-tiny on the unix port (the virtual board) can take longer than one 16 ms period
DEMO_CONFIG = {
    "name": "demo",
    "title": "kvrtos-tiny decoding beside a 16 kHz audio capture",
    "decode": {"policy": "full"},  # KV: serve's default, int8 beside the int8 weights flash puts there (the integer path)
    "tasks": [{"kind": "audio", "name": "mic", "rate_hz": 16000, "sample_bytes": 2, "period_us": 16000, "halves": 4}],
}
_SUMMARY = re.compile(r"generate: (\d+) tokens \((\d+) prompt \+ (\d+) new\), ([\d.]+) tok/s, time to first token ([\d.]+) ms, "
                      r"KV (\d+) B .*pool high-water (\d+)/(\d+) blocks = (\d+) B")


def fresh_dir(base=OUT_BASE):
    # a new folder under base: demo-YYYYMMDD-HHMMSS (-2, -3, ... when taken)
    os.makedirs(base, exist_ok=True)
    stem = os.path.join(base, time.strftime("demo-%Y%m%d-%H%M%S"))
    p, i = stem, 1
    while True:
        try:
            os.mkdir(p)
            return p
        except FileExistsError:
            i += 1
            p = "%s-%d" % (stem, i)


# the files a run writes into its folder (the plots: host/trace.py's; one may be missing
# when its figures are): a folder a demo used before has these removed first, so it holds
# one run. MARKER, written by the demo as it starts a run there, is what says the folder is
# a demo's: a user's own kvrtos.json (or summary.json ...) is never removed or overwritten
OUTPUTS = ("kvrtos.json", "telemetry.jsonl", "serial.log", "capture.bin", "summary.json", "trace.json",
           "kv_bytes.png", "pool.png", "bandwidth.png")
MARKER = ".kvrtos-demo"


def _out_dir(out_dir):
    # the folder the demo writes to: out_dir (made with its parents when missing: paths.out_folder),
    # else a fresh one under out/
    if out_dir is None:
        return fresh_dir()
    return paths.out_folder(out_dir)


def clear_outputs(d):
    # ready folder d for one run and mark it as the demo's (MARKER). A folder holding none
    # of OUTPUTS (new, empty, or only other files) is used as it is; a folder a demo used
    # before (MARKER there) has that run's files removed (the monitor appends to its logs,
    # as monitor --jsonl/--log/--capture do, so a folder used twice would hold both runs
    # and the trace be built from the mix); other files are left alone. Refused in one line
    # (exit 2), with nothing removed: a folder holding an output's name without MARKER (a
    # user's own kvrtos.json), a folder where a file goes, a folder that cannot be written
    paths.claim_out(d, OUTPUTS, MARKER, "a demo", "a kvrtos demo's output folder: ./kv demo --out clears its files (%s) "
                    "before a run\n" % ", ".join(OUTPUTS), clear=True)


class _DemoMonitor(monitor.Monitor):
    # the console's Monitor, keeping the board's summary and workloads lines
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.summary_line = None
        self.workloads = None
        self.refused = []

    # every text line of the board passes here (Monitor.feed_text), notes too
    def emit(self, text, note=False, show=True):
        if not note:
            self._keep(text)
        super().emit(text, note, show)

    def _keep(self, line):
        from firmware_py import serve

        if line.startswith("generate: ") and _SUMMARY.search(line):
            self.summary_line = line
        elif line.startswith(serve.WORKLOADS):
            try:
                self.workloads = json.loads(line[len(serve.WORKLOADS):])
            except ValueError:
                pass
        elif line.startswith("serve: request refused") or line.startswith("serve: config refused"):
            self.refused.append(line)


def summarize(line, workloads):
    # the demo's summary dict from the board's summary line and workloads JSON
    m = _SUMMARY.search(line or "")
    if m is None:
        raise UserError("the board sent no summary line for the request (see the serial log)")
    g = m.groups()
    audio = {k: v for k, v in (workloads or {}).items() if v.get("period_bytes") is not None or k == "mic"}
    return {"tokens": int(g[2]), "prompt_tokens": int(g[1]), "tok_s": float(g[3]), "ttft_ms": float(g[4]),
            "kv_bytes": int(g[5]), "pool_high_water": int(g[6]), "pool_blocks": int(g[7]),
            "pool_high_water_bytes": int(g[8]),
            "audio_deadline_misses": sum(v.get("deadline_misses", 0) for v in audio.values()),
            "audio_periods": sum(v.get("released", 0) for v in audio.values()),
            "workloads": workloads or {}, "board_line": line}


def summary_line(s):
    # the one line printed at the end
    return ("demo: summary: %d tokens, %.1f tok/s on this host (the virtual board runs at the host's speed; the real "
            "board's prediction follows), time to first token %.1f ms, KV %d B, pool high-water %d/%d blocks "
            "(%d B), audio deadline misses %d of %d periods"
            % (s["tokens"], s["tok_s"], s["ttft_ms"], s["kv_bytes"], s["pool_high_water"], s["pool_blocks"],
               s["pool_high_water_bytes"], s["audio_deadline_misses"], s["audio_periods"]))


def predict_board(board_name, cfg_path, model, tokens, prompt):
    # what the real board would do with the same model, config and request: the emulator
    # (./kv emulate: the firmware's decode on the profile's cost model, virtual clock) at the
    # fitted board speed and at both ends of the board-speed band. The virtual board's own
    # figures are the unix port's speed on this machine, not the chip's
    from host import emulate  # noqa: PLC0415 - only at the end of a run

    model = model or boardmodel.TINY_NAME  # what flash put on the board (the emulator's own default is stories260K)
    spec = {"board": board_name, "scenario": cfg_path, "tokens": tokens, "prompt": prompt, "model": model}
    rep = emulate.run(spec)
    band = emulate.band(spec, rep)
    cmd = "./kv emulate --board %s --scenario %s --tokens %d --prompt %s --model %s" % (
        board_name, shlex.quote(cfg_path), tokens, shlex.quote(prompt), shlex.quote(model))
    return {"tok_s": rep["tok_s"], "deadline_misses": rep["deadline_misses"], "cost": rep["spec"]["cost"],
            "band": {e: {"tok_s": v["tok_s"], "deadline_misses": v["deadline_misses"]} for e, v in band.items()},
            "verdict": rep["verdict"]["line"], "command": cmd}


def prediction_line(p):
    # the one line of the board prediction
    b = p["band"]
    ends = "; ".join("%s end of the board-speed band %.1f tok/s, %d misses" % (e, b[e]["tok_s"], b[e]["deadline_misses"])
                     for e in ("slow", "fast") if e in b)
    return "demo: on a real board (emulated, %s cost: %s): %.1f tok/s, deadline misses %d%s" % (
        p["cost"], p["command"], p["tok_s"], p["deadline_misses"], " (%s)" % ends if ends else "")


def _ctrl_c(port):
    # end serve on a board left running (Ctrl-C at its console); quiet when the port is gone
    try:
        ser = monitor.open_port(port)
    except UserError:
        return
    try:
        ser.write(b"\r\x03")
        ser.flush()
    finally:
        ser.close()


def run(board_name=paths.DEFAULT_BOARD, out=print, timeout=60.0, tokens=TOKENS, prompt=PROMPT, model="", out_dir=None,
        plain=False, stream=None, decode_s=DECODE_S):
    # the whole demo; returns the summary dict (summary.json in the output folder).
    # stream: where the console goes (default stdout; a terminal gets the dashboard)
    import sys

    if not isinstance(tokens, int) or tokens < 1:
        raise UserError("--tokens must be a whole number >= 1, got %r" % (tokens,), 2)
    b = boards.load(board_name)
    if b.kind != "mcu":
        raise UserError("board %s is a %s: the demo runs on a microcontroller profile" % (b.name, b.kind), 2)
    boardmodel.resolve(model)  # a model that does not exist: one line before anything starts
    d = _out_dir(out_dir)
    clear_outputs(d)  # one run per folder
    cfg_path = os.path.join(d, "kvrtos.json")
    with open(cfg_path, "w") as f:
        json.dump(DEMO_CONFIG, f, indent=1)
        f.write("\n")
    flash.config_files(cfg_path, b)  # checked on the host first, as ./kv flash --config does
    port = vboard.running_port(b.name)
    handle = None
    if port is None:
        handle = vboard.start(b.name)
        port = handle.port
        out("demo: virtual %s up on %s (filesystem %s/fs)" % (b.name, port, handle.home))
    else:
        out("demo: using the virtual %s already running on %s" % (b.name, port))
    t0 = time.monotonic()
    serving = False
    try:
        _, ser = flash.flash(port=port, board_name=b.name, out=out, keep_open=True, model=model, config=cfg_path)
        m = monitor.Monitor(port)
        try:
            end = m.run(until=REPORT_END, timeout=timeout, ser=ser)
        finally:
            ser.close()
            m.close()
        if end is None:
            raise UserError("the board's boot report did not end within %.0f s" % timeout)
        monitor.start_serve(port, out=out)
        serving = True
        out("demo: decoding %d tokens on the board's MicroPython beside the audio task (greedy, int8 weights and KV, policy full): %r"
            % (tokens, prompt))
        jsonl = os.path.join(d, "telemetry.jsonl")
        m = _DemoMonitor(port, log_path=os.path.join(d, "serial.log"), out=stream or sys.stdout, jsonl_path=jsonl,
                         capture_path=os.path.join(d, "capture.bin"), view="plain" if plain else "auto")
        try:
            m.run(until_done=1, timeout=decode_s, on_open=lambda mon: mon.send_command("prompt", text=prompt, tokens=tokens),
                  stop_on_end=True)
        finally:
            m.close()
        if m.refused:
            raise UserError("the board refused the request: %s" % m.refused[0])
        if m.done_events < 1 and m.serve_ended is not None:
            raise UserError("serve ended on the board before the request was done: %s" % m.serve_error())
        if m.done_events < 1:
            raise UserError("the request did not end within %.0f s (see %s)" % (decode_s, os.path.join(d, "serial.log")))
        s = summarize(m.summary_line, m.workloads)
        res = trace.main(jsonl, d, err=open(os.devnull, "w"))
        s.update(out_dir=d, trace=res["trace"], plots=res["plots"], frames=res["frames"], kv_fit=res["kv_fit"],
                 seconds=round(time.monotonic() - t0, 1), board=b.name, config=DEMO_CONFIG)
        out(summary_line(s))
        try:
            s["board_prediction"] = predict_board(b.name, cfg_path, model, tokens, prompt)
            out(prediction_line(s["board_prediction"]))
        except UserError as e:  # the run on the virtual board stands; say why there is no prediction
            s["board_prediction"] = {"error": (str(e).splitlines() or ["failed"])[0]}
            out("demo: no prediction for a real board: %s" % s["board_prediction"]["error"])
        with open(os.path.join(d, "summary.json"), "w") as f:
            json.dump(s, f, indent=1, sort_keys=True)
            f.write("\n")
        out("demo: output in %s (telemetry.jsonl, trace.json for ui.perfetto.dev, %s, serial.log, summary.json)"
            % (d, ", ".join(os.path.basename(p) for p in res["plots"])))
        out("demo: done in %.1f s (flash, boot, decode on the virtual %s)" % (time.monotonic() - t0, b.name))
        return s
    finally:
        if handle is not None:
            handle.stop()
            out("demo: virtual board stopped")
        elif serving:
            _ctrl_c(port)  # the board the user had running: back to its REPL
