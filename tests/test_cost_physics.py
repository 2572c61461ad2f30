"""The roofline physics of the cost model, checked against hand computations.

Most checks use the textbook A100 (efficiency 1, no overheads, 2.0 TB/s, 312 TFLOP/s) so that the
expected numbers follow from FLOPs and bytes alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from servesim import (
    BatchShape,
    CostModel,
    HardwareProfile,
    ModelSpec,
    Precision,
    ServesimError,
    load_hardware,
)
from servesim.cost import causal_pairs, ring_allgather_s, ring_allreduce_s
from servesim.cost.communication import allgather_s, allreduce_s
from servesim.engines import RuntimeCosts, make_engine
from servesim.model_config import load_model, model_from_hf_config

KERNELS = RuntimeCosts.none()
"""The textbook roofline has no serving engine: a step costs its kernels alone."""


def engine_for(profile: HardwareProfile) -> RuntimeCosts | None:
    """No engine for a textbook (ideal) profile; the default engine's step cost on a real one."""
    return KERNELS if profile.name.endswith("(ideal)") else None


def seven_billion_model() -> ModelSpec:
    """Llama-2-7B's shape with the vocabulary stretched so that exactly ~7.0e9 parameters take
    part in matmuls (4096-wide, 32 layers: 6,476,005,376 in the layers + 4096 x 127,928 head)."""
    return model_from_hf_config({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                                 "num_hidden_layers": 32, "num_attention_heads": 32,
                                 "num_key_value_heads": 32, "vocab_size": 127_928}, "7b")


def op(cost, name: str):  # sum of one operator class's records
    flops = sum(o.flops for o in cost.ops if o.name == name)
    nbytes = sum(o.bytes for o in cost.ops if o.name == name)
    return flops, nbytes


# ----------------------------------------------------------------------------- decode bound
def test_7b_fp16_decodes_one_sequence_at_about_143_tokens_per_s(textbook_a100: HardwareProfile) -> None:
    model = seven_billion_model()
    assert model.matmul_params_per_token == pytest.approx(7.0e9, rel=1e-6)
    cost = CostModel(model, textbook_a100, precision=Precision.from_names("fp16", "fp16", "fp16"),
                     runtime=KERNELS)
    step = cost.step(BatchShape.decode(1, 0))
    # 7e9 weights x 2 bytes read once per token over 2 TB/s = 7 ms -> 142.9 tokens/s.
    assert 1 / step.time_s == pytest.approx(2.0e12 / (7.0e9 * 2), rel=0.01)
    assert 1 / step.time_s == pytest.approx(143, rel=0.01)
    assert step.bound == "memory"


def test_batch1_decode_intensity_is_one_flop_per_byte_against_ridge_156(
        textbook_a100: HardwareProfile, llama2_7b: ModelSpec) -> None:
    step = CostModel(llama2_7b, textbook_a100, runtime=KERNELS).step(BatchShape.decode(1, 0))
    # Each weight is read once (2 bytes) and used in one multiply-add (2 FLOPs).
    assert step.arithmetic_intensity == pytest.approx(1.0, rel=0.02)
    assert textbook_a100.ridge_point() == pytest.approx(156, rel=0.001)


def test_decode_time_is_flat_in_batch_until_the_ridge(textbook_a100: HardwareProfile,
                                                       llama3_8b: ModelSpec) -> None:
    cost = CostModel(llama3_8b, textbook_a100, runtime=KERNELS)
    t = {b: cost.step_time(BatchShape.decode(b, 16)) for b in (1, 16, 64, 128, 1024, 2048)}
    # Below the ridge (~156 sequences) the 16 GB of weights dominate: more sequences add only
    # their activations (~5 MB per layer at 64) and KV reads, so the time barely moves.
    assert t[64] / t[1] < 1.08
    assert t[128] / t[1] < 1.15
    assert cost.step(BatchShape.decode(128, 16)).bound == "memory"
    # Far past it the step is compute-bound and time grows with the batch.
    assert cost.step(BatchShape.decode(2048, 16)).bound == "compute"
    assert t[2048] / t[1024] == pytest.approx(2.0, rel=0.05)


