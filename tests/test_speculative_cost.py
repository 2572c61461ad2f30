"""The price of speculative steps, by hand: verification at a memory-bound batch costs about what a
plain decode does, at a compute-bound batch it costs in proportion to its tokens (so speculation
loses below a break-even acceptance rate derived here), and the proposers' weights, KV and passes
are what their architectures say."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import BatchShape, CostModel, ModelSpec, Precision, load_hardware, load_model
from servesim.cost.attention import decode_attention
from servesim.cost.speculative import SpeculativeCost, first_pass_shape
from servesim.engines import RuntimeCosts
from servesim.errors import ServesimError
from servesim.speculative import iid_length
from servesim.speculative.proposer import resolve_proposer
from servesim.speculative.schema import SpeculativeConfig

H100 = load_hardware("h100-sxm-80gb")
LLAMA = load_model("llama-3-8b")
KERNELS = CostModel(LLAMA, H100, runtime=RuntimeCosts.none())


def speculative(method: str, k: int = 2, model: str | None = None, target: ModelSpec = LLAMA,
                tp: int = 1) -> SpeculativeCost:
    config = SpeculativeConfig(method=method, num_speculative_tokens=k, model=model, acceptance={"rate": 0.5})
    proposer = resolve_proposer(config, target, H100, tp, Precision())
    return SpeculativeCost(CostModel(target, H100, tp, runtime=RuntimeCosts.none()), proposer.passes)


def verify(batch: int, k: int, context: int = 1024) -> BatchShape:
    return BatchShape.build(decode_context=[context] * batch, decode_tokens=[1 + k] * batch)


def test_one_query_per_decode_is_exactly_the_plain_decode() -> None:
    plain = BatchShape.decode(7, 900)
    ones = BatchShape.build(decode_context=[900] * 7, decode_tokens=[1] * 7)
    assert KERNELS.step_record(ones) == KERNELS.step_record(plain)
    assert ones.without_proposals().decode_tokens is None


def test_verification_reads_the_cache_once_for_all_its_queries() -> None:
    """k = 4 over 1,000 cached tokens: the KV read is 1,005 tokens (the cache plus the five new
    ones) instead of 1,001, Q/O and the new KV grow five-fold, and the attended pairs are
    5 x 1000 + 5 x 6 / 2 = 5,015 against 1,001."""
    shape = KERNELS.attention
    kv = KERNELS._kv_bytes
    one = decode_attention(BatchShape.decode(1, 1000), shape, H100, KERNELS.bf16_peak, kv, 1)
    five = decode_attention(verify(1, 4, 1000), shape, H100, KERNELS.bf16_peak, kv, 1)
    per_token = shape.cache_elements_per_token * kv
    qo = (shape.decode_q_width + shape.decode_o_width) * 2.0
    assert one.bytes == pytest.approx((1001 + 1) * per_token + qo)
    assert five.bytes == pytest.approx((1005 + 5) * per_token + 5 * qo)
    assert five.flops / one.flops == pytest.approx(5015 / 1001)


def test_batch1_step_costs_the_same_with_k4_while_emitting_more_tokens() -> None:
    """Llama-3-8B decoding one request on an H100 reads its 15 GB of weights (all but the
    embedding table) once per step: the 4
    proposal rows ride along (every GEMM stays memory-bound), so the target's pass with k = 4 costs
    within 1% of the plain step, and emits (1 - a^5)/(1 - a) tokens: 3.36 at a = 0.8."""
    plain = KERNELS.step(BatchShape.decode(1, 1024))
    spec = KERNELS.step(verify(1, 4))
    assert plain.bound == spec.bound == "memory"
    assert spec.time_s / plain.time_s == pytest.approx(1.0, abs=0.01)
    weights = LLAMA.weight_bytes("bf16") - 2 * LLAMA.embedding_params  # the gather reads one row
    assert plain.hbm_bytes == pytest.approx(weights, rel=0.02)  # the step is its weight read
    assert iid_length(0.8, 4) == pytest.approx(3.36, abs=0.005)
    # so the tokens per second of the target's pass grow by the acceptance length
    assert (iid_length(0.8, 4) / spec.time_s) / (1 / plain.time_s) == pytest.approx(3.36, rel=0.01)


def break_even_alpha(ratio: float, k: int) -> float:
    """The i.i.d. acceptance rate at which (1 - a^(k+1))/(1 - a) = ratio: a speculative step
    ``ratio`` times the plain one emits as many tokens per second as plain decoding."""
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if iid_length(middle, k) < ratio else (low, middle)
    return low


def test_compute_bound_verification_costs_its_tokens_and_sets_a_break_even() -> None:
    """At 256 requests of 256 tokens the plain step is 256 GEMM rows, past the H100's ridge (~300
    rows for bf16 at the fitted efficiencies it is close); with k = 2 it is 768 rows, well past it,
    so the GEMMs cost about three times as much: the verification alone (no proposer cost) makes
    the step R times longer, and speculation loses unless (1 - a^3)/(1 - a) > R."""
    plain = KERNELS.step(BatchShape.decode(256, 256))
    spec = KERNELS.step(verify(256, 2, 256))
    assert spec.bound == "compute"
    gemm_ratio = spec.breakdown["mlp"] / plain.breakdown["mlp"]
    assert 2.0 < gemm_ratio <= 3.0  # compute-bound GEMMs scale with rows (3x at most)
    ratio = spec.time_s / plain.time_s
    alpha = break_even_alpha(ratio, 2)
    assert iid_length(alpha, 2) == pytest.approx(ratio, rel=1e-9)
    assert 0.4 < alpha < 0.9
    # below the break-even a speculative step delivers fewer tokens per second than a plain one
    assert iid_length(alpha - 0.1, 2) / spec.time_s < 1 / plain.time_s
    assert iid_length(alpha + 0.05, 2) / spec.time_s > 1 / plain.time_s


def test_draft_model_runs_k_passes_of_its_own_network() -> None:
    """Llama-3.2-1B proposing k = 3 for 8 decodes: one pass over each request's 4 verified tokens
    (a 4-token chunk each, one logits row), then two one-token passes, all priced by the draft's
    own cost model."""
    cost = speculative("draft_model", 3, "llama-3.2-1b")
    assert cost.proposer is not None
    draft = cost.proposer.cost
    batch = verify(8, 3, 500)
    first = first_pass_shape(batch)
    assert first.num_prefills == 8 and first.num_new_tokens == 32 and first.num_logits == 8
    by_hand = (draft.step_record(first).time_s
               + draft.step_record(BatchShape.decode(8, 502)).time_s
               + draft.step_record(BatchShape.decode(8, 503)).time_s)
    assert cost.proposal(batch).time_s == pytest.approx(by_hand)
    record = cost.step_record(batch)
    assert record.proposal_s == pytest.approx(by_hand)
    assert record.time_s == pytest.approx(KERNELS.step_record(batch).time_s + by_hand)
    assert record.verify_extra_s == pytest.approx(KERNELS.step_record(batch).time_s
                                                  - KERNELS.step_record(batch.without_proposals()).time_s)


def test_ngram_lookup_costs_no_gpu_time() -> None:
    cost = speculative("ngram", 4)
    assert cost.step_record(verify(16, 4)).proposal_s == 0.0


def test_engine_overheads_are_per_verifying_step_and_per_pass() -> None:
    batch = verify(4, 3)
    plain = speculative("eagle3", 3)
    cost = SpeculativeCost(plain.target, plain.proposer, step_overhead_s=1e-3, pass_overhead_s=1e-4)
    assert cost.proposal(batch).time_s == pytest.approx(plain.proposal(batch).time_s + 1e-3 + 3e-4)
    prefill = BatchShape.prefill(100)  # the proposer keeps up with one pass, nothing to verify
    assert cost.proposal(prefill).time_s == pytest.approx(plain.proposal(prefill).time_s + 1e-4)


def test_eagle_heads_weigh_one_decoder_layer_plus_their_fusion() -> None:
    """Llama-3-8B's layer: Q and O 4096^2 each, K and V 4096 x 1024 each, MLP 3 x 4096 x 14336
    = 218,103,808 weights, plus the norms (3 x 4096). EAGLE-1 adds fc (8192 x 4096) and shares the
    embedding and LM head; EAGLE-3 adds fc (12288 x 4096) and the 2h-wide QKV input (4096 x 6144)
    and owns a 32,000-token LM head. KV: one layer, 2 x 8 x 128 x 2 bytes = 4 KiB per token."""
    layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert layer == 218_103_808
    norms = 3 * 4096
    eagle = resolve_proposer(SpeculativeConfig(method="eagle", num_speculative_tokens=2,
                                               acceptance={"rate": 0.5}), LLAMA, H100, 1, Precision())
    assert eagle.weight_bytes == pytest.approx(2 * (layer + norms + 8192 * 4096))
    eagle3 = resolve_proposer(SpeculativeConfig(method="eagle3", num_speculative_tokens=2,
                                                acceptance={"rate": 0.5}), LLAMA, H100, 1, Precision())
    assert eagle3.weight_bytes == pytest.approx(2 * (layer + norms + 12288 * 4096 + 4096 * 6144
                                                     + 32000 * 4096))
    assert eagle.kv_bytes_per_token == eagle3.kv_bytes_per_token == 4096


def test_deepseek_v3_mtp_layer_is_11_5b_parameters() -> None:
    """DeepSeek's README_WEIGHTS: the MTP module holds 11.5B unique parameters (one MLA + MoE
    layer with 256 experts and eh_proj; the embedding and head are the main model's)."""
    deepseek = load_model("deepseek-v3")
    assert deepseek.mtp_layers == 1
    config = SpeculativeConfig(method="mtp", num_speculative_tokens=1,
                               acceptance={"preset": "mtp-deepseek-v3"})
    proposer = resolve_proposer(config, deepseek, load_hardware("h200-sxm-141gb"), 8, Precision())
    assert proposer.spec is not None
    params = (proposer.spec.param_count - proposer.spec.embedding_params - proposer.spec.lm_head_params
              + 2 * 7168 * 7168)
    assert params / 1e9 == pytest.approx(11.5, rel=0.02)
    assert proposer.kv_bytes_per_token == (512 + 64) * 2  # one MLA latent per token


