"""Choosing per graph: build each candidate, check it against eager, measure, pick.

* :mod:`.evaluate`: :class:`GraphSession`, one graph's candidates built (:mod:`.building`),
  checked on the recorded samples and probes (:mod:`.checking`), timed (:mod:`.measuring`)
  and kept in the race or not (:mod:`.decide`); :class:`CandidateRow` per candidate
  (:mod:`.rows`), the session's data in :mod:`.state`.
* :mod:`.strategy`: which candidates, in which order, and how the winner is picked.
* :mod:`.measure`: interleaved trials, medians and spread; :mod:`.budget`: the time budget
  (:class:`Deadline`, :class:`Stopwatch`).
* :mod:`.results`: :class:`GraphResult` and the :class:`GraphCache` protocol the tuner asks.
"""
