"""Median latency of eager, device-graph capture, Inductor and autocast on a CUDA GPU.

Run on a machine with a CUDA GPU: ``python benchmarks/investigations/bench_device_graph.py`` (or
``python -m benchmarks.investigations.bench_device_graph``). Prints, per model, each candidate's
build time,
median latency per call and its spread (measured by ``candidates.measure``, like every other
benchmark: blocks of calls after one untimed call, device synchronised, candidates
interleaved over trials), speed-up over eager, and whether its outputs match eager (default
tolerances; the backend's own for opt-in ones). fp32 with TF32 off, as in DESIGN.md's H200
table.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tunetree.backends import Autocast, Backend, DeviceGraph, Eager, Inductor
from tunetree.candidates.measure import MeasureConfig, measure
from tunetree.signature.compare import Tolerances, compare_all
from tunetree.signature.graph import Graph, Sample

from .. import common


def mlp(device: torch.device) -> tuple[nn.Module, Sample]:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    module = nn.Sequential(*layers[:-1]).eval().to(device)
    return module, Sample((torch.randn(32, 1024, device=device),))


def encoder(device: torch.device) -> tuple[nn.Module, Sample]:
    layer = nn.TransformerEncoderLayer(256, 8, dim_feedforward=1024, batch_first=True)
    module = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).eval().to(device)
    return module, Sample((torch.randn(8, 128, 256, device=device),))


def bert(device: torch.device) -> tuple[nn.Module, Sample]:
    import transformers

    config = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=256,
    )
    module = transformers.BertModel(config).eval().to(device)
    ids = torch.randint(0, 1000, (8, 128), device=device)
    mask = torch.ones(8, 128, dtype=torch.int64, device=device)
    return module, Sample((), {"input_ids": ids, "attention_mask": mask})


MODELS: dict[str, Callable[[torch.device], tuple[nn.Module, Sample]]] = {
    "MLP 4x1024 b32": mlp,
    "encoder 4L d256 8x128": encoder,
    "BERT 4L h256 8x128": bert,
}


def candidates(with_compiled_graph: bool) -> list[Backend]:
    out: list[Backend] = [
        Eager(),
        DeviceGraph(),
        DeviceGraph(clone_outputs=False),
        Inductor(),
        Inductor(mode="reduce-overhead"),
        Autocast(),
    ]
    if with_compiled_graph:
        out.insert(3, DeviceGraph(compile=True, compile_mode=None))
    return out


def bench(name: str, device: torch.device, config: MeasureConfig, compiled_graph: bool) -> None:
    torch.manual_seed(0)
    module, sample = MODELS[name](device)
    with torch.no_grad():
        reference = module(*sample.args, **sample.kwargs)
    graph = Graph(key=sample.key, samples=[sample], outputs=[reference])
    runners: dict[str, Callable[[], Any]] = {}
    rows: dict[str, list[Any]] = {}
    for backend in candidates(compiled_graph):
        t0 = time.perf_counter()
        try:
            runner = backend.build(module, graph, device)
            with torch.no_grad():
                out = runner(*sample.args, **sample.kwargs)
                out = runner(*sample.args, **sample.kwargs)
            torch.cuda.synchronize()
        except Exception as exc:
            rows[backend.name] = [f"failed: {type(exc).__name__}: {str(exc)[:80]}"]
            continue
        build_s = time.perf_counter() - t0
        match = compare_all([reference], [out], backend.tolerances() or Tolerances())
        strict = compare_all([reference], [out], Tolerances())
        rows[backend.name] = [build_s, match, strict.max_abs_diff]
        runners[backend.name] = lambda r=runner: r(*sample.args, **sample.kwargs)
    # One interleaved measurement of every candidate (measure runs them under no_grad).
    timings = measure(runners, device, config)
    eager_s = timings["eager"].median_s
    print(f"\n== {name} ({config.trials} trials, ms per call, median ±half the IQR)")
    print(f"{'candidate':48} {'build s':>8} {'median':>8} {'spread':>7} {'vs eager':>8}  check")
    for n, row in rows.items():
        if n not in timings:
            print(f"{n:48} {row[0]}")
            continue
        timing = timings[n]
        build_s, match, diff = row
        check = "match" if match.ok else f"REJECTED {match.reason[:60]}"
        print(
            f"{n:48} {build_s:8.2f} {timing.median_s * 1e3:8.3f} {100 * timing.spread / 2:6.1f}% "
            f"{eager_s / timing.median_s:7.2f}x  {check} (max|diff| {diff:.2g})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=15, help="timed blocks per candidate")
    parser.add_argument("--block-ms", type=float, default=5.0, help="target length of a block")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument(
        "--compiled-graph", action="store_true", help="also DeviceGraph(compile=True)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU")
    common.cuda_setup("cuda")
    common.header(common.command_line())
    config = MeasureConfig(
        block_s=args.block_ms / 1e3,
        trials=args.trials,
        min_trials=min(3, args.trials),
        max_s_per_candidate=60.0,
    )
    for name in args.models:
        bench(name, torch.device("cuda"), config, args.compiled_graph)


if __name__ == "__main__":
    main()
