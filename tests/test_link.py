"""Linker: distinct concepts, ties, language restriction, preferred names, MedDRA paths, batches, CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from index_tables import write_concepts
from linker.cli.main import main
from linker.errors import ConfigError, InputFormatError, UnknownNameError
from linker.index import NameIndexBase, build_index
from linker.link import CANDIDATE_TYPE, Candidate, Linker, MeddraPath
from linker.retrieve import ConceptIndex, collapse, top_concepts

CHEST_PRIMARY = MeddraPath("10033372", "Pain and discomfort NEC", "10018073", "General system disorders NEC",
                           "10018065", "General disorders and administration site conditions", True)
CHEST_SECONDARY = MeddraPath("10008481", "Chest and lower respiratory tract pain", "10038716",
                             "Respiratory disorders NEC", "10038738",
                             "Respiratory, thoracic and mediastinal disorders", False)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("link")
    build_index(write_concepts(folder / "concepts.parquet"), kind="tfidf", out=folder / "idx")
    return folder / "idx"


@pytest.fixture(scope="module")
def linker(index_dir):
    return Linker.load(index_dir)


def ids(result):
    return [c.concept_id for c in result.candidates]


def test_exact_name_links_with_matched_name_and_hierarchy(linker):
    [result] = linker.link(["chest pain"], k=1)
    assert result.mention == "chest pain"
    assert result.candidates == (
        Candidate("10008479", "Chest pain", "Chest pain", result.candidates[0].score, "en", "meddra",
                  "10008479", "PT", (CHEST_PRIMARY, CHEST_SECONDARY), retriever_score=result.candidates[0].score),
    )
    assert result.candidates[0].score == pytest.approx(1.0, abs=1e-6)
    assert result.candidates[0].confidence is None  # the index has no calibration


def test_synonym_match_reports_llt_and_preferred_name(linker):
    [result] = linker.link(["thoracic pains"], k=1)
    best = result.candidates[0]
    assert (best.concept_id, best.matched_name, best.term_id, best.term_type, best.preferred_name) == (
        "10008479", "Thoracic pain", "10043542", "LLT", "Chest pain")


def test_names_collapse_into_distinct_concepts(linker):
    # "Headache" and "Head ache" are two names of one concept: it appears once, with its best name.
    [result] = linker.link(["headache"], k=10)
    assert ids(result).count("10019211") == 1
    assert result.candidates[0].matched_name == "Headache"
    assert len(result.candidates) == len(set(ids(result))) <= 7  # the table has 7 concepts


def test_ties_are_sorted_by_concept_id(linker):
    [result] = linker.link(["Fever"], k=3)
    assert ids(result) == ["10037660", "X1", "X2"]
    assert len({c.score for c in result.candidates}) == 1
    assert [c.preferred_name for c in result.candidates] == ["Pyrexia", "Fever", "Fever"]


def test_tie_at_the_cut_is_resolved_by_concept_id(linker):
    # k=2 cuts inside a three-way tie: the two smallest concept ids win, whatever the name order.
    [result] = linker.link(["fever"], k=2)
    assert ids(result) == ["10037660", "X1"]


def test_a_prior_breaks_ties_and_nothing_else(tmp_path, linker):
    # "Fever" names three concepts; training data that chose X2 twice and X1 once puts them first, in that order.
    labelled = tmp_path / "train.tsv"
    labelled.write_text("X2\tfever\nX2\tpyrexia\nX1\tfever\n10008479\tchest pain\n")
    out = tmp_path / "prior"
    manifest = build_index(write_concepts(tmp_path / "c.parquet"), kind="tfidf", out=out,
                           prior=[f"tsv:{labelled}"])
    assert manifest["prior"] == {"file": "concept_prior.json", "specs": [f"tsv:{labelled}"], "mentions": 4,
                                 "concepts": 3, "names": 3, "name_rows": 3, "gold_ids_not_in_dictionary": 0}
    assert "concept_prior.json" in manifest["files"]
    with_prior = Linker.load(out)
    [fever] = with_prior.link(["Fever"], k=3)
    assert ids(fever) == ["X2", "X1", "10037660"] and len({c.score for c in fever.candidates}) == 1
    assert with_prior.link(["fever"], k=1)[0].candidates[0].concept_id == "X2"  # also at a cut inside the tie
    for text in ("headache", "thoracic pains", "vomit", "chest pain"):  # no tie: the same answer as without
        assert with_prior.link([text], k=5) == linker.link([text], k=5)


def test_evaluation_ties_follow_the_linker(tmp_path):
    # calibrate's and eval's own re-ordering (retriever order, mixes) must break ties as the Linker did
    labelled = tmp_path / "train.tsv"
    labelled.write_text("X2\tfever\n")
    out = tmp_path / "prior"
    build_index(write_concepts(tmp_path / "c.parquet"), kind="tfidf", out=out, prior=[f"tsv:{labelled}"])
    from linker.eval.report import evaluate

    test = tmp_path / "test.tsv"
    test.write_text("X2\tfever\n")
    report = evaluate(out, f"tsv:{test}", ks=(1,))
    assert report.rows[0].acc(1).value == 1.0
    from linker.eval.calibrate import mix
    from linker.eval.report import _ranked

    prior_linker = Linker.load(out)
    [fever] = prior_linker.link(["fever"], k=3)
    ranked = _ranked(fever, prior_linker.tie_rank)
    assert ranked.retriever_ids == ranked.ids == ("X2", "10037660", "X1")  # the retriever's order: its ties too
    assert mix(ranked, 1.0).ids == ranked.ids  # equal scores stay in the Linker's tie order
    build_index(tmp_path / "c.parquet", kind="tfidf", out=tmp_path / "plain")
    assert evaluate(tmp_path / "plain", f"tsv:{test}", ks=(1,)).rows[0].acc(1).value == 0.0  # 10037660 wins the tie


def test_the_prior_for_the_matched_name_comes_before_the_overall_one(tmp_path):
    # X2 and X1 are the more annotated concepts, but annotators chose 10037660 for "fever": it comes first for
    # "fever" and its variants, then the overall order
    labelled = tmp_path / "train.tsv"
    labelled.write_text("X2\tpyrexia\nX2\tpyrexia\nX2\tpyrexia\nX1\thot\nX1\thot\n10037660\tFever.\n")
    out = tmp_path / "prior"
    build_index(write_concepts(tmp_path / "c.parquet"), kind="tfidf", out=out, prior=[f"tsv:{labelled}"])
    names = json.loads((out / "concept_prior.json").read_text())["names"]
    assert names == {"fever": {"10037660": 1}, "hot": {"X1": 2}, "pyrexia": {"X2": 3}}
    with_prior = Linker.load(out)
    [fever] = with_prior.link(["Fever"], k=3)
    assert ids(fever) == ["10037660", "X2", "X1"] and len({c.score for c in fever.candidates}) == 1
    # retrieval orders ties by the overall prior (X2, X1, 10037660): a cut inside the tie widens until the tie is
    # whole, so 10037660 still comes first
    assert [ids(r) for r in with_prior.link(["fever", "FEVER"], k=1)] == [["10037660"], ["10037660"]]
    assert ids(with_prior.link(["fever"], k=2)[0]) == ["10037660", "X2"]
    from linker.eval.calibrate import mix
    from linker.eval.report import _ranked, evaluate

    ranked = _ranked(fever, with_prior.tie_rank)
    assert ranked.retriever_ids == ranked.ids == ("10037660", "X2", "X1") and mix(ranked, 1.0).ids == ranked.ids
    test = tmp_path / "test.tsv"
    test.write_text("10037660\tfever\n")
    assert evaluate(out, f"tsv:{test}", ks=(1,)).rows[0].acc(1).value == 1.0


def test_the_name_rows_are_counted_at_build_time_and_indexes_without_them_still_tie_alike(tmp_path):
    # the build stores, per name row, how often its concept was chosen for its text; an index written before that
    # (no "name_rows") gets the same counts at load, so both link alike
    labelled = tmp_path / "train.tsv"
    # "hot" names no row, and Pyrexia is a name of 10037660, not of X2: neither counts for a row
    labelled.write_text("X2\tfever\nX2\tFEVER!\nX2\tpyrexia\nX1\thot\n10037660\tPyrexia.\n")
    out = tmp_path / "prior"
    build_index(write_concepts(tmp_path / "c.parquet"), kind="tfidf", out=out, prior=[f"tsv:{labelled}"])
    data = json.loads((out / "concept_prior.json").read_text())
    names = pq.read_table(out / "concepts.parquet").to_pydict()
    stored = {(names["name"][r], names["concept_id"][r]): c
              for r, c in zip(data["name_rows"]["row"], data["name_rows"]["count"])}
    assert stored == {("Fever", "X2"): 2, ("Pyrexia", "10037660"): 1}
    built = Linker.load(out)
    from linker.index.manifest import write_manifest

    del data["name_rows"]
    (out / "concept_prior.json").write_text(json.dumps(data))
    write_manifest(out, {k: v for k, v in json.loads((out / "manifest.json").read_text()).items() if k != "files"})
    older = Linker.load(out)
    assert np.array_equal(older._name_prior, built._name_prior) and built._name_prior.sum() == 3
    for text in ("fever", "pyrexia", "hot", "headache"):
        assert older.link([text], k=3) == built.link([text], k=3)


def test_a_prior_from_another_terminology_is_refused(tmp_path):
    labelled = tmp_path / "train.tsv"
    labelled.write_text("D0001\tfever\n")
    with pytest.raises(InputFormatError, match="none with a gold id among its 7 concepts"):
        build_index(write_concepts(tmp_path / "c.parquet"), kind="tfidf", out=tmp_path / "i",
                    prior=[f"tsv:{labelled}"])
    assert not (tmp_path / "i").exists()


def test_results_are_sorted_and_stable(linker):
    first = linker.link(["pain", "vomit", "nausea"], k=5)
    assert first == linker.link(["pain", "vomit", "nausea"], k=5)
    for result in first:
        keys = [(-c.score, c.concept_id) for c in result.candidates]
        assert keys == sorted(keys)


def test_unknown_ngrams_give_no_candidates(linker):
    [result] = linker.link(["ЖЖЖ"], k=5)
    assert result.candidates == ()


def test_lang_restricts_to_names_of_that_language(linker):
    [es] = linker.link(["fever"], k=3, lang="es")
    assert all(c.lang == "es" for c in es.candidates)
    [result] = linker.link(["dolor toracico"], k=1, lang="es")
    best = result.candidates[0]
    assert (best.concept_id, best.matched_name, best.preferred_name) == ("10008479", "Dolor torácico", "Dolor torácico")
    # the hierarchy has English rows only: those are shown for a Spanish mention
    assert best.hierarchy == (CHEST_PRIMARY, CHEST_SECONDARY)
    [en] = linker.link(["cefalea"], k=7, lang="en")
    assert all(c.lang == "en" for c in en.candidates)


def test_preferred_name_follows_the_mention_language(linker):
    [result] = linker.link(["Náuseas"], k=1, lang="es")
    assert result.candidates[0].preferred_name == "Náuseas"
    [result] = linker.link(["Náuseas"], k=1)
    assert result.candidates[0].preferred_name == "Nausea"  # no language given: English


def test_unknown_language_lists_the_index_languages(linker):
    with pytest.raises(UnknownNameError, match="language in this index 'fr'; available: en, es"):
        linker.link(["fièvre"], lang="fr")


def test_langs_link_each_mention_in_its_own_language_and_a_missing_one_in_all(linker, caplog):
    """`langs`: the one place mentions are grouped by language; the one fallback rule (`usable_langs`): a language
    the index lacks is linked against every name, with one warning, where `lang=` refuses it."""
    mentions = ["cefalea", "vomiting", "fièvre", "Náuseas"]
    with caplog.at_level("WARNING", logger="linker.link"):
        results = linker.link(mentions, k=2, langs=["es", "en", "fr", None])
    assert "index has no names in fr" in caplog.text
    expected = [linker.link([m], k=2, lang=lang)[0] for m, lang in zip(mentions, ["es", "en", None, None])]
    assert [ids(r) for r in results] == [ids(e) for e in expected]
    assert [r.mention for r in results] == mentions
    assert linker.usable_langs(["es", "fr", None]) == ["es", None, None]
    with pytest.raises(ConfigError, match="one language \\(or None\\) per mention, 2, found 1"):
        linker.link(["nausea", "fever"], langs=["en"])
    with pytest.raises(ConfigError, match="not both"):
        linker.link(["nausea"], lang="en", langs=["en"])
    with pytest.raises(InputFormatError, match=r"mentions\[1\]"):
        linker.link(["nausea", " "], langs=["en", "es"])


@pytest.mark.parametrize("mentions", [["nausea", ""], ["nausea", "   "]])
def test_empty_mention_is_an_error_naming_its_position(linker, mentions):
    with pytest.raises(InputFormatError, match=r"mentions\[1\]: expected a non-empty mention text"):
        linker.link(mentions)


def test_bad_k_and_bare_string(linker):
    with pytest.raises(ConfigError, match="k must be >= 1"):
        linker.link(["nausea"], k=0)
    with pytest.raises(InputFormatError, match="wrap it in a list"):
        linker.link("nausea")


def test_no_mentions_gives_no_results(linker):
    assert linker.link([]) == []


def test_more_duplicates_than_overfetch_still_give_k_concepts(tmp_path):
    # 100 copies of one name of concept A outrank B's and C's names: a fixed over-fetch of k*8
    # names would see only A; widening finds k distinct concepts.
    rows = [{"concept_id": "A", "name": "renal failure", "lang": "en"} for _ in range(100)]
    rows += [{"concept_id": "B", "name": "renal failures acute", "lang": "en"},
             {"concept_id": "C", "name": "renal insufficiency", "lang": "en"}]
    build_index(write_concepts(tmp_path / "c.parquet", rows=rows), kind="tfidf", out=tmp_path / "idx")
    [result] = Linker.load(tmp_path / "idx").link(["renal failure"], k=3)
    assert ids(result) == ["A", "B", "C"]
    [result] = Linker.load(tmp_path / "idx").link(["renal failure"], k=5)
    assert ids(result) == ["A", "B", "C"]  # only three concepts exist: fewer than k


def test_tie_beyond_the_first_fetch_is_resolved_by_concept_id(tmp_path):
    # 40 concepts share one name; the smallest ids come last in the table, beyond the first fetch
    # of 32 names, so only widening on a tie at the cut can return them.
    rows = [{"concept_id": f"C{i:02d}", "name": "pyrexia", "lang": "en"} for i in range(39, -1, -1)]
    build_index(write_concepts(tmp_path / "c.parquet", rows=rows), kind="tfidf", out=tmp_path / "idx")
    [result] = Linker.load(tmp_path / "idx").link(["pyrexia"], k=2)
    assert ids(result) == ["C00", "C01"]


class TiedIndex(NameIndexBase):
    """All names score 1.0 and come back in table order: the worst case for a cut inside a tie."""

    kind = "fake"
    size = 40

    def search(self, queries, k):
        k = min(k, self.size)
        return np.ones((len(queries), k), dtype=np.float32), np.tile(np.arange(k), (len(queries), 1))


def test_top_concepts_widens_on_a_tie_at_the_cut():
    concept_ids = pa.array([f"C{i:02d}" for i in range(39, -1, -1)])  # smallest ids in the last rows
    [hits] = top_concepts(TiedIndex(), ConceptIndex(concept_ids), ["q"], 2)
    assert [f"C{i:02d}" for i in (0, 1)] == [ConceptIndex(concept_ids).ids[c] for c in hits.concepts]
    assert hits.rows.tolist() == [39, 38]


def test_widening_searches_in_groups_within_the_score_budget(monkeypatch):
    import linker.retrieve as retrieve

    calls = []

    class Recording(TiedIndex):
        def search(self, queries, k):
            calls.append((len(queries), k))
            return super().search(queries, k)

    monkeypatch.setattr(retrieve, "SCORE_BUDGET", 100)
    concept_ids = pa.array([f"C{i:02d}" for i in range(39, -1, -1)])
    hits = top_concepts(Recording(), ConceptIndex(concept_ids), ["a", "b", "c", "d"], 2)
    assert calls == [(3, 32), (1, 32), (2, 40), (2, 40)]  # 100 // 32 = 3 queries, then 100 // 40 = 2
    assert all(h.rows.tolist() == [39, 38] for h in hits)


def test_widening_encodes_the_queries_of_an_encoding_index_once():
    calls = []

    class Encoding(TiedIndex):  # like a dense index: queries -> vectors, then search by vector
        def search(self, queries, k):
            raise AssertionError("an encoding index is searched by vector")

        def encode_queries(self, queries):
            calls.append(("encode", len(queries)))
            return np.arange(len(queries), dtype=np.float32)[:, None]

        def search_vectors(self, vectors, k):
            calls.append(("search", vectors[:, 0].tolist(), k))
            return super().search(list(vectors), k)

    concept_ids = pa.array([f"C{i:02d}" for i in range(39, -1, -1)])
    hits = top_concepts(Encoding(), ConceptIndex(concept_ids), ["a", "b"], 2)
    # one encoder pass; the widening round (a tie at the cut) searches with the same rows' vectors
    assert calls == [("encode", 2), ("search", [0.0, 1.0], 32), ("search", [0.0, 1.0], 40)]
    assert all(h.rows.tolist() == [39, 38] for h in hits)


def test_collapse_keeps_best_name_per_concept():
    codes = np.array([0, 0, 1, 2])
    hits = collapse(np.array([0.5, 0.9, 0.9, 0.1], dtype=np.float32), np.array([0, 1, 2, -1]), codes, None)
    assert hits.concepts.tolist() == [0, 1] and hits.rows.tolist() == [1, 2]


def test_version_and_manifest(linker, index_dir):
    assert linker.version.startswith("idx:tfidf:")
    assert linker.version.endswith(linker.manifest["concepts"]["sha256"][:12])
    assert linker.concepts.table.num_rows == 15
    assert linker.languages == ["en", "es"]


def test_repeated_mentions_are_linked_once_with_the_same_result(linker):
    mentions = ["nausea", "chest pain", "nausea", "vomiting", "nausea", "chest pain"]
    before = dict(linker.stats)
    results = linker.link(mentions, k=3)
    assert (linker.stats["texts"] - before["texts"], linker.stats["distinct_texts"] - before["distinct_texts"]) == (6, 3)
    assert [r.mention for r in results] == mentions
    for mention, result in zip(mentions, results):
        assert result == linker.link([mention], k=3)[0]  # as if linked alone


def test_candidate_to_dict_equals_asdict_with_the_optional_fields_dropped(linker):
    from dataclasses import asdict

    [result] = linker.link(["chest pain"], k=1)
    best = result.candidates[0]
    expected = asdict(best)
    expected["score"] = round(best.score, 6)
    expected["retriever_score"] = round(best.retriever_score, 6)
    del expected["confidence"]
    assert best.to_dict() == expected and best.as_record() == asdict(best)
    assert list(best.to_dict()) == list(expected)  # the JSON keeps its field order


def test_link_batch_is_link_per_row(linker):
    batch = pa.RecordBatch.from_pydict({"id": ["a", "b", "c"], "text": ["nausea", "cefalea", "vomiting"],
                                        "lang": [None, "es", "en"]})
    out = linker.link_batch(batch, k=2)
    assert out.schema.names == ["id", "text", "lang", "candidates", "decision"]
    assert out.column("decision").null_count == 3  # no calibration, no decision (tests/test_confidence.py has one)
    assert out.schema.field("candidates").type == pa.list_(CANDIDATE_TYPE)
    rows = out.to_pylist()
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    assert rows[1]["candidates"][0]["concept_id"] == "10019211"
    assert rows[1]["candidates"][0]["lang"] == "es"
    assert rows[1]["candidates"][0]["hierarchy"][0]["soc_code"] == "10029205"
    [expected] = linker.link(["vomiting"], k=2, lang="en")
    assert [c["concept_id"] for c in rows[2]["candidates"]] == ids(expected)


def test_link_batch_refuses_empty_text(linker):
    batch = pa.RecordBatch.from_pydict({"text": ["nausea", None]})
    with pytest.raises(InputFormatError, match="record batch row 1"):
        linker.link_batch(batch)


# ---- CLI -------------------------------------------------------------------------------------


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
        raise SystemExit(0)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_cli_index_build_and_info(tmp_path, capsys):
    table = write_concepts(tmp_path / "c.parquet")
    code, out, err = run(["index", "build", "--dict", str(table), "--kind", "tfidf", "--out", str(tmp_path / "i"),
                          "--ngram", "1,3", "--analyzer", "char_wb"], capsys)
    assert code == 0, err
    assert "tfidf index of 15 names of 7 concepts" in out
    code, out, err = run(["index", "info", str(tmp_path / "i"), "--json"], capsys)
    assert code == 0 and json.loads(out)["parameters"]["ngram_max"] == 3
    code, out, err = run(["index", "info", str(tmp_path / "i")], capsys)
    assert code == 0 and "verified" in out
    labelled = tmp_path / "train.tsv"
    labelled.write_text("X2\tfever\n")
    code, out, err = run(["index", "build", "--dict", str(table), "--out", str(tmp_path / "p"), "--prior",
                          f"tsv:{labelled}"], capsys)
    assert code == 0 and ("tie prior: 1 concepts, 1 mention texts counted in 1 labelled mentions (0 gold ids not "
                          "in the dictionary)") in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["index", "build", "--dict", "{t}", "--kind", "bm25", "--out", "{d}/x"], "unknown index kind 'bm25'; available: dense, hybrid, tfidf"),
        (["index", "build", "--dict", "{t}", "--out", "{d}/x", "--ngram", "2"], "--ngram: expected MIN,MAX"),
        (["index", "build", "--dict", "{d}/absent.parquet", "--out", "{d}/x"], "absent.parquet: no such concept table"),
        (["link", "--index", "{d}/absent", "nausea"], "absent: no such index folder"),
        (["link", "--index", "{i}", " "], "mentions[0]: expected a non-empty mention text"),
        (["link", "--index", "{i}"], "expected mention texts or --input FILE.jsonl"),
        (["index", "build", "--dict", "{t}", "--out", "{d}/x", "--preset", "paper"], "unknown tf-idf preset 'paper'"),
        (["index", "build", "--dict", "{t}", "--out", "{d}/x", "--preset", "medical-crossing", "--ngram", "2,3"],
         "--preset medical-crossing sets the analyzer, n-gram range and normalisation; found also --ngram"),
        (["link", "--index", "{i}", "--explain", "--input", "{d}/m.jsonl"], "expected --explain with mention texts"),
        (["index", "build", "--dict", "{t}", "--out", "{d}/x", "--search", "fast"], "unknown tf-idf search 'fast'"),
    ],
)
def test_cli_errors_are_one_line_and_exit_1(tmp_path, index_dir, capsys, argv, message):
    table = index_dir / "concepts.parquet"
    argv = [a.format(t=table, d=tmp_path, i=index_dir) for a in argv]
    code, _out, err = run(argv, capsys)
    assert code == 1
    assert err.startswith("error: ") and message in err
    assert err.count("\n") == 1


def test_cli_search_is_recorded(tmp_path, capsys):
    table = write_concepts(tmp_path / "c.parquet")
    code, _out, err = run(["index", "build", "--dict", str(table), "--out", str(tmp_path / "i"),
                           "--search", "maxscore"], capsys)
    assert code == 0, err
    code, out, err = run(["index", "info", str(tmp_path / "i"), "--json"], capsys)
    manifest = json.loads(out)
    assert manifest["parameters"]["search"] == "maxscore" and manifest["search"] == "maxscore"
    code, out, err = run(["link", "--index", str(tmp_path / "i"), "chest pain", "--k", "1", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)[0]["candidates"][0]["matched_name"].lower() == "chest pain"


def test_cli_preset_and_explain(tmp_path, capsys):
    table = write_concepts(tmp_path / "c.parquet")
    code, out, err = run(["index", "build", "--dict", str(table), "--out", str(tmp_path / "i"),
                          "--preset", "medical-crossing"], capsys)
    assert code == 0, err
    code, out, err = run(["index", "info", str(tmp_path / "i"), "--json"], capsys)
    parameters = json.loads(out)["parameters"]
    assert (parameters["preset"], parameters["analyzer"], parameters["ngram_max"]) == ("medical-crossing", "char", 2)
    code, out, err = run(["link", "--index", str(tmp_path / "i"), "chest pains", "--k", "1", "--explain"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[2].startswith("       shared n-grams (mention weight x name weight): ") and "'ch' " in lines[2]
    code, out, err = run(["link", "--index", str(tmp_path / "i"), "chest pains", "--k", "1", "--explain", "--json"],
                         capsys)
    [candidate] = json.loads(out)[0]["candidates"]
    shared = candidate["shared_ngrams"]
    assert sum(s["contribution"] for s in shared) == pytest.approx(candidate["score"], rel=1e-4)
    assert set(shared[0]) == {"ngram", "mention_weight", "name_weight", "contribution"}


def test_cli_link_text_and_json(index_dir, capsys):
    code, out, _ = run(["link", "--index", str(index_dir), "thoracic pain", "--k", "2"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "thoracic pain"
    assert lines[1].startswith("  1. 10008479\t1.0000\tChest pain  [matched 'Thoracic pain' LLT en]")
    code, out, _ = run(["link", "--index", str(index_dir), "fiebre", "--lang", "es", "--json", "--k", "1"], capsys)
    [result] = json.loads(out)
    assert result["candidates"][0]["concept_id"] == "10037660"
    assert result["candidates"][0]["preferred_name"] == "Fiebre"


def test_cli_link_jsonl(tmp_path, index_dir, capsys):
    spans = tmp_path / "spans.jsonl"
    spans.write_text('{"id": 7, "text": "vomiting"}\n\n{"text": "cefalea", "lang": "es"}\n')
    code, _out, err = run(["link", "--index", str(index_dir), "--input", str(spans),
                           "--output", str(tmp_path / "out.jsonl"), "--k", "1"], capsys)
    assert code == 0 and "linked 2 mentions" in err
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r.get("id"), r["candidates"][0]["concept_id"]) for r in rows] == [(7, "10047700"), (None, "10019211")]


def test_cli_link_jsonl_bad_line_names_file_and_line(tmp_path, index_dir, capsys):
    spans = tmp_path / "spans.jsonl"
    spans.write_text('{"text": "nausea"}\n{"txt": "oops"}\n')
    code, _out, err = run(["link", "--index", str(index_dir), "--input", str(spans), "--output", "-"], capsys)
    assert code == 1
    assert f'{spans}:2: expected a string field "text", found no field \'text\'' in err


def test_python_m_linker_link_stdout(index_dir):
    proc = subprocess.run([sys.executable, "-m", "linker", "link", "--index", str(index_dir), "--input", "-",
                           "--k", "1"], input='{"text": "nausea"}\n', capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["candidates"][0]["concept_id"] == "10028813"


@pytest.mark.integration
@pytest.mark.slow
def test_medic_links_ncbi_style_mentions(shared_data, tmp_path):
    from linker.dictionary import SourceSpec, build_dictionary

    medic = shared_data / "ncbi_disease" / "medic_06Jul2012.txt"
    build_dictionary([SourceSpec("tsv", (medic,))], tmp_path / "medic.parquet")
    build_index(tmp_path / "medic.parquet", kind="tfidf", out=tmp_path / "idx")
    results = Linker.load(tmp_path / "idx").link(["breast cancer", "Huntington disease", "colorectal cancers"], k=2)
    assert [r.candidates[0].concept_id for r in results] == ["D001943", "D006816", "D015179"]
    assert results[0].candidates[0].preferred_name == "Breast Neoplasms"
