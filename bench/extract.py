"""The adverse-event extractor (linker-ae): eval/extract/report.md and report.json.

    python -m bench.extract [--model linker-ae] [--out eval/extract] [--per-template 40] [--compare-to FOLDER]
    python -m bench.extract --record-throughput   # the last --compare-to timing into the release's card

- TAC 2017 development split (the labels the release's manifest lists as held out): AdverseReaction mention F1,
  exact and relaxed; then end-to-end coding (`linker.extract.annotate_documents`) with a closed-world MedDRA-format
  dictionary built from the Normalization elements of the training-split labels only, scored with the ADE Eval
  use cases (`linker.eval.ade_eval`), beside the same dictionary coding the gold mentions.
- PHEE test: Effect EM_F1 / Token_F1 beside the PHEE paper's rows. Scored once per release: the count is kept in
  report.json and a second scoring needs --rescore-test.
- The rule-based assertion step (`linker.extract.assertion`) on the gold spans of TAC dev and PHEE dev.
- The capability suite (`linker.extract.capabilities`), with the model's status alone and with the rules.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from bench import data
from bench.report import REPO, Report, command, git_commit, table
from linker.eval.capabilities import capability_table

RUNS = (("terms", "rules"), ("auto", "rules"), ("terms", "model"))  # (style, assertion) of the TAC dev runs
LOOKUP_RUN = ("lookup", "none")  # the plain lookup of the dictionary's names (`Lookup`), beside the tagger's runs
LOOKUP_KEY = "/".join(LOOKUP_RUN)
# `--min-score` of the first run's links (`Linker(min_score=)`): a span whose best candidate scores below it gets no
# code. Chosen on the TAC dev split's label PT F1 (the best of this grid, `min_score_grid`); bench.extract_languages
# applies the value chosen here (eval/extract/report.json) to the Japanese labels unchanged.
MIN_SCORES = (0.5, 0.6, 0.7, 0.8, 0.9)
PAPER_ROWS = [("PHEE paper: sequence labelling", 70.75, 79.72), ("PHEE paper: extractive QA", 71.21, 80.26),
              ("PHEE paper: generative QA", 74.00, 83.63)]
TAC_PUBLISHED = ("Belousov et al. 2019, 'Extracting adverse drug reactions and their context using sequence labelling "
                 "ensembles in TAC2017' (arXiv:1905.11716): TAC 2017 task 1 test-set F1 76.00 and 75.61 (their two "
                 "runs; the official test set, not this development split). Track overview: Roberts, Demner-Fushman, "
                 "Tonning, 'Overview of the TAC 2017 Adverse Reaction Extraction from Drug Labels Track', TAC 2017.")


def closed_world_meddra(label_files: list[Path], folder: Path) -> dict:
    """MedDRA ASCII files (pt.asc, llt.asc) with the PTs and LLTs that the labels' Normalization elements name."""
    from linker.formats.ade_xml import read_ade_xml

    pts, llts = {}, {}
    for file in label_files:
        for norm in read_ade_xml(file).root.iter("Normalization"):
            pt_id, pt = norm.get("meddra_pt_id"), norm.get("meddra_pt")
            if pt_id and pt:
                pts.setdefault(pt_id, pt)
                if norm.get("meddra_llt_id") and norm.get("meddra_llt"):
                    llts.setdefault(norm.get("meddra_llt_id"), (norm.get("meddra_llt"), pt_id))
    ascii_dir = folder / "MedDRA_closed_English" / "MedAscii"
    ascii_dir.mkdir(parents=True)
    (ascii_dir / "pt.asc").write_text("".join(f"{c}${n}$$$$$$$$$$\n" for c, n in sorted(pts.items())), encoding="utf-8")
    rows = {c: (n, c) for c, n in pts.items()} | llts  # every PT is also an LLT of itself
    (ascii_dir / "llt.asc").write_text("".join(f"{c}${n}${p}$$$$$$$Y$$\n" for c, (n, p) in sorted(rows.items())),
                                       encoding="utf-8")
    return {"pts": len(pts), "llts": len(llts), "folder": ascii_dir.parent}


def closed_world_linker(train_files: list[Path], tmp: Path):
    from linker.dictionary import SourceSpec
    from linker.index import build_index
    from linker.link import Linker

    meddra = closed_world_meddra(train_files, tmp)
    table_path = data.dictionary(tmp / "closed.parquet", [SourceSpec("meddra", (meddra["folder"],))])
    build_index(table_path, kind="tfidf", out=tmp / "closed-index")
    return Linker.load(tmp / "closed-index"), {"pts": meddra["pts"], "llts": meddra["llts"]}


class Lookup:
    """The plain dictionary lookup as an extractor: every name of the lexicon found in a text (lower case, whole
    words, longest first; `linker.extract.lexicon`) is a positive AdverseEvent span; no model. The row a tagger has
    to beat."""

    revision = "lookup"

    def __init__(self, lexicon) -> None:
        self.lexicon = lexicon

    def extract(self, texts, **_):
        from linker.extract import AE, ExtractedSpan

        return [[ExtractedSpan(a, b, text[a:b], AE, "positive", 1.0) for a, b in self.lexicon.find(text)]
                for text in texts]


def label_pt_sets(files) -> dict[str, set[str]]:
    """Each label's set of MedDRA PT ids (its <Reactions>' Normalization elements), by file stem."""
    return {Path(f).stem: _label_pts(Path(f)) for f in files}


def label_pt_scores(gold: dict[str, set[str]], found: dict[str, set[str]]) -> dict:
    """Label-level MedDRA PT micro P/R/F of `found` (a written ade-xml's PT sets) against `gold`, by label."""
    from linker.extract.metrics import prf

    tp = fp = fn = 0
    for stem, truth in gold.items():
        given = found.get(stem, set())
        tp, fp, fn = tp + len(truth & given), fp + len(given - truth), fn + len(truth - given)
    return prf(tp, tp + fp, tp, tp + fn)


PROXY_LABELS = 20  # the document-label proxy's label set: the PTs most labels of the training split hold


