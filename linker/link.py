"""The Linker: an index folder loaded once, mentions in, ranked concept candidates out.

    linker = Linker.load("indexes/default")
    [result] = linker.link(["chest wall pain"], k=5)
    result.candidates[0].concept_id

`link` is the one entry point used by the CLI, the batch normaliser, the HTTP service and the
evaluation harness. `link_batch` is the same thing as a pure function from an Arrow record batch
to an Arrow record batch, so a distributed engine (Ray Data ``map_batches``, Spark
``mapInArrow``) can run it with one Linker per worker.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from linker.dictionary import ConceptTable
from linker.errors import InputFormatError, UnknownNameError, shorten
from linker.index import LoadedIndex, load_index
from linker.retrieve import ConceptHits, ConceptIndex, top_concepts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeddraPath:
    """One PT -> HLT -> HLGT -> SOC path; a PT has one primary path and possibly secondary ones."""

    hlt_code: str
    hlt_name: str
    hlgt_code: str
    hlgt_name: str
    soc_code: str
    soc_name: str
    primary_soc: bool


@dataclass(frozen=True)
class Candidate:
    """A concept proposed for a mention, with the dictionary name that matched best."""

    concept_id: str
    preferred_name: str
    matched_name: str
    score: float
    lang: str  # language of the matched name
    source: str
    term_id: str  # the source's id of the matched name (e.g. the MedDRA LLT code)
    term_type: str
    hierarchy: tuple[MeddraPath, ...] = ()  # MedDRA PTs only, primary path first

    def to_dict(self) -> dict:
        """The JSON form shared by `linker link --json`, the normaliser and the HTTP service."""
        out = asdict(self)
        out["score"] = round(float(self.score), 6)
        if not self.hierarchy:
            del out["hierarchy"]  # only MedDRA candidates carry one
        return out


@dataclass(frozen=True)
class LinkResult:
    mention: str
    candidates: tuple[Candidate, ...]

    def to_dict(self) -> dict:
        return {"mention": self.mention, "candidates": [c.to_dict() for c in self.candidates]}


_PATH_TYPE = pa.struct([(f, pa.string()) for f in MeddraPath.__dataclass_fields__ if f != "primary_soc"]
                       + [("primary_soc", pa.bool_())])
CANDIDATE_TYPE = pa.struct(
    [
        ("concept_id", pa.string()),
        ("preferred_name", pa.string()),
        ("matched_name", pa.string()),
        ("score", pa.float32()),
        ("lang", pa.string()),
        ("source", pa.string()),
        ("term_id", pa.string()),
        ("term_type", pa.string()),
        ("hierarchy", pa.list_(_PATH_TYPE)),
    ]
)
"""Arrow type of one candidate in `Linker.link_batch`'s ``candidates`` column (a list of these)."""


