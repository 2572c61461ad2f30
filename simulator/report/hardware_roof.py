"""The roof a run's steps are drawn under: peak FLOP/s and HBM bandwidth of the run's hardware.

A report of a run in memory takes the roof from the run's hardware (:func:`roof_of`); one rebuilt
from a run folder reads it from ``config.resolved.yaml``: its
``hardware`` (a built-in profile name or a profile YAML path), ``deployment.tp`` and
``precision.activations`` (the format the GEMMs multiply in, whose peak is the compute roof, as
in the cost model). When the profile cannot be found any more (a custom YAML moved away), the
roofline chart is still drawn, without the roof, and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesim.dtypes import DType, Precision
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.hardware_io import load_hardware
from servesim.inputs.files import load_yaml_text


@dataclass(frozen=True)
class Roof:
    """Peaks of one GPU and the TP group size; the chart draws the group's roof (x ``tp``)."""

    hardware: str
    math_dtype: str
    tp: int
    peak_flops: float  # per GPU, in the activation (math) format
    bf16_peak_flops: float  # per GPU: attention, LM head and router run in 16-bit
    bandwidth_Bps: float  # per GPU

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the bandwidth slope meets the compute roof (same per GPU and per
        group, since both peaks scale with ``tp``)."""
        return self.peak_flops / self.bandwidth_Bps


def _section(config: dict[str, Any], key: str) -> dict[str, Any]:
    """``config[key]`` when it is a mapping, else an empty one."""
    value = config.get(key)
    return value if isinstance(value, dict) else {}


def roof_from_config(config_text: str | None, run_dir: Path) -> Roof | str:
    """The run's roof, or a sentence saying why there is none."""
    if config_text is None:
        return "no config.resolved.yaml in the run folder"
    try:
        config = load_yaml_text(config_text, "config.resolved.yaml", "run_dir")
    except ServesimError:
        return "config.resolved.yaml is not valid YAML"
    if not isinstance(config, dict) or not config.get("hardware"):
        return "config.resolved.yaml names no hardware"
    deployment = _section(config, "deployment")
    precision = _section(config, "precision")
    name = str(config["hardware"])
    try:
        tp = int(deployment.get("tp") or 1)
        precision_ = Precision.from_names(str(precision.get("weights", "bf16")),
                                          str(precision.get("activations", "bf16")))
        return roof_of(_load(name, run_dir), precision_, tp)
    except (ServesimError, ValueError, TypeError) as exc:
        return f"hardware {name!r} could not be loaded ({exc})"


def roof_of(hardware: HardwareProfile, precision: Precision, tp: int) -> Roof:
    """The roof of ``tp`` GPUs of ``hardware`` multiplying in ``precision``'s math format."""
    dtype = precision.math
    return Roof(hardware=hardware.display_name, math_dtype=dtype.value, tp=max(tp, 1),
                peak_flops=hardware.peak(dtype), bf16_peak_flops=hardware.peak(DType.BF16),
                bandwidth_Bps=hardware.memory.bandwidth_Bps)


def _load(name: str, run_dir: Path) -> HardwareProfile:
    """A built-in name or a path as written; a relative path is also tried from the run folder."""
    try:
        return load_hardware(name)
    except ServesimError:
        beside = run_dir / name
        if not Path(name).is_absolute() and beside.is_file():
            return load_hardware(beside)
        raise
