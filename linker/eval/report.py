"""`evaluate`: one index, one test set, one or more filters -> Acc@k table, JSON, Markdown, PNG.

The test mentions are linked once (top max(k), each distinct (text, language) once) and every
filter scores a subset of the same predictions, so Full / Filtered / Filtered0.2 differ only
in which mentions count. The report records the resolved configuration (index manifest,
dataset and training specs, filter mode, composite rule, seeds), the subset sizes, the share
of mentions whose gold id the dictionary can reach at all, and the seconds each stage took.

`evaluate` takes its options as keywords; `run_evaluation` takes them grouped (`EvalData`: what is
evaluated, `Scoring`: what counts, `Linking`: how mentions are linked) and runs the stages: `predict`,
`score_rows` per filter and language, then `rerank_section`, `calibration_report` and `nil_report`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import linker
from linker.datasets import Mention, load_dataset, spec_inputs
from linker.errors import ConfigError, UnknownNameError
from linker.eval.filters import FILTERS, Normaliser, ReferenceSet, filter_indices, read_abbreviations
from linker.eval.metrics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    COMPOSITE_RULES,
    Accuracy,
    accuracy,
    mention_hits,
)
from linker.eval.charts import write_chart
from linker.eval.trust import calibration_section, coverage_chart, nil_section, remove_gold_concepts
from linker.formats import DEFAULT_LIMITS, ReadLimits
from linker.fileio import Input, atomic_file, check_output, model_inputs, portable_paths
from linker.progress import bar
from linker.text import code_key

log = logging.getLogger(__name__)

LINK_BATCH = 512  # mentions per Linker call: a progress step, small enough to keep memory flat


@dataclass(frozen=True)
class EvalRow:
    """Acc@k of one (filter, language) subset under one composite rule; lang "all" is the whole subset."""

    filter: str
    lang: str
    n: int
    accuracies: tuple[Accuracy, ...]
    reachable: float = math.nan  # share of the subset whose gold ids are all in the dictionary
    composite: str = "all"  # the rule that scored composite mentions (`linker.eval.metrics`)

    def acc(self, k: int) -> Accuracy:
        return next(a for a in self.accuracies if a.k == k)


@dataclass(frozen=True)
class EvalReport:
    dataset: str
    index: str
    ks: tuple[int, ...]
    rows: tuple[EvalRow, ...]
    reachable: float  # share of test mentions whose every part has a gold id present in the dictionary
    seconds: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    files: tuple[str, ...] = ()
    rerank: dict | None = None  # retriever alone vs re-ranked, per filter; latency
    calibration: dict | None = None  # ECE before/after, accuracy / coverage (`linker.eval.trust`)
    nil: dict | None = None  # "no link" precision / recall / F1 with gold concepts removed

    def row(self, filter_name: str, lang: str = "all", composite: str | None = None) -> EvalRow:
        """One row; `composite` None: the first rule evaluated."""
        composite = composite or (self.rows[0].composite if self.rows else "all")
        return next(r for r in self.rows if r.filter == filter_name and r.lang == lang and r.composite == composite)

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_filters(filters: Sequence[str], *, have_train: bool) -> tuple[str, ...]:
    """Expand ``all`` (dictionary filters, plus training filters when training mentions are given)."""
    out: list[str] = []
    for name in filters:
        if name == "all":
            out += ["full", "dict", "dict0.2"] + (["train", "train0.2"] if have_train else [])
        elif name in FILTERS:
            out.append(name)
        else:
            raise UnknownNameError("filter", name, [*FILTERS, "all"])
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class Ranked:
    """One query text's candidates as evaluation needs them."""

    ids: tuple[str, ...]  # final order (the re-ranker's when there is one)
    retriever_ids: tuple[str, ...]  # the same concepts in the retriever's order
    top_score: float  # -inf without candidates
    top_confidence: float  # nan without a calibration, -inf without candidates
    scores: tuple[float, ...] = ()  # final scores, in `ids` order
    retriever_scores: tuple[float, ...] = ()  # the retriever's scores, in `ids` order
    ties: tuple[int, ...] = ()  # the Linker's tie order of `ids` (its concept codes); empty: concept_id order
    decision: str | None = None  # the Linker's (`linker.confidence.DECISIONS`); None without a calibration
    names: tuple[str, ...] = ()  # in `ids` order: the matched names, and their sources (`linker.confidence.margins`)
    sources: tuple[str, ...] = ()

    def tie_key(self, i: int):
        return self.ties[i] if self.ties else self.ids[i]


