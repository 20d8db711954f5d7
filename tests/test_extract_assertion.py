"""The rule-based assertion step (negated / hypothetical events) and the extractor's capability suite.

The rules and the suite's generation and scoring need no model; one test runs the shipped linker-ae over a tiny
template file, and one runs `linker extract --assertion` (a few seconds to load the tagger once).
"""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error, cli

from linker.errors import InputFormatError, UnknownNameError
from linker.extract.assertion import assert_spans, cues_for, languages, load_cues, read_cues, status_of
from linker.extract.capabilities import Case, fill, generate_cases, load_suite, score
from linker.extract.model import ExtractedSpan


def status(sentence: str, term: str) -> str | None:
    start = sentence.index(term)
    return status_of(sentence, start, start + len(term))


@pytest.mark.parametrize("sentence, term, expected", [
    ("No rash since starting lamotrigine.", "rash", "negated"),
    ("No rash since starting lamotrigine.", "No rash", "negated"),  # a phrase span opening with its cue
    ("I have had no headache since I started ibuprofen.", "had no headache", "negated"),
    ("The patient denied nausea after cisplatin.", "nausea", "negated"),
    ("Hepatotoxicity was ruled out.", "Hepatotoxicity", "negated"),
    ("Severe rash after lamotrigine; no fever.", "Severe rash", None),  # the cue is in the next clause
    ("No fever, but she developed a rash.", "rash", None),  # "but" ends the cue's scope
    ("No change in the rash was seen.", "rash", None),  # a pseudo cue
    ("Hypothyroidism without thyroid disease.", "Hypothyroidism without thyroid disease", None),  # cue deep inside
    ("No one in the ward had any sign of the severe recurrent rash at all.", "rash", None),  # beyond the window
    ("If you develop a rash while taking it, call your doctor.", "rash", "hypothetical"),
    ("She developed a rash after lamotrigine.", "rash", None),
])
def test_cues_in_scope(sentence, term, expected):
    assert status(sentence, term) == expected


def test_the_nearest_cue_wins_and_cue_files_are_checked(tmp_path):
    assert status("If there is no rash, go on.", "rash") == "negated"
    cues = load_cues()
    assert cues.version == "2" and len(cues.sha256) == 16
    extra = tmp_path / "cues.tsv"
    extra.write_text("negated\tbefore\tnary a\n", encoding="utf-8")
    assert status_of("Nary a rash.", 7, 11, load_cues([extra])) == "negated"
    assert status_of("Nary a rash.", 7, 11) is None
    with pytest.raises(InputFormatError, match=r"cues.tsv:2: expected negated\|hypothetical"):
        read_cues(tmp_path / "cues.tsv", [(1, "# header"), (2, "negated\tany\tno")])
    with pytest.raises(InputFormatError, match="x.tsv:1: .*found 2 tab-separated"):
        read_cues("x.tsv", [(1, "negated\tbefore")])


