"""Inductor backend: results equal to eager on the four reference models, save/load by
recompiling, its own dynamo cache per runner, and configuration checks."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import tunetree as tt
from tunetree.backends import Inductor
from tunetree.errors import InvalidInputError

from .export_models import CPU, check_conformance, graph_of, mlp, run_all


@pytest.mark.parametrize(
    "model",
    [
        "mlp",
        pytest.param("encoder", marks=pytest.mark.slow),
        pytest.param("cnn", marks=pytest.mark.slow),
        pytest.param("bert", marks=pytest.mark.slow),
    ],
)
def test_matches_eager_and_round_trips(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_conformance(Inductor(), model, tmp_path, monkeypatch)


def test_many_runners_each_compile() -> None:
    """More runners than dynamo's recompile limit (8) must all be compiled, none silently eager."""
    import torch._dynamo.utils as dynamo_utils

    dynamo_utils.counters.clear()
    for _ in range(10):
        module, samples = mlp()
        run_all(Inductor().build(module, graph_of(module, samples), CPU), graph_of(module, samples))
    assert dynamo_utils.counters["stats"]["unique_graphs"] >= 10


def test_mode_and_options_together_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="either mode or options"):
        Inductor(mode="max-autotune", options={"freezing": True})
    assert Inductor(options={"freezing": True}).options == (("freezing", True),)


def test_reduce_overhead_needs_cuda() -> None:
    assert Inductor(mode="reduce-overhead").unavailable_reason(torch.device("cpu"))
    assert Inductor().unavailable_reason(CPU) is None


@pytest.mark.slow
def test_ranged_graph_compiles_once_for_the_whole_range(tmp_path: Path) -> None:
    """Marked dims: recorded sizes, the range's ends (1 too) and a prime in between all run
    on the first compiled graph."""
    from tunetree.backends.ranges import resize_sample
    from tunetree.signature.compare import compare_all
    from tunetree.signature.graph import Sample
    from tunetree.signature.shapes import group_graphs, probe_sizes

    module, _ = mlp(width=16, depth=2)
    samples = [Sample((torch.randn(b, 16),)) for b in (3, 8, 1)]
    with torch.no_grad():
        (graph,) = group_graphs([(s, module(*s.args)) for s in samples]).values()
    probes = [resize_sample(samples[1], graph.key, sizes) for sizes in probe_sizes(graph.key)]
    for runner in (
        Inductor().build(module, graph, CPU),
        Inductor().load(module, graph.key, tmp_path, {}, CPU),
    ):
        with torch.no_grad():
            want = [module(*s.args) for s in [*samples, *probes]]
            got = [runner(*s.args) for s in [*samples, *probes]]
        assert compare_all(want, got).ok
        assert runner.compiles == 1


class _SizeBranch(torch.nn.Module):
    """Chooses its code by batch size (as some conv kernels do): same results either way."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= 16:
            return torch.clamp(x, min=0.0) * 2
        return torch.relu(x) * 2


@pytest.mark.slow
def test_a_graph_guarding_a_narrower_range_still_serves_the_whole_range() -> None:
    """A graph that guards ``16 <= batch`` does not serve the range's end (64): the runner
    then compiles with soft dynamic axes and recompiles across the guard instead of failing."""
    from tunetree.signature.compare import compare_all
    from tunetree.signature.graph import Sample
    from tunetree.signature.shapes import group_graphs

    module = _SizeBranch().eval()
    samples = [Sample((torch.randn(b, 8),)) for b in (1, 64)]
    with torch.no_grad():
        (graph,) = group_graphs([(s, module(*s.args)) for s in samples]).values()
    runner = Inductor().build(module, graph, CPU)
    calls = [torch.randn(b, 8) for b in (1, 2, 3, 5, 7, 11, 15, 16, 17, 31, 33, 63, 64)]
    guard_errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = guard_errors.append  # type: ignore[method-assign]
    guards = logging.getLogger("torch._guards")  # filters on it run before its handlers
    guards.addHandler(handler)
    try:
        with torch.no_grad():
            assert compare_all([module(x) for x in calls], [runner(x) for x in calls]).ok
    finally:
        guards.removeHandler(handler)
    assert guard_errors == []  # the refusal it recovers from is not logged as an error
    # a few graphs (each side of the guard; size 1 may be its own), not one per size (13)
    assert 2 <= runner.compiles <= 4


@pytest.mark.slow
def test_a_guard_found_at_the_range_low_end_is_served_compiled_too() -> None:
    """Compiled first at a large batch, a graph guards ``16 <= batch`` (a CNN's convolution
    kernel choice did on the EPYC); the range check runs batch 2 as well as the ends, so
    batches 2..15 are compiled for instead of running the original forward."""
    from tunetree.signature.compare import compare_all
    from tunetree.signature.graph import Sample
    from tunetree.signature.shapes import group_graphs

    module = _SizeBranch().eval()
    samples = [Sample((torch.randn(b, 8),)) for b in (1, 64)]
    with torch.no_grad():
        (graph,) = group_graphs([(s, module(*s.args)) for s in samples]).values()
    runner = Inductor().build(module, graph, CPU)
    calls = [torch.randn(b, 8) for b in (40, 1, 2, 9, 15, 16, 64)]
    with torch.no_grad():
        assert compare_all([module(x) for x in calls], [runner(x) for x in calls]).ok
    assert runner.eager_calls == 0
    assert runner.soft_axes is not None  # the guard was found while building


@pytest.mark.slow
def test_a_ranged_runner_never_compiles_while_serving() -> None:
    """Issue 22: a ranged runner served unseen calls by compiling each (4 s per shape on BERT)
    until dynamo's limit, then silently ran eager. Now grad mode does not matter, and a call its
    graph does not accept (here another memory layout) runs the original forward at once."""
    from tunetree.signature.compare import compare_all
    from tunetree.signature.graph import Sample
    from tunetree.signature.shapes import group_graphs

    module, _ = mlp(width=16, depth=2)
    samples = [Sample((torch.randn(b, 16),)) for b in (3, 8, 1)]
    with torch.no_grad():
        (graph,) = group_graphs([(s, module(*s.args)) for s in samples]).values()
    runner = Inductor().build(module, graph, CPU)
    with torch.no_grad():
        runner(torch.randn(4, 16))
    assert runner.compiles == 1
    calls = [torch.randn(5, 16), torch.randn(16, 6).t(), torch.randn(7, 16)]
    got = [runner(x) for x in calls]  # grad mode on, as a user may call
    with torch.no_grad():
        assert compare_all([module(x) for x in calls], got).ok
    assert runner.compiles == 1
    assert runner.eager_calls <= 1  # at most the transposed input, never a compile


class _OneBranch(torch.nn.Module):
    """Takes another path at batch 1 (same results): a graph compiled at batch >= 2 guards
    ``batch != 1``, as BERT's graph once did."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return torch.relu(x) * 2
        return torch.clamp(x, min=0.0) * 2