def _ranked(result, tie_rank) -> Ranked:
    """`result`: a `LinkResult`; `tie_rank`: (concept_id, matched name) -> the Linker's order among equal scores
    (`Linker.tie_rank`)."""
    candidates = result.candidates
    if not candidates:
        return Ranked((), (), -math.inf, -math.inf, decision=result.decision)
    ties = tuple(tie_rank(c.concept_id, c.matched_name) for c in candidates)
    retriever = sorted(range(len(candidates)), key=lambda i: (-candidates[i].retriever_score, ties[i]))
    top = candidates[0]
    return Ranked(tuple(c.concept_id for c in candidates), tuple(candidates[i].concept_id for i in retriever),
                  float(top.score), math.nan if top.confidence is None else float(top.confidence),
                  tuple(float(c.score) for c in candidates), tuple(float(c.retriever_score) for c in candidates), ties,
                  result.decision, tuple(c.matched_name for c in candidates), tuple(c.source for c in candidates))


def predict(linker_, mentions: Sequence[Mention], k: int, *, query_lang: bool,
            progress: bool | None, exclude: np.ndarray | None = None) -> list[tuple[Ranked, ...]]:
    """Per mention, one `Ranked` per query text (`Mention.queries`); each distinct text linked once.

    With a re-ranker, all of its `rerank_k` concepts are kept (k is raised to it), so that the
    retriever's own top-k can be scored from the same call. `exclude`: as `Linker.link`.
    """
    if linker_.reranker is not None:
        k = max(k, linker_.rerank_k)
    keys = list(dict.fromkeys((text, m.lang if query_lang else None) for m in mentions for text in m.queries))
    # A test set in a language the index lacks is refused, not scored against the fallback (`Linker.usable_langs`):
    # a figure must say what it measured. Grouping by language is `Linker.link(langs=...)`'s.
    for lang in dict.fromkeys(lang for _, lang in keys if lang is not None):
        if lang not in linker_.languages:
            raise UnknownNameError("language in this index", lang, linker_.languages)
    ranked: dict[tuple[str, str | None], Ranked] = {}
    reporter = bar(len(keys), desc="linking test mentions", unit="mention", show=progress)
    for start in range(0, len(keys), LINK_BATCH):
        chunk = keys[start : start + LINK_BATCH]
        results = linker_.link([text for text, _ in chunk], k=k, langs=[lang for _, lang in chunk], exclude=exclude)
        for key, result in zip(chunk, results):
            ranked[key] = _ranked(result, linker_.tie_rank)
        reporter.update(len(chunk))
    reporter.close()
    return [tuple(ranked[(text, m.lang if query_lang else None)] for text in m.queries) for m in mentions]


def top_of(ranked: Sequence[tuple[Ranked, ...]], field_name: str) -> np.ndarray:
    """Per mention, the weakest of its queries' best `top_score`/`top_confidence` (every part must be right)."""
    return np.array([min(getattr(r, field_name) for r in queries) for queries in ranked], dtype=np.float64)


def gold_matcher(linker_, *, gold_via_xref: str | None = None):
    """(expand, known): predicted id -> its alternative ids, and the code keys the dictionary can reach.

    Alternatives come from the concept table's xrefs (`linker.dictionary.alternative_ids`, the
    mechanism training uses too): MEDIC's OMIM ids of a MeSH disease; with `gold_via_xref`
    (``UMLS``) also the xrefs of that prefix without it, for gold ids in that id space.
    """
    from linker.dictionary import alternative_ids

    table = linker_.concepts.table
    alternatives = alternative_ids(table, strip_prefix=gold_via_xref)
    expand = (lambda cid: alternatives.get(code_key(cid), ())) if alternatives else None
    known = {code_key(c) for c in table.column("concept_id").to_pylist()} | set(alternatives)
    return expand, known


@dataclass(frozen=True)
class EvalData:
    """What is evaluated: the test set (a dataset spec) and the training specs whose mention texts the
    ``train``/``train0.2`` filters compare with. `lenient`: skip (and log) brat annotations whose spans do
    not fit their .txt instead of failing; `limits`: the read caps (`linker.formats`)."""

    dataset: str
    train: tuple[str, ...] = ()
    lenient: bool = False
    limits: ReadLimits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        train = self.train
        object.__setattr__(self, "train", (train,) if isinstance(train, str) else tuple(train or ()))


