"""Capability suite: perturbations, case generation, held-out scoring, reports and `linker capabilities`."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from linker.cli.main import main
from linker.dictionary import SourceSpec, build_dictionary, read_concept_table
from linker.errors import ConfigError, InputFormatError
from linker.eval.capabilities import (
    CapabilityReport,
    CapabilityRow,
    _chart,
    evaluate_capabilities,
    generate_cases,
    initials,
    load_suite_data,
    plural,
    read_templates,
    respell,
    run_cases,
    typo,
    unpunctuate,
    wilson_interval,
    write_capability_report,
)
from linker.index import build_index
from linker.link import Linker
from linker.schema import CONCEPT_SCHEMA
from linker.sources.obo import read_obo_parents

DATA = load_suite_data()


def _row(concept_id, name, *, preferred=False, term_type="SY", lang="en", source="test"):
    return {"concept_id": concept_id, "name": name, "lang": lang, "source": source, "term_id": concept_id,
            "term_type": "PT" if preferred else term_type, "preferred": preferred, "current": True, "xrefs": []}


ROWS = [
    _row("C1", "breast cancer", preferred=True),
    _row("C1", "breast neoplasm"),
    _row("C1", "mammary carcinoma"),
    _row("C2", "ovarian cancer", preferred=True),
    _row("C2", "ovary neoplasm"),
    _row("C3", "kidney disease", preferred=True),
    _row("C3", "renal disease"),
    _row("C4", "hair loss", preferred=True),
    _row("C4", "baldness", term_type="SY_EXACT/layperson"),
    _row("C5", "atrial septal defect", preferred=True),
    _row("C5", "ASD", term_type="SY_EXACT/abbreviation"),
    # ICD-10 codes: E11.9 is a child of E11 by code prefix
    _row("E11", "Type 2 diabetes mellitus", preferred=True, source="icd10cm"),
    _row("E11.9", "Type 2 diabetes mellitus without complications", preferred=True, source="icd10cm"),
    _row("E11.9", "NIDDM uncomplicated", source="icd10cm"),
]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("capabilities")
    pq.write_table(pa.Table.from_pylist(ROWS, schema=CONCEPT_SCHEMA), folder / "dict.parquet")
    build_index(folder / "dict.parquet", kind="tfidf", out=folder / "index")
    return folder / "index"


# ----------------------------------------------------------------------------- perturbations


def test_keyboard_neighbours_come_from_the_data_file():
    assert DATA.keyboard["s"] == "adewxz"  # row neighbours a, d; above w, e; below z, x
    assert DATA.keyboard["q"] == "aw" and DATA.keyboard["a"] == "qswz"


@pytest.mark.parametrize(("name", "expected"), [
    ("Headache", "Headaches"), ("Atrophy", "Atrophies"), ("Diagnosis", "Diagnoses"), ("kidney", "kidneys"),
    ("Abscess", "Abscesses"), ("Diabetes", None), ("Arthritis", None), ("Diabetes, Gestational", None), ("Type 2", None),
])
def test_plural_rules(name, expected):
    made = plural(name, DATA.plural)
    assert (made[0] if made else None) == expected


@pytest.mark.parametrize(("name", "expected"), [
    ("Anemia of prematurity", "Anaemia of prematurity"), ("subarachnoid haemorrhage", "subarachnoid hemorrhage"),
    ("Brain TUMOR", "Brain TUMOUR"), ("Headache", None),
])
def test_respell_us_uk(name, expected):
    made = respell(name, DATA.spelling)
    assert (made[0] if made else None) == expected


def test_typo_is_one_edit_after_the_first_letter_and_deterministic():
    a = [typo("Alopecia areata", np.random.default_rng(s), DATA.keyboard) for s in range(30)]
    b = [typo("Alopecia areata", np.random.default_rng(s), DATA.keyboard) for s in range(30)]
    assert a == b
    kinds = {kind for _, kind in a}
    assert kinds == {"substitution", "deletion", "transposition"}
    for text, kind in a:
        assert text[0] == "A" and text != "Alopecia areata"
        assert len(text) == len("Alopecia areata") - (kind == "deletion")
    assert typo("Flu", np.random.default_rng(0), DATA.keyboard) is None  # no word of >= 4 letters


def test_unpunctuate_and_initials():
    assert unpunctuate("Aplasia/Hypoplasia of the toe(s)", np.random.default_rng(0))[0] == "Aplasia Hypoplasia of the toe s"
    assert unpunctuate("no punctuation", np.random.default_rng(0)) is None
    assert initials("atrial septal defect") == "ASD"
    assert initials("Type 2 diabetes") is None and initials("Alopecia") is None


def test_wilson_interval():
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert all(np.isnan(wilson_interval(0, 0)))


def test_wilson_interval_holds_the_rate_at_none_and_all_failed():
    # issue 34 case 13: at n/n the upper bound came out 1 - 1e-16 (4/4, 10/10, 14/14, ...), below the rate, and the
    # chart's error bar rate..high was negative ("'xerr' must not contain negative values"), losing the report
    for n in range(1, 400):
        for k in (0, 1, n - 1, n):
            low, high = wilson_interval(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0, (k, n, low, high)
    assert wilson_interval(4, 4)[1] == 1.0 and wilson_interval(0, 4)[0] == 0.0


def _report(label: str, rows: list[tuple[int, int, float, float]]) -> CapabilityReport:
    """A report whose rows have (failures, n) and the given (low, high) bounds, as a JSON report may hold them."""
    return CapabilityReport(label, label, tuple(
        CapabilityRow(f"INV cap{i}", "test", n, k, k / n if n else float("nan"), low, high)
        for i, (k, n, low, high) in enumerate(rows)), {}, {"suite_data_version": "1", "dict_sample": 5, "seed": 1})


def test_chart_draws_rates_a_rounding_error_outside_their_interval(tmp_path):
    # the bounds the old wilson_interval gave at 4/4 and 0/4, a row with no cases, and one with unknown bounds
    rows = [(4, 4, 0.5101, 1.0 - 1e-16), (0, 4, 1e-17, 0.4899), (0, 0, float("nan"), float("nan")),
            (2, 4, float("nan"), float("nan"))]
    _chart([_report("a", rows), _report("b", rows[::-1])], tmp_path / "chart.png", "test")
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failing_chart_keeps_the_tables_and_warns_in_one_line(tmp_path, monkeypatch, caplog):
    import linker.eval.capabilities as capabilities

    def broken(*_args, **_kwargs):
        raise ValueError("'xerr' must not contain\nnegative values")

    monkeypatch.setattr(capabilities, "_chart", broken)
    reports = [_report("a", [(4, 4, *wilson_interval(4, 4))])]
    (tmp_path / "caps.png").write_bytes(b"an earlier run's chart")
    written = write_capability_report(reports, tmp_path, name="caps", overwrite=True)
    assert [p.name for p in written] == ["caps.json", "caps.md"]
    assert json.loads((tmp_path / "caps.json").read_text())[0]["rows"][0]["failures"] == 4
    assert "| 100.0 [51.0, 100.0] | 4 |" in (tmp_path / "caps.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["caps.json", "caps.md"]  # no temporary, no stale chart
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "caps.png: chart not written (ValueError: 'xerr' must not contain negative values), the earlier chart " \
           "removed; the report is in caps.md and caps.json" in warning and "\n" not in warning


def test_cli_suite_report_survives_a_failing_chart(index_dir, tmp_path, capsys, monkeypatch):
    import linker.eval.capabilities as capabilities

    monkeypatch.setattr(capabilities, "_chart", lambda *a, **k: 1 / 0)
    main(["capabilities", "--index", str(index_dir), "--dict-sample", "5", "--report",
          str(tmp_path / "caps")])  # returns: exit 0
    captured = capsys.readouterr()
    assert "| capability | what changes |" in captured.out and "Traceback" not in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["caps.json", "caps.md"]


# ----------------------------------------------------------------------------- cases


def test_generate_cases_is_deterministic_and_covers_every_kind(index_dir):
    table = read_concept_table(index_dir / "concepts.parquet").table
    a = generate_cases(table, DATA, sample=50, seed=3)
    assert a == generate_cases(table, DATA, sample=50, seed=3)
    capabilities = {c.capability for c in a}
    assert {"INV case_upper", "INV typo_1", "INV wrapper_negation", "MFT synonym", "MFT lay_synonym",
            "MFT abbreviation_synonym", "MFT abbreviation_context", "DIR parent"} <= capabilities
    lay = [c for c in a if c.capability == "MFT lay_synonym"]
    assert [(c.query, c.concept_id) for c in lay] == [("baldness", "C4")]
    [context] = [c for c in a if c.capability == "MFT abbreviation_context" and c.concept_id == "C5"]
    assert context.query == "atrial septal defect" and context.variant.startswith("source short form")
    [direction] = [c for c in a if c.capability == "DIR parent"]
    assert (direction.concept_id, direction.parent_id, direction.variant) == ("E11.9", "E11", "code prefix")
    small = generate_cases(table, DATA, sample=1, seed=3)
    assert max(sum(c.capability == cap for c in small) for cap in capabilities) == 1



def test_generators_run_in_registration_order_and_a_new_one_changes_no_other_case(index_dir, monkeypatch):
    import linker.eval.capabilities as capabilities
    from linker.registry import Registry

    table = read_concept_table(index_dir / "concepts.parquet").table
    before = generate_cases(table, DATA, sample=50, seed=3)
    order = list(dict.fromkeys(c.capability for c in before))
    assert order[:2] == ["INV case_upper", "INV case_title"] and order[-1] == "DIR parent"
    extended = Registry("capability generator")
    for name in capabilities.CASE_GENERATORS:
        extended.register(name, capabilities.CASE_GENERATORS[name])
    extended.register("INV reversed", lambda ctx: capabilities._inv(ctx, "reversed", lambda n, rng, lang: (n[::-1], "r")))
    monkeypatch.setattr(capabilities, "CASE_GENERATORS", extended)
    after = generate_cases(table, DATA, sample=50, seed=3)
    assert after[: len(before)] == before and {c.capability for c in after[len(before):]} == {"INV reversed"}

def test_translations_per_language_pair(tmp_path, fixtures):
    obo = fixtures / "obo"
    build_dictionary([SourceSpec("obo", (obo / "hp_slice.obo", obo / "hp-es.babelon.tsv"))], tmp_path / "hpo.parquet")
    cases = generate_cases(read_concept_table(tmp_path / "hpo.parquet").table, DATA, sample=10, seed=1)
    pairs = {c.capability for c in cases if "translation" in c.capability}
    assert pairs == {"MFT translation es->en", "MFT translation en->es"}
    es_en = {(c.query, c.concept_id, c.target_lang) for c in cases if c.capability == "MFT translation es->en"}
    assert ("Cefalea", "HP:0002315", "en") in es_en


def test_read_obo_parents(fixtures):
    assert read_obo_parents(fixtures / "obo" / "hp_slice.obo") == {"HP:0001596": ("HP:0001595",)}


# ----------------------------------------------------------------------------- scoring


def test_held_out_names_are_left_out_and_dir_failure_found(index_dir):
    linker_ = Linker.load(index_dir)
    table = linker_.concepts.table
    report = run_cases(linker_, generate_cases(table, DATA, sample=50, seed=3))
    assert report.row("INV case_upper").failures == 0  # tf-idf lower-cases through linker.text.normalize
    assert report.row("INV whitespace").failures == 0
    # "NIDDM uncomplicated" shares little with the held-out child name: the parent E11 wins.
    dir_row = report.row("DIR parent")
    assert (dir_row.n, dir_row.failures) == (1, 1)
    assert (dir_row.examples[0].got_id, dir_row.examples[0].before_id) == ("E11", "E11")
    synonyms = report.row("MFT synonym")
    for failure in synonyms.examples:  # a held-out name never matches itself
        assert failure.matched_name != failure.query
    rate = synonyms.failures / synonyms.n
    assert synonyms.low <= rate <= synonyms.high


def test_link_exclude_mask(index_dir):
    linker_ = Linker.load(index_dir)
    exclude = np.zeros(linker_.concepts.table.num_rows, dtype=bool)
    exclude[1] = True  # "breast neoplasm"
    [kept] = linker_.link(["breast neoplasm"], k=1)
    [left_out] = linker_.link(["breast neoplasm"], k=1, exclude=exclude)
    assert kept.candidates[0].matched_name == "breast neoplasm"
    assert left_out.candidates[0].matched_name != "breast neoplasm"
    with pytest.raises(ConfigError, match="a mask of 14 name rows expected, found 2"):
        linker_.link(["x"], exclude=np.zeros(2, dtype=bool))


def test_user_templates_add_capabilities(index_dir, tmp_path):
    user = tmp_path / "mine.tsv"
    user.write_text("# mine\nwrapper\tscreening\ten\t{name} screening\n", encoding="utf-8")
    [report] = evaluate_capabilities([index_dir], sample=5, templates=[user])
    assert report.row("INV wrapper_screening").n == 5
    assert str(user) in report.config["suite_data_sha256"]


@pytest.mark.parametrize(("text", "message"), [
    ("wrapper\tx\ten\tno placeholder\n", "mine.tsv:1: expected a wrapper template holding {name}"),
    ("abbreviation\tx\ten\t{long} only\n", "mine.tsv:1: expected a abbreviation template holding {long} and {short}"),
    ("wrapper\tx\t{name}\n", "mine.tsv:1: expected kind<TAB>capability<TAB>lang<TAB>template"),
    ("insert\tx\ten\t{name}\n", "mine.tsv:1: expected kind 'wrapper' or 'abbreviation'"),
])
def test_bad_templates(tmp_path, text, message):
    user = tmp_path / "mine.tsv"
    user.write_text(text, encoding="utf-8")
    with pytest.raises(InputFormatError) as error:
        read_templates(user)
    assert message in str(error.value)


def test_package_templates_are_valid():
    kinds = {t.kind for t in DATA.templates}
    assert kinds == {"wrapper", "abbreviation"} and DATA.version == "1"


# ----------------------------------------------------------------------------- CLI and report


def test_cli_suite_side_by_side_report(index_dir, tmp_path, capsys):
    other = tmp_path / "other"
    build_index(index_dir / "concepts.parquet", kind="tfidf", out=other, config=None)
    main(["capabilities", "--index", str(index_dir), "--index", str(other), "--dict-sample", "5",
          "--seed", "2", "--report", str(tmp_path / "caps")])
    out = capsys.readouterr().out
    assert "| capability | what changes | index fail % [95% CI] | other fail % [95% CI] | n |" in out
    assert sorted(p.name for p in tmp_path.glob("caps.*")) == ["caps.json", "caps.md", "caps.png"]
    reports = json.loads((tmp_path / "caps.json").read_text())
    assert [r["label"] for r in reports] == ["index", "other"]
    assert [r["rows"] for r in reports][0] == [r["rows"] for r in reports][1]  # same table, same cases, same results
    md = (tmp_path / "caps.md").read_text()
    assert "### DIR parent: weakest is index (100.0% of 1 fail)" in md
    assert "| `Type 2 diabetes mellitus without complications` | code prefix | E11.9" in md
    again = ["capabilities", "--index", str(index_dir), "--dict-sample", "5", "--report", str(tmp_path / "caps")]
    with pytest.raises(SystemExit) as code:  # reports are never replaced silently
        main(again)
    assert code.value.code == 1 and "caps.json exists; pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "caps.md").read_text() == md
    main([*again, "--overwrite"])
    assert "other" not in (tmp_path / "caps.md").read_text()


@pytest.mark.parametrize(("args", "message"), [
    (["eval", "--suite", "capabilities"], "error: --suite capabilities is now its own command: linker capabilities --index"),
    (["eval"], "error: linker eval needs --dataset FORMAT:PATH (the capability suite: linker capabilities)"),
    (["capabilities", "--dict-sample", "0"], "error: --dict-sample must be a positive number of concepts, found 0"),
])
def test_cli_suite_errors(index_dir, capsys, args, message):
    with pytest.raises(SystemExit) as code:
        main([*args, "--index", str(index_dir)])
    assert code.value.code == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_dataset_takes_one_index(index_dir, fixtures, capsys):
    with pytest.raises(SystemExit) as code:
        main(["eval", "--index", str(index_dir), "--index", str(index_dir),
              "--dataset", f"query:{fixtures / 'eval/mentions.query'}"])
    assert code.value.code == 1
    assert "--dataset scores one index at a time, found 2 --index options" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.slow
def test_suite_on_medic(shared_data, tmp_path):
    build_dictionary([SourceSpec("tsv", (shared_data / "ncbi_disease" / "medic_06Jul2012.txt",))], tmp_path / "medic.parquet")
    build_index(tmp_path / "medic.parquet", kind="tfidf", out=tmp_path / "medic")
    [report] = evaluate_capabilities([tmp_path / "medic"], sample=30, seed=15)
    assert report.row("INV case_upper").failures == 0
    assert report.row("MFT synonym").n == 30
    assert {r.capability for r in report.rows} >= {"INV typo_1", "INV word_order", "MFT abbreviation_context"}
