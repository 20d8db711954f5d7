"""House rules checked on the code itself: no function in linker/ longer than a screen."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import linker

ROOT = Path(linker.__file__).parent
# A longer function is split into named steps with a short driver, as train/biosyn.py is (issue 46, item 5).
MAX_LINES = 80

# (path under linker/, qualified name) -> why it may stay longer. An entry whose function got short or went away
# fails `test_allow_list_has_no_stale_entries`, so the list only shrinks: delete the entry with the split.
ALLOWED = {
    # One numba-compiled loop: each call out of it to a helper is a jit boundary on the hot path.
    ("index/maxscore.py", "_kernel"): "numba kernel",
}


def _functions(node: ast.AST, path: str, prefix: str = "") -> Iterator[tuple[str, str, int]]:
    """(path, qualified name, lines) of every function and method under `node`, nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = prefix + child.name
            if not isinstance(child, ast.ClassDef):
                # from the `def` line (decorators not counted) to the last line of the body
                yield path, name, child.end_lineno - child.lineno + 1
            yield from _functions(child, path, name + ".")
        else:
            yield from _functions(child, path, prefix)


def _lengths() -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for file in sorted(ROOT.rglob("*.py")):
        path = file.relative_to(ROOT).as_posix()
        for _, name, lines in _functions(ast.parse(file.read_text(encoding="utf-8"), filename=str(file)), path):
            out[(path, name)] = max(lines, out.get((path, name), 0))  # a name defined twice: the longer
    return out


def test_no_function_is_longer_than_the_limit():
    long = {f"{path}:{name}": lines for (path, name), lines in _lengths().items()
            if lines > MAX_LINES and (path, name) not in ALLOWED}
    assert not long, f"functions over {MAX_LINES} lines (split them into named steps): {long}"


def test_allow_list_has_no_stale_entries():
    lengths = _lengths()
    stale = [f"{path}:{name}" for path, name in ALLOWED if lengths.get((path, name), 0) <= MAX_LINES]
    assert not stale, f"short now or gone, delete from ALLOWED: {stale}"


def test_lines_are_counted_from_def_to_the_end_of_the_body():
    source = "@decorator\ndef f():\n    x = 1\n\n    return x\n\nclass C:\n    def m(self):\n        def inner():\n            pass\n"
    assert list(_functions(ast.parse(source), "m.py")) == [
        ("m.py", "f", 4), ("m.py", "C.m", 3), ("m.py", "C.m.inner", 2)]


# A command takes at most MAX_OPTIONS options; the longer ones say why here (issue 46). An entry whose command got
# short or went away fails `test_option_allow_list_has_no_stale_entries`, so the list only shrinks.
MAX_OPTIONS = 15
TRAINER = "a trainer: one option per hyper-parameter, each with its default (a recipe file sets them together)"
PIPELINE = ("the pipeline's stages each take their own: input limits, tagging, linking (k, language, re-ranker, "
            "minimum confidence) and the output's format")
LONG_COMMANDS = {
    "index build": "generated from each index kind's config dataclass (tf-idf, dense, and the hybrid's own); "
                   "`--preset` and recipes set them together",
    "eval": "the dataset's reading (filters, abbreviations, gold via xrefs, lenient, limits), the linker's "
            "(re-ranker, precision, minimum confidence) and the report's (composite, suite, submission)",
    "annotate": PIPELINE, "annotate-ray": PIPELINE + ", and the Ray cluster's", "normalize": PIPELINE,
    "train rerank": TRAINER, "train biosyn": TRAINER, "train sap": TRAINER, "train extractor": TRAINER,
}


def _option_counts() -> dict[str, int]:
    import typer.main

    from linker.cli.main import app

    def walk(command, prefix=""):
        for name, sub in (getattr(command, "commands", None) or {}).items():
            yield from walk(sub, f"{prefix} {name}".strip())
        if not getattr(command, "commands", None):
            yield prefix, sum(p.param_type_name == "option" and p.name != "help" for p in command.params)

    return dict(walk(typer.main.get_command(app)))


def test_no_command_takes_more_options_than_the_limit_without_a_reason():
    long = {name: n for name, n in _option_counts().items() if n > MAX_OPTIONS and name not in LONG_COMMANDS}
    assert not long, f"commands over {MAX_OPTIONS} options (group them, or say why in LONG_COMMANDS): {long}"


def test_option_allow_list_has_no_stale_entries():
    counts = _option_counts()
    stale = [name for name in LONG_COMMANDS if counts.get(name, 0) <= MAX_OPTIONS]
    assert not stale, f"short now or gone, delete from LONG_COMMANDS: {stale}"