@dataclass(frozen=True)
class Scoring:
    """What counts as right, and for which mentions: the filters, the cut-offs k, the composite rules, the
    filters' normalisation (`mode`, `abbreviations`), the gold id space (`gold_via_xref`), and the "no link"
    test (`nil_fraction` of the gold concepts removed, answered at `min_confidence`). Checked when made;
    `composite` and `ks` are kept as tuples (ks sorted, without repeats)."""

    filters: tuple[str, ...] = ("full",)
    ks: tuple[int, ...] = (1, 5)
    composite: tuple[str, ...] = ("all",)
    mode: str = "faithful"
    abbreviations: str | Path | None = None
    gold_via_xref: str | None = None
    nil_fraction: float = 0.0
    min_confidence: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.nil_fraction < 1.0:
            raise ConfigError(f"--nil-fraction is a share of the gold concepts from 0 to 1, found {self.nil_fraction}")
        rules = (self.composite,) if isinstance(self.composite, str) else tuple(dict.fromkeys(self.composite))
        for rule in rules or ("(none)",):
            if rule not in COMPOSITE_RULES:
                raise UnknownNameError("composite rule", rule, COMPOSITE_RULES)
        ks = tuple(sorted(set(int(k) for k in self.ks)))
        if not ks or ks[0] < 1:
            raise ConfigError(f"k must be positive integers, found {ks}")
        object.__setattr__(self, "composite", rules)
        object.__setattr__(self, "ks", ks)
        object.__setattr__(self, "filters", tuple(self.filters))

    @property
    def rule(self) -> str:
        """The composite rule of the re-ranker, calibration and NIL sections: the first one."""
        return self.composite[0]


@dataclass(frozen=True)
class Linking:
    """How the test mentions are linked: `rerank`/`rerank_k` as `Linker.load`; `query_lang` restricts
    candidates to names in each mention's language; `precision`: how a dense index encodes the mentions
    (None: the precision its names were encoded in); `progress`: show a progress bar (None: on a terminal)."""

    rerank: str | Path | None = None
    rerank_k: int | None = None
    query_lang: bool = False
    precision: str | None = None
    progress: bool | None = None


