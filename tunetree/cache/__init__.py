"""The persistent tuning cache: the same graph is never tuned twice, across processes and restarts.

"The same graph" means the same graph of the same module, tuned with the same strategy in the same
environment.

:class:`TuningCache` is what :func:`tunetree.tune` and :func:`tunetree.auto_tune` consult
per graph before building anything (``cache=``; on by default, in ``TUNETREE_CACHE_DIR``
or ``~/.cache/tunetree``; ``cache=False`` turns it off).

* :mod:`~tunetree.cache.keys`: what an entry is keyed by (module structure, graph,
  strategy, tolerances, hard environment).
* :mod:`~tunetree.cache.entry`: the typed entry manifest, validated on read.
* :mod:`~tunetree.cache.store`: the on-disk layout (entries, content-addressed artifacts).
* :mod:`~tunetree.cache.writer` / :mod:`~tunetree.cache.reuse`: writing an entry, serving a
  lookup from one.
* :mod:`~tunetree.cache.locks`: writer locks per key, measurement locks per device.
* :mod:`~tunetree.cache.maintenance`: entry summaries and gc; :mod:`~tunetree.cache.cli`:
  ``tunetree cache ls | verify | gc``.

The cache depends only downward (on evaluate, results, strategy and the artifact layer);
nothing below it imports it.
"""

from __future__ import annotations

from .entry import EntryFault, EntryManifest, EntryMissing, MalformedEntryError
from .maintenance import EntryInfo, GcReport
from .tuning import ENV_DIR, CacheStats, TuningCache, default_directory, open_cache
from .writer import KILL_HOOK_ENV, KILL_POINTS

__all__ = [
    "ENV_DIR",
    "KILL_HOOK_ENV",
    "KILL_POINTS",
    "CacheStats",
    "EntryFault",
    "EntryInfo",
    "EntryManifest",
    "EntryMissing",
    "GcReport",
    "MalformedEntryError",
    "TuningCache",
    "default_directory",
    "open_cache",
]
