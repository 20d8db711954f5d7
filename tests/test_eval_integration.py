"""The real corpora: mention counts and the Medical Crossing subset sizes, reproduced exactly."""

from __future__ import annotations

import pytest

from linker.datasets import load_dataset
from linker.eval.filters import Normaliser, ReferenceSet, filter_indices

pytestmark = pytest.mark.integration


def subset_sizes(test_spec: str, train_specs: list[str]) -> tuple[int, int, int]:
    texts = [m.text for m in load_dataset(test_spec)]
    refs = {"train": ReferenceSet([m.text for s in train_specs for m in load_dataset(s)], Normaliser("faithful"))}
    return len(texts), len(filter_indices(texts, "train", references=refs)), len(filter_indices(texts, "train0.2", references=refs))


def test_ncbi_disease_counts(shared_data):
    folder = shared_data / "ncbi_disease"
    test = load_dataset(f"pubtator:{folder / 'NCBItestset_corpus.txt'}")
    assert len(test) == 960
    assert sum(m.composite for m in test) == 15
    assert len(load_dataset(f"pubtator:{folder / 'NCBItrainset_corpus.txt'}")) == 5145
    assert len(load_dataset(f"pubtator:{folder / 'NCBIdevelopset_corpus.txt'}")) == 787


def test_cantemist_published_subsets_with_train_only(shared_data):
    folder = shared_data / "cantemist"
    test = f"brat:{folder / 'test.zip'}#lang=es"
    assert subset_sizes(test, [f"brat:{folder / 'train.zip'}"]) == (3635, 998, 711)
    # train + dev1 + dev2 as references would give other sizes: the paper used train only.
    assert subset_sizes(test, [f"brat:{folder / n}" for n in ("train.zip", "dev1.zip", "dev2.zip")]) == (3635, 824, 555)


def test_codiesp_d_published_subsets_with_train_only(shared_data):
    folder = shared_data / "codiesp"
    test = f"codiesp:{folder / 'testX.tsv'}#D"
    assert subset_sizes(test, [f"codiesp:{folder / 'trainX.tsv'}#D"]) == (3665, 1386, 1167)
    assert subset_sizes(test, [f"codiesp:{folder / 'trainX.tsv'}", f"codiesp:{folder / 'devX.tsv'}"]) == (3665, 1266, 1037)


def test_mantra_languages(shared_data):
    mentions = load_dataset(f"brat:{shared_data / 'mantra_gsc/Mantra-GSC-brat.zip'}")
    assert len(mentions) == 5530
    counts = {lang: sum(m.lang == lang for m in mentions) for lang in ("en", "es", "fr", "de", "nl")}
    assert counts == {"en": 1963, "es": 756, "fr": 1052, "de": 1082, "nl": 677}
    assert len(load_dataset(f"brat:{shared_data / 'mantra_gsc/Mantra-GSC-brat.zip'}#lang=fr")) == 1052
