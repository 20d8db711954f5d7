"""The hybrid's sparse weight tuned on a dev split (linker.eval.tune, `linker index tune`)."""

from __future__ import annotations

import json

import pytest

from index_tables import write_concepts
from linker.cli.main import main
from linker.datasets import load_dataset
from linker.errors import ConfigError
from linker.eval.tune import parse_grid, tune_sparse_weight, weight_scores
from linker.index import build_index, load_index
from linker.index.dense import DenseConfig
from linker.index.hybrid import HybridConfig
from linker.index.tfidf import TfidfConfig
from linker.link import Linker

DEV = ["10008479\tthoracic pains", "10019211\tcefalea", "10047700\tvomits", "10037660\tfiebre alta",
       "10028813\tnausea and sickness", "10019211\thead pain"]


def test_parse_grid():
    assert parse_grid("0,0.5,1,0.5") == (0.0, 0.5, 1.0)
    for bad in ("", "0,2", "a,b", "-0.1"):
        with pytest.raises(ConfigError, match="--grid takes comma-separated tf-idf shares"):
            parse_grid(bad)


def test_weights_in_old_manifests_and_both_zero():
    params = {"tfidf": {}, "dense": {}, "sparse_weight": 0.3}  # written before dense_weight existed
    assert HybridConfig.from_dict(params).dense_weight == 1.0
    with pytest.raises(ConfigError, match="both 0"):
        HybridConfig(sparse_weight=0.0, dense_weight=0.0)
    with pytest.raises(ConfigError, match="dense_weight must be"):
        HybridConfig(dense_weight=float("nan"))


def test_tuning_a_tfidf_index_is_refused(tmp_path):
    table = write_concepts(tmp_path / "c.parquet")
    build_index(table, kind="tfidf", out=tmp_path / "t")
    dev = tmp_path / "dev.tsv"
    dev.write_text("\n".join(DEV) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="a tfidf index has no sparse weight"):
        tune_sparse_weight(tmp_path / "t", f"tsv:{dev}")


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_encoder_dir):
    folder = tmp_path_factory.mktemp("tune")
    table = write_concepts(folder / "concepts.parquet")
    dense = DenseConfig(encoder=str(tiny_encoder_dir), threads=1)
    build_index(table, kind="dense", out=folder / "dense", config=dense)
    build_index(table, kind="tfidf", out=folder / "tfidf", config=TfidfConfig())
    build_index(table, kind="hybrid", out=folder / "hybrid", config=HybridConfig(dense=dense))
    (folder / "dev.tsv").write_text("\n".join(DEV) + "\n", encoding="utf-8")
    return folder


@pytest.mark.slow
def test_grid_ends_rank_as_the_dense_and_the_tfidf_index(built):
    hybrid = Linker.load(built / "hybrid")
    queries = ["thoracic pains", "cefalea", "vomits", "fiebre alta", "head pain", "pyrexia"]
    for end, kind in (((0.0, 1.0), "dense"), ((1.0, 0.0), "tfidf")):
        hybrid.index.names.sparse_weight, hybrid.index.names.dense_weight = end
        alone = Linker.load(built / kind).link(queries, k=3)
        mixed = hybrid.link(queries, k=3)
        assert [[c.concept_id for c in r.candidates] for r in mixed] == \
               [[c.concept_id for c in r.candidates] for r in alone], kind


