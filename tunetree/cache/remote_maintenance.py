"""Looking after the remote tier: list its entries, verify them, and collect its garbage.

``verify`` reads every envelope (signature checked when ``$TUNETREE_CACHE_KEY`` is set) and
checks that every artifact it names is there with its size, or, ``deep``, downloads each and
compares its sha256. ``gc`` deletes entries found unusable and artifacts no sound entry names
that are older than a grace period (a writer uploads its artifacts before its manifest, so a
fresh unreferenced artifact may belong to a publish in progress).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .entry import EntryFault
from .remote import LAYOUT, RemoteTier, artifact_name, entry_name, is_key, unique_files
from .s3 import ObjectInfo, RemoteError

GC_GRACE_S = 24 * 3600.0
"""Unreferenced artifacts younger than this are kept by gc (uploads in progress)."""


@dataclass
class RemoteEntryInfo:
    """One remote entry as ``tunetree cache ls --remote`` shows it."""

    key: str
    path: str = ""
    graph: str = ""
    winner: str = ""
    candidates: int = 0
    size: int = 0
    signed: bool = False
    modified: float = 0.0
    problem: str | None = None
    artifacts: list[str] = field(default_factory=list)
    device: str = ""


@dataclass
class RemoteGcReport:
    """What ``gc --remote`` deleted."""

    entries: int = 0
    artifacts: int = 0
    freed_bytes: int = 0


def remote_entries(tier: RemoteTier, deep: bool = False) -> list[RemoteEntryInfo]:
    """Every remote entry, each with the problem that makes it unusable (None when sound)."""
    artifacts = {o.name: o for o in tier.client.list(f"{LAYOUT}/artifacts")}
    return [
        _entry_info(tier, obj, artifacts, deep) for obj in tier.client.list(f"{LAYOUT}/entries")
    ]


def _entry_info(
    tier: RemoteTier, obj: ObjectInfo, artifacts: dict[str, ObjectInfo], deep: bool
) -> RemoteEntryInfo:
    info = RemoteEntryInfo(obj.name, size=obj.size, modified=obj.modified)
    if not is_key(obj.name):
        info.problem = "not named by an entry key"
        return info
    try:
        entry = tier.fetch_manifest(obj.name)
    except EntryFault as exc:
        info.problem = str(exc)
        return info
    manifest = entry.manifest
    info.path, info.graph, info.signed = manifest.path, manifest.graph_text, entry.signed
    info.candidates = len(manifest.candidates)
    info.device = str(manifest.hard.get("device_type", ""))
    info.winner = "none" if manifest.winner is None else manifest.candidates[manifest.winner].name
    files = unique_files(manifest.referenced())
    info.artifacts = sorted(f.sha256 for f in files)
    info.size += sum(f.size for f in files)
    for ref in files:
        there = artifacts.get(ref.sha256)
        if there is None:
            info.problem = f"artifact {ref.sha256[:12]} ({ref.path}) is missing"
        elif there.size != ref.size:
            info.problem = (
                f"artifact {ref.sha256[:12]} ({ref.path}) holds {there.size} bytes, not {ref.size}"
            )
        elif deep:
            info.problem = _download_problem(tier, ref.sha256, ref.size, ref.path)
        if info.problem is not None:
            break
    return info


def _download_problem(tier: RemoteTier, sha: str, size: int, path: str) -> str | None:
    with tempfile.TemporaryDirectory(prefix="tunetree-verify-") as tmp:
        got = tier.client.download(artifact_name(sha), Path(tmp) / "artifact", size)
    return None if got == sha else f"artifact {sha[:12]} ({path}) is corrupted"


def remote_gc(
    tier: RemoteTier, grace_s: float = GC_GRACE_S, deep: bool = False, now: float | None = None
) -> RemoteGcReport:
    """Delete unusable entries, then unreferenced artifacts older than ``grace_s``.

    ``deep`` downloads every artifact to find corrupted ones too (else sizes are checked).
    """
    report = RemoteGcReport()
    now = time.time() if now is None else now
    infos = remote_entries(tier, deep=deep)
    referenced: set[str] = set()
    for info in infos:
        if info.problem is None:
            referenced.update(info.artifacts)
            continue
        if is_key(info.key):
            tier.client.delete(entry_name(info.key))
        else:
            tier.client.delete(f"{LAYOUT}/entries/{info.key}")
        report.entries += 1
        report.freed_bytes += info.size
    for obj in list(tier.client.list(f"{LAYOUT}/artifacts")):
        if obj.name in referenced or now - obj.modified < grace_s:
            continue
        try:
            tier.client.delete(f"{LAYOUT}/artifacts/{obj.name}")
        except RemoteError:
            continue
        report.artifacts += 1
        report.freed_bytes += obj.size
    return report
