"""Dense and hybrid index folders (tiny random encoder): manifest, exact rescoring, Linker over them."""

from __future__ import annotations

import numpy as np
import pytest

from index_tables import write_concepts
from linker.cli.main import main
from linker.errors import ConfigError
from linker.index import build_index, load_index
from linker.index.dense import DenseConfig
from linker.index.hybrid import HybridConfig
from linker.index.tfidf import TfidfConfig
from linker.link import Linker

pytestmark = pytest.mark.slow  # builds encoders and FAISS indexes: a few seconds


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_encoder_dir):
    folder = tmp_path_factory.mktemp("hybrid")
    table = write_concepts(folder / "concepts.parquet")
    dense = DenseConfig(encoder=str(tiny_encoder_dir), threads=1)
    build_index(table, kind="dense", out=folder / "dense", config=dense)
    build_index(table, kind="hybrid", out=folder / "hybrid", config=HybridConfig(dense=dense, sparse_weight=0.5))
    return folder


def test_dense_manifest_records_encoder_and_files(built, tiny_encoder_dir):
    index = load_index(built / "dense")
    manifest = index.manifest
    assert manifest["kind"] == "dense"
    assert manifest["encoder"]["name"] == str(tiny_encoder_dir) and manifest["encoder"]["dim"] == 32
    # The parameters as asked (auto decides again on a rebuild); the dense part records what auto chose.
    assert manifest["parameters"]["faiss_kind"] == "auto" and manifest["dense"]["faiss_kind"] == "flat"
    assert manifest["dense"]["storage"] == "fp32" and "15 names, at most" in manifest["dense"]["faiss_kind_chosen"]
    assert "dense/embeddings.npy" in manifest["files"] and "concepts.parquet" in manifest["files"]
    assert index.names.size == 15


def test_hybrid_manifest_has_both_parts(built):
    manifest = load_index(built / "hybrid").manifest
    assert manifest["parameters"]["sparse_weight"] == 0.5
    assert manifest["parameters"]["tfidf"]["ngram_max"] == TfidfConfig().ngram_max  # the tf-idf default, recorded
    assert {"tfidf/names.npz", "dense/embeddings.npy"} <= set(manifest["files"])


def test_hybrid_scores_are_exact_weighted_sums(built):
    index = load_index(built / "hybrid").names
    queries = ["thoracic pains", "vomito", "ЖЖЖ"]
    scores, rows = index.search(queries, 4)
    sparse = index.sparse.vectors(queries).toarray() @ index.sparse.matrix.toarray().T  # (q, names)
    dense = index.dense.encoder.encode(queries, role="query") @ np.asarray(index.dense.embeddings).T
    combined = 0.5 * sparse + dense
    for i in range(len(queries)):
        np.testing.assert_allclose(scores[i], combined[i, rows[i]], rtol=1e-4, atol=1e-5)
        assert (np.diff(scores[i]) <= 1e-6).all()
    # all rows of the union are distinct and valid
    assert all(len(set(r)) == 4 and (r >= 0).all() for r in rows)


def test_hybrid_finds_the_exact_name_first(built):
    [result] = Linker.load(built / "hybrid").link(["Thoracic pain"], k=2)
    assert result.candidates[0].concept_id == "10008479"
    assert result.candidates[0].matched_name == "Thoracic pain"


def test_dense_linker_gives_k_distinct_concepts(built):
    [result] = Linker.load(built / "dense").link(["ЖЖЖ"], k=3)
    ids = [c.concept_id for c in result.candidates]
    assert len(ids) == 3 == len(set(ids))  # dense always answers, unlike tf-idf
    keys = [(-c.score, c.concept_id) for c in result.candidates]
    assert keys == sorted(keys)


def test_negative_sparse_weight_is_refused():
    with pytest.raises(ConfigError, match="sparse_weight must be"):
        HybridConfig(sparse_weight=-1)


def test_cli_builds_hybrid(tmp_path, tiny_encoder_dir, capsys):
    table = write_concepts(tmp_path / "c.parquet")
    main(["index", "build", "--dict", str(table), "--kind", "hybrid", "--out", str(tmp_path / "h"),
          "--encoder", str(tiny_encoder_dir), "--faiss", "flat", "--sparse-weight", "2", "--threads", "1"])
    assert "hybrid index of 15 names of 7 concepts" in capsys.readouterr().out
    parameters = load_index(tmp_path / "h").manifest["parameters"]
    assert parameters["sparse_weight"] == 2.0
    assert parameters["tfidf"]["threads"] == 1 and parameters["dense"]["threads"] == 1


def test_cli_dense_storage_and_kind_options_reach_the_index(tmp_path, tiny_encoder_dir, capsys):
    table = write_concepts(tmp_path / "c.parquet")
    main(["index", "build", "--dict", str(table), "--kind", "dense", "--out", str(tmp_path / "d"),
          "--encoder", str(tiny_encoder_dir), "--faiss", "hnsw", "--storage", "fp16"])
    index = load_index(tmp_path / "d")
    assert index.manifest["dense"]["faiss_kind"] == "hnsw" and index.names.embeddings.dtype == np.float16


def test_cli_refuses_dense_options_for_a_tfidf_index_in_one_line(tmp_path, capsys):
    from conftest import assert_one_line_error, cli

    table = write_concepts(tmp_path / "c.parquet")
    code, err = cli(["index", "build", "--dict", table, "--kind", "tfidf", "--out", tmp_path / "t", "--engine", "ray",
                     "--workers", "2"], capsys)
    assert_one_line_error(code, err, "--engine, --workers: options of dense and hybrid indexes")
    assert not (tmp_path / "t").exists()