def _label_pts(path: Path) -> set[str]:
    from linker.formats.ade_xml import read_ade_xml

    return {n.get("meddra_pt_id") for n in read_ade_xml(path).root.iter("Normalization") if n.get("meddra_pt_id")}


def proxy_labels(train: dict[str, set[str]]) -> tuple[str, ...]:
    """The `PROXY_LABELS` PTs most training labels hold: the document-label proxy's label set."""
    counts = Counter(pt for pts in train.values() for pt in pts)
    return tuple(pt for pt, _ in counts.most_common(PROXY_LABELS))


def doc_label_proxy(labels: tuple[str, ...], gold: dict[str, set[str]], found: dict[str, set[str]]) -> dict:
    """The NTCIR-17 SM-ADE shape on a TAC proxy (no public data exists for that task): each dev label a document,
    its labels `labels` (`proxy_labels`), gold from its <Reactions>, predicted from the written ade-xml; scored by
    `linker.formats.doc_labels.score_doc_labels`."""
    from linker.formats.doc_labels import DocLabels, score_doc_labels

    keep = set(labels)
    return score_doc_labels(DocLabels(labels, {stem: frozenset(pts & keep) for stem, pts in gold.items()}),
                            DocLabels(labels, {stem: frozenset(found.get(stem, set()) & keep) for stem in gold}))


def tac_dev(extractor, dev_files: list[Path], train_files: list[Path]) -> dict:
    """Mention scores, end-to-end ADE Eval, label-level PT F1 and throughput of each of `RUNS` on the TAC dev
    labels, and of the plain lookup of the same dictionary's names (`Lookup`)."""
    from linker.eval.ade_eval import score_paths
    from linker.extract import AE, annotate_documents, annotate_spans, lexicon_of
    from linker.extract.data import read_tac
    from linker.extract.io import read_inputs, span_pieces, write_output
    from linker.extract.metrics import mention_scores
    from linker.link import Linker
    from linker.normalize import normalize_path

    sections = [doc for file in dev_files for doc in read_tac(file)]
    gold = {name: [[g[0] for g in d.groups if keep(g[2])] for d in sections]
            for name, keep in (("all", lambda s: True), ("positive", lambda s: s == "positive"))}
    out: dict = {"discontinuous_gold": sum(1 for d in sections for g in d.groups if len(g[0]) > 1)}
    with tempfile.TemporaryDirectory(prefix="bench-extract-") as tmp:
        tmp = Path(tmp)
        linker, out["dictionary"] = closed_world_linker(train_files, tmp)
        lexicon = lexicon_of(linker)  # the index's names: what `annotate` gives the tagger as evidence
        gold_pts = label_pt_sets(dev_files)
        labels = proxy_labels(label_pt_sets(train_files))
        out["dictionary"]["lexicon_names"] = len(lexicon)
        lookup = Lookup(lexicon)
        texts = [d.text for d in sections]
        by_file = [list(read_inputs(file)) for file in dev_files]
        if [text for docs in by_file for doc in docs for _, text in doc.sections] != texts:
            raise SystemExit("bench.extract: read_tac and read_inputs disagree on the TAC dev sections")
        tagged: dict[str, list] = {}

        def coded(run_linker, predicted) -> list:
            """The TAC dev documents with `predicted` (tags of every section, in order) coded by `run_linker`."""
            rows = iter(annotate_spans(run_linker, texts, predicted))
            docs = [doc for docs_ in by_file for doc in docs_]
            for doc in docs:
                doc.spans = [next(rows) for _ in doc.sections]
            return docs

        for style, assertion in (*RUNS, LOOKUP_RUN):
            key = f"{style}/{assertion}"
            model = lookup if key == LOOKUP_KEY else extractor
            t0 = time.perf_counter()
            predicted = annotate_documents(texts, model=model, style=style, assertion=assertion, lexicon=lexicon)
            extract_seconds = time.perf_counter() - t0
            tagged[key] = predicted
            spans = {"all": [[tuple(span_pieces(s)) for s in p if s.label == AE] for p in predicted],
                     "positive": [[tuple(span_pieces(s)) for s in p if s.label == AE and s.status == "positive"]
                                  for p in predicted]}
            run = {name: mention_scores(gold[name], spans[name]) for name in gold}
            t0 = time.perf_counter()
            docs = coded(linker, predicted)  # the same tags, linked: what `annotate` writes
            link_seconds = time.perf_counter() - t0
            seconds = extract_seconds + link_seconds
            n_spans = sum(len(rows) for doc in docs for rows in doc.spans)
            if (style, assertion) == RUNS[0]:
                out["min_score_grid"] = min_score_grid(gold_pts, [(file.stem, doc) for file, docs_ in
                                                                  zip(dev_files, by_file) for doc in docs_])
            write_output(docs, tmp / key, "ade-xml", coded=True)
            written = sorted((tmp / key).glob("*.xml"))
            run["ade_eval"] = _summary(score_paths(dev_files, written).to_dict())
            found = label_pt_sets(written)
            run["label_pt"] = label_pt_scores(gold_pts, found)
            run["doc_labels"] = doc_label_proxy(labels, gold_pts, found)
            run["throughput"] = {"annotate_seconds": round(seconds, 1), "docs_per_s": round(len(docs) / seconds, 3),
                                 "spans_per_s": round(n_spans / seconds, 1), "extract_seconds": round(extract_seconds, 1),
                                 "annotate_over_extract": round(seconds / max(extract_seconds, 1e-3), 2)}
            out[key] = run
        # the first run's tags again, their weak links withheld by the linker itself (`--min-score`), written, scored
        chosen = out["min_score_grid"]["chosen"]
        key = min_score_key(chosen)
        docs = coded(Linker(linker.index, min_score=chosen), tagged["/".join(RUNS[0])])
        write_output(docs, tmp / "min-score", "ade-xml", coded=True)
        written = sorted((tmp / "min-score").glob("*.xml"))
        found = label_pt_sets(written)
        out[key] = {"ade_eval": _summary(score_paths(dev_files, written).to_dict()),
                    "label_pt": label_pt_scores(gold_pts, found), "doc_labels": doc_label_proxy(labels, gold_pts, found)}
        t0 = time.perf_counter()
        (tmp / "gold-coded").mkdir()
        for file in dev_files:  # the same dictionary coding the gold mentions: the coding part alone
            normalize_path(linker, file, tmp / "gold-coded" / file.name, fmt="ade-xml")
        out["normalize_gold_seconds"] = round(time.perf_counter() - t0, 1)
        written = sorted((tmp / "gold-coded").glob("*.xml"))
        out["gold_mentions_coded"] = _summary(score_paths(dev_files, written).to_dict())
        found = label_pt_sets(written)
        out["gold_mentions_coded"]["label_pt"] = label_pt_scores(gold_pts, found)
        out["gold_mentions_coded"]["doc_labels"] = doc_label_proxy(labels, gold_pts, found)
    return out


