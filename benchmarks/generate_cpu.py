"""Generation on the CPU: eager, tunetree and optimum-intel side by side on one saved model.

Run alone on the machine: ``python -m benchmarks.generate_cpu`` (the 12-layer d768
Llama-style model, 134M, vocabulary 32000), ``--model qwen2-0.5b`` (a 24-layer d896
Qwen2-style one, grouped queries, vocabulary 151936), ``--model tiny`` (2 layers d64, to
check the script). Random weights, saved with ``save_pretrained`` to a temporary directory
that every approach loads; greedy, ``--tokens`` new tokens (32; ``min_new_tokens`` equal, so
every approach generates as many), unseen prompts 1x37 and 4x61 (the second row left-padded).

Approaches, in this process: eager (dynamic cache); tunetree with ``generate`` as users call
it (``tt.auto_tune(model, prompts, call=lambda m, **x: m.generate(**x, **gen))``, dynamic
cache, tuned on other prompts: 1x20 and 2x29); ``--static``: tunetree on a static cache
(``cache_implementation="static", disable_compile=True``); ``--budget``: tunetree under
``AccuracyBudget(max_error=--max-error)`` (0.05 by default; changes results). In
optimum-intel's own environment (it pins an older transformers), in a process kept alive
beside this one (``benchmarks/optimum_intel_worker.py``): that environment's eager,
``OVModelForCausalLM.from_pretrained(dir, export=True)`` with the f32 hint, with the f32 hint
and an f32 KV cache (OpenVINO's CPU plugin holds the cache in 8 bits unless told otherwise,
whatever the hint: the script prints what each compiled model reports), with OpenVINO's
default precision (bf16 on a CPU with bf16 units) and with 8-bit and 4-bit weight-only
compression (NNCF's defaults). Every approach of both processes is called from one cycled
order (:mod:`benchmarks.common.cycled`), so all are timed under the same machine state; the
worker's calls are timed by the worker's clock and their tokens sent back as JSON to be
compared with eager's. That environment is ``--optimum-venv`` (default
:data:`OPTIMUM_VENV`); when it is missing the script builds it (torch 2.13.0, then
``optimum-intel[openvino,nncf]``, then torchvision removed: it fails to import there).
``--no-optimum`` skips it.

ms per new token is one whole ``generate`` call's median time over the new tokens (prefill
included), per prompt; ratios are against eager of the same process (optimum-intel's rows
also against its own environment's eager). The load average is printed before and after.
``--errors`` adds each approach's teacher-forced logit error against this process's eager
(rel_l2, the accuracy budget's default metric): every approach is fed eager's greedy tokens, so
optimum-intel's reduced precisions are judged as tunetree's budget judges its own.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import tunetree as tt
from tunetree._util.table import format_table

from .common.cycled import cycled_medians

OPTIMUM_VENV = Path("/root/.cache/tunetree-bench/optimum-intel-venv")
"""Where optimum-intel's own environment lives (``--optimum-venv``)."""
WORKER = Path(__file__).resolve().parent / "optimum_intel_worker.py"
UNSEEN = {"1x37": (1, 37), "4x61": (4, 61)}
TUNING = [(1, 20), (2, 29)]


def config(name: str) -> Any:
    """The model's config: ``llama-134m``, ``qwen2-0.5b`` or ``tiny``."""
    import transformers

    if name == "llama-134m":
        return transformers.LlamaConfig(
            vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
            num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048,
        )  # fmt: skip
    if name == "qwen2-0.5b":
        return transformers.Qwen2Config(
            vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
            num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
            tie_word_embeddings=True,
        )  # fmt: skip
    if name == "tiny":
        return transformers.LlamaConfig(
            vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        )  # fmt: skip
    raise SystemExit(f"unknown model {name!r}")


