"""One rule for every file name made from data (issue 44): a document id, a TAC <Section id> or a folder input's
path is used as it is, or refused in one line naming it; no two documents share a file; nothing is written outside
the output folder.

`linker extract` runs with a stand-in tagger (`fake_tagger`): file naming does not depend on the model, and the
refusals must come before it loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linker.errors import InputFormatError, LinkerError, shorten
from linker.extract.io import read_inputs, write_output
from linker.fileio import MAX_NAME_BYTES, FileNamer, safe_stem

# ----------------------------------------------------------------------------- the rule, stated again as an oracle

_DEVICE = re.compile(r"(con|prn|aux|nul|(com|lpt)[0-9\u00b9\u00b2\u00b3])(\..*)?", re.IGNORECASE)


def acceptable(name: str) -> bool:
    return (bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")
            and name[-1] not in ". " and not _DEVICE.fullmatch(name)
            and not any(unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") for c in name)
            and len(name.encode("utf-8")) <= MAX_NAME_BYTES)


def caseless(name: str) -> str:
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", name).casefold())


# Pieces that hostile and ordinary ids are made of: separators, dots, NUL and other breaks, case and Unicode
# variants (é precomposed and decomposed), Windows device names, and enough bytes to pass the length bound.
PIECES = ["a", "A", "b", "_", "..", ".", "/", "\\", "\x00", "\n", "\x85", "\u2028", "é", "e\u0301", "É", " ", ":",
          "%", "CON", "nul", "com1", "PMID:1", "x" * 70]
ids = st.one_of(st.lists(st.sampled_from(PIECES), min_size=1, max_size=4).map("".join), st.text(max_size=8))
VARIANTS = [str.upper, str.lower, str.swapcase, lambda s: unicodedata.normalize("NFD", s)]


@st.composite
def twins(draw, names_strategy) -> list[str]:
    """Distinct names, often with a case or Unicode variant of one of them (one file on macOS and Windows)."""
    names = draw(st.lists(names_strategy, min_size=1, max_size=3, unique=True))
    variant = draw(st.sampled_from(VARIANTS))(draw(st.sampled_from(names)))
    return names + [variant] if draw(st.booleans()) and variant not in names else names


def files_below(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def refusal_names_one_of(exc: LinkerError, names) -> None:
    message = str(exc)
    assert "\n" not in message and "\r" not in message, message
    assert any(shorten(name) in message for name in names), message


# ----------------------------------------------------------------------------- safe_stem and FileNamer


@settings(max_examples=300, deadline=None)
@given(name=ids)
def test_safe_stem_keeps_a_name_or_refuses_it_in_one_line(name):
    try:
        kept = safe_stem(name, "in.jsonl", what="a document id", line=3)
    except InputFormatError as exc:
        assert not acceptable(name)
        assert str(exc).startswith("in.jsonl:3: expected a document id usable as a file name, found ")
        refusal_names_one_of(exc, [name])
        return
    assert acceptable(name) and kept == name
    folder = Path("/out/tmp")
    assert len(Path(name).parts) == 1 and (folder / name).parent == folder


def test_file_namer_refuses_shared_names_case_ignored_and_a_file_where_a_folder_is():
    namer = FileNamer("/out")
    assert namer.files(["A"], [".txt", ".ann"], owner="id 'A'", where="in.jsonl", line=1) == [
        Path("/out/A.txt"), Path("/out/A.ann")]
    with pytest.raises(InputFormatError) as caught:
        namer.files(["a"], [".txt"], owner="id 'a'", where="in.jsonl", line=2)
    assert str(caught.value) == ("in.jsonl:2: expected distinct output file names (case ignored, as on macOS and "
                                 "Windows), found id 'a' and id 'A' (in.jsonl:1) both named a.txt (rename one of them)")
    namer.files(["sub", "x"], [".txt"], owner="sub/x", where="in")
    assert namer.files(["SUB", "y"], [".txt"], owner="SUB/y", where="in") == [Path("/out/SUB/y.txt")]  # folders shared
    with pytest.raises(InputFormatError, match=r"found a\.txt/z and id 'A' \(in\.jsonl:1\) both named a\.txt "):
        namer.files(["a.txt", "z"], [""], owner="a.txt/z", where="in")  # a folder where a file is
    namer.files(["\u00e9"], [".txt"], owner="id 1", where="in")
    with pytest.raises(InputFormatError, match="found id 2 and id 1 "):  # é, and e with a combining accent: one name
        namer.files(["e\u0301"], [".txt"], owner="id 2", where="in")
    with pytest.raises(InputFormatError, match=r"^in: expected a name usable as a file name, found '\.\.', which "):
        namer.files(["..", "x"], [".txt"], owner="x", where="in")


# ----------------------------------------------------------------------------- the writers, over many ids


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=twins(ids), fmt=st.sampled_from(["brat", "ade-xml"]))
def test_document_ids_name_files_inside_the_output_or_are_refused(names, fmt):
    suffixes = [".txt", ".ann"] if fmt == "brat" else [".xml"]
    bad = [n for n in names if not all(acceptable(n + s) for s in suffixes) or not acceptable(n)]
    keys = [caseless(n) for n in names]
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        source = base / "in.jsonl"
        texts = [f"Nausea after cisplatin, case {i}." for i in range(len(names))]
        source.write_text("".join(json.dumps({"id": n, "text": t}) + "\n" for n, t in zip(names, texts)),
                          encoding="utf-8")
        out = base / "deep" / "out"
        try:
            docs = read_inputs(source, fmt=fmt)
            for doc in docs:
                doc.spans = [[]]
            write_output(docs, out, fmt)
        except LinkerError as exc:
            assert bad or len(set(keys)) < len(keys), str(exc)
            refusal_names_one_of(exc, names)
            assert files_below(base) == [source]  # refused before anything was written
            return
        assert not bad and len(set(keys)) == len(keys)
        written = files_below(base)
        assert all(out.resolve() in p.resolve().parents for p in written if p != source)
        assert len(written) == 1 + 1 + len(names) * len(suffixes)  # the input, the marker, each document's own
        if fmt == "brat":
            for name, text in zip(names, texts):
                assert (out / f"{name}.txt").read_text(encoding="utf-8") == text


def tac_label(path: Path, sections: list[str]) -> None:
    root = ET.Element("Label", {"drug": "drug"})
    text = ET.SubElement(root, "Text")
    for i, sid in enumerate(sections):
        ET.SubElement(text, "Section", {"id": sid, "name": "s"}).text = f"Nausea in section {i}."
    ET.ElementTree(root).write(path, encoding="UTF-8", xml_declaration=True)


# Characters an XML 1.0 attribute can carry (ElementTree escapes tab, CR and LF).
xml_ids = st.one_of(st.lists(st.sampled_from([p for p in PIECES if p not in ("\x00", "\x85")]), min_size=1,
                             max_size=4).map("".join),
                    st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=8))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sections=twins(xml_ids))
def test_section_ids_name_files_inside_the_output_or_are_refused(sections):
    stems = [f"drug_{sid}" for sid in sections]
    bad = [s for s in sections if not acceptable(s)] + [s for s in stems if not acceptable(s + ".ann")]
    keys = [caseless(s) for s in stems]
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        source = base / "drug.xml"
        tac_label(source, sections)
        out = base / "deep" / "out"
        try:
            docs = read_inputs(source, fmt="brat")
            assert [sid for sid, _ in docs[0].sections] == sections
            docs[0].spans = [[] for _ in sections]
            write_output(docs, out, "brat")
        except LinkerError as exc:
            assert bad or len(set(keys)) < len(keys), str(exc)
            refusal_names_one_of(exc, sections)
            assert files_below(base) == [source]
            return
        assert not bad and len(set(keys)) == len(keys)
        written = [p for p in files_below(base) if p != source]
        assert all(out.resolve() in p.resolve().parents for p in written)
        for i, stem in enumerate(stems):
            assert (out / f"{stem}.txt").read_text(encoding="utf-8") == f"Nausea in section {i}."


# ----------------------------------------------------------------------------- `linker extract`: the probe's cases


class FakeTagger:
    """Every 'nausea ...' up to a full stop is an adverse event: enough to write spans, line breaks included."""

    def extract(self, texts, **_):
        from linker.extract import AE, ExtractedSpan

        return [[ExtractedSpan(m.start(), m.end(), m.group(), AE, "positive", 0.9)
                 for m in re.finditer(r"[Nn]ausea[^.]*", text)] for text in texts]


@pytest.fixture
def fake_tagger(tmp_path, monkeypatch) -> tuple[Path, list]:
    """A --model folder and the list of times the tagger was loaded (empty: refused before the model)."""
    import linker.extract

    folder = tmp_path / "tagger"
    folder.mkdir()
    (folder / "manifest.json").write_text("{}")
    loads: list = []
    monkeypatch.setattr(linker.extract, "load_extractor", lambda *a, **k: loads.append(a) or FakeTagger())
    monkeypatch.chdir(tmp_path)
    return folder, loads


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extract(args, model, capsys):
    return cli(["extract", *args, "--model", model], capsys)


def jsonl(path: str, *records) -> str:
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", ["brat", "ade-xml"])
@pytest.mark.parametrize("doc_id", ["../v/n", "a/b/../../../x", "ABSOLUTE"])
def test_an_id_that_climbs_out_is_refused_and_the_victim_kept(fake_tagger, tmp_path, capsys, fmt, doc_id):
    model, loads = fake_tagger
    Path("v").mkdir()
    victims = [Path("v/n.txt"), Path("v/n.ann"), Path("v/n.xml"), Path("x.txt"), Path("x.xml")]
    for victim in victims:
        victim.write_text("keep\n")
    before = [sha256(v) for v in victims]
    doc_id = str(tmp_path / "v" / "n") if doc_id == "ABSOLUTE" else doc_id
    source = jsonl("a.jsonl", {"id": doc_id, "text": "Nausea after cisplatin."})
    code, err = extract(["--input", source, "--output", "out", "--format", fmt], model, capsys)
    assert_one_line_error(code, err, f"a.jsonl:1: expected a document id usable as a file name, found {doc_id!r}, "
                                     "which holds '/'", "--format jsonl")
    assert [sha256(v) for v in victims] == before and not Path("out").exists() and not loads


def test_a_section_id_that_climbs_out_is_refused(fake_tagger, capsys):
    model, loads = fake_tagger
    Path("victimdir").mkdir()
    victim = Path("victimdir/sec.txt")
    victim.write_text("keep\n")
    before = sha256(victim)
    Path("in").mkdir()
    tac_label(Path("in/label.xml"), ["S1", "/../../victimdir/sec"])
    for fmt in ("brat", "ade-xml"):
        code, err = extract(["--input", "in/label.xml", "--output", f"out-{fmt}", "--format", fmt], model, capsys)
        if fmt == "brat":
            assert_one_line_error(code, err, "in/label.xml: expected a <Section id> usable as a file name, found "
                                             "'/../../victimdir/sec', which holds '/'")
        else:  # one label per document, named after the file: the section id names nothing
            assert code == 0, err
            assert sorted(p.name for p in Path("out-ade-xml").iterdir()) == [".linker-output", "label.xml"]
    assert sha256(victim) == before and not Path("out-brat").exists()


@pytest.mark.parametrize(("records", "needles"), [
    ([{"id": "A"}, {"id": "a"}], ["a.jsonl:2:", "document 'a' and document 'A' (a.jsonl:1) both named a.txt"]),
    ([{"id": "A"}, {"id": "a/../A"}], ["a.jsonl:2:", "'a/../A', which holds '/'"]),
    ([{"id": "\u00e9"}, {"id": "e\u0301"}], ["a.jsonl:2:", "document 'e\u0301' and document '\u00e9'"]),
    ([{"id": "a\u0000b"}], ["a.jsonl:1:", r"found 'a\x00b', which holds a control character (U+0000)"]),
    ([{"id": "CON"}], ["a.jsonl:1:", "found 'CON', which is a Windows device name"]),
    ([{"id": ".linker-output"}], ["found '.linker-output', which starts with a dot"]),
])
def test_ids_that_share_a_file_or_cannot_be_one_are_refused(fake_tagger, capsys, records, needles):
    model, loads = fake_tagger
    source = jsonl("a.jsonl", *({**r, "text": f"Nausea, case {i}."} for i, r in enumerate(records)))
    for fmt in ("brat", "ade-xml"):
        code, err = extract(["--input", source, "--output", "out", "--format", fmt], model, capsys)
        assert_one_line_error(code, err, *[n.replace("a.txt", "a.xml") if fmt == "ade-xml" else n for n in needles])
    assert not Path("out").exists() and not loads


def test_a_document_a_b_and_document_a_section_b_are_refused(fake_tagger, capsys):
    model, loads = fake_tagger
    Path("labels").mkdir()
    tac_label(Path("labels/a.xml"), ["b_S1"])
    tac_label(Path("labels/a_b.xml"), ["S1"])
    code, err = extract(["--input", "labels", "--output", "out", "--format", "brat"], model, capsys)
    assert_one_line_error(code, err, "labels/a_b.xml: expected distinct output file names",
                          "document 'a_b' section 'S1' and document 'a' section 'b_S1' (labels/a.xml) both named "
                          "a_b_S1.txt")
    assert not Path("out").exists() and not loads


def test_ordinary_ids_and_folder_inputs_keep_their_names(fake_tagger, capsys):
    model, loads = fake_tagger
    source = jsonl("a.jsonl", {"id": "PMID:1", "text": "Nausea."}, {"id": "Ünï code 2", "text": "No events."},
                   {"id": "3", "text": "Rash."})
    code, err = extract(["--input", source, "--output", "out", "--format", "brat"], model, capsys)
    assert code == 0, err
    assert sorted(p.name for p in Path("out").glob("*.txt")) == ["3.txt", "PMID:1.txt", "Ünï code 2.txt"]
    Path("texts/sub").mkdir(parents=True)
    Path("texts/sub/case2.txt").write_text("Nausea after cisplatin.")
    code, err = extract(["--input", "texts", "--output", "out2", "--format", "brat"], model, capsys)
    assert code == 0, err
    assert sorted(p.relative_to("out2").as_posix() for p in Path("out2").rglob("*.ann")) == ["sub/case2.ann"]
    assert len(loads) == 2


def test_a_span_across_a_line_break_is_written_as_brat_fragments(fake_tagger, capsys):
    from linker.formats.brat import read_brat

    model, _ = fake_tagger
    text = "She had nausea\nand vomiting after cisplatin.\r\nNausea\u2028again."
    source = jsonl("a.jsonl", {"id": "x", "text": text})
    code, err = extract(["--input", source, "--output", "out", "--format", "brat"], model, capsys)
    assert code == 0, err
    doc = read_brat(Path("out/x.ann"))  # every fragment checked against the .txt
    assert doc.text == text
    assert [(e.spans, e.text) for e in doc.entities] == [
        (((8, 14), (15, 43)), "nausea and vomiting after cisplatin"), (((46, 52), (53, 58)), "Nausea again")]


def test_a_folder_format_refuses_a_file_name(fake_tagger, capsys):
    model, loads = fake_tagger
    source = jsonl("a.jsonl", {"id": "x", "text": "Nausea."})
    Path("out").mkdir()
    for fmt in ("brat", "ade-xml"):
        code, err = extract(["--input", source, "--output", "out/c.jsonl", "--format", fmt], model, capsys)
        assert_one_line_error(code, err, f"--output out/c.jsonl: --format {fmt} writes a folder, found a file name "
                                         "ending in .jsonl; name a folder (such as out/c), or pass --format jsonl")
    assert list(Path("out").iterdir()) == [] and not loads


def test_deeply_nested_xml_is_refused_as_it_is_read(fake_tagger, capsys):
    model, loads = fake_tagger
    depth = 200_000
    Path("deep.xml").write_text('<Label drug="x"><Text><Section id="S1" name="a">Nausea.</Section></Text>'
                                + "<a>" * depth + "</a>" * depth + "</Label>")
    code, err = extract(["--input", "deep.xml", "--output", "out", "--format", "ade-xml"], model, capsys)
    assert_one_line_error(code, err, "deep.xml:1: expected elements nested at most 32 deep (a drug label has 4), "
                                     "found <a> at depth 33")
    assert not loads and not Path("out").exists()


def test_normalize_mirror_refuses_two_files_on_one_name(tmp_path, capsys):
    """`linker normalize` mirrors a brat folder through the same FileNamer: A.ann and a.ann are one file on macOS."""
    from fixtures.normalize.normalize_tables import build_indexes

    (tmp_path / "indexes").mkdir()
    index = build_indexes(tmp_path / "indexes")["meddra"]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for stem in ("A", "a"):
        (corpus / f"{stem}.txt").write_text("Nausea.")
        (corpus / f"{stem}.ann").write_text("T1\tAE 0 6\tNausea\n")
    args = ["normalize", "--index", index, "--input", corpus, "--output", tmp_path / "out", "--format", "brat"]
    code, err = cli(args, capsys)
    assert_one_line_error(code, err, f"{corpus / 'a.ann'}: expected distinct output file names",
                          f"file 'a.ann' and file 'A.ann' ({corpus / 'A.ann'}) both named a.ann")
    assert not (tmp_path / "out").exists()
    os.remove(corpus / "a.ann")
    os.remove(corpus / "a.txt")
    code, err = cli(args, capsys)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".linker-output", "A.ann", "A.txt"]
