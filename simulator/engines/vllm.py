"""``vllm``: vLLM's V1 engine as of vLLM 0.19 (the engine every vLLM release since 0.11 runs).

Scheduler (``vllm/v1/core/sched/scheduler.py``): one token budget per step shared by decodes and
prompt chunks, chunked prefill always on, automatic prefix caching on by default, no free-block
watermark; that is the ``chunked_prefill`` policy with prefix caching. Defaults as
``vllm serve`` resolves them (``EngineArgs.get_batch_defaults``, OpenAI API server usage
context): on a GPU with at least 70 GiB that is not an A100 (H100, H200, B200, MI300X),
``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 1024; on others 2048 and 256 (the A100
exception is vLLM's own, PR #17885: the larger budget lowered A100 throughput). ``block_size``
16, ``gpu_memory_utilization`` 0.9.

Runtime:

- **Async scheduling** (``--async-scheduling``): the scheduler and output processing of step
  ``n + 1`` run while the GPU computes step ``n``, so a step takes ``max(GPU, CPU)``; without it
  they are serial (GPU + CPU). With it, a request that arrives while a step runs first runs two
  steps later (``EngineCore.step_with_batch_queue`` schedules the next batch before it reads the
  input queue again); knob ``schedule_ahead`` models that (off by default: ``servesim.core.replica``).
  On by default from vLLM 0.14 (its release notes: "Async scheduling
  is now enabled by default", PR #27614; ``SchedulerConfig.async_scheduling`` was ``False`` up to
  0.13), so ``version`` 0.11-0.13 turns it off unless ``async_scheduling`` says otherwise. The
  versions modelled differ only there: the scheduler, defaults and graphs below are taken as
  0.19's for every one of them (an assumption, not checked release by release).
- **CUDA graphs** (``cudagraph_mode`` ``FULL_AND_PIECEWISE``, ``docs/design/cuda_graphs.md``):
  pure decode steps replay full graphs, mixed and prefill steps piecewise graphs (attention
  eager), each padded to the next capture size; capture sizes ``[1, 2, 4] + range(8, 256, 8) +
  range(256, max + 1, 16)`` with ``max_cudagraph_capture_size = min(2 * max_num_seqs, 512)``
  (``vllm/config/vllm.py``); a step of more tokens runs eagerly. ``enforce_eager`` turns graphs
  off.
- **All-reduce** (``vllm/distributed/device_communicators/cuda_communicator.py``): the custom
  all-reduce (one-shot / two-shot over NVLink peer memory, ``csrc/custom_all_reduce.cuh``) below
  its 8 MiB buffer; on Hopper and Blackwell (compute capability 9.0, 10.0, 10.3) PyTorch's
  symmetric-memory all-reduce (``symm_mem.py``: multimem through the NVSwitch, or two-shot) takes
  the messages between the custom all-reduce's limit for that GPU and group size and its own
  (:data:`CUSTOM_ALL_REDUCE_MAX_SIZES`, :data:`SYMM_MEM_ALL_REDUCE_MAX_SIZES`), NCCL above.
  ``disable_custom_all_reduce`` and ``allreduce_use_symm_mem`` (``VLLM_ALLREDUCE_USE_SYMM_MEM``)
  turn either off. Symmetric memory is taken as on in every version modelled: on by default in
  0.11.0 (PR #25070), off again from 2025-10-15 (PR #26925, a temporary patch) and on in 0.16's
  and later ``envs.py``; 0.11.1-0.15 were not checked release by release.
- **CPU work per step**: fitted to end-to-end measurements (``configs/engines/vllm.yaml``,
  written by ``servesim calibrate fit-serving``); without that file, the estimates below.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, PositiveInt

from servesim.engines.base import (
    UNFITTED_CPU,
    CpuCosts,
    Engine,
    EngineKnobs,
    RuntimeCosts,
    SchedulerDefaults,
    SpeculationDefaults,
    capture_sizes,
    register_engine,
    vllm_fitted_speculation,
)

if TYPE_CHECKING:
    from servesim.model_spec import ModelSpec

GIB = 2**30
LAUNCH_S = 18e-6
"""Host time per GPU kernel of a step that runs outside a CUDA graph: measured 2026-11-28 by
``servesim calibrate launch --device cuda`` (torch 2.11, an eager Llama-3-8B decode forward on one
H100 and one H200, two runs each: ``calibration/measurements/{h100,h200}-torch-2.11/launch*.csv``),
the median of the eager wall time per kernel over the 28 batch sizes whose launches outlast their
kernels (p10-p90 14.9-28.4 us). It is the whole host path per kernel of a Python model (module
calls, views, dispatch, ``cudaLaunchKernel``), as an engine's eager or piecewise step pays it;
the bare launch of a one-element add from a Python loop is 5.8-10.5 us on the same hosts.
(5 us before, an estimate.)"""


class VllmKnobs(EngineKnobs):
    async_scheduling: bool | None = Field(
        None, description="overlap the scheduler with the GPU step (default: on from version 0.14, "
        "off before)")
    enforce_eager: bool = Field(False, description="never use CUDA graphs")
    cudagraph_mode: Literal["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE", "NONE"] = Field(
        "FULL_AND_PIECEWISE", description="which steps replay CUDA graphs")
    cudagraph_capture_sizes: list[PositiveInt] | None = Field(
        None, description="captured batch sizes (default: vLLM's list up to the max size)")
    max_cudagraph_capture_size: PositiveInt | None = Field(
        None, description="largest captured size (default min(2 * max_num_seqs, 512))")
    disable_custom_all_reduce: bool = Field(False, description="never run vLLM's custom all-reduce "
                                            "(symmetric memory and NCCL take its messages)")
    allreduce_use_symm_mem: bool = Field(
        True, description="VLLM_ALLREDUCE_USE_SYMM_MEM: PyTorch's symmetric-memory all-reduce for "
        "mid-sized messages on Hopper and Blackwell")
    launch_s: float | None = Field(None, ge=0, allow_inf_nan=False,
                                   description="host time per kernel launch outside a graph")


def vllm_capture_sizes(max_size: int) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes up to ``max_size``."""
    return tuple(v for v in capture_sizes([1, 2, 4], range(8, 256, 8), range(256, max_size + 1, 16))
                 if v <= max_size)


