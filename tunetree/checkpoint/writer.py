"""Writing a checkpoint: weights, plan entries, winners' artifacts, environment record.

Only what the plan reaches is written, into a staging directory beside the target that is
flushed and put in place atomically (:mod:`.staging`), so a save killed halfway leaves the
previous checkpoint intact, and the next save or load cleans up after it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .._util.fs import fsync_dir
from ..backends.base import Backend
from ..errors import BackendError, CheckpointError, InvalidInputError
from ..runtime.artifacts import BackendRecord, file_sha256, files_under, save_runner
from ..runtime.plan import Plan, PlanEntry
from ..runtime.wrap import dispatcher_of
from ..signature.modules import hidden_modules, module_paths, resolve_device, root_modules
from .environment import environment_record, with_libraries
from .format import (
    DIR_ENVIRONMENT,
    DIR_FORMAT,
    FORMAT_VERSION,
    HEADER,
    MANIFEST,
    RUNNERS,
    WEIGHTS,
    EntryRecord,
    Manifest,
    MemberRecord,
)
from .staging import install, recover, sibling
from .whole import whole_record

log = logging.getLogger(__name__)


def save(
    model_or_result: Any, path: str | os.PathLike[str], *, compress_checkpoint: bool = True
) -> Path:
    """Save a tuned model (or a tune result) so that :func:`load` can rebuild it without tuning.

    The file holds its weights, its plan, the winning runners' artifacts and the environment
    record; a model whose whole forward one runner serves (``generate``'s stateful model on
    the CPU) holds its weights and that runner's config, which the load re-exports from the
    weights and checks against eager. Only what the plan reaches is written; losing
    candidates leave no trace. The write is atomic: a temporary file (or directory) beside
    ``path`` is filled, flushed to disk and put at the target in one step
    (:func:`.staging.install`), so a save killed halfway leaves the previous checkpoint
    intact; what a killed save left beside it is cleaned up first.

    Args:
        model_or_result: ``result.model``, or the result of :func:`tunetree.tune` or
            :func:`tunetree.auto_tune` itself.
        path: Where to write (a ``.tt`` file, or a directory without compression).
        compress_checkpoint: False writes a directory with the same content.

    Returns:
        The path written.

    Raises:
        InvalidInputError: The target's directory is missing, the target is a directory that
            is not a checkpoint, or the model holds modules no ``state_dict`` reaches (in a
            plain ``dict``/``list`` attribute).
        BackendError: A winning runner cannot be saved.
        CheckpointError: The weights cannot be written as safetensors.

    Example:
        >>> import tempfile, torch, tunetree as tt
        >>> model = torch.nn.Linear(8, 8).train(False)
        >>> result = tt.tune(model, [torch.randn(2, 8)], strategy=tt.OneBackendStrategy(
        ...     tt.backends.Eager()), cache=False, verbose=False,
        ...     measure_config=tt.MeasureConfig.quick())
        >>> path = tt.save(result, tempfile.mkdtemp() + "/linear.tt")
        >>> path.name
        'linear.tt'
    """
    model, plan, graphs = _model_and_plan(model_or_result)
    _refuse_unsaved_forward(model)
    whole = whole_record(model)
    _refuse_hidden_modules(model)
    target = Path(os.fspath(path))
    if target.parent.is_dir():
        recover(target)  # a save killed before: its old copy back, its staging removed
    if not target.parent.is_dir():
        raise InvalidInputError(
            f"cannot save to {target}: directory {target.parent} does not exist"
        )
    if target.is_dir() and not (target / DIR_FORMAT).is_file():
        raise InvalidInputError(
            f"{target} is a directory that is not a tunetree checkpoint; refusing to replace it"
        )
    device = resolve_device(model, None)
    kinds = [entry.backend for entry in plan.entries]
    record = with_libraries(
        environment_record([*kinds, *(whole.backends if whole else ())]),
        whole.libraries if whole else (),
    )
    record_bytes = json.dumps(record, sort_keys=True).encode("utf-8")
    staging = sibling(target)
    staging.mkdir(mode=0o700)
    try:
        entries = [_save_entry(n, entry, staging, graphs) for n, entry in enumerate(plan.entries)]
        tensors = _write_weights(model, staging / WEIGHTS)
        members = {WEIGHTS: MemberRecord(*file_sha256(staging / WEIGHTS))}
        for saved in entries:
            for name in saved.members:
                members[name] = MemberRecord(*file_sha256(staging / name))
        manifest = Manifest(
            environment_sha256=hashlib.sha256(record_bytes).hexdigest(),
            members=dict(sorted(members.items())),
            weights_member=WEIGHTS,
            entries=entries,
            tunetree_version=record["versions"]["tunetree"],
            created_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            model_type=f"{type(model).__module__}.{type(model).__qualname__}",
            device=str(device),
            depth=plan.depth,
            weights_tensors=tensors,
            accuracy=plan.accuracy,
            whole=whole,
        )
        (staging / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1, sort_keys=True))
        if compress_checkpoint:
            _write_tt(staging, record_bytes, target)
        else:
            (staging / DIR_ENVIRONMENT).write_bytes(record_bytes)
            (staging / DIR_FORMAT).write_text(f"{FORMAT_VERSION}\n")
            _fsync_tree(staging)
            install(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _refuse_unsaved_forward(model: Any) -> None:
    """Refuse a model whose forward (or ``generate``) is served by what a checkpoint lacks.

    Such a stand-in says why in its ``save_refusal`` (the GPU's multi-step decode
    loop): saving the model without it would write a
    file that loads as another model.
    """
    for name in ("forward", "generate"):
        served = model.__dict__.get(name) if isinstance(model, torch.nn.Module) else None
        reason = getattr(served, "save_refusal", None)
        if isinstance(reason, str) and reason:
            raise CheckpointError(f"cannot save: {reason}")


def _refuse_hidden_modules(model: Any) -> None:
    """Refuse a model whose modules hold modules in a plain dict or list.

    Their weights are in no ``state_dict``, so after loading they would silently be the fresh
    model's.
    """
    hidden = hidden_modules(model)
    if hidden:
        raise InvalidInputError(
            f"cannot save: attribute {hidden[0]!r} holds modules in a plain dict or list, so "
            "their weights are in no state_dict and a loaded checkpoint would use the fresh "
            "model's weights instead; hold them in nn.ModuleDict / nn.ModuleList"
        )


def _model_and_plan(obj: Any) -> tuple[Any, Plan, list[Any]]:
    """The model to save, its plan and (for results) the graph results.

    The graph results carry each winner's measurements. A bare model's plan is read from its
    dispatchers.
    """
    plan = getattr(obj, "plan", None)
    if isinstance(plan, Plan) and hasattr(obj, "model"):
        graphs = getattr(obj, "graphs", None) or []
        if isinstance(graphs, Mapping):  # auto_tune keeps every depth's graphs
            graphs = [g for depth_graphs in graphs.values() for g in depth_graphs]
        return obj.model, plan, list(graphs)
    root_modules(obj)  # refuses what is neither a module nor a pipeline of modules
    entries: list[PlanEntry] = []
    seen: set[int] = set()
    depth, accuracy = None, None
    for path, module in module_paths(obj):
        dispatcher = dispatcher_of(module)
        if dispatcher is None or id(module) in seen:
            continue
        seen.add(id(module))
        measured = {}
        if dispatcher.plan is not None:  # tuned by tunetree: keep the plan's measurements
            depth, accuracy = dispatcher.plan.depth, dispatcher.plan.accuracy
            measured = {e.key: e for e in dispatcher.plan.entries if e.path == dispatcher.path}
        for key, runner in dispatcher.runners.items():
            known = measured.get(key)
            entries.append(
                PlanEntry(
                    path,
                    key,
                    runner.backend,
                    runner,
                    known.latency_s if known else None,
                    known.eager_latency_s if known else None,
                )
            )
    return obj, Plan(entries, depth, accuracy), []


def _save_entry(n: int, entry: PlanEntry, staging: Path, graphs: list[Any]) -> EntryRecord:
    """Write one runner's artifacts under ``runners/<n>/`` and record the entry."""
    where = f"{entry.path or '<model>'} {entry.key}"
    directory = staging / RUNNERS / str(n)
    directory.mkdir(parents=True)
    try:
        saved = save_runner(entry.runner, directory, for_checkpoint=True)
    except BackendError as exc:
        raise BackendError(f"{exc} (at {where})") from exc
    _check_config_round_trip(entry.backend)
    if not saved.files:
        directory.rmdir()
    tolerances = entry.backend.tolerances()
    winner = next(
        (g.winner for g in graphs if g.path == entry.path and g.graph.key == entry.key), None
    )
    return EntryRecord(
        path=entry.path,
        graph=entry.key,
        graph_text=str(entry.key),
        backend=BackendRecord.of(entry.backend, for_checkpoint=True),
        runner=saved.description,
        members=[f"{RUNNERS}/{n}/{f.path}" for f in saved.files],
        latency_s=entry.latency_s,
        eager_latency_s=entry.eager_latency_s,
        tolerances=tolerances.to_json() if tolerances is not None else None,
        max_abs_diff=getattr(winner, "max_abs_diff", None),
    )


