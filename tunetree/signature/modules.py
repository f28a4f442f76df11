"""Walk and run a model: its root modules, module paths, one call, device synchronisation.

A "model" here is an ``nn.Module`` or a plain object whose attributes hold modules (a
pipeline). These helpers are shared by inspection, measurement, wrapping and saving; they
live apart from :mod:`tunetree.signature.inspection` so that lower layers (measure, wrap) need not
import the inspector.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..errors import InvalidInputError
from .graph import Sample

CallFn = Callable[..., Any]
"""``call(model, *args, **kwargs)``: how to run a model that is not itself a module."""


def resolve_device(model: Any, device: torch.device | str | None) -> torch.device:
    """The device tuning runs on.

    The one given, else the device of the model's first parameter or buffer, else the CPU.
    """
    if device is not None:
        return torch.device(device)
    for module in root_modules(model).values():
        for tensor in list(module.parameters()) + list(module.buffers()):
            return tensor.device
    return torch.device("cpu")


def _held(value: Any) -> dict[str, nn.Module]:
    """Modules a plain dict, list or tuple holds directly, by key or index."""
    if isinstance(value, dict):
        items = [(k, v) for k, v in value.items() if isinstance(k, str) and "." not in k]
    elif isinstance(value, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return {}
    return {k: v for k, v in items if isinstance(v, nn.Module)}


def root_modules(model: Any) -> dict[str, nn.Module]:
    """The modules a model is made of, by path prefix.

    ``{"": model}`` for a module, or ``{attribute: module}`` for a plain object holding modules (a
    pipeline). A pipeline's modules held in a plain dict or list attribute are roots too, as
    ``attribute.key``.
    """
    if isinstance(model, nn.Module):
        return {"": model}
    found: dict[str, nn.Module] = {}
    for name, value in sorted(getattr(model, "__dict__", {}).items()):
        if name.startswith("_"):
            continue
        if isinstance(value, nn.Module):
            found[name] = value
        for key, module in _held(value).items():
            found[f"{name}.{key}"] = module
    if not found:
        raise InvalidInputError(
            f"{type(model).__name__} is neither an nn.Module nor an object whose attributes "
            "hold modules"
        )
    return found


def set_root(pipeline: Any, prefix: str, module: nn.Module) -> None:
    """Put ``module`` at root ``prefix`` of a pipeline object (see :func:`root_modules`).

    A dict or list attribute is replaced by a copy, so another object sharing it is not changed.
    """
    name, _, key = prefix.partition(".")
    if not key:
        setattr(pipeline, name, module)
        return
    container = getattr(pipeline, name)
    if isinstance(container, dict):
        setattr(pipeline, name, {**container, key: module})
    else:
        items = list(container)
        items[int(key)] = module
        setattr(pipeline, name, type(container)(items) if isinstance(container, tuple) else items)


def hidden_modules(model: Any) -> list[str]:
    """Attributes of the model's modules that hold modules in a plain dict, list or tuple.

    Their weights are not in any ``state_dict``, so a checkpoint cannot restore them.
    """
    found = []
    for path, module in module_paths(model):
        for name, value in vars(module).items():
            if not name.startswith("_") and _held(value):
                found.append(f"{path}.{name}" if path else name)
    return found


def find_module(model: Any, path: str) -> nn.Module:
    """The module at a full dotted ``path`` (as :func:`inspect` reports it)."""
    roots = root_modules(model)
    if "" in roots:
        return roots[""].get_submodule(path) if path else roots[""]
    for prefix in sorted(roots, key=len, reverse=True):
        if path == prefix or path.startswith(prefix + "."):
            rest = path[len(prefix) + 1 :]
            return roots[prefix].get_submodule(rest) if rest else roots[prefix]
    raise InvalidInputError(f"no module at path {path!r}")


def module_paths(model: Any) -> Iterator[tuple[str, nn.Module]]:
    """Every (full path, module) pair of a model or pipeline."""
    for prefix, root in root_modules(model).items():
        for name, module in root.named_modules():
            yield ".".join(p for p in (prefix, name) if p), module


def private_copy(model: Any) -> Any:
    """A copy of ``model`` whose modules, buffers and config are its own; parameters shared.

    What the copy is given (hooks, settings, buffers written) leaves ``model`` as it was,
    at the memory of its buffers only.
    """
    memo: dict[int, Any] = {}
    for _, module in module_paths(model):
        for parameter in module.parameters(recurse=False):
            memo[id(parameter)] = parameter
    return copy.deepcopy(model, memo)


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
