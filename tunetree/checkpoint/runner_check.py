"""A loaded runner is checked against eager, on the model's own weights, before it serves.

A checkpoint's artifacts are hostile until checked: the weights inside an
OpenVINO IR or an ONNX model can be scaled, or changed only in directions the tuning samples
never spanned, and the manifest resealed; a record can claim a precision its content does not
have. ``tt.load`` has the model, so every runner it rebuilds is run beside eager on calls
made from its graph key (:mod:`tunetree.signature.synthetic`: floats drawn from N(0, 1),
integers one) and on their probes: the floats negated and drawn afresh (as a fresh build's
value probes), and the integers drawn below the model's smallest embedding table, except in
masks (arguments named ``*mask*``), which hold 0 and 1 by contract: a model may take another
branch on a mask of other values (Mamba skips masking when every value is nonzero), which no
call it serves makes. A runner
that keeps results must match eager within its backend's tolerances, as at tuning; one that
changes results is measured, and must hold the accuracy budget the file records (its module
limit), else its backend's own tolerances. A runner that fails, or raises, is refused.

The memory this takes is known first: eager's peak on such a call, from a run on fake
tensors (:mod:`tunetree.signature.fake_run`), must fit twice over in what the load may spend
(:func:`check_budget_bytes`), so a file whose graph fixes a batch of 2^24 is refused before
anything of that size is made.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..accuracy import METRICS, output_error
from ..backends.base import Runner
from ..errors import CheckpointError
from ..runtime.artifacts import allowed_elements, parameter_bytes
from ..signature.binding import original_forward
from ..signature.compare import Tolerances, compare
from ..signature.fake_run import run_fake
from ..signature.graph import GraphKey, Sample, detach_clone, flatten, map_tensors
from ..signature.modules import root_modules
from ..signature.shapes import value_probes
from ..signature.synthetic import call_from_key, check_values, size_limit, zeros

BYTES_PER_ELEMENT = 4
"""What one element of :func:`~tunetree.runtime.artifacts.allowed_elements` may take."""


@dataclass(frozen=True)
class RunnerCheck:
    """How a loaded runner compared with eager on its check calls."""

    calls: int
    """Check calls eager could run (each one compared)."""
    max_abs_diff: float
    error: float | None = None
    """For a runner that changes results: its error in :attr:`metric`."""
    metric: str = "rel_l2"


def check_budget_bytes(read_bytes: int, model: Any) -> int:
    """Bytes the checks of one load may take.

    The load's element bound over the file's bytes and the model's own, at
    :data:`BYTES_PER_ELEMENT` each.
    """
    own = sum(parameter_bytes(m) for m in root_modules(model).values())
    return BYTES_PER_ELEMENT * allowed_elements(read_bytes + own)


def check_runner(
    module: nn.Module,
    key: GraphKey,
    runner: Runner,
    device: torch.device,
    budget_bytes: int,
    accuracy: dict[str, Any] | None = None,
) -> RunnerCheck | None:
    """Run ``runner`` beside eager on check calls of ``key``; CheckpointError when it differs.

    None for an eager runner (it is the reference). ``accuracy`` is the file's accuracy
    record: a runner that changes results must hold its budget's module limit.
    """
    backend = runner.backend
    if backend.kind == "eager":
        return None
    forward = original_forward(module)
    limit = size_limit(key, module)
    _check_memory(forward, key, device, limit, budget_bytes)
    checks = _check_calls(module, key, device, limit)
    references, outputs = [], []
    for label, sample in checks:
        expected = _eager(forward, sample)
        if expected is None:
            continue
        try:
            with torch.no_grad():
                got = detach_clone(sample.run(runner))
        except Exception as exc:
            raise CheckpointError(
                f"the saved {backend.name} runner fails on a {label} call of its graph "
                f"({type(exc).__name__}: {str(exc)[:300]}): it would fail when called"
            ) from exc
        references.append(expected)
        outputs.append(got)
    if not references:
        raise CheckpointError(
            f"the saved {backend.name} runner cannot be checked: eager itself fails on every "
            "call made from its graph, so nothing shows the runner computes the module"
        )
    if backend.preserves_results:
        return _kept(references, outputs, backend.tolerances() or Tolerances(), backend.name)
    return _measured(references, outputs, backend, accuracy)


def _check_memory(
    forward: Any, key: GraphKey, device: torch.device, limit: int, budget_bytes: int
) -> None:
    """Refuse a graph whose eager call would not fit twice in ``budget_bytes``."""
    try:
        peak = run_fake(forward, lambda: call_from_key(key, device, zeros, limit)).peak_bytes
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            "the saved runner cannot be checked against eager: the module cannot run on fake "
            f"tensors shaped like its graph ({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc
    if 2 * peak > budget_bytes:
        raise CheckpointError(
            "checking the saved runner against eager on a call of its graph would take about "
            f"{2 * peak / 2**20:.0f} MiB, over the {budget_bytes / 2**20:.0f} MiB that the "
            "file's size and the model's weights account for: refused before allocating"
        )


def _check_calls(
    module: nn.Module, key: GraphKey, device: torch.device, limit: int
) -> list[tuple[str, Sample]]:
    """The check call, its value probes, and an integer probe.

    The integer probe draws integers below the model's smallest embedding table (token ids,
    positions).
    """
    base = call_from_key(key, device, check_values(0), limit)
    calls = [("check", base), *(("value probe", s) for s in value_probes(base))]
    tables = [m.num_embeddings for m in module.modules() if isinstance(m, nn.Embedding)]
    if tables and min(tables) > 1:
        generator = torch.Generator().manual_seed(1)
        high = min(tables)

        def redraw(t: torch.Tensor) -> torch.Tensor:
            if t.dtype in (torch.int64, torch.int32):
                drawn = torch.randint(0, high, t.shape, generator=generator, dtype=t.dtype)
                return drawn.to(t.device)
            return t

        names = _argument_names(original_forward(module), len(base.args))
        args = tuple(
            arg if _is_mask(name) else map_tensors(redraw, arg)
            for name, arg in zip(names, base.args, strict=True)
        )
        kwargs = {k: v if _is_mask(k) else map_tensors(redraw, v) for k, v in base.kwargs.items()}
        calls.append(("integer probe", Sample(args, kwargs)))
    return calls


def _argument_names(forward: Any, count: int) -> list[str]:
    """The names of ``forward``'s first ``count`` positional parameters ("" where unknown)."""
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return [""] * count
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in parameters if p.kind in positional]
    return (names + [""] * count)[:count]


