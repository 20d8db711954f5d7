"""The numpy query runtime (`linker.runtime`): torch's vectors without torch, and when it steps aside."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from linker.encoders import load_encoder, load_query_encoder
from linker.errors import ConfigError, InputFormatError, UnknownNameError
from linker.runtime import RuntimeEncoder, _gelu, plain_bert, read_safetensors

pytest.importorskip("torch")

TEXTS = ["hair loss", "Hair Loss", "hair loss", "broken leg bone", "fracture of femur", "myocardial infarction",
         "perte de cheveux", "  fever  ", "x", "a1-b2 'c3'", "itch " * 70]  # the last: 72 tokens > the model's 64
TOLERANCE = 1e-5  # float32 rounding between BLAS kernels; a vector's entries are ~0.2 in size


@pytest.fixture(scope="module")
def torch_encoder(tiny_encoder_dir):
    return load_encoder(str(tiny_encoder_dir))


def test_vectors_equal_torch(tiny_encoder_dir, torch_encoder):
    fast = load_query_encoder(str(tiny_encoder_dir))
    assert isinstance(fast, RuntimeEncoder) and fast.dim == torch_encoder.dim == 32
    for role in ("query", "passage"):
        np.testing.assert_allclose(fast.encode(TEXTS, role=role), torch_encoder.encode(TEXTS, role=role),
                                   atol=TOLERANCE, rtol=0)
    # the same statistics: truncation counted, duplicates (same token ids) encoded once
    assert fast.last_stats.truncated == torch_encoder.last_stats.truncated == 1
    assert (fast.last_stats.texts, fast.last_stats.tokens, fast.last_stats.longest) == (
        torch_encoder.last_stats.texts, torch_encoder.last_stats.tokens, torch_encoder.last_stats.longest)


def test_equal_token_ids_share_one_vector(tiny_encoder_dir):
    vectors = load_query_encoder(str(tiny_encoder_dir)).encode(TEXTS, role="query")
    assert np.array_equal(vectors[0], vectors[1]) and np.array_equal(vectors[0], vectors[2])  # uncased tokenizer
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


def test_prompts_and_cls_pooling_match_torch(tiny_e5_encoder_dir, tiny_encoder_dir):
    for name in (str(tiny_e5_encoder_dir), f"{tiny_encoder_dir}#cls"):
        fast, slow = load_query_encoder(name), load_encoder(name)
        assert isinstance(fast, RuntimeEncoder)
        for role in ("query", "passage"):
            np.testing.assert_allclose(fast.encode(TEXTS[:6], role=role), slow.encode(TEXTS[:6], role=role),
                                       atol=TOLERANCE, rtol=0)
    query, passage = (load_query_encoder(str(tiny_e5_encoder_dir)).encode(["fever"], role=r) for r in ("query", "passage"))
    assert not np.allclose(query, passage)  # "query: " and "passage: " were prepended


def test_empty_input_and_bad_budget(tiny_encoder_dir):
    fast = load_query_encoder(str(tiny_encoder_dir))
    assert fast.encode([], role="query").shape == (0, 32)
    with pytest.raises(ConfigError, match="token_budget"):
        fast.encode(["fever"], role="query", token_budget=0)
    with pytest.raises(UnknownNameError):
        fast.encode(["fever"], role="mention")


def test_small_batches_match_one_big_batch(tiny_encoder_dir):
    fast = load_query_encoder(str(tiny_encoder_dir))
    whole = fast.encode(TEXTS, role="query")
    apart = fast.encode(TEXTS, role="query", batch_size=1)
    np.testing.assert_allclose(whole, apart, atol=TOLERANCE, rtol=0)  # padding changes nothing but rounding


def test_many_texts_go_to_torch(tiny_encoder_dir, torch_encoder):
    fast = load_query_encoder(str(tiny_encoder_dir))
    fast.torch_min_texts = 5
    np.testing.assert_allclose(fast.encode(TEXTS[:4], role="query"), torch_encoder.encode(TEXTS[:4], role="query"),
                               atol=TOLERANCE, rtol=0)
    assert fast._torch is None
    vectors = fast.encode(TEXTS, role="query")
    assert fast._torch is not None and fast.last_stats.texts == len(TEXTS)
    np.testing.assert_allclose(vectors, torch_encoder.encode(TEXTS, role="query"), atol=TOLERANCE, rtol=0)


def test_runtime_choice(tiny_encoder_dir, monkeypatch):
    assert type(load_query_encoder(str(tiny_encoder_dir), runtime="torch")).__name__ == "Encoder"
    assert type(load_query_encoder(str(tiny_encoder_dir), precision="bf16")).__name__ == "Encoder"
    monkeypatch.setenv("LINKER_RUNTIME", "torch")
    assert type(load_query_encoder(str(tiny_encoder_dir))).__name__ == "Encoder"
    monkeypatch.setenv("LINKER_RUNTIME", "jax")
    with pytest.raises(UnknownNameError, match="encoder runtime.*auto, numpy, torch"):
        load_query_encoder(str(tiny_encoder_dir))


def _copy_with(folder: Path, tmp_path: Path, name: str, change) -> Path:
    out = tmp_path / "model"
    shutil.copytree(folder, out)
    data = json.loads((out / name).read_text())
    change(data)
    (out / name).write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("name, change, why", [
    ("config.json", lambda c: c.update(hidden_act="relu"), "hidden_act"),
    ("config.json", lambda c: c.update(model_type="roberta"), "model_type"),
    ("config.json", lambda c: c.update(position_embedding_type="relative_key"), "positions"),
    ("modules.json", lambda m: m.insert(2, {"idx": 2, "name": "2", "path": "2_Dense",
                                           "type": "sentence_transformers.models.Dense"}), "modules"),
    ("1_Pooling/config.json", lambda p: p.update(pooling_mode_max_tokens=True), "pooling"),
])
def test_other_models_stay_on_torch(tiny_encoder_dir, tmp_path, name, change, why):
    folder = _copy_with(tiny_encoder_dir, tmp_path, name, change)
    settings, reason = plain_bert(folder)
    assert settings is None and why in reason
    if name != "modules.json":  # a Dense module without its folder would not load in torch either
        assert type(load_query_encoder(str(folder))).__name__ == "Encoder"
    with pytest.raises(ConfigError, match="numpy runtime runs plain BERT folders"):
        load_query_encoder(str(folder), runtime="numpy")


def test_read_safetensors_equals_the_library(tiny_encoder_dir):
    from safetensors.numpy import load_file

    ours, theirs = read_safetensors(tiny_encoder_dir / "model.safetensors"), load_file(tiny_encoder_dir / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert ours[key].dtype == theirs[key].dtype and np.array_equal(ours[key], theirs[key])
        assert not ours[key].flags.writeable  # a view of the read-only map


@pytest.mark.parametrize("damage", [
    lambda data: data[:4],  # shorter than the length field
    lambda data: (10**12).to_bytes(8, "little") + data[8:],  # header longer than the file
    lambda data: len(b"[1]").to_bytes(8, "little") + b"[1]",  # not an object
    lambda data: data[:-100],  # truncated: the last tensor's offsets run past the end
    lambda data: data[:8] + data[8:].replace(b'"F32"', b'"BF16"', 1),  # a dtype numpy lacks
])
def test_damaged_safetensors_is_one_error(tiny_encoder_dir, tmp_path, damage):
    path = tmp_path / "model.safetensors"
    path.write_bytes(damage((tiny_encoder_dir / "model.safetensors").read_bytes()))
    with pytest.raises(InputFormatError, match="model.safetensors"):
        read_safetensors(path)


def test_gelu_is_the_erf_form():
    torch = pytest.importorskip("torch")
    x = np.linspace(-30, 30, 600_001, dtype=np.float32)
    exact = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    # Abramowitz-Stegun's erf is within 1.5e-7, so GELU within 0.5 |x| 1.5e-7 (2.3e-6 at |x| = 30) plus float32
    # rounding, whose size depends on the processor's exp and erf (AMD EPYC with AVX-512: 1.21e-6 at x = -3.39,
    # past a bound of 1e-6 that held on others); the tanh form is off by more than 1e-4, below
    assert np.abs(_gelu(x) - exact).max() < 4e-6
    assert np.abs(_gelu(x) - torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()).max() > 1e-4


def test_query_path_imports_no_torch(tiny_encoder_dir, tmp_path):
    """A dense index built with the tiny encoder links, in a fresh process, without torch, transformers or
    sentence-transformers ever imported."""
    from index_tables import write_concepts
    from linker.index import build_index
    from linker.index.dense import DenseConfig

    build_index(write_concepts(tmp_path / "concepts.parquet"), kind="dense", out=tmp_path / "idx",
                config=DenseConfig(encoder=str(tiny_encoder_dir), precision="fp32"))
    code = (
        "import sys; from linker.link import Linker\n"
        f"linker = Linker.load({str(tmp_path / 'idx')!r})\n"
        "[result] = linker.link(['headache'], k=3)\n"
        "assert result.candidates, result\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules)\n"
        "print(type(linker.index.names.encoder).__name__, heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "RuntimeEncoder []"


def test_links_as_torch_does(tiny_encoder_dir, tmp_path, monkeypatch):
    from index_tables import write_concepts
    from linker.index import build_index
    from linker.index.dense import DenseConfig
    from linker.link import Linker

    build_index(write_concepts(tmp_path / "concepts.parquet"), kind="dense", out=tmp_path / "idx",
                config=DenseConfig(encoder=str(tiny_encoder_dir), precision="fp32"))
    mentions = ["headache", "hair loss", "heart attack", "kidney failure", "itchy skin rash", "high blood pressure"]
    fast = Linker.load(tmp_path / "idx").link(mentions, k=5)
    monkeypatch.setenv("LINKER_RUNTIME", "torch")
    slow_linker = Linker.load(tmp_path / "idx")
    assert type(slow_linker.index.names.encoder).__name__ == "Encoder"
    slow = slow_linker.link(mentions, k=5)
    for a, b in zip(fast, slow):
        assert [c.concept_id for c in a.candidates] == [c.concept_id for c in b.candidates]
        np.testing.assert_allclose([c.score for c in a.candidates], [c.score for c in b.candidates], atol=TOLERANCE)


# --- flat search without FAISS (`linker.index.dense.flat_search`)


def test_flat_search_equals_faiss(monkeypatch):
    faiss = pytest.importorskip("faiss")
    from linker.index import dense

    monkeypatch.setattr(dense, "FLAT_BLOCK", 1000)  # several blocks of names
    monkeypatch.setattr(dense, "FLAT_BLOCK_SCORES", 7000)  # and of queries
    rng = np.random.default_rng(0)
    names = rng.standard_normal((4500, 16)).astype(np.float32)
    names /= np.linalg.norm(names, axis=1, keepdims=True)  # as the encoders' vectors: a name's own score is the top
    names[3000] = names[10]  # an exact tie across two blocks: the lower row first
    names[2001] = names[2000]  # and inside one
    queries = rng.standard_normal((23, 16)).astype(np.float32)
    queries[0], queries[1] = names[10], names[2000]
    index = faiss.IndexFlatIP(16)
    index.add(names)
    for k in (1, 2, 6, 4500):
        want_scores, want_rows = index.search(queries, k)
        scores, rows = dense.flat_search(queries, names, k)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
        for got, want, want_score in zip(rows, want_rows, want_scores):
            # the same rows but for (near-)ties with the k-th, which FAISS orders as its own rounding falls
            clear = want[want_score > want_score[-1] + 1e-4]
            assert set(clear.tolist()) <= set(got.tolist())
    _, rows = dense.flat_search(queries[:2], names, 2)
    assert rows.tolist() == [[10, 3000], [2000, 2001]]


@pytest.fixture
def faiss_switch():
    """FAISS's scan/BLAS switch as a dense index sets it (process-wide: BLAS products), put back after the test;
    yields how many queries a flat search scans by itself."""
    faiss = pytest.importorskip("faiss")
    from linker.index.dense import SCAN_MAX_QUERIES

    before = faiss.cvar.distance_compute_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = 1
    yield SCAN_MAX_QUERIES
    faiss.cvar.distance_compute_blas_threshold = before


def assert_exact_order(queries, names, scores, rows):
    """Each query's rows and scores are the exact order of every name (`exact_scores` desc, row asc), -1 past them."""
    from linker.index.dense import exact_scores

    exact = exact_scores(queries, names, np.broadcast_to(np.arange(len(names)), (len(queries), len(names))))
    for q in range(len(queries)):
        want = np.lexsort((np.arange(len(names)), -exact[q].astype(np.float64)))[: rows.shape[1]]
        assert rows[q, : len(want)].tolist() == want.tolist()
        assert (rows[q, len(want) :] == -1).all()
        np.testing.assert_array_equal(scores[q, : len(want)], exact[q, want])


