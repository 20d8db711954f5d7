"""linker.eval.ade_eval: the ADE Eval scorer on hand-computed cases, its worked example, properties, real labels.

Every expected number below is worked out by hand from the definitions in the module docstring
(the weights of MITRE's reference scorer): pair similarity 1 / 0.2 + 0.8*overlap / 0.8*overlap;
use case 1 P = (m + c/2) / (m + c + s/4), R = (m + c/2) / (m + c + miss); use case 2 per section
then macro-averaged; quality per found code.
"""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linker.errors import ConfigError, InputFormatError, LinkerError, MissingInputError
from linker.eval.ade_eval import (
    EvalMention,
    EvalSection,
    load_label,
    pair_mentions,
    score_folders,
    score_paths,
    score_section,
    score_sections,
    similarity,
    span_overlap,
)

approx = pytest.approx


def m(start: int, length: int, *codes: str, section: str = "S1", mid: str = "", pieces=None) -> EvalMention:
    return EvalMention(section, tuple(pieces) if pieces else ((start, length),), codes or ("A",), mention_id=mid)


def score(gold, sub, section: str = "S1"):
    return score_sections([EvalSection("doc", section, tuple(gold), tuple(sub))])


def uc1(result):
    w = result.mentions.weighted
    return w.precision, w.recall, w.f1


def uc2(result):
    return result.codes.precision, result.codes.recall, result.codes.f1


# ----------------------------------------------------------------------------- hand-computed cases


def test_exact_extent_and_code_is_full_credit():
    r = score([m(0, 10, "A")], [m(0, 10, "A")])
    assert (r.mentions.match, r.mentions.clash, r.mentions.missing, r.mentions.spurious) == (1, 0, 0, 0)
    assert uc1(r) == (1.0, 1.0, 1.0)
    assert uc2(r) == (1.0, 1.0, 1.0)
    assert r.quality == 1.0


def test_partial_overlap_with_the_right_code():
    # overlap 5/10 = 0.5, similarity 0.2 + 0.8*0.5 = 0.6; one clash: m' = c' = 0.5 -> P = R = 0.5/1;
    # the code is found (use case 2 = 1) and its quality is the overlap, 0.5.
    gold, sub = m(0, 10, "A"), m(0, 5, "A")
    assert similarity(gold, sub).similarity == approx(0.6)
    r = score([gold], [sub])
    assert (r.mentions.match, r.mentions.clash) == (0, 1)
    assert uc1(r) == approx((0.5, 0.5, 0.5))
    assert uc2(r) == (1.0, 1.0, 1.0)
    assert r.quality == approx(0.5)
    assert r.sections[0].pairing.pairs[0].kind == "span_clash"


def test_wrong_code_on_the_exact_extent():
    # same offsets, no shared code: similarity 0.8 * 1; a clash (half credit) in use case 1,
    # a missing A and a spurious B in use case 2 (P = R = F = 0), and no found code for quality.
    gold, sub = m(0, 10, "A"), m(0, 10, "B")
    assert similarity(gold, sub).similarity == approx(0.8)
    r = score([gold], [sub])
    assert r.sections[0].pairing.pairs[0].kind == "code_clash"
    assert uc1(r) == approx((0.5, 0.5, 0.5))
    assert r.sections[0].codes_missing == ("A",) and r.sections[0].codes_spurious == ("B",)
    assert uc2(r) == (0.0, 0.0, 0.0)
    assert r.quality is None and r.quality_sections == 0


def test_spurious_mention_costs_a_quarter():
    # m = 1, s = 1: P = 1 / (1 + 0.25) = 0.8, R = 1, F = 1.6/1.8; codes: A found, B spurious -> P = 1/2, R = 1.
    r = score([m(0, 10, "A")], [m(0, 10, "A"), m(20, 5, "B")])
    assert (r.mentions.match, r.mentions.spurious) == (1, 1)
    assert uc1(r) == approx((0.8, 1.0, 16 / 18))
    assert uc2(r) == approx((0.5, 1.0, 2 / 3))
    assert r.quality == 1.0  # B has no pair, so it is no "found code"; A's one mention is exact


def test_missing_mention_is_a_full_error():
    r = score([m(0, 10, "A"), m(20, 5, "B")], [m(0, 10, "A")])
    assert r.mentions.missing == 1
    assert uc1(r) == approx((1.0, 0.5, 2 / 3))
    assert uc2(r) == approx((1.0, 0.5, 2 / 3))


