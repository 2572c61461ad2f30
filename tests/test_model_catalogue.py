"""The 2026 catalogue: each model's parameters and KV bytes per token against its published
figures and a hand count, Hugging Face configs of every family read as published (nested
``text_config``, ``layer_types``, family defaults), and the attention kinds they bring."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.cost.attention import chunk_prefix_pairs
from servesim.engines import RuntimeCosts
from servesim.errors import ServesimError
from servesim.model_config import builtin_model_names, model_from_hf_config

NEW_MODELS = {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-4-scout", "llama-4-maverick",
              "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b",
              "deepseek-r1", "kimi-k2", "gemma-3-27b", "mistral-small-3"}


def test_the_catalogue_ships_the_models_people_deploy_in_2026() -> None:
    assert set(builtin_model_names()) >= NEW_MODELS


# (total, active) in billions as published; ``embedding_in_active`` says whether the publisher's
# active count includes the embedding gather (OpenAI's does not)
PUBLISHED = [
    ("llama-3.1-8b", 8.03, 8.03, True, 0.001),
    ("llama-3.1-70b", 70.55, 70.55, True, 0.001),
    ("llama-3.1-405b", 405.85, 405.85, True, 0.001),
    ("llama-4-maverick", 400.0, 17.0, True, 0.02),  # card: 400B / 17B (402B with vision)
    ("qwen3-8b", 8.2, 8.2, True, 0.01),
    ("qwen3-32b", 32.8, 32.8, True, 0.005),
    ("qwen3-30b-a3b", 30.5, 3.3, True, 0.02),
    ("qwen3-235b-a22b", 235.0, 22.0, True, 0.01),
    ("gpt-oss-120b", 116.83, 5.13, False, 0.001),
    ("gpt-oss-20b", 20.91, 3.61, False, 0.001),
    ("deepseek-r1", 671.0, 37.0, True, 0.015),
    ("gemma-3-27b", 27.4 - 0.417, 27.4 - 0.417, True, 0.002),  # report: 27.4B incl. a 417M vision encoder
    ("mistral-small-3", 23.57, 23.57, True, 0.001),
    ("qwen3-14b", 14.8, 14.8, True, 0.005),  # card: 14.8B, 13.2B non-embedding
    ("qwen3-coder-480b-a35b", 480.0, 35.0, True, 0.015),
    ("glm-4.5-air", 106.0, 12.0, False, 0.01),  # card: 106B / 12B (12.8B without the input embedding)
    ("glm-4.7-flash", 30.0, 3.0, False, 0.01),  # card: 30B-A3B (3.6B without the input embedding)
    ("qwen3.6-27b", 27.0, 27.0, True, 0.005),  # card: 27B (its vision encoder not counted)
]


ACTIVE_REL = {"glm-4.5-air": 0.07, "glm-4.7-flash": 0.2}
"""Cards that round the active count to a whole billion, down: GLM-4.5-Air's 12.8B is "12B",
GLM-4.7-Flash's 3.6B "A3B"."""


@pytest.mark.parametrize(("name", "total_b", "active_b", "embedding_in_active", "rel"), PUBLISHED)
def test_parameters_match_the_published_figures(name: str, total_b: float, active_b: float,
                                                embedding_in_active: bool, rel: float) -> None:
    model = load_model(name)
    active = model.active_param_count - (0 if embedding_in_active else model.embedding_params)
    assert model.param_count / 1e9 == pytest.approx(total_b, rel=rel)
    assert active / 1e9 == pytest.approx(active_b, rel=ACTIVE_REL.get(name, max(rel, 0.02)))


def test_gpt_oss_120b_counted_by_hand() -> None:
    h, layers, experts = 2880, 36, 128
    q, kv = 64 * 64, 8 * 64
    attention = h * (q + 2 * kv) + (q + 2 * kv) + q * h + h + 64  # q/k/v/o, their biases, sinks
    expert = h * 2 * 2880 + 2 * 2880 + 2880 * h + h  # gate_up and down with biases
    router = h * experts + experts
    norms = (2 * layers + 1) * h
    embeddings = 2 * 201088 * h  # untied
    total = layers * (attention + experts * expert + router) + norms + embeddings
    model = load_model("gpt-oss-120b")
    assert model.param_count == total == 116_829_156_672
    active = total - layers * (experts - 4) * expert - 201088 * h  # 4 experts per token, no gather
    assert model.active_param_count - model.embedding_params == active == 5_132_849_472  # card: 5.13B


