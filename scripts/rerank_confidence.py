"""Re-ranking, calibrated confidence and "no link" on real data, CPU only: NCBI-disease, Cantemist, CodiEsp-D.

    .venv/bin/python scripts/rerank_confidence.py [--data ../shared/data] [--out eval] [--work indexes/rr]
        [--models models] [--datasets ncbi,cantemist,codiesp,ncbi-biosyn] [--rerank-k 16] [--train-seconds 5100]
        [--max-queries 1500] [--negatives 5] [--epochs 3] [--lr 3e-5] [--threads 1] [--rebuild]
        [--biosyn-model models/ncbi-biosyn-minilm-biosyn] [--codiesp-model models/codiesp-e5-biosyn-all] [--heldin-only]

For each dataset: a tf-idf retriever over the dictionary plus the training mentions (as in
eval/ncbi_biosyn/ncbi_biosyn.md and eval/accuracy/cantemist_tfidf_train.md; character uni+bigrams, the parameters these
reports were measured with, pinned here since the library's default became char_wb trigrams), then

1. a cross-encoder re-ranker (`train_rerank`) trained on the dictionary's synonyms and the
   training mentions, hard negatives from tf-idf, stopped at a CPU time budget
   (``--train-seconds``), minilm for English, e5-small for Spanish;
2. two copies of the index, the retriever alone and the retriever with the re-ranker bound,
   each calibrated (`calibrate`, isotonic) on held-in mentions that are not in its dictionary:
   the dev split (NCBI ``NCBIdevelopset``, Cantemist ``dev1``, CodiEsp ``devX``); for the
   re-ranker, the same held-in set chooses the mix of its logit and the retriever's score
   (``retriever_weight``, recorded in the index manifest's calibration entry);
3. on NCBI, the "no link" threshold is chosen on the held-in set too: `evaluate` on the dev split
   with 20% of *its* gold concepts removed, the confidence threshold with the best "no link" F1 there;
4. `evaluate` on the test set, Full and Filtered0.2 (training-mention filter): Acc@1/Acc@5 of the
   retriever's order and of the re-ranked order from the same call, re-rank latency per
   mention, ECE before/after calibration, Acc@1 of the 90% most confident; on NCBI also "no
   link" F1 with 20% of the test set's gold concepts removed from the dictionary, at the held-in
   threshold (the test set's own best threshold is reported beside it, labelled oracle).

Torch runs one thread by default: on the shared 2-core machine (load 13 to 20) a MiniLM training
step took ~6 s with one thread and ~40 s with two (threads wait for each other's time slices).

NCBI follows BioSyn's query preprocessing (``#biosyn&typos=…``) and scores with BioSyn's rule
for composites (``any``), but its dictionary is MEDIC + *train* mentions only: the dev
mentions are the held-in calibration set and must not be dictionary names.
``ncbi-biosyn`` is "ncbi" with the BioSyn-trained dense retriever (``--biosyn-model``, from
scripts/ncbi_biosyn.py) instead of tf-idf and the "ncbi" re-ranker (trained first by ``--datasets ncbi``):
the issue's full system. Its encoder was trained on train+dev, so the held-in choices may be biased;
the test Acc@1 of every mix weight is reported beside them as a diagnostic.
``ncbi-biosyn-mined`` is "ncbi-biosyn" with its own re-ranker, whose hard negatives are mined by the BioSyn dense
retriever (`RerankConfig.mine_index`: a dense index of the training dictionary with that encoder).
``ncbi-sapall-mined`` puts that re-ranker above the sap + BioSyn retriever (``--biosyn-model``
models/ncbi-biosyn-minilm-sap-all-biosyn, from ``scripts/ncbi_biosyn.py --sap-pairs all``).
``cantemist-mined`` (and ``codiesp-mined``) is "cantemist" with the re-ranker's hard negatives mined by the
retriever's own tf-idf parameters (`RerankConfig.mining`). ``codiesp-biosyn`` puts the "codiesp-mined" re-ranker
above the e5-small retriever that BioSyn trained on all CodiEsp-D train mentions (``--codiesp-model``);
``codiesp-biosyn-mined`` gives it its own re-ranker, negatives mined by that retriever.
``cantemist-mined-e3`` trains the "cantemist-mined" recipe for three epochs, ``cantemist-mined-sapinit`` (and
``codiesp-mined-sapinit``) from the full-size sap + BioSyn bi-encoder instead of e5-small; ``ncbi-sapinit`` is
"ncbi" from MiniLM after sap on MEDIC (``ncbi-sapall-sapinit``: that re-ranker above the sap + BioSyn retriever of
``--biosyn-model``), ``ncbi-sapbiosyninit`` from MiniLM after sap and BioSyn on the train mentions alone.
``cantemist-sapbiosyn`` puts the "cantemist-mined" re-ranker above the full-size sap + BioSyn retriever
(models/cantemist-e5-sap-biosyn-all from scripts/train_multilingual.py), ``cantemist-sapbiosyn-sapinit`` the
"cantemist-mined-sapinit" one, ``cantemist-sapbiosyn-sapinit-mined`` one from the same start with negatives mined
by that dense retriever; ``codiesp-sapbiosyn-sapinit`` the same for CodiEsp-D.
``--heldin-only`` stops after the held-in calibration, so that two recipes are compared on dev, never on test
(the calibration is kept beside the index and reused by the full run).
Stages are skipped when their output exists (unless --rebuild). Writes eval/rerank/rerank_confidence.{md,json}
and one report per (dataset, system) (eval/rerank/rr_*.md/json/png, *.coverage.png).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from eval_all import mention_names, table  # noqa: E402  (the dictionaries eval_all.py builds)
from stages import index_current  # noqa: E402

from linker.dictionary import SourceSpec  # noqa: E402
from linker.eval.calibrate import MIX_SMOOTHING, RETRIEVER_WEIGHTS, calibrate  # noqa: E402
from linker.eval.report import evaluate  # noqa: E402
from linker.fileio import atomic_file, portable_paths  # noqa: E402
from linker.index import build_index  # noqa: E402
from linker.index.dense import DenseConfig  # noqa: E402
from linker.index.tfidf import TfidfConfig, get_preset  # noqa: E402
from linker.text import icd10cm_code  # noqa: E402
from linker.train.rerank import RerankConfig, train_rerank  # noqa: E402

log = logging.getLogger("rerank_confidence")


def datasets(data: Path, work: Path, rebuild: bool) -> dict[str, dict]:
    """Per dataset: dictionary for the index, dictionary + labelled specs for training, held-in, test, options."""
    ncbi, cantemist, codiesp = data / "ncbi_disease", data / "cantemist", data / "codiesp"
    prep = f"#biosyn&typos={ncbi / 'ncbi-spell-check.txt'}"
    out: dict[str, dict] = {}
    n_train = f"pubtator:{ncbi / 'NCBItrainset_corpus.txt'}{prep}"

    def ncbi_dicts() -> tuple[Path, Path]:
        medic = table(work / "medic.parquet", [SourceSpec("tsv", (ncbi / "medic_06Jul2012.txt",))], rebuild=rebuild)
        names = work / "ncbi_train_names.tsv"
        if rebuild or not names.exists():
            mention_names([n_train], names, lang="en")
        medic_train = table(work / "medic_train.parquet", [SourceSpec("tsv", (ncbi / "medic_06Jul2012.txt", names))],
                            rebuild=rebuild)
        return medic, medic_train

    out["ncbi"] = {
        "title": "NCBI-disease test (BioSyn preprocessing)", "dicts": ncbi_dicts, "encoder": "minilm", "kind": "tfidf",
        "index_config": lambda args: TfidfConfig(analyzer="char", ngram_min=1, ngram_max=2, normalization="biosyn"),
        "train": [n_train],
        "heldin": f"pubtator:{ncbi / 'NCBIdevelopset_corpus.txt'}{prep}",
        "test": f"pubtator:{ncbi / 'NCBItestset_corpus.txt'}{prep}",
        "eval": {"composite": "any"}, "nil": 0.2,
    }
    # The full system of the issue's aim: the BioSyn-trained dense retriever (scripts/ncbi_biosyn.py) with the
    # NCBI re-ranker above, same dictionary, held-in and test sets as "ncbi". That encoder was trained on the
    # train+dev mentions, so the dev split is not unseen by the retriever: its held-in scores are optimistic and
    # the dev-chosen mix may lean to the retriever. The script therefore also reports, as a diagnostic only, the
    # test Acc@1 of every weight (`weight_sensitivity`), so the cost of that bias is visible.
    out["ncbi-biosyn"] = {
        **out["ncbi"], "title": "NCBI-disease test (BioSyn preprocessing), BioSyn dense retriever",
        "kind": "dense", "index_config": lambda args: DenseConfig(encoder=str(args.biosyn_model)),
        "reranker_of": "ncbi", "heldin_seen_by_retriever": True,
    }
    # Its own re-ranker, trained with hard negatives mined by the BioSyn dense retriever itself (`--mine-index`: a
    # dense index of the training dictionary, MEDIC, with that encoder), so it learns that retriever's mistakes
    # instead of tf-idf's.
    out["ncbi-biosyn-mined"] = {
        **out["ncbi-biosyn"], "title": "NCBI-disease test (BioSyn preprocessing), BioSyn dense retriever, re-ranker "
        "negatives mined by it", "reranker_of": None, "mine_index": True,
    }
    # That re-ranker above the stronger retriever of eval/ncbi_biosyn/ncbi_biosyn_sapall.md (sap on every MEDIC pair, then
    # BioSyn): pass `--biosyn-model models/ncbi-biosyn-minilm-sap-all-biosyn`.
    out["ncbi-sapall-mined"] = {
        **out["ncbi-biosyn-mined"], "title": "NCBI-disease test (BioSyn preprocessing), sap + BioSyn dense retriever, "
        "the re-ranker of the row above", "reranker_of": "ncbi-biosyn-mined", "mine_index": False,
    }
    # The "ncbi" recipe from a domain-adapted transformer: MiniLM after sap on every MEDIC synonym pair
    # (eval/ncbi_biosyn/ncbi_biosyn_sapall.md's first stage; no mention seen, so the dev split stays held-in).
    out["ncbi-sapinit"] = {
        **out["ncbi"], "init": ("ncbi-biosyn-minilm-sap-all", "make eval-ncbi-biosyn-sap"),
        "title": "NCBI-disease test (BioSyn preprocessing), re-ranker initialised from the sap encoder",
    }
    # ...and above the sap + BioSyn dense retriever (``--biosyn-model``): the full system with that re-ranker.
    out["ncbi-sapall-sapinit"] = {
        **out["ncbi-sapall-mined"], "reranker_of": "ncbi-sapinit",
        "title": "NCBI-disease test (BioSyn preprocessing), sap + BioSyn dense retriever, the sap-initialised "
        "re-ranker",
    }
    # "ncbi-sapinit" at the sizes a GPU affords (scripts/gpu_rerank.sh; 10 to 40 min each on 2 cores): 7 hard
    # negatives a query instead of 5, and either 6,000 synonym queries for 4 epochs (a fifth of the groups are the
    # 1,405 distinct train mentions) or every concept's two synonym queries (~24,000, the mentions diluted to 6%) for
    # 2; and the 6,000 one with negatives mined by the retriever's own tf-idf (which helped Cantemist). Dev chooses.
    full = {"init": out["ncbi-sapinit"]["init"], "title": out["ncbi-sapinit"]["title"] + ", full size"}
    out["ncbi-sapinit-q6k"] = {**out["ncbi"], **full,
                               "recipe": {"max_queries": 6000, "negatives": 7, "epochs": 4}}
    out["ncbi-sapinit-qall"] = {**out["ncbi"], **full,
                                "recipe": {"max_queries": None, "negatives": 7, "epochs": 2}}
    out["ncbi-sapinit-q6k-mined"] = {**out["ncbi-sapinit-q6k"], "mine_with_retriever": True}
    # None of those beat "ncbi-sapinit" on dev (its groups are half train mentions): a second GPU call keeps its 1,500
    # synonym queries and trains longer (4 epochs, 7 negatives), with 15 negatives, or on the train mentions alone.
    out["ncbi-sapinit-e4"] = {**out["ncbi"], **full, "recipe": {"max_queries": 1500, "negatives": 7, "epochs": 4}}
    out["ncbi-sapinit-n15"] = {**out["ncbi"], **full, "recipe": {"max_queries": 1500, "negatives": 15, "epochs": 3}}
    out["ncbi-sapinit-mentions"] = {**out["ncbi"], **full, "recipe": {"max_queries": 0, "negatives": 7, "epochs": 8}}
    # The "ncbi" recipe from a larger transformer that knows disease names: e5-small (12 layers against MiniLM's 6)
    # after the cross-lingual sap on HPO + the Disease Ontology (models/mantra-e5-sap-all-doid, the start of the
    # Cantemist re-ranker that gained most; it saw no NCBI mention, so dev stays held-in).
    out["ncbi-e5sapinit"] = {
        **out["ncbi"], "encoder": "e5-small", "init": ("mantra-e5-sap-all-doid", "make eval-multilingual-full"),
        "title": "NCBI-disease test (BioSyn preprocessing), re-ranker initialised from the sap e5-small (HPO + DOID)",
    }
    # The Cantemist recipe's start on NCBI: MiniLM after sap on MEDIC and then BioSyn on the *train* mentions only
    # (the dev-chosen lr / batch / top-k / 4 epochs of eval/ncbi_biosyn/ncbi_biosyn_sapall.md, without dev, so dev stays held-in;
    # `make eval-rerank` trains it with `linker train biosyn`), its weights under a fresh one-output head.
    out["ncbi-sapbiosyninit"] = {
        **out["ncbi"], "init": ("ncbi-biosyn-minilm-sap-all-biosyn-train", "make eval-rerank"),
        "title": "NCBI-disease test (BioSyn preprocessing), re-ranker initialised from the sap + BioSyn (train) "
        "encoder",
    }
    # ...and the one knob left at its default: how many of the retriever's candidates it re-scores (dev only first).
    for k in (8, 32):
        out[f"ncbi-sapinit-k{k}"] = {**out["ncbi-sapinit"], "reranker_of": "ncbi-sapinit", "rerank_k": k,
                                     "title": out["ncbi-sapinit"]["title"] + f", re-ranking the top {k}"}
    # Ties decided by the train annotations (`linker index build --prior`): MEDIC gives one name to several concepts,
    # and on dev a train-annotation prior put the gold first for 34 mentions more and 4 fewer (eval/ncbi_ties/ncbi_tie_prior.md).
    for base in ("ncbi-sapinit", "ncbi-sapall-sapinit"):
        out[f"{base}-prior"] = {**out[base], "reranker_of": "ncbi-sapinit", "prior": [n_train],
                                "title": out[base]["title"] + ", ties by the train annotations"}
    # The full system's own re-ranker: the sap start, hard negatives mined by the dense retriever it will serve (the
    # sap-initialised one above learned tf-idf's confusions; ncbi-biosyn-mined mined them so from plain MiniLM).
    out["ncbi-sapall-sapinit-mined"] = {
        **out["ncbi-sapall-sapinit-prior"], "reranker_of": None, "mine_index": True,
        "init": out["ncbi-sapinit"]["init"],
        "title": "NCBI-disease test (BioSyn preprocessing), sap + BioSyn dense retriever, ties by the train "
        "annotations, a sap-initialised re-ranker with negatives mined by that retriever",
    }
    n_dev = out["ncbi"]["heldin"]

    def ncbi_protocol_dicts() -> tuple[Path, Path]:
        medic, _ = ncbi_dicts()
        names = work / "ncbi_train_dev_names.tsv"
        if rebuild or not names.exists():
            mention_names([n_train, n_dev], names, lang="en")
        return medic, table(work / "medic_train_dev.parquet",
                            [SourceSpec("tsv", (ncbi / "medic_06Jul2012.txt", names))], rebuild=rebuild)

    # The same system under BioSyn's own dictionary (MEDIC + train + dev mentions, as eval/ncbi_biosyn/ncbi_biosyn_full.md and
    # the published 91.1): dev mentions are then dictionary names, so nothing is fitted here; the mix and the
    # confidence map are those "ncbi-biosyn" chose on dev. Filtered0.2 filters by train+dev mentions, as there.
    out["ncbi-biosyn-protocol"] = {
        **out["ncbi-biosyn"], "title": "NCBI-disease test (BioSyn protocol: dictionary + dev mentions), BioSyn dense "
        "retriever", "dicts": ncbi_protocol_dicts, "calibration_from": "ncbi-biosyn", "nil": 0.0,
        "filter_train": [n_train, n_dev], "heldin_seen_by_retriever": False,
    }
    c_train = f"brat:{cantemist / 'train.zip'}"

    def cantemist_dicts() -> tuple[Path, Path]:
        icdo = table(work / "icdo.parquet", [SourceSpec("icdo", (cantemist / "valid-codes.tsv",))], rebuild=rebuild)
        names = work / "cantemist_train_names.tsv"
        if rebuild or not names.exists():
            mention_names([c_train], names, lang="es")
        return icdo, table(work / "icdo_train.parquet", [SourceSpec("icdo", (cantemist / "valid-codes.tsv",)),
                                                         SourceSpec("tsv", (names,))], rebuild=rebuild)

    out["cantemist"] = {
        "title": "Cantemist test", "dicts": cantemist_dicts, "encoder": "e5-small", "kind": "tfidf",
        "index_config": lambda args: get_preset("medical-crossing"),
        "train": [c_train], "heldin": f"brat:{cantemist / 'dev1.zip'}#lang=es",
        "test": f"brat:{cantemist / 'test.zip'}#lang=es", "eval": {}, "nil": 0.0,
    }
    # One cheaper-recipe change, compared on the held-in set (`--heldin-only`): the re-ranker's hard negatives
    # mined with the retriever's own tf-idf parameters (the confusions it is shown at link time) instead of the
    # library's default tf-idf.
    out["cantemist-mined"] = {**out["cantemist"], "title": "Cantemist test, negatives mined by the retriever's tf-idf",
                              "mine_with_retriever": True}
    # The same recipe for three epochs (dev1 still rose from the first epoch to the second): compared with the
    # two-epoch one on dev1 first (`--heldin-only`), whatever `--epochs` says.
    out["cantemist-mined-e3"] = {**out["cantemist-mined"], "recipe": {"epochs": 3},
                                 "title": "Cantemist test, negatives mined by the retriever's tf-idf, three epochs"}
    # The same recipe from a domain-adapted transformer (xMEN initialises its cross-encoder from SapBERT): the full-size
    # bi-encoder of eval/train_multilingual/train_cantemist_e5_sap_all.md (cross-lingual sap on HPO + DOID, then BioSyn on the train
    # mentions; dev1 unseen by it), its weights under a fresh one-output head.
    out["cantemist-mined-sapinit"] = {
        **out["cantemist-mined"], "init": ("cantemist-e5-sap-biosyn-all", "make eval-multilingual-full"),
        "title": "Cantemist test, negatives mined by the retriever's tf-idf, re-ranker initialised from the sap + "
        "BioSyn encoder",
    }
    # The NCBI tie prior (`linker index build --prior`, train annotations) on Spanish: does it matter there too?
    out["cantemist-mined-sapinit-prior"] = {
        **out["cantemist-mined-sapinit"], "reranker_of": "cantemist-mined-sapinit", "prior": [c_train],
        "title": out["cantemist-mined-sapinit"]["title"] + ", ties by the train annotations"}
    x_train = f"codiesp:{codiesp / 'trainX.tsv'}#D"

    def codiesp_dicts() -> tuple[Path, Path]:
        icd10 = table(work / "icd10cm.parquet", [SourceSpec("icd10", ())], rebuild=rebuild)
        names = work / "codiesp_d_train_names.tsv"
        if rebuild or not names.exists():
            mention_names([x_train], names, lang="es", canonical=icd10cm_code)
        return icd10, table(work / "icd10cm_train.parquet", [SourceSpec("icd10", ()), SourceSpec("tsv", (names,))],
                            rebuild=rebuild)

    out["codiesp"] = {
        "title": "CodiEsp-D test", "dicts": codiesp_dicts, "encoder": "e5-small", "kind": "tfidf",
        "index_config": lambda args: get_preset("medical-crossing"),
        "train": [x_train], "heldin": f"codiesp:{codiesp / 'devX.tsv'}#D",
        "test": f"codiesp:{codiesp / 'testX.tsv'}#D", "eval": {}, "nil": 0.0,
    }
    out["codiesp-mined"] = {**out["codiesp"], "title": "CodiEsp-D test, negatives mined by the retriever's tf-idf",
                            "mine_with_retriever": True}
    out["codiesp-mined-sapinit"] = {
        **out["codiesp-mined"], "init": ("codiesp-e5-sap-biosyn-all", "make eval-multilingual-full"),
        "title": "CodiEsp-D test, negatives mined by the retriever's tf-idf, re-ranker initialised from the sap + "
        "BioSyn encoder",
    }
    out["codiesp-mined-sapinit-prior"] = {
        **out["codiesp-mined-sapinit"], "reranker_of": "codiesp-mined-sapinit", "prior": [x_train],
        "title": out["codiesp-mined-sapinit"]["title"] + ", ties by the train annotations"}
    # The CodiEsp-D full system: the e5-small retriever that BioSyn trained on every train mention
    # (scripts/train_multilingual.py codiesp --biosyn-queries 0; ``--codiesp-model``) over the same dictionary, with
    # the "codiesp-mined" re-ranker above. That encoder never saw devX, so the held-in choices are not biased.
    out["codiesp-biosyn"] = {
        **out["codiesp"], "title": "CodiEsp-D test, BioSyn-trained e5-small dense retriever", "kind": "dense",
        "index_config": lambda args: DenseConfig(encoder=str(args.codiesp_model)), "reranker_of": "codiesp-mined",
    }
    # Its own re-ranker, hard negatives mined by that dense retriever over the training dictionary: the tf-idf-mined
    # one never saw the semantically close English names a dense retriever returns.
    out["codiesp-biosyn-mined"] = {
        **out["codiesp-biosyn"], "title": "CodiEsp-D test, BioSyn-trained e5-small dense retriever, re-ranker "
        "negatives mined by it", "reranker_of": None, "mine_index": True,
    }
    # The full-size retriever of eval/train_multilingual/train_cantemist_e5_sap_all.md (cross-lingual sap on HPO + DOID, then BioSyn for
    # 10 epochs on every train mention, on a lent GPU; scripts/gpu_multilingual.sh) over the same dictionary, with the
    # tf-idf-mined re-ranker above: does a re-ranker still add to the best retriever?
    out["cantemist-sapbiosyn"] = {
        **out["cantemist"], "title": "Cantemist test, sap + BioSyn e5-small dense retriever (full size)",
        "kind": "dense", "reranker_of": "cantemist-mined",
        "index_config": lambda args: DenseConfig(encoder=str(args.models / "cantemist-e5-sap-biosyn-all")),
    }
    # ...and the best Cantemist re-ranker (sap + BioSyn start) above it: does it still add to the best retriever?
    out["cantemist-sapbiosyn-sapinit"] = {
        **out["cantemist-sapbiosyn"], "reranker_of": "cantemist-mined-sapinit",
        "title": "Cantemist test, sap + BioSyn e5-small dense retriever (full size), the re-ranker initialised from it",
    }
    # Its own re-ranker: the same start, hard negatives mined by that dense retriever over the training dictionary (the
    # sap-initialised one learned tf-idf's confusions and alone reads 55.91% of the dense retriever's dev1 candidates).
    out["cantemist-sapbiosyn-sapinit-mined"] = {
        **out["cantemist-sapbiosyn-sapinit"], "reranker_of": None, "mine_index": True,
        "init": out["cantemist-mined-sapinit"]["init"], "recipe": {"epochs": 2},
        "title": "Cantemist test, sap + BioSyn e5-small dense retriever (full size), a re-ranker initialised from it "
        "with negatives mined by it",
    }
    # The same on CodiEsp-D: the full-size sap + BioSyn e5-small (scripts/train_multilingual.py, eval/
    # train_codiesp_e5_sap_all.md) dense over ICD-10-CM + train mentions, its sap-initialised re-ranker above.
    out["codiesp-sapbiosyn-sapinit"] = {
        **out["codiesp"], "title": "CodiEsp-D test, sap + BioSyn e5-small dense retriever (full size), the re-ranker "
        "initialised from it", "kind": "dense", "reranker_of": "codiesp-mined-sapinit",
        "index_config": lambda args: DenseConfig(encoder=str(args.models / "codiesp-e5-sap-biosyn-all")),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "rerank")
    parser.add_argument("--work", type=Path, default=ROOT / "indexes" / "rr")
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--datasets", default="ncbi,cantemist,codiesp")
    parser.add_argument("--rerank-k", type=int, default=16)
    parser.add_argument("--train-seconds", type=float, default=5100)
    parser.add_argument("--max-queries", type=int, default=1500, help="synonym queries (labelled mentions: all)")
    parser.add_argument("--negatives", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint-every", type=int, default=50, help="training steps between checkpoints")
    parser.add_argument("--biosyn-model", type=Path, default=ROOT / "models" / "ncbi-biosyn-minilm-biosyn",
                        help="ncbi-biosyn's dense encoder (scripts/ncbi_biosyn.py --epochs 10 writes it)")
    parser.add_argument("--codiesp-model", type=Path, default=ROOT / "models" / "codiesp-e5-biosyn-all",
                        help="codiesp-biosyn's dense encoder (scripts/train_multilingual.py codiesp --biosyn-queries 0)")
    parser.add_argument("--systems", default="retriever,reranked",
                        help="retriever: tf-idf + calibration only (no re-ranker trained); reranked: also the re-ranker")
    parser.add_argument("--heldin-only", action="store_true",
                        help="stop after the held-in calibration (to compare recipes on dev, never on test)")
    parser.add_argument("--import-heldin", type=Path, nargs="*", default=[], metavar="JSON",
                        help="first add the held-in comparisons of these rerank_confidence.json files (another "
                             "machine's --heldin-only runs, e.g. scripts/gpu_rerank.sh's) to this one's")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    summary_path = args.out / "rerank_confidence.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"datasets": {}}
    if args.import_heldin:  # written now: each dataset below re-reads the file before adding its entry
        for other in args.import_heldin:
            summary.setdefault("heldin_only", {}).update(json.loads(other.read_text()).get("heldin_only", {}))
        write_summary(summary, summary_path, args)
    specs = datasets(args.data, args.work, args.rebuild)
    names = [d.strip() for d in args.datasets.split(",") if d.strip()]
    for name in names:
        spec = specs[name]
        started = time.perf_counter()
        k = rerank_k(spec, args)
        train_dict, index_dict = spec["dicts"]()
        systems = [s.strip() for s in args.systems.split(",") if s.strip()]
        model = args.models / f"rr-{spec.get('reranker_of') or name}-{spec['encoder']}"
        if "reranked" in systems and spec.get("reranker_of") and not (model / "train_metrics.json").exists():
            raise SystemExit(f"{name}: re-ranker {model} missing; run --datasets {spec['reranker_of']} first")
        if "reranked" in systems and (args.rebuild or not (model / "train_metrics.json").exists()):
            mine_index = None
            if spec.get("mine_index"):  # the retriever's kind and parameters over the training dictionary
                mine_index = args.work / f"{name}_mining_{spec['kind']}"
                if args.rebuild or not index_current(mine_index, dense_encoder(spec, args)):
                    build_index(train_dict, kind=spec["kind"], out=mine_index, config=spec["index_config"](args),
                                overwrite=True)
            recipe = {"max_queries": args.max_queries, "negatives": args.negatives, "epochs": args.epochs,
                      **spec.get("recipe", {})}  # a dataset's own recipe wins over the command line's
            config = RerankConfig(**recipe, lr=args.lr, threads=args.threads, max_seconds=args.train_seconds,
                                  checkpoint_every=args.checkpoint_every,
                                  mining=spec["index_config"](args) if spec.get("mine_with_retriever") else None,
                                  mine_index=None if mine_index is None else str(mine_index))
            resume = model.with_name(model.name + ".checkpoint").exists()
            base = spec["encoder"]
            if spec.get("init"):  # (a model folder under --models, the command that trains it)
                folder, made_by = spec["init"]
                base = str(args.models / folder)
                if not Path(base).is_dir():
                    raise SystemExit(f"{name}: the re-ranker starts from {base}, which is missing; `{made_by}` "
                                     "trains it")
            train_rerank(train_dict, encoder=base, out=model, train_specs=spec["train"], config=config,
                         resume=resume, overwrite=args.rebuild)
        retriever = args.work / f"{name}_{spec['kind']}"
        reranked = args.work / f"{name}_{spec['kind']}_rerank"
        folders = {"retriever": (retriever, None), "reranked": (reranked, model)}
        for folder, bound in (folders[s] for s in systems):
            if args.rebuild or not index_current(folder, dense_encoder(spec, args), bound, spec.get("prior", ())):
                build_index(index_dict, kind=spec["kind"], out=folder, config=spec["index_config"](args),
                            reranker=bound, prior=spec.get("prior", ()), overwrite=True)
        entry = {"title": spec["title"], "command": " ".join(["python", "scripts/rerank_confidence.py", *sys.argv[1:]]),
                 "test": spec["test"], "heldin": spec["heldin"], "train": spec["train"],
                 "dictionary": str(index_dict.relative_to(ROOT) if index_dict.is_relative_to(ROOT) else index_dict),
                 "reranker": str(model.relative_to(ROOT) if model.is_relative_to(ROOT) else model),
                 "rerank_k": k, "systems": {}, "training": None}
        if spec["kind"] == "dense":  # which trained encoder retrieves: the title names only its kind
            entry["retriever_encoder"] = spec["index_config"](args).encoder
        if (model / "train_metrics.json").exists():  # also a re-ranker trained but not evaluated (too few steps)
            entry["training"] = training_summary(model)
        for system in systems:
            folder = folders[system][0]
            if spec.get("calibration_from"):
                source = args.work / f"{spec['calibration_from']}_{spec['kind']}"
                cal = copy_calibration(source if system == "retriever" else source.with_name(source.name + "_rerank"),
                                       folder)
            else:
                cal = heldin_calibration(folder, spec, args)
            if args.heldin_only:
                entry["systems"][system] = {"calibration_fit": {k: cal[k] for k in ("mentions", "with_candidate",
                                                                                   "accuracy_at_1", "mixing") if k in cal}}
                continue
            threshold, heldin_nil = 0.5, None
            if spec["nil"]:  # the "no link" threshold: the best F1 on the held-in set with its own concepts removed
                heldin_nil = evaluate(folder, spec["heldin"], ks=(1,), rerank_k=k, nil_fraction=spec["nil"],
                                      **spec["eval"]).nil
                threshold = (heldin_nil["best_f1_oracle"] or {}).get("threshold", threshold)
            report = evaluate(folder, spec["test"], train_spec=spec.get("filter_train", spec["train"]), filters=("full", "train0.2"), ks=(1, 5),
                              report_dir=args.out, name=f"rr_{name}_{system}", rerank_k=k,
                              nil_fraction=spec["nil"], min_confidence=threshold, overwrite=True,
                              **spec["eval"])  # regenerates its reports
            entry["systems"][system] = {
                "calibration_fit": {k: cal[k] for k in ("mentions", "with_candidate", "accuracy_at_1", "ece_raw",
                                                        "ece_fitted_in_sample", "breakpoints", "mixing", "copied_from",
                                                        "retriever_weight") if k in cal},
                "nil_heldin": heldin_nil,
                "rows": [{"filter": r.filter, "n": r.n, "acc1": r.acc(1).value, "acc5": r.acc(5).value,
                          "acc1_interval": [r.acc(1).low, r.acc(1).high]} for r in report.rows if r.lang == "all"],
                "rerank": report.rerank, "calibration": {k: v for k, v in report.calibration.items() if k != "curve"},
                "nil": report.nil, "seconds": report.seconds, "load_average": report.config["load_average"],
                "report": f"eval/rerank/rr_{name}_{system}.md",
            }
        if spec.get("heldin_seen_by_retriever") and "reranked" in systems:
            entry["weight_sensitivity"] = test_weight_sensitivity(reranked, spec, args)
        entry["seconds"] = round(time.perf_counter() - started, 1)
        # Re-read: several datasets may run in parallel processes, each adding its own entry.
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"datasets": {}}
        summary.setdefault("heldin_only", {})
        if not args.heldin_only:  # the full entry supersedes a held-in-only one of the same dataset
            summary["heldin_only"].pop(name, None)
        summary["heldin_only" if args.heldin_only else "datasets"][name] = entry
        summary.update({
            "command": " ".join(["python", "scripts/rerank_confidence.py", *sys.argv[1:]]),
            "hardware": {"cpu_count": os.cpu_count(), "torch_threads": args.threads, "machine": platform.machine(),
                         "torch": torch.__version__, "gpu": torch.cuda.is_available(),
                         "load_average_at_end": list(os.getloadavg())},
        })
        write_summary(summary, summary_path, args)
        for path in [*args.out.glob(f"rr_{name}_*.json"), *args.out.glob(f"rr_{name}_*.md")]:
            relative_paths(path, args.data)
        log.info("%s done in %.0fs", name, entry["seconds"])
    if not names:  # `--datasets ""`: the reports rewritten from the summary as it stands (a changed layout)
        write_summary(summary, summary_path, args)
    print(markdown(summary))


def rerank_k(spec: dict, args) -> int:
    """How many of the retriever's candidates the re-ranker re-scores: the dataset's own choice, else --rerank-k."""
    return spec.get("rerank_k", args.rerank_k)


def write_summary(summary: dict, path: Path, args) -> None:
    """eval/rerank/rerank_confidence.{json,md}, with portable paths."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(summary, indent=2, default=str))
    with atomic_file(args.out / "rerank_confidence.md") as tmp:
        tmp.write_text(markdown(summary))
    for written in (path, args.out / "rerank_confidence.md"):
        relative_paths(written, args.data)


