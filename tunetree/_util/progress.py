"""Progress of long work (tuning, auto-tuning) on the ``tunetree.progress`` logger.

Each step is one record: at INFO when verbose, at DEBUG otherwise. Where the application has
configured logging (a handler anywhere on the logger's chain), its configuration decides what
is shown and where: ``logging.getLogger("tunetree").setLevel(logging.INFO)`` shows progress
under a root logger at WARNING, and ``logging.getLogger("tunetree.progress").setLevel(
logging.WARNING)`` hides it. Where nothing is configured (a script, a notebook), verbose steps
are written to stderr by a handler of this module's own, as ``logging.lastResort`` writes
warnings; no handler is installed on any logger, the root logger least of all.
"""

from __future__ import annotations

import logging
import sys
import time

LOGGER_NAME = "tunetree.progress"
logger = logging.getLogger(LOGGER_NAME)


class _StderrHandler(logging.Handler):
    """Writes a record's message to the current ``sys.stderr`` (looked up at each record)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # a closed or broken stream must not stop tuning
            self.handleError(record)


_FALLBACK = _StderrHandler(logging.INFO)
_FALLBACK.setFormatter(logging.Formatter("[tunetree %(elapsed)7.1fs] %(message)s"))


def _unconfigured_and_shown(log: logging.Logger) -> bool:
    """True when no handler is configured on ``log``'s chain and no tunetree level hides INFO."""
    if log.hasHandlers() or log.disabled:
        return False
    current: logging.Logger | None = log
    while current is not None and current.name.startswith("tunetree"):
        if current.level:  # a level the application set on a tunetree logger still holds
            return current.level <= logging.INFO
        current = current.parent
    return True


class Progress:
    """One log record per step with the elapsed time: INFO when ``verbose``, else DEBUG.

    Args:
        verbose: whether the steps are worth showing (INFO) or kept for debugging (DEBUG).
    """

    def __init__(self, verbose: bool = True) -> None:
        self.verbose = verbose
        self.start = time.perf_counter()

    def __call__(self, *parts: object) -> None:
        """Log one step made of the non-empty ``parts``."""
        level = logging.INFO if self.verbose else logging.DEBUG
        text = " · ".join(str(p) for p in parts if p not in (None, ""))
        elapsed = time.perf_counter() - self.start
        extra = {"elapsed": elapsed}
        if self.verbose and _unconfigured_and_shown(logger):
            record = logger.makeRecord(logger.name, level, __file__, 0, text, (), None, extra=extra)
            _FALLBACK.handle(record)
        elif logger.isEnabledFor(level):
            logger.log(level, "[%.1fs] %s", elapsed, text, extra=extra)
