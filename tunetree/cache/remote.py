"""The remote tier of the tuning cache: entries shared by every host of a kind, on S3.

Layout under ``s3://BUCKET/PREFIX``::

    v1/artifacts/<sha256>   every artifact file once, by content (immutable)
    v1/entries/<key>        the entry's manifest in a sealed envelope (:mod:`.sealing`)

**Publish** (write-through, :meth:`RemoteTier.push`): the artifacts first (each written
again even when listed: content-addressed, so that only heals a lost copy); the envelope last,
with ``If-None-Match: *``, so the first writer of a key wins and a reader sees either no entry
or one whose artifacts are all there. A writer that loses keeps the remote entry, unless this
process found that entry unusable (then it is replaced with ``If-Match`` on the ETag it found
unusable, so a good entry that another writer put meanwhile is never overwritten).

**Only signed entries are read.** Checks against eager on samples and probes cannot see a
runner altered to differ only on inputs outside them (a trigger), so the remote's entries are
trusted only when they carry the fleet's signature (``$TUNETREE_CACHE_KEY``, :mod:`.sealing`).
A tier without a key reads nothing (one warning; every lookup is a miss and entries tuned
here are still published, unsigned), unless ``trust_unsigned=True`` (or
``$TUNETREE_CACHE_TRUST_UNSIGNED=1``) accepts unsigned entries from a bucket whose writers
are all trusted.

**Read-through** (:meth:`RemoteTier.pull`): the envelope is read within a size bound, its
signature checked (see above), its manifest checked like a local one
(checksum, bounded JSON, typed fields, the key, the caller's compatibility check), then each
artifact is downloaded within its recorded size and its sha256 compared, into a staging
directory of the local cache, and the entry is published there by rename. The lookup then
serves it as a local hit: the local path validates it again, and checks its winner against
eager on the caller's data before it serves. Nothing is unpickled or imported.

**Failures never break tuning** (:mod:`.breaker`): a remote that cannot be reached or hangs
is skipped for a cool-down after one warning; refused writes stop writes, after one warning.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import CacheError
from ..runtime.artifacts import FileRecord, remove_tree
from ..signature.graph import GraphKey
from .breaker import Breaker
from .entry import EntryFault, EntryManifest
from .s3 import (
    RemoteError,
    RemoteMissing,
    RemoteRefused,
    S3Client,
    S3Location,
    Timeouts,
)
from .sealing import seal, secret_from_env, trust_unsigned_from_env, unseal, why_unreadable
from .store import JOURNAL, CacheStore, decode_manifest, encode_manifest

log = logging.getLogger(__name__)

ENV_REMOTE = "TUNETREE_CACHE_REMOTE"
"""Environment variable naming the remote tier, ``s3://BUCKET/PREFIX``."""

LAYOUT = "v1"
MAX_ENVELOPE_BYTES = 16 << 20
"""Largest remote manifest read (a real one is a few KiB)."""
MAX_ARTIFACT_BYTES = 8 << 30
"""Largest artifact downloaded."""
MAX_ENTRY_BYTES = 16 << 30
"""Largest sum of one entry's artifacts downloaded."""
MAX_ENTRY_FILES = 4096

Check = Callable[[EntryManifest], "str | None"]
"""Why an entry cannot serve here (None when it can), run before anything is downloaded."""


def entry_name(key: str) -> str:
    """The object name of ``key``'s envelope below the prefix."""
    return f"{LAYOUT}/entries/{key}"


def artifact_name(sha: str) -> str:
    """The object name of the artifact with this sha256 below the prefix."""
    return f"{LAYOUT}/artifacts/{sha}"


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and all(c in "0123456789abcdef" for c in text)


def is_key(text: str) -> bool:
    """Whether ``text`` is an entry key as the cache writes them (40 lowercase hex digits)."""
    return _is_hex(text, 40)


@dataclass(frozen=True)
class RemoteEntry:
    """A remote entry read and validated: its manifest, ETag and whether it was signed."""

    manifest: EntryManifest
    etag: str
    signed: bool
    size: int


@dataclass
class RemoteStats:
    """What the remote tier did for this cache object."""

    pulled: int = 0
    """Entries materialized into the local cache."""
    pushed: int = 0
    """Entries published (or replaced) on the remote."""
    refused: int = 0
    """Remote entries found unusable (forged, corrupt, for another key or machine)."""
    seconds: float = 0.0
    """Wall time spent talking to the remote."""
    bytes_down: int = 0
    bytes_up: int = 0


