"""Fused MoE experts priced by their own efficiency classes (fitted from AIConfigurator's
``moe_perf`` tables): the class each precision picks, and that the calibration's vectorised rows
are exactly what the cost model charges for the same layer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim import load_hardware, load_model
from servesim.calibration.moe_routing import balanced_rank0, power_law_hits, routed_work
from servesim.calibration.work import MOE_FORMATS, fast_predict, moe_elementwise_s, moe_experts, work
from servesim.cost.batch import BatchShape
from servesim.cost.step_cost import CostModel
from servesim.dtypes import DType, Precision
from servesim.engines import RuntimeCosts

KERNELS = RuntimeCosts.none()

PRECISION = {"moe": Precision.from_names("bf16", "bf16"), "moe_fp8": Precision.from_names("fp8", "fp8"),
             "moe_w4a16": Precision.from_names("int4", "bf16"),
             "moe_fp4": Precision.from_names("nvfp4", "nvfp4")}


@pytest.mark.parametrize(("family", "hardware"), [("moe", "h100-sxm-80gb"), ("moe_fp8", "h200-sxm-141gb"),
                                                  ("moe_w4a16", "h100-sxm-80gb"), ("moe_fp4", "b200"),
                                                  ("moe", "a100-sxm-80gb")])
@pytest.mark.parametrize(("model", "tp"), [("qwen3-235b-a22b", 1), ("mixtral-8x7b", 2), ("minimax-m2.5", 4)])
def test_calibration_rows_are_what_the_cost_model_charges(family: str, hardware: str, model: str,
                                                          tp: int) -> None:
    """The fused experts of one layer, as the fit sees a measured row (minus the activation and
    combine it prices with the elementwise class), equal the cost model's ``moe`` operator."""
    spec, profile = load_model(model), load_hardware(hardware)
    assert spec.moe is not None
    cost = CostModel(spec, profile, tp=tp, precision=PRECISION[family], runtime=KERNELS)
    for tokens in (1, 7, 300, 4096):
        experts_op = cost._routed_experts(float(tokens), 1)[1]
        row = pd.DataFrame([{"tokens": tokens, "hidden": spec.hidden_size,
                             "inter": spec.moe.expert_intermediate, "topk": spec.moe.top_k,
                             "experts": spec.moe.num_experts, "tp": tp, "time_s": 1e-3}])
        w = work(family, row, profile)
        fused = fast_predict(w, profile.efficiency.moe_for(*_formats(family)), profile.memory.bandwidth_Bps)
        own = fused - moe_elementwise_s(moe_experts(family, row), profile)
        assert own[0] == pytest.approx(experts_op.time_s, rel=1e-12), (tokens, family)


def _formats(family: str) -> tuple[DType, DType]:
    activation, weight = MOE_FORMATS[family]
    return activation.math_format, weight


def test_each_precision_takes_its_fused_moe_class() -> None:
    h100, b200 = load_hardware("h100-sxm-80gb").efficiency, load_hardware("b200").efficiency
    assert h100.moe is not None and h100.moe_fp8 is not None and h100.moe_w4a16 is not None
    assert h100.moe_for(DType.BF16, DType.BF16) is h100.moe
    assert h100.moe_for(DType.FP8, DType.FP8) is h100.moe_fp8
    assert h100.moe_for(DType.BF16, DType.INT4) is h100.moe_w4a16
    assert h100.moe_for(DType.INT8, DType.INT8) is h100.gemm  # W8A8 int8 MoE: not measured apart
    assert b200.moe_fp4 is not None and b200.moe_for(DType.FP4, DType.NVFP4) is b200.moe_fp4
    l4 = load_hardware("l4").efficiency  # no MoE tables: the GEMM curves, as before
    assert l4.moe is None and l4.moe_for(DType.BF16, DType.BF16) is l4.gemm


def test_one_token_decode_reads_its_experts_at_the_fused_class_bandwidth() -> None:
    """Qwen3-235B on one H100, one decode token: 8 of 128 experts hit, each read whole once
    (gate, up and down: 3 x 4096 x 1536 bf16 weights); the fused call is memory-bound, so its
    time is two kernel floors plus the bytes at the moe class's efficiency for half of them."""
    model, h100 = load_model("qwen3-235b-a22b"), load_hardware("h100-sxm-80gb")
    cost = CostModel(model, h100, runtime=KERNELS)
    step = cost.step(BatchShape.decode(1, 100))
    assert model.moe is not None and (model.hidden_size, model.moe.expert_intermediate) == (4096, 1536)
    experts = max((op for op in step.ops if op.name == "moe"), key=lambda op: op.flops)  # not the router
    weights = 8 * 3 * 4096 * 1536 * 2
    io = 8 * ((4096 + 1536) * 2 + (2 * 1536 + 4096) * 2)
    layers = 94
    assert experts.bytes == pytest.approx(layers * (weights + io))
    eff = h100.efficiency.moe
    assert eff is not None
    bandwidth = h100.memory.bandwidth_Bps
    per_layer = 2 * eff.fixed_s + (weights + io) / (bandwidth * eff.memory.at((weights + io) / 2))
    assert experts.time_s == pytest.approx(layers * per_layer, rel=1e-12)
    # and it is not what the GEMM curves said before the fused class was fitted
    gemm = h100.efficiency.gemm
    old = 2 * gemm.fixed_s + (weights + io) / (bandwidth * gemm.memory.at((weights + io) / 2))
    assert abs(per_layer / old - 1) > 0.05


