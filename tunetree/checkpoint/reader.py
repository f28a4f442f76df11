"""Reading a checkpoint: header, environment record, sources, manifest, extraction.

Each step reads nothing more before the previous one passed: the format version, the
environment record, then the manifest; members are extracted one at a time within a byte
budget (zip-bomb protection), each verified against its SHA-256 before use.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .._util.json_io import loads_bounded
from ..errors import CheckpointError, IncompatibleCheckpointError
from . import format as fmt
from .environment import Difference
from .format import (
    CHUNK,
    DIR_ENVIRONMENT,
    DIR_FORMAT,
    FORMAT_VERSION,
    HEADER,
    LEGACY_ZIP_VERSION,
    MANIFEST,
    MAX_COMPRESSION_RATIO,
    MAX_MANIFEST_BYTES,
    MAX_MEMBERS,
    MAX_RECORD_BYTES,
    EnvironmentMismatchError,
    Manifest,
    ManifestError,
    MemberRecord,
    check_member_name,
    check_no_file_dir_clash,
)
from .record_schema import record_problem


@dataclass
class Header:
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


def read_header(path: Path) -> Header:
    """Version first (nothing else is read when it differs), then the record."""
    if path.is_dir():
        return _read_dir_header(path)
    try:
        with open(path, "rb") as f:
            return _read_file_header(path, f)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc


def _read_file_header(path: Path, f: IO[bytes]) -> Header:
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
    available = os.fstat(f.fileno()).st_size - HEADER.size
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
    return Header(version, _parse_record(path, record_bytes), record_bytes, HEADER.size + length)


def _read_dir_header(path: Path) -> Header:
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
    return Header(version, _parse_record(path, record_bytes), record_bytes, 0)


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
        record = loads_bounded(data, MAX_RECORD_BYTES)
    except ValueError as exc:
        raise CheckpointError(
            f"{path}: the environment record is not valid UTF-8 JSON ({exc}); the file is "
            "damaged or not a tunetree checkpoint"
        ) from exc
    problem = record_problem(record)
    if problem:
        raise CheckpointError(
            f"{path}: the environment record is malformed ({problem}); the file is damaged "
            "or not a tunetree checkpoint"
        )
    return record  # type: ignore[no-any-return]


def environment_error(path: Path, differences: list[Difference]) -> EnvironmentMismatchError:
    """The error for a checkpoint tuned in another environment, listing the differences.

    It says why the saved winners do not carry over and how to waive an entry with ``ignore``.
    """
    lines = "\n".join(f"  {d}" for d in differences)
    example = "('host',)" if any(d.entry == "host" for d in differences) else "('ENTRY', ...)"
    return EnvironmentMismatchError(
        f"{path} was tuned in another environment ({len(differences)} differing "
        f"entries, tuned vs running):\n{lines}\n"
        "Tuning results belong to the hardware and libraries they were measured on: here the "
        "saved winners may be slower than eager or fail to build. Tune again on this machine "
        "(tt.tune / tt.auto_tune) and save a new checkpoint. If the model was tuned into a "
        "shared tuning cache by a host of this kind (tt.fleet.tune, or any tune with the "
        "remote set), that costs no build: set TUNETREE_CACHE_REMOTE=s3://BUCKET/PREFIX (and "
        "the S3 endpoint and credentials, and the fleet's TUNETREE_CACHE_KEY: only entries "
        "signed with it are read) and run tt.auto_tune(model, data) here; it is served "
        "from the shared cache, each runner checked against eager first. Only to waive an "
        "entry known not to matter (e.g. a container's host name that changes on every "
        f"start), name it explicitly: tt.load(model, path, ignore={example}).",
        differences,
    )


class Source:
    """Read access to an archive's members (zip) or a checkpoint directory's files."""

    def size(self, name: str) -> int:
        """Uncompressed size of member ``name`` in bytes."""
        raise NotImplementedError

    def compressed_size(self, name: str) -> int:
        """Stored size of member ``name`` in bytes (the uncompressed size unless overridden)."""
        return self.size(name)

    def open(self, name: str) -> IO[bytes]:
        """Open member ``name`` for reading bytes."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the source holds open (nothing by default)."""
        pass


