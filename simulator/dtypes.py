"""Numeric formats of weights, activations and the KV cache, and what they cost in bytes.

A serving deployment picks one format per tensor class (:class:`Precision`). Bytes per element
decide memory traffic and capacity; the *math* format of a GEMM decides which peak FLOP/s of the
hardware applies. Weight-only quantisation (int4/int8/fp8 weights with 16-bit activations) shrinks
the bytes a GEMM reads but runs the math in 16 bits after dequantisation; W8A8 and FP8 (8-bit
weights *and* activations) also run the math on the 8-bit tensor cores.

Group-wise formats store one scale (fp16, 2 bytes) per ``group_size`` elements, as AWQ and GPTQ
do for int4 with group 128: 0.5 + 2/128 = 0.515625 bytes per weight. 8-bit formats use per-channel
or per-tensor scales whose size is negligible next to the tensor and is ignored.

The two 4-bit floating-point formats carry their block scales by definition, whatever
``group_size`` says: NVFP4 (NVIDIA) stores E2M1 values with one FP8 E4M3 scale per 16 elements
(plus one fp32 scale per tensor, ignored): 0.5 + 1/16 = 0.5625 bytes; MXFP4 (OCP Microscaling
v1.0, gpt-oss's expert weights) one E8M0 scale per 32 elements: 0.5 + 1/32 = 0.53125 bytes. Their
math runs on FP4 tensor cores (Blackwell, MI355X: the profile's ``fp4`` peak) when the
activations are FP4 too (W4A4); with 16-bit activations they are weight-only, dequantised into
16-bit GEMMs (as vLLM runs MXFP4 and NVFP4 checkpoints on Hopper); MXFP4 weights with FP8
activations run on the FP8 peak (W4A8, as TensorRT-LLM's MXFP4 x MXFP8 MoE kernels do).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from servesim.errors import ServesimError

SCALE_BYTES = 2.0
"""Bytes of one group scale (an fp16 number)."""


class DType(StrEnum):
    """A storage or math format. ``bf16`` and ``fp16`` cost the same everywhere."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"
    FP4 = "fp4"
    """The FP4 tensor cores' math format: the key of a profile's FP4 peak (storage is NVFP4 or
    MXFP4; ``fp4`` as a format name means NVFP4)."""

    @property
    def bits(self) -> int:
        return {"bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "nvfp4": 4, "mxfp4": 4,
                "fp4": 4}[self.value]

    @property
    def is_fp4(self) -> bool:
        return self in (DType.NVFP4, DType.MXFP4, DType.FP4)

    @property
    def math_format(self) -> DType:
        """Which peak a GEMM whose inputs are in this format runs on (FP4 formats: ``fp4``)."""
        return DType.FP4 if self.is_fp4 else self

    @property
    def is_grouped(self) -> bool:
        """Whether the format carries one scale per group of elements (int4)."""
        return self is DType.INT4

    def bytes_per_element(self, group_size: int = 128) -> float:
        """Storage bytes per element, scales included for grouped formats."""
        raw = self.bits / 8
        if self.is_grouped:
            return raw + SCALE_BYTES / group_size
        if self in BLOCK_SCALES:
            block, scale_bytes = BLOCK_SCALES[self]
            return raw + scale_bytes / block
        return raw

    @classmethod
    def parse(cls, value: str | DType, field: str) -> DType:
        """Read a dtype name as a user wrote it (``bfloat16`` and ``float16`` are accepted too)."""
        if isinstance(value, DType):
            return value
        aliases = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float8": "fp8",
                   "fp8_e4m3": "fp8", "e4m3": "fp8", "fp4": "nvfp4", "mxfp4_e2m1": "mxfp4"}
        name = aliases.get(str(value).lower(), str(value).lower())
        try:
            return cls(name)
        except ValueError:
            choices = ", ".join(d.value for d in cls if d is not DType.FP4)
            raise ServesimError(field, f"unknown dtype {value!r}", f"use one of {choices}") from None


BLOCK_SCALES = {DType.NVFP4: (16, 1.0), DType.MXFP4: (32, 1.0), DType.FP4: (16, 1.0)}
"""(elements per scale, bytes per scale) of the block-scaled FP4 formats."""

