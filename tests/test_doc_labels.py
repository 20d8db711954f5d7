"""Document labels (`linker.formats.doc_labels`, the NTCIR-17 SM-ADE shape): reading, writing, scoring, and
`linker eval --dataset doc-labels:GOLD --submission SUB`. No model."""

from __future__ import annotations

import pytest
from conftest import assert_one_line_error, cli

from linker.errors import InputFormatError
from linker.formats.doc_labels import doc_label_lines, read_doc_labels, read_label_list, score_doc_labels


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_lines_read_back_and_score_with_the_task_measures(tmp_path):
    labels = ["10028813", "10019211", "10013573"]
    gold = _write(tmp_path / "gold.tsv", "".join(doc_label_lines(labels, [("a", {"10028813"}), ("b", set()),
                                                                           ("c", {"10019211", "10013573"})])))
    assert gold.read_text().splitlines()[0] == "doc\t10028813\t10019211\t10013573"
    read = read_doc_labels(gold)
    assert read.labels == tuple(labels) and read.docs["c"] == {"10019211", "10013573"}
    # the submission's columns in another order; doc c misses one label, doc b has a spurious one
    sub = _write(tmp_path / "sub.tsv", "doc\t10013573\t10028813\t10019211\na\t0\t1\t0\nb\t0\t1\t0\nc\t0\t0\t1\n")
    scores = score_doc_labels(read, read_doc_labels(sub))
    assert scores["exact_match_accuracy"] == pytest.approx(100 / 3, abs=0.01)
    assert scores["micro"] == {"precision": round(200 / 3, 2), "recall": round(200 / 3, 2), "f1": round(200 / 3, 2)}
    assert scores["per_label"]["10028813"] == {"precision": 50.0, "recall": 100.0, "f1": round(200 / 3, 2), "support": 1}
    assert scores["per_label"]["10013573"]["f1"] == 0.0
    assert scores["macro_f1"] == round((200 / 3 + 100 + 0) / 3, 2)


@pytest.mark.parametrize("text, message", [
    ("", "an empty file"),
    ("id\tA\n", "a header: doc"),
    ("doc\tA\tA\n", "distinct label ids"),
    ("doc\tA\na\t2\n", "values 0 or 1"),
    ("doc\tA\na\t1\t0\n", "1 values 0 or 1"),
    ("doc\tA\na\t1\na\t0\n", "each document once"),
])
def test_bad_label_files_are_one_line_naming_the_line(tmp_path, text, message):
    with pytest.raises(InputFormatError, match=message) as error:
        read_doc_labels(_write(tmp_path / "bad.tsv", text))
    assert "\n" not in str(error.value) and "bad.tsv" in str(error.value)


def test_label_lists_and_mismatched_submissions(tmp_path):
    assert read_label_list(_write(tmp_path / "l.txt", "# PTs\n10028813\tNausea\n\n10019211\n")) == ["10028813", "10019211"]
    for text in ("A\nA\n", "", "doc\n"):
        with pytest.raises(InputFormatError):
            read_label_list(_write(tmp_path / "l.txt", text))
    gold = read_doc_labels(_write(tmp_path / "g.tsv", "doc\tA\tB\na\t1\t0\n"))
    with pytest.raises(InputFormatError, match="label columns"):
        score_doc_labels(gold, read_doc_labels(_write(tmp_path / "s.tsv", "doc\tA\na\t1\n")))
    with pytest.raises(InputFormatError, match="a row for every gold document"):
        score_doc_labels(gold, read_doc_labels(_write(tmp_path / "s.tsv", "doc\tA\tB\nz\t1\t0\n")))


def test_eval_scores_a_submission_and_writes_a_report(tmp_path, capsys):
    gold = _write(tmp_path / "gold.tsv", "doc\tA\tB\na\t1\t0\nb\t0\t1\n")
    sub = _write(tmp_path / "sub.tsv", "doc\tA\tB\na\t1\t0\nb\t1\t1\n")
    code, err = cli(["eval", "--dataset", f"doc-labels:{gold}", "--submission", sub, "--report", tmp_path / "r"], capsys)
    assert code == 0, err
    out = (tmp_path / "r.md").read_text(encoding="utf-8")
    assert "| exact-match accuracy | 50.00 |" in out and "| macro F1 |" in out
    code, err = cli(["eval", "--dataset", f"doc-labels:{tmp_path / 'none.tsv'}", "--submission", sub], capsys)
    assert_one_line_error(code, err, "none.tsv")
    _write(tmp_path / "bad.tsv", "doc\tA\na\tx\n")
    code, err = cli(["eval", "--dataset", f"doc-labels:{gold}", "--submission", tmp_path / "bad.tsv"], capsys)
    assert_one_line_error(code, err, "bad.tsv:2")
