"""The engine's runtime around the kernels, checked by hand: CUDA-graph padding, launch-bound
eager steps, CPU work serial with the GPU or overlapped with it, and the all-reduce
implementation an engine picks by message size."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.cost.communication import allreduce_kind, allreduce_s, oneshot_wire_bytes, ring_wire_bytes
from servesim.cost.engine_runtime import kernels_per_step
from servesim.engines import RuntimeCosts, make_engine
from servesim.engines.vllm import vllm_capture_sizes
from servesim.hardware import CollectiveFit, Collectives, Curve

LLAMA = load_model("llama-3-8b")
H100 = load_hardware("h100-sxm-80gb")
SIZES = vllm_capture_sizes(512)


def kernels_only(model=LLAMA, hardware=H100, tp: int = 1) -> CostModel:
    return CostModel(model, hardware, tp, runtime=RuntimeCosts.none())


def layer_weights(model=LLAMA) -> int:
    """Weights of the layer GEMMs one token multiplies by (one GPU, TP 1), from the config."""
    h, heads, kv, d, inter = (model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim,
                              model.intermediate_size)
    return model.num_layers * (h * (heads + 2 * kv) * d + heads * d * h + 3 * h * inter)


def test_vllm_capture_sizes_are_vllms_list() -> None:
    assert SIZES[:8] == (1, 2, 4, 8, 16, 24, 32, 40)
    assert SIZES[-3:] == (480, 496, 512) and 256 in SIZES and 264 not in SIZES and 272 in SIZES
    assert len(SIZES) == 3 + 31 + 17


def test_a_decode_batch_of_33_replays_the_graph_of_40() -> None:
    """33 decodes pad to the capture size 40: the GEMMs run 7 more rows, each 2 FLOPs per weight
    of every layer GEMM (the LM head still runs on the 33 real rows). 32 is captured exactly; 600
    is beyond the largest graph and runs eagerly, unpadded."""
    graphs = CostModel(LLAMA, H100, runtime=RuntimeCosts(cuda_graph_sizes=SIZES))
    plain = kernels_only()
    for batch_size, padded in ((33, 40), (32, 32), (600, 600)):
        batch = BatchShape.decode(batch_size, 1000)
        extra = graphs.step(batch).flops - plain.step(batch).flops
        assert extra == pytest.approx(2.0 * (padded - batch_size) * layer_weights(), rel=1e-12)
    batch = BatchShape.decode(33, 1000)
    forty = BatchShape.decode(40, 1000)
    padded_gemms = graphs.step(batch).breakdown["mlp"]
    assert padded_gemms == plain.step(forty).breakdown["mlp"]
    assert graphs.step(batch).breakdown["attn_decode"] == plain.step(batch).breakdown["attn_decode"]


def test_graphs_pad_mixed_steps_only_when_the_engine_captures_them() -> None:
    """vLLM v1 replays piecewise graphs for mixed steps; SGLang and TensorRT-LLM only decodes.
    TensorRT-LLM without padding runs an uncaptured size (33) eagerly."""
    mixed = BatchShape.build(prefill_tokens=[30], decode_context=[500] * 3)  # 33 tokens
    piecewise = CostModel(LLAMA, H100, runtime=RuntimeCosts(cuda_graph_sizes=SIZES, graph_mixed=True))
    decode_only = CostModel(LLAMA, H100, runtime=RuntimeCosts(cuda_graph_sizes=SIZES))
    plain = kernels_only()
    assert piecewise.step(mixed).flops - plain.step(mixed).flops == pytest.approx(
        2.0 * 7 * layer_weights(), rel=1e-12)
    assert decode_only.step(mixed).flops == plain.step(mixed).flops
    unpadded = CostModel(LLAMA, H100, runtime=RuntimeCosts(cuda_graph_sizes=(1, 2, 32, 64),
                                                           graph_padding=False))
    assert unpadded.step(BatchShape.decode(33, 100)).flops == plain.step(BatchShape.decode(33, 100)).flops


def test_a_speculative_verify_step_replays_the_graph_of_its_requests_where_sizes_count_requests() -> None:
    """Five requests verifying three proposals each compute 20 tokens. TensorRT-LLM and SGLang
    capture their graphs by requests (with the draft tokens): the step replays the graph of 8
    requests, padded by 3 whole requests of 4 tokens (12 more GEMM rows), one launch. vLLM's
    sizes count tokens: 20 tokens replay the graph of 24 (4 more rows). Neither runs eagerly,
    which at 1 ms per launch would cost 291 ms; a plain decode of five requests pads to 8 either
    way."""
    verify = BatchShape.build(decode_context=np.full(5, 1000), decode_tokens=np.full(5, 4))
    assert verify.num_new_tokens == 20 and verify.num_decodes == 5
    by_requests = CostModel(LLAMA, H100, runtime=RuntimeCosts(
        cuda_graph_sizes=(1, 2, 4, 8, 16), launch_s=1e-3, graph_counts_requests=True))
    by_tokens = CostModel(LLAMA, H100, runtime=RuntimeCosts(cuda_graph_sizes=SIZES, launch_s=1e-3))
    plain = kernels_only()
    unit = 2.0 * layer_weights()
    assert by_requests.step(verify).flops - plain.step(verify).flops == pytest.approx(12 * unit, rel=1e-12)
    assert by_tokens.step(verify).flops - plain.step(verify).flops == pytest.approx(4 * unit, rel=1e-12)
    for model in (by_requests, by_tokens):
        assert model.step_time(verify) < 0.05  # one graph launch, not 291 eager ones
    decode = BatchShape.decode(5, 1000)
    for model in (by_requests, by_tokens):
        assert model.step(decode).flops - plain.step(decode).flops == pytest.approx(3 * unit, rel=1e-12)
    # 17 requests: beyond the largest graph of 16 requests, so eager, unpadded
    wide = BatchShape.build(decode_context=np.full(17, 1000), decode_tokens=np.full(17, 4))
    assert by_requests.step(wide).flops == plain.step(wide).flops
    assert by_requests.step_time(wide) > 0.29


def test_eager_steps_wait_for_their_launches() -> None:
    """Llama-3-8B launches per layer one QKV, one O and two MLP GEMMs and four fused elementwise
    kernels (8), plus embedding, final norm and LM head: 32 * 8 + 3 = 259 kernels, and one
    decode-attention kernel per layer: 291 launches. At 1 ms per launch the step takes 291 ms,
    far above its kernels; at 1 ns the kernels decide. A full graph is one launch."""
    assert kernels_per_step(LLAMA, 1) == 259
    batch = BatchShape.decode(8, 100)
    kernels = kernels_only().step_time(batch)
    slow = CostModel(LLAMA, H100, runtime=RuntimeCosts(launch_s=1e-3))
    assert slow.step_time(batch) == pytest.approx(291e-3, rel=1e-12)
    assert slow.step(batch).breakdown["overhead"] == pytest.approx(291e-3 - kernels, rel=1e-9)
    fast = CostModel(LLAMA, H100, runtime=RuntimeCosts(launch_s=1e-9))
    assert fast.step_time(batch) == pytest.approx(kernels, rel=1e-12)
    graphed = CostModel(LLAMA, H100, runtime=RuntimeCosts(launch_s=1e-3, cuda_graph_sizes=(8,)))
    assert graphed.step_time(batch) == pytest.approx(max(kernels, 1e-3), rel=1e-12)
    piecewise = CostModel(LLAMA, H100, runtime=RuntimeCosts(launch_s=1e-3, cuda_graph_sizes=(8,),
                                                            graph_decode_full=False))
    assert piecewise.step_time(batch) == pytest.approx(32 * 2 * 1e-3, rel=1e-12)  # graph + attention


@pytest.mark.parametrize("cpu_per_seq_s", [1e-6, 2e-4])
def test_an_overlapped_step_is_max_and_a_serial_one_the_sum(cpu_per_seq_s: float) -> None:
    """CPU per step = 0.5 ms + 64 sequences * per-sequence cost (64 us: under the kernels; 12.8 ms:
    over them)."""
    batch = BatchShape.decode(64, 2000)
    kernels = kernels_only().step_time(batch)
    cpu = 5e-4 + 64 * cpu_per_seq_s
    common = {"step_overhead_s": 5e-4, "cpu_per_seq_s": cpu_per_seq_s}
    serial = CostModel(LLAMA, H100, runtime=RuntimeCosts(**common))
    overlapped = CostModel(LLAMA, H100, runtime=RuntimeCosts(**common, overlap=True))
    assert serial.step_time(batch) == pytest.approx(kernels + cpu, rel=1e-12)
    assert overlapped.step_time(batch) == pytest.approx(max(kernels, cpu), rel=1e-12)
    record = overlapped.step_record(batch)
    assert record.time_s == overlapped.step_time(batch) == overlapped.step(batch).time_s
    assert record.overhead_s == pytest.approx(max(0.0, cpu - kernels), abs=1e-15)
    classes = (record.gemm_s + record.attn_prefill_s + record.attn_decode_s + record.elementwise_s
               + record.communication_s + record.overhead_s)
    assert classes == pytest.approx(record.time_s, rel=1e-12)


@pytest.mark.parametrize("cpu_per_seq_s", [1e-6, 2e-4])
def test_serial_host_work_adds_after_the_overlap(cpu_per_seq_s: float) -> None:
    """time = max(GPU, overlapped CPU) + serial CPU: 64 sequences, 0.5 ms + 64 x per-sequence
    overlapped (hidden under the kernels, then not) and 0.2 ms + 64 x 3 us serial."""
    batch = BatchShape.decode(64, 2000)
    kernels = kernels_only().step_time(batch)
    cpu = 5e-4 + 64 * cpu_per_seq_s
    serial = 2e-4 + 64 * 3e-6
    runtime = RuntimeCosts(step_overhead_s=5e-4, cpu_per_seq_s=cpu_per_seq_s, overlap=True,
                           serial_fixed_s=2e-4, serial_per_seq_s=3e-6)
    assert runtime.serial_s(64, 64, 64) == pytest.approx(serial, rel=1e-12)
    model = CostModel(LLAMA, H100, runtime=runtime)
    assert model.step_time(batch) == pytest.approx(max(kernels, cpu) + serial, rel=1e-12)
    record = model.step_record(batch)
    assert record.overhead_s == pytest.approx(max(kernels, cpu) + serial - kernels, rel=1e-9)
    assert not runtime.is_flat and "serial_fixed_s" in runtime.describe()
    assert "serial_fixed_s" not in RuntimeCosts(overlap=True).describe()


def test_cpu_work_counts_sequences_new_tokens_and_samples() -> None:
    """A step of one 1,000-token prompt chunk that does not finish its prompt and 10 decodes:
    11 sequences, 1,010 new tokens, 10 sampled tokens."""
    runtime = RuntimeCosts(step_overhead_s=1e-4, cpu_per_seq_s=1e-5, cpu_per_token_s=1e-7,
                           cpu_per_sample_s=1e-6)
    batch = BatchShape.build(prefill_tokens=[1000], prefill_context=[0], prefill_emits=[False],
                             decode_context=[100] * 10)
    expected = 1e-4 + 11 * 1e-5 + 1010 * 1e-7 + 10 * 1e-6
    assert runtime.cpu_s(11, 1010, 10) == pytest.approx(expected)
    model = CostModel(LLAMA, H100, runtime=runtime)
    assert model.step_time(batch) - kernels_only().step_time(batch) == pytest.approx(expected, rel=1e-9)


FITS = Collectives(nccl=CollectiveFit(latency_s=6e-6, latency_per_peer_s=1.4e-6, efficiency=0.8),
                   oneshot=CollectiveFit(latency_s=4e-6, efficiency=0.6),
                   twoshot=CollectiveFit(latency_s=6e-6, efficiency=0.7), eager_call_s=16e-6)


def test_the_custom_all_reduce_picks_its_kernel_by_message_size() -> None:
    """vLLM: one-shot at 2 GPUs and below 256 KiB at 8, two-shot below 8 MiB, NCCL above."""
    vllm = RuntimeCosts(allreduce="custom")
    assert allreduce_kind(4 * 2**20, 2, vllm) == "oneshot"
    assert allreduce_kind(255 * 2**10, 8, vllm) == "oneshot"
    assert allreduce_kind(256 * 2**10, 8, vllm) == "twoshot"
    assert allreduce_kind(511 * 2**10, 4, vllm) == "oneshot"
    assert allreduce_kind(8 * 2**20, 8, vllm) == "nccl"
    assert allreduce_kind(1024, 8, RuntimeCosts(allreduce="nccl")) == "nccl"
    hardware = H100.model_copy(update={"collectives": FITS})
    bw = hardware.interconnect.bandwidth_Bps
    small = 16 * 2**10
    assert allreduce_s(small, 8, vllm, hardware) == pytest.approx(4e-6 + 7 * small / (bw * 0.6))
    assert oneshot_wire_bytes(small, 8) == 7 * small
    medium = 2 * 2**20
    assert allreduce_s(medium, 8, vllm, hardware) == pytest.approx(6e-6 + 1.75 * medium / (bw * 0.7))
    assert ring_wire_bytes(medium, 8) == 1.75 * medium
    large = 64 * 2**20
    assert allreduce_s(large, 8, vllm, hardware) == pytest.approx(
        6e-6 + 7 * 1.4e-6 + 1.75 * large / (bw * 0.8))


MIB = 2**20


def vllm_runtime(hardware: str = "h100-sxm-80gb", **knobs: object) -> RuntimeCosts:
    return make_engine("vllm", dict(knobs)).runtime(hardware, tp=8)


def test_vllm_sends_mid_sized_all_reduces_to_symmetric_memory_by_gpu_and_group() -> None:
    """vLLM's size tables (``all_reduce_utils.py``): on Hopper (9.0) 8 GPUs run the custom
    all-reduce below 256 KiB and symmetric memory up to 64 MiB inclusive; 4 GPUs keep the custom
    kernel up to its 8 MiB buffer, then symmetric memory to 32 MiB; on B200 (10.0) 2 GPUs switch at
    2 MiB and stop at 8 MiB, 8 GPUs switch at 1 MiB and stop at 128 MiB. An A100 (8.0, not in the
    tables) and a profile without a capability keep the custom kernel below 8 MiB and NCCL above."""
    vllm = vllm_runtime()
    assert allreduce_kind(256 * 2**10 - 2, 8, vllm, "9.0") == "oneshot"
    assert allreduce_kind(256 * 2**10, 8, vllm, "9.0") == "symm_mem"
    assert allreduce_kind(64 * MIB, 8, vllm, "9.0") == "symm_mem"
    assert allreduce_kind(64 * MIB + 4, 8, vllm, "9.0") == "nccl"
    assert allreduce_kind(8 * MIB - 2, 4, vllm, "9.0") == "twoshot"
    assert allreduce_kind(8 * MIB, 4, vllm, "9.0") == "symm_mem"
    assert allreduce_kind(32 * MIB + 4, 4, vllm, "9.0") == "nccl"
    assert allreduce_kind(2 * MIB - 2, 2, vllm, "10.0") == "oneshot"
    assert allreduce_kind(2 * MIB, 2, vllm, "10.0") == "symm_mem"
    assert allreduce_kind(8 * MIB + 4, 2, vllm, "10.0") == "nccl"
    assert allreduce_kind(MIB - 2, 8, vllm, "10.0") == "twoshot"
    assert allreduce_kind(MIB, 8, vllm, "10.0") == "symm_mem"
    assert allreduce_kind(128 * MIB, 8, vllm, "10.0") == "symm_mem"
    for capability in ("8.0", None):
        assert allreduce_kind(4 * MIB, 8, vllm, capability) == "twoshot"
        assert allreduce_kind(8 * MIB, 8, vllm, capability) == "nccl"
    assert load_hardware("b200").compute_capability == "10.0"
    assert load_hardware("h200-sxm-141gb").compute_capability == "9.0"


def test_the_custom_all_reduce_runs_only_at_two_four_six_or_eight_gpus() -> None:
    """vLLM's and SGLang's ``CustomAllreduce`` disable themselves at other group sizes: a TP 16
    group inside a GB200 NVL72 rack sends even a 16 KiB message to NCCL (vLLM's symmetric memory
    has no entry for 16 GPUs either), where TensorRT-LLM (no such limit here) keeps its custom
    kernel (two-shot: the one-shot limits end at 8 GPUs); at 8 GPUs both run the custom kernel."""
    gb200 = load_hardware("gb200-nvl72")
    for name in ("vllm", "sglang"):
        runtime = make_engine(name, {}).runtime("gb200-nvl72", tp=16)
        assert allreduce_kind(16 * 2**10, 16, runtime, gb200.compute_capability) == "nccl"
        assert allreduce_kind(16 * 2**10, 8, runtime, gb200.compute_capability) == "oneshot"
    trtllm = make_engine("trtllm", {}).runtime("gb200-nvl72", tp=16)
    assert allreduce_kind(16 * 2**10, 16, trtllm, gb200.compute_capability) == "twoshot"


def test_vllms_all_reduce_switches_follow_its_flags() -> None:
    """``allreduce_use_symm_mem: false`` (``VLLM_ALLREDUCE_USE_SYMM_MEM=0``) restores the custom
    kernel below its 8 MiB buffer and NCCL above on every GPU; ``disable_custom_all_reduce`` leaves
    symmetric memory its sizes and sends everything below them to NCCL; both off is NCCL
    throughout."""
    no_symm = vllm_runtime(allreduce_use_symm_mem=False)
    assert allreduce_kind(256 * 2**10, 8, no_symm, "9.0") == "twoshot"
    assert allreduce_kind(8 * MIB, 8, no_symm, "9.0") == "nccl"
    no_custom = vllm_runtime(disable_custom_all_reduce=True)
    assert allreduce_kind(1024, 8, no_custom, "9.0") == "symm_mem"
    assert allreduce_kind(64 * MIB + 4, 8, no_custom, "9.0") == "nccl"
    assert allreduce_kind(1024, 8, no_custom, "8.0") == "nccl"
    neither = vllm_runtime(disable_custom_all_reduce=True, allreduce_use_symm_mem=False)
    assert neither.allreduce == "nccl"


def test_symmetric_memory_is_priced_by_its_own_fit_or_as_nccl() -> None:
    """A symmetric-memory all-reduce of ``n`` bytes over 8 GPUs costs its fit's latency plus
    ``2 (w-1)/w n`` bytes over its achieved bandwidth; a profile without a ``symm_mem`` fit prices
    the same message as NCCL's."""
    symm = CollectiveFit(latency_s=9e-6, efficiency=0.75)
    hardware = H100.model_copy(update={"collectives": FITS.model_copy(update={"symm_mem": symm})})
    bw, vllm, message = hardware.interconnect.bandwidth_Bps, vllm_runtime(), 16 * MIB
    assert allreduce_s(message, 8, vllm, hardware) == pytest.approx(9e-6 + 1.75 * message / (bw * 0.75))
    without = H100.model_copy(update={"collectives": FITS})
    as_nccl = 6e-6 + 7 * 1.4e-6 + 1.75 * message / (bw * 0.8)
    assert allreduce_s(message, 8, vllm, without) == pytest.approx(as_nccl)


