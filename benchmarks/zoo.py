"""The Hugging Face conformance zoo (issue 20): one row per family, tuned as a user would.

Run: ``python -m benchmarks.zoo --out benchmarks/results/zoo`` (``--families llama,bart`` for
some; ``--budget`` seconds per family, default 150; ``--backends eager,onnxruntime`` instead of
the default strategy). Each family of ``tests/models/hf_zoo.py`` (random weights from a
config, called as its users call it) is auto-tuned at depths 0-1 on three calls of varying
batch and length, then called on two unseen shapes inside the tuned ranges, one outside and
one with another keyword (``tests/models/conformance.py``). A row: tuned depth or why not, the
winners, the end-to-end speed-up ``auto_tune`` measured, whether every backend of the
strategy was built for every graph of the selected depth (else depth 0; "no: openvino 1/4"
names those the time budget skipped and for how many graphs they were built), the largest
difference to eager on the unseen calls, fallbacks inside the ranges and warnings outside
them, tuning time, broken invariants, and every failed candidate's reason grouped by
backend. Run it alone on the machine: speed-ups are side-by-side ratios, but tuning times
grow with any other load.
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import argparse
import dataclasses
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tunetree as tt
from tunetree._util.table import format_table

from . import common

BACKENDS = {
    "eager": tt.backends.Eager,
    "onnxruntime": tt.backends.OnnxRuntime,
    "openvino": tt.backends.OpenVINO,
    "inductor": tt.backends.Inductor,
}


def _cause(reason: str) -> str:
    """A failure reason without the module path, sample and numbers: a cause to group by."""
    reason = reason.split(": ", 1)[1] if ": " in reason else reason
    reason = re.sub(r"sample \d+: ", "", reason)
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", reason)[:140]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--families", default="", help="comma-separated names (default: all)")
    p.add_argument("--budget", type=float, default=150.0, help="time budget per family, s")
    p.add_argument("--backends", default="", help="comma-separated backends (default strategy)")
    p.add_argument("--out", type=Path, default=None, help="directory for zoo.json and zoo.md")
    p.add_argument("--render", type=Path, default=None, help="print a saved zoo.json and stop")
    args = p.parse_args()
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        print(render(saved["header"], saved["rows"]))
        return
    from tests.models.conformance import check
    from tests.models.hf_zoo import FAMILIES

    header = common.header(common.command_line())
    names = [n for n in args.families.split(",") if n] or list(FAMILIES)
    strategy = (
        tt.HighestThroughputStrategy([BACKENDS[b]() for b in args.backends.split(",")])
        if args.backends
        else None
    )
    rows = []
    for name in names:
        row = check(FAMILIES[name], time_budget=args.budget, strategy=strategy)
        rows.append(row)
        status = f"depth {row.depth}" if row.tuned else "untuned"
        built = f"not built: {row.unbuilt}" if row.unbuilt else "all built"
        print(
            f"{name}: {status}, {row.winners or '-'}, {row.speedup:.2f}x, {built}, "
            f"{row.tuning_s:.0f} s"
        )
        for problem in row.problems:
            print(f"  PROBLEM {problem}")
        sys.stdout.flush()
        if args.out is not None:  # after every family, so a run cut short keeps its rows
            rows_json = [dataclasses.asdict(r) for r in rows]
            common.write_json(args.out, "zoo.json", {"header": header, "rows": rows_json})
    text = render(header, [dataclasses.asdict(r) for r in rows])
    print(text)
    if args.out is not None:
        (args.out / "zoo.md").write_text(text + "\n")


def render(header: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The run as Markdown: the family table, failures by backend and cause, untuned reasons.

    ``rows`` are :class:`ZooRow` s as dicts (as ``zoo.json`` holds them), so a saved run renders
    again: ``python -m benchmarks.zoo --render DIR/zoo.json``.
    """
    table = format_table(
        ["family", "kind", "tuned", "winner", "speed-up", "all built", "max diff unseen",
         "fallbacks in/out", "tuning", "problems"],
        [
            [
                r["name"],
                r["kind"],
                f"depth {r['depth']}" if r["depth"] is not None else "no",
                r["winners"] or "-",
                f"{r['speedup']:.2f}x",
                "yes" if not r.get("unbuilt") else f"no: {r['unbuilt']}",
                f"{r['max_diff']:.1e}" if r["max_diff"] is not None else "-",
                f"{r['fallbacks_inside']}/{r['fallback_warnings']}",
                f"{r['tuning_s']:.0f} s",
                "; ".join(r["problems"]) or "none",
            ]
            for r in rows
        ],
        title="Hugging Face zoo",
    )  # fmt: skip
    causes: Counter[tuple[str, str]] = Counter(
        (backend, _cause(reason)) for r in rows for backend, reason in r["failures"]
    )
    failures = format_table(
        ["backend", "candidates", "cause"],
        [[b, n, c] for (b, c), n in sorted(causes.items(), key=lambda kv: (kv[0][0], -kv[1]))],
        title="Failed or rejected candidates by backend and cause",
    )
    untuned = [f"- {r['name']}: {r['untuned_reason']}" for r in rows if r["depth"] is None]
    return f"# {header['command']}\n\n```\n{table}\n\n{failures}\n```\n" + "\n".join(untuned)


if __name__ == "__main__":
    main()
