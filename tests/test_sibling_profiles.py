"""Unmeasured GPUs borrow a measured sibling's fitted efficiencies (calibration.sibling_profiles)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.calibration.sibling_profiles import SIBLINGS, derive_siblings, sibling_profile
from servesim.dtypes import Precision
from servesim.engines import RuntimeCosts


def test_shipped_siblings_carry_the_b200_fit_and_their_own_specs() -> None:
    b200 = load_hardware("b200")
    for name, (source, _why) in SIBLINGS.items():
        sibling = load_hardware(name)
        assert source == "b200" and sibling.spec_only
        # compared as data: the curves' cached NumPy arrays make object equality ambiguous
        assert sibling.efficiency.model_dump() == b200.efficiency.model_dump()
        assert sibling.collectives is not None and b200.collectives is not None
        assert sibling.collectives.model_dump() == b200.collectives.model_dump()
        assert "borrowed" in sibling.provenance["efficiency.moe_fp8"]
    gb300, b300 = load_hardware("gb300-nvl72"), load_hardware("b300")
    assert gb300.peak_flops == b300.peak_flops and gb300.memory.model_dump() == b300.memory.model_dump()
    assert gb300.fast_domain_gpus == 72
    assert gb300.host_link.model_dump() == load_hardware("gb200-nvl72").host_link.model_dump()


def test_a_sibling_prices_a_memory_bound_step_in_proportion_to_its_bandwidth() -> None:
    """Same efficiencies, so a decode step whose every kernel is memory-bound and far above the
    launch floors takes the measured GPU's time times the bandwidth ratio: checked on a B200 copy
    with 1.25x the bandwidth (and the same FLOP/s and fixed costs)."""
    b200 = load_hardware("b200")
    faster = b200.model_copy(update={"name": "faster", "memory": b200.memory.model_copy(
        update={"bandwidth_Bps": b200.memory.bandwidth_Bps * 1.25})})
    sibling = sibling_profile(b200, faster, "test", "2026-11-24")
    assert sibling.memory.bandwidth_Bps == b200.memory.bandwidth_Bps * 1.25
    model = load_model("llama-3-8b")
    step = BatchShape.decode(1, 4095)
    kwargs = {"tp": 1, "precision": Precision.from_names("bf16", "bf16"), "runtime": RuntimeCosts.none()}
    a = CostModel(model, b200, **kwargs).step(step)
    b = CostModel(model, sibling, **kwargs).step(step)
    memory_a = sum(op.memory_s for op in a.ops)
    memory_b = sum(op.memory_s for op in b.ops)
    assert memory_b == pytest.approx(memory_a / 1.25, rel=1e-9)


def test_derive_siblings_writes_only_siblings_of_what_was_fitted(tmp_path: Path) -> None:
    b200 = load_hardware("b200")
    assert derive_siblings({"h100-sxm-80gb": load_hardware("h100-sxm-80gb")}, tmp_path, "2026-11-24") == []
    written = derive_siblings({"b200": b200}, tmp_path, "2026-11-24")
    assert sorted(p.name for p in written) == sorted(f"{name}.yaml" for name in SIBLINGS)
    derived = load_hardware(tmp_path / "gb200-nvl72.yaml")
    assert derived.efficiency.model_dump() == b200.efficiency.model_dump()
