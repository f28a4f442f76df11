"""Conditions around one export or conversion (torch.export, ONNX, OpenVINO).

No autograd and no fused attention fast path, weights readable on the host, exporters'
noise silenced, and their long errors reduced to one line. Everything is restored
afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import itertools
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .selective_scan import selective_scan_unrolled

log = logging.getLogger(__name__)


@contextlib.contextmanager
def exporting(module: nn.Module) -> Iterator[None]:
    """Conditions for exporting ``module``: no autograd, no attention fast path, exportable experts.

    The fused multi-head-attention fast path is off because ``nn.TransformerEncoder`` would
    otherwise trace to ``aten::_transformer_encoder_layer_fwd``, which exporters cannot
    translate. Experts run as :func:`experts_as_data` says, distributions as
    :func:`distributions_unvalidated` says, Mamba-style selective scans as
    :func:`.selective_scan.selective_scan_unrolled` says. Restores the fast-path switch, the
    experts' implementation, the exporter paths, the distributions' default, the scans and
    every submodule's training flag afterwards.
    """
    fastpath = torch.backends.mha.get_fastpath_enabled()
    modes = [(m, m.training) for m in module.modules()]
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with (
            torch.no_grad(),
            experts_as_data(module),
            exporter_paths(module),
            distributions_unvalidated(),
            selective_scan_unrolled(module),
        ):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def distributions_unvalidated() -> Iterator[None]:
    """``torch.distributions`` built without checking their arguments while one traces.

    A distribution built with its default ``validate_args`` checks its parameters (and
    ``log_prob`` its value) against their constraints, ``constraint.check(x).all()``: a branch
    on tensor values, so the export of any model whose head builds one fails with "the graph
    depends on input values" (TimeSeriesTransformer's Student-t head, every probabilistic
    forecaster of its kind). The checks only raise on invalid parameters; they change no value.
    A distribution given ``validate_args`` explicitly keeps it. The process-wide default is
    put back afterwards.
    """
    distribution = torch.distributions.Distribution
    saved = distribution._validate_args
    distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        distribution.set_default_validate_args(saved)


EXPORTED_EXPERTS = "batched_mm"
"""The Hugging Face experts implementation exports use: every (token, chosen expert) pair
gathers its expert's weights by index and one batched matmul computes them all."""


@contextlib.contextmanager
def experts_as_data(module: nn.Module) -> Iterator[None]:
    """Mixture-of-experts routing as data in the exported graph, not baked into it.

    Hugging Face experts layers (Mixtral, Qwen2-MoE, ...; transformers 5's
    ``use_experts_implementation``) read ``config._experts_implementation`` on every call. The
    eager form loops over the experts a batch hit (``nonzero``: the trace would keep the routing
    of the example), and on a CPU the default grouped form calls the custom operator
    ``transformers::grouped_mm_fallback``, which no ONNX exporter translates. The batched form
    (:data:`EXPORTED_EXPERTS`) indexes the experts' weights with the router's top-k tensor, so
    the graph routes each call by its own values; the candidate is then checked on value probes
    like any other. Each config is put back afterwards.
    """
    configs: dict[int, Any] = {}
    for m in module.modules():
        config = getattr(m, "config", None)
        if isinstance(getattr(config, "_experts_implementation_internal", None), str):
            configs[id(config)] = config
    saved = [(c, c._experts_implementation_internal) for c in configs.values()]
    try:
        for config, _ in saved:
            config._experts_implementation_internal = EXPORTED_EXPERTS
        yield
    finally:
        for config, value in saved:
            config._experts_implementation_internal = value


EXPORTER_SWITCH = "onnx_export"
"""A Hugging Face config flag that selects a model's own exportable code path."""


