"""One pipeline: prepare -> simulate -> render, the typed summary, and reports built from memory
that match reports rebuilt from the files."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from engine_helpers import experiment, table

from servesim.metrics.summary import Summary
from servesim.pipeline import prepare, render, result_files, simulate
from servesim.report.run_data import RunData, load_run
from servesim.report.run_report import build_run_charts

SMALL = {"arrival": {"process": "poisson", "rate": 4.0}, "num_requests": 60,
         "lengths": {"preset": "azure-conversation"}}


def test_render_writes_exactly_the_result_files(tmp_path: Path) -> None:
    result = simulate(prepare(experiment(workload=SMALL, slo={"ttft_s": 1.0})))
    written = render(result, tmp_path, report=False)
    files = result_files(result)
    assert {p.name for p in written} == set(files) == {"config.resolved.yaml", "summary.json",
                                                       "requests.parquet", "steps.parquet", "itl.parquet"}
    for name, data in files.items():
        assert (tmp_path / name).read_bytes() == data
    assert json.loads(files["summary.json"]) == result.summary.to_dict()
    assert pd.read_parquet(tmp_path / "requests.parquet").equals(result.requests)
    summary_only = simulate(prepare(experiment(workload=SMALL, output="summary")))
    assert set(result_files(summary_only)) == {"config.resolved.yaml", "summary.json"}


def test_typed_summary_round_trips_and_reads_like_the_file() -> None:
    result = simulate(prepare(experiment({"replicas": 2}, workload=SMALL, slo={"tpot_s": 0.05})))
    summary = result.summary
    data = summary.to_dict()
    assert Summary.from_dict(data) == summary
    assert list(data)[:6] == ["ttft_s", "tpot_s", "itl_s", "e2e_s", "queueing_s", "throughput"]
    assert summary.ttft_s.p99 == data["ttft_s"]["p99"]
    assert summary.kv.blocks_total == data["kv"]["blocks_total"]
    assert summary.completed + summary.rejected == 60 == summary.num_requests
    assert summary.deployment["policy"] == "continuous" and summary.deployment["gpus"] == 2


def test_the_plan_is_what_runs(tmp_path: Path) -> None:
    """The resolved config the run writes prepares the same plan and gives the same summary."""
    plan = prepare(experiment({"max_num_seqs": 32}, workload=SMALL))
    result = simulate(plan)
    render(result, tmp_path, report=False)
    from servesim.config import load_experiment

    again = prepare(load_experiment(tmp_path / "config.resolved.yaml"))
    assert again.topology.describe() == plan.topology.describe()
    assert simulate(again).summary == result.summary


def test_a_report_from_memory_shows_what_one_from_the_files_shows(tmp_path: Path) -> None:
    result = simulate(prepare(experiment(workload=SMALL, slo={"ttft_s": 0.5})))
    render(result, tmp_path, report=False)
    from_memory = RunData.from_result(result, tmp_path, (tmp_path / "config.resolved.yaml").read_text())
    from_files = load_run(tmp_path)
    assert from_memory.summary == from_files.summary
    memory_charts, file_charts = build_run_charts(from_memory), build_run_charts(from_files)
    assert [c.key for c in memory_charts] == [c.key for c in file_charts]
    for a, b in zip(memory_charts, file_charts, strict=True):
        assert (a.figure is None) == (b.figure is None), a.key
        if a.figure is not None:
            assert a.figure.to_json() == b.figure.to_json(), a.key


def test_workload_given_to_prepare_is_the_one_run() -> None:
    workload = table([0.0, 0.5, 1.0], 256, 8)
    plan = prepare(experiment(), workload=workload)
    assert plan.workload is workload
    assert simulate(plan).summary.completed == 3
