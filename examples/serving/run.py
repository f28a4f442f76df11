"""A tuned model behind a real HTTP server, checked and timed against the untuned one.

1. Save a small BERT encoder as a Hugging Face directory and tune it (ONNX Runtime over the
   whole model, ranges over batch and length), saved as ``bert.tt`` (``tunetree tune`` writes
   the same file from the shell).
2. Start ``server.py`` (FastAPI on uvicorn) in a subprocess on a free port: it loads the
   checkpoint at start-up, checking every runner against eager.
3. Send concurrent requests from several client threads (a real HTTP client, urllib), check
   every answer against eager's outputs, and time them (p50, p99); the same against a server
   of the untuned model. Prints start-up times and latencies side by side.

Run: python examples/serving/run.py [--requests 24] [--threads 4]
Needs ``pip install "tunetree[serve,hf,onnx]"``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import tunetree as tt

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VOCAB = 1000


def save_encoder(directory: Path) -> Path:
    """A 2-layer BERT with random weights, written by ``save_pretrained``."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    transformers.BertModel(config).eval().save_pretrained(directory)
    return directory


def request(batch: int, length: int, seed: int) -> dict[str, list[list[int]]]:
    """One request's body: token ids, the last row of a batch padded on the right."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[-1, length // 2 :] = 0
        ids[-1, length // 2 :] = 0
    return {"input_ids": ids.tolist(), "attention_mask": mask.tolist()}


def tune_encoder(model_dir: Path, out: Path) -> Path:
    """Tune the encoder over batch 1-4 and length 8-32 and save it to ``out``."""
    import transformers

    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    calls = [request(b, n, seed=b * 100 + n) for b, n in ((1, 8), (2, 16), (4, 32))]
    data = [{k: torch.tensor(v) for k, v in c.items()} for c in calls]
    result = tt.tune(
        model,
        data,
        depth=0,
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
    )
    return tt.save(result, out)


def free_port() -> int:
    """A TCP port nothing listens on now (the server binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    """One server's run: start-up time, per-request latencies and answers."""

    startup_s: float
    ready_s: float
    latencies_s: list[float] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the latencies (0.5: p50, 0.99: p99)."""
        return statistics.quantiles(self.latencies_s, n=100, method="inclusive")[round(q * 100) - 1]


def _get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def _post(url: str, body: dict[str, Any]) -> tuple[float, Any]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as response:
        answer = json.loads(response.read())
    return time.perf_counter() - start, answer


def serve_and_query(
    model_dir: Path,
    checkpoint: Path | None,
    bodies: list[dict[str, Any]],
    threads: int,
    ready_timeout_s: float = 300.0,
) -> Served:
    """Start a server (tuned from ``checkpoint``, or eager when None), send ``bodies`` from
    ``threads`` client threads at once, stop it; the answers come back in ``bodies``' order."""
    port = free_port()
    command = [sys.executable, str(HERE / "server.py"), "--model-dir", str(model_dir)]
    command += ["--port", str(port)]
    command += ["--checkpoint", str(checkpoint)] if checkpoint else ["--eager"]
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    # The server's output goes to a file, not a pipe: a chatty server never blocks on it.
    with tempfile.TemporaryFile("w+") as log:
        launched = time.perf_counter()
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            health = _wait_ready(f"http://127.0.0.1:{port}/health", server, log, ready_timeout_s)
            served = Served(startup_s=health["startup_s"], ready_s=time.perf_counter() - launched)
            url = f"http://127.0.0.1:{port}/embed"
            with ThreadPoolExecutor(threads) as pool:
                for latency, answer in pool.map(lambda body: _post(url, body), bodies):
                    served.latencies_s.append(latency)
                    served.answers.append(answer)
            return served
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _wait_ready(url: str, server: subprocess.Popen[bytes], log: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the server exited ({server.returncode}): {log.read()[-3000:]}")
        try:
            health = _get(url, timeout=2.0)
            if health.get("ready"):
                return health
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the server was not ready after {timeout_s:.0f} s")


def check_answers(model_dir: Path, bodies: list[dict[str, Any]], answers: list[Any]) -> float:
    """Every answer against the untuned model's outputs, in this process; the largest diff."""
    import transformers

    eager = transformers.AutoModel.from_pretrained(model_dir).eval()
    worst = 0.0
    with torch.inference_mode():
        for body, answer in zip(bodies, answers, strict=True):
            inputs = {k: torch.tensor(v) for k, v in body.items()}
            expected = eager(**inputs).last_hidden_state
            got = torch.tensor(answer["last_hidden_state"])
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
            worst = max(worst, float((got - expected).abs().max()))
    return worst


def mixed_requests(count: int) -> list[dict[str, Any]]:
    """Requests of batch 1-4 and length 8-32, shapes the tuning never saw among them."""
    shapes = [(1, 8), (2, 16), (4, 32), (3, 11), (1, 27), (2, 9)]
    return [request(*shapes[i % len(shapes)], seed=1000 + i) for i in range(count)]


def main(argv: list[str] | None = None) -> int:
    """Tune, serve tuned and eager, check every answer and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tunetree-serving-") as tmp:
        model_dir = save_encoder(Path(tmp) / "bert")
        checkpoint = tune_encoder(model_dir, Path(tmp) / "bert.tt")
        bodies = mixed_requests(args.requests)
        tuned = serve_and_query(model_dir, checkpoint, bodies, args.threads)
        eager = serve_and_query(model_dir, None, bodies, args.threads)
        diff = check_answers(model_dir, bodies, tuned.answers)
        check_answers(model_dir, bodies, eager.answers)
    print(
        f"{args.requests} requests from {args.threads} threads; every answer matches eager "
        f"(tuned: max abs diff {diff:.2g})"
    )
    print(f"{'server':8} {'start-up':>9} {'ready':>8} {'p50':>9} {'p99':>9}")
    for name, served in (("tuned", tuned), ("eager", eager)):
        print(
            f"{name:8} {served.startup_s:8.2f}s {served.ready_s:7.2f}s "
            f"{served.quantile(0.5) * 1e3:7.2f}ms {served.quantile(0.99) * 1e3:7.2f}ms"
        )
    print(f"p50 eager/tuned: {eager.quantile(0.5) / tuned.quantile(0.5):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
