"""auto_tune reuses the depth decision an earlier auto_tune recorded in the tuning cache (issue 32).

Every decision here rests on timings the fakes declare, on the virtual clock (tests/clock.py):
untuned 20 ms, depth 0 (the root on a runner) 15 ms, depth 1 (each kid on a runner) 6 ms.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import logging
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import tunetree as tt
from tests.fakes import Busy, spin
from tests.search.patching import patch_side_by_side
from tunetree.backends.base import Backend, Runner
from tunetree.cache.decisions import (
    MAGIC,
    DecisionFault,
    MalformedDecisionError,
    decode_decision,
    encode_decision,
)
from tunetree.cache.sealing import KEY_ENV, seal
from tunetree.search.auto_result import DepthStatus
from tunetree.signature.graph import Graph, GraphKey

pytestmark = pytest.mark.usefixtures("virtual_time")

MS = 1e-3
QUICK = tt.MeasureConfig(warmup_s=0.02, block_s=0.02, trials=7, max_s_per_candidate=0.4)
BUILDS: list[str] = []
SLOWER = {"by_s": 0.0}
"""Extra seconds every :class:`Quick` runner call spins (a host where the plan is slower)."""

auto_module = importlib.import_module("tunetree.search.auto")


class QuickRunner(Runner):
    """Busy.fast plus the module's ``tuned_delay_s``; saves a small artifact."""

    def __init__(self, backend: Backend, module: Busy) -> None:
        super().__init__(backend)
        self.module = module

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        spin(self.module.tuned_delay_s + SLOWER["by_s"])
        return self.module.fast(x)

    def save(self, directory: Path) -> dict[str, Any]:
        (directory / "note.txt").write_text("quick\n")
        return {"note": "note.txt"}


@dataclasses.dataclass(frozen=True)
class Quick(Backend):
    """A backend the cache can store and serve, of known latency (see :class:`Busy`)."""

    kind: ClassVar[str] = "test-quick"
    level: int = 1

    def build(self, module: nn.Module, graph: Graph, device: torch.device) -> Runner:
        assert isinstance(module, Busy)
        BUILDS.append(type(module).__name__)
        return QuickRunner(self, module)

    def load(
        self,
        module: nn.Module,
        key: GraphKey,
        directory: Path,
        saved: dict[str, Any],
        device: torch.device,
    ) -> Runner:
        assert isinstance(module, Busy)
        assert (directory / saved["note"]).read_text() == "quick\n"
        return QuickRunner(self, module)


def model() -> Busy:
    torch.manual_seed(0)
    return Busy(0.0, 15 * MS, [Busy(10 * MS, 3 * MS) for _ in range(2)]).eval()


def data(rows: int = 2) -> list[torch.Tensor]:
    return [torch.randn(rows, 4, generator=torch.Generator().manual_seed(1))]


def strategy(level: int = 1) -> tt.MinLatencyStrategy:
    return tt.MinLatencyStrategy([Quick(level), tt.backends.Eager()])


