"""The CUDA path: encoders, dense indexes, linking and training on a GPU.

sentence-transformers puts a model on the GPU whenever torch sees one, so a user with a GPU takes
this path by default. Skipped where torch sees no GPU (CI, the development machine); on a GPU
machine: `pytest tests/test_cuda.py` (the other encoder and training tests then run on the GPU too).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from linker.dictionary import SourceSpec, build_dictionary
from linker.encoders import load_encoder
from linker.index import build_index
from linker.index.dense import DenseConfig, DenseNameIndex
from linker.link import Linker
from linker.precision import resolve_precision
from linker.train.sap import SapConfig, train_sap

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch")

NAMES = (Path(__file__).parent / "fixtures" / "dense" / "names.txt").read_text(encoding="utf-8").splitlines()
QUERIES = ["hair loss", "broken leg", "high blood pressure", "kidney failure", "itchy skin"]


def test_encoders_load_on_the_gpu_and_auto_picks_bf16(tiny_encoder_dir):
    gpu = load_encoder(str(tiny_encoder_dir), precision="auto")
    assert gpu.device.startswith("cuda")
    assert gpu.precision == resolve_precision("auto", device=gpu.device) == "bf16"  # every GPU since Ampere
    cpu = load_encoder(str(tiny_encoder_dir), device="cpu")
    reference = cpu.encode(NAMES, role="passage")
    exact = load_encoder(str(tiny_encoder_dir), precision="fp32").encode(NAMES, role="passage")
    assert np.sum(reference * exact, axis=1).min() > 0.9999
    assert np.sum(reference * gpu.encode(NAMES, role="passage"), axis=1).min() > 0.99


def test_an_index_links_the_same_on_the_gpu_as_on_the_cpu(tiny_encoder_dir, tmp_path):
    folder = tmp_path / "dense"
    build_index(_table(tmp_path), kind="dense", out=folder,
                config=DenseConfig(encoder=str(tiny_encoder_dir), precision="fp32"))
    on_gpu = DenseNameIndex.load(folder)
    assert on_gpu.encoder.device.startswith("cuda")
    on_cpu = DenseNameIndex.load(folder, encoder=load_encoder(str(tiny_encoder_dir), device="cpu"))
    assert on_gpu.search(QUERIES, 1)[1].tolist() == on_cpu.search(QUERIES, 1)[1].tolist()
    assert [r.candidates[0].concept_id for r in Linker.load(folder).link(QUERIES)]


def test_int8_runs_on_the_cpu_of_a_gpu_machine(tiny_encoder_dir, tmp_path):
    # int8 is a CPU precision: asked for (or recorded by an index), the encoder is loaded on the CPU
    # instead of on the GPU that sentence-transformers would pick.
    assert load_encoder(str(tiny_encoder_dir), precision="int8").device == "cpu"
    build_index(_table(tmp_path), kind="dense", out=tmp_path / "int8",
                config=DenseConfig(encoder=str(tiny_encoder_dir), precision="int8"))
    loaded = DenseNameIndex.load(tmp_path / "int8")
    assert loaded.encoder.device == "cpu" and loaded.encoder.precision == "int8"
    assert loaded.search(["hair loss"], 1)[1].shape == (1, 1)


def test_sap_trains_on_the_gpu_in_bf16(tiny_encoder_dir, tmp_path):
    summary = train_sap(_table(tmp_path), encoder=str(tiny_encoder_dir), out=tmp_path / "sap",
                        config=SapConfig(lr=1e-3, batch_size=4, epochs=1, seed=3))
    assert summary["hardware"]["device"].startswith("cuda") and summary["precision"] == "bf16"
    assert any((tmp_path / "sap").rglob("*.safetensors"))
    assert load_encoder(str(tmp_path / "sap"), device="cpu").encode(["hair loss"], role="query").shape[0] == 1


def _table(tmp_path: Path) -> Path:
    out = tmp_path / "dict.parquet"
    if not out.exists():
        build_dictionary([SourceSpec("tsv", (Path(__file__).parent / "fixtures" / "train" / "dict.tsv",))], out)
    return out
