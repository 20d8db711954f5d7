"""Adverse-event extractor, fast parts: windows and exact offsets, TAC discontinuous mentions, PHEE brat reading,
decoding and the span metrics. No trained model: a stub encoder whose outputs depend on the token alone."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

from linker.extract.data import AE, AR, DRUG, LABELS, read_phee, read_tac, tac_split
from linker.extract.metrics import mention_scores, normalize_answer, phee_scores
from linker.extract.model import (
    B,
    O,
    TaggerConfig,
    decode,
    token_tags,
    tokenize,
    windows,
)

torch = pytest.importorskip("torch")

TAC_LABEL = """<?xml version="1.0" encoding="UTF-8"?>
<Label drug="testdrug" track="TAC2017_ADR">
  <Text>
    <Section name="adverse reactions" id="S1">Patients had severe rash and pain in the joints. No nausea was seen.</Section>
    <Section name="warnings" id="S2">Drugs of this class may cause hepatotoxicity.</Section>
  </Text>
  <Mentions>
    <Mention id="M1" section="S1" type="AdverseReaction" start="20" len="4" str="rash" />
    <Mention id="M2" section="S1" type="AdverseReaction" start="29,41" len="4,6" str="pain joints" />
    <Mention id="M3" section="S1" type="Severity" start="13" len="6" str="severe" />
    <Mention id="M4" section="S1" type="Negation" start="49" len="2" str="No" />
    <Mention id="M5" section="S1" type="AdverseReaction" start="52" len="6" str="nausea" />
    <Mention id="M6" section="S2" type="DrugClass" start="0" len="19" str="Drugs of this class" />
    <Mention id="M7" section="S2" type="AdverseReaction" start="30" len="14" str="hepatotoxicity" />
  </Mentions>
  <Relations>
    <Relation id="RL1" type="Negated" arg1="M5" arg2="M4" />
    <Relation id="RL2" type="Hypothetical" arg1="M7" arg2="M6" />
  </Relations>
  <Reactions />
</Label>
"""


@pytest.fixture(scope="module")
def tokenizer():
    from linker.encoders import load_encoder

    return load_encoder("minilm").model.tokenizer


def test_windows_cover_every_token_within_the_length():
    for n in (0, 1, 5, 126, 127, 300, 1001):
        for max_length, stride in ((128, 96), (8, 3), (8, 6), (10, 100)):
            spans = windows(n, max_length, stride)
            covered = np.zeros(n, int)
            for a, b in spans:
                assert 0 <= a < b <= n or n == 0
                assert b - a <= max_length - 2
                covered[a:b] += 1
            assert (covered >= 1).all()
            assert spans[-1][1] == n
    with pytest.raises(ValueError):
        windows(10, 2, 1)


def _stub_extractor(tokenizer, event_words, max_length, stride):
    """An Extractor whose tag of a word piece depends on the piece alone: B of the term head (AdverseReaction) for
    `event_words`' pieces, O elsewhere; so any window cut must give the same spans."""
    from linker.extract.extractor import Extractor

    event_ids = sorted({i for w in event_words for i in tokenizer(w, add_special_tokens=False)["input_ids"]})

    class Embeddings(torch.nn.Module):
        def forward(self, input_ids, token_type_ids):
            hit = torch.isin(input_ids, torch.tensor(event_ids)).float()
            return torch.stack([hit, 1 - hit], -1)

    bert = torch.nn.Module()
    bert.embeddings = Embeddings()
    bert.encoder = SimpleNamespace(layer=[])
    config = TaggerConfig(max_length=max_length, stride=stride, frozen_layers=0, threshold=0.5)
    head = torch.nn.Linear(2, 3 * len(LABELS) + 3)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        column = LABELS.index(AR) * 3
        head.weight[column + B, 0] = 10.0  # an event piece: B
        head.weight[column + O, 1] = 10.0  # any other piece: O
        for other in range(len(LABELS)):
            if other != LABELS.index(AR):
                head.bias[other * 3 + O] = 10.0
        head.bias[3 * len(LABELS)] = 5.0  # status: positive
    return Extractor(bert, tokenizer, head, config)


@pytest.mark.parametrize("max_length,stride", [(128, 96), (8, 3), (12, 10), (6, 1)])
def test_long_text_windows_map_offsets_back_exactly(tokenizer, max_length, stride):
    sentences = ["Patient 12 developed a rash after the first dose.", "  Thrombocytopenia\twas noted; no fever.\n",
                 "Ünïcödé text — then rash again (rash)!"]
    text = " ".join(sentences[i % 3] + f" day {i}." for i in range(60))
    extractor = _stub_extractor(tokenizer, ["rash", "thrombocytopenia"], max_length, stride)
    spans = extractor.extract([text])[0]
    expected = [(m.start(), m.end()) for m in re.finditer(r"rash|Thrombocytopenia", text)]
    assert [(s.start, s.end) for s in spans] == expected
    assert all(text[s.start:s.end] == s.text and s.label == AE and s.status == "positive" for s in spans)
    # every window size gives the same token probabilities as one window over a short text
    offsets, probs, _ = extractor.probabilities(text)
    assert offsets == tokenize(tokenizer, text)[1]
    assert probs.shape == (len(offsets), len(LABELS), 3) and np.allclose(probs.sum(-1), 1.0, atol=1e-5)


def test_empty_and_blank_texts_give_no_spans(tokenizer):
    extractor = _stub_extractor(tokenizer, ["rash"], 16, 8)
    assert extractor.extract(["   ", "rash"]) == [[], extractor.extract(["rash"])[0]]


def test_tac_discontinuous_mentions_are_their_pieces(tmp_path, tokenizer):
    path = tmp_path / "TESTDRUG.xml"
    path.write_text(TAC_LABEL, encoding="utf-8")
    s1, s2 = read_tac(path)
    assert s1.id == "TESTDRUG#S1" and s1.types == (AR,) and s1.source == "tac"
    assert [(s, e, st) for s, e, _, st in s1.spans] == [(20, 24, "positive"), (29, 33, "positive"),
                                                       (41, 47, "positive"), (52, 58, "negated")]
    assert [g[0] for g in s1.groups] == [((20, 24),), ((29, 33), (41, 47)), ((52, 58),)]
    assert s2.spans == [(30, 44, AR, "hypothetical")]
    # both pieces of "pain ... joints" begin a span of their own; the words between are outside
    ids, offsets = tokenize(tokenizer, s1.text)
    tags, status = token_tags(offsets, s1.spans, LABELS)
    words = {s1.text[a:b]: (tags[i, LABELS.index(AR)], status[i]) for i, (a, b) in enumerate(offsets)}
    assert words["pain"] == (B, 0) and words["joints"] == (B, 0) and words["in"][0] == O
    assert words["nausea"] == (B, 1) and words["No"][0] == O
    assert (tags[:, LABELS.index(DRUG)] == O).all() and (tags[:, LABELS.index(AE)] == O).all()
    # exact: the discontinuous mention is missed by contiguous spans; relaxed: found
    scores = mention_scores([[g[0] for g in s1.groups]], [[(20, 24), (29, 47)]])
    assert scores["exact"]["recall"] == round(100 / 3, 2) and scores["relaxed"]["recall"] == round(200 / 3, 2)
    assert scores["relaxed"]["precision"] == 100.0
    # a prediction of the same pieces matches it exactly; of other pieces, not
    scores = mention_scores([[g[0] for g in s1.groups]], [[(20, 24), ((29, 33), (41, 47)), ((29, 33), (44, 47))]])
    assert scores["exact"]["recall"] == round(200 / 3, 2) and scores["exact"]["precision"] == round(200 / 3, 2)
    assert scores["relaxed"]["precision"] == 100.0


