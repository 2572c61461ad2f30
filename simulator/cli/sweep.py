"""``servesim sweep``: run every point of a sweep file in parallel, resumably, and tabulate them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from servesim.cli.console import console
from servesim.cli.interrupt import Interrupted
from servesim.cli.report import PlotlyJsOption, check_plotlyjs_early

if TYPE_CHECKING:
    import pandas as pd

    from servesim.sweep.backends import Backend
    from servesim.sweep.runner import SweepOutcome

SHOWN_METRICS = (("ttft_s.p99", "p99 TTFT", "s"), ("tpot_s.p50", "p50 TPOT", "s"),
                 ("throughput.requests_per_s", "req/s", ""), ("goodput_requests_per_s", "goodput", ""),
                 ("slo_attainment", "SLO", "%"))
MAX_ROWS_SHOWN = 40


def sweep_command(
    sweep_file: Annotated[str, typer.Argument(
        metavar="SWEEP", help="Sweep YAML (or a built-in sweep, e.g. tp-70b, quantisation, rates-h100)")],
    out: Annotated[Path | None, typer.Option(
        help="Sweep folder (default sweeps/<name>); rerun into it to resume")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a key of the base experiment, e.g. --set workload.num_requests=200")] = None,
    workers: Annotated[int | None, typer.Option(help="Parallel runs (default: CPU count)")] = None,
    backend: Annotated[str, typer.Option(help="local (process pool) or ray")] = "local",
    ray_address: Annotated[str | None, typer.Option(
        help="Ray cluster to join (e.g. auto, ray://head:10001); default: start a local Ray")] = None,
    report: Annotated[bool, typer.Option(help="Write the sweep's report.html")] = True,
    dry_run: Annotated[bool, typer.Option(help="Check every point and list them; run nothing")] = False,
    force: Annotated[bool, typer.Option(
        help="Replace the sweep the --out folder holds (keeping the runs both share)")] = False,
    quiet: Annotated[bool, typer.Option(help="No progress bar")] = False,
    plotlyjs: PlotlyJsOption = "inline",
) -> None:
    """Run a parameter sweep: results.parquet (one row per point, mean and 95% CI over
    replications), one folder per run under points/, resumable by rerunning."""
    import pandas as pd
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from servesim.errors import at_least_one
    from servesim.sweep import find_sweep, load_sweep
    from servesim.sweep.axes import point_label
    from servesim.sweep.backends import check_backend
    from servesim.sweep.runner import prepare

    at_least_one("--workers", workers)
    chosen = check_backend(backend)
    check_plotlyjs_early(plotlyjs)
    sweep = load_sweep(find_sweep(sweep_file), overrides)
    out_dir = out or Path("sweeps") / sweep.name
    if dry_run:
        from servesim.sweep.plan import plan_sweep

        plan = plan_sweep(sweep)
        for point in plan.points:
            note = f"  [yellow]infeasible[/]: {escape(point.reason)}" if point.status != "ok" else ""
            console.print(f"{point.point_id}  {escape(point_label(point.values))}{note}")
        console.print(f"{len(plan.points)} points, {len(plan.runs)} runs: all valid")
        return
    prepared = prepare(sweep, out_dir, force)
    plan = prepared.plan
    infeasible = sum(p.status != "ok" for p in plan.points)
    console.print(f"[bold]{escape(sweep.name)}[/]: {len(plan.points)} points x {sweep.spec.replications} "
                  f"replication{'s' if sweep.spec.replications > 1 else ''}"
                  + (f" ({infeasible} infeasible, not run)" if infeasible else "")
                  + f" = {len(plan.runs)} runs; {len(prepared.todo)} to run on "
                  + _where(backend, workers, ray_address))
    if prepared.skipped:
        plural = "s" if prepared.skipped > 1 else ""
        console.print(f"resuming: skipped {prepared.skipped} finished run{plural}"
                      + (f"; redoing {prepared.stale_removed} interrupted" if prepared.stale_removed else ""))
    columns = (TextColumn("sweeping"), BarColumn(), MofNCompleteColumn(), TextColumn("runs"),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    finished = 0

    def advance(_run: object) -> None:
        nonlocal finished
        finished += 1
        bar.advance(task)

    try:
        with Progress(*columns, console=console, disable=quiet, transient=True) as bar:
            task = bar.add_task("sweep", total=len(prepared.todo))
            outcome = prepared.run(chosen, workers, ray_address, on_run=advance)
    except (KeyboardInterrupt, Interrupted):
        console.print(f"interrupted: the {prepared.skipped + finished} finished runs are kept in "
                      f"{out_dir}/points; run the same command again to resume")
        raise typer.Exit(130) from None
    results = pd.read_parquet(out_dir / "results.parquet")
    render_results(results, plan.keys)
    runs = f"{outcome.runs_done} run{'s' if outcome.runs_done != 1 else ''}"
    console.print(f"ran {runs} in {outcome.wall_s:.1f} s wall")
    _report_faults(outcome)
    console.print(f"wrote {out_dir}/ (results.parquet, points.parquet, sweep.resolved.yaml, points/)")
    if report:
        _write_report(out_dir, plotlyjs)


def _report_faults(outcome: SweepOutcome) -> None:
    """Worker deaths and failed runs, so a sweep that carried on past them says so."""
    if outcome.deaths:
        deaths = escape("; ".join(outcome.deaths))
        console.print(f"[yellow]{len(outcome.deaths)} worker death(s)[/]: {deaths}")
    if outcome.failures:
        run, reason = outcome.failures[0]
        console.print(f"[bold red]{len(outcome.failures)} run(s) failed[/] (first: {run}, {escape(reason)}); "
                      "the other runs are in the tables; run the same command again to retry the failed ones")


def _where(backend: Backend | str, workers: int | None, address: str | None) -> str:
    from servesim.sweep.backends import default_workers

    if backend == "ray":
        return f"Ray at {address}" if address else f"local Ray ({workers or default_workers()} CPUs)"
    count = workers or default_workers()
    return f"{count} local worker{'s' if count > 1 else ''}"


def _write_report(out_dir: Path, plotlyjs: str) -> None:
    from servesim.report.page import check_plotlyjs
    from servesim.report.sweep_report import write_sweep_report

    path = write_sweep_report(out_dir, plotlyjs=check_plotlyjs(plotlyjs))
    console.print(f"wrote {path}")


def render_results(results: pd.DataFrame, keys: list[str]) -> None:
    """The points as a table: the varied keys, then a few headline metrics (mean ± ci95)."""
    from servesim.report.sweep_data import format_value

    table = Table(show_edge=False, box=None, pad_edge=False)
    shown_keys = [k for k in keys if k in results] or ["point"]
    for key in shown_keys:
        table.add_column(key)
    metrics = [m for m in SHOWN_METRICS if m[0] in results and results[m[0]].notna().any()]
    for _, label, _ in metrics:
        table.add_column(label, justify="right")
    for _, row in results.head(MAX_ROWS_SHOWN).iterrows():
        cells = [escape(format_value(row[k])) for k in shown_keys]
        if row["status"] != "ok":
            cells += [f"[yellow]{row['status']}[/]"] + [""] * (len(metrics) - 1)
        else:
            cells += [_cell(row[name], row.get(f"{name}.ci95", 0.0), unit) for name, _, unit in metrics]
        table.add_row(*cells)
    console.print(table)
    if len(results) > MAX_ROWS_SHOWN:
        console.print(f"... {len(results) - MAX_ROWS_SHOWN} more points in results.parquet")
    for _, row in results[results["status"] != "ok"].head(MAX_ROWS_SHOWN).iterrows():
        label = ", ".join(f"{k}={row[k]}" for k in shown_keys)
        console.print(f"[yellow]{row['status']}[/] {escape(label)}: {escape(str(row['reason']))}")


def _cell(mean: float, ci: float, unit: str) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if unit == "%":
        text, ci_text = f"{mean:.1%}", f"{ci:.1%}"
    elif unit == "s":
        text, ci_text = (f"{mean * 1e3:,.1f} ms", f"{ci * 1e3:,.1f}") if mean < 1 else (f"{mean:,.2f} s",
                                                                                         f"{ci:,.2f}")
    else:
        text, ci_text = f"{mean:,.2f}", f"{ci:,.2f}"
    return f"{text} ± {ci_text}" if ci and not math.isnan(ci) else text
