"""Cross-encoder re-ranker: training groups, train/resume with the tiny model, --rerank and index binding."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from linker.cli.main import main
from linker.confidence import read_calibration, write_calibration
from linker.errors import ConfigError, MissingInputError, UnknownNameError
from linker.eval.calibrate import RETRIEVER_WEIGHTS, calibrate, choose_weight, mix
from linker.eval.report import Ranked, evaluate
from linker.index import build_index
from linker.index.manifest import read_manifest
from linker.link import Linker
from linker.rerank import RERANKER_DIR, CrossEncoder
from linker.train.rerank import RerankConfig, learning_rate, mine_groups, train_rerank

from fixtures.normalize.normalize_tables import build_indexes

FIX = Path(__file__).parent / "fixtures"
HELDIN = f"tsv:{FIX / 'confidence/heldin.tsv'}"
TINY = RerankConfig(negatives=2, fetch=8, batch_size=4, epochs=2, checkpoint_every=0, device="cpu", threads=1)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, Path]:
    return build_indexes(tmp_path_factory.mktemp("rr_indexes"))


@pytest.fixture(scope="module")
def meddra_table(indexes) -> Path:
    return indexes["meddra"] / "concepts.parquet"


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, tiny_encoder_dir, meddra_table) -> Path:
    out = tmp_path_factory.mktemp("rr") / "model"
    train_rerank(meddra_table, encoder=str(tiny_encoder_dir), out=out, train_specs=(HELDIN,), config=TINY)
    return out


def test_groups_have_a_hard_positive_and_other_concepts_as_negatives(meddra_table):
    groups, stats = mine_groups(meddra_table, (HELDIN,), TINY)
    synonyms = [g for g in groups if not g.labelled]
    # Concepts with two distinct names (case-insensitive): Alopecia/Hair loss, Headache/Head pain,
    # Pruritus/Itching, Nausea/Náuseas; each name is an anchor (2 per concept).
    assert {(g.mention, g.positive) for g in synonyms} >= {("Hair loss", "Alopecia"), ("Head pain", "Headache")}
    assert all(g.mention.lower() != g.positive.lower() for g in synonyms)
    hair = next(g for g in synonyms if g.mention == "Hair loss")
    assert len(hair.negatives) == 2 and "Alopecia" not in hair.negatives
    labelled = [g for g in groups if g.labelled]
    assert stats["labelled_unique"] == 14 and len(labelled) == 14
    assert next(g for g in labelled if g.mention == "severe head pain").positive in {"Head pain", "Headache"}
    assert next(g for g in labelled if g.mention == "dizziness").positive == "Dizziness"  # exact: a fine positive


def test_negatives_are_mined_with_the_given_tfidf_parameters(meddra_table):
    """`mining` (`--mine-preset`): the negatives are the best names of other concepts under *that* tf-idf."""
    from linker.dictionary import read_concept_table
    from linker.index.tfidf import TfidfConfig, TfidfNameIndex, get_preset

    table = read_concept_table(meddra_table).table
    names, ids = table.column("name").to_pylist(), table.column("concept_id").to_pylist()
    negatives = {}
    for mining in (None, get_preset("medical-crossing")):
        config = dataclasses.replace(TINY, mining=mining)
        groups, stats = mine_groups(meddra_table, (), config)
        assert stats["negatives_from"].startswith("tf-idf char_wb 3-3" if mining is None else "tf-idf char 1-2")
        index = TfidfNameIndex.build(names, mining or TfidfConfig())
        own = {n: c for n, c in zip(names, ids)}
        checked = 0
        for group in groups:
            _scores, rows = index.search([group.mention], config.fetch)
            ranked = [r for r in rows[0].tolist() if r >= 0 and ids[r] != own[group.mention]]
            # the first negative: the best-scoring name of another concept (not the query's very name);
            # a query sharing no n-gram with any other concept is padded with random names instead
            first = next((names[r] for r in ranked if names[r].lower() != group.mention.lower()), None)
            if first is not None:
                assert group.negatives[0] == first
                checked += 1
        assert checked >= 1  # the tiny table: char_wb 3-3 finds a shared trigram for few queries, char 1-2 for all
        negatives[mining is None] = {g.mention: g.negatives for g in groups}
    assert negatives[True] != negatives[False]  # the two analyzers confuse different names
    with pytest.raises(ConfigError, match="TfidfConfig"):
        RerankConfig(mining="medical-crossing")


def test_negatives_can_be_mined_with_an_index_folder(meddra_table, indexes, tmp_path, tiny_encoder_dir):
    """`mine_index` (`--mine-index`): the index's own search mines, so a tf-idf index gives the groups its
    parameters give, and a dense index (any kind) mines too; an index of another dictionary is refused."""
    from linker.index.dense import DenseConfig
    from linker.index.tfidf import get_preset

    by_index, stats = mine_groups(meddra_table, (HELDIN,), dataclasses.replace(TINY, mine_index=str(indexes["meddra"])))
    by_preset, _ = mine_groups(meddra_table, (HELDIN,), dataclasses.replace(TINY, mining=get_preset("medical-crossing")))
    assert by_index == by_preset
    assert stats["negatives_from"] == "index meddra (tfidf)"
    dense = tmp_path / "dense"
    build_index(meddra_table, kind="dense", out=dense, config=DenseConfig(encoder=str(tiny_encoder_dir)))
    groups, stats = mine_groups(meddra_table, (HELDIN,), dataclasses.replace(TINY, mine_index=str(dense)))
    assert stats["negatives_from"] == "index dense (dense)" and len(groups) == len(by_index)
    assert [g.negatives for g in groups] != [g.negatives for g in by_index]  # another retriever, other mistakes
    with pytest.raises(ConfigError, match="was not built from"):
        mine_groups(meddra_table, (), dataclasses.replace(TINY, mine_index=str(indexes["hpo"])))
    with pytest.raises(ConfigError, match="not both"):
        RerankConfig(mining=get_preset("medical-crossing"), mine_index=str(dense))


def test_config_checks():
    with pytest.raises(ConfigError, match="fetch"):
        RerankConfig(negatives=8, fetch=8)
    with pytest.raises(ConfigError, match="batch_size"):
        RerankConfig(batch_size=0)


def test_reranker_precision_is_decided_by_linker_precision(monkeypatch, reranker):
    """One precision mechanism (`linker.precision`): auto = bf16 only on a processor with native bf16;
    fp32 scores are the plain forward pass, bf16 ones run under autocast (close, not identical)."""
    import torch

    from linker import precision as prec

    monkeypatch.setattr(prec, "cpu_flags", lambda: frozenset({"avx512f"}))
    assert CrossEncoder.load(reranker).precision == "fp32"
    monkeypatch.setattr(prec, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert CrossEncoder.load(reranker).precision == "bf16"
    fp32, bf16 = CrossEncoder.load(reranker, precision="fp32"), CrossEncoder.load(reranker, precision="bf16")
    mentions, names = ["hair loss", "head pain", "itching"], ["Alopecia", "Headache", "Dizziness"]
    with torch.inference_mode():
        features = fp32.tokenizer(mentions, names, padding=True, return_tensors="pt")
        plain = fp32.model(**features).logits[:, 0].numpy()
    np.testing.assert_allclose(fp32.score(mentions, names), plain, rtol=1e-5, atol=1e-6)
    low = bf16.score(mentions, names)
    assert not np.array_equal(low, plain) and np.allclose(low, plain, atol=0.1)
    with pytest.raises(ConfigError, match="int8"):
        CrossEncoder.load(reranker, precision="int8")
    with pytest.raises(ConfigError, match="int8"):
        RerankConfig(precision="int8")
    with pytest.raises(UnknownNameError, match="precision"):
        RerankConfig(precision="fp16")


def test_learning_rate_warms_up_then_decays_to_zero():
    config = RerankConfig(lr=1e-4, warmup=0.1)
    rates = [learning_rate(config, step, 100) for step in range(100)]
    assert rates[0] == pytest.approx(1e-5) and rates[9] == pytest.approx(1e-4) == max(rates)
    assert all(a >= b for a, b in zip(rates[9:], rates[10:])) and rates[-1] == pytest.approx(1e-4 / 90)
    with pytest.raises(ConfigError, match="warmup"):
        RerankConfig(warmup=1.0)


def test_mix_orders_by_reranker_plus_weighted_retriever_score():
    # Re-ranker prefers B, the retriever prefers A; C ties B under the re-ranker and loses on concept id.
    ranked = Ranked(("B", "C", "A"), ("A", "B", "C"), 3.0, float("nan"), (3.0, 3.0, 1.0), (0.5, 0.4, 0.9))
    assert mix(ranked, 0.0).ids == ("B", "C", "A") and mix(ranked, 0.0).top_score == 3.0
    heavy = mix(ranked, RETRIEVER_WEIGHTS[-1])
    assert heavy.ids == ranked.retriever_ids and heavy.top_score == pytest.approx(1.0 + 0.9 * RETRIEVER_WEIGHTS[-1])
    assert heavy.retriever_scores == (0.9, 0.5, 0.4)  # scores travel with their concepts
    assert mix(Ranked((), (), float("-inf"), float("-inf")), 1.0).ids == ()


def test_cross_encoder_from_a_trained_encoder_folder_keeps_its_transformer(tiny_encoder_dir):
    # `train rerank --encoder models/<sap or BioSyn model>` must start from that model's weights, not a random
    # transformer with the folder's shape (only the one-output head is new).
    from safetensors.torch import load_file

    from linker.rerank import init_cross_encoder

    saved = load_file(str(tiny_encoder_dir / "model.safetensors"))
    loaded = dict(init_cross_encoder(str(tiny_encoder_dir)).model.named_parameters())
    for key in ("embeddings.word_embeddings.weight", "encoder.layer.1.output.dense.weight"):
        assert np.array_equal(loaded[f"bert.{key}"].detach().numpy(), saved[key].numpy())


def test_cross_encoder_from_a_shipped_encoder_starts_from_its_release():
    # `--encoder linker-en` names the trained encoder, not the MiniLM base under it: the release's tensors are
    # overlaid, as `linker.encoders` does for the bi-encoder.
    from linker.models import load_tensors, read_release
    from linker.rerank import init_cross_encoder

    release = load_tensors(read_release("linker-en"))
    loaded = dict(init_cross_encoder("linker-en").model.named_parameters())
    key = "encoder.layer.5.output.dense.weight"
    assert np.array_equal(loaded[f"bert.{key}"].detach().numpy(), release[key].float().numpy())


def test_frozen_embeddings_keep_the_base_and_train_the_layers(tmp_path, tiny_encoder_dir, meddra_table):
    from safetensors.torch import load_file

    out = tmp_path / "frozen"
    train_rerank(meddra_table, encoder=str(tiny_encoder_dir), out=out,
                 config=RerankConfig(**{**TINY.__dict__, "epochs": 1, "freeze_embeddings": True}))
    base, trained = load_file(str(tiny_encoder_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for key in ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight"):
        assert np.array_equal(trained[f"bert.{key}"].numpy(), base[key].numpy())
    key = "encoder.layer.1.output.dense.weight"
    assert not np.array_equal(trained[f"bert.{key}"].numpy(), base[key].numpy())


def test_heaviest_mix_is_the_retriever_order_even_for_dense_near_ties():
    # A dense retriever's top cosines 0.002 apart: weight 1000 still lets a logit gap of 10 reorder them, so the
    # grid's last weight must reach the retriever's own order (calibrate can then choose it).
    ranked = Ranked(("B", "A"), ("A", "B"), 10.0, float("nan"), (10.0, 0.0), (0.900, 0.902))
    assert mix(ranked, 1000.0).ids == ("B", "A")
    assert mix(ranked, RETRIEVER_WEIGHTS[-1]).ids == ranked.retriever_ids


def test_the_mix_weight_is_the_best_point_of_the_smoothed_held_in_curve():
    assert RETRIEVER_WEIGHTS[:2] == (0.0, 0.25) and RETRIEVER_WEIGHTS[-1] == 2.0 ** 20
    assert all(b / a == pytest.approx(2 ** 0.25) for a, b in zip(RETRIEVER_WEIGHTS[1:], RETRIEVER_WEIGHTS[2:]))
    # A lone spike beside a cliff (index 9) loses to a plateau (3..7) whose own best point is lower: averaged with
    # two neighbours each side the plateau's middle reads 0.86, the spike 0.826.
    weights = RETRIEVER_WEIGHTS[:12]
    curve = dict.fromkeys(weights, 0.80) | dict.fromkeys(weights[3:8], 0.86) | {weights[9]: 0.87}
    assert choose_weight(curve) == (weights[5], pytest.approx(0.86))
    assert choose_weight(curve, smoothing=0) == (weights[9], 0.87)  # the best single point, the rule before
    assert choose_weight(dict.fromkeys(weights, 0.5)) == (0.0, 0.5)  # a tie: the smallest weight
    rising = {w: i / 100 for i, w in enumerate(weights)}  # best at the end of the grid: fewer neighbours there
    assert choose_weight(rising)[0] == weights[-1]


def test_trained_folder_is_safetensors_with_metrics(reranker):
    names = {p.name for p in reranker.iterdir()}
    assert {"model.safetensors", "config.json", "linker_reranker.json", "train_config.json",
            "train_metrics.json"} <= names
    assert not any(n.endswith(".bin") for n in names)
    metrics = json.loads((reranker / "train_metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    groups = metrics["extra"]["data"]["groups"]
    assert len(metrics["steps"]) == 2 * -(-groups // 4)  # 2 epochs of ceil(groups / batch 4) steps
    assert not reranker.with_name(reranker.name + ".checkpoint").exists()


def test_scores_are_deterministic_and_batch_independent(reranker):
    model = CrossEncoder.load(reranker)
    pairs = [("hair loss", "Alopecia"), ("hair loss", "Nausea"), ("head pain", "Headache")]
    one = model.score([m for m, _ in pairs], [n for _, n in pairs], batch_size=1)
    all_at_once = model.score([m for m, _ in pairs], [n for _, n in pairs])
    np.testing.assert_allclose(one, all_at_once, atol=2e-2)  # bf16 padding differs by batch
    assert model.score([], []).shape == (0,)


def test_equal_pairs_are_scored_once_and_get_equal_scores(reranker):
    """Concepts that share a name tie on the retriever; their re-ranker scores must tie too (in bf16 a pair's logit
    moves with its batch's padding), so each distinct pair runs through the model once."""
    model = CrossEncoder.load(reranker, precision="fp32")
    seen = []
    logits = model.logits
    model.logits = lambda ms, ns: (seen.extend(zip(ms, ns)), logits(ms, ns))[1]
    pairs = [("hair loss", "Alopecia"), ("hair loss", "hair loss of the scalp, diffuse"), ("hair loss", "Alopecia"),
             ("head pain", "Headache"), ("hair loss", "Alopecia")]
    scores = model.score([m for m, _ in pairs], [n for _, n in pairs], batch_size=2)
    assert sorted(seen) == sorted(set(pairs))
    assert scores[0] == scores[2] == scores[4] and scores.shape == (5,)
    np.testing.assert_allclose(scores[[0, 1, 3]], logits(*zip(*[pairs[0], pairs[1], pairs[3]])).detach().numpy(),
                               atol=1e-4)


def test_training_logits_run_length_buckets_with_the_same_result(reranker):
    """logits() runs pairs as length buckets; values, order and gradients are one padded batch's."""
    import torch

    from linker.rerank import MAX_LENGTH

    model = CrossEncoder.load(reranker, precision="fp32")
    mentions = ["hair loss", "pain in the lower back radiating to the left leg", "rash"] * 8
    names = ["Alopecia", "Nausea", "Lumbar radiculopathy with sciatica of the left side"] * 8
    bucketed = model.logits(mentions, names)
    features = model.tokenizer(mentions, names, padding=True, truncation="longest_first", max_length=MAX_LENGTH,
                               return_tensors="pt")
    padded = model.model(**features).logits[:, 0]
    assert torch.allclose(bucketed, padded, atol=1e-4)
    bucketed.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.model.named_parameters() if p.grad is not None}
    assert grads
    model.model.zero_grad()
    padded.sum().backward()
    for name, p in model.model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(grads[name], p.grad, rtol=1e-3, atol=1e-4), name


