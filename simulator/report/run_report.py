"""The HTML report of one simulation run: verdict first, then the charts behind it.

Usable from the CLI and from a notebook alike::

    from servesim.report import write_run_report
    write_run_report(Path("runs/llama8b-h100"))   # -> runs/llama8b-h100/report.html
"""

from __future__ import annotations

from pathlib import Path

from servesim.atomic_io import atomic_write_text
from servesim.report.figures import Chart, build_charts
from servesim.report.fleet_figures import fleet_charts
from servesim.report.hardware_roof import roof_from_config
from servesim.report.page import render_page
from servesim.report.run_data import RunData, load_run
from servesim.report.step_figures import has_op_columns, op_breakdown_chart, roofline_chart
from servesim.report.verdict import SloCheck, render_header, slo_checks

REPORT_FILE = "report.html"


def build_run_charts(data: RunData) -> list[Chart]:
    """The report's charts for an already loaded run (tests and notebooks inspect these)."""
    return _charts(data, slo_checks(data))


def _charts(data: RunData, checks: list[SloCheck]) -> list[Chart]:
    charts = build_charts(data, checks)
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


def render_run_report(data: RunData) -> str:
    """The report page as one HTML string."""
    checks = slo_checks(data)
    deployment = data.summary.get("deployment") or {}
    title = f"servesim run: {deployment.get('model', data.run_dir.name)}"
    return render_page(title, render_header(data, checks), _charts(data, checks), data.config_text,
                       footer=f"servesim run report for {data.run_dir.resolve()}")


def write_run_report(run_dir: Path, out: Path | None = None, data: RunData | None = None) -> Path:
    """Write a self-contained HTML report of the run in ``run_dir``; return its path.

    ``data`` is the run in memory (:meth:`RunData.from_result`); without it the saved outputs are
    read. ``out`` defaults to ``run_dir / "report.html"``. Raises :class:`ServesimError` when the
    run directory lacks a file or column the report needs.
    """
    run_dir = Path(run_dir)
    if data is None:
        data = load_run(run_dir)
    target = Path(out) if out is not None else run_dir / REPORT_FILE
    atomic_write_text(target, render_run_report(data))
    return target
