from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import Delayed, Failing, Wrong, mlp
from tests.fakes import quick_tune as tune
from tunetree.candidates.evaluate import Status
from tunetree.runtime.wrap import dispatcher_of
from tunetree.signature.graph import GraphKey

pytestmark = pytest.mark.usefixtures("virtual_time")
"""Every test here decides on timings its fakes declare (``tests/clock.py``, issue 33)."""

QUICK = tt.MeasureConfig.quick()


def test_winner_wraps_and_outputs_match() -> None:
    model = mlp()
    data = [torch.randn(4, 16) for _ in range(2)]
    result = tune(model, data, [Delayed(0.003, "slow"), Delayed(0.0, "fast"), tt.backends.Eager()])
    graph = result.graphs[0]
    assert len(graph.rows) == 3
    assert graph.rows[1].latency_s < graph.rows[0].latency_s
    assert graph.winner is not None and graph.winner is not graph.rows[0]
    # Without eager among the candidates the fast one must win and wrap the model.
    result = tune(model, data, [Delayed(0.003, "slow"), Delayed(0.0, "fast")])
    graph = result.graphs[0]
    assert graph.winner is graph.rows[1] and all(r.timing is not None for r in graph.rows)
    fast = result.model
    assert fast is not model  # depth 0 wraps a shallow copy
    assert dispatcher_of(model) is None
    with torch.no_grad():
        assert torch.equal(fast(data[0]), model(data[0]))
    text = str(result)
    assert "*fake-delayed" in text and "vs eager" in text


def test_failing_backends_become_rows_and_module_keeps_forward() -> None:
    model = mlp()
    data = [torch.randn(4, 16)]
    result = tune(model, data, [Failing("build"), Failing("run")], depth=1)
    rows = [r for g in result.graphs for r in g.rows]
    assert {r.status for r in rows} == {Status.FAILED}
    assert any("exploded while building" in r.reason for r in rows)
    assert any(r.reason.startswith("run: RuntimeError") for r in rows)
    assert result.plan.entries == []
    assert all(dispatcher_of(m) is None for m in model.modules())
    assert "failed: build: RuntimeError" in str(result)


def test_wrong_numbers_are_rejected_with_the_difference() -> None:
    model = mlp()
    result = tune(model, [torch.randn(4, 16)], [Wrong(0.1), tt.backends.Eager()])
    wrong = result.graphs[0].rows[0]
    assert wrong.status is Status.REJECTED
    assert "max abs diff 0.1" in wrong.reason
    assert result.graphs[0].winner.backend.kind == "eager"


def test_dry_run_tunes_nothing() -> None:
    model = mlp()
    backend = Delayed(0.0)
    result = tt.tune(
        model,
        [torch.randn(4, 16)],
        depth=1,
        strategy=tt.FirstWinsStrategy([backend]),
        dry_run=True,
        verbose=False,
    )
    assert backend.builds == []
    assert "would tune 3 modules, 3 graphs" in str(result)


def test_each_graph_gets_its_own_strategy_instance() -> None:
    instances = []

    class Recording(tt.MinLatencyStrategy):
        def run(self, session):
            instances.append(self)
            return super().run(session)

    user_strategy = Recording([tt.backends.Eager()])
    tt.tune(
        mlp(),
        [torch.randn(4, 16)],
        depth=1,
        strategy=user_strategy,
        measure_config=QUICK,
        verbose=False,
    )
    assert len(instances) == 3
    assert len({id(s) for s in instances}) == 3
    assert user_strategy not in instances


def test_kwargs_module_and_progress_output(caplog: pytest.LogCaptureFixture) -> None:
    class KW(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, *, scale: float = 1.0, mask: torch.Tensor | None = None):
            y = self.lin(x) * scale
            return {"y": y, "masked": y if mask is None else y * mask}

    model = KW().eval()
    data = [{"x": torch.randn(2, 4), "scale": 2.0, "mask": torch.ones(2, 4)}]
    with caplog.at_level(logging.INFO, logger="tunetree.progress"):
        result = tt.tune(
            model, data, strategy=tt.OneBackendStrategy(Delayed(0.0)), measure_config=QUICK
        )
    assert any(r.name == "tunetree.progress" for r in caplog.records)
    with torch.no_grad():
        out = result.model(**data[0])
        assert torch.equal(out["y"], model(**data[0])["y"])


def test_device_mismatch_is_refused() -> None:
    with pytest.raises(tt.InvalidInputError, match="move the model first"):
        tt.tune(mlp(), [torch.randn(4, 16)], device="meta", verbose=False)


