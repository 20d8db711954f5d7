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
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from linker.dictionary import ConceptTable
from linker.confidence import (
    EXACT_SCORE, MARGIN_FETCH, NO_LINK, RETRIEVER_SCORER, margins, read_calibration, twins_of_top,
)
from linker.errors import ConfigError, IndexMismatchError, InputFormatError, UnknownNameError, shorten
from linker.folders import check_model_folder
from linker.index import LoadedIndex, load_index, name_count, name_row_counts, read_prior
from linker.rerank import DEFAULT_RERANK_K, RERANKER_DIR, CrossEncoder, load_reranker
from linker.retrieve import ConceptHits, ConceptIndex, arrow_numpy, top_concepts

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
    """A concept proposed for a mention, with the dictionary name that matched best.

    `score` ranks the candidates: with a re-ranker its logit (plus the calibration's
    `retriever_weight` x the retriever's score), else the retriever's score, which
    `retriever_score` always keeps. `confidence` is the calibrated P(this candidate
    is right) (`linker.confidence`), None when the index has no calibration for this scorer.
    """

    concept_id: str
    preferred_name: str
    matched_name: str
    score: float
    lang: str  # language of the matched name
    source: str
    term_id: str  # the source's id of the matched name (e.g. the MedDRA LLT code)
    term_type: str
    hierarchy: tuple[MeddraPath, ...] = ()  # MedDRA PTs only, primary path first
    retriever_score: float | None = None  # None only for hand-made candidates; the Linker always sets it
    confidence: float | None = None

    def as_record(self) -> dict:
        """Every field, the hierarchy as dicts: `dataclasses.asdict` without its deep copy of every string,
        which cost the batch normaliser an eighth of its time."""
        out = {name: getattr(self, name) for name in _CANDIDATE_FIELDS}
        out["hierarchy"] = tuple(asdict(path) for path in self.hierarchy)
        return out

    def to_dict(self) -> dict:
        """The JSON form shared by `linker link --json`, the normaliser and the HTTP service."""
        out = self.as_record()
        out["score"] = round(float(self.score), 6)
        if self.retriever_score is not None:
            out["retriever_score"] = round(float(self.retriever_score), 6)
        if self.confidence is not None:
            out["confidence"] = round(float(self.confidence), 6)
        else:
            del out["confidence"]  # no calibration for this index and scorer
        if not self.hierarchy:
            del out["hierarchy"]  # only MedDRA candidates carry one
        return out


_CANDIDATE_FIELDS = tuple(Candidate.__dataclass_fields__)


@dataclass(frozen=True)
class LinkResult:
    """One mention's candidates; `nil` ("no link") when the best one is below the Linker's
    `min_confidence` (the candidates are then dropped) or when there is none at all. `decision`
    (`linker.confidence.DECISIONS`: auto, review, no link) says what a person should do with the
    best candidate; None when the index has no calibration for this scorer (no decision can be trusted)."""

    mention: str
    candidates: tuple[Candidate, ...]
    decision: str | None = None

    @property
    def nil(self) -> bool:
        return not self.candidates

    def to_dict(self) -> dict:
        out = {"mention": self.mention, "candidates": [c.to_dict() for c in self.candidates], "nil": self.nil}
        if self.decision is not None:
            out["decision"] = self.decision
        return out


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
        ("retriever_score", pa.float32()),
        ("confidence", pa.float32()),
    ]
)
"""Arrow type of one candidate in `Linker.link_batch`'s ``candidates`` column (a list of these)."""


def bound_reranker(index: LoadedIndex) -> Path:
    """The re-ranker folder an index carries (`linker index build --reranker`): inside the index folder (not a
    link out of it), every file of it listed in the manifest, so that `verify` checked its size and checksum."""
    folder, fix = index.folder / RERANKER_DIR, "rebuild the index with `linker index build --reranker`"
    resolved, root = folder.resolve(), index.folder.resolve()
    if root not in resolved.parents:
        raise InputFormatError(folder, "the index's re-ranker folder inside it", f"a link to {resolved}", fix=fix)
    if not folder.is_dir():
        found = "a file" if folder.exists() else "nothing"
        raise IndexMismatchError(f"{folder}: expected the re-ranker folder that the manifest records, found {found}; "
                                 f"{fix}")
    for name in check_model_folder(folder, what="the index's re-ranker folder", fix=fix):
        if f"{RERANKER_DIR}/{name}" not in index.manifest["files"]:
            raise IndexMismatchError(f"{folder / name}: not listed in the manifest (added after the build); "
                                     f"remove it or {fix}")
    return folder


