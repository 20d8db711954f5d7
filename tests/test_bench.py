"""The experiment layer (`bench/`): one dataset catalogue, one report writer, variants through public config."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from bench import data
from bench.report import Report, table

ROOT = Path(__file__).resolve().parents[1]


def test_the_catalogue_reads_its_root_from_the_environment_and_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv(data.ENV, str(tmp_path))
    assert data.root() == tmp_path
    ncbi = data.get("ncbi")
    reason = data.skip_reason("ncbi")
    assert reason == ncbi.missing() and str(tmp_path / "ncbi_disease") in reason and data.ENV in reason
    with pytest.raises(data.MissingData, match="ncbi_disease"):
        ncbi.path("test")
    (tmp_path / "ncbi_disease").mkdir()
    (tmp_path / "ncbi_disease" / "NCBItestset_corpus.txt").write_text("1\t0\t4\tpain\tDiseaseClass\tD010146\n")
    assert data.skip_reason("ncbi") is None
    assert ncbi.spec("test") == f"pubtator:{tmp_path / 'ncbi_disease' / 'NCBItestset_corpus.txt'}"
    assert ncbi.spec("test", "biosyn").endswith("NCBItestset_corpus.txt#biosyn")
    assert data.pubtator_texts("test") == ["pain"]
    with pytest.raises(data.MissingData, match="medic_06Jul2012.txt"):
        ncbi.path("medic")
    with pytest.raises(KeyError, match="known: ncbi"):
        data.get("nope")


def test_every_entry_of_the_catalogue_names_its_format_and_options():
    specs = {name: (d.format, d.options) for name, d in data.CATALOGUE.items()}
    assert specs["cantemist"] == ("brat", "lang=es") and specs["codiesp"] == ("codiesp", "D")
    assert specs["tac2017"] == ("ade-xml", "") and specs["phee"] == (None, "")
    assert set(specs) == {"ncbi", "cantemist", "codiesp", "mantra", "hpo", "doid", "phee", "tac2017"}


@pytest.mark.integration
def test_the_shared_data_is_where_the_catalogue_says():
    reason = data.skip_reason(*data.CATALOGUE)
    if reason:
        pytest.skip(reason)
    assert data.get("cantemist").spec("test").endswith("cantemist/test.zip#lang=es")
    assert len(data.hpo_files()) == 8 and len(data.medic_names()) > 70_000


def test_a_report_is_markdown_and_json_with_the_header_and_no_machine_paths(tmp_path):
    report = Report("study", out=tmp_path / "eval", title="A study")
    shared = data.root().resolve() / "ncbi_disease" / "NCBItestset_corpus.txt"
    written = report.write({"test": str(shared), "index": str(ROOT / "indexes" / "x")},
                           ["", *table(["a", "b"], [(1, 2)], "r")])
    assert [p.name for p in written] == ["study.md", "study.json"]
    saved = json.loads((tmp_path / "eval" / "study.json").read_text())
    assert set(saved) >= {"command", "date", "cpus", "load_before", "load_after", "commit"}
    assert saved["test"] == "../shared/data/ncbi_disease/NCBItestset_corpus.txt" and saved["index"] == "indexes/x"
    md = (tmp_path / "eval" / "study.md").read_text()
    assert md.startswith("# A study\n\nProduced by `python ") and "at commit " in md and "load average" in md
    assert "| 1 | 2 |" in md and "|---:|---|" in md


def test_no_import_path_edits_and_no_private_imports_in_the_experiment_layer():
    edit = "sys" + ".path"  # spelt so that this file does not hold it
    for folder in ("bench", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            assert edit not in text, path
            if folder == "bench":  # the library's private names, and its module globals patched
                assert not re.search(r"from linker[\w.]* import [^\n#]*\b_[a-z]|\.SHARD_NAMES\s*=|sp_matmul_topn\s*=",
                                     text), path


def test_a_search_lever_is_a_public_config_field():
    from linker.index.tfidf import TfidfConfig, TfidfNameIndex

    names = ["chest pain", "pain in chest", "headache", "back pain", "pain"]
    index = TfidfNameIndex.build(names, TfidfConfig(search="exact"))
    scores, rows = index.search(["chest pain"], 5)
    index.config = dataclasses.replace(index.config, shard_names=2)
    assert len(index.shards) == 3
    assert (index.search(["chest pain"], 5)[1] == rows).all()
    index.config = dataclasses.replace(index.config, min_score=float(scores[0][1]) + 1e-6)
    kept = index.search(["chest pain"], 5)[1][0]
    assert kept[0] == rows[0][0] and (kept[1:] == -1).all()


def test_house_counts_lines_per_package_and_masks_only_run_fields():
    """bench.house's pure helpers: the package a file counts in, its lines, the rows, JSON keys that differ, and the
    run fields (build time, process id, checksums, printed seconds) masked before outputs are compared."""
    from bench.house import count_lines, json_differences, line_rows, lines_by_package, mask_run_fields, package_of

    assert [package_of(p) for p in ("linker/index/dense.py", "linker/service.py", "linker/service/app.py",
                                    "linker/data/x.tsv", "bench/house.py")] == ["index", "service", "service", None,
                                                                                None]
    assert [count_lines(b) for b in (b"", b"a\n", b"a\nb", b"\n\n")] == [0, 1, 2, 2]
    counts = lines_by_package({"linker/a.py": b"x\ny\n", "linker/b/c.py": b"z", "linker/b/d.py": b"1\n2\n3\n"})
    assert counts == {"a": (1, 2), "b": (2, 4)}
    assert line_rows({"a": (1, 2)}, counts) == [["a", 1, "2", 1, "2", "+0"], ["b", 0, "0", 2, "4", "+4"],
                                                ["**all**", 1, "2", 3, "6", "+4"]]
    assert json_differences(b'{"a": 1, "b": [1, {"c": 2}]}', b'{"a": 1, "b": [1, {"c": 3}], "d": 0}') == ["b.1.c", "d"]
    assert json_differences(b"x", b"{}") == ["(not JSON)"]
    built = (b'{"built_at": "2026-11-28T12:53:37+00:00", "pid": 5831, "sha256": "' + b"ab" * 32
             + b'", "build_seconds": 0.01, "k": 5}')
    other = (b'{"built_at": "2026-11-28T12:54:51+00:00", "pid": 42, "sha256": "' + b"cd" * 32
             + b'", "build_seconds": 0.0, "k": 5}')
    assert mask_run_fields("manifest.json", built) == mask_run_fields("manifest.json", other)
    assert mask_run_fields("m.json", built) != mask_run_fields("m.json", other.replace(b'"k": 5', b'"k": 6'))
    version = b'"version":"index:tfidf:2026-11-28T12:54:51+00:00:0b152b58a74f"'
    assert mask_run_fields("link.txt", version) == b'"version":"index:tfidf:<time>"'
    assert mask_run_fields("stdout.txt", b"in 0.3s") == b"in <seconds>" and mask_run_fields("a.ann", b"3s") == b"3s"
