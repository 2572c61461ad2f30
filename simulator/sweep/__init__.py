"""Parameter sweeps: many variants of one experiment, run in parallel, resumable, tabulated.

``servesim sweep FILE --out DIR`` is :func:`load_sweep` + :func:`run_sweep`; the file format is
in :mod:`simulator.sweep.spec`, the folder layout in :mod:`simulator.sweep.runner`, the table
columns in :mod:`simulator.sweep.aggregate`.
"""

from simulator.sweep.aggregate import ci95_halfwidth, t_quantile
from simulator.sweep.axes import expand
from simulator.sweep.execute import execute_run, run_point, store_run
from simulator.sweep.plan import SweepPlan, plan_sweep
from simulator.sweep.runner import SweepOutcome, run_sweep
from simulator.sweep.spec import Sweep, find_sweep, load_sweep, parse_sweep

__all__ = ["Sweep", "SweepOutcome", "SweepPlan", "ci95_halfwidth", "execute_run", "expand", "find_sweep",
           "load_sweep", "parse_sweep", "plan_sweep", "run_point", "run_sweep", "store_run", "t_quantile"]
