"""Serving a choice: which runner serves which graph, and the dispatcher that does it.

* :mod:`.plan`: :class:`Plan` and :class:`PlanEntry` (module path, graph, backend, runner).
* :mod:`.wrap`: :func:`wrap` installs a dispatcher per module that routes each call to the runner
  of its graph, else to the original forward; :func:`unwrap` undoes it.
* :mod:`.artifacts`: one saved runner as every store writes and reads it (record, files, hashes).

Imports the backends and :mod:`tunetree.signature`, never the rooms that choose.
"""