def min_score_key(cut: float) -> str:
    return f"{'/'.join(RUNS[0])}, --min-score {cut}"


def min_score_grid(gold: dict[str, set[str]], docs: list) -> dict:
    """Label PT scores of the annotated `docs` ((stem, document) pairs) were every positive event whose best
    candidate scores below each of `MIN_SCORES` left uncoded (what `Linker(min_score=)` does), and the best of the
    grid by F1 (`chosen`; the lower cut of a tie)."""
    events = [(stem, row["code"], row["candidates"][0]["score"]) for stem, doc in docs for rows in doc.spans
              for row in rows if row.get("code") and row["status"] == "positive" and row["candidates"]]
    grid = {}
    for cut in (None, *MIN_SCORES):
        found: dict[str, set[str]] = {}
        for stem, code, score in events:
            if cut is None or score >= cut:
                found.setdefault(stem, set()).add(code)
        grid["none" if cut is None else str(cut)] = label_pt_scores(gold, found)
    chosen = max(MIN_SCORES, key=lambda c: (grid[str(c)]["f1"], -c))
    return {"scores": grid, "chosen": chosen}


EXAMPLES = (  # the docs' own examples (docs/extract.md, README) and issue 47's case text
    "A 45-year-old woman developed severe nausea and hair loss after starting cisplatin. She had no headache.",
    "Severe rash after lamotrigine; no fever.",
    "Patient started amoxicillin 3 days ago and developed an itchy rash and diarrhea. No fever. She had headaches "
    "before starting the drug. The rash cleared after stopping.",
    "He was given ibuprofen for his headache and developed a rash.",
)


