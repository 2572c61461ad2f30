"""The vLLM (V1), SGLang and TensorRT-LLM engines: their documented defaults reach a run, their
knobs override them, and their schedulers keep the invariants every policy keeps."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from engine_helpers import assert_conserved, experiment, run, table, tabulate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.engines import make_engine
from servesim.engines.sglang import legacy_reserved_gb, sglang_capture_sizes
from servesim.engines.trtllm import trtllm_capture_sizes
from servesim.errors import ServesimError
from servesim.topology.resolve import resolve_topology

GIB = 2**30


def group(engine: Any, hardware: str = "h100-sxm-80gb", **deployment: Any):
    return resolve_topology(experiment(deployment or None, engine=engine, hardware=hardware)).kv_group


def test_vllm_defaults_follow_the_gpu() -> None:
    """vllm serve on a >= 70 GiB GPU that is not an A100: 8192 tokens, 1024 seqs; else 2048/256.
    Capture sizes reach min(2 * max_num_seqs, 512)."""
    h100 = group("vllm")
    assert (h100.limits.max_num_batched_tokens, h100.limits.max_num_seqs) == (8192, 1024)
    assert h100.policy.name == "chunked_prefill" and h100.limits.enable_prefix_caching
    assert h100.limits.watermark_blocks == 0 and h100.runtime.overlap
    assert h100.runtime.cuda_graph_sizes[-1] == 512 and h100.runtime.allreduce == "custom"
    a100 = group("vllm", "a100-sxm-80gb")
    assert (a100.limits.max_num_batched_tokens, a100.limits.max_num_seqs) == (2048, 256)
    small = group("vllm", max_num_seqs=64)
    assert small.runtime.cuda_graph_sizes[-1] == 128
    eager = group({"name": "vllm", "enforce_eager": True, "async_scheduling": False})
    assert eager.runtime.cuda_graph_sizes == () and not eager.runtime.overlap
    assert group({"name": "vllm", "max_cudagraph_capture_size": 64}).runtime.cuda_graph_sizes[-1] == 64


def test_vllm_schedules_asynchronously_from_release_0_14() -> None:
    """vLLM turned async scheduling on by default in 0.14 (SchedulerConfig.async_scheduling was
    False up to 0.13): the engine overlaps its host time with the GPU from 0.14, runs it serially
    before, and the knob overrides the release either way. A decode step of 64 sequences with
    100 us of host time per sequence (6.4 ms) takes max(GPU, 6.4 ms) overlapped, GPU + 6.4 ms
    serial."""
    from servesim import BatchShape, CostModel, load_hardware, load_model

    hw, model = load_hardware("h100-sxm-80gb"), load_model("llama-3-8b")
    shape = BatchShape.decodes_only(np.full(64, 1000, dtype=np.int64))

    def step(**knobs: Any) -> tuple[bool, float]:
        engine = make_engine("vllm", {"cpu_per_seq_s": 1e-4, "step_overhead_s": 0.0, **knobs})
        runtime = engine.runtime(hw.name, hbm_bytes=hw.memory.capacity_bytes)
        return runtime.overlap, CostModel(model, hw, 1, runtime=runtime).step_record(shape).time_s

    gpu_s = step(version="0.12", cpu_per_seq_s=0.0)[1]  # no host time: the kernels alone
    assert gpu_s > 0.0064  # so the overlapped step is the GPU's
    assert step(version="0.12") == (False, pytest.approx(gpu_s + 0.0064, rel=1e-12))
    for version in ("0.14", "0.19"):
        assert step(version=version) == (True, pytest.approx(gpu_s, rel=1e-12))
    assert step() == step(version="0.19")  # the latest modelled is the default
    assert step(version="0.12", async_scheduling=True)[0]
    assert not step(version="0.19", async_scheduling=False)[0]


def test_sglang_defaults_follow_gpu_memory_and_tp() -> None:
    """H100 (80 GB): 8192-token chunks, decode graphs to 256 below TP 4 and 512 from TP 4; B200
    (>= 160 GB): 16384 and 512."""
    h100 = group("sglang")
    hbm = h100.hardware.memory.capacity_bytes
    assert h100.policy.name == "prefill_first" and h100.limits.block_size == 1
    assert h100.limits.max_num_batched_tokens == 8192
    assert h100.runtime.cuda_graph_sizes[-1] == 256 and not h100.runtime.graph_mixed
    assert sglang_capture_sizes(512)[:7] == (1, 2, 4, 8, 12, 16, 24)
    assert sglang_capture_sizes(512)[-3:] == (480, 496, 512)
    assert make_engine("sglang", {}).runtime("h100", tp=4, hbm_bytes=hbm).cuda_graph_sizes[-1] == 512
    b200 = group("sglang", "b200")
    assert b200.limits.max_num_batched_tokens == 16384 and b200.runtime.cuda_graph_sizes[-1] == 512
    assert legacy_reserved_gb(190 * GIB, 1) == 32.0


def test_sglang_mem_fraction_static_is_its_own_heuristic() -> None:
    """SGLang 0.5.3 on (PR #10975): reserved MiB = 512 + 1.5 x max(chunk, 2048) + 2 x graph seats
    + 1024 x tp_size / 8 (+ 3 x seats x dp, and 1.5 x seats x dp above 300 seats, under DP
    attention), at least 10 GiB above 60 GiB, + 2 GiB for an EAGLE/MTP proposer; the fraction
    is (memory - reserved) / memory to three places. By hand, memory in MiB (H100 81,559; H200
    143,771; B200 183,359):
    H100 tp 1: 512 + 12,288 + 512 + 128 = 13,440 -> 0.835; tp 4: + 1,024 graph seats, 512 -> 0.824;
    a 2,048-token chunk: 4,224, raised to the 10 GiB floor -> 0.874;
    B200 tp 1: 512 + 24,576 + 1,024 + 128 = 26,240 -> 0.857;
    B200 tp 1 x dp 8 (tp_size 8): 512 + 24,576 + 1,024 + 1,024 + 12,288 + 6,144 = 45,568 -> 0.751;
    H200 tp 8 with EAGLE: 512 + 12,288 + 1,024 + 1,024 + 2,048 = 16,896 -> 0.882.
    A 3 GiB GPU (2,048-token chunks, 8 graph seats): 512 + 3,072 + 16 + 128 = 3,728 MiB, more
    than it has: refused in one line."""
    def fraction(hardware: str = "h100-sxm-80gb", **deployment: Any) -> float:
        return group("sglang", hardware, **deployment).memory.gpu_memory_utilization

    assert fraction() == 0.835
    assert fraction(tp=4) == 0.824
    assert fraction(max_num_batched_tokens=2048, max_num_seqs=256) == 0.874
    assert fraction("b200") == 0.857
    engine = make_engine("sglang", {})
    b200 = 183_359 * 2**20
    assert engine.memory_fraction(b200, tp=1, pp=1, dp=8, chunk=16384, speculative=None) == 0.751
    h200 = 143_771 * 2**20
    assert engine.memory_fraction(h200, tp=8, pp=1, dp=1, chunk=8192, speculative="eagle") == 0.882
    assert group("sglang", gpu_memory_utilization=0.8).memory.gpu_memory_utilization == 0.8  # as set
    # L40S (46,068 MiB, the 35-60 GiB bucket: 4096-token chunks, 32 graph seats, no 10 GiB floor):
    # 512 + 6,144 + 64 + 128 = 6,848 -> 0.851
    l40s = group("sglang", "l40s")
    assert l40s.limits.max_num_batched_tokens == 4096 and l40s.runtime.cuda_graph_sizes[-1] == 32
    assert l40s.memory.gpu_memory_utilization == 0.851
    # prompts not chunked: the reserve reads max_prefill_tokens (16,384 x 1.5 = 24,576) -> 0.685
    h100 = 81_559 * 2**20
    assert engine.memory_fraction(h100, tp=1, pp=1, dp=1, chunk=None, speculative=None) == 0.685
    with pytest.raises(ServesimError, match=r"^deployment.gpu_memory_utilization: SGLang's "
                       r"mem_fraction_static heuristic reserves 3.6 GiB of a 3.0 GiB GPU"):
        engine.memory_fraction(3 * GIB, tp=1, pp=1, dp=1, chunk=2048, speculative=None)


def test_each_engine_reads_its_memory_fraction_its_own_way() -> None:
    """vLLM: the fraction of the whole GPU holds the reserve, the weights, the activation
    workspace and the KV pool; SGLang: the weights and the KV pool (activations live outside it);
    TensorRT-LLM: the KV pool takes the fraction of what is free after the reserve, the weights
    and the workspace."""
    for engine, rule in (("vllm", "whole_gpu"), ("sglang", "weights_and_kv"), ("trtllm", "free_after_load")):
        m = group(engine).memory
        assert m.budget_rule == rule
        cap, u, rest = m.capacity_bytes, m.gpu_memory_utilization, m.reserved_bytes + m.weight_bytes
        expected = {"whole_gpu": cap * u - rest - m.activation_bytes,
                    "weights_and_kv": cap * u - rest,
                    "free_after_load": u * (cap - rest - m.activation_bytes)}[rule]
        assert m.kv_cache_bytes == pytest.approx(expected, rel=1e-12)
        assert m.activation_bytes > 0
    assert group("trtllm").memory.gpu_memory_utilization == 0.9


def test_sglang_max_prefill_tokens_caps_the_chunk() -> None:
    """--max-prefill-tokens (default 16384) and the chunk both bound a prefill batch: the budget is
    the smaller (H100: chunk 8192; B200: chunk 16384), and it survives an explicit chunk size.
    (Below SGLang's 4096 default seats, the deployment's max_num_seqs must come down with it.)"""
    capped = group({"name": "sglang", "max_prefill_tokens": 2500}, max_num_seqs=256)
    assert capped.limits.max_num_batched_tokens == 2500
    assert group({"name": "sglang", "max_prefill_tokens": 9692}).limits.max_num_batched_tokens == 8192
    assert group({"name": "sglang", "max_prefill_tokens": 9692}, "b200").limits.max_num_batched_tokens == 9692
    assert group("sglang", max_num_batched_tokens=4096).limits.max_num_batched_tokens == 4096


def test_trtllm_defaults() -> None:
    trt = group("trtllm")
    assert trt.policy.name == "no_evict"
    assert (trt.limits.max_num_seqs, trt.limits.max_num_batched_tokens, trt.limits.block_size) == (
        2048, 8192, 32)
    assert trt.runtime.cuda_graph_sizes == (*range(1, 32), 32, 64, 128)
    assert not trt.runtime.graph_padding
    assert trtllm_capture_sizes(128, True) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96,
                                               104, 112, 120, 128)


@pytest.mark.parametrize(("engine", "message"), [
    ({"name": "vllm", "cudagraph_mode": "SOMETIMES"}, r"^engine.cudagraph_mode: "),
    ({"name": "sglang", "chunked_prefill": 4}, r"^engine.chunked_prefill: unknown key"),
    ({"name": "trtllm", "version": "0.9"}, r"^engine.version: trtllm is modelled for versions 1.2"),
    ({"name": "vllm", "version": "0.10"}, r"^engine.version: vllm is modelled for versions 0.19, .*0.11, "
                                          r"not '0.10'"),
    ({"name": "vllm", "version": 0.12}, r'^engine.version: quote it: version: "0.12"'),
    ({"name": "vllm", "cpu_per_seq_s": -1}, r"^engine.cpu_per_seq_s: .*greater than or equal to 0"),
])
def test_bad_engine_knobs_are_one_line_errors(engine: dict[str, Any], message: str) -> None:
    with pytest.raises(ServesimError, match=message):
        resolve_topology(experiment(engine=engine))


def test_sglang_runs_prefills_alone_and_trtllm_mixes_them() -> None:
    """Ten 3,000-token prompts at once, 4 output tokens each: SGLang's steps are either all
    prefill or all decode; TensorRT-LLM's in-flight batches mix generations with contexts, and
    without chunked prefill never split a prompt (each step's prompt tokens are whole prompts)."""
    workload = table([0.0] * 10, 3000, 4)
    sglang = tabulate(run(experiment(engine="sglang"), workload)).steps
    assert not ((sglang["num_prefills"] > 0) & (sglang["num_decodes"] > 0)).any()
    assert (sglang["prefill_tokens"] <= 8192).all() and sglang["prefill_tokens"].sum() == 30_000
    trt = tabulate(run(experiment(engine="trtllm"), workload)).steps
    assert ((trt["num_prefills"] > 0) & (trt["num_decodes"] > 0)).any()
    assert (trt["prefill_tokens"] % 3000 == 0).all()


def test_no_evict_starts_a_request_only_when_all_its_kv_fits() -> None:
    """A pool of 100 blocks of 32 tokens (3,200 tokens) and requests of 1,000 + 1,000 tokens (63
    blocks at their longest): a second one would need 126 blocks, so they run one at a time and
    nothing is ever preempted, while vLLM's scheduler runs two at once and preempts."""
    workload = table([0.0, 0.0, 0.0], 1000, 1000)
    deployment = {"num_gpu_blocks": 100, "block_size": 32}
    trt = tabulate(run(experiment(deployment, engine="trtllm"), workload))
    assert trt.summary["preemptions"] == 0 and trt.summary["completed"] == 3
    assert trt.steps["running"].max() == 1
    vllm = tabulate(run(experiment(deployment, engine={"name": "vllm"}), workload))
    assert vllm.summary["preemptions"] > 0 and vllm.steps["running"].max() >= 2


workloads = st.integers(min_value=1, max_value=25).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0, 2.0), min_size=n, max_size=n),
    st.lists(st.integers(1, 400), min_size=n, max_size=n),
    st.lists(st.integers(1, 200), min_size=n, max_size=n)))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads, policy=st.sampled_from([
    {"name": "prefill_first"}, {"name": "prefill_first", "mixed": True}, {"name": "no_evict"},
    {"name": "no_evict", "enable_chunked_prefill": True}]),
    blocks=st.integers(8, 120), block_size=st.sampled_from([1, 8, 16]), max_num_seqs=st.integers(1, 16),
    budget=st.sampled_from([64, 512, 8192]))
def test_engine_policies_conserve_requests_and_blocks(workload: tuple[list[float], list[int], list[int]],
                                                      policy: dict[str, Any], blocks: int, block_size: int,
                                                      max_num_seqs: int, budget: int) -> None:
    arrivals, prompts, outputs = workload
    deployment = {"num_gpu_blocks": blocks, "block_size": block_size, "max_num_seqs": max_num_seqs,
                  "max_num_batched_tokens": max(budget, max_num_seqs)}
    config = experiment(deployment, policy=policy, engine="vllm-v0")
    result = run(config, table(np.sort(arrivals), prompts, outputs))
    tables = tabulate(result)
    done = assert_conserved(result, tables, blocks, block_size, max_num_seqs)
    prompt, output = tables.requests["prompt_tokens"].to_numpy(), tables.requests["output_tokens"].to_numpy()
    assert (result.request_state.computed[done] == (prompt + output - 1)[done]).all()
    steps = tables.steps
    assert (steps["prefill_tokens"] + steps["decode_tokens"] <= max(budget, max_num_seqs)).all()
    if policy["name"] == "no_evict":
        assert tables.summary["preemptions"] == 0
