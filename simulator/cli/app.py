"""The ``servesim`` command: a thin shell over the Python API.

Each sub-command lives in its own module and only parses flags, calls the API and prints. A user
mistake (:class:`~servesim.errors.ServesimError`) is printed as one ``error:`` line on stderr
with exit status 2, never as a traceback.

The command modules import what their command needs inside the command, so that ``--help``,
``models``, ``hardware`` and ``step`` start without pandas, plotly or the simulation engine.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TYPE_CHECKING, Any, TextIO

import typer
from rich.markup import escape

from servesim.cli import interrupt
from servesim.cli.console import error_console
from servesim.errors import ServesimError

COMMANDS = {"run": ("servesim.cli.run", "run_command"),
            "validate": ("servesim.cli.run", "validate_command"),
            "sweep": ("servesim.cli.sweep", "sweep_command"),
            "step": ("servesim.cli.step", "step_command"),
            "capacity": ("servesim.cli.capacity", "capacity_command"),
            "plan-day": ("servesim.cli.plan_day", "plan_day_command"),
            "models": ("servesim.cli.catalog", "models_command"),
            "hardware": ("servesim.cli.catalog", "hardware_command"),
            "report": ("servesim.cli.report", "report_command"),
            "calibrate": ("servesim.cli.calibrate", "calibrate_app")}
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

    for name, (module, attribute) in COMMANDS.items():
        if only is not None and name != only:
            continue
        command = getattr(importlib.import_module(module), attribute)  # only the command's module
        if name == "calibrate":
            app.add_typer(command, name=name)
        else:
            app.command(name)(command)
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
