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
        names = [port.get_names() for port in self.compiled.inputs]
        self._inputs = [next(i for i, n in enumerate(names) if name in n) for name in INPUTS]
        outputs = [port.get_names() for port in self.compiled.outputs]
        self._logits = next(i for i, n in enumerate(outputs) if LOGITS in n)
        self._fed: list[np.ndarray] = []
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
        positions only (0: all of them). The inputs are set on the request as tensors over the
        arrays' memory (no copy, no lookup by name) and the logits copied out of its output:
        a decode step's own cost is its kernels, not the binding's dispatch.
        """
        import openvino

        length = int(ids.shape[1])
        kept = np.arange(max(length - keep, 0) if keep else 0, length, dtype=np.int64)
        arrays = [_int64(t) for t in (ids, mask, positions)]
        arrays.append(kept)
        self._fed = arrays  # the request reads their memory: alive until the next call
        try:
            for index, array in zip(self._inputs, arrays, strict=True):
                self.request.set_input_tensor(index, openvino.Tensor(array, shared_memory=True))
            self.request.infer()
        except RuntimeError as exc:
            raise BackendError(f"OpenVINO refused the call: {str(exc).strip()[:300]}") from exc
        self.length += length
        self.batch = int(ids.shape[0])
        logits = self.request.get_output_tensor(self._logits).data
        return torch.from_numpy(np.array(logits, copy=True))

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


def _int64(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a C-contiguous int64 array on the CPU (its own memory when it is one)."""
    return np.ascontiguousarray(tensor.detach().to("cpu", torch.int64).numpy())
