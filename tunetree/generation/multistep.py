"""Several greedy decode steps per CUDA graph replay, for a Hugging Face causal LM.

At batch 1 a decode step of a model below a few billion parameters is bound by the host:
``generate``'s Python loop (inputs for the step, logits processors, stopping criteria with a
device-to-host read, cache bookkeeping) costs about as much as the step's kernels. A
:class:`DecodeGraph` captures ``steps`` whole decode steps in one CUDA graph: the model's
forward on a static cache, the next token's selection, the stopping mask and the positions'
update, all on the device; one replay advances every row by ``steps`` tokens and the host
reads back one flag (all rows finished) per replay.

The step is the model's own forward (eager's kernels, or Inductor's code for the same step
when ``compiled``, see :func:`compiled_step`), called with the inputs ``generate`` gives it
on a static cache; the token
selection is ``generate``'s greedy rule (argmax of the float32 logits, finished rows padded,
the end-of-sequence logits masked while fewer than the minimum new tokens were made), or its
multinomial sampling after Hugging Face's own temperature, top-k, top-p and min-p warpers,
drawing from torch's generator as ``generate`` does.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..backends.graph_api import drop_workspaces, graph_api, own_workspaces

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopShape:
    """What one captured loop serves: batch size, cache capacity and steps per replay."""

    batch: int
    capacity: int
    steps: int


@dataclass(frozen=True)
class StopRule:
    """``generate``'s token choice, stopping and padding, as device-side data."""

    eos: tuple[int, ...] = ()
    pad: int = 0
    min_new: int = 0
    """End-of-sequence logits are masked while fewer new tokens than this were made."""
    sampling: tuple[tuple[str, float], ...] | None = None
    """None for greedy search; else multinomial sampling after these warpers, in
    ``generate``'s order (``temperature``, ``top_k``, ``top_p``, ``min_p``)."""


def _warpers(sampling: tuple[tuple[str, float], ...]) -> list[Any]:
    """Hugging Face's own logits warpers for a sampling rule (the same code ``generate`` runs)."""
    from transformers.generation import logits_process as lp

    made = {
        "temperature": lambda v: lp.TemperatureLogitsWarper(v),
        "top_k": lambda v: lp.TopKLogitsWarper(top_k=int(v), min_tokens_to_keep=1),
        "top_p": lambda v: lp.TopPLogitsWarper(top_p=v, min_tokens_to_keep=1),
        "min_p": lambda v: lp.MinPLogitsWarper(min_p=v, min_tokens_to_keep=1),
    }
    return [made[name](value) for name, value in sampling]


