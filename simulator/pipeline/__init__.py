"""One run, in three steps used alike by ``run``, ``validate``, ``sweep`` and ``capacity``::

    plan = prepare(config)          # RunPlan: engine, topology, memory plans, workload, rejections
    result = simulate(plan)         # RunResult: typed request and step tables, typed summary
    render(result, out_dir)         # summary.json, config.resolved.yaml, parquet tables, report.html

``prepare`` is loaded with the package; ``simulate``, ``render`` and the result on first use,
since they load pandas and pyarrow, which ``servesim validate`` (a plan and no run) never needs.
"""

from typing import TYPE_CHECKING, Any

from servesim.pipeline.plan import RunPlan, load_plan, prepare

if TYPE_CHECKING:
    from servesim.pipeline.render import render, result_files
    from servesim.pipeline.result import RunResult
    from servesim.pipeline.simulate import simulate

__all__ = ["RunPlan", "RunResult", "load_plan", "prepare", "render", "result_files", "simulate"]

_LAZY = {"render": "render", "result_files": "render", "RunResult": "result", "simulate": "simulate"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"servesim.pipeline.{module}"), name)
