"""One step of a replica with pipeline stages and data-parallel attention ranks.

A step here is one micro-batch: each of the replica's ``dp`` ranks contributes its own batch (or
none), and together they pass through the ``pp`` stages. Per stage (:class:`ParallelCostModel`):

- every rank runs the stage's layers on its own tokens (attention over its own KV cache, dense
  MLPs, the router, the shared experts; :meth:`CostModel.step_record`);
- the routed experts run once for all ranks' tokens together (:meth:`CostModel.moe_part`: the
  busiest expert rank's GEMMs plus the dispatch and combine);
- every MoE layer is a barrier (its all-to-all or all-gather needs every rank), so the stage
  takes the slowest rank's time plus the shared experts: **the slowest-rank rule**, as vLLM and
  SGLang synchronise DP ranks (an idle rank runs a dummy batch and waits). A faster rank's wait is
  booked as communication, where it is spent.

Then the activations go to the next stage (:func:`servesim.cost.pipeline.send_s`). A step's
serving-engine overhead (scheduling, sampling) is CPU time outside the stages: the replica loop
adds it before the micro-batch enters the first stage, so with several micro-batches in flight
it overlaps the other micro-batches' GPU work.

With data-parallel attention ranks and speculative decoding (one stage; MTP on DeepSeek with
attention DP is SGLang's and TensorRT-LLM's high-throughput recipe), each rank verifies its own
proposals and runs its own proposer passes over its own batch after the target's pass
(:class:`~servesim.cost.speculative.SpeculativeCost` per rank, at the rank's TP), so the
slowest-rank rule takes the rank whose target pass plus proposer passes is longest. The proposer's
own MoE layer is priced per rank at the rank's TP (its experts are not spread over the ranks as the
target's are): an approximation that overprices a MoE proposer a little, stated here.

With one stage (data-parallel attention ranks: vLLM's ``--data-parallel-size``, SGLang's
``--enable-dp-attention``) each rank is an engine process of its own, and the engine's CPU model
applies per rank as it does to one TP group (:mod:`servesim.cost.engine_runtime`): each rank's
CPU time is a function of its own batch, an overlapping engine (vLLM V1's async scheduling,
SGLang's and TensorRT-LLM's overlap schedulers) hides it under the GPU step, so the step takes
``max(GPU, the slowest rank's CPU)``, a serial one adds it, and the part no overlap hides is added
last. CUDA-graph padding and launch costs are not applied to these ranks (their kernels are priced
on the real tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.cost.batch import BatchShape
from servesim.cost.pipeline import send_s
from servesim.cost.step_cost import CostModel, StepRecord
from servesim.dtypes import Precision
from servesim.engines.base import RuntimeCosts
from servesim.hardware import HardwareProfile
from servesim.model_spec import ModelSpec
from servesim.parallelism import Parallelism, placement, stages_of

if TYPE_CHECKING:
    from servesim.cost.speculative import SpeculativeCost
    from servesim.speculative.plan import SpeculationPlan


@dataclass(frozen=True, slots=True)
class ParallelStep:
    """A priced micro-batch: how long each stage is busy with it, each send after a stage, and
    each rank's record over the whole pass (None for a rank with no batch). A rank's record
    sums the stages, the sends and the engine overhead (``overhead_s``); waits for a busy stage
    are the replica loop's to add."""

    stage_s: tuple[float, ...]
    send_s: tuple[float, ...]
    overhead_s: float
    ranks: tuple[StepRecord | None, ...]
    rank_wait_s: float = 0.0
    """Seconds the ranks with a batch spent waiting for the slowest one, summed over ranks and
    stages (the slowest-rank rule's cost)."""

    @property
    def time_s(self) -> float:
        """Single micro-batch latency with every stage free: the sum of its stages and sends."""
        return self.overhead_s + sum(self.stage_s) + sum(self.send_s)


