"""The roofline rule every operator is charged by.

``time = fixed + max(flops / (peak * compute_eff), bytes / (bandwidth * memory_eff))``

``fixed`` is the kernel's launch cost and minimum duration (per launch), the efficiencies come from
the hardware profile's curves evaluated at the operator's shape. An operator that repeats in every
layer is costed once per layer and multiplied, so efficiencies see the per-kernel shape.
"""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
class OpCosts:
    """:class:`OpCost` of one operator class over many steps (a fast-forwarded run): each field a
    float (the same in every step) or an array with one value per step, combined as
    :class:`OpCost` combines them, element by element."""

    name: str
    flops: np.ndarray | float
    bytes: np.ndarray | float
    compute_s: np.ndarray | float
    memory_s: np.ndarray | float
    fixed_s: float

    @property
    def roofline_s(self) -> np.ndarray:
        return np.maximum(self.compute_s, self.memory_s)

    @property
    def time_s(self) -> np.ndarray:
        return self.roofline_s + self.fixed_s

    @property
    def compute_bound(self) -> np.ndarray:
        """Per step, :attr:`OpCost.bound` == "compute"."""
        return np.greater_equal(self.compute_s, self.memory_s)


def memory_efficiency(eff: OperatorEfficiency, nbytes: float, tokens: float) -> float:
    """The memory curve read on its own axis: the kernel's bytes, or its tokens."""
    return eff.memory.at(nbytes if eff.memory.axis == "bytes" else tokens)


def memory_efficiency_many(eff: OperatorEfficiency, nbytes: np.ndarray, tokens: float) -> np.ndarray | float:
    """:func:`memory_efficiency` of kernels of ``nbytes`` bytes each (an array) at one token count,
    bit for bit (``Curve.at_many``); a float when the curve reads the tokens."""
    if eff.memory.axis == "bytes":
        return eff.memory.at_many(nbytes)
    return eff.memory.at(tokens)


def roofline(name: str, flops: float, nbytes: float, *, peak_flops: float, bandwidth: float,
             eff: OperatorEfficiency, compute_axis: float, repeat: float = 1.0,
             kernels: float = 1.0) -> OpCost:
    """Cost of ``repeat`` identical kernels each doing ``flops`` and moving ``nbytes``.

    ``compute_axis`` is the kernel's position on the compute curve's axis (tokens); the memory
    curve is read at one kernel's byte count (``nbytes / kernels`` when several kernels are
    lumped into one record).
    """
    if flops <= 0 and nbytes <= 0:
        return OpCost(name, 0.0, 0.0, 0.0, 0.0, 0.0)
    compute_s = flops / (peak_flops * eff.compute.at(compute_axis)) if flops > 0 else 0.0
    memory_eff = memory_efficiency(eff, nbytes / kernels, compute_axis)
    memory_s = nbytes / (bandwidth * memory_eff) if nbytes > 0 else 0.0
    return OpCost(name, flops * repeat, nbytes * repeat, compute_s * repeat, memory_s * repeat,
                  eff.fixed_s * kernels * repeat)
