"""``examples/serving``: a real HTTP server (FastAPI on uvicorn, in a subprocess on a free
port) loads a tuned checkpoint at start-up and serves concurrent requests from a real HTTP
client; every answer is checked against eager, and latency and start-up are reported beside
an untuned server's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[1]


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("serving_run", ROOT / "examples/serving/run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["serving_run"] = module
    spec.loader.exec_module(module)
    return module


def test_a_tuned_model_behind_a_real_server_answers_concurrent_requests_as_eager(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _example()
    model_dir = run.save_encoder(tmp_path / "bert")
    checkpoint = run.tune_encoder(model_dir, tmp_path / "bert.tt")
    from tunetree.checkpoint import read_info

    plan = read_info(checkpoint).plan_rows()  # the server serves a runner, not eager
    assert [row["backend"] for row in plan] == ["onnxruntime"]
    bodies = run.mixed_requests(16)  # shapes inside and outside the tuned ranges
    tuned = run.serve_and_query(model_dir, checkpoint, bodies, threads=4)
    eager = run.serve_and_query(model_dir, None, bodies, threads=4)
    assert len(tuned.answers) == len(eager.answers) == len(bodies)
    run.check_answers(model_dir, bodies, tuned.answers)
    run.check_answers(model_dir, bodies, eager.answers)
    assert tuned.startup_s > 0 and tuned.ready_s >= tuned.startup_s * 0.5
    with capsys.disabled():  # the numbers, as the README quotes them (not asserted: speed)
        for name, served in (("tuned", tuned), ("eager", eager)):
            print(
                f"\n{name}: start-up {served.startup_s:.2f} s, ready {served.ready_s:.2f} s, "
                f"p50 {served.quantile(0.5) * 1e3:.2f} ms, p99 {served.quantile(0.99) * 1e3:.2f} ms"
            )
