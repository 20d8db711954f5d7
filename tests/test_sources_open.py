"""The open terminology sources: icd10, icdo, obo, tsv, default.

Unit tests read tiny real-format slices under tests/fixtures/{icd10,icdo,obo,tsv}/ and assert
exact ids and names; integration tests read the real files in ../shared/data and assert counts
measured on them.
"""

from __future__ import annotations

import gzip
import time
from collections import Counter
from pathlib import Path

import pytest

from linker.errors import ConfigError, InputFormatError
from linker.schema import ConceptName
from linker.sources import SourceOptions, available_sources, get_source
from linker.text import code_key

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ICD10, ICDO, OBO, TSV = (FIXTURES / d for d in ("icd10", "icdo", "obo", "tsv"))


def read(source: str, *paths: Path, **options) -> list[ConceptName]:
    return list(get_source(source)(list(paths), SourceOptions(**options)).names)


def rows(names: list[ConceptName]) -> list[tuple]:
    return [(n.concept_id, n.name, n.lang, n.term_type, n.preferred) for n in names]


def test_open_sources_are_registered():
    assert {"default", "icd10", "icdo", "obo", "tsv"} <= set(available_sources())


# ---- icd10 -------------------------------------------------------------------------------------

def test_icd10_order_file_dots_codes_and_keeps_short_names():
    names = read("icd10", ICD10 / "icd10cm_order_2026_slice.txt")
    assert rows(names) == [
        ("A00", "Cholera", "en", "PT", True),
        ("A00.0", "Cholera due to Vibrio cholerae 01, biovar cholerae", "en", "PT", True),
        ("J45.909", "Unspecified asthma, uncomplicated", "en", "PT", True),
        ("L63.9", "Alopecia areata, unspecified", "en", "PT", True),
        ("S22.49XA", "Multiple fractures of ribs, unspecified side, initial encounter for closed fracture", "en", "PT", True),
        ("S22.49XA", "Multiple fractures of ribs, unsp side, init for clos fx", "en", "SHORT", False),
    ]
    assert {n.source for n in names} == {"icd10cm"}
    # CodiEsp writes the same code in lower case with a dot; evaluation compares code keys.
    assert code_key("s22.49xa") == code_key(names[-1].concept_id)


def test_icd10_order_file_short_line_names_file_and_line(tmp_path):
    path = tmp_path / "icd10cm_order_2026.txt"
    good = (ICD10 / "icd10cm_order_2026_slice.txt").read_text(encoding="utf-8").splitlines()[0]
    path.write_text(good + "\n00002 A000    1 Cholera due to\n", encoding="utf-8")
    with pytest.raises(InputFormatError) as info:
        read("icd10", path)
    assert info.value.line == 2
    assert str(info.value).startswith(f"{path}:2: expected a fixed-width order line")


def test_icd10_claml_keeps_codes_and_german_labels():
    names = read("icd10", ICD10 / "icd10gm_claml_slice.xml")
    assert rows(names) == [
        ("A00", "Cholera", "de", "PT", True),
        ("A00.0", "Cholera durch Vibrio cholerae O:1, Biovar cholerae", "de", "PT", True),
        ("A00.0", "Klassische Cholera", "de", "SY", False),
        ("R11", "Übelkeit und Erbrechen", "de", "PT", True),
        ("U07.1", "COVID-19, Virus nachgewiesen", "de", "PT", True),
        ("U07.1", "COVID-19, Virus nachgewiesen (durch Labortest)", "de", "LONG", False),
        ("U07.1", "Coronavirus disease 2019 confirmed", "en", "SY", False),  # the Label's own xml:lang wins
    ]
    assert {n.source for n in names} == {"icd10gm"}
    assert names[0].term_id == "D0000003"  # the rubric id


def test_icd10_claml_gzipped_and_broken(tmp_path):
    gz = tmp_path / "icd10gm.xml.gz"
    gz.write_bytes(gzip.compress((ICD10 / "icd10gm_claml_slice.xml").read_bytes()))
    assert len(read("icd10", gz)) == 7
    broken = tmp_path / "broken.xml"
    broken.write_text('<?xml version="1.0"?>\n<ClaML>\n<Class code="A00" kind="category">\n</ClaML>\n', encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"broken\.xml:4: expected well-formed ClaML XML"):
        read("icd10", broken)


