"""The spaCy component: a blank pipeline with an entity ruler (no model download) and a tiny index."""

from __future__ import annotations

import pytest

spacy = pytest.importorskip("spacy", reason="the optional extra linker[spacy] is not installed")

import linker.spacy_component  # noqa: E402,F401  (registers the "linker" factory)
from linker.cli.main import main  # noqa: E402
from linker.errors import ConfigError  # noqa: E402
from linker.link import Linker  # noqa: E402


@pytest.fixture(scope="module")
def index(tmp_path_factory, fixtures):
    folder = tmp_path_factory.mktemp("spacy")
    main(["-q", "dict", "build", "--source", "tsv", str(fixtures / "tsv" / "names.tsv"), "--out", str(folder / "t.parquet")])
    # char 1-2-grams: the default trigrams give "hair loss" no Spanish candidate in this tiny table.
    main(["-q", "index", "build", "--dict", str(folder / "t.parquet"), "--out", str(folder / "index"),
          "--preset", "medical-crossing"])
    return folder / "index"


def pipeline(index, **config):
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": "AE", "pattern": "hair loss"}, {"label": "AE", "pattern": "headache"},
                        {"label": "AE", "pattern": "xyzzy"}, {"label": "AE", "pattern": "alopecia"}])
    nlp.add_pipe("linker", config={"index": str(index), **config})
    return nlp


def test_every_entity_gets_kb_ents_and_candidates(index):
    nlp = pipeline(index, k=2)
    doc = nlp("She reports hair loss and a headache, and xyzzy.")
    by_text = {ent.text: ent for ent in doc.ents}
    assert set(by_text) == {"hair loss", "headache", "xyzzy"}
    expected = Linker.load(index).link(["hair loss", "headache"], k=2)
    for ent, result in zip((by_text["hair loss"], by_text["headache"]), expected):
        assert ent._.kb_ents == [(c.concept_id, round(c.score, 6)) for c in result.candidates]
        assert ent._.linker == list(result.candidates)
    assert by_text["hair loss"]._.kb_ents[0] == ("C0002170", 1.0)
    assert by_text["hair loss"]._.linker[0].matched_name == "Hair loss"
    assert by_text["headache"]._.kb_ents[0][0] == "C0018681"
    assert by_text["xyzzy"]._.kb_ents == [] and by_text["xyzzy"]._.linker == []  # no n-gram in common
    assert nlp("Nothing to see.").ents == ()  # a Doc without entities is fine


def test_one_link_call_per_batch_of_docs(index, monkeypatch):
    nlp = pipeline(index, k=1)
    component = nlp.get_pipe("linker")
    calls = []
    original = component.linker.link
    monkeypatch.setattr(component.linker, "link", lambda texts, **kw: calls.append(list(texts)) or original(texts, **kw))
    docs = list(nlp.pipe(["hair loss", "headache and hair loss", "no entity here"], batch_size=8))
    assert calls == [["hair loss", "headache", "hair loss"]]
    assert [[e._.kb_ents[0][0] for e in d.ents] for d in docs] == [["C0002170"], ["C0018681", "C0002170"], []]
    calls.clear()
    nlp("hair loss and headache")
    assert calls == [["hair loss", "headache"]]  # one call per Doc outside nlp.pipe


def test_language_threshold_and_bad_config(index):
    doc = pipeline(index, k=5, lang="es")("alopecia")
    assert [(c.matched_name, c.lang) for c in doc.ents[0]._.linker] == [("Alopecia", "es")]
    doc = pipeline(index, k=5, threshold=0.99)("hair loss")
    assert doc.ents[0]._.kb_ents == [("C0002170", 1.0)]
    with pytest.raises(ConfigError, match="k must be at least 1"):
        pipeline(index, k=0)
    with pytest.raises(Exception, match="expected an index folder, found a concept table"):
        pipeline(index.parent / "t.parquet")


