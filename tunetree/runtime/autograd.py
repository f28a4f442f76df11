"""Whether a call of a wrapped module needs autograd, which tuned runners do not keep.

A runner (an exported graph, a compiled function run without autograd) returns outputs with no
autograd history. Eager's output of the same call has one when grad mode is on and an input or
one of the module's parameters requires grad (input attributions, adversarial inputs): such a
call must run the original forward, or ``backward()`` fails on a detached output.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

MAX_SCAN = 10_000
"""Most input objects (containers and leaves) looked at for a tensor requiring grad."""


class AutogradNeed:
    """Answers, per call, whether eager's output would carry autograd history.

    Asked only under grad mode (``torch.is_grad_enabled()``): under ``no_grad`` and
    ``inference_mode`` the caller does not ask and nothing extra happens. The module's parameters
    are listed once, on the first call under grad mode; each such call then reads their
    ``requires_grad`` flags (it stops at the first one set), so freezing or unfreezing parameters
    after tuning is seen at the next call.

    Args:
        module: The wrapped module.
    """

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self._parameters: tuple[torch.Tensor, ...] | None = None

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether a call with ``args`` and ``kwargs`` under grad mode needs autograd.

        Args:
            args: The call's positional arguments, as the caller gave them.
            kwargs: Its keyword arguments.

        Returns:
            True when a parameter of the module or a tensor in the arguments (inside lists,
            tuples and dicts) requires grad.
        """
        if self._parameters is None:
            self._parameters = tuple(self._module.parameters())
        if any(p.requires_grad for p in self._parameters):
            return True
        return requires_grad_inside((args, kwargs))


def requires_grad_inside(tree: Any) -> bool:
    """Whether a tensor inside ``tree`` (lists, tuples, dicts) requires grad.

    At most :data:`MAX_SCAN` objects are looked at; objects other than those containers (a cache
    object) are not looked into.
    """
    stack, seen = [tree], 0
    while stack and seen < MAX_SCAN:
        item = stack.pop()
        seen += 1
        if isinstance(item, torch.Tensor):
            if item.requires_grad:
                return True
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return False
