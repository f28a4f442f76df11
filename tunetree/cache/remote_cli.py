"""``tunetree cache ls|verify|gc --remote`` and ``tunetree cache push|pull``.

``--remote`` takes an ``s3://BUCKET/PREFIX`` URL, or none to use ``$TUNETREE_CACHE_REMOTE``;
the endpoint and credentials come from boto3's standard variables (``AWS_ENDPOINT_URL``...).
Exit status as for the local commands: 0 fine, 1 ``verify`` found unusable entries (or a
``push``/``pull`` copied nothing it selected because the remote failed), 2 the remote cannot
be used (no URL, boto3 missing, unreachable).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .._util.table import escape_controls, format_size, format_table, format_time


def add_remote_argument(parser: argparse.ArgumentParser) -> None:
    """``--remote [URL]`` on ``ls``, ``verify`` and ``gc``."""
    parser.add_argument(
        "--remote",
        nargs="?",
        const="",
        metavar="URL",
        help="work on the remote tier (s3://BUCKET/PREFIX; default $TUNETREE_CACHE_REMOTE)",
    )


def _tier(url: str) -> Any:
    from ..errors import CacheError
    from .remote import ENV_REMOTE, RemoteTier

    url = url or os.environ.get(ENV_REMOTE, "")
    if not url:
        raise CacheError(f"no remote: give --remote s3://BUCKET/PREFIX or set ${ENV_REMOTE}")
    return RemoteTier(url)


def remote_ls(args: argparse.Namespace) -> int:
    """List remote entries: key, module path, graph, winner, size, signed, last change, status."""
    from .remote_maintenance import remote_entries

    tier = _tier(args.remote)
    infos = sorted(remote_entries(tier), key=lambda i: i.modified, reverse=True)
    if args.json:
        print(json.dumps([vars(i) for i in infos], indent=2))
        return 0
    rows = [
        [
            i.key[:12],
            i.path or "<model>",
            i.graph,
            i.winner,
            format_size(i.size),
            ("yes" if tier.secret is not None else "unchecked (no key)") if i.signed else "no",
            format_time(i.modified),
            "ok" if i.problem is None else f"unusable: {i.problem}",
        ]
        for i in infos
    ]
    print(
        format_table(
            ["key", "module", "graph", "winner", "size", "signed", "written", "status"],
            rows,
            title=f"remote tuning cache {escape_controls(tier.url)}: {len(infos)} entries",
        )
    )
    return 0


def remote_verify(args: argparse.Namespace) -> int:
    """Read every entry and download every artifact to check its sha256."""
    from .remote_maintenance import remote_entries

    tier = _tier(args.remote)
    infos = remote_entries(tier, deep=True)
    bad = [i for i in infos if i.problem is not None]
    if args.json:
        print(json.dumps({"entries": len(infos), "bad": [vars(i) for i in bad]}, indent=2))
    else:
        for info in bad:
            line = f"CORRUPT {info.key[:12]} {info.path or '<model>'} {info.graph}: {info.problem}"
            print(escape_controls(line))
        print(f"{len(infos)} entries checked, {len(bad)} unusable ({tier.url})")
    return 1 if bad else 0


def remote_gc(args: argparse.Namespace) -> int:
    """Delete unusable remote entries and old unreferenced artifacts."""
    from .remote_maintenance import GC_GRACE_S, remote_gc

    tier = _tier(args.remote)
    grace = GC_GRACE_S if args.grace is None else args.grace
    report = remote_gc(tier, grace_s=grace, deep=args.deep)
    if args.json:
        print(json.dumps(vars(report), indent=2))
        return 0
    print(
        f"removed {report.entries} unusable entries and {report.artifacts} unreferenced "
        f"artifacts older than {grace:.0f} s from {tier.url}; "
        f"{format_size(report.freed_bytes)} freed"
    )
    return 0


def sync_command(args: argparse.Namespace) -> int:
    """``push`` or ``pull`` the selected entries."""
    from .tuning import TuningCache

    tier = _tier(args.remote or "")
    cache = TuningCache(args.dir, remote=tier)
    model = None if args.all else args.model
    report = cache.push(model) if args.cache_command == "push" else cache.pull(model)
    if args.json:
        print(json.dumps(vars(report), indent=2))
    else:
        print(escape_controls(report))
    failed = report.selected and not report.copied and not tier.breaker.available()
    return 1 if failed else 0


def add_sync_commands(commands: Any, guard: Any) -> None:
    """``cache push`` and ``cache pull``."""
    for name, what in (
        ("push", "publish local entries on the remote tier"),
        ("pull", "fetch remote entries measured on this kind of machine into the local cache"),
    ):
        parser = commands.add_parser(name, help=what, description=what.capitalize() + ".")
        chosen = parser.add_mutually_exclusive_group(required=True)
        chosen.add_argument(
            "--model",
            metavar="CLASS",
            help="the entries of a model: root entries of this class and the entries below them",
        )
        chosen.add_argument("--all", action="store_true", help="every entry")
        parser.add_argument(
            "--remote", metavar="URL", help="s3://BUCKET/PREFIX (default $TUNETREE_CACHE_REMOTE)"
        )
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.set_defaults(func=guard(sync_command))
