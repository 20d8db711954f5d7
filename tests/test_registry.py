"""linker.registry: one style for sources, index kinds, dataset formats, output formats and encoder aliases."""

from __future__ import annotations

import logging

import pytest

from linker.errors import UnknownNameError
from linker.registry import Registry


def test_register_get_names_and_the_mapping_reads():
    things = Registry("thing")

    @things.register("b")
    def b():
        return "B"

    assert things.register("a", len) is len
    assert things.get("b") is b and things["a"] is len
    assert things.names() == ["a", "b"] and list(things) == ["b", "a"]  # sorted; iteration keeps registration order
    assert "a" in things and "c" not in things and len(things) == 2
    with pytest.raises(UnknownNameError, match=r"^unknown thing 'c'; available: a, b$"):
        things.get("c")
    with pytest.raises(KeyError):
        things["c"]


def test_a_name_taken_by_another_entry_is_refused():
    things = Registry("thing")
    things.register("a", len)
    things.register("a", len)  # the same entry again (a module imported twice) is harmless
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        things.register("a", max)


def test_load_runs_once_before_the_first_read_and_again_after_a_failure():
    calls = []

    def load():
        calls.append(1)
        if len(calls) == 1:
            raise ImportError("first try fails")
        things.register("late", "entry")
        assert things.names() == ["early", "late"]  # a read while loading does not load again

    things = Registry("thing", load=load)
    things.register("early", "x")  # registering never loads
    assert calls == []
    with pytest.raises(ImportError):
        things.names()
    assert things.get("late") == "entry" and len(calls) == 2
    assert things.names() == ["early", "late"] and len(calls) == 2


def test_the_five_pluggable_parts_are_registries():
    from linker.datasets import LOADERS, available_formats, parse_spec
    from linker.encoders import ENCODERS, resolve_encoder
    from linker.index import KINDS, available_kinds, get_kind
    from linker.normalize import FORMATS
    from linker.sources import SOURCES, available_sources, get_source

    for registry in (SOURCES, KINDS, LOADERS, FORMATS, ENCODERS):
        assert isinstance(registry, Registry)
    assert {"default", "icd10", "icdo", "meddra", "obo", "tsv", "umls"} <= set(available_sources())
    assert available_sources() == SOURCES.names() and get_source("tsv") is SOURCES.get("tsv")
    assert available_kinds() == ["dense", "hybrid", "tfidf"] and get_kind("tfidf").name == "tfidf"
    assert available_formats() == ["biosyn", "brat", "codiesp", "lay", "pubtator", "query", "tsv"]
    assert list(FORMATS) == ["jsonl", "brat", "ade-xml"]  # the order help texts show
    assert list(ENCODERS) == ["minilm", "e5-small", "multilingual-e5-small", "linker-en", "linker-multi"]
    assert resolve_encoder("multilingual-e5-small#cls").name == "e5-small#cls"
    for call, kind in ((lambda: get_source("mesh"), "source"), (lambda: get_kind("bm25"), "index kind"),
                       (lambda: parse_spec("conll:x.txt"), "dataset format"), (lambda: FORMATS.get("csv"), "input format")):
        with pytest.raises(UnknownNameError, match=f"^unknown {kind} "):
            call()


def test_encoding_engines_register_themselves_where_the_dense_build_looks():
    """`DenseConfig.engine` names an entry of `ENCODING_ENGINES`. The Ray engine lives above the index layer and
    registers itself (`linker.engine.encode`, imported by name on the first read: listing it needs no Ray)."""
    from linker.index.dense import ENCODING_ENGINES, DenseConfig, LocalEncoding, local_encoding

    assert isinstance(ENCODING_ENGINES, Registry) and list(ENCODING_ENGINES) == ["local", "ray"]
    from linker.engine.encode import RayEncoding

    assert ENCODING_ENGINES.get("local") is local_encoding and ENCODING_ENGINES.get("ray") is RayEncoding
    runner = ENCODING_ENGINES.get("local")(None, DenseConfig(batch_size=7, token_budget=99))
    assert isinstance(runner, LocalEncoding) and (runner.batch_size, runner.token_budget) == (7, 99)
    with pytest.raises(UnknownNameError, match=r"^unknown encoding engine 'spark'; available: local, ray$"):
        DenseConfig(engine="spark")


