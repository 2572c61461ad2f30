"""Running one (point, seed) and storing its folder: the one code path every backend shares.

:func:`execute_run` simulates a :class:`~servesim.sweep.plan.RunTask` and returns the run's
files as bytes (the same files ``servesim run --no-report`` writes, from
:func:`~servesim.pipeline.render.result_files`: ``summary.json``, ``config.resolved.yaml`` and,
for ``output: full``, the parquet tables) plus ``run.json`` (status, point, replication, seed,
wall time). It touches no shared disk, so it runs unchanged in a local
worker process or on any node of a Ray cluster. :func:`store_run`, on the machine that owns the
sweep folder, writes those files into ``points/.tmp-<run>-*`` and renames that folder to
``points/<run>/`` in one step: a run folder is there whole or not at all, so a killed sweep loses
only the runs that had not finished, and a resumed sweep can trust every folder it finds.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesim.atomic_io import write_error
from servesim.config import validate_document
from servesim.core.progress import StalledError
from servesim.errors import ServesimError
from servesim.pipeline import prepare, result_files, simulate
from servesim.sweep.plan import RunTask

RUN_RECORD = "run.json"
FAILED = "failed"
"""The status of a run whose worker died twice (see :mod:`servesim.sweep.local_pool`)."""
TEMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class RunFiles:
    run_id: str
    files: dict[str, bytes]

    @property
    def record(self) -> dict[str, Any]:
        return json.loads(self.files[RUN_RECORD])


def execute_run(task: RunTask) -> RunFiles:
    """Simulate one run; a deployment that turns out not to run is recorded as ``infeasible``."""
    started = time.perf_counter()
    record: dict[str, Any] = {"run": task.run_id, "point": task.point_id, "replication": task.replication,
                              "seed": task.seed, "status": "ok", "reason": ""}
    files: dict[str, bytes] = {}
    try:
        config = validate_document(task.document, task.run_id)
        result = simulate(prepare(config, base_dir=Path(task.base_dir)))
    except StalledError as exc:  # a bug, not a property of the deployment
        record.update(status=FAILED, reason=str(exc))
    except ServesimError as exc:
        record.update(status="infeasible", reason=str(exc))
    else:
        files = dict(sorted(result_files(result).items()))
    record["wall_s"] = round(time.perf_counter() - started, 4)
    files[RUN_RECORD] = (json.dumps(record, indent=2) + "\n").encode()
    return RunFiles(task.run_id, files)


def failed_run(task: RunTask, reason: str) -> RunFiles:
    """The record of a run that could not complete (its worker died): no results, and not
    finished, so the next sweep into the folder tries it again."""
    record = {"run": task.run_id, "point": task.point_id, "replication": task.replication,
              "seed": task.seed, "status": FAILED, "reason": reason, "wall_s": 0.0}
    return RunFiles(task.run_id, {RUN_RECORD: (json.dumps(record, indent=2) + "\n").encode()})


def store_run(run: RunFiles, points_dir: Path) -> Path:
    """Write a run's folder atomically (temp folder, then rename); returns the final folder. A
    full disk is one line naming the run's folder; the temp folder is removed."""
    final = points_dir / run.run_id
    tmp: Path | None = None
    try:
        points_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{run.run_id}-", dir=points_dir))
        for name, data in run.files.items():
            (tmp / name).write_bytes(data)
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
        if final.exists() and not is_finished(final):
            shutil.rmtree(final)  # not ours (never renamed half-written) or a failed run: replace it
        try:
            os.rename(tmp, final)
        except OSError:
            if not is_finished(final):
                raise
            # another process finished the same run first: same inputs, same bytes; keep theirs
    except OSError as exc:
        raise write_error(final, exc) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def run_point(task: RunTask, points_dir: Path) -> Path:
    """Simulate one (point, seed) and write its folder: the whole job of a sweep worker."""
    return store_run(execute_run(task), points_dir)


def is_finished(folder: Path) -> bool:
    """A run folder whose record is whole and not a failure (a failed run is tried again)."""
    try:
        record = json.loads((folder / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("status") != FAILED


def remove_stale_temps(points_dir: Path) -> int:
    """Delete the temp folders of runs that were interrupted before their rename."""
    stale = list(points_dir.glob(f"{TEMP_PREFIX}*")) if points_dir.is_dir() else []
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    return len(stale)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