class Linker:
    """Links mentions to concepts with one index folder.

    `lang` *restricts* candidates to names of that language (exactly, see `linker.retrieve`);
    it does not boost. The preferred name shown is the concept's preferred name in the
    mention's language when given, else English, else any language's.
    """

    def __init__(self, index: LoadedIndex) -> None:
        self.index = index
        table = index.concepts.table
        self._concepts = ConceptIndex(table.column("concept_id"))
        self._names: list[str] = table.column("name").to_pylist()
        self._term_ids: list[str] = table.column("term_id").to_pylist()
        self._langs, self._lang_codes = self._encode(table.column("lang"))
        self._sources, self._source_codes = self._encode(table.column("source"))
        self._types, self._type_codes = self._encode(table.column("term_type"))
        self._preferred = table.column("preferred").to_numpy()
        codes = self._concepts.codes
        self._by_concept = np.argsort(codes, kind="stable")  # name rows grouped by concept, table order within
        self._starts = np.searchsorted(codes[self._by_concept], np.arange(len(self._concepts) + 1))
        self._lang_masks: dict[str, np.ndarray] = {}
        self._preferred_cache: dict[tuple[int, str | None], str] = {}
        self._hierarchy = self._read_hierarchy(index.concepts.hierarchy)

    @staticmethod
    def _encode(column: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
        encoded = pc.dictionary_encode(column).combine_chunks()
        return encoded.dictionary.to_pylist(), encoded.indices.to_numpy(zero_copy_only=False)

    @staticmethod
    def _read_hierarchy(table: pa.Table | None) -> dict[str, list[dict]]:
        paths: dict[str, list[dict]] = {}
        if table is None:
            return paths
        for row in table.to_pylist():
            paths.setdefault(row["pt_code"], []).append(row)
        return paths

    @classmethod
    def load(cls, index_dir: str | Path, *, checksums: bool = True) -> Linker:
        """Load and verify an index folder (IndexMismatchError when its files do not match its manifest)."""
        return cls(load_index(index_dir, checksums=checksums))

    @property
    def manifest(self) -> dict:
        return self.index.manifest

    @property
    def concepts(self) -> ConceptTable:
        return self.index.concepts

    @property
    def version(self) -> str:
        """Index folder name, kind, build time and concept-table sha256 prefix: enough to reproduce a result."""
        m = self.manifest
        return f"{self.index.folder.name}:{m['kind']}:{m['built_at']}:{m['concepts']['sha256'][:12]}"

    @property
    def languages(self) -> list[str]:
        return sorted(self._langs)

    def _allowed(self, lang: str | None) -> np.ndarray | None:
        if lang is None:
            return None
        if lang not in self._langs:
            raise UnknownNameError("language in this index", lang, self._langs)
        if lang not in self._lang_masks:
            self._lang_masks[lang] = self._lang_codes == self._langs.index(lang)
        return self._lang_masks[lang]

    def preferred_name(self, concept: int, lang: str | None) -> str:
        key = (concept, lang)
        if key not in self._preferred_cache:
            rows = self._by_concept[self._starts[concept] : self._starts[concept + 1]]
            langs = [self._langs[self._lang_codes[r]] for r in rows]
            preferred = [bool(self._preferred[r]) for r in rows]
            choice = None
            for wanted in (lang, "en", None):
                for r, row_lang, pref in zip(rows, langs, preferred):
                    if pref and (wanted is None or row_lang == wanted):
                        choice = r
                        break
                if choice is not None:
                    break
            if choice is None:  # no name flagged preferred: the first name, in the mention's language if any
                same = [r for r, row_lang in zip(rows, langs) if row_lang == lang]
                choice = same[0] if same else rows[0]
            self._preferred_cache[key] = self._names[choice]
        return self._preferred_cache[key]

    def _paths(self, concept_id: str, lang: str | None) -> tuple[MeddraPath, ...]:
        rows = self._hierarchy.get(concept_id)
        if not rows:
            return ()
        for wanted in (lang, "en"):
            chosen = [r for r in rows if r["lang"] == wanted]
            if chosen:
                rows = chosen
                break
        rows = sorted(rows, key=lambda r: (not r["primary_soc"], r["soc_code"], r["hlgt_code"], r["hlt_code"]))
        return tuple(MeddraPath(**{f: r[f] for f in MeddraPath.__dataclass_fields__}) for r in rows)

    def _candidates(self, hits: ConceptHits, lang: str | None) -> tuple[Candidate, ...]:
        out = []
        for concept, row, score in zip(hits.concepts.tolist(), hits.rows.tolist(), hits.scores.tolist()):
            concept_id = self._concepts.ids[concept]
            out.append(
                Candidate(
                    concept_id=concept_id,
                    preferred_name=self.preferred_name(concept, lang),
                    matched_name=self._names[row],
                    score=float(score),
                    lang=self._langs[self._lang_codes[row]],
                    source=self._sources[self._source_codes[row]],
                    term_id=self._term_ids[row],
                    term_type=self._types[self._type_codes[row]],
                    hierarchy=self._paths(concept_id, lang),
                )
            )
        return tuple(out)

    def link(self, mentions: Sequence[str], *, k: int = 5, lang: str | None = None) -> list[LinkResult]:
        """The top-k distinct concepts for each mention, sorted by (score desc, concept_id).

        A mention with no usable signal (for tf-idf: no n-gram known to the dictionary) gets no
        candidates. An empty or blank mention is an error naming its position.
        """
        if isinstance(mentions, str):
            raise InputFormatError("mentions", "a list of mention strings", f"one string {shorten(mentions)}",
                                   fix="wrap it in a list")
        for i, mention in enumerate(mentions):
            if not isinstance(mention, str) or not mention.strip():
                raise InputFormatError(f"mentions[{i}]", "a non-empty mention text",
                                       shorten(mention) if isinstance(mention, str) else type(mention).__name__)
        allowed = self._allowed(lang)
        hits = top_concepts(self.index.names, self._concepts, list(mentions), k, allowed=allowed)
        return [LinkResult(m, self._candidates(h, lang)) for m, h in zip(mentions, hits)]

    def link_batch(self, batch: pa.RecordBatch, *, k: int = 5) -> pa.RecordBatch:
        """Link column ``text`` (optional column ``lang`` per row, null = any language).

        Returns the input columns plus ``candidates``: list<`CANDIDATE_TYPE`>, one list per row.
        A pure function of the batch, for Ray Data ``map_batches`` / Spark ``mapInArrow``.
        """
        if "text" not in batch.schema.names:
            raise InputFormatError("record batch", "a column 'text'", f"columns {batch.schema.names}")
        texts = batch.column("text").to_pylist()
        langs = batch.column("lang").to_pylist() if "lang" in batch.schema.names else [None] * len(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise InputFormatError(f"record batch row {i}", "a non-empty 'text'",
                                       shorten(text) if isinstance(text, str) else repr(text))
        results: list[LinkResult | None] = [None] * len(texts)
        for lang in dict.fromkeys(langs):
            rows = [i for i, row_lang in enumerate(langs) if row_lang == lang]
            for i, result in zip(rows, self.link([texts[i] for i in rows], k=k, lang=lang)):
                results[i] = result
        column = pa.array([[asdict(c) for c in r.candidates] for r in results], type=pa.list_(CANDIDATE_TYPE))
        return pa.RecordBatch.from_arrays([*batch.columns, column], names=[*batch.schema.names, "candidates"])
