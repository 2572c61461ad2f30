"""GEMM kernels that pad their rows to whole tiles (vLLM's CUTLASS FP8 ``scaled_mm``): the padded
rows by hand, the cost model charging them on the compute side only, the calibration pricing a
row as the cost model does, and the profile writer keeping cuBLAS classes unchanged."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim import load_hardware, load_model
from servesim.calibration.profile_fit import fit_profile
from servesim.calibration.work import predict
from servesim.cost import BatchShape, CostModel
from servesim.cost.roofline import OpCost, padded_rows, padded_rows_array
from servesim.dtypes import Precision
from servesim.hardware import Curve, HardwareProfile, OperatorEfficiency
from servesim.hardware_io import profile_to_yaml

H100 = load_hardware("h100-sxm-80gb")


@pytest.mark.parametrize(("rows", "padded"), [
    (1, 1), (17, 17), (64, 64),  # at most 64 rows: as given (the weights bound these GEMMs)
    (65, 128), (128, 128),  # SM90's 64-row tiles in clusters of two: 128
    (129, 256), (200, 256), (256, 256),  # 128-row tiles in clusters of two: 256
    (257, 512), (513, 768), (1024, 1024), (1025, 1280), (4097, 4352),  # whole 256-row granules
])
def test_rows_pad_to_the_next_power_of_two_then_to_whole_granules(rows: int, padded: int) -> None:
    assert padded_rows(rows, 256) == padded
    assert padded_rows_array(np.array([float(rows)]), 256)[0] == padded
    assert padded_rows(rows, 1) == rows  # cuBLAS: no padding


def test_a_smaller_tile_caps_the_granule() -> None:
    # 128-row granule: 129 rows -> 256, 300 -> 384 (whole granules of 128, not of 256)
    assert [padded_rows(r, 128) for r in (100, 129, 300)] == [128, 256, 384]


def test_the_cost_model_charges_padding_to_the_compute_side_only() -> None:
    """Two profiles alike but for the FP8 class's row tile: a compute-bound GEMM of 1,025 rows
    costs 1,280 / 1,025 as much compute, the same bytes, and its FLOPs stay the useful ones."""
    flat = OperatorEfficiency(compute=Curve.constant(0.5), memory=Curve.constant(0.8, "bytes"), fixed_s=0.0)
    padded = flat.model_copy(update={"row_tile": 256})

    def with_fp8(eff: OperatorEfficiency) -> HardwareProfile:
        return H100.model_copy(update={"efficiency": H100.efficiency.model_copy(update={"gemm_fp8": eff})})

    model, w8a8 = load_model("llama-3-8b"), Precision.from_names("fp8", "fp8")
    batch = BatchShape.build([1025], [0])

    def o_proj(eff: OperatorEfficiency, shape: BatchShape) -> OpCost:
        ops = CostModel(model, with_fp8(eff), 1, w8a8).step(shape).ops
        return next(op for op in ops if op.name == "o_proj")

    plain, tiled = o_proj(flat, batch), o_proj(padded, batch)
    assert tiled.flops == plain.flops and tiled.bytes == plain.bytes and tiled.memory_s == plain.memory_s
    assert tiled.compute_s == pytest.approx(plain.compute_s * 1280 / 1025, rel=1e-12)
    # by hand: 32 layers of (1,025 x 4,096) @ (4,096 x 4,096), 1,280 rows at half of H100's FP8 peak
    by_hand = 32 * 2 * 1280 * 4096 * 4096 / (0.5 * H100.peak(w8a8.math))
    assert tiled.compute_s == pytest.approx(by_hand, rel=1e-12)
    small = BatchShape.build([64], [0])  # 64 rows and fewer are left as they are
    assert o_proj(flat, small) == o_proj(padded, small)


def test_the_calibration_prices_a_padded_row_as_the_cost_model_does() -> None:
    """The shipped H100 FP8 class pads (row_tile 256): an o_proj linear of 1,025 tokens from the
    calibration's vectorised rows and from the cost model, per layer, agree."""
    assert H100.efficiency.gemm_fp8 is not None and H100.efficiency.gemm_fp8.row_tile == 256
    model, w8a8 = load_model("llama-3-8b"), Precision.from_names("fp8", "fp8")
    op = next(o for o in CostModel(model, H100, 1, w8a8).step(BatchShape.build([1025], [0])).ops
              if o.name == "o_proj")
    row = pd.DataFrame([{"m": 1025, "n": 4096, "k": 4096, "dtype": "fp8", "time_s": 1.0}])
    assert predict("gemm_fp8", row, H100)[0] * model.num_layers == pytest.approx(op.time_s, rel=1e-9)


def test_only_padding_classes_write_a_row_tile() -> None:
    text = profile_to_yaml(H100)
    assert text.count("row_tile: 256") == 1  # efficiency.gemm_fp8
    assert "row_tile: 1\n" not in text


def test_a_refit_keeps_the_class_row_tile_unless_told() -> None:
    """A user's own FP8 GEMMs (``calibrate bench``) refit H100's class and keep its 256-row granule
    (cuBLASLt's FP8 GEMMs on our H100 step as CUTLASS's do); the import names it explicitly."""
    grid = [(m, n, k) for m in (1, 16, 100, 129, 300, 1025, 2500, 8192) for n in (1024, 4096, 14336)
            for k in (1024, 4096)]
    table = pd.DataFrame(grid, columns=["m", "n", "k"]).assign(dtype="fp8", time_s=0.0)
    table["time_s"] = predict("gemm_fp8", table, H100)
    kept, _ = fit_profile({"gemm_fp8": table}, H100, "synthetic")
    told, _ = fit_profile({"gemm_fp8": table}, H100, "synthetic", row_tiles={"gemm_fp8": 1})
    assert kept.efficiency.gemm_fp8 is not None and kept.efficiency.gemm_fp8.row_tile == 256
    assert told.efficiency.gemm_fp8 is not None and told.efficiency.gemm_fp8.row_tile == 1
