"""The ``servesim`` command: a thin shell over the Python API.

Each sub-command lives in its own module and only parses flags, calls the API and prints. A user
mistake (:class:`~servesim.errors.ServesimError`) is printed as one ``error:`` line on stderr
with exit status 2, never as a traceback.

The command modules import what their command needs inside the command, so that ``--help``,
``models``, ``hardware`` and ``step`` start without pandas, plotly or the simulation engine.
"""

from __future__ import annotations

import sys
import warnings
from typing import TextIO

import typer
from rich.markup import escape

from servesim.cli import interrupt
from servesim.cli.calibrate import calibrate_app
from servesim.cli.capacity import capacity_command
from servesim.cli.catalog import hardware_command, models_command
from servesim.cli.console import error_console
from servesim.cli.plan_day import plan_day_command
from servesim.cli.report import report_command
from servesim.cli.run import run_command, validate_command
from servesim.cli.step import step_command
from servesim.cli.sweep import sweep_command
from servesim.errors import ServesimError

app = typer.Typer(
    name="servesim",
    help="Discrete-event simulator of LLM inference serving with a roofline cost model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("run")(run_command)
app.command("validate")(validate_command)
app.command("sweep")(sweep_command)
app.command("step")(step_command)
app.command("capacity")(capacity_command)
app.command("plan-day")(plan_day_command)
app.command("models")(models_command)
app.command("hardware")(hardware_command)
app.command("report")(report_command)
app.add_typer(calibrate_app, name="calibrate")

def _show_note(message: Warning | str, category: type[Warning], filename: str, lineno: int,
               file: TextIO | None = None, line: str | None = None) -> None:
    """A config read in its new form prints one ``note:`` line (once per message)."""
    from servesim.config import MigrationNote  # loaded by then: only a config warns

    if issubclass(category, MigrationNote):
        error_console.print(f"[yellow]note:[/] {escape(str(message))}", markup=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = warnings.showwarning


def main() -> None:
    """Console-script entry point."""
    warnings.showwarning = _show_note
    interrupt.install()
    try:
        app()
    except ServesimError as exc:
        error_console.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True)
        sys.exit(2)
    except interrupt.Interrupted:
        error_console.print(interrupt.MESSAGE, markup=False)
        sys.exit(130)
