"""Detect graphs whose Python control flow depends on input values (``if x.sum() > 0:``).

``torch.export`` refuses them with a data-dependent guard error; ``torch.jit.trace`` (the
tracing fallback of the OpenVINO and ONNX exporters) silently bakes in the branch the example
took and warns with a ``TracerWarning``. Either way the build must fail with a reason that
says what happened, instead of returning a runner that is wrong on other inputs.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import traceback
import warnings
from collections.abc import Iterator

import torch

from ..errors import BackendError

_CONVERSION = re.compile(
    r"Converting a tensor to a (Python (boolean|number|float|integer|complex|list)|NumPy array)"
)
_DATA_DEPENDENT_TYPES = ("GuardOnDataDependentSymNode",)
_DATA_DEPENDENT_TEXT = ("guard on data-dependent", "specialized integer from data-dependent")
_RAISED_BY = re.compile(
    r'The following call raised this error:\s*File "([^"]+)", line (\d+), in \S+\s*\n\s*(.+)'
)
PREFIX = "the graph depends on input values"


class ValueDependentError(BackendError):
    """The module branches on tensor values: no exported graph serves every input."""


def _source(filename: str, lineno: int) -> str:
    line = linecache.getline(filename, lineno).strip()
    where = f"{filename.rsplit('/', 1)[-1]}:{lineno}"
    return f"`{line}` at {where}" if line else where


@contextlib.contextmanager
def traced_values_checked(what: str) -> Iterator[None]:
    """Around a tracing export, fail when the tracer converted a tensor to a Python value.

    Raises :class:`ValueDependentError` (a branch or a number fixed to the example's), naming
    the code.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        warnings.filterwarnings("always", message=_CONVERSION.pattern)
        yield
    for warning in caught:
        match = _CONVERSION.search(str(warning.message))
        if match is not None:
            raise ValueDependentError(
                f"{PREFIX}: {what} converted a tensor to a {match.group(1)} in "
                f"{_source(warning.filename, warning.lineno)}, so it would fix the result "
                "to the example's values"
            )


def data_dependent_reason(error: BaseException) -> str | None:
    """The reason to fail with when ``torch.export`` refused a module branching on a tensor value.

    None for other export errors.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if type(current).__name__ in _DATA_DEPENDENT_TYPES or any(
            t in text for t in _DATA_DEPENDENT_TEXT
        ):
            where = _raising_code(current) or text.strip().splitlines()[0][:200]
            return f"{PREFIX}: torch.export cannot guard on a tensor value in {where}"
        current = current.__cause__ or current.__context__
    return None


def _raising_code(error: BaseException) -> str | None:
    """The user code that raised ``error``.

    As torch's message names it, else the innermost frame of its traceback outside torch.
    """
    match = _RAISED_BY.search(str(error))
    if match is not None:
        return f"`{match.group(3).strip()}` at {match.group(1).rsplit('/', 1)[-1]}:{match.group(2)}"
    torch_dir = os.path.dirname(torch.__file__)
    frames = [f for f, _ in traceback.walk_tb(error.__traceback__)]
    for frame in reversed(frames):
        filename = frame.f_code.co_filename
        if not filename.startswith(torch_dir) and os.sep + "tunetree" + os.sep not in filename:
            return _source(filename, frame.f_lineno)
    return None
