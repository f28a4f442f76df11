"""Generation on the CPU: eager, tunetree and optimum-intel side by side on one saved model.

Run alone on the machine: ``python -m benchmarks.generate_cpu`` (the 12-layer d768
Llama-style model, 134M, vocabulary 32000), ``--model qwen2-0.5b`` (a 24-layer d896
Qwen2-style one, grouped queries, vocabulary 151936), ``--model tiny`` (2 layers d64, to
check the script). Random weights, saved with ``save_pretrained`` to the work directory
that every approach loads; greedy, ``--tokens`` new tokens (32; ``min_new_tokens`` equal, so
every approach generates as many), unseen prompts 1x37 and 4x61 (the second row left-padded).

Approaches: eager (dynamic cache); tunetree with ``generate`` as users call it
(``tt.auto_tune(model, prompts, call=lambda m, **x: m.generate(**x, **gen))``, dynamic cache,
tuned on other prompts: 1x20 and 2x29); ``--static``: tunetree on a static cache
(``cache_implementation="static", disable_compile=True``); ``--budget``: tunetree under
``AccuracyBudget(max_error=--max-error)`` (0.05 by default; changes results); and
optimum-intel's (``--optimum-approaches``): that environment's eager,
``OVModelForCausalLM.from_pretrained(dir, export=True)`` with the f32 hint, with the f32 hint
and an f32 KV cache (OpenVINO's CPU plugin holds the cache in 8 bits unless told otherwise,
whatever the hint: the script prints what each compiled model reports), with OpenVINO's
default precision (bf16 on a CPU with bf16 units) and with 8-bit and 4-bit weight-only
compression (NNCF's defaults). optimum-intel pins an older transformers, so its approaches run
in its own environment, ``--optimum-venv`` (default :data:`OPTIMUM_VENV`; built when missing:
torch 2.13.0, then ``optimum-intel[openvino,nncf]``, then torchvision removed: it fails to
import there). ``--no-optimum`` skips them.

Each approach is timed alone in its own fresh process. This process tunes once (each tuned
approach is saved with ``tt.save`` into the work directory, ``--work``; a run given a work
directory that already holds the model and the ``.tt`` files reuses them instead of tuning;
``--tune-only`` stops after the tuning),
then starts one worker per approach, one at a time, each holding only that approach: this
file with ``--serve`` (eager, or ``tt.load`` of its ``.tt`` file) or
``benchmarks/optimum_intel_worker.py`` in optimum-intel's environment (one approach each). Both
answer the same protocol: one JSON line per ``generate`` asked on stdin, timed in the worker.
The workers' calls are made from one cycled order (:mod:`benchmarks.common.cycled`: every
round runs each approach once, the order rotating, A B C, B C A, ...), so all are timed under
the same machine state and none always follows the same one; the tokens are compared with
eager's (generated here).

ms per new token is one whole ``generate`` call's median time over ``--rounds`` rounds, over
the new tokens (prefill included), per prompt; ratios are against eager's worker
(optimum-intel's rows also against its own environment's eager when that row is asked). The
spread (fastest and slowest round) is printed below the table, and the load average before
tuning, before timing and at the end. ``--processes K`` starts every worker K times over the
run (all closed and started again after each share of the rounds; the medians are over every
round): on the 2-core machines one process's decode steps ran 10-20% apart from the next one's
of the same approach (cause not found), a difference that one worker per
approach keeps for the whole run. ``--split`` also times each approach's one-token
``generate`` on each prompt in the same cycled rounds, and prints it beside the decode steps'
own ms per token (the whole call less that one, over the other new tokens), so a gap shows
whether it is in the prefill or in the steps. ``--errors`` adds each approach's teacher-forced logit
error against eager's logits computed here (rel_l2, the accuracy budget's default metric):
every approach is fed eager's greedy tokens, so optimum-intel's reduced precisions are judged
as tunetree's budget judges its own.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import argparse
import gc
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
from .optimum_intel_worker import new_tokens

OPTIMUM_VENV = Path("/root/.cache/tunetree-bench/optimum-intel-venv")
"""Where optimum-intel's own environment lives (``--optimum-venv``)."""
WORKER = Path(__file__).resolve().parent / "optimum_intel_worker.py"
OPTIMUM_APPROACHES = (
    "eager (optimum env)", "optimum-intel f32", "optimum-intel f32, f32 KV cache",
    "optimum-intel default", "optimum-intel int8 weights", "optimum-intel int4 weights",
)  # fmt: skip
"""optimum-intel's worker's approaches, in its order (each in a worker of its own)."""
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


