"""MedDRA ASCII source: two language packs of one version, LLT -> PT linking, hierarchy, errors, CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from linker.cli.main import main
from linker.dictionary import SourceSpec, build_dictionary, read_concept_table
from linker.errors import ConfigError, InputFormatError, MissingInputError, UnknownNameError
from linker.sources import SourceOptions, get_source

MEDDRA = Path(__file__).resolve().parent / "fixtures" / "meddra"
EN = MEDDRA / "MedDRA_26_1_English" / "MedAscii"
ES = MEDDRA / "MedDRA_26_1_Spanish" / "MedAscii"

# (concept_id, name, lang, term_id, term_type, preferred, current) in table order: per release,
# PTs first, then LLTs; an LLT identical to its PT ("Headache", "Náusea") is dropped as a duplicate.
EXPECTED = [
    ("10019211", "Headache", "en", "10019211", "PT", True, True),
    ("10028813", "Nausea", "en", "10028813", "PT", True, True),
    ("10019974", "Herpes zoster", "en", "10019974", "PT", True, True),
    ("10019211", "Cephalgia", "en", "10019214", "LLT", False, True),
    ("10019211", "Head pain", "en", "10019199", "LLT", False, True),
    ("10019211", "Cephalalgia", "en", "10008413", "LLT", False, False),
    ("10028813", "Feeling sick", "en", "10028817", "LLT", False, True),
    ("10019974", "Shingles", "en", "10040566", "LLT", False, True),
    ("10019211", "Cefalea", "es", "10019211", "PT", True, True),
    ("10028813", "Náusea", "es", "10028813", "PT", True, True),
    ("10019974", "Herpes zóster", "es", "10019974", "PT", True, True),
    ("10019211", "Dolor de cabeza", "es", "10019214", "LLT", False, True),
    ("10019211", "Cefalalgia", "es", "10008413", "LLT", False, False),
    ("10028813", "Ganas de vomitar", "es", "10028817", "LLT", False, True),
    ("10019974", "Culebrilla", "es", "10040566", "LLT", False, True),
]


def rows(path: Path) -> list[tuple]:
    table = read_concept_table(path).table
    assert set(table.column("source").to_pylist()) == {"meddra"}
    return [
        (r["concept_id"], r["name"], r["lang"], r["term_id"], r["term_type"], r["preferred"], r["current"])
        for r in table.to_pylist()
    ]


def build(tmp_path: Path, *paths: Path, **options) -> Path:
    out = tmp_path / "meddra.parquet"
    build_dictionary([SourceSpec("meddra", tuple(paths))], out, options=SourceOptions(**options))
    return out


def copy_release(tmp_path: Path, source: Path = EN, name: str = "MedDRA_26_1_English") -> Path:
    """A writable copy of one MedAscii folder, to corrupt in error tests."""
    target = tmp_path / name / "MedAscii"
    shutil.copytree(source, target)
    return target


def replace_line(path: Path, number: int, text: str) -> None:
    lines = path.read_bytes().split(b"\r\n")
    lines[number - 1] = text.encode()
    path.write_bytes(b"\r\n".join(lines))


def test_folder_of_languages_gives_exact_rows(tmp_path):
    assert rows(build(tmp_path, MEDDRA)) == EXPECTED


def test_one_folder_per_language_gives_the_same_table(tmp_path):
    assert rows(build(tmp_path, EN, ES)) == EXPECTED


def test_cp1252_name_decodes_and_matches_its_utf8_llt(tmp_path):
    raw = (ES / "pt.asc").read_bytes()
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")  # the fixture really is legacy single-byte text
    assert "Náusea".encode("utf-8") in (ES / "llt.asc").read_bytes()
    names = [r for r in rows(build(tmp_path, MEDDRA)) if r[1] == "Náusea"]
    # Decoded alike, the UTF-8 LLT equals the cp1252 PT and is dropped as its duplicate.
    assert names == [("10028813", "Náusea", "es", "10028813", "PT", True, True)]


def test_language_and_version_detection_is_recorded(tmp_path):
    meta = read_concept_table(build(tmp_path, MEDDRA)).meta
    (source,) = meta["sources"]
    assert source["version"] == "26.1"
    assert source["languages"] == ["en", "es"]
    assert [(r["lang"], r["lang_from"], r["version"]) for r in source["releases"]] == [
        ("en", "meddra_release.asc:1", "26.1"),
        ("es", "folder name 'MedDRA_26_1_Spanish'", "26.1"),
    ]


def test_language_defaults_to_english_without_clues(tmp_path):
    folder = tmp_path / "release"
    shutil.copytree(ES, folder)
    output = get_source("meddra")([folder], SourceOptions())
    assert output.description["languages"] == ["en"]
    assert output.description["version"] is None
    assert output.description["releases"][0]["lang_from"].startswith("default")


def test_iso_code_folder_name_sets_language(tmp_path):
    shutil.copytree(ES, tmp_path / "es")
    output = get_source("meddra")([tmp_path], SourceOptions())
    assert output.description["languages"] == ["es"]


def test_llt_target_keeps_llt_codes(tmp_path):
    got = rows(build(tmp_path, EN, meddra_target="llt"))
    assert [(r[0], r[1], r[3]) for r in got] == [
        ("10019211", "Headache", "10019211"),
        ("10028813", "Nausea", "10028813"),
        ("10019974", "Herpes zoster", "10019974"),
        ("10019214", "Cephalgia", "10019214"),
        ("10019199", "Head pain", "10019199"),
        ("10008413", "Cephalalgia", "10008413"),
        ("10028817", "Feeling sick", "10028817"),
        ("10040566", "Shingles", "10040566"),
    ]


def test_current_only_drops_non_current_llts(tmp_path):
    got = rows(build(tmp_path, MEDDRA, current_only=True))
    assert got == [r for r in EXPECTED if r[6]]
    assert "Cephalalgia" not in {r[1] for r in got}


def test_lang_filter_skips_other_releases(tmp_path):
    out = build(tmp_path, MEDDRA, langs=("es",))
    assert rows(out) == [r for r in EXPECTED if r[2] == "es"]
    assert read_concept_table(out).meta["sources"][0]["languages"] == ["es"]


def test_hierarchy_side_table(tmp_path):
    hierarchy = read_concept_table(build(tmp_path, MEDDRA)).hierarchy
    assert hierarchy.num_rows == 8
    zoster = [
        (r["lang"], r["hlt_code"], r["soc_code"], r["soc_name"], r["primary_soc"])
        for r in hierarchy.to_pylist()
        if r["pt_code"] == "10019974"
    ]
    assert zoster == [
        ("en", "10019975", "10021881", "Infections and infestations", True),
        ("en", "10040800", "10040785", "Skin and subcutaneous tissue disorders", False),
        ("es", "10019975", "10021881", "Infecciones e infestaciones", True),
        ("es", "10040800", "10040785", "Trastornos de la piel y del tejido subcutáneo", False),
    ]
    headache = [r for r in hierarchy.to_pylist() if r["pt_code"] == "10019211" and r["lang"] == "en"]
    assert headache == [{
        "pt_code": "10019211", "pt_name": "Headache", "hlt_code": "10019231", "hlt_name": "Headaches NEC",
        "hlgt_code": "10019233", "hlgt_name": "Headaches", "soc_code": "10029205",
        "soc_name": "Nervous system disorders", "soc_abbrev": "Nerv", "primary_soc": True, "lang": "en",
    }]


def test_without_mdhier_there_is_no_hierarchy(tmp_path):
    folder = copy_release(tmp_path)
    (folder / "mdhier.asc").unlink()
    assert read_concept_table(build(tmp_path, folder)).hierarchy is None


def test_upper_case_file_names_are_found(tmp_path):
    folder = copy_release(tmp_path)
    for path in folder.iterdir():
        path.rename(path.with_name(path.name.upper()))
    assert rows(build(tmp_path, folder)) == [r for r in EXPECTED if r[2] == "en"]


@pytest.mark.parametrize(
    ("file", "line", "text", "expected", "found"),
    [
        ("llt.asc", 3, "10019199$Head pain$10019211$$", "11 '$'-separated fields", "4 fields"),
        ("llt.asc", 2, "1001921X$Cephalgia$10019211$$$$$$$Y$$", "a numeric llt_code", "'1001921X'"),
        ("llt.asc", 5, "10028813$Nausea$99999999$$$$$$$Y$$", "a pt_code listed in pt.asc", "pt_code 99999999"),
        ("llt.asc", 4, "10008413$Cephalalgia$10019211$$$$$$$maybe$$", "llt_currency Y or N", "'maybe'"),
        ("pt.asc", 2, "10028813$Nausea$$10017947$$$", "11 '$'-separated fields", "6 fields"),
        ("mdhier.asc", 1, "10019211$10019231$10019233$10029205$Headache$$$$$$10029205$X$",
         "primary_soc_fg Y or N", "'X'"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, file, line, text, expected, found):
    folder = copy_release(tmp_path)
    replace_line(folder / file, line, text)
    with pytest.raises(InputFormatError) as info:
        build(tmp_path, folder)
    error = info.value
    assert (Path(error.where).name, error.line) == (file, line)
    assert expected in error.expected and found in error.found
    assert str(error).startswith(f"{folder / file}:{line}: expected ")
    assert not (tmp_path / "meddra.parquet").exists()


def test_releases_of_different_versions_are_refused(tmp_path):
    copy_release(tmp_path, EN, "MedDRA_26_1_English")
    copy_release(tmp_path, ES, "MedDRA_27_0_Spanish")
    with pytest.raises(ConfigError, match=r"different versions \(26\.1, 27\.0\)"):
        get_source("meddra")([tmp_path], SourceOptions())


def test_two_releases_of_one_language_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="two MedDRA releases for language 'en'"):
        get_source("meddra")([EN, copy_release(tmp_path, EN, "english")], SourceOptions())


def test_folder_without_medascii_is_a_missing_input(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingInputError, match="no MedDRA MedAscii folder"):
        get_source("meddra")([tmp_path / "empty"], SourceOptions())
    folder = copy_release(tmp_path)
    (folder / "pt.asc").unlink()
    with pytest.raises(MissingInputError, match="missing pt.asc"):
        get_source("meddra")([folder], SourceOptions())


def test_unknown_target_lists_the_choices():
    with pytest.raises(UnknownNameError, match="unknown MedDRA target 'soc'; available: llt, pt"):
        get_source("meddra")([EN], SourceOptions(meddra_target="soc"))


def test_cli_build_and_info(tmp_path, capsys):
    out = tmp_path / "meddra.parquet"
    main(["dict", "build", "--source", "meddra", str(MEDDRA), "--out", str(out)])
    assert "wrote" in capsys.readouterr().out
    assert rows(out) == EXPECTED
    main(["dict", "info", str(out), "--json"])
    info = json.loads(capsys.readouterr().out)
    assert (info["names"], info["concepts"], info["non_current_names"], info["hierarchy_rows"]) == (15, 3, 2, 8)
    assert info["by_lang"] == {"en": {"names": 8, "concepts": 3}, "es": {"names": 7, "concepts": 3}}
    assert info["by_term_type"] == {"LLT": {"names": 9, "concepts": 3}, "PT": {"names": 6, "concepts": 3}}


def test_cli_llt_target_and_current_only(tmp_path):
    out = tmp_path / "llt.parquet"
    main(["dict", "build", "--source", "meddra", str(EN), "--out", str(out), "--meddra-target", "llt",
          "--current-only"])
    assert [r[0] for r in rows(out)] == ["10019211", "10028813", "10019974", "10019214", "10019199", "10028817",
                                         "10040566"]


def test_cli_malformed_line_exits_1_and_keeps_the_good_table(tmp_path, capsys):
    out = tmp_path / "meddra.parquet"
    main(["dict", "build", "--source", "meddra", str(EN), "--out", str(out)])
    good = out.read_bytes()
    capsys.readouterr()
    folder = copy_release(tmp_path / "bad")
    replace_line(folder / "llt.asc", 3, "10019199$Head pain$10019211$$")
    with pytest.raises(SystemExit) as exit_info:
        main(["dict", "build", "--source", "meddra", str(folder), "--out", str(out), "--overwrite"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"error: {folder / 'llt.asc'}:3: expected 11 '$'-separated fields")
    assert out.read_bytes() == good  # the earlier table survives the failed build
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "meddra.hierarchy.parquet", "meddra.parquet"]


def test_cli_failed_first_build_leaves_no_file(tmp_path, capsys):
    folder = copy_release(tmp_path / "bad")
    replace_line(folder / "llt.asc", 5, "10028813$Nausea$99999999$$$$$$$Y$$")
    out = tmp_path / "out" / "meddra.parquet"
    with pytest.raises(SystemExit) as exit_info:
        main(["dict", "build", "--source", "meddra", str(folder), "--out", str(out)])
    assert exit_info.value.code == 1
    expected = f"{folder / 'llt.asc'}:5: expected a pt_code listed in pt.asc, found pt_code 99999999"
    assert expected in capsys.readouterr().err
    assert not out.exists() and not list(out.parent.glob("*"))