class RemoteTier:
    """One ``s3://BUCKET/PREFIX`` remote (see the module docstring).

    ``secret``: the shared signing key (default ``$TUNETREE_CACHE_KEY``; ``b""`` for none):
    entries are signed with it, and only entries signed with it are read.
    ``trust_unsigned``: without a key, read unsigned entries (default
    ``$TUNETREE_CACHE_TRUST_UNSIGNED``; else a tier without a key reads nothing); only for a
    bucket no untrusted writer can change (see the module docstring).
    ``endpoint_url``: the S3 endpoint (default: boto3's own, e.g. ``$AWS_ENDPOINT_URL``).
    """

    def __init__(
        self,
        url: str,
        *,
        secret: bytes | None = None,
        trust_unsigned: bool | None = None,
        timeouts: Timeouts | None = None,
        endpoint_url: str | None = None,
        cooldown_s: float = 300.0,
    ) -> None:
        self.location = S3Location.parse(url)
        self.client = S3Client(self.location, timeouts, endpoint_url)
        self.secret = secret_from_env() if secret is None else (secret or None)
        trust = trust_unsigned_from_env() if trust_unsigned is None else trust_unsigned
        self.trust_unsigned = bool(trust)
        self.breaker = Breaker(str(self.location), cooldown_s)
        self.stats = RemoteStats()
        self._unusable: dict[str, str] = {}
        """key -> ETag of a remote envelope this process found unusable (a writer replaces it)."""
        self.after_artifact: Callable[[str], None] | None = None
        """Called after each artifact a push uploads (tests stop the server there)."""

    @property
    def url(self) -> str:
        """``s3://BUCKET/PREFIX``."""
        return str(self.location)

    def __repr__(self) -> str:
        return f"RemoteTier({self.url!r})"

    # ------------------------------------------------------------------ read-through

    @property
    def unreadable(self) -> str | None:
        """Why this tier reads no entry (no key, unsigned entries not trusted), or None."""
        return why_unreadable(self.secret, self.trust_unsigned)

    def readable(self) -> bool:
        """Whether entries may be read here; warns once when they may not."""
        why = self.unreadable
        if why is not None:
            self.breaker.warn_once(
                "unreadable",
                "tuning cache: the remote %s is not read (%s); entries tuned here are still "
                "published, unsigned",
                self.url,
                why,
            )
        return why is None

    def pull(self, key: str, store: CacheStore, check: Check) -> bool:
        """Materialize the remote entry of ``key`` into ``store``; True when one is there now.

        False when there is none, it is unusable (logged, remembered for writers), it is the
        entry the local cache already has, the tier reads nothing (:attr:`unreadable`, warned
        once), or the remote fails (the breaker warns once).
        """
        if not is_key(key) or not self.breaker.available() or not self.readable():
            return False
        start = time.perf_counter()
        etag = ""
        try:
            entry = self.fetch_manifest(key)
            manifest, etag = entry.manifest, entry.etag
            problem = check(manifest)
            if problem is not None:
                raise EntryFault(problem)
            if _local_entry_id(store, key) == manifest.entry_id:
                return False  # already here: found unusable locally, or served already
            self._materialize(store, key, manifest)
        except RemoteMissing:
            self.breaker.succeeded()
            return False
        except EntryFault as exc:
            self.breaker.succeeded()
            self.stats.refused += 1
            if etag:  # fetch_manifest records the ETag of an envelope it refuses itself
                self._unusable[key] = etag
            log.warning("tuning cache: remote entry %s not used: %s", key[:12], exc)
            return False
        except RemoteError as exc:
            self.breaker.failed(exc)
            return False
        except OSError as exc:  # the local cache cannot take it (read-only, full): a miss
            self.breaker.warn_once(
                "local",
                "tuning cache: the local cache %s cannot take entries from the remote %s (%s); "
                "going on without them",
                store.root,
                self.url,
                exc,
            )
            return False
        finally:
            self.stats.seconds += time.perf_counter() - start
        self.breaker.succeeded()
        self.stats.pulled += 1
        return True

    def fetch_manifest(self, key: str) -> RemoteEntry:
        """The remote entry of ``key``, unsealed and validated.

        EntryFault when it is malformed, forged or for another key; RemoteError otherwise.
        """
        data, etag = self.client.get(entry_name(key), MAX_ENVELOPE_BYTES)
        self.stats.bytes_down += len(data)
        try:
            raw, signed = unseal(data, key, self.secret)
            manifest = decode_manifest(raw, key)
            if manifest.key != key:
                raise EntryFault(f"the remote manifest is for key {manifest.key[:12]}")
            check_files(manifest.referenced())
        except EntryFault:
            self._unusable[key] = etag
            raise
        return RemoteEntry(manifest, etag, signed, len(data))

    def _materialize(self, store: CacheStore, key: str, manifest: EntryManifest) -> None:
        """Download the artifacts the local store lacks, then publish the entry there."""
        staging = store.new_temporary("remote")
        try:
            journal = staging / JOURNAL
            journal.touch()
            for ref in unique_files(manifest.referenced()):
                try:
                    store.check_files([ref], deep=False)
                    store.keep_artifacts([ref], journal)
                    continue
                except EntryFault:
                    pass
                target = staging / f"download-{ref.sha256}"
                self._download(ref, target)
                store.put_artifact(target, journal)
            store.write_manifest(staging, manifest)
            if not store.publish(staging, key, lambda _existing: True):
                log.debug("tuning cache: %s was published locally meanwhile", key[:12])
                return
            store.markers.touch_hits(key)
            if _is_dynamic(manifest):
                store.markers.add_to_family(manifest.family, key)
        finally:
            if staging.exists():
                remove_tree(staging)

    def _download(self, ref: FileRecord, target: Path) -> None:
        """One artifact into ``target``, checked by sha256.

        An artifact the server lost, refuses or holds in another size makes the entry
        unusable (EntryFault; writers upload it again); a timeout is an outage (RemoteError).
        """
        try:
            sha = self.client.download(artifact_name(ref.sha256), target, ref.size)
        except (RemoteMissing, RemoteRefused) as exc:
            raise EntryFault(f"remote artifact {ref.sha256[:12]} ({ref.path}): {exc}") from exc
        self.stats.bytes_down += ref.size
        if sha != ref.sha256:
            raise EntryFault(f"remote artifact {ref.sha256[:12]} ({ref.path}) is corrupted")

    # ------------------------------------------------------------------ write-through

    def push(self, key: str, store: CacheStore, check: Check | None = None) -> bool:
        """Publish the local entry of ``key``: artifacts first, then its envelope, conditionally.

        True when this call published (or replaced an unusable) remote entry. Never raises
        for remote failures (the breaker warns once); ``check`` judges a remote entry that is
        already there (None: any well-formed one is kept).
        """
        if not is_key(key) or not self.breaker.writable():
            return False
        start = time.perf_counter()
        try:
            manifest = store.read_manifest(key)
            if store.markers.is_marked_invalid(key, manifest.entry_id):
                return False
            files = unique_files(manifest.referenced())
            check_files(files)
            for ref in files:
                self._upload(store, ref)
            envelope = seal(key, encode_manifest(manifest), self.secret)
            published = self._publish(store, key, envelope, check)
        except EntryFault as exc:
            log.info("tuning cache: local entry %s not pushed: %s", key[:12], exc)
            return False
        except RemoteRefused as exc:
            self.breaker.refused_write(exc)
            return False
        except RemoteError as exc:
            self.breaker.failed(exc)
            return False
        except OSError as exc:
            log.info("tuning cache: local entry %s not pushed: %s", key[:12], exc)
            return False
        finally:
            self.stats.seconds += time.perf_counter() - start
        self.breaker.succeeded()
        if published:
            self.stats.pushed += 1
            self.stats.bytes_up += len(envelope)
        return published

    def _upload(self, store: CacheStore, ref: FileRecord) -> None:
        """One artifact, written even when listed.

        Named by its content, so writing it again changes nothing but heals a copy the server
        lost or corrupted (after a crash a listed object may hold no data).
        """
        store.check_files([ref], deep=True)  # never spread a locally corrupted file
        self.client.put_file(artifact_name(ref.sha256), store.artifact_path(ref.sha256))
        self.stats.bytes_up += ref.size
        if self.after_artifact is not None:
            self.after_artifact(ref.sha256)

    def _publish(self, store: CacheStore, key: str, envelope: bytes, check: Check | None) -> bool:
        name = entry_name(key)
        if self.client.put(name, envelope, if_none_match=True):
            return True
        etag = self._unusable.get(key)
        if etag is None:
            try:
                existing = self.fetch_manifest(key)
                etag = existing.etag
                problem = check(existing.manifest) if check is not None else None
                entry_id = existing.manifest.entry_id
                if problem is None and store.markers.is_marked_invalid(key, entry_id):
                    problem = "it was found unusable here"
            except (EntryFault, RemoteMissing) as exc:
                problem, etag = str(exc), self._unusable.get(key, "")
            if problem is None:
                return False  # another writer's good entry stays
            log.info("tuning cache: replacing remote entry %s: %s", key[:12], problem)
        if not etag:
            return bool(self.client.put(name, envelope, if_none_match=True))
        replaced = self.client.put(name, envelope, if_match=etag)
        if replaced:
            self._unusable.pop(key, None)
        return replaced


