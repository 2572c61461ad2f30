"""Ctrl-C as one line and a clean exit, for every command.

Typer turns a ``KeyboardInterrupt`` into a silent exit 130, so the CLI installs its own SIGINT
handler, which raises :class:`Interrupted` (not a ``KeyboardInterrupt``, so no library swallows
it): ``finally`` blocks run (a run's staging folder is removed, a sweep's workers stopped, its
lock released), and :func:`servesim.cli.app.main` prints one line and exits 130. Since every
output is written whole or not at all, the files of an earlier run are left as they were.
"""

from __future__ import annotations

import signal
from types import FrameType

MESSAGE = ("interrupted: nothing was left half-written (outputs are written whole or not at all); "
           "run the command again to redo it")


class Interrupted(BaseException):
    """Ctrl-C (SIGINT) while a command ran."""


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted


def install() -> None:
    """Route SIGINT to :class:`Interrupted` (main thread only, as signal handlers are)."""
    signal.signal(signal.SIGINT, _raise)
