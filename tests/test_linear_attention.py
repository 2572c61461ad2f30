"""Hybrid models (Qwen3.5, Qwen3-Next): Gated DeltaNet linear-attention layers between gated
full-attention layers. Their weights, KV cache, recurrent state and step cost, checked by hand
from the published config.json shapes."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import BatchShape, CostModel, HardwareProfile, load_hardware, load_model
from servesim.config import validate_document
from servesim.dtypes import Precision
from servesim.errors import ServesimError
from servesim.memory import STATE_SHARE, plan_memory
from servesim.model_config import model_from_hf_config
from servesim.speculative.proposer import resolve_proposer
from servesim.speculative.schema import SpeculativeConfig
from servesim.topology.resolve import resolve_topology

QWEN35 = load_model("qwen3.5-397b-a17b")
QWEN35_SMALL = load_model("qwen3.5-35b-a3b")
NEXT = load_model("qwen3-next-80b-a3b")


def test_qwen35_parameters_by_hand() -> None:
    """Qwen3.5-397B-A17B's language model (hidden 4096, 60 layers: 45 linear, 15 full).

    Linear layer: in_proj_qkvz 4096 x (2 x 16 x 128 + 2 x 64 x 128), in_proj_ba 4096 x 128, conv
    (2 x 2048 + 8192) x 4 taps, A_log and dt_bias 64 each, the gated norm 128, out_proj 8192 x 4096.
    Full layer: gated q_proj 4096 x (32 x 256 x 2), k and v 4096 x (2 x 256) each, o_proj
    (32 x 256) x 4096, q and k norms 256 each. MoE in every layer: router 4096 x 512, 512 experts and
    one shared expert of 3 x 4096 x 1024. Norms (2 x 60 + 1) x 4096; embedding and LM head untied."""
    linear = 4096 * 20480 + 4096 * 128 + 12288 * 4 + 128 + 128 + 8192 * 4096
    full = 4096 * 16384 + 2 * 4096 * 512 + 8192 * 4096 + 512
    moe = 4096 * 512 + 513 * 3 * 4096 * 1024
    total = 45 * linear + 15 * full + 60 * moe + 121 * 4096 + 2 * 248320 * 4096
    assert linear == 118_014_208 and full == 104_858_112
    assert QWEN35.param_count == total
    assert QWEN35.param_count == pytest.approx(397e9, rel=0.01)  # the card's 397B counts the vision tower too
    active = total - 60 * 502 * 3 * 4096 * 1024  # all but the 502 routed experts a token skips
    assert QWEN35.active_param_count == active
    assert active == pytest.approx(17e9, rel=0.03)  # "A17B"
    assert QWEN35.linear_layers_in() == 45 and QWEN35.kv_layers == 15


def test_only_full_attention_layers_cache_kv_and_each_sequence_holds_its_state() -> None:
    """KV per token: 15 layers x K and V x 2 heads x 256 x 2 bytes = 30,720 B; at TP 4 each GPU
    keeps one (replicated) KV head. State per sequence at TP 4: 16 of the 64 value heads, each a
    128 x 128 fp32 matrix (Qwen3.5's ``mamba_ssm_dtype``), plus a quarter of the conv's 12,288
    channels times its 3 remembered inputs in 16 bits, in each of the 45 linear layers. Qwen3-Next
    names no state dtype: 16-bit matrices."""
    assert QWEN35.kv_bytes_per_token("bf16") == 15 * 2 * 2 * 256 * 2 == 30_720
    assert QWEN35.kv_bytes_per_token("bf16", tp=4) == 15 * 2 * 1 * 256 * 2
    state = (16 * 128 * 128 * 4 + 3072 * 3 * 2) * 45
    assert state == 48_015_360
    assert QWEN35.linear_state_bytes(tp=4) == state
    assert QWEN35.linear_state_bytes(tp=4, start=0, stop=4) == state / 45 * 3  # layers 0-2 linear, 3 full
    assert NEXT.linear_state_bytes(tp=2) == (16 * 128 * 128 * 2 + 4096 * 3 * 2) * 36
    dense = load_model("llama-3-8b")
    assert dense.linear_state_bytes() == 0.0 and dense.kv_layers == 32


def test_the_state_of_the_largest_batch_comes_off_the_kv_pool() -> None:
    b200 = load_hardware("b200")
    plan = plan_memory(QWEN35, b200, 8, max_num_seqs=128)
    per_seq = QWEN35.linear_state_bytes(tp=8)
    assert plan.state_bytes == 128 * per_seq
    without = plan_memory(QWEN35, b200, 8, max_num_seqs=128).__class__(
        **{**plan.__dict__, "state_bytes": 0.0})
    assert without.kv_cache_bytes - plan.kv_cache_bytes == pytest.approx(128 * per_seq, rel=1e-12)


def test_state_beyond_its_share_of_the_pool_caps_the_running_sequences() -> None:
    """Qwen3.5 in FP8 on four B200s: 4,096 sequences' state (45.8 MiB each per GPU) would take
    far more than the state's share (0.9 / 1.9, SGLang's default ratio) of the 59 GiB left, so
    the plan sets aside that share and the engine runs as many sequences as it holds."""
    b200 = load_hardware("b200")
    fp8 = Precision.from_names("fp8", "fp8")
    per_seq = QWEN35.linear_state_bytes(tp=4)
    small = plan_memory(QWEN35, b200, 4, fp8, max_num_seqs=64)
    assert (small.state_seqs, small.state_bytes) == (64, 64 * per_seq)
    big = plan_memory(QWEN35, b200, 4, fp8, max_num_seqs=4096)
    free = big.kv_cache_bytes + big.state_bytes  # the pool before the state came off
    assert big.state_seqs == int(STATE_SHARE * free // per_seq) < 4096
    assert big.state_bytes <= STATE_SHARE * free < big.state_bytes + per_seq
    document = {"model": "qwen3.5-397b-a17b", "hardware": "b200", "engine": "vllm",
                "deployment": {"tp": 4, "max_num_seqs": 4096, "max_num_batched_tokens": 8192},
                "precision": {"weights": "fp8", "activations": "fp8"},
                "workload": {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 10,
                             "lengths": {"preset": "azure-conversation"}}}
    group = resolve_topology(validate_document(document)).groups[0]
    assert group.limits.max_num_seqs == group.memory.state_seqs < 4096
    assert plan_memory(load_model("llama-3-8b"), b200).state_seqs is None


def test_a_decode_step_reads_and_writes_every_sequences_state(textbook_a100: HardwareProfile) -> None:
    """On the textbook A100 (2.0 TB/s, efficiency 1, no overheads), the linear layers' state
    traffic of 64 decodes at TP 2 is 45 layers x 64 x 2 (read, write) x each sequence's state; the
    recurrence's arithmetic is 6 x 128 x 128 FLOPs per value head, 32 heads per GPU, per token."""
    cost = CostModel(QWEN35, textbook_a100, tp=2)
    step = cost.step(BatchShape.decode(64, 1000))
    state = next(op for op in step.ops if op.name == "attn_decode" and op.flops == 0.0
                 and op.bytes == 45 * 2 * 64 * (32 * 128 * 128 * 4 + 6144 * 3 * 2))
    assert state.memory_s == pytest.approx(state.bytes / 2.0e12, rel=1e-12)
    recurrence = next(op for op in step.ops if op.name == "attn_prefill")
    assert recurrence.flops == 45 * 64 * 6 * 32 * 128 * 128
    # the full-attention layers' decode kernel reads 15 layers of KV, not 60
    full = [op for op in step.ops if op.name == "attn_decode" and op.flops > 0]
    assert len(full) == 1
    kv_read = 64 * 1001 * QWEN35.kv_bytes_per_token("bf16", tp=2)
    assert kv_read <= full[0].bytes < kv_read * 1.1  # whole KV tiles; 60 layers would be 4x
    record = cost.step_record(BatchShape.decode(64, 1000))
    assert record.attn_decode_s == pytest.approx(step.breakdown["attn_decode"], rel=1e-12)
    assert record.attn_prefill_s == pytest.approx(step.breakdown["attn_prefill"], rel=1e-12)
    assert record.time_s == step.time_s


