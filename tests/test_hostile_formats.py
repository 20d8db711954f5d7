"""Hostile inputs and outputs of the formats and terminology sources (issue 34, cases 6, 8 and 9).

Case 6, small inputs that took unbounded memory: every reader goes through `linker.fileio`'s
bounded layer with `ReadLimits`, so a huge line (plain, gzip-decompressed or inside a zip member), a
huge brat span or a document past the cap is one InputFormatError naming file (member) and line,
after reading at most the cap. Caps are lowered here so that the cases stay small and fast; the
memory each case takes is measured with tracemalloc.

Case 8, output injection: every writer either refuses (a LinkerError naming the field) or writes
what its own reader reads back unchanged; Hypothesis throws control characters, CR, LF, NUL,
vertical tabs, line separators, surrogates and the formats' separators at each.

Case 9 (the reading half): a truncated or mislabelled .gz is one error naming the file.
"""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from linker.datasets import load_dataset
from linker.errors import ConfigError, InputFormatError, LinkerError
from linker.fileio import iter_lines
from linker.formats import ReadLimits, check_identifier, clean_label, read_document
from linker.formats.ade_xml import read_ade_xml, write_ade_xml, write_reactions
from linker.formats.brat import brat_lines, brat_sources, parse_brat, read_brat, read_source, write_brat
from linker.formats.codiesp import CodiespRow, read_codiesp, write_codiesp
from linker.formats.jsonl import jsonl_source, read_jsonl, write_jsonl
from linker.formats.mention_lists import BiosynRow, ListRow, read_biosyn, read_id_list, write_biosyn, write_id_list
from linker.formats.pubtator import PubtatorAnnotation, read_pubtator, write_pubtator
from linker.sources import SourceOptions, get_source

SMALL = ReadLimits(max_line_bytes=10_000, max_document_bytes=100_000)
MiB = 1 << 20


def peak_bytes(action) -> tuple[BaseException | None, int]:
    """(the exception `action` raised, or None; the peak of Python memory allocated meanwhile)."""
    tracemalloc.start()
    try:
        action()
        error = None
    except Exception as exc:  # noqa: BLE001 - returned for the caller to assert on
        error = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return error, peak


def one_line(error: BaseException | None) -> str:
    assert isinstance(error, InputFormatError), repr(error)
    assert "\n" not in str(error)
    return str(error)


# ----------------------------------------------------------------------------- case 6: brat


def test_brat_zip_with_a_30m_character_span_is_refused_at_the_line_cap(tmp_path):
    """The probe's 58 KB zip: one 30M-character span took `eval` to 2.4 GB."""
    archive = tmp_path / "bomb.zip"
    span = "a" * 30_000_000
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("d.txt", span)
        z.writestr("d.ann", f"T1\tAE 0 {len(span)}\t{span}\n")
    del span
    assert archive.stat().st_size < 200_000
    error, peak = peak_bytes(lambda: load_dataset(f"brat:{archive}"))
    assert one_line(error).startswith(f"{archive}!d.ann:1: expected lines of at most 1,048,576 bytes")
    assert "--max-line-bytes" in str(error)
    assert peak < 150 * MiB  # the two members, read within the document cap; never the span's work


def test_brat_ann_line_over_the_cap_is_refused_by_default(tmp_path):
    """A 3 MB .ann line used to pass: the 1 MiB line cap did not apply to brat."""
    (tmp_path / "d.ann").write_text("T1\tAE 0 1\tx\n#1\tAnnotatorNotes T1\t" + "n" * (3 * MiB) + "\n")
    with pytest.raises(InputFormatError, match=r"d\.ann:2: expected lines of at most 1,048,576 bytes, found a longer line"):
        read_brat(tmp_path / "d.ann")
    with pytest.raises(InputFormatError, match=r"d\.ann:2: expected lines of at most 10,000 bytes"):
        read_brat(tmp_path / "d.ann", limits=ReadLimits(max_line_bytes=10_000))


def test_brat_span_longer_than_the_line_cap_is_refused(tmp_path):
    text = "b" * 20_000
    (tmp_path / "d.txt").write_text(text)
    (tmp_path / "d.ann").write_text(f"T1\tAE 0 20000\t{text}\n")
    assert read_brat(tmp_path / "d.ann").entities[0].end == 20_000  # within the default cap
    with pytest.raises(InputFormatError, match=r"d\.ann:1: expected lines of at most 10,000 bytes"):
        read_brat(tmp_path / "d.ann", limits=SMALL)


