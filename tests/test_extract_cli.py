"""`linker extract` / `linker annotate`, the Python API, the shipped linker-ae release and POST /annotate.

Uses the shipped tagger (linker/models/linker-ae, ~7 MB, over the offline minilm): a few seconds to load once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linker.errors import InputFormatError
from linker.models import release_folder

pytest.importorskip("torch")
RELEASE = release_folder("linker-ae")
if not (RELEASE / "manifest.json").is_file():
    pytest.skip("the linker-ae release is not built (linker train extractor ...)", allow_module_level=True)

from fixtures.normalize.normalize_tables import build_indexes
from test_extract import TAC_LABEL

ROOT = Path(__file__).resolve().parents[1]
MEDDRA_CODES = {"10001760", "10028813", "10019211", "10013573", "10037087"}  # the tiny MedDRA-like table's PTs
CASE = ("A 45-year-old woman developed severe nausea and hair loss after starting cisplatin. "
        "She had no headache. Itching resolved after the drug was stopped.\n")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inputs")
    (root / "texts").mkdir()
    (root / "texts" / "case1.txt").write_text(CASE, encoding="utf-8")
    (root / "texts" / "sub").mkdir()
    (root / "texts" / "sub" / "case2.txt").write_text("Nausea after cisplatin.", encoding="utf-8")
    (root / "labels").mkdir()
    (root / "labels" / "TESTDRUG.xml").write_text(TAC_LABEL, encoding="utf-8")
    (root / "docs.jsonl").write_text(json.dumps({"id": "d1", "text": CASE}) + "\n", encoding="utf-8")
    return {"folder": root / "texts", "txt": root / "texts" / "case1.txt", "xml": root / "labels" / "TESTDRUG.xml",
            "xml_folder": root / "labels", "jsonl": root / "docs.jsonl"}


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, Path]:
    return build_indexes(tmp_path_factory.mktemp("indexes"))


def test_release_loads_offline_by_its_short_name_and_finds_events():
    from linker.extract import AE, extract, load_extractor
    from linker.models import read_release

    release = read_release(RELEASE)
    manifest = release.manifest
    assert (manifest["name"], manifest["kind"], manifest["base"]) == ("linker-ae", "tagger", "minilm")
    assert manifest["labels"] == ["AdverseEvent", "Drug", "TherapeuticEffect", "AdverseReaction", "Indication"]
    assert manifest["files"]["weights.safetensors"]["bytes"] < 30_000_000
    trained = {key.split(".")[2] for key in manifest["tensors"]["shapes"] if key.startswith("encoder.layer.")}
    assert trained == {str(i) for i in range(manifest["frozen_layers"], 6)}  # only the top layers ship
    spans = extract([CASE])[0]
    assert load_extractor("linker-ae") is load_extractor(RELEASE)  # loaded once
    events = {s.text for s in spans if s.label == AE}
    assert "nausea" in " ".join(events) and all(CASE[s.start:s.end] == s.text for s in spans)
    assert any(s.label == "Drug" and s.text == "cisplatin" for s in spans)


def test_release_sha256_check_fails_on_an_altered_weights_file(tmp_path):
    from linker.extract import load_extractor

    copy = tmp_path / "linker-ae"
    shutil.copytree(RELEASE, copy)
    weights = copy / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # same size, one bit changed
    weights.write_bytes(bytes(data))
    with pytest.raises(InputFormatError, match="sha256.*altered"):
        load_extractor(copy)


@pytest.mark.parametrize("source", ["folder", "txt", "xml", "jsonl"])
def test_extract_writes_jsonl(inputs, tmp_path, capsys, source):
    out = tmp_path / "spans.jsonl"
    code, err = cli(["extract", "--input", inputs[source], "--output", out, "--format", "jsonl"], capsys)
    assert code == 0, err
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert records and {"doc", "start", "end", "text", "label", "status", "confidence"} <= set(records[0])
    if source == "xml":
        assert {r["section"] for r in records} <= {"S1", "S2"}
    # the records are spans `linker normalize --format jsonl` reads
    from linker.formats.jsonl import read_jsonl

    assert len(list(read_jsonl(enumerate(out.read_text().splitlines(), 1), str(out)))) == len(records)


def test_extract_writes_brat_that_reads_back(inputs, tmp_path, capsys):
    from linker.formats.brat import read_brat

    out = tmp_path / "brat"
    code, err = cli(["extract", "--input", inputs["folder"], "--output", out, "--format", "brat"], capsys)
    assert code == 0, err
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.ann")) == ["case1.ann", "sub/case2.ann"]
    doc = read_brat(out / "case1.ann")  # checks every span against the .txt
    assert doc.text == CASE and doc.entities
    assert {e.type for e in doc.entities} <= {"AdverseEvent", "Drug", "TherapeuticEffect", "Indication"}
    assert all(note.startswith("confidence=") for note in doc.notes.values())
    # again without --overwrite: refused; with it: replaced
    code, err = cli(["extract", "--input", inputs["folder"], "--output", out, "--format", "brat"], capsys)
    assert_one_line_error(code, err, str(out))
    code, err = cli(["extract", "--input", inputs["folder"], "--output", out, "--format", "brat", "--overwrite"], capsys)
    assert code == 0, err


def test_extract_writes_ade_xml_that_reads_back(inputs, tmp_path, capsys):
    from linker.formats.ade_xml import read_ade_xml

    out = tmp_path / "xml"
    for source in ("xml", "txt"):
        code, err = cli(["extract", "--input", inputs[source], "--output", out / source, "--format", "ade-xml"], capsys)
        assert code == 0, err
    label = read_ade_xml(out / "xml" / "TESTDRUG.xml")
    assert label.root.tag == "Label" and [s.get("id") for s in label.root.find("Text")] == ["S1", "S2"]
    assert all(m.type == "AdverseReaction" for m in label.mentions)
    text_label = read_ade_xml(out / "txt" / "case1.xml")
    assert text_label.root.tag == "SubmissionLabel" and text_label.root.find("Text")[0].text == CASE
    assert text_label.mentions


def test_annotate_codes_events_with_decisions(inputs, indexes, tmp_path, capsys):
    out = tmp_path / "coded.jsonl"
    code, err = cli(["annotate", "--index", indexes["meddra"], "--input", inputs["txt"], "--output", out, "--k", "2"],
                    capsys)
    assert code == 0, err
    assert err[-1].startswith("annotated ")
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    events = [r for r in rows if r["label"] == "AdverseEvent"]
    assert events and all(r["decision"] in ("auto", "review", "no link", "not coded") for r in events)
    coded = {r["code"] for r in events if r["code"]}
    assert coded and coded <= MEDDRA_CODES, rows
    assert all(r["decision"] == "not coded" and r["code"] is None for r in events if r["status"] != "positive")
    assert all(r["decision"] is None for r in rows if r["label"] != "AdverseEvent")
    # brat: normalisation lines; ade-xml: Reactions with MedDRA codes
    from linker.formats.ade_xml import read_ade_xml
    from linker.formats.brat import read_brat

    code, err = cli(["annotate", "--index", indexes["meddra"], "--input", inputs["txt"], "--output", tmp_path / "b",
                     "--format", "brat"], capsys)
    assert code == 0, err
    doc = read_brat(tmp_path / "b" / "case1.ann")
    assert doc.normalizations and all(n.db == "MedDRA" and n.concept_id in MEDDRA_CODES for n in doc.normalizations)
    code, err = cli(["annotate", "--index", indexes["meddra"], "--input", inputs["xml"], "--output", tmp_path / "x",
                     "--format", "ade-xml"], capsys)
    assert code == 0, err
    label = read_ade_xml(tmp_path / "x" / "TESTDRUG.xml")
    assert label.root.find("Reactions") is not None


def test_annotate_python_api(indexes):
    from linker.extract import annotate
    from linker.link import Linker

    rows = annotate([CASE, "Hair loss."], Linker.load(indexes["meddra"]))
    assert len(rows) == 2 and all(isinstance(r, dict) for doc in rows for r in doc)
    with pytest.raises(InputFormatError, match=r"texts\[1\]"):
        annotate(["ok", " "], Linker.load(indexes["meddra"]))


@pytest.mark.parametrize("content,needles", [
    (b"", ("empty.txt", "non-empty text")),
    (b"nausea\n\x00\x01binary", ("empty.txt:2", "NUL")),
])
def test_bad_text_input_is_one_line_and_exit_1(tmp_path, capsys, content, needles):
    bad = tmp_path / "empty.txt"
    bad.write_bytes(content)
    code, err = cli(["extract", "--input", bad, "--output", tmp_path / "o.jsonl"], capsys)
    assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "o.jsonl").exists()


def test_bad_inputs_and_options_are_one_line(inputs, tmp_path, capsys):
    broken = tmp_path / "broken.xml"
    broken.write_text(TAC_LABEL.replace('len="4" str="rash"', 'len="5" str="rash"'), encoding="utf-8")
    code, err = cli(["extract", "--input", broken, "--output", tmp_path / "o.jsonl"], capsys)
    assert_one_line_error(code, err, "broken.xml:8")
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"text": "ok"}\n{"text": 3}\n', encoding="utf-8")
    code, err = cli(["extract", "--input", bad_jsonl, "--output", tmp_path / "o.jsonl"], capsys)
    assert_one_line_error(code, err, "bad.jsonl:2")
    code, err = cli(["extract", "--input", tmp_path / "missing.txt", "--output", tmp_path / "o.jsonl"], capsys)
    assert_one_line_error(code, err, "missing.txt")
    code, err = cli(["extract", "--input", inputs["txt"], "--output", tmp_path / "o", "--format", "conll"], capsys)
    assert_one_line_error(code, err, "--format")
    code, err = cli(["extract", "--input", inputs["txt"], "--output", inputs["txt"]], capsys)  # never over an input
    assert_one_line_error(code, err, "input")
    assert inputs["txt"].read_text(encoding="utf-8") == CASE
    code, err = cli(["extract", "--input", inputs["txt"], "--output", tmp_path / "o.jsonl", "--threshold", "1.5"],
                    capsys)
    assert_one_line_error(code, err, "--threshold")
    code, err = cli(["annotate", "--index", tmp_path / "no-index", "--input", inputs["txt"], "--output",
                     tmp_path / "o.jsonl"], capsys)
    assert code == 1 and len(err) == 1 and err[0].startswith("error: ")


def _no_load(*args, **kwargs):
    raise AssertionError("a model or index loaded before the inputs were checked")


def test_a_document_over_the_cap_is_refused_naming_it_before_any_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("linker.extract.load_extractor", _no_load)
    big = tmp_path / "big.txt"
    big.write_bytes(b"nausea " * 714_286)  # 5,000,002 bytes: over the 5 MB default, under the readers' 64 MiB
    code, err = cli(["extract", "--input", big, "--output", tmp_path / "o.jsonl"], capsys)
    assert_one_line_error(code, err, "big.txt", "at most 5,000,000 bytes", "5,000,002 bytes", "--max-document-bytes")
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"id": "a", "text": "Nausea."}) + "\n" + json.dumps({"id": "b", "text": "x" * 200})
                    + "\n", encoding="utf-8")
    code, err = cli(["extract", "--input", docs, "--output", tmp_path / "o.jsonl", "--max-document-bytes", "100"],
                    capsys)
    assert_one_line_error(code, err, "docs.jsonl:2", "at most 100 bytes", "200 bytes (id 'b')")
    assert not (tmp_path / "o.jsonl").exists()


def test_the_tokenizer_sees_one_character_window_at_a_time_and_offsets_stay_exact(monkeypatch):
    import linker.extract.model as model
    from linker.extract import load_extractor

    extractor = load_extractor("linker-ae")
    text = " ".join([CASE] * 12)  # 1,800 characters
    whole = extractor.extract([text])[0]  # one window: the default is 100,000 characters
    pieces = model.tokenize(extractor.tokenizer, text)
    seen = []

    class Spy:  # the tokenizer, recording the length of every text it is given
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __call__(self, piece, **kwargs):
            seen.append(len(piece))
            return self.inner(piece, **kwargs)

    monkeypatch.setattr(model, "TOKENIZE_CHARS", 200)
    monkeypatch.setattr(extractor, "tokenizer", Spy(extractor.tokenizer))
    windowed = extractor.extract([text])[0]
    assert len(seen) >= 9 and max(seen) <= 200, seen
    assert windowed == whole and whole and all(text[s.start:s.end] == s.text for s in whole)
    assert model.tokenize(extractor.tokenizer.inner, text) == pieces  # cut at white space: the same word pieces


def test_documents_stream_through_tag_and_write_a_batch_at_a_time(tmp_path, capsys, monkeypatch):
    import linker.extract.io as extract_io
    from linker.extract import load_extractor

    docs = tmp_path / "many.jsonl"
    docs.write_text("".join(json.dumps({"id": i, "text": "nausea"}) + "\n" for i in range(300)), encoding="utf-8")
    read, calls = [], []
    iterate = extract_io.Inputs.__iter__

    def counting(self):  # the run's own reading, after the check pass
        for doc in iterate(self):
            read.append(doc.name)
            yield doc

    extractor = load_extractor("linker-ae")
    real = extractor.extract

    def tag(texts, **kwargs):
        calls.append((len(texts), len(read)))
        return real(texts, **kwargs)

    monkeypatch.setattr(extract_io.Inputs, "__iter__", counting)
    monkeypatch.setattr(extractor, "extract", tag)
    monkeypatch.setattr(extract_io, "BATCH_DOCS", 50)
    out = tmp_path / "o.jsonl"
    code, err = cli(["extract", "--input", docs, "--output", out], capsys)
    assert code == 0, err
    assert err[-1].startswith("extracted ") and "from 300 document(s)" in err[-1]
    # six batches of 50; the reader is never more than one batch (plus the one that closes it) ahead of the tagger
    assert [n for n, _ in calls] == [50] * 6 and all(ahead <= 50 * i + 1 for i, (_, ahead) in enumerate(calls, 1))
    written = {json.loads(line)["doc"] for line in out.read_text(encoding="utf-8").splitlines()}
    assert written <= {str(i) for i in range(300)}


def test_a_broken_jsonl_line_is_reported_before_the_index_or_tagger_loads(indexes, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("linker.link.Linker.load", _no_load)
    monkeypatch.setattr("linker.extract.load_extractor", _no_load)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "text": "nausea"}\n{"id": 2, "text": "rash"}\n{"id": 3, "text": "fever"\n',
                   encoding="utf-8")
    for command in (["extract"], ["annotate", "--index", indexes["meddra"]]):
        code, err = cli([*command, "--input", bad, "--output", tmp_path / "o.jsonl"], capsys)
        assert_one_line_error(code, err, "bad.jsonl:3", "invalid JSON")
    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"id": "a", "text": "nausea"}\n{"id": "b", "text": "rash"}\n{"id": "a", "text": "fever"}\n',
                     encoding="utf-8")
    code, err = cli(["extract", "--input", twice, "--output", tmp_path / "o.jsonl"], capsys)
    assert_one_line_error(code, err, "twice.jsonl:3", "id 'a' a second time (first on line 1)")


def test_annotate_brat_names_the_index_source_as_database(inputs, indexes, tmp_path, capsys):
    from linker.formats.brat import read_brat

    code, err = cli(["annotate", "--index", indexes["hpo"], "--input", inputs["txt"], "--output", tmp_path / "b",
                     "--format", "brat"], capsys)
    assert code == 0, err
    doc = read_brat(tmp_path / "b" / "case1.ann")
    assert doc.normalizations and {n.db for n in doc.normalizations} == {"hpo"}  # not MedDRA:HP:...
    assert all(n.concept_id.startswith("HP:") for n in doc.normalizations)
    code, err = cli(["annotate", "--index", indexes["hpo"], "--input", inputs["txt"], "--output", tmp_path / "c",
                     "--format", "brat", "--db", "HPO"], capsys)
    assert code == 0, err
    assert {n.db for n in read_brat(tmp_path / "c" / "case1.ann").normalizations} == {"HPO"}


def test_special_files_and_symlinked_weights_are_named_for_what_they_are(tmp_path, capsys):
    code, err = cli(["extract", "--input", "/dev/zero", "--output", tmp_path / "o.jsonl"], capsys)
    assert_one_line_error(code, err, "/dev/zero", "expected a file or folder, found a special file")
    assert "no such file" not in err[0]
    copy = tmp_path / "linker-ae"
    shutil.copytree(RELEASE, copy)
    (copy / "weights.safetensors").unlink()
    (copy / "weights.safetensors").symlink_to(RELEASE / "weights.safetensors")
    (tmp_path / "a.txt").write_text(CASE, encoding="utf-8")
    code, err = cli(["extract", "--input", tmp_path / "a.txt", "--output", tmp_path / "o.jsonl", "--model", copy],
                    capsys)
    assert_one_line_error(code, err, "weights.safetensors", "expected a regular file", "found a symlink")
    assert "no such file" not in err[0]


def test_annotate_endpoint(indexes):
    from fastapi.testclient import TestClient

    from linker.service import ServiceLimits, create_app

    app = create_app([indexes["meddra"], indexes["hpo"]], ServiceLimits(max_k=10))
    with TestClient(app) as client:
        response = client.post("/annotate", json={"texts": [{"text": CASE, "id": 7}], "k": 2})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"].startswith("linker-ae==2 sha256:") and body["results"][0]["id"] == 7
        spans = body["results"][0]["spans"]
        assert spans and all(CASE[s["start"]:s["end"]] == s["text"] for s in spans)
        assert {s["code"] for s in spans if s["code"]} & MEDDRA_CODES
        for request, field in [
            ({"texts": []}, "texts"),
            ({"texts": [{"text": "  "}]}, "texts[0].text"),
            ({"texts": [{"text": "x"}], "k": 0}, "k"),
            ({"texts": [{"text": "x"}], "threshold": 2.0}, "threshold"),
            ({"texts": [{"text": "x"}], "review_below": -1.0}, "review_below"),
            ({"texts": [{"text": "x"}], "index": "nope"}, "index"),
            ({"texts": [{"text": "x"}], "style": "words"}, "style"),
            ({"texts": [{"text": "x", "lang": "zz"}]}, "texts[0].lang"),
            ({"texts": [{"txt": "x"}]}, "texts[0].text"),
            ({"texts": "x"}, "texts"),
        ]:
            response = client.post("/annotate", json=request)
            assert response.status_code == 422, (request, response.text)
            assert response.json()["field"] == field, (request, response.json())
        assert app.state.internal_errors == 0


@pytest.mark.slow
def test_annotate_over_a_real_server(indexes, serve):
    import httpx

    with serve("--index", indexes["meddra"]) as server, httpx.Client(base_url=server.base, timeout=60) as http:
        body = http.post("/annotate", json={"texts": [{"text": CASE}]}).json()
        assert {s["code"] for s in body["results"][0]["spans"] if s["code"]} & MEDDRA_CODES
        bad = http.post("/annotate", json={"texts": [{"text": ""}]})
        assert bad.status_code == 422 and bad.json()["field"] == "texts[0].text"


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                     | st.text(max_size=8),
                     lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children,
                                                                                         max_size=3), max_leaves=8)
_TEXT = st.fixed_dictionaries({"text": st.text(max_size=80) | _JSON},
                              optional={"lang": st.sampled_from(["en", "xx", ""]) | _JSON, "id": _JSON})
_REQUEST = st.fixed_dictionaries({"texts": st.lists(_TEXT, max_size=3) | _JSON}, optional={
    "k": st.integers(-2, 12) | _JSON, "threshold": st.floats(-1, 2) | _JSON, "review_below": st.floats(-1, 2),
    "style": st.sampled_from(["auto", "terms", "phrases", "x"]) | _JSON, "index": st.sampled_from(["meddra", "?"])})


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_REQUEST | _JSON)
def test_fuzz_annotate_never_5xx(indexes, body):
    from fastapi.testclient import TestClient

    from linker.service import create_app

    global _FUZZ_CLIENT
    if _FUZZ_CLIENT is None:
        _FUZZ_CLIENT = TestClient(create_app([indexes["meddra"]]))
    response = _FUZZ_CLIENT.post("/annotate", json=body)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert isinstance(response.json()["error"], str)
    assert _FUZZ_CLIENT.app.state.internal_errors == 0


_FUZZ_CLIENT = None


def test_annotate_writes_document_labels_that_eval_scores(inputs, indexes, tmp_path, capsys):
    labels = tmp_path / "pts.txt"
    labels.write_text("".join(f"{code}\n" for code in sorted(MEDDRA_CODES)), encoding="utf-8")
    out = tmp_path / "labels.tsv"
    code, err = cli(["annotate", "--index", indexes["meddra"], "--input", inputs["folder"], "--output", out,
                     "--format", "labels", "--labels", labels], capsys)
    assert code == 0, err
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "doc\t" + "\t".join(sorted(MEDDRA_CODES)) and sorted(line.split("\t")[0] for line in lines[1:]) \
        == ["case1", "sub/case2"]
    coded = tmp_path / "coded.jsonl"  # the same codes as the jsonl output's coded events
    code, err = cli(["annotate", "--index", indexes["meddra"], "--input", inputs["folder"], "--output", coded], capsys)
    rows = [json.loads(line) for line in coded.read_text(encoding="utf-8").splitlines()]
    for line in lines[1:]:
        doc, *cells = line.split("\t")
        found = {c for c, cell in zip(sorted(MEDDRA_CODES), cells) if cell == "1"}
        assert found == {r["code"] for r in rows if r["doc"] == doc and r["decision"] in ("auto", "review")} \
            & MEDDRA_CODES
    code, err = cli(["eval", "--dataset", f"doc-labels:{out}", "--submission", out], capsys)
    assert code == 0, err
    for args, needle in (([], "--format labels and --labels LIST go together"),
                         (["--format", "jsonl", "--labels", labels], "go together: pass --format labels")):
        code, err = cli(["annotate", "--index", indexes["meddra"], "--input", inputs["txt"], "--output",
                         tmp_path / "x.tsv", *(args or ["--format", "labels"])], capsys)
        assert_one_line_error(code, err, needle)
    code, err = cli(["extract", "--input", inputs["txt"], "--output", tmp_path / "y.tsv", "--format", "labels"], capsys)
    assert_one_line_error(code, err, "linker annotate --labels")


def test_output_dash_is_standard_output_and_never_a_file_named_dash(inputs, indexes, tmp_path, capsys,
                                                                      monkeypatch):
    from linker.cli.main import main

    monkeypatch.chdir(tmp_path)
    for command in (["extract"], ["annotate", "--index", str(indexes["meddra"])]):
        capsys.readouterr()
        main([*command, "--input", str(inputs["txt"]), "--output", "-"])
        out, err = capsys.readouterr()
        rows = [json.loads(line) for line in out.splitlines()]
        assert rows and all({"doc", "start", "end", "label"} <= set(r) for r in rows), out
        assert err.strip().splitlines()[-1].endswith(tuple("0123456789s"))  # the summary goes to stderr
        assert not (tmp_path / "-").exists()
        code, lines = cli([*command, "--input", inputs["txt"], "--output", "-", "--format", "brat"], capsys)
        assert_one_line_error(code, lines, "--output -", "jsonl", "brat")
        code, lines = cli([*command, "--input", "-", "--output", tmp_path / "z.jsonl"], capsys)
        assert_one_line_error(code, lines, "--input -", "not standard input", "save the documents to a file")
