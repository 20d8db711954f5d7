"""Read and check a recipe file (TOML, read with the standard library's tomllib) into a `Recipe`.

Every refusal is one line naming the file, the TOML line where it can be found, the key, what was
expected and what was found (`RecipeError`). Paths are resolved here, so that the runner only sees
absolute paths: relative to the recipe's folder, else to the repository root, else to the working
directory (the first that exists), so ``../shared/data/...`` works from a recipe under ``recipes/``.
"""

from __future__ import annotations

import dataclasses
import glob as globbing
import os
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from linker.errors import ConfigError, LinkerError

STEPS = ("dictionary", "sap", "biosyn", "rerank", "index", "calibrate", "evaluate")
REQUIRED = ("dictionary", "index", "evaluate")
# Encoders that load offline by name (linker.encoders): not paths.
BUILTIN_ENCODERS = ("linker-en", "linker-multi", "minilm", "e5-small", "multilingual-e5-small")
# Config fields a recipe does not set: how a run executes, not what it computes (--device, --threads),
# or what the recipe fills in itself (the encoder a dense index uses, how a re-ranker mines).
EXECUTION_FIELDS = {"device", "threads"}
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # a recipe's name: one path component
# How deep dictionaries may include one another: far above any real layering (a terminology, its merge with
# labelled mentions, a union of those), far below Python's recursion limit.
MAX_INCLUDE_DEPTH = 64
SOURCE_OPTION_KEYS = {"lang", "sab", "sty", "group", "current_only", "include_suppressed", "synonyms",
                      "meddra_target", "max_line_bytes", "max_document_bytes"}


class RecipeError(ConfigError):
    """A recipe that cannot run: `file:line: key: expected ..., found ...` on one line."""

    def __init__(self, file: str | Path, key: str, expected: str, found: str, *, line: int | None = None,
                 fix: str | None = None) -> None:
        self.file, self.key, self.line, self.expected, self.found = str(file), key, line, expected, found
        where = f"{file}:{line}" if line else str(file)
        message = f"{where}: {key + ': ' if key else ''}expected {expected}, found {found}"
        LinkerError.__init__(self, message + (f" ({fix})" if fix else ""))


@dataclass(frozen=True)
class Dataset:
    """A labelled dataset of the recipe: `spec` is the `linker eval --dataset` string with absolute paths."""

    name: str
    format: str
    path: Path
    options: dict  # option -> value ("" for a flag), path options included (absolute)
    path_options: dict  # option -> Path, the files options name (typos=)

    @property
    def spec(self) -> str:
        opts = "&".join(k if v == "" else f"{k}={v}" for k, v in self.options.items())
        return f"{self.format}:{self.path}" + (f"#{opts}" if opts else "")

    @property
    def files(self) -> list[Path]:
        return [self.path, *self.path_options.values()]


@dataclass(frozen=True)
class SourceEntry:
    """One entry of a dictionary's `sources`: a terminology source, labelled mentions, or another dictionary."""

    kind: str  # "source" | "mentions" | "dictionary"
    source: str = ""  # kind source: the `linker dict build --source` name
    paths: tuple[Path, ...] = ()
    options: dict = field(default_factory=dict)  # kind source: the recipe's option keys (SOURCE_OPTION_KEYS)
    dataset: str = ""  # kind mentions: the dataset whose single-concept mentions become names
    lang: str = ""  # kind mentions: their language ("" = each mention's own)
    ids: str = "first"  # kind mentions: "first" gold id, or "all" alternatives
    canonical: str = "none"  # kind mentions: "icd10cm" writes ICD-10-CM ids as S22.49XA
    dictionary: str = ""  # kind dictionary: its name


@dataclass
class Recipe:
    path: Path
    text: str
    name: str
    description: str
    encoder: str
    expect: dict
    datasets: dict[str, Dataset]
    dictionaries: dict[str, list[SourceEntry]]
    sap: dict | None = None
    biosyn: dict | None = None
    rerank: dict | None = None
    index: dict = field(default_factory=dict)
    calibrate: dict | None = None
    evaluate: dict = field(default_factory=dict)

    @property
    def test_sets(self) -> list[str]:
        return list(self.evaluate["test"])


def _kind(value: Any) -> str:
    return {bool: "a boolean", str: "a string", int: "an integer", float: "a number", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)


def shown(value: Any) -> str:
    if isinstance(value, dict):
        return f"a table with keys {', '.join(map(str, value)) or '(none)'}"
    text = repr(value)
    return f"{text if len(text) <= 80 else text[:79] + '…'} ({_kind(value)})"


