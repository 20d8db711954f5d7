"""tf-idf index: exact ids on the tiny fixture table, zero vectors, ties, persistence without pickle."""

from __future__ import annotations

import json

import numpy as np
import pytest

from index_tables import write_concepts
from linker.errors import ConfigError, UnknownNameError
from linker.index import build_index, load_index
from linker.index.tfidf import IDF, MATRIX, VOCABULARY, TfidfConfig, TfidfNameIndex


@pytest.fixture()
def index_dir(tmp_path):
    build_index(write_concepts(tmp_path / "concepts.parquet"), kind="tfidf", out=tmp_path / "idx")
    return tmp_path / "idx"


def test_search_returns_exact_name_rows_best_first():
    index = TfidfNameIndex.build(["chest pain", "headache", "chest wall pain", "nausea"])
    scores, rows = index.search(["chest pain", "head ache"], 2)
    assert rows.tolist() == [[0, 2], [1, 0]]
    assert scores[0, 0] == pytest.approx(1.0, abs=1e-6)
    assert scores[0, 0] > scores[0, 1] > 0


def test_mention_without_known_ngram_gets_no_rows():
    index = TfidfNameIndex.build(["chest pain", "nausea"])
    scores, rows = index.search(["ЖЖЖ", "nausea"], 3)
    assert rows[0].tolist() == [-1, -1]  # k is capped at the 2 names
    assert scores[0].tolist() == [0.0, 0.0]
    assert rows[1, 0] == 1


def test_fewer_matches_than_k_are_padded():
    index = TfidfNameIndex.build(["abc", "xyz", "abd"])
    scores, rows = index.search(["ab"], 3)
    assert rows[0].tolist()[2] == -1 and sorted(rows[0, :2].tolist()) == [0, 2]


def test_chunked_queries_give_the_same_result():
    names = ["chest pain", "headache", "nausea", "vomiting", "fever", "cough"]
    queries = ["chest", "head", "vomit", "feverish", "coughing", "pain"] * 3
    whole = TfidfNameIndex.build(names, TfidfConfig(query_chunk=1000)).search(queries, 3)
    chunked = TfidfNameIndex.build(names, TfidfConfig(query_chunk=4)).search(queries, 3)
    np.testing.assert_array_equal(whole[1], chunked[1])
    np.testing.assert_allclose(whole[0], chunked[0])


def test_scores_match_a_dense_cosine():
    names = ["chest pain", "chest wall pain", "thoracic pain", "headache"]
    index = TfidfNameIndex.build(names)
    q = index.vectors(["chest pains"]).toarray()
    expected = (index.matrix.toarray() @ q.T).ravel()
    scores, rows = index.search(["chest pains"], 4)
    np.testing.assert_allclose(scores[0], expected[rows[0]], rtol=1e-5)
    assert list(rows[0]) == list(np.argsort(-expected, kind="stable"))


def test_char_wb_and_ngram_range_are_recorded_and_reused(tmp_path):
    config = TfidfConfig(analyzer="char_wb", ngram_min=2, ngram_max=3)
    manifest = build_index(write_concepts(tmp_path / "c.parquet"), kind="tfidf", out=tmp_path / "idx", config=config)
    assert manifest["parameters"]["analyzer"] == "char_wb"
    assert (manifest["parameters"]["ngram_min"], manifest["parameters"]["ngram_max"]) == (2, 3)
    loaded = load_index(tmp_path / "idx")
    assert loaded.names.config == config
    assert " he" in loaded.names.vectorizer.vocabulary_  # a word-boundary trigram


def test_persisted_files_load_without_pickle(index_dir):
    vocabulary = json.loads((index_dir / VOCABULARY).read_text())
    idf = np.load(index_dir / IDF, allow_pickle=False)
    with np.load(index_dir / MATRIX, allow_pickle=False) as npz:
        assert set(npz.files) >= {"data", "indices", "indptr", "shape"}
    assert len(vocabulary) == idf.shape[0]


def test_reloaded_index_scores_like_the_built_one(tmp_path, index_dir):
    names = load_index(index_dir).concepts.table.column("name").to_pylist()
    built = TfidfNameIndex.build(names)
    loaded = load_index(index_dir).names
    queries = ["thoracic pains", "vomito", "cefalea tensional"]
    np.testing.assert_array_equal(built.search(queries, 4)[1], loaded.search(queries, 4)[1])
    np.testing.assert_allclose(built.search(queries, 4)[0], loaded.search(queries, 4)[0], rtol=1e-6)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"analyzer": "word"}, UnknownNameError),
        ({"ngram_min": 3, "ngram_max": 2}, ConfigError),
        ({"ngram_min": 0}, ConfigError),
        ({"normalization": "stem"}, UnknownNameError),
    ],
)
def test_bad_config_is_refused(options, error):
    with pytest.raises(error):
        TfidfConfig(**options)


def test_unknown_kind_lists_choices(tmp_path):
    with pytest.raises(UnknownNameError, match="available: dense, hybrid, tfidf"):
        build_index(write_concepts(tmp_path / "c.parquet"), kind="bm25", out=tmp_path / "idx")
