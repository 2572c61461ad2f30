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

``order`` says who wins when both could run. ``prefill_first`` (the default) is vLLM's rule
above: any admissible prompt pauses the running decodes. ``decode_first`` follows HF TGI's
router (``--waiting-served-ratio``, ``--max-waiting-tokens``): while requests are decoding, the
admissible prompts (same limits as above) are prefilled only if there are at least
``floor(waiting_served_ratio * running)`` of them, or if ``max_waiting_steps`` steps have run
since the last prefill step (counting that step, as TGI's ``waiting_tokens`` starts at 1);
otherwise the running requests decode on. With nothing running, prompts are admitted at once.
Decodes are stalled less often, by larger prefills: lower ITL tails, higher TTFT. The defaults
are TGI's (1.2 and 20; TGI later lowered the ratio to 0.3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
from pydantic import Field

from servesim.core.kv_cache import blocks_for
from servesim.policies.base import Batch, Policy, PolicyOptions, register_policy
from servesim.policies.waiting import KeyedQueue

if TYPE_CHECKING:  # the core runs policies; policies only name its types
    from servesim.core.replica_state import ReplicaState


class ContinuousOptions(PolicyOptions):
    order: Literal["prefill_first", "decode_first"] = Field(
        "prefill_first", description="prefill_first: vLLM (any admissible prompt pauses the "
        "decodes); decode_first: TGI's router (see waiting_served_ratio, max_waiting_steps)")
    waiting_served_ratio: float = Field(
        1.2, ge=0, description="decode_first: prefill while decoding only when at least this many "
        "admissible prompts per running request wait")
    max_waiting_steps: int = Field(
        20, ge=1, description="decode_first: after this many steps since the last prefill, admit "
        "whatever fits")


@register_policy
class ContinuousBatching(Policy):
    name = "continuous"
    supports_speculation = True
    Options: ClassVar[type[PolicyOptions]] = ContinuousOptions
    options: PolicyOptions
    """:class:`ContinuousOptions` here and in ``sjf``; ``priority``, which has its own admission
    loop, has its own knobs and no ``order`` knob."""

    def __init__(self, replica: ReplicaState, options: PolicyOptions) -> None:
        super().__init__(replica, options)
        self._order = options if isinstance(options, ContinuousOptions) else None
        self._decode_first = self._order is not None and self._order.order == "decode_first"
        self._steps_since_prefill = 0
        keys = self.admission_keys()
        if keys is not None:
            replica.waiting = KeyedQueue(keys)

    def admission_keys(self) -> np.ndarray | None:
        """Per-request order of the waiting queue (smaller first, ties by arrival), or None for
        first come first served. Subclasses (``sjf``, ``priority``) override only this to change
        whom admission serves next; budgets, KV rules and preemption stay the same."""
        return None

    fast_forwards_decodes = True

    def fast_forward_ready(self) -> bool:
        """``decode_first`` admits by a step count that changes within a run: step by step."""
        return not self._decode_first

    def schedule(self, now: float) -> Batch | None:
        return self._admit_prefills(now) or self._decode_running()

    def after_step(self, batch: Batch, finished: np.ndarray, now: float) -> None:
        self._steps_since_prefill = 1 if batch.shape.num_prefills else self._steps_since_prefill + 1

    def after_run(self, batch: Batch, steps: int, finished: np.ndarray, now: float) -> None:
        self._steps_since_prefill += steps

    def _held_back(self, admissible: int) -> bool:
        """decode_first: whether ``admissible`` prompts wait so that the running requests decode."""
        running = int(self.replica.running.size)
        if not self._decode_first or running == 0:
            return False
        assert self._order is not None  # decode_first is an order knob
        if self._steps_since_prefill >= self._order.max_waiting_steps:
            return False
        return admissible < int(running * self._order.waiting_served_ratio)

    def _admit_prefills(self, now: float) -> Batch | None:
        replica = self.replica
        if not replica.waiting:
            return None
        room = replica.admission_room()
        for request in replica.waiting:
            if replica.try_admit(room, request) is None:
                break
        if not room.ids or self._held_back(len(room.ids)):
            return None
        if len(room.ids) == 1:  # most admissions start one prompt
            request, tokens = room.ids[0], room.new_tokens[0]
            ids, new = replica.commit(room, now)
            return Batch.of_one(ids, new, int(replica.requests.computed[request]), tokens)
        ids, new = replica.commit(room, now)
        computed = replica.requests.computed[ids]
        return Batch.of(ids, new, computed, computed + new)

    def _decode_running(self) -> Batch | None:
        replica = self.replica
        running = replica.running
        if running.size == 0:
            return None
        r, pool = replica.requests, replica.pool
        context = r.computed[running]
        # Speculative decoding: each request also verifies its proposals (None: plain decoding).
        proposed = None if replica.speculation is None else replica.proposals_for(
            running, replica.limits.max_num_batched_tokens - int(running.size))
        # The tokens computed this step need slots: ceil((context + 1 [+ proposals]) / block_size).
        need = blocks_for(context if proposed is None else context + proposed, pool.block_size,
                          plus=1) - pool.held[running]
        needed = sum(need.tolist()) if need.size <= 64 else int(need.sum())  # (Python's: cheaper on a few)
        shortfall = needed - pool.free
        preempted = 0
        if shortfall > 0:
            # Preempt from the tail until the rest fit, as chunked_prefill and prefill_first do:
            # with prefix caching a victim's blocks shared with others stay held, so one pass of
            # the estimate can fall short.
            while shortfall > 0 and replica.running.size:
                preempted += replica.preempt_tail_until(shortfall, need)
                need = need[:replica.running.size]
                shortfall = int(need.sum()) - pool.free
            running = replica.running
            if running.size == 0:
                return None
            context = context[:running.size]
            needed = int(need.sum())
            if proposed is not None:
                proposed = proposed[:running.size]
        pool.grow_many(running, need, needed)
        if proposed is None:
            return Batch.decodes(running, context, preempted)
        return Batch.speculative_decodes(running, context, proposed,
                                         replica.plan_speculation(running, proposed), preempted)
