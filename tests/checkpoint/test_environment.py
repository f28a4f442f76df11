"""The environment record: what it holds, and how two records are compared."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import socket

import torch

from tunetree.backends import Eager, OpenVINO
from tunetree.backends.registry import BUILTIN_BACKENDS
from tunetree.checkpoint.environment import (
    NOT_INSTALLED,
    Difference,
    backend_kinds,
    backend_libraries,
    compare_records,
    environment_record,
    flatten_record,
    library_version,
)


def test_record_contents() -> None:
    record = environment_record(["inductor"])
    json.dumps(record)  # plain JSON data
    assert record["host"] == socket.gethostname()
    assert record["os"]["system"] == platform.system()
    assert record["cpu"]["model"] and isinstance(record["cpu"]["flags"], list)
    assert record["cpu"]["logical_cores"] >= 1
    assert isinstance(record["accelerators"], dict)
    if torch.cuda.is_available():
        assert record["accelerators"]["cuda"]["count"] == torch.cuda.device_count()
    else:
        assert "cuda" not in record["accelerators"]
    versions = record["versions"]
    assert versions["torch"] == torch.__version__
    assert versions["python"].endswith(platform.python_version())
    assert versions["tunetree"] == __import__("tunetree").__version__
    assert versions["triton"] == library_version("triton")
    assert record["backends"] == ["inductor"]


def test_records_are_stable() -> None:
    assert environment_record(["eager"]) == environment_record(["eager"])
    assert compare_records(environment_record(), environment_record()) == []


def test_backend_libraries_are_recorded() -> None:
    record = environment_record([OpenVINO(), "onnxruntime", "openvino-bf16", "torchao"])
    for name in ("openvino", "onnxruntime", "onnx", "onnxscript", "torchao"):
        assert record["versions"][name] == library_version(name)
    assert record["backends"] == ["onnxruntime", "openvino", "openvino-bf16", "torchao"]
    assert backend_libraries("openvino-bf16") == ("openvino",)  # from its base class
    assert backend_libraries("eager") == ()
    assert library_version("surely-not-a-real-distribution") == NOT_INSTALLED


def test_every_known_backend_kind_has_libraries() -> None:
    for cls in BUILTIN_BACKENDS:
        for name in backend_libraries(cls.kind):
            try:
                importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                assert library_version(name) == NOT_INSTALLED


def test_backend_kinds_accepts_kinds_objects_and_classes() -> None:
    assert backend_kinds(["inductor", Eager(), Eager, "eager"]) == ["eager", "inductor"]


def test_flatten_and_compare() -> None:
    tuned = {
        "host": "a",
        "cpu": {"model": "X", "flags": ["avx2", "avx512f"]},
        "accelerators": {},
        "versions": {"torch": "2.13", "openvino": "2026.1"},
    }
    running = {
        "host": "b",
        "cpu": {"model": "X", "flags": ["avx2", "sve"]},
        "accelerators": {"cuda": {"count": 1}},
        "versions": {"torch": "2.13"},
    }
    assert flatten_record(tuned) == {
        "host": "a",
        "cpu.model": "X",
        "cpu.flags": ["avx2", "avx512f"],
        "versions.torch": "2.13",
        "versions.openvino": "2026.1",
    }
    diffs = compare_records(tuned, running)
    assert [d.entry for d in diffs] == [
        "accelerators.cuda.count",
        "cpu.flags",
        "host",
        "versions.openvino",
    ]
    text = [str(d) for d in diffs]
    assert text[0] == "accelerators.cuda.count: tuned (absent) vs running 1"
    assert text[1] == (
        "cpu.flags: tuned has [avx512f] that running lacks; running has [sve] that tuned lacks"
    )
    assert text[2] == "host: tuned 'a' vs running 'b'"
    assert text[3] == "versions.openvino: tuned '2026.1' vs running (absent)"
    # ignore waives an entry and everything below it
    assert [d.entry for d in compare_records(tuned, running, ("host", "cpu", "versions"))] == [
        "accelerators.cuda.count"
    ]
    assert compare_records(tuned, running, ("hos",))[2].entry == "host"  # no prefix matching


def test_difference_json() -> None:
    d = Difference("host", "a", None)
    assert d.to_json() == {"entry": "host", "tuned": "a", "running": None}
