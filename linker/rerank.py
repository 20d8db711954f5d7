"""Cross-encoder re-ranking: (mention, candidate name) read together by one transformer -> a score.

A bi-encoder or tf-idf retriever compares a mention and a name through two independent
vectors; a cross-encoder attends across both texts at once, which is slower (one forward pass
per pair) but sharper, so it re-scores only the retriever's top `k` concepts (32 by default: on
NCBI-disease the tf-idf retriever's Acc@32 is within a point of its Acc@100, and 32 pairs per
mention keep CPU latency in tens of milliseconds with MiniLM). The pair is (mention, the
concept's best-matching name), the name the retriever already chose.

A re-ranker is a Hugging Face sequence-classification folder with one output (the layout of
sentence-transformers' CrossEncoder models), written by `linker train rerank` with a marker
``linker_reranker.json``; any such local folder or hub name loads. Its identity for calibration
is the sha256 of its weights.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from linker.batching import distinct_ids
from linker.errors import ConfigError, LinkerError, MissingInputError
from linker.extras import require
from linker.precision import autocast, check_precision, resolve_precision

log = logging.getLogger(__name__)

RERANKER_MARKER = "linker_reranker.json"
RERANKER_DIR = "reranker"  # an index folder's bound re-ranker (`linker index build --reranker`)
DEFAULT_RERANK_K = 32
MAX_LENGTH = 64  # tokens per (mention, name) pair: NCBI/Cantemist mentions and names fit in ~30
BATCH_SIZE = 128


def reranker_precision(precision: str, device: str) -> str:
    """fp32 or bf16, decided as for every model (`linker.precision`: auto = bf16 only where the device runs it
    natively; emulated bf16 is slower than fp32). int8 is not offered: the re-ranker was never checked in it."""
    check_precision(precision, allow_none=False)
    chosen = resolve_precision(precision, device=device)
    if chosen == "int8":
        raise ConfigError("re-ranker precision int8 is not supported; use auto, bf16 or fp32")
    return chosen


def weights_file(folder: Path) -> Path | None:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    return None


@dataclass(frozen=True)
class RerankerInfo:
    """What a manifest or report records about a re-ranker."""

    name: str
    path: str
    sha256: str

    @property
    def scorer(self) -> str:
        return f"rerank:{self.sha256}"


class CrossEncoder:
    """Scores (mention, name) pairs; higher = more likely the same concept. Logits, not probabilities."""

    def __init__(self, info: RerankerInfo, model, tokenizer, *, device: str = "cpu", precision: str = "auto") -> None:
        self.info = info
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.precision = reranker_precision(precision, device)

    @property
    def scorer(self) -> str:
        return self.info.scorer

    @classmethod
    def load(cls, name_or_path: str | Path, *, device: str = "cpu", precision: str = "auto") -> CrossEncoder:
        """Load a re-ranker folder, a shipped re-ranker (by its name in `linker.models.RERANKERS`) or a hub name;
        refuses a model with more than one output."""
        from linker.models import shipped_reranker

        if (shipped := shipped_reranker(name_or_path)) is not None:
            return cls.from_release(shipped, device=device, precision=precision)
        path = Path(name_or_path)
        local = path.exists()
        if local and not (path / "config.json").is_file():
            raise MissingInputError(f"{path}: not a re-ranker folder (no config.json); train one with "
                                    "`linker train rerank`")
        if not local and str(name_or_path).startswith((".", "/")):
            raise MissingInputError(f"{name_or_path}: no such re-ranker folder; train one with `linker train rerank`")
        if local:
            from linker.folders import check_model_folder

            # Before transformers reads it: every file inside the folder (links included), regular, bounded.
            check_model_folder(path, what="a re-ranker folder", fix="pass a folder written by `linker train rerank`")
        require("transformers", extra="dense", what="a re-ranker")
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from linker.encoders import _hub_offline
        from linker.folders import sha256_file

        if not sys.stderr.isatty():
            hf_logging.disable_progress_bar()
        offline = local or _hub_offline()
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(name_or_path), local_files_only=offline)
            model = AutoModelForSequenceClassification.from_pretrained(str(name_or_path), local_files_only=offline)
        except Exception as error:  # transformers raises OSError, ValueError, HTTP errors...
            where = "the folder" if local else "the Hugging Face hub or cache (is it a local folder you meant?)"
            raise LinkerError(f"re-ranker {name_or_path}: could not be loaded from {where}: {error}") from error
        if model.config.num_labels != 1:
            raise ConfigError(f"re-ranker {name_or_path}: a cross-encoder with one output (a score) is expected, "
                              f"found {model.config.num_labels} labels")
        weights = weights_file(path) if local else None
        sha = sha256_file(weights) if weights is not None else f"hub:{name_or_path}"
        info = RerankerInfo(name=path.name if local else str(name_or_path), path=str(name_or_path), sha256=sha)
        model.to(device).eval()
        log.info("loaded re-ranker %s (sha256 %s)", info.name, sha[:12])
        return cls(info, model, tokenizer, device=device, precision=precision)

    @classmethod
    def from_release(cls, name: str, *, device: str = "cpu", precision: str = "auto") -> CrossEncoder:
        """A shipped re-ranker: its base with a new head, the release's tensors (checked against their sha256) put
        on top; its identity for calibration is the sha256 of the release's weights."""
        from linker.models import WEIGHTS, overlay, read_release

        release = read_release(name)
        if release.manifest["kind"] != "reranker":
            raise ConfigError(f"{release.folder}: a release of kind {release.manifest['kind']!r}, not a re-ranker")
        reranker = init_cross_encoder(release.base, device=device, precision=precision)  # on `device` already
        overlay(reranker.model, release)
        reranker.model.eval()
        reranker.info = RerankerInfo(name=release.name, path=str(release.folder),
                                     sha256=release.manifest["files"][WEIGHTS]["sha256"])
        return reranker

    def score(self, mentions: Sequence[str], names: Sequence[str], *, batch_size: int = BATCH_SIZE) -> np.ndarray:
        """(n,) float32 logits of the pairs (mentions[i], names[i]); pairs batched by length.

        Each distinct pair is scored once, so equal pairs get equal scores: in bf16 a pair's logit moves with the
        padding of the batch it lands in (4.375 or 4.406 for one NCBI pair), and concepts that share a name would
        otherwise have their tie decided by that noise instead of the index's tie order.
        """
        torch = require("torch", extra="dense", what="a re-ranker")

        if len(mentions) != len(names):
            raise ValueError("mentions and names must have the same length")
        pairs = list(zip(mentions, names))
        inverse, firsts, _copies = distinct_ids(pairs)
        distinct = [pairs[i] for i in firsts]
        scores = np.empty(len(distinct), dtype=np.float32)
        order = sorted(range(len(distinct)), key=lambda i: len(distinct[i][0]) + len(distinct[i][1]))
        with torch.inference_mode(), autocast(self.precision, self.device):
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                scores[rows] = self.logits([distinct[i][0] for i in rows],
                                           [distinct[i][1] for i in rows]).float().cpu().numpy()
        return scores[inverse]

    def logits(self, mentions: Sequence[str], names: Sequence[str]):
        """(batch,) logits in the order of the pairs, with gradients when the caller has them on
        (training); run as length buckets (`linker.encoders.in_length_buckets`: a training batch
        holds each mention with its positive and its negatives, of every length)."""
        from linker.encoders import in_length_buckets

        mentions, names = list(mentions), list(names)
        ids = self.tokenizer(mentions, names, truncation="longest_first", max_length=MAX_LENGTH)["input_ids"]

        def run(rows: np.ndarray):
            features = self.tokenizer([mentions[i] for i in rows], [names[i] for i in rows], padding=True,
                                      truncation="longest_first", max_length=MAX_LENGTH, return_tensors="pt")
            return self.model(**features.to(self.device)).logits[:, 0]

        return in_length_buckets(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)), run)

    def save(self, folder: str | Path, *, extra: dict | None = None) -> None:
        """Write the model (safetensors), tokenizer and the marker into `folder`."""
        folder = Path(folder)
        self.model.save_pretrained(str(folder), safe_serialization=True)
        self.tokenizer.save_pretrained(str(folder))
        (folder / RERANKER_MARKER).write_text(json.dumps({"kind": "cross-encoder", **(extra or {})}, indent=1))


