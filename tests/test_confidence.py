"""Calibrated confidence and "no link": the isotonic map, `linker calibrate`, --min-confidence at every edge."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from linker.cli.main import main
from linker.confidence import (
    AUTO, CALIBRATION, DECISIONS, EXACT_SCORE, NO_LINK, REVIEW, Calibration, at_coverage, choose_margin_weight, coverage_curve,
    expected_calibration_error, fit_isotonic, margins, out_of_fold, raw_probability, twins_of_top,
)
from linker.errors import ConfigError, IndexMismatchError
from linker.eval.calibrate import calibrate
from linker.eval.report import evaluate
from linker.eval.trust import nil_section, remove_gold_concepts
from linker.index.manifest import read_manifest, verify
from linker.link import Linker
from linker.normalize import normalize_jsonl, normalize_path
from linker.service import create_app

from fixtures.normalize.normalize_tables import build_indexes

FIX = Path(__file__).parent / "fixtures"
HELDIN = f"tsv:{FIX / 'confidence/heldin.tsv'}"


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> Path:
    """The tiny MedDRA-like tf-idf index, calibrated on 14 held-in mentions."""
    folder = build_indexes(tmp_path_factory.mktemp("conf"))["meddra"]
    calibrate(folder, HELDIN)
    return folder


# ----------------------------------------------------------------------------- the map and its metrics


def test_isotonic_fit_is_monotone_and_bounded():
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    correct = [0, 1, 0, 0, 1, 1, 1, 1]
    cal = fit_isotonic(scores, correct, scorer="retriever", fitted_on="x")
    # PAV pools (0.2, 0.3, 0.4) -> 1/3; below the range it is flat (clip), above too.
    assert cal(np.array([0.1, 0.3, 0.8])).tolist() == pytest.approx([0.0, 1 / 3, 1.0])
    assert cal([-5.0, 5.0]).tolist() == [0.0, 1.0]
    grid = cal(np.linspace(-1, 2, 200))
    assert np.all(np.diff(grid) >= 0) and grid.min() >= 0 and grid.max() <= 1
    assert (cal.mentions, cal.accuracy) == (8, 5 / 8)
    assert cal.threshold_for(0.9) == pytest.approx(0.5)


def test_fit_needs_two_mentions():
    with pytest.raises(ConfigError, match="at least 2"):
        fit_isotonic([0.5], [1], scorer="retriever")


def test_ece_exact_small_case():
    # Bin [0.9, 1.0]: confidence 0.95 twice, one right -> |0.5 - 0.95| * 2; bin [0.1, 0.2): 0.1 wrong -> 0.1.
    assert expected_calibration_error([0.95, 0.95, 0.1], [1, 0, 0]) == pytest.approx((0.45 * 2 + 0.1) / 3)
    assert expected_calibration_error([1.0, 0.0], [1, 0]) == 0.0
    assert np.isnan(expected_calibration_error([], []))


def test_coverage_curve_keeps_ties_together_and_never_keeps_no_candidate():
    coverage, accuracy, thresholds = coverage_curve([0.9, 0.5, 0.5, -np.inf], [1, 1, 0, 0])
    assert coverage.tolist() == [0.25, 0.75] and accuracy.tolist() == pytest.approx([1.0, 2 / 3])
    assert thresholds.tolist() == [0.9, 0.5]
    assert at_coverage([0.9, 0.5, 0.5, -np.inf], [1, 1, 0, 0], 0.5) == {
        "target": 0.5, "threshold": 0.5, "coverage": 0.75, "accuracy": pytest.approx(2 / 3)}
    assert at_coverage([0.9, -np.inf], [1, 0], 0.9)["threshold"] is None


def test_raw_probability_clips_cosines_and_squashes_logits():
    assert raw_probability([-0.2, 0.4, 1.3], "retriever").tolist() == [0.0, 0.4, 1.0]
    assert raw_probability([0.0], "rerank:abc").tolist() == [0.5]


# ----------------------------------------------------------------------------- calibrate + Linker


def test_calibrate_stores_a_verified_file_and_candidates_carry_confidence(calibrated):
    manifest = read_manifest(calibrated)
    assert CALIBRATION in manifest["files"] and manifest["calibration"]["mentions"] == 14
    assert manifest["calibration"]["scorer"] == "retriever"
    verify(calibrated, manifest)
    linker = Linker.load(calibrated)
    [result] = linker.link(["hair loss"], k=3)
    confidences = [c.confidence for c in result.candidates]
    assert all(0.0 <= c <= 1.0 for c in confidences) and confidences == sorted(confidences, reverse=True)
    top = result.candidates[0]
    margin = top.score - result.candidates[1].score
    assert top.confidence == pytest.approx(linker.calibration([top.score], [margin], [top.retriever_score >= EXACT_SCORE])[0])
    assert result.candidates[0].retriever_score == result.candidates[0].score


def test_min_confidence_gives_no_link(calibrated):
    strict = Linker.load(calibrated, min_confidence=1.0)
    exact, vague = strict.link(["hair loss", "zzz qqq hair"], k=3)
    top = Linker.load(calibrated).link(["zzz qqq hair"], k=1)[0].candidates[0]
    assert exact.candidates and not exact.nil  # an exact name: every held-in exact hit was right
    assert top.confidence < 1.0
    assert vague.candidates == () and vague.nil
    assert vague.to_dict() == {"mention": "zzz qqq hair", "candidates": [], "nil": True, "decision": "no link"}


def test_min_confidence_without_calibration_is_refused(tmp_path):
    plain = build_indexes(tmp_path)["meddra"]
    with pytest.raises(ConfigError, match="linker calibrate"):
        Linker.load(plain, min_confidence=0.5)
    with pytest.raises(ConfigError, match="from 0 to 1"):
        Linker.load(plain, min_confidence=1.5)


def test_min_score_gives_no_link_without_calibration(tmp_path, capsys):
    plain = build_indexes(tmp_path)["meddra"]
    scores = {r.mention: r.candidates[0].score for r in Linker.load(plain).link(["hair loss", "zzz qqq hair"], k=1)}
    assert scores["hair loss"] > scores["zzz qqq hair"]
    cut = (scores["hair loss"] + scores["zzz qqq hair"]) / 2  # between the two, not on a kernel's last bit
    exact, vague = Linker.load(plain, min_score=cut).link(["hair loss", "zzz qqq hair"], k=3)
    assert exact.candidates and exact.decision is None  # no calibration: no decision of its own
    assert vague.to_dict() == {"mention": "zzz qqq hair", "candidates": [], "nil": True, "decision": "no link"}
    with pytest.raises(ConfigError, match="from -1 to 1"):
        Linker.load(plain, min_score=1.5)
    main(["link", "--index", str(plain), "--min-score", str(cut), "--json", "hair loss", "zzz qqq hair"])
    assert [r["nil"] for r in json.loads(capsys.readouterr().out)] == [False, True]
    with pytest.raises(SystemExit) as exit_info:
        main(["normalize", "--index", str(plain), "--input", "-", "--output", "-", "--format", "jsonl",
              "--min-score", "2"])
    assert exit_info.value.code == 1 and "--min-score" in capsys.readouterr().err


def test_changed_calibration_file_is_refused(calibrated, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(calibrated, copy)
    data = json.loads((copy / CALIBRATION).read_text())
    data["y"] = [1.0 for _ in data["y"]]
    (copy / CALIBRATION).write_text(json.dumps(data))
    with pytest.raises(IndexMismatchError, match="calibration.json"):
        Linker.load(copy)


def test_calibration_of_another_scorer_gives_no_confidence(calibrated, tmp_path, caplog):
    copy = tmp_path / "other"
    shutil.copytree(calibrated, copy)
    cal = Calibration(**{**json.loads((copy / CALIBRATION).read_text()), "scorer": "rerank:0123"})
    from linker.confidence import write_calibration

    write_calibration(copy, cal)
    linker = Linker.load(copy)
    assert linker.calibration is None and "fitted for scorer" in caplog.text
    assert linker.link(["hair loss"], k=1)[0].candidates[0].confidence is None


# ----------------------------------------------------------------------------- edges


def test_jsonl_brat_and_service_show_no_link(calibrated, tmp_path):
    strict = Linker.load(calibrated, min_confidence=1.0)
    spans = tmp_path / "spans.jsonl"
    spans.write_text('{"text": "hair loss"}\n{"text": "zzz qqq hair"}\n')
    normalize_jsonl(strict, spans, tmp_path / "out.jsonl", k=2)
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r["nil"], len(r["candidates"])) for r in records] == [(False, 2), (True, 0)]
    assert 0 < records[0]["candidates"][0]["confidence"] <= 1

    brat = tmp_path / "brat"
    brat.mkdir()
    (brat / "doc.txt").write_text("hair loss and zzz qqq hair\n")
    (brat / "doc.ann").write_text("T1\tProblem 0 9\thair loss\nT2\tProblem 14 26\tzzz qqq hair\n")
    normalize_path(strict, brat, tmp_path / "brat_out", fmt="brat")
    lines = (tmp_path / "brat_out/doc.ann").read_text().splitlines()
    assert [line.split("\t")[1].split()[1] for line in lines if line.startswith("N")] == ["T1"]

    app = create_app([calibrated], linker_options={"min_confidence": 1.0})
    with TestClient(app) as client:
        body = client.post("/link", json={"mentions": [{"text": "hair loss"}, {"text": "zzz qqq hair"}]}).json()
    first, second = body["results"]
    assert (first["nil"], second["nil"], second["candidates"]) == (False, True, [])
    assert set(first["candidates"][0]) >= {"confidence", "retriever_score", "score"}


def test_cli_calibrate_and_link_min_confidence(tmp_path, capsys):
    folder = build_indexes(tmp_path)["meddra"]
    main(["link", "--index", str(folder), "hair loss"])
    assert "confidence" not in capsys.readouterr().out
    main(["calibrate", "--index", str(folder), "--dataset", HELDIN])
    summary = json.loads(capsys.readouterr().out)
    assert (summary["mentions"], summary["scorer"]) == (14, "retriever")
    assert 0 <= summary["ece_fitted_in_sample"] <= summary["ece_raw"] + 1e-9
    main(["link", "--index", str(folder), "--min-confidence", "1.0", "--json", "hair loss", "zzz qqq hair"])
    out = json.loads(capsys.readouterr().out)
    assert [r["nil"] for r in out] == [False, True]
    main(["link", "--index", str(folder), "--min-confidence", "1.0", "zzz qqq hair"])
    assert "(no link)" in capsys.readouterr().out


def test_cli_min_confidence_without_calibration_exits_1(tmp_path, capsys):
    folder = build_indexes(tmp_path)["meddra"]
    with pytest.raises(SystemExit) as exit_info:
        main(["link", "--index", str(folder), "--min-confidence", "0.5", "hair loss"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --min-confidence needs a calibration") and err.count("\n") == 1


# ----------------------------------------------------------------------------- evaluation


def test_remove_gold_concepts_marks_mentions_without_answer():
    ids = ["A", "B", "C", "D"]
    gold = [(("A",),), (("B",),), (("A",), ("C",)), (("Z",),)]
    removed, nil = remove_gold_concepts(ids, gold, 0.34, expand=None, seed=0)
    assert len(removed) == 1 and set(removed) <= {"A", "B", "C"}  # D is nobody's gold
    expected = [("A" in removed), ("B" in removed), ("A" in removed or "C" in removed), True]
    assert nil.tolist() == expected
    assert remove_gold_concepts(ids, gold, 0.0, expand=None)[1].tolist() == [False, False, False, True]


def test_nil_section_precision_recall_f1():
    conf = np.array([0.9, 0.2, 0.4, -np.inf])
    correct = np.array([True, False, False, False])
    gold_nil = np.array([False, True, False, True])
    out = nil_section(conf, correct, gold_nil, 0.5, ["X"], 0.2)
    # predicted NIL: 0.2, 0.4, -inf -> 3; true NIL among them: 2 of 2 gold
    assert (out["predicted_nil"], out["true_nil"], out["gold_nil"]) == (3, 2, 2)
    assert (out["precision"], out["recall"]) == (pytest.approx(2 / 3), 1.0)
    assert out["f1"] == pytest.approx(0.8) and out["linked_accuracy_at_1"] == 1.0
    assert out["best_f1_oracle"]["f1"] == pytest.approx(1.0)  # threshold 0.4: predicts 0.2 and -inf only


def test_evaluate_reports_calibration_and_nil(calibrated, tmp_path):
    report = evaluate(calibrated, HELDIN, ks=(1,), nil_fraction=0.4, report_dir=tmp_path, name="rep")
    cal = report.calibration
    assert cal["mentions"] == 14 and cal["confidence"] == "calibrated"
    assert cal["ece_calibrated"] <= cal["ece_raw"]
    assert report.nil["concepts_removed"] == 2 and report.nil["gold_nil"] >= 2
    md = (tmp_path / "rep.md").read_text()
    assert "ECE of the raw score" in md and "No link:" in md
    assert (tmp_path / "rep.coverage.png").read_bytes()[:4] == b"\x89PNG"


def test_evaluate_nil_needs_calibration(tmp_path):
    plain = build_indexes(tmp_path)["meddra"]
    with pytest.raises(ConfigError, match="calibrate"):
        evaluate(plain, HELDIN, ks=(1,), nil_fraction=0.2)


# ----------------------------------------------------------------------------- margins, exactness, decisions


def test_margins_top_against_the_second_the_rest_against_the_top():
    final = np.array([0.5, 0.9, 0.88, 0.1])
    order = np.array([1, 2, 0, 3])
    assert margins(final, order).tolist() == pytest.approx([0.02, -0.02, -0.4, -0.8])
    assert margins(np.array([0.7]), np.array([0])).tolist() == pytest.approx([0.7])  # no rival: its own score
    assert margins(np.array([]), np.array([], dtype=int)).tolist() == []
    # a twin (the top one's name in another terminology) is no rival: the margin is against the next concept
    twins = twins_of_top(zip(["Nausea", "nausea", "Vomiting", "Nausea"], ["hpo", "icd10cm", "icd10cm", "hpo"]), 4)
    assert twins.tolist() == [False, True, False, False]
    # the same name in the top one's own source is a rival
    assert twins_of_top(zip(["Nausea", "Nausea"], ["hpo", "hpo"]), 2).tolist() == [False, False]
    assert margins(np.array([1.0, 1.0, 0.7, 0.6]), np.arange(4), twins).tolist() == pytest.approx([0.3, 0.0, -0.3, -0.4])


def test_the_map_reads_score_margin_and_exactness():
    cal = Calibration("retriever", (0.0, 1.0, 11.0), (0.0, 0.5, 1.0), margin_weight=2.0, exact_offset=10.0)
    assert cal.features([0.5], [0.25], [False]).tolist() == pytest.approx([1.0])
    assert cal.features([1.0], [0.0], [True]).tolist() == pytest.approx([11.0])
    # a near-tie earns less than the same score as a clear win
    tie, win = cal([0.4, 0.4], [0.0, 0.3], [False, False])
    assert tie < win
    # older files (no margin weight, no offset) read the score alone
    plain = Calibration("retriever", (0.0, 1.0), (0.0, 1.0))
    assert plain([0.5], [0.4], [True]).tolist() == pytest.approx([0.5])


def test_decide_states_three_bands():
    cal = Calibration("retriever", (0.0, 1.0), (0.0, 1.0), auto_from=0.95, no_link_below=0.2)
    assert [cal.decide(c) for c in (0.99, 0.95, 0.5, 0.2, 0.19, None)] == \
        [AUTO, AUTO, REVIEW, REVIEW, NO_LINK, NO_LINK]
    old = Calibration("retriever", (0.0, 1.0), (0.0, 1.0))  # a file from before the decisions: nothing is auto
    assert [old.decide(c) for c in (1.0, 0.0)] == [REVIEW, REVIEW]


def test_margin_weight_is_chosen_only_when_the_margin_tells_right_from_wrong():
    rng = np.random.default_rng(0)
    scores, margins_ = rng.uniform(0.5, 1.0, 600), rng.uniform(0.0, 0.2, 600)
    informative = rng.uniform(size=600) < margins_ / 0.2  # right iff the margin is wide, whatever the score
    weight, brier = choose_margin_weight(scores, margins_, informative)
    assert weight > 0 and brier[weight] < brier[0.0]
    noise = rng.uniform(size=600) < scores  # right with P = score; the margin is noise
    weight, _ = choose_margin_weight(scores, margins_, noise)
    assert weight <= 0.5


def test_out_of_fold_never_sees_its_own_answer():
    features = np.arange(10, dtype=float)
    correct = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1], dtype=float)
    conf = out_of_fold(features, correct, folds=10)
    assert np.all((conf >= 0) & (conf <= 1)) and conf[:3].max() <= conf[-3:].min()


def test_calibrate_with_dictionary_names_gives_every_mention_a_decision(tmp_path):
    folder = build_indexes(tmp_path)["meddra"]
    summary = calibrate(folder, HELDIN, dictionary_names=5)  # of its 10 names
    assert (summary["mentions"], summary["dictionary_names"]) == (19, 5)
    assert summary["auto_from"] == 0.95 and summary["no_link_below"] == 0.2
    assert set(summary["decisions_out_of_fold"]) == set(DECISIONS)
    assert sum(v["mentions"] for v in summary["decisions_out_of_fold"].values()) == 19
    assert set(summary["decisions_out_of_fold_by_source"]) == {HELDIN, "dictionary names"}
    linker = Linker.load(folder)
    assert linker.calibration.exact_offset > 0 and read_manifest(folder)["calibration"]["auto_from"] == 0.95
    for result in linker.link(["hair loss", "zzz qqq hair", "head pain"], k=1):
        assert result.decision == linker.calibration.decide(result.candidates[0].confidence if result.candidates
                                                            else None)
        assert result.to_dict()["decision"] == result.decision
    with pytest.raises(ConfigError, match="no_link_below"):
        calibrate(folder, HELDIN, no_link_below=1.5)


def test_cli_calibrate_refuses_a_precision_out_of_range(tmp_path, capsys):
    folder = build_indexes(tmp_path)["meddra"]
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", "--index", str(folder), "--dataset", HELDIN, "--auto-precision", "1.5"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.startswith("error: --auto-precision") and err.count("\n") == 1


def test_decisions_reach_jsonl_the_service_and_annotate(calibrated, tmp_path):
    linker = Linker.load(calibrated)
    spans = tmp_path / "spans.jsonl"
    spans.write_text('{"text": "hair loss"}\n{"text": "zzz qqq hair"}\n')
    normalize_jsonl(linker, spans, tmp_path / "out.jsonl", k=1)
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    expected = [r.decision for r in linker.link(["hair loss", "zzz qqq hair"], k=1)]
    assert [r["decision"] for r in records] == expected and set(expected) <= set(DECISIONS)
    with TestClient(create_app([calibrated])) as client:
        body = client.post("/link", json={"mentions": [{"text": "hair loss"}, {"text": "zzz qqq hair"}]}).json()
    assert [r["decision"] for r in body["results"]] == expected
    from linker.engine.arrow import link_arrow

    batch = pa.RecordBatch.from_pydict({"text": ["hair loss", "zzz qqq hair"]})
    assert linker.link_batch(batch, k=1).column("decision").to_pylist() == expected  # Ray Data, Spark
    assert link_arrow(linker, batch).column("decision").to_pylist() == expected  # the engines' flat rows

    from linker.extract import decide
    from linker.extract.model import ExtractedSpan
    from linker.link import LinkResult

    [hair] = linker.link(["hair loss"], k=1)
    sure, unsure = (ExtractedSpan(0, 9, "hair loss", "AdverseEvent", "positive", c) for c in (0.9, 0.3))
    auto = LinkResult("hair loss", hair.candidates, AUTO)
    rows = decide([[sure, unsure]], {(0, 0): auto, (0, 1): auto}, review_below=0.5)[0]
    assert [r["decision"] for r in rows] == [AUTO, REVIEW]  # an unsure extraction is not coded without review
    [row] = decide([[sure]], {(0, 0): LinkResult("hair loss", hair.candidates, NO_LINK)})[0]
    assert (row["decision"], row["code"], len(row["candidates"])) == (NO_LINK, None, 1)  # kept for a person
    [row] = decide([[sure]], {(0, 0): LinkResult("hair loss", hair.candidates, None)})[0]
    assert row["decision"] == REVIEW  # no calibration: no code is trusted without a person
