"""``chunked_prefill``: Sarathi-Serve's stall-free batching, as vLLM runs it with chunked prefill.

Each step has a budget of ``max_num_batched_tokens`` tokens (vLLM's default with chunked prefill
is 2048; the deployment applies it when the key is unset) and ``max_num_seqs`` requests. The
running requests are served first: every decoding request gets its one token (decodes always fit,
since ``max_num_seqs <= max_num_batched_tokens``), then the running requests still in their prompt
(partially prefilled, or recomputing after preemption), in admission order, each get as much of
the rest of their prompt as the remaining budget holds. Then waiting requests are admitted first
come first served, the last one with a partial chunk if the budget runs out mid-prompt, while
seats remain and the KV pool keeps its watermark of free blocks after giving them the blocks of
their first chunk; the queue is not overtaken. Decodes and prefill chunks share one step, so a
long prompt no longer stalls the running decodes for a whole prefill (Sarathi-Serve, OSDI'24).

KV blocks grow with each chunk (vLLM v1 allocates slots for the tokens scheduled, not the whole
prompt at admission). When the pool cannot give the running requests the blocks of their planned
tokens, the most recently admitted ones are preempted by recompute until it can (vLLM's
``running.pop()``), as in ``continuous``, and that step admits no new request. A chunk attends
to every earlier chunk of its prompt: the cost model prices it over ``computed + new`` context
(``servesim.cost.attention``).
"""

from __future__ import annotations

import numpy as np

from servesim.core.kv_cache import blocks_for
from servesim.policies.base import Batch, Policy, register_policy


@register_policy
class ChunkedPrefill(Policy):
    name = "chunked_prefill"
    supports_speculation = True
    chunks_prefills = True
    fast_forwards_decodes = True

    def schedule(self, now: float) -> Batch | None:
        replica = self.replica
        preempted = 0
        while True:
            ids, new, need, proposed, decoding = self._plan_running()
            needed = sum(need.tolist()) if need.size <= 64 else int(need.sum())  # (cheaper on a few)
            shortfall = needed - replica.pool.free
            if shortfall <= 0:
                break
            # Preempt from the tail until the plan could fit, then plan again (the freed budget
            # may lengthen an earlier chunk).
            planned = np.zeros(replica.running.size, dtype=np.int64)
            planned[np.isin(replica.running, ids, assume_unique=True)] = need
            preempted += replica.preempt_tail_until(shortfall, planned)
        replica.pool.grow_many(ids, need, needed)
        # As vLLM v1: a step that had to preempt admits nobody new (and an empty queue, nobody).
        if not preempted and replica.waiting:
            scheduled = int(ids.size) if decoding is not None else int(new.sum())  # new is all ones then
            budget = replica.limits.max_num_batched_tokens - scheduled
            admitted, chunks = self._admit_waiting(now, budget)
            if admitted.size:
                ids = np.concatenate((ids, admitted))
                new = np.concatenate((new, chunks))
                decoding = None
        if ids.size == 0:
            return None
        r = replica.requests
        if decoding is not None:  # every running request decodes one token, nobody was admitted
            return self._decodes_past_first(ids, decoding, preempted) \
                or Batch.of(ids, new, decoding, decoding + 1, preempted)
        computed = r.computed[ids]
        total = r.prompt[ids] + r.generated[ids]
        speculation = None
        if proposed is not None:  # running decodes verify proposals (running rows come first)
            rows = np.flatnonzero(proposed)
            if rows.size:
                speculation = replica.plan_speculation(ids[rows], proposed[rows], rows)
        if speculation is None and ids.size == replica.running.size and computed.size \
                and int(new.sum()) == ids.size and np.count_nonzero(computed + 1 == total) == ids.size \
                and not np.count_nonzero(r.generated[ids] <= 0):
            # Every running request decodes one token past its first (no chunk, no admission, no
            # proposals): the shape Batch.of would build, through the decode fast path (and
            # fast-forward).
            return Batch.decodes(ids, computed, preempted)
        return Batch.of(ids, new, computed, total, preempted, speculation)

    def _decodes_past_first(self, ids: np.ndarray, computed: np.ndarray, preempted: int) -> Batch | None:
        """``Batch.decodes`` of ``ids`` (every one decoding one token over ``computed`` cached
        tokens) when each is past its first token, else None (a request whose prompt ends this step
        samples its first token: a prefill in the token-budget view, priced by ``Batch.of``)."""
        if np.count_nonzero(self.replica.requests.generated[ids] <= 0):  # (cheaper than .all())
            return None
        return Batch.decodes(ids, computed, preempted)

    def _plan_running(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None,
                                     np.ndarray | None]:
        """(ids, new tokens, extra blocks, proposals, contexts) of the running requests that get
        tokens this step, in running order: every decode one token (plus the proposals it
        verifies, when speculating), then the prompts in order while budget remains. ``contexts``
        (their computed tokens) only when every running request decodes one token without
        proposals (most steps: ``schedule`` then skips rereading the request columns)."""
        replica = self.replica
        running = replica.running
        if running.size == 0:
            return running, running, running, None, None
        r, pool = replica.requests, replica.pool
        computed = r.computed[running]
        remaining = r.prompt[running] + r.generated[running] - computed
        decoding = remaining == 1
        decodes = int(np.count_nonzero(decoding))
        budget = replica.limits.max_num_batched_tokens - decodes
        proposed = None
        if replica.speculation is not None and decodes:
            proposed = replica.proposals_for(running[decoding], budget)
        if proposed is not None:
            full = np.zeros(running.size, dtype=np.int64)
            full[decoding] = proposed
            budget -= int(proposed.sum())
        if proposed is None and decodes == running.size:  # every request decodes one token (most steps)
            need = blocks_for(computed, pool.block_size, plus=1) - pool.held[running]
            return running, np.ones(running.size, dtype=np.int64), np.maximum(need, 0), None, computed
        prompt_left = np.where(decoding, 0, remaining)
        before = np.cumsum(prompt_left) - prompt_left
        # np.clip's arithmetic (the bounds are ordered: 0 <= prompt_left), without its overhead
        chunk = np.minimum(np.maximum(budget - before, 0), prompt_left)
        new = np.where(decoding, 1, chunk) if proposed is None else np.where(decoding, 1 + full, chunk)
        scheduled = new > 0
        proposals = None if proposed is None else full
        if np.count_nonzero(scheduled) < scheduled.size:  # (a fraction of .all()'s cost)
            running, computed, new = running[scheduled], computed[scheduled], new[scheduled]
            if proposals is not None:
                proposals = proposals[scheduled]
        need = blocks_for(computed + new, pool.block_size) - pool.held[running]
        return running, new, np.maximum(need, 0), proposals, None

    def _admit_waiting(self, now: float, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """Admit waiting requests FCFS with their first chunk (with prefix caching it starts after
        the replica's cached prefix); returns (ids, chunk tokens)."""
        replica = self.replica
        room = replica.admission_room(budget)
        for request in replica.waiting:
            if replica.try_admit(room, request, max_new=room.budget) is None:
                break
        return replica.commit(room, now)
