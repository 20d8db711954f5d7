"""Medical Crossing filters: exact and near (< 0.2, strictly) matches against a reference set."""

from __future__ import annotations

import pytest
from rapidfuzz.distance import Levenshtein

from linker.errors import ConfigError, UnknownNameError
from linker.eval.filters import Normaliser, ReferenceSet, filter_indices, get_filter

REF20 = "abcdefghijklmnopqrst"  # 20 characters
REF21 = "abcdefghijklmnopqrstu"  # 21 characters


def refs(strings, mode="faithful", abbreviations=None):
    return {"train": ReferenceSet(strings, Normaliser(mode, abbreviations)), "dict": None}


def test_boundary_exactly_point_two_is_kept_point_19_dropped():
    at_02 = "WXYZefghijklmnopqrst"  # 4 substitutions in 20 characters: 4/20 = 0.2 -> kept
    at_019 = "WXYZefghijklmnopqrstu"  # 4 in 21: 0.190 -> dropped
    assert Levenshtein.distance(at_02.lower(), REF20) == 4 and Levenshtein.distance(at_019.lower(), REF21) == 4
    texts = [at_02, at_019]
    assert filter_indices(texts, "train0.2", references=refs([REF20, REF21])) == [0]
    assert filter_indices(texts, "train", references=refs([REF20, REF21])) == [0, 1]


def test_length_difference_alone_decides_the_window():
    # "abcd" vs "abcde": lev 1 / 5 = 0.2 -> kept; "abcdefgh" vs "abcdefghi": 1/9 -> dropped.
    texts = ["abcd", "abcdefgh", "zzzz"]
    assert filter_indices(texts, "train0.2", references=refs(["abcde", "abcdefghi"])) == [0, 2]


def test_exact_filter_faithful_lower_strip_only_and_duplicates_kept():
    texts = ["Breast Cancer ", "breast cancer", "breast-cancer", "breast cancer", "ovary"]
    kept = filter_indices(texts, "train", references=refs(["breast cancer"]))
    assert kept == [2, 4]  # punctuation is not removed in faithful mode
    assert filter_indices(texts, "full", references={}) == [0, 1, 2, 3, 4]


def test_biosyn_mode_punctuation_and_abbreviations():
    texts = ["breast-cancer", "BC", "ovary"]
    assert filter_indices(texts, "train", references=refs(["breast cancer"], "biosyn")) == [1, 2]
    assert filter_indices(texts, "train", references=refs(["breast cancer"], "biosyn", {"bc": "breast cancer"})) == [2]
    with pytest.raises(ConfigError, match="--mode biosyn"):
        Normaliser("faithful", {"bc": "breast cancer"})


def test_unknown_filter_and_missing_reference():
    with pytest.raises(UnknownNameError, match=r"unknown filter 'dict0.3'; available: dict, dict0.2, full, train, train0.2"):
        get_filter("dict0.3")
    with pytest.raises(ConfigError, match=r"needs training mentions"):
        filter_indices(["x"], "train", references={"train": None})


def test_reference_set_size_counts_distinct_normalised_strings():
    assert len(ReferenceSet(["A", "a ", "b", ""], Normaliser())) == 2
