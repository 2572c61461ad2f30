"""Autoscalers of a fleet's groups: read a signal, decide a replica count, ask the fleet for it.

Each autoscaled group (``autoscaling:`` on a fleet group, :class:`~servesim.topology.fleet_keys.
AutoscalingKeys`) runs the control loop of Kubernetes' Horizontal Pod Autoscaler, with Knative's
(KServe's) concurrency signal as one choice:

1. Every ``sample_s`` the group's signal is sampled over its ready replicas: ``queue``, the waiting
   requests; ``in_flight``, waiting + running (vLLM's ``num_requests_waiting`` and
   ``num_requests_running`` gauges, what KServe/llm-d scale on); ``kv``, the mean KV-cache use
   (vLLM's ``gpu_cache_usage_perc``). Requests held at the fleet's door (no live replica could
   take them) count as waiting. ``ttft`` instead reads the TTFT of the group's requests that
   finished in the window (its ``ttft_percentile``).
2. Every ``interval_s`` (HPA's sync period, 15 s) the mean over the last ``window_s`` gives
   ``ratio = value per ready replica / target``; the recommendation is ``ceil(ready x ratio)``
   (for a total such as ``in_flight`` that is ``ceil(total / target)``, KPA's rule), unchanged
   while ``|ratio - 1| <= tolerance`` (HPA's 10%), clamped to ``[min_replicas, max_replicas]``.
   With no ready replica (scaled to zero) it is ``ceil(total / target)`` of the held and queued
   requests.
3. More than the replicas already ready or cold-starting: ask for the difference now (cold
   starts take ``cold_start_s``). Fewer: scale down only to the highest recommendation of the
   last ``scale_down_delay_s`` (HPA's scale-down stabilization window, 300 s), cancelling cold
   starts first, then draining the least loaded replicas.

The loop stops once every request has finished or been refused (or nothing but itself is left to
happen and no request waits at the door), so the run still ends when there is nothing left to
do. A fixed group is never scaled.

Sources: Kubernetes, "Horizontal Pod Autoscaling" (algorithm details: ``desiredReplicas =
ceil[currentReplicas x currentMetricValue / desiredMetricValue]``, tolerance 0.1, sync period 15 s,
``--horizontal-pod-autoscaler-downscale-stabilization`` 5 minutes); KEP-4951 (configurable
tolerance); Knative Serving autoscaling (KPA: concurrency target, 60 s stable window).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np
import simpy

from servesim.topology.fleet_keys import AutoscalingKeys
from servesim.topology.fleet_runtime import FleetRuntime

TOTAL_SIGNALS = ("queue", "in_flight")
"""Signals summed over the group (compared per replica with the target)."""


@dataclass
class GroupScaler:
    """The autoscaler of one group."""

    group: int
    keys: AutoscalingKeys
    samples: deque[tuple[float, float]] = field(default_factory=deque)
    """(time, value): a total for queue/in_flight, a mean for kv."""
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    finished: deque[tuple[float, float]] = field(default_factory=deque)
    """(finish time, TTFT) of the group's finished requests, for the ttft signal."""
    scale_ups: int = 0
    scale_downs: int = 0
    decisions: list[tuple[float, float, int]] = field(default_factory=list)
    """(time, signal value per ready replica, recommendation) at every decision."""


