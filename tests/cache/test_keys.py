"""Cache keys name no file of tunetree: its classes key as ``tunetree.<qualname>``.

Moving code between tunetree's modules therefore changes no key. Entries of the first
release (schema 1, which named modules) are a clean miss: ``tests/checkpoint/test_compat.py``
tunes against the committed one.
"""

from __future__ import annotations

import re

import tunetree as tt
from tunetree.backends.base import Backend
from tunetree.backends.registry import BUILTIN_BACKENDS
from tunetree.cache import keys
from tunetree.candidates.strategy import Strategy

MODULE_PATH = re.compile(r"tunetree\.[a-z_]+\.")


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def test_the_schema_is_two() -> None:
    assert keys.SCHEMA == 2


def test_strategies_and_backends_key_by_package_and_name() -> None:
    record = keys.strategy_record(tt.OneBackendStrategy(tt.backends.Eager()))
    assert record["type"] == "tunetree.OneBackendStrategy"
    assert record["backends"] == [{"kind": "eager", "class": "tunetree.Eager", "config": {}}]
    assert keys.stable(tt.HighestThroughputStrategy) == "class:tunetree.HighestThroughputStrategy"
    assert keys.stable(tt.default_strategy) == "callable:tunetree.default_strategy"


def test_no_key_record_names_a_module_of_tunetree() -> None:
    strategies = [
        tt.default_strategy("cpu"),
        tt.accuracy_strategy("cpu"),
        tt.quick_strategy("cpu"),
        tt.LatencyTargetStrategy(5.0, [cls() for cls in BUILTIN_BACKENDS if _plain(cls)]),
    ]
    for strategy in strategies:
        text = keys.canonical_json(keys.strategy_record(strategy))
        assert not MODULE_PATH.search(text), text


def _plain(cls: type[Backend]) -> bool:
    try:
        cls()
    except TypeError:
        return False
    return True


def test_moving_a_class_inside_tunetree_changes_no_key() -> None:
    moved = type("OneBackendStrategy", (tt.OneBackendStrategy,), {})
    for module in ("tunetree.candidates.strategy", "tunetree.strategies.one", "tunetree"):
        moved.__module__ = module
        assert keys.qualified_name(moved) == "tunetree.OneBackendStrategy"


def test_names_by_package_stay_distinct_for_what_keys_name() -> None:
    for base in (Strategy, Backend):
        ours = {c for c in _subclasses(base) if c.__module__.startswith("tunetree.")}
        names = [keys.qualified_name(c) for c in ours]
        assert len(set(names)) == len(names), sorted(names)


def test_user_classes_key_by_their_own_module() -> None:
    class Local:
        pass

    assert keys.qualified_name(Local) == f"{__name__}.{Local.__qualname__}"


def test_a_value_a_class_caches_on_itself_at_run_time_changes_no_key() -> None:
    # Hugging Face's PreTrainedModel sets ``_can_set_*_implementation_cached_value`` on the
    # class when a model is built: a process that only unpickled a model (tt.jit's child)
    # never has it, and its keys must still be the serving process's.
    import torch

    class Cached(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    before = keys.structure_digest(Cached())
    Cached._can_set_experts_implementation_cached_value = False  # type: ignore[attr-defined]
    keys._class_digests.clear()
    assert keys.structure_digest(Cached()) == before

    Cached.forward = lambda self, x: x + 2  # type: ignore[method-assign]
    keys._class_digests.clear()
    assert keys.structure_digest(Cached()) != before  # code still keys
