"""Output writers by format name (`WRITERS`): where a pipeline's results become files.

Each entry is a `Writer`: the format's name and what it writes, a file (``jsonl``, ``parquet``) or a folder of files
(``brat``, ``ade-xml``), and the function that writes it. `linker extract` / `linker annotate`
(`linker.extract.io.write_output`) and the Ray shards (`linker.engine.shards`) look their writer up here, so that a
new output format is one registration, and an unknown name lists the valid ones. A format that `linker normalize`
also reads and writes back (its spans in, the same file or folder with their links out) names that function in the
same registration (`normalize`); `linker.normalize.FORMATS` is those entries, read from here.

A folder format names its files through `linker.fileio.FileNamer` / `safe_stem` (the one rule that turns a name from
the data into a path), never by joining a document's id onto a folder.

The writers register themselves where they are defined (`linker.extract.io` for documents, `linker.engine.shards`
for Parquet shards); the registry imports those modules by name on its first read, so this module, low in the
layers, imports nothing above it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from linker.registry import Registry

# The modules whose writers register themselves in WRITERS, imported on the first read.
_WRITER_MODULES = ("linker.extract.io", "linker.engine.shards")


@dataclass(frozen=True)
class Writer:
    """One output format: `folder` when it writes a folder of files (named by `linker.fileio.FileNamer`), a single
    file otherwise; `write` writes it (its arguments are the caller's kind of records: `linker.extract.io.InputDoc`
    for documents, Arrow tables for shards). `normalize`, when set, is how `linker normalize` links a file or folder of
    this format and writes it back (`linker.normalize.normalize_path`'s arguments; its summary returned)."""

    name: str
    folder: bool
    write: Callable[..., int]
    normalize: Callable[..., Any] | None = None


def _load() -> None:
    for module in _WRITER_MODULES:
        importlib.import_module(module)


WRITERS: Registry[Writer] = Registry("output format", load=_load)


def register_writer(name: str, *, folder: bool, normalize: Callable[..., Any] | None = None
                    ) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """``@register_writer("brat", folder=True)`` over a writer function: registers ``Writer(name, folder, fn)``
    (with `normalize`, ``Writer(name, folder, fn, normalize)``)."""

    def decorate(fn: Callable[..., int]) -> Callable[..., int]:
        WRITERS.register(name, Writer(name, folder, fn, normalize))
        return fn

    return decorate


__all__ = ["WRITERS", "Writer", "register_writer"]
