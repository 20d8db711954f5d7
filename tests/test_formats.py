"""linker.formats: one reader and one writer per mention-file format; span checks, size caps, hostile JSONL."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linker.datasets import load_dataset
from linker.errors import InputFormatError
from linker.fileio import iter_lines
from linker.formats import ReadLimits
from linker.formats.brat import brat_sources, parse_brat, read_brat, read_source
from linker.formats.codiesp import CodiespRow, read_codiesp, write_codiesp
from linker.formats.jsonl import MAX_DEPTH, read_jsonl, write_jsonl
from linker.formats.mention_lists import BiosynRow, ListRow, read_biosyn, read_id_list, write_biosyn, write_id_list
from linker.formats.pubtator import read_pubtator, write_pubtator

TEXT = "Patient had severe headache and hair loss.\n"


def brat_doc(folder: Path, ann: str, text: str = TEXT) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "d.txt").write_text(text, encoding="utf-8")
    (folder / "d.ann").write_text(ann, encoding="utf-8")
    return folder / "d.ann"


# ----------------------------------------------------------------------------- brat spans against the .txt


def test_brat_spans_checked_against_txt(tmp_path):
    ok = brat_doc(tmp_path / "ok", "T1\tAE 19 27\theadache\nT2\tAE 32 36;37 41\thair loss\n")
    doc = read_brat(ok)
    assert [(e.tid, e.start, e.end, e.text) for e in doc.entities] == [("T1", 19, 27, "headache"), ("T2", 32, 41, "hair loss")]
    beyond = brat_doc(tmp_path / "beyond", "T1\tAE 19 27\theadache\nT2\tAE 40 99\tloss\n")
    with pytest.raises(InputFormatError, match=r"d.ann:2: expected offsets inside the .txt \(43 characters\), found 40 99"):
        read_brat(beyond)
    wrong = brat_doc(tmp_path / "wrong", "T1\tAE 19 27\tmigraine\n")
    with pytest.raises(InputFormatError, match=r"d.ann:1: expected the span text equal to the .txt at its offsets "
                                               r"\('headache'\), found 'migraine' \(pass --lenient"):
        read_brat(wrong)


def test_brat_lenient_skips_and_reports(tmp_path):
    ann = brat_doc(tmp_path, "T1\tAE 19 27\theadache\nT2\tAE 19 27\tmigraine\nT3\tAE 0 900\tx\n")
    doc = read_brat(ann, lenient=True)
    assert [e.tid for e in doc.entities] == ["T1"]
    assert len(doc.skipped) == 2 and doc.skipped[0].startswith(f"{ann}:2: expected the span text")
    assert not doc.skipped[0].endswith(")")  # the "pass --lenient" hint is left out of the report


def test_brat_without_txt_is_not_span_checked(tmp_path):
    (tmp_path / "d.ann").write_text("T1\tAE 0 5\tanything\n")
    assert [e.text for e in read_brat(tmp_path / "d.ann").entities] == ["anything"]


def test_eval_and_normalize_share_the_brat_check(tmp_path):
    brat_doc(tmp_path / "docs", "T1\tAE 19 27\tmigraine\n#1\tAnnotatorNotes T1\tC1\n")
    with pytest.raises(InputFormatError, match="d.ann:1: expected the span text"):
        load_dataset(f"brat:{tmp_path / 'docs'}")
    assert load_dataset(f"brat:{tmp_path / 'docs'}", lenient=True) == []
    archive = tmp_path / "docs.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("a/d.ann", "T1\tAE 19 27\tmigraine\n")
        z.writestr("a/d.txt", TEXT)
    with pytest.raises(InputFormatError, match=r"docs.zip!a/d.ann:1: expected the span text"):
        load_dataset(f"brat:{archive}")


def test_brat_document_cap_and_zip_member_cap(tmp_path):
    ann = brat_doc(tmp_path / "big", "T1\tAE 19 27\theadache\n", text=TEXT + "x" * 5000)
    with pytest.raises(InputFormatError, match=r"d.txt: expected a document of at most 1,000 bytes, found 5,04\d bytes"):
        read_brat(ann, limits=ReadLimits(max_document_bytes=1000))
    archive = tmp_path / "big.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("d.ann", "T1\tAE 0 1\tx\n" + "#9\tnote\t" + "y" * 100_000 + "\n")
    [source] = brat_sources(archive, limits=ReadLimits(max_document_bytes=1000))
    with pytest.raises(InputFormatError, match=r"big.zip!d.ann: expected a document of at most 1,000 bytes"):
        read_source(source)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=1, max_size=40), data=st.data())
def test_brat_any_slice_of_the_text_round_trips(tmp_path, text, data):
    """Every span whose text is the .txt slice is accepted; a changed text never is."""
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    piece = text[start:end]
    line = f"T1\tAE {start} {end}\t{piece}"
    if not piece.strip() or any(c in piece for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
        return  # not representable on one brat line: the format's limit, not ours
    assert parse_brat("d.ann", line.encode(), text).entities[0].text == piece
    with pytest.raises(InputFormatError):
        parse_brat("d.ann", f"T1\tAE {start} {end}\t{piece}X".encode(), text)


# ----------------------------------------------------------------------------- JSONL: hostile lines


def jsonl(*lines: str) -> list[tuple[int, str]]:
    return list(enumerate(lines, start=1))


def test_jsonl_surrogates_are_refused_with_the_field():
    with pytest.raises(InputFormatError, match=r"in.jsonl:1: expected field 'text' as Unicode text, found a lone surrogate"):
        list(read_jsonl(jsonl(r'{"text": "head\ud800ache"}'), "in.jsonl"))
    with pytest.raises(InputFormatError, match=r"in.jsonl:2: expected field 'meta.tags\[0\]' as Unicode text"):
        list(read_jsonl(jsonl('{"text": "a"}', r'{"text": "a", "meta": {"tags": ["\udfff"]}}'), "in.jsonl"))
    # a correctly paired surrogate escape is an ordinary character
    [span] = read_jsonl(jsonl(r'{"text": "\ud83d\ude00 rash"}'), "in.jsonl")
    assert span.text == "\U0001f600 rash"


def test_jsonl_deep_nesting_is_one_error():
    deep = '{"text": "a", "x": ' + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "}"
    with pytest.raises(InputFormatError, match=rf"in.jsonl:1: expected JSON nested at most {MAX_DEPTH} levels deep"):
        list(read_jsonl(jsonl(deep), "in.jsonl"))
    very_deep = '{"text": "a", "x": ' + "[" * 200_000 + "]" * 200_000 + "}"  # beyond the parser's recursion limit
    with pytest.raises(InputFormatError, match="nesting too deep to parse"):
        list(read_jsonl(jsonl(very_deep), "in.jsonl"))


def test_line_cap_reads_no_more_than_the_cap(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "' + b"a" * 5000 + b'"}\n')
    with pytest.raises(InputFormatError, match=r"big.jsonl:2: expected lines of at most 1,000 bytes, found a longer line"):
        list(iter_lines(path, max_line_bytes=1000))
    exact = tmp_path / "exact.txt"
    exact.write_bytes(b"x" * 1000 + b"\r\n" + b"y\n")
    assert [n for n, _ in iter_lines(exact, max_line_bytes=1000)] == [1, 2]


@settings(max_examples=80, deadline=None)
@given(value=st.recursive(st.none() | st.booleans() | st.integers() | st.text(), lambda inner:
                          st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                          max_leaves=20))
def test_jsonl_any_json_value_reads_or_fails_with_one_error(value):
    """Hypothesis: any JSON value as an extra field (surrogates included) either round-trips or is one InputFormatError."""
    line = json.dumps({"text": "rash", "extra": value})  # ensure_ascii: lone surrogates become \\udxxx escapes
    try:
        [span] = read_jsonl(jsonl(line), "in.jsonl")
    except InputFormatError as exc:
        assert str(exc).startswith("in.jsonl:1: expected") and "\n" not in str(exc)
        return
    out = io.StringIO()
    write_jsonl(out, span.record)
    out.getvalue().encode("utf-8")  # what the writer wrote is valid UTF-8
    assert json.loads(out.getvalue()) == {"text": "rash", "extra": value}


# ----------------------------------------------------------------------------- writers round-trip the readers


def test_pubtator_round_trip(tmp_path, fixtures):
    rows = list(read_pubtator(fixtures / "eval" / "pubtator_slice.txt"))
    out = io.StringIO()
    by_doc: dict[str, list] = {}
    for row in rows:
        by_doc.setdefault(row.doc, []).append(row)
    for doc, annotations in by_doc.items():
        write_pubtator(out, doc, *annotations[0].doc_text, annotations)
    (tmp_path / "p.txt").write_text(out.getvalue())
    again = list(read_pubtator(tmp_path / "p.txt"))
    assert [(r.doc, r.start, r.end, r.text, r.type, r.ids) for r in again] == \
           [(r.doc, r.start, r.end, r.text, r.type, r.ids) for r in rows]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=15)
                      .filter(lambda t: t.strip() == t and "||" not in t and "|" not in t[-1:] + t[:1]), min_size=1,
                      max_size=5))
def test_mention_lists_and_codiesp_round_trip(tmp_path, texts):
    files = {}
    for kind in ("tsv", "query"):
        buffer = io.StringIO()
        write_id_list(buffer, kind, [ListRow(0, f"C{i}|D{i}", t, "es" if i % 2 else None) for i, t in enumerate(texts)])
        files[kind] = buffer.getvalue()
    biosyn, codiesp = io.StringIO(), io.StringIO()
    write_biosyn(biosyn, [BiosynRow(0, "d1", i, i + len(t), "Disease", t, f"D{i}+D9") for i, t in enumerate(texts)])
    write_codiesp(codiesp, [CodiespRow(0, "S1", "DIAGNOSTICO", f"r{i}", t, i, i + 3, f"{i} {i + 3}") for i, t in enumerate(texts)])
    for name, content in {**files, "biosyn": biosyn.getvalue(), "codiesp": codiesp.getvalue()}.items():
        (tmp_path / name).write_text(content, encoding="utf-8")
    if any("\t" in t for t in texts):
        return  # a tab is the tsv/codiesp separator: not representable there
    assert [r.text for r in read_id_list(tmp_path / "tsv", "tsv")] == texts
    assert [r.text for r in read_id_list(tmp_path / "query", "query")] == texts
    assert [(r.text, r.ids) for r in read_biosyn(tmp_path / "biosyn")] == [(t, f"D{i}+D9") for i, t in enumerate(texts)]
    assert [(r.text, r.code, r.start) for r in read_codiesp(tmp_path / "codiesp")] == [(t, f"r{i}", i) for i, t in enumerate(texts)]


@pytest.mark.parametrize("mappable", [True, False])
def test_mapped_blocks_give_every_byte_once_and_sha256_file_hashes_them(tmp_path, monkeypatch, mappable):
    """Blocks of any size from any offset to any end cover exactly those bytes, through a memory map or, where the
    file cannot be mapped, through reads; an empty range gives no block."""
    import hashlib
    import mmap

    from linker.folders import mapped_blocks, sha256_file

    payload = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes: not a whole number of pages or blocks
    path = tmp_path / "blob.bin"
    path.write_bytes(payload)
    (tmp_path / "empty.bin").write_bytes(b"")
    if not mappable:
        def refuse(*args, **kwargs):
            raise OSError("no mmap here")
        monkeypatch.setattr(mmap, "mmap", refuse)
    for offset, end, block in ((0, None, 4096), (3, None, 1000), (100, 5000, 333), (0, 20_000, 1 << 20)):
        parts = [bytes(part) for part in mapped_blocks(path, offset, end, block)]
        assert b"".join(parts) == payload[offset:end]
        assert all(len(part) == block for part in parts[:-1])
    assert list(mapped_blocks(path, 10_244)) == [] and list(mapped_blocks(tmp_path / "empty.bin")) == []
    assert sha256_file(path) == hashlib.sha256(payload).hexdigest()
    assert sha256_file(tmp_path / "empty.bin") == hashlib.sha256(b"").hexdigest()