@pytest.mark.parametrize("use_faiss", [False, True])  # numpy's BLAS, or FAISS's scan and BLAS, find candidates
def test_exact_flat_topk_is_the_exact_order_whatever_finds_the_candidates(use_faiss, faiss_switch):
    # The definition: every row re-scored by `exact_scores`, ordered by (score desc, row asc). Copies of one vector
    # (more than k + FLAT_PAD of them, so the proof fails and the search widens) and near-ties must come out so.
    from linker.index.dense import FLAT_PAD, exact_flat_topk, max_row_norm

    rng = np.random.default_rng(1)
    names = rng.standard_normal((3000, 24)).astype(np.float32)
    names /= np.linalg.norm(names, axis=1, keepdims=True)
    names[100 : 100 + 3 * FLAT_PAD] = names[7]  # a crowd of equal vectors
    names[2500] = names[7] * np.float32(1 - 1e-7)  # and one a hair below them
    queries = rng.standard_normal((6, 24)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    queries[0] = names[7]
    queries[1] = names[7] + np.float32(1e-3) * queries[2]
    assert len(queries) > faiss_switch >= 2  # FAISS's BLAS products for all of them, the scan for the first two
    for k, few in ((1, 6), (5, 6), (40, 6), (3000, 6), (3005, 6), (5, 2), (40, 2)):
        scores, rows = exact_flat_topk(queries[:few], names, k, max_norm=max_row_norm(names), use_faiss=use_faiss)
        assert rows.shape == scores.shape == (few, k)
        assert_exact_order(queries[:few], names, scores, rows)
    _, rows = exact_flat_topk(queries[:1], names, 5, max_norm=1.0, use_faiss=use_faiss)
    assert rows[0].tolist() == [7, 100, 101, 102, 103]  # equal vectors: by row


def test_the_float16_pass_gives_the_exact_order_of_the_float32_rows(monkeypatch, faiss_switch):
    # HalfScan's candidates come from float16 copies (a relative rounding of ~5e-4): vectors that differ below it tie
    # there, and the proof under its wider bound must fetch again until the float32 order is certain, in any block.
    faiss = pytest.importorskip("faiss")
    from linker.index import dense
    from linker.index.dense import FLAT_PAD, HalfScan, exact_flat_topk, max_row_norm

    rng = np.random.default_rng(2)
    names = rng.standard_normal((3000, 24)).astype(np.float32)
    names /= np.linalg.norm(names, axis=1, keepdims=True)
    names[7] = names[7].astype(np.float16)  # a vector float16 holds exactly
    names[100 : 100 + 3 * FLAT_PAD] = names[7]  # a crowd of copies, more than a first fetch
    names[2500] = names[7] * np.float32(1 - 1e-7)
    # Above them in float32, the same float16 codes (2^-13 is below half of float16's spacing): tied with the crowd
    # in the float16 pass and, by row, left out of its first fetch; only the wider bound makes the search look again.
    names[2999] = names[7] * np.float32(1 + 2**-13)
    names[1500] = names[7] * np.float32(1 - 2e-4)
    queries = rng.standard_normal((3, 24)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    queries[0] = names[7]
    queries[1] = names[7] + np.float32(1e-3) * queries[2]
    monkeypatch.setattr(dense, "SCAN_SPLIT_ROWS", 2000)
    monkeypatch.setattr(dense, "thread_budget", lambda wanted: wanted)  # as if the machine had the cores
    monkeypatch.setattr(faiss, "omp_get_max_threads", lambda: 3)
    monkeypatch.setattr(dense, "available_cpus", lambda: 3)
    half = HalfScan(names)
    assert half.blocks == [(0, 1000), (1000, 2000), (2000, 3000)]
    approx, _ = half.search(queries[:1], 3000)
    assert (approx[0] == approx[0, 0]).sum() >= 3 * FLAT_PAD + 2  # the copies and row 2999 tie in float16
    for k in (1, 5, 40, 3000):
        for few in (1, 2):
            scores, rows = exact_flat_topk(queries[:few], names, k, max_norm=max_row_norm(names), half=half)
            assert rows.shape == scores.shape == (few, k)
            assert_exact_order(queries[:few], names, scores, rows)
    _, rows = exact_flat_topk(queries[:1], names, 3, max_norm=max_row_norm(names), half=half)
    assert rows[0].tolist() == [2999, 7, 100]

    # A name above the top one in float32 and below 16 others in float16 (its codes round down where that costs the
    # query most): only a bound as wide as float16's rounding looks past the first fetch, where float32's would not.
    best = rng.uniform(0.15, 0.24, 24).astype(np.float16).astype(np.float32)  # one binade: spacing 2^-13
    spacing = np.float32(2.0**-13)
    weight_order = np.argsort(-best)  # the query is `best`: a component's weight in the score is its value
    hidden = best.copy()
    hidden[weight_order[:16]] += np.float32(0.49) * spacing  # rounds back to best's codes, adds to the exact score
    hidden[weight_order[16:]] -= np.float32(0.51) * spacing  # rounds a whole spacing down
    fillers = np.repeat(best[None], FLAT_PAD, axis=0)
    fillers[np.arange(FLAT_PAD), weight_order[:FLAT_PAD]] -= spacing  # float16 holds them: a little below best
    names = np.concatenate([rng.standard_normal((300, 24)).astype(np.float32) * 0.05, best[None], fillers,
                            hidden[None]])
    half = HalfScan(names)
    approx, rows = half.search(best[None], len(names))
    assert rows[0].tolist().index(len(names) - 1) == FLAT_PAD + 1  # after best and the fillers
    _, rows = exact_flat_topk(best[None], names, 1, max_norm=max_row_norm(names), half=half)
    assert rows[0].tolist() == [len(names) - 1]


def test_a_dense_index_makes_its_float16_copies_at_its_nth_one_query_scan(monkeypatch, faiss_switch):
    pytest.importorskip("faiss")
    from linker.index import dense

    rng = np.random.default_rng(4)
    vectors = rng.standard_normal((500, 24)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[:8] + np.float32(0.05) * rng.standard_normal((8, 24)).astype(np.float32)
    index = dense.DenseNameIndex(None, dense.DenseConfig(encoder="none"), vectors)
    answers = [index.search_vectors(queries, 5)]  # a batch: not a scan
    assert index._scans == 0
    for i in range(dense.HALF_SCAN_AFTER - 1):
        answers.append(index.search_vectors(queries[i % 8 : i % 8 + 1], 5))
    assert index._half is None
    index.search_vectors(queries[:1], 5)
    assert isinstance(index._half, dense.HalfScan)
    for i, (scores, rows) in enumerate(answers[1:]):  # the same answers with the copies
        again = index.search_vectors(queries[i % 8 : i % 8 + 1], 5)
        np.testing.assert_array_equal(again[0], scores)
        np.testing.assert_array_equal(again[1], rows)
    np.testing.assert_array_equal(index.search_vectors(queries, 5)[1], answers[0][1])
    large = dense.DenseNameIndex(None, dense.DenseConfig(encoder="none"), vectors * np.float32(1e5))
    for _ in range(dense.HALF_SCAN_AFTER):
        large.search_vectors(queries[:1], 5)
    assert large._half is None  # values past float16's range: the float32 scan stays


def test_a_scan_cut_into_blocks_gives_the_scores_of_one_pass(monkeypatch):
    # The scan's blocks run on several threads; each row's product is the same kernel's: bit for bit one pass.
    faiss = pytest.importorskip("faiss")
    from linker.index import dense

    rng = np.random.default_rng(5)
    names = rng.standard_normal((5001, 24)).astype(np.float32)
    queries = rng.standard_normal((2, 24)).astype(np.float32)
    monkeypatch.setattr(dense, "SCAN_SPLIT_ROWS", 10**9)
    assert dense._scan_blocks(len(names), 3) == [(0, 5001)]
    one = dense._scan(queries, names, 50)
    monkeypatch.setattr(dense, "SCAN_SPLIT_ROWS", 2000)
    monkeypatch.setattr(dense, "thread_budget", lambda wanted: wanted)  # as if the machine had the cores
    monkeypatch.setattr(faiss, "omp_get_max_threads", lambda: 3)
    assert dense._scan_blocks(len(names), 3) == [(0, 1667), (1667, 3334), (3334, 5001)]
    cut = dense._scan(queries, names, 50)
    np.testing.assert_array_equal(one[0], cut[0])
    np.testing.assert_array_equal(one[1], cut[1])


def test_top_m_finds_the_largest_scores():
    # The sampled floor never drops one of the m largest: random scores, many ties, m past the sample's size.
    from linker.index.dense import top_m

    rng = np.random.default_rng(3)
    for n, m in ((10, 3), (5000, 1), (5000, 56), (100_000, 56), (100_000, 2000), (7, 7), (7, 9)):
        for scores in (rng.standard_normal(n).astype(np.float32), rng.integers(0, 5, n).astype(np.float32)):
            found = top_m(scores, m)
            assert len(found) == min(m, n) == len(set(found.tolist()))
            np.testing.assert_array_equal(np.sort(scores[found]), np.sort(scores)[n - min(m, n) :])


def test_float32_dot_error_bounds_every_product():
    # The proof's premise, on vectors whose sums cancel: |float32 dot - exact| <= bound x |q| |x|.
    from linker.index.dense import float32_dot_error

    rng = np.random.default_rng(2)
    for dim in (16, 384, 1024):
        q = rng.standard_normal((200, dim)).astype(np.float32)
        x = rng.standard_normal((500, dim)).astype(np.float32)
        fast = (q @ x.T).astype(np.float64)
        exact = q.astype(np.float64) @ x.astype(np.float64).T
        scale = np.linalg.norm(q.astype(np.float64), axis=1)[:, None] * np.linalg.norm(x.astype(np.float64), axis=1)
        assert (np.abs(fast - exact) <= float32_dot_error(dim) * scale).all()


def test_flat_search_fewer_names_than_k():
    from linker.index.dense import flat_search

    scores, rows = flat_search(np.eye(3, dtype=np.float32), np.eye(3, dtype=np.float32), 5)
    assert rows.shape == (3, 3) and rows[:, 0].tolist() == [0, 1, 2] and scores[:, 0].tolist() == [1.0, 1.0, 1.0]


def test_blas_limit_is_put_back_after_concurrent_encodes(tiny_encoder_dir):
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_info

    def blas_threads():
        return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]

    before = blas_threads()
    fast = load_query_encoder(str(tiny_encoder_dir))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda text: fast.encode([text] * 3, role="query"), TEXTS))
    assert blas_threads() == before
    for text, vectors in zip(TEXTS, results):
        np.testing.assert_allclose(vectors[0], fast.encode([text], role="query")[0], atol=TOLERANCE, rtol=0)