def evaluate(
    index_dir: str | Path,
    dataset_spec: str,
    *,
    train_spec: str | Sequence[str] | None = None,
    filters: Sequence[str] = ("full",),
    ks: Sequence[int] = (1, 5),
    report_dir: str | Path | None = None,
    progress: bool | None = None,
    mode: str = "faithful",
    composite: str | Sequence[str] = "all",
    gold_via_xref: str | None = None,
    query_lang: bool = False,
    abbreviations: str | Path | None = None,
    name: str | None = None,
    lenient: bool = False,
    rerank: str | Path | None = None,
    rerank_k: int | None = None,
    nil_fraction: float = 0.0,
    min_confidence: float = 0.5,
    overwrite: bool = False,
    precision: str | None = None,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> EvalReport:
    """Link a test set with the index at `index_dir` and score it under each filter.

    `train_spec`: dataset spec(s) whose mention texts form the training reference set (needed
    by ``train``/``train0.2``). `gold_via_xref`: an id prefix (``UMLS``) when the gold ids live
    in another id space than the dictionary (Mantra's CUIs vs HPO ids): predictions are mapped
    through the concept table's xrefs. A predicted id always counts as its alternative ids, the
    concept table's xrefs (`gold_matcher`: MEDIC's MeSH and OMIM ids of one disease). `query_lang`:
    restrict candidates to names in each mention's language (off by default: CodiEsp links Spanish
    mentions to English names). `lenient`: skip (and log) brat annotations whose spans do not fit
    their .txt instead of failing.

    `composite`: one rule (``all``, ``any``) or several, each scored from the same linking pass
    (rows per rule; the re-ranker, calibration and NIL sections use the first).

    `rerank`/`rerank_k`: as `Linker.load`; with a re-ranker the report also scores the
    retriever's own order from the same call (the re-ranker's gain). `nil_fraction`: remove this
    share of the gold concepts and score "no link" decisions at `min_confidence`
    (`linker.eval.trust`). Calibration figures are always reported (on the Full set).

    The report files replace existing ones only with `overwrite`, and never an input. `precision`: how a dense
    index encodes the mentions (None: the precision its names were encoded in).

    The options are grouped into `EvalData` (what), `Scoring` (what counts) and `Linking` (how) and passed
    to `run_evaluation`.
    """
    scoring = Scoring(filters=filters, ks=ks, composite=composite, mode=mode, abbreviations=abbreviations,
                      gold_via_xref=gold_via_xref, nil_fraction=nil_fraction, min_confidence=min_confidence)
    data = EvalData(dataset_spec, train_spec, lenient=lenient, limits=limits)
    linking = Linking(rerank=rerank, rerank_k=rerank_k, query_lang=query_lang, precision=precision, progress=progress)
    return run_evaluation(index_dir, data, scoring, linking, report_dir=report_dir, name=name, overwrite=overwrite)


def run_evaluation(
    index_dir: str | Path, data: EvalData, scoring: Scoring = Scoring(), linking: Linking = Linking(), *,
    report_dir: str | Path | None = None, name: str | None = None, overwrite: bool = False,
) -> EvalReport:
    """`evaluate` with its options grouped: predict (link every distinct test text once), score each
    filter and language, then the optional sections (re-ranker gain, calibration, "no link"); record the
    configuration and the seconds of each stage; write the report files under `report_dir` when given."""
    from linker.link import Linker  # eval sits above link; imported here to keep `datasets` light
    inputs = evaluation_inputs(index_dir, data, scoring, linking)
    if report_dir is not None:
        check_report_paths(report_dir, name, inputs=inputs, overwrite=overwrite)
    filter_names = resolve_filters(scoring.filters, have_train=bool(data.train))
    clock = _Stopwatch()
    with clock("load_index"):
        linker_ = Linker.load(index_dir, rerank=linking.rerank, rerank_k=linking.rerank_k,
                              precision=linking.precision)
    if scoring.nil_fraction > 0 and linker_.calibration is None:  # before the test set is linked
        raise ConfigError(f"--nil-fraction needs calibrated confidences; run `linker calibrate --index {index_dir}` "
                          "(with the same re-ranker) first")
    with clock("load_data"):
        mentions = load_dataset(data.dataset, lenient=data.lenient, limits=data.limits)
        train_texts = [m.text for spec in data.train for m in load_dataset(spec, lenient=data.lenient, limits=data.limits)]
    with clock("filter"):
        references = reference_sets(linker_, filter_names, train_texts if data.train else None, scoring)
        texts = [m.text for m in mentions]
        subsets = {f: filter_indices(texts, f, references=references) for f in filter_names}
    with clock("link"):
        ranked = predict(linker_, mentions, max(scoring.ks), query_lang=linking.query_lang, progress=linking.progress)
    predictions = Predictions.of(linker_, mentions, ranked, gold_via_xref=scoring.gold_via_xref)
    with clock("score"):
        rule_hits = {rule: {k: predictions.hits(k, rule) for k in scoring.ks} for rule in scoring.composite}
        rows = score_rows(predictions, subsets, rule_hits, scoring.ks)
        hits = rule_hits[scoring.rule]
        rerank = rerank_section(linker_, predictions, subsets, hits, scoring) if linker_.reranker is not None else None
        calibration = calibration_report(linker_, predictions, hits, scoring.rule)
        nil = nil_report(linker_, predictions, scoring, linking) if scoring.nil_fraction > 0 else None
    config = run_config(index_dir, linker_, data, scoring, linking, filter_names, references, len(mentions))
    report = EvalReport(data.dataset, str(index_dir), scoring.ks, tuple(rows), predictions.reachable, clock.finish(),
                        config, rerank=rerank, calibration=calibration, nil=nil)
    if report_dir is not None:
        report = write_report(report, report_dir, name=name, overwrite=overwrite, inputs=inputs)
    return report


class _Stopwatch:
    """Seconds per named stage (``with clock("link"): ...``) and in total since it was made."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        t = time.perf_counter()
        yield
        self.seconds[stage] = time.perf_counter() - t

    def finish(self) -> dict[str, float]:
        seconds = {**self.seconds, "total": time.perf_counter() - self.started}
        return {key: round(value, 3) for key, value in seconds.items()}


def evaluation_inputs(index_dir: str | Path, data: EvalData, scoring: Scoring, linking: Linking) -> list[Input]:
    """Every path an evaluation reads (no report file may be one of them)."""
    return [Input(Path(index_dir), "--index"), *spec_inputs(data.dataset, "--dataset"),
            *(i for spec in data.train for i in spec_inputs(spec, "--train")),
            *([Input(Path(scoring.abbreviations), "--abbreviations")] if scoring.abbreviations is not None else []),
            *model_inputs(linking.rerank, "--rerank")]


def reference_sets(linker_, filter_names: Sequence[str], train_texts: Sequence[str] | None,
                   scoring: Scoring) -> dict[str, ReferenceSet | None]:
    """The strings the filters compare test mentions with: the dictionary's names (when a filter needs
    them) and the training mention texts (when given), normalised as `scoring.mode` says."""
    normaliser = Normaliser(scoring.mode, read_abbreviations(scoring.abbreviations) if scoring.abbreviations else None)
    references: dict[str, ReferenceSet | None] = {"dict": None, "train": None}
    if any(FILTERS[f].reference == "dict" for f in filter_names):
        references["dict"] = ReferenceSet(linker_.concepts.table.column("name").to_pylist(), normaliser)
    if train_texts is not None:
        references["train"] = ReferenceSet(train_texts, normaliser)
    return references


@dataclass(frozen=True)
class Predictions:
    """The test set linked once (`predict`), with what scoring needs: per mention its gold ids, language and
    predicted ids (per query text), whether the dictionary can reach its gold at all, and the matcher that
    lets a predicted id count as its alternative ids (`gold_matcher`)."""

    mentions: Sequence[Mention]
    ranked: list[tuple[Ranked, ...]]
    predicted: list[tuple[tuple[str, ...], ...]]
    expand: Callable[[str], Sequence[str]] | None
    in_dict: np.ndarray  # (n,) bool: every part of the mention has a gold id the dictionary knows

    @classmethod
    def of(cls, linker_, mentions: Sequence[Mention], ranked: list[tuple[Ranked, ...]], *,
           gold_via_xref: str | None = None) -> Predictions:
        expand, known = gold_matcher(linker_, gold_via_xref=gold_via_xref)
        in_dict = np.array([all(any(code_key(a) in known for a in part) for part in m.gold) for m in mentions], dtype=bool)
        return cls(mentions, ranked, [tuple(r.ids for r in queries) for queries in ranked], expand, in_dict)

    @property
    def gold(self) -> list[tuple[tuple[str, ...], ...]]:
        return [m.gold for m in self.mentions]

    @property
    def reachable(self) -> float:
        return float(self.in_dict.mean()) if self.mentions else math.nan

    def hits(self, k: int, rule: str, predicted: Sequence[tuple[tuple[str, ...], ...]] | None = None) -> np.ndarray:
        """(n,) bool: right within the top `k` under composite `rule` (`predicted`: another order of the same ids)."""
        return mention_hits(self.gold, self.predicted if predicted is None else predicted, k, composite=rule,
                            expand=self.expand)


def score_rows(predictions: Predictions, subsets: dict[str, Sequence[int]], rule_hits: dict[str, dict[int, np.ndarray]],
               ks: Sequence[int]) -> list[EvalRow]:
    """Acc@k per composite rule, filter and language: the filter's whole subset ("all"), then each language
    when the test set has several."""
    langs = sorted({m.lang for m in predictions.mentions})
    lang_of = np.array([m.lang for m in predictions.mentions])
    rows = []
    for rule, hits in rule_hits.items():
        for f, subset in subsets.items():
            idx = np.array(subset, dtype=np.int64)
            groups = [("all", idx)] + ([(lang, idx[lang_of[idx] == lang]) for lang in langs] if len(langs) > 1 else [])
            for lang, sel in groups:
                rows.append(EvalRow(f, lang, int(len(sel)), tuple(accuracy(hits[k][sel], k) for k in ks),
                                    float(predictions.in_dict[sel].mean()) if len(sel) else math.nan, rule))
    return rows


def rerank_section(linker_, predictions: Predictions, subsets: dict[str, Sequence[int]],
                   hits: dict[int, np.ndarray], scoring: Scoring) -> dict:
    """The re-ranker's gain per filter (the retriever's own order of the same candidates against the re-ranked
    one, `hits`) and its cost per distinct mention, from the linking pass's counters."""
    retriever = [tuple(r.retriever_ids for r in queries) for queries in predictions.ranked]
    retriever_hits = {k: predictions.hits(k, scoring.rule, retriever) for k in scoring.ks}

    def share(hit: np.ndarray, subset: Sequence[int]) -> float:
        return float(hit[subset].mean()) if subset else math.nan

    stats = linker_.stats
    return {
        "reranker": {"name": linker_.reranker.info.name, "sha256": linker_.reranker.info.sha256},
        "rerank_k": linker_.rerank_k,
        "rows": [{"filter": f, "n": len(subset),
                  **{f"retriever_acc{k}": share(retriever_hits[k], subset) for k in scoring.ks},
                  **{f"reranked_acc{k}": share(hits[k], subset) for k in scoring.ks}}
                 for f, subset in subsets.items()],
        "texts_linked": stats["texts"],
        "distinct_texts_linked": stats["distinct_texts"],
        "pairs_scored": stats["rerank_pairs"],
        # per distinct text: repeated mentions are linked once (`Linker.link`), so this is what one costs
        "retrieve_ms_per_mention": 1000 * stats["retrieve_seconds"] / max(stats["distinct_texts"], 1),
        "rerank_ms_per_mention": 1000 * stats["rerank_seconds"] / max(stats["distinct_texts"], 1),
    }


