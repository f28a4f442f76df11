from __future__ import annotations

import gc
import types

import pytest
import torch

import tunetree as tt
from tests.clock import VirtualClock
from tests.fakes import Busy, Delayed, Shortcut, spin
from tunetree.candidates.budget import TIME_BUDGET_ERROR
from tunetree.runtime.wrap import dispatcher_of, wrapped_paths
from tunetree.search.auto_result import DepthRow, DepthStatus
from tunetree.signature.graph import Graph, Sample

pytestmark = pytest.mark.usefixtures("virtual_time")
"""Every test here decides on timings its fakes declare (``tests/clock.py``, issue 33)."""

MS = 1e-3
QUICK = tt.MeasureConfig(warmup_s=0.02, block_s=0.02, trials=7, max_s_per_candidate=0.4)


def two_level(
    root_delay=0.0, root_tuned=10 * MS, kid_delay=10 * MS, kid_tuned=5 * MS, broken=False
):
    """Root with two kids; untuned = root_delay + 2 * kid_delay."""
    torch.manual_seed(0)
    kids = [Busy(kid_delay, kid_tuned, broken=broken) for _ in range(2)]
    return Busy(root_delay, root_tuned, kids).eval()


def auto(model, backend=None, **kw):
    kw.setdefault("measure_config", QUICK)
    return tt.auto_tune(
        model,
        [torch.randn(2, 4)],
        strategy=tt.OneBackendStrategy(backend or Shortcut()),
        verbose=False,
        **kw,
    )


def test_shallowest_depth_within_tie_tolerance_wins(virtual_time: VirtualClock) -> None:
    # depth 0: 10 ms; depth 1: 2 x 4.9 ms = 9.8 ms (2% faster); untuned 20 ms, on the virtual
    # clock: the decision is tested on these timings, whatever the machine's load (issue 33).
    model = two_level(root_tuned=10 * MS, kid_tuned=4.9 * MS)
    result = auto(model, tie_tolerance=0.05, max_depth=1)
    latencies = {r.depth: r.latency_s for r in result.rows}
    assert latencies[0] == pytest.approx(10 * MS, rel=0.01)
    assert latencies[1] == pytest.approx(9.8 * MS, rel=0.01)
    assert result.depth == 0
    assert result.speedup == pytest.approx(2.0, rel=0.01)
    # With no tolerance the faster depth 1 wins, by its 2%.
    model = two_level(root_tuned=10 * MS, kid_tuned=4.9 * MS)
    assert auto(model, tie_tolerance=0.0, max_depth=1).depth == 1


def test_untuned_wins_and_model_is_left_alone() -> None:
    model = two_level(kid_delay=1 * MS, root_tuned=8 * MS, kid_tuned=5 * MS)
    result = auto(model, max_depth=1)
    assert result.depth is None
    assert result.model is model
    assert wrapped_paths(model) == []
    assert "left untuned" in str(result)


def test_a_depth_passed_over_can_still_be_used() -> None:
    model = two_level(kid_delay=1 * MS, root_tuned=8 * MS, kid_tuned=5 * MS)
    result = auto(model, max_depth=1)
    assert result.depth is None and sorted(result.plans) == [0, 1]
    tuned = result.use(1)
    assert tuned is model and result.depth == 1 and result.model is model
    assert wrapped_paths(model) == ["kids.0", "kids.1"]
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = result.original(x)
    tuned = result.use(0)
    assert tuned is not model and wrapped_paths(model) == []
    assert dispatcher_of(tuned) is not None
    with torch.no_grad():
        assert torch.allclose(tuned(x), expected)
    with pytest.raises(tt.InvalidInputError, match="measured depths: 0, 1"):
        result.use(2)
    result.undo()
    assert wrapped_paths(model) == []


def test_depth_where_every_module_fails_is_skipped() -> None:
    model = two_level(root_tuned=12 * MS, broken=True)
    result = auto(model, max_depth=1)
    row1 = next(r for r in result.rows if r.depth == 1)
    assert row1.status is DepthStatus.SKIPPED
    assert "every module failed" in row1.error and "broken" in row1.error
    assert result.depth == 0
    assert wrapped_paths(model) == []  # depth 0 wraps a copy


