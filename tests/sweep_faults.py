"""Worker functions for the fault tests, importable by spawned sweep workers."""

from __future__ import annotations

import os
import signal

from servesim.sweep.execute import RunFiles, execute_run
from servesim.sweep.plan import RunTask

DOOMED_ENV = "SERVESIM_TEST_DOOMED_RUN"
"""The run id whose worker always dies (inherited by spawned workers)."""


def die_on_doomed_run(task: RunTask) -> RunFiles:
    """Like :func:`execute_run`, but the worker holding the doomed run is killed (as the
    out-of-memory killer would)."""
    if task.run_id == os.environ.get(DOOMED_ENV):
        os.kill(os.getpid(), signal.SIGKILL)
    return execute_run(task)
