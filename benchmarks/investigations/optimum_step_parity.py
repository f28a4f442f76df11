"""Does tunetree's stateful graph decode as fast as optimum-intel's at one KV-cache precision?

Run alone: ``python -m benchmarks.investigations.optimum_step_parity`` (the 134M Llama-style
model of :mod:`benchmarks.generate_cpu`, random weights). optimum-intel exports the saved model
in its own environment (``OVModelForCausalLM.from_pretrained(dir, export=True)``, saved as IR);
tunetree's stateful export of the same weights is made here. Both IRs are compiled here with the
same OpenVINO and the same properties (f32 compute, latency hint), once with the KV cache in f32
and once in f16, and timed on bare infer requests with no ``generate`` around them: a prefill of
37 tokens, then ``--steps`` single-token decode steps, median step time per approach over
``--rounds`` cycled rounds (:mod:`benchmarks.common.cycled` order). Prints the table and ratios.
``--profile`` then compiles both with OpenVINO's per-node counters (``PERF_COUNT``, f32 cache)
and prints, per executed node type, the summed time of the median decode step of each graph
and how many nodes ran: where one graph's step spends what the other's does not.

``--variants`` adds tunetree graphs exported another way, timed in the same cycle (f32 cache):
``reshapes-kept`` (the reshapes to a tensor's own shape left in, as before
:func:`tunetree.generation.stateful_export.drop_identity_reshapes`) and ``no-zeroing`` (the
attention's zeroing of rows a mask hides entirely left out: not eager's results on padded
prompts, timed only to price that guarantee). ``--model qwen2-0.5b`` times the larger model.
"""

from __future__ import annotations

if not __package__:  # run by path: import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..common.cycled import cycled_medians
from ..generate_cpu import OPTIMUM_VENV, config, ensure_venv

EXPORT = (
    "import sys; from optimum.intel import OVModelForCausalLM; "
    "OVModelForCausalLM.from_pretrained(sys.argv[1], export=True, compile=False)"
    ".save_pretrained(sys.argv[2])"
)


WHO = ("tunetree", "optimum-intel")


def feed(ids: np.ndarray, total: int, beam: bool) -> dict[str, np.ndarray]:
    batch, length = ids.shape
    feed = {
        "input_ids": ids,
        "attention_mask": np.ones((batch, total), np.int64),
        "position_ids": np.arange(total - length, total, dtype=np.int64)[None].repeat(batch, 0),
    }
    if beam:
        feed["beam_idx"] = np.arange(batch, dtype=np.int32)
    else:  # tunetree's graph: the positions whose logits are kept (generate keeps the last)
        feed["logit_positions"] = np.array([length - 1], dtype=np.int64)
    return feed


def _decode(compiled: Any, beam: bool, steps: int, times: list[float]) -> None:
    request = compiled.create_infer_request()
    request.reset_state()
    prompt = np.random.default_rng(0).integers(3, 32000, (1, 37))
    request.infer(feed(prompt, 37, beam))
    for step in range(steps):
        start = time.perf_counter()
        request.infer(feed(np.array([[5]]), 38 + step, beam))
        times.append(time.perf_counter() - start)


@contextlib.contextmanager
def _variant(name: str) -> Any:
    """Export tunetree's graph as ``name`` says (see the module's docstring)."""
    from unittest import mock

    import torch

    from tunetree.generation import stateful_export

    if name == "reshapes-kept":
        with mock.patch.object(stateful_export, "drop_identity_reshapes", lambda exported: 0):
            yield
    elif name == "no-zeroing":  # the export module's torch, with a where that keeps ``out``

        class _Torch:
            def __getattr__(self, attr: str) -> Any:
                return getattr(torch, attr)

            @staticmethod
            def where(condition: Any, out: Any, other: Any) -> Any:
                return out

        with mock.patch.object(stateful_export, "torch", _Torch()):
            yield
    else:
        raise SystemExit(f"unknown variant {name!r}")


