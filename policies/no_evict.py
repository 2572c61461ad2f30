"""``no_evict``: TensorRT-LLM's in-flight batching under its ``GUARANTEED_NO_EVICT`` scheduler.

TensorRT-LLM's executor (``tensorrt_llm/_torch/pyexecutor/scheduler.py``) schedules in two
stages. The capacity scheduler's default policy, ``GUARANTEED_NO_EVICT``, starts a request only
when the KV cache can hold everything it will ever need (prompt plus its maximum new tokens)
on top of what the requests already in flight will still need, so a started request is never
evicted. The micro-batch scheduler then fills each iteration up to ``max_num_tokens`` (the step
budget here) and ``max_batch_size`` (seats): every generating request one token, then context
(prompt) phases in order. Without ``enable_chunked_prefill`` (TensorRT-LLM's default) a context
runs whole or waits; a prompt longer than the whole budget, which TensorRT-LLM refuses, is
chunked here instead so that it is served (raise ``max_num_batched_tokens`` to avoid it).
Contexts and generations share one step (in-flight batching), as in ``chunked_prefill``, whose
planning and preemption this policy reuses; preemption happens here only when prefix-cache
hits made an estimate optimistic.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import Field

from servesim.core.kv_cache import blocks_for
from servesim.policies.base import PolicyOptions, register_policy
from servesim.policies.chunked_prefill import ChunkedPrefill


class NoEvictOptions(PolicyOptions):
    enable_chunked_prefill: bool = Field(
        False, description="TensorRT-LLM enable_chunked_prefill: split prompts across steps")


@register_policy
class NoEvict(ChunkedPrefill):
    name = "no_evict"
    Options: ClassVar[type[PolicyOptions]] = NoEvictOptions
    chunks_prefills = True
    """The budget may be below max_model_len (TensorRT-LLM's max_num_tokens is 8192 by default)."""

    def _reserved_blocks(self) -> int:
        """Blocks the running requests will still take: up to their last token's KV."""
        replica = self.replica
        running = replica.running
        if running.size == 0:
            return 0
        r, pool = replica.requests, replica.pool
        final = blocks_for(r.prompt[running] + r.output[running] - 1, pool.block_size)
        return int(np.maximum(final - pool.held[running], 0).sum())

    def _admit_waiting(self, now: float, budget: int) -> tuple[np.ndarray, np.ndarray]:
        replica = self.replica
        options = self.options
        assert isinstance(options, NoEvictOptions)
        r, pool = replica.requests, replica.pool
        room = replica.admission_room(budget)
        available = pool.free - self._reserved_blocks()
        whole_budget = replica.limits.max_num_batched_tokens
        for request in replica.waiting:
            new, prompt_blocks = replica.prefill_need(request)
            grows = (int(blocks_for(int(r.prompt[request] + r.output[request]) - 1, pool.block_size))
                     - int(blocks_for(int(r.prompt[request] + r.generated[request]), pool.block_size)))
            need = prompt_blocks + max(grows, 0)
            if need > available:
                break
            chunked = options.enable_chunked_prefill or new > whole_budget
            if not chunked and new > room.budget:
                break
            if replica.try_admit(room, request, max_new=room.budget if chunked else None) is None:
                break
            available -= need
        return replica.commit(room, now)