class _Reader:
    """Typed access to the parsed TOML with errors that point at the key's line."""

    def __init__(self, path: Path, text: str, check_paths: bool) -> None:
        self.path, self.text, self.check_paths = path, text, check_paths
        self.folder = path.parent.resolve()
        self.lines = text.splitlines()

    # ---- errors
    def line_of(self, key: str) -> int | None:
        """The line that sets `key` (dotted, list indices ignored), or the nearest table header above it."""
        target = [p for p in re.sub(r"\[\d+\]", "", key).split(".") if p]
        header: list[str] = []
        best, best_len = None, 0
        for number, raw in enumerate(self.lines, start=1):
            line = raw.split("#", 1)[0].strip() if not raw.strip().startswith(("'", '"')) else raw.strip()
            match = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?$", line)
            if match:
                header = [p.strip().strip('"') for p in match.group(1).split(".")]
                keys = header
            else:
                match = re.match(r"^([A-Za-z0-9_\-\.\"' ]+?)\s*=", line)
                if not match:
                    continue
                keys = header + [p.strip().strip("\"'") for p in match.group(1).split(".")]
            common = 0
            for a, b in zip(keys, target):
                if a != b:
                    break
                common += 1
            if common == len(keys) and common >= best_len and common > 0:
                best, best_len = number, common
        return best

    def fail(self, key: str, expected: str, found: str, fix: str | None = None) -> NoReturn:
        raise RecipeError(self.path, key, expected, found, line=self.line_of(key), fix=fix)

    # ---- typed values
    def table(self, value: Any, key: str) -> dict:
        if not isinstance(value, dict):
            self.fail(key, "a table", shown(value))
        return value

    def keys(self, table: dict, key: str, allowed: set[str] | list[str]) -> None:
        for name in table:
            if name not in allowed:
                self.fail(f"{key}.{name}" if key else name, f"one of the keys {', '.join(sorted(allowed))}",
                          f"the unknown key {name!r}")

    def string(self, value: Any, key: str, choices: tuple[str, ...] | list[str] | None = None) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(key, "a non-empty string" + (f": one of {', '.join(choices)}" if choices else ""), shown(value))
        if choices is not None and value not in choices:
            self.fail(key, f"one of {', '.join(choices)}", shown(value))
        return value

    def strings(self, value: Any, key: str, *, one_ok: bool = True) -> list[str]:
        if isinstance(value, str) and one_ok:
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            self.fail(key, "a list of strings", shown(value))
        return list(value)

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            self.fail(key, "true or false", shown(value))
        return value

    def number(self, value: Any, key: str, *, integer: bool = False) -> int | float:
        ok = isinstance(value, int) and not isinstance(value, bool) or (not integer and isinstance(value, float))
        if not ok:
            self.fail(key, "an integer" if integer else "a number", shown(value))
        return value

    # ---- paths
    def resolve(self, text: Any, key: str, *, pattern: bool = False) -> list[Path]:
        """A recipe path: relative to the recipe's folder, else the repository, else the working directory.
        With `pattern`, shell wildcards may match several files (sorted)."""
        from linker.fileio import repo_root

        text = self.string(text, key)
        given = Path(os.path.expanduser(text))
        bases = [given] if given.is_absolute() else [self.folder / given, repo_root() / given, Path.cwd() / given]
        for candidate in bases:
            candidate = Path(os.path.normpath(candidate))
            if pattern and globbing.has_magic(str(candidate)):
                matches = sorted(Path(p) for p in globbing.glob(str(candidate)))
                if matches:
                    return matches
            elif candidate.exists():
                return [candidate]
        if self.check_paths:
            self.fail(key, "an existing file or folder (relative to the recipe's folder, the repository or the "
                      "working directory)" + (", or a pattern matching one" if pattern else ""), repr(text))
        return [Path(os.path.normpath(bases[0]))]

    def one_path(self, text: Any, key: str) -> Path:
        return self.resolve(text, key)[0]


# --------------------------------------------------------------------------- config dataclasses


