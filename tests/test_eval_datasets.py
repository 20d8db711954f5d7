"""Dataset loaders: each format's ids, composites, alternatives, spans, languages and errors."""

from __future__ import annotations

import pytest

from linker.datasets import Mention, load_dataset, parse_spec
from linker.errors import InputFormatError, MissingInputError, UnknownNameError


def test_pubtator_composites_prefixes_and_no_id(fixtures):
    mentions = load_dataset(f"pubtator:{fixtures / 'eval/pubtator_slice.txt'}")
    assert [m.text for m in mentions] == ["Copper toxicosis", "Breast and ovarian cancer", "renal hamartomas",
                                          "Wilson disease", "WD"]  # the -1 mention and the CID line are left out
    assert mentions[0] == Mention("Copper toxicosis", (("OMIM:215600",),), "en", "9949209", 0, 16)
    assert mentions[1].gold == (("D001943",), ("D010051",))  # A|B: two parts
    assert mentions[2].gold == (("D007674",), ("D006222",))  # A+B: two parts as well
    assert mentions[1].composite and not mentions[0].composite
    assert mentions[3].gold == mentions[4].gold == (("D006527",),)  # MESH: prefix removed


def test_brat_zip_discontinuous_notes_and_macosx(fixtures):
    mentions = load_dataset(f"brat:{fixtures / 'eval/cantemist_slice.zip'}#lang=es")
    # T3 has no AnnotatorNotes and is left out; __MACOSX/._cc_onco1.ann is skipped.
    assert mentions == [
        Mention("carcinoma", (("8010/3",),), "es", "cc_onco1", 10, 19),
        Mention("metástasis pulmonares", (("8000/6",),), "es", "cc_onco1", 30, 60),  # /H dropped, span 30..60
    ]


