"""The sweep report from a synthetic results.parquet (see sweep_fixtures: M/M/1-like points whose
p99s and verdicts follow by hand), and ``servesim report`` on run and sweep folders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.offline
import pytest
from sweep_fixtures import fabricate_sweep
from test_report_run import _has_points, _plot_data, fabricate_run

from servesim.errors import ServesimError
from servesim.report.sweep_data import SweepData, find_axes, format_value, load_sweep
from servesim.report.sweep_figures import (
    axis_groups,
    build_sweep_charts,
    heatmap_pairs,
    pareto_front,
    with_dimensions,
)
from servesim.report.sweep_report import best_points, render_sweep_report, wide_intervals, write_sweep_report

AXES = ["hardware", "deployment.tp", "workload.arrival.rate"]
# By hand (sweep_fixtures): p99 TTFT = ln(100) / (mu - lambda) <= 1 s and p99 TPOT <= 50 ms:
#   h100 tp1 (mu 10): rates 2, 4 (0.58 s, 0.77 s); rate 8 gives 2.3 s
#   h100 tp2 (mu 17.4): rates 2, 4, 8, 12 (0.30 .. 0.85 s); rate 16 gives 3.3 s
#   a100 tp1 (mu 5): none (rate 2 already 1.5 s)
#   a100 tp2 (mu 8.7): rates 2, 4 (0.69 s, 0.98 s)
MEETING = {("h100-sxm-80gb", 1, 2.0), ("h100-sxm-80gb", 1, 4.0), ("h100-sxm-80gb", 2, 2.0),
           ("h100-sxm-80gb", 2, 4.0), ("h100-sxm-80gb", 2, 8.0), ("h100-sxm-80gb", 2, 12.0),
           ("a100-sxm-80gb", 2, 2.0), ("a100-sxm-80gb", 2, 4.0)}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("sweep")
    fabricate_sweep(folder)
    out = write_sweep_report(folder)
    return folder, out.read_text(encoding="utf-8")


def test_axes_come_from_the_table(sweep: tuple[Path, str]) -> None:
    folder, _ = sweep
    data = load_sweep(folder)
    assert data.axes == AXES  # ordered as sweep.resolved.yaml's grid names them
    assert data.rate_axis == "workload.arrival.rate"
    assert data.slos == {"ttft_s": 1.0, "tpot_s": 0.05}
    # Without the YAML: the same keys, in column order; model and policy.name never vary here.
    frame = pd.read_parquet(folder / "results.parquet")
    assert sorted(find_axes(frame)) == sorted(AXES)
    assert "policy.name" not in find_axes(frame) and "gpus" not in find_axes(frame)


def test_points_meeting_the_slos_by_hand(sweep: tuple[Path, str]) -> None:
    folder, html = sweep
    data = load_sweep(folder)
    meeting = {(r["hardware"], int(r["deployment.tp"]), float(r["workload.arrival.rate"]))
               for _, r in data.frame[data.frame["meets"]].iterrows()}
    assert meeting == MEETING
    assert "8 of 20 point(s) meet the SLOs" in html and "19 of 20 point(s) ran, 1 infeasible" in html
    assert "infeasible: deployment: synthetic infeasible point" in html


def test_best_points_by_hand(sweep: tuple[Path, str]) -> None:
    folder, _ = sweep
    best = {o.label: (row, value) for o, row, value in best_points(load_sweep(folder))}
    row, value = best["highest goodput"]
    assert (row["hardware"], row["deployment.tp"], row["workload.arrival.rate"]) == ("h100-sxm-80gb", 2, 12.0)
    assert value == pytest.approx(0.995 * 12)
    # $8/hour over 211 x 12 tokens/s x 3600 s = $0.878 per million output tokens.
    row, value = best["lowest $ per million output tokens"]
    assert value == pytest.approx(8 / (211 * 12 * 3600) * 1e6) and row["point"] == "h100-tp2-r12"
    assert best["highest throughput per GPU"][1] == pytest.approx(6.0)  # 12 req/s on 2 GPUs
    assert best["fewest GPUs"][0]["deployment.tp"] == 1
    # Latency objectives look at every point that ran: h100 tp2 at rate 2, ln(100)/15.4 = 0.30 s.
    assert best["lowest p99 TTFT"][1] == pytest.approx(np.log(100) / (10 * 2 ** 0.8 - 2))


def test_pareto_front_by_hand() -> None:
    cost = np.array([1.0, 2.0, 2.0, 3.0, 4.0, np.nan])
    latency = np.array([5.0, 3.0, 4.0, 3.0, 1.0, 0.1])
    assert pareto_front(cost, latency).tolist() == [0, 1, 4]


def test_sweep_page_is_self_contained_and_every_chart_has_data(sweep: tuple[Path, str]) -> None:
    _, html = sweep
    assert html.count(plotly.offline.get_plotlyjs()[:400]) == 1
    figures = _plot_data(html)
    # knee, latency, heatmaps (hardware x tp, rate x the axis with most levels), Pareto
    assert len(figures) == 5 == html.count('class="plotly-graph-div"')
    for traces in figures:
        assert traces and any(_has_points(t) or t.get("z") is not None for t in traces)
    assert html.index("Best point per objective") < html.index("Throughput and goodput against load")
    assert "Pareto frontier at each offered rate" in html and "cost ($/hour)" in html


def test_hover_names_every_varied_key(sweep: tuple[Path, str]) -> None:
    folder, _ = sweep
    for chart in build_sweep_charts(load_sweep(folder)):
        assert chart.figure is not None
        for trace in chart.figure.data:
            text = trace.text
            if text is None or (trace.type == "heatmap" and not len(text)):
                continue
            sample = next(str(t) for t in np.ravel(np.asarray(text, dtype=object)) if "=" in str(t))
            assert all(f"{axis} = " in sample for axis in AXES), (chart.key, sample)


def test_heatmap_cells_are_the_best_point_over_the_other_keys(sweep: tuple[Path, str]) -> None:
    folder, _ = sweep
    data = load_sweep(folder)
    assert heatmap_pairs(data)[0] == ("deployment.tp", "hardware")
    chart = next(c for c in build_sweep_charts(data) if c.key == "heatmap1")
    first = chart.figure.data[0]  # highest rate meeting the SLOs, per (hardware, tp)
    cells = {(y, x): z for y, row in zip(first.y, first.z, strict=True)
             for x, z in zip(first.x, row, strict=True)}
    assert cells[("h100-sxm-80gb", "2")] == 12.0 and cells[("h100-sxm-80gb", "1")] == 4.0
    assert cells[("a100-sxm-80gb", "2")] == 4.0 and np.isnan(cells[("a100-sxm-80gb", "1")])


def test_sweep_without_prices_or_slos(tmp_path: Path) -> None:
    fabricate_sweep(tmp_path, with_cost=False, with_slos=False)
    (tmp_path / "sweep.resolved.yaml").unlink()
    data = load_sweep(tmp_path)
    assert data.slos == {} and data.cost_column == "gpus"
    html = write_sweep_report(tmp_path).read_text(encoding="utf-8")
    assert "No SLOs set" in html and "GPUs stand in for cost" in html
    assert "highest goodput" not in html and "output tokens/s stands in for goodput" in html
    assert "No sweep.resolved.yaml in the output folder" in html


def test_one_axis_sweep_has_no_heatmap(tmp_path: Path) -> None:
    frame = fabricate_sweep(tmp_path)
    frame = frame[(frame["hardware"] == "h100-sxm-80gb") & (frame["deployment.tp"] == 2)]
    frame.to_parquet(tmp_path / "results.parquet")
    data = load_sweep(tmp_path)
    assert data.axes == ["workload.arrival.rate"]
    assert [c.key for c in build_sweep_charts(data)] == ["knee", "latency", "pareto"]


def test_sweep_without_a_rate_axis_says_so(tmp_path: Path) -> None:
    frame = fabricate_sweep(tmp_path)
    frame[frame["workload.arrival.rate"] == 4.0].to_parquet(tmp_path / "results.parquet")
    html = write_sweep_report(tmp_path).read_text(encoding="utf-8")
    assert "No arrival-rate axis varied in this sweep" in html
    assert html.count('class="plotly-graph-div"') == 2  # hardware x tp heatmap, Pareto


def test_missing_results_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(ServesimError, match=r"sweep_dir: results\.parquet not found"):
        write_sweep_report(tmp_path)


# ---------------------------------------------------------------- servesim report


def servesim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servesim", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_report_rebuilds_run_and_sweep_reports(tmp_path: Path) -> None:
    run_dir, sweep_dir = tmp_path / "run", tmp_path / "sweep"
    fabricate_run(run_dir, n_requests=200, n_steps=400)
    fabricate_sweep(sweep_dir)
    done = servesim("report", str(run_dir))
    assert done.returncode == 0, done.stderr
    assert (run_dir / "report.html").is_file() and "report.html" in done.stdout
    done = servesim("report", str(sweep_dir), "--out", str(tmp_path / "s.html"))
    assert done.returncode == 0, done.stderr
    assert "servesim sweep report" in (tmp_path / "s.html").read_text(encoding="utf-8")


def test_cli_report_names_what_is_missing(tmp_path: Path) -> None:
    done = servesim("report", str(tmp_path))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "has none of summary.json (a run), results.parquet (a sweep), capacity.json" in lines[0]
    (tmp_path / "summary.json").write_text("{}", encoding="utf-8")
    done = servesim("report", str(tmp_path))
    assert done.returncode == 2 and "requests.parquet not found" in done.stderr
    assert "output: full" in done.stderr


# ---------------------------------------------------------------------- rough edges found by use
def test_structured_values_read_as_people_write_them() -> None:
    """A policy mapping (as a dict, or as the repr text older sweeps stored) is its name and knobs."""
    sjf = {"name": "sjf", "predictor": "noisy", "sigma": 1.0}
    assert format_value(sjf) == "sjf (predictor=noisy, sigma=1)"
    decode_first = "{'name': 'continuous', 'order': 'decode_first'}"
    assert format_value(decode_first) == "continuous (order=decode_first)"
    assert format_value("{'name': 'chunked_prefill'}") == "chunked_prefill"
    assert format_value({"kind": "nvlink"}) == "kind=nvlink" and format_value(None) == "–"
    assert format_value("{not a literal") == "{not a literal" and format_value(16.0) == "16"


def zipped_sweep(folder: Path) -> SweepData:
    """tp and replicas zipped (tp x replicas = 4 GPUs) against the rate, a policy mapping beside
    its name, every point costing the same $8/hour; the middle rate's TTFT interval is wide."""
    rows = []
    for tp, replicas in ((1, 4), (2, 2), (4, 1)):
        for rate in (4.0, 8.0, 12.0):
            ttft = 0.1 * tp * rate
            rows.append({"point": f"tp{tp}-r{rate:g}", "status": "ok", "reason": "", "deployment.tp": tp,
                         "deployment.replicas": replicas, "workload.arrival.rate": rate,
                         "policy": "{'name': 'continuous', 'order': 'decode_first'}",
                         "policy.name": "continuous", "gpus": 4, "cost_per_hour": 8.0, "replications": 3,
                         "hardware": "h100-sxm-80gb", "model": "llama-3-8b",
                         "ttft_s.p99": ttft, "ttft_s.p99.ci95": ttft * (1.5 if rate == 8 else 0.1),
                         "tpot_s.p99": 0.02, "tpot_s.p99.ci95": 0.001,
                         "throughput.requests_per_s": rate, "throughput.requests_per_s.ci95": 0.1,
                         "throughput.output_tokens_per_s": 200 * rate,
                         "throughput.output_tokens_per_s.ci95": 1.0})
    folder.mkdir()
    pd.DataFrame(rows).to_parquet(folder / "results.parquet", index=False)
    return load_sweep(folder)


