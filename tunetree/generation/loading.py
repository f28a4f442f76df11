"""``tunetree.load``: a checkpoint loaded, generate's whole-model runner rebuilt where it has one.

:func:`tunetree.checkpoint.load` reads the file and rebuilds every saved runner of a plan; a
model whose whole forward one runner serves (a causal LM's stateful OpenVINO model) needs a
rebuild from this room, which the checkpoint room below cannot import. So the public load
passes the rebuilders here, by kind, in code: nothing the file names selects code.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import MappingProxyType
from typing import Any

import torch

from ..checkpoint.loading import load_with
from ..checkpoint.whole import Rebuild
from .stateful import StatefulConfig
from .stateful_saved import rebuild

REBUILDERS: MappingProxyType[str, Rebuild] = MappingProxyType({StatefulConfig.name: rebuild})
"""The whole-model runners a checkpoint may hold, by kind (read-only)."""


def load(
    model: Any,
    path: str | os.PathLike[str],
    *,
    ignore: Iterable[str] = (),
    device: torch.device | str | None = None,
    trust_config: bool = False,
) -> Any:
    """Rebuild a tuned model from a checkpoint, without tuning.

    Its weights replace the model's, each saved runner is rebuilt from its artifacts and
    checked against eager on the model's own weights before it serves, and the model to call
    is returned (a shallow copy when the whole model was tuned). A model ``generate`` served
    whole (a stateful OpenVINO model on the CPU) is exported again from the saved weights and
    checked on greedy probes: tokens equal and teacher-forced logits within tolerances, or
    within the accuracy budget the file records for a config that changes results. Nothing
    is unpickled. Saved backend configurations are checked against allow-lists that cannot
    name programs, paths or code.

    Args:
        model: A freshly built, untuned model of the same architecture.
        path: The checkpoint :func:`tunetree.save` wrote.
        ignore: Environment record entries whose differences are waived, e.g. ``("host",)``
            for containers whose host name changes.
        device: Where to load (default: the recorded device type).
        trust_config: Skip the configuration allow-lists: only for a file you wrote yourself,
            since such a configuration can make compiling run any program it names.

    Returns:
        The tuned model to call.

    Raises:
        IncompatibleCheckpointError: Another format version or environment (every difference
            listed), or a runner that cannot be built here.
        CheckpointError: A damaged or hostile file, or a runner that fails its check.
        UntrustedConfigError: A saved configuration outside the allow-lists.
        InvalidInputError: ``model`` already carries a tune.

    Example:
        >>> import tempfile, torch, tunetree as tt
        >>> x, model = torch.randn(2, 8), torch.nn.Linear(8, 8).train(False)
        >>> result = tt.tune(model, [x], strategy=tt.OneBackendStrategy(
        ...     tt.backends.Eager()), cache=False, verbose=False,
        ...     measure_config=tt.MeasureConfig.quick())
        >>> path = tt.save(result, tempfile.mkdtemp() + "/linear.tt")
        >>> fast = tt.load(torch.nn.Linear(8, 8).train(False), path)
        >>> torch.equal(fast(x), result.model(x))
        True
    """
    return load_with(
        model, path, REBUILDERS, ignore=ignore, device=device, trust_config=trust_config
    )