def dense_encoder(spec: dict, args) -> str | None:
    """The encoder a dense retriever's index is built with (None for tf-idf), to notice a retrained one."""
    return spec["index_config"](args).encoder if spec["kind"] == "dense" else None


def heldin_calibration(folder: Path, spec: dict, args) -> dict:
    """`calibrate` on the held-in set, kept beside the index (`<index>.heldin.json`) so that a `--heldin-only`
    comparison run is not repeated by the full run (the index keeps the calibration it wrote)."""
    cached = folder.with_name(folder.name + ".heldin.json")
    k = rerank_k(spec, args)
    built_at = json.loads((folder / "manifest.json").read_text())["built_at"]  # a rebuilt index is fitted afresh
    if cached.exists() and not args.rebuild:
        saved = json.loads(cached.read_text())
        mixing = saved["summary"].get("mixing")  # refitted when the grid or its rule changed, or the ceiling is missing
        current = mixing is None or (saved.get("weights") == list(RETRIEVER_WEIGHTS)
                                     and saved.get("smoothing") == MIX_SMOOTHING and "gold_among_reranked" in mixing)
        if (saved["rerank_k"], saved["dataset"], saved.get("index_built_at")) == (k, spec["heldin"],
                                                                                   built_at) and current:
            return saved["summary"]
    cal = calibrate(folder, spec["heldin"], rerank_k=k, composite=spec["eval"].get("composite", "all"))
    with atomic_file(cached) as tmp:
        tmp.write_text(json.dumps({"rerank_k": k, "dataset": spec["heldin"], "index_built_at": built_at,
                                   "weights": list(RETRIEVER_WEIGHTS), "smoothing": MIX_SMOOTHING, "summary": cal},
                                  indent=1))
    return cal