@pytest.mark.parametrize("lang, sentence, term, expected", [
    ("es", "El paciente no presenta fiebre ni erupción.", "fiebre", "negated"),
    ("es", "El paciente no presenta fiebre ni erupción.", "erupción", "negated"),  # "ni": nor
    ("es", "No tengo fiebre, pero sí dolor de cabeza.", "dolor de cabeza", None),  # "pero" ends the scope
    ("es", "Sin embargo, tengo fiebre desde ayer.", "fiebre", None),  # the "sin" of "sin embargo" is no cue
    ("es", "Si aparece fiebre, suspenda el tratamiento.", "fiebre", "hypothetical"),
    ("fr", "Depuis le début du traitement par méthotrexate, j'ai des nausées", "nausées", None),
    ("fr", "Il ne présente pas de fièvre.", "fièvre", "negated"),
    ("fr", "Pas d'éruption cutanée.", "éruption cutanée", "negated"),  # an elided cue, no space before its noun
    ("fr", "Absence d’ictère.", "ictère", "negated"),
    ("fr", "J'ai pas mal de nausées.", "nausées", None),  # "pas mal de": quite a lot of
    ("fr", "Pas de fièvre mais des nausées.", "nausées", None),
    ("fr", "Si vous avez des nausées, prévenez votre médecin.", "nausées", "hypothetical"),
    ("de", "Keine Kopfschmerzen.", "Kopfschmerzen", "negated"),
    ("de", "Seit ich Ibuprofen nehme, habe ich Magenschmerzen, aber keine Kopfschmerzen mehr.", "Magenschmerzen", None),
    ("de", "Seit ich Ibuprofen nehme, habe ich Magenschmerzen, aber keine Kopfschmerzen mehr.", "Kopfschmerzen",
     "negated"),
    ("de", "Eine Hepatitis wurde ausgeschlossen.", "Hepatitis", "negated"),
    ("de", "Kein Wunder, dass ich Kopfschmerzen habe.", "Kopfschmerzen", None),
    ("de", "Falls Fieber auftritt, sofort den Arzt aufsuchen.", "Fieber", "hypothetical"),
    ("nl", "Geen koorts, wel hoofdpijn.", "koorts", "negated"),
    ("nl", "Geen koorts, wel hoofdpijn.", "hoofdpijn", None),  # "wel" affirms
    ("nl", "De patiënt ontkent misselijkheid.", "misselijkheid", "negated"),
    ("nl", "Ik heb zowel hoofdpijn als misselijkheid.", "misselijkheid", None),  # "als" here is "and"
    ("nl", "Indien u huiduitslag krijgt, stop dan.", "huiduitslag", "hypothetical"),
    ("ja", "発熱なし", "発熱", "negated"),
    ("ja", "吐き気がします", "吐き気", None),
    ("ja", "肝機能障害を認めなかった。", "肝機能障害", "negated"),
    ("ja", "頭痛はあるが、発熱はない。", "頭痛", None),  # "が、" (but) ends the scope of はない
    ("ja", "頭痛はあるが、発熱はない。", "発熱", "negated"),
    ("ja", "発熱なし。頭痛がある。", "頭痛", None),  # 。 ends the sentence
    ("ja", "頭痛がして仕方がない", "頭痛", None),  # 仕方がない (can't be helped) is no negation
    ("ja", "発疹があらわれた場合には投与を中止すること。", "発疹", "hypothetical"),
])
def test_cues_of_other_languages(lang, sentence, term, expected):
    start = sentence.index(term)
    assert status_of(sentence, start, start + len(term), cues_for(lang)) == expected


def test_a_language_without_cues_keeps_its_statuses_and_none_is_english():
    def spans(text, term):
        start = text.index(term)
        return [ExtractedSpan(start, start + len(term), term, "AdverseEvent", "positive", 0.9)]

    english = spans("No rash.", "rash")
    assert [s.status for s in assert_spans("No rash.", english, ("AdverseEvent",))] == ["negated"]
    assert [s.status for s in assert_spans("No rash.", english, ("AdverseEvent",), lang="en-GB")] == ["negated"]
    assert assert_spans("No rash.", english, ("AdverseEvent",), lang="it") == english  # no rules, no English ones
    spanish = spans("Sin fiebre.", "fiebre")
    assert assert_spans("Sin fiebre.", spanish, ("AdverseEvent",)) == spanish  # "sin" is no English cue
    assert [s.status for s in assert_spans("Sin fiebre.", spanish, ("AdverseEvent",), lang="es")] == ["negated"]
    assert [s.status for s in assert_spans("発熱なし", spans("発熱なし", "発熱"), ("AdverseEvent",), lang="ja-JP")] == [
        "negated"]
    assert cues_for("it") is None and cues_for(None).lang == "en" and cues_for("JA").spaced is False
    with pytest.raises(UnknownNameError, match="available: de, en, es, fr, ja, nl"):
        load_cues(lang="it")


def test_the_manifest_versions_every_cue_file(monkeypatch):
    from importlib import resources

    import linker.extract.assertion as assertion

    root = resources.files("linker") / "data" / "assertion"
    manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    on_disk = {p.name for p in root.iterdir() if p.name.startswith("cues") and p.name.endswith(".tsv")}
    assert set(manifest["files"]) == on_disk and languages() == ("de", "en", "es", "fr", "ja", "nl")
    assert {load_cues(lang=lang).version for lang in languages()} == {manifest["version"]}
    # a cue file edited without its manifest is refused, naming the file
    broken = json.loads(json.dumps(manifest))
    broken["files"]["cues.nl.tsv"]["sha256"] = "0" * 64
    monkeypatch.setattr(assertion, "_manifest", lambda: broken)
    assertion._load.cache_clear()
    try:
        with pytest.raises(InputFormatError, match=r"cues.nl.tsv: expected the sha256 its manifest.json gives"):
            load_cues(lang="nl")
    finally:
        assertion._load.cache_clear()


