"""``vllm-v0``: vLLM's V0 engine (0.6.x), the behaviour every servesim result so far models.

Scheduler defaults (vLLM 0.6 ``EngineArgs``): ``max_num_seqs`` 256, ``block_size`` 16,
``gpu_memory_utilization`` 0.9, prefix caching off, and without chunked prefill a token budget of
``max(max_model_len, 2048)`` so that any admissible prompt fits one step (2048 when the policy
chunks: ``DEFAULT_MAX_NUM_BATCHED_TOKENS``). The default policy is ``continuous``: prefill steps
run alone, then decodes (V0's scheduler without ``--enable-chunked-prefill``); a 1% free-block
watermark guards admission.

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

from typing import ClassVar

from servesim.engines.base import Engine, SchedulerDefaults, SpeculationDefaults, register_engine


@register_engine
class VllmV0(Engine):
    name = "vllm-v0"
    title = "vLLM 0.6 (V0 engine)"
    versions = ("0.6",)
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
