"""Flat tensor I/O for backends that compile a module into a tensors-in, tensors-out graph.

Those backends are OpenVINO and ONNX Runtime; their graph takes a flat list of tensors and
returns a flat list of tensors. From one sample and eager's output this module records which
leaves of a call's ``(args, kwargs)`` are graph inputs (non-tensor leaves are constants baked
into the graph; the graph key holds their values), and how the flat outputs are rebuilt into
eager's structure and container types (tuples, dicts, Hugging Face ``ModelOutput`` ...). Both
records are JSON, so a saved runner is rebuilt without samples.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from ..errors import BackendError
from ..signature.binding import original_forward
from ..signature.fake_run import run_fake
from ..signature.graph import MAX_DIM_SIZE, Graph, GraphKey, Sample, TensorSpec, flatten, unflatten
from ..signature.stateful import (
    carried_carrier,
    carrying_positions,
    spec_holds_state,
    to_data,
    updated_in_place,
)
from ..signature.synthetic import call_from_key, check_key_names, size_limit, zeros
from . import structure
from .dtypes import check_numpy_dtypes, dtype_from_name, dtype_from_short_name, dtype_to_name
from .known_outputs import known_output_spec
from .ranges import check_placeholders, example_sample

MAX_SAVED_TENSORS = 100_000
"""Most inputs, outputs or output leaves a saved runner record may list."""
MAX_SAVED_ELEMENTS = 1 << 28
"""Most elements the tensors of one saved input or output list may hold together (1 GiB
of float32): a record asking for more is refused before anything is allocated."""

PathEntry = tuple[str, Any]
"""One step into a call's ``(args, kwargs)``: ``("i", index)``, ``("k", key)``, ``("a", name)``."""


def _path_entry(key: Any) -> PathEntry:
    if isinstance(key, pytree.SequenceKey):
        return ("i", key.idx)
    if isinstance(key, pytree.MappingKey) and isinstance(key.key, str | int):
        return ("k", key.key)
    if isinstance(key, pytree.GetAttrKey):
        return ("a", key.name)
    raise BackendError(
        f"cannot address an input through {key!r}: only tuples, lists, dicts with string or "
        "integer keys and attributes are supported in graph inputs"
    )


def _input_name(path: Sequence[PathEntry]) -> str:
    top = path[1][1] if path[0][1] == 1 else f"arg{path[1][1]}"
    name = "_".join([str(top), *(str(key) for _, key in path[2:])])
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


