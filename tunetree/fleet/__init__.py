"""Tuning fanned out over Ray into the shared tuning cache: tune once per kind of machine.

``tt.fleet.tune(jobs, remote="s3://BUCKET/PREFIX")`` runs each :class:`Job` as a Ray task on a
node that offers its resources; the node builds the model and its data from importable
references, auto-tunes it there into its local cache and the shared remote tier, and reports
one :class:`FleetRow`. Every later host of the same kind then gets the tuned model from the
remote with no build. Results are never merged across kinds of machine: entries are keyed by
the hard environment, and rows name their hardware class.

* :mod:`~tunetree.fleet.job`: ``Job`` and importable references.
* :mod:`~tunetree.fleet.worker`: what a worker runs; :mod:`~tunetree.fleet.hardware`: the
  hardware class of a node.
* :mod:`~tunetree.fleet.launch`: ``tune`` (imports Ray only when called).
* :mod:`~tunetree.fleet.report`: ``FleetRow``, ``FleetReport``.
"""

from __future__ import annotations

from .._util.deprecation import Moved, moved_names
from .job import Job
from .launch import tune
from .report import FleetReport, FleetRow

__all__ = ["FleetReport", "FleetRow", "Job", "tune"]

_MOVED = {"hardware_class": Moved("tunetree.fleet.hardware")}
"""Names this package exported before its API was narrowed, and where they live now."""

__getattr__ = moved_names("tunetree.fleet", _MOVED)