def _shown_path(path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def examples(extractor, linker, index: Path) -> dict:
    """`annotate` (the defaults: style auto, assertion rules) of `EXAMPLES` with the index users get from `make
    demo`: each span's label, status, code, name and decision."""
    from linker.extract import annotate_documents

    if linker is None:
        return {"index": None}
    rows = annotate_documents(list(EXAMPLES), model=extractor, linker=linker)
    return {"index": _shown_path(index), "texts": [
        {"text": text, "spans": [{k: row[k] for k in ("text", "label", "status", "code", "name", "decision")}
                                 | {"confidence": row["confidence"], "link_confidence": row["link_confidence"]}
                                 for row in doc]} for text, doc in zip(EXAMPLES, rows)]}


def speed_against(extractor, other_folder: Path, dev_files: list[Path], runs: int = 3, sentences: int = 400) -> dict:
    """Throughput of `extractor` and of the release in `other_folder` (e.g. the previous linker-ae, from `git
    archive`), in this process, alternating, one thread each, the median of `runs`: PHEE sentences per second (the
    first `sentences` of PHEE dev, PHEE's style) and drug labels per second (every section of the TAC dev labels
    `dev_files`, one call a label, the default style; the tagging that `annotate` adds its linking to)."""
    import os
    import statistics

    from linker.extract import load_extractor
    from linker.extract.data import read_phee, read_tac

    texts = [d.text for d in read_phee(data.get("phee").path("dev"))][:sentences]
    labels = [[d.text for d in read_tac(file)] for file in dev_files]
    other = load_extractor(other_folder, threads=1)
    times: dict[tuple[str, str], list[float]] = {}
    load = os.getloadavg()
    for _ in range(runs):
        for name, model in (("other", other), ("this", extractor)):
            t0 = time.perf_counter()
            model.extract(texts, style="phrases")
            t1 = time.perf_counter()
            for sections in labels:
                model.extract(sections)
            times.setdefault((name, "sentences"), []).append(t1 - t0)
            times.setdefault((name, "labels"), []).append(time.perf_counter() - t1)
    median = {key: statistics.median(values) for key, values in times.items()}
    return {"other": other.revision, "sentences": len(texts), "labels": len(labels), "runs": runs,
            "load_average_before": list(load), "load_average_after": list(os.getloadavg()),
            "this_per_s": round(len(texts) / median["this", "sentences"], 1),
            "other_per_s": round(len(texts) / median["other", "sentences"], 1),
            "ratio": round(median["other", "sentences"] / median["this", "sentences"], 3),
            "this_labels_per_s": round(len(labels) / median["this", "labels"], 3),
            "other_labels_per_s": round(len(labels) / median["other", "labels"], 3),
            "labels_ratio": round(median["other", "labels"] / median["this", "labels"], 3)}


def tag_joined(extractor, texts: list[str], joined: int, **options) -> list[list]:
    """The spans of each text, the texts tagged `joined` at a time, in their order, as one text joined by a space;
    a span that runs across two of them is dropped."""
    if joined == 1:
        return extractor.extract(texts, **options)
    groups = [texts[i:i + joined] for i in range(0, len(texts), joined)]
    out = []
    for group, found in zip(groups, extractor.extract([" ".join(g) for g in groups], **options), strict=True):
        start = 0
        for text in group:
            end = start + len(text)
            out.append([replace(s, start=s.start - start, end=s.end - start) for s in found
                        if start <= s.start and s.end <= end])
            start = end + 1
    return out


def phee_effects(extractor, split: str, joined: int = 1) -> dict:
    """Effect EM_F1 / Token_F1 of `extractor` on a PHEE split, PHEE's span convention (`style="phrases"`).
    `joined`: the sentences are tagged `joined` at a time, in their order, as one text (a case narrative's context;
    a span that runs across two sentences is dropped), and each sentence scored on its own spans."""
    from linker.extract.data import read_phee
    from linker.extract.train import effect_scores

    skipped: list[str] = []
    docs = read_phee(data.get("phee").path(split), skipped)
    t0 = time.perf_counter()
    spans = tag_joined(extractor, [d.text for d in docs], joined, style="phrases")
    seconds = time.perf_counter() - t0
    scores = effect_scores(docs, spans)
    scores.update(sentences=len(docs), skipped_annotations=len(skipped), extract_seconds=round(seconds, 1),
                  sentences_per_s=round(len(docs) / seconds, 1))
    return scores


def phee_test(extractor, previous: dict, rescore: bool) -> tuple[dict, str, int, str | None]:
    """PHEE test scores, the release and the commit that scored them, and the count of test evaluations: kept from
    `previous` unless `rescore` (a test set is scored once per release)."""
    count = int(previous.get("phee_test_evaluations", 0))
    if count and not rescore:
        print(f"PHEE test already scored {count} time(s): kept (pass --rescore-test to score again)")
        return (previous["phee_test"], previous.get("phee_test_model", previous.get("model")), count,
                previous.get("phee_test_commit"))
    return phee_effects(extractor, "test"), extractor.revision, count + 1, git_commit()


JOINED = 4  # PHEE dev sentences tagged as one text (`phee_effects`): a case narrative's context
DECISION_CLASSES = ("adverse event", "negated or hypothetical", "beneficial", "indication", "medical history")
PRESENT_BEFORE = "present before the drug"


def _decision_class(label: str, status: str) -> str | None:
    from linker.extract.data import AE, AR, BENEFIT, HISTORY, INDICATION

    if label in (AE, AR):
        return "adverse event" if status == "positive" else "negated or hypothetical"
    return {BENEFIT: "beneficial", INDICATION: "indication", HISTORY: "medical history"}.get(label)


def decision_on_phee_dev(extractor) -> dict:
    """Adverse event or not, on PHEE dev: each gold span's class (an Effect of an Adverse_event, positive or negated /
    hypothetical; an Effect of a Potential_therapeutic_event: beneficial; a Treat-Disorder: indication) against the
    classes of the spans `annotate` returns (style auto, assertion rules), matched by overlap: per class, recall is
    the share of its gold spans that a span of that class overlaps, precision the share of its predicted spans that
    overlap a gold span of that class. Medical history: PHEE's Sub-Disorder spans (the subject's own disorder,
    present before the drug) that no gold adverse event overlaps, against the MedicalHistory spans of the decision
    head (`linker.extract.decision`); `PRESENT_BEFORE`: how many of those a positive adverse-event span overlaps:
    coded as an event of the drug, wrongly."""
    from linker.extract.data import read_phee
    from linker.extract.decision import history_spans
    from linker.extract.metrics import prf

    docs = read_phee(data.get("phee").path("dev"))
    predicted = extractor.extract([d.text for d in docs])
    counts = {c: {"gold": 0, "found": 0, "predicted": 0, "right": 0} for c in DECISION_CLASSES}
    before = {"gold": 0, "coded": 0}
    for doc, spans in zip(docs, predicted, strict=True):
        gold = [(s, e, c) for s, e, label, status in doc.spans if (c := _decision_class(label, status))]
        gold += [(s, e, "medical history") for s, e in history_spans(doc)]
        pred = [(s.start, s.end, c) for s in spans if (c := _decision_class(s.label, s.status))]
        for s, e, c in gold:
            counts[c]["gold"] += 1
            counts[c]["found"] += any(a < e and s < b and k == c for a, b, k in pred)
        for a, b, k in pred:
            counts[k]["predicted"] += 1
            counts[k]["right"] += any(a < e and s < b and c == k for s, e, c in gold)
        coded = [(a, b) for a, b, k in pred if k == "adverse event"]
        for s, e, c in gold:
            if c == "medical history":
                before["gold"] += 1
                before["coded"] += any(a < e and s < b for a, b in coded)
    scores = {c: {**n, **prf(n["right"], n["predicted"], n["found"], n["gold"])} for c, n in counts.items()}
    return {**scores, PRESENT_BEFORE: {**before, "coded_pct": round(100 * before["coded"] / max(before["gold"], 1), 2)}}


def coordinations_on_phee_dev(extractor, linker=None) -> dict:
    """One code per event, on PHEE dev: the gold adverse-event Effect phrases that coordinate two or more parts
    (`linker.extract.extractor.coordinated_parts`: "nausea, vomiting and diarrhea"), and of their parts the share
    that an AdverseEvent span of `annotate`'s default style overlaps, with the default index's names when given;
    beside it, the share of all predicted AdverseEvent spans that overlap a gold adverse-event Effect."""
    from linker.extract import lexicon_of
    from linker.extract.data import AE, read_phee
    from linker.extract.extractor import coordinated_parts

    docs = read_phee(data.get("phee").path("dev"))
    predicted = extractor.extract([d.text for d in docs], lexicon=lexicon_of(linker) if linker is not None else None)
    n = {"phrases": 0, "parts": 0, "parts_found": 0, "predicted": 0, "predicted_right": 0}
    for doc, spans in zip(docs, predicted, strict=True):
        events = [(s.start, s.end) for s in spans if s.label == AE]
        gold = [(a, b) for a, b, label, _ in doc.spans if label == AE]
        n["predicted"] += len(events)
        n["predicted_right"] += sum(any(a < y and x < b for x, y in gold) for a, b in events)
        for a, b in gold:
            if len(parts := [(x, y) for x, y in coordinated_parts(doc.text, a, b, "en") if y > x]) > 1:
                n["phrases"] += 1
                n["parts"] += len(parts)
                n["parts_found"] += sum(any(x < q and p < y for p, q in events) for x, y in parts)
    return {**n, "names": linker is not None, "parts_found_pct": round(100 * n["parts_found"] / max(n["parts"], 1), 2),
            "predicted_right_pct": round(100 * n["predicted_right"] / max(n["predicted"], 1), 2)}


def assertion_on_gold(dev_files: list[Path]) -> dict:
    """Gold status x the rules' status of every gold event span of TAC dev and PHEE dev (no tagger involved)."""
    from linker.extract.assertion import load_cues, status_of
    from linker.extract.data import DRUG, INDICATION, read_phee, read_tac

    cues = load_cues()
    out = {"cues_version": cues.version, "cues_sha256": cues.sha256}
    for name, docs in (("TAC dev", [d for f in dev_files for d in read_tac(f)]),
                       ("PHEE dev", read_phee(data.get("phee").path("dev")))):
        pairs = Counter(f"{status} -> {status_of(d.text, s, e, cues) or 'positive'}"
                        for d in docs for s, e, label, status in d.spans if label not in (DRUG, INDICATION))
        out[name] = dict(sorted(pairs.items()))
    return out


def capabilities(extractor, per_template: int, seed: int, linker=None) -> tuple[dict, list[str]]:
    from linker.extract import lexicon_of
    from linker.extract.capabilities import run_suite

    lexicon = lexicon_of(linker) if linker is not None else None
    reports = run_suite(extractor, per_template=per_template, seed=seed, lexicon=lexicon)
    c = reports[0].config
    lines = [f"Suite data version {c['suite_data_version']} (`linker/data/capabilities/extract/`), {c['templates']} "
             f"templates, up to {c['per_template']} (drug, symptom) pairs each (seed {c['seed']}), {c['cases']:,} "
             f"sentences, `style=\"{c['style']}\"`, "
             + (f"with the names of `{_shown_path(c['lexicon'])}` as `annotate --index` gives them to the tagger"
                if c.get("lexicon") else "without an index's names (as `extract`)")
             + "; failure rate in %, 95% Wilson interval in brackets. A case of an "
             "`expect event` template fails when no positive AdverseEvent span overlaps the symptom; of an `expect "
             "no_event` template, when one does (it would be coded as an adverse event of the drug). "
             "A coordination case fails unless each symptom has a positive AdverseEvent span of its own. "
             "`assertion=model`: the tagger's status head alone; `assertion=rules`: with the NegEx-style step. The cue "
             "lists and these templates were written together, by one hand: the rules' rows here are optimistic, and "
             "the gold-span table above is their independent check.", "",
             capability_table(reports), "",
             *table(["capability", "symptom found as AdverseEvent, any status (%)"],
                    [(cap, "–" if v is None else f"{100 * v:.1f}") for cap, v in c["found"].items()]), "",
             "Failures with the rules, one per template (the AdverseEvent spans found):", ""]
    for cap, shown in reports[-1].config["failures"].items():
        lines += [f"- {cap}: `{f['text']}` → {', '.join(f['spans']) or 'none'}" for f in shown]
    return {"reports": [r.to_dict() for r in reports]}, lines


def record(release: Path, report: Path) -> None:
    """Write the --compare-to timing of `report` into the tagger release `release` (its manifest and card)."""
    from linker.extract.train import record_throughput
    from linker.models import read_release

    previous = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else {}
    revision = read_release(release).revision
    measured = previous.get("speed_against")
    if previous.get("model") != revision or not measured or "labels" not in measured:
        raise SystemExit(f"bench.extract: {report} holds no --compare-to timing of {revision}: run "
                         "`python -m bench.extract --compare-to FOLDER` first")
    if measured.get("earlier_run") and "command" not in measured:  # carried from a run whose command is not known
        raise SystemExit(f"bench.extract: {report}'s timing was carried from an earlier run: run `python -m "
                         "bench.extract --compare-to FOLDER` again")
    # the run that timed it: its own record, or (a report written before it kept one) the report's header
    measured = {**{k: v for k, v in measured.items() if k not in ("earlier_run", "command", "measured_on")},
                "command": measured.get("command", previous["command"]),
                "measured_on": measured.get("measured_on", previous["date"][:10])}
    record_throughput(release, measured)
    print(f"{release}: throughput against {measured['other']} written into its manifest and card")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="linker-ae")
    parser.add_argument("--out", type=Path, default=REPO / "eval" / "extract")
    parser.add_argument("--rescore-test", action="store_true", help="Score PHEE test again (counted in the report).")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--per-template", type=int, default=40, help="Capability cases per template.")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--compare-to", type=Path, default=None,
                        help="Another tagger release folder (the previous linker-ae) to time against, alternating.")
    parser.add_argument("--index", type=Path, default=REPO / "indexes" / "default",
                        help="Index of the examples' codes (`make demo` builds it).")
    parser.add_argument("--record-throughput", action="store_true",
                        help="Only write the last report's --compare-to timing into the release's manifest and card "
                             "(when the report is of the same release) and stop.")
    args = parser.parse_args()
    from linker.extract import load_extractor
    from linker.extract.extractor import release_path
    from linker.models import read_release

    if args.record_throughput:
        record(release_path(args.model), args.out / "report.json")
        return

    report = Report("report", out=args.out, title="Adverse-event extraction (linker-ae): PHEE test, TAC 2017 "
                    "development split, capabilities")
    previous = json.loads(p.read_text(encoding="utf-8")) if (p := args.out / "report.json").is_file() else {}
    started = time.perf_counter()
    extractor = load_extractor(args.model, threads=args.threads)
    manifest = read_release(release_path(args.model)).manifest
    tac = data.get("tac2017").path("train")
    dev_files = [tac / f"{stem}.xml" for stem in manifest["training"]["tac_dev_labels"]]
    train_files = [tac / f"{stem}.xml" for stem in manifest["training"]["tac_train_labels"]]
    r = {"model": extractor.revision, "threshold": extractor.thresholds(), "tac_dev_labels": len(dev_files),
         "tac_dev": tac_dev(extractor, dev_files, train_files), "assertion_on_gold": assertion_on_gold(dev_files)}
    r["phee_test"], r["phee_test_model"], r["phee_test_evaluations"], r["phee_test_commit"] = phee_test(
        extractor, previous, args.rescore_test)
    r["phee_dev"] = phee_effects(extractor, "dev")  # this run's code on dev, beside a test row scored earlier
    r["phee_dev_joined"] = phee_effects(extractor, "dev", JOINED)
    r["decision_phee_dev"] = decision_on_phee_dev(extractor)
    if isinstance(manifest.get("decision"), dict):  # the decision head's own choice, from its training record
        r["decision_phee_dev"]["head"] = {k: manifest["decision"].get(k) for k in ("cut", "dev", "seeds", "examples")}
    if args.compare_to is not None:
        r["speed_against"] = {**speed_against(extractor, args.compare_to, dev_files), "command": command(),
                              "measured_on": time.strftime("%Y-%m-%d", time.gmtime())}
    elif previous.get("model") == extractor.revision and previous.get("speed_against"):  # same tensors: still true
        r["speed_against"] = {**previous["speed_against"], "earlier_run": True}
    from linker.link import Linker

    default = Linker.load(args.index) if (args.index / "manifest.json").is_file() else None
    r["coordinations_phee_dev"] = coordinations_on_phee_dev(extractor, default)
    r["capabilities"], cap_lines = capabilities(extractor, args.per_template, args.seed, default)
    r["examples"] = examples(extractor, default, args.index)
    r["wall_seconds"] = round(time.perf_counter() - started)
    report.write(r, render(r, manifest, cap_lines))