def calibration_report(linker_, predictions: Predictions, hits: dict[int, np.ndarray], rule: str) -> dict:
    """ECE of the raw score and the calibrated confidence, accuracy at a coverage (`linker.eval.trust`), on Full."""
    top_score, top_conf = top_of(predictions.ranked, "top_score"), top_of(predictions.ranked, "top_confidence")
    hits_at_1 = hits[1] if 1 in hits else predictions.hits(1, rule)
    return calibration_section(top_score, top_conf, hits_at_1, linker_.scorer, decisions=weakest_decisions(predictions.ranked))


def weakest_decisions(ranked: Sequence[tuple[Ranked, ...]]) -> list[str | None] | None:
    """Per mention, its weakest query's decision (every part must be right); None when the Linker made none."""
    from linker.confidence import DECISIONS

    if not ranked or any(r.decision is None for queries in ranked for r in queries):
        return None
    return [max((r.decision for r in queries), key=DECISIONS.index) for queries in ranked]


def nil_report(linker_, predictions: Predictions, scoring: Scoring, linking: Linking) -> dict:
    """"No link": a seeded `scoring.nil_fraction` of the gold concepts is taken out of the dictionary, the test
    set linked again without them, and the answers below `scoring.min_confidence` scored as "no link"."""
    concept_ids = linker_.concepts.table.column("concept_id")
    removed, gold_nil = remove_gold_concepts(concept_ids.to_pylist(), predictions.gold, scoring.nil_fraction,
                                             expand=predictions.expand)
    removed_names = pc.is_in(concept_ids, value_set=pa.array(removed, pa.string())).to_numpy(zero_copy_only=False)
    nil_ranked = predict(linker_, predictions.mentions, 1, query_lang=linking.query_lang, progress=linking.progress,
                         exclude=removed_names)
    nil_hits = predictions.hits(1, scoring.rule, [tuple(r.ids for r in q) for q in nil_ranked])
    return nil_section(top_of(nil_ranked, "top_confidence"), nil_hits, gold_nil, scoring.min_confidence, removed,
                       scoring.nil_fraction)


