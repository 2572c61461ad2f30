"""The per-GPU memory plan and the KV pool that falls out of it, by hand."""

import math

import pytest

from servesim import Precision, ServesimError, load_hardware, load_model, plan_memory


def test_llama3_8b_on_one_h100_by_hand() -> None:
    model, h100 = load_model("llama-3-8b"), load_hardware("h100-sxm-80gb")
    plan = plan_memory(model, h100, tp=1, gpu_memory_utilization=0.9,
                       max_num_batched_tokens=8192, max_num_seqs=256)
    weights = 8_030_261_248 * 2
    # Peak activations: 8192 tokens x (hidden + residual + gate/up/act = 2*4096 + 3*14336) x 2 B,
    # plus 256 rows of fp32 logits over the 128,256-token vocabulary.
    activations = 8192 * (2 * 4096 + 3 * 14336) * 2 + 256 * 128_256 * 4
    kv = 81559 * 2**20 * 0.9 - 1.0e9 - weights - activations
    assert plan.weight_bytes == weights
    assert plan.activation_bytes == activations
    assert plan.kv_cache_bytes == pytest.approx(kv)
    assert plan.kv_token_capacity == math.floor(kv / 131_072)
    assert plan.num_blocks(16) == math.floor(kv / (131_072 * 16))
    assert 440_000 < plan.kv_token_capacity < 460_000  # about 55 GiB of KV


def test_fp8_kv_cache_doubles_capacity() -> None:
    model, h100 = load_model("llama-3-8b"), load_hardware("h100-sxm-80gb")
    bf16 = plan_memory(model, h100)
    fp8 = plan_memory(model, h100, precision=Precision.from_names(kv_cache="fp8"))
    assert fp8.kv_token_capacity == pytest.approx(2 * bf16.kv_token_capacity, abs=2)


def test_tensor_parallel_frees_memory_for_kv() -> None:
    model, a100 = load_model("llama-2-70b"), load_hardware("a100-sxm-80gb")
    two, four = plan_memory(model, a100, tp=2), plan_memory(model, a100, tp=4)
    assert four.kv_token_capacity > 2 * two.kv_token_capacity  # weights shrink, KV/GPU halves


def test_model_that_cannot_fit_says_how_to_fix_it() -> None:
    too_big = r"^deployment.tp: llama-2-70b needs 1\d\d\.\d GiB per GPU .* use deployment.tp: 2 or more"
    with pytest.raises(ServesimError, match=too_big):
        plan_memory(load_model("llama-2-70b"), load_hardware("a100-sxm-80gb"), tp=1)
    with pytest.raises(ServesimError, match=r"use deployment\.tp: 8 or more"):
        plan_memory(load_model("deepseek-v3"), load_hardware("h200-sxm-141gb"), tp=4,
                    precision=Precision.from_names("fp8", "fp8"))


def test_int4_weights_fit_a_70b_model_on_one_gpu() -> None:
    plan = plan_memory(load_model("llama-2-70b"), load_hardware("a100-sxm-80gb"),
                       precision=Precision.from_names("int4"))
    assert plan.weight_bytes < 40e9 and plan.kv_token_capacity > 0


def test_bad_utilisation_is_rejected() -> None:
    with pytest.raises(ServesimError, match=r"gpu_memory_utilization: must be in \(0, 1\]"):
        plan_memory(load_model("llama-3-8b"), load_hardware("h100-sxm-80gb"),
                    gpu_memory_utilization=1.5)


def test_logits_workspace_holds_the_full_vocabulary_on_every_gpu() -> None:
    from servesim.memory import activation_workspace_bytes
    model = load_model("llama-3-8b")
    one = activation_workspace_bytes(model, 1, max_num_batched_tokens=1, max_num_seqs=256)
    eight = activation_workspace_bytes(model, 8, max_num_batched_tokens=1, max_num_seqs=256)
    logits = 256 * 128_256 * 4
    assert one - logits == (2 * 4096 + 3 * 14336) * 2
    assert eight - logits == (2 * 4096 + 3 * 14336 // 8) * 2


def test_deepseek_fp8_fits_four_b200s_as_measured() -> None:
    """SGLang and TensorRT-LLM served DeepSeek-V3/R1 in FP8 on 4 B200s (the serving file's rows).
    With the memory nvidia-smi reports (183,359 MiB) the plan holds them at a 0.9 memory fraction,
    the KV cache taking what the weights and activations leave; at the HGX page's 180 GB it could
    not."""
    model, b200 = load_model("deepseek-v3"), load_hardware("b200")
    fp8 = Precision.from_names("fp8", "fp8")
    assert b200.memory.capacity_bytes == 183_359 * 2**20
    plan = plan_memory(model, b200, tp=4, gpu_memory_utilization=0.9, precision=fp8)
    kv = 183_359 * 2**20 * 0.9 - 1.0e9 - plan.weight_bytes - plan.activation_bytes
    assert plan.kv_cache_bytes == pytest.approx(kv) and kv > 1e9
    spec_page = b200.model_copy(update={"memory": b200.memory.model_copy(update={"capacity_bytes": 180e9})})
    with pytest.raises(ServesimError, match=r"use deployment\.tp: 8 or more"):
        plan_memory(model, spec_page, tp=4, gpu_memory_utilization=0.9, precision=fp8)