@pytest.mark.slow
def test_weight_scores_restore_the_weights_and_encode_queries_once(built, monkeypatch):
    linker_ = Linker.load(built / "hybrid")
    names = linker_.index.names
    calls = []
    encode = names.dense.encode_queries
    monkeypatch.setattr(names.dense, "encode_queries", lambda q: calls.append(len(q)) or encode(q))
    mentions = load_dataset(f"tsv:{built / 'dev.tsv'}")
    scores = weight_scores(linker_, mentions, [(0.0, 1.0), (0.5, 0.5), (1.0, 0.0)], ks=(1, 5),
                           subsets={"first": [0], "all": range(len(mentions)), "none": []})
    assert len(calls) == 1 and calls[0] == len(DEV)  # one encoding for the whole grid
    assert (names.sparse_weight, names.dense_weight) == (1.0, 1.0)
    assert [s["sparse_weight"] for s in scores] == [0.0, 0.5, 1.0] and all(s["n"] == 6 for s in scores)
    assert all(0 <= s["acc1"] <= s["acc5"] <= 1 for s in scores)
    for s in scores:  # subsets are scored from the same predictions
        whole, first = s["subsets"]["all"], s["subsets"]["first"]
        assert (whole["n"], whole["acc1"], whole["acc5"]) == (6, s["acc1"], s["acc5"])
        assert first["n"] == 1 and first["acc1"] in (0.0, 1.0) and s["subsets"]["none"]["n"] == 0
    alone = weight_scores(linker_, mentions[:1], [(w["sparse_weight"], w["dense_weight"]) for w in scores], ks=(1, 5))
    assert [a["acc1"] for a in alone] == [s["subsets"]["first"]["acc1"] for s in scores]


@pytest.mark.slow
def test_tune_stores_the_chosen_weight_and_dev_scores(built, tmp_path):
    import shutil

    folder = tmp_path / "hybrid"
    shutil.copytree(built / "hybrid", folder)
    record = tune_sparse_weight(folder, f"tsv:{built / 'dev.tsv'}", grid=(0.0, 0.25, 0.5, 0.75, 1.0))
    assert record["chosen"]["acc1"] >= max(record["dense_acc1"], record["tfidf_acc1"])
    assert record["chosen"]["acc1"] == max(s["acc1"] for s in record["scores"]) and record["mentions"] == 6
    index = load_index(folder)  # the rewritten manifest still verifies
    assert index.manifest["sparse_weight_tuning"] == record
    a = record["chosen"]["a"]
    assert index.manifest["parameters"]["sparse_weight"] == a and index.manifest["parameters"]["dense_weight"] == 1 - a
    assert (index.names.sparse_weight, index.names.dense_weight) == (a, 1 - a)
    assert record["previous"] == {"sparse_weight": 1.0, "dense_weight": 1.0}


@pytest.mark.slow
def test_cli_tune_and_build_with_learned_or_tuned_weight(built, tmp_path, tiny_encoder_dir, capsys):
    import shutil

    table = built / "concepts.parquet"
    encoder = tmp_path / "encoder"
    shutil.copytree(tiny_encoder_dir, encoder)
    build = ["index", "build", "--dict", str(table), "--kind", "hybrid", "--encoder", str(encoder), "--threads", "1"]
    with pytest.raises(SystemExit) as code:
        main([*build, "--out", str(tmp_path / "l"), "--sparse-weight", "learned"])
    assert code.value.code == 1 and "biosyn.json" in capsys.readouterr().err
    (encoder / "biosyn.json").write_text(json.dumps({"sparse_weight": 0.25}), encoding="utf-8")
    main([*build, "--out", str(tmp_path / "l"), "--sparse-weight", "learned"])
    assert load_index(tmp_path / "l").manifest["parameters"]["sparse_weight"] == 0.25
    with pytest.raises(SystemExit) as code:
        main([*build, "--out", str(tmp_path / "t"), "--sparse-weight", "tuned"])
    assert code.value.code == 1 and "--dev" in capsys.readouterr().err
    main([*build, "--out", str(tmp_path / "t"), "--sparse-weight", "tuned", "--dev", f"tsv:{built / 'dev.tsv'}"])
    assert "sparse_weight_tuning" in load_index(tmp_path / "t").manifest
    capsys.readouterr()
    main(["index", "tune", "--index", str(tmp_path / "l"), "--dataset", f"tsv:{built / 'dev.tsv'}", "--grid", "0,1"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["grid"] == [0.0, 1.0] and printed["previous"]["sparse_weight"] == 0.25
    with pytest.raises(SystemExit) as code:
        main([*build, "--out", str(tmp_path / "x"), "--sparse-weight", "heavy"])
    assert code.value.code == 1 and "learned, tuned or a number" in capsys.readouterr().err
