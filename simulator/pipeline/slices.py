"""A simulation run in slices of simulated time, so that a caller can look at it in between.

:func:`servesim.pipeline.simulate` runs a plan to the end in one go. The capacity planner also
needs to stop a probe once its SLO verdict is settled (``servesim.capacity.probe``), and to
advance several replications side by side. :class:`SlicedSimulation` is the same run (the same
``Sim.start``, topology build, arrivals and end-of-run check as ``simulate``), with the clock
advanced by taking SimPy's events one by one while they come before the slice's end (what
``env.run`` itself does, without the stop event ``env.run(until=...)`` would leave in the queue):
slicing only reads state between events, so the results are those of ``simulate``, bit for bit
(``tests/test_capacity_probe.py`` holds it).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from servesim.core.progress import check_finished
from servesim.core.sim import Sim, start_run
from servesim.core.state import RequestState
from servesim.pipeline.plan import RunPlan

if TYPE_CHECKING:
    from servesim.pipeline.result import RunResult


class SlicedSimulation:
    """``plan`` on a fresh clock, advanced by :meth:`advance` until :attr:`done`."""

    def __init__(self, plan: RunPlan, *, fast_forward: bool = True) -> None:
        self.plan = plan
        self.now = 0.0
        """Every event before this time has happened (the end of the last slice)."""
        started = time.perf_counter()
        self.sim = Sim.start(plan.workload, plan.seed, fast_forward, plan.closed_loop is not None)
        self.built = plan.topology.build(self.sim, plan.reject_codes)
        start_run(self.sim, self.built.entry, None, plan.closed_loop, plan.frontend_s)
        self._wall_s = time.perf_counter() - started
        self.done = self.sim.env.peek() == math.inf

    @property
    def requests(self) -> RequestState:
        return self.sim.requests

    def advance(self, until: float) -> bool:
        """Take every event before ``until`` (simulated seconds; ``math.inf``: to the end);
        returns :attr:`done`: no event is left."""
        if self.done:
            return True
        env = self.sim.env
        started = time.perf_counter()
        self.sim.horizon.at = until  # the state is read at ``until``: runs credited early end before it
        if until == math.inf:
            env.run()
            self.now = max(self.now, float(env.now))
        else:
            step, peek = env.step, env.peek
            while peek() < until:
                step()
            self.now = max(self.now, until)
        self.done = env.peek() == math.inf
        self._wall_s += time.perf_counter() - started
        return self.done

    def result(self) -> RunResult:
        """The finished run as :func:`~servesim.pipeline.simulate` returns it (after the same
        check that every request completed or was refused)."""
        if not self.done:
            raise RuntimeError("SlicedSimulation.result() before the run ended")
        sim, built = self.sim, self.built
        check_finished(sim.requests, (state for group in built.groups for state in group.states), sim.env.now)
        end = sim.steps.end_s()
        for link in built.links:
            end = max(end, link.last_end_s)
        from servesim.pipeline.result import RunResult  # here: the tables it builds need pandas

        return RunResult(self.plan, sim, built, sim_time_s=end, wall_time_s=self._wall_s)
