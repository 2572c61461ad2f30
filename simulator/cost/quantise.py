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

**Block-scaled FP8 checkpoints** (DeepSeek-V3/R1, Kimi-K2, MiniMax-M2: ``weight_block_size: [128,
128]``, :attr:`servesim.model_spec.ModelSpec.fp8_block_size`) quantise a linear layer's input
per 1 x 128 group, in one kernel (vLLM's and SGLang's ``per_token_group_quant_fp8``; TensorRT-LLM's
``fp8_quantize_1x128``): it reads the 16-bit input once and writes the 8-bit values and one FP32
scale per group, with no absolute-maximum pass over the whole tensor and no per-row term. On GPUs
whose tensor cores apply the block scales themselves (Blackwell, compute capability 10 and up:
``tcgen05`` block-scaled MMA) that is the whole extra cost, :func:`one_pass_quantisation_s`.
AIConfigurator's B200 tables of DeepSeek-V3's MLA attention module (vLLM 0.24, the whole
``DeepseekV2MLAAttention.forward`` with ``fp8_block`` GEMMs; ``../shared/data/kernels/
aiconfigurator/b200_sxm/mla``) show it: priced per tensor the module came out 1.29-1.53x the
measured time above 1,024 tokens (the per-tensor quantisation of its narrow projections' tall
inputs costs more than the GEMMs), while its bf16 twin sat at 0.97-1.14x; priced per group, 0.87-
1.02x. On Hopper the block-scaled kernels (DeepGEMM, CUTLASS blockwise) promote each 128-wide
K slice's partial sums on CUDA cores inside the main loop, a cost the one-pass price leaves out:
the H200 tables of the same module sit at the same ratio to the per-tensor price as the bf16 ones
do to theirs (0.78-0.81 against 0.67-0.82 above 1,024 tokens) and 25% under it priced per group,
so before compute capability 10 a block-scaled checkpoint keeps the per-tensor price (an
effective stand-in for the main loop's extra work, not a model of it).

**FP4 activations** (W4A4: NVFP4, MXFP4) are quantised the same way, in one pass that computes each
16- (32-) value block's scale as it casts (:func:`one_pass_output_bytes`); the FP4 GEMM curve
(``efficiency.gemm_fp4``, B200's from AIConfigurator's NVFP4 linears) is fitted net of it. The
fused MoE's FP8 and FP4 quantisation keep their own two-kernel price, with which their classes
were fitted.
"""

from __future__ import annotations

import numpy as np

from servesim.cost.roofline import memory_bound_s_many
from servesim.dtypes import DType, Precision
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


FP8_SCALE_BYTES = 4.0
"""A block-scaled FP8 activation's scale per group: one FP32 value."""


def one_pass_output_bytes(block_size: int | None, precision: Precision,
                          capability: str | None) -> float | None:
    """Bytes per input value that a one-pass quantisation writes in front of this deployment's
    dense GEMMs (the value and its share of the group scales), or None for the per-tensor
    two-pass price (:func:`input_quantisation_s`):

    - FP4 activations (NVFP4, MXFP4; W4A4 runs only on Blackwell-class GPUs): always one pass, the
      format's own block scale computed as each 16 (32) values are cast (vLLM's
      ``scaled_fp4_quant``, TensorRT-LLM's ``fp4_quantize``): ``precision.act_bytes``;
    - FP8 weights and activations of a block-scaled checkpoint (``block_size``) on a GPU of
      compute capability 10 or later: one FP8 byte and an FP32 scale per 1 x ``block_size`` group
      (see the module docstring; before capability 10, or on a profile that does not give it, the
      per-tensor price stands in)."""
    if precision.activation.is_fp4:
        return precision.act_bytes
    if block_size is None or precision.weight is not DType.FP8 or precision.activation is not DType.FP8:
        return None
    if capability is None or int(capability.split(".")[0]) < 10:
        return None
    return 1.0 + FP8_SCALE_BYTES / block_size


def one_pass_quantisation_s(rows: float, k: float, out_bytes: float, quantise: OperatorEfficiency,
                            bandwidth: float) -> float:
    """Seconds to quantise a (rows x k) 16-bit input in one kernel: read it once and write
    ``out_bytes`` per value (scales included), at the quantisation class's memory curve (at the
    kernel's bytes, or its rows when the curve's axis is tokens) plus one launch's fixed cost; no
    cost per row (each thread block takes many groups)."""
    nbytes = rows * k * (INPUT_BYTES + out_bytes)
    curve = quantise.memory
    efficiency = curve.at(nbytes if curve.axis == "bytes" else rows)
    return quantise.fixed_s + nbytes / (bandwidth * efficiency)


def one_pass_quantisation_s_array(rows: np.ndarray, k: np.ndarray, out_bytes: np.ndarray,
                                  quantise: OperatorEfficiency, bandwidth: float) -> np.ndarray:
    """:func:`one_pass_quantisation_s` over arrays (the calibration's vectorised rows)."""
    return memory_bound_s_many(rows * k * (INPUT_BYTES + out_bytes), 1, quantise, bandwidth, rows)