def test_icd10_tsv_code_lists():
    names = read("icd10", ICD10 / "codiesp_codes.tsv", ICD10 / "codiesp_codes_header.tsv")
    assert [(n.concept_id, n.lang, n.term_id) for n in names] == [
        ("S22.49XA", "es", "s22.49xa"),
        ("S22.49XA", "en", "s22.49xa"),
        ("R69", "es", "r69"),
        ("R69", "en", "r69"),
        ("S22.49XA", "es", "s22.49xa"),
        ("S22.49XA", "en", "s22.49xa"),
        ("R69", "es", "r69"),
        ("R69", "en", "r69"),
        ("0DTJ4ZZ", "es", "0dtj4zz"),  # a PCS code: no dot inserted
    ]
    assert names[0].name.startswith("Fracturas múltiples de costillas")
    # --lang names the language of the name column of a header-less list
    assert {n.lang for n in read("icd10", ICD10 / "codiesp_codes.tsv", langs=("ca",))} == {"ca", "en"}


def test_icd10_tsv_header_titles_that_are_not_languages_keep_the_defaults(tmp_path):
    path = tmp_path / "codes.tsv"
    path.write_text("code\tname\tname_en\nr69\tEnfermedad, no especificada\tIllness, unspecified\n", encoding="utf-8")
    assert [(n.concept_id, n.lang, n.name) for n in read("icd10", path)] == [
        ("R69", "es", "Enfermedad, no especificada"),
        ("R69", "en", "Illness, unspecified"),
    ]


def test_icd10_tsv_with_one_column_is_an_error(tmp_path):
    path = tmp_path / "codes.tsv"
    path.write_text("r69\tIllness, unspecified\nr52\n", encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"codes\.tsv:2: expected code<TAB>name"):
        read("icd10", path)


def test_icd10_tabular_xml_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "icd10cm_tabular_2026.xml"
    path.write_text('<?xml version="1.0" encoding="utf-8"?>\n<ICD10CM.tabular><version>2026</version></ICD10CM.tabular>\n')
    with pytest.raises(InputFormatError, match="no path"):
        read("icd10", path)


@pytest.mark.slow  # simple-icd-10-cm parses its 10 MB XML on import (about 3 s)
def test_icd10_cm_from_the_package():
    output = get_source("icd10")([], SourceOptions())
    names = list(output.names)
    assert output.description["release"] == "April 2026"
    assert output.description["codes"] == 98186  # categories + subcategories, chapters and blocks left out
    by_code: dict[str, list[ConceptName]] = {}
    for n in names:
        by_code.setdefault(n.concept_id, []).append(n)
    assert len(by_code) == 98186
    assert rows(by_code["S22.49XA"]) == [
        ("S22.49XA", "Multiple fractures of ribs, unspecified side, initial encounter for closed fracture", "en", "PT", True)
    ]
    assert ("J45.909", "Asthma NOS", "en", "SY", False) in rows(by_code["J45.909"])
    assert "A00-A09" not in by_code and "1" not in by_code
    assert by_code["B99"][0].name == "Other and unspecified infectious diseases"  # category, not the block


# ---- icdo --------------------------------------------------------------------------------------

def test_icdo_long_and_short_names_rows_without_names_yield_nothing():
    output = get_source("icdo")([ICDO / "valid-codes-slice.tsv"], SourceOptions())
    assert rows(list(output.names)) == [
        ("8000/0", "Neoplasia benigna", "es", "PT", True),
        ("8000/3", "Neoplasia maligna", "es", "PT", True),
        ("8000/31", "Neoplasia maligna - grado I, bien diferenciado", "es", "PT", True),
        ("8000/31", "Neoplasia maligna - G1", "es", "SHORT", False),
        ("8000/6", "Neoplasia metastásica", "es", "PT", True),
        ("8020/3", "Carcinoma indiferenciado, SAI", "es", "PT", True),
        ("8020/3", "Ca indiferenciado, SAI", "es", "SHORT", False),
    ]
    assert output.description["files"][0]["codes"] == 8
    assert output.description["files"][0]["codes_with_names"] == 5
    assert {n.lang for n in read("icdo", ICDO / "valid-codes-slice.tsv", langs=("en",))} == {"en"}


def test_icdo_bad_code_names_file_and_line(tmp_path):
    path = tmp_path / "codes.tsv"
    path.write_text("8000/3\tNeoplasia maligna\tNeoplasia maligna\nC50.9\tMama\tMama\n", encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"codes\.tsv:2: expected an ICD-O-3 morphology code such as 8000/3, found 'C50.9'"):
        read("icdo", path)


# ---- obo ---------------------------------------------------------------------------------------

HP_XREFS = ("MSH:D000505", "SNOMEDCT_US:56317004", "UMLS:C0002170")


