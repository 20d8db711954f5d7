"""What a new user meets first: --version, plain help in pipeline order, quiet logs, progress (and a note
during a slow step), usage errors in one line, arguments checked before an index loads, encoder names
that fail at once, and messages that tell a concept table from an index folder."""

from __future__ import annotations

import json
import logging
import re
import socket
import time

import pytest

import linker
from linker import progress
from linker.cli._app import PIPELINE_ORDER
from linker.cli.main import ShortDigests, cli_command, configure_logging, main
from linker.errors import ConfigError, LinkerError, MissingInputError


def run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_version(capsys):
    assert run(capsys, "--version") == (0, f"linker {linker.__version__}\n", "")


def _commands(command, prefix=()):
    yield prefix
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*prefix, name))


def test_help_has_no_type_placeholders_and_lists_commands_in_pipeline_order(capsys):
    for path in _commands(cli_command()):
        code, out, _ = run(capsys, *path, "--help")
        assert code == 0, path
        assert not re.search(r"<(bool|str|int|float|path|list)", out), (path, out)
        assert not re.search(r"\{[a-z_]+\}", out.split("\n\n")[0] + out.partition("Usage:")[2].split("\n")[0]), path
    _, out, _ = run(capsys, "--help")
    listed = [name for name in re.findall(r"^│ ([\w-]+) ", out, flags=re.M) if name in PIPELINE_ORDER]
    assert listed == list(PIPELINE_ORDER)
    _, out, _ = run(capsys, "dict", "info", "--help")
    assert "Usage: linker dict info [OPTIONS] TABLE" in out
    assert "--samples        INTEGER" in out


