"""The settings :func:`~tunetree.tune` and :func:`~tunetree.auto_tune` share: one frozen object.

Both entry points read a :class:`TuneConfig`. Their keyword arguments of the same names build
it, so ``tt.tune(model, data, cache=False)`` and
``tt.tune(model, data, config=tt.TuneConfig(cache=False))`` tune with the same settings. A
keyword given beside ``config=`` must agree with it: a keyword that would change one of the
config's values is refused (:class:`~tunetree.errors.InvalidInputError`) rather than silently
taking precedence; ``config.replace(...)`` makes the changed copy.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass
from typing import Any, Final

import torch

from ..candidates.measure import MeasureConfig
from ..candidates.results import GraphCache
from ..candidates.strategy import Strategy
from ..errors import CacheError, InvalidInputError
from ..signature.compare import Tolerances
from ..signature.modules import CallFn
from ..signature.shapes import DynamicShapes


class Unset(enum.Enum):
    """The default of a settings keyword: "not given", so the config's value holds."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset.UNSET
"""A keyword left out of a :func:`tune` / :func:`auto_tune` call."""


@dataclass(frozen=True)
class TuneConfig:
    """The settings of a tune, read by :func:`tunetree.tune` and :func:`tunetree.auto_tune`.

    Args:
        strategy: The candidates per graph and how the winner is picked; None: the device's
            :func:`tunetree.default_strategy` (under ``auto_tune``'s ``quick`` or ``accuracy``
            the matching strategy). Every graph gets its own copy.
        device: Where to tune; None: where the model's weights are (another device type is
            refused).
        call: How a dataset item calls the model; None: positional arguments, a dict's items
            as keywords.
        tolerances: How close to eager a candidate's outputs must be; None: the defaults.
        measure_config: How candidates are timed; None: :class:`tunetree.MeasureConfig` (under
            ``auto_tune(quick=True)`` its first look).
        cache: The tuning cache: None or True the default directory (``$TUNETREE_CACHE_DIR``
            or ``~/.cache/tunetree``), a path another directory, a
            :class:`tunetree.TuningCache`, False none.
        dynamic_shapes: None (axes that vary across the samples become ranges), False
            (every exact shape is its own graph) or a torch.export-style nest of
            :class:`tunetree.Dim`.
        allow_training: Tune a model in training mode (its eval behaviour); refused otherwise.
        verbose: Progress lines on stderr.
        dry_run: Report what would be wrapped; tune nothing.

    Raises:
        InvalidInputError: A value of the wrong kind.
        CacheError: A ``cache`` that is none of the above.

    Example:
        >>> import tunetree as tt
        >>> config = tt.TuneConfig(cache=False, verbose=False)
        >>> config.replace(dry_run=True).dry_run
        True
    """

    strategy: Strategy | None = None
    device: torch.device | str | None = None
    call: CallFn | None = None
    tolerances: Tolerances | None = None
    measure_config: MeasureConfig | None = None
    cache: GraphCache | str | os.PathLike[str] | bool | None = None
    dynamic_shapes: DynamicShapes = None
    allow_training: bool = False
    verbose: bool = True
    dry_run: bool = False

    def __post_init__(self) -> None:
        _expect("strategy", self.strategy, Strategy)
        _expect("device", self.device, (torch.device, str))
        _expect("tolerances", self.tolerances, Tolerances)
        _expect("measure_config", self.measure_config, MeasureConfig)
        if self.call is not None and not callable(self.call):
            raise InvalidInputError(f"call must be callable, got {type(self.call).__name__}")
        for name in ("allow_training", "verbose", "dry_run"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInputError(
                    f"{name} must be True or False, got {getattr(self, name)!r}"
                )
        if self.dynamic_shapes is True:
            raise InvalidInputError(
                "dynamic_shapes takes None (infer ranges), False (exact shapes) or a nest of "
                "tt.Dim, not True"
            )
        _check_cache(self.cache)

    def replace(self, **changes: Any) -> TuneConfig:
        """A copy with ``changes`` applied (checked like a new config).

        Raises:
            InvalidInputError: A name that is not a setting, or a value of the wrong kind.
        """
        unknown = sorted(set(changes) - _FIELDS)
        if unknown:
            raise InvalidInputError(
                f"TuneConfig has no setting {', '.join(unknown)}; settings: "
                f"{', '.join(sorted(_FIELDS))}"
            )
        return dataclasses.replace(self, **changes)


_FIELDS = frozenset(f.name for f in dataclasses.fields(TuneConfig))


def settings(config: TuneConfig | None, **given: Any) -> TuneConfig:
    """The settings of one call: ``config`` (default settings when None) with ``given`` keywords.

    A keyword left :data:`UNSET` keeps the config's value; one given beside ``config`` must
    equal the config's value.

    Raises:
        InvalidInputError: ``config`` is not a :class:`TuneConfig`, or a keyword contradicts it.
    """
    chosen = {name: value for name, value in given.items() if value is not UNSET}
    if config is None:
        return TuneConfig().replace(**chosen)
    if not isinstance(config, TuneConfig):
        raise InvalidInputError(f"config must be a tt.TuneConfig, got {type(config).__name__}")
    clashes = [
        f"{name}={value!r} (config has {getattr(config, name)!r})"
        for name, value in chosen.items()
        if not _same(value, getattr(config, name))
    ]
    if clashes:
        raise InvalidInputError(
            "keywords contradict config=: " + "; ".join(clashes) + ". Pass one or the other, "
            "or config.replace(...) for a changed copy"
        )
    return config.replace(**chosen)


def _same(a: Any, b: Any) -> bool:
    """Whether a keyword's value is the config's (the same object, or equal plain values)."""
    if a is b:
        return True
    try:
        return bool(type(a) is type(b) and a == b)
    except Exception:  # a value whose == is not a bool (a tensor in a shapes nest)
        return False


def _expect(name: str, value: Any, kinds: type | tuple[type, ...]) -> None:
    if value is not None and not isinstance(value, kinds):
        raise InvalidInputError(f"{name} must be a {_names(kinds)} or None, got {value!r}")


def _names(kinds: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))


def _check_cache(cache: Any) -> None:
    """Refuse a ``cache`` that :func:`tunetree.cache.open_cache` would refuse, up front."""
    if cache is None or isinstance(cache, bool | str | os.PathLike):
        return
    if hasattr(cache, "lookup") and hasattr(cache, "store"):
        return
    raise CacheError(
        f"cache= takes a TuningCache, a directory, True/None (default directory) or False, "
        f"not {type(cache).__name__}"
    )
