"""The public API's docstrings: Google sections, and an example that runs.

Every name in ``__all__`` of ``tunetree``, ``tunetree.backends`` and ``tunetree.fleet``:
a function documents its parameters (``Args:``) and what it returns (``Returns:``); a class
documents what it is made of (``Args:`` for the constructor, ``Attributes:`` for a result);
and every ``>>>`` example in them runs as written.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib
import inspect
from typing import Any

import pytest

PACKAGES = ("tunetree", "tunetree.backends", "tunetree.fleet")

NO_EXAMPLE = {"tunetree.ModelInfo", "tunetree.backends.Runner", "tunetree.fleet.FleetRow"}
"""Objects a user receives but never builds: their attributes say what they hold."""


def _public() -> list[tuple[str, Any]]:
    found = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if not inspect.ismodule(value):
                found.append((f"{package}.{name}", value))
    return found


PUBLIC = [pytest.param(name, value, id=name) for name, value in _public()]


def _parameters(value: Any) -> list[str]:
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return []
    return [p for p in signature.parameters if p not in ("self", "args", "kwargs")]


def _checking_source(value: Any) -> str:
    """The code that checks the arguments: a function's body, a class's constructor."""
    if not inspect.isclass(value):
        return inspect.getsource(value)
    text = ""
    for name in ("__init__", "__post_init__"):
        with contextlib.suppress(KeyError, OSError, TypeError):  # absent, or by dataclasses
            text += inspect.getsource(vars(value)[name])
    return text


@pytest.mark.parametrize(("name", "value"), PUBLIC)
def test_the_docstring_has_its_sections(name: str, value: Any) -> None:
    doc = inspect.getdoc(value) or ""
    assert doc, name
    if inspect.isclass(value) and issubclass(value, BaseException):
        return
    if inspect.isclass(value):
        if _parameters(value):
            assert "Args:" in doc or "Attributes:" in doc, name
    else:
        if _parameters(value):
            assert "Args:" in doc, name
            for parameter in _parameters(value):
                documented = (f"    {parameter}:", f"    **{parameter}:", f"    *{parameter}:")
                assert any(d in doc for d in documented), f"{name}: {parameter} undocumented"
        assert "Returns:" in doc, name
    if "raise InvalidInputError" in _checking_source(value):
        assert "Raises:" in doc, name
    if name not in NO_EXAMPLE:
        assert ">>>" in doc, f"{name} has no example"


@pytest.mark.parametrize(("name", "value"), PUBLIC)
def test_the_examples_run(name: str, value: Any) -> None:
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(value, name, globs={}):
        runner.run(test)
    assert runner.failures == 0, f"{name}: {runner.failures} example(s) failed (see stdout)"
