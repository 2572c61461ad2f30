"""Many closed-loop measurements of one mean each, re-timed in one pass.

A serving-file fit evaluates its loss a thousand times over hundreds of rows, each a trace of
thousands of steps (:class:`~servesim.calibration.replay.ScheduleTrace`); looping over the rows in
Python made that the slowest part of ``fit-serving``. Here every row's steps are laid end to end:
one vector of step times for all of them, one cumulative sum, and each request's TTFT and TPOT
are differences of that sum at indices fixed when the stack is built (a row's own ends are the
global ones less the value where the row starts). The result is the same as
:meth:`Measurement.predicted` row by row, to rounding (tested), for the traces it covers:
closed loops (no open-loop arrivals), one measured mean per row, the kernels' scales fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from servesim.calibration.replay import Coefficients, latency_beyond_wait

if TYPE_CHECKING:
    from servesim.calibration.engine_fit import Measurement


@dataclass(frozen=True)
class StackedMeans:
    """The steps of many traces end to end, and where each measured request sits in them."""

    gpu_s: np.ndarray
    """Per step: its GPU time (kernels at the stack's scales, plus exposed launches)."""
    seqs: np.ndarray
    tokens: np.ndarray
    overlap: np.ndarray
    start: np.ndarray
    """Per request: index into the global ends where its wait began (its arrival step)."""
    first: np.ndarray
    """Per request: index of the end of its first token's step."""
    last: np.ndarray
    outputs: np.ndarray
    done: np.ndarray
    weights: np.ndarray
    row: np.ndarray
    """Per request: which measurement it belongs to."""
    measured: dict[str, np.ndarray]
    """Per metric (ttft, tpot): the measured mean of each measurement."""
    waited: np.ndarray
    """Per step: the replica waited for a request to cross the front end before it (traces made
    with a front end; else False)."""
    admit: np.ndarray
    """Per request: index of the step that first scheduled it."""
    flat: np.ndarray
    """Per request: its trace records no waits, so the front end's latency is added as it is."""

    @classmethod
    def build(cls, measurements: Sequence[Measurement], scales: tuple[float, ...]) -> StackedMeans | None:
        """The stack of ``measurements``, or None when one of them is not a closed loop with one
        measured mean (those are evaluated one by one)."""
        if not measurements:
            return None
        for m in measurements:
            trace = m.trace
            if trace.arrival_s is not None or trace.release_s is not None or m.ttft_s.size != 1:
                return None
        gpu, seqs, tokens, overlap, waited = [], [], [], [], []
        start, first, last, outputs, done, weights, row, admit, flat = [], [], [], [], [], [], [], [], []
        offset = 0
        for index, m in enumerate(measurements):
            trace, chosen = m.trace, m.requests
            gpu.append(trace.kernel_s @ np.asarray(scales) + trace.launch_exposed_s)
            seqs.append(trace.seqs)
            tokens.append(trace.tokens)
            overlap.append(np.full(trace.seqs.size, trace.overlap))
            start.append(offset + trace.arrival_step[chosen])
            first.append(offset + trace.first_step[chosen] + 1)
            last.append(offset + trace.last_step[chosen] + 1)
            outputs.append(trace.outputs[chosen].astype(float))
            done.append(trace.done[chosen])
            weights.append(np.ones(chosen.size) if m.weights is None else np.asarray(m.weights, float))
            row.append(np.full(chosen.size, index))
            recorded = trace.waited is not None and trace.admit_step is not None
            waited.append(trace.waited if trace.waited is not None else np.zeros(trace.seqs.size, bool))
            admit.append(offset + (trace.admit_step[chosen] if trace.admit_step is not None
                                   else trace.arrival_step[chosen]))
            flat.append(np.full(chosen.size, not recorded))
            offset += trace.seqs.size
        return cls(np.concatenate(gpu), np.concatenate(seqs), np.concatenate(tokens),
                   np.concatenate(overlap), np.concatenate(start), np.concatenate(first),
                   np.concatenate(last), np.concatenate(outputs), np.concatenate(done),
                   np.concatenate(weights), np.concatenate(row),
                   {"ttft": np.array([float(m.ttft_s[0]) for m in measurements]),
                    "tpot": np.array([float(m.tpot_s[0]) for m in measurements])},
                   np.concatenate(waited), np.concatenate(admit), np.concatenate(flat))

    def predicted(self, c: Coefficients) -> dict[str, np.ndarray]:
        """Per metric, each measurement's predicted mean (NaN where no request gives one)."""
        cpu = c.cpu_s(self.seqs, self.tokens)
        busy = np.where(self.overlap, np.maximum(self.gpu_s, cpu), self.gpu_s + cpu)
        gaps = c.frontend_s * self.waited  # as replay.closed_loop_ends, over every row at once
        ends = np.concatenate([[0.0], np.cumsum(busy + c.serial_s(self.seqs) + gaps)])
        extra = np.where(self.flat, c.frontend_s,
                         latency_beyond_wait(ends, gaps, self.admit, self.start, c.frontend_s))
        ttft = np.where(self.done, ends[self.first] - ends[self.start] + extra, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(self.done & (self.outputs > 1),
                            (ends[self.last] - ends[self.first]) / (self.outputs - 1), np.nan)
        count = self.measured["ttft"].size
        out = {}
        for name, values in (("ttft", ttft), ("tpot", tpot)):
            ok = np.isfinite(values)
            total = np.bincount(self.row[ok], self.weights[ok] * values[ok], minlength=count)
            weight = np.bincount(self.row[ok], self.weights[ok], minlength=count)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[name] = np.where(weight > 0, total / weight, np.nan)
        return out

    def loss(self, c: Coefficients, metrics: Sequence[str]) -> float:
        """:func:`~servesim.calibration.engine_fit.loss` of these measurements: per measurement the
        mean |ln(predicted / measured)| over its metrics (0 when none is defined), averaged."""
        predicted = self.predicted(c)
        count = self.measured["ttft"].size
        total, defined = np.zeros(count), np.zeros(count)
        for name in metrics:
            p, m = predicted[name], self.measured[name]
            ok = np.isfinite(p) & np.isfinite(m) & (p > 0) & (m > 0)
            with np.errstate(invalid="ignore", divide="ignore"):
                total += np.where(ok, np.abs(np.log(np.where(ok, p / np.where(ok, m, 1.0), 1.0))), 0.0)
            defined += ok
        per_row = np.where(defined > 0, total / np.maximum(defined, 1), 0.0)
        return float(per_row.sum() / max(count, 1))
