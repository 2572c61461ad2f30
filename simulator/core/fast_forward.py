"""Fast-forward: run many identical pure-decode iterations as one SimPy event, exactly.

Between two events that change a replica's batch (an arrival routed to it, a request finishing,
a KV-block shortfall, a policy timer) the same requests decode one token per step, every context
one token longer. The replica asks :func:`plan_decode_run` how many of those steps are certain
before anything could change the batch, prices them all in one NumPy computation
(``CostModel.decode_run_records``: each per-step formula's vectorised twin, beside it, the same
arithmetic element by element, so each row is ``CostModel.step_record``'s record of that step,
bit for bit), and :func:`apply_decode_run` credits them all at once. The clock advances by
one timeout that lands on the very float the step-by-step clock would reach (the same additions,
in the same order), so every timestamp, inter-token gap and step row is the step-by-step one, bit
for bit (``tests/test_fast_forward.py`` holds it).

What is certain, given the batch ``B0`` the policy just scheduled at ``t0`` (pure decodes, nobody
preempted, the policy declared :attr:`~servesim.policies.base.Policy.fast_forwards_decodes`):

- **finishing**: request ``i`` emits its last token in step ``output[i] - generated[i] - 1``;
  the run ends with the first such step (its finish is credited as the step-by-step loop does).
- **KV blocks**: step ``j`` needs the blocks of ``context + j + 1`` tokens per request; a request
  crosses a block boundary at steps ``f_i, f_i + bs, ...``; the run ends before the step whose
  cumulative growth exceeds the free blocks (that step would preempt).
- **arrivals**: every step of the run ends strictly before the next arrival anywhere (a router may
  read this replica's state then), so no event interleaves differently; a deployment's only
  replica may also take the step the arrival falls strictly inside (routing has one answer, and
  the queue it joins is read at that step's end).
- **admission**: the policy tried its waiting queue at ``t0`` and admitted nobody; with the same
  seats, the same budget, fewer free blocks and the same queue, it admits nobody at any later step
  of the run either (that is what a policy promises by declaring the capability); a policy whose
  admission rule itself changes from step to step (SGLang's decaying ``new_token_ratio``) bounds
  the run through ``Policy.run_limit``.

Anything else (host swap, pipelined or disaggregated replicas, policies and engines that do not
declare it) keeps the step-by-step loop.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from servesim.core.state import DONE
from servesim.cost import BatchShape

if TYPE_CHECKING:
    from servesim.core.replica_state import ReplicaState
    from servesim.core.step_log import StepLog
    from servesim.cost import CostModel

SMALL_BATCH = 64
"""Up to this many requests, a run's block offsets are a sorted Python list (fewer calls than
NumPy's on a few elements)."""

MIN_RUN_STEPS = 2
"""Fewer steps than this are not worth a run: the replica takes its ordinary step."""


@dataclass(slots=True)
class DecodeRun:
    """``steps`` pure-decode iterations of ``ids``, from ``times[0]`` to ``times[-1]``."""

    ids: np.ndarray
    context: np.ndarray
    """Each request's cached tokens at the first step."""
    remaining: np.ndarray
    """Each request's output tokens still to emit at the first step (``output - generated``)."""
    part: np.ndarray
    """``context % block_size``: with the first step's slots held, request ``i`` takes
    ``(part[i] + j - 1) // block_size`` more blocks in steps ``1 .. j - 1`` of a ``j``-step run."""
    times: list[float]
    """``steps + 1`` clock values: each step's start, then the run's end (Python floats: the
    clock is a sequential sum, and the gaps are read from it one by one)."""
    records: np.ndarray
    """Each step's :class:`~servesim.cost.StepRecord`, one row per step."""
    used_blocks: list[int] | np.ndarray
    """KV blocks in use during each step (after its growth), as the step log records them."""
    grown: int
    """Blocks the steps after the first take in all."""
    finished_at_end: bool
    steps: int
    """``len(records)`` (read several times per run: a field, not a NumPy call)."""
    last_s: float
    """The last step's duration (``records[-1, 0]``), the replica's guess for its next run."""


def price_steps(cost: CostModel, context: np.ndarray, start: int, count: int) -> np.ndarray:
    """Records of decode steps ``start .. start + count - 1`` of a run over ``context``, one row
    per step (the :class:`~servesim.cost.StepRecord` fields): the cost model's vectorised run
    pricing, each row the record ``step_record`` gives that step, bit for bit
    (``tests/test_cost_runs.py`` holds it on random batches of every kind of deployment); a cost
    model without one is asked step by step."""
    records = cost.decode_run_records(context, count, start)
    if records is None:
        step_record = cost.step_record
        return np.array([step_record(BatchShape.decodes_only(context + j))
                         for j in range(start, start + count)], dtype=np.float64)
    return records