def _summary(result: dict) -> dict:
    return {key: value for key, value in result.items() if key != "per_document"}


def _uc(result: dict) -> list[str]:
    m, c = result["use_case_1_mentions_micro_weighted"], result["use_case_2_codes_macro_by_section"]
    values = (m["precision"], m["recall"], m["f1"], c["precision"], c["recall"], c["f1"], result["quality"]["value"])
    return [f"{100 * v:.2f}" for v in values]


def _coordinations(n: dict | None) -> list[str]:
    if not n:
        return []
    return ["## One code per event: coordinated phrases (PHEE dev)", "",
            f"The {n['phrases']:,} gold adverse-event Effect phrases of PHEE dev that coordinate two or more parts "
            "(parted at \"and\", \"or\", commas and semicolons: \"nausea, vomiting and diarrhea\"; "
            "`linker.extract.extractor.coordinated_parts`), against the AdverseEvent spans of `annotate`'s default "
            "style (auto, rules)" + (", with the default index's names" if n["names"] else ", without an index's names")
            + f": **{n['parts_found_pct']}%** of their {n['parts']:,} parts overlap an event span. Of the "
            f"{n['predicted']:,} AdverseEvent spans predicted in all of PHEE dev, {n['predicted_right_pct']}% overlap "
            "a gold adverse-event Effect. Before the `auto` style kept a phrase's coordinated parts that no term "
            "overlaps (`uncovered_parts`), a phrase a term overlapped went whole: 74.0% and 89.1% (linker-ae 2, "
            "the same names).", ""]