class Worker:
    """One process that holds one approach (or several, for optimum-intel's worker given none).

    Started on a JSON request file (the saved model's directory, the prompts as token ids and
    masks, generate's keywords, the approaches to load); each call runs one ``generate`` there
    and returns the seconds measured there and the tokens. The protocol is
    ``benchmarks/optimum_intel_worker.py``'s, which :func:`serve` answers too.
    """

    def __init__(self, command: Sequence[str], request: dict) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(request, f)
        self._request = f.name
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
        self._process = subprocess.Popen(
            [*command, f.name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        ready = self._answer()
        self.approaches: list[str] = ready["loaded"]
        self.load_s: dict[str, float] = ready["load_s"]
        self.failed: dict[str, str] = ready["failed"]
        self.kv_cache: dict[str, str] = ready.get("kv_cache", {})
        """The KV cache precision each of its compiled models reports."""
        self.notes: dict[str, str] = ready.get("notes", {})
        """What the worker says about each loaded approach (tunetree's: its runners)."""

    def _answer(self) -> dict:
        """The worker's next JSON line (anything else it prints is skipped)."""
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"worker ended (exit {self._process.wait()})")

    def _ask(self, asked: dict) -> dict:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(asked) + "\n")
        self._process.stdin.flush()
        return self._answer()

    def run(self, approach: str, prompt: str, new: int | None = None) -> tuple[float, list]:
        """One ``generate`` of ``approach`` on ``prompt`` there: its seconds and tokens.

        ``new``: that many new tokens instead of the request's.
        """
        asked: dict[str, Any] = {"approach": approach, "prompt": prompt}
        if new is not None:
            asked["new"] = new
        answer = self._ask(asked)
        return float(answer["s"]), answer["tokens"]

    def teacher_forced(self, approach: str, prompt: str, tokens: torch.Tensor) -> torch.Tensor:
        """``approach``'s teacher-forced logits there (see the worker's docstring)."""
        import numpy as np

        with tempfile.TemporaryDirectory(prefix="tunetree-tf-") as work:
            out = os.path.join(work, "logits.npy")
            self._ask(
                {"approach": approach, "prompt": prompt, "tokens": tokens.tolist(), "out": out}
            )
            return torch.from_numpy(np.load(out))

    def close(self) -> None:
        """End the worker and remove its request file."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.write("\n")
            self._process.stdin.close()
        self._process.wait(timeout=120)
        os.unlink(self._request)


def serve(request_path: str) -> None:
    """A worker of this environment: eager, or one tuned approach loaded from its ``.tt`` file.

    The request names one approach, its ``checkpoint`` (none for eager) and its ``gen``
    keywords; it answers as ``benchmarks/optimum_intel_worker.py`` does (teacher-forced logits
    by :func:`tunetree.generation.stateful_check.teacher_forced`).
    """
    import numpy as np
    import transformers

    from tunetree.generation.stateful_check import teacher_forced

    request = json.loads(Path(request_path).read_text())
    name, checkpoint, gen = request["approach"], request.get("checkpoint"), request["gen"]
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(request["model_dir"]).eval()
    if checkpoint:  # a plan tuned under taskset (--tune-only on one core) records one core
        model = tt.load(model, checkpoint, ignore=("cpu.logical_cores",))
    load_s = time.perf_counter() - start
    forward = getattr(model, "forward", None)
    note = type(getattr(forward, "runner", None)).__name__ if checkpoint else ""
    ready = {"loaded": [name], "load_s": {name: load_s}, "failed": {}, "notes": {name: note}}
    print(json.dumps(ready), flush=True)
    prompts = {n: {k: torch.tensor(v) for k, v in p.items()} for n, p in request["prompts"].items()}
    for line in sys.stdin:
        if not line.strip():
            break
        asked = json.loads(line)
        inputs = prompts[asked["prompt"]]
        if "tokens" in asked:
            logits = teacher_forced(model, inputs, torch.tensor(asked["tokens"]))
            np.save(asked["out"], logits.float().numpy())
            print(json.dumps({"out": asked["out"]}), flush=True)
            continue
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**inputs, **new_tokens(gen, asked.get("new")))
        seconds = time.perf_counter() - start
        print(json.dumps({"s": seconds, "tokens": out.tolist()}), flush=True)
    counts = getattr(forward, "counts", None)
    if counts is not None:
        print(
            f"{name}: {counts.served} forwards served, {counts.original} ran the original "
            f"forward ({dict(counts.reasons)})",
            file=sys.stderr,
        )


class Remote:
    """A worker's approach as a callable for :func:`cycled_medians`, keeping the worker's times."""

    def __init__(self, worker: Worker, approach: str, prompt: str, new: int | None = None) -> None:
        self.worker, self.approach, self.prompt, self.new = worker, approach, prompt, new
        self.seconds: list[float] = []

    def __call__(self) -> list:
        seconds, tokens = self.worker.run(self.approach, self.prompt, self.new)
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


def spread_table(
    spread: dict[str, dict[str, list[float]]], prompts: list[str], load_s: dict[str, float], n: int
) -> str:
    """Per approach and prompt: fastest and slowest round in ms per token; the worker's load."""
    lines = [
        [a, *(f"{1000 * min(per[p]) / n:.2f}-{1000 * max(per[p]) / n:.2f}" for p in prompts),
         f"{load_s.get(a, float('nan')):.0f} s"]
        for a, per in spread.items()
    ]  # fmt: skip
    headers = ["approach", *(f"rounds ms/token {p}" for p in prompts), "worker load"]
    return format_table(headers, lines, title="spread over rounds (fastest-slowest), each alone")


