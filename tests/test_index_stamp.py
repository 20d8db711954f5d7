"""Index checks paid once: the verification stamp in the user cache (`linker.index.manifest.VerifiedStamp`)."""

from __future__ import annotations

import json
import os
import time

import pytest

from index_tables import write_concepts
from linker.errors import IndexMismatchError, InputFormatError
from linker.index import build_index, load_index
from linker.index import manifest as manifest_module
from linker.index.manifest import STAMP_DIR, VerifiedStamp, read_manifest


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LINKER_CACHE", str(tmp_path / "cache"))
    # Files written a moment ago are not stamped (`RACY_NS`); these tests stamp a folder they have just built.
    monkeypatch.setattr(manifest_module, "RACY_NS", 0)
    return tmp_path / "cache" / STAMP_DIR


@pytest.fixture()
def folder(tmp_path):
    build_index(write_concepts(tmp_path / "concepts.parquet"), kind="tfidf", out=tmp_path / "idx")
    return tmp_path / "idx"


@pytest.fixture()
def hashes(monkeypatch):
    """The files `verify` hashes, in order."""
    seen = []
    real = manifest_module.sha256_file

    def counting(path):
        seen.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(manifest_module, "sha256_file", counting)
    return seen


def _rewrite_keeping_times(path, flip_at=-1):
    """Change one byte of `path` (same size) and put its access and modification times back."""
    info = os.stat(path)
    time.sleep(0.05)  # past the file system's clock tick, so the write gets a ctime of its own
    data = bytearray(path.read_bytes())
    data[flip_at] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == info.st_mtime_ns and os.stat(path).st_size == info.st_size


def test_second_load_trusts_the_stamp(cache, folder, hashes):
    load_index(folder)
    files = len(read_manifest(folder)["files"])
    assert len(hashes) == files
    stamps = list(cache.glob("*.json"))
    assert len(stamps) == 1
    load_index(folder)
    assert len(hashes) == files  # nothing hashed again


def test_stamp_lives_in_the_cache_never_in_the_index(cache, folder):
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    load_index(folder)
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
    stamp = json.loads(next(cache.glob("*.json")).read_text())
    assert stamp["format"] == 1 and str(folder.resolve()) in stamp["key"]
    assert set(stamp["files"]) == set(read_manifest(folder)["files"])


def test_changed_file_with_its_mtime_put_back_is_caught(cache, folder, hashes):
    load_index(folder)
    _rewrite_keeping_times(folder / "tfidf/idf.npy")  # ctime moved; size and mtime as stamped
    with pytest.raises(IndexMismatchError, match=r"idf\.npy: sha256 differs"):
        load_index(folder)


def test_replaced_file_is_caught(cache, folder):
    load_index(folder)
    path = folder / "tfidf/vocabulary.json"
    info = os.stat(path)
    data = path.read_bytes()
    copy = path.with_suffix(".new")
    copy.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    os.utime(copy, ns=(info.st_atime_ns, info.st_mtime_ns))
    os.replace(copy, path)  # another inode, same size and mtime
    with pytest.raises(IndexMismatchError, match=r"vocabulary\.json: sha256 differs"):
        load_index(folder)


@pytest.mark.parametrize("content", [b"", b"not json", b"[]", b'{"format": 1}', b'{"format": 1, "key": 3}',
                                     b'{"format": 1, "key": "x", "files": {}}', b"\xff\xfe", b"[" * 100_000])
def test_malformed_stamp_means_a_full_check(cache, folder, hashes, content):
    load_index(folder)
    stamp = next(cache.glob("*.json"))
    stamp.write_bytes(content)
    hashes.clear()
    load_index(folder)
    assert len(hashes) == len(read_manifest(folder)["files"])
    assert json.loads(stamp.read_text())["format"] == 1  # written again after the full check


def test_stamp_of_another_manifest_does_not_apply(cache, folder, hashes):
    load_index(folder)
    manifest = read_manifest(folder)
    manifest["build_seconds"] = manifest["build_seconds"] + 1  # `linker calibrate` rewrites the manifest like this
    (folder / "manifest.json").write_text(json.dumps(manifest))
    hashes.clear()
    load_index(folder)
    assert len(hashes) == len(manifest["files"])
    assert len(list(cache.glob("*.json"))) == 2


def test_moved_folder_is_checked_again(cache, folder, hashes, tmp_path):
    load_index(folder)
    moved = tmp_path / "moved"
    folder.rename(moved)
    hashes.clear()
    load_index(moved)
    assert hashes


def test_files_changed_a_moment_ago_are_not_stamped(cache, folder, monkeypatch):
    monkeypatch.setattr(manifest_module, "RACY_NS", 60_000_000_000)
    load_index(folder)
    assert not list(cache.glob("*.json"))


def test_unwritable_cache_still_loads(tmp_path, folder, monkeypatch):
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("x")
    monkeypatch.setenv("LINKER_CACHE", str(blocker))
    monkeypatch.setattr(manifest_module, "RACY_NS", 0)
    assert load_index(folder).concepts.table.num_rows == 15
    assert load_index(folder).concepts.table.num_rows == 15


def test_stamps_are_pruned(cache, folder, monkeypatch):
    monkeypatch.setattr(manifest_module, "MAX_STAMPS", 4)
    cache.mkdir(parents=True)
    for i in range(5):
        (cache / f"{i:032x}.json").write_text("{}")
    load_index(folder)
    assert len(list(cache.glob("*.json"))) == 2
    manifest = read_manifest(folder)
    files = {name: folder / name for name in manifest["files"]}
    assert VerifiedStamp.of(folder, manifest, files).holds()


def test_finite_check_of_mapped_vectors_is_paid_once(cache, tmp_path, monkeypatch):
    import numpy as np

    from linker.index.manifest import read_folder_array

    scans = []
    real = manifest_module._all_finite
    monkeypatch.setattr(manifest_module, "_all_finite", lambda part: scans.append(len(part)) or real(part))
    folder = tmp_path / "vectors"
    folder.mkdir()
    np.save(folder / "v.npy", np.ones((50, 4), dtype=np.float32))

    def read():
        return read_folder_array(folder, "v.npy", what="vectors", shape=(None, 4), mmap=True)

    read()
    assert scans == [200]
    read()
    assert scans == [200]  # trusted: the file is as it was when its values were checked
    info = os.stat(folder / "v.npy")
    array = np.load(folder / "v.npy", mmap_mode="r+")
    time.sleep(0.05)
    array[7, 1] = np.nan  # written in place: same size and inode, mtime put back below; the ctime moves
    array.flush()
    del array
    os.utime(folder / "v.npy", ns=(info.st_atime_ns, info.st_mtime_ns))
    with pytest.raises(InputFormatError, match=r"v\.npy.*finite numbers.*nan at flat position 29"):
        read()
    assert len(scans) == 2


def test_index_info_hashes_again(cache, folder, hashes):
    from linker.cli.main import main

    load_index(folder)
    hashes.clear()
    main(["index", "info", str(folder)])
    assert len(hashes) == len(read_manifest(folder)["files"])