@dataclasses.dataclass(frozen=True)
class FlatInputs:
    """Where a call's tensor inputs sit in ``(args, kwargs)``, their names, dtypes and shapes."""

    paths: tuple[tuple[PathEntry, ...], ...]
    names: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]

    def pick(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        """The graph's input tensors of one call, in graph order."""
        root: Any = (args, kwargs)
        picked = []
        for path in self.paths:
            obj = parent = root
            try:
                for kind, key in path:
                    parent, obj = obj, getattr(obj, key) if kind == "a" else obj[key]
                if not isinstance(obj, torch.Tensor):  # a cache's position, carried as a size
                    obj = carried_carrier(parent, path[-1][1]) if path[-1][0] == "a" else obj
            except (AttributeError, IndexError, KeyError, TypeError) as exc:
                raise BackendError(
                    f"the runner's input path {list(path)!r:.120} does not fit this call "
                    f"({type(exc).__name__}: {exc}); the saved runner record is damaged"
                ) from exc
            if not isinstance(obj, torch.Tensor):
                raise BackendError(
                    f"the runner's input path {list(path)!r:.120} leads to a "
                    f"{type(obj).__name__}, not a tensor; the saved runner record is damaged"
                )
            picked.append(obj)
        return picked

    def check_against(self, key: GraphKey) -> None:
        """Refuse a record that does not fit the graph ``key`` it serves.

        Every path must lead to one of the key's tensors (no attribute of a tensor, no index,
        keyword or attribute the key lacks), no two paths or names may be equal, and each
        recorded dtype and rank must be that tensor's. BackendError otherwise.
        """
        if len(set(self.paths)) != len(self.paths):
            raise BackendError("saved runner record lists one input path twice")
        if len(set(self.names)) != len(self.names):
            raise BackendError("saved runner record lists one input name twice")
        for path, dtype, shape in zip(self.paths, self.dtypes, self.shapes, strict=True):
            spec = tensor_at(key, path)
            if dtype_from_short_name(spec.dtype) != dtype:
                raise BackendError(
                    f"saved runner record says input {list(path)!r:.80} is "
                    f"{dtype_to_name(dtype)}, but the graph has {spec.dtype} there"
                )
            if len(shape) != len(spec.shape):  # sizes may differ: an entry borrowed for a
                raise BackendError(  # narrower range keeps its wider example
                    f"saved runner record says input {list(path)!r:.80} has shape "
                    f"{list(shape)!r:.80}, of another rank than the graph's {spec}"
                )

    def specs(self, key: GraphKey) -> list[TensorSpec]:
        """The key's tensor spec at each input path (see :meth:`check_against`)."""
        return [tensor_at(key, path) for path in self.paths]

    def subset(self, kept: Sequence[int]) -> FlatInputs:
        """Only the inputs at ``kept`` (a converter dropped the inputs the graph never reads)."""
        return FlatInputs(
            tuple(self.paths[i] for i in kept),
            tuple(self.names[i] for i in kept),
            tuple(self.dtypes[i] for i in kept),
            tuple(self.shapes[i] for i in kept),
        )

    def to_json(self) -> dict[str, Any]:
        """The record as JSON data (:meth:`from_json` reads it back)."""
        return {
            "paths": [[list(entry) for entry in path] for path in self.paths],
            "names": list(self.names),
            "dtypes": [dtype_to_name(d) for d in self.dtypes],
            "shapes": [list(s) for s in self.shapes],
        }

    @classmethod
    def from_json(cls, data: Any, max_elements: int = MAX_SAVED_ELEMENTS) -> FlatInputs:
        """The record :meth:`to_json` wrote, checked as untrusted input.

        See :func:`saved_list`; BackendError when it is malformed or its shapes hold more than
        ``max_elements`` elements together. :meth:`check_against` checks it against its graph.
        """
        if not isinstance(data, dict):
            raise BackendError("saved runner record has no inputs object")
        paths = tuple(saved_path(p) for p in saved_list(data, "paths"))
        names = saved_list(data, "names")
        if not all(isinstance(n, str) and len(n) <= 256 for n in names):
            raise BackendError("saved runner record has input names that are not short strings")
        dtypes = saved_dtypes(data)
        shapes = saved_shapes(data, max_elements)
        if not len(paths) == len(names) == len(dtypes) == len(shapes):
            raise BackendError("saved runner record has inputs of unequal counts")
        return cls(paths, tuple(names), dtypes, shapes)


def flatten_output(output: Any) -> tuple[list[Any], Any]:
    """An output's leaves and spec as every output record of a flat graph takes them.

    A cache layer's position is a carrier tensor whether or not the keys' length repeats it
    (:func:`.stateful.carrying_positions`): one record serves a range on both sides of a
    sliding window, where below it the position mirrors the keys' length and past it travels
    apart.
    """
    with carrying_positions():
        return flatten(output)


@dataclasses.dataclass(frozen=True)
class FlatOutputs:
    """Eager's output structure, so that the graph's flat outputs can be rebuilt into it.

    Records the tree spec, its non-tensor leaves, and the position, dtype and shape of every
    tensor leaf. :meth:`rebuild` turns the graph's flat outputs back into eager's structure.
    """

    spec: pytree.TreeSpec
    template: tuple[Any, ...]
    """Eager's leaves, with None where a graph output goes."""
    positions: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, output: Any) -> FlatOutputs:
        """The record of eager's output ``output``.

        Flattened by :func:`flatten_output`.
        """
        leaves, spec = flatten_output(output)
        positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor))
        tensors = [leaves[i] for i in positions]
        template = tuple(None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves)
        return cls(
            spec,
            template,
            positions,
            tuple(t.dtype for t in tensors),
            tuple(tuple(t.shape) for t in tensors),
        )

    @functools.cached_property
    def holds_cache(self) -> bool:
        """Whether the output holds a cache object (rebuilt into the caller's, see rebuild)."""
        return spec_holds_state(self.spec)

    def rebuild(self, tensors: Sequence[torch.Tensor], call: Any = None) -> Any:
        """Eager's output structure around the graph's output tensors.

        A cache in the output is written into the matching cache of ``call`` (the call's
        ``(args, kwargs)``), as eager updates the cache it is given in place.
        """
        if self.spec.is_leaf():
            return tensors[0] if self.positions else self.template[0]
        leaves = list(self.template)
        for position, tensor in zip(self.positions, tensors, strict=True):
            leaves[position] = tensor
        if not self.holds_cache:  # no cache object to build back: one pass, not two
            return pytree.tree_unflatten(leaves, self.spec)
        output = unflatten(leaves, self.spec)
        return updated_in_place(call, output) if call is not None else output

    def to_json(self) -> dict[str, Any]:
        """The record as JSON data.

        The structure is in tunetree's closed vocabulary (:func:`.structure.describe`).
        """
        constants = {
            str(i): leaf for i, leaf in enumerate(self.template) if i not in self.positions
        }
        try:
            json.dumps(constants)
        except (TypeError, ValueError) as exc:
            raise BackendError(
                f"cannot save a runner whose outputs hold non-tensor values {constants!r}: "
                "only None, bool, int, float and str can be stored"
            ) from exc
        return {
            "structure": structure.describe(self.spec),
            # Readers of the first release take a null spec as "learn it by running once".
            "spec": None,
            "num_leaves": len(self.template),
            "constants": constants,
            "positions": list(self.positions),
            "dtypes": [dtype_to_name(d) for d in self.dtypes],
            "shapes": [list(s) for s in self.shapes],
        }

    @classmethod
    def from_json(
        cls,
        data: Any,
        module: nn.Module,
        key: GraphKey,
        device: torch.device,
        max_elements: int = MAX_SAVED_ELEMENTS,
    ) -> FlatOutputs:
        """The record :meth:`to_json` wrote, checked as untrusted input.

        Its structure is read in tunetree's closed vocabulary (:mod:`.structure`, never by a
        deserialiser that imports) and must match the module's own, learnt on fake tensors
        shaped like ``key`` (:func:`learn_output_spec`).
        """
        num_leaves, positions, constants, dtypes, shapes = saved_outputs(data, max_elements)
        spec = _saved_spec(data, module, key, device)
        if spec.num_leaves != num_leaves:
            raise BackendError(
                f"saved runner expects {num_leaves} output leaves but the module's output "
                f"structure has {spec.num_leaves}: the checkpoint belongs to another model"
            )
        template = tuple(constants.get(i) for i in range(num_leaves))
        return cls(spec, template, positions, dtypes, shapes)


