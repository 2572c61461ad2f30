"""The engine's guard against a run that can make no more progress.

A bug that stops progress (a KV block leaked on every release until admission can never fit, a
policy that never schedules what is waiting) used to end a run silently with requests left
queued, or, with a policy that keeps setting wake-up timers, spin the clock forever and hang
the caller (and the test suite). Both are caught without touching the per-step path:

- when the clock has nothing left to do but requests are still waiting or running, the run
  stops with :class:`StalledError` naming the replica and its state (queue, running, free KV
  blocks) instead of reporting a result;
- an idle replica woken by its policy's timer :data:`MAX_IDLE_WAKES` times in a row while no
  step ran anywhere is stalled too (counted only on the idle path).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from servesim.core.replica_state import ReplicaState
from servesim.core.state import DONE, REJECTED, RequestState
from servesim.errors import ServesimError

MAX_IDLE_WAKES = 100_000
"""Consecutive timer wake-ups of one idle replica, with no step anywhere, that mean a livelock."""


class StalledError(ServesimError):
    """The simulation can make no more progress: a bug in a policy or the engine, not a result."""


def describe(state: ReplicaState) -> str:
    """A replica's state in a few numbers: what waits, what runs, what the KV pool has left."""
    pool = state.pool
    text = (f"replica {state.index}: {state.queued} waiting, {int(state.running.size)} running, "
            f"{pool.free} of {pool.total} KV blocks free")
    if state.waiting:
        head = state.waiting[0]
        new, need = state.prefill_need(head)
        text += f"; the head of its queue (request {head}) needs {new} tokens and {need} blocks"
    return text


def stalled(now: float, where: str, why: str) -> StalledError:
    return StalledError("engine", f"stalled at t={now:.6g} s: {where}, and {why}",
                        "this is a bug in the scheduling policy or the engine (a run that can never "
                        "finish); report it with the experiment file")


def check_finished(requests: RequestState, states: Iterable[ReplicaState], now: float) -> None:
    """After the clock ran out of events: every request must be done or rejected (and no event
    counter wrapped, :meth:`RequestState.check_counters`)."""
    requests.check_counters()
    status = requests.status
    left = int(np.count_nonzero((status != DONE) & (status != REJECTED)))
    if not left:
        return
    stuck = [s for s in states if s.queued or s.running.size]
    where = describe(stuck[0]) if stuck else f"{left} requests are in transit between replicas"
    raise stalled(now, where, f"{left} requests can never finish (no event is left to run)")
