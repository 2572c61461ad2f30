"""``sglang``: SGLang 0.5 (``sglang.launch_server``) with its default scheduler.

Scheduler (``python/sglang/srt/managers/scheduler.py``): a prefill ("extend") batch whenever new
requests can be admitted, run alone, with prompts chunked at ``chunked_prefill_size``; else a
decode batch of every running request; admission reserves room for the running requests'
future tokens (``new_token_ratio``). That is the ``prefill_first`` policy. The radix-tree prefix
cache is on by default (``--disable-radix-cache`` turns it off) with a page size of one token,
so KV is counted per token (``block_size`` 1).

Defaults (``server_args.py``, ``_handle_gpu_memory_settings``), by GPU memory
(:data:`MEMORY_BUCKETS`): ``chunked_prefill_size`` 8192 on 60-160 GB GPUs (A100 80GB, H100,
H200), 16384 above (B200), 4096 on 35-60 GB (L40S, A100 40GB), 2048 below; ``cuda_graph_max_bs``
256 below TP 4 and 512 from TP 4 on (B200: 512; 32 / 160 on 35-60 GB, 24 / 80 and 8 below);
``max_prefill_tokens``
16384, which caps a prefill batch's new tokens as the chunk does (the step budget here is the
smaller of the two; ``--enable-mixed-chunk`` is the ``prefill_first`` policy's ``mixed: true``,
whose decodes take their tokens from that budget too). ``mem_fraction_static`` is SGLang's share
of the GPU for the weights and the KV pool (activations and CUDA graphs live in the rest: the
memory plan's ``weights_and_kv`` rule), used here as ``gpu_memory_utilization``; unless the
deployment sets it, it is SGLang's own heuristic since 0.5.3 (sgl-project/sglang PR #10975,
merged 2025-09-27; :func:`mem_fraction_static`): ``(memory - reserved) / memory`` with, in MiB,
``reserved = 512 + 1.5 x max(chunk, 2048) + 2 x cuda_graph_max_bs + 1024 x tp x pp / 8``, plus
``3 x cuda_graph_max_bs x dp`` under data-parallel attention (and ``1.5 x`` that again above 300
graph seats), at least 10 GiB on GPUs above 60 GiB, plus 2 GiB for an EAGLE or MTP proposer and
6 GiB for a separate draft model; SGLang's ``tp_size`` is every GPU of the replica (``tp x dp``
here). Releases before 0.5.3 reserved ``9.5 + tp/2`` GB below 90 GB, ``12 + tp/2`` GB below 160 GB
and 32 GB above (:func:`legacy_reserved_gb`; the serving replay deploys those releases so).
``max_running_requests`` is sized from the KV pool by SGLang (its request table holds at most
4096); the seat limit here is 4096 and the KV pool binds first.

Runtime:

- **Overlap scheduler** (on unless ``--disable-overlap-schedule``): the CPU work of the next
  batch runs while the GPU computes this one, so a step takes ``max(GPU, CPU)``; the batch is
  formed before this one's results and new requests are in (``event_loop_overlap`` receives
  requests once per iteration, after launching the next batch), so a request that arrives while
  a step runs first runs two steps later: knob ``schedule_ahead``, off by default
  (``servesim.core.replica``).
- **Reading new requests** (``--scheduler-recv-interval``, default 1): above 1, the scheduler
  reads its input queue only when a counter reaches the interval; each decode step adds 1 to it,
  a prefill step enough to read at once (``SchedulerRecvSkipper``: weight 1 for ``DECODE`` and
  ``TARGET_VERIFY``, 1000 otherwise), and an idle scheduler reads at once. So during long decode
  runs an arrival waits up to that many steps (:mod:`servesim.core.replica`; not with DP
  attention, where SGLang 0.5 refuses it).
- **CUDA graphs** for decode batches only (prefill runs eagerly), at batch sizes
  ``[1, 2, 4, 8, 12] + range(16, 257, 8) + range(272, 512, 16) + range(512, max + 1, 32)`` up to
  ``cuda_graph_max_bs`` (``_generate_cuda_graph_batch_sizes``), padded to the next size.
- **All-reduce**: SGLang's custom all-reduce (from vLLM's: ``CustomAllreduce``, groups of 2, 4, 6
  or 8 GPUs) below 8 MiB, NCCL above and at other group sizes; the vLLM one-shot / two-shot
  thresholds are assumed. Its PyTorch symmetric-memory all-reduce is opt-in
  (``--enable-torch-symm-mem``), so not modelled by default.
- **CPU work per step**: fitted (``configs/engines/sglang.yaml``) or the estimate below.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar

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
from servesim.engines.vllm import CUSTOM_ALL_REDUCE_WORLDS, LAUNCH_S
from servesim.errors import ServesimError

GB = 2**30  # SGLang reads memory in MiB and compares with multiples of 1024 MiB
MIB = 2**20
MAX_PREFILL_TOKENS = 16384
"""SGLang's ``--max-prefill-tokens`` default (``server_args.py``): no default chunk exceeds it."""


