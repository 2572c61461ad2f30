"""What each measured kernel costs in the simulator's terms: FLOPs, bytes and curve positions.

The numbers come from the simulator's own cost functions (``roofline`` for GEMMs and
elementwise kernels, :mod:`servesim.cost.attention` for attention, the ring model for
all-reduce), evaluated on a perfect-efficiency profile, so a fitted curve means exactly what the
cost model will read from it. :func:`predict` prices the same rows with a real profile through
those same functions; that is the number ``validate`` compares with the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from servesim.calibration.moe_routing import routed_work
from servesim.cost.attention import (
    ATTENTION_IO_BYTES,
    AttentionShape,
    causal_pairs,
    decode_attention,
    prefill_attention,
)
from servesim.cost.batch import BatchShape
from servesim.cost.communication import ring_allreduce_s
from servesim.cost.quantise import (
    input_quantisation_s,
    input_quantisation_s_array,
    one_pass_output_bytes,
    one_pass_quantisation_s,
    one_pass_quantisation_s_array,
)
from servesim.cost.roofline import OpCost, memory_bound_s_many, padded_rows, padded_rows_array, roofline
from servesim.dtypes import DType, Precision
from servesim.hardware import HardwareProfile, OperatorEfficiency

OPERATOR_OF = {"gemm": "gemm", "gemm_fp8": "gemm_fp8", "gemm_fp4": "gemm_fp4",
               "attention_prefill": "attention_prefill",
               "attention_decode": "attention_decode", "attention_decode_fp8": "attention_decode_fp8",
               "memory": "elementwise", "moe": "moe", "moe_fp8": "moe_fp8", "moe_w4a16": "moe_w4a16",
               "moe_fp4": "moe_fp4"}
"""The profile's efficiency class each kernel family calibrates (all-reduce calibrates the link)."""

DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp32": 4.0, "nvfp4": DType.NVFP4.bytes_per_element()}
GEMM_FAMILIES = ("gemm", "gemm_fp8", "gemm_fp4")
"""Dense GEMM families: bf16, per-tensor FP8 and NVFP4 linears, each its own class."""
OUT_BYTES = 2.0
"""GEMM outputs are written in 16 bits, as the cost model assumes."""
MOE_FORMATS = {"moe": (DType.BF16, DType.BF16), "moe_fp8": (DType.FP8, DType.FP8),
               "moe_w4a16": (DType.BF16, DType.INT4), "moe_fp4": (DType.NVFP4, DType.NVFP4)}
"""(activation, expert weight) format of each fused-MoE family; :meth:`Efficiency.moe_for` reads
the activation's math format and the weight's."""
MOE_KERNELS = 2
"""The fused MoE call is priced as two kernels (its up and down expert GEMMs), as the cost model
does (``roofline(..., kernels=2)``): two fixed costs, each at half the bytes."""
MOE_GROUP_SIZE = 128


@dataclass(frozen=True)
class Work:
    """Per-row cost inputs of one family: ``time = fixed + max(flops / (peak * ec(x_compute)),
    bytes / (bandwidth * em(x_memory))) + side``."""

    flops: np.ndarray
    bytes: np.ndarray
    peak: np.ndarray
    x_compute: np.ndarray
    x_memory: np.ndarray
    tokens: np.ndarray
    time_s: np.ndarray
    side_s: np.ndarray | None = None
    """Serial kernels the measured time includes beyond the fitted class, priced by other classes
    (an FP8 GEMM's input quantisation, :mod:`servesim.cost.quantise`); None: none."""
    kernels: float = 1.0
    """Kernels per row that each pay the class's fixed cost (the memory position is already the
    bytes of one of them)."""
    outputs: np.ndarray | None = None
    """Where the class's outputs factor reads: a GEMM's output elements m x n, prefill
    attention's keys seen x heads (its query rows x heads at no context); None for other families."""
    depth: np.ndarray | None = None
    """Where the class's depth factor reads: a GEMM's reduction length k, prefill attention's head
    dimension."""

    @property
    def side(self) -> np.ndarray:
        return self.side_s if self.side_s is not None else np.zeros_like(self.time_s)

    def compute_eff(self, eff: OperatorEfficiency) -> np.ndarray:
        """Each row's compute efficiency under ``eff`` (its shape factors where both have them)."""
        return eff.compute_many(self.x_compute, self.outputs, self.depth)

    def subset(self, mask: np.ndarray) -> Work:
        return Work(self.flops[mask], self.bytes[mask], self.peak[mask], self.x_compute[mask],
                    self.x_memory[mask], self.tokens[mask], self.time_s[mask],
                    None if self.side_s is None else self.side_s[mask], self.kernels,
                    None if self.outputs is None else self.outputs[mask],
                    None if self.depth is None else self.depth[mask])

    def __len__(self) -> int:
        return int(self.time_s.size)


