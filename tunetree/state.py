"""Keep the user's model state as it was: training flags, buffers, RNG.

Tuning must never change what the user's model holds. Recording runs eager calls, and an
eager call can move state (a BatchNorm in training mode updates ``running_mean`` and
``num_batches_tracked``; a forward that draws random numbers advances the global RNG).
:func:`preserved_state` snapshots buffers and RNG state and puts them back afterwards;
:func:`training_modules` and :func:`check_eval_mode` refuse training-mode models up front;
:func:`eval_mode` runs a block with every module in eval mode (``allow_training=True``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .errors import InvalidInputError
from .modules import module_paths


def training_modules(model: Any) -> list[str]:
    """Paths of the modules in training mode (``"<model>"`` for the root)."""
    seen: set[int] = set()
    found = []
    for path, module in module_paths(model):
        if id(module) in seen:
            continue
        seen.add(id(module))
        if module.training:
            found.append(path or "<model>")
    return found


def check_eval_mode(model: Any) -> None:
    """Refuse a model with modules in training mode.

    The dispatcher serves tuned runners in eval mode only, so tuning it would build runners that
    never run.
    """
    found = training_modules(model)
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise InvalidInputError(
            f"{len(found)} modules are in training mode ({shown}): call model.eval() before "
            "tuning (tuned runners serve eval mode only), or pass allow_training=True to tune "
            "the eval behaviour anyway"
        )


@contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """Run the block with every module in eval mode; the training flags are put back."""
    flags = [(module, module.training) for _, module in module_paths(model)]
    try:
        for module, _ in flags:
            module.training = False
        yield
    finally:
        for module, training in flags:
            module.training = training


def _rng_state() -> tuple[torch.Tensor, list[torch.Tensor]]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return torch.get_rng_state(), cuda


@contextmanager
def preserved_state(model: Any) -> Iterator[None]:
    """Run the block, then restore every buffer's value and the global RNG state.

    They are put back as they were before the block (parameters are never written: every recorded
    call runs under no_grad).
    """
    saved = []
    seen: set[int] = set()
    for _, module in module_paths(model):
        for buffer in module.buffers(recurse=False):
            if id(buffer) not in seen:
                seen.add(id(buffer))
                saved.append((buffer, buffer.detach().clone()))
    cpu_rng, cuda_rng = _rng_state()
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                if buffer.shape == value.shape and buffer.dtype == value.dtype:
                    buffer.copy_(value.to(buffer.device))
        torch.set_rng_state(cpu_rng)
        if cuda_rng:
            torch.cuda.set_rng_state_all(cuda_rng)
