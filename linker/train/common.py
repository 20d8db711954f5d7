"""What both trainers share: seeding, devices, freezing, encoding with gradients, checkpoints, outputs.

A trained model is handed on as a sentence-transformers folder (``model.save``) that
`linker.encoders.load_encoder(path)` and `linker index build --encoder PATH` read, with JSON
beside it: ``train_config.json`` (the resolved config, the base encoder, sha256 of every data
file) and ``train_metrics.json`` (loss per step and epoch, seconds, hardware).

Checkpoints: after each epoch the model, the optimizer state and the trainer state are written to
the sibling folder ``<out>.checkpoint`` (replaced whole, atomically), without pickle: the model as
safetensors (``model.save``), AdamW's moments as ``optimizer.safetensors`` with its param groups
as JSON. ``--resume`` continues from the epoch after the last completed one with the very same
optimizer state. The checkpoint is removed once the final folder is written; BioSyn's ``--resume``
on a finished folder then continues it for more ``--epochs`` from its weights with a fresh optimizer
(recorded in its metrics), which is not the same run as an uninterrupted longer one.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import platform
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import linker
from linker.errors import ConfigError, InputFormatError, MissingInputError
from linker.fileio import atomic_dir, check_output, native_read
from linker.folders import sha256_file

log = logging.getLogger(__name__)

CONFIG_FILE = "train_config.json"
METRICS_FILE = "train_metrics.json"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_GROUPS_FILE = "optimizer_groups.json"


def set_seed(seed: int) -> None:
    """Seed every generator; deterministic kernels where torch has them (warn, don't fail, elsewhere)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def pick_device(device: str | None) -> str:
    """`None`/"auto" -> "cuda" when a GPU is visible, else "cpu"."""
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but no CUDA GPU is visible; use --device cpu or auto")
    return device


def hardware(device: str, threads: int | None) -> dict:
    info = {
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "requested_threads": threads,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def transformer_of(model):
    """The Hugging Face model inside a SentenceTransformer (its first module)."""
    from linker.encoders import transformer_module

    return transformer_module(model)


def training_precision(precision: str, device: str) -> str:
    """fp32 or bf16 for the forward passes of training (`linker.precision`; auto = bf16 where the
    device runs it natively). Weights, optimizer state and the loss stay fp32."""
    from linker.precision import resolve_precision

    chosen = resolve_precision(precision, device=device)
    if chosen == "int8":
        raise ConfigError("--precision int8 is for inference only; train in auto, bf16 or fp32")
    return chosen


def freeze(model, *, embeddings: bool, layers: int) -> dict:
    """Freeze the token embeddings and/or the first `layers` transformer layers; returns counts.

    The Medical Crossing study froze the embeddings plus 4 or 10 layers; for a multilingual model
    the 250k-token embedding matrix is most of the parameters, and freezing it is most of the saving.
    """
    auto = transformer_of(model)
    blocks = getattr(getattr(auto, "encoder", None), "layer", None)
    if layers and blocks is None:
        raise ConfigError(f"{type(auto).__name__} has no encoder.layer list; --freeze-layers needs a BERT-like model")
    if blocks is not None and layers > len(blocks):
        raise ConfigError(f"--freeze-layers {layers} but the encoder has only {len(blocks)} layers")
    frozen_parts = []
    if embeddings or layers:
        frozen_parts.append(auto.embeddings)
    frozen_parts.extend(blocks[:layers] if layers else [])
    for part in frozen_parts:
        for p in part.parameters():
            p.requires_grad_(False)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"parameters": total, "trainable": trainable, "frozen_layers": layers, "frozen_embeddings": bool(frozen_parts)}


def adam(params, *, decoupled: bool, **options) -> torch.optim.Optimizer:
    """Adam (`decoupled=False`) or AdamW with torch's fused kernel where this torch has one for the
    parameters' device: one pass over all parameters instead of a dozen element-wise ops per
    tensor (a scratch timing on all-MiniLM-L6-v2's 22.7M parameters, 2 threads: 0.02 s per
    optimizer step fused, 0.14 s unfused; whole training steps: eval/bench/bench_encode.md).
    Same update rule, so checkpoints of either kind resume in the other."""
    kind = torch.optim.AdamW if decoupled else torch.optim.Adam
    try:
        return kind(params, fused=True, **options)
    except (RuntimeError, ValueError, TypeError):  # a device or dtype without the fused kernel
        return kind(params, **options)


def embed(model, texts: Sequence[str], device: str) -> torch.Tensor:
    """(len(texts), dim) sentence embeddings *with* gradients, through the model's own pooling,
    in the order of `texts`; run as length buckets (`linker.encoders.in_length_buckets`: most of a
    padded batch of random names is padding)."""
    from linker.encoders import _preprocess, in_length_buckets, token_counts

    texts = list(texts)

    def run(rows: np.ndarray) -> torch.Tensor:
        features = _preprocess(model, [texts[i] for i in rows])
        features = {k: v.to(device) if torch.is_tensor(v) else v for k, v in features.items()}
        return model(features)["sentence_embedding"]

    return in_length_buckets(np.minimum(token_counts(model, texts), int(model.max_seq_length or 512)), run)


def embed_no_grad(model, texts: Sequence[str], device: str, precision: str = "fp32") -> np.ndarray:
    """L2-normalised float32 embeddings for retrieval during training (eval mode, no gradients),
    through the inference path (`linker.encoders.Encoder`: batches by tokens, in `precision`).
    `texts` already carry their prompts."""
    from linker.encoders import Encoder, EncoderSpec

    spec = EncoderSpec(name="(in training)", path="", revision="training")
    return Encoder(spec, model, precision, device=device).encode(texts, role="passage")


def data_hashes(paths: Sequence[Path]) -> dict[str, str]:
    return {str(p): sha256_file(p) for p in paths if Path(p).is_file()}


@dataclass
class Metrics:
    """Loss per step and per epoch, timings; written as JSON beside the model."""

    steps: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Metrics:
        return cls(steps=list(data.get("steps", [])), epochs=list(data.get("epochs", [])), extra=dict(data.get("extra", {})))


def check_train_output(
    out: Path, *, encoder: str, dict_path: Path, train_specs: Sequence[str] = (), overwrite: bool,
    tables: Sequence[Path] = (),
) -> None:
    """Before training: the model folder (and its checkpoint) may not touch an input (the concept table,
    the training sets, the base encoder's folder, the other `tables` read); an existing model folder is replaced
    only with `overwrite` and only if linker wrote it."""
    from linker.dictionary import hierarchy_path
    from linker.datasets import spec_inputs
    from linker.fileio import Input, model_inputs

    inputs = [Input(Path(dict_path), "--dict"), Input(hierarchy_path(dict_path), "--dict's hierarchy side table"),
              *(i for spec in train_specs for i in spec_inputs(spec, "--train")), *model_inputs(encoder, "--encoder"),
              *(Input(Path(t), "--negatives-from") for t in tables if Path(t) != Path(dict_path))]
    check_output(out, inputs=inputs, overwrite=overwrite, folder=True, option="--out")
    check_output(checkpoint_dir(out), inputs=inputs, overwrite=True, folder=True, option="--out (checkpoint)")


def checkpoint_dir(out: Path) -> Path:
    return out.with_name(out.name + ".checkpoint")


def save_checkpoint(out: Path, model, optimizer: torch.optim.Optimizer, state: dict, metrics: Metrics,
                    extra_tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Write model + optimizer + trainer state after an epoch, replacing the previous checkpoint whole."""
    target = checkpoint_dir(out)
    with atomic_dir(target) as tmp:
        model.save(str(tmp / "model"))
        opt = optimizer.state_dict()
        tensors: dict[str, torch.Tensor] = {}
        for index, values in opt["state"].items():
            for key, value in values.items():
                tensor = value if torch.is_tensor(value) else torch.tensor(value)
                tensors[f"{index}.{key}"] = tensor.detach().cpu().contiguous()
        for key, value in (extra_tensors or {}).items():
            tensors[f"extra.{key}"] = value.detach().cpu().contiguous()
        save_file(tensors, str(tmp / OPTIMIZER_FILE))
        (tmp / OPTIMIZER_GROUPS_FILE).write_text(json.dumps(opt["param_groups"]))
        (tmp / STATE_FILE).write_text(json.dumps({**state, "metrics": metrics.to_json()}, indent=1))
    log.info("checkpoint written to %s", target)
    return target


def load_checkpoint(out: Path) -> tuple[Path, dict, dict[str, torch.Tensor], list]:
    """(model folder, trainer state, optimizer/extra tensors, param groups) of `<out>.checkpoint`."""
    folder = checkpoint_dir(out)
    if not (folder / STATE_FILE).is_file():
        raise MissingInputError(f"{folder}: no checkpoint to resume from; run without --resume")
    fix = "delete the folder and train again without --resume"
    with native_read(folder / STATE_FILE, "a JSON trainer state", fix=fix):
        state = json.loads((folder / STATE_FILE).read_text())
    with native_read(folder / OPTIMIZER_FILE, "a safetensors file of optimizer tensors", fix=fix):
        tensors = load_file(str(folder / OPTIMIZER_FILE))
    with native_read(folder / OPTIMIZER_GROUPS_FILE, "a JSON list of optimizer groups", fix=fix):
        groups = json.loads((folder / OPTIMIZER_GROUPS_FILE).read_text())
    return folder / "model", state, tensors, groups


def finished_metrics(out: Path) -> Metrics | None:
    """The metrics of a finished model folder (its checkpoint already removed), or None without one."""
    path = out / METRICS_FILE
    if checkpoint_dir(out).exists() or not path.is_file():
        return None
    with native_read(path, "JSON training metrics", fix="train again without --resume"):
        return Metrics.from_json(json.loads(path.read_text()))


def restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], groups: list) -> None:
    state: dict[int, dict] = {}
    for key, tensor in tensors.items():
        index, _, name = key.partition(".")
        if index == "extra":
            continue
        state.setdefault(int(index), {})[name] = tensor
    current = optimizer.state_dict()
    if len(groups) != len(current["param_groups"]):
        raise InputFormatError("checkpoint", f"{len(current['param_groups'])} optimizer groups", f"{len(groups)}",
                               fix="resume with the same options (freezing, encoder) as the interrupted run")
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def write_outputs(out: Path, model, *, config: dict, metrics: Metrics, extra_files: dict[str, dict] | None = None) -> None:
    """Write the final model folder atomically: sentence-transformers files + JSON config and metrics."""
    with atomic_dir(out) as tmp:
        model.save(str(tmp))
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False, default=str))
        (tmp / METRICS_FILE).write_text(json.dumps(metrics.to_json(), indent=1, default=str))
        for name, payload in (extra_files or {}).items():
            (tmp / name).write_text(json.dumps(payload, indent=2, ensure_ascii=False))
    shutil.rmtree(checkpoint_dir(out), ignore_errors=True)


def run_header(kind: str, base: str, spec) -> dict:
    return {
        "trainer": kind,
        "library_version": linker.__version__,
        "base_encoder": base,
        "base_encoder_spec": asdict(spec) if spec is not None else None,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


class Timer:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return round(time.perf_counter() - self.start, 2)


__all__ = [
    "Metrics", "Timer", "set_seed", "pick_device", "freeze", "embed", "embed_no_grad", "data_hashes",
    "save_checkpoint", "load_checkpoint", "restore_optimizer", "write_outputs", "hardware", "run_header",
    "checkpoint_dir",
]