RUNTIMES = ("auto", "numpy", "torch")


def load_reranker(name_or_path: str | Path, *, device: str = "cpu", precision: str = "auto", runtime: str | None = None,
                  threads: int | None = None):
    """The re-ranker a query path (link, normalize, serve, eval) loads: `linker.runtime.RuntimeCrossEncoder` (numpy,
    no torch import) for fp32 on the CPU where the model is a BERT cross-encoder, else `CrossEncoder.load` (torch).
    The same logits within float rounding (tests/test_rerank.py). `runtime` as `linker.encoders.load_query_encoder`'s:
    auto (``$LINKER_RUNTIME`` when set), numpy (refuses a model it cannot run) or torch."""
    import os

    runtime = runtime or os.environ.get("LINKER_RUNTIME") or "auto"
    if runtime not in RUNTIMES:
        from linker.errors import UnknownNameError

        raise UnknownNameError("re-ranker runtime", runtime, RUNTIMES)
    if runtime != "torch" and precision == "fp32" and device == "cpu":
        reranker = _runtime_reranker(name_or_path, threads)
        if reranker is not None:
            log.info("loaded re-ranker %s (sha256 %s) in the numpy runtime", reranker.info.name, reranker.info.sha256[:12])
            return reranker
    if runtime == "numpy":
        raise ConfigError(f"re-ranker {name_or_path}: the numpy runtime runs BERT cross-encoder folders and shipped "
                          f"re-rankers in fp32 on the CPU (here precision {precision}, device {device}); use runtime "
                          "'auto' or 'torch'")
    return CrossEncoder.load(name_or_path, device=device, precision=precision)


