"""Model shapes and derived figures, each against a hand computation."""

import json
from pathlib import Path

import pytest

from servesim import ModelSpec, ServesimError, load_model
from servesim.model_config import builtin_model_names, model_from_hf_config
from servesim.resources import model_configs_dir

ISSUE_CATALOGUE = {"llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
                   "mistral-7b", "yi-34b", "codellama-34b", "mixtral-8x7b", "qwen2.5-72b",
                   "deepseek-v3"}


def test_catalogue_ships_every_required_model() -> None:
    assert set(builtin_model_names()) >= ISSUE_CATALOGUE


def test_llama2_7b_parameter_count_by_hand(llama2_7b: ModelSpec) -> None:
    h, inter, vocab, layers = 4096, 11008, 32000, 32
    per_layer = 4 * h * h + 3 * h * inter + 2 * h  # q,k,v,o + gate,up,down + two RMSNorms
    expected = 2 * vocab * h + layers * per_layer + h  # embedding, untied LM head, final norm
    assert expected == 6_738_415_616
    assert llama2_7b.param_count == expected
    assert llama2_7b.active_param_count == expected


@pytest.mark.parametrize(("name", "published_b", "active_b"), [
    ("llama-2-13b", 13.02, 13.02), ("llama-2-70b", 68.98, 68.98), ("llama-3-8b", 8.03, 8.03),
    ("llama-3-70b", 70.55, 70.55), ("mistral-7b", 7.24, 7.24), ("yi-34b", 34.39, 34.39),
    ("codellama-34b", 33.74, 33.74), ("qwen2.5-72b", 72.71, 72.71),
    ("mixtral-8x7b", 46.70, 12.88), ("deepseek-v3", 671.0, 37.5),
])
def test_parameter_counts_match_published_figures(name: str, published_b: float,
                                                  active_b: float) -> None:
    model = load_model(name)
    assert model.param_count / 1e9 == pytest.approx(published_b, rel=0.005)
    assert model.active_param_count / 1e9 == pytest.approx(active_b, rel=0.01)


def test_mixtral_active_params_drop_six_of_eight_experts_by_hand() -> None:
    model = load_model("mixtral-8x7b")
    expert = 3 * 4096 * 14336
    assert model.param_count - model.active_param_count == 32 * 6 * expert


def test_deepseek_v3_layout() -> None:
    model = load_model("deepseek-v3")
    assert model.attention_kind == "mla"
    assert (model.num_dense_layers, model.num_moe_layers) == (3, 58)
    assert model.moe is not None and model.moe.shared_intermediate == 2048


@pytest.mark.parametrize(("name", "bytes_per_token"), [
    ("llama-2-13b", 819_200),  # 2 (K,V) x 40 heads x 128 x 40 layers x 2 B  (MHA)
    ("llama-3-8b", 131_072),  # 2 x 8 KV heads x 128 x 32 layers x 2 B       (GQA)
    ("llama-2-70b", 327_680),  # 2 x 8 x 128 x 80 x 2
    ("deepseek-v3", 70_272),  # (512 latent + 64 rope) x 61 layers x 2 B     (MLA)
])
def test_kv_bytes_per_token(name: str, bytes_per_token: int) -> None:
    assert load_model(name).kv_bytes_per_token("bf16") == bytes_per_token


def test_llama2_7b_kv_cache_at_26k_tokens_is_about_13_4_gb(llama2_7b: ModelSpec) -> None:
    total = 26_000 * llama2_7b.kv_bytes_per_token("fp16")
    assert total == 26_000 * 2 * 32 * 128 * 32 * 2
    assert total / 1e9 == pytest.approx(13.4, rel=0.02)


def test_mqa_caches_one_head() -> None:
    model = model_from_hf_config(
        {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32,
         "num_attention_heads": 71, "num_key_value_heads": 1, "vocab_size": 65024}, "mqa")
    assert model.attention_kind == "mqa"
    assert not model.gated_mlp  # falcon's MLP is plain
    assert model.kv_bytes_per_token("bf16") == 2 * 1 * 64 * 32 * 2


def test_kv_heads_shard_then_replicate_under_tensor_parallelism(llama3_8b: ModelSpec) -> None:
    assert llama3_8b.kv_elements_per_token_per_layer(tp=1) == 2 * 8 * 128
    assert llama3_8b.kv_elements_per_token_per_layer(tp=4) == 2 * 2 * 128
    # 8 KV heads over 16 GPUs: each GPU keeps one (replicated), as vLLM does.
    assert llama3_8b.kv_elements_per_token_per_layer(tp=16) == 2 * 1 * 128
    assert load_model("deepseek-v3").kv_elements_per_token_per_layer(tp=8) == 576


