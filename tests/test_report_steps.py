"""The run report's roofline and per-operator charts, checked by hand, and the engine's per-step
operator columns they read."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_report_run import _plot_data, fabricate_run

from servesim import load_hardware
from servesim.core.step_log import OP_COLUMNS as ENGINE_OP_COLUMNS
from servesim.dtypes import DType
from servesim.report import write_run_report
from servesim.report.hardware_roof import Roof, roof_from_config
from servesim.report.run_data import OP_COLUMNS, load_run
from servesim.report.run_report import build_run_charts
from servesim.report.step_figures import op_totals, roofline_chart, roofline_points, step_kinds

H100_CONFIG = "model: llama-3-8b\nhardware: h100-sxm-80gb\ndeployment:\n  tp: 2\n"


def test_report_reads_the_columns_the_engine_writes() -> None:
    assert OP_COLUMNS == ENGINE_OP_COLUMNS


def test_step_kinds() -> None:
    kinds = step_kinds(np.array([1, 0, 2, 0]), np.array([0, 5, 3, 0]))
    assert kinds.tolist() == ["prefill only", "decode only", "mixed", "decode only"]


def test_roof_from_the_resolved_config(tmp_path: Path) -> None:
    roof = roof_from_config(H100_CONFIG, tmp_path)
    h100 = load_hardware("h100-sxm-80gb")
    assert isinstance(roof, Roof) and roof.tp == 2 and roof.math_dtype == "bf16"
    assert roof.ridge == pytest.approx(h100.ridge_point(DType.BF16))
    assert 250 < roof.ridge < 350  # H100 SXM: ~989 dense bf16 TFLOP/s over ~3.35 TB/s = ~295 FLOP/B
    fp8 = roof_from_config(H100_CONFIG + "precision:\n  weights: fp8\n  activations: fp8\n", tmp_path)
    assert isinstance(fp8, Roof) and fp8.peak_flops == pytest.approx(2 * fp8.bf16_peak_flops, rel=0.01)
    assert "could not be loaded" in roof_from_config("hardware: nope-9000\n", tmp_path)
    assert roof_from_config(None, tmp_path) == "no config.resolved.yaml in the run folder"


def test_roofline_points_by_hand(tmp_path: Path) -> None:
    """1e12 FLOPs over 1e10 bytes in 10 ms on each GPU of a TP-2 group: 100 FLOP/B and
    2 x 1e14 = 200 TFLOP/s; an idle-work step (no FLOPs) is left out."""
    fabricate_run(tmp_path, n_requests=50, n_steps=100)
    steps = pd.read_parquet(tmp_path / "steps.parquet").iloc[:2].copy()
    steps["flops"], steps["hbm_bytes"], steps["duration_s"] = [1e12, 0.0], [1e10, 1e9], [0.01, 0.01]
    steps.to_parquet(tmp_path / "steps.parquet")
    (tmp_path / "config.resolved.yaml").write_text(H100_CONFIG, encoding="utf-8")
    data = load_run(tmp_path)
    points = roofline_points(data, tp=2)
    assert points["index"].tolist() == [0]
    assert points["intensity"][0] == pytest.approx(100.0)
    assert points["flops_per_s"][0] == pytest.approx(2e14)
    roof = roof_from_config(data.config_text, tmp_path)
    chart = roofline_chart(data, roof)
    roof_trace = chart.figure.data[0]
    assert roof_trace.y[1] == pytest.approx(2 * roof.peak_flops / 1e12)  # the flat part: 2 x peak
    assert roof_trace.x[1] == pytest.approx(roof.ridge)
    step_trace = next(t for t in chart.figure.data if t.name in ("prefill only", "decode only", "mixed"))
    assert float(step_trace.x[0]) == pytest.approx(100.0, rel=1e-6)
    assert float(step_trace.y[0]) == pytest.approx(200.0, rel=1e-6)
    # 200 TFLOP/s at 100 FLOP/B is under the bandwidth slope: 2 x 3.35 TB/s x 100 = 670 TFLOP/s.
    share_of_roof = float(step_trace.customdata[0][5])
    assert share_of_roof == pytest.approx(100 * 2e14 / (2 * roof.bandwidth_Bps * 100), rel=1e-5)


def test_unknown_hardware_draws_the_steps_without_a_roof(tmp_path: Path) -> None:
    fabricate_run(tmp_path, n_requests=100, n_steps=300)
    (tmp_path / "config.resolved.yaml").write_text("hardware: gone.yaml\n", encoding="utf-8")
    html = write_run_report(tmp_path).read_text(encoding="utf-8")
    assert re.search(r"No roof drawn: hardware &#x27;gone.yaml&#x27; could not be loaded", html)


def test_operator_totals_by_hand(tmp_path: Path) -> None:
    """The fabricated steps split each duration 60/10/10/20 (GEMM / attention / elementwise /
    overhead), attention going to prefill in steps with a prefill and to decode otherwise."""
    fabricate_run(tmp_path, n_requests=300, n_steps=1000)
    data = load_run(tmp_path)
    totals = op_totals(data)
    busy = data.steps["duration_s"].sum()
    assert totals["all steps"]["op_gemm_s"] == pytest.approx(0.6 * busy)
    assert totals["all steps"]["op_overhead_s"] == pytest.approx(0.2 * busy)
    with_prefill = data.steps["num_prefills"] > 0
    assert (totals["prefill only"]["op_attn_prefill_s"] + totals["mixed"]["op_attn_prefill_s"]
            == pytest.approx(0.1 * data.steps.loc[with_prefill, "duration_s"].sum()))
    assert totals["decode only"]["steps"] == int((~with_prefill).sum())
    chart = next(c for c in build_run_charts(data) if c.key == "operators")
    gemm = next(t for t in chart.figure.data if t.legendgroup == "op_gemm_s" and t.xaxis == "x")
    assert tuple(gemm.x)[:1] == ("all steps",) and float(gemm.y[0]) == pytest.approx(0.6 * busy)
    assert "take 60% of the busy time" in chart.caption


def test_a_run_from_before_the_operator_columns_still_renders(tmp_path: Path) -> None:
    fabricate_run(tmp_path, n_requests=100, n_steps=300)
    path = tmp_path / "steps.parquet"
    pd.read_parquet(path).drop(columns=list(OP_COLUMNS), errors="ignore").to_parquet(path)
    html = write_run_report(tmp_path).read_text(encoding="utf-8")
    assert "has no op_*_s columns" in html
    assert html.count('class="plotly-graph-div"') == 8  # every chart of the run report but the operators


def test_engine_run_records_operator_time_that_adds_up(tmp_path: Path) -> None:
    """A real simulation: per step the six classes sum to the step time, and the report shows
    the roofline with every step at or under the H100 roof."""
    from servesim.config import load_experiment
    from servesim.pipeline import prepare, render, simulate
    from servesim.resources import configs_dir

    config = load_experiment(configs_dir() / "quickstart.yaml",
                             ["workload.num_requests=200", "deployment.tp=2"])
    render(simulate(prepare(config)), tmp_path)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    np.testing.assert_allclose(steps[list(OP_COLUMNS)].sum(axis=1), steps["duration_s"], rtol=1e-12)
    assert (steps["op_communication_s"] > 0).all()  # TP 2: two all-reduces per layer in every step
    assert (steps.loc[steps["num_prefills"] == 0, "op_attn_prefill_s"] == 0).all()
    data = load_run(tmp_path)
    roof = roof_from_config(data.config_text, tmp_path)
    assert isinstance(roof, Roof) and roof.tp == 2
    points = roofline_points(data, roof.tp)
    ceiling = np.minimum(roof.tp * roof.peak_flops, roof.tp * roof.bandwidth_Bps * points["intensity"])
    assert (points["flops_per_s"] <= ceiling * (1 + 1e-9)).all()
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    figures = _plot_data(html)
    assert len(figures) == 9 and all(figures)
