"""FP4: NVFP4 and MXFP4 bytes with their block scales, Blackwell's FP4 tensor cores for W4A4, and
weight-only FP4 elsewhere (as engines run gpt-oss's MXFP4 experts on Hopper)."""

from __future__ import annotations

import pytest

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.cost.roofline import OpCost
from servesim.cost.step_cost import StepCost
from servesim.dtypes import DType, Precision
from servesim.engines import RuntimeCosts
from servesim.errors import ServesimError

KERNELS = RuntimeCosts.none()


def test_fp4_bytes_include_their_block_scales() -> None:
    # NVFP4: 16 E2M1 values (8 bytes) share one E4M3 scale (1 byte): 9/16 bytes per weight
    assert DType.NVFP4.bytes_per_element() == 0.5 + 1 / 16 == 0.5625
    # MXFP4 (OCP MX v1.0): 32 values share one E8M0 scale: 17/32 bytes per weight
    assert DType.MXFP4.bytes_per_element() == 0.5 + 1 / 32 == 0.53125
    assert DType.MXFP4.bytes_per_element(group_size=64) == 0.53125  # the format fixes its block
    assert DType.parse("fp4", "weight_dtype") is DType.NVFP4


def test_mxfp4_experts_beside_16_bit_attention() -> None:
    model = load_model("mixtral-8x7b")
    routed = model.routed_expert_params
    assert routed == 32 * 8 * 3 * 4096 * 14336
    bf16 = model.weight_bytes("bf16")
    mixed = model.weight_bytes("bf16", expert_dtype="mxfp4")
    assert bf16 - mixed == pytest.approx(routed * (2.0 - 0.53125))


def test_w4a4_runs_on_blackwells_fp4_peak() -> None:
    b200 = load_hardware("b200")
    model = load_model("llama-3-70b")
    fp4 = Precision.from_names("nvfp4", "nvfp4", "fp8")
    assert fp4.math is DType.FP4 and b200.peak(fp4.math) == 9.0e15
    prefill = BatchShape.prefill(8192)
    w4a4 = CostModel(model, b200, 1, fp4, KERNELS).step(prefill)
    w8a8 = CostModel(model, b200, 1, Precision.from_names("fp8", "fp8", "fp8"), KERNELS).step(prefill)
    mlp = [op for op in w4a4.ops if op.name == "mlp"]
    assert all(op.bound == "compute" for op in mlp)
    # the MLP GEMMs at 8,192 rows: the same FLOPs at twice the FP8 peak, on B200's own FP4 class
    # (fitted to its NVFP4 linears), which reaches a lower share of its peak than FP8 does at these
    # shapes: AIConfigurator's B200 table times FP8 / NVFP4 linears of 8,192 rows at 1.29-1.59x for
    # 8,192 -> 16,384-65,536 and 1.99-2.03x for 16,384-51,200 -> 8,192 (activation quantisation in)
    assert b200.efficiency.gemm_for(fp4.math) is b200.efficiency.gemm_fp4

    def gemms(step: StepCost) -> float:
        return sum(op.time_s - op.side_s for op in step.ops if op.name == "mlp")

    assert 1.45 < gemms(w8a8) / gemms(w4a4) < 1.7  # 1.56
    assert 1.45 < w8a8.breakdown["mlp"] / w4a4.breakdown["mlp"] < 1.8  # 1.61 with the quantisation


def test_hopper_has_no_fp4_tensor_cores_but_runs_fp4_weights_weight_only() -> None:
    h100 = load_hardware("h100-sxm-80gb")
    model = load_model("mixtral-8x7b")
    with pytest.raises(ServesimError, match=r"^precision.activations: h100-sxm-80gb has no fp4 tensor cores"):
        CostModel(model, h100, 2, Precision.from_names("nvfp4", "nvfp4"), KERNELS)
    decode = BatchShape.decode(8, 1000)
    weight_only = CostModel(model, h100, 2, Precision.from_names("bf16", "bf16", expert_weight="mxfp4"),
                            KERNELS).step(decode)
    bf16 = CostModel(model, h100, 2, Precision(), KERNELS).step(decode)
    # a memory-bound decode reads the experts in 17/32 bytes instead of 2 (the math stays 16-bit);
    # the weight-only kernel (the profile's moe_w4a16 class, fitted to Marlin) reaches a lower
    # share of HBM than the 16-bit one, so the time falls by less than the bytes
    def experts(step: StepCost) -> OpCost:
        return max((op for op in step.ops if op.name == "moe"), key=lambda op: op.flops)

    assert experts(weight_only).bytes < 0.3 * experts(bf16).bytes
    assert weight_only.breakdown["moe"] < 0.6 * bf16.breakdown["moe"]
    assert weight_only.flops == bf16.flops


@pytest.mark.parametrize(("names", "message"), [
    (("bf16", "nvfp4"),
     r"^precision.activations: nvfp4 activations need nvfp4 weights \(W4A4\), got precision.weights bf16"),
    (("mxfp4", "nvfp4"), r"^precision.activations: nvfp4 activations need nvfp4 weights"),
    (("int4", "int4"), r"^precision.activations: int4 activations are not supported"),
])
def test_fp4_combinations_that_are_no_kernel_are_refused(names: tuple[str, str], message: str) -> None:
    with pytest.raises(ServesimError, match=message):
        Precision.from_names(*names)