def test_resume_continues_after_the_checkpointed_epoch(tmp_path, tiny_encoder_dir, meddra_table, reranker):
    out = tmp_path / "model"
    one_epoch = RerankConfig(**{**TINY.__dict__, "epochs": 1})
    train_rerank(meddra_table, encoder=str(tiny_encoder_dir), out=out, train_specs=(HELDIN,), config=one_epoch)
    # Fake an interruption after epoch 1 of 2: save the 1-epoch model as the checkpoint of a 2-epoch run.
    from linker.train import common

    model = CrossEncoder.load(out)
    import torch

    optimizer = torch.optim.AdamW(model.model.parameters(), lr=TINY.lr)
    metrics = json.loads((out / "train_metrics.json").read_text())
    common.save_checkpoint(tmp_path / "resumed", model, optimizer,
                           {"epoch": 1, "step": len(metrics["steps"]), "step_in_epoch": 0},
                           common.Metrics.from_json(metrics))
    summary = train_rerank(meddra_table, encoder=str(tiny_encoder_dir), out=tmp_path / "resumed",
                           train_specs=(HELDIN,), config=TINY, resume=True)
    assert summary["resumed"] and summary["steps"] == 2 * len(metrics["steps"])
    resumed = json.loads((tmp_path / "resumed/train_metrics.json").read_text())
    assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]


