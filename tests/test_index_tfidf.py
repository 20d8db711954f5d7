"""tf-idf index: exact ids on the tiny fixture table, zero vectors, ties, persistence without pickle."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pytest

from index_tables import write_concepts
from linker.errors import ConfigError, UnknownNameError
from linker.index import build_index, load_index
from linker.index.tfidf import IDF, MATRIX, VOCABULARY, TfidfConfig, TfidfNameIndex, load_npz_mapped


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


@pytest.mark.parametrize("search", ["exact", "maxscore", "approximate"])
def test_matrix_is_memory_mapped_on_load_and_an_older_file_still_loads(tmp_path, search):
    """The saved matrix is an ordinary scipy .npz whose arrays a load maps read-only (pages shared by
    the processes of a machine); an .npz written by scipy itself (unaligned) is read into memory."""
    import random

    import scipy.sparse as sp

    rnd = random.Random(0)
    names = ["".join(rnd.choice("abcdefghij klmn") for _ in range(24)) for _ in range(3000)]  # a matrix > 64 KiB
    config = TfidfConfig(search=search)
    built = TfidfNameIndex.build(names, config)
    built.save(tmp_path / "new")
    mapped = load_npz_mapped(tmp_path / "new" / MATRIX)
    assert not (mapped.data.flags.writeable or mapped.indices.flags.writeable)  # (indptr: < 64 KiB, read)
    assert (mapped != sp.load_npz(tmp_path / "new" / MATRIX)).nnz == 0 and (mapped != built.matrix).nnz == 0

    shutil.copytree(tmp_path / "new", tmp_path / "old")
    sp.save_npz(tmp_path / "old" / MATRIX, built.matrix, compressed=False)  # as indexes were written before
    assert load_npz_mapped(tmp_path / "old" / MATRIX).data.flags.writeable  # read, not mapped

    queries = [*names[:20], "abc def", "zzz"]
    expected = built.search(queries, 3)
    for folder, is_mapped in ((tmp_path / "new", True), (tmp_path / "old", False)):
        loaded = TfidfNameIndex.load(folder, config)
        assert loaded.matrix.data.flags.writeable is not is_mapped
        got = loaded.search(queries, 3)
        np.testing.assert_array_equal(got[1], expected[1])
        np.testing.assert_array_equal(got[0], expected[0])


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


# ----------------------------------------------------------------------------- chunked build, shards, approximate search

NAMES = ["chest pain", "chest wall pain", "acute chest pain", "headache", "tension headache", "nausea",
         "nausea and vomiting", "pain in left arm", "arm pain", "chest pain, left", "fever", "fever of unknown origin"]


@pytest.mark.parametrize("config", [TfidfConfig(), TfidfConfig(analyzer="char", ngram_min=1, ngram_max=2),
                                    TfidfConfig(analyzer="char", ngram_min=2, ngram_max=4, sublinear_tf=True)])
def test_chunked_build_equals_scikit_learn(config, monkeypatch):
    from sklearn.feature_extraction.text import TfidfVectorizer

    from linker.index import tfidf as module
    from linker.text import normalize

    monkeypatch.setattr(module, "BUILD_CHUNK", 5)  # several chunks, the vocabulary growing across them
    index = TfidfNameIndex.build(NAMES, config)
    reference = TfidfVectorizer(analyzer=config.analyzer, ngram_range=(config.ngram_min, config.ngram_max),
                                lowercase=False, sublinear_tf=config.sublinear_tf)
    expected = reference.fit_transform([normalize(n, config.normalization) for n in NAMES]).toarray()
    columns = [index.vectorizer.vocabulary_[term] for term in reference.get_feature_names_out()]
    assert sorted(columns) == list(range(index.matrix.shape[1]))  # the same n-grams, in another order
    np.testing.assert_allclose(index.matrix.toarray()[:, columns], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(index.vectorizer.idf_[columns], reference.idf_, rtol=1e-6)


def test_sharded_search_is_exact(monkeypatch):
    from linker.index import tfidf as module

    queries = ["chest pain", "pain", "headache tension", "vomiting", "left arm pain", "ЖЖЖ"]
    whole_scores, whole_rows = TfidfNameIndex.build(NAMES).search(queries, 4)
    monkeypatch.setattr(module, "SHARD_NAMES", 3)
    index = TfidfNameIndex.build(NAMES)
    scores, rows = index.search(queries, 4)
    assert len(index.shards) == 4
    np.testing.assert_array_equal(rows, whole_rows)
    np.testing.assert_allclose(scores, whole_scores, rtol=1e-6)
    expected = index.matrix.toarray() @ index.vectors(queries).toarray().T
    for i in range(len(queries) - 1):
        np.testing.assert_allclose(scores[i], np.sort(expected[:, i])[::-1][:4], rtol=1e-5)


def test_approximate_search_rescores_candidates_exactly():
    exact = TfidfNameIndex.build(NAMES)
    approximate = TfidfNameIndex.build(NAMES, TfidfConfig(search="approximate", candidate_df=0.1))
    assert exact.exact and not approximate.exact
    queries = ["chest pain", "pain", "tension headache", "nausea vomiting", "fever unknown", "ЖЖЖ"]
    e_scores, e_rows = exact.search(queries, 3)
    a_scores, a_rows = approximate.search(queries, 3)
    np.testing.assert_array_equal(a_rows[:, 0], e_rows[:, 0])  # here every top-1 is found
    np.testing.assert_allclose(a_scores[:, 0], e_scores[:, 0], rtol=1e-5)
    # "pain": all its trigrams are in more than 10% of the names, yet its rarest still select candidates
    assert a_rows[1, 0] >= 0
    assert a_rows[5].tolist() == [-1, -1, -1]


def test_explain_lists_shared_ngrams_summing_to_the_score():
    index = TfidfNameIndex.build(NAMES)
    scores, rows = index.search(["chest wal pain"], 1)
    shared = index.explain("chest wal pain", NAMES[rows[0, 0]])
    assert {s.ngram for s in shared} >= {"che", "pai", " wa"}
    assert sum(s.contribution for s in shared) == pytest.approx(float(scores[0, 0]), rel=1e-5)
    assert [s.contribution for s in shared] == sorted((s.contribution for s in shared), reverse=True)
    assert index.explain("ЖЖЖ", "chest pain") == []


def test_preset_is_recorded_and_old_manifests_keep_their_setting(tmp_path):
    from linker.index.tfidf import PRESETS, get_preset

    table = write_concepts(tmp_path / "c.parquet")
    manifest = build_index(table, kind="tfidf", out=tmp_path / "mc", config=get_preset("medical-crossing"))
    assert manifest["parameters"]["preset"] == "medical-crossing" and manifest["parameters"]["ngram_max"] == 2
    assert load_index(tmp_path / "mc").names.config == PRESETS["medical-crossing"]
    with pytest.raises(UnknownNameError, match="tf-idf preset 'paper'; available: medical-crossing"):
        get_preset("paper")
    # An index written before the preset, normalisation and approximate-search fields existed
    # (the library then always used char 1-2 with the default normalisation).
    from linker.index.manifest import MANIFEST, write_manifest

    old = tmp_path / "mc"
    manifest = json.loads((old / MANIFEST).read_text())
    for key in ("preset", "normalization", "exact_max_names", "candidate_df", "search"):
        del manifest["parameters"][key]
    write_manifest(old, {k: v for k, v in manifest.items() if k != "files"})
    config = load_index(old).names.config
    assert (config.analyzer, config.ngram_min, config.ngram_max, config.normalization) == ("char", 1, 2, "default")


def test_words_normalisation_ignores_punctuation(tmp_path):
    """The capability suite's INV punctuation fix: "Aplasia/Hypoplasia ... toe(s)" and the same words without
    punctuation have the same n-grams (eval/capabilities/capabilities_fix.md)."""
    from linker.text import normalize

    assert normalize("Aplasia/Hypoplasia of the  toe(s), NOS", "words") == "aplasia hypoplasia of the toe s nos"
    assert normalize("Aplasia/Hypoplasia", "default") == "aplasia/hypoplasia"
    index = TfidfNameIndex.build(["Aplasia/Hypoplasia of the toes", "Hypoplasia of the toes"],
                                 TfidfConfig(analyzer="char", ngram_min=1, ngram_max=2, normalization="words"))
    scores, rows = index.search(["aplasia hypoplasia of the toes"], 2)
    assert rows[0].tolist() == [0, 1] and scores[0][0] == pytest.approx(1.0)


def _random_names(rng, count: int) -> list[str]:
    """Names of 1-4 words from a small syllable set: many shared n-grams, and duplicates (exact ties)."""
    syllables = ["ca", "ro", "ne", "pha", "li", "tis", "mo", "ur", "ex", "pain", "acu", "te"]
    words = ["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(60)]
    names = [" ".join(rng.choice(words, size=rng.integers(1, 5))) for _ in range(count)]
    return names + names[: count // 10]  # a tenth repeated: equal rows, equal scores


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_maxscore_search_equals_exact_search(seed):
    """Certified early termination: the same top-k rows and scores as the full product, equal scores
    ordered by row, over blocks of names (a small block size makes several)."""
    from linker.index.maxscore import MaxScoreSearcher

    rng = np.random.default_rng(seed)
    names = _random_names(rng, 3_000)
    exact = TfidfNameIndex.build(names, TfidfConfig(search="exact"))
    queries = [names[i] for i in rng.integers(0, len(names), 40)] + \
        [" ".join(rng.choice(names, size=2)) for _ in range(40)] + ["ЖЖЖ", "ca", "x"]
    vectors = exact.vectors(queries)
    # The reference: every name ranked (the full product keeps an arbitrary one of names tied at the
    # k-th place; over all names, ties are ordered by row)
    all_scores, all_rows = exact.search_vectors(vectors, len(names))
    for k in (1, 5, 40):
        e_scores, e_rows = all_scores[:, :k], all_rows[:, :k]
        for block_size, threads in ((1_000, 1), (4_096, 2)):
            searcher = MaxScoreSearcher(exact.matrix, exact.vectorizer.idf_, block_size=block_size)
            m_scores, m_rows, work = searcher.search_counted(vectors, k, threads)
            np.testing.assert_array_equal(m_rows, e_rows)
            np.testing.assert_array_equal(m_scores, e_scores)  # same sums in the same order: bit-identical
            # it did stop early: fewer postings read than the full product reads
            full = np.diff(searcher.postings.indptr)[vectors.indices].sum()
            assert work[:, 0].sum() < full
    # the index dispatches to it, and retrieve asks it for a smaller first fetch
    index = TfidfNameIndex.build(names, TfidfConfig(search="maxscore"))
    assert index.search_method == "maxscore" and index.exact and index.first_fetch(5) == 10
    np.testing.assert_array_equal(index.search(queries, 7)[1], all_rows[:, :7])


@pytest.mark.parametrize("seed", [0, 1])
def test_maxscore_concept_search_equals_retrieve_over_exact_search(seed):
    """maxscore's top-k concepts (each concept's best name, ties by row; concepts by score, then
    code) are `top_concepts` over the full product, with 1 thread and with 2 taking query blocks."""
    from linker.index.maxscore import QUERY_BLOCK, MaxScoreSearcher
    from linker.retrieve import ConceptIndex, top_concepts

    rng = np.random.default_rng(seed)
    names = _random_names(rng, 2_000)
    # several names per concept (synonyms), and repeated names under other concepts (ties between concepts)
    concept_ids = pa.array([f"C{rng.integers(0, 400):04d}" for _ in names])
    concepts = ConceptIndex(concept_ids)
    exact = TfidfNameIndex.build(names, TfidfConfig(search="exact"))
    queries = [names[i] for i in rng.integers(0, len(names), 40)] + \
        [" ".join(rng.choice(names, size=2)) for _ in range(40)] + ["ЖЖЖ", "ca", "x"]
    assert len(queries) > 4 * QUERY_BLOCK  # several blocks per thread
    vectors = exact.vectors(queries)
    for k in (1, 5, 12):
        want = top_concepts(exact, concepts, queries, k)
        results = {}
        for block_size, threads in ((500, 1), (500, 2), (4_096, 2)):
            searcher = MaxScoreSearcher(exact.matrix, exact.vectorizer.idf_, block_size=block_size)
            scores, rows = searcher.search(vectors, k, threads, concepts.codes)
            results[block_size, threads] = rows
            for hits, s, r in zip(want, scores, rows):
                found = r >= 0
                np.testing.assert_array_equal(r[found], hits.rows)
                np.testing.assert_array_equal(concepts.codes[r[found]], hits.concepts)
                np.testing.assert_array_equal(s[found], hits.scores)
        np.testing.assert_array_equal(results[500, 1], results[500, 2])  # threads: the same rows as one
    # the index answers retrieve's concept search itself (no mask), and retrieve widens with a mask
    index = TfidfNameIndex.build(names, TfidfConfig(search="maxscore"))
    assert index.searches_concepts and not exact.searches_concepts
    allowed = np.arange(len(names)) % 3 > 0
    for mask in (None, allowed):
        got = top_concepts(index, concepts, queries, 5, allowed=mask)
        want = top_concepts(exact, concepts, queries, 5, allowed=mask)
        for a, b in zip(got, want):
            for field in ("concepts", "rows", "scores"):
                np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_a_ray_actors_one_cpu_caps_the_search_threads(monkeypatch):
    import linker.index.tfidf as tfidf
    import linker.precision

    index = TfidfNameIndex.build(NAMES, TfidfConfig(threads=2))
    used, real = [], tfidf.sorted_top_n
    monkeypatch.setattr(tfidf, "sorted_top_n", lambda *a: used.append(a[3]) or real(*a))
    monkeypatch.setattr(tfidf, "MIN_ROWS_PER_THREAD", 1)  # two queries may use two threads
    monkeypatch.setattr(linker.precision, "available_cpus", lambda: 2)  # as on a 2-core machine
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    expected = index.search(["chest pain", "nausea"], 3)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # Ray's setting in an actor with num_cpus=1
    found = index.search(["chest pain", "nausea"], 3)
    assert used[0] == 2 and set(used[1:]) == {1}
    for a, b in zip(expected, found):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_thread_top_n_is_sparse_dot_topns_own_result(dtype):
    import scipy.sparse as sp
    from sparse_dot_topn import sp_matmul_topn

    import linker.index.tfidf as tfidf
    from linker.index.tfidf import sorted_top_n

    if not getattr(tfidf.sparse_dot_topn_core, "_has_openmp_support", False):
        pytest.skip("this sparse_dot_topn build has no OpenMP kernel: sorted_top_n is the library's API itself")
    rng = np.random.default_rng(0)
    names = sp.random(500, 300, density=0.03, format="csr", random_state=1, dtype=dtype)
    queries = sp.random(40, 300, density=0.05, format="csr", random_state=2, dtype=dtype)
    no_ngram = sp.csr_matrix((1, 300), dtype=dtype)  # a query with no known n-gram
    queries = sp.vstack([queries[:3], no_ngram, queries[3:]]).tocsr()
    names = sp.csr_matrix(names.T @ sp.diags(rng.random(500).astype(dtype)) @ names)  # ties and dense rows
    for top_n in (1, 7, 1000):
        expected = sp_matmul_topn(queries, names.T.tocsr(), top_n=top_n, sort=True, n_threads=1)
        found = sorted_top_n(queries, names.T.tocsr(), top_n, 1)
        for field in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(found, field), getattr(expected, field))
        assert found.shape == expected.shape and found.dtype == expected.dtype
    empty = sp.csr_matrix((2, 300), dtype=dtype)
    assert sorted_top_n(empty, names.T.tocsr(), 5, 1).nnz == 0


def test_search_method_is_chosen_by_size_and_recorded(tmp_path):
    assert TfidfNameIndex.build(NAMES).search_method == "exact"
    assert TfidfNameIndex.build(NAMES, TfidfConfig(exact_max_names=3)).search_method == "maxscore"
    with pytest.raises(UnknownNameError, match="tf-idf search 'fast'"):
        TfidfConfig(search="fast")
    table = write_concepts(tmp_path / "c.parquet")
    manifest = build_index(table, kind="tfidf", out=tmp_path / "a", config=TfidfConfig(exact_max_names=3))
    assert manifest["parameters"]["search"] == "auto" and manifest["search"] == "maxscore"
    index = load_index(tmp_path / "a")
    assert index.names.search_method == "maxscore"
    exact_dir = tmp_path / "e"
    assert build_index(table, kind="tfidf", out=exact_dir)["search"] == "exact"
    from linker.link import Linker

    mentions = ["chest pain", "head ache", "nausea and vomiting"]
    got = [[c.concept_id for c in r.candidates] for r in Linker.load(tmp_path / "a").link(mentions, k=3)]
    want = [[c.concept_id for c in r.candidates] for r in Linker.load(exact_dir).link(mentions, k=3)]
    assert got == want


# ----------------------------------------------------------------------------- maxscore postings stored at build time

def _postings_by_transpose(matrix, idf, block_size):
    """The postings as the searcher computed them at every load before they were stored: a copy of the rows by
    length, transposed (the reference that `build_postings`' one pass must equal, array for array)."""
    from linker.index.maxscore import Postings

    n = matrix.shape[0]
    original = np.argsort(np.diff(matrix.indptr), kind="stable").astype(np.int64)
    by_length = matrix[original]
    idf = idf.astype(np.float32)
    name_scale = np.zeros(n, dtype=np.float32)
    filled = np.diff(by_length.indptr) > 0
    name_scale[filled] = np.maximum.reduceat(by_length.data / idf[by_length.indices], by_length.indptr[:-1][filled])
    block_size = max(1, min(block_size, n))
    starts = range(0, n, block_size)
    block_ptr = np.empty((matrix.shape[1], len(starts) + 1), dtype=np.int64)
    for b, first in enumerate(starts):
        part = by_length.indices[by_length.indptr[first] : by_length.indptr[min(first + block_size, n)]]
        block_ptr[:, b + 1] = np.bincount(part, minlength=matrix.shape[1])
    postings = by_length.T.tocsr()
    postings.sort_indices()
    block_ptr[:, 0] = postings.indptr[:-1]
    np.cumsum(block_ptr, axis=1, out=block_ptr)
    max_weight = np.zeros(block_ptr[:, :-1].shape, dtype=np.float32)
    filled = block_ptr[:, 1:] > block_ptr[:, :-1]
    max_weight[filled] = np.maximum.reduceat(postings.data, block_ptr[:, :-1][filled])
    return Postings(original, postings.indices, postings.data, block_ptr, max_weight, name_scale, block_size)


@pytest.mark.parametrize("block_size", [1, 700, 4_096])
def test_postings_of_one_pass_equal_the_transposed_copy_and_search_alike(block_size):
    """`build_postings` (what a build stores) gives the arrays the searcher built at load before, so the old and
    the new searcher return the same rows, scores and work, bit for bit."""
    from linker.index.maxscore import ARRAYS, MaxScoreSearcher, build_postings

    rng = np.random.default_rng(3)
    names = _random_names(rng, 3_000) + ["", "ЖЖЖ"]  # an all-zero row: no postings, a bound of 0
    index = TfidfNameIndex.build(names, TfidfConfig(search="exact"))
    want = _postings_by_transpose(index.matrix, index.vectorizer.idf_, block_size)
    got = build_postings(index.matrix, index.vectorizer.idf_.astype(np.float32), block_size)
    assert got.block_size == want.block_size
    for field in ARRAYS:
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
        assert getattr(got, field).dtype == getattr(want, field).dtype, field
    queries = [names[i] for i in rng.integers(0, len(names), 60)] + ["ЖЖЖ", "ca", "x", ""]
    vectors = index.vectors(queries)
    codes = np.arange(len(names), dtype=np.int64) // 3  # three names a concept
    old = MaxScoreSearcher(index.matrix, index.vectorizer.idf_, postings=want)
    new = MaxScoreSearcher(index.matrix, index.vectorizer.idf_, block_size)
    for k, by_concept in ((1, None), (10, None), (5, codes)):
        for a, b in zip(old.search_counted(vectors, k, 2, by_concept), new.search_counted(vectors, k, 2, by_concept)):
            np.testing.assert_array_equal(a, b)


@pytest.fixture()
def maxscore_dir(tmp_path):
    """A tf-idf index that searches with maxscore (the fixture table is above `exact_max_names`)."""
    build_index(write_concepts(tmp_path / "concepts.parquet"), kind="tfidf", out=tmp_path / "ms",
                config=TfidfConfig(exact_max_names=3))
    return tmp_path / "ms"


def test_postings_are_stored_listed_and_mapped_at_load(maxscore_dir, index_dir):
    from linker.index.maxscore import ARRAYS
    from linker.index.tfidf import POSTINGS, POSTINGS_PARAMS

    manifest = json.loads((maxscore_dir / "manifest.json").read_text())
    stored = {f"{POSTINGS}/{field}.npy" for field in ARRAYS} | {POSTINGS_PARAMS}
    assert stored <= set(manifest["files"])  # sizes and checksums verified at load like every file
    assert not (index_dir / POSTINGS).exists()  # an exact index (below exact_max_names) stores none
    loaded = load_index(maxscore_dir).names
    postings = loaded.maxscore_searcher.postings
    assert all(isinstance(getattr(postings, field), np.memmap) for field in ARRAYS)
    assert not postings.names.flags.writeable
    built = TfidfNameIndex.build(load_index(maxscore_dir).concepts.table.column("name").to_pylist(),
                                 TfidfConfig(exact_max_names=3))  # postings computed in memory
    queries = ["thoracic pains", "vomito", "cefalea tensional", "ЖЖЖ"]
    for a, b in zip(loaded.search(queries, 4), built.search(queries, 4)):
        np.testing.assert_array_equal(a, b)


def test_an_index_built_before_the_postings_were_stored_still_loads(maxscore_dir, caplog):
    from linker.index.manifest import MANIFEST, write_manifest
    from linker.index.tfidf import POSTINGS

    queries = ["thoracic pains", "vomito", "cefalea tensional"]
    want = load_index(maxscore_dir).names.search(queries, 4)
    shutil.rmtree(maxscore_dir / POSTINGS)
    manifest = json.loads((maxscore_dir / MANIFEST).read_text())
    write_manifest(maxscore_dir, {k: v for k, v in manifest.items() if k != "files"})
    with caplog.at_level("INFO", logger="linker.index.tfidf"):
        names = load_index(maxscore_dir).names
    assert "rebuild the index to start faster" in caplog.text
    assert not isinstance(names.maxscore_searcher.postings.names, np.memmap)  # computed at load, as before
    for a, b in zip(names.search(queries, 4), want):
        np.testing.assert_array_equal(a, b)


def _edit_npy(path, change):
    array = np.load(path)
    array = change(array)
    np.save(path, array, allow_pickle=False)


@pytest.mark.parametrize(("file", "change", "message"), [
    ("names", lambda a: np.where(np.arange(len(a)) == 5, 10**6, a).astype(a.dtype), "name numbers in 0..14"),
    ("names", lambda a: np.where(np.arange(len(a)) == 2, -1, a).astype(a.dtype), "-1 at position 2"),
    ("weights", lambda a: np.where(np.arange(len(a)) == 3, np.nan, a).astype(a.dtype), "weights in (0, 1]"),
    ("weights", lambda a: np.where(np.arange(len(a)) == 3, 0, a).astype(a.dtype), "weights in (0, 1]"),
    ("block_ptr", lambda a: a[::-1].copy(), "pointers that never decrease"),
    ("block_ptr", lambda a: a + 1, "pointers that never decrease"),
    ("order", lambda a: np.zeros_like(a), "each row 0..14 once"),
    ("order", lambda a: a[:-1], "of shape (15,)"),
    ("name_scale", lambda a: np.full_like(a, np.inf), "finite bounds"),
    ("max_weight", lambda a: a.astype(">f4"), "dtype"),
    ("names", lambda a: a.astype(np.float32), "dtype kind i/u"),
])
def test_damaged_or_hostile_postings_are_refused_in_one_line(maxscore_dir, file, change, message):
    """The stored postings are checked at load in one pass, so that no search reads outside its arrays: a bad
    array is refused naming its file (the manifest's checksums would refuse it first; here they are bypassed)."""
    from linker.errors import InputFormatError
    from linker.index.tfidf import POSTINGS

    config = load_index(maxscore_dir).names.config
    _edit_npy(maxscore_dir / POSTINGS / f"{file}.npy", change)
    with pytest.raises(InputFormatError) as error:
        TfidfNameIndex.load(maxscore_dir, config)
    text = str(error.value)
    assert f"{POSTINGS}/{file}.npy" in text and message in text and "\n" not in text


@pytest.mark.parametrize("params", ['{"block_size": 0}', '{"block_size": true}', '{"block_size": 5}', "[]"])
def test_a_bad_block_size_is_refused(maxscore_dir, params):
    from linker.errors import InputFormatError
    from linker.index.tfidf import POSTINGS_PARAMS

    config = load_index(maxscore_dir).names.config
    (maxscore_dir / POSTINGS_PARAMS).write_text(params)
    with pytest.raises(InputFormatError, match="maxscore"):
        TfidfNameIndex.load(maxscore_dir, config)


def test_postings_written_a_slice_at_a_time_equal_those_held(maxscore_dir, monkeypatch, tmp_path):
    """A build writes the postings to their files a slice of n-grams at a time (a pass over the rows each), so
    that it does not hold them all: the files hold what one pass computes."""
    from linker.index import maxscore
    from linker.index.tfidf import POSTINGS

    index = load_index(maxscore_dir).names
    want = maxscore.build_postings(index.matrix, index.vectorizer.idf_)
    monkeypatch.setattr(maxscore, "SLICE_POSTINGS", 40)  # the fixture's ~400 postings in about ten slices
    index.save(tmp_path / "again")
    for field in maxscore.ARRAYS:
        np.testing.assert_array_equal(np.load(tmp_path / "again" / POSTINGS / f"{field}.npy"), getattr(want, field))
    assert (np.load(tmp_path / "again" / POSTINGS / "names.npy").dtype == want.names.dtype)
