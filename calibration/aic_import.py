"""``servesim calibrate import-aiconfigurator``: fit the H100, H200, B200 and A100 profiles from
NVIDIA AIConfigurator's measured vLLM kernels.

Per GPU: GEMMs (bf16 and per-tensor fp8), prefill and decode attention (bf16 and fp8 KV cache),
vLLM's fused MoE (bf16, block-scaled FP8, weight-only INT4 and NVFP4 experts; the
expert-parallel rows are reported, not fitted) and nccl-tests all-reduce (the interconnect's ring
model) go through the same fit as the Vidur import
(:func:`servesim.calibration.profile_fit.fit_profile`: every other value of each family's shape
axis held out, provenance with in-sample and held-out error); vLLM's own all-reduce and NCCL fit
the profile's ``collectives`` (:mod:`servesim.calibration.collective_fit`). Elementwise kernels
keep their hand-set curves (the data has none). The report gives, per GPU and family, the
held-out median and p90 error of the spec-sheet roofline, of the profile before the import and of
the fitted one.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pandas as pd

from servesim.calibration.aiconfigurator import GPUS, VERSIONS, aic_tables
from servesim.calibration.collective_fit import fit_collectives
from servesim.calibration.mla_fit import fit_mla_prefill_scale, module_table, with_mla_fit
from servesim.calibration.profile_fit import error_stats, fit_profile
from servesim.calibration.profiles import write_profile
from servesim.calibration.sibling_profiles import derive_siblings
from servesim.calibration.work import ape, predict
from servesim.hardware import HardwareProfile
from servesim.hardware_io import hardware_from_dict, load_hardware
from servesim.resources import hardware_profiles_dir

SOURCE = ("NVIDIA AIConfigurator per-operator timings (ai-dynamo/aiconfigurator @095f58a5, "
          "systems/data/{gpu}, vLLM {version})")
ROW_TILES = {"gemm_fp8": 256, "gemm_fp4": 128}
"""The row granule each GEMM family's kernels pad to (:func:`servesim.cost.roofline.padded_rows`),
from the dispatcher the measured vLLM runs, not fitted: its CUTLASS FP8 ``scaled_mm``
(``csrc/quantization/cutlass_w8a8/c3x``) picks a configuration by the next power of two of M, with
64-row tiles up to 64 rows, then on SM90 (H100, H200) 64-row tiles in clusters of two up to 128
rows and 128-row tiles in clusters of two above, and on SM100 (B200) 128-row tiles in clusters of
two up to 256 rows and 256-row two-SM tiles above: a granule of 256 rows on both. The bf16
GEMMs run cuBLAS, whose heuristics show no steps in the data (1: none). The fit only ever sees
GEMMs of 2^j + 1 rows (the held-out half is the aligned sizes), for which padding relabels the
tokens axis, so the tile cannot be fitted from them; the aligned held-out rows test it (H100 FP8
held-out median 13.2% -> 10.1%, H200 15.3% -> 10.5%, B200 10.4% -> 8.5%, 2026-11-28). B200's
NVFP4 linears (FlashInfer's CuTe DSL kernel) run Blackwell's block-scaled MMA, whose M is 128 rows
on one SM (256 on two): a granule of 128, not fitted (held-out median 8.4% unpadded, 7.6% at 128,
8.3% at 256, 2026-11-29)."""
KERNEL_FAMILIES = ("gemm", "gemm_fp8", "gemm_fp4", "attention_prefill", "attention_decode",
                   "attention_decode_fp8", "allreduce", "moe", "moe_fp8", "moe_w4a16", "moe_fp4")


def import_gpu(root: Path, gpu: str, date: str) -> tuple[HardwareProfile, pd.DataFrame]:
    """One GPU's profile fitted to its AIConfigurator tables, and its error report."""
    measured = aic_tables(root, gpu)
    source = SOURCE.format(gpu=gpu, version=VERSIONS[gpu])
    prior = load_hardware(GPUS[gpu])
    kernels = {family: measured.tables[family] for family in KERNEL_FAMILIES if family in measured.tables}
    fitted, report = fit_profile(kernels, prior, source, date, row_tiles=ROW_TILES)
    collectives, reports = fit_collectives(measured.tables["nccl"], measured.tables["custom_allreduce"],
                                                 fitted)
    data: dict[str, Any] = fitted.model_dump(mode="json", exclude_none=True)
    data["collectives"] = collectives.model_dump(mode="json")
    provenance = dict(fitted.provenance)
    detail = "; ".join(f"{r.family}: {r.rows_fit} rows fitted, {r.rows_held_out} held out, held-out "
                       f"median {r.fit_out[0]:.1f}% p90 {r.fit_out[1]:.1f}% (ring model before: median "
                       f"{r.prior[0]:.1f}% p90 {r.prior[1]:.1f}%)" for r in reports)
    provenance["collectives"] = (
        f"fitted {date} by servesim calibrate import-aiconfigurator from {source} [comm/vllm "
        "custom_allreduce_perf (graph-captured), comm/nccl nccl_perf all_reduce half]: vLLM's all-reduce "
        "split by vLLM's kernel choice on this GPU (custom one-shot / two-shot below its limit, "
        "PyTorch symmetric memory up to its own on Hopper and Blackwell: servesim.engines.vllm's size "
        "tables), NCCL from nccl-tests; "
        "latency, per-peer latency and efficiency by grid search on mean |log error| over every other "
        "message size, then per group size (efficiency_by_world) the median implied bandwidth fraction "
        "per octave of wire bytes over the bandwidth-bound fitted rows, kept where it lowers that "
        f"group's error; {detail}; eager_call_s = median eager minus graphed time of vLLM's all-reduce "
        "up to 64 KiB")
    ep_rows = validation_report(measured.moe_expert_parallel, prior, fitted, "_ep")
    skewed_rows = validation_report(measured.moe_skewed, prior, fitted, "_power_law")
    note_validated(provenance, ep_rows, "_ep", "expert-parallel rows (rank 0 of EP 2-256, not fitted)")
    note_validated(provenance, skewed_rows, "_power_law", "power-law routed rows (exponent 1.01, not "
                   "fitted; experts hit as its generator leaves them)")
    ep_rows += skewed_rows
    dropped = ", ".join(f"{reason} ({count:,})" for reason, count in measured.dropped.items())
    provenance["calibration"] = (
        f"{provenance.get('calibration', '')}; rows left out of the AIConfigurator import: "
        f"{dropped or 'none'}")
    data["provenance"] = provenance
    profile = hardware_from_dict(data, f"fitted {GPUS[gpu]}")
    mla_rows: list[dict[str, Any]] = []
    modules = module_table(root, gpu)
    mla = fit_mla_prefill_scale(modules, profile) if modules is not None and not modules.empty else None
    if mla is not None:
        profile = with_mla_fit(profile, mla, source, date)
        profile = hardware_from_dict(profile.model_dump(mode="json", exclude_none=True),
                                     f"fitted {GPUS[gpu]}")
        mla_rows.append({"gpu": gpu, "profile": prior.name, "family": "mla_prefill_attention",
                         "rows_fit": mla.rows_fit, "rows_held_out": mla.rows_held_out,
                         "spec_median_%": float("nan"), "spec_p90_%": float("nan"),
                         "prior_median_%": mla.before[0], "prior_p90_%": mla.before[1],
                         "fit_in_median_%": float("nan"), "fit_in_p90_%": float("nan"),
                         "fit_out_median_%": mla.kept[0], "fit_out_p90_%": mla.kept[1]})
    table = report.table()
    table.insert(0, "gpu", gpu)
    extra = pd.DataFrame([{"gpu": gpu, "profile": prior.name, "family": f"allreduce_{r.family}",
                           "rows_fit": r.rows_fit, "rows_held_out": r.rows_held_out,
                           "spec_median_%": float("nan"), "spec_p90_%": float("nan"),
                           "prior_median_%": r.prior[0], "prior_p90_%": r.prior[1],
                           "fit_in_median_%": r.fit_in[0], "fit_in_p90_%": r.fit_in[1],
                           "fit_out_median_%": r.fit_out[0], "fit_out_p90_%": r.fit_out[1]}
                          for r in reports])
    ep = pd.DataFrame([{"gpu": gpu, "profile": prior.name, **row} for row in ep_rows])
    return profile, pd.concat([table, extra, ep, pd.DataFrame(mla_rows)], ignore_index=True)


def note_validated(provenance: dict[str, str], rows: list[dict[str, Any]], suffix: str, label: str) -> None:
    """Add each validated family's error (:func:`validation_report` rows named with ``suffix``) to
    the provenance of the efficiency class that priced it."""
    for row in rows:
        key = f"efficiency.{row['family'].removesuffix(suffix)}"
        if key in provenance:
            provenance[key] += (
                f"; {label}: {row['rows_held_out']} rows, median {row['fit_out_median_%']:.1f}% p90 "
                f"{row['fit_out_p90_%']:.1f}% (before: median {row['prior_median_%']:.1f}% p90 "
                f"{row['prior_p90_%']:.1f}%)")


def validation_report(rows: pd.DataFrame | None, prior: HardwareProfile, fitted: HardwareProfile,
                      suffix: str) -> list[dict[str, Any]]:
    """Error on fused-MoE rows the import validates but does not fit, per family (named with
    ``suffix``), with the profile before and after: expert-parallel layouts (the cost model's
    rank-0 share, ``1/ep`` of the assignments and experts) and skewed routing."""
    out: list[dict[str, Any]] = []
    if rows is None or rows.empty:
        return out
    for family, group in rows.groupby("family"):
        measured = group["time_s"].to_numpy(float)
        before = error_stats(ape(predict(str(family), group, prior), measured))
        after = error_stats(ape(predict(str(family), group, fitted), measured))
        out.append({"family": f"{family}{suffix}", "rows_fit": 0, "rows_held_out": len(group),
                    "spec_median_%": float("nan"), "spec_p90_%": float("nan"),
                    "prior_median_%": before[0], "prior_p90_%": before[1],
                    "fit_in_median_%": float("nan"), "fit_in_p90_%": float("nan"),
                    "fit_out_median_%": after[0], "fit_out_p90_%": after[1]})
    return out


def import_aiconfigurator(root: Path, out_dir: Path | None = None, date: str | None = None,
                          gpus: tuple[str, ...] = tuple(GPUS),
                          ) -> tuple[dict[str, HardwareProfile], pd.DataFrame]:
    """Fit and write the profiles of ``gpus``; returns them and the error report."""
    date = date or dt.date.today().isoformat()
    out_dir = Path(out_dir) if out_dir else hardware_profiles_dir()
    fitted: dict[str, HardwareProfile] = {}
    reports = []
    for gpu in gpus:
        profile, report = import_gpu(Path(root), gpu, date)
        fitted[gpu] = profile
        reports.append(report)
        write_profile(profile, out_dir / f"{GPUS[gpu]}.yaml",
                      f"efficiencies fitted by `servesim calibrate import-aiconfigurator` on {date}")
    derive_siblings({profile.name: profile for profile in fitted.values()}, out_dir, date)
    return fitted, pd.concat(reports, ignore_index=True)