MIB = 2**20
CUSTOM_BUFFER_BYTES = 8 * MIB
"""The custom all-reduce's buffer (``CustomAllreduce(max_size=8192 * 1024)``): it takes messages
strictly smaller."""
CUSTOM_ALL_REDUCE_WORLDS = (2, 4, 6, 8)
"""``CustomAllreduce._SUPPORTED_WORLD_SIZES``: at other group sizes (a TP 16 group of an NVL72
rack) it disables itself and NCCL takes every message."""
CUSTOM_ALL_REDUCE_MAX_SIZES: dict[str, dict[int, int]] = {
    "9.0": {2: 64 * MIB, 4: 32 * MIB, 6: MIB // 2, 8: MIB // 4},
    "10.0": {2: 2 * MIB, 4: 2 * MIB, 6: MIB, 8: MIB},
    "10.3": {2: 4 * MIB, 4: 4 * MIB, 6: 8 * MIB, 8: 4 * MIB},
}
"""vLLM's ``all_reduce_utils.CUSTOM_ALL_REDUCE_MAX_SIZES`` (bytes, by compute capability and group
size): with symmetric memory on, the custom all-reduce's limit is the smaller of this and its
buffer."""
SYMM_MEM_ALL_REDUCE_MAX_SIZES: dict[str, dict[int, int]] = {
    "9.0": {2: 64 * MIB, 4: 32 * MIB, 6: 64 * MIB, 8: 64 * MIB},
    "10.0": {2: 8 * MIB, 4: 32 * MIB, 6: 128 * MIB, 8: 128 * MIB},
    "10.3": {2: 4 * MIB, 4: 32 * MIB, 6: 32 * MIB, 8: 64 * MIB},
}
"""vLLM's ``all_reduce_utils.SYMM_MEM_ALL_REDUCE_MAX_SIZES``: the largest message (bytes, at most)
its ``SymmMemCommunicator`` takes, by compute capability and group size."""


def vllm_allreduce(*, custom: bool = True, symm_mem: bool = True) -> dict[str, Any]:
    """The :class:`RuntimeCosts` all-reduce fields of vLLM with these communicators on
    (``cuda_communicator.all_reduce`` tries the custom all-reduce, then symmetric memory, then
    NCCL): per (capability, group) of its tables, the custom all-reduce below ``min(table,
    buffer)`` (never with ``custom`` off) and symmetric memory up to its own table's size."""
    if not custom and not symm_mem:
        return {"allreduce": "nccl"}
    limits = tuple((cc, world, float(min(CUSTOM_ALL_REDUCE_MAX_SIZES[cc][world], CUSTOM_BUFFER_BYTES))
                    if custom else 0.0, float(symm_max))
                   for cc, sizes in SYMM_MEM_ALL_REDUCE_MAX_SIZES.items() if symm_mem
                   for world, symm_max in sizes.items())
    return {"allreduce": "custom", "custom_allreduce_max_bytes": CUSTOM_BUFFER_BYTES if custom else 0.0,
            "custom_allreduce_worlds": CUSTOM_ALL_REDUCE_WORLDS, "allreduce_limits": limits}


HYBRID_BLOCK_ALIGNMENT = 16
"""Tokens a hybrid model's raised attention block is a multiple of (vLLM's kernel block
alignment for its FlashAttention and FlashInfer backends)."""

ASYNC_DEFAULT_SINCE = (0, 14)
"""The first vLLM release with async scheduling on by default (release notes of v0.14.0)."""


def async_by_default(version: str) -> bool:
    """Whether vLLM ``version`` (``major.minor``) schedules asynchronously unless told not to."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return (major, minor) >= ASYNC_DEFAULT_SINCE


@register_engine
class Vllm(Engine):
    name = "vllm"
    title = "vLLM V1 engine (releases 0.11-0.19)"
    versions = ("0.19", "0.18", "0.17", "0.16", "0.15", "0.14", "0.13", "0.12", "0.11")
    Knobs = VllmKnobs
    fast_forward = True
    """Its runtime (graphs, host time, all-reduce) is priced by the cost model from the batch alone."""
    defaults = SchedulerDefaults(policy="chunked_prefill", max_num_seqs=1024, block_size=16,
                                 gpu_memory_utilization=0.9, watermark=0.0, enable_prefix_caching=True,
                                 chunked_max_num_batched_tokens=8192, min_max_num_batched_tokens=8192)
    speculation: ClassVar[SpeculationDefaults] = vllm_fitted_speculation(
        "vLLM V1's speculative_config has no batch-size cut-off by default (speculation on at every "
        "batch size); max_num_seqs is unchanged")
    small_gpu_defaults = SchedulerDefaults(
        policy="chunked_prefill", max_num_seqs=256, block_size=16, gpu_memory_utilization=0.9,
        watermark=0.0, enable_prefix_caching=True, chunked_max_num_batched_tokens=2048,
        min_max_num_batched_tokens=2048)
    cpu_costs: ClassVar[dict[str, CpuCosts]] = {"": UNFITTED_CPU}
    provenance: ClassVar[dict[str, str]] = {
        "defaults": "vLLM EngineArgs.get_batch_defaults (OpenAI server usage context): >= 70 GiB and "
                    "not A100: max_num_batched_tokens 8192, max_num_seqs 1024; else 2048 / 256",
        "cuda_graphs": "vLLM CompilationConfig: FULL_AND_PIECEWISE, sizes [1, 2, 4] + range(8, 256, 8) + "
                       "range(256, max + 1, 16), max = min(2 * max_num_seqs, 512)",
        "launch_s": "measured: 18 us of host time per GPU kernel of an eager torch 2.11 Llama-3-8B "
                    "decode step on an H100 and an H200 (servesim calibrate launch, 2026-11-28)",
    }

    def hybrid_block_size(self, model: ModelSpec, tp: int, kv_bytes: float) -> int | None:
        """vLLM V1 keeps a hybrid model's recurrent state (Gated DeltaNet, Mamba2) in the same
        pages as its attention layers' KV, and every page must be as large: it raises the attention
        block size until one layer's block of K and V holds one layer's state of a sequence, in
        whole multiples of the kernel's 16-token alignment
        (``HybridAttentionMambaModelConfig``: "Setting attention block size to N tokens to ensure
        that attention page size is >= mamba page size"). A request then holds KV in blocks of
        that many tokens, and prefix caching matches whole blocks of it (vLLM issue 40696:
        Qwen3.5-4B at 528 tokens, no hit below)."""
        la = model.linear_attention
        if la is None:
            return None
        page = model.kv_elements_per_token_per_layer(tp) * kv_bytes
        return HYBRID_BLOCK_ALIGNMENT * math.ceil(la.state_bytes(tp) / (HYBRID_BLOCK_ALIGNMENT * page))

    @property
    def async_scheduling(self) -> bool:
        """Whether the scheduler overlaps the GPU: the knob, else the version's default."""
        knobs = self.knobs
        assert isinstance(knobs, VllmKnobs)
        if knobs.async_scheduling is not None:
            return knobs.async_scheduling
        return async_by_default(self.version)

    def scheduler_defaults(self, hardware_name: str, hbm_bytes: float, tp: int) -> SchedulerDefaults:
        if hbm_bytes >= 70 * GIB and not hardware_name.startswith("a100"):
            return self.defaults
        return self.small_gpu_defaults

    def runtime(self, hardware_name: str, *, tp: int = 1, max_num_seqs: int | None = None,
                hbm_bytes: float | None = None) -> RuntimeCosts:
        knobs = self.knobs
        assert isinstance(knobs, VllmKnobs)
        cpu = self.cpu(hardware_name)
        seqs = max_num_seqs or self.defaults.max_num_seqs
        mode = "NONE" if knobs.enforce_eager else knobs.cudagraph_mode
        sizes: tuple[int, ...] = ()
        if mode != "NONE":
            largest = knobs.max_cudagraph_capture_size or min(2 * seqs, 512)
            sizes = (tuple(sorted(set(knobs.cudagraph_capture_sizes))) if knobs.cudagraph_capture_sizes
                     else vllm_capture_sizes(largest))
        return cpu.runtime(
            overlap=self.async_scheduling, cuda_graph_sizes=sizes,
            graph_mixed=mode in ("FULL_AND_PIECEWISE", "PIECEWISE"),
            graph_decode_full=mode in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"),
            launch_s=LAUNCH_S if knobs.launch_s is None else knobs.launch_s,
            **vllm_allreduce(custom=not knobs.disable_custom_all_reduce,
                             symm_mem=knobs.allreduce_use_symm_mem))

