"""What a fleet tune reports: one row per job and node, never merged across kinds of machine."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._util.table import escape_controls, format_table


@dataclass
class FleetRow:
    """One job on one node: where it ran, what tuning found and cost, or why it failed.

    Attributes:
        job: The job's name.
        status: ``"ok"`` or ``"failed"``.
        node: The Ray node it ran on.
        hardware: The node's hardware class (rows are never merged across classes).
        depth: The depth ``auto_tune`` kept (None: the untuned model).
        speedup: ``auto_tune``'s side-by-side speed-up.
        builds: Candidates built (0 when every graph came from the cache).
        cache_hits: Graphs served by the cache.
        remote_hits: Graphs served by the remote tier.
        remote_stored: Entries pushed to the remote tier.
        tuning_s: ``auto_tune``'s wall time.
        wall_s: The job's wall time, build and data included.
        error: Why it failed.
        untuned: Why ``auto_tune`` kept the untuned model ("" when a depth was kept).
    """

    job: str
    status: str = "ok"
    """``ok``, ``failed``, or ``timed out`` (past its time limit: its worker was stopped)."""
    node: str = ""
    """The node's host name."""
    hardware: str = ""
    """The node's hardware class (:func:`tunetree.fleet.hardware.hardware_class`)."""
    threads: int = 0
    """torch threads the job tuned with (what hosts of its kind serve with; 0: not started)."""
    depth: int | None = None
    """The selected depth (None: the untuned model was kept)."""
    speedup: float | None = None
    builds: int = 0
    """Backend builds on this node (0 when every graph came from the cache)."""
    cache_hits: int = 0
    remote_hits: int = 0
    """Hits served from entries the remote tier materialized."""
    remote_stored: int = 0
    """Entries this job published on the remote tier."""
    tuning_s: float = 0.0
    wall_s: float = 0.0
    """Build, data, tuning and cache transfers on the worker."""
    error: str | None = None
    untuned: str = ""
    """Why the job's model was left untuned (:func:`tunetree.search.untuned.why_untuned`)."""

    @property
    def ok(self) -> bool:
        """Whether the job completed."""
        return self.status == "ok"


@dataclass
class FleetReport:
    """The rows of a :func:`tunetree.fleet.tune`, in job order; ``print()`` it for a table.

    Attributes:
        rows: One :class:`FleetRow` per job.

    Example:
        >>> import tunetree as tt
        >>> report = tt.fleet.FleetReport([tt.fleet.FleetRow("mlp", hardware="cpu: x")])
        >>> len(report.rows)
        1
    """

    rows: list[FleetRow] = field(default_factory=list)

    def __getitem__(self, job: str) -> FleetRow:
        for row in self.rows:
            if row.job == job:
                return row
        raise KeyError(job)

    def failed(self) -> list[FleetRow]:
        """Rows of jobs that failed."""
        return [r for r in self.rows if not r.ok]

    def by_hardware(self) -> dict[str, list[FleetRow]]:
        """Rows grouped by hardware class: compare speed-ups only within one group."""
        groups: dict[str, list[FleetRow]] = {}
        for row in self.rows:
            groups.setdefault(row.hardware or "unknown", []).append(row)
        return groups

    def __str__(self) -> str:
        rows = [
            [
                r.job,
                r.node,
                r.hardware,
                _status(r),
                r.threads or "-",
                "-" if r.depth is None else r.depth,
                "-" if r.speedup is None else f"{r.speedup:.2f}x",
                r.builds,
                f"{r.cache_hits} ({r.remote_hits} remote)",
                f"{r.wall_s:.1f} s",
            ]
            for r in self.rows
        ]
        table = format_table(
            [
                "job",
                "node",
                "hardware",
                "status",
                "threads",
                "depth",
                "speed-up",
                "builds",
                "hits",
                "wall",
            ],
            [[escape_controls(c) if isinstance(c, str) else c for c in row] for row in rows],
            title=f"fleet tune: {len(self.rows)} jobs, {len(self.failed())} failed",
        )
        return table


def _status(row: FleetRow) -> str:
    """The status column: a failure's error, or why a completed job left its model untuned."""
    if not row.ok:
        return f"{row.status}: {row.error}"
    return f"{row.status}, untuned: {row.untuned}" if row.untuned else row.status