def copy_calibration(source: Path, folder: Path) -> dict:
    """`folder` gets the calibration (mix weight and confidence map) that `source` fitted on its held-in set."""
    from linker.confidence import read_calibration, write_calibration
    from linker.index.manifest import read_manifest

    calibration = read_calibration(source, read_manifest(source))
    if calibration is None:
        raise SystemExit(f"{source}: no calibration to reuse; run its dataset first")
    write_calibration(folder, calibration)
    return {"copied_from": source.name, "mentions": calibration.mentions, "with_candidate": calibration.mentions,
            "accuracy_at_1": calibration.accuracy, "retriever_weight": calibration.retriever_weight}


def test_weight_sensitivity(index: Path, spec: dict, args) -> dict:
    """Diagnostic, never a choice: Acc@1 (Full) of every mix weight on the *test* set, read from `calibrate` run on a
    scratch copy of the index (the real index keeps its held-in calibration)."""
    import shutil

    scratch = args.work / f"{index.name}.test-mix-scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(index, scratch)
    try:
        mixing = calibrate(scratch, spec["test"], rerank_k=rerank_k(spec, args),
                           composite=spec["eval"].get("composite", "all"))["mixing"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"accuracy_at_1_by_weight": mixing["accuracy_at_1_by_weight"],
            "accuracy_at_1_retriever_order": mixing["accuracy_at_1_retriever_order"],
            "best_weight_on_test": mixing["retriever_weight"]}


