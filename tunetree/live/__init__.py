"""Tune on live traffic: ``tt.jit(model)`` serves from the first call and tunes in the background.

* :mod:`.start`: :func:`jit`, which wires the rest together.
* :mod:`.served`: :class:`Served`, the served model (status, wait, undo, the atomic swap).
* :mod:`.recorder`: the calls kept to tune on, bounded (:class:`RecordLimits`).
* :mod:`.tuner`: the background thread that runs ``auto_tune`` on a private copy.
* :mod:`.calls`, :mod:`.store`: the calls tuned on, kept in the tuning cache for warm starts.
"""

from __future__ import annotations

from .recorder import RecordLimits
from .served import Served
from .start import jit

__all__ = ["RecordLimits", "Served", "jit"]
