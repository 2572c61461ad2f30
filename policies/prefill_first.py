"""``prefill_first``: SGLang's scheduler: prefill batches run alone, chunked, with a reservation.

SGLang (``python/sglang/srt/managers/scheduler.py``, ``get_next_batch_to_run``) forms a prefill
("extend") batch whenever it can, and runs it instead of the decode batch: the running requests
wait for that step, as in vLLM V0, but a prompt is split into chunks of at most
``chunked_prefill_size`` tokens (the step budget here, ``max_num_batched_tokens``), so one long
prompt stalls the decodes for one chunk, not for the whole prompt. A partially prefilled request
continues first in the next prefill batch; then waiting requests join first come first served
(``schedule_policy: fcfs``) until the budget is spent, the last one with a partial chunk. With no
prefill to run, every running request decodes one token. ``mixed: true`` is SGLang's
``--enable-mixed-chunk``: the decodes run in the prefill batch too.

Admission reserves memory for the tokens the running requests will still generate
(``PrefillAdder``): a new request joins only if its prompt plus all its output tokens fit in the
free KV memory after ``new_token_ratio`` of every running request's remaining output tokens is set
aside. The ratio starts at ``init_new_token_ratio`` (SGLang's ``SGLANG_INIT_NEW_TOKEN_RATIO``, 0.7),
falls by ``(init - min) / new_token_ratio_decay_steps`` per decode step down to ``init *
min_new_token_ratio_factor`` (0.14, over 600 steps), and returns to its start whenever a decode
step runs out of memory and has to retract requests (preempted by recompute from the tail, like
vLLM). Outputs are known here; SGLang knows each request's ``max_new_tokens``, which the
fixed-length benchmarks this engine is measured with set to the output length (``ignore_eos``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar

import numpy as np
from pydantic import Field

from servesim.core.kv_cache import blocks_for
from servesim.core.replica_state import ReplicaState
from servesim.core.state import RequestState
from servesim.policies.base import Batch, Policy, PolicyOptions, register_policy


class PrefillFirstOptions(PolicyOptions):
    mixed: bool = Field(False, description="SGLang --enable-mixed-chunk: decodes join prefill batches")
    init_new_token_ratio: float = Field(
        0.7, gt=0, le=1, description="share of running requests' remaining outputs reserved at first")
    min_new_token_ratio_factor: float = Field(
        0.14, gt=0, le=1, description="the reserved share decays to init * this")
    new_token_ratio_decay_steps: int = Field(600, ge=1, description="decode steps the decay takes")


@register_policy
class PrefillFirst(Policy):
    name = "prefill_first"
    Options: ClassVar[type[PolicyOptions]] = PrefillFirstOptions
    chunks_prefills = True
    fast_forwards_decodes = True
    """A pure-decode step that admitted nobody repeats while no prompt is in progress and the
    first waiting request does not fit; as ``new_token_ratio`` decays, the reservation shrinks
    and it may fit later, so :meth:`run_limit` ends the run before the step where it could."""

    def __init__(self, replica: ReplicaState, options: PolicyOptions) -> None:
        super().__init__(replica, options)
        assert isinstance(options, PrefillFirstOptions)
        self._init_ratio = options.init_new_token_ratio
        self._min_ratio = options.init_new_token_ratio * options.min_new_token_ratio_factor
        self._decay = (self._init_ratio - self._min_ratio) / options.new_token_ratio_decay_steps
        self._mixed = options.mixed
        self.new_token_ratio = self._init_ratio

    def schedule(self, now: float) -> Batch | None:
        preempted = 0
        while True:
            batch = self._prefill_batch(now) or self._decode_batch()
            if batch is not None or self.replica.running.size == 0:
                break
            # Only prompts in progress remain and the pool cannot hold their next chunks: retract
            # the newest (SGLang's retract_decode) so that the older ones can go on.
            preempted += self.replica.preempt_tail_until(1)
            self.new_token_ratio = self._init_ratio
        if batch is not None and preempted:
            batch = replace(batch, preempted=batch.preempted + preempted)
        return batch

    def after_step(self, batch: Batch, finished: np.ndarray, now: float) -> None:
        if batch.shape.num_prefills == 0:
            self.new_token_ratio = max(self._min_ratio, self.new_token_ratio - self._decay)

    def after_run(self, batch: Batch, steps: int, finished: np.ndarray, now: float) -> None:
        """``steps`` decode steps: the ratio decays once per step, as after each of them."""
        self.new_token_ratio = self._decayed(steps)[-1]

    def _decayed(self, steps: int) -> list[float]:
        """The ratio after 0, 1, ..., ``steps`` more decode steps (the same subtractions as
        :meth:`after_step`, in turn, so the same floats)."""
        ratios = [self.new_token_ratio]
        ratio, floor, decay = ratios[0], self._min_ratio, self._decay
        for _ in range(steps):
            if ratio == floor:
                ratios.extend([floor] * (steps + 1 - len(ratios)))
                break
            ratio = max(floor, ratio - decay)
            ratios.append(ratio)
        return ratios

    def run_limit(self, batch: Batch) -> Callable[[int, np.ndarray], int] | None:
        """Steps of a run continuing the pure-decode ``batch`` before the first waiting request
        could be admitted: step ``j`` tries it with the ratio decayed ``j`` times, the running
        requests' outputs ``j`` tokens shorter and the free blocks the run left (a prefix-cache
        eviction only raises its need, so its need now is a lower bound). None while nothing
        waits (an arrival ends the run) or no budget is left for prompts; a run with a prompt in
        progress, or more running than decoding, is not a run (no steps)."""
        replica = self.replica
        if batch.ids.size != replica.running.size:
            return lambda steps, free: 0
        budget = replica.limits.max_num_batched_tokens - (int(batch.ids.size) if self._mixed else 0)
        if not replica.waiting or budget <= 0:
            return None
        r, pool = replica.requests, replica.pool
        need = self._admission_need(replica.waiting[0])
        running = replica.running
        left0 = int(np.maximum(r.output[running] - r.generated[running], 0).sum())
        n = int(running.size)

        def limit(steps: int, free: np.ndarray) -> int:
            # As _reserved_blocks at step j (no prompt left to compute: every request decodes).
            ratios = np.array(self._decayed(steps - 1))
            left = (left0 - n * np.arange(steps, dtype=np.int64)).astype(np.float64)
            reserved = np.ceil(ratios * left / pool.block_size).astype(np.int64)
            fits = np.flatnonzero(need <= free[1:] - reserved[1:])
            return steps if fits.size == 0 else int(fits[0]) + 1

        return limit

    # ------------------------------------------------------------------ prefill batches
    def _prefill_batch(self, now: float) -> Batch | None:
        replica = self.replica
        budget = replica.limits.max_num_batched_tokens
        decoding = self._decoding() if self._mixed else replica.running[:0]
        # Mixed batches count the decodes' tokens against the chunk (SGLang's PrefillAdder).
        budget -= int(decoding.size)
        ids, new = self._continue_partial(budget)
        spent = int(new.sum())
        admitted, chunks = self._admit(now, budget - spent)
        if admitted.size:
            ids, new = np.concatenate((ids, admitted)), np.concatenate((new, chunks))
        if ids.size == 0:
            return None
        if decoding.size:
            grown = self._grow_decodes(decoding)
            ids = np.concatenate((ids, grown))
            new = np.concatenate((new, np.ones(grown.size, dtype=np.int64)))
        r = replica.requests
        return Batch.of(ids, new, r.computed[ids], r.prompt[ids] + r.generated[ids])

    def _continue_partial(self, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """Running requests still in their prompt get the next chunk, in order, within budget."""
        replica = self.replica
        running = replica.running
        empty = np.empty(0, dtype=np.int64)
        if running.size == 0 or budget <= 0:
            return empty, empty
        r, pool = replica.requests, replica.pool
        remaining = r.prompt[running] + r.generated[running] - r.computed[running]
        partial = ~_decoding_mask(r, running)
        if not partial.any():
            return empty, empty
        ids, left = running[partial], remaining[partial]
        before = np.cumsum(left) - left
        chunk = np.clip(budget - before, 0, left)
        keep = chunk > 0
        ids, chunk = ids[keep], chunk[keep]
        need = np.maximum(blocks_for(r.computed[ids] + chunk, pool.block_size) - pool.held[ids], 0)
        fits = np.cumsum(need) <= pool.free
        ids, chunk, need = ids[fits], chunk[fits], need[fits]
        pool.grow_many(ids, need, int(need.sum()))
        return ids, chunk

    def _reserved_blocks(self) -> int:
        """Blocks set aside for the running requests: the rest of the prompts in progress, and
        ``new_token_ratio`` of their future outputs."""
        replica = self.replica
        running = replica.running
        if running.size == 0:
            return 0
        r = replica.requests
        prompt_left = np.maximum(r.prompt[running] - r.computed[running], 0)
        left = np.maximum(r.output[running] - r.generated[running], 0)
        tokens = prompt_left.sum() + self.new_token_ratio * left.sum()
        return int(np.ceil(tokens / replica.pool.block_size))

    def _admit(self, now: float, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """Admit waiting requests FCFS, each with its first chunk, while its prompt and all its
        output tokens fit after the reservation."""
        replica = self.replica
        if not replica.waiting or budget <= 0:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty
        pool = replica.pool
        room = replica.admission_room(budget)
        available = pool.free - self._reserved_blocks()
        for request in replica.waiting:
            need = self._admission_need(request)
            if need > available or replica.try_admit(room, request, max_new=room.budget) is None:
                break
            available -= need
        return replica.commit(room, now)

    def _admission_need(self, request: int) -> int:
        """Blocks ``request`` needs to be admitted: its prompt's, and those of all its outputs."""
        replica = self.replica
        r, block_size = replica.requests, replica.pool.block_size
        _, prompt_blocks = replica.prefill_need(request)
        total = int(r.prompt[request] + r.output[request]) - 1
        return prompt_blocks + int(blocks_for(total, block_size)) - int(
            blocks_for(int(r.prompt[request] + r.generated[request]), block_size))

    # ------------------------------------------------------------------ decode batches
    def _decoding(self) -> np.ndarray:
        running = self.replica.running
        return running[_decoding_mask(self.replica.requests, running)]

    def _grow_decodes(self, decoding: np.ndarray) -> np.ndarray:
        """Give each decode the block its next token needs, retracting from the tail if short."""
        replica = self.replica
        pool = replica.pool
        need = blocks_for(replica.requests.computed[decoding], pool.block_size, plus=1) - pool.held[decoding]
        shortfall = int(need.sum()) - pool.free
        if shortfall > 0:
            return decoding[:0]
        pool.grow_many(decoding, need, int(need.sum()))
        return decoding

    def _decode_batch(self) -> Batch | None:
        """Every running request past its prompt decodes one token; when the pool cannot give
        each the block its next token needs, requests are retracted from the tail."""
        replica = self.replica
        pool = replica.pool
        preempted = 0
        while True:
            running = replica.running
            if running.size == 0:
                return None
            r = replica.requests
            context = r.computed[running]
            decoding = _decoding_mask(r, running)
            need = np.where(decoding, blocks_for(context, pool.block_size, plus=1) - pool.held[running], 0)
            shortfall = int(need.sum()) - pool.free
            if shortfall <= 0:
                break
            preempted += replica.preempt_tail_until(shortfall, need)
            self.new_token_ratio = self._init_ratio
        ids = running[decoding]
        if ids.size == 0:
            return None
        pool.grow_many(ids, need[decoding], int(need.sum()))
        return Batch.decodes(ids, context[decoding], preempted)


def _decoding_mask(r: RequestState, ids: np.ndarray) -> np.ndarray:
    """Which of ``ids`` decode: one token left to compute, and past their first output token (a
    prompt's last chunk of one token samples the first one: a prefill)."""
    return (r.prompt[ids] + r.generated[ids] - r.computed[ids] == 1) & (r.generated[ids] > 0)