def _check_config_round_trip(backend: Backend) -> None:
    try:
        same = type(backend)(**backend.config()) == backend
    except Exception:
        same = False
    if not same:
        log.warning(
            "backend %s does not rebuild exactly from its JSON config; the loaded runner may "
            "be configured differently",
            backend.name,
        )


def _write_weights(model: Any, path: Path) -> int:
    """The model's state dict as safetensors (no pickle).

    Tensors that share memory (tied weights) or are not contiguous are copied first, as safetensors
    requires.
    """
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    storages: set[tuple[str, int]] = set()
    for name, value in model_state(model).items():
        tensor = value.detach()
        storage = (str(tensor.device), tensor.untyped_storage().data_ptr())
        if storage in storages or not tensor.is_contiguous():
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        storages.add(storage)
        tensors[name] = tensor
    try:
        save_file(tensors, str(path), metadata={"tunetree_format": str(FORMAT_VERSION)})
    except Exception as exc:
        raise CheckpointError(
            f"could not write the model's weights as safetensors: {type(exc).__name__}: {exc}"
        ) from exc
    return len(tensors)


def model_state(model: Any) -> dict[str, torch.Tensor]:
    """State dict of a module, or of every module of a pipeline under its attribute name."""
    state: dict[str, torch.Tensor] = {}
    for prefix, module in root_modules(model).items():
        for name, value in module.state_dict().items():
            key = f"{prefix}.{name}" if prefix else name
            if not isinstance(value, torch.Tensor):
                raise CheckpointError(
                    f"state dict entry {key} is a {type(value).__name__}, not a tensor: "
                    "checkpoints store tensors only (no pickled objects)"
                )
            state[key] = value
    return state


def _write_tt(staging: Path, record_bytes: bytes, target: Path) -> None:
    """Header + record + zip of the staging directory, written atomically to ``target``."""
    tmp = sibling(target)
    try:
        with open(tmp, "xb") as f:
            f.write(HEADER.pack(FORMAT_VERSION, len(record_bytes)))
            f.write(record_bytes)
            with zipfile.ZipFile(f, "w") as archive:
                names = [MANIFEST, *(n for n in files_under(staging) if n != MANIFEST)]
                for name in names:
                    # Weights rarely compress; storing them keeps loading a plain copy.
                    method = zipfile.ZIP_STORED if name == WEIGHTS else zipfile.ZIP_DEFLATED
                    archive.write(staging / name, name, compress_type=method)
            f.flush()
            os.fsync(f.fileno())
        install(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            with open(os.path.join(dirpath, filename), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(dirpath))