def attention_shape(heads: int, kv_heads: int, head_dim: int) -> AttentionShape:
    """The per-GPU attention layout of a standard (GQA) layer, as the cost model builds it."""
    cache = 2 * kv_heads * head_dim
    per_pair = 2 * heads * 2 * head_dim
    return AttentionShape(heads=heads, q_head_dim=head_dim, v_head_dim=head_dim,
                          cache_elements_per_token=cache, prefill_kv_elements_per_token=cache,
                          prefill_flops_per_pair=per_pair, decode_flops_per_key=per_pair,
                          decode_q_width=heads * head_dim, decode_o_width=heads * head_dim,
                          window=None)


def _row_ints(row: pd.Series, *names: str) -> tuple[int, ...]:
    return tuple(int(row[n]) for n in names)


def _attention_op(family: str, row: pd.Series, profile: HardwareProfile) -> OpCost:
    heads, kv_heads, head_dim, batch = _row_ints(row, "heads", "kv_heads", "head_dim", "batch")
    shape = attention_shape(heads, kv_heads, head_dim)
    peak = profile.peak(DType.BF16)
    kv_bytes = float(row["kv_bytes"]) if "kv_bytes" in row.index else 2.0
    if family == "attention_prefill":
        seq, context = _row_ints(row, "seq", "context")
        shape_batch = BatchShape.build([seq] * batch, [context] * batch)
        return prefill_attention(shape_batch, shape, profile, peak, kv_bytes, 1)
    shape_batch = BatchShape.decode(batch, int(row["context"]))
    return decode_attention(shape_batch, shape, profile, peak, kv_bytes, 1)


def _gemm_op(row: pd.Series, profile: HardwareProfile) -> OpCost:
    m, n, k = _row_ints(row, "m", "n", "k")
    width = DTYPE_BYTES[str(row["dtype"])]
    nbytes = k * n * width + m * k * width + m * n * OUT_BYTES
    math = DType(row["dtype"]).math_format
    eff = profile.efficiency.gemm_for(math)
    rows = padded_rows(m, eff.row_tile)
    op = roofline("gemm", 2.0 * m * k * n, nbytes, peak_flops=profile.peak(math),
                  bandwidth=profile.memory.bandwidth_Bps, eff=eff, compute_axis=rows, outputs=rows * n,
                  depth=k, useful=m / rows)
    if width >= 2.0:
        return op
    quantise, bandwidth = profile.efficiency.quantisation, profile.memory.bandwidth_Bps
    one_pass = _one_pass_bytes(str(row["dtype"]), profile)
    side = (one_pass_quantisation_s(m, k, one_pass, quantise, bandwidth) if one_pass is not None
            else input_quantisation_s(m, k, width, quantise, bandwidth))
    return replace(op, side_s=side)


def _one_pass_bytes(dtype: str, profile: HardwareProfile) -> float | None:
    """Bytes per value a measured linear of ``dtype`` (weights and activations) writes in a
    one-pass input quantisation, by the cost model's rule (:func:`servesim.cost.quantise.
    one_pass_output_bytes`: FP4 always; the tables' FP8 linears are per tensor), else None."""
    return one_pass_output_bytes(None, Precision.from_names(dtype, dtype), profile.compute_capability)


