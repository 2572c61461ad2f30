"""The local backend's worker processes, built to survive a worker's death.

A ``concurrent.futures.ProcessPoolExecutor`` treats one dead worker (killed, out of memory) as a
broken pool: every run in flight fails with ``BrokenProcessPool`` and the sweep stops. Here each
worker is a process with its own pipe, so the driver always knows which run a worker holds: when
a worker dies, only that run is affected. It is retried once on a fresh worker (a kill or an
out-of-memory episode is often transient); if its worker dies again, the run is recorded as
``failed`` with the reason (the signal or exit code), and the sweep carries on. A failed run is
not "finished": the next, resumed, sweep tries it again.

Workers ignore Ctrl-C (the driver handles it and stops them), start with the ``spawn`` method
(the driver runs a progress-bar thread, and forking a threaded process is unsafe), and leave by
themselves when the driver is gone (:func:`exit_with_parent`), so a killed sweep leaves no
orphans.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from servesim.sweep.execute import RunFiles, execute_run, failed_run
from servesim.sweep.plan import RunTask

OnDone = Callable[[RunFiles], None]
Execute = Callable[[RunTask], RunFiles]
ATTEMPTS = 2
"""A run whose worker dies is tried this many times in all before it is recorded as failed."""


def exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """Leave when the sweep's process is gone. A killed driver (SIGTERM, SIGKILL, a closed
    terminal) otherwise leaves its idle workers blocked on their pipes forever; its unfinished
    runs are simply redone by the next, resumed, sweep."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _serve(conn: Connection, parent: int, execute: Execute) -> None:
    """A worker: run each task received, send back its files (or the exception it raised)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(parent)
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            reply: tuple[str, Any] = ("ok", execute(task))
        except Exception as exc:  # a bug in a run: the driver re-raises it
            reply = ("error", exc)
        conn.send(reply)


def death_reason(exitcode: int | None) -> str:
    """How a worker ended, in words (``-9``: killed by SIGKILL, as the kernel's OOM killer does)."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (killed, e.g. by the out-of-memory killer)" if -exitcode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {exitcode}"


@dataclass
class _Worker:
    process: Any
    conn: Connection
    task: RunTask | None = None


class WorkerPool:
    """``workers`` processes running :func:`execute_run` (or ``execute``) on tasks."""

    def __init__(self, workers: int, execute: Execute = execute_run) -> None:
        self.size = workers
        self.execute = execute
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[_Worker] = []
        self.deaths: list[str] = []
        """One line per worker death: which run, how it died, whether it was retried."""

    def _start(self) -> _Worker:
        driver, child = self.context.Pipe()
        process = self.context.Process(target=_serve, args=(child, os.getpid(), self.execute), daemon=True)
        process.start()
        child.close()
        worker = _Worker(process, driver)
        self.workers.append(worker)
        return worker

    def run(self, tasks: Sequence[RunTask], on_done: OnDone) -> None:
        queue = deque(tasks)
        attempts: dict[str, int] = {}
        try:
            while queue or any(w.task is not None for w in self.workers):
                self._assign(queue)
                busy = [w for w in self.workers if w.task is not None]
                ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
                for worker in busy:
                    if worker.conn in ready or worker.process.sentinel in ready:
                        self._collect(worker, queue, attempts, on_done)
        finally:
            self.close()

    def _assign(self, queue: deque[RunTask]) -> None:
        for worker in self.workers:
            if worker.task is None and queue:
                worker.task = queue.popleft()
                worker.conn.send(worker.task)
        while queue and len(self.workers) < self.size:
            worker = self._start()
            worker.task = queue.popleft()
            worker.conn.send(worker.task)

    def _collect(self, worker: _Worker, queue: deque[RunTask], attempts: dict[str, int],
                 on_done: OnDone) -> None:
        task = worker.task
        assert task is not None
        try:
            if worker.conn.poll():
                kind, value = worker.conn.recv()
                worker.task = None
                if kind == "error":
                    raise value
                on_done(value)
                return
        except (EOFError, OSError):
            pass  # it died while sending: a death like any other
        worker.process.join(timeout=5)
        reason = death_reason(worker.process.exitcode)
        self.workers.remove(worker)
        worker.conn.close()
        tried = attempts[task.run_id] = attempts.get(task.run_id, 0) + 1
        if tried < ATTEMPTS:
            self.deaths.append(f"run {task.run_id}: worker {reason}; retried")
            queue.appendleft(task)
        else:
            self.deaths.append(f"run {task.run_id}: worker {reason} again; recorded as failed")
            on_done(failed_run(task, f"its worker process died {tried} times ({reason})"))

    def close(self) -> None:
        """Stop every worker (at once: queued work is dropped, as on Ctrl-C or an error)."""
        for worker in self.workers:
            if worker.process.is_alive():
                worker.process.kill()
        for worker in self.workers:
            worker.process.join(timeout=5)
            worker.conn.close()
        self.workers.clear()
