"""What a call is, before anything is tuned.

* :mod:`.graph`: :class:`GraphKey` (structure, dtypes, ranks, constants, sizes or ranges),
  :class:`Graph`, :class:`Sample`, flattening of outputs and cache objects.
* :mod:`.binding`: one canonical form per call (positional, defaults filled), decorated forwards.
* :mod:`.shapes`: grouping calls that differ only in sizes into ranged graphs, resizing, probes'
  sizes and values; :mod:`.probes`: the probe calls a ranged graph's candidates are checked on.
* :mod:`.compare`: tolerances and the comparison of outputs with eager's.
* :mod:`.modules`: walking the model (roots, paths, running it); :mod:`.state`: keeping the
  model's and the process's state unchanged.
* :mod:`.inspection`: :func:`inspect`, the module tree with depths, time shares and samples.
* :mod:`.stateful`: objects that carry state between calls (cache objects) as the dispatcher
  (the :class:`~.stateful.CallState` protocol) and the backends see them; the rest of the
  package reaches :mod:`tunetree.hf` only through it.

Imports only :mod:`tunetree.hf`, :mod:`tunetree._util` and :mod:`tunetree.errors`.
"""
