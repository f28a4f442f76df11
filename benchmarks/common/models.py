"""Benchmark models built from code and configs with random weights (nothing is downloaded).

Each entry gives a model in eval mode and a dataset (a list of model inputs) for a device
and a size: ``quick`` (tiny, seconds), ``cpu`` (the sizes of DESIGN.md's CPU table) or
``cuda`` (sizes for an H200: small batches where launch overhead dominates, and large ones
that occupy the GPU).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

Dataset = list[Any]


@dataclass(frozen=True)
class ZooModel:
    """A named model and its inputs; ``flops`` is per call when known (matmul-heavy models)."""

    name: str
    model: nn.Module
    data: Dataset
    matmul_heavy: bool = False


def _mlp(width: int, batch: int, n: int) -> tuple[nn.Module, Dataset]:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1]), [torch.randn(batch, width) for _ in range(n)]


def _encoder(d: int, layers: int, batch: int, seq: int, n: int) -> tuple[nn.Module, Dataset]:
    layer = nn.TransformerEncoderLayer(d, max(4, d // 64), 4 * d, batch_first=True)
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    return model, [torch.randn(batch, seq, d) for _ in range(n)]


class SmallCNN(nn.Module):
    """Conv-BN-ReLU blocks, pooling and a linear head."""

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        chans = [3, width, 2 * width, 4 * width]
        blocks: list[nn.Module] = []
        for cin, cout in itertools.pairwise(chans):
            blocks += [
                nn.Conv2d(cin, cout, 3, padding=1),
                nn.BatchNorm2d(cout),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(chans[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class BasicBlock(nn.Module):
    """A ResNet basic block."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.down(x))


class ResNetish(nn.Module):
    """A ResNet-18-style network (two blocks per stage)."""

    def __init__(self, width: int = 32, classes: int = 100) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        stages: list[nn.Module] = []
        cin = width
        for i, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
            stages += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))


