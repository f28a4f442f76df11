"""Why is tunetree's 8-bit-weight generate slower than optimum-intel's 8-bit weight-only model?

Run alone: ``python -m benchmarks.investigations.int8_weights_parity`` (the 134M Llama-style
model of :mod:`benchmarks.generate_cpu`, random weights; ``--model qwen2-0.5b``). optimum-intel
exports the saved model with ``OVWeightQuantizationConfig(bits=8)`` in its own environment
(saved as IR, not compiled); tunetree's stateful export of the same weights is made here and
compressed by :func:`tunetree.generation.weights.compress_int8`, in groups of
:data:`~tunetree.generation.weights.INT8_GROUP` inputs and per output channel, each with f32
scales and f16 ones (the budget's per-channel config: f16 scales, f32 compute, f16 cache).

First it prints what each graph compresses: per weight-reading op (``MatMul``, ``Gather``), the
weight's integer type, whether its scale is per channel or per group, the scale's and zero
point's types, and the bytes of weights and of scales and zero points. ``--inspect`` stops
there. Then it times bare infer requests (a prefill of 1x37 or 4x61, then ``--steps``
single-token steps; ms per new token over the prefill and the steps, median of ``--rounds``
cycled rounds, :mod:`benchmarks.common.cycled` order) of both graphs under several compile
settings (inference precision, KV-cache precision), and for tunetree's graph the teacher-forced
rel_l2 of each setting against fp32 eager on generate_cpu's unseen prompts (eager's greedy
tokens fed, the budget's metric).
"""

from __future__ import annotations

if not __package__:  # run by path: import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.investigations"

import argparse
import collections
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..common.cycled import cycled_medians
from ..generate_cpu import OPTIMUM_VENV, UNSEEN, config, ensure_venv, prompt
from .optimum_step_parity import feed

EXPORT = (
    "import sys; from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig; "
    "OVModelForCausalLM.from_pretrained(sys.argv[1], export=True, compile=False, "
    "quantization_config=OVWeightQuantizationConfig(bits=8)).save_pretrained(sys.argv[2])"
)
PASS_THROUGH = {"Convert", "Subtract", "Multiply", "Reshape", "Transpose"}


def _weight_constants(op: Any) -> list[Any]:
    """The constants that make ``op``'s weight input (through its decompression ops)."""
    found, todo = [], [op.input_value(0 if op.get_type_name() == "Gather" else 1).get_node()]
    while todo:
        node = todo.pop()
        kind = node.get_type_name()
        if kind == "Constant":
            found.append(node)
        elif kind in PASS_THROUGH:
            todo.extend(v.get_node() for v in node.input_values())
    return found


def _size(constant: Any) -> int:
    return int(np.prod([int(d) for d in constant.get_output_shape(0)]))


def describe(model: Any) -> list[str]:
    """One line per kind of compressed weight: ops, integer type, scale layout, bytes."""
    kinds: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for op in model.get_ordered_ops():
        if op.get_type_name() not in ("MatMul", "Gather"):
            continue
        constants = _weight_constants(op)
        weight = max(constants, key=lambda c: _size(c),
                     default=None)  # fmt: skip
        if weight is None or _size(weight) < 4096:
            continue
        shape = [int(d) for d in weight.get_output_shape(0)]
        rest = [c for c in constants if c is not weight and _size(c) > 1]
        scales = [c for c in rest if c.get_element_type().is_real()]
        zeros = [
            c
            for c in rest
            if not c.get_element_type().is_real()
            and c.get_output_partial_shape(0).rank.get_length() == len(shape)
        ]
        if not scales:
            layout = "uncompressed"
        else:  # the axis the scale does not vary along is the one its inputs share a scale on
            scale = [int(d) for d in scales[0].get_output_shape(0)]
            scale = [1] * (len(shape) - len(scale)) + scale
            axis = next(
                (i for i, (w, s) in enumerate(zip(shape, scale, strict=True)) if s == 1 and w > 1),
                0,
            )
            layout = f"{'groups' if len(shape) == 3 else 'channel'} of {shape[axis]}"
        key = (
            op.get_type_name(),
            str(weight.get_element_type()),
            layout,
            str(scales[0].get_element_type()) if scales else "-",
            str(zeros[0].get_element_type()) if zeros else "none",
        )
        entry = kinds[key]
        entry[0] += 1
        entry[1] += int(np.prod(shape)) * weight.get_element_type().size
        entry[2] += sum(_size(c) * c.get_element_type().size for c in rest)
    return [
        f"  {n:3d} x {op:6s} weights {w:4s} {layout:14s} scale {s:4s} zero point {z:5s}: "
        f"{wb / 2**20:7.1f} MiB weights, {sb / 2**20:6.2f} MiB scales and zero points"
        for (op, w, layout, s, z), (n, wb, sb) in kinds.items()
    ]