def _memory_op(row: pd.Series, profile: HardwareProfile) -> OpCost:
    return roofline("elementwise", 0.0, float(row["bytes"]), peak_flops=profile.peak(DType.BF16),
                    bandwidth=profile.memory.bandwidth_Bps, eff=profile.efficiency.elementwise,
                    compute_axis=1.0)


def operator_cost(family: str, row: pd.Series, profile: HardwareProfile) -> OpCost:
    """One measured kernel priced by the simulator's own functions."""
    if family in GEMM_FAMILIES:
        return _gemm_op(row, profile)
    if family == "memory":
        return _memory_op(row, profile)
    return _attention_op(family, row, profile)


def usable(family: str, table: pd.DataFrame, profile: HardwareProfile) -> pd.DataFrame:
    """Rows the profile can price (fp8 GEMMs need an fp8 peak), and for the memory family the
    layer's own elementwise kernels when measured: a bare copy sets a CPU profile's bandwidth
    peak, but norms and activations carry the per-kernel floor the elementwise class must fit."""
    if family == "memory" and "op" in table.columns and (table["op"] != "copy").any():
        return table[table["op"] != "copy"].reset_index(drop=True)
    if family in GEMM_FAMILIES:
        have = {d.value for d in profile.peak_flops} | {"fp16"}
        if DType.FP4.value in have:
            have |= {DType.NVFP4.value}
        return table[table["dtype"].astype(str).isin(have)].reset_index(drop=True)
    return table


def predict(family: str, table: pd.DataFrame, profile: HardwareProfile) -> np.ndarray:
    """Seconds the simulator predicts for each measured row."""
    if family == "allreduce":
        link = profile.interconnect
        return np.array([ring_allreduce_s(float(b), int(w), link)
                         for b, w in zip(table["bytes"], table["world"], strict=True)])
    eff = efficiency_of(profile, family)
    return fast_predict(work(family, table, profile, eff.key_tile, row_tile=eff.row_tile), eff,
                        profile.memory.bandwidth_Bps)


def efficiency_of(profile: HardwareProfile, family: str) -> OperatorEfficiency:
    """The profile's efficiency class that prices ``family`` (fp8 GEMMs fall back to the bf16
    curves when the profile has none of their own)."""
    if family == "gemm_fp8":
        return profile.efficiency.gemm_for(DType.FP8)
    if family == "gemm_fp4":
        return profile.efficiency.gemm_for(DType.FP4)
    if family == "attention_decode_fp8":  # the 16-bit class while the profile has none of its own
        return profile.efficiency.decode_for(1.0)
    if family in MOE_FORMATS:
        activation, weight = MOE_FORMATS[family]
        return profile.efficiency.moe_for(activation.math_format, weight)
    return getattr(profile.efficiency, OPERATOR_OF[family])


