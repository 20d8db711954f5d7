"""Move a trained model folder through a channel with small file-size limits (the lent GPU machine's).

    python scripts/model_transfer.py pack models/NAME DIR [--shard-mb 15] [--dtype fp16] [--base FOLDER]
    python scripts/model_transfer.py unpack DIR models/NAME [--base FOLDER]

`pack` writes the folder's float weights as `--dtype` safetensors shards of at most `--shard-mb` MiB,
every other file into `files.tar`, and `transfer.json` (the tensors' original dtypes, each original
file's sha256). `unpack` rebuilds the folder with the weights cast back to their original dtypes, into
a fresh folder (never over an existing one). fp16 keeps 11 significant bits: the round trip changes a
weight by at most 2^-11 of its size, which the caller should check by scoring the unpacked model
(ncbi_biosyn.py records the watched Acc@1 on both machines). Nothing here unpickles anything.

`--base FOLDER` (a model both machines hold, e.g. the e5-small the run started from) leaves out every
tensor equal to the base's, bit for bit: a run that froze e5-small's 96M-weight token embeddings sends
its 21M trained weights only, and unpack takes the frozen ones from the base exactly (fp32, checked
against the sha256 of their bytes recorded at pack time). A base that itself came through `pack` holds its
weights rounded to `--dtype`: it matches the digest of the rounded bytes, also recorded, and gives what a
transfer in that dtype would have given. `--unchecked-base` takes a base's tensors without either check
(manifests written before the rounded digest existed), and says how many it took so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from linker.dictionary import sha256_file

WEIGHTS = "model.safetensors"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def tensor_sha256(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def cast(tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    return tensor.to(DTYPES[dtype]) if tensor.is_floating_point() else tensor


def weights(folder: Path) -> dict[str, torch.Tensor]:
    if not (folder / WEIGHTS).is_file():
        raise SystemExit(f"{folder}: no {WEIGHTS} (expected a sentence-transformers model folder)")
    return load_file(folder / WEIGHTS)


def pack(folder: Path, out: Path, *, shard_mb: float, dtype: str, base: Path | None = None) -> dict:
    tensors = weights(folder)
    out.mkdir(parents=True, exist_ok=True)
    original_dtypes = {k: str(v.dtype).removeprefix("torch.") for k, v in tensors.items()}
    from_base = {}  # name -> sha256 of the tensor's bytes and of their --dtype rounding: equal to the base's, not sent
    if base is not None:
        for name, tensor in weights(base).items():
            if name in tensors and tensors[name].dtype == tensor.dtype and torch.equal(tensors[name], tensor):
                kept = tensors.pop(name)
                from_base[name] = {"sha256": tensor_sha256(kept), f"sha256_{dtype}": tensor_sha256(cast(kept, dtype))}
    # Shards filled in turn; a tensor that does not fit the rest of a shard is split into row blocks
    # (joined again by unpack), so every shard but the last is full and the count is the least possible.
    limit, shards, size, parts = int(shard_mb * 2**20), [{}], 0, {}
    for name in sorted(tensors):
        tensor = tensors[name]
        rest = cast(tensor, dtype)
        row_bytes = max(1, math.prod(rest.shape[1:]) * rest.element_size())  # a 0-d tensor is one "row"
        if row_bytes > limit:
            raise SystemExit(f"{name}: one row is {row_bytes} bytes, more than --shard-mb {shard_mb}")
        placed = []  # (shard index, piece)
        while rest is not None:
            fits = (limit - size) // row_bytes
            if fits == 0:  # this shard is full: start the next
                shards.append({})
                size = 0
                continue
            whole = rest.dim() == 0 or rest.shape[0] <= fits
            piece, rest = (rest, None) if whole else (rest[:fits], rest[fits:])
            placed.append((len(shards) - 1, piece))
            size += piece.numel() * piece.element_size()
        keys = [name] if len(placed) == 1 else [f"{name}#{i}" for i in range(len(placed))]
        if len(placed) > 1:
            parts[name] = keys
        for key, (shard, piece) in zip(keys, placed):
            shards[shard][key] = piece.contiguous()
    names = [f"weights-{i + 1:02d}-of-{len(shards):02d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        save_file(shard, out / name)
    others = sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != WEIGHTS)
    with tarfile.open(out / "files.tar", "w") as tar:
        for path in others:
            tar.add(path, arcname=path.relative_to(folder).as_posix())
    manifest = {"folder": folder.name, "dtype": dtype, "shards": names, "split": parts,
                "original_dtypes": original_dtypes, "from_base": from_base,
                "sha256": {p.relative_to(folder).as_posix(): sha256_file(p) for p in [folder / WEIGHTS, *others]}}
    (out / "transfer.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def unpack(packed: Path, folder: Path, *, base: Path | None = None, unchecked_base: bool = False) -> dict:
    manifest = json.loads((packed / "transfer.json").read_text())
    if folder.exists():
        raise SystemExit(f"{folder}: exists; unpack into a new folder")
    from_base = manifest.get("from_base", {})
    if from_base and base is None:
        raise SystemExit(f"{packed}: {len(from_base)} tensors were left out as equal to a base model; "
                         "give that model with --base")
    tensors = {}
    if from_base:
        base_tensors, unchecked = weights(base), 0
        for name, digests in from_base.items():
            if name not in base_tensors:
                raise SystemExit(f"{base}: no tensor {name}; the packing machine's base had one")
            tensor = base_tensors[name]
            digests = digests if isinstance(digests, dict) else {"sha256": digests}  # older manifests: exact only
            rounded = digests.get(f"sha256_{manifest['dtype']}")
            matches = tensor_sha256(tensor) == digests["sha256"] or (  # or the base itself came through pack
                rounded is not None and tensor_sha256(cast(tensor, manifest["dtype"])) == rounded)
            if not matches and not (unchecked_base and rounded is None):
                raise SystemExit(f"{base}: tensor {name} is not the one the packing machine's base held")
            unchecked += not matches
            tensors[name] = tensor
        if unchecked:
            print(f"{base}: {unchecked} tensors taken without a digest match (--unchecked-base)", file=sys.stderr)
    partial = folder.with_name(folder.name + ".partial")
    partial.mkdir(parents=True)
    with tarfile.open(packed / "files.tar") as tar:
        tar.extractall(partial, filter="data")  # the "data" filter refuses absolute paths, links out and devices
    for shard in manifest["shards"]:
        tensors.update(load_file(packed / shard))
    for name, keys in manifest["split"].items():
        tensors[name] = torch.cat([tensors.pop(key) for key in keys])
    for name, dtype in manifest["original_dtypes"].items():
        if name not in from_base:
            tensors[name] = tensors[name].to(getattr(torch, dtype))
    save_file(tensors, partial / WEIGHTS)
    partial.rename(folder)
    changed = sorted(p for p, digest in manifest["sha256"].items() if p != WEIGHTS and sha256_file(folder / p) != digest)
    if changed:
        raise SystemExit(f"{folder}: files differ from the packed ones: {', '.join(changed)}")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("folder", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--shard-mb", type=float, default=15.0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    p.add_argument("--base", type=Path, default=None, help="leave out the tensors equal to this model's")
    u = sub.add_parser("unpack")
    u.add_argument("packed", type=Path)
    u.add_argument("folder", type=Path)
    u.add_argument("--base", type=Path, default=None, help="the model pack's --base named")
    u.add_argument("--unchecked-base", action="store_true",
                   help="take the base's tensors unchecked where the manifest has no rounded digest")
    args = parser.parse_args()
    if args.command == "pack":
        manifest = pack(args.folder, args.out, shard_mb=args.shard_mb, dtype=args.dtype, base=args.base)
        print(f"{args.folder} -> {args.out}: {len(manifest['shards'])} {args.dtype} shards + files.tar"
              + (f", {len(manifest['from_base'])} tensors left to the base" if args.base else ""))
    else:
        unpack(args.packed, args.folder, base=args.base, unchecked_base=args.unchecked_base)
        print(f"{args.packed} -> {args.folder}")


if __name__ == "__main__":
    sys.exit(main())