RunLimit = Callable[[int, np.ndarray], int]
"""A policy's own bound on a run (``Policy.run_limit`` of the batch): given the steps certain so
far and the free KV blocks when each step is scheduled, how many of them it promises."""

FIRST_GUESS_STEPS = 32
"""Steps priced at first when the replica has no decode step time yet to guess the run from."""


def plan_decode_run(state: ReplicaState, cost: CostModel, context: np.ndarray, ids: np.ndarray,
                    now: float, next_arrival_s: float, through_arrival: bool = False,
                    policy_limit: RunLimit | None = None, guess_s: float | None = None
                    ) -> tuple[DecodeRun | None, np.ndarray | None]:
    """The run of pure-decode steps that starts with the batch ``ids`` (contexts ``context``)
    scheduled at ``now``, or None when fewer than :data:`MIN_RUN_STEPS` are certain; with it, the
    first step's record (a row of :func:`price_steps`) when it was priced, so that a replica that
    gets no run takes that step without pricing it again. Called after the policy has grown the
    first step's blocks.

    ``through_arrival``: nothing reads this replica's state when a request arrives (it is the
    deployment's only replica, so routing has one answer), so the run may include the step during
    which the next request arrives (strictly inside it): the arrival only joins the waiting queue,
    which the replica reads at the step's end, as step by step. ``policy_limit``: the policy's own
    bound (a decision that may change within the run, such as SGLang's admission as its
    ``new_token_ratio`` decays). ``guess_s``: a recent decode step's duration on this replica, to
    guess how many steps to price before the arrival (only a guess: the run is exact whatever it
    is, priced in more or larger batches)."""
    r, pool = state.requests, state.pool
    n = int(ids.size)
    remaining = r.output[ids] - r.generated[ids]
    # the step it finishes in is the last (Python's min of a few: fewer calls than NumPy's)
    finishing = min(remaining.tolist()) if n <= 64 else int(remaining.min())
    if finishing < MIN_RUN_STEPS:
        return None, None
    fit = math.inf if not guess_s else (next_arrival_s - now) / guess_s
    if not through_arrival and fit < 1.0:
        return None, None  # the next arrival most likely falls inside the first step
    bs = pool.block_size
    whole, part = np.divmod(context, bs)  # blocks_for(context, bs, plus=1) is whole + 1
    if np.count_nonzero(pool.held[ids] - whole - 1):  # (count_nonzero: a fraction of .all()'s cost)
        return None, None  # a request holds more than its slots: the policies' growth rules differ
    # Block-boundary crossings: request i grows at steps f_i, f_i + bs, ... (f_i in [1, bs]); the
    # (free + 1)-th crossing is the first step that would preempt. (A few as a sorted Python
    # list, bisected below: fewer calls than NumPy's sort and searchsorted.)
    offsets: list[int] | np.ndarray = sorted((bs - part).tolist()) if n <= SMALL_BATCH else np.sort(bs - part)
    q, rest = divmod(pool.free, n)
    limit = min(finishing, int(offsets[rest]) + q * bs)
    if limit < MIN_RUN_STEPS:
        return None, None
    if policy_limit is not None:
        grown_by = grown_in(np.asarray(offsets, dtype=np.int64), bs, limit)
        free_before = np.empty(limit, dtype=np.int64)  # when step j >= 1 is scheduled
        free_before[0] = pool.free
        free_before[1:] = pool.free - grown_by[:-1]
        limit = min(limit, policy_limit(limit, free_before))
        if limit < MIN_RUN_STEPS:
            return None, None
    # Price the steps in growing batches (an arrival may cut the run short); the clock is the
    # step-by-step clock: start + each duration in turn, summed sequentially (np.add.accumulate
    # over [start, d0, d1, ...] is that loop, not a pairwise sum). Decode steps lengthen as
    # contexts grow, so a little over (distance to the arrival / a recent step) steps end before
    # it; a wrong guess costs another batch or a few steps priced for nothing, never exactness.
    if guess_s is None:
        count = min(limit, FIRST_GUESS_STEPS)
    else:
        count = limit if fit >= limit else min(limit, int(fit * 1.125) + 2)
    start, t = 0, now
    priced: list[np.ndarray] = []
    times = [now]  # each step's start, then the run's end: the clock, summed in Python floats
    first_row: np.ndarray | None = None
    last_s = 0.0
    while True:
        rows = price_steps(cost, context, start, count - start)
        if first_row is None:
            first_row = rows[0]
        inside, arrived = 0, False
        durations = rows[:, 0].tolist()
        for duration in durations:
            end = t + duration
            if end >= next_arrival_s:  # this step ends at or after the arrival
                arrived = True
                if through_arrival and end > next_arrival_s:  # and the arrival falls inside it
                    times.append(end)
                    inside += 1
                break
            times.append(end)
            t = end
            inside += 1
        if inside:
            priced.append(rows if inside == len(durations) else rows[:inside])
            last_s = durations[inside - 1]
        if arrived or count == limit:
            break
        start, count = count, min(2 * count, limit)
    steps = len(times) - 1
    if steps < MIN_RUN_STEPS:
        return None, first_row
    records = priced[0] if len(priced) == 1 else np.concatenate(priced)
    in_use = pool.total - pool.free
    if isinstance(offsets, list) and steps <= bs:  # nobody grows twice: bisect the few offsets
        used: list[int] | np.ndarray = [in_use + bisect_right(offsets, j) for j in range(steps)]
        grown = used[-1] - in_use
    else:
        grown_by = grown_in(np.asarray(offsets, dtype=np.int64), bs, steps)
        used, grown = in_use + grown_by, int(grown_by[steps - 1])
    return DecodeRun(ids, context, remaining, part, times, records, used, grown,
                     finished_at_end=steps == finishing, steps=steps, last_s=last_s), first_row


