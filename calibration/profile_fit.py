"""Fit a whole hardware profile from measurement tables, with provenance and the fit error.

Each kernel family fits one part of the profile (GEMMs -> ``efficiency.gemm``, attention prefill
and decode -> their classes, memory copies -> ``efficiency.elementwise``, all-reduce -> the
interconnect's latency and achieved fraction). Every other distinct value of the family's main
shape axis is held out (:func:`servesim.calibration.schema.holdout_mask`), so the error written into the
profile's provenance is measured both in sample and out of sample.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from servesim.calibration.fit import (
    MIN_ROWS_FULL_FIT,
    RIDGE_LOCK,
    FitResult,
    fit_link,
    fit_operator,
    log_error,
)
from servesim.calibration.quantise_fit import fit_gemm_fp8, with_quantise
from servesim.calibration.schema import holdout_mask
from servesim.calibration.work import (
    GEMM_FAMILIES,
    MOE_FORMATS,
    OPERATOR_OF,
    ape,
    efficiency_of,
    fast_predict,
    predict,
    usable,
    work,
)
from servesim.hardware import HardwareProfile, OperatorEfficiency
from servesim.hardware_io import hardware_from_dict

PROVENANCE_KEY = {"gemm": "efficiency.gemm", "gemm_fp8": "efficiency.gemm_fp8",
                  "gemm_fp4": "efficiency.gemm_fp4",
                  "attention_prefill": "efficiency.attention_prefill",
                  "attention_decode": "efficiency.attention_decode",
                  "attention_decode_fp8": "efficiency.attention_decode_fp8",
                  "memory": "efficiency.elementwise", "allreduce": "interconnect",
                  "moe": "efficiency.moe", "moe_fp8": "efficiency.moe_fp8",
                  "moe_w4a16": "efficiency.moe_w4a16", "moe_fp4": "efficiency.moe_fp4"}
METHOD = ("knots per octave at the median implied efficiency of the rows bound by each curve, "
          "alternating compute/memory classification, isotonic in ln x - ln eff (Curve rule), fixed "
          "cost by grid search on mean |log error|")


@dataclass
class FitReport:
    """Errors per family: the spec-sheet roofline, the profile before the fit, and the fit."""

    profile: str
    source: str
    rows: list[dict[str, object]] = field(default_factory=list)

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def error_stats(errors: np.ndarray) -> tuple[float, float]:
    """Median and p90 absolute percentage error, in percent."""
    if errors.size == 0:
        return float("nan"), float("nan")
    return float(np.median(errors) * 100), float(np.percentile(errors, 90) * 100)


def _fmt(stats: tuple[float, float]) -> str:
    return f"median {stats[0]:.1f}% p90 {stats[1]:.1f}%"


def _shaped_method(outputs: str, depth: str) -> str:
    """What a family with shape factors adds to its method: where each factor reads."""
    return (f"; the compute efficiency is the tokens curve times an outputs ({outputs}) and a depth "
            f"({depth}) factor, fitted with it by alternating medians in log space "
            "(calibration/fit.py::fit_shaped)")


SHAPED_METHOD = _shaped_method("m x n", "k")
"""What a GEMM family's method adds: its shape factors."""

SHAPED_ATTENTION_METHOD = _shaped_method("keys seen x heads: the query rows x heads of these context-free "
                                         "rows", "head dimension")
"""What the prefill-attention family's method adds: its shape factors."""


def _method(family: str, rows: int) -> str:
    if family == "allreduce":
        return "ring model, latency and achieved bandwidth fraction by joint grid search"
    if rows < MIN_ROWS_FULL_FIT:
        return (f"compute curve only (fewer than {MIN_ROWS_FULL_FIT} rows: the prior's fixed cost and "
                "memory curve are kept, and its compute knots below the measured range)")
    if family == "attention_prefill":
        return METHOD + SHAPED_ATTENTION_METHOD
    return METHOD + (SHAPED_METHOD if family in GEMM_FAMILIES else "")


