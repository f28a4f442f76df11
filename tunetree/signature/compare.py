"""Output comparison against eager, with per-dtype tolerances.

A candidate keeps results when, on every recorded sample, its output has the same
structure and container types as eager's, every tensor has the same dtype and shape,
every non-tensor leaf is equal, and every floating-point element satisfies
``|candidate - eager| <= atol + rtol * |eager|`` (NaN only where eager has NaN).
Integer and boolean tensors must be equal.

Default tolerances (see :data:`DEFAULT_TOLERANCES`) admit the reordering of
floating-point reductions that fused or compiled kernels do, and reject reduced
precision: bf16 arithmetic on a float32 model differs from eager by about 1e-2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..hf import ObjectState, to_data
from .graph import dtype_name, flatten


@dataclass(frozen=True)
class Tolerance:
    """Allowed difference ``atol + rtol * |reference|`` for one dtype.

    Args:
        atol: Absolute part.
        rtol: Relative part, times the reference's magnitude.

    Example:
        >>> import tunetree as tt
        >>> tt.Tolerance(atol=1e-4, rtol=1e-3)
        Tolerance(atol=0.0001, rtol=0.001)
    """

    atol: float
    rtol: float


DEFAULT_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(atol=1e-7, rtol=1e-6),
    torch.float32: Tolerance(atol=1e-4, rtol=1e-3),
    torch.float16: Tolerance(atol=1e-2, rtol=1e-2),
    torch.bfloat16: Tolerance(atol=2e-2, rtol=2e-2),
}


@dataclass(frozen=True)
class Tolerances:
    """Per-dtype tolerances a candidate's outputs are compared with eager's under.

    The defaults are the README's table (float32: ``atol=1e-4``, ``rtol=1e-3``);
    ``Tolerances.uniform(atol, rtol)`` sets one for every float dtype, e.g. for an opt-in
    reduced-precision candidate whose error the user accepts. Pass as ``tolerances=``.

    Args:
        by_dtype: A :class:`Tolerance` per floating dtype.

    Example:
        >>> import torch, tunetree as tt
        >>> tt.Tolerances.uniform(1e-2, 1e-2).by_dtype[torch.float32]
        Tolerance(atol=0.01, rtol=0.01)
    """

    by_dtype: Mapping[torch.dtype, Tolerance] = field(
        default_factory=lambda: dict(DEFAULT_TOLERANCES)
    )

    @classmethod
    def uniform(cls, atol: float, rtol: float) -> Tolerances:
        """The same tolerance for every float dtype."""
        tol = Tolerance(atol, rtol)
        return cls({dt: tol for dt in DEFAULT_TOLERANCES})

    def for_dtype(self, dtype: torch.dtype) -> Tolerance:
        """The tolerance for ``dtype``; exact (``atol = rtol = 0``) for a dtype without one."""
        return self.by_dtype.get(dtype, Tolerance(0.0, 0.0))

    def to_json(self) -> dict[str, dict[str, float]]:
        """Tolerances by dtype name, as JSON data."""
        return {dtype_name(dt): {"atol": t.atol, "rtol": t.rtol} for dt, t in self.by_dtype.items()}


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing a candidate's outputs with eager's."""

    ok: bool
    max_abs_diff: float = 0.0
    reason: str = ""

    def __str__(self) -> str:
        return "match" if self.ok else self.reason


