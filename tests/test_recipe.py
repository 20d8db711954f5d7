"""Recipes (`linker.recipe`, `linker recipe run|plan`): one TOML file builds a whole system, each stage cached by
the hash of its settings and inputs; test data is read once, by the evaluation stage, and counted in a ledger."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from linker import datasets as dataset_module
from linker.cli.main import main
from linker.link import Linker
from linker.recipe import Digests, Ledger, RecipeError, load_recipe, plan_recipe, run_recipe

from conftest import FIXTURES, ROOT, SHARED_DATA

EXAMPLE = ROOT / "recipes" / "examples" / "meddra-tiny.toml"
SPANS = ROOT / "recipes" / "examples" / "meddra-tiny"
MEDDRA = FIXTURES / "meddra"


def write_recipe(folder: Path, *, index: str = 'kind = "tfidf"\nprior = ["train"]', extra: str = "",
                 name: str = "recipe.toml", calibrate: str = '[calibrate]\ndataset = "dev"\n',
                 evaluate: str = 'test = "test"\ntrain = ["train"]\nfilters = ["full", "train0.2"]\nk = [1, 3]') -> Path:
    """A tf-idf recipe over the MedDRA fixture and the example's labelled spans (absolute paths)."""
    text = f"""
[datasets]
train = "tsv:{SPANS / 'train.tsv'}"
dev = "tsv:{SPANS / 'dev.tsv'}"
test = "tsv:{SPANS / 'test.tsv'}"

[dictionary.meddra]
sources = [
  {{ source = "meddra", paths = ["{MEDDRA / 'MedDRA_26_1_English'}", "{MEDDRA / 'MedDRA_26_1_Spanish'}"] }},
  {{ mentions = "train" }},
]
{extra}
[index]
{index}

{calibrate}
[evaluate]
{evaluate}
"""
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def ledger_count(out: Path, name: str = "test") -> int:
    return Ledger(out / "test_ledger.json").counts().get(name, 0)


@pytest.fixture
def test_reads(monkeypatch):
    """How often each dataset file is read (every loader goes through `LOADERS`)."""
    reads: dict[str, int] = {}
    registry = dataset_module.LOADERS
    for fmt in registry.names():
        def counting(spec, loader=registry.get(fmt)):
            reads[os.path.abspath(spec.path)] = reads.get(os.path.abspath(spec.path), 0) + 1
            return loader(spec)

        monkeypatch.setitem(registry._entries, fmt, counting)  # a registry refuses a second entry; tests swap it
    return reads


# ----------------------------------------------------------------------------- end to end, caching, the ledger


def test_example_recipe_runs_loads_and_a_rerun_does_no_work(tmp_path, test_reads):
    out = tmp_path / "out"
    result = run_recipe(load_recipe(EXAMPLE), out)
    assert result.complete and result.ran == ["dictionary.meddra", "index", "calibrate", "evaluate"]
    assert test_reads[str(SPANS / "test.tsv")] == 1
    linker = Linker.load(out / "index")
    top = linker.link(["pain in the head", "shingles"], k=1)
    assert [r.candidates[0].concept_id for r in top] == ["10019211", "10019974"]
    assert top[0].candidates[0].confidence is not None  # calibrated on dev
    card = json.loads((out / "model_card.json").read_text())
    assert card["test_evaluations"] == {"test": 1} and card["metrics"]["test"]["rows"][0]["n"] == 8
    assert [s["stage"] for s in card["stages"]] == result.ran and all(len(s["key"]) == 64 for s in card["stages"])
    assert "test: 1" in (out / "model_card.md").read_text() and (out / "reports" / "test.md").is_file()
    assert (out / "recipe.toml").read_text() == EXAMPLE.read_text()

    again = run_recipe(load_recipe(EXAMPLE), out)
    assert again.ran == [] and again.cached == result.ran
    assert test_reads[str(SPANS / "test.tsv")] == 1  # not read again
    assert ledger_count(out) == 1
    assert json.loads((out / "model_card.json").read_text())["test_evaluations"] == {"test": 1}


