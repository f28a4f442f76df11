"""``generate`` served by :class:`~.multistep.DecodeGraph` loops, or handed back with a reason.

:class:`MultiStepGenerate` stands in for a model's ``generate``. A call it can serve exactly
(greedy search, the usual stopping by length and end-of-sequence token, the minimum-length
processors, token ids in and token ids out) runs the prefill through Hugging Face's own
``generate`` for one new token (the same kernels and cache as the caller's call, so the first
token is eager's), copies the prompt's keys and values into the loop's static cache, and
replays the captured decode steps. Any other call runs the original ``generate``, counted with
its reason (:attr:`MultiStepGenerate.counts`).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..signature.modules import private_copy
from .multistep import DecodeGraph, LoopShape, StopRule, _forward_keywords, compiled_step

log = logging.getLogger(__name__)

CAPACITY_STEP = 256
"""Static cache capacities are rounded up to a multiple of this: one loop serves many lengths."""

_SERVED_KEYWORDS = frozenset(
    {"input_ids", "attention_mask", "max_new_tokens", "min_new_tokens", "max_length",
     "min_length", "do_sample", "pad_token_id", "eos_token_id", "cache_implementation",
     "disable_compile", "use_cache", "num_beams", "generation_config"}
)  # fmt: skip
"""Keywords a served call may carry; any other sends the call to the original ``generate``."""

_NEUTRAL = {
    "num_beams": 1,
    "num_beam_groups": 1,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "force_words_ids": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "renormalize_logits": False,
    "max_time": None,
    "stop_strings": None,
    "return_dict_in_generate": False,
    "output_scores": False,
    "output_logits": False,
    "output_attentions": False,
    "output_hidden_states": False,
    "penalty_alpha": None,
    "guidance_scale": None,
    "watermarking_config": None,
    "assistant_early_exit": None,
    "prompt_lookup_num_tokens": None,
    "dola_layers": None,
    "num_return_sequences": 1,
    "token_healing": False,
}
"""Generation settings with these values (or unset) leave greedy search as the loop computes it."""


_SAMPLING_ONLY = frozenset(
    {"temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
     "top_h"}
)  # fmt: skip
"""Settings that only sampling reads: greedy search ignores them, as ``generate`` does."""

_SAMPLING_NEUTRAL = {"typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None}
"""Sampling warpers the loop does not run: a sampled call must leave them at these values."""


@dataclass(frozen=True)
class MultiStepConfig:
    """How the decode loop is built: steps per replay, kernels, and the step's attention."""

    steps: int = 16
    compiled: bool = False
    attention: str | None = None
    """None: the model's own. Else Hugging Face's name of another (``"eager"``: matmuls and a
    softmax, which Inductor fuses into fewer kernels than a fused attention kernel takes at
    batch 1); the step then runs a private copy of the model (parameters shared, its own
    config), so the user's model keeps its setting."""

    @property
    def label(self) -> str:
        """The config's name in tables."""
        kind = "Inductor step" if self.compiled else "eager kernels"
        attention = f", {self.attention} attention" if self.attention else ""
        return f"{self.steps} steps/replay, {kind}{attention}"


@dataclass
class Plan:
    """One call the loop serves: its prompt, rule and sizes."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    max_new: int
    rule: StopRule
    static: bool
    """The caller asked for a static cache (the prefill runs on one as theirs would)."""
    config: Any = None
    """The call's generation config, resolved as ``generate`` resolves it."""


@dataclass
class Counts:
    """Calls served by the loop and calls handed to the original ``generate``, with reasons."""

    served: int = 0
    original: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