ACTIVATION_DTYPES = (DType.BF16, DType.FP16, DType.FP8, DType.INT8, DType.NVFP4, DType.MXFP4)
"""Integer 4-bit activations are not a kernel we model; FP4 ones are (Blackwell's W4A4)."""


@dataclass(frozen=True)
class Precision:
    """The formats of one deployment: weights, activations and KV cache.

    ``group_size`` applies to every grouped (int4) tensor. The GEMM math format is the activation
    format: 16-bit activations mean dequantise-then-multiply in 16 bits (weight-only
    quantisation); 8-bit activations with 8-bit or narrower weights run on 8-bit tensor cores.
    """

    weight: DType = DType.BF16
    activation: DType = DType.BF16
    kv_cache: DType = DType.BF16
    group_size: int = 128
    expert_weight: DType | None = None
    """The routed experts' format when it differs from the other layers' (gpt-oss: MXFP4 experts,
    16-bit attention); None: ``weight``."""

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATION_DTYPES:
            raise ServesimError(
                "precision.activations", f"{self.activation.value} activations are not supported",
                "use bf16, fp16, fp8, int8, nvfp4 or mxfp4")
        if self.activation.is_fp4:
            for name, weight in (("precision.weights", self.weight),
                                 ("precision.expert_weights", self.expert_weight)):
                if weight is not None and weight is not self.activation:
                    raise ServesimError(
                        "precision.activations",
                        f"{self.activation.value} activations need {self.activation.value} "
                        f"weights (W4A4), got {name} {weight.value}",
                        f"use {name}: {self.activation.value}, or precision.activations: bf16 for "
                        "weight-only FP4")
        if self.expert_weight is not None and self.expert_weight.bits > self.activation.bits:
            raise ServesimError("precision.expert_weights", f"{self.expert_weight.value} experts with "
                                f"{self.activation.value} activations is not a real kernel",
                                f"use precision.expert_weights: {self.activation.value} or narrower")
        if self.activation.bits < self.weight.bits:
            raise ServesimError(
                "precision.activations",
                f"{self.activation.value} activations with {self.weight.value} weights is not a "
                "real kernel (W16A8)",
                f"use precision.weights: {self.activation.value} (W8A8) or precision.activations: bf16")
        eight_bit = {DType.FP8, DType.INT8}
        if {self.weight, self.activation} == eight_bit:
            raise ServesimError(
                "precision.activations", f"{self.weight.value} weights with {self.activation.value} "
                "activations mixes two 8-bit formats in one GEMM, which no kernel does",
                f"use precision.activations: {self.weight.value} (W8A8) or bf16 (weight-only)")
        if self.group_size <= 0:
            raise ServesimError("precision.group_size", f"must be positive, got {self.group_size}",
                                "use 128 (AWQ/GPTQ default)")

    @property
    def math(self) -> DType:
        """The format the tensor cores multiply in (FP4 activations: the FP4 tensor cores)."""
        return self.activation.math_format

    @property
    def weight_bytes(self) -> float:
        return self.weight.bytes_per_element(self.group_size)

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes per routed-expert weight, scales included."""
        return self.expert_format.bytes_per_element(self.group_size)

    @property
    def expert_format(self) -> DType:
        """The routed experts' weight format."""
        return self.expert_weight or self.weight

    @property
    def act_bytes(self) -> float:
        return self.activation.bytes_per_element(self.group_size)

    @property
    def kv_bytes(self) -> float:
        return self.kv_cache.bytes_per_element(self.group_size)

    @classmethod
    def from_names(cls, weight: str = "bf16", activation: str = "bf16", kv_cache: str = "bf16",
                   group_size: int = 128, expert_weight: str | None = None) -> Precision:
        experts = (DType.parse(expert_weight, "precision.expert_weights") if expert_weight is not None
                   else None)
        return cls(DType.parse(weight, "precision.weights"), DType.parse(activation, "precision.activations"),
                   DType.parse(kv_cache, "precision.kv_cache"), group_size, experts)
