"""Building hostile checkpoints the way an attacker would: a real ``.tt`` file, edited,
with every checksum and the record binding recomputed, so that the attack reaches the code
under test instead of being stopped by a checksum."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoint.fixtures.make_fixtures import HERE
from tunetree.checkpoint import loading

SOURCE = HERE / "v1_openvino.tt"
"""A real checkpoint: three OpenVINO entries with artifacts."""


def parts(path: Path) -> tuple[dict[str, Any], dict[str, bytes], dict[str, int]]:
    """The record, every member's bytes and compression method of a ``.tt`` file."""
    data = path.read_bytes()
    _, length = struct.unpack("<II", data[:8])
    record = json.loads(data[8 : 8 + length])
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
        methods = {i.filename: i.compress_type for i in z.infolist()}
    return record, members, methods


def rewrite(
    target: Path,
    *,
    manifest: Callable[[dict[str, Any]], Any] | None = None,
    record: Callable[[dict[str, Any]], Any] | None = None,
    members: dict[str, bytes] | None = None,
    methods: dict[str, int] | None = None,
    record_bytes: bytes | None = None,
    manifest_bytes: bytes | None = None,
    source: Path = SOURCE,
) -> Path:
    """Write ``target``: ``source`` with its record and manifest edited in place by the
    callables, members replaced or added, then checksums, sizes and the record's SHA-256
    recomputed. ``record_bytes``/``manifest_bytes`` replace the serialised text outright."""
    rec, files, kinds = parts(source)
    if record:
        record(rec)
    raw_record = record_bytes if record_bytes is not None else json.dumps(rec).encode()
    files.update(members or {})
    man = json.loads(files["manifest.json"])
    for name, body in files.items():
        if name != "manifest.json" and (name in (members or {}) or name in man["members"]):
            man["members"][name] = {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    man["environment_sha256"] = hashlib.sha256(raw_record).hexdigest()
    if manifest:
        manifest(man)
    files["manifest.json"] = (
        manifest_bytes if manifest_bytes is not None else json.dumps(man).encode()
    )
    kinds.update(methods or {})
    with open(target, "wb") as f:
        f.write(struct.pack("<II", 1, len(raw_record)) + raw_record)
        with zipfile.ZipFile(f, "w") as z:
            for name, body in files.items():
                z.writestr(name, body, compress_type=kinds.get(name, zipfile.ZIP_DEFLATED))
    return target


def patch_zip_member(
    path: Path,
    name: str,
    *,
    flags: int | None = None,
    method: int | None = None,
    version: int | None = None,
) -> None:
    """Set the flag bits, method or "version needed to extract" (tenths: 232 is 23.2) of one
    member in both its local and central headers, as a hand-edited archive would (features
    the writer never produces)."""
    data = bytearray(path.read_bytes())
    encoded = name.encode()
    for signature, flag_at, name_at in ((b"PK\x03\x04", 6, 30), (b"PK\x01\x02", 8, 46)):
        start = 0
        while (at := data.find(signature, start)) >= 0:
            start = at + 4
            if data[at + name_at : at + name_at + len(encoded)] != encoded:
                continue
            if flags is not None:
                data[at + flag_at : at + flag_at + 2] = struct.pack("<H", flags)
            if method is not None:
                data[at + flag_at + 2 : at + flag_at + 4] = struct.pack("<H", method)
            if version is not None:
                data[at + flag_at - 2 : at + flag_at] = struct.pack("<H", version)
    path.write_bytes(bytes(data))


def as_recorded(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the running environment read as the file's own record (the attack is the file's
    content, not its environment)."""
    data = path.read_bytes()
    _, length = struct.unpack("<II", data[:8])
    try:
        recorded = json.loads(data[8 : 8 + length])
    except (ValueError, RecursionError):
        recorded = {}
    monkeypatch.setattr(loading, "environment_record", lambda kinds: recorded)


def copy_source(target: Path) -> Path:
    shutil.copyfile(SOURCE, target)
    return target
