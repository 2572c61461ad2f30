"""Nemotron-H hybrids (Nemotron-3-Nano-30B-A3B, Nemotron-Nano-9B-v2): blocks of one mixer or one
FFN each, read from ``hybrid_override_pattern``; Mamba2 blocks as linear-attention layers with
Mamba's projections; counted by hand against the model cards."""

from __future__ import annotations

import pytest

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.engines import make_engine
from servesim.errors import ServesimError
from servesim.model_config import model_from_hf_config

NANO3_H, NANO3_VOCAB = 2688, 131072


def mamba_block(h: int, heads: int, head_dim: int, groups: int, state: int, kernel: int = 4) -> int:
    """A Mamba2 block's weights: in_proj (x, z, B, C, dt), the conv's taps and bias over x, B and
    C, A_log, D and dt_bias per head, the gated RMSNorm and out_proj."""
    inner, bc = heads * head_dim, 2 * groups * state
    conv = inner + bc
    return h * (2 * inner + bc + heads) + conv * kernel + conv + 3 * heads + inner + inner * h


def attention_block(h: int, heads: int, kv_heads: int, head_dim: int) -> int:
    return h * (heads + 2 * kv_heads) * head_dim + heads * head_dim * h


def test_nemotron_3_nano_counted_by_hand() -> None:
    """52 blocks: 23 Mamba2, 6 attention, 23 MoE (128 squared-ReLU experts of 1856, top-6, and a
    shared one of 3712); one RMSNorm per block; untied embeddings. The card: 31.6B total, 3.2B
    active (3.6B with the embeddings)."""
    model = load_model("nemotron-3-nano-30b-a3b")
    h = NANO3_H
    mamba = mamba_block(h, 64, 64, 8, 128)
    attention = attention_block(h, 32, 2, 128)
    expert = 2 * h * 1856  # up and down: not gated
    moe = h * 128 + 128 * expert + 2 * h * 3712
    total = 23 * mamba + 6 * attention + 23 * moe + (52 + 1) * h + 2 * NANO3_VOCAB * h
    assert model.param_count == total == 31_577_937_344
    assert model.active_param_count == total - 23 * (128 - 6) * expert
    assert model.active_param_count / 1e9 == pytest.approx(3.6, rel=0.01)
    assert (model.active_param_count - model.embedding_params) / 1e9 == pytest.approx(3.2, rel=0.01)
    assert model.layer_counts() == {"moe": 23, "dense": 0, "linear_attention": 23, "none": 23,
                                    "full_attention": 6}
    assert not model.gated_mlp and model.norms_per_layer == 1 and model.ffn_free_layers[:3] == (0, 2, 4)


def test_nemotron_3_nano_cache_and_state_by_hand() -> None:
    """Only the 6 attention blocks cache K and V; each Mamba2 block keeps 64 heads x 128 x 64 of
    fp32 state (the config's ``mamba_ssm_cache_dtype``) and the conv's last 3 inputs of its
    4,096 + 2 x 8 x 128 channels in 16 bits, split by TP."""
    model = load_model("nemotron-3-nano-30b-a3b")
    assert model.kv_layers == 6
    assert model.kv_bytes_per_token("bf16") == 6 * 2 * 2 * 128 * 2
    la = model.linear_attention
    assert la is not None and la.kind == "mamba2" and la.ssm_state_bytes == 4.0
    assert model.linear_state_bytes(1) == 23 * (64 * 128 * 64 * 4 + 3 * 6144 * 2)
    assert model.linear_state_bytes(2) == 23 * (32 * 128 * 64 * 4 + 3 * 3072 * 2)


def test_nemotron_nano_9b_v2_counted_by_hand() -> None:
    """56 blocks: 27 Mamba2 (128 heads of 80), 4 attention (GQA 40/8), 25 squared-ReLU MLPs of
    15,680: 8.89B, the card's 9B; no SSM dtype named, so a 16-bit state."""
    model = load_model("nemotron-nano-9b-v2")
    h = 4480
    total = (27 * mamba_block(h, 128, 80, 8, 128) + 4 * attention_block(h, 40, 8, 128)
             + 25 * 2 * h * 15680 + (56 + 1) * h + 2 * 131072 * h)
    assert model.param_count == total == 8_888_227_328
    assert (model.num_dense_layers, model.num_moe_layers, model.kv_layers) == (25, 0, 4)
    assert model.linear_attention is not None and model.linear_attention.ssm_state_bytes == 2.0


def test_a_decode_step_prices_each_block_once() -> None:
    """A step's FLOPs are the model's per-token FLOPs (2 x matmul weights + attention over the
    context + the recurrence) to the elementwise kernels, and under TP 2 the residual stream is
    all-reduced once per block (52), not twice per layer; the engine counts those collectives
    plus the embedding's and the logits gather."""
    model, hw = load_model("nemotron-3-nano-30b-a3b"), load_hardware("h100-sxm-80gb")
    runtime = make_engine("vllm", {}).runtime(hw.name, tp=2, hbm_bytes=hw.memory.capacity_bytes)
    cost = CostModel(model, hw, 2, runtime=runtime)
    record = cost.step_record(BatchShape.decode(16, 1000))
    assert record.flops == pytest.approx(16 * model.flops_per_token(1000) / 2, rel=0.005)
    assert model.residual_reductions_in() == 52
    assert cost._residual_reduces == 52 and cost._engine is not None and cost._engine._collectives == 54
    dense = CostModel(load_model("llama-3.1-8b"), hw, 2, runtime=runtime)
    assert dense._residual_reduces == 64  # two per layer, as before


BASE = {"model_type": "nemotron_h", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "vocab_size": 1000,
        "hybrid_override_pattern": "M*-E", "mamba_num_heads": 8, "mamba_head_dim": 32, "n_groups": 2,
        "ssm_state_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
        "mlp_hidden_act": "relu2"}


def test_a_small_pattern_reads_block_by_block() -> None:
    model = model_from_hf_config(BASE, "tiny")
    assert model.layer_types == ("linear_attention", "full_attention", "none", "none")
    assert model.ffn_free_layers == (0, 1) and model.moe is not None and model.moe.layers == (3,)
    assert (model.num_dense_layers, model.kv_layers) == (1, 1)


@pytest.mark.parametrize(("change", "message"), [
    ({"hybrid_override_pattern": "M*-"}, r"^m: hybrid_override_pattern: must have one character per layer"),
    ({"hybrid_override_pattern": "M*-X"}, r"^m: hybrid_override_pattern: block type 'X' is not modelled"),
    ({"moe_latent_size": 1024}, r"^m: moe_latent_size: latent MoE"),
    ({"mamba_num_heads": None}, r"^m: mamba_num_heads: missing"),  # named as the config names it
    ({"mamba_num_heads": 7}, r"^m: mamba_num_heads: 7 is not a multiple of n_groups=2"),
    ({"ssm_state_size": 0}, r"^m: ssm_state_size: "),
])
def test_bad_patterns_are_one_line(change: dict, message: str) -> None:
    with pytest.raises(ServesimError, match=message):
        model_from_hf_config({**BASE, **change}, "tiny", "m")