def _profile(compiled: Any, beam: bool, steps: int) -> dict[str, tuple[float, int]]:
    """Per executed node type: ms and node count of the decode step of median total time."""
    request = compiled.create_infer_request()
    request.reset_state()
    request.infer(feed(np.random.default_rng(0).integers(3, 32000, (1, 37)), 37, beam))
    found = []
    for step in range(steps):
        request.infer(feed(np.array([[5]]), 38 + step, beam))
        per_type: dict[str, tuple[float, int]] = {}
        for info in request.profiling_info:
            if info.status.name != "EXECUTED":
                continue
            ms, count = per_type.get(info.exec_type, (0.0, 0))
            per_type[info.exec_type] = (ms + info.real_time.total_seconds() * 1e3, count + 1)
        found.append(per_type)
    found.sort(key=lambda p: sum(ms for ms, _ in p.values()))
    return found[len(found) // 2]


def _print_profiles(profiles: dict[str, dict[str, tuple[float, int]]]) -> None:
    kinds = sorted(
        {k for p in profiles.values() for k in p},
        key=lambda k: -max(p.get(k, (0.0, 0))[0] for p in profiles.values()),
    )
    who = list(profiles)
    print("per executed node type, the median decode step (PERF_COUNT, f32 cache): ms (nodes)")
    print(f"{'exec type':40s}" + "".join(f"{w:>22s}" for w in who))
    for kind in kinds:
        cells = "".join(
            f"{profiles[w].get(kind, (0.0, 0))[0]:14.3f} ({profiles[w].get(kind, (0.0, 0))[1]:4d})"
            for w in who
        )
        print(f"{kind[:40]:40s}{cells}")
    totals = "".join(f"{sum(ms for ms, _ in profiles[w].values()):22.3f}" for w in who)
    print(f"{'total':40s}{totals}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--optimum-venv", type=Path, default=OPTIMUM_VENV)
    parser.add_argument("--profile", action="store_true", help="per node type, both graphs")
    parser.add_argument("--model", default="llama-134m", help="llama-134m or qwen2-0.5b")
    parser.add_argument("--caches", default="f32,f16", help="KV-cache precisions to time")
    parser.add_argument("--variants", default="", help="reshapes-kept,no-zeroing (f32 cache)")
    args = parser.parse_args()
    print("load average before:", os.getloadavg(), flush=True)
    import openvino
    import torch
    import transformers

    from tunetree.generation.stateful import export_whole

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config(args.model)).eval()
    work = Path(tempfile.mkdtemp(prefix="tunetree-step-parity-"))
    model.save_pretrained(work / "model")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    python = ensure_venv(args.optimum_venv)
    subprocess.run(
        [str(python), "-c", EXPORT, str(work / "model"), str(work / "optimum")], env=env, check=True
    )
    core = openvino.Core()
    ours = export_whole(model).model
    theirs = core.read_model(work / "optimum" / "openvino_model.xml")
    base = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    approaches: dict[str, tuple[Any, bool]] = {}
    caches = [c for c in args.caches.split(",") if c]
    for variant in [v for v in args.variants.split(",") if v]:
        with _variant(variant):
            graph = export_whole(model).model
        approaches[f"tunetree graph, {variant}"] = (
            core.compile_model(graph, "CPU", {**base, "KV_CACHE_PRECISION": "f32"}),
            False,
        )
    for cache in caches:
        properties = {**base, "KV_CACHE_PRECISION": cache}
        approaches[f"tunetree graph, cache {cache}"] = (
            core.compile_model(ours, "CPU", properties),
            False,
        )
        approaches[f"optimum-intel graph, cache {cache}"] = (
            core.compile_model(theirs, "CPU", properties),
            True,
        )
    steps: dict[str, list[float]] = {name: [] for name in approaches}

    def decoding(name: str) -> Any:
        compiled, beam = approaches[name]
        return lambda: _decode(compiled, beam, args.steps, steps[name])

    cycled_medians({name: decoding(name) for name in approaches}, args.rounds)
    medians = {name: statistics.median(t[args.steps :]) * 1e3 for name, t in steps.items()}
    print(f"ms per decode step (median of {args.rounds} rounds x {args.steps} steps, warm-up out)")
    for name, ms in medians.items():
        print(f"{name:34s} {ms:7.2f}")
    for name, ms in medians.items():
        if name.startswith("tunetree graph, ") and "cache" not in name:
            theirs = medians["optimum-intel graph, cache f32"]
            print(f"{name}: {ms / theirs:.3f} of optimum-intel's (f32 cache)")
    for cache in caches:
        ratio = (
            medians[f"tunetree graph, cache {cache}"]
            / medians[f"optimum-intel graph, cache {cache}"]
        )
        print(f"cache {cache}: tunetree / optimum-intel = {ratio:.3f}")
    if args.profile:
        properties = {**base, "KV_CACHE_PRECISION": "f32", "PERF_COUNT": True}
        graphs = {"tunetree": (ours, False), "optimum-intel": (theirs, True)}
        profiles = {
            who: _profile(core.compile_model(graph, "CPU", properties), beam, args.steps)
            for who, (graph, beam) in graphs.items()
        }
        _print_profiles(profiles)
    print("load average after:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
