"""linker.index.dense: exact and approximate FAISS search, save/load, resumable encoding."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from linker.encoders import load_encoder
from linker.errors import ConfigError, IndexMismatchError, UnknownNameError
from linker.index.dense import PROGRESS, DenseConfig, DenseNameIndex, dense_kind, partial_dir

NAMES = (Path(__file__).parent / "fixtures" / "dense" / "names.txt").read_text(encoding="utf-8").splitlines()
HEADACHE, HEADACHE_AGAIN = 4, 34  # the fixture lists "headache" twice


@pytest.fixture(scope="module")
def encoder(tiny_encoder_dir):
    return load_encoder(str(tiny_encoder_dir))


def config(**options) -> DenseConfig:
    # Tiny-model settings: 32-d vectors, so 8 PQ sub-quantisers of 4 dims and 16 centroids each.
    return DenseConfig(**{"encoder": "tiny", "chunk_rows": 8, "pq_m": 8, "pq_nbits": 4, **options})


@pytest.fixture(scope="module")
def flat(encoder):
    return DenseNameIndex.build(NAMES, encoder, config())


def test_fixture_has_the_duplicate_the_tie_tests_rely_on():
    assert NAMES[HEADACHE] == NAMES[HEADACHE_AGAIN] == "headache" and len(NAMES) == 35


def test_flat_finds_every_name_itself_and_breaks_ties_by_row(flat):
    scores, rows = flat.search(NAMES, 2)
    assert scores.dtype == np.float32 and rows.dtype == np.int64 and rows.shape == (35, 2)
    expected = [HEADACHE if i == HEADACHE_AGAIN else i for i in range(35)]
    assert rows[:, 0].tolist() == expected
    assert rows[HEADACHE].tolist() == [HEADACHE, HEADACHE_AGAIN]
    assert rows[HEADACHE_AGAIN].tolist() == [HEADACHE, HEADACHE_AGAIN]
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    assert (scores[:, 0] >= scores[:, 1]).all()


def test_more_hits_asked_than_names_pads_with_minus_one(encoder):
    index = DenseNameIndex.build(NAMES[:3], encoder, config())
    scores, rows = index.search(["hair loss"], 5)
    assert rows[0, 0] == 0 and rows[0, 3:].tolist() == [-1, -1]
    assert sorted(rows[0, :3].tolist()) == [0, 1, 2]
    assert np.isneginf(scores[0, 3:]).all()


def test_no_queries_and_bad_k(flat):
    scores, rows = flat.search([], 3)
    assert scores.shape == rows.shape == (0, 3)
    with pytest.raises(ConfigError, match="k must be >= 1"):
        flat.search(["fever"], 0)


def test_config_is_validated():
    with pytest.raises(UnknownNameError, match="available: auto, flat, hnsw, ivf-pq, ivf-pqfs, ivf-sq8"):
        DenseConfig(faiss_kind="lsh")
    with pytest.raises(ConfigError, match="batch_size"):
        DenseConfig(batch_size=0)


def test_empty_names_are_refused(encoder):
    with pytest.raises(ConfigError, match="at least one name"):
        DenseNameIndex.build([], encoder, config())


@pytest.mark.parametrize("kind", ["hnsw", "ivf-sq8", "ivf-pq", "ivf-pqfs"])
def test_approximate_kinds_record_recall_and_rerank_exactly(encoder, flat, kind):
    # rerank_factor 12: IVF re-scores 3 + 3 * 12 + 1 >= 35 candidates, i.e. every name, exactly (from fp32
    # vectors here: fp16 storage, the IVF default, is exact only to ~1e-4, test_auto_kind_...).
    index = DenseNameIndex.build(NAMES, encoder, config(faiss_kind=kind, rerank_factor=12, storage="fp32"))
    recall = index.params["recall"]
    assert recall["sample"] == 35
    # 35 names: HNSW's efSearch (128) visits all of them and IVF has a single list (35 < 2 * 39),
    # so the approximate search is exhaustive and must agree with exact search.
    assert recall["recall_at_1"] == 1.0 and recall["recall_at_10"] == 1.0
    scores, rows = index.search(NAMES[:10], 3)
    exact_scores, exact_rows = flat.search(NAMES[:10], 3)
    assert rows.tolist() == exact_rows.tolist()
    # hnsw stores full vectors; IVF scores are re-ranked from the float embeddings.
    np.testing.assert_allclose(scores, exact_scores, atol=1e-5)


def test_ivf_pq_without_rerank_returns_approximate_scores(encoder, flat):
    index = DenseNameIndex.build(NAMES, encoder, config(faiss_kind="ivf-pq", rerank=False, recall_sample=0))
    assert "recall" not in index.params
    scores, _ = index.search(NAMES[:10], 1)
    exact_scores, _ = flat.search(NAMES[:10], 1)
    assert not np.allclose(scores, exact_scores, atol=1e-5)


def test_product_codes_take_a_byte_per_8_dimensions_and_the_head_of_a_search_gets_the_most_candidates():
    from linker.index.dense import candidates, pq_shape

    for dim, pq, fast in ((384, (48, 8), (96, 4)), (32, (4, 8), (8, 4))):
        assert pq_shape(DenseConfig(faiss_kind="ivf-pq"), dim) == pq
        assert pq_shape(DenseConfig(faiss_kind="ivf-pqfs"), dim) == fast
    assert pq_shape(DenseConfig(faiss_kind="ivf-pqfs", pq_m=48, pq_nbits=8), 384) == (48, 4)  # fast scan: 4 bits
    # 8 extra candidates for each of the first 20 hits, one for each hit after (retrieve's 40, 160 and 640)
    assert [candidates(DenseConfig(), k) for k in (1, 5, 20, 40, 160, 640)] == [9, 45, 180, 200, 320, 800]


def test_ivf_pq_needs_a_dividing_pq_m(encoder):
    with pytest.raises(ConfigError, match="must divide the encoder dimension 32"):
        DenseNameIndex.build(NAMES, encoder, config(faiss_kind="ivf-pq", pq_m=5))


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf-pq", "ivf-pqfs"])
def test_save_load_round_trip_gives_identical_results(encoder, tmp_path, kind):
    index = DenseNameIndex.build(NAMES, encoder, config(faiss_kind=kind))
    params = index.save(tmp_path)
    expected_files = {"embeddings.npy", "params.json"} | ({"index.faiss"} if kind != "flat" else set())
    assert {p.name for p in (tmp_path / "dense").iterdir()} == expected_files
    assert params["encoder"] == {
        "name": encoder.spec.name, "path": encoder.spec.path, "revision": encoder.spec.revision, "dim": 32
    }
    assert json.loads((tmp_path / "dense" / "params.json").read_text()) == params
    loaded = DenseNameIndex.load(tmp_path, params, encoder)
    queries = ["hair loss", "heart attack", "vertigo", "haaruitval"]
    for got, want in zip(loaded.search(queries, 5), index.search(queries, 5), strict=True):
        assert np.array_equal(got, want)
    # params.json alone is enough to load (the encoder is reloaded by its recorded name).
    assert np.array_equal(DenseNameIndex.load(tmp_path, None, encoder).search(queries, 5)[1], loaded.search(queries, 5)[1])


def test_load_refuses_another_encoder(encoder, tiny_e5_encoder_dir, tmp_path):
    DenseNameIndex.build(NAMES, encoder, config()).save(tmp_path)
    other = load_encoder(str(tiny_e5_encoder_dir))
    with pytest.raises(IndexMismatchError, match="load it with the same encoder or rebuild"):
        DenseNameIndex.load(tmp_path, None, other)


class FlakyEncoder:
    """Wraps an encoder; counts encoded texts and raises after `fail_after` calls."""

    def __init__(self, inner, fail_after: int | None = None) -> None:
        self.inner, self.fail_after, self.calls, self.texts = inner, fail_after, 0, 0
        self.spec, self.dim = inner.spec, inner.dim

    def __getattr__(self, name):  # precision, max_length, last_stats: the inner encoder's
        return getattr(self.inner, name)

    def encode(self, texts, **options):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated interruption")
        self.calls += 1
        self.texts += len(texts)
        return self.inner.encode(texts, **options)


def test_interrupted_encoding_resumes_where_it_stopped(encoder, flat, tmp_path):
    work = tmp_path / "work"
    with pytest.raises(KeyboardInterrupt):
        DenseNameIndex.build(NAMES, FlakyEncoder(encoder, fail_after=2), config(), work_dir=work)
    assert len(json.loads((work / PROGRESS).read_text())["done"]) == 2  # two chunks of 8

    counting = FlakyEncoder(encoder)
    resumed = DenseNameIndex.build(NAMES, counting, config(), work_dir=work)
    assert counting.texts == 35 - 16
    np.testing.assert_allclose(resumed.embeddings, flat.embeddings, atol=1e-6)
    assert np.array_equal(resumed.search(NAMES, 3)[1], flat.search(NAMES, 3)[1])


def _killed_after_one_chunk(encoder, work) -> dict:
    with pytest.raises(KeyboardInterrupt):
        DenseNameIndex.build(NAMES, FlakyEncoder(encoder, fail_after=1), config(), work_dir=work)
    return json.loads((work / PROGRESS).read_text())


@pytest.mark.parametrize("tamper, trusted", [
    # the probe's edit: every chunk listed done, as the old list without sha256
    (lambda saved, vectors: {**saved, "done": [0, 1, 2, 3, 4]}, 0),
    # every chunk listed with the one real digest: only the chunk that holds those vectors is trusted
    (lambda saved, vectors: {**saved, "done": {str(c): saved["done"]["0"] for c in range(5)}}, 8),
    # the finished chunk's vectors overwritten (zeros), its digest left as it was
    (lambda saved, vectors: vectors.__setitem__(slice(None), 0) or saved, 0),
])
def test_a_tampered_work_folder_is_encoded_again_not_trusted(encoder, flat, tmp_path, caplog, tamper, trusted):
    # The level set here: an earlier in-process CLI run leaves the root logger at its own level (ERROR under -q).
    caplog.set_level(logging.WARNING, logger="linker")
    work = tmp_path / "work"
    saved = _killed_after_one_chunk(encoder, work)
    assert list(saved["done"]) == ["0"] and len(saved["done"]["0"]) == 64  # chunk 0 with the sha256 of its vectors
    vectors = np.load(work / "embeddings.npy", mmap_mode="r+")
    saved = tamper(saved, vectors)
    vectors.flush()
    del vectors
    (work / PROGRESS).write_text(json.dumps(saved))
    counting = FlakyEncoder(encoder)
    resumed = DenseNameIndex.build(NAMES, counting, config(), work_dir=work)
    assert counting.texts == 35 - trusted
    assert "do not match the sha256 recorded when they were written" in caplog.text
    assert np.all(np.linalg.norm(resumed.embeddings, axis=1) > 0.5)  # no zero vector
    np.testing.assert_allclose(resumed.embeddings, flat.embeddings, atol=1e-6)


def test_cli_dense_build_resumed_from_a_tampered_work_folder_has_no_zero_vectors(tiny_encoder_dir, tmp_path,
                                                                                 monkeypatch, capsys):
    """`linker index build --kind dense` killed after its first chunk, every chunk then marked done in progress.json:
    the rerun encodes them again instead of shipping their zero vectors."""
    from conftest import cli

    from linker.dictionary import SourceSpec, build_dictionary
    from linker.index import dense, load_index

    tsv = tmp_path / "names.tsv"
    tsv.write_text("concept_id\tname\n" + "".join(f"C{i:03d}\t{n}\n" for i, n in enumerate(NAMES)), encoding="utf-8")
    build_dictionary([SourceSpec("tsv", (tsv,))], tmp_path / "dict.parquet")
    chunked = dense.length_chunks
    monkeypatch.setattr(dense, "length_chunks", lambda names, rows: chunked(names, 8))  # 5 chunks of the 35 names
    run = dense.LocalEncoding.run

    def killed(self, jobs, advance):
        for item in run(self, jobs, advance):
            yield item
            raise KeyboardInterrupt  # as a kill after the first chunk was written

    monkeypatch.setattr(dense.LocalEncoding, "run", killed)
    args = ["index", "build", "--dict", tmp_path / "dict.parquet", "--kind", "dense", "--encoder", tiny_encoder_dir,
            "--precision", "fp32", "--out", tmp_path / "ix"]
    assert cli(args, capsys)[0] == 130
    progress = next(tmp_path.glob(".dense-partial-*")) / PROGRESS
    saved = json.loads(progress.read_text())
    progress.write_text(json.dumps({**saved, "done": {str(c): saved["done"]["0"] for c in range(5)}}))
    monkeypatch.setattr(dense.LocalEncoding, "run", run)
    code, err = cli(args, capsys)
    assert code == 0, err
    index = load_index(tmp_path / "ix")
    vectors = np.asarray(index.names.embeddings, dtype=np.float32)
    assert vectors.shape == (35, 32) and np.all(np.linalg.norm(vectors, axis=1) > 0.5)
    assert index.manifest["dense"]["encoding"]["resumed_at"] == 8  # chunk 0 alone was trusted


def test_other_names_do_not_resume_a_stale_work_folder(encoder, tmp_path):
    work = tmp_path / "work"
    with pytest.raises(KeyboardInterrupt):
        DenseNameIndex.build(NAMES, FlakyEncoder(encoder, fail_after=1), config(), work_dir=work)
    counting = FlakyEncoder(encoder)
    DenseNameIndex.build(NAMES[::-1], counting, config(), work_dir=work)
    assert counting.texts == 35


def test_saving_moves_the_work_embeddings_into_the_index(encoder, tmp_path):
    work = tmp_path / "work"
    index = DenseNameIndex.build(NAMES, encoder, config(), work_dir=work)
    index.save(tmp_path / "index")
    assert not (work / "embeddings.npy").exists() and not (work / PROGRESS).exists()
    assert index.search(["fever"], 1)[1][0, 0] == NAMES.index("fever")


def test_dense_kind_builds_and_loads_an_index_folder(tiny_encoder_dir, tmp_path):
    kind = dense_kind()
    cfg = DenseConfig(encoder=str(tiny_encoder_dir), chunk_rows=8)
    assert kind.config_from_dict(json.loads(json.dumps(cfg.__dict__))) == cfg
    folder = tmp_path / "index.tmp"
    folder.mkdir()
    extra = kind.build(NAMES, cfg, folder)
    assert extra["encoder"]["dim"] == 32 and extra["dense"]["rows"] == 35
    encoder = load_encoder(str(tiny_encoder_dir))
    assert not partial_dir(tmp_path, NAMES, encoder).exists()  # the work folder is cleaned up
    index = kind.load(folder, cfg, {})
    assert index.size == 35 and index.kind == "dense"
    assert index.search(["vertigo"], 1)[1][0, 0] == NAMES.index("vertigo")


def test_a_relative_encoder_path_reloads_from_another_directory(tiny_encoder_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_encoder_dir.parent)
    encoder = load_encoder(tiny_encoder_dir.name)
    DenseNameIndex.build(NAMES, encoder, config(encoder=tiny_encoder_dir.name)).save(tmp_path)
    monkeypatch.chdir(tmp_path)
    loaded = DenseNameIndex.load(tmp_path)  # the encoder comes back by its recorded absolute folder
    assert loaded.encoder.spec.path == str(tiny_encoder_dir.resolve())
    assert loaded.search(["fever"], 1)[1][0, 0] == NAMES.index("fever")


def test_equal_name_vectors_score_equal_wherever_they_are_stored(encoder):
    # FAISS's flat search is a blocked matrix product: copies of one vector stored in different
    # places come back a few ulps apart for some queries of a large batch (seen with 960 queries),
    # and their tie then fell by position. Re-scored one pair at a time, they score equal and the
    # tie goes by row in every build.
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((5000, 384)).astype(np.float32)
    copies = np.arange(7, 5000, 97)
    vectors[copies] = vectors[7]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = (vectors[7] + 0.03 * rng.standard_normal((960, 384))).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    index = DenseNameIndex(encoder, config(), vectors)
    scores, rows = index.search_vectors(queries, len(copies))
    assert rows.tolist() == [copies.tolist()] * len(queries)
    assert (scores == scores[:, :1]).all()


def test_auto_kind_is_flat_for_small_dictionaries_and_ivf_pqfs_with_fp16_vectors_above(encoder, flat, tmp_path, monkeypatch):
    assert DenseConfig().faiss_kind == "auto" and flat.config.faiss_kind == "flat" and flat.embeddings.dtype == np.float32
    assert "auto: 35 names, at most" in flat.params["faiss_kind_chosen"]
    import linker.index.dense as dense

    monkeypatch.setattr(dense, "AUTO_FLAT_MAX_NAMES", 10)
    index = DenseNameIndex.build(NAMES, encoder, config(rerank_factor=12))
    assert (index.config.faiss_kind, index.config.storage) == ("ivf-pqfs", "fp16")
    assert (index.params["pq_m"], index.params["pq_nbits"]) == (8, 4)  # config(): 8 sub-quantisers
    assert "more than 10" in index.params["faiss_kind_chosen"] and index.params["recall"]["recall_at_1"] >= 0.9
    params = index.save(tmp_path)
    loaded = DenseNameIndex.load(tmp_path, params, encoder)
    assert loaded.embeddings.dtype == np.float16 and isinstance(loaded.embeddings, np.memmap)
    # fp16 storage moves a cosine by ~1e-4 (atol), and re-scoring keeps the exact order of the flat index.
    got, want = loaded.search(NAMES[:10], 3), flat.search(NAMES[:10], 3)
    np.testing.assert_allclose(got[0], want[0], atol=2e-3)
    assert np.array_equal(got[1][:, 0], want[1][:, 0])


def test_load_refuses_vectors_stored_in_another_dtype(encoder, tmp_path):
    params = DenseNameIndex.build(NAMES, encoder, config(storage="fp16")).save(tmp_path)
    path = tmp_path / "dense" / "embeddings.npy"
    np.save(path, np.load(path).astype(np.float32))
    with pytest.raises(Exception, match="fp16 name embeddings .* found dtype float32"):
        DenseNameIndex.load(tmp_path, params, encoder)


def test_ray_engine_encodes_the_same_chunks_and_resumes_a_local_partial_build(encoder, flat, tmp_path, ray_cluster):
    from linker.engine.encode import RayEncoding

    work = tmp_path / "work"
    with pytest.raises(KeyboardInterrupt):  # a driver killed after two chunks of 8
        DenseNameIndex.build(NAMES, FlakyEncoder(encoder, fail_after=2), config(), work_dir=work)
    options = config(engine="ray", workers=2)
    index = DenseNameIndex.build(NAMES, encoder, options, work_dir=work, runner=RayEncoding(encoder, options))
    encoding = index.params["encoding"]
    assert (encoding["resumed_at"], encoding["names_encoded"]) == (16, 35 - 16)
    assert encoding["engine"] == {"engine": "ray", "workers": 2, "address": "local"}
    # Same chunks, same model, one thread per actor: equal up to rounding, and the same answers.
    np.testing.assert_allclose(index.embeddings, flat.embeddings, atol=1e-5)
    assert np.array_equal(index.search(NAMES, 5)[1], flat.search(NAMES, 5)[1])


def test_ray_options_need_the_ray_engine():
    with pytest.raises(ConfigError, match="options of engine 'ray'"):
        DenseConfig(workers=2)
    with pytest.raises(UnknownNameError):
        DenseConfig(engine="spark")


def test_builds_batch_by_a_smaller_token_budget_with_the_same_vectors(encoder, flat):
    from linker.encoders import TOKEN_BUDGET
    from linker.index.dense import BUILD_TOKEN_BUDGET

    assert DenseConfig().token_budget == BUILD_TOKEN_BUDGET < TOKEN_BUDGET
    # 3 tokens a batch at most: every name is a batch of its own, so padding and batch shapes all differ
    small = DenseNameIndex.build(NAMES, encoder, config(token_budget=3))
    np.testing.assert_allclose(small.embeddings, flat.embeddings, atol=1e-6)
    assert small.params["encoding"]["padded_tokens"] == small.params["encoding"]["tokens"]


def test_auto_compiles_bf16_builds_only(monkeypatch):
    from linker import encoders

    monkeypatch.setattr(encoders.shutil, "which", lambda name: "/usr/bin/g++" if name == "g++" else None)
    assert encoders.should_compile("auto", 10**6, "bf16")
    assert not encoders.should_compile("auto", 10**6, "fp32")  # an fp32 forward is matrix products: nothing gained
    assert encoders.should_compile("on", 10**6, "fp32")


def test_the_training_sample_is_read_in_blocks_exactly(tmp_path):
    from linker.index.dense import _rows_float32

    vectors = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float16)
    np.save(tmp_path / "v.npy", vectors)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    rows = np.array([0, 3, 4, 17, 18, 19, 49])
    for source in (mapped, vectors):
        got = _rows_float32(source, rows, block=3)
        assert got.dtype == np.float32 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, vectors[rows].astype(np.float32))
    assert _rows_float32(mapped, rows[:0]).shape == (0, 8)
