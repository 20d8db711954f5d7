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
