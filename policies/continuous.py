"""``continuous``: iteration-level batching as vLLM's default scheduler (v0, no chunked prefill).

Each iteration first tries to admit waiting requests, first come first served, as whole prompts:
a request joins while the step's prompt tokens stay within ``max_num_batched_tokens``, the
running requests stay within ``max_num_seqs``, and the KV pool keeps its watermark of free blocks
after giving it blocks for its prompt; the watermark is waived while nothing runs (there is
nothing to protect, and vLLM v0 would instead drop as "ignored" a preempted request that has
grown past ``pool - watermark``). The queue is served in order: the first request that does
not fit stops admission (no overtaking). If any prompt was admitted, the step runs those prefills
alone and the running requests wait (vLLM v0 runs prefill and decode steps separately, which is
the decode stall that chunked prefill removes). Otherwise every running request decodes one token;
when the pool cannot give each the block its next token may need, the most recently admitted
requests are preempted by recompute until it can (vLLM's default preemption mode).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from policies.base import Batch, Policy, PolicyOptions, register_policy
from policies.waiting import KeyedQueue

if TYPE_CHECKING:
    from simulator.engine.replica_state import ReplicaState


@register_policy
class ContinuousBatching(Policy):
    name = "continuous"

    def __init__(self, replica: ReplicaState, options: PolicyOptions) -> None:
        super().__init__(replica, options)
        keys = self.admission_keys()
        if keys is not None:
            replica.waiting = KeyedQueue(keys)  # type: ignore[assignment]  (deque-compatible)

    def admission_keys(self) -> np.ndarray | None:
        """Per-request order of the waiting queue (smaller first, ties by arrival), or None for
        first come first served. Subclasses (``sjf``, ``priority``) override only this to change
        whom admission serves next; budgets, KV rules and preemption stay the same."""
        return None

    def schedule(self, now: float) -> Batch | None:
        return self._admit_prefills(now) or self._decode_running()

    def _admit_prefills(self, now: float) -> Batch | None:
        replica, lim = self.replica, self.replica.limits
        waiting, pool = replica.waiting, replica.pool
        if not waiting:
            return None
        seats = lim.max_num_seqs - int(replica.running.size)
        budget = lim.max_num_batched_tokens
        free = pool.free
        # The watermark keeps blocks for the running requests to grow into; with none running
        # there is nothing to protect, so a long preempted request can always come back.
        reserve = lim.watermark_blocks if replica.running.size else 0
        admitted: list[int] = []
        new_tokens: list[int] = []
        blocks: list[int] = []
        while waiting and seats > 0:
            request = waiting[0]
            new, need = replica.prefill_need(request)
            if new > budget or need > free - reserve:
                break
            waiting.popleft()
            admitted.append(request)
            new_tokens.append(new)
            blocks.append(need)
            budget -= new
            free -= need
            seats -= 1
            reserve = lim.watermark_blocks
        if not admitted:
            return None
        replica.admit(admitted, blocks, now)
        ids = np.array(admitted, dtype=np.int64)
        new = np.array(new_tokens, dtype=np.int64)
        r = replica.requests
        computed = r.computed[ids]
        return Batch.of(ids, new, computed, computed + new)

    def _decode_running(self) -> Batch | None:
        replica = self.replica
        running = replica.running
        if running.size == 0:
            return None
        r, pool = replica.requests, replica.pool
        context = r.computed[running]
        # The token computed this step needs a slot: ceil((context + 1) / block_size) blocks.
        need = (context + pool.block_size) // pool.block_size - pool.held[running]
        shortfall = int(need.sum()) - pool.free
        preempted = 0
        if shortfall > 0:
            preempted = self._preempt_for(need, shortfall)
            running = replica.running
            if running.size == 0:
                return None
            context, need = context[:running.size], need[:running.size]
        pool.grow_many(running, need, int(need.sum()))
        return Batch.decodes(running, context, preempted)

    def _preempt_for(self, need: np.ndarray, shortfall: int) -> int:
        """Preempt from the tail until the others' block needs fit; returns how many."""
        held = self.replica.pool.held[self.replica.running]
        # Preempting the last k frees their blocks and drops their needs.
        relief = np.cumsum((held + need)[::-1])
        count = min(int(np.searchsorted(relief, shortfall)) + 1, int(relief.size))
        self.replica.preempt_tail(count)
        return count