SavedOutputs = tuple[
    int, tuple[int, ...], dict[int, Any], tuple[torch.dtype, ...], tuple[tuple[int, ...], ...]
]
"""Leaf count, tensor positions, constants, dtypes and shapes of a saved output record."""


def saved_outputs(data: Any, max_elements: int = MAX_SAVED_ELEMENTS) -> SavedOutputs:
    """The output record's fields but its structure, checked as untrusted input.

    Needs no module: loaders check artifacts against the dtypes and shapes it holds before
    they learn the structure.
    """
    if not isinstance(data, dict):
        raise BackendError("saved runner record has no outputs object")
    num_leaves = data.get("num_leaves")
    if isinstance(num_leaves, bool) or not isinstance(num_leaves, int):
        raise BackendError("saved runner record's outputs lack num_leaves")
    if not 0 <= num_leaves <= MAX_SAVED_TENSORS:
        raise BackendError(f"saved runner record has {num_leaves} output leaves")
    positions = saved_positions(data, num_leaves)
    constants = saved_constants(data, num_leaves, positions)
    dtypes = saved_dtypes(data)
    shapes = saved_shapes(data, max_elements)
    if not len(positions) == len(dtypes) == len(shapes):
        raise BackendError("saved runner record has outputs of unequal counts")
    return num_leaves, positions, constants, dtypes, shapes