def prompt(vocab: int, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """Token ids and mask; with batch > 1 the second row is left-padded by a third."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, : length // 3] = 0
        ids[1, : length // 3] = 0
    return {"input_ids": ids, "attention_mask": mask}


def ensure_venv(venv: Path) -> Path:
    """optimum-intel's environment's Python, building the environment when missing."""
    python = venv / "bin" / "python"
    if python.exists():
        return python
    print(f"building optimum-intel's environment at {venv} (minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # first: optimum-intel would pull another
    subprocess.run([*pip, "optimum-intel[openvino,nncf]"], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision"], check=False)
    return python


class OptimumWorker:
    """optimum-intel's approaches in their own environment's process, called one at a time.

    Started with the request (directory, prompts, generate's keywords); each call runs one
    ``generate`` there and returns the seconds measured there and the tokens.
    """

    def __init__(
        self, python: Path, directory: str, prompts: dict, gen: dict, only: Sequence[str] = ()
    ) -> None:
        request = {
            "model_dir": directory,
            "prompts": {n: {k: v.tolist() for k, v in p.items()} for n, p in prompts.items()},
            "gen": gen,
            "approaches": list(only),
        }
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(request, f)
        self._request = f.name
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
        self._process = subprocess.Popen(
            [str(python), str(WORKER), f.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        ready = self._answer()
        self.approaches: list[str] = ready["loaded"]
        self.load_s: dict[str, float] = ready["load_s"]
        self.failed: dict[str, str] = ready["failed"]
        self.kv_cache: dict[str, str] = ready.get("kv_cache", {})
        """The KV cache precision each of its compiled models reports."""

    def _answer(self) -> dict:
        """The worker's next JSON line (anything else it prints is skipped)."""
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"optimum-intel worker ended (exit {self._process.wait()})")

    def run(self, approach: str, prompt: str) -> tuple[float, list]:
        """One ``generate`` of ``approach`` on ``prompt`` there: its seconds and tokens."""
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"approach": approach, "prompt": prompt}) + "\n")
        self._process.stdin.flush()
        answer = self._answer()
        return float(answer["s"]), answer["tokens"]

    def teacher_forced(self, approach: str, prompt: str, tokens: torch.Tensor) -> torch.Tensor:
        """``approach``'s teacher-forced logits there (see the worker's docstring)."""
        import numpy as np

        assert self._process.stdin is not None
        with tempfile.TemporaryDirectory(prefix="tunetree-tf-") as work:
            out = os.path.join(work, "logits.npy")
            asked = {"approach": approach, "prompt": prompt, "tokens": tokens.tolist(), "out": out}
            self._process.stdin.write(json.dumps(asked) + "\n")
            self._process.stdin.flush()
            self._answer()
            return torch.from_numpy(np.load(out))

    def close(self) -> None:
        """End the worker and remove its request file."""
        if self._process.stdin is not None:
            self._process.stdin.write("\n")
            self._process.stdin.close()
        self._process.wait(timeout=120)
        os.unlink(self._request)


class Remote:
    """A worker's approach as a callable for :func:`cycled_medians`, keeping the worker's times."""

    def __init__(self, worker: OptimumWorker, approach: str, prompt: str) -> None:
        self.worker, self.approach, self.prompt = worker, approach, prompt
        self.seconds: list[float] = []

    def __call__(self) -> list:
        seconds, tokens = self.worker.run(self.approach, self.prompt)
        self.seconds.append(seconds)
        return tokens


def equal_share(a: list, b: torch.Tensor) -> float:
    """Share of rows whose tokens equal eager's."""
    other = torch.tensor(a)
    if other.shape != b.shape:
        return 0.0
    return float((other == b).all(dim=1).float().mean())


def table(
    rows: dict[str, dict[str, tuple[float, float]]],
    prompts: list[str],
    setup_s: dict[str, float],
    n: int,
    model: str,
) -> str:
    """The side-by-side table: ms per new token, ratios against eager, rows equal to eager's."""
    lines = []
    for a, per in rows.items():
        cells = [a]
        cells += [f"{1000 * per.get(p, (float('nan'), 0))[0] / n:.2f}" for p in prompts]
        for name in prompts:
            s = per.get(name, (float("nan"), 0.0))[0]
            extra = ""
            if a.startswith("optimum") and "eager (optimum env)" in rows:
                extra = f" ({rows['eager (optimum env)'][name][0] / s:.2f}x own eager)"
            cells.append(f"{rows['eager'][name][0] / s:.2f}x{extra}")
        cells.append(" / ".join(f"{100 * per[p][1]:.0f}%" for p in prompts if p in per))
        cells.append(f"{setup_s[a]:.0f} s" if a in setup_s else "-")
        lines.append(cells)
    headers = [
        "approach",
        *(f"ms/token {p}" for p in prompts),
        *(f"vs eager {p}" for p in prompts),
        "rows = eager",
        "tune/load",
    ]
    return format_table(headers, lines, title=f"{model}, {n} new tokens, greedy, unseen prompts")