class ZipSource(Source):
    """The members of a ``.tt`` file: the zip archive after its header."""

    def __init__(self, path: Path, archive_offset: int) -> None:
        try:
            self.zip = zipfile.ZipFile(path)
        except NotImplementedError as exc:  # e.g. "zip file version 23.2" (version needed)
            raise CheckpointError(
                f"{path}: the archive uses a zip feature this reader does not implement "
                f"({exc}); tunetree never writes such archives: the file is damaged or was "
                "altered. Copy it again or save a new checkpoint."
            ) from exc
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
        infos = self.zip.infolist()
        if len(infos) > MAX_MEMBERS:
            raise CheckpointError(f"{path}: the archive holds over {MAX_MEMBERS} members")
        for info in infos:
            check_member_name(info.filename)
            if info.filename in self.infos:
                raise CheckpointError(f"{path}: the archive holds {info.filename!r} twice")
            check_zip_features(path, info)
            self.infos[info.filename] = info
        check_no_file_dir_clash(self.infos)
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
        """Uncompressed size of member ``name`` in bytes."""
        return self._info(name).file_size

    def compressed_size(self, name: str) -> int:
        """Compressed size of member ``name`` in bytes."""
        return self._info(name).compress_size

    def open(self, name: str) -> IO[bytes]:
        """Open member ``name`` for reading bytes."""
        return self.zip.open(self._info(name))

    def close(self) -> None:
        """Close the zip file."""
        self.zip.close()


_UNSUPPORTED_FLAGS = 0x1 | 0x20 | 0x40
"""Zip flag bits this reader refuses: encryption, patched data, strong encryption."""


def check_zip_features(path: Path, info: zipfile.ZipInfo) -> None:
    """Refuse what tunetree never writes: encryption, patched data, and unusual compression methods.

    Any method but stored and deflate is refused (bzip2 and LZMA decompress without an output bound,
    others are not implemented and fail untyped).
    """
    if info.extract_version > zipfile.MAX_EXTRACT_VERSION:
        raise CheckpointError(
            f"{path}: member {info.filename!r} needs zip version "
            f"{info.extract_version / 10:.1f} to extract (this reader supports up to "
            f"{zipfile.MAX_EXTRACT_VERSION / 10:.1f}); tunetree never writes such members"
        )
    if info.flag_bits & _UNSUPPORTED_FLAGS:
        raise CheckpointError(
            f"{path}: member {info.filename!r} is encrypted or patched (zip flags "
            f"{info.flag_bits:#x}); tunetree never writes such members"
        )
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise CheckpointError(
            f"{path}: member {info.filename!r} uses zip compression method "
            f"{info.compress_type}; tunetree reads stored and deflate members only"
        )


class DirSource(Source):
    """The files of a checkpoint directory, as members."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def _path(self, name: str) -> Path:
        check_member_name(name)
        path = self.root.joinpath(*name.split("/"))
        try:
            mode = path.lstat().st_mode
        except OSError as exc:
            raise CheckpointError(f"the checkpoint directory lacks {name!r}: {exc}") from exc
        if not stat.S_ISREG(mode) or not path.resolve().is_relative_to(self.root):
            raise CheckpointError(f"{name!r} in the checkpoint directory is not a regular file")
        return path

    def size(self, name: str) -> int:
        """Size of member ``name``'s file in bytes."""
        return self._path(name).lstat().st_size

    def open(self, name: str) -> IO[bytes]:
        """Open member ``name``'s file for reading bytes."""
        return open(self._path(name), "rb")


def read_member(source: Source, name: str, limit: int) -> bytes:
    """The bytes of member ``name``; CheckpointError when larger than ``limit`` or damaged."""
    if source.size(name) > limit:
        raise CheckpointError(f"member {name!r} is larger than {limit} bytes")
    try:
        with source.open(name) as f:
            data = f.read(limit + 1)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError) as exc:
        raise CheckpointError(
            f"member {name!r} is damaged ({exc}): copy the checkpoint again or save a new one"
        ) from exc
    if len(data) > limit:
        raise CheckpointError(f"member {name!r} is larger than {limit} bytes")
    return data


