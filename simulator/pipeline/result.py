"""``RunResult``: one finished run, with its tables and summary built on first use.

The per-request table (:attr:`RunResult.requests`), the per-step table (:attr:`steps`), the
inter-token latencies (:attr:`itl`) and the typed :class:`~servesim.metrics.summary.Summary`
are what every consumer reads: the CLI, the files, the report, sweeps, the capacity planner and
notebooks. The raw request state and replica states stay reachable for tests and fast paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from servesim.core.replica_state import ReplicaState
from servesim.core.sim import Sim
from servesim.core.state import RequestState
from servesim.core.step_log import SPECULATIVE_SUMMARY_COLUMNS, SUMMARY_COLUMNS, StepLog
from servesim.metrics.columns import Table
from servesim.metrics.sessions import session_columns, session_section
from servesim.metrics.summary import Summary, prefix_cache_stats, run_span, summarise
from servesim.metrics.tables import itl_frame, request_frame, summary_itl, summary_requests
from servesim.metrics.usage import batch_usage, kv_usage, swap_usage
from servesim.pipeline.plan import RunPlan
from servesim.speculative.metrics import speculative_section
from servesim.topology.base import Built, GroupRun

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class RunResult:
    plan: RunPlan
    sim: Sim
    built: Built
    sim_time_s: float
    """When the last step (or KV transfer) ended."""
    wall_time_s: float

    # ------------------------------------------------------------------ what ran
    @property
    def groups(self) -> list[GroupRun]:
        return self.built.groups

    @property
    def replica_states(self) -> list[ReplicaState]:
        """Every replica's state, by replica index."""
        return [state for run in self.built.groups for state in run.states]

    @property
    def request_state(self) -> RequestState:
        """The per-request columns the engine kept (counters and timestamps)."""
        return self.sim.requests

    @property
    def step_log(self) -> StepLog:
        return self.sim.steps

    # ------------------------------------------------------------------ tables and summary
    @cached_property
    def requests(self) -> pd.DataFrame:
        """One row per request (:func:`~servesim.metrics.tables.request_frame`)."""
        return request_frame(self.sim.requests, self._request_extra())

    def _request_extra(self) -> dict[str, np.ndarray]:
        """The topology's and the sessions' own request columns."""
        return {**self.plan.topology.request_columns(self.sim), **session_columns(self.plan.workload)}

    def _summary_requests(self) -> Table:
        """The request table the summary reads: :attr:`requests` when it is built already,
        otherwise only the columns a summary figure reads, as NumPy columns, not kept
        (:func:`~servesim.metrics.tables.summary_requests`: a long run that writes only its
        summary never builds the whole table, nor imports pandas)."""
        built = self.__dict__.get("requests")
        return built if built is not None else summary_requests(self.sim.requests, self._request_extra())

    def _summary_itl(self) -> Table:
        """The ITL table the summary reads: :attr:`itl` when it is built already, otherwise the
        pairs with their counts as the log holds them (int32), not kept."""
        built = self.__dict__.get("itl")
        return built if built is not None else summary_itl(self.sim.requests)

    @cached_property
    def steps(self) -> pd.DataFrame:
        """One row per iteration of any replica; with several groups a ``pool`` column names each
        step's group."""
        return self._steps_frame(labels=True)

    def _steps_frame(self, labels: bool, only: tuple[str, ...] | None = None) -> pd.DataFrame:
        topology = self.plan.topology
        blocks = [run.group.limits.num_blocks for run in self.built.groups for _ in run.replicas]
        names = topology.group_of_replica() if len(topology.groups) > 1 else None
        return self.sim.steps.to_frame(blocks, names, labels=labels, only=only)

    def _summary_steps(self) -> Table:
        """The steps table the summary reads: :attr:`steps` when it is built already, otherwise
        only the columns a summary figure reads (:data:`~servesim.core.step_log.SUMMARY_COLUMNS`),
        expanded one by one from the compact step log and not kept (a long run that writes only
        its summary never holds the whole table). With one replica group not even those are held
        together: :class:`~servesim.core.step_log.StepColumns` expands each column as it is read
        (it answers the column reads, ``len`` and ``in`` the summary's figures make of a table)."""
        built = self.__dict__.get("steps")
        if built is not None:
            return built
        speculates = any(run.group.speculation is not None for run in self.built.groups)
        only = SUMMARY_COLUMNS if speculates else tuple(
            column for column in SUMMARY_COLUMNS if column not in SPECULATIVE_SUMMARY_COLUMNS)
        if len(self.plan.topology.groups) == 1:
            blocks = [run.group.limits.num_blocks for run in self.built.groups for _ in run.replicas]
            return self.sim.steps.summary_columns(blocks, only)
        return self._steps_frame(labels=False, only=only)

    @cached_property
    def itl(self) -> pd.DataFrame:
        """Every inter-token gap as (value, count) pairs."""
        return itl_frame(self.sim.requests)

    @property
    def offered_rate(self) -> float:
        """Requests per second over the span of arrivals: the table's, or for closed-loop
        clients the times they actually sent their requests."""
        if self.plan.closed_loop is None:
            return self.plan.workload.mean_rate
        sent = self.sim.requests.arrival
        span = float(sent.max() - sent.min()) if sent.size > 1 else 0.0
        return (sent.size - 1) / span if span > 0 else 0.0

    @cached_property
    def summary(self) -> Summary:
        plan, steps, requests = self.plan, self._summary_steps(), self._summary_requests()
        topology = plan.topology
        kv_run = next(run for run in self.built.groups if run.group is topology.kv_group)
        kv_steps = steps if len(topology.groups) == 1 else steps[steps["pool"] == kv_run.group.name]
        span = run_span(requests)
        states = self.replica_states
        slo = plan.config.slo
        sections = topology.summary_sections(self.sim, self.built, requests, steps, span)
        speculation = kv_run.group.speculation
        if speculation is not None:
            sections = {**sections, "speculation": speculative_section(speculation, kv_run.states, kv_steps)}
        return summarise(
            requests, self._summary_itl(), slo_limits=slo.limits() if slo else {},
            offered_rate=self.offered_rate, deployment=plan.describe(),
            kv=kv_usage(kv_run.states, kv_steps), swap=swap_usage(states), batch=batch_usage(steps),
            sections={**sections, **session_section(requests, plan.workload, slo.limits() if slo else {})},
            prefix_cache=prefix_cache_stats(requests, [s.prefix_cache for s in states],
                                            plan.workload.has_prefixes),
            steps=steps, metric_percentiles=tuple(plan.config.metric_percentiles))

