"""`linker train biosyn|sap|rerank`: fine-tune a dense encoder (a model folder for `index build --encoder`) or a re-ranker (for `--rerank`)."""

from __future__ import annotations

from pathlib import Path

import typer

from linker.cli._app import app
from linker.cli.common import echo_json
from linker.progress import on_terminal

train_app = typer.Typer(help="Train dense encoders (BioSyn, SapBERT-style self-alignment) and cross-encoder re-rankers.", no_args_is_help=True)
app.add_typer(train_app, name="train")

_DEVICE_HELP = "cpu, cuda, or auto (a GPU when present)."
TRAIN_MODULES = ("torch", "sentence_transformers", "transformers", "safetensors")


def _check_train_extra(command: str) -> None:
    """One error line naming the `train` extra when torch & co. are missing, before linker.train (torch) is imported."""
    from linker.extras import check

    check(TRAIN_MODULES, extra="train", what=command)

_PRECISION_HELP = "Forward passes in fp32 or bf16 (weights and optimizer stay fp32); auto = bf16 where the processor runs it natively."


@train_app.command("biosyn")
def biosyn_cli(
    train: list[str] = typer.Option(..., "--train", help="Training mentions as a dataset spec, e.g. "
                                    "'pubtator:NCBItrainset_corpus.txt#biosyn'; repeat to add dev."),
    dict_path: Path = typer.Option(..., "--dict", help="Concept table (.parquet) to link to."),
    encoder: str = typer.Option(..., "--encoder", help="Base encoder: minilm, e5-small, a model folder or a hub name."),
    out: Path = typer.Option(..., "--out", "-o", help="Output model folder, e.g. models/ncbi-biosyn."),
    topk: int = typer.Option(20, "--topk", help="Candidates per mention (BioSyn: 20)."),
    dense_ratio: float = typer.Option(0.5, "--dense-ratio", help="Share of candidates from the dense encoder (BioSyn: 0.5)."),
    lr: float = typer.Option(1e-5, "--lr", help="Learning rate (BioSyn: 1e-5)."),
    batch_size: int = typer.Option(16, "--batch-size", help="Mentions per step (BioSyn: 16)."),
    epochs: int = typer.Option(10, "--epochs", help="Epochs; candidates are retrieved afresh each (BioSyn NCBI: 10)."),
    freeze_layers: int = typer.Option(0, "--freeze-layers", help="Freeze embeddings and the first N transformer layers."),
    freeze_embeddings: bool = typer.Option(False, "--freeze-embeddings", help="Freeze the token embeddings."),
    max_queries: int = typer.Option(None, "--max-queries", help="Train on a seeded sample of this many mentions."),
    max_seconds: float = typer.Option(None, "--max-seconds", help="Time budget: stop after the step that passes it and save the model."),
    max_length: int = typer.Option(25, "--max-length", help="Tokens per mention or name in training (BioSyn: 25; longer names are truncated)."),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    device: str = typer.Option("auto", "--device", help=_DEVICE_HELP),
    threads: int = typer.Option(None, "--threads", help="torch CPU threads."),
    precision: str = typer.Option("auto", "--precision", help=_PRECISION_HELP),
    resume: bool = typer.Option(False, "--resume", help="Continue from <out>.checkpoint after the last finished epoch; "
                                "on a finished --out, train it on to --epochs (a fresh optimizer)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out when it is a model folder that linker wrote."),
) -> None:
    """Fine-tune an encoder BioSyn-style (synonym marginalisation, candidates refreshed every epoch)."""
    _check_train_extra("linker train biosyn")
    from linker.encoders import check_encoder_name
    from linker.train.biosyn import BiosynConfig, train_biosyn

    check_encoder_name(encoder)  # before any data is read
    config = BiosynConfig(
        lr=lr, batch_size=batch_size, epochs=epochs, topk=topk, dense_ratio=dense_ratio,
        freeze_layers=freeze_layers, freeze_embeddings=freeze_embeddings, max_queries=max_queries,
        max_seconds=max_seconds, max_length=max_length, seed=seed, device=device, threads=threads, precision=precision,
    )
    summary = train_biosyn(list(train), dict_path, encoder=encoder, out=out, config=config, resume=resume,
                           show_progress=on_terminal(), overwrite=overwrite)
    echo_json(summary)


