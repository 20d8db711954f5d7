"""The query runtime: a BERT sentence encoder in plain numpy, for the shipped encoders at query time.

`linker link` encodes a few mentions, and importing torch, transformers and sentence-transformers took 5-7 s of a
7 s call (docs/performance.md, "Start-up"). For a plain BERT encoder (linker-en and minilm, linker-multi and
e5-small: `plain_bert` says which folders qualify) this module does the same forward pass with numpy alone: the
weights memory-mapped from the folder's ``model.safetensors`` (a shipped release's trained tensors on top), the
tokens from its ``tokenizer.json`` with the `tokenizers` library, the model folder's pooling (mean or cls), the
role's prefix, the same truncation and L2 normalisation as `linker.encoders.Encoder.encode`. It starts in a tenth
of a second and its vectors match torch's within float rounding (tests/test_runtime.py; figures in
docs/performance.md).

`linker.encoders.load_query_encoder` picks it for fp32 queries on the CPU; everything else (index builds,
training, bf16/int8, GPUs, other architectures) stays on torch, and so does one call with many texts
(`TORCH_MIN_TEXTS`), which torch's kernels encode faster.
"""

from __future__ import annotations

import json
import logging
import math
import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from linker.batching import TOKEN_BUDGET, distinct_ids, encode_stats, length_batches, token_batches
from linker.errors import ConfigError, InputFormatError
from linker.precision import available_cpus, in_threads, thread_budget

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
# safetensors dtype -> numpy (little-endian). BF16 has no numpy type: such a folder stays on torch.
DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8"),
          "I32": np.dtype("<i4")}
MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own limit on its JSON header
# The modules a plain sentence-transformers BERT folder lists (modules.json), in order; Normalize is optional
# (vectors are normalised anyway).
PLAIN_MODULES = ("Transformer", "Pooling", "Normalize")


