"""tt.jit: eager from the first call, tuned in the background, warm in the next process."""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
from tunetree.cache.cli import main as cache_cli
from tunetree.runtime.wrap import dispatcher_of

from . import fakes

ROOT = Path(__file__).resolve().parents[2]
tuner_module = importlib.import_module("tunetree.live.tuner")


THREAD = {"tuner_process": False}
"""These tests follow the tune in this process (builds, priorities, failures patched in); the
child process that runs a cold tune by default is tested in ``test_child``."""


def limits(**changes: Any) -> Any:
    from tunetree.live import RecordLimits

    return RecordLimits(**{"tune_after": 4, **changes})


def serve(served: Any, rows: list[int]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [served(x) for x in fakes.calls(rows)]


# Built once at import, before any tuner thread runs (Dynamo, where a backend traces, still puts
# torch's global random state back after its trace, so a model seeded meanwhile may differ).
_REFERENCE = fakes.model()


def eager(rows: list[int]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [_REFERENCE(x) for x in fakes.calls(rows)]


def same(outs: list[torch.Tensor], expected: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(outs, expected, strict=True))


def second_process(config: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.live.app", json.dumps(config)],
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _fresh_fakes():
    fakes.BUILDS.clear()
    fakes.RUNS.clear()
    yield
    tuner_module._wait_at_exit()  # this test's tuner threads end here, not in the next test


def test_live_calls_tune_here_and_a_second_process_starts_tuned_with_no_build(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    model = fakes.model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    served = tt.jit(model, cache=cache, limits=limits(), **fakes.options(), **THREAD)
    rows = [1, 2, 3, 8]
    assert same(serve(served, rows), eager(rows))
    assert served.wait(timeout=120), served.reason
    assert served.status == "tuned" and "depth 0" in served.reason
    assert fakes.BUILDS == ["Slow"] and served.builds >= 1
    assert served.result is not None and served.result.depth == 0
    fakes.RUNS.clear()
    outs = serve(served, [4, 6])  # unseen sizes inside the inferred range 1..8: the runner
    assert fakes.runs_here() == 2
    assert same(outs, eager([4, 6]))
    # The user's model was never wrapped or changed.
    assert all(dispatcher_of(m) is None for m in model.modules())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert (cache / "jit").is_dir() and len(list((cache / "jit").iterdir())) == 1

    later = second_process({"cache": str(cache)})
    assert later["tuned"] and later["builds"] == [] and later["served_builds"] == 0
    assert later["first_call_tuned"] and later["equal"]
    assert "warm start, local cache" in later["reason"]


def test_a_plan_whose_race_the_budget_cut_short_starts_a_second_process_with_no_build(
    tmp_path: Path,
) -> None:
    # Glacial is never built under a time budget: the race of the graph the plan serves is
    # cut short, as a large model's heaviest graph is in a budgeted tune.
    served = tt.jit(
        fakes.model(), cache=tmp_path, limits=limits(), **fakes.budget_cut_options(), **THREAD
    )
    serve(served, [1, 2, 3, 8])
    assert served.wait(timeout=120), served.reason
    assert fakes.BUILDS == ["Slow"]  # Fast only
    later = second_process({"cache": str(tmp_path), "budget_cut": True})
    assert later["tuned"] and later["builds"] == [] and later["served_builds"] == 0
    assert later["first_call_tuned"] and later["equal"]
    # The recorded plan is loaded and checked against eager, not measured again.
    assert later["depth_status"] == ["RECORDED"]
    assert not [p for p in later["phases"] if "measurement" in p], later["phases"]


@pytest.mark.parametrize("budget_cut", [False, True])
def test_a_second_host_starts_tuned_from_the_remote_with_its_own_empty_cache(
    tmp_path: Path, remote: str, budget_cut: bool
) -> None:
    served = tt.jit(
        fakes.model(),
        cache=tt.TuningCache(tmp_path / "host-a", remote=remote),
        limits=limits(),
        **(fakes.budget_cut_options() if budget_cut else fakes.options()),
        **THREAD,
    )
    serve(served, [1, 2, 3, 5, 8])
    assert served.wait(timeout=120), served.reason
    assert fakes.BUILDS == ["Slow"]
    later = second_process(
        {"cache": str(tmp_path / "host-b"), "remote": remote, "budget_cut": budget_cut}
    )
    assert later["tuned"] and later["builds"] == [] and later["first_call_tuned"]
    assert later["depth_status"] == ["RECORDED"]
    assert later["equal"] and "warm start, remote cache" in later["reason"]
    assert (tmp_path / "host-b" / "jit").is_dir()


def test_four_threads_calling_during_the_swap_get_eagers_numbers(tmp_path: Path) -> None:
    served = tt.jit(
        fakes.model(), cache=tmp_path, limits=limits(), tuner_nice=0, **fakes.options(), **THREAD
    )
    rows = [1, 2, 3, 4, 5, 6, 7, 8]
    expected = eager(rows)
    inputs = fakes.calls(rows)
    wrong: list[str] = []
    statuses: set[str] = set()
    stop = threading.Event()

    def caller(offset: int) -> None:
        i = offset
        with torch.no_grad():
            while not stop.is_set():
                statuses.add(served.status)
                out = served(inputs[i % len(rows)])
                if not torch.equal(out, expected[i % len(rows)]):
                    wrong.append(f"call {i}")
                i += 1
                stop.wait(0.002)  # a service between requests (the GIL for the tuner too)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        assert served.wait(timeout=120), served.reason
        fakes.RUNS.clear()
        while len(fakes.RUNS) < 50:  # the threads go on, now on the tuned runner
            stop.wait(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert wrong == []
    assert {"recording", "tuned"} <= statuses


def test_training_mode_serves_eager_with_a_reason_and_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = fakes.model().train()
    served = tt.jit(model, cache=tmp_path, limits=limits(), **fakes.options(), **THREAD)
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        outs = serve(served, [1, 2, 3, 4, 5, 6])
    assert served.status == "untuned" and served.tunes == 0
    assert served.reason == "the model is in training mode (tuned runners serve eval mode only)"
    assert not served.wait(timeout=5) and served.result is None
    assert [r.getMessage() for r in caplog.records].count(
        "tt.jit: serving the model's own forward: " + served.reason
    ) == 1
    model.eval()
    assert same(outs, eager([1, 2, 3, 4, 5, 6]))
    # its own count: another test's tuner thread may still be finishing a build of its own
    assert served.builds == 0


def test_a_model_put_in_training_mode_after_the_swap_runs_its_own_forward(
    tmp_path: Path,
) -> None:
    model = fakes.model()
    served = tt.jit(model, cache=tmp_path, limits=limits(), **fakes.options(), **THREAD)
    serve(served, [1, 2, 3, 4])
    assert served.wait(timeout=120)
    model.train()  # the tuned copy is not: its runners must not serve training calls
    fakes.RUNS.clear()
    serve(served, [2, 3])
    assert fakes.runs_here() == 0 and served.status == "untuned"
    assert "training mode" in served.reason


def test_a_tuning_failure_serves_eager_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the backend crashed")

    monkeypatch.setattr(tuner_module, "auto_tune", broken)
    served = tt.jit(fakes.model(), cache=tmp_path, limits=limits(), **fakes.options(), **THREAD)
    outs = serve(served, [1, 2, 3, 4])
    assert not served.wait(timeout=60)
    assert served.status == "untuned"
    assert served.reason == "tuning failed: RuntimeError: the backend crashed"
    more = serve(served, [5, 6])
    assert same(outs, eager([1, 2, 3, 4]))
    assert same(more, eager([5, 6]))


class Configured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, settings: object) -> torch.Tensor:
        return self.lin(x)


def test_a_call_with_an_object_it_cannot_key_serves_eager_with_a_reason(tmp_path: Path) -> None:
    served = tt.jit(
        Configured().eval(), cache=tmp_path, limits=limits(), **fakes.options(), **THREAD
    )
    x = torch.randn(2, 8)
    with torch.no_grad():
        out = served(x, object())
    assert torch.equal(out, served.model(x, None))
    assert served.status == "untuned" and "cannot be keyed" in served.reason


def test_calls_outside_the_tuned_range_retune_wider(tmp_path: Path) -> None:
    served = tt.jit(
        fakes.model(),
        cache=tmp_path,
        limits=limits(retune_min_calls=3, retune_share=0.5),
        **fakes.options(),
        **THREAD,
    )
    serve(served, [1, 2, 3, 4])
    assert served.wait(timeout=120) and served.tunes == 1
    assert "1..4" in str(served.result.plan.entries[0].key)  # type: ignore[union-attr]
    outside = [12, 16, 20]
    assert same(serve(served, outside), eager(outside))
    assert served.wait(timeout=120), served.reason
    assert served.tunes == 2 and "outside the tuned ranges" in served.reason
    assert "1..20" in str(served.result.plan.entries[0].key)  # type: ignore[union-attr]
    fakes.RUNS.clear()
    serve(served, [14])
    assert fakes.runs_here() == 1


def test_wait_covers_a_retune_started_while_the_calls_were_being_kept(tmp_path: Path) -> None:
    served = tt.jit(fakes.model(), cache=tmp_path, limits=limits(), **fakes.options(), **THREAD)
    keep, entered, release = served.persist, threading.Event(), threading.Event()

    def slow_keep(samples: Any, depth: Any, plan: Any) -> None:
        entered.set()
        release.wait(30)
        keep(samples, depth, plan)

    served.persist = slow_keep
    serve(served, [1, 2, 3, 4])
    assert entered.wait(60)  # swapped in; the calls are being kept
    assert served.status == "tuned" and served.tunes == 1
    served.tune_now()  # a re-tune, queued behind the keeping
    release.set()
    assert served.wait(timeout=120)
    assert served.tunes == 2  # wait() returned after the re-tune, not when the keeping ended


def test_undo_serves_the_plain_model_and_tune_now_starts_at_once(tmp_path: Path) -> None:
    model = fakes.model()
    served = tt.jit(model, cache=False, **fakes.options(), **THREAD)
    serve(served, [2])
    assert served.status == "recording"  # one call: below the default threshold
    served.tune_now()
    assert served.wait(timeout=120) and served.builds >= 1
    assert served.undo() is model
    assert served.status == "untuned" and served.result is None
    fakes.RUNS.clear()
    serve(served, [2, 2])
    assert fakes.runs_here() == 0
    assert not (Path(os.environ["TUNETREE_CACHE_DIR"]) / "jit").exists()  # cache=False


def test_the_jits_entries_show_in_cache_ls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    served = tt.jit(fakes.model(), cache=tmp_path, limits=limits(), **fakes.options(), **THREAD)
    serve(served, [1, 2, 3, 4])
    assert served.wait(timeout=120)
    capsys.readouterr()
    assert cache_cli(["--dir", str(tmp_path), "ls", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(i["path"], i["winner"], i["problem"]) for i in listed] == [
        ("", "test-live-fast", None)
    ]


def test_unknown_options_are_refused() -> None:
    with pytest.raises(tt.InvalidInputError, match="datset"):
        tt.jit(fakes.model(), datset=[1])
    with pytest.raises(tt.InvalidInputError, match="verbose"):
        tt.jit(fakes.model(), verbose=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_builds_run_at_lower_priority_and_the_served_plan_is_loaded_at_the_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    priorities: list[int] = []

    def watch(name: str) -> None:
        real = getattr(tuner_module, name)

        def watched(*args: Any, **kwargs: Any) -> Any:
            priorities.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            return real(*args, **kwargs)

        monkeypatch.setattr(tuner_module, name, watched)

    watch("auto_tune")  # the build
    watch("load_recorded")  # the reload of its plan from the cache
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    served = tt.jit(
        fakes.model(), cache=tmp_path, limits=limits(), tuner_nice=5, **fakes.options(), **THREAD
    )
    serve(served, [1, 2, 3, 4])
    assert served.wait(timeout=120)
    assert priorities == [min(19, mine + 5), mine]  # the build, then the reload (no build)
    assert fakes.BUILDS == ["Slow"]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


def test_share_calls_false_keeps_the_traffic_out_of_the_cache(tmp_path: Path) -> None:
    served = tt.jit(
        fakes.model(),
        cache=tmp_path,
        limits=limits(),
        share_calls=False,
        **fakes.options(),
        **THREAD,
    )
    serve(served, [1, 2, 3, 4])
    assert served.wait(timeout=120)
    assert not (tmp_path / "jit").exists()
    assert any((tmp_path / "entries").iterdir())  # the plan itself is cached as usual


def test_a_failed_retune_keeps_the_plan_that_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = tt.jit(
        fakes.model(),
        cache=tmp_path,
        limits=limits(retune_min_calls=2, retune_share=0.5),
        **fakes.options(),
        **THREAD,
    )
    serve(served, [1, 2, 3, 4])
    assert served.wait(timeout=120)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(tuner_module, "auto_tune", broken)
    serve(served, [12, 16])  # outside 1..4: a re-tune starts, and fails
    assert served.wait(timeout=60) and served.status == "tuned"
    assert (
        served.reason
        == "still serving the earlier plan (tuning failed: RuntimeError: out of memory)"
    )
    fakes.RUNS.clear()
    assert same(serve(served, [3, 20, 24]), eager([3, 20, 24]))
    assert fakes.runs_here() == 1 and served.tunes == 2  # no re-tune loop on later outside calls


def _settle_background() -> None:
    """Wait for the JIT's threads (the warm lookup) to end, as interpreter exit does."""
    tuner_module._wait_at_exit()


def test_calls_recorded_for_another_model_planted_under_this_ones_name_are_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tunetree.cache.sealing import seal, unseal
    from tunetree.live.store import MAGIC, calls_key

    served = tt.jit(fakes.model(), cache=tmp_path, limits=limits(), **fakes.options(), **THREAD)
    serve(served, [1, 2, 3, 4])
    assert served.wait(timeout=120), served.reason
    _settle_background()
    (theirs,) = (tmp_path / "jit").iterdir()
    other = nn.Sequential(nn.Linear(8, 8)).eval()
    ours = calls_key(other, None, torch.device("cpu"))
    # A well-formed record, its envelope re-made for this model's key (unsigned, as a cache
    # without a key writes them): only what the record itself says shows whose calls these are.
    body, _ = unseal(theirs.read_bytes(), theirs.name, None, MAGIC)
    (tmp_path / "jit" / ours).write_bytes(seal(ours, body, None, MAGIC))
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        planted = tt.jit(other, cache=tmp_path, limits=limits(), **fakes.options(), **THREAD)
        _settle_background()
    assert planted.status == "recording" and planted.tunes == 0, planted.reason
    assert "none recorded in the cache" in planted.reason
    assert any("another model or key" in r.getMessage() for r in caplog.records)


class Rendezvous:
    """Where a tuner thread waits for the test; shared by every copy of the model."""

    def __init__(self, pause_at: int) -> None:
        self.pause_at = pause_at
        self.tuner_calls = 0
        self.inside, self.drawn = threading.Event(), threading.Event()

    def __deepcopy__(self, memo: dict[int, Any]) -> Rendezvous:
        return self


class Pausing(fakes.Slow):
    """Slow's forward; its ``pause_at``-th call in a tuner thread waits for the test to draw."""

    def __init__(self, pause_at: int) -> None:
        super().__init__()
        self.meet = Rendezvous(pause_at)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        meet = self.meet
        if threading.current_thread().name.startswith(tuner_module.THREAD_NAME):
            meet.tuner_calls += 1
            if meet.tuner_calls == meet.pause_at:
                meet.inside.set()
                meet.drawn.wait(timeout=120)
        return super().forward(x)


def test_a_thread_drawing_from_the_global_rng_during_a_background_tune_keeps_its_sequence(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = Pausing(pause_at=2).eval()  # the first tuner call checks for draws; then auto_tune's
    served = tt.jit(
        model, cache=tmp_path, limits=limits(), tuner_nice=0, **fakes.options(), **THREAD
    )
    torch.manual_seed(1234)
    serve(served, [1, 2, 3, 4])  # draws nothing; the tune starts in the background
    assert model.meet.inside.wait(timeout=120)  # the tuner is inside auto_tune, paused
    first = torch.randn(6)  # this thread draws while the tune runs
    model.meet.drawn.set()
    assert served.wait(timeout=120), served.reason
    second = torch.randn(6)
    torch.manual_seed(1234)
    assert torch.equal(first, torch.randn(6))
    assert torch.equal(second, torch.randn(6))  # not rewound by the tune's end


class Noisy(fakes.Slow):
    """Adds noise drawn from the global generator, even in eval mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + 0.01 * torch.randn(x.shape)


def test_a_forward_drawing_from_the_global_rng_is_left_untuned_and_tuning_draws_nothing(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    served = tt.jit(Noisy().eval(), cache=tmp_path, limits=limits(), **fakes.options(), **THREAD)
    torch.manual_seed(7)
    serve(served, [1, 2, 3, 4])  # four eager calls here, four draws
    assert not served.wait(timeout=120)
    assert "global random generator (aten.randn" in served.reason, served.reason
    after = torch.get_rng_state()
    torch.manual_seed(7)
    for rows in (1, 2, 3, 4):
        torch.randn(rows, 8)  # what the four eager calls drew
    assert torch.equal(after, torch.get_rng_state())  # the tuner drew nothing
    assert fakes.BUILDS == []


def test_a_warm_start_imports_no_compiler_it_does_not_use(tmp_path: Path) -> None:
    """The cached plan (the fake backend) needs no Dynamo: inspection's dispatch modes and the
    random-draw check must not import it (seconds of a warm start)."""
    served = tt.jit(fakes.model(), cache=tmp_path, limits=limits(), **fakes.options(), **THREAD)
    serve(served, [1, 2, 3, 8])
    assert served.wait(timeout=120), served.reason
    _settle_background()
    later = second_process({"cache": str(tmp_path), "modules": ["torch._dynamo"]})
    assert later["tuned"] and later["builds"] == [], later
    assert later["modules"] == {"torch._dynamo": False}


_IMPORTS_AT_JIT = """
import json, sys
import tunetree as tt
from tests.live import fakes
strategy = {strategy}
tt.jit(fakes.model(), cache=False, strategy=strategy, **{{"tuner_process": False}})
print(json.dumps({{name: name in sys.modules for name in ("onnx", "ml_dtypes")}}))
"""


@pytest.mark.parametrize("backend", ["OnnxRuntime", "fake"])
def test_jit_imports_what_loading_its_backends_runners_needs_before_serving(
    backend: str,
) -> None:
    """``onnx`` imports ``ml_dtypes``, whose extension holds the GIL about 1 s as it loads:
    imported first by a plan's load beside serving threads (a warm start, a child's plan), it
    stalled every call. ``tt.jit`` imports it before it returns, for a strategy that needs it."""
    strategy = (
        "tt.MinLatencyStrategy([tt.backends.OnnxRuntime(), tt.backends.Eager()])"
        if backend == "OnnxRuntime"
        else "fakes.options()['strategy']"
    )
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS_AT_JIT.format(strategy=strategy)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    wanted = backend == "OnnxRuntime"
    assert imported == {"onnx": wanted, "ml_dtypes": wanted}