class SglangKnobs(EngineKnobs):
    disable_overlap_schedule: bool = Field(False, description="run the CPU work serially")
    disable_cuda_graph: bool = Field(False, description="never use CUDA graphs")
    cuda_graph_max_bs: PositiveInt | None = Field(None, description="largest captured decode batch")
    cuda_graph_bs: list[PositiveInt] | None = Field(None, description="captured decode batch sizes")
    disable_custom_all_reduce: bool = Field(False, description="use NCCL for every all-reduce")
    launch_s: float | None = Field(None, ge=0, allow_inf_nan=False,
                                   description="host time per kernel launch outside a graph")
    scheduler_recv_interval: PositiveInt = Field(
        1, description="--scheduler-recv-interval: read new requests only every this many decode "
        "steps (at once after a prefill step or when idle; default 1)")
    max_prefill_tokens: PositiveInt | None = Field(
        None, description="--max-prefill-tokens: new prompt tokens per prefill batch, at most "
                          f"(default {MAX_PREFILL_TOKENS}); the step budget is the smaller of it and "
                          "chunked_prefill_size")


def sglang_capture_sizes(max_bs: int) -> tuple[int, ...]:
    """SGLang's default decode CUDA-graph batch sizes up to ``max_bs``."""
    sizes = capture_sizes([1, 2, 4, 8, 12], range(16, 257, 8), range(272, 512, 16),
                          range(512, max_bs + 1, 32))
    return tuple(v for v in sizes if v <= max_bs)


def legacy_reserved_gb(hbm_bytes: float, tp: int) -> float:
    """SGLang's memory kept out of ``mem_fraction_static`` before 0.5.3 (PR #7054's rule), in GB."""
    if hbm_bytes < 90 * GB:
        return 9.5 + tp / 2
    if hbm_bytes < 160 * GB:
        return 12 + tp / 2
    return 32.0


MEMORY_BUCKETS = ((20, 2048, 8, 8), (35, 2048, 24, 80), (60, 4096, 32, 160), (160, 8192, 256, 512),
                  (math.inf, 16384, 512, 512))
"""SGLang's defaults by GPU memory (``_handle_gpu_memory_settings``, CUDA GPUs): (below this many
GiB, ``chunked_prefill_size``, ``cuda_graph_max_bs`` below TP 4, from TP 4): T4 and 4080; A10,
4090, 5090; A100 40GB and L40(S); A100 80GB, H100, H200; B200 and larger."""


def _bucket(hbm_bytes: float) -> tuple[float, int, int, int]:
    return next(b for b in MEMORY_BUCKETS if hbm_bytes < b[0] * GB)


def default_chunk(hbm_bytes: float) -> int:
    """``chunked_prefill_size`` by GPU memory (:data:`MEMORY_BUCKETS`): 8192 on an H100 or H200,
    16384 on a B200, 4096 on an L40S."""
    return _bucket(hbm_bytes)[1]


def default_graph_max_bs(hbm_bytes: float, tp_size: int) -> int:
    """``cuda_graph_max_bs`` by GPU memory and SGLang's ``tp_size`` (:data:`MEMORY_BUCKETS`): on an
    H100 or H200 256 below TP 4 and 512 from TP 4; 512 on a B200."""
    _, _, small, large = _bucket(hbm_bytes)
    return large if tp_size >= 4 else small


def reserved_mib(hbm_bytes: float, *, tp_size: int, pp: int, dp: int, chunk: int, graph_max_bs: int,
                 speculative: str | None) -> float:
    """SGLang's memory kept out of ``mem_fraction_static`` since 0.5.3, in MiB (see the module
    docstring; ``_handle_gpu_memory_settings``); ``dp`` > 1 is data-parallel attention."""
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_max_bs * 2 + tp_size * pp / 8 * 1024
    if dp > 1:
        reserved += graph_max_bs * dp * 3
        if graph_max_bs > 300:
            reserved += graph_max_bs * dp * 1.5
    if hbm_bytes > 60 * GB:
        reserved = max(reserved, 10 * 1024)
    if speculative == "draft_model":
        reserved += 6 * 1024
    elif speculative not in (None, "ngram"):
        reserved += 2 * 1024
    return reserved


def mem_fraction_static(hbm_bytes: float, reserved_bytes: float) -> float:
    """SGLang's rounding of ``(memory - reserved) / memory`` to three places."""
    return round((hbm_bytes - reserved_bytes) / hbm_bytes, 3)