def test_prefill_time_grows_linearly_past_its_knee(textbook_a100: HardwareProfile,
                                                    llama3_8b: ModelSpec) -> None:
    cost = CostModel(llama3_8b, textbook_a100, runtime=KERNELS)
    small = cost.step_time(BatchShape.prefill(8))
    tiny = cost.step_time(BatchShape.prefill(1))
    assert small / tiny < 1.02  # 8 tokens still ride on one read of the weights
    t16 = cost.step_time(BatchShape.prefill(*[512] * 16))
    t32 = cost.step_time(BatchShape.prefill(*[512] * 32))
    assert t32 / t16 == pytest.approx(2.0, rel=0.03)
    assert cost.step(BatchShape.prefill(*[512] * 16)).bound == "compute"


# ----------------------------------------------------------------------------- quantisation
def test_int4_weights_speed_decode_3_to_4x_and_barely_change_long_prefill(
        textbook_a100: HardwareProfile, a100: HardwareProfile, llama2_7b: ModelSpec) -> None:
    bf16, int4 = Precision(), Precision.from_names("int4", "bf16")
    decode, prefill = BatchShape.decode(1, 128), BatchShape.prefill(8192)

    def speedup(profile: HardwareProfile, batch: BatchShape) -> float:
        return (CostModel(llama2_7b, profile, precision=bf16, runtime=engine_for(profile)).step_time(batch)
                / CostModel(llama2_7b, profile, precision=int4, runtime=engine_for(profile)).step_time(batch))

    # Pure roofline: 2 bytes -> 0.516 bytes for the layers, embedding/head stay 16-bit.
    assert 3.0 <= speedup(textbook_a100, decode) <= 4.0
    assert speedup(textbook_a100, prefill) == pytest.approx(1.0, abs=0.02)
    # With kernel floors and the per-step overhead the gain shrinks but stays large.
    assert speedup(a100, decode) > 2.0
    assert speedup(a100, prefill) == pytest.approx(1.0, abs=0.05)


def test_fp8_w8a8_doubles_gemm_throughput_and_leaves_attention_alone(llama3_8b: ModelSpec) -> None:
    ideal = load_hardware("h100-sxm-80gb").ideal()
    prefill = BatchShape.prefill(*[512] * 16)
    bf16 = CostModel(llama3_8b, ideal, runtime=KERNELS).step(prefill)
    fp8 = Precision.from_names("fp8", "fp8", "fp8")
    w8a8 = CostModel(llama3_8b, ideal, precision=fp8, runtime=KERNELS).step(prefill)
    # Compute-bound GEMMs run on the 2x FP8 peak, after quantising their 16-bit input (read twice,
    # written once in 8 bits: 5 bytes per element at the full bandwidth of the ideal profile);
    # attention math and the 16-bit residual stream (norms, activations) are unchanged.
    peak_ratio = 1978.9 / 989.4  # the spec sheet's FP8 and BF16 dense peaks
    tokens, h, layers = 16 * 512, llama3_8b.hidden_size, llama3_8b.num_layers
    quantise = lambda k: layers * tokens * k * 5 / ideal.memory.bandwidth_Bps  # noqa: E731
    mlp_inputs = quantise(h) + quantise(llama3_8b.intermediate_size)
    assert w8a8.breakdown["mlp"] == pytest.approx(bf16.breakdown["mlp"] / peak_ratio + mlp_inputs, rel=1e-9)
    assert w8a8.breakdown["qkv_proj"] == pytest.approx(bf16.breakdown["qkv_proj"] / peak_ratio + quantise(h),
                                                       rel=1e-9)
    assert w8a8.breakdown["attn_prefill"] < bf16.breakdown["attn_prefill"]  # half the KV bytes
    assert w8a8.breakdown["elementwise"] == bf16.breakdown["elementwise"]
    assert 1.5 < bf16.time_s / w8a8.time_s < 1.6  # 1.57: the quantisation passes eat a quarter of the gain


def test_steps_that_sample_nothing_skip_the_lm_head(textbook_a100: HardwareProfile,
                                                    llama3_8b: ModelSpec) -> None:
    middle_chunk = BatchShape.build([512], [512], prefill_emits=[False])
    step = CostModel(llama3_8b, textbook_a100, runtime=KERNELS).step(middle_chunk)
    assert step.breakdown["lm_head"] == 0.0 and op(step, "lm_head") == (0.0, 0.0)


def test_lm_head_stays_16_bit_under_fp8(llama3_8b: ModelSpec) -> None:
    ideal = load_hardware("h100-sxm-80gb").ideal()
    batch = BatchShape.decode(256, 100)
    bf16 = CostModel(llama3_8b, ideal, runtime=KERNELS).step(batch)
    fp8 = CostModel(llama3_8b, ideal, precision=Precision.from_names("fp8", "fp8", "fp8"),
                    runtime=KERNELS).step(batch)
    assert op(fp8, "lm_head") == op(bf16, "lm_head")
    assert fp8.breakdown["lm_head"] == bf16.breakdown["lm_head"]


