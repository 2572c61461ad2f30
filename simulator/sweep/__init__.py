"""Parameter sweeps: many variants of one experiment, run in parallel, resumable, tabulated.

``servesim sweep FILE --out DIR`` is :func:`load_sweep` + :func:`run_sweep`; the file format is
in :mod:`servesim.sweep.spec`, the folder layout in :mod:`servesim.sweep.runner`, the table
columns in :mod:`servesim.sweep.aggregate`.
"""

from servesim.sweep.aggregate import ci95_halfwidth, t_quantile
from servesim.sweep.axes import expand
from servesim.sweep.execute import execute_run, run_point, store_run
from servesim.sweep.plan import SweepPlan, plan_sweep
from servesim.sweep.runner import SweepOutcome, run_sweep
from servesim.sweep.spec import Sweep, find_sweep, load_sweep, parse_sweep

__all__ = ["Sweep", "SweepOutcome", "SweepPlan", "ci95_halfwidth", "execute_run", "expand", "find_sweep",
           "load_sweep", "parse_sweep", "plan_sweep", "run_point", "run_sweep", "store_run", "t_quantile"]

import sys as _sys

from servesim.api import CallablePackage as _CallablePackage

_sys.modules[__name__].__class__ = _CallablePackage  # servesim.sweep(...) runs a sweep (servesim.api)
