"""The input/output path policy (`linker.fileio.check_output`) that every command shares (issue 34).

An output may never equal, contain or lie inside any path the command reads: the --input, the index
folder, model folders (--rerank, --encoder), dataset files and the files their options name (typos=).
Checked against generated spellings of paths (relative, `..`, symlinks, hard links, trailing slashes), and
through the CLI with a real tiny index whose files must stay byte-identical. An output created by someone
else after the check is never replaced without --overwrite (exclusive create / no-replace rename).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_one_line_error, cli
from linker.datasets import spec_inputs
from linker.dictionary import SourceSpec, build_dictionary
from linker.errors import ConfigError
from linker.fileio import Input, atomic_dir, atomic_file, check_output, input_relation, model_inputs, rename_no_replace
from linker.index import build_index, load_index

FIX = Path(__file__).parent / "fixtures"
NAMES = FIX / "tsv" / "names.tsv"
PUBTATOR = FIX / "eval" / "pubtator_slice.txt"


def digest(path: Path) -> dict[str, str]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


# ----------------------------------------------------------------------------- the policy on generated paths

TREE_DIRS = ("a", "a/b", "c")
TREE_FILES = ("a/f.txt", "a/b/g.txt", "c/h.txt")
TREE_LINKS = {"la": "a", "lb": "a/b", "lf": "a/f.txt"}  # symlinks: name -> target
SEGMENTS = ["a", "b", "c", "la", "lb", "lf", "hl", "f.txt", "g.txt", "h.txt", "new", "..", "."]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tree").resolve()
    for folder in TREE_DIRS:
        (root / folder).mkdir(parents=True)
    for file in TREE_FILES:
        (root / file).write_text(file)
    for name, target in TREE_LINKS.items():
        (root / name).symlink_to(root / target)
    os.link(root / "a/f.txt", root / "hl")  # the same file under another name
    return root


@st.composite
def spellings(draw) -> str:
    """A path into the tree, spelled any way a user could: relative or absolute, through symlinks, with
    `..`, `.`, doubled and trailing slashes."""
    parts = draw(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=4))
    text = "/".join(parts)
    if draw(st.booleans()):
        text = text.replace("/", "//", 1)
    if draw(st.booleans()):
        text += "/"
    return text


def oracle(output: str, source: str) -> str | None:
    """The relation, computed apart from linker's code: realpath prefixes, then samefile for hard links."""
    out, src = os.path.realpath(output), os.path.realpath(source)
    same = out == src or (os.path.exists(out) and os.path.exists(src) and os.path.samefile(out, src))
    if same:
        return "is"
    if os.path.commonpath([out, src]) == src:
        return "lies inside"
    if os.path.commonpath([out, src]) == out:
        return "contains"
    return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(output=spellings(), inputs=st.lists(spellings(), min_size=1, max_size=3), absolute=st.booleans())
def test_check_output_refuses_exactly_the_outputs_that_touch_an_input(tree, monkeypatch, output, inputs, absolute):
    monkeypatch.chdir(tree)
    if absolute:
        output = str(tree / output)
    expected = next(((oracle(output, source), source) for source in inputs if oracle(output, source)), None)
    assert (input_relation(output, inputs[0]) or None) == oracle(output, inputs[0])
    try:
        check_output(output, inputs=inputs, overwrite=True)
        message = None
    except ConfigError as exc:
        message = str(exc)
    if expected is None:  # other refusals (a file in the way, a folder for a file) are fine, not an input one
        assert message is None or " the input " not in message, message
    else:
        relation, source = expected
        assert message is not None and f" {relation} the input {Path(source)}" in message, (message, expected)