def _runtime_reranker(name_or_path: str | Path, threads: int | None):
    """`load_reranker`'s numpy re-ranker, or None (a hub name, a folder that is not a BERT cross-encoder)."""
    from linker.folders import check_model_folder, sha256_file
    from linker.models import WEIGHTS, read_release, shipped_reranker
    from linker.runtime import load_runtime_cross_encoder

    if (shipped := shipped_reranker(name_or_path)) is not None:
        release = read_release(shipped)  # every file checked against its sha256
        if release.manifest["kind"] != "reranker":
            raise ConfigError(f"{release.folder}: a release of kind {release.manifest['kind']!r}, not a re-ranker")
        from linker.encoders import ensure_e5_small, resolve_encoder

        spec = resolve_encoder(release.base)
        if spec.builtin == "e5-small":
            ensure_e5_small(Path(spec.path))
        info = RerankerInfo(name=release.name, path=str(release.folder), sha256=release.manifest["files"][WEIGHTS]["sha256"])
        return load_runtime_cross_encoder(None, info, max_length=MAX_LENGTH, base=spec.path, release=release.folder,
                                          threads=threads)
    path = Path(name_or_path)
    if not (path / "config.json").is_file():
        return None  # not a local re-ranker folder: `CrossEncoder.load` says what it is
    check_model_folder(path, what="a re-ranker folder", fix="pass a folder written by `linker train rerank`")
    if weights_file(path) != path / "model.safetensors":
        return None
    info = RerankerInfo(name=path.name, path=str(name_or_path), sha256=sha256_file(path / "model.safetensors"))
    return load_runtime_cross_encoder(path, info, max_length=MAX_LENGTH, threads=threads)


def init_cross_encoder(base: str, *, device: str = "cpu", precision: str = "auto", seed: int = 0) -> CrossEncoder:
    """A new cross-encoder from a base encoder (alias, folder or hub name): its transformer plus a
    freshly initialised one-output head (seeded). A shipped encoder (``linker-en``) starts from its trained
    tensors, as it encodes, not from the base under them."""
    torch = require("torch", extra="dense", what="a re-ranker")
    require("transformers", extra="dense", what="a re-ranker")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from linker.encoders import ensure_e5_small, resolve_encoder

    spec = resolve_encoder(base)
    if spec.builtin == "e5-small":
        ensure_e5_small(Path(spec.path))
    local = spec.revision != "hub"
    torch.manual_seed(seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "some weights newly initialised": the head, as intended
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.path, local_files_only=local)
        model = AutoModelForSequenceClassification.from_pretrained(spec.path, num_labels=1, local_files_only=local)
    except Exception as error:
        raise LinkerError(f"base encoder {base!r} ({spec.path}) could not be loaded as a transformer: {error}") from error
    finally:
        hf_logging.set_verbosity(verbosity)
    if spec.release is not None:
        from linker.models import overlay, read_release

        overlay(model.base_model, read_release(spec.release))
    info = RerankerInfo(name=spec.name, path=spec.path, sha256=f"base:{spec.revision}")
    return CrossEncoder(info, model.to(device), tokenizer, device=device, precision=precision)


def bind_reranker(source: str | Path, index_tmp: Path) -> dict:
    """Copy a local re-ranker folder into an index folder being built; return its manifest entry."""
    import shutil

    from linker.models import shipped_reranker

    if (shipped := shipped_reranker(source)) is not None:  # a shipped release: the index holds it whole
        from linker.folders import sha256_file

        reranker, target = CrossEncoder.from_release(shipped), index_tmp / RERANKER_DIR
        reranker.save(target, extra={"release": reranker.info.name, "release_sha256": reranker.info.sha256})
        return {"name": reranker.info.name, "source_path": str(source), "sha256": sha256_file(weights_file(target)),
                "path": RERANKER_DIR}
    source = Path(source)
    if not (source / "config.json").is_file():
        raise MissingInputError(f"{source}: not a re-ranker folder (no config.json); --reranker takes a folder "
                                "written by `linker train rerank`")
    reranker = CrossEncoder.load(source)  # refuses a folder that does not load as a one-output cross-encoder
    target = index_tmp / RERANKER_DIR
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.checkpoint", ".*"))
    return {"name": reranker.info.name, "source_path": str(source.resolve()), "sha256": reranker.info.sha256,
            "path": RERANKER_DIR}