def test_a_fast_forwarded_run_prices_each_step_as_a_step() -> None:
    cost = CostModel(NEXT, load_hardware("h200-sxm-141gb"), tp=2)
    context = np.array([10, 500, 3000, 70])
    run = cost.decode_run_records(context, 40, 3)
    per_step = np.array([cost.step_record(BatchShape.decodes_only(context + j)) for j in range(3, 43)])
    np.testing.assert_array_equal(run, per_step)
    assert (run[:, 6] > 0).all()  # attention-decode seconds include the state traffic


def test_qwen3_next_layer_types_come_from_the_interval_and_tp_must_split_the_linear_heads() -> None:
    assert NEXT.layer_types.count("full_attention") == 12 and NEXT.layer_types[3] == "full_attention"
    assert NEXT.attention_output_gate and NEXT.qk_norm
    with pytest.raises(ServesimError, match=r"^deployment.tp: 32 does not divide qwen3-next-80b-a3b's 16 "):
        NEXT.check_tensor_parallel(32)
    bad = {"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 100, "full_attention_interval": 4,
           "linear_num_key_heads": 3, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
           "linear_value_head_dim": 8}
    with pytest.raises(ServesimError, match=r"^m: linear_num_value_heads: 4 is not a multiple of"):
        model_from_hf_config(bad, "x", "m")
    odd = {**bad, "linear_num_key_heads": 2, "mamba_ssm_dtype": "int3"}
    with pytest.raises(ServesimError, match=r"^m: mamba_ssm_dtype: 'int3' is not a state dtype; use one of"):
        model_from_hf_config(odd, "x", "m")