def _generate(
    compiled: Any, beam: bool, batch: int, length: int, steps: int, vocab: int
) -> tuple[float, float]:
    """Seconds of a prefill of ``batch x length`` random ids, and of it and ``steps`` steps."""
    request = compiled.create_infer_request()
    request.reset_state()
    ids = np.random.default_rng(0).integers(3, vocab, (batch, length))
    start = time.perf_counter()
    request.infer(feed(ids, length, beam))
    prefill = time.perf_counter() - start
    for step in range(steps):
        request.infer(feed(np.full((batch, 1), 5), length + 1 + step, beam))
    return prefill, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama-134m", help="llama-134m or qwen2-0.5b")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--optimum-venv", type=Path, default=OPTIMUM_VENV)
    parser.add_argument("--inspect", action="store_true", help="what each compresses, no timing")
    args = parser.parse_args()
    print("load average before:", os.getloadavg(), flush=True)
    import openvino
    import torch
    import transformers

    from tunetree.generation import weights
    from tunetree.generation.stateful import StatefulConfig, attach, envelope, export_whole
    from tunetree.generation.stateful_check import teacher_forced
    from tunetree.generation.stateful_runner import StatefulRunner

    torch.manual_seed(0)
    cfg = config(args.model)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    work = Path(tempfile.mkdtemp(prefix="tunetree-int8-parity-"))
    model.save_pretrained(work / "model")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    python = ensure_venv(args.optimum_venv)
    subprocess.run(
        [str(python), "-c", EXPORT, str(work / "model"), str(work / "optimum")], env=env, check=True
    )
    core = openvino.Core()
    theirs = core.read_model(work / "optimum" / "openvino_model.xml")
    exported = export_whole(model)
    groups = weights.compress_int8(exported.model)
    channels = weights.compress_int8(exported.model, group=None)
    half = weights.compress_int8(exported.model, half_scales=True)
    half_channels = weights.compress_int8(exported.model, group=None, half_scales=True)
    for name, graph in (("optimum-intel int8", theirs), ("tunetree int8 groups", groups),
                        ("tunetree int8 per channel", channels),
                        ("tunetree int8 groups, f16 scales", half),
                        ("tunetree int8 per channel, f16 scales (the budget's)",
                         half_channels)):  # fmt: skip
        print(f"{name}:", *describe(graph), sep="\n", flush=True)
    if args.inspect:
        return
    latency = {"PERFORMANCE_HINT": "LATENCY"}

    def settings(hint: str, cache: str) -> dict[str, str]:
        return {**latency, "INFERENCE_PRECISION_HINT": hint, "KV_CACHE_PRECISION": cache}

    ours = {
        "tunetree groups, f32, f16 cache": (groups, settings("f32", "f16")),
        "tunetree per channel, f32, f16 cache": (channels, settings("f32", "f16")),
        "tunetree groups f16 scales, f32, f16 cache": (half, settings("f32", "f16")),
        "tunetree per channel f16 scales, f32, f16 cache (the budget's)": (
            half_channels,
            settings("f32", "f16"),
        ),
        "tunetree per channel f16 scales, f32, u8 cache": (half_channels, settings("f32", "u8")),
        "tunetree per channel f16 scales, bf16, u8 cache": (
            half_channels,
            settings("bf16", "u8"),
        ),
        "tunetree groups, bf16, bf16 cache": (groups, settings("bf16", "bf16")),
        "tunetree per channel, bf16, bf16 cache": (channels, settings("bf16", "bf16")),
        "tunetree per channel, bf16, u8 cache": (channels, settings("bf16", "u8")),
        "tunetree per channel, f32, u8 cache": (channels, settings("f32", "u8")),
    }
    runners = {n: StatefulRunner(g, exported.shape, s) for n, (g, s) in ours.items()}
    compiled: dict[str, tuple[Any, bool]] = {n: (r.compiled, False) for n, r in runners.items()}
    compiled["optimum-intel int8, its settings"] = (
        core.compile_model(theirs, "CPU", latency),
        True,
    )
    compiled["optimum-intel int8, f32, f16 cache"] = (
        core.compile_model(theirs, "CPU", settings("f32", "f16")),
        True,
    )
    errors: dict[str, list[float]] = {}
    limit = envelope(model, exported.shape, StatefulConfig())
    gen = dict(
        max_new_tokens=args.steps, min_new_tokens=args.steps, do_sample=False, pad_token_id=0
    )
    for i, (batch, length) in enumerate(UNSEEN.values()):
        inputs = prompt(cfg.vocab_size, batch, length, seed=i)
        with torch.no_grad():
            tokens = model.generate(**inputs, **gen)[:, length:]
        reference = teacher_forced(model, inputs, tokens)
        valid = torch.cat([inputs["attention_mask"], torch.ones_like(tokens[:, 1:])], 1).bool()
        for name, runner in runners.items():
            twin = attach(model, runner, exported.output_type, limit)
            found = teacher_forced(twin, inputs, tokens)
            diff = (found - reference)[valid].double().norm() / reference[valid].double().norm()
            errors.setdefault(name, []).append(float(diff))
    seconds: dict[str, list[tuple[float, float]]] = {}
    for batch, length in UNSEEN.values():
        seconds.clear()
        seconds.update({name: [] for name in compiled})

        def timed(name: str, b: int = batch, n: int = length) -> Any:
            graph, beam = compiled[name]
            return lambda: seconds[name].append(
                _generate(graph, beam, b, n, args.steps, cfg.vocab_size)
            )

        cycled_medians({name: timed(name) for name in compiled}, args.rounds)
        print(f"batch {batch}, prompt {length} + {args.steps} steps, bare requests: ms per "
              "token (fastest-slowest round), prefill ms; rel_l2 on 1x37 / 4x61")  # fmt: skip
        for name, values in seconds.items():
            ms = [1e3 * total / args.steps for _, total in values[1:]]
            prefill = statistics.median(1e3 * p for p, _ in values[1:])
            error = " / ".join(f"{e:.4f}" for e in errors.get(name, []))
            errors_text = f"  rel_l2 {error}" if error else ""
            print(f"  {name:48s} {statistics.median(ms):7.2f} ({min(ms):.2f}-{max(ms):.2f})"
                  f"  prefill {prefill:6.1f}{errors_text}", flush=True)  # fmt: skip
    print("load average after:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
