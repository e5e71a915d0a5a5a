# `./kv sweep`: a grid of emulations (host/emulate.py) -- boards x models x policies x
# windows x KV element types x scenarios x cost kinds x token counts x seeds -- run on a
# process pool on this machine or on a Dask distributed cluster (--scheduler tcp://...),
# each point's report cached under a hash of everything it depends on (the normalized
# spec, the bytes of its input files, the emulator's code) so a rerun or an interrupted
# sweep only runs what is missing. Output: results.csv, results.md (which settings meet
# the latency and memory target on which board, best first), results.png and
# summary.json in --out (docs/sweep.md). Here: running the points (the process pool, Dask,
# the progress line) and the command; the grid is host/sweepgrid.py, the cache
# host/sweepcache.py, the rows and the files host/sweepreport.py.
import io
import json
import os
import signal
import sys

from host import paths
from host.errors import UserError
from host.sweepcache import (METRICS, Cache, code_files, code_sha256, default_cache, input_hashes,  # noqa: F401 - the sweep's API
                             point_key)
from host.sweepgrid import AXES, GRID_KEYS, emulator, expand, load_grid_file, merge, number  # noqa: F401
from host.sweepreport import (best_per_board, cell, default_out, markdown, no_machine_paths, row_of,  # noqa: F401
                              setting_text, short_path, write)

SCHEDULER_TIMEOUT_S = 10  # connecting to --scheduler: then one line, not a hang


# ---------------------------------------------------------------------------- running


