"""The environment record read from a file is checked by the manifests' typed field reader."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tunetree.checkpoint.environment import environment_record
from tunetree.checkpoint.reader import record_problem


def _good() -> dict[str, Any]:
    record = environment_record(["openvino", "onnxruntime"])
    record["accelerators"] = {
        "cuda": {"count": 1, "names": ["GPU"], "capabilities": ["9.0"], "driver": "5", "cudnn": "9"}
    }
    return record


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    record = copy.deepcopy(_good())
    target = record
    for name in path[:-1]:
        target = target[name]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return record


def test_a_record_of_this_machine_fits() -> None:
    assert record_problem(_good()) is None


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("host",), KeyError, "'host' is missing"),
        (("host",), "x" * 5000, "'host' is longer than 4096"),
        (("os", "release"), 6, "'os.release' is a int, not str"),
        (("cpu", "flags"), ["avx", 3], "'cpu.flags' holds a int"),
        (("cpu", "flags"), ["f"] * 5000, "'cpu.flags' holds more than 4096"),
        (("cpu", "logical_cores"), True, "'cpu.logical_cores' is a bool"),
        (("cpu", "logical_cores"), -1, "'cpu.logical_cores' is -1"),
        (("accelerators", "cuda", "count"), KeyError, "'accelerators.cuda.count' is missing"),
        (("accelerators", "cuda", "names"), "GPU", "'accelerators.cuda.names' is a str"),
        (("backends",), ["Not A Kind!"], "'backends' holds 'Not A Kind!'"),
        (("versions", "torch"), None, "'versions.torch' is a NoneType"),
        (("versions",), {str(i): "1" for i in range(5000)}, "'versions' holds more than"),
    ],
)
def test_each_malformed_field_is_refused_by_its_dotted_name(
    path: tuple[str, ...], value: Any, named: str
) -> None:
    problem = record_problem(_with(path, value))
    assert problem is not None and named in problem, problem


@pytest.mark.parametrize("record", [None, [], "record", 1])
def test_a_record_that_is_no_object_is_refused(record: Any) -> None:
    assert record_problem(record) == f"the record is not an object (a {type(record).__name__})"
