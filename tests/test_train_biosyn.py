"""BioSyn fine-tuning: candidates, loss, a tiny real training run, outputs, errors, CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from linker.datasets import Mention, load_dataset
from linker.dictionary import SourceSpec, build_dictionary
from linker.encoders import load_encoder
from linker.errors import ConfigError, LinkerError, MissingInputError
from linker.train.biosyn import (
    BiosynConfig, dense_top, load_dictionary, merge_candidates, train_biosyn, training_queries, watched_acc1,
)
from linker.train.losses import marginal_nll

FIX = Path(__file__).parent / "fixtures" / "train"
TRAIN = f"tsv:{FIX / 'mentions.tsv'}"


@pytest.fixture()
def biosyn_dict(tmp_path) -> Path:
    out = tmp_path / "biosyn_dict.parquet"
    build_dictionary([SourceSpec("tsv", (FIX / "biosyn_dict.tsv",))], out)
    return out


def mention_acc1(model_dir: str, dict_path: Path) -> float:
    """Dense Acc@1 of the 12 training synonyms against the dictionary (which lacks them)."""
    dictionary = load_dictionary(dict_path)
    queries, _ = training_queries(load_dataset(TRAIN), BiosynConfig())
    encoder = load_encoder(model_dir)
    names = encoder.encode(list(dictionary.names), role="passage")
    top = dense_top(encoder.encode([q.text for q in queries], role="query"), names, 1)[:, 0]
    return float(np.mean([dictionary.keys[r] in q.gold for q, r in zip(queries, top)]))


def test_marginal_nll_sums_over_all_positive_candidates():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
    positive = torch.tensor([[True, True, False], [False, False, False], [False, False, True]])
    loss, used = marginal_nll(logits, positive)
    probs = torch.softmax(logits, dim=1)
    expected = -(torch.log(probs[0, 0] + probs[0, 1]) + torch.log(probs[2, 2])) / 2  # row 1: no positive, left out
    assert used == 2 and loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss, used = marginal_nll(logits[1:2], positive[1:2])
    assert used == 0 and loss.item() == 0.0


def test_candidates_take_dense_half_then_new_sparse_rows():
    dense = np.array([[5, 3, 9, 8]])
    sparse = np.array([[3, 7, -1, -1]])  # 3 already taken from dense; -1 = the sparse list ran short
    assert merge_candidates(dense, sparse, 4, 0.5).tolist() == [[5, 3, 7, 9]]
    assert merge_candidates(dense, sparse, 4, 0.0).tolist() == [[3, 7, 5, 9]]
    q = np.array([[1.0, 0.0]], dtype=np.float32)
    d = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.6, 0.8]], dtype=np.float32)
    assert dense_top(q, d, 3).tolist() == [[1, 2, 3]]  # tie between rows 1 and 2: lower row first


def test_training_queries_drop_composites_and_duplicates(biosyn_dict):
    mentions = load_dataset(TRAIN) + [Mention("Alopecia", (("D001",),)), Mention("alopecia", (("D001",),))]
    queries, stats = training_queries(mentions, BiosynConfig())
    assert stats == {"mentions": 16, "composite_dropped": 1, "unique_queries": 13, "queries": 13}
    assert [q.text for q in queries][-1] == "unknown syndrome" and queries[0].gold == frozenset({"D001"})
    assert len(training_queries(mentions, BiosynConfig(max_queries=4, seed=2))[0]) == 4
    assert load_dictionary(biosyn_dict).names[:2] == ("hair loss", "fracture of femur")


@pytest.mark.slow
def test_biosyn_training_improves_mention_retrieval(tmp_path, tiny_encoder_dir, biosyn_dict):
    out = tmp_path / "models" / "biosyn"
    # lr 1e-3 for a random 2-layer model (BioSyn's 1e-5 is for a pretrained BERT); topk 8 of 20 names.
    config = BiosynConfig(lr=1e-3, batch_size=4, epochs=8, topk=8, threads=1, seed=1)
    before = mention_acc1(str(tiny_encoder_dir), biosyn_dict)
    summary = train_biosyn(TRAIN, biosyn_dict, encoder=str(tiny_encoder_dir), out=out, config=config,
                           monitor=load_dataset(TRAIN))
    after = mention_acc1(str(out), biosyn_dict)
    assert before < 0.35 and after > 0.6, (before, after)  # measured with these seeds: 0.23 -> 0.77
    metrics = json.loads((out / "train_metrics.json").read_text())
    losses = [e["mean_loss"] for e in metrics["epochs"]]
    assert len(losses) == 8 and losses[-1] < 0.6 * losses[0]
    # 13 queries (composite dropped); D999 is never a positive; 4 batches per epoch, those with no
    # positive at all (D999 alone in the last batch of 1) make no step
    skipped = sum(e["batches_without_positive"] for e in metrics["epochs"])
    assert metrics["extra"]["queries"]["queries"] == 13 and summary["steps"] + skipped == 32
    assert all(e["queries_without_positive"] >= 1 for e in metrics["epochs"])
    assert metrics["epochs"][-1]["train_dense_acc1_before_epoch"] > metrics["epochs"][0]["train_dense_acc1_before_epoch"]
    # the watched mentions (here the training ones) get the same Acc@1 as a separate evaluation, within
    # one of 13 queries (training may encode in bf16), before the first epoch and after the last
    watched = metrics["epochs"][0]["monitor_dense_acc1_before_epoch"], metrics["extra"]["monitor_dense_acc1_after_training"]
    assert watched == pytest.approx((before, after), abs=1 / 13 + 1e-6)
    weight = json.loads((out / "biosyn.json").read_text())["sparse_weight"]
    assert weight == metrics["extra"]["sparse_weight"] != 0.0  # learned from BioSyn's initial 0
    config_json = json.loads((out / "train_config.json").read_text())
    assert config_json["config"]["topk"] == 8 and str(FIX / "mentions.tsv") in config_json["data_sha256"]


def test_the_watched_number_is_recomputed_from_a_saved_model_with_its_prompts(tmp_path, tiny_e5_encoder_dir,
                                                                                  biosyn_dict):
    """A model trained on a lent GPU is checked here by recomputing its logged monitor number from the folder:
    mentions as queries ("query: "), names as passages, as training encodes them."""
    out = tmp_path / "watched"
    config = BiosynConfig(lr=1e-3, batch_size=4, epochs=1, topk=8, threads=1, seed=1, precision="fp32")
    train_biosyn(TRAIN, biosyn_dict, encoder=str(tiny_e5_encoder_dir), out=out, config=config,
                 monitor=load_dataset(TRAIN))
    logged = json.loads((out / "train_metrics.json").read_text())["extra"]["monitor_dense_acc1_after_training"]
    assert watched_acc1(out, biosyn_dict, TRAIN, config) == logged


def test_freezing_layers_keeps_them_fixed(tmp_path, tiny_encoder_dir, biosyn_dict):
    out = tmp_path / "frozen"
    config = BiosynConfig(lr=1e-2, batch_size=8, epochs=1, topk=4, freeze_layers=2, threads=1)
    summary = train_biosyn(TRAIN, biosyn_dict, encoder=str(tiny_encoder_dir), out=out, config=config)
    assert summary["parameters"]["trainable"] < summary["parameters"]["parameters"]
    base = load_encoder(str(tiny_encoder_dir)).model[0].auto_model.state_dict()
    trained = load_encoder(str(out)).model[0].auto_model.state_dict()
    assert torch.equal(base["encoder.layer.1.output.dense.weight"], trained["encoder.layer.1.output.dense.weight"])
    assert torch.equal(base["embeddings.word_embeddings.weight"], trained["embeddings.word_embeddings.weight"])
    with pytest.raises(ConfigError, match="only 2 layers"):
        train_biosyn(TRAIN, biosyn_dict, encoder=str(tiny_encoder_dir), out=tmp_path / "frozen3",
                     config=BiosynConfig(freeze_layers=3, topk=4))


def test_gold_alternative_ids_resolve_through_xrefs(tmp_path):
    # MEDIC keys a disease by its MeSH id and keeps its OMIM id in xrefs; NCBI annotates either.
    medic = tmp_path / "medic.txt"
    medic.write_text("C567755|613097||Tooth agenesis, selective, 6|STHAG6\nD006527||Wilson disease\n")
    build_dictionary([SourceSpec("tsv", (medic,))], tmp_path / "medic.parquet")
    dictionary = load_dictionary(tmp_path / "medic.parquet")
    assert set(dictionary.keys) == {"C567755", "D006527"}
    assert dictionary.resolve(frozenset({"OMIM:613097"})) == {"OMIM:613097", "C567755"}
    assert dictionary.resolve(frozenset({"D006527"})) == {"D006527"}


def test_bad_inputs_raise_linker_errors(tmp_path, tiny_encoder_dir, biosyn_dict, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    enc = str(tiny_encoder_dir)
    with pytest.raises(MissingInputError, match="no such concept table"):
        train_biosyn(TRAIN, tmp_path / "none.parquet", encoder=enc, out=tmp_path / "m")
    with pytest.raises(MissingInputError):
        train_biosyn(f"tsv:{tmp_path / 'none.tsv'}", biosyn_dict, encoder=enc, out=tmp_path / "m")
    with pytest.raises(ConfigError, match="fewer than --topk"):
        train_biosyn(TRAIN, biosyn_dict, encoder=enc, out=tmp_path / "m", config=BiosynConfig(topk=50))
    with pytest.raises(LinkerError, match="offline choices"):
        train_biosyn(TRAIN, biosyn_dict, encoder="no-such/encoder-xyz", out=tmp_path / "m", config=BiosynConfig(topk=4))
    with pytest.raises(ConfigError, match="dense-ratio"):
        BiosynConfig(dense_ratio=1.5)
    assert not (tmp_path / "m").exists()


def test_cli_biosyn(tmp_path, tiny_encoder_dir, biosyn_dict, capsys):
    from linker.cli.main import main

    out = tmp_path / "cli-biosyn"
    main(["train", "biosyn", "--train", TRAIN, "--train", TRAIN, "--dict", str(biosyn_dict), "--encoder",
          str(tiny_encoder_dir), "--out", str(out), "--topk", "4", "--epochs", "1", "--batch-size", "8", "--threads", "1",
          "--max-length", "12"])
    summary = json.loads(capsys.readouterr().out)
    # the same file twice (as train + dev would be): its mentions twice, deduplicated into the same queries
    from linker.datasets import load_dataset

    assert summary["queries"]["mentions"] == 2 * len(load_dataset(TRAIN))
    assert summary["steps"] == 2 and (out / "biosyn.json").is_file()
    run_config = json.loads((out / "train_config.json").read_text())
    assert run_config["data"]["train"] == [TRAIN, TRAIN] and run_config["config"]["max_length"] == 12
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "biosyn", "--train", TRAIN, "--dict", str(biosyn_dict), "--encoder", str(tiny_encoder_dir),
              "--out", str(out), "--dense-ratio", "2"])
    assert exit_info.value.code == 1
    assert "--dense-ratio must be within [0, 1], found 2.0" in capsys.readouterr().err


@pytest.mark.slow
def test_biosyn_resume_restores_model_optimizer_and_sparse_weight(tmp_path, tiny_encoder_dir, biosyn_dict, monkeypatch):
    from linker.train import common

    config = BiosynConfig(lr=1e-3, batch_size=8, epochs=2, topk=4, threads=1, seed=4)
    enc = str(tiny_encoder_dir)
    straight = train_biosyn(TRAIN, biosyn_dict, encoder=enc, out=tmp_path / "straight", config=config)
    monkeypatch.setattr(common, "write_outputs", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        train_biosyn(TRAIN, biosyn_dict, encoder=enc, out=tmp_path / "resumed", config=config)
    monkeypatch.undo()
    resumed = train_biosyn(TRAIN, biosyn_dict, encoder=enc, out=tmp_path / "resumed", config=config, resume=True)
    assert resumed["resumed"] and resumed["steps"] == straight["steps"]
    assert resumed["sparse_weight"] == pytest.approx(straight["sparse_weight"], abs=1e-7)
    a = load_encoder(str(tmp_path / "straight")).encode(["alopecia", "vertigo"], role="query")
    b = load_encoder(str(tmp_path / "resumed")).encode(["alopecia", "vertigo"], role="query")
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_time_budget_stops_after_the_step_that_passes_it_and_saves(tmp_path, tiny_encoder_dir, biosyn_dict, capsys):
    from linker.cli.main import main

    out = tmp_path / "budget"
    main(["train", "biosyn", "--train", TRAIN, "--dict", str(biosyn_dict), "--encoder", str(tiny_encoder_dir),
          "--out", str(out), "--topk", "4", "--epochs", "3", "--batch-size", "8", "--threads", "1",
          "--max-seconds", "1e-9"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 1  # of 2 per epoch, 3 epochs asked
    assert summary["stopped_at_time_budget"] == {"epoch": 1, "step_in_epoch": 1, "steps_per_epoch": 2}
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1] and len(metrics["steps"]) == 1
    assert (out / "biosyn.json").is_file() and not (tmp_path / "budget.checkpoint").exists()
    with pytest.raises(ConfigError, match="--max-seconds must be positive"):
        BiosynConfig(max_seconds=0)


def test_resume_on_a_finished_model_trains_it_on_with_a_fresh_optimizer(tmp_path, tiny_encoder_dir, biosyn_dict):
    enc, out = str(tiny_encoder_dir), tmp_path / "model"
    one = BiosynConfig(lr=1e-3, batch_size=8, epochs=1, topk=4, threads=1, seed=4)
    train_biosyn(TRAIN, biosyn_dict, encoder=enc, out=out, config=one)
    before = load_encoder(str(out)).encode(["alopecia"], role="query")
    summary = train_biosyn(TRAIN, biosyn_dict, encoder=enc, out=out, config=replace(one, epochs=2), resume=True)
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    assert summary["optimizer_restarted_before_epoch"] == [2] and summary["steps"] == len(metrics["steps"])
    assert not np.allclose(load_encoder(str(out)).encode(["alopecia"], role="query"), before)
    assert json.loads((out / "train_config.json").read_text())["config"]["epochs"] == 2


def test_a_finished_model_stopped_inside_an_epoch_is_not_continued(tmp_path, tiny_encoder_dir, biosyn_dict):
    enc, out = str(tiny_encoder_dir), tmp_path / "model"
    config = BiosynConfig(lr=1e-3, batch_size=8, epochs=2, topk=4, threads=1, max_seconds=1e-9)
    train_biosyn(TRAIN, biosyn_dict, encoder=enc, out=out, config=config)
    with pytest.raises(ConfigError, match="stopped by --max-seconds inside epoch 1"):
        train_biosyn(TRAIN, biosyn_dict, encoder=enc, out=out, config=replace(config, max_seconds=None), resume=True)


def test_the_stages_before_the_first_epoch(tmp_path, biosyn_dict):
    """`training_data` (queries with xref-widened gold, fixed tf-idf candidates) and a fresh `resume_point`."""
    from linker.train.biosyn import resume_point, training_data

    data = training_data(biosyn_dict, [TRAIN], BiosynConfig(topk=4), monitor=load_dataset(TRAIN))
    assert len(data.queries) == 13 == len(data.watch) and data.sparse_rows.shape == (13, 4)
    assert data.query_stats["queries"] == 13 and list(data.name_keys) == list(data.dictionary.keys)
    start = resume_point(tmp_path / "none", resume=False, finished=None, extra={"queries": data.query_stats})
    assert start.state == {"epoch": 0, "step": 0} and start.weights_from is None and start.optimizer_state is None
    assert start.metrics.extra == {"queries": data.query_stats} and not start.metrics.epochs
    with pytest.raises(MissingInputError, match="no checkpoint"):
        resume_point(tmp_path / "none", resume=True, finished=None, extra={})
