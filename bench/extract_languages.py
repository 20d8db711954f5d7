"""Adverse events beyond English (issue 48): eval/extract/languages.md and languages.json.

    python -m bench.extract_languages [--english linker-ae] [--multi linker-ae-multi] [--limit N]

The English tagger (`linker-ae`) against the multilingual one (`linker-ae-multi`), on open data:
1. per language, span P/R/F1 of the tagger's AdverseEvent and Indication spans against Mantra GSC disorder (DISO)
   mentions (en es fr de nl) and CodiEsp DIAGNOSTICO mentions (es test; its texts: `--codiesp-texts`), beside a
   plain lookup of HPO's names in the language;
2. Japanese drug labels (OnSIDES-ANNOT dev): label-level MedDRA PT-set P/R/F1, spans linked to a closed-world
   dictionary of the PT and LLT names the file gives;
3. the English cost: PHEE dev EM_F1 / Token_F1, TAC 2017 dev exact / relaxed F1;
4. throughput: sentences/s on the same PHEE dev sentences, 1 thread, alternating, median of 3.
A section whose data or tagger is absent is skipped, its reason in the report.

Mantra GSC and CodiEsp are test sets: a run keeps the rows an earlier run scored (languages.json, with the commit that
scored them and how many times) and scores them again only with `--rescore-test`; the Japanese labels, PHEE dev and
TAC dev are development data, scored at every run with the code of the run.
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import os
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import data
from bench.extract import label_pt_scores as label_set_scores  # each label's id set against its gold set, micro
from bench.report import REPO, Report, git_commit, table

# Fixed before any figure was seen: "auto" (the default of `extract`) gives the term head's spans (TAC's short
# concept terms, the convention of Mantra's and CodiEsp's concept mentions) and the phrase head's where no term was
# found (narrative text, which the label-trained term head mostly misses).
STYLE = "auto"
MANTRA_LANGS = {"English": "en", "Spanish": "es", "French": "fr", "German": "de", "Dutch": "nl"}
DISO = "DISO"
THROUGHPUT_SENTENCES = 200


@dataclass
class GoldDoc:
    id: str
    lang: str
    text: str
    mentions: list[tuple[tuple[int, int], ...]]  # each gold mention as its (start, end) pieces


# ---- scoring helpers -------------------------------------------------------------------------------------------


def span_scores(docs: list[GoldDoc], predicted: list[list[tuple[int, int]]]) -> dict:
    """Exact (same offsets; a discontinuous gold mention is missed) and relaxed (any overlap) P/R/F1, micro."""
    from linker.extract.metrics import mention_scores

    return mention_scores([d.mentions for d in docs], predicted)


# ---- readers ---------------------------------------------------------------------------------------------------


def note_groups(note: str) -> set[str]:
    """The semantic groups of a Mantra AnnotatorNotes value ``"CUI", "name", "type", "GROUP"``: the fields after
    the name (a few notes swap type and group), each split at ``|``."""
    fields = re.findall(r'"([^"]*)"', note)
    return {g.strip() for f in fields[2:] for g in f.split("|")}


def mantra_docs(path: Path, group: str = DISO) -> list[GoldDoc]:
    """Every Mantra unit, its language from its folder, with the mentions whose semantic group is `group` (in
    the AnnotatorNotes, or the entity type)."""
    from linker.formats.brat import brat_sources, read_source

    docs = []
    for source in brat_sources(path):
        doc = read_source(source, lenient=True)
        parts = str(doc.path).replace("\\", "/").split("/")
        lang = next((MANTRA_LANGS[p] for p in parts if p in MANTRA_LANGS), None)
        if lang is None or not doc.text:
            continue
        keep = [tuple(e.spans) for e in doc.entities
                if e.type == group or group in note_groups(doc.notes.get(e.tid, ""))]
        docs.append(GoldDoc("/".join(parts[-3:]), lang, doc.text, keep))
    return docs


def codiesp_docs(tsv: Path, texts: Path) -> list[GoldDoc]:
    """The DIAGNOSTICO mentions of a CodiEsp ``*X.tsv`` over the texts ``<texts>/<doc>.txt``."""
    from linker.formats.codiesp import read_codiesp

    mentions: dict[str, list] = {}
    for row in read_codiesp(tsv):
        mentions.setdefault(row.doc, [])
        if row.label == "DIAGNOSTICO":
            pieces = tuple(tuple(map(int, p.split())) for p in row.offsets.split(";"))
            mentions[row.doc].append(pieces)
    return [GoldDoc(doc, "es", (texts / f"{doc}.txt").read_text(encoding="utf-8"), found)
            for doc, found in sorted(mentions.items())]


def hpo_names(lang: str) -> list[str]:
    """HPO's names in `lang`: for en the names and EXACT synonyms of hp.obo, else every ``translation_value`` of
    ``hp-<lang>.babelon.tsv`` in that language; not those of the terms that name no event (Left, Mild:
    `linker.extract.lexicon.non_event_ids`, as `annotate` leaves them out of an index's names)."""
    from linker.extract.lexicon import non_event_ids

    hpo, skip = data.get("hpo"), non_event_ids()
    if lang == "en":
        path = hpo.path("obo")
        text = (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")).read()
        names = []
        for stanza in text.split("\n[")[1:]:
            term = re.search(r"^id: (\S+)", stanza, re.M)
            if stanza.startswith("Term]") and term and term.group(1) not in skip:
                names += re.findall(r"^name: (.+)$", stanza, re.M) + re.findall(r'^synonym: "(.+)" EXACT', stanza, re.M)
        return names
    files = [p for p in hpo.paths("babelon") if p.name == f"hp-{lang}.babelon.tsv"]
    if not files:
        return []
    lines = files[0].read_text(encoding="utf-8").splitlines()
    head = lines[0].split("\t")
    value, language, subject = (head.index(c) for c in ("translation_value", "translation_language", "subject_id"))
    return [cells[value] for cells in (line.split("\t") for line in lines[1:])
            if len(cells) > value and cells[language] == lang and cells[value].strip() and cells[subject] not in skip]


def html_text(markup: str) -> str:
    """A PMDA section's HTML as plain text: a table row or block a line, its cells joined by a space."""
    text = re.sub(r"(?i)</td>|</th>", " ", markup)
    text = re.sub(r"(?i)<br\s*/?>|</tr>|</p>|</div>|</li>", "\n", text)
    text = html.unescape(re.sub(r"<[^>]+>", "", text)).replace("\xa0", " ")
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


def pt_ids(value) -> list[str]:
    """The PT ids of an event's PT field: NaN (none), ``10020751.0``, or several, ``"10033557, 10043071"``."""
    if value is None or (isinstance(value, float) and value != value):
        return []
    return [str(int(float(v))) for v in str(value).split(",") if v.strip()]


def onsides_labels(path: Path) -> tuple[dict[str, str], dict[str, set[str]], dict[str, set[str]], dict]:
    """(text, gold PT ids) by label, the closed-world names (each PT and LLT name the file gives -> PT ids), and
    the annotated terms by label."""
    items = json.loads(path.read_text(encoding="utf-8"))  # NaN is read as float nan
    texts, gold, names, terms = {}, {}, {}, {}
    for item in items:
        key = f"{item['label_id']}#{item['section_name']}"
        texts[key], gold[key] = html_text(item["section_text"]), set()
        terms[key] = [e[0] for e in item["adverse_events"] if isinstance(e[0], str) and e[0].strip()]
        for _term, pt_name, pt, llt_name, *_ in item["adverse_events"]:
            codes = pt_ids(pt)
            gold[key].update(codes)
            for name in (pt_name, llt_name):
                if not isinstance(name, str) or not name.strip() or not codes:
                    continue
                parts = [n.strip() for n in name.split(",")]  # several PTs: their names, comma-separated
                pairs = zip(parts, codes) if len(codes) > 1 and len(parts) == len(codes) else \
                    ((name.strip(), c) for c in codes)
                for part, code in pairs:
                    names.setdefault(part, set()).add(code)
    return texts, gold, names, terms


# ---- runs ------------------------------------------------------------------------------------------------------


def tagger_spans(extractor, texts: list[str], lexicon=None, lang: str | None = None) -> list[list[tuple]]:
    """The AdverseEvent and Indication spans (any status) of each text, a discontinuous one as its pieces:
    `Extractor.extract`, what `extract` runs, with `lexicon`'s names as evidence when given (what `annotate` runs)."""
    from linker.extract import AE, INDICATION

    spans = extractor.extract(texts, labels=(AE, INDICATION), style=STYLE, lexicon=lexicon, langs=[lang] * len(texts))
    return [[s.pieces or (s.start, s.end) for s in doc] for doc in spans]


def span_rows(docs: list[GoldDoc], taggers: dict, lexicons: dict) -> dict:
    """Per language: the gold counts, each tagger's and the lookup's span scores."""
    out = {}
    for lang in sorted({d.lang for d in docs}, key=list(MANTRA_LANGS.values()).index):
        part = [d for d in docs if d.lang == lang]
        row = {"units": len(part), "gold": sum(len(d.mentions) for d in part),
               "discontinuous_gold": sum(1 for d in part for m in d.mentions if len(m) > 1)}
        for name, extractor in taggers.items():
            for system, lexicon in ((name, None), (f"{name} + names", lexicons.get(lang))):
                if system != name and lexicon is None:
                    continue
                t0 = time.perf_counter()
                row[system] = span_scores(part, tagger_spans(extractor, [d.text for d in part], lexicon, lang))
                row[system]["seconds"] = round(time.perf_counter() - t0, 1)
        if lexicons.get(lang) is not None:
            row["lookup"] = span_scores(part, [lexicons[lang].find(d.text) for d in part])
            row["lookup"]["names"] = len(lexicons[lang])
        out[lang] = row
    return out


def japanese(taggers: dict, path: Path, limit: int | None) -> dict:
    """Label-level PT-set scores of each tagger (positive AdverseEvent spans -> exact name match, else the
    closed-world tf-idf index), of the plain lookup of the names, and of the gold terms linked the same way."""
    from linker.dictionary import SourceSpec
    from linker.extract import AE, Lexicon
    from linker.index import build_index
    from linker.index.tfidf_config import get_preset
    from linker.link import Linker
    from linker.text import normalize

    texts, gold, names, terms = onsides_labels(path)
    keys = sorted(texts)[:limit]
    gold = {k: gold[k] for k in keys}
    by_key = {}
    for name, codes in names.items():
        by_key.setdefault(normalize(name, "words"), set()).update(codes)
    out = {"labels": len(keys), "gold_pts": sum(map(len, gold.values())), "names": len(names),
           "pts": len({c for codes in names.values() for c in codes})}
    with tempfile.TemporaryDirectory(prefix="bench-languages-") as tmp:
        tsv = Path(tmp) / "names.tsv"
        tsv.write_text("".join(f"{code}\t{name}\t{'en' if name.isascii() else 'ja'}\n"
                               for name, codes in sorted(names.items()) for code in sorted(codes)), encoding="utf-8")
        table_path = data.dictionary(Path(tmp) / "names.parquet", [SourceSpec("tsv", (tsv,))])
        build_index(table_path, kind="tfidf", out=Path(tmp) / "index", config=get_preset("medical-crossing"))
        linker = Linker.load(Path(tmp) / "index")

        def link(mentions: list[str], via: Linker = linker) -> list[set[str]]:
            found = [by_key.get(normalize(m, "words")) for m in mentions]
            missing = [i for i, f in enumerate(found) if f is None and mentions[i].strip()]
            results = via.link([mentions[i] for i in missing], k=1) if missing else []
            for i, result in zip(missing, results):
                found[i] = set() if result.nil else {result.candidates[0].concept_id}
            return [f or set() for f in found]

        lexicon = Lexicon(names)
        # each tagger alone, then as `linker annotate` runs it: the names of the dictionary it codes with as
        # evidence (`Extractor.extract(lexicon=)`); both with the Japanese assertion cues
        # and with the weak links withheld at the cut chosen on the TAC dev split (`bench.extract`), unchanged
        cut = tac_min_score()
        withheld = None if cut is None else Linker(linker.index, min_score=cut)
        if cut is not None:
            out["min_score"] = cut
        for name, extractor in taggers.items():
            for row, evidence in ((name, None), (f"{name} + names", lexicon)):
                t0 = time.perf_counter()
                spans = extractor.extract([texts[k] for k in keys], labels=(AE,), style=STYLE, lexicon=evidence,
                                          langs=["ja"] * len(keys))
                mentions = [[" ".join(s.text.split()) for s in doc if s.status == "positive"] for doc in spans]
                found = {k: set().union(*link(m)) for k, m in zip(keys, mentions)}
                out[row] = label_set_scores(gold, found) | {"spans": sum(map(len, mentions)),
                                                            "seconds": round(time.perf_counter() - t0, 1)}
                if evidence is not None and withheld is not None:
                    found = {k: set().union(*link(m, withheld)) for k, m in zip(keys, mentions)}
                    out[f"{row}, --min-score"] = label_set_scores(gold, found) | {"spans": out[row]["spans"]}
        hits = {k: lexicon.find(texts[k]) for k in keys}
        found = {k: set().union(*(by_key.get(normalize(texts[k][a:b], "words"), set()) for a, b in spans))
                 for k, spans in hits.items()}
        out["lookup"] = label_set_scores(gold, found) | {"spans": sum(map(len, hits.values()))}
        out["gold_terms"] = label_set_scores(gold, {k: set().union(*link(terms[k])) for k in keys})
    return out


def keeps_test_rows(previous: dict, rescore: bool, limit: int | None) -> bool:
    """Whether a run keeps the Mantra and CodiEsp (test) rows of the `previous` report: it has them, from a whole run
    (no `--limit`), and this run is whole too and was not asked to score them again."""
    return bool(previous.get("mantra")) and not rescore and not limit and not previous.get("limit")


def tac_min_score() -> float | None:
    """The `--min-score` that `bench.extract` chose on the TAC dev split (eval/extract/report.json), None before
    it ran."""
    report = REPO / "eval" / "extract" / "report.json"
    if not report.is_file():
        return None
    return ((json.loads(report.read_text(encoding="utf-8")).get("tac_dev") or {}).get("min_score_grid") or {}).get(
        "chosen")


def english_cost(taggers: dict, dev_stems: list[str], limit: int | None) -> dict:
    """PHEE dev Effect EM/Token F1 (style phrases, AdverseEvent and TherapeuticEffect spans) and TAC dev
    AdverseReaction exact/relaxed F1 (style terms, any status) of each tagger, no dictionary names as evidence."""
    from linker.extract import AE
    from linker.extract.data import read_phee, read_tac_files
    from linker.extract.metrics import mention_scores
    from linker.extract.train import effect_scores

    phee = read_phee(data.get("phee").path("dev"))[:limit]
    tac = read_tac_files([data.get("tac2017").path("train") / f"{s}.xml" for s in dev_stems[:limit]])
    out = {"phee_sentences": len(phee), "tac_labels": len(dev_stems[:limit]), "tac_sections": len(tac)}
    for name, extractor in taggers.items():
        scores = effect_scores(phee, extractor.extract([d.text for d in phee], style="phrases"))
        terms = extractor.extract([d.text for d in tac], style="terms") if tac else []
        found = [[(s.start, s.end) for s in doc if s.label == AE] for doc in terms]
        out[name] = {"phee_dev": scores, "tac_dev": mention_scores([[g[0] for g in d.groups] for d in tac], found)}
    return out


def throughput(taggers: dict, sentences: int, runs: int = 3) -> dict:
    """Sentences/s of each tagger on the same first PHEE dev sentences, alternating, the median of `runs`."""
    from linker.extract.data import read_phee

    texts = [d.text for d in read_phee(data.get("phee").path("dev"))][:sentences]
    times: dict[str, list[float]] = {name: [] for name in taggers}
    load = [round(x, 2) for x in os.getloadavg()]
    for _ in range(runs):
        for name, extractor in taggers.items():
            t0 = time.perf_counter()
            extractor.extract(texts, style="phrases")
            times[name].append(time.perf_counter() - t0)
    out = {"sentences": len(texts), "runs": runs, "load_average_before": load,
           **{name: round(len(texts) / statistics.median(t), 1) for name, t in times.items()}}
    if len(taggers) == 2:
        english, multi = list(taggers)
        out["multi_over_english"] = round(out[multi] / out[english], 3)
    return out


# ---- main and report -------------------------------------------------------------------------------------------


def load_tagger(name_or_folder: str):
    """(extractor, facts) or (None, why not)."""
    from linker.extract import load_extractor
    from linker.extract.extractor import release_path
    from linker.models import read_release

    folder = release_path(name_or_folder)
    if not (folder / "manifest.json").is_file():
        return None, f"`{_shown(folder)}` not found"
    release = read_release(folder)
    extractor = load_extractor(folder, threads=1)
    return extractor, {"folder": _shown(folder), "revision": extractor.revision, "base": release.base,
                       "weights_sha256": release.manifest["files"]["weights.safetensors"]["sha256"],
                       "tac_dev_labels": (release.manifest.get("training") or {}).get("tac_dev_labels") or [],
                       "recorded_dev": {k: v for k, v in (release.manifest.get("metrics") or {}).items()
                                        if k in ("phee_dev", "tac_dev")}}


def _shown(path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--english", default="linker-ae", help="English tagger: release name or folder.")
    parser.add_argument("--multi", default="linker-ae-multi", help="Multilingual tagger: release name or folder.")
    parser.add_argument("--codiesp-texts", type=Path, default=None,
                        help="Folder of the CodiEsp test texts (<doc>.txt); not in ../shared/data.")
    parser.add_argument("--limit", type=int, default=None, help="At most N units per language, labels, sentences.")
    parser.add_argument("--out", type=Path, default=REPO / "eval" / "extract")
    parser.add_argument("--rescore-test", action="store_true",
                        help="Score Mantra GSC and CodiEsp (test sets) again; by default the last run's rows are kept.")
    args = parser.parse_args()
    previous_path = args.out / "languages.json"
    previous = json.loads(previous_path.read_text(encoding="utf-8")) if previous_path.is_file() else {}
    import torch

    torch.set_num_threads(1)
    report = Report("languages", out=args.out, title="Adverse events beyond English: linker-ae against linker-ae-multi")
    started = time.perf_counter()
    taggers, r = {}, {"style": STYLE, "limit": args.limit, "taggers": {}, "skipped": {}}
    for role, name in (("english", args.english), ("multi", args.multi)):
        extractor, facts = load_tagger(name)
        if extractor is None:
            r["skipped"][role] = facts
        else:
            taggers[role], r["taggers"][role] = extractor, facts
    lexicons = {}
    if not data.skip_reason("hpo"):
        from linker.extract import Lexicon

        lexicons = {lang: Lexicon(names, source=f"hpo:{lang}") for lang in MANTRA_LANGS.values()
                    if (names := hpo_names(lang))}
        r["lookup_names"] = {lang: len(lexicon) for lang, lexicon in lexicons.items()}
    keep = keeps_test_rows(previous, args.rescore_test, args.limit)
    r["test_evaluations"] = previous.get("test_evaluations", 1 if previous.get("mantra") else 0)
    skipped = {"lookup": data.skip_reason("hpo"), "mantra": data.skip_reason("mantra")}
    if keep:  # the test rows of the run that scored them, not the code of this one
        print(f"Mantra GSC test already scored {r['test_evaluations']} time(s): kept (--rescore-test scores again)")
        r["mantra"], r["test_commit"] = previous["mantra"], previous.get("test_commit", previous.get("commit"))
        if previous.get("codiesp"):
            r["codiesp"] = previous["codiesp"]
        else:
            skipped["codiesp"] = (previous.get("skipped") or {}).get("codiesp") or "not scored by the kept run"
    else:
        if not data.skip_reason("mantra"):
            docs = mantra_docs(data.get("mantra").path("test"))
            docs = [d for lang in MANTRA_LANGS.values() for d in [x for x in docs if x.lang == lang][:args.limit]]
            r["mantra"] = span_rows(docs, taggers, lexicons)
            if not args.limit:
                r["test_evaluations"] += 1
                r["test_commit"] = git_commit()
        if not (why := data.skip_reason("codiesp")) and args.codiesp_texts and args.codiesp_texts.is_dir():
            docs = codiesp_docs(data.get("codiesp").path("test"), args.codiesp_texts)[:args.limit]
            r["codiesp"] = span_rows(docs, taggers, {"es": lexicons.get("es")})
        else:
            skipped["codiesp"] = why or ("the CodiEsp test texts are not in ../shared/data (only the *X.tsv "
                                         "annotations are): pass --codiesp-texts FOLDER")
    if (jp := data.root() / "onsides_jp" / "jp-annot-dev.json").is_file():
        r["japanese"] = japanese(taggers, jp, args.limit)
    else:
        skipped["japanese"] = "../shared/data/onsides_jp/jp-annot-dev.json absent"
    if not (why := data.skip_reason("phee", "tac2017")) and taggers:
        stems = [f["tac_dev_labels"] for f in r["taggers"].values()]  # the labels every release held out
        r["english_cost"] = english_cost(taggers, [s for s in stems[0] if all(s in o for o in stems[1:])], args.limit)
        r["throughput"] = throughput(taggers, min(THROUGHPUT_SENTENCES, args.limit or THROUGHPUT_SENTENCES))
    else:
        skipped["english"] = why or "no tagger loaded"
    r["skipped"].update({k: v for k, v in skipped.items() if v})
    r["wall_seconds"] = round(time.perf_counter() - started)
    report.write(r, render(r))


def _prf(s: dict | None) -> list[str]:
    return [f"{s[k]:.2f}" for k in ("precision", "recall", "f1")] if s else ["–"] * 3


def _span_table(rows: dict, systems: list[str]) -> list[str]:
    return table(["lang", "units", "gold", "system", "predicted", "exact P", "exact R", "exact F1", "relaxed P",
                  "relaxed R", "relaxed F1"],
                 [(lang, row["units"], row["gold"], name, row[name]["exact"]["predicted"],
                   *_prf(row[name]["exact"]), *_prf(row[name]["relaxed"]))
                  for lang, row in rows.items() for name in systems if name in row])


def _cost_rows(name: str, run: dict, recorded: dict | None, tac: int) -> list[tuple]:
    rows = [(name, run["phee_dev"]["EM_F1"], run["phee_dev"]["Token_F1"],
             *((run["tac_dev"][m]["f1"] for m in ("exact", "relaxed")) if tac else "––"))]
    if recorded and {"phee_dev", "tac_dev"} <= set(recorded):
        rows.append((f"{name} (recorded)", recorded["phee_dev"]["EM_F1"], recorded["phee_dev"]["Token_F1"],
                     recorded["tac_dev"]["exact"]["f1"], recorded["tac_dev"]["relaxed"]["f1"]))
    return rows


def render(r: dict) -> list[str]:
    t = r["taggers"]
    systems = [*(x for n in t for x in (n, f"{n} + names")), "lookup"]
    lines = [f"Wall time {r['wall_seconds']:,} s, 1 torch thread." + (f" **Slice: `--limit {r['limit']}`** (at most "
             f"that many units per language, labels, sentences): a smoke run, not the figures." if r["limit"] else ""),
             "", *table(["role", "tagger", "folder", "base", "weights sha256"],
                        [(role, f["revision"].split(" ")[0], f"`{f['folder']}`", f["base"],
                          f["weights_sha256"][:16] + "…") for role, f in t.items()]), ""]
    lines += [f"- skipped {k}: {v}" for k, v in r["skipped"].items()] + [""]
    lines += ["## Find the medical problem: Mantra GSC disorders, per language", "",
              f"Gold: the Mantra GSC mentions whose semantic group (AnnotatorNotes) is {DISO}. Predicted: the tagger's "
              f"AdverseEvent and Indication spans, any status, `style=\"{STYLE}\"` (fixed before any figure: the term "
              "head's short concept terms, Mantra's convention, and the phrase head's spans where no term was found), "
              "no dictionary names as evidence; `+ names`: the lookup's names as evidence, as `linker annotate` gives "
              "its index's. `lookup`: `linker.extract.lexicon.Lexicon` (lower case, whole words, "
              "longest first) over HPO 2025-01-16's names in the language: en the names and EXACT synonyms of "
              "hp.obo, es/fr/de/nl every translation of `hp-<lang>.babelon.tsv` (es, fr official; de, nl "
              "candidate, machine-translated); normalised names kept: "
              + ", ".join(f"{k} {v:,}" for k, v in r.get("lookup_names", {}).items())
              + ". HPO holds phenotypes, not every disorder: a floor, not a rival dictionary. Exact: same offsets (a "
              "discontinuous gold mention counts as missed); relaxed: any overlap; micro over mentions.", ""]
    if r.get("test_commit"):
        lines += [f"Scored at commit {r['test_commit']}; the test set has been scored {r.get('test_evaluations', 1)} "
                  "time(s) by this report. A later run keeps these rows (`--rescore-test` scores again): they hold "
                  "the code of that commit, the sections below the code of this run.", ""]
    lines += _span_table(r["mantra"], systems) if r.get("mantra") else ["(skipped)"]
    lines += ["", "## Find the medical problem: CodiEsp DIAGNOSTICO (es, test)", ""]
    lines += _span_table(r["codiesp"], systems) if r.get("codiesp") else [f"Skipped: {r['skipped'].get('codiesp')}"]
    j = r.get("japanese")
    lines += ["", "## Japanese drug labels (OnSIDES-ANNOT development, PT sets)", ""]
    if j:
        lines += [f"{j['labels']} labels (section 11 HTML, tags stripped: a table row a line), {j['gold_pts']:,} gold "
                  f"(label, PT) pairs. Closed-world dictionary: the {j['names']:,} PT and LLT names the file itself "
                  f"gives, mapped to their {j['pts']:,} PT ids (Japanese, some English). It is built from these same "
                  "labels' annotations: every gold PT has a name in it, and an LLT name is often the term as written, "
                  "so these rows are optimistic. Tagger rows: positive AdverseEvent spans (`style=\"auto\"`, the "
                  "Japanese assertion cues), alone and `+ names` (the dictionary's names as evidence, as `linker "
                  "annotate` gives its index's; a table row's span is then parted at its cells from the first that "
                  "holds a name, `linker.extract.lexicon.table_cells`, and a span holding one name is that name, "
                  "`split_phrases`: rules chosen on these labels, docs/extract.md), each "
                  "linked by exact normalised name, else by a tf-idf index of those names (character 1-2-grams, "
                  "`medical-crossing` preset) top-1; the label's PT set is the union. `lookup`: the names found in the "
                  "text by `Lexicon` (Japanese character by character: a name is found inside a longer run), each "
                  "mapped to its PT ids. `gold terms, linked`: the annotated terms through the same linking (what it makes of perfect "
                  "spans)."
                  + (f" `, --min-score`: the same spans, a tf-idf link kept only where its score reaches "
                     f"{j['min_score']}, the cut `bench.extract` chose on the TAC 2017 development split (its report), "
                     "applied here unchanged; exact names are always kept." if "min_score" in j else ""), "",
                  *table(["system", "spans", "P", "R", "F1"],
                         [(n.replace("gold_terms", "gold terms, linked").replace("--min-score",
                                                                                 f"--min-score {j.get('min_score')}"),
                           j[n].get("spans", "–"), *_prf(j[n]))
                          for n in (*(x for n in t for x in (n, f"{n} + names", f"{n} + names, --min-score")),
                                    "lookup", "gold_terms")
                          if n in j])]
    else:
        lines += [f"Skipped: {r['skipped'].get('japanese')}"]
    c = r.get("english_cost")
    lines += ["", "## The English cost (dev data only)", ""]
    if c:
        lines += [f"PHEE dev ({c['phee_sentences']:,} sentences; `style=\"phrases\"`, AdverseEvent and "
                  f"TherapeuticEffect spans) and TAC 2017 dev ({c['tac_labels']} labels both releases hold out, "
                  f"{c['tac_sections']} sections; `style=\"terms\"`, any status). No dictionary names as evidence: "
                  "not comparable with `eval/extract/report.md`'s TAC runs, which read the closed-world names.", "",
                  *table(["tagger", "PHEE EM_F1", "PHEE Token_F1", "TAC exact F1", "TAC relaxed F1"],
                         [row for n in t for row in _cost_rows(n, c[n], t[n].get("recorded_dev"), c["tac_labels"])]),
                  "", "`(recorded)`: the dev scores its manifest records from training (its dev data, the decoding "
                  "chosen there): a check that this run reads the release as its training did."]
        v = r["throughput"]
        lines += ["", "## Throughput", "",
                  f"The first {v['sentences']} PHEE dev sentences, `style=\"phrases\"`, 1 thread, in one process, "
                  f"alternating, median of {v['runs']}; load average before {v['load_average_before']} (a shared "
                  "2-core machine).", "", *table(["tagger", "sentences/s"], [(n, v[n]) for n in t])]
        if "multi_over_english" in v:
            lines += ["", f"multi / english: **{v['multi_over_english']}x**"]
    else:
        lines += [f"Skipped: {r['skipped'].get('english')}"]
    return lines


if __name__ == "__main__":
    main()