def _local_entry_id(store: CacheStore, key: str) -> str | None:
    try:
        return store.read_manifest(key).entry_id
    except EntryFault:
        return None


def unique_files(files: list[FileRecord]) -> list[FileRecord]:
    """One record per artifact (entries share files between candidates)."""
    return list({f.sha256: f for f in files}.values())


def check_files(files: list[FileRecord]) -> None:
    """The artifact records are plausible: hex names, sizes within the bounds."""
    if len(files) > MAX_ENTRY_FILES:
        raise EntryFault(f"the entry names {len(files)} artifact files (at most {MAX_ENTRY_FILES})")
    total = 0
    for ref in files:
        if not _is_hex(ref.sha256, 64):
            raise EntryFault(f"artifact {ref.path!r} is not named by a sha256")
        if not 0 <= ref.size <= MAX_ARTIFACT_BYTES:
            raise EntryFault(f"artifact {ref.sha256[:12]} claims {ref.size} bytes")
        total += ref.size
    if total > MAX_ENTRY_BYTES:
        raise EntryFault(f"the entry's artifacts hold {total} bytes (at most {MAX_ENTRY_BYTES})")


def _is_dynamic(manifest: EntryManifest) -> bool:
    if not manifest.family or manifest.graph_key is None:
        return False
    try:
        return GraphKey.from_json(manifest.graph_key).is_dynamic
    except ValueError:
        return False


