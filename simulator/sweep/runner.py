"""Running a sweep into a folder, resumably.

``DIR/`` after a sweep::

    sweep.resolved.yaml     the sweep with its base experiment expanded inline, and its points
    points/<run>/           one folder per (point, replication), named by the run's hash
                            (:mod:`servesim.sweep.hashing`): run.json, summary.json,
                            config.resolved.yaml (+ requests/steps/itl parquet for output: full)
    points.parquet          one row per run
    results.parquet         one row per point, replications aggregated (:mod:`.aggregate`)

One sweep at a time per folder, and one sweep per folder (:mod:`.lock`): a second sweep into a
busy folder, or a different sweep into a folder that holds one, is refused (``--force`` replaces
it). A run whose worker died twice is recorded as ``failed`` and tried again on resume.

Resume: a run whose folder exists is finished (folders appear whole, by rename) and is skipped;
temp folders of runs that were interrupted are deleted and those runs redone. Since a run's name
is the hash of everything that decides its result, rerunning an edited sweep into the same folder
reuses exactly the runs that did not change. The tables are rebuilt from the folders every time,
so they never mix in a run of another sweep that shares the folder.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from servesim.atomic_io import atomic_write, atomic_write_text, make_output_dir
from servesim.errors import ServesimError
from servesim.inputs.files import read_yaml
from servesim.sweep.aggregate import tables
from servesim.sweep.backends import Backend, run_tasks
from servesim.sweep.execute import FAILED, TEMP_PREFIX, RunFiles, is_finished, remove_stale_temps, store_run
from servesim.sweep.lock import SweepLock, sweep_difference
from servesim.sweep.plan import RunTask, SweepPlan, plan_sweep
from servesim.sweep.spec import Sweep, sweep_document

Listener = Callable[[RunFiles], None]
RESOLVED_FILE = "sweep.resolved.yaml"


@dataclass
class SweepOutcome:
    plan: SweepPlan
    out_dir: Path
    runs_total: int
    runs_skipped: int
    runs_done: int
    stale_removed: int
    wall_s: float
    failures: list[tuple[str, str]] = field(default_factory=list)
    """(run, reason) of each run that failed (its worker died twice); retried by the next sweep."""
    deaths: list[str] = field(default_factory=list)
    """One line per worker that died during this sweep."""

    @property
    def results_path(self) -> Path:
        return self.out_dir / "results.parquet"


@dataclass
class PreparedSweep:
    """A planned sweep whose folder exists: what is finished, what is left."""

    plan: SweepPlan
    out_dir: Path
    todo: list[RunTask]
    stale_removed: int
    lock: SweepLock | None = None
    """Held from :func:`prepare` until :meth:`run` ends (or the process does)."""

    @property
    def skipped(self) -> int:
        return len(self.plan.runs) - len(self.todo)

    def run(self, backend: Backend = "local", workers: int | None = None, ray_address: str | None = None,
            on_run: Listener | None = None) -> SweepOutcome:
        """Run what is left, storing each run as it finishes, then write the tables."""
        started = time.perf_counter()
        points_dir = self.out_dir / "points"
        failures: list[tuple[str, str]] = []
        deaths: list[str] = []

        def done(run: RunFiles) -> None:
            store_run(run, points_dir)
            record = run.record
            if record.get("status") == FAILED:
                failures.append((run.run_id, str(record.get("reason", ""))))
            if on_run is not None:
                on_run(run)

        try:
            run_tasks(self.todo, done, backend, workers, ray_address, deaths)
            write_tables(self.plan, self.out_dir)
        finally:
            self.release()
        return SweepOutcome(self.plan, self.out_dir, len(self.plan.runs), self.skipped, len(self.todo),
                            self.stale_removed, time.perf_counter() - started, failures, deaths)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def prepare(sweep: Sweep, out_dir: Path, force: bool = False) -> PreparedSweep:
    """Check every point, create and lock ``out_dir``, refuse it if it holds another sweep (unless
    ``force``), delete interrupted temp folders, find what is left."""
    plan = plan_sweep(sweep)
    points_dir = out_dir / "points"
    make_output_dir(points_dir, named=out_dir)
    lock = SweepLock.acquire(out_dir)
    try:
        resolved = resolved_yaml(plan)
        _claim(out_dir, plan, force)
        stale = remove_stale_temps(points_dir)
        todo = [task for task in plan.runs if not is_finished(points_dir / task.run_id)]
        atomic_write_text(out_dir / RESOLVED_FILE, resolved)
    except BaseException:
        lock.release()
        raise
    return PreparedSweep(plan, out_dir, todo, stale, lock)


def _claim(out_dir: Path, plan: SweepPlan, force: bool) -> None:
    """Refuse a folder that holds another sweep; with ``force``, drop that sweep's runs this one
    does not share."""
    held_file = out_dir / RESOLVED_FILE
    points_dir = out_dir / "points"
    runs = [p for p in points_dir.iterdir() if not p.name.startswith(TEMP_PREFIX)]
    if held_file.is_file():
        try:
            held = read_yaml(held_file, "--out")
        except ServesimError:
            held = None
        difference = sweep_difference(held, sweep_document(plan.sweep))
    else:
        difference = f"it holds {len(runs)} runs of an unknown sweep" if runs else ""
    if not difference:
        return
    if not force:
        raise ServesimError("--out", f"{out_dir} holds another sweep: {difference}",
                            "run into a new --out folder, or add --force to replace it (the runs both "
                            "share are kept)")
    keep = {task.run_id for task in plan.runs}
    for folder in runs:
        if folder.name not in keep:
            shutil.rmtree(folder, ignore_errors=True)


def run_sweep(sweep: Sweep, out_dir: Path, backend: Backend = "local", workers: int | None = None,
              ray_address: str | None = None, on_run: Listener | None = None,
              force: bool = False) -> SweepOutcome:
    """Run every unfinished run of ``sweep`` into ``out_dir`` and write the tables (the Python API
    of ``servesim sweep``; with workers > 1 a script needs the ``if __name__ == "__main__":``
    guard, as any multiprocessing code does)."""
    return prepare(sweep, out_dir, force).run(backend, workers, ray_address, on_run)


def write_tables(plan: SweepPlan, out_dir: Path) -> None:
    runs, results = tables(plan, out_dir / "points")
    atomic_write(out_dir / "points.parquet", lambda tmp: runs.to_parquet(tmp, index=False))
    atomic_write(out_dir / "results.parquet", lambda tmp: results.to_parquet(tmp, index=False))


def resolved_yaml(plan: SweepPlan) -> str:
    document = sweep_document(plan.sweep)
    document["points"] = [
        {"point": p.point_id, "values": p.values, "status": p.status,
         **({"reason": p.reason} if p.reason else {}),
         "runs": [{"run": r.run_id, "seed": r.seed} for r in p.runs]}
        for p in plan.points]
    return yaml.safe_dump(document, sort_keys=False)
