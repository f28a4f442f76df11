"""Helpers shared by the benchmark suites and investigations: the run header, output files,
thread settings, calling a model as its user does.

The package also holds the models the benchmarks build (:mod:`.models`,
:mod:`.generate_models`), the alternating timing of serving-like passes (:mod:`.interleave`),
the memory trace of a tune (:mod:`.memory_trace`) and ``to_markdown`` (results JSON as a
table); none of them is run on its own except ``python -m benchmarks.common.to_markdown``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch


def parser(description: str, default_models: list[str]) -> argparse.ArgumentParser:
    """Arguments every benchmark takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--models", default=",".join(default_models), help="comma-separated names")
    p.add_argument("--quick", action="store_true", help="tiny models, short measurements")
    p.add_argument("--out", type=Path, default=None, help="directory for JSON (and PNG) output")
    return p


def size_for(args: argparse.Namespace) -> str:
    return "quick" if args.quick else args.device


def header(command: str) -> dict[str, Any]:
    """What the run was measured on, printed first and stored with the results."""
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    print("# " + " | ".join(f"{k}: {v}" for k, v in info.items()))
    return info


ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""


def command_line() -> str:
    """The command that started this run, as ``python -m benchmarks...`` (however it was run)."""
    script = Path(sys.argv[0]).resolve()
    try:
        module = ".".join(script.relative_to(ROOT).with_suffix("").parts)
    except ValueError:
        module = "benchmarks." + script.stem
    return "python -m " + " ".join([module, *sys.argv[1:]])


def write_json(out: Path | None, name: str, payload: Any) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {path}")


def cuda_setup(device: str) -> None:
    """fp32 stays fp32 on CUDA: TF32 changes results, so it is off for every measurement."""
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def caller(model: Any) -> Any:
    """The model called as the user calls it (a pipeline's ``call`` aside), for ``measure``."""
    from tunetree.signature.graph import Sample
    from tunetree.signature.modules import run_model

    return lambda *a, **k: run_model(model, Sample(a, k), None)
