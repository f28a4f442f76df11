"""Test-only backends and models for the tuning-cache tests, and a runner for fresh processes.

``python -m tests.cache.fakes '<json>'`` tunes a model in a new process and prints one JSON
line: the backend builds it made (``kind:module path``), cache hits and misses, and whether
the tuned outputs match eager.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tunetree.backends import Inductor
from tunetree.backends.base import Backend, Runner
from tunetree.cache import default_directory
from tunetree.signature.binding import original_forward
from tunetree.signature.graph import Graph, GraphKey

from ..fakes import spin

BUILDS: list[str] = []
"""Every build in this process, as ``kind:path`` (the path from :data:`PATHS`)."""

PATHS: dict[int, str] = {}
"""id(module) -> path, filled by :func:`name_modules` so builds can be told apart."""

GONE_ENV = "TT_TEST_BACKEND_GONE"
"""Set: :class:`Flaky` runners fail to load, as if their package had been uninstalled."""


def name_modules(model: nn.Module) -> None:
    PATHS.clear()
    PATHS.update({id(m): path for path, m in model.named_modules()})


def _record(kind: str, module: nn.Module, build_delay_s: float) -> None:
    BUILDS.append(f"{kind}:{PATHS.get(id(module), type(module).__name__)}")
    if build_delay_s:
        time.sleep(build_delay_s)


class SavingRunner(Runner):
    """Runs a copy of the module (its weights baked in, like OpenVINO or ONNX runners)."""

    def __init__(self, backend: Saving, module: nn.Module) -> None:
        super().__init__(backend)
        self.delay_s = backend.delay_s
        self.module = module
        self.forward = original_forward(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        spin(self.delay_s)
        return self.forward(*args, **kwargs)

    def save(self, directory: Path) -> dict[str, Any]:
        weights = {k: v.detach().contiguous().clone() for k, v in self.module.state_dict().items()}
        save_file(weights, str(directory / "weights.safetensors"))
        (directory / "notes").mkdir()
        (directory / "notes" / "about.txt").write_text("saved by a test backend\n")
        return {"weights": "weights.safetensors"}


@dataclasses.dataclass(frozen=True)
class Saving(Backend):
    """Builds a runner that bakes the weights in and saves them as a real artifact file."""

    kind: ClassVar[str] = "test-saving"
    delay_s: float = 0.0
    build_delay_s: float = 0.0

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        _record(self.kind, module, self.build_delay_s)
        return SavingRunner(self, copy.deepcopy(module))

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        description: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        assert (directory / "notes" / "about.txt").read_text() == "saved by a test backend\n"
        copied = copy.deepcopy(module)
        copied.load_state_dict(load_file(str(directory / description["weights"])))
        return SavingRunner(self, copied)


@dataclasses.dataclass(frozen=True)
class Flaky(Saving):
    """A :class:`Saving` backend whose loads fail while ``$TT_TEST_BACKEND_GONE`` is set."""

    kind: ClassVar[str] = "test-flaky"

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        description: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        if os.environ.get(GONE_ENV):
            raise ImportError("No module named 'flaky_runtime'")
        return super().load(module, key, directory, description, device)


class CountingRunner(Runner):
    def __init__(self, backend: Counting, module: nn.Module) -> None:
        super().__init__(backend)
        self.delay_s = backend.delay_s
        self.forward = original_forward(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        spin(self.delay_s)
        return self.forward(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class Counting(Backend):
    """Eager with an optional delay per call; saves nothing, loads from the module."""

    kind: ClassVar[str] = "test-counting"
    delay_s: float = 0.0

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        _record(self.kind, module, 0.0)
        return CountingRunner(self, module)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        description: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        return CountingRunner(self, module)


@dataclasses.dataclass(frozen=True)
class LoggedInductor(Inductor):
    """The real Inductor backend, with its builds logged."""

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        _record(self.kind, module, 0.0)
        return super().build(module, graph, device)


class Leaf(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class Tree(nn.Module):
    """root -> a (Leaf: a.lin), b (Leaf: b.lin): depth 0 one module, 1 two, 2 two."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.a = Leaf(width)
        self.b = Leaf(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) + x


def tree(seed: int = 0) -> Tree:
    torch.manual_seed(seed)
    return Tree().eval()


def load_model(spec: str, seed: int) -> nn.Module:
    """``tree`` or ``file:<path>`` (a file defining ``Root``)."""
    if spec == "tree":
        return tree(seed)
    path = spec.removeprefix("file:")
    module_spec = importlib.util.spec_from_file_location("edited_model", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["edited_model"] = module
    module_spec.loader.exec_module(module)
    torch.manual_seed(seed)
    return module.Root().eval()


def strategy(name: str, build_delay_s: float = 0.0) -> Any:
    import tunetree as tt

    if name == "first-wins":
        return tt.FirstWinsStrategy([Saving(build_delay_s=build_delay_s), Counting()])
    if name == "inductor":
        return tt.OneBackendStrategy(LoggedInductor())
    if name == "min-latency":
        return tt.MinLatencyStrategy([Saving(), Counting(delay_s=0.002)])
    raise ValueError(name)


def run(config: dict[str, Any]) -> dict[str, Any]:
    """Tune as ``config`` says (model, depths, shapes, strategy); report builds and hits."""
    import tunetree as tt

    model = load_model(config.get("model", "tree"), config.get("seed", 0))
    name_modules(model)
    torch.manual_seed(1)
    width = config.get("width", 8)
    data = [torch.randn(*shape, width) for shape in config.get("shapes", [[4]])]
    cache = tt.TuningCache(config.get("cache") or default_directory(), remote=config.get("remote"))
    with torch.no_grad():
        expected = [model(x) for x in data]
    ok = True
    for depth in config.get("depths", [0]):
        result = tt.tune(
            model,
            data,
            depth=depth,
            strategy=strategy(config.get("strategy", "first-wins"), config.get("build_delay_s", 0)),
            measure_config=tt.MeasureConfig.quick(),
            verbose=False,
            cache=cache,
        )
        with torch.no_grad():
            ok = ok and all(
                torch.allclose(result.model(x), y, rtol=1e-4, atol=1e-5)
                for x, y in zip(data, expected, strict=True)
            )
        result.undo()
    hits, misses = cache.stats.hits, cache.stats.misses
    report = {"builds": BUILDS, "hits": hits, "misses": misses, "ok": ok}
    if cache.remote is not None:
        report["remote_hits"] = cache.stats.remote_hits
        report["remote_stored"] = cache.stats.remote_stored
    return report


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)
