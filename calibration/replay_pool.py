"""Replaying many serving-file rows: one job per row, in order, in worker processes, with progress.

A whole-file ``validate-serving`` replays some 1,800 rows and ``fit-serving`` many more
simulations; each takes 20-40 minutes on two cores. :func:`replay_map` runs the jobs (in this
process with one worker, else in a process pool, results in job order) and tells the progress
hook set by :func:`reporting` after each one, so the CLI can show how far a long replay has got
instead of sitting silent; a library caller that sets no hook pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")

Progress = Callable[[str, int, int], None]
"""``(stage, jobs done, jobs in the stage)``, told after each job of a replay."""

_progress: Progress | None = None


@contextmanager
def reporting(progress: Progress | None) -> Iterator[None]:
    """Tell ``progress`` about every :func:`replay_map` inside the block (None: nobody)."""
    global _progress
    previous, _progress = _progress, progress
    try:
        yield
    finally:
        _progress = previous


def replay_map(function: Callable[[Job], Result], jobs: Sequence[Job], workers: int = 1,
               stage: str = "replaying rows") -> list[Result]:
    """``function`` of every job, in job order: in this process with one worker (or one job),
    else in ``workers`` processes (one job at a time each: rows differ in cost by orders of
    magnitude)."""
    hook = _progress
    results: list[Result] = []
    pool: ProcessPoolExecutor | None = None
    outcomes: Any
    if workers <= 1 or len(jobs) <= 1:
        outcomes = map(function, jobs)
    else:
        pool = ProcessPoolExecutor(workers)
        outcomes = pool.map(function, jobs, chunksize=1)
    try:
        for result in outcomes:
            results.append(result)
            if hook is not None:
                hook(stage, len(results), len(jobs))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return results
