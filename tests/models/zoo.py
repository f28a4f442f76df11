"""Small awkward models of the kinds real users bring (issue 11): each a builder returning
a :class:`Case` (the model, its dataset, and how to call it)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tunetree.signature.modules import module_paths


@dataclasses.dataclass
class Case:
    """One zoo model: the object to tune, its dataset and its ``call`` (None: ``model(...)``)."""

    model: Any
    data: list[Any]
    call: Callable[..., Any] | None = None
    train: bool = False
    """The model is in training mode on purpose (tuned with ``allow_training=True``)."""


def state_digest(model: Any) -> str:
    """SHA-256 over every parameter and buffer (by path), the training flags and the RNG."""
    digest = hashlib.sha256()
    for path, module in module_paths(model):
        digest.update(f"{path}:{module.training}".encode())
        for name, tensor in list(module.named_parameters(recurse=False)) + list(
            module.named_buffers(recurse=False)
        ):
            digest.update(f"{path}.{name}".encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    digest.update(torch.get_rng_state().numpy().tobytes())
    return digest.hexdigest()


def _seed() -> None:
    torch.manual_seed(0)


class Hooked(nn.Module):
    """A serving pattern: a pre-hook that rewrites the input, a post-hook returning argmax."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def hooked() -> Case:
    _seed()
    model = Hooked().eval()
    model.register_forward_pre_hook(lambda m, args: (args[0] * 2.0,))
    model.register_forward_hook(lambda m, args, out: out.argmax(-1))
    return Case(model, [torch.randn(2, 8) for _ in range(2)])


class Pipeline:
    """A plain object (not a module) with modules in a dict attribute and a plain one."""

    def __init__(self) -> None:
        _seed()
        self.parts = {"enc": nn.Linear(8, 16).eval(), "dec": nn.Linear(16, 8).eval()}
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(8, 4)).eval()

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.parts["dec"](torch.tanh(self.parts["enc"](x))))


def pipeline() -> Case:
    return Case(Pipeline(), [torch.randn(2, 8) for _ in range(2)], lambda p, x: p.run(x))


class KVCache:
    """A cache object passed between steps (an opaque argument to the model)."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []


class Generator(nn.Module):
    """``generate`` calls ``self.forward`` directly, so the root never runs via __call__."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 20)

    def forward(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        h = self.block(self.embed(ids))
        cache.keys.append(h)
        context = torch.stack(cache.keys).mean(0)
        return self.head(h + context)

    def generate(self, ids: torch.Tensor, steps: int = 3) -> torch.Tensor:
        cache = KVCache()
        out = []
        for _ in range(steps):
            ids = self.forward(ids, cache).argmax(-1)
            out.append(ids)
        return torch.stack(out, 1)


def generator() -> Case:
    _seed()
    ids = [torch.randint(0, 20, (2,)) for _ in range(2)]
    return Case(Generator().eval(), ids, lambda m, x: m.generate(x))


class OptionalKwargs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0
    ) -> torch.Tensor:
        y = self.lin(x) * scale
        return y if mask is None else y * mask


def optional_kwargs() -> Case:
    _seed()
    x = torch.randn(2, 8)
    data = [{"x": x}, {"x": x, "mask": torch.ones(2, 8)}, (x,)]
    return Case(OptionalKwargs().eval(), data)


class PositionalOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor, /) -> torch.Tensor:
        return self.a(x) + self.b(y)


def positional_only() -> Case:
    _seed()
    return Case(PositionalOnly().eval(), [(torch.randn(2, 8), torch.randn(2, 8))])


class ValueBranch(nn.Module):
    """Control flow on a tensor's value: an exporter bakes one branch in."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return torch.relu(y) if y.sum() > 0 else -y


def value_branch() -> Case:
    _seed()
    x = torch.randn(2, 8)
    return Case(ValueBranch().eval(), [x, -x * 3])


class SharedTwice(nn.Module):
    """One submodule called twice per forward."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.shared(torch.relu(self.shared(x))))


def shared_twice() -> Case:
    _seed()
    return Case(SharedTwice().eval(), [torch.randn(2, 8)])


class Trainable(nn.Module):
    """BatchNorm (running stats move in training mode), dropout and a random draw."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.lin(x)))


def training_mode() -> Case:
    _seed()
    return Case(Trainable().train(), [torch.randn(4, 8)], train=True)


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    hidden: torch.Tensor


class DictOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        h = torch.tanh(self.enc(x))
        return {"out": Output(self.head(h), h), "norm": h.norm(dim=-1)}


def dict_outputs() -> Case:
    _seed()
    return Case(DictOutputs().eval(), [torch.randn(2, 8)])


ZOO: dict[str, Callable[[], Case]] = {
    "root_hooks": hooked,
    "pipeline_dicts": pipeline,
    "generate_loop": generator,
    "optional_kwargs": optional_kwargs,
    "positional_only": positional_only,
    "value_branch": value_branch,
    "shared_twice": shared_twice,
    "training_mode": training_mode,
    "dict_outputs": dict_outputs,
}