def structure_difference(candidate: Any, reference: Any, where: str = "output") -> str:
    """Where two pytree specs first differ, and how, in a bounded line (not both whole specs).

    A whole spec of a model output holding a cache runs to a screen of text per row, and a
    node's context cut to a prefix may end before the part that differs; so the reason names
    the first differing node, the first differing part of its context (a dict key, a cache
    layer's constant) and both sides' values there.
    """
    if candidate.type is not reference.type:
        return f"at {where}: {_spec_node(candidate)} vs eager {_spec_node(reference)}"
    if candidate.context != reference.context:
        return f"at {where}: {_context_difference(candidate, reference)}"
    if candidate.num_children != reference.num_children:
        name = getattr(candidate.type, "__name__", str(candidate.type))
        return (
            f"at {where}: {name} ({candidate.num_children} children) "
            f"vs eager {name} ({reference.num_children} children)"
        )
    context = candidate.context
    named = (
        isinstance(context, list | tuple)
        and len(context) == candidate.num_children
        and all(isinstance(c, str) for c in context)
    )
    if candidate.type is ObjectState:
        named, context = True, context[1]  # the layer's data attribute names
    for i in range(candidate.num_children):
        mine, theirs = candidate.child(i), reference.child(i)
        if mine != theirs:
            label = f".{context[i]}" if named else f"[{i}]"
            return structure_difference(mine, theirs, f"{where}{label}")
    return f"at {where}"


_STATE_PARTS = ("class", "data attributes", "constant", "sizes taken from tensors", "carried")
"""What each part of an :class:`ObjectState` node's context holds (see ``hf.caches``)."""

MAX_VALUE_TEXT = 60
"""Most characters of each side's value a structure difference shows."""


def _context_difference(candidate: Any, reference: Any) -> str:
    """The first part of two nodes' contexts that differs, with both sides' values there."""
    mine, theirs = candidate.context, reference.context
    name = getattr(candidate.type, "__name__", str(candidate.type))
    if candidate.type is ObjectState and len(mine) == len(theirs) == len(_STATE_PARTS):
        name = getattr(mine[0], "__name__", str(mine[0]))
        for part, a, b in zip(_STATE_PARTS, mine, theirs, strict=True):
            if a == b:
                continue
            if part == "constant":
                return f"{name} {_first_difference(dict(a), dict(b), part)}"
            return f"{name} {_first_difference(a, b, part)}"
    label = (
        "keys"
        if isinstance(candidate.type, type) and issubclass(candidate.type, dict)
        else "context"
    )
    return f"{name} {_first_difference(mine, theirs, label)}"


def _first_difference(mine: Any, theirs: Any, label: str) -> str:
    """``label``, narrowed to the first item where ``mine`` and ``theirs`` differ, and both."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for k in [*mine, *(k for k in theirs if k not in mine)]:
            if k not in theirs or k not in mine or not _same(mine[k], theirs[k]):
                return _first_difference(
                    mine.get(k, _ABSENT), theirs.get(k, _ABSENT), f"{label} {str(k)[:60]}"
                )
    if isinstance(mine, list | tuple) and isinstance(theirs, list | tuple):
        for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
            if not _same(a, b):
                return _first_difference(a, b, f"{label}[{i}]")
        if len(mine) != len(theirs):
            i = min(len(mine), len(theirs))
            a = mine[i] if i < len(mine) else _ABSENT
            b = theirs[i] if i < len(theirs) else _ABSENT
            return _first_difference(a, b, f"{label}[{i}] (of {len(mine)} vs eager {len(theirs)})")
    text_a, text_b = _differing_texts(_value_text(mine), _value_text(theirs))
    return f"{label}: {text_a} vs eager {text_b}"


class _Absent:
    def __repr__(self) -> str:
        return "absent"


_ABSENT = _Absent()


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:  # a value whose == is not a bool (a tensor): unequal
        return False


def _value_text(value: Any) -> str:
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, torch.Tensor):
        return f"tensor {dtype_name(value.dtype)}{list(value.shape)}"
    return repr(value)


def _differing_texts(a: str, b: str) -> tuple[str, str]:
    """Both texts cut to :data:`MAX_VALUE_TEXT` around where they first differ."""
    if len(a) <= MAX_VALUE_TEXT and len(b) <= MAX_VALUE_TEXT:
        return a, b
    shorter = min(len(a), len(b))
    common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), shorter)
    start = max(0, common - MAX_VALUE_TEXT // 3)

    def cut(text: str) -> str:
        part = text[start : start + MAX_VALUE_TEXT]
        return (
            ("..." if start else "") + part + ("..." if start + MAX_VALUE_TEXT < len(text) else "")
        )

    return cut(a), cut(b)


def _spec_node(spec: Any) -> str:
    """A pytree node's type and context, shortened."""
    if spec.is_leaf():
        return "a leaf"
    name = getattr(spec.type, "__name__", str(spec.type))
    context = str(spec.context)
    context = context if len(context) <= 120 else context[:117] + "..."
    return f"{name} {context} ({spec.num_children} children)"