def test_only_submission_or_only_gold():
    only_sub = score([], [m(0, 4, "A")])
    assert uc1(only_sub) == (0.0, 1.0, 0.0)  # P = 0 / 0.25, R = 1 on an empty gold, F = 0
    only_gold = score([m(0, 4, "A")], [])
    assert uc1(only_gold) == (1.0, 0.0, 0.0)
    empty = score([], [])
    assert uc1(empty) == (1.0, 1.0, 1.0) and uc2(empty) == (1.0, 1.0, 1.0)  # the reference scorer's rule
    assert empty.quality is None


def test_touching_mentions_do_not_pair():
    # [0, 5) and [5, 10) share no character: one missing and one spurious, never a clash.
    r = score([m(0, 5, "A")], [m(5, 5, "A")])
    assert (r.mentions.match, r.mentions.clash, r.mentions.missing, r.mentions.spurious) == (0, 0, 1, 1)
    assert uc1(r) == (0.0, 0.0, 0.0)


def test_discontinuous_mentions_compare_as_character_sets():
    gold = m(0, 0, "A", pieces=[(10, 5), (0, 5)])  # offsets 0-4 and 10-14, given out of order
    # the same two pieces in the other order: identical
    assert similarity(gold, m(0, 0, "A", pieces=[(0, 5), (10, 5)])).similarity == 1.0
    # only the first piece: 5 / 10
    assert span_overlap(gold, m(0, 5)) == approx(0.5)
    # [3, 13): shares 3,4,10,11,12 (5 characters) of a union of 10 + 10 - 5 = 15
    sub = m(3, 10, "A")
    assert span_overlap(gold, sub) == approx(1 / 3)
    assert similarity(gold, sub).similarity == approx(0.2 + 0.8 / 3)
    r = score([gold], [sub])
    assert r.quality == approx(1 / 3)
    # overlapping pieces of one mention count their characters once: [0,6) + [4,10) = 10 characters
    assert span_overlap(m(0, 0, pieces=[(0, 6), (4, 6)]), m(0, 10)) == 1.0


def test_kuhn_munkres_finds_the_best_total_not_the_greedy_pairs():
    # G1 [0,10) and G2 [10,20); S1 [5,15) overlaps both by 5/15 (similarity 0.2 + 0.8/3 = 0.467 each),
    # S2 [0,4) overlaps G1 only (4/10 -> 0.52). Pairing S1 with G1 first would strand S2; the
    # optimum is G1-S2 and G2-S1 (0.987 in all), two clashes and nothing missing.
    gold = [m(0, 10, "A"), m(10, 10, "A")]
    sub = [m(5, 10, "A"), m(0, 4, "A")]
    pairing = pair_mentions(gold, sub)
    assert {(p.gold, p.submission) for p in pairing.pairs} == {(0, 1), (1, 0)}
    assert pairing.missing == () and pairing.spurious == ()


def test_gold_with_several_codes_is_found_by_any_and_counts_all():
    # The reference scorer puts every gold PT id of a code-sharing pair into the matched set.
    r = score([m(0, 10, "A", "B")], [m(0, 10, "B")])
    assert r.sections[0].codes_matched == ("A", "B")
    assert uc2(r) == (1.0, 1.0, 1.0) and uc1(r) == (1.0, 1.0, 1.0)


def test_use_case_1_is_micro_and_use_case_2_macro_over_sections():
    # S1: three exact pairs (codes A, B, C); S2: one code clash; S3: empty.
    sections = [
        EvalSection("doc", "S1", (m(0, 3, "A"), m(5, 3, "B"), m(10, 3, "C")),
                    (m(0, 3, "A"), m(5, 3, "B"), m(10, 3, "C"))),
        EvalSection("doc", "S2", (m(0, 3, "A", section="S2"),), (m(0, 3, "B", section="S2"),)),
        EvalSection("doc", "S3", (), ()),
    ]
    r = score_sections(sections)
    # micro: m = 3, c = 1 -> P = R = 3.5 / 4
    assert uc1(r) == approx((0.875, 0.875, 0.875))
    # macro: (1 + 0 + 1) / 3 for P, R and F
    assert uc2(r) == approx((2 / 3, 2 / 3, 2 / 3))
    assert r.codes.sections == 3
    assert r.quality == 1.0 and r.quality_sections == 1  # only S1 has found codes