def read_manifest(source: Source, header: Header) -> Manifest:
    """The archive's manifest, checked against the header's record and validated."""
    try:
        data = loads_bounded(read_member(source, MANIFEST, MAX_MANIFEST_BYTES), MAX_MANIFEST_BYTES)
    except ValueError as exc:
        raise ManifestError(f"not UTF-8 JSON of bounded size and depth: {exc}") from exc
    if not isinstance(data, dict):
        raise ManifestError("not an object")
    if data.get("environment_sha256") != hashlib.sha256(header.record_bytes).hexdigest():
        raise CheckpointError(
            "the environment record does not belong to this archive (its SHA-256 differs from "
            "the one the manifest holds): the header was altered or the file was spliced"
        )
    return Manifest.from_json(data)


class Budget:
    """Bytes a load may still extract (size-bomb protection).

    Limits are read from :mod:`tunetree.checkpoint.format` when the budget is made.
    """

    def __init__(self) -> None:
        self.left = fmt.MAX_TOTAL_BYTES
        self.member_limit = fmt.MAX_MEMBER_BYTES

    def take(self, name: str, size: int) -> None:
        """Count ``size`` bytes of member ``name`` against the limits (refusing a zip bomb)."""
        if size > self.member_limit or size > self.left:
            raise CheckpointError(
                f"member {name!r} would extract to {size} bytes, over the limit "
                f"(tunetree.checkpoint.format.MAX_MEMBER_BYTES / MAX_TOTAL_BYTES); refusing a "
                "possible zip bomb"
            )
        self.left -= size


def extract(source: Source, name: str, manifest: Manifest, root: Path, budget: Budget) -> Path:
    """Copy one member into ``root``, verifying its size and SHA-256 on the way."""
    meta = _member_to_read(source, name, manifest, budget)
    dest = root.joinpath(*name.split("/"))
    if not dest.resolve().is_relative_to(root.resolve()):
        raise CheckpointError(f"member {name!r} would be written outside its directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _read_verified(source, name, meta, dest)
    return dest


def verify(source: Source, name: str, manifest: Manifest, budget: Budget) -> None:
    """Read one member as :func:`extract` does (same checks and budget), writing nothing."""
    _read_verified(source, name, _member_to_read(source, name, manifest, budget), None)


def _member_to_read(source: Source, name: str, manifest: Manifest, budget: Budget) -> MemberRecord:
    """Member ``name``'s record, once its name, size and compression ratio pass (zip bombs)."""
    check_member_name(name)
    meta = manifest.members.get(name)
    if meta is None:
        raise CheckpointError(f"member {name!r} is not listed in the manifest")
    size = meta.size
    declared = source.size(name)
    if declared != size:
        raise CheckpointError(
            f"member {name!r} is {declared} bytes but the manifest says {size}; the file is "
            "damaged or was altered"
        )
    budget.take(name, size)
    packed = source.compressed_size(name)
    if size > CHUNK and size > MAX_COMPRESSION_RATIO * max(packed, 1):
        raise CheckpointError(
            f"member {name!r} expands {size / max(packed, 1):.0f}x ({packed} -> {size} "
            "bytes): refusing a possible zip bomb"
        )
    return meta


def _read_verified(source: Source, name: str, meta: MemberRecord, dest: Path | None) -> None:
    """Stream member ``name`` (into a new file ``dest`` unless None) against its record."""
    h = hashlib.sha256()
    written = 0
    try:
        with (
            source.open(name) as src,
            open(dest, "xb") if dest is not None else contextlib.nullcontext() as out,
        ):
            while chunk := src.read(CHUNK):
                written += len(chunk)
                if written > meta.size:
                    raise CheckpointError(f"member {name!r} holds more bytes than declared")
                h.update(chunk)
                if out is not None:
                    out.write(chunk)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError) as exc:
        raise CheckpointError(
            f"member {name!r} is damaged ({exc}): copy the checkpoint again or save a new one"
        ) from exc
    if written != meta.size or h.hexdigest() != meta.sha256:
        raise CheckpointError(
            f"member {name!r} fails its checksum (SHA-256 differs from the manifest's): the "
            "file is damaged or was altered. Copy it again or save a new checkpoint."
        )


@contextlib.contextmanager
def open_source(path: Path, header: Header) -> Iterator[Source]:
    """The checkpoint's members as a :class:`Source` (directory or zip), closed on exit."""
    source: Source = DirSource(path) if path.is_dir() else ZipSource(path, header.archive_offset)
    try:
        yield source
    finally:
        source.close()