def check_saved_io(key: GraphKey, saved: Any, max_elements: int) -> None:
    """Refuse a flat runner's saved input and output records before anything is built.

    Inputs checked against ``key`` (:meth:`FlatInputs.check_against`), outputs as untrusted
    records with a closed-vocabulary structure naming no type of a module absent here
    (:func:`.structure.check_modules_present`), tensors of both together of at most
    ``max_elements`` elements. Needs neither the module nor the artifacts (``tunetree info``
    runs it too). BackendError when a record does not fit.
    """
    if not isinstance(saved, dict):
        raise BackendError("saved runner record is not an object")
    check_key_names(key)  # what a load would refuse to build, refused by info too
    inputs = FlatInputs.from_json(saved.get("inputs"), max_elements)
    inputs.check_against(key)
    left = max_elements - sum(math.prod(s) for s in inputs.shapes)
    outputs: dict[str, Any] = saved.get("outputs")  # type: ignore[assignment]
    saved_outputs(outputs, left)  # refuses anything but an object
    if outputs.get("structure") is not None:
        structure.check_modules_present(structure.check(outputs["structure"]))
    elif outputs.get("spec") is not None:
        structure.check_modules_present(structure.from_pytree_json(outputs["spec"]))
    # A load checks the runner against eager on real calls of the graph's example shape.
    check_placeholders(key, left)


def tensor_at(key: GraphKey, path: Sequence[PathEntry]) -> TensorSpec:
    """The tensor spec a saved input path leads to in ``key``; BackendError when none.

    The path starts at ``(args, kwargs)``: ``("i", 0)`` then positional arguments,
    ``("i", 1)`` then keywords; tuples and lists by index, dicts by key, cache objects and
    dataclasses by attribute. It must end at a tensor and go no further.
    """
    sig: Any = ("tuple", (("tuple", key.args), ("dict", key.kwargs)))
    for kind, step in path:
        sig = _step(sig, kind, step)
        if sig is None:
            raise BackendError(
                f"saved runner record has an input path {list(path)!r:.120} that the graph "
                f"{key} does not have ({kind!r}, {step!r:.40} leads nowhere)"
            )
    if not isinstance(sig, TensorSpec):
        raise BackendError(
            f"saved runner record has an input path {list(path)!r:.120} that does not end at "
            f"a tensor of the graph {key}"
        )
    return sig


def _step(sig: Any, kind: str, step: Any) -> Any:
    """One path entry into a graph signature (see ``graph._leaf_signature``), or None."""
    if isinstance(sig, TensorSpec) or not isinstance(sig, tuple) or not sig:
        return None
    head = sig[0]
    if kind == "i" and head in ("tuple", "list") and len(sig) == 2:
        items = sig[1]
        return items[step] if isinstance(step, int) and 0 <= step < len(items) else None
    if kind == "k" and head == "dict" and len(sig) == 2:
        return next((v for k, v in sig[1] if k == step or k == str(step)), None)
    if kind == "a" and head == "data" and len(sig) == 3:
        return next((v for k, v in sig[2] if k == step), None)
    plain_heads = ("tuple", "list", "dict", "const", "object", "data")
    dataclass_like = len(sig) == 2 and isinstance(head, str) and head not in plain_heads
    if kind == "a" and dataclass_like and isinstance(sig[1], tuple):
        for field in sig[1]:
            if isinstance(field, tuple) and len(field) == 2 and field[0] == step:
                return field[1]
    return None