class DecodeGraph:
    """One static cache and ``steps`` decode steps of ``model`` captured in one CUDA graph.

    Use :meth:`start` after a prefill has filled :attr:`cache` (and made the first token),
    then :meth:`replay` until :meth:`finished` or enough tokens were made; :meth:`tokens`
    gives the new tokens.
    """

    def __init__(
        self,
        model: Any,
        shape: LoopShape,
        rule: StopRule,
        *,
        max_new: int,
        compiled: bool = False,
        step: Callable[..., torch.Tensor] | None = None,
    ) -> None:
        """Args: ``step`` is a config's shared :func:`compiled_step` (a new one when None)."""
        from transformers import StaticCache

        self.model, self.shape, self.rule, self.compiled = model, shape, rule, compiled
        device = next(model.parameters()).device
        batch, capacity = shape.batch, shape.capacity
        self.cache = StaticCache(config=model.config, max_cache_len=capacity)
        long = dict(dtype=torch.long, device=device)
        self.token = torch.zeros(batch, 1, **long)
        self.position = torch.zeros(batch, 1, **long)
        self.cache_position = torch.zeros(1, **long)
        self.mask = torch.ones(batch, capacity, **long)
        self.unfinished = torch.ones(batch, **long)
        self.made = torch.zeros(1, **long)
        """How many new tokens exist (the prefill's first one included)."""
        self.out = torch.zeros(batch, max_new + shape.steps, **long)
        self.eos = torch.tensor(rule.eos or [0], **long)
        self.max_new = max_new
        self._warpers = _warpers(rule.sampling) if rule.sampling is not None else []
        self._keep = _forward_keywords(model)
        self._step: Callable[[], None] = self._eager_step
        if compiled:
            self._compiled = step if step is not None else compiled_step()
            self._step = self._compiled_step
        self.graph: torch.cuda.CUDAGraph | None = None

    # one step ------------------------------------------------------------------------------
    def _forward(self, token: torch.Tensor, position: torch.Tensor, cache_position: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:  # fmt: skip
        kwargs: dict[str, Any] = dict(
            input_ids=token,
            attention_mask=mask,
            position_ids=position,
            cache_position=cache_position,
            use_cache=True,
            return_dict=True,
        )
        kwargs["cache" if "cache" in self._keep else "past_key_values"] = self.cache
        if "logits_to_keep" in self._keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        return out.logits[:, -1].to(dtype=torch.float32)

    def _select(self, logits: torch.Tensor) -> torch.Tensor:
        rule = self.rule
        if rule.eos and rule.min_new > 0:
            blocked = self.made < rule.min_new  # (1,) on the device
            logits[:, self.eos] = torch.where(blocked, float("-inf"), logits[:, self.eos])
        if rule.sampling is None:
            nxt = torch.argmax(logits, dim=-1)
        else:
            for warper in self._warpers:
                logits = warper(self.token, logits)
            probs = torch.nn.functional.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, num_samples=1).squeeze(1)
        if rule.eos:
            nxt = nxt * self.unfinished + rule.pad * (1 - self.unfinished)
            self.unfinished.mul_((~torch.isin(nxt, self.eos)).long())
        return nxt

    def _core(self, token: torch.Tensor, position: torch.Tensor, cache_position: torch.Tensor,
              mask: torch.Tensor) -> torch.Tensor:  # fmt: skip
        return self._select(self._forward(token, position, cache_position, mask))

    def _advance(self, nxt: torch.Tensor) -> None:
        self.out.index_copy_(1, self.made, nxt[:, None])
        self.token.copy_(nxt[:, None])
        self.position.add_(1)
        self.cache_position.add_(1)
        self.made.add_(1)

    def _eager_step(self) -> None:
        self._advance(self._core(self.token, self.position, self.cache_position, self.mask))

    def _compiled_step(self) -> None:
        self._advance(
            self._compiled(self, self.token, self.position, self.cache_position, self.mask)
        )

    # capture and replay --------------------------------------------------------------------
    def capture(self, warmups: int = 2) -> None:
        """Run the step ``warmups`` times on a side stream, then capture ``steps`` of it.

        The capture's cuBLAS workspace is its own, in its graph's pool
        (:func:`~tunetree.backends.graph_api.own_workspaces`), as a device-graph runner's is.

        The cache must hold a prefill (its layers initialised); the state the warm-ups and
        the capture advance is restored by the next :meth:`start`. Off CUDA nothing is
        captured and :meth:`replay` runs the steps one by one (the same computation).
        """
        if self.compiled:
            self._mark_batch_dynamic()
        if self.token.device.type != "cuda":
            return
        snapshot = self._positions()
        api = graph_api(self.token.device)
        # Every capture shares torch's capture stream: a cuBLAS workspace made inside one
        # capture would live in that graph's pool and be reused by the later ones, which
        # would write to freed memory once that graph is dropped and the workspaces are
        # cleared (Inductor's CUDA graph trees clear them). So each capture makes its own.
        with own_workspaces(api):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.no_grad(), _inductor_settings(self.compiled):
                for _ in range(warmups):  # the first compiles Inductor's step
                    self._step()
            torch.cuda.current_stream().wait_stream(stream)
            drop_workspaces(api)  # the warm-ups' side stream's, not the capture's
            self._restore(snapshot)
            graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(graph):
                for _ in range(self.shape.steps):
                    self._step()
        self._restore(snapshot)
        self.graph = graph

    def batch_tensors(self) -> list[torch.Tensor]:
        """The step's inputs whose first dimension is the batch (with the cache's tensors)."""
        found = [self.token, self.position, self.mask, self.unfinished]
        for layer in self._layers():
            found += [t for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                      if isinstance(t, torch.Tensor)]  # fmt: skip
        return found

    def _mark_batch_dynamic(self) -> None:
        """Above batch 1, lets the compiled step's batch dimension be symbolic.

        Batch 1 keeps its own specialised code (:func:`compiled_step`).
        """
        if self.shape.batch > 1:
            for tensor in self.batch_tensors():
                torch._dynamo.maybe_mark_dynamic(tensor, 0)

    def start(self, first: torch.Tensor, position: torch.Tensor, cache_position: int,
              mask: torch.Tensor) -> None:  # fmt: skip
        """Set the loop's state after a prefill made ``first`` (one token per row).

        Args:
            first: The prefill's token per row, shape (batch,).
            position: The next position id per row, shape (batch,).
            cache_position: Where the next token's keys go in the cache.
            mask: The prompt's attention mask, shape (batch, prompt length).
        """
        self.mask.fill_(1)
        self.mask[:, : mask.shape[1]].copy_(mask)
        self.unfinished.fill_(1)
        self.made.fill_(0)
        nxt = self._select_first(first)
        self._advance(nxt)
        self.position.copy_(position[:, None])
        self.cache_position.fill_(cache_position)
        self._set_cache_length(cache_position)

    def _select_first(self, first: torch.Tensor) -> torch.Tensor:
        """The prefill's token with the finished-row rule applied (it may be an EOS)."""
        nxt = first.to(self.token.dtype)
        if self.rule.eos:
            self.unfinished.mul_((~torch.isin(nxt, self.eos)).long())
        return nxt

    def replay(self) -> None:
        """Advance every row by ``steps`` tokens."""
        if self.graph is not None:
            self.graph.replay()
            return
        with torch.no_grad():
            for _ in range(self.shape.steps):
                self._step()

    def finished(self) -> bool:
        """Whether every row has made an end-of-sequence token (one device read)."""
        return bool(self.rule.eos) and not bool(self.unfinished.any())

    def tokens(self, count: int) -> torch.Tensor:
        """The first ``count`` new tokens per row."""
        return self.out[:, :count].clone()

    def finished_at(self) -> int | None:
        """How many new tokens ``generate`` keeps when every row has finished, else None."""
        if not self.rule.eos:
            return None
        made = int(self.made.item())
        hit = torch.isin(self.out[:, :made], self.eos).long()
        # a row is finished from its first EOS on; generate stops once all rows are
        first = torch.where(hit.any(dim=1), hit.argmax(dim=1), torch.full_like(hit[:, 0], made))
        last = int(first.max().item())
        return last + 1 if last < made else None

    # state ---------------------------------------------------------------------------------
    def _layers(self) -> Sequence[Any]:
        return list(getattr(self.cache, "layers", ()))

    def _positions(self) -> list[torch.Tensor]:
        tensors = [self.token, self.position, self.cache_position, self.unfinished, self.made]
        lengths = [getattr(layer, "cumulative_length", None) for layer in self._layers()]
        return [t.clone() for t in tensors] + [
            t.clone() for t in lengths if isinstance(t, torch.Tensor)
        ]

    def _restore(self, snapshot: list[torch.Tensor]) -> None:
        tensors = [self.token, self.position, self.cache_position, self.unfinished, self.made]
        lengths = [getattr(layer, "cumulative_length", None) for layer in self._layers()]
        targets = tensors + [t for t in lengths if isinstance(t, torch.Tensor)]
        for target, saved in zip(targets, snapshot, strict=True):
            target.copy_(saved)

    def _set_cache_length(self, length: int) -> None:
        for layer in self._layers():
            value = getattr(layer, "cumulative_length", None)
            if isinstance(value, torch.Tensor):
                value.fill_(length)