def test_llama_4_scout_and_kimi_k2_counted_by_hand() -> None:
    scout = load_model("llama-4-scout")
    h = 5120
    attention = h * (5120 + 2 * 1024) + 5120 * h
    moe = 16 * 3 * h * 8192 + 3 * h * 8192 + h * 16  # routed, shared, router
    assert scout.num_moe_layers == 48 and scout.moe is not None and scout.moe.shared_intermediate == 8192
    assert scout.param_count == 48 * (attention + moe + 2 * h) + h + 2 * 202048 * h
    # 107.8B: Meta's 109B includes the vision encoder
    assert scout.param_count / 1e9 == pytest.approx(107.77, abs=0.01)
    maverick = load_model("llama-4-maverick")
    assert maverick.moe is not None and maverick.moe.layers == tuple(range(1, 48, 2))
    assert maverick.intermediate_size == 16384  # the dense layers' width
    kimi = load_model("kimi-k2")
    assert kimi.moe is not None
    assert (kimi.moe.num_experts, kimi.num_moe_layers, kimi.num_heads) == (384, 60, 64)
    # 1.026T from the config; the card's "1T (1.04T)" is 1.3% higher: about one more MoE layer
    assert kimi.param_count / 1e9 == pytest.approx(1026.4, abs=0.1)
    assert kimi.active_param_count / 1e9 == pytest.approx(32.6, rel=0.01)  # card: 32B (report: 32.6B)


@pytest.mark.parametrize(("name", "kv_bytes"), [
    ("llama-3.1-8b", 2 * 8 * 128 * 32 * 2),
    ("llama-3.1-405b", 2 * 8 * 128 * 126 * 2),
    ("llama-4-maverick", 2 * 8 * 128 * 48 * 2),  # every layer caches (chunked ones too, as vLLM V0)
    ("qwen3-235b-a22b", 2 * 4 * 128 * 94 * 2),
    ("gpt-oss-120b", 2 * 8 * 64 * 36 * 2),
    ("kimi-k2", (512 + 64) * 61 * 2),  # MLA latent
    ("gemma-3-27b", 2 * 16 * 128 * 62 * 2),
    ("mistral-small-3", 2 * 8 * 128 * 40 * 2),
    ("qwen3-14b", 2 * 8 * 128 * 40 * 2),
    ("qwen3-coder-480b-a35b", 2 * 8 * 128 * 62 * 2),
    ("glm-4.5-air", 2 * 8 * 128 * 46 * 2),
    ("glm-4.7-flash", (512 + 64) * 47 * 2),  # MLA latent
    ("qwen3.6-27b", 2 * 4 * 256 * 16 * 2),  # the 16 full-attention layers only
])
def test_kv_bytes_per_token_by_hand(name: str, kv_bytes: int) -> None:
    assert load_model(name).kv_bytes_per_token("bf16") == kv_bytes


# ---------------------------------------------------------------------- reading configs as published
def test_gemma_3_as_published_relies_on_transformers_defaults() -> None:
    published = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                 "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                                 "model_type": "gemma3_text", "num_attention_heads": 32,
                                 "num_hidden_layers": 62, "num_key_value_heads": 16,
                                 "query_pre_attn_scalar": 168, "sliding_window": 1024},
                 "vision_config": {"hidden_size": 1152}}
    model = model_from_hf_config(published, "gemma")
    assert model.vocab_size == 262208 and model.tie_word_embeddings and model.max_context == 131072
    assert model.layer_types.count("full_attention") == 10  # layers 5, 11, ..., 59 are global
    assert model.layer_types[5] == "full_attention" and model.layer_types[4] == "sliding_attention"
    assert model.param_count == load_model("gemma-3-27b").param_count


def test_qwen3_layer_types_of_full_attention_only_read_as_one_kind() -> None:
    config = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
              "sliding_window": None, "use_sliding_window": False, "layer_types": ["full_attention"] * 4}
    model = model_from_hf_config(config, "qwen3-0.6b-ish")
    assert model.layer_types == () and model.sliding_window is None and model.qk_norm


