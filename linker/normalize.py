"""Batch normalisation: predicted spans in JSONL, brat or ADE-Eval/TAC-2017 XML -> linked concepts.

Every reader validates its whole input before anything is linked or written, and every writer
goes through `linker.fileio.atomic_file` / `atomic_dir`; so a malformed line in the last of
10,000 files leaves no output at all instead of a half-normalised collection.

Linking goes through `Linker.link` in batches (`BATCH` mentions, grouped by language), with
the index loaded once: the same shape as `Linker.link_batch` on an Arrow record batch, which
is how a distributed engine (Ray `map_batches`, Spark `mapInArrow`) runs this at scale.

Formats (read and written by `linker.formats`, one reader and one writer each, with their checks
and size caps `ReadLimits`):
- ``jsonl``: one span per line, ``{"text": ..., "id"?: ..., "lang"?: ...}``; the output line is
  the input object plus ``candidates`` (ranked). ``lang`` restricts candidates to names in that
  language when the index has some (see `link_texts`).
- ``brat``: a folder of ``.ann`` files (or one file); a normalisation line
  ``N<n>\\tReference T<i> <db>:<id>\\t<name>`` is appended for every text-bound annotation, all
  other lines stay as they were; ``.txt`` and ``.conf`` files are copied. Spans are checked against
  the ``.txt``; with ``lenient`` a span that does not fit is left unnormalised and reported.
- ``ade-xml``: drug labels as in TAC 2017 ADR (root ``Label``) or ADE Eval (root
  ``SubmissionLabel``); adverse-event mentions are resolved from their section's text and a
  ``<Reactions>`` element is written with one ``Reaction`` per distinct (lower-cased) mention
  string and exactly one ``Normalization`` in it (``meddra_pt``, ``meddra_pt_id``, and
  ``meddra_llt``/``meddra_llt_id`` when the matched name was an LLT).

With ``expand_abbreviations``, brat and XML mentions that are abbreviations defined in their own
document ("neuroleptic malignant syndrome (NMS)" ... "NMS") are linked as the long form
(`linker.preprocess`); the brat document is the ``.txt`` beside the ``.ann``, the label's is its
sections. The files keep the mention text as written.
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from linker.errors import ConfigError
from linker.fileio import STDIO, FileNamer, Input, atomic_dir, atomic_file, check_inputs, check_output, model_inputs
from linker.formats import DEFAULT_LIMITS, ReadLimits, input_files
from linker.formats.ade_xml import ADE_MENTION_TYPES, label_text, read_ade_xml, write_ade_xml, write_reactions
from linker.formats.brat import brat_lines, read_brat, write_brat
from linker.formats.jsonl import jsonl_source, read_jsonl, write_jsonl
from linker.formats.writers import WRITERS
from linker.preprocess import expand_abbreviations, find_abbreviations
from linker.progress import bar
from linker.registry import Registry

if TYPE_CHECKING:  # the Linker is only needed for type hints here; callers pass a loaded one
    from linker.formats.brat import BratDoc
    from linker.link import Candidate, Linker, LinkResult

log = logging.getLogger(__name__)


def _formats_from_writers() -> None:
    # A format is added in one place, its `linker.formats.writers.WRITERS` entry (`linker.extract.io`), which names
    # the `normalize_*_path` function below that normalises it; FORMATS is those entries, in their registration order (help texts').
    for name in WRITERS:
        normalize = WRITERS[name].normalize
        if normalize is not None:
            FORMATS.register(name, normalize)


# Input (and output) format -> how a file or folder of it is normalised (`normalize_path`): the WRITERS entries
# that name a `normalize` function.
FORMATS: Registry[Callable[..., NormalizeSummary]] = Registry("input format", load=_formats_from_writers)
# Mentions per Linker.link call: the tf-idf index searches queries in chunks of 1024, so a batch
# of that size is one sparse product; larger batches only add memory.
BATCH = 1024


# --------------------------------------------------------------------------- shared


@dataclass(frozen=True)
class NormalizeSummary:
    """What a run read and wrote."""

    format: str
    output: str
    documents: int
    mentions: int
    linked: int  # mentions with at least one candidate
    skipped: tuple[str, ...] = ()  # --lenient: one message per annotation left out


def link_texts(
    linker: Linker, texts: Sequence[str], langs: Sequence[str | None], *, k: int, batch: int = BATCH,
    reporter=None,
) -> list[LinkResult]:
    """The `LinkResult` of each text (candidates and decision), in input order; batches of `batch`, one
    `Linker.link` call per language.
    `reporter` (a `linker.progress.bar`) is told of every batch done.

    A span's language restricts its candidates to names in that language when the index has
    any; a language the index lacks (a Spanish span against the English default) is linked
    against all names, with a warning, instead of failing the whole batch.
    """
    if len(texts) != len(langs):
        raise ValueError("texts and langs must have the same length")
    langs = linker.usable_langs(langs)  # warned once here, not once a batch
    out: list[LinkResult] = []
    for start in range(0, len(texts), batch):
        stop = min(start + batch, len(texts))
        out += linker.link(texts[start:stop], k=k, langs=langs[start:stop])
        if reporter is not None:
            reporter.update(min(batch, len(texts) - start))
    return out


def usable_langs(linker: Linker, langs: Sequence[str | None]) -> list[str | None]:
    """`Linker.usable_langs`: the one fallback rule for a language the index lacks."""
    return linker.usable_langs(langs)


def _check_k(k: int) -> None:
    if k < 1:
        raise ConfigError(f"--k must be at least 1, found {k}")


# --------------------------------------------------------------------------- JSONL


def batched(items: Iterable, size: int) -> Iterator[list]:
    """Lists of `size` items (the last one shorter), streaming."""
    buffer: list = []
    for item in items:
        buffer.append(item)
        if len(buffer) >= size:
            yield buffer
            buffer = []
    if buffer:
        yield buffer


def normalize_jsonl_lines(
    linker: Linker,
    lines: Callable[[], Iterable[tuple[int, str]]],
    where: str,
    out: TextIO,
    *,
    k: int = 1,
    lang: str | None = None,
) -> NormalizeSummary:
    """Two passes over `lines()`: validate all, then link batch by batch and write one line per span.

    `lines` is a factory so that a file is streamed twice (constant memory) instead of held.
    """
    _check_k(k)
    total = sum(1 for _ in read_jsonl(lines(), where))  # pass 1: nothing is written before this ends
    linked = 0
    with bar(total, desc="linking spans", unit="span") as reporter:
        for spans in batched(read_jsonl(lines(), where), BATCH):
            results = link_texts(linker, [s.text for s in spans], [s.lang or lang for s in spans], k=k,
                                 reporter=reporter)
            for span, result in zip(spans, results, strict=True):
                linked += not result.nil
                record = {**span.record, "candidates": [c.to_dict() for c in result.candidates], "nil": result.nil}
                if result.decision is not None:
                    record["decision"] = result.decision
                write_jsonl(out, record)
    return NormalizeSummary("jsonl", getattr(out, "name", "<stream>"), 1, total, linked)


def normalize_jsonl(
    linker: Linker, input_path: str | Path, output_path: str | Path, *, k: int = 1, lang: str | None = None,
    limits: ReadLimits = DEFAULT_LIMITS, overwrite: bool = False,
) -> NormalizeSummary:
    """JSONL file -> JSONL file, written atomically; `lang` applies to spans without their own."""
    return normalize_jsonl_stream(linker, str(input_path), str(output_path), k=k, lang=lang, limits=limits,
                                  overwrite=overwrite)


def normalize_jsonl_stream(
    linker: Linker, input_path: str, output: str, *, k: int = 1, lang: str | None = None,
    limits: ReadLimits = DEFAULT_LIMITS, overwrite: bool = False,
) -> NormalizeSummary:
    """JSONL in and out where either side may be `-` (stdin / stdout); a file output is written atomically.

    An existing output file is replaced only with `overwrite`, and never when it is an input (the spans,
    or a folder the linker reads: `linker_inputs`).
    """
    check_paths(input_path, output, fmt="jsonl", overwrite=overwrite, inputs=linker_inputs(linker))
    source, where = jsonl_source(input_path, limits)
    if output == STDIO:
        return normalize_jsonl_lines(linker, source, where, sys.stdout, k=k, lang=lang)
    with atomic_file(output) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        summary = normalize_jsonl_lines(linker, source, where, handle, k=k, lang=lang)
    return NormalizeSummary("jsonl", output, 1, summary.mentions, summary.linked)


# --------------------------------------------------------------------------- brat

def brat_db(candidate: Candidate) -> str:
    """brat's database name for a candidate: its source up to the first ':' (umls:MSH -> umls)."""
    return candidate.source.split(":", 1)[0] or "linker"