@pytest.mark.slow
def test_a_ranged_runner_serves_batch_one_compiled_where_its_graph_guards_it_out() -> None:
    """Issue 22: a graph compiled at batch >= 2 that guards batch 1 out sent every batch-1 call
    to the original forward (1240 calls while tuning BERT). A second graph compiled for batch 1
    while building serves them."""
    from tunetree.signature.compare import compare_all
    from tunetree.signature.graph import Sample
    from tunetree.signature.shapes import group_graphs

    module = _OneBranch().eval()
    samples = [Sample((torch.randn(b, 8),)) for b in (3, 1, 6)]
    with torch.no_grad():
        (graph,) = group_graphs([(s, module(*s.args)) for s in samples]).values()
    runner = Inductor().build(module, graph, CPU)
    calls = [torch.randn(b, 8) for b in (4, 1, 2, 5, 1)]
    with torch.no_grad():
        assert compare_all([module(x) for x in calls], [runner(x) for x in calls]).ok
    assert runner.compiles == 2  # the range's graph, and batch 1's
    assert runner.eager_calls == 0
    assert runner.soft_axes is None  # no recompiles across a guard while serving


@pytest.mark.slow
def test_bert_batch_one_calls_run_compiled_after_tuning() -> None:
    """BERT tuned on batches 1..4 serves unseen batch-1 calls compiled, with no compile while
    serving, whether its range's graph serves batch 1 itself (torch 2.13 with Inductor's
    on-disk cache warm) or a second graph does (cache empty)."""
    transformers = pytest.importorskip("transformers")
    from tunetree.signature.compare import compare_all

    cfg = transformers.BertConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=128,
        vocab_size=100,
    )
    model = transformers.BertModel(cfg).eval()

    def call(b: int, t: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 100, (b, t))
        return {"input_ids": ids, "attention_mask": torch.ones(b, t, dtype=torch.long)}

    data = [call(1, 16), call(4, 32), call(2, 24), call(3, 20)]
    result = tt.tune(
        model, data, strategy=tt.OneBackendStrategy(Inductor()), verbose=False, cache=False
    )
    (entry,) = result.plan.entries
    runner = entry.runner
    compiles, before = runner.compiles, runner.eager_calls
    assert 1 <= compiles <= 2
    calls = [call(1, 18), call(1, 30), call(3, 17)]
    with torch.no_grad():
        got = [result.model(**c) for c in calls]
        assert compare_all([model(**c) for c in calls], got).ok
    assert runner.eager_calls == before
    assert runner.compiles == compiles


@pytest.mark.slow
def test_a_ranged_runner_compiles_again_after_a_dynamo_reset() -> None:
    """A user's ``torch._dynamo.reset()`` emptied the runner's cache, and every later call ran
    the original forward. It now compiles for its range once more."""
    from tunetree.signature.graph import Sample
    from tunetree.signature.shapes import group_graphs

    module, _ = mlp(width=16, depth=2)
    samples = [Sample((torch.randn(b, 16),)) for b in (3, 8, 2)]
    with torch.no_grad():
        (graph,) = group_graphs([(s, module(*s.args)) for s in samples]).values()
    runner = Inductor().build(module, graph, CPU)
    with torch.no_grad():
        runner(torch.randn(4, 16))
        runner(torch.randn(4, 16))  # a layout served compiled before skips the stance
        assert runner.compiles >= 1 and runner.eager_calls == 0
        torch._dynamo.reset()
        got = runner(torch.randn(5, 16))
        assert got.shape == (5, 16)
        assert runner.compiles >= 1 and runner.eager_calls == 0
