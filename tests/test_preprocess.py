"""Mention rewriting: abbreviations from the document, typo lists, composite splitting."""

from __future__ import annotations

import pytest

from linker.datasets import load_dataset
from linker.errors import InputFormatError
from linker.preprocess import expand_abbreviations, find_abbreviations, fix_typos, read_typos, split_composite


def test_abbreviation_definitions_schwartz_hearst():
    text = ("The major cause is a dysfunctional ATP7B gene, causing Wilson disease (WD). We studied "
            "copper toxicosis (CT) by fluorescence in situ hybridization (FISH) and adenomatous polyposis "
            "coli (APC; a tumour suppressor) in 12 dogs (n = 12, p < 0.05) in 1998 (1998).")
    assert find_abbreviations(text) == {
        "WD": "Wilson disease", "CT": "copper toxicosis", "FISH": "fluorescence in situ hybridization",
        "APC": "adenomatous polyposis coli",
    }


def test_abbreviation_needs_its_letters_in_order_within_the_sentence():
    assert find_abbreviations("Patients were treated (XYZ).") == {}  # no X...Y...Z before it
    assert find_abbreviations("Dystrophy. Muscular weakness (DM).") == {}  # D only in the previous sentence
    assert find_abbreviations("myotonic dystrophy (DM) and later (DM)") == {"DM": "myotonic dystrophy"}  # initials
    assert find_abbreviations("congenital myotonic dystrophy (CDM)") == {"CDM": "congenital myotonic dystrophy"}
    assert find_abbreviations("a rare dystrophy (DM) and later (DM)") == {}  # neither in order nor initials
    assert find_abbreviations("dystrophia myotonica (DM), later (DM)") == {"DM": "dystrophia myotonica"}


def test_expansion_is_by_whole_token_also_around_slashes_and_commas():
    table = {"WD": "Wilson disease", "CT": "copper toxicosis", "DM": "myotonic dystrophy"}
    assert expand_abbreviations("WD", table) == "Wilson disease"
    assert expand_abbreviations("WD/CT", table) == "Wilson disease/copper toxicosis"
    assert expand_abbreviations("DM, congenital", table) == "myotonic dystrophy, congenital"
    assert expand_abbreviations("WDX and CTs", table) == "WDX and CTs"  # not part of a word
    assert expand_abbreviations("wd", table) == "wd"  # short forms are case-sensitive
    assert expand_abbreviations("A", {"A": "B A"}) == "B B B A"  # recursive definitions stop after 3 rounds


def test_typos(tmp_path):
    path = tmp_path / "typos.txt"
    path.write_text("hemmorhage||haemorrhage\nbactermia||bacteremia\n")
    typos = read_typos(path)
    assert fix_typos("Retinal hemmorhage, Bactermia", typos) == "Retinal haemorrhage, bacteremia"
    path.write_text("hemmorhage||haemorrhage\nno separator here\n")
    with pytest.raises(InputFormatError, match=r"typos.txt:2: expected 'typo\|\|correction'"):
        read_typos(path)


@pytest.mark.parametrize(("mention", "parts", "expected"), [
    ("breast and ovarian cancer", 2, ("breast cancer", "ovarian cancer")),
    ("sporadic breast, brain, prostate and kidney cancer", 4,
     ("sporadic breast cancer", "brain cancer", "prostate cancer", "kidney cancer")),
    ("Saethre-Chotzen, Crouzon, and Pfeiffer syndromes", 3,
     ("Saethre-Chotzen syndromes", "Crouzon syndromes", "Pfeiffer syndromes")),
    ("retinal and the pineal tumours", 2, ("retinal tumours", "pineal tumours")),
    ("deficiency of C7 and C9", 2, ("deficiency of C7", "deficiency of C9")),
    ("hereditary breast/ovarian cancer", 2, ("hereditary breast cancer", "hereditary ovarian cancer")),
    ("hypotonia hyperreflexia", 2, ("hypotonia", "hyperreflexia")),
    ("colorectal adenomas and carcinoma", 2, None),  # no pattern gives two texts: left whole
    ("breast and ovarian cancer", 3, None),  # a split must give exactly one text per concept
    ("breast cancer", 1, None),
])
def test_split_composite(mention, parts, expected):
    assert split_composite(mention, parts) == expected


def _pubtator(tmp_path, title: str, abstract: str, annotations: list[tuple[str, str]]):
    lines = [f"100|t|{title}", f"100|a|{abstract}"]
    text = f"{title} {abstract}"
    for mention, ids in annotations:
        start = text.index(mention)
        lines.append(f"100\t{start}\t{start + len(mention)}\t{mention}\tDisease\t{ids}")
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n\n")
    return path


def test_pubtator_options_rewrite_mentions(tmp_path):
    path = _pubtator(tmp_path, "Hereditary breast/ovarian cancer and Wilson disease (WD).",
                     "WD-like hemmorhage; ACTH deficiency and WD, were seen.",
                     [("breast/ovarian cancer", "D001943|D010051"), ("WD", "D006527"),
                      ("hemmorhage", "D006470"), ("ACTH deficiency", "OMIM:201400|C535668")])
    (tmp_path / "typos.txt").write_text("hemmorhage||haemorrhage\n")
    plain = load_dataset(f"pubtator:{path}")
    assert [m.text for m in plain] == ["breast/ovarian cancer", "WD", "hemmorhage", "ACTH deficiency"]
    assert all(m.parts_text == () for m in plain)
    assert plain[3].gold == (("OMIM:201400",), ("C535668",))  # as written: two parts

    abbrev = load_dataset(f"pubtator:{path}#abbrev")
    assert abbrev[1].text == "Wilson disease" and abbrev[1].queries == ("Wilson disease",)

    split = load_dataset(f"pubtator:{path}#split&typos={tmp_path / 'typos.txt'}")
    assert split[0].queries == ("breast cancer", "ovarian cancer")
    assert split[0].text == "breast/ovarian cancer" and split[2].text == "haemorrhage"

    biosyn = load_dataset(f"pubtator:{path}#biosyn")
    assert [m.queries for m in biosyn] == [("breast cancer", "ovarian cancer"), ("wilson disease",),
                                            ("hemmorhage",), ("acth deficiency",)]
    assert biosyn[3].gold == (("OMIM:201400", "C535668"),)  # one disease with two ids: alternatives


def test_pubtator_missing_typo_list_is_named(tmp_path):
    path = _pubtator(tmp_path, "Wilson disease.", "Rare.", [("Wilson disease", "D006527")])
    with pytest.raises(Exception, match="absent.txt: no such typo list"):
        load_dataset(f"pubtator:{path}#typos={tmp_path / 'absent.txt'}")