def test_tac_split_is_seeded_and_disjoint(tmp_path):
    for name in "ABCDEFGHIJ":
        (tmp_path / f"{name}.xml").write_text(TAC_LABEL, encoding="utf-8")
    train, dev = tac_split(tmp_path)
    assert len(dev) == 2 and len(train) == 8 and not set(train) & set(dev)
    assert tac_split(tmp_path) == (train, dev)


def test_phee_brat_effects_drugs_and_event_attributes(tmp_path):
    folder = tmp_path / "phee"
    folder.mkdir()
    docs = {
        "1": ("Rash developed after amoxicillin.",
              "T1\tEffect 0 4\tRash\nT2\tDrug 21 32\tamoxicillin\nT3\tAdverse_event 5 14\tdeveloped\nE1\tAdverse_event:T3\n"),
        "2": ("Rituximab cleared the lesions.",
              "T1\tDrug 0 9\tRituximab\nT2\tEffect 18 29\tthe lesions\nT3\tPotential_therapeutic_event 10 17\tcleared\n"
              "E1\tPotential_therapeutic_event:T3\n"),
        "3": ("No hepatitis was seen with drug X.",
              "T1\tEffect 3 12\thepatitis\nT2\tAdverse_event 13 16\twas\nE1\tAdverse_event:T2\nA1\tNegated E1\n"),
        "4": ("Nausea may follow cisplatin.",
              "T1\tEffect 0 6\tNausea\nT2\tAdverse_event 11 17\tfollow\nE1\tAdverse_event:T2\nA1\tSpeculated E1\n"
              "T3\tDrug 18 27\tcisplatin\n"),
        "5": ("A patient with sarcoidosis developed rash on drug X.",
              "T1\tSub-Disorder 15 26\tsarcoidosis\nT2\tEffect 37 41\trash\nT3\tAdverse_event 27 36\tdeveloped\n"
              "E1\tAdverse_event:T3\n"),
    }
    for name, (text, ann) in docs.items():
        (folder / f"{name}.txt").write_text(text, encoding="utf-8")
        (folder / f"{name}.ann").write_text(ann, encoding="utf-8")
    read = {d.id: d for d in read_phee(folder)}
    assert read["1"].spans == [(0, 4, AE, "positive"), (21, 32, DRUG, "positive")]
    assert read["2"].spans == [(0, 9, DRUG, "positive"), (18, 29, "TherapeuticEffect", "positive")]
    assert read["3"].spans == [(3, 12, AE, "negated")]
    assert read["4"].spans == [(0, 6, AE, "hypothetical"), (18, 27, DRUG, "positive")]
    # the subject's own disorder is kept aside for evaluation, never a training label
    assert read["5"].spans == [(37, 41, AE, "positive")] and read["5"].subject_disorders == [(15, 26)]
    assert read["1"].subject_disorders == []


def test_decode_widens_to_whole_words_and_keeps_status():
    text = "severe thrombocytopenia"
    offsets = [(0, 6), (7, 14), (14, 16), (16, 23)]  # a span starting inside a word is widened
    probs = np.zeros((4, len(LABELS), 3))
    probs[:, :, O] = 1.0
    probs[2, 0] = [0.1, 0.8, 0.1]
    probs[3, 0] = [0.1, 0.2, 0.7]
    marks = np.tile([0.1, 0.8, 0.1], (4, 1))
    spans = decode(text, offsets, probs, marks, LABELS, 0.5)
    assert [(s.start, s.end, s.text, s.status) for s in spans] == [(7, 23, "thrombocytopenia", "negated")]
    assert spans[0].confidence == pytest.approx(0.9)
    assert decode(text, offsets, probs, marks, LABELS, 0.95) == []


def test_decode_never_runs_a_span_over_a_line_break():
    text = "Nausea\nHeadache  dizziness"
    offsets = [(0, 6), (7, 15), (17, 26)]
    probs = np.zeros((3, len(LABELS), 3))
    probs[:, :, O] = 1.0
    probs[0, 0] = [0.0, 1.0, 0.0]  # one run B I I: without the line break, one span "Nausea\nHeadache  dizziness"
    probs[1:, 0] = [0.0, 0.0, 1.0]
    marks = np.tile([1.0, 0.0, 0.0], (3, 1))
    spans = decode(text, offsets, probs, marks, LABELS, 0.5)
    assert [s.text for s in spans] == ["Nausea", "Headache  dizziness"]
    assert [s.text for s in decode("Nausea headache", [(0, 6), (7, 15)], probs[:2], marks[:2], LABELS, 0.5)] == [
        "Nausea headache"]


def test_phee_metrics_follow_squad_normalisation():
    assert normalize_answer("The  Rash!") == "rash"
    gold = [["severe rash", "fever"], ["the hepatitis"]]
    pred = [["Severe rash.", "rash"], []]
    scores = phee_scores(gold, pred)
    assert scores["EM_precision"] == 50.0 and scores["EM_recall"] == round(100 / 3, 2)
    # tokens: pred {severe, rash, rash} vs gold {severe, rash, fever, hepatitis}: 2 common
    assert scores["Token_precision"] == round(200 / 3, 2) and scores["Token_recall"] == 50.0


def test_decode_joins_hyphenated_pieces_and_styles_pick_a_head():
    from linker.extract.extractor import select_style

    text = "non-convulsive status"
    offsets = [(0, 3), (3, 4), (4, 14), (15, 21)]
    probs = np.zeros((4, len(LABELS), 3))
    probs[:, :, O] = 1.0
    probs[0, 0] = [0.0, 1.0, 0.0]  # "non": B; "-": O; "convulsive status": B I
    probs[2, 0] = [0.0, 1.0, 0.0]
    probs[3, 0] = [0.0, 0.0, 1.0]
    marks = np.tile([1.0, 0.0, 0.0], (4, 1))
    spans = decode(text, offsets, probs, marks, LABELS, 0.5)
    assert [(s.start, s.end, s.text) for s in spans] == [(0, 21, "non-convulsive status")]
    both = spans + [spans[0].__class__(0, 3, "non", AR, "positive", 0.9)]
    assert [(s.label, s.text) for s in select_style(both, "terms")] == [(AE, "non")]
    assert [(s.label, s.text) for s in select_style(both, "phrases")] == [(AE, "non-convulsive status")]