def read_tokenizer(path: str | Path):
    """A `tokenizer.json` through the `tokenizers` library, with the padding and truncation it may carry cleared
    (minilm's: both at 128): transformers sets them per call, and each caller here sets its own."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file as read-only numpy arrays over one memory map: nothing is copied, and a
    page is read when a forward pass first touches it (e5-small's 384 MB of word embeddings: only the rows of the
    tokens used). Refuses (InputFormatError) a header that is not the format's, a dtype numpy has no type for, and
    offsets outside the file or not matching the shape."""
    path = Path(path)
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        head = handle.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise InputFormatError(path, "a safetensors file", f"a header length of {length} in {size} bytes")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise InputFormatError(path, "a safetensors JSON header", f"{type(exc).__name__}: {exc}") from None
        data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + length else b""
    if not isinstance(header, dict):
        raise InputFormatError(path, "a safetensors JSON header (an object)", type(header).__name__)
    start, tensors = 8 + length, {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = DTYPES[entry["dtype"]], tuple(entry["shape"]), entry["data_offsets"]
            count = math.prod(shape)
            if not (0 <= begin <= end <= size - start and end - begin == count * dtype.itemsize):
                raise ValueError(f"offsets {begin}..{end} for {count} x {dtype.itemsize} bytes")
        except (KeyError, TypeError, ValueError) as exc:
            raise InputFormatError(path, f"tensor {name!r} with a known dtype and offsets inside the file",
                                   f"{str(entry)[:80]} ({type(exc).__name__}: {exc})") from None
        array = np.frombuffer(data, dtype=dtype, count=count, offset=start + begin).reshape(shape)
        tensors[name] = array if array.flags.aligned else array.copy()  # BLAS wants aligned rows
    return tensors


@dataclass(frozen=True)
class BertShape:
    """What the forward pass needs from a BERT ``config.json``."""

    layers: int
    heads: int
    hidden: int
    eps: float
    max_positions: int

    @classmethod
    def from_config(cls, config: dict) -> BertShape:
        return cls(int(config["num_hidden_layers"]), int(config["num_attention_heads"]), int(config["hidden_size"]),
                   float(config.get("layer_norm_eps", 1e-12)), int(config["max_position_embeddings"]))


def _read_json(folder: Path, name: str, expect: type = dict) -> dict | list | None:
    """A JSON file of the model folder read as every model file is (`linker.folders.read_folder_json`:
    inside the folder, regular, bounded); None when it is not there."""
    from linker.folders import read_folder_json

    if not (folder / name).is_file():
        return None
    return read_folder_json(folder, name, what=f"a model file {name}", expect=expect, fix="fix the model folder")


def plain_bert(folder: str | Path, pooling: str | None = None) -> tuple[dict | None, str]:
    """(the settings `BertEncoderRuntime` needs, "") when `folder` is a sentence-transformers folder of a plain
    BERT that this runtime reproduces, else (None, why not). `pooling` overrides the folder's (``#cls``).

    Plain means: modules Transformer, Pooling and optionally Normalize; config.json of model_type bert with
    absolute positions and exact (erf) GELU; a ``tokenizer.json`` and a ``model.safetensors``; exactly one pooling
    mode (cls or mean)."""
    folder = Path(folder)
    for name in (WEIGHTS, TOKENIZER, "config.json", "modules.json"):
        if not (folder / name).is_file():
            return None, f"no {name}"
    modules = _read_json(folder, "modules.json", expect=list)
    if not all(isinstance(m, dict) for m in modules):
        return None, "modules.json entries are not objects"
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if tuple(kinds) not in (PLAIN_MODULES, PLAIN_MODULES[:2]) or modules[0].get("path", "") != "":
        return None, f"modules {kinds}"
    config = _read_json(folder, "config.json")
    why = _not_plain_bert(config)
    if why:
        return None, why
    pooled = _read_json(folder, f"{modules[1].get('path', '')}/config.json") or {}
    modes = sorted(k.removeprefix("pooling_mode_") for k, v in pooled.items() if k.startswith("pooling_mode_") and v)
    mode = pooling or {"cls_token": "cls", "mean_tokens": "mean"}.get(modes[0] if len(modes) == 1 else "")
    if mode not in ("cls", "mean"):
        return None, f"pooling {modes}"
    st_config = _read_json(folder, "sentence_bert_config.json") or {}
    tokenizer_config = _read_json(folder, "tokenizer_config.json") or {}
    try:
        shape = BertShape.from_config(config)
        # As sentence-transformers: its max_seq_length, else the tokenizer's, capped by the model's positions.
        limit = st_config.get("max_seq_length") or tokenizer_config.get("model_max_length") or shape.max_positions
        max_length = min(int(limit), shape.max_positions)
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"config.json ({type(exc).__name__}: {exc})"
    return {"shape": shape, "pooling": mode, "max_length": max_length,
            "lowercase": bool(st_config.get("do_lower_case", False))}, ""


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(variance + eps) * weight + bias


# Abramowitz & Stegun 7.1.26: erf within 1.5e-7 of the exact value (float32's own step at 1 is 1.2e-7), so GELU's
# erf form is reproduced without scipy. The tanh form BERT is *not* trained with differs by up to ~1e-3.
_AS_P = np.float32(0.3275911)
_AS_A = tuple(np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592))
# |x| / sqrt(2) is clipped here: erf is 1 in float32 from 3.9 on, and exp(-a * a) of a larger `a` is a subnormal
# float, on which x86 arithmetic is some 100 times slower (it was half of a forward pass's time).
_ERF_CLIP = np.float32(4.0)


def _gelu(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + erf(x / sqrt 2)), the exact GELU of BERT's ``hidden_act: gelu``; float32 in, float32 out."""
    a = np.abs(x) * np.float32(1 / math.sqrt(2))
    np.minimum(a, _ERF_CLIP, out=a)
    t = np.float32(1.0) + _AS_P * a
    np.reciprocal(t, out=t)
    poly = _AS_A[0] * t
    for coefficient in _AS_A[1:]:
        poly += coefficient
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a  # erfc(|x| / sqrt 2)
    erf = np.float32(1.0) - poly
    np.copysign(erf, x, out=erf)
    erf += np.float32(1.0)
    erf *= x
    erf *= np.float32(0.5)
    return erf


# Token rows per block of the feed-forward part: 256 x 1,536 float32 activations (1.5 MB) stay in a core's cache
# through GELU's dozen passes; all rows at once ran 1.7x slower (1,400 tokens, minilm).
FFN_ROWS = 256


