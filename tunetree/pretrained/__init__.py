"""Hugging Face checkpoint directories: the auto class a task needs, built and loaded tuned.

:func:`build_pretrained` builds a ``save_pretrained`` directory's model for a task;
:func:`load_pretrained` builds it and loads a tuned checkpoint onto it in one call.
"""

from __future__ import annotations

from .tasks import (
    TASKS,
    Task,
    build_pretrained,
    checkpoint_directory,
    load_pretrained,
    pretrained_config,
    task_of,
)

__all__ = [
    "TASKS",
    "Task",
    "build_pretrained",
    "checkpoint_directory",
    "load_pretrained",
    "pretrained_config",
    "task_of",
]