def test_worked_example_of_the_evaluation_document():
    """2 matching codes, 1 spurious, 1 missing; quality 0.2 and 0.5 (reconstructed, see module docstring).

    Gold: G1 code A on [0, 10), G2 code B on [20, 24), G3 code C on [40, 45).
    Submission: S1 code A on [0, 2) (inside G1), S2 code B on [20, 24) (exact), S3 code B on [60, 64)
    (no gold there), S4 code D on [80, 84) (no gold there).
    Pairs: G1-S1 (span clash, overlap 2/10 = 0.2), G2-S2 (match); G3 missing; S3, S4 spurious.
    Codes: matched {A, B} (2); missing {C} (1); spurious {B, D} minus matched = {D} (1):
        P = R = F = 2/3.
    Quality: A: overlap 0.2 of its one supporting pair / 1 mention = 0.2;
             B: 1 exact pair / (1 exact + 1 spurious B mention) = 0.5;  section quality (0.2 + 0.5)/2.
    Use case 1: m = 1, c = 1, miss = 1, s = 2: P = 1.5 / (2 + 0.5) = 0.6, R = 1.5 / 3 = 0.5,
        F = 2 * 0.6 * 0.5 / 1.1.
    """
    gold = [m(0, 10, "A"), m(20, 4, "B"), m(40, 5, "C")]
    sub = [m(0, 2, "A"), m(20, 4, "B"), m(60, 4, "B"), m(80, 4, "D")]
    r = score(gold, sub)
    section = r.sections[0]
    assert section.codes_matched == ("A", "B")
    assert section.codes_missing == ("C",)
    assert section.codes_spurious == ("D",)
    assert uc2(r) == approx((2 / 3, 2 / 3, 2 / 3))
    assert dict(section.quality_by_code) == approx({"A": 0.2, "B": 0.5})
    assert r.quality == approx(0.35)
    assert (r.mentions.match, r.mentions.clash, r.mentions.missing, r.mentions.spurious) == (1, 1, 1, 2)
    assert uc1(r) == approx((0.6, 0.5, 0.6 / 1.1))


def test_result_is_json_and_markdown_friendly():
    r = score([m(0, 10, "A")], [m(0, 5, "A")])
    d = json.loads(json.dumps(r.to_dict()))
    assert d["use_case_1_mentions_micro_weighted"]["precision"] == 0.5
    assert d["use_case_2_codes_macro_by_section"]["f1"] == 1.0
    assert d["quality"] == {"value": 0.5, "sections": 1}
    assert d["weights"] == {"span": 0.8, "code": 0.2, "clash_credit": 0.5, "spurious_weight": 0.25}
    assert d["per_document"][0]["document"] == "doc"
    text = r.to_markdown()
    assert "| use case 1: mentions, weighted, micro | 50.00 | 50.00 | 50.00 |" in text


@pytest.mark.parametrize("kwargs, expected", [
    ({"pieces": ()}, "pieces"),
    ({"pieces": ((0, 0),)}, "pieces"),
    ({"pieces": ((-1, 3),)}, "pieces"),
    ({"codes": ()}, "MedDRA PT id"),
    ({"codes": ("",)}, "MedDRA PT id"),
])
def test_bad_mentions_raise_one_line_linker_errors(kwargs, expected):
    args = {"section": "S1", "pieces": ((0, 3),), "codes": ("A",), "mention_id": "M7", **kwargs}
    with pytest.raises(InputFormatError) as info:
        EvalMention(**args)
    assert isinstance(info.value, LinkerError)
    message = str(info.value)
    assert "\n" not in message and "M7" in message and expected in message and "found" in message


def test_a_mention_in_the_wrong_section_is_refused():
    with pytest.raises(InputFormatError, match="mentions of section S1"):
        score_section(EvalSection("doc", "S1", (m(0, 3, section="S2"),), ()))


def test_no_sections_is_a_missing_input():
    with pytest.raises(MissingInputError):
        score_sections([])


# ----------------------------------------------------------------------------- properties

mention_st = st.builds(
    lambda pieces, codes: EvalMention("S1", tuple(pieces), tuple(codes)),
    st.lists(st.tuples(st.integers(0, 30), st.integers(1, 8)), min_size=1, max_size=2),
    st.lists(st.sampled_from("ABC"), min_size=1, max_size=2, unique=True),
)


def _best_total(gold, sub) -> float:
    """Brute force: the largest total similarity of any one-to-one partial pairing."""
    sims = [[similarity(g, s).similarity for s in sub] for g in gold]
    best = 0.0
    slots = list(range(len(sub))) + [None] * len(gold)
    for choice in set(itertools.permutations(slots, len(gold))):
        best = max(best, sum(sims[i][j] for i, j in enumerate(choice) if j is not None))
    return best


