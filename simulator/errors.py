"""User-facing errors.

Every mistake a user can make (an unknown model, a malformed profile, a batch that cannot fit in
GPU memory) raises :class:`ServesimError`. Its string form is one line that names the field at
fault and the fix, and the CLI prints exactly that line instead of a traceback. Internal bugs stay
ordinary exceptions so that they do show a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class ServesimError(Exception):
    """A user mistake, reported as ``<field>: <problem>; <fix>`` on one line."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        message = f"{field}: {problem}" if field else problem
        if fix:
            message = f"{message}; {fix}"
        self.message = " ".join(message.split())
        super().__init__(field, problem, fix)  # args that rebuild it (pickling, SimPy's re-raise)

    def __str__(self) -> str:
        return self.message


def at_least_one(flag: str, value: int | None) -> None:
    """A count flag (``--workers``, ``--measured``) given below 1 is one line naming it, before
    anything runs (None: not given, the command's default)."""
    if value is not None and value < 1:
        raise ServesimError(flag, f"must be >= 1, got {value}", "use 1 or more")


def run_script(main: Callable[[], None]) -> None:
    """Run the ``main`` of a ``python -m servesim....`` script as the CLI runs a command: a user
    mistake is its one ``error:`` line on stderr and exit status 2, never a traceback."""
    try:
        main()
    except ServesimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
