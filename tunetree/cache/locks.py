"""The cache's file locks: one per entry key for writers, one per device for measurements.

Readers take no locks. A process that misses takes the key's writer lock, so a second
process tuning the same graph waits and then hits; measurements of a missed graph hold the
device lock so concurrent tuners do not disturb each other's timings. Where a lock cannot
be had in time (or at all, on a read-only cache) work goes on without it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import filelock
import torch

from ..candidates.evaluate import GraphSession

log = logging.getLogger(__name__)


class WriterLocks:
    """The per-key writer locks this process holds, in ``directory``."""

    def __init__(self, directory: Path, timeout_s: float) -> None:
        self.directory = directory
        self.timeout_s = timeout_s
        self._held: dict[str, filelock.BaseFileLock] = {}

    def acquire(self, key: str, session: GraphSession, wait: bool = True) -> bool:
        """Take ``key``'s lock, waiting up to ``timeout_s`` while another process holds it.

        The holder is tuning this graph. False when not taken (timed out, busy with ``wait=False``,
        or locks unsupported here): the caller goes on without it.
        """
        lock = filelock.FileLock(str(self.directory / f"{key}.lock"))
        try:
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                if not wait:
                    return False
                session.progress(
                    session.path or "<model>",
                    session.graph,
                    "cache: another process is tuning this graph; waiting",
                )
                lock.acquire(timeout=self.timeout_s)
        except filelock.Timeout:
            log.warning("tuning cache: tuning %s without its lock (timed out)", key[:12])
            return False
        except OSError as exc:
            log.debug("tuning cache: no writer lock for %s: %s", key[:12], exc)
            return False
        self._held[key] = lock
        return True

    def release(self, key: str) -> None:
        """Release ``key``'s lock if held; errors while releasing are ignored."""
        lock = self._held.pop(key, None)
        if lock is not None:
            with contextlib.suppress(Exception):
                lock.release(force=True)

    def release_all(self) -> None:
        """Release every lock this object holds."""
        for key in list(self._held):
            self.release(key)


@contextlib.contextmanager
def device_lock(directory: Path, device: torch.device | str, timeout_s: float) -> Iterator[None]:
    """Held around measurements on ``device``.

    After ``timeout_s``, or where the lock cannot be created, the caller measures without it.
    """
    dev = torch.device(device)
    name = dev.type if dev.index is None else f"{dev.type}-{dev.index}"
    lock = filelock.FileLock(str(directory / f"device-{name}.lock"))
    try:
        lock.acquire(timeout=timeout_s)
    except (filelock.Timeout, OSError) as exc:  # busy too long, or a read-only cache
        log.warning("tuning cache: measuring on %s without its lock (%s)", dev, exc)
        yield
        return
    try:
        yield
    finally:
        lock.release()