def test_kv_cache_dtype_scales_bytes(llama3_8b: ModelSpec) -> None:
    assert llama3_8b.kv_bytes_per_token("fp8") == 131_072 / 2
    assert llama3_8b.kv_bytes_per_token("int4") == 131_072 / 2 * (0.5 + 2 / 128)


def test_weight_bytes_per_dtype_by_hand(llama2_7b: ModelSpec) -> None:
    total = 6_738_415_616
    assert llama2_7b.weight_bytes("bf16") == total * 2
    kept = 2 * 32000 * 4096 + (2 * 32 + 1) * 4096  # embedding, LM head, norms stay 16-bit
    quantised = total - kept
    assert llama2_7b.weight_bytes("int4") == quantised * 0.515625 + kept * 2
    assert llama2_7b.weight_bytes("fp8") == quantised * 1 + kept * 2
    norms = (2 * 32 + 1) * 4096  # replicated on every GPU
    assert llama2_7b.weight_bytes("bf16", tp=2) == ((total - norms) / 2 + norms) * 2


def test_flops_per_token_by_hand(llama2_7b: ModelSpec) -> None:
    matmul = 6_738_415_616 - 32000 * 4096 - (2 * 32 + 1) * 4096  # no FLOPs in gather or norms
    assert llama2_7b.matmul_params_per_token == matmul
    attention = 32 * 4 * 4096  # layers x (QK^T + AV: 2 + 2 FLOPs) x 32 heads x 128 per key
    assert llama2_7b.flops_per_token(0) == 2 * matmul + attention
    assert llama2_7b.flops_per_token(1023) == 2 * matmul + attention * 1024


def test_sliding_window_caps_attended_context() -> None:
    mistral = load_model("mistral-7b")
    assert mistral.sliding_window == 4096
    assert mistral.flops_per_token(100_000) == mistral.flops_per_token(4095)


def test_tensor_parallel_must_split_heads(llama3_8b: ModelSpec) -> None:
    with pytest.raises(ServesimError, match=r"deployment\.tp: 3 does not divide llama-3-8b's 32 attention"):
        llama3_8b.check_tensor_parallel(3)
    llama3_8b.check_tensor_parallel(8)


def test_load_model_from_local_config(tmp_path: Path) -> None:
    config = json.loads((model_configs_dir() / "llama-3-8b.json").read_text())
    folder = tmp_path / "my-finetune"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    model = load_model(folder)
    assert model.name == "my-finetune"
    assert model.param_count == load_model("llama-3-8b").param_count


def test_unknown_model_suggests_the_fix() -> None:
    with pytest.raises(ServesimError, match=r"unknown model 'llama-3-8'; did you mean llama-3-8b\?"):
        load_model("llama-3-8")


def test_malformed_config_names_the_problem(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"hidden_size": 4096,\n "num_hidden_layers": }')
    with pytest.raises(ServesimError, match=r"not valid JSON \(line 2"):
        load_model(broken)
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4,
                                   "vocab_size": 100}))
    with pytest.raises(ServesimError, match="model: hidden_size: missing"):
        load_model(missing)
    negative = tmp_path / "negative.json"
    negative.write_text(json.dumps({"hidden_size": -8, "num_hidden_layers": 2,
                                    "num_attention_heads": 4, "vocab_size": 100}))
    with pytest.raises(ServesimError, match="hidden_size: must be a positive integer, got -8"):
        load_model(negative)


def test_weight_bytes_count_replicated_kv_heads() -> None:
    """Llama-2-70B at TP 16: 8 KV heads, so each GPU holds one whole K and V head per layer
    instead of half of one."""
    model = load_model("llama-2-70b")
    even_split = model.weight_bytes("bf16", tp=16) - 80 * 2 * 128 * 8192 * (1 - 8 / 16) * 2
    norms = (2 * 80 + 1) * 8192
    assert even_split == pytest.approx(((model.param_count - norms) / 16 + norms) * 2)


def test_moe_layer_placement_follows_each_family() -> None:
    base = {"hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4, "vocab_size": 100,
            "intermediate_size": 128, "num_experts_per_tok": 2}
    deepseek = model_from_hf_config({**base, "n_routed_experts": 8, "first_k_dense_replace": 1,
                                     "moe_layer_freq": 2}, "ds")
    assert deepseek.moe is not None and deepseek.moe.layers == (2, 4)
    qwen = model_from_hf_config({**base, "num_hidden_layers": 5, "num_experts": 8,
                                 "decoder_sparse_step": 2}, "qwen-moe")
    assert qwen.moe is not None and qwen.moe.layers == (1, 3)
    mixtral = model_from_hf_config({**base, "num_local_experts": 8}, "mx")
    assert mixtral.num_moe_layers == 6 and mixtral.num_dense_layers == 0
