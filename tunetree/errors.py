"""Typed errors. Every error tunetree raises derives from :class:`TunetreeError`."""

from __future__ import annotations


class TunetreeError(Exception):
    """Base class of every error raised by tunetree.

    Example:
        >>> import tunetree as tt
        >>> try:
        ...     tt.Dim("batch", 8, 1)
        ... except tt.TunetreeError as exc:
        ...     print(type(exc).__name__)
        InvalidInputError
    """


class InvalidInputError(TunetreeError, ValueError):
    """The model, dataset or an argument cannot be used as given."""


class BackendUnavailableError(TunetreeError):
    """A backend cannot run here (package missing, wrong device); the message names the fix."""


class BackendError(TunetreeError):
    """A backend failed while building, running, saving or loading a runner."""


class CheckpointError(TunetreeError):
    """A checkpoint file is corrupt, truncated, hostile or otherwise unreadable."""


class IncompatibleCheckpointError(CheckpointError):
    """A checkpoint was written by another format version or tuned in another environment."""


class UntrustedConfigError(CheckpointError):
    """A backend configuration read from a file could name programs, paths or code.

    The user did not pass ``trust_config=True``.
    """


class CacheError(TunetreeError):
    """The tuning cache cannot be used (unwritable directory, bad configuration)."""


class MissingDependencyError(TunetreeError, ImportError):
    """An optional package is needed for this call; the message names the extra to install."""