def config_fields(cls: type, *, exclude: set[str] = frozenset()) -> dict[str, Any]:
    """The fields a recipe may set on the config dataclass `cls`, with their types."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)
            if f.name not in EXECUTION_FIELDS and f.name not in exclude and f.init}


def _type_name(hint: Any) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args:
        return " or ".join(_type_name(a) for a in args)
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, getattr(hint, "__name__", str(hint)))


def typed_value(reader: _Reader, hint: Any, value: Any, key: str) -> Any:
    """`value` checked against the dataclass field type `hint` (int, float, bool, str, X | None, a dataclass)."""
    options = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    for option in options:
        if dataclasses.is_dataclass(option) and isinstance(value, dict):
            return build_config(reader, option, value, key)
        if option is bool and isinstance(value, bool):
            return value
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if option is str and isinstance(value, str):
            return value
    reader.fail(key, _type_name(hint), shown(value))


def build_config(reader: _Reader, cls: type, table: dict, key: str, *, exclude: set[str] = frozenset(),
                 extra: dict | None = None) -> Any:
    """`cls(**table)` with each key and type checked; its own checks (`__post_init__`) become recipe errors."""
    fields = config_fields(cls, exclude=exclude)
    reader.keys(table, key, set(fields))
    values = {name: typed_value(reader, fields[name], value, f"{key}.{name}") for name, value in table.items()}
    try:
        return cls(**values, **(extra or {}))
    except LinkerError as exc:
        reader.fail(key, f"valid {cls.__name__} settings", str(exc))


# --------------------------------------------------------------------------- the recipe


def load_recipe(path: str | Path, *, check_paths: bool = True) -> Recipe:
    """Read and check the recipe at `path`; RecipeError (one line) when it cannot run as written."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(path, "", "a recipe file (TOML)", "no such file" if not path.exists() else "a folder")
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = re.search(r"\(at line (\d+), column (\d+)\)", message)
        line = int(match.group(1)) if match else None
        raise RecipeError(path, "", "valid TOML", re.sub(r"\s*\(at line \d+, column \d+\)", "", message),
                          line=line) from None
    return _parse(_Reader(path, text, check_paths), data)


def _parse(r: _Reader, data: dict) -> Recipe:
    r.keys(data, "", set(STEPS) | {"recipe", "datasets"})
    for step in REQUIRED:
        if step not in data:
            r.fail(step, f"a [{step}] table (every recipe has [dictionary.NAME], [index] and [evaluate])",
                   "none")
    meta = r.table(data.get("recipe", {}), "recipe")
    r.keys(meta, "recipe", {"name", "description", "encoder", "expect"})
    encoder = r.string(meta.get("encoder", "minilm"), "recipe.encoder")
    expect = r.table(meta.get("expect", {}), "recipe.expect")
    r.keys(expect, "recipe.expect", {"test", "filter", "lang", "composite", "acc1", "acc5", "report"})
    for name in ("acc1", "acc5"):
        if name in expect:
            r.number(expect[name], f"recipe.expect.{name}")
    datasets = {name: _dataset(r, name, value) for name, value in r.table(data.get("datasets", {}), "datasets").items()}
    recipe = Recipe(
        path=r.path.resolve(), text=r.text, name=_recipe_name(r, meta),
        description=r.string(meta["description"], "recipe.description") if "description" in meta else "", encoder=_encoder_name(r, encoder, "recipe.encoder"),
        expect=expect, datasets=datasets, dictionaries={},
    )
    dictionaries = r.table(data["dictionary"], "dictionary")
    if not dictionaries:
        r.fail("dictionary", "at least one [dictionary.NAME] table with sources", "none")
    for name, table in dictionaries.items():
        recipe.dictionaries[name] = _dictionary(r, recipe, name, table)
    _check_dictionary_cycles(r, recipe)
    if "sap" in data:
        recipe.sap = _sap(r, recipe, r.table(data["sap"], "sap"))
    if "biosyn" in data:
        recipe.biosyn = _biosyn(r, recipe, r.table(data["biosyn"], "biosyn"))
    if "rerank" in data:
        recipe.rerank = _rerank(r, recipe, r.table(data["rerank"], "rerank"))
    recipe.index = _index(r, recipe, r.table(data["index"], "index"))
    if "calibrate" in data:
        recipe.calibrate = _calibrate(r, recipe, r.table(data["calibrate"], "calibrate"))
    recipe.evaluate = _evaluate(r, recipe, r.table(data["evaluate"], "evaluate"))
    _check_test_isolation(r, recipe)
    if expect.get("test") is not None and expect["test"] not in recipe.evaluate["test"]:
        r.fail("recipe.expect.test", f"one of the test sets {', '.join(recipe.evaluate['test'])}", shown(expect["test"]))
    return recipe


def _recipe_name(r: _Reader, meta: dict) -> str:
    """The recipe's name is an identifier, never a path: it names the default output `out/recipes/NAME`, so a
    `..` or `/` in it would move that output anywhere."""
    name = r.string(meta.get("name", r.path.stem), "recipe.name")
    if not NAME_PATTERN.fullmatch(name) or ".." in name:
        given = "" if "name" in meta else " (the file's name: [recipe] sets no name)"
        r.fail("recipe.name", "a name of letters, digits, '.', '_' and '-' (at most 100, starting with a letter "
               "or digit, no '..')", repr(name) + given)
    return name