def forced_errors(
    model: Any,
    approaches: dict[str, Any],
    prompts: dict[str, dict[str, torch.Tensor]],
    gen: dict,
    worker: OptimumWorker | None,
) -> dict[str, dict[str, float]]:
    """Per approach and prompt: the teacher-forced logits' rel_l2 against this process's eager.

    Every approach is fed eager's greedy tokens (the prompt, then each new token), so all are
    judged on the same sequences, as tunetree's accuracy budget judges its configs; the error is
    over the prompt's unpadded positions and every new one (a padded position's logits are not
    read by ``generate``, and runtimes differ there).
    """
    from tunetree.generation.stateful_check import teacher_forced

    errors: dict[str, dict[str, float]] = {}
    for name, inputs in prompts.items():
        with torch.no_grad():
            tokens = model.generate(**inputs, **gen)[:, inputs["input_ids"].shape[1] :]
        reference = teacher_forced(model, inputs, tokens)
        valid = torch.cat([inputs["attention_mask"], torch.ones_like(tokens[:, 1:])], 1).bool()
        found = {a: teacher_forced(e[0] if isinstance(e, tuple) else e, inputs, tokens)
                 for a, e in approaches.items() if a != "eager"}  # fmt: skip
        for a in worker.approaches if worker is not None else ():
            found[a] = worker.teacher_forced(a, name, tokens)
        for a, logits in found.items():
            if logits.shape != reference.shape:
                errors.setdefault(a, {})[name] = float("nan")
                continue
            diff = (logits - reference)[valid].double().norm()
            errors.setdefault(a, {})[name] = float(diff / reference[valid].double().norm())
    return errors


