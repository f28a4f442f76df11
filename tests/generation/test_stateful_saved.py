"""A model generate serves whole (a stateful OpenVINO model) saves, loads, and is checked."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("openvino")

import tunetree as tt  # noqa: E402
from tunetree.candidates.measure import Timing  # noqa: E402
from tunetree.checkpoint import read_info, writer  # noqa: E402
from tunetree.checkpoint.format import MANIFEST  # noqa: E402
from tunetree.cli import main  # noqa: E402
from tunetree.errors import CheckpointError, IncompatibleCheckpointError  # noqa: E402
from tunetree.generation import stateful_saved, stateful_trial  # noqa: E402
from tunetree.generation.choosing import UNTUNED  # noqa: E402
from tunetree.generation.stateful import StatefulConfig, export_whole, stateful_model  # noqa: E402
from tunetree.generation.stateful_forward import is_stateful_forward  # noqa: E402
from tunetree.generation.stateful_trial import try_stateful  # noqa: E402
from tunetree.signature.graph import Sample  # noqa: E402

GEN = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
SMALL = dict(
    vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
)  # fmt: skip


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**SMALL)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _prompt(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, : length // 3] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path, Path]:
    """The model, and its stateful model saved as a .tt file and as a directory."""
    model = _model()
    tuned = stateful_model(model)
    root = tmp_path_factory.mktemp("saved")
    return (
        model,
        tt.save(tuned, root / "model.tt"),
        tt.save(tuned, root / "model-dir", compress_checkpoint=False),
    )


def test_a_stateful_model_saves_and_loads_serving_eagers_tokens_without_the_original_forward(
    saved: tuple[torch.nn.Module, Path, Path],
) -> None:
    model, path, _ = saved
    fresh = _model(seed=1)  # other weights: the file's replace them
    loaded = tt.load(fresh, path)
    assert is_stateful_forward(loaded) and not is_stateful_forward(fresh)
    assert loaded.forward.counts.original == 0 and loaded.forward.counts.served == 0
    for batch, length in [(1, 3), (4, 23)]:
        prompt = _prompt(batch, length, seed=batch)
        assert torch.equal(loaded.generate(**prompt, **GEN), model.generate(**prompt, **GEN))
    assert loaded.forward.counts.original == 0
    record = json.loads(_manifest_text(path))["whole"]
    assert record["kind"] == "openvino-stateful" and record["config"]["precision"] == "f32"
    info = read_info(path)
    assert info.compatible and info.manifest.whole is not None


def _manifest_text(path: Path) -> str:
    import zipfile

    from tunetree.checkpoint.reader import read_header

    header = read_header(path)
    with zipfile.ZipFile(path) as archive:
        assert header.archive_offset > 0
        return archive.read(MANIFEST).decode()


def test_the_file_holds_weights_and_a_record_no_runtime_model_and_pins_the_libraries(
    saved: tuple[torch.nn.Module, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, path, directory = saved
    assert main(["info", str(path)]) == 0
    assert "served whole by: openvino-stateful" in capsys.readouterr().out
    files = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*"))
    assert files == ["environment.json", "manifest.json", "tunetree-format", "weights.safetensors"]
    record = json.loads((directory / "environment.json").read_text())
    assert {"openvino", "transformers", "torch"} <= set(record["versions"])
    assert "openvino" in record["backends"]


def _edited(directory: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(directory, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    edit(manifest["whole"])
    (copy / MANIFEST).write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        (lambda w: w["config"].update(precision="f64"), CheckpointError, "not valid"),
        (lambda w: w["config"].update(extra=1), CheckpointError, "not valid"),
        (lambda w: w["config"].update(weights="int8"), CheckpointError, "no accuracy budget"),
        (lambda w: w.update(kind="os.system"), IncompatibleCheckpointError, "does not rebuild"),
        (lambda w: w["config"].update(max_length=[1] * 9), CheckpointError, "config"),
        (
            lambda w: w.update(accuracy={"metric": "x" * 999, "max_error": 1, "error": 0}),
            CheckpointError,
            "longer",
        ),
    ],
)
def test_an_altered_record_is_refused_typed_before_anything_is_built(
    saved: tuple[torch.nn.Module, Path, Path], tmp_path: Path, monkeypatch, edit, error, match
) -> None:
    _, _, directory = saved

    def no_export(model):
        raise AssertionError("exported from a record that should have been refused")

    monkeypatch.setattr(stateful_saved, "export_whole", no_export)
    with pytest.raises(error, match=match):
        tt.load(_model(), _edited(directory, tmp_path, edit))


def test_a_rebuilt_runner_that_computes_another_model_is_refused(
    saved: tuple[torch.nn.Module, Path, Path], monkeypatch
) -> None:
    _, path, _ = saved
    other = _model(seed=7)
    monkeypatch.setattr(stateful_saved, "export_whole", lambda model: export_whole(other))
    with pytest.raises(CheckpointError, match="does not match eager"):
        tt.load(_model(), path)


def test_the_plan_loader_without_rebuilders_refuses_it_typed(
    saved: tuple[torch.nn.Module, Path, Path],
) -> None:
    from tunetree.checkpoint import load

    with pytest.raises(IncompatibleCheckpointError, match=r"tunetree\.load"):
        load(_model(), saved[1])


def test_a_killed_save_leaves_the_previous_file_loadable(
    saved: tuple[torch.nn.Module, Path, Path], tmp_path: Path, monkeypatch
) -> None:
    model, path, _ = saved
    target = tmp_path / "model.tt"
    shutil.copy(path, target)
    before = target.read_bytes()

    def killed(tmp, destination):
        raise KeyboardInterrupt  # the process dies after writing, before the rename

    monkeypatch.setattr(writer, "install", killed)
    with pytest.raises(KeyboardInterrupt):
        tt.save(stateful_model(_model(seed=3)), target)
    monkeypatch.undo()
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.tt"]
    loaded = tt.load(_model(seed=1), target)
    prompt = _prompt(1, 4)
    assert torch.equal(loaded.generate(**prompt, **GEN), model.generate(**prompt, **GEN))


def _timings(fastest: str) -> Any:
    """A fake measurement: ``fastest`` weights first, every tuned model beats the untuned one."""

    def seconds(name: str) -> float:
        return 1.0 if name == UNTUNED else 0.1 if f"{fastest}-weights" in name else 0.5

    def timings(models: dict) -> dict[str, Timing]:
        return {name: Timing(seconds(name), 1, 1, 1, 3, 1) for name in models}

    return timings


@pytest.mark.parametrize("weights", ["int8-channel", "int8", "int4"])
def test_a_budget_plan_saves_loads_and_is_reported_as_changing_results(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, weights: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if weights == "int8":  # groups are built only where per channel fails; here build them anyway
        monkeypatch.setattr(stateful_trial, "superseded", lambda trial, trials: None)
    model = _model()
    samples = [Sample((), _prompt(1, 6, 1)), Sample((), _prompt(2, 9, 2))]

    def call(m, **x):
        return m.generate(**x, **GEN)

    budget = tt.AccuracyBudget(max_error=0.5)
    trials = try_stateful(model, samples, call, _timings(weights), accuracy=budget)
    chosen = next(t for t in trials if t.chosen)
    assert chosen.config == StatefulConfig(weights=weights)
    path = tt.save(chosen.model, tmp_path / f"{weights}.tt")
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        loaded = tt.load(_model(seed=1), path)
    assert any("CHANGES RESULTS" in r.getMessage() for r in caplog.records)
    record = loaded.forward.checkpoint_record()
    assert record["config"]["weights"] == weights
    assert record["accuracy"]["max_error"] == 0.5 and record["accuracy"]["metric"] == "rel_l2"
    out = loaded.generate(**_prompt(3, 20, seed=9), **GEN)
    assert out.shape == (3, 26) and loaded.forward.counts.original == 0
