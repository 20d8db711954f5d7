"""Document labels (the NTCIR-17 MedNLP-SC social-media ADE shape): one row per document, 0 or 1 per listed concept.

A tab-separated file with a header: ``doc`` then one column per label (a concept id, e.g. a MedDRA PT id), then
one row per document: its id and a 0 or 1 under each label, 1 when the document reports that adverse event.
`linker annotate --format labels --labels LIST` writes it (`labels_of`: a positive, coded adverse event whose code
is listed); `linker eval --dataset doc-labels:GOLD --submission SUB` scores it with the task's measures
(`score_doc_labels`): exact-match accuracy (every label of a document right), per-label precision / recall / F1,
and micro and macro F1.

A label list (``--labels``) is a text file of one concept id a line, optionally a tab and its name; # comments.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from linker.errors import InputFormatError, shorten
from linker.fileio import iter_lines

HEADER = "doc"


@dataclass(frozen=True)
class DocLabels:
    """A document-labels file read back: its label columns in order and each document's set of labels."""

    labels: tuple[str, ...]
    docs: dict[str, frozenset[str]]


def read_label_list(path: str | Path) -> list[str]:
    """The concept ids of a label list, in order; one line naming the file and line for a bad or repeated one."""
    out: list[str] = []
    for number, line in iter_lines(path):
        if not line.strip() or line.startswith("#"):
            continue
        label = line.split("\t")[0].strip()
        if not label or label == HEADER or "\t" in label or label in out:
            raise InputFormatError(path, "a concept id, once, then optionally a tab and its name",
                                   shorten(line), line=number)
        out.append(label)
    if not out:
        raise InputFormatError(path, "at least one concept id", "no label")
    return out


def read_doc_labels(path: str | Path) -> DocLabels:
    """A document-labels file: a header ``doc<TAB>label...``, then ``id<TAB>0|1...`` rows."""
    labels: tuple[str, ...] | None = None
    docs: dict[str, frozenset[str]] = {}
    for number, line in iter_lines(path):
        if not line.strip():
            continue
        cells = line.split("\t")
        if labels is None:
            if cells[0] != HEADER or len(cells) < 2 or len(set(cells[1:])) != len(cells) - 1 or not all(cells[1:]):
                raise InputFormatError(path, "a header: doc, then distinct label ids, tab-separated", shorten(line),
                                       line=number)
            labels = tuple(cells[1:])
            continue
        if len(cells) != len(labels) + 1 or any(c not in ("0", "1") for c in cells[1:]) or not cells[0]:
            raise InputFormatError(path, f"a document id and {len(labels)} values 0 or 1, tab-separated",
                                   shorten(line), line=number)
        if cells[0] in docs:
            raise InputFormatError(path, "each document once", f"document {shorten(cells[0])} again", line=number)
        docs[cells[0]] = frozenset(label for label, cell in zip(labels, cells[1:]) if cell == "1")
    if labels is None:
        raise InputFormatError(path, "a header: doc, then the label ids", "an empty file")
    return DocLabels(labels, docs)


def doc_label_lines(labels: Sequence[str], rows: Iterable[tuple[str, Iterable[str]]]) -> Iterable[str]:
    """The file's lines: the header, then each (document id, its labels) as 0/1 under `labels`."""
    yield "\t".join((HEADER, *labels)) + "\n"
    for doc, found in rows:
        found = set(found)
        yield "\t".join((doc, *("1" if label in found else "0" for label in labels))) + "\n"


def score_doc_labels(gold: DocLabels, submission: DocLabels, *, where: str = "--submission") -> dict:
    """Exact-match accuracy, per-label P/R/F1 (in %), micro and macro F1 of `submission` against `gold`: the same
    label columns (in any order) and every gold document, or one line saying what differs."""
    if set(submission.labels) != set(gold.labels):
        missing, extra = sorted(set(gold.labels) - set(submission.labels)), sorted(set(submission.labels) - set(gold.labels))
        raise InputFormatError(where, "the gold file's label columns", f"missing {missing[:5]}, extra {extra[:5]}")
    absent = [doc for doc in gold.docs if doc not in submission.docs]
    if absent:
        raise InputFormatError(where, "a row for every gold document", f"{len(absent)} missing, first {shorten(absent[0])}")
    per_label, exact = {}, 0
    totals = {"tp": 0, "fp": 0, "fn": 0}
    for doc, truth in gold.docs.items():
        exact += truth == submission.docs[doc]
    for label in gold.labels:
        tp = sum(label in truth and label in submission.docs[doc] for doc, truth in gold.docs.items())
        fp = sum(label not in truth and label in submission.docs[doc] for doc, truth in gold.docs.items())
        fn = sum(label in truth and label not in submission.docs[doc] for doc, truth in gold.docs.items())
        per_label[label] = {**_prf(tp, fp, fn), "support": tp + fn}
        totals = {"tp": totals["tp"] + tp, "fp": totals["fp"] + fp, "fn": totals["fn"] + fn}
    n = len(gold.docs)
    return {"documents": n, "labels": len(gold.labels), "exact_match_accuracy": round(100 * exact / n, 2) if n else 0.0,
            "micro": _prf(totals["tp"], totals["fp"], totals["fn"]),
            "macro_f1": round(sum(v["f1"] for v in per_label.values()) / len(per_label), 2), "per_label": per_label}


def _prf(tp: int, fp: int, fn: int) -> dict:
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return {"precision": round(100 * p, 2), "recall": round(100 * r, 2),
            "f1": round(200 * p * r / (p + r), 2) if p + r else 0.0}


__all__ = ["DocLabels", "doc_label_lines", "read_doc_labels", "read_label_list", "score_doc_labels"]
