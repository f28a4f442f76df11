"""What a tuning-cache entry is keyed by, and the environment it was measured in.

An entry's key is a hash of everything that determines its result:

* the module's structure (:func:`module_structure`): class, the identity of its code (the
  bytecode of the methods its own classes define, and of same-module helper functions they
  call), simple attributes (``eps``, ``norm_first``...), parameter and buffer names, shapes
  and dtypes (not their values: a loaded runner is re-validated against eager instead),
  forward hooks, and recursively every child's structure, so a changed child changes the
  structure of every ancestor;
* the module's path in the model: identical layers (``layers.0``, ``layers.1``) have the
  same structure but other weights, and a runner that bakes weights in (OpenVINO, ONNX)
  serves only one of them, so each path has its own entry;
* the graph (input structure, dtypes, shapes, constants);
* the strategy: its type and options, and every candidate backend's kind and config;
* the tolerances candidates are checked with (and an accuracy budget's module limit);
* the *hard* environment fields (:func:`environment`): library versions, device and its
  capability, CPU instruction set.

*Soft* fields (thread count, driver version) are recorded in an entry but not keyed: when
they differ, a hit re-measures the recorded candidates instead of rebuilding them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._util.names import stable_name
from ..backends.base import Backend
from ..candidates.evaluate import GraphSession
from ..checkpoint.environment import environment_record, flatten_record
from ..runtime.artifacts import BackendRecord

SCHEMA = 2
"""Version of the entry format and of the key composition; part of every key and manifest.

2: tunetree's classes are keyed as ``tunetree.<qualname>`` (1 named the module they lived in),
so no key names a file of tunetree. Entries of schema 1 are never found under a schema-2 key,
and one met anyway is refused by its manifest's schema: a miss, tuned again."""


def digest(value: Any) -> str:
    """sha256 of the canonical JSON of ``value`` (sorted keys, no spaces)."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    """JSON text that is the same for equal values in every process (dict order ignored)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)


# --------------------------------------------------------------------------- stable values


def qualified_name(obj: Any) -> str:
    """``module.qualname`` of a class or function; any module of tunetree reads ``tunetree``.

    So a key names no file inside tunetree, and moving code changes no key
    (:func:`tunetree._util.names.stable_name`).
    """
    return stable_name(obj)


