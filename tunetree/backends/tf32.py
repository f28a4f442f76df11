"""TF32 matrix products on NVIDIA GPUs: an opt-in candidate that changes results.

Ampere and newer GPUs multiply fp32 matrices several times faster in TF32 (10-bit mantissa
inputs, fp32 accumulation). PyTorch computes fp32 matmuls and convolutions in full precision by
default; this candidate runs the original forward with TF32 allowed for the duration of each
call only (the process's setting is put back after it), so the rest of the program is untouched.
Outputs differ from eager by about 1e-3 relative, so it is never chosen by default.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..signature.binding import original_forward
from ..signature.graph import Graph, GraphKey
from .base import ChangesResults, Runner

_FLAGS_LOCK = threading.RLock()
"""Held while the process-wide TF32 flags are switched: blocks of several threads run one at
a time, so the flags are always put back to what they were before the first."""


@contextlib.contextmanager
def tf32_allowed() -> Iterator[None]:
    """Allow TF32 in CUDA matmuls and cuDNN convolutions inside the block; restore after.

    The flags are process-wide: blocks run one at a time across threads (two overlapping
    blocks would otherwise leave them switched on), and other threads' matmuls running
    meanwhile see TF32 too.
    """
    with _FLAGS_LOCK:
        matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = matmul
            torch.backends.cudnn.allow_tf32 = cudnn


class Tf32Runner(Runner):
    """Calls the module's original forward with TF32 allowed."""

    def __init__(self, backend: Tf32, module: nn.Module) -> None:
        super().__init__(backend)
        self.forward = original_forward(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the original forward with TF32 matmuls and convolutions."""
        with tf32_allowed():
            return self.forward(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class Tf32(ChangesResults):
    """fp32 matmuls and convolutions in TF32 on CUDA (changes results; opt-in).

    Args:
        atol: Absolute tolerance against eager.
        rtol: Relative tolerance against eager.

    Example:
        >>> import tunetree as tt
        >>> tt.backends.Tf32().preserves_results
        False
    """

    kind: ClassVar[str] = "tf32"
    typical_build_s: ClassVar[float | None] = 0.1  # wraps the forward; nothing is compiled
    atol: float = 1e-2
    rtol: float = 1e-2

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why TF32 cannot run on ``device`` (not CUDA, or a GPU older than Ampere), or None."""
        if device.type != "cuda":
            return "TF32 is a CUDA feature (NVIDIA Ampere or newer)"
        if not torch.cuda.is_available():
            return "CUDA is not available here (torch.cuda.is_available() is False)"
        if torch.cuda.get_device_capability(device)[0] < 8:
            return "this GPU has no TF32 units (compute capability below 8.0)"
        return None

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        """A runner around the module's forward: nothing is compiled or copied."""
        return Tf32Runner(self, module)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        """The same runner as a build: nothing was saved."""
        return Tf32Runner(self, module)
