"""The calls ``tunetree tune`` tunes on: synthetic ones of given shapes, or read from a file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from ..errors import InvalidInputError
from ..pretrained import Task

MAX_SHAPE = 1 << 16
"""The largest batch or length ``--shapes`` takes (a typo should not allocate gigabytes)."""

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
)
"""Files a saved tokenizer is made of (transformers builds an empty one without them)."""

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
"""Image files ``--inputs`` takes, alone or in a directory."""

MAX_IMAGE_PIXELS = 1 << 26
"""The most pixels an input image may state (read from its header before it is decoded)."""

MAX_IMAGES = 256
"""The most images a directory given to ``--inputs`` may hold."""

_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"1x16,4x64"`` as ``[(1, 16), (4, 64)]``: batch by length (by image side for images).

    Raises:
        InvalidInputError: an entry that is not ``BATCHxLENGTH`` of positive integers.
    """
    shapes = []
    for part in text.split(","):
        match = _SHAPE.match(part)
        if match is None:
            raise InvalidInputError(
                f"--shapes: {part.strip()!r} is not BATCHxLENGTH (e.g. --shapes 1x16,4x64)"
            )
        batch, length = int(match.group(1)), int(match.group(2))
        if not (0 < batch <= MAX_SHAPE and 0 < length <= MAX_SHAPE):
            raise InvalidInputError(
                f"--shapes: {part.strip()!r}: batch and length are 1 to {MAX_SHAPE}"
            )
        shapes.append((batch, length))
    return shapes


