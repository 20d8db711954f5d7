"""Batch normalisation: JSONL, brat and TAC-2017/ADE-Eval XML round trips on tiny real-format fixtures."""

from __future__ import annotations

import io
import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linker.cli.main import main
from linker.errors import ConfigError, InputFormatError, LinkerError, MissingInputError, UnknownNameError
from linker.fileio import MARKER
from linker.link import Linker
from linker.formats.ade_xml import read_ade_xml
from linker.formats.brat import read_brat
from linker.normalize import normalize_ade_xml, normalize_brat, normalize_jsonl, normalize_path

from fixtures.normalize.normalize_tables import build_indexes  # tiny MedDRA-like and HPO-like concept tables

FIX = Path(__file__).parent / "fixtures" / "normalize"


def run_cli(args: list[str]) -> int:
    """Exit code of `linker ARGS` run in-process (main returns on success, exits on failure)."""
    try:
        main(args)
    except SystemExit as exc:
        return exc.code or 0
    return 0


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, Path]:
    return build_indexes(tmp_path_factory.mktemp("indexes"))


@pytest.fixture(scope="module")
def meddra(indexes) -> Linker:
    return Linker.load(indexes["meddra"])


@pytest.fixture(scope="module")
def hpo(indexes) -> Linker:
    return Linker.load(indexes["hpo"])


# ----------------------------------------------------------------------------- JSONL


def test_jsonl_round_trip_keeps_fields_and_ranks_candidates(meddra, tmp_path):
    out = tmp_path / "out.jsonl"
    summary = normalize_jsonl(meddra, FIX / "spans.jsonl", out, k=2)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert (summary.mentions, summary.linked) == (4, 3)
    assert [r.get("id") for r in records] == ["s1", 2, None, None]
    assert records[2]["note"] == "kept" and records[2]["lang"] == "es"
    top = [[c["concept_id"] for c in r["candidates"]] for r in records]
    assert top == [["10001760", "10019211"], ["10019211", "10028813"], ["10028813", "10001760"], []]
    assert [r["nil"] for r in records] == [False, False, False, True]
    hair = records[0]["candidates"][0]
    assert hair | {"hierarchy": None} == {
        "concept_id": "10001760", "preferred_name": "Alopecia", "matched_name": "Hair loss", "score": 1.0,
        "lang": "en", "source": "meddra", "term_id": "10019045", "term_type": "LLT", "hierarchy": None,
        "retriever_score": 1.0,
    }
    assert hair["hierarchy"] == [{
        "hlt_code": "10001769", "hlt_name": "Alopecias", "hlgt_code": "10014982",
        "hlgt_name": "Epidermal and dermal conditions", "soc_code": "10040785",
        "soc_name": "Skin and subcutaneous tissue disorders", "primary_soc": True,
    }]
    # Spanish span restricted to Spanish names: the Spanish PT name is shown.
    assert records[2]["candidates"][0]["preferred_name"] == "Náuseas"
    scores = [c["score"] for c in records[1]["candidates"]]
    assert scores == sorted(scores, reverse=True)


def test_jsonl_primary_soc_path_first(meddra, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "dizziness"}\n')
    normalize_jsonl(meddra, src, tmp_path / "out.jsonl", k=1)
    [record] = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    paths = record["candidates"][0]["hierarchy"]
    assert [(p["soc_code"], p["primary_soc"]) for p in paths] == [("10029205", True), ("10013993", False)]


def test_jsonl_language_missing_from_index_links_against_all(meddra, tmp_path, caplog):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "Nausea", "lang": "de"}\n{"text": "Nausea", "lang": "es"}\n')
    normalize_jsonl(meddra, src, tmp_path / "out.jsonl", k=1)
    records = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r["candidates"][0]["matched_name"], r["candidates"][0]["lang"]) for r in records] == [
        ("Nausea", "en"), ("Náuseas", "es"),
    ]
    assert "index has no names in de" in caplog.text


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"text": "nausea"', "invalid JSON"),
        ('["nausea"]', "expected a JSON object"),
        ('{"id": 1}', "no field 'text'"),
        ('{"text": 5}', "text of type int"),
        ('{"text": "  "}', "expected a non-empty text"),
        ('{"text": "nausea", "lang": 3}', "lang 3"),
        ('{"text": "nausea", "id": true}', "id True"),
    ],
)
def test_jsonl_bad_line_names_file_and_line_and_writes_nothing(meddra, tmp_path, line, message):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "nausea"}\n' + line + "\n")
    out = tmp_path / "out.jsonl"
    with pytest.raises(InputFormatError, match=message) as info:
        normalize_jsonl(meddra, src, out)
    assert str(info.value).startswith(f"{src}:2: expected")
    assert not out.exists() and list(tmp_path.iterdir()) == [src]


