"""The library's code and docstrings carry no history: no issue numbers, no session notes.

Why a choice was made belongs in the docstring; the measurement that led to it, with the
machine it was taken on, in docs/measurements.md or benchmarks/results/.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tunetree"

ISSUE = re.compile(r"\bissues? ?#?\d+", re.IGNORECASE)
ANECDOTE = re.compile(r"\b(session[ -]?\d+|commit [0-9a-f]{7,})\b", re.IGNORECASE)
MACHINE = re.compile(r"\b(EPYC|Xeon|[AH]100|H200|vCPUs?)\b|\bload average \d|\b\d+-core\b")
"""A machine a number was measured on: such numbers belong in docs/measurements.md."""


def _hits(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    return found


def test_no_issue_numbers_in_the_package() -> None:
    assert _hits(ISSUE) == []


def test_no_session_or_commit_anecdotes_in_the_package() -> None:
    assert _hits(ANECDOTE) == []


def test_no_machine_anecdotes_in_the_package() -> None:
    assert _hits(MACHINE) == []


def test_the_scan_finds_what_it_looks_for() -> None:
    assert ISSUE.search("fixed in issue 29") and ISSUE.search("issue #7")
    assert ANECDOTE.search("on session 12") and ANECDOTE.search("(commit 103b741)")
    assert not ISSUE.search("an issue with the 3 graphs")
    assert MACHINE.search("load average 7 on the 2-core EPYC") and MACHINE.search("on the H200")
    assert not MACHINE.search('f"load average {one:.2f}"') and not MACHINE.search("xeon-spr")
