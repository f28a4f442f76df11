"""The backend registry: kinds are unique, built-ins come first, plugins arrive through the
``tunetree.backends`` entry point group (a broken one is logged, never fatal), and a kind
read from a file never imports anything."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tunetree.backends import (
    Backend,
    Eager,
    OnnxRuntime,
    OpenVINO,
    OpenVINOBf16,
    TorchAO,
    backend_type,
    registered_backends,
)
from tunetree.backends.packages import install_hint, not_installed_reason
from tunetree.backends.registry import BUILTIN_BACKENDS, ENTRY_POINT_GROUP, libraries_of
from tunetree.errors import BackendError, BackendUnavailableError, TunetreeError

from .export_models import hide_packages

PLUGIN_SOURCE = """
import dataclasses
from typing import ClassVar

from tunetree.backends import Backend, Eager


@dataclasses.dataclass(frozen=True)
class PluginBackend(Backend):
    kind: ClassVar[str] = "test-plugin"
    libraries: ClassVar[tuple[str, ...]] = ("tt-test-plugin-runtime",)
    build = Eager.build
"""


def _entry_points(monkeypatch: pytest.MonkeyPatch, *values: tuple[str, str]) -> None:
    """Make the entry point group list ``values`` (name, ``module:attribute``)."""
    points = [importlib.metadata.EntryPoint(n, v, ENTRY_POINT_GROUP) for n, v in values]

    def entry_points(**selection: Any) -> list[importlib.metadata.EntryPoint]:
        assert selection == {"group": ENTRY_POINT_GROUP}
        return points

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_builtins_are_a_read_only_tuple_first_in_the_registry() -> None:
    assert isinstance(BUILTIN_BACKENDS, tuple)
    assert registered_backends()[: len(BUILTIN_BACKENDS)] == BUILTIN_BACKENDS
    for cls in BUILTIN_BACKENDS:
        assert backend_type(cls.kind) is cls


def test_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(BackendUnavailableError, match="unknown backend 'nope'") as info:
        backend_type("nope")
    assert isinstance(info.value, TunetreeError)
    for cls in BUILTIN_BACKENDS:
        assert cls.kind in str(info.value)


def test_duplicate_kind_is_refused() -> None:
    with pytest.raises(BackendError, match=r"'eager' .* already declared by tunetree\.backends"):

        @dataclasses.dataclass(frozen=True)
        class AnotherEager(Backend):
            kind: ClassVar[str] = "eager"

    @dataclasses.dataclass(frozen=True)
    class First(Eager):
        kind: ClassVar[str] = "test-duplicate"

    with pytest.raises(BackendError, match="'test-duplicate'"):

        @dataclasses.dataclass(frozen=True)
        class Second(Eager):
            kind: ClassVar[str] = "test-duplicate"

    assert backend_type("test-duplicate") is First


@pytest.mark.parametrize("kind", ["", "  ", 3])
def test_kind_must_be_a_non_empty_string(kind: Any) -> None:
    with pytest.raises(BackendError, match="must be a non-empty string"):
        type("BadKind", (Eager,), {"kind": kind})


def test_the_same_class_defined_again_replaces_the_old_one() -> None:
    def make() -> type[Backend]:
        @dataclasses.dataclass(frozen=True)
        class Again(Eager):
            kind: ClassVar[str] = "test-again"

        return Again

    old, new = make(), make()
    assert old is not new
    assert backend_type("test-again") is new


def test_subclass_without_its_own_kind_is_a_variant_not_registered() -> None:
    @dataclasses.dataclass(frozen=True)
    class LoudEager(Eager):
        pass

    assert LoudEager.kind == "eager" and backend_type("eager") is Eager
    assert LoudEager not in registered_backends()


def test_abstract_class_with_a_kind_is_not_registered() -> None:
    @dataclasses.dataclass(frozen=True)
    class Unfinished(Backend):  # no build: cannot be instantiated
        kind: ClassVar[str] = "test-unfinished"

    with pytest.raises(BackendUnavailableError):
        backend_type("test-unfinished")
    with pytest.raises(TypeError):
        Unfinished()  # type: ignore[abstract]


def test_test_defined_backends_register_without_patching() -> None:
    @dataclasses.dataclass(frozen=True)
    class Local(Eager):
        kind: ClassVar[str] = "test-local"

    assert backend_type("test-local") is Local
    assert Local in registered_backends()
    assert registered_backends()[: len(BUILTIN_BACKENDS)] == BUILTIN_BACKENDS


def test_entry_point_plugin_is_loaded_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tt_test_plugin.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tt_test_plugin", raising=False)
    _entry_points(monkeypatch, ("test-plugin", "tt_test_plugin:PluginBackend"))
    backend_type("eager")  # a known kind does not load plugins
    assert "tt_test_plugin" not in sys.modules

    cls = backend_type("test-plugin")
    assert cls.__module__ == "tt_test_plugin" and cls.kind == "test-plugin"
    assert cls in registered_backends()
    assert libraries_of("test-plugin") == ("tt-test-plugin-runtime",)
    monkeypatch.delitem(sys.modules, "tt_test_plugin")


def test_broken_entry_points_are_logged_and_skipped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _entry_points(
        monkeypatch,
        ("gone", "tt_no_such_module_anywhere:Backend"),
        ("not-a-backend", "json:dumps"),
    )
    with caplog.at_level(logging.WARNING, logger="tunetree.backends.registry"):
        found = registered_backends()
        with pytest.raises(BackendUnavailableError):
            backend_type("gone")
    assert found[: len(BUILTIN_BACKENDS)] == BUILTIN_BACKENDS
    messages = [r.getMessage() for r in caplog.records]
    assert any("'gone'" in m and "failed to load" in m for m in messages)
    assert any("'not-a-backend'" in m and "not a tunetree Backend" in m for m in messages)


def test_failing_entry_point_listing_is_not_fatal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def entry_points(**selection: Any) -> Any:
        raise RuntimeError("broken metadata")

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    with caplog.at_level(logging.WARNING, logger="tunetree.backends.registry"):
        assert registered_backends()[: len(BUILTIN_BACKENDS)] == BUILTIN_BACKENDS
    assert any("broken metadata" in r.getMessage() for r in caplog.records)


def test_a_kind_from_a_file_never_imports_a_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tt_never_imported.py").write_text("raise SystemExit('imported!')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _entry_points(monkeypatch)
    for kind in ("tt_never_imported", "tt_never_imported:Thing", "tt_never_imported.Thing"):
        with pytest.raises(BackendUnavailableError):
            backend_type(kind)
    assert "tt_never_imported" not in sys.modules


LIBRARIES = {
    "eager": (),
    "autocast": (),
    "device-graph": (),
    "inductor": ("triton",),
    "openvino": ("openvino",),
    "onnxruntime": ("onnxruntime", "onnx", "onnxscript"),
    "torchao": ("torchao",),
}
"""The libraries the first release recorded per kind (its environment table)."""


def test_libraries_match_the_first_release_table() -> None:
    for kind, libraries in LIBRARIES.items():
        assert libraries_of(kind) == libraries
    assert libraries_of("openvino-bf16") == ("openvino",)
    with pytest.raises(BackendUnavailableError):
        libraries_of("nope")


def test_install_hints_come_from_the_extra() -> None:
    assert install_hint(OpenVINO) == "pip install 'tunetree[openvino]'"
    assert install_hint(OpenVINOBf16()) == "pip install 'tunetree[openvino]'"
    assert install_hint(OnnxRuntime) == "pip install 'tunetree[onnx]'"
    assert install_hint(TorchAO, upgrade=True) == "pip install -U 'tunetree[ao]'"
    assert install_hint(backend_type("inductor")) == "pip install triton"  # no extra
    assert install_hint(Eager) == "pip install tunetree"


def test_not_installed_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not_installed_reason(OnnxRuntime, "json") is None
    hide_packages(monkeypatch, "onnx", "onnxscript")
    reason = not_installed_reason(OnnxRuntime, "onnxruntime", "onnx", "onnxscript")
    assert reason == "onnx, onnxscript are not installed: pip install 'tunetree[onnx]'"