def test_obo_terms_synonym_scopes_xrefs_and_obsolete():
    names = read("obo", OBO / "hp_slice.obo")
    assert rows(names) == [
        ("HP:0000001", "All", "en", "PT", True),
        ("HP:0001596", "Alopecia", "en", "PT", True),
        ("HP:0001596", "Calvities", "en", "SY_EXACT", False),
        ("HP:0001596", "Hair loss", "en", "SY_EXACT/layperson", False),
        ("HP:0002315", "Headache", "en", "PT", True),
        ("HP:0002315", "Cephalgia", "en", "SY_EXACT", False),
        ("HP:0002315", "Head pain", "en", "SY_EXACT/layperson", False),
        ("HP:0002315", "Cephalalgia", "en", "SY_EXACT/obsolete_synonym", False),
        ("HP:0002315", "Autosomal dominant headache", "en", "SY_EXACT/allelic_requirement", False),
    ]
    alopecia = names[1]
    assert alopecia.xrefs == HP_XREFS  # the `{source=...}` qualifier is not part of the xref
    assert alopecia.source == "hpo"
    assert names[4].xrefs == ("MEDDRA:10019211", "UMLS:C0018681")
    assert not any(n.concept_id in ("HP:0000003", "HP:0002238") for n in names)  # obsolete term, alt_id
    assert [n.current for n in names if n.name == "Cephalalgia"] == [False]


def test_obo_all_scopes_and_escaped_quotes():
    names = read("obo", OBO / "hp_slice.obo", synonym_scopes=("EXACT", "RELATED", "BROAD", "NARROW"))
    alopecia = [(n.name, n.term_type) for n in names if n.concept_id == "HP:0001596"]
    assert alopecia == [
        ("Alopecia", "PT"),
        ("Baldness", "SY_BROAD/layperson"),
        ("Calvities", "SY_EXACT"),
        ("Hair loss", "SY_EXACT/layperson"),
        ("Loss of hair", "SY_RELATED"),
        ('Patchy "moth-eaten" hair loss', "SY_NARROW"),
    ]


def test_obo_gzip_old_synonym_tags_and_umls_cui_prefix():
    names = read("obo", OBO / "doid_slice.obo.gz", synonym_scopes=("EXACT", "RELATED"))
    assert rows(names) == [
        ("DOID:9352", "type 2 diabetes mellitus", "en", "PT", True),
        ("DOID:9352", "NIDDM", "en", "SY_EXACT", False),
        ("DOID:9352", "type II diabetes mellitus", "en", "SY_EXACT", False),
        ("DOID:9352", "non-insulin-dependent diabetes mellitus", "en", "SY_EXACT", False),
        ("DOID:9352", "adult-onset diabetes", "en", "SY_RELATED", False),
    ]
    assert names[0].source == "doid"
    assert names[0].xrefs == ("ICD10CM:E11", "MSH:D003924", "UMLS:C0011860")
    assert rows(read("obo", OBO / "doid_slice.obo")) == rows(read("obo", OBO / "doid_slice.obo.gz"))


def test_obo_translations_babelon_and_synonym_tables():
    output = get_source("obo")(
        [OBO / "hp_slice.obo", OBO / "hp-es.babelon.tsv", OBO / "hp-fr.babelon.tsv",
         OBO / "hp-fr.synonyms.tsv", OBO / "hp-de.synonyms.tsv", OBO / "hp-nl.synonyms.tsv"],
        SourceOptions(synonym_scopes=("EXACT", "RELATED")),
    )
    translated = [n for n in output.names if n.lang != "en"]
    assert rows(translated) == [
        ("HP:0000001", "Todos", "es", "PT", True),
        ("HP:0001596", "Alopecia", "es", "PT", True),
        ("HP:0002315", "Cefalea", "es", "PT", True),
        ("HP:0002315", "Dolor de cabeza", "es", "SY_EXACT", False),
        ("HP:0002315", "Cefalalgia", "es", "SY_RELATED", False),
        ("HP:0001596", "Alopécie", "fr", "PT", True),
        ("HP:0002315", "Céphalée", "fr", "PT", True),
        ("HP:0002315", "cephalalgie", "fr", "SY_EXACT", False),
        ("HP:0002315", "céphalées", "fr", "SY_EXACT", False),
        ("HP:0002315", "mal de tête", "fr", "SY_EXACT", False),
        ("HP:0002315", "r51 - céphalée", "fr", "SY_EXACT", False),
        ("HP:0001596", "Haarausfall, Haarverlust", "de", "SY_EXACT/layperson", False),
        ("HP:0002315", "Kopfweh", "de", "SY_EXACT/layperson", False),
        ("HP:0002315", "Schädelweh", "de", "SY_EXACT/layperson", False),
    ]
    assert translated[1].xrefs == HP_XREFS  # translations carry the term's cross-references
    es, fr_babelon, fr_syn, de_syn, nl_syn = output.description["translations"]
    assert es["unknown_or_obsolete"] == 2  # HP:0000003 (obsolete) and HP:9999999
    assert fr_syn["unknown_or_obsolete"] == 1
    assert (es["names"], es["OFFICIAL"], fr_babelon["names"], de_syn["names"]) == (5, 5, 2, 3)
    assert nl_syn["unknown_or_obsolete"] == 1 and nl_syn["names"] == 0  # NOT_TRANSLATED rows skipped