class MultiStepGenerate:
    """A model's ``generate`` whose greedy calls replay several decode steps per graph."""

    save_refusal = (
        "generate is served by the multi-step decode loop, which a .tt file does not hold yet; "
        "keep the serving process, or tune with auto_tune(savable=True)"
    )

    def __init__(self, model: Any, original: Callable[..., Any], config: MultiStepConfig) -> None:
        self.model, self.original, self.config = model, original, config
        self.step_model = model if config.attention is None else _with_attention(model, config)
        """What the decode step runs: the model, or its private copy with another attention."""
        self.loops: dict[tuple[int, int], DecodeGraph] = {}
        self.step = compiled_step() if config.compiled else None
        """The compiled step every loop of this config shares (None for eager's kernels)."""
        self.counts = Counts()
        self._lock = threading.Lock()
        self._cache_keyword = _cache_keyword(model)  # read once, not per call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``generate(*args, **kwargs)``: served by the loop when it can, else the original."""
        plan, reason = self.plan(args, kwargs)
        if plan is not None and plan.input_ids.device.type != "cuda":
            plan, reason = None, "not on a CUDA device"
        if plan is None:
            self.counts.original += 1
            self.counts.reasons[reason] += 1
            return self.original(*args, **kwargs)
        out = self.serve(plan)
        self.counts.served += 1
        return out

    # which calls ---------------------------------------------------------------------------
    def plan(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Plan | None, str]:
        """The call as a :class:`Plan`, or None and why the loop cannot serve it."""
        if args:
            if len(args) > 1 or "input_ids" in kwargs:
                return None, "positional arguments beyond input_ids"
            kwargs = {"input_ids": args[0], **kwargs}
        extra = sorted(set(kwargs) - _SERVED_KEYWORDS - set(_NEUTRAL) - _SAMPLING_ONLY)
        if extra:
            return None, f"keywords the loop does not serve: {', '.join(extra)}"
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
            return None, "no input_ids matrix"
        if ids.device != next(self.model.parameters()).device:
            return None, "input_ids not on the model's device"
        mask = torch.ones_like(ids) if mask is None else mask
        if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
            return None, "attention_mask is not the shape of input_ids"
        settings = {k: v for k, v in kwargs.items() if k not in ("input_ids", "attention_mask")}
        config, static, reason = self._settings(settings)
        if config is None:
            return None, reason
        new = config.max_new_tokens
        new = int(config.max_length) - ids.shape[1] if new is None else int(new)
        if new < 2:
            return None, "fewer than two new tokens"
        rule = _rule(config, ids.shape[1])
        return Plan(ids, mask.to(torch.long), new, rule, static, config), ""

    def _settings(self, settings: dict[str, Any]) -> tuple[Any, bool, str]:
        """The call's resolved generation config, whether it asks for a static cache, or why not.

        Resolved as ``generate`` resolves it: the model's config, then the library's
        defaults, then the call's settings.
        """
        given = settings.pop("generation_config", None)
        settings.pop("disable_compile", None)
        if settings.pop("use_cache", True) is False:
            return None, False, "use_cache=False"
        prepare = getattr(self.model, "_prepare_generation_config", None)
        if prepare is None:
            return None, False, "this transformers has no _prepare_generation_config"
        try:
            config, left = prepare(copy.deepcopy(given), **settings)
        except (TypeError, ValueError) as exc:
            return None, False, f"generation settings: {exc}"
        if left:
            return None, False, f"keywords the loop does not serve: {', '.join(sorted(left))}"
        cache = getattr(config, "cache_implementation", None)
        if cache not in (None, "static", "dynamic"):
            return None, False, f"cache_implementation={cache!r}"
        for name, neutral in _NEUTRAL.items():
            value = getattr(config, name, neutral)
            if value is not None and value != neutral and value not in ((), []):
                return (
                    None,
                    False,
                    f"{name}={value!r} (greedy search or sampling, length and EOS stops only)",
                )
        if config.do_sample:
            for name, neutral in _SAMPLING_NEUTRAL.items():
                value = getattr(config, name, None)
                if value is not None and value != neutral:
                    return (
                        None,
                        False,
                        f"{name}={value!r} (sampling with temperature, top-k, "
                        "top-p and min-p only)",
                    )
        return config, cache == "static", ""

    # serving -------------------------------------------------------------------------------
    def loop_for(self, plan: Plan) -> DecodeGraph:
        """The captured loop for the plan's batch and capacity (built on first use)."""
        batch, prompt = plan.input_ids.shape
        steps = self.config.steps
        capacity = _round_up(prompt + plan.max_new + steps, CAPACITY_STEP)
        key = (batch, capacity)
        loop = self.loops.get(key)
        if loop is None or loop.rule != plan.rule or loop.max_new < plan.max_new:
            loop = DecodeGraph(
                self.step_model,
                LoopShape(batch, capacity, steps),
                plan.rule,
                max_new=max(plan.max_new, loop.max_new if loop else 0),
                compiled=self.config.compiled,
                step=self.step,
            )
            devices = [loop.token.device] if loop.token.device.type == "cuda" else []
            started = time.perf_counter()
            with torch.random.fork_rng(devices=devices):  # building draws none of the caller's
                self._prefill(loop, plan)
                loop.capture()
            self.loops[key] = loop
            log.debug(
                "decode loop (%s) captured for batch %d, capacity %d in %.1f s",
                self.config.label, batch, capacity, time.perf_counter() - started,
            )  # fmt: skip
        return loop

    def serve(self, plan: Plan) -> torch.Tensor:
        """``generate``'s output for a plan: the prompt followed by the new tokens."""
        with self._lock, torch.no_grad():
            return self._serve(plan)

    def _serve(self, plan: Plan) -> torch.Tensor:
        loop = self.loop_for(plan)
        first = self._prefill(loop, plan)
        prompt = plan.input_ids.shape[1]
        loop.start(first, plan.attention_mask.sum(dim=1), prompt, plan.attention_mask)
        steps = self.config.steps
        made = 1
        while made < plan.max_new:
            if plan.rule.eos and loop.finished():
                break
            loop.replay()
            made += steps
        count = min(made, plan.max_new)
        stop = loop.finished_at()
        if stop is not None:
            count = min(count, stop)
        return torch.cat([plan.input_ids, loop.tokens(count)], dim=1)

    def _prefill(self, loop: DecodeGraph, plan: Plan) -> torch.Tensor:
        """Hugging Face's prefill for one token; the prompt's states left in the loop's cache.

        It runs ``generate`` with the call's own resolved settings, so the first token is
        chosen (and, sampling, drawn from torch's generator) exactly as the caller's would be.
        """
        config = copy.deepcopy(plan.config)
        config.max_new_tokens, config.max_length = 1, None
        config.min_new_tokens = 1 if plan.rule.min_new > 0 else None
        config.min_length = None
        config.pad_token_id = plan.rule.pad
        config.return_dict_in_generate = True
        cache = loop.cache
        for layer in getattr(cache, "layers", ()):
            if getattr(layer, "is_initialized", False):
                layer.reset()
        extra: dict[str, Any] = {}
        if plan.static:  # the loop's own static cache stands for the one the call asked for
            config.cache_implementation = None
            extra = {self._cache_keyword: cache, "disable_compile": True}
        out = self.original(
            input_ids=plan.input_ids, attention_mask=plan.attention_mask,
            generation_config=config, **extra,
        )  # fmt: skip
        if not plan.static:
            _copy_into(out.past_key_values, cache, plan.input_ids.shape[1])
        return out.sequences[:, -1]


