# docs/benchmarks.md is generated: the committed page is exactly what host/benchdoc.py
# renders from the committed docs/bench/*.json (a hand edit fails here), every
# benchmark module has its JSON with the command, interpreters, machine and date, and
# a benchmark without rendering hooks still gets a section built from its keys.
import json
import os

from host import benchdoc


def test_committed_page_is_what_the_committed_json_renders():
    with open(benchdoc.DOC) as f:
        page = f.read()
    assert page == benchdoc.render_doc(benchdoc.load()), "docs/benchmarks.md differs: run ./kv bench-docs --render (or ./kv bench-docs)"


def test_every_benchmark_module_has_its_json_with_provenance():
    recs = {r["name"]: r for r in benchdoc.load()}
    for name in benchdoc.names():
        assert name in recs, "no docs/bench/%s.json: run ./kv bench-docs" % name
        r = recs[name]
        assert r["command"] == "./kv bench %s --json" % name
        assert r["environment"]["cpython"].count(".") == 2 and r["environment"]["micropython"].startswith("1.")
        assert r["environment"]["machine"]["cpu_count"] >= 1
        assert len(r["date_utc"]) == 20 and r["date_utc"].endswith("Z")
        assert isinstance(r["figures"], dict) and r["figures"]
        assert "## " in "\n".join(benchdoc.section(r))


def test_generic_section_renders_pairs_scalars_and_rows_from_keys():
    rec = {"name": "no_such_module", "command": "./kv bench no_such_module --json", "date_utc": "2026-01-01T00:00:00Z",
           "wall_s": 1.0, "environment": {"cpython": "3.11.7", "micropython": "1.29.0", "machine": {"cpu_count": 2}},
           "figures": {"decode_tok_s_micropython": 12.5, "decode_tok_s_cpython": 1234.5, "model": "stories260K",
                       "points": [{"n": 1, "q": {"ppl": 3.25}}, {"n": 2, "q": {"ppl": 3.5}}]}}
    text = "\n".join(benchdoc.section(rec))
    assert "## no_such_module" in text
    assert "| `decode_tok_s` | 12.5 | 1,234 |" in text  # interpreters side by side
    assert "| `model` | stories260K |" in text
    assert "| n | q.ppl |" in text and "| 2 | 3.5 |" in text  # a list of rows becomes a table


def test_render_only_writes_the_page_from_json_without_running(tmp_path, monkeypatch):
    monkeypatch.setattr(benchdoc, "DOC", str(tmp_path / "benchmarks.md"))
    monkeypatch.setattr(benchdoc, "run_one", lambda *a: (_ for _ in ()).throw(AssertionError("ran a benchmark")))
    page = benchdoc.main(render_only=True)
    assert (tmp_path / "benchmarks.md").read_text() == page
    assert page.startswith("# Benchmarks") and page.count("\n## ") == len(benchdoc.load())


def test_written_json_loads_back_unchanged(tmp_path, monkeypatch):
    # write() then load() round-trips: the page is rendered from exactly what was measured
    monkeypatch.setattr(benchdoc, "JSON_DIR", str(tmp_path))
    rec = {"name": "x", "command": "c", "figures": {"b": 2, "a": [1.5, None]}}
    benchdoc.write([rec])
    with open(os.path.join(str(tmp_path), "x.json")) as f:
        assert json.load(f) == rec
    assert benchdoc.load() == [rec]


def test_missing_json_folder_is_a_one_line_user_error(tmp_path, monkeypatch):
    import pytest

    from host.errors import UserError

    monkeypatch.setattr(benchdoc, "JSON_DIR", str(tmp_path / "absent"))
    with pytest.raises(UserError) as e:
        benchdoc.load()
    assert "run ./kv bench-docs" in str(e.value) and "\n" not in str(e.value)
