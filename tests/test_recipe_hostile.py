"""Hostile recipes (issue 44): no recipe, name or output folder destroys a file, a tampered cache is never used,
and the dictionary include check is linear, order-free, bounded in depth and names cycles.

Each case is what a probe did: `--out` inside a dataset folder, a dictionary source, an index, a model folder or
the models shipped in the package; a name of `../../../x`; a cached stage edited between runs; dictionaries that
each include the next twice (exponential before), one that includes a dictionary defined later (KeyError before),
and 1,500 chained dictionaries (RecursionError before)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, assert_one_line_error, cli
from linker.dictionary import SourceSpec, build_dictionary
from linker.folders import MODELS_DIR
from linker.index import build_index, load_index
from linker.link import Linker
from linker.recipe import RecipeError, load_recipe, plan_recipe, run_recipe
from linker.recipe.schema import MAX_INCLUDE_DEPTH

SPANS = ROOT / "recipes" / "examples" / "meddra-tiny"
MEDDRA = FIXTURES / "meddra" / "MedDRA_26_1_English"


def digest(path: Path) -> dict[str, str]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def victims(folder: Path) -> dict[str, Path]:
    """Copies of everything a recipe reads, in `folder`: spans, a brat corpus, a MedDRA release, a model folder."""
    data = folder / "data"
    data.mkdir()
    for split in ("train", "dev", "test"):
        shutil.copy(SPANS / f"{split}.tsv", data / f"{split}.tsv")
    corpus = folder / "corpus"
    corpus.mkdir()
    (corpus / "doc1.txt").write_text("I had a headache all day.\n")
    (corpus / "doc1.ann").write_text("T1\tDisorder 8 16\theadache\n#1\tAnnotatorNotes T1\t10019211\n")
    meddra = folder / "meddra"
    shutil.copytree(MEDDRA, meddra)
    model = folder / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return {"data": data, "corpus": corpus, "meddra": meddra, "model": model}


def recipe_text(v: dict[str, Path], *, meta: str = "", dictionaries: str | None = None, index: str = "",
                dev: str | None = None) -> str:
    dictionaries = dictionaries if dictionaries is not None else (
        f'[dictionary.meddra]\nsources = [{{ source = "meddra", paths = ["{v["meddra"]}"] }}, '
        '{ mentions = "train" }]\n')
    return f"""[recipe]
{meta}

[datasets]
train = "tsv:{v['data'] / 'train.tsv'}"
dev = "{dev or f"tsv:{v['data'] / 'dev.tsv'}"}"
test = "tsv:{v['data'] / 'test.tsv'}"

{dictionaries}
[index]
kind = "tfidf"
{index}

[calibrate]
dataset = "dev"