def test_opaque_objects_never_reuse_a_runner_tuned_with_another_object() -> None:
    """A backend may bake a non-tensor argument into its graph; a call with another object of
    the same type must therefore run the original forward, never the baked runner."""
    import dataclasses
    from typing import Any, ClassVar

    from tunetree.backends.base import Backend, Runner
    from tunetree.signature.binding import original_forward

    class Scale:
        def __init__(self, factor: float) -> None:
            self.factor = factor

    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor, scale: Scale) -> torch.Tensor:
            return x * scale.factor

    class BakedRunner(Runner):
        def __init__(self, backend: Backend, forward: Any, baked: Scale) -> None:
            super().__init__(backend)
            self.forward, self.baked = forward, baked

        def __call__(self, x: torch.Tensor, scale: Scale) -> torch.Tensor:
            return self.forward(x, self.baked)  # ignores the object it is given

    @dataclasses.dataclass(frozen=True)
    class Baking(Backend):
        kind: ClassVar[str] = "fake-baking"

        def build(self, module, graph, device):
            return BakedRunner(self, original_forward(module), graph.samples[0].args[1])

    x = torch.ones(2)
    tuned_with = Scale(2.0)
    result = tt.tune(
        Scaled().eval(),
        [(x, tuned_with)],
        strategy=tt.OneBackendStrategy(Baking()),
        measure_config=QUICK,
        verbose=False,
    )
    assert result.graphs[0].winner is not None
    assert "<Scale>" in str(result.graphs[0].graph.key)
    assert torch.equal(result.model(x, tuned_with), x * 2)
    assert torch.equal(result.model(x, Scale(3.0)), x * 3)  # not the baked 2.0


def test_opaque_detection_looks_at_structure_not_text() -> None:
    class Thing:
        pass

    assert GraphKey.of((torch.ones(1), Thing()), {}).has_opaque
    assert GraphKey.of((), {"nested": [{"x": Thing()}]}).has_opaque
    assert not GraphKey.of((torch.ones(1), "object"), {"mode": "object"}).has_opaque


def test_ranged_graph_is_measured_over_the_mix_with_per_shape_figures() -> None:
    torch.manual_seed(0)
    data = [torch.randn(b, 16) for b in (2, 8, 2)]
    result = tune(mlp(), data, [Delayed(0.0, label="a"), tt.backends.Eager()])
    (graph,) = result.graphs
    assert graph.graph.key.is_dynamic and len(graph.graph.samples) == 3
    assert graph.winner is not None and graph.winner.timing is not None
    assert set(graph.winner.per_shape) == {"batch=2", "batch=8"}
    eager = next(r for r in graph.rows if r.backend.kind == "eager")
    assert set(eager.per_shape) == {"batch=2", "batch=8"}
    table = result.shapes()
    assert "batch=8" in table and "latency per recorded shape" in table
    # an exact-shape tune has no per-shape figures
    assert tune(mlp(), data[:1], [tt.backends.Eager()]).shapes() == ""


def _stack(n: int = 3) -> nn.Module:
    from tests.fakes import Busy

    torch.manual_seed(0)
    return Busy(0.0, 0.0, [Busy(2e-3, 0.0) for _ in range(n)]).eval()


@pytest.mark.parametrize("share", [True, False])
def test_twins_race_only_the_first_ones_winner_against_eager(share: bool) -> None:
    from tests.fakes import Shortcut

    model = _stack(3)
    fast, slow = Shortcut(), Delayed(0.004, "slow")
    strategy = tt.HighestThroughputStrategy([slow, fast, tt.backends.Eager()], share_twins=share)
    result = tt.tune(
        model,
        [torch.randn(2, 4)],
        depth=1,
        strategy=strategy,
        measure_config=QUICK,
        verbose=False,
        cache=False,
    )
    winners = {g.path: g.winner.backend.kind for g in result.graphs if g.winner}
    assert winners == {f"kids.{i}": "fake-shortcut" for i in range(3)}
    assert len(fast.builds) == 3  # every kid's winner is built and checked on its own weights
    assert len(slow.builds) == (1 if share else 3)
    if share:
        twin = result.graphs[2]
        assert "twin of kids.0" in twin.strategy
        skipped = [r for r in twin.rows if r.status is Status.SKIPPED]
        assert [r.backend.kind for r in skipped] == ["fake-delayed"]
        assert "kids.0, where fake-shortcut won" in skipped[0].reason
        assert all(r.timing is not None for r in twin.rows if r.status is Status.OK)


def test_modules_that_differ_in_structure_are_no_twins() -> None:
    from tests.fakes import Busy, Shortcut

    torch.manual_seed(0)
    model = Busy(0.0, 0.0, [Busy(2e-3, 0.0), Busy(3e-3, 0.0)]).eval()  # another delay_s
    slow = Delayed(0.004, "slow")
    strategy = tt.HighestThroughputStrategy([slow, Shortcut(), tt.backends.Eager()])
    tt.tune(
        model,
        [torch.randn(2, 4)],
        depth=1,
        strategy=strategy,
        measure_config=QUICK,
        verbose=False,
        cache=False,
    )
    assert len(slow.builds) == 2
