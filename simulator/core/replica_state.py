"""What a scheduling policy sees of one replica: its queues, its KV-cache pool and its limits.

The policy decides (which requests run, with how many new tokens, whom to preempt); this class
carries the decisions out the same way for every policy, so that the bookkeeping (block counts,
statuses, preemption counts, the order of the queues) cannot differ between policies.

Queues follow vLLM: ``waiting`` is first-come first-served and a preempted request goes back to
its front; ``running`` is in admission order, and preemption takes its tail (the request admitted
last, as vLLM's scheduler pops the end of its running list).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from servesim.core.kv_cache import BlockPool, blocks_for
from servesim.core.prefix_index import PrefixIndex
from servesim.core.prefix_pool import PrefixBlockPool
from servesim.core.speculation import Proposals, Speculator
from servesim.core.state import (
    KV_NEVER_FITS,
    REJECTED,
    RUNNING,
    TOO_LONG,
    TRANSFERRING,
    WAITING,
    RequestState,
)
from servesim.core.swap import HostSwap, SwapPath

_EMPTY = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class EngineLimits:
    """vLLM's engine arguments that bound a step, per replica."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_blocks: int
    watermark_blocks: int
    swap_path: SwapPath | None = None
    """The KV copy path to host memory, for policies that preempt by swapping."""
    enable_prefix_caching: bool = False


@dataclass(slots=True)
class AdmissionRoom:
    """One step's room for admissions (seats, prompt tokens, KV blocks above the watermark), and
    the admissions granted so far in it, in queue order.

    Every admitting policy counts the same way (vLLM v0's rule): a request fits while a seat is
    free, its new tokens fit the step's budget and its blocks leave the watermark free. The
    watermark protects running requests' growth, so it is waived while nothing runs (a long
    preempted request can always come back) and applies from the first admission on."""

    seats: int
    budget: int
    free: int
    reserve: int
    watermark: int
    ids: list[int] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)

    def blocks_fit(self, need: int) -> bool:
        return need <= self.free - self.reserve

    def take(self, new: int, need: int) -> None:
        """Count one admission of ``new`` tokens and ``need`` blocks against the room."""
        self.budget -= new
        self.free -= need
        self.seats -= 1
        self.reserve = self.watermark

    def hold(self, request: int, new: int, need: int) -> None:
        """Grant ``request`` its ``new`` tokens and ``need`` blocks (committed later)."""
        self.take(new, need)
        self.ids.append(request)
        self.new_tokens.append(new)
        self.blocks.append(need)


class WaitingQueue(Protocol):
    """What the engine and the policies use of a waiting queue: a FCFS ``deque``, or a policy's
    own order (:class:`~servesim.policies.waiting.KeyedQueue`)."""

    def append(self, request: int, /) -> None: ...
    def popleft(self) -> int: ...
    def extendleft(self, requests: Iterable[int], /) -> None: ...
    def __getitem__(self, index: int, /) -> int: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[int]: ...


def rejection_codes(prompt: np.ndarray, output: np.ndarray, limits: EngineLimits) -> np.ndarray:
    """Per request, why a replica with ``limits`` could never serve it (0: it can): longer than
    ``max_model_len``, or more KV at its longest (prompt and every output but the last) than the
    whole pool. Vectorised over the table, so a plan can count rejections before running."""
    codes = np.zeros(prompt.size, dtype=np.int8)
    codes[blocks_for(prompt + output - 1, limits.block_size) > limits.num_blocks] = KV_NEVER_FITS
    codes[prompt + output > limits.max_model_len] = TOO_LONG
    return codes


