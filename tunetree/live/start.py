"""``tt.jit(model)``: serve from the first call, tune on live calls, start warm everywhere."""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any

from ..backends import default_backends
from ..cache import TuningCache, open_cache
from ..errors import InvalidInputError
from ..search.auto import auto_tune
from ..search.recorded import RecordedPlan
from ..signature.graph import Sample
from ..signature.modules import CallFn, resolve_device
from .calls import Unstorable, encode_calls
from .recorder import Recorder, RecordLimits
from .served import Served
from .store import CallsStore, calls_key
from .tuner import DEFAULT_NICE, Tuner

log = logging.getLogger("tunetree.live")

_OWN = frozenset({"model", "dataset", "call", "cache", "verbose", "dry_run"})
"""auto_tune's arguments the JIT sets itself."""


def jit(
    model: Any,
    *,
    cache: Any = None,
    call: CallFn | None = None,
    limits: RecordLimits | None = None,
    share_calls: bool = True,
    tuner_nice: int = DEFAULT_NICE,
    tuner_process: bool = True,
    **auto_tune_options: Any,
) -> Served:
    """Serve ``model`` from its first call and tune it in the background on the calls it gets.

    Calls run the model's own forward while the JIT keeps a bounded copy of them
    (:class:`RecordLimits`: one call per signature, at most 32 calls and 256 MiB); once 8
    distinct signatures (or 64 calls) were seen, :func:`tunetree.auto_tune` runs on them in a
    child process at lower priority (or a background thread), on a private copy of the model,
    and its plan (checked against eager like every plan) is swapped in between two calls. The
    calls tuned on are kept in the tuning cache beside the plan, so a later process with the
    same model and cache loads and checks that plan with nothing to build.

    Args:
        model: an ``nn.Module`` in eval mode (or a pipeline served through ``call``).
        cache: the tuning cache, as ``auto_tune`` takes it (None: the default directory;
            a path; a :class:`tunetree.TuningCache`, e.g. with a remote tier; False: none,
            and then no warm start).
        call: ``call(model, *args, **kwargs)`` runs a served call (e.g. ``generate``), as in
            ``auto_tune``.
        limits: what is recorded and when tuning starts (:class:`RecordLimits`).
        share_calls: keep the calls tuned on in the cache (and its remote tier) for warm
            starts. They are real traffic; False keeps them out (every process then tunes
            on its own traffic, reusing the cached graphs it can).
        tuner_nice: how much lower the tuner's priority is (Linux nice, 0: same).
        tuner_process: run a tune that builds in a child process (its own interpreter, so
            its Python never holds the serving threads' GIL; the plan comes back through the
            cache and is checked here). A model, ``call`` or option a fresh interpreter cannot
            unpickle (a class defined in ``__main__`` or in a function, a lambda), or no cache
            directory, tunes in a thread instead (logged). False: always a thread.
        **auto_tune_options: Any other keyword of :func:`tunetree.auto_tune` (``strategy``,
            ``time_budget``, ``max_depth``, ``measure_config``, ...). A warm start needs the
            same options as the process that tuned.

    Returns:
        The :class:`Served` model: call it as the model.

    Raises:
        InvalidInputError: an unknown or reserved ``auto_tune`` option.

    Example:
        >>> import torch, tunetree as tt
        >>> model = torch.nn.Linear(4, 2).eval()
        >>> served = tt.jit(model, cache=False)
        >>> x = torch.randn(3, 4)
        >>> torch.equal(served(x), model(x)), served.status
        (True, 'recording')
        >>> served.undo() is model
        True
    """
    _check_options(auto_tune_options)
    _import_for_loads(model, auto_tune_options)
    recorder = Recorder(limits or RecordLimits())
    served = Served(model, call, recorder)
    graph_cache = open_cache(cache)
    served.tuner = Tuner(
        model,
        call,
        graph_cache if graph_cache is not None else False,
        auto_tune_options,
        tuner_nice,
        served.finish,
        tuner_process,
    )
    if isinstance(graph_cache, TuningCache) and share_calls:
        _warm_start(served, graph_cache, auto_tune_options.get("device"))
    return served


def _check_options(options: dict[str, Any]) -> None:
    known = set(inspect.signature(auto_tune).parameters) - _OWN
    wrong = sorted(set(options) - known)
    if wrong:
        raise InvalidInputError(
            f"tt.jit: {', '.join(wrong)} is not an auto_tune option it passes on "
            f"(known: {', '.join(sorted(known))})"
        )


def _import_for_loads(model: Any, options: dict[str, Any]) -> None:
    """Import what loading a runner of the tune's backends imports, before serving starts.

    A plan is loaded beside serving threads (a warm start, a child's plan); a C extension
    that holds the GIL as it initialises (``onnx``'s ``ml_dtypes``, about 1 s) would stall
    every call meanwhile. Here, before the first call, it stalls none.
    """
    strategy = options.get("strategy")
    try:
        backends = (
            strategy.backends
            if strategy is not None
            else default_backends(resolve_device(model, options.get("device")))
        )
        names = dict.fromkeys(name for b in backends for name in type(b).load_imports)
    except Exception as exc:  # the tune will name what is wrong with the strategy or model
        log.debug("tt.jit: no imports ahead of loads: %s", exc)
        return
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # the backend is left out of the tune with its reason
            log.debug("tt.jit: %s not imported ahead of loads: %s", name, exc)


def _warm_start(served: Served, cache: TuningCache, device: Any) -> None:
    """Look for the calls a process tuned this model on; tune on them first if found."""
    store = CallsStore(cache.directory, cache.remote, served.recorder.limits.max_bytes)
    key: list[str] = []
    served.looking()

    def the_key() -> str:
        if not key:
            where = resolve_device(served.model, device)
            key.append(calls_key(served.model, served.call, where))
        return key[0]

    def lookup() -> None:
        try:
            found = store.get(the_key(), resolve_device(served.model, device))
        except Exception as exc:  # a model the key cannot describe: record as usual
            log.info("tt.jit: no warm start: %s", exc)
            found = None
        if found is None:
            log.debug("tt.jit: no usable recorded calls in the cache (key %s)", (key or ["-"])[0])
            served.not_found()
        else:
            job = served.warm(*found)
            if job is not None and served.tuner is not None:
                served.tuner.submit(job)

    def persist(
        samples: list[Sample], depth: int | None = None, plan: RecordedPlan | None = None
    ) -> None:
        try:
            store.put(the_key(), encode_calls(samples, the_key(), depth, plan))
        except Unstorable as exc:
            log.info("tt.jit: the calls are not kept for warm starts: they hold %s", exc)
        except Exception as exc:
            log.warning("tt.jit: could not keep the calls for warm starts: %s", exc)

    served.persist = persist
    assert served.tuner is not None
    served.tuner.submit(lookup)
