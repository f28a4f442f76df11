"""The ``.tt`` checkpoint: a tuned model saved once, loaded without tuning again.

Layout of a ``.tt`` file::

    uint32 little-endian   format version (FORMAT_VERSION)
    uint32 little-endian   length in bytes of the environment record
    bytes                  environment record: UTF-8 JSON (see tunetree.environment)
    zip archive            manifest.json, weights.safetensors, runners/<n>/<artifact files>

``save(..., compress_checkpoint=False)`` writes a directory instead: ``tunetree-format``
(the version as text), ``environment.json`` (the record) and the archive's members as
files. Loading checks, in this order and reading nothing more before each check passes:
the format version, the environment record against the running environment, then the
manifest, and only then extracts the members the plan needs, each verified against its
SHA-256 before use. Nothing is unpickled: weights are safetensors, the rest is JSON or
artifacts that the backends read with their own non-executing loaders.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import struct
import tempfile
import weakref
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from ._fs import fsync_dir
from .backends import backend_type
from .backends.base import Backend, Runner
from .environment import Difference, compare_records, environment_record
from .errors import (
    BackendError,
    BackendUnavailableError,
    CheckpointError,
    IncompatibleCheckpointError,
    InvalidInputError,
)
from .graph import GraphKey
from .inspection import find_module, module_paths, resolve_device, root_modules
from .plan import Plan, PlanEntry
from .wrap import dispatcher_of, wrap, wrapped_paths

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""The ``.tt`` format version this tunetree writes and reads."""

LEGACY_ZIP_VERSION = int.from_bytes(b"PK\x03\x04", "little")
"""What a bare zip archive (written before the versioned header existed) reads as: 67324752."""

MAX_RECORD_BYTES = 1 << 20
"""Largest environment record accepted (a real one is a few KiB)."""
MAX_MANIFEST_BYTES = 64 << 20
"""Largest manifest accepted."""
MAX_MEMBER_BYTES = 64 << 30
"""Largest single member extracted (uncompressed)."""
MAX_TOTAL_BYTES = 256 << 30
"""Largest total extracted by one load (uncompressed)."""
MAX_COMPRESSION_RATIO = 200
"""Members above 1 MiB may not expand more than this over their compressed size (deflate
reaches about 1000 only on degenerate input such as a zip bomb's zeros)."""

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
RUNNERS = "runners"
DIR_FORMAT = "tunetree-format"
DIR_ENVIRONMENT = "environment.json"

_HEADER = struct.Struct("<II")
_KIND = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
"""What a backend kind in a record may look like (it names distributions to look up)."""
_CHUNK = 1 << 20


class EnvironmentMismatchError(IncompatibleCheckpointError):
    """The checkpoint was tuned in another environment; ``differences`` lists every entry."""

    def __init__(self, message: str, differences: list[Difference]) -> None:
        super().__init__(message)
        self.differences = differences


# ----------------------------------------------------------------------------- saving


