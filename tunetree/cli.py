"""The ``tunetree`` command line.

One subcommand per small function: ``add_<name>_command(subparsers)`` declares its
arguments and sets ``func``, a function of the parsed arguments that returns the exit
status. New subcommands append their adder to :data:`COMMANDS`.

Exit status of ``tunetree info``: 0 when the checkpoint would load here, 1 when it was
tuned in another environment (or needs what this one lacks), 2 when it cannot be read
(damaged or altered, another format version); ``--json`` says ``"compatible": false`` for
both.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._util.args import add_budget_arguments
from ._util.table import escape_controls, format_seconds, format_table
from .cache.cli import add_cache_commands
from .commands.tune import add_tune_command

if TYPE_CHECKING:
    from .checkpoint.info import CheckpointInfo

EXIT_OK = 0
EXIT_INCOMPATIBLE = 1
EXIT_UNREADABLE = 2


def _flat_lines(record: dict[str, Any]) -> list[str]:
    """Every entry of the environment record, one a line (``tunetree info --verbose``)."""
    from .checkpoint.environment import flatten_record

    lines = []
    for entry, value in flatten_record(record).items():
        if entry == "cpu.flags" and isinstance(value, list):
            value = f"{len(value)} flags: {' '.join(map(str, value))}"
        lines.append(f"  {escape_controls(entry)}: {escape_controls(value)}")
    return lines


CONDENSED_LIST = 8
"""Lists longer than this are shown by their length in the condensed environment record."""


def _condensed_lines(record: dict[str, Any]) -> list[str]:
    """The environment record, one line per top-level entry; long lists by their length."""
    from .checkpoint.environment import flatten_record

    groups: dict[str, list[str]] = {}
    for entry, value in flatten_record(record).items():
        group, _, name = entry.partition(".")
        if isinstance(value, list) and len(value) > CONDENSED_LIST:
            value = f"{len(value)} entries"
        elif isinstance(value, list):
            value = ", ".join(map(str, value)) or "none"
        groups.setdefault(group, []).append(f"{name} {value}" if name else str(value))
    return [f"  {escape_controls(g)}: {escape_controls('; '.join(v))}" for g, v in groups.items()]


def _members_lines(info: CheckpointInfo) -> list[str]:
    """What ``tunetree info`` verified of the members, or why it did not read them."""
    check = info.verified
    if check is None:
        why = "the environment differs" if info.differences else "tt.load refuses the plan here"
        return [f"members: not verified ({why}, before reading them)"]
    files = check.members - 1
    read = "the weights" + (f" and {files} runner files" if files else "")
    artifacts = (
        f"; the artifacts of {check.runners} runners read and checked against their records "
        "(element types, fixed sizes, ranges)"
        if check.runners
        else ""
    )
    autocast = sum(
        e.backend.kind == "autocast" and e.runner.get("structure") is None
        for e in info.manifest.entries
    )
    counts = (
        f", and the output count of {autocast} Autocast runner{'s' if autocast > 1 else ''} "
        "saved without its output structure (only the model's output says how many dtypes "
        "it lists)"
        if autocast
        else ""
    )
    lines = [
        f"members: verified: {read} against their SHA-256{artifacts}; left to tt.load, which "
        f"needs the model: the weights' fit to it and the saved output structures' "
        f"match to its outputs{counts}"
    ]
    e, entries = escape_controls, info.manifest.entries
    lines += [
        f"  {e(entries[n].path or '<model>')} {e(entries[n].graph_text)}: its artifact serves "
        f"{e(graph)} only (other calls run the original forward)"
        for n, graph in sorted(check.narrowed.items())
    ]
    return lines


def _plan_table(info: CheckpointInfo) -> str:
    rows = [
        [
            r["path"] or "<model>",
            r["graph"],
            r["backend"],
            format_seconds(r["latency_s"]),
            format_seconds(r["eager_latency_s"]),
            r["members"],
        ]
        for r in info.plan_rows()
    ]
    return format_table(
        ["module", "graph", "backend", "latency", "eager", "artifacts"],
        rows,
        title=f"plan ({len(rows)} entries)",
    )


def _verdict_lines(info: CheckpointInfo) -> list[str]:
    e = escape_controls
    if info.compatible:
        return [
            "comparison with this environment: identical; the plan and its members pass "
            "every check tt.load makes without the model"
        ]
    if not info.differences:
        return [
            f"comparison with this environment: identical, but tt.load refuses the plan "
            f"here: {e(info.refusal)}"
        ]
    return [
        f"comparison with this environment: {len(info.differences)} differing entries "
        "(tuned vs running); tt.load refuses it here:",
        *(f"  {e(d)}" for d in info.differences),
    ]


def _print_info(info: CheckpointInfo, verbose: bool = False) -> None:
    """The plan first, then whether it loads here, the members and the environment record."""
    m = info.manifest
    e = escape_controls
    print(f"checkpoint: {e(info.path)}")
    print(f"format version: {info.version}")
    print(f"model: {e(m.model_type or '?')}  device: {e(m.device)}", end="")
    print(f"  depth: {m.depth}  saved: {e(m.created_utc or '?')}")
    if m.accuracy is not None:
        from .checkpoint.format import accuracy_note

        print(f"accuracy: {e(accuracy_note(m.accuracy))}")
    if m.whole is not None:
        whole = f"{m.whole.kind} {m.whole.config}"
        print(f"served whole by: {e(whole)} (exported again and checked at load)")
        if m.whole.accuracy is not None:
            print(f"  CHANGES RESULTS: admitted under {e(str(m.whole.accuracy))}")
    print()
    print(_plan_table(info))
    print()
    print("\n".join(_verdict_lines(info)))
    print("\n".join(_members_lines(info)))
    if verbose:
        print("environment record (where it was tuned):")
        print("\n".join(_flat_lines(info.record)))
    else:
        print("environment record (where it was tuned; --verbose lists every entry):")
        print("\n".join(_condensed_lines(info.record)))


def info_command(args: argparse.Namespace) -> int:
    """``tunetree info PATH``: describe and check a checkpoint without loading any weights."""
    from .checkpoint import read_info
    from .errors import TunetreeError

    try:
        info = read_info(args.path, ignore=tuple(args.ignore or ()))
    except TunetreeError as exc:  # a damaged or hostile file: the error tt.load raises
        if args.json:
            document = {"path": args.path, "compatible": False, "error": str(exc)}
            print(json.dumps(document, indent=2))
        else:
            print(f"tunetree info: {escape_controls(exc)}", file=sys.stderr)
        return EXIT_UNREADABLE
    if args.json:
        print(json.dumps(info.to_json(), indent=2))
    else:
        _print_info(info, args.verbose)
    return EXIT_OK if info.compatible else EXIT_INCOMPATIBLE


def add_info_command(subparsers: Any) -> None:
    """Add the ``info`` subcommand: a checkpoint's version, environment and plan."""
    parser = subparsers.add_parser(
        "info",
        help="show a checkpoint's version, environment and plan, checked as tt.load does",
        description=(
            "Print a .tt checkpoint's format version, its plan (module path, graph, backend, "
            "latency), how its environment record compares with this environment, and the "
            "record itself (condensed; --verbose for every entry). "
            "Where the environment matches, the members tt.load reads are verified and the "
            "runners' artifacts checked, without the model and without loading any weights. "
            "Exit status: 0 loads here, 1 tuned elsewhere or needs what this environment "
            "lacks, 2 unreadable or altered."
        ),
    )
    parser.add_argument("path", help="a .tt file or a checkpoint directory")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="list every entry of the environment record (CPU flags included)",
    )
    parser.add_argument(
        "--ignore",
        action="append",
        metavar="ENTRY",
        help="environment entry to leave out of the comparison, e.g. host (repeatable)",
    )
    parser.set_defaults(func=info_command)


def add_demo_command(subparsers: Any) -> None:
    """Add the ``demo`` subcommand: auto-tune the built-in transformer encoder."""
    parser = subparsers.add_parser(
        "demo",
        help="auto-tune the built-in 4-layer transformer encoder and print the tables",
        description="Auto-tune a built-in nn.TransformerEncoder on this machine.",
    )
    parser.add_argument("--max-depth", type=int, default=1, help="deepest cut to try (default 1)")
    add_budget_arguments(parser)
    parser.set_defaults(func=demo_command)


def demo_command(args: argparse.Namespace) -> int:
    """Run the demo with the parsed arguments; returns the exit status."""
    from .demo import run_demo

    return run_demo(args.max_depth, args.time_budget, args.quick, args.accuracy)


COMMANDS: list[Callable[[Any], None]] = [
    add_tune_command,
    add_info_command,
    add_cache_commands,
    add_demo_command,
]
"""Subcommand adders, each called with the subparsers object."""


def build_parser() -> argparse.ArgumentParser:
    """The ``tunetree`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="tunetree", description="Make PyTorch inference faster without changing results."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tunetree`` script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_UNREADABLE
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