@train_app.command("sap")
def sap_cli(
    dict_path: Path = typer.Option(..., "--dict", help="Concept table (.parquet) whose synonyms are the training pairs."),
    encoder: str = typer.Option(..., "--encoder", help="Base encoder: minilm, e5-small, a model folder or a hub name."),
    out: Path = typer.Option(..., "--out", "-o", help="Output model folder, e.g. models/medic-sap."),
    max_pairs: int = typer.Option(None, "--max-pairs", help="Use at most this many synonym pairs (seeded sample)."),
    pairs_per_concept: int = typer.Option(50, "--pairs-per-concept", help="Cap of pairs per concept (SapBERT: 50)."),
    lr: float = typer.Option(2e-5, "--lr", help="Learning rate (SapBERT: 2e-5)."),
    batch_size: int = typer.Option(256, "--batch-size", help="Pairs per step (SapBERT: 256)."),
    epochs: int = typer.Option(1, "--epochs", help="Epochs (SapBERT: 1)."),
    freeze_layers: int = typer.Option(0, "--freeze-layers", help="Freeze embeddings and the first N transformer layers."),
    freeze_embeddings: bool = typer.Option(False, "--freeze-embeddings", help="Freeze the token embeddings (for e5-small the 250k-token matrix dominates the cost)."),
    seed: int = typer.Option(33, "--seed", help="Random seed (SapBERT: 33)."),
    device: str = typer.Option("auto", "--device", help=_DEVICE_HELP),
    threads: int = typer.Option(None, "--threads", help="torch CPU threads."),
    precision: str = typer.Option("auto", "--precision", help=_PRECISION_HELP),
    resume: bool = typer.Option(False, "--resume", help="Continue from <out>.checkpoint after the last finished epoch."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out when it is a model folder that linker wrote."),
    hard_negatives: int = typer.Option(0, "--hard-negatives", help="Names of other concepts mined per training name, nearest it under the starting encoder; each step adds one per pair (0: in-batch negatives only)."),
    negatives_from: Path = typer.Option(None, "--negatives-from", help="Concept table (.parquet) the hard negatives are mined from (default: --dict), e.g. the whole dictionary when --dict holds a few concepts."),
) -> None:
    """Self-alignment pretraining on the dictionary's own synonym pairs (SapBERT-style, cross-lingual when it can)."""
    _check_train_extra("linker train sap")
    from linker.encoders import check_encoder_name
    from linker.train.sap import SapConfig, train_sap

    check_encoder_name(encoder)  # before any data is read
    config = SapConfig(
        lr=lr, batch_size=batch_size, epochs=epochs, pairs_per_concept=pairs_per_concept, max_pairs=max_pairs,
        freeze_layers=freeze_layers, freeze_embeddings=freeze_embeddings, seed=seed, device=device, threads=threads,
        precision=precision, hard_negatives=hard_negatives,
    )
    summary = train_sap(dict_path, encoder=encoder, out=out, config=config, resume=resume, show_progress=on_terminal(),
                        overwrite=overwrite, negatives_from=negatives_from)
    echo_json(summary)


@train_app.command("release")
def release_cli(
    name: str = typer.Argument(..., help="The shipped model to retrain: linker-en, linker-multi or linker-rerank-en."),
    data: Path = typer.Option(None, "--data", help="The shared data folder (default: $LINKER_SHARED_DATA, else ../shared/data beside the repository)."),
    work: Path = typer.Option(Path("work/release"), "--work", help="Folder for the training table, the trained model and the development indexes (a rerun resumes from it)."),
    out: Path = typer.Option(None, "--out", "-o", help="Release folder to write (default: the package's own linker/models/NAME, replaced)."),
    device: str = typer.Option(None, "--device", help=_DEVICE_HELP),
    threads: int = typer.Option(None, "--threads", help="torch CPU threads."),
) -> None:
    """Retrain a model that ships with linker, exactly as shipped, and write its release (weights, card, manifest)."""
    _check_train_extra("linker train release")
    from linker.train.release import RECIPES, train_release
    from linker.train.rerank_release import RERANK_RECIPES

    if name not in RECIPES and name not in RERANK_RECIPES:
        from linker.errors import UnknownNameError

        raise UnknownNameError("release", name, (*RECIPES, *RERANK_RECIPES))
    if name in RERANK_RECIPES:  # needs no --data: the installed default dictionary and linker/data/lay
        from linker.train.rerank_release import train_reranker_release

        manifest = train_reranker_release(name, work=work, out=out, device=device, threads=threads)
    else:
        manifest = train_release(name, data=data, work=work, out=out, device=device, threads=threads)
    echo_json({"name": manifest["name"], "version": manifest["version"], "files": manifest["files"],
               "dev": manifest.get("dev"), "compact_cost": manifest.get("compact_cost")})


@train_app.command("rerank")
def rerank_cli(
    dict_path: Path = typer.Option(..., "--dict", help="Concept table (.parquet): its synonyms are the self-supervised queries."),
    encoder: str = typer.Option(..., "--encoder", help="Base model: minilm, e5-small, a model folder or a hub name. A folder from `train sap`/`train biosyn` on the same terminology is the better start (docs/training.md)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output re-ranker folder, e.g. models/ncbi-rerank."),
    train: list[str] = typer.Option(None, "--train", help="Labelled mentions as dataset specs (repeat), added to the synonym queries."),
    max_queries: int = typer.Option(20000, "--max-queries", help="Synonym queries (seeded sample); labelled mentions are all used."),
    synonyms_per_concept: int = typer.Option(2, "--synonyms-per-concept", help="Names of one concept used as queries."),
    negatives: int = typer.Option(7, "--negatives", help="Hard negatives per query (tf-idf's best names of other concepts)."),
    mine_preset: str = typer.Option(None, "--mine-preset", help="Mine the negatives with this tf-idf preset (e.g. medical-crossing, as the index the re-ranker will serve); default: the library's tf-idf defaults."),
    mine_index: Path = typer.Option(None, "--mine-index", help="Mine the negatives with this index folder's search (tf-idf, dense or hybrid; built from --dict): the retriever the re-ranker will serve."),
    lr: float = typer.Option(3e-5, "--lr", help="Peak learning rate (linear warm-up over --warmup of the steps, then linear decay to 0)."),
    warmup: float = typer.Option(0.1, "--warmup", help="Share of the steps with a linear warm-up."),
    batch_size: int = typer.Option(16, "--batch-size", help="Queries per step (each with 1 + negatives pairs)."),
    epochs: int = typer.Option(1, "--epochs", help="Epochs."),
    checkpoint_every: int = typer.Option(200, "--checkpoint-every", help="Steps between checkpoints (0: after each epoch only)."),
    max_seconds: float = typer.Option(None, "--max-seconds", help="Time budget: stop after the step that passes it and save the model."),
    precision: str = typer.Option("auto", "--precision", help=_PRECISION_HELP),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    device: str = typer.Option("auto", "--device", help=_DEVICE_HELP),
    threads: int = typer.Option(None, "--threads", help="torch CPU threads."),
    freeze_embeddings: bool = typer.Option(False, "--freeze-embeddings", help="Keep the base's embeddings; train the transformer layers and the head."),
    resume: bool = typer.Option(False, "--resume", help="Continue from <out>.checkpoint."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out when it is a re-ranker folder that linker wrote."),
) -> None:
    """Train a cross-encoder re-ranker (mention, name) -> score on dictionary synonyms and labelled mentions."""
    _check_train_extra("linker train rerank")
    from linker.index.tfidf import get_preset
    from linker.train.rerank import RerankConfig, train_rerank

    if mine_index is not None:  # read while training: neither the model folder nor its checkpoint may touch it
        from linker.fileio import Input, check_output
        from linker.train.common import checkpoint_dir

        for path, checked in ((out, overwrite), (checkpoint_dir(out), True)):
            check_output(path, inputs=[Input(mine_index, "--mine-index")], overwrite=checked, folder=True, option="--out")
    config = RerankConfig(
        mining=None if mine_preset is None else get_preset(mine_preset),
        mine_index=None if mine_index is None else str(mine_index),
        lr=lr, warmup=warmup, batch_size=batch_size, negatives=negatives, epochs=epochs, max_queries=max_queries,
        synonyms_per_concept=synonyms_per_concept, checkpoint_every=checkpoint_every, seed=seed, device=device,
        threads=threads, precision=precision, max_seconds=max_seconds, freeze_embeddings=freeze_embeddings,
    )
    summary = train_rerank(dict_path, encoder=encoder, out=out, train_specs=tuple(train or ()), config=config,
                           resume=resume, show_progress=on_terminal(), overwrite=overwrite)
    echo_json(summary)



def _rework_release(out: Path, phee_train: Path, phee_dev: Path, tac: Path, threads: int | None, flag: str) -> None:
    """`linker train extractor --tune-only` (the decoding chosen again, then the decision head) or `--decision-only`
    (the decision head alone) on the release in `out`, its tensors kept."""
    import shlex

    from linker.errors import ConfigError
    from linker.extract.train import learn_decision, tune_release

    if not (out / "manifest.json").is_file():
        raise ConfigError(f"{flag}: {out} holds no release (no manifest.json)")
    command = (f"linker train extractor --phee-train {shlex.quote(str(phee_train))} --phee-dev "
               f"{shlex.quote(str(phee_dev))} --tac {shlex.quote(str(tac))} --out {shlex.quote(str(out))} {flag}"
               + (f" --threads {threads}" if threads else ""))

    def report(message: str) -> None:
        typer.echo(message, err=True)

    if flag == "--decision-only":
        echo_json(learn_decision(out, phee_train, phee_dev, tac, threads=threads, command=command, report=report))
    else:
        echo_json(tune_release(out, phee_dev, tac, command=command, threads=threads, phee_train=phee_train,
                               report=report))

@train_app.command("extractor")
def extractor_cli(
    phee_train: Path = typer.Option(..., "--phee-train", help="PHEE train (brat zip or folder), e.g. ../shared/data/phee/train.zip."),
    phee_dev: Path = typer.Option(..., "--phee-dev", help="PHEE dev (brat zip or folder): for the choice of epoch and threshold."),
    tac: Path = typer.Option(..., "--tac", help="Folder of TAC 2017 training labels (XML); a seeded 20% of the files is held out as dev."),
    out: Path = typer.Option(..., "--out", "-o", help="Release folder to write, e.g. linker/models/linker-ae. A stopped run resumes after its last finished epoch from the training-state folder it keeps there."),
    epochs: int = typer.Option(3, "--epochs", help="Epochs (the best on dev is kept)."),
    lr: float = typer.Option(1e-4, "--lr", help="Learning rate of the trained transformer layers (the head: 10x)."),
    batch_size: int = typer.Option(16, "--batch-size", help="Windows per step."),
    max_length: int = typer.Option(128, "--max-length", help="Word pieces per window, special tokens included."),
    stride: int = typer.Option(96, "--stride", help="Window step in word pieces (windows overlap by the rest)."),
    frozen_layers: int = typer.Option(4, "--frozen-layers", help="Base layers left as they are (minilm has 6, e5-small 12)."),
    base: str = typer.Option("minilm", "--base", help="minilm (the English tagger, linker-ae) or e5-small (the multilingual one, linker-ae-multi)."),
    phee_limit: int = typer.Option(None, "--phee-limit", help="Train on a seeded sample of this many PHEE sentences."),
    tac_negative_share: float = typer.Option(0.25, "--tac-negative-share", help="Share of TAC windows without a reaction kept."),
    max_seconds: float = typer.Option(None, "--max-seconds", help="Time budget: stop training once past it, then choose and save."),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    threads: int = typer.Option(None, "--threads", help="torch CPU threads."),
    device: str = typer.Option("auto", "--device", help=_DEVICE_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out when it is a release folder."),
    tune_only: bool = typer.Option(False, "--tune-only", help="Do not train: choose the decoding of the release in --out again on the dev data and rewrite it."),
    decision_only: bool = typer.Option(False, "--decision-only", help="Do not train the tagger: learn the decision head of the release in --out again (adverse event, indication, beneficial, medical history) and rewrite it."),
) -> None:
    """Train the adverse-event span tagger (linker-ae, or linker-ae-multi with --base e5-small) on PHEE and TAC 2017
    and write it as a release folder."""
    _check_train_extra("linker train extractor")
    import shlex

    from linker.errors import ConfigError
    from linker.extract.extractor import KIND
    from linker.extract.train import TAGGER_NAMES, ExtractorTrainConfig, train_extractor
    from linker.train.common import pick_device
    from linker.fileio import Input, check_output
    from linker.models import check_release_out

    for value, option in ((phee_train, "--phee-train"), (phee_dev, "--phee-dev"), (tac, "--tac")):
        if not value.exists():
            raise ConfigError(f"{value}: no such file or folder ({option})")
    # The release's files are replaced one by one (manifest last): checked as files, none inside an input nor inside
    # a shipped model folder other than --out itself, which must hold a tagger if it holds a release.
    inputs = [Input(phee_train, "--phee-train"), Input(phee_dev, "--phee-dev"), Input(tac, "--tac")]
    check_output(out / "manifest.json", inputs=inputs, overwrite=True, option="--out", release=out)
    check_release_out(out, KIND)
    if decision_only or tune_only:
        _rework_release(out, phee_train, phee_dev, tac, threads, "--decision-only" if decision_only else "--tune-only")
        return
    from linker.extract.train import STATE

    if out.exists() and any(p.name != STATE for p in out.iterdir()) and not (out / "manifest.json").is_file():
        raise ConfigError(f"{out}: a folder that is not a release (no manifest.json); choose another --out")
    if out.exists() and (out / "manifest.json").is_file() and not overwrite:
        raise ConfigError(f"{out}: a release is there; pass --overwrite to replace it")
    if not 0.0 <= tac_negative_share <= 1.0:
        raise ConfigError(f"--tac-negative-share: expected a share from 0 to 1, found {tac_negative_share}")
    if base not in TAGGER_NAMES:
        raise ConfigError(f"--base: expected one of {', '.join(TAGGER_NAMES)}, found {base!r}")
    config = ExtractorTrainConfig(epochs=epochs, lr=lr, head_lr=10 * lr, batch_size=batch_size, max_length=max_length,
                                  stride=stride, frozen_layers=frozen_layers, phee_limit=phee_limit,
                                  tac_negative_share=tac_negative_share, max_seconds=max_seconds, seed=seed,
                                  threads=threads, device=pick_device(device), base=base, name=TAGGER_NAMES[base])
    given = [("--phee-train", phee_train), ("--phee-dev", phee_dev), ("--tac", tac), ("--out", out),
             ("--base", base if base != "minilm" else None), ("--epochs", epochs),
             ("--lr", lr), ("--batch-size", batch_size), ("--max-length", max_length), ("--stride", stride),
             ("--frozen-layers", frozen_layers), ("--phee-limit", phee_limit),
             ("--tac-negative-share", tac_negative_share), ("--max-seconds", max_seconds), ("--seed", seed),
             ("--threads", threads), ("--device", device if device != "auto" else None)]
    command = "linker train extractor " + " ".join(f"{o} {shlex.quote(str(v))}" for o, v in given if v is not None)
    echo_json(train_extractor(phee_train, phee_dev, tac, out, config, command=command,
                              report=lambda message: typer.echo(message, err=True)))
