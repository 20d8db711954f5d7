"""`bench.service_load` end to end on a tiny tf-idf index: real servers (this checkout as "before" and "after"), the
library, /link and /annotate rounds, the batch phase and the report."""

from __future__ import annotations

import json
import sys

import pytest
from fixtures.normalize.normalize_tables import build_indexes

from bench import data


@pytest.mark.slow
def test_the_load_bench_measures_link_annotate_and_normalize_and_writes_its_report(tmp_path, monkeypatch):
    from bench import service_load

    (tmp_path / "indexes").mkdir()
    index = build_indexes(tmp_path / "indexes")["meddra"]
    annotate = "0" if data.skip_reason("phee") else "3"  # /annotate reads PHEE's development sentences
    out = tmp_path / "report" / "load"
    monkeypatch.setattr(service_load, "WARM_UP_SECONDS", 0.3)
    monkeypatch.setattr(sys, "argv", [
        "service_load", "--index", str(index), "--baseline-index", str(index), "--seconds", "0.4", "--rounds", "1",
        "--sizes", "1,2", "--clients", "2", "--library-batch", "20", "--spans", "30", "--annotate", annotate,
        "--out", str(out)])
    service_load.main()
    result = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    summary = result["service"]["summary"]
    assert {(r["server"], r["mentions_per_request"]) for r in summary if "clients" not in r} == {
        ("before", 1), ("before", 2), ("after", 1), ("after", 2)}
    assert all(r["failed_requests"] == 0 for r in summary)
    assert result["batch"]["output_lines"] == result["batch"]["spans"] > 0
    markdown = out.with_suffix(".md").read_text(encoding="utf-8")
    body = markdown.split("\n", 3)[3]  # past the title and the command line, which repeats the arguments given
    assert "| after | 2 |" in body and str(tmp_path) not in body
    if annotate != "0":
        rows = result["service"]["annotate_summary"]
        assert {(r["server"], r["clients"]) for r in rows} == {("before", 2), ("before", 1), ("after", 2), ("after", 1)}
        assert all(r["failed_requests"] == 0 and r["documents_per_second"] > 0 for r in rows)
        assert "/annotate, one PHEE development sentence a request" in markdown
