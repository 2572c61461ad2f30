"""The GPUs of 2026 and every profile's fast domain and scale-out network, each with a source."""

from __future__ import annotations

import pytest

from servesim import load_hardware
from servesim.dtypes import DType
from servesim.hardware_io import builtin_hardware_names

NEW_GPUS = {"gb200-nvl72", "b300", "h20", "l4", "a10g", "mi325x", "mi355x"}


def test_the_fleet_ships() -> None:
    assert NEW_GPUS | {"h200-sxm-141gb", "b200"} <= set(builtin_hardware_names())


@pytest.mark.parametrize("name", sorted(builtin_hardware_names()))
def test_every_profile_says_where_its_domain_network_and_price_come_from(name: str) -> None:
    profile = load_hardware(name)
    assert profile.fast_domain_gpus is not None and profile.scale_out is not None
    assert profile.cost_per_gpu_hour is not None
    for key in ("fast_domain_gpus", "scale_out", "cost_per_gpu_hour", "peak_flops", "memory.capacity_bytes",
                "memory.bandwidth_Bps", "interconnect", "host_link", "calibration"):
        assert profile.provenance.get(key), f"{name}: no provenance for {key}"
    # the GPUs AIConfigurator measured are calibrated from its kernels; the new ones are spec-only
    assert profile.spec_only == (name not in {"a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200"})


def test_spec_sheet_figures_by_hand() -> None:
    nvl72 = load_hardware("gb200-nvl72")
    # NVIDIA's rack figures over 72 GPUs, sparse halved: 1,440 / 72 / 2 = 10 PFLOPS FP4
    assert nvl72.peak_flops[DType.FP4] == 1440e15 / 72 / 2
    assert nvl72.peak_flops[DType.BF16] == 360e15 / 72 / 2
    assert nvl72.memory.bandwidth_Bps == 576e12 / 72
    assert nvl72.fast_domain_gpus == 72
    assert nvl72.host_link.bandwidth_Bps > 5 * load_hardware("b200").host_link.bandwidth_Bps  # NVLink-C2C
    # FP4 tensor cores on Blackwell and CDNA 4 only
    with_fp4 = {name for name in builtin_hardware_names() if DType.FP4 in load_hardware(name).peak_flops}
    assert with_fp4 == {"b200", "b300", "gb200-nvl72", "gb300-nvl72", "mi355x"}
    # H20: Hopper bandwidth with about 15% of H100's compute, so its ridge is low
    h20, h100 = load_hardware("h20"), load_hardware("h100-sxm-80gb")
    assert h20.ridge_point() == pytest.approx(148e12 / 4.0e12)
    assert h20.ridge_point() < h100.ridge_point() / 7
    assert DType.FP8 not in load_hardware("a10g").peak_flops  # Ampere
