"""Where a sweep's runs execute: a local process pool (default) or a Ray cluster.

Both call the same :func:`~servesim.sweep.execute.execute_run` on each task and hand every
finished run to ``on_done`` in the driver process, which stores it (so the sweep folder needs to be
on the driver's disk only, and a Ray cluster needs no shared filesystem). Results do not depend on
the backend or the number of workers: a run's output is a pure function of its task.

The local pool (:mod:`servesim.sweep.local_pool`) survives a worker's death: the run it held is
retried once, then recorded as failed with the reason, and the others carry on; Ray retries a task
whose worker died once, then the run is recorded the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Literal

from servesim.errors import ServesimError, at_least_one
from servesim.sweep.execute import RunFiles, execute_run, failed_run
from servesim.sweep.local_pool import WorkerPool
from servesim.sweep.plan import RunTask

Backend = Literal["local", "ray"]
OnDone = Callable[[RunFiles], None]


def default_workers() -> int:
    return os.cpu_count() or 1


def run_tasks(tasks: Sequence[RunTask], on_done: OnDone, backend: Backend = "local",
              workers: int | None = None, ray_address: str | None = None,
              deaths: list[str] | None = None) -> None:
    at_least_one("--workers", workers)
    check_backend(backend)
    if backend == "local":
        run_local(tasks, on_done, workers or default_workers(), deaths)
    else:
        run_ray(tasks, on_done, workers, ray_address)


def run_local(tasks: Sequence[RunTask], on_done: OnDone, workers: int,
              deaths: list[str] | None = None) -> None:
    """In this process for one worker (no start-up cost), else ``workers`` worker processes that
    survive a worker's death (:mod:`servesim.sweep.local_pool`); ``deaths`` collects one line per
    worker that died."""
    if not tasks:
        return
    if workers == 1 or len(tasks) == 1:
        for task in tasks:
            on_done(execute_run(task))
        return
    pool = WorkerPool(min(workers, len(tasks)))
    try:
        pool.run(tasks, on_done)
    finally:
        if deaths is not None:
            deaths.extend(pool.deaths)


def import_ray():
    """The ``ray`` module, or a one-line error saying how to install it. (A folder named ``ray``
    on the path, such as Ray's own ``/tmp/ray`` when run from /tmp, imports as an empty namespace
    package: that is not Ray either.)"""
    try:
        import ray
    except ImportError:
        ray = None
    if getattr(ray, "remote", None) is None:
        raise ServesimError("--backend ray", "ray is not installed",
                            "pip install 'ray>=2.9' (or pip install -e '.[ray]' in the servesim checkout; "
                            "servesim is not on PyPI), or use --backend local")
    return ray


def check_backend(backend: str) -> Backend:
    """Fail before planning a sweep, not after, on a backend that cannot run; returns the name
    as a :data:`Backend`."""
    if backend == "local":
        return "local"
    if backend == "ray":
        import_ray()
        return "ray"
    raise ServesimError("--backend", f"unknown backend {backend!r}", "use local or ray")


def run_ray(tasks: Sequence[RunTask], on_done: OnDone, workers: int | None, address: str | None) -> None:
    """Each run is one Ray task (1 CPU). Without ``address`` a local Ray instance with ``workers``
    CPUs (default: all) is started and shut down; with one (``auto``, ``ray://host:10001``), the
    cluster's CPUs are used and every node needs servesim installed."""
    ray = import_ray()
    import ray.exceptions as ray_errors
    started = False
    if not ray.is_initialized():
        options = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
        if address:
            ray.init(address=address, **options)
        else:
            ray.init(num_cpus=workers or default_workers(), **options)
        started = True
    # Ray retries a task whose worker died once (max_retries); a second death is a failed run.
    remote = ray.remote(num_cpus=1, max_retries=1)(execute_run)
    by_ref = {remote.remote(task): task for task in tasks}
    pending = list(by_ref)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    files = ray.get(ref)
                except ray_errors.RayTaskError:
                    raise  # a bug inside the run: shown, as in a local worker
                except ray_errors.RayError as exc:  # its worker or node died (killed, OOM)
                    reason = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                    files = failed_run(by_ref[ref], f"its Ray worker died twice ({reason})")
                on_done(files)
    finally:
        for ref in pending:
            ray.cancel(ref)
        if started:
            ray.shutdown()
