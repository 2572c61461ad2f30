"""DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5): MLA over the indexer's top 2,048 keys,
and the lightning indexer over every key. Weights, KV cache and decode cost checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import BatchShape, CostModel, HardwareProfile, load_hardware, load_model
from servesim.errors import ServesimError
from servesim.model_config import model_from_hf_config

V32 = load_model("deepseek-v3.2")
V3 = load_model("deepseek-v3")


def test_the_indexer_adds_its_weights_and_its_key_cache_by_hand() -> None:
    """Per layer: ``wq_b`` 1536 x (64 x 128) from the query latent, ``wk`` 7168 x 128, the key's
    LayerNorm 2 x 128 and the head weights 7168 x 64; 61 layers, replicated on every TP rank.
    Cached per token and layer: the 576-wide latent in the cache's dtype plus the 128 FP8 index
    values and their fp32 scale (132 bytes)."""
    per_layer = 1536 * 8192 + 7168 * 128 + 256 + 7168 * 64
    assert V32.param_count - V3.param_count == 61 * per_layer == 851_524_864
    assert V32.mla_down_params - V3.mla_down_params == 61 * per_layer  # replicated, not sharded
    assert V32.weight_bytes("fp8", tp=8) - V3.weight_bytes("fp8", tp=8) == pytest.approx(61 * per_layer)
    assert V32.kv_bytes_per_token("bf16") == 61 * (576 * 2 + 132) == 78_324
    assert V32.kv_bytes_per_token("fp8") == 61 * (576 + 132)
    glm5 = load_model("glm-5")
    assert glm5.param_count == pytest.approx(744e9, rel=0.001)  # the GLM-5 card's 744B


def test_mla_reads_the_top_k_and_the_indexer_every_key(textbook_a100: HardwareProfile) -> None:
    """16 decodes at 30,000 cached tokens on the textbook A100 at TP 8: the MLA kernel reads 2,049
    latents per request (the top 2,048 and its own), the indexer 30,001 index keys of 132 bytes;
    below 2,048 tokens MLA reads what V3's does."""
    cost = CostModel(V32, textbook_a100, tp=8)
    ops = [op for op in cost.step(BatchShape.decode(16, 30_000)).ops if op.name == "attn_decode"]
    assert len(ops) == 2
    mla, indexer = ops
    tile = textbook_a100.efficiency.decode_for(2.0).key_tile
    keys = -(-2048 // tile) * tile  # whole KV tiles
    latent = 16 * (keys + 1) * 576 * 2.0
    queries_outputs = 16 * (16 * 576 + 16 * 512) * 2.0  # 16 heads per GPU: absorbed q in, latent out
    assert mla.bytes / 61 == pytest.approx(latent + queries_outputs, rel=1e-12)
    index_keys = -(-30_001 // tile) * tile
    assert indexer.bytes / 61 == pytest.approx(16 * (index_keys + 1) * 132.0 + 16 * (8192 + 64) * 2.0)
    assert indexer.flops / 61 == 16 * index_keys * 2 * 64 * 128
    short_v3 = next(op for op in CostModel(V3, textbook_a100, tp=8).step(BatchShape.decode(16, 1500)).ops
                if op.name == "attn_decode")
    short_v32 = next(op for op in cost.step(BatchShape.decode(16, 1500)).ops if op.name == "attn_decode")
    assert short_v32.bytes == short_v3.bytes and short_v32.flops == short_v3.flops


def test_long_context_decode_is_cheaper_than_dense_mla_and_runs_price_as_steps() -> None:
    h200 = load_hardware("h200-sxm-141gb")
    sparse, dense = CostModel(V32, h200, tp=8), CostModel(V3, h200, tp=8)
    long = BatchShape.decode(64, 32_000)
    assert sparse.step(long).breakdown["attn_decode"] < 0.5 * dense.step(long).breakdown["attn_decode"]
    context = np.array([100, 5_000, 30_000])
    run = sparse.decode_run_records(context, 30, 2)
    np.testing.assert_array_equal(run, np.array([sparse.step_record(BatchShape.decodes_only(context + j))
                                                 for j in range(2, 32)]))


def test_sparse_attention_needs_mla() -> None:
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "vocab_size": 100, "index_topk": 2048, "index_n_heads": 4, "index_head_dim": 16}
    with pytest.raises(ServesimError, match=r"^m: index_topk: sparse attention \(DSA\) is modelled over MLA"):
        model_from_hf_config(config, "x", "m")


def test_a_prefill_chunk_attends_to_the_top_k_in_absorbed_form_and_the_indexer_to_everything(
        textbook_a100: HardwareProfile) -> None:
    """A 100-token chunk over 50,000 cached tokens at TP 8: each query's MLA attends to 2,048
    latents in the absorbed (MQA) form FlashMLA's sparse prefill runs (2 x 16 heads x (2 x 512 +
    64) FLOPs per pair), with no re-expansion of the cached latents; the indexer scores all
    50,000 + its causal share of keys for every query (2 x 64 x 128 FLOPs per pair)."""
    cost = CostModel(V32, textbook_a100, tp=8)
    ops = cost._batch_ops(BatchShape.build(prefill_tokens=[100], prefill_context=[50_000]))
    assert [op.name for op in ops] == ["attn_prefill", "attn_prefill"]  # no kv_b re-expansion GEMM
    mla, indexer = ops
    assert mla.flops == 61 * 100 * 2048 * (2 * 16 * (2 * 512 + 64))
    assert indexer.flops == 61 * (100 * 50_000 + 100 * 101 / 2) * (2 * 64 * 128)
