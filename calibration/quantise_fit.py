"""Fit the FP8 GEMM curve together with the input quantisation its measured times include.

AIConfigurator's FP8 linears are timed with their dynamic activation quantisation inside
(:mod:`servesim.cost.quantise`): two memory-bound kernels whose time depends on the input
(tokens x input features) only, in front of a GEMM whose time depends on all three sizes. The
quantisation is priced by the profile's ``efficiency.quantise`` class, identified apart from the
GEMM where the data separates them: its fixed cost per kernel from the tiny linears, where both
formats are launch-bound and FP8 is slower only by the two kernels (on H100 about 2 us in all:
bf16 3.3 us, FP8 5.3 us at 1-16 tokens and 512-1,024 features, replayed in a CUDA graph; half
the hand-set elementwise launch cost); its bandwidth is the elementwise class's memory curve (the
hand-set curve every memory-bound kernel uses: 60% of HBM at 100 MB, where the largest narrow FP8
linears on H100 imply about 70%). Fitting the bandwidth share too was tried: the best share on a
grid sat at the grid's lowest value (40%), absorbing what the GEMM's one tokens axis misses (its
dependence on the output width at 128-1,024 tokens), for 0.4 points of held-out median error, so
it is not fitted. What the grid was missing is a cost per input row (the per-token kernel's waves
of thread blocks, :mod:`servesim.cost.quantise`): it is fitted, on a grid, by the error of the
FP8 GEMM curve refitted under each value. On the H200 table it takes the held-out median error
from 19.6% to about 15% and the wide GEMMs' median over-prediction from 1.20x to 1.11x (5 ns fitted).
"""

from __future__ import annotations

import pandas as pd

from servesim.calibration.fit import FitResult, fit_operator, log_error
from servesim.calibration.work import fast_predict, work
from servesim.cost.quantise import KERNELS
from servesim.hardware import HardwareProfile, OperatorEfficiency

PER_ROW_GRID_S = tuple(i * 2e-9 for i in range(9))
"""Costs per input row tried for the quantisation (0-16 ns; the H100 and H200 tables give about
7 ns: see :mod:`servesim.cost.quantise`)."""
PER_ROW_STEP_S = 1e-9
"""The grid's best is refined by one step this size either way."""

TINY = {"m": 16, "n": 1024, "k": 1024}
"""Linears this small are launch-bound in both formats: their FP8 excess is the two kernels'
fixed cost."""


def with_quantise(profile: HardwareProfile, quantise: OperatorEfficiency) -> HardwareProfile:
    efficiency = profile.efficiency.model_copy(update={"quantise": quantise})
    return profile.model_copy(update={"efficiency": efficiency})


def fixed_per_kernel_s(fp8: pd.DataFrame, bf16: pd.DataFrame) -> float:
    """Half the median excess of an FP8 linear over its bf16 twin (same m, n, k) among the tiny
    ones, where both GEMMs are launch-bound and the excess is the two quantisation kernels."""
    keys = ["m", "n", "k"]

    def tiny(table: pd.DataFrame) -> pd.DataFrame:
        small = (table["m"] <= TINY["m"]) & (table["n"] <= TINY["n"]) & (table["k"] <= TINY["k"])
        return table.loc[small, [*keys, "time_s"]]

    pairs = tiny(fp8).merge(tiny(bf16), on=keys, suffixes=("_fp8", "_bf16"))
    if pairs.empty:
        return 0.0
    excess = (pairs["time_s_fp8"] - pairs["time_s_bf16"]).median()
    return max(float(excess), 0.0) / KERNELS


def fit_gemm_fp8(rows: pd.DataFrame, bf16: pd.DataFrame | None, profile: HardwareProfile,
                 prior: OperatorEfficiency, memory_tail: bool, row_tile: int = 1
                 ) -> tuple[FitResult, OperatorEfficiency]:
    """(the FP8 GEMM fit, the quantisation class): the elementwise class's memory curve with the
    fixed cost per kernel measured on the tiny linears of ``rows`` and ``bf16`` (the bf16 GEMM
    table) and the cost per row that fits ``rows`` best (:data:`PER_ROW_GRID_S`, then refined to
    :data:`PER_ROW_STEP_S`), and the FP8 GEMM curve fitted to ``rows`` net of it."""
    fixed_s = fixed_per_kernel_s(rows, bf16) if bf16 is not None else profile.efficiency.quantisation.fixed_s
    base = profile.efficiency.elementwise.model_copy(update={"fixed_s": float(f"{fixed_s:.3g}")})
    bandwidth = profile.memory.bandwidth_Bps
    tried: dict[float, tuple[float, FitResult, OperatorEfficiency]] = {}

    def attempt(per_row_s: float) -> float:
        per_row_s = round(max(per_row_s, 0.0), 12)
        if per_row_s not in tried:
            quantise = base.model_copy(update={"per_row_s": per_row_s})
            w = work("gemm_fp8", rows, with_quantise(profile, quantise), row_tile=row_tile)
            result = fit_operator(w, bandwidth, prior, memory_tail)
            tried[per_row_s] = (log_error(fast_predict(w, result.efficiency, bandwidth), w.time_s),
                                result, quantise)
        return tried[per_row_s][0]

    best = min(PER_ROW_GRID_S, key=attempt)
    for offset in (-PER_ROW_STEP_S, PER_ROW_STEP_S):
        attempt(best + offset)
    _, result, quantise = min(tried.values(), key=lambda entry: entry[0])
    return result, quantise
