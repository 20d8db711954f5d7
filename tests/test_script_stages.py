"""scripts/stages.py: an index built from a model folder goes stale when that folder is retrained."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from index_tables import write_concepts
from linker.index import build_index
from linker.index.dense import DenseConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from stages import index_current  # noqa: E402


def test_an_index_is_current_only_for_the_encoder_folder_as_it_was_built(tmp_path, tiny_encoder_dir):
    encoder = tmp_path / "model"
    shutil.copytree(tiny_encoder_dir, encoder)
    folder = tmp_path / "dense"
    assert not index_current(folder, str(encoder))  # nothing built yet
    build_index(write_concepts(tmp_path / "c.parquet"), kind="dense", out=folder,
                config=DenseConfig(encoder=str(encoder), threads=1))
    assert index_current(folder, str(encoder))
    weights = encoder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")  # "trained on": same path, other weights
    assert not index_current(folder, str(encoder))
