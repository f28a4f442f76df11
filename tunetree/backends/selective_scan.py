"""Mamba's selective scan without a loop over the sequence, for exports only.

Without the ``mamba_ssm`` kernels, Hugging Face's Mamba layers (Mamba, FalconMamba, Jamba,
Zamba) scan a sequence with a Python loop over its length, ``h_t = dA_t * h_{t-1} + dBu_t``.
An exporter unrolls that loop, so the graph holds the length it was traced at and a prompt
of any other length inside the tuned range runs the original forward. :func:`chunked_scan`
computes the same states with a loop whose length is fixed: step ``i`` of every chunk of
:data:`CHUNK` steps is gathered by index (``n = ceil(T / CHUNK) + 1`` chunks; steps past ``T``
decay by 1 and add 0, which changes no state), each chunk is scanned from a zero state by
eager's multiply-add, all chunks at once, and the state each chunk starts from is a sum over
the chunks before it, weighted by the decays of the chunks between (a masked segment sum, as
Mamba2's reference SSD computes). No size is a reshape of the length, so an exporter keeps it
symbolic. Within the first chunk the states are eager's bit for bit; past it they differ by
rounding (about 1e-6 relative, float32).

Memory, in floats (batch ``B``, channels ``D``, state size ``N``, length ``T``): eager's loop
holds ``dA`` and ``dBu``, ``2 * B*D*N*T``. This scan holds about three tensors of
``B*D*N*(T + 2 * CHUNK)`` (local states, decay products, states) and a few of
``B*D*N * n**2`` over the chunks: no larger than the others while ``T`` is below about
``CHUNK**2`` (1024 steps), growing as ``T**2 / CHUNK**2`` past it (at 4096 steps, each about
4 times ``B*D*N*T``). The chunk-free ``T x T`` segment sum would take ``B*D*N*T**2`` (6.4 GB
for a 130M Mamba, D=1536 and N=16, at 256 steps), which is why the sequence is chunked.

Speed: the ranged graph does more work than eager's loop unrolled at one length (the padding
to whole chunks, the gathers, the segment sum): one 130M-sized layer's scan at 100 steps took
53 ms in ONNX Runtime against 10.5 ms for the unrolled loop (one thread, busy machine). So
the scan is swapped only where the length is symbolic; an export of one length keeps eager's
loop, as before.

:func:`selective_scan_unrolled` swaps a layer module's ``mamba_selective_scan`` for one that
calls :func:`chunked_scan` in the exporting thread only (any other thread, such as a user's
eager model serving meanwhile, keeps the original), and puts it back afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CHUNK = 32
"""Steps of one chunk: the fixed loop of the export-time scan (unrolled in the graph)."""

SCAN_NAME = "mamba_selective_scan"
"""The module-level function of Hugging Face's Mamba-style modeling files that scans."""

_active = threading.local()
_lock = threading.Lock()
_installed: dict[str, tuple[Any, int]] = {}
"""Per modeling module: its original function and how many exports hold the swap."""


