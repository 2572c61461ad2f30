"""The HTML report of one simulation run: verdict first, then the charts behind it.

Usable from the CLI and from a notebook alike::

    from servesim.report import write_run_report
    write_run_report(Path("runs/llama8b-h100"))   # -> runs/llama8b-h100/report.html
"""

from __future__ import annotations

from pathlib import Path

from servesim.report.balance_figures import replica_chart, ttft_prompt_chart
from servesim.report.figures import Chart, build_charts
from servesim.report.fleet_figures import fleet_charts
from servesim.report.hardware_roof import roof_from_config
from servesim.report.page import PlotlyJs, render_page, write_page
from servesim.report.run_data import RunData, load_run
from servesim.report.step_figures import has_op_columns, op_breakdown_chart, roofline_chart
from servesim.report.verdict import SloCheck, render_header, slo_checks

REPORT_FILE = "report.html"


def build_run_charts(data: RunData) -> list[Chart]:
    """The report's charts for an already loaded run (tests and notebooks inspect these)."""
    return _charts(data, slo_checks(data))


def _charts(data: RunData, checks: list[SloCheck]) -> list[Chart]:
    charts = build_charts(data, checks)
    charts.insert(1, ttft_prompt_chart(data, checks))
    charts.append(replica_chart(data))
    charts.extend(fleet_charts(data))
    roof = data.roof if data.roof is not None else roof_from_config(data.config_text, data.run_dir)
    charts.append(roofline_chart(data, roof))
    if has_op_columns(data):
        charts.append(op_breakdown_chart(data))
    else:
        charts.append(Chart("operators", "Time per operator class",
                            "This run's steps.parquet has no op_*_s columns (written by an older servesim): "
                            "re-run the simulation to see the time per operator class.", None, 0))
    return charts


def render_run_report(data: RunData, plotlyjs: PlotlyJs = "inline") -> str:
    """The report page as one HTML string."""
    checks = slo_checks(data)
    deployment = data.summary.get("deployment") or {}
    title = f"servesim run: {deployment.get('model', data.run_dir.name)}"
    return render_page(title, render_header(data, checks), _charts(data, checks), data.config_text,
                       footer=f"servesim run report for {data.run_dir.resolve()}", plotlyjs=plotlyjs)


def write_run_report(run_dir: Path, out: Path | None = None, data: RunData | None = None,
                     plotlyjs: PlotlyJs = "inline") -> Path:
    """Write a self-contained HTML report of the run in ``run_dir``; return its path.

    ``data`` is the run in memory (:meth:`RunData.from_result`); without it the saved outputs are
    read. ``out`` defaults to ``run_dir / "report.html"``; ``plotlyjs`` picks how the page loads
    plotly.js (:mod:`servesim.report.page`). Raises :class:`ServesimError` when the run directory
    lacks a file or column the report needs.
    """
    run_dir = Path(run_dir)
    if data is None:
        data = load_run(run_dir)
    target = Path(out) if out is not None else run_dir / REPORT_FILE
    return write_page(target, render_run_report(data, plotlyjs), plotlyjs)
