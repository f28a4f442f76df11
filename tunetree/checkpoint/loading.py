"""Loading a checkpoint: weights into a fresh model, then only the runners the plan needs."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..backends.base import Backend, Runner
from ..backends.compile_pool import compile_pool_closed
from ..errors import (
    CheckpointError,
    IncompatibleCheckpointError,
    InvalidInputError,
)
from ..runtime.artifacts import SavedRunner, allowed_elements, load_runner, remove_with
from ..runtime.wrap import wrap, wrapped_paths
from ..signature.graph import GraphKey
from ..signature.modules import find_module, resolve_device, root_modules
from ..signature.state import eval_mode, preserved_state
from .compat import (
    check_plan,
    extract_runners,
    needed_entries,
    read_bytes,
    rebuilding,
    runner_directory,
    tuned_device,
    where,
)
from .environment import compare_records, environment_record, with_libraries
from .format import EntryRecord, Manifest, accuracy_note
from .reader import (
    Budget,
    Source,
    environment_error,
    extract,
    open_source,
    read_header,
    read_manifest,
)
from .runner_check import RunnerCheck, check_budget_bytes, check_runner
from .staging import recover
from .weights_header import read_header as read_weights_header
from .whole import Rebuild, Rebuilders, recorded_libraries, whole_rebuilder
from .writer import model_state

log = logging.getLogger(__name__)


@compile_pool_closed()
def load(
    model: Any,
    path: str | os.PathLike[str],
    *,
    ignore: Iterable[str] = (),
    device: torch.device | str | None = None,
    trust_config: bool = False,
) -> Any:
    """Rebuild a tuned model from a checkpoint, without tuning.

    Its weights replace the model's, each saved runner is rebuilt from its artifacts and
    checked against eager on the model's own weights before it serves, and the model to call
    is returned (a shallow copy when the whole model was tuned). Nothing is unpickled. Saved
    backend configurations are checked against allow-lists that cannot name programs, paths
    or code.
    Compiles a runner's check started (Inductor compiles on its first call) never outlive the
    load: Inductor's compile pool made meanwhile is shut down, its queued work cancelled.

    Args:
        model: A freshly built, untuned model of the same architecture.
        path: The checkpoint :func:`save` wrote.
        ignore: Environment record entries whose differences are waived, e.g. ``("host",)``
            for containers whose host name changes.
        device: Where to load (default: the recorded device type).
        trust_config: Skip the configuration allow-lists: only for a file you wrote yourself,
            since such a configuration can make compiling run any program it names.

    Returns:
        The tuned model to call.

    Raises:
        IncompatibleCheckpointError: Another format version or environment (every difference
            listed), or a model one runner serves whole (``generate``'s stateful model:
            :func:`tunetree.load` rebuilds it).
        CheckpointError: A damaged or hostile file, or a runner that fails its check.
        UntrustedConfigError: A saved configuration outside the allow-lists.
        InvalidInputError: ``model`` already carries a tune.

    Example:
        >>> import tempfile, torch, tunetree as tt
        >>> x, model = torch.randn(2, 8), torch.nn.Linear(8, 8).train(False)
        >>> result = tt.tune(model, [x], strategy=tt.OneBackendStrategy(
        ...     tt.backends.Eager()), cache=False, verbose=False,
        ...     measure_config=tt.MeasureConfig.quick())
        >>> path = tt.save(result, tempfile.mkdtemp() + "/linear.tt")
        >>> fast = tt.load(torch.nn.Linear(8, 8).train(False), path)
        >>> torch.equal(fast(x), result.model(x))
        True
    """
    return load_with(model, path, {}, ignore=ignore, device=device, trust_config=trust_config)


@compile_pool_closed()
def load_with(
    model: Any,
    path: str | os.PathLike[str],
    rebuilders: Rebuilders,
    *,
    ignore: Iterable[str] = (),
    device: torch.device | str | None = None,
    trust_config: bool = False,
) -> Any:
    """:func:`load`, where a model served whole is rebuilt by ``rebuilders`` (by kind).

    Raises:
        IncompatibleCheckpointError: As :func:`load`, and for a whole-model runner of a kind
            ``rebuilders`` lacks.
        CheckpointError: As :func:`load`, and for a rebuilt runner that fails its check.
    """
    path = Path(os.fspath(path))
    ignore = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    if wrapped_paths(model):
        raise InvalidInputError(
            "load() needs a freshly built, untuned model; this one already carries a tune"
        )
    recover(path)  # a directory save killed between its renames: its old copy back
    header = read_header(path)
    running = with_libraries(
        environment_record(header.record["backends"]), recorded_libraries(header.record)
    )
    differences = compare_records(header.record, running, ignore)
    if differences:
        raise environment_error(path, differences)
    with open_source(path, header) as source:
        manifest = read_manifest(source, header)
        dev = _target_device(model, device, manifest)
        size = read_bytes(path, source, manifest)
        if manifest.whole is not None:
            rebuild = whole_rebuilder(path, header.record, manifest.whole, rebuilders)
            return _load_whole(model, source, manifest, dev, rebuild)
        backends = check_plan(path, header.record, manifest, dev, size, trust_config)
        tuned, checks = _load_from(model, source, manifest, dev, backends, size)
    note = results_note(manifest, backends, checks)
    if note:
        log.warning("%s: %s", path.name, note)
    return tuned


def results_note(
    manifest: Manifest, backends: dict[int, Backend], checks: dict[int, RunnerCheck]
) -> str:
    """What a load says of the plan's results: from its content, not from the record alone.

    A plan changes results when a runner's backend does (its kind, checked against the
    artifact's content by the backend: an int8 ONNX model is not an ``onnxruntime`` runner),
    whatever its accuracy record says; each such runner's error was measured by the load's
    check. Empty when the plan keeps results and records no budget.
    """
    changing = sorted(n for n, backend in backends.items() if not backend.preserves_results)
    if not changing and manifest.accuracy is None:
        return ""
    record = dict(manifest.accuracy or {})
    note = accuracy_note(record, changes_results=bool(changing)) if record else ""
    if not changing:
        return note
    measured = []
    for n in changing:
        check = checks.get(n)
        entry = manifest.entries[n]
        error = "" if check is None or check.error is None else f" {check.metric} {check.error:.3g}"
        measured.append(f"{entry.path or '<model>'} ({backends[n].name}{error})")
    head = "the plan changes results" + (
        "" if record else " though the file records no accuracy budget"
    )
    if record and record.get("changes_results") is False:
        head += " though its accuracy record claims it keeps them"
    text = f"{head}; measured on this model's weights at load: {', '.join(measured[:8])}"
    return f"{text}. {note}" if note else text


def _load_from(
    model: Any,
    source: Source,
    manifest: Manifest,
    dev: torch.device,
    backends: dict[int, Backend],
    size: int,
) -> tuple[Any, dict[int, RunnerCheck]]:
    """Extract the weights and the needed entries' members, apply, check and wrap.

    Returns the tuned model and each checked runner's comparison with eager.
    """
    needed = needed_entries(manifest)
    workdir = Path(tempfile.mkdtemp(prefix="tunetree-load-"))
    keep = False
    try:
        budget = Budget()
        weights_file = extract(source, manifest.weights_member, manifest, workdir, budget)
        extract_runners(source, manifest, workdir, budget)
        _apply_weights(model, weights_file, dev)
        weights_file.unlink()
        checks: dict[int, RunnerCheck] = {}
        runners = _load_runners(model, manifest, backends, workdir, dev, size, checks)
        tuned = wrap(model, runners)
        keep = any(manifest.entries[n].members for n in needed)
        if keep:
            remove_with(tuned, workdir)
        return tuned, checks
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _load_whole(
    model: Any, source: Source, manifest: Manifest, dev: torch.device, rebuild: Rebuild
) -> Any:
    """The saved weights applied, then the whole-model runner rebuilt and checked on them."""
    assert manifest.whole is not None
    workdir = Path(tempfile.mkdtemp(prefix="tunetree-load-"))
    try:
        weights_file = extract(source, manifest.weights_member, manifest, workdir, Budget())
        _apply_weights(model, weights_file, dev)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rebuild(model, manifest.whole, dev)


def _target_device(
    model: Any, device: torch.device | str | None, manifest: Manifest
) -> torch.device:
    """The device to load onto; it must be of the type the plan was tuned on."""
    if device is not None:
        for module in root_modules(model).values():
            module.to(device)
    dev = resolve_device(model, device)
    tuned = manifest.device
    if tuned_device(manifest).type != dev.type:
        raise IncompatibleCheckpointError(
            f"the checkpoint was tuned on {tuned} but the model is loaded on {dev}: runners "
            f"measured on one device type do not hold on another. Load with device={tuned!r} "
            "(or move the model there first), or tune again on this device."
        )
    return dev


def _apply_weights(model: Any, weights_file: Path, device: torch.device) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    with open(weights_file, "rb") as stream:  # as tunetree info checks it
        read_weights_header(stream, weights_file.stat().st_size)
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
    backends: dict[int, Backend],
    workdir: Path,
    device: torch.device,
    size: int,
    checks: dict[int, RunnerCheck],
) -> dict[str, dict[GraphKey, Runner]]:
    """The needed entries' runners by path and graph, each checked against eager.

    A narrower graph where a runner's artifact serves less than its entry's (see
    :attr:`Runner.served`). Each runner is checked like a fresh build
    (:func:`.runner_check.check_runner`) before anything is wrapped; its comparison lands in
    ``checks`` by entry index. ``size``: the bytes the checkpoint holds.
    """
    runners: dict[str, dict[GraphKey, Runner]] = {}
    max_elements = allowed_elements(size)
    budget = check_budget_bytes(size, model)  # the bytes read, never what the file claims
    for n, backend in backends.items():
        entry = manifest.entries[n]
        directory = runner_directory(workdir, n)
        runner = _load_entry(model, entry, backend, directory, device, max_elements)
        key = runner.served or entry.graph
        check = _check_entry(model, entry, key, runner, device, budget, manifest.accuracy)
        if check is not None:
            checks[n] = check
        runners.setdefault(entry.path, {})[key] = runner
    return runners


def _check_entry(
    model: Any,
    entry: EntryRecord,
    key: GraphKey,
    runner: Runner,
    device: torch.device,
    budget: int,
    accuracy: dict[str, Any] | None,
) -> RunnerCheck | None:
    """:func:`.runner_check.check_runner` of one entry, its refusal naming the entry."""
    module = find_module(model, entry.path)
    try:
        # Runners serve eval mode (a model tuned in training mode: its eval behaviour), and the
        # check changes nothing of the model: buffers and the RNG state are put back.
        with preserved_state(model), eval_mode(model):
            return check_runner(module, key, runner, device, budget, accuracy)
    except CheckpointError as exc:
        raise CheckpointError(f"{where(entry)}: {exc}") from exc


def _load_entry(
    model: Any,
    entry: EntryRecord,
    backend: Backend,
    directory: Path,
    device: torch.device,
    max_elements: int,
) -> Runner:
    """One entry's runner, each failure named with the module path and graph."""
    path, key = entry.path, entry.graph
    try:
        module = find_module(model, path)
    except (InvalidInputError, AttributeError) as exc:
        raise CheckpointError(
            f"the model has no module at {path!r}: build the same architecture that was tuned"
        ) from exc
    saved = SavedRunner(entry.backend, entry.runner)
    with rebuilding(backend, entry):
        return load_runner(
            saved, module, key, directory, device, backend=backend, max_elements=max_elements
        )