def training_summary(model: Path) -> dict:
    metrics = json.loads((model / "train_metrics.json").read_text())
    out = {k: metrics["extra"].get(k) for k in ("data", "train_seconds", "steps", "bf16", "stopped_at_time_budget",
                                                "parameters")}
    run = json.loads((model / "train_config.json").read_text())
    out["config"], out["base_encoder"] = run["config"], run.get("base_encoder")
    out["device"] = (metrics["extra"].get("hardware") or {}).get("gpu") or "CPU"
    out["first_loss"] = metrics["steps"][0]["loss"] if metrics["steps"] else None
    tail = metrics["steps"][-50:]
    out["last_50_steps_loss"] = sum(s["loss"] for s in tail) / max(len(tail), 1)
    out["last_50_steps_batch_acc"] = sum(s["batch_acc"] for s in tail) / max(len(tail), 1)
    return out


def relative_paths(path: Path, data: Path) -> None:
    """Reports name the data as ../shared/data and the repository as `.`, never this machine's paths."""
    text = portable_paths(path.read_text(encoding="utf-8"), root=ROOT, data=data)
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _curve(by_weight: dict[float, float], chosen: float) -> str:
    """Acc@1 by mix weight: the quarter-octave grid (90 points) at whole octaves up to 4096, the chosen weight and
    the last (the retriever's order); entries calibrated on the earlier 15-point grid whole."""
    last = max(by_weight)
    shown = {w: a for w, a in by_weight.items() if len(by_weight) <= 15 or w in (0.0, chosen, last)
             or (0.25 <= w <= 4096 and math.log2(w).is_integer())}
    return ", ".join(f"{w:.4g}: {_pct(a)}" for w, a in shown.items())


