"""The scoring helpers and readers of bench/extract_languages.py on tiny hand-made fixtures (no model, no data)."""

from __future__ import annotations

import json
import math

from bench.extract_languages import (
    GoldDoc,
    codiesp_docs,
    html_text,
    label_set_scores,
    mantra_docs,
    note_groups,
    onsides_labels,
    pt_ids,
    span_scores,
)

TEXT = "Severe headache and liver failure after aspirin."
ANN = """T1\tC0018681 7 15\theadache
#1\tAnnotatorNotes T1\t"C0018681", "Headache", "Sign or Symptom" ,"DISO"
T2\tC0004057 40 47\taspirin
#2\tAnnotatorNotes T2\t"C0004057", "Aspirin", "Pharmacologic Substance" ,"CHEM"
T3\tC0085605 20 25;26 33\tliver failure
#3\tAnnotatorNotes T3\t"C0085605", "Liver Failure", "DISO" ,"Disease or Syndrome"
"""


def test_span_scores_exact_and_relaxed():
    doc = GoldDoc("d", "en", TEXT, [((7, 15),), ((20, 25), (26, 33))])
    scores = span_scores([doc], [[(7, 15), (20, 33), (40, 47)]])
    # exact: only "headache" (the discontinuous mention is missed); relaxed: two of three predictions overlap
    assert (scores["exact"]["precision"], scores["exact"]["recall"]) == (33.33, 50.0)
    relaxed = scores["relaxed"]
    assert (relaxed["precision"], relaxed["recall"], relaxed["f1"]) == (66.67, 100.0, 80.0)


def test_label_set_scores_micro():
    gold = {"a": {"1", "2"}, "b": {"3"}}
    scores = label_set_scores(gold, {"a": {"1", "9"}, "c": {"3"}})  # "c" is no gold label: never counted
    assert (scores["precision"], scores["recall"], scores["gold"], scores["predicted"]) == (50.0, 33.33, 3, 2)


def test_note_groups_either_field():
    assert note_groups('"C1", "Name", "Sign or Symptom" ,"DISO"') == {"Sign or Symptom", "DISO"}
    assert "DISO" in note_groups('"C1", "Violence", "DISO" ,"Mental or Behavioral Dysfunction"')
    assert note_groups('"C1", "PSA", "Protein|Enzyme" ,"CHEM|PHEN"') >= {"CHEM", "PHEN"}


def test_mantra_diso_filter(tmp_path):
    folder = tmp_path / "Mantra-GSC" / "English" / "EMEA_ec22-cui-best_man"
    folder.mkdir(parents=True)
    (folder / "0001_x.txt").write_text(TEXT, encoding="utf-8")
    (folder / "0001_x.ann").write_text(ANN, encoding="utf-8")
    (docs,) = mantra_docs(tmp_path)
    assert docs.lang == "en" and docs.text == TEXT
    assert docs.mentions == [((7, 15),), ((20, 25), (26, 33))]


def test_onsides_reader(tmp_path):
    items = [{"label_id": 7, "section_name": "S1",
              "section_text": "<table><tr><td>消化器</td><td>悪心、嘔吐</td></tr></table>",
              "adverse_events": [["悪心", "悪心", "10028813.0", "悪心", 10028813.0, 0, 10],
                                 ["嘔吐", "Vomiting", "10047700", math.nan, math.nan, 0, 10],
                                 ["心悸亢進", "Palpitations, Tachycardia", "10033557, 10043071", math.nan, math.nan,
                                  0, 1],
                                 ["にがみ", math.nan, math.nan, math.nan, math.nan, 0, 10]]}]
    path = tmp_path / "jp.json"
    path.write_text(json.dumps(items, ensure_ascii=False), encoding="utf-8")  # writes NaN as the file does
    texts, gold, names, terms = onsides_labels(path)
    assert texts == {"7#S1": "消化器 悪心、嘔吐"}
    assert gold == {"7#S1": {"10028813", "10047700", "10033557", "10043071"}}
    assert names == {"悪心": {"10028813"}, "Vomiting": {"10047700"}, "Palpitations": {"10033557"},
                     "Tachycardia": {"10043071"}}
    assert terms == {"7#S1": ["悪心", "嘔吐", "心悸亢進", "にがみ"]}
    assert pt_ids(math.nan) == [] and pt_ids("10020751.0") == ["10020751"]


def test_html_text_rows():
    assert html_text("<div><p>a&amp;b</p><br/>c<sup>注1）</sup></div>") == "a&b\nc注1）"


def test_codiesp_diagnoses_only(tmp_path):
    (tmp_path / "texts").mkdir()
    text = "Fractura costal derecha. Se realiza ecografía renal."
    (tmp_path / "texts" / "S1.txt").write_text(text, encoding="utf-8")
    tsv = tmp_path / "testX.tsv"
    tsv.write_text("S1\tDIAGNOSTICO\ts22.49xa\tfractura costal\t0 15\n"
                   "S1\tPROCEDIMIENTO\tbv49zzz\tecografía renal\t36 45;46 51\n", encoding="utf-8")
    (doc,) = codiesp_docs(tsv, tmp_path / "texts")
    assert (doc.id, doc.lang, doc.mentions) == ("S1", "es", [((0, 15),)])


def test_a_run_keeps_the_test_rows_of_the_last_whole_run():
    from bench.extract_languages import keeps_test_rows

    scored = {"mantra": {"en": {}}, "limit": None}
    assert keeps_test_rows(scored, rescore=False, limit=None)
    assert not keeps_test_rows(scored, rescore=True, limit=None)  # asked to score again
    assert not keeps_test_rows(scored, rescore=False, limit=5)  # a slice scores its own slice
    assert not keeps_test_rows({"mantra": {"en": {}}, "limit": 5}, rescore=False, limit=None)  # a slice is no score
    assert not keeps_test_rows({}, rescore=False, limit=None)


def test_span_rows_score_each_tagger_alone_and_with_the_names_a_discontinuous_span_as_its_pieces():
    from bench.extract_languages import span_rows
    from linker.extract.model import ExtractedSpan

    class Tagger:  # stands for an Extractor: the names, when given, turn "liver ... failure" into its pieces
        def __init__(self):
            self.calls = []

        def extract(self, texts, *, labels, style, lexicon=None, langs=None):
            self.calls.append((lexicon, langs))
            if lexicon is None:
                return [[ExtractedSpan(7, 15, "headache", "AdverseEvent", "positive", 0.9)] for _ in texts]
            return [[ExtractedSpan(7, 15, "headache", "AdverseEvent", "positive", 0.9),
                     ExtractedSpan(20, 33, "liver failure", "AdverseEvent", "positive", 0.9,
                                   pieces=((20, 25), (26, 33)))] for _ in texts]

    class Names:
        def find(self, text):
            return [(7, 15)]

        def __len__(self):
            return 1

    doc = GoldDoc("d", "en", TEXT, [((7, 15),), ((20, 25), (26, 33))])
    tagger = Tagger()
    rows = span_rows([doc], {"multi": tagger}, {"en": Names()})["en"]
    assert rows["multi"]["exact"]["recall"] == 50.0 and rows["multi + names"]["exact"]["recall"] == 100.0
    assert rows["lookup"]["exact"]["recall"] == 50.0
    assert [langs for _, langs in tagger.calls] == [["en"], ["en"]]
    # a language without names has no `+ names` row
    assert "multi + names" not in span_rows([doc], {"multi": Tagger()}, {})["en"]
