"""``static``: request-level batching, as FasterTransformer and early HF TGI / ``generate()`` ran.

A batch is formed only when the replica is idle: the waiting requests, first come first served,
up to ``batch_size`` of them (default ``max_num_seqs``), as soon as that many are waiting, the
next one does not fit in the KV pool, or ``timeout_s`` has passed since the oldest waiting
request arrived (Triton's dynamic batcher ``max_queue_delay``; its default 0 sends whatever is
waiting the moment the GPU is free). Nothing joins a running batch, and the batch runs until its
longest member has emitted its last token.

KV memory is reserved up front, contiguous and unpaged, for the longest each member may grow:
``prompt + max_output - 1`` tokens (the last output token is never cached), rounded up to whole
blocks. ``max_output`` is ``max_model_len - prompt`` by default (FasterTransformer allocates its
cache for ``max_seq_len``), or the ``max_output_tokens`` knob (a client's ``max_new_tokens``); a
request whose own output is longer reserves its own length, since the simulator never truncates
an output. ``reserve: exact`` reserves exactly ``prompt + output - 1`` (an oracle that knows each
output length). A reservation never exceeds the pool: a pool smaller than one ``max_model_len``
sequence caps what a static engine could reserve. No request grows or is ever preempted.

The prefill runs as one step per batch, every prompt padded to the longest (``pad_prompts``;
FasterTransformer's GPT context phase takes a ``[batch, max_input_len]`` tensor), so the padding
is priced as prefill tokens. If the padded prompts exceed the step's token budget
(``max_num_batched_tokens``, which sizes the activation workspace in the memory plan), they run
as several prefill steps, each padded to its own longest prompt, before the batch decodes.

Finished members keep their slot until the batch ends: each decode step prices every member as a
decode row over its cached context (a finished member's context stays where it stopped; the pad
tokens it would append are not counted), but only the live members emit. Their KV reservation is
held until the whole batch is done, so the pool reports what the engine really has allocated.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from servesim.cost.batch import BatchShape
from servesim.errors import ServesimError
from servesim.policies.base import Batch, Policy, PolicyOptions, register_policy

if TYPE_CHECKING:  # the core runs policies; policies only name its types
    from servesim.core.replica_state import EngineLimits, ReplicaState

_EMPTY = np.empty(0, dtype=np.int64)


class StaticOptions(PolicyOptions):
    batch_size: int | None = Field(None, ge=1, description="requests per batch (default: max_num_seqs)")
    timeout_s: float = Field(0.0, ge=0, description="longest the oldest waiting request waits for a "
                             "fuller batch while the replica is idle")
    max_output_tokens: int | None = Field(None, ge=1, description="output tokens each request "
                                          "reserves KV for (default: max_model_len - prompt)")
    reserve: Literal["max_output", "exact"] = Field(
        "max_output", description="max_output: reserve for max_output_tokens; exact: an oracle "
        "that reserves each request's own output length")
    pad_prompts: bool = Field(True, description="price every prompt of a prefill step at the "
                              "longest one's length, as a padded [batch, max_len] tensor")


@register_policy
class StaticBatching(Policy):
    name = "static"
    Options = StaticOptions
    options: StaticOptions
    supports_prefix_caching = False
    prefix_caching_note = ("it reserves and prefills whole prompts itself, as engines before prefix "
                           "caching did")

    @classmethod
    def check_limits(cls, options: StaticOptions, limits: EngineLimits) -> None:
        if options.batch_size is not None and options.batch_size > limits.max_num_seqs:
            raise ServesimError("policy.batch_size", f"{options.batch_size} exceeds "
                                f"deployment.max_num_seqs {limits.max_num_seqs}",
                                f"use at most {limits.max_num_seqs} or raise max_num_seqs")

    def __init__(self, replica: ReplicaState, options: StaticOptions) -> None:
        super().__init__(replica, options)
        self.batch_size = options.batch_size or replica.limits.max_num_seqs
        self._members = _EMPTY      # every request of the running batch, finished or not
        self._unprefilled = _EMPTY  # members whose prompt has not run yet, in order
        self._reserved: dict[int, int] = {}

    # ------------------------------------------------------------------ the policy
    def schedule(self, now: float) -> Batch | None:
        if self._members.size == 0 and not self._form_batch(now):
            return None
        if self._unprefilled.size:
            return self._prefill_step()
        live = self.replica.running
        context = self.replica.requests.computed[self._members]
        ones = np.ones(live.size, dtype=np.int64)
        return Batch(live, ones, BatchShape.decodes_only(context), decode_only=True)

    def wake_at(self, now: float) -> float | None:
        waiting = self.replica.waiting
        if self._members.size or not waiting:
            return None
        return float(self.replica.requests.arrival[waiting[0]]) + self.options.timeout_s

    def after_step(self, batch: Batch, finished: np.ndarray, now: float) -> None:
        pool = self.replica.pool
        if self.replica.running.size == 0 and self._unprefilled.size == 0:
            # The longest member is done: the whole reservation goes back to the pool.
            pool.release_many(self._members)
            self._members = _EMPTY
            self._reserved.clear()
        elif finished.size:
            # The engine freed the finished members' blocks; a static batch keeps their slots.
            blocks = np.fromiter((self._reserved[int(r)] for r in finished), dtype=np.int64,
                                 count=finished.size)
            pool.grow_many(finished, blocks, int(blocks.sum()))

    # ------------------------------------------------------------------ batch formation
    def _form_batch(self, now: float) -> bool:
        """Admit the next batch if it is due; returns whether one was admitted."""
        replica = self.replica
        waiting, free = replica.waiting, replica.pool.free
        if not waiting:
            return False
        admitted: list[int] = []
        blocks: list[int] = []
        kv_full = False
        for request in waiting:
            if len(admitted) == self.batch_size:
                break
            need = self._reservation(request)
            if need > free:
                kv_full = True
                break
            admitted.append(request)
            blocks.append(need)
            free -= need
        deadline = float(replica.requests.arrival[waiting[0]]) + self.options.timeout_s
        due = (len(admitted) == self.batch_size or kv_full
               or now >= deadline or math.isclose(now, deadline, rel_tol=1e-12, abs_tol=1e-12))
        if not due or not admitted:
            return False
        for _ in admitted:
            waiting.popleft()
        replica.admit(admitted, blocks, now)
        self._members = replica.running.copy()
        self._unprefilled = self._members
        self._reserved = dict(zip(admitted, blocks, strict=True))
        return True

    def _reservation(self, request: int) -> int:
        """KV blocks reserved for ``request`` for the whole batch (see the module docstring)."""
        r, lim, pool = self.replica.requests, self.replica.limits, self.replica.pool
        prompt, output = int(r.prompt[request]), int(r.output[request])
        if self.options.reserve == "exact":
            max_output = output
        else:
            cap = self.options.max_output_tokens or lim.max_model_len - prompt
            max_output = max(cap, output)
        reserved = min(pool.blocks_for(prompt + max_output - 1), lim.num_blocks)
        return max(reserved, pool.blocks_for(prompt + output - 1))

    def _prefill_step(self) -> Batch:
        """The next prefill step of the batch: as many unprefilled members, in order, as fit the
        token budget once padded (all of them unless the budget is small)."""
        r = self.replica.requests
        ids = self._unprefilled
        prompts = r.prompt[ids] + r.generated[ids]
        budget = self.replica.limits.max_num_batched_tokens
        if self.options.pad_prompts:
            priced = np.maximum.accumulate(prompts) * np.arange(1, ids.size + 1)
        else:
            priced = np.cumsum(prompts)
        count = max(1, int(np.searchsorted(priced, budget, side="right")))
        step, self._unprefilled = ids[:count], ids[count:]
        new = prompts[:count]
        shape_tokens = np.full(count, int(new.max())) if self.options.pad_prompts else new
        zeros = np.zeros(count, dtype=np.int64)
        shape = BatchShape(shape_tokens.astype(np.int64), zeros, np.ones(count, dtype=bool),
                           np.empty(0, dtype=np.int64))
        return Batch(step, new.astype(np.int64), shape)