def linker_inputs(linker: Linker) -> list[Input]:
    """The folders a loaded Linker reads: its index, its re-ranker and its encoder when they are local."""
    encoder = linker.manifest.get("encoder")
    reranker = getattr(linker.reranker, "info", None)
    return [Input(Path(linker.index.folder), "--index"),
            *model_inputs(getattr(reranker, "path", None), "--rerank"),
            *model_inputs(encoder.get("path") if isinstance(encoder, dict) else None, "the index's encoder")]


def check_paths(input_path: str | Path, output: str | Path, *, fmt: str, overwrite: bool = False,
                inputs: Iterable[str | Path | Input] = ()) -> None:
    """Before any work: no output may be, contain or lie inside the input (or the .txt read beside a
    brat file) or any of `inputs` (the index and model folders: `linker_inputs`, or the CLI's options
    before loading); an existing output is replaced only with `overwrite`, a folder only when linker wrote it.

    A folder input gives a folder output (replaced whole); a file input gives file outputs, and a
    single brat file also writes its .txt beside the output. `-` (stdin, stdout) is never checked.
    """
    if str(input_path) != STDIO:
        check_inputs(input_path, option="--input")
    if str(output) == STDIO:
        return
    source, target = Path(input_path), Path(output)
    inputs, outputs = [*([] if str(input_path) == STDIO else [Input(source, "--input")]), *inputs], [target]
    if fmt == "brat" and source.is_file() and source.with_suffix(".txt").is_file():
        inputs.append(Input(source.with_suffix(".txt"), "the text of --input"))
        outputs.append(target.with_suffix(".txt"))
    for path in outputs:
        check_output(path, inputs=inputs, overwrite=overwrite, folder=source.is_dir())