def test_changing_an_index_option_reruns_index_and_what_follows_only(tmp_path):
    out = tmp_path / "out"
    first = run_recipe(load_recipe(write_recipe(tmp_path)), out)
    changed = write_recipe(tmp_path, index='kind = "tfidf"\nprior = ["train"]\ntfidf = { ngram_min = 2 }')
    plan = plan_recipe(load_recipe(changed), out)
    assert plan.status == {"dictionary.meddra": "cached", "index": "stale", "calibrate": "stale", "evaluate": "stale"}
    second = run_recipe(load_recipe(changed), out)
    assert second.cached == ["dictionary.meddra"] and second.ran == ["index", "calibrate", "evaluate"]
    assert first.plan.stage("dictionary.meddra").key == second.plan.stage("dictionary.meddra").key
    assert ledger_count(out) == 2  # a new system scored on the same test set: counted
    manifest = json.loads((out / "index" / "manifest.json").read_text())
    assert manifest["parameters"]["ngram_min"] == 2  # OUT/index is the new one
    # back to the first settings: every stage is still cached, nothing runs and nothing is counted
    third = run_recipe(load_recipe(write_recipe(tmp_path)), out)
    assert third.ran == [] and ledger_count(out) == 2


def test_changing_a_dataset_file_reruns_what_reads_it(tmp_path):
    spans = tmp_path / "train.tsv"
    spans.write_text((SPANS / "train.tsv").read_text(), encoding="utf-8")
    recipe = write_recipe(tmp_path)
    recipe.write_text(recipe.read_text().replace(str(SPANS / "train.tsv"), str(spans)), encoding="utf-8")
    out = tmp_path / "out"
    run_recipe(load_recipe(recipe), out)
    spans.write_text(spans.read_text() + "10019211\thead is pounding\ten\n", encoding="utf-8")
    again = run_recipe(load_recipe(recipe), out)
    assert again.ran == ["dictionary.meddra", "index", "calibrate", "evaluate"]


def test_until_stops_before_the_test_set_is_read(tmp_path, test_reads):
    out = tmp_path / "out"
    partial = run_recipe(load_recipe(EXAMPLE), out, until="index")
    assert not partial.complete and partial.ran == ["dictionary.meddra", "index"]
    assert str(SPANS / "test.tsv") not in test_reads and not (out / "test_ledger.json").exists()
    rest = run_recipe(load_recipe(EXAMPLE), out)
    assert rest.cached == ["dictionary.meddra", "index"] and rest.ran == ["calibrate", "evaluate"]
    assert test_reads[str(SPANS / "test.tsv")] == 1 and ledger_count(out) == 1


def test_an_output_folder_linker_did_not_write_is_refused(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(Exception, match="did not write"):
        run_recipe(load_recipe(EXAMPLE), out)
    assert (out / "notes.txt").read_text() == "keep me"


def test_cli_plan_and_run(tmp_path, capsys):
    out = tmp_path / "out"
    main(["recipe", "plan", str(EXAMPLE), "--out", str(out)])
    printed = capsys.readouterr().out
    assert "dictionary.meddra" in printed and printed.count(" new") == 4 and "test evaluations so far: none" in printed
    main(["-q", "recipe", "run", str(EXAMPLE), "--out", str(out), "--device", "cpu"])
    printed = capsys.readouterr().out
    assert "test: full n=8" in printed and "4 stage(s) ran" in printed
    main(["recipe", "plan", str(EXAMPLE), "--out", str(out)])
    printed = capsys.readouterr().out
    assert printed.count(" cached") == 4 and "test evaluations so far: test 1" in printed
    main(["link", "--index", str(out / "index"), "feeling sick", "--k", "1"])
    assert "10028813" in capsys.readouterr().out


# ----------------------------------------------------------------------------- refusals: one line each

BAD = {  # case: (index table, other parts, key, found, the line that should be named)
    "unknown key": ('kind = "tfidf"\nngram = 3', {}, "index.ngram", "the unknown key 'ngram'", "ngram = 3"),
    "wrong type": ('kind = "tfidf"', {"evaluate": 'test = "test"\nk = "1,5"'}, "evaluate.k", "'1,5' (a string)",
                   'k = "1,5"'),
    "unknown kind": ('kind = "bm25"', {}, "index.kind", "'bm25' (a string)", 'kind = "bm25"'),
    "test set for calibration": ('kind = "tfidf"', {"calibrate": '[calibrate]\ndataset = "test"\n'},
                                 "calibrate.dataset", "'test'", 'dataset = "test"'),
    "model of a stage not defined": ('kind = "dense"\nencoder = "@biosyn"', {}, "index.encoder", "'@biosyn'",
                                     'encoder = "@biosyn"'),
    "bad training setting": ('kind = "tfidf"', {"extra": '[sap]\nbatch_size = 1\n'}, "sap",
                             "batch size must be >= 2", "[sap]"),
    "unknown dataset": ('kind = "tfidf"\nprior = ["trian"]', {}, "index.prior[0]", "'trian'", 'prior = ["trian"]'),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_recipe_is_refused_in_one_line(tmp_path, case):
    index, kwargs, key, found, marker = BAD[case]
    path = write_recipe(tmp_path, index=index, **kwargs)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), start=1) if text.strip() == marker)
    with pytest.raises(RecipeError) as error:
        load_recipe(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}:{line}: {key}: expected "), message
    assert found in message.split("found", 1)[1], message