def pad_token_id(config: Any) -> int:
    """The id padded positions hold: the config's pad token, else its end-of-sequence, else 0."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int):
            return value
    return 0


def check_shapes(config: Any, task: Task, shapes: list[tuple[int, int]]) -> None:
    """Refuse shapes the model cannot take, from its config alone (before weights load).

    Raises:
        InvalidInputError: an image side other than the config's ``image_size``, or a text
            model whose config states no vocabulary.
    """
    if task.inputs == "image":
        side = getattr(config, "image_size", None)
        side = side[0] if isinstance(side, list | tuple) and side else side
        wrong = sorted({n for _, n in shapes if isinstance(side, int) and n != side})
        if wrong:
            raise InvalidInputError(
                f"--shapes: this model takes images of side {side} (its config's image_size), "
                f"not {', '.join(map(str, wrong))}: give BATCHx{side}"
            )
    elif int(getattr(config, "vocab_size", 0) or 0) < 2:
        raise InvalidInputError("the model's config states no vocab_size: give --inputs")


def synthetic_samples(
    model: Any, task: Task, shapes: list[tuple[int, int]], device: torch.device
) -> list[dict[str, torch.Tensor]]:
    """One call per shape: valid random token ids with a mask, or random pixel values.

    Every batch of more than one row pads its last row to half its length (on the left for
    the generation tasks, as ``generate`` expects, else on the right), so the tuned graphs
    hold a padded row as served batches do.
    """
    generator = torch.Generator().manual_seed(0)
    config = model.config
    check_shapes(config, task, shapes)
    if task.inputs == "image":
        channels = int(getattr(config, "num_channels", 3))
        return [
            {"pixel_values": torch.randn(b, channels, n, n, generator=generator).to(device)}
            for b, n in shapes
        ]
    vocab = int(config.vocab_size)
    pad = pad_token_id(config)
    samples = []
    for batch, length in shapes:
        ids = torch.randint(0, vocab, (batch, length), generator=generator)
        ids[ids == pad] = (pad + 1) % vocab  # the pad id only where the mask hides it
        mask = torch.ones(batch, length, dtype=torch.long)
        if batch > 1 and length > 1:
            hidden = slice(0, length // 2) if task.generates else slice(length - length // 2, None)
            mask[-1, hidden] = 0
            ids[-1, hidden] = pad
        samples.append({"input_ids": ids.to(device), "attention_mask": mask.to(device)})
    return samples


def samples_from_file(
    path: Path, directory: Path, task: Task, device: torch.device
) -> list[dict[str, Any]]:
    """The calls a file (or a directory of images) holds.

    ``.pt`` (read with ``weights_only=True``) or ``.safetensors``: a dict of tensors is one
    call, a list of such dicts (``.pt`` only) one call each. ``.txt``: one text per line;
    ``.json``: a list of texts, or a list of lists of texts (one batch each). Texts go
    through the directory's tokenizer: each line is a call of its own, and every text
    together one padded batch. Images (an image file, or a directory of them) go through the
    directory's image processor the same way: each image a call, all of them one batch.

    Args:
        path: The file, or a directory of image files.
        directory: The checkpoint directory (its tokenizer or image processor).
        task: The task the calls are for.
        device: Where the calls' tensors go.

    Returns:
        The calls: the model's keyword arguments, one dict per call.

    Raises:
        InvalidInputError: a missing or unreadable file, another suffix, texts without a
            tokenizer or images without an image processor in ``directory``, or inputs of
            the other kind than the task takes.
    """
    if path.suffix.lower() in IMAGE_SUFFIXES or (path.is_dir() and task.inputs == "image"):
        if task.inputs != "image":
            raise InvalidInputError(f"--inputs: images cannot feed a {task.inputs} task")
        return _processed(_images(path), directory, device)
    if not path.is_file():
        raise InvalidInputError(f"--inputs: {path} is not a file")
    suffix = path.suffix.lower()
    if suffix == ".pt":
        try:
            data = torch.load(path, map_location=device, weights_only=True)
        except Exception as exc:  # torch raises several types for a file it cannot read
            raise InvalidInputError(f"--inputs: {path} cannot be read: {exc}") from exc
        return _calls(data, path)
    if suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return _calls(load_file(str(path), device=str(device)), path)
        except (SafetensorError, OSError) as exc:
            raise InvalidInputError(f"--inputs: {path} cannot be read: {exc}") from exc
    if suffix in (".txt", ".json"):
        if task.inputs != "text":
            raise InvalidInputError(f"--inputs: texts cannot feed an {task.inputs} task")
        return _tokenized(_texts(path), directory, task, device)
    raise InvalidInputError(
        f"--inputs: {path.name} is not .pt, .safetensors, .txt, .json, an image "
        f"({', '.join(IMAGE_SUFFIXES)}) or a directory of images"
    )


def _calls(data: Any, path: Path) -> list[dict[str, Any]]:
    calls = data if isinstance(data, list) else [data]
    for call in calls:
        if not isinstance(call, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in call.items()
        ):
            raise InvalidInputError(
                f"--inputs: {path} must hold a dict of named tensors (the model's keyword "
                "arguments) or a list of them"
            )
    if not calls:
        raise InvalidInputError(f"--inputs: {path} holds no call")
    return calls


def _texts(path: Path) -> list[list[str]]:
    """Batches of texts: each line its own batch, and all lines together."""
    import json

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidInputError(f"--inputs: {path} cannot be read: {exc}") from exc
    if data is None:
        lines = [line for line in text.splitlines() if line.strip()]
        batches = [[line] for line in lines] + ([lines] if len(lines) > 1 else [])
    elif isinstance(data, list) and all(isinstance(t, str) for t in data):
        batches = [[t] for t in data] + ([data] if len(data) > 1 else [])
    elif isinstance(data, list) and all(
        isinstance(b, list) and b and all(isinstance(t, str) for t in b) for b in data
    ):
        batches = data
    else:
        raise InvalidInputError(f"--inputs: {path} must hold a list of texts or of lists of texts")
    if not batches:
        raise InvalidInputError(f"--inputs: {path} holds no text")
    return batches


def _tokenized(
    batches: list[list[str]], directory: Path, task: Task, device: torch.device
) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise InvalidInputError(
            f"--inputs: texts need a tokenizer in {directory} (none of "
            f"{', '.join(TOKENIZER_FILES)}); give --shapes or a .pt of token ids"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InvalidInputError(
            f"--inputs: texts need a tokenizer in {directory} ({str(exc).splitlines()[0][:200]})"
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    tokenizer.padding_side = "left" if task.generates else "right"
    calls = []
    for batch in batches:
        encoded = tokenizer(batch, return_tensors="pt", padding=True)
        calls.append({k: v.to(device) for k, v in encoded.items()})
    return calls


def _images(path: Path) -> list[Any]:
    """The images at ``path`` (a file, or a directory's image files by name), decoded as RGB.

    Each image's size is read from its header and bounded before it is decoded.
    """
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise InvalidInputError(f"--inputs: {path} holds no {'/'.join(IMAGE_SUFFIXES)} image")
        if len(files) > MAX_IMAGES:
            raise InvalidInputError(f"--inputs: {path} holds over {MAX_IMAGES} images")
    elif path.is_file():
        files = [path]
    else:
        raise InvalidInputError(f"--inputs: {path} is not a file")
    try:
        from PIL import Image
    except ImportError as exc:
        raise InvalidInputError("--inputs: images need Pillow: pip install 'tunetree[hf]'") from exc
    images = []
    for file in files:
        try:
            with Image.open(file) as image:
                width, height = image.size
                if width * height <= MAX_IMAGE_PIXELS:
                    images.append(image.convert("RGB"))
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise InvalidInputError(f"--inputs: {file} cannot be read as an image: {exc}") from exc
        if width * height > MAX_IMAGE_PIXELS:
            raise InvalidInputError(
                f"--inputs: {file} states {width}x{height} pixels, over {MAX_IMAGE_PIXELS}"
            )
    return images


def _processed(images: list[Any], directory: Path, device: torch.device) -> list[dict[str, Any]]:
    """Each image a call of batch 1 and, with several, all of them one batch."""
    from transformers import AutoImageProcessor

    if not (directory / "preprocessor_config.json").is_file():
        raise InvalidInputError(
            f"--inputs: images need an image processor in {directory} (no "
            "preprocessor_config.json); give --shapes or a .pt of pixel_values"
        )
    try:
        processor = AutoImageProcessor.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InvalidInputError(
            f"--inputs: images need an image processor in {directory} "
            f"({str(exc).splitlines()[0][:200]})"
        ) from exc
    batches = [[image] for image in images] + ([images] if len(images) > 1 else [])
    calls = []
    for batch in batches:
        encoded = processor(images=batch, return_tensors="pt")
        calls.append({"pixel_values": encoded["pixel_values"].to(device)})
    return calls
