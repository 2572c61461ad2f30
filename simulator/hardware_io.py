"""Reading and writing hardware profile YAML files, and the built-in catalogue of them.

Files are read by the input layer (:mod:`servesim.inputs`): errors name the file and the YAML
path of the bad entry (``h100.yaml: memory.bandwidth_Bps: Input should be greater than 0``) or
the line of a syntax error. Profiles are written back (by calibration) in the shipped layout:
number lists on one line and large numbers in a float form PyYAML reads back.
"""

from __future__ import annotations

from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.inputs.files import file_version, read_yaml
from servesim.inputs.schema import parse_model
from servesim.resources import hardware_profiles_dir

if TYPE_CHECKING:
    import yaml

FORMAT_FIX = "fix this entry (see hardware_profiles/h100-sxm-80gb.yaml for the format)"


def builtin_hardware_names() -> list[str]:
    return sorted(p.stem for p in hardware_profiles_dir().glob("*.yaml"))


def hardware_from_dict(data: Any, where: str) -> HardwareProfile:
    if not isinstance(data, dict):
        raise ServesimError(where, "a hardware profile must be a YAML mapping", "check the file")
    if "overhead" in data:
        raise ServesimError(f"{where}: overhead", "the per-step framework cost belongs to the serving "
                            "engine now, not to the hardware",
                            "delete this section (set engine.step_overhead_s in an experiment to change it)")
    return parse_model(HardwareProfile, data, file=where, value_fix=FORMAT_FIX,
                       missing_fix=lambda _field, _key: FORMAT_FIX)


def load_hardware_file(path: Path) -> HardwareProfile:
    """The profile in ``path``, parsed once while the file is unchanged (profiles are immutable)."""
    version = file_version(path)
    if version is None:
        return _parse_hardware_file(path)
    return _cached_hardware_file(path, version)


def _parse_hardware_file(path: Path) -> HardwareProfile:
    return hardware_from_dict(read_yaml(path, str(path)), str(path))


@lru_cache(maxsize=64)
def _cached_hardware_file(path: Path, version: tuple[str, int, int]) -> HardwareProfile:
    return _parse_hardware_file(path)


def load_hardware(name_or_path: str | Path, where: str = "hardware") -> HardwareProfile:
    """A built-in profile by name (``h100-sxm-80gb``, or a unique prefix such as ``h100-sxm``)
    or a YAML file."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ServesimError(where, f"no such file {path}",
                                "give a built-in profile name or the path of a profile YAML")
        return load_hardware_file(path)
    names = builtin_hardware_names()
    key = text.lower()
    matches = [n for n in names if n == key] or [n for n in names if n.startswith(key)]
    if len(matches) == 1:
        return load_hardware_file(hardware_profiles_dir() / f"{matches[0]}.yaml")
    if len(matches) > 1:
        raise ServesimError(where, f"{text!r} is ambiguous ({', '.join(matches)})",
                            "give the full profile name")
    raise ServesimError(where, f"unknown hardware {text!r}",
                        f"use one of {', '.join(names)} or a path to a profile YAML")


def _shortest_exponent_form(value: float) -> str:
    """``value`` in exponent form with the fewest mantissa digits that read back as the same float
    (a capacity of 183,359 MiB needs 12 significant digits; a fixed 11 rounded it)."""
    for digits in range(16):
        text = f"{value:.{digits}e}"
        if float(text) == value:
            return text
    return f"{value:.16e}"


def _represent_float(dumper: yaml.SafeDumper, value: float) -> yaml.Node:
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        mantissa, exponent = _shortest_exponent_form(value).split("e")
        mantissa = mantissa.rstrip("0") if "." in mantissa else mantissa + "."
        text = f"{mantissa}0e{exponent}" if mantissa.endswith(".") else f"{mantissa}e{exponent}"
        return dumper.represent_scalar("tag:yaml.org,2002:float", text)
    return dumper.represent_float(value)


def _represent_list(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.Node:
    flow = all(isinstance(v, (int, float)) for v in value)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)


@cache
def _profile_dumper() -> type[yaml.SafeDumper]:
    """PyYAML's dumper for profiles, made on first use (reading profiles needs no PyYAML)."""
    import yaml

    class ProfileDumper(yaml.SafeDumper):
        """Writes profiles the way people read them: number lists on one line, big numbers as
        ``9.894e+14`` (a form PyYAML reads back as a float)."""

    ProfileDumper.add_representer(float, _represent_float)
    ProfileDumper.add_representer(list, _represent_list)
    ProfileDumper.add_representer(tuple, _represent_list)
    return ProfileDumper


def dump_profile_yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.dump(data, Dumper=_profile_dumper(), sort_keys=False, width=100, allow_unicode=True)


def profile_to_yaml(profile: HardwareProfile) -> str:
    """Serialise a profile in the shipped layout (used by calibration to write fitted tables); a
    class's ``per_row_s`` and ``row_tile`` are written only where they are set (the quantise class
    has one, GEMM classes whose kernels pad their rows the other)."""
    data = profile.model_dump(mode="json", exclude_none=True)
    for efficiency in data.get("efficiency", {}).values():
        if not isinstance(efficiency, dict):  # a scalar of the efficiencies (mla_prefill_time_scale)
            continue
        if efficiency.get("per_row_s") == 0.0:
            del efficiency["per_row_s"]
        if efficiency.get("row_tile") == 1:
            del efficiency["row_tile"]
    return dump_profile_yaml(data)
