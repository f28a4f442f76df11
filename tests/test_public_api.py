"""The public surface: what ``tunetree``, ``tunetree.backends`` and ``tunetree.fleet`` export.

``__all__`` is what the README and docs use; names that used to be re-exported still resolve
for one release, each with a ``DeprecationWarning`` that names its new import path.
"""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import tunetree as tt

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tunetree", "tunetree.backends", "tunetree.fleet")

DEPRECATED = {
    "tunetree": {
        "CandidateRow": "tunetree.candidates.evaluate",
        "DepthRow": "tunetree.search.auto_result",
        "DepthStatus": "tunetree.search.auto_result",
        "Graph": "tunetree.signature.graph",
        "GraphKey": "tunetree.signature.graph",
        "GraphResult": "tunetree.candidates.results",
        "ModuleRecord": "tunetree.signature.inspection",
        "Pareto": "tunetree.accuracy",
        "PhaseTime": "tunetree.candidates.budget",
        "Plan": "tunetree.runtime.plan",
        "PlanEntry": "tunetree.runtime.plan",
        "PlanStep": "tunetree.accuracy",
        "Sample": "tunetree.signature.graph",
        "SkippedWork": "tunetree.search.auto_result",
        "Status": "tunetree.candidates.evaluate",
        "Timing": "tunetree.candidates.measure",
        "Verdict": "tunetree.accuracy",
        "measure": "tunetree.candidates.measure",
    },
    "tunetree.backends": {
        "libraries_of": "tunetree.backends.registry",
        "original_forward": "tunetree.signature.binding",
    },
    "tunetree.fleet": {"hardware_class": "tunetree.fleet.hardware"},
}


def test_the_top_level_list_is_small_and_holds_no_internals() -> None:
    # 41 today (TuneConfig, jit and load_pretrained among them): a list a user can learn.
    assert len(tt.__all__) <= 42, len(tt.__all__)
    assert len(set(tt.__all__)) == len(tt.__all__)
    for internal in ("measure", "Verdict", "GraphKey", "Graph", "PlanStep", "Status", "Timing"):
        assert internal not in tt.__all__
    assert "original_forward" not in tt.backends.__all__
    assert len(tt.backends.__all__) <= 17 and len(tt.fleet.__all__) <= 4


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves_without_a_warning(package: str) -> None:
    module = importlib.import_module(package)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in module.__all__:
            assert getattr(module, name) is not None, name


@pytest.mark.parametrize(
    ("package", "name", "home"),
    [(p, n, h) for p, names in DEPRECATED.items() for n, h in names.items()],
)
def test_a_removed_name_still_works_and_warns_with_its_new_path(
    package: str, name: str, home: str
) -> None:
    module = importlib.import_module(package)
    assert name not in module.__all__
    with pytest.warns(DeprecationWarning, match=rf"`from {re.escape(home)} import {name}`"):
        found = getattr(module, name)
    assert found is getattr(importlib.import_module(home), name)


def test_backend_types_points_to_the_registry() -> None:
    from tunetree.backends.registry import BUILTIN_BACKENDS

    with pytest.warns(DeprecationWarning, match="registered_backends"):
        assert tt.backends.BACKEND_TYPES is BUILTIN_BACKENDS


def test_an_unknown_name_is_an_attribute_error_as_usual() -> None:
    for package in PACKAGES:
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            importlib.import_module(package).nope  # noqa: B018
    assert not hasattr(tt, "nope")


def test_the_latency_budget_strategy_is_renamed_latency_target() -> None:
    backends = [tt.backends.Eager()]
    with pytest.warns(DeprecationWarning, match="LatencyTargetStrategy"):
        old_class = tt.LatencyBudgetStrategy
    with pytest.warns(DeprecationWarning, match="target_ms"):
        old = old_class(8.0, backends)
    assert isinstance(old, tt.LatencyTargetStrategy)
    assert old.budget_ms == old.target_ms == 8.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = tt.LatencyTargetStrategy(8.0, backends)
    assert new.describe() == old.describe() == "LatencyTargetStrategy(8 ms)"


def _documented_names() -> set[str]:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    texts += sorted((ROOT / "examples").glob("*/*.py"))
    found: set[str] = set()
    for path in texts:
        found |= set(re.findall(r"(?<![\w.])tt\.([A-Za-z_]\w*)", path.read_text()))
    return found


def test_every_name_the_readme_docs_and_examples_use_is_exported() -> None:
    used = _documented_names()
    assert {"auto_tune", "load", "save", "AccuracyBudget"} <= used  # the scan reads them
    assert used <= set(tt.__all__), used - set(tt.__all__)