def test_nccls_bandwidth_fraction_follows_the_group_and_the_message_size() -> None:
    """A fit with a curve for 8 GPUs prices an 8-GPU all-reduce at the curve's efficiency for its
    wire bytes (log-linear between knots, clamped at the ends) and every other group size at the
    single fraction."""
    curve = Curve(axis="bytes", x=(2**22, 2**26), y=(0.4, 0.9))
    nccl = CollectiveFit(latency_s=6e-6, latency_per_peer_s=1.4e-6, efficiency=0.8,
                         efficiency_by_world={8: curve})
    hardware = H100.model_copy(update={"collectives": FITS.model_copy(update={"nccl": nccl})})
    bw, vllm = hardware.interconnect.bandwidth_Bps, RuntimeCosts(allreduce="custom")
    latency = 6e-6 + 7 * 1.4e-6
    huge = 2**30  # wire 1.75 GiB: past the last knot
    assert allreduce_s(huge, 8, vllm, hardware) == pytest.approx(latency + 1.75 * huge / (bw * 0.9))
    wire = 2**24  # half way between the knots in log bytes: efficiency 0.65
    message = wire / 1.75
    assert allreduce_s(message, 8, vllm, hardware) == pytest.approx(latency + wire / (bw * 0.65))
    assert allreduce_s(huge, 4, vllm, hardware) == pytest.approx(
        6e-6 + 3 * 1.4e-6 + 1.5 * huge / (bw * 0.8))