# ----------------------------------------------------------------------------- operators by hand
def test_gemm_flops_and_bytes_by_hand(textbook_a100: HardwareProfile, llama3_8b: ModelSpec) -> None:
    step = CostModel(llama3_8b, textbook_a100, runtime=KERNELS).step(BatchShape.prefill(1000))
    qkv_width = (32 + 2 * 8) * 128  # 6144 output columns of the fused QKV GEMM
    flops, nbytes = op(step, "qkv_proj")
    assert flops == 32 * 2 * 1000 * 4096 * qkv_width
    assert nbytes == 32 * (4096 * qkv_width + 1000 * (4096 + qkv_width)) * 2
    flops, _ = op(step, "mlp")
    assert flops == 32 * 2 * 1000 * 4096 * (2 * 14336 + 14336)
    flops, nbytes = op(step, "lm_head")  # one sampled row for the one prompt
    assert flops == 2 * 1 * 4096 * 128_256
    assert nbytes == (4096 * 128_256 + 1 * (4096 + 128_256)) * 2


def test_causal_pairs_by_hand() -> None:
    none = None
    assert causal_pairs(np.array([4]), np.array([0]), none)[0] == 1 + 2 + 3 + 4
    assert causal_pairs(np.array([2]), np.array([3]), none)[0] == 4 + 5
    assert causal_pairs(np.array([4]), np.array([0]), 2)[0] == 1 + 2 + 2 + 2
    assert causal_pairs(np.array([3]), np.array([5]), 4)[0] == 4 + 4 + 4


def test_attention_flops_and_kv_bytes_by_hand(textbook_a100: HardwareProfile,
                                              llama3_8b: ModelSpec) -> None:
    batch = BatchShape.build([100], [0], decode_context=[999, 1999])
    step = CostModel(llama3_8b, textbook_a100, runtime=KERNELS).step(batch)
    per_pair = 2 * 32 * (128 + 128)  # QK^T and PV over 32 heads of width 128
    flops, _ = op(step, "attn_prefill")
    assert flops == 32 * per_pair * (100 * 101 / 2)
    flops, nbytes = op(step, "attn_decode")
    keys = 1000 + 2000  # each new token attends to its context and itself
    assert flops == 32 * per_pair * keys
    kv_token_layer = 2 * 8 * 128 * 2  # K and V of 8 heads, bf16
    qo = 2 * 32 * (128 + 128) * 2  # two queries read, two outputs written
    assert nbytes == 32 * ((keys + 2) * kv_token_layer + qo)


def test_chunked_prefill_rereads_earlier_kv(textbook_a100: HardwareProfile, a100: HardwareProfile,
                                           llama3_8b: ModelSpec) -> None:
    """Splitting a 4096-token prompt into 512-token chunks does the same attention FLOPs but
    re-reads the KV of earlier chunks. On the pure roofline a compute-bound prefill costs the
    same either way; the real cost of chunking comes from smaller, less efficient kernels and
    per-kernel floors, so it shows with the A100 profile."""

    def chunked(profile: HardwareProfile) -> tuple[object, list]:
        cost = CostModel(llama3_8b, profile, runtime=engine_for(profile))
        return cost.step(BatchShape.prefill(4096)), [
            cost.step(BatchShape.build([512], [start], prefill_emits=[start + 512 == 4096]))
            for start in range(0, 4096, 512)]

    whole, chunks = chunked(textbook_a100)
    assert sum(op(c, "attn_prefill")[0] for c in chunks) == pytest.approx(op(whole, "attn_prefill")[0])
    assert sum(op(c, "attn_prefill")[1] for c in chunks) > op(whole, "attn_prefill")[1]
    assert sum(c.time_s for c in chunks) == pytest.approx(whole.time_s, rel=1e-9)
    whole, chunks = chunked(a100)
    assert sum(c.time_s for c in chunks) > 1.02 * whole.time_s


def test_sliding_window_caps_attention_cost() -> None:
    mistral = load_model("mistral-7b")
    cost = CostModel(mistral, load_hardware("h100-sxm-80gb").ideal(), runtime=KERNELS)
    at_window = cost.step(BatchShape.decode(8, 4095))
    beyond = cost.step(BatchShape.decode(8, 20_000))
    assert op(beyond, "attn_decode") == op(at_window, "attn_decode")


