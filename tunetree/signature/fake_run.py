"""One eager call run on fake tensors: its output structure and peak memory, none allocated.

Loading a checkpoint must learn what the module returns (a ``ModelOutput``, a cache object)
and may run the module to check a runner, on calls whose sizes come from the file. Run for
real, a file of a few KB could make that allocate gigabytes (a batch fixed at 2^24, say).
Under torch's ``FakeTensorMode`` every tensor carries only its
metadata, so the forward runs in Python as usual, its output has the real structure and
classes, and the bytes each new tensor would take are counted: the largest total alive at
once is the peak a real run would reach (within what the allocator adds), known before any
real memory is spent.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .graph import Sample


@dataclass
class FakeRun:
    """What a fake run found: eager's output (of fake tensors) and its peak memory."""

    output: Any
    peak_bytes: int


class _PeakBytes(TorchDispatchMode):
    """Counts the bytes of every new tensor storage while it is alive; keeps the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.alive: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        given = {
            t.untyped_storage()._cdata
            for t in pytree.tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for tensor in pytree.tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            handle = storage._cdata
            if handle in given or handle in self.alive:
                continue  # a view or an in-place result: no new memory
            self.alive.add(handle)
            size = storage.nbytes()
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(tensor, self._free, handle, size)
        return out

    def _free(self, handle: int, size: int) -> None:
        self.live -= size
        self.alive.discard(handle)


class _CpuShapes(TorchDispatchMode):
    """Shapes of CPU kernels whose fake (meta) kernels accept less than the kernels do.

    ``aten._grouped_mm``'s meta kernel accepts bfloat16 only (the CUDA kernel's rule), while
    the CPU kernel, which transformers' mixture-of-experts layers call on CPU, takes float32
    too: the output is made here from the shapes, as the meta kernel would.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is _GROUPED_MM and args[0].dtype != torch.bfloat16:
            return _grouped_mm_output(*args, **kwargs)
        return func(*args, **kwargs)


_GROUPED_MM = getattr(getattr(torch.ops.aten, "_grouped_mm", None), "default", None)


def _grouped_mm_output(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The output of ``aten._grouped_mm`` (2-D or 3-D operands), shaped as its meta kernel."""
    groups = offs.size(0) if offs is not None else mat_a.size(0)
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        size = [groups, mat_a.size(0), mat_b.size(1)]
    elif mat_a.dim() == 2:
        size = [mat_a.size(0), mat_b.size(-1)]
    elif mat_b.dim() == 2:
        size = [mat_a.size(1), mat_b.size(1)]
    else:
        size = [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
    return torch.empty(size, dtype=out_dtype or mat_a.dtype, device=mat_a.device)


def run_fake(fn: Callable[..., Any], make_call: Callable[[], Sample]) -> FakeRun:
    """``fn`` called on ``make_call()``'s call, every tensor a fake one (no real memory).

    ``make_call`` runs inside the fake mode, so the call's tensors are fake too; the module's
    own parameters are read as fake tensors of the same metadata. Raises what the forward
    raises (a module that reads tensor values into Python cannot run on fake tensors).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    counter = _PeakBytes()
    with FakeTensorMode(allow_non_fake_inputs=True), _CpuShapes(), counter, torch.no_grad():
        sample = make_call()
        output = sample.run(fn)
    return FakeRun(output, counter.peak)