def _with_attention(model: Any, config: MultiStepConfig) -> Any:
    """A private copy of ``model`` (parameters shared) running ``config.attention``."""
    twin = private_copy(model)
    setter = getattr(twin, "set_attn_implementation", None)
    if setter is None:
        raise ValueError("this transformers cannot set a model's attention implementation")
    setter(config.attention)
    return twin


def _rule(config: Any, prompt: int) -> StopRule:
    """``generate``'s stopping and padding for a resolved generation config."""
    min_new = max(int(config.min_new_tokens or 0), int(config.min_length or 0) - prompt)
    eos = config.eos_token_id
    listed = eos if isinstance(eos, (list, tuple)) else [eos]
    eos_ids = tuple(int(e) for e in listed if e is not None)
    pad = config.pad_token_id
    pad = int(pad) if pad is not None else (eos_ids[0] if eos_ids else 0)
    return StopRule(eos=eos_ids, pad=pad, min_new=min_new, sampling=_sampling(config))


def _sampling(config: Any) -> tuple[tuple[str, float], ...] | None:
    """The warpers ``generate`` applies before sampling, in its order (None: greedy)."""
    if not config.do_sample:
        return None
    found: list[tuple[str, float]] = []
    if config.temperature is not None and config.temperature != 1.0:
        found.append(("temperature", float(config.temperature)))
    if config.top_k is not None and config.top_k != 0:
        found.append(("top_k", float(config.top_k)))
    if config.top_p is not None and config.top_p < 1.0:
        found.append(("top_p", float(config.top_p)))
    if config.min_p is not None:
        found.append(("min_p", float(config.min_p)))
    return tuple(found)


def _copy_into(source: Any, target: Any, length: int) -> None:
    """Write a dynamic cache's first ``length`` positions into a static cache's layers."""
    for layer, into in zip(source.layers, target.layers, strict=True):
        keys, values = layer.keys[:, :, :length], layer.values[:, :, :length]
        if not into.is_initialized:
            into.lazy_initialization(keys, values)
        into.keys.zero_()
        into.values.zero_()
        into.keys[:, :, :length].copy_(keys)
        into.values[:, :, :length].copy_(values)
        if isinstance(getattr(into, "cumulative_length", None), torch.Tensor):
            into.cumulative_length.fill_(length)


def _cache_keyword(model: Any) -> str:
    """``cache`` where the model's forward takes it (newer transformers), else the older name."""
    return "cache" if "cache" in _forward_keywords(model) else "past_key_values"


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step