def test_resume_without_checkpoint_is_an_error(tmp_path, tiny_encoder_dir, meddra_table):
    with pytest.raises(MissingInputError, match="no checkpoint"):
        train_rerank(meddra_table, encoder=str(tiny_encoder_dir), out=tmp_path / "none", config=TINY, resume=True)


def test_linker_reranks_and_keeps_the_retriever_score(indexes, reranker):
    plain = Linker.load(indexes["meddra"])
    ranked = Linker.load(indexes["meddra"], rerank=reranker, rerank_k=4)
    texts = ["hair loss", "head pain", "itchy skin"]
    for before, after in zip(plain.link(texts, k=4), ranked.link(texts, k=3)):
        assert len(after.candidates) == 3
        scores = [c.score for c in after.candidates]
        assert scores == sorted(scores, reverse=True)
        retriever = {c.concept_id: c.score for c in before.candidates}
        assert all(c.retriever_score == pytest.approx(retriever[c.concept_id]) for c in after.candidates)
        model = ranked.reranker
        direct = model.score([after.mention] * 3, [c.matched_name for c in after.candidates])
        np.testing.assert_allclose(direct, scores, atol=2e-2)
    assert ranked.scorer.startswith("rerank:") and ranked.stats["rerank_pairs"] == 12


def test_bound_reranker_calibration_and_eval_gain(tmp_path, indexes, reranker):
    out = tmp_path / "bound"
    build_index(indexes["meddra"] / "concepts.parquet", kind="tfidf", out=out, reranker=reranker)
    manifest = read_manifest(out)
    assert manifest["reranker"]["name"] == "model" and f"{RERANKER_DIR}/model.safetensors" in manifest["files"]
    linker = Linker.load(out)
    assert linker.reranker is not None and linker.scorer == f"rerank:{manifest['reranker']['sha256']}"
    assert Linker.load(out, rerank="none").reranker is None
    summary = calibrate(out, HELDIN, rerank_k=4)
    assert summary["scorer"] == linker.scorer
    mixing = summary["mixing"]  # the weight with the best smoothed held-in Acc@1, the smallest on a tie
    weight, by_weight = mixing["retriever_weight"], mixing["accuracy_at_1_by_weight"]
    assert list(by_weight) == list(RETRIEVER_WEIGHTS)
    assert (weight, mixing["smoothed_accuracy_at_1"]) == choose_weight(by_weight)
    assert max(by_weight.values()) <= mixing["gold_among_reranked"] <= 1  # no mix beats the gold being re-scored
    entry = read_manifest(out)["calibration"]
    assert entry["retriever_weight"] == weight and 0 <= entry["retriever_accuracy"] <= 1
    # the index links as it was calibrated: the k and the re-ranker's precision (fp32 on every processor) recorded
    assert (entry["rerank_k"], entry["rerank_precision"]) == (4, "fp32")
    assert (linker := Linker.load(out)).rerank_k == 4 and linker.reranker.precision == "fp32"
    assert Linker.load(out, rerank_k=7).rerank_k == 7 and Linker.load(out, rerank_precision="bf16").reranker.precision in ("bf16", "fp32")
    mixed = Linker.load(out, rerank_k=4)
    assert mixed.retriever_weight == weight
    candidates = mixed.link(["head pain"], k=4)[0].candidates
    logits = mixed.reranker.score(["head pain"] * len(candidates), [c.matched_name for c in candidates])
    np.testing.assert_allclose([c.score for c in candidates],
                               logits + weight * np.array([c.retriever_score for c in candidates]), atol=2e-2)
    assert Linker.load(out, rerank_k=4).link(["hair loss"], k=1)[0].candidates[0].confidence is not None
    assert Linker.load(out, rerank="none").calibration is None  # fitted for the re-ranker, not the retriever
    report = evaluate(out, HELDIN, ks=(1, 2), rerank_k=4, report_dir=tmp_path, name="rep")
    row = report.rerank["rows"][0]
    assert row["n"] == 14 and 0 <= row["retriever_acc1"] <= 1 and 0 <= row["reranked_acc1"] <= 1
    assert report.rerank["pairs_scored"] > 0 and report.rerank["rerank_ms_per_mention"] > 0
    assert "re-ranked Acc@1" in (tmp_path / "rep.md").read_text()


