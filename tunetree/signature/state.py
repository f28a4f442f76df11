"""Keep the user's model state as it was: training flags, buffers, RNG.

Tuning must never change what the user's model holds. Recording runs eager calls, and an
eager call can move state (a BatchNorm in training mode updates ``running_mean`` and
``num_batches_tracked``; a forward that draws random numbers advances the global RNG).
:func:`preserved_state` snapshots buffers and RNG state and puts them back afterwards;
:func:`training_modules` and :func:`check_eval_mode` refuse training-mode models up front;
:func:`eval_mode` runs a block with every module in eval mode (``allow_training=True``);
:func:`process_state_kept` puts back process-wide settings (the root logger, torch's flags,
the environment) that a backend changed; :func:`restore_placement` the device and dtype of
weights a backend moved.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import torch

from ..errors import InvalidInputError
from .modules import module_paths
from .rng import is_left_alone

log = logging.getLogger(__name__)


Placement = dict[tuple[int, str], tuple[torch.nn.Module, torch.device, torch.dtype]]


def tensor_placement(model: Any) -> Placement:
    """Device and dtype of every parameter and buffer, to put back what a backend moved."""
    found: Placement = {}
    for _, module in module_paths(model):
        for name, tensor in list(module.named_parameters(recurse=False)) + list(
            module.named_buffers(recurse=False)
        ):
            if tensor is not None:
                found[(id(module), name)] = (module, tensor.device, tensor.dtype)
    return found


def restore_placement(saved: Placement) -> None:
    """Put every tensor a backend moved back on the device and dtype ``saved`` recorded."""
    for (_, name), (module, device, dtype) in saved.items():
        tensor = getattr(module, name, None)
        if isinstance(tensor, torch.Tensor) and (tensor.device, tensor.dtype) != (device, dtype):
            tensor.data = tensor.data.to(device=device, dtype=dtype)


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
    call runs under no_grad). Under :func:`.rng.rng_left_alone` (a background tune, beside
    threads that draw) the global RNG state is neither saved nor restored.
    """
    saved = []
    seen: set[int] = set()
    for _, module in module_paths(model):
        for buffer in module.buffers(recurse=False):
            if id(buffer) not in seen:
                seen.add(id(buffer))
                saved.append((buffer, buffer.detach().clone()))
    rng = None if is_left_alone() else _rng_state()
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                if buffer.shape == value.shape and buffer.dtype == value.dtype:
                    buffer.copy_(value.to(buffer.device))
        if rng is not None:
            torch.set_rng_state(rng[0])
            if rng[1]:
                torch.cuda.set_rng_state_all(rng[1])


@dataclass(frozen=True)
class ProcessState:
    """Process-wide settings a backend could change: logging, torch flags, the environment."""

    root_level: int
    root_handlers: tuple[logging.Handler, ...]
    root_filters: tuple[Any, ...]
    logging_disabled: int
    torch_flags: tuple[tuple[str, Any], ...]
    environ: tuple[tuple[str, str], ...]

    @classmethod
    def now(cls) -> ProcessState:
        """The settings as they are now."""
        root = logging.getLogger()
        return cls(
            root.level,
            tuple(root.handlers),
            tuple(root.filters),
            logging.root.manager.disable,
            tuple((name, get()) for name, (get, _) in _TORCH_FLAGS.items()),
            tuple(sorted((k, v) for k, v in os.environ.items() if not _private(k))),
        )

    def changes(self, other: ProcessState) -> list[str]:
        """Names of the settings that differ in ``other`` (the environment's by variable)."""
        changed = []
        for f in fields(self):
            if getattr(self, f.name) == getattr(other, f.name):
                continue
            if f.name == "environ":
                ours, theirs = dict(self.environ), dict(other.environ)
                names = sorted(
                    n for n in ours.keys() | theirs.keys() if ours.get(n) != theirs.get(n)
                )
                changed.append(f"environ ({', '.join(names)})")
            else:
                changed.append(f.name)
        return changed

    def restore(self) -> list[str]:
        """Put every setting back; returns the names of those that had changed."""
        changed = self.changes(ProcessState.now())
        root = logging.getLogger()
        if "root_level" in changed:
            root.setLevel(self.root_level)
        if "root_handlers" in changed:
            root.handlers = list(self.root_handlers)
        if "root_filters" in changed:
            root.filters = list(self.root_filters)
        if "logging_disabled" in changed:
            logging.disable(self.logging_disabled)
        if "torch_flags" in changed:
            for name, value in self.torch_flags:
                getter, setter = _TORCH_FLAGS[name]
                if getter() != value:
                    setter(value)
        if any(c.startswith("environ") for c in changed):
            saved = dict(self.environ)
            for name in set(os.environ) - set(saved):
                if not _private(name):
                    del os.environ[name]
            os.environ.update(saved)
        return changed


_PRIVATE_ENV_PREFIXES = ("_TORCHINDUCTOR_",)
"""Environment variables torch sets for itself once per process (Inductor, when first imported,
for its compile workers): the same with or without tunetree, never removed."""


def _private(name: str) -> bool:
    return name.startswith(_PRIVATE_ENV_PREFIXES)


def _set_matmul_tf32(value: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = value


def _set_cudnn_tf32(value: bool) -> None:
    torch.backends.cudnn.allow_tf32 = value


def _set_deterministic(value: bool) -> None:
    torch.use_deterministic_algorithms(value)


_TORCH_FLAGS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "float32_matmul_precision": (
        torch.get_float32_matmul_precision,
        torch.set_float32_matmul_precision,
    ),
    "matmul_allow_tf32": (lambda: torch.backends.cuda.matmul.allow_tf32, _set_matmul_tf32),
    "cudnn_allow_tf32": (lambda: torch.backends.cudnn.allow_tf32, _set_cudnn_tf32),
    "deterministic_algorithms": (
        torch.are_deterministic_algorithms_enabled,
        _set_deterministic,
    ),
    "default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "grad_enabled": (torch.is_grad_enabled, torch._C._set_grad_enabled),
    "num_threads": (torch.get_num_threads, torch.set_num_threads),
}
"""torch's process-wide flags that a backend might set, each with its getter and setter."""


@contextmanager
def process_state_kept(what: str) -> Iterator[None]:
    """Run the block, then put back any process-wide setting it changed (logged at debug).

    OpenVINO's converter, for one, sets the root logger to ERROR and does not restore it
    when conversion fails, which would silence every warning of the user's program.
    """
    saved = ProcessState.now()
    try:
        yield
    finally:
        changed = saved.restore()
        if changed:
            log.debug("%s changed %s: put back", what, ", ".join(changed))
