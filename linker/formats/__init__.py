"""Mention-file formats: one reader and one writer per format, shared by `normalize`, `eval` and `train`.

| module | format | reader | writer |
|---|---|---|---|
| `jsonl` | one span per line, ``{"text", "id"?, "lang"?, ...}`` | `read_jsonl` | `write_jsonl` |
| `brat` | standoff ``.ann`` beside its ``.txt`` (folder, zip or one file) | `read_brat`, `brat_sources` | `write_brat` |
| `ade_xml` | TAC 2017 ADR / ADE Eval drug labels | `read_ade_xml` | `write_ade_xml` |
| `pubtator` | PubTator title/abstract/annotation lines (NCBI-disease, BC5CDR) | `read_pubtator` | `write_pubtator` |
| `codiesp` | CodiEsp ``*X.tsv`` rows | `read_codiesp` | `write_codiesp` |
| `mention_lists` | BioSyn ``*.concept``, ``id<TAB>mention`` and ``id||mention`` lists | `read_biosyn`, `read_id_list` | `write_biosyn`, `write_id_list` |

Readers check what they read once, here, so that a check holds for every command: a malformed
line raises `InputFormatError` naming file and line. Every reader is bounded in memory by
`ReadLimits`: a line longer than ``max_line_bytes`` or a document (a brat ``.ann``/``.txt``, an XML
label) larger than ``max_document_bytes`` is refused before it is held whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, MissingInputError


@dataclass(frozen=True)
class ReadLimits:
    """Size caps of the readers; the defaults are far above any real corpus line or document."""

    max_line_bytes: int = 1 << 20  # 1 MiB: a JSONL span, a PubTator abstract, a brat line
    max_document_bytes: int = 64 << 20  # 64 MiB: one brat .ann or .txt, one XML drug label

    def __post_init__(self) -> None:
        for name in ("max_line_bytes", "max_document_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, found {getattr(self, name)}")


DEFAULT_LIMITS = ReadLimits()


def check_document_size(path: str | Path, size: int, limits: ReadLimits) -> None:
    """Refuse a document above the cap before it is read into memory."""
    if size > limits.max_document_bytes:
        raise InputFormatError(
            path, f"a document of at most {limits.max_document_bytes:,} bytes", f"{size:,} bytes",
            fix="raise --max-document-bytes if this file is genuine",
        )


def read_document(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> bytes:
    """The bytes of one document file, refused above `limits.max_document_bytes` without reading it."""
    if not path.is_file():
        raise MissingInputError(f"{path}: no such file")
    check_document_size(path, path.stat().st_size, limits)
    return path.read_bytes()


def input_files(input_path: Path, suffix: str) -> list[Path]:
    """The file itself, or every `suffix` file below a folder (sorted, so output order is stable)."""
    if input_path.is_file():
        return [input_path]
    if input_path.is_dir():
        files = sorted(input_path.rglob(f"*{suffix}"))
        if not files:
            raise MissingInputError(f"{input_path}: no {suffix} files in this folder")
        return files
    raise MissingInputError(f"{input_path}: no such file or folder")


__all__ = ["DEFAULT_LIMITS", "ReadLimits", "check_document_size", "input_files", "read_document"]
