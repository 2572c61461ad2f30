"""``servesim report``: rebuild the HTML report of a run folder or a sweep folder from its saved
outputs alone (nothing is simulated again)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servesim.cli.console import console
from servesim.errors import ServesimError
from servesim.report import write_run_report
from servesim.report.sweep_report import RESULTS_FILE, write_sweep_report

RUN_MARKER = "summary.json"


def report_command(
    folder: Annotated[Path, typer.Argument(help="A run folder (summary.json + parquet files) or a sweep "
                                                "folder (results.parquet)")],
    out: Annotated[Path | None, typer.Option(help="HTML file to write (default FOLDER/report.html)")] = None,
) -> None:
    """Write FOLDER/report.html (or --out) from a finished run's or sweep's saved outputs."""
    if not folder.is_dir():
        raise ServesimError("FOLDER", f"{folder} is not a directory",
                            "pass the output folder of `servesim run` or of a sweep")
    if (folder / RESULTS_FILE).is_file():
        written = write_sweep_report(folder, out)
    elif (folder / RUN_MARKER).is_file():
        written = write_run_report(folder, out)
    else:
        raise ServesimError("FOLDER", f"{folder} has neither {RUN_MARKER} (a run) nor {RESULTS_FILE} "
                            "(a sweep)", "pass the output folder of `servesim run` or of a sweep")
    console.print(f"wrote {written} ({written.stat().st_size / 1e6:.1f} MB)")
