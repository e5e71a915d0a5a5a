# Figures that cannot go stale: every deterministic benchmark (a VirtualClock one: its
# module sets DETERMINISTIC) is rerun here and compared with its committed
# docs/bench/<name>.json, field by field; a mismatch fails naming each field, so a
# change to the code or a profile that moves a published figure fails the suite until
# `./kv bench-docs --only NAME` regenerates it (and docs/benchmarks.md with it).
import copy
import json
import os

import pytest

from host import benchdoc, paths

NAMES = [n for n in benchdoc.names() if benchdoc.deterministic(n)]


def test_the_deterministic_benchmarks_are_the_ones_the_docs_name():
    assert {"costmodel", "dma", "tiers", "devicecases", "calibration", "scenarios"} <= set(NAMES), NAMES


@pytest.mark.parametrize("name", NAMES)
def test_committed_figures_are_what_the_code_gives_now(name):
    if not os.path.isfile(os.path.join(paths.shared_models() or "", "stories260K.bin")):
        pytest.skip("stories260K is absent (../shared/models): the committed figures were made with it")
    stale = benchdoc.stale_fields(name)
    assert not stale, "docs/bench/%s.json is stale (rerun ./kv bench-docs --only %s): %d fields differ:\n  %s" % (
        name, name, len(stale), "\n  ".join(stale[:30]))


def test_a_figure_changed_by_hand_fails_naming_the_field():
    # the committed costmodel figures with one number edited: the check names that field
    with open(os.path.join(benchdoc.JSON_DIR, "costmodel.json")) as f:
        fig = json.load(f)["figures"]
    if not os.path.isfile(os.path.join(paths.shared_models() or "", "stories260K.bin")):
        pytest.skip("stories260K is absent (../shared/models)")
    good = benchdoc.stale_fields("costmodel", fig)
    edited = copy.deepcopy(fig)
    edited["predictions"][0]["mean_tok_s"] = edited["predictions"][0]["mean_tok_s"] + 1
    bad = benchdoc.stale_fields("costmodel", edited)
    named = [x for x in bad if x not in good]
    assert len(named) == 1 and named[0].startswith("predictions[0].mean_tok_s: committed "), bad


def test_diff_names_missing_added_and_resized_fields():
    out = []
    benchdoc._diff({"a": 1, "b": [1, 2], "c": {"d": 1.0}}, {"a": 1, "b": [1], "c": {"d": 1}, "e": 0}, "", out)
    assert out == ["b: committed 2 items, now 1", "c.d: committed 1.0, now 1", "e: produced now, not committed"], out