def chunked_scan(
    decay_log: torch.Tensor, inputs: torch.Tensor, chunk: int = CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every state of ``h_t = exp(decay_log_t) * h_{t-1} + inputs_t`` from ``h_{-1} = 0``.

    ``decay_log`` and ``inputs`` are ``(batch, channels, length, state)``; returns the states
    ``(batch, channels, length, state)`` and the last one ``(batch, channels, state)``. The
    loop runs ``chunk`` times whatever the length.
    """
    batch, channels, length, state = inputs.shape
    # Chunks are gathered by index, never split from a padded length by a reshape or a slice:
    # an exporter cannot prove a symbolic length's padding divisible by the chunk count or
    # distinct from the length, and would fix the length. At least two chunks (one more than
    # needed), since a count that may be 1 is specialized; steps past the length decay by 1
    # and add 0, which changes no state.
    chunks = (length + chunk - 1) // chunk + 1
    steps = torch.arange(chunks, device=inputs.device)[:, None] * chunk
    steps = steps + torch.arange(chunk, device=inputs.device)
    inside = (steps < length).to(inputs.dtype)[:, :, None]  # (chunks, chunk, 1)
    index = steps.clamp(max=length - 1)
    # Inside each chunk, from a zero state: eager's multiply-add, all chunks at once. Each
    # step's inputs are gathered along the length (no transposes, no reshape).
    local: list[torch.Tensor] = []
    products: list[torch.Tensor] = []
    chunk_log = torch.zeros_like(decay_log[:, :, :1]) * inside[:, 0]  # (B, D, chunks, N)
    for i in range(chunk):
        step_log = decay_log.index_select(2, index[:, i]) * inside[:, i]  # (B, D, chunks, N)
        step_value = inputs.index_select(2, index[:, i]) * inside[:, i]
        decay = step_log.exp()
        chunk_log = chunk_log + step_log
        local.append(decay * local[-1] + step_value if local else step_value)
        products.append(decay * products[-1] if products else decay)
    states = torch.stack(local, dim=3)
    carried = torch.stack(products, dim=3)
    # The state each chunk starts from: sum over earlier chunks c' < c of their last local
    # state times the decay of the chunks strictly between (a masked segment sum of logs),
    # laid out (B, D, c, c', N).
    below = torch.ones(chunks, chunks, device=inputs.device).tril(-1)[:, :, None]
    spans = (chunk_log[:, :, :, None] * below).cumsum(dim=2)  # sum of log g_k, c' < k <= c
    spans = F.pad(spans, (0, 0, 0, 0, 1, 0))[:, :, :-1]  # [.., c, c', n]: c' < k < c
    weights = spans.exp() * below
    starts = (weights * local[-1][:, :, None]).sum(dim=3)  # (B, D, chunks, N)
    states = states + carried * starts[:, :, :, None]
    states = states.reshape(batch, channels, chunks * chunk, state)
    time = torch.arange(length, device=inputs.device)
    return states.index_select(2, time), states[:, :, -1]


def _loop_free(
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    **_: Any,
) -> Any:
    """Hugging Face's ``mamba_selective_scan`` (transformers 5) with :func:`chunked_scan`."""
    input_dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    B = B.transpose(1, 2)
    C = C.transpose(1, 2)
    decay_log = A[None, :, None, :] * dt[:, :, :, None]
    inputs = dt[:, :, :, None] * B[:, None, :, :].float() * hidden_states[:, :, :, None].float()
    states, last = chunked_scan(decay_log, inputs)
    scan_output = torch.matmul(states.to(input_dtype)[..., None, :], C[:, None, :, :, None])
    scan_output = scan_output[..., 0, 0]
    if D is not None:
        scan_output = scan_output + hidden_states * D[None, :, None]
    if z is not None:
        scan_output = scan_output * F.silu(z)
    if return_last_state:
        return scan_output, last
    return scan_output


def _symbolic_length(hidden_states: Any, *_: Any, **__: Any) -> bool:
    """Whether the scanned length is symbolic (a ranged export).

    A fixed length keeps eager's loop, which exporters unroll into the faster graph.
    """
    return isinstance(hidden_states, torch.Tensor) and isinstance(
        hidden_states.shape[-1], torch.SymInt
    )


def _in_exporting_thread(original: Any) -> Any:
    @functools.wraps(original)
    def scan(*args: Any, **kwargs: Any) -> Any:
        if getattr(_active, "depth", 0) > 0 and _symbolic_length(*args, **kwargs):
            return _loop_free(*args, **kwargs)
        return original(*args, **kwargs)

    return scan


@contextlib.contextmanager
def selective_scan_unrolled(module: nn.Module) -> Iterator[None]:
    """Mamba-style layers of ``module`` scan with :func:`chunked_scan` in this thread.

    Touches only the modeling modules of ``module``'s own layers that define
    :data:`SCAN_NAME`; the last export to leave puts each module's function back.
    """
    names = sorted({type(m).__module__ for m in module.modules()})
    owners = [
        sys.modules[n] for n in names if callable(getattr(sys.modules.get(n), SCAN_NAME, None))
    ]
    with _lock:
        for owner in owners:
            original, holders = _installed.get(owner.__name__, (getattr(owner, SCAN_NAME), 0))
            if holders == 0:
                setattr(owner, SCAN_NAME, _in_exporting_thread(original))
            _installed[owner.__name__] = (original, holders + 1)
    _active.depth = getattr(_active, "depth", 0) + 1
    try:
        yield
    finally:
        _active.depth -= 1
        with _lock:
            for owner in owners:
                original, holders = _installed.pop(owner.__name__)
                if holders == 1:
                    setattr(owner, SCAN_NAME, original)
                else:
                    _installed[owner.__name__] = (original, holders - 1)