UNLOCKED_FAMILIES = frozenset(MOE_FORMATS)
"""Families fitted without the ridge lock (:data:`servesim.calibration.fit.RIDGE_LOCK`): a fused
MoE's grouped GEMMs pad each expert's few rows up to the kernel's row tile, so between 8 and 64
rows per expert the call's time grows with the tokens although the textbook calls it bound by
its (unchanging) weight bytes. Locked there, that growth had no curve to go to: B200's FP8 MoE
was priced 10-27% fast at 512-2,048 tokens and 10-20% slow below 128, held-out median 13.1%;
unlocked, the compute curve on rows per expert takes it (7.3%). The lock stays for the other
families, where it keeps one resource's curve from explaining the other's inefficiency."""

TILED_FAMILIES = frozenset({"attention_decode", "attention_decode_fp8"})
"""Families whose KV tile is searched with the fit (:data:`KEY_TILES`)."""

KEY_TILES = (1, 16, 32, 64, 128, 256)
"""Decode attention's KV tile candidates (FlashAttention and FlashInfer decode kernels split each
sequence's keys into blocks of 64-256)."""


def fit_with_tile(family: str, rows: pd.DataFrame, profile: HardwareProfile, prior: OperatorEfficiency,
                  memory_tail: bool, row_tile: int = 1) -> FitResult:
    """:func:`fit_operator` on ``rows``; for decode attention also the KV tile, the candidate whose
    fit has the lowest mean |log error| on these (fitted) rows."""
    bandwidth = profile.memory.bandwidth_Bps
    if family not in TILED_FAMILIES or len(rows) < MIN_ROWS_FULL_FIT:
        lock = None if family in UNLOCKED_FAMILIES else RIDGE_LOCK
        return fit_operator(work(family, rows, profile, prior.key_tile, row_tile=row_tile), bandwidth,
                            prior, memory_tail, ridge_lock=lock)
    best: tuple[float, FitResult] | None = None
    for tile in KEY_TILES:
        w = work(family, rows, profile, tile)
        result = fit_operator(w, bandwidth, prior, memory_tail)
        tiled = result.efficiency.model_copy(update={"key_tile": tile})
        score = log_error(fast_predict(w, tiled, bandwidth), w.time_s)
        if best is None or score < best[0]:
            best = (score, replace(result, efficiency=tiled))
    assert best is not None
    return best[1]


def fit_family(family: str, rows: pd.DataFrame, tables: dict[str, pd.DataFrame],
               profile: HardwareProfile, prior: OperatorEfficiency,
               memory_tail: bool, row_tile: int = 1) -> tuple[FitResult, OperatorEfficiency | None]:
    """One family's fit, and for FP8 GEMMs the quantisation class fitted with it; a GEMM family
    whose kernels pad their rows is fitted on the padded rows (``row_tile``,
    :func:`~servesim.cost.roofline.padded_rows`)."""
    quantise = None
    if family == "gemm_fp8":  # fitted net of the input quantisation its times include
        result, quantise = fit_gemm_fp8(rows, tables.get("gemm"), profile, prior, memory_tail, row_tile)
    else:
        result = fit_with_tile(family, rows, profile, prior, memory_tail, row_tile)
    if result.efficiency.row_tile != row_tile:  # the class prices as it was fitted
        result = replace(result, efficiency=result.efficiency.model_copy(update={"row_tile": row_tile}))
    return result, quantise