@contextlib.contextmanager
def exporter_paths(module: nn.Module) -> Iterator[None]:
    """The code paths Hugging Face models keep for exporters, taken while one traces.

    Longformer and LED read ``config.onnx_export`` when they cut a sequence into overlapping
    chunks: by default with ``as_strided`` over a view whose sizes ``torch.div`` computes as
    tensors (an exporter cannot trace a shape read from a tensor: "the graph depends on input
    values"), with the flag by ``unfold``, the same windows of the same values. Only configs
    that declare the flag are touched; each is put back afterwards.
    """
    configs: dict[int, Any] = {}
    for m in module.modules():
        config = getattr(m, "config", None)
        if isinstance(getattr(config, EXPORTER_SWITCH, None), bool):
            configs[id(config)] = config
    saved = [(c, getattr(c, EXPORTER_SWITCH)) for c in configs.values()]
    try:
        for config, _ in saved:
            setattr(config, EXPORTER_SWITCH, True)
        yield
    finally:
        for config, value in saved:
            setattr(config, EXPORTER_SWITCH, value)


def _hidden_rows_as_null_key(
    key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, visible: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Key, value and mask with one more position that only hidden rows see, and whose value is 0.

    A row that sees nothing else attends to that position alone and gets zeros; every other
    row gives it weight ``exp(-inf) = 0``, so its result is unchanged.
    """
    null = key.new_zeros(*key.shape[:-2], 1, key.shape[-1])
    null_value = value.new_zeros(*value.shape[:-2], 1, value.shape[-1])
    return (
        torch.cat([key, null], dim=-2),
        torch.cat([value, null_value], dim=-2),
        torch.cat([mask, ~visible], dim=-1),
    )


def _sdpa_as_eager(sdpa: Any, expand_gqa: bool, null_key: bool) -> Any:
    """``sdpa`` written so that exporters keep two of eager's semantics.

    A query row whose boolean mask is all False gives zeros in eager, where exporters build a
    softmax over equal scores (the mean of the values). Such rows are zeroed explicitly after
    the attention, or with ``null_key`` by a zero-valued key that only they can see (see
    :func:`attention_as_eager` for why). With ``expand_gqa``, ``enable_gqa=True`` becomes
    attention over repeated key/value heads.
    """

    @functools.wraps(sdpa)
    def attention(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        if expand_gqa and kwargs.get("enable_gqa") and key.shape[-3] != query.shape[-3]:
            kwargs.pop("enable_gqa")
            groups = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        mask = kwargs.get("attn_mask", args[0] if args else None)
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            return sdpa(query, key, value, *args, **kwargs)
        visible = mask.any(dim=-1, keepdim=True)
        if null_key and mask.shape[-1] == key.shape[-2]:
            key, value, mask = _hidden_rows_as_null_key(key, value, mask, visible)
            if "attn_mask" in kwargs:
                kwargs["attn_mask"] = mask
            else:
                args = (mask, *args[1:])
            return sdpa(query, key, value, *args, **kwargs)
        return torch.where(visible, sdpa(query, key, value, *args, **kwargs), 0.0)

    return attention


@contextlib.contextmanager
def attention_as_eager(expand_gqa: bool = False, null_key: bool = False) -> Iterator[None]:
    """Export ``scaled_dot_product_attention`` so the graph computes what eager computes.

    Eager returns zeros for a query row that a boolean mask hides entirely (the padding rows
    of a left-padded batch); exported graphs return the mean of the values there, so their
    outputs would differ from eager on every padded batch. By default the attention's result
    is zeroed on those rows. ``null_key`` reaches the same zeros without touching the result:
    OpenVINO 2026.4 computes wrong values (up to 0.9 on BERT with head size 128, sequence
    128) when anything reads the attention's result before its layout transpose, even
    ``where`` with an all-True condition. ``expand_gqa`` writes grouped-query attention
    (``enable_gqa=True``: Llama, Gemma, Qwen) as attention over key/value heads repeated
    ``heads // kv_heads`` times, which is its definition; OpenVINO's converter ignores
    ``enable_gqa`` and builds a graph that fails at run time. The function is put back
    afterwards.
    """
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = _sdpa_as_eager(original, expand_gqa, null_key)
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def _is_legacy_empty(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.dim() == 1 and tensor.shape[0] == 0


def _cat_without_legacy_empties(cat: Any) -> Any:
    """``cat`` given its operands less the 1-D empty ones, which ``torch.cat`` skips anyway."""

    @functools.wraps(cat)
    def concatenate(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tensors, list | tuple) and any(map(_is_legacy_empty, tensors)):
            kept = [t for t in tensors if not _is_legacy_empty(t)]
            if kept and all(isinstance(t, torch.Tensor) and t.dim() > 1 for t in kept):
                tensors = kept
        return cat(tensors, *args, **kwargs)

    return concatenate


@contextlib.contextmanager
def empty_operands_dropped() -> Iterator[None]:
    """``torch.cat`` exported without the 1-D empty operands it skips at run time.

    ``torch.cat([torch.tensor([]), x], dim=-2)`` is ``x``: a 1-D empty operand is skipped
    whatever the others' rank (a legacy rule). Hugging Face's dynamic cache layers start
    from exactly such a tensor, so the first decoder step of an empty cache concatenates one;
    OpenVINO's converter cannot convert a concatenation of operands of different ranks
    ("cannot convert: SequenceMark, aten.cat"). Operands are dropped only where every other
    one has more than one dimension, the case the rule covers. The function is put back
    afterwards.
    """
    original = torch.cat
    torch.cat = _cat_without_legacy_empties(original)
    try:
        yield
    finally:
        torch.cat = original


@contextlib.contextmanager
def parameters_on_cpu(module: nn.Module) -> Iterator[None]:
    """Temporarily give every parameter and buffer of ``module`` CPU data.

    For converters that read weights on the host; afterwards each one holds its original data
    again.
    """
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            if tensor.device.type != "cpu":
                saved.append((tensor, tensor.data))
                tensor.data = tensor.data.cpu()
        yield
    finally:
        for tensor, data in saved:
            tensor.data = data


_NOISY_LOGGERS = ("torch.onnx", "onnxscript", "torch.export", "torch._export", "openvino")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence exporters' and converters' warnings and progress logs while one runs.

    A tune tries many candidates, and a failure is reported through the error it raises (and a
    wrong result through the comparison with eager).
    """
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    sink = io.StringIO()  # some exporter strategies print the graphs they tried
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
            _descriptors_captured(),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
        if sink.getvalue():
            log.debug("exporter output:\n%s", sink.getvalue()[:CAPTURED_LIMIT])


CAPTURED_LIMIT = 1 << 20
"""At most this many characters of what an exporter printed are kept for the debug log."""


@contextlib.contextmanager
def _descriptors_captured() -> Iterator[None]:
    """Point file descriptors 1 and 2 at a temporary file while the block runs.

    C++ code writes there directly, past Python's ``sys.stdout``: the TorchScript exporter
    prints the whole IR of a graph it failed on (402 lines for Mixtral, with the machine's file
    paths). What was written goes to the debug log. Where the descriptors cannot be
    duplicated, the block runs as it is.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield
        finally:
            _flush_c_streams()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            text = sink.read(CAPTURED_LIMIT).decode(errors="replace")
            if text:
                log.debug("exporter output (native):\n%s", text)


def _flush_c_streams() -> None:
    """Flush the C library's buffered streams (``fflush(NULL)``), where it can be reached."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def describe_error(error: BaseException) -> str:
    """One line naming the root cause of ``error`` (exporters wrap it in long advice)."""
    root = error
    seen = {id(root)}
    while root.__cause__ is not None and id(root.__cause__) not in seen:
        root = root.__cause__
        seen.add(id(root))
    lines = [line.strip() for line in _ANSI.sub("", str(root)).splitlines() if line.strip()]
    # OpenVINO's converter ends its long report with the operations it could not convert.
    summary = [line for line in lines if line.startswith("-- Conversion is failed for:")]
    if summary:
        lines = [summary[-1].lstrip("- ").replace("Conversion is failed for", "cannot convert")]
    text = f"{type(root).__name__}: {lines[0]}" if lines else type(root).__name__
    return text[:300]
