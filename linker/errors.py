"""The LinkerError family.

Library code raises these; the CLI turns them into one line on stderr and exit code 1,
the HTTP service into a 4xx JSON body. A message says where (file:line or field),
what was expected, what was found, and how to fix it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


class LinkerError(Exception):
    """Base class: str(error) is the complete, one-line user-facing message."""


class InputFormatError(LinkerError):
    """A file (or request field) does not have the expected format."""

    def __init__(
        self,
        where: str | Path,
        expected: str,
        found: str,
        *,
        line: int | None = None,
        fix: str | None = None,
    ) -> None:
        self.where = str(where)
        self.line = line
        self.expected = expected
        self.found = found
        self.fix = fix
        location = f"{self.where}:{line}" if line is not None else self.where
        message = f"{location}: expected {expected}, found {found}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)


def shorten(text: str, limit: int = 80) -> str:
    """repr() of text cut to a readable length, for 'found ...' in messages."""
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


class UnknownNameError(LinkerError):
    """A pluggable part (source, index kind, filter, dataset format...) was named wrongly."""

    def __init__(self, kind: str, name: str, choices: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.choices = sorted(choices)
        super().__init__(f"unknown {kind} {name!r}; available: {', '.join(self.choices)}")


class MissingInputError(LinkerError):
    """A file or folder that the user named does not exist or lacks a required part."""


class IndexMismatchError(LinkerError):
    """An index folder's manifest does not match its files (or the library)."""


class ConfigError(LinkerError):
    """Options that contradict each other or are out of range."""