def _saved_spec(
    data: dict[str, Any], module: nn.Module, key: GraphKey, device: torch.device
) -> pytree.TreeSpec:
    """The output structure a saved record describes, checked against the module's own.

    The module's structure is learnt (:func:`learn_output_spec`) and must match the saved
    ``structure`` (this release) or ``spec`` (pytree JSON of the first release, read as data)
    node for node, plain containers included: a plain tuple saved where the module returns a
    ``ModelOutput`` with a cache is refused, since ``generate`` would then meet another
    type. Without either, the learnt structure is used.
    """
    learnt = learn_output_spec(module, key, device)
    if data.get("structure") is not None:
        return structure.build(structure.check(data["structure"]), lambda: learnt)
    if data.get("spec") is not None:
        return structure.build(structure.from_pytree_json(data["spec"]), lambda: learnt)
    return learnt


def learn_output_spec(module: nn.Module, key: GraphKey, device: torch.device) -> pytree.TreeSpec:
    """The module's output structure on a call of ``key``, learnt on fake tensors.

    Taken from eager's real output instead where the caller named one
    (:func:`.known_outputs.outputs_known`).

    The call is made from the key alone (:func:`.synthetic.call_from_key`: cache objects
    only of the allow-listed inert classes, sizes they state bounded by the key and the
    model's config) and run under fake tensors (:func:`.fake_run.run_fake`), so no size in
    a file makes it allocate (a batch fixed at 2^24, say).
    BackendError when no call can be made or the forward cannot run on fake tensors.
    """
    known = known_output_spec(key)
    if known is not None:  # eager's real output on such a call is at hand
        return known
    limit = size_limit(key, module)
    forward = original_forward(module)
    try:
        run = run_fake(forward, lambda: call_from_key(key, device, zeros, limit))
    except BackendError:
        raise
    except Exception as exc:
        raise BackendError(
            "could not learn the saved runner's output structure by running the module on "
            f"fake tensors shaped like its graph: {type(exc).__name__}: {str(exc)[:300]}"
        ) from exc
    return flatten_output(run.output)[1]


