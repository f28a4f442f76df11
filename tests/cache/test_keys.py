"""Cache keys name tunetree's own modules as the flat layout did, so the move into rooms kept them.

The entry in ``tests/checkpoint/fixtures/v1_cache`` (written before the move) is still a hit:
``tests/checkpoint/test_compat.py`` tunes against it. These tests pin the names themselves.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

import tunetree as tt
from tests.checkpoint.fixtures.make_fixtures import HERE
from tunetree.cache import keys


def test_strategies_key_by_their_pre_move_module() -> None:
    record = keys.strategy_record(tt.OneBackendStrategy(tt.backends.Eager()))
    assert record["type"] == "tunetree.strategy.OneBackendStrategy"
    assert keys.stable(tt.HighestThroughputStrategy) == (
        "class:tunetree.strategy.HighestThroughputStrategy"
    )
    assert keys.stable(tt.default_strategy) == "callable:tunetree.strategy.default_strategy"


def test_the_v1_fixture_names_the_strategy_as_keys_do_now() -> None:
    (manifest,) = (HERE / "v1_cache" / "entries").glob("*/manifest.json")
    body = json.loads(manifest.read_bytes().partition(b"\n")[2])
    assert body["strategy"]["type"] == keys.qualified_name(tt.OneBackendStrategy)


@pytest.mark.parametrize("module", sorted(keys.KEY_MODULE_NAMES))
def test_every_mapped_module_exists(module: str) -> None:
    """A module renamed again must update the map, or its keys would change silently."""
    importlib.import_module(module)


def test_no_flat_module_is_left_to_map() -> None:
    """Every module the map names as the old spelling is gone from the package."""
    package = Path(tt.__file__).parent
    for old in set(keys.KEY_MODULE_NAMES.values()):
        relative = Path(*old.split(".")[1:])
        assert not (package / relative).with_suffix(".py").exists(), old


def test_user_classes_key_by_their_own_module() -> None:
    class Local:
        pass

    assert keys.qualified_name(Local) == f"{__name__}.{Local.__qualname__}"