def stable(value: Any, depth: int = 0) -> Any:
    """A JSON-able description of ``value`` that is the same in every process.

    No memory addresses, no set ordering. Unknown objects are described by their type only.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return repr(value)  # keeps nan/inf and exact digits
    if depth > 6:
        return f"<{type(value).__qualname__}>"
    if isinstance(value, torch.dtype | torch.device):
        return str(value)
    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype), list(value.shape)]
    if isinstance(value, tuple | list):
        return [type(value).__name__, [stable(v, depth + 1) for v in value]]
    if isinstance(value, set | frozenset):
        return ["set", sorted(canonical_json(stable(v, depth + 1)) for v in value)]
    if isinstance(value, dict):
        return [
            "dict",
            sorted([str(k), stable(v, depth + 1)] for k, v in value.items()),
        ]
    return _stable_object(value, depth)


def _stable_object(value: Any, depth: int) -> Any:
    """:func:`stable` for classes, dataclasses, configuration objects and callables."""
    if isinstance(value, type):
        return f"class:{qualified_name(value)}"
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
        return [type(value).__qualname__, stable(fields, depth + 1)]
    to_dict = getattr(value, "to_dict", None)  # configuration objects (Hugging Face)
    if callable(to_dict) and not callable(value):
        try:
            as_dict = to_dict()
        except Exception:
            as_dict = None
        if isinstance(as_dict, dict):
            return [type(value).__qualname__, stable(as_dict, depth + 1)]
    if callable(value) and hasattr(value, "__qualname__"):
        return f"callable:{qualified_name(value)}"
    return f"<{qualified_name(type(value))}>"


# --------------------------------------------------------------------------- code identity


def _code_record(code: types.CodeType, doc: str | None = None) -> list[Any]:
    """Bytecode, names and constants of a code object, nested code included.

    Line numbers, file names and the docstring are left out (editing them changes nothing that
    runs).
    """
    consts: list[Any] = []
    for i, const in enumerate(code.co_consts):
        if isinstance(const, types.CodeType):
            consts.append(_code_record(const))
        elif i == 0 and doc is not None and const == doc:
            consts.append(None)  # as without a docstring
        else:
            consts.append(stable(const))
    return [
        code.co_name,
        code.co_code.hex(),
        list(code.co_names),
        list(code.co_varnames),
        list(code.co_freevars),
        list(code.co_cellvars),
        code.co_argcount,
        code.co_kwonlyargcount,
        code.co_flags,
        consts,
    ]


def _names_used(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


def function_record(fn: types.FunctionType, seen: set[int] | None = None) -> list[Any]:
    """Code identity of a Python function, including its module's helpers that it refers to.

    Helper functions of its own module that it refers to by global name are included, so editing
    such a helper changes the key too.
    """
    seen = set() if seen is None else seen
    seen.add(id(fn))
    record: list[Any] = [
        _code_record(fn.__code__, fn.__doc__),
        stable(fn.__defaults__),
        stable(fn.__kwdefaults__),
    ]
    helpers = []
    for name in sorted(_names_used(fn.__code__)):
        target = fn.__globals__.get(name)
        if (
            isinstance(target, types.FunctionType)
            and target.__module__ == fn.__module__
            and id(target) not in seen
        ):
            helpers.append([name, function_record(target, seen)])
    record.append(helpers)
    return record


_SKIPPED_CLASS_ATTRS = {
    "__module__",
    "__qualname__",
    "__doc__",
    "__dict__",
    "__weakref__",
    "__annotations__",
    "__firstlineno__",
    "__static_attributes__",
    "__orig_bases__",
    "__parameters__",
    "__abstractmethods__",
    "_abc_impl",
}

_class_digests: weakref.WeakKeyDictionary[type, str] = weakref.WeakKeyDictionary()


def class_code_digest(cls: type) -> str:
    """Digest of the code a module class runs.

    Classes from torch itself are identified by name only: their code is covered by the torch
    version in the hard environment.
    """
    cached = _class_digests.get(cls)
    if cached is not None:
        return cached
    parts: list[Any] = []
    for klass in cls.__mro__:
        if klass in (nn.Module, object):
            continue
        name = qualified_name(klass)
        if klass.__module__.split(".")[0] == "torch":
            parts.append([name, "torch"])
            continue
        members = []
        for attr, value in sorted(vars(klass).items()):
            if attr in _SKIPPED_CLASS_ATTRS or _is_class_cache(attr, value):
                continue
            members.append([attr, _member_record(value)])
        parts.append([name, members])
    result = digest(parts)
    _class_digests[cls] = result
    return result


def _is_class_cache(attr: str, value: Any) -> bool:
    """Whether a class attribute is a value the class caches on itself at run time.

    Such a value appears once an instance or a class method computed it (Hugging Face's
    ``PreTrainedModel`` caches ``_can_set_*_implementation_cached_value`` on the class when a
    model is built), so the same class would digest differently in a process that only
    unpickled a model of it. Data only: a function or descriptor is code and stays.
    """
    return "cache" in attr.lower() and not callable(value) and not hasattr(value, "__get__")


def _member_record(value: Any) -> Any:
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    if isinstance(value, types.FunctionType):
        return function_record(value)
    if isinstance(value, property):
        return [
            "property",
            [_member_record(f) for f in (value.fget, value.fset, value.fdel) if f is not None],
        ]
    return stable(value)


# --------------------------------------------------------------------------- module structure


def module_structure(module: nn.Module) -> dict[str, Any]:
    """What determines a module's tuning result besides its weight values.

    Each child is described by its own structure digest (so an entry can record its children's
    keys).
    """
    cls = type(module)
    attrs = {
        name: stable(value)
        for name, value in vars(module).items()
        if not name.startswith("_") and name not in ("training", "forward")
    }
    return {
        "class": qualified_name(cls),
        "code": class_code_digest(cls),
        "attributes": attrs,
        "parameters": [
            [name, None if p is None else [str(p.dtype), list(p.shape)]]
            for name, p in module._parameters.items()
        ],
        "buffers": [
            [name, None if b is None else [str(b.dtype), list(b.shape)]]
            for name, b in module._buffers.items()
        ],
        "hooks": [
            [kind, [stable(h) for h in getattr(module, kind, {}).values()]]
            for kind in ("_forward_pre_hooks", "_forward_hooks")
        ],
        "children": [
            [name, None if child is None else structure_digest(child)]
            for name, child in module._modules.items()
        ],
    }


def structure_digest(module: nn.Module) -> str:
    """Digest of :func:`module_structure`, recursively through every child."""
    return digest(module_structure(module))


# --------------------------------------------------------------------------- environment

SOFT_ENTRIES = ("os.release", "cpu.logical_cores", "threads")
"""Entries of the environment record that are recorded, not keyed: they change timings,
not what a backend builds. Accelerator drivers and counts (``accelerators.*.driver``,
``accelerators.*.count``) are soft too."""

IGNORED_ENTRIES = ("host", "backends")
"""Entries left out entirely: a container's host name changes with every start, and the
backend kinds are keyed through the strategy."""


@dataclasses.dataclass(frozen=True)
class Environment:
    """Hard fields key an entry; soft fields are recorded and trigger re-measurement."""

    hard: dict[str, Any]
    soft: dict[str, Any]


def _is_soft(entry: str) -> bool:
    return entry in SOFT_ENTRIES or (
        entry.startswith("accelerators.") and entry.rsplit(".", 1)[-1] in ("driver", "count")
    )


@functools.lru_cache(maxsize=32)
def _record(kinds: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    """The flattened environment record (:mod:`tunetree.checkpoint.environment`).

    Computed once per process.
    """
    flat = flatten_record(environment_record(kinds))
    return tuple(sorted((k, json.loads(canonical_json(v))) for k, v in flat.items()))


@functools.lru_cache(maxsize=16)
def _device_fields(device: str) -> tuple[tuple[str, Any], ...]:
    """The tuning device itself: on a host with several kinds of GPU, which one."""
    dev = torch.device(device)
    fields: dict[str, Any] = {"device_type": dev.type}
    try:
        if dev.type == "cuda" and torch.cuda.is_available():
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            fields["device_name"] = torch.cuda.get_device_name(index)
            fields["device_capability"] = list(torch.cuda.get_device_capability(index))
        elif dev.type == "xpu" and hasattr(torch, "xpu") and torch.xpu.is_available():
            fields["device_name"] = torch.xpu.get_device_name(dev.index or 0)
    except Exception:  # a broken driver: the environment record names the devices anyway
        pass
    return tuple(sorted(fields.items()))


def environment(device: torch.device, backend_kinds: list[str]) -> Environment:
    """The environment an entry for ``device`` depends on, split into hard and soft entries.

    It is the environment record of :func:`tunetree.checkpoint.environment.environment_record` for
    these backend kinds (library versions, OS, CPU model and flags, accelerators), plus torch's
    thread count (soft).
    """
    hard: dict[str, Any] = dict(_device_fields(str(device)))
    soft: dict[str, Any] = {"threads": torch.get_num_threads()}
    for entry, value in _record(tuple(sorted(set(backend_kinds)))):
        if any(entry == i or entry.startswith(i + ".") for i in IGNORED_ENTRIES):
            continue
        (soft if _is_soft(entry) else hard)[entry] = value
    return Environment(hard, soft)


# --------------------------------------------------------------------------- entry key


def backend_record(backend: Backend) -> dict[str, Any]:
    """A candidate: kind, class and config (JSON; dict order does not matter)."""
    return BackendRecord.of(backend).to_json()


def strategy_record(strategy: Any) -> dict[str, Any]:
    """A strategy: its type, its options (everything but the backends) and its candidates."""
    options = {k: stable(v) for k, v in sorted(vars(strategy).items()) if k != "backends"}
    return {
        "type": qualified_name(type(strategy)),
        "options": options,
        "backends": [backend_record(b) for b in strategy.backends],
    }


@dataclasses.dataclass(frozen=True)
class EntryIdentity:
    """The key of one graph's entry and the records it was computed from."""

    key: str
    module: dict[str, Any]
    graph: str
    strategy: dict[str, Any]
    tolerances: Any
    environment: Environment
    candidate_keys: list[str]
    family: str = ""
    """The key with the graph's sizes left out: entries of one family differ only in sizes
    (ranges), so one tuned for a wider range can serve a narrower one."""


