"""The entry points that search: one cut, one depth end to end, every depth.

* :mod:`.config`: :class:`TuneConfig`, the settings :func:`tune` and :func:`auto_tune` share.
* :mod:`.tune`: :func:`tune` and :func:`tune_cut`, one cut of the model.
* :mod:`.endtoend`: one depth measured end to end beside the untuned model.
* :mod:`.accuracy_check`: an accuracy budget's end-to-end check and repair of a depth's plan.
* :mod:`.auto`: :func:`auto_tune`; :mod:`.auto_result`: :class:`AutoTuneResult` and its rows.

The top room: it may import every other one.
"""