def test_cli_jsonl_stdin_to_stdout(indexes, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"id": "a", "text": "Itching"}\n')))
    assert run_cli(["normalize", "--index", str(indexes["meddra"]), "--input", "-", "--format", "jsonl",
                    "--output", "-"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    record = json.loads(line)
    assert record["id"] == "a"
    assert [(c["concept_id"], c["term_id"], c["term_type"]) for c in record["candidates"]] == [
        ("10037087", "10023084", "LLT")
    ]


def test_cli_bad_jsonl_exit_1_one_line(indexes, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert run_cli(["normalize", "--index", str(indexes["meddra"]), "--input", str(FIX / "bad" / "spans_bad.jsonl"),
                    "--format", "jsonl", "--output", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {FIX / 'bad' / 'spans_bad.jsonl'}:2: expected a non-empty text, found text '   '"]
    assert not out.exists()


def test_cli_unknown_format_and_stdin_for_brat(indexes, tmp_path, capsys):
    assert run_cli(["normalize", "--index", str(indexes["meddra"]), "--input", str(FIX / "spans.jsonl"),
                    "--format", "csv", "--output", str(tmp_path / "o")]) == 1
    assert "unknown input format 'csv'; available: ade-xml, brat, jsonl" in capsys.readouterr().err
    assert run_cli(["normalize", "--index", str(indexes["meddra"]), "--input", "-", "--format", "brat",
                    "--output", str(tmp_path / "o")]) == 1
    assert "`-` (stdin/stdout) works with --format jsonl only" in capsys.readouterr().err


# ----------------------------------------------------------------------------- brat


def test_brat_folder_round_trip(meddra, tmp_path):
    out = tmp_path / "out"
    summary = normalize_brat(meddra, FIX / "brat", out)
    assert (summary.documents, summary.mentions, summary.linked) == (2, 6, 6)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        MARKER, "annotation.conf", "doc1.ann", "doc1.txt", "sub/doc2.ann",
    ]
    assert (out / "doc1.txt").read_bytes() == (FIX / "brat" / "doc1.txt").read_bytes()
    original = (FIX / "brat" / "doc1.ann").read_text().splitlines()
    written = (out / "doc1.ann").read_text().splitlines()
    assert written[: len(original)] == original  # every input line untouched, in order
    assert written[len(original):] == [
        "N2\tReference T1 meddra:10001760\tAlopecia",
        "N3\tReference T2 meddra:10019211\tHeadache",
        "N4\tReference T3 meddra:10001760\tAlopecia",  # discontinuous span "Hair ... loss"
        "N5\tReference T4 meddra:10028813\tNausea",
    ]
    assert (out / "sub" / "doc2.ann").read_text().splitlines()[2:] == [
        "N1\tReference T1 meddra:10013573\tDizziness",
        "N2\tReference T2 meddra:10037087\tPruritus",
    ]


def test_brat_single_file_db_names(hpo, tmp_path):
    out = tmp_path / "one.ann"
    normalize_brat(hpo, FIX / "brat" / "doc1.ann", out)
    assert out.read_text().splitlines()[8:] == [
        "N2\tReference T1 hpo:HP:0001596\tAlopecia",
        "N3\tReference T2 hpo:HP:0002315\tHeadache",
        "N4\tReference T3 hpo:HP:0001596\tAlopecia",
        "N5\tReference T4 hpo:HP:0002018\tNausea",
    ]
    assert (tmp_path / "one.txt").read_text() == (FIX / "brat" / "doc1.txt").read_text()
    normalize_brat(hpo, FIX / "brat" / "sub" / "doc2.ann", tmp_path / "two.ann", db="HPO")
    assert (tmp_path / "two.ann").read_text().splitlines()[2] == "N1\tReference T1 HPO:HP:0002321\tVertigo"


@pytest.mark.parametrize(("name", "message"), [
    ("spaces.ann", "spaces.ann:2: expected a brat annotation line"),
    ("offsets.ann", "offsets.ann:2: expected a text-bound line"),
])
def test_brat_malformed_file_in_folder_leaves_previous_output(meddra, tmp_path, name, message):
    src = tmp_path / "in"
    shutil.copytree(FIX / "brat", src)
    shutil.copyfile(FIX / "bad" / name, src / "sub" / name)
    out = tmp_path / "out"
    out.mkdir()
    (out / "previous.ann").write_text("kept\n")
    (out / MARKER).write_text("{}\n")  # as an earlier run left it
    with pytest.raises(InputFormatError, match=message):
        normalize_brat(meddra, src, out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "previous.ann"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]  # no temporary folder left behind


def test_existing_output_folder_replaced_only_with_overwrite_and_only_when_ours(meddra, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    for fn, src in ((normalize_brat, FIX / "brat"), (normalize_ade_xml, FIX / "xml")):
        for overwrite in (False, True):  # not ours: refused even with --overwrite
            with pytest.raises(ConfigError, match="is a folder that linker did not write"):
                fn(meddra, src, out, overwrite=overwrite)
        assert [p.name for p in out.iterdir()] == ["notes.txt"]
    ours = tmp_path / "ours"
    normalize_brat(meddra, FIX / "brat", ours)  # a new folder needs no flag
    with pytest.raises(ConfigError, match="ours exists; pass --overwrite"):
        normalize_ade_xml(meddra, FIX / "xml", ours)
    normalize_ade_xml(meddra, FIX / "xml", ours, overwrite=True)
    assert sorted(p.name for p in ours.iterdir()) == [MARKER, "OTHERDRUG.xml", "TESTDRUG.xml"]


def test_brat_options_checked(meddra, tmp_path):
    with pytest.raises(ConfigError, match="use --k 1"):
        normalize_brat(meddra, FIX / "brat", tmp_path / "o", k=3)
    with pytest.raises(MissingInputError, match="no .ann files"):
        normalize_brat(meddra, FIX / "xml", tmp_path / "o")
    with pytest.raises(ConfigError, match="is the input"):
        normalize_path(meddra, FIX / "brat", FIX / "brat", fmt="brat")
    with pytest.raises(UnknownNameError):
        normalize_path(meddra, FIX / "brat", tmp_path / "o", fmt="conll")


# ----------------------------------------------------------------------------- TAC 2017 / ADE Eval XML


def _reactions(path: Path) -> list[tuple]:
    root = ET.parse(path).getroot()
    out = []
    for reaction in root.find("Reactions"):
        [norm] = list(reaction)  # exactly one Normalization per reaction
        out.append((reaction.get("id"), reaction.get("str"), norm.get("id"), norm.get("meddra_pt"),
                    norm.get("meddra_pt_id"), norm.get("meddra_llt_id")))
    return out


def test_tac_label_round_trip(meddra, tmp_path):
    out = tmp_path / "out"
    summary = normalize_ade_xml(meddra, FIX / "xml", out)
    assert (summary.documents, summary.mentions, summary.linked) == (2, 8, 8)
    assert _reactions(out / "TESTDRUG.xml") == [
        ("AR1", "nausea", "AR1.N1", "Nausea", "10028813", None),  # M1 and M6 ("Nausea") share it
        ("AR2", "hair loss", "AR2.N1", "Alopecia", "10001760", "10019045"),  # M2 and discontinuous M7
        ("AR3", "head pain", "AR3.N1", "Headache", "10019211", "10019198"),
        ("AR4", "headache", "AR4.N1", "Headache", "10019211", None),
        # M9 "Dizziness" is Negated (RL2): no reaction of this drug; M4 (Severity) is no reaction.
    ]
    before, after = ET.parse(FIX / "xml" / "TESTDRUG.xml").getroot(), ET.parse(out / "TESTDRUG.xml").getroot()
    assert after.tag == "Label" and after.attrib == {"drug": "TESTDRUG", "track": "TAC2017_ADR"}
    assert [s.text for s in after.find("Text")] == [s.text for s in before.find("Text")]
    assert [m.attrib for m in after.find("Mentions")] == [m.attrib for m in before.find("Mentions")]
    assert [r.attrib for r in after.find("Relations")] == [r.attrib for r in before.find("Relations")]


def test_ade_eval_submission_label_keeps_ignored_regions(meddra, tmp_path):
    out = tmp_path / "OTHERDRUG.xml"
    normalize_ade_xml(meddra, FIX / "xml" / "OTHERDRUG.xml", out)
    root = ET.parse(out).getroot()
    assert root.tag == "SubmissionLabel"
    assert [r.attrib for r in root.find("IgnoredRegions")] == [
        {"name": "table", "section": "S1", "start": "21", "len": "41"}
    ]
    assert [m.get("id") for m in root.find("Mentions")] == ["M1", "M2"]
    assert _reactions(out) == [
        ("AR1", "itching", "AR1.N1", "Pruritus", "10037087", "10023084"),
        ("AR2", "dizziness", "AR2.N1", "Dizziness", "10013573", None),
    ]
    assert root.find("Reactions/Reaction/Normalization").get("meddra_llt") == "Itching"


@pytest.mark.parametrize(("name", "message"), [
    ("wrong_str.xml", r"wrong_str.xml:14: expected str= equal to the section text at the offsets \('head pain'\)"),
    ("truncated.xml", r"truncated.xml:22: expected well-formed XML, found no element found"),
    ("out_of_range.xml", r"out_of_range.xml:18: expected offsets inside section S2"),
])
def test_xml_malformed_names_line_and_writes_nothing(meddra, tmp_path, name, message):
    src = tmp_path / "in"
    shutil.copytree(FIX / "xml", src)
    shutil.copyfile(FIX / "bad" / name, src / name)
    with pytest.raises(InputFormatError, match=message):
        normalize_ade_xml(meddra, src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_xml_needs_a_meddra_index(hpo, tmp_path):
    with pytest.raises(ConfigError, match="writes MedDRA PT codes"):
        normalize_ade_xml(hpo, FIX / "xml", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_xml(indexes, tmp_path, capsys):
    out = tmp_path / "out"
    main_args = ["normalize", "--index", str(indexes["meddra"]), "--input", str(FIX / "xml"), "--format", "ade-xml",
                 "--output", str(out)]
    assert run_cli(main_args) == 0
    assert "normalised 8 spans (8 linked) in 2 document(s)" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "OTHERDRUG.xml", "TESTDRUG.xml"]


# ----------------------------------------------------------------------------- fuzz: readers never crash


def _garble(data: st.DataObject, text: str) -> str:
    """Delete, duplicate or replace a few random slices of a real fixture."""
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 12)))
        text = text[:i] + data.draw(st.sampled_from(["", text[i:j] * 2, data.draw(st.text(max_size=6))])) + text[j:]
    return text


FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzz_brat_reader_and_writer(meddra, tmp_path, data):
    src = tmp_path / "fuzz.ann"
    src.write_text(_garble(data, (FIX / "brat" / "doc1.ann").read_text()), encoding="utf-8")
    out = tmp_path / "fuzz_out" / "o.ann"
    shutil.rmtree(out.parent, ignore_errors=True)
    try:
        read_brat(src)
        normalize_brat(meddra, src, out)
    except LinkerError:
        assert not out.parent.exists() or not any(out.parent.iterdir())
    else:
        lines = read_brat(src).lines
        assert out.read_text(encoding="utf-8").split("\n")[: len(lines)] == list(lines)


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzz_xml_reader_and_writer(meddra, tmp_path, data):
    name = data.draw(st.sampled_from(["TESTDRUG.xml", "OTHERDRUG.xml"]))
    src = tmp_path / name
    src.write_text(_garble(data, (FIX / "xml" / name).read_text()), encoding="utf-8")
    out = tmp_path / "fuzz_out" / name
    shutil.rmtree(out.parent, ignore_errors=True)
    try:
        read_ade_xml(src)
        normalize_ade_xml(meddra, src, out)
    except LinkerError:
        assert not out.parent.exists() or not any(out.parent.iterdir())
    else:
        assert ET.parse(out).getroot().find("Reactions") is not None


@pytest.mark.slow
@FUZZ
@given(raw=st.binary(max_size=300))
def test_fuzz_random_bytes(meddra, tmp_path, raw):
    for suffix, reader in ((".ann", read_brat), (".xml", read_ade_xml)):
        src = tmp_path / f"random{suffix}"
        src.write_bytes(raw)
        try:
            reader(src)
        except LinkerError:
            pass


# ----------------------------------------------------------------------------- real data


@pytest.mark.integration
@pytest.mark.slow
def test_cantemist_dev1_brat_folder(shared_data, tmp_path):
    """All 250 Cantemist dev1 documents: every line kept, one ICD-O reference per text-bound annotation."""
    import re
    import zipfile

    from linker.dictionary import SourceSpec, build_dictionary
    from linker.index import build_index
    from linker.index.tfidf import PRESETS

    src = tmp_path / "dev1"
    with zipfile.ZipFile(shared_data / "cantemist" / "dev1.zip") as archive:
        archive.extractall(src)
    build_dictionary([SourceSpec("icdo", (shared_data / "cantemist" / "valid-codes.tsv",))], tmp_path / "icdo.parquet")
    # char 1-2-grams give every mention a candidate; the default trigrams none to 140 of them
    build_index(tmp_path / "icdo.parquet", kind="tfidf", out=tmp_path / "icdo", config=PRESETS["medical-crossing"])
    summary = normalize_brat(Linker.load(tmp_path / "icdo"), src, tmp_path / "out")
    assert (summary.documents, summary.mentions, summary.linked) == (250, 3341, 3341)
    reference = re.compile(r"^N\d+\tReference (T\d+) icdo3:\d{4}/\d+\t\S.*$")
    for ann in sorted(src.rglob("*.ann")):
        original = ann.read_text(encoding="utf-8").splitlines()
        written = (tmp_path / "out" / ann.relative_to(src)).read_text(encoding="utf-8").splitlines()
        assert written[: len(original)] == original
        targets = [reference.match(line).group(1) for line in written[len(original):]]
        assert targets == [line.split("\t")[0] for line in original if line.startswith("T")]
        assert (tmp_path / "out" / ann.relative_to(src)).with_suffix(".txt").read_bytes() == ann.with_suffix(".txt").read_bytes()


def test_xml_unknown_encoding_is_a_format_error(tmp_path):
    src = tmp_path / "label.xml"
    src.write_text('<?xml version="1.0" encoding="TF-8"?>\n<Label drug="X" track="T"><Text/></Label>\n')
    with pytest.raises(InputFormatError, match=r"label.xml:1: expected an XML declaration with a known encoding"):
        read_ade_xml(src)


# ----------------------------------------------------------------------------- abbreviations


def test_expand_abbreviations_defined_in_brat_and_xml_documents(indexes, meddra, tmp_path):
    text = "Patients reported itching of the palms (IP) and nausea. IP resolved."
    folder = tmp_path / "brat"
    folder.mkdir()
    (folder / "d.txt").write_text(text)
    start = text.rindex("IP")
    (folder / "d.ann").write_text(f"T1\tAdverseEvent {start} {start + 2}\tIP\n")
    normalize_brat(meddra, folder, tmp_path / "plain")
    assert "meddra:10001760" in (tmp_path / "plain" / "d.ann").read_text()  # "IP" alone: the n-grams' best guess
    assert run_cli(["normalize", "--index", str(indexes["meddra"]), "--input", str(folder), "--format", "brat",
                    "--output", str(tmp_path / "expanded"), "--expand-abbreviations"]) == 0
    written = (tmp_path / "expanded" / "d.ann").read_text().splitlines()
    assert written == [f"T1\tAdverseEvent {start} {start + 2}\tIP", "N1\tReference T1 meddra:10037087\tPruritus"]

    section = "Nausea and itching of the palms (IP) were common. IP was mild."
    start = section.rindex("IP")
    (tmp_path / "L.xml").write_text(
        f'<Label drug="X" track="TAC2017_ADR"><Text><Section id="S1" name="ar">{section}</Section></Text>'
        f'<Mentions><Mention id="M1" section="S1" type="AdverseReaction" start="{start}" len="2" str="IP" />'
        "</Mentions><Relations /><Reactions /></Label>")
    normalize_ade_xml(meddra, tmp_path / "L.xml", tmp_path / "L.out.xml", expand=True)
    reaction = ET.parse(tmp_path / "L.out.xml").getroot().find("Reactions/Reaction")
    assert reaction.get("str") == "ip"  # the file keeps the mention (lower-cased, as every Reaction)
    assert reaction.find("Normalization").get("meddra_pt_id") == "10037087"


def test_expand_abbreviations_needs_documents(meddra, tmp_path):
    with pytest.raises(ConfigError, match="--expand-abbreviations needs the documents"):
        normalize_path(meddra, FIX / "spans.jsonl", tmp_path / "o.jsonl", fmt="jsonl", expand_abbreviations=True)
