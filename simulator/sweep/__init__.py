"""Parameter sweeps: many variants of one experiment, run in parallel, resumable, tabulated.

``servesim sweep FILE --out DIR`` is :func:`load_sweep` + :func:`run_sweep`; the file format is
in :mod:`servesim.sweep.spec`, the folder layout in :mod:`servesim.sweep.runner`, the table
columns in :mod:`servesim.sweep.aggregate`.
"""

import sys as _sys
from typing import TYPE_CHECKING, Any

from servesim.api import CallablePackage as _CallablePackage

if TYPE_CHECKING:
    from servesim.sweep.aggregate import ci95_halfwidth, t_quantile
    from servesim.sweep.axes import expand
    from servesim.sweep.execute import execute_run, run_point, store_run
    from servesim.sweep.plan import SweepPlan, plan_sweep
    from servesim.sweep.runner import SweepOutcome, run_sweep
    from servesim.sweep.spec import Sweep, find_sweep, load_sweep, parse_sweep

_MODULE_OF = {"ci95_halfwidth": "aggregate", "t_quantile": "aggregate", "expand": "axes",
              "execute_run": "execute", "run_point": "execute", "store_run": "execute",
              "SweepPlan": "plan", "plan_sweep": "plan", "SweepOutcome": "runner", "run_sweep": "runner",
              "Sweep": "spec", "find_sweep": "spec", "load_sweep": "spec", "parse_sweep": "spec"}
"""Each name's module, imported on first use: ``servesim run`` and ``validate`` import
``servesim.sweep.spec`` (is a file a sweep?), which must not load the runner, pandas and pyarrow."""


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"servesim.sweep.{module}"), name)


__all__ = ["Sweep", "SweepOutcome", "SweepPlan", "ci95_halfwidth", "execute_run", "expand", "find_sweep",
           "load_sweep", "parse_sweep", "plan_sweep", "run_point", "run_sweep", "store_run", "t_quantile"]

_sys.modules[__name__].__class__ = _CallablePackage  # servesim.sweep(...) runs a sweep (servesim.api)
