"""Index folders: build one from a concept table, load one back, by kind name.

Kinds (`available_kinds()`):
- ``tfidf``: character n-gram tf-idf, exact sparse cosine (`linker.index.tfidf`).
- ``dense``: an encoder's name embeddings in FAISS (`linker.index.dense`).
- ``hybrid``: BioSyn-style ``sparse_weight * sparse + dense`` over the union of both candidate
  lists (`linker.index.hybrid`).

Every kind's name index maps a query to *name rows*: row i is row i of the folder's own copy of
the concept table (``concepts.parquet``). `linker.retrieve` turns name rows into concepts.
A folder is built in a temporary sibling and renamed into place, so a failed build leaves the
previous index untouched.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import logging
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

import linker
from linker.dictionary import ConceptTable, hierarchy_path, read_concept_table
from linker.errors import ConfigError, IndexMismatchError, InputFormatError
from linker.fileio import Input, atomic_dir, check_output, model_inputs
from linker.folders import JSON_MAX_BYTES, LARGE_MAX_BYTES, folder_file, read_folder_json
from linker.index.manifest import CONCEPTS, HIERARCHY, INDEX_FORMAT, MANIFEST, read_manifest, verify, write_manifest
from linker.precision import check_precision
from linker.registry import Registry
from linker.text import code_key, normalize

log = logging.getLogger(__name__)


class NameIndex(Protocol):
    """What every kind provides to `linker.retrieve` and `linker.link`: all of it, so that no caller has to
    probe for a method. `NameIndexBase` gives the optional parts their defaults."""

    kind: str

    @property
    def size(self) -> int: ...

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores (q, k) float32, name rows (q, k) int64, -1 = no name), best first."""
        ...

    def encode_queries(self, queries: Sequence[str]) -> Any:
        """The queries as the vectors `search_vectors` takes, or None: this index searches the texts."""
        ...

    def search_vectors(self, vectors: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`search` with the vectors `encode_queries` returned (only called when it returned some)."""
        ...

    def first_fetch(self, k: int) -> int | None:
        """Names `linker.retrieve` asks for first to find k concepts; None: the retriever's default."""
        ...

    @property
    def searches_concepts(self) -> bool:
        """Whether `search_concepts` finds the top-k concepts itself, in one search."""
        ...

    def search_concepts(self, queries: Sequence[str], codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best concepts per query (`codes`: each name row's concept code), each as its best name row."""
        ...

    @property
    def query_precision(self) -> str | None:
        """The precision queries are encoded in (fp32, bf16, int8); None when no encoder runs."""
        ...

    @property
    def ngram_index(self) -> Any:
        """The tf-idf index whose shared n-grams explain a match (`TfidfNameIndex.explain`), or None."""
        ...


class NameIndexBase:
    """The defaults of `NameIndex`'s optional parts, for a kind that searches texts, fetches names and has
    neither an encoder nor n-grams. A kind overrides what it has."""

    searches_concepts = False

    def encode_queries(self, queries: Sequence[str]) -> Any:
        return None

    def search_vectors(self, vectors: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError(f"{type(self).__name__} searches texts: its encode_queries returns None")

    def first_fetch(self, k: int) -> int | None:
        return None

    def search_concepts(self, queries: Sequence[str], codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError(f"{type(self).__name__} does not search concepts (searches_concepts is False)")

    @property
    def query_precision(self) -> str | None:
        return None

    @property
    def ngram_index(self) -> Any:
        return None


@dataclass(frozen=True)
class IndexKind:
    """How one kind turns a config into files and back.

    `load` takes an optional ``precision`` keyword (dense parts: the precision queries are
    encoded in, None = the one the index recorded; tf-idf ignores it).
    """

    name: str
    config_type: type
    build: Callable[[Sequence[str], Any, Path], dict]  # (names, config, folder) -> extra manifest fields
    load: Callable[..., NameIndex]  # (folder, config, manifest, precision=None) -> index
    config_from_dict: Callable[[dict], Any]
    # Modules `load` imports: imported in a thread while the files are verified (torch and sentence-transformers take
    # seconds of Python; hashing GBs of vectors runs in C, without the GIL), eval/scale/report.md's first answer.
    preload: tuple[str, ...] = ()


def _import_in_background(modules: tuple[str, ...]) -> None:
    def run() -> None:
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception:  # noqa: BLE001 - the loader's own import reports a missing extra in one line
                return

    if modules:
        threading.Thread(target=run, name="linker-preload", daemon=True).start()


def _tfidf_kind() -> IndexKind:
    from linker.index.tfidf import TfidfConfig, TfidfNameIndex, config_from_manifest

    def build(names: Sequence[str], config: TfidfConfig, folder: Path) -> dict:
        index = TfidfNameIndex.build(names, config)
        index.save(folder)
        return {"features": index.matrix.shape[1], "search": index.search_method}

    def load(folder: Path, config: TfidfConfig, manifest: dict, precision: str | None = None) -> NameIndex:
        return TfidfNameIndex.load(folder, config)

    return IndexKind("tfidf", TfidfConfig, build, load, config_from_manifest)


def _dense_kind() -> IndexKind:
    from linker.index.dense import dense_kind

    return dense_kind()


def _hybrid_kind() -> IndexKind:
    from linker.index.hybrid import hybrid_kind

    return hybrid_kind()


# Each entry is a factory, called when the kind is used, so that a tf-idf user never imports torch.
KINDS: Registry[Callable[[], IndexKind]] = Registry("index kind")
KINDS.register("tfidf", _tfidf_kind)
KINDS.register("dense", _dense_kind)
KINDS.register("hybrid", _hybrid_kind)


def available_kinds() -> list[str]:
    return KINDS.names()


def get_kind(name: str) -> IndexKind:
    return KINDS.get(name)()


@dataclass
class LoadedIndex:
    """An index folder read back: its manifest, the kind's name index, and its concept table."""

    folder: Path
    manifest: dict
    names: NameIndex
    concepts: ConceptTable

    @property
    def kind(self) -> str:
        return self.manifest["kind"]


def build_index(
    dict_path: str | Path, *, kind: str, out: str | Path, config: Any = None, reranker: str | Path | None = None,
    prior: Sequence[str] = (), overwrite: bool = False,
) -> dict:
    """Build an index of `kind` over the names of the concept table at `dict_path`; return the manifest.

    `config` is the kind's config dataclass (`TfidfConfig`, `DenseConfig`, `HybridConfig`);
    None takes its defaults. The resolved config is recorded in the manifest. `reranker`: a
    re-ranker folder (`linker train rerank`) copied into the index and used by default when linking.
    `prior`: labelled dataset specs (`linker eval --dataset` syntax) whose gold concepts are counted into
    ``concept_prior.json``: among concepts tied at equal scores the one annotated most often for that name ranks
    first, then the most annotated overall (`linker.link.Linker`, `ConceptIndex`).
    An existing `out` is replaced only with `overwrite`, and only when it is a folder that linker wrote.
    """
    spec = get_kind(kind)
    config = spec.config_type() if config is None else config
    if not isinstance(config, spec.config_type):
        raise ConfigError(f"index kind {kind!r} takes a {spec.config_type.__name__}, found {type(config).__name__}")
    out = Path(out)
    from linker.datasets import spec_inputs  # the dataset readers: needed by a build with --prior only

    # Every path the build reads is an input the index folder may not touch: the table, its side table,
    # the re-ranker and encoder folders, the prior's datasets and the files their options name.
    encoder = getattr(config, "encoder", None) or getattr(getattr(config, "dense", None), "encoder", None)
    inputs = [Input(Path(dict_path), "--dict"), Input(hierarchy_path(Path(dict_path)), "--dict's hierarchy side table"),
              *model_inputs(reranker, "--reranker"),
              *model_inputs(encoder, "--encoder"), *(i for spec in prior for i in spec_inputs(spec, "--prior"))]
    check_output(out, inputs=inputs, overwrite=overwrite, folder=True,
                 option="--out")
    table = read_concept_table(dict_path)
    if table.table.num_rows == 0:
        raise InputFormatError(dict_path, "a concept table with at least one name", "0 rows (an empty vocabulary)",
                               fix="check the filters of `linker dict build`")
    import pyarrow as pa
    import pyarrow.compute as pc

    started = time.perf_counter()
    built_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    names = table.table.column("name").to_pylist()
    concepts = pc.count_distinct(table.table.column("concept_id")).as_py()
    table_entry = {"path": CONCEPTS, "source_path": str(Path(dict_path).resolve()), "sha256": table.sha256,
                   "rows": table.table.num_rows,
                   "hierarchy_rows": 0 if table.hierarchy is None else table.hierarchy.num_rows}
    with atomic_dir(out) as tmp:
        shutil.copyfile(table.path, tmp / CONCEPTS)
        if table.hierarchy is not None:
            shutil.copyfile(hierarchy_path(table.path), hierarchy_path(tmp / CONCEPTS))
        extra = {"prior": write_prior(table, prior, tmp)} if prior else {}
        # The names are all the build reads from here on: the Arrow table (5M names: 0.7 GB, and as much again
        # that the pool kept from reading it) is let go before the build's own peak, not held through it.
        del table
        pa.default_memory_pool().release_unused()
        extra = {**spec.build(names, config, tmp), **extra}
        if reranker is not None:
            from linker.rerank import bind_reranker

            extra["reranker"] = bind_reranker(reranker, tmp)
        manifest = {
            "format": INDEX_FORMAT,
            "kind": kind,
            "parameters": asdict(config),
            "concepts": table_entry,
            "encoder": extra.pop("encoder", None),
            "library_version": linker.__version__,
            "built_at": built_at,
            "build_seconds": round(time.perf_counter() - started, 3),
            "counts": {"names": len(names), "concepts": concepts},
            **extra,
        }
        manifest = write_manifest(tmp, manifest)
    log.debug("built %s index %s: %d names of %d concepts in %.1fs", kind, out, len(names), concepts,
             manifest["build_seconds"])
    return manifest


PRIOR = "concept_prior.json"
# A prior holds counts per gold concept and per (mention text, concept) of a labelled training set: a few MB for
# the largest we use; read whole into Python objects, so bounded like the other metadata JSON.
PRIOR_MAX_BYTES = JSON_MAX_BYTES


def write_prior(table: ConceptTable, specs: Sequence[str], folder: Path) -> dict:
    """Count how often each concept of `table` is gold in the labelled `specs`, and how often for each mention text;
    write `PRIOR`; return its manifest entry.

    A gold id counts for the table's concept with the same code (`linker.text.code_key`: prefixes and case as
    evaluation compares them); gold ids the table lacks are counted apart, so a prior from another terminology
    shows in the manifest instead of silently doing nothing. Per text (`prior_key`, mentions with one gold part):
    the name tie order of `linker.link` (Cantemist's annotators coded "neoplásica" 8000/1 36 times and 8000/3 5 times,
    while 8000/3 is the most annotated code overall)."""
    from linker.datasets import load_dataset

    by_key = {code_key(cid): cid for cid in table.table.column("concept_id").unique().to_pylist()}
    counts: Counter[str] = Counter()
    per_name: dict[str, Counter[str]] = {}
    mentions = unmatched = 0
    for spec in specs:
        for mention in load_dataset(spec):
            mentions += 1
            for gold in {g for part in mention.gold for g in part}:
                concept = by_key.get(code_key(gold))
                if concept is None:
                    unmatched += 1
                    continue
                counts[concept] += 1
                if len(mention.gold) == 1:
                    per_name.setdefault(prior_key(mention.text), Counter())[concept] += 1
    if not counts:
        raise InputFormatError(", ".join(specs), "labelled mentions whose gold ids are concepts of the dictionary",
                               f"{mentions} mentions, none with a gold id among its {len(by_key):,} concepts",
                               fix="--prior takes the labelled training data of this terminology")
    names = {text: dict(sorted(c.items())) for text, c in sorted(per_name.items())}
    rows, row_counts = name_row_counts(table.table.column("name").to_pylist(),
                                       table.table.column("concept_id").to_pylist(), names)
    (folder / PRIOR).write_text(json.dumps({"specs": list(specs), "counts": dict(sorted(counts.items())),
                                            "names": names, "name_rows": {"row": rows, "count": row_counts}},
                                           indent=0, ensure_ascii=False), encoding="utf-8")
    return {"file": PRIOR, "specs": list(specs), "mentions": mentions, "concepts": len(counts),
            "names": len(names), "name_rows": len(rows), "gold_ids_not_in_dictionary": unmatched}


def name_row_counts(names: Sequence[str], concept_ids: Sequence[str], per_name: dict[str, dict[str, int]]
                    ) -> tuple[list[int], list[int]]:
    """The name rows whose text annotators chose the row's concept for, and how often (the rows `per_name` touches).

    Computed once when the index is built: it normalises every name (~3 µs each, seconds for a terminology of
    millions of names), which the Linker would otherwise repeat at every load."""
    rows, row_counts = [], []
    for row, (name, concept_id) in enumerate(zip(names, concept_ids)):
        count = name_count(per_name, name, concept_id)
        if count:
            rows.append(row)
            row_counts.append(count)
    return rows, row_counts


def prior_key(text: str) -> str:
    """How a mention text and a dictionary name are compared for the per-name prior (punctuation as spaces)."""
    return normalize(text, "words")


def name_count(per_name: dict[str, dict[str, int]], text: str, concept_id: str) -> int:
    """How often annotators chose `concept_id` for a mention reading `text` (`prior_key` equal)."""
    return per_name.get(prior_key(text), {}).get(concept_id, 0)


@dataclass(frozen=True)
class Prior:
    """An index's tie prior: gold counts per concept, and per (mention text `prior_key`, concept)."""

    concepts: dict[str, int]
    names: dict[str, dict[str, int]]
    name_rows: tuple[list[int], list[int]] | None = None  # `name_row_counts`; None in indexes built before it


def read_prior(index: LoadedIndex) -> Prior | None:
    """The prior an index was built with (`build_index(prior=...)`), or None (indexes built before the per-name
    counts have none of those)."""
    entry = index.manifest.get("prior")
    if not entry:
        return None
    # `check_manifest` made 'prior.file' a listed (so verified) file; `read_folder_json` keeps it inside the
    # folder, a regular file of bounded size.
    path = index.folder / entry["file"]
    data = read_folder_json(index.folder, entry["file"], what="a concept prior (from `linker index build --prior`)",
                            max_bytes=PRIOR_MAX_BYTES, named_by=f"{index.folder / MANIFEST}: field 'prior.file'")

    def refuse(field: str, expected: str, found: object) -> InputFormatError:
        return InputFormatError(path, f"{field!r} as {expected}", f"{type(found).__name__} {str(found)[:60]!r}",
                                fix="rebuild the index with `linker index build --prior`")

    def counts(field: str, value: object) -> dict[str, int]:
        if not isinstance(value, dict) or not all(type(n) is int and n >= 0 for n in value.values()):
            raise refuse(field, "an object {concept id: count >= 0}", value)
        return value

    concepts = counts("counts", data.get("counts"))
    names = data.get("names", {})
    if not isinstance(names, dict):
        raise refuse("names", "an object {mention text: {concept id: count}}", names)
    for text, per_concept in names.items():
        counts(f"names.{text[:40]}", per_concept)
    rows = data.get("name_rows")
    name_rows = None
    if rows is not None:
        if not isinstance(rows, dict) or not all(isinstance(rows.get(key), list) for key in ("row", "count")):
            raise refuse("name_rows", 'an object {"row": [...], "count": [...]}', rows)
        size = index.concepts.table.num_rows
        if (len(rows["row"]) != len(rows["count"]) or not all(type(r) is int and 0 <= r < size for r in rows["row"])
                or not all(type(c) is int and c >= 0 for c in rows["count"])):
            raise refuse("name_rows", f"equally long lists of name rows in 0..{size - 1} and counts >= 0", rows)
        name_rows = (rows["row"], rows["count"])
    return Prior(concepts, names, name_rows)


def load_index(folder: str | Path, *, checksums: bool = True, precision: str | None = None) -> LoadedIndex:
    """Read an index folder after checking its manifest against its files (IndexMismatchError if not).

    precision: how a dense part encodes queries (auto, fp32, bf16, int8; None = the precision
    its names were encoded in, `linker.precision.resolve_precision`).
    """
    check_precision(precision)
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest["kind"] not in KINDS:
        raise IndexMismatchError(
            f"{folder / MANIFEST}: unknown index kind {manifest['kind']!r} (this library knows "
            f"{', '.join(available_kinds())}); rebuild it with `linker index build`"
        )
    spec = get_kind(manifest["kind"])
    _import_in_background(spec.preload)
    verify(folder, manifest, checksums=checksums)
    try:
        config = spec.config_from_dict(manifest.get("parameters", {}))
    except (TypeError, ValueError, KeyError) as exc:  # a missing or mistyped parameter (`typed_parameters`)
        raise IndexMismatchError(f"{folder / MANIFEST}: parameters do not fit this library ({exc}); rebuild the index") from None
    # The concept table and its MedDRA side table (read when present): inside the folder, regular, listed.
    for name in (CONCEPTS, HIERARCHY):
        if os.path.lexists(folder / name):
            folder_file(folder, name, max_bytes=LARGE_MAX_BYTES, what="a parquet concept table")
            if name not in manifest["files"]:
                raise IndexMismatchError(f"{folder / name}: not listed in the manifest (added after the build); "
                                         "remove it or rebuild the index")
    concepts = read_concept_table(folder / CONCEPTS)
    names = spec.load(folder, config, manifest, precision=precision)
    if names.size != concepts.table.num_rows:
        raise IndexMismatchError(
            f"{folder}: the index has {names.size} names, concepts.parquet {concepts.table.num_rows} rows; rebuild the index"
        )
    return LoadedIndex(folder=folder, manifest=manifest, names=names, concepts=concepts)