def test_auto_style_keeps_each_coordinated_event_of_a_phrase_a_term_overlaps():
    from linker.extract.extractor import select_style
    from linker.extract.model import ExtractedSpan

    def spans_of(text, phrase, terms, lang=None):
        start = text.index(phrase)
        spans = [ExtractedSpan(start, start + len(phrase), phrase, AE, "positive", 0.8)]
        spans += [ExtractedSpan(text.index(t), text.index(t) + len(t), t, AR, "positive", 0.9) for t in terms]
        return [(s.text, s.group is not None) for s in select_style(spans, "auto", text, lang)]

    text = "He developed hearing loss and an unsteady gait while on it."
    # the term found in one part no longer takes the other part's event with the phrase
    assert spans_of(text, "hearing loss and an unsteady gait", ["unsteady gait"]) == [
        ("hearing loss", True), ("unsteady gait", False)]
    text = "She had dizziness, nausea and a strange tingling in both hands."
    assert [t for t, _ in spans_of(text, "dizziness, nausea and a strange tingling in both hands", ["tingling"])] == [
        "dizziness", "nausea", "tingling"]
    # a part of grades and fillers alone is no event; a phrase no coordinator parts still goes whole
    text = "severe and a rash"
    assert [t for t, _ in spans_of(text, text, ["rash"])] == ["rash"]
    text = "worsening rash"
    assert [t for t, _ in spans_of(text, text, ["rash"])] == ["rash"]
    # the coordinators of the text's language: Spanish "y", not the English "and"
    text = "empeoramiento de la hipoacusia y de la alteración en la marcha"
    assert [t for t, _ in spans_of(text, text, ["alteración en la marcha"], "es")] == [
        "empeoramiento de la hipoacusia", "alteración en la marcha"]
    assert [t for t, _ in spans_of(text, text, ["alteración en la marcha"], "ja")] == ["alteración en la marcha"]
    # without the text (a caller of the old signature) the phrase goes whole, as before
    spans = [ExtractedSpan(0, 17, "severe and a rash", AE, "positive", 0.8),
             ExtractedSpan(13, 17, "rash", AR, "positive", 0.9)]
    assert [s.text for s in select_style(spans, "auto")] == ["rash"]


