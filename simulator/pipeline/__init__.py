"""One run, in three steps used alike by ``run``, ``validate``, ``sweep`` and ``capacity``::

    plan = prepare(config)          # RunPlan: engine, topology, memory plans, workload, rejections
    result = simulate(plan)         # RunResult: typed request and step tables, typed summary
    render(result, out_dir)         # summary.json, config.resolved.yaml, parquet tables, report.html

``RunResult`` (its tables and summary need pandas) is loaded on first use, so that ``servesim
validate`` (a plan, no run) loads neither pandas nor pyarrow.
"""

from typing import TYPE_CHECKING, Any

from servesim.pipeline.plan import RunPlan, load_plan, prepare
from servesim.pipeline.render import render, result_files
from servesim.pipeline.simulate import simulate

if TYPE_CHECKING:
    from servesim.pipeline.result import RunResult

__all__ = ["RunPlan", "RunResult", "load_plan", "prepare", "render", "result_files", "simulate"]


def __getattr__(name: str) -> Any:
    if name == "RunResult":
        from servesim.pipeline.result import RunResult

        return RunResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
