# The DMA benchmark measures what it claims: the scenario moves every K/V byte of every
# token (checked inside, and charged once per tier), unmerged is one transaction per
# descriptor, merged bursts follow from the ring and the burst limit, the headline ratio
# reaches the 8x, flash erases come from the flash tier's model (never invented),
# and ./kv bench-docs --only dma
# renders its section.
import json
import subprocess
import sys

import pytest

from host import benchdoc, paths
from host.bench import dma as bench

SHAPE = (5, 4, 8)  # stories260K


@pytest.mark.parametrize("mode", ["spill", "write-through"])
def test_unmerged_is_one_transaction_per_descriptor(mode):
    d = bench.scenario(SHAPE, 40, False, mode=mode)
    assert d["descriptors"] == d["transactions"] == 40 * 10
    assert d["bytes"] == 40 * 1280 == d["charged_kv_write_psram"] == d["charged_kv_write_sram"]


def test_merged_bursts_follow_the_ring_and_the_burst_limit():
    # 3 full blocks of 160 descriptors of 128 B (20,480 B each, contiguous): a burst takes
    # at most a ring's worth of descriptors and max_burst bytes
    for slots, mb, per_block in ((32, 16384, 5), (8, 16384, 20), (32, 1024, 20), (160, 65536, 1), (160, 16384, 2)):
        d = bench.scenario(SHAPE, 48, True, slots=slots, max_burst=mb)
        assert d["transactions"] == 3 * per_block, (slots, mb)
        assert d["descriptors"] == 480 and d["bytes"] == 48 * 1280


def test_write_through_merges_only_k_with_v():
    d = bench.scenario(SHAPE, 32, True, mode="write-through")
    assert d["transactions"] == 32 * 5  # one burst per layer: K and V of a layer are adjacent


def test_measure_reports_the_ratio_and_no_flash_figures():
    r = bench.measure()
    assert r["descriptors_per_token"] == 10 and r["kv_bytes_per_token"] == 1280
    assert r["dma_transactions_unmerged"] == r["tokens"] * 10
    assert r["dma_transactions_ratio"] == r["dma_transactions_unmerged"] / r["dma_transactions_merged"]
    assert r["dma_transactions_ratio"] >= 8
    assert r["bytes_moved_merged"] == r["bytes_charged_psram_merged"] == r["tokens"] * 1280
    assert r["bytes_verified"] is True
    assert r["sweep"] and all(s["ratio"] >= 1 for s in r["sweep"])
    text = "\n".join(bench.render(r))
    assert "ratio" in text
    # flash erases come from the flash tier's model, or are absent and said so (never made up)
    if "flash" in r:
        wt, wb = r["flash"]["writethrough"], r["flash"]["writeback"]
        assert r["flash_erases_per_1000_tokens_writethrough"] == wt["erases_per_1000_tokens"]
        assert r["flash_erases_per_1000_tokens_writeback"] == wb["erases_per_1000_tokens"]
        assert wb["batch_tokens"] == bench.FLASH_BATCH and wt["batch_tokens"] == 1
        assert wb["erases_per_1000_tokens"] < wt["erases_per_1000_tokens"]
        assert "write-back, 16 tokens" in text
    else:
        assert not [k for k in r if "erase" in k] and "not measured" in text


def test_model_shape_falls_back_and_says_so(monkeypatch):
    monkeypatch.setattr(paths, "shared_models", lambda: None)
    L, H, D, seq, where = bench.model_shape()
    assert (L, H, D, seq) == bench.FALLBACK and "not in ../shared/models" in where


def test_cli_json_and_bench_docs_section(tmp_path, monkeypatch):
    r = subprocess.run([sys.executable, "-m", "invoke", "bench", "dma", "--json"], cwd=paths.ROOT,
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "No module named invoke" in r.stderr:
        pytest.skip("invoke not importable here")
    assert r.returncode == 0, r.stderr
    fig = json.loads(r.stdout.strip().splitlines()[-1])
    assert fig["dma_transactions_ratio"] >= 8
    # ./kv bench-docs --only dma, into a scratch folder: the JSON record and a section for it
    monkeypatch.setattr(benchdoc, "DOC", str(tmp_path / "benchmarks.md"))
    monkeypatch.setattr(benchdoc, "JSON_DIR", str(tmp_path / "bench"))
    page = benchdoc.main(only="dma")
    rec = json.loads((tmp_path / "bench" / "dma.json").read_text())
    assert rec["command"] == "./kv bench dma --json"
    assert "## " + bench.TITLE in page and "| spill (block moves) |" in page


def test_flash_lifetime_is_the_budgets_figure():
    # one definition of a sector's lifetime (host/budget.py): ./kv bench dma's table shows
    # the worst case, one slot taking every block, the same figure as
    # ./kv budget --flash-kv-bytes max's lifetime_tokens_one_slot; the levelled figure over
    # the bench's own file equals the budget's for a file of that many slots
    import os

    from firmware_py import kv
    from host import boards, budget
    from host.bench import _flash

    b = budget.compute("esp32s3_n8r8", "stories260K", "fp32", flash_kv_bytes="max")
    wear = b["tiers"]["flash"]["wear"]
    wb = _flash.erases_per_1000_tokens(bench.FLASH_BATCH)
    assert wb["lifetime_tokens_one_slot"] == wear["lifetime_tokens_one_slot"] == 1600000
    lay = kv.Layout(5, 4, 8, "fp32")
    w = budget.flash_wear(boards.load("esp32s3_n8r8"), lay, n_slots=wb["flash_slots"])
    assert wb["lifetime_tokens_levelled"] == w["lifetime_tokens_levelled"]
    assert wb["lifetime_tokens_one_slot"] == w["lifetime_tokens_one_slot"]
    wt = _flash.erases_per_1000_tokens(1)
    assert wt["lifetime_tokens_one_slot"] == budget.lifetime_tokens_one_slot(16, wt["max_erases_per_sector"])
    assert "lifetime_tokens_hottest_sector" not in wb  # the 1,000-token extrapolation, no slot reused: gone
    text = "\n".join(bench.render(bench.measure()))
    row = [ln for ln in text.splitlines() if ln.startswith("| write-back, 16 tokens |")][0]
    assert row.endswith("| {:,} |".format(wear["lifetime_tokens_one_slot"])), row
    assert "The lifetime to trust is the worst case" in text
    # docs/budget.md quotes the same figure and says which to trust
    doc = open(os.path.join(paths.ROOT, "docs", "budget.md")).read()
    assert "**Trust `lifetime_tokens_one_slot`**" in doc
    assert "({:,} tokens for stories260K fp32 with write-back 16".format(wear["lifetime_tokens_one_slot"]) in doc
