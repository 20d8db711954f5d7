"""Index manifests: what they record, and refusal of folders that no longer match them."""

from __future__ import annotations

import json

import pytest

import linker
from index_tables import write_concepts
from linker.errors import ConfigError, IndexMismatchError, MissingInputError
from linker.folders import sha256_file
from linker.index import build_index, load_index
from linker.index import tfidf as tfidf_module
from linker.index.manifest import MANIFEST


@pytest.fixture()
def built(tmp_path):
    table = write_concepts(tmp_path / "concepts.parquet")
    manifest = build_index(table, kind="tfidf", out=tmp_path / "idx")
    return tmp_path / "idx", manifest, table


def _edit_manifest(folder, **changes):
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest.update(changes)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_manifest_records_build(built):
    folder, manifest, table = built
    assert manifest == json.loads((folder / MANIFEST).read_text())
    assert manifest["kind"] == "tfidf"
    assert manifest["parameters"]["ngram_max"] == 3 and manifest["parameters"]["analyzer"] == "char_wb"
    assert manifest["parameters"]["normalization"] == "biosyn" and manifest["parameters"]["preset"] == ""
    assert manifest["concepts"]["sha256"] == sha256_file(table)
    assert manifest["concepts"]["rows"] == 15
    assert manifest["counts"] == {"names": 15, "concepts": 7}
    assert manifest["library_version"] == linker.__version__
    assert manifest["encoder"] is None
    assert sorted(manifest["files"]) == [
        "concepts.hierarchy.parquet", "concepts.parquet",
        "tfidf/idf.npy", "tfidf/names.npz", "tfidf/vocabulary.json",
    ]
    entry = manifest["files"]["tfidf/names.npz"]
    assert entry["size"] == (folder / "tfidf/names.npz").stat().st_size
    assert entry["sha256"] == sha256_file(folder / "tfidf/names.npz")


def test_index_is_self_contained(built, tmp_path):
    folder, _manifest, table = built
    table.unlink()
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    assert load_index(moved).concepts.table.num_rows == 15


def test_changed_file_same_size_is_refused(built):
    folder, _m, _t = built
    path = folder / "tfidf/idf.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IndexMismatchError, match=r"idf\.npy: sha256 differs.*linker index build --dict .*concepts\.parquet"):
        load_index(folder)


def test_truncated_file_is_refused_even_without_checksums(built):
    folder, _m, _t = built
    path = folder / "concepts.parquet"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(IndexMismatchError, match=r"concepts\.parquet: \d+ bytes, the manifest says \d+"):
        load_index(folder, checksums=False)


def test_missing_file_is_refused(built):
    folder, _m, _t = built
    (folder / "tfidf/vocabulary.json").unlink()
    with pytest.raises(IndexMismatchError, match="vocabulary.json: listed in the manifest but missing"):
        load_index(folder)


def test_other_major_library_version_is_refused(built):
    folder, _m, _t = built
    major = int(linker.__version__.split(".")[0])
    _edit_manifest(folder, library_version=f"{major + 1}.0.0")
    with pytest.raises(IndexMismatchError, match=f"built by linker {major + 1}.0.0.*another major version"):
        load_index(folder)


def test_other_format_and_unknown_kind_are_refused(built):
    folder, _m, _t = built
    _edit_manifest(folder, format=99)
    with pytest.raises(IndexMismatchError, match="index format 99"):
        load_index(folder)
    _edit_manifest(folder, format=1, kind="bm25")
    with pytest.raises(IndexMismatchError, match="unknown index kind 'bm25'.*dense, hybrid, tfidf"):
        load_index(folder)


def test_folder_without_manifest(tmp_path):
    with pytest.raises(MissingInputError, match="no such index folder"):
        load_index(tmp_path / "absent")
    (tmp_path / "plain").mkdir()
    with pytest.raises(IndexMismatchError, match="manifest.json: missing"):
        load_index(tmp_path / "plain")
    (tmp_path / "plain" / MANIFEST).write_text("{not json")
    with pytest.raises(IndexMismatchError, match="not valid JSON"):
        load_index(tmp_path / "plain")


def test_failed_build_leaves_the_old_index(built, monkeypatch):
    folder, manifest, table = built

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tfidf_module.TfidfNameIndex, "build", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        build_index(table, kind="tfidf", out=folder, overwrite=True)
    assert load_index(folder).manifest == manifest
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []  # no temp folder left


def test_rebuild_replaces_the_index_only_with_overwrite(built):
    folder, old, table = built
    preset = tfidf_module.PRESETS["medical-crossing"]
    with pytest.raises(ConfigError, match="idx exists; pass --overwrite to replace it"):
        build_index(table, kind="tfidf", out=folder, config=preset)
    new = build_index(table, kind="tfidf", out=folder, config=preset, overwrite=True)
    assert load_index(folder).manifest == new and new["parameters"]["ngram_max"] == 2
    assert new["parameters"]["preset"] == "medical-crossing"
    assert new["files"]["tfidf/vocabulary.json"] != old["files"]["tfidf/vocabulary.json"]


def test_refuses_to_replace_a_folder_that_is_not_an_index(tmp_path):
    table = write_concepts(tmp_path / "concepts.parquet")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match=r"docs is a folder that linker did not write \(no .linker-output in it\)"):
            build_index(table, kind="tfidf", out=tmp_path / "docs", overwrite=overwrite)
    assert (tmp_path / "docs" / "notes.txt").read_text() == "keep me"


def test_missing_concept_table(tmp_path):
    with pytest.raises(MissingInputError, match="no such concept table"):
        build_index(tmp_path / "absent.parquet", kind="tfidf", out=tmp_path / "idx")
    assert not (tmp_path / "idx").exists()
