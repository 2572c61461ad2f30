"""``servesim report``: rebuild the HTML report of a run, sweep or capacity folder from its saved
outputs alone (nothing is simulated again), or compare two runs side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servesim.cli.console import console
from servesim.errors import ServesimError

RUN_MARKER = "summary.json"
SWEEP_MARKER = "results.parquet"
CAPACITY_MARKER = "capacity.json"
PlotlyJsOption = Annotated[str, typer.Option(
    help="How the page loads plotly.js: inline (self-contained, ~4.8 MB, the default), cdn (a link to "
         "plotly's CDN: small, needs the network) or directory (plotly.min.js written once beside it)")]


PLOTLYJS_CHOICES = ("inline", "cdn", "directory")


def check_plotlyjs_early(mode: str) -> None:
    """Refuse an unknown ``--plotlyjs`` before a long run (without importing plotly)."""
    if mode not in PLOTLYJS_CHOICES:
        raise ServesimError("--plotlyjs", f"unknown mode {mode!r}",
                            "use inline (self-contained, the default), cdn or directory")


def _kind(folder: Path) -> str:
    if not folder.is_dir():
        raise ServesimError("FOLDER", f"{folder} is not a directory",
                            "pass the output folder of `servesim run`, a sweep or `servesim capacity`")
    for marker, kind in ((SWEEP_MARKER, "sweep"), (CAPACITY_MARKER, "capacity"), (RUN_MARKER, "run")):
        if (folder / marker).is_file():
            return kind
    raise ServesimError("FOLDER", f"{folder} has none of {RUN_MARKER} (a run), {SWEEP_MARKER} (a sweep), "
                        f"{CAPACITY_MARKER} (a capacity plan)",
                        "pass the output folder of `servesim run`, a sweep or `servesim capacity`")


def report_command(
    folder: Annotated[Path, typer.Argument(
        help="A run folder (summary.json + parquet files), a sweep folder (results.parquet) or a capacity "
             "folder (capacity.json)")],
    other: Annotated[Path | None, typer.Argument(
        help="A second run folder: write a report comparing the two runs")] = None,
    out: Annotated[Path | None, typer.Option(help="HTML file to write (default FOLDER/report.html; "
                                                  "with two runs FOLDER/compare-<OTHER>.html)")] = None,
    plotlyjs: PlotlyJsOption = "inline",
) -> None:
    """Write FOLDER/report.html (or --out) from a finished run's, sweep's or capacity plan's saved
    outputs; with two run folders, a report comparing them."""
    from servesim.report.page import check_plotlyjs

    mode = check_plotlyjs(plotlyjs)
    kind = _kind(folder)
    if other is not None:
        if kind != "run" or _kind(other) != "run":
            raise ServesimError("OTHER", "comparing needs two run folders (each with summary.json and "
                                "the parquet tables)", "pass two `servesim run` output folders")
        from servesim.report.compare_report import write_compare_report

        written = write_compare_report(folder, other, out, plotlyjs=mode)
    elif kind == "sweep":
        from servesim.report.sweep_report import write_sweep_report

        written = write_sweep_report(folder, out, plotlyjs=mode)
    elif kind == "capacity":
        from servesim.report.capacity_report import write_capacity_report

        written = write_capacity_report(folder, out, plotlyjs=mode)
    else:
        from servesim.report.run_report import write_run_report

        written = write_run_report(folder, out, plotlyjs=mode)
    console.print(f"wrote {written} ({written.stat().st_size / 1e6:.1f} MB)")
