"""The README's main job (`make demo`), run end to end as the Makefile spells it: default dictionary -> the default
index (dense linker-en, the re-ranker linker-rerank-en bound) -> its default calibration -> normalise."""

from __future__ import annotations

import json
import shlex

import pytest

from conftest import makefile_demo_commands
from linker.cli.main import main

EXPECTED = {  # adverse-event span -> the concept a drug-safety reader expects
    "ae-01": "HP:0001596",  # hair loss -> Alopecia
    "ae-02": "HP:0002098",  # breathing difficulties -> Respiratory distress
    "ae-03": "HP:0002910",  # liver enzymes increased -> Elevated hepatic transaminase
    "ae-04": "HP:0002018",  # nausea
    "ae-05": "HP:0002315",  # headache
    "ae-06": "HP:0000988",  # rash -> Skin rash
    "ae-07": "HP:0002829",  # arthralgia
    "ae-08": "HP:0002321",  # dizziness -> Vertigo
    "ae-09": "HP:0002013",  # vomiting
    "ae-10": "HP:0012378",  # Fatigue
    "ae-11": "HP:0000989",  # itchy skin -> Pruritus
    # swollen ankles -> Ankle swelling: the tf-idf default before gave Finger swelling (HP:0025131), its trigrams
    # sharing more with "Swollen finger"; linker-en 1 found it, linker-en 2 ranked it second (see KNOWN_MISSES).
    "ae-12": "HP:0001785",
    "ae-13": "M25.562",  # pain in left knee (ICD-10-CM)
    "ae-14": "HP:0000822",  # high blood pressure -> Hypertension
}
# Spans the shipped default index gets wrong, with its answer: each must go to a person (`review` or `no link`),
# never `auto`. None now: linker-en 2 alone put "Increased laxity of ankles" (0.81) just above "Ankle swelling"
# (0.77) for "swollen ankles"; the bound re-ranker, linker-rerank-en (chosen on the lay development slice, not on
# these 14), puts it back on top.
KNOWN_MISSES: dict[str, str] = {}


@pytest.mark.slow
def test_make_demo_commands(demo_root, capsys, monkeypatch):
    """`demo_root` ran the recipes that build the default index; the demo's last one, `normalize`, runs here."""
    pytest.importorskip("sentence_transformers")
    work, _ = demo_root
    monkeypatch.chdir(work)  # the Makefile's relative paths (examples/, indexes/)
    manifest = json.loads((work / "indexes" / "default" / "manifest.json").read_text())
    assert manifest["encoder"]["name"] == "linker-en" and manifest["calibration"]["origin"] == "default"
    assert manifest["reranker"]["name"] == "linker-rerank-en"
    capsys.readouterr()
    assert main(["-q", *shlex.split(makefile_demo_commands()[-1])[1:]]) in (0, None)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {line["id"]: line["candidates"][0]["concept_id"] for line in lines} == {**EXPECTED, **KNOWN_MISSES}
    assert all(line["decision"] != "auto" for line in lines if line["id"] in KNOWN_MISSES)
    assert all(0.0 <= line["candidates"][0]["confidence"] <= 1.0 for line in lines)  # calibrated from the start
