"""The ``.tt`` checkpoint: a tuned model saved once, loaded without tuning again.

* :mod:`~tunetree.checkpoint.format`: header, limits, member names, the typed manifest.
* :mod:`~tunetree.checkpoint.writer`: :func:`save`.
* :mod:`~tunetree.checkpoint.reader`: header, sources, manifest, budgeted extraction.
* :mod:`~tunetree.checkpoint.loading`: :func:`load`.
* :mod:`~tunetree.checkpoint.info`: :func:`read_info` (``tunetree info``).
* :mod:`~tunetree.checkpoint.environment`: the environment record a tuning belongs to.

Loading checks, in this order and reading nothing more before each check passes: the
format version, the environment record against the running environment, then the
manifest, and only then extracts the members the plan needs, each verified against its
SHA-256 before use. Nothing is unpickled: weights are safetensors, the rest is JSON or
artifacts that the backends read with their own non-executing loaders.
"""

from __future__ import annotations

from .format import FORMAT_VERSION, EnvironmentMismatchError, Manifest, ManifestError
from .info import CheckpointInfo, read_info
from .loading import load
from .writer import save

__all__ = [
    "FORMAT_VERSION",
    "CheckpointInfo",
    "EnvironmentMismatchError",
    "Manifest",
    "ManifestError",
    "load",
    "read_info",
    "save",
]