def _decision(scores: dict | None) -> list[str]:
    if not scores:
        return []
    return ["## Adverse event, or not? (PHEE dev)", "",
            "Each gold span's class against the class of the spans `extract` returns (style auto, assertion rules), "
            "matched by overlap (`decision_on_phee_dev`). PHEE marks an event negated or speculated per event; the "
            "reader carries the mark to the effects of one-event sentences only, so that class is small. Medical "
            "history: PHEE's Sub-Disorder spans that no gold adverse event overlaps, against the MedicalHistory "
            "spans of the decision head.",
            "", *table(["class", "gold spans", "predicted spans", "P", "R", "F1"],
                       [(c, f"{v['gold']:,}", f"{v['predicted']:,}", v["precision"], v["recall"], v["f1"])
                        for c, v in scores.items() if c in DECISION_CLASSES]), "", *_head_choice(scores.get("head")),
            *_present_before(scores)]


def _head_choice(head: dict | None) -> list[str]:
    if not head:
        return []
    return ["The decision head (`linker.extract.decision`, from the release's training record): learnt on the gold "
            f"spans of PHEE train and the TAC training split {head['examples']['train']}; on those of PHEE dev and "
            f"the TAC development split {head['examples']['dev']}, F1 by class at its cut {head['cut']} (chosen "
            f"there): {head['dev']}; the classes' mean F1 by seed (the first ships): {head['seeds']}.", ""]


def _present_before(scores: dict) -> list[str]:
    if not (n := scores.get(PRESENT_BEFORE)):
        return []
    return [f"**{PRESENT_BEFORE.capitalize()}**, on real text: PHEE annotates the subject's own disorder "
            "(`Sub-Disorder`: \"a patient with sarcoidosis\", \"a history of NMS\", \"protamine allergy\"), "
            "which no tagger head learns and the decision head (`linker.extract.decision`) does, as medical history. "
            f"Of the {n['gold']:,} such spans of PHEE dev that no gold adverse event overlaps, a positive "
            f"adverse-event span overlaps **{n['coded']:,} ({n['coded_pct']}%)**: coded as an event of the drug, "
            "wrongly. The capability suite's `temporal` row (below) asks the same in first-person narrative (\"my "
            "rash started before I began taking X\"), a wording neither PHEE nor TAC holds.", ""]


