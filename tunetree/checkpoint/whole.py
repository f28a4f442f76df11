"""A model whose whole forward one runner serves, saved as a record and rebuilt at load.

Some runners serve a model's whole forward rather than one graph of one module: ``generate``'s
causal LM exported as one stateful OpenVINO model. Such a checkpoint holds no plan entries
and no runner artifacts: its weights (safetensors, as for every checkpoint) and one small
:class:`WholeRecord` (the runner's kind and config, and the accuracy it was admitted under).
The load applies the weights, then the rebuilder of the record's kind re-exports the runner
from the model's own weights and checks it against eager like a fresh build before it
serves. No artifact of the file is parsed by a runtime, and the kind selects a rebuilder from
a table the caller passes in code (:data:`Rebuilders`), never an import the file names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .._util.records import Fields
from ..errors import CheckpointError, IncompatibleCheckpointError
from .environment import unrecorded_libraries

REQUIRES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "openvino-stateful": (("openvino",), ("transformers",)),
}
"""Per known kind: the backend kinds and the other distributions its rebuild depends on (their
versions go into the environment record, so a load elsewhere is refused before rebuilding)."""

MAX_CONFIG_FIELDS = 16
"""Most fields a record's config may hold."""
MAX_TEXT = 64
"""Longest string a record's config or accuracy may hold."""


def recorded_libraries(record: Mapping[str, Any]) -> list[str]:
    """The distributions of :data:`REQUIRES` a tuned environment record lists a version of.

    The running record lists them too, so that the two compare on them.
    """
    versions = record.get("versions", {})
    known = sorted({lib for _, libraries in REQUIRES.values() for lib in libraries})
    return [lib for lib in known if isinstance(versions, dict) and lib in versions]


class WholeForward(Protocol):
    """A forward served whole by one runner: what :func:`tunetree.save` asks of it."""

    def checkpoint_record(self) -> dict[str, Any]:
        """``{"kind", "config", "accuracy"}``: what rebuilds the runner (JSON data)."""
        ...


@dataclass(frozen=True)
class WholeRecord:
    """The manifest's ``whole`` field: the runner that serves the whole model, as data."""

    kind: str
    config: dict[str, Any]
    """The runner's config: scalars only, checked again by the rebuilder."""
    accuracy: dict[str, Any] | None = None
    """For a runner that changes results: ``metric``, ``max_error`` (the budget it was
    admitted under) and the ``error`` measured then; None for one that keeps results."""

    @property
    def backends(self) -> tuple[str, ...]:
        """The backend kinds whose libraries the rebuild needs."""
        return REQUIRES[self.kind][0]

    @property
    def libraries(self) -> tuple[str, ...]:
        """The other distributions whose versions the rebuild depends on."""
        return REQUIRES[self.kind][1]

    def to_json(self) -> dict[str, Any]:
        """This record as JSON data."""
        return {"kind": self.kind, "config": dict(self.config), "accuracy": self.accuracy}

    @classmethod
    def from_json(cls, fields: Fields) -> WholeRecord:
        """Read a record; the manifest's error class names a malformed field.

        Raises:
            IncompatibleCheckpointError: A kind this tunetree does not rebuild.
        """
        kind = fields.get("kind", str)
        if kind not in REQUIRES:
            raise IncompatibleCheckpointError(
                f"the checkpoint's model is served whole by a {kind[:MAX_TEXT]!r} runner, "
                f"which this tunetree does not rebuild (it knows {sorted(REQUIRES)}): load it "
                "with the release that saved it, or tune again"
            )
        config = fields.child("config")
        if len(config.data) > MAX_CONFIG_FIELDS:
            raise fields.fail("config", f"holds over {MAX_CONFIG_FIELDS} fields")
        checked = {}
        for name in config.data:
            if not isinstance(name, str) or len(name) > MAX_TEXT:
                raise fields.fail("config", "holds a field name that is not a short string")
            checked[name] = _scalar(config, name)
        accuracy = None
        if fields.data.get("accuracy") is not None:
            record = fields.child("accuracy")
            accuracy = {
                "metric": _text(record, "metric"),
                "max_error": _number(record, "max_error"),
                "error": _number(record, "error"),
            }
        return cls(kind, checked, accuracy)


def _scalar(fields: Fields, name: str) -> Any:
    value = fields.data[name]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _text(fields, name)
    if isinstance(value, int):
        if abs(value) > 1 << 40:
            raise fields.fail(name, "is an integer out of range")
        return value
    raise fields.fail(name, f"is a {type(value).__name__}, not a string, integer or null")


def _text(fields: Fields, name: str) -> str:
    value = fields.get(name, str)
    if len(value) > MAX_TEXT:
        raise fields.fail(name, f"is longer than {MAX_TEXT} characters")
    return str(value)


def _number(fields: Fields, name: str) -> float:
    value = fields.get(name, float)
    if not math.isfinite(value) or value < 0:
        raise fields.fail(name, "is not a finite number >= 0")
    return float(value)


def whole_record(model: Any) -> WholeRecord | None:
    """The record of the runner that serves ``model``'s whole forward, or None.

    Raises:
        CheckpointError: the forward's record does not read back (as the load would read it).
    """
    forward = model.__dict__.get("forward") if isinstance(model, torch.nn.Module) else None
    describe = getattr(forward, "checkpoint_record", None)
    if not callable(describe):
        return None
    data = describe()
    try:
        return WholeRecord.from_json(Fields(data, "whole", CheckpointError))
    except IncompatibleCheckpointError as exc:
        raise CheckpointError(f"cannot save: {exc}") from exc


Rebuild = Callable[[Any, WholeRecord, torch.device], Any]
"""Rebuilds the runner of one kind onto a model holding the saved weights, checks it against
eager (CheckpointError when it differs) and returns the model to call."""
Rebuilders = Mapping[str, Rebuild]
"""Kind -> rebuilder, passed in code by the caller of the load."""


def check_libraries(path: Any, record: Mapping[str, Any], whole: WholeRecord) -> None:
    """The environment record must list every library the rebuild of ``whole`` depends on.

    Raises:
        CheckpointError: One is missing (an edited record would skip the version comparison).
    """
    versions = record.get("versions", {})
    missing = unrecorded_libraries(record, whole.backends)
    missing += [f"{whole.kind}: {lib}" for lib in whole.libraries if lib not in versions]
    if missing:
        raise CheckpointError(
            f"{path}: the environment record does not list what the rebuild needs "
            f"({'; '.join(missing[:8])}), so the environment cannot be compared: the file "
            "is damaged or was altered"
        )


def whole_rebuilder(
    path: Any, record: Mapping[str, Any], whole: WholeRecord, rebuilders: Rebuilders
) -> Rebuild:
    """The rebuilder of ``whole``'s kind, once the record lists what it needs.

    Raises:
        CheckpointError: As :func:`check_libraries`.
        IncompatibleCheckpointError: ``rebuilders`` has none for the kind.
    """
    check_libraries(path, record, whole)
    rebuild = rebuilders.get(whole.kind)
    if rebuild is None:
        raise IncompatibleCheckpointError(
            f"{path}: the model is served whole by a {whole.kind} runner, which this loader "
            "does not rebuild; load it with tunetree.load"
        )
    return rebuild
