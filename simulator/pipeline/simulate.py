"""``simulate(plan) -> RunResult``: build the topology on a fresh clock and run it to the end."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from servesim.core.progress import check_finished
from servesim.core.sim import Progress, Sim, run_until_done
from servesim.pipeline.plan import RunPlan

if TYPE_CHECKING:
    from servesim.pipeline.result import RunResult


def simulate(plan: RunPlan, progress: Progress | None = None, *, fast_forward: bool = True) -> RunResult:
    """Run ``plan`` until every request has completed or been refused. ``fast_forward=False`` is
    the step-by-step reference mode (one SimPy event per iteration everywhere); with it on, the
    replicas that can run pure-decode iterations in bulk do, with the same results
    (``servesim.core.fast_forward``)."""
    started = time.perf_counter()
    sim = Sim.start(plan.workload, plan.seed, fast_forward, plan.closed_loop is not None)
    built = plan.topology.build(sim, plan.reject_codes)
    run_until_done(sim, built.entry, progress, plan.closed_loop, plan.frontend_s)
    check_finished(sim.requests, (state for group in built.groups for state in group.states), sim.env.now)
    end = sim.steps.end_s()
    for link in built.links:
        end = max(end, link.last_end_s)
    from servesim.pipeline.result import RunResult  # here: the tables it builds need pandas

    return RunResult(plan, sim, built, sim_time_s=end, wall_time_s=time.perf_counter() - started)
