"""Concept tables: build, filters, de-duplication, atomic writes, info, merge, and the `dict` CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from linker.cli.main import main
from linker.dictionary import SourceSpec, build_dictionary, describe, merge_tables, read_concept_table
from linker.errors import InputFormatError, LinkerError, MissingInputError, UnknownNameError
from linker.sources import SourceOptions

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
NAMES = FIXTURES / "tsv" / "names.tsv"
MEDIC = FIXTURES / "tsv" / "medic_slice.txt"
HPO = FIXTURES / "obo" / "hp_slice.obo"


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run `linker ARGS` in-process; return (exit code, stdout, stderr)."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def triples(path: Path) -> list[tuple[str, str, str, str]]:
    table = read_concept_table(path).table
    return list(zip(*(table.column(c).to_pylist() for c in ("concept_id", "name", "lang", "term_type"))))


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ---- library -----------------------------------------------------------------------------------

def test_build_writes_rows_and_metadata_filled_while_streaming(tmp_path):
    out = tmp_path / "names.parquet"
    summary = build_dictionary([SourceSpec("tsv", (NAMES,))], out)
    assert (summary.rows, summary.concepts, summary.duplicates_dropped, summary.filtered_out) == (5, 2, 0, 0)
    assert triples(out) == [
        ("C0002170", "Alopecia", "en", "PT"),
        ("C0002170", "Hair loss", "en", "SY"),
        ("C0002170", "Alopecia", "es", "PT"),
        ("C0002170", "Caída del cabello", "es", "SY"),
        ("C0018681", "Headache", "en", "PT"),
    ]
    meta = read_concept_table(out).meta
    assert meta["sources"][0]["name"] == "tsv"
    assert meta["sources"][0]["files"][0]["lines"] == 5  # counted during streaming, written to the footer
    assert meta["options"]["langs"] == []


def test_duplicates_are_dropped_and_the_first_wins(tmp_path):
    second = tmp_path / "more.tsv"
    second.write_text("C0002170\tHair loss\ten\nC0002170\tAlopecia\ten\nC0002170\tBaldness\ten\n", encoding="utf-8")
    out = tmp_path / "both.parquet"
    summary = build_dictionary([SourceSpec("tsv", (NAMES,)), SourceSpec("tsv", (second,))], out)
    assert (summary.rows, summary.duplicates_dropped) == (6, 2)
    rows = triples(out)
    # "Hair loss" came first as a synonym of the first source; the second source's PT copy is dropped.
    assert ("C0002170", "Hair loss", "en", "SY") in rows and ("C0002170", "Hair loss", "en", "PT") not in rows
    assert rows[-1] == ("C0002170", "Baldness", "en", "SY")


def test_lang_filter_and_current_only(tmp_path):
    out = tmp_path / "en.parquet"
    summary = build_dictionary([SourceSpec("tsv", (NAMES,))], out, options=SourceOptions(langs=("en",)))
    assert (summary.rows, summary.filtered_out) == (3, 2)
    assert [r[1] for r in triples(out)] == ["Alopecia", "Hair loss", "Headache"]

    everything = build_dictionary([SourceSpec("obo", (HPO,))], tmp_path / "all.parquet")
    current = build_dictionary(
        [SourceSpec("obo", (HPO,))], tmp_path / "current.parquet", options=SourceOptions(current_only=True)
    )
    assert everything.rows - current.rows == 1 == current.filtered_out
    assert "Cephalalgia" not in {r[1] for r in triples(tmp_path / "current.parquet")}
    assert describe(tmp_path / "all.parquet")["non_current_names"] == 1


def test_failed_build_leaves_the_good_table_and_no_temporary_files(tmp_path):
    out = tmp_path / "names.parquet"
    build_dictionary([SourceSpec("tsv", (NAMES,))], out)
    before = out.read_bytes()
    bad = tmp_path / "bad.tsv"
    bad.write_text("C0002170\tAlopecia\n" * 70_000 + "C0018681\n", encoding="utf-8")  # fails after a row group
    with pytest.raises(InputFormatError, match=r"bad\.tsv:70001"):
        build_dictionary([SourceSpec("tsv", (bad,))], out, overwrite=True)
    assert out.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_empty_result_is_an_error_and_writes_nothing(tmp_path):
    out = tmp_path / "none.parquet"
    with pytest.raises(LinkerError, match="no concept names left after reading and filtering obo"):
        build_dictionary([SourceSpec("obo", (HPO,))], out, options=SourceOptions(langs=("xx",)))
    assert not out.exists() and leftovers(tmp_path) == []


def test_unknown_source_missing_path_and_unreadable_table(tmp_path):
    with pytest.raises(UnknownNameError, match=r"unknown source 'nope'; available: default, icd10, icdo, "):
        build_dictionary([SourceSpec("nope", ())], tmp_path / "x.parquet")
    with pytest.raises(MissingInputError, match=r"absent\.tsv: no such file or folder \(source tsv\)"):
        build_dictionary([SourceSpec("tsv", (tmp_path / "absent.tsv",))], tmp_path / "x.parquet")
    with pytest.raises(MissingInputError, match="build one with `linker dict build`"):
        read_concept_table(tmp_path / "absent.parquet")
    with pytest.raises(InputFormatError, match="expected a parquet concept table"):
        read_concept_table(NAMES)
    with pytest.raises(LinkerError, match="no source given"):
        build_dictionary([], tmp_path / "x.parquet")


def test_merge_keeps_the_first_table_on_duplicates(tmp_path):
    build_dictionary([SourceSpec("tsv", (NAMES,))], tmp_path / "a.parquet")
    other = tmp_path / "b.tsv"
    other.write_text("C0018681\tHeadache\ten\nC0018681\tCephalgia\ten\n", encoding="utf-8")
    build_dictionary([SourceSpec("tsv", (other,))], tmp_path / "b.parquet")
    summary = merge_tables([tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "ab.parquet")
    assert (summary.rows, summary.concepts, summary.duplicates_dropped) == (6, 2, 1)
    assert triples(tmp_path / "ab.parquet")[-2:] == [
        ("C0018681", "Headache", "en", "PT"),
        ("C0018681", "Cephalgia", "en", "SY"),
    ]
    meta = read_concept_table(tmp_path / "ab.parquet").meta
    assert [Path(m["path"]).name for m in meta["merged_from"]] == ["a.parquet", "b.parquet"]


# ---- CLI ---------------------------------------------------------------------------------------

def test_cli_build_info_and_json(tmp_path, capsys):
    out = tmp_path / "medic.parquet"
    code, stdout, _ = cli(capsys, "dict", "build", "--source", "tsv", MEDIC, "--out", out)
    assert code == 0
    assert stdout.startswith(f"wrote {out}: 46 names of 5 concepts (0 duplicates dropped, 0 filtered out) in ")

    code, stdout, _ = cli(capsys, "dict", "info", out, "--samples", "2")
    assert code == 0
    lines = stdout.splitlines()
    assert lines[0] == f"{out}: 46 names, 5 concepts, 0 non-current names, 0 hierarchy rows"
    assert "  medic                           46           5" in lines
    assert "  PT                               5           5" in lines
    assert "  SY                              41           3" in lines
    assert lines[-2] == "  C565588\ten\tPT\tEpidermolysis Bullosa With Diaphragmatic Hernia"

    code, stdout, _ = cli(capsys, "dict", "info", out, "--samples", "0")
    assert code == 0 and "sample rows" not in stdout

    code, stdout, _ = cli(capsys, "dict", "info", out, "--json")
    info = json.loads(stdout)
    assert (info["names"], info["concepts"]) == (46, 5)
    assert info["by_lang"] == {"en": {"names": 46, "concepts": 5}}
    assert info["meta"]["sources"][0]["files"][0]["format"] == "pipe"


def test_cli_info_widens_its_columns_for_long_term_types(tmp_path, capsys):
    out = tmp_path / "hpo.parquet"
    build_dictionary([SourceSpec("obo", (HPO,))], out)
    code, stdout, _ = cli(capsys, "dict", "info", out)
    assert code == 0
    lines = stdout.splitlines()
    assert "  SY_EXACT/allelic_requirement            1           1" in lines
    assert "  PT                                      3           3" in lines
    assert "by term type                          names    concepts" in lines


def test_cli_lang_option_accepts_lists(tmp_path, capsys):
    out = tmp_path / "names.parquet"
    code, stdout, _ = cli(capsys, "dict", "build", "-s", "tsv", NAMES, "-o", out, "--lang", "en,xx", "--lang", "de")
    # names without a language take the first --lang value (en), so Headache stays
    assert code == 0 and "3 names of 2 concepts" in stdout and "2 filtered out" in stdout
    assert read_concept_table(out).meta["options"]["langs"] == ["en", "xx", "de"]


def test_cli_errors_are_one_line_and_exit_1(tmp_path, capsys):
    code, stdout, stderr = cli(capsys, "dict", "build", "--source", "nope", "--out", tmp_path / "x.parquet")
    assert code == 1 and stdout == ""
    assert stderr.count("\n") == 1
    assert stderr.startswith("error: unknown source 'nope'; available: default, icd10, icdo, ")

    code, _, stderr = cli(capsys, "dict", "build", "--source", "tsv", tmp_path / "absent.tsv", "--out", tmp_path / "x.parquet")
    assert code == 1 and stderr == f"error: {tmp_path / 'absent.tsv'}: no such file or folder (source tsv)\n"

    code, _, stderr = cli(capsys, "dict", "build", "-s", "obo", HPO, "-o", tmp_path / "x.parquet", "--lang", "xx")
    assert code == 1 and stderr.startswith("error: no concept names left") and stderr.count("\n") == 1
    assert not (tmp_path / "x.parquet").exists() and leftovers(tmp_path) == []

    bad = tmp_path / "bad.tsv"
    bad.write_text("C0002170\n", encoding="utf-8")
    code, _, stderr = cli(capsys, "dict", "build", "-s", "tsv", bad, "-o", tmp_path / "x.parquet")
    assert code == 1 and stderr == f"error: {bad}:1: expected concept_id<TAB>name[<TAB>lang], found 'C0002170'\n"

    code, _, stderr = cli(capsys, "dict", "info", tmp_path / "absent.parquet")
    assert code == 1 and "no such concept table" in stderr


def test_cli_merge_and_sources(tmp_path, capsys):
    cli(capsys, "dict", "build", "-s", "tsv", NAMES, "-o", tmp_path / "a.parquet")
    cli(capsys, "dict", "build", "-s", "tsv", MEDIC, "-o", tmp_path / "b.parquet")
    code, stdout, _ = cli(capsys, "dict", "merge", tmp_path / "a.parquet", tmp_path / "b.parquet", "-o", tmp_path / "ab.parquet")
    assert code == 0 and stdout == f"wrote {tmp_path / 'ab.parquet'}: 51 names of 7 concepts\n"
    assert pq.read_metadata(tmp_path / "ab.parquet").num_rows == 51

    code, stdout, _ = cli(capsys, "dict", "sources")
    assert code == 0
    assert {"default", "icd10", "icdo", "obo", "tsv"} <= set(stdout.split())


@pytest.mark.slow  # two interpreter start-ups that import every CLI group (about 4 s)
def test_python_dash_m_linker_help():
    result = subprocess.run(
        [sys.executable, "-m", "linker", "dict", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    for command in ("build", "info", "merge", "sources"):
        assert command in result.stdout
    result = subprocess.run([sys.executable, "-m", "linker", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "dict" in result.stdout
