"""Release folders under attack: shipped model folders are inputs of every command, a release is replaced only by
one of its own kind, and a tagger's manifest is checked field by field and against its `decoding_sha256`.

Every case runs on tmp_path copies (the package's linker/models copied, `linker.folders.MODELS_DIR` pointed there)
and asserts that the victim's files keep their sha256. Nothing trains: each command is refused before any work."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli

import linker.folders
from linker.models import DECODING_DIGEST, MANIFEST, decoding_digest, read_release, release_folder

pytest.importorskip("torch")
SHIPPED_AE_WEIGHTS = "44eed8d4eac9deab97e7188b5d2cc8a83076b6dfa083fcfb0d8410de513f05db"


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    """A copy of the package's linker/models that the library takes for its own; the cache root beside it."""
    copy = tmp_path / "pkg" / "linker" / "models"
    shutil.copytree(release_folder("linker-en").parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(linker.folders, "MODELS_DIR", copy)
    monkeypatch.setenv("LINKER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "encoders").mkdir(parents=True)
    return copy


@pytest.fixture
def text(tmp_path) -> Path:
    path = tmp_path / "case.txt"
    path.write_text("Severe rash after starting lamotrigine.\n", encoding="utf-8")
    return path


@pytest.fixture
def train_data(tmp_path) -> list:
    """`train extractor`'s data options, pointing at folders that exist (nothing is read before the refusal)."""
    for name in ("phee", "tac"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text("x")
    return ["--phee-train", tmp_path / "phee", "--phee-dev", tmp_path / "phee", "--tac", tmp_path / "tac"]


# ----------------------------------------------------------------------------- shipped folders are inputs


@pytest.mark.parametrize("name, target, options", [
    ("linker-en", "weights.safetensors", ["--overwrite"]),  # the probe: the weights replaced by spans
    ("linker-multi", "x.jsonl", []),  # the probe: a new file written into the folder
    ("linker-multi", "", ["--format", "brat", "--overwrite"]),  # the folder itself as a brat output folder
])
def test_extract_output_into_a_shipped_model_folder_is_refused(models, text, capsys, name, target, options):
    before = digests(models / name)
    output = models / name / target
    code, err = cli(["extract", "--input", text, "--output", output, *options], capsys)
    assert_one_line_error(code, err, f"--output {output} lies inside the input {models}",
                          "(the models shipped with linker)")
    assert digests(models / name) == before and not (models / "linker-multi" / "x.jsonl").exists()


def test_an_output_into_the_model_cache_is_refused(models, text, tmp_path, capsys):
    output = tmp_path / "cache" / "encoders" / "spans.jsonl"
    code, err = cli(["extract", "--input", text, "--output", output], capsys)
    assert_one_line_error(code, err, f"--output {output} lies inside the input", "(the model cache)")
    assert not output.exists()


def test_train_extractor_over_an_encoder_release_is_refused(models, train_data, tmp_path, capsys):
    """`--overwrite` replaces a tagger, never an encoder (nor another shipped folder, nor a copy elsewhere)."""
    elsewhere = tmp_path / "my-encoder"
    shutil.copytree(models / "linker-en", elsewhere)
    for out in (models / "linker-en", elsewhere):
        before = digests(out)
        code, err = cli(["train", "extractor", *train_data, "--out", out, "--overwrite"], capsys)
        assert_one_line_error(code, err, f"--out {out} holds a release of kind 'encoder', not 'tagger'")
        assert digests(out) == before
    code, err = cli(["train", "extractor", *train_data, "--out", models / "linker-en" / "sub", "--overwrite"], capsys)
    assert_one_line_error(code, err, "lies inside the input", "the models shipped with linker")


def test_train_release_over_a_tagger_is_refused(models, tmp_path, capsys):
    (tmp_path / "data").mkdir()
    before = digests(models / "linker-ae")
    code, err = cli(["train", "release", "linker-en", "--data", tmp_path / "data", "--work", tmp_path / "work",
                     "--out", models / "linker-ae"], capsys)
    assert_one_line_error(code, err, f"--out {models / 'linker-ae'} holds a release of kind 'tagger', not 'encoder'")
    assert digests(models / "linker-ae") == before
    code, err = cli(["train", "release", "linker-en", "--data", tmp_path / "data", "--work", models / "work"], capsys)
    assert_one_line_error(code, err, f"--work {models / 'work'} lies inside the input", "the models shipped with linker")
    assert not (models / "work").exists()


def test_tune_only_on_an_encoder_release_names_its_kind(models, train_data, capsys):
    before = digests(models / "linker-en")
    code, err = cli(["train", "extractor", *train_data, "--out", models / "linker-en", "--tune-only"], capsys)
    assert_one_line_error(code, err, f"--out {models / 'linker-en'} holds a release of kind 'encoder', not 'tagger'")
    assert digests(models / "linker-en") == before


# ----------------------------------------------------------------------------- the tagger's manifest


def test_shipped_tagger_manifest_is_covered_by_its_digest():
    from linker.extract.extractor import tagger_config

    release = read_release(release_folder("linker-ae"))
    assert release.manifest["files"]["weights.safetensors"]["sha256"] == SHIPPED_AE_WEIGHTS
    assert release.manifest[DECODING_DIGEST] == decoding_digest(release.manifest)
    config = tagger_config(release.folder, release.manifest)
    assert (config.max_length, config.stride, dict(config.thresholds)["AdverseEvent"]) == (128, 96, 0.7)


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("edit, needles", [
    ({"threshold": {"AdverseEvent": float("nan")}}, ["field 'threshold.AdverseEvent'", "finite number", "found NaN"]),
    ({"threshold": {"AdverseEvent": "0.8"}}, ["field 'threshold.AdverseEvent'", 'found "0.8"']),
    ({"threshold": {"AdverseEvent": 1.5}}, ["field 'threshold.AdverseEvent'", "from 0 to 1", "found 1.5"]),
    ({"threshold": {"Nothing": 0.5}}, ["field 'threshold'", "keys among", 'found "Nothing"']),
    ({"stride": 0}, ["field 'stride'", "an integer from 1 to 126", "found 0"]),
    ({"stride": -96}, ["field 'stride'", "found -96"]),
    ({"max_length": 2}, ["field 'max_length'", "an integer from 3 to 512", "found 2"]),
    ({"max_length": 128.0}, ["field 'max_length'", "found 128.0"]),
    ({"labels": []}, ["field 'labels'", "a list of 1 to 64 distinct label names", "found []"]),
    ({"labels": ["Drug", "Drug"]}, ["field 'labels'", "distinct"]),
    ({"frozen_layers": None}, ["field 'frozen_layers'", "found null"]),
    ({"split": {"Drug": 1}}, ["field 'split.Drug'", "true or false", "found 1"]),
    ({"decision_cut": 1.5}, ["field 'decision_cut'", "from 0 to 1", "found 1.5"]),
    ({"threshold": {"AdverseEvent": 0.5}}, ["field 'decoding_sha256'", "changed after the release was written"]),
    ({DECODING_DIGEST: None}, ["field 'decoding_sha256'", "found null"]),
    ({"history": "DEEP:100000"}, ["manifest.json: expected a release manifest (JSON)", "RecursionError"]),
    ({"history": "DEEP:40"}, ["manifest.json: expected JSON nested at most 32 levels deep"]),
])
def test_tagger_manifest_fields_are_checked_in_one_line(tmp_path, text, capsys, edit, needles):
    """`linker extract --model COPY` with one field of the copy's manifest edited (its digest left as written)."""
    copy = tmp_path / "linker-ae"
    shutil.copytree(release_folder("linker-ae"), copy)
    manifest = json.loads((copy / MANIFEST).read_text(encoding="utf-8"))
    for field, value in edit.items():
        manifest[field] = {**manifest[field], **value} if isinstance(value, dict) and field == "threshold" else value
    body = json.dumps(manifest, indent=2)
    deep = manifest.get("history")
    if isinstance(deep, str) and deep.startswith("DEEP:"):
        body = body.replace(json.dumps(deep), _deep(int(deep[5:])))
    (copy / MANIFEST).write_text(body, encoding="utf-8")
    before = digests(copy)
    code, err = cli(["extract", "--input", text, "--output", tmp_path / "out.jsonl", "--model", copy], capsys)
    assert_one_line_error(code, err, f"{copy / MANIFEST}", *needles)
    assert digests(copy) == before and not (tmp_path / "out.jsonl").exists()


def test_an_edited_field_with_its_digest_recomputed_is_still_range_checked(tmp_path):
    from linker.errors import InputFormatError
    from linker.extract.extractor import load_extractor

    copy = tmp_path / "linker-ae"
    shutil.copytree(release_folder("linker-ae"), copy)
    manifest = json.loads((copy / MANIFEST).read_text(encoding="utf-8"))
    manifest["stride"] = 0
    manifest[DECODING_DIGEST] = decoding_digest(manifest)
    (copy / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"manifest.json: field 'stride': expected an integer from 1 to 126"):
        load_extractor(copy)