def fit_profile(tables: dict[str, pd.DataFrame], profile: HardwareProfile, source: str,
                date: str | None = None, families: tuple[str, ...] | None = None,
                memory_tail: bool = True, row_tiles: Mapping[str, int] | None = None
                ) -> tuple[HardwareProfile, FitReport]:
    """``profile`` with every family in ``tables`` fitted, and the report of errors.

    ``memory_tail``: beyond the measured sizes, memory curves rejoin the profile's previous ones
    (right for a GPU whose shipped curves came from larger kernels; off for a new profile).
    ``row_tiles``: the row granule of each GEMM family's kernels (:func:`~servesim.cost.roofline.
    padded_rows`), set by what dispatches them; a family not named keeps its class's own."""
    date = date or dt.date.today().isoformat()
    efficiency = dict(profile.efficiency)
    link = profile.interconnect
    usable_tables: dict[str, pd.DataFrame] = {}
    for family, raw in tables.items():
        if families is not None and family not in families:
            continue
        table = usable(family, raw, profile)
        if table.empty:
            continue
        usable_tables[family] = table
        held = holdout_mask(table, family)
        fit_rows = table[~held]
        if family == "allreduce":
            link = fit_link(fit_rows["bytes"].to_numpy(float), fit_rows["world"].to_numpy(float),
                            fit_rows["time_s"].to_numpy(float), link)
            continue
        op = OPERATOR_OF[family]
        prior = efficiency.get(op) or efficiency_of(profile, family)
        assert prior is not None
        # each family is fitted net of the input quantisation as fitted so far (the FP8 GEMM fit
        # refits it; the FP4 GEMMs and fused MoE calls after it include one)
        quantise_now = efficiency.get("quantise")
        basis = with_quantise(profile, quantise_now) if quantise_now is not None else profile
        result, quantise = fit_family(family, fit_rows, usable_tables, basis, prior, memory_tail,
                                      (row_tiles or {}).get(family, prior.row_tile))
        if quantise is not None:
            efficiency["quantise"] = quantise
        efficiency[op] = result.efficiency
    data = profile.model_dump(mode="json", exclude_none=True)
    data["efficiency"] = {k: v.model_dump(mode="json") if isinstance(v, OperatorEfficiency) else v
                          for k, v in efficiency.items() if v is not None}
    data["interconnect"] = link.model_dump(mode="json")
    fitted = hardware_from_dict(data, f"fitted {profile.name}")

    report = FitReport(profile.name, source)
    provenance = dict(profile.provenance)
    for family, table in usable_tables.items():
        held = holdout_mask(table, family)
        measured = table["time_s"].to_numpy(float)
        errors = {name: ape(predict(family, table, p), measured)
                  for name, p in (("spec", profile.ideal()), ("prior", profile), ("fit", fitted))}
        rows_fit, rows_held_out = int((~held).sum()), int(held.sum())
        row: dict[str, object] = {"profile": profile.name, "family": family, "rows_fit": rows_fit,
                                  "rows_held_out": rows_held_out}
        for name in ("spec", "prior"):
            row[f"{name}_median_%"], row[f"{name}_p90_%"] = error_stats(errors[name][held])
        row["fit_in_median_%"], row["fit_in_p90_%"] = error_stats(errors["fit"][~held])
        row["fit_out_median_%"], row["fit_out_p90_%"] = error_stats(errors["fit"][held])
        report.rows.append(row)
        key = PROVENANCE_KEY[family]
        detail = "; ".join(sorted(table["source"].astype(str).unique())) if "source" in table else ""
        provenance[key] = (
            f"fitted {date} by servesim calibrate from {source}{f' [{detail}]' if detail else ''} "
            f"({family}: {rows_fit} rows "
            f"fitted, {rows_held_out} held out, every other {family} shape-axis value); method: "
            f"{_method(family, rows_fit)}; "
            f"in-sample {_fmt(error_stats(errors['fit'][~held]))}, held-out "
            f"{_fmt(error_stats(errors['fit'][held]))} (spec-sheet roofline on the held-out rows: "
            f"{_fmt(error_stats(errors['spec'][held]))})")
        quantise = fitted.efficiency.quantise
        if family == "gemm_fp8" and quantise is not None:
            provenance["efficiency.quantise"] = (
                f"fitted {date} by servesim calibrate from {source} jointly with efficiency.gemm_fp8 "
                f"(whose measured times include the dynamic activation quantisation): "
                f"{quantise.fixed_s * 1e6:g} us per kernel (half the median FP8-over-bf16 excess of the "
                "linears of <= 16 tokens and <= 1,024 features, servesim.calibration.quantise_fit); "
                f"{quantise.per_row_s * 1e9:g} ns per input row (the grid value, 0-16 ns, whose refitted "
                "FP8 GEMM curve fits the fitted rows best); "
                "memory curve: the elementwise class's (hand-set)")
    fitted_families = ", ".join(usable_tables)
    provenance["calibration"] = (
        f"calibrated {date}: {fitted_families} fitted to {source}; classes not listed keep the "
        "hand-set defaults named in their provenance")
    final = fitted.model_copy(update={"provenance": provenance, "spec_only": False})
    return hardware_from_dict(final.model_dump(mode="json", exclude_none=True), "fitted"), report