def test_time_budget_stops_new_depths_with_exact_error(virtual_time: VirtualClock) -> None:
    @__import__("dataclasses").dataclass(frozen=True)
    class SlowBuild(Shortcut):
        def build(self, module, graph, device):
            spin(1.0)
            return super().build(module, graph, device)

    model = two_level()
    result = auto(model, backend=SlowBuild(), time_budget=0.8)
    first, *rest = result.rows
    # Either the build is not started (it and the measurement after it do not fit), or it
    # started within the budget and ended past it and its candidate is not measured (no
    # measurement starts past the deadline): the depth keeps the untuned forward either way.
    assert first.status is DepthStatus.SKIPPED and first.error == TIME_BUDGET_ERROR
    assert result.depth is None and result.skipped()
    assert rest and all(
        r.error == TIME_BUDGET_ERROR and r.status is DepthStatus.SKIPPED for r in rest
    )
    assert TIME_BUDGET_ERROR in str(result)


def test_graphs_shared_between_depths_are_built_once() -> None:
    torch.manual_seed(0)
    leaf = Busy(1 * MS, 0.0)  # a leaf at depth 1: also part of the depth-2 cut
    inner = Busy(1 * MS, 0.0, [Busy(1 * MS, 0.0), Busy(1 * MS, 0.0)])
    model = Busy(0.0, 0.0, [leaf, inner]).eval()
    backend = Shortcut()
    result = auto(model, backend=backend)
    assert [r.modules for r in result.rows] == [1, 2, 3]
    # depth 0: root; depth 1: leaf + inner; depth 2: two new kids (leaf reused).
    assert len(backend.builds) == 5
    assert len(set(backend.builds)) == 5


def test_untuned_measured_again_and_minimum_taken() -> None:
    model = two_level()
    result = auto(model, max_depth=1)
    assert result.untuned_before is not None and result.untuned_after is not None
    assert result.untuned.median_s == min(
        result.untuned_before.median_s, result.untuned_after.median_s
    )
    assert "before" in str(result) and "after" in str(result)
    # Nothing measured: no second measurement.
    skipped = auto(two_level(), time_budget=0.0)
    assert skipped.untuned_after is None and skipped.depth is None


def test_weights_moved_by_a_backend_are_put_back() -> None:
    model = two_level()
    result = auto(model, backend=Shortcut(moves_weights=True), max_depth=1)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert result.depth is not None


def test_depth_zero_winner_leaves_object_untouched() -> None:
    model = two_level(root_tuned=2 * MS)
    result = auto(model, max_depth=1)
    assert result.depth == 0
    assert result.model is not model
    assert dispatcher_of(model) is None and wrapped_paths(model) == []
    assert dispatcher_of(result.model) is not None
    with torch.no_grad():
        x = torch.randn(2, 4)
        assert torch.allclose(result.model(x), model(x))


def test_model_is_never_left_half_wrapped_on_error() -> None:
    class Boom(Exception):
        pass

    class Exploding(tt.OneBackendStrategy):
        calls = 0

        def run(self, session):
            type(self).calls += 1
            if type(self).calls > 2:
                raise Boom()
            return super().run(session)

    model = two_level()
    with pytest.raises(Boom):
        tt.auto_tune(
            model,
            [torch.randn(2, 4)],
            strategy=Exploding(Shortcut()),
            measure_config=QUICK,
            verbose=False,
        )
    assert wrapped_paths(model) == []


def test_dry_run_and_argument_checks() -> None:
    backend = Delayed(0.0)
    result = tt.auto_tune(
        two_level(),
        [torch.randn(2, 4)],
        strategy=tt.OneBackendStrategy(backend),
        dry_run=True,
        verbose=False,
    )
    assert backend.builds == []
    assert [(r.depth, r.modules, r.graphs) for r in result.rows] == [(0, 1, 1), (1, 2, 2)]
    assert "Dry run" in str(result) and "dry run" in str(result).splitlines()[-1]
    with pytest.raises(tt.InvalidInputError):
        tt.auto_tune(two_level(), [torch.randn(2, 4)], min_depth=2, max_depth=1)
    with pytest.raises(TypeError):
        tt.auto_tune(two_level(), [torch.randn(2, 4)], 0)  # type: ignore[misc]