def _min_score_lines(tac: dict) -> list[str]:
    grid = tac.get("min_score_grid")
    if not grid:
        return []
    first = "/".join(RUNS[0])
    return ["#### Weak links withheld (`--min-score`, chosen here)", "",
            f"The `{first}` run's positive events coded only where the best candidate's tf-idf score reaches the cut "
            "(`Linker(min_score=)`, `linker annotate --min-score`): label PT scores of its rows at each cut, the best "
            f"F1 chosen (**{grid['chosen']}**) and run again through the linker and the ade-xml writer (the row "
            f"`{min_score_key(grid['chosen'])}` above). The choice is made on this development split; "
            "`bench.extract_languages` applies it to the Japanese labels unchanged.", "",
            *table(["min score", "label PT P", "label PT R", "label PT F1"],
                   [(cut, v["precision"], v["recall"], v["f1"]) for cut, v in grid["scores"].items()]), ""]


def _examples(found: dict) -> list[str]:
    if not found.get("texts"):
        return []
    lines = ["## Examples: the docs' texts, annotated", "",
             f"`linker annotate --index {found['index']}` (style auto, assertion rules); every span the tagger "
             "returns, with its decision (`null`: not an adverse event: a drug, a therapeutic effect, an indication, "
             "medical history).",
             ""]
    for item in found["texts"]:
        lines += [f"> {item['text']}", "", *table(
            ["span", "label", "status", "confidence", "code", "name", "link confidence", "decision"],
            [(f"`{s['text']}`", s["label"], s["status"], s["confidence"], s["code"] or "–", s["name"] or "–",
              "–" if s["link_confidence"] is None else s["link_confidence"], s["decision"] or "null")
             for s in item["spans"]] or [("(none)", "", "", "", "", "", "", "")]), ""]
    return lines


def _pt(run: dict) -> list[str]:
    pt = run.get("label_pt")
    return [f"{pt[k]:.2f}" for k in ("precision", "recall", "f1")] if pt else ["–"] * 3


