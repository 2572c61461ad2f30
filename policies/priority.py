"""``priority``: priority classes over continuous batching, as vLLM's ``--scheduling-policy
priority`` (v0 scheduler: ``_schedule_priority_preemption``).

A request's ``priority`` (the workload's column; lower is more important, vLLM's convention)
orders everything:

- admission serves the waiting queue by (priority, arrival) instead of arrival alone;
- the running requests are kept in (priority, arrival) order, so preemption under memory
  pressure takes the lowest-priority, latest-arrived first;
- a waiting request that does not fit (KV blocks after the watermark, or a seat) may preempt
  running requests of strictly lower priority to get in. As in vLLM it only ever looks for
  victims with lower priority than its own; unlike vLLM v0, it preempts nobody when preempting
  all of them would still not make room (v0 would preempt them and then admit nothing).

Everything else is :class:`~servesim.policies.continuous.ContinuousBatching`: whole prompts, prefill
steps apart from decode steps, the same budgets and watermark.

Preemption mode (``preemption_mode:``), vLLM v0's two: ``recompute`` forgets a victim's KV and
later recomputes its context as one prefill; ``swap`` copies its blocks to host memory
(``swap_space_gib`` per GPU, vLLM's ``--swap-space``, default 4) and back before it decodes
again, the copy time (bytes over the profile's ``host_link``: PCIe) added to those steps
(:mod:`servesim.core.swap`). A victim that does not fit in the host space is recomputed. A
swapped-out request waits in the same queue as the others and, when its turn comes, is swapped
in instead of prefilled: it takes a seat and its blocks, but no prefill tokens, and decodes in
the next decode step.

When is swapping worth it? Swapping ``L`` tokens costs ``2 (L b / B + latency)`` (out and in,
``b`` KV bytes per token per GPU, ``B`` the achieved PCIe bandwidth); recomputing costs the prefill
of ``L`` tokens. For Llama-3-8B on an H100 (b = 128 KiB, B = 64 GB/s x 0.86) that is 4.8 us per
token against ~25 us per token of compute-bound prefill, so long contexts swap far cheaper; a
short recompute that shares a memory-bound step costs almost nothing, which swapping's fixed
latency and copies do not beat (tests/test_policy_priority.py works the crossover out).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from servesim.core.swap import HostSwap
from servesim.errors import ServesimError
from servesim.policies.base import Batch, PolicyOptions, register_policy
from servesim.policies.continuous import ContinuousBatching

if TYPE_CHECKING:  # the core runs policies; policies only name its types
    from servesim.core.replica_state import ReplicaState


class PriorityOptions(PolicyOptions):
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    swap_space_gib: float = Field(4.0, ge=0, description="host memory per GPU for swapped KV (GiB)")


@register_policy
class PriorityScheduling(ContinuousBatching):
    name = "priority"
    fast_forwards_decodes = False
    """A waiting request may preempt lower-priority running ones at any step: step by step."""
    Options = PriorityOptions
    options: PriorityOptions

    def __init__(self, replica: ReplicaState, options: PriorityOptions) -> None:
        priority = replica.requests.table.priority
        assert priority is not None  # RequestTable.__post_init__ fills it in
        self.priority = priority  # before the base's __init__, which calls admission_keys
        super().__init__(replica, options)
        self._carried_s = 0.0
        self._preempt_count = 0
        if self.options.preemption_mode == "swap":
            path = replica.limits.swap_path
            if path is None:
                raise ServesimError("policy.preemption_mode", "swap needs the deployment's host link",
                                    "build the engine limits with servesim.topology (resolve_group)")
            replica.swap = HostSwap(path, self.options.swap_space_gib, len(replica.requests))

    def admission_keys(self) -> np.ndarray:
        return self.priority.astype(np.float64)

    def schedule(self, now: float) -> Batch | None:
        self._preempt_count = 0
        batch = self._admit_prefills(now) or self._decode_running()
        forced = self._preempt_count
        swap = self.replica.swap
        if batch is None:
            # Nothing runs (every running request was preempted): the copies already made are
            # owed by the next step.
            if swap is not None:
                self._carried_s += swap.take_seconds()
            return None
        extra = self._carried_s + (swap.take_seconds() if swap is not None else 0.0)
        self._carried_s = 0.0
        if forced or extra:
            batch = replace(batch, preempted=batch.preempted + forced, extra_s=extra)
        return batch

    def _admit_prefills(self, now: float) -> Batch | None:
        replica = self.replica
        waiting, pool, swap = replica.waiting, replica.pool, replica.swap
        if not waiting:
            return None
        room = replica.admission_room()
        admitted: list[int] = []
        blocks: list[int] = []
        prefills: list[int] = []
        new_tokens: list[int] = []
        swapped_in: list[int] = []
        victims: set[int] = set()
        while waiting:
            request = waiting[0]
            if request in victims:  # never bring back in the step that preempted it
                break
            if swap is not None and swap.holds(request):
                new, need = 0, int(swap.pool.held[request])
            else:
                new, need = replica.prefill_need(request)
            if new > room.budget:
                break
            if not room.blocks_fit(need) or room.seats < 1:
                preempted = self._preempt_lower(request, need - (room.free - room.reserve), 1 - room.seats)
                if preempted.size == 0:
                    break
                victims.update(preempted.tolist())
                room.free = pool.free - sum(blocks)
                room.seats += int(preempted.size)
            waiting.popleft()
            admitted.append(request)
            blocks.append(need)
            if new:
                prefills.append(request)
                new_tokens.append(new)
            else:
                swapped_in.append(request)
            room.take(new, need)
        if not admitted:
            return None
        if swapped_in:
            assert swap is not None
            ids = np.array(swapped_in, dtype=np.int64)
            swap.swap_in(ids)
            replica.requests.swaps_in[ids] += 1
        replica.admit(admitted, blocks, now)
        self._sort_running()
        if not prefills:
            return None  # only swap-ins: they decode with the others in this step
        ids = np.array(prefills, dtype=np.int64)
        tokens = np.array(new_tokens, dtype=np.int64)
        computed = replica.requests.computed[ids]
        return Batch.of(ids, tokens, computed, computed + tokens)

    def _preempt_lower(self, request: int, blocks_short: int, seats_short: int) -> np.ndarray:
        """Preempt the fewest running requests of lower priority than ``request`` (from the tail:
        lowest priority, latest arrival) that make room for it; none if all of them would not."""
        replica = self.replica
        running = replica.running
        ranks = self.priority[running]
        lower = int(running.size - np.searchsorted(ranks, self.priority[request], side="right"))
        if lower == 0:
            return running[:0]
        count = max(seats_short, 0)
        if blocks_short > 0:
            count = max(count, replica.tail_relief_count(blocks_short, among=lower))
        if count > lower:
            return running[:0]
        self._preempt_count += count
        return replica.preempt_tail(count)

    def _sort_running(self) -> None:
        running = self.replica.running
        self.replica.running = running[np.lexsort((running, self.priority[running]))]
