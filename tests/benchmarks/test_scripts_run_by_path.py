"""Every benchmark script starts both ways: ``python benchmarks/x.py`` and ``python -m
benchmarks.x`` (the second is covered by the suite guard; here the first, from another
directory, so only the script's own bootstrap can make its imports work)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    str(p.relative_to(ROOT / "benchmarks"))
    for folder in ("", "investigations")
    for p in (ROOT / "benchmarks" / folder).glob("*.py")
    if "__main__" in p.read_text()
)


def test_the_scripts_are_found() -> None:
    assert {"suite.py", "investigations/bench_device_graph.py", "cache_speedup.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_runs_by_path(script: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_to_markdown_runs_by_path(tmp_path: Path) -> None:
    results = tmp_path / "suite.json"
    results.write_text(
        '{"results": [{"model": "mlp", "rows": [{"approach": "eager", "median_ms": 1.5}]}]}'
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "common" / "to_markdown.py"), str(results)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| mlp | **1.5** |" in proc.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_runs_as_a_module(script: str) -> None:
    module = "benchmarks." + script.removesuffix(".py").replace("/", ".")
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_the_readme_lists_every_suite_and_investigation() -> None:
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    for script in SCRIPTS:
        module = "benchmarks." + script.removesuffix(".py").replace("/", ".")
        assert f"python -m {module}" in readme, module


def test_the_readme_names_every_file_of_the_benchmarks() -> None:
    """Suites, investigations and helpers alike: nothing in benchmarks/ goes unexplained."""
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    files = [
        p.name
        for folder in ("", "investigations", "common")
        for p in (ROOT / "benchmarks" / folder).glob("*.py")
        if p.name != "__init__.py"
    ]
    assert "cycled.py" in files and "models.py" in files
    missing = [name for name in files if f"`{name}`" not in readme]
    assert not missing, missing
