"""Recorded calls as bytes and back: what a later process needs to check a cached plan.

A record holds the calls the JIT tuned on and the plan it kept (depth, each graph's backend,
the speed-up measured: :class:`~tunetree.search.recorded.RecordedPlan`), so that a second
process with the same model and cache keys the very same graphs (same signatures, same ranges)
and loads that plan's runners from the cache, each checked against eager, nothing built or
measured (:func:`~tunetree.search.recorded.load_recorded`). Layout: an 8-byte
little-endian length, a JSON description of every call's arguments (tensors named by index),
of the key the record was made for and of the plan, then one safetensors blob of the tensors.
A malformed plan refuses the record like any malformed field. Nothing is
pickled: reading runs no code, and a record describing another key is refused (a record copied
or moved under another model's name is never taken for that model's calls).

Storable arguments: tensors (dense, strided), ``None``, booleans, ints, floats, strings,
``torch.dtype`` constants, and tuples, lists and string-keyed dicts of these. A call holding
anything else (a Hugging Face cache object, a config) is not stored (:class:`Unstorable`);
the JIT then tunes again in every process.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from .._util.json_io import loads_bounded
from ..errors import CacheError, TunetreeError
from ..search.recorded import RecordedPlan, RecordedPlanError
from ..signature.graph import Sample

MAX_DEPTH = 64
"""The deepest depth a calls record may name."""

SCHEMA = 2
MAX_DESCRIPTION_BYTES = 4 << 20
"""Largest JSON description read (a few hundred bytes per call)."""
MAX_CALLS = 4096
MAX_LEAVES = 1 << 16
"""Most arguments (of every call together) a record may describe."""


class Unstorable(TunetreeError):
    """A recorded call holds an argument that a record cannot hold; names its type."""


class MalformedCallsError(CacheError):
    """A calls record is truncated, forged or not shaped as this release writes it."""


def encode_calls(
    samples: list[Sample], key: str, depth: int | None = None, plan: RecordedPlan | None = None
) -> bytes:
    """The bytes of ``samples`` recorded under ``key`` (see the module docstring).

    ``depth``: the depth the plan tuned on them kept, so that a later process loads that
    depth's graphs from the cache without searching the others again. ``plan``: that plan
    itself (its graphs' backends), so that a later process loads exactly it, measuring nothing.

    Raises:
        Unstorable: a call holds an argument a record cannot hold.
    """
    tensors: dict[str, torch.Tensor] = {}

    def encode(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided or value.is_quantized:
                raise Unstorable(f"a {value.layout} tensor")
            name = str(len(tensors))
            tensors[name] = value.detach().to("cpu").contiguous()
            return {"tensor": name}
        if value is None or isinstance(value, bool | int | float | str):
            return {"value": value}
        if isinstance(value, torch.dtype):
            return {"dtype": str(value).removeprefix("torch.")}
        if isinstance(value, tuple | list) and type(value) in (tuple, list):
            return {type(value).__name__: [encode(v) for v in value]}
        if type(value) is dict and all(isinstance(k, str) for k in value):
            return {"dict": [[k, encode(v)] for k, v in value.items()]}
        raise Unstorable(f"an argument of type {type(value).__qualname__}")

    calls = [{"args": encode(tuple(s.args)), "kwargs": encode(dict(s.kwargs))} for s in samples]
    record: dict[str, Any] = {"schema": SCHEMA, "key": key, "calls": calls}
    if depth is not None:
        record["depth"] = depth
    if plan is not None:
        record["plan"] = plan.to_json()
    description = json.dumps(record, separators=(",", ":")).encode()
    blob = save_tensors(tensors) if tensors else b""
    return struct.pack("<Q", len(description)) + description + blob


def decode_calls(data: bytes, key: str, device: torch.device | str = "cpu") -> list[Sample]:
    """The calls in ``data``, recorded under ``key``, their tensors on ``device``.

    See :func:`decode_record` (which also returns the depth recorded with them).
    """
    return decode_record(data, key, device)[0]


def decode_record(
    data: bytes, key: str, device: torch.device | str = "cpu"
) -> tuple[list[Sample], int | None, RecordedPlan | None]:
    """The calls in ``data``, recorded under ``key``, their tensors on ``device``; depth; plan.

    The depth and the plan recorded with the calls are None where the record holds none.

    Bounded: the description's size, nesting, call and argument counts; every tensor named
    must exist in the blob; only the listed leaf kinds are accepted.

    Raises:
        MalformedCallsError: the bytes are not such a record, or it was made for another key.
    """
    if len(data) < 8:
        raise MalformedCallsError("the calls record is truncated")
    (length,) = struct.unpack("<Q", data[:8])
    if length > min(MAX_DESCRIPTION_BYTES, len(data) - 8):
        raise MalformedCallsError(f"the calls record declares a description of {length} bytes")
    try:
        parsed = loads_bounded(data[8 : 8 + length], MAX_DESCRIPTION_BYTES)
        blob = data[8 + length :]
        tensors = load_tensors(blob) if blob else {}
    except Exception as exc:  # JSON or safetensors refused the bytes
        raise MalformedCallsError(f"the calls record cannot be read: {exc}") from exc
    if not isinstance(parsed, dict) or parsed.get("schema") != SCHEMA:
        raise MalformedCallsError("the calls record is of another schema")
    if parsed.get("key") != key:
        raise MalformedCallsError("the calls record was made for another model or key")
    calls = parsed.get("calls")
    if not isinstance(calls, list) or not 0 < len(calls) <= MAX_CALLS:
        raise MalformedCallsError("the calls record holds no list of calls (or too many)")
    reader = _Reader(tensors, device)
    samples = []
    for call in calls:
        if not isinstance(call, dict):
            raise MalformedCallsError("a call is not an object")
        args, kwargs = reader.read(call.get("args")), reader.read(call.get("kwargs"))
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise MalformedCallsError("a call's arguments are not a tuple and a dict")
        samples.append(Sample(args, kwargs))
    depth = parsed.get("depth")
    if depth is not None and (
        not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth <= MAX_DEPTH
    ):
        raise MalformedCallsError(f"the calls record's depth is not a depth: {depth!r}")
    return samples, depth, _plan(parsed.get("plan"), depth)


def _plan(data: Any, depth: int | None) -> RecordedPlan | None:
    """The plan a calls record holds (None: none), checked to be of the record's depth."""
    if data is None:
        return None
    if depth is None:
        raise MalformedCallsError("the calls record holds a plan but no depth")
    try:
        return RecordedPlan.from_json(data, "the calls record's plan", depth)
    except RecordedPlanError as exc:
        raise MalformedCallsError(str(exc)) from exc


class _Reader:
    """Turns one description back into values, counting leaves."""

    def __init__(self, tensors: dict[str, torch.Tensor], device: torch.device | str) -> None:
        self.tensors = tensors
        self.device = device
        self.leaves = 0

    def read(self, node: Any) -> Any:
        self.leaves += 1
        if self.leaves > MAX_LEAVES:
            raise MalformedCallsError(f"the calls record describes more than {MAX_LEAVES} values")
        if not isinstance(node, dict) or len(node) != 1:
            raise MalformedCallsError("an argument is not described as one tagged value")
        ((tag, body),) = node.items()
        if tag == "tensor":
            if not isinstance(body, str) or body not in self.tensors:
                raise MalformedCallsError(f"an argument names a missing tensor {body!r}")
            return self.tensors[body].to(self.device)
        if tag == "value":
            if body is not None and not isinstance(body, bool | int | float | str):
                raise MalformedCallsError("a constant argument is not a plain value")
            return body
        if tag == "dtype":
            dtype = getattr(torch, body, None) if isinstance(body, str) else None
            if not isinstance(dtype, torch.dtype):
                raise MalformedCallsError(f"{body!r} is not a torch dtype")
            return dtype
        if tag in ("tuple", "list") and isinstance(body, list):
            items = [self.read(v) for v in body]
            return tuple(items) if tag == "tuple" else items
        if tag == "dict" and isinstance(body, list):
            return self._mapping(body)
        raise MalformedCallsError(f"an argument has the unknown tag {tag!r}")

    def _mapping(self, body: list[Any]) -> dict[str, Any]:
        out = {}
        for pair in body:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise MalformedCallsError("a keyword argument is not a [name, value] pair")
            out[pair[0]] = self.read(pair[1])
        return out
