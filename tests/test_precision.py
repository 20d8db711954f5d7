"""Precision (fp32, bf16, int8, auto) and the encode loop: parity on the tiny model, manifests, CLI."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from linker import precision as prec
from linker.batching import distinct_ids, encode_stats, length_batches, token_batches
from linker.cli.main import main
from linker.encoders import load_encoder
from linker.errors import ConfigError, UnknownNameError
from linker.index import build_index, load_index
from linker.index.dense import DenseConfig, DenseNameIndex, precision_check
from linker.link import Linker

NAMES = (Path(__file__).parent / "fixtures" / "dense" / "names.txt").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def fp32(tiny_encoder_dir):
    return load_encoder(str(tiny_encoder_dir))


@pytest.fixture
def cpu(monkeypatch):
    """Pretend the processor has the given feature flags."""

    def set_flags(*flags: str) -> None:
        monkeypatch.setattr(prec, "cpu_flags", lambda: frozenset(flags))

    return set_flags


def test_unknown_precision_lists_the_choices(tiny_encoder_dir):
    with pytest.raises(UnknownNameError, match="available: auto, bf16, fp32, int8"):
        load_encoder(str(tiny_encoder_dir), precision="fp16")
    with pytest.raises(UnknownNameError, match="precision"):
        DenseConfig(precision="half")


def test_auto_takes_bf16_only_where_the_processor_runs_it_natively(cpu):
    cpu("avx512f", "avx512_bf16", "avx512_vnni")
    assert prec.native_precisions("cpu") == ("fp32", "bf16", "int8")
    assert prec.resolve_precision("auto") == "bf16"
    cpu("avx2", "avx512_vnni")
    assert prec.native_precisions("cpu") == ("fp32", "int8")
    assert prec.resolve_precision("auto") == "fp32"  # int8 is no auto choice (see AUTO_CHOICES)
    assert prec.resolve_precision("bf16") == "bf16"  # asked for: honoured, even emulated


def test_a_recorded_precision_is_kept_where_native_else_fp32(cpu):
    cpu("avx512_bf16")
    assert prec.resolve_precision(None, recorded="bf16") == "bf16"
    assert prec.resolve_precision(None, recorded=None) == "fp32"  # an index from before precisions
    assert prec.resolve_precision("fp32", recorded="bf16") == "fp32"  # told otherwise
    cpu("avx2")
    assert prec.resolve_precision(None, recorded="bf16") == "fp32"
    with pytest.raises(ConfigError, match="int8 runs on the CPU only"):
        prec.resolve_precision("int8", device="cuda:0")


def test_available_cpus_follow_affinity_and_cgroup_quota(monkeypatch):
    import os

    affinity = len(os.sched_getaffinity(0))
    assert 1 <= prec.available_cpus() <= affinity
    monkeypatch.setattr(prec, "_cgroup_quota", lambda: 0.5)  # half a CPU still gets one thread
    assert prec.available_cpus() == 1
    monkeypatch.setattr(prec, "_cgroup_quota", lambda: None)
    assert prec.available_cpus() == affinity


def test_thread_budget_keeps_to_omp_num_threads_and_the_cpus(monkeypatch):
    monkeypatch.setattr(prec, "available_cpus", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [prec.thread_budget(n) for n in (1, 2, 8)] == [1, 2, 2]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray sets in an actor that reserved one CPU
    assert prec.thread_budget(2) == 1
    for ignored in ("", "0", "two"):
        monkeypatch.setenv("OMP_NUM_THREADS", ignored)
        assert prec.thread_budget(2) == 2


def test_in_threads_runs_every_item_once_on_kept_threads_and_raises_a_workers_error(monkeypatch):
    monkeypatch.setattr(prec, "_kept", {})  # a pool of its own, of 2 threads whatever this machine's CPUs
    monkeypatch.setattr(prec, "available_cpus", lambda: 3)
    done = []
    run = done.append
    before = threading.active_count()
    for _ in range(20):  # a one-mention link's steps, call after call: the helper threads are kept, not started again
        prec.in_threads(run, range(7), 3)
    assert sorted(done) == sorted(list(range(7)) * 20)
    assert threading.active_count() <= before + 2
    prec.in_threads(run, [], 3)
    prec.in_threads(run, ["alone"], 3)  # one item: on the calling thread
    assert done[-1] == "alone"
    for bad in (0, 3, 5):  # whichever thread meets it, the error reaches the caller, and no item runs twice
        ran = []
        with pytest.raises(ZeroDivisionError):
            prec.in_threads(lambda item: ran.append(1 / (item - bad)), range(6), 2)
        assert len(ran) == len(set(ran)) <= 5


def test_concurrent_callers_of_in_threads_share_the_kept_threads_without_waiting_on_each_other(monkeypatch):
    # four callers (a service's inference threads) at once, each with work for 2 threads, the kept pool holding
    # one: each caller drains its own items, so none waits for the others' queued work to start
    monkeypatch.setattr(prec, "_kept", {})
    monkeypatch.setattr(prec, "available_cpus", lambda: 2)
    results = {}

    def caller(name):
        seen = []
        prec.in_threads(lambda item: (threading.Event().wait(0.002), seen.append(item)), range(10), 2)
        results[name] = sorted(seen)

    callers = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for c in callers:
        c.start()
    for c in callers:
        c.join(timeout=30)
    assert results == {i: list(range(10)) for i in range(4)}
    # a caller whose helper is queued behind another caller's slow work does not wait for that work
    slow_started, release = threading.Event(), threading.Event()

    def slow(item):
        slow_started.set()
        release.wait(30)

    other = threading.Thread(target=lambda: prec.in_threads(slow, range(2), 2))
    other.start()
    assert slow_started.wait(30)
    quick = []
    finished = threading.Thread(target=lambda: prec.in_threads(quick.append, range(3), 2))
    finished.start()
    finished.join(timeout=10)
    alive = finished.is_alive()
    release.set()
    other.join(timeout=30)
    assert not alive and sorted(quick) == [0, 1, 2]


def test_a_threads_cores_share_caps_its_thread_budget_and_ends_with_its_block(monkeypatch):
    monkeypatch.setattr(prec, "available_cpus", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with prec.cores_share(2):
        assert prec.thread_budget(8) == 2
        with prec.cores_share(4):
            assert prec.thread_budget(8) == 4
        assert prec.thread_budget(8) == 2
        other = []
        worker = threading.Thread(target=lambda: other.append(prec.thread_budget(8)))
        worker.start()
        worker.join()
        assert other == [8]  # the share is the calling thread's only
    assert prec.thread_budget(8) == 8


def test_token_batches_respect_the_budget_and_the_count():
    lengths = np.array([2, 2, 3, 3, 3, 8, 20])
    batches = token_batches(lengths, token_budget=9, max_batch=10)
    assert batches == [(0, 3), (3, 5), (5, 6), (6, 7)]  # 3 x 3 tokens fit 9; 20 > 9 goes alone
    # a large budget: batches still break where padding would exceed 1.25 x the shortest + 2
    spread = np.array([2, 3, 4, 5, 8, 9, 12, 30])
    assert token_batches(spread, token_budget=10_000, max_batch=10, small_batch_tokens=0) == [
        (0, 3), (3, 5), (5, 7), (7, 8)]
    # ...unless the batch stays small (a few mentions of a service call): one forward pass, 8 x 30 tokens
    assert token_batches(spread, token_budget=10_000, max_batch=10, small_batch_tokens=240) == [(0, 8)]
    assert token_batches(spread, token_budget=10_000, max_batch=10, small_batch_tokens=100) == [
        (0, 7), (7, 8)]  # 7 x 12 = 84 fit, 8 x 30 = 240 does not
    assert token_batches(np.array([1] * 5), token_budget=100, max_batch=2) == [(0, 2), (2, 4), (4, 5)]


def test_one_encode_plan_and_record_for_the_torch_encoder_and_the_runtime(caplog):
    """`distinct_ids`, `length_batches` and `encode_stats`: the plan and record both encoders share."""
    inverse, firsts, copies = distinct_ids([[1, 2], [3], [1, 2], [4, 5, 6, 7]])
    assert (inverse.tolist(), firsts.tolist(), copies.tolist()) == ([0, 1, 0, 2], [0, 1, 3], [2, 1, 1])
    clipped, order, batches = length_batches(np.array([2, 1, 4]), 3, 100, None)
    assert (clipped.tolist(), order.tolist(), batches) == ([2, 1, 3], [1, 0, 2], [(0, 3)])
    log = logging.getLogger("linker.test_batching")
    with caplog.at_level(logging.WARNING, logger=log.name):
        stats = encode_stats(np.array([2, 1, 2, 4]), clipped, len(batches), 9, 3, 0.0, 0.0, log)
    assert (stats.texts, stats.batches, stats.tokens, stats.padded_tokens, stats.longest, stats.truncated) == (
        4, 1, 6, 9, 4, 1)
    assert [r.name for r in caplog.records] == [log.name] and "1 of 4 texts" in caplog.records[0].getMessage()


def test_encode_loop_matches_sentence_transformers_in_the_callers_order(fp32):
    texts = ["fracture of femur with a very long description of the bone", "rash", "hair loss", "fever", "rash"]
    seen = []
    ours = fp32.encode(texts, role="passage", token_budget=16, progress=seen.append)
    reference = fp32.model.encode(texts, convert_to_numpy=True, normalize_embeddings=True)
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    assert sum(seen) == len(texts) and len(seen) == fp32.last_stats.batches > 1
    stats = fp32.last_stats
    assert (stats.texts, stats.truncated) == (5, 0) and stats.padded_tokens >= stats.tokens


def test_truncation_is_counted(tiny_encoder_dir):
    encoder = load_encoder(str(tiny_encoder_dir))
    encoder.model.max_seq_length = 4
    encoder.encode(["hair loss of the scalp", "rash"], role="passage")
    assert encoder.last_stats.truncated == 1 and encoder.last_stats.max_length == 4
    assert encoder.last_stats.longest > 4


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_precisions_keep_parity_with_fp32_on_the_tiny_model(fp32, precision):
    reduced = fp32.with_precision(precision)
    assert reduced.precision == precision and fp32.precision == "fp32"
    figures = precision_check(NAMES, fp32, reduced, sample=len(NAMES))
    assert figures["sample"] == 35 and figures["min_cosine"] >= 0.99, figures
    assert figures["top1_agreement"] >= 0.97 and figures["passed"], figures  # at most one of 35 flips
    if precision == "int8":  # the Linear layers really were swapped for quantised ones
        from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear

        def quantized(model) -> int:
            return sum(isinstance(m, QuantizedLinear) for m in model.modules())

        assert quantized(reduced.model) == 13 and quantized(fp32.model) == 0  # 2 layers x 6 Linear + pooler


def test_an_int8_encoder_does_not_go_back(fp32):
    with pytest.raises(ConfigError, match="load the encoder again"):
        fp32.with_precision("int8").with_precision("fp32")


def test_old_configs_without_precision_were_fp32():
    assert DenseConfig.from_dict({"encoder": "minilm"}).precision == "fp32"
    assert DenseConfig().precision == "auto"


def _dense_index(tmp_path: Path, tiny_encoder_dir: Path, precision: str) -> Path:
    tsv = tmp_path / "names.tsv"
    tsv.write_text("concept_id\tname\n" + "".join(f"C{i:03d}\t{n}\n" for i, n in enumerate(NAMES)), encoding="utf-8")
    from linker.dictionary import SourceSpec, build_dictionary

    if not (tmp_path / "dict.parquet").exists():
        build_dictionary([SourceSpec("tsv", (tsv,))], tmp_path / "dict.parquet")
    out = tmp_path / f"dense-{precision}"
    build_index(tmp_path / "dict.parquet", kind="dense", out=out,
                config=DenseConfig(encoder=str(tiny_encoder_dir), precision=precision))
    return out


def test_the_manifest_records_the_precision_and_its_check_and_queries_follow_it(tmp_path, tiny_encoder_dir, cpu):
    cpu("avx512_bf16", "avx512_vnni")
    folder = _dense_index(tmp_path, tiny_encoder_dir, "auto")
    manifest = json.loads((folder / "manifest.json").read_text())
    record = manifest["dense"]["precision"]
    assert (record["requested"], record["chosen"]) == ("auto", "bf16")
    assert record["check"]["passed"] and record["check"]["sample"] == 35
    assert manifest["dense"]["encoding"]["truncated"] == 0
    assert json.loads((folder / "dense" / "params.json").read_text())["config"]["precision"] == "bf16"
    assert Linker.load(folder).precision == "bf16"  # queries as the names were encoded
    assert Linker.load(folder, precision="fp32").precision == "fp32"  # unless told otherwise
    cpu("avx2")
    assert Linker.load(folder).precision == "fp32"  # a processor without native bf16


def test_int8_index_links_like_fp32(tmp_path, tiny_encoder_dir, cpu):
    # A processor with VNNI, so that the recorded int8 is what queries run in; on one without it they would run
    # in fp32 (resolve_precision), and the test would hang on the machine it runs on.
    cpu("avx512_vnni")
    int8 = load_index(_dense_index(tmp_path, tiny_encoder_dir, "int8"))
    fp32 = load_index(_dense_index(tmp_path, tiny_encoder_dir, "fp32"))
    assert int8.names.encoder.precision == "int8" and fp32.names.encoder.precision == "fp32"
    assert int8.manifest["dense"]["precision"]["check"]["passed"]
    assert "check" not in fp32.manifest["dense"]["precision"]
    _, int8_rows = int8.names.search(NAMES, 1)
    _, fp32_rows = fp32.names.search(NAMES, 1)
    assert np.mean(int8_rows[:, 0] == fp32_rows[:, 0]) >= 0.97


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
        raise SystemExit(0)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_cli_precision_options(tmp_path, tiny_encoder_dir, capsys):
    folder = _dense_index(tmp_path, tiny_encoder_dir, "fp32")
    code, out, err = run(["link", "--index", str(folder), "--precision", "int8", "--json", "fever"], capsys)
    assert code == 0, err
    assert json.loads(out)[0]["candidates"][0]["matched_name"] == "fever"
    code, out, err = run(["link", "--index", str(folder), "--precision", "fp8", "fever"], capsys)
    assert code == 1 and err.strip() == "error: unknown precision 'fp8'; available: auto, bf16, fp32, int8"
    code, out, err = run(["index", "build", "--dict", str(tmp_path / "dict.parquet"), "--kind", "dense", "--encoder",
                          str(tiny_encoder_dir), "--precision", "half", "--out", str(tmp_path / "x")], capsys)
    assert code == 1 and "available: auto, bf16, fp32, int8" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_dense_index_loads_with_a_given_encoder_of_another_precision(tmp_path, fp32):
    DenseNameIndex.build(NAMES, fp32, DenseConfig(encoder="tiny", chunk_rows=8)).save(tmp_path)
    loaded = DenseNameIndex.load(tmp_path, None, fp32.with_precision("bf16"))
    assert loaded.config.precision == "fp32" and loaded.encoder.precision == "bf16"
    assert loaded.search(["fever"], 1)[1][0, 0] == NAMES.index("fever")


def test_compile_decision():
    from linker.encoders import COMPILE_MIN_TEXTS, should_compile

    assert not should_compile("auto", COMPILE_MIN_TEXTS - 1, "bf16")
    assert should_compile("on", 3, "fp32") and not should_compile("off", 10**6, "bf16")
    assert not should_compile("on", 10**6, "int8")  # quantised layers stay in eager mode
    assert not should_compile("auto", 10**6, "bf16", device="cuda")
    with pytest.raises(UnknownNameError, match="available: auto, off, on"):
        should_compile("yes", 1, "fp32")
    with pytest.raises(UnknownNameError):
        DenseConfig(compile="always")


def test_auto_compiles_large_builds_only_with_a_cxx_compiler(monkeypatch):
    from linker import encoders
    from linker.encoders import COMPILE_MIN_TEXTS

    monkeypatch.setattr(encoders.shutil, "which", lambda name: None)
    assert not encoders.should_compile("auto", COMPILE_MIN_TEXTS, "bf16")
    monkeypatch.setattr(encoders.shutil, "which", lambda name: "/usr/bin/g++" if name == "g++" else None)
    assert encoders.should_compile("auto", COMPILE_MIN_TEXTS, "bf16")


def test_a_failed_compile_falls_back_to_eager_and_leaves_the_model_alone(fp32, monkeypatch, caplog):
    import torch

    from linker.encoders import transformer_module

    def broken_compile(fn, **options):
        def run(*args, **kwargs):
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found\nmore detail")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    compiled = fp32.compile()
    assert compiled.compiled and compiled.model is fp32.model  # shared, not copied
    with caplog.at_level("WARNING", logger="linker.encoders"):
        vectors = compiled.encode(NAMES, role="passage")
    assert "torch.compile of encoder" in caplog.text and "eager mode" in caplog.text
    assert not compiled.compiled  # for good: later encodes do not retry
    np.testing.assert_allclose(vectors, fp32.encode(NAMES, role="passage"), atol=1e-6)
    hf = transformer_module(fp32.model)
    assert "forward" not in hf.__dict__ and hf.config._attn_implementation != "eager"
    with pytest.raises(ConfigError, match="int8"):
        fp32.with_precision("int8").compile()


@pytest.mark.slow
def test_a_compiled_encoder_matches_eager_and_follows_changed_weights(tiny_encoder_dir):
    import torch
    import torch._inductor.config

    from linker.encoders import transformer_module

    eager = load_encoder(str(tiny_encoder_dir), threads=1)
    compiled = eager.with_precision("bf16").compile()
    reference = eager.with_precision("bf16").encode(NAMES, role="query")
    with torch._inductor.config.patch(fx_graph_cache=False):  # compile here, not from the cache: the counters below
        first = compiled.encode(NAMES, role="query")
    assert np.min(np.sum(first * reference, axis=1)) > 0.999
    assert compiled.compiled  # the compiled path ran (a failure would have turned it off)
    from torch._dynamo.utils import counters

    if torch.ops.mkldnn._is_mkldnn_bf16_supported():  # the weights were frozen and packed for oneDNN
        assert counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] > 0
    graphs = counters["stats"]["unique_graphs"]
    single = compiled.encode(NAMES[:1], role="query")  # a one-text batch must not compile a second graph
    assert counters["stats"]["unique_graphs"] == graphs and single.shape == (1, reference.shape[1])
    assert float(single[0] @ reference[0]) > 0.999
    hf = transformer_module(eager.model)
    assert "forward" not in hf.__dict__  # the shared model is restored after each encode
    with torch.no_grad():  # a training step changes the weights in place: the frozen graph must not be reused
        hf.embeddings.word_embeddings.weight.mul_(-1.0)
    changed = eager.with_precision("bf16").encode(NAMES, role="query")
    assert np.min(np.sum(compiled.encode(NAMES, role="query") * changed, axis=1)) > 0.999
    assert np.max(np.sum(changed * reference, axis=1)) < 0.999  # the change did move the vectors


@pytest.mark.slow
def test_cli_compile_option_is_recorded(tmp_path, tiny_encoder_dir, capsys):
    _dense_index(tmp_path, tiny_encoder_dir, "fp32")  # writes the concept table
    out = tmp_path / "compiled"
    code, _, err = run(["index", "build", "--dict", str(tmp_path / "dict.parquet"), "--kind", "dense", "--encoder",
                        str(tiny_encoder_dir), "--precision", "bf16", "--compile", "on", "--out", str(out)], capsys)
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dense"]["encoding"]["compiled"] is True
    assert manifest["dense"]["precision"]["check"]["passed"]
    assert json.loads((out / "dense" / "params.json").read_text())["config"]["compile"] == "on"
    code, _, err = run(["index", "build", "--dict", str(tmp_path / "dict.parquet"), "--kind", "dense", "--encoder",
                        str(tiny_encoder_dir), "--compile", "maybe", "--out", str(tmp_path / "y")], capsys)
    assert code == 1 and "available: auto, off, on" in err and "Traceback" not in err
