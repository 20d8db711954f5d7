"""Command-line options declared on the fields of an index kind's config dataclass.

`linker index build` generates its options from these declarations, as the recipes build configs from the same
dataclasses (`linker.recipe.schema`): a field the command line sets carries ``metadata=option(...)`` with its flag
and help text, so a new field gets its option by one line beside its default. Not every field has one: search
levers and measurement knobs stay in recipes and Python.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OPTION = "linker.build_option"  # the field-metadata key


@dataclass(frozen=True)
class BuildOption:
    """One option of `linker index build`, on the config field it sets.

    `type`: the option's type when it is not the field's (``--ngram MIN,MAX``: a text for two int fields);
    `parse`: that text to field values, ``{field: value}``; `default`: shown by ``--help`` (None: an option left
    out keeps the config's own default). Several fields may share a flag (``--threads``: tf-idf's and the
    encoder's); the first one's help is shown and the value goes to each."""

    flag: str
    help: str = ""
    type: type | None = None
    parse: Callable[[Any], dict[str, Any]] | None = None
    default: Any = None

    @property
    def name(self) -> str:
        """The Python parameter the option arrives in (``--batch-size`` -> ``batch_size``)."""
        return self.flag.lstrip("-").replace("-", "_")


def option(flag: str, help: str = "", **kwargs: Any) -> dict[str, BuildOption]:  # noqa: A002 - click's word
    """Field metadata declaring the field's command-line option: ``field(default=..., metadata=option(...))``."""
    return {OPTION: BuildOption(flag, help, **kwargs)}


def build_options(config_type: type) -> list[tuple[str, type, BuildOption]]:
    """(field name, option type, option) of every field of `config_type` that declares one, in field order."""
    hints = typing.get_type_hints(config_type)
    return [(f.name, f.metadata[OPTION].type or hints[f.name], f.metadata[OPTION])
            for f in dataclasses.fields(config_type) if OPTION in f.metadata]


def config_fields(config_type: type, values: dict[str, Any]) -> dict[str, Any]:
    """The fields of `config_type` that the given options set (`values`: option name -> value, None = not given)."""
    fields: dict[str, Any] = {}
    for name, _, opt in build_options(config_type):
        value = values.get(opt.name)
        if value is not None:
            fields.update(opt.parse(value) if opt.parse is not None else {name: value})
    return fields