def test_a_reranker_that_loses_on_held_in_data_is_reported_at_load(tmp_path, indexes, reranker, caplog):
    out = tmp_path / "bound"
    build_index(indexes["meddra"] / "concepts.parquet", kind="tfidf", out=out, reranker=reranker)
    calibrate(out, HELDIN, rerank_k=4)
    fitted = read_calibration(out, read_manifest(out))
    for retriever_accuracy, warned in ((fitted.accuracy, True), (fitted.accuracy - 0.01, False)):
        write_calibration(out, dataclasses.replace(fitted, retriever_accuracy=retriever_accuracy))  # a tie: no gain
        caplog.clear()
        Linker.load(out)
        assert ("did not beat the retriever" in caplog.text) == warned


def test_bad_reranker_paths(tmp_path, indexes):
    with pytest.raises(MissingInputError, match="no such re-ranker"):
        Linker.load(indexes["meddra"], rerank=str(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingInputError, match="not a re-ranker folder"):
        Linker.load(indexes["meddra"], rerank=str(tmp_path / "empty"))


def test_cli_train_rerank_and_link(tmp_path, tiny_encoder_dir, meddra_table, indexes, capsys):
    out = tmp_path / "cli_model"
    main(["train", "rerank", "--dict", str(meddra_table), "--encoder", str(tiny_encoder_dir), "--out", str(out),
          "--negatives", "2", "--batch-size", "4", "--device", "cpu", "--threads", "1", "--max-queries", "6",
          "--precision", "fp32", "--mine-preset", "medical-crossing"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["data"]["synonym_queries"] == 6 and (out / "model.safetensors").is_file()
    assert summary["precision"] == "fp32" and "preset medical-crossing" in summary["data"]["negatives_from"]
    assert json.loads((out / "train_config.json").read_text())["config"]["mining"]["preset"] == "medical-crossing"
    main(["link", "--index", str(indexes["meddra"]), "--rerank", str(out), "--rerank-k", "3", "--k", "2", "--json", "hair loss"])
    [result] = json.loads(capsys.readouterr().out)
    assert len(result["candidates"]) == 2 and all("retriever_score" in c for c in result["candidates"])
    main(["train", "rerank", "--dict", str(meddra_table), "--encoder", str(tiny_encoder_dir), "--out", str(out),
          "--overwrite", "--negatives", "2", "--batch-size", "4", "--device", "cpu", "--threads", "1",
          "--max-queries", "6", "--precision", "fp32", "--mine-index", str(indexes["meddra"])])
    assert json.loads(capsys.readouterr().out)["data"]["negatives_from"] == "index meddra (tfidf)"
    with pytest.raises(SystemExit) as exit_info:  # an index of another dictionary: one line, exit 1
        main(["train", "rerank", "--dict", str(meddra_table), "--encoder", str(tiny_encoder_dir), "--out",
              str(tmp_path / "other"), "--mine-index", str(indexes["hpo"])])
    assert exit_info.value.code == 1 and "was not built from" in capsys.readouterr().err


def test_time_budget_stops_and_saves(tmp_path, tiny_encoder_dir, meddra_table):
    out = tmp_path / "budget"
    config = RerankConfig(**{**TINY.__dict__, "max_seconds": 0.0})
    summary = train_rerank(meddra_table, encoder=str(tiny_encoder_dir), out=out, config=config)
    assert summary["steps"] == 1
    assert summary["stopped_at_time_budget"] == {"epoch": 1, "step_in_epoch": 1,
                                                 "steps_per_epoch": -(-summary["data"]["groups"] // 4)}
    assert CrossEncoder.load(out).score(["hair loss"], ["Alopecia"]).shape == (1,)


def test_a_shipped_reranker_release_loads_by_name_and_binds_to_an_index(tmp_path, monkeypatch, indexes):
    # A release of kind "reranker" (what `linker train release linker-rerank-en` writes): the changed tensors of a
    # MiniLM cross-encoder in fp16, loaded by its short name on top of the base, and bound into an index whole.
    import torch

    from linker import models
    from linker.rerank import init_cross_encoder
    from linker.train.release import changed_tensors

    with pytest.raises(ConfigError, match="not a re-ranker"):
        CrossEncoder.from_release("linker-en")  # an encoder's release
    monkeypatch.setattr("linker.folders.MODELS_DIR", tmp_path / "models")
    monkeypatch.setitem(models.RERANKERS, "test-rerank", "minilm")
    base, trained = init_cross_encoder("minilm"), init_cross_encoder("minilm", seed=1)
    with torch.no_grad():
        trained.model.bert.encoder.layer[5].output.dense.weight.mul_(0.5)
        trained.model.classifier.bias.add_(0.25)  # a new head starts at 0: training moves it
    tensors = changed_tensors(base.model, trained.model)
    assert set(tensors) == {"bert.encoder.layer.5.output.dense.weight", "classifier.weight", "classifier.bias"}
    release = models.write_release(tmp_path / "models" / "test-rerank", name="test-rerank", version="1",
                                   kind="reranker", base="minilm", base_revision="test", tensors=tensors,
                                   card="card\n", info={})
    shipped = CrossEncoder.load("test-rerank")
    assert shipped.info.sha256 == release["files"]["weights.safetensors"]["sha256"]
    pairs = (["hair loss", "head pain"], ["Alopecia", "Headache"])
    np.testing.assert_allclose(shipped.score(*pairs), trained.score(*pairs), atol=1e-2)  # fp16 storage
    out = tmp_path / "bound"
    build_index(indexes["meddra"] / "concepts.parquet", kind="tfidf", out=out, reranker="test-rerank")
    manifest = read_manifest(out)
    assert manifest["reranker"]["name"] == "test-rerank"
    bound = Linker.load(out)
    assert bound.scorer == f"rerank:{manifest['reranker']['sha256']}"
    np.testing.assert_allclose(bound.reranker.score(*pairs), shipped.score(*pairs), atol=1e-5)


def test_lay_development_figures_of_a_reranker(indexes, reranker):
    # bench.rerank_lay on a tiny index: the lay development phrases, the retriever alone and re-ranked at each mix
    # weight and each k, with the weight `linker calibrate` would choose there.
    from bench.rerank_lay import SHOWN_WEIGHTS, dev_rerank_accuracy, markdown
    from linker.eval.calibrate import RETRIEVER_WEIGHTS

    dev = dev_rerank_accuracy(indexes["meddra"], reranker, 4, ks=(2, 4), per_phrase=True)
    assert dev["phrases"] == 632 and dev["rerank_k"] == 4 and list(dev["by_k"]) == ["2", "4"]
    for top, table in dev["by_k"].items():
        each = table.pop("per_phrase")  # phrase by phrase, the same figures
        assert len(each["retriever_right"]) == len(each["reranked_right"]) == 632
        assert round(100 * sum(each["retriever_right"]) / 632, 2) == table["retriever_acc1"]
        assert round(100 * sum(each["reranked_right"]) / 632, 2) == table["calibrate_choice"]["acc1"]
        assert list(table["reranked_acc1_by_mix_weight"]) == [str(w) for w in SHOWN_WEIGHTS]
        assert all(0 <= v <= table["retriever_acc"] for v in table["reranked_acc1_by_mix_weight"].values())
        assert table["calibrate_choice"]["retriever_weight"] in RETRIEVER_WEIGHTS
        assert table["retriever_acc1"] <= table["retriever_acc"]
    lines = "\n".join(markdown({"index": "i", "torch_threads": 1, "phrases": dev.pop("phrases"),
                                "rerankers": {"tiny": {"folder": "f", **dev}}}))
    assert "| 2 |" in lines and "| 4 |" in lines and "calibrate's w" in lines


def test_lay_development_errors_are_sorted_by_kind_and_confidence_inputs_are_scored_out_of_fold():
    # bench.lay_dev_errors: a wrong answer is the retriever's miss, an HPO ancestor / descendant, a sibling, an
    # ICD-10-CM code or another HPO concept, in that order; right answers and dictionary names are not counted.
    import numpy as np

    from bench.lay_dev_errors import KINDS, cross_fitted_regression, error_kinds, markdown
    from linker.datasets import Mention
    from linker.eval.report import Ranked

    parents = {"HP:2": ("HP:1",), "HP:3": ("HP:2",), "HP:4": ("HP:1",), "HP:9": ("HP:8",)}

    def case(text, gold, ids):
        return Mention(text, ((gold,),), "en", "lay", 0, 0), Ranked(tuple(ids), tuple(ids), 1.0, 1.0,
                                                                   names=tuple(f"name of {i}" for i in ids))

    cases = [case("missed", "HP:3", ["HP:9", "HP:8", "HP:7", "HP:6", "HP:3"]),  # gold 5th: outside the top 4
             case("grandchild", "HP:3", ["HP:1", "HP:3"]), case("ancestor", "HP:1", ["HP:3", "HP:1"]),
             case("sibling", "HP:2", ["HP:4", "HP:2"]), case("icd", "HP:2", ["R11.0", "HP:2"]),
             case("other", "HP:2", ["HP:9", "HP:2"]), case("right", "HP:2", ["HP:2"]), case("name", "HP:5", ["HP:9"])]
    h = {"mentions": [m for m, _ in cases], "ranked": [r for _, r in cases], "rerank_k": 4,
         "correct": np.array([0, 0, 0, 0, 0, 0, 1, 0], float), "dictionary": np.array([0] * 7 + [1], bool)}
    errors = error_kinds(h, parents)
    assert errors["phrases"] == 7 and errors["wrong"] == 6
    assert errors["by_kind"] == dict(zip(KINDS, (1, 2, 1, 1, 1)))
    assert errors["examples"][KINDS[3]] == [{"phrase": "icd", "gold": ["HP:2"], "answer": "R11.0",
                                             "answer_name": "name of R11.0"}]
    # a signal that separates right from wrong gives confident out-of-fold answers on both sides
    rng = np.random.default_rng(0)
    right = rng.random(400) < 0.5
    confidence = cross_fitted_regression(np.c_[right + rng.normal(0, 0.1, 400), rng.normal(size=400)], right * 1.0, 5)
    assert confidence.shape == (400,) and confidence[right].mean() > 0.9 and confidence[~right].mean() < 0.1
    band = {"auto_pct": 50.0, "auto_precision": 100.0}
    lines = "\n".join(markdown({"index": "i", "rerank_k": 4, "mentions": 8, "hpo": "hp.obo", "errors": errors,
                                "inputs": {"shipped": {"brier": 0.1, "all": band, "lay": band}}}))
    assert "| shipped | 0.10000 | 50.0 | 100.0 | 50.0 | 100.0 |" in lines
    assert "| HPO ancestor or descendant | 2 | 33.3 |" in lines and "6 wrong (85.7%)" in lines


def test_the_shipped_rerankers_recipe_splits_lay_queries_from_the_names_they_meet():
    from linker.train.rerank_release import split_queries

    ids = ["HP:1", "HP:1", "HP:1", "HP:2", "HP:2", "HP:3"]
    names = ["Alopecia", "Hair loss", "Hair-loss", "Vomiting", "Throwing up", "Hair loss"]
    types = ["PT", "SY_EXACT/layperson", "SY_EXACT", "PT", "SY_EXACT/layperson", "PT"]
    queries, keep = split_queries(ids, names, types, phrases={"throwing up"})
    # a lay name is a query; its own row and its concept's rows of the same key leave (never matched to itself);
    # another concept's equal name stays, as does a lay name equal to a test or development phrase (no query)
    assert queries == [("Hair loss", "HP:1")]
    assert keep == [True, False, False, True, True, True]


def test_the_shipped_rerankers_recipe_keeps_a_current_model_and_retrains_a_stale_one(tmp_path, monkeypatch):
    import dataclasses

    from linker.train import rerank_release
    from linker.train.common import CONFIG_FILE

    recipe = rerank_release.RERANK_RECIPES["linker-rerank-en"]
    table = tmp_path / "dict.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"concept_id": ["C1"], "name": ["Alopecia"]}), table)
    queries = tmp_path / "queries.tsv"
    queries.write_text("text\tconcept_ids\torigin\nhair loss\tC1\tx\n", encoding="utf-8")
    model = tmp_path / f"{recipe.name}.model"
    model.mkdir()
    config = dataclasses.asdict(dataclasses.replace(recipe.config, threads=1, mine_index="elsewhere"))
    (model / CONFIG_FILE).write_text(json.dumps({"config": config, "base_encoder": recipe.start}))
    (model / rerank_release.INPUTS_FILE).write_text(json.dumps(rerank_release.inputs_digest(table, queries)))
    trained = []
    monkeypatch.setattr("linker.train.rerank.train_rerank", lambda *a, **k: trained.append(k["config"]))
    monkeypatch.setattr("linker.index.build_index", lambda *a, **k: None)
    # where and on how many threads it ran does not matter; its config, start and inputs do
    assert rerank_release.trained_reranker(recipe, tmp_path, table, queries, recipe.config) == model and not trained
    queries.write_text("text\tconcept_ids\torigin\nbaldness\tC1\tx\n", encoding="utf-8")
    rerank_release.trained_reranker(recipe, tmp_path, table, queries, recipe.config)
    assert len(trained) == 1 and trained[0].mine_index == str(tmp_path / f"{recipe.name}.mining")


def test_the_numpy_reranker_gives_torchs_logits(reranker):
    # `load_reranker` runs an fp32 BERT cross-encoder without torch: the same logits within float rounding, for
    # short, long (cut longest first at MAX_LENGTH tokens) and repeated pairs
    from linker.rerank import MAX_LENGTH, load_reranker
    from linker.runtime import RuntimeCrossEncoder

    numpy_ = load_reranker(reranker, precision="fp32")
    torch_ = load_reranker(reranker, precision="fp32", runtime="torch")
    assert isinstance(numpy_, RuntimeCrossEncoder) and isinstance(torch_, CrossEncoder)
    assert numpy_.scorer == torch_.scorer  # one identity: a calibration applies to both
    long = " ".join(["severe persistent pain"] * MAX_LENGTH)
    mentions = ["hair loss", "head pain", long, "hair loss", "x", long]
    names = ["Alopecia", "Headache", "Pain", "Alopecia", long, long + " again"]
    np.testing.assert_allclose(numpy_.score(mentions, names), torch_.score(mentions, names), atol=1e-4)
    with pytest.raises(ConfigError, match="numpy runtime runs"):
        load_reranker(reranker, precision="bf16", runtime="numpy")


def test_the_numpy_reranker_runs_its_batches_on_the_threads_it_may_use(reranker, monkeypatch):
    # the same logits (within float rounding: batches are cut differently) whether its batches run on one thread
    # or on four, and four run at once when the caller's share allows them
    import linker.runtime as runtime
    from linker.precision import cores_share
    from linker.rerank import load_reranker

    numpy_ = load_reranker(reranker, precision="fp32")
    mentions = [f"{word} pain {i}" for i in range(9) for word in ("head", "severe back", "x")]
    names = ["Headache", "Back pain", "Pain in the lower back and the legs"] * 9
    seen = []
    in_threads = runtime.in_threads
    monkeypatch.setattr(runtime, "in_threads", lambda run, items, workers: (seen.append((len(items), workers)),
                                                                                in_threads(run, items, workers)))
    monkeypatch.setattr(runtime, "available_cpus", lambda: 4)
    monkeypatch.setattr("linker.precision.available_cpus", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with cores_share(1):
        alone = numpy_.score(mentions, names)
    shared = numpy_.score(mentions, names)
    assert seen[0][1] == 1 and seen[1][1] == 4 and seen[1][0] >= 4  # enough batches for every thread
    np.testing.assert_allclose(shared, alone, rtol=1e-5, atol=1e-5)


def test_a_shipped_reranker_runs_in_numpy_as_in_torch():
    from linker.rerank import load_reranker

    numpy_ = load_reranker("linker-rerank-en", precision="fp32")
    torch_ = load_reranker("linker-rerank-en", precision="fp32", runtime="torch")
    pairs = (["hair falling out", "threw up", "cant sleep"], ["Alopecia", "Vomiting", "Insomnia"])
    assert numpy_.scorer == torch_.scorer
    np.testing.assert_allclose(numpy_.score(*pairs), torch_.score(*pairs), atol=1e-3)


def test_encoder_comparison_report_lists_each_encoder_and_refuses_a_label_that_is_no_file_name(tmp_path):
    from bench.encoder_dev import compare, markdown, paired
    from linker.errors import InputFormatError

    with pytest.raises(InputFormatError, match="a label usable as a file name"):
        compare({"../x": "minilm"}, tmp_path)  # refused before any index is built
    assert not any(tmp_path.iterdir())
    row = {"encoder": "e", "phrases": 632, "acc1": 64.87, "acc5": 83.39,
           "reranked": {"4": {"gold_in_top_k": 81.5, "acc1": 67.9, "retriever_weight": 64.0},
                        "8": {"gold_in_top_k": 85.0, "acc1": 68.0, "retriever_weight": 64.0}},
           "paired": {"retriever_right": paired([1, 0, 0, 0, 1], [1, 1, 1, 1, 0]),
                      "reranked_right": paired([1, 1], [1, 1])}}
    lines = "\n".join(markdown({"note": "", "encoders": {"shipped": {**row, "trained": None},
                                                         "hard": {**row, "trained": "linker train sap ..."}}}))
    assert "| shipped | 64.87 | 83.39 | 81.50 | 67.90 | 85.00 | 68.00 |" in lines
    assert "- hard: `linker train sap ...`" in lines and "632 development phrases" in lines
    # 3 phrases gained, 1 lost: p = 2 x (1 + 4) / 16 exactly; no discordant phrase: p 1
    assert "| hard | +3 / -1 (p 0.625) | +0 / -0 (p 1.000) |" in lines
    assert paired([0] * 10, [1] * 10) == {"gained": 10, "lost": 0, "p": round(2 / 1024, 4)}


def test_a_reports_note_comes_from_the_option_or_a_file_and_a_missing_file_is_one_line(tmp_path):
    import argparse

    from bench.report import add_note_options, note_of

    parser = argparse.ArgumentParser()
    add_note_options(parser, "a paragraph")
    note = tmp_path / "note.txt"
    note.write_text("How the folders were made.\n", encoding="utf-8")
    assert note_of(parser.parse_args(["--note", "inline"])) == "inline"
    assert note_of(parser.parse_args(["--note-file", str(note)])) == "How the folders were made."
    assert note_of(parser.parse_args([])) == ""
    with pytest.raises(SystemExit) as exc:
        note_of(parser.parse_args(["--note-file", str(tmp_path / "absent.txt")]))
    assert str(exc.value).startswith(f"{tmp_path / 'absent.txt'}: --note-file: expected a readable UTF-8 text file")
    with pytest.raises(SystemExit):  # both at once: argparse refuses
        parser.parse_args(["--note", "a", "--note-file", str(note)])