def test_brat_repeated_fragments_do_not_build_their_joined_text():
    """A 20 KB line naming one 1M-character fragment 1,000 times would join 1 GB to compare it."""
    text = "c" * 1_000_000
    line = "T1\tAE " + ";".join(["0 1000000"] * 1000) + "\tc"
    error, peak = peak_bytes(lambda: parse_brat("d.ann", line.encode(), text))
    assert one_line(error).startswith("d.ann:1: expected the span text equal to the .txt at its offsets")
    assert peak < 20 * MiB


def test_brat_zip_member_decompressing_past_the_cap_is_refused(tmp_path):
    archive = tmp_path / "z.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("a/d.ann", "T1\tAE 0 1\tx\n")
        z.writestr("a/d.txt", "x" * 5_000_000)
    [source] = brat_sources(archive, limits=SMALL)
    error, peak = peak_bytes(lambda: read_source(source))
    assert one_line(error).startswith(f"{archive}!a/d.txt: expected a document of at most 100,000 bytes")
    assert peak < 2 * MiB


def _patch_size(archive: Path, declared: int) -> None:
    """Rewrite the uncompressed size of a one-member zip in both headers: a header that lies."""
    data = bytearray(archive.read_bytes())
    central = data.index(b"PK\x01\x02")
    data[22:26] = data[central + 24:central + 28] = declared.to_bytes(4, "little")
    archive.write_bytes(bytes(data))


def test_brat_zip_header_that_understates_the_size_is_one_error(tmp_path):
    archive = tmp_path / "liar.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("d.ann", "T1\tAE 0 1\tx\n" + "#1\tnote\t" + "y" * 50_000 + "\n")
    _patch_size(archive, 100)
    [source] = brat_sources(archive, limits=SMALL)
    error, peak = peak_bytes(lambda: read_source(source))
    assert one_line(error).startswith(f"{archive}!d.ann: expected a valid compressed stream, found corrupt data")
    assert peak < 2 * MiB


def test_corrupt_zip_is_one_error(tmp_path):
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("d.ann", "T1\tAE 0 1\tx\n" * 100)
    data = bytearray(archive.read_bytes())
    data[40:60] = b"\xff" * 20  # inside the deflated data of the member
    archive.write_bytes(bytes(data))
    [source] = brat_sources(archive)
    with pytest.raises(InputFormatError, match=r"bad\.zip!d\.ann: expected a valid compressed stream"):
        read_source(source)


# ----------------------------------------------------------------------------- case 6: gzip and every line reader


