"""``trtllm``: TensorRT-LLM 1.x served by ``trtllm-serve`` (PyTorch backend).

Scheduler (``tensorrt_llm/_torch/pyexecutor``): in-flight batching, contexts and generations in
one iteration, under the ``GUARANTEED_NO_EVICT`` capacity policy (a request starts only when the
KV cache can hold all it will need): the ``no_evict`` policy. Defaults (``LlmArgs`` /
``BuildConfig``): ``max_batch_size`` 2048 (``max_num_seqs`` here), ``max_num_tokens`` 8192 (the
step budget), chunked prefill off, ``tokens_per_block`` 32, KV block reuse (prefix caching) on.
Its KV cache takes ``kv_cache_config.free_gpu_memory_fraction`` (default 0.9) of the memory
free once the weights and the activation workspace are allocated: ``deployment.
gpu_memory_utilization`` is read that way (``memory_budget = "free_after_load"``).

Runtime:

- **Overlap scheduler** (on unless ``disable_overlap_scheduler``): a step takes ``max(GPU, CPU)``,
  and a request that arrives while a step runs first runs two steps later (``PyExecutor.
  _executor_loop_overlap`` fetches new requests once per iteration, after launching the next
  batch): knob ``schedule_ahead``, off by default (``servesim.core.replica``).
- **CUDA graphs** (``cuda_graph_config``): decode batches of sizes 1-31, 32, 64 and 128
  (``CudaGraphConfig._generate_cuda_graph_batch_sizes`` with ``max_batch_size`` 128 and
  ``enable_padding`` false). Without padding a batch whose size was not captured runs eagerly;
  context steps always run eagerly.
- **Attention-DP balancing** (``attention_dp_config``, off unless ``attention_dp_balance``): new
  prompts wait until every DP rank has one, at most ``attention_dp_timeout_iters`` iterations
  (:class:`~servesim.engines.base.DpBalance`, :mod:`servesim.core.parallel_replica`).
- **All-reduce**: TensorRT-LLM's own custom all-reduce (``AllReduceStrategy.AUTO``: one-shot and
  two-shot kernels for small messages, NCCL for large); its exact thresholds are not modelled,
  vLLM's are assumed.
- **CPU work per step**: fitted (``configs/engines/trtllm.yaml``) or the estimate below.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from pydantic import Field, PositiveInt

from servesim.engines.base import (
    UNFITTED_CPU,
    CpuCosts,
    DpBalance,
    Engine,
    EngineKnobs,
    RuntimeCosts,
    SchedulerDefaults,
    SpeculationDefaults,
    capture_sizes,
    register_engine,
    vllm_fitted_speculation,
)
from servesim.engines.vllm import LAUNCH_S


class TrtllmKnobs(EngineKnobs):
    disable_overlap_scheduler: bool = Field(False, description="run the CPU work serially")
    cuda_graph_batch_sizes: list[PositiveInt] | None = Field(
        None, description="cuda_graph_config.batch_sizes (default 1-31, 32, 64, 128)")
    cuda_graph_max_batch_size: PositiveInt | None = Field(
        None, description="cuda_graph_config.max_batch_size (default 128)")
    cuda_graph_padding: bool = Field(False, description="cuda_graph_config.enable_padding")
    disable_cuda_graph: bool = Field(False, description="no cuda_graph_config: never use CUDA graphs")
    launch_s: float | None = Field(None, ge=0, allow_inf_nan=False,
                                   description="host time per kernel launch outside a graph")
    attention_dp_balance: bool = Field(
        False, description="attention_dp_config.enable_balance: with attention DP, start new prompts "
        "only when every rank has one (or after attention_dp_timeout_iters iterations)")
    attention_dp_timeout_iters: int = Field(
        50, ge=0, description="attention_dp_config.timeout_iters: iterations a prompt waits for the "
        "other ranks before it starts anyway (default 50)")
    attention_dp_batching_wait_iters: int = Field(
        10, ge=0, description="attention_dp_config.batching_wait_iters: iterations every rank's prompts "
        "wait more, to batch, while every rank decodes (default 10)")


def trtllm_capture_sizes(max_batch_size: int, padding: bool) -> tuple[int, ...]:
    """TensorRT-LLM's default CUDA-graph batch sizes up to ``max_batch_size``."""
    if padding:
        sizes = [1, 2, 4] + [i * 8 for i in range(1, 17)]
        while sizes[-1] + 64 <= max_batch_size:
            sizes.append(sizes[-1] + 64)
    else:
        sizes = [*range(1, 32), 32, 64, 128]
        sizes += [2**i for i in range(8, max(8, max_batch_size.bit_length()))]
    kept = [v for v in capture_sizes(sizes) if v <= max_batch_size]
    if not kept or kept[-1] != max_batch_size:
        kept.append(max_batch_size)
    return tuple(kept)


@register_engine
class Trtllm(Engine):
    name = "trtllm"
    title = "TensorRT-LLM 1.x (PyTorch backend)"
    versions = ("1.2",)
    Knobs = TrtllmKnobs
    fast_forward = True
    """Its runtime (graphs, host time, all-reduce) is priced by the cost model from the batch alone."""
    memory_budget = "free_after_load"
    """``free_gpu_memory_fraction``: a share of the memory free after loading (KvCacheConfig)."""
    hybrid_experts = True
    """``moe_expert_parallel_size`` x ``moe_tensor_parallel_size``, with attention DP."""
    defaults = SchedulerDefaults(policy="no_evict", max_num_seqs=2048, block_size=32,
                                 gpu_memory_utilization=0.9, watermark=0.0, enable_prefix_caching=True,
                                 chunked_max_num_batched_tokens=8192, min_max_num_batched_tokens=8192)
    speculation: ClassVar[SpeculationDefaults] = vllm_fitted_speculation(
        "TensorRT-LLM has no batch-size cut-off by default (max_concurrency unset)",
        estimate_for="TensorRT-LLM")
    cpu_costs: ClassVar[dict[str, CpuCosts]] = {"": UNFITTED_CPU}
    provenance: ClassVar[dict[str, str]] = {
        "defaults": "TensorRT-LLM LlmArgs/BuildConfig: max_batch_size 2048, max_num_tokens 8192, "
                    "tokens_per_block 32, GUARANTEED_NO_EVICT, CudaGraphConfig max_batch_size 128, "
                    "KvCacheConfig free_gpu_memory_fraction 0.9 of the memory free after loading",
    }

    def runtime(self, hardware_name: str, *, tp: int = 1, max_num_seqs: int | None = None,
                hbm_bytes: float | None = None) -> RuntimeCosts:
        knobs = self.knobs
        assert isinstance(knobs, TrtllmKnobs)
        cpu = self.cpu(hardware_name)
        sizes: tuple[int, ...] = ()
        if not knobs.disable_cuda_graph:
            sizes = (tuple(sorted(set(knobs.cuda_graph_batch_sizes))) if knobs.cuda_graph_batch_sizes
                     else trtllm_capture_sizes(knobs.cuda_graph_max_batch_size or 128,
                                               knobs.cuda_graph_padding))
        runtime = cpu.runtime(
            overlap=not knobs.disable_overlap_scheduler, cuda_graph_sizes=sizes, graph_mixed=False,
            graph_counts_requests=True,
            graph_padding=knobs.cuda_graph_padding,
            launch_s=LAUNCH_S if knobs.launch_s is None else knobs.launch_s, allreduce="custom")
        if not knobs.attention_dp_balance:
            return runtime
        return replace(runtime, dp_balance=DpBalance(knobs.attention_dp_timeout_iters,
                                                     knobs.attention_dp_batching_wait_iters))
