"""Loading a checkpoint: weights into a fresh model, then only the runners the plan needs."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..artifacts import SavedRunner, load_runner, remove_with
from ..backends.base import Runner
from ..errors import (
    BackendError,
    BackendUnavailableError,
    CheckpointError,
    IncompatibleCheckpointError,
    InvalidInputError,
    UntrustedConfigError,
)
from ..graph import GraphKey
from ..modules import find_module, resolve_device, root_modules
from ..wrap import wrap, wrapped_paths
from .environment import compare_records, environment_record, unrecorded_libraries
from .format import RUNNERS, EntryRecord, Manifest
from .reader import (
    Budget,
    Source,
    environment_error,
    extract,
    open_source,
    read_header,
    read_manifest,
)
from .writer import model_state


def load(
    model: Any,
    path: str | os.PathLike[str],
    *,
    ignore: Iterable[str] = (),
    device: torch.device | str | None = None,
    trust_config: bool = False,
) -> Any:
    """Rebuild a tuned model from a checkpoint, without tuning.

    ``model`` is a freshly built, untuned model of the same architecture. Its weights are
    replaced by the saved ones, each saved runner is rebuilt from its artifacts, and the
    model to call is returned (a shallow copy when the whole model was tuned, as after
    :func:`tunetree.tune`). Raises :class:`IncompatibleCheckpointError` for another format
    version or environment (``ignore`` waives named record entries, e.g. ``("host",)``),
    and :class:`CheckpointError` for a damaged or hostile file. Nothing is unpickled.

    Saved backend configurations are checked against allow-lists that cannot name programs,
    paths or code (:class:`UntrustedConfigError` otherwise). ``trust_config=True`` skips
    that check: pass it only for a file you wrote yourself, since such a configuration can
    make compiling run any program it names.
    """
    path = Path(os.fspath(path))
    ignore = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    if wrapped_paths(model):
        raise InvalidInputError(
            "load() needs a freshly built, untuned model; this one already carries a tune"
        )
    header = read_header(path)
    running = environment_record(header.record["backends"])
    differences = compare_records(header.record, running, ignore)
    if differences:
        raise environment_error(path, differences)
    with open_source(path, header) as source:
        manifest = read_manifest(source, header)
        _check_recorded_libraries(path, header.record, manifest)
        dev = _target_device(model, device, manifest)
        return _load_from(model, source, manifest, dev, trust_config)


def _load_from(
    model: Any, source: Source, manifest: Manifest, dev: torch.device, trust_config: bool
) -> Any:
    """Extract the weights and the needed entries' members, apply and wrap."""
    needed = _needed_entries(manifest)
    workdir = Path(tempfile.mkdtemp(prefix="tunetree-load-"))
    keep = False
    try:
        budget = Budget()
        weights_file = extract(source, manifest.weights_member, manifest, workdir, budget)
        for n in needed:
            for name in manifest.entries[n].members:
                extract(source, name, manifest, workdir, budget)
        _apply_weights(model, weights_file, dev)
        weights_file.unlink()
        runners = _load_runners(model, manifest, needed, workdir, dev, trust_config)
        tuned = wrap(model, runners)
        keep = any(manifest.entries[n].members for n in needed)
        if keep:
            remove_with(tuned, workdir)
        return tuned
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _check_recorded_libraries(path: Path, record: dict[str, Any], manifest: Manifest) -> None:
    """Every backend the plan rebuilds, and each of its libraries, must be in the record."""
    kinds = [manifest.entries[n].backend.kind for n in _needed_entries(manifest)]
    missing = unrecorded_libraries(record, kinds)
    if missing:
        raise CheckpointError(
            f"{path}: the environment record does not list what the plan needs "
            f"({'; '.join(missing[:8])}), so the environment cannot be compared: the file "
            "is damaged or was altered"
        )


def _target_device(
    model: Any, device: torch.device | str | None, manifest: Manifest
) -> torch.device:
    """The device to load onto; it must be of the type the plan was tuned on."""
    if device is not None:
        for module in root_modules(model).values():
            module.to(device)
    dev = resolve_device(model, device)
    tuned = manifest.device
    try:
        tuned_type = torch.device(tuned).type
    except RuntimeError as exc:
        raise CheckpointError(f"the manifest's device {tuned!r} is not a torch device") from exc
    if tuned_type != dev.type:
        raise IncompatibleCheckpointError(
            f"the checkpoint was tuned on {tuned} but the model is loaded on {dev}: runners "
            f"measured on one device type do not hold on another. Load with device={tuned!r} "
            "(or move the model there first), or tune again on this device."
        )
    return dev