class ReplicaState:
    """One replica's queues and KV pool over the shared :class:`RequestState`."""

    def __init__(self, index: int, requests: RequestState, limits: EngineLimits,
                 held: np.ndarray | None = None, seed: int = 0,
                 prefixes: PrefixIndex | None = None, reject_codes: np.ndarray | None = None) -> None:
        self.index = index
        self.requests = requests
        self.limits = limits
        self.reject_codes = (reject_codes if reject_codes is not None
                             else rejection_codes(requests.prompt, requests.output, limits))
        """Per request, 0 if it can ever be served here, else why not (see REJECT_REASONS);
        computed once for the whole table (:func:`rejection_codes`)."""
        self.seed = seed
        """The experiment's seed, for policies that draw random numbers (e.g. noisy predictions)."""
        # ``held``: a per-request block column shared by the replicas of one pool (a request holds
        # blocks on a prefill and a decode replica at once while its KV is in transit).
        held = requests.blocks_held if held is None else held
        self.prefix_cache: PrefixBlockPool | None = None
        """The pool, when it caches prefixes (``prefixes`` given): admission then starts each
        request after its cached prefix."""
        if prefixes is None:
            self.pool = BlockPool(limits.num_blocks, limits.block_size, len(requests), held)
        else:
            self.pool = self.prefix_cache = PrefixBlockPool(limits.num_blocks, limits.block_size,
                                                            prefixes, held)
        # A deque, or any queue with the same few methods (a policy may install a keyed one:
        # append, popleft, extendleft, [0], len).
        self.waiting: WaitingQueue = deque()
        self.inbox: deque[tuple[int, float]] = deque()
        """Arrivals the scheduler has not seen yet, with their arrival times: an engine that
        schedules one step ahead (:meth:`hold`) takes a request that arrives while a step runs
        into the step after the next one (:meth:`release`)."""
        self.running: np.ndarray = _EMPTY
        self.preemptions = 0
        self.swap: HostSwap | None = None
        """Host swap space, installed by a policy that preempts by swapping; None: recompute."""
        self.speculation: Speculator | None = None
        """Speculative decoding (installed by the topology when the experiment speculates): the
        policies ask it how many proposals each decode verifies."""

    # ------------------------------------------------------------------ load, for routers
    @property
    def outstanding(self) -> int:
        """Requests queued (seen by the scheduler or not yet) or running here."""
        return len(self.waiting) + len(self.inbox) + int(self.running.size)

    @property
    def queued(self) -> int:
        """Requests waiting here, seen by the scheduler or not yet (vLLM's ``num_requests_waiting``)."""
        return len(self.waiting) + len(self.inbox)

    @property
    def kv_demand_blocks(self) -> int:
        """KV blocks in use plus those the waiting requests need for their uncomputed tokens
        (without counting prefix-cache hits): the load a KV-aware router compares."""
        used = self.pool.total - self.pool.free
        if not self.waiting and not self.inbox:
            return used
        r = self.requests
        ids = np.fromiter(self.waiting, dtype=np.int64, count=len(self.waiting))
        if self.inbox:
            ids = np.concatenate([ids, np.array([request for request, _ in self.inbox], dtype=np.int64)])
        tokens = r.prompt[ids] + r.generated[ids]
        return used + int((blocks_for(tokens, self.pool.block_size) - r.blocks_held[ids]).sum())

    # ------------------------------------------------------------------ arrival
    def enqueue(self, request: int) -> bool:
        """Queue an arriving request, or reject it (returns False) when it can never fit."""
        if not self._arrive(request):
            return False
        self.waiting.append(request)
        return True

    def hold(self, request: int, now: float) -> bool:
        """An arrival at ``now`` while a step runs on an engine that schedules one step ahead:
        accepted (or rejected, returning False) as :meth:`enqueue` does, but kept in the
        :attr:`inbox` until :meth:`release` hands it to the scheduler."""
        if not self._arrive(request):
            return False
        self.inbox.append((request, now))
        return True

    def release(self, seen_by: float) -> None:
        """Queue the held arrivals that came at or before ``seen_by`` (in arrival order): the
        start of the step that just ended, when the engine scheduled the step now starting, and
        read its input queue just before."""
        inbox, waiting = self.inbox, self.waiting
        while inbox and inbox[0][1] <= seen_by:
            waiting.append(inbox.popleft()[0])

    def withhold(self) -> None:
        """Take every queued request back into the :attr:`inbox`, ahead of the arrivals held
        there and in queue order: an engine whose DP ranks start prompts together decides again
        each iteration whether they may (:mod:`servesim.core.parallel_replica`)."""
        waiting = self.waiting
        if not waiting:
            return
        back = [(waiting.popleft(), -math.inf) for _ in range(len(waiting))]
        self.inbox.extendleft(reversed(back))

    def release_all(self) -> None:
        """Queue every held arrival: the engine has nothing else to run, so it schedules them now."""
        self.release(math.inf)

    def _arrive(self, request: int) -> bool:
        """Mark an arrival as this replica's: waiting, or rejected (False) when it can never fit."""
        r = self.requests
        r.replica[request] = self.index
        reason = int(self.reject_codes[request])
        if reason:
            r.status[request] = REJECTED
            r.reject_reason[request] = reason
            return False
        r.status[request] = WAITING
        return True

    def admission_room(self, budget: int | None = None) -> AdmissionRoom:
        """This step's room for new admissions (``budget`` defaults to the full token budget)."""
        lim, running = self.limits, int(self.running.size)
        return AdmissionRoom(lim.max_num_seqs - running,
                             lim.max_num_batched_tokens if budget is None else budget,
                             self.pool.free, lim.watermark_blocks if running else 0, lim.watermark_blocks)

    def try_admit(self, room: AdmissionRoom, request: int, max_new: int | None = None) -> int | None:
        """Grant ``request`` its uncomputed tokens (at most ``max_new``: a chunk) if a seat, the
        token budget and KV blocks above the watermark allow: the tokens granted, or None (vLLM
        v1's allocate-or-None). Nothing changes until :meth:`commit`; a caller that stops at the
        first None serves the queue in order."""
        if room.seats <= 0 or room.budget <= 0:
            return None
        new, need = self.prefill_need(request, max_new)
        if new > room.budget or not room.blocks_fit(need):
            return None
        room.hold(request, new, need)
        return new

    def commit(self, room: AdmissionRoom, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Admit what ``room`` granted (the head of ``waiting``, in order): (ids, new tokens)."""
        admitted = room.ids
        if not admitted:
            return _EMPTY, _EMPTY
        waiting = self.waiting
        for _ in admitted:
            waiting.popleft()
        self.admit(admitted, room.blocks, now)
        return (np.fromiter(admitted, dtype=np.int64, count=len(admitted)),
                np.fromiter(room.new_tokens, dtype=np.int64, count=len(admitted)))

    # ------------------------------------------------------------------ decisions carried out
    def admit(self, admitted: list[int], blocks: list[int], now: float) -> None:
        """Move ``admitted`` (already popped from ``waiting``) into ``running``, giving each its
        ``blocks`` extra KV blocks.

        ``blocks[i]`` must be what :meth:`prefill_need` returned for the tokens the policy gives
        the request this step: with prefix caching a request that has computed nothing is then
        started after its cached prefix (``computed`` = the hit tokens) and references the cached
        blocks instead of allocating them."""
        if len(admitted) == 1:
            self._admit_one(admitted[0], blocks[0], now)
        else:
            self._admit_many(admitted, blocks, now)

    def _admit_many(self, admitted: list[int], blocks: list[int], now: float) -> None:
        r = self.requests
        ids = np.fromiter(admitted, dtype=np.int64, count=len(admitted))
        counts = np.fromiter(blocks, dtype=np.int64, count=len(blocks))
        first_time = np.isnan(r.first_scheduled[ids])
        cache = self.prefix_cache
        if cache is None:
            self.pool.grow_many(ids, counts, sum(blocks))
        else:
            fresh = (r.computed[ids] == 0) & (r.blocks_held[ids] == 0)
            if (~fresh).any():
                cache.grow_many(ids[~fresh], counts[~fresh], int(counts[~fresh].sum()))
            if fresh.any():
                starts = ids[fresh]
                hits = cache.admit(starts, r.prompt[starts] + r.generated[starts], counts[fresh])
                r.computed[starts] = hits
                first = first_time[fresh]
                r.cached_tokens[starts[first]] = hits[first]
        r.status[ids] = RUNNING
        first = ids[first_time]
        r.first_scheduled[first] = now
        self.running = np.concatenate((self.running, ids)) if self.running.size else ids

    def _admit_one(self, request: int, blocks: int, now: float) -> None:
        """:meth:`admit` of one request (most admissions), with scalar reads and writes instead
        of a dozen NumPy calls on arrays of one element: the same pool calls (``grow`` is
        ``grow_many`` of one request) and the same values written as :meth:`_admit_many`
        (``tests/test_core_fast_paths.py`` compares whole runs both ways)."""
        r = self.requests
        first_time = math.isnan(r.first_scheduled[request])
        cache = self.prefix_cache
        if cache is None:
            if blocks:
                self.pool.grow(request, blocks)
        elif r.computed[request] == 0 and r.blocks_held[request] == 0:
            hit = cache.admit_one(request, int(r.prompt[request]) + int(r.generated[request]), blocks)
            r.computed[request] = hit
            if first_time:
                r.cached_tokens[request] = hit
        elif blocks:
            cache.grow(request, blocks)
        r.status[request] = RUNNING
        if first_time:
            r.first_scheduled[request] = now
        one = np.array([request], dtype=np.int64)
        self.running = np.concatenate((self.running, one)) if self.running.size else one

    def tail_relief_count(self, blocks: int, planned: np.ndarray | None = None,
                          among: int | None = None) -> int:
        """How many requests from the tail of ``running`` (only the last ``among``) must go to
        free ``blocks`` blocks, counting each one's held blocks plus its ``planned`` growth (aligned
        with ``running``); more than there are when even all of them would not."""
        running = self.running if among is None else self.running[self.running.size - among:]
        relief = self.pool.held[running]
        if planned is not None:
            relief = relief + (planned if among is None else planned[planned.size - among:])
        return int(np.searchsorted(np.cumsum(relief[::-1]), blocks)) + 1

    def preempt_tail_until(self, blocks: int, planned: np.ndarray | None = None) -> int:
        """Preempt from the tail of ``running`` (vLLM's ``running.pop()``) until ``blocks`` blocks
        are freed, counting each victim's ``planned`` growth too, or until nothing runs; returns
        how many were preempted."""
        count = min(self.tail_relief_count(blocks, planned), int(self.running.size))
        self.preempt_tail(count)
        return count

    def preempt_tail(self, count: int) -> np.ndarray:
        """Preempt the last ``count`` running requests by recompute: their blocks are freed, their
        computed tokens forgotten (generated ones are kept) and they go back to the front of the
        waiting queue, the oldest first. Returns their ids. With host swap space, those whose
        blocks fit there are swapped out instead and keep their computed tokens."""
        victims = self.running[-count:]
        self.running = self.running[:-count]
        r = self.requests
        if self.swap is None:
            r.computed[victims] = 0
        else:
            swapped = self.swap.swap_out(victims, self.pool.held[victims])
            r.computed[victims[~swapped]] = 0
            r.swaps_out[victims[swapped]] += 1
        self.pool.release_many(victims)
        r.status[victims] = WAITING
        r.preemptions[victims] += 1
        self.preemptions += count
        self.waiting.extendleft(reversed(victims.tolist()))
        return victims

    def proposals_for(self, decoding: np.ndarray, budget: int | None = None) -> np.ndarray | None:
        """Speculative decoding: proposal tokens each request of ``decoding`` (running, past its
        first token) verifies this step, at most ``budget`` in all; None when none does (no
        speculation configured, the batch cap is exceeded, or nothing to propose). The one
        decision every policy asks for (:meth:`Speculator.proposals`); pure."""
        speculation = self.speculation
        if speculation is None:
            return None
        r = self.requests
        generated = r.generated[decoding]
        return speculation.proposals(int(self.running.size), decoding, generated,
                                     r.output[decoding] - generated, budget)

    def plan_speculation(self, ids: np.ndarray, proposed: np.ndarray,
                         rows: np.ndarray | None = None) -> Proposals:
        """The accepted counts drawn for ``ids`` (the batch members at ``rows``), which verify
        ``proposed`` proposals this step."""
        assert self.speculation is not None
        return self.speculation.plan(ids, self.requests.generated[ids], proposed, rows)

    def complete_speculative_step(self, ids: np.ndarray, new_tokens: np.ndarray, proposals: Proposals,
                                  now: float) -> np.ndarray:
        """Credit a step in which the requests at ``proposals.rows`` verified proposals: each keeps
        the KV of its last token and its accepted proposals and emits ``1 + accepted`` tokens; the
        blocks that held only rejected proposals go back to the pool (the next step's proposals
        allocate again). Returns the ids that emitted their last token."""
        rejected = proposals.proposed - proposals.accepted
        credited = new_tokens.copy()
        credited[proposals.rows] -= rejected
        accepted = np.zeros(ids.size, dtype=np.int64)
        accepted[proposals.rows] = proposals.accepted
        finished = self.requests.complete_step(ids, credited, now, accepted=accepted)
        verified = ids[proposals.rows]
        self.pool.shrink_many(verified, blocks_for(self.requests.computed[verified], self.pool.block_size))
        if self.speculation is not None:
            self.speculation.record(proposals)
        return finished

    def drop_finished(self) -> None:
        """Remove finished requests from ``running`` and free their blocks."""
        running = self.running
        finished = self.requests.status[running] != RUNNING
        if np.count_nonzero(finished):  # (a fraction of .any()'s cost on a few elements)
            self.pool.release_many(running[finished])
            self.running = running[~finished]

    def drop_done(self, ids: np.ndarray, done: np.ndarray) -> None:
        """:meth:`drop_finished` when the caller knows which requests finished: those at ``done``
        in ``ids``. A fast-forwarded run of the whole running batch (``ids`` is ``running``) drops
        them without reading every status again: the same blocks freed in the same order, the
        same ``running`` left."""
        if ids is not self.running:
            self.drop_finished()
            return
        if np.count_nonzero(done):
            self.pool.release_many(ids[done])
            self.running = ids[~done]

    def hand_off(self, ids: np.ndarray) -> None:
        """Disaggregated prefill: ``ids`` (running here) leave ``running`` with their blocks still
        held, until their KV has been copied to a decode replica."""
        self.running = self.running[~np.isin(self.running, ids)]
        self.requests.status[ids] = TRANSFERRING

    def join_running(self, ids: np.ndarray) -> None:
        """Disaggregated decode: ``ids``, whose KV just arrived into blocks reserved for them,
        join ``running`` without any prefill step here."""
        self.requests.status[ids] = RUNNING
        self.running = np.concatenate((self.running, ids)) if self.running.size else ids

    def prefill_need(self, request: int, max_new: int | None = None) -> tuple[int, int]:
        """(new tokens, extra blocks) to compute ``request``'s uncomputed tokens, at most
        ``max_new`` of them (a chunk). With prefix caching, a request that has computed nothing
        starts after the prefix this replica has cached: fewer new tokens, and the blocks count
        the cached ones it would take off the evictable list (pure: nothing is reserved)."""
        r = self.requests
        total = int(r.prompt[request] + r.generated[request])
        start = int(r.computed[request])
        cache = self.prefix_cache
        if cache is not None and start == 0 and r.blocks_held[request] == 0:
            hit, evictable_hits = cache.lookup(request, total)
            start = hit * cache.block_size
            stop = total if max_new is None else min(total, start + max_new)
            return stop - start, cache.blocks_for(stop) - hit + evictable_hits
        stop = total if max_new is None else min(total, start + max_new)
        return stop - start, self.pool.blocks_to_grow(request, stop)
