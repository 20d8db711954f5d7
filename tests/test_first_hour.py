"""What a new user meets first: --version, plain help in pipeline order, quiet logs, progress,
encoder names that fail at once, and messages that tell a concept table from an index folder."""

from __future__ import annotations

import logging
import re
import socket
import time

import pytest

import linker
from linker import progress
from linker.cli.main import PIPELINE_ORDER, cli_command, configure_logging, main
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
    listed = [name for name in re.findall(r"^│ (\w+) ", out, flags=re.M) if name in PIPELINE_ORDER]
    assert listed == list(PIPELINE_ORDER)
    _, out, _ = run(capsys, "dict", "info", "--help")
    assert "Usage: linker dict info [OPTIONS] TABLE" in out
    assert "--samples        INTEGER" in out


def test_third_party_info_is_silenced_unless_verbose():
    configure_logging()
    assert not logging.getLogger("faiss.loader").isEnabledFor(logging.INFO)
    assert not logging.getLogger("sentence_transformers.base.model").isEnabledFor(logging.INFO)
    assert logging.getLogger("faiss.loader").isEnabledFor(logging.WARNING)
    assert logging.getLogger("linker.index").isEnabledFor(logging.INFO)
    configure_logging(verbose=True)
    assert logging.getLogger("faiss.loader").isEnabledFor(logging.INFO)
    configure_logging(quiet=True)
    assert not logging.getLogger("linker.index").isEnabledFor(logging.WARNING)
    assert not progress.on_terminal()
    configure_logging()


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

    with pytest.raises(ConfigError, match=r"unknown encoder 'e5-smal' \(did you mean 'e5-small'\?\); choose minilm"):
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

