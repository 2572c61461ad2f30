"""One replica's iteration loop: the only SimPy process that advances per step.

``schedule -> price -> one timeout -> credit``: the policy forms the batch, the cost model
prices it, the clock advances by one SimPy event, and the step is credited to its requests. An
idle replica waits on an event that the next arrival (or a policy's timer) triggers, so an empty
system costs nothing.

**Scheduling one step ahead.** An engine whose host work overlaps the GPU (vLLM V1's async
scheduling, SGLang's and TensorRT-LLM's overlap schedulers: ``RuntimeCosts.overlap``) schedules
step ``n + 1`` as soon as it has launched step ``n``, and reads its input queue just before that.
A request that arrives while step ``n`` runs is therefore first seen when step ``n + 1`` is
scheduled at ``n``'s end, and first runs in step ``n + 2``: one step later than on an engine that
schedules at each step's end (vLLM's ``EngineCore.step_with_batch_queue`` with its batch queue of
two, SGLang's ``event_loop_overlap``, TensorRT-LLM's ``_executor_loop_overlap``: each receives
new requests once per iteration, after launching the next batch). With the engine knob
``schedule_ahead`` (``RuntimeCosts.schedule_ahead``; off by default, because on the serving file
it makes the replayed TTFT worse: README, Calibration) the replica holds such an arrival
(``ReplicaState.hold``) and hands it to the policy at the end of the step after its arrival
(``ReplicaState.release``, the arrivals up to the start of the step that just ended). An engine
with nothing to run schedules an arrival at once, as it does when idle. Not modelled: the
step that an overlapping engine schedules for a request already finished (its last token is seen
one step late, so its seat and blocks free a step later and one token is computed in vain).

**Reading arrivals every n steps.** SGLang's ``--scheduler-recv-interval n``
(``RuntimeCosts.recv_interval``) reads the input queue only when a counter reaches ``n``: each
pure-decode step adds 1, any other step enough to read at once. Arrivals are held
(``ReplicaState.hold``) until then, or taken at once by an engine with nothing else to run; such
a replica runs step by step (its arrivals' wait is counted in steps, not in time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Protocol

import numpy as np
import simpy

from servesim.core.fast_forward import DecodeRun, apply_decode_run, delay_to, plan_decode_run, price_steps
from servesim.core.progress import MAX_IDLE_WAKES, describe, stalled
from servesim.core.replica_state import ReplicaState
from servesim.core.step_log import StepLog
from servesim.core.stream_out import OutputStream
from servesim.cost import BatchShape, CostModel, StepRecord

if TYPE_CHECKING:  # policies are given to replicas; the core never imports them at run time
    from servesim.policies.base import Batch, Policy

PromptsDone = Callable[[np.ndarray, float], None]
"""A prefill-only replica's exit: called with the requests whose prompt KV is complete and the
time (the disaggregated topology sends them to a decode replica)."""


Planned = tuple["DecodeRun | None", "np.ndarray | None"]
"""``plan_decode_run``'s answer for a batch: the run (None: none) and the first step's record."""
Scheduled = tuple["Batch | None", "Planned | None"]
"""What the policy scheduled at the end of a chain of runs (None: nothing to run) and, for a
pure-decode batch, its plan (None: not planned), for the loop to take up once the clock is there."""


def first_record(row: np.ndarray) -> StepRecord:
    """A decode step's record from its row of the run pricer (``price_steps``): ``step_record``'s
    record of that step, bit for bit (the bound back to an int)."""
    values = row.tolist()
    values[1] = int(values[1])
    return StepRecord(*values)


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
                 next_arrival: Callable[[], float] | None = None, sole_replica: bool = False,
                 horizon: Callable[[], float] | None = None, stream: OutputStream | None = None,
                 schedule_ahead: bool = False, recv_interval: int = 1) -> None:
        """``prompts_done`` makes this a prefill-only replica: a request whose prompt is computed
        emits nothing here and goes to ``prompts_done`` instead. ``next_arrival`` (when the next
        request enters the deployment) turns fast-forward on: runs of pure-decode steps become one
        event (``servesim.core.fast_forward``); its caller checked that the topology, engine and
        policy declare it. ``sole_replica``: the deployment has no other replica, so its runs may
        go through an arrival (``plan_decode_run``'s ``through_arrival``). A replica that speculates
        (``state.speculation``, priced by a :class:`StepPricer` that adds the proposer's passes)
        runs step by step whatever ``next_arrival`` says: its accepted tokens are drawn per step.
        ``horizon``: the next time something outside reads the requests' state between events
        (:class:`~servesim.core.sim.Horizon`; None: never), which runs chained through a finish
        (:meth:`_chain`) end before. ``stream``: the front end's sender when the engine has a
        streaming cost (:mod:`servesim.core.stream_out`): every step's chunks go through it, and
        its requests' first-token and finish times become the times their clients see them.
        ``schedule_ahead``: the engine schedules each step while the one before runs (its host work
        overlaps the GPU), so a request that arrives while a step runs is first scheduled in the
        step after the next one (see the module docstring). ``recv_interval``: the engine reads its
        arrivals only every that many decode steps (see the module docstring); above 1 the replica
        runs step by step."""
        self.env = env
        self.stream = stream
        self.state = state
        self.policy = policy
        self.cost = cost
        self.steps = steps
        self.prompts_done = prompts_done
        plain_pool = state.swap is None  # prefix caches are fine: decodes grow past the hashed prompt
        plain_cost = cost if isinstance(cost, CostModel) and state.speculation is None else None
        self.run_cost = plain_cost if prompts_done is None and plain_pool else None
        """The cost model that prices fast-forwarded runs (None: this replica never fast-forwards)."""
        self.recv_interval = recv_interval
        self._recv_count = 0
        """Decode steps since the engine last read its arrivals (SGLang's ``SchedulerRecvSkipper``)."""
        self._last_weight = 1
        """What the step that just ended adds to the count: 1 for a pure-decode step, the interval
        for any other (a prefill step: the engine reads at once after it)."""
        self.next_arrival = next_arrival if self.run_cost is not None and recv_interval == 1 else None
        self.sole_replica = sole_replica
        self.horizon = horizon
        self.fast_forwarded_steps = 0
        """Steps credited in fast-forwarded runs (the rest were taken one by one)."""
        self.chained_runs = 0
        """Runs that went on after a finish inside the same timeout (:meth:`_chain`)."""
        self.early_steps = 0
        """Ordinary steps (not runs) credited before the clock got to their end, inside the
        timeout of an earlier step or run (:meth:`_ahead`)."""
        self.steps_ahead = self.next_arrival is not None and sole_replica
        """Whether ordinary steps may be credited ahead of the clock (:meth:`_ahead`): only on the
        deployment's sole replica, whose appended step rows and ITL pairs then stay in clock
        order (no other replica appends between them)."""
        self.schedule_ahead = schedule_ahead
        self._last_start = -math.inf
        """When the step that ends at the clock's next boundary started: the engine scheduled the
        step after it then, so the arrivals it holds from before that instant join the next step."""
        self._idle: simpy.Event | None = None
        self.process = env.process(self._run())

    def accept(self, request: int) -> None:
        """An arrival routed here: queue it (or reject it) and wake the loop if idle; held until
        the step after the next one while a step runs on an engine that schedules ahead."""
        if self.recv_interval > 1:
            if self.state.hold(request, self.env.now):
                self.wake()
        elif self.schedule_ahead and self._idle is None:
            self.state.hold(request, self.env.now)
        elif self.state.enqueue(request):
            self.wake()

    def wake(self) -> None:
        """New work or freed blocks: an idle loop asks its policy again."""
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _run(self) -> Generator[simpy.Event, object, None]:
        env, state, policy, steps = self.env, self.state, self.policy, self.steps
        requests, pool = state.requests, state.pool
        step_record, append, index, stream = self.cost.step_record, steps.append, state.index, self.stream
        prompts_done, next_arrival = self.prompts_done, self.next_arrival
        idle_wakes, steps_seen = 0, -1  # the livelock guard: counted on the idle path only
        decode_guess_s: float | None = None  # a recent decode step's duration: sizes run pricing
        scheduled: Scheduled | None = None  # what the policy scheduled at the end of a chain
        planned: Planned | None = None
        while True:
            now = env.now
            if scheduled is None:
                batch, planned = self._schedule(now), None
            else:
                (batch, planned), scheduled = scheduled, None
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
                    and batch.speculation is None and state.swap is None and not state.inbox:
                assert self.run_cost is not None  # set with next_arrival
                run, first = plan_decode_run(state, self.run_cost, shape.decode_context, batch.ids, now,
                                             next_arrival(), self.sole_replica, policy.run_limit(batch),
                                             decode_guess_s) if planned is None else planned
                delay = None if run is None else delay_to(now, run.times[-1])
                if run is not None and delay is not None:
                    waiting = len(state.waiting)
                    if run.finished_at_end and self._may_chain(run.times[-1]):
                        end, scheduled, decode_guess_s = self._chain(batch, run, now, waiting)
                        yield env.timeout(self._landing(now, end))
                        continue
                    yield env.timeout(delay)  # lands on run.times[-1] (delay_to)
                    self._credit_run(batch, run, waiting)
                    decode_guess_s = run.last_s
                    continue
                if first is None:  # no run was priced: the run pricer prices this one step (its memo)
                    first = price_steps(self.run_cost, shape.decode_context, 0, 1)[0]
                record = first_record(first)
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
            self._last_start = now
            if self.steps_ahead and proposals is None and not extra \
                    and self._may_step_ahead(now, now + record.time_s):
                self._credit_step(batch, now + record.time_s)
                end, scheduled, decode_guess_s = self._ahead(now + record.time_s, now, decode_guess_s)
                yield env.timeout(record.time_s if end == now + record.time_s else self._landing(now, end))
                continue
            yield env.timeout(record.time_s)
            firsts, lag = (None, 0.0) if stream is None else self._stream_step(batch, env.now)
            if proposals is not None:  # speculative decoding: several tokens per request
                finished = state.complete_speculative_step(batch.ids, batch.new_tokens, proposals, env.now)
                if lag:
                    self._seen_late(firsts, finished, lag)
                if finished.size:
                    state.drop_finished()
            elif prompts_done is None:
                finished = requests.complete_step(batch.ids, batch.new_tokens, env.now, batch.decode_only)
                if lag:
                    self._seen_late(firsts, finished, lag)
                if finished.size:
                    state.drop_finished()
            else:  # prefill-only: requests whose prompt is done leave for a decode replica
                finished = requests.complete_prefill(batch.ids, batch.new_tokens)
                if finished.size:
                    prompts_done(finished, env.now)
            policy.after_step(batch, finished, env.now)

    def _schedule(self, now: float) -> Batch | None:
        """The policy's batch at ``now``, once the held arrivals the engine has read by now join
        its queue (those up to the start of the step that just ended); an engine that would
        otherwise sit idle takes the rest at once."""
        state = self.state
        if self.recv_interval > 1:
            return self._schedule_reading_every(now)
        if not state.inbox:
            return self.policy.schedule(now)
        state.release(self._last_start)
        batch = self.policy.schedule(now)
        if batch is None and state.inbox:
            state.release_all()
            batch = self.policy.schedule(now)
        return batch

    def _schedule_reading_every(self, now: float) -> Batch | None:
        """:meth:`_schedule` for an engine that reads its arrivals only when its count reaches
        ``recv_interval`` (counted once per step, as SGLang's scheduler counts once per loop;
        after a prefill step it reads at once, and an engine with nothing else to run reads
        whatever has come)."""
        state = self.state
        self._recv_count += self._last_weight
        if self._recv_count >= self.recv_interval:
            self._recv_count = 0
            state.release(self._last_start if self.schedule_ahead else math.inf)
        batch = self.policy.schedule(now)
        if batch is None and state.inbox:
            state.release_all()
            batch = self.policy.schedule(now)
        if batch is not None:
            self._last_weight = 1 if batch.decode_only else self.recv_interval
        return batch

    def _may_chain(self, end: float) -> bool:
        """Whether a run ending with a finish at ``end`` may be credited before its timeout ends
        and followed, in the same timeout, by what the policy schedules then (:meth:`_chain`): it
        ends before the next arrival (which the policy must see) and may be credited early."""
        assert self.next_arrival is not None  # only fast-forwarding replicas chain
        return end < self.next_arrival() and self._may_credit_early(end)

    def _may_credit_early(self, end: float) -> bool:
        """Whether a run ending at ``end`` may be credited before the clock gets there: nothing
        outside this replica reads its state before ``end`` (the horizon), and nobody listens to
        finishes (those listeners start SimPy events of their own). An arrival inside the run only
        queues its request (``ReplicaState.enqueue`` reads nothing a run changes), as a run's
        last step already allows on a sole replica."""
        horizon = math.inf if self.horizon is None else self.horizon()
        return end < horizon and not self.state.requests.done_listeners

    def _landing(self, start: float, end: float) -> float:
        """The delay from ``start`` that lands the clock on ``end``, the end of a step or run that
        :meth:`_chain` or :meth:`_ahead` credited (each checked that one exists)."""
        delay = delay_to(start, end)
        assert delay is not None
        return delay

    def _may_step_ahead(self, start: float, end: float) -> bool:
        """Whether an ordinary step ending at ``end`` may be credited now, inside a timeout that
        started at ``start``: it ends strictly before the next arrival (whose request the policy
        must see at the step's end, as step by step), nothing reads the requests before ``end``,
        and the timeout can land on ``end``."""
        assert self.next_arrival is not None
        return end < self.next_arrival() and self._may_credit_early(end) and delay_to(start, end) is not None

    def _append(self, batch: Batch, start: float, record: StepRecord) -> None:
        """The step log's row of an ordinary step of ``batch`` starting at ``start`` (no
        proposals, no extra time: a replica that steps ahead has neither), as the loop appends it."""
        shape, state = batch.shape, self.state
        pool = state.pool
        self.steps.append(state.index, start, shape.num_prefills, shape.num_decodes, shape.num_prefill_tokens,
                          shape.num_decode_tokens, pool.total - pool.free, len(state.waiting),
                          int(state.running.size), batch.preempted, 0, 0, *record, batch.extra_s)

    def _credit_step(self, batch: Batch, end: float) -> None:
        """Credit an ordinary step ending at ``end`` (its row already appended), as the loop does
        once the clock is there."""
        firsts, lag = (None, 0.0) if self.stream is None else self._stream_step(batch, end)
        finished = self.state.requests.complete_step(batch.ids, batch.new_tokens, end, batch.decode_only)
        if lag:
            self._seen_late(firsts, finished, lag)
        if finished.size:
            self.state.drop_finished()
        self.policy.after_step(batch, finished, end)
        self.early_steps += 1

    def _stream_step(self, batch: Batch, end: float) -> tuple[np.ndarray, float]:
        """Hand the chunks of ``batch``'s step (ending at ``end``, not yet credited) to the front
        end: returns the requests whose first token it emits and the lag their client sees."""
        assert self.stream is not None
        ids = batch.ids
        if batch.decode_only:  # every request emits, none for the first time
            return ids[:0], self.stream.emit(end, int(ids.size))
        r = self.state.requests
        emits = r.emitting(ids, batch.new_tokens)
        firsts = ids[emits & np.isnan(r.first_token[ids])]
        return firsts, self.stream.emit(end, int(np.count_nonzero(emits)))

    def _seen_late(self, firsts: np.ndarray | None, finished: np.ndarray, lag: float) -> None:
        """The first tokens and finishes of a credited step, moved to when their clients see them."""
        r = self.state.requests
        if firsts is not None and firsts.size:
            r.first_token[firsts] += lag
        if finished.size:
            r.finish[finished] += lag

    def _credit_run(self, batch: Batch, run: DecodeRun, waiting: int) -> None:
        """Credit ``run`` (ending at ``run.times[-1]``) to the requests, the step log and the policy."""
        self._last_start = run.times[-2]
        lag = 0.0 if self.stream is None else self.stream.emit_steps(run.times[1:], run.ids.size)
        finished = apply_decode_run(self.state, run, self.steps, waiting, batch.preempted)
        if lag and finished.size:
            self.state.requests.finish[finished] += lag
        self.policy.after_run(batch, run.steps, finished, run.times[-1])
        self.fast_forwarded_steps += run.steps

    def _chain(self, batch: Batch, run: DecodeRun, start: float, waiting: int
               ) -> tuple[float, Scheduled | None, float | None]:
        """Credit ``run`` (scheduled at ``start``, ending with a finish) now, then go on at its
        end as the step-by-step loop would (:meth:`_ahead`): runs through finishes, all inside the
        one timeout the caller yields. Returns the last credited end, what the policy scheduled
        there when nothing more could be credited (:data:`Scheduled`; None when the policy is to
        be asked there) and the last decode step's duration."""
        assert self.next_arrival is not None
        self._credit_run(batch, run, waiting)
        end = run.times[-1]
        if end >= self.next_arrival():
            return end, None, run.last_s  # the policy is asked at ``end`` after the arrival, as usual
        return self._ahead(end, start, run.last_s, after_run=True)

    def _ahead(self, t: float, start: float, guess_s: float | None, after_run: bool = False
               ) -> tuple[float, Scheduled | None, float | None]:
        """Go on from ``t``, where everything before has been credited, inside the timeout that
        started at ``start``: ask the policy for the batch at ``t``, as the step-by-step loop
        would, and while it is a pure-decode run that may be credited early (:meth:`_chain`'s
        rule), or an ordinary step that may (:meth:`_may_step_ahead`, on a sole replica), credit
        it and go on at its end.

        Exact because the replica's state only changes by its own steps until the next arrival
        (routing reads it then, so every step and chained run ends strictly before it), nothing
        else reads it before the horizon, and the policy is asked at each end with that end's time
        and the state the steps before it left, as step by step (``schedule(now)`` reads the clock
        only through ``now``). Returns the last credited end, what the policy scheduled there
        when it could not be credited (:data:`Scheduled`; None when a run ended without a finish
        or with an arrival inside it, so the loop asks the policy at its end as usual) and the
        last decode step's duration (``guess_s`` when none)."""
        state, policy, cost = self.state, self.policy, self.run_cost
        assert cost is not None and self.next_arrival is not None
        while True:
            following = self._schedule(t)
            if following is None:
                return t, (None, None), guess_s
            planned: Planned | None = None
            first = None
            if following.decode_only and not following.preempted and not following.extra_s \
                    and following.speculation is None and not state.inbox:
                # The plan the loop would make at ``t`` (the same state, arrival and guess): kept
                # for it when this run may not be credited early.
                planned = plan_decode_run(state, cost, following.shape.decode_context, following.ids, t,
                                          self.next_arrival(), self.sole_replica, policy.run_limit(following),
                                          guess_s)
                run, first = planned
                if run is not None:
                    end = run.times[-1]
                    if not self._may_credit_early(end) or delay_to(start, end) is None:
                        return t, (following, planned), guess_s
                    if after_run:
                        self.chained_runs += 1
                    self._credit_run(following, run, len(state.waiting))
                    t, guess_s, after_run = end, run.last_s, True
                    if not run.finished_at_end or end >= self.next_arrival():
                        return t, None, guess_s
                    continue
            if not self.steps_ahead or following.extra_s or following.speculation is not None:
                return t, (following, planned), guess_s
            # An ordinary step: priced as the loop prices it, credited if it ends in time.
            if planned is not None:
                if first is None:  # the run pricer prices this one step (its memo), as the loop does
                    first = price_steps(cost, following.shape.decode_context, 0, 1)[0]
                record = first_record(first)
                planned = (None, first)
            else:
                record = self.cost.step_record(following.shape)
            end = t + record.time_s
            if not self._may_step_ahead(start, end):
                return t, (following, planned), guess_s
            self._append(following, t, record)
            self._last_start = t
            self._credit_step(following, end)
            if planned is not None:
                guess_s = record.time_s
            t, after_run = end, False