def _dataset(r: _Reader, name: str, value: Any) -> Dataset:
    from linker.datasets import LOADERS, PATH_OPTIONS

    key = f"datasets.{name}"
    if isinstance(value, str):  # FORMAT:PATH[#OPTIONS], as `linker eval --dataset`
        fmt, sep, rest = value.partition(":")
        if not sep or not rest:
            r.fail(key, "FORMAT:PATH[#OPTIONS] or a table with format and path", shown(value))
        raw_path, _, opts = rest.partition("#")
        options = {}
        for item in filter(None, opts.split("&")):
            option, _, option_value = item.partition("=")
            options[option.strip()] = option_value.strip()
        path_key = key
    elif isinstance(value, dict):
        r.keys(value, key, {"format", "path", "options"})
        for required in ("format", "path"):
            if required not in value:
                r.fail(f"{key}.{required}", f"the dataset's {required}", "none")
        fmt, raw_path = r.string(value["format"], f"{key}.format"), value["path"]
        options = {}
        for option, option_value in r.table(value.get("options", {}), f"{key}.options").items():
            if option_value is True:
                options[option] = ""
            elif option_value is False:
                continue
            elif isinstance(option_value, (str, int, float)) and not isinstance(option_value, bool):
                options[option] = str(option_value)
            else:
                r.fail(f"{key}.options.{option}", "true, false, a string or a number", shown(option_value))
        path_key = f"{key}.path"
    else:
        r.fail(key, "FORMAT:PATH[#OPTIONS] or a table with format and path", shown(value))
    if fmt not in LOADERS:
        r.fail(f"{key}.format" if isinstance(value, dict) else key, f"a dataset format: {', '.join(sorted(LOADERS))}",
               repr(fmt))
    path = r.one_path(raw_path, path_key)
    path_options = {}
    for option in PATH_OPTIONS:
        if options.get(option):
            option_key = f"{key}.options.{option}" if isinstance(value, dict) else key
            path_options[option] = r.one_path(options[option], option_key)
            options[option] = str(path_options[option])
    for shown_path in [path, *path_options.values()]:
        if any(c in str(shown_path) for c in "#&"):
            r.fail(path_key, "a path without '#' or '&' (they separate a dataset spec's options)", repr(str(shown_path)))
    return Dataset(name, fmt, path, options, path_options)


def _dataset_ref(r: _Reader, recipe: Recipe, value: Any, key: str) -> str:
    name = r.string(value, key)
    if name not in recipe.datasets:
        r.fail(key, f"the name of a dataset under [datasets] ({', '.join(recipe.datasets) or 'none defined'})",
               repr(name))
    return name


def _dataset_refs(r: _Reader, recipe: Recipe, value: Any, key: str) -> list[str]:
    return [_dataset_ref(r, recipe, v, f"{key}[{i}]") for i, v in enumerate(r.strings(value, key))]


def _dictionary(r: _Reader, recipe: Recipe, name: str, table: Any) -> list[SourceEntry]:
    from linker.sources import available_sources

    key = f"dictionary.{name}"
    table = r.table(table, key)
    r.keys(table, key, {"sources"})
    sources = table.get("sources")
    if not isinstance(sources, list) or not sources:
        r.fail(f"{key}.sources", "a non-empty list of sources ({source = ..., paths = [...]}, {mentions = DATASET}, "
               "{dictionary = NAME})", shown(sources))
    entries = []
    for i, entry in enumerate(sources):
        ekey = f"{key}.sources[{i}]"
        entry = r.table(entry, ekey)
        kinds = [k for k in ("source", "mentions", "dictionary") if k in entry]
        if len(kinds) != 1:
            r.fail(ekey, "exactly one of source, mentions or dictionary", shown(entry))
        if kinds[0] == "source":
            r.keys(entry, ekey, {"source", "paths"} | SOURCE_OPTION_KEYS)
            source = r.string(entry["source"], f"{ekey}.source", available_sources())
            paths = [p for j, text in enumerate(r.strings(entry.get("paths", []), f"{ekey}.paths"))
                     for p in r.resolve(text, f"{ekey}.paths[{j}]", pattern=True)]
            options = {}
            for option in SOURCE_OPTION_KEYS & set(entry):
                value = entry[option]
                if option in ("current_only", "include_suppressed"):
                    options[option] = r.boolean(value, f"{ekey}.{option}")
                elif option in ("max_line_bytes", "max_document_bytes"):
                    options[option] = r.number(value, f"{ekey}.{option}", integer=True)
                elif option == "meddra_target":
                    options[option] = r.string(value, f"{ekey}.{option}", ("pt", "llt"))
                else:
                    options[option] = r.strings(value, f"{ekey}.{option}")
            entries.append(SourceEntry("source", source=source, paths=tuple(paths), options=options))
        elif kinds[0] == "mentions":
            r.keys(entry, ekey, {"mentions", "lang", "ids", "canonical"})
            entries.append(SourceEntry(
                "mentions", dataset=_dataset_ref(r, recipe, entry["mentions"], f"{ekey}.mentions"),
                lang=r.string(entry["lang"], f"{ekey}.lang") if "lang" in entry else "",
                ids=r.string(entry.get("ids", "first"), f"{ekey}.ids", ("first", "all")),
                canonical=r.string(entry.get("canonical", "none"), f"{ekey}.canonical", ("none", "icd10cm"))))
        else:
            r.keys(entry, ekey, {"dictionary"})
            entries.append(SourceEntry("dictionary", dictionary=r.string(entry["dictionary"], f"{ekey}.dictionary")))
    return entries