def _brat_doc(folder, name, text, spans, note="8500/3"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.txt").write_text(text, encoding="utf-8")
    lines = []
    for i, span in enumerate(spans, 1):
        start = text.index(span[0], span[1])
        lines += [f"T{i}\tMORFOLOGIA_NEOPLASIA {start} {start + len(span[0])}\t{span[0]}",
                  f"#{i}\tAnnotatorNotes T{i}\t{note}"]
    (folder / f"{name}.ann").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_brat_abbrev_expands_short_forms_defined_in_the_same_document(tmp_path, caplog):
    text = "Mujer con carcinoma ductal infiltrante (CDI) de mama. El CDI mide 2 cm."
    _brat_doc(tmp_path / "Spanish", "cc1", text, [("carcinoma ductal infiltrante", 0), ("CDI", 50)])
    # Same file name in another language folder, without the definition: its "CDI" stays as written.
    _brat_doc(tmp_path / "English", "cc1", "The CDI grew.", [("CDI", 0)])
    plain = load_dataset(f"brat:{tmp_path}")
    with caplog.at_level("INFO"):
        expanded = load_dataset(f"brat:{tmp_path}#abbrev")
    assert [(m.lang, m.text) for m in plain] == [("en", "CDI"), ("es", "carcinoma ductal infiltrante"), ("es", "CDI")]
    assert [(m.lang, m.text) for m in expanded] == [("en", "CDI"), ("es", "carcinoma ductal infiltrante"),
                                                    ("es", "carcinoma ductal infiltrante")]
    assert [(m.start, m.end, m.gold) for m in expanded] == [(m.start, m.end, m.gold) for m in plain]  # spans kept
    assert "abbreviations expanded 1" in caplog.text


def test_brat_abbrev_without_txt_warns_and_typos_apply(tmp_path, caplog):
    _brat_doc(tmp_path, "a", "El tumr (TM) crece. TM", [("TM", 20)])
    (tmp_path / "a.txt").unlink()
    typos = tmp_path / "typos.txt"
    typos.write_text("TM||tumor\n", encoding="utf-8")
    with caplog.at_level("INFO"):
        assert [m.text for m in load_dataset(f"brat:{tmp_path}#abbrev")] == ["TM"]
    assert "1 documents have no .txt beside their .ann" in caplog.text
    assert [m.text for m in load_dataset(f"brat:{tmp_path}#typos={typos}")] == ["tumor"]
    with pytest.raises(UnknownNameError, match="unknown brat option 'split'"):
        load_dataset(f"brat:{tmp_path}#split")


def test_brat_without_lang_is_und(fixtures):
    assert {m.lang for m in load_dataset(f"brat:{fixtures / 'eval/cantemist_slice.zip'}")} == {"und"}


def test_brat_mantra_languages_from_folders(fixtures):
    folder = fixtures / "eval/mantra"
    mentions = load_dataset(f"brat:{folder}")
    assert sorted((m.lang, m.text, m.gold[0][0]) for m in mentions) == [
        ("en", "patients", "C0030705"),
        ("es", "insuficiencia renal", "C0022661"),
        ("es", "pacientes", "C0030705"),
    ]
    spanish = load_dataset(f"brat:{folder}#lang=es")
    assert [(m.text, m.start, m.end) for m in spanish] == [("pacientes", 0, 9), ("insuficiencia renal", 20, 48)]


def test_brat_malformed_line_names_file_and_line(fixtures):
    with pytest.raises(InputFormatError) as err:
        load_dataset(f"brat:{fixtures / 'eval/bad.ann'}")
    assert "bad.ann:3:" in str(err.value) and "Type START END" in str(err.value)


def test_codiesp_diagnoses_and_procedures(fixtures):
    path = fixtures / "eval/codiesp_X.tsv"
    diagnoses = load_dataset(f"codiesp:{path}")
    assert [(m.text, m.gold, m.lang, m.start, m.end) for m in diagnoses] == [
        ("fractura costal", (("s22.49xa",),), "es", 10, 25),
        ("dolor", (("r52",),), "es", 70, 75),
        ("cáncer de mama", (("c50.919",),), "es", 5, 27),
    ]
    assert load_dataset(f"codiesp:{path}#D") == diagnoses
    procedures = load_dataset(f"codiesp:{path}#P")
    assert [(m.text, m.gold, m.start, m.end) for m in procedures] == [("resección vejiga", (("0ttb",),), 40, 66)]


def test_biosyn_tsv_and_query_alternatives_and_parts(fixtures):
    biosyn = load_dataset(f"biosyn:{fixtures / 'eval/biosyn_test.concept'}")
    assert biosyn[0].gold == (("D001943", "C535668"),)  # | = alternatives
    assert biosyn[1].gold == (("D007674",), ("D006222",))  # + = parts
    assert (biosyn[0].doc_id, biosyn[0].start, biosyn[0].end) == ("doc1", 0, 13)
    tsv = load_dataset(f"tsv:{fixtures / 'eval/mentions.tsv'}#lang=es")
    assert [(m.text, m.gold, m.lang) for m in tsv] == [
        ("breast cancer", (("D001943", "D010051"), ("D007674",)), "es"),
        ("copper toxicosis", (("OMIM:215600",),), "en"),  # the row's own language wins
    ]
    query = load_dataset(f"query:{fixtures / 'eval/mentions.query'}")
    assert [(m.text, m.gold) for m in query] == [("breast cancer", (("D001943",),)), ("wilson disease", (("D006527",),))]


def test_bad_specs(fixtures, tmp_path):
    with pytest.raises(UnknownNameError, match="unknown dataset format 'conll'; available: biosyn, brat, codiesp"):
        load_dataset("conll:x.txt")
    with pytest.raises(InputFormatError, match="FORMAT:PATH"):
        parse_spec("NCBItestset_corpus.txt")
    with pytest.raises(MissingInputError, match="no such file"):
        load_dataset(f"pubtator:{tmp_path / 'absent.txt'}")
    with pytest.raises(UnknownNameError, match="unknown codiesp option 'X'"):
        load_dataset(f"codiesp:{fixtures / 'eval/codiesp_X.tsv'}#X")
    bad = tmp_path / "bad.tsv"
    bad.write_text("D1\tok\nonly-one-field\n", encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"bad.tsv:2: expected 'id<TAB>mention"):
        load_dataset(f"tsv:{bad}")
    pub = tmp_path / "bad.txt"
    pub.write_text("1|t|x\n1\t0\t1\tx\tDisease\n", encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"bad.txt:2:"):
        load_dataset(f"pubtator:{pub}")
