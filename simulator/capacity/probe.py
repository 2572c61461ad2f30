"""One probe of the capacity search: its replications simulated side by side, stopped as soon as
its failure is certain.

A rate passes when the mean over replications of each SLO metric meets its target
(``evaluate.verdict``). The replications of a probe are advanced together, slice by slice of
simulated time (``servesim.pipeline.slices``), and after each slice the verdict is worked out from
what is certain so far (``bounds``: a request queueing past the TTFT limit has missed it, whatever
happens next). Once that verdict fails, the full runs would fail too, so the probe stops there and
reports the rate as failed: the search takes the same path and finds the same answer, for a
fraction of the simulated time of an overloaded rate. A pass is never declared early: it needs
the upper bounds of requests not yet served, which the simulation alone gives.

Advancing the replications together matters: with two replications the first alone would have
to miss by twice the limit before the mean is certain to, while side by side both count.

A **replication** may also be several independent simulations whose requests are judged
together: a fleet behind a round-robin router is exactly its replicas each simulated on its own
share of the requests (``fleet.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servesim.capacity.bounds import certainly_missed, lower_bounds, settled_failure
from servesim.capacity.config import CapacityConfig
from servesim.capacity.evaluate import LatencyMetrics, latency_metrics, latency_values, verdict
from servesim.capacity.saturation import RUN, WINDOW_SLICES, BacklogTrend, waiting
from servesim.core.state import DONE, REJECTED
from servesim.pipeline.slices import SlicedSimulation
from servesim.workloads.requests import RequestTable

SLICES = 100
"""Checks per probe while requests arrive (and as often after): the stop comes at most this
fraction of the run after the verdict is settled, and the checks cost well under 1% of a run."""


@dataclass
class Part:
    """One simulation whose requests sit at ``rows`` of its replication's table (None: all)."""

    sim: SlicedSimulation
    rows: np.ndarray | None = None


@dataclass
class Replication:
    """One replication of a probe: its table and the simulations that serve it."""

    table: RequestTable
    parts: list[Part] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return all(part.sim.done for part in self.parts)

    def advance(self, until: float) -> None:
        for part in self.parts:
            part.sim.advance(until)

    def _pooled(self, per_part: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        if len(self.parts) == 1 and self.parts[0].rows is None:
            return per_part[0]
        n = len(self.table)
        pooled: dict[str, np.ndarray] = {}
        for key in per_part[0]:
            column = np.empty(n, dtype=per_part[0][key].dtype)
            for part, values in zip(self.parts, per_part, strict=True):
                column[part.rows if part.rows is not None else slice(None)] = values[key]
            pooled[key] = column
        return pooled

    def values(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The final latencies of every request of the table, and which completed (ended runs)."""
        per_part = []
        for part in self.parts:
            r = part.sim.result().request_state
            per_part.append({**latency_values(r), "done": r.status == DONE})
        pooled = self._pooled(per_part)
        done = pooled.pop("done")
        return pooled, done

    def bounds(self, config: CapacityConfig) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Lower bounds of every request's latencies now, and the requests that certainly miss."""
        per_part = []
        for part in self.parts:
            r = part.sim.requests
            b = lower_bounds(r, part.sim.now)
            per_part.append({**b, "missed": certainly_missed(b, r, config)})
        pooled = self._pooled(per_part)
        missed = pooled.pop("missed")
        return pooled, missed

    def refused(self) -> np.ndarray:
        return self._pooled([{"x": part.sim.requests.status == REJECTED} for part in self.parts])["x"]


@dataclass
class Stopped:
    """A probe stopped because its failure was certain (or, opted in, its queue kept growing)."""

    reason: str
    at_s: float
    """Simulated time at which it stopped (every replication's clock)."""
    finished: int
    """Requests completed or refused by then, over all replications."""
    requests: int
    certain: bool = True
    """False: stopped by the statistical saturation test (``saturation.py``), not by bounds."""


def run_together(replications: list[Replication], config: CapacityConfig, early_stop: bool,
                 saturation_stop: bool = False) -> Stopped | None:
    """Advance the replications side by side until all ended (None) or, with ``early_stop``,
    until their verdict is certainly a failure, or with ``saturation_stop`` until a queue
    keeps growing (:class:`Stopped`)."""
    if not (early_stop or saturation_stop):
        for replication in replications:
            replication.advance(math.inf)
        return None
    last_arrival = max(float(rep.table.arrival_s[-1]) for rep in replications if len(rep.table))
    slice_s = max(last_arrival / SLICES, 1e-3)
    trends = [BacklogTrend() for _ in replications]
    now = 0.0
    slices = 0
    while not all(rep.done for rep in replications):
        now += slice_s
        slices += 1
        for rep in replications:
            rep.advance(now)
        reason = settled_failure(config, [rep.bounds(config) for rep in replications]) if early_stop else None
        certain = True
        if (reason is None and saturation_stop and slices % WINDOW_SLICES == 0 and now <= last_arrival
                and slices >= config.search.warmup_fraction * SLICES):
            for k, (rep, trend) in enumerate(zip(replications, trends, strict=True)):
                if trend.add(sum(waiting(part.sim.requests, now) for part in rep.parts)):
                    reason = (f"saturated: replication {k}'s queue grew in {RUN - 1} windows in a row "
                              f"({', '.join(map(str, trend.samples[-RUN:]))} requests; a stable queue does "
                              f"that with probability <= 1/{math.factorial(RUN)} per test)")
                    certain = False
                    break
        if reason is not None:
            finished = sum(int(np.count_nonzero(np.isin(part.sim.requests.status, (DONE, REJECTED))))
                           for rep in replications for part in rep.parts)
            return Stopped(reason, now, finished, sum(len(rep.table) for rep in replications), certain)
    return None


def stopped_record(config: CapacityConfig, replications: list[Replication], stopped: Stopped,
                   rate: float) -> dict[str, Any]:
    """The record of a probe stopped early: failed, with the *bounds* known when it stopped (its
    metrics are lower bounds, attainment an upper bound, margins upper bounds) and why."""
    bounded: list[LatencyMetrics] = []
    for rep in replications:
        bounds, _ = rep.bounds(config)
        bounded.append(latency_metrics(bounds, ~rep.refused(), config))
    record = verdict(config, bounded, rate)
    assert not stopped.certain or not record["passed"], "a probe stopped early must fail on its bounds"
    record["passed"] = False
    record["replications"] = len(replications)
    record["stopped_early"] = {"reason": stopped.reason, "certain": stopped.certain, "at_s": stopped.at_s,
                               "requests_finished": stopped.finished, "requests": stopped.requests,
                               "bounds": "metrics are lower bounds, attainment and margins upper bounds"}
    return record
