"""The extractor's training data read from ../shared/data (skipped with a reason when it is absent)."""

from __future__ import annotations

import pytest

from linker.extract.data import AE, DRUG, read_phee, read_tac, tac_split
from linker.models import release_folder

pytestmark = pytest.mark.integration


def test_phee_splits_read_with_effects_and_drugs(shared_data):
    skipped: list[str] = []
    train = read_phee(shared_data / "phee" / "train.zip", skipped)
    assert len(train) == 2898 and not skipped
    labels = {span[2] for doc in train for span in doc.spans}
    assert {AE, DRUG} <= labels
    assert all(doc.text[s:e] for doc in train for s, e, *_ in doc.spans)
    assert sum(len(doc.subject_disorders) for doc in train) == 217  # the pieces of PHEE train's 209 Sub-Disorder spans
    dev_skipped: list[str] = []
    assert len(read_phee(shared_data / "phee" / "dev.zip", dev_skipped)) == 961
    assert len(dev_skipped) == 1 and "dysphagia" in dev_skipped[0]  # a span text with a trailing tab


def test_tac_split_and_discontinuous_mentions(shared_data):
    folder = shared_data / "tac2017" / "train_xml"
    train, dev = tac_split(folder)
    assert (len(train), len(dev)) == (81, 20) and not set(train) & set(dev)
    docs = read_tac(folder / "ADCETRIS.xml")
    pieces = [g for d in docs for g in d.groups if len(g[0]) > 1]
    for doc in docs:
        for group, _, _ in doc.groups:
            assert all(0 <= s < e <= len(doc.text) for s, e in group)
    assert sum(len(g[0]) for d in docs for g in d.groups) == sum(1 for d in docs for _ in d.spans)
    assert isinstance(pieces, list)  # ADCETRIS may have none; the training split has 821


def test_shipped_release_held_out_the_tac_dev_split(shared_data):
    import json

    manifest_path = release_folder("linker-ae") / "manifest.json"
    if not manifest_path.is_file():
        pytest.skip("the linker-ae release is not built")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    _, dev = tac_split(shared_data / "tac2017" / "train_xml")
    training = manifest["training"]
    assert sorted(training["tac_dev_labels"]) == sorted(p.stem for p in dev)
    assert not set(training["tac_train_labels"]) & set(training["tac_dev_labels"])