def _pct(value) -> str:
    return "–" if value is None or value != value else f"{100 * value:.2f}"


def markdown(summary: dict) -> str:
    lines = [
        "# Re-ranking, calibrated confidence and \"no link\" on CPU",
        "",
        "Produced by " + ", ".join(dict.fromkeys(f"`{e.get('command', summary['command'])}`"
                                                 for e in summary["datasets"].values()))
        + " (see the script's docstring for the protocol). "
        f"Hardware: {summary['hardware']['cpu_count']} CPU cores shared with other jobs, torch "
        f"{summary['hardware']['torch']}, {summary['hardware']['torch_threads']} threads, GPU: "
        f"{summary['hardware']['gpu']}; load average at the end {summary['hardware']['load_average_at_end']}.",
        "",
        "Retriever: character tf-idf over the dictionary plus the training mentions (for the row so named, the "
        "BioSyn-trained dense MiniLM of eval/ncbi_biosyn/ncbi_biosyn_full.md over the same dictionary). Re-ranker: a cross-encoder "
        "trained by `linker train rerank` within a CPU time budget, re-scoring the retriever's top *k*. Both columns "
        "come from one linking call (the re-ranked candidates keep the retriever's score). Calibration: isotonic, "
        "fitted on the held-in dev split with `linker calibrate`; ECE on the test set (10 bins); *raw* = the score "
        "read as a probability (cosine clipped to [0, 1], re-ranker logit through the logistic function).",
        "",
        "| dataset | subset | n | retriever Acc@1 | Acc@5 | + re-ranker Acc@1 | Acc@5 | gain Acc@1 | re-rank ms / distinct mention (retrieve ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for entry in summary["datasets"].values():
        if "reranked" not in entry["systems"]:
            for row in entry["systems"]["retriever"]["rows"]:
                lines.append(f"| {entry['title']} | {row['filter']} | {row['n']:,} | {_pct(row['acc1'])} | "
                             f"{_pct(row['acc5'])} | not evaluated (see training) | | | |")
            continue
        rr = entry["systems"]["reranked"]["rerank"]
        fit = entry["systems"]["reranked"]["calibration_fit"]
        mixing = fit.get("mixing")
        if entry.get("retriever_encoder"):
            notes.append(f"- **{entry['title']}**: the retriever encodes with `{entry['retriever_encoder']}`.")
        if fit.get("copied_from"):
            notes.append(f"- **{entry['title']}**: nothing fitted on this dictionary; the mix (logit + "
                         f"{fit['retriever_weight']:.4g} x retriever score) and the confidence map are those of "
                         f"`{fit['copied_from']}`, chosen on its held-in set.")
        if mixing:
            by_weight = {float(w): a for w, a in mixing["accuracy_at_1_by_weight"].items()}  # JSON keys are strings
            notes.append(f"- **{entry['title']}**: on the held-in set, Acc@1 of the retriever's order "
                         f"{_pct(mixing['accuracy_at_1_retriever_order'])}, the re-ranker alone {_pct(by_weight[0.0])}, "
                         f"the chosen mix (logit + {mixing['retriever_weight']:.4g} x retriever score) "
                         f"{_pct(by_weight[float(mixing['retriever_weight'])])}; by weight: "
                         + _curve(by_weight, mixing["retriever_weight"]) + ".")
        sensitivity = entry.get("weight_sensitivity")
        if sensitivity:
            on_test = {float(w): a for w, a in sensitivity["accuracy_at_1_by_weight"].items()}
            notes.append("  - *Diagnostic, not a result*: the retriever saw the held-in mentions in training, so "
                         "the held-in choice may be biased. Test Acc@1 (Full) by weight: "
                         + _curve(on_test, sensitivity["best_weight_on_test"])
                         + f" (retriever order {_pct(sensitivity['accuracy_at_1_retriever_order'])}); the best test "
                         f"weight would be {sensitivity['best_weight_on_test']:g}.")
        for row in rr["rows"]:
            lines.append(
                f"| {entry['title']} | {row['filter']} | {row['n']:,} | {_pct(row['retriever_acc1'])} | "
                f"{_pct(row['retriever_acc5'])} | {_pct(row['reranked_acc1'])} | {_pct(row['reranked_acc5'])} | "
                f"{100 * (row['reranked_acc1'] - row['retriever_acc1']):+.2f} | "
                f"{rr['rerank_ms_per_mention']:.1f} ({rr['retrieve_ms_per_mention']:.1f}) |")
    if notes:
        lines += ["", "The re-ranked column is the mix of the re-ranker's logit and the retriever's score chosen on the "
                  "held-in set (`linker calibrate`, recorded in the index manifest):", "", *notes]
    lines += ["", "## Calibration (test set, Full)", "",
              "| dataset | system | held-in mentions | ECE raw | ECE calibrated | threshold keeping >= 90% | kept % | "
              "Acc@1 of the kept | Acc@1 of all |",
              "|---|---|---|---|---|---|---|---|---|"]
    for entry in summary["datasets"].values():
        for system, s in entry["systems"].items():
            c, at = s["calibration"], s["calibration"]["at_coverage"]
            lines.append(
                f"| {entry['title']} | {system} | {s['calibration_fit']['with_candidate']:,} | {c['ece_raw']:.4f} | "
                f"{'–' if c['ece_calibrated'] is None else format(c['ece_calibrated'], '.4f')} | "
                f"{'–' if at['threshold'] is None else format(at['threshold'], '.4f')} | {_pct(at['coverage'])} | "
                f"{_pct(at['accuracy'])} | {_pct(c['accuracy_at_1'])} |")
    nil_rows = [(e, system, s["nil"]) for e in summary["datasets"].values() for system, s in e["systems"].items()
                if s.get("nil")]
    if nil_rows:
        lines += ["", "## No link (20% of the gold concepts removed from the dictionary)", "",
                  "The threshold is the confidence with the best 'no link' F1 on the held-in dev split with 20% of "
                  "its own gold concepts removed; the test set's own best threshold is shown beside it as an oracle "
                  "(not a result).", "",
                  "| dataset | system | concepts removed | mentions without answer | threshold (held-in F1) | "
                  "'no link' answers | precision | recall | F1 | oracle F1 on test | Acc@1 of the linked answerable |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for entry, system, n in nil_rows:
            best = n.get("best_f1_oracle") or {}
            heldin = (entry["systems"][system].get("nil_heldin") or {}).get("best_f1_oracle") or {}
            lines.append(
                f"| {entry['title']} | {system} | {n['concepts_removed']:,} | {n['gold_nil']:,} of {n['mentions']:,} | "
                f"{n['threshold']:.3f} ({_pct(heldin.get('f1'))}) | "
                f"{n['predicted_nil']:,} | {_pct(n['precision'])} | {_pct(n['recall'])} | {_pct(n['f1'])} | "
                f"{_pct(best.get('f1'))} at {best.get('threshold', float('nan')):.3f} | {_pct(n['linked_accuracy_at_1'])} |")
    compared = summary.get("heldin_only") or {}
    if compared:
        # the held-in-only runs beside every re-ranker that went on to test (its dataset entry), trained by that entry
        rows = [(key, entry, "yes") for key, entry in summary["datasets"].items()
                if f"/rr-{key}-" in entry["reranker"] and "reranked" in entry["systems"]]
        rows += [(key, entry, "no") for key, entry in compared.items()]
        lines += ["", "## Recipe comparison on the held-in set", "",
                  "Every re-ranker on its held-in set: those with `--heldin-only` were compared there and never run "
                  "on test; *scored on test* = the dataset's row above.", "",
                  "| run | re-ranker | negatives mined with | synonym queries + train mentions | negatives | steps "
                  "(epochs) | trained on | re-ranks top | held-in mentions | gold among them | retriever order Acc@1 | "
                  "re-ranker alone Acc@1 | chosen mix Acc@1 (weight) | scored on test |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for key, entry, tested in rows:
            mixing = entry["systems"]["reranked"]["calibration_fit"]["mixing"]
            by_weight = {float(w): a for w, a in mixing["accuracy_at_1_by_weight"].items()}
            t = entry["training"]
            stop = t.get("stopped_at_time_budget")
            epochs = (f"{stop['epoch'] - 1 + stop['step_in_epoch'] / stop['steps_per_epoch']:.1f} of "
                      f"{t['config']['epochs']}" if stop else f"{t['config']['epochs']}")
            lines.append(f"| {key} | `{entry['reranker']}` | {t['data']['negatives_from']} | "
                         f"{t['data']['synonym_queries']:,} + {t['data']['labelled_unique']:,} | "
                         f"{t['config']['negatives']} | {t['steps']:,} ({epochs}) | {t.get('device', 'CPU')} | {entry['rerank_k']} | "
                         f"{entry['systems']['reranked']['calibration_fit']['with_candidate']:,} | "
                         f"{_pct(mixing.get('gold_among_reranked'))} | "
                         f"{_pct(mixing['accuracy_at_1_retriever_order'])} | {_pct(by_weight[0.0])} | "
                         f"{_pct(by_weight[float(mixing['retriever_weight'])])} ({mixing['retriever_weight']:.4g}) | "
                         f"{tested} |")
    lines += ["", "## Re-ranker training", ""]
    for key, entry in [*summary["datasets"].items(), *((k, e) for k, e in compared.items()
                                                        if k not in summary["datasets"])]:
        t = entry["training"]
        if t is None:
            lines.append(f"- **{entry['title']}** (`{key}`): no re-ranker trained.")
            continue
        stop = t.get("stopped_at_time_budget")
        done = (f"stopped by the time budget at step {stop['step_in_epoch']:,} of {stop['steps_per_epoch']:,} "
                f"(epoch {stop['epoch']})" if stop else "all epochs")
        lines.append(
            f"- **{entry['title']}** (`{key}`): `{entry['reranker']}`"
            + (f" (from `{t['base_encoder']}`)" if t.get("base_encoder") else "")
            + f", training data {json.dumps(t['data'])}; {t['steps']:,} steps of {t['config']['batch_size']} queries x "
            f"(1 + {t['config']['negatives']}) pairs, lr {t['config']['lr']}, bf16 {t['bf16']}, {t['train_seconds']:.0f} s on "
            f"{t.get('device', 'CPU')}, "
            f"{done}; first step loss {t['first_loss']:.3f}, last 50 steps loss {t['last_50_steps_loss']:.3f}, "
            f"batch accuracy {t['last_50_steps_batch_acc']:.3f}."
            + (f" Re-ranks the top {entry['rerank_k']}." if "reranked" in entry["systems"] else
               " Not evaluated: too few steps to be more than its random head."))
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