@settings(max_examples=80, deadline=None)
@given(gold=st.lists(mention_st, max_size=4), sub=st.lists(mention_st, max_size=4))
def test_properties_of_pairing_and_scores(gold, sub):
    r = score(gold, sub)
    pairing = r.sections[0].pairing
    # one-to-one, and every mention is paired, missing or spurious exactly once
    paired_gold = [p.gold for p in pairing.pairs]
    paired_sub = [p.submission for p in pairing.pairs]
    assert len(set(paired_gold)) == len(paired_gold) and len(set(paired_sub)) == len(paired_sub)
    assert sorted(paired_gold + list(pairing.missing)) == list(range(len(gold)))
    assert sorted(paired_sub + list(pairing.spurious)) == list(range(len(sub)))
    assert all(p.similarity > 0 for p in pairing.pairs)
    # Kuhn-Munkres reaches the best total similarity
    total = sum(p.similarity for p in pairing.pairs)
    assert total == approx(_best_total(gold, sub))
    # every score lies in [0, 1]
    values = [*uc1(r), *uc2(r), *([r.quality] if r.quality is not None else [])]
    values += list(r.sections[0].quality_by_code.values())
    assert all(0.0 <= v <= 1.0 for v in values)
    # gold against itself is perfect
    self_score = score(gold, gold)
    assert uc1(self_score) == (1.0, 1.0, 1.0) and uc2(self_score) == (1.0, 1.0, 1.0)
    assert self_score.quality == (1.0 if gold else None)


# ----------------------------------------------------------------------------- XML labels

TEXT = "Adverse reactions: severe skin reaction, nausea and headache. Patients also reported nausea or fatigue."


def at(word: str, nth: int = 0) -> tuple[int, int]:
    start = -1
    for _ in range(nth + 1):
        start = TEXT.index(word, start + 1)
    return start, len(word)


def tac_gold(path: Path, *, ignored: str = "", text: str = TEXT) -> Path:
    """The worked example's gold in TAC 2017 form: codes on the <Reactions> by mention string."""
    mentions = [("M1", at("severe skin reaction")), ("M2", at("nausea")), ("M3", at("headache"))]
    body = "\n".join(f'<Mention id="{i}" section="S1" type="AdverseReaction" start="{s}" len="{n}" />'
                     for i, (s, n) in mentions)
    path.write_text(
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Label drug="example" track="TAC2017_ADR">\n'
        f'<Text><Section id="S1" name="adverse reactions">{text}</Section></Text>\n{ignored}\n'
        f"<Mentions>\n{body}\n"
        '<Mention id="M4" section="S1" type="Severity" start="19" len="6" />\n</Mentions>\n'
        '<Relations />\n<Reactions>\n'
        '<Reaction id="AR1" str="severe skin reaction"><Normalization id="AR1.N1" meddra_pt="Skin reaction" '
        'meddra_pt_id="A" /></Reaction>\n'
        '<Reaction id="AR2" str="nausea"><Normalization id="AR2.N1" meddra_pt="Nausea" meddra_pt_id="B" /></Reaction>\n'
        '<Reaction id="AR3" str="headache"><Normalization id="AR3.N1" meddra_pt="Headache" meddra_pt_id="C" />'
        "</Reaction>\n</Reactions>\n</Label>\n", encoding="utf-8")
    return path


def ade_submission(path: Path, mentions, *, text: str = TEXT) -> Path:
    """An ADE Eval SubmissionLabel: each mention carries its own <Normalization>."""
    body = "\n".join(
        f'<Mention id="M{k}" section="S1" type="OSE_Labeled_AE" start="{s}" len="{n}">'
        + (f'<Normalization meddra_pt="x" meddra_pt_id="{code}" />' if code else '<Normalization flag="unmapped" />')
        + "</Mention>"
        for k, ((s, n), code) in enumerate(mentions, start=1))
    path.write_text(
        f'<?xml version="1.0" encoding="UTF-8"?>\n<SubmissionLabel drug="example">\n'
        f'<Text><Section id="S1" name="adverse reactions">{text}</Section></Text>\n'
        f"<Mentions>\n{body}\n</Mentions>\n</SubmissionLabel>\n", encoding="utf-8")
    return path


