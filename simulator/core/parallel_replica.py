"""A replica with pipeline stages and data-parallel attention ranks on the clock.

How an engine keeps ``pp`` stages busy is modelled after vLLM's V0 engine (the default engine
here): the replica runs ``pp`` *virtual engines*, each with its own scheduler, waiting queue and
``1/pp`` of the KV blocks (vLLM divides ``num_gpu_blocks`` by the pipeline size per scheduler),
and each keeps one micro-batch in flight. So up to ``pp`` micro-batches are in the pipeline at
once, one per virtual engine; a stage works on one micro-batch at a time, first come first
served. With data-parallel attention each virtual engine has ``dp`` ranks, each with its own
policy, queue and KV pool; their batches travel together (one micro-batch of ``dp`` parts)
because every MoE layer synchronises them. An engine may hold its ranks' new prompts until every
rank has one (TensorRT-LLM's ``attention_dp_config.enable_balance``: :meth:`VirtualEngine._balance`).

Every (virtual engine, DP rank) pair is one scheduling unit with a :class:`ReplicaState`, which
the router sees like a replica. One loop per virtual engine: ask each of its ranks' policies for a
batch, price the micro-batch (:class:`~servesim.cost.parallel_step.ParallelCostModel`), spend the
engine's CPU overhead (not on any stage, so it overlaps the other micro-batches), then for each
stage wait until it is free, hold it for the stage's time, release it and send the activations on;
at the end credit every rank's batch. A lone request therefore sees the sum of its stages and
sends per step, and throughput comes from the micro-batches overlapping. The bubble is what is
left: stages idle while fewer than ``pp`` virtual engines have work, and the faster stages idle
behind the slowest one (a stage's busy share is in the run's ``parallelism`` summary section).

Each rank that ran logs one step row: ``start_s`` when its virtual engine formed the micro-batch,
``duration_s`` until the last stage finished; the operator columns hold its own kernels over every
stage plus the sends and DP waits (communication) and the engine overhead; ``extra_s`` holds KV
swap copies and the time spent waiting for a busy stage.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING

import simpy

from servesim.core.replica import PromptsDone
from servesim.core.replica_state import ReplicaState
from servesim.core.step_log import StepLog
from servesim.cost.parallel_step import ParallelCostModel

if TYPE_CHECKING:  # policies are given to replicas; the core never imports them at run time
    from servesim.engines.base import DpBalance
    from servesim.policies.base import Batch, Policy


class RankHandle:
    """One scheduling unit (a virtual engine's DP rank) as routers and topologies see a replica:
    its state, ``accept`` for arrivals, ``wake`` when work or room appears, and an optional
    ``prompts_done`` exit (a prefill-only group)."""

    def __init__(self, state: ReplicaState, policy: Policy, engine: VirtualEngine) -> None:
        self.state = state
        self.policy = policy
        self.engine = engine
        self.prompts_done: PromptsDone | None = None

    def accept(self, request: int) -> None:
        """As :meth:`Replica.accept <servesim.core.replica.Replica.accept>`: held until the step
        after the next one while its engine runs a step and schedules ahead, or, when its ranks
        balance their prompts, until its engine lets every rank's prompts start."""
        engine = self.engine
        if engine.replica.dp_balance is not None:
            if self.state.hold(request, engine.replica.env.now):
                self.wake()
        elif engine.replica.schedule_ahead and engine.busy:
            self.state.hold(request, engine.replica.env.now)
        elif self.state.enqueue(request):
            self.wake()

    def wake(self) -> None:
        self.engine.wake()


class VirtualEngine:
    """One scheduler of a pipelined replica: ``dp`` ranks whose micro-batch it sends through."""

    def __init__(self, replica: ParallelReplica) -> None:
        self.replica = replica
        self.ranks: list[RankHandle] = []
        self._idle: simpy.Event | None = None
        self.busy = False
        """Whether a micro-batch of this engine is in flight (formed and not yet credited)."""
        self._last_start = -math.inf
        """When the micro-batch credited last was formed (see :class:`ReplicaState.release`)."""
        self._balance_wait = 0
        """Iterations the ranks' prompts have waited for every rank to have one (TensorRT-LLM's
        ``adp_ctx_waiting_iters_count``)."""
        self._batching_wait = 0
        """Iterations they have waited more to batch (``adp_ctx_batching_wait_iters_count``)."""

    def wake(self) -> None:
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def run(self) -> Generator[simpy.Event, object, None]:
        replica = self.replica
        env, cost, log = replica.env, replica.cost, replica.steps
        stages = replica.stages
        balance = replica.dp_balance
        while True:
            now = env.now
            if balance is not None:
                self._balance(balance)
            else:
                for rank in self.ranks:
                    if rank.state.inbox:
                        rank.state.release(self._last_start)
            batches: list[Batch | None] = [rank.policy.schedule(now) for rank in self.ranks]
            if all(batch is None for batch in batches):
                if any(rank.state.inbox for rank in self.ranks):  # idle: scheduled at once
                    for rank in self.ranks:
                        rank.state.release_all()
                    continue
                self._idle = env.event()
                wakes = [w for w in (rank.policy.wake_at(now) for rank in self.ranks) if w is not None]
                if wakes:
                    yield self._idle | env.timeout(max(0.0, min(wakes) - now))
                else:
                    yield self._idle
                self._idle = None
                continue
            priced = cost.price([batch.shape if batch is not None else None for batch in batches])
            active = sum(batch is not None for batch in batches)
            replica.rank_wait_s += priced.rank_wait_s
            rows = [_row_head(rank.state, batch, now) if batch is not None else None
                    for rank, batch in zip(self.ranks, batches, strict=True)]
            extra = max(batch.extra_s for batch in batches if batch is not None)
            self.busy, self._last_start = True, now
            if priced.overhead_s + extra > 0:
                yield env.timeout(priced.overhead_s + extra)
            waited = 0.0
            for index, stage in enumerate(stages):
                request = stage.request()
                queued = env.now
                yield request
                waited += env.now - queued
                yield env.timeout(priced.stage_s[index])
                stage.release(request)
                replica.busy_s[index] += priced.stage_s[index]
                replica.rank_busy_s += priced.stage_s[index] * active
                if index < len(priced.send_s) and priced.send_s[index] > 0:
                    yield env.timeout(priced.send_s[index])
            for head, record in zip(rows, priced.ranks, strict=True):
                if head is None or record is None:
                    continue
                log.append(*head, *record._replace(time_s=record.time_s + extra + waited), extra + waited)
            end = env.now
            self.busy = False
            for rank, batch in zip(self.ranks, batches, strict=True):
                if batch is not None:
                    _credit(rank, batch, end)

    def _balance(self, balance: DpBalance) -> None:
        """Start every rank's new prompts this iteration, or hold them all, as TensorRT-LLM's
        ``PyExecutor._balance_adp_requests`` decides (:class:`~servesim.engines.base.DpBalance`):
        they start when every rank has a prompt and a free seat (after ``batching_wait_iters``
        iterations more while every rank decodes), or, failing that, after ``timeout_iters``
        iterations of waiting or as soon as some rank has nothing to decode. The count runs on
        every iteration that fails the test, with prompts waiting or not, as the engine's does.
        A prompt counts from when it is queued (TensorRT-LLM counts the prompts its schedulers
        picked: one that could not start for want of KV blocks or tokens is counted here)."""
        states = [rank.state for rank in self.ranks]
        decoding = all(state.running.size > 0 for state in states)
        start = False
        if all((state.inbox or state.waiting) and state.running.size < state.limits.max_num_seqs
               for state in states):
            self._balance_wait = 0
            start = True
            if decoding:
                if self._batching_wait < balance.batching_wait_iters:
                    self._batching_wait += 1
                    start = False
                else:
                    self._batching_wait = 0
        else:
            self._balance_wait += 1
            if self._balance_wait >= balance.timeout_iters or not decoding:
                self._balance_wait = 0
                start = True
        if start:  # queued prompts stay queued, ahead of the arrivals released behind them
            seen_by = self._last_start if self.replica.schedule_ahead else math.inf
            for state in states:
                state.release(seen_by)
        else:  # held: the queued ones back into the inbox, where the policies do not see them
            for state in states:
                state.withhold()


def _row_head(state: ReplicaState, batch: Batch, now: float) -> tuple[float, ...]:
    """The step log's batch fields, read when the batch is formed (as :class:`Replica` does)."""
    shape = batch.shape
    pool = state.pool
    proposals = batch.speculation
    return (state.index, now, shape.num_prefills, shape.num_decodes, shape.num_prefill_tokens,
            shape.num_decode_tokens, pool.total - pool.free, len(state.waiting), int(state.running.size),
            batch.preempted, 0 if proposals is None else proposals.proposed_total,
            0 if proposals is None else proposals.accepted_total)


def _credit(rank: RankHandle, batch: Batch, now: float) -> None:
    state = rank.state
    requests = state.requests
    if batch.speculation is not None:  # a DP rank verifying proposals: several tokens per request
        finished = state.complete_speculative_step(batch.ids, batch.new_tokens, batch.speculation, now)
        if finished.size:
            state.drop_finished()
    elif rank.prompts_done is None:
        finished = requests.complete_step(batch.ids, batch.new_tokens, now, batch.decode_only)
        if finished.size:
            state.drop_finished()
    else:
        finished = requests.complete_prefill(batch.ids, batch.new_tokens)
        if finished.size:
            rank.prompts_done(finished, now)
    rank.policy.after_step(batch, finished, now)


class ParallelReplica:
    """``pp`` virtual engines x ``dp`` ranks sharing ``pp`` stages (see the module docstring)."""

    def __init__(self, env: simpy.Environment, units: Sequence[Sequence[tuple[ReplicaState, Policy]]],
                 cost: ParallelCostModel, steps: StepLog, schedule_ahead: bool = False,
                 dp_balance: DpBalance | None = None) -> None:
        """``units[v][d]``: the state and policy of DP rank ``d`` of virtual engine ``v``.
        ``schedule_ahead``: the engine schedules each step while the one before runs
        (:mod:`servesim.core.replica`); ``dp_balance``: its DP ranks start prompts together
        (:meth:`VirtualEngine._balance`; only with more than one rank)."""
        self.env = env
        self.schedule_ahead = schedule_ahead
        self.dp_balance = dp_balance if max(len(ranks) for ranks in units) > 1 else None
        self.cost = cost
        self.steps = steps
        self.stages = [simpy.Resource(env, capacity=1) for _ in cost.stages]
        self.busy_s = [0.0 for _ in cost.stages]
        """Seconds each stage held a micro-batch."""
        self.rank_wait_s = 0.0
        """Seconds DP ranks with a batch waited for the slowest rank (summed over ranks)."""
        self.rank_busy_s = 0.0
        """Stage seconds times the ranks with a batch in them (what the waits are a share of)."""
        self.engines = []
        self.ranks: list[RankHandle] = []
        for ranks in units:
            engine = VirtualEngine(self)
            for state, policy in ranks:
                handle = RankHandle(state, policy, engine)
                engine.ranks.append(handle)
                self.ranks.append(handle)
            self.engines.append(engine)
            env.process(engine.run())
