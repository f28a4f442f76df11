"""The whole-model stateful runner with OpenVINO's fused attention against the same graph split.

Run alone: ``python -m benchmarks.stateful_fusion_cpu`` (the 12-layer d768 Llama-style model of
:mod:`benchmarks.generate_cpu`, random weights; ``--model tiny`` to check the script). Three
approaches in one process, timed with the same cycled interleaving: eager (dynamic cache);
``tt``'s stateful runner as built (attention and its KV cache in the CPU plugin's stateful SDPA
kernel, RoPE fused); and the same converted model with the in-order row gathers in front of the
cache concatenations taken out again, which is what the plugin split into MatMul/Softmax
before (RoPE stays fused, the cache f32 in both). Greedy, ``--tokens`` new tokens, the unseen
prompts 1x37 and 4x61 (the second row left-padded). ms per new token is one whole
``generate`` call's median over the new tokens, prefill included; ratios are against eager.
Each approach's runtime-model attention and softmax layers are counted and printed.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import argparse
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from tunetree.generation import stateful
from tunetree.generation.stateful_runner import StatefulRunner

from .common.cycled import cycled_medians
from .generate_cpu import UNSEEN, config, equal_share, prompt


def _split(tuned: Any) -> Any:
    """The same model with its row gathers bypassed (the attention the plugin splits)."""
    runner = tuned.forward.runner
    model = runner.model.clone()
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Gather" and op.get_friendly_name().endswith("/rows"):
            op.output(0).replace(op.input_value(0))
    model.validate_nodes_and_infer_types()
    split = StatefulRunner(model, runner.shape, runner.config)
    forward = tuned.forward
    return stateful.attach(tuned, split, forward.output_type, forward.max_length)


def _call(model: Any, inputs: dict, gen: dict) -> Callable[[], object]:
    return lambda: model.generate(**inputs, **gen)


def _layers(tuned: Any) -> str:
    ops = tuned.forward.runner.compiled.get_runtime_model().get_ordered_ops()
    types = Counter(str(op.get_rt_info()["layerType"].astype(str)) for op in ops)
    return ", ".join(f"{k} {types[k]}" for k in ("ScaledDotProductAttention", "Softmax", "RoPE"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama-134m")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("load average before:", os.getloadavg(), flush=True)
    import transformers

    torch.manual_seed(0)
    cfg = config(args.model)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    n = args.tokens
    gen = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    fused = stateful.stateful_model(model)
    approaches = {"eager": model, "stateful, fused SDPA": fused, "stateful, split": _split(fused)}
    for name in ("stateful, fused SDPA", "stateful, split"):
        print(f"{name}: runtime layers {_layers(approaches[name])}", flush=True)
    print(f"{'approach':22} {'prompt':6} {'ms/token':>9} {'vs eager':>8} tokens")
    for i, (label, shape) in enumerate(UNSEEN.items()):
        inputs = prompt(cfg.vocab_size, *shape, seed=i)
        with torch.no_grad():
            expected = model.generate(**inputs, **gen)
            calls = {a: _call(m, inputs, gen) for a, m in approaches.items()}
            tokens: dict[str, Any] = {a: call() for a, call in calls.items()}
            seconds = cycled_medians(calls, args.rounds)
        for a in approaches:
            share = equal_share(tokens[a].tolist(), expected)
            print(
                f"{a:22} {label:6} {1000 * seconds[a] / n:9.2f} "
                f"{seconds['eager'] / seconds[a]:7.2f}x {share:.0%}",
                flush=True,
            )
    print("load average after:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