def test_mla_decode_reads_the_latent_cache() -> None:
    model = load_model("deepseek-v3")
    cost = CostModel(model, load_hardware("h200-sxm-141gb").ideal(), tp=8, runtime=KERNELS)
    step = cost.step(BatchShape.decode(4, 1023))
    _, nbytes = op(step, "attn_decode")
    latent = 576 * 2  # kv_lora_rank 512 + rope 64, bf16, shared by all 16 local heads
    qo = 4 * 16 * ((512 + 64) + 512) * 2  # absorbed form: 576-wide queries, 512-wide outputs
    assert nbytes == 61 * ((4 * 1024 + 4) * latent + qo)


def test_mla_down_projections_run_as_one_gemm() -> None:
    """vLLM's and SGLang's ``fused_qkv_a_proj`` (TensorRT-LLM's fused A projection): ``q_a``
    (7,168 -> 1,536) and ``kv_a`` (7,168 -> 576) read one input in one GEMM, so a decode step's
    projections are three GEMMs per layer, the fused one, ``q_b`` (1,536 -> 16 local heads x 192)
    and ``kv_b`` (512 -> 16 x 256); bf16 bytes: each GEMM's weights, its input and its output
    (the hidden state is read once, not twice)."""
    cost = CostModel(load_model("deepseek-v3"), load_hardware("h200-sxm-141gb").ideal(), tp=8,
                     runtime=KERNELS)
    step = cost.step(BatchShape.decode(4, 1023))
    shapes = [(7168, 1536 + 576), (1536, 16 * 192), (512, 16 * 256)]
    assert op(step, "qkv_proj") == (61 * sum(2 * 4 * k * n for k, n in shapes),
                                    61 * sum(2 * (k * n + 4 * k + 4 * n) for k, n in shapes))


def test_moe_decode_reads_only_the_routed_experts() -> None:
    mixtral = load_model("mixtral-8x7b")
    ideal = load_hardware("h100-sxm-80gb").ideal()
    step = CostModel(mixtral, ideal, runtime=KERNELS).step(BatchShape.decode(1, 0))
    # One token touches top-2 of 8 experts: HBM traffic is about the active weights.
    weights = 2 * (mixtral.active_param_count - mixtral.embedding_params)
    assert step.hbm_bytes == pytest.approx(weights, rel=0.01)
    # A big batch hits every expert, so the bytes approach all the weights.
    big = CostModel(mixtral, ideal, runtime=KERNELS).step(BatchShape.decode(256, 0))
    assert op(big, "moe")[1] == pytest.approx(32 * 8 * 3 * 4096 * 14336 * 2, rel=0.02)


# ----------------------------------------------------------------------------- tensor parallelism
def test_tensor_parallel_communication_by_hand(llama3_8b: ModelSpec) -> None:
    h100 = load_hardware("h100-sxm-80gb")
    link = h100.interconnect
    tokens, tp = 256, 4
    step = CostModel(llama3_8b, h100, tp=tp).step(BatchShape.decode(tokens, 100))
    message = tokens * 4096 * 2
    one = link.latency_s + 2 * (tp - 1) / tp * message / (link.bandwidth_Bps * link.efficiency)
    assert ring_allreduce_s(message, tp, link) == pytest.approx(one)
    gather = ring_allgather_s(tokens * 128_256 * 2, tp, link)
    assert step.breakdown["communication"] == pytest.approx((2 * 32 + 1) * one + gather)
    assert CostModel(llama3_8b, h100).step(BatchShape.decode(tokens, 100)).breakdown["communication"] == 0


def test_a_qk_norm_over_all_heads_all_reduces_its_statistics_every_layer() -> None:
    """MiniMax-M2 at TP 2: each layer's QK-norm spans heads on both GPUs, so besides the two
    residual all-reduces per layer (and the embedding's) it all-reduces each token's two fp32 sums
    of squares, once per layer (vLLM's fused q and k reduction); one GPU reduces nothing."""
    b200 = load_hardware("b200")
    model, tokens = load_model("minimax-m2.5"), 4
    runtime = make_engine("vllm", {}).runtime(b200.name)
    step = CostModel(model, b200, tp=2, runtime=runtime).step(BatchShape.decode(tokens, 1500))
    residual = allreduce_s(tokens * 3072 * 2, 2, runtime, b200)
    norms = allreduce_s(tokens * 2 * 4, 2, runtime, b200)
    gather = allgather_s(tokens * 200_064 * 2, 2, runtime, b200)
    assert step.breakdown["communication"] == pytest.approx((2 * 62 + 1) * residual + 62 * norms + gather)
    assert 62 * norms > 0.1e-3  # latency-bound: a tenth of a millisecond or more per step