class TextColumn:
    """A string column of the concept table, read one row at a time (`column[row]`)."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        self._array = column  # not combined: a chunked column may hold more than the 2 GB one string array can

    def __len__(self) -> int:
        return len(self._array)

    def __getitem__(self, row: int) -> str:
        return self._array[row].as_py()

    def __iter__(self):
        return (value.as_py() for value in self._array)


class Linker:
    """Links mentions to concepts with one index folder.

    `lang` *restricts* candidates to names of that language (exactly, see `linker.retrieve`);
    it does not boost. The preferred name shown is the concept's preferred name in the
    mention's language when given, else English, else any language's.

    With a `reranker` (`linker.rerank.CrossEncoder`), the retriever's top `rerank_k` concepts (k when larger, and
    `MARGIN_FETCH` when the calibration reads the margin: the best rival must be scored alike) are re-scored (mixed
    with the retriever's score as the calibration says, `retriever_weight`) and re-ordered before the cut to k.
    With a calibration in the index folder that matches the scorer, every candidate carries a `confidence`; with
    `min_confidence`, a mention whose best candidate is below it gets no candidates ("no link",
    `LinkResult.nil`). `min_score` does the same on the best candidate's score itself, for an index without
    calibration: the scale is the index's (the cosine of tf-idf or dense vectors, 1.0 an exact name; with a
    re-ranker, the mixed score), so choose it on development data of that index (on the TAC 2017 development
    split's tf-idf MedDRA index, 0.7: eval/extract/report.md; scispaCy's tf-idf linker withholds below 0.7 too).
    """

    def __init__(self, index: LoadedIndex, *, reranker: CrossEncoder | None = None,
                 rerank_k: int | None = None, min_confidence: float | None = None,
                 min_score: float | None = None) -> None:
        if rerank_k is not None and rerank_k < 1:
            raise ConfigError(f"rerank_k must be >= 1, found {rerank_k}")
        if min_confidence is not None and not 0.0 <= min_confidence <= 1.0:
            raise ConfigError(f"min_confidence is a probability from 0 to 1, found {min_confidence}")
        if min_score is not None and not -1.0 <= min_score <= 1.0:
            raise ConfigError(f"min_score is a score from -1 to 1 (a cosine), found {min_score}")
        self.index = index
        self.reranker = reranker
        self.calibration = read_calibration(index.folder, index.manifest)
        if self.calibration is not None and self.calibration.scorer != self.scorer:
            log.warning("%s: its calibration was fitted for scorer %s, this Linker scores with %s; "
                        "candidates get no confidence (run `linker calibrate` with this re-ranker)",
                        index.folder, self.calibration.scorer[:20], self.scorer[:20])
            self.calibration = None
        cal = self.calibration
        # None: the k the calibration was fitted with, else DEFAULT_RERANK_K
        self.rerank_k = rerank_k or (cal.rerank_k if cal is not None and cal.rerank_k else DEFAULT_RERANK_K)
        if reranker is not None and cal is not None and cal.retriever_accuracy is not None \
                and not cal.accuracy > cal.retriever_accuracy:
            log.warning("%s: on its held-in set (%s) the re-ranker did not beat the retriever's own order (Acc@1 "
                        "%.4f vs %.4f); it only costs time here (--rerank none turns it off)", index.folder,
                        cal.fitted_on, cal.accuracy, cal.retriever_accuracy)
        if min_confidence is not None and self.calibration is None:
            raise ConfigError(f"--min-confidence needs a calibration of {index.folder} for this scorer; "
                              f"run `linker calibrate --index {index.folder} --dataset SPEC` first")
        self.min_confidence = min_confidence
        self.min_score = min_score
        self.stats = {"texts": 0, "distinct_texts": 0, "retrieve_seconds": 0.0, "rerank_seconds": 0.0, "rerank_pairs": 0}
        table = index.concepts.table
        prior = read_prior(index)
        self._concepts = ConceptIndex(table.column("concept_id"), prior=prior and prior.concepts)  # most annotated
        # Arrow columns, read a row at a time: a list of 5M Python strings would take seconds and GBs at start-up.
        self._names = TextColumn(table.column("name"))
        self._prior_names = prior.names if prior else {}
        self._name_prior = self._count_name_prior(prior.name_rows) if self._prior_names else None
        self._term_ids = TextColumn(table.column("term_id"))
        self._langs, self._lang_codes = self._encode(table.column("lang"))
        self._sources, self._source_codes = self._encode(table.column("source"))
        self._types, self._type_codes = self._encode(table.column("term_type"))
        self._preferred = arrow_numpy(table.column("preferred"))
        codes = self._concepts.codes
        self._by_concept = np.argsort(codes, kind="stable")  # name rows grouped by concept, table order within
        self._starts = np.searchsorted(codes[self._by_concept], np.arange(len(self._concepts) + 1))
        self._lang_masks: dict[str, np.ndarray] = {}
        self._preferred_cache: dict[tuple[int, str | None], str] = {}
        self._hierarchy = self._read_hierarchy(index.concepts.hierarchy)

    def _count_name_prior(self, name_rows: tuple[list[int], list[int]] | None) -> np.ndarray:
        """Per name row: how often annotators chose the row's concept for a mention with the row's text (counted
        when the index was built, `linker.index.name_row_counts`; counted here for indexes built before that)."""
        if name_rows is None:
            ids = self._concepts.ids
            name_rows = name_row_counts(self._names, [ids[c] for c in self._concepts.codes.tolist()], self._prior_names)
        counts = np.zeros(len(self._names), dtype=np.int64)
        counts[np.asarray(name_rows[0], dtype=np.int64)] = name_rows[1]
        return counts

    def _tie_key(self, codes, name_counts):
        """The tie order (smaller first) of concepts with these codes, annotated `name_counts` times for their
        matched names: the most annotated for the name first, then by code. One int: -count x concepts + code."""
        return codes - name_counts * len(self._concepts)

    def _tie_keys(self, hits: ConceptHits) -> np.ndarray:
        """The tie order of `hits`' concepts: their codes, or `_tie_key` with a per-name prior."""
        if self._name_prior is None:
            return hits.concepts
        return self._tie_key(hits.concepts, self._name_prior[hits.rows])

    def _retrieve(self, texts: list[str], fetch: int, allowed: np.ndarray | None) -> list[ConceptHits]:
        """`top_concepts`, with the per-name prior's tie order when the index has one.

        Retrieval breaks ties by concept code; a concept tied with the fetch-th may rank before it by its matched
        name, so one concept more is fetched to see whether the tie at the cut goes on, and the few queries where
        it does are fetched again, wider, until the tied group is whole. Then each list is re-ordered by (score,
        tie key) and cut."""
        if self._name_prior is None:
            return top_concepts(self.index.names, self._concepts, texts, fetch, allowed=allowed)
        wider = fetch + 1
        hits = top_concepts(self.index.names, self._concepts, texts, wider, allowed=allowed)

        def tie_goes_on(h: ConceptHits) -> bool:  # all `wider` found, the last still tied with the fetch-th
            return len(h.scores) == wider and h.scores[-1] == h.scores[fetch - 1]

        pending = [i for i, h in enumerate(hits) if tie_goes_on(h)]
        while pending:
            wider *= 2
            again = top_concepts(self.index.names, self._concepts, [texts[i] for i in pending], wider, allowed=allowed)
            for i, h in zip(pending, again):
                hits[i] = h
            pending = [i for i in pending if tie_goes_on(hits[i])]
        out = []
        for h in hits:
            order = np.lexsort((self._tie_keys(h), -h.scores))[:fetch]
            out.append(ConceptHits(h.concepts[order], h.rows[order], h.scores[order]))
        return out

    @staticmethod
    def _encode(column: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
        encoded = pc.dictionary_encode(column).combine_chunks()
        return encoded.dictionary.to_pylist(), arrow_numpy(encoded.indices)

    @staticmethod
    def _read_hierarchy(table: pa.Table | None) -> dict[str, list[dict]]:
        paths: dict[str, list[dict]] = {}
        if table is None:
            return paths
        for row in table.to_pylist():
            paths.setdefault(row["pt_code"], []).append(row)
        return paths

    @classmethod
    def load(cls, index_dir: str | Path, *, checksums: bool = True, rerank: str | Path | None = None,
             rerank_k: int | None = None, min_confidence: float | None = None, min_score: float | None = None,
             precision: str | None = None, rerank_precision: str | None = None,
             rerank_runtime: str | None = None) -> Linker:
        """Load and verify an index folder (IndexMismatchError when its files do not match its manifest). The
        checksums are paid once per folder and manifest: a stamp in the user cache lets later loads trust them while
        the files are unchanged (`linker.index.manifest.VerifiedStamp`). A dense index of a plain BERT encoder in
        fp32 encodes its mentions without torch (`linker.runtime`; ``$LINKER_RUNTIME=torch`` keeps torch).

        `rerank`: a re-ranker folder or hub name; None uses the one bound to the index
        (`linker index build --reranker`) if any, ``"none"`` disables it. `precision`: how a dense
        index encodes mentions: auto, fp32, bf16 or int8; None (default) uses the precision the
        index's names were encoded in (`linker.precision`). `rerank_precision`: the re-ranker's, auto (bf16 where
        the device runs it natively), bf16 or fp32 (eval/bench/bench_rerank_precision_ncbi.md: their agreement).
        `rerank_k` and `rerank_precision` None (default): as the index's calibration was fitted with
        (`linker calibrate` records both), else 32 and auto. In fp32 on the CPU the re-ranker runs without torch
        (`linker.rerank.load_reranker`; `rerank_runtime` or ``$LINKER_RUNTIME=torch`` keeps torch).
        """
        index = load_index(index_dir, checksums=checksums, precision=precision)
        if rerank is None and index.manifest.get("reranker"):
            rerank = bound_reranker(index)
        reranker = None
        if rerank is not None and str(rerank) != "none":
            if rerank_precision is None:
                calibration = read_calibration(index.folder, index.manifest)
                rerank_precision = (calibration and calibration.rerank_precision) or "auto"
            reranker = load_reranker(rerank, precision=rerank_precision, runtime=rerank_runtime)
        return cls(index, reranker=reranker, rerank_k=rerank_k, min_confidence=min_confidence, min_score=min_score)

    @property
    def retriever_weight(self) -> float:
        """With a re-ranker: final score = its logit + this x the retriever's score (chosen on held-in data by
        `linker calibrate` and stored with the calibration; 0 = the re-ranker alone when there is none)."""
        return 0.0 if self.reranker is None or self.calibration is None else self.calibration.retriever_weight

    @property
    def scorer(self) -> str:
        """What `Candidate.score` is: the retriever's score or one re-ranker's (calibrations are per scorer)."""
        return RETRIEVER_SCORER if self.reranker is None else self.reranker.scorer

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
    def precision(self) -> str | None:
        """The precision mentions are encoded in (fp32, bf16, int8); None for a tf-idf index."""
        return self.index.names.query_precision

    @property
    def languages(self) -> list[str]:
        return sorted(self._langs)

    def usable_langs(self, langs: Sequence[str | None]) -> list[str | None]:
        """The one fallback rule for a language the index lacks: it becomes None (any language), with one warning
        naming it, so a Spanish span against the English default is linked against all names instead of failing
        its whole batch. `link` applies it to `langs` (one language per mention, from the data); `lang` (one for a
        whole call, the caller's own choice) is refused instead when the index lacks it."""
        known = set(self._langs)
        missing = sorted({lang for lang in langs if lang is not None and lang not in known})
        if missing:
            log.warning("index has no names in %s; those spans are linked against all languages (%s)",
                        ", ".join(missing), ", ".join(sorted(known)))
        return [lang if lang is None or lang in known else None for lang in langs]

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

    def _result(self, mention: str, hits: ConceptHits, final: np.ndarray, lang: str | None, k: int) -> LinkResult:
        """The top k of `hits` by `final` score (score desc, then the tie order), with confidences (of the score, its
        margin over the best rival concept, `linker.confidence.margins`, and exactness), the NIL rule and the decision."""
        ranked = np.lexsort((self._tie_keys(hits), -final))
        order = ranked[:k]
        cal = self.calibration
        if cal is None:
            confidence = [None] * len(order)
        else:
            twins = None
            if cal.margin_weight and len(ranked) > 1:
                rows = hits.rows[ranked].tolist()
                twins = twins_of_top(((self._names[r], self._source_codes[r]) for r in rows), len(rows))
            confidence = cal(final[order], margins(final, ranked, twins)[:k], hits.scores[order] >= EXACT_SCORE)
        if self.min_confidence is not None and (len(order) == 0 or confidence[0] < self.min_confidence):
            return LinkResult(mention, (), None if cal is None else NO_LINK)
        if self.min_score is not None and (len(order) == 0 or final[order[0]] < self.min_score):
            return LinkResult(mention, (), NO_LINK)
        candidates = self._candidates(hits, final, order, confidence, lang)
        decision = None if cal is None else cal.decide(float(confidence[0]) if len(order) else None)
        return LinkResult(mention, candidates, decision)

    def _candidates(self, hits: ConceptHits, final: np.ndarray, order: np.ndarray, confidence, lang: str | None
                    ) -> tuple[Candidate, ...]:
        """The `Candidate`s of `hits` at positions `order`, with their `confidence`s."""
        out = []
        for i, conf in zip(order.tolist(), confidence):
            concept, row = int(hits.concepts[i]), int(hits.rows[i])
            concept_id = self._concepts.ids[concept]
            out.append(
                Candidate(
                    concept_id=concept_id,
                    preferred_name=self.preferred_name(concept, lang),
                    matched_name=self._names[row],
                    score=float(final[i]),
                    lang=self._langs[self._lang_codes[row]],
                    source=self._sources[self._source_codes[row]],
                    term_id=self._term_ids[row],
                    term_type=self._types[self._type_codes[row]],
                    hierarchy=self._paths(concept_id, lang),
                    retriever_score=float(hits.scores[i]),
                    confidence=None if conf is None else float(conf),
                )
            )
        return tuple(out)

    def _rerank(self, mentions: Sequence[str], hits: list[ConceptHits]) -> list[np.ndarray]:
        """Each mention's re-ranker scores of its retrieved concepts (their matched names), in one batch."""
        pairs_m = [m for m, h in zip(mentions, hits) for _ in range(len(h.rows))]
        pairs_n = [self._names[row] for h in hits for row in h.rows.tolist()]
        scores = self.reranker.score(pairs_m, pairs_n) if pairs_m else np.zeros(0, dtype=np.float32)
        self.stats["rerank_pairs"] += len(pairs_m)
        out, pos = [], 0
        for h in hits:
            out.append(scores[pos : pos + len(h.rows)])
            pos += len(h.rows)
        return out

    def tie_rank(self, concept_id: str, matched_name: str | None = None) -> int:
        """Where `concept_id`, matched by `matched_name`, stands among concepts of equal score (smaller first):
        concept_id order, or with the index's prior the most annotated for that name, then overall, first."""
        code = self._concepts.code_of(concept_id)
        if matched_name is None or not self._prior_names:
            return code
        return self._tie_key(code, name_count(self._prior_names, matched_name, concept_id))

    def link(self, mentions: Sequence[str], *, k: int = 5, lang: str | None = None,
             langs: Sequence[str | None] | None = None, exclude: np.ndarray | None = None) -> list[LinkResult]:
        """The top-k distinct concepts for each mention, sorted by (score desc, concept_id; with an index built
        with `--prior`, tied concepts most annotated for their matched name first, then most annotated overall).

        A mention with no usable signal (for tf-idf: no n-gram known to the dictionary) gets no
        candidates. An empty or blank mention is an error naming its position. `exclude` is a
        bool mask over the concept table's rows: those names are left out as if the index did
        not hold them (held-out tests of `linker.eval.capabilities`, "no link" tests of `linker.eval.trust`).

        `lang` restricts every mention's candidates to names in that language; `langs` gives each mention its own
        (None: any), a language the index lacks falling back to any (`usable_langs`): the mentions are linked one
        call per language and returned in input order. This is the one place mentions are grouped by language.
        """
        if isinstance(mentions, str):
            raise InputFormatError("mentions", "a list of mention strings", f"one string {shorten(mentions)}",
                                   fix="wrap it in a list")
        for i, mention in enumerate(mentions):
            if not isinstance(mention, str) or not mention.strip():
                raise InputFormatError(f"mentions[{i}]", "a non-empty mention text",
                                       shorten(mention) if isinstance(mention, str) else type(mention).__name__)
        if k < 1:
            raise ConfigError(f"k must be >= 1, found {k}")
        if langs is not None:
            if lang is not None:
                raise ConfigError("lang and langs: give one language for every mention or one per mention, not both")
            if len(langs) != len(mentions):
                raise ConfigError(f"langs: one language (or None) per mention, {len(mentions)}, found {len(langs)}")
            return self._link_by_lang(list(mentions), self.usable_langs(langs), k=k, exclude=exclude)
        return self._link_in(list(mentions), k=k, lang=lang, exclude=exclude)

    def _link_in(self, mentions: list[str], *, k: int, lang: str | None,
                 exclude: np.ndarray | None) -> list[LinkResult]:
        """`link` of checked mentions, every candidate among the names of `lang` (None: any)."""
        allowed = self._allowed(lang)
        if exclude is not None:
            if len(exclude) != len(self._names):
                raise ConfigError(f"exclude: a mask of {len(self._names)} name rows expected, found {len(exclude)}")
            allowed = ~exclude if allowed is None else allowed & ~exclude
        fetch = k if self.reranker is None else max(k, self.rerank_k)
        if self.calibration is not None and self.calibration.margin_weight:
            fetch = max(fetch, MARGIN_FETCH)  # the best rival concept, for the margin
        # A mention's result is a function of its text (and lang, k, exclude, fixed for this call), so each
        # distinct text is linked once: batches from real streams repeat "nausea" and "headache" many times.
        distinct = list(dict.fromkeys(mentions))
        started = time.perf_counter()
        hits = self._retrieve(distinct, fetch, allowed)
        retrieved = time.perf_counter()
        if self.reranker is None:
            finals = [h.scores for h in hits]
        else:
            weight = self.retriever_weight
            finals = [r + np.float32(weight) * h.scores for r, h in zip(self._rerank(distinct, hits), hits)]
        self.stats["texts"] += len(mentions)
        self.stats["distinct_texts"] += len(distinct)
        self.stats["retrieve_seconds"] += retrieved - started
        self.stats["rerank_seconds"] += time.perf_counter() - retrieved
        found = {m: self._result(m, h, f, lang, k) for m, h, f in zip(distinct, hits, finals)}
        return [found[m] for m in mentions]

    def _link_by_lang(self, mentions: list[str], langs: list[str | None], *, k: int,
                      exclude: np.ndarray | None) -> list[LinkResult]:
        """One linking pass per language (in order of first appearance), the results put back in input order."""
        groups: dict[str | None, list[int]] = {}
        for i, lang in enumerate(langs):
            groups.setdefault(lang, []).append(i)
        results: list[LinkResult | None] = [None] * len(mentions)
        for lang, rows in groups.items():
            linked = self._link_in([mentions[i] for i in rows], k=k, lang=lang, exclude=exclude)
            for i, result in zip(rows, linked, strict=True):
                results[i] = result
        return results  # type: ignore[return-value]  # every position was filled

    def explain(self, mention: str, candidate: Candidate) -> list:
        """Why `candidate` matched `mention`: the n-grams they share with their tf-idf weights
        (`linker.index.tfidf.SharedNgram`, largest contribution first; the contributions sum to the
        tf-idf cosine). For a hybrid index this explains its tf-idf half; a dense index has no n-grams.
        """
        sparse = self.index.names.ngram_index  # a hybrid index's tf-idf half
        if sparse is None:
            raise ConfigError(f"{self.index.folder}: a {self.index.kind} index has no n-grams to explain; "
                              "--explain needs a tfidf or hybrid index")
        return sparse.explain(mention, candidate.matched_name)

    def link_batch(self, batch: pa.RecordBatch, *, k: int = 5) -> pa.RecordBatch:
        """Link column ``text`` (optional column ``lang`` per row, null = any language; one the index lacks: any,
        with a warning, `usable_langs`).

        Returns the input columns plus ``candidates``: list<`CANDIDATE_TYPE`>, one list per row, and ``decision``
        (string: ``auto``, ``review`` or ``no link``; null when the index is not calibrated, `LinkResult.decision`).
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
        results = self.link(texts, k=k, langs=langs)
        column = pa.array([[c.as_record() for c in r.candidates] for r in results], type=pa.list_(CANDIDATE_TYPE))
        decision = pa.array([r.decision for r in results], pa.string())
        return pa.RecordBatch.from_arrays([*batch.columns, column, decision],
                                          names=[*batch.schema.names, "candidates", "decision"])
