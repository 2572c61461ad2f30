"""``vllm-v0``: vLLM's V0 engine (0.6.x), the behaviour every servesim result so far models.

Scheduler defaults (vLLM 0.6 ``EngineArgs``): ``max_num_seqs`` 256, ``block_size`` 16,
``gpu_memory_utilization`` 0.9, prefix caching off, and without chunked prefill a token budget of
``max(max_model_len, 2048)`` so that any admissible prompt fits one step (2048 when the policy
chunks: ``DEFAULT_MAX_NUM_BATCHED_TOKENS``). The default policy is ``continuous``: prefill steps
run alone, then decodes (V0's scheduler without ``--enable-chunked-prefill``); a 1% free-block
watermark guards admission.

``num_scheduler_steps`` (multi-step scheduling, vLLM 0.6) divides that host cost per step; the
coarser admission it brings (new prompts join only between groups of steps) is not modelled:
admissions are considered every step.

Runtime: a fixed CPU time per iteration that the GPU waits for (V0 schedules, prepares inputs,
samples and processes outputs between model passes, without overlap). The values are estimates
carried over unchanged from the hardware profiles that held them before engines existed: 0.6 ms
per step, 0.8 ms on A100- and MI300X-based servers, whose host CPUs are a generation older or
whose software stack (ROCm) adds launch cost. Not measured here; the serving-engine models fit
these to end-to-end measurements.

Speculative decoding: vLLM never turns it off by batch size unless told to
(``disable_by_batch_size``), and its software adds time per verifying step (rejection sampling,
proposal bookkeeping) and per proposer pass (input preparation, launch, sampling the proposal).
Those two are fitted to vLLM V1's published step times (``servesim.calibration.speculation``), the
only public data; V0 speculated in a separate proposer worker with more overhead (vLLM issue #9565),
not measured.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from pydantic import Field

from servesim.engines.base import (
    Engine,
    EngineKnobs,
    RuntimeCosts,
    SchedulerDefaults,
    SpeculationDefaults,
    register_engine,
)


class VllmV0Knobs(EngineKnobs):
    num_scheduler_steps: int = Field(
        1, ge=1, le=64, description="multi-step scheduling (vLLM 0.6 --num-scheduler-steps): the "
        "scheduler runs once per this many decode steps")


@register_engine
class VllmV0(Engine):
    name = "vllm-v0"
    title = "vLLM 0.6 (V0 engine)"
    versions = ("0.6",)
    Knobs = VllmV0Knobs
    defaults = SchedulerDefaults(policy="continuous", max_num_seqs=256, block_size=16,
                                 gpu_memory_utilization=0.9, watermark=0.01, enable_prefix_caching=False,
                                 chunked_max_num_batched_tokens=2048, min_max_num_batched_tokens=2048)
    step_overhead_s: ClassVar[dict[str, float]] = {"": 6.0e-4, "a100": 8.0e-4, "mi300x": 8.0e-4}
    fast_forward = True
    speculation: ClassVar[SpeculationDefaults] = SpeculationDefaults(
        disable_by_batch_size=None, max_num_seqs=None, step_overhead_s=0.93e-3, pass_overhead_s=0.40e-3,
        provenance="vLLM's speculative_disable_by_batch_size (0.6; speculative_config's "
                   "disable_by_batch_size later) defaults to None: speculation stays on at every batch "
                   "size; max_num_seqs is unchanged",
        overhead_provenance="fitted (servesim.calibration.speculation, least squares over 12 rows) to "
                            "vLLM V1 step times of Llama-3.1-8B with EAGLE-1 and EAGLE-3 heads, k = 2..7, "
                            "batch 1, H100 (vLLM issue #20780); RMS residual 1.6 ms per step. Measured on "
                            "V1, which speculates as modelled here; V0's proposer overheads were larger "
                            "(vLLM issue #9565) and are not measured")
    provenance: ClassVar[dict[str, str]] = {
        "step_overhead_s": "estimate of vLLM per-iteration CPU work (scheduling, input prep, sampling) "
                           "for a dense 8B model, 0.6 ms (0.8 ms on A100 and MI300X servers); carried "
                           "over from the hardware profiles of servesim 0.1; not measured here",
        "defaults": "vLLM 0.6 EngineArgs defaults (max_num_seqs 256, block_size 16, "
                    "gpu_memory_utilization 0.9, DEFAULT_MAX_NUM_BATCHED_TOKENS 2048)",
    }

    def runtime(self, hardware_name: str, *, tp: int = 1, max_num_seqs: int | None = None,
                hbm_bytes: float | None = None) -> RuntimeCosts:
        """The constant per-step cost; with multi-step scheduling the scheduler and input
        preparation run once per ``num_scheduler_steps`` steps and output processing overlaps the
        next steps (vLLM 0.6's multi-step design), so the host cost per step is divided by it."""
        costs = super().runtime(hardware_name, tp=tp, max_num_seqs=max_num_seqs, hbm_bytes=hbm_bytes)
        knobs = self.knobs
        assert isinstance(knobs, VllmV0Knobs)
        steps = knobs.num_scheduler_steps
        if steps == 1:
            return costs
        return replace(costs, step_overhead_s=costs.step_overhead_s / steps,
                       provenance=f"{costs.provenance}; divided by num_scheduler_steps {steps}")