def test_a_missing_file_and_broken_toml_are_refused_in_one_line(tmp_path, capsys):
    path = write_recipe(tmp_path)
    path.write_text(path.read_text().replace("test.tsv", "tset.tsv"), encoding="utf-8")
    with pytest.raises(RecipeError, match=r"recipe.toml:5: datasets.test: expected an existing file .* found '.*tset.tsv'"):
        load_recipe(path)
    path.write_text("[index]\nkind = \n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main(["recipe", "plan", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.count("\n") == 1
    assert err.startswith(f"error: {path}:2: expected valid TOML, found Invalid value"), err
    path.write_text("[index]\nkind = 'tfidf'\n[evaluate]\n", encoding="utf-8")
    with pytest.raises(RecipeError, match=r"dictionary: expected a \[dictionary\] table"):
        load_recipe(path)
    with pytest.raises(RecipeError, match="no such file"):
        load_recipe(tmp_path / "absent.toml")


def test_the_test_set_may_not_hide_under_another_name(tmp_path):
    path = write_recipe(tmp_path)
    text = path.read_text().replace(f'dev = "tsv:{SPANS / "dev.tsv"}"', f'dev = "tsv:{SPANS / "test.tsv"}"')
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError, match="datasets.dev: expected mentions other than those of the test set 'test'"):
        load_recipe(path)


# ----------------------------------------------------------------------------- training stages (tiny encoder)


def trained_recipe(folder: Path, encoder: Path, *, index_extra: str = "") -> Path:
    train = FIXTURES / "train"
    (folder / "dev.tsv").write_text("D003\theadache\nD005\tjoint pain\nD008\thigh blood pressure\nD012\tfatigue\n")
    (folder / "test.tsv").write_text("D001\thair loss\nD004\tfever\nD011\tdizziness\nD010\tliver injury\n")
    text = f"""
[recipe]
encoder = "{encoder}"

[datasets]
train = "tsv:{train / 'mentions.tsv'}"
dev = "tsv:dev.tsv"
test = "tsv:test.tsv"

[dictionary.synonyms]
sources = [{{ source = "tsv", paths = ["{train / 'dict.tsv'}"] }}]

[dictionary.names]
sources = [{{ source = "tsv", paths = ["{train / 'biosyn_dict.tsv'}"] }}, {{ mentions = "train" }}]

[sap]
dictionary = "synonyms"
batch_size = 4
lr = 1e-3
seed = 3

[biosyn]
dictionary = "names"
encoder = "@sap"
train = ["train", "dev"]
epochs = 2
batch_size = 4
topk = 4

[biosyn.choose]
dev = "dev"
grid = {{ lr = [1e-4, 1e-3] }}
epochs = true

[rerank]
dictionary = "names"
encoder = "@sap"
train = ["train"]
negatives = 2
fetch = 8
batch_size = 4
max_queries = 8
rerank_k = 4

[index]
kind = "dense"
dictionary = "names"
encoder = "@biosyn"
{index_extra}

[index.dense]
compile = "off"

[calibrate]
dataset = "dev"

[evaluate]
test = "test"
train = ["train"]
filters = ["full", "train0.2"]
k = [1, 5]
"""
    path = folder / "trained.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.slow
def test_sap_biosyn_rerank_recipe_on_a_tiny_encoder(tmp_path, tiny_encoder_dir):
    out = tmp_path / "out"
    recipe = load_recipe(trained_recipe(tmp_path, tiny_encoder_dir))
    result = run_recipe(recipe, out, device="cpu", threads=1)
    assert result.complete and result.ran == ["dictionary.synonyms", "dictionary.names", "sap", "biosyn", "rerank",
                                              "index", "calibrate", "evaluate"]
    choice = json.loads((result.plan.folder("biosyn") / "choice.json").read_text())
    assert len(choice["points"]) == 2 and 1 <= choice["chosen"]["epochs"] <= 2  # chosen on dev, both points scored
    for model in ("sap", "biosyn", "rerank"):
        assert (out / "models" / model / "config.json").is_file()  # links into the stage folders
    linker = Linker.load(out / "index")
    assert linker.reranker is not None and linker.calibration is not None
    assert len(linker.link(["alopecia"], k=2)[0].candidates) == 2
    assert ledger_count(out) == 1 and not (out / "work").exists() or not any((out / "work").iterdir())
    card = json.loads((out / "model_card.json").read_text())
    rerank = next(iter(card["metrics"].values()))["rerank"]  # the re-ranker's gain per filter reaches the card
    assert rerank["rerank_k"] == 4 and {"retriever_acc1", "reranked_acc1"} <= set(rerank["rows"][0])

    again = run_recipe(load_recipe(trained_recipe(tmp_path, tiny_encoder_dir)), out, device="cpu", threads=1)
    assert again.ran == [] and ledger_count(out) == 1
    changed = load_recipe(trained_recipe(tmp_path, tiny_encoder_dir, index_extra='prior = ["train"]'))
    third = run_recipe(changed, out, device="cpu", threads=1)
    assert third.ran == ["index", "calibrate", "evaluate"]  # no training again
    assert ledger_count(out) == 2


