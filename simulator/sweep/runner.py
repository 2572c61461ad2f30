"""Running a sweep into a folder, resumably.

``DIR/`` after a sweep::

    sweep.resolved.yaml     the sweep with its base experiment expanded inline, and its points
    points/<run>/           one folder per (point, replication), named by the run's hash
                            (:mod:`servesim.sweep.hashing`): run.json, summary.json,
                            config.resolved.yaml (+ requests/steps/itl parquet for output: full)
    points.parquet          one row per run
    results.parquet         one row per point, replications aggregated (:mod:`.aggregate`)

Resume: a run whose folder exists is finished (folders appear whole, by rename) and is skipped;
temp folders of runs that were interrupted are deleted and those runs redone. Since a run's name
is the hash of everything that decides its result, rerunning an edited sweep into the same folder
reuses exactly the runs that did not change. The tables are rebuilt from the folders every time,
so they never mix in a run of another sweep that shares the folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from servesim.atomic_io import atomic_write, atomic_write_text, make_output_dir
from servesim.sweep.aggregate import tables
from servesim.sweep.backends import Backend, run_tasks
from servesim.sweep.execute import RunFiles, is_finished, remove_stale_temps, store_run
from servesim.sweep.plan import RunTask, SweepPlan, plan_sweep
from servesim.sweep.spec import Sweep, sweep_document

Listener = Callable[[RunFiles], None]


@dataclass
class SweepOutcome:
    plan: SweepPlan
    out_dir: Path
    runs_total: int
    runs_skipped: int
    runs_done: int
    stale_removed: int
    wall_s: float

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

    @property
    def skipped(self) -> int:
        return len(self.plan.runs) - len(self.todo)

    def run(self, backend: Backend = "local", workers: int | None = None, ray_address: str | None = None,
            on_run: Listener | None = None) -> SweepOutcome:
        """Run what is left, storing each run as it finishes, then write the tables."""
        started = time.perf_counter()
        points_dir = self.out_dir / "points"

        def done(run: RunFiles) -> None:
            store_run(run, points_dir)
            if on_run is not None:
                on_run(run)

        run_tasks(self.todo, done, backend, workers, ray_address)
        write_tables(self.plan, self.out_dir)
        return SweepOutcome(self.plan, self.out_dir, len(self.plan.runs), self.skipped, len(self.todo),
                            self.stale_removed, time.perf_counter() - started)


def prepare(sweep: Sweep, out_dir: Path) -> PreparedSweep:
    """Check every point, create ``out_dir``, delete interrupted temp folders, find what is left."""
    plan = plan_sweep(sweep)
    points_dir = out_dir / "points"
    make_output_dir(points_dir, named=out_dir)
    stale = remove_stale_temps(points_dir)
    todo = [task for task in plan.runs if not is_finished(points_dir / task.run_id)]
    atomic_write_text(out_dir / "sweep.resolved.yaml", resolved_yaml(plan))
    return PreparedSweep(plan, out_dir, todo, stale)


def run_sweep(sweep: Sweep, out_dir: Path, backend: Backend = "local", workers: int | None = None,
              ray_address: str | None = None, on_run: Listener | None = None) -> SweepOutcome:
    """Run every unfinished run of ``sweep`` into ``out_dir`` and write the tables (the Python API
    of ``servesim sweep``; with workers > 1 a script needs the ``if __name__ == "__main__":``
    guard, as any multiprocessing code does)."""
    return prepare(sweep, out_dir).run(backend, workers, ray_address, on_run)


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
