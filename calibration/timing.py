"""Timing one kernel properly: warm-up, synchronisation, repetitions, median.

On CUDA each repetition is bracketed by CUDA events (device time, not host launch time) after a
synchronisation; on CPU by ``perf_counter`` (torch CPU ops are synchronous). The median of the
repetitions is reported because a CPU shared with other processes, or a GPU changing clocks,
gives a long upper tail that a mean would chase.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simulator.errors import ServesimError


def import_torch() -> Any:
    """torch, or the one-line error that says how to install it."""
    try:
        import torch
    except ImportError:
        raise ServesimError("torch", "not installed (the benchmarks run real kernels with torch)",
                            "pip install torch==2.13.0") from None
    return torch


@dataclass(frozen=True)
class Timing:
    warmup: int
    reps: int

    @classmethod
    def for_run(cls, device: str, quick: bool) -> Timing:
        if device == "cuda":
            return cls(warmup=5, reps=15) if quick else cls(warmup=10, reps=50)
        return cls(warmup=1, reps=5) if quick else cls(warmup=3, reps=15)


def median_seconds(fn: Callable[[], object], device: str, timing: Timing) -> float:
    """Median seconds of one call of ``fn`` on ``device``."""
    torch = import_torch()
    for _ in range(timing.warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(timing.reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)
    times = []
    for _ in range(timing.reps):
        start_s = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start_s)
    return statistics.median(times)