def _is_mask(name: str) -> bool:
    """Whether an argument is a mask (its integers are 0 and 1, kept by the integer probe)."""
    return "mask" in name.lower()


def _eager(forward: Any, sample: Sample) -> Any:
    """Eager's output on a check call, or None when eager cannot run it or it is not finite."""
    try:
        with torch.no_grad():
            output = detach_clone(sample.run(forward))
    except Exception:
        return None
    leaves, _ = flatten(output)
    finite = all(
        bool(torch.isfinite(t).all())
        for t in leaves
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    )
    return output if finite else None


def _kept(
    references: list[Any], outputs: list[Any], tolerances: Tolerances, name: str
) -> RunnerCheck:
    worst = 0.0
    for reference, output in zip(references, outputs, strict=True):
        comparison = compare(reference, output, tolerances)
        if not comparison.ok:
            raise CheckpointError(
                f"the saved {name} runner does not match eager on the model's own weights "
                f"({comparison.reason}): its artifact computes something else (altered "
                "weights or another model); refused"
            )
        worst = max(worst, comparison.max_abs_diff)
    return RunnerCheck(len(references), worst)


def _measured(
    references: list[Any], outputs: list[Any], backend: Any, accuracy: dict[str, Any] | None
) -> RunnerCheck:
    """A results-changing runner: its error against the recorded budget, else its tolerances."""
    budget = (accuracy or {}).get("budget") or {}
    named = budget.get("metric")
    metric = named if isinstance(named, str) and named in METRICS else "rel_l2"
    error = output_error(references, outputs, metric)
    worst = output_error(references, outputs, "max_abs")
    limit = budget.get("module_max_error")
    if isinstance(limit, int | float) and not isinstance(limit, bool):
        if not error <= limit:
            raise CheckpointError(
                f"the saved {backend.name} runner's {metric} error on the model's own weights "
                f"is {error:.3g}, over the module limit {limit:g} of the accuracy budget the "
                "file records: refused"
            )
        return RunnerCheck(len(references), worst, error, metric)
    tolerances = backend.tolerances() or Tolerances()
    for reference, output in zip(references, outputs, strict=True):
        comparison = compare(reference, output, tolerances)
        if not comparison.ok:
            raise CheckpointError(
                f"the saved {backend.name} runner changes results beyond its own tolerances "
                f"({comparison.reason}) and the file records no accuracy budget: refused"
            )
    return RunnerCheck(len(references), worst, error if math.isfinite(error) else None, metric)
