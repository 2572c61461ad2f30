"""An 8-bit GEMM's dynamic input quantisation: priced by hand, charged by the cost model, and
separated from the FP8 GEMM curve by the calibration (servesim.cost.quantise)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim import load_hardware, load_model
from servesim.calibration.quantise_fit import fit_gemm_fp8, fixed_per_kernel_s
from servesim.calibration.work import fast_predict, operator_cost, predict, work
from servesim.cost import BatchShape, CostModel
from servesim.cost.quantise import input_quantisation_s, input_quantisation_s_array
from servesim.dtypes import Precision
from servesim.hardware import Curve, OperatorEfficiency

H100 = load_hardware("h100-sxm-80gb")
FLAT = OperatorEfficiency(compute=Curve.constant(1.0), memory=Curve.constant(0.5, "bytes"), fixed_s=1e-6)


def test_quantisation_reads_the_input_twice_and_writes_it_once() -> None:
    # 4,096 x 4,096 bf16 -> fp8: 2 + 2 + 1 bytes per element at half of 1 TB/s, plus 2 launches.
    seconds = input_quantisation_s(4096, 4096, 1.0, FLAT, 1e12)
    assert seconds == pytest.approx(2e-6 + 4096 * 4096 * 5 / 0.5e12, rel=1e-12)
    arrays = input_quantisation_s_array(np.array([4096.0, 1.0]), np.array([4096.0, 8.0]),
                                        np.array([1.0, 1.0]), FLAT, 1e12)
    assert arrays[0] == pytest.approx(seconds, rel=1e-12)
    assert arrays[1] == pytest.approx(2e-6 + 40 / 0.5e12, rel=1e-12)


def test_the_cost_model_charges_it_to_8_bit_gemms_only() -> None:
    model = load_model("llama-3-8b")
    w8a8 = Precision.from_names("fp8", "fp8")
    tokens = 2048
    batch = BatchShape.build([tokens], [0])
    fp8 = CostModel(model, H100, 1, w8a8).step(batch)
    bf16 = CostModel(model, H100, 1, Precision()).step(batch)
    o_proj = next(op for op in fp8.ops if op.name == "o_proj")
    per_layer = input_quantisation_s(tokens, model.num_heads * model.head_dim, 1.0,
                                     H100.efficiency.quantisation, H100.memory.bandwidth_Bps)
    expected = model.num_layers * per_layer
    assert o_proj.side_s == pytest.approx(expected, rel=1e-12)
    assert o_proj.time_s == pytest.approx(o_proj.roofline_s + o_proj.fixed_s + expected, rel=1e-12)
    assert all(op.side_s == 0.0 for op in bf16.ops)
    lm_head = next(op for op in fp8.ops if op.name == "lm_head")  # 16-bit whatever the precision
    assert lm_head.side_s == 0.0


def _linears(fixed_q: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """bf16 and fp8 linears priced by a profile whose fp8 GEMMs run on H100's bf16 curves (so
    the two formats differ by the quantisation, the weight bytes and the peak only) with a
    quantisation class of ``fixed_q`` per kernel: what the calibration must take apart."""
    grid = [(m, n, k) for m in (1, 4, 16, 64, 256, 1024, 4096, 16384) for n in (512, 1024, 4096, 16384)
            for k in (512, 1024, 4096, 8192)]
    table = pd.DataFrame(grid, columns=["m", "n", "k"])
    quantise = H100.efficiency.elementwise.model_copy(update={"fixed_s": fixed_q})
    efficiency = H100.efficiency.model_copy(update={"quantise": quantise, "gemm_fp8": H100.efficiency.gemm})
    truth = H100.model_copy(update={"efficiency": efficiency})
    bf16 = table.assign(dtype="bf16", time_s=0.0)
    fp8 = table.assign(dtype="fp8", time_s=0.0)
    bf16["time_s"] = predict("gemm", bf16, truth)
    fp8["time_s"] = predict("gemm_fp8", fp8, truth)
    return bf16, fp8


def test_the_fit_takes_the_quantisation_apart_from_the_gemm() -> None:
    bf16, fp8 = _linears(1.2e-6)
    # Tiny linears are launch-bound in both formats: their fp8 excess is the two kernels' 2.4 us
    # plus their few bytes (80 KB at most at the curve's 20%: 0.12 us) less the fp8 GEMM's halved
    # weight bytes, so the estimate lands within 10% of the true 1.2 us.
    assert fixed_per_kernel_s(fp8, bf16) == pytest.approx(1.2e-6, rel=0.10)
    result, quantise = fit_gemm_fp8(fp8, bf16, H100, H100.efficiency.gemm_fp8, True)
    assert quantise.fixed_s == pytest.approx(1.2e-6, rel=0.10)
    fitted = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(update={"quantise": quantise})})
    w = work("gemm_fp8", fp8, fitted)
    errors = np.abs(fast_predict(w, result.efficiency, H100.memory.bandwidth_Bps) / fp8["time_s"] - 1)
    assert np.median(errors) < 0.05


def test_calibration_prices_a_row_as_the_cost_model_does() -> None:
    row = pd.Series({"m": 3000, "n": 4096, "k": 14336, "dtype": "fp8", "time_s": 1.0})
    op = operator_cost("gemm_fp8", row, H100)
    assert op.side_s == pytest.approx(input_quantisation_s(3000, 14336, 1.0, H100.efficiency.quantisation,
                                                           H100.memory.bandwidth_Bps), rel=1e-12)
    table = pd.DataFrame([row])
    assert predict("gemm_fp8", table, H100)[0] == pytest.approx(op.time_s, rel=1e-12)