def run_config(index_dir: str | Path, linker_, data: EvalData, scoring: Scoring, linking: Linking,
               filter_names: Sequence[str], references: dict[str, ReferenceSet | None], mentions: int) -> dict:
    """The resolved configuration a report records."""
    return {
        "library_version": linker.__version__,
        "evaluated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "index": str(index_dir),
        "index_version": linker_.version,
        "query_precision": linker_.precision,
        "index_manifest": {k: v for k, v in linker_.manifest.items() if k != "files"},
        "dataset": data.dataset,
        "train": list(data.train),
        "filters": list(filter_names),
        "filter_mode": scoring.mode,
        "abbreviations": str(scoring.abbreviations) if scoring.abbreviations else None,
        "composite_rule": scoring.rule,
        "composite_rules": list(scoring.composite),
        "gold_via_xref": scoring.gold_via_xref,
        "alternative_ids": "concept table xrefs",
        "query_lang": linking.query_lang,
        "scorer": linker_.scorer,
        "calibration": linker_.manifest.get("calibration"),
        "ks": list(scoring.ks),
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED, "level": 0.95},
        "mentions": mentions,
        "reference_strings": {k: (len(v) if v is not None else None) for k, v in references.items()},
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


# --------------------------------------------------------------------------- output


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{100 * value:.2f}"


FILTER_TITLES = {"full": "Full", "dict": "Filtered (dict)", "dict0.2": "Filtered0.2 (dict)",
                 "train": "Filtered (train)", "train0.2": "Filtered0.2 (train)"}


