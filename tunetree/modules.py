"""Walk and run a model: its root modules, module paths, one call, device synchronisation.

A "model" here is an ``nn.Module`` or a plain object whose attributes hold modules (a
pipeline). These helpers are shared by inspection, measurement, wrapping and saving; they
live apart from :mod:`tunetree.inspection` so that lower layers (measure, wrap) need not
import the inspector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .errors import InvalidInputError
from .graph import Sample

CallFn = Callable[..., Any]
"""``call(model, *args, **kwargs)``: how to run a model that is not itself a module."""


def resolve_device(model: Any, device: torch.device | str | None) -> torch.device:
    """The device tuning runs on: the one given, else the device of the model's first
    parameter or buffer, else the CPU."""
    if device is not None:
        return torch.device(device)
    for module in root_modules(model).values():
        for tensor in list(module.parameters()) + list(module.buffers()):
            return tensor.device
    return torch.device("cpu")


def root_modules(model: Any) -> dict[str, nn.Module]:
    """The modules a model is made of, by path prefix: ``{"": model}`` for a module, or
    ``{attribute: module}`` for a plain object holding modules (a pipeline)."""
    if isinstance(model, nn.Module):
        return {"": model}
    found = {
        name: value
        for name, value in sorted(getattr(model, "__dict__", {}).items())
        if isinstance(value, nn.Module) and not name.startswith("_")
    }
    if not found:
        raise InvalidInputError(
            f"{type(model).__name__} is neither an nn.Module nor an object whose attributes "
            "hold modules"
        )
    return found


def find_module(model: Any, path: str) -> nn.Module:
    """The module at a full dotted ``path`` (as :func:`inspect` reports it)."""
    roots = root_modules(model)
    if "" in roots:
        return roots[""].get_submodule(path) if path else roots[""]
    head, _, rest = path.partition(".")
    if head not in roots:
        raise InvalidInputError(f"no module at path {path!r}")
    return roots[head].get_submodule(rest) if rest else roots[head]


def module_paths(model: Any) -> Iterator[tuple[str, nn.Module]]:
    """Every (full path, module) pair of a model or pipeline."""
    for prefix, root in root_modules(model).items():
        for name, module in root.named_modules():
            yield ".".join(p for p in (prefix, name) if p), module


def run_model(model: Any, sample: Sample, call: CallFn | None) -> Any:
    """Call the model (or pipeline) on one sample."""
    if call is not None:
        return call(model, *sample.args, **sample.kwargs)
    if not isinstance(model, nn.Module):
        raise InvalidInputError(
            f"{type(model).__name__} is not an nn.Module: pass call=lambda model, *args, "
            "**kwargs: ... that runs it"
        )
    return model(*sample.args, **sample.kwargs)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so host timers measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu" and hasattr(torch, "xpu"):
        torch.xpu.synchronize(device)
