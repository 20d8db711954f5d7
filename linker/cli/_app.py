"""The `linker` Typer app, alone in a leaf module (as spaCy keeps its `app` in ``spacy/cli/_util.py``).

Each command module imports `app` from here and adds its commands to it; `linker.cli.main` imports the command
modules, adds the global options and runs the app. So no command module imports `main`, and `main` is the only
module that knows them all.
"""

from __future__ import annotations

import typer
from typer.core import TyperGroup

# `linker --help` lists commands in the order a user runs them, not in registration order.
PIPELINE_ORDER = ("dict", "index", "link", "extract", "annotate", "normalize", "normalize-ray", "annotate-ray", "serve",
                  "eval", "capabilities", "train")


class PipelineOrderGroup(TyperGroup):
    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(PIPELINE_ORDER)}
        return sorted(names, key=lambda name: (rank.get(name, len(rank)), name))


app = typer.Typer(
    name="linker",
    cls=PipelineOrderGroup,
    help="Multilingual medical entity linking: dictionaries, indexes, linking, evaluation, training, service.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