def work(family: str, table: pd.DataFrame, profile: HardwareProfile, key_tile: int = 1,
         shape_factors: bool = True, row_tile: int = 1) -> Work:
    """FLOPs, bytes, peak and curve positions of every row (not for all-reduce).

    Every family uses the cost model's formulas in vectorised form (attention without a sliding
    window, KV bytes per element from an optional ``kv_bytes`` column, 2 by default, decode keys
    rounded up to ``key_tile``, GEMM rows padded to ``row_tile`` on the compute side
    (:func:`~servesim.cost.roofline.padded_rows`); GEMMs and prefill attention carry their outputs
    and depth for the class's shape factors unless ``shape_factors`` is false, which fits and
    prices them by their tokens curve alone);
    ``tests/test_calibration_fit.py`` checks that they agree with :func:`operator_cost`, which
    calls :mod:`servesim.cost.attention` itself."""
    time_s = table["time_s"].to_numpy(float)
    n = len(table)
    if family in MOE_FORMATS:
        return moe_work(family, table, profile)
    if family in GEMM_FAMILIES:
        m, k, nn = (table[c].to_numpy(float) for c in ("m", "k", "n"))
        dtypes = table["dtype"].astype(str)
        width = dtypes.map(DTYPE_BYTES).to_numpy(float)
        nbytes = k * nn * width + m * k * width + m * nn * OUT_BYTES
        peak = np.array([profile.peak(DType(d)) for d in dtypes])
        # dynamic activation quantisation inside the timed linear (AIConfigurator's vLLM linears:
        # per tensor in two passes for FP8, one pass for FP4, servesim.cost.quantise); a table
        # with ``input_quantised`` false timed the low-precision GEMM alone (``calibrate bench``)
        quantised = width < 2.0
        if "input_quantised" in table.columns:
            quantised &= table["input_quantised"].astype(bool).to_numpy()
        quantise, bandwidth = profile.efficiency.quantisation, profile.memory.bandwidth_Bps
        low = [d for d in dtypes.unique() if DTYPE_BYTES[d] < 2.0]
        one_pass = dtypes.map({d: _one_pass_bytes(d, profile) for d in low})
        single = quantised & one_pass.notna().to_numpy()
        side = np.zeros(n)
        side[single] = one_pass_quantisation_s_array(m[single], k[single], one_pass.to_numpy(float)[single],
                                                     quantise, bandwidth)
        double = quantised & ~single
        side[double] = input_quantisation_s_array(m[double], k[double], width[double], quantise, bandwidth)
        rows = padded_rows_array(m, row_tile)  # what the compute side runs (bytes: the real rows)
        return Work(2.0 * rows * k * nn, nbytes, peak, rows, nbytes, m, time_s,
                    side_s=side if quantised.any() else None,
                    outputs=nn * rows if shape_factors else None, depth=k if shape_factors else None)
    peak = np.full(n, profile.peak(DType.BF16))
    if family == "memory":
        nbytes = table["bytes"].to_numpy(float)
        return Work(np.zeros(n), nbytes, peak, np.ones(n), nbytes, np.ones(n), time_s)
    batch = table["batch"].to_numpy(float)
    heads, kv_heads, head_dim = (table[c].to_numpy(float) for c in ("heads", "kv_heads", "head_dim"))
    kv_bytes = table["kv_bytes"].to_numpy(float) if "kv_bytes" in table.columns else np.full(n, 2.0)
    cache = 2.0 * kv_heads * head_dim  # K and V elements per token (attention_shape)
    per_pair = 4.0 * heads * head_dim  # score product and weighted sum, d_qk = d_v = head_dim
    qo = 2.0 * heads * head_dim * ATTENTION_IO_BYTES
    if family == "attention_prefill":
        seq, context = table["seq"].to_numpy(float), table["context"].to_numpy(float)
        pairs = causal_pairs(seq, context, None)
        flops = batch * pairs * per_pair
        nbytes = batch * (seq * qo + (context + seq) * cache * kv_bytes + seq * cache * kv_bytes)
        return Work(flops, nbytes, peak, np.sqrt(2.0 * pairs), nbytes, batch * seq, time_s,
                    outputs=batch * (seq + context) * heads if shape_factors else None,
                    depth=head_dim if shape_factors else None)
    seen = table["context"].to_numpy(float) + 1.0
    if key_tile > 1:
        seen = np.ceil(seen / key_tile) * key_tile
    keys = batch * seen
    flops = keys * per_pair
    nbytes = (keys + batch) * cache * kv_bytes + batch * qo
    return Work(flops, nbytes, peak, batch, nbytes, batch, time_s)


def fast_predict(w: Work, eff: OperatorEfficiency, bandwidth: float) -> np.ndarray:
    """The roofline of :class:`Work` rows, vectorised; the same arithmetic as
    :func:`servesim.cost.roofline.roofline` (what the fit optimises and validate reports)."""
    x_memory = w.x_memory if eff.memory.axis == "bytes" else w.tokens
    with np.errstate(divide="ignore", invalid="ignore"):
        compute = np.where(w.flops > 0, w.flops / (w.peak * w.compute_eff(eff)), 0.0)
        memory = np.where(w.bytes > 0, w.bytes / (bandwidth * eff.memory(x_memory)), 0.0)
    return eff.fixed_s * w.kernels + np.maximum(compute, memory) + w.side


