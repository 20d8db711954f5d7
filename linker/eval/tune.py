"""The hybrid index's sparse weight chosen on a dev split by a small grid, stored in its manifest.

A hybrid index scores ``sparse_weight * tf-idf cosine + dense_weight * dense cosine``
(`linker.index.hybrid`). The grid runs over ``a``, the tf-idf share: sparse_weight = a,
dense_weight = 1 - a. a = 0 ranks by the dense cosine alone and a = 1 by the tf-idf cosine alone
(over the union of both top lists, which holds each part's own top names), so with both ends in
the grid the chosen weight is at least as good on dev as either part alone. The library's
default (1, 1) ranks as a = 0.5. BioSyn's learned weight w is (w, 1), i.e. a = w / (1 + w).

The dev set is linked once per grid point from one loaded index; the dense query vectors are
encoded once (`HybridNameIndex.memoised_queries`). The best Acc@1 wins; ties go to the a closest
to 0.5 (a real mix of both), then to the smaller a. The record (grid, dev score of each point, the
chosen one, the dev set) goes to the manifest as ``sparse_weight_tuning``. A calibration fitted on
the old scores no longer fits them and is dropped from the manifest (run `linker calibrate` again).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from linker.datasets import Mention, load_dataset
from linker.errors import ConfigError
from linker.eval.metrics import mention_hits
from linker.eval.report import gold_matcher, predict

log = logging.getLogger(__name__)

DEFAULT_GRID = tuple(i / 10 for i in range(11))


def parse_grid(text: str) -> tuple[float, ...]:
    """``0,0.25,0.5`` -> (0.0, 0.25, 0.5); values are tf-idf shares in [0, 1]."""
    try:
        grid = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        grid = ()
    if not grid or any(not 0.0 <= a <= 1.0 for a in grid):
        raise ConfigError(f"--grid takes comma-separated tf-idf shares from 0 to 1 (0,0.1,...,1), found {text!r}")
    return tuple(dict.fromkeys(grid))


def _hybrid(linker_):
    names = linker_.index.names
    if getattr(names, "kind", None) != "hybrid":
        raise ConfigError(f"{linker_.index.folder}: a {linker_.manifest['kind']} index has no sparse weight; "
                          "tune a hybrid index (`linker index build --kind hybrid`)")
    return names


def weight_scores(linker_, mentions: Sequence[Mention], weights: Sequence[tuple[float, float]], *,
                  ks: Sequence[int] = (1,), composite: str = "all", query_lang: bool = False,
                  gold_via_xref: str | None = None, subsets: Mapping[str, Sequence[int]] | None = None) -> list[dict]:
    """Acc@k of `mentions` with the loaded hybrid index at each (sparse_weight, dense_weight).

    The index's own weights are restored afterwards. Gold ids match as in `linker.eval.report`
    (alternative ids from the concept table's xrefs). `subsets` (name -> mention indices, e.g. a
    test filter's `linker.eval.filters.filter_indices`) are scored from the same predictions,
    under ``entry["subsets"][name]``.
    """
    names = _hybrid(linker_)
    expand, _known = gold_matcher(linker_, gold_via_xref=gold_via_xref)
    gold = [m.gold for m in mentions]
    saved = names.sparse_weight, names.dense_weight
    out = []
    try:
        with names.memoised_queries():
            for sparse, dense in weights:
                names.sparse_weight, names.dense_weight = float(sparse), float(dense)
                ranked = predict(linker_, mentions, max(ks), query_lang=query_lang, progress=False)
                predicted = [tuple(r.ids for r in queries) for queries in ranked]
                entry = {"sparse_weight": float(sparse), "dense_weight": float(dense), "n": len(mentions)}
                hits = {k: mention_hits(gold, predicted, k, composite=composite, expand=expand) for k in ks}
                entry.update({f"acc{k}": _mean(h) for k, h in hits.items()})
                if subsets:
                    entry["subsets"] = {name: {"n": len(rows), **{f"acc{k}": _mean(h[list(rows)]) for k, h in hits.items()}}
                                        for name, rows in subsets.items()}
                out.append(entry)
    finally:
        names.sparse_weight, names.dense_weight = saved
    return out


def _mean(hits) -> float:
    return float(hits.mean()) if len(hits) else math.nan


def build_index(dict_path: str | Path, *, kind: str, out: str | Path, tune_on: str | None = None,
                overwrite: bool = False, **options: Any) -> dict:
    """`linker.index.build_index`, then, with `tune_on` (dev mentions, a dataset spec), `tune_sparse_weight` on
    them: the one call behind `linker index build --sparse-weight tuned --dev` and a recipe's tuned index. Returns
    the manifest (with ``sparse_weight_tuning`` when tuned).

    Here and not in `linker.index`: tuning links the dev mentions and scores them, which the index layer below
    `linker.link` and `linker.eval` may not do. `options`: the rest of `linker.index.build_index`'s keywords."""
    from linker.index import build_index as build
    from linker.index import get_kind
    from linker.index.manifest import read_manifest

    if tune_on is None:
        return build(dict_path, kind=kind, out=out, overwrite=overwrite, **options)
    config = options.get("config")
    if not hasattr(config if config is not None else get_kind(kind).config_type(), "sparse_weight"):
        raise ConfigError(f"tune_on: a {kind} index has no sparse weight to tune; build a hybrid index")
    from linker.datasets import spec_inputs
    from linker.fileio import check_output

    # Checked before the build: the folder the build replaces may not hold the dev mentions read after it.
    check_output(out, inputs=spec_inputs(tune_on, "--dev"), overwrite=overwrite, folder=True, option="--out")
    build(dict_path, kind=kind, out=out, overwrite=overwrite, **options)
    tune_sparse_weight(out, tune_on)
    return read_manifest(Path(out))


def tune_sparse_weight(index_dir: str | Path, dataset_spec: str, *, grid: Sequence[float] = DEFAULT_GRID,
                       composite: str = "all", query_lang: bool = False, gold_via_xref: str | None = None,
                       lenient: bool = False) -> dict:
    """Pick the hybrid index's weights on `dataset_spec` (a dev split) and store them in its manifest.

    Returns the record written as the manifest's ``sparse_weight_tuning``.
    """
    from linker.index.manifest import read_manifest, write_manifest
    from linker.link import Linker

    grid = tuple(float(a) for a in grid)
    if not grid or any(not 0.0 <= a <= 1.0 for a in grid):
        raise ConfigError(f"the grid holds tf-idf shares from 0 to 1, found {grid}")
    linker_ = Linker.load(index_dir, rerank="none")
    names = _hybrid(linker_)
    mentions = load_dataset(dataset_spec, lenient=lenient)
    if not mentions:
        raise ConfigError(f"{dataset_spec}: no mentions with gold ids to tune on")
    previous = {"sparse_weight": names.sparse_weight, "dense_weight": names.dense_weight}
    scores = weight_scores(linker_, mentions, [(a, 1.0 - a) for a in grid], composite=composite,
                           query_lang=query_lang, gold_via_xref=gold_via_xref)
    best = max(range(len(grid)), key=lambda i: (scores[i]["acc1"], -abs(grid[i] - 0.5), -grid[i]))
    at = {a: s["acc1"] for a, s in zip(grid, scores)}
    record = {
        "dataset": dataset_spec,
        "metric": "Acc@1",
        "composite_rule": composite,
        "gold_via_xref": gold_via_xref,
        "query_lang": query_lang,
        "mentions": len(mentions),
        "grid": list(grid),
        "scores": [{"a": a, "acc1": at[a]} for a in grid],
        "chosen": {"a": grid[best], "sparse_weight": grid[best], "dense_weight": 1.0 - grid[best],
                   "acc1": at[grid[best]]},
        "dense_acc1": at.get(0.0),
        "tfidf_acc1": at.get(1.0),
        "previous": previous,
        "tuned_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    manifest = {key: value for key, value in read_manifest(index_dir).items() if key != "files"}
    if manifest.pop("calibration", None):
        log.warning("%s: its calibration was fitted on the old weights' scores and is dropped; "
                    "run `linker calibrate` again", index_dir)
    manifest["parameters"] = {**manifest["parameters"], "sparse_weight": grid[best], "dense_weight": 1.0 - grid[best]}
    write_manifest(Path(index_dir), {**manifest, "sparse_weight_tuning": record})
    log.info("%s: tf-idf share %.3g chosen on %d mentions of %s (dev Acc@1 %.4f; dense alone %s, tf-idf alone %s)",
             index_dir, grid[best], len(mentions), dataset_spec, at[grid[best]], record["dense_acc1"],
             record["tfidf_acc1"])
    return record
