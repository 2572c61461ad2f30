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
from typing import TYPE_CHECKING, Any, TextIO

import typer
from rich.markup import escape

from servesim.cli import interrupt
from servesim.cli.console import error_console
from servesim.errors import ServesimError

COMMANDS = ("run", "validate", "sweep", "step", "capacity", "plan-day", "models", "hardware", "report",
            "calibrate")
"""The sub-commands, in the order ``servesim --help`` lists them."""


def build_app(only: str | None = None) -> typer.Typer:
    """The ``servesim`` app with every command, or with the one command ``only``.

    :func:`main` builds the app for the command on its command line alone: only that command's
    module is imported, and typer reads one function's signature instead of every command's. Its
    arguments, help and errors are the same as in the whole app (``servesim --help``, a mistyped
    command and anything else get the whole app)."""
    app = typer.Typer(
        name="servesim",
        help="Discrete-event simulator of LLM inference serving with a roofline cost model.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    def wanted(name: str) -> bool:
        return only is None or only == name

    if wanted("run"):
        from servesim.cli.run import run_command

        app.command("run")(run_command)
    if wanted("validate"):
        from servesim.cli.run import validate_command

        app.command("validate")(validate_command)
    if wanted("sweep"):
        from servesim.cli.sweep import sweep_command

        app.command("sweep")(sweep_command)
    if wanted("step"):
        from servesim.cli.step import step_command

        app.command("step")(step_command)
    if wanted("capacity"):
        from servesim.cli.capacity import capacity_command

        app.command("capacity")(capacity_command)
    if wanted("plan-day"):
        from servesim.cli.plan_day import plan_day_command

        app.command("plan-day")(plan_day_command)
    if wanted("models"):
        from servesim.cli.catalog import models_command

        app.command("models")(models_command)
    if wanted("hardware"):
        from servesim.cli.catalog import hardware_command

        app.command("hardware")(hardware_command)
    if wanted("report"):
        from servesim.cli.report import report_command

        app.command("report")(report_command)
    if wanted("calibrate"):
        from servesim.cli.calibrate import calibrate_app

        app.add_typer(calibrate_app, name="calibrate")
    if only is not None and only != "calibrate":
        # A lone command would become the whole program (``servesim CONFIG``); a group callback
        # that does nothing keeps it a sub-command (``servesim run CONFIG``).
        app.callback()(_no_options)
    return app


def _no_options() -> None:
    pass


if TYPE_CHECKING:
    app: typer.Typer
    """The whole app (every command), built on first use: ``from servesim.cli.app import app``."""


def __getattr__(name: str) -> Any:
    if name == "app":
        whole = build_app()
        globals()["app"] = whole
        return whole
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    command = sys.argv[1] if len(sys.argv) > 1 else None
    try:
        build_app(command if command in COMMANDS else None)()
    except ServesimError as exc:
        error_console.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True)
        sys.exit(2)
    except interrupt.Interrupted:
        error_console.print(interrupt.MESSAGE, markup=False)
        sys.exit(130)