def test_plot_writes_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    result = auto(two_level(), max_depth=1)
    path = result.plot(tmp_path / "depths.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_leaves_the_matplotlib_backend_and_pyplot_alone(tmp_path) -> None:
    """A notebook's backend must survive ``result.plot``: no ``matplotlib.use``, no pyplot."""
    matplotlib = pytest.importorskip("matplotlib")
    import sys

    result = auto(two_level(), max_depth=1)
    original = matplotlib.get_backend()
    matplotlib.use("svg")  # a backend that is not Agg, as a notebook's inline one would be
    try:
        pyplot_before = "matplotlib.pyplot" in sys.modules
        result.plot(tmp_path / "depths.png")
        assert matplotlib.get_backend() == "svg"
        if not pyplot_before:
            assert "matplotlib.pyplot" not in sys.modules
        else:
            import matplotlib.pyplot as plt

            assert plt.get_fignums() == []
    finally:
        matplotlib.use(original)


def test_opt_in_backend_tolerance_applies_end_to_end() -> None:
    import dataclasses

    from tunetree.signature.compare import Tolerances

    @dataclasses.dataclass(frozen=True)
    class Noisy(Shortcut):
        """Adds 1e-2 to outputs: rejected by default tolerances, accepted by its own."""

        preserves_results = False

        def tolerances(self):
            return Tolerances.uniform(0.05, 0.05)

        def build(self, module, graph, device):
            runner = super().build(module, graph, device)
            inner = runner.fn
            runner.fn = lambda x: inner(x) + 1e-2
            return runner

    model = two_level(root_tuned=1 * MS)
    result = auto(model, backend=Noisy(), max_depth=0)
    assert result.rows[0].status is DepthStatus.MEASURED
    assert result.depth == 0


def test_depth_statuses_print_as_before() -> None:
    """The table shows each status as users knew it: the enum's text plus its reason."""
    result = auto(two_level(), backend=tt.backends.Eager(), max_depth=0)
    assert result.rows[0].status is DepthStatus.NO_CHANGE
    assert result.depth is None
    assert "no change: every graph kept eager" in str(result)
    twin = DepthRow(2, 3, 3, DepthStatus.SAME_CUT, same_as=1, error="Boom: x")
    assert twin.status_text == "same cut as depth 1: Boom: x"
    skipped = DepthRow(1, 2, 2, DepthStatus.SKIPPED, error=TIME_BUDGET_ERROR)
    assert skipped.status_text == f"skipped: {TIME_BUDGET_ERROR}"
    assert DepthRow(0, 1, 1).status_text == "not started"


def test_nothing_is_tuned_or_measured_when_no_candidate_but_eager_can_run() -> None:
    model = two_level()
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    strategy = tt.HighestThroughputStrategy([tt.backends.Tf32(), tt.backends.Eager()])
    result = tt.auto_tune(
        model, [torch.randn(2, 4)], strategy=strategy, verbose=False, measure_config=QUICK
    )
    assert len(calls) <= 2  # the inspection's run (and its untimed first call), nothing measured
    assert result.depth is None and result.model is model and result.untuned is None
    assert all(r.status is DepthStatus.SKIPPED for r in result.rows)
    assert "tf32: TF32 is a CUDA feature" in result.rows[0].error
    assert "no candidate but eager can run on cpu" in str(result)


def _reachable(root: object, kinds: tuple[type, ...]) -> int:
    """How many objects of ``kinds`` ``root`` reaches (Python modules and classes left out)."""
    seen: set[int] = set()
    found, frontier = 0, [root]
    while frontier:
        following = []
        for obj in frontier:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            found += isinstance(obj, kinds)
            if not isinstance(obj, type | types.ModuleType):
                following.extend(gc.get_referents(obj))
        frontier = following
    return found


@pytest.mark.parametrize("depth", [0, 1])
def test_a_served_model_holds_none_of_the_recordings(depth: int) -> None:
    # A serving process keeps result.model: the recorded calls, eager's outputs and the
    # probes (for a decode step, each a copy of the cache) stay with the result alone.
    model = two_level(root_tuned=10 * MS, kid_tuned=4.9 * MS)
    result = auto(model, max_depth=1)
    recordings = (Graph, Sample)
    assert _reachable(result, recordings) > 0
    served = result.use(depth)
    assert dispatcher_of(served) is not None or wrapped_paths(served)
    assert _reachable(served, recordings) == 0