def test_a_hybrid_models_mtp_layer_attends_fully() -> None:
    """Qwen3.5's multi-token-prediction layer is a full-attention layer (with the MoE): the
    proposer's one layer caches 2 x 2 KV heads x 256 x 2 bytes per token, and holds no state."""
    config = SpeculativeConfig(method="mtp", num_speculative_tokens=1, acceptance={"rate": 0.8})
    proposer = resolve_proposer(config, QWEN35, load_hardware("b200"), 1, Precision())
    assert proposer.spec is not None and proposer.spec.linear_attention is None
    assert proposer.kv_bytes_per_token == 2 * 2 * 256 * 2
    assert proposer.spec.linear_state_bytes() == 0.0


def group_of(model: str, engine: str, tp: int = 1, kv_cache: str = "bf16", **deployment: object):
    document = {"model": model, "hardware": "h200-sxm-141gb", "engine": engine,
                "deployment": {"tp": tp, "max_model_len": 8192, **deployment},
                "precision": {"kv_cache": kv_cache},
                "workload": {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 10,
                             "lengths": {"preset": "azure-conversation"}}}
    return resolve_topology(validate_document(document)).groups[0]


def test_vllm_raises_a_hybrid_models_block_until_one_layers_block_holds_one_layers_state() -> None:
    """vLLM V1 pages a hybrid's state beside its KV: Qwen3.5-35B's state per layer and sequence is
    32 x 128 x 128 fp32 plus the conv's 3 x 8,192 16-bit inputs (2,146,304 B) and one attention
    layer caches 2 x 2 x 256 x 2 B per token, so blocks of 16 x ceil(2,146,304 / (16 x 2,048)) =
    1,056 tokens; an fp8 cache halves the page and doubles the block (2,096); a larger block than
    that stays; SGLang keeps its state in a pool of its own and its block of 1; a dense model 16."""
    state = 32 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 32 * 128) * 2
    assert QWEN35_SMALL.linear_attention is not None
    assert QWEN35_SMALL.linear_attention.state_bytes(1) == state == 2_146_304
    assert group_of("qwen3.5-35b-a3b", "vllm").limits.block_size == 16 * -(-state // (16 * 2048)) == 1056
    assert group_of("qwen3.5-35b-a3b", "vllm", kv_cache="fp8").limits.block_size == 2096
    assert group_of("qwen3.5-35b-a3b", "vllm", block_size=4096).limits.block_size == 4096
    assert group_of("qwen3.5-35b-a3b", "sglang").limits.block_size == 1
    assert group_of("llama-3-8b", "vllm").limits.block_size == 16