def test_train_extractor_cli_writes_a_release_that_loads(tmp_path, capsys):
    import json

    from conftest import assert_one_line_error, cli

    from linker.extract import extract, load_extractor
    from linker.models import read_release

    phee, tac = _tiny_training_data(tmp_path)
    out = tmp_path / "release"
    args = ["train", "extractor", "--phee-train", phee, "--phee-dev", phee, "--tac", tac, "--out", out, "--epochs", "1",
            "--threads", "1"]
    code, err = cli(args, capsys)
    assert code == 0, err
    manifest = read_release(out).manifest
    assert manifest["kind"] == "tagger" and len(manifest["training"]["tac_dev_labels"]) == 1
    assert set(manifest["threshold"]) == set(LABELS)
    assert "linker train extractor" in (out / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert isinstance(extract(["Rash after amoxicillin."], model=load_extractor(out))[0], list)
    # the decision head is learnt with the tagger and ships with it (its tensors, its cut, its record)
    assert 0 < manifest["decision_cut"] < 1 and manifest["decision"]["examples"]["train"]["adverse"] > 6  # PHEE, TAC
    assert {"decision.weight", "decision.bias"} <= set(manifest["tensors"]["shapes"])
    assert load_extractor(out).decision[0].shape == (4, 384)
    code, err = cli(args, capsys)  # a release is there: only with --overwrite
    assert_one_line_error(code, err, "--overwrite")
    code, err = cli([*args, "--overwrite"], capsys)
    assert code == 0, err
    code, err = cli([*args, "--tune-only"], capsys)  # the decoding chosen again, the tensors kept
    assert code == 0, err
    tuned = read_release(out).manifest
    assert tuned["training"]["tuned"]["command"].endswith("--tune-only --threads 1")
    assert tuned["tensors"] == manifest["tensors"] and set(tuned["extend"]) == set(LABELS)
    code, err = cli([*args, "--decision-only"], capsys)  # the decision head learnt again, the rest kept
    assert code == 0, err
    relearnt = read_release(out).manifest
    assert relearnt["decision"]["command"].endswith("--decision-only --threads 1")
    assert relearnt["threshold"] == tuned["threshold"] and relearnt["tensors"]["shapes"] == tuned["tensors"]["shapes"]
    # a release whose manifest has a decision cut but whose weights lack the head is refused in one line, not run
    from linker.errors import InputFormatError
    from linker.extract.train import WRITTEN_FIELDS, rewrite_release
    from linker.models import load_tensors

    release = read_release(out)
    headless = {k: v for k, v in load_tensors(release).items() if not k.startswith("decision.")}
    rewrite_release(release, {k: v for k, v in relearnt.items() if k not in WRITTEN_FIELDS}, version=release.version,
                    tensors=headless)
    with pytest.raises(InputFormatError, match="decision tensors of shapes"):
        load_extractor(out)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("x")
    code, err = cli([*args[:-5], tmp_path / "other", "--epochs", "1"], capsys)
    assert_one_line_error(code, err, "not a release")
    assert json.loads((out / "manifest.json").read_text())["name"] == "linker-ae"


def test_decision_head_relabels_a_positive_event_it_reads_as_something_else():
    from linker.extract.data import HISTORY, INDICATION, Doc
    from linker.extract.decision import decide, decision_examples, span_probabilities
    from linker.extract.model import ExtractedSpan

    offsets = np.array([(0, 4), (5, 9), (10, 15)])
    # per piece logits over (adverse, indication, beneficial, history)
    logits = np.array([[4.0, 0, 0, 0], [0, 0, 0, 3.0], [0, 3.0, 0, 0]])
    assert span_probabilities(logits, offsets, 5, 9).argmax() == 3
    assert span_probabilities(logits, offsets, 16, 20) is None  # no piece under it
    spans = [ExtractedSpan(0, 4, "rash", AE, "positive", 0.9), ExtractedSpan(5, 9, "gout", AE, "positive", 0.9),
             ExtractedSpan(10, 15, "fever", AE, "negated", 0.9), ExtractedSpan(10, 15, "fever", DRUG, "positive", 0.9)]
    out = decide(spans, offsets, logits, cut=0.4)
    # an adverse event stays; a history one becomes MedicalHistory; a negated event stays an event, not coded;
    # other labels are not read
    assert [(s.label, s.status) for s in out] == [(AE, "positive"), (HISTORY, "positive"), (AE, "negated"),
                                                  (DRUG, "positive")]
    assert [s.label for s in decide(spans[:2], offsets, logits, cut=0.0)] == [AE, AE]  # a cut of 0 changes nothing
    # the examples: positive events, indications, beneficial effects, Sub-Disorders no event overlaps
    doc = Doc("d", "Rash and gout on it for acne.", [(0, 4, AE, "positive"), (9, 13, AE, "negated"),
                                                    (24, 28, INDICATION, "positive")],
              subject_disorders=[(9, 13), (17, 19)])
    assert decision_examples([doc]) == [(0, 0, 4, 0), (0, 17, 19, 3), (0, 24, 28, 1)]


def test_lexicon_finds_whole_names_longest_first_at_exact_offsets():
    from linker.extract.lexicon import Lexicon

    lexicon = Lexicon(["Rash", "Nausea", "Nausea/vomiting", "hair loss", "BP", "Pain", 7, "Pain in extremity"])
    text = "Crash, then NAUSEA  Vomiting and rash; hair\tloss, BP up. Pain in extremity (pain)."
    found = [text[a:b] for a, b in lexicon.find(text)]
    # "rash" not inside "Crash"; the two-word name before its first word; 2-letter names skipped; any white space
    assert found == ["NAUSEA  Vomiting", "rash", "hair\tloss", "Pain in extremity", "pain"]
    assert Lexicon([]).find("rash") == [] and len(lexicon) == 6
    assert Lexicon(["Severe", "Mild", "Severe pain"]).find("severe pain, mild") == [(0, 11)]  # grades are no events


def test_lexicon_names_become_terms_where_the_tagger_sees_evidence():
    from linker.extract.model import ExtractedSpan, lexicon_spans

    text = "itchy rash and diarrhea"
    offsets = np.array([(0, 5), (6, 10), (11, 14), (15, 23)])
    probs = np.zeros((4, len(LABELS), 3))
    probs[:, :, O] = 1.0
    probs[:, LABELS.index(AE)] = [[0.1, 0.9, 0.0], [0.2, 0.0, 0.8], [0.3, 0.0, 0.7], [0.6, 0.0, 0.4]]  # phrase head
    marks = np.tile([0.9, 0.05, 0.05], (4, 1))
    have = [ExtractedSpan(0, 10, "itchy rash", AR, "positive", 0.9)]
    found = [(6, 10), (15, 23)]
    # "rash" overlaps a term already found; "diarrhea" has evidence 0.4 from the phrase head
    spans = lexicon_spans(text, offsets, probs, marks, LABELS, have, found, {AR: 0.3})
    assert [(s.text, s.label, s.status) for s in spans] == [("itchy rash", AR, "positive"), ("diarrhea", AR, "positive")]
    assert spans[1].confidence == pytest.approx(0.4)
    assert lexicon_spans(text, offsets, probs, marks, LABELS, have, found, {AR: 0.5}) == have
    assert lexicon_spans(text, offsets, probs, marks, LABELS, have, found, {}) == have


def test_extractor_takes_the_lexicon_only_where_its_release_says(tokenizer):
    from dataclasses import replace

    from linker.extract.lexicon import Lexicon

    extractor = _stub_extractor(tokenizer, ["rash"], 32, 16)
    text = "A rash and some diarrhea."
    lexicon = Lexicon(["diarrhea"])
    assert [s.text for s in extractor.extract([text], lexicon=lexicon)[0]] == ["rash"]  # no `lexicon` in the config
    extractor.config = replace(extractor.config, lexicon=((AR, 0.0),))
    assert [s.text for s in extractor.extract([text], lexicon=lexicon)[0]] == ["rash", "diarrhea"]
    extractor.config = replace(extractor.config, lexicon=((AR, 0.5),))  # the stub gives "diarrhea" no evidence
    assert [s.text for s in extractor.extract([text], lexicon=lexicon)[0]] == ["rash"]


def test_a_term_of_two_names_is_two_events_in_every_style_but_phrases(tokenizer, monkeypatch):
    # one code per event for drug labels too: TAC's table cells and slashes ("Nausea/vomiting") as decoded by the
    # terms head are split where the dictionary names them; `phrases` keeps PHEE's whole phrase
    import linker.extract.extractor as extractor_module
    from linker.extract.lexicon import Lexicon
    from linker.extract.model import ExtractedSpan

    text = "Nausea/vomiting were reported."
    decoded = [ExtractedSpan(0, 15, text[:15], AE, "positive", 0.9), ExtractedSpan(0, 15, text[:15], AR, "positive", 0.9)]
    monkeypatch.setattr(extractor_module, "decode", lambda *args, **kwargs: list(decoded))
    extractor = _stub_extractor(tokenizer, ["nausea"], 32, 16)
    lexicon = Lexicon(["nausea", "vomiting"])
    for style in ("terms", "auto"):
        spans = extractor.extract([text], style=style, lexicon=lexicon)[0]
        assert [(s.text, s.label, s.group) for s in spans] == [("Nausea", AE, (0, 15)), ("vomiting", AE, (0, 15))]
        assert [s.text for s in extractor.extract([text], style=style)[0]] == ["Nausea/vomiting"]  # no dictionary
    assert [(s.text, s.group) for s in extractor.extract([text], style="phrases", lexicon=lexicon)[0]] == [
        ("Nausea/vomiting", None)]


def test_extract_writes_shared_words_once_each_with_a_dictionary_and_not_in_phrases(tokenizer, monkeypatch):
    import linker.extract.extractor as extractor_module
    from linker.extract.lexicon import Lexicon

    text = "Ciliary and conjunctival hyperemia occurred."
    decoded = _events(text, "Ciliary", "conjunctival hyperemia", label=AR)
    monkeypatch.setattr(extractor_module, "decode", lambda *args, **kwargs: list(decoded))
    extractor = _stub_extractor(tokenizer, ["ciliary"], 32, 16)
    for style in ("terms", "auto"):
        spans = extractor.extract([text], style=style, lexicon=Lexicon(["rash"]))[0]
        assert [(s.text, s.label, s.pieces) for s in spans] == [
            ("Ciliary hyperemia", AE, ((0, 7), (25, 34))), ("conjunctival hyperemia", AE, None)]
        assert [s.pieces for s in extractor.extract([text], style=style)[0]] == [None, None]  # no dictionary
    decoded = _events(text, "Ciliary", "conjunctival hyperemia")
    assert [s.pieces for s in extractor.extract([text], style="phrases", lexicon=Lexicon(["rash"]))[0]] == [None, None]


def test_a_release_lexicon_field_is_checked_and_older_digests_hold(tmp_path):
    from linker.errors import InputFormatError
    from linker.extract.extractor import tagger_config
    from linker.models import DECODING_DIGEST, decoding_digest

    manifest = {"labels": [AR], "max_length": 16, "stride": 8, "frozen_layers": 0, "threshold": {AR: 0.5},
                "files": {"weights.safetensors": {"sha256": "0" * 64}}}
    old = decoding_digest(manifest)
    assert decoding_digest({**manifest, "lexicon": None}) != old  # present, it counts
    manifest[DECODING_DIGEST] = old
    assert tagger_config(tmp_path, manifest).lexicon == ()
    with_lexicon = {**manifest, "lexicon": {AR: 0.2}}
    with_lexicon[DECODING_DIGEST] = decoding_digest(with_lexicon)
    assert tagger_config(tmp_path, with_lexicon).lexicon == ((AR, 0.2),)
    for bad in ({AR: float("nan")}, {AR: 2}, {"Nope": 0.1}, [0.1]):
        broken = {**manifest, "lexicon": bad}  # the fields are checked before the digest (NaN has no JSON digest)
        with pytest.raises(InputFormatError, match="lexicon"):
            tagger_config(tmp_path, broken)


def test_an_indication_or_a_relief_overlapping_an_event_takes_it_when_surer():
    from linker.extract.data import INDICATION
    from linker.extract.extractor import without_treated
    from linker.extract.model import ExtractedSpan

    text = "He was given ibuprofen for nausea and got a rash."
    nausea, rash = text.index("nausea"), text.index("rash")
    event = ExtractedSpan(nausea, nausea + 6, "nausea", AE, "positive", 0.6)
    other = ExtractedSpan(rash, rash + 4, "rash", AE, "positive", 0.9)
    for confidence, kept in ((0.8, [INDICATION, AE]), (0.5, [AE, INDICATION, AE])):
        indication = ExtractedSpan(nausea, nausea + 6, "nausea", INDICATION, "positive", confidence)
        assert [s.label for s in without_treated([event, indication, other])] == kept
    assert without_treated([event, other]) == [event, other]
    relieved = ExtractedSpan(rash - 10, rash + 4, "cleared a rash", "TherapeuticEffect", "positive", 0.95)
    assert [s.text for s in without_treated([event, relieved, other]) if s.label == AE] == ["nausea"]


def test_a_phrase_of_several_dictionary_names_is_one_span_per_name():
    from linker.extract.lexicon import Lexicon, split_phrases
    from linker.extract.model import ExtractedSpan

    text = "She developed severe nausea and hair loss, then an itchy rash."
    lexicon = Lexicon(["nausea", "hair loss", "rash"])
    phrase = ExtractedSpan(14, 41, "severe nausea and hair loss", AE, "positive", 0.8)
    one = ExtractedSpan(51, 61, "itchy rash", AE, "positive", 0.7)
    drug = ExtractedSpan(14, 41, "severe nausea and hair loss", DRUG, "positive", 0.8)
    spans = split_phrases(text, [phrase, one, drug], lexicon.find(text))
    assert [(s.text, s.label, s.group) for s in spans] == [
        ("nausea", AE, (14, 41)), ("hair loss", AE, (14, 41)), ("itchy rash", AE, None), (phrase.text, DRUG, None)]
    assert spans[0].to_dict()["group"] == [14, 41] and "group" not in spans[2].to_dict()
    text = "A severe rash."  # one name among grades and fillers: the name
    trimmed = split_phrases(text, [ExtractedSpan(0, 13, "A severe rash", AE, "positive", 0.8)], lexicon.find(text))
    assert [(s.text, s.group) for s in trimmed] == [("rash", (0, 13))]
    # a term (the TAC head's span, AdverseReaction) holding two names splits too: a drug label's table cells
    text = "発汗 幻覚"
    cells = ExtractedSpan(0, 5, text, AR, "positive", 0.9)
    assert [(s.text, s.label, s.group) for s in split_phrases(text, [cells], Lexicon(["発汗", "幻覚"]).find(text))] == [
        ("発汗", AR, (0, 5)), ("幻覚", AR, (0, 5))]


def test_a_japanese_table_row_loses_its_organ_class_where_a_cell_is_a_dictionary_name():
    from linker.extract.lexicon import Lexicon, split_phrases, table_cells
    from linker.extract.model import ExtractedSpan

    lexicon = Lexicon(["悪心", "頭痛", "発疹"])
    text = "消化器 悪心、胃部不快感\n精神神経系 頭痛\n皮膚 発疹 脱毛注2）\n血液 好酸球増多"
    row = [ExtractedSpan(m, m + len(t), t, AR, "positive", 0.9)
           for t in ("消化器 悪心", "精神神経系 頭痛", "皮膚 発疹 脱毛注2）", "血液 好酸球増多") for m in [text.index(t)]]
    spans = split_phrases(text, row, lexicon.find(text))
    # the organ class before the first name left out; the cells after it kept, a name or not ("脱毛注2）", which
    # the dictionary lacks); a row with no name in any cell as the tagger found it
    assert [(s.text, s.group) for s in spans] == [
        ("悪心", (0, 6)), ("頭痛", (13, 21)), ("発疹", (22, 33)), ("脱毛注2）", (22, 33)), ("血液 好酸球増多", None)]
    assert all(text[s.start:s.end] == s.text for s in spans)
    # a Japanese span of one name glued to other characters is that name (疲労感: 疲労), the span its group
    text = "その他 疲労感、発熱"
    glued = ExtractedSpan(4, 7, "疲労感", AR, "positive", 0.9)
    assert [(s.text, s.group) for s in split_phrases(text, [glued], Lexicon(["疲労"]).find(text))] == [
        ("疲労", (4, 7))]
    # English keeps its spaces: a phrase of one name and other words stays whole
    text = "itchy rash"
    assert table_cells(text, [ExtractedSpan(0, 10, text, AE, "positive", 0.9)], Lexicon(["rash"]).find(text))[0].text \
        == text
    # a Drug span is no event: left as it is
    text = "消化器 悪心"
    assert [s.text for s in table_cells(text, [ExtractedSpan(0, 6, text, DRUG, "positive", 0.9)],
                                        lexicon.find(text))] == [text]


def _events(text, *words, label=AE):
    from linker.extract.model import ExtractedSpan

    return [ExtractedSpan(text.index(w), text.index(w) + len(w), w, label, "positive", 0.9) for w in words]


@pytest.mark.parametrize("text, tagged, expected", [
    # a lone modifier before the coordinator shares the next event's head
    ("Ciliary and conjunctival hyperemia occurred.", ("Ciliary", "conjunctival hyperemia"),
     [("Ciliary hyperemia", ((0, 7), (25, 34))), ("conjunctival hyperemia", None)]),
    ("subarachnoid, and subdural bleeds", ("subarachnoid", "subdural bleeds"),
     [("subarachnoid bleeds", ((0, 12), (27, 33))), ("subdural bleeds", None)]),
    ("New-onset or worsening renal impairment", ("New-onset", "worsening renal impairment"),
     [("New-onset renal impairment", ((0, 9), (23, 39))), ("worsening renal impairment", None)]),
    # a lone word after it shares the event before's first words
    ("suicidal thoughts or behavior", ("suicidal thoughts", "behavior"),
     [("suicidal thoughts", None), ("suicidal behavior", ((0, 8), (21, 29)))]),
    ("swelling of the throat and tongue", ("swelling of the throat", "tongue"),
     [("swelling of the throat", None), ("swelling of the tongue", ((0, 15), (27, 33)))]),
    # a dictionary name, in the singular or the plural, is an event of its own
    ("rash and abdominal pain", ("rash", "abdominal pain"), [("rash", None), ("abdominal pain", None)]),
    ("arthralgias and muscle pain", ("arthralgias", "muscle pain"), [("arthralgias", None), ("muscle pain", None)]),
    ("abdominal pain and vomiting", ("abdominal pain", "vomiting"), [("abdominal pain", None), ("vomiting", None)]),
    # a word of the second that joins it to more words ("increases in") is no head the first can share
    ("LDL, and increases in creatine kinase", ("LDL", "increases in creatine kinase"),
     [("LDL", None), ("increases in creatine kinase", None)]),
    # a list before such a pair: each lone word, a comma between, shares the same words
    ("cardiovascular, respiratory or cutaneous manifestations",
     ("cardiovascular", "respiratory", "cutaneous manifestations"),
     [("cardiovascular manifestations", ((0, 14), (41, 55))), ("respiratory manifestations", ((16, 27), (41, 55))),
      ("cutaneous manifestations", None)]),
    ("fever, rash or cutaneous lesions", ("fever", "rash", "cutaneous lesions"),  # "rash": a name, ends the list
     [("fever", None), ("rash", None), ("cutaneous lesions", None)]),
    # one span "A/B rest": two events sharing the rest, unless A is a dictionary name
    ("SPINAL/EPIDURAL HEMATOMA", ("SPINAL/EPIDURAL HEMATOMA",),
     [("SPINAL HEMATOMA", ((0, 6), (16, 24))), ("EPIDURAL HEMATOMA", None)]),
    ("Redistribution/accumulation of body fat", ("Redistribution/accumulation of body fat",),
     [("Redistribution of body fat", ((0, 14), (28, 39))), ("accumulation of body fat", None)]),
    ("rash/abdominal pain", ("rash/abdominal pain",), [("rash/abdominal pain", None)]),
    ("T3/T4 decreased", ("T3/T4 decreased",), [("T3/T4 decreased", None)]),
    ("nausea/vomiting", ("nausea/vomiting",), [("nausea/vomiting", None)]),
    # a comma alone lists events; so does anything but a coordinator between them
    ("night sweats, lipohypertrophy", ("night sweats", "lipohypertrophy"),
     [("night sweats", None), ("lipohypertrophy", None)]),
    ("ciliary with conjunctival hyperemia", ("ciliary", "conjunctival hyperemia"),
     [("ciliary", None), ("conjunctival hyperemia", None)]),
])
def test_events_that_share_words_across_and_or_are_written_once_each(text, tagged, expected):
    from linker.extract.lexicon import Lexicon, elliptic_events

    lexicon = Lexicon(["rash", "abdominal pain", "arthralgia", "vomiting"])
    spans = elliptic_events(text, _events(text, *tagged), lexicon)
    assert [(s.text, s.pieces) for s in spans] == expected
    for span in spans:
        pieces = span.pieces or ((span.start, span.end),)
        assert (span.start, span.end) == (pieces[0][0], pieces[-1][1])
        assert span.text == " ".join(text[a:b] for a, b in pieces)
        assert span.to_dict().get("pieces") == (None if span.pieces is None else [list(p) for p in span.pieces])


def test_a_footnote_letter_on_a_table_cell_is_cut_off_where_the_word_without_it_is_a_names_word():
    from linker.extract.lexicon import Lexicon, without_footnote_marks

    lexicon = Lexicon(["upper respiratory tract infection", "dizziness", "infusion reaction", "increase"])
    text = "Upper Respiratory Tract Infectione  Dizzinessc  infusion reactions  increased  Tachycardiab"
    spans = _events(text, "Upper Respiratory Tract Infectione", "Dizzinessc", "infusion reactions", "increased",
                    "Tachycardiab")
    # "reactions", "increased": a plural, a past tense; "Tachycardiab": "tachycardia" is no word of the names
    assert [s.text for s in without_footnote_marks(text, spans, lexicon)] == [
        "Upper Respiratory Tract Infection", "Dizziness", "infusion reactions", "increased", "Tachycardiab"]


@pytest.mark.parametrize("text, event, label", [
    ("Adverse reactions in patients on TRULICITY 1.5 mg were", "TRULICITY", DRUG),
    ("TRULICITY (0.75 mg) and placebo", "TRULICITY", DRUG),
    ("Lantus 10 units daily", "Lantus", DRUG),
    ("hemoglobin 8 g/dL", "hemoglobin", AE),  # a lab value, not a dose
    ("glucose 250 mg per dL", "glucose", AE),
    ("nausea 3 days after the first dose", "nausea", AE),
])
def test_a_name_written_before_a_dose_is_a_drug(text, event, label):
    from linker.extract.extractor import dosed_as_drugs

    assert [(s.text, s.label) for s in dosed_as_drugs(text, _events(text, event))] == [(event, label)]
    # where the drug head found it too, the event span goes and the drug span stays
    both = _events(text, event) + _events(text, event, label=DRUG)
    assert [s.label for s in dosed_as_drugs(text, both)] == ([DRUG] if label == DRUG else [AE, DRUG])


def test_decode_neither_ends_nor_begins_a_span_on_a_word_that_joins_it_to_what_is_around():
    text = "Hepatomegaly with steatosis"
    offsets = [(0, 12), (13, 17), (18, 27)]
    probs = np.zeros((3, len(LABELS), 3))
    probs[:, :, O] = 1.0
    probs[0, 0] = [0.0, 1.0, 0.0]  # "Hepatomegaly with": B I, "steatosis": O
    probs[1, 0] = [0.0, 0.0, 1.0]
    marks = np.tile([1.0, 0.0, 0.0], (3, 1))
    assert [s.text for s in decode(text, offsets, probs, marks, LABELS, 0.5)] == ["Hepatomegaly"]
    probs[2, 0] = [0.0, 0.0, 1.0]  # within a span the word stays
    assert [s.text for s in decode(text, offsets, probs, marks, LABELS, 0.5)] == ["Hepatomegaly with steatosis"]
    text = "of opioid effects"  # nor begins one
    probs[:, 0] = [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]
    assert [s.text for s in decode(text, [(0, 2), (3, 9), (10, 17)], probs, marks, LABELS, 0.5)] == [
        "opioid effects"]
    text = "her ventricular tachycardia"  # nor a possessive
    assert [s.text for s in decode(text, [(0, 3), (4, 15), (16, 27)], probs, marks, LABELS, 0.5)] == [
        "ventricular tachycardia"]



@pytest.mark.parametrize("text, found", [
    ("severe hepatitis 5", "severe hepatitis"),  # a citation's number
    ("(SIADH) 1.", "(SIADH)"),
    ("diabetes mellitus (type 2)", "diabetes mellitus (type 2)"),  # a bracket closes it: it stays
    ("a rise of 1.5", "a rise of 1.5"),  # a number with decimals is not a citation's
])
def test_decode_ends_no_span_on_a_number_standing_alone(text, found):
    offsets = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    probs = np.zeros((len(offsets), len(LABELS), 3))
    probs[:, :, O] = 1.0
    probs[:, 0] = [0.0, 0.0, 1.0]
    probs[0, 0] = [0.0, 1.0, 0.0]
    marks = np.tile([1.0, 0.0, 0.0], (len(offsets), 1))
    assert [s.text for s in decode(text, offsets, probs, marks, LABELS, 0.5)] == [found]

def test_only_events_of_the_label_share_words():
    from linker.extract.lexicon import Lexicon, elliptic_events

    text = "ciliary and conjunctival hyperemia"
    spans = _events(text, "ciliary", label=DRUG) + _events(text, "conjunctival hyperemia")
    assert [s.pieces for s in elliptic_events(text, spans, Lexicon([]))] == [None, None]


def _tiny_training_data(tmp_path):
    phee = tmp_path / "phee"
    phee.mkdir()
    for i in range(6):
        (phee / f"{i}.txt").write_text(f"Rash developed after amoxicillin {i}.", encoding="utf-8")
        (phee / f"{i}.ann").write_text("T1\tEffect 0 4\tRash\nT2\tDrug 21 32\tamoxicillin\n"
                                       "T3\tAdverse_event 5 14\tdeveloped\nE1\tAdverse_event:T3\n", encoding="utf-8")
    tac = tmp_path / "tac"
    tac.mkdir()
    for name in "ABCDE":
        (tac / f"{name}.xml").write_text(TAC_LABEL, encoding="utf-8")
    return phee, tac


def test_a_stopped_training_run_resumes_after_its_last_epoch(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from linker.errors import ConfigError
    from linker.extract import train

    phee, tac = _tiny_training_data(tmp_path)
    config = train.ExtractorTrainConfig(epochs=2, threads=1, batch_size=4)
    straight = train.train_extractor(phee, phee, tac, tmp_path / "straight", config)
    assert not (tmp_path / "straight" / train.STATE).exists()  # removed once the release is written

    choose = train._choose_epoch

    def stop_in_epoch_2(run, data, epoch, loss):
        if epoch == 2:
            raise KeyboardInterrupt
        choose(run, data, epoch, loss)

    out = tmp_path / "resumed"
    monkeypatch.setattr(train, "_choose_epoch", stop_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        train.train_extractor(phee, phee, tac, out, config)
    monkeypatch.setattr(train, "_choose_epoch", choose)
    assert (out / train.STATE / "state.json").is_file() and not (out / "manifest.json").exists()
    with pytest.raises(ConfigError, match="lr"):  # another run's state is not taken
        train.train_extractor(phee, phee, tac, out, train.ExtractorTrainConfig(epochs=2, threads=1, batch_size=4, lr=1e-3))
    messages = []
    resumed = train.train_extractor(phee, phee, tac, out, config, report=messages.append)
    assert any("resumed" in m and "after epoch 1" in m for m in messages)
    assert [h["epoch"] for h in json.loads((out / "manifest.json").read_text())["history"]] == [1, 2]
    assert not (out / train.STATE).exists() and resumed["chosen_epoch"] == straight["chosen_epoch"]
    a, b = load_file(str(tmp_path / "straight" / "weights.safetensors")), load_file(str(out / "weights.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k].float(), b[k].float(), atol=1e-2) for k in a)


def test_a_damaged_training_state_starts_over(tmp_path, caplog):
    from linker.extract import train

    phee, tac = _tiny_training_data(tmp_path)
    out = tmp_path / "out"
    (out / train.STATE).mkdir(parents=True)
    (out / train.STATE / "state.json").write_text('{"sha256": "0"}', encoding="utf-8")
    (out / train.STATE / "state.safetensors").write_bytes(b"not tensors")
    caplog.set_level("WARNING", logger="linker")
    result = train.train_extractor(phee, phee, tac, out, train.ExtractorTrainConfig(epochs=1, threads=1))
    assert "damaged" in caplog.text and result["chosen_epoch"] == 1 and not (out / train.STATE).exists()


def test_drug_and_indication_heads_get_their_own_decoding_on_dev():
    """A confident phrase head wants a high threshold; the Indication head, less sure of itself, must not inherit it
    (it once lost half its recall so)."""
    from linker.extract.data import INDICATION, Doc
    from linker.extract.model import B, O
    from linker.extract.train import evaluate_dev

    text = "Aspirin for fever caused rash and itch today"
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    in_span = {AE: {4: 0.99, 6: 0.75}, DRUG: {0: 0.99}, INDICATION: {2: 0.65}, AR: {4: 0.99}}  # 'itch': a wrong AE
    probs = np.zeros((len(words), len(LABELS), 3), np.float32)
    probs[:, :, O] = 1.0
    for label, tokens in in_span.items():
        for token, p in tokens.items():
            probs[token, LABELS.index(label)] = (1 - p, p, 0.0)
    assert probs[:, :, B].max() == np.float32(0.99)
    marks = np.tile(np.array([1.0, 0.0, 0.0], np.float32), (len(words), 1))
    fake = SimpleNamespace(config=SimpleNamespace(labels=LABELS),
                           probabilities_many=lambda texts: [(words, probs, marks) for _ in texts])
    rash, fever, aspirin = words[4], words[2], words[0]
    phee = [Doc("s1", text, spans=[(*rash, AE, "positive"), (*fever, INDICATION, "positive"),
                                   (*aspirin, DRUG, "positive")], groups=[((rash,), AE, "positive")], source="phee")]
    tac = [Doc("t1", text, spans=[(*rash, AR, "positive")], groups=[((rash,), AR, "positive")], source="tac")]
    scores = evaluate_dev(fake, phee, tac)
    assert scores["thresholds"][AE] > 0.75 and scores["phee_dev"]["EM_F1"] == 100.0
    assert scores["thresholds"][INDICATION] <= 0.6 and scores["heads_dev"][INDICATION]["f1"] == 100.0
    assert scores["heads_dev"][DRUG]["f1"] == 100.0


def test_train_extractor_on_a_gpu_that_is_not_there_is_one_line(tmp_path, capsys):
    from conftest import assert_one_line_error, cli

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    phee, tac = _tiny_training_data(tmp_path)
    code, err = cli(["train", "extractor", "--phee-train", phee, "--phee-dev", phee, "--tac", tac,
                     "--out", tmp_path / "release", "--device", "cuda"], capsys)
    assert_one_line_error(code, err, "no CUDA GPU is visible")
    assert not (tmp_path / "release").exists()


def test_a_discontinuous_event_is_written_as_its_pieces_in_ade_xml_brat_and_jsonl(tmp_path):
    from linker.extract.io import InputDoc, write_output
    from linker.extract.lexicon import Lexicon, elliptic_events
    from linker.formats.ade_xml import read_ade_xml
    from linker.formats.brat import brat_sources, read_source

    text = "Ciliary and conjunctival hyperemia occurred."
    spans = elliptic_events(text, _events(text, "Ciliary", "conjunctival hyperemia"), Lexicon([]))
    doc = InputDoc("label", "txt", [("", text)], spans=[spans])
    write_output([doc], tmp_path / "xml", "ade-xml")
    label = read_ade_xml(tmp_path / "xml" / "label.xml")  # the project's reader checks str= against the pieces
    mentions = label.root.find("Mentions").findall("Mention")
    assert [(m.get("start"), m.get("len"), m.get("str")) for m in mentions] == [
        ("0,25", "7,9", "Ciliary hyperemia"), ("12", "22", "conjunctival hyperemia")]
    write_output([doc], tmp_path / "brat", "brat")
    (source,) = list(brat_sources(tmp_path / "brat"))
    assert [(e.type, e.spans, e.text) for e in read_source(source).entities] == [
        ("AdverseEvent", ((0, 7), (25, 34)), "Ciliary hyperemia"), ("AdverseEvent", ((12, 34),), "conjunctival hyperemia")]
    write_output([doc], tmp_path / "spans.jsonl", "jsonl")
    first = json.loads((tmp_path / "spans.jsonl").read_text().splitlines()[0])
    assert first["pieces"] == [[0, 7], [25, 34]] and first["text"] == "Ciliary hyperemia"


def test_shipped_tagger_runs_in_numpy_as_in_torch(monkeypatch):
    """A shipped tagger loads in `linker.runtime`'s numpy (no torch import for `annotate`'s first answer): the same
    probabilities as its torch twin within float rounding, the same spans; a call of many windows goes to the twin."""
    import linker.extract.extractor as extractor_module
    from linker.extract.extractor import _load_tagger, release_path
    from linker.models import read_release

    folder = release_path("linker-ae")
    release = read_release(folder)
    fast, slow = (_load_tagger(folder, release, 1, runtime=r) for r in ("auto", "torch"))
    assert (fast.runtime, slow.runtime) == ("numpy", "torch")
    texts = ["A 45-year-old woman developed severe nausea and hair loss after starting cisplatin.",
             "No fever. She had headaches before starting the drug; the rash cleared after stopping.", ""]
    for (o1, p1, m1), (o2, p2, m2) in zip(fast._probabilities(texts), slow._probabilities(texts), strict=True):
        assert np.array_equal(o1, o2) and np.allclose(p1, p2, atol=1e-4) and np.allclose(m1, m2, atol=1e-4)
    spans = [[(s.start, s.end, s.label, s.status) for s in doc] for doc in fast.extract(texts)]
    assert spans == [[(s.start, s.end, s.label, s.status) for s in doc] for doc in slow.extract(texts)]
    assert any(label == AE for _, _, label, _ in spans[0])
    monkeypatch.setattr(extractor_module, "TORCH_MIN_PIECES", 1)
    assert [[(s.start, s.end, s.label, s.status) for s in doc] for doc in fast.extract(texts)] == spans
    assert fast.torch_twin().runtime == "torch"


def test_a_recorded_throughput_enters_the_card_and_keeps_the_release(tmp_path):
    import shutil

    from linker.extract import load_extractor
    from linker.extract.train import record_throughput
    from linker.models import read_release, release_folder

    folder = tmp_path / "linker-ae"
    shutil.copytree(release_folder("linker-ae"), folder)
    before = read_release(folder)
    measured = {"other": "linker-ae==1 sha256:abc", "sentences": 400, "labels": 20, "runs": 3,
                "load_average_before": [1.0, 1.0, 1.0], "this_per_s": 48.0, "other_per_s": 47.0, "ratio": 1.021,
                "this_labels_per_s": 0.33, "other_labels_per_s": 0.34, "labels_ratio": 0.971,
                "command": "python -m bench.extract --compare-to old", "measured_on": "2026-12-01"}
    record_throughput(folder, measured)
    after = read_release(folder)
    assert after.revision == before.revision  # the same tensors: indexes and reports that name it still hold
    assert after.manifest["throughput"] == measured
    assert {k: v for k, v in after.manifest.items() if k not in ("throughput", "files", "decoding_sha256")} == {
        k: v for k, v in before.manifest.items() if k not in ("throughput", "files", "decoding_sha256")}
    card = (folder / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "## Throughput" in card and "**1.021x**" in card and "**0.971x**" in card
    assert load_extractor(folder, threads=1).revision == before.revision  # its decoding digest still checks


def test_bench_tags_sentences_joined_as_one_text_and_gives_each_its_own_spans():
    # bench.extract's "4 sentences as one text" row: each sentence gets back the spans inside it, at its own offsets;
    # a span across two sentences belongs to neither
    from bench.extract import tag_joined
    from linker.extract.model import ExtractedSpan

    class Words:  # a stand-in tagger: every word of 4+ letters is a span, and one span runs across "a. Bb"
        def extract(self, texts, **options):
            assert options == {"style": "phrases"}
            out = []
            for text in texts:
                spans = [ExtractedSpan(m.start(), m.end(), m.group(), "AdverseEvent", "positive", 1.0)
                         for m in re.finditer(r"\w{4,}", text)]
                out.append(spans + [ExtractedSpan(m.start(), m.end(), m.group(), "AdverseEvent", "positive", 1.0)
                                    for m in re.finditer(r"a\. Bb", text)])
            return out

    texts = ["Nausea a.", "Bb rash.", "Severe headache.", "Fever."]
    alone = tag_joined(Words(), texts, 1, style="phrases")
    joined = tag_joined(Words(), texts, 3, style="phrases")
    assert [[t[s.start:s.end] for s in spans] for t, spans in zip(texts, joined)] == [
        ["Nausea"], ["rash"], ["Severe", "headache"], ["Fever"]]
    assert [[(s.start, s.end) for s in spans] for spans in joined] == [[(s.start, s.end) for s in spans]
                                                                       for spans in alone]


def test_bench_records_only_a_timing_of_the_same_release_that_says_how_it_was_measured(tmp_path):
    import json
    import shutil

    from bench.extract import record
    from linker.models import read_release, release_folder

    folder = tmp_path / "linker-ae"
    shutil.copytree(release_folder("linker-ae"), folder)
    revision = read_release(folder).revision
    timing = {"other": "linker-ae==1 sha256:abc", "sentences": 400, "labels": 20, "runs": 3,
              "load_average_before": [1.0, 1.0, 1.0], "this_per_s": 48.0, "other_per_s": 47.0, "ratio": 1.021,
              "this_labels_per_s": 0.33, "other_labels_per_s": 0.34, "labels_ratio": 0.971}
    report = tmp_path / "report.json"

    def write(model, measured):
        report.write_text(json.dumps({"model": model, "command": "python -m bench.extract", "date": "2026-12-01T00:00",
                                      "speed_against": measured}), encoding="utf-8")

    write("linker-ae==2 sha256:another", timing)
    with pytest.raises(SystemExit, match="holds no --compare-to timing"):
        record(folder, report)
    write(revision, {**timing, "earlier_run": True})  # carried over by a later run: whose command timed it is lost
    with pytest.raises(SystemExit, match="carried from an earlier run"):
        record(folder, report)
    write(revision, {**timing, "earlier_run": True, "command": "python -m bench.extract --compare-to old",
                     "measured_on": "2026-11-30"})
    record(folder, report)
    kept = read_release(folder).manifest["throughput"]
    assert kept["command"] == "python -m bench.extract --compare-to old" and kept["measured_on"] == "2026-11-30"
    assert "earlier_run" not in kept and read_release(folder).revision == revision