def gz_with_one_huge_line(path: Path, prefix: bytes, size: int) -> Path:
    """A small .gz whose first line decompresses to `size` bytes (members of 1 MiB, so writing it is quick)."""
    member = gzip.compress(b"a" * MiB, compresslevel=9)
    with path.open("wb") as out:
        out.write(gzip.compress(prefix))
        for _ in range(size // MiB):
            out.write(member)
        out.write(gzip.compress(b"\n"))
    return path


def test_tsv_gz_with_one_huge_line_is_refused_in_bounded_memory(tmp_path):
    """The probe's 1 MB .tsv.gz holding a 1 GiB line: `dict build` at 8.4 GB, then bad_alloc."""
    path = gz_with_one_huge_line(tmp_path / "names.tsv.gz", b"C1\t", 64 * MiB)
    assert path.stat().st_size < 300_000
    output = get_source("tsv")([path], SourceOptions())
    error, peak = peak_bytes(lambda: list(output.names))
    assert one_line(error).startswith(f"{path}:1: expected lines of at most 1,048,576 bytes, found a longer line")
    assert peak < 8 * MiB
    with pytest.raises(InputFormatError, match=r"names\.tsv\.gz:1: expected lines of at most 10,000 bytes"):
        list(get_source("tsv")([path], SourceOptions(limits=SMALL)).names)


def test_dict_build_cli_on_a_1_gib_line_fails_in_one_line_with_bounded_rss(tmp_path):
    """The probe itself, end to end: exit 1, one `error:` line, the process far below 8.4 GB."""
    import subprocess
    import sys

    from conftest import ROOT

    path = gz_with_one_huge_line(tmp_path / "names.tsv.gz", b"C1\t", 1024 * MiB)
    # VmHWM, not ru_maxrss: Linux carries the forking parent's peak (pytest's, ~1 GB in a full run) into a
    # child's ru_maxrss across exec, while VmHWM is the new process's own peak.
    probe = ("import re, sys\nfrom linker.cli.main import main\ntry:\n    main(sys.argv[1:])\nfinally:\n"
             "    status = open('/proc/self/status').read()\n"
             "    print(int(re.search(r'VmHWM:\\s+(\\d+)', status).group(1)) // 1024, flush=True)\n")
    run = subprocess.run([sys.executable, "-c", probe, "dict", "build", "--source", "tsv", str(path),
                          "--out", str(tmp_path / "out.parquet")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        f"error: {path}:1: expected lines of at most 1,048,576 bytes, found a longer line "
        "(raise --max-line-bytes if this line is genuine)"]
    assert int(run.stdout.split()[-1]) < 500  # MiB
    assert not (tmp_path / "out.parquet").exists()


def _huge(line_prefix: str) -> str:
    return line_prefix + "z" * 20_000


# (source, files to write {name: text}, the file the error must name): one huge line in each.
SOURCES = {
    "tsv": ({"n.tsv": "C1\tok\n" + _huge("C2\t") + "\n"}, "n.tsv", 2),
    "tsv-pipe": ({"n.txt": "D1||ok\n" + _huge("D2||") + "\n"}, "n.txt", 2),
    "icd10-tsv": ({"codes.tsv": "A00\tcolera\n" + _huge("A01\t") + "\n"}, "codes.tsv", 2),
    "icd10-claml": ({"c.xml": '<?xml version="1.0"?>\n<ClaML>\n<Class code="A00" kind="category">'
                              + _huge("<!--") + "-->\n</Class>\n</ClaML>\n"}, "c.xml", 3),
    "icdo": ({"v.tsv": "8000/3\tneoplasia\n" + _huge("8001/3\t") + "\n"}, "v.tsv", 2),
    "obo": ({"x.obo": "format-version: 1.2\n\n[Term]\nid: X:1\n" + _huge("name: ") + "\n"}, "x.obo", 5),
    "umls": ({"META/MRCONSO.RRF": _huge("C0000001|ENG|P|L1|PF|S1|Y|A1||||MSH|PT|D1|") + "|0|N||\n"},
             "META/MRCONSO.RRF", 1),
    "meddra": ({"MedAscii/pt.asc": "10000001$Rash$$10000002$$$$$$$$\n",
                "MedAscii/llt.asc": _huge("10000001$Rash$10000001$$$$$$$Y$") + "$\n"}, "MedAscii/llt.asc", 1),
}


@pytest.mark.parametrize("case", sorted(SOURCES))
def test_every_source_caps_its_lines(tmp_path, case):
    files, named, line = SOURCES[case]
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    source = case.split("-")[0]
    paths = [tmp_path / ("META" if source == "umls" else "MedAscii" if source == "meddra" else next(iter(files)))]
    with pytest.raises(InputFormatError) as info:
        list(get_source(source)(paths, SourceOptions(limits=SMALL)).names)
    assert str(info.value).startswith(f"{tmp_path / named}:{line}: expected lines of at most 10,000 bytes")


def test_claml_element_over_the_document_cap_is_refused(tmp_path):
    """A ClaML is streamed: one <Class> larger than max_document_bytes is refused, lines short or not."""
    path = tmp_path / "c.xml.gz"
    body = "".join(f'<Rubric kind="inclusion"><Label>term {i}</Label></Rubric>\n' for i in range(5000))
    path.write_bytes(gzip.compress(f'<?xml version="1.0"?>\n<ClaML>\n<Class code="A00" kind="category">\n{body}'
                                   '</Class>\n</ClaML>\n'.encode()))
    assert len(list(get_source("icd10")([path], SourceOptions()).names)) == 5000
    with pytest.raises(InputFormatError, match=r"c\.xml\.gz:\d+: expected ClaML elements of at most 100,000 bytes"):
        list(get_source("icd10")([path], SourceOptions(limits=SMALL)).names)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


FORMAT_READERS = {
    "jsonl": (lambda p, lim: list(read_jsonl(*_jsonl(p, lim))), '{"text": "ok"}\n' + _huge('{"text": "') + '"}\n', 2),
    "pubtator": (lambda p, lim: list(read_pubtator(p, limits=lim)), "1|t|a\n" + _huge("1|a|") + "\n", 2),
    "codiesp": (lambda p, lim: list(read_codiesp(p, limits=lim)), _huge("d\tDIAGNOSTICO\tc\t") + "\t0 1\n", 1),
    "biosyn": (lambda p, lim: list(read_biosyn(p, limits=lim)), _huge("d||0|1||T||") + "||C1\n", 1),
    "id-list": (lambda p, lim: list(read_id_list(p, "tsv", limits=lim)), "C1\tok\n" + _huge("C2\t") + "\n", 2),
}


def _jsonl(path, limits):
    lines, where = jsonl_source(str(path), limits)
    return lines(), where


@pytest.mark.parametrize("fmt", sorted(FORMAT_READERS))
def test_every_mention_format_caps_its_lines_gzip_included(tmp_path, fmt):
    read, text, line = FORMAT_READERS[fmt]
    plain = _write(tmp_path / f"in.{fmt}", text)
    packed = tmp_path / f"in.{fmt}.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, packed):
        with pytest.raises(InputFormatError, match=rf"{path.name.replace('.', '[.]')}:{line}: expected lines of at most 10,000"):
            read(path, SMALL)


def test_ade_xml_document_cap_counts_decompressed_bytes(tmp_path):
    label = ('<?xml version="1.0"?>\n<Label><Text><Section id="S1">' + "x" * 200_000
             + "</Section></Text><Mentions/></Label>\n").encode()
    plain = tmp_path / "l.xml"
    plain.write_bytes(label)
    with pytest.raises(InputFormatError, match=r"l\.xml: expected a document of at most 100,000 bytes, found 200,"):
        read_ade_xml(plain, limits=SMALL)
    packed = tmp_path / "l.xml.gz"
    packed.write_bytes(gzip.compress(label))
    assert packed.stat().st_size < 100_000
    with pytest.raises(InputFormatError, match=r"l\.xml\.gz: expected a document of at most 100,000 bytes, "
                                               r"found more than 100,000 bytes"):
        read_document(packed, SMALL)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_endless_special_file_is_refused_at_the_cap():
    error, peak = peak_bytes(lambda: list(iter_lines("/dev/zero", max_line_bytes=10_000)))
    assert one_line(error).startswith("/dev/zero:1: expected lines of at most 10,000 bytes")
    assert peak < MiB


def test_read_limits_out_of_range_are_one_config_error():
    for bad in (0, -1, 99999999999999999999999, True, 1.5):
        with pytest.raises(ConfigError, match=r"^--max-line-bytes: expected a whole number of bytes from 1 to"):
            ReadLimits(max_line_bytes=bad)


# ----------------------------------------------------------------------------- case 9 (reading): broken gzip


def test_truncated_and_fake_gzip_name_the_file(tmp_path):
    good = gzip.compress(b"".join(b'{"text": "rash %d"}\n' % i for i in range(2000)))
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(good[: len(good) // 2])
    with pytest.raises(InputFormatError, match=r"cut\.jsonl\.gz:\d+: expected a complete compressed file, found its end "
                                               r"before the end of the stream"):
        list(iter_lines(truncated))
    fake = tmp_path / "plain.jsonl.gz"
    fake.write_text('{"text": "rash"}\n')
    with pytest.raises(InputFormatError, match=r"plain\.jsonl\.gz:1: expected a gzip file \(the name ends in \.gz\), "
                                               r"found Not a gzipped file"):
        list(iter_lines(fake))
    corrupt = tmp_path / "bad.tsv.gz"
    corrupt.write_bytes(good[:30] + b"\x00" * 40 + good[70:])
    with pytest.raises(InputFormatError, match=r"bad\.tsv\.gz:\d+: expected"):
        list(get_source("tsv")([corrupt], SourceOptions()).names)


# ----------------------------------------------------------------------------- case 8: ids where they enter


@pytest.mark.parametrize("bad", ["C1\rT9\tAE 0 1\tx", "C1\x00", "C1\x01", "C 1", "C1\u2028X", "\ufeffC1", "C1\x85X"])
def test_concept_ids_are_checked_where_they_enter(tmp_path, bad):
    path = tmp_path / "names.tsv"
    path.write_bytes(f"C0\tok\n{bad}\tname\n".encode("utf-8"))
    with pytest.raises(InputFormatError, match=r"names\.tsv:2: expected a concept id as one token without white space"):
        list(get_source("tsv")([path], SourceOptions()).names)


def test_obo_ontology_name_is_one_token(tmp_path):
    path = _write(tmp_path / "x.obo", "format-version: 1.2\nontology: evil\x01name\n\n[Term]\nid: X:1\nname: n\n")
    with pytest.raises(InputFormatError, match=r"x\.obo: expected an ontology name .* as one token"):
        list(get_source("obo")([path], SourceOptions()).names)


def test_db_option_check_is_one_line():
    assert check_identifier("MedDRA", "--db", forbid=":") == "MedDRA"
    for bad in ("a\nb", "a b", "a:b", "", "x\x01"):
        with pytest.raises(InputFormatError, match=r"^--db: expected one token without white space or control "
                                                   r"characters or ':', found") as info:
            check_identifier(bad, "--db", forbid=":")
        assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- case 8: every writer reads back


# Text that leans on what breaks line formats: CR, LF, NUL, \x01, VT, FF, NEL, line separators, a BOM,
# lone surrogates, tabs and the formats' separators, mixed with any other character.
HOSTILE = st.sampled_from(list("\r\n\x00\x01\x0b\x0c\x1c\x85\u2028\u2029\ufeff\ud800\udfff\t|: ") + ["||", "|t|"])
CHARS = st.one_of(st.characters(blacklist_categories=()), HOSTILE)
TEXT = st.lists(CHARS, max_size=12).map("".join)
TOKEN = st.one_of(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.:|_-]{0,8}", fullmatch=True), TEXT)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(db=TOKEN, concept_id=TOKEN, name=TEXT, tid=st.one_of(st.just("T1"), TEXT.map(lambda s: "T" + s)))
def test_brat_writer_refuses_or_reads_back(tmp_path, db, concept_id, name, tid):
    text = "Patient had severe headache.\n"
    try:
        doc = parse_brat("d.ann", f"{tid}\tAE 19 27\theadache\n".encode("utf-8", "surrogatepass"), text)
    except LinkerError:
        return  # the reader refuses a hostile annotation id: nothing to write
    assume(len(doc.entities) == 1)
    try:
        lines = brat_lines(doc, [(db, concept_id, name)])
    except LinkerError as exc:
        event("refused")
        assert "\n" not in str(exc) and str(exc).startswith("d.ann:1: expected")
        return
    write_brat(lines, tmp_path / "out.ann")
    again = parse_brat("out.ann", (tmp_path / "out.ann").read_bytes(), text)
    assert again.entities == doc.entities and again.lines == tuple(lines)
    [norm] = again.normalizations
    assert (norm.target, norm.db, norm.concept_id, norm.name) == (doc.entities[0].tid, db, concept_id, clean_label(name))


def test_brat_injection_cases_of_the_probe_are_refused():
    doc = parse_brat("d.ann", b"T1\tAE 0 4\trash\n", "rash")
    for norm in [("umls", "C1\rT9\tAE 0 1\tx", "n"), ("um\nls", "C1", "n"), ("db", "C1\x00", "n"), ("db", "C1\x01", "n")]:
        with pytest.raises(InputFormatError, match=r"^d\.ann:1: expected the (database name|concept id) of the "
                                                   r"normalisation of T1 as one token"):
            brat_lines(doc, [norm])
    [line] = brat_lines(doc, [("umls", "C1", "a\x00b\rc\x01d\ne\x0bf")])[1:]
    assert line == "N1\tReference T1 umls:C1\ta b c d e f"


ADE_LABEL = ('<?xml version="1.0" encoding="UTF-8"?>\n<Label drug="X"><Text><Section id="S1" name="AR">{text}</Section>'
             '</Text><Mentions><Mention id="M1" section="S1" type="AdverseReaction" start="0" len="{n}"/></Mentions>'
             "</Label>\n")


@SETTINGS
@given(section=st.text(st.characters(blacklist_characters="<&\r", blacklist_categories=("Cs", "Cc")), min_size=1,
                       max_size=10).filter(str.strip),
       pt=TEXT, pt_id=TOKEN, llt=TEXT, llt_id=TOKEN)
def test_ade_xml_writer_refuses_or_reads_back(tmp_path, section, pt, pt_id, llt, llt_id):
    label = tmp_path / "l.xml"
    label.write_text(ADE_LABEL.format(text=section, n=len(section)), encoding="utf-8")
    try:
        doc = read_ade_xml(label)
    except InputFormatError:
        return
    best = SimpleNamespace(preferred_name=pt, concept_id=pt_id, term_type="LLT", matched_name=llt, term_id=llt_id)
    try:
        write_reactions(doc, [(best,)])
        write_ade_xml(doc, tmp_path / "out" / "l.xml")
    except LinkerError as exc:
        event("refused")
        assert "\n" not in str(exc) and str(exc).startswith(f"{label}: expected")
        return
    again = read_ade_xml(tmp_path / "out" / "l.xml")  # well-formed, and the mentions as they were
    assert [(m.mention_id, m.text) for m in again.mentions] == [(m.mention_id, m.text) for m in doc.mentions]
    norm = again.root.find("Reactions/Reaction/Normalization").attrib
    assert (norm["meddra_pt"], norm["meddra_pt_id"], norm["meddra_llt"], norm["meddra_llt_id"]) == \
           (clean_label(pt), pt_id, clean_label(llt), llt_id)


@pytest.mark.parametrize("bad", ["\x00", "\x01", "\x0b"])
def test_ade_xml_names_of_the_probe_give_a_well_formed_file(tmp_path, bad):
    label = _write(tmp_path / "l.xml", ADE_LABEL.format(text="rash", n=4))
    doc = read_ade_xml(label)
    write_reactions(doc, [(SimpleNamespace(preferred_name=f"Ra{bad}sh", concept_id="100", term_type="PT",
                                           matched_name="x", term_id="100"),)])
    write_ade_xml(doc, tmp_path / "out.xml")
    assert ET.parse(tmp_path / "out.xml").find("Reactions/Reaction/Normalization").get("meddra_pt") == "Ra sh"
    doc.root.find("Text/Section").text = f"ra{bad}sh"  # what no cleaning reaches is refused, not written
    with pytest.raises(InputFormatError, match=r"expected <Section> text in characters XML 1\.0 can hold"):
        write_ade_xml(doc, tmp_path / "out2.xml")
    assert not (tmp_path / "out2.xml").exists()


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | TEXT,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                           max_leaves=10)


@SETTINGS
@given(text=TEXT.filter(str.strip), span_id=st.one_of(st.none(), st.integers(), TEXT), extra=JSON_VALUES)
def test_jsonl_writer_refuses_or_reads_back(tmp_path, text, span_id, extra):
    record = {"text": text, "extra": extra, **({"id": span_id} if span_id is not None else {})}
    out = io.StringIO()
    try:
        write_jsonl(out, record)
    except LinkerError as exc:
        event("refused")
        assert "\n" not in str(exc) and "lone surrogate" in str(exc)
        return
    assert out.getvalue().count("\n") == 1  # one line: JSON escaped every line break
    (tmp_path / "o.jsonl").write_bytes(out.getvalue().encode("utf-8"))
    [span] = read_jsonl(*_jsonl(tmp_path / "o.jsonl", ReadLimits()))
    assert span.record == record

def written_or_refused(path: Path, write) -> Path | None:
    """`write(handle)` into a text buffer, then `path` (UTF-8); None when the writer refused in one line."""
    out = io.StringIO()
    try:
        write(out)
    except LinkerError as exc:
        event("refused")
        assert "\n" not in str(exc)
        return None
    path.write_bytes(out.getvalue().encode("utf-8"))
    return path



@SETTINGS
@given(doc=TOKEN, title=TEXT, abstract=TEXT,
       rows=st.lists(st.tuples(st.integers(0, 99), st.integers(0, 99), TEXT, TEXT, TOKEN), min_size=1, max_size=3))
def test_pubtator_writer_refuses_or_reads_back(tmp_path, doc, title, abstract, rows):
    annotations = [PubtatorAnnotation(0, doc, s, e, t, ty, ids, ()) for s, e, t, ty, ids in rows]
    def write(out):
        write_pubtator(out, doc, title, abstract, annotations)

    if written_or_refused(tmp_path / "p.txt", write) is None:
        return
    again = list(read_pubtator(tmp_path / "p.txt"))
    assert [(a.doc, a.start, a.end, a.text, a.type, a.ids, a.doc_text) for a in again] == \
           [(doc, a.start, a.end, a.text, a.type, a.ids, (title, abstract)) for a in annotations]


@SETTINGS
@given(rows=st.lists(st.tuples(TOKEN, st.sampled_from(["DIAGNOSTICO", "PROCEDIMIENTO", "OTRO"]), TOKEN, TEXT,
                               st.one_of(st.just("3 7"), st.just("1 2;4 9"), TEXT)), min_size=1, max_size=3))
def test_codiesp_writer_refuses_or_reads_back(tmp_path, rows):
    given_rows = [CodiespRow(0, d, label, code, text, 0, 0, offsets) for d, label, code, text, offsets in rows]
    if written_or_refused(tmp_path / "c.tsv", lambda out: write_codiesp(out, given_rows)) is None:
        return
    assert [(r.doc, r.label, r.code, r.text, r.offsets) for r in read_codiesp(tmp_path / "c.tsv")] == \
           [(r.doc, r.label, r.code, r.text, r.offsets) for r in given_rows]


@SETTINGS
@given(rows=st.lists(st.tuples(TOKEN, st.integers(-1, 99), st.integers(-1, 99), TEXT, TEXT, TOKEN), min_size=1,
                     max_size=3))
def test_biosyn_writer_refuses_or_reads_back(tmp_path, rows):
    given_rows = [BiosynRow(0, *row) for row in rows]
    if written_or_refused(tmp_path / "b.concept", lambda out: write_biosyn(out, given_rows)) is None:
        return
    assert [r[1:] for r in map(_astuple, read_biosyn(tmp_path / "b.concept"))] == [r[1:] for r in map(_astuple, given_rows)]


def _astuple(row) -> tuple:
    return (row.line, row.doc, row.start, row.end, row.type, row.text, row.ids)


@SETTINGS
@given(kind=st.sampled_from(["tsv", "query"]),
       rows=st.lists(st.tuples(TOKEN, TEXT, st.one_of(st.none(), TEXT)), min_size=1, max_size=3))
def test_id_list_writer_refuses_or_reads_back(tmp_path, kind, rows):
    given_rows = [ListRow(0, ids, text, lang) for ids, text, lang in rows]
    if written_or_refused(tmp_path / "l.txt", lambda out: write_id_list(out, kind, given_rows)) is None:
        return
    assert [(r.ids, r.text, r.lang) for r in read_id_list(tmp_path / "l.txt", kind)] == \
           [(r.ids, r.text.strip(), (r.lang or "").strip() or None) for r in given_rows]


def test_writers_refuse_the_probe_injections_in_one_line():
    cases = [
        lambda out: write_pubtator(out, "1", "title\nT9\t0\t1\tx\tD\tC", "", []),
        lambda out: write_pubtator(out, "1", "t", "a", [PubtatorAnnotation(0, "1", 0, 1, "x\ty", "D", "C", ())]),
        lambda out: write_codiesp(out, [CodiespRow(0, "d", "DIAGNOSTICO", "c\r", "x", 0, 1, "0 1")]),
        lambda out: write_biosyn(out, [BiosynRow(0, "d", 0, 1, "T", "x||y", "C")]),
        lambda out: write_id_list(out, "tsv", [ListRow(0, "C1", "x\ny", None)]),
        lambda out: write_jsonl(out, {"text": "\udc80"}),
    ]
    for case in cases:
        out = io.StringIO()
        with pytest.raises(InputFormatError) as info:
            case(out)
        assert "\n" not in str(info.value) and out.getvalue() == ""  # refused before a line was written


def test_json_reader_and_writer_agree_on_line_separators(tmp_path):
    """U+2028 inside a JSON string is one character, not a line break, for our line reader."""
    out = io.StringIO()
    write_jsonl(out, {"text": "a\u2028b\x85c"})
    (tmp_path / "o.jsonl").write_text(out.getvalue(), encoding="utf-8")
    [span] = read_jsonl(*_jsonl(tmp_path / "o.jsonl", ReadLimits()))
    assert span.text == "a\u2028b\x85c" and json.loads(out.getvalue())["text"] == span.text