class ParallelCostModel:
    """Prices micro-batches on one replica of ``pp`` stages x ``dp`` ranks of ``tp`` GPUs."""

    def __init__(self, model: ModelSpec, hardware: HardwareProfile, parallelism: Parallelism,
                 precision: Precision, runtime: RuntimeCosts,
                 speculation: SpeculationPlan | None = None) -> None:
        """``speculation``: the group's speculative decoding (one stage only: the group refuses it
        with pipeline stages), whose proposer passes each rank adds to its own step."""
        self.parallelism = parallelism
        self.model = model
        kernels = RuntimeCosts.none()
        self.stages = [CostModel(model, hardware, parallelism.tp, precision, kernels, parallelism, stage)
                       for stage in stages_of(model, parallelism)]
        if speculation is not None and len(self.stages) > 1:
            raise ValueError("speculative decoding is not modelled with pipeline stages")
        self._pricers: list[CostModel | SpeculativeCost] = (
            list(self.stages) if speculation is None else [speculation.cost(stage) for stage in self.stages])
        """What prices each rank's part of each stage: the stage's cost model, with the proposer's
        passes when the group speculates."""
        self.runtime = runtime
        self.overhead_s = runtime.step_overhead_s
        where = placement(hardware, parallelism)
        self.send_links = [where.stage_send_link(parallelism, s) for s in range(parallelism.pp - 1)]
        self.fast = hardware.interconnect

    def price(self, shapes: Sequence[BatchShape | None]) -> ParallelStep:
        """One micro-batch of ``shapes`` (one per DP rank; None: that rank has nothing to run)."""
        tokens = [shape.num_new_tokens if shape is not None else 0 for shape in shapes]
        total, widest = sum(tokens), max(tokens)
        stage_times, sends = [], []
        waits = 0.0
        per_rank: list[list[StepRecord]] = [[] for _ in shapes]
        for index, (cost, pricer) in enumerate(zip(self.stages, self._pricers, strict=True)):
            records = [pricer.step_record(shape) if shape is not None else None for shape in shapes]
            slowest = max(r.time_s for r in records if r is not None)
            shared_gemm = shared_elem = shared_comm = shared_flops = shared_bytes = 0.0
            if cost.shares_experts:
                ops, shared_comm = cost.moe_part(total)
                for op in ops:
                    if op.name == "moe":
                        shared_gemm += op.time_s
                    else:
                        shared_elem += op.time_s
                    shared_flops += op.flops
                    shared_bytes += op.bytes
            stage_s = slowest + shared_gemm + shared_elem + shared_comm
            stage_times.append(stage_s)
            for rank, record in enumerate(records):
                if record is None:
                    continue
                wait = slowest - record.time_s
                waits += wait
                per_rank[rank].append(record._replace(
                    time_s=stage_s, flops=record.flops + shared_flops,
                    hbm_bytes=record.hbm_bytes + shared_bytes, gemm_s=record.gemm_s + shared_gemm,
                    elementwise_s=record.elementwise_s + shared_elem,
                    communication_s=record.communication_s + shared_comm + wait))
            if index < len(self.send_links):
                sends.append(send_s(widest, self.model.hidden_size, self.parallelism.tp,
                                    self.send_links[index], self.fast))
        send_total = sum(sends)
        overhead = self.overhead_s if len(self.stages) > 1 else self.ranks_host_s(shapes, stage_times[0])
        ranks = tuple(_merge(records, send_total, overhead) if records else None
                      for records in per_rank)
        return ParallelStep(tuple(stage_times), tuple(sends), overhead, ranks, waits)

    def ranks_host_s(self, shapes: Sequence[BatchShape | None], gpu_s: float) -> float:
        """Engine time a one-stage step adds to its GPU time ``gpu_s``: the slowest rank's CPU
        time, all of it for a serial engine and what exceeds the GPU step for an overlapping one,
        plus the slowest rank's part that no overlap hides."""
        runtime = self.runtime
        counts = [(s.num_prefills + s.num_decodes, s.num_new_tokens, s.num_logits)
                  for s in shapes if s is not None]
        cpu = max(runtime.cpu_s(*c) for c in counts)
        exposed = max(0.0, cpu - gpu_s) if runtime.overlap else cpu
        if runtime.has_serial:
            exposed += max(runtime.serial_s(*c) for c in counts)
        return exposed

    def step_time(self, shapes: Sequence[BatchShape | None]) -> float:
        """One micro-batch's latency through free stages (what a lone request sees per step)."""
        return self.price(shapes).time_s


def _merge(records: list[StepRecord], send_s: float, overhead_s: float) -> StepRecord:
    """One rank's record over all stages, with the sends as communication and the engine's
    per-step overhead; its bound is that of its longest stage."""
    longest = max(records, key=lambda r: r.time_s)
    return StepRecord(
        time_s=sum(r.time_s for r in records) + send_s + overhead_s, bound=longest.bound,
        flops=sum(r.flops for r in records), hbm_bytes=sum(r.hbm_bytes for r in records),
        gemm_s=sum(r.gemm_s for r in records), attn_prefill_s=sum(r.attn_prefill_s for r in records),
        attn_decode_s=sum(r.attn_decode_s for r in records),
        elementwise_s=sum(r.elementwise_s for r in records),
        communication_s=sum(r.communication_s for r in records) + send_s,
        overhead_s=sum(r.overhead_s for r in records) + overhead_s,
        proposal_s=sum(r.proposal_s for r in records), verify_extra_s=sum(r.verify_extra_s for r in records))