def markdown_table(labelled: Sequence[tuple[str, EvalReport]], *, intervals: bool = False, reach: bool = False) -> str:
    """The paper's layout: one row per (dataset, language[, composite rule]); per filter: n, Acc@k...

    `reach` adds a column: % of the Full subset whose gold id is in the dictionary at all. A
    column *composite* appears when a report scored several composite rules.
    """
    if not labelled:
        return ""
    filters = list(dict.fromkeys(r.filter for _, rep in labelled for r in rep.rows))
    ks = labelled[0][1].ks
    several = any(len({r.composite for r in rep.rows}) > 1 for _, rep in labelled)
    head = ["dataset", "lang"] + (["composite"] if several else []) + (["in dict %"] if reach else []) + [
        f"{FILTER_TITLES.get(f, f)} {col}" for f in filters for col in ("n", *(f"Acc@{k}" for k in ks))]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, rep in labelled:
        for rule, lang in dict.fromkeys((r.composite, r.lang) for r in rep.rows):
            cells = [label, lang] + ([rule] if several else [])
            if reach:
                first = next(r for r in rep.rows if r.lang == lang)
                cells.append(_pct(first.reachable))
            for f in filters:
                row = next((r for r in rep.rows if r.filter == f and r.lang == lang and r.composite == rule), None)
                if row is None:
                    cells += [""] * (1 + len(ks))
                    continue
                cells.append(f"{row.n:,}")
                for k in ks:
                    a = row.acc(k)
                    cells.append(_pct(a.value) + (f" [{_pct(a.low)}, {_pct(a.high)}]" if intervals else ""))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _chart(report: EvalReport, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.rows if r.lang == "all" and r.composite == report.rows[0].composite]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(rows), 3.2))
    width = 0.8 / len(report.ks)
    x = np.arange(len(rows))
    for j, k in enumerate(report.ks):
        values = [100 * r.acc(k).value if r.n else 0 for r in rows]
        errors = np.array([[100 * (r.acc(k).value - r.acc(k).low), 100 * (r.acc(k).high - r.acc(k).value)]
                           if r.n else [0, 0] for r in rows]).T
        ax.bar(x + j * width, values, width, yerr=errors, capsize=2, label=f"Acc@{k}")
    ax.set_xticks(x + width * (len(report.ks) - 1) / 2, [f"{r.filter}\nn={r.n:,}" for r in rows], fontsize=8)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"{title}: {report.config.get('mentions', '')} mentions of {report.dataset.split(':', 1)[0]} "
                 f"{Path(report.dataset.split(':', 1)[-1].split('#')[0]).name}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")  # path may be a temporary name without .png
    plt.close(fig)


def check_report_paths(
    report_dir: str | Path, name: str | None, *, inputs: Sequence[str | Path] = (), overwrite: bool = False
) -> dict[str, Path]:
    """The report's files, refused when one exists (without `overwrite`) or is an input."""
    report_dir = Path(report_dir)
    name = name or report_dir.name
    paths = {ext: report_dir / f"{name}.{ext}" for ext in ("json", "md", "png")}
    paths["coverage"] = report_dir / f"{name}.coverage.png"  # written when the report has calibration figures
    for path in paths.values():
        check_output(path, inputs=inputs, overwrite=overwrite, option="--report")
    return paths


def write_report(
    report: EvalReport, report_dir: str | Path, *, name: str | None = None, overwrite: bool = False,
    inputs: Sequence[str | Path] = (),
) -> EvalReport:
    """Write ``NAME.json``, ``NAME.md``, ``NAME.png`` (and ``NAME.coverage.png`` with calibration
    figures) under `report_dir`; return the report with their paths."""
    paths = check_report_paths(report_dir, name, inputs=inputs, overwrite=overwrite)
    name = name or Path(report_dir).name
    if report.calibration is None:
        del paths["coverage"]
    report = EvalReport(**{**asdict_shallow(report), "files": tuple(str(p) for p in paths.values())})
    with atomic_file(paths["json"]) as tmp:
        tmp.write_text(portable_paths(json.dumps(report.to_dict(), ensure_ascii=False, indent=2, default=str) + "\n"),
                       encoding="utf-8")
    md = [
        f"# Evaluation: {report.dataset}",
        "",
        f"Index `{report.config.get('index_version', report.index)}`; filter mode {report.config.get('filter_mode')}, "
        f"composite rule {', '.join(report.config.get('composite_rules', [report.config.get('composite_rule')]))}; {report.config.get('mentions')} mentions, "
        f"{_pct(report.reachable)}% with a gold id present in the dictionary.",
        "Acc@k in %, 95% bootstrap interval in brackets "
        f"({BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}).",
        "",
        markdown_table([(Path(report.dataset.split(':', 1)[-1].split('#')[0]).name, report)], intervals=True, reach=True),
        "",
        *trust_markdown(report),
        "Seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in report.seconds.items()),
        "",
    ]
    with atomic_file(paths["md"]) as tmp:
        tmp.write_text(portable_paths("\n".join(md)), encoding="utf-8")
    # The tables are written; a chart must never cost them (nor the exit code).
    tables = f"{paths['md'].name} and {paths['json'].name}"
    drawn = {"png": write_chart(paths["png"], lambda tmp: _chart(report, tmp, name), overwrite=overwrite,
                                tables=tables)}
    if "coverage" in paths:
        drawn["coverage"] = write_chart(paths["coverage"], lambda tmp: coverage_chart(report.calibration, tmp, name),
                                        overwrite=overwrite, tables=tables)
    written = tuple(str(p) for key, p in paths.items() if drawn.get(key, True))
    return EvalReport(**{**asdict_shallow(report), "files": written})


