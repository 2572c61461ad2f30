"""GEMM microbenchmark: ``(m x k) @ (k x n)`` in bf16 (and fp8 where the GPU has it).

The weight matrix stays the same across repetitions, as a layer's weights do across the steps
of a real engine: small weights may then sit in cache, which is what a serving step sees too.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from calibration.shapes import FLOP_CAP, gemm_shapes
from calibration.timing import Timing, import_torch, median_seconds


def has_fp8(device: str) -> bool:
    torch = import_torch()
    return (device == "cuda" and torch.cuda.get_device_capability() >= (8, 9)
            and hasattr(torch, "_scaled_mm"))


def _fp8_fn(torch: Any, a: Any, b: Any) -> Any:
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    one = torch.ones((), device=a.device)
    return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def bench_gemm(device: str, quick: bool) -> pd.DataFrame:
    torch = import_torch()
    timing = Timing.for_run(device, quick)
    fp8 = has_fp8(device)
    rows = []
    b = None
    for shape in gemm_shapes(device, quick):  # sorted by (k, n): one weight per layer shape
        if b is None or tuple(b.shape) != (shape.k, shape.n):
            b = torch.rand(shape.k, shape.n, dtype=torch.bfloat16, device=device) - 0.5
        a = torch.rand(shape.m, shape.k, dtype=torch.bfloat16, device=device) - 0.5
        base = {"m": shape.m, "n": shape.n, "k": shape.k, "model": shape.model, "tp": shape.tp,
                "op": shape.op}
        rows.append({**base, "dtype": "bf16",
                     "time_s": median_seconds(lambda a=a, b=b: a @ b, device, timing)})
        if fp8 and shape.m % 16 == 0 and shape.k % 16 == 0 and shape.n % 16 == 0:
            rows.append({**base, "dtype": "fp8",
                         "time_s": median_seconds(_fp8_fn(torch, a, b), device, timing)})
    table = pd.DataFrame(rows)
    table["source"] = f"servesim bench ({device}, flop cap {FLOP_CAP[(device, quick)]:.0e})"
    return table