def test_model_and_dataset_options_name_their_local_paths(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    assert model_inputs(None, "--rerank") == model_inputs("none", "--rerank") == []
    assert model_inputs("minilm", "--encoder") == model_inputs("owner/hub-model", "--encoder") == []
    assert model_inputs(str(model), "--rerank") == [Input(model, "--rerank")]
    assert model_inputs(f"{model}#cls", "--encoder") == [Input(model, "--encoder")]
    named = spec_inputs(f"pubtator:{tmp_path}/p.txt#typos={tmp_path}/t.txt&abbrev", "--train")
    assert [i.path for i in named] == [tmp_path / "p.txt", tmp_path / "t.txt"]
    assert str(named[1]) == f"the input {tmp_path}/t.txt (typos= of --train {tmp_path}/p.txt)"
    assert [i.path for i in spec_inputs("brat:d/x.ann")] == [Path("d/x.ann"), Path("d/x.txt")]


# ----------------------------------------------------------------------------- the CLI on a real index


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("policy")
    build_dictionary([SourceSpec("tsv", (NAMES,))], folder / "names.parquet")
    build_index(folder / "names.parquet", kind="tfidf", out=folder / "idx")
    return folder


@pytest.fixture
def work(built, tmp_path, monkeypatch) -> Path:
    """A fresh copy of the index as V, the table, and spans, in a working directory."""
    shutil.copytree(built / "idx", tmp_path / "V")
    shutil.copy(built / "names.parquet", tmp_path / "names.parquet")
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "hair loss"}) + "\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("args", [
    ["normalize", "--index", "V", "--input", "a.jsonl", "--format", "jsonl", "--output", "V/manifest.json"],
    ["normalize", "--index", "V", "--input", "a.jsonl", "--format", "jsonl", "--output", "V"],
    ["normalize", "--index", "V/", "--input", "a.jsonl", "--format", "jsonl", "--output", "./V/../V/tfidf"],
    ["link", "--index", "V", "--input", "a.jsonl", "--output", "V/concepts.parquet"],
    ["link", "--index", "VL", "--input", "a.jsonl", "--output", "V/concepts.parquet"],  # VL: a symlink to V
    ["eval", "--index", "V", "--dataset", f"pubtator:{PUBTATOR}", "--report", "V/report"],
    ["index", "build", "--dict", "names.parquet", "--out", "V", "--prior", "tsv:V/held.tsv"],
    ["index", "build", "--dict", "V/concepts.parquet", "--out", "V"],
])
def test_an_output_in_the_index_folder_is_refused_and_the_index_stays_intact(work, capsys, args):
    (work / "VL").symlink_to(work / "V")
    (work / "V" / "held.tsv").write_text("C0002170\thair loss\n")
    before = digest(work / "V")
    code, err = cli([*args, "--overwrite"], capsys)
    assert_one_line_error(code, err, "the input V", "choose an output outside every input")
    assert digest(work / "V") == before
    load_index(work / "V")  # still loads and verifies


def test_model_folders_are_inputs(work, capsys):
    """--rerank and --encoder folders: refused before any model is loaded (R is not even a model)."""
    (work / "R").mkdir()
    (work / "R" / "config.json").write_text("{}")
    before = digest(work / "R")
    code, err = cli(["link", "--index", "V", "--input", "a.jsonl", "--output", "R/config.json", "--rerank", "R",
                     "--overwrite"], capsys)
    assert_one_line_error(code, err, "--output R/config.json lies inside the input R (--rerank)")
    code, err = cli(["normalize", "--index", "V", "--input", "a.jsonl", "--format", "jsonl", "--output", "R",
                     "--rerank", "R", "--overwrite"], capsys)
    assert_one_line_error(code, err, "is the input R (--rerank)")
    code, err = cli(["train", "sap", "--dict", "names.parquet", "--encoder", "R", "--out", "R/m"], capsys)
    assert_one_line_error(code, err, "--out R/m lies inside the input R (--encoder)")
    assert digest(work / "R") == before


def test_eval_report_never_overwrites_the_typo_list(work, capsys):
    (work / "p.txt").write_bytes(PUBTATOR.read_bytes())
    (work / "r.md").write_text("hair||hairs\n")
    before = digest(work / "r.md")
    code, err = cli(["eval", "--index", "V", "--dataset", "pubtator:p.txt#typos=r.md", "--report", "r",
                     "--overwrite"], capsys)
    assert_one_line_error(code, err, "--report r.md is the input r.md (typos= of --dataset p.txt)")
    assert digest(work / "r.md") == before and not (work / "r.json").exists()


def test_calibrate_never_overwrites_its_gold_file(work, capsys):
    gold = work / "V" / "calibration.json"
    gold.write_text("C0002170\thair loss\nC0002170\talopecia\nC0018681\theadache\n")
    before = digest(work / "V")
    code, err = cli(["calibrate", "--index", "V", "--dataset", "tsv:V/calibration.json"], capsys)
    assert_one_line_error(code, err, "V/calibration.json is the input V/calibration.json (--dataset)")
    assert digest(work / "V") == before
    shutil.copy(gold, work / "held.tsv")  # the same file outside the index: calibrate writes calibration.json
    code, err = cli(["calibrate", "--index", "V", "--dataset", "tsv:held.tsv"], capsys)
    assert code == 0, err
    assert json.loads(gold.read_text())["scorer"]


def test_dict_build_out_named_after_its_source_folder(work, capsys):
    """Issue 34 case 14: `--source meddra DIR --out DIR.parquet` was refused, naming one path twice."""
    shutil.copytree(FIX / "meddra", work / "M")
    code, err = cli(["dict", "build", "--source", "meddra", "M", "--out", "M.parquet"], capsys)
    assert code == 0, err
    assert (work / "M.parquet").is_file() and (work / "M.hierarchy.parquet").is_file()
    # A real clash of the side table still is refused, and the message names --out and the input apart.
    shutil.copy(work / "M.parquet", work / "X.hierarchy.parquet")
    code, err = cli(["dict", "merge", "X.hierarchy.parquet", "--out", "X.parquet"], capsys)
    assert_one_line_error(code, err, "--out X.parquet: its hierarchy side table X.hierarchy.parquet is the input "
                              "X.hierarchy.parquet")


