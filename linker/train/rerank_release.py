"""Retrain the shipped re-ranker exactly as shipped: ``linker train release linker-rerank-en``.

A cross-encoder (`linker.rerank`) learns to reorder the default retriever's top candidates for everyday wording.
Its recipe (`RerankRecipe`), every step from the installed default dictionary and ``linker/data/lay/``:

1. **Dictionary** (`recipe_inputs`): the default dictionary less every held-out lay name of the test and
   development slices (as the lay figures are measured).
2. **Queries and the names they are scored against**: each HPO layperson name (``.../layperson``) becomes a
   query whose right answers are its concept's other names. The queries leave the dictionary the re-ranker
   trains on, and so does any name of a query's concept with the query's `name_key`, so a query never meets
   itself. A lay name equal to a test or development phrase is no query and stays a name, as in the default
   dictionary.
3. **Mining index**: a dense index of that dictionary with the shipped linker-en, the retriever the re-ranker
   serves, whose top 64 names give each query its hard negatives (`linker.train.rerank`).
4. **Training** from linker-en's tensors (embeddings frozen, so the release stays small), then **pack**: the
   tensors that differ from the base MiniLM's (``bert.*``, ``classifier.*``), fp16, into
   ``linker/models/<name>/``.

Steps resume: a trained model under ``--work`` is kept when its config is the recipe's and its inputs' digests
(`inputs_digest`, written beside the weights as ``release_inputs.json``) are the inputs the recipe builds now.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from linker.errors import ConfigError
from linker.folders import sha256_file
from linker.models import RERANKERS, WEIGHTS, release_folder, write_release
from linker.train.rerank import RerankConfig

log = logging.getLogger(__name__)

INPUTS_FILE = "release_inputs.json"
LAY_SUFFIX = "/layperson"  # HPO's lay synonym types: SY_EXACT/layperson, SY_RELATED/layperson, ...
IGNORED = ("device", "threads", "mine_index")  # how and where a run ran, not what it learned


@dataclass(frozen=True)
class RerankRecipe:
    name: str
    version: str
    base: str  # the offline encoder alias the release's tensors go on top of
    start: str  # the encoder whose tensors training starts from
    config: RerankConfig
    summary: str
    choices: str
    rerank_k: int = 4  # candidates a mention it re-scores behind the default index (the Makefile's --rerank-k)


RERANK_RECIPES = {
    "linker-rerank-en": RerankRecipe(
        name="linker-rerank-en", version="1", base="minilm", start="linker-en",
        # 4,309 queries x (1 positive + 7 negatives), 8 epochs: 2,160 steps, 59 min on one CPU thread.
        config=RerankConfig(lr=3e-5, batch_size=16, negatives=7, epochs=8, max_queries=0, freeze_embeddings=True,
                            checkpoint_every=0),
        summary="English cross-encoder re-ranker for everyday (lay) wording of symptoms and diseases, behind the "
                "default dense linker-en index (all-MiniLM-L6-v2 with linker-en's layers, re-trained as a "
                "cross-encoder; embeddings frozen)",
        choices="Chosen on the lay development slice only (eval/rerank/lay_dev.md, eval/rerank/lay_dev_one_stage.md): "
                "a first stage on dictionary synonyms did not help lay wording (the re-ranker alone 33.2 Acc@1 at "
                "k = 32 after 1,000 steps, below the retriever's 64.9); lay queries alone, from linker-en, 4 and 8 "
                "epochs: 66.8 and 67.9 Acc@1 at k = 4 with the retriever weight `linker calibrate` chooses, against "
                "64.9 for the retriever alone; the two-stage model was within 0.5 point (68.4) and is not "
                "reproducible by one command. Six re-rankers scored on dev in all (eval/rerank/lay_dev.md); no test-set figure was looked at.",
    ),
}
assert set(RERANK_RECIPES) == set(RERANKERS) and all(RERANK_RECIPES[n].base == b for n, b in RERANKERS.items())


def table_digest(table) -> str:
    """sha256 of a concept table's rows (every column, in order): what training reads, whatever the file's
    metadata or compression."""
    digest = hashlib.sha256()
    for row in table.to_pylist():
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n")
    return digest.hexdigest()


def inputs_digest(dict_path: Path, queries: Path) -> dict:
    """What a trained re-ranker learned from: its dictionary's rows and its queries file."""
    import pyarrow.parquet as pq

    return {"dictionary_rows_sha256": table_digest(pq.read_table(dict_path)), "queries_sha256": sha256_file(queries)}


