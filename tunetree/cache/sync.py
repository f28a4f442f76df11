"""``push`` and ``pull``: copy a model's entries between the local cache and the remote tier.

``push`` publishes local entries the remote lacks (artifacts first, manifest last, as
write-through does). ``pull`` materializes remote entries into the local cache ahead of use,
only those measured on this kind of machine (same hard environment: device, CPU flags,
library versions); entries of other kinds stay where they are, never merged. Pulled entries
are validated like any local entry when a lookup serves them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import CacheError
from . import keys
from .entry import EntryFault, EntryManifest
from .remote import LAYOUT, RemoteTier, is_key
from .selection import Selector
from .store import CacheStore

log = logging.getLogger(__name__)


@dataclass
class SyncReport:
    """What ``push`` or ``pull`` did: entries selected, copied, and skipped with the reason."""

    selected: int = 0
    copied: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.copied} of {self.selected} selected entries copied"]
        lines += [f"  skipped {key[:12]}: {why}" for key, why in self.skipped]
        return "\n".join(lines)


def push(store: CacheStore, remote: RemoteTier, select: Selector) -> SyncReport:
    """Publish the selected local entries on ``remote``."""
    manifests = []
    for key in store.entry_keys():
        try:
            manifests.append(store.read_manifest(key))
        except EntryFault as exc:
            log.info("tuning cache: %s not pushed: %s", key[:12], exc)
    report = SyncReport()
    for manifest in select(manifests):
        report.selected += 1
        if remote.push(manifest.key, store):
            report.copied += 1
        else:
            report.skipped.append((manifest.key, _why_not(remote, "already there")))
    return report


def pull(store: CacheStore, remote: RemoteTier, select: Selector) -> SyncReport:
    """Materialize the selected remote entries of this kind of machine into ``store``.

    CacheError when the remote reads nothing here (:attr:`RemoteTier.unreadable`).
    """
    if remote.unreadable is not None:
        raise CacheError(f"nothing pulled from {remote.url}: {remote.unreadable}")
    report = SyncReport()
    manifests: list[EntryManifest] = []
    for obj in remote.client.list(f"{LAYOUT}/entries"):
        if not is_key(obj.name):
            continue
        try:
            manifests.append(remote.fetch_manifest(obj.name).manifest)
        except EntryFault as exc:
            report.skipped.append((obj.name, str(exc)))
    for manifest in select(manifests):
        report.selected += 1
        here = _other_machine(manifest)
        if here is not None:
            report.skipped.append((manifest.key, here))
        elif remote.pull(manifest.key, store, lambda m: None):
            report.copied += 1
        else:
            report.skipped.append((manifest.key, _why_not(remote, "already here or unusable")))
    return report


def _why_not(remote: RemoteTier, otherwise: str) -> str:
    if not remote.breaker.available():
        return "the remote cannot be used now (see the warning)"
    if remote.breaker.writes_refused is not None:
        return f"the remote refuses writes: {remote.breaker.writes_refused}"
    return otherwise


def _other_machine(manifest: EntryManifest) -> str | None:
    """Why the entry was measured on another kind of machine (None when this one)."""
    try:
        device = torch.device(str(manifest.hard.get("device_type", "cpu")))
        kinds = [c.backend.kind for c in manifest.candidates]
        here: dict[str, Any] = keys.environment(device, kinds).hard
    except (RuntimeError, ValueError) as exc:
        return f"its device cannot be used here: {exc}"
    if here == manifest.hard:
        return None
    differing = sorted(
        k for k in set(here) | set(manifest.hard) if here.get(k) != manifest.hard.get(k)
    )
    return f"measured on another kind of machine ({', '.join(differing[:4])} differ)"
