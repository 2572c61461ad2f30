"""Memory bandwidth: a device-to-device copy of ``size`` bytes (``bytes`` = read + write).

It calibrates the elementwise kernels (norms, RoPE, activations, residual adds), which are
pure memory traffic in the cost model. Small copies show the per-kernel floor, middle ones the
cache bandwidth, large ones DRAM/HBM.
"""

from __future__ import annotations

import pandas as pd

from calibration.shapes import COPY_BYTES
from calibration.timing import Timing, import_torch, median_seconds


def bench_memory(device: str, quick: bool) -> pd.DataFrame:
    torch = import_torch()
    timing = Timing.for_run(device, quick)
    rows = []
    for size in COPY_BYTES[quick]:
        src = torch.randn(size // 2, dtype=torch.bfloat16, device=device)
        dst = torch.empty_like(src)
        rows.append({"bytes": 2 * size, "op": "copy",
                     "time_s": median_seconds(lambda s=src, d=dst: d.copy_(s), device, timing)})
    table = pd.DataFrame(rows)
    table["source"] = f"servesim bench ({device}, tensor copy)"
    return table