def _check_dictionary_cycles(r: _Reader, recipe: Recipe) -> None:
    """Every `{ dictionary = NAME }` names a dictionary of the recipe, no dictionary includes itself, and none
    is more than MAX_INCLUDE_DEPTH includes deep; then `recipe.dictionaries` is put in an order where each one
    follows those it includes (the order of definition where it already does), so that a dictionary may
    include one defined later in the file.

    One iterative depth-first walk: each dictionary is entered once (memoised), so a recipe whose
    dictionaries each include the next twice takes linear time, not 2**depth, and a long chain cannot
    exhaust Python's stack."""
    names = recipe.dictionaries
    for name, entries in names.items():
        for i, entry in enumerate(entries):
            if entry.kind == "dictionary" and entry.dictionary not in names:
                r.fail(f"dictionary.{name}.sources[{i}].dictionary",
                       f"the name of another dictionary ({', '.join(n for n in names if n != name)})",
                       repr(entry.dictionary))
    includes = {name: list(dict.fromkeys(e.dictionary for e in entries if e.kind == "dictionary"))
                for name, entries in names.items()}
    done: set[str] = set()
    order: list[str] = []
    for root in names:
        if root in done:
            continue
        path, on_path = [root], {root}  # the chain being walked, and each one's next include to enter
        pending = [iter(includes[root])]
        while path:
            child = next(pending[-1], None)
            if child is None:
                finished = path.pop()
                on_path.discard(finished)
                pending.pop()
                done.add(finished)
                order.append(finished)
            elif child in on_path:
                cycle = [*path[path.index(child):], child]
                r.fail(f"dictionary.{cycle[0]}.sources", "dictionaries that do not include themselves",
                       " -> ".join(cycle))
            elif child not in done:
                if len(path) >= MAX_INCLUDE_DEPTH:
                    r.fail(f"dictionary.{root}.sources", f"dictionaries included at most {MAX_INCLUDE_DEPTH} deep",
                           f"{' -> '.join(path[:3])} -> ... -> {child} ({len(path) + 1} deep)")
                path.append(child)
                on_path.add(child)
                pending.append(iter(includes[child]))
    recipe.dictionaries = {name: names[name] for name in order}


def _dictionary_ref(r: _Reader, recipe: Recipe, table: dict, key: str) -> str:
    names = list(recipe.dictionaries)
    if "dictionary" not in table:
        if len(names) == 1:
            return names[0]
        r.fail(f"{key}.dictionary", f"the name of one of the dictionaries {', '.join(names)}", "none")
    return r.string(table["dictionary"], f"{key}.dictionary", names)


def _encoder_name(r: _Reader, value: str, key: str) -> str:
    """An alias, a model folder (resolved like every recipe path) or a hub name; `@sap`/`@biosyn` are kept."""
    if value.startswith("@") or value.split("#")[0] in BUILTIN_ENCODERS:
        return value
    base, sep, pooling = value.rpartition("#") if value.endswith(("#cls", "#mean")) else (value, "", "")
    given = Path(os.path.expanduser(base))
    from linker.fileio import repo_root

    for folder in ([given] if given.is_absolute() else [r.folder / given, repo_root() / given, Path.cwd() / given]):
        if folder.is_dir():
            return f"{os.path.normpath(folder)}{sep}{pooling}"
    if base.startswith((".", "/", "~")) and r.check_paths:  # a path, not a hub name
        r.fail(key, "minilm, e5-small, an existing model folder or a hub name", repr(value))
    return value


def _encoder(r: _Reader, recipe: Recipe, table: dict, key: str, *, allowed: tuple[str, ...], default: str) -> str:
    value = r.string(table.get("encoder", default), f"{key}.encoder")
    if value.startswith("@"):
        stage = value[1:]
        defined = [s for s in allowed if getattr(recipe, s) is not None]
        if stage not in defined:
            r.fail(f"{key}.encoder", "a model name or folder, or the model of an earlier stage: "
                   + (", ".join("@" + s for s in defined) or "(none defined before it)"), repr(value))
        return value
    return _encoder_name(r, value, f"{key}.encoder")