def test_obo_translations_need_the_ontology():
    with pytest.raises(ConfigError, match="needs an .obo file"):
        read("obo", OBO / "hp-es.babelon.tsv")


def test_obo_stanza_without_id_names_file_and_line(tmp_path):
    path = tmp_path / "bad.obo"
    path.write_text("format-version: 1.2\nontology: hp\n\n[Term]\nid: HP:0000001\nname: All\n\n[Term]\nname: Nameless\n")
    with pytest.raises(InputFormatError) as info:
        read("obo", path)
    assert str(info.value) == f"{path}:8: expected an `id:` line in every [Term] stanza, found a stanza without one"


def test_obo_bad_synonym_and_unknown_scope(tmp_path):
    path = tmp_path / "bad.obo"
    path.write_text('ontology: hp\n\n[Term]\nid: HP:0000001\nname: All\nsynonym: Everything EXACT []\n')
    with pytest.raises(InputFormatError, match=r"bad\.obo:6: expected a synonym"):
        read("obo", path)
    with pytest.raises(ConfigError, match="unknown synonym scope"):
        read("obo", OBO / "hp_slice.obo", synonym_scopes=("EXACTLY",))


# ---- tsv ---------------------------------------------------------------------------------------

def test_tsv_medic_lines_with_several_ids():
    names = read("tsv", TSV / "medic_slice.txt")
    concepts = list(dict.fromkeys(n.concept_id for n in names))
    # One concept per line: the first MeSH id; OMIM numbers and further ids become xrefs.
    assert concepts == ["C565588", "C567755", "C", "D009290", "C566123"]
    assert [(*r, n.xrefs) for r, n in zip(rows(names), names) if n.concept_id == "C567755"] == [
        ("C567755", "Tooth Agenesis, Selective, 6", "en", "PT", True, ("OMIM:613097",)),
        ("C567755", "STHAG6", "en", "SY", False, ("OMIM:613097",)),
    ]
    narcolepsy = [n for n in names if n.concept_id == "D009290"]
    assert [n.name for n in narcolepsy][:3] == ["Narcolepsy", "Gelineau's Syndrome", "Gelineaus Syndrome"]  # &apos; decoded
    assert {n.xrefs for n in narcolepsy} == {("OMIM:605841",)}  # the line starts with the OMIM number
    cirrhosis = [n for n in names if n.concept_id == "C566123"]
    assert len(cirrhosis) == 13 and {n.xrefs for n in cirrhosis} == {("OMIM:215600", "C565846")}
    assert {n.source for n in names} == {"medic"}


def test_tsv_generic_with_header_and_lang_column():
    names = read("tsv", TSV / "names.tsv")
    assert rows(names) == [
        ("C0002170", "Alopecia", "en", "PT", True),
        ("C0002170", "Hair loss", "en", "SY", False),
        ("C0002170", "Alopecia", "es", "PT", True),
        ("C0002170", "Caída del cabello", "es", "SY", False),
        ("C0018681", "Headache", "en", "PT", True),  # empty lang cell: the default language
    ]


def test_tsv_umls_language_names_become_iso_codes(tmp_path):
    path = tmp_path / "names.tsv"
    path.write_text("C0002170\tAlopecia\tENG\nC0002170\tAlopecia\tSPA\n", encoding="utf-8")
    assert [(n.lang, n.preferred) for n in read("tsv", path)] == [("en", True), ("es", True)]