def test_the_collective_fit_recovers_a_group_dependent_bandwidth() -> None:
    """nccl-tests-like rows where 8 GPUs reach 0.95 of the link for large messages and 2 GPUs
    0.7 (NVLS against a ring): the fitted curves price both groups within 3% where one fraction
    cannot get within 10% of both."""
    from servesim.calibration.collective_fit import fit_one, predict_fit, with_efficiency_curves

    link = H100.interconnect
    sizes = 2.0 ** np.arange(20, 31)
    message = np.concatenate([sizes, sizes])
    world = np.concatenate([np.full(sizes.size, 2), np.full(sizes.size, 8)])
    wire = 2 * (world - 1) / world * message
    top = np.where(world == 8, 0.95, 0.7)
    efficiency = top * np.minimum(1.0, (message / 2**26) ** 0.3)
    time_s = 8e-6 + wire / (link.bandwidth_Bps * efficiency)
    single = fit_one("nccl", message, world, time_s, link)
    curved = with_efficiency_curves(single, "nccl", message, world, time_s, link)
    assert curved.efficiency_by_world is not None and set(curved.efficiency_by_world) == {2, 8}
    big = message >= 2**27
    error = np.abs(predict_fit(curved, "nccl", message, world, link) / time_s - 1)
    single_error = np.abs(predict_fit(single, "nccl", message, world, link) / time_s - 1)
    assert error[big].max() < 0.03
    assert single_error[big].max() > 0.10