def _sap(r: _Reader, recipe: Recipe, table: dict) -> dict:
    from linker.train.sap import SapConfig

    own = {"dictionary", "encoder"}
    config = build_config(r, SapConfig, {k: v for k, v in table.items() if k not in own}, "sap")
    return {"dictionary": _dictionary_ref(r, recipe, table, "sap"),
            "encoder": _encoder(r, recipe, table, "sap", allowed=(), default=recipe.encoder),
            "config": config}


def _biosyn(r: _Reader, recipe: Recipe, table: dict) -> dict:
    from linker.train.biosyn import BiosynConfig

    own = {"dictionary", "encoder", "train", "monitor", "choose"}
    config = build_config(r, BiosynConfig, {k: v for k, v in table.items() if k not in own}, "biosyn")
    if "train" not in table:
        r.fail("biosyn.train", "the names of the training datasets", "none")
    out = {"dictionary": _dictionary_ref(r, recipe, table, "biosyn"),
           "encoder": _encoder(r, recipe, table, "biosyn", allowed=("sap",),
                               default="@sap" if recipe.sap is not None else recipe.encoder),
           "train": _dataset_refs(r, recipe, table["train"], "biosyn.train"),
           "monitor": _dataset_ref(r, recipe, table["monitor"], "biosyn.monitor") if "monitor" in table else None,
           "config": config, "choose": None}
    if "choose" in table:
        out["choose"] = _choose(r, recipe, r.table(table["choose"], "biosyn.choose"), out, config)
    return out


def _choose(r: _Reader, recipe: Recipe, table: dict, biosyn: dict, base) -> dict:
    """BioSyn's hyper-parameters (and epochs) chosen on dev: each point trained on `train`, scored on `dev`."""
    import itertools

    from linker.train.biosyn import BiosynConfig

    key = "biosyn.choose"
    r.keys(table, key, {"dev", "train", "grid", "points", "epochs"})
    dev = _dataset_ref(r, recipe, table.get("dev", "dev"), f"{key}.dev")
    train = (_dataset_refs(r, recipe, table["train"], f"{key}.train") if "train" in table
             else [d for d in biosyn["train"] if d != dev])
    if dev in train:
        r.fail(f"{key}.train", f"training sets other than the dev set {dev!r} that scores the points", shown(train))
    if not train:
        r.fail(f"{key}.train", "at least one training dataset besides the dev set", "none")
    fields = config_fields(BiosynConfig, exclude={"max_seconds"})
    points: list[dict] = []
    if "grid" in table:
        grid = r.table(table["grid"], f"{key}.grid")
        r.keys(grid, f"{key}.grid", set(fields))
        axes = []
        for name, values in grid.items():
            if not isinstance(values, list) or not values:
                r.fail(f"{key}.grid.{name}", "a non-empty list of values", shown(values))
            axes.append([(name, typed_value(r, fields[name], v, f"{key}.grid.{name}")) for v in values])
        points += [dict(p) for p in itertools.product(*axes)]
    for i, point in enumerate(table.get("points", [])):
        point = r.table(point, f"{key}.points[{i}]")
        r.keys(point, f"{key}.points[{i}]", set(fields))
        points.append({n: typed_value(r, fields[n], v, f"{key}.points[{i}].{n}") for n, v in point.items()})
    if not points:
        r.fail(key, "grid = {NAME = [values]} or points = [{NAME = value}, ...] to choose among", "none")
    for i, point in enumerate(points):
        try:
            dataclasses.replace(base, **point)
        except LinkerError as exc:
            r.fail(key, "valid BioSyn settings at every point", f"{point}: {exc}")
    return {"dev": dev, "train": train, "points": points,
            "epochs": r.boolean(table.get("epochs", False), f"{key}.epochs")}


def _rerank(r: _Reader, recipe: Recipe, table: dict) -> dict:
    from linker.rerank import DEFAULT_RERANK_K
    from linker.train.rerank import RerankConfig

    own = {"dictionary", "encoder", "train", "mine", "mine_preset", "rerank_k"}
    config = build_config(r, RerankConfig, {k: v for k, v in table.items() if k not in own}, "rerank",
                          exclude={"mining", "mine_index"})
    mine = r.string(table.get("mine", "tfidf"), "rerank.mine", ("tfidf", "index"))
    preset = None
    if "mine_preset" in table:
        from linker.index.tfidf import PRESETS

        preset = r.string(table["mine_preset"], "rerank.mine_preset", list(PRESETS))
        if mine != "tfidf":
            r.fail("rerank.mine_preset", "no tf-idf preset with mine = \"index\" (the index mines)", repr(preset))
    return {"dictionary": _dictionary_ref(r, recipe, table, "rerank"),
            "encoder": _encoder(r, recipe, table, "rerank", allowed=("sap", "biosyn"), default=recipe.encoder),
            "train": _dataset_refs(r, recipe, table.get("train", []), "rerank.train"),
            "mine": mine, "mine_preset": preset,
            "rerank_k": r.number(table.get("rerank_k", DEFAULT_RERANK_K), "rerank.rerank_k", integer=True),
            "config": config}


