"""``prepare(config) -> RunPlan``: everything a run needs, resolved and checked, before any event.

The plan holds the experiment, its resolved topology (each group's engine, memory plan, limits,
policy), the workload's request table, and which requests the deployment will refuse and why
(counted before the run, so ``servesim validate`` can say it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servesim.config import ExperimentConfig, load_experiment
from servesim.core.clients import ClosedLoop
from servesim.core.state import REJECT_REASONS
from servesim.errors import ServesimError
from servesim.pipeline.budget import check_run_size
from servesim.topology.base import Topology
from servesim.topology.resolve import resolve_topology
from servesim.workloads import build_workload
from servesim.workloads.requests import RequestTable


@dataclass(frozen=True)
class RunPlan:
    config: ExperimentConfig
    topology: Topology
    workload: RequestTable
    reject_codes: np.ndarray
    """Per request, why the deployment will refuse it at arrival (0: it will not); see
    :data:`~servesim.core.state.REJECT_REASONS`."""
    base_dir: Path | None = None
    """The experiment file's folder, against which its relative paths resolve."""

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def closed_loop(self) -> ClosedLoop | None:
        """The clients that send the requests, when the workload is a closed loop."""
        arrival = self.config.workload.arrival
        if arrival is None or not arrival.is_closed:
            return None
        assert arrival.concurrency is not None
        return ClosedLoop(arrival.concurrency, arrival.think_time_s or 0.0)

    @property
    def frontend_s(self) -> float:
        """The engine front end's latency per request (``CpuCosts.frontend_s``): every request
        enters the deployment this long after its client sent it. The front end serves the whole
        deployment; its engine's value on the entry group's GPUs."""
        return self.topology.groups[0].runtime.frontend_s

    @property
    def policy_label(self) -> str:
        """The policy as summaries name it: the group's, or the topology's kind when its groups
        schedule on their own (``disaggregated``, as servesim 0.1 named it)."""
        groups = self.topology.groups
        return groups[0].policy.name if len(groups) == 1 else self.topology.kind

    def rejections(self) -> dict[str, int]:
        """Requests the deployment will refuse, by reason (none: empty)."""
        counts = Counter(self.reject_codes[self.reject_codes > 0].tolist())
        return {REJECT_REASONS[code]: count for code, count in sorted(counts.items())}

    def describe(self) -> dict[str, Any]:
        """The summary's ``deployment`` section."""
        out = self.topology.describe()
        out["policy"] = self.policy_label
        out["router"] = self.config.router.name
        return out


def prepare(config: ExperimentConfig, *, workload: RequestTable | None = None,
            base_dir: Path | None = None, topology: Topology | None = None) -> RunPlan:
    """Resolve ``config`` (and build its workload, unless ``workload`` is given). ``topology``:
    one already resolved from this very config, reused (the capacity planner probes many rates of
    one deployment: its model, profile, memory plan and priced steps are the same for all)."""
    if topology is None:
        topology = resolve_topology(config)
    check_run_size(config, topology)
    if workload is None:
        workload = build_workload(config.workload, config.seed, base_dir)
    codes = topology.rejection_codes(workload.prompt_tokens, workload.output_tokens)
    return RunPlan(config, topology, workload, codes, base_dir)


def load_plan(path: Path, overrides: list[str] | None = None, seed: int | None = None) -> RunPlan:
    """Read an experiment file (with ``--set`` overrides and a seed) and prepare it."""
    config = load_experiment(path, overrides or [], seed)
    plan = prepare(config, base_dir=path.parent)
    if len(plan.workload) == 0:
        raise ServesimError("workload", "has no requests", "widen the time window or raise num_requests")
    return plan
