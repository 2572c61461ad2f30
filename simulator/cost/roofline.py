"""The roofline rule every operator is charged by.

``time = fixed + max(flops / (peak * compute_eff), bytes / (bandwidth * memory_eff))``

``fixed`` is the kernel's launch cost and minimum duration (per launch), the efficiencies come from
the hardware profile's curves evaluated at the operator's shape. An operator that repeats in every
layer is costed once per layer and multiplied, so efficiencies see the per-kernel shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from servesim.hardware import OperatorEfficiency


@dataclass(frozen=True, slots=True)
class OpCost:
    """One operator class summed over the step (all layers that run it)."""

    name: str
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    fixed_s: float
    side_s: float = 0.0
    """Serial memory-bound kernels launched with this operator and priced apart (an FP8 GEMM's
    input quantisation, :mod:`servesim.cost.quantise`): they add to its time."""

    @property
    def roofline_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def time_s(self) -> float:
        return self.roofline_s + self.fixed_s + self.side_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


UNPADDED_ROWS = 64
"""GEMMs of at most this many rows are priced on their rows as given. The dispatchers that pad
run 64-row tiles there too, but a 64-row FP8 GEMM does 128 FLOPs per weight byte against the
~590 of H100's ridge: its weights bound it, the compute side is not what its time measures, and
padding those rows to 64 took the H100 FP8 GEMMs' held-out median error from 10.1% to 10.9%."""


def padded_rows(rows: float, tile: int) -> float:
    """The rows a GEMM kernel whose largest row granule is ``tile`` computes for ``rows`` rows (1:
    no padding): a whole number of granules, the granule being the next power of two of the rows,
    at most ``tile``; at most :data:`UNPADDED_ROWS` rows are left as they are.

    Why: CUTLASS dispatchers such as vLLM's FP8 ``scaled_mm`` pick a kernel configuration by the
    next power of two of M and run its whole tiles (``csrc/quantization/cutlass_w8a8/c3x``,
    ``scaled_mm_sm90_fp8_dispatch.cuh``: 64-row tiles in clusters of two up to 128 rows, 128-row
    tiles in clusters of two above, so 256 rows), so a GEMM of 129 rows takes as long as one of
    256 (AIConfigurator's H100 FP8 GEMMs: 1.3-1.9x longer than at 128 rows). cuBLAS's heuristics
    show no such steps. The padding rows are computed, never read or written, so only the compute
    side pays them (:attr:`~servesim.hardware.OperatorEfficiency.row_tile`)."""
    if tile <= 1 or rows <= UNPADDED_ROWS:
        return rows
    whole = math.ceil(rows)
    granule = min(tile, 1 << (whole - 1).bit_length())
    return float(-(-whole // granule) * granule)


def padded_rows_array(rows: np.ndarray, tile: int) -> np.ndarray:
    """:func:`padded_rows` of every element (the calibration's vectorised rows)."""
    rows = np.asarray(rows, dtype=float)
    if tile <= 1:
        return rows
    whole = np.ceil(rows)
    granule = np.minimum(float(tile), np.exp2(np.ceil(np.log2(np.maximum(whole, 1.0)))))
    return np.where(rows <= UNPADDED_ROWS, rows, np.ceil(whole / granule) * granule)


def memory_efficiency(eff: OperatorEfficiency, nbytes: float, tokens: float) -> float:
    """The memory curve read on its own axis: the kernel's bytes, or its tokens."""
    return eff.memory.at(nbytes if eff.memory.axis == "bytes" else tokens)


def roofline(name: str, flops: float, nbytes: float, *, peak_flops: float, bandwidth: float,
             eff: OperatorEfficiency, compute_axis: float, repeat: float = 1.0,
             kernels: float = 1.0, outputs: float | None = None, depth: float | None = None,
             useful: float = 1.0) -> OpCost:
    """Cost of ``repeat`` identical kernels each doing ``flops`` and moving ``nbytes``.

    ``compute_axis`` is the kernel's position on the compute curve's axis (tokens); a GEMM also
    gives its ``outputs`` (m x n) and ``depth`` (k), which the class's shape factors read
    (:meth:`~servesim.hardware.OperatorEfficiency.compute_at`). The memory curve is read at one
    kernel's byte count (``nbytes / kernels`` when several kernels are lumped into one record).
    ``useful``: the share of the computed work that ``flops`` counts (a GEMM's rows over the rows
    its kernel pads them to, :func:`padded_rows`, whose position ``compute_axis`` and ``outputs``
    then give); the compute efficiency is scaled by it, so the FLOPs stay the useful ones.
    """
    if flops <= 0 and nbytes <= 0:
        return OpCost(name, 0.0, 0.0, 0.0, 0.0, 0.0)
    compute_eff = eff.compute_at(compute_axis, outputs, depth) * useful if flops > 0 else 1.0
    return roofline_at(name, flops, nbytes, peak_flops=peak_flops, bandwidth=bandwidth,
                       compute_eff=compute_eff,
                       memory_eff=memory_efficiency(eff, nbytes / kernels, compute_axis),
                       fixed_s=eff.fixed_s, repeat=repeat, kernels=kernels)


def roofline_at(name: str, flops: float, nbytes: float, *, peak_flops: float, bandwidth: float,
                compute_eff: float, memory_eff: float, fixed_s: float, repeat: float = 1.0,
                kernels: float = 1.0, side_s: float = 0.0) -> OpCost:
    """:func:`roofline` once the profile's curves have been read at the kernel (``compute_eff``:
    the compute curve with its shape factors; ``memory_eff``: the memory curve). The one place
    the rule's arithmetic lives: the cost model's GEMMs, which remember curve values between
    calls, come here too. ``side_s``: serial kernels priced apart (:attr:`OpCost.side_s`)."""
    if flops <= 0 and nbytes <= 0:
        return OpCost(name, 0.0, 0.0, 0.0, 0.0, 0.0)
    compute_s = flops / (peak_flops * compute_eff) if flops > 0 else 0.0
    memory_s = nbytes / (bandwidth * memory_eff) if nbytes > 0 else 0.0
    return OpCost(name, flops * repeat, nbytes * repeat, compute_s * repeat, memory_s * repeat,
                  fixed_s * kernels * repeat, side_s)


def memory_bound_s_many(nbytes: np.ndarray, kernels: float, eff: OperatorEfficiency, bandwidth: float,
                        tokens: np.ndarray) -> np.ndarray:
    """Seconds of ``kernels`` memory-bound kernels moving ``nbytes`` in all, per element of the
    arrays: :func:`roofline`'s memory side and fixed cost with no FLOPs (the memory curve read at
    one kernel's bytes, or at ``tokens`` when its axis is tokens), for the calibration's
    vectorised rows."""
    x = nbytes / kernels if eff.memory.axis == "bytes" else tokens
    return kernels * eff.fixed_s + nbytes / (bandwidth * np.asarray(eff.memory(x), dtype=float))
