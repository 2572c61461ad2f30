"""What a simulation stopped at ``now`` already says about its final latencies, for certain.

The capacity planner stops a probe whose SLO verdict can no longer change (``probe.py``). That is
exact only if every figure the verdict reads is bounded by what has happened so far. At a clock
value ``now`` (between events: everything before ``now`` has happened), for each request:

- **completed or refused**: its latencies are final (a refused request counts as infinite);
- **arrived, no first token yet**: its first token comes at ``now`` or later, so
  ``TTFT >= now - arrival`` (a request still queueing whose wait is past the TTFT limit has
  certainly missed it), and likewise ``E2E >= now - arrival``;
- **first token out, not finished**: it finishes at ``now`` or later, so
  ``TPOT = (finish - first token) / (output - 1) >= (now - first token) / (output - 1)``;
- **not arrived yet**: nothing is known; 0 bounds every latency.

A fast-forwarded run of decode steps (``servesim.core.fast_forward``) credits its tokens when it
ends, so a request in it shows as unfinished until then, and it does finish at the run's end or
later: the bounds above still hold. A one-token output has no TPOT (NaN, left out of the
percentile) unless refused; treating it as NaN while it may still be refused is a lower bound too,
since an extra infinite value can only raise a percentile.

The verdict (``evaluate.verdict``) is monotone in every latency: a percentile (order statistics,
NumPy's linear interpolation) and a mean over replications never fall when a value rises, and the
attainment never rises. So the verdict computed from these bounds is certain when it fails by
more than rounding (:data:`SAFETY`).
"""

from __future__ import annotations

import math

import numpy as np

from servesim.capacity.config import CapacityConfig
from servesim.capacity.evaluate import METRICS, _percentile, judged_mask
from servesim.core.state import DONE, REJECTED, RequestState

SAFETY = 1e-9
"""Relative margin beyond the limit a bound must reach before a failure counts as certain: the
verdict's arithmetic (interpolation, the mean) is monotone up to a few units in the last place."""


def lower_bounds(r: RequestState, now: float) -> dict[str, np.ndarray]:
    """Per request, a value no larger than its final TTFT, TPOT and E2E as the verdict reads them
    (:func:`~servesim.capacity.evaluate.latency_values`), known at ``now`` (module docstring)."""
    arrival, first, finish = r.arrival, r.first_token, r.finish
    done = r.status == DONE
    refused = r.status == REJECTED
    arrived = ~done & ~refused & (arrival <= now)
    waited = np.where(arrived, now - arrival, 0.0)
    ttft = np.where(done | np.isfinite(first), first - arrival, waited)
    ttft[refused] = np.inf
    e2e = np.where(done, finish - arrival, waited)
    e2e[refused] = np.inf
    output = r.output
    multi = output > 1
    tpot = np.full(len(r), np.nan)
    denominator = np.maximum(output - 1, 1)
    finished = multi & done
    tpot[finished] = (finish[finished] - first[finished]) / (output[finished] - 1)
    decoding = multi & ~done & ~refused
    tpot[decoding] = np.where(np.isfinite(first[decoding]),
                              (now - first[decoding]) / denominator[decoding], 0.0)
    tpot[refused] = np.inf
    return {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e}


def certainly_missed(bounds: dict[str, np.ndarray], r: RequestState, config: CapacityConfig) -> np.ndarray:
    """Requests that cannot complete within every limit any more (refused, or a bound past a limit)."""
    missed = r.status == REJECTED
    for key, limit in config.slo.limits().items():
        missed = missed | (bounds[key] > limit)
    return missed


def settled_failure(config: CapacityConfig, runs: list[tuple[dict[str, np.ndarray], np.ndarray]]
                    ) -> str | None:
    """Why the verdict over these replications is certainly a failure, or None while it may pass.

    ``runs``: per replication, the latency bounds of every request of its table (final values for
    one that ended) and the requests that certainly miss a limit."""
    slo = config.slo
    if slo.attainment is not None:
        upper = []
        for _, missed in runs:
            judged = judged_mask(missed.size, config)
            upper.append(float((~missed[judged]).mean()) if judged.any() else 0.0)
        best = float(np.mean(upper))
        if best - slo.attainment < -SAFETY:
            return (f"attainment at most {best:.4f} < {slo.attainment:g} whatever the requests still "
                    "running or queued do")
        return None
    for key, limit in slo.limits().items():
        assert key in METRICS
        points = []
        for bounds, missed in runs:
            judged = judged_mask(missed.size, config)
            points.append(_percentile(bounds[key][judged], slo.percentile))
        if any(math.isnan(p) for p in points):
            continue  # the final percentile may be undefined (NaN), which the verdict lets pass
        low = float(np.mean(points))
        if low > limit * (1 + SAFETY):
            return (f"p{slo.percentile:g} {key.removesuffix('_s').upper()} at least {low:.4g} s "
                    f"> {limit:g} s whatever the requests still running or queued do")
    return None
