"""``tunetree cache ls | verify | gc [--remote] | push | pull``: look after the tuning cache.

:func:`add_cache_commands` registers the ``cache`` subcommand with the ``tunetree``
parser (see :mod:`tunetree.cli`); ``python -m tunetree.cache.cli`` runs it on its own.
Exit status: 0 fine, 1 ``verify`` found unusable entries, 2 the cache cannot be opened.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any

from .._util.table import (
    escape_controls,
    finite_or_none,
    format_size,
    format_table,
    format_time,
)
from .remote_cli import (
    add_remote_argument,
    add_sync_commands,
    remote_gc,
    remote_ls,
    remote_verify,
)

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """Bytes from ``500M``, ``2G``, ``1.5GiB``, ``10kb`` or a plain number."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgt]?)(i?)b?\s*", text.lower())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 500M, 2G, 1.5GiB)")
    number, unit, binary = match.groups()
    scale = 1024 ** ("kmgt".index(unit) + 1) if binary and unit else _UNITS[unit]
    return int(float(number) * scale)


def _open(args: argparse.Namespace) -> Any:
    from .tuning import TuningCache, default_directory

    return TuningCache(args.dir or default_directory())


def ls_command(args: argparse.Namespace) -> int:
    """List entries: module path, graph, winner, size, hits, last use."""
    if args.remote is not None:
        return remote_ls(args)
    cache = _open(args)
    infos = sorted(cache.entries(), key=lambda i: finite_or_none(i.last_used) or 0.0, reverse=True)
    if args.json:
        print(json.dumps([_json_info(vars(i)) for i in infos], indent=2))
        return 0
    rows = [
        [
            i.key[:12],
            i.path or "<model>",
            i.graph,
            i.winner,
            i.candidates,
            format_size(i.size),
            i.hits,
            format_time(i.last_used),
            "ok" if i.problem is None else f"unusable: {i.problem}",
        ]
        for i in infos
    ]
    print(
        format_table(
            ["key", "module", "graph", "winner", "cands", "size", "hits", "last used", "status"],
            rows,
            title=f"tuning cache {escape_controls(cache.directory)}: {len(infos)} entries, "
            f"{format_size(cache.disk.size())} on disk",
        )
    )
    return 0


def _json_info(info: dict[str, Any]) -> dict[str, Any]:
    """An entry's summary as JSON can hold it: times no date can show are null."""
    return {
        **info,
        "created": finite_or_none(info["created"]),
        "last_used": finite_or_none(info["last_used"]),
    }


def verify_command(args: argparse.Namespace) -> int:
    """Check every manifest and artifact checksum; unusable entries are marked invalid."""
    if args.remote is not None:
        return remote_verify(args)
    cache = _open(args)
    checked = len(cache.disk.entry_keys())
    bad = cache.verify()
    if args.json:
        bad_json = [_json_info(vars(i)) for i in bad]
        print(json.dumps({"entries": checked, "bad": bad_json}, indent=2))
    else:
        for info in bad:
            line = f"CORRUPT {info.key[:12]} {info.path or '<model>'} {info.graph}: {info.problem}"
            print(escape_controls(line))
        print(f"{checked} entries checked, {len(bad)} unusable ({cache.directory})")
    return 1 if bad else 0


def gc_command(args: argparse.Namespace) -> int:
    """Remove dead writers' orphans, invalid entries, unreferenced artifacts and LRU overflow.

    Least recently used entries are removed beyond ``--max-size``.
    """
    if args.remote is not None:
        return remote_gc(args)
    cache = _open(args)
    report = cache.gc(args.max_size)
    if args.json:
        print(json.dumps(vars(report), indent=2))
        return 0
    print(
        f"removed {report.temporaries} orphaned temporaries, {report.invalid_entries} invalid "
        f"entries, {report.evicted_entries} least recently used entries, {report.artifacts} "
        f"unreferenced artifacts, {report.trash} trashed entries, {report.family_records} "
        f"stale or irregular family records; "
        f"{format_size(report.size_before)} -> {format_size(report.size_after)}"
    )
    return 0


def _guard(func: Any) -> Any:
    """Turn a cache that cannot be opened into exit status 2 with one line on stderr."""

    def run(args: argparse.Namespace) -> int:
        from ..errors import CacheError, MissingDependencyError

        try:
            return int(func(args))
        except (CacheError, MissingDependencyError) as exc:
            print(f"tunetree cache: {escape_controls(exc)}", file=sys.stderr)
            return 2
        except OSError as exc:  # e.g. gc on a read-only cache: report, never a traceback
            print(
                f"tunetree cache: cannot change {args.dir or 'the cache'}: {exc}", file=sys.stderr
            )
            return 2

    return run


def add_cache_commands(subparsers: Any) -> None:
    """Add ``cache ls``, ``cache verify`` and ``cache gc`` to a ``tunetree`` parser."""
    parser = subparsers.add_parser(
        "cache",
        help="list, verify or clean the tuning cache",
        description=(
            "Look after the tuning cache: $TUNETREE_CACHE_DIR, else $XDG_CACHE_HOME/tunetree, "
            "else ~/.cache/tunetree."
        ),
    )
    parser.add_argument(
        "--dir",
        help="cache directory (default: $TUNETREE_CACHE_DIR, else $XDG_CACHE_HOME/tunetree, "
        "else ~/.cache/tunetree)",
    )
    commands = parser.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    ls = commands.add_parser("ls", help="entries with their sizes and hit counts")
    ls.add_argument("--json", action="store_true", help="print JSON")
    add_remote_argument(ls)
    ls.set_defaults(func=_guard(ls_command))
    verify = commands.add_parser(
        "verify", help="check every checksum; exit status 1 when an entry is unusable"
    )
    verify.add_argument("--json", action="store_true", help="print JSON")
    add_remote_argument(verify)
    verify.set_defaults(func=_guard(verify_command))
    gc = commands.add_parser(
        "gc",
        help="remove orphans, invalid entries, unreferenced artifacts; LRU down to --max-size",
    )
    gc.add_argument(
        "--max-size",
        type=parse_size,
        metavar="SIZE",
        help="evict least recently used entries until the cache fits, e.g. 2G",
    )
    gc.add_argument(
        "--grace",
        type=float,
        metavar="SECONDS",
        help="with --remote: keep unreferenced artifacts younger than this (default one day)",
    )
    gc.add_argument(
        "--deep",
        action="store_true",
        help="with --remote: download every artifact to find corrupted ones (else sizes only)",
    )
    gc.add_argument("--json", action="store_true", help="print JSON")
    add_remote_argument(gc)
    gc.set_defaults(func=_guard(gc_command))
    add_sync_commands(commands, _guard)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tunetree.cache.cli ACTION``: the ``cache`` subcommand on its own."""
    parser = argparse.ArgumentParser(prog="tunetree")
    add_cache_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["cache", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
