"""When the remote tier fails, stop asking it for a while, and say so once.

A remote that is down, hangs or refuses must never break tuning nor slow every graph's
lookup by a timeout. After the first failure the remote is skipped for ``cooldown_s``
(one warning per outage, not one per graph); refused writes (access denied, full) stop
writes for the life of the cache object, with one warning, while reads go on.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


class Breaker:
    """Whether the remote may be asked now, and the warnings about it."""

    def __init__(self, where: str, cooldown_s: float = 300.0) -> None:
        self.where = where
        self.cooldown_s = cooldown_s
        self._down_until = 0.0
        self._down = False
        self.writes_refused: str | None = None
        """Why writes stopped (None while they go on)."""
        self.failures = 0
        self._said: set[str] = set()

    def available(self) -> bool:
        """False during an outage's cool-down."""
        return time.monotonic() >= self._down_until

    def writable(self) -> bool:
        """False during an outage, or once a write was refused."""
        return self.writes_refused is None and self.available()

    def failed(self, error: Exception) -> None:
        """The remote could not be reached, timed out or refused a read: skip it for a while."""
        self.failures += 1
        self._down_until = time.monotonic() + self.cooldown_s
        if not self._down:
            self._down = True
            log.warning(
                "tuning cache: the remote %s cannot be used (%s); going on with the local "
                "cache only, and trying it again in %.0f s",
                self.where,
                error,
                self.cooldown_s,
            )

    def refused_write(self, error: Exception) -> None:
        """A write was refused: no more writes from this cache object."""
        self.failures += 1
        if self.writes_refused is None:
            self.writes_refused = str(error)
            log.warning(
                "tuning cache: the remote %s refuses writes (%s); entries stay local, "
                "reads from it go on",
                self.where,
                error,
            )

    def succeeded(self) -> None:
        """A request went through: an outage (if any) is over."""
        if self._down:
            self._down = False
            log.info("tuning cache: the remote %s answers again", self.where)

    def warn_once(self, topic: str, message: str, *args: object) -> None:
        """Log ``message % args`` as a warning the first time ``topic`` comes up, else at debug."""
        level = logging.DEBUG if topic in self._said else logging.WARNING
        self._said.add(topic)
        log.log(level, message, *args)