@pytest.fixture(autouse=True)
def _fresh_fakes():
    BUILDS.clear()
    SLOWER["by_s"] = 0.0
    yield
    SLOWER["by_s"] = 0.0


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The names of the models each end-to-end measurement timed, in order."""
    calls: list[list[str]] = []
    real = auto_module.side_by_side

    def counting(models, *args, **kwargs):
        calls.append(sorted(models))
        return real(models, *args, **kwargs)

    patch_side_by_side(monkeypatch, counting)
    return calls


def tune(cache: Any, m: nn.Module | None = None, **kw: Any) -> tt.AutoTuneResult:
    kw.setdefault("strategy", strategy())
    return tt.auto_tune(
        m if m is not None else model(),
        kw.pop("data", None) or data(),
        cache=cache,
        measure_config=QUICK,
        max_depth=1,
        verbose=False,
        **kw,
    )


def statuses(result: tt.AutoTuneResult) -> list[DepthStatus]:
    return [r.status for r in result.rows]


def decision_files(directory: Path) -> list[Path]:
    return sorted((directory / "decisions").glob("[0-9a-f]*"))


def full_search(result: tt.AutoTuneResult) -> bool:
    """Every depth was tuned and judged here (no recorded decision was reused)."""
    reused = (DepthStatus.REUSED, DepthStatus.NOT_MEASURED)
    return result.decision == "" and not any(r.status in reused for r in result.rows)


def sealed(body: dict[str, Any], key: str) -> bytes:
    """A decision file holding ``body`` as it is, checksummed and sealed like a real one."""
    text = json.dumps(body).encode()
    return seal(key, hashlib.sha256(text).hexdigest().encode() + b"\n" + text, None, MAGIC)


def test_a_second_run_reuses_the_decision_and_measures_only_the_chosen_depth(
    tmp_path: Path, measured: list[list[str]]
) -> None:
    first = tune(tt.TuningCache(tmp_path))
    assert first.depth == 1 and full_search(first) and BUILDS
    assert len(decision_files(tmp_path)) == 1
    final = ["selected", "untuned", "whole model"]  # the side by side with depth 0's backend
    assert measured == [["untuned"], ["greedy", "untuned"], ["greedy", "untuned"], final]
    BUILDS.clear()
    measured.clear()
    m = model()
    second = tune(tt.TuningCache(tmp_path), m)  # a new cache object: read from disk
    assert BUILDS == []
    assert measured == [["reused", "untuned"]]  # one measurement: the recorded depth
    assert second.depth == 1 and second.model is m
    assert statuses(second) == [DepthStatus.NOT_MEASURED, DepthStatus.REUSED]
    assert second.rows[0].timing is None and second.rows[0].speedup is None
    assert second.speedup == pytest.approx(20 / 6, rel=0.05)  # measured here
    text = str(second)
    assert "depth chosen on a host of the same kind, re-checked here" in text
    assert "not measured: depth chosen on a host of the same kind (1.3" in text
    assert "reuse_decision=False" in text
    phases = {p.detail or p.phase for p in second.breakdown.phases if p.phase.startswith("end")}
    assert phases == {"end-to-end check", "depth 1"}  # one check, one measurement
    x = data()[0]
    with torch.no_grad():
        assert torch.allclose(second.model(x), model()(x))  # eager's outputs
    second.undo()
    measured.clear()
    third = tune(tt.TuningCache(tmp_path), reuse_decision=False)
    assert full_search(third) and len(measured) == 4  # untuned, two depths, the final


def test_a_changed_model_dataset_or_strategy_misses(tmp_path: Path) -> None:
    tune(tt.TuningCache(tmp_path))
    wider = Busy(0.0, 15 * MS, [Busy(10 * MS, 3 * MS) for _ in range(3)]).eval()
    changes: list[dict[str, Any]] = [
        {"m": wider},
        {"data": data(rows=3)},
        {"strategy": strategy(level=2)},
        {"tie_tolerance": 0.05},
    ]
    for change in changes:
        cache = tt.TuningCache(tmp_path)
        assert full_search(tune(cache, **change)), change
        assert cache.decisions.stats.found == 0, change  # another key: no record read
    assert len(decision_files(tmp_path)) == 5


def test_the_key_covers_what_the_decision_depends_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from tunetree.cache import keys
    from tunetree.cache.decisions import decision_identity

    def key(m: nn.Module | None = None, rows: int = 2, **kw: Any) -> str:
        m = m if m is not None else model()
        info = tt.inspect(m, data(rows))
        args: dict[str, Any] = {
            "strategy": strategy(),
            "tolerances": None,
            "accuracy": None,
            "depths": [0, 1],
            "tie_tolerance": 0.02,
            "measure_config": QUICK,
            "call": None,
        }
        return decision_identity(m, info, **{**args, **kw}).key

    base = key()
    assert key() == base  # stable
    other_code = Busy(0.0, 15 * MS, [Busy(10 * MS, 3 * MS), Busy(10 * MS, 3 * MS, broken=True)])
    changed = [
        key(other_code.eval()),
        key(rows=3),
        key(strategy=strategy(level=2)),
        key(tolerances=tt.Tolerances.uniform(1e-3, 1e-3)),
        key(accuracy=tt.AccuracyBudget(max_error=1e-2)),
        key(depths=[0]),
        key(tie_tolerance=0.05),
        key(measure_config=tt.MeasureConfig.quick()),
        key(call=lambda m, x: m(x)),
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # depths ranked with other threads: another decision
    try:
        changed.append(key())
    finally:
        torch.set_num_threads(threads)
    real = keys.environment

    def other_cpu(device, kinds):
        env = real(device, kinds)
        return keys.Environment({**env.hard, "cpu.model": "another CPU"}, env.soft)

    monkeypatch.setattr(keys, "environment", other_cpu)
    changed.append(key())
    assert base not in changed and len(set(changed)) == len(changed)


def test_a_recorded_plan_whose_graphs_no_longer_hit_falls_back_to_the_full_search(
    tmp_path: Path,
) -> None:
    tune(tt.TuningCache(tmp_path))
    for entry in (tmp_path / "entries").iterdir():
        (entry / "manifest.json").unlink()  # every entry unusable; the decision stays
    BUILDS.clear()
    result = tune(tt.TuningCache(tmp_path))
    assert full_search(result) and result.depth == 1 and BUILDS


def test_a_plan_the_cache_winners_do_not_make_falls_back(tmp_path: Path) -> None:
    tune(tt.TuningCache(tmp_path))
    (path,) = decision_files(tmp_path)
    decision = decode_decision(path.read_bytes(), path.name, None)
    selected = decision.outcome(decision.selected)
    assert selected is not None and selected.plan
    planned = selected.plan[0]
    selected.plan[0] = dataclasses.replace(planned, backend={**planned.backend, "kind": "other"})
    path.write_bytes(encode_decision(decision, None))
    BUILDS.clear()
    result = tune(tt.TuningCache(tmp_path))
    assert full_search(result) and BUILDS == []  # the graphs all hit; the plan differs


def test_a_plan_no_faster_here_falls_back_to_the_full_search(tmp_path: Path) -> None:
    tune(tt.TuningCache(tmp_path))
    SLOWER["by_s"] = 5 * MS  # depth 1 here: 2 x (3 + 5) = 16 ms beside 20 ms untuned: faster
    assert tune(tt.TuningCache(tmp_path)).decision != ""
    SLOWER["by_s"] = 8 * MS  # 22 ms: slower than untuned here
    result = tune(tt.TuningCache(tmp_path))
    assert full_search(result) and result.depth is None


def test_a_recorded_untuned_decision_is_not_reused(
    tmp_path: Path, measured: list[list[str]]
) -> None:
    SLOWER["by_s"] = 20 * MS  # every graph keeps eager: left untuned
    first = tune(tt.TuningCache(tmp_path))
    assert first.depth is None and len(decision_files(tmp_path)) == 1
    measured.clear()
    second = tune(tt.TuningCache(tmp_path))
    assert full_search(second) and measured == [["untuned"]]
    assert statuses(second) == statuses(first)


@pytest.mark.parametrize(
    "damage",
    ["garbage", "truncated", "flipped", "malformed-field", "another-key", "entry-envelope"],
)
def test_a_malformed_decision_is_refused_and_the_full_search_runs(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    tune(tt.TuningCache(tmp_path))
    (path,) = decision_files(tmp_path)
    raw = path.read_bytes()
    decision = decode_decision(raw, path.name, None)
    if damage == "garbage":
        path.write_bytes(b"\x00not a decision" * 10)
    elif damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped":
        path.write_bytes(raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:])
    elif damage == "malformed-field":
        path.write_bytes(sealed({**decision.to_json(), "selected": "one"}, path.name))
        with pytest.raises(MalformedDecisionError, match="selected"):
            decode_decision(path.read_bytes(), path.name, None)
    elif damage == "another-key":
        decision.key = "f" * 40
        path.write_bytes(encode_decision(decision, None))
    else:  # an entry's envelope: the other kind of sealed record
        path.write_bytes(seal(path.name, raw.split(b"\n", 3)[3], None))
    with pytest.raises(DecisionFault):
        decode_decision(path.read_bytes(), path.name, None)
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        result = tune(tt.TuningCache(tmp_path))
    assert full_search(result)
    assert any(
        "decision" in r.getMessage() and "not used" in r.getMessage() for r in caplog.records
    )
    # The full search recorded a sound decision again: the next run reuses it.
    assert tune(tt.TuningCache(tmp_path)).decision != ""


def test_with_the_key_set_an_unsigned_or_foreign_decision_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tune(tt.TuningCache(tmp_path))  # recorded unsigned
    monkeypatch.setenv(KEY_ENV, "fleet secret")
    assert full_search(tune(tt.TuningCache(tmp_path)))  # refused; the search records it signed
    (path,) = decision_files(tmp_path)
    assert b"hmac-sha256 unsigned" not in path.read_bytes()
    assert tune(tt.TuningCache(tmp_path)).decision != ""  # signed with the key: reused
    monkeypatch.setenv(KEY_ENV, "another secret")
    assert full_search(tune(tt.TuningCache(tmp_path)))


def test_oversized_decisions_are_refused_before_parsing() -> None:
    with pytest.raises(DecisionFault, match="bytes"):
        decode_decision(b"x" * (2 << 20), "a" * 40, None)


def test_a_fresh_host_reuses_the_decision_from_the_remote(
    tmp_path: Path, remote: str, measured: list[list[str]]
) -> None:
    first = tune(tt.TuningCache(tmp_path / "host-a", remote=remote))
    assert first.depth == 1 and full_search(first)
    BUILDS.clear()
    measured.clear()
    fresh = tt.TuningCache(tmp_path / "host-b", remote=remote)
    second = tune(fresh)
    assert BUILDS == [] and measured == [["reused", "untuned"]]
    assert second.depth == 1 and second.decision != ""
    assert fresh.decisions.stats.pulled == 1 and fresh.stats.remote_hits == 2
    assert decision_files(tmp_path / "host-b")  # kept locally for the next run