class BertRuntime:
    """A BERT encoder's forward pass in float32 numpy: token ids in, pooled (not normalised) vectors out."""

    def __init__(self, tensors: dict[str, np.ndarray], shape: BertShape, pooling: str) -> None:
        self.shape, self.pooling = shape, pooling
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""

        def get(name: str) -> np.ndarray:
            value = tensors.get(prefix + name)
            if value is None:
                raise InputFormatError(f"BERT weights: tensor {prefix + name}", "present", "missing")
            return value if value.dtype == np.float32 else value.astype(np.float32)

        self.word = get("embeddings.word_embeddings.weight")  # (vocab, hidden), memory-mapped
        self.position = get("embeddings.position_embeddings.weight")
        self.token_types = get("embeddings.token_type_embeddings.weight")  # single texts: type 0 throughout
        self.token_type = self.token_types[0]
        self.embed_norm = (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias"))
        self.layers = []
        for i in range(shape.layers):
            def part(name: str, i=i) -> np.ndarray:
                return get(f"encoder.layer.{i}.{name}")

            # Query, key and value as one (hidden, 3 hidden) product: one BLAS call instead of three. Every weight is
            # stored transposed and contiguous (x @ W): on one thread, as the service's inference threads run, a
            # forward pass over a transposed view took 10.9 ms against 8.1 (one 7-token mention, minilm).
            qkv = np.concatenate([part(f"attention.self.{n}.weight") for n in ("query", "key", "value")]).T.copy()
            qkv_bias = np.concatenate([part(f"attention.self.{n}.bias") for n in ("query", "key", "value")])
            self.layers.append((
                qkv, qkv_bias,
                part("attention.output.dense.weight").T.copy(), part("attention.output.dense.bias"),
                (part("attention.output.LayerNorm.weight"), part("attention.output.LayerNorm.bias")),
                part("intermediate.dense.weight").T.copy(), part("intermediate.dense.bias"),
                part("output.dense.weight").T.copy(), part("output.dense.bias"),
                (part("output.LayerNorm.weight"), part("output.LayerNorm.bias")),
            ))
        if self.word.shape[1] != shape.hidden or self.position.shape[0] < shape.max_positions:
            raise InputFormatError("BERT weights", f"{shape.hidden}-d embeddings and {shape.max_positions} positions",
                                   f"{self.word.shape} and {self.position.shape}")

    def __call__(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None = None) -> np.ndarray:
        """(batch, hidden) pooled vectors of `ids` (batch, length) int64 with `mask` (batch, length) 0/1 and, for
        text pairs, their token `types` (0 for the first text, 1 for the second)."""
        x = self.hidden(ids, mask, types)
        if self.pooling == "cls":
            return x[:, 0]
        weights = mask.astype(np.float32)[:, :, None]
        return (x * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), np.float32(1e-9))

    def hidden(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None = None) -> np.ndarray:
        """(batch, length, hidden): the last layer's vector of each token (a token tagger's input)."""
        batch, length = ids.shape
        shape = self.shape
        heads, width = shape.heads, shape.hidden // shape.heads
        x = self.word[ids] + self.position[:length]  # (batch, length, hidden)
        x += self.token_type if types is None else self.token_types[types]
        x = _layer_norm(x.reshape(batch * length, shape.hidden), *self.embed_norm, shape.eps)
        # Padding as transformers masks it: the smallest float32 added to the scores of padded keys.
        masked = ((1.0 - mask.astype(np.float32)) * np.finfo(np.float32).min)[:, None, None, :]
        scale = np.float32(1 / math.sqrt(width))
        for qkv, qkv_bias, out_w, out_b, norm1, up_w, up_b, down_w, down_b, norm2 in self.layers:
            q, k, v = (x @ qkv + qkv_bias).reshape(batch, length, 3, heads, width).transpose(2, 0, 3, 1, 4)
            scores = (q * scale) @ k.transpose(0, 1, 3, 2) + masked  # (batch, heads, length, length)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch * length, shape.hidden)
            x = _layer_norm(context @ out_w + out_b + x, *norm1, shape.eps)
            ffn = np.empty_like(x)
            for start in range(0, len(x), FFN_ROWS):  # in blocks: the (rows, 4 hidden) activations stay in cache
                part = x[start : start + FFN_ROWS] @ up_w
                part += up_b
                ffn[start : start + FFN_ROWS] = _gelu(part) @ down_w
            ffn += down_b
            ffn += x
            x = _layer_norm(ffn, *norm2, shape.eps)
        return x.reshape(batch, length, shape.hidden)


