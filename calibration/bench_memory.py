"""Memory-bound kernels: a copy, a residual add, an RMSNorm and a SiLU-and-multiply.

They calibrate the elementwise class (norms, RoPE, activations, residual adds), which the cost
model prices as pure memory traffic: ``bytes`` counts every element read and written once.
The copy alone would give the best case; the norm and activation kernels carry the per-kernel
floor that real layers pay (on a CPU in bf16 an RMSNorm of a few rows costs tens of us, a copy
of the same bytes one). Small sizes show that floor, middle ones cache bandwidth, large ones DRAM.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from servesim.calibration.shapes import COPY_BYTES
from servesim.calibration.timing import Rotating, Timing, copies_for, import_torch, median_seconds

HIDDEN = 512


def _kernels(torch: Any, elements: int, device: str) -> dict[str, tuple[Any, int]]:
    """op -> (callable, bytes moved) for ``elements`` bf16 values per input."""
    F = torch.nn.functional
    x = torch.randn(elements, dtype=torch.bfloat16, device=device)
    y = torch.randn_like(x)
    out = torch.empty_like(x)
    rows = x.view(-1, HIDDEN) if elements % HIDDEN == 0 else x.view(1, -1)
    weight = torch.ones(rows.shape[-1], dtype=torch.bfloat16, device=device)
    gate_up = torch.randn(rows.shape[0], 2 * rows.shape[-1], dtype=torch.bfloat16, device=device)
    width = 2 * elements
    return {"copy": (lambda: out.copy_(x), 2 * width),
            "add": (lambda: torch.add(x, y, out=out), 3 * width),
            "rms_norm": (lambda: F.rms_norm(rows, (rows.shape[-1],), weight), 2 * width),
            "silu_mul": (lambda: F.silu(gate_up[:, : rows.shape[-1]]) * gate_up[:, rows.shape[-1]:],
                         3 * width)}


def bench_memory(device: str, quick: bool, timing: Timing | None = None) -> pd.DataFrame:
    torch = import_torch()
    timing = timing or Timing.for_run(device, quick)
    rows = []
    for size in COPY_BYTES[quick]:
        elements = size // 2
        # Rotate over copies of the buffers (x, y, out and gate_up: 10 bytes per element) so that
        # small sizes are not timed from cache, which no layer of a step would enjoy.
        sets = [_kernels(torch, elements, device) for _ in range(copies_for(10 * elements))]
        for op, (_, nbytes) in sets[0].items():
            calls = Rotating([kernels[op][0] for kernels in sets])
            rows.append({"bytes": nbytes, "op": op,
                         "time_s": median_seconds(calls.call_next, device, timing)})
    table = pd.DataFrame(rows)
    table["source"] = f"servesim bench ({device}, copy/add/rms_norm/silu_mul)"
    return table