def _tfidf_config(r: _Reader, table: dict, key: str):
    from linker.index.tfidf import PRESETS, TfidfConfig

    table = dict(r.table(table, key))
    r.keys(table, key, set(config_fields(TfidfConfig, exclude={"preset"})) | {"preset"})
    preset = table.pop("preset", None)
    if preset is None:
        return build_config(r, TfidfConfig, table, key, exclude={"preset"})
    preset = r.string(preset, f"{key}.preset", list(PRESETS))
    clash = sorted({"analyzer", "ngram_min", "ngram_max", "normalization", "sublinear_tf"} & set(table))
    if clash:
        r.fail(f"{key}.{clash[0]}", f"no {', '.join(clash)} beside preset {preset!r} (the preset sets them)",
               shown(table[clash[0]]))
    fields = config_fields(TfidfConfig, exclude={"preset"})
    r.keys(table, key, set(fields))
    values = {n: typed_value(r, fields[n], v, f"{key}.{n}") for n, v in table.items()}
    try:
        return dataclasses.replace(PRESETS[preset], **values)
    except LinkerError as exc:
        r.fail(key, "valid tf-idf settings", str(exc))


def _index(r: _Reader, recipe: Recipe, table: dict) -> dict:
    from linker.index import available_kinds

    r.keys(table, "index", {"kind", "dictionary", "encoder", "prior", "reranker", "sparse_weight", "dev",
                            "tfidf", "dense"})
    kind = r.string(table.get("kind", "tfidf"), "index.kind", available_kinds())
    out: dict[str, Any] = {"kind": kind, "dictionary": _dictionary_ref(r, recipe, table, "index"),
                           "prior": _dataset_refs(r, recipe, table.get("prior", []), "index.prior")}
    if "tfidf" in table and kind == "dense":
        r.fail("index.tfidf", "no [index.tfidf] for kind dense", shown(table["tfidf"]))
    if "dense" in table and kind == "tfidf":
        r.fail("index.dense", "no [index.dense] for kind tfidf", shown(table["dense"]))
    if kind != "tfidf" or "encoder" in table:
        default = "@biosyn" if recipe.biosyn is not None else "@sap" if recipe.sap is not None else recipe.encoder
        out["encoder"] = _encoder(r, recipe, table, "index", allowed=("sap", "biosyn"), default=default)
        if kind == "tfidf":
            r.fail("index.encoder", "no encoder for kind tfidf", repr(table["encoder"]))
    if kind in ("tfidf", "hybrid"):
        out["tfidf"] = _tfidf_config(r, table.get("tfidf", {}), "index.tfidf")
    if kind in ("dense", "hybrid"):
        from linker.index.dense import DenseConfig

        out["dense"] = build_config(r, DenseConfig, r.table(table.get("dense", {}), "index.dense"), "index.dense",
                                    exclude={"encoder"})
    weight = table.get("sparse_weight")
    if weight is not None:
        if kind != "hybrid":
            r.fail("index.sparse_weight", "no sparse_weight for kind " + kind + " (hybrid only)", shown(weight))
        if isinstance(weight, str):
            r.string(weight, "index.sparse_weight", ("learned", "tuned"))
            if weight == "learned" and recipe.biosyn is None:
                r.fail("index.sparse_weight", "a [biosyn] stage whose learned weight to use", "none")
        else:
            weight = float(r.number(weight, "index.sparse_weight"))
    out["sparse_weight"] = weight
    if weight == "tuned":
        out["dev"] = _dataset_ref(r, recipe, table.get("dev", "dev"), "index.dev")
    elif "dev" in table:
        r.fail("index.dev", "no dev set unless sparse_weight = \"tuned\"", shown(table["dev"]))
    bind = table.get("reranker", recipe.rerank is not None)
    if r.boolean(bind, "index.reranker") and recipe.rerank is None:
        r.fail("index.reranker", "a [rerank] stage to bind", "none")
    out["reranker"] = bool(bind)
    return out


def _calibrate(r: _Reader, recipe: Recipe, table: dict) -> dict:
    r.keys(table, "calibrate", {"dataset", "composite", "gold_via_xref", "query_lang"})
    return {"dataset": _dataset_ref(r, recipe, table.get("dataset", "dev"), "calibrate.dataset"),
            "composite": r.string(table.get("composite", "all"), "calibrate.composite", ("all", "any")),
            "gold_via_xref": r.string(table["gold_via_xref"], "calibrate.gold_via_xref") if "gold_via_xref" in table else None,
            "query_lang": r.boolean(table.get("query_lang", False), "calibrate.query_lang")}