def _needed_entries(manifest: Manifest) -> list[int]:
    """Entries to rebuild: those of paths that are wrapped.

    A path is wrapped where some graph's winner is not eager (as :meth:`Plan.runners` decides). The
    others need nothing from the file.
    """
    wrapped = {e.path for e in manifest.entries if e.backend.kind != "eager"}
    return [n for n, e in enumerate(manifest.entries) if e.path in wrapped]


def _apply_weights(model: Any, weights_file: Path, device: torch.device) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        saved = load_file(str(weights_file), device=str(device))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"the saved weights cannot be read ({exc}): the file is damaged or hostile; "
            "copy it again or save a new checkpoint"
        ) from exc
    expected = model_state(model)
    problems = []
    missing = sorted(set(expected) - set(saved))
    extra = sorted(set(saved) - set(expected))
    if missing:
        problems.append(f"missing from the checkpoint: {', '.join(missing[:8])}")
    if extra:
        problems.append(f"not in this model: {', '.join(extra[:8])}")
    for name in sorted(set(expected) & set(saved)):
        want, got = expected[name], saved[name]
        if want.shape != got.shape or want.dtype != got.dtype:
            saved_as, model_as = f"{got.dtype}{list(got.shape)}", f"{want.dtype}{list(want.shape)}"
            problems.append(f"{name}: saved {saved_as} vs model {model_as}")
    if problems:
        raise CheckpointError(
            "the checkpoint's weights do not fit this model (" + "; ".join(problems[:10]) + "). "
            "Build the same architecture, with the same configuration and dtype, as the model "
            "that was tuned."
        )
    with torch.no_grad():
        for prefix, module in root_modules(model).items():
            start = f"{prefix}." if prefix else ""
            part = {k[len(start) :]: v for k, v in saved.items() if k.startswith(start)}
            module.load_state_dict(part, strict=True)


def _load_runners(
    model: Any,
    manifest: Manifest,
    needed: list[int],
    workdir: Path,
    device: torch.device,
    trust_config: bool,
) -> dict[str, dict[GraphKey, Runner]]:
    runners: dict[str, dict[GraphKey, Runner]] = {}
    for n in needed:
        entry = manifest.entries[n]
        directory = workdir.joinpath(RUNNERS, str(n))
        directory.mkdir(parents=True, exist_ok=True)
        runners.setdefault(entry.path, {})[entry.graph] = _load_entry(
            model, entry, directory, device, trust_config
        )
    return runners


def _load_entry(
    model: Any, entry: EntryRecord, directory: Path, device: torch.device, trust_config: bool
) -> Runner:
    """One entry's runner, each failure named with the module path and graph."""
    path, key, kind = entry.path, entry.graph, entry.backend.kind
    where = f"{path or '<model>'} {key}"
    try:
        backend = entry.backend.backend(trust_config=trust_config)
    except UntrustedConfigError as exc:
        raise UntrustedConfigError(f"{where}: {exc}") from exc
    except BackendUnavailableError as exc:
        raise IncompatibleCheckpointError(
            f"{where} uses backend {kind!r}, which this tunetree does not know; load with "
            "the tunetree release that saved it, or tune again"
        ) from exc
    except Exception as exc:
        raise CheckpointError(
            f"{where}: the saved {kind} configuration is not valid here ({exc})"
        ) from exc
    reason = backend.unavailable_reason(device)
    if reason is not None:
        raise IncompatibleCheckpointError(
            f"{where} uses {backend.name}, unavailable here: {reason}"
        )
    try:
        module = find_module(model, path)
    except (InvalidInputError, AttributeError) as exc:
        raise CheckpointError(
            f"the model has no module at {path!r}: build the same architecture that was tuned"
        ) from exc
    saved = SavedRunner(entry.backend, entry.runner)
    try:
        return load_runner(saved, module, key, directory, device, backend=backend)
    except Exception as exc:
        raise BackendError(
            f"could not rebuild the saved {backend.name} runner of {where}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
