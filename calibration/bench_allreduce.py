"""NCCL all-reduce across every visible GPU (only when there are two or more).

One process per GPU (``torch.multiprocessing.spawn``); rank 0 times each message size with CUDA
events after a barrier and writes its medians. Sizes run from 4 KB to 256 MB of bf16.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from servesim.calibration.timing import Timing, import_torch

SIZES = tuple(2**p for p in range(12, 29, 2))


def _worker(rank: int, world: int, out: str, quick: bool, port: str) -> None:
    torch = import_torch()
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    timing = Timing.for_run("cuda", quick)
    rows: list[dict[str, Any]] = []
    for size in SIZES:
        x = torch.ones(size // 2, dtype=torch.bfloat16, device="cuda")
        for _ in range(timing.warmup):
            dist.all_reduce(x)
        times = []
        for _ in range(timing.reps):
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        rows.append({"bytes": size, "world": world, "time_s": sorted(times)[len(times) // 2]})
    if rank == 0:
        pd.DataFrame(rows).to_csv(out, index=False)
    dist.destroy_process_group()


def bench_allreduce(quick: bool) -> pd.DataFrame | None:
    torch = import_torch()
    world = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if world < 2:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "allreduce.csv")
        torch.multiprocessing.spawn(_worker, args=(world, out, quick, "29517"), nprocs=world)
        table = pd.read_csv(out)
    table["source"] = f"servesim bench (NCCL all-reduce, {world} GPUs)"
    return table
