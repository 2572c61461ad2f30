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
TRACE_FRONTEND_S = 1e-5
"""The front end's latency a closed loop is traced with (10 us, shorter than any step): a request
then enters just after its client sends it, never in the step that starts as it is sent, as with
every real front end, and re-timing stands for any latency (:func:`closed_loop_ends`). With none
at all, each request would join the step that starts the instant its predecessor ends, which no
engine does; in a closed loop whose clients have drifted apart (vLLM V1, TensorRT-LLM) that
changes the batches: a 1 ms front end turns a 64-client vLLM Kimi-K2 row's mean TTFT per round
(after the first) from 151-160 to 280-290 ms in simulation."""
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
    handoff_s: float = 0.0
    """A disaggregated deployment's hand-off latency per request (``CpuCosts.handoff_s``)."""
    frontend_chunk_s: float = 0.0
    """The front end's serial time per streamed chunk (``CpuCosts.frontend_chunk_s``)."""

    def knobs(self) -> dict[str, float]:
        knobs = {"step_overhead_s": self.fixed_s, "cpu_per_seq_s": self.per_seq_s,
                 "cpu_per_token_s": self.per_token_s, "cpu_per_sample_s": 0.0,
                 "serial_overhead_s": self.serial_fixed_s, "serial_per_seq_s": self.serial_per_seq_s,
                 "frontend_latency_s": self.frontend_s, "handoff_latency_s": self.handoff_s}
        if self.frontend_chunk_s:
            knobs["frontend_chunk_s"] = self.frontend_chunk_s
        return knobs

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
    waited: np.ndarray | None = None
    """Closed loop: per step, whether the replica sat idle before it, waiting for a request to
    cross the front end (it starts the front end's latency after the step before ended)."""
    admit_step: np.ndarray | None = None
    """Closed loop: per request, the step that first scheduled it."""

    def step_times(self, c: Coefficients) -> np.ndarray:
        kernels = self.kernel_s @ np.asarray(c.scales)
        gpu = kernels + self.launch_exposed_s
        cpu = c.cpu_s(self.seqs, self.tokens)
        busy = np.maximum(gpu, cpu) if self.overlap else gpu + cpu
        return busy + c.serial_s(self.seqs)

    def evaluate(self, c: Coefficients) -> tuple[np.ndarray, np.ndarray]:
        """Per request: TTFT and TPOT in seconds (NaN for requests not completed, and TPOT NaN
        for one-token outputs), with the front end's latency ``c.frontend_s`` counted as the
        simulation counts it (see :func:`closed_loop_ends`)."""
        times = self.step_times(c)
        a, f, last = self.arrival_step, self.first_step, self.last_step
        if self.release_s is None:
            ends, extra = closed_loop_ends(times, self.waited, self.admit_step, a, c.frontend_s)
            ttft = np.where(self.done, ends[f + 1] - ends[a] + extra, np.nan)
        else:  # e_k = max(e_{k-1}, release_k) + t_k, in closed form over prefix sums
            cumulative = np.cumsum(times)
            before = cumulative - times
            ends = np.concatenate([[0.0], cumulative + np.maximum.accumulate(
                np.maximum(self.release_s - before, 0.0))])
        if self.arrival_s is not None:
            # re-timed faster, a request's first step may slide before it was sent: it still takes
            # at least that step (exact when the times are the traced run's own); its front end's
            # latency is in the traced entries, and the client counts it again from its send
            ttft = np.where(self.done, np.maximum(ends[f + 1] - self.arrival_s, times[f]) + c.frontend_s,
                            np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(self.done & (self.outputs > 1),
                            (ends[last + 1] - ends[f + 1]) / (self.outputs - 1), np.nan)
        return ttft, tpot


def retimes_exactly(trace: ScheduleTrace, c: Coefficients) -> bool:
    """Whether re-timing ``trace`` with ``c`` is what simulating with ``c`` gives: always without
    a front end; with one, when the trace recorded its waits and every request waited at least
    the latency for the step that first scheduled it (it entered an idle replica, or queued
    behind others longer than it took to cross the front end), so entering later changes no
    batch. A request that would join a busy replica's next step sooner than that may miss it,
    and then the schedule itself moves (``validate-serving`` simulates such rows). Never with a
    streaming cost: the clients' sends then wait for the front end, which a trace does not hold."""
    if c.frontend_chunk_s:
        return False
    if c.frontend_s == 0.0 or trace.release_s is not None:
        return True
    if trace.waited is None or trace.admit_step is None:
        return False
    _, extra = closed_loop_ends(trace.step_times(c), trace.waited, trace.admit_step, trace.arrival_step,
                                c.frontend_s)
    return bool(np.all(np.asarray(extra)[trace.done] <= 1e-12))


def closed_loop_ends(times: np.ndarray, waited: np.ndarray | None, admit: np.ndarray | None,
                     arrival: np.ndarray, frontend_s: float) -> tuple[np.ndarray, np.ndarray | float]:
    """A closed loop's step ends re-timed (``[0, end of step 0, ...]``) and each request's TTFT
    beyond ``ends[first + 1] - ends[arrival]``, for a front end of ``frontend_s``.

    A client sends when its previous request's last step ends and the request enters
    ``frontend_s`` later. On a trace made with a latency shorter than any step (what
    ``validate-serving`` traces with), a request never joins the step that starts as it is sent
    but a later one, so the schedule is the same for every such latency: a step the replica
    waited for starts ``frontend_s`` after the one before ended, and a request that entered a busy
    replica already waited longer than the latency for its step, so its TTFT has the latency in
    it. That is exact while the latency is shorter than the wait; a longer one (the ~100 ms the
    fits find for SGLang and TensorRT-LLM) is added where it exceeds the wait, as if the request
    joined the same step that much later (it may in truth miss it and join the next). Without a
    record of waits (a trace made with no latency), the latency is simply added to each TTFT."""
    if waited is None or admit is None:
        return np.concatenate([[0.0], np.cumsum(times)]), frontend_s
    gaps = frontend_s * waited
    ends = np.concatenate([[0.0], np.cumsum(times + gaps)])
    return ends, latency_beyond_wait(ends, gaps, admit, arrival, frontend_s)


def latency_beyond_wait(ends: np.ndarray, gaps: np.ndarray, admit: np.ndarray, arrival: np.ndarray,
                        frontend_s: float) -> np.ndarray:
    """Per request, the part of the front end's latency its wait for its first step (from its
    send, ``ends[arrival]``, to that step's start) does not already hold: what re-timing adds to
    its TTFT (:func:`closed_loop_ends`; ``StackedMeans`` applies it to many traces at once)."""
    wait = ends[admit] + gaps[admit] - ends[arrival]
    return np.maximum(frontend_s - wait, 0.0)


def trace_run(result: RunResult, open_loop: bool = False, cpu: Coefficients | None = None) -> ScheduleTrace:
    """The schedule of ``result``, a run whose engine did no CPU work (``ZERO_CPU``), and for a
    closed loop that may have had a front end (``TRACE_FRONTEND_S``): which steps waited for a
    request to cross it, and when each request was first scheduled (:func:`closed_loop_ends`).

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
    waited = admit = None
    launch_exposed = steps["op_overhead_s"].to_numpy(float)
    if not open_loop and result.plan.frontend_s > 0:  # (a run with no front end never waits)
        waited = np.concatenate([[starts[0] > 0] if starts.size else [], starts[1:] > ends[:-1]])
        scheduled = requests["first_scheduled_s"].to_numpy(float)
        admit = step_at(np.where(done, scheduled, 0.0), starts)
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
        arrival_s=(arrival + (cpu.frontend_s if cpu else 0.0)) if open_loop else None, release_s=release,
        waited=waited, admit_step=admit)


def simulate_document(document: dict[str, Any], workload: RequestTable | None = None,
                      cpu: dict[str, float] | None = None) -> RunResult:
    """Run an experiment document with the engine's CPU coefficients replaced by ``cpu``."""
    document = {**document, "engine": {**document.get("engine", {}), **(cpu or {})}}
    return simulate(prepare(validate_document(document), workload=workload))
