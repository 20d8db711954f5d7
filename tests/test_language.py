"""Each text's language (`linker.language.detect`) and the tagger it picks (`linker.extract.extractor.ByLanguage`)."""

from __future__ import annotations

import pytest

from linker.language import LANGUAGES, detect

SENTENCES = {
    "en": ["Patient started amoxicillin 3 days ago and developed an itchy rash and diarrhea. No fever.",
           "Severe rash after starting lamotrigine."],
    "fr": ["Depuis le début du traitement par méthotrexate, j'ai des nausées et je perds mes cheveux.",
           "Patiente de 54 ans présentant une éruption cutanée après la prise d'amoxicilline."],
    "de": ["Seit ich Ibuprofen nehme, habe ich Magenschmerzen, aber keine Kopfschmerzen mehr.",
           "Der Patient entwickelte nach der Gabe von Metformin eine Laktatazidose."],
    "es": ["El paciente no presenta fiebre ni erupción.",
           "Mujer de 45 años con cefalea tras iniciar tratamiento con paroxetina."],
    "nl": ["Geen koorts, wel hoofdpijn na het starten van de behandeling.",
           "Sinds ik metformine gebruik heb ik last van diarree."],
    "ja": ["ロキソニンを飲んでから胃が痛くて吐き気がします。", "悪心・嘔吐、発疹があらわれた。"],
}


@pytest.mark.parametrize("lang", sorted(SENTENCES))
def test_detect_names_the_language_of_clinical_sentences(lang):
    assert [detect(text) for text in SENTENCES[lang]] == [lang, lang]


def test_detect_falls_back_to_english_without_evidence():
    # single words and names carry no function word: English, the index's and the tagger's first language
    assert {detect(t) for t in ("hair loss", "arthralgien", "Adenopatías inguinales", "", "12 mg", "☺")} == {"en"}
    assert set(LANGUAGES) == set(SENTENCES)


def test_by_language_tags_each_text_with_its_languages_tagger(monkeypatch):
    """English texts go to linker-ae, the others to linker-ae-multi, in one call each, in the texts' order, each
    with its language for the cues; a given language wins over detection."""
    from linker.extract import extractor as module

    calls = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def extract(self, texts, *, langs, **options):
            calls.append((self.name, list(texts), list(langs)))
            return [[f"{self.name}:{text[:5]}"] for text in texts]

    monkeypatch.setattr(module, "load_extractor", lambda name, threads=None: Fake(name))
    by_language = module.ByLanguage.__new__(module.ByLanguage)  # no manifests read: the routing alone
    by_language.threads = None
    texts = [SENTENCES["en"][0], SENTENCES["de"][0], SENTENCES["ja"][0], "hair loss"]
    out = by_language.extract(texts, langs=[None, None, None, "es"], style="auto")
    assert calls == [("linker-ae", [texts[0]], ["en"]),
                     ("linker-ae-multi", texts[1:], ["de", "ja", "es"])]
    assert [spans[0].split(":")[0] for spans in out] == ["linker-ae", "linker-ae-multi", "linker-ae-multi",
                                                         "linker-ae-multi"]


def test_the_shipped_taggers_read_each_language_with_its_own_cues():
    """End to end on the shipped releases: the German text goes to linker-ae-multi and its dictionary name is
    negated by the German cue "keine"; the Japanese spans stop at their characters instead of widening to the whole
    sentence; the English text goes to linker-ae."""
    from linker.extract import Lexicon, annotate_documents

    german, japanese, english = SENTENCES["de"][0], SENTENCES["ja"][0], SENTENCES["en"][0]
    names = Lexicon(["Kopfschmerzen", "Magenschmerzen", "吐き気", "diarrhea"])
    spans = annotate_documents([german, japanese, english], lexicon=names, labels=("AdverseEvent", "Drug"))
    found = [{(s.text, s.label, s.status) for s in doc} for doc in spans]
    assert ("Kopfschmerzen", "AdverseEvent", "negated") in found[0]
    assert ("Magenschmerzen", "AdverseEvent", "negated") not in found[0]
    assert ("ロキソニン", "Drug", "positive") in found[1]
    assert all(len(s.text) < len(japanese) // 2 for s in spans[1])
    assert ("amoxicillin", "Drug", "positive") in found[2]


def test_extract_cli_takes_each_documents_lang(tmp_path):
    """`linker extract`: a JSONL document's own lang picks its tagger and cues, --lang the others': the document
    without a lang is read as the one told German, not as the one told English."""
    import json

    from linker.cli.main import main

    german = SENTENCES["de"][0]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": i, "text": german, **({"lang": lang} if lang else {})}) + "\n"
                            for i, lang in (("en", "en"), ("de", "de"), ("none", None))), encoding="utf-8")
    out = tmp_path / "spans.jsonl"
    main(["extract", "--input", str(docs), "--output", str(out), "--lang", "de"])
    rows = {}
    for line in out.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rows.setdefault(row.pop("doc"), []).append(row)
    assert rows.get("none") == rows.get("de") != rows.get("en")


def test_one_rule_reads_a_language_tag_for_the_tagger_and_the_cues():
    from linker.extract.assertion import cues_for
    from linker.extract.extractor import MULTI, NAME, tagger_for
    from linker.language import primary

    assert [primary(t) for t in (None, "en-US", "EN_gb", " ja-JP ", "de")] == ["en", "en", "en", "ja", "de"]
    assert [tagger_for(t) for t in (None, "en", "en-US", "EN", "ja-JP", "fr")] == [NAME] * 4 + [MULTI] * 2
    assert cues_for("en-US").lang == "en" and cues_for("de-CH").lang == "de"
