"""One registry style for the pluggable parts.

Sources (`linker.sources.SOURCES`), index kinds (`linker.index.KINDS`), dataset formats (`linker.datasets.LOADERS`),
output writers (`linker.formats.writers.WRITERS`, whose entries also name how `linker normalize` reads and writes
back a format: `linker.normalize.FORMATS` is read from them), extractors by release kind
(`linker.extract.extractor.EXTRACTORS`), encoder aliases (`linker.encoders.ENCODERS`) and the dense build's encoding
engines (`linker.index.dense.ENCODING_ENGINES`) are each one module-level `Registry`: name -> entry, filled by
`register` (a decorator, or a call with the entry), read by `get(name)`, which names the choices when the name is
unknown, and `names()`. A registry reads like a mapping (``name in registry``, ``registry[name]``, iteration in
registration order, ``len``), so it can be shown in help texts and error messages as it is.

A registry whose entries register themselves when their modules are imported takes a `load`
function, called once before the first read (the sources: importing every reader up front would
slow ``import linker``; the encoding engines: the Ray engine lives above the index layer, which never imports it).
An entry that is expensive to make (an index kind pulls in torch) is registered as a factory and called by whoever
reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from linker.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one kind of pluggable part; `kind` names it in error messages."""

    def __init__(self, kind: str, *, load: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._load = load

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T) -> T: ...

    def register(self, name, entry=None):
        """``@registry.register("name")`` over a function, or ``registry.register("name", entry)``."""
        if entry is None:
            return lambda fn: self.register(name, fn)
        if self._entries.get(name, entry) is not entry:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        """The entry called `name`; UnknownNameError listing the registered names otherwise."""
        self._ensure_loaded()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self._entries) from None

    def names(self) -> list[str]:
        """The registered names, sorted."""
        self._ensure_loaded()
        return sorted(self._entries)

    def __getitem__(self, name: str) -> T:
        self._ensure_loaded()
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        self._ensure_loaded()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        self._ensure_loaded()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._ensure_loaded()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"

    def _ensure_loaded(self) -> None:
        # The loader registers entries (re-entering this registry), so it is unset while it runs; a loader
        # that fails is tried again on the next read.
        load, self._load = self._load, None
        if load is None:
            return
        try:
            load()
        except BaseException:
            self._load = load
            raise


__all__ = ["Registry"]
