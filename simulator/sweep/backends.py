"""Where a sweep's runs execute: a local process pool (default) or a Ray cluster.

Both call the same :func:`~servesim.sweep.execute.execute_run` on each task and hand every
finished run to ``on_done`` in the driver process, which stores it (so the sweep folder needs to be
on the driver's disk only, and a Ray cluster needs no shared filesystem). Results do not depend on
the backend or the number of workers: a run's output is a pure function of its task.

The local pool uses the ``spawn`` start method: the driver runs a progress-bar thread, and forking
a process that has threads is unsafe (and no longer Python's default on Linux from 3.14).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Literal

from servesim.errors import ServesimError
from servesim.sweep.execute import RunFiles, execute_run
from servesim.sweep.plan import RunTask

Backend = Literal["local", "ray"]
OnDone = Callable[[RunFiles], None]


def default_workers() -> int:
    return os.cpu_count() or 1


def run_tasks(tasks: Sequence[RunTask], on_done: OnDone, backend: Backend = "local",
              workers: int | None = None, ray_address: str | None = None) -> None:
    if workers is not None and workers < 1:
        raise ServesimError("--workers", f"must be at least 1 (got {workers})", "give a positive count")
    check_backend(backend)
    if backend == "local":
        run_local(tasks, on_done, workers or default_workers())
    else:
        run_ray(tasks, on_done, workers, ray_address)


def run_local(tasks: Sequence[RunTask], on_done: OnDone, workers: int) -> None:
    """In this process for one worker (no start-up cost), else a pool of ``workers`` processes."""
    if not tasks:
        return
    if workers == 1 or len(tasks) == 1:
        for task in tasks:
            on_done(execute_run(task))
        return
    pool = ProcessPoolExecutor(max_workers=min(workers, len(tasks)),
                               mp_context=multiprocessing.get_context("spawn"),
                               initializer=exit_with_parent, initargs=(os.getpid(),))
    try:
        pending = {pool.submit(execute_run, task) for task in tasks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                on_done(future.result())
    finally:
        # On an error or Ctrl-C: drop queued runs instead of finishing them all before exiting.
        pool.shutdown(wait=True, cancel_futures=True)


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


def exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """Pool worker initializer: leave when the sweep's process is gone. A killed driver (SIGTERM,
    SIGKILL, a closed terminal) otherwise leaves its idle workers blocked on the task queue
    forever; its unfinished runs are simply redone by the next, resumed, sweep."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def run_ray(tasks: Sequence[RunTask], on_done: OnDone, workers: int | None, address: str | None) -> None:
    """Each run is one Ray task (1 CPU). Without ``address`` a local Ray instance with ``workers``
    CPUs (default: all) is started and shut down; with one (``auto``, ``ray://host:10001``), the
    cluster's CPUs are used and every node needs servesim installed."""
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        options = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
        if address:
            ray.init(address=address, **options)
        else:
            ray.init(num_cpus=workers or default_workers(), **options)
        started = True
    remote = ray.remote(num_cpus=1)(execute_run)
    pending = [remote.remote(task) for task in tasks]
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                on_done(ray.get(ref))
    finally:
        for ref in pending:
            ray.cancel(ref)
        if started:
            ray.shutdown()