WORKED_SUBMISSION = [((at("skin")[0], 4), "A"), (at("nausea"), "B"), (at("nausea", 1), "B"), (at("fatigue"), "D")]


def test_xml_worked_example_reads_tac_gold_and_ade_submission(tmp_path):
    # "skin" is 4 of the 20 characters of "severe skin reaction": overlap 0.2 again.
    (tmp_path / "gold").mkdir()
    (tmp_path / "sub").mkdir()
    tac_gold(tmp_path / "gold" / "EXAMPLE.xml")
    ade_submission(tmp_path / "sub" / "EXAMPLE.xml", WORKED_SUBMISSION)
    r = score_folders(tmp_path / "gold", tmp_path / "sub")
    assert uc2(r) == approx((2 / 3, 2 / 3, 2 / 3))
    assert dict(r.sections[0].quality_by_code) == approx({"A": 0.2, "B": 0.5})
    assert uc1(r) == approx((0.6, 0.5, 0.6 / 1.1))
    assert r.to_dict()["gold_mentions"] == 3  # the Severity mention is not scored


def test_xml_unmapped_and_ignored_mentions_are_left_out(tmp_path):
    region = '<IgnoredRegions><IgnoredRegion name="heading" section="S1" start="0" len="18" /></IgnoredRegions>'
    gold = tac_gold(tmp_path / "LABEL.xml", ignored=region)
    (tmp_path / "sub").mkdir()
    # a submission mention inside the heading, and one without a code: neither is scored
    sub = ade_submission(tmp_path / "sub" / "LABEL.xml", [(at("Adverse"), "Z"), (at("fatigue"), None),
                                              (at("severe skin reaction"), "A"), (at("nausea"), "B"),
                                              (at("headache"), "C")])
    r = score_paths([gold], [sub])
    assert uc1(r) == (1.0, 1.0, 1.0)
    assert (r.unscored_gold, r.unscored_submission) == (0, 2)
    assert load_label(sub, ignored_regions={"S1": [(0, 18)]}).unscored == 2


def test_xml_differing_section_text_names_the_file(tmp_path):
    gold = tac_gold(tmp_path / "gold.xml")
    (tmp_path / "s").mkdir()
    sub = ade_submission(tmp_path / "s" / "gold.xml", [], text=TEXT.replace("fatigue", "fatigux"))
    with pytest.raises(InputFormatError) as info:
        score_paths([gold], [sub])
    message = str(info.value)
    assert str(sub) in message and "section S1" in message and "first difference at offset" in message
    assert "\n" not in message


def test_missing_submission_files(tmp_path):
    gold_dir, sub_dir = tmp_path / "gold", tmp_path / "sub"
    gold_dir.mkdir()
    sub_dir.mkdir()
    tac_gold(gold_dir / "ONE.xml")
    tac_gold(gold_dir / "TWO.xml")
    tac_gold(sub_dir / "ONE.xml")
    tac_gold(sub_dir / "EXTRA.xml")
    with pytest.raises(MissingInputError, match="TWO"):
        score_folders(gold_dir, sub_dir)
    skipped = score_folders(gold_dir, sub_dir, missing="skip")
    assert skipped.skipped_documents == ("TWO",) and uc1(skipped) == (1.0, 1.0, 1.0)
    assert skipped.extra_submissions == ("EXTRA",)
    empty = score_folders(gold_dir, sub_dir, missing="empty")
    assert empty.mentions.missing == 3 and uc1(empty) == approx((1.0, 0.5, 2 / 3))
    with pytest.raises(ConfigError):
        score_folders(gold_dir, sub_dir, missing="maybe")
    with pytest.raises(MissingInputError):
        score_folders(tmp_path / "nowhere", sub_dir)


# ----------------------------------------------------------------------------- real TAC 2017 labels


def _isolated(label) -> list[EvalMention]:
    """Scored mentions whose extent overlaps no other scored mention of their section."""
    out = []
    for a in label.mentions:
        if all(b is a or b.section != a.section or b.extent[1] <= a.extent[0] or a.extent[1] <= b.extent[0]
               for b in label.mentions):
            out.append(a)
    return out


