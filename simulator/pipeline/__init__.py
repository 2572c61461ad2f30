"""One run, in three steps used alike by ``run``, ``validate``, ``sweep`` and ``capacity``::

    plan = prepare(config)          # RunPlan: engine, topology, memory plans, workload, rejections
    result = simulate(plan)         # RunResult: typed request and step tables, typed summary
    render(result, out_dir)         # summary.json, config.resolved.yaml, parquet tables, report.html
"""

from servesim.pipeline.plan import RunPlan, load_plan, prepare
from servesim.pipeline.render import render, result_files
from servesim.pipeline.result import RunResult
from servesim.pipeline.simulate import simulate

__all__ = ["RunPlan", "RunResult", "load_plan", "prepare", "render", "result_files", "simulate"]