class FlatModule(nn.Module):
    """A module as a function of its graph's input tensors only: the form exporters take.

    It returns its output tensors as a flat tuple. Constants are the sample's non-tensor
    leaves.
    """

    def __init__(
        self,
        module: nn.Module,
        template: Sequence[Any],
        in_spec: pytree.TreeSpec,
        input_positions: Sequence[int],
        output_positions: Sequence[int],
    ) -> None:
        super().__init__()
        self.module = module
        self.template = list(template)
        self.in_spec = in_spec
        self.input_positions = list(input_positions)
        self.output_positions = list(output_positions)

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run the original forward with ``tensors`` as the inputs; return the output tensors."""
        leaves = list(self.template)
        for position, tensor in zip(self.input_positions, tensors, strict=True):
            leaves[position] = tensor
        args, kwargs = unflatten(leaves, self.in_spec)
        output = original_forward(self.module)(*args, **kwargs)
        out_leaves, _ = flatten_output(output)
        return tuple(out_leaves[i] for i in self.output_positions)


@dataclasses.dataclass
class FlatGraph:
    """Everything an exporter needs for one graph.

    The flat module, example input tensors, and the input and output records the runner keeps.
    """

    module: FlatModule
    example: tuple[torch.Tensor, ...]
    inputs: FlatInputs
    outputs: FlatOutputs
    key: GraphKey
    """The graph's key: its ranges say which axes of the inputs are dynamic."""
    output_axes: tuple[tuple[int, ...], ...] = ()
    """Per tensor output, the axes whose size differs between the recorded calls."""

    @classmethod
    def of(cls, module: nn.Module, graph: Graph) -> FlatGraph:
        """The flat form of ``graph``.

        The example is a recorded sample, or for a ranged graph one with every dynamic size at 2
        or more (see :func:`.ranges.example_sample`).
        """
        if not graph.samples or not graph.outputs:
            raise BackendError("the graph has no recorded sample: cannot export it")
        sample: Sample = example_sample(graph)
        kwargs = {k: sample.kwargs[k] for k in sorted(sample.kwargs)}
        with_paths, in_spec = pytree.tree_flatten_with_path(to_data((tuple(sample.args), kwargs)))
        positions = [i for i, (_, leaf) in enumerate(with_paths) if isinstance(leaf, torch.Tensor)]
        paths = tuple(tuple(_path_entry(k) for k in with_paths[i][0]) for i in positions)
        example = tuple(with_paths[i][1] for i in positions)
        inputs = FlatInputs(
            paths=paths,
            names=_unique([_input_name(p) for p in paths]),
            dtypes=tuple(t.dtype for t in example),
            shapes=tuple(tuple(t.shape) for t in example),
        )
        outputs = FlatOutputs.of(graph.outputs[0])
        if not outputs.positions:
            raise BackendError("the module returns no tensor: nothing to compile")
        template = [None if isinstance(leaf, torch.Tensor) else leaf for _, leaf in with_paths]
        flat = FlatModule(module, template, in_spec, positions, outputs.positions)
        return cls(flat, example, inputs, outputs, graph.key, _varying_axes(graph, outputs))

    def check_numpy_dtypes(self) -> None:
        """Refuse dtypes numpy cannot carry (bfloat16) before any time goes into exporting."""
        check_numpy_dtypes((*self.inputs.dtypes, *self.outputs.dtypes))


def _varying_axes(graph: Graph, outputs: FlatOutputs) -> tuple[tuple[int, ...], ...]:
    flat = [flatten_output(out)[0] for out in graph.outputs]
    shapes = [[tuple(leaves[i].shape) for i in outputs.positions] for leaves in flat]
    return tuple(
        tuple(
            axis
            for axis, size in enumerate(first)
            if any(len(s[i]) != len(first) or s[i][axis] != size for s in shapes)
        )
        for i, first in enumerate(shapes[0])
    )


def _unique(names: list[str]) -> tuple[str, ...]:
    seen: set[str] = set()
    result = []
    for name in names:
        candidate = name or "input"
        for n in itertools.count(1):
            if candidate not in seen:
                break
            candidate = f"{name}_{n}"
        seen.add(candidate)
        result.append(candidate)
    return tuple(result)


# Load-time checks of saved runner records: the record comes from a file (untrusted).


def saved_list(data: dict[str, Any], field: str) -> list[Any]:
    """``data[field]``, which must be a list of at most :data:`MAX_SAVED_TENSORS` items."""
    value = data.get(field)
    if not isinstance(value, list) or len(value) > MAX_SAVED_TENSORS:
        raise BackendError(f"saved runner record's {field!r} is not a list of bounded length")
    return value


def saved_path(path: Any) -> tuple[PathEntry, ...]:
    """One input path: ``("i", index)``, ``("k", key)`` or ``("a", attribute)``.

    An attribute may be private (a cache layer keeps tensors such as
    ``_sliding_window_tensor``), never a dunder name; :meth:`FlatInputs.check_against` then
    requires every path to lead to a tensor of the graph's own key.
    """
    if not isinstance(path, list) or not 2 <= len(path) <= 64:
        raise BackendError("saved runner record has an input path that is not a short list")
    entries = []
    for entry in path:
        if not isinstance(entry, list) or len(entry) != 2:
            raise BackendError("saved runner record has a malformed input path entry")
        kind, key = entry
        plain_index = isinstance(key, int) and not isinstance(key, bool) and 0 <= key < 1 << 16
        ok = (
            (kind == "i" and plain_index)
            or (kind == "k" and (plain_index or (isinstance(key, str) and len(key) <= 256)))
            or (kind == "a" and isinstance(key, str) and key.isidentifier())
        )
        if not ok or (kind == "a" and key.startswith("__")):
            raise BackendError(f"saved runner record has a bad input path entry {entry!r:.80}")
        entries.append((kind, key))
    return tuple(entries)