def test_zipped_axes_are_one_heatmap_dimension(tmp_path: Path) -> None:
    """tp and replicas always move together: a tp x replicas heatmap would be 3 cells of 9. They
    become one dimension, drawn against the rate (every cell ran)."""
    data = zipped_sweep(tmp_path / "zip")
    assert axis_groups(data) == [["deployment.tp", "deployment.replicas"]]
    grouped, dims = with_dimensions(data)
    assert dims == ["deployment.tp + deployment.replicas"]
    assert sorted(set(grouped.frame[dims[0]])) == ["tp=1, replicas=4", "tp=2, replicas=2", "tp=4, replicas=1"]
    assert heatmap_pairs(grouped, dims) == [("workload.arrival.rate", dims[0])]
    assert heatmap_pairs(data) == [("workload.arrival.rate", "deployment.tp")]  # replicas x tp: sparse
    keys = [c.key for c in build_sweep_charts(data)]
    assert keys == ["knee", "latency", "heatmap1", "pareto"]


def test_equal_costs_plot_the_price_of_the_work(tmp_path: Path) -> None:
    """Every point costs $8/hour: x is $8 / (output tokens/s x 3600) x 1e6 instead of one column."""
    data = zipped_sweep(tmp_path / "zip")
    chart = next(c for c in build_sweep_charts(data) if c.key == "pareto")
    assert chart.figure is not None and chart.figure.layout.xaxis.title.text == "$ per 1M output tokens"
    first = chart.figure.data[0]  # rate 4: 800 tokens/s
    assert list(first.x) == pytest.approx([8.0 / (800 * 3600) * 1e6] * 3)
    assert "Every point costs the same $8/hour" in chart.caption


def test_intervals_wider_than_the_mean_are_flagged(tmp_path: Path) -> None:
    data = zipped_sweep(tmp_path / "zip")
    wide = wide_intervals(data)
    assert [row["workload.arrival.rate"] for row, _ in wide] == [8.0, 8.0, 8.0]
    assert all(labels == ["p99 TTFT"] for _, labels in wide)
    html = render_sweep_report(data, plotlyjs="cdn")  # plotly.js's own source holds such reprs
    assert "Uncertain near the knee" in html and "workload.num_requests" in html
    assert html.count('class="wide"') == 3
    assert "{'name'" not in html


def test_legends_sit_under_the_charts(tmp_path: Path) -> None:
    """Above the plot a long legend grew into the linear/log buttons."""
    data = zipped_sweep(tmp_path / "zip")
    for chart in build_sweep_charts(data)[:2]:
        assert chart.figure is not None and chart.figure.layout.legend.y < 0
    buttons = build_sweep_charts(data)[1].figure.layout.updatemenus[0]
    assert buttons.y > 1
