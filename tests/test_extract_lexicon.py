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
