"""One replica's iteration loop: the only SimPy process that advances per step.

``schedule -> price -> one timeout -> credit``: the policy forms the batch, the cost model
prices it, the clock advances by one SimPy event, and the step is credited to its requests. An
idle replica waits on an event that the next arrival (or a policy's timer) triggers, so an empty
system costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Protocol

import numpy as np
import simpy

from servesim.core.fast_forward import apply_decode_run, delay_to, plan_decode_run, price_steps
from servesim.core.progress import MAX_IDLE_WAKES, describe, stalled
from servesim.core.replica_state import ReplicaState
from servesim.core.step_log import StepLog
from servesim.cost import BatchShape, CostModel, StepRecord

if TYPE_CHECKING:  # policies are given to replicas; the core never imports them at run time
    from servesim.policies.base import Policy

PromptsDone = Callable[[np.ndarray, float], None]
"""A prefill-only replica's exit: called with the requests whose prompt KV is complete and the
time (the disaggregated topology sends them to a decode replica)."""


class ServingUnit(Protocol):
    """What routers and topologies use of a scheduling unit: a :class:`Replica`, or one virtual
    engine's DP rank of a pipelined replica (:class:`~servesim.core.parallel_replica.RankHandle`)."""

    state: ReplicaState
    prompts_done: PromptsDone | None

    def accept(self, request: int) -> None: ...

    def wake(self) -> None: ...


class StepPricer(Protocol):
    """What a replica asks of its cost model: one step's record (a :class:`CostModel`, or a
    :class:`~servesim.cost.speculative.SpeculativeCost` that adds a proposer's passes)."""

    def step_record(self, batch: BatchShape) -> StepRecord: ...


class Replica:
    def __init__(self, env: simpy.Environment, state: ReplicaState, policy: Policy,
                 cost: CostModel | StepPricer, steps: StepLog, prompts_done: PromptsDone | None = None,
                 next_arrival: Callable[[], float] | None = None, sole_replica: bool = False) -> None:
        """``prompts_done`` makes this a prefill-only replica: a request whose prompt is computed
        emits nothing here and goes to ``prompts_done`` instead. ``next_arrival`` (when the next
        request enters the deployment) turns fast-forward on: runs of pure-decode steps become one
        event (``servesim.core.fast_forward``); its caller checked that the topology, engine and
        policy declare it. ``sole_replica``: the deployment has no other replica, so its runs may
        go through an arrival (``plan_decode_run``'s ``through_arrival``). A replica that speculates
        (``state.speculation``, priced by a :class:`StepPricer` that adds the proposer's passes)
        runs step by step whatever ``next_arrival`` says: its accepted tokens are drawn per step."""
        self.env = env
        self.state = state
        self.policy = policy
        self.cost = cost
        self.steps = steps
        self.prompts_done = prompts_done
        plain_pool = state.swap is None  # prefix caches are fine: decodes grow past the hashed prompt
        plain_cost = cost if isinstance(cost, CostModel) and state.speculation is None else None
        self.run_cost = plain_cost if prompts_done is None and plain_pool else None
        """The cost model that prices fast-forwarded runs (None: this replica never fast-forwards)."""
        self.next_arrival = next_arrival if self.run_cost is not None else None
        self.sole_replica = sole_replica
        self.fast_forwarded_steps = 0
        """Steps credited in fast-forwarded runs (the rest were taken one by one)."""
        self._idle: simpy.Event | None = None
        self.process = env.process(self._run())

    def accept(self, request: int) -> None:
        """An arrival routed here: queue it (or reject it) and wake the loop if idle."""
        if self.state.enqueue(request):
            self.wake()

    def wake(self) -> None:
        """New work or freed blocks: an idle loop asks its policy again."""
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _run(self) -> Generator[simpy.Event, object, None]:
        env, state, policy, steps = self.env, self.state, self.policy, self.steps
        requests, pool = state.requests, state.pool
        step_record, append, index = self.cost.step_record, steps.append, state.index
        prompts_done, next_arrival = self.prompts_done, self.next_arrival
        idle_wakes, steps_seen = 0, -1  # the livelock guard: counted on the idle path only
        decode_guess_s: float | None = None  # a recent decode step's duration: sizes run pricing
        while True:
            now = env.now
            batch = policy.schedule(now)
            if batch is None:
                self._idle = idle = env.event()
                wake = policy.wake_at(now)
                if wake is None:
                    yield idle
                else:
                    yield idle | env.timeout(max(0.0, wake - now))
                    if not idle.triggered:  # woken by its own timer, not by new work
                        idle_wakes = idle_wakes + 1 if len(steps) == steps_seen else 1
                        steps_seen = len(steps)
                        if idle_wakes > MAX_IDLE_WAKES:
                            raise stalled(env.now, describe(state), f"its policy woke it {MAX_IDLE_WAKES:,} "
                                          "times in a row without scheduling anything")
                self._idle = None
                continue
            shape = batch.shape
            record = None
            extra = batch.extra_s  # time beyond the priced model pass (KV swap copies)
            if next_arrival is not None and batch.decode_only and not batch.preempted and not extra \
                    and batch.speculation is None and state.swap is None:
                assert self.run_cost is not None  # set with next_arrival
                run, first = plan_decode_run(state, self.run_cost, shape.decode_context, batch.ids, now,
                                             next_arrival(), self.sole_replica, policy.run_limit(batch),
                                             decode_guess_s)
                delay = None if run is None else delay_to(now, run.times[-1])
                if run is not None and delay is not None:
                    waiting = len(state.waiting)
                    yield env.timeout(delay)
                    finished = apply_decode_run(state, run, steps, waiting, batch.preempted)
                    if finished.size:
                        state.drop_finished()
                    policy.after_run(batch, run.steps, finished, env.now)
                    self.fast_forwarded_steps += run.steps
                    decode_guess_s = float(run.records[-1, 0])
                    continue
                if first is None:  # no run was priced: the run pricer prices this one step (its memo)
                    first = price_steps(self.run_cost, shape.decode_context, 0, 1)[0]
                values = first.tolist()  # step_record's record of this step, bit for bit
                values[1] = int(values[1])
                record = StepRecord(*values)
                decode_guess_s = record.time_s
            if record is None:
                record = step_record(shape)
            if extra:
                record = record._replace(time_s=record.time_s + extra)
            proposals = batch.speculation
            append(index, now, shape.num_prefills, shape.num_decodes, shape.num_prefill_tokens,
                   shape.num_decode_tokens, pool.total - pool.free, len(state.waiting),
                   int(state.running.size), batch.preempted,
                   0 if proposals is None else proposals.proposed_total,
                   0 if proposals is None else proposals.accepted_total, *record, extra)
            yield env.timeout(record.time_s)
            if proposals is not None:  # speculative decoding: several tokens per request
                finished = state.complete_speculative_step(batch.ids, batch.new_tokens, proposals, env.now)
                if finished.size:
                    state.drop_finished()
            elif prompts_done is None:
                finished = requests.complete_step(batch.ids, batch.new_tokens, env.now, batch.decode_only)
                if finished.size:
                    state.drop_finished()
            else:  # prefill-only: requests whose prompt is done leave for a decode replica
                finished = requests.complete_prefill(batch.ids, batch.new_tokens)
                if finished.size:
                    prompts_done(finished, env.now)
            policy.after_step(batch, finished, env.now)