@pytest.mark.parametrize(("config", "message"), [
    ({"method": "draft_model", "model": "llama-2-7b"}, "speculative.model: llama-2-7b's vocabulary"),
    ({"method": "mtp"}, "speculative.method: mtp: llama-3-8b has no multi-token-prediction layers"),
    ({"method": "draft_model", "model": "llama-3.2-1b", "draft_tensor_parallel_size": 2},
     "speculative.draft_tensor_parallel_size: 2 is neither 1 nor the deployment's tp 4"),
])
def test_proposer_errors_name_the_key(config: dict, message: str) -> None:
    spec = SpeculativeConfig(num_speculative_tokens=2, acceptance={"rate": 0.5}, **config)
    with pytest.raises(ServesimError, match=message):
        resolve_proposer(spec, LLAMA, H100, 4, Precision())


def test_first_pass_keeps_prefill_chunks_and_plain_decodes() -> None:
    batch = BatchShape.build(prefill_tokens=[100], prefill_context=[50], prefill_emits=[False],
                             decode_context=[10, 20, 30], decode_tokens=[3, 1, 2])
    first = first_pass_shape(batch)
    assert first.prefill_tokens.tolist() == [100, 3, 2]
    assert first.prefill_context.tolist() == [50, 10, 30]
    assert first.prefill_emits.tolist() == [False, True, True]
    assert first.decode_context.tolist() == [20] and first.decode_tokens is None
    assert batch.num_logits == 6 and first.num_logits == 3
    assert np.array_equal(batch.without_proposals().decode_context, [10, 20, 30])