def test_tsv_biosyn_dictionary_one_name_per_line(tmp_path):
    path = tmp_path / "train_dictionary.txt"
    path.write_text("D003922||diabetes mellitus, type 1\nD003922||iddm\nD001943|C567755||breast cancer\n")
    assert rows(read("tsv", path)) == [
        ("D003922", "diabetes mellitus, type 1", "en", "PT", True),
        ("D003922", "iddm", "en", "SY", False),
        ("D001943", "breast cancer", "en", "PT", True),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("C0002170\tAlopecia\nC0018681\n", "concept_id<TAB>name"), ("D003922||iddm\nD001943|breast cancer\n", "ID[|ID...]||name")],
)
def test_tsv_malformed_line_names_file_and_line(tmp_path, text, expected):
    path = tmp_path / "names.txt"
    path.write_text(text)
    with pytest.raises(InputFormatError) as info:
        read("tsv", path)
    assert info.value.line == 2
    assert str(info.value).startswith(f"{path}:2: expected {expected}")


# ---- default -----------------------------------------------------------------------------------

@pytest.mark.slow  # builds ICD-10-CM from simple-icd-10-cm (about 5 s)
def test_default_has_icd10cm_and_english_hpo_with_lay_terms():
    output = get_source("default")([], SourceOptions())
    names = list(output.names)
    assert {n.lang for n in names} == {"en"}
    assert Counter(n.source for n in names) == Counter({"icd10cm": 110755, "hpo": 41041})  # before de-duplication
    hair_loss = [(n.concept_id, n.term_type) for n in names if n.name in ("Hair loss", "Baldness")]
    assert hair_loss == [("HP:0001596", "SY_EXACT/layperson"), ("HP:0002293", "SY_BROAD/layperson")]
    assert output.description["hpo"]["ontologies"][0]["data_version"] == "hp/releases/2025-01-16"
    with pytest.raises(ConfigError, match="takes no paths"):
        get_source("default")([OBO / "hp_slice.obo"], SourceOptions())


# ---- real data ---------------------------------------------------------------------------------

HPO_TRANSLATIONS = ("es.babelon", "fr.babelon", "nl.babelon", "de.babelon", "fr.synonyms", "nl.synonyms", "de.synonyms")


@pytest.mark.integration
@pytest.mark.slow  # about 3 s: 19,484 terms and seven translation tables
def test_real_hpo_with_translations(shared_data):
    hpo = shared_data / "hpo"
    paths = [hpo / "hp.obo.2025-01-16.gz", *(hpo / f"hp-{t}.tsv" for t in HPO_TRANSLATIONS)]
    started = time.perf_counter()
    output = get_source("obo")(paths, SourceOptions())
    counts = Counter((n.lang, n.preferred) for n in output.names)
    ontology = output.description["ontologies"][0]
    assert (ontology["terms"], ontology["obsolete_skipped"]) == (19484, 450)
    assert counts[("en", True)] == 19034  # non-obsolete terms, each with its name
    assert counts[("es", True)] == 19033
    assert counts[("fr", True)] == 14057
    assert counts[("nl", True)] == 12403
    assert counts[("de", True)] == 3484
    assert counts[("fr", False)] == 15408
    assert time.perf_counter() - started < 30


@pytest.mark.integration
def test_real_disease_ontology(shared_data):
    output = get_source("obo")([shared_data / "doid" / "HumanDO_2017-02.obo.gz"], SourceOptions())
    names = list(output.names)
    assert len({n.concept_id for n in names}) == 6931  # 9,300 terms less 2,369 obsolete
    assert sum(n.preferred for n in names) == 6931


@pytest.mark.integration
def test_real_medic_covers_every_ncbi_disease_gold_id(shared_data):
    ncbi = shared_data / "ncbi_disease"
    names = read("tsv", ncbi / "medic_06Jul2012.txt")
    ids = {n.concept_id for n in names}
    assert len(ids) == 11915  # one concept per MEDIC line
    alternatives = {x for n in names for x in n.xrefs}
    gold: set[str] = set()
    for corpus in sorted(ncbi.glob("NCBI*corpus.txt")):
        for line in corpus.read_text(encoding="utf-8").splitlines():
            cells = line.split("\t")
            if len(cells) == 6:
                gold.update(g.strip().removeprefix("MESH:") for g in cells[5].replace("+", "|").split("|"))
    gold.discard("")
    assert len(gold) == 751
    assert len(gold - ids) == 57  # gold ids that MEDIC lists as a line's alternative id (OMIM mostly)
    assert gold <= ids | alternatives


@pytest.mark.integration
def test_real_cantemist_codes(shared_data):
    output = get_source("icdo")([shared_data / "cantemist" / "valid-codes.tsv"], SourceOptions())
    names = list(output.names)
    assert output.description["files"][0]["codes"] == 58062
    assert len({n.concept_id for n in names}) == 4205
    assert Counter(n.term_type for n in names) == Counter({"PT": 4205, "SHORT": 3345})
