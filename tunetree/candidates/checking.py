"""Check a built candidate's outputs against eager: on the recorded samples and on probes."""

from __future__ import annotations

from typing import Any

import torch

from ..accuracy import output_error
from ..backends.base import Backend, Runner
from ..signature import parking
from ..signature.compare import Tolerances, compare_all
from ..signature.probes import checks
from .rows import RunError, Verdict, short_error
from .state import SessionState


class Checking(SessionState):
    """The check of a session's candidates: their outputs judged against eager's."""

    def judge(
        self, backend: Backend, outputs: list[Any], references: list[Any] | None = None
    ) -> Verdict:
        """Whether ``backend``'s outputs of the graph's samples are acceptable.

        With ``references`` (eager's outputs of other calls: probes) the outputs are of those
        calls. Returns the :class:`Verdict`: why not ("" when they are), the largest absolute
        difference from eager and, under an accuracy budget, the error in its module metric.
        """
        if references is None:
            references = [parking.reference(self.graph, i) for i in range(len(outputs))]
        error = None
        if self.accuracy is not None:
            error = output_error(references, outputs, self.accuracy.module_metric)
        if self._budgeted(backend):
            return Verdict(
                self._over_limit(error), output_error(references, outputs, "max_abs"), error
            )
        comparison = compare_all(references, outputs, self._tolerances(backend))
        return Verdict("" if comparison.ok else comparison.reason, comparison.max_abs_diff, error)

    def _budgeted(self, backend: Backend) -> bool:
        """Whether ``backend`` is admitted by the accuracy budget rather than by tolerances."""
        return self.accuracy is not None and not backend.preserves_results

    def _tolerances(self, backend: Backend) -> Tolerances:
        return backend.tolerances() or self.tolerances

    def _over_limit(self, error: float | None) -> str:
        """Why ``error`` breaks the budget's module limit ("" when it does not)."""
        assert self.accuracy is not None
        limit = self.accuracy.module_limit
        if error is not None and error <= limit:
            return ""
        return (
            f"{self.accuracy.module_metric} error {error:.3g} on this module's outputs is over "
            f"the budget's module limit {limit:g}"
        )

    def run_judged(self, backend: Backend, runner: Runner) -> Verdict:
        """``runner`` run on every recorded sample, each output judged as it comes.

        Only one candidate output is alive at a time: a decode step's output holds the whole
        cache, and keeping every sample's copy until all had run made those copies a large part
        of tuning's peak device memory. The verdict is that of :meth:`judge` over all samples:
        the first mismatch decides (its sample named), the largest difference and, under an
        accuracy budget, the largest error. Raises :class:`RunError` when the runner fails.
        """
        samples = self.graph.samples
        if len(samples) != len(self.graph.outputs):
            raise ValueError(f"{len(samples)} samples but {len(self.graph.outputs)} outputs")
        reason, worst, error = "", 0.0, None
        for i, sample in enumerate(samples):
            try:
                with torch.no_grad():
                    output = sample.run(runner)
            except Exception as exc:
                raise RunError(exc) from exc
            # Back from host memory one at a time, and only once the run is over: alive during
            # it, eager's output (a decode step's whole cache) would add to the peak.
            reference = parking.reference(self.graph, i)
            wrong, diff, err = self.judge(backend, [output], [reference])
            del output, reference
            worst = max(worst, diff)
            if err is not None:
                error = err if error is None else max(error, err)
            if wrong and not reason:
                reason = (f"sample {i}: " if len(samples) > 1 else "") + wrong
                if self.accuracy is None:
                    break  # nothing more to learn: the first mismatch rejects it
        if self._budgeted(backend):
            reason = self._over_limit(error)
        return Verdict(reason, worst, error)

    def probe_failure(self, runner: Runner) -> str | None:
        """Why ``runner`` is wrong on a probe call of this graph (:mod:`.probes`), or None.

        Probes are the range ends, an odd size between them and value probes; they are compared
        with the runner's backend's tolerances (under an accuracy budget, a results-changing
        backend with the module limit). Eager is the reference and is not probed.
        """
        if runner.backend.kind == "eager":
            return None
        for probe in checks(self.module, self.graph):
            try:
                with torch.no_grad():
                    got = probe.run(runner)
            except Exception as exc:
                return f"fails on {probe.label}: {short_error(exc, 200)}"
            # Eager's output comes back only now, and each output goes before the next probe:
            # a decode step's output is its whole cache.
            wrong = self.judge(runner.backend, [got], [probe.expected()]).reason
            label = probe.label
            del got, probe
            if wrong:
                return f"wrong on {label}: {wrong}"
        return None
