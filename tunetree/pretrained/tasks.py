"""Hugging Face checkpoint directories: the model class a task needs, built and loaded tuned.

A directory written by ``save_pretrained`` (``config.json`` and the weights, with or without
tokenizer files) is built with the ``transformers`` auto class of its task
(:data:`TASKS`); :func:`load_pretrained` builds it and loads a tuned checkpoint onto it in one
call, as ``tt.load(AutoModel....from_pretrained(directory), path)`` does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InvalidInputError, MissingDependencyError
from ..generation.loading import load


@dataclass(frozen=True)
class Task:
    """One task: the ``transformers`` auto class that builds its model and what it is fed.

    Args:
        auto_class: name of the ``transformers`` auto class, e.g. ``AutoModelForCausalLM``.
        inputs: ``"text"`` (token ids and a mask) or ``"image"`` (pixel values).
        generates: whether the task is tuned and served through ``generate``.
    """

    auto_class: str
    inputs: str = "text"
    generates: bool = False


TASKS: dict[str, Task] = {
    "feature-extraction": Task("AutoModel"),
    "fill-mask": Task("AutoModelForMaskedLM"),
    "text-classification": Task("AutoModelForSequenceClassification"),
    "token-classification": Task("AutoModelForTokenClassification"),
    "question-answering": Task("AutoModelForQuestionAnswering"),
    "text-generation": Task("AutoModelForCausalLM", generates=True),
    "text2text-generation": Task("AutoModelForSeq2SeqLM", generates=True),
    "image-classification": Task("AutoModelForImageClassification", inputs="image"),
    "image-feature-extraction": Task("AutoModel", inputs="image"),
}
"""The tasks ``tunetree tune`` and :func:`load_pretrained` know, by their Hugging Face names."""


def task_of(name: str) -> Task:
    """The :class:`Task` called ``name``; InvalidInputError naming the known ones otherwise."""
    task = TASKS.get(name)
    if task is None:
        known = ", ".join(TASKS)
        raise InvalidInputError(f"unknown task {name!r}; one of: {known}")
    return task


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise MissingDependencyError(
            "a Hugging Face checkpoint needs transformers: pip install 'tunetree[hf]'"
        ) from exc
    return transformers


def checkpoint_directory(directory: str | os.PathLike[str]) -> Path:
    """``directory`` when it holds a ``config.json``; InvalidInputError saying what is missing."""
    path = Path(os.fspath(directory))
    if not path.is_dir():
        raise InvalidInputError(f"{path} is not a directory")
    if not (path / "config.json").is_file():
        raise InvalidInputError(
            f"{path} has no config.json: not a Hugging Face checkpoint directory "
            "(save_pretrained writes one)"
        )
    return path


def pretrained_config(directory: str | os.PathLike[str]) -> Any:
    """The ``transformers`` config of a checkpoint directory, read without its weights.

    Raises:
        InvalidInputError: no ``config.json``, or one transformers cannot read.
        MissingDependencyError: transformers is not installed.
    """
    path = checkpoint_directory(directory)
    try:
        return _transformers().AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidInputError(f"{path}/config.json cannot be read: {_first_line(exc)}") from exc


def build_pretrained(
    directory: str | os.PathLike[str], task: str, device: torch.device | str = "cpu"
) -> Any:
    """The model of ``directory`` for ``task``, in eval mode on ``device``.

    Args:
        directory: a ``save_pretrained`` directory (config and weights).
        task: a name in :data:`TASKS`.
        device: where the model is put.

    Returns:
        The ``transformers`` model, built by the task's auto class.

    Raises:
        InvalidInputError: an unknown task, a directory without a config, a model whose
            architecture cannot do the task, or weights transformers cannot read.
        MissingDependencyError: transformers is not installed.
    """
    spec = task_of(task)
    path = checkpoint_directory(directory)
    config = pretrained_config(path)
    auto = getattr(_transformers(), spec.auto_class)
    if type(config) not in auto._model_mapping:
        raise InvalidInputError(
            f"a {config.model_type} model cannot do {task}: transformers' {spec.auto_class} "
            f"has no class for {type(config).__name__}"
        )
    try:
        model = auto.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise InvalidInputError(f"{path} cannot be loaded for {task}: {_first_line(exc)}") from exc
    return model.to(device).eval()


def load_pretrained(
    directory: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    task: str,
    device: torch.device | str = "cpu",
    ignore: tuple[str, ...] = (),
) -> Any:
    """Build ``directory``'s model for ``task`` and load the tuned checkpoint ``path`` onto it.

    The same as ``tt.load(AutoModelFor....from_pretrained(directory), path)`` with the auto
    class of the task (:data:`TASKS`); every runner is checked against eager before it
    serves, as :func:`tunetree.load` does.

    Args:
        directory: the ``save_pretrained`` directory that was tuned.
        path: the ``.tt`` checkpoint ``tunetree tune`` (or ``tt.save``) wrote.
        task: the task it was tuned for, a name in :data:`TASKS`.
        device: where to load it (the device type it was tuned on).
        ignore: environment record entries to waive, as in :func:`tunetree.load`.

    Returns:
        The tuned model to call (``generate`` for the generation tasks).

    Raises:
        InvalidInputError: as :func:`build_pretrained`.
        CheckpointError: as :func:`tunetree.load`.

    Example:
        >>> import tempfile, torch, transformers, tunetree as tt
        >>> directory = tempfile.mkdtemp()
        >>> transformers.BertModel(transformers.BertConfig(vocab_size=32, hidden_size=8,
        ...     num_hidden_layers=1, num_attention_heads=1, intermediate_size=8)
        ... ).save_pretrained(directory)
        >>> model, ids = transformers.AutoModel.from_pretrained(directory), torch.tensor([[1, 2]])
        >>> result = tt.tune(model.eval(), [ids], strategy=tt.OneBackendStrategy(
        ...     tt.backends.Eager()), cache=False, verbose=False,
        ...     measure_config=tt.MeasureConfig.quick())
        >>> path = tt.save(result, directory + "/model.tt")
        >>> fast = tt.load_pretrained(directory, path, task="feature-extraction")
        >>> torch.equal(fast(ids).last_hidden_state, model(ids).last_hidden_state)
        True
    """
    model = build_pretrained(directory, task, device)
    return load(model, path, ignore=ignore, device=device)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