@pytest.mark.parametrize("command", ["link", "normalize"])
def test_huge_max_line_bytes_is_one_line(work, capsys, command):
    extra = ["--format", "jsonl"] if command == "normalize" else []
    code, err = cli([command, "--index", "V", "--input", "a.jsonl", *extra, "--output", "o.jsonl",
                     "--max-line-bytes", "99999999999999999999999"], capsys)
    assert_one_line_error(code, err, "--max-line-bytes")


# ----------------------------------------------------------------------------- races and full disks


def test_a_file_created_after_the_check_is_not_replaced(tmp_path):
    out = tmp_path / "out.txt"
    check_output(out)
    out.write_text("someone else's")  # after the start-of-run check
    with pytest.raises(ConfigError, match="created by someone else"):
        with atomic_file(out) as tmp:
            tmp.write_text("ours")
    assert out.read_text() == "someone else's" and list(tmp_path.iterdir()) == [out]
    check_output(out, overwrite=True)  # asked for: replaced
    with atomic_file(out) as tmp:
        tmp.write_text("ours")
    assert out.read_text() == "ours"


def test_a_folder_filled_after_the_check_is_not_replaced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()  # an empty folder may be the output
    check_output(out, folder=True)
    with pytest.raises(ConfigError, match="created by someone else"):
        with atomic_dir(out) as tmp:
            (out / "theirs.txt").write_text("someone else's")  # while this run writes
            (tmp / "ours.txt").write_text("ours")
    assert [p.name for p in out.iterdir()] == ["theirs.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    check_output(empty, folder=True)
    with atomic_dir(empty) as tmp:
        (tmp / "ours.txt").write_text("ours")
    assert (empty / "ours.txt").read_text() == "ours"


def test_the_exclusive_create_holds_without_hard_links_or_renameat2(tmp_path, monkeypatch):
    import linker.fileio as fileio

    monkeypatch.setattr(fileio.os, "link", lambda *a, **k: (_ for _ in ()).throw(PermissionError(errno.EPERM, "no")))
    for renameat2 in (fileio._renameat2(), None):
        monkeypatch.setattr(fileio, "_renameat2", lambda renameat2=renameat2: renameat2)
        out = tmp_path / f"out-{renameat2 is None}.txt"
        check_output(out)
        out.write_text("theirs")
        with pytest.raises(ConfigError, match="created by someone else"):
            with atomic_file(out) as tmp:
                tmp.write_text("ours")
        assert out.read_text() == "theirs"
        src, dst = tmp_path / "src", tmp_path / f"dst-{renameat2 is None}"
        src.write_text("x")
        rename_no_replace(src, dst)
        assert dst.read_text() == "x" and not src.exists()
        src.write_text("y")
        with pytest.raises(FileExistsError):
            rename_no_replace(src, dst)
        assert dst.read_text() == "x"


def test_the_cli_does_not_replace_an_output_that_appears_during_the_run(work, capsys, monkeypatch):
    import linker.normalize as normalize

    real = normalize.normalize_jsonl_lines

    def slow(*args, **kwargs):
        (work / "o.jsonl").write_text("someone else's\n")  # while linking
        return real(*args, **kwargs)

    monkeypatch.setattr(normalize, "normalize_jsonl_lines", slow)
    code, err = cli(["normalize", "--index", "V", "--input", "a.jsonl", "--format", "jsonl", "--output", "o.jsonl"],
                    capsys)
    assert_one_line_error(code, err, "o.jsonl", "created by someone else", "--overwrite")
    assert (work / "o.jsonl").read_text() == "someone else's\n"
    assert sorted(p.name for p in work.iterdir()) == ["V", "a.jsonl", "names.parquet", "o.jsonl"]  # no temporary


def test_a_full_disk_names_the_output(work, capsys, monkeypatch):
    import linker.normalize as normalize

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what a write() on a full disk raises

    monkeypatch.setattr(normalize, "write_jsonl", full)
    code, err = cli(["normalize", "--index", "V", "--input", "a.jsonl", "--format", "jsonl", "--output", "o.jsonl"],
                    capsys)
    assert_one_line_error(code, err, "error: o.jsonl: No space left on device")
    assert sorted(p.name for p in work.iterdir()) == ["V", "a.jsonl", "names.parquet"]  # no output, no temporary


def test_an_output_named_dash_is_refused_where_no_standard_output_is_written(tmp_path, monkeypatch, capsys):
    # `--output -` means standard output to a user; a command that writes files must not create ./- instead
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="standard output"):
        check_output("-")
    code, err = cli(["dict", "build", "--source", "default", "--out", "-"], capsys)
    assert_one_line_error(code, err, "--out -", "standard output")
    assert not (tmp_path / "-").exists()
