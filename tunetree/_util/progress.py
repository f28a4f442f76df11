"""Progress lines on stderr for long work (tuning, auto-tuning); silent when not verbose."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Writes one line per step to ``stream`` (stderr by default) with the elapsed time."""

    def __init__(self, verbose: bool = True, stream: TextIO | None = None) -> None:
        self.verbose = verbose
        self.stream = stream
        self.start = time.perf_counter()

    def __call__(self, *parts: object) -> None:
        """Write one line of the non-empty ``parts`` with the elapsed time, when verbose."""
        if not self.verbose:
            return
        stream = self.stream or sys.stderr
        elapsed = time.perf_counter() - self.start
        text = " · ".join(str(p) for p in parts if p not in (None, ""))
        print(f"[tunetree {elapsed:7.1f}s] {text}", file=stream, flush=True)
