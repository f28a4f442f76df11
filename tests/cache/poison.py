"""Poisoning a tuning cache the way an attacker with write access would (issue 29).

A runner artifact's weights are changed only in directions the recorded samples cannot see
(a rank-one update in the null space of the inputs the graph was recorded with), the file is
stored again under its new SHA-256, and the entry's manifest points at it with its checksum
line resealed: ``tunetree cache verify`` passes, and a check on the recorded samples alone
sees outputs equal to eager's.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tunetree.cache.store import CacheStore


def null_direction(rows: torch.Tensor) -> torch.Tensor:
    """A unit vector orthogonal to every row of ``rows`` (the inputs a layer was shown)."""
    flat = rows.reshape(-1, rows.shape[-1]).double()
    _, _, vh = torch.linalg.svd(flat, full_matrices=True)
    rank = int(torch.linalg.matrix_rank(flat))
    assert rank < flat.shape[-1], "the recorded inputs span every direction"
    return vh[rank].float()


def rank_one(weight: torch.Tensor, seen: torch.Tensor, scale: float = 3.0) -> torch.Tensor:
    """``weight`` (out x in) plus ``u v^T``, ``v`` orthogonal to every input in ``seen``."""
    v = null_direction(seen)
    u = torch.linspace(1.0, -1.0, weight.shape[0]) * scale
    poisoned = weight + torch.outer(u, v)
    unseen_change = seen.reshape(-1, weight.shape[1]) @ (poisoned - weight).T
    assert float(unseen_change.abs().max()) < 1e-5
    return poisoned


def manifest_body(store: CacheStore, key: str) -> dict[str, Any]:
    return json.loads((store.entries / key / "manifest.json").read_bytes().partition(b"\n")[2])


def reseal(store: CacheStore, key: str, body: dict[str, Any]) -> None:
    """Write the entry's manifest with its checksum line recomputed."""
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    path = store.entries / key / "manifest.json"
    path.write_bytes(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)


def replace_artifacts(
    store: CacheStore, key: str, rewrite: Callable[[dict[str, Path], Path], dict[str, Path]]
) -> None:
    """Give the entry's winner new artifact files, stored under their new SHA-256.

    ``rewrite(files, scratch)`` gets the winner's files by name and returns the new ones.
    """
    body = manifest_body(store, key)
    winner = body["candidates"][body["winner"]]
    files = {f["path"]: store.artifact_path(f["sha256"]) for f in winner["artifact"]["files"]}
    scratch = store.root / "attacker"
    scratch.mkdir(exist_ok=True)
    new = rewrite(files, scratch)
    records = []
    for name in sorted(new):
        data = new[name].read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        target = store.artifact_path(sha)
        target.parent.mkdir(exist_ok=True)
        if target.exists():
            os.chmod(target, 0o644)
        target.write_bytes(data)
        records.append({"path": name, "sha256": sha, "size": len(data)})
    winner["artifact"]["files"] = records
    reseal(store, key, body)


def poison_openvino(store: CacheStore, key: str, seen: torch.Tensor, shape: list[int]) -> None:
    """Rank-one update of the OpenVINO constant of ``shape`` (a Linear's weight)."""
    import openvino

    def rewrite(files: dict[str, Path], scratch: Path) -> dict[str, Path]:
        core = openvino.Core()
        model = core.read_model(str(files["model.xml"]), str(files["model.bin"]))
        (constant,) = [
            op
            for op in model.get_ops()
            if op.get_type_name() == "Constant"
            and list(op.get_output_partial_shape(0).to_shape()) == shape
        ]
        weight = torch.from_numpy(constant.get_data().copy())
        poisoned = rank_one(weight, seen).numpy()
        constant.output(0).replace(openvino.op.Constant(poisoned).output(0))
        openvino.save_model(model, str(scratch / "model.xml"), compress_to_fp16=False)
        return {"model.xml": scratch / "model.xml", "model.bin": scratch / "model.bin"}

    replace_artifacts(store, key, rewrite)


def poison_safetensors(store: CacheStore, key: str, name: str, seen: torch.Tensor) -> None:
    """Rank-one update of tensor ``name`` in a test backend's ``weights.safetensors``."""
    from safetensors.torch import load_file, save_file

    def rewrite(files: dict[str, Path], scratch: Path) -> dict[str, Path]:
        weights = load_file(str(files["weights.safetensors"]))
        weights[name] = rank_one(weights[name], seen)
        save_file(weights, str(scratch / "weights.safetensors"))
        return {**files, "weights.safetensors": scratch / "weights.safetensors"}

    replace_artifacts(store, key, rewrite)