def test_the_extractor_reads_each_text_with_its_languages_cues():
    pytest.importorskip("torch")
    from test_extract import _stub_extractor  # a tagger that tags "rash" and nothing else

    from linker.encoders import load_encoder
    from linker.errors import ConfigError

    extractor = _stub_extractor(load_encoder("minilm").model.tokenizer, ["rash"], 32, 16)
    texts = ["No rash.", "No rash.", "Sin rash.", "Sin rash."]
    found = extractor.extract(texts, langs=[None, "it", None, "es"])
    assert [[s.status for s in spans] for spans in found] == [["negated"], ["positive"], ["positive"], ["negated"]]
    assert [s.status for s in extractor.extract(["No rash."])[0]] == ["negated"]
    with pytest.raises(ConfigError, match=r"langs: expected one language per text \(1\), found 2"):
        extractor.extract(["No rash."], langs=["en", "es"])


def test_fill_gives_the_symptoms_offsets_and_capitalises():
    text, span = fill("{symptom} after {drug}.", {"drug": "ibuprofen", "symptom": "hair loss"})
    assert text == "Hair loss after ibuprofen." and text[span[0]:span[1]] == "Hair loss"
    assert fill("{drug} is awful.", {"drug": "metformin"}) == ("Metformin is awful.", None)


def _suite(tmp_path, templates: str):
    (tmp_path / "t.tsv").write_text(templates, encoding="utf-8")
    (tmp_path / "f.tsv").write_text("drug\tibuprofen\ndrug\tmetformin\nsymptom\trash\nsymptom\tnausea\n",
                                    encoding="utf-8")
    return load_suite([tmp_path / "t.tsv"], [tmp_path / "f.tsv"], package=False)


def test_cases_are_seeded_per_template(tmp_path):
    data = _suite(tmp_path, "negation\tno_event\tNo {symptom} since starting {drug}.\n"
                            "baseline\tevent\t{drug} gave me {symptom}.\n")
    cases = generate_cases(data, per_template=3, seed=1)
    assert len(cases) == 6 and cases == generate_cases(data, per_template=3, seed=1)
    assert {c.capability for c in cases[:3]} == {"negation"}
    # a template's cases do not change when another template is added
    more = _suite(tmp_path, "baseline\tevent\tI took {drug}, then {symptom}.\n"
                            "negation\tno_event\tNo {symptom} since starting {drug}.\n")
    assert [c.text for c in generate_cases(more, per_template=3, seed=1)[3:]] == [c.text for c in cases[:3]]


def test_failure_is_a_positive_event_over_the_symptom_or_a_missed_one():
    def span(start, end, status="positive", label="AdverseEvent"):
        return ExtractedSpan(start, end, "", label, status, 0.9)

    cases = [Case("negation", "no_event", "t:1", "No rash.", (3, 7)),
             Case("negation", "no_event", "t:1", "No rash.", (3, 7)),
             Case("negation", "no_event", "t:1", "No rash.", (3, 7)),
             Case("baseline", "event", "t:2", "Rash.", (0, 4)),
             Case("baseline", "event", "t:2", "Rash.", (0, 4)),
             Case("sentiment", "no_event", "t:3", "Awful pills.", None)]
    predicted = [[span(0, 7)], [span(0, 7, "negated")], [span(3, 7, label="TherapeuticEffect")],
                 [span(0, 4, "hypothetical")], [span(0, 4)], [span(0, 5)]]
    report = score(cases, predicted, label="x")
    rows = {r.capability: r for r in report.rows}
    assert (rows["negation"].n, rows["negation"].failures) == (3, 1)
    assert (rows["baseline"].n, rows["baseline"].failures) == (2, 1)  # a hypothetical event is no event found
    assert rows["sentiment"].failures == 1  # no symptom: any positive event fails
    assert rows["negation"].low < 1 / 3 < rows["negation"].high
    assert report.config["found"]["negation"] == 2 / 3 and report.config["found"]["sentiment"] is None