def test_unknown_layer_types_are_one_line() -> None:
    config = {"model_type": "falcon_h1", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "vocab_size": 100, "layer_types": ["mamba", "full_attention"]}
    with pytest.raises(ServesimError, match=r"^m: layer_types: mamba is not modelled"):
        model_from_hf_config(config, "x", "m")
    linear = {**config, "model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]}
    with pytest.raises(ServesimError, match=r"^m: linear_num_value_heads: layer_types has linear-attention"):
        model_from_hf_config(linear, "x", "m")


def test_a_qk_norm_over_all_heads_has_a_weight_per_element_and_unknown_types_are_one_line() -> None:
    """MiniMax-M2's ``qk_norm_type: per_layer`` normalises each token's whole query and key: a
    weight for every element of the 48 query and 8 key heads of 128, in each of 62 layers."""
    minimax = load_model("minimax-m2.5")
    assert minimax.qk_norm and minimax.qk_norm_across_heads
    plain = model_from_hf_config({**minimax_config(), "use_qk_norm": False}, "no-norm")
    assert not plain.qk_norm and minimax.param_count - plain.param_count == 62 * (48 + 8) * 128
    per_head = model_from_hf_config({**minimax_config(), "qk_norm_type": "per_head"}, "per-head")
    assert per_head.qk_norm and not per_head.qk_norm_across_heads
    assert minimax.param_count - per_head.param_count == 62 * ((48 + 8) * 128 - 2 * 128)
    with pytest.raises(ServesimError, match=r"^m: qk_norm_type: unknown QK-norm type 'per_token'; use "):
        model_from_hf_config({**minimax_config(), "qk_norm_type": "per_token"}, "x", "m")


def minimax_config() -> dict:
    import json

    from servesim.resources import configs_dir

    config = json.loads((configs_dir() / "models" / "minimax-m2.5.json").read_text())
    config.pop("_servesim")
    return config


# ---------------------------------------------------------------------- attention kinds cost what they read
def test_chunked_attention_pairs_by_hand() -> None:
    # chunk 4: positions 0..9 see 1,2,3,4, 1,2,3,4, 1,2 keys: 10 + 10 + 3 = 23
    assert chunk_prefix_pairs(np.array([10]), 4)[0] == 23
    # ideal(): the calibrated profile's decode kernel reads whole KV tiles (key_tile); these count keys
    scout = CostModel(load_model("llama-4-scout"), load_hardware("h100-sxm-80gb").ideal(), 8,
                      runtime=RuntimeCosts.none())
    # a decode at context 20,000 reads 20,000 % 8192 + 1 = 3,617 keys in the 36 chunked layers
    # and 20,001 in the 12 global ones
    step = scout.step(BatchShape.decode(1, 20_000))
    keys = [op for op in step.ops if op.name == "attn_decode"]
    per_key = 2 * 5 * (128 + 128)  # 40 heads / tp 8, score + value
    assert sorted(op.flops for op in keys) == [36 * 3_617 * per_key, 12 * 20_001 * per_key]


def test_gpt_oss_sliding_layers_cap_decode_reads_at_128_tokens() -> None:
    model = load_model("gpt-oss-120b")
    cost = CostModel(model, load_hardware("h100-sxm-80gb").ideal(), 1, runtime=RuntimeCosts.none())
    ops = [op for op in cost.step(BatchShape.decode(1, 10_000)).ops if op.name == "attn_decode"]
    kv_per_token = 2 * 8 * 64 * 2.0
    read = sorted(op.bytes for op in ops)
    # 18 sliding layers read 128 cached tokens + the new one's write; 18 full layers 10,001
    assert read[0] == pytest.approx(18 * ((128 + 1) * kv_per_token + (64 * 64 + 64 * 64) * 2.0))
    assert read[1] == pytest.approx(18 * ((10_001 + 1) * kv_per_token + (64 * 64 + 64 * 64) * 2.0))


def test_cross_layer_kv_sharing_halves_the_kv_and_the_kv_projections() -> None:
    import json

    from servesim.resources import model_configs_dir
    config = json.loads((model_configs_dir() / "llama-3.1-70b.json").read_text())
    config["_servesim"]["cross_layer_kv_sharing"] = 2
    cla = model_from_hf_config(config, "llama-cla")
    base = load_model("llama-3.1-70b")
    assert cla.kv_bytes_per_token("bf16") == base.kv_bytes_per_token("bf16") / 2
    assert base.param_count - cla.param_count == 40 * 2 * 1024 * 8192  # 40 layers drop K and V
    config["_servesim"]["cross_layer_kv_sharing"] = 0
    with pytest.raises(ServesimError, match=r"cross_layer_kv_sharing: must be a whole number"):
        model_from_hf_config(config, "bad")


def test_the_2026_additions_counted_by_hand() -> None:
    """Qwen3-Coder-480B, GLM-4.5-Air, GLM-4.7-Flash and the dense hybrid Qwen3.6-27B, layer by layer."""
    coder = load_model("qwen3-coder-480b-a35b")
    h, layers = 6144, 62
    attention = h * (96 * 128 + 2 * 8 * 128) + 96 * 128 * h + 2 * 128  # q/k/v/o, q/k norms
    experts = 160 * 3 * h * 2560 + h * 160  # routed experts and the router
    assert coder.param_count == layers * (attention + experts + 2 * h) + h + 2 * 151936 * h
    air = load_model("glm-4.5-air")
    assert air.moe is not None and air.num_moe_layers == 45 and air.moe.shared_intermediate == 1408
    h = 4096
    attention = h * (96 * 128 + 2 * 8 * 128) + 96 * 128 * h
    moe = 128 * 3 * h * 1408 + 3 * h * 1408 + h * 128  # routed, shared, router
    dense = 3 * h * 10944
    assert air.param_count == 46 * (attention + 2 * h) + 45 * moe + dense + h + 2 * 151552 * h
    flash = load_model("glm-4.7-flash")
    assert flash.mla is not None and (flash.mla.kv_lora_rank, flash.num_heads) == (512, 20)
    assert flash.moe is not None and (flash.moe.num_experts, flash.moe.top_k) == (64, 4)
    qwen = load_model("qwen3.6-27b")
    assert qwen.linear_attention is not None
    assert qwen.layer_types.count("linear_attention") == 48
    # a sequence's recurrent state per linear layer at TP 1: 48 value heads x 128 x 128 in fp32,
    # plus the conv's last 3 inputs of its 2 x 16 x 128 + 48 x 128 channels in 16 bits
    assert qwen.linear_attention.state_bytes(1) == 48 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 48 * 128) * 2