def forced_errors(
    model: Any,
    prompts: dict[str, dict[str, torch.Tensor]],
    gen: dict,
    workers: dict[str, Worker],
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
        for a, worker in workers.items():
            if a == "eager":
                continue
            logits = worker.teacher_forced(a, name, tokens)
            if logits.shape != reference.shape:
                errors.setdefault(a, {})[name] = float("nan")
                continue
            diff = (logits - reference)[valid].double().norm()
            errors.setdefault(a, {})[name] = float(diff / reference[valid].double().norm())
    return errors


def timed_rows(
    model: Any,
    prompts: dict[str, dict[str, torch.Tensor]],
    gen: dict,
    workers: dict[str, Worker],
    rounds: int,
    split: bool = False,
) -> tuple[
    dict[str, dict[str, tuple[float, float]]],
    dict[str, dict[str, list[float]]],
    dict[str, dict[str, list[float]]],
]:
    """Per approach and prompt: median seconds of one ``generate``, the share of eager rows.

    Every approach is its own worker's; they are called from one cycled order, each timed by
    its worker's clock (after two warm-up calls). Also returns each round's seconds, and with
    ``split`` each round's seconds of a one-token ``generate`` (the prefill and the first
    token's choice), timed in the same cycled order.
    """
    rows: dict[str, dict[str, tuple[float, float]]] = {}
    spread: dict[str, dict[str, list[float]]] = {}
    first: dict[str, dict[str, list[float]]] = {}
    for name, inputs in prompts.items():
        with torch.no_grad():
            eager = model.generate(**inputs, **gen)
        remote = {a: Remote(w, a, name) for a, w in workers.items()}
        tokens = {a: fn() for a, fn in remote.items()}
        ones = (
            {f"{a} (1 token)": Remote(w, a, name, new=1) for a, w in workers.items()}
            if split
            else {}
        )
        calls = {**remote, **ones}
        cycled_medians(dict(calls), rounds)  # a warm-up call each, then the cycled rounds
        print(f"{name}: timed, load average {os.getloadavg()}", flush=True)
        for a, there in remote.items():
            timed = there.seconds[-rounds:]
            rows.setdefault(a, {})[name] = (statistics.median(timed), equal_share(tokens[a], eager))
            spread.setdefault(a, {})[name] = timed
            if split:
                first.setdefault(a, {})[name] = ones[f"{a} (1 token)"].seconds[-rounds:]
    return rows, spread, first


def split_table(
    spread: dict[str, dict[str, list[float]]],
    first: dict[str, dict[str, list[float]]],
    prompts: list[str],
    n: int,
) -> str:
    """Per approach and prompt: the one-token ``generate`` (prefill) and the decode steps.

    Decode ms per token is (median whole ``generate`` - median one-token ``generate``) / (n - 1).
    """
    lines = []
    for a, per in first.items():
        cells = [a]
        for p in prompts:
            whole, one = statistics.median(spread[a][p]), statistics.median(per[p])
            cells += [f"{1000 * one:.1f}", f"{1000 * (whole - one) / max(1, n - 1):.2f}"]
        lines.append(cells)
    headers = ["approach"]
    for p in prompts:
        headers += [f"1-token generate ms {p}", f"decode ms/token {p}"]
    return format_table(headers, lines, title="prefill and decode apart (--split), medians")


def tune(
    model: Any, tuning: list, gen: dict, args: argparse.Namespace, work: Path
) -> tuple[dict[str, dict], dict[str, float]]:
    """The tuned approaches, each saved once into ``work`` (reused when already there).

    Returns each approach's worker request part (its ``.tt`` file and generate's keywords) and
    the tuning seconds of those tuned in this run.
    """
    budget: Any = "default" if args.time_budget is None else args.time_budget
    wanted: dict[str, tuple[dict, dict, str]] = {"tunetree usual call": (gen, {}, "usual")}
    if args.static:
        static = dict(gen, cache_implementation="static", disable_compile=True)
        wanted["tunetree static-cache recipe"] = (static, {}, "static")
    if args.budget:
        accuracy = tt.AccuracyBudget(max_error=args.max_error)
        name = f"tunetree AccuracyBudget({args.max_error:g})"
        wanted[name] = (gen, {"accuracy": accuracy}, f"budget-{args.max_error:g}")
    specs: dict[str, dict] = {}
    setup_s: dict[str, float] = {}
    for name, (kwargs, extra, stem) in wanted.items():
        path = work / f"{stem}.tt"
        specs[name] = {"checkpoint": str(path), "gen": kwargs}
        if path.exists():
            print(f"{name}: reusing {path} (not tuned again)", flush=True)
            continue

        def call(m: Any, _kw: dict = kwargs, **x: Any) -> Any:
            return m.generate(**x, **_kw)

        start = time.perf_counter()
        result = tt.auto_tune(
            model, tuning, call=call, verbose=False, time_budget=budget, cache=False, **extra
        )
        setup_s[name] = time.perf_counter() - start
        print(result, flush=True)
        tt.save(result, path)
        del result
        gc.collect()
    return specs, setup_s


def start_workers(
    workers: dict[str, Worker],
    failed: dict[str, str],
    base: dict,
    specs: dict[str, dict],
    args: argparse.Namespace,
) -> None:
    """One worker per approach into ``workers``, started one at a time (each loads alone)."""
    this = [sys.executable, str(Path(__file__).resolve()), "--serve"]
    print("starting the workers, one at a time", flush=True)
    workers["eager"] = Worker(this, {**base, "approach": "eager"})
    for name, spec in specs.items():
        workers[name] = Worker(this, {**base, "approach": name, **spec})
    if args.no_optimum:
        return
    python = ensure_venv(args.optimum_venv)
    only = [a.strip() for a in args.optimum_approaches.split(";") if a.strip()]
    for a in only or OPTIMUM_APPROACHES:
        worker = Worker([str(python), str(WORKER)], {**base, "approaches": [a]})
        failed.update(worker.failed)
        if a in worker.approaches:
            workers[a] = worker
        else:
            worker.close()


def report(
    errors: dict[str, dict[str, float]],
    prompts: list[str],
    failed: dict[str, str],
    workers: dict[str, Worker],
) -> None:
    """The error table (if measured), load failures, KV cache precisions, tunetree's runners."""
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
    for a, reason in failed.items():
        print(f"{a}: failed to load ({reason})")
    for a, worker in workers.items():
        if a in worker.kv_cache:
            print(f"{a}: KV cache held as {worker.kv_cache[a]}")
        if worker.notes.get(a):
            print(f"{a}: served by {worker.notes[a]}")


def _merge(
    rows: dict[str, dict[str, tuple[float, float]]],
    spread: dict[str, dict[str, list[float]]],
    first: dict[str, dict[str, list[float]]],
    more_rows: dict[str, dict[str, tuple[float, float]]],
    more_spread: dict[str, dict[str, list[float]]],
    more_first: dict[str, dict[str, list[float]]],
) -> None:
    """Add one generation of workers' rounds: medians over every round so far, the least share
    of rows equal to eager's."""
    for a, per in more_spread.items():
        for p, seconds in per.items():
            spread.setdefault(a, {}).setdefault(p, []).extend(seconds)
            share = min(more_rows[a][p][1], rows.get(a, {}).get(p, (0.0, 1.0))[1])
            rows.setdefault(a, {})[p] = (statistics.median(spread[a][p]), share)
    for a, per in more_first.items():
        for p, seconds in per.items():
            first.setdefault(a, {}).setdefault(p, []).extend(seconds)


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
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="where the saved model and the .tt files go (a new temporary directory if not "
        "given); .tt files already there are reused, not tuned again",
    )
    parser.add_argument(
        "--tune-only", action="store_true", help="tune and save into --work, time nothing"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="start every approach's worker this many times, the rounds shared among them",
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="also time a one-token generate per approach: prefill and decode apart",
    )
    parser.add_argument("--serve", metavar="REQUEST", help=argparse.SUPPRESS)  # a worker
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    print("load average before:", os.getloadavg(), flush=True)
    import transformers

    torch.manual_seed(0)
    cfg = config(args.model)
    work = args.work or Path(tempfile.mkdtemp(prefix="tunetree-gen-cpu-"))
    work.mkdir(parents=True, exist_ok=True)
    directory = str(work / "model")
    if not (work / "model" / "config.json").exists():
        transformers.AutoModelForCausalLM.from_config(cfg).eval().save_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    n = args.tokens
    gen = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    prompts = {
        name: prompt(cfg.vocab_size, batch, length, seed=i)
        for i, (name, (batch, length)) in enumerate(UNSEEN.items())
    }
    tuning = [prompt(cfg.vocab_size, *shape, seed=100 + i) for i, shape in enumerate(TUNING)]
    specs, setup_s = tune(model, tuning, gen, args, work)
    if args.tune_only:
        print(f"tuned into {work}", {a: f"{s:.0f} s" for a, s in setup_s.items()}, flush=True)
        return
    listed = {n: {k: v.tolist() for k, v in p.items()} for n, p in prompts.items()}
    base = {"model_dir": directory, "prompts": listed, "gen": gen}
    workers: dict[str, Worker] = {}
    failed: dict[str, str] = {}
    rows: dict[str, dict[str, tuple[float, float]]] = {}
    spread: dict[str, dict[str, list[float]]] = {}
    first: dict[str, dict[str, list[float]]] = {}
    errors: dict[str, dict[str, float]] = {}
    load_s: dict[str, float] = {}
    generations = max(1, min(args.processes, args.rounds))
    for g in range(generations):
        rounds = args.rounds // generations + (1 if g < args.rounds % generations else 0)
        last = g == generations - 1
        workers = {}
        try:
            start_workers(workers, failed, base, specs, args)
            if g == 0:
                load_s = {a: w.load_s[a] for a, w in workers.items()}
                loaded = {a: s for a, s in load_s.items() if a.startswith(("optimum", "eager ("))}
                setup_s.update(loaded)
            print(
                f"load average before timing ({g + 1}/{generations}):", os.getloadavg(), flush=True
            )
            got = timed_rows(model, prompts, gen, workers, rounds, args.split)
            if args.errors and last:
                errors = forced_errors(model, prompts, gen, workers)
        finally:
            for worker in workers.values():
                worker.close()
        _merge(rows, spread, first, *got)
    print(table(rows, list(prompts), setup_s, n, args.model))
    print(spread_table(spread, list(prompts), load_s, n))
    if first:
        print(split_table(spread, first, list(prompts), n))
    report(errors, list(prompts), failed, workers)
    print("load average after:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
