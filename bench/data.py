"""One catalogue of the real data in ../shared/data (the folder beside the checkout; $LINKER_SHARED_DATA overrides).

Each entry names its files and how `linker eval --dataset` reads its splits:

    from bench import data
    ncbi = data.get("ncbi")
    ncbi.path("medic")            # ../shared/data/ncbi_disease/medic_06Jul2012.txt (MissingData if absent)
    ncbi.spec("test")             # pubtator:../shared/data/ncbi_disease/NCBItestset_corpus.txt
    data.skip_reason("ncbi")      # None, or why a test must skip (pytest.skip(reason))

`python -m bench.data` lists the catalogue and what is present.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = "LINKER_SHARED_DATA"


def root() -> Path:
    """The shared data folder: $LINKER_SHARED_DATA, else ../shared/data beside the checkout."""
    return Path(os.environ.get(ENV) or REPO.parent / "shared" / "data")


class MissingData(FileNotFoundError):
    """A dataset or file of the catalogue is not there; the message says where it was looked for."""


@dataclass(frozen=True)
class Dataset:
    name: str
    folder: str  # inside root()
    what: str
    files: dict[str, str]  # role -> file name (or glob) inside the folder
    format: str | None = None  # `linker eval --dataset` FORMAT of its splits (None: not a linking test set)
    options: str = ""  # #options every spec of its splits carries
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return root() / self.folder

    def missing(self) -> str | None:
        """Why this dataset cannot be read here (None when its folder is present)."""
        if self.dir.is_dir():
            return None
        return (f"{self.name}: {self.dir} not found (the shared data folder: set ${ENV} or place it at "
                f"../shared/data beside the checkout)")

    def check(self) -> Dataset:
        reason = self.missing()
        if reason:
            raise MissingData(reason)
        return self

    def path(self, role: str) -> Path:
        """The one file of `role` (its glob's first match); MissingData when absent."""
        found = self.paths(role)
        if not found:
            raise MissingData(f"{self.name}: no {self.files[role]!r} in {self.dir} ({self.missing() or 'file absent'})")
        return found[0]

    def paths(self, role: str) -> list[Path]:
        """Every file of `role` (a glob gives several, sorted); [] when the folder is absent."""
        if role not in self.files:
            raise KeyError(f"{self.name} has no file {role!r}; it has {', '.join(self.files)}")
        pattern = self.files[role]
        if any(ch in pattern for ch in "*?["):
            return sorted(self.dir.glob(pattern))
        return [self.dir / pattern] if (self.dir / pattern).exists() else []

    def spec(self, split: str = "test", options: str = "") -> str:
        """The `linker eval --dataset` / `--train` spec of a split, with the entry's and these #options."""
        if self.format is None:
            raise ValueError(f"{self.name} is not a linking test set (no dataset format)")
        joined = "&".join(o for o in (self.options, options) if o)
        return f"{self.format}:{self.path(split)}" + (f"#{joined}" if joined else "")


CATALOGUE: dict[str, Dataset] = {d.name: d for d in (
    Dataset("ncbi", "ncbi_disease", "NCBI-disease (PubTator; 960 test mentions) with MEDIC 2012 and BioSyn's typo list",
            {"train": "NCBItrainset_corpus.txt", "dev": "NCBIdevelopset_corpus.txt", "test": "NCBItestset_corpus.txt",
             "medic": "medic_06Jul2012.txt", "typos": "ncbi-spell-check.txt"}, format="pubtator",
            notes={"biosyn": "BioSyn's preprocessing: spec(split, f'biosyn&typos={path(\"typos\")}')"}),
    Dataset("cantemist", "cantemist", "Cantemist (es oncology cases, brat in zip) with the ICD-O-3 code list",
            {"train": "train.zip", "dev1": "dev1.zip", "dev2": "dev2.zip", "test": "test.zip",
             "codes": "valid-codes.tsv"}, format="brat", options="lang=es"),
    Dataset("codiesp", "codiesp", "CodiEsp-D (es cases, ICD-10-CM diagnoses; `#D` keeps DIAGNOSTICO rows)",
            {"train": "trainX.tsv", "dev": "devX.tsv", "test": "testX.tsv"}, format="codiesp", options="D"),
    Dataset("mantra", "mantra_gsc", "Mantra GSC (en/es/fr/de/nl brat in zip, UMLS CUIs: --gold-via-xref UMLS)",
            {"test": "Mantra-GSC-brat.zip"}, format="brat"),
    Dataset("hpo", "hpo", "HPO 2025-01-16 (obo) and its translations (Babelon) and synonyms",
            {"obo": "hp.obo*", "babelon": "hp-*.babelon.tsv", "synonyms": "hp-*.synonyms.tsv"}),
    Dataset("doid", "doid", "Human Disease Ontology 2017-02", {"obo": "*.obo*"}),
    Dataset("phee", "phee", "PHEE pharmacovigilance sentences (brat in zip; spans only, no concept ids)",
            {"train": "train.zip", "dev": "dev.zip", "test": "test.zip"}),
    Dataset("tac2017", "tac2017", "TAC 2017 ADR training labels (101 FDA labels, XML, MedDRA PT/LLT)",
            {"train": "train_xml"}, format="ade-xml"),
)}


def get(name: str) -> Dataset:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise KeyError(f"no dataset {name!r} in bench.data; known: {', '.join(CATALOGUE)}") from None


def skip_reason(*names: str) -> str | None:
    """The first reason one of these datasets is missing (for pytest.skip), None when all are present."""
    return next((reason for name in names if (reason := get(name).missing())), None)


def hpo_files() -> list[Path]:
    """HPO with its translations and synonyms, as the OBO source reads them (one dictionary)."""
    hpo = get("hpo").check()
    return hpo.paths("obo") + hpo.paths("babelon") + hpo.paths("synonyms")


# ---- readers and builders the benchmarks share ----------------------------------------------


def medic_names() -> list[str]:
    """MEDIC's unique names (lines `ID|ALT_IDS||name|synonym|...`), in file order."""
    seen: dict[str, None] = {}
    for line in get("ncbi").path("medic").read_text(encoding="utf-8").splitlines():
        _, sep, rest = line.partition("||")
        for name in rest.split("|") if sep else ():
            if name.strip():
                seen.setdefault(name.strip(), None)
    return list(seen)


def pubtator_texts(split: str = "test") -> list[str]:
    """The mention texts of an NCBI-disease split as the file has them (one per annotation line)."""
    lines = get("ncbi").path(split).read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[3] for line in lines if line.count("\t") >= 5]