@pytest.mark.integration
def test_real_tac_labels_against_themselves_and_a_perturbed_copy(shared_data, tmp_path):
    folder = shared_data / "tac2017" / "train_xml"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    files = sorted(folder.glob("*.xml"))[:3]
    assert len(files) == 3
    same = score_paths(files, files)
    assert uc1(same) == (1.0, 1.0, 1.0) and uc2(same) == (1.0, 1.0, 1.0) and same.quality == 1.0
    total = same.mentions.match
    assert total > 100 and same.mentions.clash == same.mentions.missing == same.mentions.spurious == 0

    # Perturb the first label: delete 3 isolated mentions (and their relations), shorten 2 by one
    # character, recode 2; every perturbed mention overlaps no other, so the counts are exact.
    label = load_label(files[0])
    isolated = [x for x in _isolated(label) if len(x.pieces) == 1 and x.pieces[0][1] >= 4]
    assert len(isolated) >= 7
    deleted, shortened, recoded = isolated[:3], isolated[3:5], isolated[5:7]
    tree = ET.parse(files[0])
    root = tree.getroot()
    mentions = root.find("Mentions")
    by_id = {e.get("id"): e for e in mentions}
    for x in deleted:
        mentions.remove(by_id[x.mention_id])
    relations = root.find("Relations")
    for relation in list(relations):
        if {relation.get("arg1"), relation.get("arg2")} & {x.mention_id for x in deleted}:
            relations.remove(relation)
    for x in shortened:
        e = by_id[x.mention_id]
        e.set("len", str(x.pieces[0][1] - 1))
        e.attrib.pop("str", None)
        ET.SubElement(e, "Normalization", {"meddra_pt": "kept", "meddra_pt_id": x.codes[0]})
    for x in recoded:
        ET.SubElement(by_id[x.mention_id], "Normalization", {"meddra_pt": "wrong", "meddra_pt_id": "99999999"})
    sub_dir = tmp_path / "sub"
    sub_dir.mkdir()
    tree.write(sub_dir / files[0].name, encoding="UTF-8", xml_declaration=True)
    for f in files[1:]:
        (sub_dir / f.name).symlink_to(f)

    r = score_paths(files, sorted(sub_dir.glob("*.xml")))
    counts = r.mentions
    assert (counts.match, counts.clash, counts.missing, counts.spurious) == (total - 7, 4, 3, 0)
    expected_p = (total - 7 + 2) / (total - 3)
    expected_r = (total - 7 + 2) / total
    assert uc1(r)[:2] == approx((expected_p, expected_r))
    assert r.codes.precision < 1.0 and r.codes.spurious >= 1  # 99999999 is never a gold code
    assert r.quality < 1.0  # the shortened mentions support their codes only in part
    first, *others = r.documents
    assert first.document == files[0].stem and first.mentions.weighted.f1 < 1.0
    assert all(d.mentions.weighted.f1 == 1.0 for d in others)


def test_linker_eval_scores_ade_submissions_from_the_command_line(tmp_path, capsys):
    """`linker eval --dataset ade-xml:GOLD --submission SUB`: the worked example through the CLI, a report beside,
    and one-line refusals (an --index with it, a report inside the gold folder, a file against a folder)."""
    from linker.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        out = capsys.readouterr()
        return code, out.out, out.err

    (tmp_path / "gold").mkdir()
    (tmp_path / "sub").mkdir()
    tac_gold(tmp_path / "gold" / "EXAMPLE.xml")
    ade_submission(tmp_path / "sub" / "EXAMPLE.xml", WORKED_SUBMISSION)
    code, out, _ = run("eval", "--dataset", f"ade-xml:{tmp_path / 'gold'}", "--submission", tmp_path / "sub",
                       "--report", tmp_path / "ade")
    assert code == 0
    assert "| use case 2: MedDRA codes, macro by section | 66.67 | 66.67 | 66.67 |" in out
    assert json.loads((tmp_path / "ade.json").read_text())["gold_mentions"] == 3
    assert (tmp_path / "ade.md").read_text().startswith("# ADE Eval: sub against gold")
    for args, needle in [
        (("--index", tmp_path, "--dataset", f"ade-xml:{tmp_path / 'gold'}", "--submission", tmp_path / "sub"),
         "takes no --index"),
        (("--dataset", f"ade-xml:{tmp_path / 'gold'}", "--submission", tmp_path / "sub",
          "--report", tmp_path / "gold" / "r"), "lies inside the input"),
        (("--dataset", f"ade-xml:{tmp_path / 'gold' / 'EXAMPLE.xml'}", "--submission", tmp_path / "sub"),
         "two files or two folders"),
        (("--dataset", f"brat:{tmp_path}", "--submission", tmp_path / "sub"), "ade-xml:GOLD"),
    ]:
        code, _, err = run("eval", *args)
        assert code == 1 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "gold" / "r.md").exists()
