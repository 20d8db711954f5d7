"""Acc@k: alternatives, composites (all vs any), code_key, xref expansion, bootstrap intervals."""

from __future__ import annotations

import numpy as np
import pytest

from linker.errors import UnknownNameError
from linker.eval.metrics import accuracy, bootstrap_interval, mention_hits

GOLD = [
    (("D001943",),),  # plain
    (("D001943", "C535668"),),  # alternatives: either counts
    (("D001943",), ("D010051",)),  # composite: both needed under "all"
    (("s22.49xa",),),  # ICD-10 code, compared through code_key
]
PRED = [  # one ranking per mention (a mention linked whole)
    [["D010051", "D001943"]],
    [["C535668"]],
    [["D001943", "D009369", "D010051"]],
    [["S2249XA"]],
]


def test_hits_at_1_and_5_composite_all():
    assert mention_hits(GOLD, PRED, 1).tolist() == [False, True, False, True]
    assert mention_hits(GOLD, PRED, 2).tolist() == [True, True, False, True]
    assert mention_hits(GOLD, PRED, 5).tolist() == [True, True, True, True]


def test_composite_any_counts_one_part():
    assert mention_hits(GOLD, PRED, 1, composite="any").tolist() == [False, True, True, True]
    with pytest.raises(UnknownNameError, match="composite rule"):
        mention_hits(GOLD, PRED, 1, composite="most")


def test_expand_maps_predictions_to_gold_id_space():
    gold = [(("C0022661",),), (("C0030705",),)]
    pred = [[["HP:0000083"]], [["HP:0000001"]]]
    xrefs = {"HP:0000083": ("C0022661", "C0035078")}
    assert mention_hits(gold, pred, 1).tolist() == [False, False]
    assert mention_hits(gold, pred, 1, expand=lambda c: xrefs.get(c, ())).tolist() == [True, False]


def test_empty_prediction_is_a_miss():
    assert mention_hits([(("D1",),)], [[[]]], 5).tolist() == [False]
    assert mention_hits([(("D1",),)], [[]], 5).tolist() == [False]


def test_split_composite_parts_are_matched_in_any_order():
    # "pineal and retinal tumours" split into two texts; gold lists retinal (D019572) first.
    gold = [(("D019572",), ("D010871",))]
    both = [[["D010871", "D009369"], ["D019572"]]]
    one_part_wrong = [[["D010871"], ["D009369", "D019572"]]]
    assert mention_hits(gold, both, 1).tolist() == [True]
    assert mention_hits(gold, one_part_wrong, 1).tolist() == [False]
    assert mention_hits(gold, one_part_wrong, 2).tolist() == [True]
    # BioSyn's rule: every part's top-k holds some gold id, whichever.
    same_twice = [[["D010871"], ["D010871"]]]
    assert mention_hits(gold, same_twice, 1, composite="any").tolist() == [True]
    assert mention_hits(gold, same_twice, 1, composite="all").tolist() == [False]
    assert mention_hits(gold, one_part_wrong, 1, composite="any").tolist() == [False]


def test_bootstrap_is_deterministic_and_brackets_the_mean():
    hits = np.array([True] * 30 + [False] * 70)
    first, second = bootstrap_interval(hits), bootstrap_interval(hits)
    assert first == second
    assert first[0] < 0.30 < first[1] and 0.19 < first[0] and first[1] < 0.41
    assert bootstrap_interval(hits, seed=1) != first
    assert bootstrap_interval(np.ones(10, dtype=bool)) == (1.0, 1.0)
    a = accuracy(hits, 5)
    assert (a.k, a.n, a.correct, a.value) == (5, 100, 30, 0.3) and (a.low, a.high) == first


def test_empty_subset_is_nan():
    a = accuracy(np.zeros(0, dtype=bool), 1)
    assert a.n == 0 and np.isnan(a.value) and np.isnan(a.low)
