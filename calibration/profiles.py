"""Writing fitted profiles, the CPU base profile, and the Vidur import that refits A100/H100.

A fitted profile is written in the shipped layout (:func:`servesim.hardware_io.profile_to_yaml`)
under the original file's header comment, so a diff shows only the numbers that changed and
their provenance.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pandas as pd

from servesim.atomic_io import atomic_write_text
from servesim.calibration.profile_fit import FitReport, fit_profile
from servesim.calibration.vidur import PROFILE_OF, vidur_tables
from servesim.hardware import HardwareProfile
from servesim.hardware_io import builtin_hardware_names, hardware_from_dict, load_hardware, profile_to_yaml
from servesim.resources import user_profiles_dir

VIDUR_SOURCE = "public Vidur per-operator profiles (microsoft/vidur data/profiling, {gpu})"


def write_profile(profile: HardwareProfile, path: Path, note: str) -> Path:
    """Write ``profile`` to ``path``, keeping the leading comment of the file it replaces."""
    path = Path(path)
    header: list[str] = []
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            if not line.startswith("# Calibrated:"):
                header.append(line)
    header.append(f"# Calibrated: {note}")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(header) + "\n" + profile_to_yaml(profile))
    return path


def import_vidur(root: Path, out_dir: Path | None = None, date: str | None = None,
                 ) -> tuple[dict[str, HardwareProfile], pd.DataFrame]:
    """Fit the A100 and H100 SXM profiles from the public data under ``root`` and write them to
    ``out_dir`` (default: :func:`~servesim.resources.user_profiles_dir`, never the built-in folder;
    pass ``hardware_profiles/`` of a checkout to refit the shipped profiles).

    H100 has no public decode-attention timings: it takes the A100 decode fit (the same paged
    FlashAttention kernel, as a fraction of each GPU's HBM bandwidth) and says so."""
    date = date or dt.date.today().isoformat()
    out_dir = Path(out_dir) if out_dir else user_profiles_dir()
    fitted: dict[str, HardwareProfile] = {}
    reports: list[FitReport] = []
    for gpu in ("a100", "h100"):
        name = PROFILE_OF[gpu]
        tables = vidur_tables(Path(root), gpu)
        profile, report = fit_profile(tables, load_hardware(name), VIDUR_SOURCE.format(gpu=gpu), date)
        if gpu == "h100" and "a100" in fitted:
            a100 = fitted["a100"]
            profile = _with_transferred_decode(profile, a100, date)
        fitted[gpu] = profile
        reports.append(report)
        write_profile(profile, out_dir / f"{name}.yaml",
                      f"efficiencies fitted by `servesim calibrate import-vidur` on {date}")
    return fitted, pd.concat([r.table() for r in reports], ignore_index=True)


def _with_transferred_decode(h100: HardwareProfile, a100: HardwareProfile, date: str) -> HardwareProfile:
    data: dict[str, Any] = h100.model_dump(mode="json", exclude_none=True)
    data["efficiency"]["attention_decode"] = a100.efficiency.attention_decode.model_dump(mode="json")
    data["provenance"]["efficiency.attention_decode"] = (
        f"transferred {date} from the a100-sxm-80gb fit to Vidur's A100 paged FlashAttention "
        "decode profile (same kernel family, as a fraction of HBM bandwidth); no public H100 "
        "decode-attention timings exist, so this curve is not validated on H100: "
        + str(a100.provenance.get("efficiency.attention_decode", "")))
    return hardware_from_dict(data, "h100 with transferred decode")


def cpu_base_profile(tables: dict[str, pd.DataFrame], metadata: dict[str, Any],
                     name: str = "cpu-local") -> HardwareProfile:
    """A profile for a CPU, whose peaks are the best rates the benchmark itself measured.

    A CPU has no spec-sheet roofline we trust (turbo, AMX/AVX-512 paths, caches), so the
    "spec" here is the fastest bf16 GEMM and the fastest copy seen: efficiencies are fractions
    of those, and the textbook roofline of this profile is the best case this machine showed."""
    gemm = tables.get("gemm")
    memory = tables.get("memory")
    if gemm is None or memory is None:
        from servesim.errors import ServesimError
        raise ServesimError("measurements", "a CPU profile needs gemm.csv and memory.csv",
                            "run `servesim calibrate bench --device cpu` without --skip")
    bf16 = gemm[gemm["dtype"] == "bf16"]
    flops = float((2.0 * bf16["m"] * bf16["n"] * bf16["k"] / bf16["time_s"]).max())
    bandwidth = float((memory["bytes"] / memory["time_s"]).max())
    capacity = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    device = metadata.get("device_name", "CPU")
    link = {"kind": "none (single host)", "bandwidth_Bps": bandwidth, "latency_s": 0.0, "efficiency": 1.0}
    one = {"compute": 1.0, "memory": 1.0, "fixed_s": 0.0}
    data = {
        "name": name, "display_name": f"{device} ({metadata.get('threads', '?')} threads)",
        "vendor": "cpu", "spec_only": True,
        "peak_flops": {"bf16": float(f"{flops:.4g}")},
        "memory": {"capacity_bytes": capacity, "bandwidth_Bps": float(f"{bandwidth:.4g}"),
                   "reserved_bytes": 0.0},
        "interconnect": link, "host_link": link,
        "efficiency": {k: one for k in ("gemm", "attention_prefill", "attention_decode", "elementwise")},
        "provenance": {
            "peak_flops": "fastest bf16 GEMM of the benchmark run (MAMF-style), not a spec sheet",
            "memory.bandwidth_Bps": "fastest copy of the benchmark run (may be cache-resident)",
            "memory.capacity_bytes": "physical memory reported by the OS",
            "interconnect": "none: one host", "host_link": "none: one host",
            "calibration": "spec-only: peaks from the benchmark, efficiencies not yet fitted",
        },
    }
    return hardware_from_dict(data, name)


def fit_directory(directory: Path, profile_path: Path, out: Path | None = None,
                  ) -> tuple[HardwareProfile, pd.DataFrame]:
    """``servesim calibrate fit``: fit ``profile_path`` (created from the measurements' own peaks
    when it does not exist yet, e.g. ``cpu-local.yaml``) and write it to ``out`` (default: in place)."""
    from servesim.calibration.schema import read_measurements, read_metadata
    from servesim.errors import ServesimError

    tables = read_measurements(directory)
    metadata = read_metadata(directory)
    profile_path = Path(profile_path)
    new = not profile_path.exists()
    if new and profile_path.suffix not in (".yaml", ".yml"):
        hint = (f"{profile_path.name} is a built-in profile: give its file, e.g. "
                f"hardware_profiles/{profile_path.name}.yaml" if profile_path.name in builtin_hardware_names()
                else "give an existing profile YAML, or a new NAME.yaml for a CPU run")
        raise ServesimError("--profile", f"no such file {profile_path}", hint)
    if new and metadata.get("device") != "cpu":
        raise ServesimError("--profile", f"no such file {profile_path}",
                            "give an existing profile YAML (new profiles are made only for CPU runs)")
    base = (cpu_base_profile(tables, metadata, profile_path.stem) if new
            else load_hardware(profile_path, "--profile"))
    source = (f"servesim calibrate bench on {metadata.get('device_name', '?')} "
              f"(torch {metadata.get('torch', '?')}, {metadata.get('date', '?')}, "
              f"{'quick' if metadata.get('quick') else 'full'} grid, {directory})")
    fitted, report = fit_profile(tables, base, source, memory_tail=not new)
    target = Path(out) if out else profile_path
    write_profile(fitted, target, f"fitted by `servesim calibrate fit` from {source}")
    return fitted, report.table()