def test_tensor_parallel_shards_weight_reads(textbook_a100: HardwareProfile) -> None:
    model = load_model("llama-2-70b")
    batch = BatchShape.decode(1, 0)
    one = CostModel(model, textbook_a100, tp=1, runtime=KERNELS).step(batch)
    four = CostModel(model, textbook_a100, tp=4, runtime=KERNELS).step(batch)
    assert op(four, "mlp")[1] == pytest.approx(op(one, "mlp")[1] / 4, rel=1e-3)
    assert four.time_s - four.breakdown["communication"] == pytest.approx(
        one.time_s / 4, rel=0.02)


def test_slow_links_make_tensor_parallel_prefill_communication_bound(llama3_8b: ModelSpec) -> None:
    step = CostModel(llama3_8b, load_hardware("a100-pcie-80gb"), tp=8).step(BatchShape.prefill(4096))
    assert step.bound == "communication"


# ----------------------------------------------------------------------------- bookkeeping
def test_breakdown_sums_to_step_time_and_fast_path_agrees(a100: HardwareProfile) -> None:
    cost = CostModel(load_model("deepseek-v3"), load_hardware("h200-sxm-141gb"), tp=8)
    batch = BatchShape.build([700, 33], [1024, 0], [5, 900, 4000], prefill_emits=[False, True])
    step = cost.step(batch)
    assert sum(step.breakdown.values()) == pytest.approx(step.time_s, rel=1e-12)
    assert sum(step.bound_s.values()) == pytest.approx(step.time_s, rel=1e-12)
    assert cost.step_time(batch) == step.time_s
    assert cost.step(batch) == step  # deterministic, and the memo changes nothing


def test_empty_batch_costs_nothing(llama3_8b: ModelSpec, a100: HardwareProfile) -> None:
    assert CostModel(llama3_8b, a100).step_time(BatchShape.build()) == 0.0


def test_batch_from_engine_view_classifies_requests() -> None:
    batch = BatchShape.from_requests(new_tokens=np.array([512, 1, 88, 1, 300]),
                                     computed_tokens=np.array([0, 700, 512, 99, 0]),
                                     total_tokens=np.array([1000, 701, 600, 100, 300]))
    # A prompt chunk, a decode, a final chunk, a decode, and a recompute after preemption.
    assert batch.prefill_tokens.tolist() == [512, 88, 300]
    assert batch.prefill_context.tolist() == [0, 512, 0]
    assert batch.prefill_emits.tolist() == [False, True, True]
    assert batch.decode_context.tolist() == [700, 99]
    assert batch.num_new_tokens == 512 + 1 + 88 + 1 + 300
    assert batch.num_logits == 4


def test_batch_from_engine_view_rejects_impossible_requests() -> None:
    with pytest.raises(ServesimError, match="at least one token"):
        BatchShape.from_requests(np.array([0]), np.array([5]), np.array([10]))
    with pytest.raises(ServesimError, match="exceeds the request's tokens"):
        BatchShape.from_requests(np.array([300]), np.array([600]), np.array([700]))


# ----------------------------------------------------------------------------- review regressions
def test_sliding_window_prefill_and_decode_read_the_same_keys() -> None:
    """One token at context 4096 under Mistral's 4096 window sees 4096 keys either way."""
    cost = CostModel(load_model("mistral-7b"), load_hardware("h100-sxm-80gb").ideal(), runtime=KERNELS)
    as_prefill = cost.step(BatchShape.build([1], [4096]))
    as_decode = cost.step(BatchShape.decode(1, 4096))
    assert op(as_prefill, "attn_prefill") == op(as_decode, "attn_decode")


def test_mla_chunked_prefill_reexpands_the_context_latents() -> None:
    model = load_model("deepseek-v3")
    cost = CostModel(model, load_hardware("h200-sxm-141gb").ideal(), tp=8, runtime=KERNELS)
    fresh = cost.step(BatchShape.build([512], [0]))
    later = cost.step(BatchShape.build([512], [16_384]))
    # kv_b turns 16,384 cached 512-wide latents into K-nope and V for 16 local heads, per layer.
    extra = 61 * 2 * 16_384 * 512 * 16 * (128 + 128)
    assert op(later, "qkv_proj")[0] - op(fresh, "qkv_proj")[0] == pytest.approx(extra)
