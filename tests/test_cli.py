"""``tunetree info``: version, environment, comparison and plan, without loading weights."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tunetree as tt
from tunetree.checkpoint import loading
from tunetree.cli import EXIT_INCOMPATIBLE, EXIT_OK, EXIT_UNREADABLE, main

ROOT = Path(__file__).resolve().parents[1]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).eval()


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    result = tt.tune(
        _model(),
        [torch.randn(4, 8)],
        depth=1,
        strategy=tt.OneBackendStrategy(tt.backends.Eager()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
    )
    return tt.save(result, tmp_path / "model.tt")


def _set_host(path: Path, host: str) -> None:
    """Rewrite the record's host name (and re-bind the manifest to the new record)."""
    from tests.checkpoint.test_checkpoint import rewrite

    rewrite(path, lambda p: p.record.update(host=host))


def test_info_text(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(saved)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "format version: 1" in out
    assert f"torch {torch.__version__}" in out and "host: " in out
    assert "identical; the plan and its members pass every check tt.load makes" in out
    assert "members: verified: the weights against their SHA-256;" in out
    assert "plan (3 entries)" in out
    for path in ("0 ", "1 ", "2 "):
        assert f"\n{path}" in out
    assert "(f32[4,8])" in out and "eager" in out


def test_info_shows_the_plan_first_and_the_environment_condensed(
    saved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan comes before the environment record, which is one line per group with long
    lists counted (over a hundred CPU flags came before the plan); --verbose lists them."""
    assert main(["info", str(saved)]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.index("plan (3 entries)") < out.index("environment record")
    assert out.index("plan (3 entries)") < out.index("comparison with this environment")
    environment = out[out.index("environment record") :].splitlines()
    assert len(environment) <= 8 and all(len(line) < 200 for line in environment)
    assert "cpu.flags" not in out
    assert main(["info", str(saved), "--verbose"]) == EXIT_OK
    full = capsys.readouterr().out
    assert "cpu.flags: " in full and f"versions.torch: {torch.__version__}" in full
    assert full.index("plan (3 entries)") < full.index("cpu.flags")


def test_help_texts_name_the_real_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """``tunetree cache --dir`` said the default was ~/.cache; it is ~/.cache/tunetree (after
    $TUNETREE_CACHE_DIR and $XDG_CACHE_HOME/tunetree), as ``default_directory`` resolves it."""
    from tunetree.cache.tuning import default_directory

    with pytest.raises(SystemExit):
        main(["cache", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "$TUNETREE_CACHE_DIR, else $XDG_CACHE_HOME/tunetree, else ~/.cache/tunetree" in text
    assert "(default: $TUNETREE_CACHE_DIR or ~/.cache)" not in text
    for name in ("TUNETREE_CACHE_DIR", "XDG_CACHE_HOME"):
        assert name in (default_directory.__doc__ or "")
    from tunetree.search.auto import DEFAULT_TIME_BUDGET_S, QUICK_TIME_BUDGET_S

    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"{DEFAULT_TIME_BUDGET_S:g} s, or {QUICK_TIME_BUDGET_S:g} s with --quick" in text


def test_info_json(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(saved), "--json"]) == EXIT_OK
    info = json.loads(capsys.readouterr().out)
    assert info["format_version"] == 1 and info["compatible"] is True
    assert info["environment"]["versions"]["torch"] == torch.__version__
    assert [r["path"] for r in info["plan"]] == ["0", "1", "2"]
    assert {"graph", "backend", "latency_s"} <= set(info["plan"][0])
    assert info["depth"] == 1 and info["device"] == "cpu"


def test_info_other_environment(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _set_host(saved, "elsewhere")
    assert main(["info", str(saved)]) == EXIT_INCOMPATIBLE
    out = capsys.readouterr().out
    assert "1 differing entries" in out and "host: tuned 'elsewhere' vs running" in out
    assert main(["info", str(saved), "--json"]) == EXIT_INCOMPATIBLE
    info = json.loads(capsys.readouterr().out)
    assert info["compatible"] is False and info["differences"][0]["entry"] == "host"
    assert main(["info", str(saved), "--ignore", "host"]) == EXIT_OK


def test_info_unreadable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    legacy = tmp_path / "legacy.tt"
    with zipfile.ZipFile(legacy, "w") as archive:
        archive.writestr("x", "y")
    assert main(["info", str(legacy)]) == EXIT_UNREADABLE
    assert "67324752" in capsys.readouterr().err
    assert main(["info", str(legacy), "--json"]) == EXIT_UNREADABLE
    assert (
        "before tunetree checkpoints had a versioned header"
        in json.loads(capsys.readouterr().out)["error"]
    )
    assert main(["info", str(tmp_path / "missing.tt")]) == EXIT_UNREADABLE


def test_info_loads_no_weights(
    saved: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The weights member is read to verify its checksum, and its safetensors header read and
    checked (issue 29), as tt.load does; no tensor is made."""
    opened: list[str] = []
    real_open = zipfile.ZipFile.open

    def spy(self: zipfile.ZipFile, name: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(name.filename if isinstance(name, zipfile.ZipInfo) else name)
        return real_open(self, name, *args, **kwargs)

    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("info must not read weights")

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    monkeypatch.setattr(loading, "_apply_weights", forbidden)
    monkeypatch.setattr("safetensors.torch.load_file", forbidden)
    monkeypatch.setattr("safetensors.safe_open", forbidden)
    assert main(["info", str(saved)]) == EXIT_OK
    # read to verify its checksum, then its header (stored uncompressed: only its first bytes)
    assert opened == ["manifest.json", "weights.safetensors", "weights.safetensors"]


def test_directory_checkpoint_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tt.save(_model(), tmp_path / "ckpt", compress_checkpoint=False)
    assert main(["info", str(target)]) == EXIT_OK
    assert "plan (0 entries)" in capsys.readouterr().out


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == EXIT_UNREADABLE
    assert "info" in capsys.readouterr().out


@pytest.mark.parametrize("module", ["tunetree", "tunetree.cli"])
def test_module_entry_point(saved: Path, module: str) -> None:
    """``python -m tunetree`` is the command line (it failed: no ``__main__``)."""
    proc = subprocess.run(
        [sys.executable, "-m", module, "info", str(saved), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == EXIT_OK, proc.stderr
    assert json.loads(proc.stdout)["compatible"] is True


def test_info_names_the_autocast_check_only_the_model_can_make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An Autocast record listing three output dtypes for a one-output model: tt.load refuses
    it (it learns the module's outputs); info, which has no model, cannot count them and says
    so instead of implying the file was checked for it."""
    from tests.checkpoint.fixtures.make_fixtures import model
    from tests.checkpoint.hostile import as_recorded, autocast_file

    path = autocast_file(["f32", "f32", "f32"])(tmp_path / "a.tt")
    as_recorded(path, monkeypatch)
    with pytest.raises(tt.TunetreeError, match="3 output dtypes"):
        tt.load(model(), path)
    main(["info", str(path)])
    out = capsys.readouterr().out
    assert "left to tt.load" in out and "output count of 1 Autocast runner" in out
