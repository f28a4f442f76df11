"""Does tunetree's stateful graph decode as fast as optimum-intel's at one KV-cache precision?

Run alone: ``python -m benchmarks.investigations.optimum_step_parity`` (the 134M Llama-style
model of :mod:`benchmarks.generate_cpu`, random weights). optimum-intel exports the saved model
in its own environment (``OVModelForCausalLM.from_pretrained(dir, export=True)``, saved as IR);
tunetree's stateful export of the same weights is made here. Both IRs are compiled here with the
same OpenVINO and the same properties (f32 compute, latency hint), once with the KV cache in f32
and once in f16, and timed on bare infer requests with no ``generate`` around them: a prefill of
37 tokens, then ``--steps`` single-token decode steps, median step time per approach over
``--rounds`` cycled rounds (:mod:`benchmarks.common.cycled` order). Prints the table and ratios.
"""

from __future__ import annotations

if not __package__:  # run by path: import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
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


def _feed(ids: np.ndarray, total: int, beam: bool) -> dict[str, np.ndarray]:
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
    request.infer(_feed(prompt, 37, beam))
    for step in range(steps):
        start = time.perf_counter()
        request.infer(_feed(np.array([[5]]), 38 + step, beam))
        times.append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--optimum-venv", type=Path, default=OPTIMUM_VENV)
    args = parser.parse_args()
    print("load average before:", os.getloadavg(), flush=True)
    import openvino
    import torch
    import transformers

    from tunetree.generation.stateful import export_whole

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config("llama-134m")).eval()
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
    for cache in ("f32", "f16"):
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
    for cache in ("f32", "f16"):
        ratio = (
            medians[f"tunetree graph, cache {cache}"]
            / medians[f"optimum-intel graph, cache {cache}"]
        )
        print(f"cache {cache}: tunetree / optimum-intel = {ratio:.3f}")
    print("load average after:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