def timed_rows(
    model: Any,
    approaches: dict[str, Any],
    prompts: dict[str, dict[str, torch.Tensor]],
    gen: dict,
    worker: OptimumWorker | None,
    rounds: int,
) -> dict[str, dict[str, tuple[float, float]]]:
    """Per approach and prompt: median seconds of one ``generate`` and the share of eager rows.

    This process's approaches (a model, or ``(model, generate's keywords)``) and the worker's
    are called from one cycled order; the worker's calls are timed by its own clock.
    """

    def runner(entry: Any, inputs: dict) -> Any:
        m, kwargs = entry if isinstance(entry, tuple) else (entry, gen)
        return lambda: m.generate(**inputs, **kwargs)

    rows: dict[str, dict[str, tuple[float, float]]] = {}
    for name, inputs in prompts.items():
        with torch.no_grad():
            eager = model.generate(**inputs, **gen)
            calls: dict[str, Any] = {a: runner(e, inputs) for a, e in approaches.items()}
            remote: dict[str, Remote] = {}
            if worker is not None:
                remote = {a: Remote(worker, a, name) for a in worker.approaches}
            tokens = {a: fn().tolist() for a, fn in calls.items()}
            tokens.update({a: fn() for a, fn in remote.items()})
            seconds = cycled_medians({**calls, **remote}, rounds)
        for a, there in remote.items():  # the worker's own clock; its first call warmed up
            seconds[a] = statistics.median(there.seconds[-rounds:])
        for a in seconds:
            rows.setdefault(a, {})[name] = (seconds[a], equal_share(tokens[a], eager))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama-134m")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--static", action="store_true", help="also the static-cache recipe")
    parser.add_argument("--budget", action="store_true", help="also AccuracyBudget(--max-error)")
    parser.add_argument("--max-error", type=float, default=0.05, help="the budget's max_error")
    parser.add_argument("--no-optimum", action="store_true")
    parser.add_argument("--optimum-venv", type=Path, default=OPTIMUM_VENV)
    parser.add_argument(
        "--optimum-approaches",
        default="",
        help="optimum-intel rows to load, separated by ';' (default: all), e.g. "
        "'eager (optimum env);optimum-intel f32;optimum-intel f32, f32 KV cache'",
    )
    parser.add_argument("--time-budget", type=float, default=None, help="auto_tune's budget")
    parser.add_argument(
        "--errors",
        action="store_true",
        help="also every approach's teacher-forced logit error against eager (rel_l2)",
    )
    args = parser.parse_args()
    print("load average before:", os.getloadavg(), flush=True)
    import transformers

    torch.manual_seed(0)
    cfg = config(args.model)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    directory = tempfile.mkdtemp(prefix="tunetree-gen-cpu-")
    model.save_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    n = args.tokens
    gen = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    prompts = {
        name: prompt(cfg.vocab_size, batch, length, seed=i)
        for i, (name, (batch, length)) in enumerate(UNSEEN.items())
    }
    tuning = [prompt(cfg.vocab_size, *shape, seed=100 + i) for i, shape in enumerate(TUNING)]

    def call(m: Any, **x: Any) -> Any:
        return m.generate(**x, **gen)

    approaches: dict[str, Any] = {"eager": model}
    setup_s: dict[str, float] = {}
    budget: Any = "default" if args.time_budget is None else args.time_budget
    start = time.perf_counter()
    tuned = tt.auto_tune(model, tuning, call=call, verbose=False, time_budget=budget, cache=False)
    setup_s["tunetree usual call"] = time.perf_counter() - start
    print(tuned, flush=True)
    approaches["tunetree usual call"] = tuned.model
    if args.static:
        static = dict(gen, cache_implementation="static", disable_compile=True)
        start = time.perf_counter()
        result = tt.auto_tune(
            model, tuning, call=lambda m, **x: m.generate(**x, **static), verbose=False,
            time_budget=budget, cache=False,
        )  # fmt: skip
        setup_s["tunetree static-cache recipe"] = time.perf_counter() - start
        approaches["tunetree static-cache recipe"] = (result.model, static)
    if args.budget:
        start = time.perf_counter()
        result = tt.auto_tune(
            model, tuning, call=call, verbose=False, time_budget=budget, cache=False,
            accuracy=tt.AccuracyBudget(max_error=args.max_error),
        )  # fmt: skip
        name = f"tunetree AccuracyBudget({args.max_error:g})"
        setup_s[name] = time.perf_counter() - start
        print(result, flush=True)
        approaches[name] = result.model

    worker = None
    if not args.no_optimum:
        only = [a.strip() for a in args.optimum_approaches.split(";") if a.strip()]
        worker = OptimumWorker(ensure_venv(args.optimum_venv), directory, prompts, gen, only)
        setup_s.update(worker.load_s)
    errors: dict[str, dict[str, float]] = {}
    try:
        rows = timed_rows(model, approaches, prompts, gen, worker, args.rounds)
        if args.errors:
            errors = forced_errors(model, approaches, prompts, gen, worker)
    finally:
        if worker is not None:
            worker.close()
    print(table(rows, list(prompts), setup_s, n, args.model))
    if errors:
        print(
            format_table(
                ["approach", *(f"rel_l2 {p}" for p in prompts)],
                [
                    [a, *(f"{e.get(p, float('nan')):.4f}" for p in prompts)]
                    for a, e in errors.items()
                ],
                title="teacher-forced logit error against eager (eager's tokens fed to all)",
            )
        )
    for a, reason in (worker.failed if worker else {}).items():
        print(f"{a}: failed to load ({reason})")
    for a, precision in (worker.kv_cache if worker else {}).items():
        print(f"{a}: KV cache held as {precision}")
    forward = getattr(tuned.model, "forward", None)
    counts = getattr(forward, "counts", None)
    if counts is not None:
        print(
            f"tunetree usual call: {counts.served} forwards served, {counts.original} ran "
            f"the original forward ({dict(counts.reasons)})"
        )
    print("load average after:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
