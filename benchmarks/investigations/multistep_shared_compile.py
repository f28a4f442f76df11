"""One compiled decode step shared by a config's loops of several batch sizes, on a GPU.

Run alone on a GPU: ``python -m benchmarks.investigations.multistep_shared_compile --batches 8,9
--tokens 128``. One :class:`MultiStepGenerate` of the Inductor config builds a loop per batch
size in the order given; per loop it prints the build time (compile and capture), how many
graphs Dynamo compiled during it, and whether the tokens equal eager's (dynamic cache, the
usual call). Then ms per new token (``(T(N) - T(2)) / (N - 2)`` of whole calls, medians of
interleaved rounds) of that loop beside the eager-kernel loop (8 steps per replay) at each
batch, and their ratio. ``--json PATH`` writes the numbers after every stage.
"""

from __future__ import annotations

if not __package__:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import json
import statistics
import time
from typing import Any

import torch

from tunetree.generation.multistep_generate import MultiStepConfig, MultiStepGenerate

from .multistep_decode import _build, _prompt


def _log(message: str) -> None:
    print(time.strftime("%H:%M:%S", time.gmtime()), message, flush=True)


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _timed(fn: Any) -> tuple[Any, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--batches", default="8,9")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--length", type=int, default=49)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)

    model = _build(args.model, torch.bfloat16)
    vocab = model.config.vocab_size
    gen = dict(do_sample=False, pad_token_id=0)
    loops = {
        "inductor16": MultiStepGenerate(model, model.generate, MultiStepConfig(16, True)),
        "eager8": MultiStepGenerate(model, model.generate, MultiStepConfig(8)),
    }
    prompts = {b: _prompt(vocab, b, args.length, b) for b in batches}
    for label, loop in loops.items():
        for batch in batches:
            inputs = prompts[batch]
            with torch.no_grad():
                want = model.generate(**inputs, max_new_tokens=args.tokens, **gen)
            before = _graphs()
            got, took = _timed(lambda: loop(**inputs, max_new_tokens=args.tokens, **gen))  # noqa: B023
            row = {
                "build_s": round(took, 1),
                "graphs_compiled": _graphs() - before,
                "tokens_equal_eager": bool(torch.equal(got, want)),
                "served": loop.counts.served,
                "original": loop.counts.original,
            }
            result[f"{label}_b{batch}_build"] = row
            _log(f"{label} batch {batch}: {row}")
            save()
    for batch in batches:
        inputs = prompts[batch]
        times: dict[str, dict[int, list[float]]] = {k: {2: [], args.tokens: []} for k in loops}
        for _ in range(args.rounds):
            for label, loop in loops.items():
                for count in (2, args.tokens):
                    _, took = _timed(lambda: loop(**inputs, max_new_tokens=count, **gen))  # noqa: B023
                    times[label][count].append(took)
        ms = {
            label: 1e3
            * (statistics.median(t[args.tokens]) - statistics.median(t[2]))
            / (args.tokens - 2)
            for label, t in times.items()
        }
        row = {f"{k}_ms_per_token": round(v, 3) for k, v in ms.items()}
        row["inductor16_vs_eager8"] = round(ms["eager8"] / ms["inductor16"], 2)
        result[f"b{batch}_speed"] = row
        _log(f"batch {batch}: {row}")
        save()


if __name__ == "__main__":
    main()