def compare(reference: Any, candidate: Any, tolerances: Tolerances | None = None) -> Comparison:
    """Compare one output with eager's output of the same call."""
    tolerances = tolerances or Tolerances()
    ref_leaves, ref_spec = flatten(reference)
    cand_leaves, cand_spec = flatten(candidate)
    if ref_spec != cand_spec:
        return Comparison(
            False, math.inf, f"output structure differs {structure_difference(cand_spec, ref_spec)}"
        )
    worst = 0.0
    for i, (ref, cand) in enumerate(zip(ref_leaves, cand_leaves, strict=True)):
        if isinstance(ref, torch.Tensor) != isinstance(cand, torch.Tensor):
            return Comparison(
                False, math.inf, f"output {_name(reference, i)}: tensor vs non-tensor"
            )
        if not isinstance(ref, torch.Tensor):
            if ref is not cand and ref != cand:
                return Comparison(False, math.inf, _constant_reason(_name(reference, i), ref, cand))
            continue
        if ref.dtype != cand.dtype or ref.shape != cand.shape:
            return Comparison(
                False,
                math.inf,
                f"output {_name(reference, i)}: {dtype_name(cand.dtype)}{list(cand.shape)} "
                f"vs eager {dtype_name(ref.dtype)}{list(ref.shape)}",
            )
        ok, diff = _close(ref, cand.to(ref.device), tolerances.for_dtype(ref.dtype))
        worst = max(worst, diff)
        if not ok:
            tol = tolerances.for_dtype(ref.dtype)
            return Comparison(
                False,
                worst,
                f"output {_name(reference, i)} differs from eager: "
                f"max abs diff {_diff_text(ref, diff)}"
                f"{_where(ref, cand.to(ref.device))} "
                f"(tolerance {dtype_name(ref.dtype)} atol={tol.atol:g} rtol={tol.rtol:g})",
            )
    return Comparison(True, worst)


def _diff_text(ref: torch.Tensor, diff: float) -> str:
    """``diff`` as the report shows it: a whole number for integer and bool outputs."""
    if not (ref.is_floating_point() or ref.is_complex()) and math.isfinite(diff):
        return str(int(diff))
    return f"{diff:.3g}"


def _name(tree: Any, index: int) -> str:
    """A readable name of leaf ``index`` of an output: ``0``, ``logits``, ``cache.layers[1].keys``.

    Computed only for a reason, so comparisons that pass never pay for it.
    """
    with_paths, _ = pytree.tree_flatten_with_path(to_data(tree))
    if len(with_paths) <= index or not with_paths[index][0]:
        return str(index)
    parts = []
    for key in with_paths[index][0]:
        if isinstance(key, pytree.MappingKey) and isinstance(key.key, str):
            parts.append(f".{key.key}")
        elif isinstance(key, pytree.GetAttrKey):
            parts.append(f".{key.name}")
        else:
            parts.append(str(key))
    return "".join(parts).lstrip(".")


def _where(ref: torch.Tensor, cand: torch.Tensor) -> str:
    """`` at [i, j, ...]``: the index of the largest difference (padding shows up here)."""
    if ref.dim() == 0:
        return ""
    if ref.is_floating_point() or ref.is_complex():
        diff = torch.nan_to_num((ref.double() - cand.double()).abs(), nan=math.inf)
    else:
        diff = _integer_gaps(ref, cand).reshape(ref.shape)
    index = torch.unravel_index(diff.argmax(), ref.shape)
    return " at [" + ", ".join(str(int(i)) for i in index) + "]"