def trust_markdown(report: EvalReport) -> list[str]:
    """Markdown lines for the re-ranker, calibration and NIL sections (empty when absent)."""
    lines: list[str] = []
    if report.rerank:
        r = report.rerank
        lines += [f"Re-ranker `{r['reranker']['name']}` (sha256 {r['reranker']['sha256'][:12]}) over the retriever's "
                  f"top {r['rerank_k']}: {r['rerank_ms_per_mention']:.1f} ms per distinct mention to re-rank, "
                  f"{r['retrieve_ms_per_mention']:.1f} ms to retrieve ({r.get('distinct_texts_linked', '?')} distinct "
                  f"of {r['texts_linked']} mentions linked; a repeated text is linked once).", "",
                  "| filter | n | " + " | ".join(f"retriever Acc@{k} | re-ranked Acc@{k} | gain" for k in report.ks) + " |",
                  "|---|---|" + "---|---|---|" * len(report.ks)]
        for row in r["rows"]:
            cells = [FILTER_TITLES.get(row["filter"], row["filter"]), f"{row['n']:,}"]
            for k in report.ks:
                before, after = row[f"retriever_acc{k}"], row[f"reranked_acc{k}"]
                cells += [_pct(before), _pct(after), f"{100 * (after - before):+.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if report.calibration:
        c = report.calibration
        at = c["at_coverage"]
        ece = ("; the index has no calibrated confidence (`linker calibrate` fits one)" if c["ece_calibrated"] is None
               else f", of the calibrated confidence {c['ece_calibrated']:.4f}")
        lines += [f"Calibration (Full, {c['mentions']:,} mentions, Acc@1 {_pct(c['accuracy_at_1'])}): ECE of the raw "
                  f"score {c['ece_raw']:.4f}{ece}. Keeping the "
                  f"{_pct(at['coverage'])}% most confident ({c['confidence']} >= "
                  f"{'–' if at['threshold'] is None else format(at['threshold'], '.4f')}): Acc@1 "
                  f"{_pct(at['accuracy'])}.", ""]
        if c.get("decisions"):
            lines += ["| decision | mentions | share | precision of the best candidate |", "|---|---:|---:|---:|"]
            lines += [f"| {d} | {v['mentions']:,} | {_pct(v['share'])} | "
                      f"{'-' if v['precision'] is None else _pct(v['precision'])} |" for d, v in c["decisions"].items()]
            lines.append("")
    if report.nil:
        n = report.nil
        best = n["best_f1_oracle"]
        lines += [f"No link: {n['concepts_removed']:,} gold concepts ({100 * n['fraction_removed']:.0f}%) removed from "
                  f"the dictionary, {n['gold_nil']:,} of {n['mentions']:,} mentions left without an answer. At "
                  f"confidence < {n['threshold']}: {n['predicted_nil']:,} 'no link' answers, precision "
                  f"{_pct(n['precision'])}, recall {_pct(n['recall'])}, F1 {_pct(n['f1'])}; Acc@1 of the linked "
                  f"answerable mentions {_pct(n['linked_accuracy_at_1'])}."
                  + ("" if best is None else f" Best F1 over thresholds (oracle): {_pct(best['f1'])} at "
                     f"{best['threshold']:.4f}."), ""]
    return lines


def asdict_shallow(obj) -> dict:
    return {f: getattr(obj, f) for f in obj.__dataclass_fields__}
