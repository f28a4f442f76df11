"""The environment record: where a tuning was measured.

A tuning result (which runner won for which graph) is a measurement of one machine
with one set of libraries: on another CPU, GPU, driver or library version the winner
can be slower or fail to build at all. Checkpoints and the tuning cache store this
record and refuse to reuse a result where the running environment differs from it.

The record is plain JSON data, flat enough that two records compare entry by entry
(:func:`flatten_record`, :func:`compare_records`).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._version import __version__
from ..backends.registry import libraries_of
from ..errors import BackendUnavailableError

NOT_INSTALLED = "not installed"
"""The version recorded for a library that is absent."""


def backend_kinds(backends_used: Iterable[Any]) -> list[str]:
    """Sorted, de-duplicated backend kinds from kinds, backend objects or backend classes."""
    kinds = set()
    for item in backends_used:
        kinds.add(item if isinstance(item, str) else str(item.kind))
    return sorted(kinds)


def backend_libraries(kind: str) -> tuple[str, ...]:
    """Distribution names whose versions matter for ``kind``.

    What its backend class declares in ``libraries``; a kind no longer known is looked up as a
    distribution of its own name.
    """
    try:
        return libraries_of(kind)
    except BackendUnavailableError:
        return (kind,)


def library_version(distribution: str) -> str:
    """Installed version of a distribution, or :data:`NOT_INSTALLED`."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def _cpu_info() -> dict[str, Any]:
    """CPU model, instruction-set flags and usable logical cores."""
    model = ""
    flags: list[str] = []
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:  # not Linux: no flags, the platform's processor name
        text = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif name in ("flags", "features") and not flags:
            flags = sorted(set(value.split()))
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 0
    return {
        "model": model or platform.processor() or platform.machine(),
        "flags": flags,
        "logical_cores": cores,
    }


def _nvidia_driver() -> str:
    try:
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return "unknown"
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar ..."
    for word in first.split():
        if word.count(".") >= 1 and word.replace(".", "").isdigit():
            return word
    return first.strip()


def _accelerators() -> dict[str, Any]:
    """Accelerators torch sees, by device type: names, count, driver and runtime versions."""
    found: dict[str, Any] = {}
    try:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver install must not break saving
        cuda_count = 0
    if cuda_count:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        found["cuda"] = {
            "count": cuda_count,
            "names": [torch.cuda.get_device_name(i) for i in range(cuda_count)],
            "capabilities": [
                ".".join(map(str, torch.cuda.get_device_capability(i))) for i in range(cuda_count)
            ],
            "driver": _nvidia_driver(),
            "runtime": torch.version.cuda or torch.version.hip or "unknown",
            "cudnn": str(cudnn) if cudnn else "none",
        }
    xpu = getattr(torch, "xpu", None)
    try:
        xpu_count = xpu.device_count() if xpu is not None and xpu.is_available() else 0
    except Exception:
        xpu_count = 0
    if xpu is not None and xpu_count:
        found["xpu"] = {
            "count": xpu_count,
            "names": [xpu.get_device_name(i) for i in range(xpu_count)],
            "driver": str(getattr(xpu.get_device_properties(0), "driver_version", "unknown")),
            "runtime": str(getattr(torch.version, "xpu", None) or "unknown"),
        }
    return found


def environment_record(backends_used: Iterable[Any] = ()) -> dict[str, Any]:
    """Where this process runs, as JSON data.

    Host name, operating system, CPU model and flags, accelerators, and the versions of Python,
    torch, tunetree and of the libraries behind ``backends_used`` (kinds, backend objects or
    classes).

    Two records are equal exactly when a tuning measured in one holds in the other.
    """
    kinds = backend_kinds(backends_used)
    versions: dict[str, str] = {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "torch": str(torch.__version__),
        "tunetree": __version__,
    }
    for kind in kinds:
        for distribution in backend_libraries(kind):
            versions[distribution] = library_version(distribution)
    return {
        "host": socket.gethostname(),
        "os": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
        },
        "cpu": _cpu_info(),
        "accelerators": _accelerators(),
        "backends": kinds,
        "versions": versions,
    }


def with_libraries(record: dict[str, Any], libraries: Iterable[str]) -> dict[str, Any]:
    """``record`` with the versions of the distributions in ``libraries`` added (in place)."""
    for distribution in libraries:
        record["versions"][distribution] = library_version(distribution)
    return record


def flatten_record(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects as dotted entries, e.g. ``versions.torch``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):  # an empty one (no accelerators) adds no entry
            flat.update(flatten_record(value, name + "."))
        else:
            flat[name] = value
    return flat


@dataclass(frozen=True)
class Difference:
    """One entry whose tuned value differs from the running one (None: absent there)."""

    entry: str
    tuned: Any
    running: Any

    def __str__(self) -> str:
        if isinstance(self.tuned, list) and isinstance(self.running, list):
            only_tuned = sorted(set(map(str, self.tuned)) - set(map(str, self.running)))
            only_running = sorted(set(map(str, self.running)) - set(map(str, self.tuned)))
            if only_tuned or only_running:
                parts = []
                if only_tuned:
                    parts.append(f"tuned has {_short(only_tuned)} that running lacks")
                if only_running:
                    parts.append(f"running has {_short(only_running)} that tuned lacks")
                return f"{self.entry}: " + "; ".join(parts)
        return f"{self.entry}: tuned {_show(self.tuned)} vs running {_show(self.running)}"

    def to_json(self) -> dict[str, Any]:
        """This difference as JSON data."""
        return {"entry": self.entry, "tuned": self.tuned, "running": self.running}


def _short(items: list[str], limit: int = 12) -> str:
    more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
    return "[" + ", ".join(items[:limit]) + more + "]"


def _show(value: Any) -> str:
    return "(absent)" if value is None else repr(value)


def _ignored(entry: str, ignore: Iterable[str]) -> bool:
    return any(entry == name or entry.startswith(name + ".") for name in ignore)


def compare_records(
    tuned: Mapping[str, Any], running: Mapping[str, Any], ignore: Iterable[str] = ()
) -> list[Difference]:
    """Every entry that differs between two records, in a stable order.

    An entry of ``ignore`` waives itself and every entry below it (``"cpu"`` waives ``cpu.flags``).
    """
    ignore = tuple(ignore)
    a, b = flatten_record(tuned), flatten_record(running)
    return [
        Difference(entry, a.get(entry), b.get(entry))
        for entry in sorted(set(a) | set(b))
        if not _ignored(entry, ignore) and a.get(entry) != b.get(entry)
    ]


def unrecorded_libraries(record: Mapping[str, Any], kinds: Iterable[str]) -> list[str]:
    """``kind: library`` for every library a known backend of ``kinds`` needs that ``record`` lacks.

    A record edited to drop one would skip the version comparison.
    """
    versions = record.get("versions", {})
    recorded = set(record.get("backends", ()))
    missing = []
    for kind in sorted(set(kinds)):
        try:
            libraries = libraries_of(kind)
        except BackendUnavailableError:
            continue  # a kind this tunetree does not know is refused when it is rebuilt
        if kind not in recorded:
            missing.append(f"{kind}: the backend itself")
        missing += [f"{kind}: {lib}" for lib in libraries if lib not in versions]
    return missing
