"""The per-step operator-class times the engine records (``CostModel.step_record``): the same
numbers as the full breakdown grouped into classes, and hand-checked on the textbook A100."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim import BatchShape, CostModel, HardwareProfile, Precision, load_hardware, load_model
from servesim.cost import BOUNDS, OP_CLASS_OF, OP_CLASSES
from servesim.engines import RuntimeCosts, make_engine
from servesim.model_config import model_from_hf_config

MODELS = {name: load_model(name) for name in ("llama-3-8b", "mixtral-8x7b", "deepseek-v3", "mistral-7b",
                                               "qwen3-next-80b-a3b")}
TP = {"llama-3-8b": 2, "mixtral-8x7b": 2, "deepseek-v3": 8, "mistral-7b": 1, "qwen3-next-80b-a3b": 2}
COSTS = {name: CostModel(model, load_hardware("h100-sxm-80gb"), TP[name]) for name, model in MODELS.items()}

batches = st.builds(
    lambda chunks, decodes: BatchShape.build([c for c, _ in chunks], [x for _, x in chunks], decodes),
    st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), max_size=5),
    st.lists(st.integers(0, 16_000), max_size=64),
)


def grouped_breakdown(cost: CostModel, batch: BatchShape) -> dict[str, float]:
    classes = dict.fromkeys(OP_CLASSES, 0.0)
    for key, seconds in cost.step(batch).breakdown.items():
        classes[OP_CLASS_OF[key]] += seconds
    return classes


@settings(max_examples=80, deadline=None)
@given(batch=batches, model=st.sampled_from(sorted(MODELS)))
def test_record_equals_the_grouped_breakdown(batch: BatchShape, model: str) -> None:
    cost = COSTS[model]
    record = cost.step_record(batch)
    step = cost.step(batch)
    assert len(record) == 4 + len(OP_CLASSES) + 1  # ... and verify_extra_s (speculative decoding)
    assert record.proposal_s == 0.0 and record.verify_extra_s == 0.0  # a plain cost model
    assert record[0] == step.time_s  # bit-identical to the engine's clock
    assert record[2] == pytest.approx(step.flops, rel=1e-12)
    assert record[3] == pytest.approx(step.hbm_bytes, rel=1e-12)
    assert (record.time_s, record.bound, record.flops, record.hbm_bytes) == record[:4]
    if batch.is_empty:
        assert record[4:] == (0.0,) * (len(OP_CLASSES) + 1)
        return
    assert BOUNDS[record[1]] == step.bound
    classes = dict(zip(OP_CLASSES, record[4:4 + len(OP_CLASSES)], strict=True))
    expected = grouped_breakdown(cost, batch)
    for name in OP_CLASSES:
        assert classes[name] == pytest.approx(expected[name], rel=1e-12, abs=1e-18), name
    assert sum(classes.values()) == pytest.approx(step.time_s, rel=1e-12)


def test_batch1_decode_is_all_weight_reads_by_hand(textbook_a100: HardwareProfile) -> None:
    """Llama-2-7B shape stretched to 7.0e9 matmul weights, fp16, one sequence at context 0 on a
    2.0 TB/s A100 without overheads: the GEMMs read 14.0 GB -> 7.0 ms; attention reads one
    token's K and V per layer (32 x 2 x 4096 x 2 bytes = 0.5 MiB -> 0.26 us); no TP, no overhead."""
    model = model_from_hf_config({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                                  "num_hidden_layers": 32, "num_attention_heads": 32,
                                  "num_key_value_heads": 32, "vocab_size": 127_928}, "7b")
    cost = CostModel(model, textbook_a100, precision=Precision.from_names("fp16", "fp16", "fp16"),
                     runtime=RuntimeCosts.none())
    record = dict(zip(OP_CLASSES, cost.step_record(BatchShape.decode(1, 0))[4:-1], strict=True))
    assert record["gemm"] == pytest.approx(7.0e9 * 2 / 2.0e12, rel=0.005)
    assert record["attn_prefill"] == 0.0
    assert 0 < record["attn_decode"] < 1e-6
    assert record["communication"] == 0.0 and record["overhead"] == 0.0
    assert record["elementwise"] < 0.01 * record["gemm"]


def test_tp_collectives_and_overhead_have_their_own_classes() -> None:
    h100 = load_hardware("h100-sxm-80gb")
    cost = CostModel(MODELS["llama-3-8b"], h100, tp=4)
    record = dict(zip(OP_CLASSES, cost.step_record(BatchShape.prefill(2048))[4:-1], strict=True))
    assert record["communication"] > 0
    assert record["overhead"] == make_engine("vllm-v0", {}).runtime(h100.name).step_overhead_s == 6e-4
    assert record["attn_prefill"] > 0 and record["attn_decode"] == 0.0


def test_mla_context_reexpansion_counts_as_gemm() -> None:
    """DeepSeek-V3's prefill chunk over 16k cached tokens re-expands the latents with ``kv_b``:
    that time is GEMM time, not attention time (see test_cost_physics for its FLOPs by hand)."""
    cost = CostModel(MODELS["deepseek-v3"], load_hardware("h200-sxm-141gb"), tp=8)
    fresh = dict(zip(OP_CLASSES, cost.step_record(BatchShape.build([512], [0]))[4:-1], strict=True))
    later = dict(zip(OP_CLASSES, cost.step_record(BatchShape.build([512], [16_384]))[4:-1], strict=True))
    assert later["gemm"] > fresh["gemm"]
    expected = grouped_breakdown(cost, BatchShape.build([512], [16_384]))
    assert later["gemm"] == pytest.approx(expected["gemm"], rel=1e-12)
