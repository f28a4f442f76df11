"""The compiled stateful model and its one infer request: reset, load, run, read back.

One request holds one cache (the state); :class:`tunetree.generation.held_cache.Holder`
remembers which cache object that is, so the state is copied out into that cache before it
is dropped. Calls are serialised by a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..backends.openvino import _core, private_home
from ..errors import BackendError
from .held_cache import HeldState, Holder, hold
from .stateful_export import INPUTS, LOGITS, CacheShape, state_index


class StatefulRunner:
    """A stateful whole-forward OpenVINO model compiled for the CPU."""

    def __init__(self, model: Any, shape: CacheShape, config: dict[str, Any]) -> None:
        self.model = model
        self.shape = shape
        self.config = dict(config)
        with private_home():
            self.compiled = _core().compile_model(model, "CPU", self.config)
        self.request = self.compiled.create_infer_request()
        states = {state_index(s.name): s for s in self.request.query_state()}
        if sorted(states) != list(range(2 * shape.layers)):
            raise BackendError(
                f"the compiled model has states {sorted(states)[:8]}, expected one per key "
                f"and value of {shape.layers} layers"
            )
        self.states = [states[i] for i in range(2 * shape.layers)]
        self.holder = Holder()
        self.length = 0
        self.batch = 0
        self.lock = threading.RLock()

    def reset(self) -> None:
        """Start an empty cache (a prefill): the previous cache is copied out first."""
        self.holder.release()
        self.request.reset_state()
        self.length = self.batch = 0

    def load(self, tensors: Sequence[torch.Tensor]) -> None:
        """Make the state hold ``tensors`` (keys and values per layer) instead."""
        import openvino

        self.holder.release()
        self.request.reset_state()
        for state, tensor in zip(self.states, tensors, strict=True):
            array = np.ascontiguousarray(tensor.detach().to("cpu", torch.float32).numpy())
            state.state = openvino.Tensor(array)
        self.length, self.batch = int(tensors[0].shape[-2]), int(tensors[0].shape[0])

    def run(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, keep: int = 0
    ) -> torch.Tensor:
        """One forward on the state: appends ``ids``' positions; returns the logits.

        ``keep`` is transformers' ``logits_to_keep``: the logits of the last ``keep``
        positions only (0: all of them).
        """
        length = int(ids.shape[1])
        kept = np.arange(max(length - keep, 0) if keep else 0, length, dtype=np.int64)
        arrays = [
            np.ascontiguousarray(t.detach().to("cpu", torch.int64).numpy())
            for t in (ids, mask, positions)
        ]
        arrays.append(kept)
        try:
            result = self.request.infer(
                dict(zip(INPUTS, arrays, strict=True)), share_inputs=True, share_outputs=False
            )
        except RuntimeError as exc:
            raise BackendError(f"OpenVINO refused the call: {str(exc).strip()[:300]}") from exc
        self.length += int(ids.shape[1])
        self.batch = int(ids.shape[0])
        return torch.from_numpy(np.asarray(result[LOGITS]))

    def read(self) -> list[torch.Tensor]:
        """Copies of the state's tensors: keys and values per layer."""
        return [torch.from_numpy(np.array(s.state.data, copy=True)) for s in self.states]

    def bind(self, cache: Any) -> HeldState:
        """Make ``cache`` the one the state belongs to, of the state's current length."""
        state = hold(cache, self.length, self.read, self.shape.dtype)
        self.holder.set(state)
        return state

    def owns(self, state: HeldState | None) -> bool:
        """Whether ``state`` is the live cache of this runner's state."""
        return state is not None and state is self.holder.current()
