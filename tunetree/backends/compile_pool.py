"""Inductor's compile worker threads: no queued compile outlives the tune or load that queued it.

Inductor compiles a graph's kernels in a thread pool (``torch._inductor.async_compile``, when
``compile_threads`` is above 1, its default on a host of two cores or more). Its workers are not
daemon threads, and at interpreter exit Python runs every item still queued before the process
ends: a build stopped by the time budget (or failed) while its kernels were queued left them to
compile there, so a process that had finished tuning went on compiling for minutes before it
exited, and meanwhile the compiles took cores from the measurements that followed the stop.

Tuning (each cut) and ``tt.load`` (whose checks run a runner's lazy compile) shut down a pool
made while they ran, with its queued work cancelled; items already running (one kernel's
compiler run each) finish on their own. Inductor makes a new pool at its next compile.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)


def _pool_factory() -> Any:
    """Inductor's cached pool factory, or None where Inductor never compiled in this process."""
    module = sys.modules.get("torch._inductor.async_compile")  # never imported from here
    factory = getattr(getattr(module, "AsyncCompile", None), "pool", None)
    return factory if callable(getattr(factory, "cache_info", None)) else None


def compile_pool_made() -> bool:
    """Whether Inductor's compile thread pool exists in this process."""
    factory = _pool_factory()
    return factory is not None and factory.cache_info().currsize > 0


def close_compile_pool() -> bool:
    """Shut Inductor's compile thread pool down, cancelling its queued work.

    Returns:
        True when there was a pool to shut down.
    """
    factory = _pool_factory()
    if factory is None or factory.cache_info().currsize == 0:
        return False
    pool = factory()
    factory.cache_clear()  # the next compile makes a new pool
    pool.shutdown(wait=False, cancel_futures=True)
    log.debug("Inductor's compile thread pool shut down, its queued compiles cancelled")
    return True


@contextlib.contextmanager
def compile_pool_closed() -> Iterator[None]:
    """Shut down, when the block ends or raises, an Inductor compile pool made inside it."""
    made_before = compile_pool_made()
    try:
        yield
    finally:
        if not made_before:
            close_compile_pool()
