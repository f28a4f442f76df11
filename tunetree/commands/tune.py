"""``tunetree tune DIR --task T (--inputs FILE | --shapes 1x16,4x64) --out model.tt``.

Tunes a local Hugging Face checkpoint directory for a task and saves the tuned model: builds
it with the task's auto class (:func:`tunetree.pretrained.build_pretrained`), makes its calls
(:mod:`.tune_inputs`), runs :func:`tunetree.auto_tune` (through ``generate`` for the
generation tasks), prints the table and writes the checkpoint. Load it with
``tt.load_pretrained(DIR, "model.tt", task=T)``.

Exit status: 0 tuned and saved, 1 tuning or saving failed, 2 bad arguments (one line on
stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from .._util.table import escape_controls
from ..errors import TunetreeError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _one_line_error(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` report an argument error as one line on stderr, exit status 2."""

    def error(message: str) -> Any:
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: {message}\n")

    parser.error = error  # type: ignore[method-assign]


def add_tune_command(subparsers: Any) -> None:
    """Add the ``tune`` subcommand: tune a Hugging Face checkpoint directory and save it."""
    from ..pretrained import TASKS
    from ..search.auto import DEFAULT_TIME_BUDGET_S, QUICK_TIME_BUDGET_S

    parser = subparsers.add_parser(
        "tune",
        help="tune a Hugging Face checkpoint directory for a task and save the tuned model",
        description=(
            "Build the model of a local Hugging Face checkpoint directory (config and weights, "
            "with or without tokenizer files) for a task, auto-tune it on calls of the given "
            "shapes or read from a file, print the table and save the tuned model. Load it "
            "with tt.load_pretrained(DIR, OUT, task=TASK). Exit status: 0 saved, 1 tuning "
            "or saving failed, 2 bad arguments."
        ),
    )
    _one_line_error(parser)
    parser.add_argument("directory", metavar="DIR", help="a save_pretrained directory")
    parser.add_argument("--task", required=True, metavar="TASK", help=f"one of: {', '.join(TASKS)}")
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--shapes",
        metavar="BxL,...",
        help="synthetic calls, batch x length each (x image side for image tasks), e.g. "
        "1x16,4x64: valid token ids, the last row of a batch padded",
    )
    given.add_argument(
        "--inputs",
        metavar="FILE",
        type=Path,
        help=".txt or .json texts (through DIR's tokenizer), an image file or a directory of "
        "them (through DIR's image processor), or a .pt / .safetensors of the model's keyword "
        "arguments (a dict of tensors, or a list of them in a .pt)",
    )
    parser.add_argument(
        "--new-tokens",
        type=int,
        default=8,
        metavar="N",
        help="tokens generate makes per call, for the generation tasks (default 8)",
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda (default cpu); the model is tuned there"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"tuning time budget (default: auto_tune's, {DEFAULT_TIME_BUDGET_S:g} s, or "
        f"{QUICK_TIME_BUDGET_S:g} s with --quick)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a first look: quick backends, shorter measurements, shallow cuts",
    )
    parser.add_argument(
        "--max-error",
        type=float,
        default=None,
        metavar="E",
        help="admit candidates that change results up to this relative L2 error (opt-in; "
        "default: results kept)",
    )
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument(
        "--cache",
        metavar="DIR",
        help="tuning cache directory (default: $TUNETREE_CACHE_DIR, else "
        "$XDG_CACHE_HOME/tunetree, else ~/.cache/tunetree)",
    )
    cache.add_argument(
        "--remote",
        metavar="URL",
        help="also use a shared remote tier, s3://BUCKET/PREFIX (needs tunetree[remote])",
    )
    parser.add_argument("--out", required=True, type=Path, help="the .tt file to write")
    parser.set_defaults(func=tune_command)


def _fail(code: int, message: object) -> int:
    print(f"tunetree tune: error: {escape_controls(message)}", file=sys.stderr)
    return code


def tune_command(args: argparse.Namespace) -> int:
    """Run ``tunetree tune`` with the parsed arguments; returns the exit status."""
    try:
        prepared = _prepare(args)
    except TunetreeError as exc:  # a bad argument, directory or file
        return _fail(EXIT_USAGE, exc)
    try:
        return _tune(args, *prepared)
    except TunetreeError as exc:
        return _fail(EXIT_FAILED, exc)


def _prepare(args: argparse.Namespace) -> tuple[Any, Any, list[dict[str, Any]], torch.device]:
    """The task, the model and the calls; TunetreeError for anything the user gave wrong."""
    from ..errors import InvalidInputError
    from ..pretrained import build_pretrained, checkpoint_directory, pretrained_config, task_of
    from .tune_inputs import check_shapes, parse_shapes, samples_from_file, synthetic_samples

    task = task_of(args.task)
    directory = checkpoint_directory(args.directory)
    shapes = parse_shapes(args.shapes) if args.shapes is not None else None
    if args.new_tokens < 1:
        raise InvalidInputError("--new-tokens must be at least 1")
    if args.budget is not None and args.budget <= 0:
        raise InvalidInputError("--budget must be a positive number of seconds")
    if args.max_error is not None and not args.max_error > 0:
        raise InvalidInputError("--max-error must be positive")
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise InvalidInputError(f"--device: {args.device!r} is not a device") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError("--device cuda: no CUDA device here")
    if args.out.suffix != ".tt":
        raise InvalidInputError(f"--out: {args.out} should end in .tt")
    samples: list[dict[str, Any]] = []
    # Inputs are read or checked before the weights load: a bad one is reported at once.
    if shapes is None:
        samples = samples_from_file(args.inputs, directory, task, device)
    else:
        check_shapes(pretrained_config(directory), task, shapes)
    model = build_pretrained(directory, args.task, device)
    if shapes is not None:
        samples = synthetic_samples(model, task, shapes, device)
    return task, model, samples, device


def _tune(
    args: argparse.Namespace, task: Any, model: Any, samples: list[Any], device: torch.device
) -> int:
    from ..accuracy import AccuracyBudget
    from ..cache import TuningCache
    from ..checkpoint import save
    from ..search.auto import auto_tune
    from .tune_inputs import pad_token_id

    call = None
    if task.generates:
        settings = {
            "max_new_tokens": args.new_tokens,
            "do_sample": False,
            "pad_token_id": pad_token_id(model.config),
        }

        def call(m: Any, **inputs: Any) -> Any:
            return m.generate(**inputs, **settings)

    cache: Any = None
    if args.remote is not None:
        cache = TuningCache(remote=args.remote)
    elif args.cache is not None:
        cache = TuningCache(args.cache)
    accuracy = AccuracyBudget(max_error=args.max_error) if args.max_error else None
    result = auto_tune(
        model,
        samples,
        device=device,
        time_budget="default" if args.budget is None else args.budget,
        call=call,
        quick=args.quick,
        cache=cache,
        accuracy=accuracy,
    )
    print(result)
    out = save(result, args.out)
    print(f"\nsaved {out}; load it with tt.load_pretrained({str(args.directory)!r}, ", end="")
    print(f"{str(out)!r}, task={args.task!r})")
    return EXIT_OK
