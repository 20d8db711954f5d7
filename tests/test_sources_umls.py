"""UMLS RRF source: filters (language, SAB, semantic type/group, suppression), preferred names, errors, CLI."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from linker.cli.main import main
from linker.dictionary import SourceSpec, build_dictionary, read_concept_table
from linker.errors import InputFormatError, MissingInputError, UnknownNameError
from linker.fileio import decode_line
from linker.sources import SourceOptions, get_source
from linker.sources.umls import semantic_groups, semantic_types, wanted_types

RELEASE = Path(__file__).resolve().parent / "fixtures" / "umls" / "2024AA"
META = RELEASE / "META"

# (concept_id, name, lang, source, term_id, term_type, preferred, current) of the default build:
# per CUI, each language's preferred name (TS=P, STT=PF, ISPREF=Y) first, then the rest in file order;
# SUPPRESS O/E/Y rows dropped; the MDR LLT "Nausea" (A0087999) is a duplicate of the MSH preferred name.
DEFAULT = [
    ("C0004057", "Aspirin", "en", "umls:MSH", "A0022000", "MH", True, True),
    ("C0004057", "Acetylsalicylsäure", "de", "umls:MSHGER", "A1711022", "MH", True, True),
    ("C0004057", "Acetylsalicylic Acid", "en", "umls:MSH", "A0022001", "ET", False, True),
    ("C0018670", "Head", "en", "umls:MSH", "A0065000", "MH", True, True),
    ("C0018681", "Headache", "en", "umls:MSH", "A0066000", "MH", True, True),
    ("C0018681", "Cefalea", "es", "umls:MDRSPA", "A1234567", "PT", True, True),
    ("C0018681", "Céphalée", "fr", "umls:MDRFRE", "A1234569", "PT", True, True),
    ("C0018681", "HEADACHE", "en", "umls:MDR", "A0474000", "PT", False, True),
    ("C0018681", "Cephalgia", "en", "umls:MSH", "A0066001", "ET", False, True),
    ("C0018681", "Dolor de cabeza", "es", "umls:MDRSPA", "A1234568", "LLT", False, True),
    ("C0019360", "Herpes Zoster", "en", "umls:MSH", "A0080000", "MH", True, True),
    ("C0019360", "Herpes zoster", "nl", "umls:MDRDUT", "A2345678", "PT", True, True),
    ("C0019360", "Shingles", "en", "umls:MDR", "A0080001", "LLT", False, True),
    ("C0027497", "Nausea", "en", "umls:MSH", "A0088000", "MH", True, True),
    ("C0027497", "Náusea", "es", "umls:MDRSPA", "A3456789", "PT", True, True),
    ("C0027497", "NAUSEA", "en", "umls:MDR", "A0088001", "PT", False, True),
]


def rows(path: Path) -> list[tuple]:
    table = read_concept_table(path).table
    return [
        (r["concept_id"], r["name"], r["lang"], r["source"], r["term_id"], r["term_type"], r["preferred"], r["current"])
        for r in table.to_pylist()
    ]


def build(tmp_path: Path, path: Path = META, **options) -> Path:
    out = tmp_path / "umls.parquet"
    build_dictionary([SourceSpec("umls", (path,))], out, options=SourceOptions(**options), overwrite=True)  # helper: rebuilt per case
    return out


def copy_meta(tmp_path: Path) -> Path:
    target = tmp_path / "META"
    shutil.copytree(META, target)
    return target


def test_default_build_exact_rows(tmp_path):
    out = build(tmp_path)
    assert rows(out) == DEFAULT
    table = read_concept_table(out).table.to_pylist()
    assert table[0]["xrefs"] == ["MSH:D001241"]


def test_release_folder_and_mrconso_file_are_accepted(tmp_path):
    assert rows(build(tmp_path, RELEASE)) == DEFAULT
    assert rows(build(tmp_path, META / "MRCONSO.RRF")) == DEFAULT


def test_gzipped_mrconso_reads_alike(tmp_path):
    folder = tmp_path / "META"
    folder.mkdir()
    (folder / "MRCONSO.RRF.gz").write_bytes(gzip.compress((META / "MRCONSO.RRF").read_bytes()))
    assert rows(build(tmp_path, folder)) == DEFAULT


def test_description_records_release_and_counts(tmp_path):
    (source,) = read_concept_table(build(tmp_path, langs=("en",))).meta["sources"]
    assert source["release"] == ["2024AA"]
    assert source["rows_kept"] == 11
    assert source["rows_skipped"] == {"language": 6, "suppressed": 3}


def test_lang_filter(tmp_path):
    assert rows(build(tmp_path, langs=("es", "nl"))) == [r for r in DEFAULT if r[2] in ("es", "nl")]


def test_duplicate_string_keeps_the_preferred_row(tmp_path):
    nausea = [r for r in rows(build(tmp_path)) if r[1] == "Nausea"]
    assert nausea == [("C0027497", "Nausea", "en", "umls:MSH", "A0088000", "MH", True, True)]


def test_sab_filter_promotes_a_stand_in_preferred_name(tmp_path):
    # Without MSH the UMLS preferred atoms are gone; the first ISPREF=Y row of MDR stands in.
    assert rows(build(tmp_path, vocabularies=("MDR",))) == [
        ("C0018681", "HEADACHE", "en", "umls:MDR", "A0474000", "PT", True, True),
        ("C0019360", "Shingles", "en", "umls:MDR", "A0080001", "LLT", True, True),
        ("C0027497", "NAUSEA", "en", "umls:MDR", "A0088001", "PT", True, True),
        ("C0027497", "Nausea", "en", "umls:MDR", "A0087999", "LLT", False, True),
    ]


def test_semantic_group_filter(tmp_path):
    got = rows(build(tmp_path, semantic_groups=("DISO",)))
    assert got == [r for r in DEFAULT if r[0] in ("C0018681", "C0019360", "C0027497")]
    assert rows(build(tmp_path, semantic_groups=("chem",))) == [r for r in DEFAULT if r[0] == "C0004057"]


def test_semantic_type_filter_by_tui_or_name(tmp_path):
    by_tui = rows(build(tmp_path, semantic_types=("T121",)))
    assert by_tui == [r for r in DEFAULT if r[0] == "C0004057"]
    assert rows(build(tmp_path, semantic_types=("sign or symptom", "T023"))) == [
        r for r in DEFAULT if r[0] in ("C0018670", "C0018681", "C0027497")
    ]


def test_include_suppressed_keeps_them_as_not_current(tmp_path):
    got = rows(build(tmp_path, include_suppressed=True))
    assert [r for r in got if not r[7]] == [
        ("C0018681", "Head pain", "en", "umls:MDR", "A0066002", "LLT", False, False),
        ("C0019360", "Herpes zoster", "en", "umls:MDR", "A0080002", "PT", False, False),
        ("C0027497", "Feeling sick", "en", "umls:MDR", "A0088002", "LLT", False, False),
    ]
    assert [r for r in got if r[7]] == DEFAULT
    assert rows(build(tmp_path, include_suppressed=True, current_only=True)) == DEFAULT


def test_semantic_groups_table():
    table = semantic_types()
    assert len(table) == 127
    assert len(semantic_groups()) == 15
    assert semantic_groups()["DISO"] == "Disorders"
    known = {"T047": "DISO", "T184": "DISO", "T191": "DISO", "T033": "DISO", "T121": "CHEM", "T200": "CHEM",
             "T023": "ANAT", "T061": "PROC", "T074": "DEVI", "T005": "LIVB", "T028": "GENE", "T083": "GEOG",
             "T201": "PHYS", "T034": "PHEN", "T092": "ORGA", "T090": "OCCU", "T073": "OBJC", "T170": "CONC",
             "T052": "ACTI"}
    assert {tui: table[tui].group for tui in known} == known
    assert table["T047"].name == "Disease or Syndrome"
    assert len(wanted_types((), ("DISO",))) == 12


def test_unknown_group_or_type_lists_the_choices():
    with pytest.raises(UnknownNameError, match=r"unknown semantic group 'DISORDERS'; available: ACTI, ANAT, CHEM"):
        wanted_types((), ("DISORDERS",))
    with pytest.raises(UnknownNameError, match="unknown semantic type 'Diseases'"):
        wanted_types(("Diseases",), ())
    assert wanted_types(("t119",), ()) == frozenset({"T119"})  # retired in 2018, still in older releases


def test_names_stream_without_reading_the_whole_file(tmp_path):
    folder = copy_meta(tmp_path)
    with (folder / "MRCONSO.RRF").open("a", encoding="utf-8") as handle:
        handle.write("C0027497|ENG|truncated\n")
    names = get_source("umls")([folder], SourceOptions()).names
    first = [next(names) for _ in range(3)]  # the broken last line is not reached yet
    assert [n.name for n in first] == ["Aspirin", "Acetylsalicylsäure", "Acetylsalicylic Acid"]
    with pytest.raises(InputFormatError) as info:
        list(names)
    assert info.value.line == 21


def test_wrong_field_count_names_file_and_line(tmp_path):
    folder = copy_meta(tmp_path)
    lines = (folder / "MRCONSO.RRF").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = lines[2].replace("|MSHGER|", "|MSHGER|extra|")
    (folder / "MRCONSO.RRF").write_text("".join(lines), encoding="utf-8")
    with pytest.raises(InputFormatError) as info:
        build(tmp_path, folder, langs=("en",))  # raised even though the row's language is filtered out
    assert str(info.value).startswith(f"{folder / 'MRCONSO.RRF'}:3: expected 18 '|'-terminated fields")
    assert "found 19 separators" in str(info.value)
    assert not (tmp_path / "umls.parquet").exists()


def test_malformed_mrsty_row(tmp_path):
    folder = copy_meta(tmp_path)
    (folder / "MRSTY.RRF").write_text("C0004057|T109|Organic Chemical|\n", encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"MRSTY.RRF:1: expected 6 '\|'-terminated fields"):
        build(tmp_path, folder, semantic_groups=("CHEM",))


def test_unsorted_mrconso_is_refused(tmp_path):
    folder = copy_meta(tmp_path)
    lines = (folder / "MRCONSO.RRF").read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "MRCONSO.RRF").write_text("".join(lines[3:] + lines[:3]), encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"MRCONSO.RRF:18: expected rows sorted by CUI.*C0004057 after C0027497"):
        build(tmp_path, folder)


def test_type_filter_without_mrsty_is_a_missing_input(tmp_path):
    folder = copy_meta(tmp_path)
    (folder / "MRSTY.RRF").unlink()
    with pytest.raises(MissingInputError, match="no MRSTY.RRF beside MRCONSO.RRF"):
        get_source("umls")([folder], SourceOptions(semantic_groups=("DISO",)))
    assert rows(build(tmp_path, folder)) == DEFAULT  # without a type filter MRSTY is not needed


def test_folder_without_mrconso_is_a_missing_input(tmp_path):
    with pytest.raises(MissingInputError, match="no MRCONSO.RRF here or in a META subfolder"):
        get_source("umls")([tmp_path], SourceOptions())


def test_cli_build_with_filters_and_info(tmp_path, capsys):
    out = tmp_path / "umls.parquet"
    main(["dict", "build", "--source", "umls", str(META), "--lang", "en,es", "--group", "DISO", "--out", str(out)])
    assert "wrote" in capsys.readouterr().out
    assert rows(out) == [r for r in DEFAULT if r[2] in ("en", "es") and r[0] in ("C0018681", "C0019360", "C0027497")]
    main(["dict", "info", str(out), "--json"])
    info = json.loads(capsys.readouterr().out)
    assert (info["names"], info["concepts"]) == (10, 3)
    assert info["by_lang"] == {"en": {"names": 7, "concepts": 3}, "es": {"names": 3, "concepts": 2}}
    assert info["by_source"]["umls:MSH"] == {"names": 4, "concepts": 3}


def test_cli_malformed_row_exits_1_and_keeps_the_good_table(tmp_path, capsys):
    out = tmp_path / "umls.parquet"
    main(["dict", "build", "--source", "umls", str(META), "--out", str(out)])
    good = out.read_bytes()
    capsys.readouterr()
    folder = copy_meta(tmp_path / "bad")
    text = (folder / "MRCONSO.RRF").read_text(encoding="utf-8")
    (folder / "MRCONSO.RRF").write_text(text.replace("|Cephalgia|0|N|256|", "|Cephalgia|0|N|"), encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main(["dict", "build", "--source", "umls", str(folder), "--out", str(out), "--overwrite"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"error: {folder / 'MRCONSO.RRF'}:7: expected 18 '|'-terminated fields")
    assert out.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "umls.parquet"]


def test_cli_unknown_group_exits_1(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["dict", "build", "--source", "umls", str(META), "--group", "DISEASE",
              "--out", str(tmp_path / "x.parquet")])
    assert exit_info.value.code == 1
    assert "unknown semantic group 'DISEASE'; available: ACTI, ANAT" in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.integration
def test_semantic_groups_agree_with_mantra_gsc_annotations(shared_data):
    """Mantra GSC's AnnotatorNotes give "CUI", "name", "type[|type]" ,"GROUP"; single-type notes must agree."""
    archive = shared_data / "mantra_gsc" / "Mantra-GSC-brat.zip"
    if not archive.exists():
        pytest.skip(f"{archive} is absent")
    by_name = {t.name.replace(",", ""): t.group for t in semantic_types().values()}  # Mantra drops commas
    note = re.compile(r'"C\d{7}", ".*", "([^"|]+)"\s*,"([A-Z]{4})"')
    pairs: set[tuple[str, str]] = set()
    with zipfile.ZipFile(archive) as zf:
        for member in zf.namelist():
            if member.endswith(".ann"):
                for raw in zf.open(member):
                    line = decode_line(raw)  # a few notes are not UTF-8
                    if (match := note.search(line)) and match.group(1) in by_name:
                        pairs.add((match.group(1), match.group(2)))
    assert len(pairs) >= 60  # the corpus uses about 80 distinct single types
    assert {(name, by_name[name]) for name, _ in pairs} == pairs