def test_coordination_needs_a_span_of_its_own_for_each_symptom(tmp_path):
    data = _suite(tmp_path, "coordination\tevent\t{drug} gave me {symptom} and {symptom2}.\n")
    cases = generate_cases(data, per_template=10, seed=1)
    assert len(cases) == 4  # 2 drugs x 2 ordered pairs of different symptoms
    case = cases[0]
    first, second = case.text[slice(*case.symptom)], case.text[slice(*case.other)]
    assert {first, second} == {"rash", "nausea"} and case.text.endswith(f"{first} and {second}.")

    def span(start, end, status="positive"):
        return ExtractedSpan(start, end, "", "AdverseEvent", status, 0.9)

    both = span(case.symptom[0], case.other[1])
    each = [span(*case.symptom), span(*case.other)]
    report = score([case] * 4, [[both], each, each[:1], [each[0], span(*case.other, "negated")]], label="x")
    assert report.row("coordination").failures == 3  # one span for both, a missed one and a negated one fail


@pytest.mark.parametrize("row, message", [
    ("negation\tmaybe\tNo {symptom} with {drug}.", "expect event|no_event"),
    ("negation\tno_event\tNo {symptom}.", "template with {drug}"),
    ("baseline\tevent\t{drug} is fine.", "an `event` template holding {symptom}"),
    ("negation\tno_event", "found 2 tab-separated"),
])
def test_bad_template_rows_are_one_line(tmp_path, row, message):
    with pytest.raises(InputFormatError, match=r"t.tsv:1: ") as error:
        _suite(tmp_path, row + "\n")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_package_suite_is_valid():
    data = load_suite()
    assert data.version == "2" and {"negation", "temporal", "beneficial", "sentiment", "coordination"} <= {
        t.capability for t in data.templates}
    assert len(data.fillers["drug"]) >= 10 and len(data.fillers["symptom"]) >= 10


@pytest.fixture(scope="module")
def extractor():
    pytest.importorskip("torch")
    from linker.extract import load_extractor

    return load_extractor("linker-ae")


def test_tiny_suite_on_the_shipped_tagger(tmp_path, extractor):
    """The rules turn the negated symptom's positive event into a negated one; the baseline event is found."""
    from linker.extract.capabilities import run_suite

    data = _suite(tmp_path, "negation\tno_event\tNo {symptom} since starting {drug}.\n"
                            "baseline\tevent\tI developed {symptom} after starting {drug}.\n")
    model, rules = run_suite(extractor, data, per_template=4, seed=3)
    assert [r.capability for r in rules.rows] == ["negation", "baseline"] and rules.row("negation").n == 4
    assert rules.row("negation").failures == 0 and rules.row("baseline").failures == 0
    # the status head alone calls some "No rash" positive (linker-ae 2: 1 of these 4); the rules fix them all
    assert model.row("negation").n == 4 and rules.row("negation").failures <= model.row("negation").failures
    assert model.config["assertion"] == "model" and rules.config["assertion"] == "rules"


def test_extract_cli_assertion_option(tmp_path, capsys, extractor):
    (tmp_path / "in.txt").write_text("No rash since starting lamotrigine.", encoding="utf-8")
    statuses = {}
    for mode in ("model", "rules"):
        code, _ = cli(["-q", "extract", "--input", tmp_path / "in.txt", "--output", tmp_path / f"{mode}.jsonl",
                       "--assertion", mode], capsys)
        assert code == 0
        rows = [json.loads(line) for line in (tmp_path / f"{mode}.jsonl").read_text().splitlines()]
        statuses[mode] = [r["status"] for r in rows if r["label"] == "AdverseEvent"]
    assert statuses == {"model": ["positive"], "rules": ["negated"]}
    code, err = cli(["extract", "--input", tmp_path / "in.txt", "--output", tmp_path / "x.jsonl",
                     "--assertion", "maybe"], capsys)
    assert_one_line_error(code, err, "--assertion: expected rules, model, found 'maybe'")


def test_a_negated_dictionary_name_is_returned_where_the_tagger_found_nothing():
    from linker.extract.assertion import negated_names
    from linker.extract.lexicon import Lexicon

    text = "Rash after the first dose. No fever. If you develop jaundice, stop. Nausea was seen."
    found = Lexicon(["rash", "fever", "jaundice", "nausea"]).find(text)
    rash = ExtractedSpan(0, 4, "Rash", "AdverseEvent", "positive", 0.9)
    spans = negated_names(text, [rash], found, lambda start, end: 0.25)
    assert [(s.text, s.status, s.confidence) for s in spans] == [
        ("Rash", "positive", 0.9), ("fever", "negated", 0.25), ("jaundice", "hypothetical", 0.25)]
    assert negated_names(text, [rash], [], lambda start, end: 0.0) == [rash]