def test_info_lines_only_with_verbose_progress_always():
    configure_logging()
    for name in ("faiss.loader", "sentence_transformers.base.model", "linker.index", "linker.encoders"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger(name).isEnabledFor(logging.WARNING), name
    assert logging.getLogger("linker.progress").isEnabledFor(logging.INFO)  # progress where no bar is drawn
    configure_logging(verbose=1)
    assert logging.getLogger("linker.index").isEnabledFor(logging.INFO)
    assert logging.getLogger("faiss.loader").isEnabledFor(logging.INFO)
    assert not logging.getLogger("linker.index").isEnabledFor(logging.DEBUG)
    configure_logging(verbose=2)
    assert logging.getLogger("faiss.loader").isEnabledFor(logging.DEBUG)
    configure_logging(quiet=True)
    assert not logging.getLogger("linker.index").isEnabledFor(logging.WARNING)
    assert not logging.getLogger("linker.progress").isEnabledFor(logging.INFO)
    assert not progress.on_terminal()
    configure_logging()


def test_quiet_lasts_as_long_as_its_command(capsys, caplog, tmp_path):
    """`main(["-q", ...])` in-process (the spaCy tests, an embedding application) gives the caller its logging back:
    a warning logged after it still shows."""
    root = logging.getLogger()
    before = root.level, list(root.handlers), progress.enabled()
    with pytest.raises(SystemExit):
        main(["-q", "index", "info", str(tmp_path / "absent")])
    assert (root.level, list(root.handlers), progress.enabled()) == before
    logging.getLogger("linker.rerank").warning("a warning after a quiet command")
    assert "a warning after a quiet command" in caplog.text


def test_log_lines_show_sha256_digests_cut_to_12_characters():
    digest = "0123456789ab" + "f" * 52
    record = logging.LogRecord("linker.encoders", logging.INFO, __file__, 1, "loaded encoder e5 (sha256:%s)",
                               (digest,), None)
    line = ShortDigests("%(message)s").format(record)
    assert line == "loaded encoder e5 (sha256:0123456789ab)"


def test_a_slow_step_says_what_it_does_on_one_line(capsys, caplog):
    with progress.note("checking bf16 against fp32 on 512 names", after=0.05, show=True):
        time.sleep(0.3)
    err = capsys.readouterr().err
    assert re.fullmatch(r"checking bf16 against fp32 on 512 names \.\.\. done in 0\.\d s\n", err), err
    with progress.note("quick", after=5.0, show=True):
        pass
    assert capsys.readouterr().err == ""
    caplog.set_level(logging.INFO, logger="linker.progress")
    with progress.note("encoding", after=0.01, show=False):
        time.sleep(0.2)
    assert [r.getMessage() for r in caplog.records] == ["encoding ..."]


# --- usage errors: one line, exit 2; argument errors before anything loads -------------------


@pytest.mark.parametrize("args, line", [
    (["lnk"], "error: linker: no such command 'lnk'; did you mean 'link'?"),
    (["link", "--kk", "3", "--index", "x", "a"], "error: linker link: no such option --kk; did you mean --k?"),
    (["link", "--indx", "x", "a"], "error: linker link: no such option --indx; did you mean --index or --input?"),
    (["dict", "info"], "error: linker dict info: missing argument TABLE"),
    (["link", "a", "--index"], "error: linker link: option '--index' requires an argument"),
    (["index", "build", "--dict", "t.parquet", "--out", "i", "--threads", "x"], "error: linker index build: invalid value "
     "for --threads: "),
])
def test_usage_errors_are_one_line_with_exit_2(capsys, args, line):
    code, out, err = run(capsys, *args)
    assert (code, out) == (2, "")
    assert err.startswith(line) and err.count("\n") == 1, err
    assert "╭" not in err and "Usage:" not in err


@pytest.fixture
def tiny_index(tmp_path, fixtures, capsys):
    table, index = tmp_path / "t.parquet", tmp_path / "t"
    run(capsys, "dict", "build", "--source", "tsv", str(fixtures / "tsv" / "names.tsv"), "--out", str(table))
    run(capsys, "index", "build", "--dict", str(table), "--out", str(index))
    return index


def test_link_json_says_text_as_jsonl_and_http(capsys, tiny_index):
    code, out, _ = run(capsys, "link", "--index", str(tiny_index), "hair loss", "--k", "1", "--json")
    [result] = json.loads(out)
    assert code == 0 and list(result) == ["text", "candidates", "nil"] and result["text"] == "hair loss"


def test_arguments_and_inputs_are_checked_before_the_index_loads(capsys, tiny_index, tmp_path, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the index was loaded before the arguments were checked")

    monkeypatch.setattr("linker.link.Linker.load", no_load)
    index = str(tiny_index)
    (tmp_path / "spans.jsonl").write_text('{"text": "hair loss"}\n', encoding="utf-8")
    (tmp_path / "gold.tsv").write_text("C0002170\thair loss\n", encoding="utf-8")
    missing = str(tmp_path / "missing.jsonl")
    cases = [
        (["link", "--index", index, "--k", "0", "hair loss"], "error: --k: expected an integer >= 1, found 0"),
        (["link", "--index", index, "--rerank-k", "0", "hair loss"], "error: --rerank-k: expected an integer >= 1"),
        (["link", "--index", index, "--min-confidence", "1.5", "a"], "error: --min-confidence: expected a probability"),
        (["link", "--index", index, "--precision", "fp64", "a"], "error: unknown precision 'fp64'"),
        (["link", "--index", index, "--input", missing], f"error: {missing}"),
        (["link", "--index", str(tmp_path / "none"), "a"], f"error: {tmp_path / 'none'}: no such index folder"),
        (["normalize", "--index", index, "--input", str(tmp_path / "spans.jsonl"), "--format", "jsonl",
          "--output", "-", "--k", "0"], "error: --k: expected an integer >= 1, found 0"),
        (["normalize", "--index", index, "--input", missing, "--format", "jsonl", "--output", "-"], f"error: {missing}"),
        (["normalize", "--index", index, "--input", str(tmp_path / "spans.jsonl"), "--format", "bratt",
          "--output", str(tmp_path / "o")], "error: unknown input format 'bratt'"),
        (["eval", "--index", index, "--dataset", f"tsv:{tmp_path / 'gold.tsv'}", "--k", "0"], "error: --k: expected"),
        (["eval", "--index", index, "--dataset", "tsv:missing.tsv"], "error: missing.tsv: no such file or folder"),
        (["eval", "--index", index, "--dataset", f"tsv:{tmp_path / 'gold.tsv'}", "--train", "tsv:none.tsv"],
         "error: none.tsv: no such file or folder"),
        (["calibrate", "--index", index, "--dataset", "tsv:missing.tsv"], "error: missing.tsv: no such file or folder"),
    ]
    for args, start in cases:
        code, _, err = run(capsys, *args)
        assert code == 1 and err.startswith(start) and err.count("\n") == 1, (args, err)


def test_build_reports_its_result_once(capsys, tmp_path, fixtures):
    table, index = tmp_path / "t.parquet", tmp_path / "t"
    code, out, err = run(capsys, "dict", "build", "--source", "tsv", str(fixtures / "tsv" / "names.tsv"),
                         "--out", str(table))
    assert code == 0 and out.count(str(table)) == 1 and str(table) not in err
    code, out, err = run(capsys, "index", "build", "--dict", str(table), "--out", str(index))
    assert code == 0 and out.startswith(f"wrote {index}: tfidf index of 5 names") and str(index) not in err


def test_log_progress_lines_carry_rate_and_eta(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="linker.progress")
    reporter = progress.LogProgress(1000, "encoding names", "name", every=0.0)
    time.sleep(0.01)
    reporter.update(250)
    [record] = caplog.records
    assert re.fullmatch(r"encoding names: 250/1,000 names \(25%\), [\d,.]+ names/s, 00:00 elapsed, ETA \d\d:\d\d",
                        record.getMessage())
    reporter.update(10)  # the next line waits for `every` seconds, so a log is not flooded
    monkeypatch.setattr(reporter, "every", 3600.0)
    reporter.update(10)
    assert len(caplog.records) == 2


def test_bar_on_a_terminal_is_tqdm_with_rate_and_eta(capsys):
    with progress.bar(100, desc="linking spans", unit="span", show=True) as reporter:
        reporter.update(100)
    err = capsys.readouterr().err
    assert "linking spans: 100%" in err and "span/s" in err and "100/100" in err
    assert isinstance(progress.bar(10, desc="x", show=False), progress.LogProgress)


# --- encoder names ------------------------------------------------------------------------


def test_misspelt_encoder_fails_at_once_with_the_choices(capsys, tmp_path):
    from linker.encoders import resolve_encoder

    with pytest.raises(ConfigError, match=r"unknown encoder 'e5-smal' \(did you mean 'e5-small'\?\); choose linker-en, linker-multi, minilm"):
        resolve_encoder("e5-smal")
    with pytest.raises(MissingInputError, match="encoder folder ./models/none: no such folder"):
        resolve_encoder("./models/none")
    (tmp_path / "models").mkdir()
    with pytest.raises(MissingInputError, match="no such folder"):
        resolve_encoder(str(tmp_path / "models" / "sap"))
    assert resolve_encoder("cambridgeltl/SapBERT-from-PubMedBERT-fulltext#cls").revision == "hub"
    for bad in ("a--b/c", "/x", "bert base", "org/na me"):
        with pytest.raises(LinkerError):
            resolve_encoder(bad)
    # The CLI checks the name before it reads the concept table (which does not even exist here).
    started = time.perf_counter()
    code, _, err = run(capsys, "index", "build", "--dict", str(tmp_path / "none.parquet"), "--kind", "dense",
                       "--encoder", "e5-smal", "--out", str(tmp_path / "i"))
    assert code == 1 and err.startswith("error: unknown encoder 'e5-smal'") and time.perf_counter() - started < 5


@pytest.fixture
def local_hub(monkeypatch):
    """Point huggingface_hub at a port on this machine (no network in tests) and allow hub access."""
    import huggingface_hub.constants as hf_constants

    def use(url: str) -> None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.setattr(hf_constants, "ENDPOINT", url)
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr("linker.encoders.HUB_TIMEOUT_SECONDS", 1.0)

    return use


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("hub", ["refused", "silent"])
def test_unreachable_hub_is_tried_once_with_a_short_timeout(local_hub, hub):
    import sentence_transformers  # noqa: F401  (imported before the clock starts: slow on a busy machine)

    from linker.encoders import load_encoder

    silent = None
    if hub == "silent":  # accepts the connection and never answers
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
    else:
        port = _free_port()
    local_hub(f"http://127.0.0.1:{port}")
    started = time.perf_counter()
    try:
        with pytest.raises(LinkerError) as caught:
            load_encoder("no-such-org/no-such-encoder-0")
    finally:
        if silent is not None:
            silent.close()
    assert time.perf_counter() - started < 10  # a 1 s probe (+ huggingface_hub's one-off registry fetch)
    message = str(caught.value)
    assert "not in the Hugging Face cache and the hub did not answer within 1 s" in message
    assert "hf download no-such-org/no-such-encoder-0 --local-dir models/no-such-encoder-0" in message
    assert "--encoder models/no-such-encoder-0" in message


# --- concept table vs index folder ----------------------------------------------------------


def test_a_concept_table_given_as_index_and_an_index_given_as_table(capsys, tmp_path, fixtures):
    table, index = tmp_path / "t.parquet", tmp_path / "t"
    run(capsys, "dict", "build", "--source", "tsv", str(fixtures / "tsv" / "names.tsv"), "--out", str(table))
    run(capsys, "index", "build", "--dict", str(table), "--out", str(index))
    code, _, err = run(capsys, "link", "--index", str(table), "hair loss")
    assert code == 1
    assert err == (f"error: {table}: expected an index folder, found a concept table (from `linker dict build`); "
                   "`link`, `normalize`, `serve` and `eval` take an index folder, which "
                   f"`linker index build --dict {table} --out DIR` makes from a concept table\n")
    for args in (["dict", "info", str(index)], ["index", "build", "--dict", str(index), "--out", str(tmp_path / "x")]):
        code, _, err = run(capsys, *args)
        assert code == 1
        assert err.startswith(f"error: {index}: expected a concept table (.parquet), found an index folder; ")
        assert f"(the index's own copy is {index / 'concepts.parquet'})" in err


def test_public_manifest_hides_server_paths():
    from linker.index.manifest import public_manifest

    manifest = {"concepts": {"source_path": "/srv/data/hpo.parquet", "path": "concepts.parquet"},
                "encoder": {"name": "minilm", "path": "/opt/venv/site-packages/model"}, "files": {"a/b.npy": {}},
                "list": ["/abs/x", "rel/y"]}
    assert public_manifest(manifest) == {"concepts": {"source_path": "hpo.parquet", "path": "concepts.parquet"},
                                         "encoder": {"name": "minilm", "path": "model"}, "files": {"a/b.npy": {}},
                                         "list": ["x", "rel/y"]}



def _ray_case(capsys, tiny_index, tmp_path, monkeypatch, *options):
    import types

    import linker.engine.ray as engine

    def init(**kwargs):  # what ray.init raises after its GCS timeout (ConnectionError: an OSError, "a file" before)
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init, shutdown=lambda: None)
    monkeypatch.setattr(engine, "import_ray", lambda: fake)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "spans.jsonl").write_text('{"text": "hair loss"}\n', encoding="utf-8")
    return run(capsys, "normalize-ray", "--index", str(tiny_index), "--input", str(tmp_path / "in"),
               "--output", str(tmp_path / "out" / "shards"), *options)


