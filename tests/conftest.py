"""Shared test set-up: the slow marker, the real-data folder, the project root."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The real benchmark data lives beside the checkout (../shared/data); LINKER_SHARED_DATA overrides it.
SHARED_DATA = Path(os.environ.get("LINKER_SHARED_DATA", ROOT.parent / "shared" / "data"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow (CI does so by default)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Slow tests run in CI (CI=true) and with --runslow; locally the default run stays fast.
    if config.getoption("--runslow") or os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (CI runs it)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder; tests that need it skip with a reason when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (set LINKER_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES


# --- tiny sentence-transformers model (helper D; used by encoder, dense, link, service, train tests) ---

TINY_WORDS = (
    "hair loss alopecia fracture of femur broken leg bone headache cephalalgia migraine nausea vomiting "
    "fever pyrexia pain arthralgia joint rash skin itch pruritus cough dry heart attack myocardial "
    "infarction chest diabetes mellitus type high blood pressure hypertension kidney renal failure "
    "liver hepatic injury sleep insomnia dizziness vertigo fatigue tiredness perte de cheveux haaruitval"
).split()


def make_tiny_encoder(folder: Path, *, prompts: dict[str, str] | None = None, seed: int = 0) -> Path:
    """Write a tiny random BERT (hidden 32, 2 layers) as a sentence-transformers folder.

    WordPiece vocabulary: the special tokens, TINY_WORDS, and every letter and digit as a
    word start and as a "##" continuation, so any ASCII text tokenises without [UNK] floods.
    Weights come from a fixed seed, so vectors are the same on every run. With prompts, the
    folder declares them like e5 does ({"query": "query: ", "passage": "passage: "}).
    """
    import json
    import string

    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    chars = string.ascii_lowercase + string.digits + ":-'"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for token in [*TINY_WORDS, "query", "passage", *chars, *(f"##{c}" for c in chars)]:
        if token not in vocab:
            vocab.append(token)
    ids = {token: i for i, token in enumerate(vocab)}
    tokenizer = Tokenizer(models.WordPiece(ids, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    special = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]"}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 64, **special}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(special), encoding="utf-8")

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, pad_token_id=0,
    )
    BertModel(config).save_pretrained(str(folder))
    st_files = {
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
        "sentence_bert_config.json": {"max_seq_length": 64, "do_lower_case": False},
        "config_sentence_transformers.json": {"prompts": prompts or {}, "default_prompt_name": None},
        "1_Pooling/config.json": {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True},
    }
    for name, content in st_files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(content), encoding="utf-8")
    (folder / "2_Normalize").mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight sentence-transformers folder (32-d, mean pooling, no prompts)."""
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny_encoder") / "model")


@pytest.fixture(scope="session")
def tiny_e5_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny model declaring e5-style prompts ("query: " / "passage: ")."""
    return make_tiny_encoder(
        tmp_path_factory.mktemp("tiny_e5_encoder") / "model", prompts={"query": "query: ", "passage": "passage: "}
    )


# --- the CLI in-process, and its one-line errors (shared by the reliability and hostile-input suites) ---

def cli(args, capsys) -> tuple[int, list[str]]:
    """(exit code, stderr lines) of `linker ARGS` in-process."""
    from linker.cli.main import main

    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    return code, capsys.readouterr().err.strip().splitlines()


def assert_one_line_error(code: int, err: list[str], *needles: str) -> None:
    """Exit 1 and one `error:` line (no traceback) holding every needle."""
    assert code == 1, err
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    for needle in needles:
        assert needle in err[0], err


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray (2 workers) per test module."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'linker[ray]')")
    from linker.engine.ray import ray_session

    # Ray's memory monitor kills workers when the whole machine is above 95% of its memory: on a
    # shared machine other processes would kill these tests' workers at random. The worker-kill test
    # kills one on purpose.
    saved = os.environ.get("RAY_memory_monitor_refresh_ms")
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"
    try:
        with ray_session(workers=2) as ray:
            yield ray
    finally:
        if saved is None:
            os.environ.pop("RAY_memory_monitor_refresh_ms", None)
        else:
            os.environ["RAY_memory_monitor_refresh_ms"] = saved


class Server:
    """A `linker serve` process started by the `serve` fixture: its base URL, its process, what it logged so far."""

    def __init__(self, base: str, proc: subprocess.Popen, log) -> None:
        self.base, self.proc, self._log = base, proc, log

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")


@contextlib.contextmanager
def _serve(*args, wait: float = 60):
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the log goes to a file: a pipe nobody reads while the tests run could fill up and block the server
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-m", "linker", "serve", *map(str, args), "--host", "127.0.0.1",
                                 "--port", str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        server = Server(f"http://127.0.0.1:{port}", proc, log)
        try:
            deadline = time.monotonic() + wait
            while True:
                try:
                    if httpx.get(f"{server.base}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"server did not start: {server.log()}")
                time.sleep(0.2)
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def serve():
    """`with serve("--index", path, ...) as server:` a real `linker serve` on a free loopback port, once /health
    answers (`wait` seconds at most, else the test fails with its log); stopped on leaving the block."""
    return _serve


def makefile_demo_commands() -> list[str]:
    """The Makefile's recipes that `make demo` runs after the install, with make's variables expanded."""
    from bench.lay import makefile_demo  # imported here: only the demo and docs tests need it

    return makefile_demo()


def run_block(code: str, lang: str, work: Path, env: dict[str, str]) -> str:
    """Run a page's `sh` (bash, strict) or `python` block in `work`; its stdout, or the test fails with its stderr."""
    command = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"exit {done.returncode}\n{code}\n--- stderr ---\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A scratch repository root after `make demo`'s recipes ran in it as the Makefile spells them (shell commands,
    `linker` on PATH being this checkout's code): examples/, tests/ and linker/ (the files the pages and the set-up
    read), ../shared/data, and indexes/default. Built once a session: the default index (150,749 names through
    linker-en, its re-ranker and calibration) is the slowest thing the suite makes, and the demo test and the pages'
    blocks read the same one. Returns the root and the environment to run in it."""
    work = tmp_path_factory.mktemp("demo") / "repo"
    (work / "bin").mkdir(parents=True)
    for name in ("examples", "tests", "linker"):  # linker/: the lay sets `make demo` reads (linker/data/lay)
        (work / name).symlink_to(ROOT / name)
    if SHARED_DATA.is_dir():
        (work.parent / "shared").mkdir()
        (work.parent / "shared" / "data").symlink_to(SHARED_DATA)
    wrapper = work / "bin" / "linker"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m linker "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{work / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run_block("\n".join(makefile_demo_commands()[:-1]), "sh", work, env)  # the build; each test runs the last
    return work, env