# ----------------------------------------------------------------------------- the committed recipes


RECIPES = sorted((ROOT / "recipes").rglob("*.toml"))


def test_every_committed_recipe_parses_and_its_paths_resolve(tmp_path):
    assert len(RECIPES) >= 8
    have_data = SHARED_DATA.is_dir() and SHARED_DATA.resolve() == (ROOT.parent / "shared" / "data").resolve()
    digests = Digests()
    for path in RECIPES:
        recipe = load_recipe(path, check_paths=have_data)
        text = path.read_text()
        if "examples" not in path.parts:
            assert "Reproduces:" in text and recipe.expect.get("acc1") and recipe.expect.get("report"), path
            assert (ROOT / recipe.expect["report"]).is_file() or not (ROOT / "eval").is_dir(), recipe.expect["report"]
        if have_data:
            plan = plan_recipe(recipe, tmp_path / recipe.name, digests=digests)
            assert set(plan.status.values()) == {"new"} and plan.stages[-1].name == "evaluate", path
            assert all(d.path.exists() for d in recipe.datasets.values()), path


def test_the_ncbi_recipe_runs_on_another_pubtator_corpus_by_its_paths_alone(tmp_path, shared_data):
    """Another PubTator disease corpus with MEDIC ids: a renamed subset of NCBI-disease stands in for it."""
    ncbi = shared_data / "ncbi_disease"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, name in (("train", "NCBItrainset_corpus.txt"), ("dev", "NCBIdevelopset_corpus.txt"),
                        ("test", "NCBItestset_corpus.txt")):
        abstracts = (ncbi / name).read_text(encoding="utf-8").split("\n\n")
        (corpus / f"{split}.PubTator.txt").write_text("\n\n".join(abstracts[:20]) + "\n", encoding="utf-8")
    original = (ROOT / "recipes" / "ncbi-disease.toml").read_text()
    text = original
    for split, name in (("train", "NCBItrainset_corpus.txt"), ("dev", "NCBIdevelopset_corpus.txt"),
                        ("test", "NCBItestset_corpus.txt")):
        text = text.replace(f"../shared/data/ncbi_disease/{name}", str(corpus / f"{split}.PubTator.txt"))
    text = text.replace(', typos = "../shared/data/ncbi_disease/ncbi-spell-check.txt"', "")
    changed = [(a, b) for a, b in zip(original.splitlines(), text.splitlines()) if a != b]
    assert len(changed) == 6 and all("path" in a or "options" in a for a, _ in changed)  # paths (and the typo list)
    path = tmp_path / "other-corpus.toml"
    path.write_text(text.replace("../shared/data", str(shared_data)), encoding="utf-8")
    recipe = load_recipe(path)
    plan = plan_recipe(recipe, tmp_path / "out")
    ncbi_plan = plan_recipe(load_recipe(ROOT / "recipes" / "ncbi-disease.toml"), tmp_path / "out")
    same = [s.name for s, t in zip(plan.stages, ncbi_plan.stages) if s.key == t.key]
    assert same == ["dictionary.medic", "sap"]  # MEDIC and sap are shared; everything reading the corpus differs
    # it runs: the dictionaries, the corpus's train mentions among the index's names (training takes hours on a CPU)
    result = run_recipe(recipe, tmp_path / "out", until="dictionary")
    assert result.ran == ["dictionary.medic", "dictionary.index"]
    built = json.loads((result.plan.folder("dictionary.index") / "stage.json").read_text())["result"]
    assert built["rows"] > json.loads((result.plan.folder("dictionary.medic") / "stage.json").read_text())["result"]["rows"]
