"""What checking a cached or loaded runner costs (issue 29): with and without the check.

Run: ``python -m benchmarks.investigations.cache_hit_check`` (``--rounds N``). Each model is tuned
once with
OpenVINO into a fresh cache; then ``tt.tune`` is run again on the same inspection, every graph
a hit, ``--rounds`` times with the hit's probe check (value probes and range ends, as a fresh
build is checked) and without it (the check switched off), the two interleaved in rotating
order; then the tuned model is saved and ``tt.load`` run the same way with and without its
runner check (each runner against eager on calls made from its key). Prints the median wall
time each way (min-max in brackets), the extra time and its ratio, beside one eager forward of
the model, and the load average.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import os
import statistics
import tempfile
import time
from typing import Any


def _model(name: str) -> tuple[Any, list[Any], int]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "mlp":
        layers: list[nn.Module] = []
        for _ in range(4):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        return nn.Sequential(*layers).eval(), [torch.randn(32, 1024) for _ in range(2)], 0
    layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).eval()
    return encoder, [torch.randn(8, 128, 256) for _ in range(2)], 1


def _hit_s(model: Any, data: list[Any], depth: int, info: Any, directory: str) -> float:
    import tunetree as tt

    cache = tt.TuningCache(directory)
    start = time.perf_counter()
    tt.tune(
        model,
        data,
        depth=depth,
        info=info,
        strategy=tt.OneBackendStrategy(tt.backends.OpenVINO()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=cache,
    ).undo()
    wall = time.perf_counter() - start
    assert cache.stats.hits >= 1 and cache.stats.misses == 0, cache.stats
    return wall


def _load_s(model: Any, path: str) -> float:
    import tunetree as tt

    start = time.perf_counter()
    tt.load(model, path)
    return time.perf_counter() - start


def measure(name: str, rounds: int) -> dict[str, Any]:
    import torch

    import tunetree as tt
    from tunetree.cache import reuse
    from tunetree.checkpoint import loading
    from tunetree.signature.inspection import inspect

    model, data, depth = _model(name)
    with tempfile.TemporaryDirectory() as directory:
        tt.tune(
            model,
            data,
            depth=depth,
            strategy=tt.OneBackendStrategy(tt.backends.OpenVINO()),
            measure_config=tt.MeasureConfig.quick(),
            verbose=False,
            cache=tt.TuningCache(directory),
        ).undo()
        info = inspect(model, data)
        checked = reuse._probe_failure
        times: dict[str, list[float]] = {"with probes": [], "samples only": []}
        for r in range(rounds):
            order = ["with probes", "samples only"][:: 1 if r % 2 == 0 else -1]
            for mode in order:
                reuse._probe_failure = checked if mode == "with probes" else lambda s, r: None  # type: ignore[assignment]
                try:
                    times[mode].append(_hit_s(model, data, depth, info, directory))
                finally:
                    reuse._probe_failure = checked
        path = f"{directory}/model.tt"
        tt.save(
            tt.tune(
                model,
                data,
                depth=depth,
                info=info,
                strategy=tt.OneBackendStrategy(tt.backends.OpenVINO()),
                measure_config=tt.MeasureConfig.quick(),
                verbose=False,
                cache=tt.TuningCache(directory),
            ),
            path,
        )
        real_check = loading.check_runner
        for r in range(rounds):
            order = ["load, checked", "load, unchecked"][:: 1 if r % 2 == 0 else -1]
            for mode in order:
                fresh, _, _ = _model(name)
                loading.check_runner = real_check if mode == "load, checked" else lambda *a: None  # type: ignore[assignment]
                try:
                    times.setdefault(mode, []).append(_load_s(fresh, path))
                finally:
                    loading.check_runner = real_check
    with torch.no_grad():
        model(data[0])
        start = time.perf_counter()
        for _ in range(5):
            model(data[0])
        eager = (time.perf_counter() - start) / 5
    medians = {mode: statistics.median(ts) for mode, ts in times.items()}
    spread = {mode: (min(ts), max(ts)) for mode, ts in times.items()}
    return {
        "model": name,
        "graphs": len(info.cut(depth)),
        "medians": medians,
        "spread": spread,
        "eager_s": eager,
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _cell(row: dict[str, Any], mode: str) -> str:
    low, high = row["spread"][mode]
    return f"{_ms(row['medians'][mode])} ({low * 1e3:.0f}-{high * 1e3:.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", nargs="+", default=["mlp", "encoder"])
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    header = ["model", "graphs", "what", "unchecked", "checked", "extra", "ratio", "eager forward"]
    print("| " + " | ".join(header) + " |")
    print("|---" * len(header) + "|")
    for name in args.models:
        row = measure(name, args.rounds)
        for what, plain_mode, checked_mode in (
            ("cache hit (probes)", "samples only", "with probes"),
            ("tt.load (runner check)", "load, unchecked", "load, checked"),
        ):
            plain, checked = row["medians"][plain_mode], row["medians"][checked_mode]
            cells = [
                name,
                str(row["graphs"]),
                what,
                _cell(row, plain_mode),
                _cell(row, checked_mode),
                f"{(checked - plain) * 1e3:+.1f} ms",
                f"{checked / plain:.2f}x",
                _ms(row["eager_s"]),
            ]
            print("| " + " | ".join(cells) + " |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
