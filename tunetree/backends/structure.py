"""Output structure of a saved runner in tunetree's own closed vocabulary.

A saved runner records how eager's output is built around its tensors. That record comes
from a file, so it is never handed to a deserialiser that imports by name (pytree's
``treespec_loads`` imports any module a type name holds). A structure is JSON data of these
nodes only::

    ["leaf"]                          a tensor or constant leaf
    ["tuple", [children]]             ["list", [children]]
    ["dict", [keys], [children]]      keys are strings or integers
    ["named", "module.Class", [children]]

A structure is never rebuilt from the file alone: the user's own model's output structure is
learnt by running its eager forward once on fake tensors (``learn``), and the saved
description must match it node for node; a named container (a namedtuple, a Hugging Face
``ModelOutput``) is matched by its class name, a plain one by its kind. Files of the first
release hold pytree's JSON instead; it is read here as plain data
(:func:`from_pytree_json`) into the same nodes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch.utils._pytree as pytree

from ..errors import BackendError
from .packages import missing_packages

MAX_DEPTH = 32
"""Deepest nesting of containers a saved structure may have."""
MAX_NODES = 100_000
"""Most nodes a saved structure may have."""

_CONTAINERS = {"tuple": tuple, "list": list, "dict": dict}
_PYTREE_BUILTINS = {"builtins.tuple": "tuple", "builtins.list": "list", "builtins.dict": "dict"}


def describe(spec: pytree.TreeSpec) -> list[Any]:
    """The structure of ``spec`` as nodes of the closed vocabulary."""
    if spec.is_leaf():
        return ["leaf"]
    children = [describe(c) for c in spec.children()]
    for name, kind in _CONTAINERS.items():
        if spec.type is kind:
            if kind is dict:
                return ["dict", list(spec.context), children]
            return [name, children]
    # pytree files namedtuples under one node type; the class itself is the context.
    cls = spec.context if isinstance(spec.context, type) else spec.type
    return ["named", f"{cls.__module__}.{cls.__qualname__}", children]


def check(node: Any) -> list[Any]:
    """``node`` validated as a structure (closed vocabulary, bounded depth and size).

    Raises :class:`BackendError` naming what is wrong.
    """
    count = [0]
    _check(node, 0, count)
    return node  # type: ignore[no-any-return]


def _check(node: Any, depth: int, count: list[int]) -> None:
    count[0] += 1
    if depth > MAX_DEPTH or count[0] > MAX_NODES:
        raise BackendError(f"saved output structure is deeper than {MAX_DEPTH} or too large")
    if not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise BackendError("saved output structure holds something other than a node")
    shapes = {"leaf": 1, "tuple": 2, "list": 2, "dict": 3, "named": 3}
    if shapes.get(node[0]) != len(node):
        raise BackendError(f"saved output structure holds an unknown node {str(node[0])[:40]!r}")
    if node[0] == "leaf":
        return
    children = node[-1]
    if not isinstance(children, list):
        raise BackendError("saved output structure has a node without a list of children")
    if node[0] == "dict":
        keys = node[1]
        ok = isinstance(keys, list) and len(keys) == len(children)
        if not ok or not all(isinstance(k, str | int) and not isinstance(k, bool) for k in keys):
            raise BackendError("saved output structure has a dict without matching keys")
    if node[0] == "named" and (not isinstance(node[1], str) or len(node[1]) > 256):
        raise BackendError("saved output structure has a named node without a type name")
    for child in children:
        _check(child, depth + 1, count)


def leaf_count(node: list[Any]) -> int:
    """How many leaves a checked structure has (the flat outputs it is built around)."""
    if node[0] == "leaf":
        return 1
    return sum(leaf_count(child) for child in node[-1])


def from_pytree_json(text: Any) -> list[Any]:
    """The structure in pytree's ``treespec_dumps`` JSON (first release), read as data.

    Nothing is imported; unknown type names become ``named`` nodes.
    """
    if not isinstance(text, str) or len(text) > 16 << 20:
        raise BackendError("saved output structure is not pytree JSON text")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BackendError(f"saved output structure is not JSON: {exc}") from exc
    if not isinstance(data, list) or len(data) != 2 or data[0] != 1:
        raise BackendError("saved output structure is not pytree protocol 1 JSON")
    count = [0]
    return _from_pytree(data[1], 0, count)


def _from_pytree(item: Any, depth: int, count: list[int]) -> list[Any]:
    count[0] += 1
    if depth > MAX_DEPTH or count[0] > MAX_NODES:
        raise BackendError(f"saved output structure is deeper than {MAX_DEPTH} or too large")
    if not isinstance(item, dict) or not isinstance(item.get("children_spec"), list):
        raise BackendError("saved output structure holds something other than a tree spec")
    kind = item.get("type")
    if kind is None:
        return ["leaf"]
    if not isinstance(kind, str):
        raise BackendError("saved output structure holds a type that is not a name")
    children = [_from_pytree(c, depth + 1, count) for c in item["children_spec"]]
    name = _PYTREE_BUILTINS.get(kind)
    if name == "dict":
        keys = _context_keys(item.get("context"))
        return check(["dict", keys, children])
    if name is not None:
        return [name, children]
    return ["named", kind[:256], children]


def _context_keys(context: Any) -> list[Any]:
    try:
        keys = json.loads(context) if isinstance(context, str) else None
    except (ValueError, RecursionError):
        keys = None
    if not isinstance(keys, list):
        raise BackendError("saved output structure has a dict without its keys")
    return keys


def check_modules_present(node: list[Any]) -> None:
    """Refuse a checked structure naming a type whose module this environment lacks.

    A named container is matched against the output of the user's own model, whose class comes
    from a module present here: a type of a module that is not (``tt_absent.Out``) names an
    output no model built here returns. Only the top-level name is looked up, in
    ``sys.modules`` and with ``importlib.util.find_spec``, which searches the paths and runs
    nothing (a dotted name would import its parents). A name without a dot (a pytree
    serialisation name) names no module and is left to the match. Raises
    :class:`BackendError`.
    """
    looked_up: set[str] = set()
    for name in _type_names(node):
        top = name.split(".", 1)[0]
        if "." not in name or top in looked_up:
            continue
        looked_up.add(top)
        if not _module_present(top):
            raise BackendError(
                f"the saved output structure names the type {name[:120]!r}, of a module "
                f"{top[:60]!r} that is not installed here: no model built here returns it "
                "(install what the tuned model imports, or the file was altered)"
            )


def _type_names(node: list[Any]) -> Iterator[str]:
    """The type name of every named node of a checked structure."""
    if node[0] == "named":
        yield node[1]
    if node[0] != "leaf":
        for child in node[-1]:
            yield from _type_names(child)


def _module_present(top: str) -> bool:
    """Whether the top-level module ``top`` is imported or importable here (nothing is run).

    The standard library's names are taken as present without asking the import system's
    finders (some installed finders import on a lookup: setuptools' for ``distutils``).
    """
    if not top.isidentifier():
        return False
    if top in sys.stdlib_module_names or sys.modules.get(top) is not None:
        return True
    return not missing_packages(top)


def build(node: list[Any], learn: Callable[[], pytree.TreeSpec]) -> pytree.TreeSpec:
    """The pytree spec of a checked structure: the user's model's own (``learn``).

    The saved structure must match it node for node, plain containers included, else
    :class:`BackendError`: a record saying "a plain tuple" where the module returns a
    ``ModelOutput`` holding a cache would make ``generate`` fail inside transformers on the
    loaded model.
    """
    learnt = learn()
    if not _matches(node, describe(learnt)):
        raise BackendError(
            "the module's output structure differs from the saved runner's: the checkpoint "
            "belongs to another model, or the file was altered"
        )
    return learnt


def _matches(saved: list[Any], learnt: list[Any]) -> bool:
    """Same nodes; a named node matches a learnt type by its class name.

    The first release saved pytree's registered names, e.g. ``collections.namedtuple``.
    """
    if saved[0] != learnt[0] or len(saved) != len(learnt):
        return False
    if saved[0] == "leaf":
        return True
    if saved[0] == "dict" and saved[1] != learnt[1]:
        return False
    if saved[0] == "named":
        wanted = saved[1].rsplit(".", 1)[-1]
        if saved[1] != "collections.namedtuple" and wanted != learnt[1].rsplit(".", 1)[-1]:
            return False
    if len(saved[-1]) != len(learnt[-1]):
        return False
    return all(_matches(a, b) for a, b in zip(saved[-1], learnt[-1], strict=True))