def saved_dtypes(data: dict[str, Any]) -> tuple[torch.dtype, ...]:
    """The ``dtypes`` list, each a known dtype name."""
    names = saved_list(data, "dtypes")
    if not all(isinstance(n, str) for n in names):
        raise BackendError("saved runner record has dtypes that are not names")
    return tuple(dtype_from_name(n) for n in names)


def saved_shapes(
    data: dict[str, Any], max_elements: int = MAX_SAVED_ELEMENTS
) -> tuple[tuple[int, ...], ...]:
    """The ``shapes`` list: sizes in bounds, together at most ``max_elements``.

    ``max_elements`` never above :data:`MAX_SAVED_ELEMENTS`; loaders pass a bound from
    the size of what they read (:func:`tunetree.runtime.artifacts.allowed_elements`).
    """
    max_elements = min(max_elements, MAX_SAVED_ELEMENTS)
    shapes = []
    total = 0
    for shape in saved_list(data, "shapes"):
        ok = isinstance(shape, list) and len(shape) <= 64
        if not ok or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_DIM_SIZE for x in shape
        ):
            raise BackendError("saved runner record has a shape that is not a list of sizes")
        total += math.prod(shape)
        if total > max_elements:
            raise BackendError(
                f"saved runner record's tensors hold over {max(max_elements, 0)} elements, "
                "more than a file of this size can account for (tunetree.runtime.artifacts."
                "allowed_elements, at most tunetree.backends.flat.MAX_SAVED_ELEMENTS): "
                "refused before allocating"
            )
        shapes.append(tuple(shape))
    return tuple(shapes)


def saved_positions(data: dict[str, Any], num_leaves: int) -> tuple[int, ...]:
    """The ``positions`` list: distinct leaf indices below ``num_leaves``."""
    positions = saved_list(data, "positions")
    ok = all(
        isinstance(p, int) and not isinstance(p, bool) and 0 <= p < num_leaves for p in positions
    )
    if not ok or len(set(positions)) != len(positions):
        raise BackendError("saved runner record has output positions out of range")
    return tuple(positions)


def saved_constants(
    data: dict[str, Any], num_leaves: int, positions: tuple[int, ...]
) -> dict[int, Any]:
    """The ``constants`` object: non-tensor leaves (None, bool, number, short string)."""
    raw = data.get("constants")
    if not isinstance(raw, dict) or len(raw) > num_leaves:
        raise BackendError("saved runner record's constants are not an object of leaves")
    constants = {}
    for index, value in raw.items():
        if (
            not (index.isascii() and index.isdigit() and len(index) <= 9)
            or int(index) >= num_leaves
            or int(index) in positions
        ):
            raise BackendError(f"saved runner record has a constant at {index[:20]!r}")
        plain = value is None or isinstance(value, bool | int | float)
        if not plain and not (isinstance(value, str) and len(value) <= 4096):
            raise BackendError("saved runner record has a constant that is not a plain value")
        constants[int(index)] = value
    return constants


def used_inputs(exported: Any) -> list[int]:
    """Indices of the flat inputs an exported program reads.

    An input used only for its dtype or device (a rotary embedding's ``x``) has no users in the
    graph, and converters drop it from the model they build.
    """
    user = set(exported.graph_signature.user_inputs)
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder" and n.name in user]
    return [i for i, node in enumerate(placeholders) if node.users]