def compiled_step() -> Callable[..., torch.Tensor]:
    """Inductor's code for one decode step (:meth:`DecodeGraph._core`, the loop passed first).

    One callable serves every loop of a config: Dynamo keeps its compiled code with this
    callable, so a loop of a shape compiled before only captures its graph. Batch 1 compiles
    its own code (static sizes: each matmul becomes a tuned reduction fused with its
    neighbours); every batch above 1 shares one compile whose batch dimension is symbolic
    (:meth:`DecodeGraph._mark_batch_dynamic`). A dimension that differs between loops in
    another way (the cache's capacity) is made symbolic by Dynamo's automatic dynamic shapes
    on its second size, so a config compiles at most about twice, not once per loop.
    """
    return torch.compile(DecodeGraph._core, dynamic=None, fullgraph=False)


INDUCTOR_SETTINGS = {"coordinate_descent_tuning": True}
"""Inductor's settings while it compiles the step: coordinate-descent tuning of its kernels'
block sizes turns each batch-1 matmul into one tuned Triton kernel fused with its neighbours,
where the default settings call cuBLAS once per projection (a third fewer kernels and a
third less time per step on a 0.6B model in bf16; docs/measurements.md points to the run).
Patched for the compile only; torch's own settings are as the caller left them afterwards."""


def _inductor_settings(compiled: bool) -> contextlib.AbstractContextManager[Any]:
    if not compiled:
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config

    return inductor_config.patch(INDUCTOR_SETTINGS)


def _forward_keywords(model: Any) -> frozenset[str]:
    with contextlib.suppress(TypeError, ValueError):
        return frozenset(inspect.signature(model.forward).parameters)
    return frozenset()