def test_linker_ae_sets_ents_and_the_linker_follows_it(index):
    """A real blank pipeline: the tagger's spans become doc.ents (offsets exact, status kept); the linker links
    the positive adverse events only, as `linker annotate` codes them."""
    pytest.importorskip("torch")
    from linker.extract import extract

    text = "She developed hair loss after starting cisplatin; no nausea was reported."
    nlp = spacy.blank("en")
    nlp.add_pipe("linker_ae")
    nlp.add_pipe("linker", config={"index": str(index), "k": 1, "labels": ["AdverseEvent"]})
    doc = nlp(text)
    expected = extract([text])[0]
    assert [(e.start_char, e.end_char, e.label_, e._.ae_status) for e in doc.ents] == [
        (s.start, s.end, s.label, s.status) for s in expected]
    by_label = {(e.label_, e._.ae_status): e for e in doc.ents}
    assert by_label[("Drug", "positive")].text == "cisplatin" and by_label[("Drug", "positive")]._.kb_ents == []
    assert by_label[("AdverseEvent", "positive")]._.kb_ents[0][0] == "C0002170"  # hair loss
    assert by_label[("AdverseEvent", "negated")]._.kb_ents == []  # negated: not linked
    docs = list(nlp.pipe([text, "Nausea after cisplatin."], batch_size=4))
    assert [(e.text, e._.ae_status) for e in docs[0].ents] == [(e.text, e._.ae_status) for e in doc.ents]
    with pytest.raises(ConfigError, match="style: expected one of"):
        nlp.add_pipe("linker_ae", name="bad", config={"style": "sentences"})


def test_a_discontinuous_event_is_set_on_its_own_piece(monkeypatch):
    """An entity is contiguous: "Ciliary ... hyperemia" is set on "Ciliary", the piece no other span covers, and
    "conjunctival hyperemia" keeps its own entity."""
    pytest.importorskip("torch")
    import linker.extract
    from linker.extract.lexicon import Lexicon, elliptic_events
    from linker.extract.model import ExtractedSpan

    text = "Ciliary and conjunctival hyperemia occurred."
    tagged = [ExtractedSpan(0, 7, "Ciliary", "AdverseEvent", "positive", 0.9),
              ExtractedSpan(12, 34, "conjunctival hyperemia", "AdverseEvent", "positive", 0.8)]
    nlp = spacy.blank("en")
    nlp.add_pipe("linker_ae")
    monkeypatch.setattr(linker.extract, "annotate_documents",
                        lambda texts, **_: [elliptic_events(t, tagged, Lexicon([])) for t in texts])
    doc = nlp(text)
    assert [(e.text, e.label_, e._.ae_confidence) for e in doc.ents] == [
        ("Ciliary", "AdverseEvent", 0.9), ("conjunctival hyperemia", "AdverseEvent", 0.8)]


def test_each_linked_entity_carries_the_links_decision(index, tmp_path):
    import shutil

    from linker.eval.calibrate import calibrate

    assert pipeline(index)("hair loss").ents[0]._.linker_decision is None  # no calibration: no decision to trust
    calibrated = tmp_path / "calibrated"
    shutil.copytree(index, calibrated)
    heldin = tmp_path / "heldin.tsv"
    heldin.write_text("C0002170\thair loss\nC0002170\tbaldness\nC0018681\theadache\nC0018681\thead pain\n"
                      "C0002170\tloss of hair\nC0018681\tpain in head\n")
    calibrate(calibrated, f"tsv:{heldin}", dictionary_names=3)
    doc = pipeline(calibrated)("She reports hair loss and a headache, and xyzzy.")
    expected = Linker.load(calibrated).link([ent.text for ent in doc.ents], k=1)
    assert [ent._.linker_decision for ent in doc.ents] == [r.decision for r in expected]
    assert all(d in ("auto", "review", "no link") for d in (ent._.linker_decision for ent in doc.ents))