_STEPS = np.arange(4096, dtype=np.int64)
"""0, 1, 2, ...: a slice of it is the step numbers of a short run, without an ``arange`` call."""


def grown_in(offsets: np.ndarray, block_size: int, steps: int) -> np.ndarray:
    """Blocks the requests take in steps ``1 .. j`` of a run, for each ``j < steps``: request ``i``
    grows at steps ``f_i, f_i + block_size, ...`` (``offsets``: the sorted ``f_i``, each in
    ``[1, block_size]``)."""
    if steps <= block_size and steps <= _STEPS.size:
        # No request grows twice: js // block_size is 0 and js % block_size is js.
        return np.searchsorted(offsets, _STEPS[:steps], side="right")
    js = np.arange(steps, dtype=np.int64)
    return offsets.size * (js // block_size) + np.searchsorted(offsets, js % block_size, side="right")


def apply_decode_run(state: ReplicaState, run: DecodeRun, steps_log: StepLog, waiting: int,
                     preempted: int) -> np.ndarray:
    """Credit ``run`` to its requests, the KV pool and the step log, as its steps one by one
    would, and drop the requests that finished in its last step from ``running`` (freeing their
    blocks, as ``ReplicaState.drop_finished`` after a step); returns those requests."""
    r, pool = state.requests, state.pool
    ids, steps, times = run.ids, run.steps, run.times
    n = int(ids.size)
    # The step log: one row per step, as the step-by-step loop appends them.
    steps_log.extend_decode_run(state.index, times[:-1], n, run.used_blocks, waiting, preempted,
                                run.records)
    # KV blocks: the steps after the first grow every request to its slots' blocks (it held
    # ``context // block_size + 1`` when planned: blocks_for(context + steps) minus those).
    if run.grown:
        pool.grow_many(ids, (run.part + (steps - 1)) // pool.block_size, run.grown)
    # Tokens: every request computes and emits one per step.
    r.computed[ids] += steps
    r.generated[ids] += steps
    second = times[1]
    later = [after - before for before, after in pairwise(times[1:])]  # each step-by-step gap
    last = r.last_token[ids]
    listed = last.tolist()
    if listed.count(listed[0]) == n:
        # Every request emitted its last token at the same time (a run after a run, or after
        # an ordinary step of the same batch): one first gap for all, as ItlLog.add stores equal
        # gaps (one pair), and fmax(fmax(m, gap), longest) is fmax(m, max(gap, longest)).
        gap = second - listed[0]
        r.itl.add_runs([gap, *later], n, times[1:])
        r.max_itl[ids] = np.fmax(r.max_itl[ids], max(gap, max(later)))
    else:
        first_gaps = second - last
        r.itl.add(first_gaps, second)
        r.itl.add_runs(later, n, times[2:])
        r.max_itl[ids] = np.fmax(np.fmax(r.max_itl[ids], first_gaps), max(later))
    end = times[-1]
    r.last_token[ids] = end
    if not run.finished_at_end:
        return ids[:0]
    done = run.remaining <= steps  # generated >= output; the run ends at the first
    finished = ids[done]
    r.finish[finished] = end
    r.status[finished] = DONE
    for listen in r.done_listeners:  # as RequestState._emit tells them
        listen(finished, end)
    state.drop_done(ids, done)
    return finished


def delay_to(now: float, end: float) -> float | None:
    """A timeout delay that lands the clock (``now + delay``) exactly on ``end``, or None if no
    float does (the run then falls back to steps)."""
    delay = end - now
    for _ in range(4):
        landed = now + delay
        if landed == end:
            return delay
        delay = math.nextafter(delay, math.inf if landed < end else -math.inf)
    return None