def test_normalize_path_dispatches_through_the_registry(tmp_path):
    from linker.errors import ConfigError
    from linker.normalize import normalize_path

    with pytest.raises(UnknownNameError, match="unknown input format 'csv'; available: ade-xml, brat, jsonl"):
        normalize_path(None, tmp_path / "in", tmp_path / "out", fmt="csv")
    with pytest.raises(ConfigError, match="--expand-abbreviations needs the documents"):
        normalize_path(None, tmp_path / "in", tmp_path / "out", fmt="jsonl", expand_abbreviations=True)


def test_normalize_formats_are_the_writers_that_name_a_normaliser():
    """An output format is added in one place, its WRITERS entry; `linker normalize`'s FORMATS are read from it."""
    from linker.formats.writers import WRITERS
    from linker.normalize import FORMATS

    assert {name: FORMATS.get(name) for name in FORMATS} == {
        name: WRITERS.get(name).normalize for name in WRITERS if WRITERS.get(name).normalize is not None}
    assert WRITERS.get("labels").normalize is None and WRITERS.get("parquet").normalize is None


def test_index_build_cli_makes_each_kinds_config_through_config_from_dict(monkeypatch, tmp_path):
    """`linker index build` reads no kind by name: the options become the kind's parameters, read back by
    the kind's own `config_from_dict`, the same config the options always made."""
    import dataclasses

    import linker.eval.tune as tune
    from linker.cli.main import main
    from linker.index.dense import DenseConfig
    from linker.index.hybrid import HybridConfig
    from linker.index.tfidf import PRESETS, TfidfConfig

    built = {}

    def build_index(dict_path, *, config, **options):
        built["config"] = config
        return {"counts": {"names": 0, "concepts": 0}, "build_seconds": 0.0}

    monkeypatch.setattr(tune, "build_index", build_index)  # what `linker index build` calls
    cases = [
        (["--kind", "tfidf", "--ngram", "2,4", "--threads", "1"],
         dataclasses.replace(TfidfConfig(), ngram_min=2, ngram_max=4, threads=1)),
        (["--preset", "medical-crossing", "--search", "exact"], dataclasses.replace(PRESETS["medical-crossing"], search="exact")),
        (["--kind", "dense", "--encoder", "minilm", "--faiss", "hnsw", "--precision", "fp32"],
         DenseConfig(encoder="minilm", faiss_kind="hnsw", precision="fp32")),
        (["--kind", "hybrid", "--encoder", "minilm", "--analyzer", "char", "--sparse-weight", "0.5"],
         HybridConfig(tfidf=TfidfConfig(analyzer="char"), dense=DenseConfig(encoder="minilm"), sparse_weight=0.5)),
    ]
    loggers = [logging.getLogger(name) for name in ("", "linker", "linker.progress")]
    levels = [logger.level for logger in loggers]
    try:
        for options, expected in cases:
            built.clear()
            main(["index", "build", "--dict", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "i"), *options])
            assert built["config"] == expected, options
    finally:  # the CLI sets log levels for its process; later tests capture the library's INFO lines
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def test_writers_and_extractors_are_registries_that_name_the_valid_choices(tmp_path):
    """Output writers (`linker.formats.writers.WRITERS`, filled where each is defined and loaded by module name on
    the first read) and extractors by a release's kind (`linker.extract.extractor.EXTRACTORS`)."""
    import json

    from linker.extract.extractor import EXTRACTORS, _load
    from linker.formats.writers import WRITERS

    assert isinstance(WRITERS, Registry) and isinstance(EXTRACTORS, Registry)
    assert WRITERS.names() == ["ade-xml", "brat", "jsonl", "labels", "parquet"]
    assert [WRITERS.get(n).folder for n in ("ade-xml", "brat", "jsonl", "labels", "parquet")] == [
        True, True, False, False, False]
    with pytest.raises(UnknownNameError, match=r"^unknown output format 'csv'; available: ade-xml, brat, jsonl, "):
        WRITERS.get("csv")
    assert EXTRACTORS.names() == ["tagger"]
    pytest.importorskip("torch")
    (tmp_path / "manifest.json").write_text(json.dumps({"kind": "ner", "files": {}}), encoding="utf-8")
    with pytest.raises(Exception, match=r"kind|manifest"):  # the release reader or the kind check refuses it
        _load(tmp_path, None)
