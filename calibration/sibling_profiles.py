"""Profiles of GPUs nobody measured, borrowed from a measured GPU of the same architecture.

AIConfigurator's kernel tables cover H100, H200, B200 and A100. GB200 (the same B200 die in a
Grace-Blackwell NVL72 rack), B300 and GB300 (Blackwell Ultra) run the same SM design and the same
kernels (cuBLAS, FlashInfer, vLLM's fused MoE and custom all-reduce), so their kernels reach the
same *fractions* of their own peaks: each sibling keeps its spec sheet (peak FLOP/s, HBM
bandwidth and capacity, NVLink, host link, rack) and takes the measured GPU's fitted efficiency
classes and all-reduce fits, with provenance saying so. Until a sibling is measured, this is the
best estimate the data supports: before, these profiles carried the B200's spec-sheet priors
from before the B200 was fitted, which priced every fused-MoE and FP8 kernel with the 16-bit GEMM
curve and every all-reduce with the ring model (DeepSeek on GB200: steps about 1.5x the
measured engines'). The profile stays ``spec_only`` (nothing in it was measured on that GPU).

:func:`derive_siblings` runs at the end of ``servesim calibrate import-aiconfigurator`` so a
refit of the measured GPU carries over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servesim.calibration.profiles import write_profile
from servesim.hardware import HardwareProfile
from servesim.hardware_io import hardware_from_dict, load_hardware_file
from servesim.resources import hardware_profiles_dir

SIBLINGS: dict[str, tuple[str, str]] = {
    "gb200-nvl72": ("b200", "the same B200 die (Blackwell) in a GB200 NVL72 rack"),
    "b300": ("b200", "Blackwell Ultra: the B200's SM design with more FP4 and HBM"),
    "gb300-nvl72": ("b200", "Blackwell Ultra B300 GPUs in a GB300 NVL72 rack; the B200's SM design"),
}
"""Sibling profile -> (the measured profile it borrows from, why they match)."""


def sibling_profile(measured: HardwareProfile, sibling: HardwareProfile, why: str,
                    date: str) -> HardwareProfile:
    """``sibling``'s specs with ``measured``'s efficiency classes and all-reduce fits."""
    data: dict[str, Any] = sibling.model_dump(mode="json", exclude_none=True)
    data["efficiency"] = measured.efficiency.model_dump(mode="json", exclude_none=True)
    if measured.collectives is not None:
        data["collectives"] = measured.collectives.model_dump(mode="json", exclude_none=True)
    data["spec_only"] = True
    provenance = {key: value for key, value in sibling.provenance.items()
                  if not key.startswith("efficiency") and key != "collectives"}
    borrowed = (f"borrowed {date} from {measured.name}.yaml ({why}; efficiencies are fractions of "
                f"this GPU's own peaks, not measured on it): ")
    for key, value in measured.provenance.items():
        if key.startswith("efficiency") or key == "collectives":
            provenance[key] = borrowed + value
    provenance["calibration"] = (
        f"spec-only: nothing in this file was measured on this GPU; efficiency.* and collectives are "
        f"{measured.name}'s fits to its measured kernels (calibration.sibling_profiles, {date})")
    data["provenance"] = provenance
    return hardware_from_dict(data, f"{sibling.name} from {measured.name}")


def derive_siblings(fitted: dict[str, HardwareProfile], out_dir: Path, date: str) -> list[Path]:
    """Write every sibling of a profile in ``fitted`` (by profile name) into ``out_dir``, its specs
    read from the sibling's file there (or the built-in one)."""
    written = []
    for name, (source, why) in SIBLINGS.items():
        measured = fitted.get(source)
        path = Path(out_dir) / f"{name}.yaml"
        specs = path if path.exists() else hardware_profiles_dir() / f"{name}.yaml"
        if measured is None or not specs.exists():
            continue
        profile = sibling_profile(measured, load_hardware_file(specs), why, date)
        written.append(write_profile(profile, path, f"efficiencies borrowed from {source}.yaml on {date} "
                                     "(calibration.sibling_profiles)"))
    return written
