"""How a serving engine's software shapes one step around its GPU kernels.

The cost model prices the kernels; this module adds what the engine does around them
(:class:`~servesim.engines.base.RuntimeCosts`), the one place the two meet:

1. **CUDA graphs.** A step the engine replays from a captured graph is padded up to the next
   capture size: its GEMMs, norms and collectives run that many rows (:meth:`EngineRuntime.plan`
   returns the padded token count the kernels are priced at; attention runs on the real
   requests, whose padded slots hold no context). A graph is launched with one host call
   (``full``); vLLM v1's piecewise graphs launch one graph per layer plus the layer's attention
   kernels eagerly (``piecewise``); a step without a graph launches every kernel from the host
   (``eager``), and each collective call then also pays the profile's measured eager cost.
   The GPU cannot run ahead of its launches, so its busy time is
   ``max(kernels, host launch time)``.
2. **CPU work per step** (``RuntimeCosts.cpu_s``): serial with the GPU (``time = GPU + CPU``)
   or overlapped with it (``time = max(GPU, CPU)``); plus the part no overlap hides
   (``RuntimeCosts.serial_s``: ``time = max(GPU, CPU) + serial``). Both are functions of the
   batch alone (sequences, new tokens, sampled tokens), so a run of identical decode steps has
   one duration.

What the step spends beyond its kernels is reported as the engine's ``overhead`` (the step
log's ``op_overhead_s``), so the operator classes still sum to the step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from servesim.cost.batch import BatchShape
from servesim.engines.base import RuntimeCosts
from servesim.hardware import HardwareProfile
from servesim.model_spec import ModelSpec

GraphMode = Literal["full", "piecewise", "eager"]


@dataclass(frozen=True, slots=True)
class StepTiming:
    """A step's duration, and how much of it the engine's software adds beyond the kernels."""

    time_s: float
    exposed_s: float


class EngineRuntime:
    """:class:`RuntimeCosts` applied to one deployment (its kernel and collective counts)."""

    def __init__(self, runtime: RuntimeCosts, model: ModelSpec, hardware: HardwareProfile, tp: int,
                 attention_gemms: list[tuple[int, int]]) -> None:
        self.runtime = runtime
        self.layers = model.num_layers
        self._kernels = kernels_per_step(model, len(attention_gemms))
        norms = model.num_layers if model.qk_norm_across_heads else 0
        self._collectives = (model.residual_reductions_in() + norms + 2) if tp > 1 else 0
        """Two residual all-reduces per layer (one per Nemotron-H block; plus one with a QK-norm
        over all heads), the embedding's and the logits gather."""
        eager_call = hardware.collectives.eager_call_s if hardware.collectives is not None else 0.0
        self._eager_collectives_s = self._collectives * eager_call

    def plan(self, batch: BatchShape) -> tuple[int, GraphMode]:
        """(tokens the kernels run, graph mode) of ``batch``: padded up to the capture size it
        replays, or as is when it runs eagerly."""
        decode_only = batch.num_prefills == 0
        tokens, requests = batch.num_new_tokens, batch.num_decodes
        mode: GraphMode = "full" if decode_only and self.runtime.graph_decode_full else "piecewise"
        if decode_only and self.runtime.graph_counts_requests and tokens > requests > 0:
            # A speculative verify step: the graph captured for its requests, each padding
            # request computing the step's tokens per request, rounded up (1 + k when all propose k).
            size = self.runtime.graph_size(requests, True)
            if size is None:
                return tokens, "eager"
            return tokens + (size - requests) * -(-tokens // requests), mode
        size = self.runtime.graph_size(tokens, decode_only)
        if size is None:
            return tokens, "eager"
        return size, mode

    def launch_s(self, batch: BatchShape, mode: GraphMode) -> float:
        """Host time to launch the step's GPU work."""
        launch = self.runtime.launch_s
        if mode == "full":
            return launch
        attention = (batch.num_prefills > 0) + (batch.num_decodes > 0)
        if mode == "piecewise":
            return self.layers * (attention + 1) * launch
        return (self._kernels + self.layers * attention) * launch + self._eager_collectives_s

    def host_s(self, batch: BatchShape, mode: GraphMode) -> tuple[float, float]:
        """(host launch time, CPU time) of ``batch``'s step: what depends on the batch's counts
        alone, so it is the same in every step of a fast-forwarded run (:meth:`time` and
        :class:`~servesim.cost.decode_run.DecodeRunPricer` both read it here; a new host-time term
        that depends only on the batch's counts goes here, and both stay in step)."""
        cpu = self.runtime.cpu_s(batch.num_prefills + batch.num_decodes, batch.num_new_tokens,
                                 batch.num_logits)
        return self.launch_s(batch, mode), cpu

    def serial_s(self, batch: BatchShape) -> float:
        """Host time per step that nothing overlaps (added after ``max(GPU, CPU)``): a function of
        the batch's counts alone, the same in every step of a fast-forwarded run."""
        return self.runtime.serial_s(batch.num_prefills + batch.num_decodes, batch.num_new_tokens,
                                     batch.num_logits)

    def time(self, batch: BatchShape, kernels_s: float, mode: GraphMode) -> StepTiming:
        """The step's duration given its kernels' time (priced at the planned size)."""
        launch, cpu = self.host_s(batch, mode)
        gpu = max(kernels_s, launch)
        total = max(gpu, cpu) if self.runtime.overlap else gpu + cpu
        if self.runtime.has_serial:
            total += self.serial_s(batch)
        return StepTiming(total, total - kernels_s)


def kernels_per_step(model: ModelSpec, attention_gemms: int) -> int:
    """Kernels one step launches besides attention and collectives (what an eager step's host
    launches): per layer the attention projections, the output projection, the MLP (two GEMMs;
    a MoE layer's router, two grouped expert GEMMs and the shared expert's two) and the fused
    elementwise kernels (two add+RMSNorm, RoPE, activation; two more in a MoE layer), and around
    the layers the embedding, the final norm and the LM head, as the cost model prices them."""
    per_mixer = attention_gemms + 1 + 2  # the projections, o_proj, add+RMSNorm and RoPE
    per_dense = 2 + 2  # up/gate and down, add+RMSNorm and the activation
    moe = model.moe
    per_moe = 3 + (2 if moe is not None and moe.shared_intermediate else 0) + 4
    mixers = model.num_layers - model.mixer_free_layers_in()
    return mixers * per_mixer + model.num_dense_layers * per_dense + model.num_moe_layers * per_moe + 3
