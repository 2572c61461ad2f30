"""The price of a speculative step: the target's verification pass plus the proposer's passes.

**Verification** is the target's ordinary pass over a batch whose decodes compute ``1 + k``
tokens each (:class:`~servesim.cost.batch.BatchShape` ``decode_tokens``): the GEMMs get ``k``
more rows per request and the LM head ``k`` more logits, attention reads each request's cache once
for its ``1 + k`` queries. At a small batch every GEMM is memory-bound, so the extra rows are
almost free; at a large batch the step is compute-bound and they cost in proportion.

**Proposals** come from a second network (:class:`ProposerPasses`): a draft model, or an EAGLE
head / MTP layer, which is one or a few layers shaped like the target's. As vLLM v1 runs them
after the target's pass in the same step (no overlap):

1. the first pass runs over the same tokens as the target (prompt chunks, and each verifying
   request's ``1 + k`` tokens), so that the proposer's own KV cache keeps up, and samples one
   proposal per request (one logits row each);
2. then ``k - 1`` more passes, one token per request that proposes that many.

The proposer's kernels are priced by its own :class:`~servesim.cost.step_cost.CostModel` (same
GPU, precision and roofline rule, no engine overhead: the engine's per-step cost is the target
step's), plus the GEMMs its model spec does not hold (EAGLE's fusion of features and embeddings,
MTP's projection). With n-gram lookup there is no proposer pass (the lookup runs on the CPU; its
time is not modelled).

The engine's software adds time too (:class:`~servesim.engines.base.SpeculationDefaults`): per step
that verifies (rejection sampling, proposal bookkeeping) and per proposer pass (its input
preparation, launch and sampling). The step's record adds all of it as ``proposal_s`` (an operator
class of its own: everything speculation adds outside the target's pass) and says how much of the
target's pass the verification tokens cost beyond plain decoding (``verify_extra_s``). Its
``bound`` is the target pass's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servesim.cost.batch import BatchShape
from servesim.cost.step_cost import CostModel, StepRecord

_NO_TOKENS = np.empty(0, dtype=np.int64)
_NO_EMITS = np.empty(0, dtype=bool)


@dataclass(frozen=True)
class ProposerPasses:
    """A proposer network as the cost model prices it."""

    cost: CostModel
    """Prices one pass of the proposer's layers (with its own LM head and embedding gather)."""
    pass_gemms: tuple[tuple[int, int], ...] = ()
    """(K, N) of GEMMs every pass runs per token beyond the model spec (EAGLE's ``fc`` over
    ``[embedding, feature]``, EAGLE-3's wider attention input, MTP's ``eh_proj``)."""
    first_pass_gemms: tuple[tuple[int, int], ...] = ()
    """(K, N) of GEMMs only the first pass runs (EAGLE-3's fusion of three target layers)."""


@dataclass
class _Work:
    time_s: float = 0.0
    flops: float = 0.0
    hbm_bytes: float = 0.0

    def add(self, record: StepRecord) -> None:
        self.time_s += record.time_s
        self.flops += record.flops
        self.hbm_bytes += record.hbm_bytes


def first_pass_shape(batch: BatchShape) -> BatchShape:
    """The proposer's first pass over a step: the target's tokens, each verifying request's chunk
    as a prompt-like chunk that samples one proposal (one logits row, not ``1 + k``)."""
    if not batch.verifies:
        return batch.without_proposals()
    assert batch.decode_tokens is not None
    verifying = batch.decode_tokens > 1
    chunks, contexts = batch.decode_tokens[verifying], batch.decode_context[verifying]
    return BatchShape(np.concatenate((batch.prefill_tokens, chunks)),
                      np.concatenate((batch.prefill_context, contexts)),
                      np.concatenate((batch.prefill_emits, np.ones(chunks.size, dtype=bool))),
                      batch.decode_context[~verifying])


class SpeculativeCost:
    """Prices an engine's steps when it speculates: the target's :class:`CostModel` and the
    proposer's passes (``None``: n-gram lookup, no GPU work). Same ``step_record`` interface as
    the cost model, so a replica runs it unchanged."""

    def __init__(self, target: CostModel, proposer: ProposerPasses | None, step_overhead_s: float = 0.0,
                 pass_overhead_s: float = 0.0) -> None:
        """``step_overhead_s``: the engine's software time of a step that verifies proposals;
        ``pass_overhead_s``: of each proposer pass (both serial with the GPU, added to
        ``proposal_s``)."""
        self.target = target
        self.proposer = proposer
        self.step_overhead_s = step_overhead_s
        self.pass_overhead_s = pass_overhead_s

    def step_record(self, batch: BatchShape) -> StepRecord:
        record = self.target.step_record(batch)
        if batch.is_empty:
            return record
        extra = 0.0
        if batch.verifies:
            extra = record.time_s - self.target.step_record(batch.without_proposals()).time_s
        work = self.proposal(batch)
        return record._replace(time_s=record.time_s + work.time_s, flops=record.flops + work.flops,
                               hbm_bytes=record.hbm_bytes + work.hbm_bytes, proposal_s=work.time_s,
                               verify_extra_s=extra)

    def proposal(self, batch: BatchShape) -> _Work:
        """What speculation adds to a step running ``batch``: the proposer's passes with their
        software time, and the software time of verifying (n-gram lookup: that alone)."""
        work = _Work()
        verifies = batch.verifies
        if verifies:
            work.time_s += self.step_overhead_s
        proposer = self.proposer
        if proposer is None:
            return work
        cost = proposer.cost
        first = first_pass_shape(batch)
        work.add(cost.step_record(first))
        work.time_s += self.pass_overhead_s
        for k, n in proposer.first_pass_gemms + proposer.pass_gemms:
            self._gemm(work, cost, first.num_new_tokens, k, n)
        if not verifies:
            return work
        assert batch.decode_tokens is not None
        proposals = batch.decode_tokens - 1
        context = batch.decode_context
        for position in range(2, int(proposals.max()) + 1):
            proposing = proposals >= position
            shape = BatchShape.decodes_only(context[proposing] + position)
            work.add(cost.step_record(shape))
            work.time_s += self.pass_overhead_s
            for k, n in proposer.pass_gemms:
                self._gemm(work, cost, shape.num_new_tokens, k, n)
        return work

    @staticmethod
    def _gemm(work: _Work, cost: CostModel, rows: int, k: int, n: int) -> None:
        op = cost.gemm(rows, k, n)
        work.time_s += op.time_s
        work.flops += op.flops
        work.hbm_bytes += op.bytes
