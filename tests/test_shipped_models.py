"""The encoders that ship in the package (linker/models/): whole, within budget, checked on load, by short name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from linker.errors import InputFormatError, MissingInputError
from linker.models import CARD, MANIFEST, RERANKERS, SHIPPED, WEIGHTS, read_release, release_folder

MB = 1_000_000


BASES = {**SHIPPED, **RERANKERS}  # the encoders and the re-rankers (the taggers: tests/test_release_guards.py)


@pytest.mark.parametrize("name", sorted(BASES))
def test_shipped_files_match_their_manifest(name):
    release = read_release(name)  # size and sha256 of every listed file
    assert release.name == name and release.base == BASES[name]
    manifest = release.manifest
    assert sorted(p.name for p in release.folder.iterdir() if not p.name.startswith(".")) == sorted([MANIFEST, WEIGHTS, CARD])
    from safetensors import safe_open

    with safe_open(str(release.folder / WEIGHTS), framework="pt") as weights:
        shapes = {key: list(weights.get_slice(key).get_shape()) for key in weights.keys()}
        dtypes = {str(weights.get_slice(key).get_dtype()) for key in weights.keys()}
    assert shapes == manifest["tensors"]["shapes"] and dtypes == {"F16"}
    card = (release.folder / CARD).read_text(encoding="utf-8")
    for section in ("## Intended use", "## Limits", "## Training data and licences", "## How it was trained",
                    "## Size and what the compact form costs", "## Metrics"):
        assert section in card, (name, section)
    assert "/work/" not in card and "/home/" not in card  # no machine paths


def test_shipped_size_budget():
    """At most 30 MB a model and 150 MB in all, every release folder of the package counted (the taggers too)."""
    from linker.folders import MODELS_DIR

    sizes = {folder.name: sum(f.stat().st_size for f in folder.iterdir())
             for folder in MODELS_DIR.iterdir() if (folder / MANIFEST).is_file()}
    assert set(BASES) <= set(sizes)
    assert all(size <= 30 * MB for size in sizes.values()), sizes
    assert sum(sizes.values()) <= 150 * MB, sizes


@pytest.mark.slow
def test_the_installed_package_includes_the_releases(tmp_path):
    import subprocess
    import sys
    import zipfile

    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(root),
                    "-w", str(tmp_path)], check=True, capture_output=True)
    names = zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist()
    for name in BASES:
        for file in (MANIFEST, WEIGHTS, CARD):
            assert f"linker/models/{name}/{file}" in names


def test_an_altered_release_is_refused(tmp_path):
    copy = tmp_path / "linker-en"
    shutil.copytree(release_folder("linker-en"), copy)
    data = bytearray((copy / WEIGHTS).read_bytes())
    data[-1] ^= 0xFF
    (copy / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(InputFormatError, match=r"weights.safetensors: expected sha256 .* the file was altered"):
        read_release(copy)
    (copy / WEIGHTS).write_bytes(bytes(data[:-10]))
    with pytest.raises(InputFormatError, match="bytes"):
        read_release(copy)
    (copy / WEIGHTS).unlink()
    with pytest.raises(MissingInputError, match="weights.safetensors: no such file"):
        read_release(copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    (copy / MANIFEST).write_text(json.dumps({**manifest, "format": "something else"}))
    with pytest.raises(InputFormatError, match="format"):
        read_release(copy)


def test_short_name_loads_offline_on_top_of_its_base(monkeypatch):
    pytest.importorskip("sentence_transformers")
    import numpy as np

    from linker.encoders import load_encoder, resolve_encoder

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = resolve_encoder("linker-en")
    version = read_release("linker-en").version  # the release's own, so a retrain needs no edit here
    assert spec.name == "linker-en" and spec.revision.startswith(f"linker-en=={version} sha256:") and spec.builtin == "minilm"
    shipped, base = load_encoder("linker-en", device="cpu"), load_encoder("minilm", device="cpu")
    texts = ["hair loss", "Alopecia", "felt dizzy"]
    a, b = shipped.encode(texts, role="query"), base.encode(texts, role="query")
    assert a.shape == b.shape == (3, 384)
    assert not np.allclose(a, b, atol=1e-3)  # the trained tensors are in place
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-3)


@pytest.mark.slow
def test_index_manifest_records_the_release(tmp_path):
    pytest.importorskip("sentence_transformers")
    from linker.dictionary import SourceSpec, build_dictionary
    from linker.index import build_index
    from linker.index.dense import DenseConfig
    from linker.link import Linker

    table = tmp_path / "t.tsv"
    table.write_text("HP:0001596\tAlopecia\nHP:0001596\tHair loss\nHP:0002321\tVertigo\nHP:0002018\tNausea\n")
    build_dictionary([SourceSpec("tsv", (table,))], tmp_path / "t.parquet")
    manifest = build_index(tmp_path / "t.parquet", kind="dense", out=tmp_path / "ix",
                           config=DenseConfig(encoder="linker-en", parity_sample=0))
    assert manifest["encoder"]["name"] == "linker-en"
    assert manifest["encoder"]["revision"].startswith(f"linker-en=={read_release('linker-en').version} sha256:")
    top = Linker.load(tmp_path / "ix").link(["hair falling out"], k=1)[0].candidates[0]
    assert top.concept_id == "HP:0001596"
