"""A tf-idf index's config, its presets and its `linker index build` options (`linker.index.tfidf` builds and searches).

Apart from `linker.index.tfidf` so that the command line reads its options without importing scikit-learn and numba
(seconds of every `linker` command).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from linker.errors import ConfigError, UnknownNameError
from linker.index.manifest import typed_parameters
from linker.index.options import option
from linker.text import MODES


ANALYZERS = ("char", "char_wb")
SEARCHES = ("auto", "exact", "maxscore", "approximate")  # TfidfConfig.search (module docstring)


@dataclass(frozen=True)
class TfidfConfig:
    """Build parameters of a tf-idf index; recorded in the manifest and used again on load."""

    analyzer: str = field(default="char_wb", metadata=option(  # n-grams inside word boundaries (`linker.index.tfidf`)
        "--analyzer", "tf-idf: char_wb (n-grams inside word boundaries, default) or char."))
    ngram_min: int = field(default=3, metadata=option(
        "--ngram", "tf-idf: character n-gram range MIN,MAX (default 3,3).", type=str, parse=lambda text: ngram_fields(text)))
    ngram_max: int = 3
    normalization: str = field(default="biosyn", metadata=option(  # linker.text.normalize mode of names and mentions
        "--normalization", "tf-idf: text normalisation of names and mentions: biosyn (default), default, words, faithful."))
    sublinear_tf: bool = False  # scikit-learn's default, as the baseline used it
    query_chunk: int = 1024  # queries per sparse product: bounds memory at chunk * top_n scores
    threads: int = field(default=2, metadata=option(  # sp_matmul_topn threads; 2 = the project's CPU budget per process
        "--threads", "Threads of the tf-idf product (default 2) and of torch/FAISS (default: all cores)."))
    preset: str = field(default="", metadata=option(  # the named preset these came from ("" = none); in the manifest
        "--preset", "tf-idf: a named setting, e.g. medical-crossing (char 1,2 as that paper and BioSyn)."))
    exact_max_names: int = field(default=500_000, metadata=option(  # search "auto": larger indexes search with maxscore
        "--exact-max-names", "tf-idf, --search auto: search larger indexes with maxscore (default 500000)."))
    candidate_df: float = 0.05  # approximate search: n-grams in more names than this share select no candidates
    search: str = field(default="auto", metadata=option(  # one of SEARCHES; the manifest also records what auto chose
        "--search", "tf-idf: auto (default: exact up to --exact-max-names names, maxscore above), exact, maxscore "
                    "(same top-k, stops reading postings early) or approximate."))
    # Search-time levers (eval/bench/bench_link.md compares them; defaults = what the library does):
    shard_names: int = 0  # exact search: names per sparse product (0 = SHARD_NAMES)
    min_score: float = 0.0  # exact search: scores below it are never collected (sparse-dot-topn's threshold)
    concept_search: bool = True  # maxscore: the top-k concepts in one search (False: names, and retrieve widens)

    def __post_init__(self) -> None:
        if self.analyzer not in ANALYZERS:
            raise UnknownNameError("tf-idf analyzer", self.analyzer, ANALYZERS)
        if self.search not in SEARCHES:
            raise UnknownNameError("tf-idf search", self.search, SEARCHES)
        if self.normalization not in MODES:
            raise UnknownNameError("normalisation mode", self.normalization, MODES)
        if not 1 <= self.ngram_min <= self.ngram_max <= 10:
            raise ConfigError(
                f"n-gram range must satisfy 1 <= min <= max <= 10, found {self.ngram_min},{self.ngram_max}"
            )
        if self.query_chunk < 1 or self.threads < 1:
            raise ConfigError(f"query_chunk and threads must be >= 1, found {self.query_chunk}, {self.threads}")
        if self.shard_names < 0 or not 0.0 <= self.min_score < 1.0:
            raise ConfigError(f"shard_names must be >= 0 and min_score in [0, 1), found {self.shard_names}, "
                              f"{self.min_score}")
        if self.exact_max_names < 0 or not 0 < self.candidate_df <= 1:
            raise ConfigError(f"exact_max_names must be >= 0 and candidate_df in (0, 1], found "
                              f"{self.exact_max_names}, {self.candidate_df}")


PRESETS: dict[str, TfidfConfig] = {
    # The Medical Crossing baseline's and BioSyn's sparse encoder: character uni+bigrams; the
    # project's default normalisation (NFKC, lower case), as this library's default was before char_wb 3-3.
    "medical-crossing": TfidfConfig(analyzer="char", ngram_min=1, ngram_max=2, normalization="default",
                                    preset="medical-crossing"),
}
# Parameters of indexes built before these fields existed: what the library did then.
LEGACY_PARAMETERS = {"analyzer": "char", "ngram_min": 1, "ngram_max": 2, "normalization": "default"}


def config_from_manifest(parameters: dict) -> TfidfConfig:
    """The config recorded in an index manifest; fields it lacks take the values of the time before they existed."""
    return TfidfConfig(**{**LEGACY_PARAMETERS, **typed_parameters(TfidfConfig, parameters)})


def get_preset(name: str) -> TfidfConfig:
    """The named parameter set (`PRESETS`); UnknownNameError naming the valid ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownNameError("tf-idf preset", name, PRESETS) from None



def ngram_fields(text: str) -> dict[str, int]:
    """``--ngram MIN,MAX`` -> ngram_min and ngram_max."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"--ngram: expected MIN,MAX such as 1,2, found {text!r}")
    return {"ngram_min": int(parts[0]), "ngram_max": int(parts[1])}