def _evaluate(r: _Reader, recipe: Recipe, table: dict) -> dict:
    from linker.eval.filters import FILTERS

    key = "evaluate"
    r.keys(table, key, {"test", "train", "filters", "k", "composite", "mode", "abbreviations", "gold_via_xref",
                        "query_lang", "lenient", "nil_fraction", "min_confidence", "precision"})
    tests = _dataset_refs(r, recipe, table.get("test", "test"), f"{key}.test")
    default_train = ["train"] if "train" in recipe.datasets and "train" not in tests else []
    filters = r.strings(table.get("filters", ["full"]), f"{key}.filters")
    for i, name in enumerate(filters):
        r.string(name, f"{key}.filters[{i}]", [*FILTERS, "all"])
    ks = table.get("k", [1, 5])
    if not isinstance(ks, list) or not ks or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in ks):
        r.fail(f"{key}.k", "a list of positive integers such as [1, 5]", shown(ks))
    composite = r.strings(table.get("composite", "all"), f"{key}.composite")
    for i, rule in enumerate(composite):
        r.string(rule, f"{key}.composite[{i}]", ("all", "any"))
    out = {"test": tests, "train": _dataset_refs(r, recipe, table.get("train", default_train), f"{key}.train"),
           "filters": filters, "k": sorted(set(ks)), "composite": composite,
           "mode": r.string(table.get("mode", "faithful"), f"{key}.mode", ("faithful", "biosyn")),
           "abbreviations": r.one_path(table["abbreviations"], f"{key}.abbreviations") if "abbreviations" in table else None,
           "gold_via_xref": r.string(table["gold_via_xref"], f"{key}.gold_via_xref") if "gold_via_xref" in table else None,
           "query_lang": r.boolean(table.get("query_lang", False), f"{key}.query_lang"),
           "lenient": r.boolean(table.get("lenient", False), f"{key}.lenient"),
           "nil_fraction": float(r.number(table.get("nil_fraction", 0.0), f"{key}.nil_fraction")),
           "min_confidence": float(r.number(table.get("min_confidence", 0.5), f"{key}.min_confidence")),
           "precision": r.string(table["precision"], f"{key}.precision", ("auto", "fp32", "bf16", "int8"))
           if "precision" in table else None}
    if not 0.0 <= out["nil_fraction"] < 1.0:
        r.fail(f"{key}.nil_fraction", "a share from 0 to below 1", shown(table["nil_fraction"]))
    if any(f.startswith("train") for f in filters) and not out["train"]:
        r.fail(f"{key}.train", "the training datasets the train filters compare with", "none")
    return out


def _check_test_isolation(r: _Reader, recipe: Recipe) -> None:
    """Test data is read once, by [evaluate]: no other stage may name a test set, or a dataset reading its files."""
    tests = set(recipe.evaluate["test"])
    uses: list[tuple[str, str]] = []
    for name, entries in recipe.dictionaries.items():
        uses += [(f"dictionary.{name}.sources[{i}].mentions", e.dataset) for i, e in enumerate(entries) if e.kind == "mentions"]
    if recipe.biosyn:
        uses += [(f"biosyn.train[{i}]", d) for i, d in enumerate(recipe.biosyn["train"])]
        if recipe.biosyn["monitor"]:
            uses.append(("biosyn.monitor", recipe.biosyn["monitor"]))
        if recipe.biosyn["choose"]:
            choose = recipe.biosyn["choose"]
            uses += [("biosyn.choose.dev", choose["dev"])] + [(f"biosyn.choose.train[{i}]", d)
                                                              for i, d in enumerate(choose["train"])]
    if recipe.rerank:
        uses += [(f"rerank.train[{i}]", d) for i, d in enumerate(recipe.rerank["train"])]
    uses += [(f"index.prior[{i}]", d) for i, d in enumerate(recipe.index["prior"])]
    if recipe.index.get("dev"):
        uses.append(("index.dev", recipe.index["dev"]))
    if recipe.calibrate:
        uses.append(("calibrate.dataset", recipe.calibrate["dataset"]))
    uses += [(f"evaluate.train[{i}]", d) for i, d in enumerate(recipe.evaluate["train"])]
    for key, name in uses:
        if name in tests:
            r.fail(key, "a dataset other than the test set (test data is read once, by [evaluate]; choose on dev)",
                   repr(name))
    # ...nor a dataset that reads the test set's mentions under another name (a shared typo list is fine)
    test_files = {os.path.normpath(recipe.datasets[t].path): t for t in tests}
    for name, dataset in recipe.datasets.items():
        if name not in tests and os.path.normpath(dataset.path) in test_files:
            r.fail(f"datasets.{name}", f"mentions other than those of the test set "
                   f"{test_files[os.path.normpath(dataset.path)]!r}", repr(str(dataset.path)))
