"""The hand-off to a lent GPU machine: scripts/model_transfer.py (a model folder through a channel of small
files) and the dev grid of scripts/ncbi_biosyn.py (what is chosen, how the points are recorded)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import model_transfer  # noqa: E402
import ncbi_biosyn  # noqa: E402
import stages  # noqa: E402


def test_a_model_folder_round_trips_through_fp16_shards_no_larger_than_asked(tmp_path, tiny_encoder_dir):
    packed = tmp_path / "packed"
    weights = load_file(tiny_encoder_dir / "model.safetensors")
    total = sum(t.numel() * 2 for t in weights.values() if t.is_floating_point())
    limit_mb = total / 3.5 / 2**20  # forces tensors to be split across 4 shards
    manifest = model_transfer.pack(tiny_encoder_dir, packed, shard_mb=limit_mb, dtype="fp16")
    assert len(manifest["shards"]) == 4 and manifest["split"]
    for shard in manifest["shards"]:
        data = load_file(packed / shard)
        assert sum(t.numel() * t.element_size() for t in data.values()) <= limit_mb * 2**20
    model_transfer.unpack(packed, tmp_path / "model")
    back = load_file(tmp_path / "model" / "model.safetensors")
    assert back.keys() == weights.keys()
    for name, tensor in weights.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape
        assert torch.allclose(back[name], tensor, rtol=2**-10, atol=1e-7)  # fp16: 11 significant bits
    others = sorted(p.relative_to(tiny_encoder_dir) for p in tiny_encoder_dir.rglob("*") if p.is_file())
    assert sorted(p.relative_to(tmp_path / "model") for p in (tmp_path / "model").rglob("*") if p.is_file()) == others


def test_unpack_never_writes_over_a_folder_and_notices_a_changed_file(tmp_path, tiny_encoder_dir):
    packed = tmp_path / "packed"
    model_transfer.pack(tiny_encoder_dir, packed, shard_mb=15, dtype="fp16")
    (tmp_path / "taken").mkdir()
    with pytest.raises(SystemExit, match="exists"):
        model_transfer.unpack(packed, tmp_path / "taken")
    manifest = json.loads((packed / "transfer.json").read_text())
    name = next(p for p in manifest["sha256"] if p.endswith("config.json"))
    manifest["sha256"][name] = "0" * 64
    (packed / "transfer.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match=name):
        model_transfer.unpack(packed, tmp_path / "model")


def test_tensors_equal_to_a_base_model_stay_behind_and_come_back_exact(tmp_path, tiny_encoder_dir):
    import shutil

    from safetensors.torch import save_file

    trained = tmp_path / "trained"
    shutil.copytree(tiny_encoder_dir, trained)
    weights = load_file(trained / "model.safetensors")
    changed = sorted(name for name in weights if "encoder.layer.0." in name)
    assert changed and len(changed) < len(weights)
    for name in changed:  # a run that froze everything but the first layer
        weights[name] = weights[name] + 0.01
    save_file(weights, trained / "model.safetensors")
    packed = tmp_path / "packed"
    manifest = model_transfer.pack(trained, packed, shard_mb=15, dtype="fp16", base=tiny_encoder_dir)
    assert sorted(set(weights) - set(manifest["from_base"])) == changed
    sent = {}
    for shard in manifest["shards"]:
        sent.update(load_file(packed / shard))
    assert sorted(sent) == changed
    with pytest.raises(SystemExit, match="--base"):
        model_transfer.unpack(packed, tmp_path / "no_base")
    other = tmp_path / "other_base"
    shutil.copytree(tiny_encoder_dir, other)
    frozen = load_file(other / "model.safetensors")
    left_out = next(iter(manifest["from_base"]))
    frozen[left_out] = frozen[left_out] + 1
    save_file(frozen, other / "model.safetensors")
    with pytest.raises(SystemExit, match="not the one"):  # another base: the left-out tensors would be wrong
        model_transfer.unpack(packed, tmp_path / "wrong_base", base=other)
    assert not (tmp_path / "wrong_base").exists() and not (tmp_path / "wrong_base.partial").exists()
    model_transfer.unpack(packed, tmp_path / "model", base=tiny_encoder_dir)
    back = load_file(tmp_path / "model" / "model.safetensors")
    base = load_file(tiny_encoder_dir / "model.safetensors")
    assert back.keys() == weights.keys()
    for name, tensor in weights.items():
        if name in changed:
            assert torch.allclose(back[name], tensor, rtol=2**-10, atol=1e-7)
        else:
            assert torch.equal(back[name], base[name])


def test_a_base_that_itself_came_through_fp16_matches_by_its_rounded_digest(tmp_path, tiny_encoder_dir):
    """sap trained on the GPU machine, carried back in fp16, then BioSyn from it there: the BioSyn package
    leaves out the layers it froze, and the base here holds them only as fp16 rounded them."""
    import shutil

    from safetensors.torch import save_file

    sap_there = tiny_encoder_dir
    biosyn = tmp_path / "biosyn"
    shutil.copytree(sap_there, biosyn)
    weights = load_file(biosyn / "model.safetensors")
    trained = sorted(name for name in weights if "encoder.layer.1." in name)
    for name in trained:
        weights[name] = weights[name] + 0.01
    save_file(weights, biosyn / "model.safetensors")
    model_transfer.pack(sap_there, tmp_path / "sap_packed", shard_mb=15, dtype="fp16")
    model_transfer.unpack(tmp_path / "sap_packed", tmp_path / "sap_here")  # fp16-rounded
    manifest = model_transfer.pack(biosyn, tmp_path / "packed", shard_mb=15, dtype="fp16", base=sap_there)
    assert all(set(d) == {"sha256", "sha256_fp16"} for d in manifest["from_base"].values())
    model_transfer.unpack(tmp_path / "packed", tmp_path / "model", base=tmp_path / "sap_here")
    back = load_file(tmp_path / "model" / "model.safetensors")
    sap_here = load_file(tmp_path / "sap_here" / "model.safetensors")
    for name in manifest["from_base"]:
        assert torch.equal(back[name], sap_here[name])
    # a manifest with exact digests only (as written before the rounded one existed) needs --unchecked-base
    manifest["from_base"] = {name: d["sha256"] for name, d in manifest["from_base"].items()}
    (tmp_path / "packed" / "transfer.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="not the one"):
        model_transfer.unpack(tmp_path / "packed", tmp_path / "strict", base=tmp_path / "sap_here")
    model_transfer.unpack(tmp_path / "packed", tmp_path / "unchecked", base=tmp_path / "sap_here", unchecked_base=True)


def test_a_model_trained_on_another_kind_of_machine_is_rechecked_here_once(tmp_path):
    here = "cuda" if torch.cuda.is_available() else "cpu"
    stage, calls = stages.Stages(tmp_path / "report.json"), []

    def compute() -> dict:
        calls.append(1)
        return {"watched_dense_acc1_here": 0.55, "hardware": "here"}

    for device, model in (("tpu", tmp_path / "carried"), (here, tmp_path / "local")):
        model.mkdir()
        (model / "train_metrics.json").write_text(json.dumps({"extra": {"hardware": {"device": device}}}))
    assert stages.recheck_carried(stage, tmp_path / "local", tmp_path / "local.json", compute) is None
    assert calls == [] and not (tmp_path / "local.json").exists()
    for _ in range(2):  # the second time the kept record answers
        assert stages.recheck_carried(stage, tmp_path / "carried", tmp_path / "carried.json", compute) == 0.55
    assert calls == [1] and "recheck_watched_acc1" in stage.seconds
    assert json.loads((tmp_path / "carried.json").read_text())["hardware"] == "here"


def test_the_grid_is_every_combination_in_the_order_written():
    grid = ncbi_biosyn.grid_arg("topk=20,40 lr=1e-5,2e-5")
    assert grid == [{"topk": 20, "lr": 1e-5}, {"topk": 20, "lr": 2e-5}, {"topk": 40, "lr": 1e-5},
                    {"topk": 40, "lr": 2e-5}]
    assert ncbi_biosyn.grid_arg("batch=16")[0] == {"batch_size": 16}
    for bad in ("depth=3", "lr=", "lr=fast", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            ncbi_biosyn.grid_arg(bad)


def test_the_best_dev_point_is_chosen_ties_to_the_first_listed_and_unrun_points_are_kept(tmp_path):
    grid = ncbi_biosyn.grid_arg("lr=1e-5,2e-5,5e-5")
    path, report = tmp_path / "grid.json", {"points": {}}

    def point(lr, acc):
        return {"params": {"lr": lr}, "dev_acc1": acc, **({} if acc is not None else {"not_run": "time"})}

    # finished out of order (parallel workers); the report keeps the grid's order
    for p in (point(5e-5, 0.80), point(2e-5, 0.82), point(1e-5, 0.82)):
        ncbi_biosyn.record_grid_point(report, p, grid, path, None)
    written = json.loads(path.read_text())
    assert list(written["points"]) == [ncbi_biosyn.grid_key(p) for p in grid]
    assert written["chosen"]["params"] == {"lr": 1e-5}  # a tie: the first listed
    assert ncbi_biosyn.grid_done(path, grid) and not ncbi_biosyn.grid_done(path, grid + [{"lr": 1e-4}])
    report = {"points": {}}
    ncbi_biosyn.record_grid_point(report, point(1e-5, None), grid, path, None)
    assert report["chosen"] is None and json.loads(path.read_text())["points"]["lr1e-05"]["not_run"] == "time"


def test_choosing_epochs_takes_the_best_dev_epoch_of_any_point_and_prefers_fewer_epochs():
    report = {"points": {
        "a": {"params": {"lr": 1e-5}, "dev_acc1": 0.75, "dev_acc1_before_epoch": [0.70, 0.78, 0.79]},  # after 1, 2, 3: .78 .79 .75
        "b": {"params": {"lr": 2e-5}, "dev_acc1": 0.79, "dev_acc1_before_epoch": [0.70, 0.79, 0.76]},  # .79 .76 .79
        "c": {"params": {"lr": 5e-5}, "dev_acc1": None, "not_run": "time"},
    }}
    chosen = ncbi_biosyn.chosen_with_epochs(report)
    assert (chosen["key"], chosen["epochs"], chosen["dev_acc1"]) == ("b", 1, 0.79)  # .79 three times: fewest epochs
    with pytest.raises(SystemExit):
        ncbi_biosyn.chosen_with_epochs({"points": {"c": report["points"]["c"]}})