def render(r: dict, manifest: dict, cap_lines: list[str]) -> list[str]:
    t, phee, tac = manifest["training"], r["phee_test"], r["tac_dev"]
    same = r["phee_test_model"] == r["model"]
    keys = [f"{style}/{assertion}" for style, assertion in RUNS]
    cut_keys = [k for k in tac if k.startswith(f"{keys[0]}, --min-score")]
    return [
        f"Model `{r['model']}`, span thresholds per head {r['threshold']} (chosen on PHEE dev and TAC dev). "
        f"PHEE test evaluations so far: **{r['phee_test_evaluations']}**. Wall time {r['wall_seconds']:,} s.", "",
        "## PHEE test: Effect spans", "",
        f"Scored once, with `{r['phee_test_model']}`" + ("" if same else " (the same tagger tensors: the release "
                                                         "was since rewritten with a new card and manifest, then with "
                                                         "the decision head beside them, which this row has not)")
        + (f", at commit {r['phee_test_commit']}." if r.get("phee_test_commit") else ", at a commit not recorded.")
        + " The test row keeps the code of that commit; the PHEE dev row is this run's code, on the development "
        "split.", "",
        *table(["system", "EM_F1", "Token_F1"], [*((n, f"{em:.2f}", f"{tok:.2f}") for n, em, tok in PAPER_ROWS),
                                                 ("**linker-ae** (this release)",
                                                              f"**{phee['EM_F1']:.2f}**", f"**{phee['Token_F1']:.2f}**"),
                                                 ("linker-ae on PHEE dev, this run", f"{r['phee_dev']['EM_F1']:.2f}",
                                                  f"{r['phee_dev']['Token_F1']:.2f}"),
                                                 *([(f"the same, {JOINED} sentences tagged as one text",
                                                     f"{j['EM_F1']:.2f}", f"{j['Token_F1']:.2f}")]
                                                   if (j := r.get("phee_dev_joined")) else [])]), "",
        *([f"*{JOINED} sentences as one text*: PHEE dev's sentences tagged {JOINED} at a time, in their order, "
           "joined by a space, as the sentences of a case narrative reach the tagger, each scored on its own "
           "spans. The tagger learnt from single PHEE sentences and whole drug-label sections: it reads a run of "
           "narrative sentences worse than each alone. Training on runs of PHEE sentences is the fix.", ""]
          if r.get("phee_dev_joined") else []),
        f"{phee['sentences']:,} sentences, {phee['gold_spans']:,} gold Effect spans, {phee['predicted_spans']:,} predicted "
        f"(EM P/R {phee['EM_precision']}/{phee['EM_recall']}, token P/R {phee['Token_precision']}/{phee['Token_recall']}); "
        f"{phee['skipped_annotations']} annotation(s) skipped as their text does not match the .txt. `style=\"phrases\"` "
        "(PHEE's span convention); statuses do not enter this score. Settings differ: the paper scores the arguments of "
        "each gold event trigger; linker-ae finds every Effect span of a sentence (adverse and therapeutic) with no "
        "trigger given. EM_F1: SQuAD-normalised string match per sentence; Token_F1: SQuAD token overlap, "
        "micro-summed (`linker/extract/metrics.py`).", "",
        f"## TAC 2017 development split ({r['tac_dev_labels']} of the 101 training labels, seeded 20%, held out)", "",
        "AdverseReaction mentions (exact: same offsets; a discontinuous gold mention, of which there are "
        f"{tac['discontinuous_gold']}, by the same pieces: with a dictionary, events sharing words across \"and\", "
        "\"or\" or a slash are written as such, `linker.extract.lexicon.elliptic_events`. Relaxed: any overlap). Runs are style/assertion: "
        "`terms` is the head trained on TAC's convention, `auto` (the default) the terms and the phrase head's spans "
        "where no term overlaps them; `rules` (the default) the status head then the NegEx-style cues, `model` the "
        "status head alone. `positive`: positive gold mentions against positive predictions.", "",
        "With the release's dictionary evidence (`lexicon` in its manifest) the tagger reads the closed-world "
        f"dictionary's {tac['dictionary'].get('lexicon_names', 0):,} names below; `lookup/none` is that "
        "dictionary's plain lookup alone (lower case, whole words, longest first, every match positive: "
        "`linker/extract/lexicon.py`), the row the tagger must beat.", "",
        *table(["run", "mentions", "exact P", "exact R", "exact F1", "relaxed P", "relaxed R", "relaxed F1"],
               [(k, f"{n} ({tac[k][n]['exact']['gold']:,} gold, {tac[k][n]['exact']['predicted']:,} predicted)",
                 *(tac[k][n][m][f] for m in ("exact", "relaxed") for f in ("precision", "recall", "f1")))
                for k in keys + [k for k in (LOOKUP_KEY,) if k in tac] for n in ("all", "positive")]), "",
        f"Published, for scale only: {TAC_PUBLISHED}", "",
        "### End to end: ADE Eval use cases (`linker.eval.ade_eval`)", "",
        f"Closed-world MedDRA-format dictionary: {tac['dictionary']['pts']:,} PTs and {tac['dictionary']['llts']:,} LLTs "
        "from the Normalization elements of the training-split labels (not MedDRA: only the terms TAC's annotators "
        "used; codes that occur only in the dev labels cannot be found). tf-idf index, default settings. The ade-xml "
        "writer leaves negated and hypothetical spans out (TAC's rule). The open default dictionary is not measured "
        "here (it holds no MedDRA codes).", "",
        "Label PT F1: each label's set of MedDRA PT ids against the set of its written ade-xml, micro-averaged over "
        "the labels (the TAC 2017 task 4 measure on this split).", "",
        *table(["run", "UC1 P", "UC1 R", "UC1 F", "UC2 P", "UC2 R", "UC2 F", "quality", "label PT P", "label PT R",
                "label PT F1"],
               [*((f"annotate {k}", *_uc(tac[k]["ade_eval"]), *_pt(tac[k])) for k in keys + cut_keys),
                *((f"annotate {k}", *_uc(tac[k]["ade_eval"]), *_pt(tac[k])) for k in (LOOKUP_KEY,) if k in tac),
                ("gold mentions, linked", *_uc(tac["gold_mentions_coded"]), *_pt(tac["gold_mentions_coded"]))]), "",
        *_min_score_lines(tac),
        "### Document labels on a TAC proxy (the NTCIR-17 SM-ADE shape)", "",
        f"No public data exists for that task. Proxy: each of the {r['tac_dev_labels']} dev labels is a document, its "
        f"labels the {PROXY_LABELS} MedDRA PTs most training labels hold; gold from its <Reactions>, predicted from "
        "the written ade-xml (`linker annotate --format labels` writes the same rows for any label list; "
        "`linker eval --dataset doc-labels:GOLD --submission SUB` scores them).", "",
        *table(["run", "exact-match accuracy", "micro P", "micro R", "micro F1", "macro F1"],
               [(name, f"{d['exact_match_accuracy']:.2f}", *(f"{d['micro'][m]:.2f}" for m in ("precision", "recall", "f1")),
                 f"{d['macro_f1']:.2f}") for name, d in (
                    *((f"annotate {k}", tac[k].get("doc_labels")) for k in keys + cut_keys + [LOOKUP_KEY] if k in tac),
                    ("gold mentions, linked", tac["gold_mentions_coded"].get("doc_labels"))) if d]), "",
        "## Throughput (1 torch thread, shared 2-core machine)", "",
        *[f"- annotate {k} on the {r['tac_dev_labels']} dev labels: {tac[k]['throughput']['annotate_seconds']} s, "
          f"{tac[k]['throughput']['docs_per_s']} labels/s, {tac[k]['throughput']['spans_per_s']} spans/s; "
          f"{tac[k]['throughput']['annotate_over_extract']}x the tagging alone "
          f"({tac[k]['throughput']['extract_seconds']} s, every section in one call; annotate is that tagging and "
          "the linking of its events)." for k in keys],
        f"- linking the gold mentions alone (normalize): {tac['normalize_gold_seconds']} s: the tagger is the cost.",
        f"- extract on PHEE test: {phee.get('sentences_per_s')} sentences/s (on the machine of its one scoring).",
        *([f"- against `{v['other']}`, in this process, alternating, median of {v['runs']} runs on {v['sentences']} "
           f"PHEE dev sentences, 1 thread, load average {[round(x, 2) for x in v['load_average_before']]}: "
           f"{v['this_per_s']} against {v['other_per_s']} sentences/s, **{v['ratio']}x** its speed"
           + (f"; every section of the {v['labels']} TAC dev labels, one call a label, the default style: "
              f"{v['this_labels_per_s']} against {v['other_labels_per_s']} labels/s, **{v['labels_ratio']}x**"
              if "labels" in v else "")
           + (" (an earlier run of this report, on the same release)." if v.get("earlier_run") else ".")]
          if (v := r.get("speed_against")) else []), "",
        "## Assertion rules on gold spans (dev data, no tagger)", "",
        f"Cues version {r['assertion_on_gold']['cues_version']} (`linker/data/assertion/cues.tsv`): the gold status "
        "of every gold event span -> the status the rules give it. TAC marks hypothetical only a reaction of a drug "
        "class or of animals, which no cue can tell; PHEE's statuses come from one-event sentences only.", "",
        *table(["data", "gold -> rules: spans"], [(name, ", ".join(f"{k}: {v:,}" for k, v in pairs.items()))
                                                 for name, pairs in r["assertion_on_gold"].items()
                                                 if isinstance(pairs, dict)]), "",
        *_decision(r.get("decision_phee_dev")),
        *_coordinations(r.get("coordinations_phee_dev")),
        "## Capabilities (after MacPhail et al., templates)", "", *cap_lines, "",
        *_examples(r.get("examples", {})),
        "## Training (from the release manifest)", "",
        f"`{t['command']}`: {t['windows']:,} windows, {t['wall_seconds']:,} s wall, {t['cpu_seconds']:,} s CPU, "
        f"{t['torch_threads']} thread(s), load average {t['load_average']}; epoch chosen "
        f"{manifest['metrics']['chosen_epoch']}." + (f" Decoding then chosen again on the same dev data: "
                                                     f"`{t['tuned']['command']}`." if t.get("tuned") else ""),
    ]


if __name__ == "__main__":
    main()
