"""MLA's prefill attention runs its own kernel: a profile's time multiplier on the attention
class's price (Efficiency.mla_prefill_time_scale), fitted to AIConfigurator's MLA module tables
(servesim.calibration.mla_fit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servesim import load_hardware, load_model
from servesim.calibration.mla_fit import fit_mla_prefill_scale, module_table
from servesim.cost import BatchShape, CostModel
from servesim.cost.attention import chunks_attention, one_chunk_attention
from servesim.dtypes import Precision
from servesim.hardware import HardwareProfile

H200 = load_hardware("h200-sxm-141gb")


def _scaled(profile: HardwareProfile, scale: float | None) -> HardwareProfile:
    efficiency = profile.efficiency.model_copy(update={"mla_prefill_time_scale": scale})
    return profile.model_copy(update={"efficiency": efficiency})


def test_the_multiplier_scales_mlas_prefill_compute_and_nothing_else() -> None:
    deepseek, llama = load_model("deepseek-v3"), load_model("llama-3.1-70b")
    batch = BatchShape.prefill(8192)
    plain = CostModel(deepseek, H200, 8, Precision()).step(batch)
    halved = CostModel(deepseek, _scaled(H200, 0.5), 8, Precision()).step(batch)
    attn = {s.name: s for s in plain.ops}["attn_prefill"], {s.name: s for s in halved.ops}["attn_prefill"]
    assert attn[1].compute_s == pytest.approx(0.5 * attn[0].compute_s, rel=1e-12)
    assert attn[1].memory_s == attn[0].memory_s and attn[1].fixed_s == attn[0].fixed_s
    others = [op.time_s for op in plain.ops if op.name != "attn_prefill"]
    assert [op.time_s for op in halved.ops if op.name != "attn_prefill"] == others
    # A GQA model's prefill and DSA's sparse prefill (FlashMLA's own kernel) keep the class's price.
    for model in (llama, load_model("deepseek-v3.2")):
        assert (CostModel(model, _scaled(H200, 0.5), 8, Precision()).step(batch).time_s
                == CostModel(model, H200, 8, Precision()).step(batch).time_s)


def test_one_chunk_and_many_chunks_apply_it_alike() -> None:
    cost = CostModel(load_model("deepseek-v3"), _scaled(H200, 0.7), 8, Precision())
    shape = cost.attention
    assert shape.mla
    one = one_chunk_attention(3000, 5000, shape, cost.hardware, cost.bf16_peak, 2.0, 61)
    many = chunks_attention(np.array([3000]), np.array([5000]), shape, cost.hardware, cost.bf16_peak, 2.0, 61)
    assert one == many


MODULES = Path("kernels/aiconfigurator")


@pytest.mark.parametrize("gpu, profile, kept",
                         [("b200_sxm", "b200", True), ("h200_sxm", "h200-sxm-141gb", False)])
def test_the_module_tables_fit_blackwells_kernel_and_leave_hoppers(shared_data: Path, gpu: str,
                                                                  profile: str, kept: bool) -> None:
    table = module_table(shared_data / MODULES, gpu)
    if table is None:
        pytest.skip(f"no MLA module table for {gpu}")
    fit = fit_mla_prefill_scale(table, load_hardware(profile))
    assert fit is not None
    if kept:  # B200: the module's attention runs in 3/4 of the dense class's price
        assert fit.scale == pytest.approx(0.75, abs=0.03)
        assert fit.before[0] > 25 and fit.after[0] < 8
        assert load_hardware(profile).efficiency.mla_prefill_time_scale == fit.scale
    else:  # H200: the dense class already prices it; a multiplier would not help
        assert fit.scale is None and fit.before[0] < 10
        assert load_hardware(profile).efficiency.mla_prefill_time_scale is None


def test_a_refit_keeps_the_multiplier_and_writes_it(tmp_path: Path) -> None:
    """Refitting a profile that carries the multiplier (b200) keeps it, and the written profile
    reads back the same (the multiplier is a number among the efficiency classes)."""
    import pandas as pd

    from servesim.calibration.profile_fit import fit_profile
    from servesim.calibration.profiles import write_profile

    b200 = load_hardware("b200")
    assert b200.efficiency.mla_prefill_time_scale is not None
    table = pd.DataFrame([{"m": m, "n": 4096, "k": 4096, "dtype": "bf16", "time_s": 2e-5 + m * 4e-8}
                          for m in (1, 16, 128, 1024, 4096, 8192)])
    fitted, _ = fit_profile({"gemm": table}, b200, "synthetic", "2026-01-01")
    assert fitted.efficiency.mla_prefill_time_scale == b200.efficiency.mla_prefill_time_scale
    path = write_profile(fitted, tmp_path / "b200.yaml", "test")
    assert load_hardware(path) == fitted