def test_a_tp8_decode_step_pays_the_engines_all_reduce() -> None:
    """Llama-3-70B at TP 8, batch 1: 2 * 80 + 1 all-reduces of one 8,192-wide bf16 row (16 KiB)
    and one logits gather. With the custom all-reduce each costs the one-shot fit; eagerly each
    call also costs the measured 16 us of host time, which the graph avoids."""
    model = load_model("llama-3-70b")
    hardware = H100.model_copy(update={"collectives": FITS})
    batch = BatchShape.decode(1, 1000)
    custom = CostModel(model, hardware, 8, runtime=RuntimeCosts(allreduce="custom"))
    one = 4e-6 + 7 * 16384 / (hardware.interconnect.bandwidth_Bps * 0.6)
    gather_bytes = model.vocab_size * 2 * 7 / 8
    gather = 6e-6 + 7 * 1.4e-6 + gather_bytes / (hardware.interconnect.bandwidth_Bps * 0.8)
    assert custom.step(batch).breakdown["communication"] == pytest.approx(161 * one + gather, rel=1e-9)
    eager = CostModel(model, hardware, 8, runtime=RuntimeCosts(allreduce="custom", launch_s=1e-9))
    launch = eager._engine.launch_s(batch, "eager")  # type: ignore[union-attr]
    assert launch == pytest.approx((kernels_per_step(model, 1) + 80) * 1e-9 + 162 * 16e-6)
    assert math.isclose(eager.step_time(batch), max(custom.step_time(batch), launch), rel_tol=1e-12)


def test_vllm_v0_keeps_servesim_01s_flat_runtime() -> None:
    runtime = make_engine("vllm-v0", {}).runtime("h100-sxm-80gb")
    assert runtime.is_flat and runtime.allreduce == "ring" and runtime.step_overhead_s == 6e-4
    multi = make_engine("vllm-v0", {"num_scheduler_steps": 8}).runtime("h100-sxm-80gb")
    assert multi.step_overhead_s == pytest.approx(6e-4 / 8)