def save(
    model_or_result: Any, path: str | os.PathLike[str], *, compress_checkpoint: bool = True
) -> Path:
    """Save a tuned model (or a tune result) so that :func:`load` can rebuild it without
    tuning: its weights, its plan, the winning runners' artifacts and the environment
    record. Only what the plan reaches is written; losing candidates leave no trace.

    ``compress_checkpoint=False`` writes a directory with the same content. The write is
    atomic: a temporary file (or directory) beside ``path`` is filled, flushed to disk and
    renamed over the target, so a save killed halfway leaves the previous checkpoint intact.
    Returns the path written.
    """
    model, plan, graphs = _model_and_plan(model_or_result)
    target = Path(os.fspath(path))
    if not target.parent.is_dir():
        raise InvalidInputError(
            f"cannot save to {target}: directory {target.parent} does not exist"
        )
    if target.is_dir() and not (target / DIR_FORMAT).is_file():
        raise InvalidInputError(
            f"{target} is a directory that is not a tunetree checkpoint; refusing to replace it"
        )
    device = resolve_device(model, None)
    record = environment_record(entry.backend for entry in plan.entries)
    record_bytes = json.dumps(record, sort_keys=True).encode("utf-8")
    staging = _sibling(target)
    staging.mkdir(mode=0o700)
    try:
        entries = [_save_entry(n, entry, staging, graphs) for n, entry in enumerate(plan.entries)]
        tensors = _write_weights(model, staging / WEIGHTS)
        manifest = {
            "format_version": FORMAT_VERSION,
            "tunetree_version": record["versions"]["tunetree"],
            "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"
            ),
            "environment_sha256": hashlib.sha256(record_bytes).hexdigest(),
            "model_type": f"{type(model).__module__}.{type(model).__qualname__}",
            "device": str(device),
            "depth": plan.depth,
            "weights": {"member": WEIGHTS, "format": "safetensors", "tensors": tensors},
            "entries": entries,
            "members": {name: _digest(staging / name) for name in _files_under(staging)},
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        if compress_checkpoint:
            _write_tt(staging, record_bytes, target)
        else:
            (staging / DIR_ENVIRONMENT).write_bytes(record_bytes)
            (staging / DIR_FORMAT).write_text(f"{FORMAT_VERSION}\n")
            _fsync_tree(staging)
            _install(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _model_and_plan(obj: Any) -> tuple[Any, Plan, list[Any]]:
    """The model to save, its plan and (for results) the graph results with each winner's
    measurements. A bare model's plan is read from its dispatchers."""
    plan = getattr(obj, "plan", None)
    if isinstance(plan, Plan) and hasattr(obj, "model"):
        graphs = getattr(obj, "graphs", None) or []
        if isinstance(graphs, Mapping):  # auto_tune keeps every depth's graphs
            graphs = [g for depth_graphs in graphs.values() for g in depth_graphs]
        return obj.model, plan, list(graphs)
    root_modules(obj)  # refuses what is neither a module nor a pipeline of modules
    entries: list[PlanEntry] = []
    seen: set[int] = set()
    depth = None
    for path, module in module_paths(obj):
        dispatcher = dispatcher_of(module)
        if dispatcher is None or id(module) in seen:
            continue
        seen.add(id(module))
        measured = {}
        if dispatcher.plan is not None:  # tuned by tunetree: keep the plan's measurements
            depth = dispatcher.plan.depth
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
    return obj, Plan(entries, depth), []


def _save_entry(n: int, entry: PlanEntry, staging: Path, graphs: list[Any]) -> dict[str, Any]:
    """Write one runner's artifacts under ``runners/<n>/`` and describe the entry."""
    where = f"{entry.path or '<model>'} {entry.key}"
    directory = staging / RUNNERS / str(n)
    directory.mkdir(parents=True)
    try:
        description = entry.runner.save(directory)
        json.dumps(description)
    except Exception as exc:
        raise BackendError(
            f"could not save the {entry.backend.name} runner of {where}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    _check_config_round_trip(entry.backend)
    members = _files_under(directory, prefix=f"{RUNNERS}/{n}")
    if not members:
        directory.rmdir()
    tolerances = entry.backend.tolerances()
    winner = next(
        (g.winner for g in graphs if g.path == entry.path and g.graph.key == entry.key), None
    )
    return {
        "path": entry.path,
        "graph": entry.key.to_json(),
        "graph_text": str(entry.key),
        "backend": {
            "kind": entry.backend.kind,
            "name": entry.backend.name,
            "config": entry.backend.config(),
        },
        "runner": description,
        "members": members,
        "latency_s": entry.latency_s,
        "eager_latency_s": entry.eager_latency_s,
        "tolerances": tolerances.describe() if tolerances is not None else None,
        "max_abs_diff": getattr(winner, "max_abs_diff", None),
    }


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
    """The model's state dict as safetensors (no pickle). Tensors that share memory (tied
    weights) or are not contiguous are copied first, as safetensors requires."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    storages: set[tuple[str, int]] = set()
    for name, value in _state_dict(model).items():
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


def _state_dict(model: Any) -> dict[str, torch.Tensor]:
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
    tmp = _sibling(target)
    try:
        with open(tmp, "xb") as f:
            f.write(_HEADER.pack(FORMAT_VERSION, len(record_bytes)))
            f.write(record_bytes)
            with zipfile.ZipFile(f, "w") as archive:
                names = [MANIFEST, *(n for n in _files_under(staging) if n != MANIFEST)]
                for name in names:
                    # Weights rarely compress; storing them keeps loading a plain copy.
                    method = zipfile.ZIP_STORED if name == WEIGHTS else zipfile.ZIP_DEFLATED
                    archive.write(staging / name, name, compress_type=method)
            f.flush()
            os.fsync(f.fileno())
        _install(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def _install(tmp: Path, target: Path) -> None:
    """Move a fully written (and fsynced) file or directory onto ``target`` and make the
    rename durable. A file replaces a file in one atomic rename; anything involving a
    directory moves the old target aside first and deletes it after the new one is in."""
    if target.exists() and (tmp.is_dir() or target.is_dir()):
        aside = _sibling(target, "old")
        os.rename(target, aside)
        os.rename(tmp, target)
        fsync_dir(target.parent)
        if aside.is_dir():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.unlink()
    else:
        os.replace(tmp, target)
    fsync_dir(target.parent)


def _sibling(target: Path, tag: str = "tmp") -> Path:
    return target.with_name(f"{target.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            with open(os.path.join(dirpath, filename), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(dirpath))


def _files_under(root: Path, prefix: str = "") -> list[str]:
    """Member names (``/``-separated, relative to ``root`` plus ``prefix``) of every regular
    file below ``root``; refuses links, which a checkpoint cannot carry."""
    names = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for filename in sorted(filenames):
            full = Path(dirpath) / filename
            if not stat.S_ISREG(full.lstat().st_mode):
                raise BackendError(f"{full} is not a regular file; a checkpoint stores files only")
            relative = full.relative_to(root).as_posix()
            names.append(f"{prefix}/{relative}" if prefix else relative)
    return names


def _digest(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"sha256": h.hexdigest(), "size": size}


# ----------------------------------------------------------------------------- reading


@dataclass
class _Header:
    """What precedes the archive: the version and the environment record."""

    version: int
    record: dict[str, Any]
    record_bytes: bytes
    archive_offset: int


def _version_error(path: Path, version: int) -> IncompatibleCheckpointError:
    if version == LEGACY_ZIP_VERSION:
        return IncompatibleCheckpointError(
            f"{path} begins with 'PK\\x03\\x04' (read as format version {version}): it is a "
            "bare zip archive written before tunetree checkpoints had a versioned header and "
            "an environment record, so nothing says where its tuning holds. Tune the model "
            "again on this machine and save a new checkpoint."
        )
    return IncompatibleCheckpointError(
        f"{path} is checkpoint format version {version}; this tunetree reads format version "
        f"{FORMAT_VERSION} only. Load it with the tunetree release that wrote it, or tune "
        "again and save with this one."
    )


def _read_header(path: Path) -> _Header:
    """Version first (nothing else is read when it differs), then the record."""
    if path.is_dir():
        return _read_dir_header(path)
    try:
        with open(path, "rb") as f:
            return _read_file_header(path, f)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc


def _read_file_header(path: Path, f: IO[bytes]) -> _Header:
    head = f.read(4)
    if len(head) < 4:
        raise CheckpointError(
            f"{path} is truncated: {len(head)} bytes where a .tt file begins with a 4-byte "
            "format version; the file is damaged or not a tunetree checkpoint"
        )
    version = int.from_bytes(head, "little")
    if version != FORMAT_VERSION:
        raise _version_error(path, version)
    raw = f.read(4)
    if len(raw) < 4:
        raise CheckpointError(
            f"{path} is truncated inside its header (no record length); save it again"
        )
    length = int.from_bytes(raw, "little")
    available = os.fstat(f.fileno()).st_size - _HEADER.size
    if length > available:
        raise CheckpointError(
            f"{path}: the environment record is said to be {length} bytes but only "
            f"{available} bytes follow the header; the file is truncated or damaged"
        )
    if length > MAX_RECORD_BYTES:
        raise CheckpointError(
            f"{path}: an environment record of {length} bytes is implausible (limit "
            f"{MAX_RECORD_BYTES}); the file is damaged or not a tunetree checkpoint"
        )
    record_bytes = f.read(length)
    return _Header(version, _parse_record(path, record_bytes), record_bytes, _HEADER.size + length)


def _read_dir_header(path: Path) -> _Header:
    marker = path / DIR_FORMAT
    try:
        text = _read_small(marker, 64).decode("ascii").strip()
        version = int(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is a directory without a readable {DIR_FORMAT} file: not a tunetree "
            f"checkpoint directory ({exc})"
        ) from exc
    if version != FORMAT_VERSION:
        raise _version_error(path, version)
    try:
        record_bytes = _read_small(path / DIR_ENVIRONMENT, MAX_RECORD_BYTES)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read {DIR_ENVIRONMENT}: {exc}") from exc
    return _Header(version, _parse_record(path, record_bytes), record_bytes, 0)


def _read_small(path: Path, limit: int) -> bytes:
    """A regular file (no link) of at most ``limit`` bytes."""
    if not stat.S_ISREG(path.lstat().st_mode):
        raise OSError(f"{path.name} is not a regular file")
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path.name} is larger than {limit} bytes")
    return data


def _parse_record(path: Path, data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(
            f"{path}: the environment record is not valid UTF-8 JSON ({exc}); the file is "
            "damaged or not a tunetree checkpoint"
        ) from exc
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("versions"), dict)
        or not isinstance(record.get("backends"), list)
        or not all(isinstance(k, str) and _KIND.fullmatch(k) for k in record["backends"])
    ):
        raise CheckpointError(
            f"{path}: the environment record lacks 'versions' or 'backends'; the file is "
            "damaged or not a tunetree checkpoint"
        )
    return record


def _environment_error(path: Path, differences: list[Difference]) -> EnvironmentMismatchError:
    lines = "\n".join(f"  {d}" for d in differences)
    example = "('host',)" if any(d.entry == "host" for d in differences) else "('ENTRY', ...)"
    return EnvironmentMismatchError(
        f"{path} was tuned in another environment ({len(differences)} differing "
        f"entries, tuned vs running):\n{lines}\n"
        "Tuning results belong to the hardware and libraries they were measured on: here the "
        "saved winners may be slower than eager or fail to build. Tune again on this machine "
        "(tt.tune / tt.auto_tune) and save a new checkpoint. Only to waive an entry known not "
        "to matter (e.g. a container's host name that changes on every start), name it "
        f"explicitly: tt.load(model, path, ignore={example}).",
        differences,
    )


def _check_member_name(name: str) -> None:
    """Refuse names that could land outside the extraction directory (zip-slip)."""
    parts = name.split("/")
    if (
        not name
        or "\\" in name
        or "\x00" in name
        or name.startswith("/")
        or ":" in parts[0]
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise CheckpointError(
            f"the archive holds a member named {name!r}, which would be written outside its "
            "directory (absolute path, '..', backslash or drive letter): the file is hostile "
            "or damaged; nothing was extracted"
        )


class _Source:
    """Read access to an archive's members (zip) or a checkpoint directory's files."""

    def size(self, name: str) -> int:
        raise NotImplementedError

    def compressed_size(self, name: str) -> int:
        return self.size(name)

    def open(self, name: str) -> IO[bytes]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _ZipSource(_Source):
    def __init__(self, path: Path, archive_offset: int) -> None:
        try:
            self.zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise CheckpointError(
                f"{path}: the archive after the header cannot be read ({exc}); the file is "
                "truncated or damaged"
            ) from exc
        self.infos: dict[str, zipfile.ZipInfo] = {}
        try:
            self._index(path, archive_offset)
        except BaseException:
            self.close()
            raise

    def _index(self, path: Path, archive_offset: int) -> None:
        for info in self.zip.infolist():
            _check_member_name(info.filename)
            if info.filename in self.infos:
                raise CheckpointError(f"{path}: the archive holds {info.filename!r} twice")
            if info.flag_bits & 0x1:
                raise CheckpointError(f"{path}: member {info.filename!r} is encrypted")
            self.infos[info.filename] = info
        first = min((i.header_offset for i in self.infos.values()), default=archive_offset)
        if first != archive_offset:
            raise CheckpointError(
                f"{path}: the archive does not start right after the environment record "
                f"(offset {first}, expected {archive_offset}); the file is damaged"
            )

    def _info(self, name: str) -> zipfile.ZipInfo:
        info = self.infos.get(name)
        if info is None:
            raise CheckpointError(f"the archive lacks member {name!r}; the file is incomplete")
        return info

    def size(self, name: str) -> int:
        return self._info(name).file_size

    def compressed_size(self, name: str) -> int:
        return self._info(name).compress_size

    def open(self, name: str) -> IO[bytes]:
        return self.zip.open(self._info(name))

    def close(self) -> None:
        self.zip.close()


class _DirSource(_Source):
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def _path(self, name: str) -> Path:
        _check_member_name(name)
        path = self.root.joinpath(*name.split("/"))
        try:
            mode = path.lstat().st_mode
        except OSError as exc:
            raise CheckpointError(f"the checkpoint directory lacks {name!r}: {exc}") from exc
        if not stat.S_ISREG(mode) or not path.resolve().is_relative_to(self.root):
            raise CheckpointError(f"{name!r} in the checkpoint directory is not a regular file")
        return path

    def size(self, name: str) -> int:
        return self._path(name).lstat().st_size

    def open(self, name: str) -> IO[bytes]:
        return open(self._path(name), "rb")


def _read_member(source: _Source, name: str, limit: int) -> bytes:
    if source.size(name) > limit:
        raise CheckpointError(f"member {name!r} is larger than {limit} bytes")
    try:
        with source.open(name) as f:
            data = f.read(limit + 1)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:
        raise CheckpointError(
            f"member {name!r} is damaged ({exc}): copy the checkpoint again or save a new one"
        ) from exc
    if len(data) > limit:
        raise CheckpointError(f"member {name!r} is larger than {limit} bytes")
    return data


@dataclass
class _Manifest:
    """A validated manifest."""

    data: dict[str, Any]
    entries: list[dict[str, Any]]
    members: dict[str, dict[str, Any]]
    keys: list[GraphKey] = field(default_factory=list)


def _bad_manifest(what: str) -> CheckpointError:
    return CheckpointError(f"the checkpoint's manifest is malformed ({what}); the file is damaged")


def _read_manifest(source: _Source, header: _Header) -> _Manifest:
    try:
        data = json.loads(_read_member(source, MANIFEST, MAX_MANIFEST_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad_manifest(f"not UTF-8 JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _bad_manifest("not an object")
    if data.get("environment_sha256") != hashlib.sha256(header.record_bytes).hexdigest():
        raise CheckpointError(
            "the environment record does not belong to this archive (its SHA-256 differs from "
            "the one the manifest holds): the header was altered or the file was spliced"
        )
    members = data.get("members")
    if not isinstance(members, dict):
        raise _bad_manifest("no member table")
    for name, meta in members.items():
        _check_member_name(name)
        if (
            not isinstance(meta, dict)
            or not isinstance(meta.get("sha256"), str)
            or not isinstance(meta.get("size"), int)
            or meta["size"] < 0
        ):
            raise _bad_manifest(f"member {name!r} lacks a checksum or size")
    weights = data.get("weights")
    if not isinstance(weights, dict) or weights.get("member") not in members:
        raise _bad_manifest("no weights member")
    if weights.get("format") != "safetensors":
        raise CheckpointError(
            f"weights stored as {weights.get('format')!r}; this tunetree reads safetensors only "
            "(it never unpickles weights)"
        )
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise _bad_manifest("no entry list")
    keys = []
    for entry in entries:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("path"), str)
            and isinstance(entry.get("backend"), dict)
            and isinstance(entry["backend"].get("kind"), str)
            and isinstance(entry["backend"].get("config"), dict)
            and isinstance(entry.get("runner"), dict)
            and isinstance(entry.get("members"), list)
            and all(isinstance(m, str) and m in members for m in entry["members"])
        ):
            raise _bad_manifest("an entry lacks its path, backend, runner or members")
        try:
            keys.append(GraphKey.from_json(entry.get("graph")))
        except ValueError as exc:
            raise _bad_manifest(f"graph of {entry['path'] or '<model>'}: {exc}") from exc
    return _Manifest(data, entries, members, keys)


class _Budget:
    """Bytes a load may still extract (size-bomb protection)."""

    def __init__(self, total: int) -> None:
        self.left = total

    def take(self, name: str, size: int) -> None:
        if size > MAX_MEMBER_BYTES or size > self.left:
            raise CheckpointError(
                f"member {name!r} would extract to {size} bytes, over the limit "
                f"(tunetree.checkpoint.MAX_MEMBER_BYTES / MAX_TOTAL_BYTES); refusing a "
                "possible zip bomb"
            )
        self.left -= size


def _extract(source: _Source, name: str, manifest: _Manifest, root: Path, budget: _Budget) -> Path:
    """Copy one member into ``root``, verifying its size and SHA-256 on the way."""
    _check_member_name(name)
    meta = manifest.members.get(name)
    if meta is None:
        raise CheckpointError(f"member {name!r} is not listed in the manifest")
    size = int(meta["size"])
    declared = source.size(name)
    if declared != size:
        raise CheckpointError(
            f"member {name!r} is {declared} bytes but the manifest says {size}; the file is "
            "damaged or was altered"
        )
    budget.take(name, size)
    packed = source.compressed_size(name)
    if size > _CHUNK and size > MAX_COMPRESSION_RATIO * max(packed, 1):
        raise CheckpointError(
            f"member {name!r} expands {size / max(packed, 1):.0f}x ({packed} -> {size} "
            "bytes): refusing a possible zip bomb"
        )
    dest = root.joinpath(*name.split("/"))
    if not dest.resolve().is_relative_to(root.resolve()):
        raise CheckpointError(f"member {name!r} would be written outside its directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    written = 0
    try:
        with source.open(name) as src, open(dest, "xb") as out:
            while chunk := src.read(_CHUNK):
                written += len(chunk)
                if written > size:
                    raise CheckpointError(f"member {name!r} holds more bytes than declared")
                h.update(chunk)
                out.write(chunk)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:
        raise CheckpointError(
            f"member {name!r} is damaged ({exc}): copy the checkpoint again or save a new one"
        ) from exc
    if written != size or h.hexdigest() != meta["sha256"]:
        raise CheckpointError(
            f"member {name!r} fails its checksum (SHA-256 differs from the manifest's): the "
            "file is damaged or was altered. Copy it again or save a new checkpoint."
        )
    return dest


@contextlib.contextmanager
def _open_source(path: Path, header: _Header) -> Iterator[_Source]:
    source: _Source = _DirSource(path) if path.is_dir() else _ZipSource(path, header.archive_offset)
    try:
        yield source
    finally:
        source.close()


# ----------------------------------------------------------------------------- loading


def load(
    model: Any,
    path: str | os.PathLike[str],
    *,
    ignore: Iterable[str] = (),
    device: torch.device | str | None = None,
) -> Any:
    """Rebuild a tuned model from a checkpoint, without tuning.

    ``model`` is a freshly built, untuned model of the same architecture. Its weights are
    replaced by the saved ones, each saved runner is rebuilt from its artifacts, and the
    model to call is returned (a shallow copy when the whole model was tuned, as after
    :func:`tunetree.tune`). Raises :class:`IncompatibleCheckpointError` for another format
    version or environment (``ignore`` waives named record entries, e.g. ``("host",)``),
    and :class:`CheckpointError` for a damaged or hostile file. Nothing is unpickled.
    """
    path = Path(os.fspath(path))
    ignore = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    if wrapped_paths(model):
        raise InvalidInputError(
            "load() needs a freshly built, untuned model; this one already carries a tune"
        )
    header = _read_header(path)
    running = environment_record(header.record["backends"])
    differences = compare_records(header.record, running, ignore)
    if differences:
        raise _environment_error(path, differences)

    with _open_source(path, header) as source:
        manifest = _read_manifest(source, header)
        dev = _target_device(model, device, manifest)
        needed = _needed_entries(manifest)
        workdir = Path(tempfile.mkdtemp(prefix="tunetree-load-"))
        keep = False
        try:
            budget = _Budget(MAX_TOTAL_BYTES)
            weights_name = manifest.data["weights"]["member"]
            weights_file = _extract(source, weights_name, manifest, workdir, budget)
            for n in needed:
                for name in manifest.entries[n]["members"]:
                    _extract(source, name, manifest, workdir, budget)
            _apply_weights(model, weights_file, dev)
            weights_file.unlink()
            runners = _load_runners(model, manifest, needed, workdir, dev)
            tuned = wrap(model, runners)
            keep = any(manifest.entries[n]["members"] for n in needed)
            if keep:
                _remove_with(tuned, workdir)
            return tuned
        finally:
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)


def _target_device(
    model: Any, device: torch.device | str | None, manifest: _Manifest
) -> torch.device:
    """The device to load onto; it must be of the type the plan was tuned on."""
    if device is not None:
        for module in root_modules(model).values():
            module.to(device)
    dev = resolve_device(model, device)
    tuned = str(manifest.data.get("device", "cpu"))
    if torch.device(tuned).type != dev.type:
        raise IncompatibleCheckpointError(
            f"the checkpoint was tuned on {tuned} but the model is loaded on {dev}: runners "
            f"measured on one device type do not hold on another. Load with device={tuned!r} "
            "(or move the model there first), or tune again on this device."
        )
    return dev


def _needed_entries(manifest: _Manifest) -> list[int]:
    """Entries to rebuild: those of paths that are wrapped, i.e. where some graph's winner
    is not eager (as :meth:`Plan.runners` decides). The others need nothing from the file."""
    wrapped = {e["path"] for e in manifest.entries if e["backend"]["kind"] != "eager"}
    return [n for n, e in enumerate(manifest.entries) if e["path"] in wrapped]


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
    expected = _state_dict(model)
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
    model: Any, manifest: _Manifest, needed: list[int], workdir: Path, device: torch.device
) -> dict[str, dict[GraphKey, Runner]]:
    runners: dict[str, dict[GraphKey, Runner]] = {}
    for n in needed:
        entry, key = manifest.entries[n], manifest.keys[n]
        path, kind = entry["path"], entry["backend"]["kind"]
        where = f"{path or '<model>'} {key}"
        try:
            cls = backend_type(kind)
        except BackendUnavailableError as exc:
            raise IncompatibleCheckpointError(
                f"{where} uses backend {kind!r}, which this tunetree does not know; load with "
                "the tunetree release that saved it, or tune again"
            ) from exc
        try:
            backend = cls(**entry["backend"]["config"])
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
        directory = workdir.joinpath(RUNNERS, str(n))
        directory.mkdir(parents=True, exist_ok=True)
        try:
            runner = backend.load(module, key, directory, entry["runner"], device)
        except Exception as exc:
            raise BackendError(
                f"could not rebuild the saved {backend.name} runner of {where}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        runners.setdefault(path, {})[key] = runner
    return runners


def _remove_with(owner: Any, directory: Path) -> None:
    """Delete the extracted artifacts when the loaded model is garbage-collected (or at
    exit): a runner may keep reading its files after it was built."""
    remove: Callable[..., Any] = shutil.rmtree
    try:
        weakref.finalize(owner, remove, directory, ignore_errors=True)
    except TypeError:  # an object that takes no weak references: clean up at exit
        import atexit

        atexit.register(remove, directory, ignore_errors=True)


# ----------------------------------------------------------------------------- info


@dataclass
class CheckpointInfo:
    """What a checkpoint holds, read without loading any weights (see ``tunetree info``)."""

    path: Path
    version: int
    record: dict[str, Any]
    differences: list[Difference]
    manifest: dict[str, Any]

    @property
    def compatible(self) -> bool:
        """True when this environment matches the record (the file would load here)."""
        return not self.differences

    def plan_rows(self) -> list[dict[str, Any]]:
        """One row per plan entry: module path, graph, backend, latencies."""
        return [
            {
                "path": e["path"],
                "graph": e.get("graph_text", ""),
                "backend": e["backend"].get("name", e["backend"]["kind"]),
                "latency_s": e.get("latency_s"),
                "eager_latency_s": e.get("eager_latency_s"),
                "members": len(e["members"]),
            }
            for e in self.manifest.get("entries", [])
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format_version": self.version,
            "environment": self.record,
            "compatible": self.compatible,
            "differences": [d.as_json() for d in self.differences],
            "depth": self.manifest.get("depth"),
            "device": self.manifest.get("device"),
            "model_type": self.manifest.get("model_type"),
            "created_utc": self.manifest.get("created_utc"),
            "plan": self.plan_rows(),
        }


def read_info(path: str | os.PathLike[str], *, ignore: Iterable[str] = ()) -> CheckpointInfo:
    """Version, environment record, comparison with this environment, and the manifest of a
    checkpoint. Reads the header and the manifest only (no weights, no artifacts); raises
    like :func:`load` for another format version or a damaged file, but not for another
    environment (see :attr:`CheckpointInfo.differences`)."""
    path = Path(os.fspath(path))
    ignore = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    header = _read_header(path)
    running = environment_record(header.record["backends"])
    differences = compare_records(header.record, running, ignore)
    with _open_source(path, header) as source:
        manifest = _read_manifest(source, header)
    return CheckpointInfo(path, header.version, header.record, differences, manifest.data)
