"""What compiling the decode step gives on the CPU: a mark for a compiled CPU candidate (issue 28).

Run: ``python -m benchmarks.investigations.cpu_static_compile --model llama-0.1b --batches 1,4``
(alone on
the machine).

tunetree leaves the 0.1B Llama's ``generate`` untuned on the 2-core CPU: ONNX Runtime and
OpenVINO lose to eager on its decode step, and Inductor is not tried on calls that take a
cache. Before building a compiled candidate for static-cache decode steps, this measures what
one would gain at best: the model's whole forward compiled by ``torch.compile(dynamic=False)``
(the prompt's shapes compiled in the warm-up, so no compile is timed), on a static cache,
against eager on its default dynamic cache and on a static cache. Also HF's own recipe
(``cache_implementation="static"`` with its compile left on). Each round runs every approach
once on the same prompt, in an order where each follows every other equally often; medians of
the rounds, in ms per new token; tokens compared with eager's.
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
import time
from collections.abc import Callable
from typing import Any

import torch

from .. import common
from ..common.generate_models import configs
from ..common.interleave import rotations

APPROACHES = ("eager", "eager static", "hf static", "compiled static", "compiled frozen static")


def _generate(model: Any, ids: torch.Tensor, tokens: int, **extra: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            pad_token_id=0,
            **extra,
        )


def _approaches(model: Any, tokens: int) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    eager_forward = model.forward
    compiled = torch.compile(model.forward, dynamic=False)
    # Freezing folds the weights in as constants, so Inductor's CPU lowering prepacks the
    # linear layers' weights for oneDNN (what investigations.packed_linear measures layer by
    # layer).
    frozen = torch.compile(model.forward, dynamic=False, options={"freezing": True})
    no_compile = {"cache_implementation": "static", "disable_compile": True}

    def with_forward(forward: Any, ids: torch.Tensor, **extra: Any) -> torch.Tensor:
        model.forward = forward
        try:
            return _generate(model, ids, tokens, **extra)
        finally:
            model.forward = eager_forward

    return {
        "eager": lambda ids: _generate(model, ids, tokens),
        "eager static": lambda ids: _generate(model, ids, tokens, **no_compile),
        "hf static": lambda ids: _generate(model, ids, tokens, cache_implementation="static"),
        "compiled static": lambda ids: with_forward(compiled, ids, **no_compile),
        "compiled frozen static": lambda ids: with_forward(frozen, ids, **no_compile),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="llama-0.1b")
    p.add_argument("--batches", default="1,4")
    p.add_argument("--prompt", type=int, default=33, help="prompt length")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per generate call")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    common.header(common.command_line())
    torch.manual_seed(0)
    model = configs("cpu", False)[args.model]().eval()
    run = _approaches(model, args.tokens)
    print("| batch | approach | ms per new token | spread (min-max) | vs eager | tokens equal | "
          "warm-up s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        ids = torch.randint(1, model.config.vocab_size, (batch, args.prompt))
        warm_s, outputs = {}, {}
        for name in APPROACHES:  # first calls: HF's and our compiles of this shape
            start = time.perf_counter()
            outputs[name] = run[name](ids)
            run[name](ids)
            warm_s[name] = time.perf_counter() - start
        per_token: dict[str, list[float]] = {name: [] for name in APPROACHES}
        for order in rotations(list(APPROACHES), args.rounds):
            for name in order:
                start = time.perf_counter()
                run[name](ids)
                per_token[name].append((time.perf_counter() - start) / args.tokens * 1e3)
        eager = statistics.median(per_token["eager"])
        for name in APPROACHES:
            values = per_token[name]
            median = statistics.median(values)
            same = torch.equal(outputs[name], outputs["eager"])
            print(f"| {batch} | {name} | {median:.2f} | {min(values):.2f}-{max(values):.2f} | "
                  f"{eager / median:.2f}x | {same} | {warm_s[name]:.1f} |")  # fmt: skip
    print(f"load average after the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
