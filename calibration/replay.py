"""Replaying a run's schedule under other engine coefficients, without simulating again.

When every request is sent at t = 0, or by closed-loop clients with no think time, the order of
events does not depend on how long steps take: a request arrives exactly when a step ends, so the
sequence of batches (which requests run in step k, with how many tokens) is fixed by the policy
alone. A run's step times are then a function of the engine's coefficients applied to that fixed
sequence, and each request's TTFT and TPOT are sums of step times over its own span of steps.
:func:`trace_run` records that sequence from one run whose engine does no CPU work (its steps take
exactly their GPU time: kernels, padding, launches); :meth:`ScheduleTrace.evaluate` re-times it for
any CPU coefficients (and per-operator-class scales of the kernels) in microseconds, which is
what makes fitting them to hundreds of measured deployments cheap. For open-loop arrivals the
schedule does depend on the step times; :mod:`servesim.calibration.engine_fit` then alternates
fitting on a trace and re-simulating.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from servesim.config import validate_document
from servesim.cost.step_cost import OP_CLASSES
from servesim.pipeline import RunResult, prepare, simulate
from servesim.workloads.requests import RequestTable

ZERO_CPU = {"step_overhead_s": 0.0, "cpu_per_seq_s": 0.0, "cpu_per_token_s": 0.0, "cpu_per_sample_s": 0.0,
            "serial_overhead_s": 0.0, "serial_per_seq_s": 0.0, "frontend_latency_s": 0.0}
"""Engine knobs that make a run's steps take their GPU time alone (and requests enter the
deployment as they are sent)."""
KERNEL_CLASSES = tuple(name for name in OP_CLASSES if name not in ("overhead", "proposal"))
"""The kernel classes a run can be rescaled by (not the host overhead, nor the speculative proposer's
passes, which are priced from the same kernels)."""


@dataclass(frozen=True)
class Coefficients:
    """What a fit may change: the engine's CPU work per step (the part an overlapping engine hides
    under the GPU, and the serial part it cannot), and a scale on each kernel class (1 = the
    hardware profile as it is)."""

    fixed_s: float = 0.0
    per_seq_s: float = 0.0
    per_token_s: float = 0.0
    scales: tuple[float, ...] = (1.0,) * len(KERNEL_CLASSES)
    serial_fixed_s: float = 0.0
    serial_per_seq_s: float = 0.0
    frontend_s: float = 0.0
    """The front end's latency per request (``CpuCosts.frontend_s``): added to every TTFT."""

    def knobs(self) -> dict[str, float]:
        return {"step_overhead_s": self.fixed_s, "cpu_per_seq_s": self.per_seq_s,
                "cpu_per_token_s": self.per_token_s, "cpu_per_sample_s": 0.0,
                "serial_overhead_s": self.serial_fixed_s, "serial_per_seq_s": self.serial_per_seq_s,
                "frontend_latency_s": self.frontend_s}

    def cpu_s(self, seqs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Host time per step that may overlap the GPU."""
        return self.fixed_s + self.per_seq_s * seqs + self.per_token_s * tokens

    def serial_s(self, seqs: np.ndarray) -> np.ndarray:
        """Host time per step the GPU waits for in any case."""
        return self.serial_fixed_s + self.serial_per_seq_s * seqs


@dataclass(frozen=True)
class ScheduleTrace:
    """A run's fixed sequence of steps and where each request sits in it."""

    kernel_s: np.ndarray
    """(steps, classes): seconds of each kernel class per step (``KERNEL_CLASSES``)."""
    launch_exposed_s: np.ndarray
    """Per step: time the GPU waited for eager launches beyond its kernels."""
    seqs: np.ndarray
    tokens: np.ndarray
    overlap: bool
    arrival_step: np.ndarray
    """Per request: the first step that could include it (it arrived as the previous one ended)."""
    first_step: np.ndarray
    last_step: np.ndarray
    outputs: np.ndarray
    done: np.ndarray
    arrival_s: np.ndarray | None = None
    """Open-loop arrivals (absolute times); None when requests arrive at step ends (closed loop,
    all at t = 0), whose schedule does not depend on step times."""
    release_s: np.ndarray | None = None
    """Open loop: per step, the time the replica woke up for it after being idle (0 if it was busy)."""

    def step_times(self, c: Coefficients) -> np.ndarray:
        kernels = self.kernel_s @ np.asarray(c.scales)
        gpu = kernels + self.launch_exposed_s
        cpu = c.cpu_s(self.seqs, self.tokens)
        busy = np.maximum(gpu, cpu) if self.overlap else gpu + cpu
        return busy + c.serial_s(self.seqs)

    def evaluate(self, c: Coefficients) -> tuple[np.ndarray, np.ndarray]:
        """Per request: TTFT and TPOT in seconds (NaN for requests not completed, and TPOT NaN
        for one-token outputs).

        The front end's latency (``c.frontend_s``) is added to each TTFT on the traced schedule,
        which is the one of requests entering as they are sent: exact when the engine is idle
        while they cross the front end (a closed loop's clients in lock-step, one client, or
        open-loop arrivals to an idle replica); where other requests keep it busy meanwhile, a
        request that enters mid-step waits up to one step more than the re-timed TTFT says (the
        simulation itself delays the entry and is exact)."""
        times = self.step_times(c)
        if self.release_s is None:
            ends = np.concatenate([[0.0], np.cumsum(times)])
        else:  # e_k = max(e_{k-1}, release_k) + t_k, in closed form over prefix sums
            cumulative = np.cumsum(times)
            before = cumulative - times
            ends = np.concatenate([[0.0], cumulative + np.maximum.accumulate(
                np.maximum(self.release_s - before, 0.0))])
        a, f, last = self.arrival_step, self.first_step, self.last_step
        if self.arrival_s is None:
            ttft = np.where(self.done, ends[f + 1] - ends[a], np.nan)
        else:  # re-timed faster, a request's first step may slide before it was sent: it still
            # takes at least that step (exact when the times are the traced run's own)
            ttft = np.where(self.done, np.maximum(ends[f + 1] - self.arrival_s, times[f]), np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(self.done & (self.outputs > 1),
                            (ends[last + 1] - ends[f + 1]) / (self.outputs - 1), np.nan)
        return ttft + c.frontend_s, tpot


def trace_run(result: RunResult, open_loop: bool = False, cpu: Coefficients | None = None) -> ScheduleTrace:
    """The schedule of ``result``, a run whose engine did no CPU work (``ZERO_CPU``).

    ``open_loop``: the requests arrived at their own times; the trace keeps those (as they
    entered the deployment, after the front end's latency of ``cpu``, which re-timing adds back)
    and when the replica woke up from idle. Such a run may have had CPU work (``cpu``, the coefficients it
    ran with): its GPU time per step is then recovered from the step's duration (less the CPU
    time when serial; the whole duration when overlapped and longer than the CPU time, else the
    kernels alone, whose launches the CPU time hid), so launch-bound time is kept."""
    steps = result.steps
    starts = steps["start_s"].to_numpy(float)
    if not np.all(np.diff(starts) >= 0):
        raise ValueError("a replayable run has one replica (its steps in time order)")
    kernel = np.column_stack([steps[f"op_{name}_s"].to_numpy(float) for name in KERNEL_CLASSES])
    requests = result.requests
    done = (requests["status"] == "completed").to_numpy()
    ends = starts + steps["duration_s"].to_numpy(float)

    def step_at(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
        index = np.searchsorted(edges, times, side="left")
        return np.clip(index, 0, max(len(edges) - 1, 0))

    arrival = requests["arrival_s"].to_numpy(float)
    first = requests["first_token_s"].to_numpy(float)
    finish = requests["finish_s"].to_numpy(float)
    safe = np.where(done, first, 0.0), np.where(done, finish, 0.0)
    group = result.plan.topology.kv_group
    seqs = (steps["num_prefills"] + steps["num_decodes"]).to_numpy(float)
    tokens = (steps["prefill_tokens"] + steps["decode_tokens"]).to_numpy(float)
    overlap = group.runtime.overlap
    release = None
    launch_exposed = steps["op_overhead_s"].to_numpy(float)
    if open_loop:
        idle = np.concatenate([[True], starts[1:] > ends[:-1]])
        release = np.where(idle, starts, 0.0)
        c = cpu or Coefficients()
        cpu_s = c.cpu_s(seqs, tokens)
        duration = steps["duration_s"].to_numpy(float) - c.serial_s(seqs)
        kernels = kernel.sum(axis=1)
        hidden = np.where(duration > cpu_s * (1 + 1e-9), duration, kernels)
        gpu = hidden if overlap else duration - cpu_s
        launch_exposed = np.maximum(gpu - kernels, 0.0)
    return ScheduleTrace(
        kernel_s=kernel, launch_exposed_s=launch_exposed, seqs=seqs, tokens=tokens, overlap=overlap,
        arrival_step=step_at(arrival, starts),
        first_step=step_at(safe[0], ends), last_step=step_at(safe[1], ends),
        outputs=requests["output_tokens"].to_numpy(int), done=done,
        arrival_s=(arrival + (cpu.frontend_s if cpu else 0.0)) if open_loop else None, release_s=release)


def simulate_document(document: dict[str, Any], workload: RequestTable | None = None,
                      cpu: dict[str, float] | None = None) -> RunResult:
    """Run an experiment document with the engine's CPU coefficients replaced by ``cpu``."""
    document = {**document, "engine": {**document.get("engine", {}), **(cpu or {})}}
    return simulate(prepare(validate_document(document), workload=workload))