EnvironmentFn = Callable[[torch.device, list[str]], Environment]


def entry_identity(
    session: GraphSession, strategy: Any, env: EnvironmentFn | None = None
) -> EntryIdentity:
    """The key of the entry for ``session``'s graph tuned with ``strategy``."""
    env_fn = env or environment
    module = module_structure(session.module)
    graph = hashlib.sha256(repr(session.graph.key).encode()).hexdigest()
    strat = strategy_record(strategy)
    tolerances = stable(session.tolerances.to_json())
    if session.accuracy is not None:  # budget-admitted candidates differ: another entry
        accuracy = session.accuracy
        tolerances = {
            "tolerances": tolerances,
            "accuracy": [accuracy.module_metric, accuracy.module_limit],
        }
    environment_ = env_fn(session.device, [b["kind"] for b in strat["backends"]])
    module_digest = digest(module)
    common = {
        "schema": SCHEMA,
        "path": session.path,
        "module": module_digest,
        "graph": graph,
        "device_type": session.device.type,
        "environment": environment_.hard,
    }
    candidate_keys = [digest({**common, "backend": b}) for b in strat["backends"]]
    key = digest({**common, "strategy": strat, "tolerances": tolerances})[:40]
    pattern = hashlib.sha256(repr(session.graph.key.pattern()).encode()).hexdigest()
    family = digest({**common, "graph": pattern, "strategy": strat, "tolerances": tolerances})
    return EntryIdentity(
        key,
        module,
        graph,
        strat,
        tolerances,
        environment_,
        [k[:40] for k in candidate_keys],
        family[:40],
    )