def split_queries(ids: list[str], names: list[str], types: list[str], phrases: set[str]
                  ) -> tuple[list[tuple[str, str]], list[bool]]:
    """(queries as (name, concept_id), which dictionary rows stay): every lay name not equal (`name_key`) to a test
    or development phrase is a query; a row leaves when it has a query's concept and `name_key`."""
    from linker.sources.default import name_key

    keys = [name_key(n) for n in names]
    is_query = [t.endswith(LAY_SUFFIX) and k not in phrases for t, k in zip(types, keys)]
    query_keys = {(c, k) for c, k, q in zip(ids, keys, is_query) if q}
    return [(n, c) for n, c, q in zip(names, ids, is_query) if q], [(c, k) not in query_keys for c, k in zip(ids, keys)]


def recipe_inputs(recipe: RerankRecipe, work: Path) -> tuple[Path, Path, dict]:
    """Build the dictionary the re-ranker trains on and its lay queries under `work`; returns their paths and
    counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from linker.dictionary import SourceSpec, build_dictionary, read_concept_table
    from linker.fileio import atomic_file
    from linker.sources import SourceOptions
    from linker.sources.default import LAY_DEV_HELDOUT, LAY_HELDOUT
    from linker.train.release import held_out_phrases

    work.mkdir(parents=True, exist_ok=True)
    full = work / f"{recipe.name}.default.parquet"
    build_dictionary([SourceSpec("default", ())], full, overwrite=True,
                     options=SourceOptions(exclude_names=(str(LAY_HELDOUT), str(LAY_DEV_HELDOUT))))
    table = read_concept_table(full).table
    _pairs, phrases, files = held_out_phrases()
    ids, names, types = (table.column(c).to_pylist() for c in ("concept_id", "name", "term_type"))
    queries, keep = split_queries(ids, names, types, phrases)
    lay = [t.endswith(LAY_SUFFIX) for t in types]
    dict_path, queries_path = work / f"{recipe.name}.dict.parquet", work / f"{recipe.name}.queries.tsv"
    with atomic_file(dict_path) as tmp:
        pq.write_table(table.filter(pa.array(keep)), tmp, compression="zstd")
    with atomic_file(queries_path) as tmp:
        Path(tmp).write_text("text\tconcept_ids\torigin\n" + "".join(
            f"{n}\t{c}\thpo_layperson_train\n" for n, c in queries), encoding="utf-8")
    full.unlink()
    counts = {"dictionary_rows_read": len(ids), "lay_rows": sum(lay),
              "lay_rows_equal_to_a_test_or_dev_phrase": sum(lay) - len(queries), "queries": len(queries),
              "dictionary_rows": sum(keep), "held_out_files_sha256": files}
    log.info("re-ranker inputs under %s: %s", work, counts)
    return dict_path, queries_path, counts


def trained_reranker(recipe: RerankRecipe, work: Path, dict_path: Path, queries: Path, config: RerankConfig) -> Path:
    """The trained model folder under `work`: kept when current (config, start encoder and inputs), else trained
    (the mining index built first)."""
    from linker.train.common import CONFIG_FILE
    from linker.train.rerank import train_rerank

    out = work / f"{recipe.name}.model"
    digest = inputs_digest(dict_path, queries)
    if (out / CONFIG_FILE).is_file() and (out / INPUTS_FILE).is_file():
        done = json.loads((out / CONFIG_FILE).read_text())
        same = {k: v for k, v in done["config"].items() if k not in IGNORED} == {
            k: v for k, v in asdict(config).items() if k not in IGNORED}
        if same and done["base_encoder"] == recipe.start and json.loads((out / INPUTS_FILE).read_text()) == digest:
            log.info("trained re-ranker %s is current, kept", out)
            return out
    mining = work / f"{recipe.name}.mining"
    from linker.index import build_index
    from linker.index.dense import DenseConfig

    build_index(dict_path, kind="dense", out=mining, config=DenseConfig(encoder=recipe.start), overwrite=True)
    train_rerank(dict_path, encoder=recipe.start, out=out, train_specs=(f"lay:{queries}",),
                 config=replace(config, mine_index=str(mining)), show_progress=True, overwrite=True)
    (out / INPUTS_FILE).write_text(json.dumps(digest, indent=2) + "\n", encoding="utf-8")
    return out


def compact_cost(full, shipped, queries: list[tuple[str, str]], names: list[str], concepts: list[str],
                 group: int = 8) -> dict:
    """What fp16 storage costs: the logits of the fp32 trained model and of the shipped release on groups of
    (query, name) pairs: each query against `group` names, its concept's first among them; the largest logit
    difference and how often both pick the same name of the group."""
    import numpy as np

    first = {}
    for name, concept in zip(names, concepts):
        first.setdefault(concept, name)
    ordered = list(first)
    where = {c: i for i, c in enumerate(ordered)}
    left, right = [], []
    for text, concept in queries:
        if concept not in where:
            continue
        i = where[concept]
        for j in range(group):  # its concept and the next ones in the dictionary's order (HPO: often siblings)
            left.append(text)
            right.append(first[ordered[(i + j) % len(ordered)]])
    a, b = full.score(left, right).reshape(-1, group), shipped.score(left, right).reshape(-1, group)
    return {"pairs": int(a.size), "groups": int(a.shape[0]), "max_abs_logit_difference": round(float(np.abs(a - b).max()), 4),
            "top1_agreement": round(float((a.argmax(1) == b.argmax(1)).mean()), 4)}


def dev_metrics(release: Path, work: Path, rerank_k: int) -> dict:
    """Lay development Acc@1 of the dense linker-en index over the default dictionary less every held-out name
    (`linker.train.release.dev_accuracy`'s), without and with the re-ranker at `rerank_k` and the retriever weight
    `linker calibrate` chooses on the same phrases (so in-sample for that one weight); never the test set."""
    from linker.eval.calibrate import calibrate
    from linker.sources.default import LAY_DEV
    from linker.train.release import dev_accuracy

    dense = dev_accuracy("linker-en", work, "linker-en-shipped")  # builds (or keeps) the development index
    summary = calibrate(work / "dev-index-linker-en-shipped", f"lay:{LAY_DEV}", rerank=release, rerank_k=rerank_k,
                        progress=False)
    mixing = summary["mixing"]
    return {"phrases": summary["mentions"], "rerank_k": rerank_k, "dense_acc1": dense["acc1"],
            "dense_acc5": dense["acc5"], "retriever_weight": round(mixing["retriever_weight"], 4),
            "reranked_acc1": round(100 * mixing["accuracy_at_1_by_weight"][mixing["retriever_weight"]], 2),
            "gold_among_reranked": round(100 * mixing["gold_among_reranked"], 2)}


def train_reranker_release(name: str, *, work: str | Path = "work/release", out: str | Path | None = None,
                           device: str | None = None, threads: int | None = None) -> dict:
    """Train the re-ranker release `name` and write it over ``linker/models/<name>/`` (or `out`)."""
    from linker.fileio import Input, check_output
    from linker.models import MANIFEST, check_release_out
    from linker.rerank import CrossEncoder, init_cross_encoder

    if name not in RERANK_RECIPES:
        raise ConfigError(f"unknown re-ranker release {name!r}; choose {', '.join(RERANK_RECIPES)}")
    recipe, work = RERANK_RECIPES[name], Path(work)
    out = Path(out) if out else release_folder(name)
    check_release_out(out, "reranker")
    check_output(out / MANIFEST, inputs=[Input(work, "--work")], overwrite=True, option="--out", release=out)
    started = time.perf_counter()
    config = replace(recipe.config, **{k: v for k, v in (("device", device), ("threads", threads)) if v})
    dict_path, queries_path, counts = recipe_inputs(recipe, work)
    trained = trained_reranker(recipe, work, dict_path, queries_path, config)
    base = init_cross_encoder(recipe.base, precision="fp32")
    full = CrossEncoder.load(trained, precision="fp32")
    from linker.train.common import CONFIG_FILE, METRICS_FILE
    from linker.train.release import changed_tensors

    tensors = changed_tensors(base.model, full.model)
    metrics = json.loads((trained / METRICS_FILE).read_text())
    info = {
        "summary": recipe.summary, "languages": ["en"], "choices": recipe.choices,
        "command": f"linker train release {name}" + (f" --device {device}" if device else ""),
        "built_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "training": {
            "method": "cross-encoder over (mention, name) pairs, listwise softmax loss of one positive among 7 hard "
                      "negatives mined by the dense linker-en index of the same dictionary (linker.train.rerank)",
            "start": recipe.start,
            "config": {k: v for k, v in asdict(recipe.config).items() if k not in IGNORED},
            "inputs": counts, "inputs_sha256": json.loads((trained / INPUTS_FILE).read_text()),
            "data": metrics["extra"].get("data"), "steps": metrics["extra"]["steps"],
            "seconds": metrics["extra"]["train_seconds"], "hardware": metrics["extra"]["hardware"],
            "precision": metrics["extra"]["precision"],
            "trained_at": json.loads((trained / CONFIG_FILE).read_text()).get("started_at"),
            "final_epoch_loss": metrics["epochs"][-1]["mean_loss"],
        },
    }
    # written once without its card, so that it loads as a user loads it for the fp16 check and the dev figures
    manifest = write_release(out, name=name, version=recipe.version, kind="reranker", base=recipe.base,
                             base_revision=base.info.sha256.removeprefix("base:"), tensors=tensors,
                             card="(written below)\n", info=info)
    shipped = CrossEncoder.from_release(str(out), precision="fp32")
    import pyarrow.parquet as pq

    table = pq.read_table(dict_path, columns=["concept_id", "name"])
    lines = queries_path.read_text(encoding="utf-8").splitlines()[1:]
    queries = [(t, c) for t, c, _ in (line.split("\t") for line in lines[::10])]
    info["compact_cost"] = compact_cost(full, shipped, queries, table.column("name").to_pylist(),
                                        table.column("concept_id").to_pylist())
    info["dev"] = dev_metrics(out, work, recipe.rerank_k)
    info["release_seconds"] = round(time.perf_counter() - started, 1)
    info["sizes"] = {"weights_bytes": (out / WEIGHTS).stat().st_size,
                     "fp32_trained_tensors_bytes": sum(t.numel() * 4 for t in tensors.values()),
                     "whole_fp32_model_bytes": sum(t.numel() * 4 for t in full.model.state_dict().values())}
    return write_release(out, name=name, version=recipe.version, kind="reranker", base=recipe.base,
                         base_revision=manifest["base_revision"], tensors=tensors,
                         card=reranker_card(name, info, manifest), info=info)


def reranker_card(name: str, info: dict, manifest: dict) -> str:
    t, s, c, d = info["training"], info["sizes"], info["compact_cost"], info["dev"]
    hw = t["hardware"]
    return "\n".join([
        f"# {name} {manifest['version']}", "",
        f"{info['summary']}. Base: `{manifest['base']}` ({manifest['base_revision']}); this release holds only the "
        f"{manifest['tensors']['count']} tensors training changed ({manifest['tensors']['parameters']:,} parameters, "
        "fp16 safetensors), put on top of the base after their sha256 is checked.", "",
        "## Intended use", "",
        "Re-scoring a linker index's top candidates for short English mentions of symptoms, diseases and adverse "
        f"events, lay or clinical: `linker index build ... --reranker {name}` binds it (`make demo` binds it to the "
        "default index), or `--rerank " + name + "` at link time. `linker calibrate` then chooses how much of the "
        "retriever's score to mix in, on held-in data.", "",
        "## Limits", "",
        "- Trained on terminology names only: HPO's layperson synonyms as queries against the default dictionary's "
        "other names. No annotated corpus mention, no test phrase.",
        "- It reorders what the retriever found; a concept outside the top k stays out.",
        "- Its logits are not probabilities; a calibrated index turns them into confidences and decisions.",
        "- Not a diagnostic tool.", "",
        "## Training data and licences", "",
        "The default dictionary (ICD-10-CM April 2026 from simple-icd-10-cm, public domain; English HPO 2025-01-16 "
        "with its layperson synonyms, HPO licence: cite, show the version, do not alter), less the lay test and "
        "development slices' held-out names (`linker/data/lay/`).",
        f"Inputs: {t['inputs']['queries']:,} lay queries ({t['inputs']['lay_rows_equal_to_a_test_or_dev_phrase']} lay "
        f"names equal to a test or development phrase left out) against {t['inputs']['dictionary_rows']:,} names "
        f"({t['inputs']['dictionary_rows_read']:,} read); digests `{json.dumps(t['inputs_sha256'])}`.", "",
        "## How it was trained", "",
        f"`{info['command']}`. {t['method']}; from `{t['start']}`'s tensors; config `{json.dumps(t['config'])}`. "
        f"{t['steps']:,} steps in {t['seconds'] / 60:.1f} min on {hw['device']} ({hw['cpu_count']} CPU cores, "
        f"{hw['torch_threads']} torch thread(s), {t['precision']}), started {t['trained_at']}; final epoch loss "
        f"{t['final_epoch_loss']}. The release command's own run (inputs, packing, the fp16 check; training resumes "
        f"from `--work` when current) took {info['release_seconds'] / 60:.1f} min.", "",
        f"How the settings were chosen: {info['choices']}", "",
        "## Size and what the compact form costs", "",
        f"Shipped weights {s['weights_bytes'] / 1e6:.1f} MB (fp16); the same tensors in fp32 "
        f"{s['fp32_trained_tensors_bytes'] / 1e6:.1f} MB; the whole trained model in fp32 "
        f"{s['whole_fp32_model_bytes'] / 1e6:.1f} MB. fp16 storage against the fp32 trained weights, on "
        f"{c['pairs']:,} pairs ({c['groups']} lay queries, 8 names each): largest logit difference "
        f"{c['max_abs_logit_difference']}, same top name in {100 * c['top1_agreement']:.2f}% of the groups.", "",
        "## Metrics (development slice of the lay set; never the test set)", "",
        f"Dense linker-en index over the default dictionary less every held-out lay name; the {d['phrases']} HPO "
        "layperson phrases of the development slice (`linker/data/lay/lay_dev.tsv`). The re-ranker re-scores the "
        f"top {d['rerank_k']} ({d['gold_among_reranked']:.1f}% of the phrases have their concept among them), mixed "
        f"with the retriever's score at the weight `linker calibrate` chooses on the same phrases ({d['retriever_weight']}).", "",
        "| linker | Acc@1 |", "|---|---:|",
        f"| dense linker-en | {d['dense_acc1']:.2f} |", f"| + {manifest['name']} | {d['reranked_acc1']:.2f} |", "",
        "Test-set figures (lay set, scored once): `eval/shipped/report.md`.", "",
    ])