class RuntimeEncoder:
    """A `linker.encoders.Encoder` for queries: the same `encode` (roles, prefixes, deduplication of texts with
    equal token ids, length-sorted batches, truncation counted in `last_stats`), run by `BertRuntime`.

    fp32 on the CPU only. A call with at least `torch_min_texts` texts goes to a torch `Encoder` of the same
    spec, loaded on first need (`torch_loader`): torch's kernels are faster on big batches, and its import (seconds)
    is then a small part of the call."""

    precision = "fp32"
    device = "cpu"
    compiled = False
    runtime = "numpy"

    def __init__(self, spec, folder: Path, settings: dict, tensors: dict[str, np.ndarray], *,
                 torch_loader: Callable[[], object] | None = None, torch_min_texts: int | None = None,
                 threads: int | None = None) -> None:
        self.spec = spec
        self.max_length = settings["max_length"]
        self.lowercase = settings["lowercase"]
        self.model = BertRuntime(tensors, settings["shape"], settings["pooling"])
        self.dim = settings["shape"].hidden
        self.tokenizer = read_tokenizer(folder / TOKENIZER)  # truncated as sentence-transformers does, below
        self._folder = folder
        self._cut = None  # a second tokenizer that truncates, made when a text first needs it
        self._torch_loader = torch_loader
        self.torch_min_texts = TORCH_MIN_TEXTS if torch_min_texts is None else torch_min_texts
        self._torch = None
        self.threads = threads or RUNTIME_THREADS
        self.last_stats = None

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids with special tokens, before truncation (as `linker.encoders.token_ids`)."""
        if self.lowercase:
            texts = [t.lower() for t in texts]
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]

    def _truncating(self):
        if self._cut is None:
            cut = read_tokenizer(self._folder / TOKENIZER)
            cut.enable_truncation(self.max_length)
            self._cut = cut
        return self._cut

    def torch_encoder(self):
        """The torch `Encoder` of the same spec (loaded once, on first call)."""
        if self._torch is None:
            if self._torch_loader is None:
                raise ConfigError(f"encoder {self.spec.name!r}: no torch encoder to hand a large batch to")
            self._torch = self._torch_loader()
        return self._torch

    def encode(self, texts: Sequence[str], *, role: str, batch_size: int | None = None, token_budget: int | None = None,
               show_progress: bool = False, progress: Callable[[int], None] | None = None) -> np.ndarray:
        """(n, dim) float32, each row L2-normalised, in the order of `texts` (`linker.encoders.Encoder.encode`)."""
        if len(texts) >= self.torch_min_texts and self._torch_loader is not None:
            encoder = self.torch_encoder()
            vectors = encoder.encode(texts, role=role, batch_size=batch_size, token_budget=token_budget or TOKEN_BUDGET,
                                     show_progress=show_progress, progress=progress)
            self.last_stats = encoder.last_stats
            return vectors
        token_budget = TOKEN_BUDGET if token_budget is None else token_budget
        if token_budget < 1 or (batch_size is not None and batch_size < 1):
            raise ConfigError(f"batch_size and token_budget must be >= 1, found {batch_size}, {token_budget}")
        prefix = self.spec.prefix(role)
        texts = [prefix + t for t in texts] if prefix else list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        started = time.perf_counter()
        ids = self.token_ids(texts)
        inverse, firsts, copies = distinct_ids(ids)  # texts with equal token ids share one vector
        all_lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        limit = self.max_length
        distinct = [ids[i] for i in firsts]
        long = [i for i, row in enumerate(distinct) if len(row) > limit]
        if long:  # cut as transformers cuts: the text's first tokens, then the closing special token
            cut = self._truncating().encode_batch([texts[firsts[i]].lower() if self.lowercase else texts[firsts[i]]
                                          for i in long], add_special_tokens=True)
            for i, encoding in zip(long, cut):
                distinct[i] = encoding.ids
        tokenize_seconds = time.perf_counter() - started
        clipped, order, batches = length_batches(all_lengths[firsts], limit, token_budget, batch_size)
        out = np.empty((len(distinct), self.dim), dtype=np.float32)
        padded = 0
        with _blas_threads(self.threads):
            for start, end in batches:
                rows = order[start:end]
                width = int(clipped[rows].max())
                batch_ids = np.zeros((len(rows), width), dtype=np.int64)
                mask = np.zeros((len(rows), width), dtype=np.int64)
                for j, row in enumerate(rows.tolist()):
                    batch_ids[j, : len(distinct[row])] = distinct[row]
                    mask[j, : len(distinct[row])] = 1
                padded += batch_ids.size
                vectors = self.model(batch_ids, mask)  # (batch, dim)
                # As torch.nn.functional.normalize: divided by max(norm, 1e-12).
                out[rows] = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), np.float32(1e-12))
                if progress is not None:
                    progress(int(copies[rows].sum()))
        self.last_stats = encode_stats(all_lengths, clipped, len(batches), padded, limit, tokenize_seconds, started,
                                       log)
        return out[inverse]

    def __repr__(self) -> str:
        return f"RuntimeEncoder({self.spec.name!r}, dim={self.dim}, numpy fp32)"


def plain_cross_encoder(folder: str | Path) -> tuple[dict | None, str]:
    """(settings, "") when `folder` is a one-output BERT sequence-classification folder this runtime reproduces
    (what `linker train rerank` writes, and an index's bound re-ranker), else (None, why not)."""
    folder = Path(folder)
    for name in (WEIGHTS, TOKENIZER, "config.json"):
        if not (folder / name).is_file():
            return None, f"no {name}"
    config = _read_json(folder, "config.json")
    why = _not_plain_classifier(config)
    if why:
        return None, why
    try:
        return {"shape": BertShape.from_config(config)}, ""
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"config.json ({type(exc).__name__}: {exc})"


def _not_plain_bert(config: object) -> str:
    """Why a ``config.json`` is not a BERT this runtime reproduces (model_type bert, absolute positions, exact GELU);
    "" when it is."""
    if not isinstance(config, dict) or config.get("model_type") != "bert":
        return f"model_type {config.get('model_type') if isinstance(config, dict) else None!r}"
    if config.get("hidden_act", "gelu") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
        return f"hidden_act {config.get('hidden_act')!r}, positions {config.get('position_embedding_type')!r}"
    return ""


def _not_plain_classifier(config: object) -> str:
    """`_not_plain_bert`, and a one-output sequence-classification head."""
    if why := _not_plain_bert(config):
        return why
    if config.get("architectures") != ["BertForSequenceClassification"] or len(config.get("id2label") or {}) != 1:
        return f"architectures {config.get('architectures')!r} with labels {config.get('id2label')!r}"
    return ""


class RuntimeCrossEncoder:
    """`linker.rerank.CrossEncoder`'s `score` for a BERT cross-encoder, in float32 numpy: the pair tokenised as
    transformers does (``[CLS] mention [SEP] name [SEP]``, token types 0 then 1, cut longest first to
    `max_length`), the [CLS] vector through the pooler (dense, tanh) and the one-output classifier. Equal pairs are
    scored once, as there. No torch: a bound re-ranker does not bring torch's import (seconds) into a CLI call or
    a service's start. fp32 on the CPU only; `linker.rerank.load_reranker` chooses it."""

    device = "cpu"
    precision = "fp32"
    runtime = "numpy"

    def __init__(self, info, tensors: dict[str, np.ndarray], shape: BertShape, tokenizer_file: Path, *,
                 max_length: int, threads: int | None = None) -> None:
        self.info = info
        self.model = BertRuntime(tensors, shape, "cls")

        def get(name: str) -> np.ndarray:
            if name not in tensors:
                raise InputFormatError(f"cross-encoder weights: tensor {name}", "present", "missing")
            return np.ascontiguousarray(tensors[name], dtype=np.float32)

        self.pooler = (get("bert.pooler.dense.weight").T.copy(), get("bert.pooler.dense.bias"))
        self.classifier = (get("classifier.weight").T.copy(), get("classifier.bias"))
        if self.classifier[0].shape != (shape.hidden, 1):
            raise InputFormatError("cross-encoder weights: classifier.weight", f"(1, {shape.hidden})",
                                   str(tuple(self.classifier[0].shape[::-1])))
        self.tokenizer = read_tokenizer(tokenizer_file)
        self.tokenizer.enable_truncation(max_length, strategy="longest_first")
        self.threads = threads or RUNTIME_THREADS

    @property
    def scorer(self) -> str:
        return self.info.scorer

    def score(self, mentions: Sequence[str], names: Sequence[str], *, batch_size: int = 128) -> np.ndarray:
        """(n,) float32 logits of the pairs (mentions[i], names[i]), as `linker.rerank.CrossEncoder.score`.

        Equal pairs are scored once. The distinct ones are cut into length-sorted batches as the encoders cut
        theirs (`linker.batching.token_batches`: a call's pairs of 8 to 29 tokens padded to the longest spent
        1.3x the work), into at least as many batches as there are threads, and the batches run on up to
        `thread_budget` threads at a time, each forward pass on one BLAS thread (`_blas_threads`: a batch's
        products are too small to split). Two threads scored 40 to 2,000 lay pairs 1.7-1.9x faster than one on 2
        idle cores; a batch's scores differ from a lone pair's in the last bits only (padding is masked)."""
        if len(mentions) != len(names):
            raise ValueError("mentions and names must have the same length")
        pairs = list(zip(mentions, names))
        inverse, firsts, _copies = distinct_ids(pairs)
        distinct = [pairs[i] for i in firsts]
        scores = np.empty(len(distinct), dtype=np.float32)
        encodings = self.tokenizer.encode_batch(distinct, add_special_tokens=True)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        order = np.argsort(lengths, kind="stable")
        workers = thread_budget(available_cpus())
        per_batch = max(1, min(batch_size, -(-len(distinct) // workers)))  # one mention's 5 pairs: 3 + 2 on 2 cores
        batches = token_batches(lengths[order], TOKEN_BUDGET, per_batch)

        def run(batch: tuple[int, int]) -> None:
            rows = order[batch[0] : batch[1]]
            ids, types, mask = (np.zeros((len(rows), int(lengths[rows].max())), dtype=np.int64) for _ in range(3))
            for j, i in enumerate(rows.tolist()):
                n = len(encodings[i].ids)
                ids[j, :n], types[j, :n], mask[j, :n] = encodings[i].ids, encodings[i].type_ids, 1
            pooled = np.tanh(self.model(ids, mask, types) @ self.pooler[0] + self.pooler[1])
            scores[rows] = (pooled @ self.classifier[0] + self.classifier[1])[:, 0]

        with _blas_threads(self.threads):
            in_threads(run, batches, workers)
        return scores[inverse]

    def __repr__(self) -> str:
        return f"RuntimeCrossEncoder({self.info.name!r}, numpy fp32)"


def load_runtime_cross_encoder(folder: str | Path, info, *, max_length: int, base: str | Path | None = None,
                               release: str | Path | None = None, threads: int | None = None
                               ) -> RuntimeCrossEncoder | None:
    """The numpy cross-encoder of a re-ranker `folder` (weights, tokenizer and config of one folder), or of a
    shipped release: `base`, an encoder folder whose BERT tensors get ``bert.`` names, with the `release`'s trained
    tensors (``bert.*``, ``classifier.*``) on top. None when it does not qualify (the reason is logged)."""
    if release is None:
        settings, why = plain_cross_encoder(folder)
        if settings is None:
            log.debug("re-ranker %s: not run by the numpy runtime (%s)", folder, why)
            return None
        tensors, shape, tokenizer = read_safetensors(Path(folder) / WEIGHTS), settings["shape"], Path(folder) / TOKENIZER
    else:
        base = Path(base)
        config = _read_json(base, "config.json")
        why = _not_plain_bert(config) or ("" if (base / TOKENIZER).is_file() else f"no {TOKENIZER}")
        if why:
            log.debug("re-ranker %s: its base %s is not run by the numpy runtime (%s)", release, base, why)
            return None
        shape = BertShape.from_config(config)
        tensors = {k if k.startswith("bert.") else f"bert.{k}": v for k, v in read_safetensors(base / WEIGHTS).items()}
        tensors.update(release_tensors(release, tensors, new=("classifier.",)))  # the head is the release's own
        tokenizer = base / TOKENIZER
    return RuntimeCrossEncoder(info, tensors, shape, tokenizer, max_length=max_length, threads=threads)


# BLAS threads of a forward pass, unless the index's config sets them (`_blas_threads`: why one).
RUNTIME_THREADS = 1
# Texts in one encode call from which the torch encoder takes over: a batch job's call (`linker normalize` sends
# 1,024 spans a call, `eval` whole datasets). eval/bench/bench_runtime.md, 2 shared cores: this runtime spent 0.74x
# torch's CPU time on 1 text, 0.98x on 100 and 1.11x on 1,000 (torch's GEMMs are faster on big batches, and it runs
# them on every core where this runtime keeps one); torch's import, seconds, is repaid over a few such calls.
TORCH_MIN_TEXTS = 1024


_blas = {"lock": threading.Lock(), "users": 0, "limits": None, "controller": None}


@contextmanager
def _blas_threads(threads: int):
    """numpy's BLAS limited to `threads` while forward passes run. A query batch's products are small (tens of
    rows): OpenBLAS's hand-off between threads costs more than it saves, and on a busy machine far more (a 40 x 384
    by 384 x 1,536 product: 0.9 ms on one thread, 114 ms on two while other jobs held the 2 cores). The limit is
    process-wide: the first of concurrent passes (a service's threads) sets it, the last puts the original back."""
    try:
        from threadpoolctl import ThreadpoolController  # installed with scikit-learn, a base dependency
    except ImportError:  # pragma: no cover
        yield
        return
    with _blas["lock"]:
        if not _blas["users"]:
            # One controller, kept: each new one scans the process's libraries, 1.5 ms of a 25 ms one-mention link.
            if _blas["controller"] is None:
                _blas["controller"] = ThreadpoolController()
            _blas["limits"] = _blas["controller"].limit(limits=threads, user_api="blas")
        _blas["users"] += 1
    try:
        yield
    finally:
        with _blas["lock"]:
            _blas["users"] -= 1
            if not _blas["users"]:
                _blas["limits"].restore_original_limits()


def load_runtime(spec, *, torch_loader: Callable[[], object] | None = None,
                 threads: int | None = None) -> RuntimeEncoder | None:
    """The runtime encoder for an `EncoderSpec` whose folder is a plain BERT (`plain_bert`), with a shipped
    release's tensors on top; None when the folder does not qualify (the reason is logged)."""
    folder = Path(spec.path)
    settings, why = plain_bert(folder, spec.pooling)
    if settings is None:
        log.debug("encoder %s: not run by the numpy runtime (%s)", spec.name, why)
        return None
    tensors = read_safetensors(folder / WEIGHTS)
    if spec.release is not None:
        tensors = {**tensors, **release_tensors(spec.release, tensors)}
    return RuntimeEncoder(spec, folder, settings, tensors, torch_loader=torch_loader, threads=threads)


def release_tensors(release_folder: str | Path, base: dict[str, np.ndarray], *, new: tuple[str, ...] = ()
                    ) -> dict[str, np.ndarray]:
    """A shipped release's trained tensors (fp16 on disk) as float32, each checked against the base's name and
    shape as `linker.models.overlay` checks them; names starting with a `new` prefix (a re-ranker's head) need no
    twin in the base. The release's files were checked against its manifest's sha256 when its spec was resolved
    (`linker.models.read_release`)."""
    from linker.models import WEIGHTS as RELEASE_WEIGHTS

    path = Path(release_folder) / RELEASE_WEIGHTS
    out = {}
    for key, value in read_safetensors(path).items():
        fresh = key.startswith(new) and key not in base  # a head the base has no twin of
        if not fresh and (key not in base or base[key].shape != value.shape):
            found = base[key].shape if key in base else "no such tensor"
            raise InputFormatError(path, f"tensor {key} {value.shape} of the base", f"{found} (a release for another base?)")
        out[key] = value.astype(np.float32)
    return out


__all__ = ["BertRuntime", "RuntimeCrossEncoder", "RuntimeEncoder", "TORCH_MIN_TEXTS", "load_runtime",
           "load_runtime_cross_encoder", "plain_bert", "plain_cross_encoder", "read_safetensors", "read_tokenizer"]