def ape(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Absolute percentage error per row (0.1 = 10%)."""
    return np.abs(np.asarray(predicted) - measured) / measured


def moe_experts(family: str, table: pd.DataFrame) -> dict[str, np.ndarray]:
    """FLOPs, bytes and GEMM rows per expert hit of the routed experts of one fused MoE call per
    row (``tokens`` entering, ``hidden``, ``inter`` (the expert's intermediate before MoE-TP
    sharding), ``topk``, ``experts``, ``tp``), by the formulas of
    :meth:`servesim.cost.step_cost.CostModel._routed_experts`: gated experts, each expert hit read
    once; with an optional ``ep`` column, rank 0 of an expert-parallel layout as
    :class:`servesim.cost.expert_parallel.ExpertLayer` prices it. The experts hit and the rank's
    assignments follow the row's ``routing`` column (:mod:`servesim.calibration.moe_routing`:
    AIConfigurator's balanced rows hit ``min(E, T k)`` experts), or without one the cost model's
    uniform routing (``E (1 - (1 - k/E)^T)`` experts hit, ``1/ep`` of them and of the
    assignments on the rank)."""
    activation, weight = MOE_FORMATS[family]
    tokens, h, inter, top_k, experts, tp = (table[c].to_numpy(float) for c in
                                            ("tokens", "hidden", "inter", "topk", "experts", "tp"))
    ep = table["ep"].to_numpy(float) if "ep" in table.columns else np.ones(len(table))
    routing = table["routing"].to_numpy(str) if "routing" in table.columns else None
    act = activation.bytes_per_element(MOE_GROUP_SIZE)
    local = np.ceil(inter / tp)
    up = 2.0 * local
    hit, assignments = routed_work(tokens, experts, top_k, ep, routing)
    weights = h * (up + local)
    io = assignments * ((h + local) * act + (up + h) * OUT_BYTES)
    nbytes = hit * weights * weight.bytes_per_element(MOE_GROUP_SIZE) + io
    return {"flops": 2.0 * assignments * weights, "bytes": nbytes, "rows_per_expert": assignments / hit,
            "assignments": assignments, "all_assignments": tokens * top_k, "local": local,
            "tokens": tokens, "hidden": h,
            "act": np.full(len(table), act)}


def moe_elementwise_s(parts: dict[str, np.ndarray], profile: HardwareProfile) -> np.ndarray:
    """The fused call's two memory-bound kernels the cost model prices with the elementwise class:
    the gated activation of the rank's assignments (read gate and up, write their product) and the
    weighted sum over each token's experts (read one row per assignment, write one per token), over
    every token's assignments, as the cost model charges a TP group's combine with experts split
    inside it (the other ranks' rows hold zeros but are summed all the same)."""
    elements = 3.0 * parts["assignments"] * parts["local"] \
        + (parts["all_assignments"] + parts["tokens"]) * parts["hidden"]
    return memory_bound_s_many(elements * OUT_BYTES, 2, profile.efficiency.elementwise,
                               profile.memory.bandwidth_Bps, parts["tokens"])


def moe_work(family: str, table: pd.DataFrame, profile: HardwareProfile) -> Work:
    """One measured fused MoE call: the experts as the fitted class sees them (two kernels), with
    the activation and combine (elementwise class) and, for 8-bit math, the input and intermediate
    quantisation (:mod:`servesim.cost.quantise`) as serial side costs."""
    parts = moe_experts(family, table)
    side = moe_elementwise_s(parts, profile)
    act = parts["act"]
    activation, _ = MOE_FORMATS[family]
    if activation.bits < 16:
        bandwidth, quant = profile.memory.bandwidth_Bps, profile.efficiency.quantisation
        for rows, width in ((parts["tokens"], parts["hidden"]), (parts["assignments"], parts["local"])):
            side = side + input_quantisation_s_array(rows, width, act, quant, bandwidth, per_row=False)
    peak = np.full(len(table), profile.peak(activation.math_format))
    return Work(parts["flops"], parts["bytes"], peak, parts["rows_per_expert"], parts["bytes"] / MOE_KERNELS,
                parts["tokens"], table["time_s"].to_numpy(float), side_s=side, kernels=float(MOE_KERNELS))
