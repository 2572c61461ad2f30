"""Dynamic activation quantisation in front of a low-precision GEMM.

A W8A8 linear layer whose activation scale is computed at run time (vLLM's per-tensor FP8
``Fp8LinearMethod`` with dynamic scales, its ``scaled_fp8_quant``) quantises its 16-bit input on
every call, in two memory-bound kernels before the GEMM: one reads the input to find its absolute
maximum, the other reads it again, scales it and writes it in the 8-bit format. Nothing overlaps
them with the GEMM, so their time adds to it.

Why it matters: NVIDIA AIConfigurator times vLLM's FP8 linear with "the activation quantisation
inside the timed forward" (``../shared/data/kernels/aiconfigurator/README.md``). On its H100 table
an FP8 linear with 512 output features and 4,096+ tokens takes 2.9x as long as its bf16 twin (the
quantisation reads the whole (tokens x input) matrix twice while the GEMM itself is small), and
0.65x with 65,536 output features (the GEMM dominates). A GEMM curve alone cannot be both, so
without this term the fitted FP8 curve was 40% fast at narrow outputs and 18% slow at wide ones.

The kernels are priced as the profile's elementwise class prices memory-bound kernels (its
memory curve at one kernel's bytes, and its fixed cost per launch), plus a cost per input row
(``per_row_s`` of the quantise class): the per-token kernel gives each row its own thread block,
and the blocks run in waves of a few per SM, so a tall input costs time in proportion to its rows
whatever its width. AIConfigurator's tables show it plainly: an FP8 linear of 32,768 tokens with
512 inputs and 512 outputs takes 257 us on H200 (its bf16 twin 31 us, its bytes 84 MB, about
20 us at HBM speed), 132 us at 16,384 tokens and 68 us at 8,192: about 8 ns per row. Left out,
the fitted FP8 GEMM curve absorbed it and priced the wide GEMMs of real models (4,096+ inputs and
outputs, 256+ tokens) 20% slow on H200. The fused MoE's quantisation pays no cost per row: its
measured calls show none (with it, B200's held-out FP8 MoE error rose from 11.6% to 15.5%, H100's
and H200's did not move). The same rule serves the cost
model (:meth:`servesim.cost.step_cost.CostModel._gemm`) and for the calibration that fits the FP8
GEMM curve net of it (:func:`servesim.calibration.work.work`).
"""

from __future__ import annotations

import numpy as np

from servesim.cost.roofline import memory_bound_s_many
from servesim.hardware import OperatorEfficiency

INPUT_BYTES = 2.0
"""The unquantised input is 16-bit (the residual stream, an activation's output)."""

KERNELS = 2
"""Absolute-maximum reduction, then scale-and-cast."""


def bytes_per_element(act_bytes: float) -> float:
    """HBM traffic per input element: read it twice (16-bit), write it once in ``act_bytes``."""
    return 2 * INPUT_BYTES + act_bytes


def input_quantisation_s(rows: float, k: float, act_bytes: float, elementwise: OperatorEfficiency,
                         bandwidth: float, per_row: bool = True) -> float:
    """Seconds to quantise a (rows x k) input to ``act_bytes`` per value: ``KERNELS`` launches
    plus their bytes at the elementwise memory curve, read at one kernel's bytes (or at the rows
    when the curve's axis is tokens, as for every elementwise kernel), plus ``per_row_s`` per row
    (``per_row`` false: none, for the fused MoE's quantisation, see the module docstring)."""
    nbytes = rows * k * bytes_per_element(act_bytes)
    curve = elementwise.memory
    efficiency = curve.at(nbytes / KERNELS if curve.axis == "bytes" else rows)
    rows_s = rows * elementwise.per_row_s if per_row else 0.0
    return KERNELS * elementwise.fixed_s + nbytes / (bandwidth * efficiency) + rows_s


def input_quantisation_s_array(rows: np.ndarray, k: np.ndarray, act_bytes: np.ndarray,
                               elementwise: OperatorEfficiency, bandwidth: float,
                               per_row: bool = True) -> np.ndarray:
    """:func:`input_quantisation_s` over arrays (the calibration's vectorised rows)."""
    nbytes = rows * k * (2 * INPUT_BYTES + act_bytes)
    seconds = memory_bound_s_many(nbytes, KERNELS, elementwise, bandwidth, rows)
    return (seconds + rows * elementwise.per_row_s) if per_row else seconds