def emulate_point(spec, hashes=None):
    # run one point (in a worker process, here or on a Dask worker): {"status": "ok",
    # "report"} or {"status": "failed", "error": one line} for the user's mistake (the
    # emulator's UserError of exit 2: a bad spec, a model that does not fit, a user
    # module that does not import); anything else is {"status": "error"}: an internal
    # failure (emulate.TaskFault: one of the emulator's own firmware tasks raised, another
    # UserError, any exception: a bug), reported and never cached. spec: the normalized
    # spec (absolute paths); hashes: input_hashes(spec) as the client computed them for
    # the key: a worker whose files differ refuses the point (an error, not cached). "code"
    # is this worker's code hash: a worker running other sources than the client is refused.
    out = None
    if hashes is not None:
        mine = input_hashes(spec)
        for f in sorted(set(hashes) | set(mine)):
            want, got = hashes.get(f), mine.get(f)
            if want != got:
                out = {"status": "error", "error": "the worker's %s %s (the key was made with %s)" % (
                    short_path(f), "is missing" if got is None else "has sha256 %s" % got[:12],
                    "no such file" if want is None else "sha256 %s" % want[:12])}
                break
    if out is None:
        try:
            emulate = emulator()
            fault = getattr(emulate, "TaskFault", ())
            try:
                rep = emulate.run(spec)
                rep["band"] = emulate.band(spec, rep)  # both ends of the board-speed band ({} but for MicroPython costs)
                out = {"status": "ok", "report": rep}
            except UserError as e:
                line = (str(e).splitlines() or ["failed"])[0]
                user = e.code == 2 and not (fault and isinstance(e, fault))
                out = {"status": "failed" if user else "error", "error": line}
        except Exception as e:  # noqa: BLE001 - one point's bug must not stop the sweep
            out = {"status": "error", "error": "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0])}
    out["code"] = code_sha256()
    return out


def _check_scheduler(address):
    if not isinstance(address, str) or "://" not in address or not address.split("://", 1)[1]:
        raise UserError("--scheduler wants a Dask scheduler address like tcp://HOST:8786, got %r" % (address,), 2)
    scheme = address.split("://", 1)[0]
    if scheme not in ("tcp", "tls", "inproc", "ws", "wss", "ucx"):
        raise UserError("--scheduler: unknown protocol %r in %s (tcp://HOST:PORT)" % (scheme, address), 2)


def _worker_init():
    # a pool worker ends with the sweep: on Linux, SIGTERM when its parent dies (a killed
    # sweep leaves no orphan emulating on); the parent's SIGTERM handler (main) is not
    # the worker's: TERM ends a worker at once
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _pool_results(specs, workers):
    # (index, result) as each point finishes, on a process pool of `workers`
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ex = ProcessPoolExecutor(max_workers=workers, initializer=_worker_init)
    finished = False
    try:
        futs = {ex.submit(emulate_point, s, h): i for i, s, h in specs}
        for fut in as_completed(futs):
            try:
                res = fut.result()
            except Exception as e:  # a worker that died (killed, out of memory)
                res = {"status": "error", "error": "worker died: %s" % (str(e).splitlines() or [type(e).__name__])[0]}
            yield futs[fut], res
        finished = True
    finally:
        if not finished:
            # stopped early (Ctrl-C, SIGTERM, a raise in on_result): the points still
            # running are not waited for; their results would not be stored anyway
            for proc in list((getattr(ex, "_processes", None) or {}).values()):
                try:
                    proc.terminate()
                except (OSError, AttributeError):
                    pass
        ex.shutdown(wait=True, cancel_futures=True)


def _connect(client_cls, address, limit_s=None):
    # a distributed.Client for `address`, the whole connection and handshake bounded by a
    # wall clock: a peer that is not a Dask scheduler may answer bytes the handshake
    # misreads (an HTTP server's reply read as a frame length: numpy's MemoryError) or
    # accept and say nothing (the client's own timeout does not bound that). Any failure
    # is one line naming its class; the connecting thread of a peer that never answers is
    # left behind (a daemon thread: it does not hold the process at exit)
    import threading

    limit_s = SCHEDULER_TIMEOUT_S if limit_s is None else limit_s
    box = {}

    def connect():
        try:
            box["client"] = client_cls(address, timeout="%gs" % limit_s)
        except BaseException as e:  # noqa: BLE001 - reported below in one line, whatever it is
            box["error"] = e

    t = threading.Thread(target=connect, name="kvrtos-sweep-connect", daemon=True)
    t.start()
    wall = limit_s + 2  # the client's own timeout first (a closed port: its OSError), then ours
    t.join(wall)
    if t.is_alive():
        raise UserError("cannot reach the Dask scheduler at %s: no Dask handshake within %g s (the peer accepted "
                        "the connection and answered nothing a Dask scheduler would)" % (address, wall), 1)
    e = box.get("error")
    if e is not None:
        if not isinstance(e, Exception):
            raise e  # KeyboardInterrupt, SystemExit: not the peer's doing
        text = (str(e).splitlines() or [""])[0]
        hint = "" if isinstance(e, (OSError, TimeoutError)) else \
            " (the peer answered what a Dask scheduler would not: is it one?)"
        raise UserError("cannot reach the Dask scheduler at %s: %s%s%s"
                        % (address, type(e).__name__, ": " + text if text else "", hint), 1)
    return box["client"]


def _dask_results(specs, address, keys):
    # (index, result) as each point finishes, on the Dask cluster at `address`
    import logging

    _check_scheduler(address)
    try:
        from distributed import Client, as_completed
    except ImportError as e:
        raise UserError("--scheduler needs Dask (%s): pip install 'kvrtos[cluster]' (a checkout's ./kv installs it)" % e, 2)
    quiet = [logging.getLogger(n) for n in ("distributed", "distributed.client", "distributed.comm", "tornado")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.CRITICAL)
    try:
        client = _connect(Client, address)
        try:
            futs = {}
            for i, s, h in specs:
                futs[client.submit(emulate_point, s, h, key="kvrtos-sweep-%s" % keys[i], pure=False)] = i
            for fut in as_completed(list(futs)):
                try:
                    res = fut.result()
                except Exception as e:  # noqa: BLE001 - the worker's exception, or a lost worker
                    res = {"status": "error", "error": "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0])}
                yield futs[fut], res
        finally:
            client.close(timeout=SCHEDULER_TIMEOUT_S)
    finally:
        for lg, lv in zip(quiet, levels, strict=True):
            lg.setLevel(lv)


class Progress:
    # points done / cached / failed: a rich bar on a terminal's stderr, plain lines
    # (about every 10 %, and the last) otherwise
    def __init__(self, total, stream=None, live=None):
        self.total, self.ran, self.cached, self.failed = total, 0, 0, 0
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._bar = self._task = None
        self._next = 0

    def __enter__(self):
        if self.live and self.total:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self._bar = RichProgress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                                     TimeElapsedColumn(), console=Console(file=self.stream), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(self._text(), total=self.total)
        return self

    def _text(self):
        return "cached %d, ran %d, failed %d" % (self.cached, self.ran, self.failed)

    def done(self, cached=False, failed=False):
        if cached:
            self.cached += 1
        else:
            self.ran += 1
        if failed:
            self.failed += 1
        n = self.cached + self.ran
        if self._bar is not None:
            self._bar.update(self._task, completed=n, description=self._text())
        elif n >= self._next or n == self.total:
            print("sweep: %d/%d points (%s)" % (n, self.total, self._text()), file=self.stream, flush=True)
            self._next = n + max(1, self.total // 10)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()
        return False


def run(settings, progress=None, on_result=None):
    # the sweep: {"rows": [row per point, in grid order], "summary": {...}}. settings: the
    # merged grid (merge()); progress: None (Progress on stderr), False (silent) or a
    # Progress; on_result(index, row) after each point is stored (a raise there stops
    # the sweep: what finished stays cached).
    points, skipped = expand(settings)
    if not points:
        raise UserError("the grid has no point to run (%s)" % (
            "; ".join("%d skipped: %s" % (n, r) for r, n in skipped.items()) or "no axis values"), 2)
    targets = {"ms_per_token": number("target_ms_per_token", settings.get("target_ms_per_token")),
               "kv_bytes": number("target_kv_bytes", settings.get("target_kv_bytes"))}
    workers = settings.get("workers")
    scheduler = settings.get("scheduler") or None
    if scheduler is not None:
        _check_scheduler(scheduler)
    if workers in (None, ""):
        workers = os.cpu_count() or 1
    try:
        workers = int(workers)
    except (TypeError, ValueError):
        raise UserError("--workers wants a whole number, got %r" % (workers,), 2)
    if workers < 1:
        raise UserError("--workers must be 1 or more, got %d" % workers, 2)
    cache = Cache(paths.out_folder(paths.user_path(settings.get("cache") or default_cache()), "--cache", make=False))
    code = code_sha256()
    hashes = [input_hashes(p["norm"]) for p in points]
    keys = [point_key(p["norm"], code, h) for p, h in zip(points, hashes, strict=True)]
    entries = [cache.get(k) for k in keys]
    # every executor gets the normalized spec (absolute paths: a Dask worker in another
    # folder reads the same files) and the hashes its key was made with
    todo = [(i, points[i]["norm"], hashes[i]) for i, e in enumerate(entries) if e is None]
    status = {"ran": 0, "cached": len(points) - len(todo), "failed": 0, "errors": []}
    bar = Progress(len(points)) if progress is None else progress
    if bar is False:
        bar = Progress(len(points), stream=io.StringIO(), live=False)
    with bar:
        for i, e in enumerate(entries):
            if e is not None:
                bar.done(cached=True, failed=e["status"] == "failed")
                if on_result:
                    on_result(i, row_of(points[i], keys[i], e, targets))
        if todo:
            results = _dask_results(todo, scheduler, keys) if scheduler else _pool_results(todo, min(workers, len(todo)))
            try:
                for i, res in results:
                    if res.get("code") != code:
                        res = {"status": "error", "error": "the worker runs other kvrtos sources than this checkout "
                                                           "(code hash %s, here %s)" % (str(res.get("code"))[:12], code[:12])}
                    entry = {"status": res["status"], "spec": points[i]["norm"]}
                    if res["status"] == "ok":
                        entry["report"] = res["report"]
                    else:
                        entry["error"] = no_machine_paths(str(res["error"]))
                    if res["status"] in ("ok", "failed"):
                        cache.put(keys[i], entry)
                    else:
                        status["errors"].append(entry["error"])
                    entries[i] = entry
                    status["ran"] += 1
                    status["failed"] += res["status"] != "ok"
                    bar.done(failed=res["status"] != "ok")
                    if on_result:
                        on_result(i, row_of(points[i], keys[i], entry, targets))
            finally:
                close = getattr(results, "close", None)
                if close:
                    close()  # a generator stopped early shuts its pool / client down
    rows = [row_of(p, k, e, targets) for p, k, e in zip(points, keys, entries, strict=True)]
    summary = {
        "points": len(points), "ran": status["ran"], "cached": status["cached"],
        "failed": sum(r["status"] != "ok" for r in rows),
        "skipped": sum(skipped.values()), "skipped_reasons": skipped,
        "meets_target": sum(bool(r["meets_target"]) for r in rows),
        "targets": targets, "executor": _executor(scheduler, min(workers, len(todo))),
        "cache": cache.root, "best": best_per_board(rows), "errors": status["errors"],
    }
    return {"rows": rows, "summary": summary}


def _executor(scheduler, workers):
    # what ran the points, in words
    if not workers:
        return "none (every point from the cache)"
    if scheduler:
        return "dask " + scheduler
    return "process pool (%d worker%s)" % (workers, "" if workers == 1 else "s")


class Terminated(UserError):
    # SIGTERM during `./kv sweep`: one line and exit 143 (128 + 15, as a shell reports it)
    pass


class _terminated_one_line:
    # while the sweep runs, SIGTERM raises Terminated in the main thread: the pool's
    # workers are cancelled (each ends with its parent: _worker_init), every finished point
    # is already in the cache (entries are written whole: Cache.put), so the same command
    # resumes; a half-written output file in --out is rewritten by that rerun
    def __enter__(self):
        import threading

        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second TERM ends it at once
        raise Terminated("terminated; every finished point is cached: rerun the same command to resume", 128 + 15)

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False


def main(settings, as_json=False, command=None):
    # `./kv sweep`: run, write, print where (and the summary with --json); exit 1 after
    # writing when some point raised a bug (not a UserError)
    out = paths.user_path(settings["out"]) if settings.get("out") else default_out()
    paths.out_folder(out, make=False)  # a file, a path through one or /dev/null: one line before any point runs
    with _terminated_one_line():
        result = run(settings)
        files = write(result, out, command)
    s = result["summary"]
    if as_json:
        print(json.dumps(dict(s, out=out, files=files), sort_keys=True))
    else:
        print("sweep: %d point%s (%d ran, %d cached, %d failed, %d skipped), %d meet%s the target"
              % (s["points"], "" if s["points"] == 1 else "s", s["ran"], s["cached"], s["failed"], s["skipped"],
                 s["meets_target"], "s" if s["meets_target"] == 1 else ""))
        w = max([len(b) for b in s["best"]] or [0])
        for b, r in s["best"].items():
            print("  %-*s best: %s  %s ms/token  %s KV B%s" % (w, b, setting_text(r), cell(r["ms_per_token"]), cell(r["kv_bytes"]),
                                                               "" if r["meets_target"] else "  (misses: %s)" % r["why_not"]))
        print("wrote %s" % out)
    if s["errors"]:
        raise UserError("%d points raised an internal error (not cached; first: %s)" % (len(s["errors"]), s["errors"][0]), 1)
    return result