class Autoscaler:
    """The control loops of a fleet's autoscaled groups, on one SimPy process."""

    def __init__(self, runtime: FleetRuntime, scalers: list[GroupScaler]) -> None:
        self.runtime = runtime
        self.scalers = scalers
        self.env = runtime.sim.env
        self.total = len(runtime.sim.requests)
        if any(s.keys.signal == "ttft" for s in scalers):
            runtime.listeners.append(self._finished)
        if scalers:
            self.env.process(self._run())

    def _run(self) -> Generator[simpy.Event, object, None]:
        env, runtime = self.env, self.runtime
        step = min(s.keys.sample_s for s in self.scalers)
        next_decision = {id(s): s.keys.interval_s for s in self.scalers}
        next_sample = {id(s): 0.0 for s in self.scalers}
        while runtime.settled < self.total:
            now = env.now
            for scaler in self.scalers:
                if now + 1e-9 >= next_sample[id(scaler)]:
                    self._sample(scaler, now)
                    next_sample[id(scaler)] = now + scaler.keys.sample_s
                if now + 1e-9 >= next_decision[id(scaler)]:
                    self._decide(scaler, now)
                    next_decision[id(scaler)] = now + scaler.keys.interval_s
            if env.peek() == math.inf and not runtime.held:
                return  # nothing else can ever happen (a request a policy left queued): stop too
            yield env.timeout(step)

    # ------------------------------------------------------------------ signals
    def _sample(self, scaler: GroupScaler, now: float) -> None:
        signal = scaler.keys.signal
        if signal == "ttft":
            return
        states = [slot.replica.state for slot in self.runtime.group_slots(scaler.group)
                  if slot.state == "ready" and slot.replica is not None]
        held = sum(1 for r in self.runtime.held if self.runtime.eligible[scaler.group, r])
        if signal == "kv":
            value = (float(np.mean([(s.pool.total - s.pool.free) / s.pool.total for s in states]))
                     if states else 0.0)
        elif signal == "queue":
            value = float(sum(s.queued for s in states) + held)
        else:
            value = float(sum(s.outstanding for s in states) + held)
        scaler.samples.append((now, value))
        while scaler.samples and scaler.samples[0][0] <= now - scaler.keys.window_s:
            scaler.samples.popleft()

    def _finished(self, ids: np.ndarray, now: float) -> None:
        r = self.runtime.sim.requests
        groups = self.runtime._slot_group[r.replica[ids]]
        ttft = r.first_token[ids] - r.arrival[ids]
        for scaler in self.scalers:
            if scaler.keys.signal == "ttft":
                for value in ttft[groups == scaler.group].tolist():
                    scaler.finished.append((now, value))

    def _value(self, scaler: GroupScaler, now: float) -> float | None:
        keys = scaler.keys
        if keys.signal == "ttft":
            while scaler.finished and scaler.finished[0][0] <= now - keys.window_s:
                scaler.finished.popleft()
            if not scaler.finished:
                return None
            return float(np.percentile([v for _, v in scaler.finished], keys.ttft_percentile))
        if not scaler.samples:
            return None
        return float(np.mean([v for _, v in scaler.samples]))

    # ------------------------------------------------------------------ decisions
    def _decide(self, scaler: GroupScaler, now: float) -> None:
        keys, runtime = scaler.keys, self.runtime
        counts = runtime.counts(scaler.group)
        ready, starting = counts["ready"], counts["provisioning"]
        current = ready + starting
        value = self._value(scaler, now)
        if value is None:
            desired = current
            per_replica = 0.0
        elif ready == 0:  # scaled to zero (or all cold-starting): the demand itself decides
            per_replica = value
            if keys.signal in TOTAL_SIGNALS:
                wanted = math.ceil(value / keys.target - 1e-9) if value > 0 else 0
            else:  # kv or ttft say nothing without a replica: one for whatever waits at the door
                wanted = 1 if runtime.held else 0
            desired = max(current, wanted)
        else:
            per_replica = value / ready if keys.signal in TOTAL_SIGNALS else value
            ratio = per_replica / keys.target
            desired = current if abs(ratio - 1) <= keys.tolerance else math.ceil(ready * ratio - 1e-9)
        desired = min(max(desired, keys.min_replicas), keys.max_replicas)
        scaler.recommendations.append((now, desired))
        while scaler.recommendations and scaler.recommendations[0][0] < now - keys.scale_down_delay_s:
            scaler.recommendations.popleft()
        scaler.decisions.append((now, per_replica, desired))
        if desired > current:
            if runtime.scale_up(scaler.group, desired - current, now):
                scaler.scale_ups += 1
            return
        stable = max(d for _, d in scaler.recommendations)
        if stable < current and runtime.scale_down(scaler.group, current - stable, now):
            scaler.scale_downs += 1
