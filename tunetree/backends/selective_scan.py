"""Mamba's selective scan without a loop over the sequence, for exports only.

Without the ``mamba_ssm`` kernels, Hugging Face's Mamba layers (Mamba, FalconMamba, Jamba,
Zamba) scan a sequence with a Python loop over its length, ``h_t = dA_t * h_{t-1} + dBu_t``.
An exporter unrolls that loop, so the graph holds the length it was traced at and a prompt
of any other length inside the tuned range runs the original forward. :func:`chunked_scan`
computes the same states with a loop whose length is fixed: the steps are gathered by index
into ``n = T // CHUNK + 2`` chunks of :data:`CHUNK` steps (the steps past ``T`` decay by 1
and add 0, which changes no state), each chunk is scanned from a zero state by the same
multiply-add as eager's loop (its :data:`CHUNK` steps run for every chunk at once), and the
state each chunk starts from is a sum over the chunks before it, weighted by the decays of the
chunks between (a masked segment sum, as Mamba2's reference SSD computes). No size is a
reshape of the length, so an exporter keeps it symbolic. Within the first chunk the states
are eager's bit for bit; past it they differ by rounding (about 1e-6 relative, float32).

Memory, in floats (batch ``B``, channels ``D``, state size ``N``, length ``T``): eager's loop
holds ``dA`` and ``dBu``, ``2 * B*D*N*T``. This scan holds about six tensors of
``B*D*N*(T + 2 * CHUNK)`` (inputs, decays, local states, decay products, states, gathered
result) and a few of ``B*D*N * n**2`` over the chunks: no larger than the others while
``T`` is below about ``CHUNK**2`` (1024 steps), growing as ``T**2 / CHUNK**2`` past it (at
4096 steps, each about 4 times ``B*D*N*T``). The chunk-free ``T x T`` segment sum would take
``B*D*N*T**2`` (6.4 GB for a 130M Mamba, D=1536 and N=16, at 256 steps), which is why the
sequence is chunked.

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
    length = inputs.shape[2]
    # Chunks are gathered by index, never reshaped from a padded length: an exporter cannot
    # prove a symbolic length's padding divisible or distinct from it, and would fix the
    # length. At least two chunks (one more than needed), since a count that may be 1 is
    # specialized; steps past the length decay by 1 and add 0, which changes no state.
    chunks = length // chunk + 2
    steps = torch.arange(chunks, device=inputs.device)[:, None] * chunk
    steps = steps + torch.arange(chunk, device=inputs.device)
    inside = (steps < length)[:, :, None]  # (chunks, chunk, 1)
    index = steps.clamp(max=length - 1)
    chunk_logs = torch.where(inside, decay_log[:, :, index], 0.0)  # (B, D, chunks, chunk, N)
    decay = chunk_logs.exp()
    values = torch.where(inside, inputs[:, :, index], 0.0)
    # Inside each chunk, from a zero state: eager's multiply-add, all chunks at once.
    local, products = [values[:, :, :, 0]], [decay[:, :, :, 0]]
    for i in range(1, chunk):
        local.append(decay[:, :, :, i] * local[-1] + values[:, :, :, i])
        products.append(decay[:, :, :, i] * products[-1])
    states = torch.stack(local, dim=3)
    carried = torch.stack(products, dim=3)
    # The state each chunk starts from: sum over earlier chunks c' < c of their last local
    # state times the decay of the chunks strictly between (a masked segment sum of logs).
    chunk_log = chunk_logs.sum(dim=3).transpose(2, 3)  # (batch, channels, state, chunks)
    below = torch.ones(chunks, chunks, dtype=torch.bool, device=inputs.device).tril(-1)
    spans = chunk_log[..., :, None].expand(*chunk_log.shape, chunks)  # [.., c, c'] = log g_c
    spans = spans.masked_fill(~below, 0.0).cumsum(dim=-2)  # sum of log g_k, c' < k <= c
    spans = F.pad(spans, (0, 0, 1, 0))[..., :-1, :]  # [.., c, c']: c' < k < c
    weights = spans.masked_fill(~below, float("-inf")).exp()
    ends = states[:, :, :, -1].transpose(2, 3)  # (batch, channels, state, chunks)
    starts = (weights * ends[..., None, :]).sum(dim=-1).transpose(2, 3)
    states = states + carried * starts[:, :, :, None]
    time = torch.arange(length, device=inputs.device)
    return states[:, :, time // chunk, time % chunk], states[:, :, -1, -1]


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


def _in_exporting_thread(original: Any) -> Any:
    @functools.wraps(original)
    def scan(*args: Any, **kwargs: Any) -> Any:
        if getattr(_active, "depth", 0) > 0:
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
