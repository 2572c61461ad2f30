"""Hardware profiles: spec-sheet peaks plus calibrated efficiency curves, with provenance.

A profile (``hardware_profiles/<name>.yaml``) says what one GPU can do at best (peak FLOP/s per
math format, HBM size and bandwidth, links to its peers and to the host) and how close real
kernels get to that best (:class:`Efficiency`, per operator class). The cost model charges every
operator ``fixed_s + max(flops / (peak * compute_eff), bytes / (bandwidth * memory_eff))``, so the
profile holds exactly the numbers that formula needs.

Efficiencies are curves, not constants: a GEMM with 16 tokens cannot fill an H100's tensor cores
and a decode-attention kernel reading 1 MB cannot saturate HBM. A curve is a table of points on
one *axis* (``tokens`` for GEMMs and prefill attention, ``bytes`` for decode attention and
elementwise kernels) interpolated linearly in log(axis) and held flat beyond its ends. The
shipped defaults are hand-set from public measurements; ``servesim calibrate`` replaces them with
fitted tables and records the fit error in ``provenance``. Reading and writing the YAML files
is :mod:`servesim.hardware_io`'s job.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from servesim.dtypes import DType
from servesim.errors import ServesimError
from servesim.inputs.schema import FrozenModel

if TYPE_CHECKING:
    import numpy as np

Axis = Literal["tokens", "bytes", "outputs", "depth"]
"""What a curve is read at: a kernel's tokens (rows) or bytes, or a GEMM's output elements
(``outputs``, m x n on one GPU) or reduction length (``depth``, k)."""


SMALL_RUN = 24
"""Below this many values, :meth:`Curve.at_many` calls :meth:`Curve.at` per value (NumPy's
per-call overhead costs more than the loop)."""


class Curve(FrozenModel):
    """An efficiency in (0, 1] as a function of one shape axis (log-linear, clamped ends).

    Time is work over efficiency, so a curve that rose faster than its axis would make a bigger
    kernel finish sooner. Every segment must satisfy ``d ln(eff) / d ln(x) <= 1`` (checked at
    its lower end, where it is largest); fitted tables are held to the same rule.
    """

    axis: Axis = "tokens"
    x: tuple[float, ...] = (1.0,)
    y: tuple[float, ...] = (1.0,)

    @model_validator(mode="after")
    def _check(self) -> Curve:
        if len(self.x) != len(self.y) or not self.x:
            raise ValueError(f"x and y need the same non-zero length, got {len(self.x)} and {len(self.y)}")
        if any(v <= 0 for v in self.x) or any(b <= a for a, b in zip(self.x, self.x[1:], strict=False)):
            raise ValueError("x must be positive and strictly increasing (each knot once)")
        if any(not 0 < v <= 1 for v in self.y):
            raise ValueError("y must be efficiencies in (0, 1]")
        for i in range(len(self.x) - 1):
            slope = (self.y[i + 1] - self.y[i]) / math.log(self.x[i + 1] / self.x[i])
            if slope > self.y[i] * (1 + 1e-9):
                raise ValueError(
                    f"between x={self.x[i]:g} and x={self.x[i + 1]:g} the efficiency rises faster "
                    "than the axis, so more work would take less time; raise y at the lower point")
        return self

    @classmethod
    def constant(cls, value: float, axis: Axis = "tokens") -> Curve:
        return cls(axis=axis, x=(1.0,), y=(value,))

    @cached_property
    def _log_x(self) -> np.ndarray:
        import numpy as np

        return np.log(np.asarray(self.x, dtype=float))

    @cached_property
    def _y(self) -> np.ndarray:
        import numpy as np

        return np.asarray(self.y, dtype=float)

    @cached_property
    def _log_x_list(self) -> list[float]:
        return [math.log(v) for v in self.x]

    def at(self, value: float) -> float:
        """Efficiency at one scalar ``value`` (pure Python: the cost model calls this ~20 times
        per step, where NumPy's per-call overhead would dominate)."""
        xs, ys = self._log_x_list, self.y
        if len(xs) == 1:
            return ys[0]
        lv = math.log(value) if value > 0 else -math.inf
        if lv <= xs[0]:
            return ys[0]
        if lv >= xs[-1]:
            return ys[-1]
        i = bisect_right(xs, lv)
        frac = (lv - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + frac * (ys[i] - ys[i - 1])

    @cached_property
    def _log_x_array(self) -> np.ndarray:
        import numpy as np

        return np.array(self._log_x_list)

    def at_many(self, values: np.ndarray) -> np.ndarray:
        """:meth:`at` of every element, bit for bit (a fast-forwarded run's steps): the logarithm
        is ``math.log`` (NumPy's vectorised ``log`` may differ from it in the last bit) and the
        interpolation is :meth:`at`'s arithmetic, element-wise in the same order."""
        import numpy as np

        ys = self._y
        if ys.size == 1:
            return np.full(values.shape, self.y[0])
        listed = values.tolist()
        if len(listed) <= SMALL_RUN:
            at = self.at
            return np.array([at(v) for v in listed], dtype=np.float64)
        try:
            logged = np.fromiter(map(math.log, listed), dtype=np.float64, count=len(listed))
        except ValueError:  # a value <= 0: at() reads it as log 0 = -inf
            flat = np.asarray(values, dtype=np.float64)
            logged = np.full(flat.shape, -math.inf)
            positive = flat > 0
            logged[positive] = np.fromiter(map(math.log, flat[positive].tolist()), dtype=np.float64,
                                           count=int(np.count_nonzero(positive)))
        xs = self._log_x_array
        i = np.clip(np.searchsorted(xs, logged, side="right"), 1, xs.size - 1)
        low_x, low_y = xs[i - 1], ys[i - 1]
        frac = (logged - low_x) / (xs[i] - low_x)
        inside = low_y + frac * (ys[i] - low_y)
        return np.where(logged <= xs[0], ys[0], np.where(logged >= xs[-1], ys[-1], inside))

    def __call__(self, value: float | np.ndarray) -> float | np.ndarray:
        """Efficiency at ``value`` on the curve's axis (scalar or array)."""
        import numpy as np

        if np.ndim(value) == 0:
            return self.at(float(value))
        if len(self.x) == 1:
            return np.full(np.shape(value), self.y[0])
        logged = np.log(np.maximum(value, 1e-30))
        return np.interp(logged, self._log_x, self._y)


CURVE_AXES: dict[str | None, Axis] = {"compute": "tokens", "memory": "bytes", "outputs": "outputs",
                                      "depth": "depth"}
"""The axis a bare number written for each curve of an efficiency class is read on."""


def _coerce_curve(value: Any, axis: Axis) -> Any:
    """Let a YAML author write a bare number for a constant efficiency."""
    if isinstance(value, (int, float)):
        return {"axis": axis, "x": [1.0], "y": [float(value)]}
    return value


class OperatorEfficiency(FrozenModel):
    """How close one class of kernels gets to the roofline, and its fixed cost per launch.

    All three are required in a profile: a missing efficiency must not silently mean a perfect one.
    """

    compute: Curve
    memory: Curve
    fixed_s: float = Field(ge=0.0, description="per-kernel launch + minimum duration")
    key_tile: int = Field(
        1, ge=1, le=1 << 20, description="decode attention: each sequence's keys are processed in "
        "tiles of this many (the kernel's KV block, 16-256 in FlashAttention and FlashInfer), so its "
        "work is rounded up to a whole tile")
    row_tile: int = Field(
        1, ge=1, le=1 << 12, description="GEMM classes: the largest row (M) granule the kernels pad to: "
        "above 64 rows they are computed as whole granules of their next power of two, at most this "
        "many, on the compute side only (servesim.cost.roofline.padded_rows: CUTLASS dispatch by "
        "next_pow2(M), set from the dispatcher's tile shapes, not fitted); 1: no padding (cuBLAS)")
    per_row_s: float = Field(
        0.0, ge=0.0, allow_inf_nan=False,
        description="seconds per input row (token) of a kernel that gives each row its own thread "
        "block, run in waves: vLLM's dynamic activation quantisation; only the quantise class reads it")
    outputs: Curve | None = Field(
        None, description="GEMM and prefill-attention classes: the compute efficiency's factor (<= 1) "
        "by the kernel's grid on one GPU (a GEMM's m x n output elements; prefill attention's keys "
        "seen times heads); absent, 1. Few output tiles leave SMs idle")
    depth: Curve | None = Field(
        None, description="GEMM and prefill-attention classes: the compute efficiency's factor (<= 1) "
        "by the reduction length (a GEMM's k; attention's query-key head dimension); absent, 1. A "
        "short K loop pays each tile's prologue and epilogue over less work")

    @classmethod
    def perfect(cls) -> OperatorEfficiency:
        return cls(compute=Curve.constant(1.0), memory=Curve.constant(1.0, "bytes"), fixed_s=0.0)

    @field_validator("compute", "memory", "outputs", "depth", mode="before")
    @classmethod
    def _constant_curves(cls, value: Any, info: ValidationInfo) -> Any:
        return _coerce_curve(value, CURVE_AXES[info.field_name])

    def compute_at(self, tokens: float, outputs: float | None = None, depth: float | None = None) -> float:
        """Compute efficiency of one kernel: the tokens curve, times the outputs and depth factors
        where the class has them and the caller knows the GEMM's m x n and k (a GEMM of unknown
        shape, such as a fused MoE priced by the GEMM curves, takes factor 1: the best shapes)."""
        return self._times_factors(self.compute.at(tokens), outputs, depth)

    def shape_factor(self, outputs: float, depth: float) -> float:
        """The outputs and depth factors alone (1.0 where the class has neither): what a kernel
        whose tokens curve is read per piece (prefill attention's chunks) multiplies it by."""
        return self._times_factors(1.0, outputs, depth)

    def _times_factors(self, eff: float, outputs: float | None, depth: float | None) -> float:
        """``eff`` times each factor the class has and the caller gives a position for, in that
        order (so a GEMM's efficiency is the same float whichever method asked)."""
        if outputs is not None and self.outputs is not None:
            eff *= self.outputs.at(outputs)
        if depth is not None and self.depth is not None:
            eff *= self.depth.at(depth)
        return eff

    def compute_many(self, tokens: np.ndarray, outputs: np.ndarray | None = None,
                     depth: np.ndarray | None = None) -> np.ndarray:
        """:meth:`compute_at` over arrays (calibration's vectorised rows, not bit for bit)."""
        import numpy as np

        eff = np.asarray(self.compute(tokens), dtype=float)
        if outputs is not None and self.outputs is not None:
            eff = eff * self.outputs(outputs)
        if depth is not None and self.depth is not None:
            eff = eff * self.depth(depth)
        return eff


class Efficiency(FrozenModel):
    """Efficiency per operator class; every class is required in a profile."""

    gemm: OperatorEfficiency
    attention_prefill: OperatorEfficiency
    attention_decode: OperatorEfficiency
    elementwise: OperatorEfficiency
    gemm_fp8: OperatorEfficiency | None = Field(
        None, description="GEMMs whose math runs in fp8 (W8A8), when measured apart: fp8 kernels reach "
        "a different share of their peak than bf16 ones; absent, they use the gemm curves")
    gemm_fp4: OperatorEfficiency | None = Field(
        None, description="GEMMs whose math runs in fp4 (W4A4: NVFP4, MXFP4), when measured apart; "
        "absent, they use the gemm_fp8 curves (else gemm)")
    quantise: OperatorEfficiency | None = Field(
        None, description="the dynamic activation quantisation an 8-bit GEMM runs first (two "
        "memory-bound kernels, servesim.cost.quantise), when fitted apart; absent, the elementwise class")
    moe: OperatorEfficiency | None = Field(
        None, description="fused MoE experts with 16-bit math and 16-bit weights (one call: routing, "
        "both expert GEMMs and what the fused kernel does around them), when fitted apart; absent, "
        "the gemm curves")
    moe_fp8: OperatorEfficiency | None = Field(
        None, description="fused MoE experts with 8-bit math (block-scaled FP8, DeepSeek style), when "
        "fitted apart; absent, the curves of 8-bit GEMMs")
    moe_fp4: OperatorEfficiency | None = Field(
        None, description="fused MoE experts with FP4 math (NVFP4 weights and activations, Blackwell), "
        "when fitted apart; absent, the moe_fp8 class, then the curves of 8-bit GEMMs")
    moe_w4a16: OperatorEfficiency | None = Field(
        None, description="fused MoE experts with 4-bit weights and 16-bit math (weight-only INT4, "
        "Marlin), when fitted apart; absent, the moe class, then the gemm curves")
    attention_decode_fp8: OperatorEfficiency | None = Field(
        None, description="decode attention over an 8-bit KV cache, when fitted apart: the kernel "
        "dequantises every tile it loads, so it is not twice as fast as over 16 bits until the "
        "cache runs to hundreds of MB; absent, the attention_decode class")
    mla_prefill_time_scale: float | None = Field(
        None, gt=0.0, le=2.0, description="MLA's prefill attention (DeepSeek-style: 192-wide query-key "
        "heads, 128-wide values) takes this times what the attention_prefill class prices for its "
        "shape, where its own kernel was measured apart (B200: AIConfigurator's MLA module tables, "
        "servesim.calibration.mla_fit); absent, 1")

    @property
    def quantisation(self) -> OperatorEfficiency:
        """What prices an 8-bit GEMM's input quantisation (:mod:`servesim.cost.quantise`)."""
        return self.quantise if self.quantise is not None else self.elementwise

    def gemm_for(self, math: DType) -> OperatorEfficiency:
        """The GEMM efficiency of kernels whose math runs in ``math``. FP4 (W4A4) kernels take
        their own curve where the profile has one (B200's, fitted to NVFP4 linears), else the fp8
        curve (an estimate: both are low-precision tensor-core GEMMs), else the bf16 one."""
        if math is DType.FP4 and self.gemm_fp4 is not None:
            return self.gemm_fp4
        if math in (DType.FP8, DType.FP4) and self.gemm_fp8 is not None:
            return self.gemm_fp8
        return self.gemm

    def moe_for(self, math: DType, weight: DType) -> OperatorEfficiency:
        """The efficiency of a fused MoE layer's experts whose math runs in ``math`` on ``weight``
        weights. Fused MoE kernels reach a different share of peak than dense GEMMs of the same
        rows (AIConfigurator's tables time them apart); a profile without them prices the experts
        by the GEMM curves."""
        if math is DType.FP4 and self.moe_fp4 is not None:
            return self.moe_fp4
        if math in (DType.FP8, DType.FP4):
            return self.moe_fp8 if self.moe_fp8 is not None else self.gemm_for(math)
        if math.bits < 16:  # INT8 math: not measured apart
            return self.gemm_for(math)
        if weight.bits <= 4 and self.moe_w4a16 is not None:
            return self.moe_w4a16
        return self.moe if self.moe is not None else self.gemm_for(math)

    def decode_for(self, kv_bytes: float) -> OperatorEfficiency:
        """The decode-attention class for a KV cache of ``kv_bytes`` per element: an 8-bit cache
        (fp8, measured; int8 takes the same class, an estimate) reads the fp8 class when the profile
        has one, every other cache the 16-bit one."""
        if kv_bytes == 1.0 and self.attention_decode_fp8 is not None:
            return self.attention_decode_fp8
        return self.attention_decode

    @classmethod
    def perfect(cls) -> Efficiency:
        """The pure roofline: efficiency 1 everywhere and no fixed cost."""
        one = OperatorEfficiency.perfect()
        return cls(gemm=one, attention_prefill=one, attention_decode=one, elementwise=one)


class Link(FrozenModel):
    """A data path: ``bandwidth_Bps`` is one direction, as NCCL bus bandwidth is quoted."""

    kind: str
    bandwidth_Bps: float = Field(gt=0)
    latency_s: float = Field(ge=0)
    efficiency: float = Field(1.0, gt=0, le=1, description="achieved / peak bandwidth")

    def transfer_s(self, nbytes: float, lanes: int = 1) -> float:
        """One copy of ``nbytes`` over ``lanes`` such links in parallel: latency plus bytes over the
        achieved bandwidth (KV hand-offs, swaps to host memory; collectives have their own model
        in :mod:`servesim.cost.communication`)."""
        return self.latency_s + nbytes / (self.bandwidth_Bps * self.efficiency * lanes)


class CollectiveFit(FrozenModel):
    """One all-reduce implementation on one node, fitted to measurements:
    ``latency_s + latency_per_peer_s * (world - 1) + wire_bytes / (link bandwidth * efficiency)``.

    ``wire_bytes`` is what each GPU moves through its link for an all-reduce of ``n`` bytes:
    ``2 (w-1)/w * n`` for a ring (NCCL) or a two-shot reduce-scatter + all-gather, ``(w-1) * n``
    for a one-shot all-reduce (every GPU reads every peer's whole buffer), see
    :mod:`servesim.cost.communication`."""

    latency_s: float = Field(ge=0)
    latency_per_peer_s: float = Field(0.0, ge=0)
    efficiency: float = Field(gt=0, le=1, description="achieved / peak link bandwidth")
    efficiency_by_world: dict[int, Curve] | None = Field(
        None, description="per group size, achieved / peak link bandwidth by the bytes each GPU "
        "moves (axis 'bytes'), replacing `efficiency` for the group sizes it names: NCCL changes "
        "protocol and algorithm with the message size and the group (on an NVSwitch node its NVLS "
        "all-reduce of 8 GPUs passes the ring bound for large messages, 2 GPUs stay near 0.7), so "
        "one bandwidth fraction cannot fit a 1 MiB and a 1 GiB all-reduce")

    def efficiency_at(self, wire_bytes: float, world: int) -> float:
        """The achieved bandwidth fraction for a call of ``world`` GPUs moving ``wire_bytes`` each."""
        curves = self.efficiency_by_world
        curve = None if curves is None else curves.get(world)
        return self.efficiency if curve is None else curve.at(wire_bytes)


class Collectives(FrozenModel):
    """Measured all-reduce implementations of one GPU node (optional in a profile).

    Serving engines do not all-reduce alike: vLLM and SGLang run a custom all-reduce over NVLink
    peer-to-peer memory for small messages (one-shot, or two-shot for medium sizes) and NCCL for
    large ones; which implementation runs at which size is the engine's choice
    (:class:`servesim.engines.base.RuntimeCosts`), how fast each runs is the hardware's (here).
    A profile without this section prices every all-reduce with the interconnect's ring model."""

    nccl: CollectiveFit | None = None
    oneshot: CollectiveFit | None = None
    twoshot: CollectiveFit | None = None
    symm_mem: CollectiveFit | None = Field(
        None, description="PyTorch's symmetric-memory all-reduce as vLLM runs it between its custom "
        "all-reduce and NCCL (multimem through the NVSwitch at the group sizes vLLM gives it, "
        "two-shot at the others); without it those messages are priced as NCCL's")
    eager_call_s: float = Field(
        0.0, ge=0, description="extra host time of one collective call outside a CUDA graph "
        "(the GPU idles for it when the step is launch-bound)")


class Memory(FrozenModel):
    capacity_bytes: float = Field(gt=0)
    bandwidth_Bps: float = Field(gt=0)
    reserved_bytes: float = Field(
        0.0, ge=0, description="CUDA context, NCCL and allocator slack: never available to vLLM")


class HardwareProfile(FrozenModel):
    """One GPU model as the cost model sees it."""

    name: str
    display_name: str
    vendor: str = "nvidia"
    spec_only: bool = Field(
        True, description="true while no efficiency here was fitted to measurements")
    peak_flops: dict[DType, float]
    memory: Memory
    interconnect: Link
    host_link: Link
    compute_capability: str | None = Field(
        None, pattern=r"^\d+\.\d+$", description="CUDA compute capability ('8.0' A100, '9.0' H100 "
        "and H200, '10.0' B200 and GB200, '10.3' B300 and GB300): engines choose their all-reduce "
        "kernel by it (vLLM's size limits are tables keyed by it)")
    fast_domain_gpus: int | None = Field(
        None, ge=1, description="GPUs that share the peer interconnect (the scale-up domain: 8 in an "
        "HGX node, 72 in a GB200 NVL72 rack); collectives and pipeline sends beyond it use scale_out")
    all_to_all: Link | None = Field(
        None, description="the peer interconnect as NCCL's all-to-all uses it (its own latency and "
        "achieved fraction, fitted to alltoall timings); default: interconnect")
    scale_out: Link | None = Field(
        None, description="the network between fast domains, per GPU and direction (InfiniBand or "
        "RoCE: one NIC per GPU in the usual rail-optimised layout)")
    efficiency: Efficiency
    collectives: Collectives | None = Field(
        None, description="measured all-reduce implementations (custom one-/two-shot, NCCL)")
    cost_per_gpu_hour: float | None = Field(None, ge=0)
    provenance: dict[str, Any] = Field(default_factory=dict)

    @field_validator("compute_capability", mode="before")
    @classmethod
    def _capability_is_text(cls, value: Any) -> Any:
        """YAML reads ``9.0`` as a number: ask for quotes (as engine versions do)."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(f"quote it: compute_capability: '{value}' (major.minor, as text)")
        return value

    @field_validator("peak_flops")
    @classmethod
    def _positive_peaks(cls, value: dict[DType, float]) -> dict[DType, float]:
        for dtype, flops in value.items():
            if not flops > 0:
                raise ValueError(f"peak_flops.{dtype.value} must be positive")
        if DType.BF16 not in value:
            raise ValueError("peak_flops.bf16 is required")
        return value

    def peak(self, math_dtype: DType) -> float:
        """Dense peak FLOP/s for GEMMs whose math runs in ``math_dtype``."""
        key = DType.BF16 if math_dtype is DType.FP16 else math_dtype.math_format
        if key not in self.peak_flops:
            have = ", ".join(sorted(d.value for d in self.peak_flops))
            raise ServesimError(
                "precision.activations",
                f"{self.name} has no {math_dtype.value} tensor cores (it has {have})",
                f"use precision.activations: bf16 (weight-only {math_dtype.value}) or other hardware")
        return self.peak_flops[key]

    def ridge_point(self, math_dtype: DType = DType.BF16) -> float:
        """FLOPs per HBM byte above which a kernel is compute-bound at peak."""
        return self.peak(math_dtype) / self.memory.bandwidth_Bps

    def ideal(self) -> HardwareProfile:
        """The same hardware with perfect efficiency and no launch or link latency: the textbook
        roofline (price it with ``RuntimeCosts.none()`` to leave out the engine's step cost too)."""
        perfect = {"efficiency": 1.0, "latency_s": 0.0}
        link = self.interconnect.model_copy(update=perfect)
        update: dict[str, Any] = {"efficiency": Efficiency.perfect(), "collectives": None,
                                  "interconnect": link, "name": f"{self.name} (ideal)"}
        for name in ("all_to_all", "scale_out"):
            other = getattr(self, name)
            if other is not None:
                update[name] = other.model_copy(update=perfect)
        return self.model_copy(update=update)

    def summary(self) -> dict[str, Any]:
        fp8 = self.peak_flops.get(DType.FP8)
        return {
            "name": self.name,
            "gpu": self.display_name,
            "bf16_tflops": round(self.peak_flops[DType.BF16] / 1e12),
            "fp8_tflops": round(fp8 / 1e12) if fp8 else None,
            "hbm_gib": round(self.memory.capacity_bytes / 2**30, 1),
            "hbm_tbps": round(self.memory.bandwidth_Bps / 1e12, 2),
            "link": f"{self.interconnect.kind} {self.interconnect.bandwidth_Bps / 1e9:.0f} GB/s"
                    + (f" x{self.fast_domain_gpus}" if self.fast_domain_gpus else ""),
            "ridge_flop_per_byte": round(self.ridge_point()),
            "calibration": "spec-only" if self.spec_only else "calibrated",
            "usd_per_gpu_hour": self.cost_per_gpu_hour,
        }