def _tokens(vocab: int, batch: int, seq: int, n: int, mask: bool = True) -> Dataset:
    items = []
    for _ in range(n):
        item: dict[str, torch.Tensor] = {"input_ids": torch.randint(0, vocab, (batch, seq))}
        if mask:
            item["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
        items.append(item)
    return items


def _bert(layers: int, hidden: int, batch: int, seq: int, n: int) -> tuple[nn.Module, Dataset]:
    import transformers

    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(4, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
    )
    return transformers.BertModel(config), _tokens(30522, batch, seq, n)


def _distilbert(
    layers: int, hidden: int, batch: int, seq: int, n: int
) -> tuple[nn.Module, Dataset]:
    import transformers

    config = transformers.DistilBertConfig(
        vocab_size=30522,
        dim=hidden,
        n_layers=layers,
        n_heads=max(4, hidden // 64),
        hidden_dim=4 * hidden,
    )
    return transformers.DistilBertModel(config), _tokens(30522, batch, seq, n)


class GPT2Prefill(nn.Module):
    """GPT-2 language model, prefill only: logits for a whole prompt, no KV cache."""

    def __init__(self, layers: int, hidden: int) -> None:
        super().__init__()
        import transformers

        config = transformers.GPT2Config(
            vocab_size=50257,
            n_positions=1024,
            n_embd=hidden,
            n_layer=layers,
            n_head=max(4, hidden // 64),
        )
        self.lm = transformers.GPT2LMHeadModel(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, use_cache=False).logits


def _gpt2(layers: int, hidden: int, batch: int, seq: int, n: int) -> tuple[nn.Module, Dataset]:
    return GPT2Prefill(layers, hidden), _tokens(50257, batch, seq, n, mask=False)


def _vit(layers: int, hidden: int, batch: int, image: int, n: int) -> tuple[nn.Module, Dataset]:
    import transformers

    config = transformers.ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(4, hidden // 64),
        intermediate_size=4 * hidden,
        image_size=image,
        patch_size=16,
    )
    data = [{"pixel_values": torch.randn(batch, 3, image, image)} for _ in range(n)]
    return transformers.ViTModel(config, add_pooling_layer=False), data


# name -> (builder per size, matmul heavy)
_SIZES: dict[str, dict[str, Callable[[], tuple[nn.Module, Dataset]]]] = {
    "mlp": {
        "quick": lambda: _mlp(64, 8, 2),
        "cpu": lambda: _mlp(1024, 32, 3),
        "cuda": lambda: _mlp(1024, 32, 3),
    },
    "mlp-large": {
        "quick": lambda: _mlp(64, 64, 2),
        "cpu": lambda: _mlp(2048, 256, 3),
        "cuda": lambda: _mlp(4096, 2048, 3),
    },
    "encoder": {
        "quick": lambda: _encoder(32, 2, 2, 16, 2),
        "cpu": lambda: _encoder(256, 4, 8, 128, 3),
        "cuda": lambda: _encoder(256, 4, 8, 128, 3),
    },
    "encoder-large": {
        "quick": lambda: _encoder(64, 2, 2, 32, 2),
        "cpu": lambda: _encoder(512, 4, 8, 256, 3),
        "cuda": lambda: _encoder(1024, 8, 32, 512, 3),
    },
    "cnn": {
        "quick": lambda: (SmallCNN(8), [torch.randn(2, 3, 16, 16) for _ in range(2)]),
        "cpu": lambda: (SmallCNN(32), [torch.randn(8, 3, 64, 64) for _ in range(3)]),
        "cuda": lambda: (SmallCNN(64), [torch.randn(64, 3, 224, 224) for _ in range(3)]),
    },
    "resnet": {
        "quick": lambda: (ResNetish(8), [torch.randn(2, 3, 32, 32) for _ in range(2)]),
        "cpu": lambda: (ResNetish(32), [torch.randn(8, 3, 128, 128) for _ in range(3)]),
        "cuda": lambda: (ResNetish(64), [torch.randn(64, 3, 224, 224) for _ in range(3)]),
    },
    "bert": {
        "quick": lambda: _bert(2, 64, 2, 16, 2),
        "cpu": lambda: _bert(4, 256, 8, 128, 3),
        "cuda": lambda: _bert(4, 256, 8, 128, 3),
    },
    "bert-base": {
        "quick": lambda: _bert(2, 64, 2, 16, 2),
        "cpu": lambda: _bert(12, 768, 4, 128, 2),
        "cuda": lambda: _bert(12, 768, 32, 256, 3),
    },
    "distilbert": {
        "quick": lambda: _distilbert(2, 64, 2, 16, 2),
        "cpu": lambda: _distilbert(6, 384, 8, 128, 3),
        "cuda": lambda: _distilbert(6, 768, 32, 256, 3),
    },
    "gpt2": {
        "quick": lambda: _gpt2(2, 64, 2, 16, 2),
        "cpu": lambda: _gpt2(4, 256, 4, 128, 3),
        "cuda": lambda: _gpt2(6, 768, 8, 256, 3),
    },
    "vit": {
        "quick": lambda: _vit(2, 64, 2, 32, 2),
        "cpu": lambda: _vit(6, 384, 8, 224, 2),
        "cuda": lambda: _vit(12, 768, 32, 224, 3),
    },
}
MATMUL_HEAVY = {
    "mlp",
    "mlp-large",
    "encoder",
    "encoder-large",
    "bert",
    "bert-base",
    "distilbert",
    "gpt2",
    "vit",
}
NAMES = list(_SIZES)
DESIGN_FOUR = ["mlp", "encoder", "cnn", "bert"]
"""The four models of DESIGN.md's measured tables."""


def build(name: str, size: str, device: str = "cpu", seed: int = 0) -> ZooModel:
    """Model ``name`` at ``size`` ("quick", "cpu" or "cuda"), in eval mode on ``device``."""
    if name not in _SIZES:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(NAMES)}")
    torch.manual_seed(seed)
    model, data = _SIZES[name][size]()
    model = model.eval().to(device)
    data = [_to(item, device) for item in data]
    return ZooModel(name, model, data, name in MATMUL_HEAVY)


def _to(item: Any, device: str) -> Any:
    if isinstance(item, torch.Tensor):
        return item.to(device)
    if isinstance(item, dict):
        return {k: v.to(device) for k, v in item.items()}
    return item