def open_remote(remote: object, trust_unsigned: bool | None = None) -> RemoteTier | None:
    """Resolve a ``remote=`` argument: None → ``$TUNETREE_CACHE_REMOTE`` (if set), False → none.

    A URL → a :class:`RemoteTier` there (with ``trust_unsigned``), a RemoteTier → itself. A
    bad URL raises CacheError; a missing boto3 raises MissingDependencyError (for the variable
    too: it asked for it).
    """
    if remote is False:
        return None
    if remote is None:
        remote = os.environ.get(ENV_REMOTE) or None
        if remote is None:
            return None
    if isinstance(remote, RemoteTier):
        return remote
    if isinstance(remote, str):
        return RemoteTier(remote, trust_unsigned=trust_unsigned)
    raise CacheError(
        f"remote= takes an s3://BUCKET/PREFIX URL, a RemoteTier or False, not "
        f"{type(remote).__name__}"
    )


def get_object(tier: RemoteTier, name: str, limit: int) -> bytes | None:
    """One small object below the tier's prefix (at most ``limit`` bytes), or None.

    None when the tier's breaker is open, the object is missing or the read failed (the breaker
    counts it); the tier's stats count the seconds and bytes. The caller validates the bytes.
    """
    if not tier.breaker.available():
        return None
    start = time.perf_counter()
    try:
        data, _ = tier.client.get(name, limit)
    except RemoteMissing:
        tier.breaker.succeeded()
        return None
    except RemoteError as exc:
        tier.breaker.failed(exc)
        return None
    finally:
        tier.stats.seconds += time.perf_counter() - start
    tier.breaker.succeeded()
    tier.stats.bytes_down += len(data)
    return data


def put_object(tier: RemoteTier, name: str, data: bytes) -> bool:
    """Write one small object below the tier's prefix; whether it was written.

    A refused write stops the tier's writes, another failure counts in its breaker.
    """
    if not tier.breaker.writable():
        return False
    start = time.perf_counter()
    try:
        tier.client.put(name, data)
    except RemoteRefused as exc:
        tier.breaker.refused_write(exc)
        return False
    except RemoteError as exc:
        tier.breaker.failed(exc)
        return False
    finally:
        tier.stats.seconds += time.perf_counter() - start
    tier.breaker.succeeded()
    tier.stats.bytes_up += len(data)
    return True