def normalize_brat(
    linker: Linker,
    input_path: str | Path,
    output_path: str | Path,
    *,
    k: int = 1,
    db: str | None = None,
    lang: str | None = None,
    overwrite: bool = False,
    expand: bool = False,
    lenient: bool = False,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> NormalizeSummary:
    """brat .ann file or folder -> the same with normalisation lines, written atomically.

    A folder is mirrored (sub-folders kept); `.txt` and `.conf` files are copied beside. An
    existing output is replaced only with `overwrite` (a folder only when linker wrote it). Annotations whose spans
    do not fit their .txt fail the run, or with `lenient` are left unnormalised and reported.
    """
    if k != 1:
        raise ConfigError(f"the brat format writes one normalisation per annotation; use --k 1 (found --k {k})")
    input_path, output_path = Path(input_path), Path(output_path)
    files = input_files(input_path, ".ann")
    txt = input_path.with_suffix(".txt")
    copy_txt = input_path.is_file() and txt.is_file()
    check_paths(input_path, output_path, fmt="brat", overwrite=overwrite, inputs=linker_inputs(linker))
    extras = sorted([*input_path.rglob("*.txt"), *input_path.rglob("*.conf")]) if input_path.is_dir() else []
    if input_path.is_dir():
        _mirror(input_path, [*files, *extras], output_path)  # the names too are checked before any linking
    docs = [read_brat(p, limits=limits, lenient=lenient) for p in files]  # all validated before any linking
    linked = _link_documents(linker, [[e.text for e in d.entities] for d in docs], lang,
                             documents=[_brat_text(d) for d in docs] if expand else None)
    per_doc = [
        brat_lines(doc, [(db or brat_db(c[0]), c[0].concept_id, c[0].preferred_name) if c else None for c in candidates])
        for doc, candidates in zip(docs, linked, strict=True)
    ]

    if input_path.is_file():
        if copy_txt:
            with atomic_file(output_path.with_suffix(".txt")) as tmp:
                shutil.copyfile(txt, tmp)
        with atomic_file(output_path) as tmp:
            write_brat(per_doc[0], tmp)
    else:
        with atomic_dir(output_path) as tmp:
            targets = _mirror(input_path, [*files, *extras], tmp)
            for lines, target in zip(per_doc, targets[: len(files)], strict=True):
                write_brat(lines, target)
            for extra, target in zip(extras, targets[len(files):], strict=True):
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(extra, target)
    return _summary("brat", output_path, linked, tuple(m for d in docs for m in d.skipped))


# --------------------------------------------------------------------------- ADE Eval / TAC 2017 XML


def _mirror(input_path: Path, files: list[Path], folder: Path) -> list[Path]:
    """Where each file below the folder `input_path` is written below `folder`: at the same path, every part of which
    passes `linker.fileio.safe_stem`, and no two on one name, case ignored (`FileNamer`)."""
    namer = FileNamer(folder)
    out = []
    for path in files:
        relative = path.relative_to(input_path)
        out += namer.files(relative.parts, [""], owner=f"file {relative.as_posix()!r}", where=path)
    return out


def require_meddra(linker: Linker) -> None:
    """ConfigError unless `linker`'s index holds MedDRA concepts: the ade-xml format writes meddra_pt_id."""
    sources = set(linker.concepts.table.column("source").unique().to_pylist())
    if not any(s.split(":", 1)[0] == "meddra" for s in sources):
        raise ConfigError(
            f"the ade-xml format writes MedDRA PT codes (meddra_pt_id), but this index holds "
            f"{', '.join(sorted(sources))}; build an index from a MedDRA concept table "
            "(`linker dict build --source meddra ...`)"
        )


def normalize_ade_xml(
    linker: Linker,
    input_path: str | Path,
    output_path: str | Path,
    *,
    k: int = 1,
    lang: str | None = None,
    overwrite: bool = False,
    check_meddra: bool = True,
    expand: bool = False,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> NormalizeSummary:
    """TAC 2017 / ADE Eval XML file or folder -> the same labels with <Reactions>, written atomically.

    An existing output is replaced only with `overwrite` (a folder only when linker wrote it).
    """
    if k != 1:
        raise ConfigError(f"the ade-xml format writes one Normalization per reaction; use --k 1 (found --k {k})")
    if check_meddra:
        require_meddra(linker)
    input_path, output_path = Path(input_path), Path(output_path)
    files = input_files(input_path, ".xml")
    check_paths(input_path, output_path, fmt="ade-xml", overwrite=overwrite, inputs=linker_inputs(linker))
    if input_path.is_dir():
        _mirror(input_path, files, output_path)  # the names too are checked before any linking
    docs = [read_ade_xml(p, limits=limits) for p in files]
    linked = _link_documents(linker, [[m.text for m in d.mentions] for d in docs], lang,
                             documents=[label_text(d) for d in docs] if expand else None)
    for doc, candidates in zip(docs, linked, strict=True):
        write_reactions(doc, candidates)

    if input_path.is_file():
        with atomic_file(output_path) as tmp:
            write_ade_xml(docs[0], tmp)
    else:
        with atomic_dir(output_path) as tmp:
            for doc, target in zip(docs, _mirror(input_path, files, tmp), strict=True):
                write_ade_xml(doc, target)
    return _summary("ade-xml", output_path, linked)


# --------------------------------------------------------------------------- documents


def _link_documents(
    linker: Linker,
    mentions: Sequence[Sequence[str]],
    lang: str | None,
    *,
    documents: Sequence[str] | None = None,
) -> list[list[tuple[Candidate, ...]]]:
    """The best candidate of every mention of every document, linked in one pass, split per document.

    With `documents` (each document's text), a mention that is an abbreviation the
    document defines is linked as its long form (see the module docstring).
    """
    texts = [text for doc in mentions for text in doc]
    if documents is not None:
        expanded = []
        for document, doc in zip(documents, mentions, strict=True):
            table = find_abbreviations(document)  # once per document
            expanded += [expand_abbreviations(text, table) for text in doc]
        log.info("expanded %d of %d mentions using abbreviations defined in their documents",
                 sum(a != b for a, b in zip(texts, expanded)), len(texts))
        texts = expanded
    with bar(len(texts), desc="linking mentions", unit="mention") as reporter:
        flat = [r.candidates for r in link_texts(linker, texts, [lang] * len(texts), k=1, reporter=reporter)]
    out, pos = [], 0
    for doc in mentions:
        out.append(flat[pos : pos + len(doc)])
        pos += len(doc)
    return out


def _summary(
    fmt: str, output_path: Path, linked: list[list[tuple[Candidate, ...]]], skipped: tuple[str, ...] = ()
) -> NormalizeSummary:
    flat = [candidates for doc in linked for candidates in doc]
    return NormalizeSummary(fmt, str(output_path), len(linked), len(flat), sum(1 for c in flat if c), skipped)


def _brat_text(doc: BratDoc) -> str:
    if doc.text is None:
        log.warning("%s: no .txt beside it; its abbreviations are not expanded", doc.path)
        return ""
    return doc.text


# --------------------------------------------------------------------------- dispatch


def normalize_path(
    linker: Linker,
    input_path: str | Path,
    output_path: str | Path,
    *,
    fmt: str,
    k: int = 1,
    db: str | None = None,
    lang: str | None = None,
    overwrite: bool = False,
    expand_abbreviations: bool = False,
    lenient: bool = False,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> NormalizeSummary:
    """Normalise a file or folder in format `fmt` (a name in FORMATS) into `output_path`.

    `expand_abbreviations` (brat, ade-xml): link abbreviations defined in the document as their long form.
    `lenient` (brat): leave annotations whose spans do not fit the .txt unnormalised instead of failing.
    """
    return FORMATS.get(fmt)(linker, input_path, output_path, k=k, db=db, lang=lang, overwrite=overwrite,
                            expand=expand_abbreviations, lenient=lenient, limits=limits)


# Each format's `normalize` (named by its WRITERS entry, `linker.extract.io`) takes `normalize_path`'s arguments
# (`expand` = expand_abbreviations) and uses those it has.


def normalize_jsonl_path(linker: Linker, input_path, output_path, *, k, db, lang, overwrite, expand, lenient,
                        limits) -> NormalizeSummary:
    if expand:
        raise ConfigError("--expand-abbreviations needs the documents: use --format brat or ade-xml")
    return normalize_jsonl(linker, input_path, output_path, k=k, lang=lang, limits=limits, overwrite=overwrite)


def normalize_brat_path(linker: Linker, input_path, output_path, *, k, db, lang, overwrite, expand, lenient,
                        limits) -> NormalizeSummary:
    return normalize_brat(linker, input_path, output_path, k=k, db=db, lang=lang, overwrite=overwrite,
                          expand=expand, lenient=lenient, limits=limits)


def normalize_ade_xml_path(linker: Linker, input_path, output_path, *, k, db, lang, overwrite, expand, lenient,
                           limits) -> NormalizeSummary:
    return normalize_ade_xml(linker, input_path, output_path, k=k, lang=lang, overwrite=overwrite, expand=expand,
                             limits=limits)


__all__ = [
    "ADE_MENTION_TYPES",
    "BATCH",
    "FORMATS",
    "NormalizeSummary",
    "batched",
    "require_meddra",
    "link_texts",
    "normalize_ade_xml",
    "normalize_ade_xml_path",
    "normalize_brat",
    "normalize_brat_path",
    "normalize_jsonl",
    "normalize_jsonl_path",
    "normalize_jsonl_lines",
    "normalize_jsonl_stream",
    "normalize_path",
    "check_paths",
    "linker_inputs",
    "usable_langs",
]