def test_expert_parallel_rows_take_the_rank_share() -> None:
    """An EP row of the MoE table is rank 0 of the layout: 1/ep of the assignments and experts."""
    row = pd.DataFrame([{"tokens": 64, "hidden": 7168, "inter": 2048, "topk": 8, "experts": 256, "tp": 1,
                         "ep": 8, "time_s": 1e-3}])
    one = moe_experts("moe", row.assign(ep=1))
    eight = moe_experts("moe", row)
    assert eight["assignments"][0] == pytest.approx(64 * 8 / 8)
    assert eight["flops"][0] == pytest.approx(one["flops"][0] / 8)
    hit = 256 / 8 * (1 - (1 - 8 / 256) ** 64)
    assert eight["rows_per_expert"][0] == pytest.approx(64 * 8 / 8 / hit)
    assert np.isfinite(eight["bytes"][0])


@pytest.mark.parametrize(("tokens", "experts", "top_k", "ep", "expected"), [
    (16, 256, 8, 1, (128, 128)),   # stride 32 > 16 tokens: token i takes 2i + 32j, all distinct
    (32, 256, 8, 1, (256, 256)),   # i + 32j covers every expert once
    (64, 256, 8, 1, (256, 512)),   # every expert hit, twice each
    (16, 256, 8, 8, (16, 16)),     # rank 0 holds experts 0-31: only j = 0 lands there (0, 2, .., 30)
    (4, 384, 8, 1, (32, 32)),      # stride 48: 12i + 48j
    (1, 256, 8, 1, (8, 8)),
])
def test_balanced_routing_hits_what_the_collector_spreads(tokens: int, experts: int, top_k: int, ep: int,
                                                          expected: tuple[int, int]) -> None:
    """AIConfigurator's balanced router logits spread T tokens over min(E, T k) experts (worked
    out by hand from ``balanced_logits``), not the E (1 - (1 - k/E)^T) of uniform random routing."""
    assert balanced_rank0(tokens, experts, top_k, ep) == expected


def test_a_balanced_row_is_priced_with_the_experts_it_read() -> None:
    """16 tokens of top-8 over 256 experts: the balanced row's bytes hold 128 experts' weights,
    the same row without a routing column (uniform, the cost model's rule) about 102."""
    row = pd.DataFrame([{"tokens": 16, "hidden": 4096, "inter": 1536, "topk": 8, "experts": 256, "tp": 1,
                         "time_s": 1e-3}])
    balanced = moe_experts("moe", row.assign(routing="balanced"))
    uniform = moe_experts("moe", row)
    weights = 4096 * 3 * 1536 * 2
    io = 16 * 8 * ((4096 + 1536) * 2 + (2 * 1536 + 4096) * 2)
    assert balanced["bytes"][0] == pytest.approx(128 * weights + io)
    hit = 256 * (1 - (1 - 8 / 256) ** 16)
    assert hit == pytest.approx(102.0, abs=0.05)
    assert uniform["bytes"][0] == pytest.approx(hit * weights + io)
    assert balanced["rows_per_expert"][0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="routing"):
        moe_experts("moe", row.assign(routing="power_law_1.2"))


def test_power_law_hits_follow_the_collector_generator() -> None:
    """AIConfigurator's power-law routing, worked out by hand where it is certain: one token of
    top-1 over two experts puts its one assignment on the expert of the larger share (the other
    rounds to 0), so one expert is hit; three tokens of top-4 over four experts draw loads on
    [1, 2.4], so even the smallest share (at least 1 / (1 + 3 x 2.4)) of 12 assignments rounds to
    one or more: all four hit."""
    assert power_law_hits(1, 2, 1) == 1.0
    assert power_law_hits(3, 4, 4) == 4.0
    assert power_law_hits(1, 256, 8) == 8.0  # one token: its eight assignments on eight experts
    assert power_law_hits(64, 256, 8) == power_law_hits(64, 256, 8)  # a fixed seed: the same number


@pytest.mark.parametrize("tokens", [16, 32, 64, 128])
def test_the_power_law_hits_fewer_experts_than_uniform_routing(tokens: int) -> None:
    """The skew concentrates a batch's assignments: fewer distinct experts than uniform routing's
    E (1 - (1 - k/E)^T), itself fewer than the balanced collector's min(E, T k)."""
    uniform = 256 * (1 - (1 - 8 / 256) ** tokens)
    skewed = power_law_hits(tokens, 256, 8)
    assert skewed < uniform < min(256, 8 * tokens)
    hit, assignments = routed_work(np.array([float(tokens)]), np.array([256.0]), np.array([8.0]),
                                   np.array([1.0]), np.array(["power_law_1.01"]))
    assert hit[0] == pytest.approx(skewed)
    assert assignments[0] == pytest.approx(8 * tokens)  # every assignment lands on the one rank


def test_power_law_routing_is_refused_with_expert_parallelism() -> None:
    with pytest.raises(ValueError, match="expert parallelism"):
        routed_work(np.array([64.0]), np.array([256.0]), np.array([8.0]), np.array([8.0]),
                    np.array(["power_law_1.01"]))