@register_engine
class Sglang(Engine):
    name = "sglang"
    title = "SGLang 0.5"
    versions = ("0.5",)
    Knobs = SglangKnobs
    fast_forward = True
    """Its runtime (graphs, host time, all-reduce) is priced by the cost model from the batch alone."""
    defaults = SchedulerDefaults(policy="prefill_first", max_num_seqs=4096, block_size=1,
                                 gpu_memory_utilization=0.88, watermark=0.0, enable_prefix_caching=True,
                                 chunked_max_num_batched_tokens=8192, min_max_num_batched_tokens=8192)
    speculation: ClassVar[SpeculationDefaults] = vllm_fitted_speculation(
        "SGLang keeps speculating at every batch size but lowers max_running_requests to 48 when "
        "speculative decoding is on (its speculative_hook)", max_num_seqs=48, estimate_for="SGLang")
    cpu_costs: ClassVar[dict[str, CpuCosts]] = {"": UNFITTED_CPU}
    provenance: ClassVar[dict[str, str]] = {
        "defaults": "SGLang server_args._handle_gpu_memory_settings (chunked_prefill_size, "
                    "cuda_graph_max_bs, and mem_fraction_static from the reserved memory, since 0.5.3)",
    }
    memory_budget = "weights_and_kv"
    """``mem_fraction_static`` holds the weights and the KV pool only."""
    hybrid_experts = True
    """``--ep-size`` below ``--tp-size`` with ``--enable-dp-attention`` (all-gather dispatch)."""

    def scheduler_defaults(self, hardware_name: str, hbm_bytes: float, tp: int) -> SchedulerDefaults:
        # A prefill batch stops at the first of its two limits (PrefillAdder's rem_chunk_tokens and
        # rem_input_tokens, both less the decodes a mixed batch carries): one budget here.
        knobs = self.knobs
        assert isinstance(knobs, SglangKnobs)
        # (its memory fraction comes from memory_fraction(), which knows the whole deployment)
        chunk = min(default_chunk(hbm_bytes), knobs.max_prefill_tokens or MAX_PREFILL_TOKENS)
        return replace(self.defaults, chunked_max_num_batched_tokens=chunk, min_max_num_batched_tokens=chunk)

    def memory_fraction(self, hbm_bytes: float, *, tp: int, pp: int, dp: int, chunk: int | None,
                        speculative: str | None) -> float | None:
        # The formula reads chunked_prefill_size (the deployment's budget, unless
        # --max-prefill-tokens cut it below the default chunk), or --max-prefill-tokens when
        # prompts are not chunked (chunk None).
        knobs = self.knobs
        assert isinstance(knobs, SglangKnobs)
        tp_size = tp * dp
        graph_max_bs = (max(knobs.cuda_graph_bs) if knobs.cuda_graph_bs else
                        knobs.cuda_graph_max_bs or default_graph_max_bs(hbm_bytes, tp_size))
        if chunk is None:
            chunk_size = knobs.max_prefill_tokens or MAX_PREFILL_TOKENS
        else:
            chunk_size = chunk if knobs.max_prefill_tokens is None else max(chunk, default_chunk(hbm_bytes))
        reserved = reserved_mib(hbm_bytes, tp_size=tp_size, pp=pp, dp=dp, chunk=chunk_size,
                                graph_max_bs=graph_max_bs, speculative=speculative)
        fraction = mem_fraction_static(hbm_bytes, reserved * MIB)
        if fraction <= 0:
            raise ServesimError("deployment.gpu_memory_utilization",
                                f"SGLang's mem_fraction_static heuristic reserves {reserved / 1024:.1f} GiB "
                                f"of a {hbm_bytes / GB:.1f} GiB GPU, leaving nothing for weights and KV",
                                "set deployment.gpu_memory_utilization (SGLang's --mem-fraction-static)")
        return fraction

    def runtime(self, hardware_name: str, *, tp: int = 1, max_num_seqs: int | None = None,
                hbm_bytes: float | None = None) -> RuntimeCosts:
        knobs = self.knobs
        assert isinstance(knobs, SglangKnobs)
        cpu = self.cpu(hardware_name)
        sizes: tuple[int, ...] = ()
        if not knobs.disable_cuda_graph:
            if knobs.cuda_graph_bs:
                sizes = tuple(sorted(set(knobs.cuda_graph_bs)))
            else:
                default_max = default_graph_max_bs(hbm_bytes, tp) if hbm_bytes is not None else 160
                sizes = sglang_capture_sizes(knobs.cuda_graph_max_bs or default_max)
        runtime = cpu.runtime(
            overlap=not knobs.disable_overlap_schedule, cuda_graph_sizes=sizes, graph_mixed=False,
            graph_counts_requests=True,
            launch_s=LAUNCH_S if knobs.launch_s is None else knobs.launch_s,
            allreduce="nccl" if knobs.disable_custom_all_reduce else "custom",
            custom_allreduce_worlds=CUSTOM_ALL_REDUCE_WORLDS)
        if knobs.scheduler_recv_interval == 1:
            return runtime
        return replace(runtime, recv_interval=knobs.scheduler_recv_interval)