[evaluate]
test = "test"
filters = ["full"]
k = [1]
"""


def write(folder: Path, text: str, name: str = "recipe.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- --out never touches an input


OUT_CASES = {  # case: (the output, relative to tmp_path; what the error names)
    "inside a dataset folder (brat)": ("corpus/out", "lies inside the input {corpus} (datasets.dev)"),
    "onto a dataset file": ("data/train.tsv", "is the input {data}/train.tsv (datasets.train)"),
    "inside a dictionary source": ("meddra/out", "lies inside the input {meddra} (dictionary.meddra.sources[0])"),
    "inside the encoder's folder": ("model/out", "lies inside the input {model} (recipe.encoder)"),
    "around the datasets": ("data", "contains the input {data}/train.tsv (datasets.train)"),
    "inside the folder of the tsv datasets": ("data/out", "lies inside the input {data} (the folder of datasets.train)"),
}


@pytest.mark.parametrize("case", sorted(OUT_CASES))
def test_run_out_never_touches_what_the_recipe_reads(tmp_path, capsys, case):
    v = victims(tmp_path)
    recipe = write(tmp_path, recipe_text(v, meta=f'encoder = "{v["model"]}"', dev=f"brat:{v['corpus']}"))
    (v["data"] / ".linker-recipe").write_text("{}")  # a planted marker: the old guard let this folder be used
    before = {name: digest(path) for name, path in v.items()}
    given, needle = OUT_CASES[case]
    for command in ("run", "plan"):  # plan refuses it too, before anyone runs it
        code, err = cli(["recipe", command, recipe, "--out", tmp_path / given], capsys)
        assert_one_line_error(code, err, f"--out {tmp_path / given} ", needle.format(**v),
                              "choose an output outside every input")
    assert {name: digest(path) for name, path in v.items()} == before
    assert not (tmp_path / given / "stages").exists()  # the planted marker is among the digests above


def test_run_out_inside_an_index_folder_is_refused_and_the_index_still_verifies(tmp_path, capsys):
    v = victims(tmp_path)
    build_dictionary([SourceSpec("tsv", (FIXTURES / "tsv" / "names.tsv",))], tmp_path / "names.parquet")
    build_index(tmp_path / "names.parquet", kind="tfidf", out=tmp_path / "V")
    before = digest(tmp_path / "V")
    code, err = cli(["recipe", "run", write(tmp_path, recipe_text(v)), "--out", tmp_path / "V" / "recipe"], capsys)
    assert_one_line_error(code, err, f"lies inside {tmp_path / 'V'}, a folder linker wrote")
    assert digest(tmp_path / "V") == before and not (tmp_path / "V" / "recipe").exists()
    load_index(tmp_path / "V")  # verifies every file against its manifest


def test_out_inside_the_shipped_models_is_refused(tmp_path, capsys):
    v = victims(tmp_path)
    before = digest(MODELS_DIR)
    code, err = cli(["recipe", "plan", write(tmp_path, recipe_text(v, meta='encoder = "linker-en"')), "--out",
                     MODELS_DIR / "linker-en" / "x"], capsys)
    assert_one_line_error(code, err, f"lies inside the input {MODELS_DIR} (the models shipped with linker)")
    assert digest(MODELS_DIR) == before


@pytest.mark.parametrize("place", ["work", "stages/{evaluate}", "models"])
def test_a_link_where_a_run_writes_is_refused(finished, tmp_path, capsys, place):
    """A symbolic link put in the output folder between runs would send the run's writes into what it points at."""
    recipe, original = finished
    out = tmp_path / "out"
    shutil.copytree(original, out, symlinks=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep me")
    link = out / place.format(evaluate=stage_folder(out, "evaluate").name)
    shutil.rmtree(link, ignore_errors=True)
    link.symlink_to(victim, target_is_directory=True)
    code, err = cli(["recipe", "run", recipe, "--out", out], capsys)
    assert_one_line_error(code, err, f"{link} is a symbolic link (to {victim})", "remove the link")
    assert digest(victim) == {"keep.txt": hashlib.sha256(b"keep me").hexdigest()}


def test_the_output_marker_is_never_written_through_a_link(finished, tmp_path):
    recipe, original = finished
    out = tmp_path / "out"
    shutil.copytree(original, out, symlinks=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / ".linker-recipe").unlink()
    (out / ".linker-recipe").symlink_to(victim)
    assert run_recipe(load_recipe(recipe), out).ran == []
    assert victim.read_text() == "keep me" and not (out / ".linker-recipe").is_symlink()


# ----------------------------------------------------------------------------- names are identifiers


@pytest.mark.parametrize("name", ["../../../x", "/tmp/x", "a/b", "..", "a..b", ".hidden", "x" * 101, "na me"])
def test_a_recipe_name_that_is_a_path_is_refused_at_parse_time(tmp_path, name):
    path = write(tmp_path, recipe_text(victims(tmp_path), meta=f"name = {json.dumps(name)}"))
    with pytest.raises(RecipeError) as error:
        load_recipe(path)
    assert str(error.value).startswith(f"{path}:2: recipe.name: expected a name of letters, digits"), error.value
    assert repr(name) in str(error.value) and "\n" not in str(error.value)


def test_a_traversing_name_writes_nothing_outside_out_recipes(tmp_path, capsys, monkeypatch):
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    recipe = write(tmp_path, recipe_text(victims(tmp_path), meta='name = "../../../x"'))
    code, err = cli(["recipe", "run", recipe], capsys)
    assert_one_line_error(code, err, "recipe.name: expected a name", "'../../../x'")
    assert not (tmp_path / "x").exists() and not (work / "out").exists()


def test_a_file_name_that_is_no_identifier_needs_a_name(tmp_path):
    v = victims(tmp_path)
    path = write(tmp_path, recipe_text(v), name="my recipe.toml")
    with pytest.raises(RecipeError, match=r"found 'my recipe' \(the file's name: \[recipe\] sets no name\)"):
        load_recipe(path)
    path.write_text(recipe_text(v, meta='name = "mine-2.1_x"'))
    assert load_recipe(path).name == "mine-2.1_x"


# ----------------------------------------------------------------------------- a tampered cache is never used


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """A finished tiny run (recipe, output folder), copied by each test that alters it."""
    folder = tmp_path_factory.mktemp("finished")
    recipe = write(folder, recipe_text(victims(folder)))
    run_recipe(load_recipe(recipe), folder / "out")
    return recipe, folder / "out"


def unstamped(files: dict[str, str]) -> dict[str, str]:
    """Files whose bytes a run fixes: not those that hold when or by which process they were written."""
    stamped = ("stage.json", ".linker-output", "manifest.json", "calibration.json", "reports/")
    return {k: v for k, v in files.items() if not any(k.endswith(s) or k.startswith(s) for s in stamped)}


def stage_folder(out: Path, stage: str) -> Path:
    return next((out / "stages").glob(f"{stage}-*"))


TAMPER = {  # case: (stage, how it is altered, what the re-run says, what runs again)
    "a changed file": ("calibrate", lambda f: (f / "index" / "calibration.json").write_text('{"method": "forged"}'),
                       "index/calibration.json: expected sha256", ["calibrate"]),
    "an added file": ("index", lambda f: (f / "index" / "tfidf" / "extra.npy").write_bytes(b"\0" * 64),
                      "index/tfidf/extra.npy not written by the stage", ["index"]),
    "a removed file": ("dictionary.meddra", lambda f: (f / "concepts.hierarchy.parquet").unlink(),
                       "concepts.hierarchy.parquet missing", ["dictionary.meddra"]),
    "an edited record": ("evaluate", lambda f: (f / "stage.json").write_text(
        (f / "stage.json").read_text().replace('"n": 8', '"n": 80')), "stage.json edited", ["evaluate"]),
}


@pytest.mark.parametrize("case", sorted(TAMPER))
def test_a_cached_stage_altered_between_runs_is_computed_again(finished, tmp_path, case):
    recipe, original = finished
    out = tmp_path / "out"
    shutil.copytree(original, out, symlinks=True)
    stage, alter, said, ran = TAMPER[case]
    clean = digest(stage_folder(out, stage))
    final = digest(out / "index")
    alter(stage_folder(out, stage))
    shutil.rmtree(out / "index")  # so that the final index is assembled again, from the altered stage before
    lines: list[str] = []
    result = run_recipe(load_recipe(recipe), out, echo=lines.append)
    assert result.ran == ran, lines
    assert any(f"running (altered: {said}" in line for line in lines), lines
    restored = digest(stage_folder(out, stage))
    assert restored.keys() == clean.keys()  # the stage as a run writes it: nothing added, nothing missing
    # the final index is the one computed again (its files those of the calibrate stage), never the altered one
    assert digest(out / "index") == digest(stage_folder(out, "calibrate") / "index")
    assert unstamped(digest(out / "index")) == unstamped(final)
    assert "forged" not in (out / "index" / "calibration.json").read_text()
    assert json.loads((out / "model_card.json").read_text())["metrics"]["test"]["rows"][0]["n"] == 8
    assert Linker.load(out / "index").link(["shingles"], k=1)[0].candidates[0].concept_id == "10019974"
    again: list[str] = []
    assert run_recipe(load_recipe(recipe), out, echo=again.append).ran == []  # sealed again: cached from now on


# ----------------------------------------------------------------------------- dictionary includes


def chain(v: dict[str, Path], levels: int, *, twice: bool = False) -> str:
    """Dictionaries d0 .. d{levels-1}, each including the next (twice with `twice`); the last reads MedDRA."""
    parts = []
    for i in range(levels - 1):
        include = f'{{ dictionary = "d{i + 1}" }}'
        parts.append(f"[dictionary.d{i}]\nsources = [{include}{', ' + include if twice else ''}]\n")
    parts.append(f'[dictionary.d{levels - 1}]\nsources = [{{ source = "meddra", paths = ["{v["meddra"]}"] }}]\n')
    return "\n".join(parts)


@pytest.mark.parametrize("levels", [26, 60])
def test_dictionaries_that_each_include_the_next_twice_plan_in_linear_time(tmp_path, levels):
    """2**26 walks took over 100 s before; 2**60 would never end. Each dictionary is entered once now."""
    v = victims(tmp_path)
    path = write(tmp_path, recipe_text(v, dictionaries=chain(v, levels, twice=True), index='dictionary = "d0"'))
    assert len(path.read_bytes()) > 1000
    started = time.perf_counter()
    plan = plan_recipe(load_recipe(path), tmp_path / "out")
    assert time.perf_counter() - started < 5
    names = [s.name for s in plan.stages if s.step == "dictionary"]
    assert names == [f"dictionary.d{i}" for i in reversed(range(levels))]  # each after those it includes


def test_a_dictionary_may_include_one_defined_later(tmp_path):
    v = victims(tmp_path)
    dictionaries = (f'[dictionary.all]\nsources = [{{ dictionary = "meddra" }}, {{ mentions = "train" }}]\n\n'
                    f'[dictionary.meddra]\nsources = [{{ source = "meddra", paths = ["{v["meddra"]}"] }}]\n')
    path = write(tmp_path, recipe_text(v, dictionaries=dictionaries, index='dictionary = "all"'))
    recipe = load_recipe(path)
    assert [s.name for s in plan_recipe(recipe, tmp_path / "out").stages][:2] == ["dictionary.meddra",
                                                                                   "dictionary.all"]
    result = run_recipe(recipe, tmp_path / "out", until="dictionary")
    assert result.ran == ["dictionary.meddra", "dictionary.all"]
    rows = {name: json.loads((result.plan.folder(name) / "stage.json").read_text())["result"]["rows"]
            for name in result.ran}
    assert rows["dictionary.all"] > rows["dictionary.meddra"]  # MedDRA's names and the training spans


def test_a_chain_deeper_than_the_bound_is_refused_in_one_line(tmp_path, capsys):
    """1,500 chained dictionaries gave a RecursionError traceback."""
    v = victims(tmp_path)
    path = write(tmp_path, recipe_text(v, dictionaries=chain(v, 1500), index='dictionary = "d0"'))
    code, err = cli(["recipe", "plan", path], capsys)
    assert_one_line_error(code, err, f"{path}:", "dictionary.d0.sources: expected dictionaries included at most "
                          f"{MAX_INCLUDE_DEPTH} deep", f"found d0 -> d1 -> d2 -> ... -> d{MAX_INCLUDE_DEPTH} "
                          f"({MAX_INCLUDE_DEPTH + 1} deep)")
    exactly = write(tmp_path, recipe_text(v, dictionaries=chain(v, MAX_INCLUDE_DEPTH), index='dictionary = "d0"'),
                    name="deepest.toml")
    assert len(load_recipe(exactly).dictionaries) == MAX_INCLUDE_DEPTH  # the bound itself is allowed


@pytest.mark.parametrize("includes, cycle", [
    ({"a": ["b"], "b": ["c"], "c": ["a"]}, "a -> b -> c -> a"),
    ({"a": ["b"], "b": ["b"], "c": []}, "b -> b"),
    ({"a": ["c", "b"], "b": ["c"], "c": ["b"]}, "c -> b -> c"),
])
def test_a_cycle_of_includes_is_refused_in_one_line_naming_it(tmp_path, includes, cycle):
    v = victims(tmp_path)
    parts = []
    for name, children in includes.items():
        sources = [*(f'{{ dictionary = "{c}" }}' for c in children),
                   f'{{ source = "meddra", paths = ["{v["meddra"]}"] }}']
        parts.append(f"[dictionary.{name}]\nsources = [{', '.join(sources)}]\n")
    path = write(tmp_path, recipe_text(v, dictionaries="\n".join(parts), index='dictionary = "a"'))
    with pytest.raises(RecipeError) as error:
        load_recipe(path)
    message = str(error.value)
    assert "\n" not in message and f"expected dictionaries that do not include themselves, found {cycle}" in message
    assert message.startswith(f"{path}:"), message


def test_run_out_inside_a_model_release_the_recipe_does_not_name_is_refused(tmp_path, capsys):
    # A release copied by hand carries no marker of ours; its manifest says what it is.
    v = victims(tmp_path)
    shutil.copytree(MODELS_DIR / "linker-en", tmp_path / "linker-en")
    before = digest(tmp_path / "linker-en")
    code, err = cli(["recipe", "run", write(tmp_path, recipe_text(v)), "--out", tmp_path / "linker-en" / "o"], capsys)
    assert_one_line_error(code, err, f"lies inside {tmp_path / 'linker-en'}, a model release of kind 'encoder'")
    assert digest(tmp_path / "linker-en") == before and not (tmp_path / "linker-en" / "o").exists()


def test_datasets_kept_beside_the_recipe_may_have_the_output_beside_them(tmp_path):
    v = victims(tmp_path)
    recipe = load_recipe(write(v["data"], recipe_text(v)))
    from linker.recipe.runner import check_out_inputs

    check_out_inputs(v["data"] / "out", recipe)  # the recipe's own folder: no refusal