def test_an_unreachable_ray_cluster_is_one_line_naming_the_address(capsys, tiny_index, tmp_path, monkeypatch):
    # Port 1 of the loopback: nothing listens there, and the check answers at once (Ray alone retried for minutes).
    code, _, err = _ray_case(capsys, tiny_index, tmp_path, monkeypatch, "--address", "127.0.0.1:1")
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("error: --address 127.0.0.1:1: no Ray cluster answered there ("), err
    assert "start one with `ray start --head`" in err and "a file" not in err


def test_ray_address_from_the_environment_is_named_and_not_given_a_cpu_count(capsys, tiny_index, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    code, _, err = _ray_case(capsys, tiny_index, tmp_path, monkeypatch)
    assert code == 1 and err.startswith("error: RAY_ADDRESS 127.0.0.1:1: no Ray cluster answered there ("), err


def test_a_cluster_that_fails_to_connect_after_the_port_answers_is_one_line(capsys, tiny_index, tmp_path,
                                                                             monkeypatch):
    import linker.engine.ray as engine

    monkeypatch.setattr(engine, "_check_reachable", lambda address, given: None)  # the port answered
    code, _, err = _ray_case(capsys, tiny_index, tmp_path, monkeypatch, "--address", "127.0.0.1:6379")
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("error: --address 127.0.0.1:6379: no Ray cluster answered there (Failed to connect to Ray "
                          "cluster at 127.0.0.1:6379); start one with `ray start --head`"), err


def test_a_special_file_is_not_called_missing(capsys, tiny_index, tmp_path):
    code, _, err = run(capsys, "normalize", "--index", str(tiny_index), "--input", "/dev/zero", "--format", "jsonl",
                       "--output", str(tmp_path / "o.jsonl"))
    assert code == 1 and err == ("error: /dev/zero: expected a file, found a special file (device, pipe or socket)\n")


def test_a_lay_gold_row_without_a_concept_id_is_refused(capsys, tiny_index, tmp_path):
    gold = tmp_path / "lay.tsv"
    gold.write_text("text\tconcept_ids\torigin\nhair loss\tC0002170\tmine\nheadache\t | \tmine\n", encoding="utf-8")
    code, _, err = run(capsys, "eval", "--index", str(tiny_index), "--dataset", f"lay:{gold}")
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: {gold}:3: expected concept_ids as one or more ids separated by '|', found no "
                          "concept id in ' | '"), err
