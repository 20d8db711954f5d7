"""Hostile index and model folders (issue 34, case 3): every file a folder names must resolve inside it
(links included), be a regular file of bounded size and hold what it should, or the load is refused in
one line naming the file. Each case is a real tiny tf-idf index altered the way a hostile or damaged
copy would be; where checksums would catch the change, the manifest is rewritten to match, so the
folder policy itself is what is tested."""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from index_tables import write_concepts
from conftest import cli
from linker.confidence import CALIBRATION, Calibration, write_calibration
from linker.errors import LinkerError
from linker.folders import check_model_folder, folder_file, sha256_file
from linker.index import PRIOR, build_index, load_index
from linker.index.manifest import MANIFEST, check_array, read_manifest
from linker.index.tfidf import IDF, MATRIX, VOCABULARY
from linker.link import Linker

FAST_SECONDS = 10.0  # a refused /dev/zero or fifo answers at once (~0.1 s); generous for a loaded CI machine
GROWTH_BYTES = 100 << 20  # and without reading it into memory


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tf-idf index with a prior and a calibration, both listed and verified by its manifest."""
    root = tmp_path_factory.mktemp("hostile")
    labelled = root / "train.tsv"
    labelled.write_text("X2\tfever\nX2\tpyrexia\nX1\tfever\n10008479\tchest pain\n")
    build_index(write_concepts(root / "c.parquet"), kind="tfidf", out=root / "idx", prior=[f"tsv:{labelled}"])
    write_calibration(root / "idx", Calibration(scorer="retriever", x=(0.1, 0.9), y=(0.2, 0.8), mentions=2))
    Linker.load(root / "idx")  # the untouched folder loads
    return root / "idx"


def copy(base: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "idx"
    shutil.copytree(base, folder)
    return folder


def edit_manifest(folder: Path, change) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def relist(folder: Path, *names: str) -> None:
    """Record the current size and sha256 of `names` (as someone rewriting the manifest would)."""
    def change(manifest):
        for name in names:
            path = folder / name
            manifest["files"][name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    edit_manifest(folder, change)


def replace_with_link(folder: Path, name: str, target: str | Path) -> None:
    (folder / name).unlink()
    os.symlink(target, folder / name)


def refused(folder: Path, capsys, *needles: str) -> None:
    """`linker link` exits 1 with one `error:` line holding `needles`, in bounded time and memory; the
    library raises a LinkerError too."""
    before, started = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, time.perf_counter()
    code, err = cli(["link", "--index", folder, "fever"], capsys)
    seconds = time.perf_counter() - started
    assert code == 1 and len(err) == 1 and err[0].startswith("error: "), err
    for needle in needles:
        assert needle in err[0], err
    assert seconds < FAST_SECONDS, seconds
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before < GROWTH_BYTES
    with pytest.raises(LinkerError):
        Linker.load(folder)


# ----------------------------------------------------------------------------- the prior


@pytest.mark.parametrize(("value", "needle"), [
    ("/etc/passwd", "'/etc/passwd'"),
    ("../outside.json", "'../outside.json'"),
    ("", "str ''"),
    (7, "int '7'"),
])
def test_prior_file_outside_the_folder_or_not_a_name(base, tmp_path, capsys, value, needle):
    folder = copy(base, tmp_path)
    (tmp_path / "outside.json").write_text(json.dumps({"counts": {"X1": 9}}))
    edit_manifest(folder, lambda m: m["prior"].update(file=value))
    refused(folder, capsys, f"{folder / MANIFEST}: field 'prior.file'", "relative path inside", needle)


def test_prior_that_is_not_an_object(base, tmp_path, capsys):
    folder = copy(base, tmp_path)
    edit_manifest(folder, lambda m: m.update(prior=PRIOR))
    refused(folder, capsys, "manifest.json: expected field 'prior' as an object", "found str 'concept_prior.json'")


def test_prior_file_that_the_manifest_does_not_list_is_not_read_unverified(base, tmp_path, capsys):
    folder = copy(base, tmp_path)
    (folder / "extra.json").write_text(json.dumps({"counts": {"X1": 9}}))
    edit_manifest(folder, lambda m: m["prior"].update(file="extra.json"))
    refused(folder, capsys, "field 'prior.file' naming one of the files the manifest lists", "'extra.json'")


@pytest.mark.parametrize("listed", [True, False])
def test_prior_linked_to_dev_zero(base, tmp_path, capsys, listed):
    folder = copy(base, tmp_path)
    replace_with_link(folder, PRIOR, "/dev/zero")
    if not listed:
        edit_manifest(folder, lambda m: m["files"].pop(PRIOR))
        refused(folder, capsys, "'concept_prior.json', which 'files' does not list")
    else:
        refused(folder, capsys, f"{folder / PRIOR}: expected", "found a link to /dev/zero, outside it")


def test_prior_that_is_a_fifo(base, tmp_path, capsys):
    folder = copy(base, tmp_path)
    (folder / PRIOR).unlink()
    os.mkfifo(folder / PRIOR)
    refused(folder, capsys, f"{folder / PRIOR}: expected", "found a fifo")


def test_prior_linked_to_a_file_outside(base, tmp_path, capsys):
    folder = copy(base, tmp_path)
    outside = tmp_path / "outside.json"
    shutil.copyfile(folder / PRIOR, outside)
    replace_with_link(folder, PRIOR, outside)  # same bytes, so size and sha256 still match
    refused(folder, capsys, f"{folder / PRIOR}: expected", f"a link to {outside.resolve()}, outside it")


@pytest.mark.parametrize(("content", "needle"), [
    ([1, 2], "a JSON object), found a JSON array"),
    ({"counts": ["X1"]}, "'counts' as an object {concept id: count >= 0}, found list"),
    ({"counts": {"X1": 1}, "names": {"fever": {"X1": "many"}}}, "'names.fever' as an object"),
    ({"counts": {"X1": 1}, "name_rows": {"row": [10 ** 9], "count": [1]}}, "'name_rows' as equally long lists"),
])
def test_prior_content_of_the_wrong_shape(base, tmp_path, capsys, content, needle):
    folder = copy(base, tmp_path)
    (folder / PRIOR).write_text(json.dumps(content))
    relist(folder, PRIOR)
    refused(folder, capsys, f"{folder / PRIOR}: expected", needle)


# ----------------------------------------------------------------------------- the calibration


def test_calibration_linked_to_dev_zero(base, tmp_path, capsys):
    folder = copy(base, tmp_path)
    replace_with_link(folder, CALIBRATION, "/dev/zero")
    refused(folder, capsys, f"{folder / CALIBRATION}: expected", "found a link to /dev/zero, outside it")
    edit_manifest(folder, lambda m: m["files"].pop(CALIBRATION))  # unlisted: refused as unverifiable
    refused(folder, capsys, f"{folder / CALIBRATION}: the manifest records a calibration but does not list")


def test_calibration_linked_to_a_file_outside(base, tmp_path, capsys):
    folder = copy(base, tmp_path)
    outside = tmp_path / "cal.json"
    shutil.copyfile(folder / CALIBRATION, outside)
    replace_with_link(folder, CALIBRATION, outside)
    refused(folder, capsys, f"{folder / CALIBRATION}: expected", "outside it")


@pytest.mark.parametrize(("change", "needle"), [
    (lambda d: d.update(x=[0.1, float("nan")]), "'x' as a list of finite numbers"),
    (lambda d: d.update(y=["a", "b"]), "'y' as a list of finite numbers"),
    (lambda d: d.update(y=[0.2, 3.0]), "'y' as probabilities from 0 to 1"),
    (lambda d: d.update(retriever_weight="big"), "'retriever_weight' as a number"),
])
def test_calibration_content_of_the_wrong_shape(base, tmp_path, capsys, change, needle):
    folder = copy(base, tmp_path)
    data = json.loads((folder / CALIBRATION).read_text())
    change(data)
    (folder / CALIBRATION).write_text(json.dumps(data))
    relist(folder, CALIBRATION)
    refused(folder, capsys, f"{folder / CALIBRATION}: expected", needle)


# ----------------------------------------------------------------------------- the manifest and tf-idf files


def test_manifest_that_is_not_an_object(base, tmp_path, capsys):
    folder = copy(base, tmp_path)
    (folder / MANIFEST).write_text(json.dumps([json.loads((folder / MANIFEST).read_text())]))
    refused(folder, capsys, f"{folder / MANIFEST}: expected a linker index manifest")


def test_manifest_linked_to_dev_zero(base, tmp_path, capsys):
    folder = copy(base, tmp_path)
    replace_with_link(folder, MANIFEST, "/dev/zero")
    refused(folder, capsys, f"{folder / MANIFEST}: expected", "a link to /dev/zero, outside it")


def test_nan_idf_with_matching_checksums(base, tmp_path, capsys):
    folder = copy(base, tmp_path)
    idf = np.load(folder / IDF)
    idf[0] = np.nan
    np.save(folder / IDF, idf)
    relist(folder, IDF)
    refused(folder, capsys, f"{folder / IDF}: expected", "finite numbers, found nan")


def test_idf_header_claiming_more_than_the_file_holds(base, tmp_path, capsys):
    """A header that says 10^12 values is refused from its size, before numpy allocates for it."""
    folder = copy(base, tmp_path)
    with (folder / IDF).open("rb") as handle:
        np.lib.format.read_magic(handle)
        np.lib.format.read_array_header_1_0(handle)
        data = handle.read()
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10 ** 12,)})
    (folder / IDF).write_bytes(header.getvalue() + data)
    relist(folder, IDF)
    refused(folder, capsys, f"{folder / IDF}: expected", "bytes for an array of shape")


def test_matrix_with_a_column_out_of_range(base, tmp_path, capsys):
    """The sparse kernels index without bounds checks: a column index past the vocabulary is refused."""
    import scipy.sparse as sp

    folder = copy(base, tmp_path)
    matrix = sp.load_npz(folder / MATRIX)
    matrix.indices[0] = matrix.shape[1] + 5
    sp.save_npz(folder / MATRIX, matrix, compressed=False)
    relist(folder, MATRIX)
    refused(folder, capsys, f"{folder / MATRIX}: expected", "column index outside")


def test_vocabulary_that_does_not_match_the_idf(base, tmp_path, capsys):
    folder = copy(base, tmp_path)
    vocabulary = json.loads((folder / VOCABULARY).read_text())
    vocabulary[next(iter(vocabulary))] = "zero"
    (folder / VOCABULARY).write_text(json.dumps(vocabulary))
    relist(folder, VOCABULARY)
    refused(folder, capsys, f"{folder / VOCABULARY}: expected the columns 0..")


def test_concept_table_linked_to_a_file_outside(base, tmp_path, capsys):
    folder = copy(base, tmp_path)
    outside = tmp_path / "elsewhere.parquet"
    shutil.copyfile(folder / "concepts.parquet", outside)
    replace_with_link(folder, "concepts.parquet", outside)
    refused(folder, capsys, f"{folder / 'concepts.parquet'}: expected", "outside it")


def test_links_inside_the_folder_are_fine(base, tmp_path):
    folder = copy(base, tmp_path)
    (folder / "data").mkdir()
    (folder / PRIOR).rename(folder / "data" / PRIOR)
    os.symlink(Path("data") / PRIOR, folder / PRIOR)
    assert Linker.load(folder).link(["fever"], k=1)[0].candidates[0].concept_id == "X2"  # the prior still applies


# ----------------------------------------------------------------------------- the policy itself, and model folders


def test_folder_file_refuses_each_kind_of_escape(tmp_path):
    folder = tmp_path / "f"
    (folder / "sub").mkdir(parents=True)
    (folder / "ok.json").write_text("{}")
    (folder / "big.bin").write_bytes(b"x" * 100)
    os.mkfifo(folder / "fifo")
    os.symlink("/dev/null", folder / "null")
    os.symlink(tmp_path, folder / "up")
    assert folder_file(folder, "ok.json", max_bytes=10, what="x") == (folder / "ok.json").resolve()
    (tmp_path / "other.txt").write_text("x")
    assert folder_file(folder, "up/f/ok.json", max_bytes=10, what="x") == (folder / "ok.json").resolve()  # back inside
    for name, needle in [("/etc/hostname", "relative path"), ("sub/../../x", "relative path"), (None, "NoneType"),
                         ("null", "a link to /dev/null, outside it"), ("fifo", "found a fifo"), ("sub", "a folder"),
                         ("big.bin", "at most 10 bytes"), ("up/other.txt", "outside it")]:
        with pytest.raises(LinkerError, match=needle):
            folder_file(folder, name, max_bytes=10, what="x")
    with pytest.raises(LinkerError, match="missing"):
        folder_file(folder, "absent.json", max_bytes=10, what="x")


def test_model_folder_with_a_tokenizer_linked_to_dev_zero(tmp_path):
    """An encoder or re-ranker folder is refused before any loader (or the revision hash) reads it."""
    from linker.encoders import resolve_encoder

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "modules.json").write_text("[]")
    os.symlink("/dev/zero", model / "tokenizer.json")
    started = time.perf_counter()
    with pytest.raises(LinkerError, match=r"tokenizer\.json: expected a file of an encoder folder.*/dev/zero, outside"):
        resolve_encoder(str(model))
    assert time.perf_counter() - started < FAST_SECONDS
    (model / "tokenizer.json").unlink()
    os.symlink(tmp_path, model / "parent")  # a linked folder out of the model
    with pytest.raises(LinkerError, match="parent: expected a folder inside.*outside it"):
        check_model_folder(model, what="a model", fix="x")
    (model / "parent").unlink()
    assert check_model_folder(model, what="a model", fix="x") == ["config.json", "modules.json"]


def test_re_ranker_folder_with_a_file_linked_outside(tmp_path):
    from linker.rerank import CrossEncoder

    model = tmp_path / "reranker"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "secret.txt").write_text("x")
    os.symlink(tmp_path / "secret.txt", model / "vocab.txt")
    with pytest.raises(LinkerError, match=r"vocab\.txt: expected a file of a re-ranker folder.*outside it"):
        CrossEncoder.load(model)


def test_index_info_and_load_agree_on_a_good_folder(base):
    manifest = read_manifest(base)
    assert PRIOR in manifest["files"] and CALIBRATION in manifest["files"]
    assert load_index(base).names.size == 15


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, None])
def test_a_memory_mapped_array_is_checked_for_finite_values_in_every_block(tmp_path, monkeypatch, dtype, bad):
    """float16 is checked by its exponent bits: the same verdict and position as np.isfinite, in any block
    (the file is read in blocks of 7 values here, through one reused buffer)."""
    import linker.index.manifest as manifest

    values = np.linspace(-65000, 65000, 40).astype(dtype).reshape(10, 4)  # float16's largest finite values
    if bad is not None:
        values[9, 3] = bad  # the last value: in the last, shorter block
    np.save(tmp_path / "v.npy", values)
    real = manifest._flat_blocks
    monkeypatch.setattr(manifest, "_flat_blocks", lambda array, block: real(array, 7))
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    if bad is None:
        assert check_array("v.npy", mapped, what="vectors", shape=(None, 4)) is mapped
    else:
        with pytest.raises(LinkerError, match=f"finite numbers, found {bad} at flat position 39"):
            check_array("v.npy", mapped, what="vectors", shape=(None, 4))


@pytest.mark.slow
def test_dense_index_files(tiny_encoder_dir, tmp_path_factory, tmp_path, capsys):
    """A dense index: NaN embeddings (checksums updated), a params.json naming a file outside, a FAISS file
    linked outside; each refused in one line naming the file."""
    from linker.index.dense import DenseConfig, EMBEDDINGS, FAISS_FILE, PARAMS

    root = tmp_path_factory.mktemp("dense")
    build_index(write_concepts(root / "c.parquet"), kind="dense", out=root / "idx",
                config=DenseConfig(encoder=str(tiny_encoder_dir), faiss_kind="hnsw"))
    folder = copy(root / "idx", tmp_path / "nan")
    embeddings = np.load(folder / EMBEDDINGS)
    embeddings[3, 1] = np.nan
    np.save(folder / EMBEDDINGS, embeddings)
    relist(folder, EMBEDDINGS)
    refused(folder, capsys, f"{folder / EMBEDDINGS}: expected", "finite numbers, found nan")

    folder = copy(root / "idx", tmp_path / "params")
    params = json.loads((folder / PARAMS).read_text())
    params["files"]["embeddings"] = "../../outside.npy"
    (folder / PARAMS).write_text(json.dumps(params))
    relist(folder, PARAMS)
    refused(folder, capsys, f"{folder / PARAMS}:", "'files.embeddings'", "'../../outside.npy'")

    folder = copy(root / "idx", tmp_path / "unlisted")  # a file inside, but not verified by the manifest
    shutil.copyfile(folder / EMBEDDINGS, folder / "dense" / "other.npy")
    params = json.loads((folder / PARAMS).read_text())
    params["files"]["embeddings"] = "dense/other.npy"
    (folder / PARAMS).write_text(json.dumps(params))
    relist(folder, PARAMS)
    refused(folder, capsys, f"{folder / PARAMS}: expected field 'files.embeddings' naming one of the files")

    folder = copy(root / "idx", tmp_path / "faiss")
    outside = tmp_path / "index.faiss"
    shutil.copyfile(folder / FAISS_FILE, outside)
    replace_with_link(folder, FAISS_FILE, outside)
    refused(folder, capsys, f"{folder / FAISS_FILE}: expected", "outside it")


@pytest.mark.parametrize(("change", "needle"), [
    (lambda p: p.update(query_chunk=1.5), "query_chunk: expected an integer, found 1.5"),
    (lambda p: p.update(threads="2"), "threads: expected an integer, found '2'"),
    (lambda p: p.update(sublinear_tf=1), "sublinear_tf: expected true or false, found 1"),
    (lambda p: p.update(unknown=1), "unexpected keyword argument 'unknown'"),
])
def test_mistyped_build_parameters(base, tmp_path, capsys, change, needle):
    folder = copy(base, tmp_path)
    edit_manifest(folder, lambda m: change(m["parameters"]))
    refused(folder, capsys, f"{folder / MANIFEST}: parameters do not fit this library", needle)


def test_bound_re_ranker_folder_outside_or_not_verified(base, tmp_path, capsys):
    """An index's own re-ranker folder: a link out of the index, or a file the manifest does not list, is
    refused before transformers reads anything."""
    folder = copy(base, tmp_path)
    edit_manifest(folder, lambda m: m.update(reranker={"name": "r", "path": "reranker", "sha256": "x"}))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere", folder / "reranker")
    refused(folder, capsys, f"{folder / 'reranker'}: expected the index's re-ranker folder inside it", "a link to")
    (folder / "reranker").unlink()
    (folder / "reranker").mkdir()
    (folder / "reranker" / "config.json").write_text("{}")
    refused(folder, capsys, f"{folder / 'reranker' / 'config.json'}: not listed in the manifest")