def _constant_reason(name: str, ref: Any, cand: Any) -> str:
    """Why two non-tensor leaves differ; an object tunetree cannot look into is named by type."""
    plain = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)
    if isinstance(ref, plain) and isinstance(cand, plain):
        return f"output {name}: {cand!r} != eager {ref!r}"
    return (
        f"output {name} is a {type(ref).__qualname__} object, which tunetree cannot compare (not "
        "a tensor, a container of tensors or a known cache object): no candidate can be checked"
    )


_CHUNK = 1 << 22
"""Elements compared at once: the float64 temporaries of one comparison stay near 200 MiB
whatever the output's size (a prefill's logits over a 150k vocabulary are gigabytes in float64)."""


def _close(ref: torch.Tensor, cand: torch.Tensor, tol: Tolerance) -> tuple[bool, float]:
    """Whether ``cand`` is within ``tol`` of ``ref`` everywhere, and the largest difference.

    Compared chunk by chunk in float64, so the memory it takes is bounded.
    """
    if ref.numel() == 0:
        return True, 0.0
    if not (ref.is_floating_point() or ref.is_complex()):
        equal = bool(torch.equal(ref, cand))
        return equal, 0.0 if equal else _integer_diff(ref, cand)
    flat_ref, flat_cand = ref.reshape(-1), cand.reshape(-1)
    ok, worst = True, 0.0
    for start in range(0, flat_ref.numel(), _CHUNK):
        part_ok, diff = _close_part(
            flat_ref[start : start + _CHUNK], flat_cand[start : start + _CHUNK], tol
        )
        if not math.isfinite(diff):
            return False, math.inf
        ok, worst = ok and part_ok, max(worst, diff)
    return ok, worst


def _integer_diff(ref: torch.Tensor, cand: torch.Tensor) -> float:
    """The largest absolute difference of two integer (or bool) tensors, exact as an integer.

    Found in float64 (a counter differing by 2 is 2, not inf), then taken again at that index
    with Python integers, so a difference past float64's precision is still exact.
    """
    index = int(_integer_gaps(ref, cand).argmax())
    flat_ref, flat_cand = ref.reshape(-1), cand.reshape(-1)
    return float(abs(int(flat_ref[index]) - int(flat_cand[index])))


def _integer_gaps(ref: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Absolute differences of two integer (or bool) tensors in float64, flattened."""
    return (ref.reshape(-1).to(torch.float64) - cand.reshape(-1).to(torch.float64)).abs()


def _close_part(ref: torch.Tensor, cand: torch.Tensor, tol: Tolerance) -> tuple[bool, float]:
    """:func:`_close` on one chunk: NaNs must match, infinities be equal, the rest within tol."""
    ref64, cand64 = ref.double(), cand.double()
    nan_ref, nan_cand = torch.isnan(ref64), torch.isnan(cand64)
    if not torch.equal(nan_ref, nan_cand):
        return False, math.inf
    ref64 = torch.where(nan_ref, 0.0, ref64)
    cand64 = torch.where(nan_cand, 0.0, cand64)
    inf_ref = torch.isinf(ref64)
    if not torch.equal(ref64[inf_ref], cand64[inf_ref]):
        return False, math.inf
    ref64 = torch.where(inf_ref, 0.0, ref64)
    cand64 = torch.where(inf_ref, 0.0, cand64)
    diff = (ref64 - cand64).abs()
    max_diff = float(diff.max())
    if not math.isfinite(max_diff):
        return False, math.inf
    ok = bool((diff <= tol.atol + tol.rtol * ref64.abs()).all())
    return ok, max_diff


def compare_all(
    references: list[Any], candidates: list[Any], tolerances: Tolerances | None = None
) -> Comparison:
    """Compare outputs of every recorded sample; the first mismatch decides."""
    worst = 0.0
    for i, (ref, cand) in enumerate(zip(references, candidates, strict=True)):
        result = compare(ref, cand, tolerances)
        if not result.ok:
            prefix = f"sample {i}: " if len(references) > 1 else ""
            return Comparison(False, result.max_abs_diff, prefix + result.reason)
        worst = max(worst, result.max_abs_diff)
    return Comparison(True, worst)
