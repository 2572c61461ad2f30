"""GEMM microbenchmark: ``(m x k) @ (k x n)`` in bf16 (and fp8 where the GPU has it).

Each repetition multiplies by the next of a pool of weight copies (at least ``ROTATE_BYTES`` in
all, at most ``MAX_COPIES``; see :mod:`servesim.calibration.timing`), because a serving step runs every
layer's different weights once:
re-reading one small matrix from cache would time a kernel no step runs (on this CPU it is 1.5-2x
faster than with rotating weights).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from servesim.calibration.shapes import FLOP_CAP, gemm_shapes
from servesim.calibration.timing import Rotating, Timing, copies_for, import_torch, median_seconds


def has_fp8(device: str) -> bool:
    torch = import_torch()
    return (device == "cuda" and torch.cuda.get_device_capability() >= (8, 9)
            and hasattr(torch, "_scaled_mm"))


def _fp8_fn(torch: Any, a: Any, b: Any) -> Any:
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    one = torch.ones((), device=a.device)
    return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def _times_next(a: Any, weights: Rotating) -> Callable[[], Any]:
    """A kernel that multiplies ``a`` by the next of the ``weights`` at each call."""
    def call() -> Any:
        return a @ weights.next()
    return call


def bench_gemm(device: str, quick: bool, timing: Timing | None = None,
               row_counts: tuple[int, ...] | None = None) -> pd.DataFrame:
    """Every layer GEMM of :func:`~servesim.calibration.shapes.gemm_shapes` (at ``row_counts``
    rows when given), in bf16 and, where the GPU and ``_scaled_mm`` take it, fp8."""
    torch = import_torch()
    timing = timing or Timing.for_run(device, quick)
    fp8 = has_fp8(device)
    rows = []
    weights: list = []
    for shape in gemm_shapes(device, quick, row_counts):  # sorted by (k, n): one weight pool per shape
        if not weights or tuple(weights[0].shape) != (shape.k, shape.n):
            copies = copies_for(2 * shape.k * shape.n)
            weights = [torch.rand(shape.k, shape.n, dtype=torch.bfloat16, device=device) - 0.5
                       for _ in range(copies)]
        a = torch.rand(shape.m, shape.k, dtype=torch.bfloat16, device=device) - 0.5
        b = Rotating(weights)
        base = {"m": shape.m, "n": shape.n, "k": shape.k, "model": shape.model, "tp": shape.tp,
                "op": shape.op}
        rows.append({**base, "dtype": "bf16",
                     "time_s": median_seconds(_times_next(a, b), device, timing)})
        if fp8 and shape.m % 16 == 0 and shape.k % 16 == 0 and shape.n % 16 == 0:
            fp8_calls = Rotating([_fp8_fn(torch, a, w) for w in weights])
            rows.append({**base, "dtype": "fp8",
                         "time_s": median_seconds(fp8_calls.call_next, device, timing)})
    # ``_scaled_mm`` is timed on inputs already in fp8: no activation quantisation inside, unlike
    # AIConfigurator's vLLM linears (servesim.cost.quantise); the fit and validation read this.
    table = pd.DataFrame(rows)
    table["input_quantised"] = False
    table["source"] = f"servesim bench ({device}, flop cap {FLOP_CAP[(device, quick)]:.0e})"
    return table