def mention_names(specs: list[str], out: Path, *, lang: str | None = None, canonical=lambda code: code) -> Path:
    """Single-concept training mentions as `code<TAB>mention[<TAB>lang]` rows (a tsv source to add to a
    dictionary), each row once."""
    from linker.datasets import load_dataset
    from linker.fileio import atomic_file

    rows = [f"{canonical(c)}\t{m.text}" + (f"\t{lang}" if lang else "")
            for spec in specs for m in load_dataset(spec) if len(m.gold) == 1 for c in m.gold[0][: None if lang is None else 1]]
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as tmp:
        tmp.write_text("\n".join(dict.fromkeys(rows)) + "\n", encoding="utf-8")
    return out


def ncbi_train_dev_names(out: Path) -> Path:
    """NCBI-disease's train + dev mentions as names of their gold ids (BioSyn's protocol)."""
    ncbi = get("ncbi")
    return mention_names([ncbi.spec("train"), ncbi.spec("dev")], out)


def dictionary(out: Path, sources, *, rebuild: bool = False, options=None) -> Path:
    """A concept table built once (`linker dict build` as a function); kept when it exists unless `rebuild`."""
    from linker.dictionary import build_dictionary
    from linker.sources import SourceOptions

    if rebuild or not out.exists():
        build_dictionary(sources, out, options=options or SourceOptions(), overwrite=rebuild)
    return out


def main() -> None:
    print(f"shared data: {root()}" + ("" if root().is_dir() else " (absent)"))
    for d in CATALOGUE.values():
        state = "absent" if d.missing() else "present"
        print(f"{d.name:10} {state:8} {d.folder}/: {d.what}")
        if not d.missing() and d.format:
            print(f"{'':20}--dataset {d.spec('test' if 'test' in d.files else next(iter(d.files)))}")


if __name__ == "__main__":
    main()
